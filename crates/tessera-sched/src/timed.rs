//! Time-based replay: requests arrive at their own times, queue through the real scheduler
//! cycle ([`Scheduler`]: admit, allocate with backfill, reclaim, preempt) and leave after their
//! run, on a simulated event-driven clock (no wall-clock sleeping).
//!
//! The demand is a list of [`Arrival`]s (built from the openb trace by [`trace_arrivals`], or by
//! the capacity planner from the scenario model or a usage ledger). The loop takes the earliest
//! event time, applies every departure and arrival at that instant, then runs one scheduler
//! cycle (and, optionally, a cycle every `tick_ms` while requests wait). After the last arrival
//! it keeps going until the queue has drained, so every admitted request gets a wait.
//!
//! **The trace's times.** An openb pod has `creation_time` (when it was submitted),
//! `scheduled_time` (when the trace's cluster started it; empty for pods that stayed `Pending`)
//! and `deletion_time`. A pod arrives at `creation_time` and, once *this* scheduler starts it,
//! holds its capacity for `deletion_time − scheduled_time` (the run the trace observed; for a
//! never-scheduled pod, `deletion_time − creation_time`, the only lifetime the trace gives).
//! Replaying the absolute `deletion_time` instead would let queueing shorten work (a pod that
//! waits longer here would run less, or not at all), so a smaller fleet would look better than
//! it is; keeping the run length keeps the GPU-seconds of the demand fixed.
//!
//! **Gangs.** An arrival with a [`GangRequest`] is submitted as a multi-node gang (its
//! `request` is then not read): once placed ([`Decision::PlacedGang`]) all its node-shares
//! start together, hold all their GPUs and end together `run_ms` later, when every share is
//! released; its wait, its start and its allocation count once, for the whole gang.
//!
//! **Measured window.** With [`TimedConfig::window_ms`] the waits (overall, per class) count
//! only requests that arrive in the window, and allocation is averaged over the window; every
//! request still runs (the rest is warm-up and drain).
//!
//! A preempted request is stopped at once (no grace period in simulated time), put back in the
//! queue, and later runs its whole length again (its work is lost); its wait counts once, up
//! to its first start.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::sync::Arc;

use serde::Serialize;
use tessera_model::{Catalogue, Fleet, FleetError, GangRequest, GpuUnits, ModelId, Request};

use crate::cycle::{Decision, GovernConfig, Job, Scheduler};
use crate::engine::{Engine, demand_of};
use crate::reason::Refusal;
use crate::replay::{Pod, csv_header, make_policy, parse_pods};

/// One request of a timed demand.
#[derive(Clone, Debug, PartialEq)]
pub struct Arrival {
    pub name: String,
    pub tenant: String,
    /// The group its waits are reported under (the trace's QoS, or a priority class).
    pub class: String,
    /// The scheduler's priority class (`standard` when the demand has none).
    pub priority: String,
    pub request: Request,
    /// A gang beyond one node: submitted as a gang instead of `request` (see the module doc).
    pub gang: Option<GangRequest>,
    /// Arrival time, ms of simulated time.
    pub arrive_ms: i64,
    /// How long it holds its capacity once started, ms.
    pub run_ms: i64,
}

/// Settings of a timed replay.
#[derive(Clone, Debug)]
pub struct TimedConfig {
    /// Placement policy for shared pools ([`crate::replay::POLICIES`]).
    pub policy: String,
    pub seed: u64,
    pub govern: GovernConfig,
    /// Also run a cycle this often while requests wait (0: only at arrivals and departures).
    pub tick_ms: i64,
    /// Points in the sampled allocation series.
    pub samples: usize,
    /// Measure waits over the requests arriving in `[start, end)` ms only, and allocation over
    /// that span (`None`: every request, from the first arrival to the last departure).
    pub window_ms: Option<(i64, i64)>,
}

impl Default for TimedConfig {
    fn default() -> Self {
        TimedConfig {
            policy: "tessera".into(),
            seed: 1,
            govern: GovernConfig::default(),
            tick_ms: 0,
            samples: 100,
            window_ms: None,
        }
    }
}

