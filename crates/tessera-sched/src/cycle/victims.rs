//! The victim search reclaim and preempt share: the fewest, cheapest running workloads whose
//! capacity would let a starved job be placed. Each rule says which jobs may search and which
//! workloads they may take; the [victim-order plugin](super::plugins) says which are cheapest.
//!
//! Candidates are grouped by node in an index the scheduler keeps as work starts, stops and
//! moves ([`VictimIndex`]), so that a search reads only the nodes of its pools, never the whole
//! running set; the nodes that need the fewest victims are tried first, and on each node the
//! cheapest candidates are tentatively evicted one by one through a [`Statement`] until the job
//! fits, then rolled back: chosen victims keep their capacity until they have actually stopped.
//! A one-victim answer ends the search.
//!
//! The search budget is shared: the first `max_preemption_searches` starved jobs in queue order
//! get a slot, for reclaim and preempt alike, so a more important job is never crowded out by
//! searches further down the queue. Within a pass, a request shape whose search found nothing is
//! not searched again.

use std::collections::HashMap;

use rustc_hash::{FxHashMap, FxHashSet};

use tessera_model::Request;

use super::allocate;
use super::plugins::VictimCost;
use super::session::{Session, Status};
use super::statement::Statement;
use super::{Job, Running, Scheduler};
use crate::reason::PreemptCause;

/// Who may take capacity from whom, and why.
pub(super) trait VictimRule {
    /// Whether `job` may look for victims this way now.
    fn applies(&self, s: &Scheduler, job: &Job, now: i64) -> bool;
    /// For a job that may not look for victims yet only because it has not waited long
    /// enough: how many milliseconds more.
    fn due_in_ms(&self, s: &Scheduler, job: &Job, now: i64) -> Option<i64>;
    /// Whether `victim` may be stopped for `job`, whose priority class has rank `rank`.
    fn may_take(&self, job: &Job, rank: u8, victim: &Victim<'_>) -> bool;
    fn cause(&self, job: &Job) -> PreemptCause;
    /// The code of its causes (`reclaim`, `priority`).
    fn code(&self) -> &'static str;
}

/// How many nodes the new forecasts of one pass may read, summed over the pools each gang
/// can use: a forecast for a gang holding no nodes plans a hold and trial placements over its
/// pools (1–1.5 ms on the 2,666-node training pool of `synthetic:10000`, mostly reading the
/// leases of the work on every node), so this is one such forecast a pass there, as before
/// (four a pass cost `tessera bench cycle --gangs-pct 1` 4 ms at the median), and every
/// waiting gang's in a pass or two on pools of tens or hundreds of nodes (157 a pass on the
/// seed's 16 training nodes). One forecast a pass is always made; the gangs past the budget
/// keep theirs, and those not forecast yet get one in a later pass.
const FORECAST_NODES_PER_PASS: usize = 2_500;
/// A forecast is planned again after this long (the default backfill window, after which a
/// gang holds nodes and its reason comes from its own search), or once its time has come.
const FORECAST_FOR_MS: i64 = 300_000;

/// What a rule knows of a candidate victim.
pub(super) struct Victim<'a> {
    pub tenant: &'a str,
    pub rank: u8,
    pub borrowing: bool,
}

/// A preemptible running workload as the searches read it.
struct Candidate {
    id: u64,
    /// Index into [`VictimIndex::tenants`].
    tenant: u32,
    rank: u8,
    borrowing: bool,
    stopping: bool,
    units_milli: u64,
    /// When it has run its minimum runtime (it may be taken from then on).
    takeable_from_ms: i64,
}

/// The preemptible running workloads by node, kept as workloads start, stop and move, so that
/// a search reads only the nodes of its pools, never the whole running set.
#[derive(Default)]
pub(super) struct VictimIndex {
    by_node: Vec<Vec<Candidate>>,
    tenants: Vec<String>,
    tenant_index: HashMap<String, u32>,
}

impl VictimIndex {
    /// A workload started (or was restored) on its node.
    pub fn add(&mut self, r: &Running) {
        if !r.preemptible {
            return;
        }
        let tenant = match self.tenant_index.get(&r.tenant) {
            Some(&t) => t,
            None => {
                self.tenants.push(r.tenant.clone());
                let t = self.tenants.len() as u32 - 1;
                self.tenant_index.insert(r.tenant.clone(), t);
                t
            }
        };
        // A gang is a candidate on each of its nodes: stopping it frees them all, and a
        // search on any one of them may take it (its cost is the whole gang's).
        for node in r.nodes() {
            let n = node.0 as usize;
            if self.by_node.len() <= n {
                self.by_node.resize_with(n + 1, Vec::new);
            }
            self.by_node[n].push(Candidate {
                id: r.id,
                tenant,
                rank: r.rank,
                borrowing: r.borrowing,
                stopping: r.stopping,
                units_milli: r.units.as_milli(),
                takeable_from_ms: r.running_since_ms.saturating_add(r.min_runtime_ms),
            });
        }
    }

