//! Tenants and their projects, and the priority classes a tenant is granted.

use axum::http::StatusCode;
use tessera_api::rules::Validate;
use tessera_api::{CreateProject, CreateTenant, Project, SetPriorities, Tenant, rfc3339_ms, rules};
use tessera_store::{AuditRecord, ProjectRecord, TenantRecord};

use crate::auth::{Identity, Role};
use crate::clock::now_ms;
use crate::problem::{ApiError, ApiResult};
use crate::state::AppState;

/// The priority classes a tenant may use: its grant, or the default grant (`standard` and
/// `opportunistic`, those of them the server knows).
pub fn granted(s: &AppState, t: &TenantRecord) -> Vec<String> {
    match &t.priorities {
        Some(p) => p.clone(),
        None => rules::DEFAULT_PRIORITIES
            .iter()
            .filter(|p| s.priorities.iter().any(|k| k == *p))
            .map(|p| p.to_string())
            .collect(),
    }
}

/// A grant as the platform admin wrote it, each class known to the server (422 naming the
/// entry otherwise).
pub fn check_grant(s: &AppState, field: &str, classes: &[String]) -> ApiResult<()> {
    for (i, c) in classes.iter().enumerate() {
        if !s.priorities.contains(c) {
            return Err(ApiError::invalid(
                format!("{field}[{i}]"),
                format!(
                    "unknown priority class `{c}`: the classes are {}",
                    s.priorities.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

pub fn tenant_view(s: &AppState, t: TenantRecord) -> Tenant {
    Tenant {
        priorities: granted(s, &t),
        name: t.name,
        display_name: t.display_name,
        created_at: rfc3339_ms(t.created_at),
    }
}

pub fn project_view(p: ProjectRecord) -> Project {
    Project {
        tenant: p.tenant,
        name: p.name,
        created_at: rfc3339_ms(p.created_at),
    }
}

/// The tenant, if the caller may see it (others answer 404, so existence does not leak).
pub async fn tenant_visible(s: &AppState, id: &Identity, tenant: &str) -> ApiResult<TenantRecord> {
    if !id.can_read(tenant) {
        return Err(ApiError::not_found(format!("no tenant `{tenant}`")));
    }
    s.store
        .get_tenant(tenant)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no tenant `{tenant}`")))
}

/// Creates a tenant (platform-admin).
pub async fn create_tenant(s: &AppState, id: &Identity, b: CreateTenant) -> ApiResult<Tenant> {
    id.require_admin()?;
    b.validate()?;
    if let Some(p) = &b.priorities {
        check_grant(s, "priorities", p)?;
    }
    let t = TenantRecord {
        display_name: b.display_name.clone().unwrap_or_else(|| b.name.clone()),
        name: b.name,
        created_at: now_ms(),
        priorities: b.priorities,
    };
    s.store.create_tenant(&t).await?;
    tracing::info!(tenant = %t.name, actor = %id.actor, "tenant created");
    Ok(tenant_view(s, t))
}

/// Grants a tenant the priority classes its workloads may use (platform-admin): exactly those
/// listed, or the default grant for `None`. The audit record (request `request_id`), which
/// names the grant before and after, commits with the change.
pub async fn set_priorities(
    s: &AppState,
    id: &Identity,
    request_id: String,
    tenant: &str,
    b: &SetPriorities,
) -> ApiResult<Tenant> {
    let before = tenant_visible(s, id, tenant).await?;
    if !id.is_admin() {
        return Err(ApiError::forbidden(
            "granting priority classes needs a platform-admin token",
        ));
    }
    b.validate()?;
    if let Some(p) = &b.priorities {
        check_grant(s, "priorities", p)?;
    }
    let after = TenantRecord {
        priorities: b.priorities.clone(),
        ..before.clone()
    };
    let audit = AuditRecord {
        seq: 0,
        at: now_ms(),
        request_id,
        actor: id.actor.clone(),
        tenant: Some(tenant.to_string()),
        action: "PUT /api/v1/tenants/{tenant}/priorities".into(),
        target: format!("/api/v1/tenants/{tenant}/priorities"),
        outcome: StatusCode::OK.as_u16(),
        detail: format!(
            "priority classes {} → {}",
            granted(s, &before).join(", "),
            granted(s, &after).join(", ")
        ),
    };
    if !s
        .store
        .set_tenant_priorities(tenant, b.priorities.as_deref(), &audit)
        .await?
    {
        return Err(ApiError::not_found(format!("no tenant `{tenant}`")));
    }
    tracing::info!(%tenant, actor = %id.actor, detail = %audit.detail, "priority classes granted");
    Ok(tenant_view(s, after))
}

/// Deletes a tenant that has no projects, tokens or workloads (platform-admin).
pub async fn delete_tenant(s: &AppState, id: &Identity, tenant: &str) -> ApiResult<()> {
    id.require_admin()?;
    tenant_visible(s, id, tenant).await?;
    if !s.store.delete_tenant(tenant).await? {
        return Err(ApiError::conflict(format!(
            "tenant `{tenant}` still has projects, tokens or workloads; delete those first"
        )));
    }
    remove_backend_tenancy(s, tenant, None).await;
    Ok(())
}

/// Removes what the backend keeps for a deleted project or tenant (a Kubernetes namespace). The
/// record is gone already; a failure is logged and does not undo the deletion.
pub(crate) async fn remove_backend_tenancy(s: &AppState, tenant: &str, project: Option<&str>) {
    if let Err(e) = s.backend.remove_tenancy(tenant, project).await {
        tracing::warn!(%tenant, ?project, error = %e, "removing the backend's tenancy objects");
    }
}

/// Creates a project in a tenant (platform-admin or the tenant's admin).
pub async fn create_project(s: &AppState, id: &Identity, tenant: &str, b: CreateProject) -> ApiResult<Project> {
    tenant_visible(s, id, tenant).await?;
    if !(id.is_admin() || id.role == Role::TenantAdmin) {
        return Err(ApiError::forbidden(
            "creating projects needs a platform-admin or tenant-admin token",
        ));
    }
    b.validate()?;
    let p = ProjectRecord {
        tenant: tenant.to_string(),
        name: b.name,
        created_at: now_ms(),
    };
    s.store.create_project(&p).await?;
    // The backend's own tenancy (a Kubernetes namespace) follows at once, and on every sync.
    s.tenancy.notify_one();
    Ok(project_view(p))
}

/// Deletes a project without workloads on record (platform-admin or the tenant's admin).
pub async fn delete_project(s: &AppState, id: &Identity, tenant: &str, project: &str) -> ApiResult<()> {
    tenant_visible(s, id, tenant).await?;
    if !(id.is_admin() || id.role == Role::TenantAdmin) {
        return Err(ApiError::forbidden(
            "deleting projects needs a platform-admin or tenant-admin token",
        ));
    }
    if s.store.get_project(tenant, project).await?.is_none() {
        return Err(ApiError::not_found(format!(
            "no project `{project}` in tenant `{tenant}`"
        )));
    }
    if !s.store.delete_project(tenant, project).await? {
        return Err(ApiError::conflict(format!(
            "project `{project}` has workloads on record"
        )));
    }
    remove_backend_tenancy(s, tenant, Some(project)).await;
    Ok(())
}
