//! What a workload is: its identity, what it asked for ([`WorkloadSpec`]), where it was placed
//! ([`Placement`]), its phase in the lifecycle and the bookkeeping of its timeline and usage
//! intervals. These are the records the store persists (in typed columns) and the lifecycle
//! loop keeps in memory; the REST API shows views of them.

use std::collections::BTreeMap;
use std::fmt;

use tessera_model::GpuUnits;

use crate::reason::Reason;

/// A workload's identity, assigned by the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkloadId(pub u64);

impl fmt::Display for WorkloadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// What kind of work it is: decides what happens when it is preempted or a node is drained.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Runs to completion; preempted batch work is requeued unless it asked not to be.
    #[default]
    Batch,
    /// Runs until stopped (a lease when it has a duration).
    Service,
    /// A person's session.
    Interactive,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Batch => "batch",
            Kind::Service => "service",
            Kind::Interactive => "interactive",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Some(match s {
            "batch" => Kind::Batch,
            "service" => Kind::Service,
            "interactive" => Kind::Interactive,
            _ => return None,
        })
    }
}

/// The GPU part of a request, as the tenant wrote it (names are resolved against the fleet
/// when it is scheduled, so a stored request survives fleet changes it does not depend on).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum GpuSpec {
    /// Whole GPUs on one node (and one NVLink domain).
    Whole { gpus: u8 },
    /// One MIG instance: a profile name such as `3g.40gb`, or `MODEL:PROFILE_ID`.
    Mig { profile: String },
    /// A fraction of a time-shared GPU, in milli-GPU, optionally with GPU memory.
    Fraction { milli: u16, memory_mib: Option<u32> },
    /// Whole GPUs across several nodes of one pool, as node-shares started and ended together.
    Gang(GangSpec),
}

/// A multi-node gang as the tenant wrote it: `gpus` whole GPUs as node-shares of
/// `gpus_per_node` each (whole nodes when `None`), kept within a topology level.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GangSpec {
    pub gpus: u32,
    pub gpus_per_node: Option<u8>,
    /// A level of the fleet (`rack`, `block`, a label key) or `pool`, required or preferred;
    /// `None`: preferred at the fleet's lowest level (the fewest racks possible).
    pub topology: Option<tessera_model::request::TopologyConstraint>,
    /// Groups of this many GPUs, each within one rack.
    pub segment: Option<u32>,
    /// Whole nodes only (`gpus_per_node` is `None`): `gpus` need not be a multiple of the
    /// node size, the last share holding the remainder on one node (12 GPUs on 8-GPU nodes:
    /// 8 + 4). Asked for explicitly (`shape.remainder`); off, `gpus` is whole nodes.
    pub remainder: bool,
}

impl fmt::Display for GpuSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuSpec::Whole { gpus } => write!(f, "{gpus} whole GPU{}", if *gpus == 1 { "" } else { "s" }),
            GpuSpec::Mig { profile } => write!(f, "MIG {profile}"),
            GpuSpec::Fraction { milli, .. } => write!(f, "{milli} milli-GPU"),
            GpuSpec::Gang(g) => {
                write!(f, "a gang of {} whole GPUs", g.gpus)?;
                if let Some(per) = g.gpus_per_node {
                    write!(f, " ({} nodes × {per})", g.gpus / u32::from(per.max(1)))?;
                }
                if g.remainder {
                    f.write_str(" (whole nodes, the last with the remainder)")?;
                }
                Ok(())
            }
        }
    }
}

/// The GPU shape with its placement constraints.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ShapeSpec {
    pub gpu: GpuSpec,
    /// Allowed GPU models or families (`h100`, `A100-80GB`); empty = any.
    pub models: Vec<String>,
    /// Restrict to one pool.
    pub pool: Option<String>,
}

/// Everything a workload asked for. Immutable once accepted.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WorkloadSpec {
    pub tenant: String,
    pub project: String,
    pub name: String,
    pub kind: Kind,
    pub shape: ShapeSpec,
    /// Host CPU in milli-cores and memory in MiB (defaults already applied).
    pub cpu_milli: u64,
    pub memory_mib: u64,
    /// Run time for batch work, a lease for services and sessions; `None` runs until stopped.
    pub duration_s: Option<u64>,
    pub command: Option<Vec<String>>,
    pub image: Option<String>,
    pub env: BTreeMap<String, String>,
    /// Priority class name.
    pub priority: String,
    /// Beyond the tenant's limit or budget: be refused instead of waiting.
    pub no_wait: bool,
    /// If preempted, end as `preempted` instead of being requeued.
    pub no_requeue: bool,
    /// Whether and how consolidation may move it to defragment its pool (`None`: never).
    pub movable: Option<Movable>,
    /// A workload asked for with the backend's own tools: the backend's object it is
    /// (opaque here; on Kubernetes `namespace/name/uid` of the pod). `None`: Tessera makes what
    /// runs it.
    pub native: Option<String>,
}

