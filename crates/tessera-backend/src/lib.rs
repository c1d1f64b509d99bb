//! # tessera-backend
//!
//! The contract between Tessera's control plane and a backend, the thing that owns GPUs: the
//! [`Backend`] trait and the values that cross it. This crate holds no implementation; the
//! simulated backend lives in `tessera-backend-sim`, the NVML one (this machine's GPUs, workloads as
//! local processes) in `tessera-backend-local`.
//!
//! ## Capabilities
//!
//! Backends differ in how they partition MIG-capable GPUs and in who picks the devices of a
//! workload, so each one declares [`Capabilities`] and the engine plans accordingly:
//!
//! * [`Partitioning::Instance`]: the engine sends one [`PartitionPlan::Instance`] per MIG
//!   workload (profile ID + start slice); instances next to it keep running.
//! * [`Partitioning::WholeGpu`]: the engine sends the complete [`PartitionPlan::Layout`] of a GPU,
//!   and may change a GPU's layout only while none of its instances is in use; a layout equal to
//!   the current one is always accepted.
//! * [`Partitioning::None`]: no MIG plans at all.
//! * [`DeviceAssignment::Exact`]: the engine names the devices ([`Devices::Exact`]).
//! * [`DeviceAssignment::PerNodeCount`]: the engine asks for a count of a resource on a node
//!   ([`Devices::Count`]) and learns which devices were bound from [`BackendEvent::Started`],
//!   or, when the backend can tell only once the workload runs, from [`BackendEvent::Bound`].
//! * [`Capabilities::multi_node`]: the backend runs a multi-node gang ([`RunSpec::gang`]) as one
//!   workload whose node-shares start and end together; others refuse such a spec.
//!
//! ## One workload's life
//!
//! `partition(plan)` → `start(spec)` → events `Started`, `Running` → either an event `Exited` or
//! `Lost`, or a call to `stop(id, grace)` → `unpartition(plan)`.
//!
//! ## Invariants every backend keeps
//!
//! * **Idempotency.** `partition`, `unpartition`, `start` and `stop` may be repeated with the
//!   same arguments (a retry, or a control plane that crashed between two calls) and have the
//!   effect of one call. `partition` says whether it changed anything
//!   ([`PartitionReport::created`]), so "recovery never partitions twice" can be checked.
//! * **Event order per workload.** `Started`, then `Running`, then at most one of `Exited` or
//!   `Lost`, with any `Bound` between `Running` and the end. `Running` is skipped when the
//!   workload is stopped or lost before it ran. After
//!   `stop` has been called, no `Running`, `Exited` or `Lost` is emitted for it, but one emitted
//!   before the call may still be in the channel. Events of different workloads interleave
//!   freely; node, GPU, partition and telemetry events carry no workload order.
//! * **Level-triggered reconcile.** [`Backend::reconcile`] is given every workload Tessera
//!   believes is partitioned, starting, running or stopping on the backend, and answers what it
//!   sees of each, what runs there unexpected, and the MIG layouts. It changes nothing but
//!   adopting (a backend may adopt expected workloads it did not start, see its docs), so calling
//!   it twice with the same set gives the same answer. It is how a missed event or a restart is
//!   caught up: the caller acts on the difference.
//! * **Errors.** [`BackendError::Unreachable`]: the backend could not be asked; retrying later
//!   may work and the state is unknown. [`BackendError::Rejected`]: the backend refused this plan
//!   or spec; retrying it unchanged will fail again.
//!
//! The contract suite ([`contract`], feature `contract`) checks these invariants on every
//! backend: the simulator in both modes, `local` on the fake NVML with real processes, and
//! `kubernetes` against a real API server and kubelet.
//!
//! ## Optional capabilities
//!
//! Methods with a default: [`Backend::read_logs`] (refuses), [`Backend::ensure_tenancy`] and
//! [`Backend::remove_tenancy`] (do nothing: the sim and local backends have no tenancy of their
//! own; the Kubernetes backend makes a namespace with quota, RBAC and network policy per tenant
//! project), [`Backend::cordon`] (does nothing), [`Backend::evict`] (is `stop`) and
//! [`Backend::set_mig_mode`] (refuses; see [`Capabilities::mig_mode_switch`]).

#[cfg(feature = "contract")]
pub mod contract;
mod event;
mod native;
mod plan;
mod reconcile;
mod spec;

use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;

pub use event::{BackendEvent, Bound, Exit, GpuSample, InstanceSample, NodeChange, named_workloads};
pub use native::{NativeAsk, NativeGang, NativeGpus, NativeRef, NativeReview};
pub use plan::{MigInstance, PartitionPlan, PartitionReport};
pub use reconcile::{Observation, Orphan, ReconcileReport};
pub use spec::{Devices, GangShare, Resource, RunSpec, SHARED_POOL_QUOTA, SliceSpec, TenancySpec};

/// How a backend partitions MIG-capable GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Partitioning {
    /// Creates one GPU instance at a chosen placement (profile ID + start slice), as NVML's
    /// `nvmlDeviceCreateGpuInstanceWithPlacement` does; other instances keep running.
    Instance,
    /// Lays out a whole GPU at once, and only while none of its instances is in use, as the GPU
    /// Operator's MIG manager applies a mig-parted config.
    WholeGpu,
    /// No MIG at all.
    None,
}