    /// A workload left its node(s) (stopped, or moved away).
    pub fn remove(&mut self, r: &Running) {
        for node in r.nodes() {
            if let Some(c) = self.by_node.get_mut(node.0 as usize)
                && let Some(i) = c.iter().position(|c| c.id == r.id)
            {
                c.swap_remove(i);
            }
        }
    }

    /// A workload's stopping flag changed.
    pub fn set_stopping(&mut self, r: &Running) {
        for node in r.nodes() {
            if let Some(c) = self.by_node.get_mut(node.0 as usize)
                && let Some(c) = c.iter_mut().find(|c| c.id == r.id)
            {
                c.stopping = r.stopping;
            }
        }
    }

    /// The candidates on node `n` that are not stopping, with what a rule needs to know of
    /// them.
    fn candidates(&self, n: u32) -> impl Iterator<Item = (&Candidate, Victim<'_>)> {
        self.by_node
            .get(n as usize)
            .map_or(&[][..], |c| c.as_slice())
            .iter()
            .filter(|c| !c.stopping)
            .map(|c| {
                let v = Victim {
                    tenant: &self.tenants[c.tenant as usize],
                    rank: c.rank,
                    borrowing: c.borrowing,
                };
                (c, v)
            })
    }

    /// The candidates on node `n` that may be taken at `now` (not stopping, past their minimum
    /// runtime).
    fn takeable(&self, n: u32, now: i64) -> impl Iterator<Item = (&Candidate, Victim<'_>)> {
        self.candidates(n).filter(move |(c, _)| now >= c.takeable_from_ms)
    }
}

#[cfg(test)]
impl VictimIndex {
    /// Whether the index holds exactly the preemptible running workloads of `s`, each on its
    /// node with its current figures.
    pub fn agrees_with(&self, s: &Scheduler) -> bool {
        let mut held: Vec<(u32, u64, bool, i64, u8, bool, &str)> = Vec::new();
        for (n, c) in self.by_node.iter().enumerate() {
            for c in c {
                let t = self.tenants[c.tenant as usize].as_str();
                held.push((n as u32, c.id, c.stopping, c.takeable_from_ms, c.rank, c.borrowing, t));
            }
        }
        let mut want: Vec<(u32, u64, bool, i64, u8, bool, &str)> = s
            .running
            .values()
            .filter(|r| r.preemptible)
            .flat_map(|r| {
                let from = r.running_since_ms + r.min_runtime_ms;
                r.nodes()
                    .map(move |n| (n.0, r.id, r.stopping, from, r.rank, r.borrowing, r.tenant.as_str()))
            })
            .collect();
        held.sort_unstable();
        want.sort_unstable();
        held == want
    }
}

