//! Workloads: requests for GPUs, their state and their timelines.
//!
//! A creation is validated here into the domain's [`WorkloadSpec`] and the engine's request;
//! the lifecycle loop answers once the workload is durable. Reads of single workloads come from
//! what the loop published, lists and timelines from the store.

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tessera_api::rules::{self, Validate, Violation};
use tessera_api::{CreateWorkload, Event, GpuShape, Page, Problem, Workload, WorkloadKind, WorkloadState};
use tessera_domain::{GpuSpec, Kind, ShapeSpec, WorkloadId, WorkloadSpec};
use tessera_store::AuditRecord;
use utoipa::IntoParams;

use super::{ApiJson, ApiQuery, DEFAULT_LIMIT, WorkloadPath, check_limit, page, views};
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
        LifecycleError::Conflict(why) => ApiError::conflict(why),
        LifecycleError::Mig(r, why) if r.is_state() => ApiError::conflict(why).with_kind(r.code()),
        LifecycleError::Mig(r, why) => ApiError::unprocessable(r.code(), why),
    }
}

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

/// The domain shape of an API shape (checked: exactly one of whole GPUs, a MIG profile or a
/// fraction). Whole GPUs are a multi-node gang when a gang's fields are given or when no node
/// (NVLink domain) of the pools they may use could hold them.
fn shape_spec(fleet: &tessera_model::Fleet, s: &GpuShape) -> ShapeSpec {
    let mut spec = ShapeSpec {
        gpu: GpuSpec::Whole { gpus: 0 },
        models: s.models.clone(),
        pool: s.pool.clone(),
    };
    let gang_asked = s.nodes.is_some() || s.gpus_per_node.is_some() || s.topology.is_some() || s.segment.is_some();
    spec.gpu = if let Some(n) = s.nodes {
        let per = s
            .gpus_per_node
            .map_or_else(|| s.gpus.unwrap_or(0) / n.max(1), u32::from);
        gang_spec(s, n.saturating_mul(per), Some(per.min(255) as u8))
    } else if let Some(g) = s.gpus {
        if gang_asked || g > crate::lifecycle::placement::largest_whole_node(fleet, &spec).max(1) {
            gang_spec(s, g, s.gpus_per_node)
        } else {
            GpuSpec::Whole { gpus: g as u8 }
        }
    } else if let Some(m) = &s.mig {
        GpuSpec::Mig { profile: m.clone() }
    } else {
        GpuSpec::Fraction {
            milli: s.fraction.unwrap_or(0),
            memory_mib: s.gpu_memory_mib,
        }
    };
    spec
}

/// A gang of `gpus` whole GPUs with the shape's topology and segments.
fn gang_spec(s: &GpuShape, gpus: u32, gpus_per_node: Option<u8>) -> GpuSpec {
    use tessera_model::request::{TopologyConstraint, TopologyMode};
    GpuSpec::Gang(tessera_domain::GangSpec {
        gpus,
        gpus_per_node,
        topology: s.topology.as_ref().map(|level| TopologyConstraint {
            level: level.clone(),
            mode: match s.topology_mode.unwrap_or_default() {
                tessera_api::TopologyMode::Required => TopologyMode::Required,
                tessera_api::TopologyMode::Preferred => TopologyMode::Preferred,
            },
        }),
        segment: s.segment,
    })
}

/// A creation request checked against the caller's rights, the tenancy, the priority classes
/// and the fleet (shared by creation and the dry run).
pub(crate) struct Checked {
    pub priority: String,
    pub shape: ShapeSpec,
    pub request: tessera_model::Request,
    /// A multi-node gang's request (then `request` stands for one of its node-shares).
    pub gang: Option<tessera_model::request::GangRequest>,
    pub cpu: u64,
    pub mem: u64,
    /// The image to run, as the tenant's image policy admitted it (digest-pinned when a
    /// signature was verified).
    pub image: Option<String>,
}

