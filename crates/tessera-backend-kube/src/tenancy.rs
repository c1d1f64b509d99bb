//! Tenancy in the cluster: per tenant project a Namespace, a ResourceQuota mirroring Tessera's
//! quota on device-plugin resources (defence in depth), a RoleBinding giving the tenant's SSO
//! groups the `edit` ClusterRole in that namespace only, and a NetworkPolicy admitting traffic
//! from the tenant's own namespaces and from namespaces no tenant owns (cluster services), so
//! other tenants' namespaces are denied. All applied with server-side apply under the field
//! manager `tessera` (forced, so drift is repaired on every reconcile).

use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use tessera_backend::{BackendError, TenancySpec};

use crate::names::{self, FIELD_MANAGER, LABEL_MANAGED_BY, LABEL_PROJECT, LABEL_TENANT, MANAGED_BY};

pub const QUOTA_NAME: &str = "tessera-quota";
pub const ROLEBINDING_NAME: &str = "tessera-tenant";
pub const NETPOL_NAME: &str = "tessera-tenant-isolation";
/// The ClusterRole bound to the tenant's groups in their namespaces.
pub const TENANT_CLUSTER_ROLE: &str = "edit";
/// The RoleBinding giving Tessera itself, in a tenant namespace only, what it needs to run
/// workloads there ([`WORKLOADS_CLUSTER_ROLE`]).
pub const WORKLOADS_BINDING_NAME: &str = "tessera-workloads";
/// The ClusterRole (`deploy/kubernetes/20-rbac.yaml`) with what Tessera does inside a tenant
/// namespace: create, bind, evict and delete pods, read their logs, a gang's Service, Events,
/// and delete the namespace itself. Bound per namespace, so Tessera cannot create a pod in
/// `kube-system` or delete a namespace it does not manage.
pub const WORKLOADS_CLUSTER_ROLE: &str = "tessera-workloads";
/// How long [`ensure`] waits for the quota controller to take up a changed quota.
pub const QUOTA_STATUS_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// The objects of a tenant project, as apply patches.
pub struct TenancyObjects {
    pub namespace: Value,
    pub quota: Value,
    pub role_binding: Value,
    pub network_policy: Value,
    /// Tessera's own binding there, when Tessera knows its identity.
    pub workloads_binding: Option<Value>,
}

/// Tessera's own identity on the cluster, as a RoleBinding subject: a service account
/// (`NAMESPACE/NAME`, as `deploy/kubernetes` runs it) or a user name.
pub fn subject(identity: &str) -> Value {
    match identity.split_once('/') {
        Some((ns, name)) => json!({"kind": "ServiceAccount", "name": name, "namespace": ns}),
        None => json!({"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": identity}),
    }
}

/// Tessera's own RoleBinding in a tenant namespace.
pub fn workloads_binding(spec: &TenancySpec, ns: &str, identity: &str) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": WORKLOADS_BINDING_NAME, "namespace": ns, "labels": labels(spec)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": WORKLOADS_CLUSTER_ROLE},
        "subjects": [subject(identity)],
    })
}

fn labels(spec: &TenancySpec) -> Value {
    json!({
        LABEL_TENANT: names::label_value(&spec.tenant),
        LABEL_PROJECT: names::label_value(&spec.project),
        LABEL_MANAGED_BY: MANAGED_BY,
    })
}

/// The Pod Security Standard every tenant namespace enforces. `restricted` is enough for GPU
/// work: the device plugin gives a pod its GPUs through the container runtime (device nodes and
/// driver files injected by the NVIDIA Container Toolkit), so a GPU pod needs no privilege, host
/// path, host namespace or added capability; Tessera's own pods meet it
/// ([`crate::pods::attempt_pod_for`]). API servers before 1.23 ignore the labels.
pub const POD_SECURITY_LEVEL: &str = "restricted";

/// A tenant namespace's labels: Tessera's, and the Pod Security admission's (enforce, audit
/// and warn at [`POD_SECURITY_LEVEL`]).
fn namespace_labels(spec: &TenancySpec) -> Value {
    let mut l = labels(spec);
    for mode in ["enforce", "audit", "warn"] {
        l[format!("pod-security.kubernetes.io/{mode}")] = json!(POD_SECURITY_LEVEL);
    }
    l
}

/// The objects for `spec` in namespace `ns` (Tessera's own binding for `identity`, if given).
pub fn objects(spec: &TenancySpec, ns: &str) -> TenancyObjects {
    objects_for(spec, ns, None)
}

