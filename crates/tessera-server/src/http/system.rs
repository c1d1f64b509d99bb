//! Liveness, readiness, what this server runs, and the replicas of the control plane.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tessera_api::{LeaderView, ReplicaView, ReplicasView};

use crate::auth::Identity;
use crate::problem::ApiResult;
use crate::replica::Role;
use crate::state::AppState;

/// A replica is `gone` after this long without a heartbeat.
const GONE_AFTER_MS: i64 = 10_000;

/// Liveness and readiness.
#[utoipa::path(get, path = "/api/v1/health", tag = "system", security(()), responses((status = 200, description = "Serving", body = serde_json::Value)))]
pub async fn health(State(s): State<AppState>) -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok", "backend": s.backend_name, "version": env!("CARGO_PKG_VERSION")}))
}

/// `GET /healthz`: the process is alive (for liveness probes: nothing else is checked).
pub async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "alive"}))
}

/// `GET /readyz`: 200 when this replica can serve — it leads with its loop running, or it
/// follows a known leader with the database reachable — else 503; the body says its role, the
/// leader and, when not ready, why (for load balancers and readiness probes).
pub async fn readyz(State(s): State<AppState>) -> Response {
    let st = s.replica.state();
    let body = serde_json::json!({
        "ready": st.ready,
        "role": st.role,
        "replica": s.replica.id,
        "leader": st.leader_url,
        "leader_id": st.leader_id,
        "epoch": st.epoch,
        "database": if s.replica.shared { "postgres" } else { "sqlite" },
        "reason": st.reason,
    });
    let status = if st.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut r = (status, Json(body)).into_response();
    if !st.ready {
        r.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from_static("1"),
        );
    }
    r
}

/// The replicas of the control plane (their heartbeats) and which one leads.
#[utoipa::path(get, path = "/api/v1/replicas", tag = "system",
    responses((status = 200, body = ReplicasView), (status = 401, body = tessera_api::Problem), (status = 503, body = tessera_api::Problem)))]
pub async fn replicas(State(s): State<AppState>, _id: Identity) -> ApiResult<Json<ReplicasView>> {
    let lease = s.store.lease().await?.filter(|l| l.valid());
    let replicas = s.store.replicas().await?;
    Ok(Json(ReplicasView {
        database: if s.replica.shared { "postgres" } else { "sqlite" }.into(),
        this: s.replica.id.clone(),
        leader: lease.as_ref().map(|l| LeaderView {
            id: l.holder.clone(),
            url: l.url.clone(),
            epoch: l.epoch,
            expires_in_ms: l.remaining_ms,
        }),
        replicas: replicas
            .into_iter()
            .map(|r| ReplicaView {
                role: if r.age_ms > GONE_AFTER_MS {
                    "gone"
                } else if lease.as_ref().is_some_and(|l| l.holder == r.id)
                    || (!s.replica.shared && r.id == s.replica.id)
                {
                    Role::Leader.as_str()
                } else {
                    Role::Follower.as_str()
                }
                .into(),
                started_at: tessera_api::rfc3339_ms(r.started_at),
                last_seen_ms_ago: r.age_ms,
                id: r.id,
                url: r.url,
                version: r.version,
            })
            .collect(),
    }))
}
