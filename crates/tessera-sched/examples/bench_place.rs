//! The placement benchmark's loop without the CLI (for profiling): `bench_place [NODES] [OPS]`.
use std::sync::Arc;
use std::time::Instant;

use tessera_model::{Fleet, GpuUnits};
use tessera_sched::Engine;
use tessera_sched::bench::{PlacementChurn, request_mix};
use tessera_sched::replay::make_policy;

fn main() {
    let a: Vec<usize> = std::env::args().skip(1).map(|s| s.parse().unwrap()).collect();
    let fleet = Arc::new(Fleet::synthetic(*a.first().unwrap_or(&10_000) as u32));
    let ops = *a.get(1).unwrap_or(&200_000);
    let mut engine = Engine::new(fleet.clone(), make_policy("tessera", &[]).unwrap(), 7);
    let target = GpuUnits((fleet.gpu_count() as f64 * 1000.0 * 0.8) as u64);
    let mut churn = PlacementChurn::new(request_mix(&fleet), 7, target);
    // Releases `id`; the nanoseconds it took.
    let release = |engine: &mut Engine, id: u64| {
        let t = Instant::now();
        engine.release(id).unwrap();
        t.elapsed().as_nanos() as u64
    };
    for phase in 0..2 {
        let (mut placed, mut busy) = (0u64, 0u64);
        let start = Instant::now();
        for _ in 0..ops {
            while let Some(id) = churn.over_target() {
                busy += release(&mut engine, id);
            }
            let (id, req) = churn.next_request();
            let t = Instant::now();
            let ok = engine.place(id, &req).map(|a| a.units);
            busy += t.elapsed().as_nanos() as u64;
            match ok {
                Ok(u) => {
                    placed += 1;
                    churn.placed(id, u);
                }
                Err(_) => {
                    if let Some(id) = churn.any_live() {
                        busy += release(&mut engine, id);
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
