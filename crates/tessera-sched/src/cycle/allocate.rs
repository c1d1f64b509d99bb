//! The allocate action: the queue in order, each admitted job placed where the engine says and
//! its quotas allow, with bounded backfill. A head that has waited past the backfill window
//! reserves a node in its pool (see the starvation bound in the [cycle](super) doc), a gang
//! nodes in a rack with an earliest start ([`Hold`](super::Hold)); nodes held for other
//! jobs are out of every placement's reach, but for work that ends before a gang's start on that
//! gang's nodes. A job that finds no capacity is left starved, with the engine's diagnosis as its
//! reason, for reclaim and preempt to look at.

use std::rc::Rc;
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use tessera_model::request::GangRequest;
use tessera_model::{PoolId, Request};

use super::admit::{self, Exceeded};
use super::session::{Session, Status};
use super::{Action, Decision, Hold, Job, Queued, Scheduler};
use crate::reason::{GangUnplaceable, LimitExceeded, Wait};

pub(super) struct Allocate;

/// Why a job was not placed.
enum Blocked {
    /// Over a limit: wait or be refused, per the request.
    Over(LimitExceeded),
    /// Recently preempted: may not borrow yet (always waits).
    Backoff(Wait),
    /// No capacity.
    NoCapacity,
}

impl Action for Allocate {
    fn name(&self) -> &'static str {
        "allocate"
    }

    fn execute(&self, s: &mut Session<'_>) {
        let now = s.now;
        // Requests that found no capacity this cycle, with the reason and whether victims may be
        // searched for them: capacity only shrinks during a cycle, so the same request fails
        // again (shape, host needs and, on shared pools, the tenant are all in the key) — unless
        // it holds a reservation, which others may not use.
        let mut no_capacity: FxHashMap<Request, (Rc<Wait>, bool)> = FxHashMap::default();
        let mut explains = EXPLAINS_PER_CYCLE;
        // Work may have ended since the gangs' start times were computed (sooner than its lease
        // said, or was stopped): start times only move earlier, and backfill must not delay
        // them, so they are computed again before anything is placed.
        refresh_holds(s.sched, now);
        let jobs = s.jobs.clone();
        for (i, q) in jobs.iter().enumerate() {
            let job = &q.job;
            let Some(pools) = s.take_admitted(i) else {
                continue;
            };
            let sched = &mut *s.sched;
            if let Some(g) = &job.gang {
                // Planned afresh each time (no cache keyed by shape), never reserving a single
                // node: it waits with the level's reason, and once past the backfill window it
                // holds nodes (where alone it may search for victims).
                let blocked = sched.held_for_placing(job, now);
                let any_blocked = !blocked.is_empty();
                if any_blocked {
                    sched.engine.set_blocked(blocked);
                }
                let placed = place_gang(sched, q, g, &pools, now);
                if any_blocked {
                    sched.engine.set_blocked(FxHashSet::default());
                }
                match placed {
                    Ok(d) => {
                        drop_hold(sched, job.id, now);
                        sched.nominated.remove(&job.id);
                        sched.reasons.remove(&job.id);
                        s.set(i, Status::Placed);
                        s.decide(d);
                    }
                    Err((Blocked::Over(over), _)) => s.exceeded(i, Exceeded::Limit(over)),
                    Err((Blocked::Backoff(reason), _)) => s.set(i, Status::Waiting(reason)),
                    Err((Blocked::NoCapacity, why)) => {
                        // Nodes held for it by a consolidation whose moved work has all left,
                        // and still no room: the hold goes (a later cycle may plan again).
                        if sched.nominated.get(&job.id).is_some_and(|n| n.victims.is_empty()) {
                            sched.nominated.remove(&job.id);
                        }
                        let mut reason = Wait::Gang(why.map_or(GangUnplaceable::NoPoolServes, |u| *u));
                        let mut holds = false;
                        if now >= gang_hold_due(sched, job) {
                            if sched.cfg.gang_holds_move {
                                move_gang_hold(sched, job, g, &q.scope, now);
                            }
                            hold_for_gang(sched, job, g, &q.scope, now);
                        }
                        if let Some(held) = held_reason(sched, job.id, &reason, now) {
                            holds = true;
                            reason = held;
                        }
                        // Only a gang holding nodes searches for victims, there (see victims).
                        let waiting_for_victims = sched.nominated.get(&job.id).is_some_and(|n| !n.victims.is_empty());
                        s.set(
                            i,
                            Status::Starved {
                                reason: Rc::new(reason),
                                searchable: holds && !waiting_for_victims,
                            },
                        );
                    }
                }
                continue;
            }
            let nominated = sched.nominated.contains_key(&job.id);
            let reserving =
                sched.reservations.values().any(|(j, _)| *j == job.id) || sched.holds.iter().any(|h| h.job == job.id);
            // Short work may find room on a gang's reserved nodes that others of its shape
            // may not use.
            let backfills = sched.backfills_a_hold(job, now);
            if !nominated
                && !reserving
                && !backfills
                && let Some((reason, searchable)) = no_capacity.get(&q.key)
            {
                // Its shape found no room this cycle, but it may still take a hold of its own.
                let (mut reason, searchable) = (reason.clone(), *searchable);
                if take_hold(sched, job, &pools, now)
                    && let Some(held) = held_reason(sched, job.id, &reason, now)
                {
                    reason = Rc::new(held);
                }
                s.set(i, Status::Starved { reason, searchable });
                continue;
            }
            let blocked = sched.held_for_placing(job, now);
            let any_blocked = !blocked.is_empty();
            // Work that may backfill a hold tries the nodes no one holds first: held nodes
            // are backfilled only where it fits nowhere else ([`Scheduler::held_anywhere`]).
            let mut placed = Err(Blocked::NoCapacity);
            if backfills {
                let avoid = sched.held_anywhere(job, &blocked);
                if avoid != blocked {
                    sched.engine.set_blocked(avoid);
                    placed = place(sched, q, &pools, now);
                }
            }
            if placed.is_err() {
                sched.engine.set_blocked(blocked);
                placed = place(sched, q, &pools, now);
            }
            if sched.engine.blocking() {
                sched.engine.set_blocked(FxHashSet::default());
            }
            match placed {
                Ok(d) => {
                    sched.reservations.retain(|_, (j, _)| *j != job.id);
                    drop_hold(sched, job.id, now);
                    sched.nominated.remove(&job.id);
                    sched.reasons.remove(&job.id);
                    s.set(i, Status::Placed);
                    s.decide(d);
                }
                Err(Blocked::Over(over)) => s.exceeded(i, Exceeded::Limit(over)),
                Err(Blocked::Backoff(reason)) => s.set(i, Status::Waiting(reason)),
                Err(Blocked::NoCapacity) => {
                    if !take_hold(sched, job, &pools, now) && now - job.submitted_ms > sched.cfg.backfill_max_wait_ms {
                        let scope: Vec<PoolId> = pools.iter().map(|(p, _)| *p).collect();
                        reserve(sched, job, &scope);
                    }
                    // Without the reservations in the way, would it fit? (With none in the
                    // way the answer is known: only the reason is needed.)
                    let reason = Rc::new(if any_blocked && fits_unblocked(sched, q) {
                        Wait::Held
                    } else {
                        explain(sched, q, &mut explains)
                    });
                    // The requests of its shape behind it get the reason without its hold.
                    let shared = reason.clone();
                    let reason = match held_reason(sched, job.id, &reason, now) {
                        Some(held) => Rc::new(held),
                        None => reason,
                    };
                    // A preemptor still waiting for its victims does not search again; one
                    // whose victims have all stopped and still does not fit gives up its
                    // nomination (and the nodes held for it) and may search again. Either way
                    // the requests like it behind it may search: a nomination is not theirs.
                    let waiting_for_victims = sched.nominated.get(&job.id).is_some_and(|n| !n.victims.is_empty());
                    if nominated && !waiting_for_victims {
                        sched.nominated.remove(&job.id);
                    }
                    no_capacity.insert(q.key.clone(), (shared, true));
                    s.set(
                        i,
                        Status::Starved {
                            reason,
                            searchable: !waiting_for_victims,
                        },
                    );
                }
            }
        }
    }
}

