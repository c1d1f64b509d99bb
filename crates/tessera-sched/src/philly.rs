//! The Philly trace replay (Microsoft's Philly job table, ATC'19), following the protocol in
//! `shared/traces/philly/README.md`: the `philly-768` / `philly-640` fleets (racks of 8 nodes of
//! 8 GPUs, built as [`Fleet`]s with the `rack` level of [`tessera_model::Levels`]), every job as
//! a gang (≤ 8 GPUs on one node; more as ⌈n/8⌉ node-shares of 8, the last holding the
//! remainder) in the fewest racks that hold it, events per timestamp (completions, submissions,
//! one scheduling pass), tenants (one per VC) with guarantees from their share of GPU-time, the
//! measured window `[t0 + 14 d, t0 + 70 d)` and the metrics of its section 6, under the five
//! policies of [`Policy`] and `engine`, the same trace through Tessera's real scheduler
//! ([`replay_engine`]; the `tessera` policy is a model of Tessera's written here).
//!
//! Placement is computed here over a small model of free GPUs per node and rack rather than by
//! the engine's [`crate::Engine::plan_gang`], because the protocol fixes the rules exactly
//! (best-fit: the rack with the fewest free GPUs that holds the gang, in it the nodes with the
//! fewest free GPUs that hold each share, largest share first; `fifo`: the first rack and first
//! nodes in name order). A gang beyond one rack (the trace's 128-GPU jobs: two whole racks) is
//! cut into chunks of one rack's nodes, largest shares first, each chunk placed by the same rule
//! in a rack not yet taken.
//!
//! Pure and deterministic: [`parse`] takes the file's text, [`replay`] takes the jobs and a
//! fleet; no clock, no I/O, no randomness.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};

use tessera_model::{Fleet, FleetError, GangRequest, Request, TopologyConstraint};

mod engine;
pub use engine::{EngineConfig, philly_govern, replay_engine};

/// Seconds in a day.
const DAY: i64 = 86_400;

/// One job of the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhillyJob {
    /// Submission, in seconds since 1970-01-01 (the trace's local time read as UTC).
    pub submit: i64,
    /// Seconds it runs once started.
    pub duration: i64,
    pub gpus: u32,
    /// Index into [`Trace::tenants`].
    pub tenant: usize,
}

/// The jobs, ordered by (`timestamp`, row), and the tenants (VCs) in order of first appearance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    pub jobs: Vec<PhillyJob>,
    pub tenants: Vec<String>,
}

/// A malformed line of the job table.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

/// Days from 1970-01-01 to the civil date (proleptic Gregorian).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `YYYY-MM-DD HH:MM:SS` as seconds since 1970-01-01 UTC.
pub fn parse_time(s: &str) -> Option<i64> {
    let (date, time) = s.trim().split_once(' ')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, mo, da) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.split(':').map(|p| p.parse::<i64>().ok());
    let (h, mi, se) = (t.next()??, t.next()??, t.next()??);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&da) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    Some(days_from_civil(y, mo, da) * DAY + h * 3600 + mi * 60 + se)
}

/// Parses `philly_jobs.csv` (`timestamp,duration,num_gpus,gpu_time,cluster`, columns found by
/// their header names) and orders the jobs by (`timestamp`, row in the file).
pub fn parse(text: &str) -> Result<Trace, ParseError> {
    let mut lines = text.lines().enumerate();
    let (_, header) = lines.next().ok_or(ParseError {
        line: 1,
        message: "empty file".into(),
    })?;
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    let col = |name: &str| {
        cols.iter().position(|c| *c == name).ok_or(ParseError {
            line: 1,
            message: format!("no `{name}` column"),
        })
    };
    let (ct, cd, cg, cc) = (col("timestamp")?, col("duration")?, col("num_gpus")?, col("cluster")?);
    let mut tenants: Vec<String> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut jobs = Vec::new();
    for (i, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let bad = |message: String| ParseError { line: i + 1, message };
        let get = |c: usize, name: &str| f.get(c).copied().ok_or_else(|| bad(format!("no `{name}`")));
        let ts = get(ct, "timestamp")?;
        let submit = parse_time(ts).ok_or_else(|| bad(format!("timestamp `{ts}` is not YYYY-MM-DD HH:MM:SS")))?;
        let ds = get(cd, "duration")?;
        let duration: f64 = ds
            .parse()
            .map_err(|_| bad(format!("duration `{ds}` is not a number")))?;
        if !(duration >= 0.0 && duration.is_finite()) {
            return Err(bad(format!("duration `{ds}` is negative")));
        }
        let gs = get(cg, "num_gpus")?;
        let gpus: u32 = gs
            .parse()
            .map_err(|_| bad(format!("num_gpus `{gs}` is not a whole number")))?;
        if gpus == 0 {
            return Err(bad("num_gpus is 0".into()));
        }
        let vc = get(cc, "cluster")?;
        let tenant = *index.entry(vc.to_string()).or_insert_with(|| {
            tenants.push(vc.to_string());
            tenants.len() - 1
        });
        jobs.push(PhillyJob {
            submit,
            duration: duration.round() as i64,
            gpus,
            tenant,
        });
    }
    // Stable: ties keep the file's row order.
    jobs.sort_by_key(|j| j.submit);
    Ok(Trace { jobs, tenants })
}

impl Trace {
    /// The same jobs with those submitted in the same second in another order (section 8 of
    /// the protocol): seed 0 is the file's order, any other seed shuffles each same-second
    /// group with a generator seeded by it.
    pub fn reordered(&self, seed: u64) -> Trace {
        use rand::SeedableRng;
        use rand::seq::SliceRandom;
        let mut t = self.clone();
        if seed == 0 {
            return t;
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut i = 0;
        while i < t.jobs.len() {
            let mut k = i + 1;
            while k < t.jobs.len() && t.jobs[k].submit == t.jobs[i].submit {
                k += 1;
            }
            t.jobs[i..k].shuffle(&mut rng);
            i = k;
        }
        t
    }
}

/// The protocol's measured window (section 5): jobs submitted in `[t0 + 14 d, t0 + 70 d)`,
/// days after the first submission.
pub const WINDOW_DAYS: (i64, i64) = (14, 70);

/// The measured window in ms after the first submission, the time origin of [`arrivals`].
pub fn window_ms() -> (i64, i64) {
    (WINDOW_DAYS.0 * DAY * 1000, WINDOW_DAYS.1 * DAY * 1000)
}

/// Class of the timed replay's single-node jobs (up to one node's GPUs).
pub const SINGLE_NODE: &str = "single-node";
/// Class of the timed replay's multi-node gangs.
pub const MULTI_NODE: &str = "multi-node";

/// The trace as a timed demand ([`crate::timed`]) on `layout`'s fleet: every job, arriving at
/// its submission (ms after the first one), running its `duration`, shaped by
/// [`Layout::request_of`], of its VC as tenant at priority `standard`, in class
/// [`SINGLE_NODE`] or [`MULTI_NODE`]. Jobs submitted in the same second keep the trace's order
/// (the timed replay breaks arrival ties by index).
pub fn arrivals(trace: &Trace, layout: &Layout) -> Vec<crate::timed::Arrival> {
    let t0 = trace.jobs.first().map_or(0, |j| j.submit);
    trace
        .jobs
        .iter()
        .enumerate()
        .map(|(i, j)| {
            let (request, gang) = layout.request_of(j.gpus);
            crate::timed::Arrival {
                name: format!("job-{i}"),
                tenant: trace.tenants[j.tenant].clone(),
                class: if gang.is_some() { MULTI_NODE } else { SINGLE_NODE }.into(),
                priority: "standard".into(),
                request,
                gang,
                arrive_ms: (j.submit - t0) * 1000,
                run_ms: j.duration * 1000,
            }
        })
        .collect()
}

/// The protocol's fleets.
pub const FLEETS: [&str; 2] = ["philly-768", "philly-640"];

/// The fleet `philly-768` (12 racks) or `philly-640` (10 racks): racks `r00`.. of 8 nodes
/// `rXX-n0`..`rXX-n7` with 8 NVSwitch GPUs (the catalogue's A100-80GB: the protocol fixes only the
/// count and one NVLink domain per node), 96 CPUs and 1,024 GiB each, one whole pool.
pub fn fleet(name: &str) -> Option<Fleet> {
    let racks = match name {
        "philly-768" => 12,
        "philly-640" => 10,
        _ => return None,
    };
    Some(fleet_of(racks).expect("the Philly fleet is valid"))
}

/// `racks` racks of 8 nodes of 8 GPUs, as [`fleet`] builds them.
pub fn fleet_of(racks: usize) -> Result<Fleet, FleetError> {
    let mut toml = String::from("[[pool]]\nname = \"philly\"\nsharing = \"whole\"\n");
    for r in 0..racks {
        for n in 0..8 {
            toml.push_str(&format!(
                "[[pool.nodes]]\nname = \"r{r:02}-n{n}\"\ngpu_model = \"A100-80GB\"\ngpus = 8\ncpus = 96\nmemory_gib = 1024\nnvlink = \"nvswitch\"\nrack = \"r{r:02}\"\n"
            ));
        }
    }
    Fleet::from_toml(&toml, "philly")
}

/// The replay's policies, in report order.
pub const POLICIES: [&str; 6] = [
    "fifo",
    "backfill",
    "topology-bestfit",
    "quota-backfill",
    "tessera",
    "engine",
];

/// The policies of the protocol's section 7, and Tessera's real scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Strict arrival order, the head blocks everyone; first rack and nodes in name order.
    Fifo,
    /// EASY backfill with best-fit: a reservation for the head, recomputed every pass.
    Backfill,
    /// Every pass starts each job that fits, in arrival order, best-fit, no reservation.
    TopologyBestfit,
    /// `Backfill` with jobs within their tenant's guarantee ordered first.
    QuotaBackfill,
    /// Tessera: waiting multi-node gangs first, then jobs within their tenant's guarantee,
    /// then the rest; inside each class by submission plus a quarter of the estimate (gangs by
    /// submission alone): shorter work first, a long job overtaken only by jobs submitted
    /// within a quarter of its estimate after it. Backfill is conservative for gangs: every blocked multi-node gang gets a
    /// reservation of its own, placed around the earlier ones, and so does the first blocked
    /// job of the rest; a job starts now only where it delays none of them (by estimates).
    /// Single-node jobs go on the node whose busy horizon they extend least, so work that ends
    /// together shares nodes and whole nodes free up. For a blocked multi-node gang within
    /// its tenant's guarantee, borrowed GPUs are reclaimed in one rack (jobs of tenants over
    /// their guarantee, least work done first) when the work lost is under 5 % of the GPU-time
    /// the gang would otherwise wait for its reservation. Preempted jobs restart from the
    /// beginning (no checkpointing). See [`TesseraKnobs`].
    Tessera,
    /// Tessera's real scheduler ([`crate::cycle::Scheduler`]: admit, allocate with backfill and
    /// holds, consolidate, reclaim, preempt), not a model of it: [`replay_engine`] with
    /// [`EngineConfig::default`] (the scenario's settings with the rules for gangs,
    /// [`EngineConfig::gang_rules`]).
    Engine,
}

