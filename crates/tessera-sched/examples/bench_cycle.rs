//! The cycle benchmark without the CLI: `bench_cycle [NODES] [QUEUED] [CYCLES] [CHURN]
//! [GANG_PERMILLE]`.
use std::sync::Arc;

use tessera_model::Fleet;
use tessera_sched::bench::{CycleBench, run};

fn main() {
    let a: Vec<usize> = std::env::args().skip(1).map(|s| s.parse().unwrap()).collect();
    let fleet = Arc::new(Fleet::synthetic(*a.first().unwrap_or(&10_000) as u32));
    let b = CycleBench {
        queued: *a.get(1).unwrap_or(&100_000),
        cycles: *a.get(2).unwrap_or(&20),
        churn: *a.get(3).unwrap_or(&200),
        tenants: 40,
        policy: "tessera".into(),
        seed: 7,
        gang_permille: *a.get(4).unwrap_or(&0) as u32,
    };
    let t = std::time::Instant::now();
    let r = run(fleet, &b, |s, now| {
        let t = std::time::Instant::now();
        let ds = s.cycle(now);
        (ds, t.elapsed().as_secs_f64() * 1e3)
    })
    .unwrap();
    println!(
        "first {:.1} ms ({} placed); {} warm-up cycles; steady p50 {:.1} p99 {:.1} max {:.1} ms; placed {} (gangs {}) preempted {}; queue {} running {}; total {:.1} s",
        r.first_ms,
        r.first_placed,
        r.warmup_cycles,
        r.percentile(0.5),
        r.percentile(0.99),
        r.percentile(1.0),
        r.placed,
        r.gangs_placed,
        r.preempted,
        r.queue_after,
        r.running_after,
        t.elapsed().as_secs_f64()
    );
}
