//! Allocation and utilisation over time per pool, for the console's charts: one sample per pool
//! a minute for the last 30 days, kept in memory (at most 43,200 samples a pool, about 1.4 MB),
//! read back over a [`Window`] (the last hour, day, week or month) in buckets of a minute or an
//! hour ([`History::window`]).
//!
//! A sample is taken from the published snapshot (GPU units allocated in the pool) and the
//! backend's latest telemetry (the pool's mean GPU utilisation, where the backend reports it).
//! Nothing here runs inside the lifecycle loop.
//!
//! **What survives a restart.** At start the allocation of the last 30 days is rebuilt from the
//! usage ledger (the stored usage intervals say what was allocated when). Utilisation, and each
//! workload's telemetry ([`crate::workload_history`]), are stored ([`TelemetryStore`]): every
//! minute the sampler ([`spawn`]) writes the samples it took that carry telemetry — each
//! pool's utilisation, each workload's minute — in one write (statements of at most
//! [`tessera_store::TELEMETRY_ROWS_PER_WRITE`] rows, each committed on its own), after
//! recording them in memory; at start the last 30 days are read back, a day at a time where
//! only hours are stored and an hour at a time over the last day's minutes ([`read_span`]),
//! so that at most a day of hours or an hour of minutes is held besides the histories
//! ([`restore`]). That read runs beside the sampler, which samples from the start (the
//! minutes it samples keep its figures): until the read is done, which takes a minute or more
//! at 10,000 workloads, the charts show the allocation and what was sampled since the start. A
//! replica without telemetry (a follower) writes nothing, and instead reads, each minute, what
//! the leader wrote since (the store's figures replacing those it read before: the leader
//! writes a minute again each time it samples it): its charts show it, and still do once it
//! leads after a failover. A write is idempotent (a minute already stored takes the figures
//! written last: the sampler's latest sample of that minute), and a store error is logged and
//! changes nothing else: the history in memory stays as it is. So a restart, or a failover, loses at most the minute or two
//! before it.
//!
//! **Bound of the store.** A pool keeps a row a minute for 30 days, as in memory: at most
//! about 43,320 rows a pool (30 days, the hour they start in, and up to an hour the hourly
//! prune has not reached yet). A workload keeps its minutes of the last day and, older, one row
//! per hour it reported in, back to 30 days: the leader folds a workload's minutes into hours
//! once an hour ([`TelemetryStore::fold_telemetry`], the minutes of the hours before the one
//! the day starts in, an hour per transaction that reads only that hour, from where it folded
//! last; a new leader starts 30 days back, mostly empty hours), and forgets what started before the hour the 30 days start in
//! ([`TelemetryStore::prune_telemetry`]). So a workload has at most 1,440 + 119 minute rows
//! (the day, the hour it starts in, an hour not yet folded) and 698 hour rows: 2,257 rows, for
//! one that reported all month; one that ran an hour has at most 60 minute rows for a day,
//! then one row. Measured on SQLite (`WITHOUT ROWID`, the key is the table; 557,000 rows of
//! workloads and pools in 25.8 MB after `VACUUM`), a row takes about 46 bytes: about 104 KB a
//! workload that reported all month, 2.0 MB a pool; at [`crate::workload_history::MAX_SERIES`]
//! (10,000) such workloads, the most memory keeps, 22.6 million rows, about 1.04 GB. On
//! PostgreSQL (a heap and a separate key index; the same rows after `VACUUM FULL`: 49.7 MB of
//! table, 27.7 MB of index) a row takes about 139 bytes: about 314 KB a workload, 6.0 MB a
//! pool, 3.1 GB for 10,000 workloads. Each minute writes one row per pool with utilisation
//! and one per workload reporting.
//!
//! Measured at that bound by `tessera bench telemetry` (release build; `--workloads 10000
//! --days 30 --pools 3`, the defaults: 22,679,957 rows, 2,255 a workload — 1,559 minutes and
//! 696 hours — and 43,319 a pool, written through [`TelemetryStore::append_telemetry`]; on a
//! shared 2-core virtual machine, PostgreSQL 15 on the same machine with its default settings,
//! `--database postgres://…`; the reads an hour at a time throughout, 721 of them, before
//! [`read_span`] read the hours a day at a time). On SQLite the fill wrote 250,000 to
//! 293,000 rows/s (90 s, 77 s), the start-up read took 69 to 82 s (at most 600,180 rows and
//! 2.1 to 3.7 s a read), and the process peaked at 1.5 GB (64 MB before the read); one hour's
//! fold (600,000 minutes into 10,000 hours) took 0.51 to 0.55 s, and another writer waited as
//! long for SQLite's write lock; the prune of one hour (10,180 rows) 0.17 to 0.18 s. On
//! PostgreSQL the fill wrote 77,000 to 93,000 rows/s (296 s, 244 s), the read took 26 and
//! 47 s (at most 1.3 and 1.95 s a read), peak 1.1 GB; the fold 0.69 and 0.82 s (another
//! writer waited at most 0.01 s: row locks), the prune 0.011 and 0.008 s. Putting the rows
//! back in memory ([`restore`]) is not in those figures. Read a day at a time throughout, as
//! it was, the last day alone was 14.4 million rows in one read: at 1,000 workloads (1.44
//! million rows) the process peaked at 1.7 GB on SQLite, so about 16 GB at 10,000 (not run).
//! With [`read_span`] as it is, SQLite's worker reading 4,096 rows ahead (sqlx's default, 50,
//! handed rows over nearly one at a time) and a restored minute finding its hour by a search
//! (it scanned up to 720 hours), the same bench at 10,000 workloads read the 22.7 million rows
//! in 77 reads in 39.9 s and put them back in memory in 21.1 s (the process at 1.89 GB after:
//! above the histories' own bound, the rest being what the read's buffers left with the
//! allocators), and at 1,000 workloads in 4.3–4.5 s and 1.1 s; with a record that goes after
//! its series' last one appended without a search, the restore took 3.2 s at 10,000 workloads
//! (read 44.9 s, 1.87 GB after) and 0.24 s at 1,000. The read runs beside the sampler, so the
//! server samples and serves meanwhile.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tessera_model::Fleet;
use tessera_store::{TelemetryRecord, TelemetrySeries, TelemetryStore, UsageInterval};

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