impl Policy {
    pub fn parse(s: &str) -> Option<Policy> {
        Some(match s {
            "fifo" => Policy::Fifo,
            "backfill" => Policy::Backfill,
            "topology-bestfit" => Policy::TopologyBestfit,
            "quota-backfill" => Policy::QuotaBackfill,
            "tessera" => Policy::Tessera,
            "engine" => Policy::Engine,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Policy::Fifo => "fifo",
            Policy::Backfill => "backfill",
            Policy::TopologyBestfit => "topology-bestfit",
            Policy::QuotaBackfill => "quota-backfill",
            Policy::Tessera => "tessera",
            Policy::Engine => "engine",
        }
    }
}

/// The rack/node layout the replay places on, read from a fleet's `rack` level.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Rack names, in name order.
    pub racks: Vec<String>,
    /// Nodes per rack (every rack the same).
    pub nodes_per_rack: usize,
    /// GPUs per node (every node the same).
    pub gpus_per_node: u8,
}

impl Layout {
    /// The layout of a fleet whose nodes all have the same GPUs and stand in racks of equal
    /// size (the Philly fleets); `None` otherwise.
    pub fn of(fleet: &Fleet) -> Option<Layout> {
        let level = fleet.levels.level("rack")?;
        let mut racks: Vec<(String, usize)> = fleet
            .levels
            .domains(level)
            .iter()
            .map(|d| (d.name.clone(), d.nodes.len()))
            .collect();
        racks.sort();
        let nodes_per_rack = racks.first()?.1;
        let gpus_per_node = fleet.nodes.first()?.gpus;
        if racks.iter().any(|r| r.1 != nodes_per_rack)
            || fleet.nodes.iter().any(|n| n.gpus != gpus_per_node)
            || racks.len() * nodes_per_rack != fleet.nodes.len()
            || gpus_per_node == 0
        {
            return None;
        }
        Some(Layout {
            racks: racks.into_iter().map(|r| r.0).collect(),
            nodes_per_rack,
            gpus_per_node,
        })
    }

    pub fn gpus(&self) -> u64 {
        (self.racks.len() * self.nodes_per_rack) as u64 * self.gpus_per_node as u64
    }

    /// The node-shares of a gang of `gpus`, largest first.
    pub fn shares(&self, gpus: u32) -> Vec<u8> {
        let g = self.gpus_per_node as u32;
        if gpus <= g {
            return vec![gpus as u8];
        }
        let mut s = vec![self.gpus_per_node; (gpus / g) as usize];
        if !gpus.is_multiple_of(g) {
            s.push((gpus % g) as u8);
        }
        s
    }

    /// The fewest racks that can hold `shares` node-shares.
    pub fn min_racks(&self, shares: usize) -> usize {
        shares.div_ceil(self.nodes_per_rack)
    }

    /// A job of `gpus` GPUs as the scheduler's request, by the protocol's shape rule
    /// ([`Self::shares`], [`Self::min_racks`]): up to one node, that many whole GPUs on one node
    /// (no gang); more, a whole-node gang of its node-shares, the last one holding the
    /// remainder (12 = 8 + 4, 20 = 8 + 8 + 4: [`GangRequest::remainder`]), required within one
    /// rack when one rack holds its shares, else in segments of one rack's nodes when those
    /// divide it (two whole racks for 128 GPUs). The single-node request of a gang is its
    /// largest share (never read by the scheduler).
    pub fn request_of(&self, gpus: u32) -> (Request, Option<GangRequest>) {
        let shares = self.shares(gpus);
        if shares.len() == 1 {
            return (Request::whole(shares[0]), None);
        }
        let mut gang = GangRequest::whole_nodes(gpus);
        if !gpus.is_multiple_of(self.gpus_per_node as u32) {
            gang = gang.with_remainder();
        }
        let rack_gpus = self.nodes_per_rack as u32 * self.gpus_per_node as u32;
        if self.min_racks(shares.len()) == 1 {
            gang = gang.with_topology(TopologyConstraint::required("rack"));
        } else if gpus.is_multiple_of(rack_gpus) {
            gang = gang.with_segment(rack_gpus);
        }
        (Request::whole(self.gpus_per_node), Some(gang))
    }
}

/// Free GPUs per node, with per-rack counts of nodes by free GPUs.
#[derive(Clone, Debug)]
struct Free {
    npr: usize,
    g: usize,
    free: Vec<u8>,
    rack_free: Vec<u32>,
    /// `cnt[rack * (g + 1) + k]`: nodes of the rack with k free GPUs.
    cnt: Vec<u16>,
    /// Nodes with k free GPUs, fleet-wide.
    all: Vec<u32>,
}

/// Where a gang goes: (node, GPUs) per share, in share order.
type Spot = Vec<(usize, u8)>;

impl Free {
    fn new(l: &Layout) -> Free {
        let (r, npr, g) = (l.racks.len(), l.nodes_per_rack, l.gpus_per_node as usize);
        let mut cnt = vec![0u16; r * (g + 1)];
        for rack in 0..r {
            cnt[rack * (g + 1) + g] = npr as u16;
        }
        let mut all = vec![0u32; g + 1];
        all[g] = (r * npr) as u32;
        Free {
            npr,
            g,
            free: vec![g as u8; r * npr],
            rack_free: vec![(npr * g) as u32; r],
            cnt,
            all,
        }
    }

    fn racks(&self) -> usize {
        self.rack_free.len()
    }

    fn set(&mut self, node: usize, v: u8) {
        let old = self.free[node];
        if old == v {
            return;
        }
        let rack = node / self.npr;
        let b = rack * (self.g + 1);
        self.cnt[b + old as usize] -= 1;
        self.cnt[b + v as usize] += 1;
        self.all[old as usize] -= 1;
        self.all[v as usize] += 1;
        self.rack_free[rack] = self.rack_free[rack] + v as u32 - old as u32;
        self.free[node] = v;
    }

    fn take(&mut self, spot: &Spot) {
        for &(n, x) in spot {
            self.set(n, self.free[n] - x);
        }
    }

    fn give(&mut self, spot: &Spot) {
        for &(n, x) in spot {
            self.set(n, self.free[n] + x);
        }
    }

    /// Whether `chunk` (shares, largest first) fits on distinct nodes of `rack`, ignoring the
    /// nodes in `used`.
    fn rack_holds(&self, rack: usize, chunk: &[u8]) -> bool {
        let b = rack * (self.g + 1);
        let need: u32 = chunk.iter().map(|&s| s as u32).sum();
        if self.rack_free[rack] < need {
            return false;
        }
        // Hall's condition on nested sets: the i-th largest share needs i + 1 nodes with at
        // least that many free GPUs.
        let mut at_least = 0u32;
        let mut k = self.g;
        for (i, &s) in chunk.iter().enumerate() {
            while k >= s as usize {
                at_least += self.cnt[b + k] as u32;
                if k == 0 {
                    break;
                }
                k -= 1;
            }
            if at_least < i as u32 + 1 {
                return false;
            }
        }
        true
    }

    /// Whether the gang fits now (fast: fleet-wide counts for one share).
    fn fits(&self, shares: &[u8]) -> bool {
        if shares.len() == 1 {
            return self.all[shares[0] as usize..].iter().any(|&c| c > 0);
        }
        let chunks: Vec<&[u8]> = shares.chunks(self.npr).collect();
        if chunks.len() == 1 {
            return (0..self.racks()).any(|r| self.rack_holds(r, chunks[0]));
        }
        self.place(shares, false).is_some()
    }

