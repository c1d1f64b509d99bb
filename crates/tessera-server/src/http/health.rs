//! GPU health (platform-admin): the GPUs out of placement because they failed, and clearing
//! one after it was repaired (audited with the change).

use axum::Json;
use axum::extract::{Extension, Path, State};
use axum::response::{IntoResponse, Response};
use tessera_api::{GpuHealthView, Problem, rfc3339_ms};

use super::workloads::lifecycle_error;
use crate::audit::{Audited, RequestId};
use crate::auth::Identity;
use crate::clock::now_ms;
use crate::lifecycle::FleetOps;
use crate::lifecycle::Snapshot;
use crate::problem::{ApiError, ApiResult};
use crate::state::AppState;

/// The views of the unhealthy GPUs, by node then GPU.
pub fn views(ops: &FleetOps, snap: &Snapshot) -> Vec<GpuHealthView> {
    let f = &snap.fleet;
    ops.unhealthy
        .values()
        .filter_map(|r| {
            let n = f.node_by_name(&r.node)?;
            let def = f.node(n);
            let workloads = snap.nodes[n.0 as usize]
                .gpus
                .get(r.gpu as usize)
                .map(|g| g.holders.iter().map(|h| h.workload).collect())
                .unwrap_or_default();
            Some(GpuHealthView {
                node: r.node.clone(),
                gpu: r.gpu,
                pool: f.pool(def.pool).name.clone(),
                model: f.catalogue.get(def.model).name.clone(),
                since: rfc3339_ms(r.since),
                xid: r.xid,
                detail: r.detail.clone(),
                workloads,
            })
        })
        .collect()
}

/// Unhealthy GPUs (platform-admin).
#[utoipa::path(get, path = "/api/v1/gpus/health", tag = "fleet",
    responses((status = 200, body = Vec<GpuHealthView>), (status = 401, body = Problem), (status = 403, body = Problem)))]
pub async fn gpu_health(State(s): State<AppState>, id: Identity) -> ApiResult<Json<Vec<GpuHealthView>>> {
    id.require_admin()?;
    let ops = s.lifecycle.published().ops();
    Ok(Json(views(&ops, &s.lifecycle.snapshot())))
}

/// Puts an unhealthy GPU back into placement (platform-admin, audited).
#[utoipa::path(post, path = "/api/v1/gpus/{node}/{gpu}/clear", tag = "fleet",
    params(("node" = String, Path, description = "The node's name"),
        ("gpu" = u8, Path, description = "The GPU's index on the node", minimum = 0, maximum = 15)),
    responses((status = 204, description = "Back in placement"), (status = 401, body = Problem),
        (status = 403, body = Problem), (status = 404, description = "No such GPU", body = Problem),
        (status = 409, description = "The GPU is not unhealthy", body = Problem),
        (status = 422, description = "Not a GPU index", body = Problem)))]
pub async fn clear_gpu(
    State(s): State<AppState>,
    id: Identity,
    rid: Option<Extension<RequestId>>,
    Path((node, gpu)): Path<(String, String)>,
) -> ApiResult<Response> {
    id.require_admin()?;
    let gpu = super::nodeops::fleet_gpu(&s, &node, &gpu)?;
    if !s
        .lifecycle
        .published()
        .ops()
        .unhealthy
        .contains_key(&(node.clone(), gpu))
    {
        return Err(ApiError::conflict(format!(
            "GPU {gpu} of {node} is not marked unhealthy"
        )));
    }
    let path = format!("/api/v1/gpus/{node}/{gpu}/clear");
    let audit = tessera_store::AuditRecord {
        seq: 0,
        at: now_ms(),
        request_id: rid.map(|Extension(r)| r.0).unwrap_or_default(),
        actor: id.actor.clone(),
        tenant: None,
        action: "POST /api/v1/gpus/{node}/{gpu}/clear".into(),
        target: path,
        outcome: 204,
        detail: String::new(),
    };
    s.lifecycle.clear_gpu(node, gpu, audit).await.map_err(lifecycle_error)?;
    let mut r = axum::http::StatusCode::NO_CONTENT.into_response();
    r.extensions_mut().insert(Audited);
    Ok(r)
}
