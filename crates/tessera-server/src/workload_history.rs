//! GPU telemetry per workload, for the console's workload page: what each device a workload
//! holds (a whole GPU, a MIG instance, a time-sliced share) reports now ([`readings`]), and —
//! kept in memory like the pools' [`crate::history`] — one sample a minute of its mean
//! utilisation and its memory in use, read back over a [`Window`] ([`WorkloadHistory::window`]).
//!
//! The bound: a workload has telemetry kept only while the backend reports some for it and for
//! 30 days after (the longest window); then it is forgotten. Of those 30 days it keeps the last
//! day minute by minute (at most 1,440 samples of 24 bytes) and the rest as hours (at most 697
//! of 32 bytes) — what the 7- and 30-day windows show anyway: at most about 58 KB of samples a
//! workload, whatever it ran, in queues whose capacity (they grow by doubling) can reach about
//! 81 KB. At most [`MAX_SERIES`] workloads are kept (about 580 MB of samples, 810 MB with that
//! capacity, at the very most); past that the ones that stopped reporting longest ago go first.
//! Measured by `tessera bench telemetry` (the month restored from the store at start): the
//! process grew by about 160 KB a workload at 1,000 workloads and held 1.89 GB after restoring
//! 10,000 — the histories plus what the allocators kept of the read's buffers (an hour of
//! minutes, 600,000 rows at 10,000 workloads).
//!
//! The samples are also stored, and read back at start ([`WorkloadHistory::restore`]), so a
//! restart or a failover loses at most the last minute or two; the store keeps the same shape
//! (a day of minutes, then hours): see [`crate::history`] for how and its bound.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::RwLock;

use tessera_sched::Grant;

use crate::history::{KEPT, Window, minute};
use crate::lifecycle::snapshot::{Snapshot, Telemetry};

const MINUTE_MS: i64 = 60_000;
/// Telemetry older than this is not sampled as this minute's.
const FRESH_MS: i64 = 2 * MINUTE_MS;
/// The most workloads whose series are kept.
pub const MAX_SERIES: usize = 10_000;

/// One device of a workload in one telemetry sample.
#[derive(Clone, Debug, PartialEq)]
pub struct Reading {
    pub node: String,
    pub gpu: u8,
    /// `GPU`, `MIG 3g.40gb (instance 2)` or `share of the GPU`.
    pub device: String,
    /// The GPU's utilisation for a whole GPU; the engines' activity (DCGM's
    /// `GR_ENGINE_ACTIVE`) for an instance or share; percent.
    pub util_pct: f64,
    pub used_mib: u64,
    /// The device's memory (in use and free), MiB.
    pub total_mib: u64,
}

/// The devices of every workload in `t`: a GPU that no instance names a holder of is read as
/// a whole GPU of the workload `whole_of` says holds it (none: not read); each instance or
/// share names its own holder.
pub fn readings(t: &Telemetry, whole_of: impl Fn(&str, u8) -> Option<u64>) -> BTreeMap<u64, Vec<Reading>> {
    let mut out: BTreeMap<u64, Vec<Reading>> = BTreeMap::new();
    for g in t.gpus.iter() {
        if g.instances.iter().all(|i| i.workload == 0) {
            if let Some(id) = whole_of(&g.node, g.gpu) {
                out.entry(id).or_default().push(Reading {
                    node: g.node.clone(),
                    gpu: g.gpu,
                    device: "GPU".into(),
                    util_pct: g.util_pct,
                    used_mib: g.fb_used_mib,
                    total_mib: g.fb_used_mib + g.fb_free_mib,
                });
            }
            continue;
        }
        for i in g.instances.iter().filter(|i| i.workload != 0) {
            out.entry(i.workload).or_default().push(Reading {
                node: g.node.clone(),
                gpu: g.gpu,
                device: if i.profile.is_empty() {
                    "share of the GPU".into()
                } else {
                    format!("MIG {} (instance {})", i.profile, i.instance_id)
                },
                util_pct: i.gr_engine_active * 100.0,
                used_mib: i.fb_used_mib,
                total_mib: i.fb_used_mib + i.fb_free_mib,
            });
        }
    }
    out
}

