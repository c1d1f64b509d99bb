//! Metering the loop keeps besides the ledger: GPU-unit-hours spent this calendar month per
//! tenant (what budgets are checked against), and the measured utilisation of running
//! workloads, accumulated from the backend's telemetry until their usage interval closes.

use std::collections::HashMap;

use tessera_backend::GpuSample;
use tessera_domain::{Workload, WorkloadId};
use tessera_model::GpuUnits;
use tessera_sched::ClusterState;
use tessera_store::{Store, StoreError};

use super::live::Live;
use super::placement::NodeIndex;

const HOUR_MS: f64 = 3_600_000.0;

/// GPU-unit-hours of closed usage intervals this month, per tenant.
#[derive(Default)]
pub struct MonthBook {
    start: i64,
    closed: HashMap<String, f64>,
}

impl MonthBook {
    /// Reloads the month's closed usage from the ledger when the month changed.
    pub async fn refresh(&mut self, store: &dyn Store, now: i64) -> Result<(), StoreError> {
        let start = tessera_api::month_start_ms(now);
        if start == self.start {
            return Ok(());
        }
        // milli-GPU-unit milliseconds → GPU-unit-hours.
        self.closed = (store.closed_usage(start, now).await?.into_iter())
            .map(|(tenant, used)| (tenant, used as f64 / 1000.0 / HOUR_MS))
            .collect();
        self.start = start;
        Ok(())
    }

    /// Adds an interval that closes now.
    pub fn close(&mut self, tenant: &str, units: GpuUnits, running_at: i64, at: i64) {
        let ms = (at - running_at.max(self.start)).max(0) as f64;
        *self.closed.entry(tenant.to_string()).or_default() += units.as_f64() * ms / HOUR_MS;
    }

    /// What `tenant` has spent this month: closed intervals plus its running work so far.
    pub fn spent<'a>(&self, tenant: &str, running: impl Iterator<Item = &'a Workload>, now: i64) -> f64 {
        let open: f64 = running
            .filter(|w| w.spec.tenant == tenant && w.usage.open)
            .map(|w| {
                let since = w.running_at.unwrap_or(now).max(self.start);
                w.held_units().as_f64() * (now - since).max(0) as f64 / HOUR_MS
            })
            .sum();
        self.closed.get(tenant).copied().unwrap_or(0.0) + open
    }
}

