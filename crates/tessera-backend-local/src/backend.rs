//! The backend itself: [`LocalBackend`] implements the backend contract on top of an [`Nvml`]
//! and local processes.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use tessera_backend::{
    Backend, BackendError, BackendEvent, Capabilities, DeviceAssignment, Devices, Exit, GpuSample, InstanceSample,
    LogChunk, MigInstance, MigModeChange, Observation, Orphan, PartitionPlan, PartitionReport, Partitioning,
    ReconcileReport, RunSpec, SliceSpec,
};
use tessera_model::Catalogue;
use tokio::sync::mpsc;

use crate::cdi::Specs;
use crate::discovery::{Discovery, discover};
use crate::isolation::{RunAs, gpu_device_nodes, gpu_device_rules, secure_dirs, workload_dir};
use crate::nvml::{GpuInstance, Nvml, NvmlError, xid_is_critical};
use crate::oci::{Bundle, ContainerConfig, ContainerSpec, ImageStore};
use crate::process::{Cgroups, Files, Launch, Limits, Place, ProcId, group_alive, spawn, terminate};
use crate::sandbox::{self, SandboxMode};

/// How the local backend runs.
#[derive(Clone, Debug)]
pub struct LocalConfig {
    /// The node name this machine has in the fleet.
    pub node: String,
    /// Where the server's records of workloads live (`DATA_DIR/workloads/ID/`: logs, pid
    /// files); made the server's alone (0700).
    pub data_dir: PathBuf,
    /// Where each workload gets its own directory (`WORK_DIR/ID`, its user's, 0700); outside
    /// the data directory, mode 0711.
    pub work_dir: PathBuf,
    /// Which user workloads run as.
    pub run_as: RunAs,
    /// Most bytes of output kept per workload log (later output is dropped, with a note).
    pub log_cap: u64,
    /// Most processes and threads per workload (its cgroup's pids limit; 0: none).
    pub pids_max: u64,
    /// Where the `/dev/nvidia*` nodes are (normally `/dev`), for the device cgroup.
    pub dev_dir: PathBuf,
    /// How often telemetry is sampled; XIDs are reported as soon as NVML reports them.
    pub telemetry_interval: Duration,
    pub cgroups: Cgroups,
    /// Grace between SIGTERM and SIGKILL when a workload's lease ([`RunSpec::duration`]) ends.
    pub lease_grace: Duration,
    /// Whether each workload gets a file-system view of its own ([`crate::sandbox`]).
    pub sandbox: SandboxMode,
    /// Workloads with an image: where the images come from and what runs them
    /// ([`crate::oci`]); `None`: such workloads are refused.
    pub containers: Option<ContainerConfig>,
}

/// What runs workloads with an image.
struct Containers {
    store: ImageStore,
    cfg: ContainerConfig,
    cdi: Specs,
}

struct Proc {
    id: ProcId,
    /// `(GPU, GPU instance ID, profile name)` of a MIG workload, for per-instance telemetry.
    mig: Option<(u32, u32, String)>,
    stopping: bool,
    /// Its lease ended and the backend stopped it.
    lease_ended: Option<Duration>,
    since_ms: i64,
    /// How it ended, once it has.
    ended: Option<Observation>,
}

#[derive(Default)]
struct State {
    procs: HashMap<u64, Proc>,
    /// GPUs reported unhealthy (XID or lost), so each is reported once.
    unhealthy: HashSet<u32>,
    last_xid: HashMap<u32, u64>,
}

struct Shared {
    nvml: Arc<dyn Nvml>,
    cfg: LocalConfig,
    catalogue: Catalogue,
    discovery: Discovery,
    /// `(gpu, GPU instance ID)` of instances that existed at start-up: adopted, never destroyed.
    adopted: HashSet<(u32, u32)>,
    state: Mutex<State>,
    tx: mpsc::UnboundedSender<BackendEvent>,
    rx: Mutex<Option<mpsc::UnboundedReceiver<BackendEvent>>>,
    /// The sandbox is in use (the mode allows it and the host's probe passed).
    sandboxed: bool,
    containers: Option<Containers>,
}

