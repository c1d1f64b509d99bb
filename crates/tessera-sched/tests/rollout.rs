//! A full rolling driver upgrade of the `seed` fleet (every node) under a mixed load placed by
//! the engine — services, batch jobs of minutes to hours, 8-GPU training gangs, MIG slices and
//! fractions — planned drain-aware and naively (cordon, wait for a deadline, evict), with the
//! rollout time and the capacity lost printed for both (`cargo test -p tessera-sched --test
//! rollout -- --nocapture`).

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_model::{Fleet, Request};
use tessera_sched::engine::Engine;
use tessera_sched::policy::BestFit;
use tessera_sched::rollout::{Limits, Node, Plan, Work, simulate};

const MIN: i64 = 60_000;

/// The seed fleet filled by a seeded mix to three quarters of its GPU units (room left for
/// the services a drain moves); per node, its work.
fn loaded_fleet(seed: u64) -> (Arc<Fleet>, Vec<Node>) {
    let fleet = Arc::new(Fleet::seed());
    let mut e = Engine::new(fleet.clone(), Box::new(BestFit), seed);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut nodes: Vec<Node> = fleet
        .nodes
        .iter()
        .map(|n| Node {
            name: n.name.clone(),
            units_milli: n.gpus as u64 * 1000,
            work: Vec::new(),
        })
        .collect();
    let mut misses = 0;
    let mut id = 0u64;
    let total: u64 = nodes.iter().map(|n| n.units_milli).sum();
    let mut used = 0;
    while misses < 200 && used * 4 < total * 3 {
        id += 1;
        let (req, end) = match rng.random_range(0..10) {
            // 8-GPU training gangs, 2–12 h.
            0 | 1 => (Request::whole(8), Some(rng.random_range(120..720) * MIN)),
            // Services: no end.
            2 | 3 => (Request::whole(1), None),
            4 => (
                Request::mig(&fleet.catalogue, "3g.40gb").unwrap(),
                Some(rng.random_range(10..240) * MIN),
            ),
            5 => (Request::mig(&fleet.catalogue, "1g.10gb").unwrap(), None),
            6 => (Request::fraction(250), Some(rng.random_range(5..120) * MIN)),
            // Batch jobs, 10 min – 6 h, already running for a while.
            _ => (
                Request::whole(rng.random_range(1..=4)),
                Some(rng.random_range(10..360) * MIN),
            ),
        };
        match e.place(id, &req) {
            Ok(a) => {
                misses = 0;
                used += a.units.0;
                nodes[a.node.0 as usize].work.push(Work {
                    units_milli: a.units.0,
                    end_ms: end,
                    start_ms: -rng.random_range(0..120) * MIN,
                });
            }
            Err(_) => misses += 1,
        }
    }
    (fleet, nodes)
}

#[test]
fn a_full_fleet_rollout_cuts_nothing_off_and_loses_less_than_a_naive_one() {
    let (fleet, nodes) = loaded_fleet(7);
    assert_eq!(nodes.len(), fleet.nodes.len());
    let total: u64 = nodes.iter().map(|n| n.units_milli).sum();
    let used: u64 = nodes.iter().flat_map(|n| &n.work).map(|w| w.units_milli).sum();
    let services = nodes
        .iter()
        .flat_map(|n| &n.work)
        .filter(|w| w.end_ms.is_none())
        .count();
    let gangs = nodes
        .iter()
        .flat_map(|n| &n.work)
        .filter(|w| w.units_milli == 8000)
        .count();
    assert!(services > 0 && gangs > 0, "the load mixes services and 8-GPU gangs");
    let limits = Limits {
        max_parallel: 6,
        max_unavailable_milli: total / 10,
    };
    let upgrade = 20 * MIN;
    // Cordoned within a minute of its free time, and (as before) as soon as a slot frees.
    let smart = simulate(&nodes, 0, limits, upgrade, Plan::DrainAware { ahead_ms: MIN });
    let eager = simulate(&nodes, 0, limits, upgrade, Plan::DrainAware { ahead_ms: i64::MAX / 4 });
    let naive = simulate(&nodes, 0, limits, upgrade, Plan::Naive { deadline_ms: 60 * MIN });
    println!(
        "seed fleet: {} nodes, {:.0} GPU units, {:.0} in use ({services} services, {gangs} 8-GPU gangs); \
         max {} nodes / {:.0} units out, upgrade {} min",
        nodes.len(),
        total as f64 / 1000.0,
        used as f64 / 1000.0,
        limits.max_parallel,
        limits.max_unavailable_milli as f64 / 1000.0,
        upgrade / MIN
    );
    for (name, r) in [
        ("drain-aware", &smart),
        ("drain-aware, cordon when a slot frees", &eager),
        ("naive (deadline 60 min)", &naive),
    ] {
        println!(
            "{name}: rollout {:.1} h, capacity lost {:.1} GPU-unit-hours, {} workloads cut off",
            r.duration_ms as f64 / 3_600_000.0,
            r.lost_unit_hours,
            r.cut_offs
        );
    }
    assert_eq!(smart.cut_offs, 0);
    assert_eq!(eager.cut_offs, 0);
    assert!(
        smart.lost_unit_hours < eager.lost_unit_hours,
        "cordoning by free time loses less: {:.1} vs {:.1}",
        smart.lost_unit_hours,
        eager.lost_unit_hours
    );
    assert_eq!(smart.timeline.len(), nodes.len(), "every node through maintenance");
    assert!(naive.cut_offs > 0, "the naive rollout evicts long jobs and services");
    assert!(
        smart.lost_unit_hours < naive.lost_unit_hours,
        "drain-aware loses {:.1}, naive {:.1}",
        smart.lost_unit_hours,
        naive.lost_unit_hours
    );
}
