//! Console sign-in through the organisation's identity provider: the OAuth 2.0 Authorization
//! Code flow with PKCE, `state` and `nonce` checked, ending in a session cookie (`HttpOnly`,
//! `SameSite=Lax`, `Secure` when served over TLS). Requests authenticated by the cookie must
//! carry the session's CSRF token in `X-CSRF-Token` to change anything. Logout clears both.
//!
//! Sessions live in memory: a restart signs everyone out of the console (API tokens and the
//! CLI are unaffected).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tessera_store::AuditRecord;

use crate::auth::{Identity, new_secret};
use crate::clock::now_ms;
use crate::problem::ApiError;
use crate::state::AppState;

pub const COOKIE: &str = "tessera_session";
const LOGIN_TTL: Duration = Duration::from_secs(600);
const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);

struct Pending {
    verifier: String,
    nonce: String,
    at: Instant,
}

#[derive(Clone)]
pub struct Session {
    pub identity: Identity,
    pub csrf: String,
    expires: Instant,
}

/// Sign-ins in progress and open sessions.
pub struct Sessions {
    logins: Mutex<HashMap<String, Pending>>,
    sessions: Mutex<HashMap<String, Session>>,
    secure: bool,
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn random() -> String {
    new_secret()[4..].to_string()
}

impl Sessions {
    pub fn new(secure: bool) -> Self {
        Sessions {
            logins: Mutex::default(),
            sessions: Mutex::default(),
            secure,
        }
    }

    /// Opens a session for `identity` (after a sign-in); returns its id, the cookie's value.
    pub fn open(&self, identity: Identity) -> String {
        let (sid, csrf) = (random(), random());
        let mut s = self.sessions.lock().expect("lock");
        let now = Instant::now();
        s.retain(|_, x| x.expires > now);
        s.insert(
            sid.clone(),
            Session {
                identity,
                csrf,
                expires: now + SESSION_TTL,
            },
        );
        sid
    }

    /// The `Set-Cookie` value of session `sid`: `HttpOnly`, `SameSite=Lax` (the provider's
    /// redirect back is a cross-site navigation), `Secure` when served over TLS.
    pub fn cookie(&self, sid: &str) -> HeaderValue {
        let secure = if self.secure { "; Secure" } else { "" };
        let cookie = format!(
            "{COOKIE}={sid}; HttpOnly; SameSite=Lax; Path=/; Max-Age={}{secure}",
            SESSION_TTL.as_secs()
        );
        HeaderValue::from_str(&cookie).expect("ascii cookie")
    }

    /// Whether cookies are marked `Secure` (the server speaks TLS).
    pub fn secure(&self) -> bool {
        self.secure
    }

    /// Closes the session a request's cookie names.
    pub fn close(&self, headers: &HeaderMap) {
        if let Some(sid) = cookie(headers, COOKIE) {
            self.sessions.lock().expect("lock").remove(&sid);
        }
    }

