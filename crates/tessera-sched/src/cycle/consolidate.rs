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
//! **Force-fit for gangs.** A multi-node gang that waits for room at its level — no rack (the
//! lowest topology level; the pool when it has none) has free GPUs where the gang needs them,
//! though free and movable ones together would do — gets the same kind of plan at the level of a rack: the rack needing
//! the fewest moves (then the fewest units moved, then the least work lost) is emptied of just
//! enough movable single-node work, node by node (the nodes with the fewest movable workloads
//! first), for the gang to fit inside it; every moved workload must fit outside the nodes the
//! gang will take, at once, within the same disruption budget. The nodes the gang will take are
//! held for it until the moved work has left. Gangs themselves are never moved. At most
//! [`GANG_RACKS_TRIED`] racks are tried per gang and cycle, those with the least to move first.
//!
//! MIG pools need no move for an idle GPU: with a whole-GPU layout backend the engine re-lays
//! out a GPU whose instances are all free when a waiting profile needs another layout.

use std::collections::{HashMap, HashSet};

use rustc_hash::FxHashSet;

use tessera_model::Request;
use tessera_model::request::GangRequest;

use super::session::{Session, Status};
use super::statement::Statement;
use super::{Action, Job, Movable, Scheduler};
use crate::reason::{GangUnplaceable, Unplaceable, Wait};
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
                Some(moves) => {
                    let node = s.sched.engine.allocation(moves[0].id).map(|a| a.node.0);
                    s.consolidate(i, moves, node.into_iter().collect());
                }
                None => {
                    fruitless.insert(q.key.clone());
                }
            }
        }
        // Gangs waiting for fragmentation (never searchable for victims, so apart).
        for (i, q) in jobs.iter().enumerate() {
            let Some(g) = &q.job.gang else { continue };
            let Status::Starved { reason, .. } = s.status(i) else {
                continue;
            };
            if !gang_fragmented(reason) || s.sched.nominated.contains_key(&q.job.id) {
                continue;
            }
            if plans >= s.sched.cfg.consolidation.max_plans_per_cycle {
                break;
            }
            plans += 1;
            if let Some((moves, nodes)) = plan_gang(s.sched, &q.job, g, now) {
                s.consolidate(i, moves, nodes);
            }
        }
    }
}

/// Whether a gang waits for room at its level (a reservation's reason says what it waits for
/// now). Its free-GPU figures count whole free nodes for a gang of whole nodes, so a pool whose
/// nodes are all partly used reads as full: whether moves could make room is for the plan to
/// find.
fn gang_fragmented(reason: &Wait) -> bool {
    match reason {
        Wait::Gang(u) => matches!(u, GangUnplaceable::NoRoomAtLevel { .. }),
        Wait::GangHeld { now, .. } => gang_fragmented(now),
        _ => false,
    }
}

/// What a plan of moves costs: moves, then units moved, then work lost (least first).
type Cost = (usize, u64, u64);

/// Most racks tried for one gang's force-fit per cycle.
pub(super) const GANG_RACKS_TRIED: usize = 8;

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

/// Movable candidates by node: (work lost, units, id) each.
type ByNode = HashMap<u32, Vec<(u64, u64, u64)>>;

/// Movable work that may move now, by node: not stopping, past its minimum run time, of a
/// tenant whose disruption budget is not spent, accepted by `may_move`, on a node not in `held`
/// that `on_node` accepts; each as (work lost, units, id). With it, the moves left in each
/// tenant's budget, for the tenants looked at (looked up as they come: most running work is
/// not movable).
fn movable_by_node<'r>(
    s: &Scheduler,
    running: &'r rustc_hash::FxHashMap<u64, super::Running>,
    now: i64,
    held: &FxHashSet<u32>,
    may_move: impl Fn(&super::Running) -> bool,
    on_node: impl Fn(&tessera_model::Node) -> bool,
) -> (HashMap<&'r str, u32>, ByNode) {
    let budget = s.cfg.consolidation.moves_per_tenant_per_hour;
    let mut left: HashMap<&str, u32> = HashMap::new();
    let mut by_node = ByNode::new();
    for r in running.values() {
        if r.movable.is_none() || r.stopping || !may_move(r) || now - r.running_since_ms < s.cfg.min_runtime_ms {
            continue;
        }
        let tenant_left = *left
            .entry(r.tenant.as_str())
            .or_insert_with(|| budget.saturating_sub(moves_in_last_hour(s, &r.tenant, now)));
        if tenant_left == 0 {
            continue;
        }
        let Some(a) = s.engine.allocation(r.id) else { continue };
        if held.contains(&a.node.0) || !on_node(s.engine.fleet().node(a.node)) {
            continue;
        }
        by_node
            .entry(a.node.0)
            .or_default()
            .push((r.work_lost(now), r.units.as_milli(), r.id));
    }
    (left, by_node)
}

