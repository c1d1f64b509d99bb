//! How the rest of the control plane talks to the lifecycle loop: the [`Lifecycle`] handle,
//! the commands it sends, and the typed answers. Writes go through the loop; reads come from
//! what it publishes ([`Published`]).

use std::sync::{Arc, RwLock};

use tessera_backend::{BackendError, BackendEvent, PartitionReport, ReconcileReport};
use tessera_domain::{Reason, Workload, WorkloadId, WorkloadSpec};
use tessera_model::Request;
use tessera_sched::cycle::Quota;
use tessera_store::GpuMigRecord;
use tokio::sync::{mpsc, oneshot};

use super::fleetswap::FleetCell;
use super::snapshot::{Published, Snapshot, Trial};

/// A validated creation request.
pub struct NewWorkload {
    pub spec: WorkloadSpec,
    /// The engine request, resolved against the fleet the caller read (the loop resolves the
    /// spec again against its own fleet, which may be newer or older).
    pub request: Request,
    /// Token id or OIDC subject of the caller.
    pub actor: String,
    /// The caller's role, for the `authorised` step.
    pub role: String,
    /// Idempotency key and request hash.
    pub idempotency: Option<(String, String)>,
    /// When the API received it, ms since the epoch.
    pub received_at: i64,
    /// The audit record of the request, committed with the workload (its outcome is set to
    /// 201, or 200 for an idempotent replay).
    pub audit: Option<tessera_store::AuditRecord>,
}

/// A change to a tenant's quota or budget (already stored by the caller).
pub enum Governance {
    Quota {
        tenant: String,
        class: String,
        quota: Option<Quota>,
    },
    Budget {
        tenant: String,
        unit_hours: Option<f64>,
    },
}

/// Why the loop did not do what it was asked.
#[derive(Clone, Debug, PartialEq)]
pub enum LifecycleError {
    /// The request can never be placed, or is over a limit or budget and asked not to wait.
    Refused {
        reason: Reason,
        /// For constraints: the request field at fault.
        field: Option<&'static str>,
        /// The sentence to show next to that field (the reason without its class).
        message: String,
    },
    /// The idempotency key was used with another request.
    IdempotencyMismatch { key: String },
    /// The workload has already ended.
    Ended { id: WorkloadId },
    /// No such workload.
    NotFound { id: WorkloadId },
    /// The request conflicts with the current state (e.g. maintenance on a busy node).
    Conflict(String),
    /// The store or the loop cannot take changes now; nothing was changed.
    Unavailable(String),
    /// An admin's MIG mode change was refused, and why.
    Mig(MigRefusal, String),
}

impl std::fmt::Display for LifecycleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LifecycleError::Refused { reason, .. } => reason.fmt(f),
            LifecycleError::IdempotencyMismatch { key } => {
                write!(
                    f,
                    "Idempotency-Key `{key}` was already used with a different request body"
                )
            }
            LifecycleError::Ended { id } => write!(f, "workload {id} has already ended"),
            LifecycleError::NotFound { id } => write!(f, "no workload {id}"),
            LifecycleError::Unavailable(why) | LifecycleError::Conflict(why) | LifecycleError::Mig(_, why) => {
                f.write_str(why)
            }
        }
    }
}

pub type Reply<T> = oneshot::Sender<Result<T, LifecycleError>>;

/// What the loop can be told.
pub enum Cmd {
    Create(Box<NewWorkload>, Reply<(Arc<Workload>, bool)>),
    Cancel {
        id: WorkloadId,
        actor: String,
        reply: Reply<Arc<Workload>>,
    },
    Govern(Governance, Reply<()>),
    /// News from the backend.
    Backend(BackendEvent),
    /// A backend operation the loop started has finished.
    Done(WorkloadId, OpResult),
    /// A platform admin cordons, drains, puts into maintenance or uncordons a node (the
    /// request is audited by the HTTP layer).
    NodeOp {
        node: String,
        op: NodeOp,
        actor: String,
        reply: Reply<()>,
    },
    /// A platform admin puts an unhealthy GPU back into placement; the audit record commits
    /// with the change.
    ClearGpu {
        node: String,
        gpu: u8,
        audit: Box<tessera_store::AuditRecord>,
        reply: Reply<()>,
    },
    /// A platform admin switches a GPU's MIG mode; the audit record commits with the change.
    SetMigMode {
        node: String,
        gpu: u8,
        enabled: bool,
        audit: Box<tessera_store::AuditRecord>,
        reply: Reply<MigOutcome>,
    },
    /// A platform admin starts a rolling upgrade of a pool (audited by the HTTP layer).
    StartRollout {
        spec: NewRollout,
        actor: String,
        reply: Reply<tessera_store::RolloutRecord>,
    },
    /// A platform admin cancels a running rollout.
    CancelRollout {
        id: u64,
        actor: String,
        reply: Reply<tessera_store::RolloutRecord>,
    },
    /// A periodic reconcile came back.
    Reconciled(Reconciled),
    /// A dry run asks for the placement engine and holds as they are now (the published
    /// snapshot's copy was older than that snapshot).
    Trial(Reply<Arc<Trial>>),
    /// A dry run of a gang asks when it would take capacity from running work if submitted
    /// now ([`Lifecycle::gang_forecast`]).
    GangForecast(Box<tessera_sched::cycle::Job>, Reply<Forecast>),
    /// Where the loop is (for a test that steps a paused clock, see [`Lifecycle::settled`]).
    Settle(Reply<Settled>),
}

