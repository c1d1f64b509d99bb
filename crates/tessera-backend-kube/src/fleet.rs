//! The fleet from the cluster: GPU nodes read from Node objects (device-plugin capacity, GPU
//! Feature Discovery labels, the configured pool label), mapped to the catalogue, the topology
//! levels above the node from configured node labels ([`TopologyLevel`], [`with_levels`]), and
//! the changes between two readings of a node (for `NodeChanged` events). Pure functions; the
//! watch lives in the backend.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use tessera_backend::NodeChange;
use tessera_model::Catalogue;

/// GFD: the GPU product (`NVIDIA-H100-80GB-HBM3`).
pub const LABEL_PRODUCT: &str = "nvidia.com/gpu.product";
/// GFD: the number of GPUs.
pub const LABEL_COUNT: &str = "nvidia.com/gpu.count";
/// GFD: board memory in MiB.
pub const LABEL_MEMORY: &str = "nvidia.com/gpu.memory";
/// GFD: whether the GPUs *can* do MIG (every A100/H100/H200, whatever their mode): never read
/// as "MIG is on".
pub const LABEL_MIG_CAPABLE: &str = "nvidia.com/mig.capable";
/// GFD / the device plugin: `none`, `single` or `mixed`.
pub const LABEL_MIG_STRATEGY: &str = "nvidia.com/mig.strategy";
/// The MIG manager's config that turns MIG off on every GPU.
pub const MIG_CONFIG_DISABLED: &str = "all-disabled";
/// The MIG manager: the selected mig-parted config.
pub const LABEL_MIG_CONFIG: &str = "nvidia.com/mig.config";
/// The MIG manager: `pending`, `rebooting`, `success` or `failed`.
pub const LABEL_MIG_STATE: &str = "nvidia.com/mig.config.state";
/// GFD: how many replicas the device plugin advertises per GPU (time-slicing).
pub const LABEL_REPLICAS: &str = "nvidia.com/gpu.replicas";
/// GFD: `none`, `time-slicing` or `mps`.
pub const LABEL_SHARING_STRATEGY: &str = "nvidia.com/gpu.sharing-strategy";
/// The device plugin's time-sliced replicas when it renames them (`renameByDefault`).
pub const RESOURCE_SHARED: &str = "nvidia.com/gpu.shared";
/// The device plugin's GPUs (time-sliced replicas too, unless renamed).
pub const RESOURCE_GPU: &str = "nvidia.com/gpu";

/// Taints that do not close a node by themselves: the GPU Operator's own (Tessera's pods
/// tolerate it), and the node lifecycle's `not-ready` / `unreachable`, which mirror the Ready
/// condition Tessera reads directly (the API server's admission adds `not-ready` to every new
/// node until the node lifecycle controller sees it Ready).
const TOLERATED_TAINTS: [&str; 3] = [
    RESOURCE_GPU,
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];

/// What Tessera reads of one GPU node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    /// The value of the configured pool label, if set.
    pub pool: Option<String>,
    pub product: Option<String>,
    pub gpus: u32,
    /// Board memory (MiB) from GFD, 0 when unknown.
    pub gpu_memory_mib: u32,
    /// Allocatable `nvidia.com/gpu`.
    pub whole: u32,
    /// Allocatable `nvidia.com/mig-<profile>` by profile.
    pub mig: BTreeMap<String, u32>,
    pub mig_capable: bool,
    /// Whether the node's GPUs are in MIG mode, as the device plugin and the MIG manager show
    /// it: `nvidia.com/mig-<profile>` resources advertised, or a MIG manager config other than
    /// `all-disabled` ([`mig_enabled`]).
    pub mig_enabled: bool,
    /// The device plugin's MIG strategy label, when set.
    pub mig_strategy: Option<String>,
    /// Time-sliced GPUs: the resource a fraction asks one replica of (`nvidia.com/gpu.shared`
    /// when the device plugin renames replicas, else `nvidia.com/gpu`); `None` when the node's
    /// GPUs are not shared.
    pub shared_resource: Option<String>,
    /// Time-sliced replicas per GPU (1 when not shared).
    pub replicas: u32,
    pub mig_config: Option<String>,
    pub mig_state: Option<String>,
    pub unschedulable: bool,
    pub ready: bool,
    /// A `NoSchedule` or `NoExecute` taint that Tessera's pods do not tolerate (anything but
    /// `nvidia.com/gpu`), by key: the node takes no new work while it has one.
    pub blocking_taint: Option<String>,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    /// The node's value of each configured topology level's label ([`TopologyLevel`], lowest
    /// first); `None` where the node has no such label.
    pub levels: Vec<Option<String>>,
}

