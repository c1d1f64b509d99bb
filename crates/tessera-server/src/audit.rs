//! Request middleware: the caller resolved before the action, per-token rate limits
//! (`governor`), the audit log, and the pieces of the `tower-http` stack that are ours (which
//! request IDs to keep and how to make new ones).
//!
//! Every mutating request, every authentication failure, permission denial and rate-limit
//! refusal is appended to the audit log (actor, tenant, action, target, time, outcome, request
//! ID) before the response leaves: records are group-committed by one writer task, and a
//! request whose record cannot be written is answered 503 instead, so nothing acknowledged is
//! missing from the log. The log is append-only.

use std::num::NonZeroU32;
use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tessera_store::{AuditRecord, Store};
use tokio::sync::{mpsc, oneshot};

use crate::auth::Resolved;
use crate::clock::now_ms;
use crate::problem::ApiError;
use crate::state::AppState;

type Pending = (AuditRecord, oneshot::Sender<bool>);

/// The audit writer's handle.
#[derive(Clone)]
pub struct AuditLog {
    tx: mpsc::Sender<Pending>,
}

impl AuditLog {
    /// Starts the writer task; the store assigns sequence numbers.
    pub fn start(store: Arc<dyn Store>) -> AuditLog {
        let (tx, mut rx) = mpsc::channel::<Pending>(8192);
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut batch = vec![first];
                while let Ok(p) = rx.try_recv() {
                    batch.push(p);
                    if batch.len() >= 1024 {
                        break;
                    }
                }
                let records: Vec<AuditRecord> = batch.iter().map(|(r, _)| r.clone()).collect();
                let ok = store.append_audit(&records).await;
                if let Err(e) = &ok {
                    tracing::error!(error = %e, "cannot append to the audit log");
                }
                for (_, ack) in batch {
                    let _ = ack.send(ok.is_ok());
                }
            }
        });
        AuditLog { tx }
    }

    /// Appends a record and waits until it is durable.
    pub async fn record(&self, r: AuditRecord) -> bool {
        let (tx, rx) = oneshot::channel();
        if self.tx.send((r, tx)).await.is_err() {
            return false;
        }
        rx.await.unwrap_or(false)
    }
}

/// Per-token rate limits (GCRA, `governor`): `rate` requests per second sustained, bursts of
/// `burst`; a rate of 0 disables them.
pub struct RateLimiter {
    /// Sustained requests per second per token.
    pub rate: f64,
    limiter: Option<governor::DefaultKeyedRateLimiter<String>>,
}

impl RateLimiter {
    pub fn new(rate: f64, burst: f64) -> Self {
        let limiter = (rate > 0.0 && rate.is_finite()).then(|| {
            let burst =
                std::num::NonZeroU32::new(burst.max(1.0).min(u32::MAX as f64) as u32).unwrap_or(NonZeroU32::MIN);
            let period = std::time::Duration::from_secs_f64(1.0 / rate).max(std::time::Duration::from_nanos(1));
            let quota = governor::Quota::with_period(period)
                .expect("a positive period")
                .allow_burst(burst);
            governor::RateLimiter::keyed(quota)
        });
        RateLimiter { rate, limiter }
    }

    /// Takes one request from `key`'s allowance; `Err(seconds)` to wait when it is used up.
    pub fn take(&self, key: &str) -> Result<(), u64> {
        let Some(l) = &self.limiter else {
            return Ok(());
        };
        // Keys of idle tokens are dropped now and then, so the map stays bounded.
        if l.len() > 100_000 {
            l.retain_recent();
        }
        l.check_key(&key.to_string()).map_err(|not_until| {
            let wait = not_until.wait_time_from(governor::clock::Clock::now(&governor::clock::DefaultClock::default()));
            wait.as_secs_f64().ceil().max(1.0) as u64
        })
    }
}

/// An incoming `X-Request-Id` is kept only if it is short and plain (letters, digits, `-`,
/// `_`), since it is echoed and written to the audit log; others are replaced.
pub async fn drop_unsafe_request_id(mut req: Request) -> Request {
    let ok = req.headers().get(X_REQUEST_ID).is_none_or(|v| {
        let b = v.as_bytes();
        !b.is_empty() && b.len() <= 64 && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_')
    });
    if !ok {
        req.headers_mut().remove(X_REQUEST_ID);
    }
    req
}

/// Request IDs for requests that come without one: `req-` and 16 random hex digits.
#[derive(Clone, Copy, Default)]
pub struct MakeId;

impl tower_http::request_id::MakeRequestId for MakeId {
    fn make_request_id<B>(&mut self, _: &axum::http::Request<B>) -> Option<tower_http::request_id::RequestId> {
        let id = format!("req-{:016x}", rand::random::<u64>());
        HeaderValue::from_str(&id)
            .ok()
            .map(tower_http::request_id::RequestId::new)
    }
}

