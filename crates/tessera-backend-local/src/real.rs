//! The real NVML layer: `nvml-wrapper` 0.13 for everything it wraps, and raw NVML through
//! [`nvml_wrapper::Nvml::lib`] for GPU/compute-instance listing, creation at an explicit
//! placement and destruction, which the wrapper lacks (reference §5). Nothing here changes MIG
//! mode, clocks or any other setting.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::nvml_try;
use nvml_wrapper::{Device, EventSet};
use nvml_wrapper_sys::bindings::{
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, NVML_COMPUTE_INSTANCE_PROFILE_COUNT, NVML_GPU_INSTANCE_PROFILE_COUNT,
    NVML_NVLINK_MAX_LINKS, nvmlComputeInstance_t, nvmlComputeInstanceProfileInfo_t, nvmlGpuInstance_t,
    nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_t,
};

use crate::nvml::{GpuInfo, GpuInstance, Nvml, NvmlError, Sample, XidEvent};

/// NVML on this machine's driver.
pub struct RealNvml {
    /// Leaked once per process: event sets borrow the library handle for their whole life.
    nvml: &'static nvml_wrapper::Nvml,
    /// One XID event set per GPU that supports them (a failed registration consumes the set).
    events: Mutex<Vec<(u32, EventSet<'static>)>>,
}

fn err(what: &str, e: impl std::fmt::Display) -> NvmlError {
    NvmlError(format!("{what}: {e}"))
}

fn raw(what: &str, code: u32) -> Result<(), NvmlError> {
    nvml_try(code).map_err(|e| err(what, e))
}

impl RealNvml {
    /// Loads `libnvidia-ml.so.1` and initialises NVML; fails with one readable line when there
    /// is no NVIDIA driver.
    pub fn init() -> Result<RealNvml, NvmlError> {
        let nvml = nvml_wrapper::Nvml::init().map_err(|e| {
            NvmlError(format!(
                "no usable NVIDIA driver (NVML: {e}); is the driver installed and libnvidia-ml.so.1 loadable?"
            ))
        })?;
        let nvml: &'static nvml_wrapper::Nvml = Box::leak(Box::new(nvml));
        let mut events = Vec::new();
        let count = nvml.device_count().map_err(|e| err("nvmlDeviceGetCount", e))?;
        for i in 0..count {
            let (Ok(dev), Ok(set)) = (nvml.device_by_index(i), nvml.create_event_set()) else {
                continue;
            };
            match dev.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                Ok(set) => events.push((i, set)),
                Err(e) => tracing::warn!(gpu = i, error = %e.error, "XID events unavailable on this GPU"),
            }
        }
        Ok(RealNvml {
            nvml,
            events: Mutex::new(events),
        })
    }