    /// Places the gang: best-fit (`first_fit` false) or first rack and nodes in name order.
    fn place(&self, shares: &[u8], first_fit: bool) -> Option<Spot> {
        self.place_ranked(self, shares, first_fit)
    }

    /// Places the gang where `self` has room, choosing racks and nodes by the free GPUs of
    /// `rank` (a backfilled job that must leave a reservation alone fits in what the
    /// reservation leaves, and is placed best-fit by what is actually free).
    fn place_ranked(&self, rank: &Free, shares: &[u8], first_fit: bool) -> Option<Spot> {
        let mut spot = Vec::with_capacity(shares.len());
        let mut taken = vec![false; self.racks()];
        for chunk in shares.chunks(self.npr) {
            let mut best: Option<usize> = None;
            for (r, &t) in taken.iter().enumerate() {
                if t || !self.rack_holds(r, chunk) {
                    continue;
                }
                if first_fit {
                    best = Some(r);
                    break;
                }
                if best.is_none_or(|b| rank.rack_free[r] < rank.rack_free[b]) {
                    best = Some(r);
                }
            }
            let r = best?;
            taken[r] = true;
            let mut used = vec![false; self.npr];
            for &s in chunk {
                let mut pick: Option<usize> = None;
                for (i, &u) in used.iter().enumerate() {
                    if u || self.free[r * self.npr + i] < s {
                        continue;
                    }
                    if first_fit {
                        pick = Some(i);
                        break;
                    }
                    let f = rank.free[r * self.npr + i];
                    if pick.is_none_or(|p| f < rank.free[r * self.npr + p]) {
                        pick = Some(i);
                    }
                }
                let i = pick.expect("rack_holds said the chunk fits");
                used[i] = true;
                spot.push((r * self.npr + i, s));
            }
        }
        Some(spot)
    }
}

impl Free {
    /// Places a single-node job of `share` GPUs where `self` has room, on the node whose busy
    /// horizon (`horizon`: the latest estimated end of the work on it) it extends least when it
    /// runs until `end`, ties by best-fit on `rank` (the rack with the fewest free GPUs, then
    /// the node with the fewest), then name order. Jobs that end about together then share
    /// nodes, so a node frees whole when its work ends instead of staying half-held by one
    /// long job among short ones: whole nodes (and whole racks' worth of them) are what 8-GPU
    /// jobs and multi-node gangs wait for.
    fn place_aligned(&self, rank: &Free, share: u8, horizon: &[i64], end: i64) -> Option<Spot> {
        let mut best: Option<(i64, u32, u8, usize)> = None;
        for (n, &f) in self.free.iter().enumerate() {
            if f < share {
                continue;
            }
            let key = ((end - horizon[n]).max(0), rank.rack_free[n / self.npr], rank.free[n], n);
            if best.is_none_or(|b| key < b) {
                best = Some(key);
            }
        }
        best.map(|b| vec![(b.3, share)])
    }
}

/// Figures of one size class (or of all the window's jobs).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Delays {
    pub class: String,
    pub jobs: usize,
    /// Queueing delay, seconds: mean, nearest-rank percentiles, max.
    pub mean_s: f64,
    pub p50_s: i64,
    pub p95_s: i64,
    pub p99_s: i64,
    pub max_s: i64,
    /// Mean job completion time (submission → end), seconds.
    pub mean_jct_s: f64,
    /// Mean bounded slowdown max(1, JCT ÷ max(duration, 60 s)).
    pub mean_bsld: f64,
}

/// One tenant's figures.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TenantFigures {
    pub tenant: String,
    pub guarantee: u64,
    /// The window's jobs of the tenant.
    pub jobs: usize,
    pub mean_delay_s: f64,
}

/// Every metric of the protocol's section 6 for one policy.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Report {
    pub policy: String,
    pub fleet_gpus: u64,
    pub jobs: usize,
    pub window_jobs: usize,
    /// GPU-seconds held during the window ÷ (fleet GPUs × window length), in %.
    pub allocation_pct: f64,
    /// Size classes `1`, `2-4`, `8`, `12-32` (and `64-128` when the window has any), then `all`.
    pub classes: Vec<Delays>,
    pub tenants: Vec<TenantFigures>,
    /// Runs cut short by preemption (all policies but `tessera` never preempt).
    pub preemptions: u64,
    /// GPU-hours of work those runs had done (lost: a preempted job restarts from the start).
    pub gpu_hours_lost: f64,
    /// Jobs refused because they cannot fit the empty fleet.
    pub refusals: usize,
    /// Multi-node gangs placed in more racks than the fewest that can hold them (the topology
    /// rule says 0).
    pub gangs_beyond_min_racks: usize,
    /// The last job's end, seconds after t0.
    pub makespan_s: i64,
}

impl Report {
    /// The mean of each figure over `reports` (one policy's runs over several same-second
    /// orders); counts are rounded to the nearest whole number.
    pub fn mean(reports: &[Report]) -> Option<Report> {
        let first = reports.first()?;
        let n = reports.len() as f64;
        let avg = |f: &dyn Fn(&Report) -> f64| reports.iter().map(f).sum::<f64>() / n;
        let avg_i = |f: &dyn Fn(&Report) -> f64| avg(f).round() as i64;
        let mut m = first.clone();
        m.allocation_pct = avg(&|r| r.allocation_pct);
        for (c, d) in m.classes.iter_mut().enumerate() {
            d.mean_s = avg(&|r| r.classes[c].mean_s);
            d.p50_s = avg_i(&|r| r.classes[c].p50_s as f64);
            d.p95_s = avg_i(&|r| r.classes[c].p95_s as f64);
            d.p99_s = avg_i(&|r| r.classes[c].p99_s as f64);
            d.max_s = avg_i(&|r| r.classes[c].max_s as f64);
            d.mean_jct_s = avg(&|r| r.classes[c].mean_jct_s);
            d.mean_bsld = avg(&|r| r.classes[c].mean_bsld);
        }
        for (i, t) in m.tenants.iter_mut().enumerate() {
            t.mean_delay_s = avg(&|r| r.tenants[i].mean_delay_s);
        }
        m.preemptions = avg_i(&|r| r.preemptions as f64) as u64;
        m.gpu_hours_lost = avg(&|r| r.gpu_hours_lost);
        m.gangs_beyond_min_racks = avg_i(&|r| r.gangs_beyond_min_racks as f64) as usize;
        m.makespan_s = avg_i(&|r| r.makespan_s as f64);
        Some(m)
    }
}

/// The per-job outcome of a replay, for tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Final start (after the last preemption), or `None` when refused.
    pub start: Option<i64>,
    pub end: Option<i64>,
    pub preempted: u32,
}

/// The user's time estimate: ⌈duration / 3600 s⌉ hours × 2.
pub fn estimate(duration: i64) -> i64 {
    (duration + 3599) / 3600 * 7200
}

/// Each tenant's guarantee: its share of the trace's GPU-time × the fleet's GPUs, rounded down.
pub fn guarantees(trace: &Trace, fleet_gpus: u64) -> Vec<u64> {
    let mut t = vec![0u128; trace.tenants.len()];
    for j in &trace.jobs {
        t[j.tenant] += j.duration as u128 * j.gpus as u128;
    }
    let total: u128 = t.iter().sum();
    t.iter()
        .map(|&x| (x * fleet_gpus as u128).checked_div(total).unwrap_or(0) as u64)
        .collect()
}

#[derive(Clone, Debug)]
struct Run {
    start: i64,
    spot: Spot,
    /// Bumped at each start; a completion carries the generation it was scheduled for.
    generation: u32,
}

struct Sim<'a> {
    knobs: TesseraKnobs,
    trace: &'a Trace,
    layout: &'a Layout,
    policy: Policy,
    shares: Vec<Vec<u8>>,
    est: Vec<i64>,
    guarantee: Vec<u64>,
    held: Vec<u64>,
    free: Free,
    /// Waiting jobs, by index (= arrival order).
    queue: Vec<usize>,
    running: Vec<Option<Run>>,
    /// Running jobs by (estimated end, job).
    by_est_end: BTreeSet<(i64, usize)>,
    completions: BinaryHeap<Reverse<(i64, usize, u32)>>,
    generation: Vec<u32>,
    out: Vec<Outcome>,
    /// Every run's (start, end, gpus), preempted runs included, for allocation.
    held_spans: Vec<(i64, i64, u32)>,
    preemptions: u64,
    lost_gpu_s: i128,
    beyond_min_racks: usize,
}

/// Per pass: which gang sizes have already failed to fit in a given model (state only shrinks
/// within a pass, so a size that failed fails again).
struct Failed(Vec<bool>);

impl Failed {
    fn new() -> Failed {
        Failed(vec![false; 257])
    }
    fn get(&self, g: u32) -> bool {
        self.0.get(g as usize).copied().unwrap_or(false)
    }
    fn set(&mut self, g: u32) {
        if let Some(x) = self.0.get_mut(g as usize) {
            *x = true;
        }
    }
}

