//! `tessera sim openb`: the openb trace replay.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use serde_json::json;
use tessera_model::Fleet;
use tessera_sched::replay::{self, POLICIES, Pod, ReplayResult, SeedResult};

#[derive(Subcommand)]
pub enum SimCommand {
    /// Replay the Alibaba GPU cluster trace (cluster-trace-gpu-v2023, "openb") with the
    /// protocol of the FGD paper and report unallocated GPU % at arrived 100 % and 130 %.
    Openb(OpenbArgs),
    /// A multi-tenant scenario on a simulated fleet (default: seed, 40 tenants, 48 h) under
    /// saturating demand: utilisation, queueing delay per priority and tenant, preemptions.
    Scenario(ScenarioArgs),
    /// Replay Microsoft's Philly job table (82,247 gangs of 1–128 GPUs, 15 VCs as tenants) on
    /// the `philly-768` / `philly-640` fleets by the protocol of `../shared/traces/philly`:
    /// every metric for fifo, backfill, topology-bestfit, quota-backfill and tessera.
    Philly(crate::phillycmd::PhillyArgs),
}

#[derive(clap::Args)]
pub struct ScenarioArgs {
    /// `seed`, `synthetic:NODES`, or a fleet file with pools training (whole), serving (mig)
    /// and development (shared).
    #[arg(long, default_value = "seed")]
    fleet: String,
    /// Tenant teams, each guaranteed an equal share of every pool.
    #[arg(long, default_value_t = 40)]
    tenants: usize,
    /// Simulated hours.
    #[arg(long, default_value_t = 48.0)]
    hours: f64,
    /// Requests each tenant keeps waiting in each pool.
    #[arg(long, default_value_t = 4)]
    outstanding: usize,
    /// Seed of the demand (same seed, same run).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Run without the consolidation action (to compare).
    #[arg(long)]
    no_consolidation: bool,
    /// Share of the training requests, in per cent, that are multi-node gangs of 16 or 32
    /// whole GPUs (2 or 4 whole nodes, a rack preferred); 0 for none.
    #[arg(long, default_value_t = 10.0, value_name = "PCT")]
    multi_node_pct: f64,
    /// The queue's order within a priority class: `fair-share` (the server's: the least-served
    /// tenant first) or `largest-first` (the most whole GPUs asked for first, then fair share).
    #[arg(long, value_enum, default_value_t = ScenarioOrder::FairShare)]
    order: ScenarioOrder,
    /// At most this many reservations per pool at once (as `serve --holds-per-pool`).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    holds_per_pool: u16,
    /// One JSON object instead of the text report.
    #[arg(long)]
    json: bool,
}

/// The scenario's queue order (`--order`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ScenarioOrder {
    FairShare,
    LargestFirst,
}

#[derive(clap::Args)]
pub struct OpenbArgs {
    /// Folder holding the trace's csv files.
    #[arg(long, default_value = "../shared/traces/openb", env = "TESSERA_OPENB_DIR")]
    pub(crate) trace_dir: PathBuf,
    /// Node list [default: <trace-dir>/openb_node_list_gpu_node.csv].
    #[arg(long)]
    pub(crate) nodes: Option<PathBuf>,
    /// Pod list [default: <trace-dir>/openb_pod_list_default.csv].
    #[arg(long)]
    pub(crate) pods: Option<PathBuf>,
    /// Seeds: `42-51`, `42,43` or `42`.
    #[arg(long, default_value = "42-51")]
    pub(crate) seeds: String,
    /// Placement policy: tessera, fgd, bestfit or random.
    #[arg(long, default_value = "tessera")]
    pub(crate) policy: String,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Replay in time instead: pods arrive at `creation_time`, queue through the scheduler
    /// cycle and hold capacity for the run the trace observed; reports allocation over time,
    /// waits per QoS class and refusals (the first seed only seeds the policy's ties).
    #[arg(long)]
    pub(crate) timed: bool,
    /// --timed: only pods created in the first DAYS days of the trace.
    #[arg(long, requires = "timed")]
    pub(crate) days: Option<f64>,
    /// --timed: only the first N pods by creation time.
    #[arg(long, requires = "timed")]
    pub(crate) limit: Option<usize>,
    /// --timed: also run a cycle every SECONDS of simulated time while pods wait (0: only at
    /// arrivals and departures).
    #[arg(long, default_value_t = 0, requires = "timed")]
    pub(crate) tick: u64,
    /// --timed: points in the allocation series.
    #[arg(long, default_value_t = 100, requires = "timed")]
    pub(crate) samples: usize,
}

