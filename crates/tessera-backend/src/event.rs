//! Events: the asynchronous news a backend sends, and the telemetry samples they carry
//! (named after the DCGM exporter's fields).

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::plan::MigInstance;

/// The devices a `PerNodeCount` backend chose.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Bound {
    /// GPU indices on the workload's node.
    pub gpus: Vec<u8>,
    /// The MIG instance, when the resource was a MIG device.
    pub mig: Option<MigInstance>,
}

/// How a workload ended on its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exit {
    Succeeded,
    Failed { exit_code: Option<i32>, detail: String },
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exit::Succeeded => f.write_str("succeeded"),
            Exit::Failed {
                exit_code: Some(c),
                detail,
            } => write!(f, "failed with exit code {c}: {detail}"),
            Exit::Failed {
                exit_code: None,
                detail,
            } => write!(f, "failed: {detail}"),
        }
    }
}

/// Asynchronous news from a backend, in order per workload: Started, Running, then one of
/// Exited / Lost (see the crate doc for the exact guarantees).
#[derive(Clone, Debug, PartialEq)]
pub enum BackendEvent {
    /// Accepted and being started; `bound` from `PerNodeCount` backends.
    Started { id: u64, bound: Option<Bound> },
    /// Running; `sample`: a first telemetry sample of its GPUs.
    Running {
        id: u64,
        at_ms: i64,
        sample: Vec<GpuSample>,
    },
    /// The devices a `PerNodeCount` backend learned its running workload has, when it could
    /// not tell at `Started` (Kubernetes: from the DCGM exporter's pod mapping); like
    /// `Started`'s, the engine's booking follows them.
    Bound { id: u64, bound: Bound },
    /// Ended on its own.
    Exited { id: u64, at_ms: i64, exit: Exit },
    /// Gone without ending: node removed, deleted behind Tessera's back.
    Lost { id: u64, at_ms: i64, detail: String },
    /// Evicted by a drain through the platform's own tools (`kubectl drain` on a cordoned
    /// node): stopped as Tessera's own drain stops work, so batch work is requeued.
    Evicted { id: u64, at_ms: i64, detail: String },
    /// A workload Tessera stopped is gone from the backend: every process or pod of it has
    /// ended, so its devices are free. Sent by backends that confirm stops
    /// ([`crate::Capabilities::confirms_stop`]); until then the workload holds its capacity.
    Stopped { id: u64, at_ms: i64 },
    /// Something the workload's owner should know that changes nothing by itself, such as an
    /// eviction a disruption budget refuses for now.
    Notice { id: u64, detail: String },
    /// Something on the backend claims to be a Tessera workload and is not (a pod in another
    /// namespace wearing a workload's label): ignored, never adopted, never counted as a loss;
    /// reported so that an operator can see who tried.
    Stranger {
        namespace: String,
        name: String,
        detail: String,
    },
    /// An object asked for with the backend's own tools now exists and waits for Tessera
    /// (backends with [`crate::Capabilities::native_admission`]); reported once per object,
    /// and again after a restart of the backend while it still waits.
    Submitted {
        native: crate::NativeRef,
        ask: Box<crate::NativeAsk>,
    },
    /// The native object of workload `id` was deleted by its owner: the workload is
    /// cancelled. Acted on only when `native` is exactly the workload's object.
    Withdrawn { id: u64, native: crate::NativeRef },
    /// A GPU became unhealthy (an XID, fell off the bus) or healthy again.
    GpuHealth {
        node: String,
        gpu: u8,
        healthy: bool,
        xid: Option<u32>,
        detail: String,
    },
    /// A node appeared, disappeared, was cordoned, became (not) ready, or changed capacity.
    NodeChanged { node: String, change: NodeChange },
    /// The fleet as the backend now reads it (backends that discover their nodes, such as
    /// Kubernetes): a node joined or left, or a node's GPUs, pool or model changed. Built the
    /// way the fleet given at connect was; sent after the `NodeChanged` events of the same
    /// change. Nodes are known by name: indices in this fleet need not match the last one's.
    FleetChanged { fleet: Arc<tessera_model::Fleet> },
    /// A GPU's MIG layout changed (`WholeGpu` backends after applying a layout, or found at
    /// reconcile).
    PartitionChanged {
        node: String,
        gpu: u8,
        instances: Vec<MigInstance>,
    },
    /// A periodic telemetry sample.
    Telemetry { at_ms: i64, gpus: Vec<GpuSample> },
    /// A GPU's MIG mode as the backend reads it (backends that read it back): sent at every
    /// telemetry pass (level-triggered: Tessera acts on differences), so a change pending a GPU
    /// reset that the reset applied is seen. `enabled`: the mode the GPU is in, or is switching
    /// to while `pending`.
    MigMode {
        node: String,
        gpu: u8,
        enabled: bool,
        pending: bool,
    },
}

