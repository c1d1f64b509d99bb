//! What readers see. After each commit the lifecycle loop publishes an immutable [`Snapshot`]
//! of the fleet (per node, copy-on-write: only nodes whose state changed are rebuilt), the
//! tenants' quotas and holdings, and — every second, and within 50 ms of a change while the
//! queue changes — the queue and phase counts; it also publishes the records of the workloads
//! the commit changed. GETs, fleet views, usage reports and `/metrics` read these, never the
//! loop itself, so a read costs the loop nothing and a busy loop never slows a read.
//!
//! The queue and phase counts walk every live workload; on a fleet with a long queue the loop
//! waits longer between them (ten times as long as the last one took), so that they take at
//! most about a tenth of its time. A snapshot lists the waiting workloads by their shared
//! records, without copying them.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock};

use tessera_backend::GpuSample;
use tessera_domain::{Phase, ReasonCode, Workload, WorkloadId};
use tessera_model::{Fleet, GpuUnits, PoolId, Request, TenantId};
use tessera_sched::cycle::{HoldBook, Quota, Scheduler};
use tessera_sched::{Engine, Grant, Placement, Unplaceable};

use super::live::Live;

/// One holder of (part of) a GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct HolderSnap {
    pub workload: u64,
    pub tenant: String,
    pub project: String,
    pub grant: Grant,
    pub units: GpuUnits,
}

/// One GPU.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuSnap {
    /// GPU units in use, in milli-GPU.
    pub used_milli: u16,
    /// MIG: occupied memory slices.
    pub mig_mask: u16,
    pub holders: Vec<HolderSnap>,
}

/// One node: free host resources and its GPUs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeSnap {
    pub cpu_free: u64,
    pub mem_free: u64,
    pub gpus: Vec<GpuSnap>,
}

impl NodeSnap {
    pub fn free_gpus(&self) -> usize {
        self.gpus.iter().filter(|g| g.holders.is_empty()).count()
    }

    pub fn used_milli(&self) -> u64 {
        self.gpus.iter().map(|g| g.used_milli as u64).sum()
    }
}

/// A tenant's quotas with what it holds, and its budget.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TenantSnap {
    /// (resource class, quota, units held in that class).
    pub quotas: Vec<(String, Quota, GpuUnits)>,
    /// Monthly budget and spent, GPU-unit-hours.
    pub budget: Option<(f64, f64)>,
    /// With a budget: the GPU-unit-hours its running work will still use this month (each to
    /// its lease's end, work without one to the month's end), as of the last full snapshot.
    pub running_unit_hours: f64,
}

/// The queue, aggregated for metrics and views.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QueueSnap {
    /// (tenant, resource class, priority) → (depth, oldest submission ms).
    pub depth: BTreeMap<(String, String, String), (u64, i64)>,
    /// (resource class, reason code; `None` before the scheduler said) → waiting requests.
    pub blocked: BTreeMap<(String, Option<ReasonCode>), u64>,
    /// Every waiting workload, oldest first (the console's queue view pages through it).
    pub waiting: Vec<Waiting>,
    /// Per pool (by index), when the first running workload there is due to end by its lease
    /// (`None`: none there has one): the "wait until" of a request waiting for capacity. Empty
    /// on a follower's snapshot.
    pub next_end: Vec<Option<i64>>,
}

/// One waiting workload as the queue view shows it: its record (shared with the loop, so a
/// snapshot of a long queue copies no strings; why it waits is its `reason`, `None` before the
/// scheduler has said) and the resource class it waits for (its pool, or `any`).
#[derive(Clone, Debug, PartialEq)]
pub struct Waiting {
    pub workload: Arc<Workload>,
    pub class: Arc<str>,
}

/// A copy of the scheduler's placement engine, made when a dry run asks the loop for one after
/// the engine changed ([`Lifecycle::trial_snapshot`](super::Lifecycle::trial_snapshot); reused
/// while the engine stays as it was), for dry runs:
/// [`Trial::plan`] asks the engine's own `plan` on it — the code path of a real placement,
/// with the same fences, MIG layouts and reservations — without touching the loop's engine.
/// With it, a copy of the scheduler's holds ([`HoldBook`], taken again whenever they change),
/// so that a gang's expected start is planned behind the gangs already waiting.
pub struct Trial {
    engine: Arc<Mutex<Engine>>,
    tenants: HashMap<String, TenantId>,
    holds: HoldBook,
}

