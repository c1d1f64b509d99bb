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
use utoipa::IntoParams;

use super::{ApiJson, ApiQuery, DEFAULT_LIMIT, WorkloadPath, check_limit, page, views};
use crate::audit::{Audited, RequestId};
use crate::auth::Identity;
use crate::problem::ApiResult;
use crate::services::workloads;
use crate::state::AppState;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WorkloadFilterParams {
    pub tenant: Option<String>,
    pub project: Option<String>,
    #[param(inline)]
    pub state: Option<WorkloadState>,
    /// Workloads per page (default 100).
    #[param(schema_with = rules::schema::page_limit)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page (a workload id).
    #[param(schema_with = rules::schema::cursor_id)]
    pub cursor: Option<u64>,
}

impl Validate for WorkloadFilterParams {
    fn validate(&self) -> Result<(), Violation> {
        check_limit(self.limit)?;
        if let Some(c) = self.cursor {
            rules::ID.check_u64("cursor", c)?;
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

/// Workloads, newest first.
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
    let before = q.cursor.map(WorkloadId);
    let filter = tessera_store::WorkloadFilter {
        scope: id.scope().map(str::to_string),
        tenant,
        project: q.project.clone(),
        phases,
        before,
        limit: l + 1,
        ..Default::default()
    };
    let items: Vec<Workload> = s
        .store
        .list_workloads(&filter)
        .await?
        .iter()
        .map(views::workload)
        .collect();
    Ok(Json(page(items, l, |w| w.id.to_string())))
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

#[utoipa::path(get, path = "/api/v1/workloads/{id}", tag = "workloads", params(super::WorkloadIdParams),
    responses((status = 200, body = Workload)))]
pub async fn get_workload(
    State(s): State<AppState>,
    id: Identity,
    WorkloadPath(wid): WorkloadPath,
) -> ApiResult<Json<Workload>> {
    workloads::get(&s, &id, wid).await.map(Json)
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

/// The workload's timeline: one event per lifecycle step.
#[utoipa::path(get, path = "/api/v1/workloads/{id}/events", tag = "workloads", params(super::WorkloadIdParams),
    responses((status = 200, body = Vec<Event>)))]
pub async fn workload_events(
    State(s): State<AppState>,
    id: Identity,
    WorkloadPath(wid): WorkloadPath,
) -> ApiResult<Json<Vec<Event>>> {
    workloads::find(&s, &id, wid).await?;
    let events = s.store.events(wid, id.scope()).await?;
    Ok(Json(events.iter().map(views::event).collect()))
}
