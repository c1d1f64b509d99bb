//! Allocation and utilisation over time per pool, for the console's charts: one sample per pool
//! a minute for the last 30 days, kept in memory (at most 43,200 samples a pool, about 1.4 MB),
//! read back over a [`Window`] (the last hour, day, week or month) in buckets of a minute or an
//! hour ([`History::window`]).
//!
//! A sample is taken from the published snapshot (GPU units allocated in the pool) and the
//! backend's latest telemetry (the pool's mean GPU utilisation, where the backend reports it).
//! At start the allocation of the last 30 days is rebuilt from the usage ledger (the stored
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
/// 30 days of minutes.
pub const KEPT: usize = 30 * 1_440;

/// A span of time the charts show, back from now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
pub enum Window {
    #[serde(rename = "1h")]
    Hour,
    #[default]
    #[serde(rename = "24h")]
    Day,
    #[serde(rename = "7d")]
    Week,
    #[serde(rename = "30d")]
    Month,
}

impl Window {
    pub const ALL: [Window; 4] = [Window::Hour, Window::Day, Window::Week, Window::Month];

    /// Its name in addresses (`?range=7d`).
    pub fn key(self) -> &'static str {
        match self {
            Window::Hour => "1h",
            Window::Day => "24h",
            Window::Week => "7d",
            Window::Month => "30d",
        }
    }

    /// For people: "the last 7 days".
    pub fn label(self) -> &'static str {
        match self {
            Window::Hour => "the last hour",
            Window::Day => "the last 24 hours",
            Window::Week => "the last 7 days",
            Window::Month => "the last 30 days",
        }
    }

    /// How many minutes it spans.
    pub fn minutes(self) -> usize {
        match self {
            Window::Hour => 60,
            Window::Day => 1_440,
            Window::Week => 7 * 1_440,
            Window::Month => 30 * 1_440,
        }
    }

    /// Minutes per point: every minute up to a day, hours beyond (168 or 720 points).
    pub fn bucket_minutes(self) -> usize {
        match self {
            Window::Hour | Window::Day => 1,
            Window::Week | Window::Month => 60,
        }
    }

    /// The point's length for people.
    pub fn resolution(self) -> &'static str {
        match self.bucket_minutes() {
            1 => "one point a minute",
            _ => "one point an hour (mean and peak of its minutes)",
        }
    }
}

/// One point of a [`Window`]: a minute, or an hour's minutes taken together.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    /// The bucket's start, ms since the epoch.
    pub at: i64,
    /// Mean GPU units allocated over its samples.
    pub allocated: f64,
    /// The most allocated in one of its minutes.
    pub peak: f64,
    /// Mean utilisation over the samples that had telemetry.
    pub util_pct: Option<f64>,
}

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

    /// A pool's samples within `window` before `now` (the current minute included), in
    /// buckets of [`Window::bucket_minutes`]: a bucket without any sample is left out.
    pub fn window(&self, pool: &str, window: Window, now: i64) -> Vec<Point> {
        let bucket = window.bucket_minutes() as i64 * MINUTE_MS;
        let last = minute(now);
        let first = last - (window.minutes() as i64 - 1) * MINUTE_MS;
        // Buckets start on the clock's minutes or hours (UTC), the first one perhaps partly
        // inside the window.
        let start = |at: i64| at - at.rem_euclid(bucket);
        let pools = self.pools.read().expect("lock");
        let Some(q) = pools.get(pool) else {
            return Vec::new();
        };
        // The samples are in time order: find the first one in the window, then fold.
        let from = q.partition_point(|s| s.at < first);
        let mut out: Vec<Point> = Vec::new();
        let mut acc = (0.0, 0u32, 0.0, 0u32);
        let flush = |out: &mut Vec<Point>, at: i64, acc: (f64, u32, f64, u32), peak: f64| {
            out.push(Point {
                at,
                allocated: acc.0 / f64::from(acc.1),
                peak,
                util_pct: (acc.3 > 0).then(|| acc.2 / f64::from(acc.3)),
            });
        };
        let (mut at, mut peak) = (i64::MIN, 0.0f64);
        for s in q.range(from..).take_while(|s| s.at <= last) {
            let b = start(s.at);
            if b != at && acc.1 > 0 {
                flush(&mut out, at, acc, peak);
                acc = (0.0, 0, 0.0, 0);
                peak = 0.0;
            }
            at = b;
            acc.0 += s.allocated;
            acc.1 += 1;
            peak = peak.max(s.allocated);
            if let Some(u) = s.util_pct {
                acc.2 += u;
                acc.3 += 1;
            }
        }
        if acc.1 > 0 {
            flush(&mut out, at, acc, peak);
        }
        out
    }

    /// Adds one sample per pool (a sample for a minute already recorded replaces it), dropping
    /// what is older than 30 days.
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

