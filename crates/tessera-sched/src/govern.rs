//! Capacity governance: quotas, budgets, priority classes, queueing with fair share and
//! backfill, and preemption — the scheduler cycle on top of the placement engine.
//!
//! The [`Scheduler`] runs ordered actions over its snapshot of the fleet, KAI-Scheduler style:
//! **admit** (constraint, budget and quota checks), **allocate** (queue order: priority class,
//! then fair share, then arrival; smaller requests may backfill past a blocked head), **reclaim**
//! (a tenant within its guaranteed share takes capacity back from borrowers) and **preempt** (a
//! higher priority class displaces lower ones). Policies are small pieces: the priority classes
//! and quota table are data, the queue order is [`Scheduler::order_key`], victim cost is
//! [`victim_cost`]. Pure and deterministic: time is passed in by the caller.
//!
//! All amounts are GPU units (whole = 1, MIG = memory-slice share, fraction = milli/1000) per
//! resource class: a pool name, or `pool/MODEL` for a GPU model within a pool.
//!
//! **Starvation bound of backfill.** A request that cannot be placed lets smaller ones go ahead
//! only while it has waited less than `backfill_max_wait_ms`; after that the first such request
//! of a pool *reserves* one node there (the one with the most free units): nothing else is
//! placed on that node until the reserving request is, so capacity freed there by finishing
//! work accumulates for it, while smaller requests keep backfilling on every other node. It
//! therefore waits at most `backfill_max_wait_ms`, plus the time the work running on the
//! reserved node needs to finish (their durations or leases), plus any time taken by requests of
//! higher priority (one reservation per pool, taken in queue order).
//!
//! **Preemption bound (anti-thrash).** Reclaim only takes from *borrowers* (workloads admitted
//! above their tenant's guaranteed share) of other tenants, and only for a request that stays
//! within its own guaranteed share; a reclaimed borrower is requeued and can only come back by
//! borrowing again, which a within-guarantee request can reclaim only after the minimum
//! runtime. Priority preemption only goes downwards in rank, and `critical` is never
//! preempted. So two tenants pushing against each other's guarantees cause at most one
//! preemption per borrower admission, and a workload is preempted at most once per
//! `min_runtime_ms` of running.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use tessera_model::{Fleet, GpuUnits, PoolId, Request};

use crate::engine::Engine;
use crate::reason::{BudgetExceeded, LimitExceeded, LimitScope, PreemptCause, Refusal, Wait};
use crate::state::Allocation;

/// A priority class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PriorityClass {
    pub name: String,
    /// 0 is the most important.
    pub rank: u8,
    /// Whether workloads of this class may ever be preempted.
    pub preemptible: bool,
}

/// A tenant's share of one resource class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    /// Always available to the tenant, reclaimable from borrowers.
    pub guaranteed: GpuUnits,
    /// The most it may hold, borrowing included; `None` = no limit.
    pub limit: Option<GpuUnits>,
}

/// The scheduler's settings.
#[derive(Clone, Debug)]
pub struct GovernConfig {
    pub classes: Vec<PriorityClass>,
    /// A workload runs at least this long before it can be preempted.
    pub min_runtime_ms: i64,
    /// Half-life of the usage history used for fair share.
    pub half_life_ms: i64,
    /// How long a blocked head lets smaller requests backfill before it reserves its pools.
    pub backfill_max_wait_ms: i64,
    /// At most this many preemption searches per cycle.
    pub max_preemption_searches: usize,
    /// A request within its guarantee reclaims from borrowers only after waiting this long
    /// (capacity often frees by itself sooner; reclaiming at once would churn).
    pub reclaim_after_ms: i64,
}

impl Default for GovernConfig {
    fn default() -> Self {
        GovernConfig {
            classes: vec![
                PriorityClass {
                    name: "critical".into(),
                    rank: 0,
                    preemptible: false,
                },
                PriorityClass {
                    name: "high".into(),
                    rank: 1,
                    preemptible: true,
                },
                PriorityClass {
                    name: "standard".into(),
                    rank: 2,
                    preemptible: true,
                },
                PriorityClass {
                    name: "opportunistic".into(),
                    rank: 3,
                    preemptible: true,
                },
            ],
            min_runtime_ms: 60_000,
            half_life_ms: 3_600_000,
            backfill_max_wait_ms: 300_000,
            max_preemption_searches: 8,
            reclaim_after_ms: 300_000,
        }
    }
}

/// A request as the scheduler sees it.
#[derive(Clone, Debug)]
pub struct Job {
    pub id: u64,
    pub tenant: String,
    pub project: String,
    pub request: Request,
    pub priority: String,
    pub submitted_ms: i64,
    /// Beyond the tenant's limit or budget: wait (true) or be refused (false).
    pub wait_if_over_limit: bool,
}

/// What the scheduler decided for a job or a running workload.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// The job got an allocation. `borrowing`: admitted above the tenant's guaranteed share
    /// (preemptible by reclaim).
    Placed {
        id: u64,
        alloc: Allocation,
        borrowing: bool,
    },
    /// The job waits; the kind of reason changed ([`Wait::same_kind`]).
    Waiting { id: u64, reason: Wait },
    /// The job is refused for good.
    Refused { id: u64, reason: Refusal },
    /// Stop `victim` (grace period, then force) so that `by` can run.
    Preempt { victim: u64, by: u64, cause: PreemptCause },
}

/// Why a victim was chosen, cheapest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct VictimCost {
    /// Admitted within its guarantee (borrowers go first).
    pub within_guarantee: bool,
    /// Higher is more important: `u8::MAX - rank`.
    pub importance: u8,
    /// Tenants furthest above their fair share give first: `u64::MAX - fair share`.
    pub share_room: u64,
    /// Milliseconds of work lost.
    pub work_lost_ms: i64,
}

