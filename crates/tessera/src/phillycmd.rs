//! `tessera sim philly`: the Philly trace replay (`tessera_sched::philly`) for one or all six
//! policies (the five of the protocol and `engine`, the real scheduler) on `philly-768` or `philly-640`, every metric side by side or as JSON.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::json;
use tessera_sched::philly::{self, FLEETS, Layout, POLICIES, Policy};

#[derive(clap::Args)]
pub struct PhillyArgs {
    /// Folder holding `philly_jobs.csv` (or the file itself).
    #[arg(
        long = "trace",
        default_value = "../shared/traces/philly",
        env = "TESSERA_PHILLY_DIR"
    )]
    trace: PathBuf,
    /// `philly-768` (12 racks of 8 nodes of 8 GPUs) or `philly-640` (10 racks).
    #[arg(long, default_value = "philly-768")]
    fleet: String,
    /// `all`, or one of fifo, backfill, topology-bestfit, quota-backfill, tessera, engine.
    #[arg(long, default_value = "all")]
    policy: String,
    /// Same-second orders (protocol section 8): `0` is the file's order; several (`0-4`) report
    /// the mean of every figure over them.
    #[arg(long, default_value = "0")]
    seeds: String,
    /// One JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// Reads the job table: `path` is the file, or a folder holding `philly_jobs.csv`. A missing
/// file is one line saying where to get it.
pub fn load_trace(path: &Path) -> Result<philly::Trace> {
    let path = if path.is_dir() {
        path.join("philly_jobs.csv")
    } else {
        path.to_path_buf()
    };
    if !path.exists() {
        bail!(
            "job table {} not found: the Philly trace (Jeon et al., USENIX ATC'19; msr-fiddle/philly-traces) as the per-job summary `simulator/traces/philly.csv` of the public petuum/adaptdl repository (commit de25dcc), saved as philly_jobs.csv; pass it (or its folder) with --trace",
            path.display()
        );
    }
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    philly::parse(&text).with_context(|| format!("{}", path.display()))
}

pub fn philly(a: PhillyArgs) -> Result<()> {
    let policies: Vec<Policy> = match a.policy.as_str() {
        "all" => POLICIES.iter().filter_map(|p| Policy::parse(p)).collect(),
        p => vec![Policy::parse(p).with_context(|| {
            format!(
                "--policy: unknown policy `{p}` (all, or one of: {})",
                POLICIES.join(", ")
            )
        })?],
    };
    let Some(fleet) = philly::fleet(&a.fleet) else {
        bail!("--fleet: unknown fleet `{}` (one of: {})", a.fleet, FLEETS.join(", "));
    };
    let layout = Layout::of(&fleet).context("the Philly fleet has racks")?;
    let trace = load_trace(&a.trace)?;
    let seeds = crate::sim::parse_seeds(&a.seeds)?;
    let started = Instant::now();
    let traces: Vec<_> = seeds.iter().map(|&s| trace.reordered(s)).collect();
    // per_seed[policy][seed]
    let per_seed: Vec<Vec<_>> = policies
        .iter()
        .map(|&p| traces.iter().map(|t| philly::replay(t, &layout, p)).collect())
        .collect();
    let reports: Vec<_> = per_seed
        .iter()
        .map(|r| philly::Report::mean(r).expect("at least one seed"))
        .collect();
    let wall = started.elapsed().as_secs_f64();
    if a.json {
        println!(
            "{}",
            json!({
                "fleet": a.fleet,
                "fleet_gpus": layout.gpus(),
                "jobs": trace.jobs.len(),
                "seeds": seeds,
                "reports": reports,
                "per_seed": if seeds.len() > 1 { json!(per_seed) } else { json!(null) },
                "wall_seconds": (wall * 1000.0).round() / 1000.0,
            })
        );
    } else {
        println!(
            "philly replay: {} jobs, {} tenants on {} ({} racks × {} nodes × {} GPUs); window [t0+14 d, t0+70 d): {} jobs; delays in hours; {}; wall {wall:.1} s",
            trace.jobs.len(),
            trace.tenants.len(),
            a.fleet,
            layout.racks.len(),
            layout.nodes_per_rack,
            layout.gpus_per_node,
            reports.first().map_or(0, |r| r.window_jobs),
            if seeds.len() == 1 {
                format!("same-second order {}", seeds[0])
            } else {
                format!("mean over same-second orders {}", a.seeds)
            },
        );
        print!("{}", philly::table(&reports));
        println!(
            "tessera: multi-node gangs first, then jobs within their tenant's guarantee, then the rest (inside a class by submission plus a quarter of the estimate, gangs by submission); a reservation for every blocked multi-node gang and for the first blocked other job, a job starting now only where it delays none (by estimates); single-node jobs on the node whose busy horizon they extend least; borrowed GPUs reclaimed in one rack for a blocked within-guarantee multi-node gang when the work lost is under 5 % of its wait (by estimates); preempted jobs restart from the beginning (no checkpointing)"
        );
        println!(
            "engine: the same trace through Tessera's real scheduler (tessera_sched::cycle::Scheduler), each VC's guarantee as its quota, each job's estimate as its lease, the scenario's settings (30-minute backfill window, reclaim after 4 h, 4 h minimum runtime) with the rules for gangs: every blocked multi-node gang holds nodes at once and moves its hold where it would start sooner, no holds for other jobs, gangs before single-node jobs across tenants (those by submission plus a quarter of the estimate), reclaim and preemption losing at most 10 % of the GPU-time the job waits, single-node jobs on the node whose busy horizon they extend least; preempted jobs restart from the beginning"
        );
    }
    Ok(())
}
