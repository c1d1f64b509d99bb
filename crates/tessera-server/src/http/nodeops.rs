//! Node lifecycle (platform-admin, audited by the middleware): cordon, drain, maintenance and
//! uncordon one node; the node's state shows in `GET /api/v1/nodes` and `/metrics`. And a GPU's
//! MIG mode, switched by an admin on a drained GPU (audited with the change).

use axum::Json;
use axum::extract::{Extension, Path, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tessera_api::{DrainRequest, GpuMigView, NodeView, Problem, SetMigMode};
use tessera_model::NodeId;
use utoipa::{IntoParams, ToSchema};

use super::workloads::lifecycle_error;
use super::{ApiJson, ApiQuery, OptionalApiJson};
use crate::audit::{Audited, RequestId};
use crate::auth::{Identity, PlatformAdmin};
use crate::clock::now_ms;
use crate::lifecycle::NodeOp;
use crate::problem::{ApiError, ApiResult};
use crate::state::AppState;
use tessera_api::rules::{self, Validate, Violation};

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DrainParams {
    /// Drain only: seconds until the drain's policy applies (default: no deadline; at most 30
    /// days).
    #[param(minimum = 0, maximum = 2_592_000)]
    pub deadline_s: Option<u64>,
    /// Drain only: after the deadline, `preempt` what is left (with the grace period; batch
    /// work is requeued) or `wait` (default).
    #[param(schema_with = rules::schema::drain_after)]
    pub after: Option<String>,
}

/// A node action other than `drain` (its own operation, with its parameters); the document's
/// side of `{action}` (the server reads a string and answers 404 for another).
#[derive(ToSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)] // only its schema is used
pub enum NodeAction {
    Cordon,
    Uncordon,
    Maintenance,
    Done,
}

/// The longest drain deadline, seconds (30 days).
const MAX_DEADLINE_S: u64 = 2_592_000;

impl Validate for DrainParams {
    fn validate(&self) -> Result<(), Violation> {
        match self.deadline_s {
            Some(d) if d > MAX_DEADLINE_S => Err(Violation::new(
                "deadline_s",
                format!("{d}: a drain deadline is at most {MAX_DEADLINE_S} s (30 days)"),
            )),
            _ => Ok(()),
        }
    }
}

/// The operation an action names, or a problem naming the field.
pub fn parse_op(action: &str, p: &DrainParams, now: i64) -> ApiResult<NodeOp> {
    if action != "drain" && (p.deadline_s.is_some() || p.after.is_some()) {
        return Err(ApiError::invalid(
            "deadline_s",
            format!("`deadline_s` and `after` apply to `drain` only, not `{action}`"),
        ));
    }
    Ok(match action {
        "cordon" => NodeOp::Cordon,
        "uncordon" => NodeOp::Uncordon,
        "maintenance" => NodeOp::Maintenance,
        "done" => NodeOp::UpgradeDone,
        "drain" => {
            let preempt = match p.after.as_deref() {
                None | Some("wait") => false,
                Some("preempt") => true,
                Some(x) => {
                    return Err(ApiError::invalid(
                        "after",
                        format!("`{x}`: after the deadline, either `preempt` or `wait`"),
                    ));
                }
            };
            if preempt && p.deadline_s.is_none() {
                return Err(ApiError::invalid("after", "`after=preempt` needs a `deadline_s`"));
            }
            NodeOp::Drain {
                deadline_ms: p.deadline_s.map(|s| now + (s.min(MAX_DEADLINE_S) as i64) * 1000),
                preempt,
            }
        }
        other => {
            return Err(ApiError::not_found(format!(
                "no node action `{other}` (cordon, drain, maintenance, uncordon, done)"
            )));
        }
    })
}

/// The drain's parameters from the query and the JSON body together: each may give
/// `deadline_s` and `after`; one given in both must be the same (422 otherwise).
pub fn merge_drain(q: DrainParams, body: Option<DrainRequest>) -> ApiResult<DrainParams> {
    let Some(b) = body else { return Ok(q) };
    fn one<T: PartialEq + std::fmt::Debug>(field: &str, q: Option<T>, b: Option<T>) -> ApiResult<Option<T>> {
        match (q, b) {
            (Some(q), Some(b)) if q != b => Err(ApiError::invalid(
                field,
                format!("`{field}` is given twice, {q:?} in the query and {b:?} in the body: give it once"),
            )),
            (q, b) => Ok(q.or(b)),
        }
    }
    let p = DrainParams {
        deadline_s: one("deadline_s", q.deadline_s, b.deadline_s)?,
        after: one("after", q.after, b.after)?,
    };
    p.validate()?;
    Ok(p)
}

/// Cordons, puts into maintenance or uncordons a node (platform-admin); `done` is the rolling
/// upgrade's hook: the upgrade of this node is finished (it must be upgrading in a rollout),
/// and its validation starts. A drain is `POST /api/v1/nodes/{node}/drain`; these actions take
/// no parameters (`deadline_s` or `after` given here is refused with 422).
#[utoipa::path(post, path = "/api/v1/nodes/{node}/{action}", tag = "fleet",
    params(("node" = String, Path), ("action" = inline(NodeAction), Path, description = "cordon, maintenance, uncordon or done (a drain has its own operation)")),
    responses((status = 200, description = "The node's new state", body = NodeView), (status = 401, body = Problem),
        (status = 403, body = Problem), (status = 404, description = "No such node or action", body = Problem),
        (status = 409, description = "Maintenance on a node that still holds work, or `done` for a node no rollout is upgrading", body = Problem),
        (status = 422, body = Problem)))]
