//! Lower bounds on the GPU left unallocated: what fractional shares leave free whatever their
//! placement, and ([`floors`]) what any scheduler, or any that never refuses a pod that fits,
//! leaves after a prefix of an arrival order, whichever pods fail.
//!
//! Shares of one GPU (`milli < 1000`) are items of a bin-packing problem with bins of 1000. Any
//! placement of a multiset of shares uses at least as many GPUs as the linear-programming
//! relaxation of that bin packing, and the relaxation is bounded below by any *dual-feasible
//! price*: a price per share size such that no set of shares that fits on one GPU costs more
//! than 1. Then `GPUs ≥ Σ price(share)`, so the free milli on the GPUs that hold shares is at
//! least `1000 × Σ price − Σ milli`.
//!
//! [`price_twelfths`] is such a price, in twelfths of a GPU so that it is exact integer
//! arithmetic. It is the optimal dual of the relaxation on the openb default pod list, and it
//! is feasible for shares of any size (a test checks every set of integer shares that fits one
//! GPU), so the bound holds for any demand. Shares also never fit in fewer GPUs than their
//! total milli needs, which is the bound where small shares dominate.
//!
//! [`SharePrices::solve`] computes that optimal dual for any mix of share sizes (column
//! generation over the packing patterns, with an exact check that the rounded prices stay
//! feasible); on the default pod list's mix it gives [`price_twelfths`] exactly. Tessera's
//! priced fill uses it on the workload it learns, and the replay computes the bounds below at
//! the prices solved from the replayed pod list and at the fixed table, reporting the larger
//! (any dual-feasible table gives valid bounds; `replay::bound_prices`).
//!
//! On its own the bound answers "how close to the limit is a policy that places every share
//! that arrives", and says nothing of a run in which shares fail: on the openb default file,
//! the 810-milli shares alone strand 190 milli each that only the rare shares of 160 milli or
//! less can use, and a scheduler that lets some 810s fail strands less. [`floors`] accounts
//! for the failures.

/// Milli per GPU.
const GPU: u64 = tessera_model::GpuUnits::ONE_GPU.0;

/// Twelfths of a GPU that a share of `milli` costs at least, by size band: 0 below 220, 1 for
/// 220-229, 3 for 230-319, 4 for 320-459, 6 for 460-549, 8 for 550-809, 12 from 810. For
/// example 220 + 230 + 550 = 1000 costs 1 + 3 + 8 = 12, and 470 + 470 costs 12.
pub fn price_twelfths(milli: u16) -> u64 {
    match milli {
        0..220 => 0,
        220..230 => 1,
        230..320 => 3,
        320..460 => 4,
        460..550 => 6,
        550..810 => 8,
        _ => 12,
    }
}

/// Units of a GPU in which [`SharePrices`] are exact integers: 720,720 = lcm(1..=16), so a
/// price in twelfths (60,060 units each), tenths, sixteenths ... is kept exactly.
pub const PRICE_UNITS: u64 = 720_720;

/// At most this many share sizes (the most popular) enter the LP of [`SharePrices::solve`], so
/// that a learning policy can solve it at each model epoch: about 0.2 ms with the 20 sizes of
/// an openb file, up to about 20 ms with 48 (release build; random mixes of 20 to 999 sizes).
/// Without the cap, column generation stalled on degenerate pivots: 0.2 s with 100 sizes.
pub const LP_SIZES: usize = 48;

/// Dual-feasible prices per share size (in [`PRICE_UNITS`] of a GPU) derived from a share mix:
/// the optimal dual of the cutting-stock LP of that mix (the least number of GPUs, fractional
/// patterns allowed, that hold the mix's shares), extended to every size as the price of the
/// largest priced size not above it. No set of shares that fits one GPU costs more than
/// [`PRICE_UNITS`] (checked exactly when built), so for any shares `GPUs ≥ Σ price / units`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SharePrices {
    /// `(size, price)` by increasing size, the prices non-decreasing.
    steps: Vec<(u16, u64)>,
}

impl SharePrices {
    /// The fixed table [`price_twelfths`] (the dual of the openb default pod list), in units.
    pub fn default_file() -> Self {
        let steps = [220u16, 230, 320, 460, 550, 810]
            .iter()
            .map(|&m| (m, price_twelfths(m) * (PRICE_UNITS / 12)))
            .collect();
        SharePrices { steps }
    }

