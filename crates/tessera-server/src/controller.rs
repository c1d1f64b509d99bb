//! The lifecycle loop: one task owns the scheduler (quotas, queue, preemption and the placement
//! engine) and every live workload, and walks each request through its steps — requested →
//! authorised → placed → partitioned → running → observed → metered → released — recording
//! every step.
//!
//! Commands (API calls, backend news, a one-second tick) arrive on a channel and are handled in
//! batches: the batch's state changes, with their events and usage intervals, are committed in
//! one store transaction, and only then are callers answered and backend work started (group
//! commit). If a commit fails, the loop's memory is rebuilt from the store, so memory never
//! runs ahead of what is durable. At start-up the state is rebuilt the same way: allocations are
//! re-applied (double booking is refused), running workloads are reconciled with the backend,
//! and placed or stopping ones are driven on.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tessera_api::{
    AllocationView, CreateWorkload, GpuShape, Workload, WorkloadKind, WorkloadState, month_start_ms, rfc3339_ms,
};
use tessera_backend::{Backend, BackendEvent, RunSpec, Slice, Status};
use tessera_model::{Fleet, GpuUnits, NodeId, Request, Sharing, TenantId};
use tessera_sched::cycle::{Decision, Job, Quota, Scheduler};
use tessera_sched::reason::Refusal;
use tessera_sched::{Allocation, Grant};
use tessera_store::{Change, NewEvent, Store, UsageInterval};
use tokio::sync::{mpsc, oneshot};

use crate::now_ms;
use crate::problem::{ApiError, ApiResult};

/// Priority classes, most important first (`critical` is never preempted).
pub const PRIORITY_CLASSES: [&str; 4] = ["critical", "high", "standard", "opportunistic"];

/// Workloads readers may see without asking the loop: every live one and the most recently
/// ended ones.
#[derive(Default)]
pub struct WorkloadCache {
    map: HashMap<u64, Arc<Workload>>,
    ended: VecDeque<u64>,
}

const ENDED_KEPT: usize = 20_000;

/// Shortest interval between two full scheduling passes triggered by changes.
const CYCLE_EVERY: Duration = Duration::from_millis(50);

impl WorkloadCache {
    pub fn get(&self, id: u64) -> Option<Arc<Workload>> {
        self.map.get(&id).cloned()
    }

    fn put(&mut self, w: &Workload) {
        if w.state.is_terminal() && !self.map.get(&w.id).is_some_and(|o| o.state.is_terminal()) {
            self.ended.push_back(w.id);
            while self.ended.len() > ENDED_KEPT {
                if let Some(old) = self.ended.pop_front() {
                    self.map.remove(&old);
                }
            }
        }
        self.map.insert(w.id, Arc::new(w.clone()));
    }

    fn clear(&mut self) {
        self.map.clear();
        self.ended.clear();
    }
}

/// A validated creation request.
pub struct NewWorkload {
    pub spec: CreateWorkload,
    pub request: Request,
    pub units: GpuUnits,
    pub actor: String,
    pub role: String,
    pub idempotency: Option<(String, String)>,
    pub received_at: i64,
}

/// A change to a tenant's quota or budget.
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

/// What the loop can be asked.
pub enum Cmd {
    Create(Box<NewWorkload>, oneshot::Sender<ApiResult<(Workload, bool)>>),
    Cancel {
        id: u64,
        actor: String,
        reply: oneshot::Sender<ApiResult<Workload>>,
    },
    Govern(Governance, oneshot::Sender<()>),
    Launched {
        id: u64,
        partitioned_at: i64,
        partition: String,
        running_at: i64,
        observed: String,
    },
    LaunchFailed {
        id: u64,
        at: i64,
        detail: String,
    },
    Stopped {
        id: u64,
        at: i64,
    },
    Exited {
        id: u64,
        at: i64,
        success: bool,
        detail: String,
    },
    View(Box<dyn FnOnce(&ViewCtx) + Send>),
}

/// Read-only access to the loop's state for views.
pub struct ViewCtx<'a> {
    pub fleet: &'a Fleet,
    pub sched: &'a Scheduler,
    pub workloads: &'a HashMap<u64, Live>,
    pub now: i64,
}

/// A live (non-terminal) workload.
#[derive(Clone)]
pub struct Live {
    pub wl: Workload,
    /// The stable code of `wl.reason` while it waits (`Wait::code`, or `requeued`), for metrics.
    pub reason_code: Option<&'static str>,
    pub request: Request,
    next_seq: u32,
    usage_seq: u32,
    usage_open: bool,
    /// Set while being stopped for a preemption: by whom and why.
    preempted_by: Option<String>,
    requeue: bool,
    no_wait: bool,
    /// Measured utilisation: Σ util × ms and the ms sampled, since the interval opened.
    util: (f64, f64),
}

impl Live {
    /// Average measured utilisation since the usage interval opened, if sampled.
    pub fn utilisation(&self) -> Option<f64> {
        (self.util.1 > 0.0).then(|| self.util.0 / self.util.1)
    }
}

/// The handle API handlers use.
#[derive(Clone)]
pub struct Controller {
    tx: mpsc::Sender<Cmd>,
    pub cache: Arc<RwLock<WorkloadCache>>,
}

impl Controller {
    pub async fn send(&self, cmd: Cmd) -> ApiResult<()> {
        self.tx
            .send(cmd)
            .await
            .map_err(|_| ApiError::unavailable("the lifecycle loop has stopped"))
    }

    pub async fn view<T: Send + 'static>(&self, f: impl FnOnce(&ViewCtx) -> T + Send + 'static) -> ApiResult<T> {
        let (tx, rx) = oneshot::channel();
        self.send(Cmd::View(Box::new(move |ctx| {
            let _ = tx.send(f(ctx));
        })))
        .await?;
        rx.await
            .map_err(|_| ApiError::unavailable("the lifecycle loop has stopped"))
    }

    pub async fn govern(&self, g: Governance) -> ApiResult<()> {
        let (tx, rx) = oneshot::channel();
        self.send(Cmd::Govern(g, tx)).await?;
        rx.await
            .map_err(|_| ApiError::unavailable("the lifecycle loop has stopped"))
    }
}

enum Spawn {
    Launch(RunSpec),
    Stop(RunSpec),
    Unpartition(RunSpec),
}

