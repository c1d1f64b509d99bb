//! This machine's GPUs: `tessera gpu-check` (read-only discovery and one telemetry sample as
//! JSON) and the `local` backend of `tessera serve --backend local [--fake-gpus N]`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, anyhow};
use clap::Args;
use tessera_backend_local::process::Cgroups;
use tessera_backend_local::{
    FakeGpu, FakeNvml, LocalBackend, LocalConfig, Nvml, RealNvml, RunAs, discover, fleet_toml,
};
use tessera_model::{Catalogue, Fleet};

/// The model `--fake-gpus` pretends to have.
pub const FAKE_MODEL: &str = "H100-80GB-SXM";

#[derive(Args)]
pub struct GpuCheckArgs {
    /// Use N fake GPUs instead of NVML (test mode; no driver needed).
    #[arg(long, value_name = "N")]
    fake_gpus: Option<u32>,
}

/// NVML: the fake one with `fake_gpus` (the GPUs `fake_mig` names in MIG mode), else the
/// driver's (one clear line when there is none).
pub fn nvml(fake_gpus: Option<u32>, fake_mig: &[u32]) -> Result<Arc<dyn Nvml>> {
    match fake_gpus {
        Some(0) => Err(anyhow!("--fake-gpus: give at least one GPU")),
        Some(n) if n > 16 => Err(anyhow!("--fake-gpus: at most 16 GPUs on one node")),
        Some(n) => {
            if let Some(g) = fake_mig.iter().find(|&&g| g >= n) {
                return Err(anyhow!("--fake-mig: there is no fake GPU {g} (GPUs 0–{})", n - 1));
            }
            let gpus = (0..n)
                .map(|i| {
                    let g = FakeGpu::of(FAKE_MODEL);
                    if fake_mig.contains(&i) { g.with_mig(&[]) } else { g }
                })
                .collect();
            Ok(Arc::new(FakeNvml::new(gpus)))
        }
        None if !fake_mig.is_empty() => Err(anyhow!("--fake-mig needs --fake-gpus")),
        None => Ok(Arc::new(RealNvml::init().map_err(|e| anyhow!("{e}"))?)),
    }
}

/// Discovery and one telemetry sample of every GPU, as JSON on stdout. Reads only: never changes
/// MIG mode, clocks or any setting.
pub fn gpu_check(a: GpuCheckArgs) -> Result<()> {
    let nvml = nvml(a.fake_gpus, &[])?;
    let d = discover(nvml.as_ref(), &Catalogue::builtin()).map_err(|e| anyhow!("{e}"))?;
    let samples: Vec<serde_json::Value> = d
        .gpus
        .iter()
        .map(|g| match nvml.sample(g.info.index) {
            Ok(s) => serde_json::json!({ "gpu": g.info.index, "uuid": g.info.uuid, "sample": s }),
            Err(e) => serde_json::json!({ "gpu": g.info.index, "uuid": g.info.uuid, "error": e.to_string() }),
        })
        .collect();
    let out = serde_json::json!({ "discovery": d, "telemetry": samples });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

fn host_memory_gib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))?
                .split_whitespace()
                .nth(1)?
                .parse::<u64>()
                .ok()
        })
        .map(|kib| (kib / (1024 * 1024)).max(1))
        .unwrap_or(1)
}

/// The `--local-*` flags of `tessera serve`.
pub struct Isolation {
    pub uid_range: String,
    pub allow_root: bool,
    pub work_dir: Option<PathBuf>,
    pub log_cap_mib: u64,
    pub pids_max: u64,
    pub sandbox: tessera_backend_local::SandboxMode,
    /// `--local-images`: workloads with an image run as containers from this OCI image layout.
    pub images: Option<PathBuf>,
    /// `--local-oci-runtime` (default: runc, else crun, on PATH).
    pub oci_runtime: Option<PathBuf>,
    pub container_network: tessera_backend_local::ContainerNetwork,
    pub cdi_dirs: Vec<PathBuf>,
}