    /// The optimal dual of the cutting-stock LP of `mix`: `(milli, weight)` pairs (sizes
    /// outside 1..=999 and non-positive weights ignored; the weights need not be counts, only
    /// their proportions matter). Column generation: the LP over the patterns found so far is
    /// solved (revised simplex on the primal, from one single-size pattern per size), then an
    /// unbounded knapsack over 1000 milli finds the pattern the dual prices `y` value most; when
    /// none is worth more than 1 the prices are optimal. They are then rounded to
    /// [`PRICE_UNITS`] and, if rounding made some pattern cost more than a GPU (checked by an
    /// exact integer knapsack), scaled down so that none does. Only the [`LP_SIZES`] most popular
    /// sizes enter the LP (all 20 of an openb file); the others get the extension's price.
    /// Deterministic.
    pub fn solve(mix: &[(u16, f64)]) -> Self {
        let mut sizes: Vec<(u16, f64)> = Vec::new();
        for &(m, w) in mix {
            if m == 0 || m as u64 >= GPU || w.is_nan() || w <= 0.0 {
                continue;
            }
            match sizes.iter_mut().find(|s| s.0 == m) {
                Some(s) => s.1 += w,
                None => sizes.push((m, w)),
            }
        }
        // The most popular sizes only (by weight, then size), so that the cost stays small:
        // the others are priced by the extension, which keeps the table feasible.
        sizes.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        sizes.truncate(LP_SIZES);
        sizes.sort_by_key(|s| s.0);
        if sizes.is_empty() {
            return SharePrices::default();
        }
        let total: f64 = sizes.iter().map(|s| s.1).sum();
        let weights: Vec<f64> = sizes.iter().map(|s| s.1 / total).collect();
        let milli: Vec<usize> = sizes.iter().map(|s| s.0 as usize).collect();
        let y = packing_dual(&milli, &weights);
        let mut units: Vec<u64> = y
            .iter()
            .map(|&v| (v.max(0.0) * PRICE_UNITS as f64).round() as u64)
            .collect();
        let most = knapsack_units(&milli, &units);
        if most > PRICE_UNITS {
            for u in &mut units {
                *u = *u * PRICE_UNITS / most;
            }
        }
        // A share is worth at least any smaller share (it can take its place).
        let mut steps: Vec<(u16, u64)> = Vec::new();
        for (&m, &u) in milli.iter().zip(&units) {
            if u > steps.last().map_or(0, |s| s.1) {
                steps.push((m as u16, u));
            }
        }
        SharePrices { steps }
    }

    /// The price of a share of `milli` (0 for a whole GPU or more, as [`ShareBound`] ignores
    /// those).
    pub fn units(&self, milli: u16) -> u64 {
        if milli as u64 >= GPU {
            return 0;
        }
        let i = self.steps.partition_point(|s| s.0 <= milli);
        if i == 0 { 0 } else { self.steps[i - 1].1 }
    }

    /// The sizes at which the price rises, with the price from there on.
    pub fn steps(&self) -> &[(u16, u64)] {
        &self.steps
    }

    /// The prices in the coarsest exact unit: `(per_gpu, divisor)` such that every price in
    /// [`PRICE_UNITS`] divided by `divisor` is an integer and `per_gpu` of those make a GPU
    /// (12 and 60,060 for a table in twelfths).
    pub fn exact_unit(&self) -> (u64, u64) {
        fn gcd(a: u64, b: u64) -> u64 {
            if b == 0 { a } else { gcd(b, a % b) }
        }
        let divisor = self.steps.iter().fold(PRICE_UNITS, |g, s| gcd(g, s.1));
        (PRICE_UNITS / divisor, divisor)
    }

    /// The most that any set of shares fitting one GPU costs, over every integer share size
    /// (at most [`PRICE_UNITS`] for a dual-feasible table).
    pub fn most_costly_gpu(&self) -> u64 {
        let milli: Vec<usize> = self.steps.iter().map(|s| s.0 as usize).collect();
        let units: Vec<u64> = self.steps.iter().map(|s| s.1).collect();
        knapsack_units(&milli, &units)
    }
}

/// The most `value` that items of sizes `milli` (any number of each) fit into one GPU, with
/// how many of each: an unbounded knapsack over 0..=1000 milli (the first best item on ties).
fn knapsack(milli: &[usize], value: impl Fn(usize) -> f64) -> (f64, Vec<u32>) {
    let cap = GPU as usize;
    let mut best = vec![0.0f64; cap + 1];
    let mut last: Vec<Option<usize>> = vec![None; cap + 1];
    for r in 1..=cap {
        best[r] = best[r - 1];
        last[r] = None;
        for (i, &m) in milli.iter().enumerate() {
            if m <= r && best[r - m] + value(i) > best[r] + 1e-12 {
                best[r] = best[r - m] + value(i);
                last[r] = Some(i);
            }
        }
    }
    let mut counts = vec![0u32; milli.len()];
    let mut r = cap;
    while r > 0 {
        match last[r] {
            Some(i) => {
                counts[i] += 1;
                r -= milli[i];
            }
            None => r -= 1,
        }
    }
    (best[cap], counts)
}

/// [`knapsack`]'s value in exact integers.
fn knapsack_units(milli: &[usize], units: &[u64]) -> u64 {
    let cap = GPU as usize;
    let mut best = vec![0u64; cap + 1];
    for r in 1..=cap {
        best[r] = best[r - 1];
        for (&m, &u) in milli.iter().zip(units) {
            if m <= r {
                best[r] = best[r].max(best[r - m] + u);
            }
        }
    }
    best[cap]
}

