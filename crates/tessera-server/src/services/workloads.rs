//! Workloads: a creation is checked here into the domain's [`WorkloadSpec`] and the engine's
//! request (the same checks for the API, the console, the dry run and native Kubernetes
//! submissions), then handed to the lifecycle loop, which answers once the workload is durable;
//! a cancel is checked and handed on the same way.

use std::sync::Arc;

use sha2::{Digest, Sha256};
use tessera_api::rules::{self, Validate};
use tessera_api::{CreateWorkload, GpuShape, Workload, WorkloadKind};
use tessera_domain::{GpuSpec, Kind, ShapeSpec, WorkloadId, WorkloadSpec};
use tessera_store::AuditRecord;

use super::lifecycle_error;
use crate::auth::Identity;
use crate::clock::now_ms;
use crate::http::views;
use crate::lifecycle::NewWorkload;
use crate::lifecycle::placement::{default_host, engine_request};
use crate::problem::{ApiError, ApiResult};
use crate::state::AppState;

/// The domain shape of an API shape (checked: exactly one of whole GPUs, a MIG profile or a
/// fraction). Whole GPUs are a multi-node gang when a gang's fields are given or when no node
/// (NVLink domain) of the pools they may use could hold them.
fn shape_spec(fleet: &tessera_model::Fleet, s: &GpuShape) -> ShapeSpec {
    let mut spec = ShapeSpec {
        gpu: GpuSpec::Whole { gpus: 0 },
        models: s.models.clone(),
        pool: s.pool.clone(),
    };
    let gang_asked =
        s.nodes.is_some() || s.gpus_per_node.is_some() || s.topology.is_some() || s.segment.is_some() || s.remainder;
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
        remainder: s.remainder,
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

/// Checks a creation request as [`create`] does, changing nothing.
pub(crate) async fn check_create(s: &AppState, id: &Identity, b: &CreateWorkload) -> ApiResult<Checked> {
    if !id.can_write(&b.tenant) {
        if id.can_read(&b.tenant) {
            return Err(ApiError::forbidden("viewer tokens cannot create workloads"));
        }
        return Err(ApiError::invalid("tenant", format!("no tenant `{}`", b.tenant)));
    }
    // While this replica leads, the tenancy it read is remembered (`tenancy_cache`: forgotten
    // on every tenancy write), sparing the store reads below on most requests.
    let epoch = s.replica.leading_epoch();
    let cache = &s.tenancy_cache;
    if !epoch.is_some_and(|e| cache.project_known(e, &b.tenant, &b.project)) {
        let generation = cache.generation();
        if s.store.get_tenant(&b.tenant).await?.is_none() {
            return Err(ApiError::invalid("tenant", format!("no tenant `{}`", b.tenant)));
        }
        if s.store.get_project(&b.tenant, &b.project).await?.is_none() {
            return Err(ApiError::invalid(
                "project",
                format!("no project `{}` in tenant `{}`", b.project, b.tenant),
            ));
        }
        if let Some(e) = epoch {
            cache.remember_project(generation, e, &b.tenant, &b.project);
        }
    }
    let priority = b.priority.clone().unwrap_or_else(|| "standard".into());
    if !s.priorities.contains(&priority) {
        return Err(ApiError::invalid(
            "priority",
            format!("unknown priority class `{priority}` ({})", s.priorities.join(", ")),
        ));
    }
    // A tenant's tokens use the classes the platform admin granted it (a grant takes effect at
    // once: the leader, which alone changes grants, forgets what it remembered); a
    // platform-admin, who grants them, may submit any class.
    if !id.is_admin() {
        let remembered = epoch.and_then(|e| cache.tenant(e, &b.tenant));
        let tenant = match remembered {
            Some(t) => t,
            None => {
                let generation = cache.generation();
                let t = Arc::new(
                    s.store
                        .get_tenant(&b.tenant)
                        .await?
                        .ok_or_else(|| ApiError::invalid("tenant", format!("no tenant `{}`", b.tenant)))?,
                );
                if let Some(e) = epoch {
                    cache.remember_tenant(generation, e, t.clone());
                }
                t
            }
        };
        let granted = crate::services::tenancy::granted(s, &tenant);
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
    let image = crate::http::imagepolicy::admit_image(s, &b.tenant, b.image.as_deref()).await?;
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

/// Creates a workload (the request `request_id`; an `Idempotency-Key` header's bytes): the
/// workload as the loop recorded it, and whether it was created now (`false`: the replay of an
/// idempotent request). The audit record commits with the workload; a refusal by quota,
/// budget, image policy or constraint is kept for the console's queue view.
pub async fn create(
    s: &AppState,
    id: &Identity,
    request_id: String,
    idempotency_key: Option<&[u8]>,
    b: CreateWorkload,
) -> ApiResult<(Workload, bool)> {
    b.validate()?;
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
    } = check_create(s, id, &b).await.map_err(refused)?;
    let idempotency = match idempotency_key {
        Some(k) => {
            let k = rules::check_idempotency_key(k)?.to_string();
            let body = serde_json::to_vec(&b).unwrap_or_default();
            let h = hex::encode(Sha256::digest(&body));
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
        request_id,
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
    Ok((views::workload(&w), created))
}

/// A workload the caller may see (others answer 404, so existence does not leak).
pub async fn find(s: &AppState, id: &Identity, wid: WorkloadId) -> ApiResult<std::sync::Arc<tessera_domain::Workload>> {
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

/// A workload's view, if the caller may see it.
pub async fn get(s: &AppState, id: &Identity, wid: WorkloadId) -> ApiResult<Workload> {
    let w = find(s, id, wid).await?;
    let mut v = views::workload(&w);
    v.expected_start = expected_start(s, &w).await;
    Ok(v)
}

/// For a multi-node gang waiting for capacity that holds no nodes yet (its reason says when
/// once it does): when and where it would start if it held nodes now — the hold the scheduler
/// gives it once it has waited past the backfill window, planned as the dry run plans it,
/// behind the holds already taken. `None` for anything else (a gang whose reason says when it
/// will take capacity back from borrowers, or by priority, included), or where no pool has
/// room for another hold.
async fn expected_start(s: &AppState, w: &tessera_domain::Workload) -> Option<String> {
    if w.phase != tessera_domain::Phase::Queued || !matches!(w.spec.shape.gpu, GpuSpec::Gang(_)) {
        return None;
    }
    let reason = w.reason.as_ref()?;
    // A hold's reason already says when and where ("… held for it …"), as does one that says
    // when it will take capacity from running work (reclaim, priority); a refusal-like wait
    // (quota, budget) is not about capacity.
    if !matches!(
        reason.code,
        tessera_domain::ReasonCode::NoCapacity | tessera_domain::ReasonCode::Fragmentation
    ) || reason.detail.contains(" held for it ")
        || tessera_sched::reason::takes_capacity(&reason.detail)
    {
        return None;
    }
    // An engine copy at least as new as the records read (as the dry run takes it): an older
    // one may not hold the work placed since, and promise a start now.
    let snap = s.lifecycle.trial_snapshot().await;
    let trial = snap.trial.as_ref()?;
    let (_, gang) =
        crate::lifecycle::placement::resolve(&snap.fleet, &w.spec, tessera_model::TenantId(u32::MAX)).ok()?;
    let duration_ms = w
        .spec
        .duration_s
        .map(|d| i64::try_from(d.saturating_mul(1000)).unwrap_or(i64::MAX));
    let start = trial.gang_start(&gang?, duration_ms, now_ms())?;
    Some(expected_start_words(&start))
}

/// When and where a waiting gang would start, in the words of its queue reason: the hold the
/// scheduler would give it, behind the holds of the gangs already waiting.
pub(crate) fn expected_start_words(s: &tessera_sched::cycle::GangStart) -> String {
    let where_ = match s.racks.len() {
        0 => String::new(),
        1 => format!(" in rack {}", s.racks[0]),
        _ => format!(" in racks {}", s.racks.join(", ")),
    };
    let workloads = if s.ending == 1 { "workload" } else { "workloads" };
    match s.starts_at_ms {
        Some(at) if s.ending == 0 => format!(
            "if it waits, it starts at about {}{where_}",
            tessera_sched::reason::utc_datetime(at)
        ),
        Some(at) => format!(
            "if it waits, it starts at about {}{where_} when {} {workloads} there {}",
            tessera_sched::reason::utc_datetime(at),
            s.ending,
            if s.ending == 1 { "ends" } else { "end" }
        ),
        None => format!(
            "if it waits, its start{where_} is unknown: it waits for {} {workloads} there to end, and some have no end time",
            s.ending
        ),
    }
}

/// Cancels a workload: a waiting one at once; a placed or running one is stopped (grace
/// period, then forced) and its capacity returned. 409 once it has ended.
pub async fn cancel(s: &AppState, id: &Identity, wid: WorkloadId) -> ApiResult<Workload> {
    let w = find(s, id, wid).await?;
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
    Ok(views::workload(&w))
}
