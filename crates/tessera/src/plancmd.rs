//! `tessera plan`: capacity planning. Replays a demand — the openb trace in time, the scenario
//! model as open arrivals, a usage ledger exported with `tessera usage --by interval -o csv`, or
//! the Philly job table with its multi-node gangs on fleets of the Philly shape (`--racks`,
//! waits measured over the protocol's window) — on candidate fleets through the scheduler cycle ([`tessera_sched::plan`]) and answers which
//! fleet meets a p95 wait target per class at least cost: a table, the answer, a compact
//! terminal chart and an SVG chart written to a file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use tessera_model::request::MigChoice;
use tessera_model::{Fleet, Request, Shape};
use tessera_sched::philly::{self, Layout, MULTI_NODE, WINDOW_DAYS};
use tessera_sched::plan::{self, Candidate, Plan, Prices, Target, human_seconds};
use tessera_sched::replay::POLICIES;
use tessera_sched::timed::{self, Arrival, TimedConfig, TracePod};

#[derive(Args)]
pub struct PlanArgs {
    /// The demand: `openb` (the trace in time), `scenario` (the scenario model's mix as open
    /// arrivals), `usage:FILE` (a ledger exported with `tessera usage --by interval -o csv`), or
    /// `philly` (the Philly job table, gangs included, on `--racks` fleets).
    #[arg(long, default_value = "openb")]
    demand: String,
    /// A candidate fleet: `POOL[@SHARING]:MODEL=NODES[xGPUS][+MODEL=…]`, pools separated by
    /// `;`; NODES may be a range `A..B` to search every count in it. Repeatable.
    #[arg(long = "candidate", value_name = "SPEC")]
    candidates: Vec<String>,
    /// A YAML file with `candidates:` (a list of specs) and optionally `prices:` (MODEL: price
    /// per GPU-hour) and `target_p95:`.
    #[arg(long = "candidates-file", value_name = "FILE")]
    candidates_file: Option<PathBuf>,
    /// Price per GPU-hour of a model: `MODEL=PRICE` (repeatable or comma-separated). Every
    /// model of every candidate needs one; Tessera ships no price list.
    #[arg(long = "price", value_name = "MODEL=PRICE")]
    prices: Vec<String>,
    /// The target: p95 wait in seconds for every class (`300`), or per class
    /// (`LS=60,BE=3600`, `*=SECONDS` for the rest).
    #[arg(long = "target-p95")]
    target_p95: Option<String>,
    /// Currency label of the prices.
    #[arg(long, default_value = "USD")]
    currency: String,
    /// Where the SVG chart (p95 wait per class vs cost) goes.
    #[arg(long, default_value = "plan.svg")]
    chart: PathBuf,
    /// Placement policy for shared pools.
    #[arg(long, default_value = "tessera")]
    policy: String,
    /// Seed of the demand and of the policy's ties.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// openb: the trace folder.
    #[arg(long, default_value = "../shared/traces/openb", env = "TESSERA_OPENB_DIR")]
    trace_dir: PathBuf,
    /// openb: pod list [default: <trace-dir>/openb_pod_list_default.csv].
    #[arg(long)]
    pods: Option<PathBuf>,
    /// openb: only pods created in the first DAYS days; philly: only jobs submitted in the
    /// first DAYS days (more than 14: the window then ends at DAYS if before day 70).
    #[arg(long)]
    days: Option<f64>,
    /// openb: only the first N pods by creation time; philly: the first N jobs.
    #[arg(long)]
    limit: Option<usize>,
    /// philly: the job table `philly_jobs.csv`, or its folder.
    #[arg(
        long = "trace",
        default_value = "../shared/traces/philly",
        env = "TESSERA_PHILLY_DIR"
    )]
    philly_trace: PathBuf,
    /// philly: the candidates, racks of 8 nodes × 8 GPUs: a count or a range `A..B`.
    #[arg(long, default_value = "10..14")]
    racks: String,
    /// scenario: tenants.
    #[arg(long, default_value_t = 40)]
    tenants: usize,
    /// scenario: simulated hours of arrivals.
    #[arg(long, default_value_t = 48.0)]
    hours: f64,
    /// scenario: requests per tenant and pool per hour.
    #[arg(long, default_value_t = 0.25)]
    rate: f64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CandidatesFile {
    #[serde(default)]
    candidates: Vec<String>,
    #[serde(default)]
    prices: BTreeMap<String, f64>,
    target_p95: Option<serde_yaml_ng::Value>,
}

