//! API tokens: created (the secret shown once), listed, revoked.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use tessera_api::{CreateToken, CreatedToken, Problem, TokenView, rfc3339_ms};
use tessera_store::TokenRecord;
use utoipa::IntoParams;

use super::ApiJson;
use crate::auth::{Identity, Role, new_secret};
use crate::problem::{ApiError, ApiResult};
use crate::{AppState, now_ms};

/// Creates an API token; the secret is in the response only. Platform-admins create any token;
/// tenant-admins create tokens of their own tenant.
#[utoipa::path(post, path = "/api/v1/tokens", tag = "tenancy", request_body = CreateToken,
    responses((status = 201, body = CreatedToken), (status = 403, body = Problem), (status = 422, body = Problem)))]
pub async fn create_token(
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
    let now = now_ms();
    let expires_at = match b.expires_in_s {
        Some(e) if e <= 0 => return Err(ApiError::invalid("expires_in_s", "a lifetime must be positive")),
        Some(e) => Some(now + e * 1000),
        None => None,
    };
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

/// API tokens (platform-admin: all; tenant-admin: its tenant's).
#[utoipa::path(get, path = "/api/v1/tokens", tag = "tenancy", params(TokenParams),
    responses((status = 200, body = Vec<TokenView>), (status = 403, body = Problem)))]
pub async fn list_tokens(
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
pub async fn revoke_token(State(s): State<AppState>, id: Identity, Path(tid): Path<String>) -> ApiResult<StatusCode> {
    let Some(t) = s.store.get_token(&tid).await? else {
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