/// The cost of preempting a running workload: over-quota first, lowest priority, the tenant
/// most above its fair share, least work lost.
pub fn victim_cost(r: &Running, fair_share: f64, now: i64) -> VictimCost {
    VictimCost {
        within_guarantee: !r.borrowing,
        importance: u8::MAX - r.rank,
        share_room: u64::MAX - (fair_share * 1000.0) as u64,
        work_lost_ms: now - r.running_since_ms,
    }
}

/// A limit or budget a job would exceed.
enum Exceeded {
    Limit(LimitExceeded),
    Budget(BudgetExceeded),
}

impl Exceeded {
    fn wait(self) -> Wait {
        match self {
            Exceeded::Limit(l) => Wait::Limit(l),
            Exceeded::Budget(b) => Wait::Budget(b),
        }
    }

    fn refusal(self) -> Refusal {
        match self {
            Exceeded::Limit(l) => Refusal::Limit(l),
            Exceeded::Budget(b) => Refusal::Budget(b),
        }
    }
}

/// Why a job could not be admitted now.
enum Blocked {
    /// Over a limit or budget: wait or be refused, per the request.
    Over(Exceeded),
    /// Recently preempted: may not borrow yet (always waits).
    Backoff(Wait),
    /// No capacity.
    NoCapacity,
}

/// A workload holding capacity.
#[derive(Clone, Debug)]
pub struct Running {
    pub id: u64,
    pub tenant: String,
    pub rank: u8,
    pub preemptible: bool,
    pub borrowing: bool,
    pub running_since_ms: i64,
    pub units: GpuUnits,
    pub keys: Vec<String>,
    /// Being stopped (for a preemption or a cancel): not a candidate again.
    pub stopping: bool,
}

#[derive(Clone, Debug, Default)]
struct TenantBook {
    held: HashMap<String, GpuUnits>,
    /// Decayed usage in unit-milliseconds, and when it was last brought up to date.
    usage: f64,
    usage_at: i64,
    held_total: GpuUnits,
}

/// The scheduler: queue, quotas, running set and the engine.
pub struct Scheduler {
    pub engine: Engine,
    pub cfg: GovernConfig,
    quotas: HashMap<(String, String), Quota>,
    /// Monthly GPU-unit-hour budgets and what has been spent this month.
    budgets: HashMap<String, f64>,
    spent: HashMap<String, f64>,
    books: HashMap<String, TenantBook>,
    queue: Vec<Arc<Queued>>,
    running: HashMap<u64, Running>,
    /// Preemptors waiting for their victims to stop: job → victims.
    nominated: BTreeMap<u64, HashSet<u64>>,
    reasons: HashMap<u64, Wait>,
    /// Per pool, the head that waited past the backfill window and the node held for it.
    reservations: HashMap<PoolId, (u64, u32)>,
    /// Workloads preempted so far: how often and when last.
    preempted: HashMap<u64, (u32, i64)>,
    /// Capacity or quotas changed since the last full pass over the queue.
    dirty: bool,
}

impl fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scheduler")
            .field("queued", &self.queue.len())
            .field("running", &self.running.len())
            .finish()
    }
}

/// Queue position: (priority rank, fair share × 1000, submitted at, id); lower goes first.
pub type OrderKey = (u8, u64, i64, u64);

/// A waiting job and its capacity key (computed once).
struct Queued {
    job: Job,
    key: Request,
}

impl Queued {
    fn new(job: Job) -> Self {
        let key = capacity_key(&job.request);
        Queued { job, key }
    }
}

/// What decides whether a request finds capacity: everything but the tenant, which matters
/// only for fractions (time-shared GPUs keep tenants apart).
fn capacity_key(r: &Request) -> Request {
    let mut k = r.clone();
    if !matches!(k.shape, tessera_model::Shape::Fraction { .. }) {
        k.tenant = None;
    }
    k
}

/// The quota key of a project's sub-quota within its tenant (across all pools).
pub fn project_key(project: &str) -> String {
    format!("project:{project}")
}

/// The resource-class keys of an allocation: its pool and `pool/MODEL`.
pub fn class_keys(fleet: &Fleet, a: &Allocation) -> Vec<String> {
    let node = fleet.node(a.node);
    let pool = &fleet.pool(node.pool).name;
    vec![pool.clone(), format!("{pool}/{}", fleet.catalogue.get(node.model).name)]
}

impl Scheduler {
    pub fn new(engine: Engine, cfg: GovernConfig) -> Self {
        Scheduler {
            engine,
            cfg,
            quotas: HashMap::new(),
            budgets: HashMap::new(),
            spent: HashMap::new(),
            books: HashMap::new(),
            queue: Vec::new(),
            running: HashMap::new(),
            nominated: BTreeMap::new(),
            reasons: HashMap::new(),
            preempted: HashMap::new(),
            reservations: HashMap::new(),
            dirty: true,
        }
    }

    pub fn class(&self, name: &str) -> Option<&PriorityClass> {
        self.cfg.classes.iter().find(|c| c.name == name)
    }

    fn rank(&self, name: &str) -> u8 {
        self.class(name).map(|c| c.rank).unwrap_or(u8::MAX / 2)
    }

    /// Sets (or with `None` removes) a tenant's quota for a resource class.
    pub fn set_quota(&mut self, tenant: &str, class: &str, q: Option<Quota>) {
        match q {
            Some(q) => self.quotas.insert((tenant.to_string(), class.to_string()), q),
            None => self.quotas.remove(&(tenant.to_string(), class.to_string())),
        };
        self.dirty = true;
    }

    pub fn quota(&self, tenant: &str, class: &str) -> Option<Quota> {
        self.quotas.get(&(tenant.to_string(), class.to_string())).copied()
    }

