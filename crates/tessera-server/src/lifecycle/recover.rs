//! Rebuilding the loop's state from the store — at start-up, at failover, and after a failed
//! commit — and reconciling it with what the backend runs.
//!
//! Every workload that has not ended is read back: waiting ones return to the queue, those
//! holding capacity get their allocation re-applied to a fresh engine (double booking is
//! refused, and a workload whose stored request or placement no longer fits the fleet fails
//! with the reason). The backend is then asked about every workload that may run there, and
//! each workload's lifecycle decides what its answer means: a placed workload's partition is
//! requested again (idempotent: the partition was recorded before start, so a partition that
//! exists is not made twice), a partitioned one is started if the backend does not know it, a
//! running one the backend lost fails, a stopping one is stopped again.
//!
//! A rebuild ([`Rebuild`]) borrows every controller's state from the loop: it resets and
//! refills each (admission's ids, the publication's builder, drains, moves, MIG modes, health
//! and node states, the backend work in flight).

use std::collections::HashMap;
use std::sync::Arc;

use tessera_domain::{Input, Observed, Phase, WorkloadId};
use tessera_store::{Fence, NodeState, Store, StoreError};

use super::admission::Admission;
use super::batch::Batch;
use super::commit::Publication;
use super::consolidation::Moves;
use super::effects::Runner;
use super::health::Health;
use super::live::{Live, now_ms};
use super::migmode::{MigCtx, MigModes};
use super::nodeops::{Drain, Drains};
use super::ops::FleetOps;
use super::placement;
use super::snapshot::Published;
use super::world::World;
use tessera_model::GpuUnits;
use tessera_sched::cycle::Quota;

/// Every controller's state a rebuild resets and refills, borrowed from the loop.
pub(super) struct Rebuild<'a> {
    pub w: &'a mut World,
    pub store: &'a Arc<dyn Store>,
    pub ops: &'a mut Arc<FleetOps>,
    pub published: &'a Published,
    pub admission: &'a mut Admission,
    pub publication: &'a mut Publication,
    pub health: &'a Health,
    pub mig: &'a mut MigModes,
    pub drains: &'a mut Drains,
    pub moves: &'a mut Moves,
    pub runner: &'a mut Runner,
    pub fence: Option<&'a Fence>,
}