/// One minute of a workload: the mean utilisation of its devices and their memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// The minute, ms since the epoch.
    pub at: i64,
    pub util_pct: f32,
    pub used_mib: u32,
    pub total_mib: u32,
}

impl Sample {
    /// The sample of `devices` (none: no sample) at minute `at`.
    pub fn of(at: i64, devices: &[Reading]) -> Option<Sample> {
        if devices.is_empty() {
            return None;
        }
        let util = devices.iter().map(|d| d.util_pct).sum::<f64>() / devices.len() as f64;
        let clamp = |mib: u64| u32::try_from(mib).unwrap_or(u32::MAX);
        Some(Sample {
            at,
            util_pct: util as f32,
            used_mib: clamp(devices.iter().map(|d| d.used_mib).sum()),
            total_mib: clamp(devices.iter().map(|d| d.total_mib).sum()),
        })
    }
}

/// This minute's sample of every workload the latest telemetry (no older than two minutes)
/// reports; the whole GPUs are attributed by the snapshot's holders.
pub fn sample(snap: &Snapshot, t: &Telemetry, now: i64) -> Vec<(u64, Sample)> {
    if t.at <= 0 || now - t.at > FRESH_MS {
        return Vec::new();
    }
    let mut whole: HashMap<(&str, u8), u64> = HashMap::new();
    for (n, ns) in snap.fleet.nodes.iter().zip(snap.nodes.iter()) {
        for (g, gs) in ns.gpus.iter().enumerate() {
            for h in gs.holders.iter().filter(|h| matches!(h.grant, Grant::Whole { .. })) {
                whole.insert((n.name.as_str(), g as u8), h.workload);
            }
        }
    }
    readings(t, |node, gpu| whole.get(&(node, gpu)).copied())
        .into_iter()
        .filter_map(|(id, ds)| Some((id, Sample::of(minute(now), &ds)?)))
        .collect()
}

/// One point of a workload's [`Window`]: a minute, or an hour's minutes taken together.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub at: i64,
    /// Mean over the bucket's samples.
    pub util_pct: f64,
    pub used_mib: f64,
    /// The most memory its devices had in one of the minutes.
    pub total_mib: u32,
}

/// An hour of a workload's minutes older than a day, taken together.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hour {
    /// The hour's start, ms since the epoch.
    pub at: i64,
    pub util_sum: f64,
    pub used_sum: f64,
    /// The most memory its devices had in one of the minutes.
    pub total_mib: u32,
    /// How many minutes it takes together.
    pub minutes: u32,
}

/// One workload's telemetry: its minutes of the last day, then its hours back to 30 days.
#[derive(Default)]
struct Series {
    minutes: VecDeque<Sample>,
    hours: VecDeque<Hour>,
}

impl Series {
    fn newest(&self) -> i64 {
        self.minutes
            .back()
            .map(|s| s.at)
            .or(self.hours.back().map(|h| h.at))
            .unwrap_or(i64::MIN)
    }

    /// Folds the minutes before `day` (the last day's first minute) into their hours and drops
    /// the hours that end before `month` (the last 30 days' first minute).
    fn age(&mut self, day: i64, month: i64) {
        while let Some(s) = self.minutes.front().copied().filter(|s| s.at < day) {
            self.minutes.pop_front();
            let at = s.at - s.at.rem_euclid(HOUR_MS);
            // Its hour is the last one but where hours were restored after it.
            let i = self.hours.partition_point(|h| h.at < at);
            match self.hours.get_mut(i) {
                Some(h) if h.at == at => {
                    h.util_sum += f64::from(s.util_pct);
                    h.used_sum += f64::from(s.used_mib);
                    h.total_mib = h.total_mib.max(s.total_mib);
                    h.minutes += 1;
                }
                _ => self.hours.insert(
                    i,
                    Hour {
                        at,
                        util_sum: f64::from(s.util_pct),
                        used_sum: f64::from(s.used_mib),
                        total_mib: s.total_mib,
                        minutes: 1,
                    },
                ),
            }
        }
        while self.hours.front().is_some_and(|h| h.at + HOUR_MS <= month) {
            self.hours.pop_front();
        }
    }
}

const HOUR_MS: i64 = 60 * MINUTE_MS;
/// A day of minutes.
const DAY_MINUTES: i64 = 1_440;

