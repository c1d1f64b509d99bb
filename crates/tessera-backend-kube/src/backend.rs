//! [`KubeBackend`]: the backend contract on a Kubernetes API server. Pods are created in the
//! project's namespace and bound by Tessera (Binding subresource); two watches (GPU nodes, and
//! pods labelled `tessera.io/workload`) turn the cluster's changes into backend events, and a
//! periodic read of every node's DCGM exporter turns GPU telemetry into `Telemetry` events.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::json;
use tessera_backend::{
    Backend, BackendError, BackendEvent, Capabilities, DeviceAssignment, Devices, Exit, LogChunk, MigInstance,
    NativeRef, NativeReview, Observation, Orphan, PartitionPlan, PartitionReport, Partitioning, ReconcileReport,
    Resource, RunSpec, TenancySpec,
};
use tessera_model::{Catalogue, Fleet};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::admission;
use crate::dcgm;
use crate::fleet::{self, LABEL_MIG_CONFIG, LABEL_MIG_STATE, NodeView};
use crate::mig::{self, LAYOUT_ANNOTATION, NodeLayout, Placed};
use crate::names::{self, FIELD_MANAGER, LABEL_WORKLOAD};
use crate::pods::{self, PodState};
use crate::tenancy::{self, kube_err};

/// How the Kubernetes backend runs.
#[derive(Clone, Debug)]
pub struct KubeConfig {
    /// The node label naming a node's Tessera pool (`tessera.io/pool`).
    pub pool_label: String,
    /// The topology levels above the node, lowest first, each from a node label
    /// (`rack=topology.kubernetes.io/rack`, `nvidia.com/gpu.clique`); empty: every pool flat.
    pub topology_levels: Vec<fleet::TopologyLevel>,
    /// The pool of GPU nodes without that label.
    pub default_pool: String,
    /// Pools of time-sliced nodes where one GPU may hold several tenants' fractions. Elsewhere a
    /// shared node holds one tenant's fractions: the device plugin, not Tessera, picks which
    /// time-sliced GPU a pod gets, so keeping tenants apart per GPU takes keeping them apart
    /// per node.
    pub mixing_pools: std::collections::BTreeSet<String>,
    /// Prefix of the namespaces of tenant projects (`tessera-`).
    pub namespace_prefix: String,
    /// Namespace and name of the MIG manager's ConfigMap (key `config.yaml`).
    pub mig_namespace: String,
    pub mig_configmap: String,
    /// How long to wait for the MIG manager to apply a config.
    pub mig_timeout: Duration,
    /// After a stop's grace period, how much longer a pod may take to go before Tessera
    /// deletes it forcibly (a node that is gone never confirms the deletion).
    pub force_delete_after: Duration,
    /// Namespace and label selector of the DCGM exporter's pods (the GPU Operator's
    /// `nvidia-dcgm-exporter` DaemonSet: one pod per GPU node).
    pub dcgm_namespace: String,
    pub dcgm_selector: String,
    /// How often every exporter is read (`None`: no telemetry). The exporter itself samples
    /// every 30 s by default.
    pub telemetry_every: Option<Duration>,
    /// How long a finished pod of a workload Tessera no longer expects (its result recorded)
    /// is kept for its log before reconcile deletes it.
    pub finished_pod_ttl: Duration,
    /// Tessera's own identity on the cluster (`NAMESPACE/NAME` of its service account, or a
    /// user name): each tenant namespace gets a RoleBinding giving it the `tessera-workloads`
    /// ClusterRole there, so that its cluster-wide role needs no pod creation or namespace
    /// deletion. `None`: no such binding (Tessera then needs those rights cluster-wide).
    pub identity: Option<String>,
    /// Namespaces whose GPU pods are not Tessera's business (the GPU Operator's own
    /// validators): its admission passes them unchanged.
    pub admission_exempt: std::collections::BTreeSet<String>,
}

