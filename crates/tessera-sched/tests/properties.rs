//! Property tests of the placement engine over random request/release streams, on every GPU
//! model of the catalogue.
//!
//! After every step: no GPU is over-allocated (milli ≤ 1000, GPU memory within the board),
//! every MIG layout is valid per the reference tables (legal starts, disjoint memory-slice
//! intervals, per-profile counts within the maximum), the bookkeeping matches the allocations,
//! time-shared GPUs hold one tenant's fractions only, and place-then-release restores the exact
//! prior state.
//!
//! The MIG-capable models also run place/release/rebind/bind streams in both MIG modes with
//! provisional bookings: every configured layout stays valid; in `WholeGpu` mode no instance in
//! use is ever missing from its GPU's layout and a layout changes only while its GPU has no
//! holder; place-then-release restores the exact state in `Instance` mode and the occupancy in
//! `WholeGpu` mode; a rebind conserves capacity per node and tenant, changes exactly the grants
//! it reports, and a refused one changes nothing.
//!
//! The scheduler cycle, with consolidation on and work of every kind of movability, keeps the
//! same invariants over random submit/finish/cycle streams where decisions are carried out
//! (victims stop and are requeued, moved services' replacements start); it only ever moves work
//! marked movable, as marked; and once everything has ended every unit is back.
//!
//! Whatever the queue's length and the cycle's budget of jobs, every job submitted gets a
//! decision with a reason from the next cycle (placed, waiting or refused), the same one on
//! every run of the same input.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use proptest::prelude::*;
use tessera_model::layout::{Placed, enumerate_layouts, media_instances, validate};
use tessera_model::request::GangRequest;
use tessera_model::{Catalogue, Fleet, NodeId, Request, Shape, Sharing, TenantId};
use tessera_sched::cycle::Movable;
use tessera_sched::engine::DeviceBinding;
use tessera_sched::mig::MigMode;
use tessera_sched::replay::make_policy;
use tessera_sched::state::MigSlot;
use tessera_sched::{Decision, Engine, GovernConfig, Grant, Job, Quota, Scheduler};

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

