//! A multi-tenant scenario on a simulated fleet: many tenants with guaranteed shares submit a
//! mixed workload — training gangs of whole GPUs, MIG inference services, fractional
//! notebooks — under saturating demand, through the same [`Scheduler`] the server uses, in
//! simulated time (discrete events). Reports utilisation, queueing delay per priority class
//! and per tenant, preemptions, decision latency, and where idle capacity goes.
//!
//! Demand is closed-loop and saturating: every tenant keeps `outstanding` requests waiting at
//! all times (as a busy team does), so the queue is never empty and every idle GPU unit has a
//! reason.
//!
//! The crate reads no clock: decision latency is measured with the clock the caller passes.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::sync::Arc;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use tessera_model::request::{GangRequest, MigChoice, TopologyConstraint};
use tessera_model::{Fleet, GpuUnits, PoolId, Request, Sharing, TenantId};

use crate::cycle::{Decision, GovernConfig, Job, Movable, Quota, Scheduler};
use crate::engine::Engine;
use crate::replay::make_policy;

/// Scenario settings.
#[derive(Clone, Debug)]
pub struct ScenarioConfig {
    pub tenants: usize,
    pub hours: f64,
    /// Requests each tenant keeps waiting in each pool.
    pub outstanding: usize,
    pub seed: u64,
    /// Hours excluded from the averages at the start.
    pub warmup_hours: f64,
    /// The scheduler's settings ([`scenario_govern`] by default).
    pub govern: GovernConfig,
    /// Whether work is marked movable (half the training gangs restartable, services
    /// replaceable) for consolidation to move.
    pub movable: bool,
    /// Per mille of the training requests that are multi-node gangs ([`draw_gang`]: 16 or 32
    /// whole GPUs as 2 or 4 whole 8-GPU nodes, a rack preferred); 0: none.
    pub multi_node_permille: u32,
    /// Serve the queue largest request first within a priority class
    /// ([`LargestFirst`](crate::cycle::plugins::LargestFirst)) instead of by fair share.
    pub largest_first: bool,
}

/// The scheduler settings the scenario runs with: the server's defaults, with a minimum
/// runtime of 10 minutes, a backfill window of 30 minutes, and the churn limits of a busy
/// fleet: work runs at least 4 h (opportunistic, standard) or 2 h (high) before it can be
/// preempted, a high request preempts after waiting 30 min, a standard one after 4 h (critical
/// at once), and a tenant within its guarantee reclaims after waiting 4 h (capacity frees by
/// itself sooner, and fair share gives it to the least-served tenants first).
pub fn scenario_govern() -> GovernConfig {
    let h = 3_600_000;
    let mut g = GovernConfig {
        min_runtime_ms: 10 * 60_000,
        backfill_max_wait_ms: 30 * 60_000,
        reclaim_after_ms: 4 * h,
        ..Default::default()
    };
    for c in &mut g.classes {
        let (min, after) = match c.name.as_str() {
            "high" => (Some(2 * h), Some(h / 2)),
            "standard" => (Some(4 * h), Some(4 * h)),
            "opportunistic" => (Some(4 * h), None),
            _ => (None, None),
        };
        c.min_runtime_ms = min;
        c.preempt_after_ms = after;
    }
    g
}

