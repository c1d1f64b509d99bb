//! The lifecycle loop: one task owns the placement engine and every live workload, and walks
//! each request through its steps — requested → authorised → placed → partitioned → running →
//! observed → metered → released — recording every step.
//!
//! Commands (API calls, backend news) arrive on a channel and are handled in batches: the
//! batch's state changes, with their events and usage intervals, are committed in one store
//! transaction, and only then are callers answered and backend work started (group commit). If
//! the commit fails, the in-memory changes of the batch are undone, so memory never runs ahead
//! of the store. At start-up the state is rebuilt from the store: allocations are re-applied
//! (double booking is refused), running workloads are reconciled with the backend, and placed
//! or stopping ones are driven on.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tessera_api::{AllocationView, CreateWorkload, GpuShape, Workload, WorkloadState, rfc3339_ms};
use tessera_backend::{Backend, BackendEvent, RunSpec, Slice, Status};
use tessera_model::{Fleet, GpuUnits, NodeId, Request, Sharing, TenantId};
use tessera_sched::engine::Reason;
use tessera_sched::{Allocation, Engine, Grant};
use tessera_store::{Change, NewEvent, Store, UsageInterval};
use tokio::sync::{mpsc, oneshot};

use crate::now_ms;
use crate::problem::{ApiError, ApiResult};

/// Priority classes, most important first.
pub const PRIORITY_CLASSES: [&str; 4] = ["critical", "high", "standard", "opportunistic"];

fn priority_rank(p: &str) -> u8 {
    PRIORITY_CLASSES.iter().position(|c| *c == p).unwrap_or(2) as u8
}

/// Workloads readers may see without asking the loop: every live one and the most recently
/// ended ones.
#[derive(Default)]
pub struct WorkloadCache {
    map: HashMap<u64, Arc<Workload>>,
    ended: VecDeque<u64>,
}

const ENDED_KEPT: usize = 20_000;

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

/// What the loop can be asked.
pub enum Cmd {
    Create(
        Box<NewWorkload>,
        oneshot::Sender<ApiResult<(Workload, bool)>>,
    ),
    Cancel {
        id: u64,
        actor: String,
        reply: oneshot::Sender<ApiResult<Workload>>,
    },
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

/// Read-only access to the loop's state for fleet views.
pub struct ViewCtx<'a> {
    pub fleet: &'a Fleet,
    pub engine: &'a Engine,
    pub workloads: &'a HashMap<u64, Live>,
}

/// A live (non-terminal) workload.
#[derive(Clone)]
pub struct Live {
    pub wl: Workload,
    pub request: Request,
    next_seq: u32,
    usage_seq: u32,
    usage_open: bool,
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

    pub async fn view<T: Send + 'static>(
        &self,
        f: impl FnOnce(&ViewCtx) -> T + Send + 'static,
    ) -> ApiResult<T> {
        let (tx, rx) = oneshot::channel();
        self.send(Cmd::View(Box::new(move |ctx| {
            let _ = tx.send(f(ctx));
        })))
        .await?;
        rx.await
            .map_err(|_| ApiError::unavailable("the lifecycle loop has stopped"))
    }
}

enum Undo {
    Released(Allocation),
    Placed(u64),
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
    undo: Vec<Undo>,
    /// First-touch snapshots of live workloads (`None` = did not exist).
    before: HashMap<u64, Option<Live>>,
    touched: Vec<u64>,
    idempotency: HashMap<(String, String), (String, u64)>,
    next_id_before: u64,
}

pub struct Actor {
    fleet: Arc<Fleet>,
    engine: Engine,
    store: Store,
    backend: Arc<dyn Backend>,
    live: HashMap<u64, Live>,
    queue: BTreeSet<(u8, u64)>,
    cache: Arc<RwLock<WorkloadCache>>,
    tenants: HashMap<String, u32>,
    next_id: u64,
    tx: mpsc::Sender<Cmd>,
    grace: Duration,
    dirty: bool,
}

/// The engine request shape of a workload's API shape (validated by the API layer).
pub fn units_label(u: GpuUnits) -> String {
    u.to_string()
}

