//! The scheduler-cycle benchmark behind `tessera bench cycle`: a full [`Scheduler`] cycle
//! (admit, allocate, reclaim, preempt) over a deep queue on a large fleet, timed per cycle.
//!
//! Set-up: `queued` jobs of a seeded mix (whole 1/2/4/8 GPUs, every MIG profile of the
//! fleet's MIG models, fractions; `gang_permille` of them multi-node gangs of 16–128 GPUs;
//! `tenants` tenants; the four priority classes) are submitted
//! for the next cycle at time 0. The first cycle fills the fleet and is reported on its own.
//! Then, each steady cycle, one simulated second later: `churn` running workloads finish
//! (released), as many new jobs arrive (so the queue stays at its depth), and one cycle runs
//! over the whole queue. Only the cycle itself is timed, by the caller (this crate reads no
//! clock): [`run`] hands each cycle to a closure that runs and times it.
//!
//! `tessera bench placement` (and the `bench_place` example) places requests of the
//! [`request_mix`] one by one at a steady load kept by a [`PlacementChurn`]; the caller places,
//! releases and times.
//!
//! `tessera bench gang` plans 128-GPU gangs ([`gang_forms`]) on [`gang_fleet`] (racks of 16,
//! blocks of 8 racks) kept busy with single-node work by a [`GangSetup`]; the caller times.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_model::request::{GangRequest, TopologyConstraint};
use tessera_model::{Fleet, GpuUnits, Request, Sharing, TenantId};

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
    /// Per mille of the jobs that are multi-node gangs of 16, 32, 64 or 128 whole GPUs (2 to 16
    /// whole 8-GPU nodes, a rack preferred), where the fleet has a whole pool of 8-GPU nodes.
    pub gang_permille: u32,
}

/// The sizes of the benchmark's multi-node gangs, in GPUs.
pub const CYCLE_GANG_GPUS: [u32; 4] = [16, 32, 64, 128];

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
    /// Of `placed`, the multi-node gangs.
    pub gangs_placed: usize,
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

/// The placement benchmark's demand and steady load: the next request of a mix and which
/// allocation to release, drawn from a seed; the caller calls the engine (and times it).
#[derive(Clone, Debug)]
pub struct PlacementChurn {
    requests: Vec<Request>,
    rng: ChaCha8Rng,
    /// Allocations placed and not released yet, with their units.
    live: Vec<(u64, GpuUnits)>,
    held: GpuUnits,
    target: GpuUnits,
    next_id: u64,
}

impl PlacementChurn {
    /// Requests drawn from `requests` (not empty) with `seed`, the fleet kept at `target` units.
    pub fn new(requests: Vec<Request>, seed: u64, target: GpuUnits) -> PlacementChurn {
        PlacementChurn {
            requests,
            rng: ChaCha8Rng::seed_from_u64(seed),
            live: Vec::new(),
            held: GpuUnits::ZERO,
            target,
            next_id: 0,
        }
    }

    /// The units the live allocations hold.
    pub fn held(&self) -> GpuUnits {
        self.held
    }

    /// A live allocation to release while the fleet holds more than the target, at random.
    pub fn over_target(&mut self) -> Option<u64> {
        if self.held > self.target { self.any_live() } else { None }
    }

    /// A live allocation to release, at random (after a refusal, to keep churning); `None` if
    /// there is none. It no longer counts as held.
    pub fn any_live(&mut self) -> Option<u64> {
        if self.live.is_empty() {
            return None;
        }
        let (id, units) = self.live.swap_remove(self.rng.random_range(0..self.live.len()));
        self.held -= units;
        Some(id)
    }

    /// The next request to place and its allocation id: one of the mix at random, a fraction
    /// for one of 8 tenants.
    pub fn next_request(&mut self) -> (u64, Request) {
        let mut req = self.requests[self.rng.random_range(0..self.requests.len())].clone();
        if matches!(req.shape, tessera_model::Shape::Fraction { .. }) {
            req.tenant = Some(TenantId(self.rng.random_range(0..8)));
        }
        self.next_id += 1;
        (self.next_id, req)
    }

