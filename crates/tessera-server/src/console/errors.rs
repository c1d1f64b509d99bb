//! Error pages for people: a console page a browser asked for (a plain `GET`, not an htmx
//! fragment) that answers a problem — denied (403), not found (404), failed (5xx) — is sent as
//! an HTML page with the console's navigation and the problem's message, with the same
//! status. The REST API under `/api` and every htmx request keep RFC 7807 problem JSON (the
//! console's script shows those in the page's alert region).

use askama::Template;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};

use super::Chrome;
use crate::problem::PROBLEM_JSON;
use crate::state::AppState;

#[derive(Template)]
#[template(path = "console/error.html")]
struct ErrorPage {
    chrome: Chrome,
    status: u16,
    title: &'static str,
    detail: String,
    /// What to do next, in a sentence.
    next: &'static str,
}

/// Whether `path` is a console page (not an asset, not the API).
fn console_page(path: &str) -> bool {
    path == "/console" || path.starts_with("/console/")
}

/// The heading and the next step for a status.
fn words(status: StatusCode) -> (&'static str, &'static str) {
    match status {
        StatusCode::FORBIDDEN => (
            "Not allowed",
            "Your role does not give access to this page. Ask a tenant-admin or platform-admin if you need it.",
        ),
        StatusCode::NOT_FOUND => (
            "Not found",
            "It may have been deleted, or belong to another tenant. The navigation above leads to every page.",
        ),
        StatusCode::UNPROCESSABLE_ENTITY | StatusCode::BAD_REQUEST => (
            "This address asks for something the page cannot show",
            "Go back and choose again from the page's own lists.",
        ),
        s if s.is_server_error() => (
            "Something went wrong",
            "This is not something you did. Try again in a moment; if it keeps happening, tell your platform team the time it happened.",
        ),
        _ => (
            "This page could not be shown",
            "The navigation above leads to every page.",
        ),
    }
}

/// `GET /console/…` of no page (once signed in): 404.
pub async fn no_page(_c: super::Caller, uri: axum::http::Uri) -> crate::problem::ApiError {
    crate::problem::ApiError::not_found(format!("no route {}", uri.path()))
}

/// Renders an error page for a browser's `GET` of a console page that answered a problem
/// (sign-in redirects, 401, and htmx requests are left as they are).
pub async fn middleware(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let wanted = matches!(*req.method(), Method::GET | Method::HEAD)
        && console_page(req.uri().path())
        && !req.headers().contains_key("hx-request");
    if !wanted {
        return next.run(req).await;
    }
    let headers: HeaderMap = req.headers().clone();
    let path = req.uri().path().to_string();
    let r = next.run(req).await;
    let status = r.status();
    let problem = r
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == PROBLEM_JSON.as_bytes());
    if !problem || !(status.is_client_error() || status.is_server_error()) || status == StatusCode::UNAUTHORIZED {
        return r;
    }
    let (parts, body) = r.into_parts();
    let bytes = axum::body::to_bytes(body, 64 * 1024).await.unwrap_or_default();
    let doc: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let mut detail = doc["detail"].as_str().unwrap_or_default().to_string();
    if status == StatusCode::NOT_FOUND && detail.starts_with("no route") {
        detail = format!("There is no console page at {path}.");
    }
    let id = crate::auth::resolve(&headers, &Method::GET, &s).await.ok();
    let csrf = s.sessions.from_headers(&headers).map(|x| x.csrf).unwrap_or_default();
    let (title, next) = words(status);
    let page = ErrorPage {
        chrome: Chrome::of(id.as_ref(), csrf, &s, ""),
        status: status.as_u16(),
        title,
        detail,
        next,
    };
    match page.render() {
        Ok(html) => {
            let mut out = (status, Html(html)).into_response();
            // The request's id and the security headers are the outer layers'; keep what the
            // handler set besides the body's type and length (nothing is compressed yet).
            for (k, v) in parts.headers.iter() {
                if k != header::CONTENT_TYPE && k != header::CONTENT_LENGTH {
                    out.headers_mut().insert(k.clone(), v.clone());
                }
            }
            out
        }
        Err(e) => {
            tracing::error!(error = %e, "console error page failed");
            Response::from_parts(parts, Body::from(bytes))
        }
    }
}
