//! The REST API under `/api/v1`. Every route is registered through `utoipa-axum`'s
//! `OpenApiRouter`, so the OpenAPI document (`/api/v1/openapi.json`) lists exactly the routes
//! the router serves.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use tessera_api::*;
use tessera_model::GpuUnits;
use tokio::sync::oneshot;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoParams, Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::{Identity, Role, new_secret};
use crate::controller::{Cmd, NewWorkload, PRIORITY_CLASSES, shape_request};
use crate::problem::{ApiError, ApiResult};
use crate::{AppState, now_ms, views};

#[derive(OpenApi)]
#[openapi(
    info(title = "Tessera API", description = "GPU-as-a-service for on-premises NVIDIA fleets: request whole GPUs, MIG slices or fractions of shared GPUs, and follow each request from placement to release."),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
    tags(
        (name = "fleet", description = "Pools, nodes and GPUs (read-only)"),
        (name = "tenancy", description = "Tenants, projects and API tokens"),
        (name = "workloads", description = "GPU requests and their lifecycle"),
        (name = "governance", description = "Quotas, budgets and usage"),
        (name = "system", description = "Health and the API description"),
    )
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The API router and its OpenAPI document.
pub fn router() -> (axum::Router<AppState>, utoipa::openapi::OpenApi) {
    let (router, mut doc) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(health))
        .routes(routes!(list_pools))
        .routes(routes!(list_nodes))
        .routes(routes!(list_gpus))
        .routes(routes!(list_tenants, create_tenant))
        .routes(routes!(get_tenant, delete_tenant))
        .routes(routes!(list_projects, create_project))
        .routes(routes!(get_project, delete_project))
        .routes(routes!(list_tokens, create_token))
        .routes(routes!(revoke_token))
        .routes(routes!(audit_log))
        .routes(routes!(list_workloads, create_workload))
        .routes(routes!(get_workload))
        .routes(routes!(cancel_workload))
        .routes(routes!(workload_events))
        .routes(routes!(get_quotas))
        .routes(routes!(set_quota, delete_quota))
        .routes(routes!(set_budget))
        .routes(routes!(usage_report))
        .routes(routes!(crate::simfaults::inject_fault))
        .split_for_parts();
    describe_responses(&mut doc);
    (router, doc)
}

/// OpenAPI 3.1 requires a `description` on every response: give those declared without one
/// the status code's reason phrase.
fn describe_responses(doc: &mut utoipa::openapi::OpenApi) {
    for item in doc.paths.paths.values_mut() {
        let ops = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.options,
            &mut item.head,
            &mut item.patch,
            &mut item.trace,
        ];
        for op in ops.into_iter().flatten() {
            for (code, r) in op.responses.responses.iter_mut() {
                if let utoipa::openapi::RefOr::T(r) = r
                    && r.description.is_empty()
                {
                    r.description = code
                        .parse::<u16>()
                        .ok()
                        .and_then(|c| StatusCode::from_u16(c).ok())
                        .and_then(|c| c.canonical_reason())
                        .unwrap_or("Response")
                        .to_string();
                }
            }
        }
    }
}

/// JSON body extractor whose rejections are problem documents naming what is wrong.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(ApiJson(v)),
            Err(JsonRejection::JsonDataError(e)) => {
                let text = e.body_text();
                // "Failed to deserialize the JSON body into the target type: shape.gpus: invalid type …"
                let detail = text
                    .split_once("target type: ")
                    .map(|(_, d)| d.to_string())
                    .unwrap_or(text);
                let field = detail
                    .split_once(": ")
                    .map(|(f, _)| f.to_string())
                    .filter(|f| !f.contains(' '));
                let field = field.or_else(|| {
                    detail
                        .split('`')
                        .nth(1)
                        .filter(|_| detail.contains("field"))
                        .map(str::to_string)
                });
                Err(ApiError::invalid(field.unwrap_or_else(|| "body".into()), detail))
            }
            Err(JsonRejection::JsonSyntaxError(e)) => Err(ApiError::bad_request(format!(
                "the body is not valid JSON: {}",
                e.body_text().rsplit(": ").next().unwrap_or_default()
            ))),
            Err(JsonRejection::MissingJsonContentType(_)) => Err(ApiError::unsupported_media(
                "send the body as JSON with `Content-Type: application/json`",
            )),
            Err(JsonRejection::BytesRejection(e)) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(ApiError::too_large(format!(
                    "the body is larger than the {} KiB limit",
                    crate::BODY_LIMIT / 1024
                )))
            }
            Err(e) => Err(ApiError::bad_request(e.body_text())),
        }
    }
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Items per page, 1–500 (default 100).
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

fn limit(p: Option<u32>) -> ApiResult<u32> {
    match p {
        None => Ok(100),
        Some(l) if (1..=500).contains(&l) => Ok(l),
        Some(l) => Err(ApiError::invalid(
            "limit",
            format!("limit {l}: must be between 1 and 500"),
        )),
    }
}