/// This machine's GPUs through NVML, workloads as local processes.
pub struct LocalBackend {
    shared: Arc<Shared>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn rejected(e: NvmlError) -> BackendError {
    BackendError::Rejected(e.0)
}

impl LocalBackend {
    /// Discovers the GPUs (adopting every GPU instance that exists now) and starts the
    /// telemetry task. Must be called inside a Tokio runtime.
    pub fn new(nvml: Arc<dyn Nvml>, cfg: LocalConfig) -> Result<LocalBackend, NvmlError> {
        let catalogue = Catalogue::builtin();
        let discovery = discover(nvml.as_ref(), &catalogue)?;
        let adopted = discovery
            .gpus
            .iter()
            .flat_map(|g| g.instances.iter().map(move |i| (g.info.index, i.id)))
            .collect();
        secure_dirs(&cfg.data_dir, &cfg.work_dir, cfg.run_as).map_err(NvmlError)?;
        // SAFETY: plain syscall.
        let euid = unsafe { libc::geteuid() };
        match cfg.run_as {
            RunAs::Range { .. } if euid != 0 => {
                return Err(NvmlError(format!(
                    "workloads run as their own users, which needs root (this server runs as uid {euid})"
                )));
            }
            RunAs::Range { .. } => {}
            RunAs::Server => tracing::warn!(
                uid = euid,
                "local workloads run as the server's own user: they can read its data directory and act as it (development only)"
            ),
        }
        if !cfg.cgroups.enabled() {
            tracing::warn!(reason = %cfg.cgroups.skipped, "cgroups are off for local workloads: no CPU, memory, pids or device limits, and a process that leaves its process group escapes stop");
        } else if !cfg.cgroups.devices_enforced() {
            tracing::warn!(
                cgroups = cfg.cgroups.version(),
                "GPU device access is not enforced (no cgroup v1 devices controller, and no BPF device program on cgroup v2); workloads are held to their GPUs by CUDA_VISIBLE_DEVICES only"
            );
        }
        let sandboxed = match cfg.sandbox {
            SandboxMode::Off => {
                tracing::warn!(
                    "--local-sandbox off: workloads see this machine's root file system, /tmp and /dev/shm (within their user's permissions)"
                );
                false
            }
            mode => match sandbox::probe(&cfg.data_dir, &cfg.work_dir, &cfg.dev_dir) {
                Ok(()) => true,
                Err(e) if mode == SandboxMode::Required => {
                    return Err(NvmlError(format!(
                        "--local-sandbox required: this host does not let workloads have a mount namespace of their own: {e}"
                    )));
                }
                Err(e) => {
                    tracing::warn!(reason = %e, "no file-system sandbox for local workloads: they see this machine's root file system, /tmp and /dev/shm (within their user's permissions)");
                    false
                }
            },
        };
        let containers = match &cfg.containers {
            None => None,
            Some(c) => {
                if !cfg.cgroups.enabled() {
                    return Err(NvmlError(format!(
                        "--local-images: containers run in the workload's cgroup, and cgroups are off ({})",
                        cfg.cgroups.skipped
                    )));
                }
                let out = std::process::Command::new(&c.runtime)
                    .arg("--version")
                    .output()
                    .map_err(|e| NvmlError(format!("--local-images: the OCI runtime {}: {e}", c.runtime.display())))?;
                let store = ImageStore::open(&c.images, &cfg.data_dir.join("images"))
                    .map_err(|e| NvmlError(format!("--local-images: {e}")))?;
                let cdi = Specs::load(&c.cdi_dirs);
                let version = String::from_utf8_lossy(&out.stdout);
                tracing::info!(
                    runtime = %c.runtime.display(),
                    version = version.lines().next().unwrap_or(""),
                    images = ?store.names(),
                    cdi = ?cdi.files(),
                    "workloads with an image run as containers"
                );
                if cdi.is_empty() {
                    tracing::warn!(
                        dirs = ?c.cdi_dirs,
                        "no CDI spec for nvidia.com/gpu: containers get their GPUs' device nodes but not the driver's libraries (install the NVIDIA Container Toolkit and run `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`)"
                    );
                }
                Some(Containers {
                    store,
                    cfg: c.clone(),
                    cdi,
                })
            }
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            containers,
            sandboxed,
            nvml,
            cfg,
            catalogue,
            discovery,
            adopted,
            state: Mutex::new(State::default()),
            tx,
            rx: Mutex::new(Some(rx)),
        });
        shared.report_mig_modes();
        tokio::spawn(telemetry_loop(Arc::downgrade(&shared)));
        Ok(LocalBackend { shared })
    }

    /// Whether workloads get a file-system view of their own ([`crate::sandbox`]).
    pub fn sandboxed(&self) -> bool {
        self.shared.sandboxed
    }

    /// What discovery found at start-up.
    pub fn discovery(&self) -> &Discovery {
        &self.shared.discovery
    }

    /// Whether this GPU instance was there before Tessera started (and so is never destroyed).
    pub fn is_adopted(&self, gpu: u32, instance_id: u32) -> bool {
        self.shared.adopted.contains(&(gpu, instance_id))
    }

    fn gpu_uuid(&self, gpu: u8) -> Result<String, BackendError> {
        self.shared
            .discovery
            .gpus
            .iter()
            .find(|g| g.info.index == gpu as u32)
            .map(|g| g.info.uuid.clone())
            .ok_or_else(|| BackendError::Rejected(format!("no GPU {gpu} on {}", self.shared.cfg.node)))
    }

    fn find_instance(&self, gpu: u8, inst: &MigInstance) -> Result<Option<GpuInstance>, BackendError> {
        let list = self.shared.nvml.instances(gpu as u32).map_err(rejected)?;
        Ok(list
            .into_iter()
            .find(|i| i.profile_id == inst.profile_id && i.start == inst.start as u32 && i.size == inst.size as u32))
    }