/// The optimal dual `y` of the cutting-stock LP `min Σ x_p` subject to `Σ_p a_ip x_p ≥ w_i`,
/// `x ≥ 0`, over every pattern `a` of the sizes `milli` that fits one GPU: the revised simplex
/// on the primal (a dense `n × n` basis inverse), starting from the basis of one single-size
/// pattern per size (as many of it as fit, a feasible basis), with column generation: the
/// entering column is a surplus column whose dual is negative, else the pattern the knapsack
/// values most at `y`, until none is worth more than 1. Each iteration costs a knapsack
/// (`n × 1000`) and an `O(n²)` update. The iterations are capped; the caller makes the prices
/// feasible whatever `y` comes back.
fn packing_dual(milli: &[usize], w: &[f64]) -> Vec<f64> {
    const EPS: f64 = 1e-9;
    let n = milli.len();
    // Basis inverse, basic values and the basic columns' costs (1 a pattern, 0 a surplus).
    let mut binv = vec![vec![0.0; n]; n];
    let mut xb = vec![0.0; n];
    let mut cost = vec![1.0; n];
    for i in 0..n {
        let k = (GPU as usize / milli[i]) as f64;
        binv[i][i] = 1.0 / k;
        xb[i] = w[i] / k;
    }
    let mut y = vec![0.0; n];
    for _ in 0..(50 * n + 1000) {
        for (j, yj) in y.iter_mut().enumerate() {
            *yj = (0..n).map(|i| cost[i] * binv[i][j]).sum();
        }
        // The entering column and its cost.
        let (col, c) = if let Some(j) = (0..n).find(|&j| y[j] < -EPS) {
            let mut col = vec![0.0; n];
            col[j] = -1.0;
            (col, 0.0)
        } else {
            let (value, counts) = knapsack(milli, |i| y[i].max(0.0));
            if value <= 1.0 + EPS {
                break;
            }
            (counts.iter().map(|&c| c as f64).collect::<Vec<f64>>(), 1.0)
        };
        let d: Vec<f64> = (0..n).map(|i| (0..n).map(|k| binv[i][k] * col[k]).sum()).collect();
        let mut leave: Option<(usize, f64)> = None;
        for i in 0..n {
            if d[i] > EPS {
                let ratio = xb[i] / d[i];
                if leave.is_none_or(|(_, best)| ratio < best - 1e-12) {
                    leave = Some((i, ratio));
                }
            }
        }
        let Some((r, _)) = leave else {
            break; // unbounded: cannot happen, every size is covered by a pattern
        };
        let p = d[r];
        for v in binv[r].iter_mut() {
            *v /= p;
        }
        xb[r] /= p;
        let (row, xr) = (binv[r].clone(), xb[r]);
        for i in 0..n {
            if i != r && d[i] != 0.0 {
                for (v, rv) in binv[i].iter_mut().zip(&row) {
                    *v -= d[i] * rv;
                }
                xb[i] -= d[i] * xr;
            }
        }
        cost[r] = c;
    }
    y
}

/// Running totals of shares, with the bound on the free milli any placement of them
/// leaves on the GPUs that hold them, at a dual-feasible price table (the fixed table
/// [`price_twelfths`] by default).
#[derive(Clone, Debug)]
pub struct ShareBound {
    prices: SharePrices,
    units: u64,
    milli: u64,
}

impl Default for ShareBound {
    fn default() -> Self {
        ShareBound::new(SharePrices::default_file())
    }
}

impl ShareBound {
    /// No shares yet, priced by `prices` (which must be dual-feasible, as
    /// [`SharePrices::solve`] and [`SharePrices::default_file`] are).
    pub fn new(prices: SharePrices) -> Self {
        ShareBound {
            prices,
            units: 0,
            milli: 0,
        }
    }

    /// Adds one share (ignores whole GPUs and zero).
    pub fn add(&mut self, milli: u16) {
        if milli == 0 || milli as u64 >= GPU {
            return;
        }
        self.units += self.prices.units(milli);
        self.milli += milli as u64;
    }

    /// At least this many GPUs hold these shares, however they are placed.
    pub fn gpus(&self) -> u64 {
        self.units.div_ceil(PRICE_UNITS).max(self.milli.div_ceil(GPU))
    }

    /// At least this many milli stay free on the GPUs that hold these shares, however they are
    /// placed.
    pub fn free_milli(&self) -> u64 {
        self.gpus() * GPU - self.milli
    }
}

/// Lower bounds on the GPU left unallocated after the first pods of an arrival order, whatever
/// the placement (see `docs/openb-replay.md` for the argument).
///
/// With capacity `C`, arrived GPU demand `R` and a set `S` of failed pods, the unallocated
/// milli-GPU is exactly `C − R + F(S)` (`F`: the GPU demand of `S`), and at least the waste
/// that the placed shares leave on the GPUs holding them, at least `1000 × Σ price −
/// Σ milli` over them (price in GPUs, at any dual-feasible [`SharePrices`]). So whatever `S` the placement ends
/// with, the unallocated milli is at least `min over S of max(C − R + F(S), W(placed))`, and,
/// both terms being sums over `S`, at least `λ (C − R + F(S)) + (1 − λ) W` for every
/// `λ ∈ [0, 1]`: a min-max relaxed to the best of its Lagrangian bounds.
///
/// * [`Floors::any_milli`]: `S` may be any set of pods (a scheduler may refuse a pod that
///   fits, leaving room for others);
/// * [`Floors::non_refusing_milli`]: `S` must be closed under domination in time: once a pod
///   fails (no node could hold it), every later pod needing at least as much CPU, memory and
///   GPU (on a subset of its models) fails too, since free resources only shrink while pods
///   never leave. It bounds every policy that never refuses a pod some node could hold. The
///   least weight of such a closed set is a minimum cut (Picard's closure problem), solved
///   exactly per `λ`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Floors {
    pub any_milli: f64,
    pub non_refusing_milli: f64,
}

/// Steps of `λ` in `[0, 1]` (the bound at the best step is within a 65,536th of the bound's
/// slope of the best `λ`).
const LAMBDA_STEPS: i64 = 1 << 16;

