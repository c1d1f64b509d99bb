//! Telemetry from the GPU Operator's DCGM exporter: its Prometheus text (format 0.0.4) read into
//! Tessera's [`GpuSample`]s, one per GPU of the exporter's node.
//!
//! The exporter labels every series with the GPU (`gpu` index, `UUID` or `uuid`, `modelName`);
//! series of a MIG instance add `GPU_I_ID` and `GPU_I_PROFILE` (the parent GPU's `gpu` and
//! `UUID`); with its Kubernetes mapping (on in the GPU Operator) a series of a GPU or instance
//! that a pod holds adds `pod` and `namespace` (`pod_name`, `pod_namespace` in the old
//! namespace). Fields read:
//!
//! | field | sample |
//! |---|---|
//! | `DCGM_FI_DEV_GPU_UTIL` (%; not defined for MIG instances) | `util_pct` |
//! | `DCGM_FI_PROF_GR_ENGINE_ACTIVE` (0..1; per GPU and per MIG instance) | an instance's `gr_engine_active`; the GPU's `util_pct` when `GPU_UTIL` is absent |
//! | `DCGM_FI_DEV_FB_USED`, `DCGM_FI_DEV_FB_FREE` (MiB; per GPU and per MIG instance) | `fb_used_mib`, `fb_free_mib` |
//! | `DCGM_FI_DEV_GPU_TEMP` (°C), `DCGM_FI_DEV_POWER_USAGE` (W) | `temp_c`, `power_w` |
//! | `DCGM_FI_DEV_XID_ERRORS` (the last XID) | `xid` |
//!
//! A GPU or instance a pod of Tessera's holds carries that workload in
//! [`InstanceSample::workload`]: the device plugin, not Tessera, picks which GPU of a node a
//! pod gets, so usage is attributed by the exporter's pod mapping, not by GPU index. A whole
//! GPU held by a pod is an instance with an empty profile and instance id 0; a time-sliced GPU
//! is one such instance per pod, each with the GPU's figures (DCGM does not split a
//! time-sliced GPU between its pods).

use std::collections::BTreeMap;

use tessera_backend::{GpuSample, InstanceSample};

/// One series of an exposition: name, labels, value.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Series {
    fn label(&self, names: &[&str]) -> Option<&str> {
        names.iter().find_map(|n| self.labels.get(*n)).map(String::as_str)
    }
}

/// The exporter's fields [`samples`] reads (an exporter serves about 30 by default).
pub const FIELDS: [&str; 7] = [
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_XID_ERRORS",
];

/// The series of a Prometheus text exposition whose metric name `keep` accepts (comments,
/// blank lines and other series skipped unread). A kept line that is not a series is an error
/// naming its number.
pub fn parse_exposition(text: &str, keep: impl Fn(&str) -> bool) -> Result<Vec<Series>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name = line.split(['{', ' ', '\t']).next().unwrap_or_default();
        if !keep(name) {
            continue;
        }
        out.push(parse_line(line).map_err(|e| format!("line {}: {e}: {line}", i + 1))?);
    }
    Ok(out)
}

/// Whether [`samples`] reads the field `name`.
pub fn is_read(name: &str) -> bool {
    FIELDS.contains(&name)
}

fn parse_line(line: &str) -> Result<Series, &'static str> {
    let name_end = line.find(['{', ' ', '\t']).ok_or("no value")?;
    let name = &line[..name_end];
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
        return Err("not a metric name");
    }
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices().peekable();
        let close = loop {
            // A label: name="value", then `,` or `}`.
            while chars.peek().is_some_and(|(_, c)| *c == ',' || c.is_whitespace()) {
                chars.next();
            }
            let Some(&(start, c)) = chars.peek() else {
                return Err("labels not closed");
            };
            if c == '}' {
                break start;
            }
            let mut eq = None;
            for (j, c) in chars.by_ref() {
                if c == '=' {
                    eq = Some(j);
                    break;
                }
            }
            let eq = eq.ok_or("a label without a value")?;
            let key = body[start..eq].trim();
            if chars.next().map(|(_, c)| c) != Some('"') {
                return Err("a label value not in quotes");
            }
            let mut value = String::new();
            loop {
                match chars.next().map(|(_, c)| c) {
                    None => return Err("a label value not closed"),
                    Some('"') => break,
                    Some('\\') => match chars.next().map(|(_, c)| c) {
                        Some('n') => value.push('\n'),
                        Some(c @ ('\\' | '"')) => value.push(c),
                        _ => return Err("a bad escape in a label value"),
                    },
                    Some(c) => value.push(c),
                }
            }
            labels.insert(key.to_string(), value);
        };
        rest = &body[close + 1..];
    }
    let mut fields = rest.split_whitespace();
    let value = fields.next().ok_or("no value")?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().map_err(|_| "a value that is not a number")?,
    };
    // An optional timestamp, then nothing.
    if fields.next().is_some_and(|t| t.parse::<i64>().is_err()) || fields.next().is_some() {
        return Err("more than a value and a timestamp");
    }
    Ok(Series {
        name: name.to_string(),
        labels,
        value,
    })
}

