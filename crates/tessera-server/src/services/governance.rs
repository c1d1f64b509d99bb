//! Quotas and budgets: stored, then handed to the lifecycle loop's scheduler; reads come from
//! the published snapshot. The API ([`crate::http::governance`]) and the console both call
//! these.

use tessera_api::rules::Validate;
use tessera_api::{BudgetView, QuotaView, SetBudget, SetQuota, TenantQuotas};
use tessera_model::GpuUnits;
use tessera_sched::cycle::Quota;

use super::lifecycle_error;
use super::tenancy::tenant_visible;
use crate::auth::Identity;
use crate::clock::now_ms;
use crate::lifecycle::Governance;
use crate::problem::{ApiError, ApiResult};
use crate::state::AppState;

/// Checks a resource class name: a pool, `pool/MODEL` with that model in the pool, or
/// `project:NAME` (a sub-quota of one project across pools).
pub(crate) fn check_class(s: &AppState, class: &str) -> ApiResult<()> {
    if class.starts_with("project:") {
        // Checked against the tenant's projects by the caller.
        return Ok(());
    }
    let (pool, model) = match class.split_once('/') {
        Some((p, m)) => (p, Some(m)),
        None => (class, None),
    };
    let fleet = s.fleet();
    let Some(pid) = fleet.pool_by_name(pool) else {
        let names: Vec<&str> = fleet.pools.iter().map(|p| p.name.as_str()).collect();
        return Err(ApiError::invalid(
            "class",
            format!("unknown pool `{pool}` (pools: {})", names.join(", ")),
        ));
    };
    if let Some(m) = model {
        let p = fleet.pool(pid);
        let has = fleet.nodes[p.nodes.start as usize..p.nodes.end as usize]
            .iter()
            .any(|n| fleet.catalogue.get(n.model).name == m);
        if !has {
            return Err(ApiError::invalid("class", format!("pool `{pool}` has no {m} GPUs")));
        }
    }
    Ok(())
}

/// Thousandths of a GPU unit (the value is within [`tessera_api::rules::UNITS`]).
pub(crate) fn units_milli(field: &str, v: f64) -> ApiResult<u64> {
    let m = (v * 1000.0).round();
    if (m - v * 1000.0).abs() > 1e-6 {
        return Err(ApiError::invalid(
            field,
            format!("{v}: GPU units have at most three decimals"),
        ));
    }
    Ok(m as u64)
}

/// A tenant's quotas (with use and borrowing) and budget.
pub async fn quotas(s: &AppState, id: &Identity, tenant: &str) -> ApiResult<TenantQuotas> {
    tenant_visible(s, id, tenant).await?;
    let snap = s.lifecycle.snapshot();
    let t = snap.tenants.get(tenant).cloned().unwrap_or_default();
    let mut quotas: Vec<QuotaView> = t
        .quotas
        .iter()
        .map(|(class, q, used)| {
            let borrowed = if *used > q.guaranteed {
                *used - q.guaranteed
            } else {
                GpuUnits::ZERO
            };
            QuotaView {
                class: class.clone(),
                guaranteed: q.guaranteed.as_f64(),
                limit: q.limit.map(|l| l.as_f64()),
                used: used.as_f64(),
                borrowed: borrowed.as_f64(),
            }
        })
        .collect();
    quotas.sort_by(|a, b| a.class.cmp(&b.class));
    let budget = t.budget.map(|(b, spent)| BudgetView {
        monthly_unit_hours: b,
        spent_unit_hours: spent,
        remaining_unit_hours: (b - spent).max(0.0),
    });
    Ok(TenantQuotas {
        tenant: tenant.to_string(),
        quotas,
        budget,
    })
}

/// Sets a tenant's quota for a resource class (platform-admin).
pub async fn set_quota(s: &AppState, id: &Identity, tenant: &str, class: &str, b: &SetQuota) -> ApiResult<QuotaView> {
    id.require_admin()?;
    b.validate()?;
    tenant_visible(s, id, tenant).await?;
    check_class(s, class)?;
    if let Some(project) = class.strip_prefix("project:")
        && s.store.get_project(tenant, project).await?.is_none()
    {
        return Err(ApiError::invalid(
            "class",
            format!("tenant `{tenant}` has no project `{project}`"),
        ));
    }
    let g = units_milli("guaranteed", b.guaranteed)?;
    let l = b.limit.map(|l| units_milli("limit", l)).transpose()?;
    s.store
        .set_quota(
            &tessera_store::QuotaRecord {
                tenant: tenant.to_string(),
                class: class.to_string(),
                guaranteed_milli: g,
                limit_milli: l,
            },
            now_ms(),
        )
        .await?;
    let quota = Quota {
        guaranteed: GpuUnits(g),
        limit: l.map(GpuUnits),
    };
    s.lifecycle
        .govern(Governance::Quota {
            tenant: tenant.to_string(),
            class: class.to_string(),
            quota: Some(quota),
        })
        .await
        .map_err(lifecycle_error)?;
    tracing::info!(%tenant, %class, guaranteed = b.guaranteed, limit = ?b.limit, actor = %id.actor, "quota set");
    Ok(QuotaView {
        class: class.to_string(),
        guaranteed: GpuUnits(g).as_f64(),
        limit: l.map(|l| GpuUnits(l).as_f64()),
        used: 0.0,
        borrowed: 0.0,
    })
}

/// Removes a tenant's quota for a class (platform-admin).
pub async fn delete_quota(s: &AppState, id: &Identity, tenant: &str, class: &str) -> ApiResult<()> {
    id.require_admin()?;
    tenant_visible(s, id, tenant).await?;
    if !s.store.delete_quota(tenant, class).await? {
        return Err(ApiError::not_found(format!(
            "tenant `{tenant}` has no quota for `{class}`"
        )));
    }
    s.lifecycle
        .govern(Governance::Quota {
            tenant: tenant.to_string(),
            class: class.to_string(),
            quota: None,
        })
        .await
        .map_err(lifecycle_error)
}

/// Sets or removes a tenant's monthly GPU-unit-hour budget (platform-admin).
pub async fn set_budget(s: &AppState, id: &Identity, tenant: &str, b: &SetBudget) -> ApiResult<()> {
    id.require_admin()?;
    b.validate()?;
    tenant_visible(s, id, tenant).await?;
    s.store.set_budget(tenant, b.monthly_unit_hours, now_ms()).await?;
    s.lifecycle
        .govern(Governance::Budget {
            tenant: tenant.to_string(),
            unit_hours: b.monthly_unit_hours,
        })
        .await
        .map_err(lifecycle_error)
}
