//! Fault injection into the simulated backend (platform-admin): an XID error on one GPU shows
//! in `DCGM_FI_DEV_XID_ERRORS` and marks the GPU unhealthy in `tessera_gpus`, for demos and
//! tests of GPU-health alerting. The route exists only when the simulated backend runs.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use tessera_api::Problem;
use tessera_backend::Simulated;
use tessera_model::Fleet;
use utoipa::ToSchema;

use tessera_api::rules::{self, Validate, Violation};

use super::ApiJson;
use crate::auth::PlatformAdmin;
use crate::problem::{ApiError, ApiResult};
use crate::state::AppState;

/// A fault to inject.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SimFault {
    /// Node name, e.g. `h100-03`.
    pub node: String,
    /// GPU index on the node.
    #[schema(schema_with = rules::schema::gpu_index)]
    pub gpu: u8,
    /// XID error code to report (e.g. 79: fallen off the bus, 48: double-bit ECC); 0 clears it.
    #[schema(schema_with = rules::schema::xid)]
    pub xid: u32,
}

impl Validate for SimFault {
    fn validate(&self) -> Result<(), Violation> {
        // Any node name is well formed (unknown ones answer 404).
        rules::GPU_INDEX.check("gpu", self.gpu.into())?;
        rules::XID.check("xid", self.xid.into())
    }
}

/// The injected fault and the GPU it hit.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct SimFaultView {
    pub node: String,
    pub gpu: u8,
    pub xid: u32,
    /// The GPU's UUID (label `UUID` of the DCGM series).
    pub uuid: String,
    pub pool: String,
    pub model: String,
}

/// Injects (or with `xid: 0` clears) an XID error on a GPU of the simulated backend
/// (platform-admin). It shows in `DCGM_FI_DEV_XID_ERRORS` on `/metrics` at once.
#[utoipa::path(post, path = "/api/v1/sim/faults", tag = "system", request_body = SimFault,
    responses((status = 200, description = "The fault is set (or cleared)", body = SimFaultView),
        (status = 401, description = "No or an invalid token", body = Problem),
        (status = 403, description = "Not a platform-admin token", body = Problem),
        (status = 404, description = "No such node or GPU", body = Problem),
        (status = 409, description = "The backend is not the simulated one", body = Problem),
        (status = 422, description = "Invalid body", body = Problem)))]
pub async fn inject_fault(
    State(s): State<AppState>,
    PlatformAdmin(id): PlatformAdmin,
    ApiJson(b): ApiJson<SimFault>,
) -> ApiResult<Json<SimFaultView>> {
    let v = inject(s.backend.simulated(), s.backend_name, &s.fleet(), &b)?;
    tracing::warn!(node = %b.node, gpu = b.gpu, xid = b.xid, actor = %id.actor, "simulated GPU fault injected");
    Ok(Json(v))
}

/// Checks and injects; 409 without a simulated backend, 404 for an unknown GPU.
pub fn inject(sim: Option<&dyn Simulated>, backend: &str, fleet: &Fleet, f: &SimFault) -> ApiResult<SimFaultView> {
    let Some(sim) = sim else {
        return Err(ApiError::conflict(format!(
            "faults can only be injected into the simulated backend; this server runs the {backend} backend"
        )));
    };
    let node = fleet
        .node_by_name(&f.node)
        .map(|n| fleet.node(n))
        .ok_or_else(|| ApiError::not_found(format!("no node `{}` in the fleet", f.node)))?;
    if f.gpu >= node.gpus {
        return Err(ApiError::not_found(format!(
            "node `{}` has {} GPUs (0..={}); there is no GPU {}",
            f.node,
            node.gpus,
            node.gpus.saturating_sub(1),
            f.gpu
        )));
    }
    let uuid = sim
        .inject_xid(&f.node, f.gpu, f.xid)
        .map_err(|e| ApiError::not_found(e.to_string()))?;
    Ok(SimFaultView {
        node: f.node.clone(),
        gpu: f.gpu,
        xid: f.xid,
        uuid,
        pool: fleet.pool(node.pool).name.clone(),
        model: fleet.catalogue.get(node.model).name.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;
    use tessera_backend_sim::{SimBackend, SimConfig, SimGpu};

    #[test]
    fn conflict_without_sim_and_not_found_for_unknown_gpus() {
        let fleet = Fleet::seed();
        let f = SimFault {
            node: "h100-00".into(),
            gpu: 3,
            xid: 79,
        };
        assert_eq!(
            inject(None, "local", &fleet, &f).unwrap_err().status,
            StatusCode::CONFLICT
        );
        let sim = SimBackend::new(SimConfig::default(), SimGpu::for_fleet(&fleet));
        let e = inject(
            Some(&sim as &dyn Simulated),
            "sim",
            &fleet,
            &SimFault {
                node: "nope".into(),
                ..f.clone()
            },
        )
        .unwrap_err();
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        let e = inject(
            Some(&sim as &dyn Simulated),
            "sim",
            &fleet,
            &SimFault { gpu: 8, ..f.clone() },
        )
        .unwrap_err();
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        assert!(e.detail.contains("has 8 GPUs"), "{}", e.detail);
        let v = inject(Some(&sim as &dyn Simulated), "sim", &fleet, &f).unwrap();
        assert_eq!((v.pool.as_str(), v.xid), ("training", 79));
        let xid = sim
            .sample()
            .into_iter()
            .find(|g| g.node == "h100-00" && g.gpu == 3)
            .unwrap()
            .xid;
        assert_eq!(xid, 79, "the next telemetry sample carries it");
    }
}