/// Places each workload of `taken` (its id and the node it runs on) elsewhere in `trial` at
/// once, on a node of the same pool and GPU model: services first (their replacements are
/// booked in this order), then restartable work. The moves, or none if one does not fit.
fn place_elsewhere(
    running: &rustc_hash::FxHashMap<u64, super::Running>,
    trial: &mut Statement<'_>,
    fleet: &tessera_model::Fleet,
    taken: impl Iterator<Item = (u64, u32)>,
) -> Vec<Move> {
    let mut order: Vec<(Movable, u64, u32)> = taken
        .map(|(id, n)| (running[&id].movable.expect("movable"), id, n))
        .collect();
    order.sort_by_key(|(how, id, _)| (*how == Movable::Restart, *id));
    let mut moves = Vec::new();
    for (how, id, n) in order {
        let req = same_model(&running[&id].request, fleet, n);
        match trial.place(id, &req) {
            Some(to) => moves.push(Move { id, how, to }),
            None => return Vec::new(),
        }
    }
    moves
}

/// What `moves` cost, the workloads they move being `taken` (work lost, units).
fn cost_of(moves: &[Move], taken: impl Iterator<Item = (u64, u64)> + Clone) -> Cost {
    (
        moves.len(),
        taken.clone().map(|c| c.1).sum::<u64>(),
        taken.map(|c| c.0).sum::<u64>(),
    )
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
    // Movable candidates by node (sorted cheapest first below: least work lost, then fewest
    // units), and the moves left in each tenant's disruption budget.
    let (left, mut by_node) = movable_by_node(
        s,
        &s.running,
        now,
        &held,
        |_| true,
        |node| pools.contains(&node.pool) && job.request.allows_model(node.model),
    );
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
            let taken = taken.iter().map(|c| (c.2, node_of[&c.2]));
            moves = place_elsewhere(&s.running, &mut trial, &fleet, taken);
        }
        trial.rollback(cp);
        if !moves.is_empty() {
            let cost = cost_of(&moves, taken.iter().map(|c| (c.0, c.1)));
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
    book_replacements(s, moves, blocked)
}