impl Default for KubeConfig {
    fn default() -> Self {
        KubeConfig {
            pool_label: "tessera.io/pool".into(),
            topology_levels: Vec::new(),
            default_pool: "default".into(),
            mixing_pools: Default::default(),
            namespace_prefix: "tessera-".into(),
            mig_namespace: "gpu-operator".into(),
            mig_configmap: "default-mig-parted-config".into(),
            mig_timeout: Duration::from_secs(600),
            force_delete_after: Duration::from_secs(30),
            dcgm_namespace: "gpu-operator".into(),
            dcgm_selector: "app=nvidia-dcgm-exporter".into(),
            telemetry_every: Some(Duration::from_secs(30)),
            finished_pod_ttl: Duration::from_secs(3600),
            identity: None,
            admission_exempt: ["gpu-operator", "kube-system", "tessera-system"]
                .into_iter()
                .map(String::from)
                .collect(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    Accepted,
    Started,
    Running,
    Ended,
}

struct Tracked {
    ns: String,
    /// The attempt whose pods these are ([`names::attempt_pod_name`]).
    attempt: u32,
    stage: Stage,
    stopping: bool,
    /// The pods of the workload's node-shares by gang index (one unless it is a multi-node
    /// gang) and the state each last showed.
    pods: Vec<(String, PodState)>,
    /// The UID of each pod, by name, from its creation (or from the first sight of it in its
    /// namespace under its name, after a restart): a pod with the name but another UID is
    /// not Tessera's.
    uids: HashMap<String, String>,
    /// The pods confirmed gone.
    gone: std::collections::HashSet<String>,
    /// Whole GPUs of a one-pod workload (0 for anything else): the devices the exporter sees
    /// its pod on are reported as `Bound` once they are all seen.
    whole_gpus: u8,
    /// The devices last reported as `Bound`.
    reported: Vec<u8>,
    /// A pod made with the cluster's own tools (`kubectl`) that Tessera admitted: bound, not
    /// made, by Tessera, and its deletion by its owner withdraws the workload.
    native: Option<NativeRef>,
}

/// The whole GPUs of a one-pod workload (0 for anything else): see [`Tracked::whole_gpus`].
fn whole_gpus(spec: &RunSpec) -> u8 {
    match spec.devices {
        Devices::Count {
            resource: Resource::Gpu,
            count,
        } if spec.gang.is_empty() => count,
        _ => 0,
    }
}

/// The pods of a native workload, in gang order: a gang's members, else the one pod.
fn native_pods(native: &NativeRef) -> Vec<(String, String)> {
    if native.is_gang() {
        native.members.clone()
    } else {
        vec![(native.name.clone(), native.uid.clone())]
    }
}

/// A native gang whose pods are still being created by its Job: the members seen so far.
struct Forming {
    ns: String,
    job: String,
    ask: Box<tessera_backend::NativeAsk>,
    /// Member pods by name: their UIDs.
    members: std::collections::BTreeMap<String, String>,
}

/// Whether a pod that carries a tracked workload's label is that workload's pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Claim {
    /// Node-share `index` of the workload.
    Ours(usize),
    /// Someone else's pod wearing the label: never adopted, never counted as a loss.
    Stranger,
}

impl Tracked {
    fn new(ns: &str, attempt: u32, stage: Stage, stopping: bool, names: impl IntoIterator<Item = String>) -> Tracked {
        Tracked {
            ns: ns.to_string(),
            attempt,
            stage,
            stopping,
            pods: names.into_iter().map(|n| (n, PodState::Pending)).collect(),
            uids: HashMap::new(),
            gone: Default::default(),
            whole_gpus: 0,
            reported: Vec::new(),
            native: None,
        }
    }

    /// The tracking of a native workload: its pod, or a gang's member pods in gang order,
    /// each name and UID known from the start.
    fn native(native: &NativeRef, stage: Stage) -> Tracked {
        let pods = native_pods(native);
        let mut t = Tracked::new(&native.namespace, 0, stage, false, pods.iter().map(|(n, _)| n.clone()));
        t.uids.extend(pods);
        t.native = Some(native.clone());
        t
    }

    /// Tracks the devices of `spec`'s pod when it is a one-pod workload of whole GPUs.
    fn whole_gpus_of(mut self, spec: &RunSpec) -> Tracked {
        self.whole_gpus = whole_gpus(spec);
        self
    }

    fn names(&self) -> Vec<String> {
        self.pods.iter().map(|(n, _)| n.clone()).collect()
    }

    /// Whether `pod` is one of this workload's pods: in the workload's namespace (which only
    /// its tenant project and Tessera may write), under one of the attempt's names, with the
    /// UID Tessera recorded for it. A label alone proves nothing: any tenant can set it. The
    /// first sight of a pod under its name in its namespace records its UID.
    fn claim(&mut self, pod: &Pod) -> Claim {
        let (Some(ns), Some(name)) = (pod.metadata.namespace.as_deref(), pod.metadata.name.as_deref()) else {
            return Claim::Stranger;
        };
        if ns != self.ns {
            return Claim::Stranger;
        }
        let Some(index) = self.pods.iter().position(|(n, _)| n == name) else {
            return Claim::Stranger;
        };
        match (self.uids.get(name), pod.metadata.uid.as_deref()) {
            (Some(known), Some(uid)) if known != uid => Claim::Stranger,
            (None, Some(uid)) => {
                self.uids.insert(name.to_string(), uid.to_string());
                Claim::Ours(index)
            }
            _ => Claim::Ours(index),
        }
    }
}

#[derive(Default)]
struct State {
    nodes: HashMap<String, NodeView>,
    tracked: HashMap<u64, Tracked>,
    namespaces: std::collections::HashSet<String>,
    /// Pools that partition with MIG: their nodes' MIG modes are reported.
    mig_pools: std::collections::HashSet<String>,
    /// The fleet last reported (at connect, or by the last `FleetChanged`).
    fleet: Option<Arc<Fleet>>,
    /// Strangers' pods already reported, by UID.
    strangers: std::collections::HashSet<String>,
    /// Tenant project namespaces: their tenant and project.
    projects: HashMap<String, (String, String)>,
    /// Native pods already reported (submitted or refused), by UID.
    submitted: std::collections::HashSet<String>,
    /// Native gangs whose pods are not all there yet, by their Job's UID.
    forming: HashMap<String, Forming>,
    /// Tenant namespaces' UIDs (the controller reference of Tessera's pods).
    namespace_uids: HashMap<String, String>,
}

struct Shared {
    client: Client,
    /// The same API server through a client that never retries on its own (evictions: a
    /// disruption budget's 429 must reach Tessera at once).
    evict_client: Client,
    cfg: KubeConfig,
    state: Mutex<State>,
    tx: mpsc::UnboundedSender<BackendEvent>,
    rx: Mutex<Option<mpsc::UnboundedReceiver<BackendEvent>>>,
    /// One partition at a time per node: the MIG manager applies one config per node.
    node_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// Tessera's backend on a Kubernetes cluster with the NVIDIA GPU Operator.
pub struct KubeBackend {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for KubeBackend {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Now, as the API server writes times (RFC 3339).
fn k8s_now() -> String {
    jiff::Timestamp::now().to_string()
}

fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

impl KubeBackend {
    /// Reads the GPU nodes into a fleet and starts the node and pod watches. Call inside a
    /// Tokio runtime. Evictions go through `client` too: if it retries on its own (kube-rs's
    /// default), a disruption budget's refusal is retried silently inside the client for
    /// minutes; give a client without retries for them with [`KubeBackend::connect_with`].
    pub async fn connect(client: Client, cfg: KubeConfig) -> Result<(KubeBackend, Fleet), BackendError> {
        Self::connect_with(client.clone(), client, cfg).await
    }

    /// [`KubeBackend::connect`] with a second client for evictions, one built without kube-rs's
    /// default retries (`Config::default_retry = false`), so that a disruption budget's refusal
    /// is seen at once ([`crate::connect_default`] makes one).
    pub async fn connect_with(
        client: Client,
        evict_client: Client,
        cfg: KubeConfig,
    ) -> Result<(KubeBackend, Fleet), BackendError> {
        let nodes = Api::<Node>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| kube_err("listing nodes", e))?;
        let mut views: Vec<NodeView> = nodes
            .items
            .iter()
            .filter_map(|n| fleet::node_view_with(n, &cfg.pool_label, &cfg.topology_levels))
            .collect();
        views.sort_by(|a, b| a.name.cmp(&b.name));
        let fleet = fleet_of(&views, &cfg)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let mig_pools = mig_pools(&fleet);
        // What the control plane must learn at once: nodes already closed to new work, and
        // the MIG mode of every GPU in a MIG pool (a node there with MIG off serves whole GPUs).
        for v in &views {
            for change in fleet::initial_changes(v) {
                let _ = tx.send(BackendEvent::NodeChanged {
                    node: v.name.clone(),
                    change,
                });
            }
            if mig_pools.contains(v.pool.as_deref().unwrap_or(&cfg.default_pool)) {
                for e in mig_modes(v) {
                    let _ = tx.send(e);
                }
            }
        }
        let shared = Arc::new(Shared {
            client,
            evict_client,
            cfg,
            state: Mutex::new(State {
                nodes: views.into_iter().map(|v| (v.name.clone(), v)).collect(),
                mig_pools,
                fleet: Some(Arc::new(fleet.clone())),
                ..Default::default()
            }),
            tx,
            rx: Mutex::new(Some(rx)),
            node_locks: Mutex::new(HashMap::new()),
        });
        let mut tasks = vec![
            tokio::spawn(watch_nodes(Arc::downgrade(&shared), shared.client.clone())),
            tokio::spawn(watch_pods(Arc::downgrade(&shared), shared.client.clone())),
            tokio::spawn(watch_native(Arc::downgrade(&shared), shared.client.clone())),
        ];
        if let Some(every) = shared.cfg.telemetry_every {
            tasks.push(tokio::spawn(read_exporters(Arc::downgrade(&shared), every)));
        }
        Ok((KubeBackend { shared, tasks }, fleet))
    }

    /// The client this backend talks through.
    pub fn client(&self) -> &Client {
        &self.shared.client
    }

    /// The namespace of a tenant project.
    pub fn namespace_of(&self, tenant: &str, project: &str) -> String {
        names::namespace(&self.shared.cfg.namespace_prefix, tenant, project)
    }
}

/// The container whose log is the workload's: `workload` in the pods Tessera makes; in a pod
/// made with `kubectl` (admitted by the webhook) the first container asking for a GPU, else its
/// first container.
fn log_container(pod: &Pod) -> Option<String> {
    let containers = &pod.spec.as_ref()?.containers;
    let gpu = |c: &&k8s_openapi::api::core::v1::Container| {
        c.resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .is_some_and(|l| l.keys().any(|k| k.starts_with("nvidia.com/")))
    };
    containers
        .iter()
        .find(|c| c.name == "workload")
        .or_else(|| containers.iter().find(gpu))
        .or(containers.first())
        .map(|c| c.name.clone())
}

/// Whether a pod's container has started (its log exists).
fn pod_started(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.state.as_ref().is_some_and(|st| st.waiting.is_none()))
        })
}

/// The MIG mode of each GPU of a node in a MIG pool, as its labels and resources show it
/// (pending while the MIG manager applies a config).
fn mig_modes(v: &NodeView) -> Vec<BackendEvent> {
    let pending = matches!(v.mig_state.as_deref(), Some("pending" | "rebooting"));
    (0..v.gpus.min(16) as u8)
        .map(|gpu| BackendEvent::MigMode {
            node: v.name.clone(),
            gpu,
            enabled: v.mig_enabled,
            pending,
        })
        .collect()
}

/// The fleet of these GPU nodes, as at connect and after every node change
/// ([`fleet::fleet_toml`] read back as a [`Fleet`]).
fn fleet_of(views: &[NodeView], cfg: &KubeConfig) -> Result<Fleet, BackendError> {
    let toml = fleet::fleet_toml(views, &Catalogue::builtin(), &cfg.default_pool, &cfg.mixing_pools)
        .map_err(BackendError::Rejected)?;
    let fleet = Fleet::from_toml(&toml, "cluster").map_err(|e| BackendError::Rejected(e.to_string()))?;
    fleet::with_levels(fleet, views, &cfg.topology_levels).map_err(BackendError::Rejected)
}

/// The pools of `fleet` that partition with MIG.
fn mig_pools(fleet: &Fleet) -> std::collections::HashSet<String> {
    fleet
        .pools
        .iter()
        .filter(|p| p.sharing == tessera_model::Sharing::Mig)
        .map(|p| p.name.clone())
        .collect()
}

/// How many DCGM exporters are read at the same time.
const EXPORTERS_AT_ONCE: usize = 16;

/// Every `every`: reads the DCGM exporter of each GPU node (its pods, found by the configured
/// namespace and selector, each read at its pod IP on its `metrics` port, else its first
/// container port, else 9400) and sends the GPUs it describes as one `Telemetry` event. An
/// exporter that cannot be read is left out of that pass, with a warning.
async fn read_exporters(shared: Weak<Shared>, every: Duration) {
    let http = match reqwest::Client::builder()
        .timeout(every.min(Duration::from_secs(10)))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "no HTTP client for the DCGM exporters: no telemetry");
            return;
        }
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(sh) = shared.upgrade() else { return };
        let cfg = &sh.cfg;
        let list = ListParams::default().labels(&cfg.dcgm_selector);
        let exporters = match Api::<Pod>::namespaced(sh.client.clone(), &cfg.dcgm_namespace)
            .list(&list)
            .await
        {
            Ok(l) => l.items,
            Err(e) => {
                tracing::warn!(error = %e, namespace = %cfg.dcgm_namespace, "cannot list the DCGM exporter's pods");
                continue;
            }
        };
        let reads = exporters.iter().filter_map(exporter_url).map(|(node, url)| {
            let http = http.clone();
            async move {
                let text = async { http.get(&url).send().await?.error_for_status()?.text().await }.await;
                (node, url, text)
            }
        });
        // A few nodes at a time: a large cluster is not asked all at once.
        let texts: Vec<_> = futures::stream::iter(reads)
            .buffer_unordered(EXPORTERS_AT_ONCE)
            .collect()
            .await;
        // Our pods by namespace and name, as they are now.
        let ours: HashMap<String, HashMap<String, u64>> = {
            let st = sh.state.lock().expect("lock");
            let mut m: HashMap<String, HashMap<String, u64>> = HashMap::new();
            for (id, t) in &st.tracked {
                let pods = m.entry(t.ns.clone()).or_default();
                pods.extend(t.pods.iter().map(|(p, _)| (p.clone(), *id)));
            }
            m
        };
        let workload_of = |ns: &str, pod: &str| ours.get(ns)?.get(pod).copied();
        let mut gpus = Vec::new();
        for (node, url, text) in texts {
            let series = text
                .map_err(|e| e.to_string())
                .and_then(|t| dcgm::parse_exposition(&t, dcgm::is_read));
            match series {
                Ok(series) => gpus.extend(dcgm::samples(&node, &series, workload_of)),
                Err(e) => tracing::warn!(%node, %url, error = %e, "cannot read the DCGM exporter"),
            }
        }
        // The devices the exporter sees each whole-GPU pod on: the engine's booking follows
        // them (before the telemetry, so that what it says lands on the right workloads).
        let mut seen: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        for g in &gpus {
            for w in g.whole_holders() {
                seen.entry(w).or_default().push(g.gpu);
            }
        }
        let mut bound = Vec::new();
        {
            let mut st = sh.state.lock().expect("lock");
            for (id, mut devices) in seen {
                devices.sort_unstable();
                if let Some(t) = st.tracked.get_mut(&id)
                    && t.stage == Stage::Running
                    && !t.stopping
                    && usize::from(t.whole_gpus) == devices.len()
                    && t.reported != devices
                {
                    t.reported = devices.clone();
                    bound.push(BackendEvent::Bound {
                        id,
                        bound: tessera_backend::Bound {
                            gpus: devices,
                            mig: None,
                        },
                    });
                }
            }
        }
        for e in bound {
            let _ = sh.tx.send(e);
        }
        if !gpus.is_empty() {
            let _ = sh.tx.send(BackendEvent::Telemetry { at_ms: now_ms(), gpus });
        }
    }
}

/// The node and metrics URL of a running DCGM exporter pod.
fn exporter_url(pod: &Pod) -> Option<(String, String)> {
    let status = pod.status.as_ref()?;
    if status.phase.as_deref() != Some("Running") {
        return None;
    }
    let ip = status.pod_ip.as_deref()?;
    let spec = pod.spec.as_ref()?;
    let node = spec.node_name.clone()?;
    let ports: Vec<_> = spec.containers.iter().flat_map(|c| c.ports.iter().flatten()).collect();
    let port = ports
        .iter()
        .find(|p| p.name.as_deref() == Some("metrics"))
        .or(ports.first())
        .map_or(9400, |p| p.container_port);
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_string()
    };
    Some((node, format!("http://{host}:{port}/metrics")))
}

async fn watch_nodes(shared: Weak<Shared>, client: Client) {
    let stream = watcher(Api::<Node>::all(client), watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    loop {
        let ev = match stream.try_next().await {
            Ok(Some(ev)) => ev,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "node watch");
                continue;
            }
        };
        let Some(sh) = shared.upgrade() else { return };
        let (node, gone) = match ev {
            watcher::Event::Apply(n) | watcher::Event::InitApply(n) => (n, false),
            watcher::Event::Delete(n) => (n, true),
            watcher::Event::Init | watcher::Event::InitDone => continue,
        };
        let name = node.metadata.name.clone().unwrap_or_default();
        let view = if gone {
            None
        } else {
            fleet::node_view_with(&node, &sh.cfg.pool_label, &sh.cfg.topology_levels)
        };
        let mut st = sh.state.lock().unwrap();
        let old = st.nodes.get(&name).cloned();
        for change in fleet::changes(old.as_ref(), view.as_ref()) {
            let _ = sh.tx.send(BackendEvent::NodeChanged {
                node: name.clone(),
                change,
            });
        }
        if let Some(v) = &view
            && st.mig_pools.contains(v.pool.as_deref().unwrap_or(&sh.cfg.default_pool))
            && old
                .as_ref()
                .is_none_or(|o| (o.mig_enabled, &o.mig_state) != (v.mig_enabled, &v.mig_state))
        {
            for e in mig_modes(v) {
                let _ = sh.tx.send(e);
            }
        }
        let changed = old != view;
        match view {
            Some(v) => st.nodes.insert(name, v),
            None => st.nodes.remove(&name),
        };
        if changed {
            refleet(&sh, &mut st);
        }
    }
}

/// Rebuilds the fleet from the GPU nodes as they are now and, when it differs from the one last
/// reported, reports it (`FleetChanged`, after the node's `NodeChanged` events): a node that
/// joined, left, or whose GPUs, pool or model changed is part of the fleet without a restart.
/// A fleet that cannot be built (no GPU node left) is not reported; the nodes' removal is.
fn refleet(sh: &Shared, st: &mut State) {
    let mut views: Vec<NodeView> = st.nodes.values().cloned().collect();
    views.sort_by(|a, b| a.name.cmp(&b.name));
    let fleet = match fleet_of(&views, &sh.cfg) {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(error = %e, "the cluster's GPU nodes make no fleet now; keeping the last one");
            return;
        }
    };
    if st.fleet.as_deref() == Some(&fleet) {
        return;
    }
    let pools = mig_pools(&fleet);
    // Nodes of a pool that became a MIG pool: their GPUs' MIG modes, as at connect.
    for v in &views {
        let pool = v.pool.as_deref().unwrap_or(&sh.cfg.default_pool);
        if pools.contains(pool) && !st.mig_pools.contains(pool) {
            for e in mig_modes(v) {
                let _ = sh.tx.send(e);
            }
        }
    }
    st.mig_pools = pools;
    tracing::info!(
        nodes = fleet.nodes.len(),
        gpus = fleet.gpu_count(),
        "the cluster's GPU nodes changed: reporting the new fleet"
    );
    let fleet = Arc::new(fleet);
    st.fleet = Some(fleet.clone());
    let _ = sh.tx.send(BackendEvent::FleetChanged { fleet });
}

