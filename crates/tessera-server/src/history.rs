//! Allocation and utilisation over time per pool, for the console's charts: one sample per pool
//! a minute for the last 24 hours, kept in memory (at most 1,440 samples a pool).
//!
//! A sample is taken from the published snapshot (GPU units allocated in the pool) and the
//! backend's latest telemetry (the pool's mean GPU utilisation, where the backend reports it).
//! At start the allocation of the last 24 hours is rebuilt from the usage ledger (the stored
//! usage intervals say what was allocated when), so a restart loses only utilisation, which
//! no store keeps. Nothing here runs inside the lifecycle loop.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tessera_model::Fleet;
use tessera_store::UsageInterval;

use crate::lifecycle::snapshot::{Snapshot, Telemetry};

/// One minute's sample of a pool.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// The minute, ms since the epoch.
    pub at: i64,
    /// GPU units allocated.
    pub allocated: f64,
    /// Mean GPU utilisation of the pool, percent; `None` where no telemetry was reported.
    pub util_pct: Option<f64>,
}

const MINUTE_MS: i64 = 60_000;
/// 24 hours of minutes.
pub const KEPT: usize = 1_440;

/// The samples of every pool, oldest first.
#[derive(Default)]
pub struct History {
    pools: RwLock<BTreeMap<String, VecDeque<Sample>>>,
}

impl History {
    /// A pool's samples, oldest first.
    pub fn series(&self, pool: &str) -> Vec<Sample> {
        self.pools
            .read()
            .expect("lock")
            .get(pool)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Adds one sample per pool (a sample for a minute already recorded replaces it), dropping
    /// what is older than 24 hours.
    pub fn record(&self, samples: impl IntoIterator<Item = (String, Sample)>) {
        let mut pools = self.pools.write().expect("lock");
        for (pool, s) in samples {
            let q = pools.entry(pool).or_default();
            match q.back_mut() {
                Some(last) if last.at == s.at => *last = s,
                Some(last) if last.at > s.at => continue,
                _ => q.push_back(s),
            }
            while q.len() > KEPT || q.front().is_some_and(|f| f.at <= s.at - KEPT as i64 * MINUTE_MS) {
                q.pop_front();
            }
        }
    }
}

/// The minute `ms` falls in.
pub fn minute(ms: i64) -> i64 {
    ms - ms.rem_euclid(MINUTE_MS)
}

/// The allocation of every pool at each minute of the last 24 hours before `now`, from the
/// usage ledger: at a minute, the units of every interval open then.
pub fn rebuild(fleet: &Fleet, intervals: &[UsageInterval], now: i64) -> Vec<(String, Sample)> {
    let last = minute(now);
    let first = last - (KEPT as i64 - 1) * MINUTE_MS;
    // Per pool, the change of allocated milli-units at each minute index (a difference array).
    let mut delta: HashMap<&str, Vec<i64>> = fleet
        .pools
        .iter()
        .map(|p| (p.name.as_str(), vec![0i64; KEPT + 1]))
        .collect();
    let index = |ms: i64| ((ms - first + MINUTE_MS - 1).div_euclid(MINUTE_MS)).clamp(0, KEPT as i64) as usize;
    for i in intervals {
        let Some(d) = delta.get_mut(i.pool.as_str()) else {
            continue;
        };
        let (from, to) = (index(i.started_at), index(i.ended_at.unwrap_or(i64::MAX).min(now + 1)));
        if from < to {
            d[from] += i.units.as_milli() as i64;
            d[to] -= i.units.as_milli() as i64;
        }
    }
    let mut out = Vec::with_capacity(KEPT * fleet.pools.len());
    for p in &fleet.pools {
        let mut held = 0i64;
        for (m, change) in delta[p.name.as_str()].iter().take(KEPT).enumerate() {
            held += change;
            out.push((
                p.name.clone(),
                Sample {
                    at: first + m as i64 * MINUTE_MS,
                    allocated: held.max(0) as f64 / 1000.0,
                    util_pct: None,
                },
            ));
        }
    }
    out
}

/// This minute's sample of every pool: units allocated in the snapshot, and the mean
/// utilisation of the pool's GPUs in telemetry no older than two minutes.
pub fn sample(snap: &Snapshot, telemetry: &Telemetry, now: i64) -> Vec<(String, Sample)> {
    let f = &snap.fleet;
    let fresh = telemetry.at > 0 && now - telemetry.at <= 2 * MINUTE_MS;
    let mut util: HashMap<&str, (f64, u32)> = HashMap::new();
    if fresh {
        let pool_of: HashMap<&str, &str> = f
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), f.pool(n.pool).name.as_str()))
            .collect();
        for g in telemetry.gpus.iter() {
            if let Some(p) = pool_of.get(g.node.as_str()) {
                let e = util.entry(*p).or_default();
                e.0 += g.util_pct;
                e.1 += 1;
            }
        }
    }
    f.pools
        .iter()
        .map(|p| {
            let range = p.nodes.start as usize..p.nodes.end as usize;
            let used: u64 = snap
                .nodes
                .get(range)
                .unwrap_or_default()
                .iter()
                .map(|n| n.used_milli())
                .sum();
            let util_pct = util.get(p.name.as_str()).map(|(sum, n)| sum / f64::from(*n));
            (
                p.name.clone(),
                Sample {
                    at: minute(now),
                    allocated: used as f64 / 1000.0,
                    util_pct,
                },
            )
        })
        .collect()
}

