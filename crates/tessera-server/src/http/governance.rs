//! Quotas and budgets over HTTP: each handler is the service of the same name
//! ([`crate::services::governance`]).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use tessera_api::{Problem, QuotaView, SetBudget, SetQuota, TenantQuotas};

use super::{ApiJson, ApiPath};
use crate::auth::{Identity, PlatformAdmin};
use crate::problem::ApiResult;
use crate::services::governance;
use crate::state::AppState;

/// A tenant's quotas (with use and borrowing) and budget.
#[utoipa::path(get, path = "/api/v1/tenants/{tenant}/quotas", tag = "governance", params(("tenant" = String, Path)),
    responses((status = 200, body = TenantQuotas), (status = 404, body = Problem)))]
pub async fn get_quotas(
    State(s): State<AppState>,
    id: Identity,
    ApiPath(tenant): ApiPath<String>,
) -> ApiResult<Json<TenantQuotas>> {
    governance::quotas(&s, &id, &tenant).await.map(Json)
}

/// Sets a tenant's quota for a resource class (platform-admin).
#[utoipa::path(put, path = "/api/v1/tenants/{tenant}/quotas/{class}", tag = "governance",
    params(("tenant" = String, Path), ("class" = String, Path, description = "A pool, or pool/MODEL (URL-encode the slash)")),
    request_body = SetQuota, responses((status = 200, body = QuotaView), (status = 403, body = Problem), (status = 422, body = Problem)))]
pub async fn set_quota(
    State(s): State<AppState>,
    PlatformAdmin(id): PlatformAdmin,
    ApiPath((tenant, class)): ApiPath<(String, String)>,
    ApiJson(b): ApiJson<SetQuota>,
) -> ApiResult<Json<QuotaView>> {
    governance::set_quota(&s, &id, &tenant, &class, &b).await.map(Json)
}

/// Removes a tenant's quota for a class (platform-admin).
#[utoipa::path(delete, path = "/api/v1/tenants/{tenant}/quotas/{class}", tag = "governance", params(("tenant" = String, Path), ("class" = String, Path)),
    responses((status = 204), (status = 404, body = Problem)))]
pub async fn delete_quota(
    State(s): State<AppState>,
    id: Identity,
    ApiPath((tenant, class)): ApiPath<(String, String)>,
) -> ApiResult<StatusCode> {
    governance::delete_quota(&s, &id, &tenant, &class).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Sets or removes a tenant's monthly GPU-unit-hour budget (platform-admin).
#[utoipa::path(put, path = "/api/v1/tenants/{tenant}/budget", tag = "governance", params(("tenant" = String, Path)),
    request_body = SetBudget, responses((status = 204), (status = 403, body = Problem), (status = 422, body = Problem)))]
pub async fn set_budget(
    State(s): State<AppState>,
    PlatformAdmin(id): PlatformAdmin,
    ApiPath(tenant): ApiPath<String>,
    ApiJson(b): ApiJson<SetBudget>,
) -> ApiResult<StatusCode> {
    governance::set_budget(&s, &id, &tenant, &b).await?;
    Ok(StatusCode::NO_CONTENT)
}
