//! The Kubernetes backend with a real kubelet (`crate::support::kubelet`): containerd and runc run the
//! pods Tessera creates and binds, so placement, running, exits, exit codes, cancellation and logs
//! are the kubelet's, not a test playing it. One control plane and one node per binary (about
//! 15 s to Ready); each test its own tenant, namespace and workload IDs. Prints the request →
//! bound and request → Running latencies it sees.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use crate::support::kubelet::{BUSYBOX, NODE, POOL, kubelet_node};
use crate::support::{expect_event, expect_success};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::LogParams;
use tessera_backend::{Backend, BackendEvent, Devices, Exit, Resource, RunSpec, TenancySpec};
use tessera_backend_kube::{KubeBackend, KubeConfig};

/// Pods start in a few seconds; the first on a fresh node waits for its sandbox.
const WAIT: Duration = Duration::from_secs(60);

fn config() -> KubeConfig {
    KubeConfig {
        mig_namespace: "default".into(),
        mig_configmap: "mig-parted-kubelet".into(),
        // Long: a cancelled pod must be removed by the kubelet confirming its deletion, not by
        // the backend's forced delete.
        force_delete_after: Duration::from_secs(300),
        telemetry_every: None,
        ..KubeConfig::default()
    }
}

fn run(id: u64, tenant: &str, command: &[&str]) -> RunSpec {
    RunSpec {
        id,
        tenant: tenant.into(),
        project: "main".into(),
        name: format!("job-{id}"),
        kind: "batch".into(),
        node: NODE.into(),
        model: "H100-80GB-SXM".into(),
        model_memory_mib: 81559,
        devices: Devices::Count {
            resource: Resource::Gpu,
            count: 1,
        },
        // Small: the node is this 2-core machine (the kubelet admits against its real CPU and
        // memory; only the GPUs are advertised).
        cpu_milli: 100,
        memory_mib: 64,
        env: BTreeMap::new(),
        command: Some(command.iter().map(|s| s.to_string()).collect()),
        image: Some(BUSYBOX.into()),
        duration: None,
        running_since_ms: None,
        gang: Vec::new(),
        native: None,
    }
}

async fn backend(tenant: &str) -> (KubeBackend, tokio::sync::mpsc::UnboundedReceiver<BackendEvent>, String) {
    let (c, _) = kubelet_node().await;
    let client = c.client().await.unwrap();
    let evict = c.evict_client().await.unwrap();
    let (b, _fleet) = KubeBackend::connect_with(client, evict, config()).await.unwrap();
    let rx = b.take_events().unwrap();
    b.ensure_tenancy(&TenancySpec {
        tenant: tenant.into(),
        project: "main".into(),
        groups: vec![format!("{tenant}-ml")],
        quota: BTreeMap::from([("nvidia.com/gpu".into(), 8)]),
    })
    .await
    .unwrap();
    let ns = b.namespace_of(tenant, "main");
    (b, rx, ns)
}

