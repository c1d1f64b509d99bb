//! `tessera device-report DIR`: the report of `scripts/device-check.sh`. The script records
//! what Tessera and the GPU itself said (under `DIR/raw/`: `tessera gpu-check` JSON before and
//! after, `nvidia-smi` CSV queries and listings, per-second samples of `/metrics` and of
//! `nvidia-smi`, the workloads' `describe` JSON and output, usage, a timeline of events); this
//! module compares them field by field and writes `DIR/report.json`, one pass, fail or skip per
//! check with the figures it saw. It reads files only, so the same report is rebuilt from a
//! recorded run anywhere (the unit tests use one recorded as an H200 would show it).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use clap::Args;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tessera_model::Catalogue;

#[derive(Args)]
pub struct DeviceReportArgs {
    /// The REPORT_DIR of scripts/device-check.sh (recordings in DIR/raw/); writes DIR/report.json.
    pub dir: PathBuf,
}

/// Utilisation a busy GPU must show, in percent.
const BUSY_PCT: f64 = 80.0;
/// Utilisation an idle GPU shows at most, in percent.
const IDLE_PCT: f64 = 20.0;
/// Framebuffer the first workload adds at least (it allocates three 1 GiB matrices), MiB.
const WORKLOAD_MIB: f64 = 1024.0;
/// Framebuffer left over an idle baseline that still counts as free, MiB.
const FREE_SLACK_MIB: f64 = 256.0;
/// Beyond one telemetry interval, what sampling adds: `/metrics` is read every second, and a
/// reading takes up to a second more.
const SAMPLING_SLACK_MS: i64 = 2000;

/// The outcome of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Fail,
    Skip,
}

/// One check: what was compared and what was seen.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub check: String,
    pub status: Status,
    pub detail: String,
}

/// The report written to `DIR/report.json`.
#[derive(Debug, Serialize)]
pub struct Report {
    pub report: &'static str,
    /// `pass` when no check failed.
    pub result: &'static str,
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
    /// `tessera --version` of the binary the script ran.
    pub tessera: String,
    pub host: String,
    pub checks: Vec<Check>,
    /// The recordings the checks read (under `raw/`).
    pub recordings: Vec<String>,
}

/// The recorded files of one run, by name.
#[derive(Clone, Debug, Default)]
pub struct Recorded {
    pub files: BTreeMap<String, String>,
}

impl Recorded {
    /// Every file of `dir` (not hidden ones).
    pub fn read(dir: &Path) -> Result<Recorded> {
        let mut files = BTreeMap::new();
        for e in std::fs::read_dir(dir).with_context(|| format!("{}: cannot read the recordings", dir.display()))? {
            let e = e?;
            let name = e.file_name().to_string_lossy().to_string();
            if name.starts_with('.') || !e.file_type()?.is_file() {
                continue;
            }
            let bytes = std::fs::read(e.path())?;
            files.insert(name, String::from_utf8_lossy(&bytes).into_owned());
        }
        Ok(Recorded { files })
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.files
            .get(name)
            .map(|s| s.as_str())
            .filter(|s| !s.trim().is_empty())
    }

    fn json(&self, name: &str) -> Option<Value> {
        serde_json::from_str(self.get(name)?).ok()
    }
}

/// `tessera device-report DIR`: writes DIR/report.json and prints one line per check; fails
/// (exit 1) when a check failed.
pub fn run(a: DeviceReportArgs) -> Result<()> {
    let rec = Recorded::read(&a.dir.join("raw"))?;
    let report = build(&rec);
    let out = a.dir.join("report.json");
    std::fs::write(&out, serde_json::to_string_pretty(&report)? + "\n")
        .with_context(|| format!("cannot write {}", out.display()))?;
    for c in &report.checks {
        let s = match c.status {
            Status::Pass => "pass",
            Status::Fail => "FAIL",
            Status::Skip => "skip",
        };
        println!("{s:<4}  {:<34} {}", c.check, c.detail);
    }
    println!(
        "{}: {} passed, {} failed, {} skipped ({})",
        report.result,
        report.passed,
        report.failed,
        report.skipped,
        out.display()
    );
    if report.failed > 0 {
        return Err(anyhow!("{} of {} checks failed", report.failed, report.checks.len()));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Parsers of what nvidia-smi and the script recorded.

/// `nvidia-smi --query-…=… --format=csv[,nounits]`: one map per row, keyed by the header's field
/// names without their units (`memory.total [MiB]` → `memory.total`); `[N/A]`, `[Not
/// Supported]` and units are dropped from values.
pub fn smi_csv(text: &str) -> Vec<BTreeMap<String, String>> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let Some(header) = lines.next() else { return Vec::new() };
    let keys: Vec<String> = header
        .split(',')
        .map(|k| k.split(" [").next().unwrap_or(k).trim().to_string())
        .collect();
    lines
        .map(|l| {
            keys.iter()
                .zip(l.split(','))
                .filter_map(|(k, v)| {
                    let v = v.trim();
                    let v = v
                        .strip_suffix(" MiB")
                        .or(v.strip_suffix(" W"))
                        .or(v.strip_suffix(" MHz"))
                        .or(v.strip_suffix(" %"))
                        .unwrap_or(v);
                    (!v.is_empty() && !v.starts_with('[') && v != "N/A").then(|| (k.clone(), v.to_string()))
                })
                .collect()
        })
        .collect()
}

fn num(row: &BTreeMap<String, String>, key: &str) -> Option<f64> {
    row.get(key)?.trim().parse().ok()
}

/// `nvidia-smi -L`: per GPU index, its name, UUID and the UUIDs of its MIG devices.
pub fn smi_list(text: &str) -> BTreeMap<u32, (String, String, Vec<String>)> {
    let mut out: BTreeMap<u32, (String, String, Vec<String>)> = BTreeMap::new();
    let mut last = None;
    for l in text.lines() {
        let t = l.trim();
        let uuid = t
            .rsplit_once("(UUID: ")
            .map(|(_, u)| u.trim_end_matches(')').trim().to_string());
        if let Some(rest) = t.strip_prefix("GPU ")
            && let Some((idx, name)) = rest.split_once(':')
            && let Ok(i) = idx.trim().parse::<u32>()
        {
            let name = name.split(" (UUID").next().unwrap_or("").trim().to_string();
            out.insert(i, (name, uuid.unwrap_or_default(), Vec::new()));
            last = Some(i);
        } else if t.starts_with("MIG ")
            && let (Some(i), Some(u)) = (last, uuid)
        {
            out.entry(i).or_default().2.push(u);
        }
    }
    out
}

/// `nvidia-smi nvlink -s`: per GPU index, (active links, links listed).
pub fn smi_nvlink(text: &str) -> BTreeMap<u32, (usize, usize)> {
    let mut out = BTreeMap::new();
    let mut gpu = None;
    for l in text.lines() {
        let t = l.trim();
        if let Some(rest) = t.strip_prefix("GPU ") {
            gpu = rest.split(':').next().and_then(|i| i.trim().parse::<u32>().ok());
            if let Some(g) = gpu {
                out.entry(g).or_insert((0, 0));
            }
        } else if t.starts_with("Link ")
            && let Some(g) = gpu
        {
            let e = out.entry(g).or_insert((0, 0));
            e.1 += 1;
            let state = t
                .split_once(':')
                .map(|(_, s)| s.trim().to_ascii_lowercase())
                .unwrap_or_default();
            if !state.contains("inactive") && state.contains("/s") {
                e.0 += 1;
            }
        }
    }
    out
}

/// One row of `nvidia-smi mig -lgi` (GPU instances) or `-lci` (compute instances).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct MigRow {
    pub gpu: u32,
    /// The GPU instance ID.
    pub gi: u32,
    /// Profile ID (of the GPU instance in `-lgi`, of the compute instance in `-lci`).
    pub profile: u32,
    /// The compute instance ID (`-lci` only).
    pub ci: Option<u32>,
    pub start: u32,
    pub size: u32,
}