    /// Prepares workload `spec`'s container of image `name` (unpacked on first use, off the
    /// runtime's threads): the bundle with its GPUs through CDI where a spec is installed, else
    /// their device nodes. `rules` are the workload's device rules; returns the runtime's
    /// command and the device rules of its cgroup (those, with what a container also needs).
    async fn container(
        &self,
        spec: &RunSpec,
        name: &str,
        gpus: &[u32],
        visible: &str,
        mig: &Option<(u32, u32, String)>,
        mut rules: Vec<String>,
    ) -> Result<(Vec<String>, Vec<String>), BackendError> {
        let shared = self.shared.clone();
        let wanted = name.to_string();
        let image = tokio::task::spawn_blocking(move || {
            let c = shared.containers.as_ref().expect("checked by start");
            c.store.get(&wanted)
        })
        .await
        .map_err(|e| BackendError::Rejected(format!("image {name}: {e}")))?
        .map_err(|e| BackendError::Rejected(e.to_string()))?;
        let c = self.shared.containers.as_ref().expect("checked by start");
        let cfg = &self.shared.cfg;
        // What an OCI runtime always allows a container besides (its cgroup is a child of the
        // workload's, and a child cannot be allowed what its parent is not): device creation,
        // which needs CAP_MKNOD the container lacks, `/dev/console` and `/dev/net/tun`.
        rules.extend(["c *:* m", "b *:* m", "c 5:1 rwm", "c 10:200 rwm"].map(String::from));
        let mut devices = gpu_device_nodes(&cfg.dev_dir, gpus, mig.is_some());
        let edits = if c.cdi.is_empty() || gpus.is_empty() {
            crate::cdi::Edits::default()
        } else {
            // Each GPU by its UUID, else by its index (nvidia-ctk's two naming strategies); a
            // MIG instance by its UUID.
            let uuids: Vec<&str> = visible.split(',').collect();
            let wanted: Vec<Vec<String>> = match mig {
                Some(_) => vec![vec![visible.to_string()]],
                None => gpus
                    .iter()
                    .zip(uuids)
                    .map(|(g, u)| vec![u.to_string(), g.to_string()])
                    .collect(),
            };
            let edits = c.cdi.edits(&wanted).map_err(BackendError::Rejected)?;
            // The spec's nodes are the GPUs' nodes: take them from it.
            devices.clear();
            rules.extend(
                edits
                    .device_nodes
                    .iter()
                    .map(|d| format!("{} {}:{} rwm", d.kind, d.major, d.minor)),
            );
            edits
        };
        let files = self.shared.files(spec.id);
        std::fs::create_dir_all(&files.dir)
            .and_then(|()| std::fs::set_permissions(&files.dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)))
            .map_err(|e| BackendError::Rejected(format!("{}: {e}", files.dir.display())))?;
        let work = std::path::absolute(&cfg.work_dir)
            .and_then(|w| workload_dir(&w, spec.id, cfg.run_as))
            .map_err(|e| BackendError::Rejected(e.to_string()))?;
        let (uid, gid) = cfg.run_as.ids(spec.id).unwrap_or((0, 0));
        let mut env: Vec<String> = spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        env.push(format!("CUDA_VISIBLE_DEVICES={visible}"));
        env.push(format!("TESSERA_WORKLOAD_ID={}", spec.id));
        let cspec = ContainerSpec {
            id: spec.id,
            image: &image,
            command: spec.command.as_deref(),
            env,
            work: &work,
            uid,
            gid,
            cgroups_path: cfg.cgroups.oci_path(spec.id).unwrap_or_default(),
            device_rules: &rules,
            devices: &devices,
            memory_mib: spec.memory_mib,
            cpu_milli: spec.cpu_milli,
            pids: cfg.pids_max,
            no_swap: cfg.cgroups.swap_limitable(),
            network: c.cfg.network,
            cdi: &edits,
        };
        crate::oci::cleanup(&c.cfg.runtime, &cfg.data_dir, &files.dir, spec.id);
        let bundle =
            Bundle::create(&files.dir, &cspec).map_err(|e| BackendError::Rejected(format!("image {name}: {e}")))?;
        tracing::info!(workload = spec.id, image = name, digest = %image.digest, uid, "container prepared");
        Ok((
            crate::oci::run_command(&c.cfg.runtime, &cfg.data_dir, &bundle, spec.id),
            rules,
        ))
    }

    fn mig_enabled(&self, gpu: u8) -> Result<bool, BackendError> {
        let infos = self.shared.nvml.gpus().map_err(rejected)?;
        let info = infos
            .iter()
            .find(|g| g.index == gpu as u32)
            .ok_or_else(|| BackendError::Rejected(format!("no GPU {gpu} on {}", self.shared.cfg.node)))?;
        Ok(info.mig_enabled == Some(true))
    }
}

/// What the wrapper's exit status means.
fn exit_of(code: Option<i32>) -> Exit {
    match code {
        Some(0) => Exit::Succeeded,
        Some(c) => Exit::Failed {
            exit_code: Some(c),
            detail: if c > 128 {
                format!("killed by signal {}", c - 128)
            } else {
                format!("exited with code {c}")
            },
        },
        None => Exit::Failed {
            exit_code: None,
            detail: "ended while the control plane was away; exit status unknown".into(),
        },
    }
}

fn observation_of(exit: &Exit) -> Observation {
    match exit {
        Exit::Succeeded => Observation::Succeeded,
        Exit::Failed { .. } => Observation::Failed {
            detail: exit.to_string(),
        },
    }
}

impl Shared {
    fn files(&self, id: u64) -> Files {
        Files::new(&self.cfg.data_dir, &self.cfg.work_dir, id)
    }

