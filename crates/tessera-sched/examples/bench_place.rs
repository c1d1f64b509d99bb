//! The placement benchmark's loop without the CLI (for profiling): `bench_place [NODES] [OPS]`.
use std::sync::Arc;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_model::{Fleet, GpuUnits, TenantId};
use tessera_sched::Engine;
use tessera_sched::bench::request_mix;
use tessera_sched::replay::make_policy;

fn main() {
    let a: Vec<usize> = std::env::args().skip(1).map(|s| s.parse().unwrap()).collect();
    let fleet = Arc::new(Fleet::synthetic(*a.first().unwrap_or(&10_000) as u32));
    let ops = *a.get(1).unwrap_or(&200_000);
    let mut engine = Engine::new(fleet.clone(), make_policy("tessera", &[]).unwrap(), 7);
    let requests = request_mix(&fleet);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let target = GpuUnits((fleet.gpu_count() as f64 * 1000.0 * 0.8) as u64);
    let mut live: Vec<(u64, GpuUnits)> = Vec::new();
    let mut held = GpuUnits::ZERO;
    let mut next_id = 0u64;
    for phase in 0..2 {
        let (mut placed, mut busy) = (0u64, 0u64);
        let start = Instant::now();
        for _ in 0..ops {
            while held > target && !live.is_empty() {
                let (id, u) = live.swap_remove(rng.random_range(0..live.len()));
                let t = Instant::now();
                engine.release(id).unwrap();
                busy += t.elapsed().as_nanos() as u64;
                held -= u;
            }
            let mut req = requests[rng.random_range(0..requests.len())].clone();
            if matches!(req.shape, tessera_model::Shape::Fraction { .. }) {
                req.tenant = Some(TenantId(rng.random_range(0..8)));
            }
            next_id += 1;
            let t = Instant::now();
            let ok = engine.place(next_id, &req).map(|a| a.units);
            busy += t.elapsed().as_nanos() as u64;
            match ok {
                Ok(u) => {
                    placed += 1;
                    held += u;
                    live.push((next_id, u));
                }
                Err(_) => {
                    if !live.is_empty() {
                        let (id, u) = live.swap_remove(rng.random_range(0..live.len()));
                        let t = Instant::now();
                        engine.release(id).unwrap();
                        busy += t.elapsed().as_nanos() as u64;
                        held -= u;
                    }
                }
            }
        }
        println!(
            "phase {phase}: {placed} placed, {:.0} placements/s (engine time), wall {:.2} s",
            placed as f64 / (busy as f64 / 1e9),
            start.elapsed().as_secs_f64()
        );
    }
}