/// The first jobs of the queue in the order this cycle serves it, at most `limit`: nominated
/// preemptors whose victims are gone first, then as the queue-order plugin says; past the first
/// [`UNFILTERED_HEAD`], only jobs that may find room. Says too whether jobs that may find room
/// were left for a later cycle. Reservations of jobs no longer waiting lapse. Reads only the head
/// of the queue ([`WaitQueue`](super::queue)).
pub(super) fn queue_order(s: &mut Scheduler, now: i64, limit: usize) -> (Vec<Arc<Queued>>, bool) {
    // Each waiting tenant's fair share, by tenant number.
    let mut share = vec![0.0; s.queue.tenant_count()];
    for (n, t) in s.queue.tenants() {
        s.books.decay(t, now, s.cfg.half_life_ms);
        share[n] = s.books.fair_share(t);
    }
    let key = |q: &Queued| s.plugins.queue_order.key(&q.job, q.rank, share[q.tenant]);
    let ready = |id: &u64| s.nominated.get(id).is_some_and(|n| n.victims.is_empty());
    let mut first: Vec<(super::OrderKey, Arc<Queued>)> = s
        .nominated
        .keys()
        .filter(|id| ready(id))
        .filter_map(|id| s.queue.get(*id))
        .map(|q| (key(q), q.clone()))
        .collect();
    first.sort_unstable_by_key(|(k, _)| *k);
    first.truncate(limit);
    let mut order: Vec<Arc<Queued>> = first.into_iter().map(|(_, q)| q).collect();
    // Past the head (whose starved jobs may search for victims), jobs whose capacity key found
    // no room in every pool of its scope, where nothing was freed since, are left out.
    let unfit = |q: &Queued| known_unfit_in_scope(s, q);
    let head = UNFILTERED_HEAD.saturating_sub(order.len());
    let (rest, cut) = s.queue.first(head, limit - order.len(), key, |id| ready(&id), unfit);
    order.extend(rest);
    let queue = &s.queue;
    s.reservations.retain(|_, (j, _)| queue.contains(*j));
    s.holds.retain(|h| queue.contains(h.job));
    (order, cut)
}

/// Places `job` in the first pool of `pools` where it fits and its quotas allow, booking it.
fn place(
    s: &mut Scheduler,
    q: &Queued,
    pools: &[(PoolId, Option<LimitExceeded>)],
    now: i64,
) -> Result<Decision, Blocked> {
    let job = &q.job;
    let mut refusals = Refusals::default();
    for (pool, at_admission) in pools {
        if !refusals.within_limit(s, q, *pool, at_admission) {
            continue;
        }
        let mut req = job.request.clone();
        req.pool = Some(*pool);
        let Some(p) = find(s, q, &req, *pool) else { continue };
        let p = if s.cfg.place_by_end {
            by_end(s, job, &req, *pool, p, now)
        } else {
            p
        };
        let Some((keys, borrowing)) = refusals.admitted(admit_on(s, q, p.node, p.units, now)) else {
            continue;
        };
        let alloc = s.engine.commit(job.id, &req, p).expect("a fresh plan commits").clone();
        s.hold(job, keys, alloc.units, alloc.node, borrowing, now);
        return Ok(Decision::Placed {
            id: job.id,
            alloc,
            borrowing,
        });
    }
    Err(refusals.blocked().unwrap_or(Blocked::NoCapacity))
}

/// With [`GovernConfig::place_by_end`](super::GovernConfig::place_by_end): where request `req`
/// of `job` (whole GPUs with a requested duration, in whole-GPU `pool`; `found` is where the
/// placement policy would put it) goes instead: the node where it extends the busy horizon
/// (the latest lease end of the work there, [`Running::ends_at_ms`](super::Running); work
/// without an end never ends, an empty node's is `now`) least, then in the rack with the
/// fewest free GPUs, then on the node with the fewest, then the lowest number. `found` for
/// other requests, or if the engine does not place it on that node after all.
fn by_end(
    s: &mut Scheduler,
    job: &Job,
    req: &Request,
    pool: PoolId,
    found: crate::state::Placement,
    now: i64,
) -> crate::state::Placement {
    let (tessera_model::Shape::Whole { gpus }, Some(d)) = (&req.shape, job.duration_ms) else {
        return found;
    };
    let fleet = s.engine.fleet().clone();
    if fleet.pool(pool).sharing != tessera_model::Sharing::Whole {
        return found;
    }
    let end = now.saturating_add(d.max(0));
    let best = {
        let st = s.engine.state();
        let blocked = s.engine.blocked();
        let rack = |n: u32| fleet.levels.domain_of(0, tessera_model::NodeId(n)).unwrap_or(u32::MAX);
        let mut rack_free: FxHashMap<u32, u32> = FxHashMap::default();
        let mut cands: Vec<(i64, u32, u32)> = Vec::new();
        for n in fleet.pool(pool).nodes.clone() {
            let node = &st.nodes[n as usize];
            let free = node.free_gpus();
            *rack_free.entry(rack(n)).or_default() += free;
            if free < u32::from(*gpus) || blocked.contains(&n) || !req.allows_model(fleet.nodes[n as usize].model) {
                continue;
            }
            let horizon = node
                .gpus
                .iter()
                .flat_map(|g| g.holders.iter())
                .map(|&a| {
                    let owner = holder_owner(&s.engine, a);
                    s.running.get(&owner).map_or(i64::MAX, |r| {
                        if r.stopping {
                            now
                        } else {
                            r.ends_at_ms.unwrap_or(i64::MAX)
                        }
                    })
                })
                .max()
                .unwrap_or(now);
            cands.push(((end - horizon.max(now)).max(0), free, n));
        }
        cands
            .into_iter()
            .min_by_key(|&(extends, free, n)| (extends, rack_free[&rack(n)], free, n))
            .map(|(_, _, n)| n)
    };
    let Some(n) = best.filter(|&n| n != found.node.0) else {
        return found;
    };
    // The engine places it on that node: every other node of the pool held back a moment.
    let before = s.engine.blocked().clone();
    let mut only = before.clone();
    only.extend(fleet.pool(pool).nodes.clone().filter(|&m| m != n));
    s.engine.set_blocked(only);
    let p = s.engine.find(req);
    s.engine.set_blocked(before);
    p.unwrap_or(found)
}

/// Why [`admit_on`] turned a placement down.
enum Turned {
    Over(LimitExceeded),
    Backoff(Wait),
}

/// Why a job was placed in none of the pools tried so far: the first reason of each kind, as
/// the pools are tried in turn.
#[derive(Default)]
struct Refusals {
    over: Option<LimitExceeded>,
    backoff: Option<Wait>,
}

impl Refusals {
    /// Whether `q`'s quotas leave room for it in `pool`: not if admission found a limit there
    /// (`at_admission`), or if earlier jobs of this cycle have taken the room admission saw.
    /// The limit is kept if not.
    fn within_limit(&mut self, s: &Scheduler, q: &Queued, pool: PoolId, at_admission: &Option<LimitExceeded>) -> bool {
        let pool_level = match at_admission {
            Some(l) => Err(l.clone()),
            None => admit::pool_limit(s, q, pool, q.units),
        };
        match pool_level {
            Ok(()) => true,
            Err(l) => {
                self.over.get_or_insert(l);
                false
            }
        }
    }

    /// What [`admit_on`] gave, or `None` with why it turned the placement down kept.
    fn admitted<T>(&mut self, admitted: Result<T, Turned>) -> Option<T> {
        match admitted {
            Ok(k) => Some(k),
            Err(Turned::Over(l)) => {
                self.over.get_or_insert(l);
                None
            }
            Err(Turned::Backoff(b)) => {
                self.backoff.get_or_insert(b);
                None
            }
        }
    }

