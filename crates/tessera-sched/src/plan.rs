//! Capacity planning: which fleet meets a wait target per class at least cost.
//!
//! A [`Candidate`] fleet is a few node groups per pool (counts per GPU model). The planner
//! replays one timed demand (a list of [`Arrival`]s, rebuilt for each fleet since requests
//! name pools and models of the fleet they run on) on every candidate through
//! [`run_timed`] — the real scheduler cycle — and reports, per candidate, its GPUs, its cost
//! per hour, the p95 wait of every class, allocation and refusals; the chosen fleet is the
//! cheapest that meets the target: no refused request, nothing left waiting, and every class's
//! p95 wait within its target. When none meets it, the answer says so and names the closest
//! (the lowest worst ratio of p95 wait to target among those that refuse nothing).
//!
//! Candidates are written `POOL[@SHARING]:MODEL=NODES[xGPUS][+MODEL=…]`, pools separated by
//! `;`. `NODES` may be a range `A..B` (inclusive): a spec with ranges stands for every
//! combination, which is how a search over counts within bounds is asked for. Nodes get 16 CPUs
//! and 128 GiB of memory per GPU. This module also builds an open-arrival demand from the
//! scenario model ([`scenario_arrivals`]) and draws the p95-vs-cost chart ([`svg_chart`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use tessera_model::{Catalogue, Fleet, Sharing};

use crate::timed::{Arrival, TimedConfig, TimedReport, run_timed};

/// Most candidates one plan may expand to.
pub const MAX_CANDIDATES: usize = 256;

/// Nodes of one GPU model in a pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NodeGroup {
    pub model: String,
    pub nodes: u32,
    pub gpus: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PoolSpec {
    pub name: String,
    pub sharing: Sharing,
    pub groups: Vec<NodeGroup>,
}

/// One candidate fleet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Candidate {
    /// The spec without ranges, e.g. `training@whole:H100=4x8`.
    pub label: String,
    pub pools: Vec<PoolSpec>,
    /// A fleet of the Philly shape ([`crate::philly::fleet_of`]: racks of 8 nodes of 8 GPUs)
    /// with this many racks, instead of one built from `pools` (which then only describe it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub racks: Option<u32>,
}

impl Candidate {
    /// `racks` racks of the Philly shape, labelled as the protocol names its fleets
    /// (`philly-640` for 10 racks).
    pub fn philly(racks: u32) -> Candidate {
        Candidate {
            label: format!("philly-{}", racks * 64),
            pools: vec![PoolSpec {
                name: "philly".into(),
                sharing: Sharing::Whole,
                groups: vec![NodeGroup {
                    model: "A100-80GB".into(),
                    nodes: racks * 8,
                    gpus: 8,
                }],
            }],
            racks: Some(racks),
        }
    }

    pub fn gpus(&self) -> u64 {
        self.pools
            .iter()
            .flat_map(|p| &p.groups)
            .map(|g| g.nodes as u64 * g.gpus as u64)
            .sum()
    }

    /// The fleet. Models the built-in catalogue lacks are declared opaque only when `known`
    /// (the demand's own model names, such as the trace's `G2`) contains them.
    pub fn fleet(&self, known: &BTreeSet<String>) -> Result<Fleet, String> {
        if let Some(racks) = self.racks {
            return crate::philly::fleet_of(racks as usize)
                .map_err(|e| format!("candidate `{}`: {}", self.label, e.message));
        }
        let builtin = Catalogue::builtin();
        let mut text = String::new();
        let mut declared = BTreeSet::new();
        for g in self.pools.iter().flat_map(|p| &p.groups) {
            if builtin.find(&g.model).is_none() && declared.insert(g.model.clone()) {
                if !known.contains(&g.model) {
                    return Err(format!(
                        "unknown GPU model `{}` in candidate `{}` (a catalogue name such as H100-80GB-SXM, A100-80GB, L40S, or a model the demand names)",
                        g.model, self.label
                    ));
                }
                let _ = writeln!(text, "[[model]]\nname = \"{}\"\nmemory_gib = 0", g.model);
            }
        }
        for p in &self.pools {
            let _ = writeln!(text, "[[pool]]\nname = \"{}\"\nsharing = \"{}\"", p.name, p.sharing);
            if p.sharing == Sharing::Shared {
                // Candidates model capacity, not isolation: fractions of any tenants share GPUs.
                let _ = writeln!(text, "allow_tenant_mixing = true");
            }
            for (k, g) in p.groups.iter().enumerate() {
                let _ = writeln!(
                    text,
                    "[[pool.nodes]]\nname = \"{}-{k}\"\ncount = {}\ngpu_model = \"{}\"\ngpus = {}\ncpus = {}\nmemory_gib = {}",
                    p.name,
                    g.nodes,
                    g.model,
                    g.gpus,
                    16 * g.gpus.max(1) as u32,
                    128 * g.gpus.max(1) as u64
                );
            }
        }
        Fleet::from_toml(&text, &self.label).map_err(|e| format!("candidate `{}`: {}", self.label, e.message))
    }

