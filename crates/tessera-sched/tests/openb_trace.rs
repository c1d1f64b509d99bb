//! The replay on the real openb trace (read from `../shared/traces/openb`, or the folder named by
//! `TESSERA_OPENB_DIR`): the BestFit sanity check of the protocol, the repository's FGD against
//! the published FGD figure, and Tessera's policy against both and the floors. The trace is not part of the repository; CI
//! lays `shared/` beside the clone. Without it the test fails and says where to get it.

use std::path::PathBuf;
use std::sync::Arc;

use tessera_model::Fleet;
use tessera_sched::replay::{ReplayResult, parse_pods, replay_seed};

fn trace_dir() -> PathBuf {
    if let Ok(d) = std::env::var("TESSERA_OPENB_DIR") {
        return PathBuf::from(d);
    }
    // crates/tessera-sched -> repository root -> ../shared
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces/openb")
}

fn run(policy: &str) -> ReplayResult {
    let dir = trace_dir();
    let nodes = dir.join("openb_node_list_gpu_node.csv");
    let pods = dir.join("openb_pod_list_default.csv");
    let read = |p: &PathBuf| {
        std::fs::read_to_string(p).unwrap_or_else(|e| {
            panic!(
                "{}: {e}. The openb trace (the csv folder of cluster-trace-gpu-v2023 in the public alibaba/clusterdata repository) must be at ../shared/traces/openb or in TESSERA_OPENB_DIR",
                p.display()
            )
        })
    };
    let fleet = Fleet::from_openb_nodes(&read(&nodes), "nodes").unwrap();
    let pods = parse_pods(&read(&pods), "pods", &fleet.catalogue).unwrap();
    assert_eq!((fleet.nodes.len(), fleet.gpu_count(), pods.len()), (1213, 6212, 8152));
    let fleet = Arc::new(fleet);
    let per_seed = (42..=51)
        .map(|seed| replay_seed(&fleet, &pods, policy, seed).unwrap())
        .collect();
    ReplayResult {
        policy: policy.to_string(),
        capacity_milli: fleet.gpu_count() * 1000,
        per_seed,
    }
}

#[test]
fn bestfit_replay_matches_the_published_protocol() {
    let r = run("bestfit");
    let m = r.mean_100();
    // The README of the trace: a faithful BestFit replay lands at about 7.1–7.2 % (published 7.14).
    assert!((7.0..=7.3).contains(&m), "BestFit unallocated at 100 %: {m:.2}");
}

#[test]
fn fgd_replay_matches_the_published_figure() {
    let r = run("fgd");
    let m = r.mean_100();
    // Published 4.77 % (standard deviation 0.11 over 10 seeds); the paper's simulator gives
    // 4.86 % on seed 42.
    assert!(
        (4.62..=4.92).contains(&m),
        "FGD unallocated at 100 %: {m:.2} (published 4.77)"
    );
}

#[test]
fn tessera_beats_published_fgd_on_the_default_workload() {
    let r = run("tessera");
    let m = r.mean_100();
    assert!(m < 4.77, "Tessera unallocated at 100 %: {m:.2} (FGD published 4.77)");
    // The pairing term's gain (module doc of `tessera`, term 5): 3.85 % with it, 4.15 % without
    // it and 4.11 % with its earlier random-fill form; 3.79 % with the priced fill (term 6),
    // 3.73 % with the pairing term's host fit as well.
    assert!(m < 3.78, "Tessera unallocated at 100 %: {m:.2} (3.73 expected)");
    assert!(
        r.mean_130() < 4.61,
        "at 130 %: {:.2} (FGD published 4.61)",
        r.mean_130()
    );
    // If every arrived share were placed, no placement could leave less than 3.83 % at 100 %
    // (the bound of `tessera_sched::bound` on the shares of each seed); but shares do fail
    // (about 100 by then), so that says nothing of Tessera's run. What holds: no scheduler
    // that never refuses a pod that fits can leave less than 3.64 % (the non-refusing floor),
    // and no scheduler at all less than 3.09 %.
    let limit = r.mean(|s| s.share_limit_100);
    assert!((3.78..=3.88).contains(&limit), "share limit at 100 %: {limit:.2}");
    let floor = r.mean(|s| s.non_refusing_floor_100);
    assert!(
        (3.55..=3.75).contains(&floor),
        "non-refusing floor at 100 %: {floor:.2}"
    );
    let any = r.mean(|s| s.any_floor_100);
    assert!((3.0..=3.2).contains(&any), "any-scheduler floor at 100 %: {any:.2}");
    for s in &r.per_seed {
        assert!(
            s.failed_shares_100 > 0 && s.failed_shares_100 <= s.failed_pods_100,
            "{s:?}"
        );
        // (Up to rounding: on seed 47 Tessera's packing at 130 % has no slack over the prices,
        // and the two figures, summed differently, differ in the 15th digit.)
        assert!(s.packing_limit_100 <= s.unallocated_100 + 1e-9, "{s:?}");
        assert!(s.packing_limit_130 <= s.unallocated_130 + 1e-9, "{s:?}");
        assert!(s.non_refusing_floor_100 <= s.unallocated_100 + 1e-9, "{s:?}");
        assert!(s.non_refusing_floor_130 <= s.unallocated_130 + 1e-9, "{s:?}");
    }
}