impl Actor {
    /// Rebuilds the loop's state from the store and starts it. Returns the handle.
    pub async fn start(
        fleet: Arc<Fleet>,
        engine: Engine,
        store: Store,
        backend: Arc<dyn Backend>,
        grace: Duration,
    ) -> Result<Controller, ApiError> {
        let (tx, rx) = mpsc::channel(8192);
        let cache = Arc::new(RwLock::new(WorkloadCache::default()));
        let mut actor = Actor {
            fleet,
            engine,
            backend: backend.clone(),
            live: HashMap::new(),
            queue: BTreeSet::new(),
            cache: cache.clone(),
            tenants: HashMap::new(),
            next_id: store.max_workload_id().await? + 1,
            tx: tx.clone(),
            grace,
            dirty: true,
            store,
        };
        actor.recover().await?;
        if let Some(mut events) = backend.take_events() {
            let tx = tx.clone();
            tokio::spawn(async move {
                while let Some(BackendEvent::Exited {
                    id,
                    success,
                    detail,
                }) = events.recv().await
                {
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

    async fn recover(&mut self) -> Result<(), ApiError> {
        let active = self.store.active_workloads().await?;
        let seqs = self.store.sequences().await?;
        let mut batch = Batch {
            next_id_before: self.next_id,
            ..Default::default()
        };
        let mut to_reconcile = Vec::new();
        for wl in active {
            let (next_seq, usage_seq) = seqs.get(&wl.id).copied().unwrap_or((0, 0));
            let tenant = self.tenant_id(&wl.tenant);
            let request = match shape_request(&self.fleet, &wl.shape, wl.cpu_milli, wl.memory_mib) {
                Ok(r) => r.with_tenant(tenant),
                Err(e) => {
                    tracing::error!(id = wl.id, error = %e.detail, "stored workload no longer fits the fleet description");
                    let mut live = Live {
                        request: Request::new(tessera_model::Shape::CpuOnly),
                        wl,
                        next_seq,
                        usage_seq,
                        usage_open: false,
                    };
                    self.finish(
                        &mut live,
                        WorkloadState::Failed,
                        now_ms(),
                        Some(format!("no longer valid on this fleet: {}", e.detail)),
                        &mut batch,
                    );
                    continue;
                }
            };
            let usage_open = wl.running_at_ms.is_some()
                && matches!(wl.state, WorkloadState::Running | WorkloadState::Stopping);
            // The open interval is the last one recorded.
            let usage_seq = if usage_open {
                usage_seq.saturating_sub(1)
            } else {
                usage_seq
            };
            let mut live = Live {
                wl,
                request,
                next_seq,
                usage_seq,
                usage_open,
            };
            let state = live.wl.state;
            if state.holds_capacity() {
                let restored = live
                    .wl
                    .allocation
                    .as_ref()
                    .ok_or_else(|| "no allocation recorded".to_string())
                    .and_then(|a| {
                        allocation_from_view(&self.fleet, live.wl.id, a, &live.wl, tenant)
                    })
                    .and_then(|a| self.engine.restore(a).map(|_| ()).map_err(|e| e.0));
                if let Err(e) = restored {
                    tracing::error!(id = live.wl.id, error = %e, "cannot re-apply allocation");
                    live.wl.allocation = None;
                    self.finish(
                        &mut live,
                        WorkloadState::Failed,
                        now_ms(),
                        Some(format!("allocation could not be restored: {e}")),
                        &mut batch,
                    );
                    continue;
                }
            }
            match state {
                WorkloadState::Pending | WorkloadState::Queued => {
                    self.queue
                        .insert((priority_rank(&live.wl.priority), live.wl.id));
                }
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
                    Status::Failed | Status::Unknown => self.finish(
                        &mut live,
                        WorkloadState::Failed,
                        now,
                        Some(format!("the {} backend no longer knows this workload after a control-plane restart", self.backend.name())),
                        &mut batch,
                    ),
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
            queued = self.queue.len(),
            "lifecycle state rebuilt from the store"
        );
        Ok(())
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Cmd>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let first = tokio::select! {
                c = rx.recv() => match c { Some(c) => Some(c), None => break },
                _ = tick.tick() => None,
            };
            let mut batch = Batch {
                next_id_before: self.next_id,
                ..Default::default()
            };
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
            if self.dirty {
                self.schedule(&mut batch);
            }
            self.commit(batch).await;
            let ctx = ViewCtx {
                fleet: &self.fleet,
                engine: &self.engine,
                workloads: &self.live,
            };
            for f in views {
                f(&ctx);
            }
        }
    }

    async fn commit(&mut self, mut batch: Batch) {
        match self.store.apply(&batch.changes).await {
            Ok(()) => {
                {
                    let mut c = self.cache.write().expect("lock");
                    for ch in &batch.changes {
                        match ch {
                            Change::Insert { workload, .. } | Change::Update { workload, .. } => {
                                c.put(workload)
                            }
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
                tracing::error!(error = %e, changes = batch.changes.len(), "commit failed; undoing the batch");
                for u in batch.undo.into_iter().rev() {
                    match u {
                        Undo::Placed(id) => {
                            self.engine.release(id);
                        }
                        Undo::Released(a) => {
                            let _ = self.engine.restore(a);
                        }
                    }
                }
                for id in batch.touched {
                    self.queue.retain(|&(_, q)| q != id);
                    match batch.before.remove(&id).flatten() {
                        Some(l) => {
                            if matches!(l.wl.state, WorkloadState::Pending | WorkloadState::Queued)
                            {
                                self.queue.insert((priority_rank(&l.wl.priority), id));
                            }
                            self.live.insert(id, l);
                        }
                        None => {
                            self.live.remove(&id);
                        }
                    }
                }
                self.next_id = batch.next_id_before;
                self.dirty = true;
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
            }
        }
    }

    fn spawn_all(&self, spawns: Vec<Spawn>) {
        for s in spawns {
            let backend = self.backend.clone();
            let tx = self.tx.clone();
            let grace = self.grace;
            tokio::spawn(async move {
                let cmd = match s {
                    Spawn::Launch(spec) => match backend.partition(&spec).await {
                        Err(e) => Cmd::LaunchFailed {
                            id: spec.id,
                            at: now_ms(),
                            detail: format!("partitioning failed: {e}"),
                        },
                        Ok(partition) => {
                            let partitioned_at = now_ms();
                            match backend.start(&spec).await {
                                Err(e) => Cmd::LaunchFailed {
                                    id: spec.id,
                                    at: now_ms(),
                                    detail: format!("start failed: {e}"),
                                },
                                Ok(()) => {
                                    let running_at = now_ms();
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
                            tracing::warn!(id = spec.id, error = %e, "stop failed; treating as stopped");
                        }
                        let _ = backend.unpartition(&spec).await;
                        Cmd::Stopped {
                            id: spec.id,
                            at: now_ms(),
                        }
                    }
                    Spawn::Unpartition(spec) => {
                        if let Err(e) = backend.unpartition(&spec).await {
                            tracing::warn!(id = spec.id, error = %e, "unpartition failed");
                        }
                        return;
                    }
                };
                let _ = tx.send(cmd).await;
            });
        }
    }

    fn touch(&mut self, id: u64, batch: &mut Batch) {
        if let std::collections::hash_map::Entry::Vacant(e) = batch.before.entry(id) {
            e.insert(self.live.get(&id).cloned());
            batch.touched.push(id);
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
        let model = self
            .fleet
            .catalogue
            .find(&a.model)
            .map(|m| self.fleet.catalogue.get(m));
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
            duration: live
                .wl
                .duration_s
                .map(|s| Duration::from_secs(s.max(0) as u64)),
            running_since_ms: live.wl.running_at_ms,
            command: live.wl.command.clone(),
            image: live.wl.image.clone(),
        }
    }

    /// Moves a live workload to a terminal state: releases its capacity (if held), closes its
    /// usage interval, records the events, and drops it from the live set.
    fn finish(
        &mut self,
        live: &mut Live,
        state: WorkloadState,
        at: i64,
        reason: Option<String>,
        batch: &mut Batch,
    ) {
        let mut events = Vec::new();
        match state {
            WorkloadState::Failed => events.push(Self::event(
                live,
                "failed",
                at,
                reason.clone().unwrap_or_default(),
            )),
            WorkloadState::Cancelled
                if !live.wl.state.holds_capacity() && live.wl.state != WorkloadState::Stopping =>
            {
                events.push(Self::event(
                    live,
                    "cancelled",
                    at,
                    reason.clone().unwrap_or_default(),
                ))
            }
            _ => {}
        }
        if let Some(a) = self.engine.release(live.wl.id) {
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
            batch.undo.push(Undo::Released(a));
            self.dirty = true;
            // A stopping workload was unpartitioned by its stop task already.
            if live.wl.allocation.is_some() && live.wl.state != WorkloadState::Stopping {
                batch.spawns.push(Spawn::Unpartition(self.run_spec(live)));
            }
        }
        if live.usage_open {
            batch.changes.push(Change::CloseUsage {
                workload_id: live.wl.id,
                seq: live.usage_seq,
                ended_at: at,
            });
            live.usage_seq += 1;
            live.usage_open = false;
        }
        live.wl.state = state;
        live.wl.reason = reason;
        live.wl.ended_at = Some(rfc3339_ms(at));
        self.queue.retain(|&(_, q)| q != live.wl.id);
        self.live.remove(&live.wl.id);
        batch.changes.push(Change::Update {
            workload: Box::new(live.wl.clone()),
            events,
        });
    }

    /// Tries to place a queued or new workload. Returns the refusal when it cannot be placed.
    fn try_place(
        &mut self,
        live: &mut Live,
        at: i64,
        batch: &mut Batch,
    ) -> Result<NewEvent, tessera_sched::Unplaceable> {
        let placement = self.engine.plan(&live.request)?;
        let alloc = self
            .engine
            .commit(live.wl.id, &live.request, placement)
            .expect("a fresh plan commits")
            .clone();
        batch.undo.push(Undo::Placed(live.wl.id));
        let view = allocation_view(&self.fleet, &alloc);
        let detail = format!(
            "{} on {} ({}), {} GPU units",
            describe_alloc(&view),
            view.node,
            view.pool,
            alloc.units
        );
        live.wl.allocation = Some(view);
        live.wl.state = WorkloadState::Placed;
        live.wl.reason = None;
        batch.spawns.push(Spawn::Launch(self.run_spec(live)));
        Ok(Self::event(live, "placed", at, detail))
    }

    async fn handle(&mut self, cmd: Cmd, batch: &mut Batch) {
        match cmd {
            Cmd::Create(nw, reply) => {
                let r = self.create(*nw, batch).await;
                match r {
                    Ok(Some(v)) => batch.replies.push(Reply::Created(reply, Ok(v))),
                    Ok(None) => {}
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            Cmd::Cancel { id, actor, reply } => {
                let Some(mut live) = self.live.get(&id).cloned() else {
                    let _ = reply.send(Err(ApiError::conflict(format!(
                        "workload {id} has already ended"
                    ))));
                    return;
                };
                self.touch(id, batch);
                let at = now_ms();
                match live.wl.state {
                    WorkloadState::Pending | WorkloadState::Queued => {
                        self.finish(
                            &mut live,
                            WorkloadState::Cancelled,
                            at,
                            Some(format!("cancelled by {actor} before it was placed")),
                            batch,
                        );
                    }
                    WorkloadState::Placed | WorkloadState::Running => {
                        let e = Self::event(
                            &mut live,
                            "cancelled",
                            at,
                            format!(
                                "cancelled by {actor}; stopping within {} s",
                                self.grace.as_secs()
                            ),
                        );
                        batch.spawns.push(Spawn::Stop(self.run_spec(&live)));
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
                self.touch(id, batch);
                let a = live
                    .wl
                    .allocation
                    .clone()
                    .expect("placed workloads have an allocation");
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
                live.wl.request_to_running_ms =
                    Some((running_at - live.wl.created_at_ms).max(0) as u64);
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
                if live.wl.state != WorkloadState::Placed {
                    return;
                }
                self.touch(id, batch);
                self.finish(&mut live, WorkloadState::Failed, at, Some(detail), batch);
            }
            Cmd::Stopped { id, at } => {
                let Some(mut live) = self.live.get(&id).cloned() else {
                    return;
                };
                if live.wl.state != WorkloadState::Stopping {
                    return;
                }
                self.touch(id, batch);
                let reason = live.wl.reason.clone();
                self.finish(&mut live, WorkloadState::Cancelled, at, reason, batch);
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
                self.touch(id, batch);
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

    async fn create(
        &mut self,
        nw: NewWorkload,
        batch: &mut Batch,
    ) -> ApiResult<Option<(Workload, bool)>> {
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
                        format!(
                            "Idempotency-Key `{key}` was already used with a different request body"
                        ),
                    ));
                }
                if let Some(l) = self.live.get(&id) {
                    return Ok(Some((l.wl.clone(), false)));
                }
                let wl = self
                    .cache
                    .read()
                    .expect("lock")
                    .get(id)
                    .map(|w| (*w).clone());
                let wl = match wl {
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
        // A request that no node could ever hold is refused at once, and nothing is stored.
        if let Err(u) = self.engine.plan(&request)
            && u.reason == Reason::Constraint
        {
            return Err(ApiError::invalid(
                constraint_field(&nw.spec.shape, &u.message),
                u.message,
            ));
        }
        let id = self.next_id;
        self.next_id += 1;
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
            request,
            next_seq: 0,
            usage_seq: 0,
            usage_open: false,
        };
        self.touch(id, batch);
        let mut events = vec![
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
                now_ms(),
                format!(
                    "{} token {} may create workloads in tenant {}",
                    nw.role, nw.actor, spec.tenant
                ),
            ),
        ];
        let now = now_ms();
        // Older queued work of the same or higher priority goes first: a new request is placed
        // at once only when nothing that outranks it is waiting.
        let rank = priority_rank(&live.wl.priority);
        let outranked = self.queue.iter().next().is_some_and(|&(r, _)| r <= rank);
        let placed = if outranked {
            Err(None)
        } else {
            self.try_place(&mut live, now, batch).map_err(Some)
        };
        match placed {
            Ok(e) => events.push(e),
            Err(refusal) => {
                let reason = match refusal {
                    Some(u) => format!("{}: {}", u.reason, u.message),
                    None => {
                        "waiting behind earlier requests of equal or higher priority".to_string()
                    }
                };
                events.push(Self::event(&mut live, "queued", now, reason.clone()));
                live.wl.state = WorkloadState::Queued;
                live.wl.reason = Some(reason);
                self.queue.insert((rank, id));
                self.dirty = true;
            }
        }
        let idem = nw.idempotency.map(|(k, h)| {
            batch
                .idempotency
                .insert((nw.actor.clone(), k.clone()), (h.clone(), id));
            (nw.actor.clone(), k, h)
        });
        batch.changes.push(Change::Insert {
            workload: Box::new(live.wl.clone()),
            events,
            idempotency: idem,
        });
        let wl = live.wl.clone();
        self.live.insert(id, live);
        Ok(Some((wl, true)))
    }

    /// Places queued workloads in priority then arrival order, while capacity allows.
    fn schedule(&mut self, batch: &mut Batch) {
        self.dirty = false;
        let queue: Vec<(u8, u64)> = self.queue.iter().copied().collect();
        for (rank, id) in queue {
            let Some(mut live) = self.live.get(&id).cloned() else {
                self.queue.remove(&(rank, id));
                continue;
            };
            let at = now_ms();
            match self.try_place(&mut live, at, batch) {
                Ok(e) => {
                    self.touch(id, batch);
                    self.queue.remove(&(rank, id));
                    batch.changes.push(Change::Update {
                        workload: Box::new(live.wl.clone()),
                        events: vec![e],
                    });
                    self.live.insert(id, live);
                }
                Err(u) => {
                    let reason = format!("{}: {}", u.reason, u.message);
                    if live.wl.reason.as_deref() != Some(reason.as_str())
                        || live.wl.state == WorkloadState::Pending
                    {
                        self.touch(id, batch);
                        let e = Self::event(&mut live, "queued", at, reason.clone());
                        live.wl.state = WorkloadState::Queued;
                        live.wl.reason = Some(reason);
                        batch.changes.push(Change::Update {
                            workload: Box::new(live.wl.clone()),
                            events: vec![e],
                        });
                        self.live.insert(id, live);
                    }
                }
            }
        }
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

/// Which request field a constraint refusal is about.
fn constraint_field(shape: &GpuShape, message: &str) -> String {
    if message.contains("CPUs requested") {
        "cpu_milli".into()
    } else if message.contains("host memory") {
        "memory_mib".into()
    } else if message.contains("pool `") && shape.pool.is_some() && message.contains("cannot serve")
    {
        "shape.pool".into()
    } else if shape.gpus.is_some() {
        "shape.gpus".into()
    } else if shape.mig.is_some() {
        "shape.mig".into()
    } else if shape.fraction.is_some() {
        "shape.fraction".into()
    } else {
        "shape".into()
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
pub fn shape_request(
    fleet: &Fleet,
    s: &GpuShape,
    cpu_milli: u64,
    memory_mib: u64,
) -> Result<Request, ApiError> {
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
                format!(
                    "{f} milli-GPU: a fraction must be between 1 and 999; ask for `gpus` for whole GPUs"
                ),
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
    let mut r = Request::new(shape)
        .with_host(cpu_milli, memory_mib)
        .with_models(models);
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
        gpus: (0..node.gpus)
            .filter(|g| a.grant.gpu_mask() >> g & 1 == 1)
            .collect(),
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
            v.mig_profile = model
                .mig
                .map(|g| model.profile_name(&g.profiles[profile as usize]));
            v.mig_profile_id = Some(profile_id);
            v.mig_start = Some(start);
            v.mig_size = Some(size);
        }
        Grant::Fraction {
            milli, memory_mib, ..
        } => {
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
            let pid = v
                .mig_profile_id
                .ok_or("MIG allocation without a profile ID")?;
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