/// Rebuilds the last 24 hours of allocation from the ledger, then samples every minute.
pub fn spawn(s: crate::AppState) {
    tokio::spawn(async move {
        let now = crate::clock::now_ms();
        match s.store.usage_between(None, now - KEPT as i64 * MINUTE_MS, now).await {
            Ok(intervals) => s.history.record(rebuild(&s.fleet(), &intervals, now)),
            Err(e) => tracing::warn!(error = %e, "allocation history not rebuilt from the usage ledger"),
        }
        loop {
            let now = crate::clock::now_ms();
            s.history.record(sample(
                &s.lifecycle.snapshot(),
                &s.lifecycle.published().telemetry(),
                now,
            ));
            let wait = MINUTE_MS - now.rem_euclid(MINUTE_MS);
            tokio::time::sleep(Duration::from_millis(wait as u64 + 50)).await;
        }
    });
}

/// A shared, empty history.
pub fn new() -> Arc<History> {
    Arc::new(History::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_domain::WorkloadId;
    use tessera_model::GpuUnits;

    fn interval(pool: &str, milli: u64, started_at: i64, ended_at: Option<i64>) -> UsageInterval {
        UsageInterval {
            workload: WorkloadId(1),
            seq: 0,
            tenant: "t".into(),
            project: "p".into(),
            pool: pool.into(),
            model: "m".into(),
            shape: "1 whole GPU".into(),
            units: GpuUnits(milli),
            started_at,
            ended_at,
            util_avg: None,
        }
    }

    #[test]
    fn the_ledger_gives_the_allocation_at_each_minute() {
        let fleet = tessera_model::Fleet::seed();
        let pool = fleet.pools[0].name.clone();
        let now = 1_000 * MINUTE_MS + 30_000;
        let ledger = [
            // Open from 10 minutes ago, still running.
            interval(&pool, 2000, now - 10 * MINUTE_MS, None),
            // Half a GPU from 5 to 3 minutes ago.
            interval(&pool, 500, now - 5 * MINUTE_MS, Some(now - 3 * MINUTE_MS)),
            // Before the window: not seen.
            interval(&pool, 9000, now - 3000 * MINUTE_MS, Some(now - 2000 * MINUTE_MS)),
        ];
        let all = rebuild(&fleet, &ledger, now);
        let mine: Vec<Sample> = all.iter().filter(|(p, _)| *p == pool).map(|(_, s)| *s).collect();
        assert_eq!(mine.len(), KEPT);
        assert_eq!(mine.last().unwrap().at, minute(now));
        let at = |ago: i64| {
            mine.iter()
                .find(|s| s.at == minute(now) - ago * MINUTE_MS)
                .unwrap()
                .allocated
        };
        assert_eq!(at(11), 0.0);
        assert_eq!(at(9), 2.0);
        assert_eq!(at(4), 2.5);
        assert_eq!(at(2), 2.0);
        assert_eq!(at(0), 2.0);
        assert!(
            mine.iter().all(|s| s.util_pct.is_none()),
            "the ledger has no utilisation"
        );
    }

    #[test]
    fn history_keeps_one_sample_a_minute_for_a_day() {
        let h = History::default();
        let s = |m: i64, a: f64| {
            (
                "p".to_string(),
                Sample {
                    at: m * MINUTE_MS,
                    allocated: a,
                    util_pct: Some(50.0),
                },
            )
        };
        h.record((0..2_000).map(|m| s(m, m as f64)));
        h.record([s(1_999, -1.0), s(5, 7.0)]);
        let kept = h.series("p");
        assert_eq!(kept.len(), KEPT);
        assert_eq!(kept[0].at, 560 * MINUTE_MS, "24 hours before the newest");
        assert_eq!(kept.last().unwrap().allocated, -1.0, "the same minute is replaced");
    }
}