    /// Cost per hour: GPUs × the price of their model (per GPU-hour). Every model needs a price.
    pub fn cost_per_hour(&self, prices: &Prices) -> Result<f64, String> {
        let mut cost = 0.0;
        for g in self.pools.iter().flat_map(|p| &p.groups) {
            let price = prices.get(&g.model).ok_or_else(|| {
                format!(
                    "no price for GPU model `{}`: pass --price {}=PRICE_PER_GPU_HOUR",
                    g.model, g.model
                )
            })?;
            cost += price * g.nodes as f64 * g.gpus as f64;
        }
        Ok(cost)
    }
}

/// Price per GPU-hour by model name (catalogue aliases match: `H100` prices `H100-80GB-SXM`).
#[derive(Clone, Debug, Default)]
pub struct Prices {
    by_name: BTreeMap<String, f64>,
}

impl Prices {
    /// From `MODEL=PRICE` entries.
    pub fn parse(entries: &[String]) -> Result<Prices, String> {
        let mut p = Prices::default();
        for e in entries
            .iter()
            .flat_map(|e| e.split(','))
            .map(str::trim)
            .filter(|e| !e.is_empty())
        {
            let (m, v) = e
                .split_once('=')
                .ok_or_else(|| format!("--price `{e}`: expected MODEL=PRICE_PER_GPU_HOUR"))?;
            let v: f64 = v
                .trim()
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| format!("--price `{e}`: `{}` is not a non-negative number", v.trim()))?;
            p.by_name.insert(canonical(m.trim()), v);
        }
        Ok(p)
    }

    pub fn get(&self, model: &str) -> Option<f64> {
        self.by_name.get(&canonical(model)).copied()
    }
}

/// The catalogue's name for a model, or the name itself (upper-cased) for opaque ones.
fn canonical(model: &str) -> String {
    let c = Catalogue::builtin();
    c.find(model)
        .map(|id| c.get(id).name.clone())
        .unwrap_or_else(|| model.to_ascii_uppercase())
}