    /// After a container ended (or failed to start): the runtime's record and the bundle go.
    fn cleanup_container(&self, id: u64) {
        let files = self.files(id);
        if !files.dir.join("bundle").exists() {
            return;
        }
        let runtime = self
            .containers
            .as_ref()
            .map(|c| c.cfg.runtime.clone())
            .or_else(crate::oci::find_runtime);
        match runtime {
            Some(r) => crate::oci::cleanup(&r, &self.cfg.data_dir, &files.dir, id),
            None => crate::oci::cleanup_bundle(&files.dir),
        }
    }

    /// Whether any process of workload `id` is left: its cgroup's members, or without cgroups
    /// the process group of the leader the server recorded.
    fn live(&self, id: u64, leader: Option<ProcId>) -> bool {
        if self.cfg.cgroups.enabled() {
            self.cfg.cgroups.populated(id)
        } else {
            leader.is_some_and(|p| p.alive() || group_alive(p.pid))
        }
    }

    /// Records how a workload ended and tells the control plane, unless it was being stopped.
    fn ended(&self, id: u64, exit: Exit) {
        let mut st = self.state.lock().unwrap();
        let Some(p) = st.procs.get_mut(&id) else { return };
        if p.ended.is_some() {
            return;
        }
        let exit = match (p.lease_ended, exit) {
            (Some(d), Exit::Failed { exit_code, .. }) => Exit::Failed {
                exit_code,
                detail: format!("stopped at the end of its {} s lease", d.as_secs()),
            },
            (_, exit) => exit,
        };
        p.ended = Some(observation_of(&exit));
        if !p.stopping {
            let _ = self.tx.send(BackendEvent::Exited {
                id,
                at_ms: now_ms(),
                exit,
            });
        }
    }

    fn sample(&self, gpus: &[u32]) -> Vec<GpuSample> {
        let (last, migs) = {
            let st = self.state.lock().unwrap();
            let migs: Vec<(u64, (u32, u32, String))> = st
                .procs
                .iter()
                .filter(|(_, p)| p.ended.is_none())
                .filter_map(|(id, p)| Some((*id, p.mig.clone()?)))
                .collect();
            (st.last_xid.clone(), migs)
        };
        self.discovery
            .gpus
            .iter()
            .filter(|g| gpus.contains(&g.info.index))
            .filter_map(|g| {
                let s = self.nvml.sample(g.info.index).ok()?;
                Some(GpuSample {
                    node: self.cfg.node.clone(),
                    gpu: g.info.index as u8,
                    uuid: g.info.uuid.clone(),
                    model: g.model.clone().unwrap_or(g.info.name.clone()),
                    util_pct: s.util_pct.unwrap_or(0.0),
                    fb_used_mib: s.fb_used_mib,
                    fb_free_mib: s.fb_free_mib,
                    temp_c: s.temp_c,
                    power_w: s.power_w,
                    xid: last.get(&g.info.index).copied().unwrap_or(0) as u32,
                    instances: migs
                        .iter()
                        .filter(|(_, (gpu, _, _))| *gpu == g.info.index)
                        .filter_map(|(w, (gpu, gi, profile))| {
                            let (used, free) = self.nvml.instance_memory(*gpu, *gi).ok()?;
                            Some(InstanceSample {
                                workload: *w,
                                profile: profile.clone(),
                                instance_id: *gi,
                                // NVML gives engine activity per MIG instance only through GPM
                                // samples, which this backend does not read: not measured.
                                gr_engine_active: 0.0,
                                fb_used_mib: used,
                                fb_free_mib: free,
                            })
                        })
                        .collect(),
                })
            })
            .collect()
    }

    /// Reads every GPU's MIG mode and reports it, level-triggered (every pass, so a control
    /// plane that starts or takes the lead later learns it too; it acts on differences only):
    /// a GPU in MIG mode serves instances, one out of it whole GPUs, and a change pending a
    /// reset comes back by itself once the reset applied it.
    fn report_mig_modes(&self) {
        let infos = match self.nvml.gpus() {
            Ok(i) => i,
            Err(e) => {
                tracing::debug!(error = %e, "cannot read MIG modes");
                return;
            }
        };
        for info in infos {
            let Some(on) = info.mig_enabled else { continue };
            let (enabled, pending) = match info.mig_pending {
                Some(p) if p != on => (p, true),
                _ => (on, false),
            };
            let _ = self.tx.send(BackendEvent::MigMode {
                node: self.cfg.node.clone(),
                gpu: info.index as u8,
                enabled,
                pending,
            });
        }
    }

    fn unhealthy(&self, gpu: u32, xid: Option<u64>, detail: String) {
        if !self.state.lock().unwrap().unhealthy.insert(gpu) {
            return;
        }
        let _ = self.tx.send(BackendEvent::GpuHealth {
            node: self.cfg.node.clone(),
            gpu: gpu as u8,
            healthy: false,
            xid: xid.map(|x| x as u32),
            detail,
        });
    }
}

