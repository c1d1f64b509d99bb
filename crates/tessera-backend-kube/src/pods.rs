//! Workloads as pods: the Pod a [`RunSpec`] becomes (in its project's namespace, with
//! `schedulerName: tessera`, the device-plugin resource of its shape, CPU/memory requests and
//! Tessera's labels), and what a pod's phase means for the workload. A multi-node gang is one
//! pod per node-share (`tessera-<id>-<index>`), told its place through `TESSERA_GANG_SIZE`,
//! `TESSERA_GANG_INDEX` and `TESSERA_GANG_HOSTS` (its peers' DNS names under the gang's headless
//! Service); its pods' states fold into one ([`gang_state`]). Pure functions.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use tessera_backend::{BackendError, Devices, Exit, Observation, Resource, RunSpec};

use crate::names;

/// The scheduler name on Tessera's pods: no other scheduler binds them.
pub const SCHEDULER: &str = "tessera";

/// The Pod of node-share `index` of `spec` in `namespace`. `shared_resource` is the resource
/// name the node's device plugin advertises time-sliced replicas under (`nvidia.com/gpu.shared`
/// when it renames them, else `nvidia.com/gpu`); a fraction asks for one replica of it.
pub fn pod_for(spec: &RunSpec, namespace: &str, index: usize, shared_resource: &str) -> Result<Pod, BackendError> {
    attempt_pod_for(spec, namespace, 0, index, shared_resource)
}

/// The user ID Tessera's workload containers run as: not root, whatever the image says.
pub const WORKLOAD_UID: i64 = 1000;

/// [`pod_for`] for attempt `attempt` of the workload: the pod's name, labels and its gang's
/// host names are the attempt's own ([`names::attempt_pod_name`]).
///
/// Every pod meets the `restricted` Pod Security Standard: not root (`runAsNonRoot`, user
/// [`WORKLOAD_UID`]), the runtime's default seccomp profile, no privilege escalation, every
/// capability dropped, no service-account token. GPUs need none of these: the device plugin
/// hands the devices to the container runtime, which injects them.
pub fn attempt_pod_for(
    spec: &RunSpec,
    namespace: &str,
    attempt: u32,
    index: usize,
    shared_resource: &str,
) -> Result<Pod, BackendError> {
    let (node, devices) = spec.share(index).ok_or_else(|| {
        BackendError::Rejected(format!(
            "workload {} has {} node-shares, not {}",
            spec.id,
            spec.gang_size(),
            index + 1
        ))
    })?;
    let size = spec.gang_size();
    let name = names::attempt_pod_name(spec.id, attempt, index, size);
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
    match devices {
        Devices::Count { resource, count } => {
            if *count > 0 {
                // Extended resources are requested through limits (requests must equal them). A
                // fraction is one time-sliced replica, whatever its milli: the device plugin
                // shares a GPU in equal slots and does not enforce a size.
                let (key, n) = match resource {
                    Resource::SharedGpu { .. } => (shared_resource.to_string(), 1),
                    r => (r.to_string(), *count),
                };
                requests.insert(key.clone(), json!(n.to_string()));
                limits.insert(key, json!(n.to_string()));
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
            json!({"name": "TESSERA_GANG_SIZE", "value": size.to_string()}),
            json!({"name": "TESSERA_GANG_INDEX", "value": index.to_string()}),
            json!({"name": "TESSERA_GANG_HOSTS", "value": attempt_gang_hosts(spec.id, attempt, size).join(",")}),
        ])
        .collect();
    let mut container = json!({
        "name": "workload",
        "image": image,
        "env": env,
        "resources": {"requests": requests, "limits": limits},
        "securityContext": {
            "allowPrivilegeEscalation": false,
            "privileged": false,
            "capabilities": {"drop": ["ALL"]},
        },
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
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": WORKLOAD_UID,
            "runAsGroup": WORKLOAD_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    });
    if let Some(d) = spec.duration {
        pod_spec["activeDeadlineSeconds"] = json!(d.as_secs().max(1));
    }
    if size > 1 {
        // `<hostname>.<subdomain>` resolves through the gang's headless Service.
        pod_spec["hostname"] = json!(name);
        pod_spec["subdomain"] = json!(names::attempt_service(spec.id, attempt));
    }
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": names::attempt_labels(spec, attempt, index),
            "annotations": {
                names::ANNOTATION_NODE: node,
                names::ANNOTATION_NAME: spec.name,
            },
        },
        "spec": pod_spec,
    });
    serde_json::from_value(pod).map_err(|e| BackendError::Rejected(format!("pod for workload {}: {e}", spec.id)))
}

