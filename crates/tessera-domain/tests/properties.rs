//! Property tests of the lifecycle over random input streams: whatever the scheduler, people,
//! the backend and crashes do, in whatever order, no workload is lost, capacity is conserved
//! (held exactly while the phase holds an allocation, returned exactly once), the queue holds
//! exactly the waiting workloads, every running workload has exactly one open usage interval,
//! terminal workloads never change, and timelines are numbered without gaps.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use tessera_domain::lifecycle::{Effect, Input, Observed, transition};
use tessera_domain::{
    GpuSpec, Kind, Phase, Placement, PreemptCode, Reason, ReasonCode, ShapeSpec, Slice, Workload, WorkloadId,
    WorkloadSpec,
};
use tessera_model::GpuUnits;

const N: usize = 6;

fn workload(i: usize) -> Workload {
    let kind = [Kind::Batch, Kind::Service, Kind::Interactive][i % 3];
    let spec = WorkloadSpec {
        cpu_milli: 1000,
        memory_mib: 1024,
        no_requeue: i % 4 == 3,
        ..WorkloadSpec::new(
            "t",
            "p",
            &format!("w{i}"),
            kind,
            ShapeSpec::any(GpuSpec::Whole { gpus: 1 }),
        )
    };
    Workload::new(WorkloadId(i as u64), spec, GpuUnits::whole(1), 0)
}

fn placement(i: usize) -> Placement {
    Placement {
        pool: "training".into(),
        node: format!("n{i}"),
        model: "H100".into(),
        gpus: vec![0],
        slice: Slice::Whole,
        units: GpuUnits::whole(1),
    }
}

/// The world around the lifecycle: the scheduler's queue and allocations, and the ledger.
#[derive(Default)]
struct World {
    queue: BTreeSet<usize>,
    held: BTreeSet<usize>,
    /// Open usage interval per workload: its sequence number.
    open: BTreeMap<usize, u32>,
    closed: usize,
}

fn apply(world: &mut World, ws: &mut [Workload], i: usize, input: Input) -> Result<(), TestCaseError> {
    let before = ws[i].clone();
    let t = transition(before.clone(), input);
    if before.phase.is_terminal() {
        prop_assert_eq!(&t.workload, &before, "a terminal workload never changes");
    }
    for (k, e) in t.events.iter().enumerate() {
        prop_assert_eq!(e.seq, before.next_seq + k as u32, "timelines have no gaps");
    }
    for e in &t.effects {
        match e {
            Effect::Release => prop_assert!(world.held.remove(&i), "released twice or never held: {}", i),
            Effect::Requeue => prop_assert!(world.queue.insert(i), "queued twice: {}", i),
            Effect::Dequeue => {
                world.queue.remove(&i);
            }
            Effect::OpenUsage { seq, .. } => {
                prop_assert!(world.open.insert(i, *seq).is_none(), "two open intervals: {}", i);
            }
            Effect::CloseUsage { seq, .. } => {
                prop_assert_eq!(world.open.remove(&i), Some(*seq), "closed an interval that is not open");
                world.closed += 1;
            }
            Effect::Partition | Effect::Start | Effect::Stop { .. } | Effect::Unpartition => {}
        }
    }
    ws[i] = t.workload;
    Ok(())
}

fn check(world: &World, ws: &[Workload]) -> Result<(), TestCaseError> {
    for (i, w) in ws.iter().enumerate() {
        prop_assert_eq!(
            world.held.contains(&i),
            w.phase.holds_capacity(),
            "capacity of {} in {}",
            i,
            w.phase
        );
        prop_assert_eq!(
            world.queue.contains(&i),
            w.phase.is_waiting(),
            "queue and {} in {}",
            i,
            w.phase
        );
        prop_assert_eq!(world.open.contains_key(&i), w.usage.open, "ledger and {}", i);
        if w.phase == Phase::Running {
            prop_assert!(w.usage.open, "a running workload is metered");
        }
        if w.usage.open {
            prop_assert!(matches!(w.phase, Phase::Running | Phase::Stopping));
        }
        // Ended workloads keep their placement on record (where they ran).
        if w.phase.holds_capacity() {
            prop_assert!(w.placement.is_some(), "placement of {} in {}", i, w.phase);
        }
        if w.phase.is_waiting() {
            prop_assert!(w.placement.is_none(), "a waiting workload holds no placement: {}", i);
        }
    }
    Ok(())
}

