//! Workloads as pods: the Pod a [`RunSpec`] becomes (in its project's namespace, with
//! `schedulerName: tessera`, the device-plugin resource of its shape, CPU/memory requests and
//! Tessera's labels), and what a pod's phase means for the workload. Pure functions.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use tessera_backend::{BackendError, Devices, Exit, Observation, Resource, RunSpec};

use crate::names;

/// The scheduler name on Tessera's pods: no other scheduler binds them.
pub const SCHEDULER: &str = "tessera";

/// The Pod for `spec` in `namespace`.
pub fn pod_for(spec: &RunSpec, namespace: &str) -> Result<Pod, BackendError> {
    let image = spec.image.as_deref().filter(|i| !i.trim().is_empty()).ok_or_else(|| {
        BackendError::Rejected(format!(
            "workload {} names no container image: the kubernetes backend runs containers",
            spec.id
        ))
    })?;
    let mut requests = BTreeMap::new();
    let mut limits = BTreeMap::new();
    requests.insert("cpu".to_string(), json!(format!("{}m", spec.cpu_milli.max(1))));
    requests.insert("memory".to_string(), json!(format!("{}Mi", spec.memory_mib.max(1))));
    match &spec.devices {
        Devices::Count { resource, count } => {
            if *count > 0 {
                // Extended resources are requested through limits (requests must equal them).
                let n = if matches!(resource, Resource::SharedGpu { .. }) {
                    1
                } else {
                    *count
                };
                requests.insert(resource.to_string(), json!(n.to_string()));
                limits.insert(resource.to_string(), json!(n.to_string()));
            }
        }
        Devices::Exact { .. } => {
            return Err(BackendError::Rejected(
                "the kubernetes backend is given a count of a device-plugin resource, not exact devices: the kubelet picks them"
                    .into(),
            ));
        }
    }
    let env: Vec<serde_json::Value> = spec
        .env
        .iter()
        .map(|(k, v)| json!({"name": k, "value": v}))
        .chain([
            json!({"name": "TESSERA_WORKLOAD_ID", "value": spec.id.to_string()}),
            json!({"name": "TESSERA_TENANT", "value": spec.tenant}),
            json!({"name": "TESSERA_PROJECT", "value": spec.project}),
        ])
        .collect();
    let mut container = json!({
        "name": "workload",
        "image": image,
        "env": env,
        "resources": {"requests": requests, "limits": limits},
    });
    if let Some(cmd) = &spec.command {
        container["command"] = json!(cmd);
    }
    let mut pod_spec = json!({
        "schedulerName": SCHEDULER,
        "restartPolicy": "Never",
        "containers": [container],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
    });
    if let Some(d) = spec.duration {
        pod_spec["activeDeadlineSeconds"] = json!(d.as_secs().max(1));
    }
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": names::pod_name(spec.id),
            "namespace": namespace,
            "labels": names::workload_labels(spec),
            "annotations": {
                names::ANNOTATION_NODE: spec.node,
                names::ANNOTATION_NAME: spec.name,
            },
        },
        "spec": pod_spec,
    });
    serde_json::from_value(pod).map_err(|e| BackendError::Rejected(format!("pod for workload {}: {e}", spec.id)))
}

/// The workload ID on a Tessera pod.
pub fn workload_id(pod: &Pod) -> Option<u64> {
    pod.metadata.labels.as_ref()?.get(names::LABEL_WORKLOAD)?.parse().ok()
}

/// The node a pod is bound to.
pub fn bound_node(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

/// What a pod's status says about its workload.
#[derive(Clone, Debug, PartialEq)]
pub enum PodState {
    /// Created, not bound or not started yet.
    Pending,
    Running {
        since_ms: Option<i64>,
    },
    Exited(Exit),
    /// Evicted (or otherwise removed by the node): the workload did not end on its own.
    Lost(String),
}

fn rfc3339_ms(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> i64 {
    t.0.as_millisecond()
}

/// Reads a pod's phase.
pub fn pod_state(pod: &Pod) -> PodState {
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    let reason = status.and_then(|s| s.reason.clone()).unwrap_or_default();
    let message = status.and_then(|s| s.message.clone()).unwrap_or_default();
    let terminated = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.first())
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.clone());
    match phase {
        "Running" => PodState::Running {
            since_ms: status
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|cs| cs.first())
                .and_then(|c| c.state.as_ref()?.running.as_ref()?.started_at.as_ref())
                .or(status.and_then(|s| s.start_time.as_ref()))
                .map(rfc3339_ms),
        },
        "Succeeded" => PodState::Exited(Exit::Succeeded),
        "Failed" if reason == "Evicted" || reason == "Preempting" || reason == "NodeLost" => {
            PodState::Lost(format!("pod {reason}: {message}").trim_end_matches(": ").to_string())
        }
        "Failed" => {
            let code = terminated.as_ref().map(|t| t.exit_code);
            let detail = [reason, message, terminated.and_then(|t| t.reason).unwrap_or_default()]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(": ");
            PodState::Exited(Exit::Failed {
                exit_code: code,
                detail: if detail.is_empty() { "pod failed".into() } else { detail },
            })
        }
        _ => PodState::Pending,
    }
}