/// How a backend binds a workload to devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceAssignment {
    /// Tessera names the exact GPUs / instance.
    Exact,
    /// Tessera asks for `count` devices of a resource on a node; the backend (the kubelet) picks
    /// which and reports them back (`BackendEvent::Started { bound }`).
    PerNodeCount,
}

/// What a backend can do; the engine plans only what these allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Capabilities {
    pub partitioning: Partitioning,
    pub devices: DeviceAssignment,
    /// Whether the backend can return a workload's logs.
    pub logs: bool,
    /// Whether [`Backend::set_mig_mode`] can switch a GPU's MIG mode (NVML and the exact-mode
    /// simulation can; on Kubernetes the GPU Operator's MIG manager owns it).
    pub mig_mode_switch: bool,
    /// Whether the backend reads each GPU's MIG mode back and reports it
    /// ([`BackendEvent::MigMode`]; NVML can): it is then the truth, and stored modes are not
    /// pushed onto it at start-up.
    pub mig_mode_reported: bool,
    /// Whether [`Backend::stop`] only starts a stop and the backend reports its end with
    /// [`BackendEvent::Stopped`] (Kubernetes: a pod's deletion ends when the kubelet says its
    /// containers are gone). The workload then keeps its capacity until that event, so the
    /// next workload never meets devices still in use. Otherwise `stop` returning is the end.
    pub confirms_stop: bool,
    /// Whether workloads can be asked for with the backend's own tools and admitted through
    /// Tessera ([`Backend::review_native`], [`BackendEvent::Submitted`]; Kubernetes: pods made
    /// with `kubectl`, through Tessera's admission webhook).
    pub native_admission: bool,
    /// Whether the backend runs a workload whose node-shares span several nodes
    /// ([`RunSpec::gang`]); one that does not refuses such a spec.
    pub multi_node: bool,
    /// Whether every workload runs a container image (Kubernetes): one without
    /// [`RunSpec::image`] is refused when it is asked for, not when it would start.
    pub needs_image: bool,
}

/// What [`Backend::set_mig_mode`] achieved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MigModeChange {
    /// The GPU is in the new mode now.
    Applied,
    /// The driver accepted the new mode but applies it only after a GPU reset (or a reboot),
    /// which Tessera never does: until then the GPU serves neither kind.
    PendingReset,
}

/// Why a backend call failed.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum BackendError {
    /// The backend could not be asked (network, API server, driver); the state is unknown.
    #[error("backend unreachable: {0}")]
    Unreachable(String),
    /// The backend refused the plan or spec; the message says why, for humans.
    #[error("{0}")]
    Rejected(String),
}

