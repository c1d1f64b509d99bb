//! A fake NVML for tests and for the documented `--fake-gpus N` mode: GPUs in memory that
//! behave as NVML does for what the local backend uses (placements checked against the
//! catalogue's MIG tables, instance IDs handed out, XIDs queued), and nothing more. It never
//! touches hardware.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use tessera_model::Catalogue;
use tessera_model::layout::{Placed, validate};

use crate::nvml::{GpuInfo, GpuInstance, Nvml, NvmlError, Sample, XidEvent};

/// How a fake GPU starts.
#[derive(Clone, Debug)]
pub struct FakeGpu {
    /// NVML device name, e.g. `NVIDIA H100 80GB HBM3` (mapped to the catalogue like a real one).
    pub name: String,
    pub memory_mib: u64,
    /// `None`: no MIG support; `Some(false)`: MIG-capable, MIG off.
    pub mig_enabled: Option<bool>,
    /// GPU instances that exist before Tessera starts: `(profile ID, start)`.
    pub instances: Vec<(u32, u32)>,
    /// PCI bus IDs at the other end of its NVLinks.
    pub nvlink_peers: Vec<String>,
}

impl FakeGpu {
    /// A GPU of a catalogue model (by name or alias), MIG off where it has MIG, no NVLink.
    pub fn of(model: &str) -> FakeGpu {
        let cat = Catalogue::builtin();
        let m = cat.get(
            cat.find(model)
                .unwrap_or_else(|| panic!("{model} is not in the catalogue")),
        );
        FakeGpu {
            name: m
                .aliases
                .iter()
                .find(|a| a.starts_with("NVIDIA "))
                .cloned()
                .unwrap_or(m.name.clone()),
            memory_mib: m.memory_mib as u64,
            mig_enabled: m.mig.map(|_| false),
            instances: Vec::new(),
            nvlink_peers: Vec::new(),
        }
    }

    pub fn with_mig(mut self, instances: &[(u32, u32)]) -> FakeGpu {
        self.mig_enabled = Some(true);
        self.instances = instances.to_vec();
        self
    }
}

struct Gpu {
    info: GpuInfo,
    /// `set_mig_mode` reports the new mode pending a reset instead of applying it, as a real
    /// driver does while something holds the GPU open.
    reset_required: bool,
    instances: Vec<GpuInstance>,
    next_id: u32,
    peers: Vec<String>,
    lost: bool,
}

struct State {
    gpus: Vec<Gpu>,
    xids: VecDeque<XidEvent>,
    calls: Vec<String>,
}

/// The fake NVML.
pub struct FakeNvml {
    state: Mutex<State>,
    xid_ready: Condvar,
    catalogue: Catalogue,
}

/// Bus ID of fake GPU `i`.
pub fn fake_bus_id(i: u32) -> String {
    format!("00000000:{:02X}:00.0", 0x10 + i)
}

impl FakeNvml {
    pub fn new(gpus: Vec<FakeGpu>) -> FakeNvml {
        let catalogue = Catalogue::builtin();
        let mut out = Vec::new();
        for (i, g) in gpus.into_iter().enumerate() {
            let i = i as u32;
            let mut gpu = Gpu {
                info: GpuInfo {
                    index: i,
                    uuid: format!("GPU-fa4e0000-0000-4000-8000-{:012x}", i),
                    name: g.name,
                    pci_bus_id: fake_bus_id(i),
                    pci_device_id: 0,
                    memory_mib: g.memory_mib,
                    mig_enabled: g.mig_enabled,
                    mig_pending: None,
                },
                instances: Vec::new(),
                reset_required: false,
                next_id: 1,
                peers: g.nvlink_peers,
                lost: false,
            };
            for (profile, start) in g.instances {
                let gi = create(&catalogue, &mut gpu, profile, start).expect("fake pre-existing instance");
                gpu.instances.push(gi);
            }
            out.push(gpu);
        }
        FakeNvml {
            state: Mutex::new(State {
                gpus: out,
                xids: VecDeque::new(),
                calls: Vec::new(),
            }),
            xid_ready: Condvar::new(),
            catalogue,
        }
    }

