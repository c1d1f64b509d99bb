//! The cycle with multi-node gangs: placed whole through the engine, counted whole against
//! quotas, refused at once when no domain of their level could hold them, waiting with the
//! level's reason, taken whole as victims, released whole.

use tessera_model::request::{GangRequest, TopologyConstraint};
use tessera_model::{GpuUnits, PoolId};

use super::testing::{job, placed, preempted, sched};
use super::*;
use crate::reason::{GangUnplaceable, PreemptCause};

/// A gang of `gpus` whole GPUs as whole nodes of the seed's training pool (4 racks of 4
/// nodes of 8 H100s), required within one rack when `rack`.
fn gang(id: u64, tenant: &str, gpus: u32, rack: bool, prio: &str, now: i64) -> Job {
    let mut g = GangRequest::whole_nodes(gpus).with_pool(PoolId(0));
    if rack {
        g = g.with_topology(TopologyConstraint::required("rack"));
    }
    Job {
        gang: Some(g),
        ..job(id, tenant, 8, prio, now)
    }
}

fn placed_gang(d: &[Decision]) -> Option<(u64, Vec<Allocation>)> {
    d.iter().find_map(|x| match x {
        Decision::PlacedGang { id, shares, .. } => Some((*id, shares.clone())),
        _ => None,
    })
}

fn rack_of(s: &Scheduler, a: &Allocation) -> String {
    let fleet = s.engine.fleet();
    fleet.levels.domain_name(0, a.node).unwrap_or_default().to_string()
}

#[test]
fn a_gang_is_placed_whole_in_one_rack_counted_whole_and_released_whole() {
    let mut s = sched();
    let d = s.submit(gang(1, "a", 32, true, "standard", 0), 0);
    let (id, shares) = placed_gang(&d).unwrap_or_else(|| panic!("{d:?}"));
    assert_eq!(id, 1);
    assert_eq!(shares.len(), 4);
    let racks: std::collections::BTreeSet<String> = shares.iter().map(|a| rack_of(&s, a)).collect();
    assert_eq!(racks.len(), 1, "one rack: {racks:?}");
    let mut nodes: Vec<u32> = shares.iter().map(|a| a.node.0).collect();
    nodes.dedup();
    assert_eq!(nodes.len(), 4, "distinct nodes");
    assert_eq!(s.held("a", "training"), GpuUnits::whole(32));
    assert_eq!(s.engine.state().allocations.len(), 4);
    let r = s.running().find(|r| r.id == 1).unwrap();
    assert_eq!(r.nodes().count(), 4);
    assert!(s.release(1, 1_000).is_some());
    assert_eq!(s.held("a", "training"), GpuUnits::ZERO);
    assert!(s.engine.state().allocations.is_empty(), "every share returned");
    assert!(s.engine.gang(1).is_none());
}

#[test]
fn a_gang_beyond_every_rack_is_refused_at_once_naming_the_level() {
    let mut s = sched();
    let d = s.submit(gang(1, "a", 64, true, "standard", 0), 0);
    let Decision::Refused {
        reason: Refusal::Gang(u @ GangUnplaceable::BeyondLevel { .. }),
        ..
    } = &d[0]
    else {
        panic!("{d:?}")
    };
    assert_eq!(u.level(), Some("rack"));
    assert!(u.to_string().contains("could hold at most 32"), "{u}");
    // Beyond the whole pool without a constraint.
    let d = s.submit(gang(2, "a", 256, false, "standard", 0), 0);
    assert!(
        matches!(
            &d[0],
            Decision::Refused {
                reason: Refusal::Gang(_),
                ..
            }
        ),
        "{d:?}"
    );
    assert_eq!(s.queued(), 0);
}

#[test]
fn a_gang_waits_with_the_levels_reason_until_a_rack_frees() {
    let mut s = sched();
    // One 8-GPU job in each rack: no rack has 4 free nodes.
    let mut singles = Vec::new();
    for i in 0..16 {
        let d = s.submit(job(100 + i, "b", 8, "standard", 0), 0);
        assert_eq!(placed(&d), vec![100 + i]);
        singles.push(100 + i);
    }
    // Free three nodes in each rack.
    for &id in &singles {
        let a = s.engine.allocation(id).unwrap().clone();
        let keep = s
            .running()
            .filter(|r| r.id != id)
            .any(|r| rack_of(&s, s.engine.allocation(r.id).unwrap()) == rack_of(&s, &a) && r.id < id);
        if keep {
            s.release(id, 10);
        }
    }
    assert_eq!(s.running().count(), 4, "one job left per rack");
    let d = s.submit(gang(1, "a", 32, true, "standard", 20), 20);
    let Some(Decision::Waiting {
        reason: Wait::Gang(u), ..
    }) = d.first()
    else {
        panic!("{d:?}")
    };
    assert_eq!(u.code(), "fragmentation");
    assert!(
        u.to_string()
            .contains("no rack of pool training has room now (the most, 24"),
        "{u}"
    );
    assert_eq!(s.queued(), 1);
    // A preferred gang of the same size goes over two racks meanwhile.
    let d = s.submit(gang(2, "a", 32, false, "standard", 30), 30);
    let (_, shares) = placed_gang(&d).unwrap_or_else(|| panic!("{d:?}"));
    let racks: std::collections::BTreeSet<String> = shares.iter().map(|a| rack_of(&s, a)).collect();
    assert_eq!(racks.len(), 2);
    s.release(2, 40);
    // The job of one rack ends: the required gang takes that rack.
    let r0 = s.running().find(|r| r.gang_nodes.is_empty()).unwrap().id;
    let freed = rack_of(&s, s.engine.allocation(r0).unwrap());
    s.release(r0, 50);
    let d = s.cycle(60);
    let (id, shares) = placed_gang(&d).unwrap_or_else(|| panic!("{d:?}"));
    assert_eq!(id, 1);
    assert!(shares.iter().all(|a| rack_of(&s, a) == freed));
}

#[test]
fn quotas_count_the_whole_gang() {
    let mut s = sched();
    s.set_quota(
        "a",
        "training",
        Some(Quota {
            guaranteed: GpuUnits::whole(16),
            limit: Some(GpuUnits::whole(24)),
        }),
    );
    let d = s.submit(gang(1, "a", 32, false, "standard", 0), 0);
    let Some(Decision::Waiting {
        reason: Wait::Limit(l), ..
    }) = d.first()
    else {
        panic!("{d:?}")
    };
    assert_eq!(l.needs, GpuUnits::whole(32));
    assert!(s.engine.state().allocations.is_empty(), "nothing of it was booked");
    // 24 fit under the limit, borrowing above the guarantee.
    let d = s.submit(gang(2, "a", 24, false, "standard", 0), 0);
    assert!(placed_gang(&d).is_some(), "{d:?}");
    assert_eq!(s.is_borrowing(2), Some(true));
    assert_eq!(s.held("a", "training"), GpuUnits::whole(24));
}

#[test]
fn a_lower_priority_gang_is_preempted_whole_for_higher_priority_work() {
    let mut s = sched();
    let d = s.submit(gang(1, "a", 128, false, "opportunistic", 0), 0);
    assert!(placed_gang(&d).is_some(), "the whole pool: {d:?}");
    let d = s.submit(job(2, "b", 8, "critical", 70_000), 70_000);
    assert_eq!(preempted(&d), vec![1], "{d:?}");
    // Still stopping: nothing is placed yet, and the gang is not taken twice.
    assert!(placed(&s.cycle(70_001)).is_empty());
    s.release(1, 70_002);
    assert!(s.engine.state().allocations.is_empty());
    assert_eq!(placed(&s.cycle(70_003)), vec![2]);
}

#[test]
fn a_gang_restored_at_start_up_holds_every_share() {
    let mut s = sched();
    let d = s.submit(gang(1, "a", 16, true, "standard", 0), 0);
    let (_, shares) = placed_gang(&d).unwrap();
    let pool = s.engine.gang(1).unwrap().pool;
    let mut t = sched();
    t.restore_gang(&gang(1, "a", 16, true, "standard", 0), pool, shares.clone(), false, 0)
        .unwrap();
    assert_eq!(t.held("a", "training"), GpuUnits::whole(16));
    assert_eq!(t.running().find(|r| r.id == 1).unwrap().nodes().count(), 2);
    // A second restore of the same shares is refused and changes nothing.
    assert!(
        t.restore_gang(&gang(1, "a", 16, true, "standard", 0), pool, shares, false, 0)
            .is_err()
    );
    assert_eq!(t.held("a", "training"), GpuUnits::whole(16));
}