/// A demand, rebuilt for each candidate fleet.
enum Demand {
    Trace(Vec<TracePod>),
    Scenario {
        tenants: usize,
        hours: f64,
        rate: f64,
        seed: u64,
    },
    Usage(Vec<LedgerRow>),
    Philly(tessera_sched::philly::Trace),
}

pub fn run(a: PlanArgs) -> Result<()> {
    if !POLICIES.contains(&a.policy.as_str()) {
        bail!(
            "--policy: unknown policy `{}` (one of: {})",
            a.policy,
            POLICIES.join(", ")
        );
    }
    let mut specs = a.candidates.clone();
    let mut price_entries = a.prices.clone();
    let mut target = a.target_p95.clone();
    if let Some(f) = &a.candidates_file {
        let text = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let file: CandidatesFile =
            serde_yaml_ng::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?;
        specs.extend(file.candidates);
        // Command-line prices win over the file's.
        price_entries.splice(0..0, file.prices.iter().map(|(m, p)| format!("{m}={p}")));
        if target.is_none() {
            target = file.target_p95.map(|v| match v {
                serde_yaml_ng::Value::String(s) => s,
                serde_yaml_ng::Value::Number(n) => n.to_string(),
                other => format!("{other:?}"),
            });
        }
    }
    let philly = a.demand == "philly";
    if philly {
        if !specs.is_empty() {
            bail!("--demand philly takes its candidate fleets from --racks, not --candidate");
        }
        if price_entries.is_empty() {
            // One model: the smallest fleet is the cheapest; cost reads as GPUs.
            price_entries.push("A100-80GB=1".into());
        }
    }
    let Some(target) = target else {
        bail!("--target-p95 is required (seconds for every class, or CLASS=SECONDS,…)");
    };
    let target = Target::parse(&target).map_err(anyhow::Error::msg)?;
    let candidates = if philly {
        parse_racks(&a.racks)?.into_iter().map(Candidate::philly).collect()
    } else {
        plan::parse_candidates(&specs).map_err(|e| {
            if specs.is_empty() {
                anyhow::anyhow!("no candidate fleet: pass --candidate SPEC or --candidates-file FILE")
            } else {
                anyhow::Error::msg(e)
            }
        })?
    };
    let prices = Prices::parse(&price_entries).map_err(anyhow::Error::msg)?;
    for c in &candidates {
        c.cost_per_hour(&prices).map_err(anyhow::Error::msg)?;
    }

    let (demand, known): (Demand, BTreeSet<String>) = match a.demand.as_str() {
        "openb" => {
            if a.days.is_some_and(|d| !d.is_finite() || d <= 0.0) {
                bail!("--days must be a positive number");
            }
            let (trace_fleet, pods) = crate::timedcmd::load_trace(&a.trace_dir, None, a.pods.as_deref())?;
            // The trace's own models (G1–G3 are undisclosed types) may be used by candidates.
            let known = trace_fleet
                .catalogue
                .models()
                .filter(|(_, m)| m.opaque)
                .map(|(_, m)| m.name.clone())
                .chain(pods.iter().flat_map(|p| p.model_names.iter().cloned()))
                .collect();
            (Demand::Trace(pods), known)
        }
        "scenario" => {
            if a.tenants == 0 || a.hours.is_nan() || a.hours <= 0.0 || a.rate.is_nan() || a.rate <= 0.0 {
                bail!("--tenants, --hours and --rate must be positive");
            }
            (
                Demand::Scenario {
                    tenants: a.tenants,
                    hours: a.hours,
                    rate: a.rate,
                    seed: a.seed,
                },
                BTreeSet::new(),
            )
        }
        "philly" => {
            if a.days.is_some_and(|d| !d.is_finite() || d <= WINDOW_DAYS.0 as f64) {
                bail!(
                    "--days must be more than {} with --demand philly (the measured window starts at day {})",
                    WINDOW_DAYS.0,
                    WINDOW_DAYS.0
                );
            }
            let mut trace = crate::phillycmd::load_trace(&a.philly_trace)?;
            let t0 = trace.jobs.first().map_or(0, |j| j.submit);
            if let Some(d) = a.days {
                trace.jobs.retain(|j| ((j.submit - t0) as f64) < d * 86_400.0);
            }
            trace.jobs.truncate(a.limit.unwrap_or(usize::MAX));
            (Demand::Philly(trace), BTreeSet::new())
        }
        d => match d.strip_prefix("usage:") {
            Some(path) => {
                let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
                (Demand::Usage(parse_ledger(&text, path)?), BTreeSet::new())
            }
            None => bail!("--demand: `{d}` is not openb, scenario, usage:FILE or philly"),
        },
    };
    let (days, limit) = (a.days, a.limit);
    // philly: the protocol's window, ending earlier when --days cuts the trace before day 70.
    let window = {
        let (w0, w1) = philly::window_ms();
        (w0, a.days.map_or(w1, |d| w1.min((d * 86_400_000.0) as i64)))
    };
    let build = |fleet: &Fleet| -> Result<Vec<Arrival>, String> {
        match &demand {
            Demand::Trace(pods) => {
                let arrivals = timed::trace_arrivals(pods, fleet, days, limit);
                if arrivals.is_empty() {
                    return Err("no pod of the trace is left after --days/--limit".into());
                }
                Ok(arrivals)
            }
            Demand::Scenario {
                tenants,
                hours,
                rate,
                seed,
            } => {
                tessera_sched::scenario::check_fleet(fleet).map_err(|e| format!("candidate: {e}"))?;
                Ok(plan::scenario_arrivals(fleet, *tenants, *hours, *rate, *seed))
            }
            Demand::Usage(rows) => ledger_arrivals(rows, fleet),
            Demand::Philly(trace) => {
                let layout = Layout::of(fleet).ok_or("the candidate is not of the Philly shape")?;
                let arrivals = philly::arrivals(trace, &layout);
                if !arrivals.iter().any(|a| (window.0..window.1).contains(&a.arrive_ms)) {
                    return Err(format!(
                        "no job of the trace is left in the measured window [{} d, {} d) after --days/--limit",
                        WINDOW_DAYS.0,
                        window.1 / 86_400_000
                    ));
                }
                Ok(arrivals)
            }
        }
    };
    let cfg = TimedConfig {
        policy: a.policy.clone(),
        seed: a.seed,
        samples: 50,
        window_ms: philly.then_some(window),
        ..Default::default()
    };
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    let started = Instant::now();
    let p = plan::plan(&candidates, &build, &known, &prices, &target, &cfg, threads).map_err(anyhow::Error::msg)?;
    let wall = started.elapsed().as_secs_f64();
    let svg = plan::svg_chart(&p, &a.currency);
    std::fs::write(&a.chart, svg).with_context(|| format!("writing the chart to {}", a.chart.display()))?;
    if a.json {
        let mut v = serde_json::to_value(&p)?;
        v["answer"] = p.answer().into();
        v["chart"] = a.chart.display().to_string().into();
        v["wall_seconds"] = ((wall * 1000.0).round() / 1000.0).into();
        if philly {
            v["philly"] = serde_json::to_value(philly_rows(&p))?;
            v["window_days"] = serde_json::json!([window.0 as f64 / 86_400_000.0, window.1 as f64 / 86_400_000.0]);
        }
        println!("{v}");
        return Ok(());
    }
    if let Demand::Philly(trace) = &demand {
        print_philly(
            &p,
            trace,
            window,
            a.prices.is_empty() && a.candidates_file.is_none(),
            &a.currency,
        );
    } else {
        print_plan(&p, &a.currency);
    }
    println!(
        "chart: {} (p95 wait per class vs cost); wall {wall:.1} s",
        a.chart.display()
    );
    Ok(())
}