fn page<T, F: Fn(&T) -> String>(mut items: Vec<T>, limit: u32, cursor_of: F) -> Page<T> {
    let next_cursor = (items.len() > limit as usize).then(|| {
        items.truncate(limit as usize);
        items.last().map(&cursor_of).unwrap_or_default()
    });
    Page { items, next_cursor }
}

fn paginate_vec<T: Clone, F: Fn(&T) -> String>(all: Vec<T>, p: &PageParams, key: F) -> ApiResult<Page<T>> {
    let l = limit(p.limit)?;
    let start = match &p.cursor {
        Some(c) => all
            .iter()
            .position(|x| key(x) == *c)
            .map(|i| i + 1)
            .unwrap_or(all.len()),
        None => 0,
    };
    let items: Vec<T> = all.into_iter().skip(start).take(l as usize + 1).collect();
    Ok(page(items, l, key))
}

/// Liveness and readiness.
#[utoipa::path(get, path = "/api/v1/health", tag = "system", security(()), responses((status = 200, description = "Serving", body = serde_json::Value)))]
async fn health(State(s): State<AppState>) -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok", "backend": s.backend_name, "version": env!("CARGO_PKG_VERSION")}))
}

/// Pools with their sharing mode and GPU units in use.
#[utoipa::path(get, path = "/api/v1/pools", tag = "fleet", params(PageParams), responses((status = 200, body = Page<PoolView>), (status = 401, body = Problem)))]
async fn list_pools(
    State(s): State<AppState>,
    id: Identity,
    Query(p): Query<PageParams>,
) -> ApiResult<Json<Page<PoolView>>> {
    let all = s.controller.view(move |ctx| views::pools(ctx, &id)).await?;
    Ok(Json(paginate_vec(all, &p, |x| x.name.clone())?))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FleetFilter {
    /// Only this pool.
    pub pool: Option<String>,
    /// Only this node.
    pub node: Option<String>,
    pub limit: Option<u32>,
    pub cursor: Option<String>,
}

impl FleetFilter {
    fn page(&self) -> PageParams {
        PageParams {
            limit: self.limit,
            cursor: self.cursor.clone(),
        }
    }
}

/// Nodes with free host resources and GPUs.
#[utoipa::path(get, path = "/api/v1/nodes", tag = "fleet", params(FleetFilter), responses((status = 200, body = Page<NodeView>), (status = 401, body = Problem)))]
async fn list_nodes(
    State(s): State<AppState>,
    id: Identity,
    Query(f): Query<FleetFilter>,
) -> ApiResult<Json<Page<NodeView>>> {
    let (pool, node) = (f.pool.clone(), f.node.clone());
    let all = s
        .controller
        .view(move |ctx| views::nodes(ctx, &id, pool.as_deref(), node.as_deref()))
        .await?;
    Ok(Json(paginate_vec(all, &f.page(), |x| x.name.clone())?))
}

/// GPUs with their MIG layout or shares, and who holds each slice.
#[utoipa::path(get, path = "/api/v1/gpus", tag = "fleet", params(FleetFilter), responses((status = 200, body = Page<GpuView>), (status = 401, body = Problem)))]
async fn list_gpus(
    State(s): State<AppState>,
    id: Identity,
    Query(f): Query<FleetFilter>,
) -> ApiResult<Json<Page<GpuView>>> {
    let (pool, node) = (f.pool.clone(), f.node.clone());
    let all = s
        .controller
        .view(move |ctx| views::gpus(ctx, &id, pool.as_deref(), node.as_deref()))
        .await?;
    Ok(Json(paginate_vec(all, &f.page(), |x| {
        format!("{}/{}", x.node, x.index)
    })?))
}

fn check_slug(field: &str, v: &str) -> ApiResult<()> {
    let ok = !v.is_empty()
        && v.len() <= 40
        && v.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !v.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(
            field,
            format!("`{v}` is not a valid {field}: use 1–40 lower-case letters, digits and `-`"),
        ))
    }
}

/// Tenants (platform-admin: all; others: their own).
#[utoipa::path(get, path = "/api/v1/tenants", tag = "tenancy", params(PageParams), responses((status = 200, body = Page<Tenant>), (status = 401, body = Problem)))]
async fn list_tenants(
    State(s): State<AppState>,
    id: Identity,
    Query(p): Query<PageParams>,
) -> ApiResult<Json<Page<Tenant>>> {
    let l = limit(p.limit)?;
    if !id.is_admin() {
        let own = match &id.tenant {
            Some(t) => s.store.get_tenant(t).await?.into_iter().collect(),
            None => vec![],
        };
        return Ok(Json(Page {
            items: own,
            next_cursor: None,
        }));
    }
    let items = s.store.list_tenants(p.cursor.as_deref(), l + 1).await?;
    Ok(Json(page(items, l, |t| t.name.clone())))
}

/// Creates a tenant (platform-admin).
#[utoipa::path(post, path = "/api/v1/tenants", tag = "tenancy", request_body = CreateTenant,
    responses((status = 201, body = Tenant), (status = 409, body = Problem), (status = 422, body = Problem)))]