    /// Why the job is blocked: over a limit, else backed off; `None`: no capacity.
    fn blocked(self) -> Option<Blocked> {
        match (self.over, self.backoff) {
            (Some(o), _) => Some(Blocked::Over(o)),
            (None, Some(b)) => Some(Blocked::Backoff(b)),
            (None, None) => None,
        }
    }
}

/// The quota keys of a placement of `q` whose (first) node is `node`, holding `units`, and
/// whether it borrows above the tenant's guarantee; or why it may not be booked there: a
/// limit, or a workload preempted for a reclaim or a higher priority that may not borrow again
/// at once (it would be preempted again after the minimum runtime, losing work each time).
fn admit_on(
    s: &Scheduler,
    q: &Queued,
    node: tessera_model::NodeId,
    units: tessera_model::GpuUnits,
    now: i64,
) -> Result<(Vec<String>, bool), Turned> {
    let mut keys = super::class_keys(s.engine.fleet(), node);
    keys.push(q.project_key.clone());
    let borrowing = s
        .books
        .check(&q.job.tenant, &keys, units)
        .map_err(Turned::Over)?
        .borrowing();
    if borrowing && let Some(&(times, at)) = s.preempted.get(&q.job.id) {
        let until = at + s.cfg.min_runtime_ms * (1i64 << times.min(4));
        if now < until {
            return Err(Turned::Backoff(Wait::Backoff {
                times,
                retry_in_s: (until - now + 999) / 1000,
            }));
        }
    }
    Ok((keys, borrowing))
}

/// Places gang `g` (the request of `q`) in the first pool of `pools` where it fits whole and
/// its quotas allow, booking every share; or why not, with the engine's reason when it found
/// no room (`None`: room only where nodes are held for others).
fn place_gang(
    s: &mut Scheduler,
    q: &Queued,
    g: &GangRequest,
    pools: &[(PoolId, Option<LimitExceeded>)],
    now: i64,
) -> Result<Decision, (Blocked, Option<Box<GangUnplaceable>>)> {
    let job = &q.job;
    let units = q.units;
    let mut refusals = Refusals::default();
    let mut why: Option<Box<GangUnplaceable>> = None;
    for (pool, at_admission) in pools {
        if !refusals.within_limit(s, q, *pool, at_admission) {
            continue;
        }
        let mut g = g.clone();
        g.pool = Some(*pool);
        let p = match s.engine.plan_gang(&g) {
            Ok(p) => p,
            Err(u) => {
                why.get_or_insert(Box::new(u));
                continue;
            }
        };
        // Every share is in one pool, on one GPU model: the first share's node names the
        // quota keys, and the whole gang's units are counted against them.
        let Some((keys, borrowing)) = refusals.admitted(admit_on(s, q, p.shares[0].node, units, now)) else {
            continue;
        };
        let gang = s
            .engine
            .commit_gang(job.id, &g, p)
            .expect("a fresh gang plan commits")
            .clone();
        let shares: Vec<_> = gang
            .shares
            .iter()
            .map(|id| s.engine.allocation(*id).expect("a committed share").clone())
            .collect();
        let nodes = shares.iter().map(|a| a.node).collect();
        s.hold_on(job, keys, gang.units, nodes, borrowing, now);
        return Ok(Decision::PlacedGang {
            id: job.id,
            shares,
            borrowing,
        });
    }
    Err(match refusals.blocked() {
        Some(b) => (b, None),
        None => (Blocked::NoCapacity, why),
    })
}

/// A cycle's session holds this many jobs of the head of the queue whatever they are (starved
/// ones there may search for victims); further on, only jobs that may find room.
pub(super) const UNFILTERED_HEAD: usize = 256;

/// At most this many requests of a cycle that find no capacity get a fresh diagnosis (a pass
/// over their pools' nodes); the others keep the one they last had, refreshed on a later cycle.
/// Only figures and, rarely, the kind of a waiting reason can be stale: placement is always
/// tried against the current state.
const EXPLAINS_PER_CYCLE: usize = 32;

/// Where `req` (the request of `q` restricted to `pool`) would go now. A request whose capacity
/// key found no room in `pool` with no node blocked is not searched again until capacity there
/// may have grown ([`Engine::freed_generation`](crate::engine::Engine::freed_generation)):
/// "unschedulable until capacity changes", an O(1) answer on a deep queue.
fn find(s: &mut Scheduler, q: &Queued, req: &Request, pool: PoolId) -> Option<crate::state::Placement> {
    if known_unfit(s, q, pool) {
        return None;
    }
    let found = s.engine.find(req);
    if found.is_none() && !s.engine.blocking() {
        let generation = s.engine.freed_generation(pool);
        let v = s.unfit.entry(q.key.clone()).or_default();
        v.retain(|(p, _)| *p != pool);
        v.push((pool, generation));
    }
    found
}

/// Whether `q`'s capacity key found no room in `pool` and nothing was freed there since.
fn known_unfit(s: &Scheduler, q: &Queued, pool: PoolId) -> bool {
    let generation = s.engine.freed_generation(pool);
    s.unfit.get(&q.key).is_some_and(|v| v.contains(&(pool, generation)))
}

/// [`known_unfit`] in every pool of `q`'s scope (true for an empty scope), the capacity key
/// looked up once.
pub(super) fn known_unfit_in_scope(s: &Scheduler, q: &Queued) -> bool {
    match s.unfit.get(&q.key) {
        Some(v) => q.scope.iter().all(|&p| v.contains(&(p, s.engine.freed_generation(p)))),
        None => q.scope.is_empty(),
    }
}

/// Whether `q` would fit somewhere in its scope if no node were held for others.
fn fits_unblocked(s: &mut Scheduler, q: &Queued) -> bool {
    q.scope.iter().any(|&pool| {
        let mut req = q.job.request.clone();
        req.pool = Some(pool);
        find(s, q, &req, pool).is_some()
    })
}

/// Why `q` finds no capacity: the engine's diagnosis, fresh while `budget` lasts (or when none
/// is known), otherwise the one its capacity key last had.
fn explain(s: &mut Scheduler, q: &Queued, budget: &mut usize) -> Wait {
    if *budget == 0
        && let Some(w) = s.explained.get(&q.key)
    {
        return w.clone();
    }
    *budget = budget.saturating_sub(1);
    let w = Wait::Unplaceable(s.engine.explain(&q.job.request));
    s.explained.insert(q.key.clone(), w.clone());
    w
}

/// Holds nodes for gang `g` (job `id`, which waited past the backfill window) in the first pool
/// of `scope` with room for another hold, unless it holds some already: see the starvation
/// bound in the [cycle](super) doc for which nodes.
fn hold_for_gang(s: &mut Scheduler, job: &Job, g: &GangRequest, scope: &[PoolId], now: i64) {
    let upto = s.holds.len();
    hold_gang_after(s, job, g, scope, now, upto);
}

/// [`hold_for_gang`], the holds `s.holds[..upto]` ahead of it (with
/// [`GovernConfig::gang_holds_stack`](super::GovernConfig::gang_holds_stack) it may stack on
/// their nodes after their windows; the holds after `upto` do not hold it back).
fn hold_gang_after(s: &mut Scheduler, job: &Job, g: &GangRequest, scope: &[PoolId], now: i64, upto: usize) {
    if let Some(h) = plan_gang_hold(s, job, g, scope, now, upto) {
        s.holds.push(Hold { gang: true, ..h });
    }
}

/// The hold [`hold_gang_after`] takes, without taking it: in the first pool of `scope` with room
/// for another hold, behind the holds `s.holds[..upto]`.
fn plan_gang_hold(s: &Scheduler, job: &Job, g: &GangRequest, scope: &[PoolId], now: i64, upto: usize) -> Option<Hold> {
    let pool = pool_for_hold(s, job.id, true, scope.iter().copied())?;
    let (per, k, last) = shares_in(s.engine.fleet(), pool, g)?;
    plan_hold(
        s,
        job.id,
        (u32::from(per), k, last),
        job.duration_ms,
        s.cfg.gang_holds_stack.then_some(upto),
        &|m| g.allows_model(m),
        pool,
        now,
    )
}

