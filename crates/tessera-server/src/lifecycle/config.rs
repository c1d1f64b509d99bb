//! How a lifecycle loop is configured: the scheduler factory, the loop's settings, and what a
//! replica keeps to start a loop each time it leads.

use std::sync::Arc;
use std::time::Duration;

use tessera_backend::Backend;
use tessera_model::Fleet;
use tessera_sched::cycle::Scheduler;
use tessera_store::Store;

use crate::metrics::Metrics;

/// Builds a fresh scheduler on a fleet (at start-up, after a failed commit, and when the
/// backend reports another fleet).
pub type SchedFactory = Arc<dyn Fn(Arc<Fleet>) -> Scheduler + Send + Sync>;

/// How the loop runs.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Grace period of a stop before the backend forces it.
    pub grace: Duration,
    /// How often the backend is reconciled with what Tessera expects.
    pub reconcile_every: Duration,
    /// What happens to running work on a GPU that failed.
    pub on_gpu_failure: GpuFailurePolicy,
    /// The length of a simulated node upgrade in a rollout; `None`: a rollout waits for
    /// `tessera node done NODE`.
    pub sim_upgrade: Option<Duration>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            grace: Duration::from_secs(30),
            reconcile_every: Duration::from_secs(30),
            on_gpu_failure: GpuFailurePolicy::Leave,
            sim_upgrade: None,
        }
    }
}

/// What a loop needs; a replica keeps one and starts a loop from it each time it leads (on
/// the fleet its [`Lifecycle`] holds then: the backend may have reported another since start).
#[derive(Clone)]
pub struct LoopConfig {
    pub factory: SchedFactory,
    pub store: Arc<dyn Store>,
    pub backend: Arc<dyn Backend>,
    pub settings: Settings,
    pub metrics: Arc<Metrics>,
}

/// What happens to running work on a GPU that failed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GpuFailurePolicy {
    /// Leave it running and tell the tenant (the default).
    #[default]
    Leave,
    /// Stop batch work (requeued unless it asked not to be); services are left running and
    /// told.
    Requeue,
}

impl GpuFailurePolicy {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "leave" => Some(GpuFailurePolicy::Leave),
            "requeue" => Some(GpuFailurePolicy::Requeue),
            _ => None,
        }
    }
}