pub const MINUTE_MS: i64 = 60_000;
pub const HOUR_MS: i64 = 60 * MINUTE_MS;
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

    /// The first minute the window covers, at `now`: the first minute of its span
    /// ([`Window::minutes`] back from `now`'s minute, that one included) that starts a bucket.
    /// A window of minutes covers exactly its span; a window of hours covers the clock's hours
    /// (UTC) that start within its span, up to `now` — so its first hour is whole, and none of
    /// its points takes minutes from before the span (which the hours a workload keeps, folded
    /// whole, could not leave out).
    pub fn start(self, now: i64) -> i64 {
        let bucket = self.bucket_minutes() as i64 * MINUTE_MS;
        let first = minute(now) - (self.minutes() as i64 - 1) * MINUTE_MS;
        first + (bucket - first.rem_euclid(bucket)) % bucket
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

    /// A pool's samples within `window` before `now` (from [`Window::start`] to the current
    /// minute, included), in buckets of [`Window::bucket_minutes`] starting on the clock's
    /// minutes or hours (UTC), each within the window: a bucket without any sample is left out.
    pub fn window(&self, pool: &str, window: Window, now: i64) -> Vec<Point> {
        let bucket = window.bucket_minutes() as i64 * MINUTE_MS;
        let last = minute(now);
        let first = window.start(now);
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

    /// Adds one sample per pool (a sample for a minute already recorded replaces it, keeping
    /// its utilisation if the new one has none), dropping what is older than 30 days.
    pub fn record(&self, samples: impl IntoIterator<Item = (String, Sample)>) {
        let mut pools = self.pools.write().expect("lock");
        for (pool, s) in samples {
            let q = pools.entry(pool).or_default();
            match q.back_mut() {
                Some(last) if last.at == s.at => {
                    *last = Sample {
                        util_pct: s.util_pct.or(last.util_pct),
                        ..s
                    }
                }
                Some(last) if last.at > s.at => continue,
                _ => q.push_back(s),
            }
            while q.len() > KEPT || q.front().is_some_and(|f| f.at <= s.at - KEPT as i64 * MINUTE_MS) {
                q.pop_front();
            }
        }
    }

    /// Sets the utilisation of the minutes recorded for each pool (the store's, read back) where
    /// they have none, or (`store_wins`: a follower's read of what the leader stored, which
    /// takes a minute's later samples) in any case; a minute not recorded (no sample of its
    /// allocation) is left out.
    pub fn restore_util(&self, utils: impl IntoIterator<Item = (String, i64, f64)>, store_wins: bool) {
        let mut pools = self.pools.write().expect("lock");
        for (pool, at, util) in utils {
            let Some(q) = pools.get_mut(&pool) else {
                continue;
            };
            let i = q.partition_point(|s| s.at < at);
            if let Some(s) = q.get_mut(i).filter(|s| s.at == at) {
                s.util_pct = if store_wins {
                    Some(util)
                } else {
                    s.util_pct.or(Some(util))
                };
            }
        }
    }
}

/// The minute `ms` falls in.
pub fn minute(ms: i64) -> i64 {
    ms - ms.rem_euclid(MINUTE_MS)
}

/// The hour `ms` falls in.
pub fn hour(ms: i64) -> i64 {
    ms - ms.rem_euclid(HOUR_MS)
}

/// The hour the last `minutes` minutes up to `now` start in (those of the last day, 1,440: the
/// workloads' minutes kept; of the last 30 days, [`KEPT`]: everything kept).
pub fn first_hour_of(now: i64, minutes: i64) -> i64 {
    hour(minute(now) - (minutes - 1) * MINUTE_MS)
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

/// The records of this minute's samples that carry telemetry, for the store: each pool with a
/// utilisation, each workload.
pub fn records(
    pools: &[(String, Sample)],
    workloads: &[(u64, crate::workload_history::Sample)],
) -> Vec<TelemetryRecord> {
    let pools = pools.iter().filter_map(|(pool, s)| {
        Some(TelemetryRecord {
            series: TelemetrySeries::Pool(pool.clone()),
            at: s.at,
            span_minutes: 1,
            minutes: 1,
            util_sum: Some(s.util_pct?),
            used_mib_sum: None,
            total_mib: None,
        })
    });
    let workloads = workloads.iter().map(|(id, s)| TelemetryRecord {
        series: TelemetrySeries::Workload(*id),
        at: s.at,
        span_minutes: 1,
        minutes: 1,
        util_sum: Some(f64::from(s.util_pct)),
        used_mib_sum: Some(f64::from(s.used_mib)),
        total_mib: Some(u64::from(s.total_mib)),
    });
    pools.chain(workloads).collect()
}

/// Puts stored records back in memory as of `now`: each pool's utilisation into its recorded
/// minutes ([`History::restore_util`]), each workload's minutes and hours
/// ([`crate::workload_history::WorkloadHistory::restore`]). A record that says nothing it can
/// use (a pool's minute without utilisation, a workload's without figures) is skipped. Where
/// memory already has a minute, `store_wins` says which figures stay: the store's (a
/// follower, whose memory holds only what it read before, while the leader writes a minute
/// again as it samples it again) or memory's (the leader, whose memory is its own sampling).
pub fn restore(
    history: &History,
    workloads: &crate::workload_history::WorkloadHistory,
    records: Vec<TelemetryRecord>,
    now: i64,
    store_wins: bool,
) {
    use crate::workload_history::{Hour, Sample as Minute};
    let (mut utils, mut minutes, mut hours) = (Vec::new(), Vec::new(), Vec::new());
    for r in records {
        match r.series {
            TelemetrySeries::Pool(pool) => {
                if let (1, Some(u)) = (r.span_minutes, r.util_sum) {
                    utils.push((pool, r.at, u));
                }
            }
            TelemetrySeries::Workload(id) => {
                let (Some(util), Some(used), Some(total)) = (r.util_sum, r.used_mib_sum, r.total_mib) else {
                    continue;
                };
                let total = u32::try_from(total).unwrap_or(u32::MAX);
                if r.span_minutes == 1 {
                    minutes.push((
                        id,
                        Minute {
                            at: r.at,
                            util_pct: util as f32,
                            used_mib: used as u32,
                            total_mib: total,
                        },
                    ));
                } else if r.minutes > 0 {
                    hours.push((
                        id,
                        Hour {
                            at: r.at,
                            util_sum: util,
                            used_sum: used,
                            total_mib: total,
                            minutes: r.minutes,
                        },
                    ));
                }
            }
        }
    }
    history.restore_util(utils, store_wins);
    workloads.restore(now, minutes, hours, store_wins);
}

/// Writes this minute's `records` to the store; a failure is logged, and nothing else: the
/// history in memory is what the charts show.
async fn persist<S: TelemetryStore + ?Sized>(store: &S, records: &[TelemetryRecord]) {
    if records.is_empty() {
        return;
    }
    if let Err(e) = store.append_telemetry(records).await {
        tracing::warn!(error = %e, rows = records.len(), "telemetry not stored (kept in memory)");
    }
}

/// Once an hour (the leader): folds the workloads' minutes older than the day's first hour
/// into hours, an hour per transaction from `folded` (up to where it folded last; `None`: the
/// 30 days' first hour), so that no write holds the database for more than an hour of
/// minutes and none reads the month of hour rows before its span; and forgets what started
/// before the 30 days' first hour. Returns up to where it has folded (where a fold failed:
/// the next run starts there).
async fn maintain<S: TelemetryStore + ?Sized>(store: &S, now: i64, folded: Option<i64>) -> Option<i64> {
    let day = first_hour_of(now, 1_440);
    let month = first_hour_of(now, KEPT as i64);
    let mut from = folded.unwrap_or(month).max(month);
    while from < day {
        if let Err(e) = store.fold_telemetry(from, from + HOUR_MS).await {
            tracing::warn!(error = %e, "telemetry older than a day not folded into hours");
            break;
        }
        from += HOUR_MS;
        tokio::task::yield_now().await;
    }
    if let Err(e) = store.prune_telemetry(month).await {
        tracing::warn!(error = %e, "telemetry older than 30 days not pruned");
    }
    Some(from)
}

/// How much stored telemetry [`read_back`] reads at once from `at` on, at `now`: a day where
/// only hours of workloads can be stored (up to the hour before the one the last day starts
/// in: 24 rows a workload, 240,000 at 10,000 workloads), an hour from there on, where the
/// workloads' minutes are (600,000 rows an hour at 10,000 workloads). Read a day at a time
/// throughout, the last day was 14.4 million rows in one read: about 16 GB at the process's
/// peak on SQLite, going by 1.7 GB measured at 1,000 workloads (see the module's
/// documentation); read an hour at a time throughout, a start made 721 reads, most of them
/// of a few rows, which on PostgreSQL took seconds on an empty store.
pub fn read_span(at: i64, now: i64) -> i64 {
    const DAY_MS: i64 = 1_440 * MINUTE_MS;
    // The minutes not folded yet start in the hour before the day's first hour.
    let minutes = first_hour_of(now, 1_440) - HOUR_MS;
    if at + DAY_MS <= minutes { DAY_MS } else { HOUR_MS }
}

/// Reads the stored telemetry from `from` on into the histories, [`read_span`] at a time (at
/// most a day of hours or an hour of minutes in memory at once besides the histories); `Err`
/// at the first span that could not be read. `store_wins`: as [`restore`].
async fn read_back(
    s: &crate::state::AppState,
    from: i64,
    now: i64,
    store_wins: bool,
) -> Result<(), tessera_store::StoreError> {
    let mut at = from;
    while at <= now {
        let span = read_span(at, now);
        let records = s.store.telemetry_between(at, at + span).await?;
        restore(&s.history, &s.workload_history, records, now, store_wins);
        at += span;
    }
    Ok(())
}

/// How often the sampler samples: every minute, on the minute (`None`), or every `every` (a
/// test's, so that it need not wait minutes; each sample is still of its minute).
fn next_sample(now: i64, every: Option<Duration>) -> Duration {
    match every {
        Some(every) => every,
        None => Duration::from_millis((MINUTE_MS - now.rem_euclid(MINUTE_MS)) as u64 + 50),
    }
}

/// Rebuilds the last 30 days of allocation from the ledger, then samples every minute (the
/// pools, and each workload's GPUs: [`crate::workload_history`]), storing what it sampled (or,
/// without telemetry, reading what the leader stored), while the stored telemetry of the last
/// 30 days is read back beside it; see the module's documentation.
pub fn spawn(s: crate::state::AppState, every: Option<Duration>) {
    tokio::spawn(async move {
        let start = crate::clock::now_ms();
        match s
            .store
            .usage_between(None, start - KEPT as i64 * MINUTE_MS, start)
            .await
        {
            Ok(intervals) => s.history.record(rebuild(&s.fleet(), &intervals, start)),
            Err(e) => tracing::warn!(error = %e, "allocation history not rebuilt from the usage ledger"),
        }
        let since = start - KEPT as i64 * MINUTE_MS;
        // The stored 30 days are read beside the sampling, not before it: at 10,000 workloads
        // that read takes a minute or more, and the minutes sampled meanwhile would be lost.
        // What the sampler records first stays (`store_wins` false: it is as new or newer).
        let mut first_read = Some(tokio::spawn({
            let s = s.clone();
            async move {
                let started = std::time::Instant::now();
                let read = read_back(&s, hour(since), start, false).await;
                if read.is_ok() {
                    tracing::info!(
                        seconds = started.elapsed().as_secs_f64(),
                        "stored telemetry of the last 30 days read back"
                    );
                }
                read
            }
        }));
        // Up to when the store was read (`None`: never, read it all); unknown while the first
        // read runs.
        let mut read_to: Option<i64> = None;
        let mut maintained: Option<i64> = None;
        let mut folded: Option<i64> = None;
        loop {
            let now = crate::clock::now_ms();
            let (snap, telemetry) = (s.lifecycle.snapshot(), s.lifecycle.published().telemetry());
            let pools = sample(&snap, &telemetry, now);
            let workloads = crate::workload_history::sample(&snap, &telemetry, now);
            let stored = records(&pools, &workloads);
            s.history.record(pools);
            s.workload_history.record(now, workloads);
            persist(s.store.as_ref(), &stored).await;
            let leading = s.replica.is_leader();
            if leading && maintained.is_none_or(|at| now - at >= HOUR_MS) {
                folded = maintain(s.store.as_ref(), now, folded).await;
                maintained = Some(now);
            }
            if let Some(read) = first_read.take_if(|r| r.is_finished()) {
                let read = read.await.map_err(|e| e.to_string());
                read_to = match read.and_then(|r| r.map_err(|e| e.to_string())) {
                    Ok(()) => Some(start),
                    Err(e) => {
                        tracing::warn!(error = %e, "stored telemetry not read back");
                        None
                    }
                };
            }
            if first_read.is_none() && (!leading || read_to.is_none()) {
                // What the leader stored since the last read (the minute before it included: it
                // may have been written after that read); all of it while the store could not
                // be read yet (the leader too).
                let from = read_to.map_or(since, |at| minute(at) - MINUTE_MS);
                match read_back(&s, from, now, !leading).await {
                    Ok(()) => read_to = Some(now),
                    Err(e) => tracing::warn!(error = %e, "the leader's telemetry not read"),
                }
            }
            tokio::time::sleep(next_sample(crate::clock::now_ms(), every)).await;
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

    #[test]
    fn an_hourly_windows_buckets_are_whole_hours_within_it() {
        let h = History::default();
        let base = 1_000 * 60 * MINUTE_MS; // on an hour
        // Eight days of minutes; the allocation is the hour's index, so a bucket that took
        // minutes of two hours would not be a whole number.
        let n = 8 * 1_440 + 30;
        h.record((0..n).map(|m| {
            (
                "p".to_string(),
                Sample {
                    at: base + m * MINUTE_MS,
                    allocated: (m / 60) as f64,
                    util_pct: Some((m / 60) as f64),
                },
            )
        }));
        let now = base + (n - 1) * MINUTE_MS + 10_000;
        let start = Window::Week.start(now);
        assert_eq!(start.rem_euclid(HOUR_MS), 0, "an hour's start");
        assert!(start >= minute(now) - (7 * 1_440 - 1) * MINUTE_MS, "within the 7 days");
        assert!(
            start - HOUR_MS < minute(now) - (7 * 1_440 - 1) * MINUTE_MS,
            "the first such hour"
        );
        let week = h.window("p", Window::Week, now);
        assert_eq!(week.len(), 168, "the 167 whole hours and this one's half");
        assert_eq!(week[0].at, start, "no bucket starts before the window");
        assert!(
            week.iter()
                .all(|p| p.allocated.fract() == 0.0 && p.util_pct.unwrap().fract() == 0.0),
            "each point is one clock hour's minutes: {:?}",
            &week[..2]
        );
        assert_eq!(week[0].allocated, ((start - base) / HOUR_MS) as f64);
        // A window of minutes is exactly its minutes.
        assert_eq!(Window::Day.start(now), minute(now) - 1_439 * MINUTE_MS);
        let day = h.window("p", Window::Day, now);
        assert_eq!((day.len(), day[0].at), (1_440, Window::Day.start(now)));
    }

    #[test]
    fn a_sample_without_utilisation_keeps_the_minutes_utilisation() {
        let h = History::default();
        let s = |a: f64, u: Option<f64>| {
            (
                "p".to_string(),
                Sample {
                    at: 5 * MINUTE_MS,
                    allocated: a,
                    util_pct: u,
                },
            )
        };
        h.record([s(1.0, Some(40.0))]);
        h.record([s(2.0, None)]);
        assert_eq!(
            h.series("p"),
            [s(2.0, Some(40.0)).1],
            "the new allocation, the known utilisation"
        );
        h.record([s(3.0, Some(10.0))]);
        assert_eq!(h.series("p")[0].util_pct, Some(10.0), "a new utilisation replaces it");
    }

    #[test]
    fn stored_records_restore_what_the_charts_showed() {
        use crate::workload_history::{Sample as Minute, WorkloadHistory};
        let base = 1_000 * 60 * MINUTE_MS;
        let n = 2 * 1_440 + 30;
        let now = base + (n - 1) * MINUTE_MS;
        // What a server sampled for two days: pool `p` with utilisation in odd minutes only,
        // workload 3 every minute. Each minute's records, as the sampler stores them.
        let (pools, workloads) = (History::default(), WorkloadHistory::default());
        let mut stored = Vec::new();
        for m in 0..n {
            let at = base + m * MINUTE_MS;
            let p = vec![(
                "p".to_string(),
                Sample {
                    at,
                    allocated: 1.0,
                    util_pct: (m % 2 == 1).then_some(m as f64 % 100.0),
                },
            )];
            let w = vec![(
                3,
                Minute {
                    at,
                    util_pct: (m % 60) as f32,
                    used_mib: m as u32,
                    total_mib: 1_000 + (m % 7) as u32,
                },
            )];
            stored.extend(records(&p, &w));
            pools.record(p);
            workloads.record(at, w);
        }
        assert_eq!(
            stored.len() as i64,
            n + n / 2,
            "pools' minutes without utilisation are not stored"
        );
        // A restart: the allocation comes back from the ledger (here: the same, without
        // utilisation), the rest from the store.
        let (pools2, workloads2) = (History::default(), WorkloadHistory::default());
        pools2.record((0..n).map(|m| {
            (
                "p".to_string(),
                Sample {
                    at: base + m * MINUTE_MS,
                    allocated: 1.0,
                    util_pct: None,
                },
            )
        }));
        restore(&pools2, &workloads2, stored.clone(), now, true);
        assert_eq!(pools2.series("p"), pools.series("p"));
        for w in Window::ALL {
            assert_eq!(pools2.window("p", w, now), pools.window("p", w, now), "{w:?}");
            assert_eq!(workloads2.window(3, w, now), workloads.window(3, w, now), "{w:?}");
        }
        assert_eq!(workloads2.minutes(3), workloads.minutes(3));
        // Restoring the same records again (a follower reads some twice) changes nothing.
        restore(&pools2, &workloads2, stored.clone(), now, true);
        assert_eq!(workloads2.minutes(3), workloads.minutes(3));
        assert_eq!(workloads2.hours(3), workloads.hours(3));
        // The leader sampled the last minute again (its GPUs busy by then) and stored it again:
        // a follower that read the first figures takes the later ones; the leader's own memory
        // (not `store_wins`) keeps its sample over the store's.
        let last = stored.iter().filter(|r| r.at == now).cloned();
        let later: Vec<TelemetryRecord> = last
            .map(|r| TelemetryRecord {
                util_sum: Some(97.0),
                ..r
            })
            .collect();
        assert_eq!(later.len(), 2, "the pool's and the workload's");
        restore(&pools2, &workloads2, later.clone(), now, false);
        assert_eq!(workloads2.minutes(3), workloads.minutes(3), "memory's stays");
        assert_eq!(pools2.series("p"), pools.series("p"));
        restore(&pools2, &workloads2, later, now, true);
        assert_eq!(
            workloads2.minutes(3).last().map(|m| (m.at, m.util_pct)),
            Some((now, 97.0))
        );
        assert_eq!(
            pools2.series("p").last().map(|s| (s.at, s.util_pct)),
            Some((now, Some(97.0)))
        );
        let n = workloads.minutes(3).len();
        assert_eq!(
            workloads2.minutes(3)[..n - 1],
            workloads.minutes(3)[..n - 1],
            "nothing else"
        );
    }
}
