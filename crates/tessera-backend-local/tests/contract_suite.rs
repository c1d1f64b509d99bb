//! The backend contract suite of `tessera-backend` ([`tessera_backend::contract`]) on the local
//! backend: the fake NVML of `local.rs` (GPU 0 in MIG mode, GPU 1 whole) and real processes.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tessera_backend::contract::{Harness, Run};
use tessera_backend::{MigInstance, PartitionPlan, RunSpec, SliceSpec};
use tessera_backend_local::LocalBackend;

use crate::local::{config, data_dir, fake, spec};

/// Local backends, each with a data directory of its own.
pub struct LocalHarness {
    made: AtomicU32,
    name: &'static str,
}

impl LocalHarness {
    pub const fn new(name: &'static str) -> Self {
        LocalHarness {
            made: AtomicU32::new(0),
            name,
        }
    }
}

#[async_trait]
impl Harness for LocalHarness {
    type B = LocalBackend;

    async fn backend(&self) -> LocalBackend {
        let n = self.made.fetch_add(1, Ordering::Relaxed);
        let dir = data_dir(&format!("contract-{}-{n}", self.name));
        LocalBackend::new(fake(), config(&dir, 5000)).expect("a local backend on the fake NVML")
    }

    /// A command on the whole GPU 1: `true`, or a loop that runs until it is stopped.
    async fn workload(&self, _: &LocalBackend, id: u64, run: Run) -> RunSpec {
        let cmd = match run {
            Run::Succeeds => "true",
            Run::UntilStopped => "while :; do sleep 0.05; done",
        };
        spec(id, vec![1], SliceSpec::Whole, cmd)
    }

    /// A 1g.10gb instance made at slice 6 of GPU 0 (beside the 3g made before start-up).
    async fn partitioned(&self, _: &LocalBackend, id: u64) -> Option<(PartitionPlan, RunSpec)> {
        let instance = MigInstance::new("1g.10gb", 19, 6, 1);
        let plan = PartitionPlan::Instance {
            node: "here".into(),
            gpu: 0,
            instance: instance.clone(),
        };
        let cmd = "while :; do sleep 0.05; done";
        Some((plan, spec(id, vec![0], SliceSpec::Mig(instance), cmd)))
    }

    fn patience(&self) -> Duration {
        Duration::from_secs(10)
    }
}

static HARNESS: LocalHarness = LocalHarness::new("suite");

tessera_backend::backend_contract_tests!(
    #[tokio::test]
    harness = HARNESS
);