enum Reply {
    Created(
        oneshot::Sender<ApiResult<(Workload, bool)>>,
        ApiResult<(Workload, bool)>,
    ),
    Cancelled(oneshot::Sender<ApiResult<Workload>>, ApiResult<Workload>),
}

#[derive(Default)]
struct Batch {
    changes: Vec<Change>,
    replies: Vec<Reply>,
    spawns: Vec<Spawn>,
    idempotency: HashMap<(String, String), (String, u64)>,
}

/// Builds a fresh scheduler (at start-up and after a failed commit).
pub type SchedFactory = Arc<dyn Fn() -> Scheduler + Send + Sync>;

pub struct Actor {
    fleet: Arc<Fleet>,
    sched: Scheduler,
    factory: SchedFactory,
    store: Store,
    backend: Arc<dyn Backend>,
    live: HashMap<u64, Live>,
    cache: Arc<RwLock<WorkloadCache>>,
    tenants: HashMap<String, u32>,
    next_id: u64,
    tx: mpsc::Sender<Cmd>,
    grace: Duration,
    /// GPU-unit-hours of closed intervals this month, per tenant, and the month they are for.
    month_closed: HashMap<String, f64>,
    month_start: i64,
    last_sample: i64,
    /// Counters and histograms updated where things happen (see `metrics.rs`).
    metrics: Arc<crate::metrics::Metrics>,
}

pub fn units_label(u: GpuUnits) -> String {
    u.to_string()
}