/// The telemetry of every workload that reported any in the last 30 days: per workload its
/// minutes of the last day (at most 1,440 samples) and, older, its hours (at most 697, each
/// 32 bytes): at most about 58 KB a workload.
#[derive(Default)]
pub struct WorkloadHistory {
    series: RwLock<HashMap<u64, Series>>,
}

impl WorkloadHistory {
    /// A workload's minutes of the last day, oldest first.
    pub fn minutes(&self, id: u64) -> Vec<Sample> {
        self.series
            .read()
            .expect("lock")
            .get(&id)
            .map(|q| q.minutes.iter().copied().collect())
            .unwrap_or_default()
    }

    /// A workload's hours before the last day, oldest first.
    pub fn hours(&self, id: u64) -> Vec<Hour> {
        self.series
            .read()
            .expect("lock")
            .get(&id)
            .map(|q| q.hours.iter().copied().collect())
            .unwrap_or_default()
    }

    /// How many workloads have telemetry kept.
    pub fn workloads(&self) -> usize {
        self.series.read().expect("lock").len()
    }

    /// Adds this minute's samples (a sample for a minute already recorded replaces it), then
    /// ages every series as of `now`: minutes older than a day are folded into their hours,
    /// hours older than 30 days dropped, and a workload with nothing left forgotten; past
    /// [`MAX_SERIES`], the workloads whose newest sample is oldest are forgotten.
    pub fn record(&self, now: i64, samples: impl IntoIterator<Item = (u64, Sample)>) {
        let mut all = self.series.write().expect("lock");
        for (id, s) in samples {
            let q = &mut all.entry(id).or_default().minutes;
            match q.back_mut() {
                Some(last) if last.at == s.at => *last = s,
                Some(last) if last.at > s.at => continue,
                _ => q.push_back(s),
            }
        }
        Self::tidy(&mut all, now);
    }

    /// Puts stored minutes and hours back (the store's, read back at start or from the leader):
    /// each where it belongs in time, unless the workload already has that hour, or that
    /// minute and not `store_wins` (the leader: memory's minute is its own sample, as new or
    /// newer; a follower's is what it read before, and the leader may have written that minute
    /// again since); then ages every series as [`WorkloadHistory::record`] does.
    pub fn restore(
        &self,
        now: i64,
        minutes: impl IntoIterator<Item = (u64, Sample)>,
        hours: impl IntoIterator<Item = (u64, Hour)>,
        store_wins: bool,
    ) {
        let mut all = self.series.write().expect("lock");
        // The store reads in time order, so a record mostly goes after the series' last one:
        // that is checked first, without a search (each series' minutes and hours are
        // thousands of cache lines apart; a search per record of 10,000 workloads' month
        // costs a cache miss per step).
        for (id, h) in hours {
            place(&mut all.entry(id).or_default().hours, h, |h| h.at, false);
        }
        for (id, s) in minutes {
            let q = all.entry(id).or_default();
            // A minute of an hour already kept whole is in it.
            let hour = s.at - s.at.rem_euclid(HOUR_MS);
            // (The hours are in time order: a search, not a scan of up to 720 hours a minute,
            // and none where the last hour is before the minute's.)
            let whole =
                q.hours.back().is_some_and(|h| h.at >= hour) && q.hours.binary_search_by_key(&hour, |h| h.at).is_ok();
            if whole && q.minutes.front().is_none_or(|m| s.at < m.at) {
                continue;
            }
            place(&mut q.minutes, s, |s| s.at, store_wins);
        }
        Self::tidy(&mut all, now);
    }

    /// Ages every series as of `now` and keeps at most [`MAX_SERIES`] of them.
    fn tidy(all: &mut HashMap<u64, Series>, now: i64) {
        let last = minute(now);
        let day = last - (DAY_MINUTES - 1) * MINUTE_MS;
        let month = last - (KEPT as i64 - 1) * MINUTE_MS;
        all.retain(|_, q| {
            q.age(day, month);
            !(q.minutes.is_empty() && q.hours.is_empty())
        });
        if all.len() > MAX_SERIES {
            let mut newest: Vec<(i64, u64)> = all.iter().map(|(id, q)| (q.newest(), *id)).collect();
            newest.sort_unstable();
            for (_, id) in newest.iter().take(all.len() - MAX_SERIES) {
                all.remove(id);
            }
        }
    }

