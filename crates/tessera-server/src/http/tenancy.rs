//! Tenants and their projects.

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tessera_api::{CreateProject, CreateTenant, Page, Problem, Project, SetPriorities, Tenant, rfc3339_ms, rules};
use tessera_store::{AuditRecord, ProjectRecord, TenantRecord};

use super::{ApiJson, ApiPath, ApiQuery, PageParams, page};
use crate::audit::{Audited, RequestId};
use crate::auth::{Identity, Role};
use crate::problem::{ApiError, ApiResult};
use crate::{AppState, now_ms};

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
            Some(t) => s
                .store
                .get_tenant(t)
                .await?
                .into_iter()
                .map(|t| tenant_view(&s, t))
                .collect(),
            None => vec![],
        };
        return Ok(Json(Page {
            items: own,
            next_cursor: None,
        }));
    }
    let items = s.store.list_tenants(p.cursor.as_deref(), l + 1).await?;
    Ok(Json(page(
        items.into_iter().map(|t| tenant_view(&s, t)).collect(),
        l,
        |t| t.name.clone(),
    )))
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
    if let Some(p) = &b.priorities {
        check_grant(&s, "priorities", p)?;
    }
    let t = TenantRecord {
        display_name: b.display_name.clone().unwrap_or_else(|| b.name.clone()),
        name: b.name,
        created_at: now_ms(),
        priorities: b.priorities,
    };
    s.store.create_tenant(&t).await?;
    tracing::info!(tenant = %t.name, actor = %id.actor, "tenant created");
    Ok((StatusCode::CREATED, Json(tenant_view(&s, t))))
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
    Ok(Json(tenant_view(&s, tenant_visible(&s, &id, &tenant).await?)))
}

/// Grants a tenant the priority classes its workloads may use (platform-admin): exactly those
/// listed, or the default grant (`standard` and `opportunistic`) for `null`. Work already
/// submitted keeps its class. The audit record, which names the grant before and after,
/// commits with the change.
#[utoipa::path(put, path = "/api/v1/tenants/{tenant}/priorities", tag = "tenancy", params(("tenant" = String, Path)),
    request_body = SetPriorities,
    responses((status = 200, body = Tenant),
        (status = 403, description = "Not a platform-admin token: a tenant cannot grant itself priority classes", body = Problem),
        (status = 404, body = Problem),
        (status = 422, description = "An empty grant, a class listed twice, or a class the server does not know (the field names the entry)", body = Problem)))]
pub async fn set_priorities(
    State(s): State<AppState>,
    id: Identity,
    rid: Option<Extension<RequestId>>,
    ApiPath(tenant): ApiPath<String>,
    ApiJson(b): ApiJson<SetPriorities>,
) -> ApiResult<Response> {
    let before = tenant_visible(&s, &id, &tenant).await?;
    if !id.is_admin() {
        return Err(ApiError::forbidden(
            "granting priority classes needs a platform-admin token",
        ));
    }
    if let Some(p) = &b.priorities {
        check_grant(&s, "priorities", p)?;
    }
    let after = TenantRecord {
        priorities: b.priorities.clone(),
        ..before.clone()
    };
    let audit = AuditRecord {
        seq: 0,
        at: now_ms(),
        request_id: rid.map(|Extension(r)| r.0).unwrap_or_default(),
        actor: id.actor.clone(),
        tenant: Some(tenant.clone()),
        action: "PUT /api/v1/tenants/{tenant}/priorities".into(),
        target: format!("/api/v1/tenants/{tenant}/priorities"),
        outcome: StatusCode::OK.as_u16(),
        detail: format!(
            "priority classes {} → {}",
            granted(&s, &before).join(", "),
            granted(&s, &after).join(", ")
        ),
    };
    if !s
        .store
        .set_tenant_priorities(&tenant, b.priorities.as_deref(), &audit)
        .await?
    {
        return Err(ApiError::not_found(format!("no tenant `{tenant}`")));
    }
    tracing::info!(%tenant, actor = %id.actor, detail = %audit.detail, "priority classes granted");
    let mut r = Json(tenant_view(&s, after)).into_response();
    r.extensions_mut().insert(Audited);
    Ok(r)
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
