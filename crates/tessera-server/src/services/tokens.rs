//! API tokens: created (the secret shown once), listed, revoked. The last platform-admin token
//! stays: the store refuses to revoke it, so no administrator can lock everyone out. And how a
//! token id recorded in an event or a reason is named where it is shown (the API's timelines,
//! the console): by the token's name, to those who may see the token.

use std::collections::HashMap;

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

/// Where the token ids (`tok-` and 12 lower-case hex digits) stand in `text`: their byte
/// offsets, in order.
fn token_spans(text: &str) -> Vec<usize> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut from = 0;
    while let Some(k) = text[from..].find("tok-") {
        let i = from + k;
        let hex = bytes[i + 4..]
            .iter()
            .take_while(|&&b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            .count();
        let before_ok = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'-');
        if hex == 12 && before_ok {
            out.push(i);
            from = i + 16;
        } else {
            from = i + 4;
        }
    }
    out
}

/// The token ids in `text`, in order.
pub fn token_ids(text: &str) -> Vec<&str> {
    token_spans(text).into_iter().map(|i| &text[i..i + 16]).collect()
}

/// How the API's timelines and the console name each token id found in `texts`: `name (tok-…)` for a token the caller
/// may see (platform admins: every token; others: their own tenant's), `tok-… (deleted)` for
/// one the store no longer knows, the bare id otherwise (another tenant's or a platform token:
/// nothing about it is said). Read at display time: the events keep the id.
pub async fn token_names<'a>(
    s: &AppState,
    caller: &Identity,
    texts: impl IntoIterator<Item = &'a str>,
) -> ApiResult<HashMap<String, String>> {
    let ids: std::collections::BTreeSet<&str> = texts.into_iter().flat_map(token_ids).collect();
    let mut out = HashMap::new();
    for id in ids {
        let shown = match s.store.get_token(id).await? {
            None => format!("{id} (deleted)"),
            Some(t) if caller.is_admin() || (t.tenant.is_some() && t.tenant == caller.tenant) => {
                if t.name.is_empty() {
                    id.to_string()
                } else {
                    format!("{} ({id})", t.name)
                }
            }
            Some(_) => id.to_string(),
        };
        out.insert(id.to_string(), shown);
    }
    Ok(out)
}

/// Each of `texts` with its token ids named where `caller` may see the token
/// ([`token_names`]), in place; no store read when none holds a token id.
pub async fn name_in<'a>(
    s: &AppState,
    caller: &Identity,
    texts: impl IntoIterator<Item = &'a mut String>,
) -> ApiResult<()> {
    let mut texts: Vec<&mut String> = texts.into_iter().filter(|t| !token_spans(t).is_empty()).collect();
    if texts.is_empty() {
        return Ok(());
    }
    let names = token_names(s, caller, texts.iter().map(|t| t.as_str())).await?;
    for t in &mut texts {
        **t = name_tokens(t, &names);
    }
    Ok(())
}

/// `text` with each token id replaced by how `names` shows it.
pub fn name_tokens(text: &str, names: &HashMap<String, String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for i in token_spans(text) {
        let id = &text[i..i + 16];
        out.push_str(&text[at..i]);
        out.push_str(names.get(id).map_or(id, String::as_str));
        at = i + 16;
    }
    out.push_str(&text[at..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_ids_in_events_are_named_at_display_time() {
        let text = "member token tok-0123456789ab may create workloads; cancelled by tok-ffffffffffff, not xtok-0123456789ab nor tok-12";
        assert_eq!(token_ids(text), ["tok-0123456789ab", "tok-ffffffffffff"]);
        let names: HashMap<String, String> = [
            ("tok-0123456789ab".to_string(), "ci-bot (tok-0123456789ab)".to_string()),
            ("tok-ffffffffffff".to_string(), "tok-ffffffffffff (deleted)".to_string()),
        ]
        .into();
        assert_eq!(
            name_tokens(text, &names),
            "member token ci-bot (tok-0123456789ab) may create workloads; cancelled by tok-ffffffffffff (deleted), not xtok-0123456789ab nor tok-12"
        );
        assert_eq!(
            name_tokens("tok-0123456789ab tok-0123456789ab", &names),
            "ci-bot (tok-0123456789ab) ci-bot (tok-0123456789ab)"
        );
        assert_eq!(name_tokens("no token here", &names), "no token here");
    }
}
