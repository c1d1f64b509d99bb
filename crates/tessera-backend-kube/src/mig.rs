//! MIG through the GPU Operator: the engine's layout of a node's GPUs written as a mig-parted
//! config (one `devices: [i]` entry per GPU) into the MIG manager's ConfigMap, and selected with
//! the node label `nvidia.com/mig.config`. The config name carries a hash of the layout, so a
//! new layout is a new label value (the MIG manager acts on label changes); Tessera then waits
//! for `nvidia.com/mig.config.state=success` (`failed` is a partition failure naming the node).
//!
//! The engine's exact placements (profile ID, start slice) cannot be expressed in a mig-parted
//! config (the MIG manager lets the driver place instances); Tessera keeps them in an annotation
//! of the ConfigMap, `tessera.io/layout.<node>`, to report layouts at reconcile.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_yaml_ng::{Mapping, Value};
use tessera_backend::MigInstance;

/// Annotation prefix on the MIG manager's ConfigMap holding a node's placements (JSON).
pub const LAYOUT_ANNOTATION: &str = "tessera.io/layout.";

/// One GPU instance as stored in the layout annotation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placed {
    pub profile: String,
    pub profile_id: u32,
    pub start: u8,
    pub size: u8,
}

impl From<&MigInstance> for Placed {
    fn from(m: &MigInstance) -> Self {
        Placed {
            profile: m.profile.clone(),
            profile_id: m.profile_id,
            start: m.start,
            size: m.size,
        }
    }
}

impl From<&Placed> for MigInstance {
    fn from(p: &Placed) -> Self {
        MigInstance::new(p.profile.clone(), p.profile_id, p.start, p.size)
    }
}

/// A node's layout: GPU index → its instances (a GPU absent from the map has MIG off or is
/// not managed by Tessera).
pub type NodeLayout = BTreeMap<u8, Vec<Placed>>;

/// The name of the config for `layout` on `node`: `tessera-<node>-<hash>` (at most 63
/// characters, as a label value must be).
pub fn config_name(node: &str, layout: &NodeLayout) -> String {
    let text = serde_json::to_string(layout).expect("a layout serialises");
    let mut h: u64 = 0xcbf29ce484222325;
    for b in text.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    let node: String = crate::names::label_value(node).chars().take(45).collect();
    format!("tessera-{node}-{:08x}", h as u32)
}

/// The mig-parted entries of a layout: one per GPU, with the count of each profile.
pub fn config_entries(layout: &NodeLayout) -> Value {
    let entries: Vec<Value> = layout
        .iter()
        .map(|(gpu, instances)| {
            let mut counts: BTreeMap<String, u64> = BTreeMap::new();
            for i in instances {
                *counts.entry(i.profile.clone()).or_default() += 1;
            }
            let mut devices = Mapping::new();
            for (p, n) in counts {
                devices.insert(Value::String(p), Value::Number(n.into()));
            }
            let mut m = Mapping::new();
            m.insert(
                "devices".into(),
                Value::Sequence(vec![Value::Number((*gpu as u64).into())]),
            );
            m.insert("mig-enabled".into(), Value::Bool(true));
            m.insert("mig-devices".into(), Value::Mapping(devices));
            Value::Mapping(m)
        })
        .collect();
    Value::Sequence(entries)
}

