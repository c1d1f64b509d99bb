//! The consolidate action (after KAI-Scheduler's `consolidation`), between allocate and reclaim:
//! a job that waits for fragmentation — enough free units in its pool, not in one place — gets
//! the smallest set of moves of *movable* work that lets it be placed, without preempting
//! anything:
//!
//! * the moves free one node for the job (the node needing the fewest moves, then the fewest
//!   units moved, then the least work lost);
//! * every moved workload must fit elsewhere in its pool, on its GPU model (so its units and
//!   quota keys stay the same), at the same time (tried through a [`Statement`] with the job
//!   placed on the freed node), or nothing moves;
//! * restartable batch work ([`Movable::Restart`]) is stopped and requeued; a service
//!   ([`Movable::Replace`]) gets its replacement booked on the target at once and is stopped
//!   only once the replacement runs ([`Scheduler::replaced`](super::Scheduler::replaced));
//! * only work marked movable moves, never work that is stopping or has run less than the
//!   scheduler's `min_runtime_ms` (the longer minimum runtimes of classes and requests bound
//!   preemption; a move is bounded by the budget), never on nodes held for other jobs, and each
//!   tenant's work is moved at most `moves_per_tenant_per_hour` times in any hour (the
//!   disruption budget).
//!
//! The waiting job is then nominated like a preemptor: the freed node is held for it until the
//! moved work has left.
//!
//! MIG pools need no move for an idle GPU: with a whole-GPU layout backend the engine re-lays
//! out a GPU whose instances are all free when a waiting profile needs another layout.

use std::collections::{HashMap, HashSet};

use rustc_hash::FxHashSet;

use tessera_model::Request;

use super::session::{Session, Status};
use super::statement::Statement;
use super::{Action, Job, Movable, Scheduler};
use crate::reason::{Unplaceable, Wait};
use crate::state::Allocation;

/// Consolidation settings.
#[derive(Clone, Debug)]
pub struct ConsolidationConfig {
    pub enabled: bool,
    /// The disruption budget: at most this many moves of one tenant's work in any hour.
    pub moves_per_tenant_per_hour: u32,
    /// At most this many waiting jobs get a consolidation plan searched per cycle.
    pub max_plans_per_cycle: usize,
}

impl Default for ConsolidationConfig {
    fn default() -> Self {
        ConsolidationConfig {
            enabled: true,
            moves_per_tenant_per_hour: 2,
            max_plans_per_cycle: 4,
        }
    }
}

/// Allocation key of a service's replacement while both run: the workload's id with the top
/// bit set (workload ids never use it).
pub(super) const REPLACEMENT: u64 = 1 << 63;

/// One planned move.
#[derive(Clone, Debug)]
pub(super) struct Move {
    pub id: u64,
    pub how: Movable,
    /// Where it will run (a replacement's booking; where a restarted job fits now).
    pub to: Allocation,
}

pub(super) struct Consolidate;

impl Action for Consolidate {
    fn name(&self) -> &'static str {
        "consolidate"
    }

    fn execute(&self, s: &mut Session<'_>) {
        if !s.sched.cfg.consolidation.enabled {
            return;
        }
        let now = s.now;
        let mut plans = 0;
        let mut fruitless: HashSet<Request> = HashSet::new();
        let jobs = s.jobs.clone();
        for (i, q) in jobs.iter().enumerate() {
            let Status::Starved {
                reason,
                searchable: true,
            } = s.status(i)
            else {
                continue;
            };
            if !matches!(**reason, Wait::Unplaceable(Unplaceable::Fragmentation { .. }))
                || s.sched.nominated.contains_key(&q.job.id)
                || fruitless.contains(&q.key)
            {
                continue;
            }
            if plans >= s.sched.cfg.consolidation.max_plans_per_cycle {
                break;
            }
            plans += 1;
            match plan(s.sched, &q.job, now) {
                Some(moves) => s.consolidate(i, moves),
                None => {
                    fruitless.insert(q.key.clone());
                }
            }
        }
    }
}

/// Moves of one tenant's work within the hour before `now`.
pub(super) fn moves_in_last_hour(s: &Scheduler, tenant: &str, now: i64) -> u32 {
    s.disruptions
        .get(tenant)
        .map_or(0, |t| t.iter().filter(|&&at| now - at < 3_600_000).count() as u32)
}