#[test]
fn a_gang_that_waited_past_the_backfill_window_holds_a_rack_until_it_fits() {
    let mut s = sched();
    let window = s.cfg.backfill_max_wait_ms;
    // One 8-GPU job on every node: the pool is full.
    for i in 0..16 {
        assert_eq!(placed(&s.submit(job(100 + i, "b", 8, "standard", 0), 0)), vec![100 + i]);
    }
    let d = s.submit(gang(1, "a", 32, true, "standard", 0), 0);
    assert!(
        matches!(
            d.first(),
            Some(Decision::Waiting {
                reason: Wait::Gang(_),
                ..
            })
        ),
        "{d:?}"
    );
    // Within the window, freed nodes go to whoever is next: small work backfills.
    let first = s.running().find(|r| r.id == 100).unwrap().node;
    s.release(100, 10);
    let d = s.submit(job(200, "b", 8, "standard", 10), 10);
    assert_eq!(placed(&d), vec![200], "{d:?}");
    assert_eq!(s.running().find(|r| r.id == 200).unwrap().node, first);
    // Past the window the gang holds 4 nodes of one rack.
    let d = s.cycle(window + 1);
    let Some(Decision::Waiting {
        reason: reason @ Wait::GangHeld { nodes: 4, racks, .. },
        ..
    }) = d.iter().find(|x| matches!(x, Decision::Waiting { id: 1, .. }))
    else {
        panic!("{d:?}")
    };
    assert_eq!(racks.len(), 1, "{reason}");
    assert!(reason.to_string().contains("4 nodes in rack"), "{reason}");
    let held: Vec<u32> = s.holds.iter().flat_map(|h| h.nodes.clone()).collect();
    assert_eq!(held.len(), 4);
    // Work on a held node ends: no other request may take it, the gang keeps waiting.
    let on_held: Vec<u64> = s.running().filter(|r| held.contains(&r.node.0)).map(|r| r.id).collect();
    assert_eq!(on_held.len(), 4);
    s.release(on_held[0], window + 2);
    let d = s.submit(job(300, "b", 8, "standard", window + 2), window + 2);
    assert!(placed(&d).is_empty(), "a held node takes no other work: {d:?}");
    // Once all four are free, the gang starts there.
    for &id in &on_held[1..] {
        s.release(id, window + 3);
    }
    let d = s.cycle(window + 4);
    let (id, shares) = placed_gang(&d).unwrap_or_else(|| panic!("{d:?}"));
    assert_eq!(id, 1);
    let mut nodes: Vec<u32> = shares.iter().map(|a| a.node.0).collect();
    nodes.sort_unstable();
    let mut want = held.clone();
    want.sort_unstable();
    assert_eq!(nodes, want);
    assert!(s.holds.is_empty(), "the hold ends with the placement");
}

/// `j` with a requested duration.
fn lasting(j: Job, duration_ms: Option<i64>) -> Job {
    Job { duration_ms, ..j }
}

/// The waiting reason of job `id` among `d`.
fn wait_of(d: &[Decision], id: u64) -> Option<Wait> {
    d.iter().find_map(|x| match x {
        Decision::Waiting { id: i, reason } if *i == id => Some(reason.clone()),
        _ => None,
    })
}

/// The one gang hold of `s`.
fn hold(s: &Scheduler) -> Hold {
    let mut h = s.holds.iter();
    let one = h.next().expect("a gang holds nodes").clone();
    assert!(h.next().is_none());
    one
}

/// The seed's training pool with two 4-GPU jobs on every node (BestFit pairs them): pair `p`
/// (jobs `100 + 2p` and `101 + 2p`, submitted at 0) lasts `short(p)` and `long(p)` ms.
fn paired(short: impl Fn(u64) -> Option<i64>, long: impl Fn(u64) -> Option<i64>) -> Scheduler {
    let mut s = sched();
    for p in 0..16 {
        let (a, b) = (100 + 2 * p, 101 + 2 * p);
        assert_eq!(
            placed(&s.submit(lasting(job(a, "b", 4, "standard", 0), short(p)), 0)),
            vec![a]
        );
        assert_eq!(
            placed(&s.submit(lasting(job(b, "b", 4, "standard", 0), long(p)), 0)),
            vec![b]
        );
        assert_eq!(
            s.engine.allocation(a).unwrap().node,
            s.engine.allocation(b).unwrap().node,
            "a pair shares its node"
        );
    }
    s
}

/// The pairs (see [`paired`]) on the nodes held for the gang.
fn held_pairs(s: &Scheduler) -> Vec<u64> {
    let h = hold(s);
    (0..16)
        .filter(|p| h.nodes.contains(&s.engine.allocation(100 + 2 * p).unwrap().node.0))
        .collect()
}

#[test]
fn a_held_gangs_start_is_when_enough_work_on_its_nodes_has_ended() {
    let minute = 60_000;
    // Every lease ends after the backfill window.
    let short = |p: u64| Some((p as i64 + 1) * 10 * minute);
    let long = |p: u64| Some((p as i64 + 1) * 20 * minute + 7);
    let window = sched().cfg.backfill_max_wait_ms;
    // Whole nodes: both jobs of each held node must end; the node whose long job ends last
    // decides. Eight workloads end.
    let mut s = paired(short, long);
    s.submit(gang(1, "a", 32, true, "standard", 0), 0);
    let d = s.cycle(window + 1);
    let pairs = held_pairs(&s);
    assert_eq!(pairs.len(), 4);
    let want = pairs.iter().map(|&p| long(p).unwrap()).max().unwrap();
    let h = hold(&s);
    assert_eq!((h.starts_at_ms, h.ending), (Some(want), 8));
    let Some(Wait::GangHeld {
        starts_at_ms, ending, ..
    }) = wait_of(&d, 1)
    else {
        panic!("{d:?}")
    };
    assert_eq!((starts_at_ms, ending), (Some(want), 8));
    // Four GPUs per node: on each held node the short job is the one waited for.
    let mut s = paired(short, long);
    let g = GangRequest::nodes(4, 4)
        .with_pool(PoolId(0))
        .with_topology(TopologyConstraint::required("rack"));
    s.submit(
        Job {
            gang: Some(g),
            ..job(2, "a", 8, "standard", 0)
        },
        0,
    );
    s.cycle(window + 1);
    let pairs = held_pairs(&s);
    let want = pairs.iter().map(|&p| short(p).unwrap()).max().unwrap();
    let h = hold(&s);
    assert_eq!((h.starts_at_ms, h.ending), (Some(want), 4));
    // Jobs without an end on the held nodes: the whole-node gang's start is unknown.
    let mut s = paired(short, |_| None);
    s.submit(gang(3, "a", 32, true, "standard", 0), 0);
    s.cycle(window + 1);
    assert_eq!(hold(&s).starts_at_ms, None);
    // Work that overran its lease is waited for from now on.
    let mut s = paired(short, long);
    s.submit(gang(4, "a", 32, true, "standard", 0), 0);
    let late = 24 * 60 * minute;
    s.cycle(late);
    assert_eq!(hold(&s).starts_at_ms, Some(late), "never before now");
}

#[test]
fn a_held_remainder_gang_waits_for_a_whole_node_and_four_gpus_of_another() {
    let minute = 60_000;
    let short = |p: u64| Some((p as i64 + 1) * 10 * minute);
    let long = |p: u64| Some((p as i64 + 1) * 20 * minute + 7);
    let window = sched().cfg.backfill_max_wait_ms;
    // 12 GPUs = 8 + 4 in one rack: a whole node (both jobs of a pair end) and 4 GPUs of
    // another (its short job ends). Rack r0 holds pairs 0..3: pair 0's node whole, at
    // long(0) = 20 min + 7 ms, and pair 1's short job, at short(1) = 20 min; three workloads.
    // (Two whole nodes, as 12 was held before, waited for long(1) = 40 min + 7 ms and four.)
    let mut s = paired(short, long);
    let mut twelve = gang(1, "a", 12, true, "standard", 0);
    twelve.gang = twelve.gang.map(GangRequest::with_remainder);
    s.submit(twelve, 0);
    let d = s.cycle(window + 1);
    assert_eq!(held_pairs(&s), vec![0, 1]);
    let h = hold(&s);
    assert_eq!((h.per_node, h.last), (8, 4));
    assert_eq!(
        h.nodes,
        vec![
            s.engine.allocation(100).unwrap().node.0,
            s.engine.allocation(102).unwrap().node.0
        ]
    );
    assert_eq!((h.starts_at_ms, h.ending), (Some(20 * minute + 7), 3));
    let Some(Wait::GangHeld {
        starts_at_ms, ending, ..
    }) = wait_of(&d, 1)
    else {
        panic!("{d:?}")
    };
    assert_eq!((starts_at_ms, ending), (Some(20 * minute + 7), 3));
    // Once those end, it starts there: 8 on pair 0's node and 4 on pair 1's.
    s.release(100, 20 * minute);
    s.release(101, 20 * minute + 7);
    s.release(102, 20 * minute);
    let d = s.cycle(20 * minute + 7);
    let (_, shares) = placed_gang(&d).unwrap_or_else(|| panic!("{d:?}"));
    let got: Vec<(u32, GpuUnits)> = shares.iter().map(|a| (a.node.0, a.units)).collect();
    assert_eq!(
        got,
        vec![(h.nodes[0], GpuUnits::whole(8)), (h.nodes[1], GpuUnits::whole(4))]
    );
}