fn observed(v: u8) -> Observed {
    match v % 5 {
        0 => Observed::Running { since: Some(50) },
        1 => Observed::Starting,
        2 => Observed::Succeeded,
        3 => Observed::Failed {
            detail: "exit 1".into(),
        },
        _ => Observed::Unknown {
            detail: "unknown".into(),
        },
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    #[test]
    fn random_streams_keep_the_invariants(ops in prop::collection::vec((0u8..16, 0usize..N, any::<u8>()), 1..250)) {
        let mut ws: Vec<Workload> = (0..N).map(workload).collect();
        let mut world = World::default();
        // Every workload is submitted: the scheduler queues it.
        world.queue.extend(0..N);
        let mut at = 100;
        for (op, i, v) in ops {
            at += 10;
            let input = match op {
                // The scheduler acts only on what it holds.
                0 if world.queue.contains(&i) => {
                    world.queue.remove(&i);
                    world.held.insert(i);
                    Input::Placed { at, placement: placement(i), shares: Vec::new(), borrowing: v % 2 == 0 }
                }
                1 if world.queue.contains(&i) => Input::Waiting { at, reason: Reason::new(ReasonCode::NoCapacity, "none free") },
                2 if world.queue.contains(&i) => {
                    world.queue.remove(&i);
                    Input::Refused { at, reason: Reason::new(ReasonCode::Quota, "over its limit") }
                }
                3 if world.held.contains(&i) => Input::Preempt {
                    at,
                    by: WorkloadId(99),
                    code: if v % 2 == 0 { PreemptCode::Priority } else { PreemptCode::Reclaim },
                    detail: "needed".into(),
                    grace_s: 5,
                },
                4 => Input::Cancel { at, by: "tok".into(), grace_s: 5 },
                // The backend may report anything, late or twice.
                5 => Input::Partitioned { at, detail: "ok".into() },
                6 => Input::PartitionFailed { at, detail: "busy".into() },
                7 => Input::StartFailed { at, detail: "no".into() },
                8 => Input::Running { at, detail: "started".into(), observed: "busy".into() },
                9 => Input::Exited { at, success: v % 2 == 0, detail: "done".into() },
                10 => Input::Lost { at, detail: "gone".into() },
                11 | 12 => Input::Stopped { at },
                13 => Input::Bound { placement: Placement { gpus: vec![v % 8], ..placement(i) } },
                // A crash: memory is rebuilt from the records, then every live workload is
                // recovered with what the backend says (or found invalid for the fleet).
                14 | 15 => {
                    world.queue.clear();
                    world.held = (0..N).filter(|&k| ws[k].phase.holds_capacity()).collect();
                    for k in 0..N {
                        if ws[k].phase.is_terminal() {
                            continue;
                        }
                        let input = if op == 15 && (v as usize + k).is_multiple_of(7) {
                            world.held.remove(&k);
                            Input::Invalid { at, detail: "node gone".into() }
                        } else {
                            Input::Recovered { at, observed: observed(v.wrapping_add(k as u8)), grace_s: 5 }
                        };
                        apply(&mut world, &mut ws, k, input)?;
                    }
                    check(&world, &ws)?;
                    continue;
                }
                _ => continue,
            };
            apply(&mut world, &mut ws, i, input)?;
            check(&world, &ws)?;
        }
        // No workload is lost: each is either still live or ended with a time.
        for w in &ws {
            prop_assert!(!w.phase.is_terminal() || w.ended_at.is_some());
        }
    }
}
