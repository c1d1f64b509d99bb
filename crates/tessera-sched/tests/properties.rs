//! Property tests of the placement engine over random request/release streams, on every GPU
//! model of the catalogue.
//!
//! After every step: no GPU is over-allocated (milli ≤ 1000, GPU memory within the board),
//! every MIG layout is valid per the reference tables (legal starts, disjoint memory-slice
//! intervals, per-profile counts within the maximum), the bookkeeping matches the allocations,
//! time-shared GPUs hold one tenant's fractions only, and place-then-release restores the exact
//! prior state.

use std::collections::HashMap;
use std::sync::Arc;

use proptest::prelude::*;
use tessera_model::layout::{Placed, validate};
use tessera_model::{Catalogue, Fleet, Request, Shape, Sharing, TenantId};
use tessera_sched::replay::make_policy;
use tessera_sched::{Engine, Grant};

/// A fleet with one pool for `model`: MIG if it can, else one whole and one shared pool.
fn fleet_for(model: &str) -> Fleet {
    let c = Catalogue::builtin();
    let m = c.get(c.find(model).unwrap());
    let text = if m.mig.is_some() {
        format!(
            "[[pool]]\nname = \"mig\"\nsharing = \"mig\"\n[[pool.nodes]]\nname = \"m\"\ncount = 3\ngpu_model = \"{model}\"\ngpus = 4\ncpus = 64\nmemory_gib = 256\n"
        )
    } else {
        format!(
            "[[pool]]\nname = \"whole\"\nsharing = \"whole\"\n[[pool.nodes]]\nname = \"w\"\ncount = 2\ngpu_model = \"{model}\"\ngpus = 4\ncpus = 64\nmemory_gib = 256\n\
             [[pool]]\nname = \"shared\"\nsharing = \"shared\"\n[[pool.nodes]]\nname = \"s\"\ncount = 2\ngpu_model = \"{model}\"\ngpus = 4\ncpus = 64\nmemory_gib = 256\n"
        )
    };
    Fleet::from_toml(&text, "test").unwrap()
}

#[derive(Clone, Debug)]
enum Op {
    /// Place a request of kind `k` (interpreted per fleet), with `size` and tenant `t`.
    Place {
        k: u8,
        size: u16,
        t: u8,
        cpu: u8,
        probe: bool,
    },
    /// Release the `i`-th live allocation (modulo).
    Release(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..4, 1u16..1000, 0u8..3, 0u8..24, any::<bool>())
            .prop_map(|(k, size, t, cpu, probe)| Op::Place { k, size, t, cpu, probe }),
        2 => any::<usize>().prop_map(Op::Release),
    ]
}

fn request(fleet: &Fleet, k: u8, size: u16, t: u8, cpu: u8) -> Request {
    let model = fleet.catalogue.get(fleet.nodes[0].model);
    let shape = match (model.mig, k) {
        (Some(geom), _) => {
            let p = &geom.profiles[size as usize % geom.profiles.len()];
            Shape::Mig(
                tessera_model::request::MigChoice::resolve(&fleet.catalogue, &format!("{}:{}", model.name, p.id))
                    .unwrap(),
            )
        }
        (None, 0) => Shape::Whole {
            gpus: (size % 5) as u8 + 1,
        },
        (None, _) => Shape::Fraction {
            milli: size,
            memory_mib: size.is_multiple_of(3).then_some(size as u32 * 8),
        },
    };
    Request::new(shape)
        .with_host(cpu as u64 * 1000, cpu as u64 * 2048)
        .with_tenant(TenantId(t as u32))
}

