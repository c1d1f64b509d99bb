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
use crate::cycle::plugins::GangsFirst;
use crate::cycle::{Decision, GovernConfig, Job, Plugins, Quota, Scheduler};
use crate::engine::{Engine, demand_of};
use crate::replay::make_policy;

/// Settings of the engine's replay.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub govern: GovernConfig,
    /// The engine's placement policy for single-node requests ([`crate::replay::POLICIES`]).
    pub placement: String,
    pub seed: u64,
    /// `Some`: the queue in the [`GangsFirst`] order; `None`: the scheduler's default order.
    pub gangs_first: Option<GangsFirst>,
}

impl EngineConfig {
    /// The rules for gangs on top of the scenario's settings ([`philly_govern`]), with at most
    /// `holds_per_pool` holds of single-node requests per pool:
    /// - every blocked gang holds nodes at once, any number of gangs per pool, and moves its
    ///   hold where it would start sooner (conservative backfill for gangs);
    /// - gangs first across tenants, single-node work by arrival plus a quarter of its
    ///   estimate ([`GangsFirst`], as the `tessera` model orders its classes);
    /// - reclaim and preemption throw away at most 10 % of the GPU-time the waiting job waits
    ///   (`max_loss_per_wait` 0.1: its GPUs × the longer of its wait so far and its wait
    ///   still to come by its hold);
    /// - single-node work on the node whose busy horizon it extends least (`place_by_end`).
    pub fn gang_rules(holds_per_pool: usize) -> Self {
        EngineConfig {
            govern: philly_govern(holds_per_pool).with_gang_rules(),
            gangs_first: Some(crate::cycle::gang_rules_order()),
            ..EngineConfig::scenario(holds_per_pool)
        }
    }

    /// The scenario's settings ([`philly_govern`]) with at most `holds_per_pool` holds per
    /// pool, Tessera's placement, the default queue order: the engine as the server runs it.
    pub fn scenario(holds_per_pool: usize) -> Self {
        EngineConfig {
            govern: philly_govern(holds_per_pool),
            placement: "tessera".into(),
            seed: 1,
            gangs_first: None,
        }
    }
}

impl Default for EngineConfig {
    /// The rules for gangs with no holds of single-node requests ([`EngineConfig::gang_rules`]
    /// with 0: the best of the variants measured on the Philly fleets).
    fn default() -> Self {
        EngineConfig::gang_rules(0)
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
    if let Some(order) = cfg.gangs_first {
        s = s.with_plugins(Plugins {
            queue_order: Box::new(order),
            ..Plugins::default()
        });
    }
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

#[cfg(test)]
mod tests {
    use super::super::{PhillyJob, WINDOW_DAYS};
    use super::*;

    const W: i64 = WINDOW_DAYS.0 * 86_400;

    fn job(submit: i64, duration: i64, gpus: u32) -> PhillyJob {
        PhillyJob {
            submit,
            duration,
            gpus,
            tenant: 0,
        }
    }

    /// One rack of 8 nodes × 8 GPUs. A 1-s job at t0 opens the trace; the rest are submitted in
    /// the measured window (from t0 + 14 d = W):
    /// - j0, W: 56 GPUs (a gang of 7 whole nodes) for 7,200 s (estimate 4 h): W..W+7200;
    /// - j1, W: 8 GPUs for 3,600 s (estimate 2 h) on the 8th node: W..W+3600;
    /// - j2, W+1: 16 GPUs (2 whole nodes in the rack) for 600 s: at W+3600 one node is free,
    ///   not two; it waits for j0, until W+7200 (7,199 s);
    /// - j3, W+3700: 1 GPU for 20,000 s (estimate 6 h, to W+25300). The free node is held for
    ///   j2 (it waited past the 30-minute backfill window, or at once under the gang rules; by
    ///   the estimates it fits there and on
    ///   one of j0's nodes at W+14400), and j3 would end after that: it waits too, until j0
    ///   ends at W+7200 (3,500 s), and runs beside j2. Without holds it starts at once.
    fn trace() -> Trace {
        Trace {
            jobs: vec![
                job(0, 1, 1),
                job(W, 7200, 56),
                job(W, 3600, 8),
                job(W + 1, 600, 16),
                job(W + 3700, 20_000, 1),
            ],
            tenants: vec!["a".into()],
        }
    }

    fn waits(out: &[Outcome], trace: &Trace) -> Vec<i64> {
        out.iter()
            .zip(&trace.jobs)
            .map(|(o, j)| o.start.unwrap() - j.submit)
            .collect()
    }

    #[test]
    fn the_real_scheduler_holds_a_gangs_nodes_by_the_estimates() {
        let layout = Layout::of(&fleet_of(1).unwrap()).unwrap();
        let trace = trace();
        // The scenario's settings: j2 holds past the backfill window; the gang rules (the
        // default): it holds at once, on the free 8th node and one of j0's (start W+14400 by
        // the estimates), where no better start appears until j0 ends. The same waits.
        for cfg in [EngineConfig::scenario(1), EngineConfig::default()] {
            let (r, out) = replay_engine(&trace, &layout, &cfg);
            assert_eq!(waits(&out, &trace), [0, 0, 0, 7199, 3500]);
            assert_eq!(out[4].end, Some(W + 7200 + 20_000));
            assert_eq!(r.policy, "engine");
            assert_eq!(
                (r.window_jobs, r.preemptions, r.refusals, r.gangs_beyond_min_racks),
                (4, 0, 0, 0)
            );
            let all = r.classes.iter().find(|c| c.class == "all").unwrap();
            assert_eq!(all.mean_s, (7199.0 + 3500.0) / 4.0);
            // Nearest rank over {0, 0, 3500, 7199}: p50 the 2nd, p95 the 4th.
            assert_eq!((all.p50_s, all.p95_s, all.max_s), (0, 7199, 7199));
            assert_eq!(r.tenants[0].guarantee, 64);
            // GPU-seconds in the window: j0 56 × 7200, j1 8 × 3600, j2 16 × 600, j3 1 × 20,000.
            let held = 56.0 * 7200.0 + 8.0 * 3600.0 + 16.0 * 600.0 + 20_000.0;
            let window = (WINDOW_DAYS.1 - WINDOW_DAYS.0) as f64 * 86_400.0;
            assert!((r.allocation_pct - 100.0 * held / (64.0 * window)).abs() < 1e-9);

            // No holds (the scenario's settings): j3 takes the free node at once; j2 still waits
            // for j0.
        }
        let no_holds = EngineConfig::scenario(0);
        let (_, out) = replay_engine(&trace, &layout, &no_holds);
        assert_eq!(waits(&out, &trace), [0, 0, 0, 7199, 0]);
    }
}