/// With [`GovernConfig::gang_holds_move`](super::GovernConfig::gang_holds_move): gang `g`
/// (job `id`) moves its hold to the nodes where it would now start soonest (chosen as a new
/// hold is, its own nodes eligible again) if it starts there strictly sooner than on the nodes
/// it holds; otherwise it keeps them. Its start never moves later, and only work that ends by
/// the new start runs on the new nodes (the start is computed from it).
fn move_gang_hold(s: &mut Scheduler, job: &Job, g: &GangRequest, scope: &[PoolId], now: i64) {
    let id = job.id;
    let Some(i) = s.holds.iter().position(|h| h.job == id) else {
        return;
    };
    let old = s.holds.remove(i);
    // Stacked, it plans behind the holds ahead of it only (the ones taken before it).
    hold_gang_after(s, job, g, scope, now, i);
    let sooner = match s.holds.last() {
        Some(new) if new.job == id => match (new.starts_at_ms, old.starts_at_ms) {
            (Some(n), Some(o)) => n < o,
            (Some(_), None) => true,
            _ => false,
        },
        _ => false,
    };
    let new = if sooner {
        s.holds.pop().expect("the new hold")
    } else {
        if s.holds.last().is_some_and(|h| h.job == id) {
            s.holds.pop();
        }
        old
    };
    s.holds.insert(i, new);
    // The holds stacked behind it start when its window allows.
    if sooner && s.cfg.gang_holds_stack {
        refresh_holds(s, now);
    }
}

/// For a request of whole GPUs on one node that waited past the backfill window: holds the node
/// where it fits soonest, if its pools have room for another hold (see [`plan_hold`]). Says
/// whether it is such a request (other shapes [`reserve`] a node instead).
fn take_hold(s: &mut Scheduler, job: &Job, pools: &[(PoolId, Option<LimitExceeded>)], now: i64) -> bool {
    let tessera_model::Shape::Whole { gpus } = job.request.shape else {
        return false;
    };
    if now - job.submitted_ms > s.cfg.backfill_max_wait_ms
        && let Some(pool) = pool_for_hold(s, job.id, false, pools.iter().map(|(p, _)| *p))
        && let Some(h) = plan_hold(
            s,
            job.id,
            (u32::from(gpus), 1, u32::from(gpus)),
            job.duration_ms,
            None,
            &|m| job.request.allows_model(m),
            pool,
            now,
        )
    {
        s.holds.push(h);
    }
    true
}

/// Where job `id` may take a hold: the first pool of `scope` with fewer holds than
/// [`GovernConfig::holds_per_pool`](super::GovernConfig); `None` if it holds nodes already.
fn pool_for_hold(s: &Scheduler, id: u64, gang: bool, scope: impl Iterator<Item = PoolId>) -> Option<PoolId> {
    pool_for_hold_in(
        &s.holds,
        (s.cfg.holds_per_pool, s.cfg.gang_holds_per_pool),
        id,
        gang,
        scope,
    )
}

/// [`pool_for_hold`] over `holds` with the limits `(holds_per_pool, gang_holds_per_pool)`.
fn pool_for_hold_in(
    holds: &[super::Hold],
    (per_pool, gang_per_pool): (usize, Option<usize>),
    id: u64,
    gang: bool,
    mut scope: impl Iterator<Item = PoolId>,
) -> Option<PoolId> {
    if holds.iter().any(|h| h.job == id) {
        return None;
    }
    // Gangs' holds are counted apart when they have a limit of their own.
    let (limit, apart) = match gang_per_pool {
        Some(g) if gang => (g, true),
        Some(_) => (per_pool, true),
        None => (per_pool, false),
    };
    scope.find(|&p| {
        holds
            .iter()
            .filter(|h| h.pool == p && (!apart || h.gang == gang))
            .count()
            < limit
    })
}

/// The lease end of each running workload the scheduler knows at `now` (`now` for work being
/// stopped; `None`: no end, or not running).
fn ends_of(s: &Scheduler, now: i64) -> impl Fn(u64) -> Option<i64> + '_ {
    move |owner| {
        s.running
            .get(&owner)
            .and_then(|r| if r.stopping { Some(now) } else { r.ends_at_ms })
    }
}

/// The hold of `k` nodes with `per` GPUs free each, the last `last` (`shares`: a gang's
/// remainder share, 12 = 8 + 4; `per` otherwise) in `pool` for job `id` (which waited
/// past the backfill window and runs `duration_ms` once placed; [`pool_for_hold`] chose the
/// pool): in one rack, the one where the `k`-th node frees soonest by the lease ends of the
/// work running there (then the one with the most free GPUs), else the soonest nodes across
/// racks. Nodes held for others are not eligible, but with `stack` (`Some(upto)`: stacked,
/// [`GovernConfig::gang_holds_stack`](super::GovernConfig::gang_holds_stack)) those of holds
/// (not of backfill reservations or preemptors): there a node frees once no window of the holds
/// `s.holds[..upto]` overlaps the job's own ([`stack_on`]).
#[allow(clippy::too_many_arguments)]
fn plan_hold(
    s: &Scheduler,
    id: u64,
    shares: (u32, usize, u32),
    duration_ms: Option<i64>,
    stack: Option<usize>,
    allows_model: &dyn Fn(tessera_model::ModelId) -> bool,
    pool: PoolId,
    now: i64,
) -> Option<Hold> {
    // Eligible nodes: an allowed model, enough GPUs for a share, not held for anyone else
    // (stacked: not reserved or nominated for anyone else; holds have windows).
    let held = match stack {
        Some(_) => s.held_for(id, |_| false),
        None => s.held_for_others(id),
    };
    let end_of = ends_of(s, now);
    let on = HoldsOn {
        engine: &s.engine,
        holds: &s.holds,
        end_of: &end_of,
    };
    on.plan(id, shares, duration_ms, stack, allows_model, &held, pool, now)
}

/// Where gang `g` (job `job`, holding no nodes) would hold nodes if it took its hold at `at`
/// ([`hold_for_gang`], behind every hold taken): the pool and the nodes, without taking them;
/// `None` where no pool of `scope` has room for another hold or no nodes fit. For the reason
/// of a gang that will take capacity once it holds nodes ([`victims`](super::victims)).
pub(super) fn planned_gang_hold(
    s: &Scheduler,
    job: &Job,
    g: &GangRequest,
    scope: &[PoolId],
    at: i64,
) -> Option<(PoolId, Vec<u32>)> {
    plan_gang_hold(s, job, g, scope, at, s.holds.len()).map(|h| (h.pool, h.nodes))
}

/// When gang job `job` takes a hold once it finds no room: after waiting
/// [`GovernConfig::gang_hold_after_ms`](super::GovernConfig), else past the backfill window.
pub(super) fn gang_hold_due(s: &Scheduler, job: &Job) -> i64 {
    job.submitted_ms
        + match s.cfg.gang_hold_after_ms {
            Some(after) => after,
            None => s.cfg.backfill_max_wait_ms + 1,
        }
}

/// What a hold is computed on: the engine, the holds in the order they were taken, and when
/// each running workload ends by its lease (`None`: no end known). The scheduler's own, or the
/// copy a dry run asks ([`HoldBook`](super::HoldBook)).
struct HoldsOn<'a> {
    engine: &'a crate::engine::Engine,
    holds: &'a [super::Hold],
    end_of: &'a dyn Fn(u64) -> Option<i64>,
}

