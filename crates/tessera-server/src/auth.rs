//! Identities: every request carries an API token (`Authorization: Bearer <token>`), an OIDC
//! access token, or the console's session cookie. Tokens are random 32-byte secrets; only
//! their SHA-256 is stored. A token is platform-wide (`platform-admin`, or `metrics`, which may
//! only read `/metrics`) or scoped to one tenant with a role.
//!
//! The caller is resolved once per request, by the request middleware before the handler runs
//! ([`resolve`], kept in the request as [`Resolved`]): the audit record names the caller as it
//! was before the action, even when the action revokes the caller's own token.

use std::collections::HashMap;
use std::sync::RwLock;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method};
use rand::RngCore;
use sha2::{Digest, Sha256};
use std::sync::Arc;

use tessera_store::Store;

use crate::problem::ApiError;

/// What a caller may do: the API's token roles (`metrics` tokens read `/metrics` only).
pub use tessera_api::TokenRole as Role;

/// The authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// Token id (never the secret); what the audit log and events record.
    pub actor: String,
    /// For people: the token's name, or who signed in; empty where there is none beyond `actor`.
    pub name: String,
    pub role: Role,
    /// `None` for platform-wide tokens.
    pub tenant: Option<String>,
}

impl Identity {
    /// The caller as people read it: the token's name with its id (`ci-bot (tok-1a2b…)`), or
    /// the id alone where the name adds nothing.
    pub fn shown(&self) -> String {
        if self.name.is_empty() || self.name == self.actor {
            self.actor.clone()
        } else {
            format!("{} ({})", self.name, self.actor)
        }
    }

    pub fn is_admin(&self) -> bool {
        self.role == Role::PlatformAdmin
    }

    /// The tenant scope store queries are limited to: `None` for platform-admins; a tenant-less
    /// non-admin gets a scope that matches nothing.
    pub fn scope(&self) -> Option<&str> {
        if self.is_admin() {
            None
        } else {
            Some(self.tenant.as_deref().unwrap_or(""))
        }
    }

    /// Whether the caller may read objects of `tenant`.
    pub fn can_read(&self, tenant: &str) -> bool {
        self.is_admin() || self.tenant.as_deref() == Some(tenant)
    }

    /// Whether the caller may create or cancel workloads of `tenant`.
    pub fn can_write(&self, tenant: &str) -> bool {
        self.is_admin() || (self.tenant.as_deref() == Some(tenant) && self.role != Role::Viewer)
    }

    pub fn require_admin(&self) -> Result<(), ApiError> {
        if self.is_admin() {
            Ok(())
        } else {
            Err(ApiError::forbidden(format!(
                "this needs a platform-admin token; yours is {} of tenant {}",
                self.role.as_str(),
                self.tenant.as_deref().unwrap_or("-")
            )))
        }
    }
}

/// A new random token secret: `tsr_` + 64 hex digits.
pub fn new_secret() -> String {
    let mut b = [0u8; 32];
    rand::rng().fill_bytes(&mut b);
    format!("tsr_{}", hex::encode(b))
}