/// A level of the network topology above the node, read from a node label (as Kueue's Topology
/// object lists node label keys, lowest first): `rack=topology.kubernetes.io/rack`, or a bare
/// key such as `nvidia.com/gpu.clique`, which is then also the level's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopologyLevel {
    /// The name gangs use (`--topology rack`).
    pub name: String,
    /// The node label whose value names the node's domain at this level.
    pub label: String,
}

impl TopologyLevel {
    /// Parses `NAME=LABEL` or `LABEL`.
    pub fn parse(spec: &str) -> Result<TopologyLevel, String> {
        let (name, label) = match spec.split_once('=') {
            Some((n, l)) => (n.trim(), l.trim()),
            None => (spec.trim(), spec.trim()),
        };
        if name.is_empty() || label.is_empty() {
            return Err(format!(
                "`{spec}` is not a topology level: write NAME=LABEL (rack=topology.kubernetes.io/rack) or a node label key"
            ));
        }
        Ok(TopologyLevel {
            name: name.to_string(),
            label: label.to_string(),
        })
    }
}

/// Parses a Kubernetes quantity into units of `1/scale` (so `"500m"` with scale 1000 is 500).
pub fn quantity(q: &str, scale: f64) -> Option<u64> {
    let q = q.trim();
    let split = q.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(q.len());
    let (num, suf) = q.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult = match suf {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024f64.powi(4),
        _ => return None,
    };
    let v = n * mult * scale;
    (v >= 0.0 && v.is_finite()).then(|| v.round() as u64)
}

/// The GPU node Tessera sees in `node`, or `None` when it has no NVIDIA GPU (no topology
/// levels configured).
pub fn node_view(node: &Node, pool_label: &str) -> Option<NodeView> {
    node_view_with(node, pool_label, &[])
}

/// [`node_view`] reading the node's place at each of `levels` from its labels.
pub fn node_view_with(node: &Node, pool_label: &str, levels: &[TopologyLevel]) -> Option<NodeView> {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let status = node.status.as_ref();
    let alloc = status
        .and_then(|s| s.allocatable.as_ref().or(s.capacity.as_ref()))
        .cloned()
        .unwrap_or_default();
    let count = |k: &str| alloc.get(k).and_then(|q| quantity(&q.0, 1.0)).unwrap_or(0) as u32;
    let whole = count(RESOURCE_GPU);
    let shared = count(RESOURCE_SHARED);
    let label_replicas: u32 = labels
        .get(LABEL_REPLICAS)
        .and_then(|r| r.parse().ok())
        .unwrap_or(1)
        .max(1);
    let strategy = labels.get(LABEL_SHARING_STRATEGY).map(String::as_str);
    // Time-slicing: renamed replicas, or `nvidia.com/gpu` with more than one replica per GPU
    // (MPS shares differently and is not offered as time-slicing).
    let time_sliced = strategy.is_none_or(|s| s == "time-slicing");
    let (shared_resource, replicas, physical) = if shared > 0 && time_sliced {
        let r = if label_replicas > 1 {
            label_replicas
        } else {
            let gpus: u32 = labels.get(LABEL_COUNT).and_then(|c| c.parse().ok()).unwrap_or(shared);
            (shared / gpus.max(1)).max(1)
        };
        (Some(RESOURCE_SHARED.to_string()), r, Some(shared / r))
    } else if label_replicas > 1 && whole > 0 && time_sliced {
        (
            Some(RESOURCE_GPU.to_string()),
            label_replicas,
            Some(whole / label_replicas),
        )
    } else {
        (None, 1, None)
    };
    let mig: BTreeMap<String, u32> = alloc
        .iter()
        .filter_map(|(k, q)| {
            let p = k.strip_prefix("nvidia.com/mig-")?;
            Some((p.to_string(), quantity(&q.0, 1.0).unwrap_or(0) as u32))
        })
        .collect();
    // Shared nodes: the physical GPUs are the allocatable replicas over the replicas per GPU.
    let gpus = physical.unwrap_or_else(|| labels.get(LABEL_COUNT).and_then(|c| c.parse().ok()).unwrap_or(whole));
    if gpus == 0 && mig.is_empty() {
        return None;
    }
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    let blocking_taint = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .and_then(|ts| {
            ts.iter().find(|t| {
                !TOLERATED_TAINTS.contains(&t.key.as_str()) && matches!(t.effect.as_str(), "NoSchedule" | "NoExecute")
            })
        })
        .map(|t| t.key.clone());
    let mig_config = labels.get(LABEL_MIG_CONFIG).cloned();
    let mig_strategy = labels.get(LABEL_MIG_STRATEGY).cloned();
    Some(NodeView {
        mig_enabled: mig_enabled(
            &mig,
            mig_config.as_deref(),
            mig_strategy.as_deref(),
            labels.get(LABEL_PRODUCT).map(String::as_str),
        ),
        mig_strategy,
        blocking_taint,
        name: node.metadata.name.clone().unwrap_or_default(),
        pool: labels.get(pool_label).cloned(),
        product: labels.get(LABEL_PRODUCT).cloned(),
        gpus,
        gpu_memory_mib: labels.get(LABEL_MEMORY).and_then(|m| m.parse().ok()).unwrap_or(0),
        whole,
        mig,
        mig_capable: labels.get(LABEL_MIG_CAPABLE).is_some_and(|v| v == "true"),
        shared_resource,
        replicas,
        mig_config,
        mig_state: labels.get(LABEL_MIG_STATE).cloned(),
        levels: levels.iter().map(|l| labels.get(&l.label).cloned()).collect(),
        unschedulable: node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false),
        ready,
        cpu_milli: alloc.get("cpu").and_then(|q| quantity(&q.0, 1000.0)).unwrap_or(0),
        memory_mib: alloc
            .get("memory")
            .and_then(|q| quantity(&q.0, 1.0 / (1024.0 * 1024.0)))
            .unwrap_or(0),
    })
}

