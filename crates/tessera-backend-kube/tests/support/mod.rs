//! A real Kubernetes control plane for the tests: etcd, kube-apiserver and
//! kube-controller-manager (built by `scripts/kube-test-cluster.sh`, cached outside the checkout)
//! on free loopback ports with a private data directory, the secure port only, a generated CA
//! and an admin token. One cluster per scope (a test module: its tests share it, and no other
//! module's objects are in it), started by the first test that asks (about 6 s) and killed
//! when the test binary exits (the processes are started by a thread
//! that lives as long as the binary, with a parent-death signal).
//!
//! No scheduler, and no kubelet unless a test asks for the real one ([`kubelet`]): tests create
//! Node objects and play the kubelet by patching pod status, and the MIG manager by setting node labels and capacity. A DCGM
//! exporter needs real GPUs: tests stand one in with a loopback HTTP server serving its text,
//! behind an exporter pod object that shows its address.

#![allow(dead_code)]

pub mod kubelet;

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use serde_json::{Value, json};
use tessera_backend::BackendEvent;
use tokio::sync::mpsc::UnboundedReceiver;

/// A running test cluster.
pub struct Cluster {
    pub dir: PathBuf,
    pub bin: PathBuf,
    pub kubeconfig: PathBuf,
    pub url: String,
    pub token: String,
}

/// The clusters by scope, each started once.
static CLUSTERS: Mutex<BTreeMap<&'static str, &'static OnceLock<Result<Cluster, String>>>> =
    Mutex::new(BTreeMap::new());

/// The directory holding kube-apiserver, kube-controller-manager and kubectl.
pub fn bin_dir() -> Result<PathBuf, String> {
    if let Ok(d) = std::env::var("TESSERA_KUBE_BIN_DIR") {
        return Ok(PathBuf::from(d));
    }
    let cache = std::env::var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache"))
        .join("tessera");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&cache)
        .map_err(|_| format!("no {}", cache.display()))?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|b| b.join("kube-apiserver").is_file() && b.join("kube-controller-manager").is_file())
        .collect();
    found.sort();
    found.pop().ok_or_else(|| {
        format!(
            "no kube-apiserver under {}: run scripts/kube-test-cluster.sh first (it builds one, about 11 minutes cold on 2 cores)",
            cache.display()
        )
    })
}

/// Ports below the ephemeral range: one from `bind(…:0)` was once taken by an outgoing
/// connection before the controller-manager bound it (see [`tessera_testdb::free_port`]).
use tessera_testdb::free_port;

