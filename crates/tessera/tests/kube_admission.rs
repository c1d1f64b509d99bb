//! kubectl workloads through Tessera, against a real kube-apiserver and controller-manager (the
//! test cluster of `crates/tessera-backend-kube/tests/support`): `tessera serve --backend
//! kubernetes` over TLS, its admission webhook registered with the API server as
//! `deploy/kubernetes` registers it, a tenant user with the `edit` role in its project's
//! namespace. The tenant's hostile pods are refused with what to do; a GPU pod outside a
//! project namespace is refused; a Job's pod becomes a Tessera workload, bound by Tessera and
//! followed to its end; a pod that cannot be placed now waits with an Event saying why; a pod
//! its owner deletes withdraws its workload; labels only Tessera may set are stripped; a Job
//! annotated as a gang runs as one gang of its pods on two nodes. Also
//! measures `kubectl apply` of a GPU Job → its pod bound (printed, not asserted: a benchmark
//! figure, see the README). Last, the same path with the real kubelet (containerd and runc) of
//! `crate::kube_support::kubelet`: a Job applied with `kubectl` runs there to its end.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::kube_support::{Cluster, eventually, gpu_node, set_pod_phase};
use crate::support::{Serving, TempDir, admin_token, kube_serve_command, try_wait_until_serving};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};

/// This module's test cluster (the kubelet's (some of its tests use the real node); other modules of the test binary have theirs).
async fn cluster() -> &'static Cluster {
    crate::kube_support::cluster_in(crate::kube_support::kubelet::KUBELET_SCOPE).await
}

const TENANT: &str = "wh";
const NS: &str = "tessera-wh-ml";
/// The benchmark's own (it runs alone: `… kube_admission bench -- --ignored`).
const BENCH_TENANT: &str = "bench";
const BENCH_NS: &str = "tessera-bench-ml";

/// A CA and a serving certificate for 127.0.0.1 (the API server calls the webhook there).
fn certificates(dir: &Path) -> (Vec<u8>, std::path::PathBuf, std::path::PathBuf) {
    let (ca, cert, key) = tessera_testdb::test_certificates(dir, "tessera-webhook-ca");
    (std::fs::read(ca).unwrap(), cert, key)
}

/// The cluster's kubeconfig, acting as the user `tessera` (with the admin's rights): Tessera
/// needs an identity of its own, distinct from the controller-manager's (which makes the Job's
/// pods as the admin here).
fn tessera_kubeconfig(c: &crate::kube_support::Cluster, dir: &Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string(&c.kubeconfig).unwrap();
    let text = text.replace(
        "  user:\n    token:",
        "  user:\n    as: tessera\n    as-groups: [\"system:masters\"]\n    token:",
    );
    assert!(text.contains("as: tessera"), "{text}");
    let path = dir.join("tessera.kubeconfig");
    std::fs::write(&path, text).unwrap();
    path
}

fn serve(data: &Path, kubeconfig: &Path, cert: &Path, key: &Path) -> Serving {
    // Tessera's own pods pass its webhook unchanged (`--kube-identity`).
    let extra = [
        "--reconcile-s",
        "2",
        "--kube-telemetry-ms",
        "0",
        "--kube-identity",
        "tessera",
    ];
    let mut cmd = kube_serve_command(data, kubeconfig, &extra);
    cmd.arg("--tls-cert").arg(cert).arg("--tls-key").arg(key);
    try_wait_until_serving(&mut cmd, Duration::from_secs(60)).expect("server did not start")
}

/// The webhook configurations `deploy/kubernetes/40-admission.yaml` registers, with a URL
/// instead of the in-cluster Service: pods in tenant project namespaces (mutated, then
/// validated) and, validated only, in every other namespace but the exempt ones (a GPU pod
/// there is refused).
fn webhooks(port: u16, ca: &[u8], tenant: &str) -> (Value, Value) {
    use base64::Engine;
    let bundle = base64::engine::general_purpose::STANDARD.encode(ca);
    let hook = |name: &str, path: &str, selector: Value| {
        json!({
            "name": name,
            "clientConfig": {"url": format!("https://127.0.0.1:{port}{path}"), "caBundle": bundle},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
            "namespaceSelector": selector,
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 10,
        })
    };
    // This test's namespaces only (the cluster is the test binary's).
    let projects = json!({"matchLabels": {"app.kubernetes.io/managed-by": "tessera", "tessera.io/tenant": tenant}});
    let others = json!({"matchExpressions": [
        {"key": "tessera.io/tenant", "operator": "DoesNotExist"},
        {"key": "admission-test", "operator": "In", "values": ["yes"]}]});
    let mutating = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": format!("tessera-test-{tenant}")},
        "webhooks": [hook("pods.mutate.tessera.io", "/admission/mutate", projects.clone())],
    });
    let validating = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": format!("tessera-test-{tenant}")},
        "webhooks": [
            hook("pods.validate.tessera.io", "/admission/validate", projects),
            hook("gpu-pods.validate.tessera.io", "/admission/validate", others),
        ],
    });
    (mutating, validating)
}