async fn create_tenant(
    State(s): State<AppState>,
    id: Identity,
    ApiJson(b): ApiJson<CreateTenant>,
) -> ApiResult<(StatusCode, Json<Tenant>)> {
    id.require_admin()?;
    check_slug("name", &b.name)?;
    let display = b.display_name.clone().unwrap_or_else(|| b.name.clone());
    let t = s.store.create_tenant(&b.name, &display, now_ms()).await?;
    tracing::info!(tenant = %t.name, actor = %id.actor, "tenant created");
    Ok((StatusCode::CREATED, Json(t)))
}

async fn tenant_visible(s: &AppState, id: &Identity, tenant: &str) -> ApiResult<Tenant> {
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
async fn get_tenant(State(s): State<AppState>, id: Identity, Path(tenant): Path<String>) -> ApiResult<Json<Tenant>> {
    Ok(Json(tenant_visible(&s, &id, &tenant).await?))
}

/// Deletes a tenant that has no projects, tokens or workloads (platform-admin).
#[utoipa::path(delete, path = "/api/v1/tenants/{tenant}", tag = "tenancy", params(("tenant" = String, Path)),
    responses((status = 204), (status = 404, body = Problem), (status = 409, body = Problem)))]
async fn delete_tenant(State(s): State<AppState>, id: Identity, Path(tenant): Path<String>) -> ApiResult<StatusCode> {
    id.require_admin()?;
    tenant_visible(&s, &id, &tenant).await?;
    if !s.store.delete_tenant(&tenant).await? {
        return Err(ApiError::conflict(format!(
            "tenant `{tenant}` still has projects, tokens or workloads; delete those first"
        )));
    }
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/api/v1/tenants/{tenant}/projects", tag = "tenancy", params(("tenant" = String, Path), PageParams),
    responses((status = 200, body = Page<Project>), (status = 404, body = Problem)))]
async fn list_projects(
    State(s): State<AppState>,
    id: Identity,
    Path(tenant): Path<String>,
    Query(p): Query<PageParams>,
) -> ApiResult<Json<Page<Project>>> {
    tenant_visible(&s, &id, &tenant).await?;
    let l = limit(p.limit)?;
    let items = s.store.list_projects(&tenant, p.cursor.as_deref(), l + 1).await?;
    Ok(Json(page(items, l, |p| p.name.clone())))
}

/// Creates a project in a tenant (platform-admin or the tenant's admin).
#[utoipa::path(post, path = "/api/v1/tenants/{tenant}/projects", tag = "tenancy", params(("tenant" = String, Path)), request_body = CreateProject,
    responses((status = 201, body = Project), (status = 404, body = Problem), (status = 409, body = Problem), (status = 422, body = Problem)))]
async fn create_project(
    State(s): State<AppState>,
    id: Identity,
    Path(tenant): Path<String>,
    ApiJson(b): ApiJson<CreateProject>,
) -> ApiResult<(StatusCode, Json<Project>)> {
    tenant_visible(&s, &id, &tenant).await?;
    if !(id.is_admin() || id.role == Role::TenantAdmin) {
        return Err(ApiError::forbidden(
            "creating projects needs a platform-admin or tenant-admin token",
        ));
    }
    check_slug("name", &b.name)?;
    Ok((
        StatusCode::CREATED,
        Json(s.store.create_project(&tenant, &b.name, now_ms()).await?),
    ))
}

#[utoipa::path(get, path = "/api/v1/tenants/{tenant}/projects/{project}", tag = "tenancy", params(("tenant" = String, Path), ("project" = String, Path)),
    responses((status = 200, body = Project), (status = 404, body = Problem)))]
async fn get_project(
    State(s): State<AppState>,
    id: Identity,
    Path((tenant, project)): Path<(String, String)>,
) -> ApiResult<Json<Project>> {
    tenant_visible(&s, &id, &tenant).await?;
    let p = s.store.get_project(&tenant, &project).await?;
    Ok(Json(p.ok_or_else(|| {
        ApiError::not_found(format!("no project `{project}` in tenant `{tenant}`"))
    })?))
}

#[utoipa::path(delete, path = "/api/v1/tenants/{tenant}/projects/{project}", tag = "tenancy", params(("tenant" = String, Path), ("project" = String, Path)),
    responses((status = 204), (status = 404, body = Problem), (status = 409, body = Problem)))]
async fn delete_project(
    State(s): State<AppState>,
    id: Identity,
    Path((tenant, project)): Path<(String, String)>,
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
    Ok(StatusCode::NO_CONTENT)
}

/// Creates an API token; the secret is in the response only. Platform-admins create any token;
/// tenant-admins create tokens of their own tenant.
#[utoipa::path(post, path = "/api/v1/tokens", tag = "tenancy", request_body = CreateToken,
    responses((status = 201, body = CreatedToken), (status = 403, body = Problem), (status = 422, body = Problem)))]
