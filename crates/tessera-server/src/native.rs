//! Workloads asked for with the backend's own tools (on Kubernetes: pods made with `kubectl`,
//! and a Job's pods), which go through Tessera all the same.
//!
//! * The admission webhook, `POST /admission/mutate` and `POST /admission/validate`: the API
//!   server sends an `AdmissionReview` of each pod created in a tenant project's namespace;
//!   the backend says whether it is Tessera's business ([`Backend::review_native`]), the
//!   control plane checks it exactly as it checks `POST /api/v1/workloads` (tenant and project,
//!   the granted priority classes, the tenant's image policy for every container image, and a
//!   shape some pool of the fleet can hold), and the backend answers — on `mutate` with what it
//!   changes in an admitted pod (Tessera as its scheduler, restricted security defaults). The
//!   webhook has no side effect: it creates nothing, so it needs no credentials of its own and
//!   a review the API server abandons leaves nothing behind.
//! * The intake: once such a pod exists, the backend reports it
//!   ([`BackendEvent::Submitted`](tessera_backend::BackendEvent::Submitted)); the same checks run
//!   again (the pod may have reached the cluster without the webhook) and the workload is
//!   created through the lifecycle like any other, as the tenant's (actor `kubernetes`), once
//!   per object (the object's UID is the idempotency key), and linked to the pod
//!   ([`Backend::adopt_native`]). It then waits in Tessera's queue, its owner told why on the
//!   pod, and is bound by Tessera. A native workload is never requeued by Tessera: its owner
//!   (the Job controller) makes the replacement of a pod that was stopped.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use tessera_api::{CreateWorkload, TokenRole, WorkloadKind};
use tessera_backend::{Backend, BackendError, NativeAsk, NativeGpus, NativeRef, NativeReview};
use tessera_domain::{Kind, WorkloadSpec};
use tokio::sync::mpsc;

use crate::auth::Identity;
use crate::lifecycle::{LifecycleError, NewWorkload};
use crate::problem::ApiError;
use crate::services::workloads::{Checked, check_create};
use crate::state::AppState;

/// The actor of every native workload and the identity its checks run as.
pub const ACTOR: &str = "kubernetes";

/// The identity of a native request: a member of the tenant, as the namespace says.
fn identity(tenant: &str) -> Identity {
    Identity {
        actor: ACTOR.into(),
        name: String::new(),
        role: TokenRole::Member,
        tenant: Some(tenant.to_string()),
    }
}

/// The API request a native ask amounts to (its first image: every other one is checked on
/// its own). A gang Job asks for its pods' GPUs together, as that many node-shares of each
/// pod's GPUs, with its topology.
fn request(ask: &NativeAsk) -> CreateWorkload {
    let (gpus, mig, fraction) = match &ask.gpus {
        NativeGpus::Whole(n) => (Some(*n), None, None),
        NativeGpus::Mig(p) => (None, Some(p.clone()), None),
        NativeGpus::Fraction(m) => (None, None, Some(u16::try_from(*m).unwrap_or(u16::MAX))),
    };
    let mut shape = serde_json::json!({"gpus": gpus, "mig": mig, "fraction": fraction,
        "models": ask.model.iter().collect::<Vec<_>>(), "pool": ask.pool});
    if let (Some(g), Some(per_pod)) = (&ask.gang, gpus) {
        shape["gpus"] = serde_json::json!(per_pod.saturating_mul(g.pods));
        shape["nodes"] = serde_json::json!(g.pods);
        shape["gpus_per_node"] = serde_json::json!(u8::try_from(per_pod).unwrap_or(u8::MAX));
        if let Some(t) = &g.topology {
            shape["topology"] = serde_json::json!(t);
            shape["topology_mode"] = serde_json::json!(if g.preferred { "preferred" } else { "required" });
        }
    }
    let body = serde_json::json!({
        "tenant": ask.tenant,
        "project": ask.project,
        "name": ask.name,
        "kind": if ask.batch { "batch" } else { "service" },
        "shape": shape,
        "cpu_milli": ask.cpu_milli,
        "memory_mib": ask.memory_mib,
        "image": ask.images.first(),
        "priority": ask.priority,
        "no_requeue": true,
    });
    serde_json::from_value(body).expect("a native ask is a creation request")
}

