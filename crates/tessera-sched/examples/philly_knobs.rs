//! Measures the parts of the `tessera` policy on the Philly replay: `cargo run --release -p
//! tessera-sched --example philly_knobs -- TRACE_DIR FLEET` prints key figures per variant.

use tessera_sched::philly::{self, Layout, Policy, TesseraKnobs};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = args.first().map_or("../shared/traces/philly", String::as_str);
    let fleet_name = args.get(1).map_or("philly-768", String::as_str);
    let text = std::fs::read_to_string(format!("{dir}/philly_jobs.csv")).expect("the job table");
    let trace = philly::parse(&text).expect("a valid trace");
    let layout = Layout::of(&philly::fleet(fleet_name).expect("a Philly fleet")).expect("racks");
    let mut variants = Vec::new();
    for first_min_gpus in [u32::MAX, 8, 4] {
        for reclaim in [None, Some(1), Some(2)] {
            for pct in [20, 5, 2] {
                if reclaim.is_none() && pct != 5 {
                    continue;
                }
                variants.push(TesseraKnobs {
                    gangs_first: true,
                    gangs_first_within_only: false,
                    first_min_gpus,
                    reclaim_min_shares: reclaim,
                    reclaim_budget_pct: pct,
                });
            }
        }
    }
    println!(
        "{fleet_name}: variant | alloc% | 12-32 mean h | all mean h | all p95 h | mean JCT h | preempt | lost GPU-h"
    );
    for p in [Policy::Backfill, Policy::QuotaBackfill] {
        let r = philly::replay(&trace, &layout, p);
        line(p.name(), &r);
    }
    for k in variants {
        let (r, _) = philly::replay_tuned(&trace, &layout, Policy::Tessera, k);
        line(&format!("{k:?}"), &r);
    }
}

fn line(name: &str, r: &philly::Report) {
    let c = |n: &str| r.classes.iter().find(|d| d.class == n).expect("a class").clone();
    let (g, a) = (c("12-32"), c("all"));
    println!(
        "{name} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {:.0}",
        r.allocation_pct,
        g.mean_s / 3600.0,
        a.mean_s / 3600.0,
        a.p95_s as f64 / 3600.0,
        a.mean_jct_s / 3600.0,
        r.preemptions,
        r.gpu_hours_lost
    );
}
