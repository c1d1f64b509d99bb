//! Measures the parts of the `tessera` policy on the Philly replay: `cargo run --release -p
//! tessera-sched --example philly_knobs -- TRACE_DIR FLEET [SEEDS]` prints key figures per
//! variant (the mean over same-second orders SEEDS, `0` or `0-4`), allocation to three decimals;
//! comma lists in WEIGHTS (estimate weight %, default 25), PCTS (reclaim budget %, 5), FMIN, GW,
//! RESV (every blocked gang reserved: 1), REST (the first blocked other job too: 1) and ALIGN
//! (single-node jobs by their nodes' busy horizons: 1) pick them; the defaults are the policy.
//! DUMP=1 lists the gangs of 12 GPUs and more that wait over an hour.

mod common;

use tessera_sched::philly::{self, Layout, Policy, TesseraKnobs};

fn main() {
    let (fleet_name, _seeds, traces, layout) = common::setup();
    let weights: Vec<u32> = std::env::var("WEIGHTS")
        .ok()
        .map(|w| w.split(',').map(|x| x.parse().expect("a weight")).collect())
        .unwrap_or_else(|| vec![25]);
    let list = |name: &str, default: &str| -> Vec<u32> { common::env_list(name, default) };
    let mut variants = Vec::new();
    for &w in &weights {
        for &pct in &list("PCTS", "5") {
            for &fmin in &list("FMIN", "0") {
                for &gw in &list("GW", "0") {
                    for &resv in &list("RESV", "1") {
                        for (rest, align) in list("REST", "1")
                            .into_iter()
                            .flat_map(|r| list("ALIGN", "1").into_iter().map(move |a| (r, a)))
                        {
                            variants.push(TesseraKnobs {
                                align_ends: align > 0,
                                gang_estimate_weight_pct: gw,
                                estimate_weight_pct: w,
                                reclaim_budget_pct: pct,
                                first_min_gpus: if fmin == 0 { u32::MAX } else { fmin },
                                reserve_every_gang: resv > 0,
                                reserve_first_of_rest: rest > 0,
                                ..TesseraKnobs::default()
                            });
                        }
                    }
                }
            }
        }
    }
    println!(
        "{fleet_name}: variant | alloc% | 8 mean h | 12-32 mean h | all mean h | all p95 h | mean JCT h | preempt | lost GPU-h"
    );
    let fifo_runs: Vec<_> = traces
        .iter()
        .map(|t| philly::replay(t, &layout, Policy::Fifo))
        .collect();
    let fifo = philly::Report::mean(&fifo_runs).expect("a seed");
    for p in [Policy::Backfill, Policy::TopologyBestfit, Policy::QuotaBackfill] {
        let runs: Vec<_> = traces.iter().map(|t| philly::replay(t, &layout, p)).collect();
        line(p.name(), &philly::Report::mean(&runs).expect("a seed"), &fifo);
    }
    if std::env::var("DUMP").is_ok() {
        dump(&traces[0], &layout, variants[0]);
        return;
    }
    for k in variants {
        let runs: Vec<_> = traces
            .iter()
            .map(|t| philly::replay_tuned(t, &layout, Policy::Tessera, k).0)
            .collect();
        line(
            &format!(
                "w={} gw={} pct={} fmin={} resv={} rest={} align={}",
                k.estimate_weight_pct,
                k.gang_estimate_weight_pct,
                k.reclaim_budget_pct,
                k.first_min_gpus,
                k.reserve_every_gang as u8,
                k.reserve_first_of_rest as u8,
                k.align_ends as u8
            ),
            &philly::Report::mean(&runs).expect("a seed"),
            &fifo,
        );
    }
}

fn line(name: &str, r: &philly::Report, fifo: &philly::Report) {
    let c = |n: &str| r.classes.iter().find(|d| d.class == n).expect("a class").clone();
    let (e, g, a) = (c("8"), c("12-32"), c("all"));
    // Tenants with a guarantee waiting longer on average than under `fifo`.
    let worse: Vec<String> = r
        .tenants
        .iter()
        .zip(&fifo.tenants)
        .filter(|(t, f)| t.guarantee > 0 && t.jobs > 0 && t.mean_delay_s > f.mean_delay_s)
        .map(|(t, f)| {
            format!(
                "{} {:.2}>{:.2}",
                t.tenant,
                t.mean_delay_s / 3600.0,
                f.mean_delay_s / 3600.0
            )
        })
        .collect();
    println!(
        "{name} | {:.3} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {:.0} | worse than fifo: {worse:?}",
        r.allocation_pct,
        e.mean_s / 3600.0,
        g.mean_s / 3600.0,
        a.mean_s / 3600.0,
        a.p95_s as f64 / 3600.0,
        a.mean_jct_s / 3600.0,
        r.preemptions,
        r.gpu_hours_lost
    );
}

/// With `DUMP=1`: each window gang of 12–32 GPUs that waits over an hour under either policy.
pub fn dump(trace: &philly::Trace, layout: &Layout, k: TesseraKnobs) {
    let (_, b) = philly::replay_outcomes(trace, layout, Policy::Backfill);
    let (_, t) = philly::replay_tuned(trace, layout, Policy::Tessera, k);
    let t0 = trace.jobs[0].submit;
    let (w0, w1) = philly::window_ms();
    let (w0, w1) = (w0 / 1000 + t0, w1 / 1000 + t0);
    for (i, j) in trace.jobs.iter().enumerate() {
        let ms = j.submit;
        if j.gpus < 12 || (j.gpus <= 32 && (ms < w0 || ms >= w1)) {
            continue;
        }
        let db = b[i].start.map_or(-1, |s| s - j.submit);
        let dt = t[i].start.map_or(-1, |s| s - j.submit);
        if db > 3600 || dt > 3600 {
            println!(
                "job {i} day {:.2} gpus {} tenant {} dur {:.1} h: backfill {:.2} h, tessera {:.2} h (preempted {})",
                (j.submit - t0) as f64 / 86400.0,
                j.gpus,
                trace.tenants[j.tenant],
                j.duration as f64 / 3600.0,
                db as f64 / 3600.0,
                dt as f64 / 3600.0,
                t[i].preempted
            );
        }
    }
}
