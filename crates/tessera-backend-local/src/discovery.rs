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
