//! Keeps a backend's own tenancy (on Kubernetes: a namespace, quota, role binding and network
//! policy per tenant project) in line with Tessera's tenants, projects, quotas and single
//! sign-on groups. Level-triggered: every reconcile period, and at once when a project is
//! created; drift on the backend's side is repaired by the next pass. Projects and tenants that
//! are deleted are removed from the backend by the delete handlers.
//!
//! Quotas are mirrored as defence in depth, per project namespace: a tenant's limit on a
//! `whole` pool (or a model in it) becomes `requests.nvidia.com/gpu`; on a `mig` pool, for each
//! MIG profile of the pool's models, `requests.nvidia.com/mig-<profile>` is the number of such
//! instances the limit alone would allow; on a `shared` (time-sliced) pool, where a fraction is
//! one replica whatever its size, every replica the pool advertises (`shared:<pool>`, turned
//! into replicas by the backend), so a fraction within Tessera's quota is never refused by the
//! API server. Tessera's own admission stays the exact check (the
//! cluster cannot express one limit shared by several profiles or namespaces); project
//! sub-quotas (`project:NAME`) and unlimited classes are not mirrored.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tessera_backend::{Backend, TenancySpec};
use tessera_model::{Fleet, Sharing};
use tessera_store::{QuotaRecord, Store};
use tokio::sync::Notify;

use crate::oidc::ClaimRule;

/// A quota key that names a time-sliced pool rather than a device-plugin resource
/// (`shared:<pool>`): a backend that mirrors quotas turns it into the replicas the pool's
/// device plugins advertise, under the resource names they use.
pub const SHARED_POOL: &str = tessera_backend::SHARED_POOL_QUOTA;

/// The device-plugin quota of one tenant project.
pub fn quota_of(tenant: &str, quotas: &[QuotaRecord], fleet: &Fleet) -> BTreeMap<String, u64> {
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    for q in quotas.iter().filter(|q| q.tenant == tenant) {
        let Some(limit) = q.limit_milli else { continue };
        if q.class.starts_with("project:") {
            continue;
        }
        let (pool_name, model) = match q.class.split_once('/') {
            Some((p, m)) => (p, Some(m)),
            None => (q.class.as_str(), None),
        };
        let Some((pi, pool)) = fleet.pools.iter().enumerate().find(|(_, p)| p.name == pool_name) else {
            continue;
        };
        let mut models: Vec<_> = fleet
            .nodes
            .iter()
            .filter(|n| n.pool.0 as usize == pi)
            .map(|n| n.model)
            .filter(|m| model.is_none_or(|want| fleet.catalogue.find(want) == Some(*m)))
            .collect();
        models.sort();
        models.dedup();
        match pool.sharing {
            Sharing::Mig => {
                let mut per_profile: BTreeMap<String, u64> = BTreeMap::new();
                for m in models {
                    let gm = fleet.catalogue.get(m);
                    let Some(geom) = gm.mig else { continue };
                    for p in geom.profiles {
                        // An instance counts its share of the GPU's memory slices, in milli-units.
                        let unit = 1000 * p.mem_slices as u64 / geom.mem_slices as u64;
                        let name = format!("nvidia.com/mig-{}", gm.profile_name(p).replace('+', "."));
                        let n = limit / unit.max(1);
                        let e = per_profile.entry(name).or_default();
                        *e = (*e).max(n);
                    }
                }
                for (k, n) in per_profile {
                    *out.entry(k).or_default() += n;
                }
            }
            // A fraction is one time-sliced replica to the device plugin whatever its size, so
            // a limit in GPU units says nothing about replicas: the backend counts the pool's
            // advertised replicas instead (`shared:<pool>`, see `SHARED_POOL`), and Tessera's
            // own quota decides.
            Sharing::Shared => *out.entry(format!("{SHARED_POOL}{}", pool.name)).or_default() += limit / 1000,
            Sharing::Whole => *out.entry("nvidia.com/gpu".into()).or_default() += limit / 1000,
        }
    }
    out
}

/// The single sign-on groups mapped to `tenant` (rules on the `groups` claim).
pub fn groups_of(tenant: &str, rules: &[ClaimRule]) -> Vec<String> {
    let mut g: Vec<String> = rules
        .iter()
        .filter(|r| r.claim == "groups" && r.tenant.as_deref() == Some(tenant))
        .map(|r| r.value.clone())
        .collect();
    g.sort();
    g.dedup();
    g
}