/// The allocation of every pool at each minute of the last 30 days before `now`, from the
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

/// Rebuilds the last 30 days of allocation from the ledger, then samples every minute (the
/// pools, and each workload's GPUs: [`crate::workload_history`]).
pub fn spawn(s: crate::state::AppState) {
    tokio::spawn(async move {
        let now = crate::clock::now_ms();
        match s.store.usage_between(None, now - KEPT as i64 * MINUTE_MS, now).await {
            Ok(intervals) => s.history.record(rebuild(&s.fleet(), &intervals, now)),
            Err(e) => tracing::warn!(error = %e, "allocation history not rebuilt from the usage ledger"),
        }
        loop {
            let now = crate::clock::now_ms();
            let (snap, telemetry) = (s.lifecycle.snapshot(), s.lifecycle.published().telemetry());
            s.history.record(sample(&snap, &telemetry, now));
            s.workload_history
                .record(now, crate::workload_history::sample(&snap, &telemetry, now));
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
    fn history_keeps_one_sample_a_minute_for_a_month() {
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
        let n = KEPT as i64 + 560;
        h.record((0..n).map(|m| s(m, m as f64)));
        h.record([s(n - 1, -1.0), s(5, 7.0)]);
        let kept = h.series("p");
        assert_eq!(kept.len(), KEPT);
        assert_eq!(kept[0].at, 560 * MINUTE_MS, "30 days before the newest");
        assert_eq!(kept.last().unwrap().allocated, -1.0, "the same minute is replaced");
    }

    #[test]
    fn a_window_takes_minutes_up_to_a_day_and_hours_beyond() {
        let h = History::default();
        // Three hours of minutes: allocation = the minute's index within its hour (0..59),
        // utilisation only in the last hour.
        let base = 1_000 * 60 * MINUTE_MS; // on an hour
        h.record((0..180).map(|m| {
            (
                "p".to_string(),
                Sample {
                    at: base + m * MINUTE_MS,
                    allocated: (m % 60) as f64,
                    util_pct: (m >= 120).then_some(40.0),
                },
            )
        }));
        let now = base + 179 * MINUTE_MS + 30_000;
        let hour = h.window("p", Window::Hour, now);
        assert_eq!(hour.len(), 60, "one point a minute");
        assert_eq!((hour[0].at, hour[0].allocated), (base + 120 * MINUTE_MS, 0.0));
        assert_eq!(hour[59].util_pct, Some(40.0));
        assert_eq!(h.window("p", Window::Day, now).len(), 180, "all there is");
        let week = h.window("p", Window::Week, now);
        // The week's points are the clock's hours: three of them, each averaging 0..59.
        assert_eq!(week.len(), 3);
        assert_eq!(week[0].at, base);
        let total: f64 = week.iter().map(|p| p.allocated).sum();
        assert!((total - 3.0 * 29.5).abs() < 1e-9, "each hour averages 29.5: {week:?}");
        assert!(week.iter().all(|p| p.peak == 59.0), "{week:?}");
        assert_eq!(week[0].util_pct, None, "no telemetry in the first hour");
        assert_eq!(week[2].util_pct, Some(40.0));
        assert!(h.window("q", Window::Week, now).is_empty(), "unknown pool");
    }
}