impl std::fmt::Debug for Trial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trial")
            .field("tenants", &self.tenants.len())
            .field("holds", &self.holds.holds())
            .finish_non_exhaustive()
    }
}

impl Trial {
    pub fn new(engine: Engine, tenants: HashMap<String, TenantId>, holds: HoldBook) -> Trial {
        Trial {
            engine: Arc::new(Mutex::new(engine)),
            tenants,
            holds,
        }
    }

    /// The same engine copy with other holds.
    fn with_holds(&self, tenants: HashMap<String, TenantId>, holds: HoldBook) -> Trial {
        Trial {
            engine: self.engine.clone(),
            tenants,
            holds,
        }
    }

    /// Where and about when gang `g` (running `duration_ms` once placed) would start if it were
    /// submitted at `now` and found no room: the hold the scheduler would give it, after the
    /// holds of the gangs waiting before it ([`HoldBook::gang_start`]), so the same start and
    /// racks its queue reason will say.
    pub fn gang_start(
        &self,
        g: &tessera_model::request::GangRequest,
        duration_ms: Option<i64>,
        now: i64,
    ) -> Option<tessera_sched::cycle::GangStart> {
        let engine = self.engine.lock().unwrap_or_else(|p| p.into_inner());
        self.holds.gang_start(&engine, g, duration_ms, now)
    }

    /// The pools the engine would try for `req`, in its order (none if no pool serves it).
    pub fn scope(&self, req: &Request) -> Vec<PoolId> {
        self.engine
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .scope(req)
            .unwrap_or_default()
    }

    /// The pools whose sharing mode cannot serve `req`'s shape, each with why.
    pub fn pools_not_serving(&self, req: &Request) -> Vec<tessera_sched::Unplaceable> {
        self.engine
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pools_not_serving(req)
    }

    /// The whole pools the engine would try for gang `g`, in its order.
    pub fn gang_pools(&self, g: &tessera_model::request::GangRequest) -> Vec<PoolId> {
        self.engine.lock().unwrap_or_else(|p| p.into_inner()).gang_pools(g)
    }

    /// Where gang `g` would be placed now, or why not (the engine's typed reason).
    pub fn plan_gang(
        &self,
        g: &tessera_model::request::GangRequest,
    ) -> Result<tessera_sched::GangPlacement, tessera_sched::GangUnplaceable> {
        self.engine.lock().unwrap_or_else(|p| p.into_inner()).plan_gang(g)
    }

    /// Where `req` of `tenant` would be placed now, or why not (the engine's typed reason).
    pub fn plan(&self, req: &Request, tenant: &str) -> Result<Placement, Unplaceable> {
        // A tenant that holds nothing yet has no id in the loop: any id no one else has
        // answers the same (it matters only for keeping tenants apart on shared GPUs).
        let id = self.tenants.get(tenant).copied().unwrap_or(TenantId(u32::MAX));
        let r = req.clone().with_tenant(id);
        self.engine.lock().unwrap_or_else(|p| p.into_inner()).plan(&r)
    }
}

/// An immutable view of the loop's state after a commit.
#[derive(Clone)]
pub struct Snapshot {
    /// Increases with every publication.
    pub version: u64,
    /// When it was taken, ms since the epoch.
    pub at: i64,
    pub fleet: Arc<Fleet>,
    pub nodes: Vec<Arc<NodeSnap>>,
    pub tenants: Arc<BTreeMap<String, TenantSnap>>,
    pub queue: Arc<QueueSnap>,
    /// Live workloads by phase.
    pub phases: Arc<BTreeMap<Phase, u64>>,
    /// Measured utilisation so far of running workloads (0..1), for usage reports.
    pub utilisation: Arc<HashMap<WorkloadId, f64>>,
    /// The placement engine to try requests on (dry runs); `None` before recovery.
    pub trial: Option<Arc<Trial>>,
    /// Whether `trial` is the engine and the holds as of this snapshot. A snapshot carries the
    /// last copy made, which can be older than the workload records a caller has already read
    /// (a gang's "held for it" before the hold is in the copy):
    /// [`Lifecycle::trial_snapshot`](super::Lifecycle::trial_snapshot) then asks the loop for
    /// a current copy.
    pub trial_current: bool,
}