/// One pass of victim searches over the starved jobs, in queue order.
pub(super) fn pass(s: &mut Session<'_>, rule: &dyn VictimRule) {
    let now = s.now;
    let mut fruitless: FxHashSet<Request> = FxHashSet::default();
    // Gangs holding no nodes yet are told when they will take capacity: a few new forecasts a
    // pass, apart from the searches' budget (a forecast decides nothing), each kept a while.
    let mut budget = FORECAST_NODES_PER_PASS;
    let mut forecasts = std::mem::take(&mut s.sched.forecasts);
    let mut kept: FxHashMap<(u64, &'static str), (i64, Option<i64>)> = FxHashMap::default();
    let jobs = s.jobs.clone();
    for (i, q) in jobs.iter().enumerate() {
        let job = &q.job;
        if let Some(g) = &job.gang
            && matches!(s.status(i), Status::Starved { searchable: false, .. })
            && !s.sched.nominated.contains_key(&job.id)
            && !s.sched.preempted.contains_key(&job.id)
            && held(s.sched, job, g).is_none()
        {
            let key = (job.id, rule.code());
            let forecast = match forecasts.remove(&key) {
                Some((at, from)) if now - at < FORECAST_FOR_MS && from.is_none_or(|f| f > now) => Some((at, from)),
                _ if budget > 0 => {
                    let fleet = s.sched.engine.fleet();
                    let nodes: usize = q.scope.iter().map(|&p| fleet.pool(p).nodes.len()).sum();
                    budget = budget.saturating_sub(nodes.max(1));
                    Some((now, unheld_gang_takeable_from(s.sched, job, g, &q.scope, rule, now)))
                }
                _ => None,
            };
            if let Some((at, from)) = forecast {
                kept.insert(key, (at, from));
                if let Some(from) = from {
                    s.preempts_in(i, rule.cause(job), from - now);
                }
            }
            continue;
        }
        if !matches!(s.status(i), Status::Starved { searchable: true, .. })
            || s.sched.nominated.contains_key(&job.id)
            // No cascade: a preempted workload's requeue never preempts in turn.
            || s.sched.preempted.contains_key(&job.id)
            // Gangs share one key but are searched each on its own nodes.
            || (job.gang.is_none() && fruitless.contains(&q.key))
        {
            continue;
        }
        // The budget goes to the head of the queue whichever pass runs first: a job takes its
        // slot even where this pass's rule does not apply to it.
        if !s.search_slot(i) {
            continue;
        }
        if !rule.applies(s.sched, job, now) {
            // Say when it will search, if there is anything it could then take.
            if let Some(ms) = rule.due_in_ms(s.sched, job, now)
                && let Some(from) = first_takeable(s.sched, job, rule, now + ms)
            {
                s.preempts_in(i, rule.cause(job), ms.max(from - now));
            }
            continue;
        }
        let found = match &job.gang {
            Some(g) => search_gang(s.sched, job, g, now, rule),
            None => search(s.sched, job, now, rule),
        };
        match found {
            Some(victims) => s.nominate(i, victims, rule.cause(job)),
            None if job.gang.is_none() => {
                fruitless.insert(q.key.clone());
            }
            None => {}
        }
    }
    // The other rule's forecasts stay; this rule's, only for the gangs this pass looked at.
    forecasts.retain(|k, _| k.1 != rule.code());
    forecasts.extend(kept);
    s.sched.forecasts = forecasts;
}

/// When a search for `job` by `rule` would first find victims, as of a search from `by` on:
/// the soonest time at which, on some node it could use (and no other job holds), the set the
/// search would take there — the candidates `rule` allows, cheapest first until the job fits —
/// may be taken: every one of them has run its minimum runtime and the work they lose
/// *together* is within [`GovernConfig::max_loss_per_wait`](super::GovernConfig::max_loss_per_wait)'s
/// bound ([`set_takeable_from`]), as [`search`] requires. `None` when no such set ever comes:
/// a reason that says the job will take capacity then would promise what the search will not
/// do. A gang holding nodes asks the same of the set it would take on them
/// ([`gang_takeable_from`]).
fn first_takeable(s: &mut Scheduler, job: &Job, rule: &dyn VictimRule, by: i64) -> Option<i64> {
    if let Some(g) = &job.gang {
        return gang_takeable_from(s, job, g, rule, by);
    }
    let units = job.request.units(&s.engine.fleet().catalogue).as_milli();
    let rank = s.rank(&job.priority);
    let fleet = s.engine.fleet().clone();
    let pools = s.pools_for(&job.request);
    let held = s.held_for_others(job.id);
    // The nodes where the job could run once the candidates there are gone, fewest
    // candidates first (the order the search tries them in).
    let mut nodes: Vec<(usize, u32)> = Vec::new();
    {
        let st = s.engine.state();
        for &p in &pools {
            for n in fleet.pool(p).nodes.clone() {
                if held.contains(&n) || !job.request.allows_model(fleet.nodes[n as usize].model) {
                    continue;
                }
                let (mut count, mut releasable) = (0, 0);
                for (c, _) in s
                    .victim_index
                    .candidates(n)
                    .filter(|(_, v)| rule.may_take(job, rank, v))
                {
                    count += 1;
                    releasable += c.units_milli;
                }
                let free: u64 = st.nodes[n as usize].gpus.iter().map(|g| g.free_milli() as u64).sum();
                if count > 0 && free + releasable >= units {
                    nodes.push((count, n));
                }
            }
        }
    }
    nodes.sort_unstable();
    let mut shares: FxHashMap<u32, f64> = FxHashMap::default();
    let mut first: Option<i64> = None;
    for (_, n) in nodes {
        let mut cands: Vec<(VictimCost, u64, i64)> = Vec::new();
        for (c, v) in s.victim_index.candidates(n) {
            if !rule.may_take(job, rank, &v) {
                continue;
            }
            let Some(r) = s.running.get(&c.id) else { continue };
            let share = *shares.entry(c.tenant).or_insert_with(|| s.books.fair_share(&r.tenant));
            cands.push((s.plugins.victim_order.cost(r, share, by), r.id, c.takeable_from_ms));
        }
        cands.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
        let Some(set) = cheapest_set_that_fits(s, job, &held, &cands) else {
            continue;
        };
        let t0 = set.iter().map(|&(_, from)| from).fold(by, i64::max);
        let ids: Vec<u64> = set.iter().map(|&(id, _)| id).collect();
        if let Some(t) = set_takeable_from(s, job, &ids, t0) {
            first = Some(first.map_or(t, |f| f.min(t)));
            if t <= by {
                break;
            }
        }
    }
    first
}

/// The cheapest prefix of `cands` (victim ids with the time each may be taken from, cheapest
/// first) whose capacity lets `job` be placed, tried through a [`Statement`] and rolled back,
/// with the nodes `held` for other jobs out of the trial; `None` if all of them are not enough.
fn cheapest_set_that_fits(
    s: &mut Scheduler,
    job: &Job,
    held: &FxHashSet<u32>,
    cands: &[(VictimCost, u64, i64)],
) -> Option<Vec<(u64, i64)>> {
    let mut trial = Statement::new(&mut s.engine);
    if !held.is_empty() {
        trial.set_blocked(held.clone());
    }
    let cp = trial.checkpoint();
    let mut set = Vec::new();
    let mut fits = false;
    for &(_, id, from) in cands {
        assert!(trial.evict(id), "a running workload has an allocation");
        set.push((id, from));
        if trial.fits(&job.request) {
            fits = true;
            break;
        }
    }
    trial.rollback(cp);
    if !held.is_empty() {
        trial.set_blocked(FxHashSet::default());
    }
    fits.then_some(set)
}

/// The nodes job `job` holds for gang `g`, and `g` bound to the held pool; `None` without a
/// hold.
fn held(
    s: &Scheduler,
    job: &Job,
    g: &tessera_model::request::GangRequest,
) -> Option<(Vec<u32>, tessera_model::request::GangRequest)> {
    let h = s.holds.iter().find(|h| h.job == job.id)?;
    let mut g = g.clone();
    g.pool = Some(h.pool);
    Some((h.nodes.clone(), g))
}

/// The soonest time from `by` at which a search for gang `g` (job `job`, holding nodes) finds
/// victims under the loss bound: the set it would take (the candidates `rule` allows on its
/// held nodes, cheapest first until it fits, then the dearest spared when it fits without them,
/// as [`search_gang`] chooses) once every one of them has run its minimum runtime and the work
/// they lose *together* is at most [`loss_bound`]. Both grow linearly from then on (the loss by
/// the victims' units, the bound by the gang's units × `max_loss_per_wait`), so that time is
/// computed, or `None` when it never comes (the victims' units at least the bound's rate), as
/// when no such set exists or the gang holds no nodes.
fn gang_takeable_from(
    s: &mut Scheduler,
    job: &Job,
    g: &tessera_model::request::GangRequest,
    rule: &dyn VictimRule,
    by: i64,
) -> Option<i64> {
    let (nodes, g) = held(s, job, g)?;
    gang_takeable_on(s, job, &g, &nodes, rule, by)
}

/// For gang `g` (job `job`) that holds no nodes yet, so searches for no victims: when it will
/// take capacity by `rule` once it does — the time it may search (now, or when `rule` is due)
/// and holds nodes ([`allocate::gang_hold_due`]), on the nodes it would hold then
/// ([`allocate::planned_gang_hold`]), as [`gang_takeable_on`] finds there. `None` where it may
/// never search by `rule`, would hold no nodes, or no set of victims there ever may be taken.
/// Without it such a gang's reason said only when running work ends, while it would take
/// borrowed capacity back minutes later.
fn unheld_gang_takeable_from(
    s: &mut Scheduler,
    job: &Job,
    g: &tessera_model::request::GangRequest,
    scope: &[tessera_model::PoolId],
    rule: &dyn VictimRule,
    now: i64,
) -> Option<i64> {
    let due = if rule.applies(s, job, now) {
        now
    } else {
        now + rule.due_in_ms(s, job, now)?
    };
    let by = due.max(allocate::gang_hold_due(s, job)).max(now);
    let (pool, nodes) = allocate::planned_gang_hold(s, job, g, scope, by)?;
    let mut g = g.clone();
    g.pool = Some(pool);
    gang_takeable_on(s, job, &g, &nodes, rule, by)
}

/// For gang job `job`, not queued (a dry run's, submitted at `now` and finding no room): when
/// it would take capacity from running work as its queue reason will say once it waits — by
/// reclaim or by priority, the sooner (reclaim first on a tie, as the cycle runs them), the
/// forecast [`pass`] gives a gang holding no nodes. `None` for a single-node job, or where
/// neither rule would ever take capacity for it.
pub(super) fn new_gang_forecast(s: &mut Scheduler, job: &Job, now: i64) -> Option<(PreemptCause, i64)> {
    let g = job.gang.as_ref()?;
    let scope = s.engine.gang_pools(g);
    let rules: [&dyn VictimRule; 2] = [&super::reclaim::Reclaim, &super::preempt::Preempt];
    let mut best: Option<(PreemptCause, i64)> = None;
    for rule in rules {
        if let Some(at) = unheld_gang_takeable_from(s, job, g, &scope, rule, now)
            && best.as_ref().is_none_or(|(_, b)| at < *b)
        {
            best = Some((rule.cause(job), at));
        }
    }
    best
}

/// [`gang_takeable_from`] on `nodes`, for gang `g` (its pool set).
fn gang_takeable_on(
    s: &mut Scheduler,
    job: &Job,
    g: &tessera_model::request::GangRequest,
    nodes: &[u32],
    rule: &dyn VictimRule,
    by: i64,
) -> Option<i64> {
    let rank = s.rank(&job.priority);
    let mut shares: HashMap<&str, f64> = HashMap::new();
    let mut seen: FxHashSet<u64> = FxHashSet::default();
    let mut cands: Vec<(VictimCost, u64)> = Vec::new();
    let mut from: FxHashMap<u64, i64> = FxHashMap::default();
    for &n in nodes {
        for (c, v) in s.victim_index.candidates(n) {
            if !rule.may_take(job, rank, &v) || !seen.insert(c.id) {
                continue;
            }
            let Some(r) = s.running.get(&c.id) else { continue };
            let share = *shares
                .entry(r.tenant.as_str())
                .or_insert_with(|| s.books.fair_share(&r.tenant));
            cands.push((s.plugins.victim_order.cost(r, share, by), r.id));
            from.insert(c.id, c.takeable_from_ms);
        }
    }
    cands.sort_unstable();
    let ids: Vec<u64> = cands.into_iter().map(|(_, id)| id).collect();
    let set = fewest_for_gang(s, job, g, &ids)?;
    let t0 = set.iter().filter_map(|id| from.get(id)).fold(by, |t, &f| t.max(f));
    set_takeable_from(s, job, &set, t0)
}

/// The soonest time from `t0` (when every workload of `set` has run its minimum runtime) at
/// which stopping them all loses no more work *together* than [`loss_bound`] allows `job`.
/// From `t0` on both grow linearly — the loss by the victims' units, the bound by the job's
/// units × `max_loss_per_wait` — so that time is computed; `None` when it never comes (the
/// victims' units at least the bound's rate).
fn set_takeable_from(s: &Scheduler, job: &Job, set: &[u64], t0: i64) -> Option<i64> {
    let Some(factor) = s.cfg.max_loss_per_wait else {
        return Some(t0);
    };
    if loss_of(s, set, t0) <= loss_bound(s, job, t0) {
        return Some(t0);
    }
    // From `t0` on: lost(t) = Σ vᵢ·(t − sinceᵢ), bound(t) = b·(t − submitted).
    let units = match &job.gang {
        Some(g) => g.units(),
        None => job.request.units(&s.engine.fleet().catalogue),
    };
    let b = units.as_milli() as f64 * factor.max(0.0);
    let (mut v, mut v_since) = (0.0, 0.0);
    for r in set.iter().filter_map(|id| s.running.get(id)) {
        let units = r.units.as_milli() as f64;
        let since = r
            .checkpoint_ms
            .map_or(r.running_since_ms, |c| c.max(r.running_since_ms));
        v += units;
        v_since += units * since as f64;
    }
    if b <= v {
        return None;
    }
    let t = ((b * job.submitted_ms as f64 - v_since) / (b - v)).ceil();
    (t.is_finite() && t < i64::MAX as f64).then(|| (t as i64).max(t0))
}

/// The most work (GPU milli-units × milliseconds, as [`Running::work_lost`]) the victims of a
/// search for `job` at `now` may lose together: [`GovernConfig::max_loss_per_wait`] times the
/// job's units × its wait: the time it has waited or, if longer, the time it will still wait
/// for the nodes it holds (by the start of its [`Hold`](super::Hold)); `u64::MAX` without a
/// bound.
///
/// [`GovernConfig::max_loss_per_wait`]: super::GovernConfig::max_loss_per_wait
pub(super) fn loss_bound(s: &Scheduler, job: &Job, now: i64) -> u64 {
    let Some(factor) = s.cfg.max_loss_per_wait else {
        return u64::MAX;
    };
    let units = match &job.gang {
        Some(g) => g.units(),
        None => job.request.units(&s.engine.fleet().catalogue),
    };
    let ahead = s
        .holds
        .iter()
        .find(|h| h.job == job.id)
        .and_then(|h| h.starts_at_ms)
        .map_or(0, |t| t - now);
    let waited = (now - job.submitted_ms).max(ahead).max(0) as f64;
    (units.as_milli() as f64 * waited * factor.max(0.0)).min(u64::MAX as f64) as u64
}

/// The work lost by stopping the running workloads `ids` at `now`, summed.
fn loss_of(s: &Scheduler, ids: &[u64], now: i64) -> u64 {
    ids.iter()
        .filter_map(|id| s.running.get(id))
        .fold(0u64, |sum, r| sum.saturating_add(r.work_lost(now)))
}

/// The fewest, cheapest victims `rule` allows whose capacity lets `job` be placed, or `None`.
/// Nodes held for other jobs (backfill reservations, other preemptors' victims) are out of the
/// search, for victims and for the trial placements alike.
fn search(s: &mut Scheduler, job: &Job, now: i64, rule: &dyn VictimRule) -> Option<Vec<u64>> {
    let held = s.held_for_others(job.id);
    let any_held = !held.is_empty();
    if any_held {
        s.engine.set_blocked(held.clone());
    }
    let found = search_unheld(s, job, now, rule, &held);
    if any_held {
        s.engine.set_blocked(FxHashSet::default());
    }
    found
}

/// The victims `rule` allows for gang `g` (job `job`), taken only on the nodes it holds (the
/// racks it will use), cheapest first, until it fits; then each victim, the dearest first, is
/// spared if the gang fits without it. `None` without a hold, or if it does not fit even so.
/// Nodes held for other jobs are out of the trial placements.
fn search_gang(
    s: &mut Scheduler,
    job: &Job,
    g: &tessera_model::request::GangRequest,
    now: i64,
    rule: &dyn VictimRule,
) -> Option<Vec<u64>> {
    let (nodes, g) = held(s, job, g)?;
    let rank = s.rank(&job.priority);
    let bound = loss_bound(s, job, now);
    let mut shares: HashMap<&str, f64> = HashMap::new();
    let mut seen: FxHashSet<u64> = FxHashSet::default();
    let mut cands: Vec<(VictimCost, u64)> = Vec::new();
    for &n in &nodes {
        for (c, v) in s.victim_index.takeable(n, now) {
            if !rule.may_take(job, rank, &v) || !seen.insert(c.id) {
                continue;
            }
            let Some(r) = s.running.get(&c.id) else { continue };
            if r.work_lost(now) > bound {
                continue;
            }
            let share = *shares
                .entry(r.tenant.as_str())
                .or_insert_with(|| s.books.fair_share(&r.tenant));
            cands.push((s.plugins.victim_order.cost(r, share, now), r.id));
        }
    }
    cands.sort_unstable();
    let ids: Vec<u64> = cands.into_iter().map(|(_, id)| id).collect();
    let chosen = fewest_for_gang(s, job, &g, &ids)?;
    (loss_of(s, &chosen, now) <= bound).then_some(chosen)
}

/// Of the candidates `ids` (cheapest first), the first ones whose capacity lets gang `g` (its
/// pool set) be placed, then each, the dearest first, spared if it fits without it; `None` if
/// it does not fit even with all of them. Nodes held for other jobs are out of the trial
/// placements.
fn fewest_for_gang(
    s: &mut Scheduler,
    job: &Job,
    g: &tessera_model::request::GangRequest,
    ids: &[u64],
) -> Option<Vec<u64>> {
    if ids.is_empty() {
        return None;
    }
    let held = s.held_for_others(job.id);
    let any_held = !held.is_empty();
    let mut trial = Statement::new(&mut s.engine);
    if any_held {
        trial.set_blocked(held);
    }
    let fits_with = |trial: &mut Statement<'_>, set: &[u64]| {
        let cp = trial.checkpoint();
        for id in set {
            trial.evict(*id);
        }
        let fits = trial.plan_gang(g).is_ok();
        trial.rollback(cp);
        fits
    };
    let mut chosen: Vec<u64> = Vec::new();
    let mut fits = false;
    for id in ids {
        chosen.push(*id);
        if fits_with(&mut trial, &chosen) {
            fits = true;
            break;
        }
    }
    if fits {
        // Spare what is not needed, the dearest first.
        for i in (0..chosen.len()).rev() {
            let without: Vec<u64> = chosen
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, v)| *v)
                .collect();
            if fits_with(&mut trial, &without) {
                chosen = without;
            }
        }
    }
    if any_held {
        trial.set_blocked(FxHashSet::default());
    }
    drop(trial);
    fits.then_some(chosen)
}

