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

mod batch;
mod command;
mod commit;
mod config;
mod consolidation;
pub mod effects;
mod fleetswap;
mod follower;
mod health;
mod live;
mod metering;
mod migmode;
mod nodeops;
pub mod placement;
mod recover;
mod rollout;
pub mod snapshot;
mod world;

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_backend::{Backend, BackendEvent, Exit, GpuSample, MigInstance, Partitioning};
use tessera_domain::{Input, Observed, Phase, Reason, Step, Workload, WorkloadId};
use tessera_model::Fleet;
use tessera_model::request::GangRequest;
use tessera_sched::cycle::Decision;
use tessera_sched::reason::Refusal;
use tessera_store::{Fence, Store};
use tokio::sync::mpsc;

use batch::{Batch, ReplyTo};
pub use command::{Cmd, Governance, Lifecycle, LifecycleError, NewWorkload};
pub use config::{LoopConfig, SchedFactory, Settings};
use effects::{OpResult, Runner};
pub use fleetswap::FleetCell;
pub use health::{CRITICAL_XIDS, FleetOps, GpuFailurePolicy, is_critical};
pub(crate) use live::Live;
use live::now_ms;
use metering::MonthBook;
pub use migmode::{MigOutcome, MigRefusal};
pub use nodeops::NodeOp;
use placement::NodeIndex;
pub use rollout::{NewRollout, VALIDATE_WITHIN_MS};
use snapshot::SnapshotBuilder;
pub use snapshot::{GpuSnap, HolderSnap, NodeSnap, Published, Snapshot, Telemetry, TenantSnap, Trial};
use world::World;

use crate::metrics::Metrics;

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

/// The loop's state.
pub(crate) struct Core {
    w: World,
    /// Workload ids reserved from the store and not yet used.
    ids: Range<u64>,
    runner: Runner,
    builder: SnapshotBuilder,
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
    /// Unhealthy GPUs not yet written to the store.
    health_writes: Vec<tessera_store::GpuHealthRecord>,
    /// Drains in progress and services being moved.
    drains: nodeops::Drains,
    /// Services being moved by consolidation.
    moves: consolidation::Moves,
    /// A fleet the backend reported, adopted once the batch it came in is committed.
    pending_fleet: Option<Arc<Fleet>>,
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
            builder: SnapshotBuilder::new(&fleet),
            w: World {
                nodes: Arc::new(NodeIndex::new(&fleet)),
                sched: (cfg.factory)(fleet.clone()),
                factory: cfg.factory.clone(),
                caps: cfg.backend.capabilities(),
                fleet,
                store: cfg.store.clone(),
                backend: cfg.backend.clone(),
                live: HashMap::new(),
                tenants: HashMap::new(),
                settings: cfg.settings.clone(),
                month: MonthBook::default(),
                metrics: cfg.metrics.clone(),
                ops: Arc::default(),
                published: self.published.clone(),
            },
            runner: Runner::new(cfg.backend.clone(), tx.clone(), cfg.metrics.clone()),
            ids: 0..0,
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
            health_writes: Vec::new(),
            drains: nodeops::Drains::default(),
            moves: consolidation::Moves::default(),
            pending_fleet: None,
        };
        core.recover()
            .await
            .map_err(|e| format!("rebuilding state from the store: {e}"))?;
        let reconcile_every = core.w.settings.reconcile_every;
        *self.tx.write().expect("lock") = Some(tx.clone());
        let task = tokio::spawn(core.run(rx, tx, reconcile_every));
        Ok(Leading {
            task: Some(task),
            slot: self.tx.clone(),
        })
    }
}