    /// Counts allocation `id` of `units`, placed, as live.
    pub fn placed(&mut self, id: u64, units: GpuUnits) {
        self.held += units;
        self.live.push((id, units));
    }
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
    // Gangs only where a whole pool of 8-GPU nodes can hold them.
    let gangs = fleet
        .nodes
        .iter()
        .any(|n| n.gpus >= 8 && fleet.pool(n.pool).sharing == Sharing::Whole);
    let mut next_id = 0u64;
    let mut new_job = |rng: &mut ChaCha8Rng, now: i64| {
        next_id += 1;
        let t = rng.random_range(0..tenants);
        let gang = (gangs && rng.random_range(0..1000) < b.gang_permille).then(|| {
            let gpus = CYCLE_GANG_GPUS[rng.random_range(0..CYCLE_GANG_GPUS.len())];
            GangRequest::whole_nodes(gpus).with_topology(TopologyConstraint::preferred("rack"))
        });
        let mut request = match gang {
            // What each node-share asks for (the gang's own request is not read).
            Some(_) => Request::whole(8).with_host(64_000, 512 * 1024),
            None => mix[rng.random_range(0..mix.len())].clone(),
        };
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
            gang,
            // Released at random by the churn: no end known.
            duration_ms: None,
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
                Decision::Placed { id, .. } | Decision::PlacedGang { id, .. } => {
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
        report.gangs_placed += ds.iter().filter(|d| matches!(d, Decision::PlacedGang { .. })).count();
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

// ----- gangs beyond one node (`tessera bench gang`) --------------------------------------

/// A whole pool `training` of `nodes` 8-GPU servers in racks of 16 and blocks of 8 racks.
pub fn gang_fleet(nodes: u32) -> Fleet {
    let mut text = String::from("[[pool]]\nname = \"training\"\nsharing = \"whole\"\n");
    for r in 0..nodes.div_ceil(16) {
        let count = (nodes - r * 16).min(16);
        text += &format!(
            "[[pool.nodes]]\nname = \"n{r}\"\ncount = {count}\ngpu_model = \"H100-80GB-SXM\"\ngpus = 8\ncpus = 112\nmemory_gib = 2048\nnvlink = \"nvswitch\"\nrack = \"r{r}\"\nblock = \"b{}\"\n",
            r / 8
        );
    }
    Fleet::from_toml(&text, "gang-bench").expect("the gang bench fleet is valid")
}

/// The gangs `tessera bench gang` plans, each 128 GPUs: 16 whole nodes preferring a rack,
/// 32 nodes × 4 GPUs, and 16 whole nodes required within a block.
pub fn gang_forms() -> Vec<(&'static str, GangRequest)> {
    vec![
        ("16 whole nodes, preferred rack", GangRequest::whole_nodes(128)),
        ("32 nodes x 4 GPUs", GangRequest::nodes(32, 4)),
        (
            "16 whole nodes, required block",
            GangRequest::whole_nodes(128).with_topology(TopologyConstraint::required("block")),
        ),
    ]
}

/// An engine on [`gang_fleet`] filled with single-node work (1, 2, 4 or 8 whole GPUs) to a
/// share `load` of its GPUs; [`GangSetup::churn`] ends one workload and starts another.
pub struct GangSetup {
    pub engine: Engine,
    live: Vec<(u64, u64)>,
    held: u64,
    next: u64,
    rng: ChaCha8Rng,
}

const GANG_SIZES: [u8; 4] = [1, 2, 4, 8];

impl GangSetup {
    pub fn new(nodes: u32, load: f64, seed: u64) -> GangSetup {
        let fleet = std::sync::Arc::new(gang_fleet(nodes));
        let target = (fleet.gpu_count() as f64 * load.clamp(0.0, 0.95)) as u64;
        let mut s = GangSetup {
            engine: Engine::new(fleet, make_policy("tessera", &[]).expect("tessera policy"), seed),
            live: Vec::new(),
            held: 0,
            next: 0,
            rng: ChaCha8Rng::seed_from_u64(seed),
        };
        while s.held < target {
            s.start_one();
        }
        s
    }

    fn start_one(&mut self) {
        let k = GANG_SIZES[self.rng.random_range(0..GANG_SIZES.len())];
        self.next += 1;
        if self.engine.place(self.next, &Request::whole(k)).is_ok() {
            self.held += k as u64;
            self.live.push((self.next, k as u64));
        }
    }

    /// One single-node workload ends and another is placed.
    pub fn churn(&mut self) {
        if !self.live.is_empty() {
            let (id, k) = self.live.swap_remove(self.rng.random_range(0..self.live.len()));
            self.engine.release(id).expect("live allocation");
            self.held -= k;
        }
        self.start_one();
    }

    /// The share of the fleet's GPUs held by single-node work.
    pub fn load(&self) -> f64 {
        self.held as f64 / self.engine.fleet().gpu_count() as f64
    }

    /// A fresh id for a gang.
    pub fn next_id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gang_setup_fills_and_churns() {
        let mut s = GangSetup::new(320, 0.75, 1);
        assert_eq!(s.engine.fleet().levels.domains(0).len(), 20);
        assert!(s.load() >= 0.75, "{}", s.load());
        for _ in 0..50 {
            s.churn();
        }
        for (_, g) in gang_forms() {
            let id = s.next_id();
            if s.engine.place_gang(id, &g).is_ok() {
                s.engine.release_gang(id).unwrap();
            }
        }
    }

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
            gang_permille: 0,
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
        assert_eq!(r.gangs_placed, 0);
    }

    #[test]
    fn gangs_in_the_queue_are_placed_whole_in_the_training_racks() {
        // 32 training nodes: two racks of 16.
        let fleet = std::sync::Arc::new(Fleet::synthetic(120));
        assert_eq!(fleet.levels.names().first().map(String::as_str), Some("rack"));
        let b = CycleBench {
            queued: 400,
            cycles: 60,
            churn: 20,
            tenants: 4,
            policy: "tessera".into(),
            seed: 3,
            gang_permille: 100,
        };
        let r = run(fleet, &b, |s, now| (s.cycle(now), 0.0)).unwrap();
        assert!(r.gangs_placed > 0, "{r:?}");
        assert!(r.gangs_placed < r.placed, "{r:?}");
    }
}
