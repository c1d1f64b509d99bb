//! GPU health: a critical XID, a lost GPU or a failed partition takes the GPU out of placement
//! (the engine fences it, so the next scheduler cycle places nothing there), records it in the
//! store (so that a restart does not put work on it again), counts it in the metrics and tells
//! every workload on it (an `observed` event with the `gpu-unhealthy` code). What runs there
//! is then handled by [`GpuFailurePolicy`](super::config::GpuFailurePolicy). Only a platform admin clears a GPU
//! ([`Cmd::ClearGpu`](super::command::Cmd)); a backend reporting the GPU healthy again is logged, not
//! trusted.
//!
//! The controller ([`Health`]) owns the unhealthy GPUs not yet written and the nodes the backend
//! reports closed; the unhealthy GPUs themselves are in the world's operator state, which
//! readers see.

use std::collections::HashMap;
use std::sync::Arc;

use tessera_domain::{Input, Kind, PreemptCode, ReasonCode, WorkloadId};
use tessera_store::{AuditRecord, GpuHealthRecord, HealthCause, Store};

use super::batch::{Batch, ReplyTo};
use super::command::{LifecycleError, Reply};
use super::config::GpuFailurePolicy;
use super::ops::FleetOps;
use super::snapshot::Published;
use super::world::World;

/// The XIDs NVIDIA documents as needing a GPU reset or a reboot: 48 (double-bit ECC), 63/64
/// (ECC page retirement / row remapping), 74 (NVLink), 79 (fallen off the bus), 92 (high
/// single-bit ECC rate), 93 (non-fatal violation … reset), 94/95 (contained / uncontained ECC).
pub const CRITICAL_XIDS: [u32; 9] = [48, 63, 64, 74, 79, 92, 93, 94, 95];

/// Whether an XID takes a GPU out of service.
pub fn is_critical(xid: u32) -> bool {
    CRITICAL_XIDS.contains(&xid)
}

/// Why a GPU failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Cause {
    Xid(u32),
    Lost,
    Partition,
}

impl Cause {
    fn stored(self) -> HealthCause {
        match self {
            Cause::Xid(_) => HealthCause::Xid,
            Cause::Lost => HealthCause::Lost,
            Cause::Partition => HealthCause::Partition,
        }
    }

    fn label(self) -> &'static str {
        self.stored().as_str()
    }
}

/// The backend's news about one GPU's health ([`tessera_backend::BackendEvent::GpuHealth`]).
pub(super) struct GpuNews<'a> {
    pub node: &'a str,
    pub gpu: u8,
    pub healthy: bool,
    /// The XID reported, if any (only critical ones take the GPU out).
    pub xid: Option<u32>,
    pub detail: &'a str,
}

/// A GPU that failed, and why.
pub(super) struct GpuFailure<'a> {
    pub node: &'a str,
    pub gpu: u8,
    pub cause: Cause,
    pub detail: &'a str,
}

/// The health controller: takes failed GPUs out of placement and applies the failure policy,
/// follows nodes the backend removes, brings back or closes, and writes unhealthy GPUs to the
/// store. It owns the writes not yet made and the nodes the backend reports closed; the
/// unhealthy GPUs themselves are the world's (`World::ops`), which readers see.
#[derive(Default)]
pub(super) struct Health {
    /// Unhealthy GPUs not yet written to the store.
    writes: Vec<GpuHealthRecord>,
    /// Nodes the backend reports closed to new work, by name: (cordoned or tainted, not
    /// ready). Fenced in the engine whatever Tessera's own node state says.
    closed: HashMap<String, (bool, bool)>,
}

/// What the health controller is handed: the world, the store (a cleared GPU's record), and
/// the fleet-operations state it keeps the unhealthy GPUs in, with the readers' view of it.
pub(super) struct HealthCtx<'a> {
    pub w: &'a mut World,
    pub store: &'a dyn Store,
    pub ops: &'a mut Arc<FleetOps>,
    pub published: &'a Published,
}