pub fn hash(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// A token look-up: the identity, the token's expiry, and when it was looked up (ms).
type Cached = (Identity, Option<i64>, i64);

/// Resolves bearer tokens, caching successful look-ups (with the token's expiry, checked on
/// every use; a revocation clears the cache).
pub struct Authenticator {
    store: Arc<dyn Store>,
    /// By token hash.
    cache: RwLock<HashMap<String, Cached>>,
    oidc: Option<crate::oidc::OidcVerifier>,
    /// How long a look-up is trusted (ms); `None`: until a revocation in this process.
    cache_ttl_ms: Option<i64>,
}

impl Authenticator {
    pub fn new(store: Arc<dyn Store>, oidc: Option<crate::oidc::OidcVerifier>) -> Self {
        Authenticator {
            store,
            cache: RwLock::default(),
            oidc,
            cache_ttl_ms: None,
        }
    }

    /// Trusts a cached look-up for at most `ttl`: replicas sharing a database do not see each
    /// other's revocations, so a token revoked through another replica fails here within `ttl`.
    pub fn with_cache_ttl(mut self, ttl: std::time::Duration) -> Self {
        self.cache_ttl_ms = Some(ttl.as_millis() as i64);
        self
    }

    /// The OIDC verifier, when single sign-on is configured.
    pub fn oidc(&self) -> Option<&crate::oidc::OidcVerifier> {
        self.oidc.as_ref()
    }

    /// Forgets every cached identity (after a revocation: revoked tokens fail at once).
    /// A token created outside this process (`tessera admin recover`) needs no invalidation:
    /// unknown hashes are always looked up in the store.
    pub fn invalidate(&self) {
        self.cache.write().expect("lock").clear();
    }

    pub async fn identify(&self, authorization: Option<&str>) -> Result<Identity, ApiError> {
        let Some(h) = authorization else {
            return Err(ApiError::unauthorized("missing `Authorization: Bearer <token>` header"));
        };
        let Some(secret) = h.strip_prefix("Bearer ").map(str::trim).filter(|s| !s.is_empty()) else {
            return Err(ApiError::unauthorized(
                "the Authorization header must be `Bearer <token>`",
            ));
        };
        if let Some(oidc) = &self.oidc
            && crate::oidc::OidcVerifier::looks_like_jwt(secret)
        {
            return oidc.verify(secret).await;
        }
        let key = hash(secret);
        let now = crate::clock::now_ms();
        if let Some((id, expires_at, cached_at)) = self.cache.read().expect("lock").get(&key)
            && expires_at.is_none_or(|e| e > now)
            && self.cache_ttl_ms.is_none_or(|ttl| now - cached_at < ttl)
        {
            return Ok(id.clone());
        }
        let rec = self.store.find_token(&key).await?;
        let Some(rec) = rec.filter(|r| r.revoked_at.is_none() && r.expires_at.is_none_or(|e| e > now)) else {
            return Err(ApiError::unauthorized("unknown, expired or revoked token"));
        };
        let role = Role::parse(&rec.role).ok_or_else(|| ApiError::unauthorized("token has an unknown role"))?;
        let id = Identity {
            actor: rec.id,
            name: rec.name,
            role,
            tenant: rec.tenant,
        };
        let mut cache = self.cache.write().expect("lock");
        // Bounded: an attacker cycling through valid tokens cannot grow it without limit.
        if cache.len() >= 100_000 {
            cache.clear();
        }
        cache.insert(key, (id.clone(), rec.expires_at, now));
        Ok(id)
    }
}

/// The caller of a request as resolved before its handler ran.
#[derive(Clone, Debug)]
pub struct Resolved(pub Result<Identity, ApiError>);

/// Who makes a request: its bearer token, or else the console's session cookie (whose changes
/// need the session's CSRF token).
pub async fn resolve(
    headers: &HeaderMap,
    method: &Method,
    state: &crate::state::AppState,
) -> Result<Identity, ApiError> {
    let h = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if h.is_none()
        && let Some(sess) = state.sessions.from_headers(headers)
    {
        if !matches!(*method, Method::GET | Method::HEAD) {
            crate::session::check_csrf(headers, &sess)?;
        }
        return Ok(sess.identity);
    }
    state.auth.identify(h).await
}

async fn resolved(parts: &Parts, state: &crate::state::AppState) -> Result<Identity, ApiError> {
    match parts.extensions.get::<Resolved>() {
        Some(Resolved(r)) => r.clone(),
        None => resolve(&parts.headers, &parts.method, state).await,
    }
}

impl FromRequestParts<crate::state::AppState> for Identity {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &crate::state::AppState) -> Result<Self, Self::Rejection> {
        let id = resolved(parts, state).await?;
        if id.role == Role::Metrics {
            return Err(ApiError::forbidden(
                "a metrics token may only read /metrics; use a tenant or platform-admin token for the API",
            ));
        }
        Ok(id)
    }
}

/// A platform-admin caller. Handlers of platform-admin operations take it before their path,
/// query and body, so that any other caller is refused (403) before what it sent is read: a
/// tenant's token learns nothing from the operation's validation (which pools or names exist,
/// which values pass) and gets the same answer whatever it sends. The services check the
/// role again for their other callers (the console).
pub struct PlatformAdmin(pub Identity);

impl FromRequestParts<crate::state::AppState> for PlatformAdmin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &crate::state::AppState) -> Result<Self, Self::Rejection> {
        let id = Identity::from_request_parts(parts, state).await?;
        id.require_admin()?;
        Ok(PlatformAdmin(id))
    }
}

/// A caller allowed to read `/metrics` on the API address: a `metrics` or `platform-admin`
/// token (the metrics show every tenant's names and use).
pub struct MetricsReader(pub Identity);

impl FromRequestParts<crate::state::AppState> for MetricsReader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &crate::state::AppState) -> Result<Self, Self::Rejection> {
        let id = resolved(parts, state).await?;
        if matches!(id.role, Role::Metrics | Role::PlatformAdmin) {
            Ok(MetricsReader(id))
        } else {
            Err(ApiError::forbidden(format!(
                "/metrics needs a metrics or platform-admin token; yours is {} of tenant {}",
                id.role.as_str(),
                id.tenant.as_deref().unwrap_or("-")
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_random_and_hashed() {
        let a = new_secret();
        assert!(a.starts_with("tsr_") && a.len() == 68);
        assert!(a[4..].bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)));
        assert_ne!(a, new_secret());
        assert_eq!(hash("x").len(), 64);
        assert_eq!(
            hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn tenant_scopes() {
        let m = Identity {
            actor: "t1".into(),
            name: String::new(),
            role: Role::Member,
            tenant: Some("vision".into()),
        };
        assert!(m.can_write("vision") && !m.can_write("nlp") && !m.can_read("nlp"));
        let v = Identity {
            role: Role::Viewer,
            ..m.clone()
        };
        assert!(v.can_read("vision") && !v.can_write("vision"));
        assert!(m.require_admin().is_err());
    }
}
