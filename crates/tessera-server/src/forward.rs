//! Followers forward writes to the leader, so that a client behind a load balancer (and the
//! CLI, and the console) reaches any replica and just works.
//!
//! A mutating API request (`POST`, `PUT`, `PATCH`, `DELETE` under `/api/`) that reaches a
//! replica which does not lead is sent on, unchanged — method, path and query, headers
//! (`Authorization` and `Idempotency-Key` among them; hop-by-hop headers excepted) and body — to
//! the leader's advertised URL, and the leader's response comes back as it is (status, headers,
//! body). The leader authenticates, rate-limits and audits it as any request. Reads are served
//! by the replica itself, from the database.
//!
//! When no leader is known (an election is under way, the database is unreachable) or the
//! leader cannot be reached, the answer is a 503 problem with `Retry-After`; a request that
//! was forwarded once is never forwarded again (its `X-Tessera-Forwarded-By` header says so),
//! so two replicas that each believe the other leads cannot bounce it between them.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::problem::ApiError;
use crate::state::AppState;

/// Names the replica that forwarded a request.
pub const FORWARDED_BY: &str = "x-tessera-forwarded-by";

/// Names the replica that answered a forwarded request's leader.
pub const LEADER: &str = "x-tessera-leader";

/// How long a forwarded request may take.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(30);

/// The HTTP client followers forward with.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .timeout(FORWARD_TIMEOUT)
        .pool_idle_timeout(Duration::from_secs(30))
        .build()
        .expect("an HTTP client without TLS settings builds")
}

/// Headers that concern one connection, not the request (RFC 9110 §7.6.1), and those the
/// client recomputes.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
    )
}

fn mutating(req: &Request) -> bool {
    !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) && req.uri().path().starts_with("/api/")
}

/// A 503 problem that tells the client to come back.
fn retry_later(detail: String) -> Response {
    ApiError::unavailable(detail).into_response()
}

/// The middleware: forwards a follower's writes, passes everything else on.
pub async fn middleware(State(s): State<AppState>, req: Request, next: Next) -> Response {
    if !s.replica.shared || !mutating(&req) || s.replica.is_leader() {
        return next.run(req).await;
    }
    if req.headers().contains_key(FORWARDED_BY) {
        return retry_later(format!(
            "replica {} was forwarded this request but does not lead (leadership is changing); retry shortly",
            s.replica.id
        ));
    }
    let Some(leader) = s.replica.leader_url() else {
        return retry_later(
            "no replica leads at the moment (an election is under way or the database is unavailable); retry shortly"
                .into(),
        );
    };
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, crate::problem::BODY_LIMIT).await {
        Ok(b) => b,
        Err(_) => {
            return ApiError::too_large(format!(
                "the body is larger than the {} KiB limit",
                crate::problem::BODY_LIMIT / 1024
            ))
            .into_response();
        }
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut rb = s.forward.request(parts.method.clone(), format!("{leader}{path}"));
    for (name, value) in &parts.headers {
        if !hop_by_hop(name) {
            rb = rb.header(name, value);
        }
    }
    let rb = rb.header(FORWARDED_BY, &s.replica.id).body(body);
    let resp = match rb.send().await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(%leader, error = %e, "cannot forward a write to the leader");
            return retry_later(format!("the leader at {leader} could not be reached; retry shortly"));
        }
    };
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = match resp.bytes().await {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(%leader, error = %e, "the leader's answer broke off");
            return retry_later(format!(
                "the leader at {leader} did not finish its answer; the request may or may not have taken effect: retry it (with its Idempotency-Key)"
            ));
        }
    };
    let mut out = Response::new(Body::from(bytes));
    *out.status_mut() = status;
    for (name, value) in &headers {
        if !hop_by_hop(name) {
            out.headers_mut().append(name, value.clone());
        }
    }
    if let Ok(v) = HeaderValue::from_str(&leader) {
        out.headers_mut().insert(LEADER, v);
    }
    out.headers_mut().remove(header::CONTENT_LENGTH);
    out
}
