//! The backend contract suite of `tessera-backend` ([`tessera_backend::contract`]) on the
//! simulator, in both modes, under Tokio's paused clock.

use std::time::Duration;

use async_trait::async_trait;
use tessera_backend::contract::{Harness, Run};
use tessera_backend::{PartitionPlan, RunSpec, SliceSpec};
use tessera_backend_sim::{SimBackend, SimConfig, SimMode};

use crate::common::*;

/// A simulator of the common fleet in `mode`, without periodic telemetry and adopting nothing
/// it did not start (so a ghost stays a ghost).
pub struct SimHarness(pub SimMode);

#[async_trait]
impl Harness for SimHarness {
    type B = SimBackend;

    async fn backend(&self) -> SimBackend {
        let cfg = SimConfig {
            adopt_unknown: false,
            mig_partition_time: Duration::ZERO,
            ..quiet(self.0)
        };
        SimBackend::new(cfg, fleet())
    }

    /// A whole L40S (no MIG there) for one hour, or until stopped.
    async fn workload(&self, b: &SimBackend, id: u64, run: Run) -> RunSpec {
        let devices = match b.config().mode {
            SimMode::Exact => exact(&[(id % 4) as u8], SliceSpec::Whole),
            SimMode::Operator => count(tessera_backend::Resource::Gpu, 1),
        };
        let duration = (run == Run::Succeeds).then_some(Duration::from_secs(3600));
        RunSpec {
            model: "L40S".into(),
            model_memory_mib: 46068,
            ..spec(id, "l40s-00", devices, duration)
        }
    }

    /// A 3g.40gb instance on a100-01 GPU 0: one instance in exact mode, the GPU's layout in
    /// operator mode.
    async fn partitioned(&self, b: &SimBackend, id: u64) -> Option<(PartitionPlan, RunSpec)> {
        Some(match b.config().mode {
            SimMode::Exact => (
                PartitionPlan::Instance {
                    node: "a100-01".into(),
                    gpu: 0,
                    instance: mig3g(0),
                },
                spec(id, "a100-01", exact(&[0], SliceSpec::Mig(mig3g(0))), None),
            ),
            SimMode::Operator => (
                PartitionPlan::Layout {
                    node: "a100-01".into(),
                    gpu: 0,
                    instances: vec![mig3g(0), mig3g(4)],
                },
                spec(id, "a100-01", count(mig_resource("3g.40gb"), 1), None),
            ),
        })
    }

    fn patience(&self) -> Duration {
        Duration::from_secs(2 * 3600)
    }
}

mod exact {
    use super::*;
    tessera_backend::backend_contract_tests!(
        #[tokio::test(start_paused = true)]
        harness = SimHarness(SimMode::Exact)
    );
}

mod operator {
    use super::*;
    tessera_backend::backend_contract_tests!(
        #[tokio::test(start_paused = true)]
        harness = SimHarness(SimMode::Operator)
    );
}