/// `--racks`: `N` or `A..B`.
fn parse_racks(s: &str) -> Result<Vec<u32>> {
    let bad = || {
        anyhow::anyhow!(
            "--racks: `{s}` is not a rack count or a range A..B (1..{})",
            plan::MAX_CANDIDATES
        )
    };
    let num = |v: &str| {
        v.trim()
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=plan::MAX_CANDIDATES as u32).contains(n))
    };
    let (lo, hi) = match s.split_once("..") {
        Some((a, b)) => (num(a).ok_or_else(bad)?, num(b).ok_or_else(bad)?),
        None => (num(s).ok_or_else(bad)?, num(s).ok_or_else(bad)?),
    };
    if lo > hi {
        return Err(bad());
    }
    Ok((lo..=hi).collect())
}

/// One Philly candidate's figures (waits over the measured window, seconds).
#[derive(serde::Serialize)]
struct PhillyRow {
    candidate: String,
    racks: u32,
    gpus: u64,
    mean_s: f64,
    p95_s: f64,
    multi_node_jobs: u64,
    multi_node_mean_s: f64,
    multi_node_p95_s: f64,
    allocated_pct: f64,
    refused: u64,
    never_placed: u64,
    preemptions: u64,
    meets: bool,
    chosen: bool,
}

fn philly_rows(p: &Plan) -> Vec<PhillyRow> {
    p.outcomes
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let r = &o.report;
            let gang = r.by_class.get(MULTI_NODE).cloned().unwrap_or_default();
            PhillyRow {
                candidate: o.candidate.label.clone(),
                racks: o.candidate.racks.unwrap_or(0),
                gpus: o.gpus,
                mean_s: r.waits.mean_s,
                p95_s: r.waits.p95_s,
                multi_node_jobs: gang.placed,
                multi_node_mean_s: gang.mean_s,
                multi_node_p95_s: gang.p95_s,
                allocated_pct: r.allocated_pct,
                refused: r.refused,
                never_placed: r.never_placed,
                preemptions: r.preemptions,
                meets: o.meets,
                chosen: p.chosen == Some(i),
            }
        })
        .collect()
}

