//! The lifecycle loop: one task owns the scheduler (queue, quotas, preemption, the placement
//! engine) and every live workload, and walks each request through its steps — requested →
//! authorised → placed → partitioned → running → observed → metered → released.
//!
//! What happens to a workload is decided by the pure [`tessera_domain::transition`]; this
//! loop only batches, commits, answers and executes:
//!
//! * commands (API calls, backend events and the results of backend operations) arrive on a
//!   channel and are handled in batches; scheduler actions and backend news become lifecycle
//!   inputs ([`apply`](Core::apply));
//! * the batch's records, events and usage intervals are committed in one store transaction
//!   ([`commit`]), and only then are callers answered, what readers see published
//!   ([`snapshot`]) and backend work started ([`effects`]). If a commit fails, memory is rebuilt
//!   from the store ([`recover`]), so memory never runs ahead of what is durable;
//! * at start-up the same rebuild re-applies allocations (double booking is refused) and asks
//!   the backend what it runs; a periodic, level-triggered reconcile finds workloads the
//!   backend lost (ghosts) and work it runs that Tessera does not know (orphans).

mod command;
mod commit;
mod consolidation;
pub mod effects;
mod fleetswap;
mod follower;
mod health;
mod metering;
mod migmode;
mod nodeops;
pub mod placement;
mod recover;
mod rollout;
pub mod snapshot;

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_backend::{
    Backend, BackendEvent, Capabilities, DeviceAssignment, Exit, GpuSample, MigInstance, PartitionPlan, Partitioning,
};
use tessera_domain::{Input, Observed, Phase, Reason, Step, Workload, WorkloadId, transition_shared};
use tessera_model::request::GangRequest;
use tessera_model::{Fleet, Request, TenantId};
use tessera_sched::cycle::{Decision, Job, Scheduler};
use tessera_sched::engine::DeviceBinding;
use tessera_sched::engine::share_id;
use tessera_sched::mig::MigMode;
use tessera_sched::reason::Refusal;
use tessera_store::{Change, Fence, Store, UsageInterval};
use tokio::sync::mpsc;

pub use command::{Cmd, Governance, Lifecycle, LifecycleError, NewWorkload};
use commit::{Batch, ReplyTo};
use effects::{Op, OpResult, Runner};
pub use fleetswap::FleetCell;
pub use health::{CRITICAL_XIDS, FleetOps, GpuFailurePolicy, is_critical};
use metering::MonthBook;
pub use migmode::{MigOutcome, MigRefusal};
pub use nodeops::NodeOp;
use placement::NodeIndex;
pub use rollout::{NewRollout, VALIDATE_WITHIN_MS};
use snapshot::SnapshotBuilder;
pub use snapshot::{GpuSnap, HolderSnap, NodeSnap, Published, Snapshot, Telemetry, TenantSnap, Trial};

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

/// Shortest interval between two full scheduling passes triggered by changes.
const CYCLE_EVERY: Duration = Duration::from_millis(50);
/// A batch holding creations that wait for a cycle runs one at once, rather than up to
/// [`CYCLE_EVERY`] later, if at least this many times the last cycle's cost has passed since
/// it: cycles then take at most about a tenth of the loop's time, and a creation is answered
/// in the batch it came in whenever cycles are cheap (a short queue).
const CYCLE_COST: u32 = 10;
/// Shortest interval between two publications of the queue and phase counts while they
/// change (they are published every second regardless).
const QUEUE_PUBLISH_EVERY: Duration = Duration::from_millis(50);
/// A full publication walks every live workload (100,000 and more on a large fleet): while
/// the queue changes, the next one waits at least this many times as long as the last one
/// took, so that publishing takes at most about a tenth of the loop's time.
const QUEUE_PUBLISH_COST: u32 = 10;
/// Workload ids reserved from the store at a time.
const ID_BLOCK: u32 = 1024;
/// At most this many commands per batch.
const BATCH_MAX: usize = 1024;

/// A live (non-terminal) workload and what the loop keeps beside its record.
pub(crate) struct Live {
    /// Its record, shared with the batch that stores it and the published cache that serves
    /// reads (a transition makes a new one).
    pub w: Arc<Workload>,
    /// Its request, resolved against the fleet (for a multi-node gang: one of its node-shares).
    pub request: Request,
    /// A multi-node gang's request, resolved against the fleet.
    pub gang: Option<GangRequest>,
    /// The resource class it waits for: its pool when only one can serve it, else `any`.
    pub class: Arc<str>,
    /// Measured utilisation since its usage interval opened: Σ util × ms, and the ms sampled.
    pub util: (f64, f64),
}

impl Live {
    pub fn utilisation(&self) -> Option<f64> {
        (self.util.1 > 0.0).then(|| self.util.0 / self.util.1)
    }

    /// A new workload with this one's spec and request, submitted by the control plane itself
    /// (a service moved by a drain or by consolidation: the replacement starts first).
    fn replacement(&self, actor: String, now: i64) -> NewWorkload {
        NewWorkload {
            spec: self.w.spec.clone(),
            request: self.request.clone(),
            actor,
            role: "platform-admin".into(),
            idempotency: None,
            received_at: now,
            audit: None,
        }
    }

    fn job(&self) -> Job {
        Job {
            id: self.w.id.0,
            tenant: self.w.spec.tenant.clone(),
            project: self.w.spec.project.clone(),
            request: self.request.clone(),
            priority: self.w.spec.priority.clone(),
            submitted_ms: self.w.created_at,
            wait_if_over_limit: !self.w.spec.no_wait,
            min_runtime_ms: None,
            movable: self.w.spec.movable.map(|m| match m {
                tessera_domain::Movable::Restart => tessera_sched::cycle::Movable::Restart,
                tessera_domain::Movable::Replace => tessera_sched::cycle::Movable::Replace,
            }),
            gang: self.gang.clone(),
            duration_ms: self.w.spec.duration_s.map(|d| (d as i64).saturating_mul(1000)),
        }
    }

    /// Gives the scheduler back the capacity its record says it holds (start-up, failover, a
    /// follower's view): every node-share of a gang, or its one allocation.
    fn restore_into(
        &self,
        sched: &mut Scheduler,
        fleet: &Fleet,
        nodes: &NodeIndex,
        tenant: TenantId,
    ) -> Result<(), String> {
        let w = &self.w;
        let first = w
            .placement
            .as_ref()
            .ok_or_else(|| "no placement recorded".to_string())?;
        let host = (w.spec.cpu_milli, w.spec.memory_mib);
        let since = w.running_at.unwrap_or(w.created_at);
        if self.gang.is_none() {
            let a = placement::allocation_of(fleet, nodes, w.id.0, first, host, tenant)?;
            return sched.restore(&self.job(), a, w.borrowing, since);
        }
        let pool = fleet
            .pool_by_name(&first.pool)
            .ok_or_else(|| format!("pool {} is not in the fleet", first.pool))?;
        let shares = w
            .placements()
            .enumerate()
            .map(|(i, p)| placement::allocation_of(fleet, nodes, share_id(w.id.0, i), p, host, tenant))
            .collect::<Result<Vec<_>, _>>()?;
        sched.restore_gang(&self.job(), pool, shares, w.borrowing, since)
    }
}