#[test]
fn only_work_that_ends_before_the_gang_starts_is_placed_on_its_held_nodes() {
    let hour = 3_600_000;
    let window = sched().cfg.backfill_max_wait_ms;
    // One 4-GPU job of an hour left on every node: 4 GPUs free on each, no rack whole.
    let mut s = paired(|_| Some(hour), |_| None);
    for p in 0..16 {
        s.release(101 + 2 * p, 1);
    }
    s.submit(gang(1, "a", 32, true, "standard", 2), 2);
    let now = window + 3;
    s.cycle(now);
    let h = hold(&s);
    assert_eq!((h.starts_at_ms, h.ending), (Some(hour), 4));
    // Work without an end fills every node that is not held.
    for i in 0..12 {
        assert_eq!(
            placed(&s.submit(job(200 + i, "c", 4, "standard", now), now)),
            vec![200 + i]
        );
    }
    for i in 0..12 {
        assert!(!h.nodes.contains(&s.engine.allocation(200 + i).unwrap().node.0));
    }
    // Work that would end after the gang's start, or has no end, stays off the held nodes.
    let d = s.submit(lasting(job(300, "c", 4, "standard", now), Some(hour)), now);
    assert!(placed(&d).is_empty(), "{d:?}");
    assert_eq!(wait_of(&d, 300).map(|w| w.code()), Some("held"));
    let d = s.submit(job(301, "c", 4, "standard", now), now);
    assert!(placed(&d).is_empty(), "{d:?}");
    // Work that ends by then goes there, however many of the same shape wait before it.
    let short = hour - now - 1;
    let d = s.submit(lasting(job(302, "c", 4, "standard", now), Some(short)), now);
    assert_eq!(placed(&d), vec![302], "{d:?}");
    assert!(h.nodes.contains(&s.engine.allocation(302).unwrap().node.0));
    let d = s.submit(lasting(job(303, "c", 4, "standard", now), Some(hour - now)), now);
    assert_eq!(placed(&d), vec![303], "ending exactly at the start: {d:?}");
    // The gang's start has not moved.
    let d = s.cycle(now + 1);
    assert_eq!(hold(&s).starts_at_ms, Some(hour), "{d:?}");
    // The short jobs end, then the hour's: the gang starts on its nodes, at its start.
    s.release(302, now + short);
    s.release(303, hour);
    for p in 0..16 {
        s.release(100 + 2 * p, hour);
    }
    let d = s.cycle(hour);
    let (id, shares) = placed_gang(&d).unwrap_or_else(|| panic!("{d:?}"));
    assert_eq!(id, 1);
    assert!(shares.iter().all(|a| h.nodes.contains(&a.node.0)));
}

#[test]
fn a_held_gangs_reason_says_when_and_where_it_starts() {
    let window = sched().cfg.backfill_max_wait_ms;
    // 14:20 UTC on the first day.
    let at = (14 * 60 + 20) * 60_000;
    let mut s = sched();
    for i in 0..16 {
        let j = lasting(job(100 + i, "b", 8, "standard", 0), Some(at));
        assert_eq!(placed(&s.submit(j, 0)), vec![100 + i]);
    }
    s.submit(gang(1, "a", 32, true, "standard", 0), 0);
    let d = s.cycle(window + 1);
    let reason = wait_of(&d, 1).unwrap_or_else(|| panic!("{d:?}"));
    let Wait::GangHeld { racks, .. } = &reason else {
        panic!("{reason:?}")
    };
    let text = reason.to_string();
    assert!(
        text.ends_with(&format!(
            "; 4 nodes in rack {} are held for it (it waited past the backfill window): it starts at about 1970-01-01 14:20:00 UTC when 4 workloads there end; only work that ends by then is placed there meanwhile",
            racks[0]
        )),
        "{text}"
    );
    // The same kind of reason whatever the start: no new decision when only it moves.
    let Wait::GangHeld {
        now,
        nodes,
        racks,
        ending,
        ..
    } = reason.clone()
    else {
        unreachable!()
    };
    let later = Wait::GangHeld {
        now,
        nodes,
        racks,
        starts_at_ms: None,
        ending,
    };
    assert!(reason.same_kind(&later));
    assert!(
        later
            .to_string()
            .ends_with("its start is unknown: it waits for 4 workloads there to end, and some have no end time; nothing else is placed there meanwhile"),
        "{later}"
    );
    // Work without an end: the start is unknown.
    let mut s = sched();
    for i in 0..16 {
        assert_eq!(placed(&s.submit(job(100 + i, "b", 8, "standard", 0), 0)), vec![100 + i]);
    }
    s.submit(gang(1, "a", 32, true, "standard", 0), 0);
    let d = s.cycle(window + 1);
    let text = wait_of(&d, 1).unwrap_or_else(|| panic!("{d:?}")).to_string();
    assert!(text.contains("its start is unknown"), "{text}");
}

#[test]
fn a_held_gang_preempts_only_on_its_nodes_the_cheapest_work_lost_first() {
    let window = sched().cfg.backfill_max_wait_ms;
    let mut cfg = super::testing::config();
    for c in &mut cfg.classes {
        if c.name == "high" {
            c.preempt_after_ms = Some(window + 10_000);
        }
    }
    let mut s = Scheduler::new(super::testing::engine(), cfg);
    // Two 4-GPU opportunistic jobs on every node, from time 0.
    for p in 0..16 {
        for id in [100 + 2 * p, 101 + 2 * p] {
            assert_eq!(placed(&s.submit(job(id, "b", 4, "opportunistic", 0), 0)), vec![id]);
        }
    }
    // A gang of four 4-GPU shares in one rack, of a higher class: past the window it holds
    // four nodes, and it may preempt a little later.
    let g = GangRequest::nodes(4, 4)
        .with_pool(PoolId(0))
        .with_topology(TopologyConstraint::required("rack"));
    let d = s.submit(
        Job {
            gang: Some(g),
            ..job(1, "a", 8, "high", 0)
        },
        0,
    );
    assert!(preempted(&d).is_empty(), "{d:?}");
    let d = s.cycle(window + 1);
    assert!(preempted(&d).is_empty(), "not yet: {d:?}");
    let h = hold(&s);
    // Work saved recently loses little: on the held nodes one job of each pair saved a while
    // ago; elsewhere every job saved just now (the cheapest of all, but not where the gang goes).
    let now = window + 10_001;
    let mut cheap_on_held = Vec::new();
    for p in 0..16 {
        let (a, b) = (100 + 2 * p, 101 + 2 * p);
        if h.nodes.contains(&s.engine.allocation(a).unwrap().node.0) {
            s.checkpointed(b, now - 60_000);
            cheap_on_held.push(b);
        } else {
            s.checkpointed(a, now);
            s.checkpointed(b, now);
        }
    }
    assert_eq!(cheap_on_held.len(), 4);
    let d = s.cycle(now);
    let mut victims = preempted(&d);
    victims.sort_unstable();
    assert_eq!(victims, cheap_on_held, "one victim per held node, the cheaper: {d:?}");
    assert!(
        matches!(wait_of(&d, 1), Some(Wait::Preempting { victims: 4, .. })),
        "{d:?}"
    );
    // The victims stop: the gang starts on its nodes.
    for v in victims {
        s.release(v, now + 1);
    }
    let d = s.cycle(now + 2);
    let (id, shares) = placed_gang(&d).unwrap_or_else(|| panic!("{d:?}"));
    assert_eq!(id, 1);
    assert!(shares.iter().all(|a| h.nodes.contains(&a.node.0)));
}

#[test]
fn a_held_gang_within_its_guarantee_reclaims_on_its_nodes_only() {
    let mut s = sched();
    let window = s.cfg.backfill_max_wait_ms;
    super::testing::guarantee_half_each(&mut s, None);
    // b borrows the whole pool (its second half above its guarantee, with leases of an hour:
    // the gang holds nodes where they run, as it will start there soonest).
    for i in 0..16 {
        let j = lasting(job(100 + i, "b", 8, "standard", 0), (i >= 8).then_some(3_600_000));
        assert_eq!(placed(&s.submit(j, 0)), vec![100 + i]);
    }
    // A dry run of the same gang is told the same before it is submitted (an id no job has),
    // deciding nothing; tenant b (over its guarantee, and of no preempting class) is told none.
    let ask = |s: &mut Scheduler, tenant: &str| {
        let mut g = gang(1, tenant, 16, true, "standard", 0);
        g.id = u64::MAX;
        s.new_gang_forecast(&g, 0)
    };
    let (before, placed) = (s.hold_book(), s.engine.state().clone());
    let forecast = ask(&mut s, "a");
    assert!(
        matches!(forecast, Some((PreemptCause::Reclaim { .. }, _))),
        "{forecast:?}"
    );
    assert_eq!(ask(&mut s, "b"), None);
    assert!(
        s.hold_book() == before && s.holds.is_empty(),
        "a forecast decides nothing"
    );
    assert!(
        s.engine.state().same_holdings(&placed),
        "its trial evictions are rolled back"
    );
    let d = s.submit(gang(1, "a", 16, true, "standard", 0), 0);
    assert!(preempted(&d).is_empty(), "no hold yet, no search: {d:?}");
    // Its reason says when it will take its share back: once it holds nodes, past the window
    // (not only when b's work ends, an hour later).
    let Some(Wait::PreemptsIn {
        cause: PreemptCause::Reclaim { .. },
        at_ms,
        now,
        ..
    }) = wait_of(&d, 1)
    else {
        panic!("{d:?}")
    };
    assert_eq!(at_ms, window + 1, "{d:?}");
    assert_eq!(
        forecast.map(|(_, at)| at),
        Some(at_ms),
        "the dry run's time is the reason's"
    );
    assert!(matches!(*now, Wait::Gang(_)), "{now:?}");
    let d = s.cycle(at_ms);
    let h = hold(&s);
    let victims = preempted(&d);
    assert_eq!(victims.len(), 2, "{d:?}");
    for v in &victims {
        assert_eq!(s.is_borrowing(*v), Some(true), "only borrowers are reclaimed");
        let r = s.running().find(|r| r.id == *v).unwrap();
        assert!(h.nodes.contains(&r.node.0), "victims on the held nodes only");
    }
}

