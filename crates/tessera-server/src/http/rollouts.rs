//! Rolling upgrades (platform-admin, audited by the middleware): start one for a pool, list
//! them, read one with the state of each node, cancel one. The controller runs in the
//! lifecycle loop ([`crate::lifecycle`]); reads come from what it publishes.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use tessera_api::rules::{self, Validate, Violation};
use tessera_api::{CreateRollout, Page, Problem, RolloutAfter, RolloutNodeView, RolloutView, rfc3339_ms};
use tessera_store::{RolloutNodeState, RolloutRecord};
use utoipa::IntoParams;

use super::workloads::lifecycle_error;
use super::{ApiJson, ApiPath, ApiQuery, DEFAULT_LIMIT, check_limit, page};
use crate::auth::{Identity, PlatformAdmin};
use crate::lifecycle::NewRollout;
use crate::problem::{ApiError, ApiResult};
use crate::state::AppState;

/// The API's view of a stored rollout.
pub fn view(r: &RolloutRecord) -> RolloutView {
    let done = r.nodes.iter().filter(|n| n.state == RolloutNodeState::Done).count();
    RolloutView {
        id: r.id,
        pool: r.pool.clone(),
        state: r.state.as_str().into(),
        max_parallel: r.max_parallel,
        max_unavailable_units: r.max_unavailable_milli as f64 / 1000.0,
        deadline_s: r.deadline_s,
        after: if r.preempt { "preempt" } else { "wait" }.into(),
        upgrade_s: r.upgrade_s,
        created_at: rfc3339_ms(r.created_at),
        created_by: r.created_by.clone(),
        ended_at: r.ended_at.map(rfc3339_ms),
        detail: r.detail.clone(),
        progress: if r.nodes.is_empty() {
            1.0
        } else {
            done as f64 / r.nodes.len() as f64
        },
        nodes: r
            .nodes
            .iter()
            .map(|n| RolloutNodeView {
                node: n.node.clone(),
                state: n.state.as_str().into(),
                since: rfc3339_ms(n.since),
                started_at: n.started_at.map(rfc3339_ms),
                ended_at: n.ended_at.map(rfc3339_ms),
                detail: n.detail.clone(),
            })
            .collect(),
    }
}

/// The document's side of a rollout id in the path.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // only its schema is used
pub struct RolloutIdParams {
    /// The rollout's id.
    #[param(schema_with = tessera_api::rules::schema::rollout_id)]
    id: u64,
}

fn rollout_id(raw: &str) -> ApiResult<u64> {
    raw.parse::<u64>()
        .map_err(|_| ApiError::not_found(format!("no rollout `{raw}` (rollout ids are whole numbers)")))
}

/// For a platform admin, the id of the rollout the path names and what `read` reads of it as
/// published; `404` if there is none.
fn published_rollout<T>(
    s: &AppState,
    id: &Identity,
    raw: &str,
    read: impl FnOnce(&RolloutRecord) -> T,
) -> ApiResult<(u64, T)> {
    id.require_admin()?;
    let rid = rollout_id(raw)?;
    let ops = s.lifecycle.published().ops();
    ops.rollouts
        .get(&rid)
        .map(|r| (rid, read(r)))
        .ok_or_else(|| ApiError::not_found(format!("no rollout {rid}")))
}

/// Starts a rolling upgrade of every node of a pool: the answer is the plan (nodes in the
/// order the planner takes them: whose unmovable work ends soonest first).
#[utoipa::path(post, path = "/api/v1/rollouts", tag = "fleet", request_body = CreateRollout,
    responses((status = 201, description = "The rollout and its plan", body = RolloutView),
        (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 404, description = "No such pool", body = Problem),
        (status = 409, description = "A rollout of this pool is running", body = Problem),
        (status = 422, description = "A value out of range, or `after: preempt` without a deadline", body = Problem)))]
