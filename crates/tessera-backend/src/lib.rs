//! # tessera-backend
//!
//! The one trait through which the control plane drives GPUs, and the simulated backend.
//!
//! A backend realises placements decided by the engine: it partitions (creates the MIG GPU
//! instance at the chosen profile ID and start, or sets up the time-slice share), starts the
//! workload, stops it (gracefully within a grace period, then forcibly), undoes the
//! partitioning, reports status and telemetry, and reconciles after a control-plane restart.
//! The `sim` backend (this crate) is the embedded default and the test bed; the `local` (NVML)
//! and `kubernetes` backends implement the same trait.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

/// What to run and where, as decided by the engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunSpec {
    pub id: u64,
    pub node: String,
    pub model: String,
    /// Board memory in MiB (0 = unknown).
    pub model_memory_mib: u32,
    pub gpus: Vec<u8>,
    pub slice: Slice,
    /// Batch run time / lease; `None` runs until stopped.
    pub duration: Option<Duration>,
    /// Milliseconds since the epoch when the workload started running (reconciliation).
    pub running_since_ms: Option<i64>,
    pub command: Option<Vec<String>>,
    pub image: Option<String>,
}

/// The share of the GPUs a workload gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Slice {
    Whole,
    Mig {
        profile: String,
        profile_id: u32,
        start: u8,
        size: u8,
        units_milli: u64,
    },
    Fraction {
        milli: u16,
        memory_mib: u32,
    },
    CpuOnly,
}

/// What a backend knows about a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Running,
    Succeeded,
    Failed,
    /// The backend has no such workload.
    Unknown,
}

/// Asynchronous news from a backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendEvent {
    /// The workload ended on its own.
    Exited { id: u64, success: bool, detail: String },
}

/// One GPU's telemetry, with DCGM exporter field names in mind.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuSample {
    pub node: String,
    pub gpu: u8,
    pub uuid: String,
    pub model: String,
    /// `DCGM_FI_DEV_GPU_UTIL` (not defined per MIG instance).
    pub util_pct: f64,
    /// `DCGM_FI_DEV_FB_USED` / `_FREE`, MiB.
    pub fb_used_mib: u64,
    pub fb_free_mib: u64,
    pub temp_c: f64,
    pub power_w: f64,
    /// Last XID error (`DCGM_FI_DEV_XID_ERRORS`), 0 = none.
    pub xid: u32,
    pub instances: Vec<InstanceSample>,
}

/// One MIG instance (or time-slice share) on a GPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InstanceSample {
    pub workload: u64,
    /// `GPU_I_PROFILE` (MIG) or empty for shares.
    pub profile: String,
    /// `GPU_I_ID`.
    pub instance_id: u32,
    /// `DCGM_FI_PROF_GR_ENGINE_ACTIVE`, 0..1.
    pub gr_engine_active: f64,
    pub fb_used_mib: u64,
    /// Framebuffer of the instance (or share) not in use, MiB.
    #[serde(default)]
    pub fb_free_mib: u64,
}

/// One GPU of the fleet, as the simulated backend is told at construction: every GPU listed
/// is reported by [`Backend::telemetry`], idle ones with zero utilisation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimGpu {
    pub node: String,
    pub index: u8,
    pub model: String,
    /// Board memory in MiB (0 = unknown).
    pub memory_mib: u32,
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum BackendError {
    #[error("backend unreachable: {0}")]
    Unreachable(String),
    #[error("{0}")]
    Rejected(String),
}

#[async_trait]
pub trait Backend: Send + Sync {
    fn name(&self) -> &'static str;
    /// Creates the partition for `spec` (MIG instance or time-slice share); returns a detail line.
    async fn partition(&self, spec: &RunSpec) -> Result<String, BackendError>;
    async fn start(&self, spec: &RunSpec) -> Result<(), BackendError>;
    /// Stops within `grace` (SIGTERM-like), then forcibly.
    async fn stop(&self, id: u64, grace: Duration) -> Result<(), BackendError>;
    /// Undoes the partition after the workload is gone.
    async fn unpartition(&self, spec: &RunSpec) -> Result<(), BackendError>;
    async fn status(&self, id: u64) -> Status;
    /// After a control-plane restart: `running` are the workloads the store says run here.
    /// Returns each one's status as the backend sees it (adopting those still alive).
    async fn reconcile(&self, running: &[RunSpec]) -> Vec<(u64, Status)>;
    /// Current telemetry of every GPU the backend knows: at least every GPU that holds a
    /// workload; the simulated backend built with [`SimBackend::with_gpus`] reports every GPU of
    /// the fleet.
    fn telemetry(&self) -> Vec<GpuSample>;
    /// The stream of [`BackendEvent`]s; can be taken once.
    fn take_events(&self) -> Option<mpsc::UnboundedReceiver<BackendEvent>>;
}