impl Health {
    /// The backend's news about a GPU's health: a critical XID or a lost GPU takes it out; a
    /// GPU reported healthy again stays out until a platform admin clears it.
    pub(super) fn on_gpu_health(&mut self, cx: &mut HealthCtx<'_>, news: GpuNews<'_>, batch: &mut Batch, now: i64) {
        let GpuNews {
            node,
            gpu,
            healthy,
            xid,
            detail,
        } = news;
        if healthy {
            if cx.ops.unhealthy.contains_key(&(node.to_string(), gpu)) {
                tracing::info!(%node, gpu, "the backend reports the GPU healthy again; it stays out of placement until a platform admin clears it");
            }
            return;
        }
        let cause = match xid {
            Some(x) if is_critical(x) => Cause::Xid(x),
            Some(x) => {
                tracing::warn!(%node, gpu, xid = x, %detail, "GPU reported a non-critical XID");
                return;
            }
            None => Cause::Lost,
        };
        let failure = GpuFailure {
            node,
            gpu,
            cause,
            detail,
        };
        self.gpu_failed(cx, failure, batch, now);
    }

    /// The backend's news about a node: removed (its GPUs are lost), back, cordoned or not
    /// ready by someone else.
    pub(super) async fn on_node_changed(
        &mut self,
        cx: &mut HealthCtx<'_>,
        node: &str,
        change: tessera_backend::NodeChange,
        batch: &mut Batch,
        now: i64,
    ) {
        tracing::info!(%node, ?change, "node changed");
        match change {
            tessera_backend::NodeChange::Removed => self.node_removed(cx, node, batch, now),
            tessera_backend::NodeChange::Added => self.node_back(cx, node).await,
            tessera_backend::NodeChange::Cordoned(on) => self.backend_closed(cx, node, Some(on), None),
            tessera_backend::NodeChange::Ready(ready) => self.backend_closed(cx, node, None, Some(!ready)),
            // The new capacity comes with the fleet the backend reports (`FleetChanged`).
            tessera_backend::NodeChange::Capacity => {}
        }
    }

    /// A critical XID seen in telemetry takes the GPU out within one interval, also where the
    /// backend sent no health event.
    pub(super) fn on_telemetry(
        &mut self,
        cx: &mut HealthCtx<'_>,
        gpus: &[tessera_backend::GpuSample],
        batch: &mut Batch,
        now: i64,
    ) {
        for g in gpus.iter().filter(|g| is_critical(g.xid)) {
            if !cx.ops.unhealthy.contains_key(&(g.node.clone(), g.gpu)) {
                let detail = format!("XID {} in telemetry", g.xid);
                let failure = GpuFailure {
                    node: &g.node,
                    gpu: g.gpu,
                    cause: Cause::Xid(g.xid),
                    detail: &detail,
                };
                self.gpu_failed(cx, failure, batch, now);
            }
        }
    }

    /// A platform admin's clear of a GPU: audited and answered with the batch.
    pub(super) async fn on_clear(
        &self,
        cx: &mut HealthCtx<'_>,
        node: &str,
        gpu: u8,
        mut audit: AuditRecord,
        reply: Reply<()>,
        batch: &mut Batch,
    ) {
        match self.clear_gpu(cx, node, gpu).await {
            Ok(cleared) => {
                audit.detail = if cleared {
                    format!("GPU {gpu} of {node} back in placement")
                } else {
                    format!("GPU {gpu} of {node} was not unhealthy")
                };
                batch.audit(audit);
                batch.full_publish = true;
                batch.reply(ReplyTo::Done(reply));
            }
            Err(e) => {
                let _ = reply.send(Err(LifecycleError::Unavailable(format!(
                    "the store is unavailable: {e}"
                ))));
            }
        }
    }

    /// Unhealthy GPUs wait to be written to the store.
    pub(super) fn has_writes(&self) -> bool {
        !self.writes.is_empty()
    }

    /// The nodes the backend reports closed to new work (a rebuild fences them again).
    pub(super) fn closed_nodes(&self) -> Vec<String> {
        self.closed.keys().cloned().collect()
    }