pub async fn node_action(
    State(s): State<AppState>,
    PlatformAdmin(id): PlatformAdmin,
    Path((node, action)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<DrainParams>,
    OptionalApiJson(body): OptionalApiJson<DrainRequest>,
) -> ApiResult<Json<NodeView>> {
    run_node_action(&s, &id, node, &action, q, body).await
}

/// Drains a node (platform-admin): no new placement, and its work is moved off. `deadline_s`
/// and `after` may be given as query parameters or in a JSON body (`{"deadline_s": 3600,
/// "after": "preempt"}`).
///
/// Refused with 422 besides the schema: `after=preempt` without a `deadline_s` (in the query
/// or the body), and a parameter given in both the query and the body with different values.
#[utoipa::path(post, path = "/api/v1/nodes/{node}/drain", tag = "fleet",
    params(("node" = String, Path), DrainParams),
    request_body(content = Option<DrainRequest>, description = "Optional: the same as the query parameters `deadline_s` and `after`"),
    responses((status = 200, description = "The node's new state", body = NodeView), (status = 401, body = Problem),
        (status = 403, body = Problem), (status = 404, description = "No such node", body = Problem),
        (status = 422, body = Problem)))]
pub async fn drain_node(
    State(s): State<AppState>,
    PlatformAdmin(id): PlatformAdmin,
    Path(node): Path<String>,
    ApiQuery(q): ApiQuery<DrainParams>,
    OptionalApiJson(body): OptionalApiJson<DrainRequest>,
) -> ApiResult<Json<NodeView>> {
    run_node_action(&s, &id, node, "drain", q, body).await
}

/// A node action with its drain parameters (refused on an action other than `drain`).
async fn run_node_action(
    s: &AppState,
    id: &Identity,
    node: String,
    action: &str,
    q: DrainParams,
    body: Option<DrainRequest>,
) -> ApiResult<Json<NodeView>> {
    fleet_node(s, &node)?;
    let p = merge_drain(q, body)?;
    let op = parse_op(action, &p, now_ms())?;
    crate::services::nodes::act(s, id, &node, op).await.map(Json)
}

/// Switches a GPU's MIG mode (platform-admin; audited with the change). Tessera never does this
/// on its own. The GPU's node must be out of placement (cordoned, draining or in maintenance)
/// and the GPU must hold no work; the backend must be able to switch MIG mode (not Kubernetes,
/// where the GPU Operator's MIG manager owns it); the GPU must be of a model with MIG in a mig
/// pool. Out of MIG mode the GPU serves whole GPUs; in MIG mode, instances. A change the driver
/// applies only after a GPU reset is `pending` (no placement on the GPU until then; Tessera
/// never resets a GPU): after the reset, send the same change again.
#[utoipa::path(post, path = "/api/v1/nodes/{node}/gpus/{gpu}/mig", tag = "fleet", request_body = SetMigMode,
    params(("node" = String, Path, description = "The node's name"),
        ("gpu" = u8, Path, description = "The GPU's index on the node", minimum = 0, maximum = 15)),
    responses((status = 200, description = "The GPU's MIG mode now (`changed: false`: it had it already)", body = GpuMigView),
        (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 404, description = "No such node or GPU", body = Problem),
        (status = 409, description = "`node-in-placement`: the node is not cordoned, draining or in maintenance; `gpu-busy`: work is on the GPU; `backend-refused`: the backend or driver refused", body = Problem),
        (status = 422, description = "Not a GPU index or body; `mig-mode-unsupported`: the backend cannot switch MIG mode; `not-mig-capable`: the model has no MIG or the pool is not a mig pool", body = Problem),
        (status = 503, description = "The backend or the store could not be reached", body = Problem)))]
