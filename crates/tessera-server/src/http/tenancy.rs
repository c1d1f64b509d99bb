//! Tenants and their projects over HTTP: reads here, changes through
//! [`crate::services::tenancy`].

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tessera_api::{CreateProject, CreateTenant, Page, Problem, Project, SetPriorities, Tenant};

use super::{ApiJson, ApiPath, ApiQuery, PageParams, page};
use crate::audit::{AuditObject, Audited, RequestId};
use crate::auth::{Identity, PlatformAdmin};
use crate::problem::{ApiError, ApiResult};
use crate::services::tenancy::{self, project_view, tenant_view, tenant_visible};
use crate::state::AppState;

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
    PlatformAdmin(id): PlatformAdmin,
    ApiJson(b): ApiJson<CreateTenant>,
) -> ApiResult<Response> {
    let t = tenancy::create_tenant(&s, &id, b).await?;
    // The audit record names the tenant made (the route names none).
    let what = AuditObject(format!("created tenant {}", t.name));
    let mut r = (StatusCode::CREATED, Json(t)).into_response();
    r.extensions_mut().insert(what);
    Ok(r)
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
    PlatformAdmin(id): PlatformAdmin,
    rid: Option<Extension<RequestId>>,
    ApiPath(tenant): ApiPath<String>,
    ApiJson(b): ApiJson<SetPriorities>,
) -> ApiResult<Response> {
    let rid = rid.map(|Extension(r)| r.0).unwrap_or_default();
    let t = tenancy::set_priorities(&s, &id, rid, &tenant, &b).await?;
    let mut r = Json(t).into_response();
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
    tenancy::delete_tenant(&s, &id, &tenant).await?;
    Ok(StatusCode::NO_CONTENT)
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
) -> ApiResult<Response> {
    let p = tenancy::create_project(&s, &id, &tenant, b).await?;
    let what = AuditObject(format!("created project {tenant}/{}", p.name));
    let mut r = (StatusCode::CREATED, Json(p)).into_response();
    r.extensions_mut().insert(what);
    Ok(r)
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
    tenancy::delete_project(&s, &id, &tenant, &project).await?;
    Ok(StatusCode::NO_CONTENT)
}