impl Default for ScenarioConfig {
    fn default() -> Self {
        ScenarioConfig {
            tenants: 40,
            hours: 48.0,
            outstanding: 4,
            seed: 1,
            warmup_hours: 6.0,
            govern: scenario_govern(),
            movable: true,
            multi_node_permille: 100,
            largest_first: false,
        }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Delay {
    /// Placements after warm-up (the waits below are theirs).
    pub placed: u64,
    /// Times this group's running work was preempted (whole run).
    pub preempted: u64,
    pub mean_wait_s: f64,
    pub p50_wait_s: f64,
    pub p95_wait_s: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct PoolReport {
    pub pool: String,
    pub sharing: String,
    pub units: f64,
    /// Time-weighted mean of allocated ÷ total, after warm-up.
    pub allocated_pct: f64,
    /// Where the idle units went (time-weighted % of the pool): free units while a waiting
    /// request could not use them because no single GPU/node had room (`fragmentation`), or
    /// because the only waiting requests were blocked by a limit, reservation or host resources
    /// (`blocked`).
    pub idle_fragmentation_pct: f64,
    pub idle_blocked_pct: f64,
    /// Preemptions of work in this pool, by cause code (whole run).
    pub preempted: BTreeMap<String, u64>,
}

/// Requests still waiting at the end of a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Backlog {
    pub count: u64,
    /// Mean and largest time waited so far.
    pub mean_age_s: f64,
    pub max_age_s: f64,
}

/// [`Backlog`] of the training requests in `meta` not running at `now` (`running`), by size.
fn backlog<'a>(
    meta: impl Iterator<Item = (&'a u64, &'a Meta)>,
    running: impl Fn(u64) -> bool,
    now: i64,
) -> BTreeMap<u32, Backlog> {
    let mut ages: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
    for (id, m) in meta {
        if m.kind != 0 || running(*id) {
            continue;
        }
        ages.entry(m.gpus())
            .or_default()
            .push((now - m.submitted_ms) as f64 / 1000.0);
    }
    ages.into_iter()
        .map(|(g, a)| {
            let count = a.len() as u64;
            let max_age_s = a.iter().copied().fold(0.0, f64::max);
            let mean_age_s = a.iter().sum::<f64>() / count as f64;
            (
                g,
                Backlog {
                    count,
                    mean_age_s,
                    max_age_s,
                },
            )
        })
        .collect()
}

/// Consolidation moves over the whole run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Moves {
    /// Restartable batch work stopped and requeued.
    pub restarted: u64,
    /// Services moved by starting a replacement first.
    pub replaced: u64,
}