/// The fewest moves of movable work out of one rack after which gang `g` fits there (see the
/// module doc), with the nodes it will take; or `None`.
fn plan_gang(s: &mut Scheduler, job: &Job, g: &GangRequest, now: i64) -> Option<(Vec<Move>, Vec<u32>)> {
    if s.movable_running == 0 {
        return None;
    }
    let held = s.held_for_others(job.id);
    let fleet = s.engine.fleet().clone();
    let pools = s.engine.gang_pools(g);
    // Movable single-node work by node: (work lost, units, id).
    let (left, by_node) = movable_by_node(
        s,
        &s.running,
        now,
        &held,
        |r| r.gang_nodes.is_empty(),
        |node| pools.contains(&node.pool),
    );
    if by_node.is_empty() {
        return None;
    }
    // The racks of those pools (the pool itself where it has no level), each with its nodes.
    let mut racks: Vec<Vec<u32>> = Vec::new();
    for &pool in &pools {
        let range = fleet.pools[pool.0 as usize].nodes.clone();
        if fleet.levels.pool_has(0, pool) {
            for d in fleet.levels.domains(0) {
                if d.nodes.first().is_some_and(|n| range.contains(n)) {
                    racks.push(d.nodes.clone());
                }
            }
        } else {
            racks.push(range.collect());
        }
    }
    // Only racks where free plus movable units could hold the gang, least to move first.
    let need = u64::from(g.gpus) * 1000;
    let st = s.engine.state();
    let mut tried: Vec<(u64, usize)> = racks
        .iter()
        .enumerate()
        .filter_map(|(k, nodes)| {
            let usable = nodes.iter().filter(|n| !held.contains(n));
            let (mut free, mut movable) = (0u64, 0u64);
            for &n in usable {
                free += st.nodes[n as usize]
                    .gpus
                    .iter()
                    .map(|g| g.free_milli() as u64)
                    .sum::<u64>();
                movable += by_node.get(&n).map_or(0, |c| c.iter().map(|c| c.1).sum());
            }
            (movable > 0 && free + movable >= need).then_some((need.saturating_sub(free), k))
        })
        .collect();
    tried.sort_unstable();
    tried.truncate(GANG_RACKS_TRIED);
    let mut best: Option<(Cost, Vec<Move>, Vec<u32>)> = None;
    let mut trial = Statement::new(&mut s.engine);
    for (_, k) in tried {
        let rack = &racks[k];
        // The gang may only go inside this rack.
        let inside: FxHashSet<u32> = rack.iter().copied().collect();
        let mut outside: FxHashSet<u32> = (0..fleet.nodes.len() as u32).filter(|n| !inside.contains(n)).collect();
        outside.extend(held.iter().copied());
        trial.set_blocked(outside);
        let cp = trial.checkpoint();
        // Nodes with the fewest movable workloads first, each emptied whole.
        let mut nodes: Vec<(usize, u64, u32)> = rack
            .iter()
            .filter_map(|n| {
                let c = by_node.get(n)?;
                Some((c.len(), c.iter().map(|c| c.1).sum(), *n))
            })
            .collect();
        nodes.sort_unstable();
        let mut taken: Vec<(u64, u64, u64, u32)> = Vec::new();
        let mut per_tenant: HashMap<&str, u32> = HashMap::new();
        let mut placement = trial.plan_gang(g).ok();
        for &(_, _, n) in &nodes {
            if placement.is_some() || best.as_ref().is_some_and(|b| taken.len() >= b.0.0) {
                break;
            }
            let mut cands = by_node[&n].clone();
            cands.sort_unstable();
            for c in cands {
                let r = &s.running[&c.2];
                let t = per_tenant.entry(r.tenant.as_str()).or_default();
                if *t >= left[r.tenant.as_str()] {
                    continue;
                }
                *t += 1;
                assert!(trial.evict(c.2), "a running workload has an allocation");
                taken.push((c.0, c.1, c.2, n));
            }
            placement = trial.plan_gang(g).ok();
        }
        let mut moves = Vec::new();
        let mut gang_nodes = Vec::new();
        if let Some(p) = placement {
            gang_nodes = p.shares.iter().map(|sh| sh.node.0).collect();
            // Only work on the nodes the gang takes moves; it must fit outside them, at once
            // (services first, their replacements booked in this order).
            let mut blocked = held.clone();
            blocked.extend(gang_nodes.iter().copied());
            trial.set_blocked(blocked);
            taken.retain(|c| gang_nodes.contains(&c.3));
            moves = place_elsewhere(&s.running, &mut trial, &fleet, taken.iter().map(|c| (c.2, c.3)));
        }
        trial.rollback(cp);
        if !moves.is_empty() {
            let cost = cost_of(&moves, taken.iter().map(|c| (c.0, c.1)));
            if best.as_ref().is_none_or(|b| cost < b.0) {
                best = Some((cost, moves, gang_nodes));
            }
        }
    }
    trial.set_blocked(FxHashSet::default());
    drop(trial);
    let (_, moves, gang_nodes) = best?;
    let mut blocked = held;
    blocked.extend(gang_nodes.iter().copied());
    let moves = book_replacements(s, moves, blocked)?;
    Some((moves, gang_nodes))
}