async fn create_token(
    State(s): State<AppState>,
    id: Identity,
    ApiJson(b): ApiJson<CreateToken>,
) -> ApiResult<(StatusCode, Json<CreatedToken>)> {
    let role = Role::parse(&b.role).ok_or_else(|| {
        ApiError::invalid(
            "role",
            format!(
                "unknown role `{}` (platform-admin, tenant-admin, member, viewer)",
                b.role
            ),
        )
    })?;
    if !id.is_admin() {
        let own =
            id.role == Role::TenantAdmin && b.tenant.is_some() && b.tenant == id.tenant && role != Role::PlatformAdmin;
        if !own {
            return Err(ApiError::forbidden(
                "only platform-admins, or tenant-admins for their own tenant, can create tokens",
            ));
        }
    }
    match (&b.tenant, role) {
        (None, r) if r != Role::PlatformAdmin => {
            return Err(ApiError::invalid("tenant", "tenant roles need a `tenant`"));
        }
        (Some(_), Role::PlatformAdmin) => {
            return Err(ApiError::invalid(
                "tenant",
                "platform-admin tokens are not tied to a tenant",
            ));
        }
        (Some(t), _) if s.store.get_tenant(t).await?.is_none() => {
            return Err(ApiError::invalid("tenant", format!("no tenant `{t}`")));
        }
        _ => {}
    }
    let expires_at = match b.expires_in_s {
        Some(e) if e <= 0 => return Err(ApiError::invalid("expires_in_s", "a lifetime must be positive")),
        Some(e) => Some(now_ms() + e * 1000),
        None => None,
    };
    let secret = new_secret();
    let tid = format!("tok-{}", &crate::auth::hash(&secret)[..12]);
    s.store
        .create_token_expiring(
            &tid,
            &crate::auth::hash(&secret),
            b.tenant.as_deref(),
            role.as_str(),
            b.name.as_deref().unwrap_or(""),
            now_ms(),
            expires_at,
        )
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(CreatedToken {
            id: tid,
            token: secret,
            tenant: b.tenant,
            role: role.as_str().into(),
        }),
    ))
}

/// The tenant an administrative listing covers: the requested one (or all) for platform-admins,
/// its own for tenant-admins; other roles are refused.
fn admin_scope(id: &Identity, requested: &Option<String>, what: &str) -> ApiResult<Option<String>> {
    if id.is_admin() {
        Ok(requested.clone())
    } else if id.role == Role::TenantAdmin {
        Ok(id.tenant.clone())
    } else {
        Err(ApiError::forbidden(format!(
            "{what} needs a platform-admin or tenant-admin token"
        )))
    }
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TokenParams {
    /// Only tokens of this tenant.
    pub tenant: Option<String>,
}

/// API tokens (platform-admin: all; tenant-admin: its tenant's).
#[utoipa::path(get, path = "/api/v1/tokens", tag = "tenancy", params(TokenParams),
    responses((status = 200, body = Vec<TokenView>), (status = 403, body = Problem)))]
async fn list_tokens(
    State(s): State<AppState>,
    id: Identity,
    Query(q): Query<TokenParams>,
) -> ApiResult<Json<Vec<TokenView>>> {
    let tenant = admin_scope(&id, &q.tenant, "listing tokens")?;
    let list = s.store.list_tokens(tenant.as_deref()).await?;
    Ok(Json(
        list.into_iter()
            .filter(|t| id.is_admin() || t.tenant.is_some())
            .map(|t| TokenView {
                id: t.id,
                tenant: t.tenant,
                role: t.role,
                name: t.name,
                created_at: rfc3339_ms(t.created_at),
                expires_at: t.expires_at.map(rfc3339_ms),
                revoked_at: t.revoked_at.map(rfc3339_ms),
            })
            .collect(),
    ))
}

/// Revokes a token: it fails from the next request on.
#[utoipa::path(delete, path = "/api/v1/tokens/{id}", tag = "tenancy", params(("id" = String, Path)),
    responses((status = 204), (status = 403, body = Problem), (status = 404, body = Problem)))]
async fn revoke_token(State(s): State<AppState>, id: Identity, Path(tid): Path<String>) -> ApiResult<StatusCode> {
    let all = s.store.list_tokens(None).await?;
    let Some(t) = all.into_iter().find(|t| t.id == tid) else {
        return Err(ApiError::not_found(format!("no token `{tid}`")));
    };
    let allowed = id.is_admin() || (id.role == Role::TenantAdmin && t.tenant.is_some() && t.tenant == id.tenant);
    if !allowed {
        return Err(ApiError::not_found(format!("no token `{tid}`")));
    }
    if !s.store.revoke_token(&tid, now_ms()).await? {
        return Err(ApiError::conflict(format!("token `{tid}` is already revoked")));
    }
    s.auth.invalidate();
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditParams {
    pub tenant: Option<String>,
    pub limit: Option<u32>,
    pub cursor: Option<String>,
}

/// The audit log, newest first (platform-admin: all; tenant-admin: its tenant).
#[utoipa::path(get, path = "/api/v1/audit", tag = "tenancy", params(AuditParams),
    responses((status = 200, body = Page<AuditEntry>), (status = 403, body = Problem)))]
