//! Node operations: cordon, drain, maintenance, uncordon, and a rolling upgrade's `done`
//! (platform-admin), handed to the lifecycle loop; the answer is the node's state after.

use tessera_api::NodeView;

use super::lifecycle_error;
use crate::auth::Identity;
use crate::http::views;
use crate::lifecycle::NodeOp;
use crate::problem::{ApiError, ApiResult};
use crate::state::AppState;

/// Applies `op` to the fleet's node `node` (platform-admin): the node's view after it.
pub async fn act(s: &AppState, id: &Identity, node: &str, op: NodeOp) -> ApiResult<NodeView> {
    id.require_admin()?;
    s.fleet()
        .node_by_name(node)
        .ok_or_else(|| ApiError::not_found(format!("no node `{node}` in the fleet")))?;
    s.lifecycle
        .node_op(node.to_string(), op, id.actor.clone())
        .await
        .map_err(lifecycle_error)?;
    let snap = s.lifecycle.snapshot();
    let ops = s.lifecycle.published().ops();
    // By name in the snapshot's fleet (the fleet may have changed meanwhile).
    let i = snap
        .fleet
        .node_by_name(node)
        .ok_or_else(|| ApiError::not_found(format!("no node `{node}` in the fleet")))?
        .0 as usize;
    Ok(views::node(&snap.fleet, i, &snap.nodes[i], ops.node_state(node)))
}