/// Parses candidate specs (see the module doc), expanding ranges.
pub fn parse_candidates(specs: &[String]) -> Result<Vec<Candidate>, String> {
    let mut out = Vec::new();
    for spec in specs.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        // Each pool: (name, sharing, groups of (model, node range, gpus)).
        let mut pools = Vec::new();
        for pool in spec.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let bad = |why: &str| format!("candidate `{spec}`: `{pool}`: {why}");
            let (head, groups) = pool
                .split_once(':')
                .ok_or_else(|| bad("expected POOL[@SHARING]:MODEL=NODES[xGPUS][+…]"))?;
            let (name, sharing) = match head.split_once('@') {
                Some((n, s)) => (
                    n.trim(),
                    match s.trim() {
                        "whole" => Sharing::Whole,
                        "mig" => Sharing::Mig,
                        "shared" => Sharing::Shared,
                        other => return Err(bad(&format!("sharing `{other}` is not whole, mig or shared"))),
                    },
                ),
                None => (head.trim(), Sharing::Shared),
            };
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                return Err(bad(&format!(
                    "`{name}` is not a pool name (letters, digits, '-' and '_')"
                )));
            }
            let mut gs = Vec::new();
            for g in groups.split('+').map(str::trim) {
                let (model, count) = g
                    .split_once('=')
                    .ok_or_else(|| bad(&format!("`{g}`: expected MODEL=NODES[xGPUS]")))?;
                let (nodes, gpus) = match count.split_once('x') {
                    Some((n, g)) => (n, g),
                    None => (count, "8"),
                };
                let gpus: u8 = gpus
                    .trim()
                    .parse()
                    .ok()
                    .filter(|g| (1..=16).contains(g))
                    .ok_or_else(|| bad(&format!("`{g}`: GPUs per node must be 1..16")))?;
                let num = |s: &str| -> Result<u32, String> {
                    s.trim()
                        .parse()
                        .map_err(|_| bad(&format!("`{g}`: `{}` is not a node count", s.trim())))
                };
                let (lo, hi) = match nodes.split_once("..") {
                    Some((a, b)) => (num(a)?, num(b)?),
                    None => (num(nodes)?, num(nodes)?),
                };
                if lo > hi {
                    return Err(bad(&format!("`{g}`: the range {lo}..{hi} is empty")));
                }
                if model.trim().is_empty() {
                    return Err(bad(&format!("`{g}`: no GPU model")));
                }
                gs.push((model.trim().to_string(), lo, hi, gpus));
            }
            pools.push((name.to_string(), sharing, gs));
        }
        if pools.is_empty() {
            return Err(format!("candidate `{spec}`: no pool"));
        }
        // Expand every range (odometer over the groups).
        let ranges: Vec<(u32, u32)> = pools.iter().flat_map(|p| p.2.iter().map(|g| (g.1, g.2))).collect();
        let mut counts: Vec<u32> = ranges.iter().map(|r| r.0).collect();
        loop {
            if counts.iter().all(|&c| c == 0) {
                // A fleet with no node is not a candidate.
            } else {
                if out.len() == MAX_CANDIDATES {
                    return Err(format!(
                        "the candidates expand to more than {MAX_CANDIDATES} fleets: narrow the ranges"
                    ));
                }
                let mut k = 0;
                let mut cand_pools = Vec::new();
                for (name, sharing, gs) in &pools {
                    let mut groups = Vec::new();
                    for (model, _, _, gpus) in gs {
                        if counts[k] > 0 {
                            groups.push(NodeGroup {
                                model: model.clone(),
                                nodes: counts[k],
                                gpus: *gpus,
                            });
                        }
                        k += 1;
                    }
                    if !groups.is_empty() {
                        cand_pools.push(PoolSpec {
                            name: name.clone(),
                            sharing: *sharing,
                            groups,
                        });
                    }
                }
                let label = cand_pools
                    .iter()
                    .map(|p| {
                        let gs: Vec<String> = p
                            .groups
                            .iter()
                            .map(|g| format!("{}={}x{}", g.model, g.nodes, g.gpus))
                            .collect();
                        let sharing = if p.sharing == Sharing::Shared {
                            String::new()
                        } else {
                            format!("@{}", p.sharing)
                        };
                        format!("{}{sharing}:{}", p.name, gs.join("+"))
                    })
                    .collect::<Vec<_>>()
                    .join(";");
                out.push(Candidate {
                    label,
                    pools: cand_pools,
                    racks: None,
                });
            }
            // Next combination.
            let mut i = 0;
            loop {
                if i == counts.len() {
                    break;
                }
                if counts[i] < ranges[i].1 {
                    counts[i] += 1;
                    break;
                }
                counts[i] = ranges[i].0;
                i += 1;
            }
            if i == counts.len() {
                break;
            }
        }
    }
    if out.is_empty() {
        return Err("no candidate fleet given".into());
    }
    Ok(out)
}

/// The wait target: p95 seconds per class, with a default for classes not named.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Target {
    pub default_p95_s: Option<f64>,
    pub per_class: BTreeMap<String, f64>,
}

