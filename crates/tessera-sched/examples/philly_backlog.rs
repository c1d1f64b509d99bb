//! Scratch: work carried into and out of the window per variant.
use tessera_sched::philly::{self, Layout, Policy, TesseraKnobs};
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let text = std::fs::read_to_string(format!("{}/philly_jobs.csv", args[0])).unwrap();
    let trace = philly::parse(&text).unwrap().reordered(args[2].parse().unwrap());
    let layout = Layout::of(&philly::fleet(&args[1]).unwrap()).unwrap();
    let t0 = trace.jobs[0].submit;
    let (w0, w1) = philly::window_ms();
    let (w0, w1) = (t0 + w0 / 1000, t0 + w1 / 1000);
    if let Some(d) = args.get(3) {
        snapshot(&trace, &layout, d.parse().unwrap());
        return;
    }
    for (name, p, w) in [("backfill", Policy::Backfill, 0), ("t w=0", Policy::Tessera, 0), ("t w=10", Policy::Tessera, 10), ("t w=25", Policy::Tessera, 25)] {
        let k = TesseraKnobs { estimate_weight_pct: w, reserve_first_of_rest: true, ..TesseraKnobs::default() };
        let (r, out) = philly::replay_tuned(&trace, &layout, p, k);
        let (mut back_out, mut back_in, mut q_out_jobs) = (0f64, 0f64, 0);
        for (j, o) in trace.jobs.iter().zip(&out) {
            let (Some(s), Some(e)) = (o.start, o.end) else { continue };
            let g = j.gpus as f64;
            if j.submit < w1 && e > w1 { back_out += g * (e - s.max(w1)) as f64; }
            if j.submit < w1 && s >= w1 { q_out_jobs += 1; }
            if s < w0 && e > w0 { back_in += g * (e - w0) as f64; }
            if j.submit < w0 && s >= w0 { back_in += g * (e - s) as f64; }
        }
        println!("{name}: alloc {:.2} carried-in {:.0} GPU-h, left at w1 {:.0} GPU-h ({} jobs not started)", r.allocation_pct, back_in / 3600.0, back_out / 3600.0, q_out_jobs);
    }
}

/// Scratch: running and waiting GPUs by size at day `d` under Tessera.
#[allow(dead_code)]
pub fn snapshot(trace: &philly::Trace, layout: &Layout, d: f64) {
    let t0 = trace.jobs[0].submit;
    let at = t0 + (d * 86400.0) as i64;
    let k = TesseraKnobs { reserve_first_of_rest: true, ..TesseraKnobs::default() };
    for (name, p) in [("backfill", Policy::Backfill), ("tessera", Policy::Tessera)] {
        let (_, out) = philly::replay_tuned(trace, layout, p, k);
        let mut run = std::collections::BTreeMap::new();
        let mut wait = std::collections::BTreeMap::new();
        for (j, o) in trace.jobs.iter().zip(&out) {
            let (Some(s), Some(e)) = (o.start, o.end) else { continue };
            if s <= at && at < e {
                let x = run.entry(j.gpus).or_insert((0, 0i64));
                x.0 += 1;
                x.1 += (e - at) / 3600;
            } else if j.submit <= at && s > at {
                *wait.entry(j.gpus).or_insert(0) += 1;
            }
        }
        println!("{name} day {d}: running (gpus: jobs, sum remaining h) {run:?}; waiting {wait:?}");
    }
}
