//! `tessera bench gang` without the CLI: `bench_gang [NODES] [ITERATIONS]`. A whole pool of
//! NODES 8-GPU servers in racks of 16 and blocks of 8 racks, 75 % busy with single-node work;
//! each iteration churns one workload, then times `plan_gang` for each 128-GPU gang of
//! `tessera_sched::bench::gang_forms` and a place + release of the first. Prints p50 / p99 /
//! max per form.
use std::time::Instant;

use tessera_sched::bench::{GangSetup, gang_forms};

fn main() {
    let a: Vec<usize> = std::env::args().skip(1).map(|s| s.parse().unwrap()).collect();
    let nodes = *a.first().unwrap_or(&10_000) as u32;
    let iterations = *a.get(1).unwrap_or(&2_000);
    let mut s = GangSetup::new(nodes, 0.75, 7);
    let forms = gang_forms();
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); forms.len() + 1];
    let mut placed = vec![0u32; forms.len()];
    let mut racks = vec![0usize; forms.len()];
    for _ in 0..iterations {
        s.churn();
        for (i, (_, g)) in forms.iter().enumerate() {
            let t = Instant::now();
            let p = s.engine.plan_gang(g);
            times[i].push(t.elapsed().as_secs_f64() * 1e6);
            if let Ok(p) = p {
                placed[i] += 1;
                racks[i] += p.racks.len();
            }
        }
        let id = s.next_id();
        let t = Instant::now();
        if s.engine.place_gang(id, &forms[0].1).is_ok() {
            s.engine.release_gang(id).unwrap();
        }
        times[forms.len()].push(t.elapsed().as_secs_f64() * 1e6);
    }
    println!(
        "{} nodes in {} racks, {:.0} % of GPUs allocated, {iterations} iterations",
        s.engine.fleet().nodes.len(),
        s.engine.fleet().levels.domains(0).len(),
        s.load() * 100.0
    );
    let names: Vec<&str> = forms
        .iter()
        .map(|f| f.0)
        .chain(["place + release, 16 whole nodes"])
        .collect();
    for (i, t) in times.iter_mut().enumerate() {
        t.sort_by(|a, b| a.total_cmp(b));
        let q = |p: f64| t[((t.len() as f64 * p).ceil() as usize).clamp(1, t.len()) - 1];
        let extra = if i < forms.len() {
            format!(
                "; placed {} of {iterations}, {:.2} racks on average",
                placed[i],
                racks[i] as f64 / placed[i].max(1) as f64
            )
        } else {
            String::new()
        };
        println!(
            "{:<34} p50 {:>7.1} µs  p99 {:>7.1} µs  max {:>7.1} µs{extra}",
            names[i],
            q(0.5),
            q(0.99),
            q(1.0)
        );
    }
}