/// The Philly table: per candidate, the queueing delay over the window (all jobs, and the
/// multi-node gangs), allocation over the window, and the smallest fleet meeting the target.
fn print_philly(p: &Plan, trace: &philly::Trace, window: (i64, i64), unpriced: bool, currency: &str) {
    let day = 86_400_000.0;
    let jobs = p.outcomes.first().map_or(0, |o| o.report.waits.placed);
    println!(
        "philly demand: {} jobs, {} tenants (VCs); waits over the jobs submitted in [{} d, {} d) ({jobs} jobs), allocation over that window",
        trace.jobs.len(),
        trace.tenants.len(),
        window.0 as f64 / day,
        window.1 as f64 / day
    );
    let cost = if unpriced {
        String::new()
    } else {
        format!(" {:>10}", format!("{currency}/H"))
    };
    println!(
        "{:<12} {:>5} {:>5}{cost} {:>9} {:>9} {:>6} {:>10} {:>10} {:>7} {:>8} {:>6}",
        "CANDIDATE", "RACKS", "GPUS", "MEAN", "P95", "GANGS", "GANG MEAN", "GANG P95", "ALLOC%", "REFUSED", "MEETS"
    );
    let rows = philly_rows(p);
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by_key(|&i| rows[i].gpus);
    for i in order {
        let r = &rows[i];
        let cost = if unpriced {
            String::new()
        } else {
            format!(" {:>10.2}", p.outcomes[i].cost_per_hour)
        };
        let mark = if r.chosen { " ◀ chosen" } else { "" };
        println!(
            "{:<12} {:>5} {:>5}{cost} {:>9} {:>9} {:>6} {:>10} {:>10} {:>7.1} {:>8} {:>6}{mark}",
            r.candidate,
            r.racks,
            r.gpus,
            human_seconds(r.mean_s),
            human_seconds(r.p95_s),
            r.multi_node_jobs,
            human_seconds(r.multi_node_mean_s),
            human_seconds(r.multi_node_p95_s),
            r.allocated_pct,
            r.refused + r.never_placed,
            if r.meets { "yes" } else { "no" }
        );
    }
    let classes: BTreeSet<&String> = p.outcomes.iter().flat_map(|o| o.p95_wait_s.keys()).collect();
    let targets: Vec<String> = classes
        .iter()
        .filter_map(|c| p.target.of(c).map(|t| format!("{c} ≤ {}", human_seconds(t))))
        .collect();
    println!("target p95: {}", targets.join(", "));
    match (p.chosen, p.closest) {
        (Some(i), _) => {
            let o = &p.outcomes[i];
            let cost = if unpriced {
                String::new()
            } else {
                format!(", {:.2}/h", o.cost_per_hour)
            };
            println!(
                "smallest fleet meeting the target: {} ({} racks, {} GPUs{cost})",
                o.candidate.label,
                o.candidate.racks.unwrap_or(0),
                o.gpus
            );
        }
        _ => println!("{}", p.answer()),
    }
}