pub fn run(cmd: SimCommand) -> Result<()> {
    match cmd {
        SimCommand::Openb(a) => openb(a),
        SimCommand::Scenario(a) => scenario(a),
        SimCommand::Philly(a) => crate::phillycmd::philly(a),
    }
}

pub fn parse_seeds(s: &str) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some((a, b)) = part.split_once('-') {
            let (a, b): (u64, u64) = (
                a.trim()
                    .parse()
                    .with_context(|| format!("--seeds: `{a}` is not a number"))?,
                b.trim()
                    .parse()
                    .with_context(|| format!("--seeds: `{b}` is not a number"))?,
            );
            if a > b {
                bail!("--seeds: range `{part}` is empty");
            }
            out.extend(a..=b);
        } else {
            out.push(
                part.parse()
                    .with_context(|| format!("--seeds: `{part}` is not a number"))?,
            );
        }
    }
    if out.is_empty() {
        bail!("--seeds: no seed given");
    }
    Ok(out)
}

pub(crate) fn read(path: &Path, what: &str) -> Result<String> {
    if !path.exists() {
        bail!(
            "{what} {} not found: the openb trace (cluster-trace-gpu-v2023, CC BY 4.0) is the `csv` folder of the public alibaba/clusterdata repository; pass its location with --trace-dir",
            path.display()
        );
    }
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn openb(a: OpenbArgs) -> Result<()> {
    if !POLICIES.contains(&a.policy.as_str()) {
        bail!(
            "--policy: unknown policy `{}` (one of: {})",
            a.policy,
            POLICIES.join(", ")
        );
    }
    let seeds = parse_seeds(&a.seeds)?;
    if a.timed {
        return crate::timedcmd::openb_timed(&a, seeds[0]);
    }
    let nodes_path = a
        .nodes
        .unwrap_or_else(|| a.trace_dir.join("openb_node_list_gpu_node.csv"));
    let pods_path = a.pods.unwrap_or_else(|| a.trace_dir.join("openb_pod_list_default.csv"));
    let fleet = Fleet::from_openb_nodes(&read(&nodes_path, "node list")?, &nodes_path.display().to_string())?;
    let pods = replay::parse_pods(
        &read(&pods_path, "pod list")?,
        &pods_path.display().to_string(),
        &fleet.catalogue,
    )?;
    let fleet = Arc::new(fleet);
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));

    let bar = if std::io::stderr().is_terminal() {
        let b = indicatif::ProgressBar::new(seeds.len() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} seeds {elapsed}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        b.set_prefix(format!("replaying with {}", a.policy));
        Some(b)
    } else {
        None
    };
    let started = Instant::now();
    let result = replay_seeds(&fleet, &pods, &a.policy, &seeds, threads, &|| {
        if let Some(b) = &bar {
            b.inc(1);
        }
    })
    .map_err(anyhow::Error::msg)?;
    let wall = started.elapsed().as_secs_f64();
    if let Some(b) = bar {
        b.finish_and_clear();
    }

    if a.json {
        let per_seed: Vec<_> = result
            .per_seed
            .iter()
            .map(|s| {
                json!({
                    "seed": s.seed,
                    "unallocated_pct": {"100": round3(s.unallocated_100), "130": round3(s.unallocated_130)},
                    "failed_pods": s.failed_pods,
                    "failed_shares": s.failed_shares,
                    "failed_pods_100": s.failed_pods_100,
                    "failed_shares_100": s.failed_shares_100,
                    "share_limit_if_all_shares_placed_pct": {"100": round3(s.share_limit_100)},
                    "any_scheduler_floor_pct": {"100": round3(s.any_floor_100)},
                    "non_refusing_floor_pct": {"100": round3(s.non_refusing_floor_100), "130": round3(s.non_refusing_floor_130)},
                    "packing_limit_pct": {"100": round3(s.packing_limit_100), "130": round3(s.packing_limit_130)},
                })
            })
            .collect();
        let out = json!({
            "policy": a.policy,
            "seeds": seeds,
            "capacity_milli": result.capacity_milli,
            "unallocated_pct": {"100": round3(result.mean_100()), "130": round3(result.mean_130())},
            "failed_pods_100": round3(result.mean(|s| s.failed_pods_100 as f64)),
            "failed_shares_100": round3(result.mean(|s| s.failed_shares_100 as f64)),
            "share_limit_if_all_shares_placed_pct": {"100": round3(result.mean(|s| s.share_limit_100))},
            "any_scheduler_floor_pct": {"100": round3(result.mean(|s| s.any_floor_100))},
            "non_refusing_floor_pct": {
                "100": round3(result.mean(|s| s.non_refusing_floor_100)),
                "130": round3(result.mean(|s| s.non_refusing_floor_130)),
            },
            "packing_limit_pct": {
                "100": round3(result.mean(|s| s.packing_limit_100)),
                "130": round3(result.mean(|s| s.packing_limit_130)),
            },
            "per_seed": per_seed,
            "wall_seconds": round3(wall),
        });
        println!("{out}");
    } else {
        println!(
            "openb replay: {} nodes, {} GPUs, {} pods in {}; policy {}",
            fleet.nodes.len(),
            fleet.gpu_count(),
            pods.len(),
            pods_path
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default(),
            a.policy
        );
        println!(
            "{:>6}  {:>16}  {:>16}  {:>11}  {:>13}  {:>15}",
            "seed", "unalloc@100% (%)", "unalloc@130% (%)", "failed pods", "by 100%: pods", "of them shares"
        );
        for s in &result.per_seed {
            println!(
                "{:>6}  {:>16.2}  {:>16.2}  {:>11}  {:>13}  {:>15}",
                s.seed, s.unallocated_100, s.unallocated_130, s.failed_pods, s.failed_pods_100, s.failed_shares_100
            );
        }
        println!(
            "{:>6}  {:>16.2}  {:>16.2}",
            "mean",
            result.mean_100(),
            result.mean_130()
        );
        println!(
            "  least possible at 100 % for any scheduler, even one refusing pods that fit: {:.2} %",
            result.mean(|s| s.any_floor_100),
        );
        println!(
            "  least possible for a scheduler that never refuses a pod that fits: {:.2} % at 100 %, {:.2} % at 130 %",
            result.mean(|s| s.non_refusing_floor_100),
            result.mean(|s| s.non_refusing_floor_130),
        );
        println!(
            "  least possible at 100 % if every arrived share were placed: {:.2} % (a bound only where none fails; here {:.1} shares failed by then, mean over seeds)",
            result.mean(|s| s.share_limit_100),
            result.mean(|s| s.failed_shares_100 as f64),
        );
        println!(
            "  least possible for the shares this policy placed (a perfect packing of them): {:.2} % at 100 %, {:.2} % at 130 %",
            result.mean(|s| s.packing_limit_100),
            result.mean(|s| s.packing_limit_130),
        );
        println!("wall time {wall:.2} s");
    }
    Ok(())
}

