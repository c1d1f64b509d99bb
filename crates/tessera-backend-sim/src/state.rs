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

pub(crate) struct Run {
    pub spec: RunSpec,
    /// Indices into [`State::gpus`]; empty for host-only work, and for a workload adopted in
    /// operator mode before its node's layout offers it a device.
    pub gpus: Vec<usize>,
    /// What it holds of those GPUs.
    pub slice: SliceSpec,
    pub phase: Phase,
    /// When it started running (sim clock, ms since the epoch).
    pub since_ms: Option<i64>,
    /// `stop` was called: no more events for it.
    pub stopping: bool,
    /// Tells a timer of an earlier run of the same ID from this one.
    pub generation: u64,
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
        for &g in &run.gpus {
            self.gpus[g].holders.push(run.spec.id);
        }
        self.ended.remove(&run.spec.id);
        self.runs.insert(run.spec.id, run);
    }

    /// Moves a run to devices bound after it was inserted (an adopted operator-mode workload).
    pub fn bind_run(&mut self, id: u64, gpus: Vec<usize>, slice: SliceSpec) {
        for &g in &gpus {
            self.gpus[g].holders.push(id);
        }
        if let Some(run) = self.runs.get_mut(&id) {
            run.gpus = gpus;
            run.slice = slice;
        }
    }

    pub fn remove_run(&mut self, id: u64, how: Ended) -> Option<Run> {
        let run = self.runs.remove(&id)?;
        for &g in &run.gpus {
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
                .is_some_and(|r| matches!(&r.slice, SliceSpec::Mig(i) if i.same_placement(instance)))
        })
    }

    /// Milli-GPU of GPU `g` held by time-slice shares.
    pub fn shared_milli(&self, g: usize) -> u32 {
        self.gpus[g]
            .holders
            .iter()
            .filter_map(|h| match self.runs.get(h).map(|r| &r.slice) {
                Some(SliceSpec::Fraction { milli, .. }) => Some(*milli as u32),
                _ => None,
            })
            .sum()
    }
}