impl Snapshot {
    /// The empty state of a fleet (before recovery publishes).
    pub fn empty(fleet: Arc<Fleet>) -> Snapshot {
        let nodes = fleet
            .nodes
            .iter()
            .map(|n| {
                Arc::new(NodeSnap {
                    cpu_free: n.cpu_milli,
                    mem_free: n.memory_mib,
                    gpus: vec![GpuSnap::default(); n.gpus as usize],
                })
            })
            .collect();
        Snapshot {
            version: 0,
            at: 0,
            fleet,
            nodes,
            tenants: Arc::default(),
            queue: Arc::default(),
            phases: Arc::default(),
            utilisation: Arc::default(),
            trial: None,
            trial_current: false,
        }
    }
}

/// The latest telemetry of the backend.
#[derive(Clone, Debug, Default)]
pub struct Telemetry {
    /// When it was sampled, ms since the epoch (0: none yet).
    pub at: i64,
    pub gpus: Arc<Vec<GpuSample>>,
}

/// Workload records readers may see without the store: every live one and the most recently
/// ended ones.
#[derive(Default)]
pub struct WorkloadCache {
    map: HashMap<WorkloadId, Arc<Workload>>,
    ended: VecDeque<WorkloadId>,
}

/// How many ended workloads stay readable from memory.
const ENDED_KEPT: usize = 20_000;

impl WorkloadCache {
    pub fn get(&self, id: WorkloadId) -> Option<Arc<Workload>> {
        self.map.get(&id).cloned()
    }

    fn put(&mut self, w: Arc<Workload>) {
        if w.phase.is_terminal() && !self.map.get(&w.id).is_some_and(|o| o.phase.is_terminal()) {
            self.ended.push_back(w.id);
            while self.ended.len() > ENDED_KEPT {
                if let Some(old) = self.ended.pop_front() {
                    self.map.remove(&old);
                }
            }
        }
        self.map.insert(w.id, w);
    }
}

/// Where the loop publishes and readers read.
pub struct Published {
    snapshot: RwLock<Arc<Snapshot>>,
    workloads: RwLock<WorkloadCache>,
    telemetry: RwLock<Telemetry>,
    ops: RwLock<Arc<super::ops::FleetOps>>,
}

impl Published {
    pub fn new(fleet: Arc<Fleet>) -> Self {
        Published {
            snapshot: RwLock::new(Arc::new(Snapshot::empty(fleet))),
            workloads: RwLock::default(),
            telemetry: RwLock::default(),
            ops: RwLock::default(),
        }
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.read().expect("lock").clone()
    }

    pub fn workload(&self, id: WorkloadId) -> Option<Arc<Workload>> {
        self.workloads.read().expect("lock").get(id)
    }

    pub fn telemetry(&self) -> Telemetry {
        self.telemetry.read().expect("lock").clone()
    }

    pub(crate) fn set_snapshot(&self, s: Snapshot) {
        *self.snapshot.write().expect("lock") = Arc::new(s);
    }

    pub(crate) fn put_workloads(&self, ws: impl IntoIterator<Item = Arc<Workload>>) {
        let mut c = self.workloads.write().expect("lock");
        for w in ws {
            c.put(w);
        }
    }

    pub(crate) fn clear_workloads(&self) {
        *self.workloads.write().expect("lock") = WorkloadCache::default();
    }

    /// Unhealthy GPUs and node states.
    pub fn ops(&self) -> Arc<super::ops::FleetOps> {
        self.ops.read().expect("lock").clone()
    }

    pub(crate) fn set_ops(&self, ops: Arc<super::ops::FleetOps>) {
        *self.ops.write().expect("lock") = ops;
    }

    pub(crate) fn set_telemetry(&self, t: Telemetry) {
        *self.telemetry.write().expect("lock") = t;
    }
}

/// Per tenant with a budget, the GPU-unit-hours its running work will still use this month
/// from `now`: each workload to its lease's end, or to the month's end without one (one pass
/// over the running work, not over the fleet).
fn committed(sched: &Scheduler, now: i64) -> HashMap<String, f64> {
    let mut out: HashMap<String, f64> = HashMap::new();
    if sched.all_budgets().next().is_none() {
        return out;
    }
    let month_end = tessera_api::month_start_ms(tessera_api::month_start_ms(now) + 32 * 86_400_000);
    for r in sched.running() {
        if sched.budget(&r.tenant).is_none() {
            continue;
        }
        let end = r.ends_at_ms.unwrap_or(month_end).min(month_end);
        let h = r.units.as_f64() * (end - now).max(0) as f64 / 3_600_000.0;
        *out.entry(r.tenant.clone()).or_default() += h;
    }
    out
}