    /// Takes a GPU out of service (once; a GPU already unhealthy stays as recorded) and applies
    /// the failure policy to the work on it. The store write follows in
    /// [`flush_health`](Self::flush_health).
    pub(super) fn gpu_failed(&mut self, cx: &mut HealthCtx<'_>, failure: GpuFailure<'_>, batch: &mut Batch, now: i64) {
        let GpuFailure {
            node,
            gpu,
            cause,
            detail,
        } = failure;
        let Some(n) = cx.w.fleet.node_by_name(node) else {
            tracing::warn!(%node, gpu, "health news about a node not in the fleet");
            return;
        };
        let def = cx.w.fleet.node(n);
        if gpu >= def.gpus || cx.ops.unhealthy.contains_key(&(node.to_string(), gpu)) {
            return;
        }
        let (pool, model) = (
            cx.w.fleet.pool(def.pool).name.clone(),
            cx.w.fleet.catalogue.get(def.model).name.clone(),
        );
        cx.w.sched.engine.fence_gpu(n.0, gpu, true);
        let sentence = format!("GPU {gpu} of {node} is unhealthy ({detail}); no new work is placed on it");
        tracing::warn!(%node, gpu, cause = cause.label(), %detail, "GPU unhealthy: out of placement");
        let rec = GpuHealthRecord {
            node: node.to_string(),
            gpu,
            since: now,
            xid: match cause {
                Cause::Xid(x) => Some(x),
                _ => None,
            },
            detail: detail.to_string(),
            cause: cause.stored(),
        };
        let mut ops = (**cx.ops).clone();
        ops.unhealthy.insert((node.to_string(), gpu), rec.clone());
        *cx.ops = Arc::new(ops);
        cx.published.set_ops(cx.ops.clone());
        self.writes.push(rec);
        cx.w.metrics.gpu_failure(&pool, &model, cause.label());

        let affected: Vec<(WorkloadId, Kind, bool)> = cx
            .w
            .live
            .values()
            .filter(|l| l.w.phase.holds_capacity() && l.w.placements().any(|p| p.node == node && p.gpus.contains(&gpu)))
            .map(|l| (l.w.id, l.w.spec.kind, l.w.phase == tessera_domain::Phase::Stopping))
            .collect();
        let grace_s = cx.w.settings.grace.as_secs();
        for (id, kind, stopping) in affected {
            if stopping {
                continue;
            }
            let input = if cx.w.settings.on_gpu_failure == GpuFailurePolicy::Requeue && kind == Kind::Batch {
                Input::Preempt {
                    at: now,
                    by: id,
                    code: PreemptCode::Health,
                    detail: format!("GPU {gpu} of {node} failed ({detail}); batch work is stopped by policy"),
                    grace_s,
                }
            } else {
                Input::Notice {
                    at: now,
                    code: ReasonCode::GpuUnhealthy,
                    detail: format!("{sentence}; this workload keeps running on it"),
                }
            };
            cx.w.apply(id, input, batch, now);
        }
    }

    /// Writes the unhealthy GPUs recorded since the last call. A failed write is logged: the
    /// GPU stays out of placement in memory, and the next failure report writes it again.
    pub(super) async fn flush(&mut self, store: &dyn Store) {
        for rec in std::mem::take(&mut self.writes) {
            if let Err(e) = store.set_gpu_unhealthy(&rec).await {
                tracing::error!(node = %rec.node, gpu = rec.gpu, error = %e, "cannot record an unhealthy GPU");
            }
        }
    }

    /// Puts a GPU back into placement (a platform admin cleared it): `false` if it was not
    /// unhealthy.
    pub(super) async fn clear_gpu(
        &self,
        cx: &mut HealthCtx<'_>,
        node: &str,
        gpu: u8,
    ) -> Result<bool, tessera_store::StoreError> {
        let cleared = cx.store.clear_gpu_health(node, gpu).await?;
        let known = cx.ops.unhealthy.contains_key(&(node.to_string(), gpu));
        if known {
            let mut ops = (**cx.ops).clone();
            ops.unhealthy.remove(&(node.to_string(), gpu));
            *cx.ops = Arc::new(ops);
            cx.published.set_ops(cx.ops.clone());
        }
        if let Some(n) = cx.w.fleet.node_by_name(node) {
            cx.w.sched.engine.fence_gpu(n.0, gpu, false);
        }
        tracing::info!(%node, gpu, "GPU cleared: back in placement");
        Ok(cleared || known)
    }