/// `kubectl apply` of `manifest` as `user` (impersonated by the cluster's admin).
fn kubectl_as(c: &crate::kube_support::Cluster, dir: &Path, user: &str, manifest: &Value) -> (bool, String) {
    let file = dir.join(format!("m-{}.json", rand_suffix()));
    std::fs::write(&file, serde_json::to_vec(manifest).unwrap()).unwrap();
    let out = c.kubectl(&["--as", user, "apply", "-f", file.to_str().unwrap()]);
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn gpu_pod(name: &str, ns: &str, gpus: u32, extra: Value) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox",
            "command": ["sleep", "3600"],
            "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]},
    });
    merge(&mut p, extra);
    p
}

fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

/// A Tessera server over TLS on the test cluster with one more 8-GPU node, a tenant with
/// project `ml` (guaranteed 8, limit `limit`), the user `alice` with `edit` in its namespace,
/// and the webhook registered for that tenant's namespaces.
struct Setup {
    c: &'static crate::kube_support::Cluster,
    client: kube::Client,
    dir: TempDir,
    server: Serving,
    base: String,
    token: String,
    http: reqwest::Client,
}

/// The `edit` role the tenant's groups get, for the user `alice`, in namespace `ns`.
fn edit_role_for_alice(c: &crate::kube_support::Cluster, ns: &str) {
    let out = c.kubectl(&[
        "-n",
        ns,
        "create",
        "rolebinding",
        "alice-edit",
        "--clusterrole=edit",
        "--user=alice",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

async fn setup(node: &str, tenant: &str, ns: &str, limit: u32) -> Setup {
    let c = cluster().await;
    let client = c.client().await.unwrap();
    gpu_node(&client, node, "training", "NVIDIA-H100-80GB-HBM3", 8, json!({})).await;
    let dir = TempDir::new(&format!("kube-admission-{tenant}"));
    let (ca, cert, key) = certificates(&dir.0);
    let data = dir.0.join("data");
    let server = tokio::task::spawn_blocking({
        let (data, kc, cert, key) = (data.clone(), tessera_kubeconfig(c, &dir.0), cert.clone(), key.clone());
        move || serve(&data, &kc, &cert, &key)
    })
    .await
    .unwrap();
    let base = server.base.replace("http://", "https://");
    let port: u16 = base.rsplit(':').next().unwrap().parse().unwrap();
    let token = admin_token(&data);
    let http = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .build()
        .unwrap();
    for (m, path, body) in [
        (
            reqwest::Method::POST,
            "/api/v1/tenants".to_string(),
            json!({"name": tenant}),
        ),
        (
            reqwest::Method::PUT,
            format!("/api/v1/tenants/{tenant}/quotas/training"),
            json!({"guaranteed": 8, "limit": limit}),
        ),
        (
            reqwest::Method::POST,
            format!("/api/v1/tenants/{tenant}/projects"),
            json!({"name": "ml"}),
        ),
    ] {
        let r = http
            .request(m, format!("{base}{path}"))
            .bearer_auth(&token)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    }
    eventually("the project's namespace", Duration::from_secs(30), || async {
        Api::<k8s_openapi::api::core::v1::ResourceQuota>::namespaced(client.clone(), ns)
            .get_opt("tessera-quota")
            .await
            .unwrap()
            .is_some()
    })
    .await;
    edit_role_for_alice(c, ns);
    let (mutating, validating) = webhooks(port, &ca, tenant);
    for (kind, obj) in [
        ("mutatingwebhookconfigurations", mutating),
        ("validatingwebhookconfigurations", validating),
    ] {
        let file = dir.0.join(format!("{kind}.json"));
        std::fs::write(&file, serde_json::to_vec(&obj).unwrap()).unwrap();
        let out = c.kubectl(&["apply", "-f", file.to_str().unwrap()]);
        assert!(out.status.success(), "{kind}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Setup {
        c,
        client,
        dir,
        server,
        base,
        token,
        http,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_workloads_go_through_tesseras_admission_webhook() {
    let Setup {
        c,
        client,
        dir,
        mut server,
        base,
        token,
        http,
    } = setup("wh-h100-0", TENANT, NS, 16).await;
    let api = |method: reqwest::Method, path: &str, body: Value| {
        let req = http
            .request(method, format!("{base}{path}"))
            .bearer_auth(&token)
            .json(&body);
        async move {
            let r = req.send().await.unwrap();
            let status = r.status();
            let v: Value = r.json().await.unwrap_or(Value::Null);
            assert!(status.is_success(), "{status}: {v}");
            v
        }
    };
    use reqwest::Method;
    // The tenant's user also has `edit` in a plain namespace of its own outside Tessera.
    let other = "wh-elsewhere";
    c.kubectl(&["create", "namespace", other]);
    c.kubectl(&["label", "namespace", other, "admission-test=yes"]);
    edit_role_for_alice(c, other);

    // The deploy folder's webhook configurations are valid for a real API server.
    c.kubectl(&["create", "namespace", "tessera-system"]);
    let deploy = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/kubernetes/admission/20-webhooks.yaml"
    );
    let out = c.kubectl(&["apply", "--dry-run=server", "-f", deploy]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let applied = String::from_utf8_lossy(&out.stdout);
    for what in [
        "mutatingwebhookconfiguration",
        "validatingwebhookconfiguration",
        "service/tessera-admission",
    ] {
        assert!(applied.contains(what), "{what} not in {applied}");
    }

    // Hostile pods are refused at `kubectl apply`, each break named with what to do.
    let hostile = gpu_pod(
        "grab",
        NS,
        8,
        json!({"spec": {"nodeName": "wh-h100-0", "hostNetwork": true,
            "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
            "containers": [{"name": "main", "image": "busybox", "securityContext": {"privileged": true},
                "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}),
    );
    // The webhook may take a moment to be called: the API server picks up new configurations
    // within a second or so.
    let mut refused = String::new();
    for _ in 0..50 {
        let (ok, out) = kubectl_as(c, &dir.0, "alice", &hostile);
        if !ok && out.contains("Tessera:") {
            refused = out;
            break;
        }
        if ok {
            c.kubectl(&["-n", NS, "delete", "pod", "grab", "--grace-period=0", "--force"]);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for needle in ["spec.nodeName is set", "hostNetwork", "hostPath", "privileged"] {
        assert!(refused.contains(needle), "{needle}: {refused}");
    }
    let pods = Api::<Pod>::namespaced(client.clone(), NS);
    assert!(pods.get_opt("grab").await.unwrap().is_none());
    // A priority class the platform admin did not grant the tenant.
    let (ok, out) = kubectl_as(
        c,
        &dir.0,
        "alice",
        &gpu_pod(
            "vip",
            NS,
            1,
            json!({"metadata": {"annotations": {"tessera.io/priority": "critical"}}}),
        ),
    );
    assert!(!ok && out.contains("not granted"), "{out}");
    // GPUs outside a Tessera project's namespace.
    let (ok, out) = kubectl_as(c, &dir.0, "alice", &gpu_pod("side", other, 1, json!({})));
    assert!(!ok && out.contains("not one"), "{out}");
    // A pod without GPUs in the project namespace is not Tessera's business.
    let plain = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain", "namespace": NS},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}});
    let (ok, out) = kubectl_as(c, &dir.0, "alice", &plain);
    assert!(ok, "{out}");
    let p = pods.get("plain").await.unwrap();
    assert_ne!(p.spec.unwrap().scheduler_name.as_deref(), Some("tessera"));

    // A Job's pod becomes a Tessera workload, bound by Tessera; the pod wears a spoofed
    // workload label, which the webhook strips.
    let job = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "train", "namespace": NS},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"labels": {"tessera.io/workload": "1", "app.kubernetes.io/managed-by": "tessera"}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox",
                "command": ["sh", "-c", "echo hi"],
                "resources": {"limits": {"nvidia.com/gpu": "8"}, "requests": {"cpu": "2", "memory": "8Gi"}}}]}}},
    });
    let t0 = Instant::now();
    let (ok, out) = kubectl_as(c, &dir.0, "alice", &job);
    assert!(ok, "{out}");
    let job_pod = |pods: &Api<Pod>| {
        let pods = pods.clone();
        async move {
            pods.list(&ListParams::default().labels("job-name=train"))
                .await
                .unwrap()
                .items
                .into_iter()
                .next()
        }
    };
    eventually("the Job's pod is bound by Tessera", Duration::from_secs(30), || async {
        job_pod(&pods)
            .await
            .is_some_and(|p| p.spec.unwrap().node_name.is_some())
    })
    .await;
    let bound_in = t0.elapsed();
    let p = job_pod(&pods).await.unwrap();
    let name = p.metadata.name.clone().unwrap();
    let spec = p.spec.clone().unwrap();
    assert_eq!(spec.scheduler_name.as_deref(), Some("tessera"));
    assert_eq!(spec.node_name.as_deref(), Some("wh-h100-0"));
    let csc = spec.containers[0].security_context.clone().unwrap();
    assert_eq!(csc.allow_privilege_escalation, Some(false), "restricted defaults");
    let labels = p.metadata.labels.clone().unwrap();
    assert!(!labels.contains_key("app.kubernetes.io/managed-by"), "{labels:?}");
    let wid: u64 = labels["tessera.io/workload"].parse().unwrap();
    let w = api(Method::GET, &format!("/api/v1/workloads/{wid}"), Value::Null).await;
    assert_eq!(w["tenant"], TENANT, "{w}");
    assert_eq!(w["project"], "ml", "{w}");
    assert_eq!(w["name"], "train", "{w}");
    eprintln!("kubectl apply of a GPU Job → its pod bound by Tessera: {bound_in:?}");

    // The test plays the kubelet: the pod runs and succeeds; so does the workload.
    set_pod_phase(&client, NS, &name, "Running").await;
    set_pod_phase(&client, NS, &name, "Succeeded").await;
    let state = |id: u64| {
        let req = http.get(format!("{base}/api/v1/workloads/{id}")).bearer_auth(&token);
        async move {
            let v: Value = req.send().await.unwrap().json().await.unwrap();
            v["state"].as_str().unwrap_or_default().to_string()
        }
    };
    eventually("the workload succeeded", Duration::from_secs(30), || async {
        state(wid).await == "succeeded"
    })
    .await;

    // A pod that cannot be placed now waits in Tessera's queue, its owner told why on the pod.
    let (ok, out) = kubectl_as(c, &dir.0, "alice", &gpu_pod("big", NS, 8, json!({})));
    assert!(ok, "{out}");
    eventually("the first pod is bound", Duration::from_secs(30), || async {
        pods.get("big").await.unwrap().spec.unwrap().node_name.is_some()
    })
    .await;
    let (ok, out) = kubectl_as(c, &dir.0, "alice", &gpu_pod("next", NS, 4, json!({})));
    assert!(ok, "{out}");
    let events = Api::<Event>::namespaced(client.clone(), NS);
    eventually("an Event says why the pod waits", Duration::from_secs(30), || async {
        events
            .list(&ListParams::default().fields("involvedObject.name=next"))
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("TesseraWaiting"))
    })
    .await;
    eventually(
        "the waiting pod is labelled as its workload's",
        Duration::from_secs(10),
        || async {
            pods.get("next")
                .await
                .unwrap()
                .metadata
                .labels
                .is_some_and(|l| l.contains_key("tessera.io/workload"))
        },
    )
    .await;
    let next = pods.get("next").await.unwrap();
    assert!(next.spec.clone().unwrap().node_name.is_none());
    let next_id: u64 = next.metadata.labels.unwrap()["tessera.io/workload"].parse().unwrap();
    assert_eq!(state(next_id).await, "queued");
    // The tenant's own pod elsewhere wearing the waiting workload's label, then deleted,
    // withdraws nothing: only that workload's own pod (namespace, name, UID) can.
    let spoof = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "spoof", "namespace": other, "labels": {"tessera.io/workload": next_id.to_string()}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}});
    let (ok, out) = kubectl_as(c, &dir.0, "alice", &spoof);
    assert!(ok, "{out}");
    c.kubectl(&[
        "--as",
        "alice",
        "-n",
        other,
        "delete",
        "pod",
        "spoof",
        "--grace-period=0",
        "--force",
    ]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        state(next_id).await,
        "queued",
        "a spoofed pod's deletion withdrew another pod's workload"
    );
    // Its owner deletes the first pod: that workload is withdrawn and the next one is bound.
    let big_id: u64 = pods.get("big").await.unwrap().metadata.labels.unwrap()["tessera.io/workload"]
        .parse()
        .unwrap();
    c.kubectl(&[
        "--as",
        "alice",
        "-n",
        NS,
        "delete",
        "pod",
        "big",
        "--grace-period=0",
        "--force",
    ]);
    eventually(
        "the deleted pod's workload is cancelled",
        Duration::from_secs(30),
        || async { state(big_id).await == "cancelled" },
    )
    .await;
    eventually("the waiting pod is bound", Duration::from_secs(30), || async {
        pods.get("next").await.unwrap().spec.unwrap().node_name.is_some()
    })
    .await;

    // Tessera's own pods pass its webhook unchanged (labels kept, bound by Tessera).
    let w = api(
        Method::POST,
        "/api/v1/workloads",
        json!({"tenant": TENANT, "project": "ml", "name": "api", "shape": {"gpus": 2}, "image": "busybox"}),
    )
    .await;
    let api_id = w["id"].as_u64().unwrap();
    let own = format!("tessera-{api_id}");
    eventually("Tessera's own pod is bound", Duration::from_secs(30), || async {
        pods.get_opt(&own)
            .await
            .unwrap()
            .is_some_and(|p| p.spec.unwrap().node_name.is_some())
    })
    .await;
    let p = pods.get(&own).await.unwrap();
    assert_eq!(
        p.metadata
            .labels
            .unwrap()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("tessera")
    );

    // A Job annotated as a gang is one workload: its pods are the node-shares of one gang,
    // bound together to two nodes of a pool of their own, running when both run, failed with
    // either (the other deleted). One pod cannot ask for more than a node holds, and a gang
    // Job whose completions differ from its parallelism has its pods refused.
    for n in ["wh-gang-0", "wh-gang-1"] {
        gpu_node(&client, n, "gangs", "NVIDIA-H100-80GB-HBM3", 8, json!({})).await;
    }
    api(
        Method::PUT,
        &format!("/api/v1/tenants/{TENANT}/quotas/gangs"),
        json!({"guaranteed": 16, "limit": 16}),
    )
    .await;
    eventually(
        "Tessera lists the gang pool's nodes",
        Duration::from_secs(30),
        || async {
            let nodes = api(Method::GET, "/api/v1/nodes", Value::Null).await;
            nodes["items"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|n| n["pool"] == "gangs")
                .count()
                == 2
        },
    )
    .await;
    let (ok, out) = kubectl_as(
        c,
        &dir.0,
        "alice",
        &gpu_pod(
            "huge",
            NS,
            16,
            json!({"metadata": {"annotations": {"tessera.io/pool": "gangs"}}}),
        ),
    );
    assert!(!ok && out.contains("tessera.io/gang"), "{out}");
    let gang_job = |name: &str, completions: Option<u32>| {
        let mut j = json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": NS, "annotations": {"tessera.io/gang": "true"}},
            "spec": {"parallelism": 2, "backoffLimit": 0, "template": {
                "metadata": {"annotations": {"tessera.io/pool": "gangs"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "workload", "image": "busybox",
                    "command": ["sh", "-c", "echo hi"],
                    "resources": {"limits": {"nvidia.com/gpu": "8"}, "requests": {"cpu": "1", "memory": "1Gi"}}}]}}},
        });
        if let Some(c) = completions {
            j["spec"]["completions"] = json!(c);
        }
        j
    };
    let (ok, out) = kubectl_as(c, &dir.0, "alice", &gang_job("odd", Some(4)));
    assert!(ok, "{out}");
    eventually(
        "the odd gang's pods are refused, the Job told why",
        Duration::from_secs(30),
        || async {
            events
                .list(&ListParams::default().fields("involvedObject.name=odd"))
                .await
                .unwrap()
                .items
                .iter()
                .any(|e| e.message.as_deref().is_some_and(|m| m.contains("set completions")))
        },
    )
    .await;
    assert!(
        pods.list(&ListParams::default().labels("job-name=odd"))
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let (ok, out) = kubectl_as(c, &dir.0, "alice", &gang_job("allreduce", None));
    assert!(ok, "{out}");
    let members = || async {
        let mut items = pods
            .list(&ListParams::default().labels("job-name=allreduce"))
            .await
            .unwrap()
            .items;
        items.sort_by_key(|p| p.metadata.name.clone());
        items
    };
    eventually("both pods of the gang are bound", Duration::from_secs(30), || async {
        let m = members().await;
        m.len() == 2 && m.iter().all(|p| p.spec.as_ref().unwrap().node_name.is_some())
    })
    .await;
    let m = members().await;
    let mut nodes: Vec<String> = m.iter().map(|p| p.spec.clone().unwrap().node_name.unwrap()).collect();
    nodes.sort();
    assert_eq!(nodes, ["wh-gang-0", "wh-gang-1"], "one pod per node-share");
    let ids: Vec<String> = m
        .iter()
        .map(|p| p.metadata.labels.clone().unwrap()["tessera.io/workload"].clone())
        .collect();
    assert_eq!(ids[0], ids[1], "both pods are one workload's");
    let gang_id: u64 = ids[0].parse().unwrap();
    let w = api(Method::GET, &format!("/api/v1/workloads/{gang_id}"), Value::Null).await;
    assert_eq!(w["name"], "allreduce", "{w}");
    assert_eq!(
        w["allocation"]["units_milli"], 16_000,
        "the gang's units are both pods': {w}"
    );
    assert_eq!(
        (&w["shape"]["gpus"], &w["shape"]["gpus_per_node"]),
        (&json!(16), &json!(8)),
        "{w}"
    );
    assert_eq!(w["allocation"]["shares"].as_array().map(Vec::len), Some(1), "{w}");
    let names: Vec<String> = m.iter().map(|p| p.metadata.name.clone().unwrap()).collect();
    set_pod_phase(&client, NS, &names[0], "Running").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_ne!(
        state(gang_id).await,
        "running",
        "a gang runs only when all its pods run"
    );
    set_pod_phase(&client, NS, &names[1], "Running").await;
    eventually("the gang runs", Duration::from_secs(30), || async {
        state(gang_id).await == "running"
    })
    .await;
    set_pod_phase(&client, NS, &names[1], "Failed").await;
    eventually("the gang fails with one pod", Duration::from_secs(30), || async {
        state(gang_id).await == "failed"
    })
    .await;
    eventually("the gang's other pod is deleted", Duration::from_secs(30), || async {
        pods.get_opt(&names[0])
            .await
            .unwrap()
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
    })
    .await;
    crate::kube_support::finish_deletion(&client, NS, &names[0]).await;

    // Last, with the real kubelet (containerd and runc): the tenant's `kubectl apply` of a GPU
    // Job, admitted by the webhook, queued and bound by Tessera, run by the kubelet to its end;
    // the Job completes, the workload succeeds, and its log is the container's. The node joins
    // while Tessera runs, in a pool of its own (so the fake node above takes none of this).
    let (_, node) = crate::kube_support::kubelet::kubelet_node().await;
    let real = crate::kube_support::kubelet::NODE;
    let out = c.kubectl(&["label", "node", real, "tessera.io/pool=kubelet", "--overwrite"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    api(
        Method::PUT,
        &format!("/api/v1/tenants/{TENANT}/quotas/kubelet"),
        json!({"guaranteed": 8, "limit": 8}),
    )
    .await;
    eventually(
        "Tessera lists the kubelet's node in its pool",
        Duration::from_secs(30),
        || async {
            let nodes = api(Method::GET, &format!("/api/v1/nodes?node={real}"), Value::Null).await;
            nodes["items"]
                .as_array()
                .unwrap()
                .iter()
                .any(|n| n["name"] == real && n["pool"] == "kubelet")
        },
    )
    .await;
    let job = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "on-kubelet", "namespace": NS},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"annotations": {"tessera.io/pool": "kubelet"}},
            "spec": {"restartPolicy": "Never",
                "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": true},
                "containers": [{"name": "main", "image": crate::kube_support::kubelet::BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "echo hello from the kubelet as $(id -u); exit 0"],
                    "resources": {"limits": {"nvidia.com/gpu": "8"}, "requests": {"cpu": "100m", "memory": "64Mi"}}}]}}},
    });
    let t0 = Instant::now();
    let (ok, out) = kubectl_as(c, &dir.0, "alice", &job);
    assert!(ok, "{out}");
    let on_kubelet = || async {
        pods.list(&ListParams::default().labels("job-name=on-kubelet"))
            .await
            .unwrap()
            .items
            .into_iter()
            .next()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let p = on_kubelet().await;
        if p.as_ref()
            .is_some_and(|p| p.spec.as_ref().unwrap().node_name.as_deref() == Some(real))
        {
            break;
        }
        if Instant::now() > deadline {
            let w = match p
                .as_ref()
                .and_then(|p| p.metadata.labels.as_ref()?.get("tessera.io/workload").cloned())
            {
                Some(id) => api(Method::GET, &format!("/api/v1/workloads/{id}"), Value::Null).await,
                None => Value::Null,
            };
            let events = Api::<Event>::namespaced(client.clone(), NS)
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter_map(|e| e.message)
                .collect::<Vec<_>>();
            panic!("the Job's pod was not bound to {real} within 30 s: pod {p:?}\nworkload {w}\nevents {events:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let bound_in = t0.elapsed();
    let p = on_kubelet().await.unwrap();
    let wid: u64 = p.metadata.labels.unwrap()["tessera.io/workload"].parse().unwrap();
    eventually(
        "the kubelet ran the pod to its end",
        Duration::from_secs(90),
        || async {
            on_kubelet()
                .await
                .and_then(|p| p.status?.phase)
                .is_some_and(|ph| ph == "Succeeded")
        },
    )
    .await;
    eventually("the workload succeeded", Duration::from_secs(30), || async {
        state(wid).await == "succeeded"
    })
    .await;
    let done_in = t0.elapsed();
    let jobs = Api::<k8s_openapi::api::batch::v1::Job>::namespaced(client.clone(), NS);
    eventually("the Job completed", Duration::from_secs(30), || async {
        jobs.get("on-kubelet").await.unwrap().status.and_then(|s| s.succeeded) == Some(1)
    })
    .await;
    let log = http
        .get(format!("{base}/api/v1/workloads/{wid}/logs"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(log.contains("hello from the kubelet as 1000"), "{log}");
    eprintln!(
        "kubectl apply of a GPU Job on the real kubelet ({}): bound in {bound_in:?}, workload succeeded in {done_in:?}",
        node.name
    );
    server.kill();
}

/// `kubectl apply` of a one-GPU Job → its pod admitted, taken in and bound by Tessera, with a
/// free node, 40 times in a row (each Job's pod then ends, freeing the node). A benchmark,
/// not a timed test, run alone (its node would change the other test's fleet):
/// `cargo test -p tessera --test integration kube_admission::bench -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints kubectl apply → bound percentiles; run alone with `bench -- --ignored --nocapture`"]
async fn bench_kubectl_apply_to_bound() {
    let Setup {
        c,
        client,
        dir,
        mut server,
        ..
    } = setup("bench-h100-0", BENCH_TENANT, BENCH_NS, 8).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pods = Api::<Pod>::namespaced(client.clone(), BENCH_NS);
    let mut took = Vec::new();
    for i in 0..40 {
        let job = json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": format!("bench-{i}"), "namespace": BENCH_NS},
            "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "main", "image": "busybox",
                    "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}},
        });
        let t0 = Instant::now();
        let (ok, out) = kubectl_as(c, &dir.0, "alice", &job);
        assert!(ok, "{out}");
        let selector = format!("job-name=bench-{i}");
        let mut bound = None;
        while t0.elapsed() < Duration::from_secs(30) {
            let list = pods.list(&ListParams::default().labels(&selector)).await.unwrap();
            if let Some(p) = list
                .items
                .into_iter()
                .find(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
            {
                bound = p.metadata.name;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        took.push(t0.elapsed());
        let name = bound.expect("bound within 30 s");
        set_pod_phase(&client, BENCH_NS, &name, "Succeeded").await;
        // The node is free again once Tessera has seen the end.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    took.sort();
    let p = |q: f64| took[((took.len() as f64 * q).ceil() as usize).saturating_sub(1)];
    eprintln!(
        "kubectl apply of a 8-GPU Job → its pod bound by Tessera, {} runs: p50 {:?}, p99 {:?}, max {:?}",
        took.len(),
        p(0.5),
        p(0.99),
        took[took.len() - 1]
    );
    server.kill();
}
