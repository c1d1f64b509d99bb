//! API tokens over HTTP: each handler is the service of [`crate::services::tokens`].

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tessera_api::rules::{Validate, Violation};
use tessera_api::{CreateToken, CreatedToken, Problem, TokenView};
use utoipa::IntoParams;

use super::{ApiJson, ApiPath, ApiQuery};
use crate::auth::Identity;
use crate::problem::ApiResult;
use crate::services::tokens;
use crate::state::AppState;

/// Creates an API token; the secret is in the response only. Platform-admins create any token
/// (`metrics` tokens for Prometheus among them); tenant-admins create tokens of their own
/// tenant.
#[utoipa::path(post, path = "/api/v1/tokens", tag = "tenancy", request_body = CreateToken,
    responses((status = 201, body = CreatedToken)))]
pub async fn create_token(
    State(s): State<AppState>,
    id: Identity,
    ApiJson(b): ApiJson<CreateToken>,
) -> ApiResult<Response> {
    let name = b.name.clone().filter(|n| !n.trim().is_empty());
    let t: CreatedToken = tokens::create(&s, &id, b).await?;
    // The audit record names the token made (never its secret), as the console's form does.
    let what = crate::audit::AuditObject(format!(
        "created token {} ({}), {} {}",
        t.id,
        name.as_deref().unwrap_or("no name"),
        t.role,
        t.tenant
            .as_deref()
            .map_or_else(|| "platform-wide".to_string(), |t| format!("of tenant {t}"))
    ));
    let mut r = (StatusCode::CREATED, Json(t)).into_response();
    r.extensions_mut().insert(what);
    Ok(r)
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
    tokens::list(&s, &id, &q.tenant).await.map(Json)
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
    tokens::revoke(&s, &id, &tid).await?;
    Ok(StatusCode::NO_CONTENT)
}