impl Target {
    /// `SECONDS` for every class, or `CLASS=SECONDS,…` (with `*=SECONDS` for the rest).
    pub fn parse(s: &str) -> Result<Target, String> {
        let mut t = Target {
            default_p95_s: None,
            per_class: BTreeMap::new(),
        };
        let secs = |v: &str| -> Result<f64, String> {
            v.trim()
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| format!("--target-p95: `{}` is not a number of seconds", v.trim()))
        };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part.split_once('=') {
                Some(("*", v)) => t.default_p95_s = Some(secs(v)?),
                Some((c, v)) => {
                    t.per_class.insert(c.trim().to_string(), secs(v)?);
                }
                None => t.default_p95_s = Some(secs(part)?),
            }
        }
        if t.default_p95_s.is_none() && t.per_class.is_empty() {
            return Err("--target-p95: no target given".into());
        }
        Ok(t)
    }

    /// The target of `class`, if it has one.
    pub fn of(&self, class: &str) -> Option<f64> {
        self.per_class.get(class).copied().or(self.default_p95_s)
    }
}

/// One candidate's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    pub candidate: Candidate,
    pub gpus: u64,
    pub cost_per_hour: f64,
    pub p95_wait_s: BTreeMap<String, f64>,
    pub allocated_pct: f64,
    pub refused: u64,
    pub never_placed: u64,
    pub meets: bool,
    /// The largest p95 ÷ target over the classes with a target (∞ with refusals).
    pub worst_ratio: f64,
    #[serde(skip)]
    pub report: TimedReport,
}

/// The planner's answer.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub target: Target,
    pub outcomes: Vec<Outcome>,
    /// Index of the cheapest candidate meeting the target.
    pub chosen: Option<usize>,
    /// When none meets it: index of the closest one.
    pub closest: Option<usize>,
}

impl Plan {
    /// One sentence: the answer.
    pub fn answer(&self) -> String {
        match (self.chosen, self.closest) {
            (Some(i), _) => {
                let o = &self.outcomes[i];
                format!(
                    "cheapest fleet meeting the target: {} ({} GPUs, {:.2}/h)",
                    o.candidate.label, o.gpus, o.cost_per_hour
                )
            }
            (None, Some(i)) => {
                let o = &self.outcomes[i];
                format!(
                    "no candidate meets the target; the closest is {} ({} GPUs, {:.2}/h, worst class at {:.1}× its target p95)",
                    o.candidate.label, o.gpus, o.cost_per_hour, o.worst_ratio
                )
            }
            (None, None) => "no candidate meets the target, and every one refuses part of the demand".into(),
        }
    }
}

/// Replays the demand on every candidate (`threads` at a time) and picks the fleet.
/// `demand` builds the arrivals for one fleet; `known_models` are model names the demand
/// itself names (declared opaque in candidates that use them). `cost` is checked up front.
pub fn plan(
    candidates: &[Candidate],
    demand: &(dyn Fn(&Fleet) -> Result<Vec<Arrival>, String> + Sync),
    known_models: &BTreeSet<String>,
    prices: &Prices,
    target: &Target,
    cfg: &TimedConfig,
    threads: usize,
) -> Result<Plan, String> {
    let costs = candidates
        .iter()
        .map(|c| c.cost_per_hour(prices))
        .collect::<Result<Vec<_>, _>>()?;
    let fleets = candidates
        .iter()
        .map(|c| c.fleet(known_models).map(Arc::new))
        .collect::<Result<Vec<_>, _>>()?;
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<Result<TimedReport, String>>>> =
        candidates.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, candidates.len()) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= candidates.len() {
                        break;
                    }
                    let r = demand(&fleets[i]).and_then(|a| run_timed(fleets[i].clone(), &a, cfg));
                    *results[i].lock().expect("no panics while holding") = Some(r);
                }
            });
        }
    });
    let mut outcomes = Vec::new();
    for (i, r) in results.into_iter().enumerate() {
        let report = r
            .into_inner()
            .expect("no panics while holding")
            .expect("every candidate ran")?;
        outcomes.push(outcome(candidates[i].clone(), costs[i], report, target));
    }
    let pick = |ok: &dyn Fn(&Outcome) -> bool, key: &dyn Fn(&Outcome) -> (f64, f64, u64)| {
        outcomes
            .iter()
            .enumerate()
            .filter(|(_, o)| ok(o))
            .min_by(|(_, a), (_, b)| {
                let (ka, kb) = (key(a), key(b));
                ka.0.total_cmp(&kb.0).then(ka.1.total_cmp(&kb.1)).then(ka.2.cmp(&kb.2))
            })
            .map(|(i, _)| i)
    };
    let chosen = pick(&|o| o.meets, &|o| (o.cost_per_hour, o.worst_ratio, o.gpus));
    let closest = if chosen.is_some() {
        None
    } else {
        pick(&|o| o.refused == 0 && o.never_placed == 0, &|o| {
            (o.worst_ratio, o.cost_per_hour, o.gpus)
        })
    };
    Ok(Plan {
        target: target.clone(),
        outcomes,
        chosen,
        closest,
    })
}