pub async fn create_rollout(
    State(s): State<AppState>,
    PlatformAdmin(id): PlatformAdmin,
    ApiJson(b): ApiJson<CreateRollout>,
) -> ApiResult<(StatusCode, Json<RolloutView>)> {
    let fleet = s.fleet();
    let Some(pool) = fleet.pools.iter().position(|p| p.name == b.pool) else {
        let names: Vec<&str> = fleet.pools.iter().map(|p| p.name.as_str()).collect();
        return Err(ApiError::not_found(format!(
            "no pool `{}` (pools: {})",
            b.pool,
            names.join(", ")
        )));
    };
    let pool_units: u64 = s
        .fleet()
        .nodes
        .iter()
        .filter(|n| n.pool.0 as usize == pool)
        .map(|n| n.gpus as u64 * 1000)
        .sum();
    let spec = NewRollout {
        pool: b.pool.clone(),
        max_parallel: b.max_parallel.unwrap_or(1),
        max_unavailable_milli: b.max_unavailable_units.map_or(pool_units, |u| u as u64 * 1000),
        deadline_s: b.deadline_s,
        preempt: b.after == Some(RolloutAfter::Preempt),
    };
    let r = s
        .lifecycle
        .start_rollout(spec, id.actor.clone())
        .await
        .map_err(lifecycle_error)?;
    Ok((StatusCode::CREATED, Json(view(&r))))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RolloutListParams {
    /// Rollouts per page (default 100).
    #[param(schema_with = rules::schema::page_limit)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page (a rollout id): the page starts below it.
    #[param(schema_with = rules::schema::cursor_id)]
    pub cursor: Option<u64>,
}

impl Validate for RolloutListParams {
    fn validate(&self) -> Result<(), Violation> {
        check_limit(self.limit)?;
        if let Some(c) = self.cursor {
            rules::ID.check_u64("cursor", c)?;
        }
        Ok(())
    }
}

/// The rollouts, newest first, a page at a time (follow `next_cursor`).
#[utoipa::path(get, path = "/api/v1/rollouts", tag = "fleet", params(RolloutListParams),
    responses((status = 200, body = Page<RolloutView>), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 422, description = "`limit` or `cursor` out of range", body = Problem)))]
pub async fn list_rollouts(
    State(s): State<AppState>,
    _: PlatformAdmin,
    ApiQuery(q): ApiQuery<RolloutListParams>,
) -> ApiResult<Json<Page<RolloutView>>> {
    let l = q.limit.unwrap_or(DEFAULT_LIMIT);
    let ops = s.lifecycle.published().ops();
    let items: Vec<RolloutView> = ops
        .rollouts
        .range(..q.cursor.unwrap_or(u64::MAX))
        .rev()
        .take(l as usize + 1)
        .map(|(_, r)| view(r))
        .collect();
    Ok(Json(page(items, l, |r| r.id.to_string())))
}

/// One rollout with the state of each node (times and reasons).
#[utoipa::path(get, path = "/api/v1/rollouts/{id}", tag = "fleet", params(RolloutIdParams),
    responses((status = 200, body = RolloutView), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 404, body = Problem)))]
pub async fn get_rollout(
    State(s): State<AppState>,
    id: Identity,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<RolloutView>> {
    let (_, v) = published_rollout(&s, &id, &raw, view)?;
    Ok(Json(v))
}

/// Cancels a running rollout: no more nodes are taken; nodes already out finish their upgrade
/// and validation.
#[utoipa::path(post, path = "/api/v1/rollouts/{id}/cancel", tag = "fleet", params(RolloutIdParams),
    responses((status = 200, body = RolloutView), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 404, body = Problem), (status = 409, description = "The rollout has ended", body = Problem)))]
pub async fn cancel_rollout(
    State(s): State<AppState>,
    id: Identity,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<RolloutView>> {
    let (rid, ()) = published_rollout(&s, &id, &raw, |_| ())?;
    let r = s
        .lifecycle
        .cancel_rollout(rid, id.actor.clone())
        .await
        .map_err(lifecycle_error)?;
    Ok(Json(view(&r)))
}