/// Puts config `name` (for `node`) into the MIG manager's `config.yaml`, replacing older
/// Tessera configs of the same node and keeping every other config. Refuses a file that is
/// not a mig-parted v1 config.
pub fn put_config(existing: Option<&str>, node: &str, name: &str, layout: &NodeLayout) -> Result<String, String> {
    let mut doc: Value = match existing.map(str::trim).filter(|s| !s.is_empty()) {
        Some(text) => serde_yaml_ng::from_str(text).map_err(|e| format!("the MIG manager's config.yaml: {e}"))?,
        None => {
            let mut m = Mapping::new();
            m.insert("version".into(), "v1".into());
            Value::Mapping(m)
        }
    };
    let root = doc
        .as_mapping_mut()
        .ok_or("the MIG manager's config.yaml is not a mapping")?;
    if root.get("version").and_then(Value::as_str) != Some("v1") {
        return Err("the MIG manager's config.yaml is not a mig-parted `version: v1` config".into());
    }
    if !root.contains_key("mig-configs") {
        root.insert("mig-configs".into(), Value::Mapping(Mapping::new()));
    }
    let configs = root
        .get_mut("mig-configs")
        .and_then(Value::as_mapping_mut)
        .ok_or("mig-configs is not a mapping")?;
    let prefix = format!(
        "tessera-{}-",
        crate::names::label_value(node).chars().take(45).collect::<String>()
    );
    let stale: Vec<Value> = configs
        .keys()
        .filter(|k| k.as_str().is_some_and(|k| k.starts_with(&prefix) && k != name))
        .cloned()
        .collect();
    for k in stale {
        configs.remove(&k);
    }
    configs.insert(Value::String(name.to_string()), config_entries(layout));
    serde_yaml_ng::to_string(&doc).map_err(|e| e.to_string())
}

/// How many instances of each profile a layout has.
pub fn profile_counts(layout: &NodeLayout) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for i in layout.values().flatten() {
        *out.entry(i.profile.clone()).or_default() += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> NodeLayout {
        BTreeMap::from([
            (
                0,
                vec![
                    Placed::from(&MigInstance::new("3g.40gb", 9, 0, 4)),
                    Placed::from(&MigInstance::new("3g.40gb", 9, 4, 4)),
                ],
            ),
            (1, vec![Placed::from(&MigInstance::new("1g.10gb", 19, 0, 1))]),
        ])
    }

    #[test]
    fn layouts_become_per_gpu_mig_parted_entries() {
        let text = put_config(None, "gpu-a", &config_name("gpu-a", &layout()), &layout()).unwrap();
        let v: Value = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(v["version"], Value::from("v1"));
        let name = config_name("gpu-a", &layout());
        let entries = &v["mig-configs"][name.as_str()];
        assert_eq!(entries[0]["devices"][0], Value::from(0));
        assert_eq!(entries[0]["mig-enabled"], Value::Bool(true));
        assert_eq!(entries[0]["mig-devices"]["3g.40gb"], Value::from(2));
        assert_eq!(entries[1]["mig-devices"]["1g.10gb"], Value::from(1));
    }

    #[test]
    fn a_new_layout_replaces_the_old_config_of_its_node_only() {
        let base = "version: v1\nmig-configs:\n  all-disabled:\n    - devices: all\n      mig-enabled: false\n";
        let first = put_config(Some(base), "gpu-a", "tessera-gpu-a-00000001", &layout()).unwrap();
        let first = put_config(Some(&first), "gpu-b", "tessera-gpu-b-00000001", &layout()).unwrap();
        let second = put_config(Some(&first), "gpu-a", "tessera-gpu-a-00000002", &layout()).unwrap();
        let v: Value = serde_yaml_ng::from_str(&second).unwrap();
        let keys: Vec<&str> = v["mig-configs"]
            .as_mapping()
            .unwrap()
            .keys()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(
            keys,
            vec!["all-disabled", "tessera-gpu-b-00000001", "tessera-gpu-a-00000002"]
        );
        assert!(put_config(Some("version: v2\n"), "gpu-a", "x", &layout()).is_err());
    }

    #[test]
    fn config_names_change_with_the_layout() {
        let mut other = layout();
        other
            .get_mut(&1)
            .unwrap()
            .push(Placed::from(&MigInstance::new("1g.10gb", 19, 1, 1)));
        assert_ne!(config_name("gpu-a", &layout()), config_name("gpu-a", &other));
        assert!(config_name(&"n".repeat(80), &layout()).len() <= 63);
    }
}
