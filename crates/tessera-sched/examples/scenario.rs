//! Runs the multi-tenant scenario (`scenario::run`) on the seed fleet without building the CLI:
//! `cargo run -p tessera-sched --release --example scenario -- [TENANTS] [HOURS] [SEED]`.
//! Prints the report as `tessera sim scenario --json` does, pretty, on stdout.

use std::sync::Arc;
use std::time::Instant;

use tessera_model::Fleet;
use tessera_sched::scenario::{ScenarioConfig, run};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, d: f64| args.get(i).map(|a| a.parse::<f64>().expect("a number")).unwrap_or(d);
    let hours = arg(1, 48.0);
    let cfg = ScenarioConfig {
        tenants: arg(0, 40.0) as usize,
        hours,
        seed: arg(2, 1.0) as u64,
        warmup_hours: (hours / 8.0).min(6.0),
        ..Default::default()
    };
    let started = Instant::now();
    let r = run(Arc::new(Fleet::seed()), &cfg, &mut || {
        started.elapsed().as_nanos() as u64
    });
    eprintln!("wall {:.1} s", started.elapsed().as_secs_f64());
    println!("{}", serde_json::to_string_pretty(&r).expect("serialisable"));
}