/// Wait statistics of a group of requests, in seconds (nearest-rank percentiles).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WaitStats {
    pub placed: u64,
    pub mean_s: f64,
    pub p50_s: f64,
    pub p95_s: f64,
    pub p99_s: f64,
    pub max_s: f64,
}

impl WaitStats {
    /// Statistics of `waits` (seconds, any order).
    pub fn of(mut waits: Vec<f64>) -> WaitStats {
        if waits.is_empty() {
            return WaitStats::default();
        }
        waits.sort_by(f64::total_cmp);
        let n = waits.len();
        let rank = |p: f64| waits[((p / 100.0 * n as f64).ceil() as usize).clamp(1, n) - 1];
        WaitStats {
            placed: n as u64,
            mean_s: waits.iter().sum::<f64>() / n as f64,
            p50_s: rank(50.0),
            p95_s: rank(95.0),
            p99_s: rank(99.0),
            max_s: waits[n - 1],
        }
    }
}

/// Refusals of one kind: requests no node of the fleet could ever hold (or over a limit they
/// asked not to wait for).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Refusals {
    /// `constraint`, `quota` or `budget`.
    pub code: String,
    pub count: u64,
    /// Up to three requests and the reason each was refused.
    pub examples: Vec<String>,
}

/// One point of the allocation series.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Sample {
    pub t_s: f64,
    /// Allocated GPU units ÷ fleet GPUs, %.
    pub allocated_pct: f64,
    pub running: u64,
    pub queued: u64,
}

/// What a timed replay measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TimedReport {
    pub gpus: u64,
    pub requests: u64,
    pub placed: u64,
    /// Ran their whole length and left (a gang counts once).
    pub completed: u64,
    pub refused: u64,
    /// Admitted but still waiting once nothing runs and nothing is left to arrive (held back
    /// by a quota, or a reason no departure can clear).
    pub never_placed: u64,
    pub preemptions: u64,
    pub cycles: u64,
    /// From the first arrival to the last departure, simulated seconds.
    pub span_s: f64,
    /// Time-weighted mean of allocated units ÷ fleet GPUs over the span (or the window), %.
    pub allocated_pct: f64,
    pub peak_allocated_pct: f64,
    pub max_queued: u64,
    pub waits: WaitStats,
    pub by_class: BTreeMap<String, WaitStats>,
    /// Preemptions suffered per class.
    pub preempted_by_class: BTreeMap<String, u64>,
    pub refusals: Vec<Refusals>,
    pub series: Vec<Sample>,
}

/// One openb pod with its times and QoS.
#[derive(Clone, Debug, PartialEq)]
pub struct TracePod {
    pub pod: Pod,
    /// Allowed model names as the trace spells them (`gpu_spec`), for fleets whose catalogue
    /// numbers models differently.
    pub model_names: Vec<String>,
    pub qos: String,
    pub creation_s: i64,
    pub deletion_s: i64,
    /// `None` for pods the trace's cluster never started.
    pub scheduled_s: Option<i64>,
}

impl TracePod {
    /// How long it holds capacity once started (see the module doc).
    pub fn run_s(&self) -> i64 {
        self.deletion_s - self.scheduled_s.unwrap_or(self.creation_s)
    }

    /// Its request on `catalogue`'s numbering of models (a model `catalogue` lacks matches no
    /// node, so the request is refused as a constraint).
    pub fn request_on(&self, catalogue: &Catalogue) -> Request {
        let mut p = self.pod.clone();
        p.models = self
            .model_names
            .iter()
            .map(|m| catalogue.find(m).unwrap_or(ModelId(u16::MAX)))
            .collect();
        p.request()
    }
}

