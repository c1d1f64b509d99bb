//! The scheduler-cycle benchmark behind `tessera bench cycle`: a full [`Scheduler`] cycle
//! (admit, allocate, reclaim, preempt) over a deep queue on a large fleet, timed per cycle.
//!
//! Set-up: `queued` jobs of a seeded mix (whole 1/2/4/8 GPUs, every MIG profile of the
//! fleet's MIG models, fractions; `tenants` tenants; the four priority classes) are submitted
//! for the next cycle at time 0. The first cycle fills the fleet and is reported on its own.
//! Then, each steady cycle, one simulated second later: `churn` running workloads finish
//! (released), as many new jobs arrive (so the queue stays at its depth), and one cycle runs
//! over the whole queue. Only the cycle itself is timed, by the caller (this crate reads no
//! clock): [`run`] hands each cycle to a closure that runs and times it.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_model::{Fleet, Request, Sharing, TenantId};

use crate::cycle::{Decision, GovernConfig, Job, Scheduler};
use crate::engine::Engine;
use crate::replay::make_policy;

/// Settings of one run.
#[derive(Clone, Debug)]
pub struct CycleBench {
    pub queued: usize,
    pub cycles: usize,
    pub churn: usize,
    pub tenants: usize,
    pub policy: String,
    pub seed: u64,
}

/// What a run measured.
#[derive(Clone, Debug, Default)]
pub struct CycleReport {
    /// Milliseconds of the first cycle (which fills the empty fleet) and the jobs it placed.
    pub first_ms: f64,
    pub first_placed: usize,
    /// Cycles run after the first until the fleet was saturated (not measured).
    pub warmup_cycles: usize,
    /// Milliseconds per steady cycle, sorted.
    pub steady_ms: Vec<f64>,
    /// Jobs placed and preemptions decided over the steady cycles.
    pub placed: usize,
    pub preempted: usize,
    /// Queue depth and running workloads after the last cycle.
    pub queue_after: usize,
    pub running_after: usize,
}

impl CycleReport {
    /// The `p` quantile (0..=1) of the steady cycles, in milliseconds.
    pub fn percentile(&self, p: f64) -> f64 {
        let s = &self.steady_ms;
        if s.is_empty() {
            return 0.0;
        }
        s[((s.len() - 1) as f64 * p).round() as usize]
    }
}