/// Runs `cmd` with `sh -c` in `dir`; its standard error is the error.
fn sh(dir: &Path, cmd: &str) -> Result<(), String> {
    let out = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .current_dir(dir)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("{cmd}: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(())
}

fn spawn(cmd: &mut Command, log: &Path) -> Result<Child, String> {
    let f = std::fs::File::create(log).map_err(|e| e.to_string())?;
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    cmd.stdout(Stdio::from(f.try_clone().unwrap()))
        .stderr(Stdio::from(f))
        .spawn()
        .map_err(|e| format!("{:?}: {e}", cmd.get_program()))
}

fn start(scope: &str) -> Result<Cluster, String> {
    let bin = bin_dir()?;
    // The scope is a module path: no `:` in the directory (KUBECONFIG is a `:`-separated list).
    let scope: String = scope
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let dir = std::env::temp_dir().join(format!("tessera-kube-{}-{scope}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // Data directories of earlier runs whose process is gone.
    for e in std::fs::read_dir(std::env::temp_dir()).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if let Some(pid) = name
            .strip_prefix("tessera-kube-")
            .and_then(|p| p.split('-').next()?.parse::<u32>().ok())
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    std::fs::create_dir_all(dir.join("etcd")).map_err(|e| e.to_string())?;
    // Certificates: a CA, the API server's serving certificate, the service-account key pair.
    sh(
        &dir,
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=tessera-test-ca 2>/dev/null && \
         openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj /CN=kube-apiserver 2>/dev/null && \
         printf 'subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\\n' > san.ext && \
         openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 2 -extfile san.ext 2>/dev/null && \
         openssl genrsa -out sa.key 2048 2>/dev/null && openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null",
    )?;
    let token = format!("admin-{}", std::process::id());
    std::fs::write(dir.join("tokens.csv"), format!("{token},admin,admin,system:masters\n"))
        .map_err(|e| e.to_string())?;
    let (etcd_c, etcd_p, api, cm) = (free_port(), free_port(), free_port(), free_port());
    let url = format!("https://127.0.0.1:{api}");
    let d = |f: &str| dir.join(f).display().to_string();
    let ca = std::fs::read(dir.join("ca.crt")).map_err(|e| e.to_string())?;
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {url}\n    certificate-authority-data: {}\nusers:\n- name: admin\n  user:\n    token: {token}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: admin\ncurrent-context: test\n",
            base64(&ca)
        ),
    )
    .map_err(|e| e.to_string())?;

    let (tx, rx) = std::sync::mpsc::channel();
    let (dir2, bin2, url2) = (dir.clone(), bin.clone(), url.clone());
    let kc = kubeconfig.display().to_string();
    // The processes die with the test binary: their parent-death signal fires when the thread
    // that started them ends, so that thread never ends.
    std::thread::spawn(move || {
        let dir = dir2;
        let d = |f: &str| dir.join(f).display().to_string();
        let r = (|| -> Result<Vec<Child>, String> {
            let etcd = spawn(
                Command::new("etcd")
                    .args(["--name", "default", "--data-dir", &d("etcd")])
                    .args(["--listen-client-urls", &format!("http://127.0.0.1:{etcd_c}")])
                    .args(["--advertise-client-urls", &format!("http://127.0.0.1:{etcd_c}")])
                    .args(["--listen-peer-urls", &format!("http://127.0.0.1:{etcd_p}")])
                    .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{etcd_p}")])
                    .args(["--initial-cluster", &format!("default=http://127.0.0.1:{etcd_p}")])
                    .args(["--listen-metrics-urls", &format!("http://127.0.0.1:{}", free_port())]),
                &dir.join("etcd.log"),
            )?;
            let apiserver = spawn(
                Command::new(bin2.join("kube-apiserver"))
                    .args(["--etcd-servers", &format!("http://127.0.0.1:{etcd_c}")])
                    .args([
                        "--insecure-port=0",
                        "--bind-address=127.0.0.1",
                        "--advertise-address=127.0.0.1",
                    ])
                    .arg(format!("--secure-port={api}"))
                    .args([
                        "--tls-cert-file",
                        &d("apiserver.crt"),
                        "--tls-private-key-file",
                        &d("apiserver.key"),
                    ])
                    .args(["--client-ca-file", &d("ca.crt"), "--token-auth-file", &d("tokens.csv")])
                    .args(["--authorization-mode=RBAC", "--service-cluster-ip-range=10.96.0.0/16"])
                    .args([
                        "--endpoint-reconciler-type=none",
                        "--disable-admission-plugins=ServiceAccount",
                    ])
                    // The kubelet tests' node has an InternalIP the API server reaches it at
                    // (for logs) and a Hostname nothing resolves: the address first.
                    .args(["--kubelet-preferred-address-types=InternalIP,Hostname"])
                    .args(["--service-account-issuer=https://kubernetes.default.svc"])
                    .args(["--service-account-key-file", &d("sa.pub")])
                    .args(["--service-account-signing-key-file", &d("sa.key")])
                    .args(["--cert-dir", &d("certs"), "--logtostderr=true", "--v=0"]),
                &dir.join("apiserver.log"),
            )?;
            let cm = spawn(
                Command::new(bin2.join("kube-controller-manager"))
                    .args(["--kubeconfig", &kc, "--port=0", &format!("--secure-port={cm}")])
                    .args(["--bind-address=127.0.0.1", "--leader-elect=false"])
                    .args(["--controllers=*,-nodelifecycle,-nodeipam,-route,-service"])
                    .args([
                        "--service-account-private-key-file",
                        &d("sa.key"),
                        "--root-ca-file",
                        &d("ca.crt"),
                    ])
                    .args([
                        "--cluster-signing-cert-file",
                        &d("ca.crt"),
                        "--cluster-signing-key-file",
                        &d("ca.key"),
                    ])
                    .args(["--cert-dir", &d("cm-certs"), "--logtostderr=true", "--v=0"]),
                &dir.join("controller-manager.log"),
            )?;
            Ok(vec![etcd, apiserver, cm])
        })();
        let _ = url2;
        match r {
            Ok(children) => {
                let _ = tx.send(Ok(()));
                // Keep the children (and this thread) for the life of the test binary.
                let _keep = children;
                loop {
                    std::thread::park();
                }
            }
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        }
    });
    rx.recv().map_err(|e| e.to_string())??;
    let _ = d;
    Ok(Cluster {
        dir,
        bin,
        kubeconfig,
        url,
        token,
    })
}

fn base64(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// The cluster of `scope` (a test module's name: the modules of one test binary do not share
/// a cluster), started on first use and ready (API server answering, default namespace and
/// bootstrap RBAC roles present).
pub async fn cluster_in(scope: &'static str) -> &'static Cluster {
    let cell = *CLUSTERS
        .lock()
        .unwrap()
        .entry(scope)
        .or_insert_with(|| Box::leak(Box::new(OnceLock::new())));
    let c = tokio::task::spawn_blocking(move || {
        cell.get_or_init(|| {
            let t0 = Instant::now();
            let c = start(scope)?;
            eprintln!(
                "test cluster processes started in {:?} ({})",
                t0.elapsed(),
                c.dir.display()
            );
            Ok(c)
        })
    })
    .await
    .unwrap();
    let c = match c {
        Ok(c) => c,
        Err(e) => panic!("test cluster: {e}"),
    };
    let t0 = Instant::now();
    loop {
        if let Ok(client) = c.client().await
            && ready(&client).await
        {
            break;
        }
        if t0.elapsed() > Duration::from_secs(90) {
            let tail = |f: &str, n: usize| {
                let log = std::fs::read_to_string(c.dir.join(f)).unwrap_or_default();
                log.lines().rev().take(n).collect::<Vec<_>>().join("\n")
            };
            panic!(
                "the test cluster did not become ready in 90 s (API server answering /readyz, \
                 the controller-manager's aggregated `edit` role); newest lines first\n\
                 apiserver.log:\n{}\ncontroller-manager.log:\n{}\netcd.log:\n{}",
                tail("apiserver.log", 15),
                tail("controller-manager.log", 10),
                tail("etcd.log", 5)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    c
}

async fn ready(client: &Client) -> bool {
    let req = http::Request::get("/readyz").body(Vec::new()).unwrap();
    if client
        .request_text(req)
        .await
        .map(|t| t.trim() == "ok")
        .unwrap_or(false)
    {
        // The tests lean on the `edit` ClusterRole that tenant groups are bound to: it is
        // aggregated by the controller-manager, so its rules appear a few seconds after start.
        let roles = Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(client.clone());
        return roles
            .get_opt("edit")
            .await
            .ok()
            .flatten()
            .and_then(|r| r.rules)
            .is_some_and(|r| !r.is_empty());
    }
    false
}

impl Cluster {
    /// An admin client through the kubeconfig file (as `KUBECONFIG` would give it).
    pub async fn client(&self) -> Result<Client, String> {
        let kc = Kubeconfig::read_from(&self.kubeconfig).map_err(|e| e.to_string())?;
        let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        Client::try_from(cfg).map_err(|e| e.to_string())
    }

    /// An admin client without kube-rs's own retries, for evictions (a disruption budget's 429
    /// must reach the backend at once): what `connect_default` builds.
    pub async fn evict_client(&self) -> Result<Client, String> {
        let kc = Kubeconfig::read_from(&self.kubeconfig).map_err(|e| e.to_string())?;
        let mut cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        cfg.default_retry = false;
        Client::try_from(cfg).map_err(|e| e.to_string())
    }

    /// Runs the cluster's kubectl with the admin kubeconfig.
    pub fn kubectl(&self, args: &[&str]) -> std::process::Output {
        Command::new(self.bin.join("kubectl"))
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .expect("kubectl runs")
    }
}

/// Creates a GPU node as the kubelet, device plugin and GPU Feature Discovery would show it.
pub async fn gpu_node(client: &Client, name: &str, pool: &str, product: &str, gpus: u32, extra: Value) {
    let nodes = Api::<Node>::all(client.clone());
    let mut labels = json!({
        "tessera.io/pool": pool,
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": gpus.to_string(),
        "kubernetes.io/hostname": name,
    });
    if let Some(m) = extra.get("labels").and_then(Value::as_object) {
        for (k, v) in m {
            labels[k] = v.clone();
        }
    }
    let node: Node = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let mut alloc = json!({"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": gpus.to_string()});
    if let Some(m) = extra.get("allocatable").and_then(Value::as_object) {
        for (k, v) in m {
            alloc[k] = v.clone();
        }
    }
    set_node_status(client, name, alloc, true).await;
}

/// Plays the kubelet: the node's capacity and Ready condition.
pub async fn set_node_status(client: &Client, name: &str, allocatable: Value, ready: bool) {
    let now = "2026-11-30T00:00:00Z";
    Api::<Node>::all(client.clone())
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "capacity": allocatable, "allocatable": allocatable,
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" },
                    "reason": "KubeletReady", "lastHeartbeatTime": now, "lastTransitionTime": now}],
            }})),
        )
        .await
        .unwrap();
}

