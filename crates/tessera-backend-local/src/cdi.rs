//! The Container Device Interface (CDI) specs the NVIDIA Container Toolkit writes
//! (`nvidia-ctk cdi generate` → `/etc/cdi/nvidia.yaml`, or `/var/run/cdi/*.json` from the GPU
//! Operator): for the devices of kind `nvidia.com/gpu`, what a container needs to use a GPU —
//! its device nodes, the driver's libraries and tools as mounts, hooks (`nvidia-ctk hook …`
//! updating the container's linker cache) and environment. [`Specs::edits`] gathers the edits of
//! the GPUs a workload was given, by UUID or else by index (the two naming strategies of
//! `nvidia-ctk`), plus those every device shares.

use std::fs;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The CDI kind of NVIDIA GPUs.
pub const GPU_KIND: &str = "nvidia.com/gpu";

#[derive(Clone, Debug, Default, Deserialize)]
struct Spec {
    kind: String,
    #[serde(default)]
    devices: Vec<Device>,
    #[serde(rename = "containerEdits", default)]
    edits: Edits,
}

#[derive(Clone, Debug, Deserialize)]
struct Device {
    name: String,
    #[serde(rename = "containerEdits", default)]
    edits: Edits,
}

/// What a CDI spec asks to change in a container.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct Edits {
    /// `KEY=VALUE`.
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(rename = "deviceNodes", default)]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default)]
    pub mounts: Vec<Mount>,
    #[serde(default)]
    pub hooks: Vec<Hook>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct DeviceNode {
    /// The path in the container.
    pub path: String,
    #[serde(rename = "hostPath", default)]
    pub host_path: Option<String>,
    /// `c` or `b`; read from the host's node when the spec leaves it out.
    #[serde(rename = "type", default = "char_kind")]
    pub kind: String,
    #[serde(default)]
    pub major: i64,
    #[serde(default)]
    pub minor: i64,
}