/// The host names of a gang's pods (`tessera-<id>-<index>.tessera-<id>`, resolvable in the
/// namespace through the headless Service); the pod's own name for a workload on one node.
pub fn gang_hosts(id: u64, size: usize) -> Vec<String> {
    attempt_gang_hosts(id, 0, size)
}

/// [`gang_hosts`] of attempt `attempt`.
pub fn attempt_gang_hosts(id: u64, attempt: u32, size: usize) -> Vec<String> {
    if size <= 1 {
        return vec![names::attempt_pod_name(id, attempt, 0, 1)];
    }
    (0..size)
        .map(|i| {
            format!(
                "{}.{}",
                names::attempt_pod_name(id, attempt, i, size),
                names::attempt_service(id, attempt)
            )
        })
        .collect()
}

/// The headless Service of a multi-node gang, owned by its first pod (`owner_uid`), so the
/// garbage collector removes it with the gang.
pub fn gang_service_for(spec: &RunSpec, namespace: &str, owner_uid: &str) -> serde_json::Value {
    attempt_gang_service_for(spec, namespace, 0, owner_uid)
}

/// [`gang_service_for`] of attempt `attempt` (it selects that attempt's pods only).
pub fn attempt_gang_service_for(spec: &RunSpec, namespace: &str, attempt: u32, owner_uid: &str) -> serde_json::Value {
    let mut selector = BTreeMap::new();
    selector.insert(names::LABEL_WORKLOAD.to_string(), spec.id.to_string());
    selector.insert(names::LABEL_ATTEMPT.to_string(), attempt.to_string());
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": names::attempt_service(spec.id, attempt),
            "namespace": namespace,
            "labels": names::attempt_labels(spec, attempt, 0),
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Pod", "name": names::attempt_pod_name(spec.id, attempt, 0, spec.gang_size()),
                "uid": owner_uid,
            }],
        },
        "spec": {"clusterIP": "None", "selector": selector, "publishNotReadyAddresses": true},
    })
}

/// The attempt a Tessera pod runs (0 when unlabelled: pods made before attempts had names).
pub fn attempt(pod: &Pod) -> u32 {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(names::LABEL_ATTEMPT))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// When the pod's container finished (ms since the epoch), if it has.
pub fn finished_at_ms(pod: &Pod) -> Option<i64> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref())
        .map(rfc3339_ms)
        .max()
}

/// Whether `pod` is finished (its containers ended, or it is being deleted).
pub fn finished(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some() || matches!(pod_state(pod), PodState::Exited(_) | PodState::Lost(_))
}