impl BackendEvent {
    /// The workload the event is about, for the events that are about one.
    pub fn workload(&self) -> Option<u64> {
        match self {
            BackendEvent::Started { id, .. }
            | BackendEvent::Running { id, .. }
            | BackendEvent::Bound { id, .. }
            | BackendEvent::Exited { id, .. }
            | BackendEvent::Lost { id, .. }
            | BackendEvent::Evicted { id, .. }
            | BackendEvent::Stopped { id, .. }
            | BackendEvent::Notice { id, .. }
            | BackendEvent::Withdrawn { id, .. } => Some(*id),
            _ => None,
        }
    }
}

/// What changed about a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeChange {
    /// A node joined (a backend that discovers its nodes then sends `FleetChanged` with it).
    Added,
    /// A node left: its work is lost.
    Removed,
    Cordoned(bool),
    Ready(bool),
    /// Its GPUs as advertised changed (count, MIG devices, time-slicing replicas).
    Capacity,
}

/// One GPU's telemetry, with DCGM exporter field names in mind.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuSample {
    pub node: String,
    pub gpu: u8,
    pub uuid: String,
    pub model: String,
    /// `DCGM_FI_DEV_GPU_UTIL` (not defined per MIG instance).
    pub util_pct: f64,
    /// `DCGM_FI_DEV_FB_USED` / `_FREE`, MiB.
    pub fb_used_mib: u64,
    pub fb_free_mib: u64,
    pub temp_c: f64,
    pub power_w: f64,
    /// Last XID error (`DCGM_FI_DEV_XID_ERRORS`), 0 = none.
    pub xid: u32,
    pub instances: Vec<InstanceSample>,
}

/// One MIG instance (or time-slice share) on a GPU, or the GPU itself as a workload holds it
/// (an empty `profile`: backends whose device plugin picks the GPUs name the holder this way).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InstanceSample {
    /// The workload on it; 0 for an instance no one holds.
    pub workload: u64,
    /// `GPU_I_PROFILE` (MIG) or empty for shares.
    pub profile: String,
    /// `GPU_I_ID`.
    pub instance_id: u32,
    /// `DCGM_FI_PROF_GR_ENGINE_ACTIVE`, 0..1.
    pub gr_engine_active: f64,
    pub fb_used_mib: u64,
    /// Framebuffer of the instance (or share) not in use, MiB.
    #[serde(default)]
    pub fb_free_mib: u64,
}

impl InstanceSample {
    /// The workload on it, if any.
    pub fn holder(&self) -> Option<u64> {
        (self.workload != 0).then_some(self.workload)
    }
}

impl GpuSample {
    /// The workloads holding the whole GPU, as the backend saw them (one, or several pods on a
    /// time-sliced GPU).
    pub fn whole_holders(&self) -> impl Iterator<Item = u64> + '_ {
        self.instances
            .iter()
            .filter(|i| i.profile.is_empty())
            .filter_map(InstanceSample::holder)
    }
}

/// Where each workload a telemetry pass names was seen: (node, GPU). A workload a backend names
/// is on that GPU whatever the engine booked (a device plugin picks devices itself).
pub fn named_workloads(samples: &[GpuSample]) -> std::collections::HashMap<u64, (&str, u8)> {
    samples
        .iter()
        .flat_map(|s| {
            s.instances
                .iter()
                .filter_map(move |i| Some((i.holder()?, (s.node.as_str(), s.gpu))))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_workload_events_name_a_workload() {
        let started = BackendEvent::Started { id: 7, bound: None };
        let lost = BackendEvent::Lost {
            id: 8,
            at_ms: 0,
            detail: "evicted".into(),
        };
        let tel = BackendEvent::Telemetry {
            at_ms: 0,
            gpus: Vec::new(),
        };
        assert_eq!(started.workload(), Some(7));
        assert_eq!(lost.workload(), Some(8));
        assert_eq!(tel.workload(), None);
    }

    #[test]
    fn exits_read_as_sentences() {
        let failed = Exit::Failed {
            exit_code: Some(137),
            detail: "out of memory".into(),
        };
        assert_eq!(failed.to_string(), "failed with exit code 137: out of memory");
        assert_eq!(Exit::Succeeded.to_string(), "succeeded");
    }

    #[test]
    fn instance_samples_without_free_framebuffer_still_parse() {
        let s: InstanceSample = serde_json::from_str(
            r#"{"workload":1,"profile":"3g.40gb","instance_id":5,"gr_engine_active":0.5,"fb_used_mib":100}"#,
        )
        .unwrap();
        assert_eq!((s.fb_used_mib, s.fb_free_mib), (100, 0));
    }
}