/// Every gang holding no nodes is told in the same pass when it will take capacity back, on a
/// pool of a few nodes: the forecasts' budget is the nodes they read, not one gang a pass (so a
/// gang behind others waited passes for its forecast).
#[test]
fn every_waiting_gang_on_a_small_pool_is_forecast_in_one_pass() {
    let mut s = sched();
    super::testing::guarantee_half_each(&mut s, None);
    for i in 0..16 {
        let j = lasting(job(100 + i, "b", 8, "standard", 0), (i >= 8).then_some(3_600_000));
        assert_eq!(placed(&s.submit(j, 0)), vec![100 + i]);
    }
    for id in 1..=3 {
        assert_eq!(s.submit_for_next_cycle(gang(id, "a", 16, true, "standard", 0)), None);
    }
    let d = s.cycle(1);
    for id in 1..=3 {
        assert!(
            matches!(
                wait_of(&d, id),
                Some(Wait::PreemptsIn {
                    cause: PreemptCause::Reclaim { .. },
                    ..
                })
            ),
            "gang {id}: {:?}",
            wait_of(&d, id)
        );
    }
}

/// The gang rules of the Philly replay, each alone: holds at once, gangs' own hold limit.
#[test]
fn a_gang_holds_at_once_when_told_and_gangs_have_holds_of_their_own() {
    // One 8-GPU job on every node, lasting 1 h (nodes 0–7) or 2 h (8–15): the pool is full.
    let full = |cfg: GovernConfig| {
        let mut s = Scheduler::new(super::testing::engine(), cfg);
        for i in 0..16 {
            let j = lasting(
                job(100 + i, "b", 8, "standard", 0),
                Some(3_600_000 * (1 + i as i64 / 8)),
            );
            assert_eq!(placed(&s.submit(j, 0)), vec![100 + i]);
        }
        s
    };
    // Default: a blocked gang waits the backfill window (5 min) before it holds nodes.
    let mut s = full(super::testing::config());
    s.submit(gang(1, "a", 16, true, "standard", 10), 10);
    assert!(s.holds.is_empty());
    // `gang_hold_after_ms: Some(0)`: it holds 2 nodes at once, where work ends at 1 h.
    let mut s = full(GovernConfig {
        gang_hold_after_ms: Some(0),
        ..super::testing::config()
    });
    let d = s.submit(gang(1, "a", 16, true, "standard", 10), 10);
    let h = hold(&s);
    assert!(h.gang);
    assert_eq!(
        (h.nodes.len(), h.starts_at_ms, h.ending),
        (2, Some(3_600_000), 2),
        "{d:?}"
    );
    assert!(matches!(wait_of(&d, 1), Some(Wait::GangHeld { nodes: 2, .. })), "{d:?}");
    // One hold per pool (the default) is shared: a second gang and a whole-GPU request get
    // none. With `gang_holds_per_pool: Some(2)` both gangs hold (4 distinct nodes) and the
    // whole-GPU request, past the window, has its own one: 3 holds.
    s.submit(gang(2, "a", 16, true, "standard", 20), 20);
    s.submit(job(3, "a", 8, "standard", 30), 30);
    s.cycle(30 + s.cfg.backfill_max_wait_ms + 1);
    assert_eq!(s.holds.len(), 1);
    let mut s = full(GovernConfig {
        gang_hold_after_ms: Some(0),
        gang_holds_per_pool: Some(2),
        ..super::testing::config()
    });
    s.submit(gang(1, "a", 16, true, "standard", 10), 10);
    s.submit(gang(2, "a", 16, true, "standard", 20), 20);
    s.submit(job(3, "a", 8, "standard", 30), 30);
    s.cycle(30 + s.cfg.backfill_max_wait_ms + 1);
    let holders: Vec<(u64, bool, usize)> = s.holds.iter().map(|h| (h.job, h.gang, h.nodes.len())).collect();
    assert_eq!(holders, [(1, true, 2), (2, true, 2), (3, false, 1)]);
    let mut nodes: Vec<u32> = s.holds.iter().flat_map(|h| h.nodes.clone()).collect();
    nodes.sort_unstable();
    nodes.dedup();
    assert_eq!(nodes.len(), 5, "distinct nodes");
    // The two gangs hold where work ends at 1 h (nodes 0–7: the first 4 to free).
    assert!(s.holds.iter().all(|h| h.starts_at_ms == Some(3_600_000)));
}

/// `max_loss_per_wait`: a gang reclaims only while the work its victims lose (GPU units × time
/// since start) is at most the factor × its GPUs × its wait: the time it has waited or, longer
/// here, the time it would still wait for its held nodes.
#[test]
fn a_gang_reclaims_only_as_much_work_as_it_waits_for() {
    let run = |factor: Option<f64>| {
        let mut s = Scheduler::new(
            super::testing::engine(),
            GovernConfig {
                max_loss_per_wait: factor,
                ..super::testing::config()
            },
        );
        let window = s.cfg.backfill_max_wait_ms;
        super::testing::guarantee_half_each(&mut s, None);
        // b borrows the whole pool from time 0 (its second half above its guarantee, leases
        // of an hour: the gang holds two of those nodes, where it starts soonest, at 1 h).
        for i in 0..16 {
            let j = lasting(job(100 + i, "b", 8, "standard", 0), (i >= 8).then_some(3_600_000));
            assert_eq!(placed(&s.submit(j, 0)), vec![100 + i]);
        }
        s.submit(gang(1, "a", 16, true, "standard", 0), 0);
        // At window + 1 (300,001 ms) the gang, submitted at 0, would still wait 3,299,999 ms
        // for its hold (longer than it has waited). Its two victims (8 GPUs each since 0) lose
        // 16 × 300,001 = 4,800,016 GPU-ms; its wait is 16 × 3,299,999 = 52,799,984 GPU-ms.
        let d = s.cycle(window + 1);
        assert_eq!(hold(&s).starts_at_ms, Some(3_600_000));
        preempted(&d)
    };
    assert_eq!(run(None).len(), 2, "no bound");
    assert_eq!(run(Some(1.0)).len(), 2);
    // 0.091 × 52,799,984 = 4,804,798.5 ≥ 4,800,016: taken; 0.09 × … = 4,751,998.6: not.
    assert_eq!(run(Some(0.091)).len(), 2);
    assert!(run(Some(0.09)).is_empty());
}

/// The gang rules' bound on reclaim is 10 % of the GPU-time the gang waits: b borrows half of
/// the pool with hour-long leases from 0; a's 16-GPU gang (within a's guarantee), submitted at
/// 250,000 ms, holds two of those nodes at once, to start at 1 h: it would wait 3,350,000 ms
/// more, 16 × 3,350,000 = 53,600,000 GPU-ms. Its two victims lose 16 × 250,000 = 4,000,000
/// GPU-ms: 7.5 % of that, within 10 % (5,360,000), over the 5 % (2,680,000) the rules had.
#[test]
fn under_the_gang_rules_a_gang_reclaims_work_losing_up_to_a_tenth_of_its_wait() {
    let run = |factor: Option<f64>| {
        let rules = super::testing::config().with_gang_rules();
        let mut s = Scheduler::new(
            super::testing::engine(),
            GovernConfig {
                max_loss_per_wait: factor.or(rules.max_loss_per_wait),
                ..rules
            },
        );
        super::testing::guarantee_half_each(&mut s, None);
        for i in 0..16 {
            let j = lasting(job(100 + i, "b", 8, "standard", 0), (i >= 8).then_some(3_600_000));
            assert_eq!(placed(&s.submit(j, 0)), vec![100 + i]);
        }
        let t = 250_000;
        let d = s.submit(gang(1, "a", 16, true, "standard", t), t);
        assert_eq!(hold(&s).starts_at_ms, Some(3_600_000));
        let mut victims = preempted(&d);
        victims.sort_unstable();
        victims
    };
    let victims = run(None);
    assert_eq!(victims.len(), 2, "the rules' bound: {victims:?}");
    assert!(victims.iter().all(|&v| v >= 108), "borrowers with leases: {victims:?}");
    assert!(run(Some(0.05)).is_empty(), "5 %: nothing taken");
}

/// `max_loss_per_wait` for a single-node request: a borrower that saved its work recently is
/// taken, one that would lose more than the request waited for is not.
#[test]
fn reclaim_takes_no_victim_that_loses_more_work_than_the_request_waited_for() {
    let mut s = Scheduler::new(
        super::testing::engine(),
        GovernConfig {
            max_loss_per_wait: Some(1.0),
            ..super::testing::config()
        },
    );
    super::testing::guarantee_half_each(&mut s, None);
    // a borrows the whole pool from 0 (jobs 8–15 above its guarantee).
    for i in 0..16 {
        assert_eq!(placed(&s.submit(job(i, "a", 8, "standard", 0), 0)), vec![i]);
    }
    assert_eq!(s.is_borrowing(15), Some(true));
    // b (within its guarantee) asks for 8 GPUs at 1,000. At 2,000 it has waited 8 × 1,000
    // GPU-ms; every borrower would lose 8 × 2,000 (no checkpoint), job 15 8 × 1,100 (saved at
    // 900): none is taken.
    s.submit(job(100, "b", 8, "standard", 1000), 1000);
    s.checkpointed(15, 900);
    assert!(preempted(&s.cycle(2000)).is_empty());
    // Job 14 saved at 1,100: at 2,001 it loses 8 × 901 ≤ 8 × 1,001. It is taken.
    s.checkpointed(14, 1100);
    assert_eq!(preempted(&s.cycle(2001)), vec![14]);
}

