//! Request middleware: request IDs, per-token rate limits, security headers, and the audit log.
//!
//! Every mutating request, every authentication failure, permission denial and rate-limit
//! refusal is appended to the audit log (actor, tenant, action, target, time, outcome, request
//! ID) before the response leaves: records are group-committed by one writer task, and a
//! request whose record cannot be written is answered 503 instead, so nothing acknowledged is
//! missing from the log. The log is append-only.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tessera_store::{AuditRecord, Store};
use tokio::sync::{mpsc, oneshot};

use crate::problem::ApiError;
use crate::{AppState, now_ms};

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

/// Per-token token buckets.
pub struct RateLimiter {
    /// Sustained requests per second per token; 0 disables limiting.
    pub rate: f64,
    pub burst: f64,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl RateLimiter {
    pub fn new(rate: f64, burst: f64) -> Self {
        RateLimiter {
            rate,
            burst: burst.max(1.0),
            buckets: Mutex::default(),
        }
    }

    /// Takes one request from `key`'s bucket; `Err(seconds)` to wait when it is empty.
    pub fn take(&self, key: &str) -> Result<(), u64> {
        if self.rate <= 0.0 {
            return Ok(());
        }
        let now = Instant::now();
        let mut b = self.buckets.lock().expect("lock");
        if b.len() > 100_000 {
            b.retain(|_, (_, at)| now.duration_since(*at).as_secs() < 60);
        }
        let (tokens, at) = b.entry(key.to_string()).or_insert((self.burst, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * self.rate).min(self.burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - *tokens) / self.rate).ceil().max(1.0) as u64)
        }
    }
}

fn request_id(req: &Request) -> String {
    req.headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            !v.is_empty() && v.len() <= 64 && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
        .map(str::to_string)
        .unwrap_or_else(|| format!("req-{}", &crate::auth::new_secret()[4..20]))
}

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

/// Set on a response whose audit record the handler had committed with the change itself (in
/// the same transaction): the middleware does not write it again.
#[derive(Clone, Copy, Debug)]
pub struct Audited;

/// The middleware around every route.
pub async fn middleware(State(s): State<AppState>, mut req: Request, next: Next) -> Response {
    let rid = request_id(&req);
    req.extensions_mut().insert(RequestId(rid.clone()));
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_else(|| path.clone());
    let auth = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut cookie_headers = axum::http::HeaderMap::new();
    for v in req.headers().get_all(header::COOKIE) {
        cookie_headers.append(header::COOKIE, v.clone());
    }
    let bucket = auth.as_deref().map(crate::auth::hash);
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
        _ => next.run(req).await,
    };
    let status = response.status();
    let mutating = !matches!(method, Method::GET | Method::HEAD | Method::OPTIONS);
    let denied = matches!(
        status,
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN | StatusCode::TOO_MANY_REQUESTS
    );
    let audited = response.extensions().get::<Audited>().is_some();
    if path.starts_with("/api/") && (mutating || denied) && !audited {
        let identity = match auth.as_deref() {
            Some(h) => s.auth.identify(Some(h)).await.ok(),
            None => s.sessions.from_headers(&cookie_headers).map(|x| x.identity),
        };
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
            detail: String::new(),
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
    let h = response.headers_mut();
    h.insert(
        HeaderName::from_static("x-request-id"),
        HeaderValue::from_str(&rid).unwrap_or(HeaderValue::from_static("invalid")),
    );
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if !h.contains_key(header::CONTENT_SECURITY_POLICY) {
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static("default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'"),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_refill() {
        let r = RateLimiter::new(10.0, 2.0);
        assert!(r.take("a").is_ok());
        assert!(r.take("a").is_ok());
        assert_eq!(r.take("a"), Err(1));
        assert!(r.take("b").is_ok(), "buckets are per token");
        std::thread::sleep(std::time::Duration::from_millis(150));
        assert!(r.take("a").is_ok());
        assert!(RateLimiter::new(0.0, 1.0).take("x").is_ok(), "0 disables");
    }

    #[test]
    fn tenants_from_paths() {
        assert_eq!(tenant_in_path("/api/v1/tenants/vision/projects"), Some("vision".into()));
        assert_eq!(tenant_in_path("/api/v1/workloads"), None);
    }
}
