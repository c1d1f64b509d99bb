//! Benchmark (not part of the test command): on the test API server with 60 GPU nodes and 500
//! running Tessera pods, how long a start takes from the backend call to the pod bound
//! (create + Binding), sequentially and 8 at a time. Prints p50/p99/max.
//!
//! `cargo test -p tessera-backend-kube --test integration bench_bind:: -- --ignored --nocapture`

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::support::{Cluster, gpu_node, set_pod_phase};
use serde_json::json;
use tessera_backend::{Backend, Devices, Resource, RunSpec, TenancySpec};
use tessera_backend_kube::{KubeBackend, KubeConfig};

/// This module's test cluster (its own; other modules of the test binary have theirs).
async fn cluster() -> &'static Cluster {
    crate::support::cluster_in(module_path!()).await
}

fn spec(id: u64, node: usize) -> RunSpec {
    RunSpec {
        id,
        tenant: "bench".into(),
        project: "main".into(),
        name: format!("b{id}"),
        kind: "batch".into(),
        node: format!("bench-{node:02}"),
        model: "H100-80GB-SXM".into(),
        model_memory_mib: 81559,
        devices: Devices::Count {
            resource: Resource::Gpu,
            count: 1,
        },
        cpu_milli: 1000,
        memory_mib: 1024,
        env: BTreeMap::new(),
        command: None,
        image: Some("registry.example/bench:1".into()),
        duration: None,
        running_since_ms: None,
        gang: Vec::new(),
        native: None,
    }
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "benchmark (about a minute): run with --ignored --nocapture"]
async fn request_to_pod_bound_on_60_nodes_with_500_running_pods() {
    let c = cluster().await;
    let client = c.client().await.unwrap();
    for n in 0..60 {
        gpu_node(
            &client,
            &format!("bench-{n:02}"),
            "bench",
            "NVIDIA-H100-80GB-HBM3",
            8,
            json!({}),
        )
        .await;
    }
    let (b, fleet) = KubeBackend::connect(client.clone(), KubeConfig::default())
        .await
        .unwrap();
    assert_eq!(fleet.nodes.len(), 60);
    let _rx = b.take_events().unwrap();
    b.ensure_tenancy(&TenancySpec {
        tenant: "bench".into(),
        project: "main".into(),
        groups: vec![],
        quota: BTreeMap::new(),
    })
    .await
    .unwrap();
    let ns = b.namespace_of("bench", "main");
    let t0 = Instant::now();
    for id in 1..=500u64 {
        b.start(&spec(id, id as usize % 60)).await.unwrap();
        set_pod_phase(&client, &ns, &format!("tessera-{id}"), "Running").await;
    }
    eprintln!("500 running pods in {:?}", t0.elapsed());

    let mut seq = Vec::new();
    for id in 1001..=1200u64 {
        let t = Instant::now();
        b.start(&spec(id, id as usize % 60)).await.unwrap();
        seq.push(t.elapsed());
    }
    let b = std::sync::Arc::new(b);
    let mut par = Vec::new();
    for chunk in (2001..=2200u64).collect::<Vec<_>>().chunks(8) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|&id| {
                let b = b.clone();
                tokio::spawn(async move {
                    let t = Instant::now();
                    b.start(&spec(id, id as usize % 60)).await.unwrap();
                    t.elapsed()
                })
            })
            .collect();
        for t in tasks {
            par.push(t.await.unwrap());
        }
    }
    for (what, v) in [("sequential", &mut seq), ("8 concurrent", &mut par)] {
        let (p50, p99) = (pct(v, 0.50), pct(v, 0.99));
        let max = *v.iter().max().unwrap();
        eprintln!(
            "request → pod bound, {what}, n={}: p50 {p50:?} p99 {p99:?} max {max:?}",
            v.len()
        );
        assert!(p99 < Duration::from_secs(1), "{what}: p99 {p99:?} over 1 s");
    }
}
