//! Fleet views: pools, nodes and GPUs, read from the lifecycle's published snapshot. Pages
//! are cut before views are built, so a page costs the same on 480 GPUs and on 80,000.

use std::ops::Range;

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use tessera_api::rules::{self, Validate, Violation};
use tessera_api::{GpuView, NodeView, Page, PoolView};
use utoipa::IntoParams;

use super::{ApiQuery, DEFAULT_LIMIT, PageParams, check_limit, views};
use crate::auth::Identity;
use crate::problem::ApiResult;
use crate::state::AppState;

/// Pools with their sharing mode and GPU units in use.
/// A cursor that names no pool ends the listing.
#[utoipa::path(get, path = "/api/v1/pools", tag = "fleet", params(PageParams), responses((status = 200, body = Page<PoolView>)))]
pub async fn list_pools(
    State(s): State<AppState>,
    _id: Identity,
    ApiQuery(p): ApiQuery<PageParams>,
) -> ApiResult<Json<Page<PoolView>>> {
    let l = p.limit() as usize;
    let all = views::pools(&s.lifecycle.snapshot());
    let start = match &p.cursor {
        Some(c) => all
            .iter()
            .position(|x| x.name == *c)
            .map(|i| i + 1)
            .unwrap_or(all.len()),
        None => 0,
    };
    let items: Vec<PoolView> = all.into_iter().skip(start).take(l + 1).collect();
    Ok(Json(super::page(items, l as u32, |x| x.name.clone())))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FleetFilter {
    /// Only this pool.
    pub pool: Option<String>,
    /// Only this node.
    pub node: Option<String>,
    /// Items per page (default 100).
    #[param(schema_with = rules::schema::page_limit)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page; one that names nothing ends the listing.
    pub cursor: Option<String>,
}

impl Validate for FleetFilter {
    fn validate(&self) -> Result<(), Violation> {
        check_limit(self.limit)
    }
}

/// The node indexes of `fleet` (a snapshot's: the indexes are its nodes') a filter covers.
fn node_range(fleet: &tessera_model::Fleet, f: &FleetFilter) -> Range<usize> {
    let mut r = 0..fleet.nodes.len();
    if let Some(p) = &f.pool {
        let Some(pid) = fleet.pool_by_name(p) else {
            return 0..0;
        };
        let n = &fleet.pool(pid).nodes;
        r = n.start as usize..n.end as usize;
    }
    if let Some(name) = &f.node {
        r = match fleet.node_by_name(name) {
            Some(i) if r.contains(&(i.0 as usize)) => i.0 as usize..i.0 as usize + 1,
            _ => 0..0,
        };
    }
    r
}

/// Nodes with free host resources and GPUs.
#[utoipa::path(get, path = "/api/v1/nodes", tag = "fleet", params(FleetFilter), responses((status = 200, body = Page<NodeView>)))]
pub async fn list_nodes(
    State(s): State<AppState>,
    _id: Identity,
    ApiQuery(f): ApiQuery<FleetFilter>,
) -> ApiResult<Json<Page<NodeView>>> {
    let l = f.limit.unwrap_or(DEFAULT_LIMIT) as usize;
    let snap = s.lifecycle.snapshot();
    let mut range = node_range(&snap.fleet, &f);
    if let Some(c) = &f.cursor {
        range.start = match snap.fleet.node_by_name(c) {
            Some(after) => range.start.max(after.0 as usize + 1),
            None => range.end,
        };
    }
    let ops = s.lifecycle.published().ops();
    let items: Vec<NodeView> = range
        .take(l + 1)
        .map(|i| {
            views::node(
                &snap.fleet,
                i,
                &snap.nodes[i],
                ops.node_state(&snap.fleet.nodes[i].name),
            )
        })
        .collect();
    Ok(Json(super::page(items, l as u32, |x| x.name.clone())))
}

/// GPUs with their MIG layout or shares, and who holds each slice.
#[utoipa::path(get, path = "/api/v1/gpus", tag = "fleet", params(FleetFilter), responses((status = 200, body = Page<GpuView>)))]
pub async fn list_gpus(
    State(s): State<AppState>,
    id: Identity,
    ApiQuery(f): ApiQuery<FleetFilter>,
) -> ApiResult<Json<Page<GpuView>>> {
    let l = f.limit.unwrap_or(DEFAULT_LIMIT) as usize;
    let snap = s.lifecycle.snapshot();
    let mut range = node_range(&snap.fleet, &f);
    // The cursor is the last GPU of the previous page: `node/index`.
    let mut skip_in_first = 0;
    if let Some(c) = &f.cursor {
        let at = c
            .rsplit_once('/')
            .and_then(|(node, gpu)| Some((snap.fleet.node_by_name(node)?.0 as usize, gpu.parse::<usize>().ok()?)));
        match at {
            Some((n, gpu)) if n >= range.start => {
                range.start = n;
                skip_in_first = gpu.saturating_add(1);
            }
            Some(_) => {}
            None => range.start = range.end,
        }
    }
    let mut items = Vec::with_capacity(l + 1);
    for i in range {
        let before = items.len();
        views::gpus_of(&snap.fleet, i, &snap.nodes[i], &id, &mut items);
        if skip_in_first > 0 {
            let drop = skip_in_first.min(items.len() - before);
            items.drain(before..before + drop);
            skip_in_first = 0;
        }
        if items.len() > l {
            break;
        }
    }
    items.truncate(l + 1);
    Ok(Json(super::page(items, l as u32, |x| {
        format!("{}/{}", x.node, x.index)
    })))
}