/// Builds snapshots, reusing the nodes that did not change since the last one.
pub(crate) struct SnapshotBuilder {
    version: u64,
    epochs: Vec<u64>,
    nodes: Vec<Arc<NodeSnap>>,
    queue: Arc<QueueSnap>,
    phases: Arc<BTreeMap<Phase, u64>>,
    utilisation: Arc<HashMap<WorkloadId, f64>>,
    trial: Option<Arc<Trial>>,
    /// The engine generation `trial` was copied at.
    trial_generation: u64,
    /// Per tenant with a budget, what its running work will still use this month
    /// ([`TenantSnap::running_unit_hours`]); recomputed with the queue.
    committed: HashMap<String, f64>,
}

impl SnapshotBuilder {
    pub fn new(fleet: &Fleet) -> Self {
        let empty = Snapshot::empty(Arc::new(Fleet {
            catalogue: fleet.catalogue.clone(),
            pools: Vec::new(),
            nodes: Vec::new(),
            levels: Default::default(),
        }));
        SnapshotBuilder {
            version: 0,
            // u64::MAX never equals an engine epoch: every node is built the first time.
            epochs: vec![u64::MAX; fleet.nodes.len()],
            nodes: Vec::new(),
            queue: empty.queue,
            phases: empty.phases,
            utilisation: empty.utilisation,
            trial: None,
            trial_generation: 0,
            committed: HashMap::new(),
        }
    }

    /// Forgets every node (after the scheduler was rebuilt: epochs start again).
    pub fn reset(&mut self) {
        self.epochs.iter_mut().for_each(|e| *e = u64::MAX);
        self.trial = None;
    }