/// [`objects`], with Tessera's own binding when `identity` is known.
pub fn objects_for(spec: &TenancySpec, ns: &str, identity: Option<&str>) -> TenancyObjects {
    let hard: serde_json::Map<String, Value> = spec
        .quota
        .iter()
        .map(|(res, n)| (format!("requests.{res}"), json!(n.to_string())))
        .collect();
    let subjects: Vec<Value> = spec
        .groups
        .iter()
        .map(|g| json!({"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": g}))
        .collect();
    TenancyObjects {
        workloads_binding: identity.map(|i| workloads_binding(spec, ns, i)),
        namespace: json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns, "labels": namespace_labels(spec)},
        }),
        quota: json!({
            "apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": QUOTA_NAME, "namespace": ns, "labels": labels(spec)},
            "spec": {"hard": hard},
        }),
        role_binding: json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": ROLEBINDING_NAME, "namespace": ns, "labels": labels(spec)},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": TENANT_CLUSTER_ROLE},
            "subjects": subjects,
        }),
        network_policy: json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": NETPOL_NAME, "namespace": ns, "labels": labels(spec)},
            "spec": {
                "podSelector": {},
                "policyTypes": ["Ingress"],
                "ingress": [{"from": [
                    {"namespaceSelector": {"matchLabels": {LABEL_TENANT: names::label_value(&spec.tenant)}}},
                    {"namespaceSelector": {"matchExpressions": [{"key": LABEL_TENANT, "operator": "DoesNotExist"}]}},
                ]}],
            },
        }),
    }
}

pub(crate) fn kube_err(what: &str, e: kube::Error) -> BackendError {
    match e {
        kube::Error::Api(s) if (400..500).contains(&s.code) && s.code != 429 => {
            BackendError::Rejected(format!("{what}: {} ({})", s.message, s.code))
        }
        other => BackendError::Unreachable(format!("{what}: {other}")),
    }
}