    /// Every quota of a tenant.
    pub fn quotas_of(&self, tenant: &str) -> Vec<(String, Quota)> {
        let mut v: Vec<_> = self
            .quotas
            .iter()
            .filter(|((t, _), _)| t == tenant)
            .map(|((_, c), q)| (c.clone(), *q))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Every quota: (tenant, resource class, quota), in no particular order.
    pub fn all_quotas(&self) -> impl Iterator<Item = (&String, &String, Quota)> {
        self.quotas.iter().map(|((t, c), q)| (t, c, *q))
    }

    /// Every budget: (tenant, GPU-unit-hours per month), in no particular order.
    pub fn all_budgets(&self) -> impl Iterator<Item = (&String, f64)> {
        self.budgets.iter().map(|(t, b)| (t, *b))
    }

    /// Sets a tenant's monthly budget in GPU-unit-hours (`None` = unlimited).
    pub fn set_budget(&mut self, tenant: &str, unit_hours: Option<f64>) {
        match unit_hours {
            Some(b) => self.budgets.insert(tenant.to_string(), b),
            None => self.budgets.remove(tenant),
        };
        self.dirty = true;
    }

    pub fn budget(&self, tenant: &str) -> Option<f64> {
        self.budgets.get(tenant).copied()
    }

    /// What the tenant has spent this month (GPU-unit-hours), as the ledger says.
    pub fn set_spent(&mut self, tenant: &str, unit_hours: f64) {
        self.spent.insert(tenant.to_string(), unit_hours);
    }

    pub fn spent(&self, tenant: &str) -> f64 {
        self.spent.get(tenant).copied().unwrap_or(0.0)
    }

    /// Units a tenant holds in a class.
    pub fn held(&self, tenant: &str, class: &str) -> GpuUnits {
        self.books
            .get(tenant)
            .and_then(|b| b.held.get(class))
            .copied()
            .unwrap_or_default()
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// The waiting jobs, in arrival order.
    pub fn queue(&self) -> impl Iterator<Item = &Job> {
        self.queue.iter().map(|q| &q.job)
    }

    pub fn running(&self) -> impl Iterator<Item = &Running> {
        self.running.values()
    }

    pub fn is_borrowing(&self, id: u64) -> Option<bool> {
        self.running.get(&id).map(|r| r.borrowing)
    }

    fn book(&mut self, tenant: &str, now: i64) -> &mut TenantBook {
        let half = self.cfg.half_life_ms.max(1) as f64;
        let b = self.books.entry(tenant.to_string()).or_default();
        if now > b.usage_at {
            let dt = (now - b.usage_at) as f64;
            b.usage = b.usage * (0.5f64).powf(dt / half) + b.held_total.as_f64() * dt;
            b.usage_at = now;
        }
        b
    }

    fn guaranteed_total(&self, tenant: &str) -> f64 {
        self.quotas
            .iter()
            .filter(|((t, c), _)| t == tenant && !c.contains('/'))
            .map(|(_, q)| q.guaranteed.as_f64())
            .sum()
    }

    /// Fair-share key: decayed usage relative to the guaranteed share (lower goes first).
    pub fn fair_share(&self, tenant: &str) -> f64 {
        let usage = self.books.get(tenant).map(|b| b.usage).unwrap_or(0.0);
        usage / self.guaranteed_total(tenant).max(1.0)
    }

    /// Queue order: priority class, then fair share, then arrival.
    pub fn order_key(&self, j: &Job) -> OrderKey {
        (
            self.rank(&j.priority),
            (self.fair_share(&j.tenant) * 1000.0) as u64,
            j.submitted_ms,
            j.id,
        )
    }

    fn account(&mut self, tenant: &str, keys: &[String], units: GpuUnits, add: bool, now: i64) {
        let b = self.book(tenant, now);
        for k in keys {
            let h = b.held.entry(k.clone()).or_default();
            if add {
                *h += units;
            } else {
                *h -= units;
            }
        }
        if add {
            b.held_total += units;
        } else {
            b.held_total -= units;
        }
    }

    /// Checks the tenant's quotas for `units` more in `keys`: `Ok(borrowing)` or the reason it
    /// exceeds a limit.
    fn check_quota(&self, tenant: &str, keys: &[String], units: GpuUnits) -> Result<bool, LimitExceeded> {
        let mut borrowing = true;
        let mut any = false;
        for k in keys {
            let Some(q) = self.quota(tenant, k) else { continue };
            any = true;
            let held = self.held(tenant, k);
            if let Some(limit) = q.limit
                && held + units > limit
            {
                let scope = match k.strip_prefix("project:") {
                    Some(project) => LimitScope::Project {
                        project: project.to_string(),
                    },
                    None => LimitScope::Class {
                        class: k.clone(),
                        guaranteed: q.guaranteed,
                    },
                };
                return Err(LimitExceeded {
                    tenant: tenant.to_string(),
                    scope,
                    held,
                    limit,
                    needs: units,
                });
            }
            // Project sub-quotas cap a project; the tenant's pool and model guarantees decide
            // whether it borrows.
            if !k.starts_with("project:") {
                borrowing = held + units > q.guaranteed;
            }
        }
        Ok(!any || borrowing)
    }

    /// The pools a request may go to, in the engine's order.
    fn pools_for(&self, req: &Request) -> Vec<PoolId> {
        self.engine.scope(req).unwrap_or_default()
    }

    /// Keys of a placement in `pool` on any model (for quota checks before placement).
    fn keys_for_pool(&self, pool: PoolId) -> Vec<String> {
        vec![self.engine.fleet().pool(pool).name.clone()]
    }

    /// Tries to place `job` now within quota. `Err(Some(reason))`: over a limit or budget
    /// (wait or refuse); `Err(None)`: no capacity.
    fn try_admit(&mut self, job: &Job, now: i64) -> Result<Action, Blocked> {
        if let Some(b) = self.budget(&job.tenant) {
            let spent = self.spent(&job.tenant);
            if spent >= b {
                return Err(Blocked::Over(Exceeded::Budget(BudgetExceeded {
                    tenant: job.tenant.clone(),
                    spent,
                    budget: b,
                })));
            }
        }
        let units = job.request.units(&self.engine.fleet().catalogue);
        let mut over: Option<LimitExceeded> = None;
        let mut backoff: Option<Wait> = None;
        for pool in self.pools_for(&job.request) {
            // Pool-level quota first (the model-level one is checked on the placement).
            let mut pool_keys = self.keys_for_pool(pool);
            pool_keys.push(project_key(&job.project));
            if let Err(r) = self.check_quota(&job.tenant, &pool_keys, units) {
                over.get_or_insert(r);
                continue;
            }
            let mut req = job.request.clone();
            req.pool = Some(pool);
            let Ok(p) = self.engine.plan(&req) else { continue };
            let node = self.engine.fleet().node(p.node);
            let keys = vec![
                self.engine.fleet().pool(node.pool).name.clone(),
                format!(
                    "{}/{}",
                    self.engine.fleet().pool(node.pool).name,
                    self.engine.fleet().catalogue.get(node.model).name
                ),
                project_key(&job.project),
            ];
            let borrowing = match self.check_quota(&job.tenant, &keys, p.units) {
                Ok(b) => b,
                Err(r) => {
                    over.get_or_insert(r);
                    continue;
                }
            };
            // A workload preempted for a reclaim or a higher priority may not borrow again at
            // once: it would be preempted again after the minimum runtime, losing work each time.
            if borrowing && let Some(&(times, at)) = self.preempted.get(&job.id) {
                let until = at + self.cfg.min_runtime_ms * (1i64 << times.min(4));
                if now < until {
                    backoff.get_or_insert(Wait::Backoff {
                        times,
                        retry_in_s: (until - now + 999) / 1000,
                    });
                    continue;
                }
            }
            let alloc = self
                .engine
                .commit(job.id, &req, p)
                .expect("a fresh plan commits")
                .clone();
            self.hold(job, keys, alloc.units, borrowing, now);
            return Ok(Action::Placed {
                id: job.id,
                alloc,
                borrowing,
            });
        }
        match (over, backoff) {
            (Some(o), _) => Err(Blocked::Over(Exceeded::Limit(o))),
            (None, Some(b)) => Err(Blocked::Backoff(b)),
            (None, None) => Err(Blocked::NoCapacity),
        }
    }

    /// Books a job's new allocation against its tenant and records it as running.
    fn hold(&mut self, job: &Job, keys: Vec<String>, units: GpuUnits, borrowing: bool, since: i64) {
        self.account(&job.tenant, &keys, units, true, since);
        let rank = self.rank(&job.priority);
        let preemptible = self.class(&job.priority).is_none_or(|c| c.preemptible);
        let running = Running {
            id: job.id,
            tenant: job.tenant.clone(),
            rank,
            preemptible,
            borrowing,
            running_since_ms: since,
            units,
            keys,
            stopping: false,
        };
        self.running.insert(job.id, running);
    }

    /// Checks a new job: refused at once if no node could ever hold it.
    pub fn submit(&mut self, job: Job, now: i64) -> Vec<Action> {
        if let Err(u) = self.engine.plan(&job.request)
            && u.is_constraint()
        {
            return vec![Action::Refused {
                id: job.id,
                reason: Refusal::Constraint(u),
            }];
        }
        self.engine.observe(&job.request);
        let id = job.id;
        self.queue.push(Arc::new(Queued::new(job)));
        // Unchanged capacity: only the newcomer can be placed now.
        let only = if self.dirty { None } else { Some(id) };
        self.cycle_inner(now, only)
    }

    /// Restores a workload that already holds an allocation (start-up).
    pub fn restore(
        &mut self,
        job: &Job,
        alloc: Allocation,
        borrowing: bool,
        running_since_ms: i64,
    ) -> Result<(), String> {
        let fleet = self.engine.fleet().clone();
        let mut keys = class_keys(&fleet, &alloc);
        keys.push(project_key(&job.project));
        let units = alloc.units;
        self.engine.restore(alloc).map_err(|e| e.0)?;
        self.hold(job, keys, units, borrowing, running_since_ms);
        Ok(())
    }

    /// Puts a job back in the queue (start-up, or a preempted batch job being requeued).
    pub fn enqueue(&mut self, job: Job) {
        self.queue.push(Arc::new(Queued::new(job)));
        self.dirty = true;
    }

    /// Marks a running workload as being stopped (cancel or preemption in progress).
    pub fn stopping(&mut self, id: u64) {
        if let Some(r) = self.running.get_mut(&id) {
            r.stopping = true;
        }
    }

    /// Removes a queued job (cancelled before placement).
    pub fn dequeue(&mut self, id: u64) -> bool {
        let before = self.queue.len();
        self.queue.retain(|q| q.job.id != id);
        self.reasons.remove(&id);
        self.nominated.remove(&id);
        self.preempted.remove(&id);
        before != self.queue.len()
    }

    /// Returns a workload's capacity.
    pub fn release(&mut self, id: u64, now: i64) -> Option<Allocation> {
        let a = self.engine.release(id)?;
        if let Some(r) = self.running.remove(&id) {
            self.account(&r.tenant, &r.keys, r.units, false, now);
        }
        for victims in self.nominated.values_mut() {
            victims.remove(&id);
        }
        self.dirty = true;
        Some(a)
    }

    /// One scheduling cycle over the whole queue.
    pub fn cycle(&mut self, now: i64) -> Vec<Action> {
        self.cycle_inner(now, None)
    }

    fn cycle_inner(&mut self, now: i64, only: Option<u64>) -> Vec<Action> {
        let mut actions = Vec::new();
        if only.is_none() {
            self.dirty = false;
        }
        let jobs: Vec<Arc<Queued>> = match only {
            // Unchanged capacity: only the newcomer is tried, no need to order the queue.
            Some(id) => self
                .queue
                .iter()
                .rev()
                .find(|q| q.job.id == id)
                .cloned()
                .into_iter()
                .collect(),
            None => {
                let mut tenants: Vec<String> = self.queue.iter().map(|q| q.job.tenant.clone()).collect();
                tenants.sort_unstable();
                tenants.dedup();
                let mut share: HashMap<String, u64> = HashMap::new();
                for t in tenants {
                    self.book(&t, now);
                    share.insert(t.clone(), (self.fair_share(&t) * 1000.0) as u64);
                }
                // Nominated preemptors whose victims are gone go first; then priority class,
                // fair share, arrival.
                let mut order: Vec<(bool, OrderKey, usize)> = self
                    .queue
                    .iter()
                    .enumerate()
                    .map(|(i, q)| {
                        let j = &q.job;
                        let key = (self.rank(&j.priority), share[&j.tenant], j.submitted_ms, j.id);
                        (!self.nominated.get(&j.id).is_some_and(|v| v.is_empty()), key, i)
                    })
                    .collect();
                order.sort_unstable();
                // Reservations of jobs no longer waiting lapse.
                let queued: HashSet<u64> = self.queue.iter().map(|q| q.job.id).collect();
                self.reservations.retain(|_, (j, _)| queued.contains(j));
                order.iter().map(|&(_, _, i)| self.queue[i].clone()).collect()
            }
        };
        let mut placed: HashSet<u64> = HashSet::new();
        let mut refused: HashSet<u64> = HashSet::new();
        let mut searches = 0;
        // Requests that found no capacity this cycle, with the reason: capacity only shrinks
        // during a cycle, so the same request fails again (shape, host needs and, on shared
        // pools, the tenant are all in the key).
        let mut no_capacity: HashMap<Request, Wait> = HashMap::new();
        for queued in jobs {
            let job = &queued.job;
            if only.is_some_and(|o| o != job.id) {
                continue;
            }
            let nominated = self.nominated.contains_key(&job.id);
            if !nominated && let Some(reason) = no_capacity.get(&queued.key) {
                let reason = reason.clone();
                self.set_reason(job, reason, &mut actions);
                continue;
            }
            let pools = self.pools_for(&job.request);
            // Nodes held for other jobs' reservations are out of reach.
            let blocked: HashSet<u32> = self
                .reservations
                .values()
                .filter(|(j, _)| *j != job.id)
                .map(|(_, n)| *n)
                .collect();
            let any_blocked = !blocked.is_empty();
            if any_blocked {
                self.engine.set_blocked(blocked);
            }
            let admitted = self.try_admit(job, now);
            if any_blocked {
                self.engine.set_blocked(HashSet::new());
            }
            match admitted {
                Ok(a) => {
                    self.reservations.retain(|_, (j, _)| *j != job.id);
                    self.nominated.remove(&job.id);
                    self.reasons.remove(&job.id);
                    placed.insert(job.id);
                    actions.push(a);
                }
                Err(Blocked::Backoff(reason)) => self.set_reason(job, reason, &mut actions),
                Err(Blocked::Over(over)) => {
                    if job.wait_if_over_limit {
                        self.set_reason(job, over.wait(), &mut actions);
                    } else {
                        refused.insert(job.id);
                        actions.push(Action::Refused {
                            id: job.id,
                            reason: over.refusal(),
                        });
                    }
                }
                Err(Blocked::NoCapacity) => {
                    let waited = now - job.submitted_ms;
                    if waited > self.cfg.backfill_max_wait_ms {
                        self.reserve(job, &pools);
                    }
                    if !self.nominated.contains_key(&job.id) && searches < self.cfg.max_preemption_searches {
                        searches += 1;
                        if let Some((victims, cause)) = self.find_victims(job, now) {
                            for v in &victims {
                                self.stopping(*v);
                                let e = self.preempted.entry(*v).or_insert((0, now));
                                *e = (e.0 + 1, now);
                                actions.push(Action::Preempt {
                                    victim: *v,
                                    by: job.id,
                                    cause: cause.clone(),
                                });
                            }
                            let reason = Wait::Preempting {
                                victims: victims.len(),
                                cause,
                            };
                            self.set_reason(job, reason, &mut actions);
                            self.nominated.insert(job.id, victims.into_iter().collect());
                            continue;
                        }
                    }
                    let reason = match self.engine.plan(&job.request) {
                        Err(u) => Wait::Unplaceable(u),
                        Ok(_) => Wait::Held,
                    };
                    no_capacity.insert(queued.key.clone(), reason.clone());
                    self.set_reason(job, reason, &mut actions);
                }
            }
        }
        if !placed.is_empty() || !refused.is_empty() {
            self.queue
                .retain(|q| !placed.contains(&q.job.id) && !refused.contains(&q.job.id));
        }
        actions
    }

    /// Holds one node for a head that has waited past the backfill window, if its pool has no
    /// reservation yet: the node of an allowed model with the most free units, where the head
    /// will fit soonest. Smaller requests keep backfilling everywhere else.
    fn reserve(&mut self, job: &Job, pools: &[PoolId]) {
        let Some(&pool) = pools.iter().find(|p| !self.reservations.contains_key(p)) else {
            return;
        };
        if pools
            .iter()
            .any(|p| self.reservations.get(p).is_some_and(|(j, _)| *j == job.id))
        {
            return;
        }
        let fleet = self.engine.fleet().clone();
        let st = self.engine.state();
        let best = fleet
            .pool(pool)
            .nodes
            .clone()
            .filter(|&n| job.request.allows_model(fleet.nodes[n as usize].model))
            .filter(|n| !self.reservations.values().any(|(_, r)| r == n))
            .max_by_key(|&n| {
                (
                    st.nodes[n as usize]
                        .gpus
                        .iter()
                        .map(|g| g.free_milli() as u64)
                        .sum::<u64>(),
                    std::cmp::Reverse(n),
                )
            });
        if let Some(n) = best {
            self.reservations.insert(pool, (job.id, n));
        }
    }

    /// Records why a job waits. A `Waiting` action (a stored event) is emitted only when the
    /// kind of reason changes ([`Wait::same_kind`]), not every time a free-unit count in it
    /// moves.
    fn set_reason(&mut self, job: &Job, reason: Wait, actions: &mut Vec<Action>) {
        if self.reasons.get(&job.id).is_none_or(|old| !old.same_kind(&reason)) {
            self.reasons.insert(job.id, reason.clone());
            actions.push(Action::Waiting { id: job.id, reason });
        }
    }

    /// Whether something changed since the last full pass (capacity, quotas, the queue).
    pub fn needs_cycle(&self) -> bool {
        self.dirty
    }

    /// Whether `job` is within its guaranteed share in the pools it may use.
    fn within_guarantee(&self, job: &Job, units: GpuUnits) -> bool {
        self.pools_for(&job.request).iter().any(|&p| {
            let k = &self.engine.fleet().pool(p).name;
            self.quota(&job.tenant, k)
                .is_some_and(|q| self.held(&job.tenant, k) + units <= q.guaranteed)
        })
    }

    /// The fewest, cheapest victims whose capacity lets `job` be placed, or `None`.
    fn find_victims(&mut self, job: &Job, now: i64) -> Option<(Vec<u64>, PreemptCause)> {
        let units = job.request.units(&self.engine.fleet().catalogue);
        let rank = self.rank(&job.priority);
        let reclaim = now - job.submitted_ms >= self.cfg.reclaim_after_ms && self.within_guarantee(job, units);
        let min_rt = self.cfg.min_runtime_ms;
        let fleet = self.engine.fleet().clone();
        let pools = self.pools_for(&job.request);
        // Candidates grouped by node; only nodes where the request could run at all.
        let mut by_node: HashMap<u32, Vec<(VictimCost, u64, bool)>> = HashMap::new();
        for r in self.running.values() {
            if r.stopping
                || !r.preemptible
                || now - r.running_since_ms < min_rt
                || r.tenant == job.tenant && r.rank <= rank
            {
                continue;
            }
            let by_priority = r.rank > rank;
            let by_reclaim = reclaim && r.borrowing && r.tenant != job.tenant;
            if !(by_priority || by_reclaim) {
                continue;
            }
            let Some(a) = self.engine.allocation(r.id) else {
                continue;
            };
            let node = fleet.node(a.node);
            if !pools.contains(&node.pool) || !job.request.allows_model(node.model) {
                continue;
            }
            by_node.entry(a.node.0).or_default().push((
                victim_cost(r, self.fair_share(&r.tenant), now),
                r.id,
                by_priority,
            ));
        }
        let mut best: Option<(usize, Vec<VictimCost>, Vec<u64>, bool)> = None;
        // Nodes whose free units plus their candidates' units could hold the request; the nodes
        // that need the fewest victims are tried first, and a one-victim answer ends the search.
        let st = self.engine.state();
        let mut nodes: Vec<(usize, u32)> = by_node
            .iter()
            .filter(|(n, c)| {
                let free: u64 = st.nodes[**n as usize].gpus.iter().map(|g| g.free_milli() as u64).sum();
                let releasable: u64 = c
                    .iter()
                    .filter_map(|(_, id, _)| self.running.get(id))
                    .map(|r| r.units.as_milli())
                    .sum();
                free + releasable >= units.as_milli()
            })
            .map(|(n, c)| (c.len(), *n))
            .collect();
        nodes.sort_unstable();
        for (_, n) in nodes {
            if best.as_ref().is_some_and(|b| b.0 == 1) {
                break;
            }
            let mut cands = by_node.remove(&n).expect("key");
            cands.sort();
            let mut released = Vec::new();
            let mut ok = false;
            for (cost, id, prio) in &cands {
                if best.as_ref().is_some_and(|b| released.len() + 1 > b.0) {
                    break;
                }
                let a = self.engine.release(*id).expect("running has an allocation");
                released.push((a, *cost, *id, *prio));
                if self.engine.plan(&job.request).is_ok() {
                    ok = true;
                    break;
                }
            }
            let set: Vec<u64> = released.iter().map(|r| r.2).collect();
            let costs: Vec<VictimCost> = released.iter().map(|r| r.1).collect();
            let by_prio = released.iter().any(|r| r.3);
            for (a, _, _, _) in released.into_iter().rev() {
                self.engine.restore(a).expect("restoring a just-released allocation");
            }
            if ok {
                let better = match &best {
                    None => true,
                    Some((n0, c0, _, _)) => set.len() < *n0 || (set.len() == *n0 && costs < *c0),
                };
                if better {
                    best = Some((set.len(), costs, set, by_prio));
                }
            }
        }
        let (_, _, victims, by_prio) = best?;
        let cause = if by_prio {
            PreemptCause::Priority {
                by: job.id,
                class: job.priority.clone(),
            }
        } else {
            PreemptCause::Reclaim {
                by: job.id,
                tenant: job.tenant.clone(),
            }
        };
        Some((victims, cause))
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::policy::BestFit;
    use tessera_model::Request;

    fn sched() -> Scheduler {
        let fleet = Arc::new(Fleet::seed());
        Scheduler::new(
            Engine::new(fleet, Box::new(BestFit), 1),
            GovernConfig {
                min_runtime_ms: 1000,
                reclaim_after_ms: 0,
                ..Default::default()
            },
        )
    }

    fn job(id: u64, tenant: &str, gpus: u8, prio: &str, now: i64) -> Job {
        Job {
            id,
            tenant: tenant.into(),
            project: "p".into(),
            request: Request::whole(gpus).with_pool(PoolId(0)),
            priority: prio.into(),
            submitted_ms: now,
            wait_if_over_limit: true,
        }
    }

    fn placed(a: &[Action]) -> Vec<u64> {
        a.iter()
            .filter_map(|x| {
                if let Action::Placed { id, .. } = x {
                    Some(*id)
                } else {
                    None
                }
            })
            .collect()
    }

    fn preempted(a: &[Action]) -> Vec<u64> {
        a.iter()
            .filter_map(|x| {
                if let Action::Preempt { victim, .. } = x {
                    Some(*victim)
                } else {
                    None
                }
            })
            .collect()
    }

    #[test]
    fn borrow_then_reclaim() {
        let mut s = sched();
        // training: 128 GPUs; each tenant is guaranteed 64.
        for t in ["a", "b"] {
            s.set_quota(
                t,
                "training",
                Some(Quota {
                    guaranteed: GpuUnits::whole(64),
                    limit: Some(GpuUnits::whole(128)),
                }),
            );
        }
        // a borrows the whole pool.
        for i in 0..16 {
            let acts = s.submit(job(i, "a", 8, "standard", 0), 0);
            assert_eq!(placed(&acts), vec![i]);
        }
        assert_eq!(s.is_borrowing(15), Some(true));
        assert_eq!(s.is_borrowing(0), Some(false));
        // b asks within its guarantee: waits, and after the minimum runtime reclaims.
        let acts = s.submit(job(100, "b", 8, "standard", 10), 10);
        assert!(preempted(&acts).is_empty(), "minimum runtime honoured: {acts:?}");
        let acts = s.cycle(2000);
        let v = preempted(&acts);
        assert_eq!(v.len(), 1, "{acts:?}");
        assert!(s.is_borrowing(v[0]).unwrap(), "only borrowers are reclaimed");
        // the victim stops; the owner is admitted.
        s.release(v[0], 2100);
        let acts = s.cycle(2100);
        assert_eq!(placed(&acts), vec![100]);
        assert_eq!(s.is_borrowing(100), Some(false));
    }

    #[test]
    fn priority_preemption_picks_the_minimal_victim_set_and_spares_critical() {
        let mut s = sched();
        // Fill 15 nodes with one 8-GPU opportunistic job each, and one node with 8 single GPUs.
        for i in 0..15 {
            s.submit(job(i, "a", 8, if i == 0 { "critical" } else { "opportunistic" }, 0), 0);
        }
        for i in 0..8 {
            s.submit(job(100 + i, "a", 1, "opportunistic", 0), 0);
        }
        let acts = s.submit(job(500, "b", 8, "high", 5000), 5000);
        let v = preempted(&acts);
        assert_eq!(v.len(), 1, "one 8-GPU victim beats eight 1-GPU ones: {acts:?}");
        assert_ne!(v[0], 0, "critical is never preempted");
        assert!(v[0] < 15);
    }

    #[test]
    fn limits_make_requests_wait_or_be_refused_with_the_figures() {
        let mut s = sched();
        s.set_quota(
            "a",
            "training",
            Some(Quota {
                guaranteed: GpuUnits::whole(8),
                limit: Some(GpuUnits::whole(10)),
            }),
        );
        assert_eq!(placed(&s.submit(job(1, "a", 8, "standard", 0), 0)), vec![1]);
        let acts = s.submit(job(2, "a", 4, "standard", 0), 0);
        let Action::Waiting { reason, .. } = &acts[0] else {
            panic!("{acts:?}")
        };
        assert_eq!(reason.code(), "quota");
        assert_eq!(
            reason.to_string(),
            "tenant a holds 8 of its 8 guaranteed training units (limit 10); this request needs 4"
        );
        let mut j = job(3, "a", 4, "standard", 0);
        j.wait_if_over_limit = false;
        let acts = s.submit(j, 0);
        assert!(
            matches!(&acts[0], Action::Refused { id: 3, reason: Refusal::Limit(l) } if l.needs == GpuUnits::whole(4)),
            "{acts:?}"
        );
        // 2 more fit under the limit, and borrow.
        let acts = s.submit(job(4, "a", 2, "standard", 0), 0);
        assert_eq!(placed(&acts), vec![4]);
        assert_eq!(s.is_borrowing(4), Some(true));
    }

    #[test]
    fn project_sub_quotas_cap_a_project() {
        let mut s = sched();
        s.set_quota(
            "a",
            "training",
            Some(Quota {
                guaranteed: GpuUnits::whole(32),
                limit: None,
            }),
        );
        s.set_quota(
            "a",
            &project_key("p"),
            Some(Quota {
                guaranteed: GpuUnits::ZERO,
                limit: Some(GpuUnits::whole(8)),
            }),
        );
        assert_eq!(placed(&s.submit(job(1, "a", 8, "standard", 0), 0)), vec![1]);
        assert_eq!(
            s.is_borrowing(1),
            Some(false),
            "the tenant's guarantee decides borrowing"
        );
        let acts = s.submit(job(2, "a", 1, "standard", 0), 0);
        let Action::Waiting { reason, .. } = &acts[0] else {
            panic!("{acts:?}")
        };
        let Wait::Limit(l) = reason else { panic!("{reason:?}") };
        assert_eq!(l.scope, LimitScope::Project { project: "p".into() });
        assert_eq!(
            reason.to_string(),
            "project p of tenant a holds 8 GPU units of its limit 8; this request needs 1"
        );
        let mut other = job(3, "a", 1, "standard", 0);
        other.project = "q".into();
        assert_eq!(
            placed(&s.submit(other, 0)),
            vec![3],
            "another project of the tenant is not capped"
        );
    }

    #[test]
    fn budgets_refuse_with_the_figure() {
        let mut s = sched();
        s.set_budget("a", Some(100.0));
        s.set_spent("a", 100.5);
        let mut j = job(1, "a", 1, "standard", 0);
        j.wait_if_over_limit = false;
        let acts = s.submit(j, 0);
        let Action::Refused { reason, .. } = &acts[0] else {
            panic!("{acts:?}")
        };
        assert_eq!(reason.code(), "budget");
        assert_eq!(
            reason.to_string(),
            "tenant a has spent 100.5 of its 100.0 GPU-unit-hour budget for this month"
        );
    }

    #[test]
    fn backfill_does_not_starve_the_head() {
        let mut s = sched();
        // Every node has 7 of 8 GPUs busy: the 8-GPU head cannot fit, 1-GPU jobs can.
        for n in 0..16 {
            s.submit(job(n, "a", 7, "standard", 0), 0);
        }
        s.submit(job(100, "b", 8, "standard", 1), 1);
        let acts = s.submit(job(101, "c", 1, "standard", 2), 2);
        assert_eq!(placed(&acts), vec![101], "backfill while the head is young");
        s.release(101, 3);
        // Past the backfill window the head reserves one node; small jobs still backfill on
        // the others, never on the reserved one.
        let late = 1 + s.cfg.backfill_max_wait_ms + 1;
        s.cycle(late);
        let (head, reserved) = s.reservations.values().copied().next().expect("the head holds a node");
        assert_eq!(head, 100);
        for i in 0..15 {
            let acts = s.submit(job(200 + i, "c", 1, "standard", late), late);
            let Some(Action::Placed { alloc, .. }) = acts.iter().find(|a| matches!(a, Action::Placed { .. })) else {
                panic!("small job {i} should backfill: {acts:?}")
            };
            assert_ne!(alloc.node.0, reserved, "the reserved node stays free for the head");
        }
        // The work on the reserved node ends: the head gets the node, not the small job waiting.
        let on_reserved = (0..16)
            .find(|id| s.engine.allocation(*id).is_some_and(|a| a.node.0 == reserved))
            .unwrap();
        s.submit(job(300, "c", 1, "standard", late + 1), late + 1);
        s.release(on_reserved, late + 2);
        let acts = s.cycle(late + 2);
        assert_eq!(placed(&acts)[0], 100, "{acts:?}");
    }

    #[test]
    fn a_waiting_job_is_reported_again_only_when_its_kind_of_reason_changes() {
        let mut s = sched();
        let waits = |acts: &[Action]| -> Vec<Wait> {
            acts.iter()
                .filter_map(|a| match a {
                    Action::Waiting { id: 100, reason } => Some(reason.clone()),
                    _ => None,
                })
                .collect()
        };
        // Every node has 7 of 8 GPUs busy: 16 units free, none on one node.
        for n in 0..16 {
            s.submit(job(n, "a", 7, "standard", 0), 0);
        }
        let w = waits(&s.submit(job(100, "b", 8, "standard", 1), 1));
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].code(), "fragmentation");
        // Fewer free units, same obstacle: nothing new to record.
        for i in 0..4 {
            s.submit(job(200 + i, "c", 1, "standard", 2), 2);
        }
        assert!(waits(&s.cycle(3)).is_empty());
        // Too few free units in total: now it is a capacity problem.
        for i in 4..9 {
            s.submit(job(200 + i, "c", 1, "standard", 4), 4);
        }
        let w = waits(&s.cycle(5));
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].code(), "no-capacity");
    }

    #[test]
    fn fair_share_orders_equal_priorities() {
        let mut s = sched();
        for t in ["a", "b"] {
            s.set_quota(
                t,
                "training",
                Some(Quota {
                    guaranteed: GpuUnits::whole(64),
                    limit: None,
                }),
            );
        }
        for i in 0..16 {
            s.submit(job(i, "a", 8, "standard", 0), 0);
        }
        // Both wait; a has used a lot, b nothing: b goes first when a node frees.
        s.submit(job(50, "a", 8, "standard", 10), 10);
        s.submit(job(51, "b", 8, "standard", 20), 20);
        s.release(3, 3_600_000);
        let acts = s.cycle(3_600_000);
        assert_eq!(placed(&acts), vec![51]);
    }

    #[test]
    fn thrash_is_bounded() {
        let mut s = sched();
        for t in ["a", "b"] {
            s.set_quota(
                t,
                "training",
                Some(Quota {
                    guaranteed: GpuUnits::whole(64),
                    limit: None,
                }),
            );
        }
        let mut now = 0;
        let mut id = 0;
        let mut preemptions = 0;
        let mut admissions = 0;
        let mut running: Vec<u64> = Vec::new();
        // Both tenants keep 12 requests of 8 GPUs outstanding against a 16-node pool.
        for _round in 0..50 {
            for t in ["a", "b"] {
                let mine = s.queue().filter(|j| j.tenant == t).count();
                for _ in mine..12 {
                    id += 1;
                    let acts = s.submit(job(id, t, 8, "standard", now), now);
                    admissions += placed(&acts).len();
                    for v in preempted(&acts) {
                        preemptions += 1;
                        s.release(v, now);
                    }
                    running.extend(placed(&acts));
                }
            }
            now += 1000;
            let acts = s.cycle(now);
            admissions += placed(&acts).len();
            for v in preempted(&acts) {
                preemptions += 1;
                s.release(v, now);
            }
        }
        let borrowed: usize = s.running().filter(|r| r.borrowing).count();
        // Bound: each preemption removes a borrower, and a borrower exists only by admission.
        assert!(
            preemptions <= admissions,
            "{preemptions} preemptions for {admissions} admissions"
        );
        // Stable state: each tenant holds its guarantee, nobody borrows, nothing more moves.
        assert_eq!(s.held("a", "training"), GpuUnits::whole(64));
        assert_eq!(s.held("b", "training"), GpuUnits::whole(64));
        assert_eq!(borrowed, 0);
        let before = preemptions;
        let acts = s.cycle(now + 100_000);
        assert!(
            preempted(&acts).is_empty() && placed(&acts).is_empty(),
            "stable: {acts:?} after {before}"
        );
    }
}
