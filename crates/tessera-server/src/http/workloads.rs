//! Workloads: requests for GPUs, their state and their timelines.
//!
//! A creation is validated here into the domain's [`WorkloadSpec`] and the engine's request;
//! the lifecycle loop answers once the workload is durable. Reads of single workloads come from
//! what the loop published, lists and timelines from the store.

use axum::Extension;
use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tessera_api::{CreateWorkload, Event, GpuShape, Page, Problem, Workload, WorkloadKind, WorkloadState};
use tessera_domain::{GpuSpec, Kind, ShapeSpec, WorkloadId, WorkloadSpec};
use tessera_store::AuditRecord;
use utoipa::IntoParams;

use super::{ApiJson, limit, page, views};
use crate::audit::{Audited, RequestId};
use crate::auth::Identity;
use crate::lifecycle::placement::{default_host, engine_request};
use crate::lifecycle::{LifecycleError, NewWorkload};
use crate::problem::{ApiError, ApiResult};
use crate::{AppState, now_ms};

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WorkloadFilterParams {
    pub tenant: Option<String>,
    pub project: Option<String>,
    /// `pending`, `queued`, `placed`, `running`, `stopping`, `succeeded`, `failed`, `cancelled`, `preempted`.
    pub state: Option<String>,
    pub limit: Option<u32>,
    pub cursor: Option<String>,
}

/// A lifecycle refusal as a problem document: the problem type is the reason's code.
pub fn lifecycle_error(e: LifecycleError) -> ApiError {
    match e {
        LifecycleError::Refused { reason, field, message } => match field {
            Some(f) => ApiError::invalid(f, message).with_kind(reason.code.as_str()),
            None => ApiError::refused(reason.code.as_str(), reason.detail),
        },
        LifecycleError::IdempotencyMismatch { .. } => ApiError::invalid("Idempotency-Key", e.to_string()),
        LifecycleError::Ended { .. } => ApiError::conflict(e.to_string()),
        LifecycleError::NotFound { .. } => ApiError::not_found(e.to_string()),
        LifecycleError::Unavailable(why) => ApiError::unavailable(why),
    }
}

/// Workloads, newest first.
#[utoipa::path(get, path = "/api/v1/workloads", tag = "workloads", params(WorkloadFilterParams),
    responses((status = 200, body = Page<Workload>), (status = 422, body = Problem)))]
pub async fn list_workloads(
    State(s): State<AppState>,
    id: Identity,
    Query(q): Query<WorkloadFilterParams>,
) -> ApiResult<Json<Page<Workload>>> {
    let l = limit(q.limit)?;
    let phases = match &q.state {
        Some(st) => views::phases(
            WorkloadState::parse(st).ok_or_else(|| ApiError::invalid("state", format!("unknown state `{st}`")))?,
        ),
        None => Vec::new(),
    };
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
    let before = match &q.cursor {
        Some(c) => {
            Some(WorkloadId(c.parse::<u64>().map_err(|_| {
                ApiError::invalid("cursor", "not a cursor from this API")
            })?))
        }
        None => None,
    };
    let filter = tessera_store::WorkloadFilter {
        scope: id.scope().map(str::to_string),
        tenant,
        project: q.project.clone(),
        phases,
        before,
        limit: l + 1,
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

/// The domain shape of an API shape: exactly one of whole GPUs, a MIG profile or a fraction.
fn shape_spec(s: &GpuShape) -> ApiResult<ShapeSpec> {
    let set = [s.gpus.is_some(), s.mig.is_some(), s.fraction.is_some()]
        .iter()
        .filter(|x| **x)
        .count();
    if set != 1 {
        return Err(ApiError::invalid(
            "shape",
            "give exactly one of `gpus` (whole GPUs), `mig` (a MIG profile) or `fraction` (milli-GPU)",
        ));
    }
    if s.gpu_memory_mib.is_some() && s.fraction.is_none() {
        return Err(ApiError::invalid(
            "shape.gpu_memory_mib",
            "gpu_memory_mib goes with `fraction` only (whole GPUs and MIG instances come with their memory)",
        ));
    }
    let gpu = if let Some(g) = s.gpus {
        GpuSpec::Whole { gpus: g }
    } else if let Some(m) = &s.mig {
        GpuSpec::Mig { profile: m.clone() }
    } else {
        GpuSpec::Fraction {
            milli: s.fraction.unwrap_or(0),
            memory_mib: s.gpu_memory_mib,
        }
    };
    Ok(ShapeSpec {
        gpu,
        models: s.models.clone(),
        pool: s.pool.clone(),
    })
}

/// Requests GPUs. Accepts an `Idempotency-Key` header: repeating a request with the same key
/// and body returns the workload created the first time (200) instead of a new one.
#[utoipa::path(post, path = "/api/v1/workloads", tag = "workloads", request_body = CreateWorkload,
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes retries safe")),
    responses((status = 201, body = Workload), (status = 200, description = "Replay of an idempotent request", body = Workload),
        (status = 400, body = Problem), (status = 403, description = "Refused by a quota limit or budget", body = Problem),
        (status = 413, body = Problem), (status = 422, body = Problem)))]
