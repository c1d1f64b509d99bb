//! The victim search reclaim and preempt share: the fewest, cheapest running workloads whose
//! capacity would let a starved job be placed. Each rule says which jobs may search and which
//! workloads they may take; the [victim-order plugin](super::plugins) says which are cheapest.
//!
//! Candidates are grouped by node; the nodes that need the fewest victims are tried first, and
//! on each node the cheapest candidates are tentatively evicted one by one through a
//! [`Statement`] until the job fits, then rolled back: chosen victims keep their capacity until
//! they have actually stopped. A one-victim answer ends the search.
//!
//! The search budget is shared: the first `max_preemption_searches` starved jobs in queue order
//! get a slot, for reclaim and preempt alike, so a more important job is never crowded out by
//! searches further down the queue. Within a pass, a request shape whose search found nothing is
//! not searched again.

use std::collections::{HashMap, HashSet};

use tessera_model::Request;

use super::plugins::VictimCost;
use super::session::{Session, Status};
use super::statement::Statement;
use super::{Job, Running, Scheduler};
use crate::reason::PreemptCause;

/// Who may take capacity from whom, and why.
pub(super) trait VictimRule {
    /// Whether `job` may look for victims this way now.
    fn applies(&self, s: &Scheduler, job: &Job, now: i64) -> bool;
    /// Whether `victim` may be stopped for `job`, whose priority class has rank `rank`.
    fn may_take(&self, job: &Job, rank: u8, victim: &Running) -> bool;
    fn cause(&self, job: &Job) -> PreemptCause;
}

/// One pass of victim searches over the starved jobs, in queue order.
pub(super) fn pass(s: &mut Session<'_>, rule: &dyn VictimRule) {
    let now = s.now;
    let mut fruitless: HashSet<Request> = HashSet::new();
    let jobs = s.jobs.clone();
    for (i, q) in jobs.iter().enumerate() {
        let job = &q.job;
        if !matches!(s.status(i), Status::Starved { searchable: true, .. })
            || s.sched.nominated.contains_key(&job.id)
            || fruitless.contains(&q.key)
        {
            continue;
        }
        // The budget goes to the head of the queue whichever pass runs first: a job takes its
        // slot even where this pass's rule does not apply to it.
        if !s.search_slot(i) {
            continue;
        }
        if !rule.applies(s.sched, job, now) {
            continue;
        }
        match search(s.sched, job, now, rule) {
            Some(victims) => s.nominate(i, victims, rule.cause(job)),
            None => {
                fruitless.insert(q.key.clone());
            }
        }
    }
}

/// The fewest, cheapest victims `rule` allows whose capacity lets `job` be placed, or `None`.
fn search(s: &mut Scheduler, job: &Job, now: i64, rule: &dyn VictimRule) -> Option<Vec<u64>> {
    let units = job.request.units(&s.engine.fleet().catalogue);
    let rank = s.rank(&job.priority);
    let min_rt = s.cfg.min_runtime_ms;
    let fleet = s.engine.fleet().clone();
    let pools = s.pools_for(&job.request);
    let mut trial = Statement::new(&mut s.engine);
    // Candidates grouped by node; only nodes where the request could run at all.
    let mut by_node: HashMap<u32, Vec<(VictimCost, u64)>> = HashMap::new();
    for r in s.running.values() {
        if r.stopping || !r.preemptible || now - r.running_since_ms < min_rt || !rule.may_take(job, rank, r) {
            continue;
        }
        let Some(a) = trial.engine().allocation(r.id) else {
            continue;
        };
        let node = fleet.node(a.node);
        if !pools.contains(&node.pool) || !job.request.allows_model(node.model) {
            continue;
        }
        let cost = s.plugins.victim_order.cost(r, s.books.fair_share(&r.tenant), now);
        by_node.entry(a.node.0).or_default().push((cost, r.id));
    }
    // Nodes whose free units plus their candidates' units could hold the request, fewest
    // candidates first.
    let st = trial.engine().state();
    let mut nodes: Vec<(usize, u32)> = by_node
        .iter()
        .filter(|(n, c)| {
            let free: u64 = st.nodes[**n as usize].gpus.iter().map(|g| g.free_milli() as u64).sum();
            let releasable: u64 = c
                .iter()
                .filter_map(|(_, id)| s.running.get(id))
                .map(|r| r.units.as_milli())
                .sum();
            free + releasable >= units.as_milli()
        })
        .map(|(n, c)| (c.len(), *n))
        .collect();
    nodes.sort_unstable();
    let mut best: Option<(Vec<VictimCost>, Vec<u64>)> = None;
    for (_, n) in nodes {
        if best.as_ref().is_some_and(|b| b.1.len() == 1) {
            break;
        }
        let mut cands = by_node.remove(&n).expect("key");
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
        if fits {
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