/// When a gang not yet submitted would take capacity from running work, by reclaim or by
/// priority, as its queue reason will say once it waits
/// ([`Scheduler::new_gang_forecast`](tessera_sched::cycle::Scheduler::new_gang_forecast)).
#[derive(Clone, Debug, PartialEq)]
pub struct GangForecast {
    pub cause: tessera_sched::reason::PreemptCause,
    /// When, ms since the epoch.
    pub at_ms: i64,
    /// How long from the loop's time of asking, in ms.
    pub in_ms: i64,
}

/// The loop's answer to a dry run's [`Cmd::GangForecast`].
#[derive(Clone, Debug, PartialEq)]
pub enum Forecast {
    /// It would take capacity then.
    Takes(GangForecast),
    /// Neither reclaim nor its priority would take capacity for it: it waits for running work
    /// to end.
    Never,
    /// Not known: the loop's budget of forecasts for this second is spent
    /// ([`FORECASTS_PER_S`](super::FORECASTS_PER_S)), or no loop runs here.
    Unknown,
}

/// Where the loop is when it answers a [`Cmd::Settle`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settled {
    /// Commands (other than [`Cmd::Settle`]) and timer wake-ups the loop has handled so far.
    pub work: u64,
    /// Backend operations started and not yet reported back (queued ones included).
    pub backend_ops: usize,
}

/// How many rounds [`Lifecycle::settled`] asks before it gives up on a loop that keeps working.
const SETTLE_ROUNDS: usize = 10_000;

/// What a periodic reconcile brought back: the backend's report (or why it failed), and the
/// phase each workload it asked about had when it asked.
pub struct Reconciled {
    pub report: Result<ReconcileReport, String>,
    pub phases: Vec<(WorkloadId, tessera_domain::Phase)>,
}

/// The handle HTTP handlers use. It outlives loops: a replica that becomes the leader starts
/// one ([`Lifecycle::lead`]) and loses it when it steps down; readers
/// read what was last published either way.
#[derive(Clone)]
pub struct Lifecycle {
    /// The running loop's commands; `None` while this replica does not lead.
    pub(crate) tx: Arc<RwLock<Option<mpsc::Sender<Cmd>>>>,
    pub(crate) published: Arc<Published>,
    /// The fleet the backend last reported (see [`FleetCell`]).
    pub(crate) fleet: FleetCell,
}

fn stopped() -> LifecycleError {
    LifecycleError::Unavailable("this replica is not leading (the lifecycle loop has stopped); retry shortly".into())
}

impl Lifecycle {
    /// A handle without a loop: it publishes an empty snapshot of `fleet` until a loop or a
    /// follower's refresh publishes another.
    pub fn new(fleet: Arc<tessera_model::Fleet>) -> Lifecycle {
        Lifecycle {
            tx: Arc::default(),
            published: Arc::new(Published::new(fleet.clone())),
            fleet: FleetCell::new(fleet),
        }
    }

    /// The fleet as the backend last reported it: the one given at start until a backend that
    /// discovers its nodes reports another. Requests are checked against it; what the loop has
    /// placed is in the published snapshot, whose fleet follows this one once the loop adopts it.
    pub fn fleet(&self) -> Arc<tessera_model::Fleet> {
        self.fleet.get()
    }

    /// The shared cell behind [`Lifecycle::fleet`].
    pub fn fleet_cell(&self) -> &FleetCell {
        &self.fleet
    }

