//! Pods made with the cluster's own tools (`kubectl run`, `kubectl apply` of a Pod, a Job's
//! pods) that ask for GPUs, read the way Tessera's admission webhook and its watch of waiting
//! pods read them. Pure: no I/O.
//!
//! A pod in a tenant project's namespace that asks for an NVIDIA resource, or names
//! `schedulerName: tessera`, is a Tessera workload: the mutating webhook makes Tessera its
//! scheduler, gives it the restricted security defaults it lacks and removes labels only
//! Tessera may set; the validating webhook and the control plane then check it (tenant,
//! granted priority, image policy, a shape the fleet can hold). Once it exists, the backend
//! reports it ([`tessera_backend::BackendEvent::Submitted`]); it waits in Tessera's queue and is
//! bound by Tessera. What the pod says:
//!
//! * GPUs: `nvidia.com/gpu: N` (whole GPUs), `nvidia.com/mig-<profile>: 1` (one MIG instance),
//!   or `nvidia.com/gpu` / `nvidia.com/gpu.shared: 1` with the annotation
//!   [`ANNOTATION_FRACTION`] (a fraction of a time-sliced GPU, `0.25` or `250m`).
//! * Where: the annotations [`ANNOTATION_POOL`] (or a `nodeSelector` on the pool label) and
//!   [`ANNOTATION_MODEL`]; the priority class: [`ANNOTATION_PRIORITY`].
//! * Batch or service: `restartPolicy: Never`/`OnFailure` (a Job's pods) run until they end;
//!   `Always` runs until stopped.
//! * A gang: the pods of a Job annotated [`ANNOTATION_GANG`] are the node-shares of one
//!   multi-node workload ([`with_gang`]), with an optional [`ANNOTATION_TOPOLOGY`].
//!
//! Refused, with what to do instead: `spec.nodeName` (Tessera places GPU pods), host
//! namespaces, `hostPath` volumes, privileged containers, privilege escalation, added
//! capabilities beyond `NET_BIND_SERVICE`, running as root (the namespaces enforce the
//! restricted Pod Security Standard), GPU pods outside a Tessera project namespace (outside
//! the exempt ones, such as the GPU Operator's), a pod with `schedulerName: tessera` that asks
//! for no GPU.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use serde_json::{Value, json};
use tessera_backend::{NativeAsk, NativeGang, NativeGpus, NativeReview};

use crate::fleet;
use crate::names::{LABEL_ATTEMPT, LABEL_MANAGED_BY, LABEL_WORKLOAD, MANAGED_BY};

/// The scheduler name of every pod Tessera binds.
pub const SCHEDULER_NAME: &str = "tessera";
pub const ANNOTATION_FRACTION: &str = "tessera.io/gpu-fraction";
pub const ANNOTATION_POOL: &str = "tessera.io/pool";
pub const ANNOTATION_MODEL: &str = "tessera.io/gpu-model";
pub const ANNOTATION_PRIORITY: &str = "tessera.io/priority";
/// On a Job (or its pod template): its pods run together as one gang, all or none, one pod
/// per node-share (`"true"`).
pub const ANNOTATION_GANG: &str = "tessera.io/gang";
/// A gang's topology constraint: the level its pods must share (`rack`, `pool`, or a
/// configured level's name).
pub const ANNOTATION_TOPOLOGY: &str = "tessera.io/topology";
/// `required` (the default) or `preferred`.
pub const ANNOTATION_TOPOLOGY_MODE: &str = "tessera.io/topology-mode";

/// What the admission knows of the cluster beyond the pod.
#[derive(Clone, Debug, Default)]
pub struct Rules {
    /// The user name Tessera itself acts as (its own pods pass unchanged).
    pub tessera_user: Option<String>,
    /// Namespaces whose GPU pods are not Tessera's (the GPU Operator's validators).
    pub exempt: BTreeSet<String>,
    /// The node label naming a node's Tessera pool.
    pub pool_label: String,
    /// The namespace prefix of tenant projects (for messages).
    pub namespace_prefix: String,
}

/// The user name a `--kube-identity` (`NAMESPACE/NAME` of a service account, or a user name)
/// authenticates as.
pub fn user_of(identity: &str) -> String {
    match identity.split_once('/') {
        Some((ns, name)) => format!("system:serviceaccount:{ns}:{name}"),
        None => identity.to_string(),
    }
}