/// Whether a pod needing `q` fails wherever a pod needing `p` fails: at least as much CPU,
/// memory and GPU, on a subset of its models. Model masks must be exact (0 = any model).
pub fn dominates(q: &crate::policy::Demand, p: &crate::policy::Demand) -> bool {
    let models = p.models == 0 || (q.models != 0 && q.models & !p.models == 0);
    let gpu = if p.gpus == 0 {
        true
    } else if p.is_fraction() {
        (q.is_fraction() && q.milli >= p.milli && q.gpu_mem_mib >= p.gpu_mem_mib)
            || (!q.is_fraction() && q.gpus >= 1 && p.gpu_mem_mib == 0)
    } else {
        !q.is_fraction() && q.gpus >= p.gpus
    };
    q.cpu_milli >= p.cpu_milli && q.memory_mib >= p.memory_mib && models && gpu
}

/// [`Floors`] after the pods `arrived` (in arrival order) on a fleet of `capacity_milli`, with
/// the shares priced by `prices` (dual-feasible: [`SharePrices::solve`] of any mix, or
/// [`SharePrices::default_file`]). `closure`: whether the non-refusing floor may use the
/// domination rule, which needs exact model masks and the openb fit rule (whole GPUs: any free
/// ones of the node); without it the non-refusing floor is the any-scheduler floor.
pub fn floors(arrived: &[crate::policy::Demand], capacity_milli: u64, closure: bool, prices: &SharePrices) -> Floors {
    let w = Weights::new(arrived, capacity_milli, prices);
    let any = w.any();
    let non_refusing = if closure {
        let g = ClosureGraph::new(arrived);
        let n = arrived.len();
        let (all, none) = (vec![true; n], vec![false; n]);
        // The least closed sets shrink as λ grows (every weight grows with it), so at λ the
        // least one lies between those of the nearest steps evaluated above and below: only
        // the pods in between are free.
        let mut sets: std::collections::BTreeMap<i64, Vec<bool>> = Default::default();
        let (_, at) = best_lambda_at(|i| {
            let within = sets.range(..i).next_back().map_or(&all, |s| s.1);
            let holds = sets.range(i + 1..).next().map_or(&none, |s| s.1);
            let (v, set) = g.least_closure(|p| w.weight(i, p), within, holds);
            sets.insert(i, set);
            w.base(i) + v
        });
        // The bound at the best step, on the whole graph.
        w.base(at) + g.least_closure(|p| w.weight(at, p), &all, &none).0
    } else {
        any
    };
    Floors {
        any_milli: any as f64 / w.scale(),
        // A bound for any scheduler is one for a non-refusing one.
        non_refusing_milli: non_refusing.max(any) as f64 / w.scale(),
    }
}

/// [`Floors::any_milli`] alone (no minimum cut).
pub fn any_floor_milli(arrived: &[crate::policy::Demand], capacity_milli: u64, prices: &SharePrices) -> f64 {
    let w = Weights::new(arrived, capacity_milli, prices);
    w.any() as f64 / w.scale()
}

/// The Lagrangian terms, in `1 / k` of a milli-GPU with `k` the prices' exact unit per GPU
/// ([`SharePrices::exact_unit`]; 12 for prices in twelfths): per pod its GPU demand `d` and
/// price excess `e` (`1000 × price − milli` for a share, 0 otherwise), the slack `C − R` and
/// the priced waste `W` of all the shares.
struct Weights {
    d12: Vec<i64>,
    e12: Vec<i64>,
    slack12: i64,
    w12: i64,
    /// Distinct `(d, e)` with their counts.
    classes: Vec<(i64, i64, i64)>,
    /// `k`.
    per_gpu: i64,
}

impl Weights {
    fn new(arrived: &[crate::policy::Demand], capacity_milli: u64, prices: &SharePrices) -> Self {
        // Integers throughout: every term times LAMBDA_STEPS must fit an i64 with room for
        // sums (about 9.2e18). With prices in twelfths (every openb file) k = 12; a table
        // needing so fine a unit that a fleet's capacity would overflow falls back to the
        // fixed table, which is dual-feasible too.
        let (mut k, mut div) = prices.exact_unit();
        let mut prices = prices;
        let fixed = SharePrices::default_file();
        let demand: u64 = arrived.iter().map(|p| p.total_milli()).sum();
        if (capacity_milli.max(demand) as u128 + GPU as u128) * k as u128 * LAMBDA_STEPS as u128 * 4 > i64::MAX as u128
        {
            prices = &fixed;
            (k, div) = fixed.exact_unit();
        }
        let per_gpu = k as i64;
        let d12: Vec<i64> = arrived.iter().map(|p| per_gpu * p.total_milli() as i64).collect();
        let e12: Vec<i64> = arrived
            .iter()
            .map(|p| {
                if p.is_fraction() && p.milli > 0 {
                    (GPU * (prices.units(p.milli) / div)) as i64 - per_gpu * p.milli as i64
                } else {
                    0
                }
            })
            .collect();
        let slack12 = per_gpu * capacity_milli as i64 - d12.iter().sum::<i64>();
        let w12 = e12.iter().sum();
        let mut counts = std::collections::HashMap::new();
        for (&d, &e) in d12.iter().zip(&e12) {
            *counts.entry((d, e)).or_insert(0) += 1;
        }
        let classes = counts.into_iter().map(|((d, e), c)| (d, e, c)).collect();
        Weights {
            d12,
            e12,
            slack12,
            w12,
            classes,
            per_gpu,
        }
    }

