//! Workloads over HTTP: requests for GPUs, their state and their timelines.
//!
//! A creation and a cancel are the services of [`crate::services::workloads`] (which check a
//! creation into the domain's `WorkloadSpec` and hand it to the lifecycle loop). Reads of
//! single workloads come from what the loop published, lists and timelines from the store.

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tessera_api::rules::{self, Validate, Violation};
use tessera_api::{CreateWorkload, Event, Page, Problem, Workload, WorkloadState};
use tessera_domain::WorkloadId;
use tessera_store::{WorkloadOrder, WorkloadSeek};
use utoipa::{IntoParams, ToSchema};

use super::{ApiJson, ApiQuery, DEFAULT_LIMIT, WorkloadPath, check_limit, views};
use crate::audit::{Audited, RequestId};
use crate::auth::Identity;
use crate::problem::ApiResult;
use crate::services::{tokens, workloads};
use crate::state::AppState;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WorkloadFilterParams {
    pub tenant: Option<String>,
    pub project: Option<String>,
    #[param(inline)]
    pub state: Option<WorkloadState>,
    /// The order of the list over every matching workload (default `newest`).
    #[param(inline)]
    pub sort: Option<WorkloadSort>,
    /// Workloads per page (default 100).
    #[param(schema_with = rules::schema::page_limit)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page of the same sort: the last workload's id, and
    /// for `name` and `state` after a `:` the value it was sorted by. Pages read this way skip
    /// and repeat nothing when workloads are added between them. Empty: the first page.
    #[param(max_length = 300)]
    pub cursor: Option<String>,
}

/// The longest cursor (in characters) the list takes, as its document says (`max_length`).
const CURSOR_MAX_CHARS: usize = 300;

impl WorkloadFilterParams {
    /// The cursor asked for; an empty one asks for the first page, as no cursor does.
    fn cursor(&self) -> Option<&str> {
        self.cursor.as_deref().filter(|c| !c.is_empty())
    }
}

/// The orders of the workload list.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadSort {
    /// The newest (highest id) first.
    #[default]
    Newest,
    /// The oldest (lowest id) first.
    Oldest,
    /// By name in byte order, the newest first among equal names.
    Name,
    /// By the lifecycle phase's name in byte order (`cancelled`, `failed`, `partitioned`,
    /// `pending`, `placed`, `preempted`, `queued`, `running`, `stopping`, `succeeded`), the
    /// newest first within a phase.
    State,
}

impl WorkloadSort {
    fn order(self) -> WorkloadOrder {
        match self {
            WorkloadSort::Newest => WorkloadOrder::Newest,
            WorkloadSort::Oldest => WorkloadOrder::Oldest,
            WorkloadSort::Name => WorkloadOrder::Name,
            WorkloadSort::State => WorkloadOrder::Phase,
        }
    }
}

/// The position a cursor names in the list sorted by `sort`: `ID` for the orders by id,
/// `ID:VALUE` for `name` and `state` (the value the last workload was sorted by); `None` when
/// it is not a cursor of that sort.
fn seek_of(cursor: &str, sort: WorkloadSort) -> Option<WorkloadSeek> {
    let (id, key) = match cursor.split_once(':') {
        Some((id, key)) => (id, Some(key)),
        None => (cursor, None),
    };
    let id: u64 = id.parse().ok()?;
    rules::ID.check_u64("cursor", id).ok()?;
    let key = match (sort, key) {
        (WorkloadSort::Newest | WorkloadSort::Oldest, None) => String::new(),
        (WorkloadSort::Name, Some(k)) => k.to_string(),
        (WorkloadSort::State, Some(k)) if tessera_domain::Phase::parse(k).is_some() => k.to_string(),
        _ => return None,
    };
    Some(WorkloadSeek {
        id: WorkloadId(id),
        key,
    })
}

/// The cursor of the page after the one ending with `w`, in the list sorted by `sort`.
fn cursor_of(w: &tessera_domain::Workload, sort: WorkloadSort) -> String {
    let seek = WorkloadSeek::of(sort.order(), w);
    match sort {
        WorkloadSort::Newest | WorkloadSort::Oldest => seek.id.0.to_string(),
        WorkloadSort::Name | WorkloadSort::State => format!("{}:{}", seek.id.0, seek.key),
    }
}

impl Validate for WorkloadFilterParams {
    fn validate(&self) -> Result<(), Violation> {
        check_limit(self.limit)?;
        if let Some(c) = self.cursor()
            && c.chars().count() > CURSOR_MAX_CHARS
        {
            return Err(Violation::new(
                "cursor",
                format!("longer than {CURSOR_MAX_CHARS} characters: pass back the previous page's next_cursor"),
            ));
        }
        if let Some(c) = self.cursor()
            && seek_of(c, self.sort.unwrap_or_default()).is_none()
        {
            return Err(Violation::new(
                "cursor",
                "not a next_cursor of this sort: pass back the previous page's next_cursor with the same sort",
            ));
        }
        Ok(())
    }
}

/// The document's side of the `Idempotency-Key` header (checked by
/// [`rules::check_idempotency_key`]).
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)] // only its schema is used
pub struct IdempotencyParams {
    /// Makes retries safe: a repeated request with the same key and body returns the workload
    /// created the first time.
    #[param(rename = "Idempotency-Key", schema_with = rules::schema::idempotency_key)]
    idempotency_key: Option<String>,
}

pub use crate::services::lifecycle_error;