/// An `AdmissionReview` of a pod, as the API server sends it.
pub fn parse(body: &[u8]) -> Result<AdmissionRequest<Pod>, String> {
    let review: AdmissionReview<Pod> =
        serde_json::from_slice(body).map_err(|e| format!("not an AdmissionReview of a Pod: {e}"))?;
    review
        .try_into()
        .map_err(|_| "the AdmissionReview carries no request".to_string())
}

/// Whether the request is one Tessera reviews: the creation of a pod (not a subresource) by
/// someone other than Tessera.
pub fn reviewed(req: &AdmissionRequest<Pod>, rules: &Rules) -> bool {
    req.operation == Operation::Create
        && req.kind.kind == "Pod"
        && req.sub_resource.is_none()
        && rules.tessera_user.as_deref() != Some(req.user_info.username.as_deref().unwrap_or(""))
}

fn all_containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.containers.iter().chain(spec.init_containers.iter().flatten())
}

/// The NVIDIA resources a container asks for (limits, else requests), by name.
fn nvidia_resources(c: &Container) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Some(r) = &c.resources else { return out };
    for list in [&r.limits, &r.requests].into_iter().flatten() {
        for (k, q) in list {
            if k.starts_with("nvidia.com/") && !out.contains_key(k) {
                out.insert(k.clone(), fleet::quantity(&q.0, 1.0).unwrap_or(0));
            }
        }
    }
    out
}

/// The GPUs a pod asks for: `Ok(None)` for none.
pub fn gpus_of(pod: &Pod) -> Result<Option<NativeGpus>, String> {
    let Some(spec) = &pod.spec else { return Ok(None) };
    // The pod's effective request: the larger of its containers' sum and any init container.
    let mut sum: BTreeMap<String, u64> = BTreeMap::new();
    for c in &spec.containers {
        for (k, n) in nvidia_resources(c) {
            *sum.entry(k).or_default() += n;
        }
    }
    for c in spec.init_containers.iter().flatten() {
        for (k, n) in nvidia_resources(c) {
            let e = sum.entry(k).or_default();
            *e = (*e).max(n);
        }
    }
    sum.retain(|_, n| *n > 0);
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let fraction = annotations.get(ANNOTATION_FRACTION);
    let mut kinds = sum.into_iter();
    let Some((resource, count)) = kinds.next() else {
        return match fraction {
            Some(_) => Err(format!(
                "the annotation {ANNOTATION_FRACTION} needs a GPU resource: ask for nvidia.com/gpu: 1 (or nvidia.com/gpu.shared: 1) in its container's limits"
            )),
            None => Ok(None),
        };
    };
    if let Some((other, _)) = kinds.next() {
        return Err(format!(
            "the pod asks for both {resource} and {other}: a Tessera workload is one shape (whole GPUs, one MIG instance or a fraction)"
        ));
    }
    if let Some(profile) = resource.strip_prefix("nvidia.com/mig-") {
        if count != 1 {
            return Err(format!(
                "the pod asks for {count} {resource}: a Tessera MIG workload is one instance; ask for a larger profile, or make one pod per instance"
            ));
        }
        if fraction.is_some() {
            return Err(format!(
                "{ANNOTATION_FRACTION} applies to time-sliced GPUs, not to MIG instances"
            ));
        }
        // The device plugin writes a profile's `+` (`1g.10gb+me`) as `.` (`1g.10gb.me`).
        let profile = match profile.find("gb.") {
            Some(at) => format!("{}+{}", &profile[..at + 2], &profile[at + 3..]),
            None => profile.to_string(),
        };
        return Ok(Some(NativeGpus::Mig(profile)));
    }
    if resource != fleet::RESOURCE_GPU && resource != fleet::RESOURCE_SHARED {
        return Err(format!(
            "{resource} is not a GPU resource Tessera places: ask for nvidia.com/gpu, nvidia.com/mig-<profile> or a fraction"
        ));
    }
    match fraction {
        Some(f) => {
            let milli = parse_fraction(f)?;
            if count != 1 {
                return Err(format!(
                    "a fraction ({ANNOTATION_FRACTION}: {f}) is one replica of a time-sliced GPU: ask for {resource}: 1, not {count}"
                ));
            }
            Ok(Some(NativeGpus::Fraction(milli)))
        }
        None if resource == fleet::RESOURCE_SHARED => Err(format!(
            "{resource} is a time-sliced GPU: say which fraction of it with the annotation {ANNOTATION_FRACTION} (for example 0.25)"
        )),
        None => Ok(Some(NativeGpus::Whole(u32::try_from(count).unwrap_or(u32::MAX)))),
    }
}