/// FNV-1a, stable across builds (the cgroup name of a data directory must not change).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Which user workloads run as: their own from the range when this server may switch users
/// (root), the server's own only with `--local-allow-root`, else one line saying why not.
fn run_as(iso: &Isolation) -> Result<RunAs> {
    // SAFETY: plain syscall.
    let euid = unsafe { libc::geteuid() };
    if iso.allow_root {
        tracing::warn!(
            uid = euid,
            "--local-allow-root: workloads run as this server's own user and can read its data directory (admin token, database) and signal it; development only"
        );
        return Ok(RunAs::Server);
    }
    let range = RunAs::parse_range(&iso.uid_range).map_err(|e| anyhow!("--local-uid-range: {e}"))?;
    if euid != 0 {
        anyhow::bail!(
            "--backend local runs each workload as its own user from --local-uid-range, which needs root (this server runs as uid {euid}); run it as root, or pass --local-allow-root to run workloads as this user without isolation (development only)"
        );
    }
    Ok(range)
}

/// The local backend and the one-node fleet of this machine. Call inside the runtime.
pub fn backend(
    fake_gpus: Option<u32>,
    fake_mig: &[u32],
    node: Option<String>,
    data_dir: &Path,
    telemetry: std::time::Duration,
    grace: std::time::Duration,
    iso: &Isolation,
) -> Result<(LocalBackend, Fleet, String)> {
    let run_as = run_as(iso)?;
    let nvml = nvml(fake_gpus, fake_mig).context("--backend local")?;
    let node = node.unwrap_or_else(host_name);
    std::fs::create_dir_all(data_dir).with_context(|| format!("cannot create {}", data_dir.display()))?;
    let data_dir = std::fs::canonicalize(data_dir).with_context(|| format!("{}", data_dir.display()))?;
    let work_dir = iso.work_dir.clone().unwrap_or_else(|| {
        let mut name = data_dir.file_name().unwrap_or_default().to_os_string();
        name.push("-work");
        data_dir.with_file_name(name)
    });
    // One cgroup parent per data directory: two servers on one machine never share cgroups.
    let name = format!("tessera/{:016x}", fnv1a(data_dir.as_os_str().as_encoded_bytes()));
    let cgroups = Cgroups::detect(Path::new("/sys/fs/cgroup"), &name);
    let cfg = LocalConfig {
        node: node.clone(),
        data_dir: data_dir.clone(),
        work_dir,
        run_as,
        log_cap: iso.log_cap_mib.max(1) << 20,
        pids_max: iso.pids_max,
        dev_dir: "/dev".into(),
        telemetry_interval: telemetry,
        cgroups,
        lease_grace: grace,
        sandbox: iso.sandbox,
        containers: match &iso.images {
            None => None,
            Some(images) => Some(tessera_backend_local::ContainerConfig {
                images: std::fs::canonicalize(images)
                    .with_context(|| format!("--local-images {}", images.display()))?,
                runtime: match &iso.oci_runtime {
                    Some(r) => r.clone(),
                    None => tessera_backend_local::oci::find_runtime().ok_or_else(|| {
                        anyhow!("--local-images: no OCI runtime (runc or crun) on PATH: install Debian's runc, or name one with --local-oci-runtime")
                    })?,
                },
                network: iso.container_network,
                cdi_dirs: iso.cdi_dirs.clone(),
            }),
        },
    };
    let b = LocalBackend::new(nvml, cfg).map_err(|e| anyhow!("--backend local: {e}"))?;
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    let toml =
        fleet_toml(b.discovery(), &node, cpus, host_memory_gib()).map_err(|e| anyhow!("--backend local: {e}"))?;
    let fleet = Fleet::from_toml(&toml, "this machine").map_err(|e| anyhow!("--backend local: {e}"))?;
    for g in &b.discovery().gpus {
        if let Some(n) = &g.note {
            tracing::warn!(gpu = g.info.index, "{n}");
        }
    }
    let what = format!("{} GPUs of this machine ({})", fleet.gpu_count(), b.discovery().nvml);
    Ok((b, fleet, what))
}