/// `gang_holds_move`: a held gang moves to nodes where it starts sooner (here: work being
/// stopped there counts as ending now), and only then.
#[test]
fn a_gangs_hold_moves_where_it_starts_sooner_when_told() {
    let hour = 3_600_000;
    let run = |moves: bool| {
        let mut s = Scheduler::new(
            super::testing::engine(),
            GovernConfig {
                gang_hold_after_ms: Some(0),
                gang_holds_move: moves,
                ..super::testing::config()
            },
        );
        // One 8-GPU job with a 2-h lease on every node.
        for i in 0..16 {
            assert_eq!(
                placed(&s.submit(lasting(job(100 + i, "b", 8, "standard", 0), Some(2 * hour)), 0)),
                vec![100 + i]
            );
        }
        s.submit(gang(1, "a", 16, true, "standard", 0), 0);
        let first = hold(&s);
        assert_eq!(first.starts_at_ms, Some(2 * hour));
        // Two nodes of another rack: their work is being stopped (it ends now, for the hold).
        let held_rack = s
            .engine
            .fleet()
            .levels
            .domain_name(0, tessera_model::NodeId(first.nodes[0]))
            .unwrap_or_default()
            .to_string();
        let others: Vec<u64> = (100..116)
            .filter(|&id| rack_of(&s, s.engine.allocation(id).unwrap()) != held_rack)
            .take(2)
            .collect();
        let nodes: Vec<u32> = others
            .iter()
            .map(|&id| s.engine.allocation(id).unwrap().node.0)
            .collect();
        for &id in &others {
            s.stopping(id);
        }
        s.cycle(60_000);
        (first, hold(&s), nodes)
    };
    let (first, now, _) = run(false);
    assert_eq!((now.nodes, now.starts_at_ms), (first.nodes, Some(2 * hour)), "kept");
    let (_, now, mut stopping) = run(true);
    let mut held = now.nodes.clone();
    held.sort_unstable();
    stopping.sort_unstable();
    assert_eq!(
        (held, now.starts_at_ms),
        (stopping, Some(60_000)),
        "moved, starts at once"
    );
}

/// `place_by_end`: single-node work goes where it extends the busy horizon least, not where
/// it fits best.
#[test]
fn place_by_end_puts_work_beside_work_that_ends_later() {
    let hour = 3_600_000;
    let run = |by_end: bool| {
        let mut s = Scheduler::new(
            super::testing::engine(),
            GovernConfig {
                place_by_end: by_end,
                ..super::testing::config()
            },
        );
        // x: 6 GPUs for 1 h (its node has 2 free); y: 4 GPUs for 10 h (4 free).
        s.submit(lasting(job(1, "a", 6, "standard", 0), Some(hour)), 0);
        s.submit(lasting(job(2, "a", 4, "standard", 0), Some(10 * hour)), 0);
        let (x, y) = (
            s.engine.allocation(1).unwrap().node,
            s.engine.allocation(2).unwrap().node,
        );
        assert_ne!(x, y);
        // z: 2 GPUs for 5 h. Best fit: x's node (2 free). By end: on x's node it would extend
        // the horizon from 1 h to 5 h (4 h), on y's not at all (10 h ≥ 5 h).
        assert_eq!(
            placed(&s.submit(lasting(job(3, "a", 2, "standard", 0), Some(5 * hour)), 0)),
            vec![3]
        );
        (s.engine.allocation(3).unwrap().node, x, y)
    };
    let (z, x, _) = run(false);
    assert_eq!(z, x, "best fit");
    let (z, _, y) = run(true);
    assert_eq!(z, y, "by end");
}

/// The seed's training pool (racks r0..r3 of nodes 0-3, 4-7, 8-11, 12-15) full of 8-GPU
/// jobs, one per node, those of rack r0 ending (by lease) at 2 h and the others at 10 h, under
/// the gang rules with holds stacked in time or not.
fn full_but_r0_at_2h(stack: bool) -> Scheduler {
    let hour = 3_600_000;
    let mut s = sched();
    s.cfg = GovernConfig {
        gang_holds_stack: stack,
        ..s.cfg.clone().with_gang_rules()
    };
    for n in 0..16u64 {
        let ends = if n < 4 { 2 * hour } else { 10 * hour };
        let d = s.submit(lasting(job(100 + n, "b", 8, "standard", 0), Some(ends)), 0);
        assert_eq!(placed(&d), vec![100 + n]);
        assert_eq!(s.engine.allocation(100 + n).map(|a| a.node.0), Some(n as u32));
    }
    s
}

/// A gang of `gpus` whole GPUs in one rack lasting `hours`.
fn gang_for(id: u64, gpus: u32, hours: i64) -> Job {
    lasting(gang(id, "a", gpus, true, "standard", 0), Some(hours * 3_600_000))
}

/// The nodes and start of the hold of job `id`.
fn hold_of(s: &Scheduler, id: u64) -> (Vec<u32>, Option<i64>, usize) {
    let h = s.holds.iter().find(|h| h.job == id).expect("a hold");
    let mut nodes = h.nodes.clone();
    nodes.sort_unstable();
    (nodes, h.starts_at_ms, h.ending)
}

#[test]
fn a_later_gang_stacks_its_hold_behind_an_earlier_gangs_window() {
    let hour = 3_600_000;
    // By hand: gang 1 (16 GPUs, 3 h) holds two nodes of r0 from 2 h (when its 4 jobs end)
    // to 5 h. Gang 2 (32 GPUs, 1 h, one rack) can have r0 once gang 1 has run: at 5 h,
    // after the 4 jobs there and gang 1 (5 workloads); any other rack frees at 10 h only.
    let mut s = full_but_r0_at_2h(true);
    s.submit(gang_for(1, 16, 3), 0);
    s.submit(gang_for(2, 32, 1), 0);
    s.cycle(1);
    let (n1, t1, e1) = hold_of(&s, 1);
    assert_eq!((n1.len(), t1, e1), (2, Some(2 * hour), 2));
    assert!(n1.iter().all(|&n| n < 4), "in r0: {n1:?}");
    assert_eq!(hold_of(&s, 2), (vec![0, 1, 2, 3], Some(5 * hour), 5));
    let Some(Wait::GangHeld {
        racks, starts_at_ms, ..
    }) = s.reasons.get(&2).cloned()
    else {
        panic!("{:?}", s.reasons.get(&2))
    };
    assert_eq!((racks, starts_at_ms), (vec!["r0".to_string()], Some(5 * hour)));
    // Without stacking gang 2 holds a rack of its own and waits for 10 h.
    let mut u = full_but_r0_at_2h(false);
    u.submit(gang_for(1, 16, 3), 0);
    u.submit(gang_for(2, 32, 1), 0);
    u.cycle(1);
    let (n2, t2, _) = hold_of(&u, 2);
    assert_eq!(t2, Some(10 * hour));
    assert!(n2.iter().all(|&n| n >= 4), "{n2:?}");

    // 2 h: r0's jobs end by their leases; gang 1 starts on two nodes of r0, and gang 2 still
    // starts at 5 h (gang 1's end by its lease).
    for n in 0..4 {
        s.release(100 + n, 2 * hour);
    }
    let d = s.cycle(2 * hour);
    let (_, shares) = placed_gang(&d).unwrap_or_else(|| panic!("{d:?}"));
    assert!(shares.iter().all(|a| a.node.0 < 4), "{shares:?}");
    let (_, t2, e2) = hold_of(&s, 2);
    assert_eq!((t2, e2), (Some(5 * hour), 1), "gang 1 is the one workload it waits for");
    // The two free nodes of r0 are backfilled only by work that ends by 5 h.
    let d = s.submit(
        lasting(job(300, "c", 8, "standard", 2 * hour), Some(4 * hour)),
        2 * hour,
    );
    assert!(placed(&d).is_empty(), "ends at 6 h, after gang 2's start: {d:?}");
    let d = s.submit(
        lasting(job(301, "c", 8, "standard", 2 * hour), Some(3 * hour)),
        2 * hour,
    );
    assert_eq!(placed(&d), vec![301], "ends at 5 h");
    assert!(s.engine.allocation(301).is_some_and(|a| a.node.0 < 4));
    // Gang 1 ends early, at 4 h: gang 2 still waits for job 301 (by its lease, 5 h).
    s.release(1, 4 * hour);
    let d = s.cycle(4 * hour);
    assert!(placed_gang(&d).is_none(), "{d:?}");
    assert_eq!(hold_of(&s, 2).1, Some(5 * hour));
    // 5 h: gang 2 starts on r0, on time.
    s.release(301, 5 * hour);
    let d = s.cycle(5 * hour);
    let (id, shares) = placed_gang(&d).unwrap_or_else(|| panic!("{d:?}"));
    assert_eq!(id, 2);
    let mut nodes: Vec<u32> = shares.iter().map(|a| a.node.0).collect();
    nodes.sort_unstable();
    assert_eq!(nodes, vec![0, 1, 2, 3]);
    assert!(s.holds.iter().all(|h| h.job != 2), "the hold ends with the placement");
}

#[test]
fn a_stacked_hold_fits_before_an_earlier_window_or_after_it() {
    // Windows are half-open: work from `t` for `d` may end exactly when a window starts.
    let w = [(3, 5), (8, 9)];
    assert_eq!(super::allocate::stack_on(0, 3, w.iter().copied()), 0, "ends at 3");
    assert_eq!(super::allocate::stack_on(1, 3, w.iter().copied()), 5, "after the first");
    assert_eq!(super::allocate::stack_on(5, 4, w.iter().copied()), 9, "5..9 meets 8..9");
    assert_eq!(
        super::allocate::stack_on(5, 3, w.iter().copied()),
        5,
        "5..8 fits between"
    );
    assert_eq!(
        super::allocate::stack_on(0, i64::MAX, w.iter().copied()),
        9,
        "no end: after all"
    );
    assert_eq!(super::allocate::stack_on(0, 1, [(0, i64::MAX)].into_iter()), i64::MAX);
}