/// Job `id` of tenant `t{t}` asking for [`request`] `(k, size)` with one CPU, at priority
/// `prio` (0 = critical … 3 = opportunistic), submitted at `now`.
fn job(fleet: &Fleet, id: u64, (k, size, t): (u8, u16, u8), prio: u8, now: i64) -> Job {
    let priority = ["critical", "high", "standard", "opportunistic"][prio as usize];
    Job::new(id, &format!("t{t}"), "p", request(fleet, k, size, t, 1), priority, now)
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

/// MIG models first, then the ones without MIG (the baseline policies run on those).
const MODELS: [&str; 23] = [
    "A30-24GB",
    "A100-40GB",
    "A100-80GB",
    "A100-40GB-PCIE",
    "A100-80GB-PCIE",
    "H100-80GB-SXM",
    "H100-80GB-PCIE",
    "H100-94GB-NVL",
    "H200-141GB",
    "H200-141GB-NVL",
    "GH200-96GB",
    "GH200-144GB",
    "H20-96GB",
    "B200-180GB",
    "GB200-186GB",
    "L40S",
    "L40",
    "L4",
    "T4",
    "P100",
    "V100M16",
    "V100M32",
    "A10",
];
/// Index of the first model without MIG in [`MODELS`].
const FIRST_WITHOUT_MIG: usize = 15;

#[derive(Clone, Debug)]
enum SchedOp {
    /// Submit a request (as [`request`]) of class `prio`, movable as `how` says.
    Submit { k: u8, size: u16, t: u8, prio: u8, how: u8 },
    /// The `i`-th running workload (modulo) ends.
    Finish(usize),
    /// Stopping victims stop (and are requeued), replacements start; time passes; a cycle.
    Settle(u16),
}

fn sched_op() -> impl Strategy<Value = SchedOp> {
    prop_oneof![
        4 => (0u8..4, 1u16..1000, 0u8..3, 0u8..4, 0u8..3)
            .prop_map(|(k, size, t, prio, how)| SchedOp::Submit { k, size, t, prio, how }),
        2 => any::<usize>().prop_map(SchedOp::Finish),
        2 => (1u16..3600).prop_map(SchedOp::Settle),
    ]
}

fn run_sched(model: &str, ops: Vec<SchedOp>) {
    let fleet = Arc::new(fleet_for(model));
    let engine = Engine::new(fleet.clone(), make_policy("tessera", &[]).unwrap(), 5);
    let empty = engine.state().clone();
    let mut cfg = GovernConfig {
        min_runtime_ms: 1000,
        reclaim_after_ms: 0,
        ..Default::default()
    };
    cfg.consolidation.moves_per_tenant_per_hour = 4;
    let mut s = Scheduler::new(engine, cfg);
    let mut jobs: HashMap<u64, Job> = HashMap::new();
    let mut running: BTreeSet<u64> = BTreeSet::new();
    let (mut stopping, mut replacing): (Vec<u64>, Vec<u64>) = (Vec::new(), Vec::new());
    let mut now = 0i64;
    let mut next = 1u64;
    let handle = |d: Vec<Decision>,
                  jobs: &HashMap<u64, Job>,
                  running: &mut BTreeSet<u64>,
                  stopping: &mut Vec<u64>,
                  replacing: &mut Vec<u64>| {
        for d in d {
            match d {
                Decision::Placed { id, .. } => {
                    running.insert(id);
                }
                Decision::PlacedGang { id, shares, .. } => {
                    let gang = jobs[&id].gang.as_ref().expect("only gangs are placed as gangs");
                    let per = gang.gpus_per_node.unwrap();
                    assert_eq!(shares.len() as u32, gang.gpus / per as u32, "placed whole");
                    let nodes: BTreeSet<u32> = shares.iter().map(|a| a.node.0).collect();
                    assert_eq!(nodes.len(), shares.len(), "one share per node");
                    running.insert(id);
                }
                Decision::Preempt { victim, .. } => stopping.push(victim),
                Decision::Move { id, to, .. } => {
                    let how = jobs[&id].movable;
                    assert!(how.is_some(), "only movable work is moved");
                    if to.is_some() {
                        assert_eq!(how, Some(Movable::Replace), "a service is replaced");
                        replacing.push(id);
                    } else {
                        assert_eq!(how, Some(Movable::Restart), "batch work is restarted");
                        stopping.push(id);
                    }
                }
                Decision::Waiting { .. } | Decision::Refused { .. } => {}
            }
        }
    };
    for op in ops {
        match op {
            SchedOp::Submit { k, size, t, prio, how } => {
                let id = next;
                next += 1;
                let job = Job {
                    movable: [None, Some(Movable::Restart), Some(Movable::Replace)][how as usize],
                    // On the whole pool (2 nodes of 4 GPUs): gangs of 2 node-shares of 1..4
                    // GPUs, and of 3 (refused at once: the pool has 2 nodes).
                    gang: (k == 0 && size.is_multiple_of(4) && fleet.catalogue.get(fleet.nodes[0].model).mig.is_none())
                        .then(|| {
                            let per = (size / 4 % 4) as u8 + 1;
                            let nodes = if size.is_multiple_of(32) { 3 } else { 2 };
                            GangRequest::nodes(nodes, per)
                                .with_tenant(TenantId(t as u32))
                                .with_host(1000, 2048)
                        }),
                    // Finished at random by the operations: no end known (`duration_ms`).
                    ..job(&fleet, id, (k, size, t), prio, now)
                };
                jobs.insert(id, job.clone());
                let d = s.submit(job, now);
                handle(d, &jobs, &mut running, &mut stopping, &mut replacing);
            }
            SchedOp::Finish(i) => {
                if let Some(&id) = running.iter().nth(i % running.len().max(1)) {
                    running.remove(&id);
                    stopping.retain(|v| *v != id);
                    replacing.retain(|v| *v != id);
                    assert!(s.release(id, now).is_some());
                }
            }
            SchedOp::Settle(dt) => {
                now += dt as i64 * 10;
                for id in std::mem::take(&mut replacing) {
                    assert!(s.replaced(id).is_some(), "a booked replacement takes over");
                }
                for id in std::mem::take(&mut stopping) {
                    running.remove(&id);
                    s.release(id, now);
                    s.enqueue(jobs[&id].clone());
                }
                let d = s.cycle(now);
                handle(d, &jobs, &mut running, &mut stopping, &mut replacing);
            }
        }
        check_invariants(&s.engine);
    }
    for id in running {
        s.release(id, now);
    }
    assert!(s.engine.state().same_holdings(&empty), "every unit is back");
}

/// A job of a random stream: request kind and size (as [`request`]), tenant, class, whether it
/// waits over a limit.
type Sub = (u8, u16, u8, u8, bool);

/// Two batches of submissions, each followed by one cycle with a budget of `budget` jobs:
/// every decision of each cycle and of the submissions. Asserts that every job submitted
/// before a cycle is decided by it or at submission, once, with a reason in words.
fn every_job_decided(model: &str, budget: usize, first: &[Sub], second: &[Sub]) -> Vec<Decision> {
    let fleet = Arc::new(fleet_for(model));
    let engine = Engine::new(fleet.clone(), make_policy("tessera", &[]).unwrap(), 5);
    let mut s = Scheduler::new(
        engine,
        GovernConfig {
            max_jobs_per_cycle: budget,
            min_runtime_ms: 1000,
            reclaim_after_ms: 0,
            ..Default::default()
        },
    );
    // Tenant t0 may use 2 units of the first pool at most.
    s.set_quota(
        "t0",
        &fleet.pools[0].name,
        Some(Quota {
            guaranteed: tessera_model::GpuUnits::whole(1),
            limit: Some(tessera_model::GpuUnits::whole(2)),
        }),
    );
    let mut all = Vec::new();
    let mut next = 1u64;
    // Queued and neither placed nor refused yet.
    let mut queued: BTreeSet<u64> = BTreeSet::new();
    for (round, subs) in [first, second].into_iter().enumerate() {
        let now = round as i64 * 1000;
        let mut undecided: BTreeSet<u64> = BTreeSet::new();
        for &(k, size, t, prio, wait) in subs {
            let id = next;
            next += 1;
            let job = Job {
                wait_if_over_limit: wait,
                ..job(&fleet, id, (k, size, t), prio, now)
            };
            match s.submit_for_next_cycle(job) {
                Some(r) => {
                    assert!(!r.to_string().is_empty());
                    all.push(Decision::Refused { id, reason: r });
                }
                None => {
                    undecided.insert(id);
                    queued.insert(id);
                }
            }
        }
        let d = s.cycle(now + 1);
        for x in &d {
            match x {
                Decision::Placed { id, .. } | Decision::PlacedGang { id, .. } => {
                    assert!(queued.remove(id), "placed once: {x:?}");
                    undecided.remove(id);
                }
                Decision::Waiting { id, reason } => {
                    assert!(queued.contains(id), "{x:?}");
                    assert!(!reason.to_string().is_empty());
                    undecided.remove(id);
                }
                Decision::Refused { id, reason } => {
                    assert!(queued.remove(id), "refused once: {x:?}");
                    assert!(!reason.to_string().is_empty());
                    undecided.remove(id);
                }
                Decision::Preempt { .. } | Decision::Move { .. } => {}
            }
        }
        assert!(
            undecided.is_empty(),
            "round {round}, budget {budget}, {} queued: no decision for {undecided:?}",
            s.queued()
        );
        all.extend(d);
    }
    all
}

fn sub() -> impl Strategy<Value = Sub> {
    (0u8..4, 1u16..1000, 0u8..4, 0u8..4, prop::bool::weighted(0.8))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn every_job_gets_a_decision_and_a_reason_from_the_next_cycle_whatever_the_queue_and_budget(
        m in prop::sample::select(vec!["A100-80GB", "H100-80GB-SXM", "T4"]),
        budget in 1usize..40,
        first in prop::collection::vec(sub(), 0..300),
        second in prop::collection::vec(sub(), 0..300),
    ) {
        let a = every_job_decided(m, budget, &first, &second);
        let b = every_job_decided(m, budget, &first, &second);
        prop_assert_eq!(a, b, "the same input, the same decisions");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn the_cycle_with_consolidation_keeps_the_invariants_and_moves_only_movable_work(
        m in prop::sample::select(vec!["A100-80GB", "H100-80GB-SXM", "A30-24GB", "V100M32", "T4"]),
        ops in prop::collection::vec(sched_op(), 1..150),
    ) {
        run_sched(m, ops);
    }

    #[test]
    fn every_model_keeps_its_invariants(m in 0usize..MODELS.len(), ops in prop::collection::vec(op(), 1..120)) {
        run(MODELS[m], ops, "tessera");
    }

    #[test]
    fn baseline_policies_keep_the_invariants_too(m in FIRST_WITHOUT_MIG..MODELS.len(), ops in prop::collection::vec(op(), 1..80), p in 0usize..3) {
        run(MODELS[m], ops, ["fgd", "bestfit", "random"][p]);
    }
}

#[test]
fn every_catalogue_model_is_covered() {
    let c = Catalogue::builtin();
    for (_, m) in c.models() {
        assert!(MODELS.contains(&m.name.as_str()), "{} has no property test", m.name);
        let i = MODELS.iter().position(|n| *n == m.name).unwrap();
        assert_eq!(
            m.mig.is_some(),
            i < FIRST_WITHOUT_MIG,
            "{} is in the wrong group",
            m.name
        );
    }
}

// ----- MIG modes, provisional bookings and rebinds --------------------------------------------

#[derive(Clone, Debug)]
enum MigOp {
    /// Place a request for profile `profile` (modulo the geometry's), for tenant `t`; with
    /// `probe`, release it at once.
    Place {
        profile: usize,
        t: u8,
        cpu: u8,
        probe: bool,
    },
    /// Release the `i`-th live allocation (modulo).
    Release(usize),
    /// Rebind the `i`-th live allocation to a target picked by `how` and `pick` (see `target`).
    Rebind { i: usize, how: u8, pick: usize },
    /// Bind the `i`-th live allocation.
    Bind(usize),
}

fn mig_op() -> impl Strategy<Value = MigOp> {
    prop_oneof![
        4 => (0usize..16, 0u8..3, 0u8..12, any::<bool>())
            .prop_map(|(profile, t, cpu, probe)| MigOp::Place { profile, t, cpu, probe }),
        2 => any::<usize>().prop_map(MigOp::Release),
        3 => (any::<usize>(), 0u8..3, any::<usize>()).prop_map(|(i, how, pick)| MigOp::Rebind { i, how, pick }),
        1 => any::<usize>().prop_map(MigOp::Bind),
    ]
}

/// A target of the same profile on the allocation's node: another live allocation's instance
/// (`how = 0`: a swap when it is provisional), a configured instance (`how = 1`), or any legal
/// placement on any GPU of the node (`how = 2`, mostly refused in `WholeGpu` mode).
fn target(e: &Engine, id: u64, how: u8, pick: usize) -> Grant {
    let a = e.allocation(id).unwrap();
    let Grant::Mig {
        profile,
        profile_id,
        size,
        ..
    } = a.grant
    else {
        panic!("MIG pools hold MIG grants")
    };
    let node = &e.fleet().nodes[a.node.0 as usize];
    let geom = e.fleet().catalogue.get(node.model).mig.unwrap();
    let mig = |gpu: u8, start: u8| Grant::Mig {
        gpu,
        profile,
        profile_id,
        start,
        size,
    };
    // Sorted, so that the pick does not depend on the map's iteration order.
    let mut others: Vec<(u8, u8)> = e
        .state()
        .allocations
        .values()
        .filter(|b| b.id != id && b.node == a.node)
        .filter_map(|b| match b.grant {
            Grant::Mig {
                gpu, profile: p, start, ..
            } if p == profile => Some((gpu, start)),
            _ => None,
        })
        .collect();
    others.sort_unstable();
    let configured: Vec<Grant> = (0..node.gpus)
        .flat_map(|g| {
            e.mig_layout(a.node, g)
                .into_iter()
                .filter(|s| s.profile == profile)
                .map(move |s| mig(g, s.start))
        })
        .collect();
    match how {
        0 if !others.is_empty() => {
            let (gpu, start) = others[pick % others.len()];
            mig(gpu, start)
        }
        1 if !configured.is_empty() => configured[pick % configured.len()].clone(),
        _ => {
            let starts = geom.profiles[profile as usize].starts;
            mig((pick % node.gpus as usize) as u8, starts[pick / 16 % starts.len()])
        }
    }
}

/// Layout invariants of every MIG GPU.
fn check_layouts(e: &Engine, mode: MigMode) {
    let fleet = e.fleet();
    for (n, node) in fleet.nodes.iter().enumerate() {
        let geom = fleet.catalogue.get(node.model).mig.unwrap();
        for (g, gs) in e.state().nodes[n].gpus.iter().enumerate() {
            let layout: Vec<Placed> = e
                .mig_layout(NodeId(n as u32), g as u8)
                .iter()
                .map(|s| Placed {
                    profile: s.profile,
                    start: s.start,
                })
                .collect();
            let mask = validate(geom, &layout).expect("every configured layout is valid");
            assert!(media_instances(geom, &layout) <= 1, "one +me instance at most");
            assert!(layout.windows(2).all(|w| w[0].start < w[1].start), "ordered by start");
            assert_eq!(mask & gs.mig_mask, gs.mig_mask, "the occupied slices are configured");
            for h in &gs.holders {
                let Grant::Mig { profile, start, .. } = e.allocation(*h).unwrap().grant else {
                    unreachable!()
                };
                assert!(
                    layout.contains(&Placed { profile, start }),
                    "an instance in use is part of its GPU's layout"
                );
            }
            if mode == MigMode::Instance {
                assert_eq!(mask, gs.mig_mask, "in Instance mode only instances in use exist");
                assert!(gs.mig_layout.is_empty());
            }
        }
    }
    for id in &e.state().unbound {
        assert!(e.allocation(*id).is_some(), "only live allocations are provisional");
    }
}

/// Every GPU's layout, to see which ones a step changed.
fn layouts(e: &Engine) -> Vec<Vec<Vec<MigSlot>>> {
    let fleet = e.fleet();
    (0..fleet.nodes.len())
        .map(|n| {
            (0..fleet.nodes[n].gpus)
                .map(|g| e.mig_layout(NodeId(n as u32), g))
                .collect()
        })
        .collect()
}

/// Per node: free CPU, free memory, GPU units in use; per tenant: GPU units held.
type Held = (Vec<(u64, u64, u64)>, Vec<(Option<TenantId>, u64)>);

fn held(e: &Engine) -> Held {
    let nodes = e
        .state()
        .nodes
        .iter()
        .map(|n| (n.cpu_free, n.mem_free, n.gpus.iter().map(|g| g.used_milli as u64).sum()))
        .collect();
    let mut tenants: HashMap<Option<TenantId>, u64> = HashMap::new();
    for a in e.state().allocations.values() {
        *tenants.entry(a.tenant).or_default() += a.units.as_milli();
    }
    let mut tenants: Vec<_> = tenants.into_iter().collect();
    tenants.sort();
    (nodes, tenants)
}

fn run_mig(model: &str, mode: MigMode, initial: Vec<usize>, ops: Vec<MigOp>) {
    let fleet = Arc::new(fleet_for(model));
    let mut e = Engine::new(fleet.clone(), make_policy("tessera", &[]).unwrap(), 3);
    e.set_mig_mode(mode).unwrap();
    e.set_device_binding(DeviceBinding::PerNodeCount);
    let geom = fleet.catalogue.get(fleet.nodes[0].model).mig.unwrap();
    if mode == MigMode::WholeGpu {
        // Layouts as a backend would report them at start-up: some GPUs configured, some not.
        let all: Vec<Vec<Placed>> = enumerate_layouts(geom)
            .into_iter()
            .filter(|l| media_instances(geom, l) <= 1)
            .collect();
        for (k, pick) in initial.into_iter().enumerate() {
            let (n, g) = (k / 4, (k % 4) as u8);
            let slots: Vec<MigSlot> = all[pick % all.len()].iter().map(|p| MigSlot::of(geom, p)).collect();
            e.adopt_layout(NodeId(n as u32), g, &slots).unwrap();
        }
    }
    let empty = e.state().clone();
    let mut live: Vec<u64> = Vec::new();
    let mut next = 0u64;
    for op in ops {
        let before = e.state().clone();
        let layouts_before = layouts(&e);
        match op {
            MigOp::Place { profile, t, cpu, probe } => {
                let p = &geom.profiles[profile % geom.profiles.len()];
                let choice = tessera_model::request::MigChoice::resolve(
                    &fleet.catalogue,
                    &format!("{}:{}", fleet.catalogue.get(fleet.nodes[0].model).name, p.id),
                )
                .unwrap();
                let req = Request::new(Shape::Mig(choice))
                    .with_host(cpu as u64 * 1000, cpu as u64 * 2048)
                    .with_tenant(TenantId(t as u32));
                next += 1;
                match e.plan(&req) {
                    Ok(placement) => {
                        let relayout = placement.relayout;
                        let a = e.commit(next, &req, placement).unwrap().clone();
                        let Grant::Mig { gpu, .. } = a.grant else {
                            unreachable!()
                        };
                        let gpu_before = &before.nodes[a.node.0 as usize].gpus[gpu as usize];
                        if mode == MigMode::Instance {
                            assert!(!relayout);
                        } else {
                            assert_eq!(
                                relayout,
                                layouts(&e)[a.node.0 as usize][gpu as usize]
                                    != layouts_before[a.node.0 as usize][gpu as usize],
                                "the placement says whether the layout changes"
                            );
                            if relayout {
                                assert!(gpu_before.holders.is_empty(), "only an idle GPU is laid out again");
                            }
                        }
                        assert_eq!(e.is_bound(next), Some(false), "a commit is provisional");
                        if probe {
                            e.release(next).unwrap();
                            if mode == MigMode::Instance {
                                assert!(
                                    e.state().same_holdings(&before),
                                    "place-then-release restores the exact state"
                                );
                            } else {
                                assert!(
                                    e.state().same_occupancy(&before),
                                    "place-then-release restores the occupancy"
                                );
                            }
                        } else {
                            live.push(next);
                        }
                    }
                    Err(_) => assert!(e.state().same_holdings(&before), "a refusal changes nothing"),
                }
            }
            MigOp::Release(i) => {
                if !live.is_empty() {
                    let id = live.swap_remove(i % live.len());
                    assert!(e.release(id).is_some());
                    if mode == MigMode::WholeGpu {
                        assert_eq!(layouts(&e), layouts_before, "a release leaves the layout");
                    }
                }
            }
            MigOp::Bind(i) => {
                if !live.is_empty() {
                    let id = live[i % live.len()];
                    e.bind(id).unwrap();
                    assert_eq!(e.is_bound(id), Some(true));
                    assert_eq!(e.state().allocations, before.allocations, "binding moves nothing");
                }
            }
            MigOp::Rebind { i, how, pick } => {
                if !live.is_empty() {
                    let id = live[i % live.len()];
                    let grant = target(&e, id, how, pick);
                    let held_before = held(&e);
                    match e.rebind(id, grant.clone()) {
                        Ok(changed) => {
                            assert_eq!(e.allocation(id).unwrap().grant, grant);
                            assert_eq!(e.is_bound(id), Some(true), "a rebound allocation is bound");
                            assert_eq!(held(&e), held_before, "rebinds conserve capacity");
                            let moved: BTreeSet<u64> = before
                                .allocations
                                .iter()
                                .filter(|(k, a)| e.allocation(**k).unwrap().grant != a.grant)
                                .map(|(k, _)| *k)
                                .collect();
                            assert_eq!(changed.iter().copied().collect::<BTreeSet<_>>(), moved);
                            for k in &changed {
                                let (a, b) = (&before.allocations[k], e.allocation(*k).unwrap());
                                assert_eq!((a.node, a.units, a.tenant), (b.node, b.units, b.tenant));
                                if *k != id {
                                    assert!(before.unbound.contains(k), "only provisional bookings are swapped");
                                    assert_eq!(e.is_bound(*k), Some(false));
                                }
                            }
                            if mode == MigMode::WholeGpu {
                                assert_eq!(layouts(&e), layouts_before, "a rebind never changes a layout");
                            }
                        }
                        Err(_) => assert!(e.state().same_holdings(&before), "a refused rebind changes nothing"),
                    }
                }
            }
        }
        check_invariants(&e);
        check_layouts(&e, mode);
        if mode == MigMode::WholeGpu {
            let after = layouts(&e);
            for (n, gpus) in after.iter().enumerate() {
                for (g, l) in gpus.iter().enumerate() {
                    if *l != layouts_before[n][g] {
                        assert!(
                            before.nodes[n].gpus[g].holders.is_empty(),
                            "a GPU's layout changes only while it has no holder"
                        );
                    }
                }
            }
        }
    }
    for id in live {
        e.release(id).unwrap();
    }
    if mode == MigMode::Instance {
        assert!(
            e.state().same_holdings(&empty),
            "releasing everything returns every unit"
        );
    } else {
        assert!(
            e.state().same_occupancy(&empty),
            "releasing everything returns every unit"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn mig_modes_keep_their_invariants_through_rebinds(
        m in 0usize..FIRST_WITHOUT_MIG,
        whole_gpu in any::<bool>(),
        initial in prop::collection::vec(prop_oneof![1 => Just(0usize), 2 => any::<usize>()], 12),
        ops in prop::collection::vec(mig_op(), 1..120),
    ) {
        let mode = if whole_gpu { MigMode::WholeGpu } else { MigMode::Instance };
        run_mig(MODELS[m], mode, initial, ops);
    }
}

#[test]
fn the_mig_property_test_covers_every_mig_model() {
    let c = Catalogue::builtin();
    for name in &MODELS[..FIRST_WITHOUT_MIG] {
        assert!(c.get(c.find(name).unwrap()).mig.is_some(), "{name}");
    }
    for name in &MODELS[FIRST_WITHOUT_MIG..] {
        assert!(c.get(c.find(name).unwrap()).mig.is_none(), "{name}");
    }
}