/// How consolidation may move a running workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Movable {
    /// Batch work that can be stopped and requeued: it restarts from its last checkpoint.
    Restart,
    /// A service (no lease): a replacement starts elsewhere first, then this one stops.
    Replace,
}

impl Movable {
    pub fn as_str(self) -> &'static str {
        match self {
            Movable::Restart => "restart",
            Movable::Replace => "replace",
        }
    }

    pub fn parse(s: &str) -> Option<Movable> {
        Some(match s {
            "restart" => Movable::Restart,
            "replace" => Movable::Replace,
            _ => return None,
        })
    }
}

impl fmt::Display for Movable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ShapeSpec {
    /// A GPU shape with no constraint on the model or the pool.
    pub fn any(gpu: GpuSpec) -> Self {
        ShapeSpec {
            gpu,
            models: Vec::new(),
            pool: None,
        }
    }
}

impl WorkloadSpec {
    /// A spec with nothing beyond its owner, name, kind and shape: no host resources, no
    /// lease, command, image or environment, the `standard` priority, waiting and requeued as
    /// usual, never moved, made by Tessera. The others are set with struct update syntax.
    pub fn new(tenant: &str, project: &str, name: &str, kind: Kind, shape: ShapeSpec) -> Self {
        WorkloadSpec {
            tenant: tenant.into(),
            project: project.into(),
            name: name.into(),
            kind,
            shape,
            cpu_milli: 0,
            memory_mib: 0,
            duration_s: None,
            command: None,
            image: None,
            env: BTreeMap::new(),
            priority: "standard".into(),
            no_wait: false,
            no_requeue: false,
            movable: None,
            native: None,
        }
    }

    /// Whether preemption puts this workload back in the queue.
    pub fn requeue_on_preemption(&self) -> bool {
        self.kind == Kind::Batch && !self.no_requeue
    }
}

/// Where a workload runs: the record of its allocation, in fleet names.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Placement {
    pub pool: String,
    pub node: String,
    pub model: String,
    /// GPU indexes on the node, ascending.
    pub gpus: Vec<u8>,
    pub slice: Slice,
    /// GPU units held.
    pub units: GpuUnits,
}

/// The share of the GPUs a placement holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Slice {
    Whole,
    /// One MIG GPU instance at memory slices `start..start+size` (NVML placement semantics).
    Mig {
        profile: String,
        profile_id: u32,
        start: u8,
        size: u8,
    },
    /// A time-sliced share of one GPU.
    Fraction {
        milli: u16,
        gpu_memory_mib: Option<u32>,
    },
    /// Host CPU and memory only.
    CpuOnly,
}

impl Slice {
    /// `whole`, `mig`, `fraction` or `cpu`.
    pub fn kind(&self) -> &'static str {
        match self {
            Slice::Whole => "whole",
            Slice::Mig { .. } => "mig",
            Slice::Fraction { .. } => "fraction",
            Slice::CpuOnly => "cpu",
        }
    }
}

impl fmt::Display for Placement {
    /// `MIG 3g.40gb (profile 9) at slices 4..7 of GPU 0`, `2 whole H100-80GB-SXM GPUs [0, 1]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let first = self.gpus.first().copied().unwrap_or(0);
        match &self.slice {
            Slice::Mig {
                profile,
                profile_id,
                start,
                size,
            } => write!(
                f,
                "MIG {profile} (profile {profile_id}) at slices {start}..{} of GPU {first}",
                start + size.max(&1) - 1
            ),
            Slice::Fraction { milli, .. } => write!(f, "{milli} milli-GPU of GPU {first}"),
            Slice::CpuOnly => f.write_str("host resources"),
            Slice::Whole => write!(
                f,
                "{} whole {} GPU{} {:?}",
                self.gpus.len(),
                self.model,
                if self.gpus.len() == 1 { "" } else { "s" },
                self.gpus
            ),
        }
    }
}

/// Where a workload is in its lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// Accepted, not yet seen by a scheduler cycle: the next full cycle decides it, whatever
    /// the queue's length (it never outlives that cycle).
    Pending,
    /// Waiting for capacity, quota or budget, or to be looked at by a cycle (a deep queue).
    Queued,
    /// Holds an allocation; the backend is creating its partition.
    Placed,
    /// Its partition exists (recorded before start, so recovery never partitions twice); the
    /// backend is starting it.
    Partitioned,
    Running,
    /// Being stopped (grace period, then forced): cancelled, preempted or drained.
    Stopping,
    Succeeded,
    Failed,
    Cancelled,
    Preempted,
}