#[test]
fn an_earlier_gang_never_waits_for_a_later_ones_hold() {
    let hour = 3_600_000;
    // Gang 2 (1 h) holds r0 behind gang 1 (3 h, 2 nodes of r0): 5 h. Gang 1 is placed at its
    // start although its nodes are gang 2's too: it ends (5 h) by gang 2's start.
    let mut s = full_but_r0_at_2h(true);
    s.submit(gang_for(1, 16, 3), 0);
    s.submit(gang_for(2, 32, 1), 0);
    s.cycle(1);
    for n in 0..4 {
        s.release(100 + n, 2 * hour - 1);
    }
    let d = s.cycle(2 * hour - 1);
    assert_eq!(placed_gang(&d).map(|(id, _)| id), Some(1), "{d:?}");
    // A gang that would run past 5 h on r0 may not start there: a 16-GPU gang of 4 h waits.
    let d = s.submit(gang_for(3, 16, 4), 2 * hour);
    assert!(placed_gang(&d).is_none(), "{d:?}");
    let d = s.submit(gang_for(4, 16, 2), 2 * hour);
    assert_eq!(
        placed_gang(&d).map(|(id, _)| id),
        Some(4),
        "2 h of work ends by 5 h: {d:?}"
    );
}

mod reservation_properties {
    use std::sync::Arc;

    use proptest::prelude::*;
    use tessera_model::request::{GangRequest, TopologyConstraint};
    use tessera_model::{Fleet, PoolId, Request};

    use super::super::plugins::GangsFirst;
    use super::super::testing::config;
    use super::super::{Decision, GovernConfig, Job, Plugins, Quota, Scheduler};
    use crate::engine::Engine;
    use crate::policy::BestFit;
    use tessera_model::GpuUnits;

    /// One whole-GPU pool of `racks` racks of `per_rack` nodes of `gpus` GPUs.
    fn fleet(racks: u32, per_rack: u32, gpus: u32) -> Fleet {
        let mut text = String::from("[[pool]]\nname = \"training\"\nsharing = \"whole\"\n");
        for r in 0..racks {
            text += &format!(
                "[[pool.nodes]]\nname = \"n{r}\"\ncount = {per_rack}\ngpu_model = \"H100-80GB-SXM\"\ngpus = {gpus}\ncpus = 112\nmemory_gib = 2048\nnvlink = \"nvswitch\"\nrack = \"r{r}\"\n"
            );
        }
        Fleet::from_toml(&text, "test").expect("a valid fleet")
    }

    fn job(id: u64, gpus: u32, duration_ms: Option<i64>, now: i64) -> Job {
        Job {
            id,
            tenant: format!("t{}", id % 3),
            project: "p".into(),
            request: Request::whole(gpus as u8).with_pool(PoolId(0)),
            priority: "standard".into(),
            submitted_ms: now,
            wait_if_over_limit: true,
            min_runtime_ms: None,
            movable: None,
            gang: None,
            duration_ms,
        }
    }

    type Work = (u32, Option<i64>, i64);

    /// Work as (GPUs, lease in minutes or none, the share of its lease it runs in percent, at
    /// most 100: about half end early).
    fn work(max: usize) -> impl Strategy<Value = Vec<Work>> {
        proptest::collection::vec(
            (1u32..=8, proptest::option::weighted(0.9, 1i64..600), 1i64..=200),
            0..max,
        )
    }

    /// The lease of `j` in ms.
    fn lease_of(j: &Job) -> i64 {
        j.duration_ms.unwrap_or(0)
    }

    /// The percent of its lease an arrival runs (at most 100).
    fn pct_of(a: &(u32, u32, i64, i64, i64)) -> i64 {
        a.3.min(100)
    }