/// Workloads, newest first unless `sort` says otherwise; every order holds over all matching
/// workloads, page after page. A token id in a reason is named as in a workload's timeline.
///
/// Refused with 422 where no schema can say it: a `cursor` that is not a `next_cursor` this
/// list gave for the same `sort`.
#[utoipa::path(get, path = "/api/v1/workloads", tag = "workloads", params(WorkloadFilterParams),
    responses((status = 200, body = Page<Workload>)))]
pub async fn list_workloads(
    State(s): State<AppState>,
    id: Identity,
    ApiQuery(q): ApiQuery<WorkloadFilterParams>,
) -> ApiResult<Json<Page<Workload>>> {
    let l = q.limit.unwrap_or(DEFAULT_LIMIT);
    let phases = q.state.map(views::phases).unwrap_or_default();
    let tenant = match (&id.tenant, &q.tenant) {
        (_, Some(t)) if !id.can_read(t) => {
            return Ok(Json(Page {
                items: vec![],
                next_cursor: None,
            }));
        }
        (Some(own), None) if !id.is_admin() => Some(own.clone()),
        (_, t) => t.clone(),
    };
    let sort = q.sort.unwrap_or_default();
    let filter = tessera_store::WorkloadFilter {
        scope: id.scope().map(str::to_string),
        tenant,
        project: q.project.clone(),
        phases,
        order: sort.order(),
        after: q.cursor().and_then(|c| seek_of(c, sort)),
        limit: l + 1,
        ..Default::default()
    };
    let rows = s.store.list_workloads(&filter).await?;
    // One more row than the page was read: where there is one, another page follows.
    let shown = &rows[..rows.len().min(l as usize)];
    let next_cursor = (rows.len() > shown.len())
        .then(|| shown.last().map(|w| cursor_of(w, sort)))
        .flatten();
    let mut items: Vec<Workload> = shown.iter().map(views::workload).collect();
    tokens::name_in(&s, &id, items.iter_mut().filter_map(|w| w.reason.as_mut())).await?;
    Ok(Json(Page { items, next_cursor }))
}

/// Requests GPUs. Accepts an `Idempotency-Key` header: repeating a request with the same key
/// and body returns the workload created the first time (200) instead of a new one.
#[utoipa::path(post, path = "/api/v1/workloads", tag = "workloads", request_body = CreateWorkload,
    params(IdempotencyParams),
    responses((status = 201, body = Workload), (status = 200, description = "Replay of an idempotent request", body = Workload),
        (status = 403, description = "Refused by a quota limit or budget, by the tenant's image policy (`type` …/image-registry-not-allowed, …/image-signature-missing, …/image-signature-invalid), a priority class not granted to the tenant (`type` …/priority-not-granted, the detail names the granted classes), or a viewer token", body = Problem),
        (status = 422, description = "A value breaks a rule, names an unknown tenant, project or priority class, or asks for a shape no node can ever hold (`type` …/constraint)", body = Problem),
        (status = 503, description = "The tenant's image policy needs the image's registry, which could not be asked", body = Problem)))]
pub async fn create_workload(
    State(s): State<AppState>,
    id: Identity,
    rid: Option<Extension<RequestId>>,
    headers: HeaderMap,
    ApiJson(b): ApiJson<CreateWorkload>,
) -> ApiResult<Response> {
    let rid = rid.map(|Extension(r)| r.0).unwrap_or_default();
    let key = headers.get("idempotency-key").map(|k| k.as_bytes());
    let (w, created) = workloads::create(&s, &id, rid, key, b).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    let mut r = (status, Json(w)).into_response();
    r.extensions_mut().insert(Audited);
    Ok(r)
}

/// A workload. A token id in its reason (who cancelled it) is named `name (tok-…)` where the
/// caller may see that token, as in its timeline.
#[utoipa::path(get, path = "/api/v1/workloads/{id}", tag = "workloads", params(super::WorkloadIdParams),
    responses((status = 200, body = Workload)))]
pub async fn get_workload(
    State(s): State<AppState>,
    id: Identity,
    WorkloadPath(wid): WorkloadPath,
) -> ApiResult<Json<Workload>> {
    let mut w = workloads::get(&s, &id, wid).await?;
    tokens::name_in(&s, &id, w.reason.as_mut()).await?;
    Ok(Json(w))
}

/// Cancels a workload: a waiting one at once; a placed or running one is stopped (grace
/// period, then forced) and its capacity returned.
#[utoipa::path(post, path = "/api/v1/workloads/{id}/cancel", tag = "workloads", params(super::WorkloadIdParams),
    responses((status = 200, body = Workload), (status = 409, description = "The workload has ended", body = Problem)))]
pub async fn cancel_workload(
    State(s): State<AppState>,
    id: Identity,
    WorkloadPath(wid): WorkloadPath,
) -> ApiResult<Json<Workload>> {
    workloads::cancel(&s, &id, wid).await.map(Json)
}

/// The workload's timeline: one event per lifecycle step. A token id in a step's detail (who
/// authorised the request, who cancelled it) is named `name (tok-…)` where the caller may see
/// that token (its own tenant's; every token for a platform admin), else left bare.
#[utoipa::path(get, path = "/api/v1/workloads/{id}/events", tag = "workloads", params(super::WorkloadIdParams),
    responses((status = 200, body = Vec<Event>)))]
pub async fn workload_events(
    State(s): State<AppState>,
    id: Identity,
    WorkloadPath(wid): WorkloadPath,
) -> ApiResult<Json<Vec<Event>>> {
    workloads::find(&s, &id, wid).await?;
    let mut events: Vec<Event> = s
        .store
        .events(wid, id.scope())
        .await?
        .iter()
        .map(views::event)
        .collect();
    tokens::name_in(&s, &id, events.iter_mut().map(|e| &mut e.detail)).await?;
    Ok(Json(events))
}