/// A backend: realises partitions, runs workloads and reports what happens to them.
#[async_trait]
pub trait Backend: Send + Sync {
    /// A short name for messages and metrics (`sim`).
    fn name(&self) -> &'static str;
    fn capabilities(&self) -> Capabilities;
    /// Creates the partition. Idempotent: a plan already realised succeeds with `created: false`.
    async fn partition(&self, plan: &PartitionPlan) -> Result<PartitionReport, BackendError>;
    /// Removes the partition of a workload that is gone (`Instance`: destroys the instance;
    /// `Share`: frees it; `Layout`: nothing — a layout changes only through a new `Layout` plan).
    /// Idempotent.
    async fn unpartition(&self, plan: &PartitionPlan) -> Result<(), BackendError>;
    /// Starts the workload and returns once the backend has accepted it; `Started` and `Running`
    /// follow as events. Idempotent: starting a workload it already runs does nothing.
    async fn start(&self, spec: &RunSpec) -> Result<(), BackendError>;
    /// Stops within `grace`, then forcibly. Idempotent (unknown ids are fine).
    async fn stop(&self, id: u64, grace: Duration) -> Result<(), BackendError>;
    /// Level-triggered: `expected` is every workload Tessera believes is partitioned, starting,
    /// running or stopping there. Called at start-up and periodically (default every 30 s).
    async fn reconcile(&self, expected: &[RunSpec]) -> Result<ReconcileReport, BackendError>;
    /// The event stream. A backend hands it out once (`None` afterwards) or, like the
    /// simulated backend, to each new subscriber in turn (the latest one gets the events).
    fn take_events(&self) -> Option<mpsc::UnboundedReceiver<BackendEvent>>;
    /// Optional capability ([`Capabilities::logs`]): up to `max` bytes of a workload's captured
    /// output (stdout and stderr, in the order written) from byte `offset`. Following a log is
    /// calling again from [`LogChunk::next_offset`] until [`LogChunk::done`]. Backends without
    /// logs keep this default, which refuses.
    async fn read_logs(&self, id: u64, offset: u64, max: usize) -> Result<LogChunk, BackendError> {
        let _ = (id, offset, max);
        Err(BackendError::Rejected(format!(
            "the {} backend keeps no workload logs",
            self.name()
        )))
    }
    /// Optional capability: makes the backend's isolation of a tenant project exist as `spec`
    /// says (idempotent, level-triggered: repairs drift). Backends without tenancy of their own
    /// keep this default, which does nothing.
    async fn ensure_tenancy(&self, spec: &TenancySpec) -> Result<(), BackendError> {
        let _ = spec;
        Ok(())
    }
    /// Optional capability: removes what [`Backend::ensure_tenancy`] made for one project of
    /// `tenant`, or for all of its projects with `project: None`. Idempotent.
    async fn remove_tenancy(&self, tenant: &str, project: Option<&str>) -> Result<(), BackendError> {
        let _ = (tenant, project);
        Ok(())
    }
    /// Optional capability: marks a node (un)schedulable for everything else that places work
    /// on it (Kubernetes: `spec.unschedulable`). The default does nothing.
    async fn cordon(&self, node: &str, on: bool) -> Result<(), BackendError> {
        let _ = (node, on);
        Ok(())
    }
    /// Drains one workload off its node: like [`Backend::stop`], but through the platform's
    /// own eviction where it has one (Kubernetes: the Eviction API, which honours disruption
    /// budgets). The default is `stop`.
    async fn evict(&self, id: u64, grace: Duration) -> Result<(), BackendError> {
        self.stop(id, grace).await
    }
    /// Optional capability ([`Capabilities::mig_mode_switch`]): switches MIG mode of GPU `gpu`
    /// of `node` on or off. Only ever called by an admin's explicit action on an idle GPU of a
    /// drained node; a backend refuses ([`BackendError::Rejected`]) a GPU that holds work or
    /// instances, or whose model has no MIG. Idempotent: the mode it already has is `Applied`.
    /// The default refuses.
    async fn set_mig_mode(&self, node: &str, gpu: u8, enabled: bool) -> Result<MigModeChange, BackendError> {
        let _ = (node, gpu, enabled);
        Err(BackendError::Rejected(format!(
            "the {} backend cannot change a GPU's MIG mode",
            self.name()
        )))
    }
    /// Optional capability ([`Capabilities::native_admission`]): reads a request to create an
    /// object through the backend's own API (Kubernetes: an `AdmissionReview` of a Pod) and
    /// says whether it is Tessera's business. Side-effect free. The default passes everything.
    async fn review_native(&self, review: &[u8]) -> Result<NativeReview, BackendError> {
        let _ = review;
        Ok(NativeReview::Pass)
    }
    /// The backend's answer to the request [`Backend::review_native`] read: allowed (with
    /// what the backend changes in an object it admits as a workload, when `mutate`: only for
    /// an [`NativeReview::Ask`]) or refused with `refusal`. The default refuses to answer.
    fn answer_native(&self, review: &[u8], mutate: bool, refusal: Option<&str>) -> Result<Vec<u8>, BackendError> {
        let _ = (review, mutate, refusal);
        Err(BackendError::Rejected(format!(
            "the {} backend admits no workloads of its own",
            self.name()
        )))
    }
    /// Links a native object ([`BackendEvent::Submitted`]) to the workload Tessera recorded
    /// for it, so that its later events are that workload's. Idempotent. The default refuses.
    async fn adopt_native(&self, id: u64, native: &NativeRef) -> Result<(), BackendError> {
        let _ = (id, native);
        Err(BackendError::Rejected(format!(
            "the {} backend admits no workloads of its own",
            self.name()
        )))
    }
    /// Tells a native object's owner, through the backend's own tools, why its workload waits
    /// or was refused (Kubernetes: an Event on the pod). Best effort, returns at once; the
    /// default does nothing.
    fn tell_native(&self, native: &NativeRef, refused: bool, message: &str) {
        let _ = (native, refused, message);
    }
    /// What a simulated backend lets an operator do to it beyond the contract (fault
    /// injection, reboots), for demos and tests; `None` (the default) for a backend on real
    /// machines.
    fn simulated(&self) -> Option<&dyn Simulated> {
        None
    }
}

/// A simulated backend's controls ([`Backend::simulated`]): the server offers them (the
/// fault-injection route, simulated node upgrades) only where a backend has them, without
/// depending on which backend it is.
pub trait Simulated: Send + Sync {
    /// Injects an XID error on GPU `gpu` of `node` (0 clears it): it shows in telemetry, and a
    /// `GpuHealth` event reports the GPU unhealthy (healthy again for 0). Returns the GPU's UUID.
    fn inject_xid(&self, node: &str, gpu: u8, xid: u32) -> Result<String, BackendError>;
    /// The node goes away now, with what ran there, and comes back after `down_for` (a
    /// simulated driver upgrade's reboot). Must be called inside a Tokio runtime.
    fn reboot(&self, node: &str, down_for: Duration) -> Result<(), BackendError>;
}

/// A piece of a workload's log ([`Backend::read_logs`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogChunk {
    pub bytes: Vec<u8>,
    /// Where the next read starts.
    pub next_offset: u64,
    /// True when the workload has ended and `next_offset` is the end of its log: nothing more
    /// will be written.
    pub done: bool,
}
