//! Tenants and their projects.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use tessera_api::{CreateProject, CreateTenant, Page, Problem, Project, Tenant, rfc3339_ms};
use tessera_store::{ProjectRecord, TenantRecord};

use super::{ApiJson, ApiPath, ApiQuery, PageParams, page};
use crate::auth::{Identity, Role};
use crate::problem::{ApiError, ApiResult};
use crate::{AppState, now_ms};

fn tenant_view(t: TenantRecord) -> Tenant {
    Tenant {
        name: t.name,
        display_name: t.display_name,
        created_at: rfc3339_ms(t.created_at),
    }
}

fn project_view(p: ProjectRecord) -> Project {
    Project {
        tenant: p.tenant,
        name: p.name,
        created_at: rfc3339_ms(p.created_at),
    }
}

/// Tenants (platform-admin: all; others: their own).
#[utoipa::path(get, path = "/api/v1/tenants", tag = "tenancy", params(PageParams), responses((status = 200, body = Page<Tenant>)))]
pub async fn list_tenants(
    State(s): State<AppState>,
    id: Identity,
    ApiQuery(p): ApiQuery<PageParams>,
) -> ApiResult<Json<Page<Tenant>>> {
    let l = p.limit();
    if !id.is_admin() {
        let own = match &id.tenant {
            Some(t) => s.store.get_tenant(t).await?.into_iter().map(tenant_view).collect(),
            None => vec![],
        };
        return Ok(Json(Page {
            items: own,
            next_cursor: None,
        }));
    }
    let items = s.store.list_tenants(p.cursor.as_deref(), l + 1).await?;
    Ok(Json(page(items.into_iter().map(tenant_view).collect(), l, |t| {
        t.name.clone()
    })))
}

/// Creates a tenant (platform-admin).
#[utoipa::path(post, path = "/api/v1/tenants", tag = "tenancy", request_body = CreateTenant,
    responses((status = 201, body = Tenant), (status = 409, body = Problem), (status = 422, body = Problem)))]
pub async fn create_tenant(
    State(s): State<AppState>,
    id: Identity,
    ApiJson(b): ApiJson<CreateTenant>,
) -> ApiResult<(StatusCode, Json<Tenant>)> {
    id.require_admin()?;
    let t = TenantRecord {
        display_name: b.display_name.clone().unwrap_or_else(|| b.name.clone()),
        name: b.name,
        created_at: now_ms(),
    };
    s.store.create_tenant(&t).await?;
    tracing::info!(tenant = %t.name, actor = %id.actor, "tenant created");
    Ok((StatusCode::CREATED, Json(tenant_view(t))))
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

#[utoipa::path(get, path = "/api/v1/tenants/{tenant}", tag = "tenancy", params(("tenant" = String, Path)),
    responses((status = 200, body = Tenant), (status = 404, body = Problem)))]
pub async fn get_tenant(
    State(s): State<AppState>,
    id: Identity,
    ApiPath(tenant): ApiPath<String>,
) -> ApiResult<Json<Tenant>> {
    Ok(Json(tenant_view(tenant_visible(&s, &id, &tenant).await?)))
}

/// Deletes a tenant that has no projects, tokens or workloads (platform-admin).
#[utoipa::path(delete, path = "/api/v1/tenants/{tenant}", tag = "tenancy", params(("tenant" = String, Path)),
    responses((status = 204), (status = 404, body = Problem), (status = 409, body = Problem)))]
pub async fn delete_tenant(
    State(s): State<AppState>,
    id: Identity,
    ApiPath(tenant): ApiPath<String>,
) -> ApiResult<StatusCode> {
    id.require_admin()?;
    tenant_visible(&s, &id, &tenant).await?;
    if !s.store.delete_tenant(&tenant).await? {
        return Err(ApiError::conflict(format!(
            "tenant `{tenant}` still has projects, tokens or workloads; delete those first"
        )));
    }
    remove_backend_tenancy(&s, &tenant, None).await;
    Ok(StatusCode::NO_CONTENT)
}

/// Removes what the backend keeps for a deleted project or tenant (a Kubernetes namespace). The
/// record is gone already; a failure is logged and does not undo the deletion.
async fn remove_backend_tenancy(s: &AppState, tenant: &str, project: Option<&str>) {
    if let Err(e) = s.backend.remove_tenancy(tenant, project).await {
        tracing::warn!(%tenant, ?project, error = %e, "removing the backend's tenancy objects");
    }
}