/// Parses an openb pod list with its times: the columns of [`parse_pods`] plus
/// `creation_time` and `deletion_time` (required), `scheduled_time` (may be empty) and `qos`
/// (optional), found by header name.
pub fn parse_trace(text: &str, file: &str, catalogue: &Catalogue) -> Result<Vec<TracePod>, FleetError> {
    let pods = parse_pods(text, file, catalogue)?;
    let (header, lines) = csv_header(text);
    let col = |name: &str| header.iter().position(|h| *h == name);
    let need = |name: &str| {
        col(name).ok_or_else(|| {
            FleetError::new(
                file,
                1,
                "header",
                format!("missing column `{name}` (the timed replay needs the pods' times)"),
            )
        })
    };
    let (c_create, c_delete, c_sched) = (need("creation_time")?, need("deletion_time")?, need("scheduled_time")?);
    let (c_qos, c_spec) = (col("qos"), col("gpu_spec"));
    let mut out = Vec::with_capacity(pods.len());
    let mut pods = pods.into_iter();
    for (i, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let lineno = i + 1;
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let time = |c: usize, field: &str| -> Result<i64, FleetError> {
            f[c].parse::<i64>().ok().filter(|t| *t >= 0).ok_or_else(|| {
                FleetError::new(
                    file,
                    lineno,
                    field,
                    format!("`{}` is not a non-negative number of seconds", f[c]),
                )
            })
        };
        let creation_s = time(c_create, "creation_time")?;
        let deletion_s = time(c_delete, "deletion_time")?;
        let scheduled_s = if f[c_sched].is_empty() {
            None
        } else {
            Some(time(c_sched, "scheduled_time")?)
        };
        if deletion_s < creation_s {
            return Err(FleetError::new(
                file,
                lineno,
                "deletion_time",
                format!("{deletion_s} is before creation_time {creation_s}"),
            ));
        }
        if let Some(s) = scheduled_s
            && !(creation_s..=deletion_s).contains(&s)
        {
            return Err(FleetError::new(
                file,
                lineno,
                "scheduled_time",
                format!("{s} is outside creation_time..deletion_time ({creation_s}..{deletion_s})"),
            ));
        }
        let model_names = match c_spec.map(|c| f[c]) {
            Some(spec) if !spec.is_empty() => spec.split('|').map(|m| m.trim().to_string()).collect(),
            _ => Vec::new(),
        };
        out.push(TracePod {
            pod: pods.next().expect("parse_pods read the same rows"),
            model_names,
            qos: c_qos.map(|c| f[c]).filter(|q| !q.is_empty()).unwrap_or("-").to_string(),
            creation_s,
            deletion_s,
            scheduled_s,
        });
    }
    Ok(out)
}