/// Churn of one priority class over the whole run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Churn {
    /// Placements, a requeued victim's again included.
    pub placements: u64,
    /// Times this class's running work was preempted.
    pub preempted: u64,
    /// `preempted` ÷ `placements`, in %.
    pub preempted_pct: f64,
    /// Preemptions this class's requests caused, by cause code (`priority`, `reclaim`).
    pub caused: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ScenarioReport {
    pub tenants: usize,
    pub hours: f64,
    /// The queue's order within a priority class: `fair-share` or `largest-first`.
    pub order: &'static str,
    /// Reservations per pool at once (`GovernConfig::holds_per_pool`).
    pub holds_per_pool: usize,
    pub gpus: u64,
    pub submitted: u64,
    pub placed: u64,
    pub completed: u64,
    pub preemptions: u64,
    /// Time-weighted mean of allocated GPU units ÷ fleet units, after warm-up.
    pub allocated_pct: f64,
    pub pools: Vec<PoolReport>,
    pub by_priority: BTreeMap<String, Delay>,
    /// Placements and preemptions per priority class (whole run).
    pub churn: BTreeMap<String, Churn>,
    /// Preemptions ÷ placements, in % (whole run).
    pub preemptions_pct: f64,
    /// Queueing delay of 8-GPU training gangs on one node (after warm-up).
    pub gang8: Delay,
    /// Queueing delay of single-node training requests by size in whole GPUs (after warm-up):
    /// in this closed loop, a size that waits less leaves its tenants' outstanding slots to the
    /// others, so the waits say how the pool's order shares the queue between sizes.
    pub training_by_gpus: BTreeMap<u32, Delay>,
    /// Queueing delay of multi-node training gangs by size in GPUs (after warm-up).
    pub multi_node: BTreeMap<u32, Delay>,
    /// Training requests still waiting when the run ends, by size in GPUs (gangs by their
    /// total): the waits above count only placed requests, so a size the pool serves slowly
    /// piles up here, unplaced and unmeasured, in this closed loop.
    pub training_waiting_at_end: BTreeMap<u32, Backlog>,
    /// Training requests submitted over the whole run, by size in GPUs (gangs by their total).
    pub training_submitted: BTreeMap<u32, u64>,
    /// Consolidation moves (whole run).
    pub moves: Moves,
    pub by_tenant: BTreeMap<String, Delay>,
    /// Wall-clock latency of scheduler decisions (submit and cycle calls).
    pub decision_p50_us: f64,
    pub decision_p99_us: f64,
    pub max_queued: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Ev {
    /// A job finishes its run.
    Finish(u64),
    /// A preempted job has stopped (after its grace period).
    Stopped(u64),
    /// Periodic scheduler tick and sample.
    Tick,
    /// A moved service's replacement runs: the original stops.
    Replaced(u64),
}

struct Meta {
    tenant: usize,
    kind: usize,
    priority: &'static str,
    duration_ms: i64,
    submitted_ms: i64,
    request: Request,
    generation: u32,
    movable: Option<Movable>,
    gang: Option<GangRequest>,
}

impl Meta {
    /// Whole GPUs asked for ([`whole_gpus`](crate::cycle::whole_gpus)).
    fn gpus(&self) -> u32 {
        crate::cycle::whole_gpus(self.gang.as_ref(), &self.request)
    }
}

fn delay(mut waits: Vec<f64>) -> Delay {
    if waits.is_empty() {
        return Delay::default();
    }
    waits.sort_by(f64::total_cmp);
    let n = waits.len();
    Delay {
        placed: n as u64,
        preempted: 0,
        mean_wait_s: waits.iter().sum::<f64>() / n as f64,
        p50_wait_s: waits[n / 2],
        p95_wait_s: waits[(n * 95 / 100).min(n - 1)],
    }
}

/// Draws one request of the mixed workload.
/// One request of the scenario's mix, as its tenants draw them: `kind` 0 is a training gang of
/// whole GPUs (1–8, pool `training`, 2–12 h), 1 a MIG inference service (pool `serving`,
/// 1–8 h), 2 a fractional notebook (pool `development`, 30 min – 4 h); with its duration (ms)
/// and priority class. Other tests and tools reuse it to load a fleet the same way.
pub fn draw(fleet: &Fleet, kind: usize, rng: &mut ChaCha8Rng) -> (Request, i64, &'static str) {
    let pool = |name: &str| fleet.pool_by_name(name);
    let h = 3_600_000i64;
    let priority = match rng.random_range(0..100) {
        0..2 => "critical",
        2..12 => "high",
        12..90 => "standard",
        _ => "opportunistic",
    };
    let (req, dur) = if kind == 0 {
        // Training gangs of whole GPUs.
        let g = [1u8, 2, 4, 8, 8][rng.random_range(0..5)];
        let mut r = Request::whole(g).with_host(g as u64 * 12_000, g as u64 * 128 * 1024);
        r.pool = pool("training");
        (r, rng.random_range(2 * h..12 * h))
    } else if kind == 1 {
        // MIG inference services.
        let name = [
            "1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb", "3g.40gb", "4g.40gb", "7g.80gb",
        ][rng.random_range(0..7)];
        let mut r = Request::new(tessera_model::Shape::Mig(
            MigChoice::resolve(&fleet.catalogue, name).expect("profile"),
        ));
        r.cpu_milli = 4000;
        r.memory_mib = 32 * 1024;
        r.pool = pool("serving");
        (r, rng.random_range(h..8 * h))
    } else {
        // Fractional notebooks and small jobs.
        let m = [100u16, 250, 250, 500, 500, 750][rng.random_range(0..6)];
        let mut r = Request::fraction(m).with_host(2000, 8 * 1024);
        r.pool = pool("development");
        (r, rng.random_range(h / 2..4 * h))
    };
    (req, dur, priority)
}

/// A multi-node training gang (pool `training`, 4–16 h): 16 or 32 whole GPUs as whole 8-GPU
/// nodes, preferring one rack; its node-share's request (8 whole GPUs with host resources), the
/// gang, its duration (ms) and its priority class (as [`draw`]'s).
pub fn draw_gang(fleet: &Fleet, rng: &mut ChaCha8Rng) -> (Request, GangRequest, i64, &'static str) {
    let h = 3_600_000i64;
    let (_, _, priority) = draw(fleet, 0, rng);
    let gpus = [16u32, 32][rng.random_range(0..2)];
    let mut share = Request::whole(8).with_host(8 * 12_000, 8 * 128 * 1024);
    share.pool = fleet.pool_by_name("training");
    let gang = GangRequest::whole_nodes(gpus).with_topology(TopologyConstraint::preferred("rack"));
    (share, gang, rng.random_range(4 * h..16 * h), priority)
}

/// What the scenario counts as decisions come back.
#[derive(Default)]
struct Tally {
    placed: u64,
    preemptions: u64,
    waits_prio: BTreeMap<String, Vec<f64>>,
    waits_tenant: BTreeMap<String, Vec<f64>>,
    waits_gang8: Vec<f64>,
    waits_training: BTreeMap<u32, Vec<f64>>,
    waits_multi: BTreeMap<u32, Vec<f64>>,
    victims: BTreeMap<String, u64>,
    churn: BTreeMap<String, Churn>,
    moves: Moves,
    pool_preempted: HashMap<PoolId, BTreeMap<String, u64>>,
}

/// The scenario's bookkeeping between events.
struct World {
    meta: HashMap<u64, Meta>,
    events: BinaryHeap<Reverse<(i64, Ev, u32)>>,
    outstanding: Vec<[usize; 3]>,
    warm_ms: i64,
    grace_ms: i64,
    t: Tally,
}

impl World {
    fn handle(&mut self, acts: Vec<Decision>, now: i64) {
        for a in acts {
            match a {
                Decision::Placed { id, .. } | Decision::PlacedGang { id, .. } => {
                    let m = self.meta.get_mut(&id).expect("known job");
                    self.t.placed += 1;
                    self.t.churn.entry(m.priority.to_string()).or_default().placements += 1;
                    self.outstanding[m.tenant][m.kind] = self.outstanding[m.tenant][m.kind].saturating_sub(1);
                    if now >= self.warm_ms {
                        let w = (now - m.submitted_ms) as f64 / 1000.0;
                        self.t.waits_prio.entry(m.priority.to_string()).or_default().push(w);
                        self.t
                            .waits_tenant
                            .entry(format!("team-{:02}", m.tenant))
                            .or_default()
                            .push(w);
                        match &m.gang {
                            Some(g) => self.t.waits_multi.entry(g.gpus).or_default().push(w),
                            None => {
                                if let tessera_model::Shape::Whole { gpus } = m.request.shape {
                                    self.t.waits_training.entry(u32::from(gpus)).or_default().push(w);
                                    if gpus == 8 {
                                        self.t.waits_gang8.push(w);
                                    }
                                }
                            }
                        }
                    }
                    m.generation += 1;
                    self.events
                        .push(Reverse((now + m.duration_ms, Ev::Finish(id), m.generation)));
                }
                Decision::Preempt { victim, by, cause } => {
                    self.t.preemptions += 1;
                    if let Some(b) = self.meta.get(&by) {
                        *self
                            .t
                            .churn
                            .entry(b.priority.to_string())
                            .or_default()
                            .caused
                            .entry(cause.code().to_string())
                            .or_default() += 1;
                    }
                    let m = self.meta.get_mut(&victim).expect("known job");
                    self.t.churn.entry(m.priority.to_string()).or_default().preempted += 1;
                    if let Some(p) = m.request.pool {
                        *self
                            .t
                            .pool_preempted
                            .entry(p)
                            .or_default()
                            .entry(cause.code().to_string())
                            .or_default() += 1;
                    }
                    *self.t.victims.entry(format!("team-{:02}", m.tenant)).or_default() += 1;
                    m.generation += 1;
                    self.events
                        .push(Reverse((now + self.grace_ms, Ev::Stopped(victim), m.generation)));
                }
                Decision::Refused { id, .. } => {
                    let m = self.meta.get(&id).expect("known job");
                    self.outstanding[m.tenant][m.kind] = self.outstanding[m.tenant][m.kind].saturating_sub(1);
                }
                Decision::Move { id, to, .. } => {
                    let m = self.meta.get_mut(&id).expect("known job");
                    if to.is_some() {
                        // The replacement starts; the original keeps its end time.
                        self.t.moves.replaced += 1;
                        self.events
                            .push(Reverse((now + self.grace_ms, Ev::Replaced(id), m.generation)));
                    } else {
                        self.t.moves.restarted += 1;
                        m.generation += 1;
                        self.events
                            .push(Reverse((now + self.grace_ms, Ev::Stopped(id), m.generation)));
                    }
                }
                Decision::Waiting { .. } => {}
            }
        }
    }
}

/// Runs the scenario on `fleet` (the `seed` fleet's pool names are used for the mix). `clock`
/// reads a monotonic clock in nanoseconds; it times the scheduler's decisions and nothing else,
/// so the simulation itself does not depend on it.
pub fn run(fleet: Arc<Fleet>, cfg: &ScenarioConfig, clock: &mut dyn FnMut() -> u64) -> ScenarioReport {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let policy = make_policy("tessera", &[]).expect("built-in policy");
    let gov = cfg.govern.clone();
    let mut s = Scheduler::new(Engine::new(fleet.clone(), policy, cfg.seed), gov);
    if cfg.largest_first {
        s = s.with_plugins(crate::cycle::Plugins {
            queue_order: Box::new(crate::cycle::plugins::LargestFirst),
            ..Default::default()
        });
    }
    let tenants: Vec<String> = (0..cfg.tenants).map(|i| format!("team-{i:02}")).collect();
    // Guarantees: an equal share of each pool; borrowing up to the whole pool.
    for p in &fleet.pools {
        let units: u64 = fleet.nodes[p.nodes.start as usize..p.nodes.end as usize]
            .iter()
            .map(|n| n.gpus as u64)
            .sum();
        for t in &tenants {
            let g = GpuUnits(units * 1000 / cfg.tenants as u64);
            s.set_quota(
                t,
                &p.name,
                Some(Quota {
                    guaranteed: g,
                    limit: None,
                }),
            );
        }
    }
    let pools: Vec<(PoolId, f64)> = fleet
        .pools
        .iter()
        .enumerate()
        .map(|(i, p)| {
            (
                PoolId(i as u16),
                fleet.nodes[p.nodes.start as usize..p.nodes.end as usize]
                    .iter()
                    .map(|n| n.gpus as f64)
                    .sum(),
            )
        })
        .collect();
    let total_units: f64 = pools.iter().map(|p| p.1).sum();
    let end_ms = (cfg.hours * 3_600_000.0) as i64;
    let warm_ms = (cfg.warmup_hours * 3_600_000.0) as i64;
    let tick_ms = 60_000;
    let grace_ms = 30_000;

    let mut w = World {
        meta: HashMap::new(),
        events: BinaryHeap::new(),
        outstanding: vec![[0usize; 3]; cfg.tenants],
        warm_ms,
        grace_ms,
        t: Tally::default(),
    };
    let mut next_id = 1u64;
    let mut now = 0i64;
    let mut decision_ns: Vec<u64> = Vec::new();
    let (mut submitted, mut completed) = (0u64, 0u64);
    let mut training_submitted: BTreeMap<u32, u64> = BTreeMap::new();
    let mut max_queued = 0;
    // Time integrals after warm-up: allocated, fragmentation-idle, blocked-idle per pool.
    let mut integ = vec![(0.0f64, 0.0f64, 0.0f64); pools.len()];
    let mut last_sample = warm_ms;
    w.events.push(Reverse((0, Ev::Tick, 0)));

    while let Some(Reverse((t, ev, generation))) = w.events.pop() {
        if t > end_ms {
            break;
        }
        // Integrate the state over [last_sample, t).
        if t > last_sample {
            let dt = (t - last_sample) as f64;
            let queue: Vec<&Job> = s.queue().collect();
            let st = s.engine.state();
            for (i, &(pid, units)) in pools.iter().enumerate() {
                let p = fleet.pool(pid);
                let nodes = &st.nodes[p.nodes.start as usize..p.nodes.end as usize];
                let used: f64 = nodes
                    .iter()
                    .flat_map(|n| n.gpus.iter())
                    .map(|g| g.used_milli as f64 / 1000.0)
                    .sum();
                let free = units - used;
                integ[i].0 += used / units * dt;
                let waiting: Vec<&Job> = queue.iter().copied().filter(|j| j.request.pool == Some(pid)).collect();
                if free > 0.0 && !waiting.is_empty() {
                    let fits_total = waiting
                        .iter()
                        .any(|j| j.request.units(&fleet.catalogue).as_f64() <= free);
                    if fits_total {
                        integ[i].1 += free / units * dt;
                    } else {
                        integ[i].2 += free / units * dt;
                    }
                }
            }
            last_sample = t;
        }
        now = t;
        let mut acts = Vec::new();
        match ev {
            Ev::Finish(id) | Ev::Stopped(id) => {
                let Some(m) = w.meta.get(&id) else { continue };
                if m.generation != generation {
                    continue;
                }
                let timer = clock();
                s.release(id, now);
                if matches!(ev, Ev::Stopped(_)) {
                    // Preempted work is requeued, keeping its submission time.
                    let m = w.meta.get(&id).expect("known");
                    s.enqueue(Job {
                        id,
                        tenant: tenants[m.tenant].clone(),
                        project: "p".into(),
                        request: m.request.clone(),
                        priority: m.priority.into(),
                        submitted_ms: m.submitted_ms,
                        wait_if_over_limit: true,
                        min_runtime_ms: None,
                        movable: m.movable,
                        gang: m.gang.clone(),
                        duration_ms: Some(m.duration_ms),
                    });
                    w.outstanding[m.tenant][m.kind] += 1;
                } else {
                    completed += 1;
                    w.meta.remove(&id);
                }
                acts.extend(s.cycle(now));
                decision_ns.push(clock().saturating_sub(timer));
            }
            Ev::Replaced(id) => {
                let Some(m) = w.meta.get(&id) else { continue };
                if m.generation != generation {
                    continue;
                }
                let timer = clock();
                s.replaced(id);
                acts.extend(s.cycle(now));
                decision_ns.push(clock().saturating_sub(timer));
            }
            Ev::Tick => {
                // Top up every tenant's outstanding requests (saturating, closed-loop demand).
                // Tenants arrive in a different order every minute.
                let mut order: Vec<usize> = (0..cfg.tenants).collect();
                order.shuffle(&mut rng);
                for ti in order {
                    for kind in 0..3 {
                        while w.outstanding[ti][kind] < cfg.outstanding {
                            let multi = kind == 0
                                && cfg.multi_node_permille > 0
                                && rng.random_range(0..1000) < cfg.multi_node_permille;
                            let (mut request, gang, duration_ms, priority) = if multi {
                                let (r, g, d, p) = draw_gang(&fleet, &mut rng);
                                (r, Some(g), d, p)
                            } else {
                                let (r, d, p) = draw(&fleet, kind, &mut rng);
                                (r, None, d, p)
                            };
                            // Half the training gangs on one node checkpoint and may be restarted
                            // elsewhere; services may be moved by replacement; notebooks and
                            // multi-node gangs never move.
                            let restartable = kind == 0 && gang.is_none() && rng.random_bool(0.5);
                            let movable = match kind {
                                0 if cfg.movable && restartable => Some(Movable::Restart),
                                1 if cfg.movable => Some(Movable::Replace),
                                _ => None,
                            };
                            request.tenant = Some(TenantId(ti as u32));
                            let id = next_id;
                            next_id += 1;
                            w.meta.insert(
                                id,
                                Meta {
                                    tenant: ti,
                                    kind,
                                    priority,
                                    duration_ms,
                                    submitted_ms: now,
                                    request: request.clone(),
                                    generation: 0,
                                    movable,
                                    gang: gang.clone(),
                                },
                            );
                            w.outstanding[ti][kind] += 1;
                            submitted += 1;
                            if kind == 0 {
                                *training_submitted.entry(w.meta[&id].gpus()).or_default() += 1;
                            }
                            let job = Job {
                                id,
                                tenant: tenants[ti].clone(),
                                project: "p".into(),
                                request,
                                priority: priority.into(),
                                submitted_ms: now,
                                wait_if_over_limit: true,
                                min_runtime_ms: None,
                                movable,
                                gang,
                                duration_ms: Some(duration_ms),
                            };
                            let timer = clock();
                            let a = s.submit(job, now);
                            decision_ns.push(clock().saturating_sub(timer));
                            w.handle(a, now);
                        }
                    }
                }
                let timer = clock();
                acts.extend(s.cycle(now));
                decision_ns.push(clock().saturating_sub(timer));
                w.events.push(Reverse((now + tick_ms, Ev::Tick, 0)));
            }
        }
        max_queued = max_queued.max(s.queued());
        w.handle(acts, now);
    }
    let span = (end_ms.min(now.max(warm_ms)) - warm_ms).max(1) as f64;
    let queued: std::collections::HashSet<u64> = s.queue().map(|j| j.id).collect();
    let training_waiting_at_end = backlog(w.meta.iter(), |id| !queued.contains(&id), now);
    let Tally {
        placed,
        preemptions,
        waits_prio,
        waits_tenant,
        waits_gang8,
        waits_training,
        waits_multi,
        victims,
        mut churn,
        moves,
        mut pool_preempted,
    } = w.t;
    let pool_reports: Vec<PoolReport> = pools
        .iter()
        .enumerate()
        .map(|(i, &(pid, units))| {
            let p = fleet.pool(pid);
            PoolReport {
                pool: p.name.clone(),
                sharing: p.sharing.to_string(),
                units,
                allocated_pct: 100.0 * integ[i].0 / span,
                idle_fragmentation_pct: 100.0 * integ[i].1 / span,
                idle_blocked_pct: 100.0 * integ[i].2 / span,
                preempted: pool_preempted.remove(&pid).unwrap_or_default(),
            }
        })
        .collect();
    let allocated_pct = pool_reports.iter().map(|p| p.allocated_pct * p.units).sum::<f64>() / total_units;
    decision_ns.sort_unstable();
    let pct = |q: f64| {
        decision_ns
            .get(((decision_ns.len() as f64 - 1.0) * q) as usize)
            .map(|&n| n as f64 / 1000.0)
            .unwrap_or(0.0)
    };
    for c in churn.values_mut() {
        c.preempted_pct = 100.0 * c.preempted as f64 / c.placements.max(1) as f64;
    }
    let by_priority = waits_prio
        .into_iter()
        .map(|(k, v)| {
            let preempted = churn.get(&k).map_or(0, |c| c.preempted);
            (k, Delay { preempted, ..delay(v) })
        })
        .collect();
    ScenarioReport {
        tenants: cfg.tenants,
        hours: cfg.hours,
        order: if cfg.largest_first {
            "largest-first"
        } else {
            "fair-share"
        },
        holds_per_pool: cfg.govern.holds_per_pool,
        gpus: fleet.gpu_count(),
        submitted,
        placed,
        completed,
        preemptions,
        allocated_pct,
        pools: pool_reports,
        by_priority,
        churn,
        preemptions_pct: 100.0 * preemptions as f64 / placed.max(1) as f64,
        gang8: delay(waits_gang8),
        training_by_gpus: waits_training.into_iter().map(|(g, w)| (g, delay(w))).collect(),
        multi_node: waits_multi.into_iter().map(|(g, w)| (g, delay(w))).collect(),
        training_waiting_at_end,
        training_submitted,
        moves,
        by_tenant: waits_tenant
            .into_iter()
            .map(|(k, v)| {
                let p = victims.get(&k).copied().unwrap_or(0);
                (
                    k,
                    Delay {
                        preempted: p,
                        ..delay(v)
                    },
                )
            })
            .collect(),
        decision_p50_us: pct(0.5),
        decision_p99_us: pct(0.99),
        max_queued,
    }
}

/// Pools of the seed fleet the mix uses must exist.
pub fn check_fleet(fleet: &Fleet) -> Result<(), String> {
    for (name, sharing) in [
        ("training", Sharing::Whole),
        ("serving", Sharing::Mig),
        ("development", Sharing::Shared),
    ] {
        match fleet.pool_by_name(name) {
            Some(p) if fleet.pool(p).sharing == sharing => {}
            _ => {
                return Err(format!(
                    "the scenario needs a `{name}` pool shared by `{sharing}` (as in the seed fleet)"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_scenario_is_deterministic_and_busy() {
        let fleet = Arc::new(Fleet::seed());
        let cfg = ScenarioConfig {
            tenants: 8,
            hours: 8.0,
            outstanding: 3,
            seed: 3,
            warmup_hours: 2.0,
            ..Default::default()
        };
        // A clock that advances 3 µs per reading: every decision reads it twice.
        let ticks = || {
            let mut t = 0u64;
            move || {
                t += 3_000;
                t
            }
        };
        let a = run(fleet.clone(), &cfg, &mut ticks());
        let b = run(fleet, &cfg, &mut ticks());
        assert_eq!(a.placed, b.placed);
        assert_eq!(a.preemptions, b.preemptions);
        assert_eq!(a.by_priority.len(), b.by_priority.len());
        assert_eq!(
            (a.decision_p50_us, a.decision_p99_us),
            (3.0, 3.0),
            "latency comes from the clock passed in"
        );
        assert!(
            a.allocated_pct > 70.0,
            "saturating demand keeps the fleet busy: {:.1} %",
            a.allocated_pct
        );
        assert!(a.by_priority.contains_key("standard"));
        assert!(
            a.preemptions_pct <= 10.0,
            "churn: {:.1} % of placements",
            a.preemptions_pct
        );
        assert!(a.moves.replaced > 0, "consolidation moves services: {:?}", a.moves);
        for p in &a.pools {
            assert!(
                p.allocated_pct + p.idle_fragmentation_pct + p.idle_blocked_pct <= 100.0 + 1e-6,
                "{p:?}"
            );
        }
    }

    /// The order reaches the scheduler: with a hold on every node, served largest first, a
    /// larger part of the training pool's placements are 8-GPU requests than by fair share
    /// (seeds 1–3 of this small run: 23 → 29 %, 11 → 18 %, 22 → 51 %).
    #[test]
    fn largest_first_with_holds_gives_whole_node_requests_a_larger_part_of_the_placements() {
        let fleet = Arc::new(Fleet::seed());
        let part_of_eights = |largest_first: bool, holds: usize| {
            let mut cfg = ScenarioConfig {
                tenants: 8,
                hours: 12.0,
                seed: 2,
                warmup_hours: 2.0,
                multi_node_permille: 0,
                largest_first,
                ..Default::default()
            };
            cfg.govern.holds_per_pool = holds;
            let r = run(fleet.clone(), &cfg, &mut || 0);
            let all: u64 = r.training_by_gpus.values().map(|d| d.placed).sum();
            let eights = r.training_by_gpus.get(&8).map_or(0, |d| d.placed);
            assert!(all > 0 && eights > 0, "{:?}", r.training_by_gpus);
            eights as f64 / all as f64
        };
        let (fair, largest) = (part_of_eights(false, 16), part_of_eights(true, 16));
        assert!(
            largest > fair,
            "largest first {largest:.2} against fair share {fair:.2}"
        );
    }

    #[test]
    fn the_backlog_counts_waiting_training_requests_by_size_with_their_ages() {
        let h = 3_600_000;
        let meta = |kind: usize, gpus: u8, submitted_ms: i64, gang: Option<GangRequest>| Meta {
            tenant: 0,
            kind,
            priority: "standard",
            duration_ms: h,
            submitted_ms,
            request: Request::whole(gpus),
            generation: 0,
            movable: None,
            gang,
        };
        let m: HashMap<u64, Meta> = [
            (1, meta(0, 8, 0, None)),
            (2, meta(0, 8, 6 * h, None)),
            (3, meta(0, 8, 9 * h, None)), // running
            (4, meta(0, 1, 8 * h, None)),
            (5, meta(0, 8, 4 * h, Some(GangRequest::whole_nodes(32)))),
            (6, meta(2, 1, 0, None)), // not training
        ]
        .into_iter()
        .collect();
        let b = backlog(m.iter(), |id| id == 3, 10 * h);
        let hs = |x: f64| x * 3600.0;
        assert_eq!(
            b.get(&8),
            Some(&Backlog {
                count: 2,
                mean_age_s: hs(7.0),
                max_age_s: hs(10.0)
            })
        );
        assert_eq!(
            b.get(&1),
            Some(&Backlog {
                count: 1,
                mean_age_s: hs(2.0),
                max_age_s: hs(2.0)
            })
        );
        assert_eq!(b.get(&32).map(|x| x.count), Some(1));
        assert_eq!(b.len(), 3);
    }

    #[test]
    fn multi_node_gangs_in_the_demand_are_placed_and_their_waits_reported_by_size() {
        let fleet = Arc::new(Fleet::seed());
        let cfg = ScenarioConfig {
            tenants: 4,
            hours: 24.0,
            outstanding: 2,
            seed: 5,
            warmup_hours: 2.0,
            multi_node_permille: 500,
            ..Default::default()
        };
        let r = run(fleet.clone(), &cfg, &mut || 0);
        let placed: u64 = r.multi_node.values().map(|d| d.placed).sum();
        assert!(placed > 0, "{:?}", r.multi_node);
        assert!(r.multi_node.keys().all(|g| [16, 32].contains(g)), "{:?}", r.multi_node);
        let none = run(
            fleet,
            &ScenarioConfig {
                multi_node_permille: 0,
                ..cfg
            },
            &mut || 0,
        );
        assert!(none.multi_node.is_empty());
    }
}