impl HoldsOn<'_> {
    /// The hold [`plan_hold`] takes for job `id`, with `held` the nodes it may not use.
    #[allow(clippy::too_many_arguments)]
    fn plan(
        &self,
        id: u64,
        (per, k, last): (u32, usize, u32),
        duration_ms: Option<i64>,
        stack: Option<usize>,
        allows_model: &dyn Fn(tessera_model::ModelId) -> bool,
        held: &FxHashSet<u32>,
        pool: PoolId,
        now: i64,
    ) -> Option<Hold> {
        let fleet = self.engine.fleet().clone();
        let st = self.engine.state();
        let range = fleet.pool(pool).nodes.clone();
        let windows = match stack {
            Some(upto) => windows_in(self.holds, id, upto, now),
            None => FxHashMap::default(),
        };
        let d = duration_ms.unwrap_or(i64::MAX);
        if per == 0 || k == 0 {
            return None;
        }
        let rack = |n: u32| fleet.levels.domain_of(0, tessera_model::NodeId(n)).unwrap_or(u32::MAX);
        // Per rack, its eligible nodes as (when a share fits there, free GPUs, node, when the
        // remainder share fits there), soonest first, then fullest free: `i64::MAX` when the work
        // it waits for has no end.
        type Eligible = (i64, u32, u32, i64);
        let mut by_rack: std::collections::BTreeMap<u32, Vec<Eligible>> = std::collections::BTreeMap::new();
        for n in range {
            let node = &fleet.nodes[n as usize];
            if u32::from(node.gpus) < per || !allows_model(node.model) || held.contains(&n) {
                continue;
            }
            let frees = |need: u32| {
                let (at, _) = node_frees_by(self.engine, n, need, now, self.end_of).unwrap_or((i64::MAX, Vec::new()));
                match windows.get(&n) {
                    Some(w) if at != i64::MAX => stack_on(at, d, w.iter().map(|&(a, b, _)| (a, b))),
                    _ => at,
                }
            };
            let at = frees(per);
            let at_last = if last < per { frees(last) } else { at };
            by_rack
                .entry(rack(n))
                .or_default()
                .push((at, st.nodes[n as usize].free_gpus(), n, at_last));
        }
        for nodes in by_rack.values_mut() {
            nodes.sort_unstable_by_key(|&(at, free, n, _)| (at, std::cmp::Reverse(free), n));
        }
        // In a rack, the k - 1 soonest nodes for whole shares and then the one of the others
        // where the last share fits soonest (the k-th soonest when all shares are equal).
        let pick_k = |v: &[Eligible]| -> Vec<Eligible> {
            let mut out: Vec<Eligible> = v.iter().take(k - 1).copied().collect();
            if let Some(r) = v[k - 1..]
                .iter()
                .min_by_key(|&&(_, free, n, at_last)| (at_last, std::cmp::Reverse(free), n))
            {
                out.push(*r);
            }
            out
        };
        let start_of = |c: &[Eligible]| {
            let whole = c[..k - 1].iter().map(|e| e.0).max().unwrap_or(i64::MIN);
            whole.max(c[k - 1].3)
        };
        // A rack where the gang starts soonest, then with the most free.
        let one_rack = by_rack
            .values()
            .filter(|v| v.len() >= k)
            .map(|v| pick_k(v))
            .max_by_key(|c| {
                (
                    std::cmp::Reverse(start_of(c)),
                    c.iter().map(|e| e.1).sum::<u32>(),
                    std::cmp::Reverse(c.iter().map(|e| e.2).min()),
                )
            });
        let nodes: Vec<u32> = match one_rack {
            Some(c) => c.iter().map(|e| e.2).collect(),
            None => {
                let mut racks: Vec<&Vec<Eligible>> = by_rack.values().collect();
                racks.sort_by_key(|v| {
                    (
                        std::cmp::Reverse(v.iter().map(|e| e.1).sum::<u32>()),
                        v.iter().map(|e| e.2).min(),
                    )
                });
                racks.into_iter().flatten().take(k).map(|e| e.2).collect()
            }
        };
        if nodes.len() != k {
            return None;
        }
        let (starts_at_ms, ending) = match stack {
            Some(_) => self.stacked_start(&nodes, (per, last), duration_ms, now, &windows),
            None => self.start_on(&nodes, (per, last), now),
        };
        Some(super::Hold {
            job: id,
            pool,
            nodes,
            per_node: per,
            last,
            starts_at_ms,
            ending,
            gang: false,
            duration_ms,
        })
    }

    /// [`Self::start_on`] stacked behind `windows` ([`windows_in`]): the soonest time from
    /// when the running work on `nodes` frees `per_node` GPUs each at which the job (running
    /// `duration_ms`) overlaps no window on any of them; the workloads it waits for are the
    /// running ones and the holders of the windows that end by then on its nodes.
    fn stacked_start(
        &self,
        nodes: &[u32],
        per_node: (u32, u32),
        duration_ms: Option<i64>,
        now: i64,
        windows: &Windows,
    ) -> (Option<i64>, usize) {
        let (start, ending) = self.start_on(nodes, per_node, now);
        let Some(at) = start else {
            return (None, ending);
        };
        let on = || nodes.iter().filter_map(|n| windows.get(n)).flatten();
        let t = stack_on(at, duration_ms.unwrap_or(i64::MAX), on().map(|&(a, b, _)| (a, b)));
        if t == i64::MAX {
            return (None, ending);
        }
        let mut ahead: Vec<u64> = on().filter(|&&(_, b, _)| b <= t).map(|&(_, _, j)| j).collect();
        ahead.sort_unstable();
        ahead.dedup();
        (Some(t), ending + ahead.len())
    }

    /// The start of the hold `self.holds[i]` at `now` and the workloads it waits for:
    /// [`Self::start_on`] its nodes, stacked (`stack`,
    /// [`GovernConfig::gang_holds_stack`](super::GovernConfig::gang_holds_stack)) behind the
    /// holds before it.
    fn hold_start(&self, i: usize, stack: bool, now: i64) -> (Option<i64>, usize) {
        let h = &self.holds[i];
        if stack {
            let w = windows_in(self.holds, h.job, i, now);
            self.stacked_start(&h.nodes, (h.per_node, h.last), h.duration_ms, now, &w)
        } else {
            self.start_on(&h.nodes, (h.per_node, h.last), now)
        }
    }

    /// When `per_node` GPUs (`(each, last)`: `last` on the last node, a gang's remainder
    /// share) are free on each of `nodes`, by the lease ends of the work running there, and
    /// how many workloads must end for it: a GPU is free once every workload holding it has
    /// ended (at once if it is free now; soon, at `now`, if those are all being stopped); on
    /// each node the `per_node` GPUs that free first are the ones waited for; the latest node
    /// decides. `None` if one of them waits for work with no end (or work the scheduler does
    /// not know). Never before `now`.
    fn start_on(&self, nodes: &[u32], (per_node, last): (u32, u32), now: i64) -> (Option<i64>, usize) {
        let mut start = Some(now);
        let mut ending: FxHashSet<u64> = FxHashSet::default();
        for (i, &n) in nodes.iter().enumerate() {
            let need = if i + 1 == nodes.len() { last } else { per_node };
            let Some((at, owners)) = node_frees_by(self.engine, n, need, now, self.end_of) else {
                return (None, 0);
            };
            start = match (start, at) {
                (_, i64::MAX) | (None, _) => None,
                (Some(t), at) => Some(t.max(at)),
            };
            ending.extend(owners);
        }
        (start, ending.len())
    }

    /// Computes every hold's start again at `now`, in order (a stacked hold's start follows
    /// the windows of the holds before it).
    fn refresh(
        holds: &mut [super::Hold],
        engine: &crate::engine::Engine,
        end_of: &dyn Fn(u64) -> Option<i64>,
        stack: bool,
        now: i64,
    ) {
        for i in 0..holds.len() {
            let on = HoldsOn { engine, holds, end_of };
            let (starts_at_ms, ending) = on.hold_start(i, stack, now);
            let h = &mut holds[i];
            h.starts_at_ms = starts_at_ms;
            h.ending = ending;
        }
    }
}

/// The windows of the holds `holds[..upto]` other than job `id`'s, by node: `(start, end,
/// holder)` ([`Hold::window`](super::Hold)).
type Windows = FxHashMap<u32, Vec<(i64, i64, u64)>>;

fn windows_in(holds: &[super::Hold], id: u64, upto: usize, now: i64) -> Windows {
    let mut w: Windows = FxHashMap::default();
    for h in holds[..upto.min(holds.len())].iter().filter(|h| h.job != id) {
        let (a, b) = h.window(now);
        for &n in &h.nodes {
            w.entry(n).or_default().push((a, b, h.job));
        }
    }
    w
}