async fn audit_log(
    State(s): State<AppState>,
    id: Identity,
    Query(q): Query<AuditParams>,
) -> ApiResult<Json<Page<AuditEntry>>> {
    let tenant = admin_scope(&id, &q.tenant, "the audit log")?;
    let l = limit(q.limit)?;
    let before = match &q.cursor {
        Some(c) => Some(
            c.parse::<u64>()
                .map_err(|_| ApiError::invalid("cursor", "not a cursor from this API"))?,
        ),
        None => None,
    };
    let rows = s.store.audit(tenant.as_deref(), before, l + 1).await?;
    let items: Vec<AuditEntry> = rows
        .into_iter()
        .map(|r| AuditEntry {
            seq: r.seq,
            at: rfc3339_ms(r.at),
            request_id: r.request_id,
            actor: r.actor,
            tenant: r.tenant,
            action: r.action,
            target: r.target,
            outcome: r.outcome,
        })
        .collect();
    Ok(Json(page(items, l, |a| a.seq.to_string())))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WorkloadFilterParams {
    pub tenant: Option<String>,
    pub project: Option<String>,
    /// `pending`, `queued`, `placed`, `running`, `stopping`, `succeeded`, `failed`, `cancelled`, `preempted`.
    pub state: Option<String>,
    pub limit: Option<u32>,
    pub cursor: Option<String>,
}

/// Workloads, newest first.
#[utoipa::path(get, path = "/api/v1/workloads", tag = "workloads", params(WorkloadFilterParams),
    responses((status = 200, body = Page<Workload>), (status = 422, body = Problem)))]
async fn list_workloads(
    State(s): State<AppState>,
    id: Identity,
    Query(q): Query<WorkloadFilterParams>,
) -> ApiResult<Json<Page<Workload>>> {
    let l = limit(q.limit)?;
    let state = match &q.state {
        Some(st) => {
            Some(WorkloadState::parse(st).ok_or_else(|| ApiError::invalid("state", format!("unknown state `{st}`")))?)
        }
        None => None,
    };
    let tenant = match (&id.tenant, &q.tenant) {
        (_, Some(t)) if !id.can_read(t) => {
            return Ok(Json(Page {
                items: vec![],
                next_cursor: None,
            }));
        }
        (Some(own), None) if !id.is_admin() => Some(own.clone()),
        (_, t) => t.clone(),
    };
    let before = match &q.cursor {
        Some(c) => Some(
            c.parse::<u64>()
                .map_err(|_| ApiError::invalid("cursor", "not a cursor from this API"))?,
        ),
        None => None,
    };
    let filter = tessera_store::WorkloadFilter {
        scope: id.scope().map(str::to_string),
        tenant,
        project: q.project.clone(),
        state,
        before,
        limit: l + 1,
    };
    let items = s.store.list_workloads(&filter).await?;
    Ok(Json(page(items, l, |w| w.id.to_string())))
}

/// Requests GPUs. Accepts an `Idempotency-Key` header: repeating a request with the same key
/// and body returns the workload created the first time (200) instead of a new one.
#[utoipa::path(post, path = "/api/v1/workloads", tag = "workloads", request_body = CreateWorkload,
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes retries safe")),
    responses((status = 201, body = Workload), (status = 200, description = "Replay of an idempotent request", body = Workload),
        (status = 400, body = Problem), (status = 413, body = Problem), (status = 422, body = Problem)))]