fn check_invariants(e: &Engine) {
    let fleet = e.fleet();
    let st = e.state();
    for (n, node) in fleet.nodes.iter().enumerate() {
        let ns = &st.nodes[n];
        let allocs: Vec<_> = st.allocations.values().filter(|a| a.node.0 as usize == n).collect();
        assert_eq!(
            ns.cpu_free + allocs.iter().map(|a| a.cpu_milli).sum::<u64>(),
            node.cpu_milli
        );
        assert_eq!(
            ns.mem_free + allocs.iter().map(|a| a.memory_mib).sum::<u64>(),
            node.memory_mib
        );
        let model = fleet.catalogue.get(node.model);
        let pool = fleet.pool(node.pool);
        for (g, gs) in ns.gpus.iter().enumerate() {
            assert!(gs.used_milli <= 1000, "GPU over-allocated");
            if model.memory_mib > 0 {
                assert!(gs.mem_used_mib <= model.memory_mib);
            }
            let on_gpu: Vec<_> = allocs.iter().filter(|a| a.grant.gpu_mask() >> g & 1 == 1).collect();
            let mut holders: Vec<u64> = on_gpu.iter().map(|a| a.id).collect();
            let mut recorded = gs.holders.clone();
            holders.sort_unstable();
            recorded.sort_unstable();
            assert_eq!(holders, recorded, "holders match allocations");
            assert_eq!(gs.is_free(), ns.free_mask >> g & 1 == 1);
            let used: u64 = on_gpu
                .iter()
                .map(|a| match a.grant {
                    Grant::Whole { .. } => 1000,
                    _ => a.units.as_milli(),
                })
                .sum();
            assert_eq!(used, gs.used_milli as u64);
            if let Some(geom) = model.mig {
                let layout: Vec<Placed> = on_gpu
                    .iter()
                    .map(|a| match a.grant {
                        Grant::Mig { profile, start, .. } => Placed { profile, start },
                        ref other => panic!("non-MIG grant {other:?} in a MIG pool"),
                    })
                    .collect();
                let mask = validate(geom, &layout).expect("every MIG layout is valid per the reference tables");
                assert_eq!(mask, gs.mig_mask);
            }
            if pool.sharing == Sharing::Shared && !pool.allow_tenant_mixing {
                let mut tenants: Vec<_> = on_gpu.iter().map(|a| a.tenant).collect();
                tenants.dedup();
                assert!(tenants.len() <= 1, "a time-shared GPU holds one tenant");
            }
        }
    }
}

fn run(model: &str, ops: Vec<Op>, policy: &str) {
    let fleet = Arc::new(fleet_for(model));
    let mut e = Engine::new(fleet.clone(), make_policy(policy, &[]).unwrap(), 3);
    let empty = e.state().clone();
    let mut live: Vec<u64> = Vec::new();
    let mut next = 0u64;
    let mut units: HashMap<u64, u64> = HashMap::new();
    for op in ops {
        match op {
            Op::Place { k, size, t, cpu, probe } => {
                let req = request(&fleet, k, size, t, cpu);
                let before = e.state().clone();
                next += 1;
                if let Ok(a) = e.place(next, &req) {
                    units.insert(next, a.units.as_milli());
                    if probe {
                        e.release(next).unwrap();
                        assert!(
                            e.state().same_holdings(&before),
                            "place-then-release restores the exact prior state"
                        );
                    } else {
                        live.push(next);
                    }
                } else {
                    assert!(e.state().same_holdings(&before), "a refusal changes nothing");
                }
            }
            Op::Release(i) => {
                if !live.is_empty() {
                    let id = live.swap_remove(i % live.len());
                    assert!(e.release(id).is_some());
                }
            }
        }
        check_invariants(&e);
    }
    for id in live {
        e.release(id).unwrap();
    }
    assert!(
        e.state().same_holdings(&empty),
        "releasing everything returns every unit"
    );
}

const MODELS: [&str; 14] = [
    "A30-24GB",
    "A100-40GB",
    "A100-80GB",
    "H100-80GB-SXM",
    "H100-80GB-PCIE",
    "H100-94GB-NVL",
    "H200-141GB",
    "B200-180GB",
    "L40S",
    "T4",
    "P100",
    "V100M16",
    "V100M32",
    "A10",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn every_model_keeps_its_invariants(m in 0usize..MODELS.len(), ops in prop::collection::vec(op(), 1..120)) {
        run(MODELS[m], ops, "tessera");
    }

    #[test]
    fn baseline_policies_keep_the_invariants_too(m in 8usize..MODELS.len(), ops in prop::collection::vec(op(), 1..80), p in 0usize..3) {
        run(MODELS[m], ops, ["fgd", "bestfit", "random"][p]);
    }
}

#[test]
fn every_catalogue_model_is_covered() {
    let c = Catalogue::builtin();
    for (_, m) in c.models() {
        assert!(MODELS.contains(&m.name.as_str()), "{} has no property test", m.name);
    }
}