    /// The session a request's cookie names, if it is open.
    pub fn from_headers(&self, headers: &HeaderMap) -> Option<Session> {
        let sid = cookie(headers, COOKIE)?;
        let mut s = self.sessions.lock().expect("lock");
        match s.get(&sid) {
            Some(x) if x.expires > Instant::now() => Some(x.clone()),
            Some(_) => {
                s.remove(&sid);
                None
            }
            None => None,
        }
    }
}

/// A cookie's value from the request headers.
pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

fn redirect(to: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    r.headers_mut().insert(
        header::LOCATION,
        HeaderValue::from_str(to).unwrap_or(HeaderValue::from_static("/")),
    );
    r
}

/// `GET /auth/login`: sends the browser to the provider.
pub async fn login(State(s): State<AppState>) -> Result<Response, ApiError> {
    let Some(oidc) = s.auth.oidc() else {
        return Err(ApiError::not_found(
            "single sign-on is not configured on this server; use an API token",
        ));
    };
    let (Some(auth), Some(client), Some(redirect_url)) = (
        &oidc.authorization_endpoint,
        &oidc.cfg.client_id,
        &oidc.cfg.redirect_url,
    ) else {
        return Err(ApiError::not_found(
            "console sign-in is not configured (client_id and redirect_url in the OIDC settings)",
        ));
    };
    let (state, nonce, verifier) = (random(), random(), random());
    let challenge = b64(&Sha256::digest(verifier.as_bytes()));
    {
        let mut l = s.sessions.logins.lock().expect("lock");
        l.retain(|_, p| p.at.elapsed() < LOGIN_TTL);
        l.insert(
            state.clone(),
            Pending {
                verifier,
                nonce: nonce.clone(),
                at: Instant::now(),
            },
        );
    }
    let q = |v: &str| {
        v.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect::<String>()
    };
    let url = format!(
        "{auth}?response_type=code&client_id={}&redirect_uri={}&scope=openid&state={state}&nonce={nonce}&code_challenge={challenge}&code_challenge_method=S256",
        q(client),
        q(redirect_url)
    );
    Ok(redirect(&url))
}

#[derive(Deserialize)]
pub struct Callback {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

/// `GET /auth/callback`: redeems the code, checks the ID token, opens a session.
pub async fn callback(State(s): State<AppState>, Query(c): Query<Callback>) -> Result<Response, ApiError> {
    let oidc = s
        .auth
        .oidc()
        .ok_or_else(|| ApiError::not_found("single sign-on is not configured"))?;
    if let Some(e) = c.error {
        return Err(ApiError::unauthorized(format!(
            "the identity provider refused the sign-in: {e} {}",
            c.error_description.unwrap_or_default()
        )));
    }
    let (Some(code), Some(state)) = (c.code, c.state) else {
        return Err(ApiError::bad_request("the callback needs `code` and `state`"));
    };
    let pending = s.sessions.logins.lock().expect("lock").remove(&state);
    let Some(p) = pending.filter(|p| p.at.elapsed() < LOGIN_TTL) else {
        return Err(ApiError::unauthorized(
            "unknown or expired sign-in (state); start again at /auth/login",
        ));
    };
    let id_token = oidc.redeem(&code, &p.verifier).await.map_err(ApiError::unauthorized)?;
    let identity = oidc.verify_id_token(&id_token, &p.nonce).await?;
    let sid = s.sessions.open(identity.clone());
    s.audit
        .record(AuditRecord {
            seq: 0,
            at: now_ms(),
            request_id: format!("login-{}", &sid[..8]),
            actor: identity.actor.clone(),
            tenant: identity.tenant.clone(),
            action: "login".into(),
            target: "/auth/callback".into(),
            outcome: 303,
            detail: format!("console sign-in as {}", identity.role.as_str()),
        })
        .await;
    let mut r = redirect("/console");
    r.headers_mut().insert(header::SET_COOKIE, s.sessions.cookie(&sid));
    Ok(r)
}

/// `GET /auth/session`: who the console is signed in as, and the CSRF token to send back.
pub async fn whoami(State(s): State<AppState>, headers: HeaderMap) -> Result<axum::Json<serde_json::Value>, ApiError> {
    let sess = s
        .sessions
        .from_headers(&headers)
        .ok_or_else(|| ApiError::unauthorized("not signed in"))?;
    Ok(axum::Json(serde_json::json!({
        "actor": sess.identity.actor,
        "role": sess.identity.role.as_str(),
        "tenant": sess.identity.tenant,
        "csrf_token": sess.csrf,
    })))
}

/// `POST /auth/logout` (with `X-CSRF-Token`): closes the session and clears the cookie.
pub async fn logout(State(s): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let sess = s
        .sessions
        .from_headers(&headers)
        .ok_or_else(|| ApiError::unauthorized("not signed in"))?;
    check_csrf(&headers, &sess)?;
    s.sessions.close(&headers);
    let mut r = StatusCode::NO_CONTENT.into_response();
    let cookie = format!("{COOKIE}=; HttpOnly; SameSite=Lax; Path=/; Max-Age=0");
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&cookie).expect("ascii cookie"),
    );
    Ok(r)
}

/// A cookie-authenticated change must carry the session's CSRF token (synchronizer token:
/// the console's pages send it in `X-CSRF-Token` with every htmx request).
pub fn check_csrf(headers: &HeaderMap, sess: &Session) -> Result<(), ApiError> {
    let sent = headers.get("x-csrf-token").and_then(|v| v.to_str().ok());
    let ok = sent.is_some_and(|t| constant_time_eq(t.as_bytes(), sess.csrf.as_bytes()));
    if !ok {
        return Err(ApiError::forbidden(
            "missing or wrong X-CSRF-Token for a change made with the console's session",
        ));
    }
    Ok(())
}

/// Compares two secrets in time that depends on their length only.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_found_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; tessera_session=abc; b=2"),
        );
        assert_eq!(cookie(&h, COOKIE).as_deref(), Some("abc"));
        assert_eq!(cookie(&h, "c"), None);
        // The PKCE challenge is base64url(SHA-256(verifier)) without padding (RFC 7636 example).
        assert_eq!(
            b64(&Sha256::digest(b"dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk")),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
    }
}