/// Adds one telemetry sample, standing for `dt_ms`, to the utilisation of every metered
/// workload on the sampled GPUs; calls `meter` with each (workload, utilisation) for the
/// metering counters.
pub fn sample_utilisation(
    live: &mut HashMap<WorkloadId, Live>,
    state: &ClusterState,
    nodes: &NodeIndex,
    samples: &[GpuSample],
    dt_ms: f64,
    mut meter: impl FnMut(&Workload, f64),
) {
    if dt_ms <= 0.0 {
        return;
    }
    let mut account = |id: u64, util: f64| {
        if let Some(l) = live.get_mut(&WorkloadId(id))
            && l.w.usage.open
        {
            l.util.0 += util * dt_ms;
            l.util.1 += dt_ms;
            meter(&l.w, util);
        }
    };
    // Workloads the backend names in its samples (MIG instances, time-slice shares, GPUs a pod
    // holds): their figures are theirs, on whichever GPU the backend saw them.
    let named = tessera_backend::named_workloads(samples);
    for s in samples {
        let mut any_named = false;
        for i in &s.instances {
            if let Some(w) = i.holder() {
                any_named = true;
                account(w, i.gr_engine_active);
            }
        }
        if any_named {
            continue;
        }
        // A GPU without named holders: its utilisation goes to whoever holds it in the engine
        // (exact where the backend assigns the devices the engine chose).
        let Some(n) = nodes.get(&s.node) else { continue };
        let Some(g) = state.nodes.get(n.0 as usize).and_then(|ns| ns.gpus.get(s.gpu as usize)) else {
            continue;
        };
        for h in g.holders.iter().filter(|h| !named.contains_key(h)) {
            account(*h, s.util_pct / 100.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_domain::Phase;
    use tessera_store::conformance::workload;
    use tessera_store::{Change, UsageInterval, WorkloadStore};
    use tessera_store_sqlite::SqliteStore;

    const H: i64 = 3_600_000;

    fn sample(node: &str, gpu: u8, util_pct: f64, named: &[(u64, &str, f64)]) -> GpuSample {
        GpuSample {
            node: node.into(),
            gpu,
            uuid: format!("GPU-{node}-{gpu}"),
            model: "H100".into(),
            util_pct,
            fb_used_mib: 0,
            fb_free_mib: 0,
            temp_c: 40.0,
            power_w: 100.0,
            xid: 0,
            instances: named
                .iter()
                .map(|&(workload, profile, active)| tessera_backend::InstanceSample {
                    workload,
                    profile: profile.into(),
                    instance_id: 0,
                    gr_engine_active: active,
                    fb_used_mib: 0,
                    fb_free_mib: 0,
                })
                .collect(),
        }
    }

    /// Utilisation goes to the workload a sample names, on whichever GPU the backend saw it (a
    /// device plugin may give a pod another GPU than the engine booked), and a GPU that names no
    /// one goes to whoever the engine booked on it, unless that workload was named elsewhere.
    #[test]
    fn utilisation_follows_the_workload_a_sample_names_else_the_engines_booking() {
        let fleet = tessera_model::Fleet::from_toml(
            "[[pool]]\nname = \"p\"\nsharing = \"whole\"\n[[pool.nodes]]\nname = \"n\"\ncount = 2\ngpu_model = \"H100-80GB-SXM\"\ngpus = 3\ncpus = 64\nmemory_gib = 512\n",
            "test",
        )
        .unwrap();
        let nodes = NodeIndex::new(&fleet);
        let mut state = ClusterState::empty(&fleet);
        // The engine booked 1 on n-00 GPU 0, 2 on its GPU 1, 3 on its GPU 2, 4 on n-01 GPU 0.
        for (n, g, id) in [(0, 0, 1), (0, 1, 2), (0, 2, 3), (1, 0, 4)] {
            state.nodes[n].gpus[g].holders.push(id);
        }
        let mut live: HashMap<WorkloadId, Live> = (1..=4)
            .map(|id| {
                let mut w = workload(id, "acme", "p", Phase::Running);
                w.usage.open = true;
                let request = super::super::placement::engine_request(&fleet, &w.spec.shape, 1000, 1024).unwrap();
                let l = Live {
                    w: w.into(),
                    request,
                    gang: None,
                    class: "p".into(),
                    util: (0.0, 0.0),
                };
                (WorkloadId(id), l)
            })
            .collect();
        let samples = [
            // The device plugin gave 1 the engine's GPU 1, and 2 the engine's GPU 0.
            sample("n-00", 0, 30.0, &[(2, "", 0.3)]),
            sample("n-00", 1, 80.0, &[(1, "", 0.8)]),
            // Named by no one: the engine's booking.
            sample("n-00", 2, 50.0, &[]),
            sample("n-01", 0, 10.0, &[]),
            // Not on this node's list: ignored.
            sample("elsewhere", 0, 99.0, &[(9, "", 0.99)]),
        ];
        let mut metered = Vec::new();
        sample_utilisation(&mut live, &state, &nodes, &samples, 1000.0, |w, u| {
            metered.push((w.id.0, u))
        });
        metered.sort_by_key(|m| m.0);
        assert_eq!(metered, vec![(1, 0.8), (2, 0.3), (3, 0.5), (4, 0.1)]);
        let util = |id: u64| live[&WorkloadId(id)].utilisation();
        assert_eq!(
            (util(1), util(2), util(3), util(4)),
            (Some(0.8), Some(0.3), Some(0.5), Some(0.1))
        );

        // Named on a GPU the engine booked for someone else, the other is not charged with it.
        let samples = [sample("n-00", 0, 70.0, &[(3, "", 0.7)])];
        let mut metered = Vec::new();
        sample_utilisation(&mut live, &state, &nodes, &samples, 1000.0, |w, u| {
            metered.push((w.id.0, u))
        });
        assert_eq!(metered, vec![(3, 0.7)]);
    }

    /// The month's closed usage comes back from the store per tenant (after a restart, on a
    /// follower): intervals cut at the month's start, last month's and open ones left out.
    #[tokio::test]
    async fn the_month_book_reloads_closed_usage_cut_to_the_month() {
        let store = SqliteStore::open_memory().await.unwrap();
        let ids: Vec<u64> = store.reserve_workload_ids(5).await.unwrap().collect();
        let now = 1_797_292_800_000; // 2026-12-15T00:00Z
        let start = tessera_api::month_start_ms(now);
        assert_eq!(start, now - 14 * 24 * H);
        // (tenant, milli-units, started, ended)
        let intervals = [
            ("acme", 1000, start - H, Some(start + H)), // 1 h this month
            ("acme", 500, start + 9 * 24 * H, Some(start + 9 * 24 * H + 2 * H)), // 1 unit-h
            ("acme", 1000, start - 30 * 24 * H, Some(start - 29 * 24 * H)), // last month
            ("acme", 2000, now - 3 * 24 * H, None),     // open: counted while running
            ("globex", 250, now - H, Some(now - H / 2)), // 0.125 unit-h
        ];
        let mut batch = Vec::new();
        for (&id, &(tenant, milli, started_at, ended_at)) in ids.iter().zip(&intervals) {
            let w = workload(id, tenant, "p", Phase::Running);
            batch.push(Change::Insert {
                workload: w.clone().into(),
                events: Vec::new(),
                idempotency: None,
            });
            batch.push(Change::OpenUsage(UsageInterval {
                workload: w.id,
                seq: 0,
                tenant: tenant.into(),
                project: "p".into(),
                pool: "training".into(),
                model: "H100-80GB-SXM".into(),
                shape: "1 whole GPU".into(),
                units: GpuUnits(milli),
                started_at,
                ended_at: None,
                util_avg: None,
            }));
            if let Some(ended_at) = ended_at {
                batch.push(Change::CloseUsage {
                    workload: w.id,
                    seq: 0,
                    ended_at,
                    util_avg: None,
                });
            }
        }
        store.commit(&batch).await.unwrap();

        let mut book = MonthBook::default();
        book.refresh(&store, now).await.unwrap();
        let spent = |tenant: &str| book.spent(tenant, std::iter::empty(), now);
        assert!((spent("acme") - 2.0).abs() < 1e-9, "{}", spent("acme"));
        assert!((spent("globex") - 0.125).abs() < 1e-9, "{}", spent("globex"));
        assert_eq!(spent("initech"), 0.0);
    }
}
