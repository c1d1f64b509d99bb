//! The simulated fleet's state: its GPUs (MIG instances, the workloads on them, injected XIDs),
//! the workloads it runs, and how the ones that ended in this process ended.

use std::collections::HashMap;

use tessera_backend::{BackendError, MigInstance, RunSpec, SliceSpec};

use crate::SimGpu;
use crate::telemetry::sim_uuid;

pub(crate) struct GpuState {
    pub gpu: SimGpu,
    /// Computed once: telemetry reports it for every GPU on every sample.
    pub uuid: String,
    /// The last injected XID, 0 for none.
    pub xid: u32,
    /// Exact mode: the instances `partition` created; operator mode: the GPU's layout. Sorted by
    /// start slice.
    pub instances: Vec<MigInstance>,
    /// The workloads on this GPU, so that a sample costs the GPU's own holders, not the fleet's.
    pub holders: Vec<u64>,
    /// Its node is gone (rebooting, removed): no telemetry.
    pub gone: bool,
    /// A MIG-capable GPU an admin took out of MIG mode ([`tessera_backend::Backend::set_mig_mode`]):
    /// no instances until it is enabled again.
    pub mig_off: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Starting,
    Running,
}

/// What one node-share of a workload holds on its node.
pub(crate) struct Held {
    /// Indices into [`State::gpus`]; empty for host-only work, and for a share adopted in
    /// operator mode before its node's layout offers it a device.
    pub gpus: Vec<usize>,
    /// What it holds of those GPUs.
    pub slice: SliceSpec,
    /// The share vanished without a word ([`crate::SimBackend::forget_share`]): it holds
    /// nothing any more, and the gang cannot end well.
    pub gone: bool,
}

impl Held {
    pub fn new(gpus: Vec<usize>, slice: SliceSpec) -> Self {
        Held {
            gpus,
            slice,
            gone: false,
        }
    }
}

pub(crate) struct Run {
    pub spec: RunSpec,
    /// What each node-share holds, by gang index (one share unless it is a multi-node gang;
    /// share `i` is on `spec.share(i)`'s node).
    pub shares: Vec<Held>,
    pub phase: Phase,
    /// When it started running (sim clock, ms since the epoch).
    pub since_ms: Option<i64>,
    /// `stop` was called: no more events for it.
    pub stopping: bool,
    /// Tells a timer of an earlier run of the same ID from this one.
    pub generation: u64,
}

impl Run {
    /// Every GPU it holds, on every node.
    pub fn gpus(&self) -> impl Iterator<Item = usize> + '_ {
        self.shares.iter().flat_map(|s| s.gpus.iter().copied())
    }

    /// What it holds of GPU `g`, if it holds any of it.
    pub fn slice_on(&self, g: usize) -> Option<&SliceSpec> {
        self.shares.iter().find(|s| s.gpus.contains(&g)).map(|s| &s.slice)
    }

    /// The node of node-share `index`.
    pub fn node(&self, index: usize) -> &str {
        self.spec.share(index).map(|(n, _)| n).unwrap_or(&self.spec.node)
    }

    /// The node-shares on `node` (one at most for a gang the sim started or adopted).
    pub fn shares_on<'a>(&'a self, node: &'a str) -> impl Iterator<Item = usize> + 'a {
        (0..self.shares.len()).filter(move |&i| self.node(i) == node)
    }

    /// The first node-share that vanished ([`Held::gone`]).
    pub fn gone_share(&self) -> Option<usize> {
        self.shares.iter().position(|s| s.gone)
    }
}

/// How a workload ended in this process; without it, a periodic reconcile would adopt a
/// workload that was just stopped as if the control plane had restarted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    Succeeded,
    Stopped,
    Lost,
}

pub(crate) struct State {
    /// Sorted by node, then GPU index.
    pub gpus: Vec<GpuState>,
    /// Node → its GPUs' indices into `gpus`, by GPU index.
    nodes: HashMap<String, Vec<usize>>,
    pub runs: HashMap<u64, Run>,
    pub ended: HashMap<u64, Ended>,
    next_generation: u64,
    pub fail_next_partition: Option<String>,
    pub partitions_created: u64,
    pub starts: u64,
}

