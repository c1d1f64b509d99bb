//! What the Philly examples share: their arguments (`TRACE_DIR FLEET [SEEDS]`), the trace read
//! and reordered once per seed, the fleet's layout, and comma lists from the environment.

use std::fmt::Debug;
use std::str::FromStr;

use tessera_sched::philly::{self, Layout, Trace};

/// Reads `TRACE_DIR/philly_jobs.csv` (default `../shared/traces/philly`) for fleet `FLEET`
/// (default `philly-768`) and the same-second orders `SEEDS` (`N` or `A-B`, default `0`): the
/// fleet's name, the seeds, the trace in each seed's order, and the fleet's layout.
pub fn setup() -> (String, Vec<u64>, Vec<Trace>, Layout) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = args.first().map_or("../shared/traces/philly", String::as_str);
    let fleet_name = args.get(1).map_or("philly-768", String::as_str).to_string();
    let seeds: Vec<u64> = match args.get(2).map(|s| s.split_once('-')) {
        None => vec![0],
        Some(None) => vec![args[2].parse().expect("a seed")],
        Some(Some((a, b))) => (a.parse().expect("a seed")..=b.parse().expect("a seed")).collect(),
    };
    let text = std::fs::read_to_string(format!("{dir}/philly_jobs.csv")).expect("the job table");
    let trace = philly::parse(&text).expect("a valid trace");
    let traces = seeds.iter().map(|&s| trace.reordered(s)).collect();
    let layout = Layout::of(&philly::fleet(&fleet_name).expect("a Philly fleet")).expect("racks");
    (fleet_name, seeds, traces, layout)
}

/// The comma list of numbers in environment variable `name` (`default` when it is unset).
pub fn env_list<T: FromStr>(name: &str, default: &str) -> Vec<T>
where
    T::Err: Debug,
{
    std::env::var(name)
        .unwrap_or_else(|_| default.to_string())
        .split(',')
        .map(|x| x.parse().expect("a number"))
        .collect()
}
