//! `tessera serve --backend kubernetes` follows the cluster's GPU nodes while it runs, against a
//! real kube-apiserver (the test cluster of `crates/tessera-backend-kube/tests/support`, reached
//! through `KUBECONFIG`): a GPU node added after start — labelled as GPU Feature Discovery labels
//! it (`tests/fixtures/gfd`), its device plugin's `nvidia.com/gpu` in its status — is listed by
//! `tessera nodes` and takes a workload that fits nowhere else within one reconcile interval, a
//! change of its GPUs is followed, and its deletion too (its work is lost), all without a
//! restart. Its own test binary: it needs a cluster whose nodes no other test changes.

use std::time::{Duration, Instant};

use crate::kube_support::{Cluster, eventually, gpu_node, set_pod_phase};
use crate::support::{Serving, TempDir, kube_serve_command, serve_kube_in, serving_kube, tessera, workload_state};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// This module's test cluster (its own; other modules of the test binary have theirs).
async fn cluster() -> &'static Cluster {
    crate::kube_support::cluster_in(module_path!()).await
}

/// The reconcile interval the server runs with (`--reconcile-s`).
const RECONCILE: Duration = Duration::from_secs(5);

fn serve(data: &std::path::Path, kubeconfig: &std::path::Path) -> Serving {
    let reconcile = RECONCILE.as_secs().to_string();
    let cmd = kube_serve_command(data, kubeconfig, &["--reconcile-s", &reconcile]);
    serving_kube(cmd, "8 GPUs on 1 nodes")
}