/// Reported outside the test harness's capture, so `cargo test` shows it.
fn report(line: &str) {
    let _ = writeln!(std::io::stderr(), "kubelet latency: {line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_registers_as_a_ready_eight_gpu_h100_node_in_its_pool() {
    let (c, n) = kubelet_node().await;
    let client = c.client().await.unwrap();
    let (_b, fleet) = KubeBackend::connect(client, config()).await.unwrap();
    let node = fleet
        .nodes
        .iter()
        .find(|x| x.name == NODE)
        .expect("the kubelet's node is in the fleet");
    assert_eq!(fleet.catalogue.get(node.model).name, "H100-80GB-SXM");
    assert_eq!(fleet.pools[node.pool.0 as usize].name, POOL);
    let out = c.kubectl(&["get", "node", NODE, "-o", "wide", "--no-headers"]);
    let line = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(n.name, NODE);
    assert!(line.contains(" Ready "), "{line}");
    assert!(
        line.contains(&n.ip),
        "the node's InternalIP is the veth's host end: {line}"
    );
    assert!(line.contains("v1.20.2"), "{line}");
    assert!(line.contains("containerd://"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_runs_to_success_and_its_log_is_readable() {
    let (c, _) = kubelet_node().await;
    let (b, mut rx, ns) = backend("klok").await;
    let pods = Api::<Pod>::namespaced(b.client().clone(), &ns);

    // A command that ends at once: it usually ends before the kubelet's next relist, so the pod goes
    // from Pending to Succeeded without a Running status in between.
    let t0 = Instant::now();
    b.start(&run(701, "klok", &["sh", "-c", "echo hi; exit 0"]))
        .await
        .unwrap();
    expect_event(&mut rx, "Started", WAIT, |e| {
        matches!(e, BackendEvent::Started { id: 701, .. })
    })
    .await;
    let bound = t0.elapsed();
    let p = pods.get("tessera-701").await.unwrap();
    assert_eq!(p.spec.unwrap().node_name.as_deref(), Some(NODE));
    expect_success(&mut rx, 701, WAIT).await;
    report(&format!(
        "`echo hi; exit 0`: request → bound {bound:?}, → Succeeded {:?}",
        t0.elapsed()
    ));
    let status = pods.get("tessera-701").await.unwrap().status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Succeeded"));
    let cs = &status.container_statuses.unwrap()[0];
    assert!(cs.image.ends_with(BUSYBOX), "the local image: {}", cs.image);
    assert_eq!(cs.state.as_ref().unwrap().terminated.as_ref().unwrap().exit_code, 0);

    // Its log, through kubectl (API server → the kubelet on the node's address) and the API.
    let out = c.kubectl(&["logs", "-n", &ns, "tessera-701"]);
    assert!(
        out.status.success(),
        "kubectl logs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n");
    let log = pods.logs("tessera-701", &LogParams::default()).await.unwrap();
    assert_eq!(log, "hi\n");
    // And through the backend, as `tessera logs` reads it: whole, then from an offset.
    let chunk = b.read_logs(701, 0, 1 << 20).await.unwrap();
    assert_eq!(
        (chunk.bytes.as_slice(), chunk.next_offset, chunk.done),
        (&b"hi\n"[..], 3, true)
    );
    let chunk = b.read_logs(701, 1, 1).await.unwrap();
    assert_eq!(
        (chunk.bytes.as_slice(), chunk.next_offset, chunk.done),
        (&b"i"[..], 2, false)
    );
    assert!(b.read_logs(7010, 0, 10).await.is_err(), "no pod, no log");

    // One that runs long enough to be seen running: placed → running → succeeded.
    let t0 = Instant::now();
    b.start(&run(702, "klok", &["sh", "-c", "echo started; sleep 2; echo done"]))
        .await
        .unwrap();
    expect_event(&mut rx, "Started", WAIT, |e| {
        matches!(e, BackendEvent::Started { id: 702, .. })
    })
    .await;
    let bound = t0.elapsed();
    expect_event(&mut rx, "Running", WAIT, |e| {
        matches!(e, BackendEvent::Running { id: 702, .. })
    })
    .await;
    let running = t0.elapsed();
    expect_success(&mut rx, 702, WAIT).await;
    report(&format!(
        "`sleep 2`: request → bound {bound:?}, → Running {running:?}, → Succeeded {:?}",
        t0.elapsed()
    ));
    let log = pods.logs("tessera-702", &LogParams::default()).await.unwrap();
    assert_eq!(log, "started\ndone\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_command_reports_its_exit_code() {
    let (c, _) = kubelet_node().await;
    let (b, mut rx, ns) = backend("klfail").await;
    let t0 = Instant::now();
    b.start(&run(711, "klfail", &["sh", "-c", "echo bye >&2; exit 3"]))
        .await
        .unwrap();
    let ev = expect_event(&mut rx, "Exited", WAIT, |e| {
        matches!(e, BackendEvent::Exited { id: 711, .. })
    })
    .await;
    match ev {
        BackendEvent::Exited {
            exit: Exit::Failed { exit_code, detail },
            ..
        } => {
            assert_eq!(exit_code, Some(3), "{detail}");
            assert!(detail.contains("Error"), "the kubelet's reason: {detail}");
        }
        other => panic!("expected a failure with exit code 3, got {other:?}"),
    }
    report(&format!("`exit 3`: request → Failed {:?}", t0.elapsed()));
    let out = c.kubectl(&["logs", "-n", &ns, "tessera-711"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "bye\n",
        "stderr is in the log too"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_running_pod_stops_it_through_the_kubelet() {
    let (_, _) = kubelet_node().await;
    let (b, mut rx, ns) = backend("klstop").await;
    let pods = Api::<Pod>::namespaced(b.client().clone(), &ns);
    let t0 = Instant::now();
    b.start(&run(721, "klstop", &["sleep", "600"])).await.unwrap();
    expect_event(&mut rx, "Started", WAIT, |e| {
        matches!(e, BackendEvent::Started { id: 721, .. })
    })
    .await;
    let bound = t0.elapsed();
    expect_event(&mut rx, "Running", WAIT, |e| {
        matches!(e, BackendEvent::Running { id: 721, .. })
    })
    .await;
    let running = t0.elapsed();
    report(&format!(
        "`sleep 600`: request → bound {bound:?}, → Running {running:?}"
    ));
    let p = pods.get("tessera-721").await.unwrap();
    assert!(
        p.status.unwrap().pod_ip.is_some_and(|ip| ip.starts_with("10.244.0.")),
        "an address from the node's CNI bridge"
    );

    // Cancel with a 2 s grace period: `sleep` as PID 1 ignores SIGTERM, so the kubelet kills it
    // after the grace period and then confirms the deletion (the backend's forced delete is 300 s
    // away, so the pod going is the kubelet's doing).
    let t1 = Instant::now();
    b.stop(721, Duration::from_secs(2)).await.unwrap();
    assert!(
        pods.get("tessera-721")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );
    // The workload is `Stopped` (its GPUs free for the next one) only once the kubelet has
    // removed the pod: never while the container may still hold the device.
    let mut stopped = false;
    loop {
        let there = pods.get_opt("tessera-721").await.unwrap().is_some();
        while let Ok(e) = rx.try_recv() {
            assert!(
                e.workload() != Some(721) || matches!(e, BackendEvent::Stopped { .. }),
                "event after stop: {e:?}"
            );
            if matches!(e, BackendEvent::Stopped { id: 721, .. }) {
                assert!(!there, "Stopped while the kubelet still had the pod");
                stopped = true;
            }
        }
        if !there {
            break;
        }
        assert!(
            t1.elapsed() < WAIT,
            "the kubelet did not remove the cancelled pod within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let gone = t1.elapsed();
    report(&format!("cancel of `sleep 600` (grace 2 s): stop → pod gone {gone:?}"));
    assert!(gone >= Duration::from_secs(2), "the grace period is honoured: {gone:?}");
    if !stopped {
        expect_event(&mut rx, "Stopped", WAIT, |e| {
            matches!(e, BackendEvent::Stopped { id: 721, .. })
        })
        .await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    while let Ok(ev) = rx.try_recv() {
        assert!(ev.workload() != Some(721), "event after Stopped: {ev:?}");
    }
}

/// With the kubelet running the pods: an eviction a PodDisruptionBudget refuses is told at once
/// (a `Notice`) and the pod keeps running and holding its GPUs; once the budget allows it, the
/// retried eviction goes through and the workload is `Stopped` only after the kubelet removed
/// the pod. The requeued workload's next attempt (`tessera-ID-r1`) then runs while nothing of
/// the first is left, and a restarted backend adopts it without a duplicate and follows it to
/// its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_under_a_budget_then_requeue_then_restart_adoption() {
    let (c, _) = kubelet_node().await;
    let (b, mut rx, ns) = backend("klpdb").await;
    let pods = Api::<Pod>::namespaced(b.client().clone(), &ns);
    let spec = run(731, "klpdb", &["sleep", "600"]);
    let t = Instant::now();
    b.start(&spec).await.unwrap();
    expect_event(&mut rx, "Running", WAIT, |e| {
        matches!(e, BackendEvent::Running { id: 731, .. })
    })
    .await;
    report(&format!("budget test: start → Running {:?}", t.elapsed()));
    let pdb = serde_json::json!({
        "apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "keep-731", "namespace": ns},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"tessera.io/workload": "731"}}},
    });
    let file = std::env::temp_dir().join(format!("pdb-731-{}.json", std::process::id()));
    std::fs::write(&file, serde_json::to_vec(&pdb).unwrap()).unwrap();
    let out = c.kubectl(&["apply", "-f", file.to_str().unwrap()]);
    let _ = std::fs::remove_file(&file);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The disruption controller computes the budget's status before it refuses anything.
    tokio::time::sleep(Duration::from_secs(2)).await;
    b.evict(731, Duration::from_secs(1)).await.unwrap();
    match expect_event(&mut rx, "the refusal", WAIT, |e| {
        matches!(
            e,
            BackendEvent::Notice { id: 731, .. } | BackendEvent::Stopped { id: 731, .. }
        )
    })
    .await
    {
        BackendEvent::Notice { detail, .. } => assert!(detail.contains("PodDisruptionBudget"), "{detail}"),
        other => panic!("evicted through the budget: {other:?}"),
    }
    let p = pods.get("tessera-731").await.unwrap();
    assert!(p.metadata.deletion_timestamp.is_none(), "the refused pod keeps running");
    let first_uid = p.metadata.uid.clone();
    let t0 = Instant::now();
    let out = c.kubectl(&["-n", &ns, "delete", "pdb", "keep-731"]);
    assert!(out.status.success());
    expect_event(&mut rx, "Stopped once the kubelet removed the pod", WAIT, |e| {
        matches!(e, BackendEvent::Stopped { id: 731, .. })
    })
    .await;
    assert!(pods.get_opt("tessera-731").await.unwrap().is_none());
    report(&format!(
        "eviction once the budget allows it → Stopped {:?}",
        t0.elapsed()
    ));

    // Requeued: the next start makes a new pod (the first is gone, so its name is free).
    let t1 = Instant::now();
    b.start(&spec).await.unwrap();
    expect_event(&mut rx, "the requeued attempt runs", WAIT, |e| {
        matches!(e, BackendEvent::Running { id: 731, .. })
    })
    .await;
    report(&format!("requeued start → Running {:?}", t1.elapsed()));
    let again = pods.get("tessera-731").await.unwrap();
    assert_ne!(again.metadata.uid, first_uid, "a new pod");

    // A restarted backend adopts the running attempt: no duplicate, and its end is followed.
    let t2 = Instant::now();
    drop(b);
    drop(rx);
    let client = c.client().await.unwrap();
    let evict = c.evict_client().await.unwrap();
    let (b2, _) = KubeBackend::connect_with(client, evict, config()).await.unwrap();
    let mut rx2 = b2.take_events().unwrap();
    let seen = b2.reconcile(std::slice::from_ref(&spec)).await.unwrap();
    assert!(
        matches!(
            seen.workloads.as_slice(),
            [(731, tessera_backend::Observation::Running { .. })]
        ),
        "{seen:?}"
    );
    let listed = pods
        .list(&kube::api::ListParams::default().labels("tessera.io/workload=731"))
        .await
        .unwrap();
    let live: Vec<_> = listed
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    assert_eq!(live, vec!["tessera-731".to_string()], "no duplicate after the restart");
    b2.stop(731, Duration::from_secs(1)).await.unwrap();
    expect_event(&mut rx2, "the adopted workload's stop", WAIT, |e| {
        matches!(e, BackendEvent::Stopped { id: 731, .. })
    })
    .await;
    report(&format!("restart, adoption and stop {:?}", t2.elapsed()));
}

/// The backend contract suite of `tessera-backend` ([`tessera_backend::contract`]) on the real
/// kubelet: each check a backend of its own, all in tenant `kcontract` on the one node (the
/// suite's ids are their own); the node has no MIG GPU, so the partition check passes without
/// partitioning.
mod contract_suite {
    use std::time::Duration;

    use async_trait::async_trait;
    use tessera_backend::contract::{Harness, Run};
    use tessera_backend::{Backend, PartitionPlan, RunSpec};
    use tessera_backend_kube::KubeBackend;

    const TENANT: &str = "kcontract";

    pub struct KubeletHarness;

    #[async_trait]
    impl Harness for KubeletHarness {
        type B = KubeBackend;

        /// A backend whose events nobody has taken, the tenant's namespace made.
        async fn backend(&self) -> KubeBackend {
            let (b, rx, _) = super::backend(TENANT).await;
            drop((b, rx));
            let (c, _) = super::kubelet_node().await;
            let client = c.client().await.unwrap();
            let evict = c.evict_client().await.unwrap();
            let (b, _) = KubeBackend::connect_with(client, evict, super::config()).await.unwrap();
            assert!(b.capabilities().confirms_stop, "the suite waits for Stopped");
            b
        }

        /// One GPU, busybox: `sleep 3` then success (long enough for the kubelet to report it
        /// running), or a sleep that outlasts the test.
        async fn workload(&self, _: &KubeBackend, id: u64, run: Run) -> RunSpec {
            let cmd = match run {
                Run::Succeeds => "sleep 3; exit 0",
                Run::UntilStopped => "sleep 3600",
            };
            super::run(id, TENANT, &["sh", "-c", cmd])
        }

        async fn partitioned(&self, _: &KubeBackend, _: u64) -> Option<(PartitionPlan, RunSpec)> {
            None
        }

        fn patience(&self) -> Duration {
            super::WAIT
        }

        fn id_base(&self) -> u64 {
            7000
        }
    }

    tessera_backend::backend_contract_tests!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        harness = KubeletHarness
    );
}