    fn device(&self, gpu: u32) -> Result<Device<'static>, NvmlError> {
        self.nvml
            .device_by_index(gpu)
            .map_err(|e| err(&format!("GPU {gpu}"), e))
    }

    /// Every GPU instance handle of a device with its info, across all profiles.
    fn gpu_instance_handles(
        &self,
        dev: &Device<'static>,
    ) -> Result<Vec<(nvmlGpuInstance_t, nvmlGpuInstanceInfo_t)>, NvmlError> {
        let lib = self.nvml.lib();
        let mut out = Vec::new();
        for p in 0..NVML_GPU_INSTANCE_PROFILE_COUNT {
            // SAFETY: plain out-parameter calls on a live device handle.
            unsafe {
                let mut info: nvmlGpuInstanceProfileInfo_t = std::mem::zeroed();
                if lib.nvmlDeviceGetGpuInstanceProfileInfo(dev.handle(), p, &mut info) != 0 {
                    continue; // profile not supported on this GPU
                }
                let mut handles: Vec<nvmlGpuInstance_t> =
                    vec![std::ptr::null_mut(); info.instanceCount.max(1) as usize + 8];
                let mut n = 0u32;
                raw(
                    "nvmlDeviceGetGpuInstances",
                    lib.nvmlDeviceGetGpuInstances(dev.handle(), info.id, handles.as_mut_ptr(), &mut n),
                )?;
                for &h in handles.iter().take(n as usize) {
                    let mut gi: nvmlGpuInstanceInfo_t = std::mem::zeroed();
                    raw("nvmlGpuInstanceGetInfo", lib.nvmlGpuInstanceGetInfo(h, &mut gi))?;
                    out.push((h, gi));
                }
            }
        }
        Ok(out)
    }

    /// The `MIG-…` UUID of the MIG device whose GPU instance ID is `gi_id`.
    fn mig_uuid(&self, dev: &Device<'static>, gi_id: u32) -> Option<String> {
        let n = dev.mig_device_count().ok()?;
        for i in 0..n {
            let Ok(mig) = dev.mig_device_by_index(i) else { continue };
            let mut id = u32::MAX;
            // SAFETY: out-parameter call on a MIG device handle the wrapper returned.
            let rc = unsafe { self.nvml.lib().nvmlDeviceGetGpuInstanceId(mig.handle(), &mut id) };
            if rc == 0 && id == gi_id {
                return mig.uuid().ok();
            }
        }
        None
    }

    fn compute_instances(&self, gi: nvmlGpuInstance_t) -> Vec<nvmlComputeInstance_t> {
        let lib = self.nvml.lib();
        let mut out = Vec::new();
        for p in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
            // SAFETY: out-parameter calls on a live GPU instance handle.
            unsafe {
                let mut info: nvmlComputeInstanceProfileInfo_t = std::mem::zeroed();
                if lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi,
                    p,
                    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                    &mut info,
                ) != 0
                {
                    continue;
                }
                let mut handles: Vec<nvmlComputeInstance_t> =
                    vec![std::ptr::null_mut(); info.instanceCount.max(1) as usize + 8];
                let mut n = 0u32;
                if lib.nvmlGpuInstanceGetComputeInstances(gi, info.id, handles.as_mut_ptr(), &mut n) == 0 {
                    out.extend(handles.into_iter().take(n as usize));
                }
            }
        }
        out
    }
}

impl Nvml for RealNvml {
    fn describe(&self) -> String {
        match self.nvml.sys_driver_version() {
            Ok(v) => format!("NVML, driver {v}"),
            Err(_) => "NVML".into(),
        }
    }

    fn gpus(&self) -> Result<Vec<GpuInfo>, NvmlError> {
        let count = self.nvml.device_count().map_err(|e| err("nvmlDeviceGetCount", e))?;
        let mut out = Vec::new();
        for i in 0..count {
            let dev = self.device(i)?;
            let pci = dev.pci_info().map_err(|e| err("nvmlDeviceGetPciInfo", e))?;
            let mig = dev.mig_mode().ok();
            out.push(GpuInfo {
                index: i,
                uuid: dev.uuid().map_err(|e| err("nvmlDeviceGetUUID", e))?,
                name: dev.name().map_err(|e| err("nvmlDeviceGetName", e))?,
                pci_bus_id: pci.bus_id,
                pci_device_id: pci.pci_device_id >> 16,
                memory_mib: dev.memory_info().map(|m| m.total / (1024 * 1024)).unwrap_or(0),
                mig_enabled: mig.as_ref().map(|m| m.current == 1),
                mig_pending: mig.filter(|m| m.pending != m.current).map(|m| m.pending == 1),
            });
        }
        Ok(out)
    }