/// `0.25`, `250m` or `25%` as thousandths of a GPU, strictly between 0 and 1000.
fn parse_fraction(s: &str) -> Result<u32, String> {
    let s = s.trim();
    let v = if let Some(p) = s.strip_suffix('%') {
        p.trim().parse::<f64>().map(|p| p * 10.0)
    } else if let Some(m) = s.strip_suffix('m') {
        m.trim().parse::<f64>()
    } else {
        s.parse::<f64>().map(|f| f * 1000.0)
    };
    match v {
        Ok(m) if (1.0..1000.0).contains(&m) => Ok(m.round() as u32),
        _ => Err(format!(
            "{ANNOTATION_FRACTION}: `{s}` is not a fraction of a GPU between 0 and 1 (write 0.25, 250m or 25%)"
        )),
    }
}

/// What in the pod breaks the rules of a tenant namespace, each with what to do instead.
pub fn violations(pod: &Pod) -> Vec<String> {
    let mut out = Vec::new();
    let Some(spec) = &pod.spec else { return out };
    if spec.node_name.as_deref().is_some_and(|n| !n.is_empty()) {
        out.push(format!(
            "spec.nodeName is set: Tessera places GPU pods; remove it (choose a pool with the annotation {ANNOTATION_POOL})"
        ));
    }
    for (set, what) in [
        (spec.host_network, "hostNetwork"),
        (spec.host_pid, "hostPID"),
        (spec.host_ipc, "hostIPC"),
    ] {
        if set == Some(true) {
            out.push(format!("{what} is set: workloads get no host namespace; remove it"));
        }
    }
    for v in spec.volumes.iter().flatten() {
        if v.host_path.is_some() {
            out.push(format!(
                "volume `{}` is a hostPath: workloads get no host files; use a PersistentVolumeClaim, a ConfigMap or an emptyDir",
                v.name
            ));
        }
    }
    let pod_sc = spec.security_context.as_ref();
    if pod_sc.and_then(|s| s.run_as_user) == Some(0) {
        out.push("securityContext.runAsUser is 0: tenant namespaces enforce the restricted Pod Security Standard; run as a non-root user".into());
    }
    if pod_sc.and_then(|s| s.run_as_non_root) == Some(false) {
        out.push("securityContext.runAsNonRoot is false: tenant namespaces enforce the restricted Pod Security Standard; remove it".into());
    }
    for c in all_containers(spec) {
        let Some(sc) = &c.security_context else { continue };
        if sc.privileged == Some(true) {
            out.push(format!(
                "container `{}` is privileged: GPU work needs no privilege (the device plugin gives the GPUs); remove securityContext.privileged",
                c.name
            ));
        }
        if sc.allow_privilege_escalation == Some(true) {
            out.push(format!(
                "container `{}` allows privilege escalation: remove securityContext.allowPrivilegeEscalation",
                c.name
            ));
        }
        if sc.run_as_user == Some(0) {
            out.push(format!(
                "container `{}` runs as user 0: tenant namespaces enforce the restricted Pod Security Standard; run as a non-root user",
                c.name
            ));
        }
        if sc.run_as_non_root == Some(false) {
            out.push(format!(
                "container `{}` sets runAsNonRoot: false: tenant namespaces enforce the restricted Pod Security Standard; remove it",
                c.name
            ));
        }
        let added: Vec<&String> = sc
            .capabilities
            .iter()
            .flat_map(|caps| caps.add.iter().flatten())
            .filter(|c| c.as_str() != "NET_BIND_SERVICE")
            .collect();
        if !added.is_empty() {
            out.push(format!(
                "container `{}` adds capabilities {}: only NET_BIND_SERVICE may be added",
                c.name,
                added.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
            ));
        }
    }
    out
}

