//! Liveness and what this server runs.

use axum::Json;
use axum::extract::State;

use crate::AppState;

/// Liveness and readiness.
#[utoipa::path(get, path = "/api/v1/health", tag = "system", security(()), responses((status = 200, description = "Serving", body = serde_json::Value)))]
pub async fn health(State(s): State<AppState>) -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok", "backend": s.backend_name, "version": env!("CARGO_PKG_VERSION")}))
}