/// The table rows of `nvidia-smi mig -lgi` / `-lci`; "No MIG-enabled devices found" has none.
pub fn smi_mig_table(text: &str) -> Vec<MigRow> {
    let mut out = Vec::new();
    for l in text.lines() {
        let inner = l.trim().trim_matches('|');
        let tok: Vec<&str> = inner.split_whitespace().collect();
        let Some(mig) = tok.iter().position(|t| *t == "MIG") else {
            continue;
        };
        let ids: Vec<u32> = tok.iter().filter_map(|t| t.parse().ok()).collect();
        let Some((start, size)) = tok
            .last()
            .and_then(|p| p.split_once(':'))
            .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
        else {
            continue;
        };
        // -lgi: GPU MIG NAME PROFILE GI START:SIZE; -lci: GPU GI MIG NAME PROFILE CI START:SIZE.
        match (mig, ids.as_slice()) {
            (1, [gpu, profile, gi]) => out.push(MigRow {
                gpu: *gpu,
                gi: *gi,
                profile: *profile,
                ci: None,
                start,
                size,
            }),
            (2, [gpu, gi, profile, ci]) => out.push(MigRow {
                gpu: *gpu,
                gi: *gi,
                profile: *profile,
                ci: Some(*ci),
                start,
                size,
            }),
            _ => {}
        }
    }
    out
}

/// `nvidia-smi mig -lgipp`: `(GPU, profile ID) → (starts, size)`.
pub fn smi_lgipp(text: &str) -> BTreeMap<(u32, u32), (Vec<u32>, u32)> {
    let mut out = BTreeMap::new();
    for l in text.lines() {
        let Some(rest) = l.trim().strip_prefix("GPU") else {
            continue;
        };
        let Some((gpu, rest)) = rest.split_once("Profile ID") else {
            continue;
        };
        let Some((id, rest)) = rest.split_once("Placement") else {
            continue;
        };
        let (Ok(gpu), Ok(id)) = (gpu.trim().parse::<u32>(), id.trim().parse::<u32>()) else {
            continue;
        };
        let Some((set, size)) = rest.split_once('{').and_then(|(_, r)| r.split_once("}:")) else {
            continue;
        };
        let starts = set.split(',').filter_map(|s| s.trim().parse().ok()).collect();
        if let Ok(size) = size.trim().parse() {
            out.insert((gpu, id), (starts, size));
        }
    }
    out
}

/// `events.tsv`: `at_ms<TAB>key<TAB>value`.
pub fn events(text: &str) -> Vec<(i64, String, String)> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, '\t');
            let at = f.next()?.trim().parse().ok()?;
            Some((at, f.next()?.to_string(), f.next().unwrap_or("").trim().to_string()))
        })
        .collect()
}

/// One reading of a GPU: when, utilisation (%), framebuffer used (MiB).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Reading {
    pub at_ms: i64,
    pub util: Option<f64>,
    pub fb_used: Option<f64>,
}

/// `metrics-samples.txt`: blocks of `# at_ms N` and the `/metrics` lines of
/// `DCGM_FI_DEV_GPU_UTIL` and `DCGM_FI_DEV_FB_USED`; the readings of the GPU with `uuid`.
pub fn metrics_readings(text: &str, uuid: &str) -> Vec<Reading> {
    let mut out: Vec<Reading> = Vec::new();
    let want = format!("UUID=\"{uuid}\"");
    for l in text.lines() {
        if let Some(at) = l.strip_prefix("# at_ms ") {
            if let Ok(at_ms) = at.trim().parse() {
                out.push(Reading {
                    at_ms,
                    ..Reading::default()
                });
            }
            continue;
        }
        let (Some(r), true) = (out.last_mut(), l.contains(&want)) else {
            continue;
        };
        let value = l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
        if l.starts_with("DCGM_FI_DEV_GPU_UTIL{") {
            r.util = value;
        } else if l.starts_with("DCGM_FI_DEV_FB_USED{") {
            r.fb_used = value;
        }
    }
    out.retain(|r| r.util.is_some() || r.fb_used.is_some());
    out
}

/// `smi-samples.csv`: `at_ms, index, utilization.gpu, memory.used` per line; those of GPU `gpu`.
pub fn smi_readings(text: &str, gpu: u32) -> Vec<Reading> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            (f.len() >= 4 && f[1].parse::<u32>().ok()? == gpu).then(|| Reading {
                at_ms: f[0].parse().unwrap_or(0),
                util: f[2].parse().ok(),
                fb_used: f[3].parse().ok(),
            })
        })
        .collect()
}