/// A reservation made in a scheduling pass: the job's gang starts at `t` on `spot` and holds
/// it, by its estimate, until `end`.
struct Resv {
    t: i64,
    end: i64,
    spot: Spot,
    /// Free GPUs per node at `t` by estimates: running jobs that hold GPUs then, and every
    /// reservation whose span contains `t` (this one included), taken out.
    left: Vec<u8>,
}

/// A pass's reservations, ordered by time, and what a job started now may take without
/// delaying any of them. A job that runs (by its estimate) until `end` overlaps the first
/// `m` reservations, those with `t < end`; it may take on each node what is free now and left
/// at each of those `m` reservations (usage only falls between reservations' starts, as
/// running jobs end, so their starts are the only times to check).
struct Book {
    resv: Vec<Resv>,
    /// `spare[m - 1]`: free now, capped by what the first `m` reservations leave.
    spare: Vec<Free>,
    /// Per `spare`: the gang sizes that failed to fit it (reset when it is rebuilt).
    failed: Vec<Failed>,
}

impl Book {
    fn new() -> Book {
        Book {
            resv: Vec::new(),
            spare: Vec::new(),
            failed: Vec::new(),
        }
    }

    /// How many reservations (a prefix) a job running until `end` overlaps.
    fn overlapped(&self, end: i64) -> usize {
        self.resv.partition_point(|r| r.t < end)
    }

    /// Adds the reservation of a job whose estimate is `est` at `t` on `spot`, `base` being
    /// the state at `t` from running jobs alone, and rebuilds the spares.
    fn add(&mut self, t: i64, est: i64, spot: Spot, base: &Free, free: &Free) {
        let end = t + est;
        let mut left = base.free.clone();
        for r in self.resv.iter().filter(|r| r.t <= t && t < r.end) {
            for &(n, x) in &r.spot {
                left[n] = left[n].saturating_sub(x);
            }
        }
        for &(n, x) in &spot {
            left[n] = left[n].saturating_sub(x);
        }
        for r in self.resv.iter_mut().filter(|r| t <= r.t && r.t < end) {
            for &(n, x) in &spot {
                r.left[n] = r.left[n].saturating_sub(x);
            }
        }
        let at = self.resv.partition_point(|r| r.t <= t);
        self.resv.insert(at, Resv { t, end, spot, left });
        self.spare.clear();
        let mut cap = free.free.clone();
        for r in &self.resv {
            let mut f = free.clone();
            for (n, c) in cap.iter_mut().enumerate() {
                *c = (*c).min(r.left[n]);
                f.set(n, *c);
            }
            self.spare.push(f);
        }
        self.failed = self.resv.iter().map(|_| Failed::new()).collect();
    }

    /// A job overlapping the first `m` reservations started on `spot` (already taken from
    /// `free`): it holds its GPUs at each of them.
    fn took(&mut self, spot: &Spot, m: usize, free: &Free) {
        for r in &mut self.resv[..m] {
            for &(n, x) in spot {
                r.left[n] -= x;
            }
        }
        for &(n, _) in spot {
            let mut c = free.free[n];
            for (k, r) in self.resv.iter().enumerate() {
                c = c.min(r.left[n]);
                self.spare[k].set(n, c);
            }
        }
    }
}

impl<'a> Sim<'a> {
    fn within(&self, j: usize) -> bool {
        let job = &self.trace.jobs[j];
        self.held[job.tenant] + job.gpus as u64 <= self.guarantee[job.tenant]
    }

    fn start(&mut self, j: usize, spot: Spot, now: i64) {
        let job = &self.trace.jobs[j];
        if job.duration == 0 {
            // Ends as it starts: holds nothing.
            self.out[j].start = Some(now);
            self.out[j].end = Some(now);
            return;
        }
        self.free.take(&spot);
        let racks: BTreeSet<usize> = spot.iter().map(|&(n, _)| n / self.layout.nodes_per_rack).collect();
        if spot.len() > 1 && racks.len() > self.layout.min_racks(spot.len()) {
            self.beyond_min_racks += 1;
        }
        self.held[job.tenant] += job.gpus as u64;
        self.generation[j] += 1;
        let end = now + job.duration;
        self.completions.push(Reverse((end, j, self.generation[j])));
        self.by_est_end.insert((now + self.est[j], j));
        self.running[j] = Some(Run {
            start: now,
            spot,
            generation: self.generation[j],
        });
        self.out[j].start = Some(now);
        self.out[j].end = Some(end);
    }

    fn finish(&mut self, j: usize, now: i64) {
        let run = self.running[j].take().expect("a completion of a running job");
        let job = &self.trace.jobs[j];
        self.free.give(&run.spot);
        self.held[job.tenant] -= job.gpus as u64;
        self.by_est_end.remove(&(run.start + self.est[j], j));
        self.held_spans.push((run.start, now, job.gpus));
    }

    fn preempt(&mut self, j: usize, now: i64) {
        let run = self.running[j].as_ref().expect("a running victim");
        let (start, generation) = (run.start, run.generation);
        debug_assert_eq!(generation, self.generation[j]);
        self.finish(j, now);
        self.generation[j] += 1; // its scheduled completion is void
        self.preemptions += 1;
        self.out[j].preempted += 1;
        self.out[j].start = None;
        self.out[j].end = None;
        self.lost_gpu_s += (now - start) as i128 * self.trace.jobs[j].gpus as i128;
        let pos = self.queue.partition_point(|&q| q < j);
        self.queue.insert(pos, j);
    }

    /// A reservation for job `j` given the reservations `resv` already made in this pass: the
    /// earliest time its gang fits as running jobs end by their estimates, on GPUs that no
    /// reservation whose span overlaps the job's own (its estimate from then) holds, and the
    /// best-fit placement there; also the state at that time from running jobs alone. With no
    /// earlier reservation this is EASY's head reservation (the times tried are the running
    /// jobs' estimated ends); with some, the reservations' ends are tried too, and a node a
    /// reservation holds at any time of the span counts as held over all of it (conservative:
    /// it never promises GPUs that another reservation needs).
    fn reserve(&self, j: usize, resv: &[Resv]) -> (i64, Spot, Free) {
        let shares = &self.shares[j];
        let e = self.est[j];
        let mut f = self.free.clone();
        let mut ends: Vec<i64> = resv.iter().map(|r| r.end).collect();
        ends.sort_unstable();
        let mut ends = ends.into_iter().peekable();
        let mut it = self.by_est_end.iter().peekable();
        loop {
            let tau = match (it.peek().map(|&&(t, _)| t), ends.peek().copied()) {
                (None, None) => unreachable!("a gang that fits the empty fleet fits once every job has ended"),
                (Some(a), None) => a,
                (None, Some(b)) => b,
                (Some(a), Some(b)) => a.min(b),
            };
            while let Some(&(_, r)) = it.next_if(|&&(t, _)| t <= tau) {
                f.give(&self.running[r].as_ref().expect("running").spot);
            }
            while ends.next_if(|&t| t <= tau).is_some() {}
            if !f.fits(shares) {
                continue;
            }
            let mut over = resv.iter().filter(|r| r.t < tau + e && r.end > tau).peekable();
            if over.peek().is_none() {
                let spot = f.place(shares, false).expect("fits");
                return (tau, spot, f);
            }
            let mut g = f.clone();
            for r in over {
                for &(n, x) in &r.spot {
                    g.set(n, g.free[n].saturating_sub(x));
                }
            }
            if let Some(spot) = g.place(shares, false) {
                return (tau, spot, f);
            }
        }
    }

    /// Tessera's reclaim for a blocked within-guarantee head: in the rack where it costs the
    /// least work, preempt running jobs of tenants over their guarantee (least work done first,
    /// only while the tenant is still over its guarantee) until the head fits; only when the
    /// work lost is below `reclaim_budget_pct` % of the GPU-time the head would otherwise wait
    /// (by estimates).
    fn reclaim(&mut self, head: usize, now: i64, wait_s: i64) -> bool {
        let shares = self.shares[head].clone();
        if shares.len() > self.layout.nodes_per_rack {
            return false;
        }
        let npr = self.layout.nodes_per_rack;
        let budget = wait_s as i128 * self.trace.jobs[head].gpus as i128 * self.knobs.reclaim_budget_pct as i128 / 100;
        let mut best: Option<(i128, Vec<usize>)> = None;
        for rack in 0..self.layout.racks.len() {
            let mut cands: Vec<(i128, usize)> = Vec::new();
            for j in self.by_est_end.iter().map(|&(_, j)| j) {
                let run = self.running[j].as_ref().expect("running");
                let job = &self.trace.jobs[j];
                if run.spot.iter().all(|&(n, _)| n / npr == rack) && self.held[job.tenant] > self.guarantee[job.tenant]
                {
                    cands.push(((now - run.start) as i128 * job.gpus as i128, j));
                }
            }
            cands.sort();
            let mut f = self.free.clone();
            let mut held = self.held.clone();
            let mut lost = 0i128;
            let mut victims = Vec::new();
            let mut ok = f.rack_holds(rack, &shares);
            for &(w, j) in &cands {
                if ok || lost + w >= budget || best.as_ref().is_some_and(|b| lost + w >= b.0) {
                    break;
                }
                let job = &self.trace.jobs[j];
                if held[job.tenant] <= self.guarantee[job.tenant] {
                    continue;
                }
                held[job.tenant] -= job.gpus as u64;
                f.give(&self.running[j].as_ref().expect("running").spot);
                lost += w;
                victims.push(j);
                ok = f.rack_holds(rack, &shares);
            }
            if ok && !victims.is_empty() && best.as_ref().is_none_or(|b| lost < b.0) {
                best = Some((lost, victims));
            }
        }
        let Some((_, victims)) = best else { return false };
        for v in victims {
            self.preempt(v, now);
        }
        true
    }