    /// With `λ = i / N`, `N λ (C − R) + N (1 − λ) W`, × k.
    fn base(&self, i: i64) -> i64 {
        i * self.slack12 + (LAMBDA_STEPS - i) * self.w12
    }

    /// Pod `p`'s weight in a failure set: `N (λ d − (1 − λ) e)`, × k.
    fn weight(&self, i: i64, p: usize) -> i64 {
        i * self.d12[p] - (LAMBDA_STEPS - i) * self.e12[p]
    }

    /// The bound × k N when any set may fail: every pod of negative weight does.
    fn any(&self) -> i64 {
        let least = |i: i64| {
            self.classes
                .iter()
                .map(|&(d, e, c)| c * (i * d - (LAMBDA_STEPS - i) * e).min(0))
                .sum::<i64>()
        };
        best_lambda(|i| self.base(i) + least(i)).max(0)
    }

    fn scale(&self) -> f64 {
        self.per_gpu as f64 * LAMBDA_STEPS as f64
    }
}

/// The largest value of a concave function of `i` in `0..=LAMBDA_STEPS`, by golden-section
/// search over the integers; every value is a valid bound, so the largest one evaluated is
/// returned whatever the shape.
fn best_lambda(f: impl FnMut(i64) -> i64) -> i64 {
    best_lambda_at(f).0
}

/// [`best_lambda`], with the step where it is reached.
fn best_lambda_at(mut f: impl FnMut(i64) -> i64) -> (i64, i64) {
    let mut memo = std::collections::HashMap::new();
    let mut eval = |i: i64| *memo.entry(i).or_insert_with(|| f(i));
    let (mut lo, mut hi) = (0, LAMBDA_STEPS);
    let golden = |lo: i64, hi: i64| ((hi - lo) as f64 * 0.381_966).round() as i64;
    let (mut m1, mut m2) = (lo + golden(lo, hi), hi - golden(lo, hi));
    while hi - lo > 3 {
        // Concave: the maximum is in [m1, hi] if f(m1) < f(m2), in [lo, m2] if not.
        if eval(m1) < eval(m2) {
            lo = m1;
            m1 = m2;
            m2 = hi - golden(lo, hi);
        } else {
            hi = m2;
            m2 = m1;
            m1 = lo + golden(lo, hi);
        }
        if m1 >= m2 {
            (m1, m2) = (lo + (hi - lo) / 3, hi - (hi - lo) / 3);
        }
    }
    for i in lo..=hi {
        eval(i);
    }
    memo.into_iter().map(|(i, v)| (v, i)).max().expect("evaluated")
}

/// The domination rule as a graph: an edge from each pod to the next later pod of every pod
/// type that dominates its type (its own included); following edges from a pod reaches every
/// later pod that dominates it.
struct ClosureGraph {
    n: usize,
    /// Closure edges, as (from, to).
    edges: Vec<(u32, u32)>,
}

impl ClosureGraph {
    fn new(pods: &[crate::policy::Demand]) -> Self {
        let mut types: Vec<crate::policy::Demand> = Vec::new();
        let mut index = std::collections::HashMap::new();
        let ty: Vec<usize> = pods
            .iter()
            .map(|p| {
                let key = crate::policy::Demand { tenant: None, ..*p };
                *index.entry(key).or_insert_with(|| {
                    types.push(key);
                    types.len() - 1
                })
            })
            .collect();
        let nt = types.len();
        let dom: Vec<bool> = (0..nt * nt)
            .map(|k| dominates(&types[k % nt], &types[k / nt]))
            .collect();
        let above: Vec<Vec<usize>> = (0..nt)
            .map(|p| (0..nt).filter(|&q| dom[p * nt + q]).collect())
            .collect();
        let mut next = vec![u32::MAX; nt];
        let mut edges = Vec::new();
        let mut targets: Vec<(u32, usize)> = Vec::new();
        let mut kept: Vec<usize> = Vec::new();
        for i in (0..pods.len()).rev() {
            // The next pod of each dominating type, soonest first. An edge to the next pod of
            // type b is implied when a sooner kept target has a type a that b dominates: from
            // there the edge to the next b (none comes between) is that pod's own.
            targets.clear();
            targets.extend(
                above[ty[i]]
                    .iter()
                    .filter(|&&t| next[t] != u32::MAX)
                    .map(|&t| (next[t], t)),
            );
            targets.sort_unstable();
            kept.clear();
            for &(q, b) in &targets {
                if !kept.iter().any(|&a| dom[a * nt + b]) {
                    kept.push(b);
                    edges.push((i as u32, q));
                }
            }
            next[ty[i]] = i as u32;
        }
        ClosureGraph { n: pods.len(), edges }
    }

