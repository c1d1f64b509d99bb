//! The fleet from the cluster: GPU nodes read from Node objects (device-plugin capacity, GPU
//! Feature Discovery labels, the configured pool label), mapped to the catalogue, and the
//! changes between two readings of a node (for `NodeChanged` events). Pure functions; the watch
//! lives in the backend.

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
/// GFD: whether the GPUs can do MIG.
pub const LABEL_MIG_CAPABLE: &str = "nvidia.com/mig.capable";
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
    pub cpu_milli: u64,
    pub memory_mib: u64,
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

/// The GPU node Tessera sees in `node`, or `None` when it has no NVIDIA GPU.
pub fn node_view(node: &Node, pool_label: &str) -> Option<NodeView> {
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
    Some(NodeView {
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
        mig_config: labels.get(LABEL_MIG_CONFIG).cloned(),
        mig_state: labels.get(LABEL_MIG_STATE).cloned(),
        unschedulable: node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false),
        ready,
        cpu_milli: alloc.get("cpu").and_then(|q| quantity(&q.0, 1000.0)).unwrap_or(0),
        memory_mib: alloc
            .get("memory")
            .and_then(|q| quantity(&q.0, 1.0 / (1024.0 * 1024.0)))
            .unwrap_or(0),
    })
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
        let mig = members
            .iter()
            .all(|(n, m)| n.mig_capable && cat.find(m).is_some_and(|id| cat.get(id).mig.is_some()));
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

/// What changed between two readings of a node, in the order an operator would say it.
pub fn changes(old: Option<&NodeView>, new: Option<&NodeView>) -> Vec<NodeChange> {
    match (old, new) {
        (None, None) => Vec::new(),
        (None, Some(_)) => vec![NodeChange::Added],
        (Some(_), None) => vec![NodeChange::Removed],
        (Some(a), Some(b)) => {
            let mut out = Vec::new();
            if a.unschedulable != b.unschedulable {
                out.push(NodeChange::Cordoned(b.unschedulable));
            }
            if a.ready != b.ready {
                out.push(NodeChange::Ready(b.ready));
            }
            if (a.gpus, a.whole, a.replicas, &a.mig) != (b.gpus, b.whole, b.replicas, &b.mig) {
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
        assert_eq!(changes(Some(&a), None), vec![NodeChange::Removed]);
        assert!(changes(Some(&a), Some(&a)).is_empty());
    }
}