    /// Each node's busy horizon: the latest estimated end of the jobs running on it (`now`
    /// when it is empty), for [`Free::place_aligned`].
    fn horizons(&self, now: i64) -> Vec<i64> {
        let mut h = vec![now; self.free.free.len()];
        for &(e, j) in &self.by_est_end {
            for &(n, _) in &self.running[j].as_ref().expect("running").spot {
                h[n] = e;
            }
        }
        h
    }

    /// Where job `j` goes in `room` (free now, or what reservations leave of it): Tessera
    /// with `align_ends` places a single-node job by [`Free::place_aligned`]; otherwise
    /// best-fit (or first-fit) ranked by what is free now.
    fn place_in(&self, j: usize, room: &Free, first_fit: bool, horizon: &[i64], now: i64) -> Option<Spot> {
        let shares = &self.shares[j];
        if self.policy == Policy::Tessera && self.knobs.align_ends && shares.len() == 1 {
            return room.place_aligned(&self.free, shares[0], horizon, now + self.est[j]);
        }
        room.place_ranked(&self.free, shares, first_fit)
    }

    /// After job `j` started on `spot` at `now`: its nodes are busy until its estimated end.
    fn extend(&self, horizon: &mut [i64], j: usize, spot: &Spot, now: i64) {
        if horizon.is_empty() {
            return;
        }
        for &(n, _) in spot {
            horizon[n] = horizon[n].max(now + self.est[j]);
        }
    }

    /// One scheduling pass at `now`.
    fn pass(&mut self, now: i64) {
        if self.queue.is_empty() {
            return;
        }
        let first_fit = self.policy == Policy::Fifo;
        let quota_first = matches!(self.policy, Policy::QuotaBackfill | Policy::Tessera);
        let easy = matches!(self.policy, Policy::Backfill | Policy::QuotaBackfill | Policy::Tessera);
        // The order: arrival, or within-guarantee jobs first (judged at the start of the pass).
        let order: Vec<usize> = if self.policy == Policy::Tessera {
            let k = self.knobs;
            let npg = self.layout.gpus_per_node as u32;
            let mut v: Vec<(u8, i64, usize)> = self
                .queue
                .iter()
                .map(|&j| {
                    let within = self.within(j);
                    let gang = self.trace.jobs[j].gpus > npg;
                    let big = self.trace.jobs[j].gpus >= k.first_min_gpus;
                    let class = if k.gangs_first && (gang || big) && (within || !k.gangs_first_within_only) {
                        0
                    } else if within {
                        1
                    } else {
                        2
                    };
                    let w = if class == 0 {
                        k.gang_estimate_weight_pct
                    } else {
                        k.estimate_weight_pct
                    };
                    let key = self.trace.jobs[j].submit + self.est[j] * w as i64 / 100;
                    (class, key, j)
                })
                .collect();
            v.sort_unstable();
            v.into_iter().map(|x| x.2).collect()
        } else if quota_first {
            let mut v: Vec<usize> = self.queue.iter().copied().filter(|&j| self.within(j)).collect();
            let mut rest: Vec<usize> = self.queue.iter().copied().filter(|&j| !self.within(j)).collect();
            v.append(&mut rest);
            v
        } else {
            self.queue.clone()
        };
        let mut started = vec![];
        let mut failed_now = Failed::new();
        // The reservations made so far in this pass (none: no job has been blocked yet).
        let mut book = Book::new();
        let mut stop = false;
        let mut reclaimed = false;
        // Tessera: every blocked multi-node gang gets a reservation of its own (conservative
        // backfill for gangs), and, with `reserve_first_of_rest`, so does the first blocked job
        // that is not one.
        let gang_resv = self.policy == Policy::Tessera && self.knobs.reserve_every_gang;
        let mut rest_reserved = false;
        let mut horizon = if self.policy == Policy::Tessera && self.knobs.align_ends {
            self.horizons(now)
        } else {
            Vec::new()
        };
        for &j in &order {
            if stop {
                break;
            }
            let g = self.trace.jobs[j].gpus;
            if self.running[j].is_some() {
                continue;
            }
            if book.resv.is_empty() {
                if !failed_now.get(g) && self.free.fits(&self.shares[j]) {
                    let spot = self.place_in(j, &self.free, first_fit, &horizon, now).expect("fits");
                    self.extend(&mut horizon, j, &spot, now);
                    self.start(j, spot, now);
                    started.push(j);
                    continue;
                }
                failed_now.set(g);
                match self.policy {
                    Policy::Fifo => stop = true,
                    Policy::TopologyBestfit => {}
                    _ => {
                        let (t, spot, base) = self.reserve(j, &book.resv);
                        if self.policy == Policy::Tessera
                            && !reclaimed
                            && self.knobs.reclaim_min_shares.is_some_and(|m| self.shares[j].len() >= m)
                            && self.within(j)
                            && self.reclaim(j, now, t - now)
                        {
                            reclaimed = true;
                            let spot = self.free.place(&self.shares[j], false).expect("reclaimed");
                            self.start(j, spot, now);
                            horizon = self.horizons(now);
                            started.push(j);
                            failed_now = Failed::new();
                            continue;
                        }
                        rest_reserved = self.shares[j].len() == 1;
                        book.add(t, self.est[j], spot, &base, &self.free);
                    }
                }
            } else {
                debug_assert!(easy);
                // Start it now if that delays no reservation.
                if !failed_now.get(g) {
                    let m = book.overlapped(now + self.est[j]);
                    if m == 0 {
                        if self.free.fits(&self.shares[j]) {
                            let spot = self.place_in(j, &self.free, false, &horizon, now).expect("fits");
                            self.extend(&mut horizon, j, &spot, now);
                            self.start(j, spot.clone(), now);
                            book.took(&spot, 0, &self.free);
                            started.push(j);
                            continue;
                        }
                        failed_now.set(g);
                    } else if !book.failed[m - 1].get(g) {
                        if let Some(spot) = self.place_in(j, &book.spare[m - 1], false, &horizon, now) {
                            self.extend(&mut horizon, j, &spot, now);
                            self.start(j, spot.clone(), now);
                            book.took(&spot, m, &self.free);
                            started.push(j);
                            continue;
                        }
                        book.failed[m - 1].set(g);
                        if !self.free.fits(&self.shares[j]) {
                            failed_now.set(g);
                        }
                    }
                }
                let gang = self.shares[j].len() > 1;
                if (gang_resv && gang && book.resv.len() < self.knobs.max_reservations)
                    || (self.policy == Policy::Tessera && self.knobs.reserve_first_of_rest && !gang && !rest_reserved)
                {
                    let (t, spot, base) = self.reserve(j, &book.resv);
                    rest_reserved |= !gang;
                    book.add(t, self.est[j], spot, &base, &self.free);
                }
            }
            if self.free.all[1..].iter().all(|&c| c == 0) && (!book.resv.is_empty() || self.policy != Policy::Tessera) {
                break;
            }
        }
        if !started.is_empty() {
            self.queue.retain(|&j| self.out[j].start.is_none());
        }
    }
}

/// Replays `trace` on `layout` under `policy`; also each job's outcome.
pub fn replay_outcomes(trace: &Trace, layout: &Layout, policy: Policy) -> (Report, Vec<Outcome>) {
    replay_tuned(trace, layout, policy, TesseraKnobs::default())
}

/// The choices inside the `tessera` policy (the default is the policy; the others are there
/// to measure what each part does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TesseraKnobs {
    /// Multi-node gangs (more GPUs than a node) go before all other waiting jobs.
    pub gangs_first: bool,
    /// … only those within their tenant's guarantee.
    pub gangs_first_within_only: bool,
    /// With `gangs_first`, jobs of at least this many GPUs go first too (beyond one node: no
    /// change).
    pub first_min_gpus: u32,
    /// Reclaim borrowed GPUs for a blocked within-guarantee job of at least this many
    /// node-shares (2: multi-node gangs only; `None`: never).
    pub reclaim_min_shares: Option<usize>,
    /// Reclaim only while the work lost stays under this % of the GPU-time the job would wait
    /// for its reservation (by estimates).
    pub reclaim_budget_pct: u32,
    /// Inside each class, jobs go by submission time plus this % of their estimate (0: arrival
    /// order; larger: shorter work first, a long job's lateness ageing it forward).
    pub estimate_weight_pct: u32,
    /// The same for the jobs that go first (multi-node gangs, and jobs of `first_min_gpus`).
    pub gang_estimate_weight_pct: u32,
    /// Every blocked multi-node gang gets a reservation of its own, not only the first
    /// blocked job (conservative backfill for gangs, EASY for the rest).
    pub reserve_every_gang: bool,
    /// At most this many reservations per pass.
    pub max_reservations: usize,
    /// The first blocked job that is not a multi-node gang gets a reservation too (EASY's head
    /// for the rest), even behind gangs' reservations: otherwise an 8-GPU job behind waiting
    /// gangs has none, and the nodes it needs are filled again and again by later jobs.
    pub reserve_first_of_rest: bool,
    /// Single-node jobs go where they extend the node's busy horizon least
    /// ([`Free::place_aligned`]) rather than best-fit alone.
    pub align_ends: bool,
}