    /// A workload's telemetry within `window` before `now`, in buckets of
    /// [`Window::bucket_minutes`]: from [`Window::start`] (for the 7- and 30-day windows, the
    /// first clock hour that starts within them, so the hours kept whole fall within the window
    /// and none takes minutes from before it) to the current minute, included; a bucket
    /// without any sample is left out.
    pub fn window(&self, id: u64, window: Window, now: i64) -> Vec<Point> {
        let bucket = window.bucket_minutes() as i64 * MINUTE_MS;
        let last = minute(now);
        let first = window.start(now);
        let all = self.series.read().expect("lock");
        let Some(q) = all.get(&id) else {
            return Vec::new();
        };
        // Per bucket: its start, the sums of utilisation and memory in use, the minutes, the
        // most memory.
        type Acc = (i64, f64, f64, u32, u32);
        let mut out: Vec<Acc> = Vec::new();
        let mut add = |b: i64, util: f64, used: f64, n: u32, total: u32| match out.last_mut() {
            Some(a) if a.0 == b => {
                a.1 += util;
                a.2 += used;
                a.3 += n;
                a.4 = a.4.max(total);
            }
            _ => out.push((b, util, used, n, total)),
        };
        if bucket >= HOUR_MS {
            for h in q.hours.iter().filter(|h| h.at >= first && h.at <= last) {
                add(
                    h.at - h.at.rem_euclid(bucket),
                    h.util_sum,
                    h.used_sum,
                    h.minutes,
                    h.total_mib,
                );
            }
        }
        let from = q.minutes.partition_point(|s| s.at < first);
        for s in q.minutes.range(from..).take_while(|s| s.at <= last) {
            add(
                s.at - s.at.rem_euclid(bucket),
                f64::from(s.util_pct),
                f64::from(s.used_mib),
                1,
                s.total_mib,
            );
        }
        out.into_iter()
            .map(|a| Point {
                at: a.0,
                util_pct: a.1 / f64::from(a.3),
                used_mib: a.2 / f64::from(a.3),
                total_mib: a.4,
            })
            .collect()
    }
}

