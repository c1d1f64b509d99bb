//! Backend news about workloads as lifecycle input: events the backend sends (stopped,
//! running, exited, lost, evicted, bound to devices, withdrawn by their owner, …) and the
//! results of the backend operations the loop started. The fleet-wide news (health, nodes,
//! MIG modes, telemetry, layouts, a new fleet) goes to the controllers it concerns.

use tessera_backend::{BackendEvent, Exit, GpuSample, Partitioning};
use tessera_domain::{Input, Phase, Workload, WorkloadId};

use super::batch::Batch;
use super::command::OpResult;
use super::health::{Cause, GpuFailure, Health, HealthCtx};
use super::world::World;

/// Backend news about one workload becomes its lifecycle input.
pub(super) fn on_event(w: &mut World, e: BackendEvent, batch: &mut Batch, now: i64) {
    match e {
        // The stop is over (backends that confirm stops): the devices are free now.
        BackendEvent::Stopped { id, at_ms } => {
            w.apply(WorkloadId(id), Input::Stopped { at: at_ms.max(0) }, batch, now);
        }
        BackendEvent::Notice { id, detail } => {
            if detail.contains("PodDisruptionBudget") {
                w.metrics.eviction_refused();
            }
            w.apply(
                WorkloadId(id),
                Input::Notice {
                    at: now,
                    code: tessera_domain::ReasonCode::NodeDrain,
                    detail,
                },
                batch,
                now,
            );
        }
        // Its owner deleted a native workload's pod: the workload is cancelled, if the pod
        // is exactly its object (namespace, name and UID).
        BackendEvent::Withdrawn { id, native } => {
            let ours = w
                .live
                .get(&WorkloadId(id))
                .is_some_and(|l| l.w.spec.native.as_deref() == Some(native.to_record().as_str()));
            if !ours {
                tracing::warn!(workload = id, namespace = %native.namespace, pod = %native.name,
                        "a withdrawal for a pod that is not the workload's object: ignored");
                return;
            }
            let grace_s = w.settings.grace.as_secs();
            w.apply(
                WorkloadId(id),
                Input::Cancel {
                    at: now,
                    by: format!(
                        "{} (pod {}/{} deleted)",
                        crate::native::ACTOR,
                        native.namespace,
                        native.name
                    ),
                    grace_s,
                },
                batch,
                now,
            );
        }
        BackendEvent::Stranger {
            namespace,
            name,
            detail,
        } => {
            w.metrics.stranger();
            batch.audit(tessera_store::AuditRecord {
                seq: 0,
                at: now,
                request_id: format!("backend-stranger-{namespace}-{name}"),
                actor: format!("{}-backend", w.backend.name()),
                tenant: None,
                action: "backend.stranger".into(),
                target: format!("namespaces/{namespace}/pods/{name}"),
                outcome: 403,
                detail,
            });
        }
        BackendEvent::Started { id, bound: Some(bound) } | BackendEvent::Bound { id, bound } => {
            let id = WorkloadId(id);
            if let Some(l) = w.live.get(&id)
                && let Some(p) = l.w.placement.clone()
            {
                match w.rebind(id, &p, &bound) {
                    Ok(moved) => {
                        for (m, placement) in moved {
                            w.apply(m, Input::Bound { placement }, batch, now);
                        }
                    }
                    Err(why) => {
                        tracing::error!(%id, error = %why, "the backend bound devices the engine cannot account for");
                    }
                }
            }
        }
        // Exact backends' devices are the engine's own.
        BackendEvent::Started { bound: None, .. } => {}
        BackendEvent::Running { id, at_ms, sample } => {
            let id = WorkloadId(id);
            let Some(l) = w.live.get(&id) else { return };
            let observed = observe(&sample, &l.w);
            let created = l.w.created_at;
            let pool = l.w.placement.as_ref().map(|p| p.pool.clone()).unwrap_or_default();
            let input = Input::Running {
                at: at_ms,
                detail: format!("started by the {} backend", w.backend.name()),
                observed,
            };
            if l.w.phase == Phase::Partitioned {
                w.metrics.running(&pool, at_ms - created);
            }
            w.apply(id, input, batch, now);
        }
        BackendEvent::Exited { id, at_ms, exit } => {
            let (success, detail) = match exit {
                Exit::Succeeded => (true, String::new()),
                Exit::Failed { exit_code, detail } => (
                    false,
                    match exit_code {
                        // The backend's detail may already say just that (local does).
                        Some(c) => {
                            let head = format!("exited with code {c}");
                            if detail.is_empty() || detail == head {
                                head
                            } else {
                                format!("{head}: {detail}")
                            }
                        }
                        None => detail,
                    },
                ),
            };
            w.apply(
                WorkloadId(id),
                Input::Exited {
                    at: at_ms,
                    success,
                    detail,
                },
                batch,
                now,
            );
        }
        BackendEvent::Lost { id, at_ms, detail } => {
            w.apply(WorkloadId(id), Input::Lost { at: at_ms, detail }, batch, now);
        }
        // Evicted by a drain outside Tessera (`kubectl drain`): stopped as Tessera's own
        // drain stops work past its deadline, so batch work is requeued (by its policy)
        // and its capacity is released once the backend confirms the stop.
        BackendEvent::Evicted { id, at_ms, detail } => {
            let grace_s = w.settings.grace.as_secs();
            w.apply(
                WorkloadId(id),
                Input::Preempt {
                    at: at_ms.max(0),
                    by: WorkloadId(id),
                    code: tessera_domain::PreemptCode::Drain,
                    detail,
                    grace_s,
                },
                batch,
                now,
            );
        }
        // Fleet-wide news: handed to the controllers it concerns by the loop (`Core::on_backend`).
        BackendEvent::GpuHealth { .. }
        | BackendEvent::NodeChanged { .. }
        | BackendEvent::MigMode { .. }
        | BackendEvent::FleetChanged { .. }
        | BackendEvent::Telemetry { .. }
        | BackendEvent::PartitionChanged { .. } => {}
        // Taken in by the intake before the loop (see `forward_backend_events`).
        BackendEvent::Submitted { .. } => {}
    }
}