/// Whether a node's GPUs are in MIG mode. `nvidia.com/mig.capable` says only that they could
/// be (GFD sets it from the capability, on every A100/H100/H200), so it is not read here. MIG is
/// on when the device plugin advertises MIG devices (`nvidia.com/mig-<profile>` under the
/// `mixed` strategy; under `single`, a product with a `-MIG-<profile>` suffix), or when the MIG
/// manager's selected config is anything but `all-disabled` (it may be applying it still).
pub fn mig_enabled(
    mig_resources: &BTreeMap<String, u32>,
    mig_config: Option<&str>,
    mig_strategy: Option<&str>,
    product: Option<&str>,
) -> bool {
    if mig_resources.values().any(|&n| n > 0) {
        return true;
    }
    if mig_strategy == Some("single") && product.is_some_and(|p| p.contains("-MIG-")) {
        return true;
    }
    mig_config.is_some_and(|c| c != MIG_CONFIG_DISABLED)
}

impl NodeView {
    /// Whether the node takes new work: Ready, not cordoned, no taint Tessera's pods do not
    /// tolerate.
    pub fn schedulable(&self) -> bool {
        self.ready && !self.unschedulable && self.blocking_taint.is_none()
    }

    /// Why the node takes no new work, in an operator's words; `None` when it does.
    pub fn unavailable_reason(&self) -> Option<String> {
        if !self.ready {
            Some(format!("node {} is not Ready", self.name))
        } else if self.unschedulable {
            Some(format!("node {} is cordoned (spec.unschedulable)", self.name))
        } else {
            self.blocking_taint
                .as_ref()
                .map(|k| format!("node {} has the taint {k}", self.name))
        }
    }
}

/// Maps a GFD product label to a catalogue model: `NVIDIA-H100-80GB-HBM3` → `H100-80GB-SXM`
/// (through its alias `NVIDIA H100 80GB HBM3`). The device plugin's `-SHARED` and the single
/// strategy's `-MIG-<profile>` suffixes are ignored.
pub fn catalogue_model(cat: &Catalogue, product: &str) -> Option<String> {
    let base = product.strip_suffix("-SHARED").unwrap_or(product);
    let base = base.split("-MIG-").next().unwrap_or(base);
    let short = base.strip_prefix("NVIDIA-").unwrap_or(base);
    [
        base.to_string(),
        short.to_string(),
        base.replace('-', " "),
        short.replace('-', " "),
    ]
    .iter()
    .find_map(|n| cat.find(n))
    .map(|id| cat.get(id).name.clone())
}