/// Every check a `POST /api/v1/workloads` of the same request would pass before it is
/// queued, plus the images after the first and whether the fleet can ever hold the shape: the
/// refusal in a sentence, or the checked request.
async fn check(s: &AppState, ask: &NativeAsk) -> Result<(CreateWorkload, Checked), String> {
    let body = request(ask);
    let id = identity(&ask.tenant);
    let detail = |e: ApiError| e.detail;
    let checked = check_create(s, &id, &body).await.map_err(detail)?;
    if ask.gang.is_none()
        && let tessera_domain::GpuSpec::Gang(g) = &checked.shape.gpu
    {
        // One pod runs on one node: more whole GPUs than a node holds is a gang Job.
        return Err(format!(
            "the pod asks for {} GPUs, more than one node of the pools it may use holds ({}): make it a Job of several pods with the annotation tessera.io/gang: \"true\" (one pod per node)",
            g.gpus,
            crate::lifecycle::placement::largest_whole_node(&s.fleet(), &checked.shape),
        ));
    }
    for image in ask.images.iter().skip(1) {
        crate::http::imagepolicy::admit_image(s, &ask.tenant, Some(image))
            .await
            .map_err(detail)?;
    }
    let snap = s.lifecycle.snapshot();
    let preview = crate::http::dryrun::preview(s, &snap, &body, &checked, false).await;
    if preview.outcome == "refused" && preview.reason_code.as_deref() == Some("constraint") {
        return Err(preview
            .reason
            .unwrap_or_else(|| "no pool of this fleet can ever hold this shape".into()));
    }
    Ok((body, checked))
}

/// `POST /admission/mutate`: the mutating webhook.
pub async fn mutate(State(s): State<AppState>, body: Bytes) -> Response {
    review(&s, &body, true).await
}

/// `POST /admission/validate`: the validating webhook (the final object, after every mutation).
pub async fn validate(State(s): State<AppState>, body: Bytes) -> Response {
    review(&s, &body, false).await
}

async fn review(s: &AppState, body: &[u8], mutate: bool) -> Response {
    if !s.backend.capabilities().native_admission {
        return ApiError::not_found(format!(
            "the {} backend admits no workloads of its own",
            s.backend.name()
        ))
        .into_response();
    }
    // Only a pod that is Tessera's workload is changed; any other passes as it is.
    let (refusal, ours) = match s.backend.review_native(body).await {
        Err(BackendError::Rejected(why)) => return ApiError::bad_request(why).into_response(),
        Err(BackendError::Unreachable(why)) => (
            Some(format!("Tessera cannot check this pod now ({why}); try again")),
            false,
        ),
        Ok(NativeReview::Pass) => (None, false),
        Ok(NativeReview::Refuse(why)) => (Some(why), false),
        Ok(NativeReview::Ask(ask)) => (check(s, &ask).await.err(), true),
    };
    s.obs.metrics.admission(refusal.is_none());
    match s.backend.answer_native(body, mutate && ours, refusal.as_deref()) {
        Ok(json) => (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Err(e) => ApiError::bad_request(e.to_string()).into_response(),
    }
}

/// Starts the intake of native workloads the backend reports (see the module doc).
pub fn spawn_intake(s: AppState, mut submitted: mpsc::UnboundedReceiver<(NativeRef, NativeAsk)>) {
    tokio::spawn(async move {
        // Submissions a replica that does not lead could not take: tried again until one does.
        let mut later: Vec<(NativeRef, NativeAsk)> = Vec::new();
        let mut retry = tokio::time::interval(Duration::from_secs(2));
        retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let batch = tokio::select! {
                got = submitted.recv() => match got {
                    Some(one) => vec![one],
                    None => return,
                },
                _ = retry.tick(), if !later.is_empty() => std::mem::take(&mut later),
            };
            for (native, ask) in batch {
                if let Some(again) = intake(&s, native, ask).await {
                    later.push(again);
                }
            }
        }
    });
}