fn print_plan(p: &Plan, currency: &str) {
    let classes: BTreeSet<&String> = p.outcomes.iter().flat_map(|o| o.p95_wait_s.keys()).collect();
    let width = p
        .outcomes
        .iter()
        .map(|o| o.candidate.label.len())
        .max()
        .unwrap_or(9)
        .max(9);
    let mut head = format!("{:<width$} {:>6} {:>11}", "CANDIDATE", "GPUS", format!("{currency}/H"));
    for c in &classes {
        head.push_str(&format!(" {:>16}", format!("P95 {c}")));
    }
    head.push_str(&format!(
        " {:>7} {:>8} {:>6}  WORST P95 (log)",
        "ALLOC%", "REFUSED", "MEETS"
    ));
    println!("{head}");
    let worst_max = p
        .outcomes
        .iter()
        .flat_map(|o| o.p95_wait_s.values().copied())
        .fold(1.0, f64::max);
    let mut order: Vec<usize> = (0..p.outcomes.len()).collect();
    order.sort_by(|&a, &b| p.outcomes[a].cost_per_hour.total_cmp(&p.outcomes[b].cost_per_hour));
    for i in order {
        let o = &p.outcomes[i];
        let mut line = format!("{:<width$} {:>6} {:>11.2}", o.candidate.label, o.gpus, o.cost_per_hour);
        for c in &classes {
            let v = o
                .p95_wait_s
                .get(*c)
                .map(|w| human_seconds(*w))
                .unwrap_or_else(|| "-".into());
            line.push_str(&format!(" {v:>16}"));
        }
        let worst = o.p95_wait_s.values().copied().fold(0.0, f64::max);
        let bar = ((1.0 + worst).ln() / (1.0 + worst_max).ln() * 20.0).round() as usize;
        let mark = if Some(i) == p.chosen { " ◀ chosen" } else { "" };
        line.push_str(&format!(
            " {:>7.1} {:>8} {:>6}  {}{mark}",
            o.allocated_pct,
            o.refused + o.never_placed,
            if o.meets { "yes" } else { "no" },
            "█".repeat(bar.max(usize::from(worst > 0.0)))
        ));
        println!("{}", line.trim_end());
    }
    let targets: Vec<String> = classes
        .iter()
        .filter_map(|c| p.target.of(c).map(|t| format!("{c} ≤ {}", human_seconds(t))))
        .collect();
    println!("target p95: {}", targets.join(", "));
    println!("{}", p.answer());
}

/// One interval of the usage ledger, as `tessera usage --by interval -o csv` exports it.
#[derive(Clone, Debug, PartialEq)]
pub struct LedgerRow {
    pub workload: String,
    pub tenant: String,
    pub priority: String,
    /// `whole:N`, `mig:PROFILE` or `fraction:MILLI`.
    pub gpu: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub pool: String,
    pub submitted_ms: i64,
    pub started_ms: i64,
    /// `None` while it still runs.
    pub ended_ms: Option<i64>,
}

/// The columns the planner needs (others are ignored).
const LEDGER_COLUMNS: [&str; 10] = [
    "workload",
    "tenant",
    "priority",
    "gpu",
    "cpu_milli",
    "memory_mib",
    "pool",
    "submitted_at",
    "started_at",
    "ended_at",
];

