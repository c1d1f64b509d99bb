//! GPU health: a critical XID, a lost GPU or a failed partition takes the GPU out of placement
//! (the engine fences it, so the next scheduler cycle places nothing there), records it in the
//! store (so that a restart does not put work on it again), counts it in the metrics and tells
//! every workload on it (an `observed` event with the `gpu-unhealthy` code). What runs there
//! is then handled by [`GpuFailurePolicy`]. Only a platform admin clears a GPU
//! ([`Cmd::ClearGpu`](super::Cmd)); a backend reporting the GPU healthy again is logged, not
//! trusted.

use std::collections::BTreeMap;
use std::sync::Arc;

use tessera_domain::{Input, Kind, PreemptCode, ReasonCode, WorkloadId};
use tessera_store::{GpuHealthRecord, HealthCause, NodeState, NodeStateRecord, RolloutRecord};

use super::Core;
use super::batch::Batch;

/// The XIDs NVIDIA documents as needing a GPU reset or a reboot: 48 (double-bit ECC), 63/64
/// (ECC page retirement / row remapping), 74 (NVLink), 79 (fallen off the bus), 92 (high
/// single-bit ECC rate), 93 (non-fatal violation … reset), 94/95 (contained / uncontained ECC).
pub const CRITICAL_XIDS: [u32; 9] = [48, 63, 64, 74, 79, 92, 93, 94, 95];

/// Whether an XID takes a GPU out of service.
pub fn is_critical(xid: u32) -> bool {
    CRITICAL_XIDS.contains(&xid)
}

/// What happens to running work on a GPU that failed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GpuFailurePolicy {
    /// Leave it running and tell the tenant (the default).
    #[default]
    Leave,
    /// Stop batch work (requeued unless it asked not to be); services are left running and
    /// told.
    Requeue,
}

impl GpuFailurePolicy {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "leave" => Some(GpuFailurePolicy::Leave),
            "requeue" => Some(GpuFailurePolicy::Requeue),
            _ => None,
        }
    }
}

/// Unhealthy GPUs and operator node states, as readers see them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetOps {
    /// By `(node, gpu)`.
    pub unhealthy: BTreeMap<(String, u8), GpuHealthRecord>,
    /// Nodes that are not `ready`, by name.
    pub nodes: BTreeMap<String, NodeStateRecord>,
    /// Rolling upgrades, by id (every stored one).
    pub rollouts: BTreeMap<u64, RolloutRecord>,
    /// MIG modes an admin set, by `(node, gpu)`.
    pub mig: BTreeMap<(String, u8), tessera_store::GpuMigRecord>,
}