/// Takes one submission in; gives it back when it should be tried again later.
async fn intake(s: &AppState, native: NativeRef, ask: NativeAsk) -> Option<(NativeRef, NativeAsk)> {
    let (body, c) = match check(s, &ask).await {
        Ok(x) => x,
        Err(why) => {
            tracing::info!(namespace = %native.namespace, pod = %native.name, "a native workload is refused: {why}");
            s.backend.tell_native(&native, true, &why);
            return None;
        }
    };
    let spec = WorkloadSpec {
        tenant: body.tenant,
        project: body.project,
        name: body.name,
        kind: match body.kind {
            WorkloadKind::Batch => Kind::Batch,
            WorkloadKind::Service => Kind::Service,
            WorkloadKind::Interactive => Kind::Interactive,
        },
        shape: c.shape,
        cpu_milli: c.cpu,
        memory_mib: c.mem,
        duration_s: None,
        command: None,
        image: c.image,
        env: Default::default(),
        priority: c.priority,
        no_wait: false,
        no_requeue: true,
        movable: None,
        native: Some(native.to_record()),
    };
    let nw = NewWorkload {
        spec,
        request: c.request,
        actor: ACTOR.into(),
        role: TokenRole::Member.as_str().into(),
        // Once per object: its UID (the same object reported again after a restart is the
        // workload already created); a gang's, once per set of pods (the Job makes new ones
        // for a gang that failed, which are a new workload).
        idempotency: Some((
            match native.members.first() {
                Some((_, first)) => format!("native-{}-{first}", native.uid),
                None => format!("native-{}", native.uid),
            },
            native.to_record(),
        )),
        received_at: crate::clock::now_ms(),
        audit: None,
    };
    match s.lifecycle.create(nw).await {
        Ok((w, _)) => {
            if let Err(e) = s.backend.adopt_native(w.id.0, &native).await {
                tracing::warn!(workload = w.id.0, namespace = %native.namespace, pod = %native.name, error = %e,
                    "cannot link a native workload to its pod");
            }
            None
        }
        Err(LifecycleError::Unavailable(_)) => Some((native, ask)),
        Err(e) => {
            let why = crate::http::workloads::lifecycle_error(e).detail;
            s.backend.tell_native(&native, true, &why);
            None
        }
    }
}

/// Tells the owner of the native object `native` (as stored) why its workload waits or was
/// refused.
pub fn tell(backend: &dyn Backend, native: &str, refused: bool, reason: &str) {
    if let Some(n) = NativeRef::from_record(native) {
        backend.tell_native(&n, refused, reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ask_is_the_api_request_a_tenant_would_make() {
        let ask = NativeAsk {
            tenant: "acme".into(),
            project: "ml".into(),
            name: "train".into(),
            gpus: NativeGpus::Fraction(250),
            model: Some("l40s".into()),
            pool: Some("dev".into()),
            cpu_milli: Some(500),
            memory_mib: None,
            priority: Some("high".into()),
            images: vec!["a".into(), "b".into()],
            batch: true,
            gang: None,
        };
        let b = request(&ask);
        assert_eq!(
            (b.tenant.as_str(), b.project.as_str(), b.name.as_str()),
            ("acme", "ml", "train")
        );
        assert_eq!(b.shape.fraction, Some(250));
        assert_eq!(b.shape.models, vec!["l40s".to_string()]);
        assert_eq!(b.shape.pool.as_deref(), Some("dev"));
        assert_eq!(b.kind, WorkloadKind::Batch);
        assert_eq!(b.image.as_deref(), Some("a"));
        assert_eq!(b.priority.as_deref(), Some("high"));
        assert!(b.no_requeue);
    }

    #[test]
    fn a_gang_jobs_ask_is_its_pods_gpus_as_node_shares() {
        let ask = NativeAsk {
            tenant: "acme".into(),
            project: "ml".into(),
            name: "train".into(),
            gpus: NativeGpus::Whole(8),
            model: None,
            pool: Some("training".into()),
            cpu_milli: None,
            memory_mib: None,
            priority: None,
            images: vec!["a".into()],
            batch: true,
            gang: Some(tessera_backend::NativeGang {
                pods: 4,
                topology: Some("rack".into()),
                preferred: true,
            }),
        };
        let b = request(&ask);
        assert_eq!(b.shape.gpus, Some(32));
        assert_eq!(b.shape.nodes, Some(4));
        assert_eq!(b.shape.gpus_per_node, Some(8));
        assert_eq!(b.shape.topology.as_deref(), Some("rack"));
        assert_eq!(b.shape.topology_mode, Some(tessera_api::TopologyMode::Preferred));
    }
}
