//! `tessera serve --backend kubernetes` end to end against a real kube-apiserver (the test
//! cluster of `crates/tessera-backend-kube/tests/support`, reached through `KUBECONFIG`), driven
//! through the CLI: a tenant project becomes a namespace with quota, RBAC and network policy; a
//! workload becomes a pod bound to the node the engine chose; the test plays the kubelet
//! (Running); Tessera shows it running and reads the GPU telemetry of the node's DCGM exporter,
//! attributed to the tenant by the exporter's pod mapping; cancel deletes the pod and gives the
//! capacity back.

use std::path::Path;
use std::time::Duration;

use crate::kube_support::{Cluster, eventually, exporter_pod, fake_exporter, finish_deletion, gpu_node, set_pod_phase};
use crate::support::{
    Serving, TempDir, kube_serve_command, scrape, serve_kube_in, serving_kube, tessera, workload_state,
};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::Api;
use kube::api::ListParams;
use serde_json::json;

/// This module's test cluster (its own; other modules of the test binary have theirs).
async fn cluster() -> &'static Cluster {
    crate::kube_support::cluster_in(module_path!()).await
}

fn serve(data: &Path, kubeconfig: &Path) -> Serving {
    let extra = [
        "--reconcile-s",
        "2",
        "--kube-dcgm-exporter",
        "kube-e2e-gpu-operator/app=nvidia-dcgm-exporter",
        "--kube-telemetry-ms",
        "1000",
    ];
    serving_kube(kube_serve_command(data, kubeconfig, &extra), "16 GPUs on 2 nodes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_backend_end_to_end_through_the_cli() {
    let c = cluster().await;
    let client = c.client().await.unwrap();
    gpu_node(&client, "k-h100-0", "training", "NVIDIA-H100-80GB-HBM3", 8, json!({})).await;
    gpu_node(&client, "k-h100-1", "training", "NVIDIA-H100-80GB-HBM3", 8, json!({})).await;

    let dir = TempDir::new("kube-e2e");
    let (mut server, token) = serve_kube_in(&dir, &c.kubeconfig, serve).await;
    let env = [
        ("TESSERA_SERVER", server.base.as_str()),
        ("TESSERA_TOKEN", token.as_str()),
    ];
    let cli = |args: Vec<String>| {
        let env: Vec<(String, String)> = env.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        async move {
            tokio::task::spawn_blocking(move || {
                let env: Vec<(&str, &str)> = env.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                tessera(&args, &env)
            })
            .await
            .unwrap()
        }
    };
    let args = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
    // Whether nothing holds any of the training pool's capacity.
    let training_idle = || async {
        let (_, out, _) = cli(args("pools -o json")).await;
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        v.as_array().is_some_and(|ps| {
            ps.iter().any(|p| {
                p["name"] == "training" && p["units_used"].as_str().and_then(|u| u.parse::<f64>().ok()) == Some(0.0)
            })
        })
    };
    assert_eq!(cli(args("tenants create acme")).await.0, 0);
    assert_eq!(
        cli(args(
            "quota set --tenant acme --class training --guaranteed 2 --limit 4"
        ))
        .await
        .0,
        0
    );
    assert_eq!(cli(args("projects create --tenant acme ml")).await.0, 0);

    // The project's namespace, quota, RBAC and isolation appear.
    let ns = "tessera-acme-ml";
    let nss = Api::<Namespace>::all(client.clone());
    eventually("the project's namespace", Duration::from_secs(20), || async {
        Api::<NetworkPolicy>::namespaced(client.clone(), ns)
            .get_opt("tessera-tenant-isolation")
            .await
            .unwrap()
            .is_some()
    })
    .await;
    assert_eq!(
        nss.get(ns).await.unwrap().metadata.labels.unwrap()["tessera.io/tenant"],
        "acme"
    );
    // No single sign-on here, so no group is bound yet (the groups come from the `groups`
    // claim rules: tessera-server's tenancy_sync tests).
    let rb = Api::<RoleBinding>::namespaced(client.clone(), ns)
        .get("tessera-tenant")
        .await
        .unwrap();
    assert_eq!(rb.role_ref.name, "edit");
    let q = Api::<k8s_openapi::api::core::v1::ResourceQuota>::namespaced(client.clone(), ns)
        .get("tessera-quota")
        .await
        .unwrap();
    assert_eq!(q.spec.unwrap().hard.unwrap()["requests.nvidia.com/gpu"].0, "4");

    // A workload without an image is refused when it is asked for (the backend runs
    // containers), in one line naming the flag, and nothing is created.
    let (code, _, err) = cli(args("run --tenant acme --project ml --gpus 2 -- python train.py")).await;
    assert_ne!(code, 0);
    assert!(err.contains("runs containers") && err.contains("--image"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    // A 2-GPU workload becomes a pod bound to the chosen node.
    let (code, _, err) = cli(args(
        "run --tenant acme --project ml --gpus 2 --cpus 4 --memory-gib 16 --image registry.example/train:1 -- python train.py",
    ))
    .await;
    assert_eq!(code, 0, "{err}");
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    eventually("the pod is bound", Duration::from_secs(20), || async {
        pods.get_opt("tessera-1")
            .await
            .unwrap()
            .is_some_and(|p| p.spec.unwrap().node_name.is_some())
    })
    .await;
    let pod = pods.get("tessera-1").await.unwrap();
    let spec = pod.spec.unwrap();
    let (_, desc, _) = cli(args("describe 1 -o json")).await;
    let v: serde_json::Value = serde_json::from_str(&desc).unwrap();
    let chosen = v["workload"]["allocation"]["node"].as_str().map(String::from);
    assert!(chosen.is_some(), "{desc}");
    assert_eq!(spec.node_name, chosen, "bound to the engine's node: {desc}");
    let booked = v["workload"]["allocation"]["gpus"].clone();
    assert_ne!(
        booked,
        json!([6, 7]),
        "the test's device plugin picks other GPUs: {desc}"
    );
    assert_eq!(
        spec.containers[0].resources.clone().unwrap().limits.unwrap()["nvidia.com/gpu"].0,
        "2"
    );
    assert_eq!(spec.containers[0].image.as_deref(), Some("registry.example/train:1"));

    // The test plays the kubelet; Tessera shows Running.
    set_pod_phase(&client, ns, "tessera-1", "Running").await;
    let env2: Vec<(String, String)> = env.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
    let st = move || {
        let env2 = env2.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let e: Vec<(&str, &str)> = env2.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
                workload_state(&e, 1)
            })
            .await
            .unwrap()
        }
    };
    eventually("Tessera shows the workload running", Duration::from_secs(20), || {
        let st = st.clone();
        async move { st().await == "running" }
    })
    .await;

    // Each node's DCGM exporter: on the chosen node the device plugin gave the pod GPUs 6 and
    // 7 (the engine booked others); telemetry reaches /metrics with the tenant of the pod, on
    // those GPUs only.
    let exporters = "kube-e2e-gpu-operator";
    nss.create(
        &Default::default(),
        &serde_json::from_value(json!({"metadata": {"name": exporters}})).unwrap(),
    )
    .await
    .unwrap();
    let chosen = chosen.unwrap();
    for (i, node) in ["k-h100-0", "k-h100-1"].into_iter().enumerate() {
        let text: String = (0..8)
            .map(|g| {
                let (util, pod) = match (node == chosen, g >= 6) {
                    (true, true) => (64, format!(",container=\"c\",namespace=\"{ns}\",pod=\"tessera-1\"")),
                    _ => (0, String::new()),
                };
                format!(
                    "DCGM_FI_DEV_GPU_UTIL{{gpu=\"{g}\",UUID=\"GPU-{node}-{g}\",modelName=\"NVIDIA H100 80GB HBM3\"{pod}}} {util}\n"
                )
            })
            .collect();
        let port = fake_exporter(std::sync::Arc::new(std::sync::Mutex::new((200, text))));
        exporter_pod(
            &client,
            exporters,
            &format!("dcgm-exporter-{i}"),
            node,
            port,
            Some("127.0.0.1"),
        )
        .await;
    }
    let http = reqwest::Client::new();
    let want = format!(",Hostname=\"{chosen}\",tenant=\"acme\",project=\"ml\"}} ");
    eventually(
        "the exporter's telemetry, attributed to the tenant",
        Duration::from_secs(20),
        || async {
            let text = scrape(&http, &server.base, Some(&token)).await;
            // Only the GPUs the pod has, with their figures; none of those the engine booked.
            let mut used: Vec<(&str, f64)> = text
                .lines()
                .filter(|l| l.starts_with("DCGM_FI_DEV_GPU_UTIL{gpu=") && l.contains("tenant=\"acme\""))
                .filter_map(|l| {
                    let (labels, value) = l.rsplit_once(' ')?;
                    let gpu = labels.strip_prefix("DCGM_FI_DEV_GPU_UTIL{gpu=\"")?.split('"').next()?;
                    (labels.to_string() + " ")
                        .contains(&want)
                        .then_some((gpu, value.parse().ok()?))
                })
                .collect();
            used.sort_by(|a, b| a.0.cmp(b.0));
            used == [("6", 64.0), ("7", 64.0)]
        },
    )
    .await;

    // And the engine's booking follows the devices the exporter sees the pod on.
    let (_, desc, _) = cli(args("describe 1 -o json")).await;
    let v: serde_json::Value = serde_json::from_str(&desc).unwrap();
    assert_eq!(v["workload"]["allocation"]["gpus"], json!([6, 7]), "{desc}");

    // Cancel: the pod is deleted (the backend forces it after grace + 30 s without a kubelet:
    // here the test confirms the deletion as the kubelet would) and the capacity is back.
    assert_eq!(cli(args("cancel 1")).await.0, 0);
    eventually("the pod is being deleted", Duration::from_secs(20), || async {
        pods.get_opt("tessera-1")
            .await
            .unwrap()
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
    })
    .await;
    finish_deletion(&client, ns, "tessera-1").await;
    assert!(pods.list(&ListParams::default()).await.unwrap().items.is_empty());
    eventually("the capacity is back", Duration::from_secs(20), training_idle).await;
    assert_eq!(st().await, "cancelled");

    // A gang over both nodes: 16 GPUs, more than one node holds, is one workload of two
    // node-shares; each becomes a pod bound to its node, and the workload runs once both run.
    // One pod failing fails the gang, and its other pod is deleted.
    let (code, _, err) = cli(args(
        "quota set --tenant acme --class training --guaranteed 16 --limit 16",
    ))
    .await;
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = cli(args("run --tenant acme --project ml --gpus 16 --cpus 1 --memory-gib 1 --image registry.example/train:1 -- torchrun train.py")).await;
    assert_eq!(code, 0, "{err}");
    let gang_pods = ["tessera-2-0", "tessera-2-1"];
    eventually("both pods of the gang are bound", Duration::from_secs(20), || async {
        let mut bound = 0;
        for name in gang_pods {
            if pods
                .get_opt(name)
                .await
                .unwrap()
                .is_some_and(|p| p.spec.unwrap().node_name.is_some())
            {
                bound += 1;
            }
        }
        bound == 2
    })
    .await;
    let mut nodes = Vec::new();
    for name in gang_pods {
        let p = pods.get(name).await.unwrap();
        let labels = p.metadata.labels.unwrap();
        assert_eq!(labels["tessera.io/gang-size"], "2", "{name}");
        let spec = p.spec.unwrap();
        assert_eq!(
            spec.containers[0].resources.clone().unwrap().limits.unwrap()["nvidia.com/gpu"].0,
            "8"
        );
        nodes.push(spec.node_name.unwrap());
    }
    nodes.sort();
    assert_eq!(nodes, ["k-h100-0", "k-h100-1"], "one pod per node");
    let (_, desc, _) = cli(args("describe 2 -o json")).await;
    let v: serde_json::Value = serde_json::from_str(&desc).unwrap();
    let a = &v["workload"]["allocation"];
    assert_eq!(a["units_milli"], 16_000, "{desc}");
    assert_eq!(a["shares"].as_array().map(Vec::len), Some(1), "{desc}");
    let (_, text, _) = cli(args("describe 2")).await;
    assert!(text.contains("node-shares 2 (16 GPU units)"), "{text}");
    let st2 = {
        let env2: Vec<(String, String)> = env.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        move || {
            let env2 = env2.clone();
            async move {
                tokio::task::spawn_blocking(move || {
                    let e: Vec<(&str, &str)> = env2.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
                    workload_state(&e, 2)
                })
                .await
                .unwrap()
            }
        }
    };
    set_pod_phase(&client, ns, gang_pods[0], "Running").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_ne!(st2().await, "running", "not running while one share is not");
    set_pod_phase(&client, ns, gang_pods[1], "Running").await;
    eventually("the gang runs once both pods do", Duration::from_secs(20), || {
        let st2 = st2.clone();
        async move { st2().await == "running" }
    })
    .await;
    set_pod_phase(&client, ns, gang_pods[1], "Failed").await;
    eventually("the gang fails with its pod", Duration::from_secs(20), || {
        let st2 = st2.clone();
        async move { st2().await == "failed" }
    })
    .await;
    eventually("the gang's other pod is deleted", Duration::from_secs(20), || async {
        pods.get_opt(gang_pods[0])
            .await
            .unwrap()
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
    })
    .await;
    for name in gang_pods {
        finish_deletion(&client, ns, name).await;
    }
    eventually("every share's capacity is back", Duration::from_secs(20), training_idle).await;

    // Deleting the project deletes its namespace.
    let (code, _, err) = cli(args("projects delete --tenant acme ml")).await;
    if code == 0 {
        eventually("the namespace is deleted", Duration::from_secs(60), || async {
            nss.get_opt(ns)
                .await
                .unwrap()
                .is_none_or(|n| n.metadata.deletion_timestamp.is_some())
        })
        .await;
    } else {
        // A project with workloads on record stays (by design): its namespace stays too.
        assert!(err.contains("workloads on record"), "{err}");
    }
    server.kill();
}
