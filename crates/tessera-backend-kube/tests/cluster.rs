//! The Kubernetes backend against a real kube-apiserver (see `support`): fleet and node
//! watch, workloads as bound pods driven by their phase, tenancy objects and RBAC, MIG through
//! the MIG manager's ConfigMap and labels, restart reconcile, drain. One cluster per binary
//! (about 6 s to start); each test uses its own nodes, tenants and namespaces.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::{
    Cluster, eventually, expect_event, expect_success, exporter_pod, fake_exporter, finish_deletion, gpu_node,
    set_node_status, set_pod_phase,
};
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, ResourceQuota, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tessera_backend::{
    Backend, BackendEvent, Devices, Exit, GangShare, MigInstance, NodeChange, Observation, PartitionPlan, Resource,
    RunSpec, TenancySpec,
};
use tessera_backend_kube::{KubeBackend, KubeConfig};

/// This module's test cluster (its own; other modules of the test binary have theirs).
async fn cluster() -> &'static Cluster {
    crate::support::cluster_in(module_path!()).await
}

const WAIT: Duration = Duration::from_secs(20);

fn config(test: &str) -> KubeConfig {
    KubeConfig {
        // Each test its own MIG ConfigMap namespace is not needed: the map is shared, keyed by node.
        mig_namespace: "default".into(),
        mig_configmap: format!("mig-parted-{test}"),
        mig_timeout: Duration::from_secs(30),
        force_delete_after: Duration::from_secs(2),
        ..KubeConfig::default()
    }
}

fn run(id: u64, tenant: &str, node: &str, devices: Devices) -> RunSpec {
    RunSpec {
        id,
        tenant: tenant.into(),
        project: "main".into(),
        name: format!("job-{id}"),
        kind: "batch".into(),
        node: node.into(),
        model: "H100-80GB-SXM".into(),
        model_memory_mib: 81559,
        devices,
        cpu_milli: 2000,
        memory_mib: 8192,
        env: BTreeMap::new(),
        command: Some(vec!["sleep".into(), "3600".into()]),
        image: Some("registry.example/train:1".into()),
        duration: None,
        running_since_ms: None,
        gang: Vec::new(),
        native: None,
    }
}

fn gpus(n: u8) -> Devices {
    Devices::Count {
        resource: Resource::Gpu,
        count: n,
    }
}

fn tenancy(tenant: &str, group: &str, gpus: u64) -> TenancySpec {
    TenancySpec {
        tenant: tenant.into(),
        project: "main".into(),
        groups: vec![group.into()],
        quota: BTreeMap::from([("nvidia.com/gpu".into(), gpus)]),
    }
}

/// `kubectl auth can-i ARGS` as Tessera's service account: `yes` or `no`, or kubectl's error.
fn tessera_can_i(c: &crate::support::Cluster, args: &[&str]) -> String {
    let mut a = vec!["auth", "can-i"];
    a.extend(args);
    a.extend(["--as", "system:serviceaccount:tessera-system:tessera"]);
    let out = c.kubectl(&a);
    let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if said.is_empty() {
        String::from_utf8_lossy(&out.stderr).trim().to_string()
    } else {
        said
    }
}

