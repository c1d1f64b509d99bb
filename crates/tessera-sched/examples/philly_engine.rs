//! Measures the real scheduler's settings on the Philly replay (the `engine` row):
//! `cargo run --release -p tessera-sched --example philly_engine -- TRACE_DIR FLEET [SEEDS]`
//! prints key figures per variant of the [`GovernConfig`] (the mean over same-second orders
//! SEEDS, `0` or `0-4`), beside the best baseline of each figure and `tessera` (the model), and
//! the wall time of one run of each (one order). HOLDS (holds per pool, comma list, default `1,8`) and
//! RECLAIM (`1`: reclaim after 4 h as the scenario, `0`: never; default `1,0`) pick them.
//! RULES (`0`: the scenario's settings, `1`: with the rules for gangs,
//! [`EngineConfig::gang_rules`]; default `0,1`) adds the rules for gangs; with them LOSS (the
//! bound `max_loss_per_wait`, default the rules' `0.1`) and WEIGHT (the [`GangsFirst`] estimate weight,
//! default `0.25`; negative: the default queue order; ACROSS=0 with it: gangs first only in
//! each tenant's queue) change them, as do MOVE, STACK (`0`:
//! gangs' holds not stacked in time), BY_END (`0`/`1`) and GANG_RECLAIM_AFTER (hours).
//!
//! [`GangsFirst`]: tessera_sched::cycle::plugins::GangsFirst

mod common;

use std::time::Instant;

use tessera_sched::cycle::plugins::GangsFirst;
use tessera_sched::philly::{self, EngineConfig, Policy, Report};

fn class(r: &Report, c: &str) -> philly::Delays {
    r.classes.iter().find(|d| d.class == c).cloned().expect("a class")
}

fn line(name: &str, r: &Report, fifo: &Report, wall: f64) {
    let within = r
        .tenants
        .iter()
        .zip(&fifo.tenants)
        .filter(|(t, _)| t.guarantee > 0 && t.jobs > 0)
        .filter(|(t, f)| t.mean_delay_s <= f.mean_delay_s)
        .count();
    let guaranteed = fifo.tenants.iter().filter(|t| t.guarantee > 0 && t.jobs > 0).count();
    println!(
        "{name:<28} | {:>7.3} | {:>6.2} | {:>6.2} | {:>6.2} | {:>6.2} | {:>6.2} | {:>4} | {:>9.1} | {:>2}/{guaranteed} | {:>5} | {wall:.1} s",
        r.allocation_pct,
        class(r, "8").mean_s / 3600.0,
        class(r, "12-32").mean_s / 3600.0,
        class(r, "all").mean_s / 3600.0,
        class(r, "all").p95_s as f64 / 3600.0,
        class(r, "all").mean_jct_s / 3600.0,
        r.preemptions,
        r.gpu_hours_lost,
        within,
        r.gangs_beyond_min_racks,
    );
}

fn main() {
    let (fleet_name, seeds, traces, layout) = common::setup();
    let list = |name: &str, default: &str| -> Vec<u64> { common::env_list(name, default) };
    println!(
        "{fleet_name}, orders {seeds:?}: variant | alloc % | 8 mean h | 12-32 mean h | all mean h | all p95 h | mean JCT h | preempt | lost GPU-h | tenants ≤ fifo | gangs beyond racks | wall"
    );
    let mean = |p: Policy| {
        let t = Instant::now();
        let runs: Vec<_> = traces.iter().map(|tr| philly::replay(tr, &layout, p)).collect();
        (
            Report::mean(&runs).expect("a seed"),
            t.elapsed().as_secs_f64() / traces.len() as f64,
        )
    };
    let (fifo, wall) = mean(Policy::Fifo);
    line("fifo", &fifo, &fifo, wall);
    for p in [
        Policy::Backfill,
        Policy::TopologyBestfit,
        Policy::QuotaBackfill,
        Policy::Tessera,
    ] {
        let (r, wall) = mean(p);
        line(p.name(), &r, &fifo, wall);
    }
    for rules in list("RULES", "0,1") {
        for holds in list("HOLDS", "1,8") {
            for reclaim in list("RECLAIM", "1,0") {
                let mut cfg = if rules == 0 {
                    EngineConfig::scenario(holds as usize)
                } else {
                    let mut cfg = EngineConfig::gang_rules(holds as usize);
                    let number = |name: &str| std::env::var(name).ok().map(|v| v.parse::<f64>().expect("a number"));
                    if let Some(loss) = number("LOSS") {
                        cfg.govern.max_loss_per_wait = Some(loss);
                    }
                    if let Some(w) = number("WEIGHT") {
                        cfg.gangs_first = (w >= 0.0).then_some(GangsFirst {
                            estimate_weight: w,
                            across_tenants: number("ACROSS") != Some(0.0),
                        });
                    }
                    if let Some(b) = number("MOVE") {
                        cfg.govern.gang_holds_move = b != 0.0;
                    }
                    if let Some(b) = number("STACK") {
                        cfg.govern.gang_holds_stack = b != 0.0;
                    }
                    if let Some(b) = number("BY_END") {
                        cfg.govern.place_by_end = b != 0.0;
                    }
                    if let Some(h) = number("GANG_RECLAIM_AFTER") {
                        cfg.govern.gang_reclaim_after_ms = Some((h * 3_600_000.0) as i64);
                    }
                    cfg
                };
                if reclaim == 0 {
                    cfg.govern.reclaim_after_ms = i64::MAX / 4;
                }
                let t = Instant::now();
                let runs: Vec<_> = traces
                    .iter()
                    .map(|tr| philly::replay_engine(tr, &layout, &cfg).0)
                    .collect();
                let wall = t.elapsed().as_secs_f64() / traces.len() as f64;
                let name = format!(
                    "engine{} holds {holds} reclaim {}",
                    if rules == 0 { "" } else { "+rules" },
                    if reclaim == 0 { "off" } else { "4h" }
                );
                line(&name, &Report::mean(&runs).expect("a seed"), &fifo, wall);
            }
        }
    }
}