    /// The running loop's sender, if any.
    pub(crate) fn sender(&self) -> Option<mpsc::Sender<Cmd>> {
        self.tx.read().expect("lock").clone()
    }

    /// Whether a loop runs behind this handle (this replica leads).
    pub fn is_leading(&self) -> bool {
        self.tx.read().expect("lock").is_some()
    }

    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Cmd) -> Result<T, LifecycleError> {
        let sender = self.sender().ok_or_else(stopped)?;
        let (tx, rx) = oneshot::channel();
        sender.send(make(tx)).await.map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }

    /// Submits a workload: the answer comes once it is durable (`true`: created now; `false`:
    /// the workload an idempotent retry refers to).
    pub async fn create(&self, nw: NewWorkload) -> Result<(Arc<Workload>, bool), LifecycleError> {
        self.ask(|r| Cmd::Create(Box::new(nw), r)).await
    }

    /// Cancels a workload: at once when it waits, by stopping it when it holds capacity.
    pub async fn cancel(&self, id: WorkloadId, actor: String) -> Result<Arc<Workload>, LifecycleError> {
        self.ask(|reply| Cmd::Cancel { id, actor, reply }).await
    }

    /// Applies a quota or budget change the caller has stored.
    pub async fn govern(&self, g: Governance) -> Result<(), LifecycleError> {
        self.ask(|r| Cmd::Govern(g, r)).await
    }

    /// Cordons, drains, puts into maintenance or uncordons a node (the caller checked that it
    /// exists).
    pub async fn node_op(&self, node: String, op: NodeOp, actor: String) -> Result<(), LifecycleError> {
        self.ask(|reply| Cmd::NodeOp { node, op, actor, reply }).await
    }

    /// Puts an unhealthy GPU back into placement (the caller checked that it exists).
    pub async fn clear_gpu(
        &self,
        node: String,
        gpu: u8,
        audit: tessera_store::AuditRecord,
    ) -> Result<(), LifecycleError> {
        self.ask(|reply| Cmd::ClearGpu {
            node,
            gpu,
            audit: Box::new(audit),
            reply,
        })
        .await
    }

    /// Switches a GPU's MIG mode (the caller checked that the GPU exists).
    pub async fn set_mig_mode(
        &self,
        node: String,
        gpu: u8,
        enabled: bool,
        audit: tessera_store::AuditRecord,
    ) -> Result<MigOutcome, LifecycleError> {
        self.ask(|reply| Cmd::SetMigMode {
            node,
            gpu,
            enabled,
            audit: Box::new(audit),
            reply,
        })
        .await
    }

    /// Starts a rolling upgrade of a pool (the caller checked that it exists); the answer is
    /// the stored rollout, its nodes in plan order.
    pub async fn start_rollout(
        &self,
        spec: NewRollout,
        actor: String,
    ) -> Result<tessera_store::RolloutRecord, LifecycleError> {
        self.ask(|reply| Cmd::StartRollout { spec, actor, reply }).await
    }

    /// Cancels a running rollout: no more nodes are taken.
    pub async fn cancel_rollout(&self, id: u64, actor: String) -> Result<tessera_store::RolloutRecord, LifecycleError> {
        self.ask(|reply| Cmd::CancelRollout { id, actor, reply }).await
    }

    /// The latest published snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.published.snapshot()
    }

    /// Waits until the loop has nothing left to do at this instant: two [`Cmd::Settle`] in a
    /// row, the runtime's other tasks given a chance to run before each, with no backend
    /// operation in flight and nothing handled between them (the second comes in a later pass
    /// of the loop than the first, so whatever came before the first is committed). For a test
    /// on a paused Tokio clock that it steps: what the timers that fired started has then run
    /// to its end, however long that took in wall time, before the clock moves on. On a
    /// running clock there may be no such instant: after [`SETTLE_ROUNDS`] rounds it gives up
    /// (`Conflict`).
    pub async fn settled(&self) -> Result<(), LifecycleError> {
        for _ in 0..SETTLE_ROUNDS {
            yield_a_while().await;
            let first = self.ask(Cmd::Settle).await?;
            yield_a_while().await;
            let second = self.ask(Cmd::Settle).await?;
            if first.backend_ops == 0 && second.backend_ops == 0 && second.work == first.work {
                return Ok(());
            }
        }
        Err(LifecycleError::Conflict(format!(
            "the lifecycle loop kept working through {SETTLE_ROUNDS} rounds"
        )))
    }

    /// The latest published snapshot, with a placement engine and holds at least as new as
    /// it, for dry runs: when its copy is older ([`Snapshot::trial_current`]), the loop is
    /// asked for a current one, so that a dry run never answers from a state older than the
    /// workload records its caller has read. Without a loop (a replica that does not lead),
    /// the published snapshot as it is.
    pub async fn trial_snapshot(&self) -> Arc<Snapshot> {
        let snap = self.snapshot();
        if snap.trial_current {
            return snap;
        }
        match self.ask(Cmd::Trial).await {
            Ok(trial) => Arc::new(Snapshot {
                trial: Some(trial),
                trial_current: true,
                ..(*snap).clone()
            }),
            Err(_) => snap,
        }
    }

    /// When gang job `job` (a dry run's, not submitted; its id one no workload has) would take
    /// capacity from running work if submitted now and finding no room: asked of the loop's
    /// scheduler at the loop's time, so the words its queue reason will give; at most
    /// [`FORECASTS_PER_S`](super::FORECASTS_PER_S) a second, so that dry runs cannot keep the
    /// loop from its work ([`Forecast::Unknown`] beyond, and without a loop: a replica that
    /// does not lead).
    pub async fn gang_forecast(&self, job: tessera_sched::cycle::Job) -> Forecast {
        self.ask(|r| Cmd::GangForecast(Box::new(job), r))
            .await
            .unwrap_or(Forecast::Unknown)
    }

    /// A live or recently ended workload, as last committed by this replica's loop; `None`
    /// when this replica does not lead (its memory may be behind: read the store).
    pub fn workload(&self, id: WorkloadId) -> Option<Arc<Workload>> {
        if !self.is_leading() {
            return None;
        }
        self.published.workload(id)
    }

    pub fn published(&self) -> &Arc<Published> {
        &self.published
    }
}