    fn instances(&self, gpu: u32) -> Result<Vec<GpuInstance>, NvmlError> {
        let dev = self.device(gpu)?;
        if !dev.mig_mode().is_ok_and(|m| m.current == 1) {
            return Ok(Vec::new());
        }
        let mut out: Vec<GpuInstance> = self
            .gpu_instance_handles(&dev)?
            .into_iter()
            .map(|(_, gi)| GpuInstance {
                id: gi.id,
                profile_id: gi.profileId,
                start: gi.placement.start,
                size: gi.placement.size,
                uuid: self.mig_uuid(&dev, gi.id),
            })
            .collect();
        out.sort_by_key(|g| g.start);
        Ok(out)
    }

    fn create_instance(&self, gpu: u32, profile_id: u32, start: u32, size: u32) -> Result<GpuInstance, NvmlError> {
        let dev = self.device(gpu)?;
        let lib = self.nvml.lib();
        // `size` is in memory slices (as NVML's possible placements report it), which differs
        // from the profile's compute `sliceCount` (a 3g occupies 4 memory slices).
        // SAFETY: NVML fills `gi` on success; `placement` outlives the call.
        let (gi, info) = unsafe {
            let placement = nvmlGpuInstancePlacement_t { start, size };
            let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
            raw(
                "nvmlDeviceCreateGpuInstanceWithPlacement",
                lib.nvmlDeviceCreateGpuInstanceWithPlacement(dev.handle(), profile_id, &placement, &mut gi),
            )?;
            let mut info: nvmlGpuInstanceInfo_t = std::mem::zeroed();
            raw("nvmlGpuInstanceGetInfo", lib.nvmlGpuInstanceGetInfo(gi, &mut info))?;
            (gi, info)
        };
        // One compute instance covering the whole GPU instance: of the CI profiles it offers,
        // the one with the most slices (profile indices are not ordered by size).
        let mut best: Option<nvmlComputeInstanceProfileInfo_t> = None;
        for p in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
            // SAFETY: out-parameter call on the GPU instance just created.
            let ci_info = unsafe {
                let mut ci_info: nvmlComputeInstanceProfileInfo_t = std::mem::zeroed();
                let rc = lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi,
                    p,
                    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                    &mut ci_info,
                );
                (rc == 0).then_some(ci_info)
            };
            if let Some(c) = ci_info
                && best.is_none_or(|b| c.sliceCount > b.sliceCount)
            {
                best = Some(c);
            }
        }
        let ci_result = match best {
            Some(c) => {
                let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
                // SAFETY: creates a compute instance in the GPU instance just created.
                raw("nvmlGpuInstanceCreateComputeInstance", unsafe {
                    lib.nvmlGpuInstanceCreateComputeInstance(gi, c.id, &mut ci)
                })
            }
            None => Err(NvmlError(format!(
                "GPU {gpu}: GPU instance {} offers no compute instance profile",
                info.id
            ))),
        };
        if let Err(e) = ci_result {
            // Leave nothing half-made behind.
            // SAFETY: the GPU instance created above, without compute instances.
            let _ = unsafe { lib.nvmlGpuInstanceDestroy(gi) };
            return Err(e);
        }
        Ok(GpuInstance {
            id: info.id,
            profile_id: info.profileId,
            start: info.placement.start,
            size: info.placement.size,
            uuid: self.mig_uuid(&dev, info.id),
        })
    }

    fn destroy_instance(&self, gpu: u32, id: u32) -> Result<(), NvmlError> {
        let dev = self.device(gpu)?;
        let lib = self.nvml.lib();
        let (gi, _) = self
            .gpu_instance_handles(&dev)?
            .into_iter()
            .find(|(_, info)| info.id == id)
            .ok_or_else(|| NvmlError(format!("GPU {gpu}: no GPU instance {id}")))?;
        for ci in self.compute_instances(gi) {
            // SAFETY: a compute instance handle NVML just listed.
            raw("nvmlComputeInstanceDestroy", unsafe {
                lib.nvmlComputeInstanceDestroy(ci)
            })?;
        }
        // SAFETY: a GPU instance handle NVML just listed, now without compute instances.
        raw("nvmlGpuInstanceDestroy", unsafe { lib.nvmlGpuInstanceDestroy(gi) })
    }

    fn nvlink_peers(&self, gpu: u32) -> Result<Vec<String>, NvmlError> {
        let dev = self.device(gpu)?;
        let mut out = Vec::new();
        for link in 0..NVML_NVLINK_MAX_LINKS {
            let l = dev.link_wrapper_for(link);
            if l.is_active().unwrap_or(false)
                && let Ok(pci) = l.remote_pci_info()
                && !out.contains(&pci.bus_id)
            {
                out.push(pci.bus_id);
            }
        }
        Ok(out)
    }

    fn sample(&self, gpu: u32) -> Result<Sample, NvmlError> {
        let dev = self.device(gpu)?;
        let mem = dev.memory_info().map_err(|e| err("nvmlDeviceGetMemoryInfo", e))?;
        Ok(Sample {
            util_pct: dev.utilization_rates().ok().map(|u| u.gpu as f64),
            fb_used_mib: mem.used / (1024 * 1024),
            fb_free_mib: mem.free / (1024 * 1024),
            temp_c: dev.temperature(TemperatureSensor::Gpu).map(|t| t as f64).unwrap_or(0.0),
            power_w: dev.power_usage().map(|mw| mw as f64 / 1000.0).unwrap_or(0.0),
        })
    }

    fn instance_memory(&self, gpu: u32, id: u32) -> Result<(u64, u64), NvmlError> {
        let dev = self.device(gpu)?;
        let n = dev
            .mig_device_count()
            .map_err(|e| err("nvmlDeviceGetMaxMigDeviceCount", e))?;
        for i in 0..n {
            let Ok(mig) = dev.mig_device_by_index(i) else { continue };
            let mut gi = u32::MAX;
            // SAFETY: out-parameter call on a MIG device handle the wrapper returned.
            let rc = unsafe { self.nvml.lib().nvmlDeviceGetGpuInstanceId(mig.handle(), &mut gi) };
            if rc == 0 && gi == id {
                let m = mig.memory_info().map_err(|e| err("nvmlDeviceGetMemoryInfo (MIG)", e))?;
                return Ok((m.used / (1024 * 1024), m.free / (1024 * 1024)));
            }
        }
        Err(NvmlError(format!("GPU {gpu}: no MIG device for GPU instance {id}")))
    }

    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<bool, NvmlError> {
        let dev = self.device(gpu)?;
        // The activation status says why a change is not active yet (in use, reset required);
        // the mode NVML reports afterwards is what counts.
        let status = dev
            .set_mig_mode(enabled)
            .map_err(|e| err(&format!("GPU {gpu}: nvmlDeviceSetMigMode"), e))?;
        let mode = dev
            .mig_mode()
            .map_err(|e| err(&format!("GPU {gpu}: nvmlDeviceGetMigMode"), e))?;
        let want = u32::from(enabled);
        if mode.current == want {
            Ok(true)
        } else if mode.pending == want {
            Ok(false)
        } else {
            Err(NvmlError(format!(
                "GPU {gpu}: nvmlDeviceSetMigMode left MIG mode {} (activation status {status})",
                if mode.current == 1 { "on" } else { "off" }
            )))
        }
    }

    fn wait_xids(&self, timeout_ms: u32) -> Vec<XidEvent> {
        let deadline = Instant::now() + Duration::from_millis(timeout_ms as u64);
        loop {
            let mut out = Vec::new();
            for (gpu, set) in self.events.lock().unwrap().iter() {
                while let Ok(ev) = set.wait(0) {
                    let xid = match ev.event_data {
                        Some(XidError::Value(x)) => x,
                        _ => 999,
                    };
                    out.push(XidEvent { gpu: *gpu, xid });
                }
            }
            if !out.is_empty() || Instant::now() >= deadline {
                return out;
            }
            std::thread::sleep(Duration::from_millis(100).min(deadline - Instant::now()));
        }
    }
}