/// Parses a ledger export, checking every field; errors name the file, line and column.
pub fn parse_ledger(text: &str, file: &str) -> Result<Vec<LedgerRow>> {
    let mut lines = text.lines().enumerate();
    let header: Vec<&str> = lines
        .next()
        .map(|(_, h)| h.trim().split(',').map(str::trim).collect())
        .unwrap_or_default();
    let mut idx = [0usize; 10];
    for (k, c) in LEDGER_COLUMNS.iter().enumerate() {
        idx[k] = header.iter().position(|h| h == c).with_context(|| {
            format!("{file}:1: missing column `{c}` (export the ledger with `tessera usage --by interval -o csv`)")
        })?;
    }
    let mut rows = Vec::new();
    for (i, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let n = i + 1;
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if f.len() != header.len() {
            bail!("{file}:{n}: expected {} fields, found {}", header.len(), f.len());
        }
        let get = |k: usize| f[idx[k]];
        let num = |k: usize| -> Result<u64> {
            get(k)
                .parse()
                .map_err(|_| anyhow::anyhow!("{file}:{n}: {}: `{}` is not a number", LEDGER_COLUMNS[k], get(k)))
        };
        let time = |k: usize| -> Result<i64> {
            tessera_api::parse_time_ms(get(k)).with_context(|| {
                format!(
                    "{file}:{n}: {}: `{}` is not an RFC 3339 time",
                    LEDGER_COLUMNS[k],
                    get(k)
                )
            })
        };
        let gpu = get(3).to_string();
        parse_gpu(&gpu).map_err(|e| anyhow::anyhow!("{file}:{n}: gpu: {e}"))?;
        let row = LedgerRow {
            workload: get(0).to_string(),
            tenant: get(1).to_string(),
            priority: get(2).to_string(),
            gpu,
            cpu_milli: num(4)?,
            memory_mib: num(5)?,
            pool: get(6).to_string(),
            submitted_ms: time(7)?,
            started_ms: time(8)?,
            ended_ms: if get(9).is_empty() { None } else { Some(time(9)?) },
        };
        if row.started_ms < row.submitted_ms || row.ended_ms.is_some_and(|e| e < row.started_ms) {
            bail!("{file}:{n}: times out of order (submitted_at ≤ started_at ≤ ended_at)");
        }
        rows.push(row);
    }
    if rows.is_empty() {
        bail!("{file}: the ledger has no interval");
    }
    Ok(rows)
}

enum Gpu<'a> {
    Whole(u8),
    Mig(&'a str),
    Fraction(u16),
}

fn parse_gpu(s: &str) -> Result<Gpu<'_>, String> {
    let bad = || format!("`{s}` is not whole:N, mig:PROFILE or fraction:MILLI");
    let (kind, v) = s.split_once(':').ok_or_else(bad)?;
    match kind {
        "whole" => v
            .parse()
            .ok()
            .filter(|g| (1..=16).contains(g))
            .map(Gpu::Whole)
            .ok_or_else(bad),
        "mig" if !v.is_empty() => Ok(Gpu::Mig(v)),
        "fraction" => v
            .parse()
            .ok()
            .filter(|m| (1..1000).contains(m))
            .map(Gpu::Fraction)
            .ok_or_else(bad),
        _ => Err(bad()),
    }
}