#[utoipa::path(get, path = "/api/v1/tenants/{tenant}/projects", tag = "tenancy", params(("tenant" = String, Path), PageParams),
    responses((status = 200, body = Page<Project>), (status = 404, body = Problem)))]
pub async fn list_projects(
    State(s): State<AppState>,
    id: Identity,
    ApiPath(tenant): ApiPath<String>,
    ApiQuery(p): ApiQuery<PageParams>,
) -> ApiResult<Json<Page<Project>>> {
    tenant_visible(&s, &id, &tenant).await?;
    let l = p.limit();
    let items = s.store.list_projects(&tenant, p.cursor.as_deref(), l + 1).await?;
    Ok(Json(page(items.into_iter().map(project_view).collect(), l, |p| {
        p.name.clone()
    })))
}

/// Creates a project in a tenant (platform-admin or the tenant's admin).
#[utoipa::path(post, path = "/api/v1/tenants/{tenant}/projects", tag = "tenancy", params(("tenant" = String, Path)), request_body = CreateProject,
    responses((status = 201, body = Project), (status = 404, body = Problem), (status = 409, body = Problem), (status = 422, body = Problem)))]
pub async fn create_project(
    State(s): State<AppState>,
    id: Identity,
    ApiPath(tenant): ApiPath<String>,
    ApiJson(b): ApiJson<CreateProject>,
) -> ApiResult<(StatusCode, Json<Project>)> {
    tenant_visible(&s, &id, &tenant).await?;
    if !(id.is_admin() || id.role == Role::TenantAdmin) {
        return Err(ApiError::forbidden(
            "creating projects needs a platform-admin or tenant-admin token",
        ));
    }
    let p = ProjectRecord {
        tenant,
        name: b.name,
        created_at: now_ms(),
    };
    s.store.create_project(&p).await?;
    // The backend's own tenancy (a Kubernetes namespace) follows at once, and on every sync.
    s.tenancy.notify_one();
    Ok((StatusCode::CREATED, Json(project_view(p))))
}

#[utoipa::path(get, path = "/api/v1/tenants/{tenant}/projects/{project}", tag = "tenancy", params(("tenant" = String, Path), ("project" = String, Path)),
    responses((status = 200, body = Project), (status = 404, body = Problem)))]
pub async fn get_project(
    State(s): State<AppState>,
    id: Identity,
    ApiPath((tenant, project)): ApiPath<(String, String)>,
) -> ApiResult<Json<Project>> {
    tenant_visible(&s, &id, &tenant).await?;
    let p = s.store.get_project(&tenant, &project).await?;
    Ok(Json(project_view(p.ok_or_else(|| {
        ApiError::not_found(format!("no project `{project}` in tenant `{tenant}`"))
    })?)))
}

#[utoipa::path(delete, path = "/api/v1/tenants/{tenant}/projects/{project}", tag = "tenancy", params(("tenant" = String, Path), ("project" = String, Path)),
    responses((status = 204), (status = 404, body = Problem), (status = 409, body = Problem)))]
pub async fn delete_project(
    State(s): State<AppState>,
    id: Identity,
    ApiPath((tenant, project)): ApiPath<(String, String)>,
) -> ApiResult<StatusCode> {
    tenant_visible(&s, &id, &tenant).await?;
    if !(id.is_admin() || id.role == Role::TenantAdmin) {
        return Err(ApiError::forbidden(
            "deleting projects needs a platform-admin or tenant-admin token",
        ));
    }
    if s.store.get_project(&tenant, &project).await?.is_none() {
        return Err(ApiError::not_found(format!(
            "no project `{project}` in tenant `{tenant}`"
        )));
    }
    s.projects.write().expect("lock").remove(&format!("{tenant}/{project}"));
    if !s.store.delete_project(&tenant, &project).await? {
        return Err(ApiError::conflict(format!(
            "project `{project}` has workloads on record"
        )));
    }
    remove_backend_tenancy(&s, &tenant, Some(&project)).await;
    Ok(StatusCode::NO_CONTENT)
}