/// What Tessera makes of pod `pod` in `namespace`, which belongs to the tenant project
/// `project` (`None`: no Tessera project's namespace).
pub fn review_pod(pod: &Pod, namespace: &str, project: Option<(&str, &str)>, rules: &Rules) -> NativeReview {
    let scheduler = pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref());
    let gpus = match gpus_of(pod) {
        Ok(g) => g,
        Err(why) if project.is_some() || scheduler == Some(SCHEDULER_NAME) => return NativeReview::Refuse(why),
        // Not Tessera's namespace and not Tessera's scheduler: someone else's resource
        // names, not Tessera's business unless they are GPUs (refused below).
        Err(_) => Some(NativeGpus::Whole(0)),
    };
    if gpus.is_none() && scheduler != Some(SCHEDULER_NAME) {
        return NativeReview::Pass;
    }
    if rules.exempt.contains(namespace) {
        return NativeReview::Pass;
    }
    let Some((tenant, project)) = project else {
        return NativeReview::Refuse(format!(
            "GPU pods run through Tessera: create them in a Tessera project's namespace ({}<tenant>-<project>); namespace {namespace} is not one",
            rules.namespace_prefix
        ));
    };
    let Some(gpus) = gpus else {
        return NativeReview::Refuse(format!(
            "schedulerName: {SCHEDULER_NAME} places GPU work: ask for nvidia.com/gpu, nvidia.com/mig-<profile> or a fraction in the container's limits, or remove schedulerName"
        ));
    };
    if let Some(s) = scheduler
        && s != SCHEDULER_NAME
        && s != "default-scheduler"
    {
        return NativeReview::Refuse(format!(
            "schedulerName: {s}: GPU pods in project namespaces are placed by Tessera; remove schedulerName"
        ));
    }
    let broken = violations(pod);
    if !broken.is_empty() {
        return NativeReview::Refuse(broken.join("; "));
    }
    let spec = pod.spec.as_ref().expect("a pod with GPUs has a spec");
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let pool = annotations.get(ANNOTATION_POOL).cloned().or_else(|| {
        spec.node_selector
            .as_ref()
            .and_then(|s| s.get(&rules.pool_label).cloned())
    });
    let (mut cpu, mut mem) = (0u64, 0u64);
    for c in &spec.containers {
        if let Some(r) = c.resources.as_ref().and_then(|r| r.requests.as_ref()) {
            cpu += r.get("cpu").and_then(|q| fleet::quantity(&q.0, 1000.0)).unwrap_or(0);
            mem += r
                .get("memory")
                .and_then(|q| fleet::quantity(&q.0, 1.0 / (1024.0 * 1024.0)))
                .unwrap_or(0);
        }
    }
    // A controller's pod (a Job's) is named after its controller; a bare pod after itself.
    let controller = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.name.clone());
    let name = controller
        .or_else(|| pod.metadata.name.clone().filter(|n| !n.is_empty()))
        .or_else(|| {
            pod.metadata
                .generate_name
                .as_deref()
                .map(|g| g.trim_end_matches('-').to_string())
        })
        .unwrap_or_else(|| "pod".into());
    NativeReview::Ask(Box::new(NativeAsk {
        tenant: tenant.to_string(),
        project: project.to_string(),
        name,
        gpus,
        model: annotations.get(ANNOTATION_MODEL).cloned(),
        pool,
        cpu_milli: (cpu > 0).then_some(cpu),
        memory_mib: (mem > 0).then_some(mem),
        priority: annotations.get(ANNOTATION_PRIORITY).cloned(),
        images: all_containers(spec).filter_map(|c| c.image.clone()).collect(),
        batch: matches!(spec.restart_policy.as_deref(), Some("Never" | "OnFailure")),
        gang: None,
    }))
}

/// The Job that controls `pod` (its controller reference of kind `Job`): name and UID.
pub fn job_owner(pod: &Pod) -> Option<(String, String)> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == "Job" && o.api_version.starts_with("batch/"))
        .map(|o| (o.name.clone(), o.uid.clone()))
}

fn says_yes(v: Option<&String>) -> bool {
    v.is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "yes" | "1"))
}

