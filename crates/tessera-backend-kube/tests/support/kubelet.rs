//! A real node beside the test control plane (`support::cluster_in`): a kubelet with containerd and
//! runc (`kubelet-node.sh` next to this file starts them and removes everything it made when the
//! test binary exits), registered as an 8×H100 GPU node with GPU Feature Discovery's labels and
//! `nvidia.com/gpu` as an extended resource. One node per test binary, started by the first
//! test that asks and Ready before it returns (about 13 s). Pods run the local image
//! [`BUSYBOX`] (no registry).
//!
//! The kubelet, the test images and the Debian packages come from `scripts/kube-test-cluster.sh`
//! (through `scripts/kube-test-kubelet.sh`); the node needs root (network namespace, cgroups,
//! mounts). How the network is laid out is described in `kubelet-node.sh`: traffic stays on
//! loopback and on one veth pair into a network namespace the node creates.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::{Cluster, cluster_in};

/// The image workloads run: busybox's applets in `/bin` (`sh`, `echo`, `sleep`, ...).
pub const BUSYBOX: &str = "tessera.test/busybox:1";
/// The GPU node's name.
pub const NODE: &str = "kubelet-h100-0";
/// Its pool (the `tessera.io/pool` label).
pub const POOL: &str = "training";

/// GPU Feature Discovery's labels of an 8×H100 SXM node with MIG off (the MIG manager applied
/// `all-disabled`), and Tessera's pool label.
pub const GFD_LABELS: &[(&str, &str)] = &[
    ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
    ("nvidia.com/gpu.count", "8"),
    ("nvidia.com/gpu.memory", "81559"),
    ("nvidia.com/gpu.family", "hopper"),
    ("nvidia.com/gpu.replicas", "1"),
    ("nvidia.com/gpu.sharing-strategy", "none"),
    ("nvidia.com/mig.capable", "true"),
    ("nvidia.com/mig.config", "all-disabled"),
    ("nvidia.com/mig.config.state", "success"),
    ("tessera.io/pool", POOL),
];

/// The running node.
pub struct KubeletNode {
    pub name: String,
    /// The node's address: the host end of the veth pair, where the kubelet's API listens.
    pub ip: String,
    pub dir: PathBuf,
    /// Held for the life of the test binary: the node tears itself down when this closes.
    _stdin: Mutex<ChildStdin>,
    _stdout: Mutex<BufReader<ChildStdout>>,
}

static NODE_STATE: OnceLock<Result<KubeletNode, String>> = OnceLock::new();

use super::sh;

use tessera_testdb::free_port;

