//! Gang placement at scale: `bench_gang [NODES] [ITERATIONS]`. A whole pool of NODES 8-GPU
//! servers in racks of 16 and blocks of 8 racks, filled to about 75 % with single-node work;
//! each iteration churns one single-node job, then times `plan_gang` for a 128-GPU gang in
//! three forms (16 whole nodes preferring a rack; 32 nodes × 4 GPUs; 16 whole nodes required
//! within a block) and a place + release of the first. Prints p50 / p99 / max per form.
use std::sync::Arc;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_model::request::{GangRequest, TopologyConstraint};
use tessera_model::{Fleet, Request};
use tessera_sched::Engine;
use tessera_sched::replay::make_policy;

fn main() {
    let a: Vec<usize> = std::env::args().skip(1).map(|s| s.parse().unwrap()).collect();
    let nodes = *a.first().unwrap_or(&10_000);
    let iterations = *a.get(1).unwrap_or(&2_000);
    let mut text = String::from("[[pool]]\nname = \"training\"\nsharing = \"whole\"\n");
    let rack_count = nodes.div_ceil(16);
    for r in 0..rack_count {
        let count = (nodes - r * 16).min(16);
        text += &format!(
            "[[pool.nodes]]\nname = \"n{r}\"\ncount = {count}\ngpu_model = \"H100-80GB-SXM\"\ngpus = 8\ncpus = 112\nmemory_gib = 2048\nnvlink = \"nvswitch\"\nrack = \"r{r}\"\nblock = \"b{}\"\n",
            r / 8
        );
    }
    let fleet = Arc::new(Fleet::from_toml(&text, "bench").unwrap());
    let mut engine = Engine::new(fleet.clone(), make_policy("tessera", &[]).unwrap(), 7);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let target = fleet.gpu_count() * 3 / 4;
    let (mut held, mut next) = (0u64, 0u64);
    let mut live: Vec<(u64, u64)> = Vec::new();
    let sizes = [1u8, 2, 4, 8];
    while held < target {
        let k = sizes[rng.random_range(0..sizes.len())];
        next += 1;
        if engine.place(next, &Request::whole(k)).is_ok() {
            held += k as u64;
            live.push((next, k as u64));
        }
    }
    let forms = [
        ("16 whole nodes, preferred rack", GangRequest::whole_nodes(128)),
        ("32 nodes x 4 GPUs", GangRequest::nodes(32, 4)),
        (
            "16 whole nodes, required block",
            GangRequest::whole_nodes(128).with_topology(TopologyConstraint::required("block")),
        ),
    ];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); forms.len() + 1];
    let mut placed = vec![0u32; forms.len()];
    let mut racks = vec![0usize; forms.len()];
    for _ in 0..iterations {
        let (id, k) = live.swap_remove(rng.random_range(0..live.len()));
        engine.release(id).unwrap();
        held -= k;
        let k = sizes[rng.random_range(0..sizes.len())];
        next += 1;
        if engine.place(next, &Request::whole(k)).is_ok() {
            held += k as u64;
            live.push((next, k as u64));
        }
        for (i, (_, g)) in forms.iter().enumerate() {
            let t = Instant::now();
            let p = engine.plan_gang(g);
            times[i].push(t.elapsed().as_secs_f64() * 1e6);
            if let Ok(p) = p {
                placed[i] += 1;
                racks[i] += p.racks.len();
            }
        }
        next += 1;
        let t = Instant::now();
        if engine.place_gang(next, &forms[0].1).is_ok() {
            engine.release_gang(next).unwrap();
        }
        times[forms.len()].push(t.elapsed().as_secs_f64() * 1e6);
    }
    println!(
        "{} nodes in {} racks, {:.0} % of GPUs allocated, {iterations} iterations",
        fleet.nodes.len(),
        rack_count,
        held as f64 * 100.0 / fleet.gpu_count() as f64
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