pub async fn create_workload(
    State(s): State<AppState>,
    id: Identity,
    rid: Option<Extension<RequestId>>,
    headers: HeaderMap,
    ApiJson(b): ApiJson<CreateWorkload>,
) -> ApiResult<Response> {
    let received_at = now_ms();
    if !id.can_write(&b.tenant) {
        if id.can_read(&b.tenant) {
            return Err(ApiError::forbidden("viewer tokens cannot create workloads"));
        }
        return Err(ApiError::invalid("tenant", format!("no tenant `{}`", b.tenant)));
    }
    // Known tenant/project pairs are remembered (a project is only forgotten when deleted),
    // sparing two store reads per request.
    let key = format!("{}/{}", b.tenant, b.project);
    let known = s.projects.read().expect("lock").contains(&key);
    if !known {
        if s.store.get_tenant(&b.tenant).await?.is_none() {
            return Err(ApiError::invalid("tenant", format!("no tenant `{}`", b.tenant)));
        }
        if s.store.get_project(&b.tenant, &b.project).await?.is_none() {
            return Err(ApiError::invalid(
                "project",
                format!("no project `{}` in tenant `{}`", b.project, b.tenant),
            ));
        }
        s.projects.write().expect("lock").insert(key);
    }
    if b.name.is_empty() || b.name.len() > 63 || b.name.chars().any(|c| c.is_control()) {
        return Err(ApiError::invalid("name", "a name has 1–63 printable characters"));
    }
    if let Some(d) = b.duration_s
        && d <= 0
    {
        return Err(ApiError::invalid(
            "duration_s",
            format!("{d} s: a duration must be positive (omit it to run until cancelled)"),
        ));
    }
    let priority = b.priority.clone().unwrap_or_else(|| "standard".into());
    if !s.priorities.contains(&priority) {
        return Err(ApiError::invalid(
            "priority",
            format!("unknown priority class `{priority}` ({})", s.priorities.join(", ")),
        ));
    }
    let shape = shape_spec(&b.shape)?;
    let to_api = |e: crate::lifecycle::placement::FieldError| ApiError::invalid(e.field, e.message);
    let mut request = engine_request(&s.fleet, &shape, 0, 0).map_err(to_api)?;
    let (cpu_default, mem_default) = default_host(request.units(&s.fleet.catalogue));
    let cpu = b.cpu_milli.unwrap_or(cpu_default);
    let mem = b.memory_mib.unwrap_or(mem_default);
    request.cpu_milli = cpu;
    request.memory_mib = mem;
    let idempotency = match headers.get("idempotency-key") {
        Some(k) => {
            let k = k
                .to_str()
                .map_err(|_| ApiError::invalid("Idempotency-Key", "must be printable ASCII"))?
                .to_string();
            if k.is_empty() || k.len() > 200 {
                return Err(ApiError::invalid("Idempotency-Key", "must be 1–200 characters"));
            }
            let body = serde_json::to_vec(&b).unwrap_or_default();
            let h: String = Sha256::digest(&body).iter().map(|x| format!("{x:02x}")).collect();
            Some((k, h))
        }
        None => None,
    };
    let spec = WorkloadSpec {
        tenant: b.tenant,
        project: b.project,
        name: b.name,
        kind: match b.kind {
            WorkloadKind::Batch => Kind::Batch,
            WorkloadKind::Service => Kind::Service,
            WorkloadKind::Interactive => Kind::Interactive,
        },
        shape,
        cpu_milli: cpu,
        memory_mib: mem,
        duration_s: b.duration_s.map(|d| d as u64),
        command: b.command,
        image: b.image,
        env: b.env,
        priority,
        no_wait: b.no_wait,
        no_requeue: b.no_requeue,
    };
    // The audit record goes into the transaction that creates the workload.
    let audit = AuditRecord {
        seq: 0,
        at: received_at,
        request_id: rid.map(|Extension(r)| r.0).unwrap_or_default(),
        actor: id.actor.clone(),
        tenant: Some(spec.tenant.clone()),
        action: "POST /api/v1/workloads".into(),
        target: "/api/v1/workloads".into(),
        outcome: 0,
        detail: String::new(),
    };
    let nw = NewWorkload {
        spec,
        request,
        actor: id.actor.clone(),
        role: id.role.as_str().into(),
        idempotency,
        received_at,
        audit: Some(audit),
    };
    let (w, created) = s.lifecycle.create(nw).await.map_err(lifecycle_error)?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    let mut r = (status, Json(views::workload(&w))).into_response();
    r.extensions_mut().insert(Audited);
    Ok(r)
}