/// A pod's index in its gang (0 for a workload on one node).
pub fn gang_index(pod: &Pod) -> usize {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(names::LABEL_GANG_INDEX))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The state of a workload whose node-shares' pods are in `states` (a missing pod counts as
/// `Pending`): lost or failed when any pod is (the first such, named); succeeded when all
/// succeeded; running when all run or have succeeded; pending otherwise.
pub fn gang_state(states: &[(String, PodState)]) -> PodState {
    let named = |name: &str, detail: &str| {
        if states.len() > 1 {
            format!("gang pod {name}: {detail}")
        } else {
            detail.to_string()
        }
    };
    for (name, s) in states {
        match s {
            PodState::Lost(d) => return PodState::Lost(named(name, d)),
            PodState::Exited(Exit::Failed { exit_code, detail }) => {
                return PodState::Exited(Exit::Failed {
                    exit_code: *exit_code,
                    detail: named(name, detail),
                });
            }
            _ => {}
        }
    }
    if states.iter().all(|(_, s)| *s == PodState::Exited(Exit::Succeeded)) {
        return PodState::Exited(Exit::Succeeded);
    }
    let mut since: Option<i64> = None;
    for (_, s) in states {
        match s {
            PodState::Running { since_ms } => since = since.max(*since_ms),
            PodState::Exited(Exit::Succeeded) => {}
            _ => return PodState::Pending,
        }
    }
    PodState::Running { since_ms: since }
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

/// The reconcile observation of a workload in state `state` ([`pod_state`], [`gang_state`]).
pub fn observation(state: PodState) -> Observation {
    match state {
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
            gang: Vec::new(),
            native: None,
        }
    }

    #[test]
    fn pods_meet_the_restricted_pod_security_standard() {
        let p = serde_json::to_value(
            pod_for(
                &spec(Devices::Count {
                    resource: Resource::Gpu,
                    count: 1,
                }),
                "ns",
                0,
                "nvidia.com/gpu",
            )
            .unwrap(),
        )
        .unwrap();
        let sc = &p["spec"]["securityContext"];
        assert_eq!(sc["runAsNonRoot"], true);
        assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
        assert_ne!(sc["runAsUser"], 0);
        let c = &p["spec"]["containers"][0]["securityContext"];
        assert_eq!(c["allowPrivilegeEscalation"], false);
        assert_eq!(c["capabilities"]["drop"], json!(["ALL"]));
        assert_eq!(p["spec"]["automountServiceAccountToken"], false);
    }

    #[test]
    fn a_later_attempt_has_pods_and_hosts_of_its_own() {
        let mut s = spec(Devices::Count {
            resource: Resource::Gpu,
            count: 8,
        });
        let p = attempt_pod_for(&s, "ns", 2, 0, "nvidia.com/gpu").unwrap();
        assert_eq!(p.metadata.name.as_deref(), Some("tessera-42-r2"));
        assert_eq!(attempt(&p), 2);
        s.gang = vec![tessera_backend::GangShare {
            node: "n1".into(),
            devices: s.devices.clone(),
        }];
        let p = attempt_pod_for(&s, "ns", 1, 1, "nvidia.com/gpu").unwrap();
        assert_eq!(p.metadata.name.as_deref(), Some("tessera-42-r1-1"));
        assert_eq!(
            attempt_gang_hosts(42, 1, 2),
            vec!["tessera-42-r1-0.tessera-42-r1", "tessera-42-r1-1.tessera-42-r1"]
        );
        let svc = attempt_gang_service_for(&s, "ns", 1, "uid");
        assert_eq!(svc["spec"]["selector"][names::LABEL_ATTEMPT], "1");
    }

    #[test]
    fn a_whole_gpu_workload_asks_the_device_plugin_for_its_count() {
        let p = pod_for(
            &spec(Devices::Count {
                resource: Resource::Gpu,
                count: 2,
            }),
            "t-acme-vision",
            0,
            "nvidia.com/gpu.shared",
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
        let v = serde_json::to_value(pod_for(&spec(d), "ns", 0, "nvidia.com/gpu.shared").unwrap()).unwrap();
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
        let e = pod_for(&s, "ns", 0, "nvidia.com/gpu.shared").unwrap_err();
        assert!(e.to_string().contains("names no container image"), "{e}");
    }

    #[test]
    fn a_gang_over_two_nodes_is_two_pods_that_know_their_place() {
        let mut s = spec(Devices::Count {
            resource: Resource::Gpu,
            count: 8,
        });
        s.gang = vec![tessera_backend::GangShare {
            node: "gpu-b".into(),
            devices: s.devices.clone(),
        }];
        let v = serde_json::to_value(pod_for(&s, "ns", 1, "nvidia.com/gpu.shared").unwrap()).unwrap();
        assert_eq!(v["metadata"]["name"], "tessera-42-1");
        assert_eq!(v["metadata"]["annotations"]["tessera.io/node"], "gpu-b");
        assert_eq!(v["metadata"]["labels"]["tessera.io/gang-index"], "1");
        assert_eq!(v["metadata"]["labels"]["tessera.io/gang-size"], "2");
        assert_eq!(
            (&v["spec"]["hostname"], &v["spec"]["subdomain"]),
            (&json!("tessera-42-1"), &json!("tessera-42"))
        );
        let env = &v["spec"]["containers"][0]["env"];
        let get = |k: &str| env.as_array().unwrap().iter().find(|e| e["name"] == k).unwrap()["value"].clone();
        assert_eq!(get("TESSERA_GANG_SIZE"), "2");
        assert_eq!(get("TESSERA_GANG_INDEX"), "1");
        assert_eq!(
            get("TESSERA_GANG_HOSTS"),
            "tessera-42-0.tessera-42,tessera-42-1.tessera-42"
        );
        assert!(pod_for(&s, "ns", 2, "x").is_err(), "no third share");
        // One workload, one pod, its old name (a restarted Tessera finds pods it made before gangs).
        s.gang.clear();
        let v = serde_json::to_value(pod_for(&s, "ns", 0, "x").unwrap()).unwrap();
        assert_eq!(v["metadata"]["name"], "tessera-42");
        assert!(v["spec"].get("subdomain").is_none());
    }

    #[test]
    fn a_fraction_asks_for_one_replica_of_the_nodes_shared_resource() {
        let d = Devices::Count {
            resource: Resource::SharedGpu { milli: 250 },
            count: 1,
        };
        for res in ["nvidia.com/gpu.shared", "nvidia.com/gpu"] {
            let v = serde_json::to_value(pod_for(&spec(d.clone()), "ns", 0, res).unwrap()).unwrap();
            assert_eq!(v["spec"]["containers"][0]["resources"]["limits"][res], "1");
        }
    }

    #[test]
    fn a_gang_runs_when_all_its_pods_run_and_fails_with_any() {
        let n = |s: &str, st: PodState| (s.to_string(), st);
        let run = |t| PodState::Running { since_ms: Some(t) };
        assert_eq!(
            gang_state(&[n("a", run(5)), n("b", PodState::Pending)]),
            PodState::Pending
        );
        assert_eq!(gang_state(&[n("a", run(5)), n("b", run(9))]), run(9));
        assert_eq!(
            gang_state(&[n("a", PodState::Exited(Exit::Succeeded)), n("b", run(9))]),
            run(9)
        );
        assert_eq!(
            gang_state(&[
                n("a", PodState::Exited(Exit::Succeeded)),
                n("b", PodState::Exited(Exit::Succeeded))
            ]),
            PodState::Exited(Exit::Succeeded)
        );
        assert_eq!(
            gang_state(&[n("a", run(5)), n("b", PodState::Lost("pod Evicted".into()))]),
            PodState::Lost("gang pod b: pod Evicted".into())
        );
        assert!(matches!(
            gang_state(&[n("a", PodState::Pending), n("b", PodState::Exited(Exit::Failed { exit_code: Some(1), detail: "Error".into() }))]),
            PodState::Exited(Exit::Failed { exit_code: Some(1), ref detail }) if detail == "gang pod b: Error"
        ));
        // One pod: its state, unchanged.
        assert_eq!(
            gang_state(&[n("a", PodState::Lost("x".into()))]),
            PodState::Lost("x".into())
        );
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