/// What [`review_pod`] made of a pod, completed with its gang: a pod of a Job annotated
/// [`ANNOTATION_GANG`] (on the Job or on its pod template) is one node-share of a gang of the
/// Job's `parallelism` pods, each asking for the same whole GPUs. `job` is the pod's
/// controlling Job as the API server has it (`None`: the pod has none). A gang of one pod is
/// a plain pod.
pub fn with_gang(review: NativeReview, pod: &Pod, job: Option<&Job>) -> NativeReview {
    let NativeReview::Ask(mut ask) = review else {
        return review;
    };
    let pod_notes = pod.metadata.annotations.clone().unwrap_or_default();
    let job_notes = job.and_then(|j| j.metadata.annotations.clone()).unwrap_or_default();
    let note = |k: &str| pod_notes.get(k).or_else(|| job_notes.get(k));
    if !says_yes(note(ANNOTATION_GANG)) {
        return NativeReview::Ask(ask);
    }
    let Some(job) = job else {
        return NativeReview::Refuse(format!(
            "{ANNOTATION_GANG} groups the pods of a Job: put this pod's spec in a Job (batch/v1) whose parallelism is the number of pods"
        ));
    };
    let spec = job.spec.clone().unwrap_or_default();
    let pods = spec.parallelism.unwrap_or(1).max(0) as u32;
    if let Some(c) = spec.completions
        && c as u32 != pods
    {
        return NativeReview::Refuse(format!(
            "a gang Job runs all its pods at once: set completions to its parallelism ({pods}) or leave it unset, not {c}"
        ));
    }
    let NativeGpus::Whole(per_pod) = ask.gpus else {
        return NativeReview::Refuse(
            "a gang's pods each ask for whole GPUs (nvidia.com/gpu: N): MIG instances and fractions run one pod each"
                .into(),
        );
    };
    if per_pod == 0 {
        return NativeReview::Refuse("a gang's pods each ask for at least one whole GPU".into());
    }
    if pods < 2 {
        return NativeReview::Ask(ask);
    }
    let preferred = match note(ANNOTATION_TOPOLOGY_MODE).map(|m| m.trim().to_ascii_lowercase()) {
        None => false,
        Some(m) if m == "required" => false,
        Some(m) if m == "preferred" => true,
        Some(m) => {
            return NativeReview::Refuse(format!(
                "{ANNOTATION_TOPOLOGY_MODE}: `{m}` is neither required nor preferred"
            ));
        }
    };
    ask.gang = Some(NativeGang {
        pods,
        topology: note(ANNOTATION_TOPOLOGY)
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty()),
        preferred,
    });
    NativeReview::Ask(ask)
}