async fn create_workload(
    State(s): State<AppState>,
    id: Identity,
    headers: HeaderMap,
    ApiJson(b): ApiJson<CreateWorkload>,
) -> ApiResult<Response> {
    let received_at = now_ms();
    if !id.can_write(&b.tenant) {
        if id.can_read(&b.tenant) {
            return Err(ApiError::forbidden("viewer tokens cannot create workloads"));
        }
        return Err(ApiError::invalid("tenant", format!("no tenant `{}`", b.tenant)));
    }
    // Known tenant/project pairs are remembered (a project is only forgotten when deleted),
    // sparing two store reads per request.
    let key = format!("{}/{}", b.tenant, b.project);
    let known = s.projects.read().expect("lock").contains(&key);
    if !known {
        if s.store.get_tenant(&b.tenant).await?.is_none() {
            return Err(ApiError::invalid("tenant", format!("no tenant `{}`", b.tenant)));
        }
        if s.store.get_project(&b.tenant, &b.project).await?.is_none() {
            return Err(ApiError::invalid(
                "project",
                format!("no project `{}` in tenant `{}`", b.project, b.tenant),
            ));
        }
        s.projects.write().expect("lock").insert(key);
    }
    if b.name.is_empty() || b.name.len() > 63 || b.name.chars().any(|c| c.is_control()) {
        return Err(ApiError::invalid("name", "a name has 1–63 printable characters"));
    }
    if let Some(d) = b.duration_s
        && d <= 0
    {
        return Err(ApiError::invalid(
            "duration_s",
            format!("{d} s: a duration must be positive (omit it to run until cancelled)"),
        ));
    }
    if let Some(p) = &b.priority
        && !PRIORITY_CLASSES.contains(&p.as_str())
    {
        return Err(ApiError::invalid(
            "priority",
            format!("unknown priority class `{p}` ({})", PRIORITY_CLASSES.join(", ")),
        ));
    }
    let probe = shape_request(&s.fleet, &b.shape, 0, 0)?;
    let units = probe.units(&s.fleet.catalogue);
    let per_unit = |per_gpu: u64, min: u64| (per_gpu * units.as_milli() / 1000).max(min);
    let cpu = b.cpu_milli.unwrap_or_else(|| per_unit(4000, 500));
    let mem = b.memory_mib.unwrap_or_else(|| per_unit(16 * 1024, 1024));
    let request = shape_request(&s.fleet, &b.shape, cpu, mem)?;
    let idempotency = match headers.get("idempotency-key") {
        Some(k) => {
            let k = k
                .to_str()
                .map_err(|_| ApiError::invalid("Idempotency-Key", "must be printable ASCII"))?
                .to_string();
            if k.is_empty() || k.len() > 200 {
                return Err(ApiError::invalid("Idempotency-Key", "must be 1–200 characters"));
            }
            let body = serde_json::to_vec(&b).unwrap_or_default();
            let h: String = Sha256::digest(&body).iter().map(|x| format!("{x:02x}")).collect();
            Some((k, h))
        }
        None => None,
    };
    let (tx, rx) = oneshot::channel();
    let nw = NewWorkload {
        spec: b,
        request,
        units: GpuUnits(units.as_milli()),
        actor: id.actor.clone(),
        role: id.role.as_str().into(),
        idempotency,
        received_at,
    };
    s.controller.send(Cmd::Create(Box::new(nw), tx)).await?;
    let (wl, created) = rx
        .await
        .map_err(|_| ApiError::unavailable("the lifecycle loop has stopped"))??;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(wl)).into_response())
}

async fn find_workload(s: &AppState, id: &Identity, wid: u64) -> ApiResult<Workload> {
    let cached = s.controller.cache.read().expect("lock").get(wid);
    let wl = match cached {
        Some(w) => (*w).clone(),
        None => s
            .store
            .get_workload_in(wid, id.scope())
            .await?
            .ok_or_else(|| ApiError::not_found(format!("no workload {wid}")))?,
    };
    if !id.can_read(&wl.tenant) {
        return Err(ApiError::not_found(format!("no workload {wid}")));
    }
    Ok(wl)
}

#[utoipa::path(get, path = "/api/v1/workloads/{id}", tag = "workloads", params(("id" = u64, Path)),
    responses((status = 200, body = Workload), (status = 404, body = Problem)))]
async fn get_workload(State(s): State<AppState>, id: Identity, Path(wid): Path<u64>) -> ApiResult<Json<Workload>> {
    Ok(Json(find_workload(&s, &id, wid).await?))
}

/// Cancels a workload: a waiting one at once; a placed or running one is stopped (grace
/// period, then forced) and its capacity returned.
#[utoipa::path(post, path = "/api/v1/workloads/{id}/cancel", tag = "workloads", params(("id" = u64, Path)),
    responses((status = 200, body = Workload), (status = 404, body = Problem), (status = 409, body = Problem)))]
async fn cancel_workload(State(s): State<AppState>, id: Identity, Path(wid): Path<u64>) -> ApiResult<Json<Workload>> {
    let wl = find_workload(&s, &id, wid).await?;
    if !id.can_write(&wl.tenant) {
        return Err(ApiError::forbidden("viewer tokens cannot cancel workloads"));
    }
    if wl.state.is_terminal() {
        return Err(ApiError::conflict(format!(
            "workload {wid} has already ended ({})",
            wl.state.as_str()
        )));
    }
    let (tx, rx) = oneshot::channel();
    s.controller
        .send(Cmd::Cancel {
            id: wid,
            actor: id.actor.clone(),
            reply: tx,
        })
        .await?;
    Ok(Json(rx.await.map_err(|_| {
        ApiError::unavailable("the lifecycle loop has stopped")
    })??))
}

/// The workload's timeline: one event per lifecycle step.
#[utoipa::path(get, path = "/api/v1/workloads/{id}/events", tag = "workloads", params(("id" = u64, Path)),
    responses((status = 200, body = Vec<Event>), (status = 404, body = Problem)))]
async fn workload_events(State(s): State<AppState>, id: Identity, Path(wid): Path<u64>) -> ApiResult<Json<Vec<Event>>> {
    find_workload(&s, &id, wid).await?;
    Ok(Json(s.store.events_in(wid, id.scope()).await?))
}

