//! What a follower shows: a replica that does not lead runs no loop, so what readers see of
//! the fleet, the queue, quotas and budgets is rebuilt from the store (periodically, by the
//! replica's supervisor) in a scheduler of its own that only holds allocations, the way
//! [`recover`](super::recover) rebuilds a leader's — without asking the backend anything and
//! without writing; unhealthy GPUs, node states and rollouts come from the store too. Single
//! workloads, lists and timelines are read from the store directly
//! ([`Lifecycle::workload`] answers `None` on a follower).

use std::collections::HashMap;
use std::sync::Arc;

use tessera_domain::WorkloadId;
use tessera_model::TenantId;
use tessera_store::StoreError;

use super::command::Lifecycle;
use super::config::LoopConfig;
use super::live::{Live, class_of, fresh_scheduler, now_ms};
use super::metering::MonthBook;
use super::ops::FleetOps;
use super::placement;
use super::snapshot::SnapshotBuilder;
use tessera_model::GpuUnits;
use tessera_sched::cycle::Quota;

impl Lifecycle {
    /// Publishes a view of the store's state (a follower's); does nothing while a loop runs
    /// behind this handle, which publishes its own.
    pub async fn refresh_view(&self, cfg: &LoopConfig) -> Result<(), StoreError> {
        if self.is_leading() {
            return Ok(());
        }
        let store = &*cfg.store;
        // The fleet this replica's own backend last reported (each replica connects its own).
        let fleet = self.fleet();
        let mut sched = fresh_scheduler(&cfg.factory, fleet.clone(), &cfg.backend.capabilities());
        for q in store.quotas().await? {
            let quota = Quota {
                guaranteed: GpuUnits(q.guaranteed_milli),
                limit: q.limit_milli.map(GpuUnits),
            };
            sched.set_quota(&q.tenant, &q.class, Some(quota));
        }
        let budgets = store.budgets().await?;
        for (t, b) in &budgets {
            sched.set_budget(t, Some(*b));
        }
        // Unhealthy GPUs and node states, fenced in the view's engine as the leader fences them.
        let mut ops = FleetOps::default();
        for r in store.unhealthy_gpus().await? {
            if let Some(n) = fleet.node_by_name(&r.node) {
                sched.engine.fence_gpu(n.0, r.gpu, true);
            }
            ops.unhealthy.insert((r.node.clone(), r.gpu), r);
        }
        for r in store.node_states().await? {
            if let Some(n) = fleet.node_by_name(&r.node) {
                sched.engine.fence_node(n.0, true);
            }
            ops.nodes.insert(r.node.clone(), r);
        }
        for r in store.rollouts().await? {
            ops.rollouts.insert(r.id, r);
        }
        let now = now_ms();
        let mut month = MonthBook::default();
        month.refresh(store, now).await?;
        let nodes = placement::NodeIndex::new(&fleet);
        let mut tenants: HashMap<String, TenantId> = HashMap::new();
        let mut live: HashMap<WorkloadId, Live> = HashMap::new();
        for w in store.active_workloads().await? {
            let n = tenants.len() as u32;
            let tenant = *tenants.entry(w.spec.tenant.clone()).or_insert(TenantId(n));
            let Ok((request, gang)) = placement::resolve(&fleet, &w.spec, tenant) else {
                continue;
            };
            let l = Live {
                class: class_of(&fleet, &sched, &request).into(),
                request,
                gang,
                w: w.into(),
                util: (0.0, 0.0),
            };
            if l.w.phase.holds_capacity() && l.w.placement.is_some() {
                let restored = l.restore_into(&mut sched, &fleet, &nodes, tenant);
                if let Err(e) = restored {
                    // The leader's engine decides; a follower's view may lack what it cannot
                    // rebuild (a whole-GPU layout it never learnt from the backend).
                    tracing::debug!(id = %l.w.id, error = %e, "follower view: allocation not shown");
                }
            }
            live.insert(l.w.id, l);
        }
        for (t, _) in &budgets {
            let spent = month.spent(t, live.values().map(|l| &*l.w), now);
            sched.set_spent(t, spent);
        }
        let snap = SnapshotBuilder::new(&fleet).build(&fleet, &sched, &live, &tenants, now, true);
        if !self.is_leading() {
            self.published.set_snapshot(snap);
            self.published.set_ops(Arc::new(ops));
        }
        Ok(())
    }
}