/// A backend operation finished.
/// Returns what to set the reconciler's "reconcile soon" to, where the result says.
pub(super) fn on_done(
    h: &mut HealthCtx<'_>,
    health: &mut Health,
    id: WorkloadId,
    r: OpResult,
    batch: &mut Batch,
    now: i64,
) -> Option<bool> {
    let mut reconcile_soon = None;
    let input = match r {
        OpResult::Partitioned(Ok(rep)) => Input::Partitioned {
            at: now,
            detail: rep.detail,
        },
        OpResult::Partitioned(Err(e)) => {
            // A whole-GPU layout that failed leaves the engine's configured layout wrong:
            // learn the real one from the backend.
            reconcile_soon = Some(h.w.caps.partitioning == Partitioning::WholeGpu);
            // The GPU that could not be partitioned takes no more work until cleared.
            if let Some(p) = h.w.live.get(&id).and_then(|l| l.w.placement.clone()) {
                let detail = format!("partitioning failed: {e}");
                for g in p.gpus {
                    let failure = GpuFailure {
                        node: &p.node,
                        gpu: g,
                        cause: Cause::Partition,
                        detail: &detail,
                    };
                    health.gpu_failed(h, failure, batch, now);
                }
            }
            Input::PartitionFailed {
                at: now,
                detail: format!("partitioning failed: {e}"),
            }
        }
        OpResult::Started(Ok(())) => return reconcile_soon,
        OpResult::Started(Err(e)) => Input::StartFailed {
            at: now,
            detail: format!("start failed: {e}"),
        },
        // A backend that confirms stops says when the workload is gone
        // (`BackendEvent::Stopped`): until then it keeps its capacity, and a stop that
        // failed is tried again by the next reconcile (a stopping workload still running
        // there is stopped again).
        OpResult::Stopped(r) if h.w.caps.confirms_stop => {
            if let Err(e) = r {
                tracing::warn!(%id, error = %e, "stop failed; the workload keeps its capacity and the next reconcile stops it again");
                return Some(true);
            }
            return None;
        }
        OpResult::Stopped(r) => {
            if let Err(e) = r {
                tracing::warn!(%id, error = %e, "stop failed; treating the workload as stopped");
            }
            Input::Stopped { at: now }
        }
        OpResult::Unpartitioned(r) => {
            if let Err(e) = r {
                tracing::warn!(%id, error = %e, "unpartition failed");
            }
            return None;
        }
    };
    h.w.apply(id, input, batch, now);
    reconcile_soon
}

/// The `observed` step of a multi-node gang: its GPUs the sample covers (those the backend
/// says it holds, else those of its node-shares), their mean utilisation and the framebuffer
/// they use together — one line for every node-share, not the first GPU alone.
fn observe_gang(samples: &[GpuSample], w: &Workload) -> String {
    let gpus: usize = w.placements().map(|p| p.gpus.len()).sum();
    let nodes = w.placements().count();
    let attributed: Vec<&GpuSample> = samples
        .iter()
        .filter(|s| s.instances.iter().any(|i| i.workload == w.id.0))
        .collect();
    let held = if attributed.is_empty() {
        samples
            .iter()
            .filter(|s| w.placements().any(|p| p.node == s.node && p.gpus.contains(&s.gpu)))
            .collect()
    } else {
        attributed
    };
    if held.is_empty() {
        return format!("a gang of {gpus} GPUs on {nodes} nodes: no GPU telemetry for it yet");
    }
    let mean = held.iter().map(|s| s.util_pct).sum::<f64>() / held.len() as f64;
    let fb: u64 = held.iter().map(|s| s.fb_used_mib).sum();
    format!(
        "{} of the gang's {gpus} GPUs on {nodes} nodes reported: {mean:.0} % utilisation on average, {fb} MiB framebuffer used in all",
        held.len()
    )
}

/// The `observed` step of a workload that just started, from the backend's first sample.
fn observe(samples: &[GpuSample], w: &Workload) -> String {
    let Some(p) = &w.placement else {
        return "no placement".into();
    };
    if !w.shares.is_empty() {
        return observe_gang(samples, w);
    }
    // The GPU the backend says the workload is on (a device plugin may have picked another
    // than the engine's), else the first of its placement.
    let attributed = samples
        .iter()
        .find(|s| s.node == p.node && s.instances.iter().any(|i| i.workload == w.id.0));
    let Some(s) = attributed.or_else(|| samples.iter().find(|s| s.node == p.node && p.gpus.contains(&s.gpu))) else {
        return format!("host resources on {}: no GPU telemetry for this workload", p.node);
    };
    match s.instances.iter().find(|i| i.workload == w.id.0) {
        Some(i) => format!(
            "{} GPU {}: engine {:.0} % active, {} MiB framebuffer used{}",
            s.node,
            s.gpu,
            i.gr_engine_active * 100.0,
            i.fb_used_mib,
            if i.profile.is_empty() {
                String::new()
            } else {
                format!(" in MIG instance {}", i.profile)
            }
        ),
        None => format!(
            "{} GPU {}: {:.0} % utilisation, {} MiB framebuffer used, {:.0} °C",
            s.node, s.gpu, s.util_pct, s.fb_used_mib, s.temp_c
        ),
    }
}