impl Core {
    /// The resource class a request waits for: its pool when only one pool can serve it.
    /// The shortest interval between two full publications while the queue changes:
    /// [`QUEUE_PUBLISH_EVERY`], or longer where building one takes long.
    fn queue_publish_every(&self) -> Duration {
        QUEUE_PUBLISH_EVERY.max(self.last_full_build * QUEUE_PUBLISH_COST)
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Cmd>, tx: mpsc::Sender<Cmd>, reconcile_every: Duration) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reconcile = tokio::time::interval_at(tokio::time::Instant::now() + reconcile_every, reconcile_every);
        reconcile.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_cycle = Instant::now() - CYCLE_EVERY;
        let mut cycle_cost = Duration::ZERO;
        loop {
            let pending_cycle = self.w.sched.needs_cycle();
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
                if let Err(e) = self.w.month.refresh(&*self.w.store, now).await {
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
            if ticked || (self.w.sched.needs_cycle() && last_cycle.elapsed() >= every) {
                // The steps above may have waited on the store: decisions take the time now.
                let now = now_ms();
                last_cycle = Instant::now();
                let actions = self.w.sched.cycle(now);
                cycle_cost = last_cycle.elapsed();
                self.w.metrics.scheduler_cycle(cycle_cost);
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
            .w
            .live
            .values()
            .filter(|l| l.w.usage.open)
            .map(|l| l.w.spec.tenant.clone())
            .filter(|t| self.w.sched.budget(t).is_some())
            .collect();
        tenants.sort_unstable();
        tenants.dedup();
        for t in tenants {
            let spent = self.w.month.spent(&t, self.w.live.values().map(|l| &*l.w), now);
            self.w.sched.set_spent(&t, spent);
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
                if !self.w.live.contains_key(&id) {
                    let err = match self.w.published.workload(id) {
                        Some(_) => LifecycleError::Ended { id },
                        None => LifecycleError::NotFound { id },
                    };
                    let _ = reply.send(Err(err));
                    return;
                }
                let grace_s = self.w.settings.grace.as_secs();
                self.w.apply(
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
                    Governance::Quota { tenant, class, quota } => self.w.sched.set_quota(&tenant, &class, quota),
                    Governance::Budget { tenant, unit_hours } => {
                        self.w.sched.set_budget(&tenant, unit_hours);
                        let spent = self.w.month.spent(&tenant, self.w.live.values().map(|l| &*l.w), now);
                        self.w.sched.set_spent(&tenant, spent);
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
                    if self.w.ops.unhealthy.contains_key(&(node.clone(), gpu)) {
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
                    .w
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
                .w
                .store
                .reserve_workload_ids(ID_BLOCK)
                .await
                .map_err(|e| LifecycleError::Unavailable(format!("the store is unavailable: {e}")))?;
        }
        let id = WorkloadId(self.ids.start);
        self.ids.start += 1;
        let tenant = self.w.tenant_id(&nw.spec.tenant);
        // Resolved again against the loop's own fleet: pools and models are numbered by the
        // fleet, and the caller may have read a newer (or older) one than the loop holds.
        let (request, gang) = match placement::resolve(&self.w.fleet, &nw.spec, tenant) {
            Ok(r) => r,
            Err(e) => {
                self.ids.start -= 1;
                return Err(LifecycleError::Conflict(format!("{}: {}", e.field, e.message)));
            }
        };
        // A gang asks for all its GPUs (`request` stands for one node-share).
        let units = gang
            .as_ref()
            .map_or_else(|| request.units(&self.w.fleet.catalogue), GangRequest::units);
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
        if self.w.sched.budget(&w.spec.tenant).is_some() {
            let spent = self
                .w
                .month
                .spent(&w.spec.tenant, self.w.live.values().map(|l| &*l.w), now);
            self.w.sched.set_spent(&w.spec.tenant, spent);
        }
        let live = Live {
            class: self.w.class_of(&request).into(),
            request,
            gang,
            w: w.into(),
            util: (0.0, 0.0),
        };
        let job = live.job();
        self.w.live.insert(id, live);
        batch.queue_changed = true;
        // While capacity is changing, the next cycle (at most CYCLE_EVERY away) decides: a burst
        // of submissions then costs one pass over the queue, and freed capacity goes to the
        // queue in order. The caller's answer waits for that cycle.
        let actions = if let Some(old) = replacing {
            match self.w.sched.adopt_replacement(old.0, &job, now) {
                Some((alloc, borrowing)) => vec![Decision::Placed {
                    id: id.0,
                    alloc,
                    borrowing,
                }],
                None => {
                    self.w.live.remove(&id);
                    self.ids.start -= 1;
                    return Err(LifecycleError::Conflict(format!(
                        "no replacement of workload {old} is booked"
                    )));
                }
            }
        } else if self.w.sched.needs_cycle() {
            batch.undecided = true;
            self.w
                .sched
                .submit_for_next_cycle(job)
                .map(|reason| Decision::Refused { id: id.0, reason })
                .into_iter()
                .collect()
        } else {
            self.w.sched.submit(job, now)
        };
        let refusal = actions.iter().find_map(|a| match a {
            Decision::Refused { id: r, reason } if *r == id.0 => Some(reason.clone()),
            _ => None,
        });
        if let Some(refusal) = refusal {
            self.w.live.remove(&id);
            // The id was never used: the next request takes it.
            self.ids.start -= 1;
            let reason = Reason::refused(&refusal);
            self.w.metrics.refused(reason.code);
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
        let l = &self.w.live[&id];
        self.w.metrics.step("authorise", now - l.w.created_at);
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
                let Some(l) = self.w.live.get(&wid) else {
                    tracing::error!(id, "placed a workload the loop does not know; releasing");
                    self.w.sched.release(id, now);
                    return;
                };
                self.w.metrics.step("place", now - l.w.created_at);
                let placement = placement::placement_of(&self.w.fleet, &alloc);
                self.w.apply(
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
                let Some(l) = self.w.live.get(&wid) else {
                    tracing::error!(id, "placed a gang the loop does not know; releasing");
                    self.w.sched.release(id, now);
                    return;
                };
                self.w.metrics.step("place", now - l.w.created_at);
                let mut placements = shares.iter().map(|a| placement::placement_of(&self.w.fleet, a));
                let placement = placements.next().expect("a gang has a node-share");
                self.w.apply(
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
                self.w.tell_native(WorkloadId(id), &reason, false);
                self.w
                    .apply(WorkloadId(id), Input::Waiting { at: now, reason }, batch, now);
            }
            Decision::Refused { id, reason } => {
                let reason = Reason::refused(&reason);
                self.w.tell_native(WorkloadId(id), &reason, true);
                self.w.metrics.refused(reason.code);
                self.w
                    .apply(WorkloadId(id), Input::Refused { at: now, reason }, batch, now);
            }
            Decision::Preempt { victim, by, cause } => {
                self.w.metrics.preempted(cause.code());
                let code = match cause {
                    tessera_sched::reason::PreemptCause::Priority { .. } => tessera_domain::PreemptCode::Priority,
                    tessera_sched::reason::PreemptCause::Reclaim { .. } => tessera_domain::PreemptCode::Reclaim,
                };
                let input = Input::Preempt {
                    at: now,
                    by: WorkloadId(by),
                    code,
                    detail: cause.to_string(),
                    grace_s: self.w.settings.grace.as_secs(),
                };
                self.w.apply(WorkloadId(victim), input, batch, now);
            }
            Decision::Move { id, by, to } => self.on_move(id, by, to.is_some(), batch, now),
        }
    }

    fn on_backend(&mut self, e: BackendEvent, batch: &mut Batch, now: i64) {
        match e {
            // The stop is over (backends that confirm stops): the devices are free now.
            BackendEvent::Stopped { id, at_ms } => {
                self.w
                    .apply(WorkloadId(id), Input::Stopped { at: at_ms.max(0) }, batch, now);
            }
            BackendEvent::Notice { id, detail } => {
                if detail.contains("PodDisruptionBudget") {
                    self.w.metrics.eviction_refused();
                }
                self.w.apply(
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
                    .w
                    .live
                    .get(&WorkloadId(id))
                    .is_some_and(|l| l.w.spec.native.as_deref() == Some(native.to_record().as_str()));
                if !ours {
                    tracing::warn!(workload = id, namespace = %native.namespace, pod = %native.name,
                        "a withdrawal for a pod that is not the workload's object: ignored");
                    return;
                }
                let grace_s = self.w.settings.grace.as_secs();
                self.w.apply(
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
                self.w.metrics.stranger();
                batch.audit(tessera_store::AuditRecord {
                    seq: 0,
                    at: now,
                    request_id: format!("backend-stranger-{namespace}-{name}"),
                    actor: format!("{}-backend", self.w.backend.name()),
                    tenant: None,
                    action: "backend.stranger".into(),
                    target: format!("namespaces/{namespace}/pods/{name}"),
                    outcome: 403,
                    detail,
                });
            }
            BackendEvent::Started { id, bound: Some(bound) } | BackendEvent::Bound { id, bound } => {
                let id = WorkloadId(id);
                if let Some(l) = self.w.live.get(&id)
                    && let Some(p) = l.w.placement.clone()
                {
                    match self.w.rebind(id, &p, &bound) {
                        Ok(moved) => {
                            for (m, placement) in moved {
                                self.w.apply(m, Input::Bound { placement }, batch, now);
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
                let Some(l) = self.w.live.get(&id) else { return };
                let observed = observe(&sample, &l.w);
                let created = l.w.created_at;
                let pool = l.w.placement.as_ref().map(|p| p.pool.clone()).unwrap_or_default();
                let input = Input::Running {
                    at: at_ms,
                    detail: format!("started by the {} backend", self.w.backend.name()),
                    observed,
                };
                if l.w.phase == Phase::Partitioned {
                    self.w.metrics.running(&pool, at_ms - created);
                }
                self.w.apply(id, input, batch, now);
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
                self.w.apply(
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
                self.w
                    .apply(WorkloadId(id), Input::Lost { at: at_ms, detail }, batch, now);
            }
            // Evicted by a drain outside Tessera (`kubectl drain`): stopped as Tessera's own
            // drain stops work past its deadline, so batch work is requeued (by its policy)
            // and its capacity is released once the backend confirms the stop.
            BackendEvent::Evicted { id, at_ms, detail } => {
                let grace_s = self.w.settings.grace.as_secs();
                self.w.apply(
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
                    if !self.w.ops.unhealthy.contains_key(&(g.node.clone(), g.gpu)) {
                        let detail = format!("XID {} in telemetry", g.xid);
                        self.gpu_failed(&g.node, g.gpu, health::Cause::Xid(g.xid), &detail, batch, now);
                    }
                }
                let dt = (at_ms - self.last_sample).clamp(0, 60_000) as f64;
                self.last_sample = at_ms;
                let metrics = self.w.metrics.clone();
                metering::sample_utilisation(
                    &mut self.w.live,
                    self.w.sched.engine.state(),
                    &self.w.nodes,
                    &gpus,
                    dt,
                    |w, util| metrics.meter(w, util, dt),
                );
                self.w.published.set_telemetry(Telemetry {
                    at: at_ms,
                    gpus: Arc::new(gpus),
                });
                self.rollout_soon |= self.w.ops.rollouts.values().any(|r| {
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
                self.reconcile_soon = self.w.caps.partitioning == Partitioning::WholeGpu;
                // The GPU that could not be partitioned takes no more work until cleared.
                if let Some(p) = self.w.live.get(&id).and_then(|l| l.w.placement.clone()) {
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
            OpResult::Stopped(r) if self.w.caps.confirms_stop => {
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
        self.w.apply(id, input, batch, now);
    }

    /// Adopts MIG layouts a `whole-gpu` backend reports (start-up, reconcile, a layout applied).
    /// `at`: when the backend read them (a reconcile: when it was asked).
    fn adopt_layouts(&mut self, layouts: &[(String, u8, Vec<MigInstance>)], at: i64) {
        for (node, gpu, instances) in layouts {
            self.reported_mig.insert((node.clone(), *gpu), (at, instances.clone()));
        }
        if self.w.caps.partitioning != Partitioning::WholeGpu {
            return;
        }
        for (node, gpu, instances) in layouts {
            let Some(n) = self.w.nodes.get(node) else {
                tracing::warn!(%node, "the backend reports a MIG layout on a node the fleet does not have");
                continue;
            };
            let Some(slots) = placement::mig_slots(&self.w.fleet, n, instances) else {
                tracing::warn!(%node, gpu, "the backend reports MIG profiles this GPU model does not have");
                continue;
            };
            if let Err(e) = self.w.sched.engine.adopt_layout(n, *gpu, &slots) {
                tracing::warn!(%node, gpu, error = %e, "cannot adopt the MIG layout the backend reports");
            }
        }
    }

    fn start_reconcile(&mut self, tx: mpsc::Sender<Cmd>) {
        if self.reconciling {
            return;
        }
        let mut expected = Vec::new();
        let mut phases = Vec::new();
        for l in self.w.live.values() {
            if matches!(l.w.phase, Phase::Partitioned | Phase::Running | Phase::Stopping) && !self.runner.busy(l.w.id) {
                expected.push(placement::run_spec(&self.w.fleet, &self.w.nodes, &l.w, &self.w.caps));
                phases.push((l.w.id, l.w.phase));
            }
        }
        self.reconciling = true;
        self.reconcile_asked = now_ms();
        let backend = self.w.backend.clone();
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
                .w
                .live
                .get(&id)
                .is_some_and(|l| phases.get(&id) == Some(&l.w.phase) && !self.runner.busy(id));
            if !unchanged {
                continue;
            }
            let observed = self.w.observed(observation, "found by the periodic reconcile");
            if matches!(observed, Observed::Unknown { .. }) {
                self.w.metrics.ghost();
            }
            let grace_s = self.w.settings.grace.as_secs();
            self.w.apply(
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
        self.w.metrics.orphans(orphans.len());
        let mut seen = std::collections::HashSet::with_capacity(orphans.len());
        for o in orphans {
            let key = format!("{}|{:?}|{}", o.node, o.id, o.detail);
            if !self.orphans_seen.contains(&key) {
                tracing::warn!(node = %o.node, id = ?o.id, detail = %o.detail, "the backend runs work Tessera does not know (orphan)");
                batch.audit(tessera_store::AuditRecord {
                    seq: 0,
                    at: now,
                    request_id: format!("backend-orphan-{now}-{}", seen.len()),
                    actor: format!("{}-backend", self.w.backend.name()),
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