pub async fn set_mig_mode(
    State(s): State<AppState>,
    PlatformAdmin(id): PlatformAdmin,
    rid: Option<Extension<RequestId>>,
    Path((node, gpu)): Path<(String, String)>,
    ApiJson(b): ApiJson<SetMigMode>,
) -> ApiResult<Response> {
    let gpu = fleet_gpu(&s, &node, &gpu)?;
    let audit = tessera_store::AuditRecord {
        seq: 0,
        at: now_ms(),
        request_id: rid.map(|Extension(r)| r.0).unwrap_or_default(),
        actor: id.actor.clone(),
        tenant: None,
        action: "POST /api/v1/nodes/{node}/gpus/{gpu}/mig".into(),
        target: format!("/api/v1/nodes/{node}/gpus/{gpu}/mig"),
        outcome: 200,
        detail: String::new(),
    };
    let o = s
        .lifecycle
        .set_mig_mode(node, gpu, b.enabled, audit)
        .await
        .map_err(lifecycle_error)?;
    let r = &o.record;
    let view = GpuMigView {
        node: r.node.clone(),
        gpu: r.gpu,
        enabled: r.enabled,
        pending: r.pending,
        serves: match (r.pending, r.enabled) {
            (true, _) => "nothing",
            (false, true) => "instances",
            (false, false) => "whole",
        }
        .into(),
        changed: o.changed,
        detail: r.detail.clone(),
    };
    let mut resp = Json(view).into_response();
    // A change committed its audit record with it; a no-op is audited by the middleware.
    if o.changed {
        resp.extensions_mut().insert(Audited);
    }
    Ok(resp)
}

/// The fleet's node named `node` (404 when there is none).
pub(super) fn fleet_node(s: &AppState, node: &str) -> ApiResult<NodeId> {
    s.fleet()
        .node_by_name(node)
        .ok_or_else(|| ApiError::not_found(format!("no node `{node}` in the fleet")))
}

/// The index of GPU `gpu` (a path segment) of the fleet's node `node`: 422 when it is not a
/// number, 404 when there is no such node or the node has no such GPU.
pub(super) fn fleet_gpu(s: &AppState, node: &str, gpu: &str) -> ApiResult<u8> {
    let index: u8 = gpu
        .parse()
        .map_err(|_| ApiError::invalid("gpu", format!("`{gpu}` is not a GPU index (0–15)")))?;
    let fleet = s.fleet();
    let n = fleet
        .node_by_name(node)
        .ok_or_else(|| ApiError::not_found(format!("no node `{node}` in the fleet")))?;
    let gpus = fleet.node(n).gpus;
    if index >= gpus {
        return Err(ApiError::not_found(format!(
            "node `{node}` has {gpus} GPUs (0..={}); there is no GPU {index}",
            gpus.saturating_sub(1)
        )));
    }
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(deadline_s: Option<u64>, after: Option<&str>) -> DrainParams {
        DrainParams {
            deadline_s,
            after: after.map(str::to_string),
        }
    }

    #[test]
    fn actions_parse_or_name_the_field() {
        assert_eq!(parse_op("cordon", &p(None, None), 0).unwrap(), NodeOp::Cordon);
        assert_eq!(
            parse_op("drain", &p(Some(60), Some("preempt")), 1000).unwrap(),
            NodeOp::Drain {
                deadline_ms: Some(61_000),
                preempt: true
            }
        );
        assert_eq!(
            parse_op("drain", &p(None, None), 0).unwrap(),
            NodeOp::Drain {
                deadline_ms: None,
                preempt: false
            }
        );
        for (action, params, field) in [
            ("drain", p(None, Some("preempt")), "after"),
            ("drain", p(Some(5), Some("kill")), "after"),
            ("cordon", p(Some(5), None), "deadline_s"),
        ] {
            let e = parse_op(action, &params, 0).unwrap_err();
            assert_eq!(e.field.as_deref(), Some(field), "{action}");
        }
        assert_eq!(parse_op("reboot", &p(None, None), 0).unwrap_err().status.as_u16(), 404);
    }
}