    /// The least total weight of a closed set of pods (a minimum cut) among those holding
    /// every pod of `holds` and no pod outside `within` (both closed, `holds` within
    /// `within`), and the least such set.
    fn least_closure(&self, weight: impl Fn(usize) -> i64, within: &[bool], holds: &[bool]) -> (i64, Vec<bool>) {
        let mut index = vec![u32::MAX; self.n];
        let mut free = Vec::new();
        let mut value = 0;
        for p in 0..self.n {
            if holds[p] {
                value += weight(p);
            } else if within[p] {
                index[p] = free.len() as u32;
                free.push(p);
            }
        }
        let (s, t) = (free.len(), free.len() + 1);
        let mut f = MaxFlow::new(free.len() + 2);
        for (k, &p) in free.iter().enumerate() {
            let w = weight(p);
            if w < 0 {
                value += w;
                f.add(s, k, -w);
            } else if w > 0 {
                f.add(k, t, w);
            }
        }
        for &(a, b) in &self.edges {
            let (a, b) = (index[a as usize], index[b as usize]);
            if a != u32::MAX && b != u32::MAX {
                f.add(a as usize, b as usize, INFINITE);
            }
        }
        value += f.run(s, t);
        let mut set = holds.to_vec();
        for (k, &p) in free.iter().enumerate() {
            set[p] = f.level[k] >= 0;
        }
        (value, set)
    }
}

const INFINITE: i64 = 1 << 60;

/// Dinic's maximum flow, iterative (paths may be thousands of pods long).
struct MaxFlow {
    adj: Vec<Vec<usize>>,
    to: Vec<usize>,
    cap: Vec<i64>,
    /// After [`MaxFlow::run`]: non-negative exactly for the nodes the source still reaches
    /// (the source side of the least minimum cut).
    level: Vec<i32>,
}

impl MaxFlow {
    fn new(n: usize) -> Self {
        MaxFlow {
            adj: vec![Vec::new(); n],
            to: Vec::new(),
            cap: Vec::new(),
            level: Vec::new(),
        }
    }

    fn add(&mut self, a: usize, b: usize, c: i64) {
        self.adj[a].push(self.to.len());
        self.to.push(b);
        self.cap.push(c);
        self.adj[b].push(self.to.len());
        self.to.push(a);
        self.cap.push(0);
    }