/// The fleet description (TOML, see `fleets/seed.toml`) of the cluster's GPU nodes. A node's
/// pool is the value of the pool label (`default_pool` without one); a pool is `shared` when
/// all its nodes' GPUs are time-sliced by the device plugin (tenants may share a GPU there only
/// in `mixing_pools`), `mig` when all its nodes are MIG-capable with a catalogue MIG table,
/// `whole` otherwise. Unknown products are declared as opaque models. Nodes with a product the
/// catalogue does not know and no product label at all are skipped with a warning.
pub fn fleet_toml(
    nodes: &[NodeView],
    cat: &Catalogue,
    default_pool: &str,
    mixing_pools: &std::collections::BTreeSet<String>,
) -> Result<String, String> {
    let mut pools: BTreeMap<String, Vec<(&NodeView, String)>> = BTreeMap::new();
    let mut opaque: BTreeMap<String, u32> = BTreeMap::new();
    for n in nodes {
        let Some(product) = &n.product else {
            tracing::warn!(node = %n.name, "GPU node without the {LABEL_PRODUCT} label (GPU Feature Discovery): skipped");
            continue;
        };
        if n.mig_strategy.as_deref() == Some("single") && n.mig_enabled {
            tracing::warn!(node = %n.name, "the device plugin's MIG strategy is `single` (MIG devices advertised as nvidia.com/gpu): Tessera needs the `mixed` strategy to ask for a MIG profile; node skipped");
            continue;
        }
        let model = match catalogue_model(cat, product) {
            Some(m) => m,
            None => {
                opaque.insert(product.clone(), n.gpu_memory_mib);
                product.clone()
            }
        };
        let pool = n.pool.clone().unwrap_or_else(|| default_pool.to_string());
        pools.entry(pool).or_default().push((n, model));
    }
    if pools.is_empty() {
        return Err("the cluster has no GPU node (no Node with nvidia.com/gpu capacity and a product label)".into());
    }
    let q = |s: &str| serde_json::to_string(s).expect("a string");
    let mut out = String::new();
    for (name, mem) in &opaque {
        out.push_str(&format!(
            "[[model]]\nname = {}\nmemory_gib = {}\n\n",
            q(name),
            mem / 1024
        ));
    }
    for (pool, members) in &pools {
        // A pool partitions with MIG when some of its nodes are in MIG mode and every node's
        // model has a MIG table; its nodes in MIG mode off serve whole GPUs (reported as the
        // GPUs' MIG mode, see `mig_modes`).
        let mig = members.iter().any(|(n, _)| n.mig_enabled)
            && members
                .iter()
                .all(|(_, m)| cat.find(m).is_some_and(|id| cat.get(id).mig.is_some()));
        let shared = members.iter().all(|(n, _)| n.shared_resource.is_some());
        if !shared && members.iter().any(|(n, _)| n.shared_resource.is_some()) {
            tracing::warn!(pool = %pool, "some of the pool's nodes time-slice their GPUs and some do not: the pool serves whole GPUs");
        }
        let sharing = if shared {
            "shared"
        } else if mig {
            "mig"
        } else {
            "whole"
        };
        out.push_str(&format!("[[pool]]\nname = {}\nsharing = \"{sharing}\"\n", q(pool)));
        if shared && mixing_pools.contains(pool) {
            out.push_str("allow_tenant_mixing = true\n");
        }
        if shared {
            // The device plugin hands out replicas, which may come from different GPUs and
            // are shared with other pods: no whole GPU can be given there.
            out.push_str("whole_gpus = false\n");
        }
        out.push('\n');
        for (n, model) in members {
            out.push_str(&format!(
                "[[pool.nodes]]\nname = {}\ngpu_model = {}\ngpus = {}\ncpus = {}\nmemory_gib = {}\n\n",
                q(&n.name),
                q(model),
                n.gpus.min(16),
                (n.cpu_milli / 1000).max(1),
                (n.memory_mib / 1024).max(1),
            ));
        }
    }
    Ok(out)
}

