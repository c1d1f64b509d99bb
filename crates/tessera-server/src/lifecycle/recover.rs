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

use std::collections::HashMap;

use tessera_domain::{Input, Observed, Phase, WorkloadId};
use tessera_store::StoreError;

use super::Core;
use super::batch::Batch;
use super::live::{Live, now_ms};
use super::placement;
use tessera_model::GpuUnits;
use tessera_sched::cycle::Quota;

impl Core {
    pub(super) async fn recover(&mut self) -> Result<(), StoreError> {
        let started = std::time::Instant::now();
        let ms = |t: std::time::Instant| t.elapsed().as_millis() as u64;
        self.w.sched = self.w.fresh_scheduler();
        // Consolidation moves in progress come back from the store with the fleet operations.
        self.moves = Default::default();
        self.restore_ops().await?;
        let ops_ms = ms(started);
        self.w.live.clear();
        self.runner.clear();
        self.w.published.clear_workloads();
        self.builder.reset();
        self.ids = 0..0;
        for q in self.w.store.quotas().await? {
            let quota = Quota {
                guaranteed: GpuUnits(q.guaranteed_milli),
                limit: q.limit_milli.map(GpuUnits),
            };
            self.w.sched.set_quota(&q.tenant, &q.class, Some(quota));
        }
        for (t, b) in self.w.store.budgets().await? {
            self.w.sched.set_budget(&t, Some(b));
        }
        let now = now_ms();
        // The month's usage is read beside the workloads (on another thread when the runtime
        // has one): both are long reads of a large store.
        let t = std::time::Instant::now();
        let (mut month, store) = (std::mem::take(&mut self.w.month), self.w.store.clone());
        let month_read = tokio::spawn(async move { month.refresh(&*store, now).await.map(|()| month) });
        let active = self.w.store.active_workloads().await?;
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
                self.adopt_layouts(&report.layouts, now_ms());
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
        self.queue_dirty |= batch.queue_changed;
        let mut parts = batch.into_parts();
        if let (Some(f), false) = (&self.fence, parts.changes.is_empty()) {
            parts.changes.insert(0, tessera_store::Change::Fence(f.clone()));
        }
        self.w.store.commit(&parts.changes).await?;
        self.w.published.put_workloads(parts.records);
        self.w
            .published
            .put_workloads(self.w.live.values().map(|l| l.w.clone()));
        let snap = self
            .builder
            .build(&self.w.fleet, &self.w.sched, &self.w.live, &self.w.tenants, now, true);
        self.w.published.set_snapshot(snap);
        for (id, op) in parts.ops {
            self.runner.submit(id, op);
        }
        Ok(())
    }
}
