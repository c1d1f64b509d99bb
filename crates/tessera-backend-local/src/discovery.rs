//! Discovery: this machine's GPUs as NVML reports them, mapped to the catalogue (unknown models
//! are served as whole GPUs and said so), with their MIG mode, existing instances and NVLink
//! peers. Read-only: it is also what `tessera gpu-check` prints.

use serde::Serialize;
use tessera_model::Catalogue;

use crate::nvml::{GpuInfo, GpuInstance, Nvml, NvmlError};

/// One discovered GPU.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DiscoveredGpu {
    #[serde(flatten)]
    pub info: GpuInfo,
    /// The catalogue model it maps to; `None` for a model the catalogue does not know.
    pub model: Option<String>,
    /// How Tessera serves it: `mig` (MIG mode on, instances at the engine's placements),
    /// `whole` (whole GPU, time-sliced shares).
    pub served_as: &'static str,
    /// A line for the operator when something is unusual (unknown model, MIG change pending).
    pub note: Option<String>,
    /// GPU instances found; the ones present at start-up are adopted and never destroyed.
    pub instances: Vec<GpuInstance>,
    /// NVML indices of the GPUs at the other end of its active NVLinks.
    pub nvlink_gpus: Vec<u32>,
    /// Active NVLinks to something that is not a GPU of this machine (an NVSwitch).
    pub nvlink_other: usize,
}

/// Everything discovery found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Discovery {
    /// Which NVML (driver version, or the fake).
    pub nvml: String,
    pub gpus: Vec<DiscoveredGpu>,
}

/// Maps an NVML device name (`NVIDIA H100 80GB HBM3`) to a catalogue model.
pub fn catalogue_model(cat: &Catalogue, nvml_name: &str) -> Option<String> {
    let short = nvml_name.strip_prefix("NVIDIA ").unwrap_or(nvml_name);
    [nvml_name, short, &short.replace(' ', "-")]
        .iter()
        .find_map(|n| cat.find(n))
        .map(|id| cat.get(id).name.clone())
}

/// Asks NVML about every GPU. Changes nothing.
pub fn discover(nvml: &dyn Nvml, cat: &Catalogue) -> Result<Discovery, NvmlError> {
    let infos = nvml.gpus()?;
    let mut gpus = Vec::new();
    for info in &infos {
        let model = catalogue_model(cat, &info.name);
        let mig_model = model
            .as_deref()
            .and_then(|m| cat.find(m))
            .is_some_and(|id| cat.get(id).mig.is_some());
        let mig_on = info.mig_enabled == Some(true);
        let instances = if mig_on {
            nvml.instances(info.index)?
        } else {
            Vec::new()
        };
        let peers = nvml.nvlink_peers(info.index).unwrap_or_default();
        let nvlink_gpus: Vec<u32> = infos
            .iter()
            .filter(|o| peers.iter().any(|p| p.eq_ignore_ascii_case(&o.pci_bus_id)))
            .map(|o| o.index)
            .collect();
        let mut notes = Vec::new();
        if model.is_none() {
            notes.push(format!(
                "{} is not in Tessera's catalogue: served as a whole GPU",
                info.name
            ));
        }
        if mig_on && !mig_model {
            notes
                .push("MIG mode is on but the catalogue has no MIG table for this model: served as a whole GPU".into());
        }
        if let Some(p) = info.mig_pending {
            notes.push(format!(
                "MIG mode {} is pending a GPU reset",
                if p { "on" } else { "off" }
            ));
        }
        gpus.push(DiscoveredGpu {
            info: info.clone(),
            served_as: if mig_on && mig_model { "mig" } else { "whole" },
            model,
            note: (!notes.is_empty()).then(|| notes.join("; ")),
            instances,
            nvlink_other: peers.len().saturating_sub(nvlink_gpus.len()),
            nvlink_gpus,
        });
    }
    Ok(Discovery {
        nvml: nvml.describe(),
        gpus,
    })
}