impl State {
    pub fn new(mut gpus: Vec<SimGpu>) -> Self {
        gpus.sort_by(|a, b| (&a.node, a.index).cmp(&(&b.node, b.index)));
        gpus.dedup_by(|a, b| a.node == b.node && a.index == b.index);
        let mut nodes: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, g) in gpus.iter().enumerate() {
            nodes.entry(g.node.clone()).or_default().push(i);
        }
        State {
            gpus: gpus
                .into_iter()
                .map(|gpu| GpuState {
                    uuid: sim_uuid(&gpu.node, gpu.index),
                    gpu,
                    xid: 0,
                    instances: Vec::new(),
                    holders: Vec::new(),
                    gone: false,
                    mig_off: false,
                })
                .collect(),
            nodes,
            runs: HashMap::new(),
            ended: HashMap::new(),
            next_generation: 0,
            fail_next_partition: None,
            partitions_created: 0,
            starts: 0,
        }
    }

    /// The GPUs of a node, by index.
    pub fn node_gpus(&self, node: &str) -> Result<&[usize], BackendError> {
        self.nodes
            .get(node)
            .map(Vec::as_slice)
            .ok_or_else(|| BackendError::Rejected(format!("no node `{node}` in the simulated fleet")))
    }

    pub fn gpu(&self, node: &str, gpu: u8) -> Result<usize, BackendError> {
        let on_node = self.node_gpus(node)?;
        on_node
            .iter()
            .copied()
            .find(|&g| self.gpus[g].gpu.index == gpu)
            .ok_or_else(|| BackendError::Rejected(format!("no GPU {gpu} on {node}")))
    }

    /// "GPU 3 on a100-00", for messages.
    pub fn gpu_name(&self, g: usize) -> String {
        let s = &self.gpus[g].gpu;
        format!("GPU {} on {}", s.index, s.node)
    }

    pub fn next_generation(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }

    pub fn insert_run(&mut self, run: Run) {
        for g in run.gpus() {
            self.gpus[g].holders.push(run.spec.id);
        }
        self.ended.remove(&run.spec.id);
        self.runs.insert(run.spec.id, run);
    }

    /// Moves node-share `share` of a run to devices bound after it was inserted (an adopted
    /// operator-mode workload).
    pub fn bind_run(&mut self, id: u64, share: usize, gpus: Vec<usize>, slice: SliceSpec) {
        let Some(held) = self.runs.get_mut(&id).and_then(|r| r.shares.get_mut(share)) else {
            return;
        };
        held.gpus = gpus.clone();
        held.slice = slice;
        for g in gpus {
            self.gpus[g].holders.push(id);
        }
    }

    /// Node-share `share` of a run vanishes: its devices are free, the rest of the run keeps
    /// its own. False when there is no such run or share, or it is gone already.
    pub fn drop_share(&mut self, id: u64, share: usize) -> bool {
        let Some(held) = self.runs.get_mut(&id).and_then(|r| r.shares.get_mut(share)) else {
            return false;
        };
        if held.gone {
            return false;
        }
        held.gone = true;
        held.slice = SliceSpec::HostOnly;
        for g in std::mem::take(&mut held.gpus) {
            self.gpus[g].holders.retain(|&h| h != id);
        }
        true
    }

    pub fn remove_run(&mut self, id: u64, how: Ended) -> Option<Run> {
        let run = self.runs.remove(&id)?;
        for g in run.gpus() {
            self.gpus[g].holders.retain(|&h| h != id);
        }
        self.ended.insert(id, how);
        Some(run)
    }

    /// Whether `node`'s GPUs are gone (it was removed, or is rebooting).
    pub fn node_down(&self, node: &str) -> bool {
        self.nodes
            .get(node)
            .is_some_and(|gpus| gpus.iter().any(|&g| self.gpus[g].gone))
    }

    /// The workload that holds this MIG instance of GPU `g`, if any.
    pub fn instance_holder(&self, g: usize, instance: &MigInstance) -> Option<u64> {
        self.gpus[g].holders.iter().copied().find(|h| {
            self.runs
                .get(h)
                .is_some_and(|r| matches!(r.slice_on(g), Some(SliceSpec::Mig(i)) if i.same_placement(instance)))
        })
    }

    /// Milli-GPU of GPU `g` held by time-slice shares.
    pub fn shared_milli(&self, g: usize) -> u32 {
        self.gpus[g]
            .holders
            .iter()
            .filter_map(|h| match self.runs.get(h).and_then(|r| r.slice_on(g)) {
                Some(SliceSpec::Fraction { milli, .. }) => Some(*milli as u32),
                _ => None,
            })
            .sum()
    }
}
