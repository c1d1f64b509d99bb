//! API tokens: created (the secret shown once), listed, revoked. The last platform-admin token
//! stays: the store refuses to revoke it, so no administrator can lock everyone out.

use tessera_api::rules::Validate;
use tessera_api::{CreateToken, CreatedToken, TokenView, rfc3339_ms};
use tessera_store::{Revocation, TokenRecord};

use crate::auth::{Identity, Role, new_secret};
use crate::clock::now_ms;
use crate::problem::{ApiError, ApiResult};
use crate::state::AppState;

/// Creates an API token; the secret is in the answer only. Platform-admins create any token;
/// tenant-admins create tokens of their own tenant.
pub async fn create(s: &AppState, id: &Identity, b: CreateToken) -> ApiResult<CreatedToken> {
    b.validate()?;
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
    Ok(CreatedToken {
        id: tid,
        token: secret,
        tenant: b.tenant,
        role: role.as_str().into(),
    })
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

/// API tokens (platform-admin: all, or `tenant`'s; tenant-admin: its tenant's).
pub async fn list(s: &AppState, id: &Identity, tenant: &Option<String>) -> ApiResult<Vec<TokenView>> {
    let tenant = admin_scope(id, tenant, "listing tokens")?;
    let list = s.store.list_tokens(tenant.as_deref()).await?;
    Ok(list
        .into_iter()
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
        .collect())
}

/// Revokes a token: it fails from the next request on (409 for the last platform-admin token
/// without an expiry, or one already revoked).
pub async fn revoke(s: &AppState, id: &Identity, tid: &str) -> ApiResult<()> {
    let Some(t) = s.store.get_token(tid).await? else {
        return Err(ApiError::not_found(format!("no token `{tid}`")));
    };
    let allowed = id.is_admin() || (id.role == Role::TenantAdmin && t.tenant.is_some() && t.tenant == id.tenant);
    if !allowed {
        return Err(ApiError::not_found(format!("no token `{tid}`")));
    }
    match s.store.revoke_token(tid, now_ms()).await? {
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
    Ok(())
}