#[derive(Default)]
struct Gpu {
    uuid: String,
    model: String,
    util_pct: Option<f64>,
    gr_engine_active: Option<f64>,
    fb_used_mib: Option<u64>,
    fb_free_mib: Option<u64>,
    temp_c: f64,
    power_w: f64,
    xid: u32,
    /// Workloads holding the whole GPU (one, or several on a time-sliced GPU).
    holders: Vec<u64>,
    /// MIG instances by `GPU_I_ID`.
    instances: BTreeMap<u32, InstanceSample>,
}

/// The GPUs of node `node` as its exporter's `series` describe them, by GPU index.
/// `workload_of(namespace, pod)` names the workload of a pod of Tessera's (`None` for any other
/// pod).
pub fn samples(node: &str, series: &[Series], workload_of: impl Fn(&str, &str) -> Option<u64>) -> Vec<GpuSample> {
    let mut gpus: BTreeMap<u8, Gpu> = BTreeMap::new();
    for s in series {
        let Some(index) = s.label(&["gpu"]).and_then(|g| g.parse::<u8>().ok()) else {
            continue;
        };
        let g = gpus.entry(index).or_default();
        if g.uuid.is_empty() {
            g.uuid = s.label(&["UUID", "uuid"]).unwrap_or_default().to_string();
            g.model = s.label(&["modelName"]).unwrap_or_default().to_string();
        }
        let workload = match (s.label(&["namespace", "pod_namespace"]), s.label(&["pod", "pod_name"])) {
            (Some(ns), Some(pod)) => workload_of(ns, pod),
            _ => None,
        };
        let mib = || s.value.max(0.0).round() as u64;
        match s.name.as_str() {
            // Properties of the physical GPU, the same on every series of it.
            "DCGM_FI_DEV_GPU_TEMP" => g.temp_c = s.value,
            "DCGM_FI_DEV_POWER_USAGE" => g.power_w = s.value,
            "DCGM_FI_DEV_XID_ERRORS" => g.xid = g.xid.max(s.value.max(0.0) as u32),
            _ => {}
        }
        if let Some(id) = s.label(&["GPU_I_ID"]).and_then(|i| i.parse::<u32>().ok()) {
            let inst = g.instances.entry(id).or_insert_with(|| InstanceSample {
                workload: 0,
                profile: s.label(&["GPU_I_PROFILE"]).unwrap_or_default().to_string(),
                instance_id: id,
                gr_engine_active: 0.0,
                fb_used_mib: 0,
                fb_free_mib: 0,
            });
            if let Some(w) = workload {
                inst.workload = w;
            }
            match s.name.as_str() {
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE" => inst.gr_engine_active = s.value.clamp(0.0, 1.0),
                "DCGM_FI_DEV_FB_USED" => inst.fb_used_mib = mib(),
                "DCGM_FI_DEV_FB_FREE" => inst.fb_free_mib = mib(),
                _ => {}
            }
            continue;
        }
        if let Some(w) = workload
            && !g.holders.contains(&w)
        {
            g.holders.push(w);
        }
        match s.name.as_str() {
            "DCGM_FI_DEV_GPU_UTIL" => g.util_pct = Some(s.value.clamp(0.0, 100.0)),
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE" => g.gr_engine_active = Some(s.value.clamp(0.0, 1.0)),
            "DCGM_FI_DEV_FB_USED" => g.fb_used_mib = Some(mib()),
            "DCGM_FI_DEV_FB_FREE" => g.fb_free_mib = Some(mib()),
            _ => {}
        }
    }
    gpus.into_iter()
        .map(|(index, g)| {
            let util_pct = g.util_pct.or(g.gr_engine_active.map(|a| a * 100.0)).unwrap_or(0.0);
            let fb_used_mib = g
                .fb_used_mib
                .unwrap_or_else(|| g.instances.values().map(|i| i.fb_used_mib).sum());
            let fb_free_mib = g
                .fb_free_mib
                .unwrap_or_else(|| g.instances.values().map(|i| i.fb_free_mib).sum());
            let whole = g.holders.iter().map(|&w| InstanceSample {
                workload: w,
                profile: String::new(),
                instance_id: 0,
                gr_engine_active: g.gr_engine_active.unwrap_or(util_pct / 100.0),
                fb_used_mib,
                fb_free_mib,
            });
            let instances = g.instances.into_values().chain(whole).collect();
            GpuSample {
                node: node.to_string(),
                gpu: index,
                uuid: g.uuid,
                model: g.model,
                util_pct,
                fb_used_mib,
                fb_free_mib,
                temp_c: g.temp_c,
                power_w: g.power_w,
                xid: g.xid,
                instances,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What an exporter of the GPU Operator serves for a node with a whole GPU held by a pod
    /// (gpu 0), a GPU split into two MIG instances, one held (gpu 1), and an idle GPU (gpu 2)
    /// with its last XID; abridged to the fields read, with the labels as the exporter writes
    /// them.
    const EXPOSITION: &str = r#"# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-aaa",pci_bus_id="00000000:07:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="h100-0",DCGM_FI_DRIVER_VERSION="570.124.06",container="train",namespace="tessera-acme-main",pod="tessera-17"} 61
DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-bbb",pci_bus_id="00000000:0F:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="3g.40gb",GPU_I_ID="1",Hostname="h100-0",DCGM_FI_DRIVER_VERSION="570.124.06",container="serve",namespace="tessera-acme-main",pod="tessera-18"} 44
DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-bbb",pci_bus_id="00000000:0F:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="1g.10gb",GPU_I_ID="9",Hostname="h100-0",DCGM_FI_DRIVER_VERSION="570.124.06"} 44
DCGM_FI_DEV_GPU_TEMP{gpu="2",UUID="GPU-ccc",pci_bus_id="00000000:47:00.0",device="nvidia2",modelName="NVIDIA H100 80GB HBM3",Hostname="h100-0",DCGM_FI_DRIVER_VERSION="570.124.06"} 33
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-aaa",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="h100-0",container="train",namespace="tessera-acme-main",pod="tessera-17"} 512.25
DCGM_FI_DEV_POWER_USAGE{gpu="2",UUID="GPU-ccc",device="nvidia2",modelName="NVIDIA H100 80GB HBM3",Hostname="h100-0"} 71.5
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-aaa",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="h100-0",container="train",namespace="tessera-acme-main",pod="tessera-17"} 87
DCGM_FI_DEV_GPU_UTIL{gpu="2",UUID="GPU-ccc",device="nvidia2",modelName="NVIDIA H100 80GB HBM3",Hostname="h100-0"} 0
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-aaa",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="h100-0",container="train",namespace="tessera-acme-main",pod="tessera-17"} 70000
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-bbb",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="3g.40gb",GPU_I_ID="1",Hostname="h100-0",container="serve",namespace="tessera-acme-main",pod="tessera-18"} 30000
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-bbb",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="1g.10gb",GPU_I_ID="9",Hostname="h100-0"} 0
DCGM_FI_DEV_FB_USED{gpu="2",UUID="GPU-ccc",device="nvidia2",modelName="NVIDIA H100 80GB HBM3",Hostname="h100-0"} 0
# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-aaa",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="h100-0",container="train",namespace="tessera-acme-main",pod="tessera-17"} 11559
DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-bbb",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="3g.40gb",GPU_I_ID="1",Hostname="h100-0",container="serve",namespace="tessera-acme-main",pod="tessera-18"} 10560
DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-bbb",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="1g.10gb",GPU_I_ID="9",Hostname="h100-0"} 9856
# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.
# TYPE DCGM_FI_DEV_XID_ERRORS gauge
DCGM_FI_DEV_XID_ERRORS{gpu="2",UUID="GPU-ccc",device="nvidia2",modelName="NVIDIA H100 80GB HBM3",Hostname="h100-0",err_code="79",err_msg="GPU has fallen off the bus"} 79
# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.
# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="1",UUID="GPU-bbb",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="3g.40gb",GPU_I_ID="1",Hostname="h100-0",container="serve",namespace="tessera-acme-main",pod="tessera-18"} 0.625
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="1",UUID="GPU-bbb",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="1g.10gb",GPU_I_ID="9",Hostname="h100-0"} 0
"#;

    fn ours(ns: &str, pod: &str) -> Option<u64> {
        (ns == "tessera-acme-main")
            .then(|| pod.strip_prefix("tessera-")?.parse().ok())
            .flatten()
    }

    #[test]
    fn an_exporters_text_becomes_one_sample_per_gpu_with_its_pods_workloads() {
        let series = parse_exposition(EXPOSITION, |_| true).unwrap();
        assert_eq!(series.len(), 18);
        let s = samples("h100-0", &series, ours);
        assert_eq!(s.len(), 3);
        let whole = |w: u64, active: f64, used: u64, free: u64| InstanceSample {
            workload: w,
            profile: String::new(),
            instance_id: 0,
            gr_engine_active: active,
            fb_used_mib: used,
            fb_free_mib: free,
        };
        assert_eq!(
            s[0],
            GpuSample {
                node: "h100-0".into(),
                gpu: 0,
                uuid: "GPU-aaa".into(),
                model: "NVIDIA H100 80GB HBM3".into(),
                util_pct: 87.0,
                fb_used_mib: 70000,
                fb_free_mib: 11559,
                temp_c: 61.0,
                power_w: 512.25,
                xid: 0,
                instances: vec![whole(17, 0.87, 70000, 11559)],
            }
        );
        // MIG: per instance, the held one with its workload; the GPU's memory is the sum.
        assert_eq!(s[1].gpu, 1);
        assert_eq!(s[1].util_pct, 0.0, "GPU_UTIL is not defined on MIG");
        assert_eq!((s[1].fb_used_mib, s[1].fb_free_mib), (30000, 20416));
        assert_eq!(s[1].temp_c, 44.0);
        assert_eq!(
            s[1].instances,
            vec![
                InstanceSample {
                    workload: 18,
                    profile: "3g.40gb".into(),
                    instance_id: 1,
                    gr_engine_active: 0.625,
                    fb_used_mib: 30000,
                    fb_free_mib: 10560,
                },
                InstanceSample {
                    workload: 0,
                    profile: "1g.10gb".into(),
                    instance_id: 9,
                    gr_engine_active: 0.0,
                    fb_used_mib: 0,
                    fb_free_mib: 9856,
                },
            ]
        );
        assert_eq!((s[2].gpu, s[2].xid, s[2].power_w), (2, 79, 71.5));
        assert!(s[2].instances.is_empty(), "no pod holds it");
    }

    #[test]
    fn a_time_sliced_gpu_gives_each_pod_the_gpus_figures_and_other_pods_are_not_workloads() {
        let text = r#"DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-x",modelName="NVIDIA L40S",namespace="tessera-acme-main",pod="tessera-5"} 40
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-x",modelName="NVIDIA L40S",namespace="tessera-acme-main",pod="tessera-6"} 40
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-y",modelName="NVIDIA L40S",namespace="kube-system",pod="tessera-7"} 90
DCGM_FI_DEV_GPU_UTIL{gpu="2",UUID="GPU-z",modelName="NVIDIA L40S",pod_namespace="tessera-acme-main",pod_name="tessera-8"} 10
"#;
        let s = samples("l40s-0", &parse_exposition(text, is_read).unwrap(), ours);
        let held: Vec<Vec<(u64, f64)>> = s
            .iter()
            .map(|g| g.instances.iter().map(|i| (i.workload, i.gr_engine_active)).collect())
            .collect();
        assert_eq!(held, vec![vec![(5, 0.4), (6, 0.4)], vec![], vec![(8, 0.1)]]);
    }

    #[test]
    fn the_text_format_is_read_exactly_and_bad_lines_are_named() {
        let s = parse_exposition(
            "# TYPE a gauge\n\na{x=\"q\\\"uote\\\\d\\n\", y=\"\"} -1.5e3 1700000000000\nb 7\nc{} +Inf\n",
            |_| true,
        )
        .unwrap();
        assert_eq!(s[0].name, "a");
        assert_eq!(s[0].labels["x"], "q\"uote\\d\n");
        assert_eq!(s[0].labels["y"], "");
        assert_eq!(s[0].value, -1500.0);
        assert_eq!((s[1].name.as_str(), s[1].value), ("b", 7.0));
        assert!(s[2].value.is_infinite() && s[2].labels.is_empty());
        for (bad, why) in [
            ("a{x=\"1} 1", "not closed"),
            ("a{x=1} 1", "not in quotes"),
            ("a{x} 1", "without a value"),
            ("a one", "not a number"),
            ("a 1 2 3", "more than"),
            ("a-b 1", "not a metric name"),
            ("a", "no value"),
        ] {
            let e = parse_exposition(&format!("ok 1\n{bad}\n"), |_| true).unwrap_err();
            assert!(e.starts_with("line 2: ") && e.contains(why), "{bad}: {e}");
        }
        // Fields not read are skipped unread.
        let s = parse_exposition(
            "DCGM_FI_DEV_SM_CLOCK{gpu=\"0\" 1410\nDCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} 5\n",
            is_read,
        )
        .unwrap();
        assert_eq!(
            (s.len(), s[0].name.as_str(), s[0].value),
            (1, "DCGM_FI_DEV_GPU_UTIL", 5.0)
        );
    }
}