fn start(c: &Cluster) -> Result<KubeletNode, String> {
    if unsafe { libc::geteuid() } != 0 {
        return Err("the kubelet tests run as root (network namespace, cgroups, mounts)".into());
    }
    let kubelet = c.bin.join("kubelet");
    let images = c.bin.join("tessera-test-images.oci.tar");
    for f in [&kubelet, &images] {
        if !f.is_file() {
            return Err(format!(
                "no {}: run scripts/kube-test-cluster.sh (it builds the kubelet and the test images)",
                f.display()
            ));
        }
    }
    let dir = std::env::temp_dir().join(format!("tessera-kubelet-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    // A node identity: a client certificate from the cluster's CA (user system:node:<name>,
    // group system:nodes), bound to the `system:node` role (the API server runs RBAC only).
    let cn = format!("system:node:{NODE}");
    sh(
        &c.dir,
        &format!(
            "openssl req -newkey rsa:2048 -nodes -keyout node.key -out node.csr -subj /O=system:nodes/CN={cn} 2>/dev/null && \
             openssl x509 -req -in node.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out node.crt -days 2 2>/dev/null"
        ),
    )?;
    let out = c.kubectl(&[
        "create",
        "clusterrolebinding",
        &format!("tessera-test-node-{NODE}"),
        "--clusterrole=system:node",
        &format!("--user={cn}"),
    ]);
    if !out.status.success() && !String::from_utf8_lossy(&out.stderr).contains("AlreadyExists") {
        return Err(format!(
            "binding the node's role: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let d = |f: &str| c.dir.join(f).display().to_string();
    let kubeconfig = dir.join("kubelet.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: node\n  user:\n    client-certificate: {}\n    client-key: {}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: node\ncurrent-context: test\n",
            c.url,
            d("ca.crt"),
            d("node.crt"),
            d("node.key")
        ),
    )
    .map_err(|e| e.to_string())?;
    let labels: Vec<String> = GFD_LABELS.iter().map(|(k, v)| format!("{k}={v}")).collect();
    // Beside this file, also when another crate's tests include it.
    let script = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tessera-backend-kube/tests/support/kubelet-node.sh"
    ));
    // Not a child that dies with this binary: it must outlive it to clean up. It learns that the
    // binary is gone when its stdin closes.
    let mut child = Command::new("bash")
        .arg(script)
        .env("DIR", &dir)
        .env("BIN", &c.bin)
        .env("IMAGES", &images)
        .env("NODE", NODE)
        .env("KUBECONFIG", &kubeconfig)
        .env("KUBELET_PORT", free_port().to_string())
        .env("NODE_LABELS", labels.join(","))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    let stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut ip = None;
    loop {
        let mut line = String::new();
        if stdout.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
            return Err(format!(
                "{} ended before the node ran (its error is above)",
                script.display()
            ));
        }
        let line = line.trim();
        if let Some(v) = line.strip_prefix("NODE_IP=") {
            ip = Some(v.to_string());
        } else if line == "READY" {
            break;
        }
    }
    // The child is not waited for: it reaps itself after its teardown (as an orphan).
    std::mem::forget(child);
    Ok(KubeletNode {
        name: NODE.into(),
        ip: ip.ok_or("no NODE_IP from the node script")?,
        dir,
        _stdin: Mutex::new(stdin),
        _stdout: Mutex::new(stdout),
    })
}

/// The scope of the cluster the kubelet joins: a test module that uses the kubelet uses this
/// cluster for all its tests (`cluster_in(KUBELET_SCOPE)`).
pub const KUBELET_SCOPE: &str = "kubelet";

/// The test binary's node (and its cluster, [`KUBELET_SCOPE`]), started on first use:
/// registered, Ready, with `nvidia.com/gpu: 8` in its capacity and allocatable.
pub async fn kubelet_node() -> (&'static Cluster, &'static KubeletNode) {
    let c = cluster_in(KUBELET_SCOPE).await;
    let t0 = Instant::now();
    let n = tokio::task::spawn_blocking(move || NODE_STATE.get_or_init(|| start(c)))
        .await
        .unwrap();
    let n = match n {
        Ok(n) => n,
        Err(e) => panic!("kubelet node: {e}"),
    };
    let client = c.client().await.unwrap();
    let nodes = Api::<Node>::all(client.clone());
    loop {
        let node = nodes.get_opt(NODE).await.ok().flatten();
        let status = node.as_ref().and_then(|n| n.status.as_ref());
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| c.status == "True");
        let has_gpus = status
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get("nvidia.com/gpu"))
            .is_some_and(|q| q.0 == "8");
        if ready && has_gpus {
            break;
        }
        if ready {
            // What the NVIDIA device plugin would advertise: eight whole GPUs (an extended
            // resource; the kubelet keeps it in capacity and derives allocatable from it).
            let gpus = json!({"nvidia.com/gpu": "8"});
            nodes
                .patch_status(
                    NODE,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"capacity": gpus, "allocatable": gpus}})),
                )
                .await
                .unwrap();
        }
        if t0.elapsed() > Duration::from_secs(120) {
            let log = std::fs::read_to_string(n.dir.join("kubelet.log")).unwrap_or_default();
            let tail: String = log
                .lines()
                .rev()
                .take(30)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            panic!("node {NODE} not Ready with 8 GPUs in 120 s (ready: {ready}); kubelet.log ends:\n{tail}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        use std::io::Write;
        // Outside the test harness's capture: how long a node takes is worth seeing.
        let _ = writeln!(
            std::io::stderr(),
            "kubelet node {NODE} ({}) Ready with 8 GPUs in {:?}",
            n.ip,
            t0.elapsed()
        );
    });
    (c, n)
}