/// Replays every seed on `threads` threads (the replay itself is single-threaded and pure);
/// `progress` is called as each seed finishes.
fn replay_seeds(
    fleet: &Arc<Fleet>,
    pods: &[Pod],
    policy: &str,
    seeds: &[u64],
    threads: usize,
    progress: &(dyn Fn() + Sync),
) -> Result<ReplayResult, String> {
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<Result<SeedResult, String>>>> = seeds.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..threads.max(1).min(seeds.len()) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= seeds.len() {
                        break;
                    }
                    let r = replay::replay_seed(fleet, pods, policy, seeds[i]);
                    *results[i].lock().expect("no panics while holding") = Some(r);
                    progress();
                }
            });
        }
    });
    let per_seed = results
        .into_iter()
        .map(|r| {
            r.into_inner()
                .expect("no panics while holding")
                .expect("every seed ran")
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ReplayResult {
        policy: policy.to_string(),
        capacity_milli: fleet.gpu_count() * 1000,
        per_seed,
    })
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn scenario(a: ScenarioArgs) -> Result<()> {
    use tessera_sched::scenario::{ScenarioConfig, check_fleet, run};
    let fleet = crate::bench::load_fleet(&a.fleet)?;
    check_fleet(&fleet).map_err(anyhow::Error::msg)?;
    if a.tenants == 0 || a.hours <= 1.0 {
        bail!("--tenants must be positive and --hours above 1");
    }
    let cfg = ScenarioConfig {
        tenants: a.tenants,
        hours: a.hours,
        outstanding: a.outstanding,
        seed: a.seed,
        warmup_hours: (a.hours / 8.0).min(6.0),
        multi_node_permille: (a.multi_node_pct.clamp(0.0, 100.0) * 10.0).round() as u32,
        ..Default::default()
    };
    let mut cfg = cfg;
    cfg.govern.consolidation.enabled = !a.no_consolidation;
    cfg.govern.holds_per_pool = usize::from(a.holds_per_pool);
    cfg.largest_first = a.order == ScenarioOrder::LargestFirst;
    let started = Instant::now();
    let r = run(Arc::new(fleet), &cfg, &mut || started.elapsed().as_nanos() as u64);
    let wall = started.elapsed().as_secs_f64();
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    println!(
        "scenario: {} tenants, {} GPUs, {} simulated hours (first {:.0} h excluded), {} order, {} hold(s) per pool, wall {wall:.1} s",
        r.tenants, r.gpus, r.hours, cfg.warmup_hours, r.order, r.holds_per_pool
    );
    println!(
        "requests {} submitted, {} placed, {} completed, {} preemptions ({:.1} % of placements), queue up to {}",
        r.submitted, r.placed, r.completed, r.preemptions, r.preemptions_pct, r.max_queued
    );
    println!(
        "consolidation moves: {} restartable jobs requeued, {} services replaced{}",
        r.moves.restarted,
        r.moves.replaced,
        if a.no_consolidation { " (consolidation off)" } else { "" }
    );
    println!("GPU units allocated (time-weighted): {:.1} %", r.allocated_pct);
    println!(
        "{:<12} {:<7} {:>6} {:>10} {:>14} {:>10} {:>12}",
        "POOL", "SHARING", "UNITS", "ALLOCATED", "IDLE:FRAGMENT", "IDLE:BLOCK", "PREEMPTED"
    );
    for p in &r.pools {
        println!(
            "{:<12} {:<7} {:>6} {:>9.1}% {:>13.1}% {:>9.1}% {:>12}",
            p.pool,
            p.sharing,
            p.units,
            p.allocated_pct,
            p.idle_fragmentation_pct,
            p.idle_blocked_pct,
            p.preempted.values().sum::<u64>()
        );
    }
    println!("placements and preemptions by priority class (whole run):");
    for (k, c) in &r.churn {
        let caused: Vec<String> = c.caused.iter().map(|(why, n)| format!("{n} by {why}")).collect();
        println!(
            "  {k:<14} {:>6} placements  {:>5} preempted ({:>5.1} %)  caused: {}",
            c.placements,
            c.preempted,
            c.preempted_pct,
            if caused.is_empty() {
                "none".to_string()
            } else {
                caused.join(", ")
            }
        );
    }
    println!("queueing delay by priority class:");
    for (k, d) in &r.by_priority {
        println!(
            "  {k:<14} {:>6} placed  mean {:>8.0} s  p50 {:>8.0} s  p95 {:>8.0} s",
            d.placed, d.mean_wait_s, d.p50_wait_s, d.p95_wait_s
        );
    }
    println!(
        "  8-GPU gangs    {:>6} placed  mean {:>8.0} s  p50 {:>8.0} s  p95 {:>8.0} s",
        r.gang8.placed, r.gang8.mean_wait_s, r.gang8.p50_wait_s, r.gang8.p95_wait_s
    );
    for (gpus, d) in &r.multi_node {
        println!(
            "  {:<14} {:>6} placed  mean {:>8.0} s  p50 {:>8.0} s  p95 {:>8.0} s",
            format!("{gpus}-GPU gangs"),
            d.placed,
            d.mean_wait_s,
            d.p50_wait_s,
            d.p95_wait_s
        );
    }
    println!("training requests on one node, by size:");
    for (gpus, d) in &r.training_by_gpus {
        println!(
            "  {:<14} {:>6} placed  mean {:>8.0} s  p50 {:>8.0} s  p95 {:>8.0} s",
            format!("{gpus} GPU"),
            d.placed,
            d.mean_wait_s,
            d.p50_wait_s,
            d.p95_wait_s
        );
    }
    println!("training requests still waiting at the end, by size (submitted over the run):");
    for (gpus, b) in &r.training_waiting_at_end {
        println!(
            "  {:<14} {:>6} waiting  mean age {:>8.0} s  oldest {:>8.0} s  ({} submitted)",
            format!("{gpus} GPU"),
            b.count,
            b.mean_age_s,
            b.max_age_s,
            r.training_submitted.get(gpus).copied().unwrap_or(0)
        );
    }
    let mut t: Vec<_> = r.by_tenant.iter().collect();
    t.sort_by(|a, b| a.1.mean_wait_s.total_cmp(&b.1.mean_wait_s));
    if let (Some(best), Some(worst)) = (t.first(), t.last()) {
        println!(
            "queueing delay by tenant: mean from {:.0} s ({}) to {:.0} s ({}); -o json for all",
            best.1.mean_wait_s, best.0, worst.1.mean_wait_s, worst.0
        );
    }
    println!(
        "scheduler decisions: p50 {:.1} µs, p99 {:.1} µs",
        r.decision_p50_us, r.decision_p99_us
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: &str = "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,65536,4,T4\nn1,16000,65536,2,G2\n";
    const PODS: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n\
        p0,4000,8192,1,500\n\
        p1,4000,8192,1,1000\n\
        p2,8000,8192,2,1000\n\
        p3,2000,4096,0,0\n";

    #[test]
    fn parallel_replay_keeps_the_seed_order_and_matches_one_thread() {
        let fleet = Arc::new(Fleet::from_openb_nodes(NODES, "nodes.csv").unwrap());
        let pods = replay::parse_pods(PODS, "pods.csv", &fleet.catalogue).unwrap();
        let seeds = [3, 1, 2, 9];
        let done = AtomicUsize::new(0);
        let progress = || {
            done.fetch_add(1, Ordering::Relaxed);
        };
        let a = replay_seeds(&fleet, &pods, "tessera", &seeds, 3, &progress).unwrap();
        let b = replay_seeds(&fleet, &pods, "tessera", &seeds, 1, &|| {}).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.per_seed.iter().map(|s| s.seed).collect::<Vec<_>>(), seeds);
        assert_eq!(done.load(Ordering::Relaxed), seeds.len());
        assert!(replay_seeds(&fleet, &pods, "nope", &seeds, 2, &|| {}).is_err());
    }

    #[test]
    fn seeds() {
        assert_eq!(parse_seeds("42-45").unwrap(), vec![42, 43, 44, 45]);
        assert_eq!(parse_seeds("1,3-4").unwrap(), vec![1, 3, 4]);
        assert!(parse_seeds("5-3").is_err());
        assert!(parse_seeds("x").is_err());
    }
}