fn search_unheld(
    s: &mut Scheduler,
    job: &Job,
    now: i64,
    rule: &dyn VictimRule,
    held: &FxHashSet<u32>,
) -> Option<Vec<u64>> {
    let units = job.request.units(&s.engine.fleet().catalogue);
    let rank = s.rank(&job.priority);
    let fleet = s.engine.fleet().clone();
    let pools = s.pools_for(&job.request);
    let bound = loss_bound(s, job, now);
    let running = &s.running;
    let mut trial = Statement::new(&mut s.engine);
    // Nodes where the request could run at all, with candidates this rule allows (none that
    // alone would lose more work than the bound), whose free units plus their candidates'
    // units could hold the request, fewest candidates first.
    let index = &s.victim_index;
    let may_take = |n: u32| {
        index.takeable(n, now).filter(|(c, v)| {
            rule.may_take(job, rank, v)
                && (bound == u64::MAX || running.get(&c.id).is_some_and(|r| r.work_lost(now) <= bound))
        })
    };
    let st = trial.engine().state();
    let mut nodes: Vec<(usize, u32)> = Vec::new();
    for &p in &pools {
        for n in fleet.pool(p).nodes.clone() {
            if held.contains(&n) || !job.request.allows_model(fleet.nodes[n as usize].model) {
                continue;
            }
            let (mut count, mut releasable) = (0, 0);
            for (c, _) in may_take(n) {
                count += 1;
                releasable += c.units_milli;
            }
            if count == 0 {
                continue;
            }
            let free: u64 = st.nodes[n as usize].gpus.iter().map(|g| g.free_milli() as u64).sum();
            if free + releasable >= units.as_milli() {
                nodes.push((count, n));
            }
        }
    }
    nodes.sort_unstable();
    let mut shares: HashMap<&str, f64> = HashMap::new();
    let mut best: Option<(Vec<VictimCost>, Vec<u64>)> = None;
    for (_, n) in nodes {
        if best.as_ref().is_some_and(|b| b.1.len() == 1) {
            break;
        }
        let mut cands: Vec<(VictimCost, u64)> = may_take(n)
            .map(|(c, _)| {
                let r = &s.running[&c.id];
                let share = *shares
                    .entry(r.tenant.as_str())
                    .or_insert_with(|| s.books.fair_share(&r.tenant));
                (s.plugins.victim_order.cost(r, share, now), r.id)
            })
            .collect();
        cands.sort_unstable();
        let cp = trial.checkpoint();
        let mut costs = Vec::new();
        let mut fits = false;
        for (cost, id) in &cands {
            if best.as_ref().is_some_and(|b| costs.len() + 1 > b.1.len()) {
                break;
            }
            assert!(trial.evict(*id), "a running workload has an allocation");
            costs.push(*cost);
            if trial.fits(&job.request) {
                fits = true;
                break;
            }
        }
        let set: Vec<u64> = trial.evicted_since(cp).collect();
        trial.rollback(cp);
        let lost = || {
            set.iter()
                .filter_map(|id| running.get(id))
                .fold(0u64, |sum, r| sum.saturating_add(r.work_lost(now)))
        };
        if fits && (bound == u64::MAX || lost() <= bound) {
            let better = match &best {
                None => true,
                Some((c0, s0)) => set.len() < s0.len() || (set.len() == s0.len() && costs < *c0),
            };
            if better {
                best = Some((costs, set));
            }
        }
    }
    best.map(|(_, victims)| victims)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{config, engine, guarantee_half_each, job, placed, preempted, sched};
    use super::super::{Decision, GovernConfig, Quota, Scheduler};
    use tessera_model::GpuUnits;

    /// Nodes 0–14 each run one 8-GPU standard job (ids 0–14), node 15 eight 1-GPU opportunistic
    /// ones (ids 200–207), all from time 0.
    fn standard_nodes_and_one_opportunistic_node(s: &mut Scheduler) {
        for i in 0..15 {
            assert_eq!(placed(&s.submit(job(i, "a", 8, "standard", 0), 0)), vec![i]);
        }
        for i in 200..208 {
            assert_eq!(placed(&s.submit(job(i, "a", 1, "opportunistic", 0), 0)), vec![i]);
        }
    }

    #[test]
    fn capacity_freed_by_a_preemptors_first_victims_is_held_for_it_until_the_last_stops() {
        let mut s = sched();
        for i in 0..15 {
            s.submit(job(i, "a", 8, "critical", 0), 0);
        }
        for i in 200..208 {
            s.submit(job(i, "a", 1, "opportunistic", 0), 0);
        }
        let d = s.submit(job(100, "b", 8, "high", 5000), 5000);
        assert_eq!(preempted(&d).len(), 8, "{d:?}");
        s.submit(job(300, "c", 1, "standard", 5050), 5050);
        // Half the victims have stopped: the standard job may not take their GPUs.
        for v in 200..204 {
            s.release(v, 5100);
        }
        assert!(placed(&s.cycle(5100)).is_empty(), "the node is held for the preemptor");
        for v in 204..208 {
            s.release(v, 5200);
        }
        assert_eq!(placed(&s.cycle(5200)), vec![100]);
        assert!(s.nominated.is_empty());
    }

    #[test]
    fn a_preemptor_that_still_does_not_fit_once_its_victims_stopped_gives_up_its_nomination() {
        let mut s = sched();
        for i in 0..15 {
            s.submit(job(i, "a", 8, "critical", 0), 0);
        }
        s.submit(job(200, "a", 8, "opportunistic", 0), 0);
        let d = s.submit(job(100, "b", 8, "high", 5000), 5000);
        assert_eq!(preempted(&d), vec![200]);
        // The node goes out of service while the victim stops.
        s.engine.fence_node(15, true);
        s.release(200, 5100);
        assert!(placed(&s.cycle(5100)).is_empty());
        assert!(
            s.nominated.is_empty(),
            "no stale nomination: the node is no longer held, and it may search again"
        );
        s.engine.fence_node(15, false);
        assert_eq!(placed(&s.cycle(5200)), vec![100]);
    }

    #[test]
    fn a_victims_requeue_never_preempts_in_turn() {
        let mut s = sched();
        standard_nodes_and_one_opportunistic_node(&mut s);
        // A high 8-GPU job takes one standard job's node (one victim beats eight).
        let d = s.submit(job(100, "b", 8, "high", 5000), 5000);
        let [v] = preempted(&d)[..] else { panic!("{d:?}") };
        assert!(v < 15, "a standard job: {d:?}");
        s.release(v, 5100);
        assert_eq!(placed(&s.cycle(5100)), vec![100]);
        // The victim is requeued. It could take node 15 from the opportunistic work, but a
        // requeued victim never preempts: that would be a cascade.
        s.enqueue(job(v, "a", 8, "standard", 0));
        let d = s.cycle(20_000);
        assert!(preempted(&d).is_empty(), "no cascade: {d:?}");
        // A fresh standard request of the same shape may (the rule is about the requeue).
        let d = s.submit(job(300, "c", 8, "standard", 20_000), 20_000);
        let by: Vec<u64> = d
            .iter()
            .filter_map(|d| match d {
                Decision::Preempt { by, .. } => Some(*by),
                _ => None,
            })
            .collect();
        assert_eq!(by, vec![300; 8], "{d:?}");
    }

    #[test]
    fn the_minimum_runtime_of_a_class_and_of_a_request_is_honoured() {
        let mut cfg = config();
        for c in &mut cfg.classes {
            if c.name == "opportunistic" {
                c.min_runtime_ms = Some(10_000);
            }
        }
        let mut s = Scheduler::new(engine(), cfg);
        // 8 opportunistic 8-GPU jobs (class minimum 10 s), 8 standard ones asking for 30 s.
        for i in 0..16 {
            let mut j = job(i, "a", 8, if i < 8 { "opportunistic" } else { "standard" }, 0);
            if i >= 8 {
                j.min_runtime_ms = Some(30_000);
            }
            assert_eq!(placed(&s.submit(j, 0)), vec![i]);
        }
        // The scheduler's own minimum (1 s) has passed, the class's has not.
        assert!(preempted(&s.submit(job(100, "b", 8, "high", 5000), 5000)).is_empty());
        let d = s.cycle(10_000);
        let v = preempted(&d);
        assert!(v.len() == 1 && v[0] < 8, "an opportunistic job after 10 s: {d:?}");
        // Standard work is next only after the 30 s it asked for, opportunistic work being busy.
        let d = s.submit(job(101, "b", 8, "high", 10_000), 10_000);
        let v: Vec<u64> = preempted(&d);
        assert!(v.iter().all(|v| *v < 8), "{d:?}");
        let mut taken: Vec<u64> = Vec::new();
        for (k, id) in (102..112).enumerate() {
            let now = 11_000 + k as i64 * 1000;
            taken.extend(preempted(&s.submit(job(id, "b", 8, "high", now), now)));
        }
        assert!(taken.iter().all(|v| *v < 8), "no standard job before 30 s: {taken:?}");
        let d = s.submit(job(120, "b", 8, "high", 30_000), 30_000);
        let v = preempted(&d);
        assert!(
            !v.is_empty() && v.iter().all(|v| *v >= 8),
            "standard work after its 30 s: {d:?}"
        );
    }

    #[test]
    fn lost_work_in_gpu_time_chooses_the_victim_and_a_checkpoint_lowers_it() {
        // Node 15 holds a 1-GPU job since 0, a 4-GPU job since 5 s and 3 critical GPUs; every
        // other node runs critical work. A high 1-GPU request needs one of the two.
        let setup = || {
            let mut s = sched();
            for i in 0..15 {
                s.submit(job(i, "a", 8, "critical", 0), 0);
            }
            assert_eq!(placed(&s.submit(job(50, "a", 3, "critical", 0), 0)), vec![50]);
            assert_eq!(placed(&s.submit(job(51, "a", 1, "standard", 0), 0)), vec![51]);
            assert_eq!(placed(&s.submit(job(52, "a", 4, "standard", 5000), 5000)), vec![52]);
            s
        };
        // At 10 s: 1 GPU × 10 s lost against 4 GPUs × 5 s: the older, smaller job goes.
        let mut s = setup();
        assert_eq!(preempted(&s.submit(job(100, "b", 1, "high", 10_000), 10_000)), vec![51]);
        // The younger one saved its work at 9 s: 4 GPUs × 1 s lost, now the cheaper victim.
        let mut s = setup();
        s.checkpointed(52, 9000);
        assert_eq!(preempted(&s.submit(job(100, "b", 1, "high", 10_000), 10_000)), vec![52]);
        // Equal sizes: the younger is chosen.
        let mut s = sched();
        for i in 0..15 {
            s.submit(job(i, "a", 8, "critical", 0), 0);
        }
        for (k, i) in (60..64).enumerate() {
            let t = k as i64 * 1000;
            assert_eq!(placed(&s.submit(job(i, "a", 2, "standard", t), t)), vec![i]);
        }
        assert_eq!(preempted(&s.submit(job(100, "b", 2, "high", 10_000), 10_000)), vec![63]);
    }

    #[test]
    fn preemption_only_for_a_higher_class_or_a_tenant_within_its_guarantee() {
        let mut s = Scheduler::new(
            engine(),
            GovernConfig {
                reclaim_after_ms: 0,
                ..config()
            },
        );
        guarantee_half_each(&mut s, None);
        // b is guaranteed only 4 GPUs; a borrows the whole pool with standard work.
        s.set_quota(
            "b",
            "training",
            Some(Quota {
                guaranteed: GpuUnits::whole(4),
                limit: None,
            }),
        );
        for i in 0..16 {
            assert_eq!(placed(&s.submit(job(i, "a", 8, "standard", 0), 0)), vec![i]);
        }
        // Same class, beyond b's guarantee: no reclaim, no priority preemption, however long.
        s.submit(job(100, "b", 8, "standard", 10), 10);
        assert!(preempted(&s.cycle(1_000_000)).is_empty());
        // Within its guarantee (4 of 4): reclaims from a borrower.
        let d = s.submit(job(101, "b", 4, "standard", 1_000_000), 1_000_000);
        let v = preempted(&d);
        assert_eq!(v.len(), 1, "{d:?}");
        assert_eq!(s.is_borrowing(v[0]), Some(true));
        assert!(
            d.iter()
                .any(|d| matches!(d, Decision::Preempt { by: 101, cause, .. } if cause.code() == "reclaim")),
            "{d:?}"
        );
    }
}
