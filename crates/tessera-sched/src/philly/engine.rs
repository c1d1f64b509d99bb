//! The `engine` row: the Philly trace through Tessera's real scheduler
//! ([`Scheduler`]: admit, allocate with backfill and holds, consolidate, reclaim, preempt)
//! instead of the `tessera` model of [`super::Sim`], on a simulated clock, measured by the same
//! [`super::measure`] as every other policy.
//!
//! By the protocol: every job of the trace shaped by [`Layout::request_of`] (a multi-node job
//! as a gang in the fewest racks), of its VC as tenant at priority `standard`, its lease
//! ([`Job::duration_ms`]) the user's estimate ([`estimate`]) so that holds and backfill know
//! when work ends, while it runs the trace's `duration`; each tenant's guarantee
//! ([`guarantees`]) is its quota in the pool (guaranteed units, borrowing without limit). At each
//! timestamp the completions are released, the submissions queued, then one cycle decides for
//! the whole queue. A preemption (reclaim of borrowed GPUs) stops the victim at once (no grace
//! period in simulated time) and puts it back in the queue; it restarts from the beginning (no
//! checkpointing) and its delay counts to its last start, as in the model. Decisions that free
//! capacity (a preemption) get a few more cycles at the same instant, as the real server runs
//! its next cycle once the victims stop.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use tessera_model::GpuUnits;

use super::{Layout, Measured, Outcome, Policy, Report, Trace, estimate, fleet_of, guarantees, measure};
use crate::cycle::{Decision, GovernConfig, Job, Quota, Scheduler};
use crate::engine::{Engine, demand_of};
use crate::replay::make_policy;

/// Settings of the engine's replay.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub govern: GovernConfig,
    /// The engine's placement policy for single-node requests ([`crate::replay::POLICIES`]).
    pub placement: String,
    pub seed: u64,
}

impl Default for EngineConfig {
    /// The scenario's settings ([`philly_govern`]) with one hold per pool, Tessera's placement.
    fn default() -> Self {
        EngineConfig {
            govern: philly_govern(1),
            placement: "tessera".into(),
            seed: 1,
        }
    }
}

/// The scheduler's settings for the Philly replay: the scenario's ([`crate::scenario::scenario_govern`]:
/// a 30-minute backfill window before a blocked request holds its nodes, reclaim after 4 h of
/// waiting within the guarantee, a `standard` workload not preempted before 4 h of running)
/// with at most `holds_per_pool` holds per pool.
pub fn philly_govern(holds_per_pool: usize) -> GovernConfig {
    GovernConfig {
        holds_per_pool,
        ..crate::scenario::scenario_govern()
    }
}