/// The soonest time from `at` when work of `duration` (`i64::MAX`: no end) overlaps none of
/// `windows` (`(start, end)`, half-open): before a window (ending by its start) or after it;
/// `i64::MAX` if there is none.
pub(super) fn stack_on(at: i64, duration: i64, windows: impl Iterator<Item = (i64, i64)> + Clone) -> i64 {
    let mut t = at;
    loop {
        let mut moved = false;
        for (a, b) in windows.clone() {
            if t < b && a < t.saturating_add(duration) {
                t = b;
                moved = true;
            }
        }
        if !moved || t == i64::MAX {
            return t;
        }
    }
}

/// The start of the hold `s.holds[i]` at `now` and the workloads it waits for
/// ([`HoldsOn::hold_start`]).
fn hold_start(s: &Scheduler, i: usize, now: i64) -> (Option<i64>, usize) {
    let end_of = ends_of(s, now);
    let on = HoldsOn {
        engine: &s.engine,
        holds: &s.holds,
        end_of: &end_of,
    };
    on.hold_start(i, s.cfg.gang_holds_stack, now)
}

/// The reason of job `id`, which waits for `now_reason`, when it holds nodes: when and where
/// it starts. Work placed since the holds were refreshed ends by the start: only the count of
/// workloads it waits for may have changed, so that is computed again here.
fn held_reason(s: &mut Scheduler, id: u64, now_reason: &Wait, now: i64) -> Option<Wait> {
    let i = s.holds.iter().position(|h| h.job == id)?;
    let nodes = s.holds[i].nodes.clone();
    let (starts_at_ms, ending) = hold_start(s, i, now);
    let h = &mut s.holds[i];
    h.starts_at_ms = starts_at_ms;
    h.ending = ending;
    Some(Wait::GangHeld {
        now: Box::new(now_reason.clone()),
        nodes: nodes.len(),
        racks: racks_of(s.engine.fleet(), &nodes),
        starts_at_ms,
        ending,
    })
}

/// GPUs per node-share of gang `g` in `pool` (its own, else the pool's largest node: whole
/// nodes), how many shares it has and the GPUs of its last (the remainder of whole nodes,
/// 12 = 8 + 4; else the same); `None` for a pool without GPUs.
fn shares_in(fleet: &tessera_model::Fleet, pool: PoolId, g: &GangRequest) -> Option<(u8, usize, u32)> {
    let per = g.gpus_per_node.unwrap_or_else(|| {
        fleet
            .pool(pool)
            .nodes
            .clone()
            .map(|n| fleet.nodes[n as usize].gpus)
            .max()
            .unwrap_or(0)
    });
    (per > 0).then(|| {
        let last = match g.remainder_gpus(per) {
            0 => u32::from(per),
            r => r,
        };
        (per, g.gpus.div_ceil(u32::from(per)) as usize, last)
    })
}

/// Job `id` was placed: its hold goes, and with
/// [`GovernConfig::gang_holds_stack`](super::GovernConfig::gang_holds_stack) the holds stacked
/// behind it start again by the work now running (its own, by its duration, where it ran
/// instead of its window).
fn drop_hold(s: &mut Scheduler, id: u64, now: i64) {
    let before = s.holds.len();
    s.holds.retain(|h| h.job != id);
    if s.cfg.gang_holds_stack && s.holds.len() != before {
        refresh_holds(s, now);
    }
}

/// Computes every reservation's start again at `now`.
fn refresh_holds(s: &mut Scheduler, now: i64) {
    if s.holds.is_empty() {
        return;
    }
    let mut holds = std::mem::take(&mut s.holds);
    {
        let end_of = ends_of(s, now);
        HoldsOn::refresh(&mut holds, &s.engine, &end_of, s.cfg.gang_holds_stack, now);
    }
    s.holds = holds;
}

/// When `per_node` GPUs of node `n` are free (never before `now`; `i64::MAX`: not known, some
/// work it waits for has no end) and the running workloads that must end for it, with the end
/// of each running workload from `end_of` (`None`: no end known); `None` if the node has fewer
/// GPUs.
fn node_frees_by(
    engine: &crate::engine::Engine,
    n: u32,
    per_node: u32,
    now: i64,
    end_of: &dyn Fn(u64) -> Option<i64>,
) -> Option<(i64, Vec<u64>)> {
    let node = engine.state().nodes.get(n as usize)?;
    if node.gpus.len() < per_node as usize {
        return None;
    }
    // Per GPU: when it frees, and who holds it.
    let mut gpus: Vec<(i64, Vec<u64>)> = node
        .gpus
        .iter()
        .map(|gpu| {
            let mut at = now;
            let mut owners = Vec::new();
            for &a in &gpu.holders {
                let owner = holder_owner(engine, a);
                let end = end_of(owner).map(|e| e.max(now));
                at = at.max(end.unwrap_or(i64::MAX));
                if !owners.contains(&owner) {
                    owners.push(owner);
                }
            }
            (at, owners)
        })
        .collect();
    gpus.sort_by_key(|(at, _)| *at);
    let chosen = &gpus[..per_node as usize];
    let at = chosen.iter().map(|(at, _)| *at).max().unwrap_or(now);
    let mut owners: Vec<u64> = chosen.iter().flat_map(|(_, o)| o.iter().copied()).collect();
    owners.sort_unstable();
    owners.dedup();
    Some((at, owners))
}

/// The running workload an allocation of the engine belongs to: a gang's node-share, a moved
/// service's replacement (booked for the service, which it continues), or the workload itself.
pub fn holder_owner(engine: &crate::engine::Engine, a: crate::state::AllocId) -> u64 {
    if a & crate::engine::SHARE_BIT != 0 {
        let gang = (a & !crate::engine::SHARE_BIT) >> 16;
        if engine.gang(gang).is_some_and(|g| g.shares.contains(&a)) {
            return gang;
        }
        return a & !super::consolidate::REPLACEMENT;
    }
    a
}

/// When a gang that cannot be placed now would start if it waited: where it would hold nodes
/// and by when enough of the work running there will have ended ([`estimate_gang_start`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GangStart {
    pub pool: PoolId,
    /// About when (ms since the epoch); `None`: some of the work it waits for has no end.
    pub starts_at_ms: Option<i64>,
    /// How many running workloads must end first.
    pub ending: usize,
    /// The racks of the nodes it would wait for (empty on a fleet without racks).
    pub racks: Vec<String>,
}