fn outcome(candidate: Candidate, cost: f64, report: TimedReport, target: &Target) -> Outcome {
    let p95: BTreeMap<String, f64> = report.by_class.iter().map(|(k, w)| (k.clone(), w.p95_s)).collect();
    let mut worst: f64 = 0.0;
    for (class, p) in &p95 {
        if let Some(t) = target.of(class) {
            worst = worst.max(if t > 0.0 {
                p / t
            } else if *p > 0.0 {
                f64::INFINITY
            } else {
                0.0
            });
        }
    }
    let complete = report.refused == 0 && report.never_placed == 0;
    if !complete {
        worst = f64::INFINITY;
    }
    Outcome {
        gpus: candidate.gpus(),
        candidate,
        cost_per_hour: cost,
        p95_wait_s: p95,
        allocated_pct: report.allocated_pct,
        refused: report.refused,
        never_placed: report.never_placed,
        meets: complete && worst <= 1.0,
        worst_ratio: worst,
        report,
    }
}

/// An open-arrival demand from the scenario model: each of `tenants` tenants submits to each
/// of the three pools (training gangs, MIG services, fractional notebooks, as
/// [`crate::scenario::draw`] draws them, with their durations and priority classes) at
/// exponential intervals averaging `per_tenant_hour` requests per hour, for `hours` hours.
/// The same seed gives the same demand on every fleet (draws do not depend on the fleet).
pub fn scenario_arrivals(fleet: &Fleet, tenants: usize, hours: f64, per_tenant_hour: f64, seed: u64) -> Vec<Arrival> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let end_ms = (hours * 3_600_000.0) as i64;
    let mut out = Vec::new();
    for t in 0..tenants {
        for kind in 0..3 {
            let mut now = 0i64;
            loop {
                let u: f64 = rng.random_range(f64::EPSILON..1.0);
                now += (-u.ln() / per_tenant_hour * 3_600_000.0) as i64;
                if now >= end_ms {
                    break;
                }
                let (request, run_ms, priority) = crate::scenario::draw(fleet, kind, &mut rng);
                out.push(Arrival {
                    name: format!("team-{t:02}-{kind}-{}", out.len()),
                    tenant: format!("team-{t:02}"),
                    class: priority.to_string(),
                    priority: priority.to_string(),
                    request,
                    gang: None,
                    arrive_ms: now,
                    run_ms,
                });
            }
        }
    }
    out
}