impl Default for TesseraKnobs {
    fn default() -> Self {
        TesseraKnobs {
            gangs_first: true,
            gangs_first_within_only: false,
            first_min_gpus: u32::MAX,
            reclaim_min_shares: Some(2),
            reclaim_budget_pct: 5,
            estimate_weight_pct: 25,
            gang_estimate_weight_pct: 0,
            reserve_every_gang: true,
            max_reservations: usize::MAX,
            reserve_first_of_rest: true,
            align_ends: true,
        }
    }
}

/// [`replay_outcomes`] with the `tessera` policy's choices set by `knobs`.
pub fn replay_tuned(trace: &Trace, layout: &Layout, policy: Policy, knobs: TesseraKnobs) -> (Report, Vec<Outcome>) {
    if policy == Policy::Engine {
        return replay_engine(trace, layout, &EngineConfig::default());
    }
    let n = trace.jobs.len();
    let shares: Vec<Vec<u8>> = trace.jobs.iter().map(|j| layout.shares(j.gpus)).collect();
    let mut sim = Sim {
        knobs,
        trace,
        layout,
        policy,
        est: trace.jobs.iter().map(|j| estimate(j.duration)).collect(),
        guarantee: guarantees(trace, layout.gpus()),
        held: vec![0; trace.tenants.len()],
        free: Free::new(layout),
        queue: Vec::new(),
        running: vec![None; n],
        by_est_end: BTreeSet::new(),
        completions: BinaryHeap::new(),
        generation: vec![0; n],
        out: vec![
            Outcome {
                start: None,
                end: None,
                preempted: 0
            };
            n
        ],
        held_spans: Vec::new(),
        preemptions: 0,
        lost_gpu_s: 0,
        beyond_min_racks: 0,
        shares,
    };
    // Refusals: gangs that cannot fit the empty fleet.
    let empty = Free::new(layout);
    let refused: Vec<bool> = sim.shares.iter().map(|s| !empty.fits(s)).collect();
    let mut next = 0usize;
    loop {
        let t_sub = trace.jobs.get(next).map(|j| j.submit);
        let t_end = sim.completions.peek().map(|Reverse((t, _, _))| *t);
        let now = match (t_sub, t_end) {
            (None, None) => break,
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (Some(a), Some(b)) => a.min(b),
        };
        while let Some(&Reverse((t, j, g))) = sim.completions.peek() {
            if t != now {
                break;
            }
            sim.completions.pop();
            if sim.generation[j] == g && sim.running[j].is_some() {
                sim.finish(j, now);
            }
        }
        while next < n && trace.jobs[next].submit == now {
            if !refused[next] {
                sim.queue.push(next);
            }
            next += 1;
        }
        sim.pass(now);
    }
    let report = report(&sim, &refused);
    (report, sim.out)
}

/// Replays `trace` on `layout` under `policy` and measures it.
pub fn replay(trace: &Trace, layout: &Layout, policy: Policy) -> Report {
    replay_outcomes(trace, layout, policy).0
}

/// The window's class of a gang size.
fn class_of(gpus: u32) -> usize {
    match gpus {
        1 => 0,
        2..=4 => 1,
        5..=8 => 2,
        9..=32 => 3,
        _ => 4,
    }
}

const CLASSES: [&str; 5] = ["1", "2-4", "8", "12-32", "64-128"];

fn delays(class: &str, v: &mut [(i64, i64, i64)]) -> Delays {
    // (delay, jct, duration)
    v.sort_unstable();
    let n = v.len();
    let rank = |p: usize| {
        if n == 0 {
            0
        } else {
            v[(p * n).div_ceil(100).max(1) - 1].0
        }
    };
    let mean = |f: &dyn Fn(&(i64, i64, i64)) -> f64| {
        if n == 0 {
            0.0
        } else {
            v.iter().map(f).sum::<f64>() / n as f64
        }
    };
    Delays {
        class: class.to_string(),
        jobs: n,
        mean_s: mean(&|x| x.0 as f64),
        p50_s: rank(50),
        p95_s: rank(95),
        p99_s: rank(99),
        max_s: v.last().map_or(0, |x| x.0),
        mean_jct_s: mean(&|x| x.1 as f64),
        mean_bsld: mean(&|x| (x.1 as f64 / x.2.max(60) as f64).max(1.0)),
    }
}

fn report(sim: &Sim, refused: &[bool]) -> Report {
    measure(
        &Measured {
            trace: sim.trace,
            layout: sim.layout,
            policy: sim.policy,
            guarantee: &sim.guarantee,
            out: &sim.out,
            held_spans: &sim.held_spans,
            preemptions: sim.preemptions,
            lost_gpu_s: sim.lost_gpu_s,
            beyond_min_racks: sim.beyond_min_racks,
        },
        refused,
    )
}

/// What a replay recorded, from which [`measure`] computes the report (the model's [`Sim`] or
/// the real scheduler's replay, [`replay_engine`]).
struct Measured<'a> {
    trace: &'a Trace,
    layout: &'a Layout,
    policy: Policy,
    guarantee: &'a [u64],
    /// Per job: its final start and end.
    out: &'a [Outcome],
    /// Every run's (start, end, gpus), preempted runs included.
    held_spans: &'a [(i64, i64, u32)],
    preemptions: u64,
    lost_gpu_s: i128,
    beyond_min_racks: usize,
}

fn measure(sim: &Measured, refused: &[bool]) -> Report {
    let trace = sim.trace;
    let t0 = trace.jobs.first().map_or(0, |j| j.submit);
    let (w0, w1) = (t0 + WINDOW_DAYS.0 * DAY, t0 + WINDOW_DAYS.1 * DAY);
    let mut per_class: Vec<Vec<(i64, i64, i64)>> = vec![Vec::new(); CLASSES.len()];
    let mut all = Vec::new();
    let mut per_tenant: Vec<(usize, i64)> = vec![(0, 0); trace.tenants.len()];
    let mut refusals = 0;
    let mut makespan = t0;
    for (j, job) in trace.jobs.iter().enumerate() {
        if refused[j] {
            if (w0..w1).contains(&job.submit) {
                refusals += 1;
            }
            continue;
        }
        let o = &sim.out[j];
        let (start, end) = (o.start.expect("every job runs"), o.end.expect("every job ends"));
        makespan = makespan.max(end);
        if !(w0..w1).contains(&job.submit) {
            continue;
        }
        let x = (start - job.submit, end - job.submit, job.duration);
        per_class[class_of(job.gpus)].push(x);
        all.push(x);
        per_tenant[job.tenant].0 += 1;
        per_tenant[job.tenant].1 += x.0;
    }
    let mut held: i128 = 0;
    for &(s, e, g) in sim.held_spans {
        let (a, b) = (s.max(w0), e.min(w1));
        if b > a {
            held += (b - a) as i128 * g as i128;
        }
    }
    let mut classes: Vec<Delays> = Vec::new();
    for (c, v) in per_class.iter_mut().enumerate() {
        if c < 4 || !v.is_empty() {
            classes.push(delays(CLASSES[c], v));
        }
    }
    classes.push(delays("all", &mut all));
    let window_jobs = all.len();
    Report {
        policy: sim.policy.name().to_string(),
        fleet_gpus: sim.layout.gpus(),
        jobs: trace.jobs.len(),
        window_jobs,
        allocation_pct: 100.0 * held as f64 / (sim.layout.gpus() as f64 * (w1 - w0) as f64),
        classes,
        tenants: trace
            .tenants
            .iter()
            .enumerate()
            .map(|(i, name)| TenantFigures {
                tenant: name.clone(),
                guarantee: sim.guarantee[i],
                jobs: per_tenant[i].0,
                mean_delay_s: if per_tenant[i].0 == 0 {
                    0.0
                } else {
                    per_tenant[i].1 as f64 / per_tenant[i].0 as f64
                },
            })
            .collect(),
        preemptions: sim.preemptions,
        gpu_hours_lost: sim.lost_gpu_s as f64 / 3600.0,
        refusals,
        gangs_beyond_min_racks: sim.beyond_min_racks,
        makespan_s: makespan - t0,
    }
}

fn hours(s: f64) -> String {
    format!("{:.2}", s / 3600.0)
}