/// Checks a resource class name: a pool, `pool/MODEL` with that model in the pool, or
/// `project:NAME` (a sub-quota of one project across pools).
fn check_class(s: &AppState, class: &str) -> ApiResult<()> {
    if class.starts_with("project:") {
        // Checked against the tenant's projects by the caller.
        return Ok(());
    }
    let (pool, model) = match class.split_once('/') {
        Some((p, m)) => (p, Some(m)),
        None => (class, None),
    };
    let Some(pid) = s.fleet.pool_by_name(pool) else {
        let names: Vec<&str> = s.fleet.pools.iter().map(|p| p.name.as_str()).collect();
        return Err(ApiError::invalid(
            "class",
            format!("unknown pool `{pool}` (pools: {})", names.join(", ")),
        ));
    };
    if let Some(m) = model {
        let p = s.fleet.pool(pid);
        let has = s.fleet.nodes[p.nodes.start as usize..p.nodes.end as usize]
            .iter()
            .any(|n| s.fleet.catalogue.get(n.model).name == m);
        if !has {
            return Err(ApiError::invalid("class", format!("pool `{pool}` has no {m} GPUs")));
        }
    }
    Ok(())
}

fn units_milli(field: &str, v: f64) -> ApiResult<u64> {
    if !v.is_finite() || !(0.0..=10_000_000.0).contains(&v) {
        return Err(ApiError::invalid(
            field,
            format!("{v}: GPU units must be a non-negative number"),
        ));
    }
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
#[utoipa::path(get, path = "/api/v1/tenants/{tenant}/quotas", tag = "governance", params(("tenant" = String, Path)),
    responses((status = 200, body = TenantQuotas), (status = 404, body = Problem)))]
async fn get_quotas(
    State(s): State<AppState>,
    id: Identity,
    Path(tenant): Path<String>,
) -> ApiResult<Json<TenantQuotas>> {
    tenant_visible(&s, &id, &tenant).await?;
    let t = tenant.clone();
    let v = s
        .controller
        .view(move |ctx| {
            let quotas = ctx
                .sched
                .quotas_of(&t)
                .into_iter()
                .map(|(class, q)| {
                    let used = ctx.sched.held(&t, &class);
                    let borrowed = if used > q.guaranteed {
                        used - q.guaranteed
                    } else {
                        GpuUnits::ZERO
                    };
                    QuotaView {
                        class,
                        guaranteed: q.guaranteed.as_f64(),
                        limit: q.limit.map(|l| l.as_f64()),
                        used: used.as_f64(),
                        borrowed: borrowed.as_f64(),
                    }
                })
                .collect();
            let budget = ctx.sched.budget(&t).map(|b| {
                let spent = ctx.sched.spent(&t);
                BudgetView {
                    monthly_unit_hours: b,
                    spent_unit_hours: spent,
                    remaining_unit_hours: (b - spent).max(0.0),
                }
            });
            TenantQuotas {
                tenant: t,
                quotas,
                budget,
            }
        })
        .await?;
    Ok(Json(v))
}

/// Sets a tenant's quota for a resource class (platform-admin).
#[utoipa::path(put, path = "/api/v1/tenants/{tenant}/quotas/{class}", tag = "governance",
    params(("tenant" = String, Path), ("class" = String, Path, description = "A pool, or pool/MODEL (URL-encode the slash)")),
    request_body = SetQuota, responses((status = 200, body = QuotaView), (status = 403, body = Problem), (status = 422, body = Problem)))]
async fn set_quota(
    State(s): State<AppState>,
    id: Identity,
    Path((tenant, class)): Path<(String, String)>,
    ApiJson(b): ApiJson<SetQuota>,
) -> ApiResult<Json<QuotaView>> {
    id.require_admin()?;
    tenant_visible(&s, &id, &tenant).await?;
    check_class(&s, &class)?;
    if let Some(project) = class.strip_prefix("project:")
        && s.store.get_project(&tenant, project).await?.is_none()
    {
        return Err(ApiError::invalid(
            "class",
            format!("tenant `{tenant}` has no project `{project}`"),
        ));
    }
    let g = units_milli("guaranteed", b.guaranteed)?;
    let l = b.limit.map(|l| units_milli("limit", l)).transpose()?;
    if l.is_some_and(|l| l < g) {
        return Err(ApiError::invalid(
            "limit",
            format!(
                "limit {} is below the guarantee {}",
                b.limit.unwrap_or(0.0),
                b.guaranteed
            ),
        ));
    }
    s.store
        .set_quota(
            &tessera_store::QuotaRecord {
                tenant: tenant.clone(),
                class: class.clone(),
                guaranteed_milli: g,
                limit_milli: l,
            },
            now_ms(),
        )
        .await?;
    let quota = tessera_sched::cycle::Quota {
        guaranteed: GpuUnits(g),
        limit: l.map(GpuUnits),
    };
    s.controller
        .govern(crate::controller::Governance::Quota {
            tenant: tenant.clone(),
            class: class.clone(),
            quota: Some(quota),
        })
        .await?;
    tracing::info!(%tenant, %class, guaranteed = b.guaranteed, limit = ?b.limit, actor = %id.actor, "quota set");
    Ok(Json(QuotaView {
        class,
        guaranteed: GpuUnits(g).as_f64(),
        limit: l.map(|l| GpuUnits(l).as_f64()),
        used: 0.0,
        borrowed: 0.0,
    }))
}