impl Actor {
    /// Rebuilds the loop's state from the store and starts it. Returns the handle.
    pub async fn start(
        fleet: Arc<Fleet>,
        factory: SchedFactory,
        store: Store,
        backend: Arc<dyn Backend>,
        grace: Duration,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Result<Controller, ApiError> {
        let (tx, rx) = mpsc::channel(8192);
        let cache = Arc::new(RwLock::new(WorkloadCache::default()));
        let mut actor = Actor {
            fleet,
            sched: factory(),
            factory,
            backend: backend.clone(),
            live: HashMap::new(),
            cache: cache.clone(),
            tenants: HashMap::new(),
            next_id: 1,
            tx: tx.clone(),
            grace,
            month_closed: HashMap::new(),
            month_start: 0,
            last_sample: now_ms(),
            store,
            metrics,
        };
        actor.recover().await?;
        if let Some(mut events) = backend.take_events() {
            let tx = tx.clone();
            tokio::spawn(async move {
                while let Some(BackendEvent::Exited { id, success, detail }) = events.recv().await {
                    if tx
                        .send(Cmd::Exited {
                            id,
                            at: now_ms(),
                            success,
                            detail,
                        })
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            });
        }
        tokio::spawn(actor.run(rx));
        Ok(Controller { tx, cache })
    }

    fn tenant_id(&mut self, name: &str) -> TenantId {
        let n = self.tenants.len() as u32;
        TenantId(*self.tenants.entry(name.to_string()).or_insert(n))
    }

    fn job_of(&self, live: &Live) -> Job {
        Job {
            id: live.wl.id,
            tenant: live.wl.tenant.clone(),
            project: live.wl.project.clone(),
            request: live.request.clone(),
            priority: live.wl.priority.clone(),
            submitted_ms: live.wl.created_at_ms,
            wait_if_over_limit: !live.no_wait,
        }
    }

    /// (Re)builds every piece of in-memory state from the store.
    async fn recover(&mut self) -> Result<(), ApiError> {
        self.sched = (self.factory)();
        self.live.clear();
        self.cache.write().expect("lock").clear();
        self.next_id = self.store.max_workload_id().await? + 1;
        for q in self.store.quotas().await? {
            let quota = Quota {
                guaranteed: GpuUnits(q.guaranteed_milli),
                limit: q.limit_milli.map(GpuUnits),
            };
            self.sched.set_quota(&q.tenant, &q.class, Some(quota));
        }
        for (t, b) in self.store.budgets().await? {
            self.sched.set_budget(&t, Some(b));
        }
        self.refresh_month(now_ms()).await?;
        let active = self.store.active_workloads().await?;
        let seqs = self.store.sequences().await?;
        let mut batch = Batch::default();
        let mut to_reconcile = Vec::new();
        for wl in active {
            let (next_seq, usage_seq) = seqs.get(&wl.id).copied().unwrap_or((0, 0));
            let tenant = self.tenant_id(&wl.tenant);
            let usage_open =
                wl.running_at_ms.is_some() && matches!(wl.state, WorkloadState::Running | WorkloadState::Stopping);
            // The open interval is the last one recorded.
            let usage_seq = if usage_open {
                usage_seq.saturating_sub(1)
            } else {
                usage_seq
            };
            let request =
                shape_request(&self.fleet, &wl.shape, wl.cpu_milli, wl.memory_mib).map(|r| r.with_tenant(tenant));
            let mut live = Live {
                request: request
                    .clone()
                    .unwrap_or_else(|_| Request::new(tessera_model::Shape::CpuOnly)),
                requeue: wl.kind == WorkloadKind::Batch,
                wl,
                reason_code: None,
                next_seq,
                usage_seq,
                usage_open,
                preempted_by: None,
                no_wait: false,
                util: (0.0, 0.0),
            };
            if let Err(e) = request {
                tracing::error!(id = live.wl.id, error = %e.detail, "stored workload no longer fits the fleet description");
                live.wl.allocation = None;
                let reason = format!("no longer valid on this fleet: {}", e.detail);
                self.finish(&mut live, WorkloadState::Failed, now_ms(), Some(reason), &mut batch);
                continue;
            }
            let state = live.wl.state;
            if state.holds_capacity() {
                let job = self.job_of(&live);
                let restored = live
                    .wl
                    .allocation
                    .as_ref()
                    .ok_or_else(|| "no allocation recorded".to_string())
                    .and_then(|a| allocation_from_view(&self.fleet, live.wl.id, a, &live.wl, tenant))
                    .and_then(|a| {
                        let since = live.wl.running_at_ms.unwrap_or(live.wl.created_at_ms);
                        self.sched.restore(&job, a, live.wl.borrowing, since)
                    });
                if let Err(e) = restored {
                    tracing::error!(id = live.wl.id, error = %e, "cannot re-apply allocation");
                    live.wl.allocation = None;
                    let reason = format!("allocation could not be restored: {e}");
                    self.finish(&mut live, WorkloadState::Failed, now_ms(), Some(reason), &mut batch);
                    continue;
                }
                if state == WorkloadState::Stopping {
                    self.sched.stopping(live.wl.id);
                }
            }
            match state {
                WorkloadState::Pending | WorkloadState::Queued => self.sched.enqueue(self.job_of(&live)),
                WorkloadState::Placed => batch.spawns.push(Spawn::Launch(self.run_spec(&live))),
                WorkloadState::Stopping => batch.spawns.push(Spawn::Stop(self.run_spec(&live))),
                WorkloadState::Running => to_reconcile.push(self.run_spec(&live)),
                _ => {}
            }
            self.live.insert(live.wl.id, live);
        }
        if !to_reconcile.is_empty() {
            let statuses = self.backend.reconcile(&to_reconcile).await;
            for (id, status) in statuses {
                let Some(mut live) = self.live.remove(&id) else {
                    continue;
                };
                let now = now_ms();
                match status {
                    Status::Running => {
                        self.live.insert(id, live);
                        continue;
                    }
                    Status::Succeeded => self.finish(&mut live, WorkloadState::Succeeded, now, None, &mut batch),
                    Status::Failed | Status::Unknown => {
                        let reason = format!(
                            "the {} backend no longer knows this workload after a control-plane restart",
                            self.backend.name()
                        );
                        self.finish(&mut live, WorkloadState::Failed, now, Some(reason), &mut batch)
                    }
                }
            }
        }
        self.store.apply(&batch.changes).await?;
        {
            let mut c = self.cache.write().expect("lock");
            for l in self.live.values() {
                c.put(&l.wl);
            }
            for ch in &batch.changes {
                if let Change::Update { workload, .. } = ch {
                    c.put(workload);
                }
            }
        }
        self.spawn_all(batch.spawns);
        tracing::info!(
            live = self.live.len(),
            queued = self.sched.queued(),
            "lifecycle state rebuilt from the store"
        );
        Ok(())
    }

    /// Loads this month's closed usage per tenant when the month changes.
    async fn refresh_month(&mut self, now: i64) -> Result<(), ApiError> {
        let start = month_start_ms(now);
        if start == self.month_start {
            return Ok(());
        }
        self.month_start = start;
        self.month_closed.clear();
        for u in self.store.usage_between(None, start, now + 1).await? {
            if let Some(end) = u.ended_at {
                let ms = (end.min(now) - u.started_at.max(start)).max(0) as f64;
                *self.month_closed.entry(u.tenant.clone()).or_default() +=
                    u.units_milli as f64 / 1000.0 * ms / 3_600_000.0;
            }
        }
        Ok(())
    }

    /// GPU-unit-hours a tenant has used this month: closed intervals plus running work so far.
    fn month_spent(&self, tenant: &str, now: i64) -> f64 {
        let running: f64 = self
            .live
            .values()
            .filter(|l| l.wl.tenant == tenant && l.usage_open)
            .map(|l| {
                let since = l.wl.running_at_ms.unwrap_or(now).max(self.month_start);
                let units = l.wl.allocation.as_ref().map(|a| a.units_milli).unwrap_or(0) as f64 / 1000.0;
                units * (now - since).max(0) as f64 / 3_600_000.0
            })
            .sum();
        self.month_closed.get(tenant).copied().unwrap_or(0.0) + running
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Cmd>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut last_cycle = std::time::Instant::now() - CYCLE_EVERY;
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let pending_cycle = self.sched.needs_cycle();
            let wait = CYCLE_EVERY.saturating_sub(last_cycle.elapsed());
            let (first, ticked) = tokio::select! {
                c = rx.recv() => match c { Some(c) => (Some(c), false), None => break },
                _ = tick.tick() => (None, true),
                _ = tokio::time::sleep(wait), if pending_cycle => (None, false),
            };
            let mut batch = Batch::default();
            let mut views = Vec::new();
            let mut n = 0;
            let mut next = first;
            loop {
                if let Some(cmd) = next.take() {
                    match cmd {
                        Cmd::View(f) => views.push(f),
                        other => self.handle(other, &mut batch).await,
                    }
                    n += 1;
                }
                if n >= 1024 {
                    break;
                }
                match rx.try_recv() {
                    Ok(c) => next = Some(c),
                    Err(_) => break,
                }
            }
            let now = now_ms();
            if ticked {
                if let Err(e) = self.refresh_month(now).await {
                    tracing::warn!(error = %e.detail, "cannot refresh the month's usage");
                }
                self.sample_utilisation(now);
                self.update_budgets(now);
            }
            // A full pass over the queue when something changed, and on the tick (backfill
            // windows, minimum runtimes and reclaim delays move with time).
            // Full passes are at most every CYCLE_EVERY under load, so that a stream of
            // completions cannot keep the loop busy re-sorting a long queue.
            if ticked || (self.sched.needs_cycle() && last_cycle.elapsed() >= CYCLE_EVERY) {
                last_cycle = std::time::Instant::now();
                let t0 = std::time::Instant::now();
                let actions = self.sched.cycle(now);
                self.metrics.scheduler_cycle(t0.elapsed()); // metrics
                self.apply(actions, now, &mut batch);
            }
            self.commit(batch).await;
            let ctx = ViewCtx {
                fleet: &self.fleet,
                sched: &self.sched,
                workloads: &self.live,
                now,
            };
            for f in views {
                f(&ctx);
            }
        }
    }

    fn update_budgets(&mut self, now: i64) {
        let mut tenants: Vec<String> = self
            .live
            .values()
            .map(|l| l.wl.tenant.clone())
            .filter(|t| self.sched.budget(t).is_some())
            .collect();
        tenants.sort_unstable();
        tenants.dedup();
        for t in tenants {
            let spent = self.month_spent(&t, now);
            self.sched.set_spent(&t, spent);
        }
    }

    /// Accumulates measured utilisation of running workloads from backend telemetry.
    fn sample_utilisation(&mut self, now: i64) {
        let dt = (now - self.last_sample).clamp(0, 10_000) as f64;
        self.last_sample = now;
        if dt == 0.0 {
            return;
        }
        let st = self.sched.engine.state();
        for s in self.backend.telemetry() {
            let Some(n) = self.fleet.node_by_name(&s.node) else {
                continue;
            };
            let Some(g) = st.nodes.get(n.0 as usize).and_then(|ns| ns.gpus.get(s.gpu as usize)) else {
                continue;
            };
            for h in &g.holders {
                let util = match s.instances.iter().find(|i| i.workload == *h) {
                    Some(i) => i.gr_engine_active,
                    None => s.util_pct / 100.0,
                };
                if let Some(l) = self.live.get_mut(h)
                    && l.usage_open
                {
                    l.util.0 += util * dt;
                    l.util.1 += dt;
                    self.metrics.meter(&l.wl, util, dt); // metrics
                }
            }
        }
    }

    async fn commit(&mut self, mut batch: Batch) {
        let t0 = std::time::Instant::now();
        let applied = self.store.apply(&batch.changes).await;
        if !batch.changes.is_empty() {
            self.metrics.store_commit(t0.elapsed(), applied.is_ok()); // metrics
        }
        match applied {
            Ok(()) => {
                {
                    let mut c = self.cache.write().expect("lock");
                    for ch in &batch.changes {
                        match ch {
                            Change::Insert { workload, .. } | Change::Update { workload, .. } => c.put(workload),
                            _ => {}
                        }
                    }
                }
                for r in batch.replies {
                    match r {
                        Reply::Created(tx, v) => {
                            let _ = tx.send(v);
                        }
                        Reply::Cancelled(tx, v) => {
                            let _ = tx.send(v);
                        }
                    }
                }
                self.spawn_all(std::mem::take(&mut batch.spawns));
            }
            Err(e) => {
                tracing::error!(error = %e, changes = batch.changes.len(), "commit failed; rebuilding state from the store");
                for r in batch.replies {
                    let err = ApiError::unavailable(
                        "the store could not record the change; nothing was changed, retry shortly",
                    );
                    match r {
                        Reply::Created(tx, _) => {
                            let _ = tx.send(Err(err));
                        }
                        Reply::Cancelled(tx, _) => {
                            let _ = tx.send(Err(err));
                        }
                    }
                }
                // Memory must not run ahead of the store: rebuild it from what is durable.
                let mut delay = Duration::from_millis(100);
                while let Err(e) = self.recover().await {
                    tracing::error!(error = %e.detail, "cannot rebuild state from the store; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(10));
                }
            }
        }
    }

    fn spawn_all(&self, spawns: Vec<Spawn>) {
        for s in spawns {
            let backend = self.backend.clone();
            let tx = self.tx.clone();
            let grace = self.grace;
            let metrics = self.metrics.clone();
            tokio::spawn(async move {
                let t0 = std::time::Instant::now();
                let cmd = match s {
                    Spawn::Launch(spec) => match backend.partition(&spec).await.inspect_err(|e| {
                        metrics.backend_error("partition", e); // metrics
                    }) {
                        Err(e) => Cmd::LaunchFailed {
                            id: spec.id,
                            at: now_ms(),
                            detail: format!("partitioning failed: {e}"),
                        },
                        Ok(partition) => {
                            let partitioned_at = now_ms();
                            metrics.step_elapsed("partition", t0.elapsed()); // metrics
                            let t1 = std::time::Instant::now();
                            match backend.start(&spec).await.inspect_err(|e| {
                                metrics.backend_error("start", e); // metrics
                            }) {
                                Err(e) => Cmd::LaunchFailed {
                                    id: spec.id,
                                    at: now_ms(),
                                    detail: format!("start failed: {e}"),
                                },
                                Ok(()) => {
                                    let running_at = now_ms();
                                    metrics.step_elapsed("start", t1.elapsed()); // metrics
                                    let observed = observe(&*backend, &spec);
                                    Cmd::Launched {
                                        id: spec.id,
                                        partitioned_at,
                                        partition,
                                        running_at,
                                        observed,
                                    }
                                }
                            }
                        }
                    },
                    Spawn::Stop(spec) => {
                        if let Err(e) = backend.stop(spec.id, grace).await {
                            metrics.backend_error("stop", &e); // metrics
                            tracing::warn!(id = spec.id, error = %e, "stop failed; treating as stopped");
                        }
                        metrics.step_elapsed("stop", t0.elapsed()); // metrics
                        let _ = backend.unpartition(&spec).await;
                        Cmd::Stopped {
                            id: spec.id,
                            at: now_ms(),
                        }
                    }
                    Spawn::Unpartition(spec) => {
                        if let Err(e) = backend.unpartition(&spec).await {
                            metrics.backend_error("unpartition", &e); // metrics
                            tracing::warn!(id = spec.id, error = %e, "unpartition failed");
                        }
                        return;
                    }
                };
                let _ = tx.send(cmd).await;
            });
        }
    }

    fn event(live: &mut Live, step: &'static str, at: i64, detail: String) -> NewEvent {
        let e = NewEvent {
            seq: live.next_seq,
            step,
            at,
            detail,
        };
        live.next_seq += 1;
        e
    }

    fn run_spec(&self, live: &Live) -> RunSpec {
        let a = live
            .wl
            .allocation
            .as_ref()
            .expect("a placed workload has an allocation");
        let model = self.fleet.catalogue.find(&a.model).map(|m| self.fleet.catalogue.get(m));
        let slice = match a.kind.as_str() {
            "mig" => Slice::Mig {
                profile: a.mig_profile.clone().unwrap_or_default(),
                profile_id: a.mig_profile_id.unwrap_or(0),
                start: a.mig_start.unwrap_or(0),
                size: a.mig_size.unwrap_or(0),
                units_milli: a.units_milli,
            },
            "fraction" => Slice::Fraction {
                milli: a.milli.unwrap_or(0),
                memory_mib: a.gpu_memory_mib.unwrap_or(0),
            },
            "cpu" => Slice::CpuOnly,
            _ => Slice::Whole,
        };
        RunSpec {
            id: live.wl.id,
            node: a.node.clone(),
            model: a.model.clone(),
            model_memory_mib: model.map(|m| m.memory_mib).unwrap_or(0),
            gpus: a.gpus.clone(),
            slice,
            duration: live.wl.duration_s.map(|s| Duration::from_secs(s.max(0) as u64)),
            running_since_ms: live.wl.running_at_ms,
            command: live.wl.command.clone(),
            image: live.wl.image.clone(),
        }
    }

    /// Returns a live workload's capacity (if held) and closes its usage interval; pushes the
    /// `released` event. Does not change its state.
    fn release(&mut self, live: &mut Live, at: i64, events: &mut Vec<NewEvent>, batch: &mut Batch) {
        if let Some(a) = self.sched.release(live.wl.id, at) {
            let held_ms = live.wl.running_at_ms.map(|r| (at - r).max(0)).unwrap_or(0);
            let unit_hours = a.units.as_f64() * held_ms as f64 / 3_600_000.0;
            events.push(Self::event(
                live,
                "released",
                at,
                format!(
                    "returned {} GPU units on {}; held {:.1} s ({unit_hours:.4} GPU-unit-hours)",
                    a.units,
                    self.fleet.node(a.node).name,
                    held_ms as f64 / 1000.0
                ),
            ));
            // A stopped workload was unpartitioned by its stop task already.
            if live.wl.allocation.is_some() && live.wl.state != WorkloadState::Stopping {
                batch.spawns.push(Spawn::Unpartition(self.run_spec(live)));
            }
        }
        if live.usage_open {
            let util_avg = (live.util.1 > 0.0).then(|| live.util.0 / live.util.1);
            batch.changes.push(Change::CloseUsage {
                workload_id: live.wl.id,
                seq: live.usage_seq,
                ended_at: at,
                util_avg,
            });
            if let (Some(a), Some(r)) = (&live.wl.allocation, live.wl.running_at_ms) {
                let ms = (at - r.max(self.month_start)).max(0) as f64;
                *self.month_closed.entry(live.wl.tenant.clone()).or_default() +=
                    a.units_milli as f64 / 1000.0 * ms / 3_600_000.0;
            }
            live.usage_seq += 1;
            live.usage_open = false;
            live.util = (0.0, 0.0);
        }
    }

    /// Moves a live workload to a terminal state: releases its capacity, closes its usage
    /// interval, records the events, and drops it from the live set.
    fn finish(&mut self, live: &mut Live, state: WorkloadState, at: i64, reason: Option<String>, batch: &mut Batch) {
        let mut events = Vec::new();
        match state {
            WorkloadState::Failed => events.push(Self::event(live, "failed", at, reason.clone().unwrap_or_default())),
            WorkloadState::Cancelled if !live.wl.state.holds_capacity() => {
                events.push(Self::event(live, "cancelled", at, reason.clone().unwrap_or_default()))
            }
            _ => {}
        }
        self.release(live, at, &mut events, batch);
        self.sched.dequeue(live.wl.id);
        self.metrics.ended(state); // metrics
        live.wl.state = state;
        live.wl.reason = reason;
        live.wl.ended_at = Some(rfc3339_ms(at));
        self.live.remove(&live.wl.id);
        batch.changes.push(Change::Update {
            workload: Box::new(live.wl.clone()),
            events,
        });
    }

    /// Turns the scheduler's decisions into state changes, events and backend work.
    fn apply(&mut self, actions: Vec<Decision>, now: i64, batch: &mut Batch) {
        for a in actions {
            match a {
                Decision::Placed { id, alloc, borrowing } => {
                    let Some(mut live) = self.live.get(&id).cloned() else {
                        tracing::error!(id, "placed a workload the loop does not know; releasing");
                        self.sched.release(id, now);
                        continue;
                    };
                    let view = allocation_view(&self.fleet, &alloc);
                    let mut detail = format!(
                        "{} on {} ({}), {} GPU units",
                        describe_alloc(&view),
                        view.node,
                        view.pool,
                        alloc.units
                    );
                    if borrowing {
                        detail.push_str("; borrowing idle capacity above the tenant's guaranteed share (preemptible)");
                    }
                    self.metrics.step("place", now - live.wl.created_at_ms); // metrics
                    live.wl.allocation = Some(view);
                    live.wl.state = WorkloadState::Placed;
                    live.wl.reason = None;
                    live.reason_code = None;
                    live.wl.borrowing = borrowing;
                    let e = Self::event(&mut live, "placed", now, detail);
                    batch.spawns.push(Spawn::Launch(self.run_spec(&live)));
                    batch.changes.push(Change::Update {
                        workload: Box::new(live.wl.clone()),
                        events: vec![e],
                    });
                    self.live.insert(id, live);
                }
                Decision::Waiting { id, reason } => {
                    let Some(mut live) = self.live.get(&id).cloned() else {
                        continue;
                    };
                    let e = Self::event(&mut live, "queued", now, reason.to_string());
                    live.wl.state = WorkloadState::Queued;
                    live.wl.reason = Some(reason.to_string());
                    live.reason_code = Some(reason.code());
                    batch.changes.push(Change::Update {
                        workload: Box::new(live.wl.clone()),
                        events: vec![e],
                    });
                    self.live.insert(id, live);
                }
                Decision::Refused { id, reason } => {
                    let Some(mut live) = self.live.get(&id).cloned() else {
                        continue;
                    };
                    self.metrics.refused(&reason); // metrics
                    self.finish(
                        &mut live,
                        WorkloadState::Failed,
                        now,
                        Some(format!("refused: {reason}")),
                        batch,
                    );
                }
                Decision::Preempt { victim, by, cause } => {
                    let Some(mut live) = self.live.get(&victim).cloned() else {
                        continue;
                    };
                    if !matches!(live.wl.state, WorkloadState::Placed | WorkloadState::Running) {
                        continue;
                    }
                    self.metrics.preempted(&cause); // metrics
                    let e = Self::event(
                        &mut live,
                        "preempted",
                        now,
                        format!(
                            "preempted by workload {by}: {cause}; stopping within {} s",
                            self.grace.as_secs()
                        ),
                    );
                    live.preempted_by = Some(format!("preempted by workload {by}: {cause}"));
                    live.wl.state = WorkloadState::Stopping;
                    batch.spawns.push(Spawn::Stop(self.run_spec(&live)));
                    batch.changes.push(Change::Update {
                        workload: Box::new(live.wl.clone()),
                        events: vec![e],
                    });
                    self.live.insert(victim, live);
                    if let Some(mut p) = self.live.get(&by).cloned() {
                        let e = Self::event(&mut p, "queued", now, format!("preempting workload {victim}: {cause}"));
                        batch.changes.push(Change::Update {
                            workload: Box::new(p.wl.clone()),
                            events: vec![e],
                        });
                        self.live.insert(by, p);
                    }
                }
            }
        }
    }

    async fn handle(&mut self, cmd: Cmd, batch: &mut Batch) {
        let now = now_ms();
        match cmd {
            Cmd::Create(nw, reply) => match self.create(*nw, now, batch).await {
                Ok(Some(v)) => batch.replies.push(Reply::Created(reply, Ok(v))),
                Ok(None) => {}
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            Cmd::Govern(g, reply) => {
                match g {
                    Governance::Quota { tenant, class, quota } => self.sched.set_quota(&tenant, &class, quota),
                    Governance::Budget { tenant, unit_hours } => {
                        self.sched.set_budget(&tenant, unit_hours);
                        let spent = self.month_spent(&tenant, now);
                        self.sched.set_spent(&tenant, spent);
                    }
                }
                let _ = reply.send(());
            }
            Cmd::Cancel { id, actor, reply } => {
                let Some(mut live) = self.live.get(&id).cloned() else {
                    let _ = reply.send(Err(ApiError::conflict(format!("workload {id} has already ended"))));
                    return;
                };
                match live.wl.state {
                    WorkloadState::Pending | WorkloadState::Queued => {
                        let reason = format!("cancelled by {actor} before it was placed");
                        self.finish(&mut live, WorkloadState::Cancelled, now, Some(reason), batch);
                    }
                    WorkloadState::Placed | WorkloadState::Running => {
                        let detail = format!("cancelled by {actor}; stopping within {} s", self.grace.as_secs());
                        let e = Self::event(&mut live, "cancelled", now, detail);
                        batch.spawns.push(Spawn::Stop(self.run_spec(&live)));
                        self.sched.stopping(id);
                        live.wl.state = WorkloadState::Stopping;
                        batch.changes.push(Change::Update {
                            workload: Box::new(live.wl.clone()),
                            events: vec![e],
                        });
                        self.live.insert(id, live.clone());
                    }
                    _ => {}
                }
                batch.replies.push(Reply::Cancelled(reply, Ok(live.wl)));
            }
            Cmd::Launched {
                id,
                partitioned_at,
                partition,
                running_at,
                observed,
            } => {
                let Some(mut live) = self.live.get(&id).cloned() else {
                    return;
                };
                if live.wl.state != WorkloadState::Placed {
                    return;
                }
                let a = live.wl.allocation.clone().expect("placed workloads have an allocation");
                let mut events = vec![
                    Self::event(&mut live, "partitioned", partitioned_at, partition),
                    Self::event(
                        &mut live,
                        "running",
                        running_at,
                        format!("started by the {} backend", self.backend.name()),
                    ),
                    Self::event(&mut live, "observed", running_at, observed),
                ];
                let usage = UsageInterval {
                    workload_id: id,
                    seq: live.usage_seq,
                    tenant: live.wl.tenant.clone(),
                    project: live.wl.project.clone(),
                    pool: a.pool.clone(),
                    model: a.model.clone(),
                    shape: describe_alloc(&a),
                    units_milli: a.units_milli,
                    started_at: running_at,
                    ended_at: None,
                    util_avg: None,
                };
                events.push(Self::event(
                    &mut live,
                    "metered",
                    running_at,
                    format!(
                        "usage interval opened: {} GPU units of {} in pool {}",
                        GpuUnits(a.units_milli),
                        a.model,
                        a.pool
                    ),
                ));
                live.usage_open = true;
                live.wl.state = WorkloadState::Running;
                live.wl.running_at = Some(rfc3339_ms(running_at));
                live.wl.running_at_ms = Some(running_at);
                live.wl.request_to_running_ms = Some((running_at - live.wl.created_at_ms).max(0) as u64);
                self.metrics.running(&a.pool, running_at - live.wl.created_at_ms); // metrics
                batch.changes.push(Change::Update {
                    workload: Box::new(live.wl.clone()),
                    events,
                });
                batch.changes.push(Change::OpenUsage(usage));
                self.live.insert(id, live);
            }
            Cmd::LaunchFailed { id, at, detail } => {
                let Some(mut live) = self.live.get(&id).cloned() else {
                    return;
                };
                if live.wl.state == WorkloadState::Placed {
                    self.finish(&mut live, WorkloadState::Failed, at, Some(detail), batch);
                }
            }
            Cmd::Stopped { id, at } => {
                let Some(mut live) = self.live.get(&id).cloned() else {
                    return;
                };
                if live.wl.state != WorkloadState::Stopping {
                    return;
                }
                match live.preempted_by.take() {
                    Some(why) if live.requeue => {
                        // Preempted batch work goes back to the queue, keeping its place in time.
                        let mut events = Vec::new();
                        self.release(&mut live, at, &mut events, batch);
                        events.push(Self::event(
                            &mut live,
                            "queued",
                            at,
                            format!("requeued after being {why}"),
                        ));
                        live.wl.state = WorkloadState::Queued;
                        live.wl.reason = Some(format!("requeued after being {why}"));
                        live.reason_code = Some("requeued");
                        live.wl.allocation = None;
                        live.wl.running_at = None;
                        live.wl.running_at_ms = None;
                        live.wl.borrowing = false;
                        batch.changes.push(Change::Update {
                            workload: Box::new(live.wl.clone()),
                            events,
                        });
                        self.sched.enqueue(self.job_of(&live));
                        self.live.insert(id, live);
                    }
                    Some(why) => self.finish(&mut live, WorkloadState::Preempted, at, Some(why), batch),
                    None => {
                        let reason = live.wl.reason.clone();
                        self.finish(&mut live, WorkloadState::Cancelled, at, reason, batch)
                    }
                }
            }
            Cmd::Exited {
                id,
                at,
                success,
                detail,
            } => {
                let Some(mut live) = self.live.get(&id).cloned() else {
                    return;
                };
                if live.wl.state != WorkloadState::Running {
                    return;
                }
                let (state, reason) = if success {
                    (WorkloadState::Succeeded, None)
                } else {
                    (WorkloadState::Failed, Some(detail))
                };
                self.finish(&mut live, state, at, reason, batch);
            }
            Cmd::View(_) => unreachable!("views are answered after the commit"),
        }
    }

    async fn create(&mut self, nw: NewWorkload, now: i64, batch: &mut Batch) -> ApiResult<Option<(Workload, bool)>> {
        if let Some((key, hash)) = &nw.idempotency {
            let k = (nw.actor.clone(), key.clone());
            let prior = match batch.idempotency.get(&k) {
                Some(p) => Some(p.clone()),
                None => self.store.idempotent(&nw.actor, key).await?,
            };
            if let Some((h, id)) = prior {
                if &h != hash {
                    return Err(ApiError::invalid(
                        "Idempotency-Key",
                        format!("Idempotency-Key `{key}` was already used with a different request body"),
                    ));
                }
                if let Some(l) = self.live.get(&id) {
                    return Ok(Some((l.wl.clone(), false)));
                }
                let cached = self.cache.read().expect("lock").get(id).map(|w| (*w).clone());
                let wl = match cached {
                    Some(w) => w,
                    None => self
                        .store
                        .get_workload(id)
                        .await?
                        .ok_or_else(|| ApiError::internal("idempotency key points nowhere"))?,
                };
                return Ok(Some((wl, false)));
            }
        }
        let tenant = self.tenant_id(&nw.spec.tenant);
        let request = nw.request.clone().with_tenant(tenant);
        let id = self.next_id;
        let at = nw.received_at;
        let spec = nw.spec;
        let wl = Workload {
            id,
            tenant: spec.tenant.clone(),
            project: spec.project.clone(),
            name: spec.name.clone(),
            kind: spec.kind,
            shape: spec.shape.clone(),
            cpu_milli: request.cpu_milli,
            memory_mib: request.memory_mib,
            duration_s: spec.duration_s,
            command: spec.command.clone(),
            image: spec.image.clone(),
            priority: spec.priority.clone().unwrap_or_else(|| "standard".into()),
            state: WorkloadState::Pending,
            borrowing: false,
            reason: None,
            units: units_label(nw.units),
            allocation: None,
            created_at: rfc3339_ms(at),
            created_at_ms: at,
            running_at: None,
            running_at_ms: None,
            ended_at: None,
            request_to_running_ms: None,
        };
        let mut live = Live {
            wl,
            reason_code: None,
            request,
            next_seq: 0,
            usage_seq: 0,
            usage_open: false,
            preempted_by: None,
            requeue: spec.kind == WorkloadKind::Batch && !spec.no_requeue,
            no_wait: spec.no_wait,
            util: (0.0, 0.0),
        };
        let job = self.job_of(&live);
        if self.sched.budget(&job.tenant).is_some() {
            let spent = self.month_spent(&job.tenant, now);
            self.sched.set_spent(&job.tenant, spent);
        }
        self.live.insert(id, live.clone());
        let actions = self.sched.submit(job, now);
        // A refusal of the new request (it can never fit, or it is over its limit or budget and
        // may not wait) is answered at once, and nothing is stored.
        if let Some(reason) = actions.iter().find_map(|a| match a {
            Decision::Refused { id: r, reason } if *r == id => Some(reason.clone()),
            _ => None,
        }) {
            self.live.remove(&id);
            self.metrics.refused(&reason); // metrics
            let others: Vec<Decision> = actions
                .into_iter()
                .filter(|a| !matches!(a, Decision::Refused { id: r, .. } if *r == id))
                .collect();
            self.apply(others, now, batch);
            return Err(match reason {
                Refusal::Constraint(u) => ApiError::invalid(u.field().as_str(), u.message()),
                Refusal::Limit(_) | Refusal::Budget(_) => ApiError::quota(reason.to_string()),
            });
        }
        self.next_id += 1;
        let events = vec![
            Self::event(
                &mut live,
                "requested",
                at,
                format!(
                    "{} for {}/{} ({} GPU units)",
                    shape_label(&spec.shape),
                    spec.tenant,
                    spec.project,
                    nw.units
                ),
            ),
            Self::event(
                &mut live,
                "authorised",
                now,
                format!(
                    "{} token {} may create workloads in tenant {}; quota and budget checked",
                    nw.role, nw.actor, spec.tenant
                ),
            ),
        ];
        let idem = nw.idempotency.map(|(k, h)| {
            batch.idempotency.insert((nw.actor.clone(), k.clone()), (h.clone(), id));
            (nw.actor.clone(), k, h)
        });
        batch.changes.push(Change::Insert {
            workload: Box::new(live.wl.clone()),
            events,
            idempotency: idem,
        });
        self.live.insert(id, live);
        self.metrics.step("authorise", now - at); // metrics
        self.apply(actions, now, batch);
        let wl = self.live.get(&id).map(|l| l.wl.clone()).expect("just inserted");
        Ok(Some((wl, true)))
    }
}

fn observe(backend: &dyn Backend, spec: &RunSpec) -> String {
    let samples = backend.telemetry();
    let Some(s) = samples
        .iter()
        .find(|s| s.node == spec.node && spec.gpus.contains(&s.gpu))
    else {
        return format!(
            "host resources on {}: no GPU telemetry for a CPU-only workload",
            spec.node
        );
    };
    match s.instances.iter().find(|i| i.workload == spec.id) {
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

pub fn shape_label(s: &GpuShape) -> String {
    if let Some(g) = s.gpus {
        format!("{g} whole GPU{}", if g == 1 { "" } else { "s" })
    } else if let Some(m) = &s.mig {
        format!("MIG {m}")
    } else if let Some(f) = s.fraction {
        format!("{f} milli-GPU")
    } else {
        "CPU only".into()
    }
}

fn describe_alloc(a: &AllocationView) -> String {
    match a.kind.as_str() {
        "mig" => format!(
            "MIG {} (profile {}) at slices {}..{} of GPU {}",
            a.mig_profile.as_deref().unwrap_or("?"),
            a.mig_profile_id.unwrap_or(0),
            a.mig_start.unwrap_or(0),
            a.mig_start.unwrap_or(0) + a.mig_size.unwrap_or(1) - 1,
            a.gpus.first().copied().unwrap_or(0)
        ),
        "fraction" => format!(
            "{} milli-GPU of GPU {}",
            a.milli.unwrap_or(0),
            a.gpus.first().copied().unwrap_or(0)
        ),
        "cpu" => "host resources".into(),
        _ => format!(
            "{} whole {} GPU{} {:?}",
            a.gpus.len(),
            a.model,
            if a.gpus.len() == 1 { "" } else { "s" },
            a.gpus
        ),
    }
}

/// The engine request for an API shape. Errors name the field.
pub fn shape_request(fleet: &Fleet, s: &GpuShape, cpu_milli: u64, memory_mib: u64) -> Result<Request, ApiError> {
    use tessera_model::Shape;
    let set = [s.gpus.is_some(), s.mig.is_some(), s.fraction.is_some()]
        .iter()
        .filter(|x| **x)
        .count();
    if set != 1 {
        return Err(ApiError::invalid(
            "shape",
            "give exactly one of `gpus` (whole GPUs), `mig` (a MIG profile) or `fraction` (milli-GPU)",
        ));
    }
    let cat = &fleet.catalogue;
    let mut models = Vec::new();
    for m in &s.models {
        let found = match cat.find(m) {
            Some(id) => vec![id],
            None => cat.find_family(m),
        };
        if found.is_empty() {
            let known: Vec<&str> = cat.models().map(|(_, m)| m.name.as_str()).collect();
            return Err(ApiError::invalid(
                "shape.models",
                format!("unknown GPU model `{m}` (known: {})", known.join(", ")),
            ));
        }
        models.extend(found);
    }
    let pool = match &s.pool {
        Some(p) => Some(fleet.pool_by_name(p).ok_or_else(|| {
            let names: Vec<&str> = fleet.pools.iter().map(|p| p.name.as_str()).collect();
            ApiError::invalid(
                "shape.pool",
                format!("unknown pool `{p}` (pools: {})", names.join(", ")),
            )
        })?),
        None => None,
    };
    let shape = if let Some(g) = s.gpus {
        if g == 0 || g > 16 {
            return Err(ApiError::invalid(
                "shape.gpus",
                format!("{g} whole GPUs: must be between 1 and 16"),
            ));
        }
        Shape::Whole { gpus: g }
    } else if let Some(name) = &s.mig {
        let mut choice = tessera_model::request::MigChoice::resolve(cat, name)
            .map_err(|e| ApiError::invalid("shape.mig", e.message))?;
        if !models.is_empty() {
            choice.options.retain(|(m, _)| models.contains(m));
            if choice.options.is_empty() {
                let names: Vec<String> = models.iter().map(|&m| cat.get(m).name.clone()).collect();
                return Err(ApiError::invalid(
                    "shape.mig",
                    format!(
                        "{} {} no MIG profile `{name}`",
                        names.join(", "),
                        if names.len() == 1 { "has" } else { "have" }
                    ),
                ));
            }
        }
        Shape::Mig(choice)
    } else {
        let f = s.fraction.unwrap_or(0);
        if f == 0 || f >= 1000 {
            return Err(ApiError::invalid(
                "shape.fraction",
                format!("{f} milli-GPU: a fraction must be between 1 and 999; ask for `gpus` for whole GPUs"),
            ));
        }
        Shape::Fraction {
            milli: f,
            memory_mib: s.gpu_memory_mib,
        }
    };
    if s.gpu_memory_mib.is_some() && s.fraction.is_none() {
        return Err(ApiError::invalid(
            "shape.gpu_memory_mib",
            "gpu_memory_mib goes with `fraction` only (whole GPUs and MIG instances come with their memory)",
        ));
    }
    let mut r = Request::new(shape).with_host(cpu_milli, memory_mib).with_models(models);
    r.pool = pool;
    Ok(r)
}

/// The API view of an engine allocation.
pub fn allocation_view(fleet: &Fleet, a: &Allocation) -> AllocationView {
    let node = fleet.node(a.node);
    let model = fleet.catalogue.get(node.model);
    let mut v = AllocationView {
        pool: fleet.pool(node.pool).name.clone(),
        node: node.name.clone(),
        model: model.name.clone(),
        gpus: (0..node.gpus).filter(|g| a.grant.gpu_mask() >> g & 1 == 1).collect(),
        kind: String::new(),
        mig_profile: None,
        mig_profile_id: None,
        mig_start: None,
        mig_size: None,
        milli: None,
        gpu_memory_mib: None,
        units_milli: a.units.as_milli(),
    };
    match a.grant {
        Grant::Whole { .. } => v.kind = "whole".into(),
        Grant::Mig {
            profile,
            profile_id,
            start,
            size,
            ..
        } => {
            v.kind = "mig".into();
            v.mig_profile = model.mig.map(|g| model.profile_name(&g.profiles[profile as usize]));
            v.mig_profile_id = Some(profile_id);
            v.mig_start = Some(start);
            v.mig_size = Some(size);
        }
        Grant::Fraction { milli, memory_mib, .. } => {
            v.kind = "fraction".into();
            v.milli = Some(milli);
            v.gpu_memory_mib = (memory_mib > 0).then_some(memory_mib);
        }
        Grant::CpuOnly => v.kind = "cpu".into(),
    }
    v
}

/// Rebuilds an engine allocation from its stored view.
fn allocation_from_view(
    fleet: &Fleet,
    id: u64,
    v: &AllocationView,
    wl: &Workload,
    tenant: TenantId,
) -> Result<Allocation, String> {
    let node = fleet
        .node_by_name(&v.node)
        .ok_or_else(|| format!("node {} is not in the fleet", v.node))?;
    let n = fleet.node(node);
    let model = fleet.catalogue.get(n.model);
    let gpu = v.gpus.first().copied().unwrap_or(0);
    let grant = match v.kind.as_str() {
        "whole" => Grant::Whole {
            gpus: v.gpus.iter().fold(0u16, |m, g| m | 1 << g),
        },
        "mig" => {
            let geom = model
                .mig
                .filter(|_| fleet.pool(n.pool).sharing == Sharing::Mig)
                .ok_or("node is not in a MIG pool")?;
            let pid = v.mig_profile_id.ok_or("MIG allocation without a profile ID")?;
            let profile = geom
                .profile_index(pid)
                .ok_or_else(|| format!("{} has no MIG profile {pid}", model.name))?;
            Grant::Mig {
                gpu,
                profile: profile as u8,
                profile_id: pid,
                start: v.mig_start.unwrap_or(0),
                size: geom.profiles[profile].mem_slices,
            }
        }
        "fraction" => Grant::Fraction {
            gpu,
            milli: v.milli.unwrap_or(0),
            memory_mib: v.gpu_memory_mib.unwrap_or(0),
        },
        "cpu" => Grant::CpuOnly,
        k => return Err(format!("unknown allocation kind {k}")),
    };
    Ok(Allocation {
        id,
        node: NodeId(node.0),
        grant,
        cpu_milli: wl.cpu_milli,
        memory_mib: wl.memory_mib,
        tenant: Some(tenant),
        units: GpuUnits(v.units_milli),
    })
}