/// `fleet` with the topology levels read from its nodes' labels ([`NodeView::levels`]). A pool
/// whose nodes all lack a level's label is flat at that level; one where only some carry it,
/// or a domain spanning pools, is an error naming the node and the label.
pub fn with_levels(
    fleet: tessera_model::Fleet,
    views: &[NodeView],
    levels: &[TopologyLevel],
) -> Result<tessera_model::Fleet, String> {
    if levels.is_empty() {
        return Ok(fleet);
    }
    let by_name: std::collections::HashMap<&str, &NodeView> = views.iter().map(|v| (v.name.as_str(), v)).collect();
    let names: Vec<String> = levels.iter().map(|l| l.name.clone()).collect();
    let node_names: Vec<String> = fleet.nodes.iter().map(|n| n.name.clone()).collect();
    fleet
        .with_levels(&names, |node, level| {
            by_name
                .get(node_names[node].as_str())
                .and_then(|v| v.levels.get(level).cloned().flatten())
        })
        .map_err(|e| {
            let label = levels
                .iter()
                .find(|l| l.name == e.level)
                .map_or(String::new(), |l| format!(" (node label `{}`)", l.label));
            format!("topology level {e}{label}")
        })
}

/// The changes a node that is already closed to new work at start-up is reported with, so that
/// the control plane learns of a cordon or NotReady that happened before it connected.
pub fn initial_changes(v: &NodeView) -> Vec<NodeChange> {
    let mut out = Vec::new();
    if v.unschedulable || v.blocking_taint.is_some() {
        out.push(NodeChange::Cordoned(true));
    }
    if !v.ready {
        out.push(NodeChange::Ready(false));
    }
    out
}