async fn watch_pods(shared: Weak<Shared>, client: Client) {
    let cfg = watcher::Config::default().labels(LABEL_WORKLOAD);
    let stream = watcher(Api::<Pod>::all(client.clone()), cfg).default_backoff();
    let mut stream = std::pin::pin!(stream);
    // During a (re-)list: the tracked workloads whose pods existed before it, and those it saw.
    let mut listing: Option<(std::collections::HashSet<u64>, std::collections::HashSet<u64>)> = None;
    loop {
        let ev = match stream.next().await {
            Some(Ok(ev)) => ev,
            None => return,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "pod watch");
                continue;
            }
        };
        let Some(sh) = shared.upgrade() else { return };
        match ev {
            watcher::Event::Apply(p) => sh.on_pod(&p),
            watcher::Event::InitApply(p) => {
                if let (Some(id), Some((_, seen))) = (pods::workload_id(&p), listing.as_mut()) {
                    seen.insert(id);
                }
                sh.on_pod(&p)
            }
            watcher::Event::Delete(p) => sh.on_pod_deleted(&p),
            // A (re-)list: pods deleted before it began (while the watch was not running or was
            // being re-established) send no Delete; a tracked pod that existed before the list
            // and is not in it was deleted.
            watcher::Event::Init => {
                let st = sh.state.lock().unwrap();
                let before = st
                    .tracked
                    .iter()
                    .filter(|(_, t)| t.stage >= Stage::Started && t.stage != Stage::Ended)
                    .map(|(id, _)| *id)
                    .collect();
                listing = Some((before, std::collections::HashSet::new()));
            }
            // The list may have run after the Init event (pages are fetched after it is sent),
            // so the candidates are the tracked pods before or after it that the list did not
            // show; each is confirmed gone with a read (a pod created after the list is not).
            watcher::Event::InitDone => {
                if let Some((mut candidates, seen)) = listing.take() {
                    let now: Vec<(u64, String, Vec<String>)> = {
                        let st = sh.state.lock().unwrap();
                        candidates.extend(
                            st.tracked
                                .iter()
                                .filter(|(_, t)| t.stage >= Stage::Started && t.stage != Stage::Ended)
                                .map(|(id, _)| *id),
                        );
                        candidates
                            .difference(&seen)
                            .filter_map(|id| st.tracked.get(id).map(|t| (*id, t.ns.clone(), t.names())))
                            .collect()
                    };
                    'workloads: for (id, ns, names) in now {
                        for name in names {
                            match Api::<Pod>::namespaced(client.clone(), &ns).get_opt(&name).await {
                                Ok(None) => {
                                    sh.on_pod_gone(id, &name, None);
                                    continue 'workloads;
                                }
                                Ok(Some(_)) => {}
                                Err(e) => {
                                    tracing::warn!(error = %e, pod = %name, "checking a pod missing from the list")
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Watches the pods that name Tessera as their scheduler and are not bound yet: each one made
/// with the cluster's own tools (not by Tessera) in a tenant project's namespace is read as
/// the admission reads it and reported once, as a `Submitted` workload or, when it breaks the
/// rules (it reached the cluster without the webhook), as a refusal told on the pod.
async fn watch_native(shared: Weak<Shared>, client: Client) {
    let cfg = watcher::Config::default().fields(&format!(
        "spec.schedulerName={},spec.nodeName=",
        admission::SCHEDULER_NAME
    ));
    let stream = watcher(Api::<Pod>::all(client), cfg).default_backoff();
    let mut stream = std::pin::pin!(stream);
    loop {
        let ev = match stream.next().await {
            Some(Ok(ev)) => ev,
            None => return,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "native pod watch");
                continue;
            }
        };
        let Some(sh) = shared.upgrade() else { return };
        match ev {
            watcher::Event::Apply(p) | watcher::Event::InitApply(p) => sh.on_native_pod(&p).await,
            watcher::Event::Delete(p) => {
                if let Some(uid) = &p.metadata.uid {
                    let mut st = sh.state.lock().unwrap();
                    st.submitted.remove(uid);
                    // A member of a gang still forming is no member once gone.
                    for f in st.forming.values_mut() {
                        f.members.retain(|_, u| u != uid);
                    }
                    st.forming.retain(|_, f| !f.members.is_empty());
                }
            }
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    }
}

impl Shared {
    fn send(&self, ev: BackendEvent) {
        let _ = self.tx.send(ev);
    }

    /// A pod changed: its phase (with its gang's other pods) drives the workload's events, in
    /// the contract's order. A gang runs when all its pods run; when one fails or is lost, the
    /// workload does, and its other pods are deleted. A pod that wears a tracked workload's
    /// label but is not its pod ([`Tracked::claim`]) is reported and otherwise ignored.
    fn on_pod(self: &Arc<Self>, pod: &Pod) {
        let Some(id) = pods::workload_id(pod) else { return };
        let mut st = self.state.lock().unwrap();
        let Some(t) = st.tracked.get_mut(&id) else { return };
        let index = match t.claim(pod) {
            Claim::Ours(i) => i,
            Claim::Stranger => {
                self.stranger(&mut st, pod, id);
                return;
            }
        };
        if pod.metadata.deletion_timestamp.is_some() {
            return;
        }
        if t.stopping || t.stage == Stage::Ended {
            return;
        }
        let Some(slot) = t.pods.get_mut(index) else { return };
        slot.1 = pods::pod_state(pod);
        let state = pods::gang_state(&t.pods);
        if state == PodState::Pending {
            return;
        }
        if t.stage == Stage::Accepted {
            if pods::bound_node(pod).is_none() {
                return;
            }
            let _ = self.tx.send(BackendEvent::Started { id, bound: None });
            t.stage = Stage::Started;
        }
        match state {
            PodState::Pending => {}
            PodState::Running { since_ms } => {
                if t.stage < Stage::Running {
                    let _ = self.tx.send(BackendEvent::Running {
                        id,
                        at_ms: since_ms.unwrap_or_else(now_ms),
                        sample: Vec::new(),
                    });
                    t.stage = Stage::Running;
                }
            }
            PodState::Exited(exit) => {
                if t.stage < Stage::Running {
                    let _ = self.tx.send(BackendEvent::Running {
                        id,
                        at_ms: now_ms(),
                        sample: Vec::new(),
                    });
                }
                let failed = exit != Exit::Succeeded;
                let _ = self.tx.send(BackendEvent::Exited {
                    id,
                    at_ms: now_ms(),
                    exit,
                });
                t.stage = Stage::Ended;
                if failed {
                    self.delete_gang_rest(t);
                }
            }
            PodState::Lost(detail) => {
                let _ = self.tx.send(BackendEvent::Lost {
                    id,
                    at_ms: now_ms(),
                    detail,
                });
                t.stage = Stage::Ended;
                self.delete_gang_rest(t);
            }
        }
    }

    /// A pod that wears workload `id`'s label and is not its pod: reported once (a warning, a
    /// `Stranger` event the control plane audits and counts, and a Kubernetes Event on the
    /// pod, so its owner sees it too), never adopted, never counted as a loss.
    fn stranger(self: &Arc<Self>, st: &mut State, pod: &Pod, id: u64) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if !st.strangers.insert(uid.clone()) {
            return;
        }
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let detail = format!(
            "pod {ns}/{name} carries the label {LABEL_WORKLOAD}={id} but is not a pod Tessera made for workload {id}: ignored"
        );
        tracing::warn!(namespace = %ns, pod = %name, workload = id, "{detail}");
        let _ = self.tx.send(BackendEvent::Stranger {
            namespace: ns.clone(),
            name: name.clone(),
            detail: detail.clone(),
        });
        self.pod_event(&ns, &name, Some(&uid), "NotTesseraWorkload", &detail);
    }

    /// A gang that failed or was lost: its pods still there are deleted (with their grace
    /// period), in the background.
    fn delete_gang_rest(self: &Arc<Self>, t: &Tracked) {
        if t.pods.len() < 2 {
            return;
        }
        let rest: Vec<String> = t
            .pods
            .iter()
            .filter(|(_, s)| !matches!(s, PodState::Exited(_) | PodState::Lost(_)))
            .map(|(n, _)| n.clone())
            .collect();
        let (client, ns) = (self.client.clone(), t.ns.clone());
        tokio::spawn(async move {
            let api = Api::<Pod>::namespaced(client, &ns);
            for name in rest {
                match api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(e) if not_found(&e) => {}
                    Err(e) => {
                        tracing::warn!(pod = %name, namespace = %ns, error = %e, "deleting the rest of a failed gang")
                    }
                }
            }
        });
    }

    /// A pod is gone: unless Tessera stopped it or it had ended, the workload is lost. A
    /// stranger's pod that goes changes nothing.
    fn on_pod_deleted(self: &Arc<Self>, pod: &Pod) {
        let Some(id) = pods::workload_id(pod) else { return };
        {
            let mut st = self.state.lock().unwrap();
            let Some(t) = st.tracked.get_mut(&id) else { return };
            if t.claim(pod) == Claim::Stranger {
                self.stranger(&mut st, pod, id);
                return;
            }
        }
        self.on_pod_gone(id, pod.metadata.name.as_deref().unwrap_or("?"), pods::bound_node(pod));
    }

    /// The pod `name` of `id` is gone. A workload Tessera is stopping is `Stopped` once all
    /// its pods are gone (its devices are free only then); any other that had not ended is
    /// lost.
    fn on_pod_gone(self: &Arc<Self>, id: u64, name: &str, node: Option<&str>) {
        let mut st = self.state.lock().unwrap();
        let drained = node.and_then(|n| st.nodes.get(n)).is_some_and(|v| v.unschedulable);
        let Some(t) = st.tracked.get_mut(&id) else { return };
        if !t.pods.iter().any(|(n, _)| n == name) {
            return;
        }
        t.gone.insert(name.to_string());
        if t.stopping {
            if t.pods.iter().all(|(n, _)| t.gone.contains(n)) {
                let _ = self.tx.send(BackendEvent::Stopped { id, at_ms: now_ms() });
                st.tracked.remove(&id);
            }
            return;
        }
        if let Some(native) = &t.native {
            // Its owner deleted it (or had it deleted, as a Job's owner does): withdrawn.
            if t.stage != Stage::Ended {
                let _ = self.tx.send(BackendEvent::Withdrawn {
                    id,
                    native: native.clone(),
                });
                t.stage = Stage::Ended;
            }
        } else if t.stage != Stage::Ended {
            // A pod that goes from a cordoned node was evicted by its drain (`kubectl drain`):
            // the workload is stopped as a drain stops it (batch work is requeued); anywhere
            // else it is lost.
            if drained {
                let _ = self.tx.send(BackendEvent::Evicted {
                    id,
                    at_ms: now_ms(),
                    detail: format!(
                        "pod {}/{} was evicted from node {} while it was cordoned (a drain)",
                        t.ns,
                        name,
                        node.unwrap_or_default()
                    ),
                });
                t.stage = Stage::Ended;
            } else {
                let _ = self.tx.send(BackendEvent::Lost {
                    id,
                    at_ms: now_ms(),
                    detail: format!("pod {}/{} was deleted outside Tessera", t.ns, name),
                });
                t.stage = Stage::Ended;
                self.delete_gang_rest(t);
            }
        }
        if t.pods.iter().all(|(n, _)| t.gone.contains(n)) {
            st.tracked.remove(&id);
        }
    }

    /// The admission's view of the cluster.
    fn rules(&self) -> admission::Rules {
        admission::Rules {
            tessera_user: self.cfg.identity.as_deref().map(admission::user_of),
            exempt: self.cfg.admission_exempt.clone(),
            pool_label: self.cfg.pool_label.clone(),
            namespace_prefix: self.cfg.namespace_prefix.clone(),
        }
    }

    /// The tenant project whose namespace `ns` is: one Tessera made (its own labels say which;
    /// a tenant cannot write a namespace's labels), else `None`.
    async fn project_of(&self, ns: &str) -> Result<Option<(String, String)>, BackendError> {
        if let Some(p) = self.state.lock().unwrap().projects.get(ns) {
            return Ok(Some(p.clone()));
        }
        let n = Api::<k8s_openapi::api::core::v1::Namespace>::all(self.client.clone())
            .get_opt(ns)
            .await
            .map_err(|e| kube_err("reading a namespace", e))?;
        let labels = n.and_then(|n| n.metadata.labels).unwrap_or_default();
        let ours = labels
            .get(names::LABEL_MANAGED_BY)
            .is_some_and(|v| v == names::MANAGED_BY);
        let (Some(t), Some(p)) = (labels.get(names::LABEL_TENANT), labels.get(names::LABEL_PROJECT)) else {
            return Ok(None);
        };
        if !ours {
            return Ok(None);
        }
        let project = (t.clone(), p.clone());
        self.state
            .lock()
            .unwrap()
            .projects
            .insert(ns.to_string(), project.clone());
        Ok(Some(project))
    }

    /// A pod naming Tessera as its scheduler, not bound yet (see [`watch_native`]).
    async fn on_native_pod(self: &Arc<Self>, pod: &Pod) {
        let (Some(ns), Some(name), Some(uid)) = (
            pod.metadata.namespace.clone(),
            pod.metadata.name.clone(),
            pod.metadata.uid.clone(),
        ) else {
            return;
        };
        if pod.metadata.deletion_timestamp.is_some() || pods::bound_node(pod).is_some() || pods::finished(pod) {
            return;
        }
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let made_by_tessera = labels
            .get(names::LABEL_MANAGED_BY)
            .is_some_and(|v| v == names::MANAGED_BY)
            && pods::workload_id(pod).is_some_and(|id| names::is_pod_name_of(&name, id));
        if made_by_tessera || self.state.lock().unwrap().submitted.contains(&uid) {
            return;
        }
        let project = match self.project_of(&ns).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(namespace = %ns, pod = %name, error = %e, "cannot tell whose a waiting pod is");
                return;
            }
        };
        if !self.state.lock().unwrap().submitted.insert(uid.clone()) {
            return;
        }
        let review = admission::review_pod(
            pod,
            &ns,
            project.as_ref().map(|(t, p)| (t.as_str(), p.as_str())),
            &self.rules(),
        );
        let job = match self.job_of(pod).await {
            Ok(j) => j,
            Err(e) => {
                // Tried again at the pod's next change, or at the watch's next relist.
                self.state.lock().unwrap().submitted.remove(&uid);
                tracing::warn!(namespace = %ns, pod = %name, error = %e, "cannot read a waiting pod's Job");
                return;
            }
        };
        match admission::with_gang(review, pod, job.as_ref()) {
            NativeReview::Pass => {}
            NativeReview::Refuse(why) => {
                tracing::info!(namespace = %ns, pod = %name, "a pod naming Tessera as its scheduler is refused: {why}");
                self.pod_event(&ns, &name, Some(&uid), "TesseraRefused", &format!("Tessera: {why}"));
            }
            NativeReview::Ask(ask) if ask.gang.is_some() => {
                let (job, job_uid) = job
                    .as_ref()
                    .and_then(|j| Some((j.metadata.name.clone()?, j.metadata.uid.clone()?)))
                    .expect("a gang's pod has its Job");
                self.gang_member(ns, job, job_uid, name, uid, ask);
            }
            NativeReview::Ask(ask) => self.send(BackendEvent::Submitted {
                native: NativeRef::pod(ns, name, uid),
                ask,
            }),
        }
    }

    /// The Job that controls `pod`, as the API server has it (`None`: no Job controls it, or
    /// the one its reference names is gone or another object).
    async fn job_of(&self, pod: &Pod) -> Result<Option<Job>, BackendError> {
        let Some((name, uid)) = admission::job_owner(pod) else {
            return Ok(None);
        };
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let job = Api::<Job>::namespaced(self.client.clone(), &ns)
            .get_opt(&name)
            .await
            .map_err(|e| kube_err(&format!("reading Job {ns}/{name}"), e))?;
        Ok(job.filter(|j| j.metadata.uid.as_deref() == Some(uid.as_str())))
    }

    /// One more waiting pod of a gang Job: once the Job's `parallelism` pods are there, the
    /// gang is reported as one workload, its pods its node-shares in name order. A pod that
    /// goes before then leaves the gang ([`watch_native`]); the Job's replacement joins it.
    fn gang_member(
        &self,
        ns: String,
        job: String,
        job_uid: String,
        name: String,
        uid: String,
        ask: Box<tessera_backend::NativeAsk>,
    ) {
        let size = ask.gang.as_ref().map_or(1, |g| g.pods as usize);
        let mut st = self.state.lock().unwrap();
        let f = st.forming.entry(job_uid.clone()).or_insert_with(|| Forming {
            ns,
            job,
            ask,
            members: Default::default(),
        });
        f.members.insert(name, uid);
        if f.members.len() < size {
            return;
        }
        let f = st.forming.remove(&job_uid).expect("just seen");
        let native = NativeRef {
            members: f.members.into_iter().take(size).collect(),
            ..NativeRef::pod(f.ns, f.job, job_uid)
        };
        drop(st);
        self.send(BackendEvent::Submitted { native, ask: f.ask });
    }

    /// Labels a native workload's pods (a gang's members) as workload `id`'s (its workload,
    /// tenant and project), which makes the pod watch follow them. Idempotent; the UID in each
    /// patch is a precondition: another object under the name is refused.
    async fn label_native(&self, id: u64, native: &NativeRef) -> Result<(), BackendError> {
        for (name, uid) in native_pods(native) {
            self.label_native_pod(id, &native.namespace, &name, &uid).await?;
        }
        Ok(())
    }

    async fn label_native_pod(&self, id: u64, ns: &str, name: &str, uid: &str) -> Result<(), BackendError> {
        let project = self
            .project_of(ns)
            .await?
            .ok_or_else(|| BackendError::Rejected(format!("namespace {ns} is not a Tessera project's namespace")))?;
        let patch = json!({"metadata": {"uid": uid, "labels": {
            LABEL_WORKLOAD: id.to_string(),
            names::LABEL_TENANT: names::label_value(&project.0),
            names::LABEL_PROJECT: names::label_value(&project.1),
        }}});
        Api::<Pod>::namespaced(self.client.clone(), ns)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| kube_err(&format!("labelling pod {ns}/{name}"), e))?;
        Ok(())
    }

    /// Starts a native workload: binds its pod (there already, made by its owner), or each
    /// member pod of a gang to its node-share, to the node the engine chose, once it is certain
    /// each pod is that object and asks for what was placed there. Nothing is bound unless
    /// every pod checks out.
    async fn start_native(&self, spec: &RunSpec, native: &NativeRef) -> Result<(), BackendError> {
        {
            let mut st = self.state.lock().unwrap();
            let t = st
                .tracked
                .entry(spec.id)
                .or_insert_with(|| Tracked::native(native, Stage::Accepted));
            if t.stage >= Stage::Started && !t.stopping {
                return Ok(());
            }
            // Tracked since the intake linked it, before its shape was placed.
            t.whole_gpus = whole_gpus(spec);
        }
        let members = native_pods(native);
        if members.len() != spec.gang_size() {
            return Err(BackendError::Rejected(format!(
                "workload {} has {} pods on the cluster but was placed as {} node-shares",
                spec.id,
                members.len(),
                spec.gang_size()
            )));
        }
        let ns = &native.namespace;
        let api = Api::<Pod>::namespaced(self.client.clone(), ns);
        let mut checked = Vec::with_capacity(members.len());
        for (index, (name, uid)) in members.iter().enumerate() {
            let (node, devices) = spec.share(index).expect("one share per member");
            let pod = api
                .get_opt(name)
                .await
                .map_err(|e| kube_err(&format!("pod {ns}/{name}"), e))?;
            let Some(pod) = pod.filter(|p| p.metadata.uid.as_deref() == Some(uid.as_str())) else {
                self.state.lock().unwrap().tracked.remove(&spec.id);
                return Err(BackendError::Rejected(format!(
                    "pod {ns}/{name} of workload {} is gone: its owner deleted it",
                    spec.id
                )));
            };
            let Devices::Count { resource, count } = devices else {
                return Err(BackendError::Rejected(
                    "the kubernetes backend asks for device counts, not exact devices".into(),
                ));
            };
            let want = match resource {
                Resource::SharedGpu { .. } => self.shared_resource(node),
                r => r.to_string(),
            };
            let asks = pod
                .spec
                .iter()
                .flat_map(|s| s.containers.iter())
                .filter_map(|c| c.resources.as_ref()?.limits.as_ref()?.get(&want))
                .filter_map(|q| fleet::quantity(&q.0, 1.0))
                .sum::<u64>();
            let expected = if matches!(resource, Resource::Gpu | Resource::Mig { .. }) {
                u64::from(*count)
            } else {
                1
            };
            if asks != expected {
                return Err(BackendError::Rejected(format!(
                    "pod {ns}/{name} asks for {asks} {want} on node {node}, where Tessera placed {expected}: its owner must ask for what it was admitted with"
                )));
            }
            checked.push((pod, node, name, uid, matches!(resource, Resource::Mig { .. })));
        }
        for (pod, node, name, uid, mig) in checked {
            if pods::workload_id(&pod) != Some(spec.id) {
                // Placed before the intake labelled it: labelled now, so the pod watch follows it.
                self.label_native_pod(spec.id, ns, name, uid).await?;
            }
            if mig {
                self.wait_mig(node, None).await?;
            }
            self.bind_pod(ns, &pod, node).await?;
        }
        let mut st = self.state.lock().unwrap();
        if let Some(t) = st.tracked.get_mut(&spec.id)
            && t.stage == Stage::Accepted
        {
            t.stage = Stage::Started;
            t.stopping = false;
            let _ = self.tx.send(BackendEvent::Started {
                id: spec.id,
                bound: None,
            });
        }
        Ok(())
    }

    /// What reconcile sees of a native workload's pods (and its tracking, rebuilt after a
    /// restart): a gang as its member pods together ([`pods::gang_state`]).
    async fn reconcile_native(&self, spec: &RunSpec, native: &NativeRef) -> Result<Observation, BackendError> {
        let ns = &native.namespace;
        let api = Api::<Pod>::namespaced(self.client.clone(), ns);
        let mut states = Vec::new();
        let (mut bound, mut deleting) = (0, false);
        for (name, uid) in native_pods(native) {
            let pod = api
                .get_opt(&name)
                .await
                .map_err(|e| kube_err(&format!("pod {ns}/{name}"), e))?
                .filter(|p| p.metadata.uid.as_deref() == Some(uid.as_str()));
            let state = match &pod {
                Some(p) => {
                    bound += usize::from(pods::bound_node(p).is_some());
                    deleting |= p.metadata.deletion_timestamp.is_some();
                    pods::pod_state(p)
                }
                None => PodState::Lost(format!("pod {ns}/{name} is gone")),
            };
            states.push((name, state));
        }
        if bound == 0 {
            return Ok(Observation::Unknown);
        }
        let state = pods::gang_state(&states);
        let obs = pods::observation(state);
        let stage = match obs {
            Observation::Running { .. } => Stage::Running,
            Observation::Starting => Stage::Started,
            _ => Stage::Ended,
        };
        self.state.lock().unwrap().tracked.entry(spec.id).or_insert_with(|| {
            let mut t = Tracked::native(native, stage).whole_gpus_of(spec);
            t.stopping = deleting;
            for (slot, (_, s)) in t.pods.iter_mut().zip(states) {
                slot.1 = s;
            }
            t
        });
        Ok(obs)
    }

    /// The resource name under which `node`'s device plugin advertises time-sliced GPUs.
    fn shared_resource(&self, node: &str) -> String {
        self.state
            .lock()
            .unwrap()
            .nodes
            .get(node)
            .and_then(|v| v.shared_resource.clone())
            .unwrap_or_else(|| fleet::RESOURCE_SHARED.to_string())
    }

    /// Creates a pod (or finds it already there, from an earlier try).
    async fn create_pod(&self, ns: &str, pod: &Pod) -> Result<Pod, BackendError> {
        let api = Api::<Pod>::namespaced(self.client.clone(), ns);
        let name = pod.metadata.name.clone().unwrap_or_default();
        let mut tries = 0;
        loop {
            match api.create(&PostParams::default(), pod).await {
                Ok(p) => return Ok(p),
                // Ours from an earlier try, or someone else's pod under that name: never taken
                // over (binding it would run a stranger's pod on Tessera's GPUs).
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    let existing = api
                        .get(&name)
                        .await
                        .map_err(|e| kube_err(&format!("pod {ns}/{name}"), e))?;
                    let managed = |p: &Pod| {
                        p.metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get(names::LABEL_MANAGED_BY))
                            .is_some_and(|v| v == names::MANAGED_BY)
                    };
                    if !managed(&existing)
                        || pods::workload_id(&existing) != pods::workload_id(pod)
                        || pods::gang_index(&existing) != pods::gang_index(pod)
                    {
                        return Err(BackendError::Rejected(format!(
                            "pod {ns}/{name} exists and is not Tessera's pod of workload {}: refusing to take it over",
                            pods::workload_id(pod).unwrap_or_default()
                        )));
                    }
                    return Ok(existing);
                }
                // A new namespace's quota has no status for a second or two, and Tessera's new
                // role binding there takes a moment to reach the authorizer: pods wait for both.
                Err(kube::Error::Api(s))
                    if (s.message.contains("status unknown for quota")
                        || (s.code == 403 && self.cfg.identity.is_some()))
                        && tries < 50 =>
                {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(kube_err(&format!("creating pod {ns}/{name}"), e)),
            }
        }
    }

    /// Binds `pod` to `node` through the Binding subresource, unless it is bound already.
    async fn bind_pod(&self, ns: &str, pod: &Pod, node: &str) -> Result<(), BackendError> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        match pods::bound_node(pod) {
            Some(n) if n == node => Ok(()),
            Some(other) => Err(BackendError::Rejected(format!(
                "pod {ns}/{name} is already bound to {other}, not {node}"
            ))),
            None => {
                let binding = json!({
                    "apiVersion": "v1", "kind": "Binding",
                    "metadata": {"name": name, "namespace": ns},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": node},
                });
                match Api::<Pod>::namespaced(self.client.clone(), ns)
                    .create_subresource::<_, serde_json::Value>("binding", &name, &PostParams::default(), &binding)
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                    Err(e) => Err(kube_err(&format!("binding pod {ns}/{name} to {node}"), e)),
                }
            }
        }
    }

    /// The headless Service giving a multi-node gang's pods their DNS names, owned by its first
    /// pod.
    async fn ensure_gang_service(&self, spec: &RunSpec, ns: &str, first: &Pod) -> Result<(), BackendError> {
        let uid = first.metadata.uid.clone().unwrap_or_default();
        let svc: k8s_openapi::api::core::v1::Service =
            serde_json::from_value(pods::attempt_gang_service_for(spec, ns, pods::attempt(first), &uid))
                .map_err(|e| BackendError::Rejected(format!("service for workload {}: {e}", spec.id)))?;
        match Api::<k8s_openapi::api::core::v1::Service>::namespaced(self.client.clone(), ns)
            .create(&PostParams::default(), &svc)
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(kube_err(
                &format!(
                    "creating the gang's service {ns}/{}",
                    names::attempt_service(spec.id, pods::attempt(first))
                ),
                e,
            )),
        }
    }

    /// Asks the Eviction API to evict a pod, retrying as `kubectl drain` does (every 5 s) while
    /// a disruption budget refuses; forcibly deleted once its grace period is over. Each
    /// refusal is told to the control plane (a `Notice` on the workload, at the first refusal
    /// and then every minute) and recorded as a Kubernetes Event on the pod: a drain that waits
    /// on a budget is never silent. The workload keeps its capacity meanwhile: it is `Stopped`
    /// only when its pods are gone. The retries end when the pod is gone or the workload is no
    /// longer being stopped here.
    async fn evict_pod(
        self: &Arc<Self>,
        id: u64,
        ns: String,
        name: String,
        grace: Duration,
    ) -> Result<(), BackendError> {
        let refusal = match self.evict_once(&ns, &name, grace).await? {
            None => {
                self.force_later(ns, name, grace + self.cfg.force_delete_after);
                return Ok(());
            }
            Some(why) => why,
        };
        self.eviction_refused(id, &ns, &name, &refusal);
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut told = tokio::time::Instant::now();
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                let Some(sh) = weak.upgrade() else { return };
                let still = sh
                    .state
                    .lock()
                    .unwrap()
                    .tracked
                    .get(&id)
                    .is_some_and(|t| t.stopping && !t.gone.contains(&name));
                if !still {
                    return;
                }
                match sh.evict_once(&ns, &name, grace).await {
                    Ok(None) => {
                        sh.force_later(ns, name, grace + sh.cfg.force_delete_after);
                        return;
                    }
                    Ok(Some(why)) => {
                        if told.elapsed() >= Duration::from_secs(60) {
                            told = tokio::time::Instant::now();
                            sh.eviction_refused(id, &ns, &name, &why);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(pod = %name, namespace = %ns, error = %e, "eviction");
                        return;
                    }
                }
            }
        });
        Ok(())
    }

    /// Tells the control plane and the pod's owner that a disruption budget refuses the
    /// eviction of `ns/name` for now.
    fn eviction_refused(self: &Arc<Self>, id: u64, ns: &str, name: &str, why: &str) {
        let detail = format!(
            "the eviction of pod {ns}/{name} is refused for now by a PodDisruptionBudget ({why}); Tessera retries every 5 s and the workload keeps its GPUs until its pod is gone"
        );
        tracing::info!(pod = %name, namespace = %ns, workload = id, "{detail}");
        self.send(BackendEvent::Notice {
            id,
            detail: detail.clone(),
        });
        self.pod_event(ns, name, None, "EvictionRefused", &detail);
    }

    /// Records a Warning Event on pod `ns/name` (its owner sees it with `kubectl describe`), in
    /// the background; a failure is logged at debug level only.
    fn pod_event(&self, ns: &str, name: &str, uid: Option<&str>, reason: &str, message: &str) {
        let event = json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": format!("{name}."), "namespace": ns},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": ns, "uid": uid},
            "reason": reason, "type": "Warning", "message": message,
            "source": {"component": "tessera"},
            "firstTimestamp": k8s_now(), "lastTimestamp": k8s_now(), "count": 1,
        });
        let Ok(event) = serde_json::from_value::<k8s_openapi::api::core::v1::Event>(event) else {
            return;
        };
        let (client, ns) = (self.client.clone(), ns.to_string());
        tokio::spawn(async move {
            if let Err(e) = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client, &ns)
                .create(&PostParams::default(), &event)
                .await
            {
                tracing::debug!(error = %e, namespace = %ns, "cannot record an Event on a pod");
            }
        });
    }

    fn node_lock(&self, node: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.node_locks
            .lock()
            .unwrap()
            .entry(node.to_string())
            .or_default()
            .clone()
    }

    /// The controller reference Tessera's pods in `ns` carry: the namespace itself, which
    /// Tessera made and no tenant can delete. With a controller, `kubectl drain` evicts them
    /// like any controller's pods (without `--force`), and the garbage collector removes them
    /// with their namespace.
    async fn owner_of(&self, ns: &str) -> Result<serde_json::Value, BackendError> {
        let known = self.state.lock().unwrap().namespace_uids.get(ns).cloned();
        let uid = match known {
            Some(u) => u,
            None => {
                let n = Api::<k8s_openapi::api::core::v1::Namespace>::all(self.client.clone())
                    .get(ns)
                    .await
                    .map_err(|e| kube_err(&format!("namespace {ns}"), e))?;
                let uid = n.metadata.uid.unwrap_or_default();
                self.state
                    .lock()
                    .unwrap()
                    .namespace_uids
                    .insert(ns.to_string(), uid.clone());
                uid
            }
        };
        Ok(json!({"apiVersion": "v1", "kind": "Namespace", "name": ns, "uid": uid,
            "controller": true, "blockOwnerDeletion": false}))
    }

    /// Makes sure the project's namespace exists (its labels as tenancy applies them).
    async fn ensure_namespace(&self, spec: &RunSpec, ns: &str) -> Result<(), BackendError> {
        if self.state.lock().unwrap().namespaces.contains(ns) {
            return Ok(());
        }
        let t = TenancySpec {
            tenant: spec.tenant.clone(),
            project: spec.project.clone(),
            groups: Vec::new(),
            quota: BTreeMap::new(),
        };
        let objects = tenancy::objects_for(&t, ns, self.cfg.identity.as_deref());
        let api = Api::<k8s_openapi::api::core::v1::Namespace>::all(self.client.clone());
        match api.get_opt(ns).await.map_err(|e| kube_err("reading a namespace", e))? {
            Some(existing) => tenancy::check_owner(ns, existing.metadata.labels.as_ref(), &t)?,
            None => {
                api.patch(
                    ns,
                    &PatchParams::apply(FIELD_MANAGER),
                    &Patch::Apply(&objects.namespace),
                )
                .await
                .map_err(|e| kube_err(&format!("namespace {ns}"), e))?;
            }
        }
        if let Some(b) = &objects.workloads_binding {
            Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(self.client.clone(), ns)
                .patch(
                    tenancy::WORKLOADS_BINDING_NAME,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(b),
                )
                .await
                .map_err(|e| kube_err(&format!("Tessera's role binding in {ns}"), e))?;
        }
        self.state.lock().unwrap().namespaces.insert(ns.to_string());
        Ok(())
    }

    /// Waits until the node's MIG manager reports `success` for the selected config.
    async fn wait_mig(&self, node: &str, want: Option<&str>) -> Result<(), BackendError> {
        let api = Api::<Node>::all(self.client.clone());
        let deadline = tokio::time::Instant::now() + self.cfg.mig_timeout;
        loop {
            let n = api.get(node).await.map_err(|e| kube_err(&format!("node {node}"), e))?;
            let labels = n.metadata.labels.unwrap_or_default();
            let config = labels.get(LABEL_MIG_CONFIG).cloned().unwrap_or_default();
            let state = labels.get(LABEL_MIG_STATE).map(String::as_str);
            let ours = want.is_none_or(|w| w == config);
            match state {
                Some("success") if ours => return Ok(()),
                Some("failed") if ours => {
                    return Err(BackendError::Rejected(format!(
                        "the MIG manager failed to apply MIG config {config} on node {node} ({LABEL_MIG_STATE}=failed)"
                    )));
                }
                None if want.is_none() && config.is_empty() => return Ok(()),
                _ => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(BackendError::Unreachable(format!(
                    "the MIG manager did not apply MIG config {config} on node {node} within {} s (state {})",
                    self.cfg.mig_timeout.as_secs(),
                    state.unwrap_or("unset")
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn read_layouts(&self) -> Result<(Option<ConfigMap>, BTreeMap<String, NodeLayout>), BackendError> {
        let api = Api::<ConfigMap>::namespaced(self.client.clone(), &self.cfg.mig_namespace);
        let cm = api
            .get_opt(&self.cfg.mig_configmap)
            .await
            .map_err(|e| kube_err("reading the MIG manager's ConfigMap", e))?;
        let mut out = BTreeMap::new();
        if let Some(a) = cm.as_ref().and_then(|c| c.metadata.annotations.as_ref()) {
            for (k, v) in a {
                if let Some(node) = k.strip_prefix(LAYOUT_ANNOTATION)
                    && let Ok(l) = serde_json::from_str::<NodeLayout>(v)
                {
                    out.insert(node.to_string(), l);
                }
            }
        }
        Ok((cm, out))
    }

    /// MIG instances of each profile held by Tessera's live pods on `node`.
    async fn mig_in_use(&self, node: &str) -> Result<BTreeMap<String, u32>, BackendError> {
        let list = Api::<Pod>::all(self.client.clone())
            .list(
                &ListParams::default()
                    .labels(LABEL_WORKLOAD)
                    .fields(&format!("spec.nodeName={node}")),
            )
            .await
            .map_err(|e| kube_err("listing pods", e))?;
        let mut out = BTreeMap::new();
        for p in list.items {
            if matches!(pods::pod_state(&p), PodState::Exited(_) | PodState::Lost(_)) {
                continue;
            }
            for c in p.spec.iter().flat_map(|s| s.containers.iter()) {
                for (k, q) in c.resources.iter().flat_map(|r| r.limits.iter().flatten()) {
                    if let Some(profile) = k.strip_prefix("nvidia.com/mig-") {
                        *out.entry(profile.to_string()).or_default() += fleet::quantity(&q.0, 1.0).unwrap_or(0) as u32;
                    }
                }
            }
        }
        Ok(out)
    }

    async fn apply_layout(
        &self,
        node: &str,
        gpu: u8,
        instances: &[MigInstance],
    ) -> Result<PartitionReport, BackendError> {
        let lock = self.node_lock(node);
        let _guard = lock.lock().await;
        let api = Api::<ConfigMap>::namespaced(self.client.clone(), &self.cfg.mig_namespace);
        let nodes = Api::<Node>::all(self.client.clone());
        let want: Vec<Placed> = instances.iter().map(Placed::from).collect();
        for _attempt in 0..5 {
            let (cm, layouts) = self.read_layouts().await?;
            let mut layout = layouts.get(node).cloned().unwrap_or_default();
            let n = nodes
                .get(node)
                .await
                .map_err(|e| kube_err(&format!("node {node}"), e))?;
            let labels = n.metadata.labels.unwrap_or_default();
            let selected = labels.get(LABEL_MIG_CONFIG).cloned();
            if layout.get(&gpu) == Some(&want)
                && selected.as_deref() == Some(mig::config_name(node, &layout).as_str())
                && labels.get(LABEL_MIG_STATE).map(String::as_str) == Some("success")
            {
                return Ok(PartitionReport {
                    detail: format!("MIG layout of GPU {gpu} on {node} already applied"),
                    created: false,
                });
            }
            layout.insert(gpu, want.clone());
            // Whole-GPU granularity: the new layout must keep every instance in use.
            let in_use = self.mig_in_use(node).await?;
            let after = mig::profile_counts(&layout);
            if let Some((p, n)) = in_use.iter().find(|(p, n)| after.get(*p).copied().unwrap_or(0) < **n) {
                return Err(BackendError::Rejected(format!(
                    "GPU {gpu} on {node} cannot be re-partitioned: {n} {p} instance(s) on the node are in use and the new layout keeps fewer"
                )));
            }
            let name = mig::config_name(node, &layout);
            let existing = cm
                .as_ref()
                .and_then(|c| c.data.as_ref())
                .and_then(|d| d.get("config.yaml"));
            let text =
                mig::put_config(existing.map(String::as_str), node, &name, &layout).map_err(BackendError::Rejected)?;
            let layout_json = serde_json::to_string(&layout).expect("a layout serialises");
            let result = match cm {
                Some(mut cm) => {
                    cm.data.get_or_insert_default().insert("config.yaml".into(), text);
                    cm.metadata
                        .annotations
                        .get_or_insert_default()
                        .insert(format!("{LAYOUT_ANNOTATION}{node}"), layout_json);
                    api.replace(&self.cfg.mig_configmap, &PostParams::default(), &cm)
                        .await
                        .map(|_| ())
                }
                None => {
                    let cm: ConfigMap = serde_json::from_value(json!({
                        "metadata": {"name": self.cfg.mig_configmap, "namespace": self.cfg.mig_namespace,
                            "annotations": {format!("{LAYOUT_ANNOTATION}{node}"): layout_json}},
                        "data": {"config.yaml": text},
                    }))
                    .expect("a ConfigMap");
                    api.create(&PostParams::default(), &cm).await.map(|_| ())
                }
            };
            match result {
                Ok(()) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(kube_err("writing the MIG manager's ConfigMap", e)),
            }
            nodes
                .patch(
                    node,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {LABEL_MIG_CONFIG: name, LABEL_MIG_STATE: null}}})),
                )
                .await
                .map_err(|e| kube_err(&format!("labelling node {node}"), e))?;
            self.wait_mig(node, Some(&name)).await?;
            self.send(BackendEvent::PartitionChanged {
                node: node.to_string(),
                gpu,
                instances: instances.to_vec(),
            });
            return Ok(PartitionReport {
                detail: format!("MIG config {name} applied on {node} by the GPU Operator"),
                created: true,
            });
        }
        Err(BackendError::Unreachable(
            "the MIG manager's ConfigMap kept changing under Tessera".into(),
        ))
    }

    /// The namespace and pods of workload `id`: the tracked ones, else (a workload this
    /// process never saw) the live pods named for it in a namespace whose own labels name the
    /// tenant and project the pods claim — a tenant cannot write a namespace's labels, so a
    /// stranger's pod wearing the label is not taken for the workload's.
    async fn find_pods(&self, id: u64) -> Result<Option<(String, Vec<String>)>, BackendError> {
        if let Some(t) = self.state.lock().unwrap().tracked.get(&id) {
            return Ok(Some((t.ns.clone(), t.names())));
        }
        let pods = self.owned_pods(id).await?;
        let Some(live) = pods.iter().find(|p| !pods::finished(p)) else {
            return Ok(None);
        };
        let (ns, attempt) = (live.metadata.namespace.clone().unwrap_or_default(), pods::attempt(live));
        let mut found: Vec<(usize, String)> = pods
            .iter()
            .filter(|q| q.metadata.namespace.as_deref() == Some(ns.as_str()) && pods::attempt(q) == attempt)
            .filter_map(|q| Some((pods::gang_index(q), q.metadata.name.clone()?)))
            .collect();
        found.sort();
        Ok(Some((ns, found.into_iter().map(|(_, n)| n).collect())))
    }

    /// The pods named for workload `id` (any attempt, any state) in a namespace whose own
    /// labels name the tenant and project the pods claim: a tenant cannot write a namespace's
    /// labels, so a stranger's pod wearing the label is not among them.
    async fn owned_pods(&self, id: u64) -> Result<Vec<Pod>, BackendError> {
        let list = Api::<Pod>::all(self.client.clone())
            .list(&ListParams::default().labels(&format!("{LABEL_WORKLOAD}={id}")))
            .await
            .map_err(|e| kube_err("listing pods", e))?;
        let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(self.client.clone());
        let mut labels: HashMap<String, Option<BTreeMap<String, String>>> = HashMap::new();
        let mut out = Vec::new();
        for p in list.items {
            let (Some(ns), Some(name)) = (p.metadata.namespace.clone(), p.metadata.name.as_deref()) else {
                continue;
            };
            if !names::is_pod_name_of(name, id) {
                continue;
            }
            if !labels.contains_key(&ns) {
                let n = namespaces
                    .get_opt(&ns)
                    .await
                    .map_err(|e| kube_err("reading a namespace", e))?;
                labels.insert(ns.clone(), n.and_then(|n| n.metadata.labels));
            }
            if let Some(Some(l)) = labels.get(&ns)
                && tenancy::same_owner(Some(l), p.metadata.labels.as_ref())
            {
                out.push(p);
            }
        }
        Ok(out)
    }

    /// The pod whose log is workload `id`'s log (its first node-share, of its latest attempt),
    /// in its namespace, whatever its state.
    async fn log_pod(&self, id: u64) -> Result<Option<Pod>, BackendError> {
        let known = self
            .state
            .lock()
            .unwrap()
            .tracked
            .get(&id)
            .map(|t| (t.ns.clone(), t.pods[0].0.clone()));
        if let Some((ns, name)) = known {
            return Api::<Pod>::namespaced(self.client.clone(), &ns)
                .get_opt(&name)
                .await
                .map_err(|e| kube_err(&format!("pod {ns}/{name}"), e));
        }
        Ok(self
            .owned_pods(id)
            .await?
            .into_iter()
            .filter(|p| pods::gang_index(p) == 0)
            .max_by_key(pods::attempt))
    }

    /// The attempt workload `id`'s next start in `ns` makes pods for: the attempt of its live
    /// pods there (a start repeated after a crash finishes it), else one after the last.
    async fn next_attempt(&self, ns: &str, id: u64) -> Result<u32, BackendError> {
        let list = Api::<Pod>::namespaced(self.client.clone(), ns)
            .list(&ListParams::default().labels(&format!("{LABEL_WORKLOAD}={id}")))
            .await
            .map_err(|e| kube_err("listing pods", e))?;
        let ours: Vec<&Pod> = list
            .items
            .iter()
            .filter(|p| p.metadata.name.as_deref().is_some_and(|n| names::is_pod_name_of(n, id)))
            .collect();
        if let Some(live) = ours
            .iter()
            .filter(|p| !pods::finished(p))
            .map(|p| pods::attempt(p))
            .max()
        {
            return Ok(live);
        }
        Ok(ours.iter().map(|p| pods::attempt(p) + 1).max().unwrap_or(0))
    }

    /// Marks `id` as being stopped (no more events) and returns its pods.
    async fn stopping(&self, id: u64) -> Result<Option<(String, Vec<String>)>, BackendError> {
        let found = self.find_pods(id).await?;
        if let Some((ns, names)) = &found {
            let mut st = self.state.lock().unwrap();
            let t = st
                .tracked
                .entry(id)
                .or_insert_with(|| Tracked::new(ns, 0, Stage::Started, true, names.iter().cloned()));
            t.stopping = true;
        }
        Ok(found)
    }

    /// Asks the Eviction API to evict a pod once: `None` when accepted (or the pod is gone),
    /// the API server's reason when a disruption budget refuses for now (429). Asked through
    /// the client that does not retry: kube-rs's default retry policy would otherwise wait
    /// out a refusal silently for minutes.
    async fn evict_once(&self, ns: &str, name: &str, grace: Duration) -> Result<Option<String>, BackendError> {
        let api = Api::<Pod>::namespaced(self.evict_client.clone(), ns);
        // policy/v1beta1: the version every supported API server (1.20 on) serves.
        let eviction = json!({
            "apiVersion": "policy/v1beta1", "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns},
            "deleteOptions": {"gracePeriodSeconds": grace.as_secs()},
        });
        match api
            .create_subresource::<_, serde_json::Value>("eviction", name, &PostParams::default(), &eviction)
            .await
        {
            Ok(_) => Ok(None),
            Err(e) if not_found(&e) => Ok(None),
            Err(kube::Error::Api(s)) if s.code == 429 => Ok(Some(s.message)),
            Err(e) => Err(kube_err(&format!("evicting pod {ns}/{name}"), e)),
        }
    }

    fn force_later(self: &Arc<Self>, ns: String, name: String, after: Duration) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let Some(sh) = weak.upgrade() else { return };
            let api = Api::<Pod>::namespaced(sh.client.clone(), &ns);
            if let Ok(Some(_)) = api.get_opt(&name).await {
                tracing::warn!(pod = %name, namespace = %ns, "pod still there after its grace period: deleting it forcibly");
                let _ = api.delete(&name, &DeleteParams::default().grace_period(0)).await;
            }
        });
    }
}

