//! The cycle with multi-node gangs: placed whole through the engine, counted whole against
//! quotas, refused at once when no domain of their level could hold them, waiting with the
//! level's reason, taken whole as victims, released whole.

use tessera_model::request::{GangRequest, TopologyConstraint};
use tessera_model::{GpuUnits, PoolId};

use super::testing::{job, placed, preempted, sched};
use super::*;
use crate::reason::GangUnplaceable;

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
            .contains("no rack of pool `training` has room now (the most, 24"),
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
    let held: Vec<u32> = s.gang_holds.values().flat_map(|(_, n)| n.clone()).collect();
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
    assert!(s.gang_holds.is_empty(), "the hold ends with the placement");
}
