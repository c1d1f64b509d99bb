//! Reconcile reports: what a backend sees of the workloads Tessera expects, what runs there
//! that Tessera does not expect, and the MIG layouts it found.

use crate::plan::MigInstance;

/// What the backend says of a workload Tessera expects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observation {
    /// Running, since this time (ms since the epoch) when the backend knows it.
    Running {
        since_ms: Option<i64>,
    },
    /// Accepted, not running yet.
    Starting,
    Succeeded,
    Failed {
        detail: String,
    },
    /// The backend has no such workload (never started here, stopped, or gone).
    Unknown,
}

/// Something running on the backend that Tessera does not expect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Orphan {
    /// Tessera's workload ID, when the backend can tell it (a label, a name).
    pub id: Option<u64>,
    pub node: String,
    pub detail: String,
}

/// The answer to one [`crate::Backend::reconcile`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// One entry per expected workload.
    pub workloads: Vec<(u64, Observation)>,
    /// Running there but unknown to Tessera.
    pub orphans: Vec<Orphan>,
    /// The current MIG instances of every MIG GPU: the layouts of WholeGpu backends, the
    /// instances made for workloads on Instance backends (may be empty where a backend cannot
    /// read them; an upgraded node's validation compares them with the engine's).
    pub layouts: Vec<(String, u8, Vec<MigInstance>)>,
}

impl ReconcileReport {
    /// What the backend said of workload `id`, if it was expected.
    pub fn observation(&self, id: u64) -> Option<&Observation> {
        self.workloads.iter().find(|(w, _)| *w == id).map(|(_, o)| o)
    }
}