/// What an admin asks of a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeOp {
    Cordon,
    /// `deadline_ms`: when the drain's policy applies (ms since the epoch); `preempt`: stop
    /// what is left then, else keep waiting.
    Drain {
        deadline_ms: Option<i64>,
        preempt: bool,
    },
    Maintenance,
    Uncordon,
    /// The external hook of a rolling upgrade: the upgrade of this node is finished.
    UpgradeDone,
}

/// What an admin asks for a new rollout (validated by the caller; the pool exists).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewRollout {
    pub pool: String,
    pub max_parallel: u32,
    pub max_unavailable_milli: u64,
    pub deadline_s: Option<u64>,
    pub preempt: bool,
}

/// Why an admin's MIG mode change was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MigRefusal {
    /// The node is still in placement: cordon, drain or put it into maintenance first.
    NodeInPlacement,
    /// Work (or a partition) is on the GPU.
    GpuBusy,
    /// The backend cannot switch MIG mode (Kubernetes: the GPU Operator's MIG manager owns it).
    Unsupported,
    /// The GPU cannot serve both kinds here: its model has no MIG, or its pool is not a mig
    /// pool.
    NotMigCapable,
    /// The backend refused the change (the driver says the GPU is in use, …).
    BackendRefused,
}

impl MigRefusal {
    /// The problem type's code.
    pub fn code(self) -> &'static str {
        match self {
            MigRefusal::NodeInPlacement => "node-in-placement",
            MigRefusal::GpuBusy => "gpu-busy",
            MigRefusal::Unsupported => "mig-mode-unsupported",
            MigRefusal::NotMigCapable => "not-mig-capable",
            MigRefusal::BackendRefused => "backend-refused",
        }
    }

    /// Whether the refusal depends on the current state (409) or never changes (422).
    pub fn is_state(self) -> bool {
        matches!(
            self,
            MigRefusal::NodeInPlacement | MigRefusal::GpuBusy | MigRefusal::BackendRefused
        )
    }
}

/// The outcome of an admin's MIG mode change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigOutcome {
    pub record: GpuMigRecord,
    /// `false` when the GPU was in that mode already (nothing changed, nothing stored).
    pub changed: bool,
}

/// What a backend operation came to (reported back to the loop as [`Cmd::Done`]).
#[derive(Debug)]
pub enum OpResult {
    Partitioned(Result<PartitionReport, BackendError>),
    Started(Result<(), BackendError>),
    Stopped(Result<(), BackendError>),
    Unpartitioned(Result<(), BackendError>),
}

/// Lets the runtime's other ready tasks run (a task woken by a timer, a forwarder relaying a
/// backend event) before [`Lifecycle::settled`] asks the loop.
async fn yield_a_while() {
    for _ in 0..32 {
        tokio::task::yield_now().await;
    }
}