    /// `n` H100 80 GB SXM GPUs, MIG off: what `tessera serve --backend local --fake-gpus N` uses.
    pub fn uniform(n: u32, model: &str) -> FakeNvml {
        FakeNvml::new((0..n).map(|_| FakeGpu::of(model)).collect())
    }

    /// Queues an XID error on `gpu`, as the driver would report it.
    pub fn inject_xid(&self, gpu: u32, xid: u64) {
        self.state.lock().unwrap().xids.push_back(XidEvent { gpu, xid });
        self.xid_ready.notify_all();
    }

    /// The GPU falls off the bus: every later call about it fails.
    pub fn lose(&self, gpu: u32) {
        if let Some(g) = self.state.lock().unwrap().gpus.get_mut(gpu as usize) {
            g.lost = true;
        }
    }

    /// From now on, a MIG mode change of `gpu` stays pending until a GPU reset (which nothing
    /// here performs), as the driver does when a process keeps the GPU open.
    pub fn require_reset(&self, gpu: u32) {
        if let Some(g) = self.state.lock().unwrap().gpus.get_mut(gpu as usize) {
            g.reset_required = true;
        }
    }

    /// A GPU reset (done by an operator, outside Tessera): a MIG mode change pending on `gpu`
    /// takes effect.
    pub fn reset(&self, gpu: u32) {
        if let Some(g) = self.state.lock().unwrap().gpus.get_mut(gpu as usize)
            && let Some(p) = g.info.mig_pending.take()
        {
            g.info.mig_enabled = Some(p);
        }
    }

    /// The mutating calls made so far (`create GPU PROFILE@START -> ID`, `destroy GPU ID`,
    /// `mig GPU on|off`).
    pub fn calls(&self) -> Vec<String> {
        self.state.lock().unwrap().calls.clone()
    }

    fn with_gpu<T>(
        &self,
        gpu: u32,
        f: impl FnOnce(&mut Gpu, &mut Vec<String>) -> Result<T, NvmlError>,
    ) -> Result<T, NvmlError> {
        let mut st = self.state.lock().unwrap();
        let State { gpus, calls, .. } = &mut *st;
        let g = gpus
            .get_mut(gpu as usize)
            .ok_or_else(|| NvmlError(format!("GPU {gpu}: invalid argument")))?;
        if g.lost {
            return Err(NvmlError(format!("GPU {gpu}: GPU is lost")));
        }
        f(g, calls)
    }
}

fn create(cat: &Catalogue, g: &mut Gpu, profile_id: u32, start: u32) -> Result<GpuInstance, NvmlError> {
    let i = g.info.index;
    if g.info.mig_enabled != Some(true) {
        return Err(NvmlError(format!(
            "GPU {i}: not in MIG mode (NVML_ERROR_NOT_SUPPORTED)"
        )));
    }
    let geom = cat
        .find(&g.info.name)
        .and_then(|m| cat.get(m).mig)
        .ok_or_else(|| NvmlError(format!("GPU {i}: no MIG profiles known for {}", g.info.name)))?;
    let idx = geom
        .profile_index(profile_id)
        .ok_or_else(|| NvmlError(format!("GPU {i}: unknown GPU instance profile {profile_id}")))?;
    let mut layout: Vec<Placed> = g
        .instances
        .iter()
        .filter_map(|gi| {
            geom.profile_index(gi.profile_id).map(|p| Placed {
                profile: p as u8,
                start: gi.start as u8,
            })
        })
        .collect();
    layout.push(Placed {
        profile: idx as u8,
        start: start as u8,
    });
    validate(geom, &layout).map_err(|e| {
        NvmlError(format!(
            "GPU {i}: insufficient resources for profile {profile_id} at {start} ({e})"
        ))
    })?;
    let id = g.next_id;
    g.next_id += 1;
    Ok(GpuInstance {
        id,
        profile_id,
        start,
        size: geom.profiles[idx].mem_slices as u32,
        uuid: Some(format!("MIG-fa4e{:04x}-{:04x}-4000-8000-000000000000", i, id)),
    })
}

impl Nvml for FakeNvml {
    fn describe(&self) -> String {
        "fake NVML (--fake-gpus test mode, no driver)".into()
    }