/// The API's name of the field a gang refusal is about.
fn gang_field(u: &tessera_sched::GangUnplaceable) -> &'static str {
    match u {
        tessera_sched::GangUnplaceable::Invalid { field, .. } => placement::gang_field(field),
        tessera_sched::GangUnplaceable::UnknownLevel { .. } | tessera_sched::GangUnplaceable::PoolLacksLevel { .. } => {
            "shape.topology"
        }
        tessera_sched::GangUnplaceable::PoolCannotServe { .. } => "shape.pool",
        tessera_sched::GangUnplaceable::NoEligibleNode { .. } => "shape.models",
        _ => "shape.gpus",
    }
}

/// Milliseconds since the Unix epoch.
fn now_ms() -> i64 {
    crate::clock::now_ms()
}

/// The loop's state.
pub(crate) struct Core {
    fleet: Arc<Fleet>,
    nodes: Arc<NodeIndex>,
    sched: Scheduler,
    factory: SchedFactory,
    store: Arc<dyn Store>,
    backend: Arc<dyn Backend>,
    caps: Capabilities,
    live: HashMap<WorkloadId, Live>,
    /// The engine's numbers for tenant names.
    tenants: HashMap<String, TenantId>,
    /// Workload ids reserved from the store and not yet used.
    ids: Range<u64>,
    settings: Settings,
    month: MonthBook,
    runner: Runner,
    published: Arc<Published>,
    builder: SnapshotBuilder,
    metrics: Arc<Metrics>,
    /// When telemetry was last sampled into the utilisation of running work.
    last_sample: i64,
    /// A periodic reconcile is in flight.
    reconciling: bool,
    /// When queue and phase counts were last published.
    last_full_publish: Instant,
    /// How long building that full snapshot took.
    last_full_build: Duration,
    /// The queue or the phases changed since they were last published.
    queue_dirty: bool,
    /// Reconcile at the next opportunity rather than at the next interval.
    reconcile_soon: bool,
    /// Nodes the backend reports closed to new work, by name: (cordoned or tainted, not
    /// ready). Fenced in the engine whatever Tessera's own node state says.
    closed: std::collections::HashMap<String, (bool, bool)>,
    /// Per GPU, the MIG instances the backend last reported (reconcile, a layout applied) and
    /// when: an upgraded node's validation compares them with the engine's layout.
    reported_mig: HashMap<(String, u8), (i64, Vec<MigInstance>)>,
    /// When the reconcile in flight was asked for.
    reconcile_asked: i64,
    /// The orphans the last periodic reconcile reported (by their description): each is
    /// audited once, when first seen, not at every interval.
    orphans_seen: std::collections::HashSet<String>,
    /// Telemetry arrived while a rollout runs: its drains and steps are taken after this batch
    /// rather than at the next tick (a node that emptied or came back from its upgrade moves on
    /// within one telemetry interval).
    rollout_soon: bool,
    /// Creations answered after the next cycle decides them (they were submitted while
    /// capacity was changing).
    deferred: Vec<ReplyTo>,
    /// The leader's fence, carried by every batch (`None`: the only process on its store).
    fence: Option<Fence>,
    /// A batch was fenced: another replica leads, this loop must stop.
    fenced: bool,
    /// Unhealthy GPUs and node states (what readers see is published from here).
    ops: Arc<FleetOps>,
    /// Unhealthy GPUs not yet written to the store.
    health_writes: Vec<tessera_store::GpuHealthRecord>,
    /// Drains in progress and services being moved.
    drains: nodeops::Drains,
    /// Services being moved by consolidation.
    moves: consolidation::Moves,
    /// A fleet the backend reported, adopted once the batch it came in is committed.
    pending_fleet: Option<Arc<Fleet>>,
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

/// Rebuilds the loop's state from the store, reconciles with the backend and starts the loop,
/// unfenced, for the life of the runtime (one process on its own store).
pub async fn start(
    fleet: Arc<Fleet>,
    factory: SchedFactory,
    store: Arc<dyn Store>,
    backend: Arc<dyn Backend>,
    settings: Settings,
    metrics: Arc<Metrics>,
) -> Result<Lifecycle, String> {
    let lc = Lifecycle::new(fleet);
    let cfg = LoopConfig {
        factory,
        store,
        backend,
        settings,
        metrics,
    };
    if let Some(events) = cfg.backend.take_events() {
        lc.forward_backend_events(events, None);
    }
    lc.lead(&cfg, None).await?.detach();
    Ok(lc)
}

/// A loop this replica runs as the leader. Dropping it stops the loop at once: its task and
/// the backend operations it has in flight are aborted, and the [`Lifecycle`] refuses changes
/// until another loop starts.
pub struct Leading {
    task: Option<tokio::task::JoinHandle<()>>,
    slot: Arc<std::sync::RwLock<Option<mpsc::Sender<Cmd>>>>,
}

impl Leading {
    /// Whether the loop has stopped by itself (its batch was fenced: another replica leads).
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Lets the loop run on without this handle (it then runs as long as the runtime).
    pub fn detach(mut self) {
        self.task = None;
        std::mem::forget(self);
    }
}

impl Drop for Leading {
    fn drop(&mut self) {
        *self.slot.write().expect("lock") = None;
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

impl Lifecycle {
    /// Sends the backend's events to whichever loop runs (none are kept while none does: a
    /// loop that starts reconciles with the backend first), and native submissions to
    /// `native` (the intake of [`crate::native`], which checks them as the API does; without
    /// one they are dropped).
    pub fn forward_backend_events(
        &self,
        mut events: tokio::sync::mpsc::UnboundedReceiver<BackendEvent>,
        native: Option<tokio::sync::mpsc::UnboundedSender<(tessera_backend::NativeRef, tessera_backend::NativeAsk)>>,
    ) {
        let slot = self.tx.clone();
        let fleet = self.fleet.clone();
        tokio::spawn(async move {
            while let Some(e) = events.recv().await {
                if let BackendEvent::Submitted { native: object, ask } = e {
                    match &native {
                        Some(intake) => {
                            let _ = intake.send((object, *ask));
                        }
                        None => tracing::warn!(namespace = %object.namespace, pod = %object.name,
                            "a native workload was submitted, but this server takes none in"),
                    }
                    continue;
                }
                // The fleet is followed whether a loop runs or not: a loop started later, a
                // follower's view and the API read it from here.
                if let BackendEvent::FleetChanged { fleet: f } = &e {
                    fleet.set(f.clone());
                }
                let tx = slot.read().expect("lock").clone();
                if let Some(tx) = tx {
                    let _ = tx.send(Cmd::Backend(e)).await;
                }
            }
        });
    }

    /// Rebuilds the state from the store, reconciles with the backend and starts a loop behind
    /// this handle. With a `fence`, every batch the loop commits carries it: once another
    /// replica holds the lease, the store refuses the batch and the loop stops.
    pub async fn lead(&self, cfg: &LoopConfig, fence: Option<Fence>) -> Result<Leading, String> {
        let (tx, rx) = mpsc::channel(8192);
        let fleet = self.fleet.get();
        let mut core = Core {
            nodes: Arc::new(NodeIndex::new(&fleet)),
            builder: SnapshotBuilder::new(&fleet),
            sched: (cfg.factory)(fleet.clone()),
            factory: cfg.factory.clone(),
            caps: cfg.backend.capabilities(),
            runner: Runner::new(cfg.backend.clone(), tx.clone(), cfg.metrics.clone()),
            fleet,
            store: cfg.store.clone(),
            backend: cfg.backend.clone(),
            live: HashMap::new(),
            tenants: HashMap::new(),
            ids: 0..0,
            settings: cfg.settings.clone(),
            month: MonthBook::default(),
            published: self.published.clone(),
            metrics: cfg.metrics.clone(),
            last_sample: now_ms(),
            reconciling: false,
            last_full_publish: Instant::now(),
            last_full_build: Duration::ZERO,
            queue_dirty: false,
            reconcile_soon: false,
            closed: Default::default(),
            reported_mig: HashMap::new(),
            reconcile_asked: 0,
            orphans_seen: Default::default(),
            rollout_soon: false,
            deferred: Vec::new(),
            fence,
            fenced: false,
            ops: Arc::default(),
            health_writes: Vec::new(),
            drains: nodeops::Drains::default(),
            moves: consolidation::Moves::default(),
            pending_fleet: None,
        };
        core.recover()
            .await
            .map_err(|e| format!("rebuilding state from the store: {e}"))?;
        let reconcile_every = core.settings.reconcile_every;
        *self.tx.write().expect("lock") = Some(tx.clone());
        let task = tokio::spawn(core.run(rx, tx, reconcile_every));
        Ok(Leading {
            task: Some(task),
            slot: self.tx.clone(),
        })
    }
}

impl Core {
    /// A new scheduler whose engine honours the backend's capabilities.
    fn fresh_scheduler(&self) -> Scheduler {
        fresh_scheduler(&self.factory, self.fleet.clone(), &self.caps)
    }

    fn tenant_id(&mut self, name: &str) -> TenantId {
        let n = self.tenants.len() as u32;
        *self.tenants.entry(name.to_string()).or_insert(TenantId(n))
    }

    /// The resource class a request waits for: its pool when only one pool can serve it.
    /// The shortest interval between two full publications while the queue changes:
    /// [`QUEUE_PUBLISH_EVERY`], or longer where building one takes long.
    fn queue_publish_every(&self) -> Duration {
        QUEUE_PUBLISH_EVERY.max(self.last_full_build * QUEUE_PUBLISH_COST)
    }

    fn class_of(&self, r: &Request) -> String {
        class_of(&self.fleet, &self.sched, r)
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Cmd>, tx: mpsc::Sender<Cmd>, reconcile_every: Duration) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reconcile = tokio::time::interval_at(tokio::time::Instant::now() + reconcile_every, reconcile_every);
        reconcile.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_cycle = Instant::now() - CYCLE_EVERY;
        let mut cycle_cost = Duration::ZERO;
        loop {
            let pending_cycle = self.sched.needs_cycle();
            // Callers wait for the next cycle: it comes as soon as its cost allows.
            let every = if self.deferred.is_empty() {
                CYCLE_EVERY
            } else {
                (cycle_cost * CYCLE_COST).min(CYCLE_EVERY)
            };
            let wait = if pending_cycle {
                every.saturating_sub(last_cycle.elapsed())
            } else {
                self.queue_publish_every()
                    .saturating_sub(self.last_full_publish.elapsed())
            };
            let (first, ticked) = tokio::select! {
                c = rx.recv() => match c { Some(c) => (Some(c), false), None => break },
                _ = tick.tick() => (None, true),
                _ = reconcile.tick() => {
                    self.start_reconcile(tx.clone());
                    continue;
                }
                _ = tokio::time::sleep(wait), if pending_cycle || self.queue_dirty => (None, false),
            };
            let mut batch = Batch::default();
            let mut next = first;
            let mut n = 0;
            // Each command is handled at its own time: a batch of many commands (or one that
            // waited on the store) must not stamp later decisions with the batch's start, which
            // could be before the request arrived or before the capacity it takes was freed.
            while let Some(cmd) = next.take() {
                self.handle(cmd, &mut batch, now_ms()).await;
                n += 1;
                if n >= BATCH_MAX {
                    break;
                }
                next = rx.try_recv().ok();
            }
            let now = now_ms();
            if ticked {
                if let Err(e) = self.month.refresh(&*self.store, now).await {
                    tracing::warn!(error = %e, "cannot refresh this month's usage");
                }
                self.update_budgets(now);
                batch.full_publish = true;
                if !self.drains.nodes.is_empty() {
                    self.drain_step(&mut batch, now).await;
                }
                self.rollouts_step(&mut batch, now).await;
            } else if std::mem::take(&mut self.rollout_soon) {
                if !self.drains.nodes.is_empty() {
                    self.drain_step(&mut batch, now).await;
                }
                self.rollouts_step(&mut batch, now).await;
            }
            // A full pass over the queue when something changed (at most every CYCLE_EVERY, so
            // that a stream of completions cannot keep the loop re-sorting a long queue; sooner
            // when creations wait for it and cycles are cheap, see CYCLE_COST), and on the
            // tick: backfill windows, minimum runtimes and reclaim delays move with time.
            let every = if batch.undecided || !self.deferred.is_empty() {
                (cycle_cost * CYCLE_COST).min(CYCLE_EVERY)
            } else {
                CYCLE_EVERY
            };
            if ticked || (self.sched.needs_cycle() && last_cycle.elapsed() >= every) {
                // The steps above may have waited on the store: decisions take the time now.
                let now = now_ms();
                last_cycle = Instant::now();
                let actions = self.sched.cycle(now);
                cycle_cost = last_cycle.elapsed();
                self.metrics.scheduler_cycle(cycle_cost);
                for a in actions {
                    self.on_decision(a, now, &mut batch);
                }
                for r in std::mem::take(&mut self.deferred) {
                    batch.reply(r);
                }
            }
            if !self.moves.is_empty() {
                self.moves_step(&mut batch, now).await;
            }
            self.commit(batch, now).await;
            if !self.fenced
                && let Some(fleet) = self.pending_fleet.take()
            {
                self.adopt_fleet(fleet, now_ms()).await;
            }
            if self.fenced {
                tracing::warn!("a batch was fenced: another replica leads; this loop stops");
                break;
            }
            if std::mem::take(&mut self.reconcile_soon) {
                self.start_reconcile(tx.clone());
            }
        }
    }

    fn update_budgets(&mut self, now: i64) {
        let mut tenants: Vec<String> = self
            .live
            .values()
            .filter(|l| l.w.usage.open)
            .map(|l| l.w.spec.tenant.clone())
            .filter(|t| self.sched.budget(t).is_some())
            .collect();
        tenants.sort_unstable();
        tenants.dedup();
        for t in tenants {
            let spent = self.month.spent(&t, self.live.values().map(|l| &*l.w), now);
            self.sched.set_spent(&t, spent);
        }
    }

    async fn handle(&mut self, cmd: Cmd, batch: &mut Batch, now: i64) {
        match cmd {
            Cmd::Create(nw, reply) => match self.create(*nw, batch, now).await {
                Ok((id, created)) => batch.reply(ReplyTo::Created(reply, id, created)),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            Cmd::Cancel { id, actor, reply } => {
                if !self.live.contains_key(&id) {
                    let err = match self.published.workload(id) {
                        Some(_) => LifecycleError::Ended { id },
                        None => LifecycleError::NotFound { id },
                    };
                    let _ = reply.send(Err(err));
                    return;
                }
                let grace_s = self.settings.grace.as_secs();
                self.apply(
                    id,
                    Input::Cancel {
                        at: now,
                        by: actor,
                        grace_s,
                    },
                    batch,
                    now,
                );
                batch.reply(ReplyTo::Workload(reply, id));
            }
            Cmd::Govern(g, reply) => {
                match g {
                    Governance::Quota { tenant, class, quota } => self.sched.set_quota(&tenant, &class, quota),
                    Governance::Budget { tenant, unit_hours } => {
                        self.sched.set_budget(&tenant, unit_hours);
                        let spent = self.month.spent(&tenant, self.live.values().map(|l| &*l.w), now);
                        self.sched.set_spent(&tenant, spent);
                    }
                }
                batch.full_publish = true;
                batch.reply(ReplyTo::Done(reply));
            }
            Cmd::Backend(BackendEvent::GpuHealth {
                node,
                gpu,
                healthy,
                xid,
                detail,
            }) => {
                if healthy {
                    if self.ops.unhealthy.contains_key(&(node.clone(), gpu)) {
                        tracing::info!(%node, gpu, "the backend reports the GPU healthy again; it stays out of placement until a platform admin clears it");
                    }
                } else {
                    match xid {
                        Some(x) if health::is_critical(x) => {
                            self.gpu_failed(&node, gpu, health::Cause::Xid(x), &detail, batch, now)
                        }
                        Some(x) => tracing::warn!(%node, gpu, xid = x, %detail, "GPU reported a non-critical XID"),
                        None => self.gpu_failed(&node, gpu, health::Cause::Lost, &detail, batch, now),
                    }
                }
            }
            Cmd::Backend(BackendEvent::NodeChanged { node, change }) => {
                tracing::info!(%node, ?change, "node changed");
                match change {
                    tessera_backend::NodeChange::Removed => self.node_removed(&node, batch, now),
                    tessera_backend::NodeChange::Added => self.node_back(&node).await,
                    tessera_backend::NodeChange::Cordoned(on) => self.backend_closed(&node, Some(on), None),
                    tessera_backend::NodeChange::Ready(ready) => self.backend_closed(&node, None, Some(!ready)),
                    // The new capacity comes with the fleet the backend reports (`FleetChanged`).
                    tessera_backend::NodeChange::Capacity => {}
                }
            }
            Cmd::Backend(BackendEvent::FleetChanged { fleet }) => {
                // Adopted after this batch is committed; a later report supersedes it.
                self.pending_fleet = Some(fleet);
            }
            Cmd::Backend(BackendEvent::MigMode {
                node,
                gpu,
                enabled,
                pending,
            }) => self.backend_mig_mode(&node, gpu, enabled, pending, batch, now),
            Cmd::Backend(e) => self.on_backend(e, batch, now),
            Cmd::NodeOp { node, op, actor, reply } => match self.node_op(&node, op, &actor, batch, now).await {
                Ok(()) => {
                    batch.full_publish = true;
                    batch.reply(ReplyTo::Done(reply));
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            Cmd::SetMigMode {
                node,
                gpu,
                enabled,
                audit,
                reply,
            } => match self.set_mig_mode(&node, gpu, enabled, *audit, batch, now).await {
                Ok(o) if o.changed => {
                    batch.full_publish = true;
                    batch.reply(ReplyTo::Mig(reply, o));
                }
                Ok(o) => {
                    let _ = reply.send(Ok(o));
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            Cmd::StartRollout { spec, actor, reply } => match self.start_rollout(spec, &actor, batch, now).await {
                Ok(r) => {
                    batch.full_publish = true;
                    let _ = reply.send(Ok(r));
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            Cmd::CancelRollout { id, actor, reply } => {
                let _ = reply.send(self.cancel_rollout(id, &actor, now).await);
            }
            Cmd::ClearGpu {
                node,
                gpu,
                audit,
                reply,
            } => match self.clear_gpu(&node, gpu).await {
                Ok(cleared) => {
                    let mut audit = *audit;
                    audit.detail = if cleared {
                        format!("GPU {gpu} of {node} back in placement")
                    } else {
                        format!("GPU {gpu} of {node} was not unhealthy")
                    };
                    batch.audit(audit);
                    batch.full_publish = true;
                    batch.reply(ReplyTo::Done(reply));
                }
                Err(e) => {
                    let _ = reply.send(Err(LifecycleError::Unavailable(format!(
                        "the store is unavailable: {e}"
                    ))));
                }
            },
            Cmd::Done(id, result) => {
                self.runner.done(id);
                self.on_done(id, result, batch, now);
            }
            Cmd::Reconciled(report, expected) => {
                self.reconciling = false;
                self.on_reconciled(report, expected, batch, now);
            }
        }
        if !self.health_writes.is_empty() {
            self.flush_health().await;
        }
    }

    /// Accepts a new workload: records it with its `requested` and `authorised` steps and hands
    /// it to the scheduler. A request refused at once is answered with the refusal and nothing
    /// is stored.
    async fn create(
        &mut self,
        mut nw: NewWorkload,
        batch: &mut Batch,
        now: i64,
    ) -> Result<(WorkloadId, bool), LifecycleError> {
        let audit = nw.audit.take();
        let (id, created) = self.accept(nw, batch, now).await?;
        if let Some(mut r) = audit {
            r.outcome = if created { 201 } else { 200 };
            r.target = format!("{} (workload {id})", r.target);
            batch.audit(r);
        }
        Ok((id, created))
    }

    /// [`create`](Self::create) without the audit record.
    async fn accept(
        &mut self,
        nw: NewWorkload,
        batch: &mut Batch,
        now: i64,
    ) -> Result<(WorkloadId, bool), LifecycleError> {
        self.accept_as(nw, None, batch, now).await
    }

    /// [`accept`](Self::accept); `replacing`: the new workload is the replacement of that
    /// service, moved by consolidation, and takes the capacity the scheduler booked for it
    /// instead of queueing.
    async fn accept_as(
        &mut self,
        nw: NewWorkload,
        replacing: Option<WorkloadId>,
        batch: &mut Batch,
        now: i64,
    ) -> Result<(WorkloadId, bool), LifecycleError> {
        if let Some((key, hash)) = &nw.idempotency {
            let prior = match batch.idempotent(&nw.actor, key) {
                Some(p) => Some(p),
                None => self
                    .store
                    .idempotent(&nw.actor, key)
                    .await
                    .map_err(|e| LifecycleError::Unavailable(format!("the store is unavailable: {e}")))?,
            };
            if let Some((h, id)) = prior {
                if &h != hash {
                    return Err(LifecycleError::IdempotencyMismatch { key: key.clone() });
                }
                return Ok((id, false));
            }
        }
        if self.ids.is_empty() {
            self.ids = self
                .store
                .reserve_workload_ids(ID_BLOCK)
                .await
                .map_err(|e| LifecycleError::Unavailable(format!("the store is unavailable: {e}")))?;
        }
        let id = WorkloadId(self.ids.start);
        self.ids.start += 1;
        let tenant = self.tenant_id(&nw.spec.tenant);
        // Resolved again against the loop's own fleet: pools and models are numbered by the
        // fleet, and the caller may have read a newer (or older) one than the loop holds.
        let (request, gang) = match placement::resolve(&self.fleet, &nw.spec, tenant) {
            Ok(r) => r,
            Err(e) => {
                self.ids.start -= 1;
                return Err(LifecycleError::Conflict(format!("{}: {}", e.field, e.message)));
            }
        };
        // A gang asks for all its GPUs (`request` stands for one node-share).
        let units = gang
            .as_ref()
            .map_or_else(|| request.units(&self.fleet.catalogue), GangRequest::units);
        let mut w = Workload::new(id, nw.spec, units, nw.received_at);
        let events = vec![
            tessera_domain::Event {
                seq: 0,
                step: Step::Requested,
                at: nw.received_at,
                detail: format!(
                    "{} for {}/{} ({units} GPU units)",
                    w.spec.shape.gpu, w.spec.tenant, w.spec.project
                ),
                code: None,
            },
            tessera_domain::Event {
                seq: 1,
                step: Step::Authorised,
                at: now,
                detail: format!(
                    "{} token {} may create workloads in tenant {}; quota and budget checked",
                    nw.role, nw.actor, w.spec.tenant
                ),
                code: None,
            },
        ];
        w.next_seq = 2;
        if self.sched.budget(&w.spec.tenant).is_some() {
            let spent = self.month.spent(&w.spec.tenant, self.live.values().map(|l| &*l.w), now);
            self.sched.set_spent(&w.spec.tenant, spent);
        }
        let live = Live {
            class: self.class_of(&request).into(),
            request,
            gang,
            w: w.into(),
            util: (0.0, 0.0),
        };
        let job = live.job();
        self.live.insert(id, live);
        self.queue_dirty = true;
        // While capacity is changing, the next cycle (at most CYCLE_EVERY away) decides: a burst
        // of submissions then costs one pass over the queue, and freed capacity goes to the
        // queue in order. The caller's answer waits for that cycle.
        let actions = if let Some(old) = replacing {
            match self.sched.adopt_replacement(old.0, &job, now) {
                Some((alloc, borrowing)) => vec![Decision::Placed {
                    id: id.0,
                    alloc,
                    borrowing,
                }],
                None => {
                    self.live.remove(&id);
                    self.ids.start -= 1;
                    return Err(LifecycleError::Conflict(format!(
                        "no replacement of workload {old} is booked"
                    )));
                }
            }
        } else if self.sched.needs_cycle() {
            batch.undecided = true;
            self.sched
                .submit_for_next_cycle(job)
                .map(|reason| Decision::Refused { id: id.0, reason })
                .into_iter()
                .collect()
        } else {
            self.sched.submit(job, now)
        };
        let refusal = actions.iter().find_map(|a| match a {
            Decision::Refused { id: r, reason } if *r == id.0 => Some(reason.clone()),
            _ => None,
        });
        if let Some(refusal) = refusal {
            self.live.remove(&id);
            // The id was never used: the next request takes it.
            self.ids.start -= 1;
            let reason = Reason::refused(&refusal);
            self.metrics.refused(reason.code);
            for a in actions {
                if !matches!(&a, Decision::Refused { id: r, .. } if *r == id.0) {
                    self.on_decision(a, now, batch);
                }
            }
            let (field, message) = match &refusal {
                Refusal::Constraint(u) => (Some(u.field().as_str()), u.message()),
                Refusal::Gang(u) => (Some(gang_field(u)), u.message()),
                _ => (None, reason.detail.clone()),
            };
            return Err(LifecycleError::Refused { reason, field, message });
        }
        let l = &self.live[&id];
        self.metrics.step("authorise", now - l.w.created_at);
        batch.insert(
            l.w.clone(),
            events,
            nw.idempotency.map(|(key, request_hash)| tessera_store::IdempotencyKey {
                actor: nw.actor,
                key,
                request_hash,
            }),
        );
        for a in actions {
            self.on_decision(a, now, batch);
        }
        Ok((id, true))
    }

    /// Turns a scheduler decision into a lifecycle input.
    fn on_decision(&mut self, a: Decision, now: i64, batch: &mut Batch) {
        match a {
            Decision::Placed { id, alloc, borrowing } => {
                let wid = WorkloadId(id);
                let Some(l) = self.live.get(&wid) else {
                    tracing::error!(id, "placed a workload the loop does not know; releasing");
                    self.sched.release(id, now);
                    return;
                };
                self.metrics.step("place", now - l.w.created_at);
                let placement = placement::placement_of(&self.fleet, &alloc);
                self.apply(
                    wid,
                    Input::Placed {
                        at: now,
                        placement,
                        shares: Vec::new(),
                        borrowing,
                    },
                    batch,
                    now,
                );
            }
            Decision::PlacedGang { id, shares, borrowing } => {
                let wid = WorkloadId(id);
                let Some(l) = self.live.get(&wid) else {
                    tracing::error!(id, "placed a gang the loop does not know; releasing");
                    self.sched.release(id, now);
                    return;
                };
                self.metrics.step("place", now - l.w.created_at);
                let mut placements = shares.iter().map(|a| placement::placement_of(&self.fleet, a));
                let placement = placements.next().expect("a gang has a node-share");
                self.apply(
                    wid,
                    Input::Placed {
                        at: now,
                        placement,
                        shares: placements.collect(),
                        borrowing,
                    },
                    batch,
                    now,
                );
            }
            Decision::Waiting { id, reason } => {
                let reason = Reason::waiting(&reason);
                self.tell_native(WorkloadId(id), &reason, false);
                self.apply(WorkloadId(id), Input::Waiting { at: now, reason }, batch, now);
            }
            Decision::Refused { id, reason } => {
                let reason = Reason::refused(&reason);
                self.tell_native(WorkloadId(id), &reason, true);
                self.metrics.refused(reason.code);
                self.apply(WorkloadId(id), Input::Refused { at: now, reason }, batch, now);
            }
            Decision::Preempt { victim, by, cause } => {
                self.metrics.preempted(cause.code());
                let code = match cause {
                    tessera_sched::reason::PreemptCause::Priority { .. } => tessera_domain::PreemptCode::Priority,
                    tessera_sched::reason::PreemptCause::Reclaim { .. } => tessera_domain::PreemptCode::Reclaim,
                };
                let input = Input::Preempt {
                    at: now,
                    by: WorkloadId(by),
                    code,
                    detail: cause.to_string(),
                    grace_s: self.settings.grace.as_secs(),
                };
                self.apply(WorkloadId(victim), input, batch, now);
            }
            Decision::Move { id, by, to } => self.on_move(id, by, to.is_some(), batch, now),
        }
    }

    /// Backend news becomes lifecycle input.
    /// Tells a native workload's owner, on its object, why it waits (when the reason changed)
    /// or that it was refused.
    fn tell_native(&self, id: WorkloadId, reason: &Reason, refused: bool) {
        let Some(l) = self.live.get(&id) else { return };
        let Some(native) = l.w.spec.native.as_deref() else {
            return;
        };
        if !refused && l.w.reason.as_ref() == Some(reason) {
            return;
        }
        crate::native::tell(&*self.backend, native, refused, &reason.detail);
    }

    fn on_backend(&mut self, e: BackendEvent, batch: &mut Batch, now: i64) {
        match e {
            // The stop is over (backends that confirm stops): the devices are free now.
            BackendEvent::Stopped { id, at_ms } => {
                self.apply(WorkloadId(id), Input::Stopped { at: at_ms.max(0) }, batch, now);
            }
            BackendEvent::Notice { id, detail } => {
                if detail.contains("PodDisruptionBudget") {
                    self.metrics.eviction_refused();
                }
                self.apply(
                    WorkloadId(id),
                    Input::Notice {
                        at: now,
                        code: tessera_domain::ReasonCode::NodeDrain,
                        detail,
                    },
                    batch,
                    now,
                );
            }
            // Its owner deleted a native workload's pod: the workload is cancelled, if the pod
            // is exactly its object (namespace, name and UID).
            BackendEvent::Withdrawn { id, native } => {
                let ours = self
                    .live
                    .get(&WorkloadId(id))
                    .is_some_and(|l| l.w.spec.native.as_deref() == Some(native.to_record().as_str()));
                if !ours {
                    tracing::warn!(workload = id, namespace = %native.namespace, pod = %native.name,
                        "a withdrawal for a pod that is not the workload's object: ignored");
                    return;
                }
                let grace_s = self.settings.grace.as_secs();
                self.apply(
                    WorkloadId(id),
                    Input::Cancel {
                        at: now,
                        by: format!(
                            "{} (pod {}/{} deleted)",
                            crate::native::ACTOR,
                            native.namespace,
                            native.name
                        ),
                        grace_s,
                    },
                    batch,
                    now,
                );
            }
            BackendEvent::Stranger {
                namespace,
                name,
                detail,
            } => {
                self.metrics.stranger();
                batch.audit(tessera_store::AuditRecord {
                    seq: 0,
                    at: now,
                    request_id: format!("backend-stranger-{namespace}-{name}"),
                    actor: format!("{}-backend", self.backend.name()),
                    tenant: None,
                    action: "backend.stranger".into(),
                    target: format!("namespaces/{namespace}/pods/{name}"),
                    outcome: 403,
                    detail,
                });
            }
            BackendEvent::Started { id, bound: Some(bound) } | BackendEvent::Bound { id, bound } => {
                let id = WorkloadId(id);
                if let Some(l) = self.live.get(&id)
                    && let Some(p) = l.w.placement.clone()
                {
                    match self.rebind(id, &p, &bound) {
                        Ok(moved) => {
                            for (m, placement) in moved {
                                self.apply(m, Input::Bound { placement }, batch, now);
                            }
                        }
                        Err(why) => {
                            tracing::error!(%id, error = %why, "the backend bound devices the engine cannot account for");
                        }
                    }
                }
            }
            // Exact backends' devices are the engine's own.
            BackendEvent::Started { bound: None, .. } => {}
            BackendEvent::Running { id, at_ms, sample } => {
                let id = WorkloadId(id);
                let Some(l) = self.live.get(&id) else { return };
                let observed = observe(&sample, &l.w);
                let created = l.w.created_at;
                let pool = l.w.placement.as_ref().map(|p| p.pool.clone()).unwrap_or_default();
                let input = Input::Running {
                    at: at_ms,
                    detail: format!("started by the {} backend", self.backend.name()),
                    observed,
                };
                if l.w.phase == Phase::Partitioned {
                    self.metrics.running(&pool, at_ms - created);
                }
                self.apply(id, input, batch, now);
            }
            BackendEvent::Exited { id, at_ms, exit } => {
                let (success, detail) = match exit {
                    Exit::Succeeded => (true, String::new()),
                    Exit::Failed { exit_code, detail } => (
                        false,
                        match exit_code {
                            // The backend's detail may already say just that (local does).
                            Some(c) => {
                                let head = format!("exited with code {c}");
                                if detail.is_empty() || detail == head {
                                    head
                                } else {
                                    format!("{head}: {detail}")
                                }
                            }
                            None => detail,
                        },
                    ),
                };
                self.apply(
                    WorkloadId(id),
                    Input::Exited {
                        at: at_ms,
                        success,
                        detail,
                    },
                    batch,
                    now,
                );
            }
            BackendEvent::Lost { id, at_ms, detail } => {
                self.apply(WorkloadId(id), Input::Lost { at: at_ms, detail }, batch, now);
            }
            // Evicted by a drain outside Tessera (`kubectl drain`): stopped as Tessera's own
            // drain stops work past its deadline, so batch work is requeued (by its policy)
            // and its capacity is released once the backend confirms the stop.
            BackendEvent::Evicted { id, at_ms, detail } => {
                let grace_s = self.settings.grace.as_secs();
                self.apply(
                    WorkloadId(id),
                    Input::Preempt {
                        at: at_ms.max(0),
                        by: WorkloadId(id),
                        code: tessera_domain::PreemptCode::Drain,
                        detail,
                        grace_s,
                    },
                    batch,
                    now,
                );
            }
            BackendEvent::Telemetry { at_ms, gpus } => {
                // A critical XID seen in telemetry takes the GPU out within one interval, also
                // where the backend sent no health event.
                for g in gpus.iter().filter(|g| health::is_critical(g.xid)) {
                    if !self.ops.unhealthy.contains_key(&(g.node.clone(), g.gpu)) {
                        let detail = format!("XID {} in telemetry", g.xid);
                        self.gpu_failed(&g.node, g.gpu, health::Cause::Xid(g.xid), &detail, batch, now);
                    }
                }
                let dt = (at_ms - self.last_sample).clamp(0, 60_000) as f64;
                self.last_sample = at_ms;
                let metrics = self.metrics.clone();
                metering::sample_utilisation(
                    &mut self.live,
                    self.sched.engine.state(),
                    &self.nodes,
                    &gpus,
                    dt,
                    |w, util| metrics.meter(w, util, dt),
                );
                self.published.set_telemetry(Telemetry {
                    at: at_ms,
                    gpus: Arc::new(gpus),
                });
                self.rollout_soon |= self.ops.rollouts.values().any(|r| {
                    r.state == tessera_store::RolloutState::Running || r.nodes.iter().any(|n| n.state.is_out())
                });
            }
            // Handled before (it needs the store): see `handle`.
            BackendEvent::GpuHealth { .. } => {}
            // Handled before (it needs the store): see `handle`.
            BackendEvent::NodeChanged { .. } | BackendEvent::MigMode { .. } | BackendEvent::FleetChanged { .. } => {}
            // Taken in by the intake before the loop (see `forward_backend_events`).
            BackendEvent::Submitted { .. } => {}
            BackendEvent::PartitionChanged { node, gpu, instances } => {
                tracing::debug!(%node, gpu, instances = instances.len(), "MIG layout applied");
                self.adopt_layouts(&[(node, gpu, instances)], now_ms());
            }
        }
    }

    /// A backend operation finished.
    fn on_done(&mut self, id: WorkloadId, r: OpResult, batch: &mut Batch, now: i64) {
        let input = match r {
            OpResult::Partitioned(Ok(rep)) => Input::Partitioned {
                at: now,
                detail: rep.detail,
            },
            OpResult::Partitioned(Err(e)) => {
                // A whole-GPU layout that failed leaves the engine's configured layout wrong:
                // learn the real one from the backend.
                self.reconcile_soon = self.caps.partitioning == Partitioning::WholeGpu;
                // The GPU that could not be partitioned takes no more work until cleared.
                if let Some(p) = self.live.get(&id).and_then(|l| l.w.placement.clone()) {
                    let detail = format!("partitioning failed: {e}");
                    for g in p.gpus {
                        self.gpu_failed(&p.node, g, health::Cause::Partition, &detail, batch, now);
                    }
                }
                Input::PartitionFailed {
                    at: now,
                    detail: format!("partitioning failed: {e}"),
                }
            }
            OpResult::Started(Ok(())) => return,
            OpResult::Started(Err(e)) => Input::StartFailed {
                at: now,
                detail: format!("start failed: {e}"),
            },
            // A backend that confirms stops says when the workload is gone
            // (`BackendEvent::Stopped`): until then it keeps its capacity, and a stop that
            // failed is tried again by the next reconcile (a stopping workload still running
            // there is stopped again).
            OpResult::Stopped(r) if self.caps.confirms_stop => {
                if let Err(e) = r {
                    tracing::warn!(%id, error = %e, "stop failed; the workload keeps its capacity and the next reconcile stops it again");
                    self.reconcile_soon = true;
                }
                return;
            }
            OpResult::Stopped(r) => {
                if let Err(e) = r {
                    tracing::warn!(%id, error = %e, "stop failed; treating the workload as stopped");
                }
                Input::Stopped { at: now }
            }
            OpResult::Unpartitioned(r) => {
                if let Err(e) = r {
                    tracing::warn!(%id, error = %e, "unpartition failed");
                }
                return;
            }
        };
        self.apply(id, input, batch, now);
    }

    /// Runs `input` through the lifecycle of workload `id` and carries out the effects that
    /// touch the scheduler and the ledger; backend work and the record wait for the commit.
    fn apply(&mut self, id: WorkloadId, input: Input, batch: &mut Batch, now: i64) {
        let Some(mut live) = self.live.remove(&id) else {
            return;
        };
        // The placement and running time before the transition: a requeue clears them, and the
        // unpartition and the month's spend still need them.
        let before = live.w.placement.clone();
        let before_units = live.w.held_units();
        let ran_since = live.w.running_at;
        let before_phase = live.w.phase;
        // A drain's stop goes through the platform's eviction (Kubernetes: the Eviction API).
        let evict = matches!(
            input,
            Input::Preempt {
                code: tessera_domain::PreemptCode::Drain,
                ..
            }
        );
        let mut follow = Vec::new();
        let t = transition_shared(live.w, input);
        live.w = t.workload;
        for e in &t.effects {
            match e {
                tessera_domain::Effect::Release => {
                    self.sched.release(id.0, now);
                }
                // One without a reason was never decided (accepted before a crash): the next
                // cycle decides it like a new one.
                tessera_domain::Effect::Requeue if live.w.reason.is_none() => self.sched.enqueue_undecided(live.job()),
                tessera_domain::Effect::Requeue => self.sched.enqueue(live.job()),
                tessera_domain::Effect::Dequeue => {
                    self.sched.dequeue(id.0);
                }
                tessera_domain::Effect::OpenUsage { seq, at } => {
                    let p = live.w.placement.as_ref().expect("a running workload has a placement");
                    live.util = (0.0, 0.0);
                    batch.usage(Change::OpenUsage(UsageInterval {
                        workload: id,
                        seq: *seq,
                        tenant: live.w.spec.tenant.clone(),
                        project: live.w.spec.project.clone(),
                        pool: p.pool.clone(),
                        model: p.model.clone(),
                        shape: if live.w.shares.is_empty() {
                            p.to_string()
                        } else {
                            format!("{} ({} node-shares)", live.w.spec.shape.gpu, live.w.shares.len() + 1)
                        },
                        // Every node-share of a gang.
                        units: live.w.held_units(),
                        started_at: *at,
                        ended_at: None,
                        util_avg: None,
                    }));
                }
                tessera_domain::Effect::CloseUsage { seq, at } => {
                    let util_avg = live.utilisation();
                    live.util = (0.0, 0.0);
                    if let (Some(_), Some(r)) = (before.as_ref(), ran_since) {
                        self.month.close(&live.w.spec.tenant, before_units, r, *at);
                    }
                    batch.usage(Change::CloseUsage {
                        workload: id,
                        seq: *seq,
                        ended_at: *at,
                        util_avg,
                    });
                }
                tessera_domain::Effect::Partition => {
                    let p = live.w.placement.as_ref().expect("a placed workload has a placement");
                    match placement::partition_plan(p, &self.caps, || self.layout(p)) {
                        // Whole GPUs and host resources: nothing to create, so nothing a crash
                        // could make twice; the step is recorded at once and the start follows.
                        PartitionPlan::Nothing { node } => follow.push(Input::Partitioned {
                            at: now,
                            detail: match p.slice {
                                tessera_domain::Slice::Whole => {
                                    format!("whole GPUs {:?} on {node}: nothing to partition", p.gpus)
                                }
                                _ => format!("host resources on {node}: nothing to partition"),
                            },
                        }),
                        plan => batch.op(id, Op::Partition(plan)),
                    }
                }
                tessera_domain::Effect::Start => {
                    let spec = placement::run_spec(&self.fleet, &self.nodes, &live.w, &self.caps);
                    batch.op(id, Op::Start(Box::new(spec)));
                }
                tessera_domain::Effect::Stop { grace_s } => {
                    self.sched.stopping(id.0);
                    batch.op(
                        id,
                        Op::Stop {
                            grace: Duration::from_secs(*grace_s),
                            evict,
                        },
                    );
                }
                tessera_domain::Effect::Unpartition => {
                    if let Some(p) = before.as_ref().or(live.w.placement.as_ref()) {
                        let plan = placement::partition_plan(p, &self.caps, Vec::new);
                        if !matches!(plan, PartitionPlan::Nothing { .. } | PartitionPlan::Layout { .. }) {
                            batch.op(id, Op::Unpartition(plan));
                        }
                    }
                }
            }
        }
        if live.w.phase.is_terminal() {
            self.metrics.ended(live.w.phase);
        }
        if t.changed && (before_phase != live.w.phase || live.w.phase.is_waiting()) {
            self.queue_dirty = true;
        }
        if t.changed {
            batch.update(live.w.clone(), t.events);
        }
        if !live.w.phase.is_terminal() {
            self.live.insert(id, live);
        }
        for input in follow {
            self.apply(id, input, batch, now);
        }
    }

    /// The MIG layout of the GPU a placement is on, as the engine holds it (`whole-gpu`
    /// backends: the configured layout, this instance included).
    fn layout(&self, p: &tessera_domain::Placement) -> Vec<MigInstance> {
        let Some(n) = self.nodes.get(&p.node) else {
            return Vec::new();
        };
        let gpu = p.gpus.first().copied().unwrap_or(0);
        self.sched
            .engine
            .mig_layout(n, gpu)
            .iter()
            .map(|slot| placement::mig_instance_of(&self.fleet, n, slot))
            .collect()
    }

    /// Adopts MIG layouts a `whole-gpu` backend reports (start-up, reconcile, a layout applied).
    /// `at`: when the backend read them (a reconcile: when it was asked).
    fn adopt_layouts(&mut self, layouts: &[(String, u8, Vec<MigInstance>)], at: i64) {
        for (node, gpu, instances) in layouts {
            self.reported_mig.insert((node.clone(), *gpu), (at, instances.clone()));
        }
        if self.caps.partitioning != Partitioning::WholeGpu {
            return;
        }
        for (node, gpu, instances) in layouts {
            let Some(n) = self.nodes.get(node) else {
                tracing::warn!(%node, "the backend reports a MIG layout on a node the fleet does not have");
                continue;
            };
            let Some(slots) = placement::mig_slots(&self.fleet, n, instances) else {
                tracing::warn!(%node, gpu, "the backend reports MIG profiles this GPU model does not have");
                continue;
            };
            if let Err(e) = self.sched.engine.adopt_layout(n, *gpu, &slots) {
                tracing::warn!(%node, gpu, error = %e, "cannot adopt the MIG layout the backend reports");
            }
        }
    }

    /// Moves a workload's booking to the devices a per-node-count backend chose; returns the
    /// new placements of every workload whose booking changed (a swap moves two).
    fn rebind(
        &mut self,
        id: WorkloadId,
        p: &tessera_domain::Placement,
        bound: &tessera_backend::Bound,
    ) -> Result<Vec<(WorkloadId, tessera_domain::Placement)>, String> {
        let mut q = p.clone();
        q.gpus = bound.gpus.clone();
        if let (tessera_domain::Slice::Mig { start, .. }, Some(m)) = (&mut q.slice, &bound.mig) {
            *start = m.start;
        }
        if q == *p {
            self.sched.engine.bind(id.0).map_err(|e| e.to_string())?;
            return Ok(Vec::new());
        }
        let l = self.live.get(&id).ok_or("not live")?;
        let tenant = self.tenants.get(&l.w.spec.tenant).copied().unwrap_or(TenantId(0));
        let alloc = placement::allocation_of(
            &self.fleet,
            &self.nodes,
            id.0,
            &q,
            (l.w.spec.cpu_milli, l.w.spec.memory_mib),
            tenant,
        )?;
        let moved = self.sched.engine.rebind(id.0, alloc.grant).map_err(|e| e.to_string())?;
        Ok(moved
            .into_iter()
            .filter_map(|m| {
                let a = self.sched.engine.allocation(m)?;
                Some((WorkloadId(m), placement::placement_of(&self.fleet, a)))
            })
            .collect())
    }

    fn start_reconcile(&mut self, tx: mpsc::Sender<Cmd>) {
        if self.reconciling {
            return;
        }
        let mut expected = Vec::new();
        let mut phases = Vec::new();
        for l in self.live.values() {
            if matches!(l.w.phase, Phase::Partitioned | Phase::Running | Phase::Stopping) && !self.runner.busy(l.w.id) {
                expected.push(placement::run_spec(&self.fleet, &self.nodes, &l.w, &self.caps));
                phases.push((l.w.id, l.w.phase));
            }
        }
        self.reconciling = true;
        self.reconcile_asked = now_ms();
        let backend = self.backend.clone();
        self.runner.spawn(async move {
            let r = backend.reconcile(&expected).await.map_err(|e| e.to_string());
            let _ = tx.send(Cmd::Reconciled(r, phases)).await;
        });
    }

    /// A periodic reconcile came back: what changed behind Tessera's back becomes input, for
    /// workloads whose phase did not move meanwhile and that have no backend work in flight.
    fn on_reconciled(
        &mut self,
        report: Result<tessera_backend::ReconcileReport, String>,
        expected: Vec<(WorkloadId, Phase)>,
        batch: &mut Batch,
        now: i64,
    ) {
        let report = match report {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "reconcile with the backend failed; retrying at the next interval");
                return;
            }
        };
        self.adopt_layouts(&report.layouts, self.reconcile_asked);
        let phases: HashMap<WorkloadId, Phase> = expected.into_iter().collect();
        for (id, observation) in report.workloads {
            let id = WorkloadId(id);
            let unchanged = self
                .live
                .get(&id)
                .is_some_and(|l| phases.get(&id) == Some(&l.w.phase) && !self.runner.busy(id));
            if !unchanged {
                continue;
            }
            let observed = self.observed(observation, "found by the periodic reconcile");
            if matches!(observed, Observed::Unknown { .. }) {
                self.metrics.ghost();
            }
            let grace_s = self.settings.grace.as_secs();
            self.apply(
                id,
                Input::Recovered {
                    at: now,
                    observed,
                    grace_s,
                },
                batch,
                now,
            );
        }
        self.note_orphans(&report.orphans, batch, now);
    }

    /// Work the backend runs that Tessera does not know: counted, logged, and audited the first
    /// time a reconcile reports it (`backend.orphan`, as strangers are `backend.stranger`), so an
    /// operator finds it in the audit log without one record per interval. One that goes and
    /// comes back is audited again.
    fn note_orphans(&mut self, orphans: &[tessera_backend::Orphan], batch: &mut Batch, now: i64) {
        self.metrics.orphans(orphans.len());
        let mut seen = std::collections::HashSet::with_capacity(orphans.len());
        for o in orphans {
            let key = format!("{}|{:?}|{}", o.node, o.id, o.detail);
            if !self.orphans_seen.contains(&key) {
                tracing::warn!(node = %o.node, id = ?o.id, detail = %o.detail, "the backend runs work Tessera does not know (orphan)");
                batch.audit(tessera_store::AuditRecord {
                    seq: 0,
                    at: now,
                    request_id: format!("backend-orphan-{now}-{}", seen.len()),
                    actor: format!("{}-backend", self.backend.name()),
                    tenant: None,
                    action: "backend.orphan".into(),
                    target: match o.id {
                        Some(id) => format!("workloads/{id} on {}", o.node),
                        None => format!("nodes/{}", o.node),
                    },
                    outcome: 409,
                    detail: o.detail.clone(),
                });
            }
            seen.insert(key);
        }
        self.orphans_seen = seen;
    }

    /// A backend observation as lifecycle input.
    fn observed(&self, o: tessera_backend::Observation, when: &str) -> Observed {
        match o {
            tessera_backend::Observation::Running { since_ms } => Observed::Running { since: since_ms },
            tessera_backend::Observation::Starting => Observed::Starting,
            tessera_backend::Observation::Succeeded => Observed::Succeeded,
            tessera_backend::Observation::Failed { detail } => Observed::Failed { detail },
            tessera_backend::Observation::Unknown => Observed::Unknown {
                detail: format!(
                    "the {} backend no longer knows this workload ({when})",
                    self.backend.name()
                ),
            },
        }
    }
}

/// A new scheduler whose engine honours the backend's capabilities.
fn fresh_scheduler(factory: &SchedFactory, fleet: Arc<Fleet>, caps: &Capabilities) -> Scheduler {
    let mut s = factory(fleet);
    let mig = match caps.partitioning {
        Partitioning::WholeGpu => MigMode::WholeGpu,
        Partitioning::Instance | Partitioning::None => MigMode::Instance,
    };
    s.engine.set_mig_mode(mig).expect("a new engine has no allocations");
    s.engine.set_device_binding(match caps.devices {
        DeviceAssignment::Exact => DeviceBinding::Exact,
        DeviceAssignment::PerNodeCount => DeviceBinding::PerNodeCount,
    });
    s
}

/// The resource class a request waits for: its pool when only one pool can serve it.
fn class_of(fleet: &Fleet, sched: &Scheduler, r: &Request) -> String {
    if let Some(p) = r.pool {
        return fleet.pool(p).name.clone();
    }
    match sched.engine.scope(r) {
        Ok(pools) if pools.len() == 1 => fleet.pool(pools[0]).name.clone(),
        _ => "any".into(),
    }
}

/// The `observed` step of a workload that just started, from the backend's first sample.
fn observe(samples: &[GpuSample], w: &Workload) -> String {
    let Some(p) = &w.placement else {
        return "no placement".into();
    };
    // The GPU the backend says the workload is on (a device plugin may have picked another
    // than the engine's), else the first of its placement.
    let attributed = samples
        .iter()
        .find(|s| s.node == p.node && s.instances.iter().any(|i| i.workload == w.id.0));
    let Some(s) = attributed.or_else(|| samples.iter().find(|s| s.node == p.node && p.gpus.contains(&s.gpu))) else {
        return format!("host resources on {}: no GPU telemetry for this workload", p.node);
    };
    match s.instances.iter().find(|i| i.workload == w.id.0) {
        Some(i) => format!(
            "{} GPU {}: engine {:.0} % active, {} MiB framebuffer used{}",
            s.node,
            s.gpu,
            i.gr_engine_active * 100.0,
            i.fb_used_mib,
            if i.profile.is_empty() {
                String::new()
            } else {
                format!(" in MIG instance {}", i.profile)
            }
        ),
        None => format!(
            "{} GPU {}: {:.0} % utilisation, {} MiB framebuffer used, {:.0} °C",
            s.node, s.gpu, s.util_pct, s.fb_used_mib, s.temp_c
        ),
    }
}