/// The trace as a timed demand on `fleet`: every pod of tenant `openb` at priority `standard`
/// (the trace has no priorities; its QoS is Kubernetes' resource class, reported per class),
/// keeping those created before `days` (if given), then the first `limit` by creation time.
pub fn trace_arrivals(pods: &[TracePod], fleet: &Fleet, days: Option<f64>, limit: Option<usize>) -> Vec<Arrival> {
    let mut order: Vec<&TracePod> = pods
        .iter()
        .filter(|p| days.is_none_or(|d| (p.creation_s as f64) < d * 86_400.0))
        .collect();
    order.sort_by_key(|p| p.creation_s);
    order.truncate(limit.unwrap_or(usize::MAX));
    order
        .into_iter()
        .map(|p| Arrival {
            name: p.pod.name.clone(),
            tenant: "openb".into(),
            class: p.qos.clone(),
            priority: "standard".into(),
            request: p.request_on(&fleet.catalogue),
            gang: None,
            arrive_ms: p.creation_s * 1000,
            run_ms: p.run_s() * 1000,
        })
        .collect()
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
struct Departure {
    at_ms: i64,
    id: u64,
    generation: u32,
}

/// Replays `arrivals` on `fleet` through the scheduler cycle. Errors only on a bad setting
/// (unknown policy).
pub fn run_timed(fleet: Arc<Fleet>, arrivals: &[Arrival], cfg: &TimedConfig) -> Result<TimedReport, String> {
    let prior: Vec<_> = arrivals
        .iter()
        .filter(|a| a.gang.is_none())
        .filter_map(|a| demand_of(&a.request))
        .collect();
    let engine = Engine::new(fleet.clone(), make_policy(&cfg.policy, &prior)?, cfg.seed);
    let mut s = Scheduler::new(engine, cfg.govern.clone());
    let gpus = fleet.gpu_count();
    let capacity = (gpus * 1000).max(1) as f64;

    let mut order: Vec<usize> = (0..arrivals.len()).collect();
    order.sort_by_key(|&i| (arrivals[i].arrive_ms, i));
    let mut next_arrival = 0usize;
    let mut departures: BinaryHeap<Reverse<Departure>> = BinaryHeap::new();
    // Per request (index = id): generation of its current run, first start, units held.
    let mut generation = vec![0u32; arrivals.len()];
    let mut started = vec![None::<i64>; arrivals.len()];
    let mut holding: HashMap<u64, GpuUnits> = HashMap::new();
    let mut allocated: u64 = 0;

    let (mut placed, mut completed, mut preemptions, mut cycles, mut max_queued) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut refusals: BTreeMap<&'static str, Refusals> = BTreeMap::new();
    let mut preempted_by_class: BTreeMap<String, u64> = BTreeMap::new();
    // Step function of (time, allocated milli, running, queued), one point per event instant.
    let mut steps: Vec<(i64, u64, u64, u64)> = Vec::new();
    let mut last_cycle = i64::MIN;

    let job = |i: usize| Job {
        id: i as u64,
        tenant: arrivals[i].tenant.clone(),
        project: "default".into(),
        request: arrivals[i].request.clone(),
        priority: arrivals[i].priority.clone(),
        submitted_ms: arrivals[i].arrive_ms,
        wait_if_over_limit: true,
        min_runtime_ms: None,
        movable: None,
        gang: arrivals[i].gang.clone(),
        duration_ms: Some(arrivals[i].run_ms),
    };

    loop {
        let t_arr = order.get(next_arrival).map(|&i| arrivals[i].arrive_ms);
        let t_dep = departures.peek().map(|Reverse(d)| d.at_ms);
        let t_tick = (cfg.tick_ms > 0 && s.queued() > 0).then(|| last_cycle.saturating_add(cfg.tick_ms));
        let Some(now) = [t_arr, t_dep, t_tick].into_iter().flatten().min() else {
            break;
        };
        while let Some(Reverse(d)) = departures.peek().copied()
            && d.at_ms <= now
        {
            departures.pop();
            if generation[d.id as usize] == d.generation && s.release(d.id, now).is_some() {
                allocated -= holding.remove(&d.id).map_or(0, |u| u.as_milli());
                completed += 1;
            }
        }
        let mut decisions = Vec::new();
        while let Some(&i) = order.get(next_arrival)
            && arrivals[i].arrive_ms <= now
        {
            next_arrival += 1;
            if s.needs_cycle() {
                // Capacity changed: the cycle below decides for the whole queue at once.
                if let Some(r) = s.submit_for_next_cycle(job(i)) {
                    refuse(&mut refusals, &arrivals[i].name, &r);
                }
            } else {
                // Unchanged capacity: only the newcomer can start, and only it is tried.
                decisions.extend(s.submit(job(i), now));
            }
        }
        max_queued = max_queued.max(s.queued() as u64);
        // Decisions can free capacity (preemption) that the next pass uses: a few passes at
        // the same instant, until nothing changes.
        let mut passes = 0;
        loop {
            if passes > 0 || decisions.is_empty() {
                if !((s.needs_cycle() || t_tick == Some(now)) && passes < 8) {
                    break;
                }
                cycles += 1;
                last_cycle = now;
                decisions = s.cycle(now);
            }
            passes += 1;
            for d in std::mem::take(&mut decisions) {
                match d {
                    d @ (Decision::Placed { .. } | Decision::PlacedGang { .. }) => {
                        let (id, units) = match d {
                            Decision::Placed { id, alloc, .. } => (id, alloc.units),
                            Decision::PlacedGang { id, shares, .. } => {
                                (id, shares.iter().fold(GpuUnits::ZERO, |u, a| u + a.units))
                            }
                            _ => unreachable!("matched above"),
                        };
                        let i = id as usize;
                        placed += u64::from(started[i].is_none());
                        started[i].get_or_insert(now);
                        allocated += units.as_milli();
                        holding.insert(id, units);
                        generation[i] += 1;
                        departures.push(Reverse(Departure {
                            at_ms: now + arrivals[i].run_ms.max(0),
                            id,
                            generation: generation[i],
                        }));
                    }
                    Decision::Preempt { victim, .. } => {
                        let i = victim as usize;
                        preemptions += 1;
                        *preempted_by_class.entry(arrivals[i].class.clone()).or_default() += 1;
                        generation[i] += 1;
                        if s.release(victim, now).is_some() {
                            allocated -= holding.remove(&victim).map_or(0, |u| u.as_milli());
                        }
                        s.enqueue(job(i));
                    }
                    Decision::Refused { id, reason } => refuse(&mut refusals, &arrivals[id as usize].name, &reason),
                    Decision::Waiting { .. } => {}
                    // The trace's pods are not marked movable, so consolidation never moves them.
                    Decision::Move { id, .. } => unreachable!("consolidation moved pod {id}, which is not movable"),
                }
            }
            if t_tick == Some(now) && !s.needs_cycle() {
                break;
            }
        }
        let point = (now, allocated, holding.len() as u64, s.queued() as u64);
        match steps.last_mut() {
            Some(last) if last.0 == now => *last = point,
            _ => steps.push(point),
        }
        // Nothing left to arrive or leave: whatever still waits cannot start on an idle fleet.
        if next_arrival == order.len() && departures.is_empty() {
            break;
        }
    }

    let mut waits = Vec::new();
    let mut by_class: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let measured = |t: i64| cfg.window_ms.is_none_or(|(w0, w1)| (w0..w1).contains(&t));
    for (i, a) in arrivals.iter().enumerate() {
        if let Some(st) = started[i]
            && measured(a.arrive_ms)
        {
            let w = (st - a.arrive_ms) as f64 / 1000.0;
            waits.push(w);
            by_class.entry(a.class.clone()).or_default().push(w);
        }
    }
    let (t0, t1) = (steps.first().map_or(0, |p| p.0), steps.last().map_or(0, |p| p.0));
    let span = (t1 - t0).max(0);
    // Allocation is averaged over the window if one is set, else over the span.
    let (a0, a1) = cfg.window_ms.unwrap_or((t0, t1));
    let integral: f64 = steps
        .windows(2)
        .map(|w| w[0].1 as f64 * (w[1].0.min(a1) - w[0].0.max(a0)).max(0) as f64)
        .sum();
    let allocated_pct = if a1 > a0 {
        integral / (a1 - a0) as f64 / capacity * 100.0
    } else {
        0.0
    };
    let peak = steps.iter().map(|p| p.1).max().unwrap_or(0);
    Ok(TimedReport {
        gpus,
        requests: arrivals.len() as u64,
        placed,
        completed,
        refused: refusals.values().map(|r| r.count).sum(),
        never_placed: s.queued() as u64,
        preemptions,
        cycles,
        span_s: span as f64 / 1000.0,
        allocated_pct,
        peak_allocated_pct: peak as f64 / capacity * 100.0,
        max_queued,
        waits: WaitStats::of(waits),
        by_class: by_class.into_iter().map(|(k, v)| (k, WaitStats::of(v))).collect(),
        preempted_by_class,
        refusals: refusals.into_values().collect(),
        series: sample(&steps, cfg.samples, capacity),
    })
}

fn refuse(refusals: &mut BTreeMap<&'static str, Refusals>, name: &str, r: &Refusal) {
    let e = refusals.entry(r.code()).or_insert_with(|| Refusals {
        code: r.code().into(),
        count: 0,
        examples: Vec::new(),
    });
    e.count += 1;
    if e.examples.len() < 3 {
        e.examples.push(format!("{name}: {r}"));
    }
}

/// `n` evenly spaced samples of the step function (the state after each event instant).
fn sample(steps: &[(i64, u64, u64, u64)], n: usize, capacity: f64) -> Vec<Sample> {
    let (Some(first), Some(last)) = (steps.first(), steps.last()) else {
        return Vec::new();
    };
    let n = n.max(2);
    let mut out = Vec::with_capacity(n);
    let mut k = 0;
    for j in 0..n {
        let t = first.0 + ((last.0 - first.0) as f64 * j as f64 / (n - 1) as f64) as i64;
        while k + 1 < steps.len() && steps[k + 1].0 <= t {
            k += 1;
        }
        let p = steps[k];
        out.push(Sample {
            t_s: t as f64 / 1000.0,
            allocated_pct: p.1 as f64 / capacity * 100.0,
            running: p.2,
            queued: p.3,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One node of 1 GPU (T4) and host room for everything below.
    const ONE_GPU: &str = "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,1,T4\n";

    fn trace(rows: &str) -> (Arc<Fleet>, Vec<Arrival>) {
        let fleet = Fleet::from_openb_nodes(ONE_GPU, "nodes.csv").unwrap();
        let text = format!(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n{rows}"
        );
        let pods = parse_trace(&text, "pods.csv", &fleet.catalogue).unwrap();
        let arrivals = trace_arrivals(&pods, &fleet, None, None);
        (Arc::new(fleet), arrivals)
    }

    fn cfg() -> TimedConfig {
        TimedConfig {
            policy: "bestfit".into(),
            samples: 5,
            ..Default::default()
        }
    }

    #[test]
    fn a_pod_waits_until_the_one_holding_its_gpu_leaves() {
        // a: whole GPU at t=0 for 100 s (its trace run: scheduled 10, deleted 110).
        // b: whole GPU at t=70 → waits 30 s, runs 50 s (100..150).
        // c: half a GPU at t=80 → waits for b: 150 − 80 = 70 s, runs 40 s (150..190).
        // d: half a GPU at t=90, never scheduled by the trace: runs its lifetime (20 s) beside c
        //    on the same GPU once b leaves: waits 60 s.
        // e: asks for a V100, which the fleet lacks: refused, never waits.
        let (fleet, arrivals) = trace(
            "a,1000,1024,1,1000,,LS,Running,0,110,10\n\
             b,1000,1024,1,1000,,BE,Succeeded,70,170,120\n\
             c,1000,1024,1,500,,LS,Running,80,140,100\n\
             d,1000,1024,1,500,,BE,Pending,90,110,\n\
             e,1000,1024,1,1000,V100M32,LS,Running,95,200,95\n",
        );
        let r = run_timed(fleet, &arrivals, &cfg()).unwrap();
        assert_eq!(r.requests, 5);
        assert_eq!(r.placed, 4);
        assert_eq!(r.refused, 1);
        assert_eq!(r.refusals[0].code, "constraint");
        assert!(r.refusals[0].examples[0].starts_with("e: "), "{:?}", r.refusals);
        assert_eq!(r.by_class["LS"].placed, 2);
        assert_eq!((r.by_class["LS"].p50_s, r.by_class["LS"].max_s), (0.0, 70.0));
        assert_eq!((r.by_class["BE"].p50_s, r.by_class["BE"].max_s), (30.0, 60.0));
        assert_eq!(r.waits.mean_s, (0.0 + 30.0 + 70.0 + 60.0) / 4.0);
        // Nearest rank over 4 waits {0, 30, 60, 70}: p50 = 2nd, p95 = p99 = 4th.
        assert_eq!((r.waits.p50_s, r.waits.p95_s, r.waits.p99_s), (30.0, 70.0, 70.0));
        // The GPU is busy from 0 to 190 except 170..190 is half used... c (150..190) and
        // d (150..170) together hold it fully until 170, then c alone half.
        assert_eq!(r.span_s, 190.0);
        let busy = 170.0 + 0.5 * 20.0;
        assert!(
            (r.allocated_pct - busy / 190.0 * 100.0).abs() < 1e-9,
            "{}",
            r.allocated_pct
        );
        assert_eq!(r.peak_allocated_pct, 100.0);
        assert_eq!(r.max_queued, 3, "b, c and d wait together");
        assert_eq!(r.series.len(), 5);
        assert_eq!(r.series.first().unwrap().t_s, 0.0);
        assert_eq!(r.series.last().unwrap().allocated_pct, 0.0);
    }

    /// 2 racks × 8 nodes × 8 GPUs (the Philly shape), gangs shaped as the Philly replay does.
    fn gangs_on_two_racks() -> (Arc<Fleet>, Vec<Arrival>) {
        let fleet = crate::philly::fleet_of(2).unwrap();
        let layout = crate::philly::Layout::of(&fleet).unwrap();
        let gang = |name: &str, gpus: u32, at_s: i64, run_s: i64| {
            let (request, gang) = layout.request_of(gpus);
            Arrival {
                name: name.into(),
                tenant: "t".into(),
                class: if gang.is_some() { "gang" } else { "node" }.into(),
                priority: "standard".into(),
                request,
                gang,
                arrive_ms: at_s * 1000,
                run_ms: run_s * 1000,
            }
        };
        let arrivals = vec![
            gang("a", 64, 0, 1000),
            gang("b", 56, 0, 100),
            gang("c", 16, 10, 50),
            gang("d", 64, 20, 10),
        ];
        assert!(arrivals.iter().all(|a| a.gang.is_some()));
        (Arc::new(fleet), arrivals)
    }

    #[test]
    fn a_gang_waits_for_whole_nodes_starts_with_all_its_shares_and_releases_them_all() {
        // a: 64 GPUs at t=0 take rack r00 whole until 1000.
        // b: 56 GPUs (7 nodes) at t=0 take 7 nodes of r01 until 100: one whole node is left.
        // c: 16 GPUs (2 whole nodes in one rack) at t=10: one node is not two, it waits until b
        //    leaves at 100 (90 s), then runs both shares 100..150.
        // d: 64 GPUs (a whole rack) at t=20: r01 is whole again only once every share of c is
        //    back at 150: waits 130 s, runs 150..160.
        let (fleet, arrivals) = gangs_on_two_racks();
        let r = run_timed(fleet, &arrivals, &cfg()).unwrap();
        assert_eq!((r.gpus, r.requests, r.placed, r.completed), (128, 4, 4, 4));
        assert_eq!((r.refused, r.never_placed, r.preemptions), (0, 0, 0));
        assert_eq!(r.by_class["gang"].placed, 4, "each gang counts once");
        assert_eq!(r.waits.mean_s, (0.0 + 0.0 + 90.0 + 130.0) / 4.0);
        assert_eq!((r.waits.p50_s, r.waits.p95_s, r.waits.max_s), (0.0, 130.0, 130.0));
        assert_eq!(r.span_s, 1000.0);
        // GPU-seconds: a 64 × 1000, b 56 × 100, c 16 × 50, d 64 × 10 (every GPU of each gang).
        let held = 64.0 * 1000.0 + 56.0 * 100.0 + 16.0 * 50.0 + 64.0 * 10.0;
        assert!(
            (r.allocated_pct - held / (128.0 * 1000.0) * 100.0).abs() < 1e-9,
            "{}",
            r.allocated_pct
        );
        assert_eq!(r.peak_allocated_pct, 100.0, "a and d hold all 128 GPUs 150..160");
        assert_eq!(r.max_queued, 2, "c and d wait together");
    }

    #[test]
    fn a_window_measures_only_its_arrivals_and_its_span() {
        let (fleet, arrivals) = gangs_on_two_racks();
        let c = TimedConfig {
            window_ms: Some((5_000, 200_000)),
            ..cfg()
        };
        let r = run_timed(fleet, &arrivals, &c).unwrap();
        assert_eq!(r.placed, 4, "every request still runs");
        assert_eq!(r.waits.placed, 2, "c and d arrive in the window");
        assert_eq!(r.waits.mean_s, (90.0 + 130.0) / 2.0);
        // 5..200: a 64 × 195, b 56 × 95, c 16 × 50, d 64 × 10.
        let held = 64.0 * 195.0 + 56.0 * 95.0 + 16.0 * 50.0 + 64.0 * 10.0;
        assert!((r.allocated_pct - held / (128.0 * 195.0) * 100.0).abs() < 1e-9);
    }

    #[test]
    fn days_and_limit_cut_the_demand_by_creation_time() {
        let fleet = Fleet::from_openb_nodes(ONE_GPU, "nodes.csv").unwrap();
        let text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,qos,creation_time,deletion_time,scheduled_time\n\
            late,1,1,1,100,LS,90000,90010,90000\n\
            early,1,1,1,100,LS,10,20,10\n\
            mid,1,1,1,100,BE,50000,50010,\n";
        let pods = parse_trace(text, "p.csv", &fleet.catalogue).unwrap();
        let names = |a: Vec<Arrival>| a.into_iter().map(|a| a.name).collect::<Vec<_>>();
        assert_eq!(
            names(trace_arrivals(&pods, &fleet, None, None)),
            ["early", "mid", "late"]
        );
        assert_eq!(names(trace_arrivals(&pods, &fleet, Some(1.0), None)), ["early", "mid"]);
        assert_eq!(names(trace_arrivals(&pods, &fleet, None, Some(1))), ["early"]);
    }

    #[test]
    fn bad_times_name_the_line_and_field() {
        let fleet = Fleet::from_openb_nodes(ONE_GPU, "nodes.csv").unwrap();
        let h = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time,scheduled_time\n";
        let e = |rows: &str| {
            parse_trace(&format!("{h}{rows}"), "p.csv", &fleet.catalogue)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            e("p,1,1,1,100,50,40,\n"),
            "p.csv:2: deletion_time: 40 is before creation_time 50"
        );
        assert_eq!(
            e("p,1,1,1,100,5,40,41\n"),
            "p.csv:2: scheduled_time: 41 is outside creation_time..deletion_time (5..40)"
        );
        assert_eq!(
            e("p,1,1,1,100,x,40,\n"),
            "p.csv:2: creation_time: `x` is not a non-negative number of seconds"
        );
        let no_times = parse_trace(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,100\n",
            "p.csv",
            &fleet.catalogue,
        )
        .unwrap_err();
        assert_eq!(
            no_times.to_string(),
            "p.csv:1: header: missing column `creation_time` (the timed replay needs the pods' times)"
        );
    }

    #[test]
    fn a_preempted_request_runs_again_and_higher_priority_goes_first() {
        let (fleet, mut arrivals) = trace(
            "low,1000,1024,1,1000,,BE,Running,0,100,0\n\
             high,1000,1024,1,1000,,LS,Running,10,40,10\n",
        );
        arrivals[1].priority = "high".into();
        let c = TimedConfig {
            govern: GovernConfig {
                min_runtime_ms: 0,
                ..Default::default()
            },
            ..cfg()
        };
        let r = run_timed(fleet, &arrivals, &c).unwrap();
        assert_eq!(r.preemptions, 1);
        assert_eq!(r.preempted_by_class["BE"], 1);
        assert_eq!(r.by_class["LS"].max_s, 0.0, "high takes the GPU at once");
        assert_eq!(r.by_class["BE"].max_s, 0.0, "low's wait counts up to its first start");
        // low restarts at 40 when high leaves and runs its 100 s again.
        assert_eq!(r.span_s, 140.0);
    }
}