/// Removes a tenant's quota for a class (platform-admin).
#[utoipa::path(delete, path = "/api/v1/tenants/{tenant}/quotas/{class}", tag = "governance", params(("tenant" = String, Path), ("class" = String, Path)),
    responses((status = 204), (status = 404, body = Problem)))]
async fn delete_quota(
    State(s): State<AppState>,
    id: Identity,
    Path((tenant, class)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    id.require_admin()?;
    tenant_visible(&s, &id, &tenant).await?;
    if !s.store.delete_quota(&tenant, &class).await? {
        return Err(ApiError::not_found(format!(
            "tenant `{tenant}` has no quota for `{class}`"
        )));
    }
    s.controller
        .govern(crate::controller::Governance::Quota {
            tenant,
            class,
            quota: None,
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Sets or removes a tenant's monthly GPU-unit-hour budget (platform-admin).
#[utoipa::path(put, path = "/api/v1/tenants/{tenant}/budget", tag = "governance", params(("tenant" = String, Path)),
    request_body = SetBudget, responses((status = 204), (status = 403, body = Problem), (status = 422, body = Problem)))]
async fn set_budget(
    State(s): State<AppState>,
    id: Identity,
    Path(tenant): Path<String>,
    ApiJson(b): ApiJson<SetBudget>,
) -> ApiResult<StatusCode> {
    id.require_admin()?;
    tenant_visible(&s, &id, &tenant).await?;
    if let Some(v) = b.monthly_unit_hours
        && (!v.is_finite() || v < 0.0)
    {
        return Err(ApiError::invalid(
            "monthly_unit_hours",
            format!("{v}: a budget is a non-negative number of GPU-unit-hours"),
        ));
    }
    s.store.set_budget(&tenant, b.monthly_unit_hours, now_ms()).await?;
    s.controller
        .govern(crate::controller::Governance::Budget {
            tenant,
            unit_hours: b.monthly_unit_hours,
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UsageParams {
    /// Only this tenant (required for tenant tokens: their own).
    pub tenant: Option<String>,
    /// Start, `YYYY-MM-DD` or RFC 3339 (default: the first of this month, UTC).
    pub from: Option<String>,
    /// End, exclusive (default: now).
    pub to: Option<String>,
    /// `day`, `class`, `project` or `tenant` (default `day`).
    pub by: Option<String>,
    /// `json` (default) or `csv`.
    pub format: Option<String>,
}

/// GPU-unit-hours and cost, allocated and measured, from the usage ledger.
#[utoipa::path(get, path = "/api/v1/usage", tag = "governance", params(UsageParams),
    responses((status = 200, body = UsageReport), (status = 422, body = Problem)))]
async fn usage_report(State(s): State<AppState>, id: Identity, Query(q): Query<UsageParams>) -> ApiResult<Response> {
    let now = now_ms();
    let tenant = match (&q.tenant, &id.tenant) {
        (Some(t), _) if !id.can_read(t) => return Err(ApiError::not_found(format!("no tenant `{t}`"))),
        (None, Some(own)) if !id.is_admin() => Some(own.clone()),
        (t, _) => t.clone(),
    };
    let parse = |field: &str, v: &Option<String>, default: i64| -> ApiResult<i64> {
        match v {
            None => Ok(default),
            Some(x) => parse_time_ms(x)
                .ok_or_else(|| ApiError::invalid(field, format!("`{x}` is not a date (YYYY-MM-DD) or RFC 3339 time"))),
        }
    };
    let from = parse("from", &q.from, month_start_ms(now))?;
    let to = parse("to", &q.to, now)?;
    if to <= from {
        return Err(ApiError::invalid("to", "`to` must be after `from`"));
    }
    let by_s = q.by.clone().unwrap_or_else(|| "day".into());
    let by = crate::usage::By::parse(&by_s)
        .ok_or_else(|| ApiError::invalid("by", format!("`{by_s}`: group by day, class, project or tenant")))?;
    let intervals = s.store.usage_between(tenant.as_deref(), from, to).await?;
    let live_util = s
        .controller
        .view(|ctx| {
            ctx.workloads
                .iter()
                .filter_map(|(id, l)| l.utilisation().map(|u| (*id, u)))
                .collect::<std::collections::HashMap<u64, f64>>()
        })
        .await?;
    let (rows, total) = crate::usage::report(&intervals, from, to, now, by, &s.prices, &live_util);
    match q.format.as_deref().unwrap_or("json") {
        "json" => Ok(Json(UsageReport {
            from: rfc3339_ms(from),
            to: rfc3339_ms(to),
            by: by_s,
            currency: s.prices.currency.clone(),
            rows,
            total,
        })
        .into_response()),
        "csv" => Ok((
            [(axum::http::header::CONTENT_TYPE, "text/csv; charset=utf-8")],
            crate::usage::csv(by, &s.prices.currency, &rows, &total),
        )
            .into_response()),
        f => Err(ApiError::invalid("format", format!("`{f}`: json or csv"))),
    }
}