/// Books the replacements of the services among `moves` where they can go with `blocked` held
/// back (the trial's choices, made on the same state), and gives the moves with each service's
/// booking; `None` (nothing booked) if one no longer fits.
fn book_replacements(s: &mut Scheduler, moves: Vec<Move>, blocked: FxHashSet<u32>) -> Option<Vec<Move>> {
    let fleet = s.engine.fleet().clone();
    s.engine.set_blocked(blocked);
    let mut booked = Vec::new();
    let mut ok = true;
    for m in moves.iter().filter(|m| m.how == Movable::Replace) {
        let node = s
            .engine
            .allocation(m.id)
            .expect("a running workload has an allocation")
            .node
            .0;
        let req = same_model(&s.running[&m.id].request, &fleet, node);
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

    /// A gang of `gpus` whole GPUs as whole nodes of the training pool, required in one rack.
    fn rack_gang(id: u64, gpus: u32, now: i64) -> Job {
        use tessera_model::request::{GangRequest, TopologyConstraint};
        let g = GangRequest::whole_nodes(gpus)
            .with_pool(tessera_model::PoolId(0))
            .with_topology(TopologyConstraint::required("rack"));
        Job {
            gang: Some(g),
            ..job(id, "g", 8, "standard", now)
        }
    }

    fn rack(s: &Scheduler, node: u32) -> String {
        let f = s.engine.fleet();
        f.levels
            .domain_name(0, tessera_model::NodeId(node))
            .unwrap_or_default()
            .to_string()
    }

    #[test]
    fn a_gang_is_force_fit_into_one_rack_by_moving_just_enough_movable_work_out_of_it() {
        // Every node of the 4 racks × 4 nodes runs one movable 2-GPU job (each of its own
        // tenant, so no disruption budget binds): 96 GPUs free, no node whole. A 16-GPU gang
        // required in one rack needs two whole nodes there.
        let mut s = sched();
        for n in 0..16u32 {
            let tenant = format!("t{n}");
            place_on(
                &mut s,
                n,
                movable(
                    job(100 + u64::from(n), &tenant, 2, "standard", 0),
                    Some(Movable::Restart),
                ),
                0,
            );
        }
        // Unmovable work is never moved for it.
        let mut fixed = sched();
        for n in 0..16u32 {
            place_on(
                &mut fixed,
                n,
                job(100 + u64::from(n), &format!("t{n}"), 2, "standard", 0),
                0,
            );
        }
        let d = fixed.submit(rack_gang(1, 16, 5000), 5000);
        assert!(moves(&d).is_empty(), "{d:?}");

        let d = s.submit(rack_gang(1, 16, 5000), 5000);
        let m = moves(&d);
        assert_eq!(m.len(), 2, "two nodes emptied, no more: {d:?}");
        assert!(m.iter().all(|(_, by, service)| *by == 1 && !service), "{m:?}");
        let from: Vec<u32> = m
            .iter()
            .map(|(id, _, _)| s.engine.allocation(*id).unwrap().node.0)
            .collect();
        assert_eq!(rack(&s, from[0]), rack(&s, from[1]), "both out of one rack: {from:?}");
        // Nothing else takes the freed nodes meanwhile, and the gang goes there once the moved
        // work has left (requeued, it comes back elsewhere).
        for (id, _, _) in &m {
            s.release(*id, 5100);
        }
        let d = s.cycle(5100);
        let shares = d
            .iter()
            .find_map(|x| match x {
                Decision::PlacedGang { id: 1, shares, .. } => Some(shares.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{d:?}"));
        let mut got: Vec<u32> = shares.iter().map(|a| a.node.0).collect();
        let mut want = from.clone();
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(got, want, "the gang takes the emptied nodes");
        for (id, _, _) in &m {
            let n = *id as u32 - 100;
            s.enqueue(movable(
                job(*id, &format!("t{n}"), 2, "standard", 0),
                Some(Movable::Restart),
            ));
        }
        let d = s.cycle(5200);
        assert_eq!(placed(&d).len(), 2, "the moved work runs again elsewhere: {d:?}");
        for (id, _, _) in &m {
            assert!(!from.contains(&s.engine.allocation(*id).unwrap().node.0));
        }
    }
}
