//! What the loop keeps of each live workload ([`Live`]) and the small helpers every
//! controller shares: the clock, a scheduler honouring the backend's capabilities, and the
//! resource class a request waits for.

use std::sync::Arc;

use tessera_backend::{Capabilities, DeviceAssignment, Partitioning};
use tessera_domain::Workload;
use tessera_model::request::GangRequest;
use tessera_model::{Fleet, Request, TenantId};
use tessera_sched::cycle::{Job, Scheduler};
use tessera_sched::engine::{DeviceBinding, share_id};
use tessera_sched::mig::MigMode;

use super::config::SchedFactory;
use super::placement::{self, NodeIndex};

/// A live (non-terminal) workload and what the loop keeps beside its record.
pub(crate) struct Live {
    /// Its record, shared with the batch that stores it and the published cache that serves
    /// reads (a transition makes a new one).
    pub w: Arc<Workload>,
    /// Its request, resolved against the fleet (for a multi-node gang: one of its node-shares).
    pub request: Request,
    /// A multi-node gang's request, resolved against the fleet.
    pub gang: Option<GangRequest>,
    /// The resource class it waits for: its pool when only one can serve it, else `any`.
    pub class: Arc<str>,
    /// Measured utilisation since its usage interval opened: Σ util × ms, and the ms sampled.
    pub util: (f64, f64),
}

impl Live {
    pub fn utilisation(&self) -> Option<f64> {
        (self.util.1 > 0.0).then(|| self.util.0 / self.util.1)
    }

    pub(super) fn job(&self) -> Job {
        Job {
            id: self.w.id.0,
            tenant: self.w.spec.tenant.clone(),
            project: self.w.spec.project.clone(),
            request: self.request.clone(),
            priority: self.w.spec.priority.clone(),
            submitted_ms: self.w.created_at,
            wait_if_over_limit: !self.w.spec.no_wait,
            min_runtime_ms: None,
            movable: self.w.spec.movable.map(|m| match m {
                tessera_domain::Movable::Restart => tessera_sched::cycle::Movable::Restart,
                tessera_domain::Movable::Replace => tessera_sched::cycle::Movable::Replace,
            }),
            gang: self.gang.clone(),
            duration_ms: self.w.spec.duration_s.map(|d| (d as i64).saturating_mul(1000)),
        }
    }

    /// Gives the scheduler back the capacity its record says it holds (start-up, failover, a
    /// follower's view): every node-share of a gang, or its one allocation.
    pub(super) fn restore_into(
        &self,
        sched: &mut Scheduler,
        fleet: &Fleet,
        nodes: &NodeIndex,
        tenant: TenantId,
    ) -> Result<(), String> {
        let w = &self.w;
        let first = w
            .placement
            .as_ref()
            .ok_or_else(|| "no placement recorded".to_string())?;
        let host = (w.spec.cpu_milli, w.spec.memory_mib);
        let since = w.running_at.unwrap_or(w.created_at);
        if self.gang.is_none() {
            let a = placement::allocation_of(fleet, nodes, w.id.0, first, host, tenant)?;
            return sched.restore(&self.job(), a, w.borrowing, since);
        }
        let pool = fleet
            .pool_by_name(&first.pool)
            .ok_or_else(|| format!("pool {} is not in the fleet", first.pool))?;
        let shares = w
            .placements()
            .enumerate()
            .map(|(i, p)| placement::allocation_of(fleet, nodes, share_id(w.id.0, i), p, host, tenant))
            .collect::<Result<Vec<_>, _>>()?;
        sched.restore_gang(&self.job(), pool, shares, w.borrowing, since)
    }
}

/// Milliseconds since the Unix epoch.
pub(super) fn now_ms() -> i64 {
    crate::clock::now_ms()
}

/// A new scheduler whose engine honours the backend's capabilities.
pub(super) fn fresh_scheduler(factory: &SchedFactory, fleet: Arc<Fleet>, caps: &Capabilities) -> Scheduler {
    let mut s = factory(fleet);
    let mig = match caps.partitioning {
        Partitioning::WholeGpu => MigMode::WholeGpu,
        Partitioning::Instance | Partitioning::None => MigMode::Instance,
    };
    s.engine.set_mig_mode(mig).expect("a new engine has no allocations");
    s.engine.set_device_binding(match caps.devices {
        DeviceAssignment::Exact => DeviceBinding::Exact,
        DeviceAssignment::PerNodeCount => DeviceBinding::PerNodeCount,
    });
    s
}

/// The resource class a request waits for: its pool when only one pool can serve it.
pub(super) fn class_of(fleet: &Fleet, sched: &Scheduler, r: &Request) -> String {
    if let Some(p) = r.pool {
        return fleet.pool(p).name.clone();
    }
    match sched.engine.scope(r) {
        Ok(pools) if pools.len() == 1 => fleet.pool(pools[0]).name.clone(),
        _ => "any".into(),
    }
}
