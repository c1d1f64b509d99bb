//! `tessera bench placement`: placement throughput and decision latency of the engine at
//! steady state; `tessera bench cycle`: full scheduler cycles over a deep queue (the set-up is
//! `tessera_sched::bench`; the timing is here); `tessera bench gang`: planning 128-GPU gangs
//! beyond one node on a fleet of racks kept busy with single-node work (set-up in
//! `tessera_sched::bench::GangSetup`). (`tessera bench api`, the running server under load, is
//! in `benchapi.rs`.)
//!
//! A seeded stream of mixed requests — whole 1/2/4/8 GPUs, every MIG profile of the fleet's MIG
//! models, fractions of shared GPUs from 8 tenants — is placed while the fleet is kept at a
//! target load: whenever the allocated GPU units exceed the target share of the fleet, a random
//! live allocation is released first. Every `place` call (decision + commit, successful or
//! not) is timed.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, bail};
use clap::Subcommand;
use serde_json::json;
use tessera_model::{Fleet, GpuUnits, Request};
use tessera_sched::Engine;
use tessera_sched::bench::PlacementChurn;
use tessera_sched::replay::make_policy;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Placements per second and decision latency at steady state.
    Placement(PlacementArgs),
    /// Full scheduler cycles (admit, allocate, reclaim, preempt) over a deep queue at steady
    /// state: milliseconds per cycle.
    Cycle(CycleArgs),
    /// Planning 128-GPU gangs beyond one node on a large fleet of racks: microseconds per plan.
    Gang(GangArgs),
    /// The running server's API under load: creations, reads and request-to-running.
    Api(crate::benchapi::ApiArgs),
}

#[derive(clap::Args)]
pub struct GangArgs {
    /// 8-GPU servers in the whole pool (racks of 16, blocks of 8 racks).
    #[arg(long, default_value_t = 10_000)]
    nodes: u32,
    /// Measured iterations: one single-node workload ends and one starts, then every gang form
    /// is planned and the first placed and released.
    #[arg(long, default_value_t = 2_000)]
    iterations: usize,
    /// Share of the fleet's GPUs kept busy with single-node work (at most 0.95).
    #[arg(long, default_value_t = 0.75)]
    load: f64,
    /// Seed of the random demand (same seed, same run).
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// One JSON object instead of the text report.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct PlacementArgs {
    /// `seed`, `synthetic:NODES`, or a fleet file.
    #[arg(long, default_value = "seed")]
    fleet: String,
    /// Measured place calls (after a warm-up of the same number).
    #[arg(long, default_value_t = 200_000)]
    ops: usize,
    /// Target share of the fleet's GPU units kept allocated.
    #[arg(long, default_value_t = 0.8)]
    load: f64,
    /// Shared-pool policy.
    #[arg(long, default_value = "tessera")]
    policy: String,
    /// Seed of the random demand (same seed, same run).
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// One JSON object instead of the text report.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct CycleArgs {
    /// `seed`, `synthetic:NODES`, or a fleet file.
    #[arg(long, default_value = "synthetic:10000")]
    fleet: String,
    /// Jobs kept waiting in the queue.
    #[arg(long, default_value_t = 100_000)]
    queued: usize,
    /// Measured cycles (after the fleet is saturated).
    #[arg(long, default_value_t = 20)]
    cycles: usize,
    /// Running workloads that finish (and new jobs that arrive) before each measured cycle.
    #[arg(long, default_value_t = 200)]
    churn: usize,
    /// Tenants the queued jobs belong to.
    #[arg(long, default_value_t = 40)]
    tenants: usize,
    /// Shared-pool policy.
    #[arg(long, default_value = "tessera")]
    policy: String,
    /// Seed of the random demand (same seed, same run).
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Share of the jobs, in per cent, that are multi-node gangs of 16, 32, 64 or 128 whole
    /// GPUs preferring a rack (on a fleet with a whole pool of 8-GPU nodes).
    #[arg(long, default_value_t = 0.0, value_name = "PCT")]
    gangs_pct: f64,
    /// One JSON object instead of the text report.
    #[arg(long)]
    json: bool,
}