/// The `devcheck KEY=VALUE` and `devcheck KEY VALUE …` lines a workload printed.
pub fn markers(log: &str) -> BTreeMap<String, String> {
    log.lines()
        .filter_map(|l| l.trim().strip_prefix("devcheck "))
        .filter_map(|m| {
            let (k, v) = match m.split_once('=') {
                Some((k, v)) if !k.contains(' ') => (k, v),
                _ => m.split_once(' ')?,
            };
            Some((k.to_string(), v.trim().to_string()))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// What `tessera gpu-check` prints.

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct CheckedInstance {
    pub id: u32,
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
    pub uuid: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct CheckedGpu {
    /// What NVML said, as discovery writes it (`tessera_backend_local::DiscoveredGpu`).
    #[serde(flatten)]
    pub info: tessera_backend_local::GpuInfo,
    pub model: Option<String>,
    pub served_as: String,
    #[serde(default)]
    pub instances: Vec<CheckedInstance>,
    #[serde(default)]
    pub nvlink_gpus: Vec<u32>,
    #[serde(default)]
    pub nvlink_other: usize,
}

#[derive(Clone, Debug, Deserialize)]
pub struct CheckedDiscovery {
    pub nvml: String,
    pub gpus: Vec<CheckedGpu>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct CheckedSample {
    pub util_pct: Option<f64>,
    pub fb_used_mib: u64,
    pub temp_c: f64,
    pub power_w: f64,
}

#[derive(Clone, Debug, Deserialize)]
pub struct CheckedTelemetry {
    pub gpu: u32,
    pub sample: Option<CheckedSample>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct GpuCheck {
    pub discovery: CheckedDiscovery,
    #[serde(default)]
    pub telemetry: Vec<CheckedTelemetry>,
}

impl GpuCheck {
    fn sample(&self, gpu: u32) -> Option<&CheckedSample> {
        self.telemetry.iter().find(|t| t.gpu == gpu)?.sample.as_ref()
    }
}

/// `0000:19:00.0` and `00000000:19:00.0` are the same bus ID.
fn bus_id(s: &str) -> String {
    let s = s.trim().to_ascii_lowercase();
    match s.split_once(':') {
        Some((dom, rest)) => match u32::from_str_radix(dom, 16) {
            Ok(d) => format!("{d:08x}:{rest}"),
            Err(_) => s,
        },
        None => s,
    }
}

/// nvidia-smi's `pci.device_id` (`0x233510DE`: device in the upper 16 bits, vendor below).
fn smi_device_id(s: &str) -> Option<u32> {
    let v = u32::from_str_radix(s.trim().trim_start_matches("0x").trim_start_matches("0X"), 16).ok()?;
    Some(v >> 16)
}

fn mig_word(m: Option<bool>) -> &'static str {
    match m {
        Some(true) => "Enabled",
        Some(false) => "Disabled",
        None => "N/A",
    }
}

// ---------------------------------------------------------------------------------------------
// The checks.

struct Checks(Vec<Check>);

impl Checks {
    fn add(&mut self, check: impl Into<String>, status: Status, detail: impl Into<String>) {
        self.0.push(Check {
            check: check.into(),
            status,
            detail: detail.into(),
        });
    }
    fn ok(&mut self, check: impl Into<String>, ok: bool, detail: impl Into<String>) {
        self.add(check, if ok { Status::Pass } else { Status::Fail }, detail);
    }
    fn fail(&mut self, check: impl Into<String>, detail: impl Into<String>) {
        self.add(check, Status::Fail, detail);
    }
    fn skip(&mut self, check: impl Into<String>, detail: impl Into<String>) {
        self.add(check, Status::Skip, detail);
    }
}

fn missing(file: &str) -> String {
    format!("no {file} recorded (the script did not get that far; see device-check.log)")
}

/// Builds the report from a recorded run.
pub fn build(rec: &Recorded) -> Report {
    let mut c = Checks(Vec::new());
    let ev = rec.get("events.tsv").map(events).unwrap_or_default();
    let at = |key: &str| ev.iter().find(|e| e.1 == key).map(|e| e.0);
    let val = |key: &str| ev.iter().find(|e| e.1 == key).map(|e| e.2.clone());
    let interval_ms: i64 = val("telemetry_ms").and_then(|v| v.parse().ok()).unwrap_or(5000);
    let grace_ms: i64 = val("grace_s").and_then(|v| v.parse::<i64>().ok()).unwrap_or(30) * 1000;
    let window = interval_ms + SAMPLING_SLACK_MS;
    if let Some(s) = val("budget.exceeded") {
        c.fail("budget", format!("the collection ran into its {s} s limit"));
    }

    // 1. Discovery against nvidia-smi.
    let smi = rec.get("smi-gpu.csv").map(smi_csv).unwrap_or_default();
    let check: Option<GpuCheck> = rec.get("gpu-check.json").and_then(|s| serde_json::from_str(s).ok());
    if smi.is_empty() {
        c.fail("nvidia-smi", missing("smi-gpu.csv"));
    }
    let Some(gc) = check else {
        c.fail("gpu-check", missing("gpu-check.json (or it is not gpu-check's JSON)"));
        return finish(rec, c);
    };
    c.ok(
        "discovery.count",
        gc.discovery.gpus.len() == smi.len(),
        format!(
            "gpu-check found {} GPU(s), nvidia-smi {}",
            gc.discovery.gpus.len(),
            smi.len()
        ),
    );
    if let Some(driver) = smi.first().and_then(|r| r.get("driver_version")) {
        c.ok(
            "discovery.driver",
            gc.discovery.nvml.contains(driver.as_str()),
            format!("gpu-check: {}; nvidia-smi: driver {driver}", gc.discovery.nvml),
        );
    }
    let cat = Catalogue::builtin();
    let list = rec.get("smi-L.txt").map(smi_list).unwrap_or_default();
    let nvlink = rec.get("smi-nvlink.txt").map(smi_nvlink).unwrap_or_default();
    let lgi = rec.get("smi-mig-lgi.txt").map(smi_mig_table).unwrap_or_default();
    let lci = rec.get("smi-mig-lci.txt").map(smi_mig_table).unwrap_or_default();
    for row in &smi {
        let Some(idx) = row.get("index").and_then(|i| i.parse::<u32>().ok()) else {
            continue;
        };
        let p = format!("gpu{idx}");
        let Some(g) = gc.discovery.gpus.iter().find(|g| g.info.index == idx) else {
            c.fail(
                format!("{p}.discovered"),
                "nvidia-smi shows this GPU, gpu-check does not",
            );
            continue;
        };
        let field = |c: &mut Checks, name: &str, ours: String, theirs: Option<&String>, same: bool| {
            let theirs = theirs.cloned().unwrap_or_else(|| "(not shown)".into());
            c.ok(
                format!("{p}.{name}"),
                same,
                format!("gpu-check {ours}, nvidia-smi {theirs}"),
            );
        };
        let smi_uuid = row.get("uuid");
        field(
            &mut c,
            "uuid",
            g.info.uuid.clone(),
            smi_uuid,
            smi_uuid == Some(&g.info.uuid),
        );
        field(
            &mut c,
            "name",
            g.info.name.clone(),
            row.get("name"),
            row.get("name") == Some(&g.info.name),
        );
        let bus = row.get("pci.bus_id");
        field(
            &mut c,
            "pci_bus_id",
            g.info.pci_bus_id.clone(),
            bus,
            bus.is_some_and(|b| bus_id(b) == bus_id(&g.info.pci_bus_id)),
        );
        let dev = row.get("pci.device_id");
        field(
            &mut c,
            "pci_device_id",
            format!("{:#06x}", g.info.pci_device_id),
            dev,
            dev.and_then(|d| smi_device_id(d)) == Some(g.info.pci_device_id),
        );
        let total = num(row, "memory.total");
        field(
            &mut c,
            "memory_total",
            format!("{} MiB", g.info.memory_mib),
            row.get("memory.total"),
            total.is_some_and(|t| (t - g.info.memory_mib as f64).abs() <= 1.0),
        );
        let smi_mig = row.get("mig.mode.current").map(|m| m.as_str()).unwrap_or("N/A");
        c.ok(
            format!("{p}.mig_mode"),
            mig_word(g.info.mig_enabled) == smi_mig,
            format!("gpu-check {}, nvidia-smi {smi_mig}", mig_word(g.info.mig_enabled)),
        );
        // The catalogue model, and its memory figure against the GPU's.
        match g.model.as_deref().and_then(|m| cat.find(m)).map(|m| cat.get(m)) {
            Some(m) => c.ok(
                format!("{p}.catalogue_model"),
                total.is_some_and(|t| t == m.memory_mib as f64),
                format!(
                    "{} → {} ({} MiB in the catalogue, {} MiB on the GPU; served as {})",
                    g.info.name,
                    m.name,
                    m.memory_mib,
                    total.map(|t| t.to_string()).unwrap_or("?".into()),
                    g.served_as
                ),
            ),
            None => c.fail(
                format!("{p}.catalogue_model"),
                format!("{} is not in the catalogue (served as a whole GPU)", g.info.name),
            ),
        }
        // UUIDs and MIG devices as nvidia-smi -L lists them.
        match list.get(&idx) {
            Some((_, uuid, migs)) => {
                let ours: BTreeSet<&str> = g.instances.iter().filter_map(|i| i.uuid.as_deref()).collect();
                let theirs: BTreeSet<&str> = migs.iter().map(|s| s.as_str()).collect();
                c.ok(
                    format!("{p}.uuids"),
                    uuid == &g.info.uuid && ours == theirs,
                    format!(
                        "nvidia-smi -L: {uuid} with {} MIG device(s); gpu-check: {} with {}",
                        theirs.len(),
                        g.info.uuid,
                        ours.len()
                    ),
                );
            }
            None => c.fail(format!("{p}.uuids"), missing("smi-L.txt entry for this GPU")),
        }
        // GPU and compute instances.
        let mut ours: Vec<(u32, u32, u32, u32)> = g
            .instances
            .iter()
            .map(|i| (i.id, i.profile_id, i.start, i.size))
            .collect();
        let mut theirs: Vec<(u32, u32, u32, u32)> = lgi
            .iter()
            .filter(|r| r.gpu == idx)
            .map(|r| (r.gi, r.profile, r.start, r.size))
            .collect();
        ours.sort();
        theirs.sort();
        c.ok(
            format!("{p}.gpu_instances"),
            ours == theirs,
            format!("gpu-check {ours:?}, nvidia-smi mig -lgi {theirs:?} (id, profile, start, size)"),
        );
        let with_ci: BTreeSet<u32> = g.instances.iter().filter(|i| i.uuid.is_some()).map(|i| i.id).collect();
        let smi_ci: BTreeSet<u32> = lci
            .iter()
            .filter(|r| r.gpu == idx && r.ci.is_some())
            .map(|r| r.gi)
            .collect();
        c.ok(
            format!("{p}.compute_instances"),
            with_ci == smi_ci,
            format!("GPU instances with a compute instance: gpu-check {with_ci:?}, nvidia-smi mig -lci {smi_ci:?}"),
        );
        // NVLink: active links (nvidia-smi) and the peers they reach (gpu-check).
        let peers = g.nvlink_gpus.len() + g.nvlink_other;
        match nvlink.get(&idx) {
            Some((active, listed)) => c.ok(
                format!("{p}.nvlink"),
                (*active > 0) == (peers > 0),
                format!(
                    "nvidia-smi: {active} of {listed} links active; gpu-check: {} GPU peer(s), {} other (NVSwitch) peer(s)",
                    g.nvlink_gpus.len(),
                    g.nvlink_other
                ),
            ),
            None => c.ok(
                format!("{p}.nvlink"),
                peers == 0,
                format!("nvidia-smi nvlink -s lists no links; gpu-check: {peers} peer(s)"),
            ),
        }
        // One telemetry sample, taken seconds apart from nvidia-smi's: within tolerances.
        match gc.sample(idx) {
            Some(s) => {
                let mut off = Vec::new();
                let mut cmp = |what: &str, ours: f64, theirs: Option<f64>, tol: f64| match theirs {
                    Some(t) if (ours - t).abs() <= tol => format!("{what} {ours}/{t}"),
                    Some(t) => {
                        off.push(what.to_string());
                        format!("{what} {ours}/{t} (more than {tol} apart)")
                    }
                    None => format!("{what} {ours}/-"),
                };
                let fb = s.fb_used_mib as f64;
                let parts = [
                    cmp("util %", s.util_pct.unwrap_or(0.0), num(row, "utilization.gpu"), 20.0),
                    cmp(
                        "fb used MiB",
                        fb,
                        num(row, "memory.used"),
                        FREE_SLACK_MIB.max(fb * 0.02),
                    ),
                    cmp("temp C", s.temp_c, num(row, "temperature.gpu"), 5.0),
                    cmp(
                        "power W",
                        s.power_w,
                        num(row, "power.draw"),
                        (s.power_w * 0.2).max(30.0),
                    ),
                ];
                c.ok(
                    format!("{p}.telemetry"),
                    off.is_empty(),
                    format!("NVML sample / nvidia-smi: {}", parts.join(", ")),
                );
            }
            None => c.fail(
                format!("{p}.telemetry"),
                "gpu-check has no telemetry sample for this GPU",
            ),
        }
        // The placement table (only listed in MIG mode) against the catalogue's.
        lgipp_check(&mut c, rec, &cat, &p, idx, g);
    }

    // Settings before and after: the check changes none.
    let after = rec.get("smi-gpu-after.csv").map(smi_csv).unwrap_or_default();
    if after.is_empty() {
        c.fail("settings_unchanged", missing("smi-gpu-after.csv"));
    } else {
        let keys = [
            "mig.mode.current",
            "mig.mode.pending",
            "power.limit",
            "clocks.applications.graphics",
            "clocks.applications.memory",
            "compute_mode",
            "persistence_mode",
        ];
        let mut changed = Vec::new();
        for b in &smi {
            let a = after.iter().find(|a| a.get("uuid") == b.get("uuid"));
            for k in keys {
                if a.and_then(|a| a.get(k)) != b.get(k) {
                    changed.push(format!(
                        "{} {k}: {:?} → {:?}",
                        b.get("index").map(|s| s.as_str()).unwrap_or("?"),
                        b.get(k),
                        a.and_then(|a| a.get(k))
                    ));
                }
            }
        }
        c.ok(
            "settings_unchanged",
            changed.is_empty(),
            if changed.is_empty() {
                format!("{} before and after, on every GPU", keys.join(", "))
            } else {
                changed.join("; ")
            },
        );
    }
    let gc_after: Option<GpuCheck> = rec
        .get("gpu-check-after.json")
        .and_then(|s| serde_json::from_str(s).ok());
    let lgi_after = rec.get("smi-mig-lgi-after.txt").map(smi_mig_table).unwrap_or_default();
    match &gc_after {
        Some(a) => {
            let inst = |d: &CheckedDiscovery| -> Vec<(u32, Vec<CheckedInstance>)> {
                d.gpus.iter().map(|g| (g.info.index, g.instances.clone())).collect()
            };
            let kept = inst(&gc.discovery) == inst(&a.discovery) && lgi == lgi_after;
            let n: usize = gc.discovery.gpus.iter().map(|g| g.instances.len()).sum();
            c.ok(
                "mig.instances_kept",
                kept,
                if kept {
                    format!("the same {n} GPU instance(s) before and after (gpu-check and nvidia-smi mig -lgi): nothing created or destroyed")
                } else {
                    format!(
                        "GPU instances changed: before {:?}, after {:?}",
                        inst(&gc.discovery),
                        inst(&a.discovery)
                    )
                },
            );
        }
        None => c.fail("mig.instances_kept", missing("gpu-check-after.json")),
    }

    // 2. The control plane.
    let mig_on = val("mig").as_deref() == Some("yes");
    match at("serve.ready") {
        Some(_) => {
            let banner = rec
                .get("serve.log")
                .and_then(|l| l.lines().find(|l| l.contains("console http://")))
                .unwrap_or("")
                .trim()
                .to_string();
            c.ok(
                "serve.started",
                banner.contains("GPUs of this machine"),
                if banner.is_empty() {
                    "no banner in serve.log".into()
                } else {
                    banner
                },
            );
        }
        None => {
            c.fail(
                "serve.started",
                "tessera serve --backend local did not come up (see serve.log)",
            );
            return finish(rec, c);
        }
    }
    serve_fleet_checks(&mut c, rec, &gc, &cat, mig_on);

    // The workloads.
    const W: [&str; 12] = [
        "workload1.ran",
        "workload1.sees_its_gpu",
        "telemetry.utilisation_high",
        "telemetry.memory_in_use",
        "telemetry.matches_nvidia_smi",
        "telemetry.falls_back",
        "describe.observed",
        "metering.interval",
        "metering.measured",
        "release.workload1",
        "cancel.sigterm_then_sigkill",
        "cancel.gpu_memory_free",
    ];
    match val("workloads.skipped").as_deref() {
        Some("mig") => {
            for w in W {
                c.skip(
                    w,
                    "a GPU is in MIG mode: whole-GPU workloads need MIG mode off, and the check never changes it",
                );
            }
            return finish(rec, c);
        }
        Some(_) => {
            let why = rec.get("torch.txt").and_then(|t| t.lines().last()).unwrap_or("").trim();
            c.fail("torch", format!("PyTorch with CUDA is not usable: {why}"));
            for w in W {
                c.skip(w, "not run: PyTorch with CUDA is not usable (see the torch check)");
            }
            return finish(rec, c);
        }
        None => c.ok(
            "torch",
            val("torch").as_deref() == Some("ok"),
            rec.get("torch.txt").unwrap_or("").trim().to_string(),
        ),
    }
    workload_checks(&mut c, rec, &gc, gc_after.as_ref(), &smi, window, grace_ms, &at);
    finish(rec, c)
}

fn lgipp_check(c: &mut Checks, rec: &Recorded, cat: &Catalogue, p: &str, idx: u32, g: &CheckedGpu) {
    let Some(text) = rec.get("smi-mig-lgipp.txt") else {
        c.skip(
            format!("{p}.mig_placements"),
            "nvidia-smi mig -lgipp lists placements in MIG mode only; the GPU is not in MIG mode",
        );
        return;
    };
    let table: Vec<_> = smi_lgipp(text)
        .into_iter()
        .filter(|((gpu, _), _)| *gpu == idx)
        .collect();
    let Some(geom) = g
        .model
        .as_deref()
        .and_then(|m| cat.find(m))
        .and_then(|m| cat.get(m).mig)
    else {
        c.fail(
            format!("{p}.mig_placements"),
            "the catalogue has no MIG table for this model",
        );
        return;
    };
    let mut diff = Vec::new();
    for prof in geom.profiles {
        let ours: Vec<u32> = prof.starts.iter().map(|s| *s as u32).collect();
        match table.iter().find(|((_, id), _)| *id == prof.id) {
            Some((_, (starts, size))) if *starts == ours && *size == prof.mem_slices as u32 => {}
            Some((_, (starts, size))) => diff.push(format!(
                "profile {}: catalogue {ours:?}:{}, GPU {starts:?}:{size}",
                prof.id, prof.mem_slices
            )),
            None => diff.push(format!("profile {}: not listed by the GPU", prof.id)),
        }
    }
    for ((_, id), _) in &table {
        if geom.profile_index(*id).is_none() {
            diff.push(format!("profile {id}: listed by the GPU, not in the catalogue"));
        }
    }
    c.ok(
        format!("{p}.mig_placements"),
        diff.is_empty(),
        if diff.is_empty() {
            format!(
                "nvidia-smi mig -lgipp matches the catalogue's {} profiles",
                geom.profiles.len()
            )
        } else {
            diff.join("; ")
        },
    );
}

fn serve_fleet_checks(c: &mut Checks, rec: &Recorded, gc: &GpuCheck, cat: &Catalogue, mig_on: bool) {
    let Some(pools) = rec.json("pools-before.json") else {
        c.fail("serve.fleet", missing("pools-before.json"));
        return;
    };
    let pool = pools.as_array().and_then(|a| a.iter().find(|p| p["name"] == "local"));
    let gpus = pool.and_then(|p| p["gpus"].as_u64()).unwrap_or(0);
    let sharing = pool.and_then(|p| p["sharing"].as_str()).unwrap_or("");
    let want = if mig_on { "mig" } else { "whole" };
    c.ok(
        "serve.fleet",
        gpus == gc.discovery.gpus.len() as u64 && sharing == want,
        format!("pool local: {gpus} GPU(s), sharing {sharing} (expected {want})"),
    );
    if !mig_on {
        return;
    }
    // Adopted instances are shown on their GPU's slices.
    let views = rec.json("gpus-serve.json").unwrap_or(Value::Null);
    let mut unseen = Vec::new();
    for g in &gc.discovery.gpus {
        let view = views
            .as_array()
            .and_then(|a| a.iter().find(|v| v["index"].as_u64() == Some(g.info.index as u64)));
        let slices = view.and_then(|v| v["mig_slices"].as_str()).unwrap_or("");
        let model = g.model.as_deref().and_then(|m| cat.find(m)).map(|m| cat.get(m));
        for i in &g.instances {
            let marked = (i.start..i.start + i.size).all(|s| slices.as_bytes().get(s as usize) == Some(&b'#'));
            let name = model
                .and_then(|m| m.find_profile(&i.profile_id.to_string()).map(|p| m.profile_name(p)))
                .unwrap_or_default();
            let listed = view.is_some_and(|v| v["slices"].to_string().contains(&format!("\"{name}\"")));
            if !(marked || listed) {
                unseen.push(format!(
                    "GPU {} instance {} ({name} at {}:{})",
                    g.info.index, i.id, i.start, i.size
                ));
            }
        }
    }
    let n: usize = gc.discovery.gpus.iter().map(|g| g.instances.len()).sum();
    c.ok(
        "mig.adopted_shown",
        unseen.is_empty(),
        if unseen.is_empty() {
            format!("{n} existing GPU instance(s) shown by `tessera gpus`")
        } else {
            format!("not shown by `tessera gpus`: {}", unseen.join(", "))
        },
    );
}

#[allow(clippy::too_many_arguments)]
fn workload_checks(
    c: &mut Checks,
    rec: &Recorded,
    gc: &GpuCheck,
    gc_after: Option<&GpuCheck>,
    smi: &[BTreeMap<String, String>],
    window: i64,
    grace_ms: i64,
    at: &dyn Fn(&str) -> Option<i64>,
) {
    let Some(w1) = rec.json("w1.json") else {
        c.fail("workload1.ran", missing("w1.json"));
        return;
    };
    let state = w1["workload"]["state"].as_str().unwrap_or("?");
    c.ok(
        "workload1.ran",
        state == "succeeded",
        format!(
            "state {state}{}",
            w1["workload"]["reason"]
                .as_str()
                .map(|r| format!(" — {r}"))
                .unwrap_or_default()
        ),
    );
    let events1 = w1["events"].as_array().cloned().unwrap_or_default();
    let step_at = |evs: &[Value], step: &str| evs.iter().find(|e| e["step"] == step).and_then(|e| e["at_ms"].as_i64());
    let gpus: Vec<u64> = w1["workload"]["allocation"]["gpus"]
        .as_array()
        .map(|a| a.iter().filter_map(|g| g.as_u64()).collect())
        .unwrap_or_default();
    let Some(g) = gpus
        .first()
        .and_then(|i| gc.discovery.gpus.iter().find(|g| g.info.index as u64 == *i))
    else {
        c.fail(
            "workload1.sees_its_gpu",
            format!("no allocation on a discovered GPU: {gpus:?}"),
        );
        return;
    };
    let m = markers(rec.get("w1.log").unwrap_or(""));
    let smi_name = smi
        .iter()
        .find(|r| r.get("uuid") == Some(&g.info.uuid))
        .and_then(|r| r.get("name"))
        .cloned()
        .unwrap_or_default();
    let seen = |k: &str| m.get(k).map(|s| s.as_str()).unwrap_or("(not printed)");
    let torch_uuid = seen("uuid");
    // PyTorch's device UUID, written `GPU-…` by the workload; compared without prefix or dashes.
    let bare = |u: &str| u.trim_start_matches("GPU-").replace('-', "").to_ascii_lowercase();
    let uuid_ok = torch_uuid == "unknown" || bare(torch_uuid) == bare(&g.info.uuid);
    c.ok(
        "workload1.sees_its_gpu",
        gpus.len() == 1 && seen("visible") == g.info.uuid && seen("count") == "1" && seen("name") == smi_name && uuid_ok,
        format!(
            "placed on GPU {gpus:?} ({}); the workload saw CUDA_VISIBLE_DEVICES={}, {} device(s), name {:?} (nvidia-smi {smi_name:?}), UUID {torch_uuid}",
            g.info.uuid,
            seen("visible"),
            seen("count"),
            seen("name")
        ),
    );

    // Telemetry: /metrics over the workload's loop, against nvidia-smi's samples.
    let metrics = metrics_readings(rec.get("metrics-samples.txt").unwrap_or(""), &g.info.uuid);
    let smi_s = smi_readings(rec.get("smi-samples.csv").unwrap_or(""), g.info.index);
    let begin = m
        .get("compute-begin")
        .and_then(|v| v.split_whitespace().next()?.parse::<i64>().ok());
    let end = step_at(&events1, "released").or(m
        .get("compute-end")
        .and_then(|v| v.split_whitespace().next()?.parse::<i64>().ok()));
    let baseline = gc.sample(g.info.index).map(|s| s.fb_used_mib as f64).unwrap_or(0.0);
    match (begin, end) {
        (Some(begin), Some(end)) => {
            let during: Vec<&Reading> = metrics.iter().filter(|r| (begin..=end).contains(&r.at_ms)).collect();
            let first = |f: &dyn Fn(&Reading) -> bool, from: i64| metrics.iter().find(|r| r.at_ms >= from && f(r));
            let peak =
                |rs: &[&Reading], f: fn(&Reading) -> Option<f64>| rs.iter().filter_map(|r| f(r)).fold(0.0, f64::max);
            let busy = first(&|r: &Reading| r.util.is_some_and(|u| u > BUSY_PCT), begin);
            c.ok(
                "telemetry.utilisation_high",
                busy.is_some_and(|r| r.at_ms - begin <= window),
                match busy {
                    Some(r) => format!(
                        "/metrics showed {} % {} ms after the loop began (allowed: one {} ms interval + {} ms sampling); peak {} %",
                        r.util.unwrap_or(0.0),
                        r.at_ms - begin,
                        window - SAMPLING_SLACK_MS,
                        SAMPLING_SLACK_MS,
                        peak(&during, |r| r.util)
                    ),
                    None => format!(
                        "/metrics never showed more than {BUSY_PCT} % while the loop ran ({} readings, peak {} %)",
                        during.len(),
                        peak(&during, |r| r.util)
                    ),
                },
            );
            let need = baseline + WORKLOAD_MIB;
            let mem = metrics
                .iter()
                .find(|r| (begin - window..=end).contains(&r.at_ms) && r.fb_used.is_some_and(|f| f >= need));
            c.ok(
                "telemetry.memory_in_use",
                mem.is_some_and(|r| r.at_ms - begin <= window),
                match mem {
                    Some(r) => format!(
                        "/metrics showed {} MiB in use {} ms after the loop began (idle {baseline} MiB, at least {need} expected)",
                        r.fb_used.unwrap_or(0.0),
                        r.at_ms - begin
                    ),
                    None => format!(
                        "/metrics never showed {need} MiB in use while the loop ran (peak {} MiB)",
                        peak(&during, |r| r.fb_used)
                    ),
                },
            );
            let smi_during: Vec<&Reading> = smi_s.iter().filter(|r| (begin..=end).contains(&r.at_ms)).collect();
            let (tu, su) = (peak(&during, |r| r.util), peak(&smi_during, |r| r.util));
            let (tf, sf) = (peak(&during, |r| r.fb_used), peak(&smi_during, |r| r.fb_used));
            c.ok(
                "telemetry.matches_nvidia_smi",
                !smi_during.is_empty() && tu > BUSY_PCT && su > BUSY_PCT && (tf - sf).abs() <= sf * 0.1,
                format!(
                    "peaks while the loop ran: utilisation {tu} % (Tessera) / {su} % (nvidia-smi), memory {tf} / {sf} MiB ({} / {} readings)",
                    during.len(),
                    smi_during.len()
                ),
            );
            let idle = first(
                &|r: &Reading| {
                    r.util.is_some_and(|u| u < IDLE_PCT) && r.fb_used.is_some_and(|f| f <= baseline + FREE_SLACK_MIB)
                },
                end,
            );
            c.ok(
                "telemetry.falls_back",
                idle.is_some_and(|r| r.at_ms - end <= window),
                match idle {
                    Some(r) => format!(
                        "/metrics showed {} % and {} MiB {} ms after the workload ended",
                        r.util.unwrap_or(0.0),
                        r.fb_used.unwrap_or(0.0),
                        r.at_ms - end
                    ),
                    None => "/metrics did not show the GPU idle again after the workload ended".into(),
                },
            );
        }
        _ => {
            for check in [
                "telemetry.utilisation_high",
                "telemetry.memory_in_use",
                "telemetry.matches_nvidia_smi",
                "telemetry.falls_back",
            ] {
                c.fail(
                    check,
                    "the workload did not print compute-begin, or did not end (see w1.log)",
                );
            }
        }
    }
    let observed = events1.iter().find(|e| e["step"] == "observed");
    c.ok(
        "describe.observed",
        observed.is_some_and(|e| e["detail"].as_str().unwrap_or("").contains("GPU")),
        match observed {
            // The step records the first sample, taken when the process starts (before the loop).
            Some(e) => format!(
                "observed (first sample, at start): {}",
                e["detail"].as_str().unwrap_or("")
            ),
            None => "no observed step in the timeline".into(),
        },
    );

    // Metering.
    let id1 = w1["workload"]["id"].as_u64().unwrap_or(0);
    let held_ms = match (step_at(&events1, "running"), step_at(&events1, "released")) {
        (Some(a), Some(b)) => Some(b - a),
        _ => None,
    };
    let intervals = rec.json("usage-intervals.json");
    let iv = intervals.as_ref().and_then(|v| {
        v["intervals"]
            .as_array()?
            .iter()
            .find(|i| i["workload"].as_u64() == Some(id1))
            .cloned()
    });
    match iv {
        Some(i) => {
            let secs = |k: &str| {
                i[k].as_str()
                    .and_then(|s| s.parse::<jiff::Timestamp>().ok())
                    .map(|t| t.as_millisecond())
            };
            let metered = match (secs("started_at"), secs("ended_at")) {
                (Some(a), Some(b)) => Some(b - a),
                _ => None,
            };
            let close = match (metered, held_ms) {
                (Some(a), Some(b)) => (a - b).abs() <= 3000,
                _ => false,
            };
            c.ok(
                "metering.interval",
                close && i["units"].as_f64() == Some(1.0) && i["gpu"] == "whole:1",
                format!(
                    "ledger: {} of {} for {} GPU unit(s), {} ms (the timeline held it {} ms)",
                    i["gpu"].as_str().unwrap_or("?"),
                    i["model"].as_str().unwrap_or("?"),
                    i["units"],
                    metered.map(|m| m.to_string()).unwrap_or("open".into()),
                    held_ms.map(|m| m.to_string()).unwrap_or("?".into())
                ),
            );
        }
        None => c.fail(
            "metering.interval",
            format!("no usage interval of workload {id1} in usage-intervals.json"),
        ),
    }
    let rows = rec.json("usage-projects.json");
    let row = rows.as_ref().and_then(|v| {
        v["rows"]
            .as_array()?
            .iter()
            .find(|r| r["key"] == "devcheck/ml")
            .cloned()
    });
    match row {
        Some(r) => {
            let (a, m) = (
                r["allocated_unit_hours"].as_f64().unwrap_or(0.0),
                r["measured_unit_hours"].as_f64().unwrap_or(0.0),
            );
            c.ok(
                "metering.measured",
                a > 0.0 && m > 0.0 && m <= a + 1e-9,
                format!("devcheck/ml: {a:.5} GPU-unit-hours allocated, {m:.5} measured (utilisation × time)"),
            );
        }
        None => c.fail("metering.measured", "no devcheck/ml row in usage-projects.json"),
    }
    let pool_used = rec.json("pools-after-w1.json").and_then(|p| {
        p.as_array()?
            .iter()
            .find(|p| p["name"] == "local")
            .and_then(|p| p["units_used"].as_str().map(str::to_string))
    });
    c.ok(
        "release.workload1",
        step_at(&events1, "released").is_some() && pool_used.as_deref().is_some_and(|u| u.parse::<f64>() == Ok(0.0)),
        format!(
            "released step {}; pool local uses {} GPU units afterwards",
            if step_at(&events1, "released").is_some() {
                "recorded"
            } else {
                "missing"
            },
            pool_used.unwrap_or("?".into())
        ),
    );

    // Workload 2: cancelled.
    let w2 = rec.json("w2.json").unwrap_or(Value::Null);
    let m2 = markers(rec.get("w2.log").unwrap_or(""));
    let sent = at("w2.cancel_sent");
    let term = m2.get("got-sigterm").and_then(|v| v.parse::<i64>().ok());
    let gone = at("w2.group_gone");
    let state2 = w2["workload"]["state"].as_str().unwrap_or("?");
    let events2 = w2["events"].as_array().cloned().unwrap_or_default();
    match (sent, term, gone) {
        (Some(s), Some(t), Some(g)) => {
            let (to_term, to_gone) = (t - s, g - s);
            c.ok(
                "cancel.sigterm_then_sigkill",
                (0..grace_ms).contains(&to_term)
                    && (grace_ms - 200..=grace_ms + 5000).contains(&to_gone)
                    && state2 == "cancelled"
                    && step_at(&events2, "released").is_some(),
                format!(
                    "SIGTERM reached it {to_term} ms after the cancel (it ignores SIGTERM); its process group was gone {to_gone} ms after (grace {grace_ms} ms); state {state2}"
                ),
            );
        }
        _ => c.fail(
            "cancel.sigterm_then_sigkill",
            format!(
                "cancel sent: {}, SIGTERM seen by the workload: {}, process group gone: {}; state {state2}",
                sent.is_some(),
                term.is_some(),
                gone.is_some()
            ),
        ),
    }
    let after = gc_after
        .and_then(|a| a.sample(g.info.index))
        .map(|s| s.fb_used_mib as f64);
    let apps = rec.get("smi-apps-after.csv").map(smi_csv).unwrap_or_default();
    c.ok(
        "cancel.gpu_memory_free",
        after.is_some_and(|f| f <= baseline + FREE_SLACK_MIB) && apps.is_empty(),
        format!(
            "NVML (gpu-check) after: {} MiB used (idle before: {baseline} MiB); nvidia-smi lists {} compute process(es)",
            after.map(|f| f.to_string()).unwrap_or("?".into()),
            apps.len()
        ),
    );
}

fn finish(rec: &Recorded, c: Checks) -> Report {
    let n = |s: Status| c.0.iter().filter(|x| x.status == s).count();
    let (passed, failed, skipped) = (n(Status::Pass), n(Status::Fail), n(Status::Skip));
    let ev = rec.get("events.tsv").map(events).unwrap_or_default();
    Report {
        report: "tessera device check (scripts/device-check.sh)",
        result: if failed == 0 && passed > 0 { "pass" } else { "fail" },
        passed,
        failed,
        skipped,
        tessera: rec.get("tessera-version.txt").unwrap_or("").trim().to_string(),
        host: ev
            .iter()
            .find(|e| e.1 == "check.start")
            .map(|e| e.2.clone())
            .unwrap_or_default(),
        checks: c.0,
        recordings: rec.files.keys().cloned().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run recorded as an H200 (141 GB, driver 580) shows it, MIG off.
    fn h200() -> Recorded {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/device-check/h200");
        Recorded::read(&dir).unwrap()
    }

    fn status(r: &Report, name: &str) -> Status {
        r.checks
            .iter()
            .find(|c| c.check == name)
            .unwrap_or_else(|| panic!("no check {name} in {:#?}", r.checks))
            .status
    }

    fn failed(r: &Report) -> Vec<String> {
        r.checks
            .iter()
            .filter(|c| c.status == Status::Fail)
            .map(|c| format!("{}: {}", c.check, c.detail))
            .collect()
    }

    #[test]
    fn nvidia_smi_csv_is_read_by_field_name() {
        let rows = smi_csv(
            "index, name, memory.total [MiB], power.draw [W], mig.mode.current, clocks.applications.graphics [MHz]\n\
             0, NVIDIA H200, 143771 MiB, 76.54 W, Disabled, [N/A]\n",
        );
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0]["name"], "NVIDIA H200");
        assert_eq!(num(&rows[0], "memory.total"), Some(143771.0));
        assert_eq!(num(&rows[0], "power.draw"), Some(76.54));
        assert!(!rows[0].contains_key("clocks.applications.graphics"));
        assert_eq!(smi_device_id("0x233510DE"), Some(0x2335));
        assert_eq!(bus_id("0000:19:00.0"), bus_id("00000000:19:00.0"));
    }

    #[test]
    fn mig_listings_are_parsed() {
        let lgi = "+-------------------------------------------------------+\n\
| GPU instances:                                        |\n\
| GPU   Name             Profile  Instance   Placement  |\n\
|                          ID       ID       Start:Size |\n\
|=======================================================|\n\
|   0  MIG 3g.71gb          9        2          4:4     |\n\
+-------------------------------------------------------+\n\
|   0  MIG 1g.18gb         19        9          2:1     |\n\
+-------------------------------------------------------+\n";
        let rows = smi_mig_table(lgi);
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].gi, rows[0].profile, rows[0].start, rows[0].size), (2, 9, 4, 4));
        let lci = "| GPU     GPU       Name             Profile   Instance   Placement  |\n\
|       Instance                       ID        ID       Start:Size |\n\
|   0      2       MIG 3g.71gb          2         0          0:3     |\n";
        let rows = smi_mig_table(lci);
        assert_eq!((rows[0].gi, rows[0].profile, rows[0].ci), (2, 2, Some(0)));
        assert!(smi_mig_table("No MIG-enabled devices found.\n").is_empty());
        let pp = smi_lgipp(
            "GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1\nGPU  0 Profile ID  9 Placements: {0,4}:4\nGPU  0 Profile ID  0 Placement : {0}:8\n",
        );
        assert_eq!(pp[&(0, 19)], (vec![0, 1, 2, 3, 4, 5, 6], 1));
        assert_eq!(pp[&(0, 0)], (vec![0], 8));
        let l = smi_list(
            "GPU 0: NVIDIA H200 (UUID: GPU-aa)\n  MIG 3g.71gb     Device  0: (UUID: MIG-bb)\nGPU 1: NVIDIA H200 (UUID: GPU-cc)\n",
        );
        assert_eq!(l[&0], ("NVIDIA H200".into(), "GPU-aa".into(), vec!["MIG-bb".into()]));
        assert_eq!(l[&1].2.len(), 0);
    }

    #[test]
    fn a_recorded_h200_run_passes_every_check() {
        let r = build(&h200());
        assert!(failed(&r).is_empty(), "{:#?}", failed(&r));
        assert_eq!(r.result, "pass");
        for name in [
            "gpu0.uuid",
            "gpu0.pci_device_id",
            "gpu0.catalogue_model",
            "gpu0.nvlink",
            "gpu0.telemetry",
            "telemetry.utilisation_high",
            "telemetry.falls_back",
            "metering.interval",
            "cancel.sigterm_then_sigkill",
            "cancel.gpu_memory_free",
        ] {
            assert_eq!(status(&r, name), Status::Pass, "{name}");
        }
        // MIG off: lgipp is not listed, so the placement table is not compared.
        assert_eq!(status(&r, "gpu0.mig_placements"), Status::Skip);
        let model = r.checks.iter().find(|c| c.check == "gpu0.catalogue_model").unwrap();
        assert!(model.detail.contains("NVIDIA H200 → H200-141GB"), "{}", model.detail);
    }

    #[test]
    fn disagreements_fail_the_check_that_compares_them() {
        let mut rec = h200();
        let csv = rec.files["smi-gpu.csv"].replace("0x233510DE", "0x233B10DE");
        rec.files.insert("smi-gpu.csv".into(), csv);
        let nvlink = rec.files["smi-nvlink.txt"].replace("26.562 GB/s", "<inactive>");
        rec.files.insert("smi-nvlink.txt".into(), nvlink);
        let r = build(&rec);
        assert_eq!(status(&r, "gpu0.pci_device_id"), Status::Fail);
        assert_eq!(status(&r, "gpu0.nvlink"), Status::Fail);
        assert_eq!(status(&r, "gpu0.uuid"), Status::Pass);
        assert_eq!(r.result, "fail");

        // Telemetry that stays low, and memory that is never given back.
        let mut rec = h200();
        let low: String = rec.files["metrics-samples.txt"]
            .lines()
            .map(|l| {
                if l.starts_with("DCGM_FI_DEV_GPU_UTIL{") {
                    let (head, _) = l.rsplit_once(' ').unwrap();
                    format!("{head} 35\n")
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        rec.files.insert("metrics-samples.txt".into(), low);
        let after = rec.files["gpu-check-after.json"].replace("\"fb_used_mib\": 0", "\"fb_used_mib\": 3790");
        rec.files.insert("gpu-check-after.json".into(), after);
        let r = build(&rec);
        assert_eq!(status(&r, "telemetry.utilisation_high"), Status::Fail);
        assert_eq!(status(&r, "telemetry.matches_nvidia_smi"), Status::Fail);
        assert_eq!(status(&r, "cancel.gpu_memory_free"), Status::Fail);
        assert_eq!(status(&r, "telemetry.memory_in_use"), Status::Pass);

        // A SIGKILL that came before the grace period ended.
        let mut rec = h200();
        let ev = events(&rec.files["events.tsv"]);
        let sent = ev.iter().find(|e| e.1 == "w2.cancel_sent").unwrap().0;
        let text: String = ev
            .iter()
            .map(|(at, k, v)| {
                let at = if k == "w2.group_gone" { sent + 1200 } else { *at };
                format!("{at}\t{k}\t{v}\n")
            })
            .collect();
        rec.files.insert("events.tsv".into(), text);
        assert_eq!(status(&build(&rec), "cancel.sigterm_then_sigkill"), Status::Fail);
    }

    #[test]
    fn without_torch_the_workload_checks_say_why() {
        let mut rec = h200();
        for f in ["w1.json", "w1.log", "w2.json", "w2.log", "metrics-samples.txt"] {
            rec.files.remove(f);
        }
        let ev: String = rec.files["events.tsv"]
            .lines()
            .filter(|l| !l.contains("\tw1.") && !l.contains("\tw2."))
            .map(|l| format!("{}\n", l.replace("torch\tok", "torch\tmissing")))
            .chain(std::iter::once("1764684010000\tworkloads.skipped\ttorch\n".to_string()))
            .collect();
        rec.files.insert("events.tsv".into(), ev);
        rec.files.insert(
            "torch.txt".into(),
            "Traceback (most recent call last):\nModuleNotFoundError: No module named 'torch'\n".into(),
        );
        let r = build(&rec);
        let torch = r.checks.iter().find(|c| c.check == "torch").unwrap();
        assert_eq!(torch.status, Status::Fail);
        assert!(torch.detail.contains("No module named 'torch'"), "{}", torch.detail);
        assert_eq!(status(&r, "workload1.ran"), Status::Skip);
        assert_eq!(status(&r, "gpu0.uuid"), Status::Pass, "discovery is still checked");
        assert_eq!(r.result, "fail");
    }

    #[test]
    fn a_gpu_in_mig_mode_is_compared_instance_by_instance() {
        let mut rec = h200();
        let uuid = "GPU-5f1a7c3e-2b9d-4e81-a6c4-0d3e9b7f2a18";
        let mig = "MIG-0b7e4d21-9c3f-5a6e-8f12-4d5c6b7a8e90";
        for f in ["smi-gpu.csv", "smi-gpu-after.csv"] {
            let t = rec.files[f].replace("Disabled, Disabled", "Enabled, Enabled");
            rec.files.insert(f.into(), t);
        }
        let instances = format!(
            "\"mig_enabled\": true,\n        \"mig_pending\": null,\n        \"model\": \"H200-141GB\",\n        \"served_as\": \"mig\",\n        \"note\": null,\n        \"instances\": [{{\"id\": 2, \"profile_id\": 9, \"start\": 4, \"size\": 4, \"uuid\": \"{mig}\"}}],"
        );
        for f in ["gpu-check.json", "gpu-check-after.json"] {
            let t = rec.files[f]
                .replace(
                    "\"mig_enabled\": false,\n        \"mig_pending\": null,\n        \"model\": \"H200-141GB\",\n        \"served_as\": \"whole\",\n        \"note\": null,\n        \"instances\": [],",
                    &instances,
                )
                .replace("\"util_pct\": 0.0", "\"util_pct\": null");
            assert!(t.contains(mig), "fixture layout changed: {f}");
            rec.files.insert(f.into(), t);
        }
        let lgi = "|   0  MIG 3g.71gb          9        2          4:4     |\n";
        rec.files.insert("smi-mig-lgi.txt".into(), lgi.into());
        rec.files.insert("smi-mig-lgi-after.txt".into(), lgi.into());
        rec.files.insert(
            "smi-mig-lci.txt".into(),
            "|   0      2       MIG 3g.71gb          2         0          0:3     |\n".into(),
        );
        rec.files.insert(
            "smi-L.txt".into(),
            format!("GPU 0: NVIDIA H200 (UUID: {uuid})\n  MIG 3g.71gb     Device  0: (UUID: {mig})\n"),
        );
        rec.files.insert(
            "smi-mig-lgipp.txt".into(),
            "GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1\n\
             GPU  0 Profile ID 20 Placements: {0,1,2,3,4,5,6}:1\n\
             GPU  0 Profile ID 15 Placements: {0,2,4,6}:2\n\
             GPU  0 Profile ID 14 Placements: {0,2,4}:2\n\
             GPU  0 Profile ID  9 Placements: {0,4}:4\n\
             GPU  0 Profile ID  5 Placement : {0}:4\n\
             GPU  0 Profile ID  0 Placement : {0}:8\n"
                .into(),
        );
        let ev: String = rec.files["events.tsv"]
            .lines()
            .filter(|l| !l.contains("\tw1.") && !l.contains("\tw2."))
            .map(|l| format!("{}\n", l.replace("mig\tno", "mig\tyes")))
            .chain(std::iter::once("1764684010000\tworkloads.skipped\tmig\n".to_string()))
            .collect();
        rec.files.insert("events.tsv".into(), ev);
        rec.files.insert(
            "pools-before.json".into(),
            r#"[{"name": "local", "sharing": "mig", "gpus": 1, "units_used": "0"}]"#.into(),
        );
        rec.files.insert(
            "gpus-serve.json".into(),
            r#"[{"node": "devcheck", "index": 0, "pool": "local", "sharing": "mig", "mig_slices": "....####", "slices": []}]"#.into(),
        );
        let r = build(&rec);
        assert!(failed(&r).is_empty(), "{:#?}", failed(&r));
        for name in [
            "gpu0.gpu_instances",
            "gpu0.compute_instances",
            "gpu0.uuids",
            "gpu0.mig_placements",
            "mig.instances_kept",
            "mig.adopted_shown",
        ] {
            assert_eq!(status(&r, name), Status::Pass, "{name}");
        }
        assert_eq!(status(&r, "workload1.ran"), Status::Skip);

        // An instance nvidia-smi does not show, one gone afterwards, and a placement table that
        // differs from the catalogue's all fail.
        let mut bad = rec.clone();
        bad.files.insert("smi-mig-lgi.txt".into(), String::new());
        let pp = bad.files["smi-mig-lgipp.txt"].replace("{0,4}:4", "{0,2,4}:4");
        bad.files.insert("smi-mig-lgipp.txt".into(), pp);
        let r = build(&bad);
        assert_eq!(status(&r, "gpu0.gpu_instances"), Status::Fail);
        assert_eq!(status(&r, "gpu0.mig_placements"), Status::Fail);
        assert_eq!(status(&r, "mig.instances_kept"), Status::Fail);
    }

    #[test]
    fn the_script_says_so_in_one_line_without_a_gpu() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let dir = std::env::temp_dir().join(format!("devcheck-nogpu-{}", std::process::id()));
        let out = std::process::Command::new("bash")
            .arg(root.join("scripts/device-check.sh"))
            .arg(&dir)
            .env("DEVICE_CHECK_NVIDIA_SMI", "/nonexistent/nvidia-smi")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains("no NVIDIA GPU"), "{err}");
        assert!(out.stdout.is_empty() && !dir.exists(), "nothing written");
    }

    #[test]
    fn missing_recordings_fail_with_a_pointer_to_the_log() {
        let r = build(&Recorded::default());
        assert_eq!(r.result, "fail");
        assert!(
            r.checks.iter().any(|c| c.detail.contains("device-check.log")),
            "{:#?}",
            r.checks
        );
    }
}