fn char_kind() -> String {
    "c".into()
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Mount {
    #[serde(rename = "hostPath")]
    pub host_path: String,
    #[serde(rename = "containerPath")]
    pub container_path: String,
    #[serde(default)]
    pub options: Vec<String>,
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Hook {
    /// The OCI hook point (`createContainer`, `startContainer`, …).
    #[serde(rename = "hookName")]
    pub hook_name: String,
    pub path: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: Vec<String>,
}

impl Edits {
    fn extend(&mut self, other: &Edits) {
        self.env.extend(other.env.iter().cloned());
        for d in &other.device_nodes {
            if !self.device_nodes.iter().any(|e| e.path == d.path) {
                self.device_nodes.push(d.clone());
            }
        }
        for m in &other.mounts {
            if !self.mounts.iter().any(|e| e.container_path == m.container_path) {
                self.mounts.push(m.clone());
            }
        }
        for h in &other.hooks {
            if !self.hooks.contains(h) {
                self.hooks.push(h.clone());
            }
        }
    }
}

/// The GPU specs found.
#[derive(Clone, Debug, Default)]
pub struct Specs {
    specs: Vec<(PathBuf, Spec)>,
}

impl Specs {
    /// Every `*.json`, `*.yaml` and `*.yml` spec of kind `nvidia.com/gpu` in `dirs` (later
    /// directories win for a device named twice, as in CDI). A spec that does not parse is
    /// skipped with a warning.
    pub fn load(dirs: &[PathBuf]) -> Specs {
        let mut specs = Vec::new();
        for dir in dirs {
            let mut files: Vec<PathBuf> = fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.extension()
                        .and_then(|e| e.to_str())
                        .is_some_and(|e| matches!(e, "json" | "yaml" | "yml"))
                })
                .collect();
            files.sort();
            for path in files {
                let Ok(text) = fs::read_to_string(&path) else { continue };
                let parsed: Result<Spec, String> = if path.extension().is_some_and(|e| e == "json") {
                    serde_json::from_str(&text).map_err(|e| e.to_string())
                } else {
                    serde_yaml_ng::from_str(&text).map_err(|e| e.to_string())
                };
                match parsed {
                    Ok(s) if s.kind == GPU_KIND => specs.push((path, s)),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(spec = %path.display(), error = %e, "CDI spec skipped"),
                }
            }
        }
        Specs { specs }
    }

    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    /// Where the specs came from.
    pub fn files(&self) -> Vec<&Path> {
        self.specs.iter().map(|(p, _)| p.as_path()).collect()
    }

    /// The edits for the devices `wanted` (each a list of names to try in order: UUID, then
    /// index), with the edits every device shares; device nodes without a type or numbers get
    /// them from the host's node.
    pub fn edits(&self, wanted: &[Vec<String>]) -> Result<Edits, String> {
        let mut out = Edits::default();
        for (_, s) in &self.specs {
            out.extend(&s.edits);
        }
        for names in wanted {
            let found = names.iter().find_map(|n| {
                self.specs
                    .iter()
                    .rev()
                    .find_map(|(_, s)| s.devices.iter().find(|d| d.name == *n))
            });
            match found {
                Some(d) => out.extend(&d.edits),
                None => {
                    return Err(format!(
                        "no CDI device {GPU_KIND}={} in {} (regenerate the spec with `nvidia-ctk cdi generate`)",
                        names.join(" or "),
                        self.files()
                            .iter()
                            .map(|p| p.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
            }
        }
        for d in &mut out.device_nodes {
            if d.major == 0 && d.minor == 0 {
                let host = d.host_path.clone().unwrap_or_else(|| d.path.clone());
                if let Some((maj, min)) = crate::isolation::char_dev(Path::new(&host)) {
                    d.major = maj as i64;
                    d.minor = min as i64;
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_toolkit_spec_gives_the_edits_of_the_gpus_asked_for() {
        let dir = std::env::temp_dir().join(format!("tessera-cdi-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        // The shape `nvidia-ctk cdi generate` writes (abridged).
        fs::write(
            dir.join("nvidia.yaml"),
            r#"---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
      major: 195
      minor: 0
- name: GPU-aaaa
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
      major: 195
      minor: 0
- name: "1"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia1
      major: 195
      minor: 1
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidiactl
    major: 195
    minor: 255
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-ctk
    args: [nvidia-ctk, hook, update-ldcache, --folder, /usr/lib/x86_64-linux-gnu]
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    options: [ro, nosuid, nodev, bind]
"#,
        )
        .unwrap();
        fs::write(
            dir.join("other.json"),
            r#"{"cdiVersion":"0.5.0","kind":"vendor.com/fpga","devices":[]}"#,
        )
        .unwrap();
        let specs = Specs::load(std::slice::from_ref(&dir));
        assert_eq!(specs.files().len(), 1, "only the GPU kind");
        let e = specs.edits(&[vec!["GPU-aaaa".into(), "0".into()]]).unwrap();
        let nodes: Vec<&str> = e.device_nodes.iter().map(|d| d.path.as_str()).collect();
        assert_eq!(nodes, ["/dev/nvidiactl", "/dev/nvidia0"], "GPU 1's node is not given");
        assert_eq!(e.hooks[0].hook_name, "createContainer");
        assert_eq!(e.mounts.len(), 1);
        assert_eq!(e.env, ["NVIDIA_VISIBLE_DEVICES=void"]);
        // By index when the UUID is not named; an unknown device is an error naming it.
        let e1 = specs.edits(&[vec!["GPU-bbbb".into(), "1".into()]]).unwrap();
        assert!(e1.device_nodes.iter().any(|d| d.path == "/dev/nvidia1"));
        let err = specs.edits(&[vec!["GPU-cccc".into(), "7".into()]]).unwrap_err();
        assert!(err.contains("nvidia.com/gpu=GPU-cccc or 7"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
