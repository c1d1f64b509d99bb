//! The lifecycle loop: one task owns the scheduler (queue, quotas, preemption, the placement
//! engine) and every live workload, and walks each request through its steps — requested →
//! authorised → placed → partitioned → running → observed → metered → released.
//!
//! What happens to a workload is decided by the pure [`tessera_domain::transition`]; this
//! loop only batches, commits, answers and executes:
//!
//! * commands (API calls, backend events and the results of backend operations) arrive on a
//!   channel and are handled in batches; scheduler actions and backend news become lifecycle
//!   inputs ([`World::apply`](world::World::apply));
//! * the batch's records, events and usage intervals are committed in one store transaction
//!   ([`commit`]), and only then are callers answered, what readers see published
//!   ([`snapshot`]) and backend work started ([`effects`]). If a commit fails, memory is rebuilt
//!   from the store ([`recover`]), so memory never runs ahead of what is durable;
//! * at start-up the same rebuild re-applies allocations (double booking is refused) and asks
//!   the backend what it runs; a periodic, level-triggered reconcile finds workloads the
//!   backend lost (ghosts) and work it runs that Tessera does not know (orphans).
//!
//! The loop is made of controllers, each a struct that owns its state and takes one step at a
//! time through what it is handed — the [`World`](world::World) (fleet, scheduler, live
//! workloads, backend) and, only where it uses them, the store, the operator state and the
//! readers' view; the batch and the time; or a small context of borrowed parts — never the
//! whole loop: [`admission`] (creations, scheduler decisions, cancellations,
//! quotas), [`news`] (backend news about a workload), [`health`], [`migmode`], [`meter`],
//! [`reconcile`], [`nodeops`] (drains), [`consolidation`] (moves), [`rollout`] and
//! [`commit`] (publication). [`Core`] holds them; its `handle` only hands each command to the
//! controller it concerns. Shared lower-level parts ([`config`], [`command`], [`live`],
//! [`batch`], [`ops`], [`world`], …) are imported by the controllers; no module imports this
//! one.

mod admission;
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
mod meter;
mod metering;
mod migmode;
mod news;
mod nodeops;
mod ops;
pub mod placement;
mod reconcile;
mod recover;
mod rollout;
pub mod snapshot;
mod world;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tessera_backend::{Backend, BackendEvent};
use tessera_domain::Input;
use tessera_model::Fleet;
use tessera_store::{Fence, Store};
use tokio::sync::mpsc;
// Tokio's clock (the system's, unless a test pauses it): the loop's timers and its cycle
// spacing follow the same time.
use tokio::time::Instant;

use admission::Admission;
use batch::{Batch, ReplyTo};
pub use command::{
    Cmd, Forecast, GangForecast, Governance, Lifecycle, LifecycleError, MigOutcome, MigRefusal, NewRollout,
    NewWorkload, NodeOp, Settled,
};
use commit::Publication;
pub use config::{GpuFailurePolicy, LoopConfig, SchedFactory, Settings};
use consolidation::Moves;
use effects::Runner;
pub use fleetswap::FleetCell;
pub use health::{CRITICAL_XIDS, is_critical};
use health::{GpuNews, Health, HealthCtx};
use live::now_ms;
use meter::{MeterCtx, Metering};
use metering::MonthBook;
use migmode::{MigCtx, MigModes};
use nodeops::{Drains, NodeCtx};
pub use ops::FleetOps;
use placement::NodeIndex;
use reconcile::Reconciler;
pub use rollout::VALIDATE_WITHIN_MS;
use rollout::{RolloutCtx, Rollouts};
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
/// At most this many commands per batch.
const BATCH_MAX: usize = 1024;

/// The loop: the world every controller acts on, each controller with the state it owns, and
/// what the loop itself keeps (backend work in flight, the fence, a fleet to adopt).
pub(crate) struct Core {
    w: World,
    store: Arc<dyn Store>,
    /// Unhealthy GPUs, node states, rollouts and MIG modes: each controller that owns a part
    /// changes it (readers see them through `published`).
    ops: Arc<FleetOps>,
    /// What readers see: the snapshot, the records, telemetry and `ops`.
    published: Arc<Published>,
    admission: Admission,
    publication: Publication,
    health: Health,
    mig: MigModes,
    metering: Metering,
    reconciler: Reconciler,
    /// Drains in progress and services they move.
    drains: Drains,
    /// Services being moved by consolidation.
    moves: Moves,
    rollouts: Rollouts,
    runner: Runner,
    /// The leader's fence, carried by every batch (`None`: the only process on its store).
    fence: Option<Fence>,
    /// A batch was fenced: another replica leads, this loop must stop.
    fenced: bool,
    /// Commands (other than [`Cmd::Settle`]) and timer wake-ups handled so far: see
    /// [`Lifecycle::settled`].
    work: u64,
    /// A fleet the backend reported, adopted once the batch it came in is committed.
    pending_fleet: Option<Arc<Fleet>>,
    /// The dry runs' gang forecasts answered this second.
    forecasts: ForecastBudget,
}

