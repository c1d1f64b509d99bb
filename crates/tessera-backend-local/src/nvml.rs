//! The NVML layer: what the local backend needs from NVIDIA's management library, behind a
//! trait so that tests (and the documented `--fake-gpus` mode) can use [`crate::FakeNvml`]
//! while a machine with a driver uses [`crate::RealNvml`].

use std::fmt;

use serde::{Deserialize, Serialize};

/// An NVML call failed; the text says which call and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvmlError(pub String);

impl fmt::Display for NvmlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NvmlError {}

/// One physical GPU as NVML describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// NVML index (the order `nvidia-smi` shows).
    pub index: u32,
    /// `GPU-…`.
    pub uuid: String,
    /// `nvmlDeviceGetName`, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// `0000:17:00.0`.
    pub pci_bus_id: String,
    /// PCI device ID (upper 16 bits of NVML's `pciDeviceId`), e.g. `0x2330`.
    pub pci_device_id: u32,
    /// Total framebuffer, MiB.
    pub memory_mib: u64,
    /// Current MIG mode; `None` when the GPU does not support MIG.
    pub mig_enabled: Option<bool>,
    /// MIG mode pending a GPU reset, when it differs from the current one.
    pub mig_pending: Option<bool>,
}

/// A GPU instance (with its one full-size compute instance) on a GPU in MIG mode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GpuInstance {
    /// GPU instance ID (`GPU_I_ID`).
    pub id: u32,
    /// Device-specific profile ID (`nvidia-smi mig -lgip`).
    pub profile_id: u32,
    /// Placement: first memory slice and memory slices.
    pub start: u32,
    pub size: u32,
    /// `MIG-…` UUID of the MIG device (its compute instance), for `CUDA_VISIBLE_DEVICES`;
    /// `None` while the GPU instance has no compute instance.
    pub uuid: Option<String>,
}

/// One telemetry reading of a GPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Sample {
    /// Utilisation in percent; `None` in MIG mode, where NVML does not define it.
    pub util_pct: Option<f64>,
    pub fb_used_mib: u64,
    pub fb_free_mib: u64,
    pub temp_c: f64,
    pub power_w: f64,
}

/// An XID error NVML reported through its event set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct XidEvent {
    pub gpu: u32,
    /// The XID; 999 when NVML could not tell.
    pub xid: u64,
}

/// The XIDs NVIDIA documents as needing a GPU reset or a reboot (uncorrectable ECC, fallen off
/// the bus, NVLink fatal, …): 48, 63, 64, 74, 79 and 92–95. Such an error makes the GPU
/// unhealthy; other XIDs (application faults such as 13, 31, 43) do not.
pub fn xid_is_critical(xid: u64) -> bool {
    matches!(xid, 48 | 63 | 64 | 74 | 79 | 92..=95)
}

/// What the local backend asks of NVML. Every method is a read except
/// [`Nvml::create_instance`], [`Nvml::destroy_instance`] and [`Nvml::set_mig_mode`] (called
/// only by an admin's explicit `tessera node mig` on an idle GPU of a drained node, never by
/// Tessera on its own); there is deliberately no way to change clocks, to reset a GPU or any
/// other setting.
pub trait Nvml: Send + Sync {
    /// A short description of the implementation and driver (`driver 550.54.15`, `fake`).
    fn describe(&self) -> String;
    fn gpus(&self) -> Result<Vec<GpuInfo>, NvmlError>;
    /// The GPU instances of a GPU in MIG mode (empty otherwise).
    fn instances(&self, gpu: u32) -> Result<Vec<GpuInstance>, NvmlError>;
    /// Creates a GPU instance of `profile_id` at the placement `start`/`size` (memory slices;
    /// `nvmlDeviceCreateGpuInstanceWithPlacement`) and one compute instance covering it.
    fn create_instance(&self, gpu: u32, profile_id: u32, start: u32, size: u32) -> Result<GpuInstance, NvmlError>;
    /// Destroys the compute instances of GPU instance `id`, then the GPU instance.
    fn destroy_instance(&self, gpu: u32, id: u32) -> Result<(), NvmlError>;
    /// PCI bus IDs of the devices at the other end of this GPU's active NVLinks.
    fn nvlink_peers(&self, gpu: u32) -> Result<Vec<String>, NvmlError>;
    fn sample(&self, gpu: u32) -> Result<Sample, NvmlError>;
    /// Framebuffer `(used, free)` in MiB of GPU instance `id` (NVML's memory info on the MIG
    /// device handle).
    fn instance_memory(&self, gpu: u32, id: u32) -> Result<(u64, u64), NvmlError>;
    /// XID errors reported since the last call, waiting at most `timeout_ms` for the first.
    fn wait_xids(&self, timeout_ms: u32) -> Vec<XidEvent>;
    /// Switches MIG mode (`nvmlDeviceSetMigMode`). `Ok(true)`: the GPU is in the new mode now;
    /// `Ok(false)`: the driver holds the new mode pending a GPU reset (which the caller never
    /// performs). A GPU without MIG, or one in use, is an error.
    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<bool, NvmlError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_reset_or_reboot_xids_are_critical() {
        for x in [48, 63, 64, 74, 79, 92, 93, 94, 95] {
            assert!(xid_is_critical(x), "{x}");
        }
        for x in [13, 31, 43, 45, 91, 96, 999] {
            assert!(!xid_is_critical(x), "{x}");
        }
    }
}