/// Where and when gang `g` would start on `engine`'s fleet at `now` if it waited, by the ends
/// of the running work (`end_of(workload)`: when it ends, `None` when no end is known), with
/// the rule a waiting gang holds nodes by: in each pool of `pools`, the nodes with enough GPUs
/// for a share, in the rack where `k` of them free soonest (else the soonest nodes across
/// racks); the soonest pool wins. `None` when no pool has enough such nodes. Read-only, and
/// blind to the holds of the gangs already waiting: the dry run asks
/// [`HoldBook::gang_start`](super::HoldBook::gang_start), which plans behind them.
pub fn estimate_gang_start(
    engine: &crate::engine::Engine,
    g: &GangRequest,
    pools: &[PoolId],
    now: i64,
    end_of: &dyn Fn(u64) -> Option<i64>,
) -> Option<GangStart> {
    let fleet = engine.fleet().clone();
    let mut best: Option<(i64, GangStart)> = None;
    for &pool in pools {
        let range = fleet.pool(pool).nodes.clone();
        let Some((per, k, last)) = shares_in(&fleet, pool, g) else {
            continue;
        };
        let rack = |n: u32| fleet.levels.domain_of(0, tessera_model::NodeId(n));
        // Per rack: (when a share fits, node, the workloads it waits for), soonest first; each
        // with the same for the remainder share (`last` GPUs).
        type Frees = ((i64, u32, Vec<u64>), (i64, u32, Vec<u64>));
        let mut by_rack: std::collections::BTreeMap<Option<u32>, Vec<Frees>> = std::collections::BTreeMap::new();
        for n in range {
            let node = &fleet.nodes[n as usize];
            if node.gpus < per || !g.allows_model(node.model) {
                continue;
            }
            if let Some((at, owners)) = node_frees_by(engine, n, u32::from(per), now, end_of) {
                let rem = if last < u32::from(per) {
                    node_frees_by(engine, n, last, now, end_of).map_or((i64::MAX, n, Vec::new()), |(a, o)| (a, n, o))
                } else {
                    (at, n, owners.clone())
                };
                by_rack.entry(rack(n)).or_default().push(((at, n, owners), rem));
            }
        }
        for v in by_rack.values_mut() {
            v.sort_by_key(|((at, n, _), _)| (*at, *n));
        }
        // In a rack: the k - 1 soonest for whole shares, then the soonest of the others for
        // the last share.
        let pick_k = |v: &[Frees]| -> Vec<(i64, u32, Vec<u64>)> {
            let mut out: Vec<(i64, u32, Vec<u64>)> = v[..k - 1].iter().map(|(w, _)| w.clone()).collect();
            let r = v[k - 1..]
                .iter()
                .map(|(_, r)| r)
                .min_by_key(|(at, n, _)| (*at, *n))
                .expect("k nodes");
            out.push(r.clone());
            out
        };
        let at_of = |c: &[(i64, u32, Vec<u64>)]| c.iter().map(|(at, _, _)| *at).max().unwrap_or(now);
        let chosen: Vec<(i64, u32, Vec<u64>)> = match by_rack
            .values()
            .filter(|v| v.len() >= k)
            .map(|v| pick_k(v))
            .min_by_key(|c| at_of(c))
        {
            Some(c) => c,
            None => {
                let mut all: Vec<&Frees> = by_rack.values().flatten().collect();
                all.sort_by_key(|((at, n, _), _)| (*at, *n));
                all.into_iter().take(k).map(|(w, _)| w.clone()).collect()
            }
        };
        if chosen.len() < k {
            continue;
        }
        let at = at_of(&chosen);
        let mut ending: Vec<u64> = chosen.iter().flat_map(|(_, _, o)| o.iter().copied()).collect();
        ending.sort_unstable();
        ending.dedup();
        let nodes: Vec<u32> = chosen.iter().map(|(_, n, _)| *n).collect();
        let start = GangStart {
            pool,
            starts_at_ms: (at != i64::MAX).then_some(at),
            ending: ending.len(),
            racks: racks_of(&fleet, &nodes),
        };
        if best.as_ref().is_none_or(|(b, _)| at < *b) {
            best = Some((at, start));
        }
    }
    best.map(|(_, s)| s)
}

impl super::HoldBook {
    /// Where and about when gang `g` (running `duration_ms` once placed) would start if it
    /// were submitted at `now` and found no room: the hold it would take, by the scheduler's
    /// own rule and after every hold taken before it ([`plan_hold`]: stacked behind them in
    /// time with [`GovernConfig::gang_holds_stack`](super::GovernConfig::gang_holds_stack),
    /// else on nodes no one else holds), in the first pool of its scope with room for another
    /// hold, the holds' starts computed again at `now` first as a cycle does. `None`: no pool
    /// has room for another hold, or too few nodes are eligible. The engine is the one the book
    /// was copied with.
    pub fn gang_start(
        &self,
        engine: &crate::engine::Engine,
        g: &GangRequest,
        duration_ms: Option<i64>,
        now: i64,
    ) -> Option<GangStart> {
        // No job has this id: every hold and reservation is someone else's.
        const NEW: u64 = u64::MAX;
        let end_of = |w: u64| self.ends.get(&w).copied().flatten();
        let mut holds = self.holds.clone();
        HoldsOn::refresh(&mut holds, engine, &end_of, self.stack, now);
        let scope = engine.gang_pools(g);
        let pool = pool_for_hold_in(&holds, self.limits, NEW, true, scope.into_iter())?;
        let (per, k, last) = shares_in(engine.fleet(), pool, g)?;
        let mut held: FxHashSet<u32> = self.others.iter().copied().collect();
        if !self.stack {
            held.extend(holds.iter().flat_map(|h| h.nodes.iter().copied()));
        }
        let on = HoldsOn {
            engine,
            holds: &holds,
            end_of: &end_of,
        };
        let stack = self.stack.then_some(holds.len());
        let h = on.plan(
            NEW,
            (u32::from(per), k, last),
            duration_ms,
            stack,
            &|m| g.allows_model(m),
            &held,
            pool,
            now,
        )?;
        Some(GangStart {
            pool,
            starts_at_ms: h.starts_at_ms,
            ending: h.ending,
            racks: racks_of(engine.fleet(), &h.nodes),
        })
    }
}

/// The racks (domains of the fleet's lowest level) of `nodes`, each once, in order.
fn racks_of(fleet: &tessera_model::Fleet, nodes: &[u32]) -> Vec<String> {
    let mut racks: Vec<String> = Vec::new();
    for &n in nodes {
        if let Some(r) = fleet.levels.domain_name(0, tessera_model::NodeId(n))
            && !racks.iter().any(|x| x == r)
        {
            racks.push(r.to_string());
        }
    }
    racks
}

/// Holds one node for a head that has waited past the backfill window, if its pool has no
/// reservation yet: the node of an allowed model with the most free units, where the head
/// will fit soonest. Smaller requests keep backfilling everywhere else.
fn reserve(s: &mut Scheduler, job: &Job, pools: &[PoolId]) {
    let Some(&pool) = pools.iter().find(|p| !s.reservations.contains_key(p)) else {
        return;
    };
    if pools
        .iter()
        .any(|p| s.reservations.get(p).is_some_and(|(j, _)| *j == job.id))
    {
        return;
    }
    let fleet = s.engine.fleet().clone();
    let st = s.engine.state();
    let best = fleet
        .pool(pool)
        .nodes
        .clone()
        .filter(|&n| job.request.allows_model(fleet.nodes[n as usize].model))
        .filter(|n| !s.reservations.values().any(|(_, r)| r == n))
        .filter(|n| !s.holds.iter().any(|h| h.nodes.contains(n)))
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
        s.reservations.insert(pool, (job.id, n));
    }
}

#[cfg(test)]
mod tests {
    use super::super::Decision;
    use super::super::testing::{guarantee_half_each, job, placed, sched};
    use super::*;

    /// Jobs 0 to 15 of tenant `a`, 7 GPUs each at 0: every node has 7 of 8 GPUs busy.
    fn seven_of_eight_busy(s: &mut Scheduler) {
        for n in 0..16 {
            s.submit(job(n, "a", 7, "standard", 0), 0);
        }
    }

    /// The job of the first hold and its (first) node: the head and the node it reserved.
    fn head_and_reserved(s: &Scheduler) -> (u64, u32) {
        s.holds
            .first()
            .map(|h| (h.job, h.nodes[0]))
            .expect("the head holds a node")
    }

    /// Which of jobs 0 to 15 runs on node `node`.
    fn running_on(s: &Scheduler, node: u32) -> u64 {
        (0..16)
            .find(|id| s.engine.allocation(*id).is_some_and(|a| a.node.0 == node))
            .unwrap()
    }