#[async_trait]
impl Backend for KubeBackend {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            partitioning: Partitioning::WholeGpu,
            devices: DeviceAssignment::PerNodeCount,
            logs: true,
            // The GPU Operator's MIG manager owns MIG mode on Kubernetes.
            mig_mode_switch: false,
            mig_mode_reported: true,
            confirms_stop: true,
            native_admission: true,
            multi_node: true,
            needs_image: true,
        }
    }

    async fn partition(&self, plan: &PartitionPlan) -> Result<PartitionReport, BackendError> {
        match plan {
            PartitionPlan::Layout { node, gpu, instances } => self.shared.apply_layout(node, *gpu, instances).await,
            PartitionPlan::Nothing { node } => Ok(PartitionReport {
                detail: format!("nothing to partition on {node}"),
                created: false,
            }),
            PartitionPlan::Share { node, gpu, .. } => Ok(PartitionReport {
                detail: format!("GPU {gpu} on {node} is time-sliced by the device plugin"),
                created: false,
            }),
            PartitionPlan::Instance { .. } => Err(BackendError::Rejected(
                "the kubernetes backend lays out whole GPUs through the GPU Operator; it takes no single-instance plans"
                    .into(),
            )),
        }
    }

    async fn unpartition(&self, _plan: &PartitionPlan) -> Result<(), BackendError> {
        // Whole-GPU layouts change only through a new layout.
        Ok(())
    }

    async fn start(&self, spec: &RunSpec) -> Result<(), BackendError> {
        let sh = &self.shared;
        if let Some(native) = &spec.native {
            return sh.start_native(spec, native).await;
        }
        let ns = names::namespace(&sh.cfg.namespace_prefix, &spec.tenant, &spec.project);
        let size = spec.gang_size();
        if let Some(t) = sh.state.lock().unwrap().tracked.get(&spec.id)
            && t.stage >= Stage::Started
            && !t.stopping
        {
            return Ok(());
        }
        // Refused specs (no image, exact devices) are refused before anything is asked.
        for i in 0..size {
            let (node, devices) = spec.share(i).expect("an index below the gang size");
            pods::pod_for(spec, &ns, i, &sh.shared_resource(node))?;
            let time_sliced = sh
                .state
                .lock()
                .unwrap()
                .nodes
                .get(node)
                .is_some_and(|v| v.shared_resource.is_some());
            if time_sliced
                && let Devices::Count {
                    resource: Resource::Gpu,
                    count,
                } = devices
                && *count > 0
            {
                return Err(BackendError::Rejected(format!(
                    "node {node} time-slices its GPUs: its device plugin hands out replicas, which may come from different GPUs and are shared with other pods, so a whole GPU cannot be given there; ask for a fraction, or for whole GPUs in a pool that is not time-sliced"
                )));
            }
        }
        // Each attempt has pods of its own names: a requeued workload never collides with its
        // old pods while they terminate. The attempt after a tracked one is known; a workload
        // this process has not seen starts at 0, and only if that name holds an ended pod (a
        // restart after a requeue) are its pods listed for the next free attempt.
        let known = {
            let st = sh.state.lock().unwrap();
            st.tracked.get(&spec.id).filter(|t| t.ns == ns).map(|t| {
                if t.stopping || t.stage == Stage::Ended {
                    t.attempt + 1
                } else {
                    t.attempt
                }
            })
        };
        let mut attempt = known.unwrap_or(0);
        let mut listed = false;
        let created = loop {
            let mut shares: Vec<(&str, &Devices, Pod)> = Vec::with_capacity(size);
            for i in 0..size {
                let (node, devices) = spec.share(i).expect("an index below the gang size");
                let pod = pods::attempt_pod_for(spec, &ns, attempt, i, &sh.shared_resource(node))?;
                shares.push((node, devices, pod));
            }
            {
                let mut st = sh.state.lock().unwrap();
                let fresh = || {
                    Tracked::new(
                        &ns,
                        attempt,
                        Stage::Accepted,
                        false,
                        (0..size).map(|i| names::attempt_pod_name(spec.id, attempt, i, size)),
                    )
                    .whole_gpus_of(spec)
                };
                match st.tracked.get_mut(&spec.id) {
                    Some(t) if t.attempt == attempt && t.ns == ns => t.stopping = false,
                    _ => {
                        st.tracked.insert(spec.id, fresh());
                    }
                }
            }
            for (node, devices, _) in &shares {
                if let Devices::Count {
                    resource: Resource::Mig { .. },
                    ..
                } = devices
                {
                    // Pods needing new instances are bound only once the MIG manager has applied
                    // the selected config.
                    sh.wait_mig(node, None).await?;
                }
            }
            if let Err(e) = sh.ensure_namespace(spec, &ns).await {
                sh.state.lock().unwrap().tracked.remove(&spec.id);
                return Err(e);
            }
            let owner = match sh.owner_of(&ns).await {
                Ok(o) => o,
                Err(e) => {
                    sh.state.lock().unwrap().tracked.remove(&spec.id);
                    return Err(e);
                }
            };
            for (_, _, pod) in &mut shares {
                pod.metadata.owner_references =
                    Some(vec![serde_json::from_value(owner.clone()).expect("an owner reference")]);
            }
            // All of a gang's pods exist before any is bound; a pod refused (quota) leaves none.
            let mut created = Vec::with_capacity(size);
            for (_, _, pod) in &shares {
                match sh.create_pod(&ns, pod).await {
                    Ok(p) => {
                        if let (Some(name), Some(uid)) = (p.metadata.name.clone(), p.metadata.uid.clone())
                            && let Some(t) = sh.state.lock().unwrap().tracked.get_mut(&spec.id)
                        {
                            t.uids.insert(name, uid);
                        }
                        created.push(p)
                    }
                    Err(e) => {
                        sh.state.lock().unwrap().tracked.remove(&spec.id);
                        let api = Api::<Pod>::namespaced(sh.client.clone(), &ns);
                        for p in &created {
                            let name = p.metadata.name.as_deref().unwrap_or_default();
                            if let Err(e) = api.delete(name, &DeleteParams::default().grace_period(0)).await
                                && !not_found(&e)
                            {
                                tracing::warn!(pod = %name, namespace = %ns, error = %e, "removing a gang's pod after a refused one");
                            }
                        }
                        return Err(e);
                    }
                }
            }
            // An earlier attempt's ended pod under these names: the next free attempt.
            if !listed && created.iter().any(pods::finished) {
                listed = true;
                let api = Api::<Pod>::namespaced(sh.client.clone(), &ns);
                for p in created.iter().filter(|p| !pods::finished(p)) {
                    let name = p.metadata.name.as_deref().unwrap_or_default();
                    let _ = api.delete(name, &DeleteParams::default().grace_period(0)).await;
                }
                attempt = sh.next_attempt(&ns, spec.id).await?.max(attempt + 1);
                continue;
            }
            break created;
        };
        let shares: Vec<&str> = (0..size)
            .map(|i| spec.share(i).expect("an index below the gang size").0)
            .collect();
        if size > 1 {
            sh.ensure_gang_service(spec, &ns, &created[0]).await?;
        }
        for (node, pod) in shares.iter().zip(&created) {
            sh.bind_pod(&ns, pod, node).await?;
        }
        let mut st = sh.state.lock().unwrap();
        if let Some(t) = st.tracked.get_mut(&spec.id)
            && t.stage == Stage::Accepted
        {
            t.stage = Stage::Started;
            let _ = sh.tx.send(BackendEvent::Started {
                id: spec.id,
                bound: None,
            });
        }
        Ok(())
    }

    async fn stop(&self, id: u64, grace: Duration) -> Result<(), BackendError> {
        let Some((ns, names)) = self.shared.stopping(id).await? else {
            // Nothing of it is on the cluster: stopped already.
            self.shared.send(BackendEvent::Stopped { id, at_ms: now_ms() });
            return Ok(());
        };
        let api = Api::<Pod>::namespaced(self.shared.client.clone(), &ns);
        for name in names {
            match api
                .delete(&name, &DeleteParams::default().grace_period(grace.as_secs() as u32))
                .await
            {
                Ok(_) => {}
                Err(e) if not_found(&e) => {
                    self.shared.on_pod_gone(id, &name, None);
                    continue;
                }
                Err(e) => return Err(kube_err(&format!("deleting pod {ns}/{name}"), e)),
            }
            self.shared
                .force_later(ns.clone(), name, grace + self.shared.cfg.force_delete_after);
        }
        Ok(())
    }

    async fn evict(&self, id: u64, grace: Duration) -> Result<(), BackendError> {
        let Some((ns, names)) = self.shared.stopping(id).await? else {
            self.shared.send(BackendEvent::Stopped { id, at_ms: now_ms() });
            return Ok(());
        };
        for name in names {
            self.shared.evict_pod(id, ns.clone(), name, grace).await?;
        }
        Ok(())
    }

    async fn cordon(&self, node: &str, on: bool) -> Result<(), BackendError> {
        Api::<Node>::all(self.shared.client.clone())
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"unschedulable": on}})),
            )
            .await
            .map_err(|e| kube_err(&format!("cordoning node {node}"), e))?;
        Ok(())
    }

    async fn reconcile(&self, expected: &[RunSpec]) -> Result<ReconcileReport, BackendError> {
        let sh = &self.shared;
        let list = Api::<Pod>::all(sh.client.clone())
            .list(&ListParams::default().labels(LABEL_WORKLOAD))
            .await
            .map_err(|e| kube_err("listing Tessera's pods", e))?;
        let mut by_id: HashMap<u64, Vec<Pod>> = HashMap::new();
        for p in list.items {
            if let Some(id) = pods::workload_id(&p) {
                by_id.entry(id).or_default().push(p);
            }
        }
        let mut report = ReconcileReport::default();
        for spec in expected {
            if let Some(native) = &spec.native {
                by_id.remove(&spec.id);
                report
                    .workloads
                    .push((spec.id, sh.reconcile_native(spec, native).await?));
                continue;
            }
            // Only pods in the workload's own namespace under its names are its pods; others
            // wearing its label are strangers'.
            let ns = names::namespace(&sh.cfg.namespace_prefix, &spec.tenant, &spec.project);
            let all = by_id.remove(&spec.id).unwrap_or_default();
            let (candidates, strangers): (Vec<Pod>, Vec<Pod>) = all.into_iter().partition(|p| {
                p.metadata.namespace.as_deref() == Some(ns.as_str())
                    && p.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| names::is_pod_name_of(n, spec.id))
            });
            if !strangers.is_empty() {
                let mut st = sh.state.lock().unwrap();
                for p in &strangers {
                    sh.stranger(&mut st, p, spec.id);
                }
            }
            if candidates.is_empty() {
                report.workloads.push((spec.id, Observation::Unknown));
                continue;
            }
            // The current attempt: the one with live pods, else the last.
            let attempt = candidates
                .iter()
                .filter(|p| !pods::finished(p))
                .map(pods::attempt)
                .max()
                .unwrap_or_else(|| candidates.iter().map(pods::attempt).max().unwrap_or(0));
            let mut found: Vec<Pod> = candidates.into_iter().filter(|p| pods::attempt(p) == attempt).collect();
            let size = spec.gang_size();
            let names: Vec<String> = (0..size)
                .map(|i| names::attempt_pod_name(spec.id, attempt, i, size))
                .collect();
            let deleting = found.iter().any(|p| p.metadata.deletion_timestamp.is_some());
            // A start Tessera did not finish (it stopped between creating a gang's pods, or
            // between creating and binding): finish it. Start creates all pods before binding
            // any, so a missing pod next to a bound one was deleted: the gang is lost.
            let any_bound = found.iter().any(|p| pods::bound_node(p).is_some());
            if !deleting && !any_bound {
                for (i, name) in names.iter().enumerate() {
                    if !found.iter().any(|p| p.metadata.name.as_deref() == Some(name)) {
                        let node = spec.share(i).expect("an index below the gang size").0;
                        let pod = pods::attempt_pod_for(spec, &ns, attempt, i, &sh.shared_resource(node))?;
                        found.push(sh.create_pod(&ns, &pod).await?);
                    }
                }
                if size > 1
                    && let Some(first) = found.iter().find(|p| p.metadata.name.as_deref() == Some(&names[0]))
                {
                    sh.ensure_gang_service(spec, &ns, first).await?;
                }
            }
            if !deleting {
                for p in &mut found {
                    if pods::bound_node(p).is_none()
                        && let Some((node, _)) = spec.share(pods::gang_index(p))
                    {
                        sh.bind_pod(&ns, p, node).await?;
                        p.spec.get_or_insert_default().node_name = Some(node.to_string());
                    }
                }
            }
            let states: Vec<(String, PodState)> = names
                .iter()
                .map(|n| {
                    let state = match found.iter().find(|p| p.metadata.name.as_deref() == Some(n)) {
                        Some(p) => pods::pod_state(p),
                        None if deleting => PodState::Pending,
                        None => PodState::Lost(format!("pod {ns}/{n} was deleted outside Tessera")),
                    };
                    (n.clone(), state)
                })
                .collect();
            let obs = pods::observation(pods::gang_state(&states));
            let stage = match obs {
                Observation::Running { .. } => Stage::Running,
                Observation::Starting => Stage::Started,
                _ => Stage::Ended,
            };
            let uids: HashMap<String, String> = found
                .iter()
                .filter_map(|p| Some((p.metadata.name.clone()?, p.metadata.uid.clone()?)))
                .collect();
            let mut st = sh.state.lock().unwrap();
            st.tracked.entry(spec.id).or_insert_with(|| {
                let mut t = Tracked::new(&ns, attempt, stage, deleting, names.iter().cloned()).whole_gpus_of(spec);
                t.pods = states;
                t.uids = uids;
                t
            });
            report.workloads.push((spec.id, obs));
        }
        // Finished pods of workloads no longer expected (their results are recorded) are
        // deleted once they are older than the TTL; a stranger's pods are left alone.
        let expired: Vec<(String, String)> = by_id
            .iter()
            .flat_map(|(id, ps)| ps.iter().map(move |p| (*id, p)))
            .filter(|(id, p)| {
                p.metadata.deletion_timestamp.is_none()
                    && p.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| names::is_pod_name_of(n, *id))
                    && p.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(names::LABEL_MANAGED_BY))
                        .is_some_and(|v| v == names::MANAGED_BY)
                    && matches!(pods::pod_state(p), PodState::Exited(_) | PodState::Lost(_))
                    && pods::finished_at_ms(p)
                        .is_some_and(|t| now_ms() - t >= sh.cfg.finished_pod_ttl.as_millis() as i64)
            })
            .filter_map(|(_, p)| Some((p.metadata.namespace.clone()?, p.metadata.name.clone()?)))
            .collect();
        for (ns, name) in expired {
            let owned = Api::<k8s_openapi::api::core::v1::Namespace>::all(sh.client.clone())
                .get_opt(&ns)
                .await
                .ok()
                .flatten()
                .is_some_and(|n| {
                    n.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(names::LABEL_MANAGED_BY))
                        .is_some_and(|v| v == names::MANAGED_BY)
                });
            if !owned {
                continue;
            }
            match Api::<Pod>::namespaced(sh.client.clone(), &ns)
                .delete(&name, &DeleteParams::default())
                .await
            {
                Ok(_) => tracing::debug!(pod = %name, namespace = %ns, "finished pod deleted after its TTL"),
                Err(e) if not_found(&e) => {}
                Err(e) => tracing::warn!(pod = %name, namespace = %ns, error = %e, "deleting a finished pod"),
            }
        }
        for (id, ps) in by_id {
            // Pods Tessera made; a native pod waiting in the queue is not an orphan.
            let live: Vec<&Pod> = ps
                .iter()
                .filter(|p| {
                    p.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(names::LABEL_MANAGED_BY))
                        .is_some_and(|v| v == names::MANAGED_BY)
                        && p.metadata.deletion_timestamp.is_none()
                        && !matches!(pods::pod_state(p), PodState::Exited(_) | PodState::Lost(_))
                })
                .collect();
            let Some(first) = live.first() else { continue };
            report.orphans.push(Orphan {
                id: Some(id),
                node: pods::bound_node(first).unwrap_or("").to_string(),
                detail: format!(
                    "pod(s) {} in {} labelled as Tessera workload {id}",
                    live.iter()
                        .filter_map(|p| p.metadata.name.as_deref())
                        .collect::<Vec<_>>()
                        .join(", "),
                    first.metadata.namespace.as_deref().unwrap_or(""),
                ),
            });
        }
        let (_, layouts) = sh.read_layouts().await?;
        let nodes = sh.state.lock().unwrap().nodes.clone();
        for (node, layout) in layouts {
            let Some(v) = nodes.get(&node) else { continue };
            if v.mig_config.as_deref() != Some(mig::config_name(&node, &layout).as_str())
                || v.mig_state.as_deref() != Some("success")
            {
                continue;
            }
            for (gpu, placed) in layout {
                report
                    .layouts
                    .push((node.clone(), gpu, placed.iter().map(MigInstance::from).collect()));
            }
        }
        Ok(report)
    }

    fn take_events(&self) -> Option<mpsc::UnboundedReceiver<BackendEvent>> {
        self.shared.rx.lock().unwrap().take()
    }

    async fn review_native(&self, review: &[u8]) -> Result<NativeReview, BackendError> {
        let req = admission::parse(review).map_err(BackendError::Rejected)?;
        let rules = self.shared.rules();
        if !admission::reviewed(&req, &rules) {
            return Ok(NativeReview::Pass);
        }
        let Some(pod) = &req.object else {
            return Ok(NativeReview::Pass);
        };
        let ns = req
            .namespace
            .clone()
            .or_else(|| pod.metadata.namespace.clone())
            .unwrap_or_default();
        let project = self.shared.project_of(&ns).await?;
        let review = admission::review_pod(
            pod,
            &ns,
            project.as_ref().map(|(t, p)| (t.as_str(), p.as_str())),
            &rules,
        );
        let mut pod = pod.clone();
        pod.metadata.namespace = Some(ns);
        let job = self.shared.job_of(&pod).await?;
        Ok(admission::with_gang(review, &pod, job.as_ref()))
    }

    fn answer_native(&self, review: &[u8], mutate: bool, refusal: Option<&str>) -> Result<Vec<u8>, BackendError> {
        let req = admission::parse(review).map_err(BackendError::Rejected)?;
        let patch = match (&req.object, mutate, refusal) {
            (Some(pod), true, None) if admission::reviewed(&req, &self.shared.rules()) => admission::mutation(pod),
            _ => Vec::new(),
        };
        Ok(admission::answer(&req, refusal, patch))
    }

    async fn adopt_native(&self, id: u64, native: &NativeRef) -> Result<(), BackendError> {
        let sh = &self.shared;
        sh.label_native(id, native).await?;
        sh.state
            .lock()
            .unwrap()
            .tracked
            .entry(id)
            .or_insert_with(|| Tracked::native(native, Stage::Accepted));
        Ok(())
    }

    fn tell_native(&self, native: &NativeRef, refused: bool, message: &str) {
        let reason = if refused { "TesseraRefused" } else { "TesseraWaiting" };
        for (name, uid) in native_pods(native) {
            self.shared.pod_event(
                &native.namespace,
                &name,
                Some(&uid),
                reason,
                &format!("Tessera: {message}"),
            );
        }
    }

    /// The container log of the workload's pod (its first pod for a multi-node gang), read
    /// through the API server (`pods/log`, which asks the kubelet). The log API has no offset:
    /// the first `offset + max` bytes are asked for and the part from `offset` returned. The log
    /// is done once the pod has ended and nothing past the returned part is left.
    async fn read_logs(&self, id: u64, offset: u64, max: usize) -> Result<LogChunk, BackendError> {
        let Some(pod) = self.shared.log_pod(id).await? else {
            return Err(BackendError::Rejected(format!(
                "no pod of workload {id} on the cluster: a pod's log goes with the pod"
            )));
        };
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        if pods::bound_node(&pod).is_none() || pods::pod_state(&pod) == PodState::Pending && !pod_started(&pod) {
            return Ok(LogChunk {
                bytes: Vec::new(),
                next_offset: offset,
                done: false,
            });
        }
        let want = offset.saturating_add(max as u64);
        let params = kube::api::LogParams {
            container: log_container(&pod),
            limit_bytes: Some(want.min(i64::MAX as u64) as i64),
            ..Default::default()
        };
        let text = Api::<Pod>::namespaced(self.shared.client.clone(), &ns)
            .logs(&name, &params)
            .await
            .map_err(|e| kube_err(&format!("reading the log of pod {ns}/{name}"), e))?;
        let all = text.into_bytes();
        let from = (offset as usize).min(all.len());
        let bytes = all[from..].to_vec();
        let next_offset = from as u64 + bytes.len() as u64;
        let ended = matches!(pods::pod_state(&pod), PodState::Exited(_) | PodState::Lost(_));
        Ok(LogChunk {
            bytes,
            next_offset,
            done: ended && (all.len() as u64) < want,
        })
    }

    async fn ensure_tenancy(&self, spec: &TenancySpec) -> Result<(), BackendError> {
        // A time-sliced pool's entry becomes every replica its nodes advertise, by resource.
        let mut spec = spec.clone();
        let shared: Vec<String> = spec
            .quota
            .keys()
            .filter(|k| k.starts_with(tessera_backend::SHARED_POOL_QUOTA))
            .cloned()
            .collect();
        for key in shared {
            spec.quota.remove(&key);
            let pool = &key[tessera_backend::SHARED_POOL_QUOTA.len()..];
            let st = self.shared.state.lock().unwrap();
            for v in st.nodes.values() {
                if v.pool.as_deref().unwrap_or(&self.shared.cfg.default_pool) != pool {
                    continue;
                }
                if let Some(r) = &v.shared_resource {
                    *spec.quota.entry(r.clone()).or_default() += u64::from(v.gpus) * u64::from(v.replicas);
                }
            }
        }
        let ns = tenancy::ensure(
            &self.shared.client,
            &self.shared.cfg.namespace_prefix,
            self.shared.cfg.identity.as_deref(),
            &spec,
        )
        .await?;
        let mut st = self.shared.state.lock().unwrap();
        st.projects
            .insert(ns.clone(), (spec.tenant.clone(), spec.project.clone()));
        st.namespaces.insert(ns);
        Ok(())
    }

    async fn remove_tenancy(&self, tenant: &str, project: Option<&str>) -> Result<(), BackendError> {
        let gone = tenancy::remove(&self.shared.client, &self.shared.cfg.namespace_prefix, tenant, project).await?;
        let mut st = self.shared.state.lock().unwrap();
        for ns in gone {
            st.projects.remove(&ns);
            st.namespaces.remove(&ns);
        }
        Ok(())
    }
}