/// `req` restricted to the pool and GPU model of node `n`, where it runs now: a moved workload
/// keeps its units and its quota keys.
fn same_model(req: &Request, fleet: &tessera_model::Fleet, n: u32) -> Request {
    let node = &fleet.nodes[n as usize];
    let mut req = req.clone();
    req.pool = Some(node.pool);
    req.models = vec![node.model];
    req
}

/// The smallest set of moves that lets `job` be placed, or `None`.
fn plan(s: &mut Scheduler, job: &Job, now: i64) -> Option<Vec<Move>> {
    if s.movable_running == 0 {
        return None;
    }
    let held = s.held_for_others(job.id);
    let fleet = s.engine.fleet().clone();
    let pools = s.pools_for(&job.request);
    let units = job.request.units(&fleet.catalogue).as_milli();
    let budget = s.cfg.consolidation.moves_per_tenant_per_hour;
    // Moves left in each tenant's disruption budget, for the tenants of movable work only
    // (looked up as they come: most running work is not movable).
    let mut left: HashMap<&str, u32> = HashMap::new();
    // Movable candidates by node, cheapest first: least work lost, then fewest units.
    let mut by_node: HashMap<u32, Vec<(u64, u64, u64)>> = HashMap::new();
    for r in s.running.values() {
        if r.movable.is_none() || r.stopping || now - r.running_since_ms < s.cfg.min_runtime_ms {
            continue;
        }
        let tenant_left = *left
            .entry(r.tenant.as_str())
            .or_insert_with(|| budget.saturating_sub(moves_in_last_hour(s, &r.tenant, now)));
        if tenant_left == 0 {
            continue;
        }
        let Some(a) = s.engine.allocation(r.id) else { continue };
        let node = fleet.node(a.node);
        if held.contains(&a.node.0) || !pools.contains(&node.pool) || !job.request.allows_model(node.model) {
            continue;
        }
        by_node
            .entry(a.node.0)
            .or_default()
            .push((r.work_lost(now), r.units.as_milli(), r.id));
    }
    let st = s.engine.state();
    let mut nodes: Vec<(usize, u32)> = by_node
        .iter()
        .filter(|(n, c)| {
            let free: u64 = st.nodes[**n as usize].gpus.iter().map(|g| g.free_milli() as u64).sum();
            free + c.iter().map(|c| c.1).sum::<u64>() >= units
        })
        .map(|(n, c)| (c.len(), *n))
        .collect();
    nodes.sort_unstable();
    let mut best: Option<((usize, u64, u64), Vec<Move>)> = None;
    let mut node_of: HashMap<u64, u32> = HashMap::new();
    let mut trial = Statement::new(&mut s.engine);
    for (_, n) in nodes {
        let mut cands = by_node.remove(&n).expect("key");
        cands.sort_unstable();
        trial.set_blocked(held.clone());
        let cp = trial.checkpoint();
        let mut taken: Vec<(u64, u64, u64)> = Vec::new();
        let mut fits = false;
        let mut per_tenant: HashMap<&str, u32> = HashMap::new();
        for c in &cands {
            node_of.insert(c.2, n);
            if best.as_ref().is_some_and(|b| taken.len() + 1 > b.0.0) {
                break;
            }
            let r = &s.running[&c.2];
            let t = per_tenant.entry(r.tenant.as_str()).or_default();
            if *t >= left[r.tenant.as_str()] {
                continue;
            }
            *t += 1;
            assert!(trial.evict(c.2), "a running workload has an allocation");
            taken.push(*c);
            if trial.fits(&job.request) {
                fits = true;
                break;
            }
        }
        let mut moves = Vec::new();
        if fits && trial.place(job.id, &job.request).is_some_and(|a| a.node.0 == n) {
            // Everything moved must fit elsewhere at once: services first (their replacement
            // is booked now, in this order), then restartable work.
            let mut blocked = held.clone();
            blocked.insert(n);
            trial.set_blocked(blocked);
            let mut order: Vec<(Movable, u64)> = taken
                .iter()
                .map(|c| (s.running[&c.2].movable.expect("movable"), c.2))
                .collect();
            order.sort_by_key(|(how, id)| (*how == Movable::Restart, *id));
            for (how, id) in order {
                let req = same_model(&s.running[&id].request, &fleet, node_of[&id]);
                match trial.place(id, &req) {
                    Some(to) => moves.push(Move { id, how, to }),
                    None => {
                        moves.clear();
                        break;
                    }
                }
            }
        }
        trial.rollback(cp);
        if !moves.is_empty() {
            let cost = (
                moves.len(),
                taken.iter().map(|c| c.1).sum::<u64>(),
                taken.iter().map(|c| c.0).sum::<u64>(),
            );
            if best.as_ref().is_none_or(|b| cost < b.0) {
                best = Some((cost, moves));
            }
        }
    }
    trial.set_blocked(FxHashSet::default());
    drop(trial);
    let (_, moves) = best?;
    // Book the services' replacements where the trial put them (the same engine state on every
    // node but the freed one, which is blocked, so the same choices).
    let mut blocked = held;
    blocked.insert(
        s.engine
            .allocation(moves[0].id)
            .expect("a running workload has an allocation")
            .node
            .0,
    );
    s.engine.set_blocked(blocked);
    let mut booked = Vec::new();
    let mut ok = true;
    for m in moves.iter().filter(|m| m.how == Movable::Replace) {
        let req = same_model(&s.running[&m.id].request, &fleet, node_of[&m.id]);
        match s.engine.place(REPLACEMENT | m.id, &req) {
            Ok(a) => booked.push(a.clone()),
            Err(_) => {
                ok = false;
                break;
            }
        }
    }
    s.engine.set_blocked(FxHashSet::default());
    if !ok {
        for a in booked {
            s.engine.release(a.id);
        }
        return None;
    }
    let mut booked = booked.into_iter();
    Some(
        moves
            .into_iter()
            .map(|m| match m.how {
                Movable::Replace => Move {
                    to: {
                        let mut a = booked.next().expect("booked in order");
                        a.id = m.id;
                        a
                    },
                    ..m
                },
                Movable::Restart => m,
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::super::testing::{job, placed, sched};
    use super::super::{Decision, Job, Movable, Scheduler};
    use super::REPLACEMENT;

    /// Places `j` on node `n` (every other node fenced meanwhile).
    fn place_on(s: &mut Scheduler, n: u32, j: Job, now: i64) {
        for m in 0..16 {
            s.engine.fence_node(m, m != n);
        }
        let id = j.id;
        assert_eq!(placed(&s.submit(j, now)), vec![id]);
        for m in 0..16 {
            s.engine.fence_node(m, false);
        }
    }

    fn movable(mut j: Job, how: Option<Movable>) -> Job {
        j.movable = how;
        j
    }

    /// The last nodes each run one 2-GPU job of tenant a (ids 100, 101, …), moved as `small`
    /// says; the other nodes are full of unmovable work: 6 GPUs free per small job, never 8 on
    /// one node.
    fn fragmented_with(small: &[Option<Movable>]) -> Scheduler {
        let mut s = sched();
        let first = 16 - small.len() as u32;
        for n in 0..first {
            place_on(&mut s, n, job(n as u64, "z", 8, "standard", 0), 0);
        }
        for (k, how) in small.iter().enumerate() {
            place_on(
                &mut s,
                first + k as u32,
                movable(job(100 + k as u64, "a", 2, "standard", 0), *how),
                0,
            );
        }
        s
    }

    /// Node 14 runs job 100 (moved as `on14`), node 15 job 101 (as `on15`).
    fn fragmented(on14: Option<Movable>, on15: Option<Movable>) -> Scheduler {
        fragmented_with(&[on14, on15])
    }

    fn moves(d: &[Decision]) -> Vec<(u64, u64, bool)> {
        d.iter()
            .filter_map(|d| match d {
                Decision::Move { id, by, to } => Some((*id, *by, to.is_some())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn work_that_is_not_movable_is_never_moved() {
        let mut s = fragmented(None, None);
        let d = s.submit(job(200, "b", 8, "standard", 5000), 5000);
        assert!(placed(&d).is_empty());
        for t in [6000, 60_000, 3_600_000] {
            let d = s.cycle(t);
            assert!(moves(&d).is_empty(), "{d:?}");
            assert!(d.iter().all(|d| !matches!(d, Decision::Preempt { .. })), "{d:?}");
        }
    }

    #[test]
    fn restartable_batch_work_is_requeued_to_free_a_node_for_a_fragmented_request() {
        let mut s = fragmented(Some(Movable::Restart), None);
        // Younger than its minimum runtime (1 s): not yet.
        let mut early = fragmented(Some(Movable::Restart), None);
        assert!(moves(&early.submit(job(200, "b", 8, "standard", 500), 500)).is_empty());
        let d = s.submit(job(200, "b", 8, "standard", 5000), 5000);
        assert_eq!(moves(&d), vec![(100, 200, false)], "{d:?}");
        // It stops and is requeued as it was; the freed node goes to the request first.
        s.release(100, 5100);
        s.enqueue(movable(job(100, "a", 2, "standard", 0), Some(Movable::Restart)));
        let d = s.cycle(5100);
        assert_eq!(placed(&d), vec![200, 100], "{d:?}");
        assert_eq!(s.engine.allocation(200).unwrap().node.0, 14);
        assert_ne!(s.engine.allocation(100).unwrap().node.0, 14);
    }

    #[test]
    fn a_service_is_moved_by_starting_its_replacement_first() {
        let mut s = fragmented(Some(Movable::Replace), None);
        let d = s.submit(job(200, "b", 8, "standard", 5000), 5000);
        let Some(Decision::Move {
            id: 100, to: Some(to), ..
        }) = d.iter().find(|d| matches!(d, Decision::Move { .. }))
        else {
            panic!("{d:?}")
        };
        assert_ne!(to.node.0, 14);
        // Both hold capacity while the replacement starts.
        assert_eq!(s.engine.allocation(100).unwrap().node.0, 14);
        assert_eq!(s.engine.allocation(REPLACEMENT | 100).unwrap().node, to.node);
        assert!(placed(&s.cycle(5050)).is_empty(), "the node is not free yet");
        let a = s.replaced(100).expect("being replaced");
        assert_eq!(a.node, to.node);
        assert!(s.engine.allocation(REPLACEMENT | 100).is_none());
        assert_eq!(placed(&s.cycle(5100)), vec![200]);
        assert_eq!(s.engine.allocation(200).unwrap().node.0, 14);
    }

    #[test]
    fn the_victim_index_follows_work_that_starts_stops_and_moves() {
        let agrees = |s: &Scheduler| s.victim_index.agrees_with(s);
        let mut s = fragmented(Some(Movable::Replace), Some(Movable::Restart));
        assert!(agrees(&s));
        let d = s.submit(job(200, "b", 8, "standard", 5000), 5000);
        assert!(!moves(&d).is_empty(), "{d:?}");
        assert!(s.running().any(|r| r.stopping), "the moved work is stopping");
        assert!(agrees(&s));
        // A moved service runs on its replacement's node, no longer stopping.
        let from = s.engine.allocation(100).unwrap().node;
        let a = s.replaced(100).expect("the service was being moved");
        assert_ne!(a.node, from);
        assert!(agrees(&s));
        s.release(101, 5100);
        assert!(agrees(&s));
        // A move that will not happen: the service stays, no longer stopping.
        let mut s = fragmented(Some(Movable::Replace), None);
        s.submit(job(200, "b", 8, "standard", 5000), 5000);
        s.move_failed(100);
        assert!(s.running().all(|r| !r.stopping));
        assert!(agrees(&s));
        // A priority preemption marks its victim stopping.
        let d = s.submit(job(300, "c", 8, "critical", 9000), 9000);
        assert!(!super::super::testing::preempted(&d).is_empty(), "{d:?}");
        assert!(agrees(&s));
    }

    #[test]
    fn the_disruption_budget_per_tenant_and_hour_is_honoured() {
        // Both small jobs are tenant a's and movable; two 8-GPU requests wait.
        let run = |budget: u32| {
            let r = Some(Movable::Restart);
            let mut s = fragmented_with(&[r, r, None, None]);
            s.cfg.consolidation.moves_per_tenant_per_hour = budget;
            let mut n = 0;
            n += moves(&s.submit(job(200, "b", 8, "standard", 5000), 5000)).len();
            n += moves(&s.submit(job(201, "c", 8, "standard", 5000), 5000)).len();
            for t in [6000, 60_000, 3_000_000] {
                n += moves(&s.cycle(t)).len();
            }
            n
        };
        assert_eq!(run(1), 1, "one move of tenant a's work in the hour");
        assert_eq!(run(2), 2);
    }
}