    /// When work of lease `d` started at `at` really ends, running `pct` percent of it.
    fn actual_end(at: i64, d: i64, pct: i64) -> i64 {
        at + (d * pct.min(100) / 100).max(1)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// A reservation is never delayed by backfilled work: while a gang holds nodes, all
        /// work placed on them ends by its start, the start never moves later, and at the start
        /// (the work that ended by then gone) the gang is placed. With the gang rules and holds
        /// stacked in time, a second gang may hold nodes behind the first one's window: the
        /// same holds of both (work on a node held twice ends by the sooner start), and once
        /// the first has started and run, the second is placed at its own start.
        #[test]
        fn a_reservation_is_never_delayed_by_backfilled_work(
            racks in 1u32..4,
            per_rack in 2u32..5,
            eight in any::<bool>(),
            nodes_wanted in 2u32..5,
            share in 1u32..=8,
            first in work(40),
            later in proptest::collection::vec((work(2), 0i64..600), 0..40),
            rules in any::<bool>(),
            lease in 1i64..600,
            lease_pct in 1i64..=100,
            second in proptest::option::of((1u32..5, 1i64..600)),
        ) {
            let gpus = if eight { 8 } else { 4 };
            let minute = 60_000;
            let f = Arc::new(fleet(racks, per_rack, gpus));
            // With the gang rules, the gang holds at once (any number of gang holds, stacked
            // in time) and the queue serves gangs first.
            let mut s = if rules {
                let cfg = GovernConfig {
                    gang_hold_after_ms: Some(0),
                    gang_holds_per_pool: Some(usize::MAX),
                    gang_holds_stack: true,
                    max_loss_per_wait: Some(1.0),
                    ..config()
                };
                Scheduler::new(Engine::new(f, Box::new(BestFit), 1), cfg).with_plugins(Plugins {
                    queue_order: Box::new(GangsFirst {
                        estimate_weight: 0.25,
                        across_tenants: true,
                    }),
                    ..Plugins::default()
                })
            } else {
                Scheduler::new(Engine::new(f, Box::new(BestFit), 1), config())
            };
            let window = s.cfg.backfill_max_wait_ms;
            let mut ends: Vec<(i64, u64)> = Vec::new();
            let mut next = 10u64;
            // Running work, all started at 0; what does not fit is dropped.
            for (g, d, pct) in first {
                let j = job(next, g.min(gpus), d.map(|m| m * minute), 0);
                next += 1;
                if s.submit(j.clone(), 0).iter().any(|x| matches!(x, Decision::Placed { .. })) {
                    if let Some(d) = j.duration_ms {
                        ends.push((actual_end(0, d, pct), j.id));
                    }
                } else {
                    s.dequeue(j.id);
                }
            }
            // The gang: whole nodes, or shares of `share` GPUs, required in one rack; with the
            // rules, it has a lease (the second gang stacks behind its window).
            let k = nodes_wanted.min(per_rack);
            let per = share.min(gpus);
            let g = if per == gpus {
                GangRequest::whole_nodes(k * gpus)
            } else {
                GangRequest::nodes(k, per as u8)
            };
            let g = g.with_pool(PoolId(0)).with_topology(TopologyConstraint::required("rack"));
            let gang_lease = rules.then_some(lease * minute);
            let gang = Job { gang: Some(g), ..job(1, 1, gang_lease, 0) };
            let placed_at_once = s
                .submit(gang, 0)
                .iter()
                .any(|x| matches!(x, Decision::PlacedGang { .. }));
            prop_assume!(!placed_at_once);
            // The second gang (rules only): whole nodes in one rack, its own lease.
            let mut second_waits = false;
            let mut second_lease = 0;
            if rules && let Some((k2, lease2)) = second {
                let g2 = GangRequest::whole_nodes(k2.min(per_rack) * gpus)
                    .with_pool(PoolId(0))
                    .with_topology(TopologyConstraint::required("rack"));
                second_lease = lease2 * minute;
                let j2 = Job { gang: Some(g2), ..job(2, 1, Some(second_lease), 0) };
                let d = s.submit(j2, 0);
                match d.iter().find_map(|x| match x { Decision::PlacedGang { id: 2, shares, .. } => Some(shares.clone()), _ => None }) {
                    Some(shares) => {
                        // Placed at once, beside the first gang's hold or ending before it.
                        ends.push((second_lease, 2));
                        let h = s.holds.iter().find(|x| x.job == 1).cloned();
                        if let Some(h) = h && shares.iter().any(|a| h.nodes.contains(&a.node.0)) {
                            prop_assert!(h.starts_at_ms.is_some_and(|t| second_lease <= t), "gang 2 on gang 1's nodes past its start");
                        }
                    }
                    None => second_waits = true,
                }
            }
            let mut now = window + 1;
            s.cycle(now);
            let Some(h) = s.holds.iter().find(|x| x.job == 1).cloned() else {
                // Placed by the cycle, or nowhere to hold: nothing to check.
                return Ok(());
            };
            let mut start = h.starts_at_ms;
            let mut start2 = s.holds.iter().find(|x| x.job == 2).and_then(|x| x.starts_at_ms);
            // Work placed at `now` (decisions `d`) on a node held before (for a job of `held`)
            // ends by that hold's start; the second gang's too, where it is placed on the first
            // one's nodes.
            let check = |s: &Scheduler, held: &[u64], d: &[Decision], now: i64, ends: &mut Vec<(i64, u64)>, pct: i64| -> Result<(), TestCaseError> {
                for x in d {
                    let (id, nodes): (u64, Vec<u32>) = match x {
                        Decision::Placed { id, alloc, .. } => (*id, vec![alloc.node.0]),
                        Decision::PlacedGang { id, shares, .. } => (*id, shares.iter().map(|a| a.node.0).collect()),
                        _ => continue,
                    };
                    let r = s.running().find(|r| r.id == id).unwrap();
                    if let Some(e) = r.ends_at_ms {
                        let p = if id < 10 { lease_pct } else { pct };
                        ends.push((actual_end(now, e - now, p), id));
                    }
                    for hold in s.holds.iter().filter(|hd| hd.job != id && held.contains(&hd.job)) {
                        if !nodes.iter().any(|n| hold.nodes.contains(n)) {
                            continue;
                        }
                        // Gang 2 stacked behind gang 1 with no start known (it waits for work
                        // without end elsewhere): gang 1 goes first.
                        if id == 1 && hold.job == 2 && hold.starts_at_ms.is_none() {
                            continue;
                        }
                        let (Some(t), Some(e)) = (hold.starts_at_ms, r.ends_at_ms) else {
                            return Err(TestCaseError::fail(format!("{id} on a node held for {} without a start or an end: {x:?}", hold.job)));
                        };
                        prop_assert!(e <= t, "{} ends at {} after the start {} of {}", id, e, t, hold.job);
                    }
                }
                Ok(())
            };
            // Later work arrives; work ends by its lease, some of it early (which may bring the
            // start nearer, never later).
            let mut later: Vec<(Work, i64)> = later
                .into_iter()
                .flat_map(|(w, at)| w.into_iter().map(move |w| (w, at)))
                .collect();
            later.sort_by_key(|(_, at)| *at);
            for ((g, d, pct), at) in later {
                let at = now.max(window + 1 + at * minute / 10);
                if start.is_some_and(|t| at >= t) {
                    break;
                }
                ends.sort_unstable();
                while let Some(&(e, id)) = ends.first() {
                    if e > at {
                        break;
                    }
                    s.release(id, e);
                    ends.remove(0);
                }
                now = at;
                let j = job(next, g.min(gpus), d.map(|m| m * minute), now);
                next += 1;
                let held: Vec<u64> = s.holds.iter().map(|x| x.job).collect();
                let d = s.submit(j.clone(), now);
                check(&s, &held, &d, now, &mut ends, pct)?;
                if d.iter().any(|x| matches!(x, Decision::PlacedGang { id: 1, .. })) {
                    // Room freed elsewhere (or on its nodes, sooner than leases said).
                    return Ok(());
                }
                prop_assert!(s.holds.iter().any(|x| x.job == 1), "the hold stays: {:?}", d);
                let h2 = s.holds.iter().find(|x| x.job == 1).unwrap().clone();
                prop_assert_eq!(&h2.nodes, &h.nodes);
                if let (Some(t), Some(t2)) = (start, h2.starts_at_ms) {
                    prop_assert!(t2 <= t, "the start moved from {} to {}", t, t2);
                }
                let held: Vec<u64> = s.holds.iter().map(|x| x.job).collect();
                let d = s.cycle(now);
                check(&s, &held, &d, now, &mut ends, pct)?;
                if d.iter().any(|x| matches!(x, Decision::PlacedGang { id: 1, .. })) {
                    return Ok(());
                }
                let h3 = s.holds.iter().find(|x| x.job == 1).unwrap();
                match (start, h3.starts_at_ms) {
                    (Some(t), Some(t2)) => prop_assert!(t2 <= t, "the start moved from {} to {}", t, t2),
                    (Some(t), None) => return Err(TestCaseError::fail(format!("the start {t} became unknown"))),
                    (None, _) => {}
                }
                start = h3.starts_at_ms;
                // Gang 2's start moves later only behind gang 1 (whose hold is ahead of it) when
                // gang 1's start moved sooner: to gang 1's end by its lease at the latest.
                let behind = start.map_or(i64::MAX, |t1| t1.saturating_add(lease * minute));
                match (start2, s.holds.iter().find(|x| x.job == 2).map(|x| x.starts_at_ms)) {
                    (Some(t), Some(Some(t2))) => prop_assert!(t2 <= t.max(behind), "gang 2's start moved from {} to {}", t, t2),
                    (Some(t), Some(None)) => return Err(TestCaseError::fail(format!("gang 2's start {t} became unknown"))),
                    _ => {}
                }
                start2 = s.holds.iter().find(|x| x.job == 2).and_then(|x| x.starts_at_ms);
            }
            // At the start of each gang still holding nodes, the sooner first, with the work
            // that ended by then gone, the gang is placed: the first at `start`, the second
            // (stacked behind the first, or before it) at a start no later than it was told.
            let Some(t) = start else { return Ok(()) };
            let mut told = vec![(1u64, t)];
            // When gang 1 ends by its lease (it starts at `t` at the latest).
            let mut behind = t.saturating_add(lease * minute);
            if second_waits && let Some(t2) = start2 {
                told.push((2, t2));
            }
            while let Some((id, when)) = told
                .iter()
                .filter(|(id, _)| s.holds.iter().any(|x| x.job == *id))
                .map(|&(id, _)| (id, s.holds.iter().find(|x| x.job == id).and_then(|x| x.starts_at_ms)))
                .filter_map(|(id, t)| t.map(|t| (id, t)))
                .min_by_key(|&(id, t)| (t, id))
            {
                let was = told.iter().find(|(j, _)| *j == id).map(|&(_, t)| t).unwrap();
                let bound = if id == 2 { was.max(behind) } else { was };
                prop_assert!(when <= bound.max(now), "gang {}'s start moved from {} to {}", id, was, when);
                ends.sort_unstable();
                while let Some(&(e, j)) = ends.first() {
                    if e > when {
                        break;
                    }
                    s.release(j, e);
                    ends.remove(0);
                }
                now = when;
                let held: Vec<u64> = s.holds.iter().map(|x| x.job).collect();
                let d = s.cycle(when);
                check(&s, &held, &d, when, &mut ends, 100)?;
                let first_placed = d.iter().any(|x| matches!(x, Decision::PlacedGang { id: 1, .. }));
                if first_placed {
                    behind = when.saturating_add(lease * minute);
                }
                // Gang 1 may start sooner than it was told, at gang 2's start, and go first.
                let placed = d.iter().any(|x| matches!(x, Decision::PlacedGang { id: i, .. } if *i == id));
                if !(placed || (id == 2 && first_placed)) {
                    // Work that ended early, released just now, brought gang 1's start nearer, so
                    // that gang 2's window (ahead of it until now) overlaps it: gang 2 moves
                    // behind gang 1, to its end by its lease at the latest (the trade-off of
                    // holds stacked in time). Anything else is a delay.
                    let start_of = |j: u64| s.holds.iter().find(|x| x.job == j).and_then(|x| x.starts_at_ms);
                    let pushed = id == 2
                        && start_of(1).is_some_and(|t1| {
                            t1 < t && start_of(2).is_some_and(|t2| t2 > when && t2 <= t1.saturating_add(lease * minute))
                        });
                    prop_assert!(pushed, "gang {} is placed at its start {}: {:?}", id, when, d);
                }
            }
            let _ = second_lease;
        }

        /// Under the gang rules (every blocked gang holds at once, gangs first, reclaim bounded
        /// by the work lost), with gangs and single-node work of three tenants arriving and
        /// ending, reclaimed work requeued: after every cycle each gang is placed whole (all
        /// its shares, on distinct nodes) or not at all, and capacity is conserved (the GPUs
        /// the engine counts as used are exactly those of the running workloads, no GPU has
        /// two holders, every allocation belongs to a running workload).
        #[test]
        fn gangs_are_placed_whole_or_not_at_all_and_capacity_is_conserved(
            racks in 1u32..4,
            per_rack in 2u32..5,
            arrivals in proptest::collection::vec(
                (0u32..4, 1u32..=8, 1i64..600, 1i64..=200, 0i64..600),
                1..50,
            ),
        ) {
            let gpus = 8u32;
            let minute = 60_000;
            let f = Arc::new(fleet(racks, per_rack, gpus));
            let cfg = GovernConfig {
                gang_hold_after_ms: Some(0),
                gang_holds_per_pool: Some(usize::MAX),
                max_loss_per_wait: Some(1.0),
                ..config()
            };
            let mut s = Scheduler::new(Engine::new(f, Box::new(BestFit), 1), cfg).with_plugins(Plugins {
                queue_order: Box::new(GangsFirst {
                        estimate_weight: 0.25,
                        across_tenants: true,
                    }),
                ..Plugins::default()
            });
            let third = racks * per_rack * gpus / 3;
            for t in 0..3 {
                s.set_quota(&format!("t{t}"), "training", Some(Quota { guaranteed: GpuUnits::whole(third.into()), limit: None }));
            }
            // (nodes: 0 a single-node job of `g` GPUs, else a gang of that many whole nodes;
            // lease in minutes; percent of it run; arrival in minutes).
            let mut arrivals = arrivals;
            arrivals.sort_by_key(|a| a.4);
            let mut jobs: Vec<Job> = Vec::new();
            let mut shape: Vec<usize> = Vec::new();
            let mut ends: Vec<(i64, u64)> = Vec::new();
            for (i, &(nodes, g, lease, _, at)) in arrivals.iter().enumerate() {
                let now = at * minute;
                let mut j = job(i as u64, g, Some(lease * minute), now);
                if nodes > 0 {
                    let k = nodes.min(racks * per_rack);
                    j.gang = Some(GangRequest::whole_nodes(k * gpus).with_pool(PoolId(0)));
                    shape.push(k as usize);
                } else {
                    shape.push(1);
                }
                jobs.push(j.clone());
                // Work ending by now goes first.
                ends.sort_unstable();
                while let Some(&(e, id)) = ends.first() {
                    if e > now {
                        break;
                    }
                    s.release(id, e);
                    ends.remove(0);
                }
                let mut d = s.submit(j, now);
                d.extend(s.cycle(now));
                for x in &d {
                    match x {
                        Decision::PlacedGang { id, shares, .. } => {
                            prop_assert_eq!(shares.len(), shape[*id as usize], "gang {} placed whole", id);
                            let mut nodes: Vec<u32> = shares.iter().map(|a| a.node.0).collect();
                            nodes.sort_unstable();
                            nodes.dedup();
                            prop_assert_eq!(nodes.len(), shares.len(), "distinct nodes");
                            ends.push((now + (lease_of(&jobs[*id as usize]) * pct_of(&arrivals[*id as usize]) / 100).max(1), *id));
                        }
                        Decision::Placed { id, .. } => {
                            ends.push((now + (lease_of(&jobs[*id as usize]) * pct_of(&arrivals[*id as usize]) / 100).max(1), *id));
                        }
                        Decision::Preempt { victim, .. } => {
                            // Stopped at once and requeued; its end no longer counts.
                            prop_assert!(s.release(*victim, now).is_some());
                            ends.retain(|(_, id)| id != victim);
                            s.enqueue(jobs[*victim as usize].clone());
                        }
                        _ => {}
                    }
                }
                // Whole or nothing, and conserved capacity.
                let st = s.engine.state();
                let used: u64 = st.nodes.iter().map(|n| u64::from(n.gpus.len() as u32 - n.free_gpus())).sum();
                let mut running_units = 0u64;
                let mut allocations = 0usize;
                for r in s.running() {
                    running_units += r.units.as_milli() / 1000;
                    allocations += r.nodes().count();
                    prop_assert_eq!(r.nodes().count(), shape[r.id as usize], "{} runs whole", r.id);
                    if shape[r.id as usize] > 1 {
                        let g = s.engine.gang(r.id);
                        prop_assert!(g.is_some_and(|g| g.shares.len() == shape[r.id as usize]));
                    }
                }
                prop_assert_eq!(used, running_units, "used GPUs are the running work's");
                prop_assert_eq!(st.allocations.len(), allocations, "every allocation is a running workload's");
                prop_assert!(st.nodes.iter().all(|n| n.gpus.iter().all(|g| g.holders.len() <= 1)), "one holder per GPU");
            }
        }
    }
}