/// The reconcile observation of a pod.
pub fn observation(pod: &Pod) -> Observation {
    match pod_state(pod) {
        PodState::Pending => Observation::Starting,
        PodState::Running { since_ms } => Observation::Running { since_ms },
        PodState::Exited(Exit::Succeeded) => Observation::Succeeded,
        PodState::Exited(e @ Exit::Failed { .. }) => Observation::Failed { detail: e.to_string() },
        PodState::Lost(detail) => Observation::Failed { detail },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    pub(crate) fn spec(devices: Devices) -> RunSpec {
        RunSpec {
            id: 42,
            tenant: "acme".into(),
            project: "vision".into(),
            name: "train".into(),
            kind: "batch".into(),
            node: "gpu-a".into(),
            model: "H100-80GB-SXM".into(),
            model_memory_mib: 81559,
            devices,
            cpu_milli: 4000,
            memory_mib: 16384,
            env: BTreeMap::from([("EPOCHS".into(), "3".into())]),
            command: Some(vec!["python".into(), "train.py".into()]),
            image: Some("registry.example/acme/train:1".into()),
            duration: Some(Duration::from_secs(600)),
            running_since_ms: None,
        }
    }

    #[test]
    fn a_whole_gpu_workload_asks_the_device_plugin_for_its_count() {
        let p = pod_for(
            &spec(Devices::Count {
                resource: Resource::Gpu,
                count: 2,
            }),
            "t-acme-vision",
        )
        .unwrap();
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["spec"]["schedulerName"], "tessera");
        let r = &v["spec"]["containers"][0]["resources"];
        assert_eq!(r["limits"]["nvidia.com/gpu"], "2");
        assert_eq!(r["requests"]["nvidia.com/gpu"], "2");
        assert_eq!(r["requests"]["cpu"], "4000m");
        assert_eq!(r["requests"]["memory"], "16384Mi");
        assert_eq!(v["metadata"]["labels"]["tessera.io/workload"], "42");
        assert_eq!(v["metadata"]["labels"]["tessera.io/tenant"], "acme");
        assert_eq!(v["spec"]["activeDeadlineSeconds"], 600);
        assert!(
            v["spec"].get("nodeName").is_none(),
            "Tessera binds through the Binding subresource"
        );
    }

    #[test]
    fn a_mig_workload_asks_for_its_profile() {
        let d = Devices::Count {
            resource: Resource::Mig {
                profile: "3g.40gb".into(),
            },
            count: 1,
        };
        let v = serde_json::to_value(pod_for(&spec(d), "ns").unwrap()).unwrap();
        assert_eq!(
            v["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-3g.40gb"],
            "1"
        );
    }

    #[test]
    fn a_workload_without_an_image_is_refused() {
        let mut s = spec(Devices::Count {
            resource: Resource::Gpu,
            count: 1,
        });
        s.image = None;
        let e = pod_for(&s, "ns").unwrap_err();
        assert!(e.to_string().contains("names no container image"), "{e}");
    }

    #[test]
    fn pod_phases_drive_the_lifecycle() {
        let pod = |status: serde_json::Value| -> Pod {
            serde_json::from_value(json!({"metadata": {}, "status": status})).unwrap()
        };
        assert_eq!(pod_state(&pod(json!({"phase": "Pending"}))), PodState::Pending);
        assert_eq!(
            pod_state(&pod(json!({"phase": "Running", "startTime": "2026-11-30T10:00:00Z"}))),
            PodState::Running {
                since_ms: Some(1_796_032_800_000)
            }
        );
        assert_eq!(
            pod_state(&pod(json!({"phase": "Succeeded"}))),
            PodState::Exited(Exit::Succeeded)
        );
        let failed = pod_state(&pod(json!({"phase": "Failed", "containerStatuses": [{
            "name": "workload", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]})));
        assert!(
            matches!(failed, PodState::Exited(Exit::Failed { exit_code: Some(137), ref detail }) if detail.contains("OOMKilled")),
            "{failed:?}"
        );
        assert!(matches!(
            pod_state(&pod(json!({"phase": "Failed", "reason": "Evicted"}))),
            PodState::Lost(_)
        ));
    }
}