/// A JSON pointer's escaping of one path segment.
fn pointer(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// The JSON patch the mutating webhook applies to a pod it admits as a Tessera workload:
/// Tessera is its scheduler; the restricted security defaults it does not set itself (seccomp
/// `RuntimeDefault`, non-root, no privilege escalation, all capabilities dropped); and the
/// labels only Tessera may set are removed (a pod cannot pass for one Tessera made).
pub fn mutation(pod: &Pod) -> Vec<Value> {
    let mut ops = Vec::new();
    let Some(spec) = &pod.spec else { return ops };
    ops.push(json!({"op": "add", "path": "/spec/schedulerName", "value": SCHEDULER_NAME}));
    let someone_sets_user = spec
        .security_context
        .as_ref()
        .is_some_and(|s| s.run_as_non_root.is_some() || s.run_as_user.is_some())
        || all_containers(spec).any(|c| {
            c.security_context
                .as_ref()
                .is_some_and(|s| s.run_as_non_root.is_some() || s.run_as_user.is_some())
        });
    match &spec.security_context {
        None => {
            let mut sc = json!({"seccompProfile": {"type": "RuntimeDefault"}});
            if !someone_sets_user {
                sc["runAsNonRoot"] = json!(true);
            }
            ops.push(json!({"op": "add", "path": "/spec/securityContext", "value": sc}));
        }
        Some(sc) => {
            if sc.seccomp_profile.is_none() {
                ops.push(json!({"op": "add", "path": "/spec/securityContext/seccompProfile", "value": {"type": "RuntimeDefault"}}));
            }
            if !someone_sets_user {
                ops.push(json!({"op": "add", "path": "/spec/securityContext/runAsNonRoot", "value": true}));
            }
        }
    }
    let lists = [
        ("containers", Some(&spec.containers)),
        ("initContainers", spec.init_containers.as_ref()),
    ];
    for (list, containers) in lists {
        for (i, c) in containers.into_iter().flatten().enumerate() {
            let base = format!("/spec/{list}/{i}/securityContext");
            match &c.security_context {
                None => ops.push(json!({"op": "add", "path": base, "value": {
                    "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}})),
                Some(sc) => {
                    if sc.allow_privilege_escalation.is_none() {
                        ops.push(
                            json!({"op": "add", "path": format!("{base}/allowPrivilegeEscalation"), "value": false}),
                        );
                    }
                    match &sc.capabilities {
                        None => ops.push(
                            json!({"op": "add", "path": format!("{base}/capabilities"), "value": {"drop": ["ALL"]}}),
                        ),
                        Some(caps) if caps.drop.is_none() => ops
                            .push(json!({"op": "add", "path": format!("{base}/capabilities/drop"), "value": ["ALL"]})),
                        Some(_) => {}
                    }
                }
            }
        }
    }
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    for key in [LABEL_WORKLOAD, LABEL_ATTEMPT] {
        if labels.contains_key(key) {
            ops.push(json!({"op": "remove", "path": format!("/metadata/labels/{}", pointer(key))}));
        }
    }
    if labels.get(LABEL_MANAGED_BY).is_some_and(|v| v == MANAGED_BY) {
        ops.push(json!({"op": "remove", "path": format!("/metadata/labels/{}", pointer(LABEL_MANAGED_BY))}));
    }
    ops
}

/// The `AdmissionReview` answering `req`: allowed (with `patch`, if any) or refused with
/// `refusal`, which `kubectl` shows its user.
pub fn answer(req: &AdmissionRequest<Pod>, refusal: Option<&str>, patch: Vec<Value>) -> Vec<u8> {
    let mut resp = AdmissionResponse::from(req);
    match refusal {
        Some(why) => {
            resp = resp.deny(format!("Tessera: {why}"));
            resp.result.code = 403;
            resp.result.reason = "Forbidden".into();
        }
        None if !patch.is_empty() => {
            let patch: json_patch::Patch = serde_json::from_value(Value::Array(patch)).expect("a JSON patch");
            resp = resp.with_patch(patch).expect("a JSON patch serialises");
        }
        None => {}
    }
    serde_json::to_vec(&resp.into_review()).expect("an AdmissionReview serialises")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn gpu_pod(resources: Value) -> Pod {
        pod(json!({"metadata": {"name": "train", "namespace": "tessera-acme-ml"},
            "spec": {"containers": [{"name": "main", "image": "busybox", "resources": resources}]}}))
    }

    fn rules() -> Rules {
        Rules {
            tessera_user: Some("system:serviceaccount:tessera-system:tessera".into()),
            exempt: BTreeSet::from(["gpu-operator".to_string()]),
            pool_label: "tessera.io/pool".into(),
            namespace_prefix: "tessera-".into(),
        }
    }

    fn job(v: Value) -> Job {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_jobs_pods_annotated_as_a_gang_are_one_gang_and_bad_gangs_are_refused() {
        let member = |notes: Value, limits: Value| {
            pod(
                json!({"metadata": {"name": "train-abcde", "namespace": "tessera-acme-ml",
                "annotations": notes,
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train",
                    "uid": "job-uid", "controller": true}]},
                "spec": {"restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}]}}),
            )
        };
        let review = |p: &Pod, j: Option<&Job>| {
            with_gang(review_pod(p, "tessera-acme-ml", Some(("acme", "ml")), &rules()), p, j)
        };
        assert_eq!(
            job_owner(&member(json!({}), json!({}))),
            Some(("train".to_string(), "job-uid".to_string()))
        );
        let four = job(json!({"metadata": {"name": "train", "uid": "job-uid",
            "annotations": {"tessera.io/gang": "true", "tessera.io/topology": "rack"}},
            "spec": {"parallelism": 4, "template": {}}}));
        // The annotation on the Job makes every one of its pods a share of one gang.
        let p = member(json!({}), json!({"nvidia.com/gpu": "8"}));
        match review(&p, Some(&four)) {
            NativeReview::Ask(a) => {
                assert_eq!(a.gpus, NativeGpus::Whole(8));
                assert_eq!(a.name, "train");
                assert_eq!(
                    a.gang,
                    Some(NativeGang {
                        pods: 4,
                        topology: Some("rack".into()),
                        preferred: false
                    })
                );
            }
            other => panic!("{other:?}"),
        }
        // On the pod template, with a preferred topology.
        let plain = job(json!({"metadata": {"name": "train", "uid": "job-uid"},
            "spec": {"parallelism": 2, "completions": 2, "template": {}}}));
        let p = member(
            json!({"tessera.io/gang": "true", "tessera.io/topology": "rack", "tessera.io/topology-mode": "preferred"}),
            json!({"nvidia.com/gpu": "4"}),
        );
        match review(&p, Some(&plain)) {
            NativeReview::Ask(a) => assert!(a.gang.as_ref().is_some_and(|g| g.pods == 2 && g.preferred), "{a:?}"),
            other => panic!("{other:?}"),
        }
        // Without the annotation a Job's pod is a pod of its own.
        let p = member(json!({}), json!({"nvidia.com/gpu": "4"}));
        match review(&p, Some(&plain)) {
            NativeReview::Ask(a) => assert_eq!(a.gang, None),
            other => panic!("{other:?}"),
        }
        // Refused, each with what to do: completions other than parallelism, a fraction, a
        // MIG instance, a bare pod, a mode that is not one.
        let odd = job(
            json!({"metadata": {"name": "train", "uid": "job-uid", "annotations": {"tessera.io/gang": "true"}},
            "spec": {"parallelism": 2, "completions": 6, "template": {}}}),
        );
        let refused = |r: NativeReview| match r {
            NativeReview::Refuse(why) => why,
            other => panic!("{other:?}"),
        };
        assert!(
            refused(review(&member(json!({}), json!({"nvidia.com/gpu": "8"})), Some(&odd))).contains("set completions")
        );
        let frac = member(
            json!({"tessera.io/gpu-fraction": "0.5"}),
            json!({"nvidia.com/gpu": "1"}),
        );
        assert!(refused(review(&frac, Some(&four))).contains("whole GPUs"));
        let mig = member(json!({}), json!({"nvidia.com/mig-1g.10gb": "1"}));
        assert!(refused(review(&mig, Some(&four))).contains("whole GPUs"));
        let bare = member(json!({"tessera.io/gang": "true"}), json!({"nvidia.com/gpu": "8"}));
        assert!(refused(review(&bare, None)).contains("put this pod's spec in a Job"));
        let p = member(
            json!({"tessera.io/topology-mode": "sometimes"}),
            json!({"nvidia.com/gpu": "8"}),
        );
        assert!(refused(review(&p, Some(&four))).contains("neither required nor preferred"));
        // A gang of one pod is a plain pod.
        let one = job(
            json!({"metadata": {"name": "train", "uid": "job-uid", "annotations": {"tessera.io/gang": "true"}},
            "spec": {"template": {}}}),
        );
        match review(&member(json!({}), json!({"nvidia.com/gpu": "8"})), Some(&one)) {
            NativeReview::Ask(a) => assert_eq!(a.gang, None),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn gpu_resources_become_one_shape() {
        let whole = gpu_pod(json!({"limits": {"nvidia.com/gpu": "2"}}));
        assert_eq!(gpus_of(&whole).unwrap(), Some(NativeGpus::Whole(2)));
        let mig = gpu_pod(json!({"limits": {"nvidia.com/mig-1g.10gb": "1"}}));
        assert_eq!(gpus_of(&mig).unwrap(), Some(NativeGpus::Mig("1g.10gb".into())));
        let me = gpu_pod(json!({"limits": {"nvidia.com/mig-1g.10gb.me": "1"}}));
        assert_eq!(gpus_of(&me).unwrap(), Some(NativeGpus::Mig("1g.10gb+me".into())));
        let mut frac = gpu_pod(json!({"limits": {"nvidia.com/gpu.shared": "1"}}));
        assert!(gpus_of(&frac).unwrap_err().contains(ANNOTATION_FRACTION));
        frac.metadata.annotations = Some(BTreeMap::from([(ANNOTATION_FRACTION.to_string(), "0.25".to_string())]));
        assert_eq!(gpus_of(&frac).unwrap(), Some(NativeGpus::Fraction(250)));
        let none = gpu_pod(json!({"limits": {"cpu": "1"}}));
        assert_eq!(gpus_of(&none).unwrap(), None);
        let mixed = gpu_pod(json!({"limits": {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "1"}}));
        assert!(gpus_of(&mixed).unwrap_err().contains("one shape"));
        let two_mig = gpu_pod(json!({"limits": {"nvidia.com/mig-1g.10gb": "2"}}));
        assert!(gpus_of(&two_mig).unwrap_err().contains("one instance"));
        for bad in ["0", "1", "1.5", "x", "-0.2"] {
            assert!(parse_fraction(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_fraction("250m"), Ok(250));
        assert_eq!(parse_fraction("50%"), Ok(500));
    }

    #[test]
    fn what_crosses_a_tenant_boundary_is_refused_with_what_to_do() {
        let p = pod(json!({"metadata": {"name": "x"}, "spec": {
            "nodeName": "h100-0", "hostNetwork": true, "hostPID": true,
            "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
            "securityContext": {"runAsUser": 0},
            "containers": [{"name": "main", "image": "busybox",
                "securityContext": {"privileged": true, "allowPrivilegeEscalation": true,
                    "capabilities": {"add": ["SYS_ADMIN", "NET_BIND_SERVICE"]}},
                "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}));
        let v = violations(&p).join("\n");
        for needle in [
            "spec.nodeName is set",
            "hostNetwork",
            "hostPID",
            "hostPath",
            "runAsUser is 0",
            "privileged",
            "privilege escalation",
            "SYS_ADMIN",
        ] {
            assert!(v.contains(needle), "{needle} missing from {v}");
        }
        assert!(
            v.contains("adds capabilities SYS_ADMIN:"),
            "NET_BIND_SERVICE may be added: {v}"
        );
        match review_pod(&p, "tessera-acme-ml", Some(("acme", "ml")), &rules()) {
            NativeReview::Refuse(why) => assert!(why.contains("remove it"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn where_a_pod_is_decides_whether_it_is_tesseras() {
        let r = rules();
        let gpu = gpu_pod(json!({"limits": {"nvidia.com/gpu": "1"}}));
        let plain = gpu_pod(json!({"limits": {"cpu": "1"}}));
        assert_eq!(
            review_pod(&plain, "tessera-acme-ml", Some(("acme", "ml")), &r),
            NativeReview::Pass
        );
        assert_eq!(review_pod(&plain, "default", None, &r), NativeReview::Pass);
        assert_eq!(review_pod(&gpu, "gpu-operator", None, &r), NativeReview::Pass);
        match review_pod(&gpu, "default", None, &r) {
            NativeReview::Refuse(why) => assert!(why.contains("not one"), "{why}"),
            other => panic!("{other:?}"),
        }
        match review_pod(&gpu, "tessera-acme-ml", Some(("acme", "ml")), &r) {
            NativeReview::Ask(a) => {
                assert_eq!(
                    (a.tenant.as_str(), a.project.as_str(), a.name.as_str()),
                    ("acme", "ml", "train")
                );
                assert_eq!(a.gpus, NativeGpus::Whole(1));
                assert!(!a.batch);
            }
            other => panic!("{other:?}"),
        }
        let mut named = plain.clone();
        named.spec.as_mut().unwrap().scheduler_name = Some(SCHEDULER_NAME.into());
        assert!(matches!(
            review_pod(&named, "tessera-acme-ml", Some(("acme", "ml")), &r),
            NativeReview::Refuse(_)
        ));
    }

    #[test]
    fn the_mutation_makes_tessera_the_scheduler_and_strips_tesseras_labels() {
        let mut p = gpu_pod(json!({"limits": {"nvidia.com/gpu": "1"}}));
        p.metadata.labels = Some(BTreeMap::from([
            (LABEL_WORKLOAD.to_string(), "2".to_string()),
            (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
            ("app".to_string(), "x".to_string()),
        ]));
        let ops = mutation(&p);
        let mut doc = serde_json::to_value(&p).unwrap();
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).unwrap();
        json_patch::patch(&mut doc, &patch).unwrap();
        let after: Pod = serde_json::from_value(doc).unwrap();
        let spec = after.spec.unwrap();
        assert_eq!(spec.scheduler_name.as_deref(), Some(SCHEDULER_NAME));
        let sc = spec.security_context.unwrap();
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.seccomp_profile.unwrap().type_, "RuntimeDefault");
        let csc = spec.containers[0].security_context.clone().unwrap();
        assert_eq!(csc.allow_privilege_escalation, Some(false));
        assert_eq!(csc.capabilities.unwrap().drop, Some(vec!["ALL".to_string()]));
        let labels = after.metadata.labels.unwrap();
        assert_eq!(labels.keys().collect::<Vec<_>>(), vec!["app"]);
    }

    #[test]
    fn answers_are_admission_reviews() {
        let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "tessera-acme-ml", "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": serde_json::to_value(gpu_pod(json!({"limits": {"nvidia.com/gpu": "1"}}))).unwrap()}});
        let req = parse(&serde_json::to_vec(&body).unwrap()).unwrap();
        assert!(reviewed(&req, &rules()));
        let no: Value = serde_json::from_slice(&answer(&req, Some("no"), Vec::new())).unwrap();
        assert_eq!(no["response"]["uid"], "u-1");
        assert_eq!(no["response"]["allowed"], false);
        assert_eq!(no["response"]["status"]["message"], "Tessera: no");
        let yes: Value = serde_json::from_slice(&answer(&req, None, mutation(req.object.as_ref().unwrap()))).unwrap();
        assert_eq!(yes["response"]["allowed"], true);
        assert_eq!(yes["response"]["patchType"], "JSONPatch");
        assert!(parse(b"{}").is_err());
        let mut tessera = rules();
        tessera.tessera_user = Some("alice".into());
        assert!(!reviewed(&req, &tessera));
    }
}