/// Settings of the simulated backend.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Time to create a MIG instance (real hardware: about a second).
    pub mig_partition_time: Duration,
    /// Time a workload takes to stop after being asked (capped by the grace period).
    pub stop_time: Duration,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            mig_partition_time: Duration::ZERO,
            stop_time: Duration::ZERO,
        }
    }
}

struct SimRun {
    spec: RunSpec,
    started: Instant,
    generation: u64,
}

/// The simulated backend: workloads run for their declared duration (or until stopped) and
/// report plausible telemetry. Deterministic given the same calls.
pub struct SimBackend {
    cfg: SimConfig,
    runs: Arc<Mutex<HashMap<u64, SimRun>>>,
    tx: mpsc::UnboundedSender<BackendEvent>,
    rx: Mutex<Option<mpsc::UnboundedReceiver<BackendEvent>>>,
    next_gen: Mutex<u64>,
    /// Injected faults: (node, gpu) → XID.
    faults: Mutex<HashMap<(String, u8), u32>>,
    /// The fleet's GPUs, all reported by telemetry (empty: only GPUs holding a workload).
    gpus: Vec<SimGpu>,
}

impl SimBackend {
    /// A simulated backend that reports telemetry only for GPUs holding a workload.
    pub fn new(cfg: SimConfig) -> Self {
        Self::with_gpus(cfg, Vec::new())
    }

    /// A simulated backend for a fleet: telemetry reports every GPU in `gpus`, idle or not.
    pub fn with_gpus(cfg: SimConfig, gpus: Vec<SimGpu>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        SimBackend {
            cfg,
            runs: Arc::default(),
            tx,
            rx: Mutex::new(Some(rx)),
            next_gen: Mutex::new(0),
            faults: Mutex::default(),
            gpus,
        }
    }

    /// The GPUs this backend was built with.
    pub fn gpus(&self) -> &[SimGpu] {
        &self.gpus
    }

    /// Injects an XID error on a GPU (tests and demos of GPU-health alerting); XID 0 clears
    /// the fault.
    pub fn inject_xid(&self, node: &str, gpu: u8, xid: u32) {
        let mut f = self.faults.lock().expect("lock");
        if xid == 0 {
            f.remove(&(node.to_string(), gpu));
        } else {
            f.insert((node.to_string(), gpu), xid);
        }
    }

    fn run(&self, spec: RunSpec, remaining: Option<Duration>) {
        let generation = {
            let mut g = self.next_gen.lock().expect("lock");
            *g += 1;
            *g
        };
        let id = spec.id;
        self.runs.lock().expect("lock").insert(
            id,
            SimRun {
                spec,
                started: Instant::now(),
                generation,
            },
        );
        if let Some(d) = remaining {
            let runs = self.runs.clone();
            let tx = self.tx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(d).await;
                let ended = {
                    let mut r = runs.lock().expect("lock");
                    match r.get(&id) {
                        Some(run) if run.generation == generation => r.remove(&id).is_some(),
                        _ => false,
                    }
                };
                if ended {
                    let _ = tx.send(BackendEvent::Exited {
                        id,
                        success: true,
                        detail: "completed its run time".into(),
                    });
                }
            });
        }
    }
}