/// At most this many dry-run gang forecasts a second ([`Cmd::GangForecast`]), and half as
/// many for one tenant: each plans a hold and trial evictions on the loop's own scheduler
/// (1–1.5 ms on 10,000 nodes), so a tenant sending dry runs as fast as its token's rate limit
/// allows could otherwise take most of the loop's time, or every other tenant's forecasts;
/// beyond it a dry run answers without saying when the gang would start.
pub(crate) const FORECASTS_PER_S: u32 = 20;

/// The forecasts answered in the current second of the loop's clock, in all and by tenant.
#[derive(Default)]
struct ForecastBudget {
    second: i64,
    used: u32,
    by_tenant: HashMap<String, u32>,
}

impl ForecastBudget {
    /// Whether another forecast for `tenant` may be made at `now` (ms), counting it if so.
    fn take(&mut self, now: i64, tenant: &str) -> bool {
        let second = now.div_euclid(1000);
        if second != self.second {
            (self.second, self.used) = (second, 0);
            self.by_tenant.clear();
        }
        let own = self.by_tenant.get(tenant).copied().unwrap_or(0);
        if self.used >= FORECASTS_PER_S || own >= FORECASTS_PER_S / 2 {
            return false;
        }
        self.used += 1;
        self.by_tenant.insert(tenant.to_string(), own + 1);
        true
    }
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
            publication: Publication::new(&fleet, cfg.store.clone(), self.published.clone()),
            w: World {
                nodes: Arc::new(NodeIndex::new(&fleet)),
                sched: (cfg.factory)(fleet.clone()),
                factory: cfg.factory.clone(),
                caps: cfg.backend.capabilities(),
                fleet,
                backend: cfg.backend.clone(),
                live: HashMap::new(),
                tenants: HashMap::new(),
                settings: cfg.settings.clone(),
                month: MonthBook::default(),
                metrics: cfg.metrics.clone(),
            },
            store: cfg.store.clone(),
            ops: Arc::default(),
            published: self.published.clone(),
            admission: Admission::new(cfg.store.clone()),
            health: Health::default(),
            mig: MigModes::default(),
            metering: Metering::default(),
            reconciler: Reconciler::default(),
            drains: Drains::default(),
            moves: Moves::default(),
            rollouts: Rollouts::default(),
            runner: Runner::new(cfg.backend.clone(), tx.clone(), cfg.metrics.clone()),
            fence,
            fenced: false,
            work: 0,
            pending_fleet: None,
            forecasts: ForecastBudget::default(),
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

/// The context the MIG-mode controller is handed, borrowed from the loop's own fields.
macro_rules! mig_ctx {
    ($core:expr) => {
        MigCtx::of(&mut $core.w, &mut $core.ops, &$core.published)
    };
}

/// The context the health controller is handed, borrowed from the loop's own fields.
macro_rules! health_ctx {
    ($core:expr) => {
        HealthCtx {
            w: &mut $core.w,
            store: &*$core.store,
            ops: &mut $core.ops,
            published: &$core.published,
        }
    };
}

/// The context the node controllers are handed, borrowed from the loop's own fields.
macro_rules! node_ctx {
    ($core:expr) => {
        NodeCtx {
            w: &mut $core.w,
            store: &*$core.store,
            ops: &mut $core.ops,
            published: &$core.published,
            health: &$core.health,
            admission: &mut $core.admission,
            moves: &mut $core.moves,
        }
    };
}

/// The context the rollout controller is handed, borrowed from the loop's own fields.
macro_rules! rollout_ctx {
    ($core:expr) => {
        RolloutCtx {
            node: node_ctx!($core),
            drains: &mut $core.drains,
            mig: &$core.mig,
            reconcile_soon: &mut $core.reconciler.soon,
        }
    };
}

impl Core {
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
            let every = if self.admission.deferred.is_empty() {
                CYCLE_EVERY
            } else {
                (cycle_cost * CYCLE_COST).min(CYCLE_EVERY)
            };
            let wait = if pending_cycle {
                every.saturating_sub(last_cycle.elapsed())
            } else {
                self.publication.wait()
            };
            let (first, ticked) = tokio::select! {
                c = rx.recv() => match c { Some(c) => (Some(c), false), None => break },
                _ = tick.tick() => (None, true),
                _ = reconcile.tick() => {
                    self.work += 1;
                    self.reconciler.start(&self.w, &mut self.runner, tx.clone());
                    continue;
                }
                _ = tokio::time::sleep(wait), if pending_cycle || self.publication.queue_dirty() => (None, false),
            };
            if first.is_none() {
                self.work += 1;
            }
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
                Metering::tick(MeterCtx::of(&mut self.w, &*self.store), now).await;
                batch.full_publish = true;
                self.node_steps(&mut batch, now).await;
            } else if std::mem::take(&mut self.rollouts.soon) {
                self.node_steps(&mut batch, now).await;
            }
            // A full pass over the queue when something changed (at most every CYCLE_EVERY, so
            // that a stream of completions cannot keep the loop re-sorting a long queue; sooner
            // when creations wait for it and cycles are cheap, see CYCLE_COST), and on the
            // tick: backfill windows, minimum runtimes and reclaim delays move with time.
            let every = if batch.undecided || !self.admission.deferred.is_empty() {
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
                self.admission
                    .on_cycle(&mut self.w, &mut self.moves, actions, &mut batch, now);
            }
            if !self.moves.is_empty() {
                self.moves
                    .step(
                        &mut self.w,
                        &*self.store,
                        &mut self.admission,
                        &mut self.drains,
                        &mut batch,
                        now,
                    )
                    .await;
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
            if std::mem::take(&mut self.reconciler.soon) {
                self.reconciler.start(&self.w, &mut self.runner, tx.clone());
            }
        }
    }

    /// The drains' and the rollouts' step (each second, and after telemetry while a rollout
    /// runs).
    async fn node_steps(&mut self, batch: &mut Batch, now: i64) {
        if !self.drains.nodes.is_empty() {
            let mut cx = node_ctx!(self);
            self.drains.drain_step(&mut cx, batch, now).await;
        }
        let mut cx = rollout_ctx!(self);
        self.rollouts.rollouts_step(&mut cx, batch, now).await;
    }

    /// Hands one command to the controller it concerns.
    async fn handle(&mut self, cmd: Cmd, batch: &mut Batch, now: i64) {
        if !matches!(cmd, Cmd::Settle(_)) {
            self.work += 1;
        }
        match cmd {
            Cmd::Create(nw, reply) => {
                self.admission
                    .on_create(&mut self.w, &mut self.moves, *nw, reply, batch, now)
                    .await
            }
            Cmd::Cancel { id, actor, reply } => {
                Admission::on_cancel(&mut self.w, &self.published, id, actor, reply, batch, now)
            }
            Cmd::Govern(g, reply) => Admission::on_govern(&mut self.w, g, reply, batch, now),
            Cmd::Backend(e) => self.on_backend(e, batch, now).await,
            // The end of a node's upgrade to the rollout controller, the others to the drains.
            Cmd::NodeOp { node, op, actor, reply } => {
                let r = if op == NodeOp::UpgradeDone {
                    let mut cx = rollout_ctx!(self);
                    self.rollouts.upgrade_done(&mut cx, &node, &actor, batch, now).await
                } else {
                    let mut cx = node_ctx!(self);
                    self.drains.node_op(&mut cx, &node, op, &actor, batch, now).await
                };
                answer_done(r, reply, batch);
            }
            Cmd::SetMigMode {
                node,
                gpu,
                enabled,
                audit,
                reply,
            } => {
                let change = migmode::ModeChange { node, gpu, enabled };
                self.mig
                    .on_set_mig_mode(&mut mig_ctx!(self), change, *audit, reply, batch, now)
                    .await
            }
            Cmd::StartRollout { spec, actor, reply } => {
                let mut cx = rollout_ctx!(self);
                self.rollouts.on_start(&mut cx, spec, &actor, reply, batch, now).await
            }
            Cmd::CancelRollout { id, actor, reply } => {
                let mut cx = rollout_ctx!(self);
                let _ = reply.send(self.rollouts.cancel_rollout(&mut cx, id, &actor, now).await);
            }
            Cmd::ClearGpu {
                node,
                gpu,
                audit,
                reply,
            } => {
                self.health
                    .on_clear(&mut health_ctx!(self), &node, gpu, *audit, reply, batch)
                    .await
            }
            Cmd::Done(id, result) => {
                self.runner.done(id);
                if let Some(soon) = news::on_done(&mut health_ctx!(self), &mut self.health, id, result, batch, now) {
                    self.reconciler.soon = soon;
                }
            }
            // Copied as the engine is now: after every committed batch (and any decisions of
            // this one before it), so at least as new as any record a reader has seen.
            Cmd::Trial(reply) => {
                let _ = reply.send(Ok(self.publication.current_trial(&self.w)));
            }
            Cmd::GangForecast(mut job, reply) => {
                let answer = if self.forecasts.take(now, &job.tenant) {
                    job.submitted_ms = now;
                    match self.w.sched.new_gang_forecast(&job, now) {
                        Some((cause, at_ms)) => Forecast::Takes(GangForecast {
                            cause,
                            at_ms,
                            in_ms: at_ms - now,
                        }),
                        None => Forecast::Never,
                    }
                } else {
                    Forecast::Unknown
                };
                let _ = reply.send(Ok(answer));
            }
            Cmd::Settle(reply) => {
                let _ = reply.send(Ok(Settled {
                    work: self.work,
                    backend_ops: self.runner.in_flight(),
                }));
            }
            Cmd::Reconciled(back) => {
                self.reconciler.finished();
                if let Ok(report) = &back.report {
                    let mut cx = mig_ctx!(self);
                    self.mig
                        .adopt_layouts(&mut cx, &report.layouts, self.reconciler.asked());
                }
                self.reconciler
                    .on_reconciled(&mut self.w, &self.runner, back, batch, now);
            }
        }
        if self.health.has_writes() {
            self.health.flush(&*self.store).await;
        }
    }

    /// Backend news: to the controller it concerns, or as input to the workload it is about.
    async fn on_backend(&mut self, e: BackendEvent, batch: &mut Batch, now: i64) {
        match e {
            BackendEvent::GpuHealth {
                node,
                gpu,
                healthy,
                xid,
                detail,
            } => {
                let news = GpuNews {
                    node: &node,
                    gpu,
                    healthy,
                    xid,
                    detail: &detail,
                };
                self.health.on_gpu_health(&mut health_ctx!(self), news, batch, now)
            }
            BackendEvent::NodeChanged { node, change } => {
                self.health
                    .on_node_changed(&mut health_ctx!(self), &node, change, batch, now)
                    .await
            }
            // Adopted after this batch is committed; a later report supersedes it.
            BackendEvent::FleetChanged { fleet } => self.pending_fleet = Some(fleet),
            BackendEvent::MigMode {
                node,
                gpu,
                enabled,
                pending,
            } => {
                let read = migmode::ModeChange { node, gpu, enabled };
                self.mig
                    .backend_mig_mode(&mut mig_ctx!(self), &read, pending, batch, now)
            }
            BackendEvent::Telemetry { at_ms, gpus } => {
                self.health.on_telemetry(&mut health_ctx!(self), &gpus, batch, now);
                self.metering
                    .on_telemetry(MeterCtx::of(&mut self.w, &*self.store), at_ms, &gpus);
                self.published.set_telemetry(Telemetry {
                    at: at_ms,
                    gpus: Arc::new(gpus),
                });
                self.rollouts.soon |= self.ops.rollouts.values().any(|r| {
                    r.state == tessera_store::RolloutState::Running || r.nodes.iter().any(|n| n.state.is_out())
                });
            }
            BackendEvent::PartitionChanged { node, gpu, instances } => {
                tracing::debug!(%node, gpu, instances = instances.len(), "MIG layout applied");
                self.mig
                    .adopt_layouts(&mut mig_ctx!(self), &[(node, gpu, instances)], now_ms());
            }
            e => news::on_event(&mut self.w, e, batch, now),
        }
    }

    /// Commits the batch (see [`commit`]); a batch the store refused rebuilds memory from the
    /// store, or stops the loop when another replica leads.
    async fn commit(&mut self, batch: Batch, now: i64) {
        let stored = self
            .publication
            .commit(
                &mut self.w,
                &mut self.runner,
                self.fence.as_ref(),
                &mut self.admission.deferred,
                batch,
                now,
            )
            .await;
        match stored {
            Ok(()) => {}
            // Another replica leads: nothing to rebuild, this loop stops.
            Err(tessera_store::StoreError::Fenced(_)) => self.fenced = true,
            // Memory must not run ahead of the store: rebuild it from what is durable.
            Err(_) => {
                self.recover_until_done("cannot rebuild state from the store; retrying")
                    .await;
            }
        }
    }

    /// Rebuilds every controller's state from the store (see [`recover`]).
    async fn recover(&mut self) -> Result<(), tessera_store::StoreError> {
        recover::Rebuild {
            w: &mut self.w,
            store: &self.store,
            ops: &mut self.ops,
            published: &self.published,
            admission: &mut self.admission,
            publication: &mut self.publication,
            health: &self.health,
            mig: &mut self.mig,
            drains: &mut self.drains,
            moves: &mut self.moves,
            runner: &mut self.runner,
            fence: self.fence.as_ref(),
        }
        .run()
        .await
    }

    /// Rebuilds the loop's state from the store ([`Core::recover`]), retrying with backoff
    /// until it succeeds; `false` (and the loop marked fenced) when another replica leads.
    async fn recover_until_done(&mut self, failing: &str) -> bool {
        let mut delay = Duration::from_millis(100);
        loop {
            match self.recover().await {
                Ok(()) => return true,
                Err(tessera_store::StoreError::Fenced(_)) => {
                    self.fenced = true;
                    return false;
                }
                Err(e) => {
                    tracing::error!(error = %e, "{failing}");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(10));
                }
            }
        }
    }

    /// Takes `fleet` as the loop's fleet (see [`fleetswap`]). Called between batches.
    async fn adopt_fleet(&mut self, fleet: Arc<Fleet>, now: i64) {
        if *fleet == *self.w.fleet {
            return;
        }
        // Work on a node that left holds capacity the new fleet does not have: lost, as when
        // its pods are.
        let gone = fleetswap::departed(&self.w.fleet, &fleet);
        let lost = self.w.lost_on(&gone);
        if !lost.is_empty() {
            let mut batch = Batch::default();
            for (id, node) in lost {
                let detail = format!("node {node} left the cluster ({} backend)", self.w.backend.name());
                self.w.apply(id, Input::Lost { at: now, detail }, &mut batch, now);
            }
            self.commit(batch, now).await;
            if self.fenced {
                return;
            }
        }
        tracing::info!(
            nodes = fleet.nodes.len(),
            gpus = fleet.gpu_count(),
            departed = gone.len(),
            "adopting the fleet the backend reports; rebuilding the engine from the store"
        );
        self.w.fleet = fleet;
        self.w.nodes = Arc::new(NodeIndex::new(&self.w.fleet));
        self.publication.reset(Some(&self.w.fleet));
        self.mig.forget_nodes(&gone);
        if !self
            .recover_until_done("cannot rebuild state on the new fleet; retrying")
            .await
        {
            return;
        }
        self.publication.mark_dirty();
    }
}