async fn can(client: &kube::Client, group: &str, verb: &str, ns: &str) -> bool {
    let sar: SubjectAccessReview = serde_json::from_value(json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": format!("someone-in-{group}"), "groups": [group, "system:authenticated"],
            "resourceAttributes": {"namespace": ns, "verb": verb, "resource": "pods"}},
    }))
    .unwrap();
    let r = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &sar)
        .await
        .unwrap();
    r.status.unwrap().allowed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_is_a_pod_bound_to_the_chosen_node_and_follows_its_phase() {
    let c = cluster().await;
    let client = c.client().await.unwrap();
    gpu_node(&client, "e2e-h100-0", "e2e", "NVIDIA-H100-80GB-HBM3", 8, json!({})).await;
    gpu_node(&client, "e2e-h100-1", "e2e", "NVIDIA-H100-80GB-HBM3", 8, json!({})).await;
    let (b, fleet) = KubeBackend::connect(client.clone(), config("e2e")).await.unwrap();
    let mut rx = b.take_events().unwrap();
    let pool = fleet
        .pools
        .iter()
        .position(|p| p.name == "e2e")
        .expect("the pool label makes a pool");
    let in_pool: Vec<&str> = fleet
        .nodes
        .iter()
        .filter(|n| n.pool.0 as usize == pool)
        .map(|n| n.name.as_str())
        .collect();
    assert_eq!(in_pool, vec!["e2e-h100-0", "e2e-h100-1"]);
    assert_eq!(
        fleet
            .catalogue
            .get(fleet.nodes.iter().find(|n| n.name == "e2e-h100-0").unwrap().model)
            .name,
        "H100-80GB-SXM"
    );

    // Tenancy first (as Tessera does when the project is created), then a 2-GPU workload.
    b.ensure_tenancy(&tenancy("e2e-acme", "acme-ml", 24)).await.unwrap();
    let ns = b.namespace_of("e2e-acme", "main");
    let spec = run(101, "e2e-acme", "e2e-h100-1", gpus(2));
    b.start(&spec).await.unwrap();
    expect_event(&mut rx, "Started", WAIT, |e| {
        matches!(e, BackendEvent::Started { id: 101, .. })
    })
    .await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let pod = pods.get("tessera-101").await.unwrap();
    let ps = pod.spec.clone().unwrap();
    assert_eq!(
        ps.node_name.as_deref(),
        Some("e2e-h100-1"),
        "bound through the Binding subresource"
    );
    assert_eq!(ps.scheduler_name.as_deref(), Some("tessera"));
    let limits = ps.containers[0].resources.clone().unwrap().limits.unwrap();
    assert_eq!(limits["nvidia.com/gpu"].0, "2");
    let labels = pod.metadata.labels.unwrap();
    assert_eq!(
        (
            labels["tessera.io/workload"].as_str(),
            labels["tessera.io/tenant"].as_str()
        ),
        ("101", "e2e-acme")
    );

    // Starting again (a retry) creates nothing new.
    b.start(&spec).await.unwrap();
    assert_eq!(pods.list(&ListParams::default()).await.unwrap().items.len(), 1);

    // The test plays the kubelet: Running, then Tessera cancels.
    set_pod_phase(&client, &ns, "tessera-101", "Running").await;
    expect_event(&mut rx, "Running", WAIT, |e| {
        matches!(e, BackendEvent::Running { id: 101, .. })
    })
    .await;
    b.stop(101, Duration::from_secs(1)).await.unwrap();
    let deleting = pods.get("tessera-101").await.unwrap();
    assert!(
        deleting.metadata.deletion_timestamp.is_some(),
        "cancel deletes the pod with a grace period"
    );
    // No kubelet confirms the deletion: the backend deletes forcibly after grace + 2 s.
    eventually("the cancelled pod is gone", WAIT, || async {
        pods.get_opt("tessera-101").await.unwrap().is_none()
    })
    .await;

    // A second workload that ends on its own.
    b.start(&run(102, "e2e-acme", "e2e-h100-0", gpus(1))).await.unwrap();
    set_pod_phase(&client, &ns, "tessera-102", "Succeeded").await;
    expect_success(&mut rx, 102, WAIT).await;
    // After its stop, the stopped workload's only event is `Stopped`, once its pod is gone.
    while let Ok(ev) = rx.try_recv() {
        assert!(
            ev.workload() != Some(101) || matches!(ev, BackendEvent::Stopped { id: 101, .. }),
            "event after stop: {ev:?}"
        );
    }

    // A gang over both nodes (16 GPUs on two 8-GPU nodes): one pod per node-share, each bound
    // to its node with its GPUs, told its place, and a headless Service for the peers' names.
    let mut gang = run(103, "e2e-acme", "e2e-h100-0", gpus(8));
    gang.gang = vec![GangShare {
        node: "e2e-h100-1".into(),
        devices: gpus(8),
    }];
    b.start(&gang).await.unwrap();
    expect_event(&mut rx, "gang Started", WAIT, |e| {
        matches!(e, BackendEvent::Started { id: 103, .. })
    })
    .await;
    for (i, node) in ["e2e-h100-0", "e2e-h100-1"].into_iter().enumerate() {
        let p = pods.get(&format!("tessera-103-{i}")).await.unwrap();
        let ps = p.spec.unwrap();
        assert_eq!(ps.node_name.as_deref(), Some(node));
        assert_eq!(
            ps.containers[0].resources.clone().unwrap().limits.unwrap()["nvidia.com/gpu"].0,
            "8"
        );
        let l = p.metadata.labels.unwrap();
        assert_eq!(
            (l["tessera.io/gang-index"].as_str(), l["tessera.io/gang-size"].as_str()),
            (i.to_string().as_str(), "2")
        );
        let env: BTreeMap<String, String> = ps.containers[0]
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
            .collect();
        assert_eq!(env["TESSERA_GANG_INDEX"], i.to_string());
        assert_eq!(
            env["TESSERA_GANG_HOSTS"],
            "tessera-103-0.tessera-103,tessera-103-1.tessera-103"
        );
        assert_eq!(ps.subdomain.as_deref(), Some("tessera-103"));
    }
    let svc = Api::<Service>::namespaced(client.clone(), &ns)
        .get("tessera-103")
        .await
        .unwrap();
    assert_eq!(svc.spec.unwrap().cluster_ip.as_deref(), Some("None"), "headless");
    assert_eq!(
        svc.metadata.owner_references.unwrap()[0].name,
        "tessera-103-0",
        "removed with the gang"
    );
    // Running only when all its pods run.
    set_pod_phase(&client, &ns, "tessera-103-0", "Running").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    while let Ok(ev) = rx.try_recv() {
        assert!(ev.workload() != Some(103), "one of two pods running: {ev:?}");
    }
    set_pod_phase(&client, &ns, "tessera-103-1", "Running").await;
    expect_event(&mut rx, "gang Running", WAIT, |e| {
        matches!(e, BackendEvent::Running { id: 103, .. })
    })
    .await;
    // Cancel deletes all of them.
    b.stop(103, Duration::from_secs(1)).await.unwrap();
    eventually("the cancelled gang's pods are gone", WAIT, || async {
        pods.get_opt("tessera-103-0").await.unwrap().is_none() && pods.get_opt("tessera-103-1").await.unwrap().is_none()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_sliced_nodes_are_a_shared_pool_with_one_tenant_per_node() {
    let c = cluster().await;
    let client = c.client().await.unwrap();
    // Two nodes whose device plugin renames time-sliced replicas (2 GPUs × 4 replicas), and one
    // that advertises them as plain `nvidia.com/gpu`.
    let ts = |renamed: bool| {
        json!({
            "labels": {"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"},
            "allocatable": if renamed {
                json!({"nvidia.com/gpu": null, "nvidia.com/gpu.shared": "8"})
            } else {
                json!({"nvidia.com/gpu": "8"})
            },
        })
    };
    gpu_node(&client, "ts-l40s-0", "ts", "NVIDIA-L40S-SHARED", 2, ts(true)).await;
    gpu_node(&client, "ts-l40s-1", "ts", "NVIDIA-L40S-SHARED", 2, ts(true)).await;
    gpu_node(&client, "tsp-l40s-0", "tsp", "NVIDIA-L40S", 2, ts(false)).await;
    let (b, fleet) = KubeBackend::connect(client.clone(), config("ts")).await.unwrap();
    let pool = fleet.pool_by_name("ts").unwrap();
    assert_eq!(fleet.pool(pool).sharing, tessera_model::Sharing::Shared);
    assert!(!fleet.pool(pool).allow_tenant_mixing);
    let physical: Vec<u8> = fleet.nodes.iter().filter(|n| n.pool == pool).map(|n| n.gpus).collect();
    assert_eq!(physical, vec![2, 2], "allocatable replicas / replicas per GPU");

    // The engine, told the backend's per-node device counts, keeps one tenant per shared node.
    let caps = b.capabilities();
    assert_eq!(caps.devices, tessera_backend::DeviceAssignment::PerNodeCount);
    let fleet = std::sync::Arc::new(fleet);
    let mut e = tessera_sched::Engine::new(fleet.clone(), Box::new(tessera_sched::policy::BestFit), 1);
    e.set_device_binding(tessera_sched::engine::DeviceBinding::PerNodeCount);
    let frac = |t| {
        tessera_model::Request::fraction(300)
            .with_tenant(tessera_model::TenantId(t))
            .with_pool(pool)
    };
    let mut node_of = |id, t| fleet.node(e.place(id, &frac(t)).unwrap().node).name.clone();
    let (a1, b1, a2) = (node_of(1, 1), node_of(2, 2), node_of(3, 1));
    assert_ne!(a1, b1, "two tenants' fractions land on different shared nodes");
    assert_eq!(a2, a1, "the first tenant's next fraction packs onto its node");

    // A whole GPU cannot be promised on a time-sliced node: the engine never places one in
    // the pool (refused when asked for, naming why), and the backend refuses such a start.
    assert!(!fleet.pool(pool).whole_gpus);
    let whole = tessera_model::Request::whole(1).with_pool(pool);
    let why = e.scope(&whole).unwrap_err().to_string();
    assert!(why.contains("gives no whole GPU"), "{why}");
    assert!(
        e.scope(&tessera_model::Request::whole(1))
            .unwrap()
            .iter()
            .all(|p| fleet.pool(*p).sharing != tessera_model::Sharing::Shared),
        "whole GPUs go to no time-sliced pool"
    );
    b.ensure_tenancy(&tenancy("ts-acme", "ml", 8)).await.unwrap();
    let refused = b.start(&run(700, "ts-acme", a1.as_str(), gpus(1))).await.unwrap_err();
    assert!(refused.to_string().contains("time-slices its GPUs"), "{refused}");
    // The namespace quota counts the pool's replicas for fractions, not whole GPUs.
    let mut t = tenancy("ts-acme", "ml", 0);
    t.quota = BTreeMap::from([(format!("{}{}", tessera_backend::SHARED_POOL_QUOTA, "tsp"), 1)]);
    b.ensure_tenancy(&t).await.unwrap();
    let q = Api::<ResourceQuota>::namespaced(client.clone(), &b.namespace_of("ts-acme", "main"))
        .get("tessera-quota")
        .await
        .unwrap();
    let hard = q.spec.unwrap().hard.unwrap();
    assert!(
        hard.keys().all(|k| !k.starts_with("requests.shared:")),
        "the pseudo-key never reaches the API server: {hard:?}"
    );
    assert_eq!(
        hard["requests.nvidia.com/gpu"].0, "8",
        "tsp's node advertises 2 GPUs × 4 replicas as nvidia.com/gpu"
    );
    b.ensure_tenancy(&tenancy("ts-acme", "ml", 8)).await.unwrap();

    // Each fraction's pod asks for one replica of the resource its node advertises.
    let shared = |milli| Devices::Count {
        resource: Resource::SharedGpu { milli },
        count: 1,
    };
    for (id, tenant, node, resource) in [
        (701, "ts-acme", a1.as_str(), "nvidia.com/gpu.shared"),
        (702, "ts-globex", b1.as_str(), "nvidia.com/gpu.shared"),
        (703, "ts-acme", "tsp-l40s-0", "nvidia.com/gpu"),
    ] {
        b.ensure_tenancy(&tenancy(tenant, "ml", 8)).await.unwrap();
        b.start(&run(id, tenant, node, shared(300))).await.unwrap();
        let pod = Api::<Pod>::namespaced(client.clone(), &b.namespace_of(tenant, "main"))
            .get(&format!("tessera-{id}"))
            .await
            .unwrap();
        let ps = pod.spec.unwrap();
        assert_eq!(ps.node_name.as_deref(), Some(node));
        let limits = ps.containers[0].resources.clone().unwrap().limits.unwrap();
        assert_eq!(limits.len(), 1, "{limits:?}");
        assert_eq!(limits[resource].0, "1", "{limits:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenancy_objects_are_applied_enforced_repaired_and_removed() {
    let c = cluster().await;
    let client = c.client().await.unwrap();
    gpu_node(&client, "ten-h100-0", "ten", "NVIDIA-H100-80GB-HBM3", 8, json!({})).await;
    let (b, _) = KubeBackend::connect(client.clone(), config("ten")).await.unwrap();
    let acme = TenancySpec {
        quota: BTreeMap::from([("nvidia.com/gpu".into(), 2), ("nvidia.com/mig-3g.40gb".into(), 4)]),
        ..tenancy("ten-acme", "acme-ml", 2)
    };
    b.ensure_tenancy(&acme).await.unwrap();
    b.ensure_tenancy(&tenancy("ten-globex", "globex-ml", 8)).await.unwrap();
    let ns = b.namespace_of("ten-acme", "main");
    let other = b.namespace_of("ten-globex", "main");

    let n = Api::<Namespace>::all(client.clone()).get(&ns).await.unwrap();
    assert_eq!(n.metadata.labels.unwrap()["tessera.io/tenant"], "ten-acme");
    let quotas = Api::<ResourceQuota>::namespaced(client.clone(), &ns);
    let q = quotas.get("tessera-quota").await.unwrap();
    let hard = q.spec.unwrap().hard.unwrap();
    assert_eq!(hard["requests.nvidia.com/gpu"].0, "2");
    assert_eq!(hard["requests.nvidia.com/mig-3g.40gb"].0, "4");
    let rb = Api::<RoleBinding>::namespaced(client.clone(), &ns)
        .get("tessera-tenant")
        .await
        .unwrap();
    assert_eq!(rb.subjects.unwrap()[0].name, "acme-ml");
    let np = Api::<NetworkPolicy>::namespaced(client.clone(), &ns)
        .get("tessera-tenant-isolation")
        .await
        .unwrap();
    let from = np.spec.unwrap().ingress.unwrap()[0].from.clone().unwrap();
    assert_eq!(
        from[0]
            .namespace_selector
            .as_ref()
            .unwrap()
            .match_labels
            .as_ref()
            .unwrap()["tessera.io/tenant"],
        "ten-acme"
    );

    // RBAC, decided by the API server itself.
    assert!(
        can(&client, "acme-ml", "list", &ns).await,
        "a tenant group lists pods in its namespace"
    );
    assert!(can(&client, "acme-ml", "create", &ns).await);
    assert!(
        !can(&client, "acme-ml", "list", &other).await,
        "and not in another tenant's"
    );
    assert!(!can(&client, "globex-ml", "list", &ns).await);

    // The quota is enforced by the API server too (defence in depth): 3 GPUs > 2.
    let Err(err) = b.start(&run(201, "ten-acme", "ten-h100-0", gpus(3))).await else {
        let q = quotas.get("tessera-quota").await.unwrap();
        let p = Api::<Pod>::namespaced(client.clone(), &ns)
            .get("tessera-201")
            .await
            .unwrap();
        panic!(
            "accepted over quota: quota {:?} pod {:?}",
            q.status,
            p.spec.unwrap().containers[0].resources
        );
    };
    assert!(err.to_string().contains("exceeded quota"), "{err}");
    assert!(
        Api::<Pod>::namespaced(client.clone(), &ns)
            .get_opt("tessera-201")
            .await
            .unwrap()
            .is_none(),
        "a refused pod leaves nothing behind"
    );

    // What Tessera does not own it never takes over: a pod under a Tessera pod's name that is
    // not Tessera's (not bound, not deleted), and a namespace labelled for another tenant.
    let foreign: Pod = serde_json::from_value(json!({
        "metadata": {"name": "tessera-202", "labels": {"app": "someone-elses"}},
        "spec": {"schedulerName": "tessera", "containers": [{"name": "c", "image": "x"}]},
    }))
    .unwrap();
    let ns_pods = Api::<Pod>::namespaced(client.clone(), &ns);
    ns_pods.create(&PostParams::default(), &foreign).await.unwrap();
    let e = b.start(&run(202, "ten-acme", "ten-h100-0", gpus(1))).await.unwrap_err();
    assert!(e.to_string().contains("refusing to take it over"), "{e}");
    let still = ns_pods.get("tessera-202").await.unwrap();
    assert!(
        still.spec.unwrap().node_name.is_none() && still.metadata.deletion_timestamp.is_none(),
        "the stranger's pod is left alone"
    );
    let taken = b.namespace_of("ten-mallory", "main");
    let labelled: Namespace = serde_json::from_value(json!({"metadata": {"name": taken,
        "labels": {"tessera.io/tenant": "ten-other", "tessera.io/project": "main"}}}))
    .unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &labelled)
        .await
        .unwrap();
    let e = b.ensure_tenancy(&tenancy("ten-mallory", "m", 1)).await.unwrap_err();
    assert!(e.to_string().contains("refusing to take it over"), "{e}");
    let e = b
        .start(&run(203, "ten-mallory", "ten-h100-0", gpus(1)))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("refusing to take it over"), "{e}");
    let labels = Api::<Namespace>::all(client.clone())
        .get(&taken)
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap();
    assert_eq!(labels["tessera.io/tenant"], "ten-other", "not relabelled");

    // Drift (someone edits the quota) is repaired by the next reconcile of the tenancy.
    quotas
        .patch(
            "tessera-quota",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hard": {"requests.nvidia.com/gpu": "64"}}})),
        )
        .await
        .unwrap();
    b.ensure_tenancy(&acme).await.unwrap();
    let hard = quotas.get("tessera-quota").await.unwrap().spec.unwrap().hard.unwrap();
    assert_eq!(hard["requests.nvidia.com/gpu"].0, "2", "drift repaired");

    // Removing the tenant removes its namespaces (the controller-manager finishes the deletion).
    b.remove_tenancy("ten-acme", None).await.unwrap();
    let nss = Api::<Namespace>::all(client.clone());
    eventually("the tenant's namespace is deleted", Duration::from_secs(60), || async {
        nss.get_opt(&ns).await.unwrap().is_none()
    })
    .await;
    assert!(
        nss.get_opt(&other).await.unwrap().is_some(),
        "other tenants keep theirs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mig_layouts_go_through_the_mig_manager_before_pods_are_bound() {
    let c = cluster().await;
    let client = c.client().await.unwrap();
    // MIG on, as the MIG manager shows it (`mig.capable` alone says only that it could be).
    let labels = json!({"labels": {"nvidia.com/mig.capable": "true", "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig.config": "all-balanced", "nvidia.com/mig.config.state": "success"}});
    gpu_node(&client, "mig-a100-0", "mig", "NVIDIA-A100-SXM4-80GB", 2, labels).await;
    let (b, fleet) = KubeBackend::connect(client.clone(), config("mig")).await.unwrap();
    let mut rx = b.take_events().unwrap();
    let pool = fleet.pools.iter().find(|p| p.name == "mig").unwrap();
    assert_eq!(
        pool.sharing,
        tessera_model::Sharing::Mig,
        "MIG-capable nodes of a MIG model make a MIG pool"
    );

    let layout = vec![
        MigInstance::new("3g.40gb", 9, 0, 4),
        MigInstance::new("3g.40gb", 9, 4, 4),
    ];
    let plan = PartitionPlan::Layout {
        node: "mig-a100-0".into(),
        gpu: 0,
        instances: layout.clone(),
    };
    let b = std::sync::Arc::new(b);
    let b2 = b.clone();
    let plan2 = plan.clone();
    let partition = tokio::spawn(async move { b2.partition(&plan2).await });

    // The test plays the MIG manager: it sees the label and the config, applies, reports success.
    let nodes = Api::<Node>::all(client.clone());
    let t0 = std::time::Instant::now();
    let config_name = loop {
        let l = nodes.get("mig-a100-0").await.unwrap().metadata.labels.unwrap();
        if let Some(v) = l
            .get("nvidia.com/mig.config")
            .filter(|v| v.starts_with("tessera-mig-a100-0-"))
        {
            break v.clone();
        }
        assert!(t0.elapsed() < WAIT, "the node's mig.config label is not set");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let cm = Api::<ConfigMap>::namespaced(client.clone(), "default")
        .get("mig-parted-mig")
        .await
        .unwrap();
    let text = &cm.data.unwrap()["config.yaml"];
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).unwrap();
    let entry = &doc["mig-configs"][config_name.as_str()][0];
    assert_eq!(entry["devices"][0], serde_yaml_ng::Value::from(0));
    assert_eq!(entry["mig-devices"]["3g.40gb"], serde_yaml_ng::Value::from(2));
    assert!(!partition.is_finished(), "Tessera waits for the MIG manager");
    // The MIG manager: success, and the device plugin advertises the instances.
    nodes
        .patch(
            "mig-a100-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"nvidia.com/mig.config.state": "success"}}})),
        )
        .await
        .unwrap();
    set_node_status(
        &client,
        "mig-a100-0",
        json!({"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "1", "nvidia.com/mig-3g.40gb": "2"}),
        true,
    )
    .await;
    let report = partition.await.unwrap().unwrap();
    assert!(report.created, "{report:?}");
    expect_event(&mut rx, "PartitionChanged", WAIT, |e| {
        matches!(e, BackendEvent::PartitionChanged { gpu: 0, .. })
    })
    .await;
    // Applying the same layout again changes nothing.
    assert!(!b.partition(&plan).await.unwrap().created);

    // The MIG pod is bound once the config is applied.
    b.ensure_tenancy(&tenancy("mig-acme", "acme-ml", 8)).await.unwrap();
    let d = Devices::Count {
        resource: Resource::Mig {
            profile: "3g.40gb".into(),
        },
        count: 1,
    };
    b.start(&run(301, "mig-acme", "mig-a100-0", d)).await.unwrap();
    let pod = Api::<Pod>::namespaced(client.clone(), &b.namespace_of("mig-acme", "main"))
        .get("tessera-301")
        .await
        .unwrap();
    assert_eq!(pod.spec.as_ref().unwrap().node_name.as_deref(), Some("mig-a100-0"));
    assert_eq!(
        pod.spec.unwrap().containers[0]
            .resources
            .clone()
            .unwrap()
            .limits
            .unwrap()["nvidia.com/mig-3g.40gb"]
            .0,
        "1"
    );

    // A layout dropping the instance in use is refused (whole-GPU granularity).
    let shrink = PartitionPlan::Layout {
        node: "mig-a100-0".into(),
        gpu: 0,
        instances: vec![],
    };
    let e = b.partition(&shrink).await.unwrap_err();
    assert!(e.to_string().contains("in use"), "{e}");

    // GPU 1 gets a layout the MIG manager fails to apply: a partition failure naming the node.
    let plan = PartitionPlan::Layout {
        node: "mig-a100-0".into(),
        gpu: 1,
        instances: vec![MigInstance::new("7g.80gb", 0, 0, 8)],
    };
    let b2 = b.clone();
    let partition = tokio::spawn(async move { b2.partition(&plan).await });
    let first = config_name.clone();
    eventually("a new config is selected", WAIT, || {
        let nodes = nodes.clone();
        let first = first.clone();
        async move {
            let l = nodes.get("mig-a100-0").await.unwrap().metadata.labels.unwrap();
            l.get("nvidia.com/mig.config").is_some_and(|v| *v != first)
                && !l.contains_key("nvidia.com/mig.config.state")
        }
    })
    .await;
    nodes
        .patch(
            "mig-a100-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"nvidia.com/mig.config.state": "failed"}}})),
        )
        .await
        .unwrap();
    let e = partition.await.unwrap().unwrap_err();
    assert!(
        e.to_string().contains("mig-a100-0") && e.to_string().contains("failed"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_backend_adopts_its_pods_without_duplicates_and_reports_deleted_ones_lost() {
    let c = cluster().await;
    let client = c.client().await.unwrap();
    gpu_node(&client, "rs-h100-0", "rs", "NVIDIA-H100-80GB-HBM3", 8, json!({})).await;
    gpu_node(&client, "rs-h100-1", "rs", "NVIDIA-H100-80GB-HBM3", 8, json!({})).await;
    let (b, _) = KubeBackend::connect(client.clone(), config("rs")).await.unwrap();
    b.ensure_tenancy(&tenancy("rs-acme", "acme-ml", 8)).await.unwrap();
    let ns = b.namespace_of("rs-acme", "main");
    let specs: Vec<RunSpec> = (401..=403).map(|id| run(id, "rs-acme", "rs-h100-0", gpus(1))).collect();
    for s in &specs {
        b.start(s).await.unwrap();
    }
    // And a gang over both nodes, half running when Tessera goes away.
    let mut gang = run(405, "rs-acme", "rs-h100-0", gpus(1));
    gang.gang = vec![GangShare {
        node: "rs-h100-1".into(),
        devices: gpus(1),
    }];
    b.start(&gang).await.unwrap();
    set_pod_phase(&client, &ns, "tessera-405-0", "Running").await;
    set_pod_phase(&client, &ns, "tessera-401", "Running").await;
    // Tessera goes away mid-flight.
    drop(b);

    let (b, _) = KubeBackend::connect(client.clone(), config("rs")).await.unwrap();
    let mut rx = b.take_events().unwrap();
    // Tessera expects 401..=402 (403 was cancelled while it was down, say) and 404 (never started).
    let mut expected = specs[..2].to_vec();
    expected.push(run(404, "rs-acme", "rs-h100-0", gpus(1)));
    expected.push(gang.clone());
    let report = b.reconcile(&expected).await.unwrap();
    assert_eq!(
        report.observation(405),
        Some(&Observation::Starting),
        "a gang with one pod of two running is starting"
    );
    assert!(
        matches!(report.observation(401), Some(Observation::Running { .. })),
        "{report:?}"
    );
    assert_eq!(report.observation(402), Some(&Observation::Starting));
    assert_eq!(report.observation(404), Some(&Observation::Unknown));
    // (Other tests' pods share the cluster: only this test's node counts.)
    let ours = |r: &tessera_backend::ReconcileReport| -> Vec<tessera_backend::Orphan> {
        r.orphans.iter().filter(|o| o.node == "rs-h100-0").cloned().collect()
    };
    let orphans = ours(&report);
    assert_eq!(orphans.len(), 1, "{report:?}");
    assert_eq!(orphans[0].id, Some(403));
    // Reconcile is level-triggered: asking again gives the same answer.
    let again = b.reconcile(&expected).await.unwrap();
    assert_eq!((&again.workloads, ours(&again)), (&report.workloads, orphans));
    // Starting an adopted workload (or gang) again does not duplicate its pods.
    b.start(&specs[1]).await.unwrap();
    b.start(&gang).await.unwrap();
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    assert_eq!(pods.list(&ListParams::default()).await.unwrap().items.len(), 5);

    // The adopted gang runs once its other pod does; when one of its pods fails, the workload
    // fails and its other pod is deleted.
    set_pod_phase(&client, &ns, "tessera-405-1", "Running").await;
    expect_event(&mut rx, "gang Running", WAIT, |e| {
        matches!(e, BackendEvent::Running { id: 405, .. })
    })
    .await;
    set_pod_phase(&client, &ns, "tessera-405-1", "Failed").await;
    let ev = expect_event(&mut rx, "gang Exited", WAIT, |e| {
        matches!(e, BackendEvent::Exited { id: 405, .. })
    })
    .await;
    assert!(
        matches!(&ev, BackendEvent::Exited { exit: Exit::Failed { detail, .. }, .. } if detail.contains("tessera-405-1")),
        "{ev:?}"
    );
    eventually("the failed gang's other pod is deleted", WAIT, || async {
        pods.get_opt("tessera-405-0")
            .await
            .unwrap()
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
    })
    .await;
    finish_deletion(&client, &ns, "tessera-405-0").await;

    // Someone deletes a pod behind Tessera's back: the workload is lost.
    pods.delete("tessera-402", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let ev = expect_event(&mut rx, "Lost", WAIT, |e| {
        matches!(e, BackendEvent::Lost { id: 402, .. })
    })
    .await;
    assert!(
        matches!(&ev, BackendEvent::Lost { detail, .. } if detail.contains("deleted outside Tessera")),
        "{ev:?}"
    );
    // An adopted running workload still follows its pod.
    set_pod_phase(&client, &ns, "tessera-401", "Succeeded").await;
    expect_event(&mut rx, "Exited", WAIT, |e| {
        matches!(e, BackendEvent::Exited { id: 401, .. })
    })
    .await;
    b.stop(403, Duration::ZERO).await.unwrap();
    finish_deletion(&client, &ns, "tessera-403").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_changes_reach_the_engine_and_drain_uses_cordon_and_eviction() {
    let c = cluster().await;
    let client = c.client().await.unwrap();
    gpu_node(&client, "dr-h100-0", "dr", "NVIDIA-H100-80GB-HBM3", 8, json!({})).await;
    let (b, _) = KubeBackend::connect(client.clone(), config("dr")).await.unwrap();
    let mut rx = b.take_events().unwrap();
    let is = |n: &'static str, ch: NodeChange| move |e: &BackendEvent| matches!(e, BackendEvent::NodeChanged { node, change } if node == n && *change == ch);

    gpu_node(&client, "dr-h100-1", "dr", "NVIDIA-H100-80GB-HBM3", 8, json!({})).await;
    expect_event(&mut rx, "node added", WAIT, is("dr-h100-1", NodeChange::Added)).await;
    // The fleet, rebuilt as at connect, with the node that joined (no restart).
    let has = |n: &'static str, want: bool| move |e: &BackendEvent| matches!(e, BackendEvent::FleetChanged { fleet } if fleet.node_by_name(n).is_some() == want);
    let ev = expect_event(&mut rx, "a fleet with the new node", WAIT, has("dr-h100-1", true)).await;
    let BackendEvent::FleetChanged { fleet } = ev else {
        unreachable!()
    };
    let n = fleet.node(fleet.node_by_name("dr-h100-1").unwrap());
    assert_eq!((fleet.pool(n.pool).name.as_str(), n.gpus), ("dr", 8));
    set_node_status(
        &client,
        "dr-h100-1",
        json!({"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"}),
        false,
    )
    .await;
    expect_event(
        &mut rx,
        "node not ready",
        WAIT,
        is("dr-h100-1", NodeChange::Ready(false)),
    )
    .await;
    set_node_status(
        &client,
        "dr-h100-1",
        json!({"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "7"}),
        false,
    )
    .await;
    expect_event(&mut rx, "capacity changed", WAIT, is("dr-h100-1", NodeChange::Capacity)).await;
    Api::<Node>::all(client.clone())
        .delete("dr-h100-1", &DeleteParams::default())
        .await
        .unwrap();
    expect_event(&mut rx, "node removed", WAIT, is("dr-h100-1", NodeChange::Removed)).await;
    expect_event(&mut rx, "a fleet without the node", WAIT, has("dr-h100-1", false)).await;

    // Drain: cordon, then evict the workload through the Eviction API.
    b.ensure_tenancy(&tenancy("dr-acme", "acme-ml", 8)).await.unwrap();
    let ns = b.namespace_of("dr-acme", "main");
    b.start(&run(501, "dr-acme", "dr-h100-0", gpus(1))).await.unwrap();
    b.cordon("dr-h100-0", true).await.unwrap();
    expect_event(
        &mut rx,
        "node cordoned",
        WAIT,
        is("dr-h100-0", NodeChange::Cordoned(true)),
    )
    .await;
    let node = Api::<Node>::all(client.clone()).get("dr-h100-0").await.unwrap();
    assert_eq!(node.spec.unwrap().unschedulable, Some(true));
    b.evict(501, Duration::from_secs(30)).await.unwrap();
    let pod = Api::<Pod>::namespaced(client.clone(), &ns)
        .get("tessera-501")
        .await
        .unwrap();
    assert!(
        pod.metadata.deletion_timestamp.is_some(),
        "the eviction deletes the pod gracefully"
    );
    assert_eq!(pod.metadata.deletion_grace_period_seconds, Some(30));
    finish_deletion(&client, &ns, "tessera-501").await;
    b.cordon("dr-h100-0", false).await.unwrap();
    expect_event(
        &mut rx,
        "node uncordoned",
        WAIT,
        is("dr-h100-0", NodeChange::Cordoned(false)),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deploy_manifests_apply_and_grant_exactly_what_the_backend_uses() {
    let c = cluster().await;
    let admin = c.client().await.unwrap();
    let out = c.kubectl(&["create", "namespace", "gpu-operator"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/kubernetes");
    let out = c.kubectl(&["apply", "-f", dir]);
    assert!(
        out.status.success(),
        "kubectl apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let applied = String::from_utf8_lossy(&out.stdout);
    for what in [
        "serviceaccount/tessera",
        "clusterrole.rbac.authorization.k8s.io/tessera",
        "deployment.apps/tessera",
        "service/tessera",
    ] {
        assert!(applied.contains(what), "{what} not in {applied}");
    }
    gpu_node(
        &admin,
        "sa-a100-0",
        "sa",
        "NVIDIA-A100-SXM4-80GB",
        1,
        json!({"labels": {"nvidia.com/mig.capable": "true"}}),
    )
    .await;

    // The backend as the service account (impersonated): every call it makes is allowed.
    let kc = kube::config::Kubeconfig::read_from(&c.kubeconfig).unwrap();
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    cfg.auth_info.impersonate = Some("system:serviceaccount:tessera-system:tessera".into());
    cfg.auth_info.impersonate_groups = Some(vec![
        "system:serviceaccounts".into(),
        "system:serviceaccounts:tessera-system".into(),
        "system:authenticated".into(),
    ]);
    let sa = kube::Client::try_from(cfg).unwrap();
    let kcfg = KubeConfig {
        mig_namespace: "gpu-operator".into(),
        mig_configmap: "default-mig-parted-config".into(),
        identity: Some("tessera-system/tessera".into()),
        ..config("sa")
    };
    let (b, _) = KubeBackend::connect(sa.clone(), kcfg).await.unwrap();
    b.ensure_tenancy(&tenancy("sa-acme", "acme-ml", 4)).await.unwrap();
    let ns = b.namespace_of("sa-acme", "main");
    b.start(&run(601, "sa-acme", "sa-a100-0", gpus(1))).await.unwrap();
    b.start(&run(602, "sa-acme", "sa-a100-0", gpus(1))).await.unwrap();
    let plan = PartitionPlan::Layout {
        node: "sa-a100-0".into(),
        gpu: 0,
        instances: vec![MigInstance::new("7g.80gb", 0, 0, 8)],
    };
    let b = std::sync::Arc::new(b);
    let b2 = b.clone();
    let partition = tokio::spawn(async move { b2.partition(&plan).await });
    let nodes = Api::<Node>::all(admin.clone());
    eventually("the MIG config is selected", WAIT, || {
        let nodes = nodes.clone();
        async move {
            nodes
                .get("sa-a100-0")
                .await
                .unwrap()
                .metadata
                .labels
                .unwrap()
                .contains_key("nvidia.com/mig.config")
        }
    })
    .await;
    nodes
        .patch(
            "sa-a100-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"nvidia.com/mig.config.state": "success"}}})),
        )
        .await
        .unwrap();
    partition.await.unwrap().unwrap();
    b.cordon("sa-a100-0", true).await.unwrap();
    b.evict(601, Duration::from_secs(5)).await.unwrap();
    b.stop(602, Duration::from_secs(5)).await.unwrap();
    b.reconcile(&[]).await.unwrap();
    finish_deletion(&admin, &ns, "tessera-601").await;
    finish_deletion(&admin, &ns, "tessera-602").await;
    // Inside the tenant namespace it manages, through its own binding there, it may.
    for args in [
        &["create", "pods", "-n", ns.as_str()][..],
        &["delete", &format!("namespaces/{ns}"), "-n", ns.as_str()],
    ] {
        let mut a = vec!["auth", "can-i"];
        a.extend(args);
        a.extend(["--as", "system:serviceaccount:tessera-system:tessera"]);
        let out = c.kubectl(&a);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "yes",
            "kubectl {}",
            a.join(" ")
        );
    }
    b.remove_tenancy("sa-acme", None).await.unwrap();

    // Outside the namespaces it manages it creates no pod and deletes no namespace.
    for args in [
        &["create", "pods", "-n", "kube-system"][..],
        &["create", "pods", "-n", "default"],
        &["delete", "namespaces/kube-system", "-n", "kube-system"],
        &["delete", "namespaces/default", "-n", "default"],
    ] {
        assert_eq!(tessera_can_i(c, args), "no", "can-i {}", args.join(" "));
    }

    // And nothing more: no secrets, no pods/exec, no cluster-wide RBAC changes.
    for (verb, resource, sub) in [
        ("list", "secrets", ""),
        ("create", "pods", "exec"),
        ("patch", "clusterroles", ""),
        ("update", "pods", ""),
    ] {
        let sar: SubjectAccessReview = serde_json::from_value(json!({
            "spec": {"user": "system:serviceaccount:tessera-system:tessera", "groups": ["system:serviceaccounts"],
                "resourceAttributes": {"namespace": ns, "verb": verb, "resource": resource, "subresource": sub}},
        }))
        .unwrap();
        let r = Api::<SubjectAccessReview>::all(admin.clone())
            .create(&PostParams::default(), &sar)
            .await
            .unwrap();
        assert!(
            !r.status.unwrap().allowed,
            "the service account may {verb} {resource}/{sub}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_telemetry_comes_from_each_nodes_dcgm_exporter_with_usage_by_the_pods_workload() {
    let c = cluster().await;
    let client = c.client().await.unwrap();
    gpu_node(&client, "tel-h100-0", "tel", "NVIDIA-H100-80GB-HBM3", 2, json!({})).await;
    gpu_node(&client, "tel-h100-1", "tel", "NVIDIA-H100-80GB-HBM3", 2, json!({})).await;
    gpu_node(&client, "tel-h100-2", "tel", "NVIDIA-H100-80GB-HBM3", 2, json!({})).await;
    let exporters = "tel-gpu-operator";
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": exporters}})).unwrap(),
        )
        .await
        .unwrap();
    let (b, _) = KubeBackend::connect(
        client.clone(),
        KubeConfig {
            dcgm_namespace: exporters.into(),
            telemetry_every: Some(Duration::from_millis(300)),
            ..config("tel")
        },
    )
    .await
    .unwrap();
    let mut rx = b.take_events().unwrap();
    b.ensure_tenancy(&tenancy("tel-acme", "acme-ml", 4)).await.unwrap();
    let ns = b.namespace_of("tel-acme", "main");
    // Tessera's accounting put the workload on GPU 0; the device plugin gave its pod GPU 1.
    b.start(&run(701, "tel-acme", "tel-h100-0", gpus(1))).await.unwrap();
    set_pod_phase(&client, &ns, "tessera-701", "Running").await;

    // Node 0's exporter: GPU 1 held by the workload's pod, GPU 0 idle with an XID, and a GPU
    // held by a pod that is not Tessera's.
    let labels = |gpu: u8, pod: Option<(&str, &str)>| {
        let pod = pod.map_or(String::new(), |(n, p)| {
            format!(",container=\"c\",namespace=\"{n}\",pod=\"{p}\"")
        });
        format!(
            "gpu=\"{gpu}\",UUID=\"GPU-{gpu}\",device=\"nvidia{gpu}\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"tel-h100-0\"{pod}"
        )
    };
    let node0 = [
        format!("DCGM_FI_DEV_GPU_UTIL{{{}}} 0", labels(0, None)),
        format!("DCGM_FI_DEV_XID_ERRORS{{{},err_code=\"48\"}} 48", labels(0, None)),
        format!("DCGM_FI_DEV_GPU_UTIL{{{}}} 55", labels(1, Some((&ns, "tessera-701")))),
        format!("DCGM_FI_DEV_FB_USED{{{}}} 40000", labels(1, Some((&ns, "tessera-701")))),
        format!(
            "DCGM_FI_DEV_POWER_USAGE{{{}}} 400.5",
            labels(1, Some((&ns, "tessera-701")))
        ),
    ]
    .join("\n");
    let other = format!(
        "DCGM_FI_DEV_GPU_UTIL{{{}}} 99\n",
        labels(0, Some(("default", "someone-elses")))
    );
    let s0 = std::sync::Arc::new(std::sync::Mutex::new((200, node0 + "\n")));
    let s1 = std::sync::Arc::new(std::sync::Mutex::new((500, "broken".to_string())));
    let s2 = std::sync::Arc::new(std::sync::Mutex::new((200, other)));
    let p0 = fake_exporter(s0.clone());
    let p1 = fake_exporter(s1.clone());
    let p2 = fake_exporter(s2.clone());
    exporter_pod(
        &client,
        exporters,
        "dcgm-exporter-0",
        "tel-h100-0",
        p0,
        Some("127.0.0.1"),
    )
    .await;
    // Node 1's exporter answers 500: left out of the pass, the others still read.
    exporter_pod(
        &client,
        exporters,
        "dcgm-exporter-1",
        "tel-h100-1",
        p1,
        Some("127.0.0.1"),
    )
    .await;
    exporter_pod(
        &client,
        exporters,
        "dcgm-exporter-2",
        "tel-h100-2",
        p2,
        Some("127.0.0.1"),
    )
    .await;
    // Not running yet: not read.
    exporter_pod(&client, exporters, "dcgm-exporter-3", "tel-h100-0", 1, None).await;

    let telemetry = |e: &BackendEvent| match e {
        BackendEvent::Telemetry { gpus, .. } => Some(gpus.clone()),
        _ => None,
    };
    // The exporter shows which GPU the pod has: reported, before the telemetry that says so.
    let ev = expect_event(&mut rx, "the pod's devices", WAIT, |e| {
        matches!(e, BackendEvent::Bound { id: 701, .. })
    })
    .await;
    assert_eq!(
        ev,
        BackendEvent::Bound {
            id: 701,
            bound: tessera_backend::Bound {
                gpus: vec![1],
                mig: None
            }
        }
    );
    let ev = expect_event(&mut rx, "telemetry of nodes 0 and 2", WAIT, |e| {
        telemetry(e).is_some_and(|g| g.len() == 3)
    })
    .await;
    let mut gpus = telemetry(&ev).unwrap();
    gpus.sort_by(|a, b| (&a.node, a.gpu).cmp(&(&b.node, b.gpu)));
    // (node, GPU, utilisation %, last XID, (workload, engine activity) of the pods on it)
    type Seen<'a> = (&'a str, u8, f64, u32, Vec<(u64, f64)>);
    let got: Vec<Seen> = gpus
        .iter()
        .map(|g| {
            let held = g.instances.iter().map(|i| (i.workload, i.gr_engine_active)).collect();
            (g.node.as_str(), g.gpu, g.util_pct, g.xid, held)
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("tel-h100-0", 0, 0.0, 48, vec![]),
            ("tel-h100-0", 1, 55.0, 0, vec![(701, 0.55)]),
            ("tel-h100-2", 0, 99.0, 0, vec![]),
        ]
    );
    assert_eq!(
        (gpus[1].fb_used_mib, gpus[1].power_w, gpus[1].uuid.as_str()),
        (40000, 400.5, "GPU-1")
    );

    // Node 1's exporter recovers: the next passes read it too.
    *s1.lock().unwrap() = (200, format!("DCGM_FI_DEV_GPU_UTIL{{{}}} 12\n", labels(1, None)));
    expect_event(&mut rx, "telemetry of all three nodes", WAIT, |e| {
        assert!(
            !matches!(e, BackendEvent::Bound { .. }),
            "devices are reported once: {e:?}"
        );
        telemetry(e).is_some_and(|g| g.iter().any(|g| g.node == "tel-h100-1" && g.util_pct == 12.0))
    })
    .await;
    b.stop(701, Duration::from_secs(1)).await.unwrap();
    finish_deletion(&client, &ns, "tessera-701").await;
    b.remove_tenancy("tel-acme", None).await.unwrap();
}

/// A tenant that copies another tenant's workload label onto a pod of its own (in its own
/// namespace, as `kubectl run --labels` with the `edit` role does), lets it fail and deletes
/// it: the real workload keeps running, and the impostor is reported. A stop holds the
/// workload's capacity until its pod is gone (`Stopped`), and a start right after a stop gets
/// pods of a new attempt instead of colliding with the terminating ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strangers_pod_wearing_a_workload_label_is_ignored_and_stops_wait_for_the_pod() {
    let c = cluster().await;
    let client = c.client().await.unwrap();
    gpu_node(&client, "sp-h100-0", "sp", "NVIDIA-H100-80GB-HBM3", 8, json!({})).await;
    let (b, _) = KubeBackend::connect(client.clone(), config("sp")).await.unwrap();
    let mut rx = b.take_events().unwrap();
    b.ensure_tenancy(&tenancy("sp-alice", "alice", 8)).await.unwrap();
    b.ensure_tenancy(&tenancy("sp-mallory", "mallory", 8)).await.unwrap();
    let ns_a = b.namespace_of("sp-alice", "main");
    let ns_m = b.namespace_of("sp-mallory", "main");
    b.start(&run(201, "sp-alice", "sp-h100-0", gpus(1))).await.unwrap();
    set_pod_phase(&client, &ns_a, "tessera-201", "Running").await;
    expect_event(&mut rx, "Running", WAIT, |e| {
        matches!(e, BackendEvent::Running { id: 201, .. })
    })
    .await;

    // Mallory's impostor: Tessera's labels for workload 201, in her own namespace.
    let spoof: Pod = serde_json::from_value(json!({
        "metadata": {"name": "spoof", "namespace": ns_m, "labels": {
            "tessera.io/workload": "201", "tessera.io/tenant": "sp-alice", "tessera.io/project": "main",
            "app.kubernetes.io/managed-by": "tessera", "tessera.io/gang-index": "0"}},
        "spec": {"containers": [{"name": "x", "image": "x"}]},
    }))
    .unwrap();
    let mallory = Api::<Pod>::namespaced(client.clone(), &ns_m);
    mallory.create(&PostParams::default(), &spoof).await.unwrap();
    set_pod_phase(&client, &ns_m, "spoof", "Failed").await;
    mallory
        .delete("spoof", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let ev = expect_event(&mut rx, "Stranger", WAIT, |e| {
        matches!(e, BackendEvent::Stranger { .. })
    })
    .await;
    assert!(
        matches!(&ev, BackendEvent::Stranger { namespace, name, .. } if *namespace == ns_m && name == "spoof"),
        "{ev:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    while let Ok(ev) = rx.try_recv() {
        assert!(ev.workload() != Some(201), "the impostor changed workload 201: {ev:?}");
    }
    let report = b
        .reconcile(&[run(201, "sp-alice", "sp-h100-0", gpus(1))])
        .await
        .unwrap();
    assert!(
        matches!(report.observation(201), Some(Observation::Running { .. })),
        "{report:?}"
    );

    // A stop: the pod is deleted with its grace period, and the workload is `Stopped` only
    // once the pod is gone (here: forcibly after grace + 2 s, no kubelet confirms).
    let pods_a = Api::<Pod>::namespaced(client.clone(), &ns_a);
    b.stop(201, Duration::from_secs(1)).await.unwrap();
    assert!(
        pods_a.get_opt("tessera-201").await.unwrap().is_some(),
        "still terminating"
    );
    assert!(
        !std::iter::from_fn(|| rx.try_recv().ok()).any(|e| matches!(e, BackendEvent::Stopped { id: 201, .. })),
        "stopped before its pod was gone"
    );
    // A start at once (a requeue that does not wait): the next attempt's pod, no collision.
    b.start(&run(201, "sp-alice", "sp-h100-0", gpus(1))).await.unwrap();
    let next = pods_a.get("tessera-201-r1").await.unwrap();
    assert_eq!(next.spec.unwrap().node_name.as_deref(), Some("sp-h100-0"));
    assert_eq!(next.metadata.labels.unwrap()["tessera.io/attempt"], "1");
    eventually("the first attempt's pod is gone", WAIT, || async {
        pods_a.get_opt("tessera-201").await.unwrap().is_none()
    })
    .await;
    // The old attempt's end is not the new attempt's: no loss reported for 201.
    tokio::time::sleep(Duration::from_millis(300)).await;
    while let Ok(ev) = rx.try_recv() {
        assert!(
            !matches!(
                ev,
                BackendEvent::Lost { id: 201, .. } | BackendEvent::Exited { id: 201, .. }
            ),
            "{ev:?}"
        );
    }
    b.stop(201, Duration::from_secs(0)).await.unwrap();
    finish_deletion(&client, &ns_a, "tessera-201-r1").await;
    expect_event(&mut rx, "Stopped", WAIT, |e| {
        matches!(e, BackendEvent::Stopped { id: 201, .. })
    })
    .await;

    // A finished pod stays for its log while its workload is expected, and is deleted by the
    // first reconcile after its result is recorded (no longer expected) once past the TTL;
    // Mallory's finished pods wearing the label are not Tessera's to delete.
    b.start(&run(202, "sp-alice", "sp-h100-0", gpus(1))).await.unwrap();
    let finished = json!({"status": {"phase": "Succeeded", "containerStatuses": [{"name": "workload", "image": "x",
        "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": "2026-11-30T12:00:00Z"}}}]}});
    pods_a
        .patch_status("tessera-202", &PatchParams::default(), &Patch::Merge(&finished))
        .await
        .unwrap();
    let mut fake = spoof.clone();
    fake.metadata.name = Some("tessera-202".into());
    mallory.create(&PostParams::default(), &fake).await.unwrap();
    mallory
        .patch_status("tessera-202", &PatchParams::default(), &Patch::Merge(&finished))
        .await
        .unwrap();
    b.reconcile(&[run(202, "sp-alice", "sp-h100-0", gpus(1))])
        .await
        .unwrap();
    assert!(
        pods_a.get_opt("tessera-202").await.unwrap().is_some(),
        "kept while expected"
    );
    b.reconcile(&[]).await.unwrap();
    eventually("the finished pod is deleted", WAIT, || async {
        pods_a
            .get_opt("tessera-202")
            .await
            .unwrap()
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
    })
    .await;
    let theirs = mallory.get("tessera-202").await.unwrap();
    assert!(
        theirs.metadata.deletion_timestamp.is_none(),
        "a stranger's pod is left alone"
    );
}

/// Nodes labelled as GPU Feature Discovery, the device plugin and the MIG manager label them
/// (tests/fixtures/gfd): an H100 node with `mig.capable=true` and MIG off is a whole pool, so
/// 8-GPU work can be placed there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gfd_labelled_h100_nodes_with_mig_off_serve_whole_gpus() {
    let c = cluster().await;
    let client = c.client().await.unwrap();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gfd/");
    let mut node: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{dir}h100-whole.json")).unwrap()).unwrap();
    node["metadata"]["name"] = json!("gfd-h100-0");
    node["metadata"]["labels"]["tessera.io/pool"] = json!("gfd");
    let status = node["status"].clone();
    let obj = node.as_object_mut().unwrap();
    obj.remove("status");
    for k in ["resourceVersion", "uid", "creationTimestamp", "managedFields"] {
        obj["metadata"].as_object_mut().unwrap().remove(k);
    }
    let n: Node = serde_json::from_value(node).unwrap();
    let nodes = Api::<Node>::all(client.clone());
    nodes.create(&PostParams::default(), &n).await.unwrap();
    nodes
        .patch_status(
            "gfd-h100-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .unwrap();
    let (_b, fleet) = KubeBackend::connect(client.clone(), config("gfd")).await.unwrap();
    let pool = fleet.pools.iter().find(|p| p.name == "gfd").expect("the pool");
    assert_eq!(pool.sharing, tessera_model::Sharing::Whole);
    // The engine places an 8-GPU whole request there (it refused the shape on a "MIG" pool).
    let fleet = std::sync::Arc::new(fleet.clone());
    let pool = tessera_model::PoolId(fleet.pools.iter().position(|p| p.name == "gfd").unwrap() as u16);
    let mut e = tessera_sched::Engine::new(fleet.clone(), Box::new(tessera_sched::policy::BestFit), 1);
    e.set_device_binding(tessera_sched::engine::DeviceBinding::PerNodeCount);
    let p = e
        .place(1, &tessera_model::Request::whole(8).with_pool(pool))
        .expect("8 whole GPUs fit an 8-GPU H100 node with MIG off");
    assert_eq!(fleet.node(p.node).name, "gfd-h100-0");
}

/// An eviction a PodDisruptionBudget refuses reaches Tessera at once (no silent retries by the
/// client library): a `Notice` on the workload, a Kubernetes Event on the pod, the pod left
/// running and the workload not `Stopped`; once the budget allows it, the retry evicts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_a_disruption_budget_refuses_is_told_at_once_and_retried() {
    let c = cluster().await;
    let client = c.client().await.unwrap();
    gpu_node(&client, "pdb-h100-0", "pdb", "NVIDIA-H100-80GB-HBM3", 8, json!({})).await;
    let kc = kube::config::Kubeconfig::read_from(&c.kubeconfig).unwrap();
    let mut no_retry = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    no_retry.default_retry = false;
    let evict_client = kube::Client::try_from(no_retry).unwrap();
    let (b, _) = KubeBackend::connect_with(client.clone(), evict_client, config("pdb"))
        .await
        .unwrap();
    let mut rx = b.take_events().unwrap();
    b.ensure_tenancy(&tenancy("pdb-acme", "acme", 8)).await.unwrap();
    let ns = b.namespace_of("pdb-acme", "main");
    b.start(&run(301, "pdb-acme", "pdb-h100-0", gpus(1))).await.unwrap();
    set_pod_phase(&client, &ns, "tessera-301", "Running").await;
    expect_event(&mut rx, "Running", WAIT, |e| {
        matches!(e, BackendEvent::Running { id: 301, .. })
    })
    .await;
    // The tenant's budget: the pod may never be disrupted.
    let pdb = json!({
        "apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "keep", "namespace": ns},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"tessera.io/workload": "301"}}},
    });
    let pdbs: Api<kube::core::DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &kube::discovery::ApiResource {
            group: "policy".into(),
            version: "v1beta1".into(),
            api_version: "policy/v1beta1".into(),
            kind: "PodDisruptionBudget".into(),
            plural: "poddisruptionbudgets".into(),
        },
    );
    pdbs.create(&PostParams::default(), &serde_json::from_value(pdb).unwrap())
        .await
        .unwrap();
    // (Before the disruption controller has computed the budget, and after — the pod is not
    // Ready, so none may go — the Eviction API answers 429.)
    let t0 = std::time::Instant::now();
    b.evict(301, Duration::from_secs(5)).await.unwrap();
    let ev = expect_event(&mut rx, "Notice", Duration::from_secs(3), |e| {
        matches!(e, BackendEvent::Notice { id: 301, .. })
    })
    .await;
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "told at once: {:?}",
        t0.elapsed()
    );
    assert!(
        matches!(&ev, BackendEvent::Notice { detail, .. } if detail.contains("PodDisruptionBudget")),
        "{ev:?}"
    );
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    assert!(
        pods.get("tessera-301")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none(),
        "the budget keeps the pod"
    );
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), &ns);
    eventually("an EvictionRefused Event on the pod", WAIT, || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("EvictionRefused")
                    && e.involved_object.name.as_deref() == Some("tessera-301")
            })
    })
    .await;
    // The budget goes: the next retry (every 5 s) evicts.
    pdbs.delete("keep", &DeleteParams::default()).await.unwrap();
    eventually(
        "the retried eviction deletes the pod",
        Duration::from_secs(30),
        || async {
            pods.get("tessera-301")
                .await
                .unwrap()
                .metadata
                .deletion_timestamp
                .is_some()
        },
    )
    .await;
    while let Ok(e) = rx.try_recv() {
        assert!(
            !matches!(e, BackendEvent::Stopped { id: 301, .. }),
            "Stopped while the pod is still there"
        );
    }
    finish_deletion(&client, &ns, "tessera-301").await;
    expect_event(&mut rx, "Stopped", WAIT, |e| {
        matches!(e, BackendEvent::Stopped { id: 301, .. })
    })
    .await;
}

/// `kubectl drain` (no `--force`) works on Tessera's pods: they have a controller (their
/// namespace), so kubectl evicts them as it evicts a ReplicaSet's; the pod that goes from the
/// cordoned node is reported `Evicted` (batch work is then requeued), not lost. A pod deleted
/// from an open node is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_drain_evicts_tesseras_pods_and_they_are_evicted_not_lost() {
    let c = cluster().await;
    let client = c.client().await.unwrap();
    gpu_node(&client, "kd-h100-0", "kd", "NVIDIA-H100-80GB-HBM3", 8, json!({})).await;
    let (b, _) = KubeBackend::connect(client.clone(), config("kd")).await.unwrap();
    let mut rx = b.take_events().unwrap();
    b.ensure_tenancy(&tenancy("kd-acme", "kd-acme-ml", 8)).await.unwrap();
    let ns = b.namespace_of("kd-acme", "main");
    b.start(&run(701, "kd-acme", "kd-h100-0", gpus(2))).await.unwrap();
    b.start(&run(702, "kd-acme", "kd-h100-0", gpus(2))).await.unwrap();
    for name in ["tessera-701", "tessera-702"] {
        set_pod_phase(&client, &ns, name, "Running").await;
    }
    for id in [701, 702] {
        expect_event(
            &mut rx,
            "running",
            WAIT,
            |e| matches!(e, BackendEvent::Running { id: i, .. } if *i == id),
        )
        .await;
    }
    let pod = Api::<Pod>::namespaced(client.clone(), &ns)
        .get("tessera-701")
        .await
        .unwrap();
    let owner = pod.metadata.owner_references.unwrap_or_default();
    assert!(
        owner
            .iter()
            .any(|o| o.kind == "Namespace" && o.name == ns && o.controller == Some(true)),
        "{owner:?}"
    );
    // A pod deleted behind Tessera's back from an open node is lost.
    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete("tessera-702", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    expect_event(&mut rx, "lost", WAIT, |e| {
        matches!(e, BackendEvent::Lost { id: 702, .. })
    })
    .await;
    // kubectl drain without --force: cordons, evicts (no kubelet here to end the pod: the
    // drain's wait times out and the test confirms the deletion as the kubelet would).
    let out = c.kubectl(&["drain", "kd-h100-0", "--ignore-daemonsets", "--timeout=3s"]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains("cannot delete Pods"), "{text}");
    assert!(text.contains("evicting pod"), "{text}");
    expect_event(
        &mut rx,
        "node cordoned",
        WAIT,
        |e| matches!(e, BackendEvent::NodeChanged { node, change: NodeChange::Cordoned(true) } if node == "kd-h100-0"),
    )
    .await;
    let pod = Api::<Pod>::namespaced(client.clone(), &ns)
        .get("tessera-701")
        .await
        .unwrap();
    assert!(pod.metadata.deletion_timestamp.is_some(), "evicted: {text}");
    finish_deletion(&client, &ns, "tessera-701").await;
    match expect_event(&mut rx, "evicted", WAIT, |e| {
        matches!(
            e,
            BackendEvent::Evicted { id: 701, .. } | BackendEvent::Lost { id: 701, .. }
        )
    })
    .await
    {
        BackendEvent::Evicted { detail, .. } => assert!(detail.contains("cordoned"), "{detail}"),
        other => panic!("the drained pod was reported lost: {other:?}"),
    }
    b.cordon("kd-h100-0", false).await.unwrap();
}