/// The chart: p95 wait (per class, log scale) against cost per hour, one dot per candidate
/// and class, the target as a dashed line per class, the chosen fleet ringed.
pub fn svg_chart(plan: &Plan, currency: &str) -> String {
    const W: f64 = 760.0;
    const H: f64 = 440.0;
    const L: f64 = 80.0;
    const R: f64 = 170.0;
    const T: f64 = 40.0;
    const B: f64 = 60.0;
    const COLOURS: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];
    let classes: BTreeSet<&String> = plan.outcomes.iter().flat_map(|o| o.p95_wait_s.keys()).collect();
    let costs: Vec<f64> = plan.outcomes.iter().map(|o| o.cost_per_hour).collect();
    let (cmin, cmax) = (
        costs.iter().copied().fold(f64::INFINITY, f64::min),
        costs.iter().copied().fold(0.0, f64::max),
    );
    let (cmin, cmax) = if cmax > cmin {
        (cmin, cmax)
    } else {
        (cmin - 1.0, cmax + 1.0)
    };
    // Waits on log10(1 + s), from 0 up to the largest wait or target.
    let lw = |s: f64| (1.0 + s.max(0.0)).log10();
    let wmax = plan
        .outcomes
        .iter()
        .flat_map(|o| o.p95_wait_s.values().copied())
        .chain(classes.iter().filter_map(|c| plan.target.of(c)))
        .fold(1.0, f64::max);
    let ymax = lw(wmax).ceil().max(1.0);
    let x = |c: f64| L + (c - cmin) / (cmax - cmin) * (W - L - R);
    let y = |s: f64| H - B - lw(s) / ymax * (H - T - B);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{L}\" y=\"24\" font-size=\"15\">p95 wait per class vs fleet cost</text>\n"
    );
    let _ = writeln!(
        svg,
        "<line x1=\"{L}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/><line x1=\"{L}\" y1=\"{T}\" x2=\"{L}\" y2=\"{}\" stroke=\"black\"/>",
        H - B,
        W - R,
        H - B,
        H - B
    );
    for k in 0..=4 {
        let c = cmin + (cmax - cmin) * k as f64 / 4.0;
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{c:.0}</text>",
            x(c),
            H - B + 18.0
        );
    }
    for e in 0..=ymax as i32 {
        // Gridlines at 0 s and at 10, 100, … seconds.
        let s = if e == 0 { 0.0 } else { 10f64.powi(e) };
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text><line x1=\"{L}\" y1=\"{:.1}\" x2=\"{}\" y2=\"{:.1}\" stroke=\"#ddd\"/>",
            L - 6.0,
            y(s) + 4.0,
            if s < 1000.0 {
                format!("{s:.0} s")
            } else {
                human_seconds(s)
            },
            y(s),
            W - R,
            y(s)
        );
    }
    let _ = writeln!(
        svg,
        "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">cost per hour ({})</text><text x=\"18\" y=\"{:.1}\" transform=\"rotate(-90 18 {:.1})\" text-anchor=\"middle\">p95 wait</text>",
        L + (W - L - R) / 2.0,
        H - 16.0,
        xml(currency),
        T + (H - T - B) / 2.0,
        T + (H - T - B) / 2.0
    );
    for (ci, class) in classes.iter().enumerate() {
        let colour = COLOURS[ci % COLOURS.len()];
        if let Some(t) = plan.target.of(class) {
            let _ = writeln!(
                svg,
                "<line x1=\"{L}\" y1=\"{:.1}\" x2=\"{}\" y2=\"{:.1}\" stroke=\"{colour}\" stroke-dasharray=\"5,4\"/>",
                y(t),
                W - R,
                y(t)
            );
        }
        let mut pts: Vec<(f64, f64)> = plan
            .outcomes
            .iter()
            .filter_map(|o| o.p95_wait_s.get(*class).map(|w| (o.cost_per_hour, *w)))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        for (c, w) in &pts {
            let _ = writeln!(
                svg,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{colour}\"><title>{}: {} at {c:.2}/h</title></circle>",
                x(*c),
                y(*w),
                xml(class),
                human_seconds(*w)
            );
        }
        let ly = T + 16.0 * ci as f64 + 8.0;
        let _ = writeln!(
            svg,
            "<circle cx=\"{}\" cy=\"{ly}\" r=\"4\" fill=\"{colour}\"/><text x=\"{}\" y=\"{:.1}\">{}</text>",
            W - R + 16.0,
            W - R + 26.0,
            ly + 4.0,
            xml(class)
        );
    }
    if let Some(i) = plan.chosen {
        let o = &plan.outcomes[i];
        let w = o.p95_wait_s.values().copied().fold(0.0, f64::max);
        let _ = writeln!(
            svg,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"9\" fill=\"none\" stroke=\"black\" stroke-width=\"2\"/><text x=\"{:.1}\" y=\"{:.1}\">chosen</text>",
            x(o.cost_per_hour),
            y(w),
            x(o.cost_per_hour) + 12.0,
            y(w) - 10.0
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// `0 s`, `45 s`, `12 min`, `3.5 h`, `2.0 d`.
pub fn human_seconds(s: f64) -> String {
    if s < 60.0 {
        format!("{s:.0} s")
    } else if s < 3600.0 {
        format!("{:.0} min", s / 60.0)
    } else if s < 86_400.0 {
        format!("{:.1} h", s / 3600.0)
    } else {
        format!("{:.1} d", s / 86_400.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_model::Request;

    fn prices() -> Prices {
        Prices::parse(&["H100=4,L40S=1.5".to_string()]).unwrap()
    }

    /// Three 8-GPU training jobs of one hour arriving together, then a fourth an hour later.
    fn demand(fleet: &Fleet) -> Result<Vec<Arrival>, String> {
        let pool = fleet.pool_by_name("training");
        let job = |name: &str, at_s: i64| Arrival {
            name: name.into(),
            tenant: "t".into(),
            class: "standard".into(),
            priority: "standard".into(),
            request: {
                let mut r = Request::whole(8);
                r.pool = pool;
                r
            },
            gang: None,
            arrive_ms: at_s * 1000,
            run_ms: 3_600_000,
        };
        Ok(vec![job("a", 0), job("b", 0), job("c", 0), job("d", 3600)])
    }

    fn cfg() -> TimedConfig {
        TimedConfig {
            policy: "bestfit".into(),
            ..Default::default()
        }
    }

    #[test]
    fn parses_specs_expands_ranges_and_names_bad_parts() {
        let c = parse_candidates(&["training@whole:H100=1..3x8;dev:L40S=2x4+T4=1".to_string()]).unwrap();
        assert_eq!(c.len(), 3);
        assert_eq!(c[0].label, "training@whole:H100=1x8;dev:L40S=2x4+T4=1x8");
        assert_eq!(c[2].gpus(), 24 + 8 + 8);
        assert_eq!(c[1].pools[1].sharing, Sharing::Shared);
        let e = |s: &str| parse_candidates(&[s.to_string()]).unwrap_err();
        assert_eq!(
            e("training:H100=3..1"),
            "candidate `training:H100=3..1`: `training:H100=3..1`: `H100=3..1`: the range 3..1 is empty"
        );
        assert!(e("training@fast:H100=1").contains("sharing `fast` is not whole, mig or shared"));
        assert!(e("H100=1").contains("expected POOL[@SHARING]:MODEL=NODES"));
        assert!(e("t:H100=1..300;u:L4=1..2").contains("more than 256 fleets"));
        // A range from zero drops the group (and the empty fleet) instead of listing zero nodes.
        let c = parse_candidates(&["t@whole:H100=0..1+L4=0..1".to_string()]).unwrap();
        assert_eq!(
            c.iter().map(|c| c.label.as_str()).collect::<Vec<_>>(),
            ["t@whole:H100=1x8", "t@whole:L4=1x8", "t@whole:H100=1x8+L4=1x8"]
        );
    }

    #[test]
    fn every_model_needs_a_price_and_a_known_name() {
        let c = &parse_candidates(&["t@whole:B200=1".to_string()]).unwrap()[0];
        assert_eq!(
            c.cost_per_hour(&prices()).unwrap_err(),
            "no price for GPU model `B200`: pass --price B200=PRICE_PER_GPU_HOUR"
        );
        assert_eq!(
            c.cost_per_hour(&Prices::parse(&["B200-180GB=6".into()]).unwrap()),
            Ok(48.0)
        );
        let g2 = &parse_candidates(&["openb:G2=1".to_string()]).unwrap()[0];
        assert!(
            g2.fleet(&BTreeSet::new())
                .unwrap_err()
                .contains("unknown GPU model `G2`")
        );
        let f = g2.fleet(&BTreeSet::from(["G2".to_string()])).unwrap();
        assert_eq!(f.gpu_count(), 8);
        assert!(Prices::parse(&["H100".into()]).is_err());
        assert!(Prices::parse(&["H100=-1".into()]).is_err());
    }

    #[test]
    fn the_planner_picks_the_cheapest_candidate_meeting_the_target() {
        // 1 node: b and c wait 1 h and 2 h, d 2 h → p95 2 h. 2 nodes: c waits 1 h, d 0.
        // 3 nodes: nobody waits. 4 nodes: nobody waits, dearer.
        let candidates = parse_candidates(&["training@whole:H100=1..4".to_string()]).unwrap();
        let target = Target::parse("standard=3600").unwrap();
        let p = plan(&candidates, &demand, &BTreeSet::new(), &prices(), &target, &cfg(), 2).unwrap();
        let p95: Vec<f64> = p.outcomes.iter().map(|o| o.p95_wait_s["standard"]).collect();
        assert_eq!(p95, [7200.0, 3600.0, 0.0, 0.0]);
        assert_eq!(
            p.outcomes.iter().map(|o| o.meets).collect::<Vec<_>>(),
            [false, true, true, true]
        );
        assert_eq!(p.chosen, Some(1));
        assert_eq!(p.outcomes[1].cost_per_hour, 64.0);
        assert_eq!(
            p.answer(),
            "cheapest fleet meeting the target: training@whole:H100=2x8 (16 GPUs, 64.00/h)"
        );
        let svg = svg_chart(&p, "USD");
        assert!(svg.starts_with("<svg") && svg.contains(">chosen</text>") && svg.ends_with("</svg>\n"));
        assert_eq!(
            svg.matches("<circle").count(),
            4 + 1 + 1,
            "a dot per candidate, a legend dot, the ring"
        );
    }

    #[test]
    fn when_no_candidate_meets_the_target_the_answer_says_so_and_names_the_closest() {
        let candidates = parse_candidates(&["training@whole:H100=1..2;dev:L40S=1".to_string()]).unwrap();
        let target = Target::parse("60").unwrap();
        let p = plan(&candidates, &demand, &BTreeSet::new(), &prices(), &target, &cfg(), 1).unwrap();
        assert_eq!(p.chosen, None);
        assert_eq!(p.closest, Some(1));
        assert_eq!(
            p.answer(),
            "no candidate meets the target; the closest is training@whole:H100=2x8;dev:L40S=1x8 (24 GPUs, 76.00/h, worst class at 60.0× its target p95)"
        );
        // A fleet without the pool refuses the demand: never "closest".
        let none = parse_candidates(&["dev:L40S=1x4".to_string()]).unwrap();
        let p = plan(&none, &demand, &BTreeSet::new(), &prices(), &target, &cfg(), 1).unwrap();
        assert_eq!(p.outcomes[0].refused, 4);
        assert_eq!((p.chosen, p.closest), (None, None));
    }

    #[test]
    fn targets_parse_per_class_with_a_default() {
        let t = Target::parse("high=60, *=600").unwrap();
        assert_eq!((t.of("high"), t.of("standard")), (Some(60.0), Some(600.0)));
        assert_eq!(Target::parse("300").unwrap().of("x"), Some(300.0));
        assert!(Target::parse("x=abc").is_err());
        assert!(Target::parse("").is_err());
    }

    #[test]
    fn scenario_demand_is_the_same_on_every_fleet_and_open() {
        let a = scenario_arrivals(&Fleet::seed(), 4, 10.0, 0.5, 7);
        let b = scenario_arrivals(&Fleet::synthetic(60), 4, 10.0, 0.5, 7);
        assert!(!a.is_empty());
        assert_eq!(a.len(), b.len());
        assert!(
            a.iter()
                .zip(&b)
                .all(|(x, y)| x.arrive_ms == y.arrive_ms && x.run_ms == y.run_ms)
        );
        assert!(a.iter().all(|x| x.arrive_ms < 10 * 3_600_000));
    }
}