impl FleetOps {
    /// The operator state of a node: `ready` without a record.
    pub fn node_state(&self, node: &str) -> NodeState {
        self.nodes.get(node).map_or(NodeState::Ready, |r| r.state)
    }
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

impl Core {
    /// Takes a GPU out of service (once; a GPU already unhealthy stays as recorded) and applies
    /// the failure policy to the work on it. The store write follows in
    /// [`flush_health`](Self::flush_health).
    pub(super) fn gpu_failed(&mut self, node: &str, gpu: u8, cause: Cause, detail: &str, batch: &mut Batch, now: i64) {
        let Some(n) = self.w.fleet.node_by_name(node) else {
            tracing::warn!(%node, gpu, "health news about a node not in the fleet");
            return;
        };
        let def = self.w.fleet.node(n);
        if gpu >= def.gpus || self.w.ops.unhealthy.contains_key(&(node.to_string(), gpu)) {
            return;
        }
        let (pool, model) = (
            self.w.fleet.pool(def.pool).name.clone(),
            self.w.fleet.catalogue.get(def.model).name.clone(),
        );
        self.w.sched.engine.fence_gpu(n.0, gpu, true);
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
        let mut ops = (*self.w.ops).clone();
        ops.unhealthy.insert((node.to_string(), gpu), rec.clone());
        self.w.ops = Arc::new(ops);
        self.w.published.set_ops(self.w.ops.clone());
        self.health_writes.push(rec);
        self.w.metrics.gpu_failure(&pool, &model, cause.label());

        let affected: Vec<(WorkloadId, Kind, bool)> = self
            .w
            .live
            .values()
            .filter(|l| l.w.phase.holds_capacity() && l.w.placements().any(|p| p.node == node && p.gpus.contains(&gpu)))
            .map(|l| (l.w.id, l.w.spec.kind, l.w.phase == tessera_domain::Phase::Stopping))
            .collect();
        let grace_s = self.w.settings.grace.as_secs();
        for (id, kind, stopping) in affected {
            if stopping {
                continue;
            }
            let input = if self.w.settings.on_gpu_failure == GpuFailurePolicy::Requeue && kind == Kind::Batch {
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
            self.w.apply(id, input, batch, now);
        }
    }

    /// Writes the unhealthy GPUs recorded since the last call. A failed write is logged: the
    /// GPU stays out of placement in memory, and the next failure report writes it again.
    pub(super) async fn flush_health(&mut self) {
        for rec in std::mem::take(&mut self.health_writes) {
            if let Err(e) = self.w.store.set_gpu_unhealthy(&rec).await {
                tracing::error!(node = %rec.node, gpu = rec.gpu, error = %e, "cannot record an unhealthy GPU");
            }
        }
    }

    /// Puts a GPU back into placement (a platform admin cleared it): `false` if it was not
    /// unhealthy.
    pub(super) async fn clear_gpu(&mut self, node: &str, gpu: u8) -> Result<bool, tessera_store::StoreError> {
        let cleared = self.w.store.clear_gpu_health(node, gpu).await?;
        let known = self.w.ops.unhealthy.contains_key(&(node.to_string(), gpu));
        if known {
            let mut ops = (*self.w.ops).clone();
            ops.unhealthy.remove(&(node.to_string(), gpu));
            self.w.ops = Arc::new(ops);
            self.w.published.set_ops(self.w.ops.clone());
        }
        if let Some(n) = self.w.fleet.node_by_name(node) {
            self.w.sched.engine.fence_gpu(n.0, gpu, false);
        }
        tracing::info!(%node, gpu, "GPU cleared: back in placement");
        Ok(cleared || known)
    }

    /// A node the backend reported removed: its GPUs are lost, handled as GPU failures (out
    /// of placement, the failure policy applied to the work on them).
    pub(super) fn node_removed(&mut self, node: &str, batch: &mut Batch, now: i64) {
        let Some(n) = self.w.fleet.node_by_name(node) else {
            tracing::warn!(%node, "the backend removed a node the fleet does not have");
            return;
        };
        let detail = format!("node {node} was removed by the {} backend", self.w.backend.name());
        for g in 0..self.w.fleet.node(n).gpus {
            self.gpu_failed(node, g, Cause::Lost, &detail, batch, now);
        }
    }

    /// The backend reports a node closed to new work or open again (Kubernetes: a cordon or a
    /// taint by someone else, or the node NotReady). The engine fences it while either holds
    /// or Tessera's own node state (a drain, maintenance) does; work already there is left to
    /// the platform's own rules (a NotReady node's pods are lost when the platform says so).
    pub(super) fn backend_closed(&mut self, node: &str, cordoned: Option<bool>, not_ready: Option<bool>) {
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
        self.refence(node);
        tracing::info!(%node, closed, "the backend reports the node {}", if closed { "closed to new work" } else { "open to new work" });
    }

    /// Fences a node in the engine exactly when Tessera's node state or the backend's says it
    /// takes no new work.
    pub(super) fn refence(&mut self, node: &str) {
        let fenced = self.w.ops.nodes.contains_key(node) || self.closed.contains_key(node);
        if let Some(n) = self.w.fleet.node_by_name(node) {
            self.w.sched.engine.fence_node(n.0, fenced);
        }
    }

    /// A node the backend reported back: the GPUs it had lost return to placement; GPUs out
    /// for another cause (an XID, a failed partition) stay out until an admin clears them.
    pub(super) async fn node_back(&mut self, node: &str) {
        let lost: Vec<u8> = self
            .w
            .ops
            .unhealthy
            .iter()
            .filter(|((n, _), r)| n == node && r.cause == HealthCause::Lost)
            .map(|((_, g), _)| *g)
            .collect();
        for g in lost {
            if let Err(e) = self.clear_gpu(node, g).await {
                tracing::error!(%node, gpu = g, error = %e, "cannot clear a GPU of a node that came back");
            }
        }
    }

    /// Re-applies stored health and node states to a fresh engine (start-up, after a failed
    /// commit).
    pub(super) async fn restore_ops(&mut self) -> Result<(), tessera_store::StoreError> {
        let mut ops = FleetOps::default();
        self.drains = Default::default();
        let drains: std::collections::HashMap<String, tessera_store::DrainRecord> = self
            .w
            .store
            .drains()
            .await?
            .into_iter()
            .map(|d| (d.node.clone(), d))
            .collect();
        for m in self.w.store.service_moves().await? {
            match m.cause {
                tessera_store::MoveCause::Drain => {
                    self.drains.moves.insert(m.old, m.replacement);
                }
                // Continued by the consolidation step: the original stops once its
                // replacement runs (see `consolidation`).
                tessera_store::MoveCause::Consolidation => {
                    self.moves.restore(m.old, m.replacement, m.by);
                }
            }
        }
        for r in self.w.store.rollouts().await? {
            ops.rollouts.insert(r.id, r);
        }
        let mig = self.w.store.gpu_mig_modes().await?;
        self.restore_mig_modes(mig, &mut ops).await;
        for r in self.w.store.unhealthy_gpus().await? {
            if let Some(n) = self.w.fleet.node_by_name(&r.node) {
                self.w.sched.engine.fence_gpu(n.0, r.gpu, true);
            }
            ops.unhealthy.insert((r.node.clone(), r.gpu), r);
        }
        let closed: Vec<String> = self.closed.keys().cloned().collect();
        for node in closed {
            if let Some(n) = self.w.fleet.node_by_name(&node) {
                self.w.sched.engine.fence_node(n.0, true);
            }
        }
        for r in self.w.store.node_states().await? {
            if let Some(n) = self.w.fleet.node_by_name(&r.node) {
                self.w.sched.engine.fence_node(n.0, true);
            }
            // A drain resumes with its stored deadline and policy (one stored before its policy
            // was: it waits, so nothing is cut off by a restart).
            if r.state == NodeState::Draining {
                let d = drains.get(&r.node);
                self.drains.nodes.insert(
                    r.node.clone(),
                    super::nodeops::Drain {
                        deadline_ms: d.and_then(|d| d.deadline_ms),
                        preempt: d.is_some_and(|d| d.preempt),
                        noticed: Default::default(),
                        rollout: ops
                            .rollouts
                            .values()
                            .find(|ro| {
                                ro.nodes
                                    .iter()
                                    .any(|n| n.node == r.node && n.state == tessera_store::RolloutNodeState::Draining)
                            })
                            .map(|ro| ro.id),
                    },
                );
            }
            ops.nodes.insert(r.node.clone(), r);
        }
        self.w.ops = Arc::new(ops);
        self.w.published.set_ops(self.w.ops.clone());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