/// What changed between two readings of a node, in the order an operator would say it.
pub fn changes(old: Option<&NodeView>, new: Option<&NodeView>) -> Vec<NodeChange> {
    match (old, new) {
        (None, None) => Vec::new(),
        // A node that joins closed to new work (NotReady until its kubelet reports, cordoned)
        // says so with its arrival.
        (None, Some(v)) => std::iter::once(NodeChange::Added).chain(initial_changes(v)).collect(),
        (Some(_), None) => vec![NodeChange::Removed],
        (Some(a), Some(b)) => {
            let mut out = Vec::new();
            // A taint Tessera's pods do not tolerate keeps work off the node as a cordon does.
            let closed = |v: &NodeView| v.unschedulable || v.blocking_taint.is_some();
            if closed(a) != closed(b) {
                out.push(NodeChange::Cordoned(closed(b)));
            }
            if a.ready != b.ready {
                out.push(NodeChange::Ready(b.ready));
            }
            // A new rack or block label moves the node in the topology: the fleet changes.
            if (a.gpus, a.whole, a.replicas, &a.mig, a.mig_enabled, &a.levels)
                != (b.gpus, b.whole, b.replicas, &b.mig, b.mig_enabled, &b.levels)
            {
                out.push(NodeChange::Capacity);
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(json: serde_json::Value) -> Node {
        serde_json::from_value(json).unwrap()
    }

    fn h100(name: &str, pool: &str) -> Node {
        node(serde_json::json!({
            "metadata": {"name": name, "labels": {
                "tessera.io/pool": pool,
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.count": "8",
                "nvidia.com/gpu.memory": "81559",
            }},
            "status": {
                "allocatable": {"nvidia.com/gpu": "8", "cpu": "112", "memory": "2Ti"},
                "conditions": [{"type": "Ready", "status": "True"}],
            }
        }))
    }

    /// A Node as GPU Feature Discovery, the device plugin and the MIG manager label it
    /// (tests/fixtures/gfd: label sets taken from NVIDIA's sources, see its README).
    fn gfd(file: &str) -> Node {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gfd/");
        let text = std::fs::read_to_string(format!("{dir}{file}")).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    #[test]
    fn mig_capable_gpus_with_mig_off_serve_whole_gpus() {
        // GFD labels every A100/H100 `mig.capable=true`, whatever its mode: an H100 pool with
        // MIG off (the MIG manager's `all-disabled`, or no MIG manager at all) is a whole pool.
        let c = Catalogue::builtin();
        for file in ["h100-whole.json", "h100-mig-capable-no-manager.json"] {
            let v = node_view(&gfd(file), "tessera.io/pool").unwrap();
            assert!(v.mig_capable && !v.mig_enabled, "{file}: {v:?}");
            assert_eq!((v.gpus, v.whole), (8, 8), "{file}");
            let toml = fleet_toml(&[v], &c, "default", &Default::default()).unwrap();
            let f = tessera_model::Fleet::from_toml(&toml, "cluster").unwrap();
            assert_eq!(f.pools[0].sharing, tessera_model::Sharing::Whole, "{file}: {toml}");
        }
    }

    #[test]
    fn mixed_strategy_mig_nodes_make_a_mig_pool_and_single_strategy_ones_are_skipped() {
        let c = Catalogue::builtin();
        let mixed = node_view(&gfd("a100-mig-mixed.json"), "tessera.io/pool").unwrap();
        assert!(mixed.mig_enabled, "{mixed:?}");
        assert_eq!(mixed.gpus, 8, "physical GPUs from gpu.count, not the MIG devices");
        assert_eq!(mixed.mig.get("3g.40gb"), Some(&8));
        let toml = fleet_toml(std::slice::from_ref(&mixed), &c, "default", &Default::default()).unwrap();
        let f = tessera_model::Fleet::from_toml(&toml, "cluster").unwrap();
        assert_eq!(f.pools[0].sharing, tessera_model::Sharing::Mig, "{toml}");
        // A MIG-off H100 next to MIG-on nodes in one pool: the pool is MIG, and the node
        // reports MIG off (so the engine serves whole GPUs there).
        let mut off = node_view(&gfd("h100-whole.json"), "tessera.io/pool").unwrap();
        off.pool = mixed.pool.clone();
        let toml = fleet_toml(&[mixed, off], &c, "default", &Default::default()).unwrap();
        let f = tessera_model::Fleet::from_toml(&toml, "cluster").unwrap();
        assert_eq!(f.pools[0].sharing, tessera_model::Sharing::Mig, "{toml}");
        // `single`: MIG devices advertised as nvidia.com/gpu, which a profile request cannot
        // name: skipped (with a warning), never served as whole GPUs.
        let single = node_view(&gfd("a100-mig-single.json"), "tessera.io/pool").unwrap();
        assert!(single.mig_enabled);
        assert!(fleet_toml(&[single], &c, "default", &Default::default()).is_err());
    }

    #[test]
    fn time_sliced_gfd_nodes_are_shared_pools_of_their_physical_gpus() {
        for (file, resource) in [
            ("l40s-timesliced.json", RESOURCE_GPU),
            ("l40s-timesliced-renamed.json", RESOURCE_SHARED),
        ] {
            let v = node_view(&gfd(file), "tessera.io/pool").unwrap();
            assert_eq!(
                (v.shared_resource.as_deref(), v.replicas, v.gpus),
                (Some(resource), 4, 4),
                "{file}"
            );
            let toml = fleet_toml(&[v], &Catalogue::builtin(), "default", &Default::default()).unwrap();
            let f = tessera_model::Fleet::from_toml(&toml, "cluster").unwrap();
            assert_eq!(f.pools[0].sharing, tessera_model::Sharing::Shared, "{file}");
        }
    }

    #[test]
    fn cordons_taints_and_not_ready_close_a_node() {
        let mut n = gfd("h100-whole.json");
        let v = node_view(&n, "tessera.io/pool").unwrap();
        assert!(v.schedulable() && initial_changes(&v).is_empty());
        // Tessera's pods tolerate the GPU Operator's own taint.
        n.spec.get_or_insert_default().taints = Some(vec![k8s_openapi::api::core::v1::Taint {
            key: "nvidia.com/gpu".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]);
        assert!(node_view(&n, "tessera.io/pool").unwrap().schedulable());
        n.spec.get_or_insert_default().taints = Some(vec![k8s_openapi::api::core::v1::Taint {
            key: "example.com/maintenance".into(),
            effect: "NoExecute".into(),
            ..Default::default()
        }]);
        let tainted = node_view(&n, "tessera.io/pool").unwrap();
        assert!(!tainted.schedulable());
        assert_eq!(changes(Some(&v), Some(&tainted)), vec![NodeChange::Cordoned(true)]);
        assert_eq!(initial_changes(&tainted), vec![NodeChange::Cordoned(true)]);
        let mut down = v.clone();
        down.ready = false;
        assert_eq!(initial_changes(&down), vec![NodeChange::Ready(false)]);
        assert!(down.unavailable_reason().unwrap().contains("not Ready"));
    }

    #[test]
    fn quantities_parse_in_kubernetes_units() {
        assert_eq!(quantity("500m", 1000.0), Some(500));
        assert_eq!(quantity("2", 1000.0), Some(2000));
        assert_eq!(quantity("1Gi", 1.0 / (1024.0 * 1024.0)), Some(1024));
        assert_eq!(quantity("8", 1.0), Some(8));
        assert_eq!(quantity("8x", 1.0), None);
    }

    #[test]
    fn gfd_products_map_to_the_catalogue() {
        let c = Catalogue::builtin();
        assert_eq!(
            catalogue_model(&c, "NVIDIA-H100-80GB-HBM3").as_deref(),
            Some("H100-80GB-SXM")
        );
        assert_eq!(
            catalogue_model(&c, "NVIDIA-A100-SXM4-80GB").as_deref(),
            Some("A100-80GB")
        );
        assert_eq!(
            catalogue_model(&c, "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb").as_deref(),
            Some("A100-80GB")
        );
        assert_eq!(catalogue_model(&c, "NVIDIA-Imaginary-X1"), None);
    }

    #[test]
    fn gpu_nodes_become_a_fleet_by_pool_label() {
        let c = Catalogue::builtin();
        let cpu_only = node(serde_json::json!({"metadata": {"name": "cpu"}, "status": {"allocatable": {"cpu": "8"}}}));
        assert!(node_view(&cpu_only, "tessera.io/pool").is_none());
        let views: Vec<NodeView> = [h100("a", "training"), h100("b", "training"), h100("c", "serving")]
            .iter()
            .filter_map(|n| node_view(n, "tessera.io/pool"))
            .collect();
        assert_eq!(views[0].memory_mib, 2 * 1024 * 1024);
        assert_eq!((views[0].cpu_milli, views[0].gpus, views[0].ready), (112_000, 8, true));
        let toml = fleet_toml(&views, &c, "default", &Default::default()).unwrap();
        let fleet = tessera_model::Fleet::from_toml(&toml, "cluster").unwrap();
        assert_eq!(fleet.pools.len(), 2);
        assert_eq!(fleet.gpu_count(), 24);
        assert!(toml.contains("sharing = \"whole\""), "{toml}");
    }

    #[test]
    fn time_sliced_nodes_make_a_shared_pool_of_their_physical_gpus() {
        let c = Catalogue::builtin();
        let renamed = node(serde_json::json!({
            "metadata": {"name": "s0", "labels": {"tessera.io/pool": "dev",
                "nvidia.com/gpu.product": "NVIDIA-L40S-SHARED", "nvidia.com/gpu.count": "2",
                "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"}},
            "status": {"allocatable": {"nvidia.com/gpu.shared": "8", "cpu": "64", "memory": "512Gi"}},
        }));
        let plain = node(serde_json::json!({
            "metadata": {"name": "s1", "labels": {"tessera.io/pool": "dev",
                "nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.replicas": "4"}},
            "status": {"allocatable": {"nvidia.com/gpu": "12", "cpu": "64", "memory": "512Gi"}},
        }));
        let mps = node(serde_json::json!({
            "metadata": {"name": "s2", "labels": {"tessera.io/pool": "mps",
                "nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.count": "2",
                "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "mps"}},
            "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi"}},
        }));
        let v: Vec<NodeView> = [renamed, plain, mps]
            .iter()
            .filter_map(|n| node_view(n, "tessera.io/pool"))
            .collect();
        assert_eq!(
            (v[0].shared_resource.as_deref(), v[0].replicas, v[0].gpus),
            (Some("nvidia.com/gpu.shared"), 4, 2)
        );
        assert_eq!(
            (v[1].shared_resource.as_deref(), v[1].replicas, v[1].gpus),
            (Some("nvidia.com/gpu"), 4, 3)
        );
        assert_eq!(v[2].shared_resource, None, "MPS is not time-slicing");
        let fleet = |mixing: &[&str]| {
            let m = mixing.iter().map(|s| s.to_string()).collect();
            tessera_model::Fleet::from_toml(&fleet_toml(&v, &c, "default", &m).unwrap(), "cluster").unwrap()
        };
        let f = fleet(&[]);
        let dev = f.pool(f.pool_by_name("dev").unwrap());
        assert_eq!(dev.sharing, tessera_model::Sharing::Shared);
        assert!(!dev.allow_tenant_mixing, "one tenant per GPU unless configured");
        assert_eq!(
            f.pool(f.pool_by_name("mps").unwrap()).sharing,
            tessera_model::Sharing::Whole
        );
        assert_eq!(f.gpu_count(), 2 + 3 + 2);
        let f = fleet(&["dev"]);
        assert!(f.pool(f.pool_by_name("dev").unwrap()).allow_tenant_mixing);
    }

    #[test]
    fn node_changes_are_named() {
        let a = node_view(&h100("a", "p"), "tessera.io/pool").unwrap();
        let mut b = a.clone();
        b.unschedulable = true;
        b.ready = false;
        b.whole = 7;
        assert_eq!(
            changes(Some(&a), Some(&b)),
            vec![
                NodeChange::Cordoned(true),
                NodeChange::Ready(false),
                NodeChange::Capacity
            ]
        );
        assert_eq!(changes(None, Some(&a)), vec![NodeChange::Added]);
        let mut joining = a.clone();
        joining.ready = false;
        assert_eq!(
            changes(None, Some(&joining)),
            vec![NodeChange::Added, NodeChange::Ready(false)],
            "a node that joins NotReady takes no work until it is Ready"
        );
        assert_eq!(changes(Some(&a), None), vec![NodeChange::Removed]);
        assert!(changes(Some(&a), Some(&a)).is_empty());
    }

    #[test]
    fn topology_levels_come_from_the_configured_node_labels() {
        let levels = vec![
            TopologyLevel::parse("rack=topology.kubernetes.io/rack").unwrap(),
            TopologyLevel::parse("nvidia.com/gpu.clique").unwrap(),
        ];
        assert_eq!(levels[1].name, "nvidia.com/gpu.clique");
        assert!(TopologyLevel::parse("rack=").unwrap_err().contains("NAME=LABEL"));
        let labelled = |name: &str, rack: Option<&str>, clique: &str| {
            let mut n = h100(name, "training");
            let l = n.metadata.labels.as_mut().unwrap();
            if let Some(r) = rack {
                l.insert("topology.kubernetes.io/rack".into(), r.into());
            }
            l.insert("nvidia.com/gpu.clique".into(), clique.into());
            node_view_with(&n, "tessera.io/pool", &levels).unwrap()
        };
        let views = vec![
            labelled("n0", Some("r0"), "c0"),
            labelled("n1", Some("r0"), "c0"),
            labelled("n2", Some("r1"), "c0"),
            labelled("n3", Some("r1"), "c0"),
        ];
        let build = |views: &[NodeView]| {
            let toml = fleet_toml(views, &Catalogue::builtin(), "default", &Default::default()).unwrap();
            with_levels(
                tessera_model::Fleet::from_toml(&toml, "cluster").unwrap(),
                views,
                &levels,
            )
        };
        let f = build(&views).unwrap();
        assert_eq!(f.levels.names(), ["rack", "nvidia.com/gpu.clique"]);
        let n2 = tessera_model::NodeId(f.nodes.iter().position(|n| n.name == "n2").unwrap() as u32);
        assert_eq!(f.levels.path(n2), vec![("rack", "r1"), ("nvidia.com/gpu.clique", "c0")]);
        // One node of the pool without a rack label: the error names the node and the label.
        let mut partial = views.clone();
        partial[3] = labelled("n3", None, "c0");
        let e = build(&partial).unwrap_err();
        assert!(e.contains("n3") && e.contains("topology.kubernetes.io/rack"), "{e}");
        // A node moved to another rack changes the fleet.
        let moved = labelled("n1", Some("r1"), "c0");
        assert_eq!(changes(Some(&views[1]), Some(&moved)), vec![NodeChange::Capacity]);
        // Without levels configured every pool is flat.
        let toml = fleet_toml(&views, &Catalogue::builtin(), "default", &Default::default()).unwrap();
        let flat = with_levels(tessera_model::Fleet::from_toml(&toml, "cluster").unwrap(), &views, &[]).unwrap();
        assert!(flat.levels.is_empty());
    }
}
