//! This machine's GPUs: `tessera gpu-check` (read-only discovery and one telemetry sample as
//! JSON) and the `local` backend of `tessera serve --backend local [--fake-gpus N]`.

use std::sync::Arc;

use anyhow::{Context, Result, anyhow};
use clap::Args;
use tessera_backend_local::process::Cgroups;
use tessera_backend_local::{FakeGpu, FakeNvml, LocalBackend, LocalConfig, Nvml, RealNvml, discover, fleet_toml};
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

/// The local backend and the one-node fleet of this machine. Call inside the runtime.
pub fn backend(
    fake_gpus: Option<u32>,
    fake_mig: &[u32],
    node: Option<String>,
    data_dir: &std::path::Path,
    telemetry: std::time::Duration,
    grace: std::time::Duration,
) -> Result<(LocalBackend, Fleet, String)> {
    let nvml = nvml(fake_gpus, fake_mig).context("--backend local")?;
    let node = node.unwrap_or_else(host_name);
    let cgroups = Cgroups::detect(std::path::Path::new("/sys/fs/cgroup"));
    let cfg = LocalConfig {
        node: node.clone(),
        data_dir: data_dir.to_path_buf(),
        telemetry_interval: telemetry,
        cgroups,
        lease_grace: grace,
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