    fn gpus(&self) -> Result<Vec<GpuInfo>, NvmlError> {
        let st = self.state.lock().unwrap();
        Ok(st.gpus.iter().filter(|g| !g.lost).map(|g| g.info.clone()).collect())
    }

    fn instances(&self, gpu: u32) -> Result<Vec<GpuInstance>, NvmlError> {
        self.with_gpu(gpu, |g, _| Ok(g.instances.clone()))
    }

    fn create_instance(&self, gpu: u32, profile_id: u32, start: u32, size: u32) -> Result<GpuInstance, NvmlError> {
        self.with_gpu(gpu, |g, calls| {
            let gi = create(&self.catalogue, g, profile_id, start)?;
            if gi.size != size {
                return Err(NvmlError(format!(
                    "GPU {gpu}: profile {profile_id} occupies {} memory slices, not {size} (NVML_ERROR_INVALID_ARGUMENT)",
                    gi.size
                )));
            }
            calls.push(format!("create {gpu} {profile_id}@{start} -> {}", gi.id));
            g.instances.push(gi.clone());
            Ok(gi)
        })
    }

    fn destroy_instance(&self, gpu: u32, id: u32) -> Result<(), NvmlError> {
        self.with_gpu(gpu, |g, calls| {
            let before = g.instances.len();
            g.instances.retain(|gi| gi.id != id);
            if g.instances.len() == before {
                return Err(NvmlError(format!(
                    "GPU {gpu}: no GPU instance {id} (NVML_ERROR_NOT_FOUND)"
                )));
            }
            calls.push(format!("destroy {gpu} {id}"));
            Ok(())
        })
    }

    fn nvlink_peers(&self, gpu: u32) -> Result<Vec<String>, NvmlError> {
        self.with_gpu(gpu, |g, _| Ok(g.peers.clone()))
    }

    fn sample(&self, gpu: u32) -> Result<Sample, NvmlError> {
        self.with_gpu(gpu, |g, _| {
            let mig = g.info.mig_enabled == Some(true);
            Ok(Sample {
                util_pct: if mig { None } else { Some(0.0) },
                fb_used_mib: 0,
                fb_free_mib: g.info.memory_mib,
                temp_c: 35.0,
                power_w: 70.0,
            })
        })
    }

    fn instance_memory(&self, gpu: u32, id: u32) -> Result<(u64, u64), NvmlError> {
        self.with_gpu(gpu, |g, _| {
            let gi = g
                .instances
                .iter()
                .find(|i| i.id == id)
                .ok_or_else(|| NvmlError(format!("GPU {gpu}: no GPU instance {id} (NVML_ERROR_NOT_FOUND)")))?;
            let slices = self
                .catalogue
                .find(&g.info.name)
                .and_then(|m| self.catalogue.get(m).mig)
                .map(|geom| geom.mem_slices as u64)
                .unwrap_or(8);
            Ok((0, g.info.memory_mib * gi.size as u64 / slices))
        })
    }

    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<bool, NvmlError> {
        self.with_gpu(gpu, |g, calls| {
            if g.info.mig_enabled.is_none() {
                return Err(NvmlError(format!(
                    "GPU {gpu}: MIG is not supported (NVML_ERROR_NOT_SUPPORTED)"
                )));
            }
            if !g.instances.is_empty() {
                return Err(NvmlError(format!(
                    "GPU {gpu}: {} GPU instance(s) exist (NVML_ERROR_IN_USE)",
                    g.instances.len()
                )));
            }
            calls.push(format!("mig {gpu} {}", if enabled { "on" } else { "off" }));
            if g.info.mig_enabled == Some(enabled) {
                g.info.mig_pending = None;
                return Ok(true);
            }
            if g.reset_required {
                g.info.mig_pending = Some(enabled);
                return Ok(false);
            }
            g.info.mig_enabled = Some(enabled);
            g.info.mig_pending = None;
            Ok(true)
        })
    }

    fn wait_xids(&self, timeout_ms: u32) -> Vec<XidEvent> {
        let st = self.state.lock().unwrap();
        let (mut st, _) = self
            .xid_ready
            .wait_timeout_while(st, Duration::from_millis(timeout_ms as u64), |s| s.xids.is_empty())
            .unwrap();
        st.xids.drain(..).collect()
    }
}