    #[test]
    fn backfill_does_not_starve_the_head() {
        let mut s = sched();
        // Every node has 7 of 8 GPUs busy: the 8-GPU head cannot fit, 1-GPU jobs can.
        seven_of_eight_busy(&mut s);
        s.submit(job(100, "b", 8, "standard", 1), 1);
        let acts = s.submit(job(101, "c", 1, "standard", 2), 2);
        assert_eq!(placed(&acts), vec![101], "backfill while the head is young");
        s.release(101, 3);
        // Past the backfill window the head reserves one node; small jobs still backfill on
        // the others, never on the reserved one.
        let late = 1 + s.cfg.backfill_max_wait_ms + 1;
        s.cycle(late);
        let (head, reserved) = head_and_reserved(&s);
        assert_eq!(head, 100);
        for i in 0..15 {
            let acts = s.submit(job(200 + i, "c", 1, "standard", late), late);
            let Some(Decision::Placed { alloc, .. }) = acts.iter().find(|a| matches!(a, Decision::Placed { .. }))
            else {
                panic!("small job {i} should backfill: {acts:?}")
            };
            assert_ne!(alloc.node.0, reserved, "the reserved node stays free for the head");
        }
        // The work on the reserved node ends: the head gets the node, not the small job waiting.
        let on_reserved = running_on(&s, reserved);
        s.submit(job(300, "c", 1, "standard", late + 1), late + 1);
        s.release(on_reserved, late + 2);
        let acts = s.cycle(late + 2);
        assert_eq!(placed(&acts)[0], 100, "{acts:?}");
    }

    #[test]
    fn a_waiting_job_is_reported_again_only_when_its_kind_of_reason_changes() {
        let mut s = sched();
        let waits = |acts: &[Decision]| -> Vec<Wait> {
            acts.iter()
                .filter_map(|a| match a {
                    Decision::Waiting { id: 100, reason } => Some(reason.clone()),
                    _ => None,
                })
                .collect()
        };
        // Every node has 7 of 8 GPUs busy: 16 units free, none on one node.
        seven_of_eight_busy(&mut s);
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
        guarantee_half_each(&mut s, None);
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
    fn a_reservation_holder_gets_its_node_even_behind_a_request_of_the_same_shape() {
        let mut s = sched();
        // Every node has 7 of 8 GPUs busy.
        seven_of_eight_busy(&mut s);
        s.submit(job(100, "b", 8, "standard", 1), 1);
        let late = 1 + s.cfg.backfill_max_wait_ms + 1;
        s.cycle(late);
        let (head, reserved) = head_and_reserved(&s);
        assert_eq!(head, 100);
        // A more important request of the same shape arrives; then the reserved node frees.
        s.submit(job(200, "c", 8, "high", late), late);
        let on_reserved = running_on(&s, reserved);
        s.release(on_reserved, late + 1);
        let d = s.cycle(late + 1);
        let Some(Decision::Placed { alloc, .. }) = d.iter().find(|d| matches!(d, Decision::Placed { id: 100, .. }))
        else {
            panic!("the head is placed on its node although the same shape failed before it: {d:?}")
        };
        assert_eq!(alloc.node.0, reserved);
        assert!(s.holds.is_empty(), "the reservation ends with the placement");
    }

    fn lasting(j: Job, duration_ms: i64) -> Job {
        Job {
            duration_ms: Some(duration_ms),
            ..j
        }
    }

    #[test]
    fn a_whole_gpu_head_holds_the_node_it_fits_on_soonest_and_short_work_backfills_there() {
        let h = 3_600_000;
        let mut s = sched();
        // Every node has 7 of 8 GPUs busy, by work that ends at 10 h, but on node 5 at 2 h.
        for n in 0..16u64 {
            let ends = if n == 5 { 2 * h } else { 10 * h };
            s.submit(lasting(job(n, "a", 7, "standard", 0), ends), 0);
        }
        assert_eq!(
            s.engine.allocation(5).map(|a| a.node.0),
            Some(5),
            "best fit fills node by node"
        );
        s.submit(lasting(job(100, "b", 8, "standard", 1), h), 1);
        let late = 1 + s.cfg.backfill_max_wait_ms + 1;
        let d = s.cycle(late);
        let hold = s.holds.first().cloned().expect("the head holds a node");
        assert_eq!(
            (hold.job, hold.nodes.clone(), hold.starts_at_ms),
            (100, vec![5], Some(2 * h))
        );
        let Some(Decision::Waiting { reason, .. }) = d.iter().find(|d| matches!(d, Decision::Waiting { id: 100, .. }))
        else {
            panic!("the head waits: {d:?}")
        };
        let text = reason.to_string();
        assert!(
            text.contains("; a node in rack r1 is held for it")
                && text.contains("02:00:00 UTC when 1 workload there ends"),
            "{text}"
        );
        // Every other node is full now but for the held one: 1-GPU work that ends by 2 h goes
        // there, longer work does not.
        for i in 0..15 {
            s.submit(lasting(job(200 + i, "c", 1, "standard", late), 10 * h), late);
        }
        let d = s.submit(lasting(job(300, "c", 1, "standard", late), 3 * h), late);
        assert!(
            placed(&d).is_empty(),
            "work past the start stays off the held node: {d:?}"
        );
        let d = s.submit(lasting(job(301, "c", 1, "standard", late), h), late);
        assert_eq!(placed(&d), vec![301], "short work backfills the held node");
        assert_eq!(s.engine.allocation(301).map(|a| a.node.0), Some(5));
        // The work there ends by its lease: the head starts there, on time.
        s.release(5, 2 * h);
        s.release(301, 2 * h);
        let d = s.cycle(2 * h);
        assert_eq!(placed(&d), vec![100], "{d:?}");
        assert_eq!(s.engine.allocation(100).map(|a| a.node.0), Some(5));
    }

    #[test]
    fn short_work_that_fits_elsewhere_stays_off_a_held_node() {
        let h = 3_600_000;
        let mut s = sched();
        // Node 5 has 7 of 8 GPUs busy until 2 h; every other node 6 of 8 until 10 h.
        for n in 0..16u64 {
            let (gpus, ends) = if n == 5 { (7, 2 * h) } else { (6, 10 * h) };
            s.submit(lasting(job(n, "a", gpus, "standard", 0), ends), 0);
            assert_eq!(s.engine.allocation(n).map(|a| a.node.0), Some(n as u32));
        }
        // The 8-GPU head holds node 5, where it fits soonest (2 h).
        s.submit(lasting(job(100, "b", 8, "standard", 1), h), 1);
        let late = 1 + s.cfg.backfill_max_wait_ms + 1;
        s.cycle(late);
        let hold = s.holds.first().cloned().expect("the head holds a node");
        assert_eq!(
            (hold.job, hold.nodes.clone(), hold.starts_at_ms),
            (100, vec![5], Some(2 * h))
        );
        // 1-GPU work of 1 h ends before the hold starts, so it may backfill node 5, the best
        // fit (1 GPU free there, 2 elsewhere); it goes on a node no one holds instead.
        let d = s.submit(lasting(job(300, "c", 1, "standard", late), h), late);
        assert_eq!(placed(&d), vec![300]);
        let node = s.engine.allocation(300).map(|a| a.node.0).expect("placed");
        assert_ne!(node, 5, "kept off the held node");
        // When node 5's work ends sooner than its lease said (at 1 h), the head starts at once.
        s.release(5, h);
        let d = s.cycle(h);
        assert_eq!(placed(&d), vec![100], "{d:?}");
        assert_eq!(s.engine.allocation(100).map(|a| a.node.0), Some(5));
    }

    #[test]
    fn a_pool_takes_as_many_holds_as_it_allows_on_distinct_nodes() {
        let h = 3_600_000;
        for (allowed, holders) in [(1, vec![100]), (2, vec![100, 101]), (4, vec![100, 101, 102])] {
            let mut s = sched();
            s.cfg.holds_per_pool = allowed;
            for n in 0..16u64 {
                s.submit(lasting(job(n, "a", 7, "standard", 0), (n as i64 + 1) * h), 0);
            }
            for id in 100..103 {
                s.submit(lasting(job(id, "b", 8, "standard", 1), h), 1);
            }
            s.cycle(1 + s.cfg.backfill_max_wait_ms + 1);
            let held: Vec<(u64, Vec<u32>)> = s.holds.iter().map(|h| (h.job, h.nodes.clone())).collect();
            assert_eq!(held.iter().map(|(j, _)| *j).collect::<Vec<_>>(), holders, "{held:?}");
            // In queue order, each on the node that frees soonest of those left.
            for (i, (_, nodes)) in held.iter().enumerate() {
                assert_eq!(nodes, &vec![i as u32], "{held:?}");
            }
        }
    }
}