/// The GFD fixture `file` as a new Node named `name` in pool `pool`, with its status (the
/// kubelet's and the device plugin's part) set after creation, as the API server wants it.
async fn gfd_node(client: &kube::Client, file: &str, name: &str, pool: &str) {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tessera-backend-kube/tests/fixtures/gfd/"
    );
    let mut node: Value = serde_json::from_str(&std::fs::read_to_string(format!("{dir}{file}")).unwrap()).unwrap();
    node["metadata"]["name"] = json!(name);
    node["metadata"]["labels"]["tessera.io/pool"] = json!(pool);
    node["metadata"]["labels"]["kubernetes.io/hostname"] = json!(name);
    let status = node["status"].clone();
    let obj = node.as_object_mut().unwrap();
    obj.remove("status");
    for k in ["resourceVersion", "uid", "creationTimestamp", "managedFields"] {
        obj["metadata"].as_object_mut().unwrap().remove(k);
    }
    let nodes = Api::<Node>::all(client.clone());
    nodes
        .create(&PostParams::default(), &serde_json::from_value(node).unwrap())
        .await
        .unwrap();
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(json!({"status": status})))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_nodes_added_changed_and_removed_at_run_time_are_followed() {
    let c = cluster().await;
    let client = c.client().await.unwrap();
    gpu_node(&client, "n-h100-0", "training", "NVIDIA-H100-80GB-HBM3", 8, json!({})).await;

    let dir = TempDir::new("kube-nodes");
    let (mut server, token) = serve_kube_in(&dir, &c.kubeconfig, serve).await;
    let env: Vec<(String, String)> = vec![
        ("TESSERA_SERVER".into(), server.base.clone()),
        ("TESSERA_TOKEN".into(), token.clone()),
    ];
    let cli = |line: String| {
        let env = env.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let env: Vec<(&str, &str)> = env.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
                let args: Vec<&str> = line.split_whitespace().collect();
                tessera(&args, &env)
            })
            .await
            .unwrap()
        }
    };
    let state = |id: u64| {
        let env = env.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let env: Vec<(&str, &str)> = env.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
                workload_state(&env, id)
            })
            .await
            .unwrap()
        }
    };
    let http = reqwest::Client::new();
    let api = |path: &str| {
        let req = http.get(format!("{}{path}", server.base)).bearer_auth(&token);
        async move { req.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let node_gpus = |name: &'static str| {
        let api = &api;
        async move {
            api("/api/v1/nodes").await["items"]
                .as_array()
                .unwrap()
                .iter()
                .find(|n| n["name"] == name)
                .map(|n| (n["gpus"].as_u64().unwrap(), n["gpus_free"].as_u64().unwrap()))
        }
    };
    let node_of = |id: u64| {
        let api = &api;
        async move {
            api(&format!("/api/v1/workloads/{id}")).await["allocation"]["node"]
                .as_str()
                .map(String::from)
        }
    };
    for line in [
        "tenants create acme",
        "quota set --tenant acme --class training --guaranteed 8 --limit 32",
        "projects create --tenant acme ml",
    ] {
        let (code, _, err) = cli(line.into()).await;
        assert_eq!(code, 0, "{line}: {err}");
    }
    let ns = "tessera-acme-ml";
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    // Submits a workload of `gpus` whole GPUs: its id (ids are not dense: a rebuilt loop
    // reserves a new block of them).
    let submit = |gpus: u32| {
        let cli = &cli;
        async move {
            let (code, out, err) = cli(format!(
                "run --tenant acme --project ml --gpus {gpus} -o json --image registry.example/train:1 -- train"
            ))
            .await;
            assert_eq!(code, 0, "{err}");
            serde_json::from_str::<Value>(&out).unwrap()["id"].as_u64().unwrap()
        }
    };
    // The pod of workload `id`, once bound: its name and node.
    let bound = |id: u64| {
        let pods = pods.clone();
        async move {
            pods.list(&ListParams::default().labels(&format!("tessera.io/workload={id}")))
                .await
                .unwrap()
                .items
                .into_iter()
                .find_map(|p| Some((p.metadata.name?, p.spec?.node_name?)))
        }
    };

    // The one node is full; a second 8-GPU workload waits.
    let w1 = submit(8).await;
    eventually("workload 1 is bound", Duration::from_secs(20), || async {
        bound(w1).await.is_some()
    })
    .await;
    let (pod1, node1) = bound(w1).await.unwrap();
    assert_eq!(node1, "n-h100-0");
    set_pod_phase(&client, ns, &pod1, "Running").await;
    eventually("workload 1 runs", Duration::from_secs(20), || async {
        state(w1).await == "running"
    })
    .await;
    let w2 = submit(8).await;
    eventually("workload 2 waits", Duration::from_secs(20), || async {
        matches!(state(w2).await.as_str(), "queued" | "pending")
    })
    .await;
    assert_eq!(node_gpus("n-h100-1").await, None);

    // A GPU node joins the cluster: listed, and workload 2 is bound to it, within one reconcile
    // interval of its being Ready (no restart).
    gfd_node(&client, "h100-whole.json", "n-h100-1", "training").await;
    let joined = Instant::now();
    eventually("the new node is listed", RECONCILE, || async {
        node_gpus("n-h100-1").await.is_some()
    })
    .await;
    eventually("workload 2 is bound to the new node", RECONCILE, || async {
        bound(w2).await.is_some_and(|(_, n)| n == "n-h100-1")
    })
    .await;
    eprintln!(
        "node joined → listed and workload 2 bound there in {:?}",
        joined.elapsed()
    );
    assert_eq!(node_of(w2).await.as_deref(), Some("n-h100-1"));
    let (code, out, err) = cli("nodes -o json".into()).await;
    assert_eq!(code, 0, "{err}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    let new = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "n-h100-1")
        .unwrap_or_else(|| panic!("tessera nodes lists the new node: {out}"));
    assert_eq!(
        (new["pool"].as_str(), new["gpus"].as_u64()),
        (Some("training"), Some(8)),
        "{new}"
    );
    let (pod2, _) = bound(w2).await.unwrap();
    set_pod_phase(&client, ns, &pod2, "Running").await;
    eventually("workload 2 runs", Duration::from_secs(20), || async {
        state(w2).await == "running"
    })
    .await;

    // Its GPUs change (GFD and the device plugin now say 16): followed, the running workload
    // keeps its node, and an 8-GPU workload (room only there) is bound there.
    let nodes = Api::<Node>::all(client.clone());
    nodes
        .patch(
            "n-h100-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"nvidia.com/gpu.count": "16"}}})),
        )
        .await
        .unwrap();
    nodes
        .patch_status(
            "n-h100-1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"capacity": {"nvidia.com/gpu": "16"}, "allocatable": {"nvidia.com/gpu": "16"}}}),
            ),
        )
        .await
        .unwrap();
    let changed = Instant::now();
    eventually("the node shows 16 GPUs, 8 of them free", RECONCILE, || async {
        node_gpus("n-h100-1").await == Some((16, 8))
    })
    .await;
    eprintln!("capacity change followed in {:?}", changed.elapsed());
    assert_eq!(state(w1).await, "running");
    assert_eq!(state(w2).await, "running");
    assert_eq!(node_of(w2).await.as_deref(), Some("n-h100-1"));
    let w3 = submit(8).await;
    eventually("workload 3 is bound to the grown node", RECONCILE, || async {
        bound(w3).await.is_some_and(|(_, n)| n == "n-h100-1")
    })
    .await;

    // The node is deleted: no longer listed, and the work it held is lost; workload 1 runs on.
    nodes.delete("n-h100-1", &DeleteParams::default()).await.unwrap();
    let deleted = Instant::now();
    eventually("the deleted node is gone from the list", RECONCILE, || async {
        node_gpus("n-h100-1").await.is_none()
    })
    .await;
    eventually("its workloads are lost", RECONCILE, || async {
        state(w2).await == "failed" && state(w3).await == "failed"
    })
    .await;
    eprintln!("node deletion followed in {:?}", deleted.elapsed());
    let described = api(&format!("/api/v1/workloads/{w2}")).await;
    assert!(
        described.to_string().contains("left the cluster"),
        "the reason names the node that left: {described}"
    );
    assert_eq!(state(w1).await, "running");
    assert_eq!(node_gpus("n-h100-0").await, Some((8, 0)));
    server.kill();
}