/// Plays the kubelet: the pod's phase (and a started container for `Running`).
pub async fn set_pod_phase(client: &Client, ns: &str, name: &str, phase: &str) {
    let now = "2026-11-30T12:00:00Z";
    let mut status = json!({"phase": phase, "startTime": now});
    if phase == "Running" {
        status["containerStatuses"] = json!([{"name": "workload", "image": "x", "imageID": "", "ready": true,
            "restartCount": 0, "state": {"running": {"startedAt": now}}}]);
    }
    if phase == "Succeeded" {
        status["containerStatuses"] = json!([{"name": "workload", "image": "x", "imageID": "", "ready": false,
            "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]);
    }
    Api::<Pod>::namespaced(client.clone(), ns)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(json!({"status": status})))
        .await
        .unwrap();
}

/// Plays the kubelet confirming a graceful deletion (no kubelet ever does it here).
pub async fn finish_deletion(client: &Client, ns: &str, name: &str) {
    let _ = Api::<Pod>::namespaced(client.clone(), ns)
        .delete(name, &DeleteParams::default().grace_period(0))
        .await;
}

/// The next event matching `pred` within `within`, or a panic naming what was awaited and what
/// came instead.
pub async fn expect_event(
    rx: &mut UnboundedReceiver<BackendEvent>,
    what: &str,
    within: Duration,
    pred: impl Fn(&BackendEvent) -> bool,
) -> BackendEvent {
    let deadline = tokio::time::Instant::now() + within;
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(ev)) if pred(&ev) => return ev,
            Ok(Some(ev)) => seen.push(ev),
            Ok(None) => panic!("event stream closed while waiting for {what}"),
            Err(_) => panic!("no {what} within {within:?}; saw {seen:?}"),
        }
    }
}