/// Applies the objects of `spec` (idempotent; forced, so drift is repaired). Returns the
/// namespace.
pub async fn ensure(
    client: &kube::Client,
    prefix: &str,
    identity: Option<&str>,
    spec: &TenancySpec,
) -> Result<String, BackendError> {
    let ns = names::namespace(prefix, &spec.tenant, &spec.project);
    let o = objects_for(spec, &ns, identity);
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let namespaces = Api::<Namespace>::all(client.clone());
    // Never take over a namespace that carries another tenant project's labels (a name
    // collision): the forced apply would relabel it and hand it to this tenant.
    if let Some(existing) = namespaces
        .get_opt(&ns)
        .await
        .map_err(|e| kube_err(&format!("namespace {ns}"), e))?
    {
        check_owner(&ns, existing.metadata.labels.as_ref(), spec)?;
    }
    namespaces
        .patch(&ns, &pp, &Patch::Apply(&o.namespace))
        .await
        .map_err(|e| kube_err(&format!("namespace {ns}"), e))?;
    if let Some(b) = &o.workloads_binding {
        Api::<RoleBinding>::namespaced(client.clone(), &ns)
            .patch(WORKLOADS_BINDING_NAME, &pp, &Patch::Apply(b))
            .await
            .map_err(|e| kube_err(&format!("Tessera's role binding in {ns}"), e))?;
    }
    let quotas = Api::<ResourceQuota>::namespaced(client.clone(), &ns);
    quotas
        .patch(QUOTA_NAME, &pp, &Patch::Apply(&o.quota))
        .await
        .map_err(|e| kube_err(&format!("resource quota in {ns}"), e))?;
    Api::<RoleBinding>::namespaced(client.clone(), &ns)
        .patch(ROLEBINDING_NAME, &pp, &Patch::Apply(&o.role_binding))
        .await
        .map_err(|e| kube_err(&format!("role binding in {ns}"), e))?;
    Api::<NetworkPolicy>::namespaced(client.clone(), &ns)
        .patch(NETPOL_NAME, &pp, &Patch::Apply(&o.network_policy))
        .await
        .map_err(|e| kube_err(&format!("network policy in {ns}"), e))?;
    // The API server enforces a quota only once the quota controller has filled its status
    // (1-4 s after a change): until then a pod over it would be admitted.
    let deadline = tokio::time::Instant::now() + QUOTA_STATUS_WAIT;
    loop {
        let q = quotas
            .get(QUOTA_NAME)
            .await
            .map_err(|e| kube_err(&format!("resource quota in {ns}"), e))?;
        let want = q.spec.and_then(|s| s.hard).unwrap_or_default();
        let have = q.status.and_then(|s| s.hard).unwrap_or_default();
        if want == have {
            return Ok(ns);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(BackendError::Unreachable(format!(
                "the quota controller has not taken up the resource quota in {ns} within {} s",
                QUOTA_STATUS_WAIT.as_secs()
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Refuses a namespace labelled for another tenant project.
/// Whether a pod's tenant and project labels are those of the namespace it is in (a
/// namespace's labels are written by Tessera, which tenants cannot change; a pod's labels are
/// the tenant's to write).
pub(crate) fn same_owner(
    namespace_labels: Option<&std::collections::BTreeMap<String, String>>,
    pod_labels: Option<&std::collections::BTreeMap<String, String>>,
) -> bool {
    let get = |l: Option<&std::collections::BTreeMap<String, String>>, k: &str| l.and_then(|l| l.get(k)).cloned();
    let ns = (
        get(namespace_labels, LABEL_TENANT),
        get(namespace_labels, LABEL_PROJECT),
    );
    ns.0.is_some() && ns.1.is_some() && ns == (get(pod_labels, LABEL_TENANT), get(pod_labels, LABEL_PROJECT))
}

pub(crate) fn check_owner(
    ns: &str,
    labels: Option<&std::collections::BTreeMap<String, String>>,
    spec: &TenancySpec,
) -> Result<(), BackendError> {
    let get = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    let (t, p) = (get(LABEL_TENANT), get(LABEL_PROJECT));
    let want = (names::label_value(&spec.tenant), names::label_value(&spec.project));
    match (t, p) {
        (None, None) => Ok(()),
        (Some(t), Some(p)) if t == want.0 && p == want.1 => Ok(()),
        _ => Err(BackendError::Rejected(format!(
            "namespace {ns} belongs to tenant {} project {}, not {}/{}: refusing to take it over",
            t.unwrap_or("-"),
            p.unwrap_or("-"),
            spec.tenant,
            spec.project
        ))),
    }
}

/// Deletes the namespace of one project, or of every project of `tenant` (the namespace's
/// deletion removes what is in it). Idempotent.
pub async fn remove(
    client: &kube::Client,
    prefix: &str,
    tenant: &str,
    project: Option<&str>,
) -> Result<Vec<String>, BackendError> {
    let api = Api::<Namespace>::all(client.clone());
    let targets: Vec<String> = match project {
        Some(p) => vec![names::namespace(prefix, tenant, p)],
        None => api
            .list(&ListParams::default().labels(&format!(
                "{LABEL_TENANT}={},{LABEL_MANAGED_BY}={MANAGED_BY}",
                names::label_value(tenant)
            )))
            .await
            .map_err(|e| kube_err("listing the tenant's namespaces", e))?
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect(),
    };
    for ns in &targets {
        match api.delete(ns, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(kube_err(&format!("deleting namespace {ns}"), e)),
        }
    }
    Ok(targets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_project_gets_quota_rbac_and_isolation() {
        let spec = TenancySpec {
            tenant: "acme".into(),
            project: "vision".into(),
            groups: vec!["acme-ml".into()],
            quota: BTreeMap::from([("nvidia.com/gpu".into(), 16), ("nvidia.com/mig-3g.40gb".into(), 4)]),
        };
        let o = objects(&spec, "tessera-acme-vision");
        assert_eq!(o.quota["spec"]["hard"]["requests.nvidia.com/gpu"], "16");
        assert_eq!(o.quota["spec"]["hard"]["requests.nvidia.com/mig-3g.40gb"], "4");
        assert_eq!(o.role_binding["subjects"][0]["name"], "acme-ml");
        assert_eq!(o.role_binding["roleRef"]["name"], "edit");
        let from = &o.network_policy["spec"]["ingress"][0]["from"];
        assert_eq!(from[0]["namespaceSelector"]["matchLabels"]["tessera.io/tenant"], "acme");
        assert_eq!(
            from[1]["namespaceSelector"]["matchExpressions"][0]["operator"],
            "DoesNotExist"
        );
        // A namespace of another pair is never taken over; an unlabelled one (made by hand
        // before Tessera) or its own is.
        let own = BTreeMap::from([
            ("tessera.io/tenant".to_string(), "acme".to_string()),
            ("tessera.io/project".to_string(), "vision".to_string()),
        ]);
        assert!(check_owner("n", Some(&own), &spec).is_ok());
        assert!(check_owner("n", None, &spec).is_ok());
        let mut theirs = own.clone();
        theirs.insert("tessera.io/tenant".into(), "acme-vision".into());
        let e = check_owner("n", Some(&theirs), &spec).unwrap_err();
        assert!(e.to_string().contains("belongs to tenant acme-vision"), "{e}");
        // The typed objects accept what is applied.
        let _: Namespace = serde_json::from_value(o.namespace).unwrap();
        let _: NetworkPolicy = serde_json::from_value(o.network_policy).unwrap();
    }
}
