//! The Philly trace replay without the binary: `cargo run --release -p tessera-sched --example
//! philly -- [TRACE_DIR] [philly-768|philly-640] [POLICY|all] [SEEDS] [HOLDS]` prints every
//! metric per policy side by side (the same as `tessera sim philly`); SEEDS (`0`, or a range
//! `0-4`) are same-second orders, and several report the mean of every figure over them; HOLDS
//! sets the `engine` row's holds of single-node requests per pool (default:
//! [`EngineConfig::default`]'s, the gang rules with none).

use std::time::Instant;

use tessera_sched::philly::{self, EngineConfig, Layout, POLICIES, Policy};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = args.first().map_or("../shared/traces/philly", String::as_str);
    let fleet_name = args.get(1).map_or("philly-768", String::as_str);
    let which = args.get(2).map_or("all", String::as_str);
    let seeds: Vec<u64> = match args.get(3).map(|s| s.split_once('-')) {
        None => vec![0],
        Some(None) => vec![args[3].parse().expect("a seed")],
        Some(Some((a, b))) => (a.parse().expect("a seed")..=b.parse().expect("a seed")).collect(),
    };
    let mut engine = EngineConfig::default();
    if let Some(h) = args.get(4) {
        engine = EngineConfig::gang_rules(h.parse().expect("holds per pool"));
    }
    let path = format!("{dir}/philly_jobs.csv");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let trace = philly::parse(&text).expect("a valid trace");
    let traces: Vec<_> = seeds.iter().map(|&s| trace.reordered(s)).collect();
    let fleet = philly::fleet(fleet_name).expect("philly-768 or philly-640");
    let layout = Layout::of(&fleet).expect("racks");
    let policies: Vec<Policy> = if which == "all" {
        POLICIES.iter().map(|p| Policy::parse(p).unwrap()).collect()
    } else {
        vec![Policy::parse(which).expect("a policy")]
    };
    let mut reports = Vec::new();
    for p in policies {
        let t = Instant::now();
        let runs: Vec<_> = traces
            .iter()
            .map(|t| match p {
                Policy::Engine => philly::replay_engine(t, &layout, &engine).0,
                _ => philly::replay(t, &layout, p),
            })
            .collect();
        reports.push(philly::Report::mean(&runs).expect("a seed"));
        eprintln!("{}: {:.2} s", p.name(), t.elapsed().as_secs_f64());
    }
    println!(
        "{} jobs on {fleet_name} ({} GPUs), same-second orders {seeds:?}",
        trace.jobs.len(),
        layout.gpus()
    );
    print!("{}", philly::table(&reports));
}