/// The ledger as a timed demand on `fleet`: one request per workload, arriving when it was
/// submitted and running for the sum of its intervals (a preempted workload's intervals all
/// count: the work it lost was demand too); an interval still open runs until the latest time
/// in the export. Its pool must exist in the fleet; its class is its priority.
pub fn ledger_arrivals(rows: &[LedgerRow], fleet: &Fleet) -> Result<Vec<Arrival>, String> {
    let horizon = rows
        .iter()
        .map(|r| r.ended_ms.unwrap_or(r.started_ms))
        .max()
        .unwrap_or(0);
    let mut by_workload: BTreeMap<&str, (&LedgerRow, i64)> = BTreeMap::new();
    for r in rows {
        let run = r.ended_ms.unwrap_or(horizon).max(r.started_ms) - r.started_ms;
        by_workload.entry(&r.workload).or_insert((r, 0)).1 += run;
    }
    let t0 = rows.iter().map(|r| r.submitted_ms).min().unwrap_or(0);
    let mut out = Vec::new();
    for (name, (r, run_ms)) in by_workload {
        let pool = fleet.pool_by_name(&r.pool).ok_or_else(|| {
            format!(
                "the candidate has no pool `{}`, which the ledger's workloads use",
                r.pool
            )
        })?;
        let shape = match parse_gpu(&r.gpu)? {
            Gpu::Whole(n) => Shape::Whole { gpus: n },
            Gpu::Fraction(m) => Shape::Fraction {
                milli: m,
                memory_mib: None,
            },
            Gpu::Mig(p) => Shape::Mig(MigChoice::resolve(&fleet.catalogue, p).map_err(|e| format!("{name}: {e}"))?),
        };
        let mut request = Request::new(shape).with_host(r.cpu_milli, r.memory_mib);
        request.pool = Some(pool);
        out.push(Arrival {
            name: name.to_string(),
            tenant: r.tenant.clone(),
            class: r.priority.clone(),
            priority: r.priority.clone(),
            request,
            gang: None,
            arrive_ms: r.submitted_ms - t0,
            run_ms,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEDGER: &str = "workload,seq,tenant,project,priority,gpu,cpu_milli,memory_mib,pool,model,units,submitted_at,started_at,ended_at\n\
        w1,0,vision,a,standard,whole:8,8000,65536,training,H100-80GB-SXM,8.000,2026-11-30T10:00:00.000Z,2026-11-30T10:00:00.000Z,2026-11-30T10:30:00.000Z\n\
        w1,1,vision,a,standard,whole:8,8000,65536,training,H100-80GB-SXM,8.000,2026-11-30T10:00:00.000Z,2026-11-30T11:00:00.000Z,2026-11-30T11:30:00.000Z\n\
        w2,0,vision,a,high,mig:3g.40gb,4000,8192,serving,A100-80GB,0.375,2026-11-30T10:05:00.000Z,2026-11-30T10:06:00.000Z,\n";

    #[test]
    fn a_ledger_rebuilds_one_request_per_workload_with_its_total_run() {
        let rows = parse_ledger(LEDGER, "u.csv").unwrap();
        assert_eq!(rows.len(), 3);
        let fleet = Fleet::seed();
        let a = ledger_arrivals(&rows, &fleet).unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!((a[0].name.as_str(), a[0].arrive_ms, a[0].run_ms), ("w1", 0, 3_600_000));
        assert!(matches!(a[0].request.shape, Shape::Whole { gpus: 8 }));
        assert_eq!(a[0].request.pool, fleet.pool_by_name("training"));
        // w2 still runs: until the export's latest time (11:30), 84 minutes.
        assert_eq!(
            (a[1].class.as_str(), a[1].arrive_ms, a[1].run_ms),
            ("high", 300_000, 84 * 60_000)
        );
        assert!(matches!(a[1].request.shape, Shape::Mig(_)));
        let other = Fleet::synthetic(6);
        assert!(ledger_arrivals(&rows, &other).is_ok());
        let no_pool = Fleet::from_openb_nodes("sn,cpu_milli,memory_mib,gpu,model\nn,1000,1000,1,T4\n", "n").unwrap();
        assert_eq!(
            ledger_arrivals(&rows, &no_pool).unwrap_err(),
            "the candidate has no pool `training`, which the ledger's workloads use"
        );
    }

    #[test]
    fn a_bad_ledger_is_one_line_naming_the_place() {
        let e = |t: &str| parse_ledger(t, "u.csv").unwrap_err().to_string();
        assert_eq!(
            e("key,allocated_unit_hours\nx,1\n"),
            "u.csv:1: missing column `workload` (export the ledger with `tessera usage --by interval -o csv`)"
        );
        let bad_gpu = LEDGER.replace("whole:8,8000", "whole:99,8000");
        assert_eq!(
            e(&bad_gpu),
            "u.csv:2: gpu: `whole:99` is not whole:N, mig:PROFILE or fraction:MILLI"
        );
        let bad_time = LEDGER.replace("2026-11-30T10:05:00.000Z", "yesterday");
        assert_eq!(
            e(&bad_time),
            "u.csv:4: submitted_at: `yesterday` is not an RFC 3339 time"
        );
        let order = LEDGER.replace("2026-11-30T10:30:00.000Z", "2026-11-30T09:00:00.000Z");
        assert_eq!(
            e(&order),
            "u.csv:2: times out of order (submitted_at ≤ started_at ≤ ended_at)"
        );
    }
}