/// Replays `trace` on `layout` (a Philly fleet: racks of 8 nodes of 8 GPUs, as [`fleet_of`]
/// builds them) through the real scheduler; the report and each job's outcome.
///
/// # Panics
/// If `layout` is not the layout of a [`fleet_of`] fleet, or a bad placement policy is named.
pub fn replay_engine(trace: &Trace, layout: &Layout, cfg: &EngineConfig) -> (Report, Vec<Outcome>) {
    let fleet = fleet_of(layout.racks.len()).expect("a Philly fleet");
    assert_eq!(
        Layout::of(&fleet).as_ref(),
        Some(layout),
        "the engine's replay runs on Philly fleets (racks of 8 nodes of 8 GPUs)"
    );
    let fleet = Arc::new(fleet);
    let rack_level = fleet.levels.level("rack").expect("racks");
    let rack_of = |node: tessera_model::NodeId| fleet.levels.domain_of(rack_level, node);
    let pool = fleet.pools[0].name.clone();

    let n = trace.jobs.len();
    let t0 = trace.jobs.first().map_or(0, |j| j.submit);
    let ms = |t: i64| (t - t0) * 1000;
    let shaped: Vec<_> = trace.jobs.iter().map(|j| layout.request_of(j.gpus)).collect();
    let prior: Vec<_> = shaped
        .iter()
        .filter(|(_, g)| g.is_none())
        .filter_map(|(r, _)| demand_of(r))
        .collect();
    let policy = make_policy(&cfg.placement, &prior).expect("a placement policy");
    let mut s = Scheduler::new(Engine::new(fleet.clone(), policy, cfg.seed), cfg.govern.clone());
    let guarantee = guarantees(trace, layout.gpus());
    for (t, name) in trace.tenants.iter().enumerate() {
        s.set_quota(
            name,
            &pool,
            Some(Quota {
                guaranteed: GpuUnits(guarantee[t] * 1000),
                limit: None,
            }),
        );
    }
    let job = |i: usize| Job {
        id: i as u64,
        tenant: trace.tenants[trace.jobs[i].tenant].clone(),
        project: "default".into(),
        request: shaped[i].0.clone(),
        priority: "standard".into(),
        submitted_ms: ms(trace.jobs[i].submit),
        wait_if_over_limit: true,
        min_runtime_ms: None,
        movable: None,
        gang: shaped[i].1.clone(),
        duration_ms: Some(estimate(trace.jobs[i].duration) * 1000),
    };

    let mut out = vec![
        Outcome {
            start: None,
            end: None,
            preempted: 0,
        };
        n
    ];
    let mut refused = vec![false; n];
    let mut generation = vec![0u32; n];
    // Completions: (time in trace seconds, job, generation).
    let mut completions: BinaryHeap<Reverse<(i64, usize, u32)>> = BinaryHeap::new();
    let mut held_spans: Vec<(i64, i64, u32)> = Vec::new();
    let (mut preemptions, mut lost_gpu_s, mut beyond_min_racks) = (0u64, 0i128, 0usize);
    let mut next = 0usize;
    loop {
        let t_sub = trace.jobs.get(next).map(|j| j.submit);
        let t_end = completions.peek().map(|Reverse((t, _, _))| *t);
        let Some(now) = [t_sub, t_end].into_iter().flatten().min() else {
            break;
        };
        while let Some(&Reverse((t, j, g))) = completions.peek()
            && t == now
        {
            completions.pop();
            if generation[j] == g && out[j].end.is_none() && s.release(j as u64, ms(now)).is_some() {
                let start = out[j].start.expect("a running job started");
                out[j].end = Some(now);
                held_spans.push((start, now, trace.jobs[j].gpus));
            }
        }
        while next < n && trace.jobs[next].submit == now {
            if s.submit_for_next_cycle(job(next)).is_some() {
                refused[next] = true;
            }
            next += 1;
        }
        // The protocol's pass; more only where a preemption freed capacity at this instant.
        let mut passes = 0;
        while passes == 0 || (passes < 8 && s.needs_cycle()) {
            passes += 1;
            let mut freed = false;
            for d in s.cycle(ms(now)) {
                match d {
                    Decision::Placed { id, .. } | Decision::PlacedGang { id, .. } => {
                        let j = id as usize;
                        if let Decision::PlacedGang { shares, .. } = &d {
                            let mut racks: Vec<_> = shares.iter().map(|a| rack_of(a.node)).collect();
                            racks.sort_unstable();
                            racks.dedup();
                            beyond_min_racks +=
                                usize::from(racks.len() > layout.min_racks(layout.shares(trace.jobs[j].gpus).len()));
                        }
                        out[j].start = Some(now);
                        out[j].end = None;
                        generation[j] += 1;
                        completions.push(Reverse((now + trace.jobs[j].duration, j, generation[j])));
                    }
                    Decision::Preempt { victim, .. } => {
                        let j = victim as usize;
                        let Some(start) = out[j].start.filter(|_| out[j].end.is_none()) else {
                            continue;
                        };
                        if s.release(victim, ms(now)).is_none() {
                            continue;
                        }
                        let gpus = trace.jobs[j].gpus;
                        preemptions += 1;
                        lost_gpu_s += (now - start) as i128 * gpus as i128;
                        held_spans.push((start, now, gpus));
                        out[j].start = None;
                        out[j].preempted += 1;
                        generation[j] += 1;
                        s.enqueue(job(j));
                        freed = true;
                    }
                    Decision::Refused { id, .. } => refused[id as usize] = true,
                    Decision::Waiting { .. } => {}
                    // No job is movable, so consolidation never moves one.
                    Decision::Move { id, .. } => unreachable!("consolidation moved job {id}, which is not movable"),
                }
            }
            if !freed {
                break;
            }
        }
    }
    let report = measure(
        &Measured {
            trace,
            layout,
            policy: Policy::Engine,
            guarantee: &guarantee,
            out: &out,
            held_spans: &held_spans,
            preemptions,
            lost_gpu_s,
            beyond_min_racks,
        },
        &refused,
    );
    (report, out)
}
