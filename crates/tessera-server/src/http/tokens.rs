//! API tokens: created (the secret shown once), listed, revoked. The last platform-admin token
//! stays: the store refuses to revoke it, so no administrator can lock everyone out.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use tessera_api::rules::{Validate, Violation};
use tessera_api::{CreateToken, CreatedToken, Problem, TokenView, rfc3339_ms};
use tessera_store::{Revocation, TokenRecord};
use utoipa::IntoParams;

use super::{ApiJson, ApiPath, ApiQuery};
use crate::auth::{Identity, Role, new_secret};
use crate::problem::{ApiError, ApiResult};
use crate::{AppState, now_ms};

/// Creates an API token; the secret is in the response only. Platform-admins create any token
/// (`metrics` tokens for Prometheus among them); tenant-admins create tokens of their own
/// tenant.
#[utoipa::path(post, path = "/api/v1/tokens", tag = "tenancy", request_body = CreateToken,
    responses((status = 201, body = CreatedToken)))]
pub async fn create_token(
    State(s): State<AppState>,
    id: Identity,
    ApiJson(b): ApiJson<CreateToken>,
) -> ApiResult<(StatusCode, Json<CreatedToken>)> {
    let role = b.role;
    if !id.is_admin() {
        let own = id.role == Role::TenantAdmin && b.tenant.is_some() && b.tenant == id.tenant && role.is_tenant_role();
        if !own {
            return Err(ApiError::forbidden(
                "only platform-admins, or tenant-admins for their own tenant, can create tokens",
            ));
        }
    }
    if let Some(t) = &b.tenant
        && s.store.get_tenant(t).await?.is_none()
    {
        return Err(ApiError::invalid("tenant", format!("no tenant `{t}`")));
    }
    let now = now_ms();
    // Bounded by the rule (two years), so this cannot overflow.
    let expires_at = b.expires_in_s.map(|e| now + e * 1000);
    let secret = new_secret();
    let hash = crate::auth::hash(&secret);
    let tid = format!("tok-{}", &hash[..12]);
    s.store
        .create_token(&TokenRecord {
            id: tid.clone(),
            hash,
            tenant: b.tenant.clone(),
            role: role.as_str().into(),
            name: b.name.clone().unwrap_or_default(),
            created_at: now,
            expires_at,
            revoked_at: None,
        })
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
pub fn admin_scope(id: &Identity, requested: &Option<String>, what: &str) -> ApiResult<Option<String>> {
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

impl Validate for TokenParams {
    fn validate(&self) -> Result<(), Violation> {
        Ok(())
    }
}

/// API tokens (platform-admin: all; tenant-admin: its tenant's).
#[utoipa::path(get, path = "/api/v1/tokens", tag = "tenancy", params(TokenParams),
    responses((status = 200, body = Vec<TokenView>)))]
pub async fn list_tokens(
    State(s): State<AppState>,
    id: Identity,
    ApiQuery(q): ApiQuery<TokenParams>,
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

/// Revokes a token: it fails from the next request on. The last platform-admin token without
/// an expiry cannot be revoked (409): create another one first, or recover locally with
/// `tessera admin recover`.
#[utoipa::path(delete, path = "/api/v1/tokens/{id}", tag = "tenancy", params(("id" = String, Path)),
    responses((status = 204, description = "Revoked"),
        (status = 409, description = "Already revoked, or the last platform-admin token", body = Problem)))]
pub async fn revoke_token(
    State(s): State<AppState>,
    id: Identity,
    ApiPath(tid): ApiPath<String>,
) -> ApiResult<StatusCode> {
    let Some(t) = s.store.get_token(&tid).await? else {
        return Err(ApiError::not_found(format!("no token `{tid}`")));
    };
    let allowed = id.is_admin() || (id.role == Role::TenantAdmin && t.tenant.is_some() && t.tenant == id.tenant);
    if !allowed {
        return Err(ApiError::not_found(format!("no token `{tid}`")));
    }
    match s.store.revoke_token(&tid, now_ms()).await? {
        Revocation::Revoked => {}
        Revocation::NotActive => return Err(ApiError::conflict(format!("token `{tid}` is already revoked"))),
        Revocation::LastPlatformAdmin => {
            return Err(ApiError::conflict(format!(
                "token `{tid}` is the last platform-admin token without an expiry: revoking it would lock \
                 every administrator out; create another platform-admin token first"
            ))
            .with_kind("last-admin"));
        }
    }
    s.auth.invalidate();
    Ok(StatusCode::NO_CONTENT)
}
