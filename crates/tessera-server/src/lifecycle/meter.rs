//! The metering controller: folds the backend's telemetry into the measured utilisation of
//! running work, and once a second reloads this month's usage when the month changed and gives
//! the scheduler each budgeted tenant's spend. The month's ledger itself
//! ([`MonthBook`](super::metering::MonthBook)) is the world's: closing a usage interval adds
//! to it. Each step is handed the part of the world it uses ([`MeterCtx`]).

use std::collections::HashMap;

use tessera_backend::GpuSample;
use tessera_domain::WorkloadId;
use tessera_sched::cycle::Scheduler;
use tessera_store::Store;

use super::live::{Live, now_ms};
use super::metering::{self, MonthBook};
use super::placement::NodeIndex;
use super::world::World;
use crate::metrics::Metrics;

/// What the metering controller is handed of the world: the live workloads (their measured
/// utilisation), the scheduler (the holdings telemetry is matched to, and the tenants' spend),
/// the node index, this month's ledger with the store it reloads from, and the metrics.
pub(super) struct MeterCtx<'a> {
    pub live: &'a mut HashMap<WorkloadId, Live>,
    pub sched: &'a mut Scheduler,
    pub nodes: &'a NodeIndex,
    pub month: &'a mut MonthBook,
    pub store: &'a dyn Store,
    pub metrics: &'a Metrics,
}

impl<'a> MeterCtx<'a> {
    /// The controller's part of the world.
    pub(super) fn of(w: &'a mut World, store: &'a dyn Store) -> Self {
        MeterCtx {
            live: &mut w.live,
            sched: &mut w.sched,
            nodes: &w.nodes,
            month: &mut w.month,
            store,
            metrics: &w.metrics,
        }
    }
}

/// The metering controller's state.
pub(super) struct Metering {
    /// When telemetry was last sampled into the utilisation of running work.
    last_sample: i64,
}

impl Default for Metering {
    fn default() -> Self {
        Metering { last_sample: now_ms() }
    }
}

impl Metering {
    /// Telemetry arrived: the utilisation of running work since the last sample.
    pub(super) fn on_telemetry(&mut self, w: MeterCtx<'_>, at_ms: i64, gpus: &[GpuSample]) {
        let dt = (at_ms - self.last_sample).clamp(0, 60_000) as f64;
        self.last_sample = at_ms;
        let metrics = w.metrics;
        metering::sample_utilisation(w.live, w.sched.engine.state(), w.nodes, gpus, dt, |wl, util| {
            metrics.meter(wl, util, dt)
        });
    }

    /// The once-a-second step: this month's usage (reloaded when the month changed) and the
    /// spend of every budgeted tenant.
    pub(super) async fn tick(mut w: MeterCtx<'_>, now: i64) {
        if let Err(e) = w.month.refresh(w.store, now).await {
            tracing::warn!(error = %e, "cannot refresh this month's usage");
        }
        Self::update_budgets(&mut w, now);
    }

    /// Gives the scheduler each budgeted tenant's spend this month, running work included.
    fn update_budgets(w: &mut MeterCtx<'_>, now: i64) {
        let mut tenants: Vec<String> = w
            .live
            .values()
            .filter(|l| l.w.usage.open)
            .map(|l| l.w.spec.tenant.clone())
            .filter(|t| w.sched.budget(t).is_some())
            .collect();
        tenants.sort_unstable();
        tenants.dedup();
        for t in tenants {
            let spent = w.month.spent(&t, w.live.values().map(|l| &*l.w), now);
            w.sched.set_spent(&t, spent);
        }
    }
}