    /// A node the backend reported removed: its GPUs are lost, handled as GPU failures (out
    /// of placement, the failure policy applied to the work on them).
    pub(super) fn node_removed(&mut self, cx: &mut HealthCtx<'_>, node: &str, batch: &mut Batch, now: i64) {
        let Some(n) = cx.w.fleet.node_by_name(node) else {
            tracing::warn!(%node, "the backend removed a node the fleet does not have");
            return;
        };
        let detail = format!("node {node} was removed by the {} backend", cx.w.backend.name());
        for g in 0..cx.w.fleet.node(n).gpus {
            let failure = GpuFailure {
                node,
                gpu: g,
                cause: Cause::Lost,
                detail: &detail,
            };
            self.gpu_failed(cx, failure, batch, now);
        }
    }

    /// The backend reports a node closed to new work or open again (Kubernetes: a cordon or a
    /// taint by someone else, or the node NotReady). The engine fences it while either holds
    /// or Tessera's own node state (a drain, maintenance) does; work already there is left to
    /// the platform's own rules (a NotReady node's pods are lost when the platform says so).
    pub(super) fn backend_closed(
        &mut self,
        cx: &mut HealthCtx<'_>,
        node: &str,
        cordoned: Option<bool>,
        not_ready: Option<bool>,
    ) {
        let e = self.closed.entry(node.to_string()).or_default();
        if let Some(c) = cordoned {
            e.0 = c;
        }
        if let Some(n) = not_ready {
            e.1 = n;
        }
        let closed = e.0 || e.1;
        if !closed {
            self.closed.remove(node);
        }
        self.refence(cx.w, cx.ops, node);
        tracing::info!(%node, closed, "the backend reports the node {}", if closed { "closed to new work" } else { "open to new work" });
    }

    /// Fences a node in the engine exactly when Tessera's node state or the backend's says it
    /// takes no new work.
    pub(super) fn refence(&self, w: &mut World, ops: &FleetOps, node: &str) {
        let fenced = ops.nodes.contains_key(node) || self.closed.contains_key(node);
        if let Some(n) = w.fleet.node_by_name(node) {
            w.sched.engine.fence_node(n.0, fenced);
        }
    }

    /// A node the backend reported back: the GPUs it had lost return to placement; GPUs out
    /// for another cause (an XID, a failed partition) stay out until an admin clears them.
    pub(super) async fn node_back(&self, cx: &mut HealthCtx<'_>, node: &str) {
        let lost: Vec<u8> = cx
            .ops
            .unhealthy
            .iter()
            .filter(|((n, _), r)| n == node && r.cause == HealthCause::Lost)
            .map(|((_, g), _)| *g)
            .collect();
        for g in lost {
            if let Err(e) = self.clear_gpu(cx, node, g).await {
                tracing::error!(%node, gpu = g, error = %e, "cannot clear a GPU of a node that came back");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::ops::FleetOps;
    use tessera_store::NodeState;

    #[test]
    fn critical_xids_are_the_documented_reset_or_reboot_classes() {
        for x in [48, 63, 64, 74, 79, 92, 93, 94, 95] {
            assert!(is_critical(x), "{x}");
        }
        // Application errors (13: graphics engine exception, 31: MMU fault, 43: stopped
        // processing) do not take a GPU out.
        for x in [0, 13, 31, 43, 45] {
            assert!(!is_critical(x), "{x}");
        }
    }

    #[test]
    fn policies_parse() {
        assert_eq!(GpuFailurePolicy::parse("leave"), Some(GpuFailurePolicy::Leave));
        assert_eq!(GpuFailurePolicy::parse("requeue"), Some(GpuFailurePolicy::Requeue));
        assert_eq!(GpuFailurePolicy::parse("drop"), None);
        assert_eq!(FleetOps::default().node_state("a100-00"), NodeState::Ready);
    }
}