/// Every interval: a telemetry sample of every GPU; in between, XID events as NVML reports them
/// (a critical one marks its GPU unhealthy at once). A GPU NVML can no longer read is lost.
async fn telemetry_loop(weak: Weak<Shared>) {
    let mut next = Instant::now();
    loop {
        let Some(shared) = weak.upgrade() else { return };
        let wait = next.saturating_duration_since(Instant::now());
        let nvml = shared.nvml.clone();
        drop(shared);
        let xids = tokio::task::spawn_blocking(move || nvml.wait_xids(wait.as_millis() as u32))
            .await
            .unwrap_or_default();
        let Some(shared) = weak.upgrade() else { return };
        for x in xids {
            shared.state.lock().unwrap().last_xid.insert(x.gpu, x.xid);
            if xid_is_critical(x.xid) {
                shared.unhealthy(
                    x.gpu,
                    Some(x.xid),
                    format!("XID {} (needs a GPU reset or reboot)", x.xid),
                );
            } else {
                tracing::warn!(gpu = x.gpu, xid = x.xid, "XID error (not critical)");
            }
        }
        if Instant::now() >= next {
            next = Instant::now() + shared.cfg.telemetry_interval;
            let all: Vec<u32> = shared.discovery.gpus.iter().map(|g| g.info.index).collect();
            for &g in &all {
                if let Err(e) = shared.nvml.sample(g) {
                    shared.unhealthy(g, None, format!("GPU lost: {e}"));
                }
            }
            let gpus = shared.sample(&all);
            let _ = shared.tx.send(BackendEvent::Telemetry { at_ms: now_ms(), gpus });
            shared.report_mig_modes();
        }
    }
}

/// Stops a workload whose lease (`RunSpec::duration`) has run out: SIGTERM, SIGKILL after the
/// lease grace; its end is reported as stopped at the end of its lease.
async fn enforce_lease(weak: Weak<Shared>, id: u64, lease: Duration, left: Duration) {
    tokio::time::sleep(left).await;
    let Some(shared) = weak.upgrade() else { return };
    let pgid = {
        let mut st = shared.state.lock().unwrap();
        match st.procs.get_mut(&id) {
            Some(p) if p.ended.is_none() && !p.stopping => {
                p.lease_ended = Some(lease);
                p.id.pid
            }
            _ => return,
        }
    };
    let grace = shared.cfg.lease_grace;
    let cgroups = shared.cfg.cgroups.clone();
    drop(shared);
    terminate_workload(&cgroups, id, Some(pgid), grace).await;
}

/// Stops workload `id`: every process of its cgroup (SIGTERM, then freeze and SIGKILL after the
/// grace, then the cgroup removed), or without cgroups the process group `pgid` the server
/// recorded. Returns whether SIGKILL was needed.
async fn terminate_workload(cgroups: &Cgroups, id: u64, pgid: Option<i32>, grace: Duration) -> bool {
    if cgroups.enabled() {
        cgroups.terminate(id, grace).await
    } else if let Some(pgid) = pgid {
        terminate(pgid, grace).await
    } else {
        false
    }
}

/// The end of a workload's command (`code`: its exit status): what is left of it (children that
/// left its process group, daemons) is killed with its cgroup unless it is being stopped (the
/// stop's grace applies then), its output is allowed to reach the log (up to 2 s), and its end
/// is recorded and reported.
async fn finish(weak: Weak<Shared>, id: u64, code: Option<i32>) {
    let Some(shared) = weak.upgrade() else { return };
    let stopping = shared
        .state
        .lock()
        .unwrap()
        .procs
        .get(&id)
        .is_some_and(|p| p.stopping || p.lease_ended.is_some());
    let cgroups = shared.cfg.cgroups.clone();
    let files = shared.files(id);
    drop(shared);
    if !stopping {
        cgroups.kill_all(id).await;
    }
    if let Some(shared) = weak.upgrade() {
        shared.cleanup_container(id);
    }
    let t = Instant::now();
    while !files.log_complete() && t.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if let Some(shared) = weak.upgrade() {
        shared.ended(id, exit_of(code));
    }
}

/// Polls an adopted workload (not our child, so it cannot be waited for) until its command
/// ends: the leader the server recorded is gone (or has left the workload's cgroup), or with no
/// such record its cgroup is empty.
async fn watch_adopted(weak: Weak<Shared>, id: u64, leader: Option<ProcId>) {
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let Some(shared) = weak.upgrade() else { return };
        let cg = &shared.cfg.cgroups;
        let over = match leader {
            Some(p) => !(p.alive() && (!cg.enabled() || cg.members(id).contains(&p.pid))),
            None => !shared.live(id, None),
        };
        if over {
            let code = shared.files(id).read_exit();
            drop(shared);
            finish(weak, id, code).await;
            return;
        }
    }
}