/// Checks a creation request as [`create_workload`] does, changing nothing.
pub(crate) async fn check_create(s: &AppState, id: &Identity, b: &CreateWorkload) -> ApiResult<Checked> {
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
    let priority = b.priority.clone().unwrap_or_else(|| "standard".into());
    if !s.priorities.contains(&priority) {
        return Err(ApiError::invalid(
            "priority",
            format!("unknown priority class `{priority}` ({})", s.priorities.join(", ")),
        ));
    }
    // A tenant's tokens use the classes the platform admin granted it (read on every request:
    // a grant takes effect at once, on whichever replica leads); a platform-admin, who grants
    // them, may submit any class.
    if !id.is_admin() {
        let tenant = s
            .store
            .get_tenant(&b.tenant)
            .await?
            .ok_or_else(|| ApiError::invalid("tenant", format!("no tenant `{}`", b.tenant)))?;
        let granted = super::tenancy::granted(s, &tenant);
        if !granted.contains(&priority) {
            return Err(ApiError::priority_not_granted(format!(
                "tenant `{}` may use the priority classes {}; `{priority}` is not granted to it \
                 (a platform admin grants classes: tessera tenants set {} --priorities …)",
                b.tenant,
                granted.join(", "),
                b.tenant
            )));
        }
    }
    let fleet = s.fleet();
    let shape = shape_spec(&fleet, &b.shape);
    let to_api = |e: crate::lifecycle::placement::FieldError| ApiError::invalid(e.field, e.message);
    let mut request = engine_request(&fleet, &shape, 0, 0).map_err(to_api)?;
    if let GpuSpec::Gang(g) = &shape.gpu
        && !s.backend.capabilities().multi_node
    {
        return Err(ApiError::unprocessable(
            "constraint",
            format!(
                "{} GPUs across nodes: this backend runs a workload on one machine; ask for at most {} whole GPUs",
                g.gpus,
                crate::lifecycle::placement::largest_whole_node(&fleet, &shape)
            ),
        ));
    }
    // Host defaults per node-share for a gang (the request stands for one of its shares).
    let (cpu_default, mem_default) = default_host(request.units(&fleet.catalogue));
    let cpu = b.cpu_milli.unwrap_or(cpu_default);
    let mem = b.memory_mib.unwrap_or(mem_default);
    request.cpu_milli = cpu;
    request.memory_mib = mem;
    // The tenant's engine id matters only on shared GPUs, which gangs never use.
    let gang = crate::lifecycle::placement::engine_gang(&fleet, &shape, cpu, mem, tessera_model::TenantId(u32::MAX))
        .map_err(to_api)?;
    if s.backend.capabilities().needs_image && b.image.as_deref().is_none_or(|i| i.trim().is_empty()) {
        return Err(ApiError::invalid(
            "image",
            format!(
                "the {} backend runs containers: name the image to run (`--image` on the CLI)",
                s.backend.name()
            ),
        ));
    }
    // Last: it may ask the image's registry.
    let image = super::imagepolicy::admit_image(s, &b.tenant, b.image.as_deref()).await?;
    Ok(Checked {
        priority,
        shape,
        request,
        gang,
        cpu,
        mem,
        image,
    })
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
    let received_at = now_ms();
    // A refusal is kept for the console's queue view (the request is never stored).
    let who = (b.tenant.clone(), b.project.clone(), b.name.clone());
    let refused = |e: ApiError| {
        if crate::refusals::Refusals::is_refusal(&e) {
            s.refusals.record(crate::refusals::Refusal {
                at: received_at,
                tenant: who.0.clone(),
                project: who.1.clone(),
                name: who.2.clone(),
                actor: id.actor.clone(),
                code: e.kind,
                detail: e.detail.clone(),
            });
        }
        e
    };
    let Checked {
        priority,
        shape,
        request,
        gang: _,
        cpu,
        mem,
        image,
    } = check_create(&s, &id, &b).await.map_err(refused)?;
    let idempotency = match headers.get("idempotency-key") {
        Some(k) => {
            let k = rules::check_idempotency_key(k.as_bytes())?.to_string();
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
        image,
        env: b.env,
        priority,
        no_wait: b.no_wait,
        no_requeue: b.no_requeue,
        movable: b.movable.map(|m| match m {
            tessera_api::MovableMode::Restart => tessera_domain::Movable::Restart,
            tessera_api::MovableMode::Replace => tessera_domain::Movable::Replace,
        }),
        native: None,
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
    let (w, created) = s.lifecycle.create(nw).await.map_err(|e| refused(lifecycle_error(e)))?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    let mut r = (status, Json(views::workload(&w))).into_response();
    r.extensions_mut().insert(Audited);
    Ok(r)
}

/// A workload the caller may see (others answer 404, so existence does not leak).
pub(super) async fn find_workload(
    s: &AppState,
    id: &Identity,
    wid: WorkloadId,
) -> ApiResult<std::sync::Arc<tessera_domain::Workload>> {
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

#[utoipa::path(get, path = "/api/v1/workloads/{id}", tag = "workloads", params(super::WorkloadIdParams),
    responses((status = 200, body = Workload)))]
pub async fn get_workload(
    State(s): State<AppState>,
    id: Identity,
    WorkloadPath(wid): WorkloadPath,
) -> ApiResult<Json<Workload>> {
    let w = find_workload(&s, &id, wid).await?;
    Ok(Json(views::workload(&w)))
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
        .cancel(wid, id.actor.clone())
        .await
        .map_err(lifecycle_error)?;
    Ok(Json(views::workload(&w)))
}

/// The workload's timeline: one event per lifecycle step.
#[utoipa::path(get, path = "/api/v1/workloads/{id}/events", tag = "workloads", params(super::WorkloadIdParams),
    responses((status = 200, body = Vec<Event>)))]
pub async fn workload_events(
    State(s): State<AppState>,
    id: Identity,
    WorkloadPath(wid): WorkloadPath,
) -> ApiResult<Json<Vec<Event>>> {
    find_workload(&s, &id, wid).await?;
    let events = s.store.events(wid, id.scope()).await?;
    Ok(Json(events.iter().map(views::event).collect()))
}