/// A workload the caller may see (others answer 404, so existence does not leak).
pub(super) async fn find_workload(
    s: &AppState,
    id: &Identity,
    wid: u64,
) -> ApiResult<std::sync::Arc<tessera_domain::Workload>> {
    let wid = WorkloadId(wid);
    let w = match s.lifecycle.workload(wid) {
        Some(w) => w,
        None => std::sync::Arc::new(
            s.store
                .get_workload(wid, id.scope())
                .await?
                .ok_or_else(|| ApiError::not_found(format!("no workload {wid}")))?,
        ),
    };
    if !id.can_read(&w.spec.tenant) {
        return Err(ApiError::not_found(format!("no workload {wid}")));
    }
    Ok(w)
}

#[utoipa::path(get, path = "/api/v1/workloads/{id}", tag = "workloads", params(("id" = u64, Path)),
    responses((status = 200, body = Workload), (status = 404, body = Problem)))]
pub async fn get_workload(State(s): State<AppState>, id: Identity, Path(wid): Path<u64>) -> ApiResult<Json<Workload>> {
    let w = find_workload(&s, &id, wid).await?;
    Ok(Json(views::workload(&w)))
}

/// Cancels a workload: a waiting one at once; a placed or running one is stopped (grace
/// period, then forced) and its capacity returned.
#[utoipa::path(post, path = "/api/v1/workloads/{id}/cancel", tag = "workloads", params(("id" = u64, Path)),
    responses((status = 200, body = Workload), (status = 404, body = Problem), (status = 409, body = Problem)))]
pub async fn cancel_workload(
    State(s): State<AppState>,
    id: Identity,
    Path(wid): Path<u64>,
) -> ApiResult<Json<Workload>> {
    let w = find_workload(&s, &id, wid).await?;
    if !id.can_write(&w.spec.tenant) {
        return Err(ApiError::forbidden("viewer tokens cannot cancel workloads"));
    }
    if w.phase.is_terminal() {
        return Err(ApiError::conflict(format!(
            "workload {wid} has already ended ({})",
            views::state(w.phase).as_str()
        )));
    }
    let w = s
        .lifecycle
        .cancel(WorkloadId(wid), id.actor.clone())
        .await
        .map_err(lifecycle_error)?;
    Ok(Json(views::workload(&w)))
}

/// The workload's timeline: one event per lifecycle step.
#[utoipa::path(get, path = "/api/v1/workloads/{id}/events", tag = "workloads", params(("id" = u64, Path)),
    responses((status = 200, body = Vec<Event>), (status = 404, body = Problem)))]
pub async fn workload_events(
    State(s): State<AppState>,
    id: Identity,
    Path(wid): Path<u64>,
) -> ApiResult<Json<Vec<Event>>> {
    find_workload(&s, &id, wid).await?;
    let events = s.store.events(WorkloadId(wid), id.scope()).await?;
    Ok(Json(events.iter().map(views::event).collect()))
}