impl Rebuild<'_> {
    pub(super) async fn run(&mut self) -> Result<(), StoreError> {
        let started = std::time::Instant::now();
        let ms = |t: std::time::Instant| t.elapsed().as_millis() as u64;
        self.w.sched = self.w.fresh_scheduler();
        // Consolidation moves in progress come back from the store with the fleet operations.
        *self.moves = Default::default();
        self.restore_ops().await?;
        let ops_ms = ms(started);
        self.w.live.clear();
        self.runner.clear();
        self.published.clear_workloads();
        self.publication.reset(None);
        self.admission.reset();
        for q in self.store.quotas().await? {
            let quota = Quota {
                guaranteed: GpuUnits(q.guaranteed_milli),
                limit: q.limit_milli.map(GpuUnits),
            };
            self.w.sched.set_quota(&q.tenant, &q.class, Some(quota));
        }
        for (t, b) in self.store.budgets().await? {
            self.w.sched.set_budget(&t, Some(b));
        }
        let now = now_ms();
        // The month's usage is read beside the workloads (on another thread when the runtime
        // has one): both are long reads of a large store.
        let t = std::time::Instant::now();
        let (mut month, store) = (std::mem::take(&mut self.w.month), self.store.clone());
        let month_read = tokio::spawn(async move { month.refresh(&*store, now).await.map(|()| month) });
        let active = self.store.active_workloads().await?;
        let read_ms = ms(t);
        self.w.month = month_read
            .await
            .map_err(|e| StoreError::Unavailable(format!("reading this month's usage: {e}")))??;
        let month_ms = ms(t);
        let t = std::time::Instant::now();
        // Ask the backend first: a whole-GPU backend's MIG layouts must be known before the
        // allocations are restored into them.
        let expected: Vec<_> = active
            .iter()
            .filter(|w| matches!(w.phase, Phase::Partitioned | Phase::Running | Phase::Stopping))
            .filter(|w| w.placement.is_some())
            .map(|w| placement::run_spec(&self.w.fleet, &self.w.nodes, w, &self.w.caps))
            .collect();
        let mut observed: HashMap<WorkloadId, Observed> = HashMap::new();
        match self.w.backend.reconcile(&expected).await {
            Ok(report) => {
                for (id, o) in report.workloads {
                    observed.insert(WorkloadId(id), self.w.observed(o, "after a control-plane restart"));
                }
                self.mig.adopt_layouts(
                    &mut MigCtx::of(self.w, self.ops, self.published),
                    &report.layouts,
                    now_ms(),
                );
                // Logged and counted here; the first periodic reconcile audits them.
                self.w.metrics.orphans(report.orphans.len());
                for o in &report.orphans {
                    tracing::warn!(node = %o.node, id = ?o.id, detail = %o.detail, "the backend runs work Tessera does not know (orphan)");
                }
            }
            Err(e) => {
                // Treat everything as still starting: the periodic reconcile asks again.
                tracing::warn!(error = %e, "the backend cannot be reconciled now; will retry");
            }
        }
        let reconcile_ms = ms(t);
        let t = std::time::Instant::now();
        let mut invalid = Vec::new();
        for w in active {
            let id = w.id;
            let tenant = self.w.tenant_id(&w.spec.tenant);
            let (request, gang) = match placement::resolve(&self.w.fleet, &w.spec, tenant) {
                Ok(r) => r,
                Err(e) => {
                    invalid.push((id, format!("{}: {}", e.field, e.message)));
                    self.w.live.insert(
                        id,
                        Live {
                            request: tessera_model::Request::new(tessera_model::Shape::CpuOnly),
                            gang: None,
                            class: "".into(),
                            w: w.into(),
                            util: (0.0, 0.0),
                        },
                    );
                    continue;
                }
            };
            let live = Live {
                class: self.w.class_of(&request).into(),
                request,
                gang,
                w: w.into(),
                util: (0.0, 0.0),
            };
            if live.w.phase.holds_capacity() {
                let restored = live.restore_into(&mut self.w.sched, &self.w.fleet, &self.w.nodes, tenant);
                if let Err(e) = restored {
                    tracing::error!(%id, error = %e, "cannot re-apply the allocation");
                    invalid.push((id, format!("its allocation could not be restored: {e}")));
                } else if live.w.phase == Phase::Stopping {
                    self.w.sched.stopping(id.0);
                }
            }
            self.w.live.insert(id, live);
        }
        // A service being moved by consolidation is on its way out: no new move or preemption
        // picks it again while its replacement starts.
        for old in self.moves.originals() {
            self.w.sched.stopping(old.0);
        }
        let restore_ms = ms(t);
        let t = std::time::Instant::now();
        let mut batch = Batch::default();
        for (id, detail) in &invalid {
            self.w.apply(
                *id,
                Input::Invalid {
                    at: now,
                    detail: detail.clone(),
                },
                &mut batch,
                now,
            );
        }
        let mut ids: Vec<WorkloadId> = self.w.live.keys().copied().collect();
        ids.sort_unstable();
        let grace_s = self.w.settings.grace.as_secs();
        for id in ids {
            let o = observed.remove(&id).unwrap_or(Observed::Starting);
            self.w.apply(
                id,
                Input::Recovered {
                    at: now,
                    observed: o,
                    grace_s,
                },
                &mut batch,
                now,
            );
        }
        let queued = self.w.sched.queued();
        let live = self.w.live.len();
        let apply_ms = ms(t);
        let t = std::time::Instant::now();
        self.commit_recovery(batch, now).await?;
        tracing::info!(
            live,
            queued,
            total_ms = ms(started),
            ops_ms,
            month_ms,
            read_ms,
            reconcile_ms,
            restore_ms,
            apply_ms,
            commit_ms = ms(t),
            "lifecycle state rebuilt from the store"
        );
        Ok(())
    }

    /// Stores what recovery decided (it must not recurse into another recovery on failure).
    async fn commit_recovery(&mut self, batch: Batch, now: i64) -> Result<(), StoreError> {
        if batch.queue_changed {
            self.publication.mark_dirty();
        }
        let mut parts = batch.into_parts();
        if let (Some(f), false) = (self.fence, parts.changes.is_empty()) {
            parts.changes.insert(0, tessera_store::Change::Fence(f.clone()));
        }
        self.store.commit(&parts.changes).await?;
        self.published.put_workloads(parts.records);
        self.published.put_workloads(self.w.live.values().map(|l| l.w.clone()));
        self.publication.publish_rebuilt(self.w, now);
        for (id, op) in parts.ops {
            self.runner.submit(id, op);
        }
        Ok(())
    }

    /// Re-applies stored health and node states to a fresh engine (start-up, after a failed
    /// commit).
    async fn restore_ops(&mut self) -> Result<(), tessera_store::StoreError> {
        let mut ops = FleetOps::default();
        *self.drains = Default::default();
        let drains: std::collections::HashMap<String, tessera_store::DrainRecord> = self
            .store
            .drains()
            .await?
            .into_iter()
            .map(|d| (d.node.clone(), d))
            .collect();
        for m in self.store.service_moves().await? {
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
        for r in self.store.rollouts().await? {
            ops.rollouts.insert(r.id, r);
        }
        let mig = self.store.gpu_mig_modes().await?;
        self.mig
            .restore(&mut MigCtx::of(self.w, self.ops, self.published), mig, &mut ops)
            .await;
        for r in self.store.unhealthy_gpus().await? {
            if let Some(n) = self.w.fleet.node_by_name(&r.node) {
                self.w.sched.engine.fence_gpu(n.0, r.gpu, true);
            }
            ops.unhealthy.insert((r.node.clone(), r.gpu), r);
        }
        let closed: Vec<String> = self.health.closed_nodes();
        for node in closed {
            if let Some(n) = self.w.fleet.node_by_name(&node) {
                self.w.sched.engine.fence_node(n.0, true);
            }
        }
        for r in self.store.node_states().await? {
            if let Some(n) = self.w.fleet.node_by_name(&r.node) {
                self.w.sched.engine.fence_node(n.0, true);
            }
            // A drain resumes with its stored deadline and policy (one stored before its policy
            // was: it waits, so nothing is cut off by a restart).
            if r.state == NodeState::Draining {
                let d = drains.get(&r.node);
                self.drains.nodes.insert(
                    r.node.clone(),
                    Drain {
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
        *self.ops = Arc::new(ops);
        self.published.set_ops(self.ops.clone());
        Ok(())
    }
}