/// The header request IDs travel in.
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

fn tenant_in_path(path: &str) -> Option<String> {
    let mut parts = path.split('/');
    while let Some(p) = parts.next() {
        if p == "tenants" {
            return parts.next().filter(|t| !t.is_empty()).map(str::to_string);
        }
    }
    None
}

/// The request's ID, for handlers (in the request's extensions).
#[derive(Clone, Debug)]
pub struct RequestId(pub String);

/// Set on a response by a handler whose change names its object only in the request body (a
/// new tenant, a new token): the middleware writes it into the record's `detail`, so the audit
/// log says which object, not only the route.
#[derive(Clone, Debug)]
pub struct AuditObject(pub String);

/// Set on a response whose audit record the handler had committed with the change itself (in
/// the same transaction): the middleware does not write it again.
#[derive(Clone, Copy, Debug)]
pub struct Audited;

/// Around every route: resolves the caller (once, before the action), applies its rate
/// limit, and appends the audit record of mutating requests and refusals before the response
/// leaves.
pub async fn middleware(State(s): State<AppState>, mut req: Request, next: Next) -> Response {
    let rid = req
        .extensions()
        .get::<tower_http::request_id::RequestId>()
        .and_then(|r| r.header_value().to_str().ok())
        .unwrap_or_default()
        .to_string();
    req.extensions_mut().insert(RequestId(rid.clone()));
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_else(|| path.clone());
    let bucket = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| crate::auth::hash(&String::from_utf8_lossy(v.as_bytes())));
    let guarded = path.starts_with("/api/") || path == "/metrics" || crate::console::guarded(&path);
    let mut identity = None;
    let mut response = match bucket.as_deref().map(|b| s.limiter.take(b)) {
        Some(Err(wait)) => {
            let mut r = ApiError::too_many(format!(
                "rate limit of {} requests/s per token exceeded; retry in {wait} s",
                s.limiter.rate
            ))
            .into_response();
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(wait));
            r
        }
        _ => {
            if guarded {
                let id = crate::auth::resolve(req.headers(), &method, &s).await;
                identity = id.as_ref().ok().cloned();
                req.extensions_mut().insert(Resolved(id));
            }
            next.run(req).await
        }
    };
    let status = response.status();
    let mutating = !matches!(method, Method::GET | Method::HEAD | Method::OPTIONS);
    let denied = matches!(
        status,
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN | StatusCode::TOO_MANY_REQUESTS
    );
    let audited = response.extensions().get::<Audited>().is_some();
    if guarded && (mutating || denied) && !audited {
        let action = match status {
            StatusCode::UNAUTHORIZED => "auth.failure".to_string(),
            StatusCode::FORBIDDEN => format!("denied {method} {route}"),
            StatusCode::TOO_MANY_REQUESTS => format!("rate-limited {method} {route}"),
            _ => format!("{method} {route}"),
        };
        let record = AuditRecord {
            seq: 0,
            at: now_ms(),
            request_id: rid.clone(),
            actor: identity
                .as_ref()
                .map(|i| i.actor.clone())
                .unwrap_or_else(|| "anonymous".into()),
            tenant: tenant_in_path(&path).or_else(|| identity.as_ref().and_then(|i| i.tenant.clone())),
            action,
            target: path.clone(),
            outcome: status.as_u16(),
            detail: response
                .extensions()
                .get::<AuditObject>()
                .map(|o| o.0.clone())
                .unwrap_or_default(),
        };
        if !s.audit.record(record).await && mutating && status.is_success() {
            // The change happened but could not be put on record: say so rather than hide it.
            tracing::error!(request_id = %rid, "audit record lost for a successful change");
            response = ApiError::unavailable(
                "the change was made but could not be recorded in the audit log; contact the operators",
            )
            .into_response();
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowances_refill() {
        let r = RateLimiter::new(10.0, 2.0);
        assert!(r.take("a").is_ok());
        assert!(r.take("a").is_ok());
        assert_eq!(
            r.take("a"),
            Err(1),
            "a burst of 2, then wait (at least 1 s in Retry-After)"
        );
        assert!(r.take("b").is_ok(), "allowances are per token");
        std::thread::sleep(std::time::Duration::from_millis(150));
        assert!(r.take("a").is_ok());
        assert!(RateLimiter::new(0.0, 1.0).take("x").is_ok(), "0 disables");
        let slow = RateLimiter::new(0.1, 1.0);
        assert!(slow.take("k").is_ok());
        assert_eq!(slow.take("k"), Err(10), "one request per 10 s");
    }

    #[test]
    fn tenants_from_paths() {
        assert_eq!(tenant_in_path("/api/v1/tenants/vision/projects"), Some("vision".into()));
        assert_eq!(tenant_in_path("/api/v1/workloads"), None);
    }
}