    fn run(&mut self, s: usize, t: usize) -> i64 {
        let n = self.adj.len();
        let mut total = 0;
        loop {
            let mut level = vec![-1i32; n];
            level[s] = 0;
            let mut queue = std::collections::VecDeque::from([s]);
            while let Some(v) = queue.pop_front() {
                for &e in &self.adj[v] {
                    if self.cap[e] > 0 && level[self.to[e]] < 0 {
                        level[self.to[e]] = level[v] + 1;
                        queue.push_back(self.to[e]);
                    }
                }
            }
            if level[t] < 0 {
                self.level = level;
                return total;
            }
            let mut it = vec![0usize; n];
            let mut path: Vec<usize> = Vec::new();
            let mut v = s;
            loop {
                if v == t {
                    let f = path.iter().map(|&e| self.cap[e]).min().unwrap_or(0);
                    for &e in &path {
                        self.cap[e] -= f;
                        self.cap[e ^ 1] += f;
                    }
                    total += f;
                    let k = path.iter().position(|&e| self.cap[e] == 0).unwrap_or(0);
                    path.truncate(k);
                    v = path.last().map_or(s, |&e| self.to[e]);
                    continue;
                }
                let mut advanced = false;
                while it[v] < self.adj[v].len() {
                    let e = self.adj[v][it[v]];
                    let w = self.to[e];
                    if self.cap[e] > 0 && level[w] == level[v] + 1 {
                        path.push(e);
                        v = w;
                        advanced = true;
                        break;
                    }
                    it[v] += 1;
                }
                if !advanced {
                    if v == s {
                        break;
                    }
                    level[v] = -1;
                    let e = path.pop().expect("not at the source");
                    v = self.to[e ^ 1];
                    it[v] += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The most that any set of shares fitting one GPU costs, over every integer share size:
    /// a knapsack over the milli used.
    fn most_costly_gpu() -> u64 {
        let mut best = [0u64; GPU as usize + 1];
        for used in 1..=GPU as usize {
            for m in 1..used.min(GPU as usize - 1) + 1 {
                best[used] = best[used].max(best[used - m] + price_twelfths(m as u16));
            }
        }
        best[GPU as usize]
    }

    use crate::policy::Demand;

    fn pod(cpu: u64, mem: u64, gpus: u8, milli: u16) -> Demand {
        Demand {
            cpu_milli: cpu,
            memory_mib: mem,
            gpus,
            milli,
            gpu_mem_mib: 0,
            tenant: None,
            models: 0,
        }
    }

    #[test]
    fn domination_needs_as_much_of_everything_on_fewer_models() {
        let share = pod(1000, 1000, 1, 500);
        assert!(dominates(&pod(1000, 1000, 1, 600), &share));
        assert!(
            dominates(&pod(2000, 1000, 2, 1000), &share),
            "a whole GPU holds any share"
        );
        assert!(!dominates(&pod(1000, 1000, 1, 400), &share));
        assert!(!dominates(&pod(500, 1000, 1, 600), &share), "less CPU");
        assert!(!dominates(&pod(1000, 500, 1, 600), &share), "less memory");
        assert!(dominates(&pod(1000, 1000, 0, 0), &pod(1000, 1000, 0, 0)));
        assert!(!dominates(&pod(1000, 1000, 0, 0), &share), "no GPU");
        assert!(
            !dominates(&share, &pod(1000, 1000, 1, 1000)),
            "a share needs no free GPU"
        );
        let t4 = Demand { models: 0b10, ..share };
        assert!(dominates(&t4, &share) && !dominates(&share, &t4));
        assert!(dominates(&pod(1000, 1000, 4, 1000), &pod(1000, 1000, 2, 1000)));
    }

    /// Two 810-milli shares then a whole GPU needing more host, on 2 GPUs (2,000 milli):
    /// arrived 2,620, so at least 620 of it fails.
    #[test]
    fn floors_by_hand() {
        let arrived = [
            pod(1000, 1000, 1, 810),
            pod(1000, 1000, 1, 810),
            pod(2000, 2000, 1, 1000),
        ];
        let f = floors(&arrived, 2000, true, &SharePrices::default_file());
        // Any scheduler: failing one 810 leaves 2,620 - 810 = 1,810 placed, so 190 unallocated,
        // and the other 810's GPU wastes 190: max(190, 190) = 190, the least over the 8 sets.
        assert!((f.any_milli - 190.0).abs() < 0.1, "{f:?}");
        // Never refusing a pod that fits: once an 810 fails, the later 810 and the whole GPU
        // (more CPU and memory, and a free GPU holds an 810) fail too. The closed sets: none
        // (waste 380), the whole GPU (380 failed, waste 380), the last two (1,190), all
        // (2,000): exactly 380 at least. The Lagrangian relaxation proves
        // max over λ of min(2,000 λ, 380 - 1,000 λ) = 380 × 2 / 3.
        assert!((f.non_refusing_milli - 380.0 * 2.0 / 3.0).abs() < 0.1, "{f:?}");
        // Without the rule the non-refusing floor is the any-scheduler one.
        assert_eq!(
            floors(&arrived, 2000, false, &SharePrices::default_file()).non_refusing_milli,
            f.any_milli
        );
        // Nothing arrived: all of it is unallocated.
        let none = floors(&[], 2000, true, &SharePrices::default_file());
        assert_eq!((none.any_milli, none.non_refusing_milli), (2000.0, 2000.0));
    }

    /// Against the exact minimum over every failure set of small random arrival orders, at the
    /// fixed table and (every other order) at the prices solved from the order's own shares.
    #[test]
    fn floors_never_exceed_the_exact_minimum() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for round in 0..300 {
            let n = rng.random_range(1..=9);
            let arrived: Vec<Demand> = (0..n)
                .map(|_| {
                    let (gpus, milli) = match rng.random_range(0..4) {
                        0 => (0, 0),
                        1 => (rng.random_range(1..=2), 1000),
                        _ => (1, [150, 230, 470, 550, 810][rng.random_range(0..5)]),
                    };
                    let mut d = pod(
                        rng.random_range(1..=3) * 1000,
                        rng.random_range(1..=3) * 1000,
                        gpus,
                        milli,
                    );
                    d.models = [0, 0b1, 0b11][rng.random_range(0..3)];
                    d
                })
                .collect();
            let cap = rng.random_range(1..=4) * 1000;
            let prices = if round % 2 == 0 {
                SharePrices::default_file()
            } else {
                let mix: Vec<(u16, f64)> = arrived
                    .iter()
                    .filter(|p| p.is_fraction())
                    .map(|p| (p.milli, 1.0))
                    .collect();
                SharePrices::solve(&mix)
            };
            let f = floors(&arrived, cap, true, &prices);
            let arrived_milli: i64 = arrived.iter().map(|p| p.total_milli() as i64).sum();
            let (mut any, mut closed) = (f64::MAX, f64::MAX);
            for set in 0u32..1 << n {
                let failed = |i: usize| set >> i & 1 == 1;
                let f_milli: i64 = (0..n)
                    .filter(|&i| failed(i))
                    .map(|i| arrived[i].total_milli() as i64)
                    .sum();
                let mut placed = ShareBound::new(prices.clone());
                for (i, p) in arrived.iter().enumerate() {
                    if !failed(i) && p.is_fraction() {
                        placed.add(p.milli);
                    }
                }
                let v = ((cap as i64 - arrived_milli + f_milli) as f64).max(placed.free_milli() as f64);
                any = any.min(v);
                let is_closed =
                    (0..n).all(|i| !failed(i) || (i + 1..n).all(|j| failed(j) || !dominates(&arrived[j], &arrived[i])));
                if is_closed {
                    closed = closed.min(v);
                }
            }
            assert!(f.any_milli <= any + 1e-6, "{arrived:?} {cap}: {f:?} > {any}");
            assert!(
                f.non_refusing_milli <= closed + 1e-6,
                "{arrived:?} {cap}: {f:?} > {closed}"
            );
            assert!(f.any_milli <= f.non_refusing_milli + 1e-6, "{f:?}");
        }
    }

    /// One 500, three 300s and one 200. By hand: the patterns {300, 300, 300} and {500, 300,
    /// 200} force `3 y300 ≤ 1` and `y500 + y300 + y200 ≤ 1`, {500, 500} `y500 ≤ 1/2` and {300,
    /// 300, 200, 200} `y300 + y200 ≤ 1/2`; the objective `y500 + 3 y300 + y200` is at most
    /// `1/2 + 3 y300 + (1/2 − y300) ≤ 5/3`, reached only at (1/2, 1/3, 1/6), which every other
    /// pattern allows ({500, 200, 200}: 5/6, {200 × 5}: 5/6). The primal: {500, 300, 200} once
    /// and {300, 300, 300} two-thirds of a time, 5/3 GPUs.
    #[test]
    fn derived_prices_are_the_lp_dual_by_hand() {
        let p = SharePrices::solve(&[(500, 1.0), (300, 3.0), (200, 1.0)]);
        let u = PRICE_UNITS;
        assert_eq!(p.steps(), &[(200, u / 6), (300, u / 3), (500, u / 2)]);
        assert_eq!(p.most_costly_gpu(), u, "dual-feasible and tight");
        // Between the sizes a share costs what the largest priced size below it does.
        assert_eq!(
            (p.units(199), p.units(250), p.units(499), p.units(999)),
            (0, u / 6, u / 3, u / 2)
        );
        assert_eq!(p.units(1000), 0, "a whole GPU is not a share");
        // Weights need not be counts; sizes repeat; whole GPUs and zero are ignored.
        let q = SharePrices::solve(&[(500, 0.1), (300, 0.2), (1000, 5.0), (300, 0.1), (0, 1.0), (200, 0.1)]);
        assert_eq!(q, p);
        assert_eq!(SharePrices::solve(&[]), SharePrices::default());
    }

    /// The share mix of the openb default pod list (size, count): its LP dual is the fixed
    /// table [`price_twelfths`].
    #[test]
    fn the_default_files_mix_gives_the_fixed_table() {
        let mix = [
            (50, 7.0),
            (110, 24.0),
            (140, 1.0),
            (160, 74.0),
            (220, 62.0),
            (230, 140.0),
            (270, 4.0),
            (290, 1.0),
            (320, 328.0),
            (330, 7.0),
            (350, 6.0),
            (370, 47.0),
            (440, 2.0),
            (460, 128.0),
            (470, 750.0),
            (480, 19.0),
            (550, 72.0),
            (590, 75.0),
            (650, 253.0),
            (810, 1078.0),
        ];
        let p = SharePrices::solve(&mix);
        assert_eq!(p, SharePrices::default_file());
        for m in 1..1000 {
            assert_eq!(p.units(m), price_twelfths(m) * (PRICE_UNITS / 12), "{m}");
        }
    }

    /// On random mixes the derived prices are dual-feasible, and worth at least any other
    /// dual-feasible table on the mix (the fixed one here), as an optimal dual must be.
    #[test]
    fn derived_prices_are_feasible_and_at_least_as_good_as_the_fixed_table() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        let fixed = SharePrices::default_file();
        for _ in 0..40 {
            let n = rng.random_range(1..=12);
            let mix: Vec<(u16, f64)> = (0..n)
                .map(|_| (rng.random_range(1..1000u16), rng.random_range(1..=100) as f64))
                .collect();
            let p = SharePrices::solve(&mix);
            assert!(p.most_costly_gpu() <= PRICE_UNITS, "{mix:?}: {p:?}");
            let value = |t: &SharePrices| mix.iter().map(|&(m, w)| t.units(m) as f64 * w).sum::<f64>();
            // Rounding to units may cost a unit per size.
            let slack: f64 = mix.iter().map(|m| m.1).sum();
            assert!(value(&p) + slack >= value(&fixed), "{mix:?}: {p:?}");
            assert!(p.steps().windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1));
        }
        // Beyond LP_SIZES sizes the rarest are left out of the LP and priced by the extension:
        // still feasible.
        for n in [LP_SIZES + 1, 200, 999] {
            let mix: Vec<(u16, f64)> = (0..n)
                .map(|_| (rng.random_range(1..1000u16), rng.random_range(1..=100) as f64))
                .collect();
            let p = SharePrices::solve(&mix);
            assert!(p.most_costly_gpu() <= PRICE_UNITS, "{n} sizes: {p:?}");
            assert!(!p.steps().is_empty());
        }
    }

    #[test]
    fn no_set_of_shares_that_fits_a_gpu_costs_more_than_one_gpu() {
        assert_eq!(most_costly_gpu(), 12);
    }

    #[test]
    fn the_price_is_tight_on_exact_openb_pairings() {
        for set in [
            &[470u16, 470][..],
            &[650, 320],
            &[550, 230, 220],
            &[810],
            &[320, 320, 320],
        ] {
            assert!(set.iter().map(|&m| m as u64).sum::<u64>() <= GPU);
            assert_eq!(set.iter().map(|&m| price_twelfths(m)).sum::<u64>(), 12, "{set:?}");
        }
    }

    #[test]
    fn the_bound_counts_what_any_placement_strands() {
        let mut b = ShareBound::default();
        assert_eq!((b.gpus(), b.free_milli()), (0, 0));
        // Four 470s cost two GPUs: 2,000 - 1,880 = 120 milli free at least.
        for _ in 0..4 {
            b.add(470);
        }
        assert_eq!((b.gpus(), b.free_milli()), (2, 120));
        // An 810 strands 190 that a 160 can use: 120 + 190 - 160.
        b.add(810);
        b.add(160);
        assert_eq!((b.gpus(), b.free_milli()), (3, 150));
        // A fifth 470 needs a GPU of its own (2.5 GPUs rounded up).
        b.add(470);
        assert_eq!((b.gpus(), b.free_milli()), (4, 680));
        // Small shares cost nothing but still need room: eleven 100s need two GPUs.
        let mut small = ShareBound::default();
        for _ in 0..11 {
            small.add(100);
        }
        assert_eq!((small.gpus(), small.free_milli()), (2, 900));
        // Whole GPUs are not shares.
        b.add(1000);
        b.add(0);
        assert_eq!((b.gpus(), b.free_milli()), (4, 680));
    }
}