pub fn run(cmd: BenchCommand, conn: &crate::client::Connection) -> Result<()> {
    match cmd {
        BenchCommand::Placement(a) => placement(a),
        BenchCommand::Cycle(a) => cycle(a),
        BenchCommand::Gang(a) => gang(a),
        BenchCommand::Api(a) => crate::benchapi::run(conn, a),
    }
}

pub fn load_fleet(spec: &str) -> Result<Fleet> {
    if let Some(f) = Fleet::preset(spec) {
        return Ok(f);
    }
    if spec.starts_with("synthetic:") {
        bail!("--fleet: `{spec}`: expected synthetic:NODES with NODES a positive number");
    }
    let text = std::fs::read_to_string(spec).map_err(|e| anyhow::anyhow!("--fleet: cannot read {spec}: {e}"))?;
    Ok(Fleet::from_toml(&text, spec)?)
}

/// The request mix for a fleet (shared with `bench cycle`).
fn mix(fleet: &Fleet) -> Vec<Request> {
    tessera_sched::bench::request_mix(fleet)
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

fn placement(a: PlacementArgs) -> Result<()> {
    if !(0.05..=1.0).contains(&a.load) {
        bail!("--load: {} must be between 0.05 and 1", a.load);
    }
    let fleet = Arc::new(load_fleet(&a.fleet)?);
    let policy = make_policy(&a.policy, &[]).map_err(anyhow::Error::msg)?;
    let mut engine = Engine::new(fleet.clone(), policy, a.seed);
    let requests = mix(&fleet);
    if requests.is_empty() {
        bail!("--fleet: the fleet has no pools to place into");
    }
    let target = GpuUnits((fleet.gpu_count() as f64 * 1000.0 * a.load) as u64);
    let mut churn = PlacementChurn::new(requests, a.seed, target);
    // Releases `id`; the nanoseconds it took.
    let release = |engine: &mut Engine, id: u64| {
        let t = Instant::now();
        engine.release(id).expect("live allocation");
        t.elapsed().as_nanos() as u64
    };
    let mut lat = Vec::with_capacity(a.ops);
    let (mut placed, mut refused) = (0u64, 0u64);
    let mut measured_wall = 0.0;
    let mut release_ns = 0u64;
    for phase in 0..2 {
        lat.clear();
        release_ns = 0;
        placed = 0;
        refused = 0;
        let start = Instant::now();
        for _ in 0..a.ops {
            while let Some(id) = churn.over_target() {
                release_ns += release(&mut engine, id);
            }
            let (id, req) = churn.next_request();
            let t = Instant::now();
            let ok = engine.place(id, &req).map(|a| a.units);
            lat.push(t.elapsed().as_nanos() as u64);
            match ok {
                Ok(u) => {
                    placed += 1;
                    churn.placed(id, u);
                }
                Err(_) => {
                    refused += 1;
                    // At steady state a refusal frees room: release one to keep churning.
                    if let Some(id) = churn.any_live() {
                        release_ns += release(&mut engine, id);
                    }
                }
            }
        }
        if phase == 1 {
            measured_wall = start.elapsed().as_secs_f64();
        }
    }
    let held = churn.held();
    lat.sort_unstable();
    let calls = lat.len() as f64;
    let decision_time: f64 = lat.iter().sum::<u64>() as f64 / 1e9;
    // Engine time: every place call plus every release that kept the fleet at steady state.
    let engine_time = decision_time + release_ns as f64 / 1e9;
    let per_sec = placed as f64 / engine_time;
    let out = json!({
        "fleet": a.fleet,
        "gpus": fleet.gpu_count(),
        "policy": a.policy,
        "ops": a.ops,
        "placed": placed,
        "refused": refused,
        "placements_per_sec": per_sec.round(),
        "decisions_per_sec": (calls / decision_time).round(),
        "loop_ops_per_sec": (calls / measured_wall).round(),
        "p50_us": percentile(&lat, 0.50),
        "p99_us": percentile(&lat, 0.99),
        "max_us": percentile(&lat, 1.0),
        "load": a.load,
        "held_units": held.to_string(),
    });
    if a.json {
        println!("{out}");
    } else {
        println!(
            "placement benchmark on {} ({} GPUs), policy {}",
            a.fleet,
            fleet.gpu_count(),
            a.policy
        );
        println!("  place calls          {} ({placed} placed, {refused} refused)", a.ops);
        println!("  placements/s         {:.0}", per_sec);
        println!("  decisions/s          {:.0}", calls / decision_time);
        println!(
            "  latency p50 / p99    {:.1} µs / {:.1} µs (max {:.1} µs)",
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
            percentile(&lat, 1.0)
        );
        println!(
            "  fleet held           {held} of {} GPU units (target load {:.0} %)",
            fleet.gpu_count(),
            a.load * 100.0
        );
    }
    Ok(())
}

fn gang(a: GangArgs) -> Result<()> {
    if a.nodes < 16 || a.iterations == 0 || !(0.0..=0.95).contains(&a.load) {
        bail!("--nodes must be at least 16, --iterations at least 1 and --load between 0 and 0.95");
    }
    let mut s = tessera_sched::bench::GangSetup::new(a.nodes, a.load, a.seed);
    let forms = tessera_sched::bench::gang_forms();
    // Per form, plan latencies in ns, plans that found room and racks they spanned; last: place
    // + release of the first form.
    let mut lat: Vec<Vec<u64>> = vec![Vec::with_capacity(a.iterations); forms.len() + 1];
    let mut placed = vec![0u64; forms.len()];
    let mut racks = vec![0u64; forms.len()];
    for _ in 0..a.iterations {
        s.churn();
        for (i, (_, g)) in forms.iter().enumerate() {
            let t = Instant::now();
            let p = s.engine.plan_gang(g);
            lat[i].push(t.elapsed().as_nanos() as u64);
            if let Ok(p) = p {
                placed[i] += 1;
                racks[i] += p.racks.len() as u64;
            }
        }
        let id = s.next_id();
        let t = Instant::now();
        if s.engine.place_gang(id, &forms[0].1).is_ok() {
            s.engine.release_gang(id).expect("placed gang");
        }
        lat[forms.len()].push(t.elapsed().as_nanos() as u64);
    }
    let names: Vec<&str> = forms
        .iter()
        .map(|f| f.0)
        .chain(["place + release, 16 whole nodes"])
        .collect();
    let rows: Vec<serde_json::Value> = lat
        .iter_mut()
        .enumerate()
        .map(|(i, l)| {
            l.sort_unstable();
            json!({
                "gang": names[i],
                "p50_us": percentile(l, 0.50),
                "p99_us": percentile(l, 0.99),
                "max_us": percentile(l, 1.0),
                "placed": placed.get(i),
                "mean_racks": placed.get(i).map(|&p| racks[i] as f64 / p.max(1) as f64),
            })
        })
        .collect();
    let fleet = s.engine.fleet();
    if a.json {
        println!(
            "{}",
            json!({
                "nodes": fleet.nodes.len(),
                "racks": fleet.levels.domains(0).len(),
                "load": s.load(),
                "iterations": a.iterations,
                "gangs": rows,
            })
        );
    } else {
        println!(
            "gang placement benchmark on {} nodes in {} racks, {:.0} % of GPUs busy, {} iterations",
            fleet.nodes.len(),
            fleet.levels.domains(0).len(),
            s.load() * 100.0,
            a.iterations
        );
        for r in &rows {
            let extra = match (r["placed"].as_u64(), r["mean_racks"].as_f64()) {
                (Some(p), Some(m)) => format!("  (placed {p} of {}, {m:.2} racks on average)", a.iterations),
                _ => String::new(),
            };
            println!(
                "  {:<32} p50 {:>7.1} µs  p99 {:>7.1} µs  max {:>7.1} µs{extra}",
                r["gang"].as_str().unwrap_or(""),
                r["p50_us"].as_f64().unwrap_or(0.0),
                r["p99_us"].as_f64().unwrap_or(0.0),
                r["max_us"].as_f64().unwrap_or(0.0)
            );
        }
    }
    Ok(())
}

fn cycle(a: CycleArgs) -> Result<()> {
    if a.queued == 0 || a.cycles == 0 {
        bail!("--queued and --cycles must be at least 1");
    }
    let fleet = Arc::new(load_fleet(&a.fleet)?);
    let b = tessera_sched::bench::CycleBench {
        queued: a.queued,
        cycles: a.cycles,
        churn: a.churn,
        tenants: a.tenants,
        policy: a.policy.clone(),
        seed: a.seed,
        gang_permille: (a.gangs_pct.clamp(0.0, 100.0) * 10.0).round() as u32,
    };
    let r = tessera_sched::bench::run(fleet.clone(), &b, |s, now| {
        let t = Instant::now();
        let ds = s.cycle(now);
        (ds, t.elapsed().as_secs_f64() * 1e3)
    })
    .map_err(anyhow::Error::msg)?;
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    if a.json {
        let out = json!({
            "fleet": a.fleet,
            "nodes": fleet.nodes.len(),
            "queued": a.queued,
            "gangs_pct": a.gangs_pct,
            "churn": a.churn,
            "first_cycle_ms": round(r.first_ms),
            "first_cycle_placed": r.first_placed,
            "warmup_cycles": r.warmup_cycles,
            "cycles": a.cycles,
            "p50_ms": round(r.percentile(0.5)),
            "p99_ms": round(r.percentile(0.99)),
            "max_ms": round(r.percentile(1.0)),
            "placed": r.placed,
            "gangs_placed": r.gangs_placed,
            "preempted": r.preempted,
            "queue_after": r.queue_after,
            "running_after": r.running_after,
        });
        println!("{out}");
    } else {
        println!(
            "cycle benchmark on {} ({} nodes), policy {}, {} queued ({} % multi-node gangs), churn {} per cycle",
            a.fleet,
            fleet.nodes.len(),
            a.policy,
            a.queued,
            a.gangs_pct,
            a.churn
        );
        println!(
            "  first cycle          {:.1} ms ({} placed), then {} warm-up cycles",
            r.first_ms, r.first_placed, r.warmup_cycles
        );
        println!(
            "  cycle p50 / p99      {:.1} ms / {:.1} ms (max {:.1} ms, {} cycles)",
            r.percentile(0.5),
            r.percentile(0.99),
            r.percentile(1.0),
            a.cycles
        );
        println!(
            "  placed / preempted   {} ({} multi-node gangs) / {} over the measured cycles; {} queued, {} running after",
            r.placed, r.gangs_placed, r.preempted, r.queue_after, r.running_after
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_covers_every_shape_on_seed() {
        let f = Fleet::seed();
        let m = mix(&f);
        assert_eq!(
            m.iter()
                .filter(|r| matches!(r.shape, tessera_model::Shape::Mig(_)))
                .count(),
            7
        );
        assert!(
            m.iter()
                .any(|r| matches!(r.shape, tessera_model::Shape::Whole { gpus: 8 }))
        );
        assert!(
            m.iter()
                .any(|r| matches!(r.shape, tessera_model::Shape::Fraction { .. }))
        );
    }

    #[test]
    fn fleet_specs() {
        assert_eq!(load_fleet("synthetic:120").unwrap().gpu_count(), 960);
        assert!(
            load_fleet("synthetic:x")
                .unwrap_err()
                .to_string()
                .contains("synthetic:NODES")
        );
        assert!(load_fleet("/nonexistent.toml").is_err());
    }
}
