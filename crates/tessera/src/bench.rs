//! `tessera bench placement`: placement throughput and decision latency of the engine at
//! steady state; `tessera bench cycle`: full scheduler cycles over a deep queue (the set-up is
//! `tessera_sched::bench`; the timing is here); `tessera bench gang`: planning 128-GPU gangs
//! beyond one node on a fleet of racks kept busy with single-node work (set-up in
//! `tessera_sched::bench::GangSetup`); `tessera bench telemetry`: the console's telemetry store
//! at its worst case (a month of 10,000 workloads: the start-up read, an hour's fold and
//! prune; [`telemetry`]). (`tessera bench api`, the running server under load, is in
//! `benchapi.rs`.)
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
use tessera_server::history::{HOUR_MS, MINUTE_MS};

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
    /// The telemetry store at its worst case: a month of N workloads and P pools, read back
    /// as at start (a day at a time over the hours, an hour at a time over the last day's
    /// minutes), one hour's fold and one hour's prune.
    Telemetry(TelemetryArgs),
}

#[derive(clap::Args)]
pub struct TelemetryArgs {
    /// PostgreSQL URL of an empty database (default: a fresh SQLite store in a temporary
    /// directory, removed afterwards unless `--keep`).
    #[arg(long)]
    database: Option<String>,
    /// Workloads reporting every minute of the whole span.
    #[arg(long, default_value_t = 10_000)]
    workloads: u64,
    /// Days kept (the server keeps 30).
    #[arg(long, default_value_t = 30)]
    days: i64,
    /// Pools with a utilisation row every minute.
    #[arg(long, default_value_t = 3)]
    pools: usize,
    /// Minutes of stored telemetry one read of the start-up read takes (default: the server's,
    /// `tessera_server::history::read_span`; 1440 reads a day at a time throughout, 60 an hour).
    #[arg(long)]
    read_span_minutes: Option<i64>,
    /// Keep the SQLite directory (its path is printed).
    #[arg(long)]
    keep: bool,
    /// One JSON object instead of the text report.
    #[arg(long)]
    json: bool,
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
        BenchCommand::Telemetry(a) => telemetry(a),
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

/// `tessera bench telemetry`: the telemetry store ([`tessera_store::TelemetryStore`]) at the
/// worst case `tessera_server::history`'s module documentation bounds, opened as `serve` opens
/// it (migrations included). It fills the store with `--days` of `--workloads` workloads that
/// reported every minute and `--pools` pools, through `append_telemetry` (the sampler's write
/// path; its rate is reported): per workload an hour row for each hour older than the hour
/// before the day (and the hour the prune has not reached yet), its minute rows from that hour
/// on (an hour not folded yet, the hour the day starts in and the day); a row per pool and
/// minute. Then, through the trait, it times the start-up read as the server does it
/// (`read_span` at a time, or `--read-span-minutes`, each span put back in memory by
/// `tessera_server::history::restore`), with the process's peak resident memory; the fold of the hour not folded yet (`--workloads` × 60
/// minutes), and the prune of the hour the prune has not reached; while each of those two
/// runs, another task appends a row every 5 ms, and the longest such append is reported (how
/// long any other writer waited).
fn telemetry(a: TelemetryArgs) -> Result<()> {
    if a.workloads == 0 || a.days < 2 || a.pools == 0 || a.read_span_minutes.is_some_and(|m| m < 1) {
        bail!("--workloads, --pools and --read-span-minutes must be at least 1, --days at least 2");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)?;
    let dir = match &a.database {
        Some(_) => None,
        None => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_nanos();
            Some(std::env::temp_dir().join(format!("tessera-bench-telemetry-{}-{nanos}", std::process::id())))
        }
    };
    let result = rt.block_on(telemetry_bench(&a, dir.as_deref()));
    if let Some(dir) = &dir {
        if a.keep {
            eprintln!("kept the SQLite store in {}", dir.display());
        } else {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    result
}

/// A field of `/proc/self/status` in kB (`VmHWM`: peak resident memory, `VmRSS`: now).
fn proc_status_kb(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status
        .lines()
        .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))?;
    line[field.len() + 1..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// Resets the process's peak resident memory (`VmHWM`) to its current resident memory
/// (Linux: `5` written to `/proc/self/clear_refs`); false where it could not.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// A workload's minute (span 1) or hour (span 60) of the fill: figures that look like a busy
/// A100 (the hour's are 60 of its minutes).
fn workload_record(id: u64, at: i64, span: u32) -> tessera_store::TelemetryRecord {
    let n = f64::from(span);
    tessera_store::TelemetryRecord {
        series: tessera_store::TelemetrySeries::Workload(id),
        at,
        span_minutes: span,
        minutes: span,
        util_sum: Some(87.5 * n),
        used_mib_sum: Some(61_440.0 * n),
        total_mib: Some(81_920),
    }
}

/// A pool's minute of the fill.
fn pool_record(pool: &str, at: i64) -> tessera_store::TelemetryRecord {
    tessera_store::TelemetryRecord {
        series: tessera_store::TelemetrySeries::Pool(pool.to_string()),
        at,
        span_minutes: 1,
        minutes: 1,
        util_sum: Some(71.25),
        used_mib_sum: None,
        total_mib: None,
    }
}

/// Runs `op` while another task appends a pool's row every 5 ms (as the sampler, or any other
/// writer, would during it); returns what `op` returned, its seconds and the longest of those
/// appends in seconds.
async fn with_other_writer<T>(
    store: &Arc<dyn tessera_store::Store>,
    at: i64,
    op: impl std::future::Future<Output = tessera_store::Result<T>>,
) -> Result<(T, f64, f64)> {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (store, stop) = (store.clone(), stop.clone());
        tokio::spawn(async move {
            let mut longest = 0f64;
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                store
                    .append_telemetry(&[pool_record("bench-other-writer", at + i * MINUTE_MS)])
                    .await?;
                longest = longest.max(t.elapsed().as_secs_f64());
                i += 1;
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            tessera_store::Result::Ok(longest)
        })
    };
    // Let the other writer start first.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let t = Instant::now();
    let out = op.await;
    let secs = t.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let longest = writer.await??;
    Ok((out?, secs, longest))
}

/// The measurements of `tessera bench telemetry` on the store `--database` names, or on a
/// SQLite store in `dir`.
async fn telemetry_bench(a: &TelemetryArgs, dir: Option<&std::path::Path>) -> Result<()> {
    use tessera_server::history::{first_hour_of, hour, minute};
    let kept_minutes = a.days * 1_440;
    // The 58th minute of the current hour: the minute at which the day starts latest in its
    // hour, so that a workload keeps the most minutes (1,559 with the hour not folded yet).
    let now = hour(tessera_server::clock::now_ms()) + 58 * MINUTE_MS;
    let month = first_hour_of(now, kept_minutes);
    let day = first_hour_of(now, 1_440);
    // The hour not folded yet (the fold measured), and the hour the prune has not reached (the
    // prune measured).
    let (unfolded, unpruned) = (day - HOUR_MS, month - HOUR_MS);
    let pools: Vec<String> = (0..a.pools).map(|i| format!("pool-{i}")).collect();

    let data_dir = dir.map(std::path::Path::to_path_buf).unwrap_or_default();
    let t = Instant::now();
    let store = crate::compose::open_store(&data_dir, a.database.as_deref()).await?;
    let open_s = t.elapsed().as_secs_f64();
    if !store.telemetry_between(i64::MIN, i64::MAX).await?.is_empty() {
        bail!("the store already holds telemetry: give an empty database");
    }

    // The fill, oldest first, through the sampler's write path, in calls of about 50,000 rows.
    let workload_hours = (unfolded - unpruned) / HOUR_MS;
    let workload_minutes = (minute(now) - unfolded) / MINUTE_MS + 1;
    let pool_minutes = (minute(now) - unpruned) / MINUTE_MS + 1;
    let expected = a.workloads as i64 * (workload_hours + workload_minutes) + a.pools as i64 * pool_minutes;
    let (mut filled, mut batch) = (0u64, Vec::with_capacity(60_000));
    let (t, mut reported) = (Instant::now(), 0u64);
    let mut at = unpruned;
    while at <= minute(now) {
        if at < unfolded && at % HOUR_MS == 0 {
            batch.extend((0..a.workloads).map(|id| workload_record(id + 1, at, 60)));
        }
        if at >= unfolded {
            batch.extend((0..a.workloads).map(|id| workload_record(id + 1, at, 1)));
        }
        batch.extend(pools.iter().map(|p| pool_record(p, at)));
        at += MINUTE_MS;
        if batch.len() >= 50_000 || at > minute(now) {
            filled += store.append_telemetry(&batch).await?;
            batch.clear();
            if !a.json && filled - reported >= expected as u64 / 10 {
                reported = filled;
                eprintln!(
                    "  filled {filled} of {expected} rows ({:.0} rows/s)",
                    filled as f64 / t.elapsed().as_secs_f64()
                );
            }
        }
    }
    let fill_s = t.elapsed().as_secs_f64();

    // The start-up read, as `read_back` does it.
    let rss_before_kb = proc_status_kb("VmRSS").unwrap_or(0);
    let peak_reset = reset_peak_rss();
    let hwm_before_kb = proc_status_kb("VmHWM").unwrap_or(0);
    let since = now - kept_minutes * MINUTE_MS;
    let history = tessera_server::history::History::default();
    let workloads = tessera_server::workload_history::WorkloadHistory::default();
    let (mut read_s, mut restore_s, mut days) = (0f64, 0f64, Vec::new());
    let mut at = hour(since);
    while at <= now {
        let t = Instant::now();
        let span = a
            .read_span_minutes
            .map_or_else(|| tessera_server::history::read_span(at, now), |m| m * MINUTE_MS);
        let records = store.telemetry_between(at, at + span).await?;
        let secs = t.elapsed().as_secs_f64();
        let rows = records.len();
        let t = Instant::now();
        tessera_server::history::restore(&history, &workloads, records, now, true);
        restore_s += t.elapsed().as_secs_f64();
        read_s += secs;
        days.push((at, rows, secs));
        at += span;
    }
    let hwm_after_kb = proc_status_kb("VmHWM").unwrap_or(0);
    let rss_after_kb = proc_status_kb("VmRSS").unwrap_or(0);
    let read_rows: usize = days.iter().map(|d| d.1).sum();
    let slowest = days
        .iter()
        .cloned()
        .fold((0, 0, 0f64), |m, d| if d.2 > m.2 { d } else { m });
    let largest = days.iter().map(|d| d.1).max().unwrap_or(0);
    let restored = workloads.workloads();
    drop((history, workloads));

    // One hour's fold (the hour not folded yet), then the prune of one hour, each while
    // another writer appends; that writer writes a pool of its own in the future, outside
    // both spans.
    let other = hour(now) + 2 * HOUR_MS;
    let (folded, fold_s, fold_wait_s) =
        with_other_writer(&store, other, store.fold_telemetry(unfolded, unfolded + HOUR_MS)).await?;
    let (pruned, prune_s, prune_wait_s) =
        with_other_writer(&store, other + HOUR_MS, store.prune_telemetry(month)).await?;

    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    let mb = |kb: u64| (kb as f64 / 1024.0 * 10.0).round() / 10.0;
    let backend = if a.database.is_some() { "postgresql" } else { "sqlite" };
    if a.json {
        let out = json!({
            "store": backend,
            "workloads": a.workloads,
            "pools": a.pools,
            "days": a.days,
            "open_s": round(open_s),
            "fill_rows": filled,
            "fill_rows_per_workload": workload_hours + workload_minutes,
            "fill_s": round(fill_s),
            "fill_rows_per_s": (filled as f64 / fill_s).round(),
            "read_span_minutes": a.read_span_minutes,
            "read_calls": days.len(),
            "read_rows": read_rows,
            "read_s": round(read_s),
            "read_largest_call_rows": largest,
            "read_slowest_call_s": round(slowest.2),
            "read_slowest_call_rows": slowest.1,
            "restore_s": round(restore_s),
            "restored_workloads": restored,
            "rss_before_read_mb": mb(rss_before_kb),
            "peak_rss_reset": peak_reset,
            "peak_rss_before_read_mb": mb(hwm_before_kb),
            "peak_rss_after_read_mb": mb(hwm_after_kb),
            "rss_after_read_mb": mb(rss_after_kb),
            "fold_minute_rows": a.workloads * 60,
            "fold_hour_rows_written": folded,
            "fold_s": round(fold_s),
            "fold_other_writer_longest_s": round(fold_wait_s),
            "prune_rows": pruned,
            "prune_s": round(prune_s),
            "prune_other_writer_longest_s": round(prune_wait_s),
            "per_call": days.iter().map(|d| json!({"from": d.0, "rows": d.1, "s": round(d.2)})).collect::<Vec<_>>(),
        });
        println!("{out}");
    } else {
        println!(
            "telemetry store benchmark on {backend}: {} workloads reporting every minute for {} days, {} pools",
            a.workloads, a.days, a.pools
        );
        println!(
            "  fill (append_telemetry)  {filled} rows ({} a workload) in {fill_s:.1} s: {:.0} rows/s",
            workload_hours + workload_minutes,
            filled as f64 / fill_s
        );
        println!(
            "  start-up read            {read_rows} rows in {} calls ({}): {read_s:.2} s reading, {restore_s:.2} s restoring ({restored} workloads)",
            days.len(),
            a.read_span_minutes
                .map_or("the server's spans".to_string(), |m| format!("of {m} minutes"))
        );
        println!(
            "  slowest / largest call   {:.2} s ({} rows) / {largest} rows",
            slowest.2, slowest.1
        );
        println!(
            "  memory (VmRSS, VmHWM)    {:.1} MB before the read, peak {:.1} MB during it{}, {:.1} MB after",
            mb(rss_before_kb),
            mb(hwm_after_kb),
            if peak_reset {
                ""
            } else {
                " (peak not reset: since start)"
            },
            mb(rss_after_kb)
        );
        println!(
            "  fold of one hour         {} minute rows into {folded} hour rows in {fold_s:.3} s (another writer waited up to {fold_wait_s:.3} s)",
            a.workloads * 60
        );
        println!(
            "  prune of one hour        {pruned} rows in {prune_s:.3} s (another writer waited up to {prune_wait_s:.3} s)"
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
