//! The mutable fleet state the engine places into: per node, free host resources and per GPU
//! what is held on it (and, for GPUs laid out as a whole, their configured MIG layout); plus the
//! allocations themselves and which of them the backend has not bound yet.
//!
//! Everything derives `PartialEq` so that property tests can check that releasing an allocation
//! restores the exact state before it was placed.

use std::collections::{HashMap, HashSet};

use tessera_model::layout::Placed;
use tessera_model::{GpuUnits, NodeId, TenantId};

/// Identifies an allocation; chosen by the caller (the control plane uses workload IDs).
pub type AllocId = u64;

/// What an allocation holds on its node.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Grant {
    /// Whole GPUs, as a bit mask of GPU indexes on the node.
    Whole { gpus: u16 },
    /// One MIG GPU instance: `profile` indexes the model's geometry; `start`/`size` in memory
    /// slices, as NVML's `nvmlGpuInstancePlacement_t`.
    Mig {
        gpu: u8,
        profile: u8,
        profile_id: u32,
        start: u8,
        size: u8,
    },
    /// A time-sliced share of one GPU.
    Fraction { gpu: u8, milli: u16, memory_mib: u32 },
    /// Host CPU and memory only.
    CpuOnly,
}

impl Grant {
    /// GPU indexes the grant touches, as a mask.
    pub fn gpu_mask(&self) -> u16 {
        match *self {
            Grant::Whole { gpus } => gpus,
            Grant::Mig { gpu, .. } | Grant::Fraction { gpu, .. } => 1 << gpu,
            Grant::CpuOnly => 0,
        }
    }
}

/// A placement decision: where a request goes. Committing it makes an [`Allocation`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub node: NodeId,
    pub grant: Grant,
    pub units: GpuUnits,
    /// The MIG GPU gets a new layout for this instance ([`crate::mig::MigMode::WholeGpu`] only):
    /// the control plane must have the backend apply it before the workload can start.
    pub relayout: bool,
}

/// One configured MIG instance of a GPU, as [`crate::Engine::mig_layout`] reports it and
/// [`crate::Engine::adopt_layout`] takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MigSlot {
    /// Index of the profile in the model's MIG geometry.
    pub profile: u8,
    /// NVML profile ID (`nvidia-smi mig -lgip`).
    pub profile_id: u32,
    /// First memory slice, as NVML's `nvmlGpuInstancePlacement_t`.
    pub start: u8,
    /// Memory slices occupied.
    pub size: u8,
}

impl MigSlot {
    /// The slot of instance `p` of a GPU of geometry `geom`.
    pub fn of(geom: &tessera_model::MigGeometry, p: &Placed) -> MigSlot {
        let prof = &geom.profiles[p.profile as usize];
        MigSlot {
            profile: p.profile,
            profile_id: prof.id,
            start: p.start,
            size: prof.mem_slices,
        }
    }
}

/// A committed placement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub id: AllocId,
    pub node: NodeId,
    pub grant: Grant,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub tenant: Option<TenantId>,
    pub units: GpuUnits,
}

/// What one GPU holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuState {
    /// GPU units in use, in milli-GPU (1000 = the whole GPU is taken).
    pub used_milli: u16,
    /// MIG: occupied memory slices.
    pub mig_mask: u16,
    /// MIG: the single `+me` instance exists.
    pub mig_me: bool,
    /// GPU memory promised to fractions.
    pub mem_used_mib: u32,
    /// Shared GPUs: tenant of the fractions on it (meaningful while `holders` is non-empty).
    pub tenant: Option<TenantId>,
    /// Allocations holding part or all of this GPU, in placement order.
    pub holders: Vec<AllocId>,
    /// MIG GPUs laid out as a whole: the configured instances, in use or free, sorted by start.
    /// Empty when instances are created one at a time (they exist only while in use).
    pub mig_layout: Vec<Placed>,
}

impl GpuState {
    pub fn is_free(&self) -> bool {
        self.holders.is_empty()
    }

    pub fn free_milli(&self) -> u16 {
        1000 - self.used_milli
    }
}

/// One node's free resources and GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeState {
    pub cpu_free: u64,
    pub mem_free: u64,
    pub gpus: Vec<GpuState>,
    /// GPUs with nothing on them.
    pub free_mask: u16,
    /// Bumped on every change; lets policies cache per-node scores.
    pub epoch: u64,
}

impl NodeState {
    pub fn free_gpus(&self) -> u32 {
        self.free_mask.count_ones()
    }
}

/// The whole fleet's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterState {
    pub nodes: Vec<NodeState>,
    pub allocations: HashMap<AllocId, Allocation>,
    /// Allocations whose devices are booked provisionally: the backend picks the devices itself
    /// and has not reported them yet (see [`crate::engine::DeviceBinding`]).
    pub unbound: HashSet<AllocId>,
}

impl ClusterState {
    /// Everything free.
    pub fn empty(fleet: &tessera_model::Fleet) -> Self {
        let nodes = fleet
            .nodes
            .iter()
            .map(|n| NodeState {
                cpu_free: n.cpu_milli,
                mem_free: n.memory_mib,
                gpus: vec![GpuState::default(); n.gpus as usize],
                free_mask: if n.gpus == 0 { 0 } else { ((1u32 << n.gpus) - 1) as u16 },
                epoch: 0,
            })
            .collect();
        ClusterState {
            nodes,
            allocations: HashMap::new(),
            unbound: HashSet::new(),
        }
    }

    /// Equality that ignores the per-node epochs (which only ever grow).
    pub fn same_holdings(&self, other: &ClusterState) -> bool {
        self.allocations == other.allocations
            && self.unbound == other.unbound
            && self.nodes.len() == other.nodes.len()
            && self.nodes.iter().zip(&other.nodes).all(|(a, b)| {
                a.cpu_free == b.cpu_free && a.mem_free == b.mem_free && a.gpus == b.gpus && a.free_mask == b.free_mask
            })
    }

    /// Like [`ClusterState::same_holdings`] but also ignoring configured MIG layouts: GPUs laid
    /// out as a whole keep their instances configured after a release, so only the occupancy
    /// returns to what it was.
    pub fn same_occupancy(&self, other: &ClusterState) -> bool {
        let same_gpu = |a: &GpuState, b: &GpuState| {
            a.used_milli == b.used_milli
                && a.mig_mask == b.mig_mask
                && a.mig_me == b.mig_me
                && a.mem_used_mib == b.mem_used_mib
                && a.tenant == b.tenant
                && a.holders == b.holders
        };
        self.allocations == other.allocations
            && self.unbound == other.unbound
            && self.nodes.len() == other.nodes.len()
            && self.nodes.iter().zip(&other.nodes).all(|(a, b)| {
                a.cpu_free == b.cpu_free
                    && a.mem_free == b.mem_free
                    && a.free_mask == b.free_mask
                    && a.gpus.len() == b.gpus.len()
                    && a.gpus.iter().zip(&b.gpus).all(|(x, y)| same_gpu(x, y))
            })
    }
}