#[async_trait]
impl Backend for LocalBackend {
    fn name(&self) -> &'static str {
        "local"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            partitioning: Partitioning::Instance,
            devices: DeviceAssignment::Exact,
            logs: true,
            mig_mode_switch: true,
            mig_mode_reported: true,
            confirms_stop: false,
            native_admission: false,
            multi_node: false,
            needs_image: false,
        }
    }

    /// Through NVML, on a GPU with no instance and no MIG workload; a change the driver holds
    /// pending a GPU reset is reported as such (Tessera never resets a GPU).
    async fn set_mig_mode(&self, node: &str, gpu: u8, enabled: bool) -> Result<MigModeChange, BackendError> {
        if node != self.shared.cfg.node {
            return Err(BackendError::Rejected(format!(
                "this machine is node {}, not {node}",
                self.shared.cfg.node
            )));
        }
        let busy = self
            .shared
            .state
            .lock()
            .unwrap()
            .procs
            .values()
            .filter(|p| p.ended.is_none() && p.mig.as_ref().is_some_and(|m| m.0 == gpu as u32))
            .count();
        if busy > 0 {
            return Err(BackendError::Rejected(format!(
                "GPU {gpu} on {node} runs {busy} MIG workload(s); MIG mode changes only on an idle GPU"
            )));
        }
        let instances = self.shared.nvml.instances(gpu as u32).map_err(rejected)?;
        if !instances.is_empty() {
            return Err(BackendError::Rejected(format!(
                "GPU {gpu} on {node} has {} GPU instance(s); MIG mode changes only on a GPU without instances",
                instances.len()
            )));
        }
        match self.shared.nvml.set_mig_mode(gpu as u32, enabled).map_err(rejected)? {
            true => Ok(MigModeChange::Applied),
            false => Ok(MigModeChange::PendingReset),
        }
    }

    async fn partition(&self, plan: &PartitionPlan) -> Result<PartitionReport, BackendError> {
        match plan {
            PartitionPlan::Instance { gpu, instance, .. } => {
                if !self.mig_enabled(*gpu)? {
                    return Err(BackendError::Rejected(format!(
                        "GPU {gpu} on {} is not in MIG mode; Tessera never switches MIG mode by itself (an admin enables it on a drained GPU)",
                        self.shared.cfg.node
                    )));
                }
                if let Some(gi) = self.find_instance(*gpu, instance)? {
                    return Ok(PartitionReport {
                        detail: format!("{instance} exists on GPU {gpu} (GPU instance {})", gi.id),
                        created: false,
                    });
                }
                let gi = self
                    .shared
                    .nvml
                    .create_instance(
                        *gpu as u32,
                        instance.profile_id,
                        instance.start as u32,
                        instance.size as u32,
                    )
                    .map_err(rejected)?;
                Ok(PartitionReport {
                    detail: format!("created {instance} on GPU {gpu} (GPU instance {})", gi.id),
                    created: true,
                })
            }
            PartitionPlan::Share { gpu, milli, .. } => Ok(PartitionReport {
                detail: format!("time-sliced share of {milli}/1000 of GPU {gpu}: nothing to create"),
                created: false,
            }),
            PartitionPlan::Nothing { .. } => Ok(PartitionReport {
                detail: "nothing to partition".into(),
                created: false,
            }),
            PartitionPlan::Layout { .. } => Err(BackendError::Rejected(
                "the local backend creates MIG instances one by one at the engine's placement, not whole layouts"
                    .into(),
            )),
        }
    }

    async fn unpartition(&self, plan: &PartitionPlan) -> Result<(), BackendError> {
        let PartitionPlan::Instance { gpu, instance, .. } = plan else {
            return Ok(());
        };
        let Some(gi) = self.find_instance(*gpu, instance)? else {
            return Ok(());
        };
        if self.is_adopted(*gpu as u32, gi.id) {
            tracing::info!(gpu, instance = gi.id, "adopted MIG instance kept (never destroyed)");
            return Ok(());
        }
        self.shared.nvml.destroy_instance(*gpu as u32, gi.id).map_err(rejected)
    }

    async fn start(&self, spec: &RunSpec) -> Result<(), BackendError> {
        if !spec.gang.is_empty() {
            return Err(BackendError::Rejected(format!(
                "workload {} is a gang over {} nodes: this backend runs a workload on one node",
                spec.id,
                spec.gang_size()
            )));
        }
        if let Some(p) = self.shared.state.lock().unwrap().procs.get(&spec.id)
            && p.ended.is_none()
        {
            return Ok(());
        }
        let image = spec.image.clone().filter(|i| !i.trim().is_empty());
        let command = spec.command.clone().filter(|c| !c.is_empty());
        if image.is_none() && command.is_none() {
            return Err(BackendError::Rejected(
                "the local backend runs a command or an image; this workload has neither".into(),
            ));
        }
        if image.is_some() && self.shared.containers.is_none() {
            return Err(BackendError::Rejected(
                "this machine runs no container images (its server was started without --local-images DIR); run a command instead".into(),
            ));
        }
        let mut mig = None;
        let (gpus, visible) = match &spec.devices {
            Devices::Exact { gpus, slice } => match slice {
                SliceSpec::Mig(inst) => {
                    let g = *gpus
                        .first()
                        .ok_or_else(|| BackendError::Rejected("a MIG workload without a GPU".into()))?;
                    let gi = self.find_instance(g, inst)?.ok_or_else(|| {
                        BackendError::Rejected(format!("no MIG instance {inst} on GPU {g}: partition first"))
                    })?;
                    let uuid = gi.uuid.ok_or_else(|| {
                        BackendError::Rejected(format!("GPU instance {} has no compute instance", gi.id))
                    })?;
                    mig = Some((g as u32, gi.id, inst.profile.clone()));
                    (vec![g as u32], uuid)
                }
                SliceSpec::HostOnly => (Vec::new(), String::new()),
                SliceSpec::Whole | SliceSpec::Fraction { .. } => {
                    let uuids = gpus.iter().map(|g| self.gpu_uuid(*g)).collect::<Result<Vec<_>, _>>()?;
                    (gpus.iter().map(|g| *g as u32).collect(), uuids.join(","))
                }
            },
            Devices::Count { .. } => {
                return Err(BackendError::Rejected(
                    "the local backend is given exact devices, not counts".into(),
                ));
            }
        };
        let cfg = &self.shared.cfg;
        if let Some(ids) = cfg.run_as.ids(spec.id) {
            let st = self.shared.state.lock().unwrap();
            if let Some((other, _)) = st
                .procs
                .iter()
                .find(|(o, p)| **o != spec.id && p.ended.is_none() && cfg.run_as.ids(**o) == Some(ids))
            {
                return Err(BackendError::Rejected(format!(
                    "workload {other} runs as uid {} too (the --local-uid-range is too small); try again once it ended",
                    ids.0
                )));
            }
        }
        let rules = gpu_device_rules(&cfg.dev_dir, &gpus, mig.is_some());
        let (container, device_rules) = match &image {
            None => (None, rules),
            Some(name) => {
                let (cmd, rules) = self.container(spec, name, &gpus, &visible, &mig, rules).await?;
                (Some(cmd), rules)
            }
        };
        let launch = Launch {
            id: spec.id,
            command: command.unwrap_or_default(),
            env: spec.env.clone(),
            cuda_visible_devices: visible,
            limits: Limits {
                cpu_milli: spec.cpu_milli,
                memory_mib: spec.memory_mib,
                pids: cfg.pids_max,
                devices: cfg.cgroups.devices_enforced().then_some(device_rules),
            },
            container,
        };
        let place = Place {
            data_dir: &cfg.data_dir,
            work_dir: &cfg.work_dir,
            cgroups: &cfg.cgroups,
            run_as: cfg.run_as,
            log_cap: cfg.log_cap,
            sandbox: self.shared.sandboxed.then_some(cfg.dev_dir.as_path()),
        };
        let _ = self.shared.tx.send(BackendEvent::Started {
            id: spec.id,
            bound: None,
        });
        let (mut child, proc_id) = spawn(place, &launch).map_err(|e| {
            cfg.cgroups.remove(spec.id);
            self.shared.cleanup_container(spec.id);
            match &image {
                Some(i) => BackendError::Rejected(format!("cannot start image {i}: {e}")),
                None => BackendError::Rejected(format!("cannot start `{}`: {e}", launch.command.join(" "))),
            }
        })?;
        let since = now_ms();
        self.shared.state.lock().unwrap().procs.insert(
            spec.id,
            Proc {
                id: proc_id,
                mig,
                stopping: false,
                lease_ended: None,
                since_ms: since,
                ended: None,
            },
        );
        let _ = self.shared.tx.send(BackendEvent::Running {
            id: spec.id,
            at_ms: since,
            sample: self.shared.sample(&gpus),
        });
        if let Some(lease) = spec.duration {
            let left = lease.saturating_sub(Duration::from_millis(
                spec.running_since_ms.map(|t| (now_ms() - t).max(0) as u64).unwrap_or(0),
            ));
            tokio::spawn(enforce_lease(Arc::downgrade(&self.shared), spec.id, lease, left));
        }
        let weak = Arc::downgrade(&self.shared);
        let id = spec.id;
        tokio::spawn(async move {
            let status = child.wait().await;
            let code = status.ok().and_then(|s| {
                use std::os::unix::process::ExitStatusExt;
                s.code().or(s.signal().map(|sig| 128 + sig))
            });
            finish(weak, id, code).await;
        });
        Ok(())
    }

    async fn stop(&self, id: u64, grace: Duration) -> Result<(), BackendError> {
        let target = {
            let mut st = self.shared.state.lock().unwrap();
            match st.procs.get_mut(&id) {
                Some(p) => {
                    p.stopping = true;
                    // The leader may have ended with a TERM-trapping child left in its group.
                    let leader = p.id;
                    (p.ended.is_none() || self.shared.live(id, Some(leader))).then_some(Some(leader.pid))
                }
                // Not known in this run: a live workload from before a restart is stopped too
                // (its cgroup's members; without cgroups the process group the server recorded:
                // a pid cannot be reused while a process group of that ID exists, so a live group
                // is still the workload's, even when its leader is gone).
                None => {
                    let leader = self.shared.files(id).read_pid();
                    self.shared.live(id, leader).then_some(leader.map(|p| p.pid))
                }
            }
        };
        if let Some(pgid) = target {
            let cgroups = self.shared.cfg.cgroups.clone();
            tokio::spawn(async move {
                if terminate_workload(&cgroups, id, pgid, grace).await {
                    tracing::info!(workload = id, "SIGKILL after the grace period");
                }
            });
        }
        Ok(())
    }

    async fn reconcile(&self, expected: &[RunSpec]) -> Result<ReconcileReport, BackendError> {
        let mut report = ReconcileReport::default();
        let data_dir = &self.shared.cfg.data_dir;
        let cgroups = &self.shared.cfg.cgroups;
        for spec in expected {
            let known = {
                let st = self.shared.state.lock().unwrap();
                st.procs.get(&spec.id).map(|p| match &p.ended {
                    // Stopped by Tessera and ended: gone, as the contract says (not a failure).
                    Some(_) if p.stopping => Observation::Unknown,
                    Some(o) => o.clone(),
                    None => Observation::Running {
                        since_ms: Some(p.since_ms),
                    },
                })
            };
            let obs = match known {
                Some(o) => o,
                None => {
                    let files = self.shared.files(spec.id);
                    let leader = files.read_pid();
                    // Live: its cgroup has members (without cgroups: the recorded leader lives).
                    let live = if cgroups.enabled() {
                        cgroups.populated(spec.id)
                    } else {
                        leader.is_some_and(|p| p.alive())
                    };
                    if live {
                        // Adopt the live workload from before the restart.
                        let since = spec.running_since_ms.unwrap_or_else(now_ms);
                        self.shared.state.lock().unwrap().procs.insert(
                            spec.id,
                            Proc {
                                id: leader.unwrap_or(ProcId { pid: 0, start_ticks: 0 }),
                                mig: None,
                                stopping: false,
                                lease_ended: None,
                                since_ms: since,
                                ended: None,
                            },
                        );
                        tokio::spawn(watch_adopted(Arc::downgrade(&self.shared), spec.id, leader));
                        tracing::info!(workload = spec.id, processes = ?cgroups.members(spec.id), "adopted a live workload");
                        Observation::Running { since_ms: Some(since) }
                    } else if leader.is_some() {
                        observation_of(&exit_of(files.read_exit()))
                    } else {
                        Observation::Unknown
                    }
                }
            };
            report.workloads.push((spec.id, obs));
        }
        for id in Files::all(data_dir) {
            if expected.iter().any(|s| s.id == id) {
                continue;
            }
            let detail = if cgroups.enabled() {
                let n = cgroups.members(id).len();
                (n > 0).then(|| format!("{n} process(es) still running in its cgroup"))
            } else {
                self.shared
                    .files(id)
                    .read_pid()
                    .filter(|p| p.alive())
                    .map(|p| format!("process group {} still running", p.pid))
            };
            if let Some(detail) = detail {
                report.orphans.push(Orphan {
                    id: Some(id),
                    node: self.shared.cfg.node.clone(),
                    detail,
                });
            }
        }
        // The GPUs in MIG mode now (an admin or a reset may have changed it since start-up).
        let mig_now = self.shared.nvml.gpus().map_err(|e| BackendError::Unreachable(e.0))?;
        for g in &self.shared.discovery.gpus {
            let on = mig_now
                .iter()
                .any(|i| i.index == g.info.index && i.mig_enabled == Some(true));
            let model = g.model.as_deref().and_then(|m| self.shared.catalogue.find(m));
            let Some(model) = model
                .map(|m| self.shared.catalogue.get(m))
                .filter(|m| on && m.mig.is_some())
            else {
                continue;
            };
            let instances = self
                .shared
                .nvml
                .instances(g.info.index)
                .map_err(|e| BackendError::Unreachable(e.0))?
                .into_iter()
                .map(|i| {
                    let name = model
                        .find_profile(&i.profile_id.to_string())
                        .map(|p| model.profile_name(p))
                        .unwrap_or_else(|| format!("profile-{}", i.profile_id));
                    MigInstance::new(name, i.profile_id, i.start as u8, i.size as u8)
                })
                .collect();
            report
                .layouts
                .push((self.shared.cfg.node.clone(), g.info.index as u8, instances));
        }
        Ok(report)
    }

    fn take_events(&self) -> Option<mpsc::UnboundedReceiver<BackendEvent>> {
        self.shared.rx.lock().unwrap().take()
    }

    async fn read_logs(&self, id: u64, offset: u64, max: usize) -> Result<LogChunk, BackendError> {
        let files = self.shared.files(id);
        let mut f = std::fs::File::open(files.log())
            .map_err(|_| BackendError::Rejected(format!("no logs for workload {id} on {}", self.shared.cfg.node)))?;
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let from = offset.min(len);
        f.seek(SeekFrom::Start(from))
            .map_err(|e| BackendError::Unreachable(e.to_string()))?;
        let mut bytes = Vec::new();
        (&mut f)
            .take(max as u64)
            .read_to_end(&mut bytes)
            .map_err(|e| BackendError::Unreachable(e.to_string()))?;
        let next_offset = from + bytes.len() as u64;
        let running = {
            let st = self.shared.state.lock().unwrap();
            // Output may still come from the group after its leader ended (a stopped workload
            // whose command traps SIGTERM): done only once the whole group is gone.
            match st.procs.get(&id) {
                Some(p) => p.ended.is_none() || self.shared.live(id, Some(p.id)),
                None => self.shared.live(id, files.read_pid()),
            }
        };
        // The relay may still be writing the last of it: done once it says so (or, for a log
        // from before relays, or a relay that died, once the log has been still for 2 s).
        let settled = files.log_complete()
            || f.metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|e| e > Duration::from_secs(2)));
        Ok(LogChunk {
            bytes,
            next_offset,
            done: !running && next_offset >= len && settled,
        })
    }
}