/// Every metric of `reports` side by side, one column per policy (delays in hours).
pub fn table(reports: &[Report]) -> String {
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let mut row = |name: String, f: &dyn Fn(&Report) -> String| rows.push((name, reports.iter().map(f).collect()));
    row("allocation %".into(), &|r| format!("{:.2}", r.allocation_pct));
    let classes: Vec<String> = reports
        .first()
        .map(|r| r.classes.iter().map(|c| c.class.clone()).collect())
        .unwrap_or_default();
    for c in &classes {
        let get = |r: &Report| r.classes.iter().find(|d| &d.class == c).cloned();
        let c2 = c.clone();
        row(format!("[{c2} GPU] jobs"), &|r| {
            get(r).map_or("-".into(), |d| d.jobs.to_string())
        });
        row(format!("[{c2}] delay mean h"), &|r| {
            get(r).map_or("-".into(), |d| hours(d.mean_s))
        });
        row(format!("[{c2}] delay p50 h"), &|r| {
            get(r).map_or("-".into(), |d| hours(d.p50_s as f64))
        });
        row(format!("[{c2}] delay p95 h"), &|r| {
            get(r).map_or("-".into(), |d| hours(d.p95_s as f64))
        });
        row(format!("[{c2}] delay p99 h"), &|r| {
            get(r).map_or("-".into(), |d| hours(d.p99_s as f64))
        });
        row(format!("[{c2}] delay max h"), &|r| {
            get(r).map_or("-".into(), |d| hours(d.max_s as f64))
        });
        row(format!("[{c2}] mean JCT h"), &|r| {
            get(r).map_or("-".into(), |d| hours(d.mean_jct_s))
        });
        row(format!("[{c2}] mean bounded slowdown"), &|r| {
            get(r).map_or("-".into(), |d| format!("{:.2}", d.mean_bsld))
        });
    }
    let tenants: Vec<(String, u64)> = reports
        .first()
        .map(|r| r.tenants.iter().map(|t| (t.tenant.clone(), t.guarantee)).collect())
        .unwrap_or_default();
    for (i, (name, g)) in tenants.iter().enumerate() {
        row(format!("tenant {name} (guar. {g}) delay mean h"), &|r| {
            let t = &r.tenants[i];
            if t.jobs == 0 { "-".into() } else { hours(t.mean_delay_s) }
        });
    }
    row("preemptions".into(), &|r| r.preemptions.to_string());
    row("GPU-hours lost".into(), &|r| format!("{:.1}", r.gpu_hours_lost));
    row("refusals".into(), &|r| r.refusals.to_string());
    row("gangs beyond fewest racks".into(), &|r| {
        r.gangs_beyond_min_racks.to_string()
    });
    row("makespan days".into(), &|r| {
        format!("{:.2}", r.makespan_s as f64 / DAY as f64)
    });
    let w0 = rows.iter().map(|r| r.0.len()).max().unwrap_or(0).max(6);
    let w: Vec<usize> = reports
        .iter()
        .enumerate()
        .map(|(i, r)| {
            rows.iter()
                .map(|row| row.1[i].len())
                .max()
                .unwrap_or(0)
                .max(r.policy.len())
        })
        .collect();
    let mut out = format!("{:<w0$}", "metric");
    for (i, r) in reports.iter().enumerate() {
        out.push_str(&format!("  {:>1$}", r.policy, w[i]));
    }
    out.push('\n');
    for (name, vals) in &rows {
        out.push_str(&format!("{name:<w0$}"));
        for (i, v) in vals.iter().enumerate() {
            out.push_str(&format!("  {:>1$}", v, w[i]));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(submit: i64, duration: i64, gpus: u32, tenant: usize) -> PhillyJob {
        PhillyJob {
            submit,
            duration,
            gpus,
            tenant,
        }
    }

    /// `racks` racks `r00`, `r01` … of `nodes_per_rack` nodes of `gpus_per_node` GPUs.
    fn racks(racks: usize, nodes_per_rack: usize, gpus_per_node: u8) -> Layout {
        Layout {
            racks: (0..racks).map(|r| format!("r{r:02}")).collect(),
            nodes_per_rack,
            gpus_per_node,
        }
    }

    /// The trace of `jobs` by tenants `tenants` (0, 1 … in order).
    fn trace(jobs: Vec<PhillyJob>, tenants: &[&str]) -> Trace {
        Trace {
            jobs,
            tenants: tenants.iter().map(|t| t.to_string()).collect(),
        }
    }

    /// How long each job of `trace` waited to start, by its outcome in `out`.
    fn waits_in(trace: &Trace, out: &[Outcome]) -> Vec<i64> {
        out.iter()
            .zip(&trace.jobs)
            .map(|(o, j)| o.start.unwrap() - j.submit)
            .collect()
    }

    fn waits(trace: &Trace, layout: &Layout, policy: Policy) -> Vec<i64> {
        let (_, out) = replay_outcomes(trace, layout, policy);
        waits_in(trace, &out)
    }

    #[test]
    fn parses_the_job_table_in_order() {
        let text = "timestamp,duration,num_gpus,gpu_time,cluster\n\
                    2017-09-04 10:30:42,60.0,1,60.0,b\n\
                    2017-09-04 10:30:41,3600.0,16,57600.0,a\n\
                    2017-09-04 10:30:42,10.0,2,20.0,a\n";
        let t = parse(text).unwrap();
        assert_eq!(t.tenants, vec!["b", "a"]);
        let t0 = parse_time("2017-09-04 10:30:41").unwrap();
        assert_eq!(t0, 1_504_521_041);
        assert_eq!(
            t.jobs,
            vec![job(t0, 3600, 16, 1), job(t0 + 1, 60, 1, 0), job(t0 + 1, 10, 2, 1)]
        );
        assert!(parse("timestamp,duration,num_gpus,gpu_time,cluster\nx,1,1,1,a\n").is_err());
        assert_eq!(estimate(3600), 7200);
        assert_eq!(estimate(3601), 14400);
        assert_eq!(guarantees(&t, 768), vec![0, 767]);
    }

    #[test]
    fn the_fleets_and_shapes_follow_the_protocol() {
        let f = fleet("philly-768").unwrap();
        assert_eq!(f.nodes.len(), 96);
        assert_eq!(f.nodes[0].name, "r00-n0");
        assert_eq!(f.nodes[95].name, "r11-n7");
        let l = Layout::of(&f).unwrap();
        assert_eq!(
            (l.racks.len(), l.nodes_per_rack, l.gpus_per_node, l.gpus()),
            (12, 8, 8, 768)
        );
        assert_eq!(Layout::of(&fleet("philly-640").unwrap()).unwrap().gpus(), 640);
        assert_eq!(l.shares(4), vec![4]);
        assert_eq!(l.shares(12), vec![8, 4]);
        assert_eq!(l.shares(128), vec![8; 16]);
        assert_eq!(l.min_racks(16), 2);
        // The scheduler's requests: one node up to 8, gangs beyond, in one rack up to 64.
        assert_eq!(l.request_of(4), (Request::whole(4), None));
        let rack = TopologyConstraint::required("rack");
        assert_eq!(
            l.request_of(16),
            (
                Request::whole(8),
                Some(GangRequest::whole_nodes(16).with_topology(rack.clone()))
            )
        );
        // The protocol's remainder share: 12 = 8 + 4, 20 = 8 + 8 + 4, one rack each.
        let twelve = GangRequest::whole_nodes(12)
            .with_remainder()
            .with_topology(rack.clone());
        assert_eq!(l.request_of(12), (Request::whole(8), Some(twelve.clone())));
        assert_eq!(twelve.remainder_gpus(l.gpus_per_node), 4);
        assert_eq!(
            l.request_of(20).1,
            Some(
                GangRequest::whole_nodes(20)
                    .with_remainder()
                    .with_topology(rack.clone())
            )
        );
        // 68 GPUs = 9 shares: beyond one 8-node rack, and no segments (68 is no multiple of 64).
        assert_eq!(l.request_of(68).1, Some(GangRequest::whole_nodes(68).with_remainder()));
        assert_eq!(
            l.request_of(64).1,
            Some(GangRequest::whole_nodes(64).with_topology(rack))
        );
        assert_eq!(
            l.request_of(128).1,
            Some(GangRequest::whole_nodes(128).with_segment(64))
        );
        // A 128-GPU gang takes two whole racks; one that cannot fit the empty fleet is refused.
        let trace = trace(vec![job(0, 100, 128, 0), job(0, 100, 1024, 0)], &["a"]);
        let (r, out) = replay_outcomes(&trace, &l, Policy::Backfill);
        assert_eq!(out[0].start, Some(0));
        assert_eq!(out[1].start, None);
        assert_eq!(r.gangs_beyond_min_racks, 0);
    }

    /// 2 racks × 2 nodes × 4 GPUs. Tenants A (0) and B (1); guarantees A ⌊88,400 × 16 ÷
    /// 131,600⌋ = 10, B ⌊43,200 × 16 ÷ 131,600⌋ = 5.
    ///
    /// t=0 J0 (A, 4 GPUs, 2 h, estimate 4 h) and J1 (A, 8 = 4 + 4, 2 h) take r00-n0 and r01.
    /// t=10 J2 (B, 8, 1 h) cannot fit (only r00-n1 is free); t=20 J3 (B, 2, 2 h, estimate 4 h);
    /// t=30 J4 (A, 2, 1,000 s, estimate 2 h).
    /// * fifo: J2 blocks everyone until J0 and J1 end at 7,200: waits 7,190, 7,180, 7,170.
    /// * backfill: J2's reservation is t=14,400 (the estimates) on r00 (tie: first rack); J3
    ///   (ends by estimate at 14,420) would hold r00-n1, reserved: waits; J4 ends by 7,230 ≤
    ///   14,400 and starts at once on r00-n1. At 7,200 J2 and J3 start: 7,190, 7,180, 0.
    /// * topology-bestfit: J3 and J4 start at once on r00-n1; at 7,200 J2 fits only r01:
    ///   7,190, 0, 0.
    /// * quota-backfill: J3 is within B's guarantee (0 + 2 ≤ 5), so goes before J2 and starts
    ///   at once; J4 is short and backfills: 7,190, 0, 0.
    /// * tessera: multi-node gangs go first, so at t=0 J1 takes r00 (tie: first rack) and J0
    ///   r01-n0; J2 is the head, its reservation at 14,400 is on r00 (tie), so J3 may hold
    ///   r01-n1 past it and starts at once, and J4 too: 7,190, 0, 0. No reclaim (J2 is beyond
    ///   B's guarantee: 8 > 5).
    #[test]
    fn hand_made_waits_for_each_policy() {
        let layout = racks(2, 2, 4);
        let trace = trace(
            vec![
                job(0, 7200, 4, 0),
                job(0, 7200, 8, 0),
                job(10, 3600, 8, 1),
                job(20, 7200, 2, 1),
                job(30, 1000, 2, 0),
            ],
            &["A", "B"],
        );
        assert_eq!(guarantees(&trace, 16), vec![10, 5]);
        let expect = [
            (Policy::Fifo, [0, 0, 7190, 7180, 7170]),
            (Policy::Backfill, [0, 0, 7190, 7180, 0]),
            (Policy::TopologyBestfit, [0, 0, 7190, 0, 0]),
            (Policy::QuotaBackfill, [0, 0, 7190, 0, 0]),
            (Policy::Tessera, [0, 0, 7190, 0, 0]),
        ];
        for (p, w) in expect {
            assert_eq!(waits(&trace, &layout, p), w, "{}", p.name());
        }
    }

    /// One rack of 4 nodes × 2 GPUs. A (0) holds every node with two 10 h gangs of 2 × 2 GPUs
    /// from t=0; B (1) submits a 2 × 2-GPU gang of 1 h at t=100 and a later one at t=200,000.
    /// Guarantees: A ⌊288,000 × 8 ÷ 702,400⌋ = 3, B ⌊414,400 × 8 ÷ 702,400⌋ = 4. The baselines
    /// make B's gang wait for A's to end (35,900 s). Tessera finds it within B's guarantee and A
    /// over its own; its reservation is at 72,000 (A's 20 h estimates), so it may lose up to 5 %
    /// of 71,900 s × 4 GPUs; it preempts J0 (the least work done: 400 GPU-s; J1 ties and comes
    /// later) and starts J2 at once; J0 restarts from the beginning when J2 ends at 3,700.
    #[test]
    fn tessera_reclaims_borrowed_gpus_for_a_tenant_within_its_guarantee() {
        let layout = racks(1, 4, 2);
        let trace = trace(
            vec![
                job(0, 36000, 4, 0),
                job(0, 36000, 4, 0),
                job(100, 3600, 4, 1),
                job(200_000, 100_000, 4, 1),
            ],
            &["A", "B"],
        );
        assert_eq!(guarantees(&trace, 8), vec![3, 4]);
        for p in [
            Policy::Fifo,
            Policy::Backfill,
            Policy::TopologyBestfit,
            Policy::QuotaBackfill,
        ] {
            assert_eq!(waits(&trace, &layout, p), [0, 0, 35900, 0], "{}", p.name());
        }
        let (r, out) = replay_outcomes(&trace, &layout, Policy::Tessera);
        let w = waits_in(&trace, &out);
        assert_eq!(w, [3700, 0, 0, 0]);
        assert_eq!(out[0].preempted, 1);
        assert_eq!(out[0].end, Some(3700 + 36000));
        assert_eq!(r.preemptions, 1);
        assert!((r.gpu_hours_lost - 400.0 / 3600.0).abs() < 1e-9);
    }

    /// 2 racks × 2 nodes × 4 GPUs, one tenant (guarantee 16, so never over it: no reclaim).
    /// An 8-GPU gang takes a whole rack. t=0 H (8 GPUs, 1 h, estimate 2 h) takes r00, A (4, 2 h,
    /// estimate 4 h) r01-n0; t=10 gangs G1 (8, 10 h, estimate 20 h) and G2 (8, 1 h); t=20 L
    /// (4, 10 h, estimate 20 h), which fits only r01-n1.
    /// * One reservation (the old rule, EASY): at t=10 G1 is the head, reserved at 7,200 (H's
    ///   estimate) on r00; G2 has none. At t=20 L leaves r00 alone, so it starts on r01-n1 and
    ///   holds it to 36,020. H ends at 3,600 and G1 starts (wait 3,590); A ends at 7,200, but
    ///   r01-n1 is L's until 36,020: G2 waits 36,010.
    /// * A reservation per gang (Tessera): at t=10 G2 is reserved around G1's [7,200, 79,200)
    ///   on r00: at 14,400 (A's estimate) on r01. L would run past 14,400 on r01-n1, which G2
    ///   holds then: it waits (its own reservation comes after G2's, at 21,600). G1 starts at
    ///   3,600 (3,590); at 7,200 A ends and G2 starts on r01 (7,190); it ends at 10,800 and L
    ///   starts (10,780).
    #[test]
    fn every_waiting_gang_gets_its_own_reservation() {
        let layout = racks(2, 2, 4);
        let trace = trace(
            vec![
                job(0, 3600, 8, 0),
                job(0, 7200, 4, 0),
                job(10, 36000, 8, 0),
                job(10, 3600, 8, 0),
                job(20, 36000, 4, 0),
            ],
            &["A"],
        );
        assert_eq!(guarantees(&trace, 16), vec![16]);
        let waits_of = |k: TesseraKnobs| -> Vec<i64> {
            let (r, out) = replay_tuned(&trace, &layout, Policy::Tessera, k);
            assert_eq!(r.preemptions, 0);
            waits_in(&trace, &out)
        };
        let one = TesseraKnobs {
            reserve_every_gang: false,
            reserve_first_of_rest: false,
            ..TesseraKnobs::default()
        };
        assert_eq!(waits_of(one), [0, 0, 3590, 36010, 0]);
        assert_eq!(waits_of(TesseraKnobs::default()), [0, 0, 3590, 7190, 10780]);
        // EASY backfill (the baseline) is the old rule.
        assert_eq!(waits(&trace, &layout, Policy::Backfill), [0, 0, 3590, 36010, 0]);
    }

    /// Aligned placement on one rack of 2 nodes × 4 GPUs, each node with 1 GPU held: r00-n0
    /// until 72,000 s (its horizon), r00-n1 until 7,200. A job that ends before both horizons
    /// extends neither: best-fit, then name order (r00-n0). One that ends at 70,000 or 7,300
    /// extends r00-n0's not at all and r00-n1's by 62,800 or 100 s: r00-n0, with the long work,
    /// so r00-n1 drains whole at 7,200. With the horizons the other way round, a job ending at
    /// 80,000 extends r00-n0 by 72,800 s and r00-n1 by 8,000: r00-n1.
    #[test]
    fn single_node_jobs_share_nodes_with_work_that_ends_with_them() {
        let layout = racks(1, 2, 4);
        let mut f = Free::new(&layout);
        // r00-n0 holds work until 72,000, r00-n1 work until 7,200.
        f.take(&vec![(0, 1), (1, 1)]);
        let horizon = [72_000, 7_200];
        assert_eq!(f.place_aligned(&f, 1, &horizon, 7_000), Some(vec![(0, 1)]));
        assert_eq!(f.place_aligned(&f, 1, &horizon, 70_000), Some(vec![(0, 1)]));
        assert_eq!(f.place_aligned(&f, 1, &horizon, 7_300), Some(vec![(0, 1)]));
        assert_eq!(f.place_aligned(&f, 1, &[7_200, 72_000], 80_000), Some(vec![(1, 1)]));
        f.take(&vec![(1, 3)]);
        assert_eq!(f.place_aligned(&f, 4, &[7_200, 72_000], 3_600), None);
    }

    #[test]
    fn reordering_shuffles_only_within_a_second() {
        let jobs: Vec<PhillyJob> = (0..40).map(|i| job(i / 10, i, 1, 0)).collect();
        let t = Trace {
            jobs,
            tenants: vec!["a".into()],
        };
        assert_eq!(t.reordered(0), t);
        let r = t.reordered(7);
        assert_ne!(r, t);
        assert_eq!(r, t.reordered(7));
        for (a, b) in r.jobs.iter().zip(&t.jobs) {
            assert_eq!(a.submit, b.submit);
        }
        let layout = racks(1, 1, 1);
        let reports: Vec<Report> = [0, 7]
            .iter()
            .map(|&s| replay(&t.reordered(s), &layout, Policy::Fifo))
            .collect();
        let m = Report::mean(&reports).unwrap();
        assert_eq!(m.makespan_s, reports[0].makespan_s);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let mut v: Vec<(i64, i64, i64)> = (1..=20).map(|i| (i, i, 60)).collect();
        let d = delays("x", &mut v);
        assert_eq!((d.p50_s, d.p95_s, d.p99_s, d.max_s), (10, 19, 20, 20));
        assert_eq!(d.mean_s, 10.5);
    }
}