/// Puts `x` into `q`, kept in time order (`at`), unless `q` has a record of that time already:
/// then `x` takes its place if `replace`. A record after the last one (the store reads in time
/// order, so most are) is appended without a search.
fn place<T>(q: &mut VecDeque<T>, x: T, at: impl Fn(&T) -> i64, replace: bool) {
    let t = at(&x);
    if q.back().is_none_or(|last| at(last) < t) {
        q.push_back(x);
        return;
    }
    let i = q.partition_point(|y| at(y) < t);
    match q.get_mut(i) {
        Some(y) if at(y) == t => {
            if replace {
                *y = x;
            }
        }
        _ => q.insert(i, x),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_backend::{GpuSample, InstanceSample};

    fn gpu(node: &str, i: u8, util: f64, used: u64, instances: Vec<InstanceSample>) -> GpuSample {
        GpuSample {
            node: node.into(),
            gpu: i,
            uuid: String::new(),
            model: "A100".into(),
            util_pct: util,
            fb_used_mib: used,
            fb_free_mib: 80_000 - used,
            temp_c: 40.0,
            power_w: 200.0,
            xid: 0,
            instances,
        }
    }

    fn inst(workload: u64, profile: &str, active: f64, used: u64) -> InstanceSample {
        InstanceSample {
            workload,
            profile: profile.into(),
            instance_id: 2,
            gr_engine_active: active,
            fb_used_mib: used,
            fb_free_mib: 10_000 - used,
        }
    }

    fn telemetry(at: i64) -> Telemetry {
        Telemetry {
            at,
            gpus: std::sync::Arc::new(vec![
                // Whole GPUs of workload 5 on two nodes.
                gpu("a", 0, 90.0, 40_000, Vec::new()),
                gpu("b", 3, 50.0, 20_000, Vec::new()),
                // A GPU no one holds whole.
                gpu("a", 1, 0.0, 0, Vec::new()),
                // A MIG instance of 7 and a share of 8 on the same GPU.
                gpu(
                    "a",
                    2,
                    70.0,
                    9_000,
                    vec![inst(7, "1g.10gb", 0.25, 4_000), inst(8, "", 0.5, 5_000)],
                ),
            ]),
        }
    }

    #[test]
    fn each_device_is_read_as_its_holder_holds_it() {
        let t = telemetry(1_000);
        let whole = |node: &str, gpu: u8| matches!((node, gpu), ("a", 0) | ("b", 3) | ("a", 2)).then_some(5);
        let r = readings(&t, whole);
        assert_eq!(r.keys().copied().collect::<Vec<_>>(), [5, 7, 8]);
        let five: Vec<(&str, u8, f64, u64, u64)> = r[&5]
            .iter()
            .map(|d| (d.node.as_str(), d.gpu, d.util_pct, d.used_mib, d.total_mib))
            .collect();
        // GPU a/2 is not read as 5's whole GPU: instances on it name their holders.
        assert_eq!(five, [("a", 0, 90.0, 40_000, 80_000), ("b", 3, 50.0, 20_000, 80_000)]);
        assert_eq!(r[&7][0].device, "MIG 1g.10gb (instance 2)");
        assert_eq!(
            (r[&7][0].util_pct, r[&7][0].used_mib, r[&7][0].total_mib),
            (25.0, 4_000, 10_000)
        );
        assert_eq!(r[&8][0].device, "share of the GPU");
        let s = Sample::of(60_000, &r[&5]).unwrap();
        assert_eq!((s.util_pct, s.used_mib, s.total_mib), (70.0, 60_000, 160_000));
        assert_eq!(Sample::of(60_000, &[]), None, "no devices: no sample, not zeros");
    }

    #[test]
    fn the_minute_sample_takes_fresh_telemetry_only() {
        let mut snap = Snapshot::empty(std::sync::Arc::new(tessera_model::Fleet::seed()));
        let node = snap.fleet.nodes[0].name.clone();
        let mut ns = (*snap.nodes[0]).clone();
        ns.gpus = vec![Default::default(); 2];
        ns.gpus[1].holders.push(crate::lifecycle::snapshot::HolderSnap {
            workload: 42,
            tenant: "t".into(),
            project: "p".into(),
            grant: Grant::Whole { gpus: 0b10 },
            units: tessera_model::GpuUnits(1000),
        });
        snap.nodes[0] = std::sync::Arc::new(ns);
        let t = Telemetry {
            at: 10 * MINUTE_MS,
            gpus: std::sync::Arc::new(vec![
                gpu(&node, 1, 30.0, 8_000, Vec::new()),
                gpu(&node, 0, 99.0, 1, Vec::new()),
            ]),
        };
        let now = 10 * MINUTE_MS + 30_000;
        let got = sample(&snap, &t, now);
        assert_eq!(
            got,
            [(
                42,
                Sample {
                    at: 10 * MINUTE_MS,
                    util_pct: 30.0,
                    used_mib: 8_000,
                    total_mib: 80_000
                }
            )],
            "only the GPU 42 holds, and no one for the free GPU"
        );
        assert!(
            sample(&snap, &t, now + 2 * MINUTE_MS).is_empty(),
            "stale telemetry is no sample"
        );
        let none = Telemetry {
            at: 0,
            gpus: Default::default(),
        };
        assert!(sample(&snap, &none, now).is_empty());
    }

    fn at(m: i64, util: f32) -> Sample {
        Sample {
            at: m * MINUTE_MS,
            util_pct: util,
            used_mib: 1_000,
            total_mib: 2_000,
        }
    }

    #[test]
    fn a_workload_keeps_a_day_of_minutes_then_hours_and_goes_a_month_after_it_stopped() {
        // The sizes the bound is reckoned in.
        assert_eq!((std::mem::size_of::<Sample>(), std::mem::size_of::<Hour>()), (24, 32));
        let h = WorkloadHistory::default();
        let n = KEPT as i64 + 100;
        for m in 0..n {
            // Workload 1 runs all the time; workload 2 only in the first 50 minutes.
            let mut s = vec![(1, at(m, (m % 60) as f32))];
            if m < 50 {
                s.push((2, at(m, 10.0)));
            }
            h.record(m * MINUTE_MS, s);
            if m == 60 {
                assert_eq!(h.minutes(2).len(), 50, "an ended workload keeps its minutes");
            }
            if m == 2_000 {
                assert!(h.minutes(2).is_empty());
                let hours = h.hours(2);
                assert_eq!(hours.len(), 1, "a day later its minutes are one hour");
                assert_eq!((hours[0].at, hours[0].minutes, hours[0].util_sum), (0, 50, 500.0));
                let week = h.window(2, Window::Week, m * MINUTE_MS);
                assert_eq!(week.len(), 1);
                assert_eq!(
                    (week[0].util_pct, week[0].used_mib, week[0].total_mib),
                    (10.0, 1_000.0, 2_000)
                );
            }
        }
        let now = (n - 1) * MINUTE_MS;
        let minutes = h.minutes(1);
        assert_eq!(minutes.len(), 1_440, "the last day minute by minute");
        assert_eq!(minutes[0].at, now - 1_439 * MINUTE_MS);
        let hours = h.hours(1);
        // The 30 days' first minute is minute 100: its hour (from minute 60) is the oldest kept.
        assert_eq!(hours.len(), 697, "the rest of 30 days as hours");
        assert_eq!(hours[0].at, 60 * MINUTE_MS);
        assert!(
            hours[..696].iter().all(|x| x.minutes == 60 && x.util_sum == 1_770.0),
            "0..59 each"
        );
        // The last hour is split: its first 40 minutes folded, the rest still minutes.
        assert_eq!((hours[696].minutes, hours[696].util_sum), (40, 780.0));
        assert!(
            h.minutes(2).is_empty() && h.hours(2).is_empty(),
            "stopped 30 days ago: forgotten"
        );
        assert_eq!(h.workloads(), 1);
        // The same minute again replaces it; an older one is ignored.
        h.record(now, [(1, at(n - 1, -1.0)), (1, at(5, 3.0))]);
        assert_eq!(h.minutes(1).last().unwrap().util_pct, -1.0);
        assert_eq!(h.minutes(1).len(), 1_440);
        // The month window: every hour that starts within it (not the oldest hour kept, which
        // starts before it), the last day's from its minutes.
        let month = h.window(1, Window::Month, now);
        assert_eq!(month.len(), 696 + 24);
        assert_eq!(month[0].at, 120 * MINUTE_MS);
        assert!(
            month.windows(2).all(|w| w[0].at + 60 * MINUTE_MS == w[1].at),
            "one point an hour"
        );
    }

    #[test]
    fn past_the_most_workloads_those_that_stopped_longest_ago_go() {
        let h = WorkloadHistory::default();
        let now = 100 * MINUTE_MS;
        // Workload k last reported k % 90 minutes before minute 100.
        h.record(
            now,
            (1..=MAX_SERIES as u64 + 3).map(|k| (k, at(100 - k as i64 % 90, 1.0))),
        );
        assert_eq!(h.workloads(), MAX_SERIES);
        assert!(h.minutes(89).is_empty() && h.minutes(179).is_empty() && h.minutes(269).is_empty());
        assert_eq!(h.minutes(1).len(), 1);
        assert_eq!(h.minutes(359).len(), 1, "the fourth of the oldest stays");
    }

    #[test]
    fn a_window_averages_its_buckets_across_minutes_and_hours() {
        let h = WorkloadHistory::default();
        let base = 1_000 * 60 * MINUTE_MS; // on an hour
        // Two days and a half hour: utilisation is the minute within its hour.
        let n = 2 * 1_440 + 30;
        for m in 0..n {
            h.record(base + m * MINUTE_MS, [(9, at(1_000 * 60 + m, (m % 60) as f32))]);
        }
        let now = base + (n - 1) * MINUTE_MS + 10_000;
        let hour = h.window(9, Window::Hour, now);
        assert_eq!(hour.len(), 60);
        assert_eq!((hour[0].at, hour[0].util_pct), (base + (n - 60) * MINUTE_MS, 30.0));
        assert_eq!(h.window(9, Window::Day, now).len(), 1_440, "minute by minute");
        // The hour the day starts in is half in an hour kept, half in minutes: one point.
        let week = h.window(9, Window::Week, now);
        assert_eq!(week.len(), 49, "{week:?}");
        assert!(week.windows(2).all(|w| w[0].at + 60 * MINUTE_MS == w[1].at));
        assert!(
            week[..48]
                .iter()
                .all(|p| (p.util_pct - 29.5).abs() < 1e-9 && p.used_mib == 1_000.0),
            "{week:?}"
        );
        assert_eq!(week[48].util_pct, 14.5, "the last half hour");
        assert!(h.window(10, Window::Day, now).is_empty());
    }

    #[test]
    fn a_long_windows_first_hour_is_whole_and_starts_within_it() {
        let h = WorkloadHistory::default();
        let base = 1_000 * 60 * MINUTE_MS; // on an hour
        // Eight days and a half hour; the utilisation is the hour's index.
        let n = 8 * 1_440 + 30;
        for m in 0..n {
            h.record(base + m * MINUTE_MS, [(9, at(1_000 * 60 + m, (m / 60) as f32))]);
        }
        let now = base + (n - 1) * MINUTE_MS + 10_000;
        let first = minute(now) - (7 * 1_440 - 1) * MINUTE_MS;
        let start = Window::Week.start(now);
        assert!(start >= first && start - HOUR_MS < first && start % HOUR_MS == 0);
        let week = h.window(9, Window::Week, now);
        // Not the hour the 7 days' first minute falls in (kept whole, its first 30 minutes
        // before the window): the 167 hours after it and the current half hour.
        assert_eq!(week.len(), 168, "{:?}", &week[..2]);
        assert_eq!(week[0].at, start);
        assert!(week.iter().all(|p| p.at >= first));
        assert_eq!(week[0].util_pct, ((start - base) / HOUR_MS) as f64, "one whole hour");
        let month = h.window(9, Window::Month, now);
        assert_eq!(month.len(), 8 * 24 + 1, "all there is");
        assert_eq!(month[0].at, base);
    }

    #[test]
    fn restored_hours_and_minutes_go_where_they_belong_once() {
        let h = WorkloadHistory::default();
        let now = 3 * 1_440 * MINUTE_MS;
        // In memory: the last two minutes.
        h.record(now, [(4, at(3 * 1_440 - 2, 1.0))]);
        h.record(now, [(4, at(3 * 1_440 - 1, 2.0))]);
        let hour = |at: i64, minutes: u32| Hour {
            at,
            util_sum: 10.0 * f64::from(minutes),
            used_sum: 0.0,
            total_mib: 1,
            minutes,
        };
        // From the store: two hours (out of order), the minute before memory's, a minute
        // memory has (other figures: memory's stays), and minutes older than a day.
        h.restore(
            now,
            [
                (4, at(3 * 1_440 - 3, 7.0)),
                (4, at(3 * 1_440 - 1, 99.0)),
                (4, at(1_440 + 5, 3.0)),
                (4, at(1_440 + 6, 5.0)),
            ],
            [(4, hour(60 * MINUTE_MS, 60)), (4, hour(0, 30))],
            false,
        );
        let minutes: Vec<(i64, f32)> = h.minutes(4).iter().map(|s| (s.at / MINUTE_MS, s.util_pct)).collect();
        assert_eq!(
            minutes,
            [(3 * 1_440 - 3, 7.0), (3 * 1_440 - 2, 1.0), (3 * 1_440 - 1, 2.0)]
        );
        let hours: Vec<(i64, u32, f64)> = h
            .hours(4)
            .iter()
            .map(|x| (x.at / MINUTE_MS, x.minutes, x.util_sum))
            .collect();
        assert_eq!(hours, [(0, 30, 300.0), (60, 60, 600.0), (1_440, 2, 8.0)]);
        h.restore(now, [(4, at(1_440 + 5, 3.0))], [(4, hour(0, 30))], true);
        assert_eq!(h.hours(4).len(), 3, "an hour kept is not added again");
        assert_eq!(h.hours(4)[2].minutes, 2, "nor a minute folded into it");
        // A follower's read: the store's figures of a minute memory has replace them.
        h.restore(now, [(4, at(3 * 1_440 - 1, 99.0))], [], true);
        let minutes: Vec<(i64, f32)> = h.minutes(4).iter().map(|s| (s.at / MINUTE_MS, s.util_pct)).collect();
        assert_eq!(
            minutes,
            [(3 * 1_440 - 3, 7.0), (3 * 1_440 - 2, 1.0), (3 * 1_440 - 1, 99.0)]
        );
    }
}