impl Phase {
    pub const ALL: [Phase; 10] = [
        Phase::Pending,
        Phase::Queued,
        Phase::Placed,
        Phase::Partitioned,
        Phase::Running,
        Phase::Stopping,
        Phase::Succeeded,
        Phase::Failed,
        Phase::Cancelled,
        Phase::Preempted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "pending",
            Phase::Queued => "queued",
            Phase::Placed => "placed",
            Phase::Partitioned => "partitioned",
            Phase::Running => "running",
            Phase::Stopping => "stopping",
            Phase::Succeeded => "succeeded",
            Phase::Failed => "failed",
            Phase::Cancelled => "cancelled",
            Phase::Preempted => "preempted",
        }
    }

    pub fn parse(s: &str) -> Option<Phase> {
        Phase::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// Terminal phases hold nothing and never change again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Phase::Succeeded | Phase::Failed | Phase::Cancelled | Phase::Preempted
        )
    }

    /// Phases in which the workload holds an allocation.
    pub fn holds_capacity(self) -> bool {
        matches!(
            self,
            Phase::Placed | Phase::Partitioned | Phase::Running | Phase::Stopping
        )
    }

    /// Phases in which the scheduler queue holds the workload.
    pub fn is_waiting(self) -> bool {
        matches!(self, Phase::Pending | Phase::Queued)
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a workload is being stopped; kept with it so that a restart finishes the stop the same
/// way (a preempted batch job is still requeued after a crash).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum StopCause {
    /// A person or token cancelled it.
    Cancelled { by: String },
    /// The scheduler gave its capacity to workload `by`.
    Preempted {
        by: WorkloadId,
        /// `priority` or `reclaim`.
        code: PreemptCode,
        /// The sentence explaining the preemption.
        detail: String,
    },
}

/// The kind of preemption.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PreemptCode {
    Priority,
    Reclaim,
    /// Stopped because a GPU it runs on failed (`--on-gpu-failure requeue`); `by` is the
    /// workload itself.
    Health,
    /// Stopped by the drain of its node (a service once its replacement runs, other work
    /// after the drain deadline); `by` is the replacement, or the workload itself.
    Drain,
    /// Moved by consolidation so that a waiting request fits (restartable batch work is
    /// requeued; a service stops once its replacement runs); `by` is the waiting request, or
    /// the replacement.
    Consolidation,
}

impl PreemptCode {
    pub fn as_str(self) -> &'static str {
        match self {
            PreemptCode::Priority => "priority",
            PreemptCode::Reclaim => "reclaim",
            PreemptCode::Health => "health",
            PreemptCode::Drain => "drain",
            PreemptCode::Consolidation => "consolidation",
        }
    }

    pub fn parse(s: &str) -> Option<PreemptCode> {
        Some(match s {
            "priority" => PreemptCode::Priority,
            "reclaim" => PreemptCode::Reclaim,
            "health" => PreemptCode::Health,
            "drain" => PreemptCode::Drain,
            "consolidation" => PreemptCode::Consolidation,
            _ => return None,
        })
    }
}

/// The workload's place in the usage ledger.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UsageCursor {
    /// Sequence number of the open interval, or of the next one when none is open.
    pub seq: u32,
    /// Whether an interval is open (the workload is metered now).
    pub open: bool,
}

/// A workload: its request and its lifecycle state.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    pub id: WorkloadId,
    pub spec: WorkloadSpec,
    /// GPU units the shape asks for.
    pub units: GpuUnits,
    pub phase: Phase,
    /// Why it waits, why it failed or was stopped; `None` when there is nothing to explain.
    pub reason: Option<Reason>,
    /// Where it runs (for a multi-node gang: its first node-share).
    pub placement: Option<Placement>,
    /// A multi-node gang's node-shares after the first (`placement`), in gang order; empty for
    /// a workload on one node.
    pub shares: Vec<Placement>,
    /// Admitted above the tenant's guaranteed share: may be preempted to reclaim it.
    pub borrowing: bool,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
    pub running_at: Option<i64>,
    pub ended_at: Option<i64>,
    /// Set while stopping.
    pub stop: Option<StopCause>,
    /// Sequence number of the next timeline event.
    pub next_seq: u32,
    pub usage: UsageCursor,
}

impl Workload {
    /// Every node-share it holds, the first (`placement`) first: none while it holds nothing,
    /// one for a workload on one node.
    pub fn placements(&self) -> impl Iterator<Item = &Placement> {
        self.placement.iter().chain(self.shares.iter())
    }

    /// The GPU units its node-shares hold together (zero while it holds nothing).
    pub fn held_units(&self) -> GpuUnits {
        self.placements().fold(GpuUnits::ZERO, |u, p| u + p.units)
    }

    /// Whether it holds capacity on `node` (any of its node-shares).
    pub fn holds_on(&self, node: &str) -> bool {
        self.placements().any(|p| p.node == node)
    }

    /// A newly accepted workload, before the scheduler has seen it.
    pub fn new(id: WorkloadId, spec: WorkloadSpec, units: GpuUnits, created_at: i64) -> Self {
        Workload {
            id,
            spec,
            units,
            phase: Phase::Pending,
            reason: None,
            placement: None,
            shares: Vec::new(),
            borrowing: false,
            created_at,
            running_at: None,
            ended_at: None,
            stop: None,
            next_seq: 0,
            usage: UsageCursor::default(),
        }
    }

    /// Milliseconds from request to running, once it has run.
    pub fn request_to_running_ms(&self) -> Option<u64> {
        self.running_at.map(|r| (r - self.created_at).max(0) as u64)
    }
}