/// The fleet description (TOML, see `fleets/seed.toml`) of this machine as one node `node` in a
/// pool `local`: `mig` when some GPU is in MIG mode with a known MIG table (the GPUs out of
/// MIG mode then serve whole GPUs: the backend reports each GPU's mode, which the engine keeps
/// per GPU), `whole` otherwise; a model the catalogue does not know is declared as an opaque
/// whole GPU. NVLink: `nvswitch` when every GPU reaches a switch or every other GPU, `pairs`
/// when some are bridged.
///
/// One node has one GPU model; a machine mixing models is refused with a line saying so.
pub fn fleet_toml(d: &Discovery, node: &str, cpus: u32, memory_gib: u64) -> Result<String, String> {
    let first = d.gpus.first().ok_or("NVML reports no GPU on this machine")?;
    let name = |g: &DiscoveredGpu| g.model.clone().unwrap_or(g.info.name.clone());
    if let Some(other) = d.gpus.iter().find(|g| name(g) != name(first)) {
        return Err(format!(
            "this machine mixes GPU models (GPU {} is {}, GPU {} is {}); the local backend serves one model per machine",
            first.info.index,
            name(first),
            other.info.index,
            name(other),
        ));
    }
    let mig = d.gpus.iter().any(|g| g.served_as == "mig");
    let n = d.gpus.len();
    let nvlink = if d
        .gpus
        .iter()
        .all(|g| g.nvlink_other > 0 || g.nvlink_gpus.len() + 1 == n)
        && n > 1
    {
        "nvswitch"
    } else if d.gpus.iter().any(|g| !g.nvlink_gpus.is_empty()) {
        "pairs"
    } else {
        "none"
    };
    let q = |s: &str| serde_json::to_string(s).expect("a string");
    let mut out = String::new();
    if first.model.is_none() {
        out.push_str(&format!(
            "[[model]]\nname = {}\nmemory_gib = {}\n\n",
            q(&first.info.name),
            first.info.memory_mib / 1024
        ));
    }
    out.push_str(&format!(
        "[[pool]]\nname = \"local\"\nsharing = \"{}\"\n\n[[pool.nodes]]\nname = {}\ngpu_model = {}\ngpus = {n}\ncpus = {cpus}\nmemory_gib = {memory_gib}\nnvlink = \"{nvlink}\"\n",
        if mig { "mig" } else { "whole" },
        q(node),
        q(&name(first)),
    ));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FakeGpu, FakeNvml};

    #[test]
    fn nvml_names_map_to_the_catalogue() {
        let c = Catalogue::builtin();
        assert_eq!(
            catalogue_model(&c, "NVIDIA H100 80GB HBM3").as_deref(),
            Some("H100-80GB-SXM")
        );
        assert_eq!(catalogue_model(&c, "NVIDIA L4").as_deref(), Some("L4"));
        assert_eq!(
            catalogue_model(&c, "NVIDIA A100-SXM4-80GB").as_deref(),
            Some("A100-80GB")
        );
        assert_eq!(
            catalogue_model(&c, "NVIDIA A100 80GB PCIe").as_deref(),
            Some("A100-80GB-PCIE")
        );
        assert_eq!(catalogue_model(&c, "Quadro Imaginary"), None);
    }

    #[test]
    fn one_node_fleets_follow_the_machine() {
        let c = Catalogue::builtin();
        let d = discover(&FakeNvml::uniform(2, "L4"), &c).unwrap();
        let t = fleet_toml(&d, "box", 16, 64).unwrap();
        assert!(
            t.contains("sharing = \"whole\"") && t.contains("gpu_model = \"L4\"") && t.contains("gpus = 2"),
            "{t}"
        );
        assert!(t.contains("nvlink = \"none\""), "{t}");
        let mig = FakeNvml::new(vec![FakeGpu::of("A100-80GB").with_mig(&[]); 2]);
        let t = fleet_toml(&discover(&mig, &c).unwrap(), "box", 16, 64).unwrap();
        assert!(t.contains("sharing = \"mig\""), "{t}");
        let unknown = FakeNvml::new(vec![FakeGpu {
            name: "NVIDIA Imaginary X1".into(),
            memory_mib: 12288,
            mig_enabled: None,
            instances: Vec::new(),
            nvlink_peers: Vec::new(),
        }]);
        let t = fleet_toml(&discover(&unknown, &c).unwrap(), "box", 16, 64).unwrap();
        assert!(
            t.contains("[[model]]\nname = \"NVIDIA Imaginary X1\"\nmemory_gib = 12"),
            "{t}"
        );
        let fleet = tessera_model::Fleet::from_toml(&t, "local").unwrap();
        assert_eq!((fleet.nodes.len(), fleet.gpu_count()), (1, 1));
        let mixed = FakeNvml::new(vec![FakeGpu::of("L4"), FakeGpu::of("L40S")]);
        let e = fleet_toml(&discover(&mixed, &c).unwrap(), "box", 16, 64).unwrap_err();
        assert!(e.contains("mixes GPU models"), "{e}");
        // One model, one GPU in MIG mode and one not: a mig pool (the other serves whole GPUs).
        let modes = FakeNvml::new(vec![FakeGpu::of("A100-80GB").with_mig(&[]), FakeGpu::of("A100-80GB")]);
        let d = discover(&modes, &c).unwrap();
        assert_eq!((d.gpus[0].served_as, d.gpus[1].served_as), ("mig", "whole"));
        let t = fleet_toml(&d, "box", 16, 64).unwrap();
        assert!(t.contains("sharing = \"mig\"") && t.contains("gpus = 2"), "{t}");
    }
}
