//! Runs the multi-tenant scenario (`scenario::run`) on the seed fleet without building the CLI:
//! `cargo run -p tessera-sched --release --example scenario -- [TENANTS] [HOURS] [SEED]`.
//! Prints the report as `tessera sim scenario --json` does, pretty, on stdout. Settings to try
//! come from the environment (see below; `RULES=1`: the rules for gangs).

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
    let mut cfg = cfg;
    // Experiments: CLASS_MIN_S / CLASS_AFTER_S as `class=seconds,...`, RECLAIM_AFTER_S, MIN_RUNTIME_S,
    // SEARCHES (preemption searches a cycle), WARMUP_H, LARGEST=1 (largest first),
    // MULTI_PERMILLE (multi-node gangs among the training requests).
    let env = |k: &str| std::env::var(k).ok();
    let per_class = |k: &str| -> Vec<(String, i64)> {
        env(k)
            .map(|v| {
                v.split(',')
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(c, s)| (c.to_string(), s.parse::<i64>().expect("seconds") * 1000))
                    .collect()
            })
            .unwrap_or_default()
    };
    for (c, ms) in per_class("CLASS_MIN_S") {
        cfg.govern
            .classes
            .iter_mut()
            .find(|x| x.name == c)
            .expect("class")
            .min_runtime_ms = Some(ms);
    }
    for (c, ms) in per_class("CLASS_AFTER_S") {
        cfg.govern
            .classes
            .iter_mut()
            .find(|x| x.name == c)
            .expect("class")
            .preempt_after_ms = Some(ms);
    }
    if let Some(v) = env("RECLAIM_AFTER_S") {
        cfg.govern.reclaim_after_ms = v.parse::<i64>().expect("seconds") * 1000;
    }
    if env("CONSOLIDATE").as_deref() == Some("0") {
        cfg.govern.consolidation.enabled = false;
    }
    if let Some(v) = env("MOVES_PER_HOUR") {
        cfg.govern.consolidation.moves_per_tenant_per_hour = v.parse().expect("a count");
    }
    if let Some(v) = env("HOLDS_PER_POOL") {
        cfg.govern.holds_per_pool = v.parse().expect("a count");
    }
    if let Some(v) = env("BACKFILL_WAIT_S") {
        cfg.govern.backfill_max_wait_ms = v.parse::<i64>().expect("seconds") * 1000;
    }
    if let Some(v) = env("MIN_RUNTIME_S") {
        cfg.govern.min_runtime_ms = v.parse::<i64>().expect("seconds") * 1000;
    }
    // The rules for gangs the Philly engine row runs with (RULES=1, `with_gang_rules`, without
    // its queue order, which the scenario does not take): every blocked gang holds nodes at
    // once and moves to sooner starts, reclaim bounded by LOSS (default 0.1) times the wait,
    // whole-GPU work placed by its end (BY_END=0: not), holds stacked in time (STACK=0: not).
    if env("RULES").as_deref() == Some("1") {
        cfg.govern = cfg.govern.with_gang_rules();
        if let Some(v) = env("LOSS") {
            cfg.govern.max_loss_per_wait = Some(v.parse().expect("a factor"));
        }
        cfg.govern.place_by_end = env("BY_END").as_deref() != Some("0");
        // STACK=0: gangs' holds not stacked in time (each on nodes of its own).
        cfg.govern.gang_holds_stack = env("STACK").as_deref() != Some("0");
    }
    if let Some(v) = env("SEARCHES") {
        cfg.govern.max_preemption_searches = v.parse().expect("a count");
    }
    if let Some(v) = env("WARMUP_H") {
        cfg.warmup_hours = v.parse().expect("hours");
    }
    cfg.largest_first = env("LARGEST").as_deref() == Some("1");
    if let Some(v) = env("MULTI_PERMILLE") {
        cfg.multi_node_permille = v.parse().expect("per mille");
    }
    let started = Instant::now();
    let r = run(Arc::new(Fleet::seed()), &cfg, &mut || {
        started.elapsed().as_nanos() as u64
    });
    eprintln!("wall {:.1} s", started.elapsed().as_secs_f64());
    println!("{}", serde_json::to_string_pretty(&r).expect("serialisable"));
}