#[test]
fn a_holds_the_rack_where_it_starts_soonest() {
    let hour = 3_600_000;
    let mut s = sched();
    let window = s.cfg.backfill_max_wait_ms;
    // One 8-GPU job on every node, ending at hours spread over the racks.
    let end = |i: u64| ((i * 7) % 16 + 1) as i64 * hour;
    for i in 0..16 {
        let j = lasting(job(100 + i, "b", 8, "standard", 0), Some(end(i)));
        assert_eq!(placed(&s.submit(j, 0)), vec![100 + i]);
    }
    // By hand: each rack frees when its last job ends; the gang takes the rack that frees first.
    let mut last: std::collections::BTreeMap<String, i64> = std::collections::BTreeMap::new();
    for i in 0..16 {
        let r = rack_of(&s, s.engine.allocation(100 + i).unwrap());
        let e = last.entry(r).or_insert(0);
        *e = (*e).max(end(i));
    }
    let (soonest, at) = last
        .iter()
        .min_by_key(|(_, e)| **e)
        .map(|(r, e)| (r.clone(), *e))
        .unwrap();
    s.submit(gang(1, "a", 32, true, "standard", 0), 0);
    let d = s.cycle(window + 1);
    let h = hold(&s);
    assert_eq!(h.starts_at_ms, Some(at));
    let Some(Wait::GangHeld { racks, .. }) = wait_of(&d, 1) else {
        panic!("{d:?}")
    };
    assert_eq!(racks, vec![soonest]);
}

#[test]
fn the_dry_runs_estimate_is_the_start_and_place_a_held_gang_gets() {
    let minute = 60_000;
    let short = |p: u64| Some((p as i64 + 1) * 10 * minute);
    let long = |p: u64| Some((p as i64 + 1) * 20 * minute + 7);
    let window = sched().cfg.backfill_max_wait_ms;
    let now = window + 1;
    let mut s = paired(short, long);
    let job = gang(1, "a", 32, true, "standard", 0);
    let g = job.gang.clone().unwrap();
    let ends: std::collections::HashMap<u64, Option<i64>> = s.running().map(|r| (r.id, r.ends_at_ms)).collect();
    let end_of = |w: u64| ends.get(&w).copied().flatten();
    let pools = s.engine.gang_pools(&g);
    let est = super::estimate_gang_start(&s.engine, &g, &pools, now, &end_of).expect("an estimate");
    s.submit(job, 0);
    let d = s.cycle(now);
    let h = hold(&s);
    assert_eq!((est.starts_at_ms, est.ending), (h.starts_at_ms, h.ending));
    let Some(Wait::GangHeld { racks, .. }) = wait_of(&d, 1) else {
        panic!("{d:?}")
    };
    assert_eq!(est.racks, racks);
    // With no end known for the work it waits for, no time is promised.
    let est = super::estimate_gang_start(&s.engine, &g, &pools, now, &|_| None).unwrap();
    assert_eq!(est.starts_at_ms, None);
}

#[test]
fn the_dry_run_plans_a_new_gang_behind_the_holds_of_the_gangs_waiting_before_it() {
    let hour = 3_600_000;
    for stack in [true, false] {
        // Gangs 1 and 2 wait with holds (stacked: gang 1 on r0 from 2 h to 5 h, gang 2 on r0
        // from 5 h to 6 h; unstacked: each on a rack of its own).
        let mut s = full_but_r0_at_2h(stack);
        s.submit(gang_for(1, 16, 3), 0);
        s.submit(gang_for(2, 32, 1), 0);
        s.cycle(1);
        assert_eq!(s.holds.len(), 2);
        let third = gang_for(3, 32, 1);
        let g = third.gang.clone().unwrap();
        let book = s.hold_book();
        let est = book
            .gang_start(&s.engine, &g, third.duration_ms, 2)
            .expect("an estimate");
        // Blind to the holds, r0 frees at 2 h: a promise the gang would not get.
        let pools = s.engine.gang_pools(&g);
        let blind = super::estimate_gang_start(&s.engine, &g, &pools, 2, &|w| {
            s.running.get(&w).and_then(|r| r.ends_at_ms)
        })
        .unwrap();
        assert_eq!(blind.starts_at_ms, Some(2 * hour));
        // By hand: stacked, r0 once gang 2 has run (6 h, after r0's 4 jobs and both gangs);
        // unstacked, the racks left free of holds free at 10 h.
        let (at, ending) = if stack { (6 * hour, 6) } else { (10 * hour, 4) };
        assert_eq!((est.starts_at_ms, est.ending), (Some(at), ending), "stack {stack}");
        // Submitted, gang 3 is told the same start and place.
        s.submit(third, 2);
        s.cycle(2);
        let (nodes, t, e) = hold_of(&s, 3);
        assert_eq!((t, e), (est.starts_at_ms, est.ending), "stack {stack}");
        let Some(Wait::GangHeld {
            racks, starts_at_ms, ..
        }) = s.reasons.get(&3).cloned()
        else {
            panic!("{:?}", s.reasons.get(&3))
        };
        assert_eq!((racks, starts_at_ms), (est.racks.clone(), est.starts_at_ms));
        assert_eq!(nodes.len(), 4);
    }
}

/// `max_loss_per_wait` bounds the work a gang's victims lose *together*, and the reason that
/// says when it will take capacity promises that, not a time at which one victim alone would
/// be cheap enough.
#[test]
fn a_gangs_reason_promises_victims_when_their_loss_together_is_within_the_bound() {
    let hour = 3_600_000;
    let mut s = Scheduler::new(
        super::testing::engine(),
        GovernConfig {
            max_loss_per_wait: Some(2.0),
            gang_reclaim_after_ms: Some(hour / 2),
            ..super::testing::config()
        },
    );
    let quota = |g: u64| {
        Some(Quota {
            guaranteed: GpuUnits::whole(g),
            limit: None,
        })
    };
    s.set_quota("a", "training", quota(64));
    s.set_quota("b", "training", quota(0));
    // b borrows the whole pool from 0, without leases.
    for i in 0..16 {
        assert_eq!(placed(&s.submit(job(100 + i, "b", 8, "standard", 0), 0)), vec![100 + i]);
    }
    // The 16-GPU gang, submitted at 1 h, holds two nodes past the backfill window and may
    // reclaim from 1.5 h. By hand: its bound is 2 × 16 GPUs × its wait; its two victims lose
    // 8 GPUs each since 0. At 1.5 h one alone loses 12 GPU-hours, within the bound (16), but
    // both lose 24; together they are within it from 2 h on (32 ≤ 2 × 16 × 1).
    s.submit(gang(1, "a", 16, true, "standard", hour), hour);
    s.cycle(hour + s.cfg.backfill_max_wait_ms + 1);
    assert_eq!(hold(&s).nodes.len(), 2);
    let Some(Wait::PreemptsIn { at_ms, .. }) = s.reasons.get(&1).cloned() else {
        panic!("{:?}", s.reasons.get(&1))
    };
    assert_eq!(at_ms, 2 * hour, "when both victims together are cheap enough");
    // Before then the search finds nothing (it checks the total), at that time it takes both.
    assert!(preempted(&s.cycle(hour + hour / 2)).is_empty());
    assert!(preempted(&s.cycle(2 * hour - 1)).is_empty());
    let victims = preempted(&s.cycle(2 * hour));
    assert_eq!(victims.len(), 2, "{victims:?}");
}