/// Every tenant project as the backend should isolate it.
pub async fn specs(store: &dyn Store, fleet: &Fleet, rules: &[ClaimRule]) -> Result<Vec<TenancySpec>, String> {
    let quotas = store.quotas().await.map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let tenants = store
            .list_tenants(after.as_deref(), 200)
            .await
            .map_err(|e| e.to_string())?;
        let Some(last) = tenants.last() else { break };
        after = Some(last.name.clone());
        for t in &tenants {
            let quota = quota_of(&t.name, &quotas, fleet);
            let groups = groups_of(&t.name, rules);
            let mut pafter: Option<String> = None;
            loop {
                let projects = store
                    .list_projects(&t.name, pafter.as_deref(), 200)
                    .await
                    .map_err(|e| e.to_string())?;
                let Some(last) = projects.last() else { break };
                pafter = Some(last.name.clone());
                out.extend(projects.into_iter().map(|p| TenancySpec {
                    tenant: t.name.clone(),
                    project: p.name,
                    groups: groups.clone(),
                    quota: quota.clone(),
                }));
            }
        }
    }
    Ok(out)
}

/// Runs the sync every `every` and whenever `poke` is notified, until the server stops, on the
/// fleet as it is at each run (quotas per pool follow nodes that join or leave).
pub fn spawn(
    store: Arc<dyn Store>,
    backend: Arc<dyn Backend>,
    fleet: crate::lifecycle::FleetCell,
    rules: Vec<ClaimRule>,
    every: Duration,
    poke: Arc<Notify>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            match specs(store.as_ref(), &fleet.get(), &rules).await {
                Ok(all) => {
                    for s in &all {
                        if let Err(e) = backend.ensure_tenancy(s).await {
                            tracing::warn!(tenant = %s.tenant, project = %s.project, error = %e, "tenancy sync");
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "tenancy sync: reading tenants"),
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = poke.notified() => {}
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(tenant: &str, class: &str, limit: Option<u64>) -> QuotaRecord {
        QuotaRecord {
            tenant: tenant.into(),
            class: class.into(),
            guaranteed_milli: 0,
            limit_milli: limit,
        }
    }

    #[test]
    fn quotas_mirror_as_device_plugin_resources() {
        let fleet = Fleet::seed();
        let quotas = [
            q("acme", "training", Some(16_000)),
            q("acme", "serving", Some(4_000)),
            q("acme", "development", None),
            q("globex", "training", Some(99_000)),
        ];
        let m = quota_of("acme", &quotas, &fleet);
        assert_eq!(m["nvidia.com/gpu"], 16);
        // Serving is the seed fleet's MIG pool of A100 80GB: 4 GPUs' worth of 3g.40gb is 8.
        assert_eq!(m["nvidia.com/mig-3g.40gb"], 8);
        assert_eq!(m["nvidia.com/mig-7g.80gb"], 4);
        assert!(quota_of("nobody", &quotas, &fleet).is_empty());
    }

    #[test]
    fn a_time_sliced_pool_is_mirrored_as_its_replicas_not_as_whole_gpus() {
        // A fraction is one replica to the device plugin whatever its size: 1.45 units of
        // fractions can be 8 pods, so `requests.nvidia.com/gpu = 4` would refuse them.
        let fleet = Fleet::seed();
        let m = quota_of("acme", &[q("acme", "development", Some(4_000))], &fleet);
        assert!(!m.contains_key("nvidia.com/gpu"), "{m:?}");
        assert_eq!(m[&format!("{SHARED_POOL}development")], 4);
    }

    #[test]
    fn groups_come_from_the_groups_claim_rules_of_the_tenant() {
        let rule = |claim: &str, value: &str, tenant: Option<&str>| ClaimRule {
            claim: claim.into(),
            value: value.into(),
            tenant: tenant.map(Into::into),
            role: "member".into(),
        };
        let rules = [
            rule("groups", "acme-ml", Some("acme")),
            rule("groups", "acme-admins", Some("acme")),
            rule("email", "x@acme.example", Some("acme")),
            rule("groups", "globex", Some("globex")),
        ];
        assert_eq!(groups_of("acme", &rules), vec!["acme-admins", "acme-ml"]);
    }
}