/// The request mix for a fleet (every shape its pools serve).
pub fn request_mix(fleet: &Fleet) -> Vec<Request> {
    let mut out = Vec::new();
    let has = |s: Sharing| fleet.pools.iter().any(|p| p.sharing == s);
    if has(Sharing::Whole) {
        for g in [1u8, 1, 1, 2, 2, 4, 8] {
            out.push(Request::whole(g).with_host(g as u64 * 8000, g as u64 * 64 * 1024));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for node in &fleet.nodes {
        if fleet.pool(node.pool).sharing != Sharing::Mig {
            continue;
        }
        let m = fleet.catalogue.get(node.model);
        for p in m.mig.map(|g| g.profiles).unwrap_or(&[]) {
            let name = m.profile_name(p);
            if seen.insert(name.clone()) {
                let r = Request::mig(&fleet.catalogue, &name).expect("catalogue name");
                out.push(r.with_host(2000 * p.sm_slices as u64, 16 * 1024));
            }
        }
    }
    if has(Sharing::Shared) {
        for milli in [100u16, 250, 250, 500, 500, 750] {
            out.push(Request::fraction(milli).with_host(2000, 8 * 1024));
        }
    }
    out
}

const MAX_WARMUP: usize = 400;

const CLASSES: [&str; 4] = ["critical", "high", "standard", "opportunistic"];

/// Runs the benchmark on `fleet`. `timed(scheduler, now)` must run `scheduler.cycle(now)` and
/// return its decisions with the milliseconds it took.
pub fn run(
    fleet: std::sync::Arc<Fleet>,
    b: &CycleBench,
    mut timed: impl FnMut(&mut Scheduler, i64) -> (Vec<Decision>, f64),
) -> Result<CycleReport, String> {
    let mix = request_mix(&fleet);
    if mix.is_empty() {
        return Err("the fleet has no pools to place into".into());
    }
    let engine = Engine::new(fleet.clone(), make_policy(&b.policy, &[])?, b.seed);
    let mut sched = Scheduler::new(engine, GovernConfig::default());
    let mut rng = ChaCha8Rng::seed_from_u64(b.seed);
    let tenants = b.tenants.max(1);
    let mut next_id = 0u64;
    let mut new_job = |rng: &mut ChaCha8Rng, now: i64| {
        next_id += 1;
        let t = rng.random_range(0..tenants);
        let mut request = mix[rng.random_range(0..mix.len())].clone();
        request.tenant = Some(TenantId(t as u32));
        // Mostly standard work, some of every other class.
        let class = match rng.random_range(0..20) {
            0 => CLASSES[0],
            1..=3 => CLASSES[1],
            4..=15 => CLASSES[2],
            _ => CLASSES[3],
        };
        Job {
            id: next_id,
            tenant: format!("t{t}"),
            project: format!("t{t}/main"),
            request,
            priority: class.to_string(),
            submitted_ms: now,
            wait_if_over_limit: true,
            min_runtime_ms: None,
            movable: None,
        }
    };
    for _ in 0..b.queued {
        let j = new_job(&mut rng, 0);
        sched.submit_for_next_cycle(j);
    }
    let mut running: Vec<u64> = Vec::new();
    let count = |ds: &[Decision], running: &mut Vec<u64>| {
        let (mut placed, mut preempted) = (0, 0);
        for d in ds {
            match d {
                Decision::Placed { id, .. } => {
                    placed += 1;
                    running.push(*id);
                }
                Decision::Preempt { .. } => preempted += 1,
                _ => {}
            }
        }
        (placed, preempted)
    };
    let mut report = CycleReport::default();
    let (ds, ms) = timed(&mut sched, 0);
    report.first_ms = ms;
    report.first_placed = count(&ds, &mut running).0;
    // Warm-up: the queue is topped up and cycles run until the fleet is saturated (a cycle
    // places no more than the churn frees), at most `MAX_WARMUP` of them; then the measured
    // cycles.
    let mut warm = 0;
    let mut c = 0;
    loop {
        c += 1;
        while sched.queued() < b.queued {
            let j = new_job(&mut rng, c as i64 * 1000);
            sched.submit_for_next_cycle(j);
        }
        let ds = sched.cycle(c as i64 * 1000);
        let placed = count(&ds, &mut running).0;
        warm += 1;
        if placed <= b.churn.max(1) * 2 || warm >= MAX_WARMUP {
            break;
        }
    }
    report.warmup_cycles = warm;
    for c in c + 1..=c + b.cycles {
        let now = c as i64 * 1000;
        for _ in 0..b.churn.min(running.len()) {
            let id = running.swap_remove(rng.random_range(0..running.len()));
            sched.release(id, now);
        }
        while sched.queued() < b.queued {
            let j = new_job(&mut rng, now);
            sched.submit_for_next_cycle(j);
        }
        let (ds, ms) = timed(&mut sched, now);
        report.steady_ms.push(ms);
        let (p, x) = count(&ds, &mut running);
        report.placed += p;
        report.preempted += x;
        // Preempted workloads stop (the backend would report them gone).
        for d in &ds {
            if let Decision::Preempt { victim, .. } = d {
                sched.release(*victim, now);
                running.retain(|r| r != victim);
            }
        }
    }
    report.steady_ms.sort_by(f64::total_cmp);
    report.queue_after = sched.queued();
    report.running_after = running.len();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycles_keep_the_queue_deep_and_the_fleet_busy() {
        let fleet = std::sync::Arc::new(Fleet::synthetic(60));
        let b = CycleBench {
            queued: 2_000,
            cycles: 3,
            churn: 20,
            tenants: 4,
            policy: "tessera".into(),
            seed: 1,
        };
        let mut calls = 0;
        let r = run(fleet.clone(), &b, |s, now| {
            calls += 1;
            (s.cycle(now), calls as f64)
        })
        .unwrap();
        assert_eq!(calls, 4, "the first cycle and the measured ones are timed");
        assert_eq!(r.first_ms, 1.0);
        assert!(r.first_placed > 0);
        assert_eq!(r.steady_ms.len(), 3);
        assert_eq!(r.steady_ms, vec![2.0, 3.0, 4.0], "sorted");
        // Every measured cycle starts with a full queue and only takes out what it places.
        assert!(
            b.queued - r.placed <= r.queue_after && r.queue_after <= b.queued,
            "{r:?}"
        );
        assert!(r.running_after > 0);
        assert!(r.percentile(0.99) >= r.percentile(0.5));
    }
}