/// Waits for workload `id`'s exit and asserts it succeeded.
pub async fn expect_success(rx: &mut UnboundedReceiver<BackendEvent>, id: u64, within: Duration) {
    let ev = expect_event(
        rx,
        "Exited",
        within,
        |e| matches!(e, BackendEvent::Exited { id: i, .. } if *i == id),
    )
    .await;
    assert!(
        matches!(
            ev,
            BackendEvent::Exited {
                exit: tessera_backend::Exit::Succeeded,
                ..
            }
        ),
        "{ev:?}"
    );
}

/// Waits until `check` holds, polling.
pub async fn eventually<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let t0 = Instant::now();
    while !check().await {
        assert!(t0.elapsed() < within, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A stand-in for one node's DCGM exporter (it needs real GPUs): serves `body` as its metrics
/// text over HTTP on a loopback port, with status `status` (both may change while it runs).
pub fn fake_exporter(state: std::sync::Arc<std::sync::Mutex<(u16, String)>>) -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            let (status, body) = state.lock().unwrap().clone();
            let _ = write!(
                conn,
                "HTTP/1.1 {status} X\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

/// An exporter pod of the GPU Operator's DaemonSet on `node`, as the kubelet shows it once it
/// runs (`ip`, or not running when `None`).
pub async fn exporter_pod(client: &kube::Client, ns: &str, name: &str, node: &str, port: u16, ip: Option<&str>) {
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "nvidia-dcgm-exporter"}},
        "spec": {"nodeName": node, "containers": [{"name": "nvidia-dcgm-exporter",
            "image": "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04",
            "ports": [{"name": "metrics", "containerPort": port}]}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    if let Some(ip) = ip {
        let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}});
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
            .await
            .unwrap();
    }
}
