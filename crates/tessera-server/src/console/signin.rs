//! Console sign-in with an API token (the embedded default, where no single sign-on is
//! configured; also offered beside it) and sign-out. The token is checked like a bearer token
//! and then traded for a session cookie; the token itself is never stored in the browser.
//!
//! The sign-in form has no session yet, so its CSRF protection is a double-submit token: a
//! random value in a `SameSite=Strict` cookie set with the form and in a hidden field, which
//! must match.

use askama::Template;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::{Caller, html, redirect};
use crate::auth::Role;
use crate::session::{constant_time_eq, cookie};
use crate::state::AppState;

const FORM_COOKIE: &str = "tessera_signin";

#[derive(Template)]
#[template(path = "console/signin.html")]
struct SigninPage<'a> {
    assets: &'static super::assets::Urls,
    form_token: &'a str,
    sso: bool,
    error: Option<&'a str>,
}

fn page(s: &AppState, status: StatusCode, error: Option<&str>) -> Response {
    let token = crate::auth::new_secret()[4..36].to_string();
    let sso = s.auth.oidc().is_some_and(|o| o.authorization_endpoint.is_some());
    let mut r = html(&SigninPage {
        assets: super::assets::urls(),
        form_token: &token,
        sso,
        error,
    });
    *r.status_mut() = status;
    let secure = if s.sessions.secure() { "; Secure" } else { "" };
    let c = format!("{FORM_COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/console/signin; Max-Age=1800{secure}");
    r.headers_mut()
        .insert(header::SET_COOKIE, HeaderValue::from_str(&c).expect("ascii cookie"));
    r
}

/// `GET /console/signin`: the sign-in page (the token form, and the SSO link where configured).
pub async fn form(State(s): State<AppState>) -> Response {
    page(&s, StatusCode::OK, None)
}

#[derive(Deserialize)]
struct Submitted {
    #[serde(default)]
    token: String,
    #[serde(default)]
    form_token: String,
}

/// `POST /console/signin` (form): checks the token, opens a session, goes to the overview.
pub async fn submit(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let Ok(f) = serde_urlencoded::from_bytes::<Submitted>(&body) else {
        return page(
            &s,
            StatusCode::BAD_REQUEST,
            Some("the form could not be read; try again"),
        );
    };
    let expected = cookie(&headers, FORM_COOKIE).unwrap_or_default();
    if expected.is_empty() || !constant_time_eq(expected.as_bytes(), f.form_token.as_bytes()) {
        return crate::problem::ApiError::forbidden(
            "the sign-in form's CSRF token is missing or does not match; reload the sign-in page",
        )
        .into_response();
    }
    let token = f.token.trim();
    if token.is_empty() {
        return page(&s, StatusCode::UNPROCESSABLE_ENTITY, Some("enter an API token (tsr_…)"));
    }
    let id = match s.auth.identify(Some(&format!("Bearer {token}"))).await {
        Ok(id) if id.role == Role::Metrics => {
            return page(
                &s,
                StatusCode::FORBIDDEN,
                Some("a metrics token cannot use the console; use a tenant or platform-admin token"),
            );
        }
        Ok(id) => id,
        Err(e) if e.status == StatusCode::UNAUTHORIZED => {
            audit(
                &s,
                "auth.failure",
                "anonymous",
                None,
                401,
                "console token sign-in refused",
            )
            .await;
            return page(&s, StatusCode::UNAUTHORIZED, Some("unknown, expired or revoked token"));
        }
        Err(e) => return e.into_response(),
    };
    let detail = format!("console sign-in with a token as {}", id.role.as_str());
    if !audit(&s, "login", &id.actor, id.tenant.clone(), 303, &detail).await {
        return crate::problem::ApiError::unavailable("the audit log is unavailable; retry shortly").into_response();
    }
    let sid = s.sessions.open(id);
    let mut r = redirect("/console");
    let h = r.headers_mut();
    h.append(header::SET_COOKIE, s.sessions.cookie(&sid));
    h.append(
        header::SET_COOKIE,
        HeaderValue::from_static("tessera_signin=; HttpOnly; SameSite=Strict; Path=/console/signin; Max-Age=0"),
    );
    r
}

async fn audit(s: &AppState, action: &str, actor: &str, tenant: Option<String>, outcome: u16, detail: &str) -> bool {
    s.audit
        .record(tessera_store::AuditRecord {
            seq: 0,
            at: crate::clock::now_ms(),
            request_id: format!("console-{}", &crate::auth::new_secret()[4..12]),
            actor: actor.into(),
            tenant,
            action: action.into(),
            target: "/console/signin".into(),
            outcome,
            detail: detail.into(),
        })
        .await
}

/// `POST /console/signout` (htmx, with the CSRF token): closes the session.
pub async fn signout(State(s): State<AppState>, _c: Caller, headers: HeaderMap) -> Response {
    s.sessions.close(&headers);
    let mut r = StatusCode::NO_CONTENT.into_response();
    let h = r.headers_mut();
    h.insert("hx-redirect", HeaderValue::from_static("/console/signin"));
    h.insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&format!(
            "{}=; HttpOnly; SameSite=Lax; Path=/; Max-Age=0",
            crate::session::COOKIE
        ))
        .expect("ascii cookie"),
    );
    r
}