/// Answers an operation whose success is stored with the batch (and publishes in full).
fn answer_done(r: Result<(), LifecycleError>, reply: command::Reply<()>, batch: &mut Batch) {
    match r {
        Ok(()) => {
            batch.full_publish = true;
            batch.reply(ReplyTo::Done(reply));
        }
        Err(e) => {
            let _ = reply.send(Err(e));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{FORECASTS_PER_S, ForecastBudget};

    #[test]
    fn forecasts_are_bounded_per_second_in_all_and_per_tenant() {
        let mut b = ForecastBudget::default();
        let taken = |b: &mut ForecastBudget, now: i64, tenant: &str| (0..50).filter(|_| b.take(now, tenant)).count();
        // One tenant gets half the second's budget; others the rest, no more in all.
        assert_eq!(taken(&mut b, 1_000, "nlp"), FORECASTS_PER_S as usize / 2);
        assert_eq!(taken(&mut b, 1_500, "vision"), FORECASTS_PER_S as usize / 2);
        assert_eq!(taken(&mut b, 1_999, "audio"), 0, "the second's budget is spent");
        // A new second, a new budget.
        assert_eq!(taken(&mut b, 2_000, "audio"), FORECASTS_PER_S as usize / 2);
        assert_eq!(taken(&mut b, 2_001, "nlp"), FORECASTS_PER_S as usize / 2);
    }
}