    /// A snapshot of `sched` and the live workloads. `full` also recomputes the queue, phase
    /// counts and utilisation (they are carried over from the last snapshot otherwise). The
    /// engine copy for dry runs is the last one made ([`Self::current_trial`], asked for by a
    /// dry run through the loop; the first is made here), marked as current or not. `tenant_ids`
    /// are the engine's tenant ids.
    pub fn build(
        &mut self,
        fleet: &Arc<Fleet>,
        sched: &Scheduler,
        live: &HashMap<WorkloadId, Live>,
        tenant_ids: &HashMap<String, TenantId>,
        at: i64,
        full: bool,
    ) -> Snapshot {
        let st = sched.engine.state();
        if self.nodes.len() != st.nodes.len() {
            self.nodes = (0..st.nodes.len()).map(|_| Arc::new(NodeSnap::default())).collect();
            self.epochs = vec![u64::MAX; st.nodes.len()];
        }
        for (i, ns) in st.nodes.iter().enumerate() {
            if self.epochs[i] == ns.epoch {
                continue;
            }
            self.epochs[i] = ns.epoch;
            let gpus = ns
                .gpus
                .iter()
                .map(|g| GpuSnap {
                    used_milli: g.used_milli,
                    mig_mask: g.mig_mask,
                    holders: g
                        .holders
                        .iter()
                        .filter_map(|h| {
                            let a = st.allocations.get(h)?;
                            let owner = tessera_sched::cycle::holder_owner(&sched.engine, *h);
                            let (tenant, project) = live
                                .get(&WorkloadId(owner))
                                .map(|l| (l.w.spec.tenant.clone(), l.w.spec.project.clone()))
                                .unwrap_or_default();
                            Some(HolderSnap {
                                workload: owner,
                                tenant,
                                project,
                                grant: a.grant.clone(),
                                units: a.units,
                            })
                        })
                        .collect(),
                })
                .collect();
            self.nodes[i] = Arc::new(NodeSnap {
                cpu_free: ns.cpu_free,
                mem_free: ns.mem_free,
                gpus,
            });
        }
        let mut tenants: BTreeMap<String, TenantSnap> = BTreeMap::new();
        for (tenant, class, q) in sched.all_quotas() {
            tenants
                .entry(tenant.clone())
                .or_default()
                .quotas
                .push((class.clone(), q, sched.held(tenant, class)));
        }
        if full {
            self.committed = committed(sched, at);
        }
        for (tenant, budget) in sched.all_budgets() {
            let t = tenants.entry(tenant.clone()).or_default();
            t.budget = Some((budget, sched.spent(tenant)));
            t.running_unit_hours = self.committed.get(tenant).copied().unwrap_or(0.0);
        }
        if full {
            let mut queue = QueueSnap {
                next_end: vec![None; fleet.pools.len()],
                ..QueueSnap::default()
            };
            for r in sched.running().filter(|r| !r.stopping) {
                let (Some(end), Some(n)) = (r.ends_at_ms, fleet.nodes.get(r.node.0 as usize)) else {
                    continue;
                };
                if let Some(e) = queue.next_end.get_mut(n.pool.0 as usize) {
                    *e = Some(e.map_or(end, |x| x.min(end)));
                }
            }
            // Counted under borrowed keys, copied once per distinct key at the end: a long queue
            // has few tenants, classes and priorities.
            let mut depth: HashMap<(&str, &str, &str), (u64, i64)> = HashMap::new();
            let mut blocked: HashMap<(&str, Option<ReasonCode>), u64> = HashMap::new();
            let mut phases: BTreeMap<Phase, u64> = BTreeMap::new();
            let mut utilisation = HashMap::with_capacity(self.utilisation.len());
            for l in live.values() {
                let w = &l.w;
                *phases.entry(w.phase).or_default() += 1;
                if let Some(u) = l.utilisation() {
                    utilisation.insert(w.id, u);
                }
                if w.phase.is_waiting() {
                    let e = depth
                        .entry((&w.spec.tenant, &l.class, &w.spec.priority))
                        .or_insert((0, w.created_at));
                    e.0 += 1;
                    e.1 = e.1.min(w.created_at);
                    let code = w.reason.as_ref().map(|r| r.code);
                    *blocked.entry((&l.class, code)).or_default() += 1;
                    queue.waiting.push(Waiting {
                        workload: w.clone(),
                        class: l.class.clone(),
                    });
                }
            }
            queue.depth = depth
                .into_iter()
                .map(|((t, c, p), v)| ((t.to_string(), c.to_string(), p.to_string()), v))
                .collect();
            queue.blocked = blocked.into_iter().map(|((c, r), n)| ((c.to_string(), r), n)).collect();
            queue
                .waiting
                .sort_unstable_by_key(|x| (x.workload.created_at, x.workload.id));
            self.queue = Arc::new(queue);
            self.phases = Arc::new(phases);
            self.utilisation = Arc::new(utilisation);
            // The engine is copied for dry runs when one asks for it ([`Cmd::Trial`]), not with
            // every snapshot: under a stream of creations the engine changes with each batch,
            // and copying it with each full snapshot took about 3 % of the server's CPU.
            // The first copy is made here, for the readers that need only the fleet's shape.
            if self.trial.is_none() {
                self.current_trial(sched, tenant_ids);
            }
        }
        self.version += 1;
        Snapshot {
            version: self.version,
            at,
            fleet: fleet.clone(),
            nodes: self.nodes.clone(),
            tenants: Arc::new(tenants),
            queue: self.queue.clone(),
            phases: self.phases.clone(),
            utilisation: self.utilisation.clone(),
            trial: self.trial.clone(),
            trial_current: self.trial_is_current(sched),
        }
    }

    /// Whether the last copy for dry runs is `sched`'s engine and holds as they are now.
    fn trial_is_current(&self, sched: &Scheduler) -> bool {
        matches!(&self.trial, Some(t) if self.trial_generation == sched.engine.generation() && sched.holds_match(&t.holds))
    }

    /// The copy for dry runs of `sched`'s engine and holds as they are now, made again only
    /// when the engine changed since the last copy (one pass over the fleet) and, for the holds
    /// (a few), whenever they changed. `tenant_ids` are the engine's tenant ids.
    pub fn current_trial(&mut self, sched: &Scheduler, tenant_ids: &HashMap<String, TenantId>) -> Arc<Trial> {
        match &self.trial {
            Some(t) if self.trial_generation == sched.engine.generation() => {
                if !sched.holds_match(&t.holds) {
                    self.trial = Some(Arc::new(t.with_holds(tenant_ids.clone(), sched.hold_book())));
                }
            }
            _ => {
                self.trial = Some(Arc::new(Trial::new(
                    sched.engine.copy(),
                    tenant_ids.clone(),
                    sched.hold_book(),
                )));
                self.trial_generation = sched.engine.generation();
            }
        }
        self.trial.clone().expect("made above")
    }
}