/// A stable UUID in the form NVML reports (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`) for GPU
/// `gpu` of a simulated node.
pub fn sim_uuid(node: &str, gpu: u8) -> String {
    // FNV-1a of the node name and index, then two SplitMix64 draws for 128 bits.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in node.bytes().chain([0xff, gpu]) {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let (a, b) = (mix(h ^ 1), mix(h ^ 2));
    format!(
        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A stable pseudo-random number in [0, 1) from `a` and `b` (SplitMix64).
fn noise(a: u64, b: u64) -> f64 {
    let mut z = a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.wrapping_add(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[async_trait]
impl Backend for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    async fn partition(&self, spec: &RunSpec) -> Result<String, BackendError> {
        Ok(match &spec.slice {
            Slice::Mig {
                profile,
                profile_id,
                start,
                size,
                ..
            } => {
                if !self.cfg.mig_partition_time.is_zero() {
                    tokio::time::sleep(self.cfg.mig_partition_time).await;
                }
                format!(
                    "created MIG GPU instance {profile} (profile {profile_id}) at memory slices {start}..{} on {} GPU {}",
                    start + size - 1,
                    spec.node,
                    spec.gpus[0]
                )
            }
            Slice::Fraction { milli, memory_mib } => format!(
                "time-slice share of {milli} milli-GPU{} on {} GPU {}",
                if *memory_mib > 0 {
                    format!(", {memory_mib} MiB")
                } else {
                    String::new()
                },
                spec.node,
                spec.gpus[0]
            ),
            Slice::Whole => format!("whole GPUs {:?} on {}", spec.gpus, spec.node),
            Slice::CpuOnly => format!("host resources on {}", spec.node),
        })
    }

    async fn start(&self, spec: &RunSpec) -> Result<(), BackendError> {
        self.run(spec.clone(), spec.duration);
        Ok(())
    }

    async fn stop(&self, id: u64, grace: Duration) -> Result<(), BackendError> {
        let stop = self.cfg.stop_time.min(grace);
        if !stop.is_zero() {
            tokio::time::sleep(stop).await;
        }
        self.runs.lock().expect("lock").remove(&id);
        Ok(())
    }

    async fn unpartition(&self, _spec: &RunSpec) -> Result<(), BackendError> {
        Ok(())
    }

    async fn status(&self, id: u64) -> Status {
        if self.runs.lock().expect("lock").contains_key(&id) {
            Status::Running
        } else {
            Status::Unknown
        }
    }

    async fn reconcile(&self, running: &[RunSpec]) -> Vec<(u64, Status)> {
        // The simulated fleet lives in the control plane's process: after a restart it adopts
        // every workload the store says was running, for the rest of its run time.
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let mut out = Vec::new();
        for spec in running {
            let elapsed = Duration::from_millis((now_ms - spec.running_since_ms.unwrap_or(now_ms)).max(0) as u64);
            match spec.duration {
                Some(d) if d <= elapsed => out.push((spec.id, Status::Succeeded)),
                d => {
                    self.run(spec.clone(), d.map(|d| d - elapsed));
                    out.push((spec.id, Status::Running));
                }
            }
        }
        out
    }

    fn telemetry(&self) -> Vec<GpuSample> {
        let runs = self.runs.lock().expect("lock");
        let faults = self.faults.lock().expect("lock");
        let idle = |node: &str, g: u8, model: &str, mem: u64| GpuSample {
            node: node.to_string(),
            gpu: g,
            uuid: sim_uuid(node, g),
            model: model.to_string(),
            util_pct: 0.0,
            fb_used_mib: 0,
            fb_free_mib: mem,
            temp_c: 34.0,
            power_w: 60.0,
            xid: faults.get(&(node.to_string(), g)).copied().unwrap_or(0),
            instances: Vec::new(),
        };
        let mut gpus: HashMap<(String, u8), GpuSample> = self
            .gpus
            .iter()
            .map(|g| {
                let sample = idle(&g.node, g.index, &g.model, g.memory_mib as u64);
                ((g.node.clone(), g.index), sample)
            })
            .collect();
        let tick = Instant::now().elapsed().as_secs() / 10;
        for run in runs.values() {
            let s = &run.spec;
            let age = run.started.elapsed().as_secs() / 10 + tick;
            for &g in &s.gpus {
                let mem = s.model_memory_mib as u64;
                let sample = gpus
                    .entry((s.node.clone(), g))
                    .or_insert_with(|| idle(&s.node, g, &s.model, mem));
                let busy = 0.35 + 0.6 * noise(s.id, age);
                let (share, profile) = match &s.slice {
                    Slice::Whole => (1.0, String::new()),
                    Slice::Mig {
                        profile, units_milli, ..
                    } => (*units_milli as f64 / 1000.0, profile.clone()),
                    Slice::Fraction { milli, .. } => (*milli as f64 / 1000.0, String::new()),
                    Slice::CpuOnly => (0.0, String::new()),
                };
                let used = (mem as f64 * share * (0.5 + 0.4 * noise(s.id, 7))) as u64;
                sample.fb_used_mib = (sample.fb_used_mib + used).min(mem);
                sample.fb_free_mib = mem - sample.fb_used_mib;
                sample.util_pct = (sample.util_pct + 100.0 * busy * share).min(100.0);
                sample.temp_c = 34.0 + sample.util_pct * 0.45;
                sample.power_w = 60.0 + sample.util_pct * 5.5;
                if !matches!(s.slice, Slice::Whole) {
                    let (instance_id, size) = match &s.slice {
                        Slice::Mig { start, .. } => (*start as u32 + 1, (mem as f64 * share) as u64),
                        Slice::Fraction { memory_mib, .. } if *memory_mib > 0 => (0, *memory_mib as u64),
                        _ => (0, (mem as f64 * share) as u64),
                    };
                    sample.instances.push(InstanceSample {
                        workload: s.id,
                        profile,
                        instance_id,
                        gr_engine_active: busy,
                        fb_used_mib: used,
                        fb_free_mib: size.saturating_sub(used),
                    });
                }
            }
        }
        let mut out: Vec<GpuSample> = gpus.into_values().collect();
        for s in &mut out {
            s.instances.sort_by_key(|i| (i.instance_id, i.workload));
        }
        out.sort_by(|a, b| (&a.node, a.gpu).cmp(&(&b.node, b.gpu)));
        out
    }

    fn take_events(&self) -> Option<mpsc::UnboundedReceiver<BackendEvent>> {
        self.rx.lock().expect("lock").take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: u64, duration: Option<Duration>) -> RunSpec {
        RunSpec {
            id,
            node: "a100-00".into(),
            model: "A100-80GB".into(),
            model_memory_mib: 81920,
            gpus: vec![3],
            slice: Slice::Mig {
                profile: "3g.40gb".into(),
                profile_id: 9,
                start: 4,
                size: 4,
                units_milli: 500,
            },
            duration,
            running_since_ms: None,
            command: None,
            image: None,
        }
    }

    #[tokio::test]
    async fn runs_for_its_duration_and_reports_telemetry() {
        let b = SimBackend::new(SimConfig::default());
        let mut ev = b.take_events().unwrap();
        assert!(b.take_events().is_none());
        let s = spec(1, Some(Duration::from_millis(50)));
        assert!(b.partition(&s).await.unwrap().contains("memory slices 4..7"));
        b.start(&s).await.unwrap();
        assert_eq!(b.status(1).await, Status::Running);
        let t = b.telemetry();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].instances.len(), 1);
        assert!(t[0].fb_used_mib > 0 && t[0].fb_used_mib <= 81920 / 2);
        let e = tokio::time::timeout(Duration::from_secs(2), ev.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            e,
            BackendEvent::Exited {
                id: 1,
                success: true,
                detail: "completed its run time".into()
            }
        );
        assert_eq!(b.status(1).await, Status::Unknown);
    }

    #[tokio::test]
    async fn stop_cancels_the_timer_and_reconcile_adopts() {
        let b = SimBackend::new(SimConfig::default());
        let mut ev = b.take_events().unwrap();
        b.start(&spec(2, Some(Duration::from_millis(30)))).await.unwrap();
        b.stop(2, Duration::from_secs(1)).await.unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(100), ev.recv())
                .await
                .is_err(),
            "no exit after a stop"
        );
        let mut s = spec(3, Some(Duration::from_secs(3600)));
        s.running_since_ms = Some(0);
        let mut t = spec(4, None);
        t.running_since_ms = Some(0);
        let r = b.reconcile(&[s, t]).await;
        assert_eq!(r, vec![(3, Status::Succeeded), (4, Status::Running)]);
        assert_eq!(b.status(4).await, Status::Running);
    }

    #[tokio::test]
    async fn with_gpus_reports_every_gpu_and_injected_xids() {
        let gpus: Vec<SimGpu> = ["a100-00", "h100-00"]
            .iter()
            .flat_map(|n| {
                (0..8).map(move |i| SimGpu {
                    node: n.to_string(),
                    index: i,
                    model: "A100-80GB".into(),
                    memory_mib: 81920,
                })
            })
            .collect();
        let b = SimBackend::with_gpus(SimConfig::default(), gpus);
        let t = b.telemetry();
        assert_eq!(t.len(), 16, "idle GPUs are reported too");
        assert!(
            t.iter()
                .all(|g| g.util_pct == 0.0 && g.fb_used_mib == 0 && g.fb_free_mib == 81920 && g.xid == 0)
        );
        let uuids: std::collections::HashSet<&str> = t.iter().map(|g| g.uuid.as_str()).collect();
        assert_eq!(uuids.len(), 16, "UUIDs are unique across nodes");
        assert!(t[0].uuid.starts_with("GPU-") && t[0].uuid.len() == 40, "{}", t[0].uuid);
        b.start(&spec(9, None)).await.unwrap();
        b.inject_xid("h100-00", 5, 79);
        let t = b.telemetry();
        assert_eq!(t.len(), 16);
        let busy = t.iter().find(|g| g.node == "a100-00" && g.gpu == 3).unwrap();
        assert!(busy.util_pct > 0.0 && busy.instances.len() == 1);
        let i = &busy.instances[0];
        assert_eq!((i.instance_id, i.profile.as_str()), (5, "3g.40gb"));
        assert_eq!(i.fb_used_mib + i.fb_free_mib, 40960);
        let bad = t.iter().find(|g| g.node == "h100-00" && g.gpu == 5).unwrap();
        assert_eq!(bad.xid, 79);
        b.inject_xid("h100-00", 5, 0);
        assert!(b.telemetry().iter().all(|g| g.xid == 0), "XID 0 clears the fault");
    }
}
