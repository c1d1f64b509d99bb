//! Tessera's own shared-pool policy.
//!
//! Like FGD (see [`crate::policy::Fgd`]), Tessera places each demand where a measure of
//! expected waste grows least, where the waste is judged against the workload model (the
//! demand classes the pool sees, with their popularity and host needs). It measures more
//! kinds of waste than FGD, and that is where it gains:
//!
//! 1. **FGD's fragmentation.** For each demand class, the free GPU a task of that class could
//!    not use on the node (all of it when the class cannot run there at all), weighted by how
//!    popular the class is.
//! 2. **CPU-stranded GPUs, per class.** FGD only asks whether *one* task of a class still fits
//!    a node's free CPU. But a node with 16 cores and two free GPUs can host only one task that
//!    needs 11 cores per GPU: the other GPU is stranded for good. For each class we learn its
//!    CPU need per milli-GPU from the model and count the free GPU the class could use by shape
//!    but not by the node's free CPU. So CPU-only and CPU-heavy tasks go where CPU is plentiful
//!    (T4 nodes with 52 cores per GPU) and GPU-heavy, CPU-light tasks go to CPU-poor nodes.
//! 3. **CPU-stranded GPUs, for the whole pool mix.** The same idea with one ratio, the pool's
//!    average CPU per milli-GPU (also learned from the model): free GPU beyond what the node's
//!    free CPU can feed at that ratio. It catches stranding that no single class explains.
//! 4. **Reserve for constrained classes.** Classes restricted to some GPU models (`gpu_spec`)
//!    have nowhere else to go, while unconstrained tasks can run anywhere. A free GPU of a model
//!    that constrained classes need is therefore worth keeping: each one counts as negative
//!    waste in proportion to the weight of the constrained classes that may use it. Flexible
//!    tasks thus fill the models nobody else needs (G2 in openb) and leave T4, P100, V100 and
//!    G3 to the tasks that can only run there. FGD has it backwards: its "cannot run here"
//!    term rewards consuming the models that fewest classes can use, which pushes flexible
//!    tasks onto the scarce models and makes the constrained tasks fail later.
//! 5. **Pairing of shares.** Each GPU's free milli has an expected final waste `V(r)`: the
//!    milli still free once tasks of the model's classes have filled it until nothing fits.
//!    `V` is computed once per model epoch by a recurrence over r = 0..=1000 (one table for the
//!    models no constrained class names, one per model a constrained class names, each with
//!    the classes allowed there). The next task into a gap is partly a random one (in
//!    proportion to the weights of the classes that fit) and mostly the one that completes it
//!    best, since the policy steers every task to the gap that suits it ([`RANDOM_FILL`]); and
//!    a gap that only rare shares fit is not sure to be filled at all, since many such gaps
//!    compete for the few tasks that fit them ([`FILLER_SCARCITY`]; on openb, some 1,000
//!    190-milli remainders of 810-milli shares against the 1.5 % of tasks of 50-160 milli).
//!    The term is the change of `Σ V(free)` over the node's GPUs, so a share is drawn to the
//!    GPU whose remainder the workload is likely to fill exactly rather than one that leaves a
//!    size nothing common fits: on openb a 230-milli share goes to a 550's 450-milli gap
//!    (which a 220 then completes) rather than to a 650's 350-milli one (120 left, which only
//!    the rare ≤ 110-milli shares fit), and that 350 is kept for a 320. At weight 8 it gains
//!    0.26 point over the random-fill term at weight 1 on the default file and up to 1.2 on
//!    the share-heavy ones (see the crate's `openb_sweep` example). With random fills only
//!    and no scarcity, weights above 1 did worse; a sum-of-squares balance of the pool's gap
//!    sizes (the online bin-packing rule) was tried and dropped.
//!
//!    A gap is only filled by a task that can run on its node: of the fractional tasks that
//!    fit a gap by size and model, only the share whose CPU and memory needs fit the node's
//!    free CPU and memory can come ([`TesseraPolicy::gap_host_fit`]), and the gap counts as
//!    `fit × V(r) + (1 − fit) × r`. On openb most of what stayed unallocated beyond the
//!    bound's prices was such gaps: 230s and 470s on the one-GPU V100M16 nodes (8 cores)
//!    whose memory they left too short for any other share, so a 770 or 530 gap stayed free
//!    for good. Counting them gains 0.06 point on the default file (3.79 → 3.73 % at 100 %).
//!    The host fit judges only where a *share* goes: a CPU-only or whole-GPU demand that takes
//!    CPU beside a gap is judged by terms 1-3, which count stranded GPU at weight 1 or less.
//!    Judged by the host fit at the pairing weight too (as first done), such demands went to
//!    nodes with free GPUs instead, whose CPU they then stranded: on cpu250 (a quarter of the
//!    pods CPU-only) seed 42 ended with 169 free GPUs no task could use and 230 whole-GPU pods
//!    failed, against 128 and 193 now (cpu250 6.43 → 6.07 %, gpuspec20 4.51 → 4.33 %,
//!    gpuspec33 10.95 → 10.84 % over seeds 42-51; the default file 3.726 → 3.730 % at 100 %,
//!    3.637 → 3.648 % at 130 %).
//!    A free GPU is left out (whole-GPU tasks fill it; terms 2 and 3 see its CPU), and so is
//!    term 6: in the one form tried there (the node-wide share of fractional tasks that fit,
//!    together with the same in term 5) it did worse, 3.84 % against 3.76 % on seeds 42-45.
//! 6. **Priced fill.** The share packing LP of the workload (the fewest GPUs, fractional
//!    patterns allowed, that hold the model's mix of share sizes) has an optimal dual: a price
//!    per share size, in twelfths of a GPU on openb, such that no set of shares that fits one
//!    GPU costs more than 12 ([`crate::bound::SharePrices::solve`], re-solved from the model's
//!    fractional classes at each model epoch; on the openb default pod list it is the fixed
//!    table [`crate::bound::price_twelfths`] of the replay's bound). A packing reaches the
//!    LP's bound exactly when every GPU holding shares ends up holding 12 twelfths' worth (LP
//!    complementary slackness). So a gap of `r` free milli is
//!    worth `M(r)`, the most twelfths that shares of the workload's common sizes can still put
//!    into it (an unbounded knapsack over r = 0..=1000, per model table like term 5), and a
//!    share of price `p` placed into gap `r` loses `M(r) − p − M(r − s)` twelfths for good.
//!    The term is the change of `−Σ M(free)` over the node's GPUs (in milli, 1000 / 12 a
//!    twelfth), which among the choices for one share differs exactly by that loss. On openb a
//!    220 goes to a 450 gap (230 left, which a 230 fills: 4 = 1 + 3) rather than a 300 gap
//!    (80 left: the 3 twelfths a 230 would have made are lost). It counts what term 5 does
//!    not: a gap that a rare-but-fitting combination fills exactly is fine by term 5 and a
//!    loss here when the combination is worth less than the gap. At weight 16 it cuts the
//!    unallocated GPU by 0.06-0.07 point on the openb default file (`openb_sweep`, see
//!    `docs/openb-replay.md`); weights 12-64 gave the same figures on the development seeds.
//!
//! Every weight in the measure is either learned from the workload model (class weights, CPU
//! per milli-GPU per class and for the pool) or a named constant below; the score is a pure
//! function of the node, the demand, the choice and the model's epoch.

use crate::policy::{Choice, Demand, Hypo, NodeView, Score, SharedPolicy, WorkloadModel};

/// Weight of per-class CPU stranding (term 2) against FGD's fragmentation. Stranding is a
/// softer loss than fragmentation (CPU-only tasks may never come to use the CPU either way),
/// so it counts for less; 0.3 was best over the openb workloads, and 0.2-0.5 all beat FGD.
const CLASS_STRAND_WEIGHT: f64 = 0.3;

/// Weight of pool-mix CPU stranding (term 3).
const POOL_STRAND_WEIGHT: f64 = 1.0;

/// How much more a free GPU is worth to a constrained class than to FGD's fragmentation
/// measure (term 4). Large, so that a flexible task avoids the models constrained classes need
/// unless fragmentation there is far worse; not infinite, so that fragmentation and stranding
/// still break near-ties between models (pure lexicographic order did worse on gpuspec10).
const RESERVE_WEIGHT: f64 = 100.0;

/// Weight of the pairing term (term 5) against FGD's fragmentation. With the filler scarcity
/// and best fills below, 8 was best over the openb files with published figures: 10-20 gain
/// up to 0.02 point on the default file but lose 0.4 point and more on gpushare100 (shares
/// there start GPUs of their own, waiting for completions that come only after arrived
/// 100 %), 6 and less lose on the default file. With random fills only, 4-8 was best; with
/// neither, 1 was best and 4 already lost on the default file.
const PAIRING_WEIGHT: f64 = 8.0;

/// Term 5: the share of fills that a random task makes (the rest are made by the class that
/// completes the gap best). The policy steers each task to the gap it completes best, so a gap
/// tends to get the task that suits it, not any task that fits; but not always (the suiting
/// class may be rare or late). On the openb default file at weight 8: 0 and 0.1 gave 3.84 %,
/// 0.25 3.86 %, 0.5 3.92 %, 1 (random fills only) 3.97 %; but 0 collapsed at weight 10 and
/// more (8.9 % at 16: each 470-milli share took a GPU of its own, waiting for an exact
/// completion of its 530 out of rare sizes, instead of pairing with another 470) and 0.1 at
/// 16 (4.29 %), while 0.25 held to 20 (3.83-3.86 %): 0.25 for the margin.
const RANDOM_FILL: f64 = 0.25;

/// Term 5's filler scarcity: a gap that only a small share of the fractional tasks fit gets
/// filled less surely than the random-fill recurrence assumes, because many gaps compete for
/// those few tasks (on openb, some 1,000 190-milli remainders of 810-milli shares against the
/// 1.5 % of tasks of 50-160 milli). The chance that a gap is filled at all is the weight of the
/// classes that fit it over this fraction of the weight of all fractional classes, at most 1.
/// 0.1 was best of 0.03-0.14 on the default file with random fills only (seeds 42-51 and
/// 1-10 alike), and of 0.05-0.2 with the best fills of [`RANDOM_FILL`] (0.075 as good). On
/// openb it makes gaps of 230 milli and more sure to be filled, 160-220 milli gaps filled a
/// third to half of the time.
const FILLER_SCARCITY: f64 = 0.1;

/// Weight of the priced-fill term (term 6) against FGD's fragmentation. On the openb default
/// file, seeds 42-45 (development seeds; 1000-1009 kept for validation): 1 did nothing, 3 gained
/// 0.01 point, 8 0.06, 12 to 64 all 0.07 at 100 % arrived; 16 is inside that plateau.
const PRICE_WEIGHT: f64 = 16.0;

/// Term 6 counts only share sizes that make at least this part of the fractional classes'
/// weight (rarer sizes are not sure to come and fill a gap).
const MIN_PRICED_SHARE: f64 = 0.01;

/// Tessera's fragmentation-aware policy for shared pools.
#[derive(Clone, Debug)]
pub struct TesseraPolicy {
    pub model: WorkloadModel,
    /// Per class of `model.classes`: mean CPU milli its tasks need per milli-GPU.
    cpu_per_milli: Vec<f64>,
    /// The pool mix's CPU milli per milli-GPU (GPU-weighted mean over all classes).
    pool_cpu_per_milli: f64,
    /// Term 5: expected final waste of a GPU by its free milli (index 0..=1000), for models no
    /// constrained class names (only unconstrained classes fill them) ...
    fill_any: Vec<f64>,
    /// ... and for each model some constrained class names.
    fill_model: Vec<(u16, Vec<f64>)>,
    pairing_weight: f64,
    /// Term 6: the most that shares of the model's classes can still fill into a gap of r free
    /// milli at `prices`, in [`crate::bound::PRICE_UNITS`] of a GPU, by r (index 0..=1000), for
    /// models no constrained class names ...
    price_any: Vec<u32>,
    /// ... and for each model some constrained class names.
    price_model: Vec<(u16, Vec<u32>)>,
    price_weight: f64,
    /// Term 6's prices per share size: the optimal dual of the share packing LP of the model's
    /// fractional classes (or the fixed table of the openb default file, for experiments).
    prices: crate::bound::SharePrices,
    /// Whether term 6 uses [`crate::bound::SharePrices::default_file`] instead of solving.
    fixed_prices: bool,
    /// Term 5 on a node: the fractional classes' tasks as `(cpu_milli, memory_mib, milli,
    /// models mask, weight)`, by CPU, to tell which can still run beside a gap.
    share_tasks: Vec<(u64, u64, u16, u64, f64)>,
    /// Whether term 5 counts a gap whose node cannot host the tasks that fit it as wasted.
    fill_host_aware: bool,
    /// Model epoch the learned statistics above were computed for.
    learned_epoch: u64,
}

impl TesseraPolicy {
    pub fn new(model: WorkloadModel) -> Self {
        let mut p = TesseraPolicy {
            model,
            cpu_per_milli: Vec::new(),
            pool_cpu_per_milli: 0.0,
            fill_any: Vec::new(),
            fill_model: Vec::new(),
            pairing_weight: PAIRING_WEIGHT,
            price_any: Vec::new(),
            price_model: Vec::new(),
            price_weight: PRICE_WEIGHT,
            prices: crate::bound::SharePrices::default(),
            fixed_prices: false,
            share_tasks: Vec::new(),
            fill_host_aware: true,
            learned_epoch: u64::MAX,
        };
        p.learn();
        p
    }

    /// Recomputes the CPU ratios when the model's frozen view changes.
    fn learn(&mut self) {
        if self.learned_epoch == self.model.epoch() {
            return;
        }
        self.learned_epoch = self.model.epoch();
        let (mut pool_cpu, mut pool_gpu) = (0.0, 0.0);
        self.cpu_per_milli = self
            .model
            .classes
            .iter()
            .map(|c| {
                let milli = c.gpus as f64 * c.milli as f64;
                let w: f64 = c.hosts.iter().map(|h| h.2).sum();
                let cpu: f64 = c.hosts.iter().map(|h| h.0 as f64 * h.2).sum();
                pool_cpu += cpu;
                pool_gpu += milli * w;
                if w > 0.0 { cpu / w / milli } else { 0.0 }
            })
            .collect();
        self.pool_cpu_per_milli = if pool_gpu > 0.0 { pool_cpu / pool_gpu } else { 0.0 };
        let classes = &self.model.classes;
        self.fill_any = fill_values(classes.iter().filter(|c| c.models == 0));
        let mut models: Vec<u16> = (0..64u16)
            .filter(|&b| classes.iter().any(|c| c.models >> b & 1 == 1))
            .collect();
        models.dedup();
        self.fill_model = models
            .iter()
            .map(|&m| {
                let id = tessera_model::ModelId(m);
                (m, fill_values(classes.iter().filter(|c| c.allows(id))))
            })
            .collect();
        self.prices = if self.fixed_prices {
            crate::bound::SharePrices::default_file()
        } else {
            let mix: Vec<(u16, f64)> = classes
                .iter()
                .filter(|c| c.gpus == 1 && c.milli < 1000)
                .map(|c| (c.milli, c.weight))
                .collect();
            crate::bound::SharePrices::solve(&mix)
        };
        let prices = &self.prices;
        self.price_any = price_values(classes.iter().filter(|c| c.models == 0), prices);
        let mut tasks: Vec<(u64, u64, u16, u64, f64)> = classes
            .iter()
            .filter(|c| c.gpus == 1 && c.milli < 1000)
            .flat_map(|c| c.hosts.iter().map(|h| (h.0, h.1, c.milli, c.models, h.2)))
            .collect();
        tasks.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
        self.share_tasks = tasks;
        self.price_model = models
            .into_iter()
            .map(|m| {
                let id = tessera_model::ModelId(m);
                (m, price_values(classes.iter().filter(|c| c.allows(id)), prices))
            })
            .collect();
    }

    /// Term 6 with the fixed price table of the openb default file
    /// ([`crate::bound::SharePrices::default_file`]) instead of the prices solved from the
    /// model's share mix; for experiments.
    pub fn set_fixed_prices(&mut self, on: bool) {
        self.fixed_prices = on;
        self.learned_epoch = u64::MAX;
        self.learn();
    }

    /// Term 6's prices per share size.
    pub fn prices(&self) -> &crate::bound::SharePrices {
        &self.prices
    }

    /// Whether term 5 looks at the node's free CPU and memory (on by default); for
    /// experiments.
    pub fn set_fill_host_aware(&mut self, on: bool) {
        self.fill_host_aware = on;
    }

    /// Term 5's host fit of a gap of `free` milli (0 < free < 1000) on node `h`: of the
    /// fractional tasks that fit the gap by size and model, the weight whose CPU and memory
    /// needs also fit the node's free CPU and memory (1 if no task fits the gap by size).
    pub(crate) fn gap_host_fit(&self, h: &Hypo, free: u16) -> f64 {
        let (mut all, mut ok) = (0.0, 0.0);
        for &(cpu, mem, milli, models, w) in &self.share_tasks {
            if milli <= free && (models == 0 || (h.model.0 < 64 && models >> h.model.0 & 1 == 1)) {
                all += w;
                if cpu <= h.cpu_free && mem <= h.mem_free {
                    ok += w;
                }
            }
        }
        if all > 0.0 { ok / all } else { 1.0 }
    }

    /// Sets the weight of the priced-fill term (term 6; 0 turns it off); for experiments.
    pub fn set_price_weight(&mut self, w: f64) {
        self.price_weight = w;
    }

    /// Term 6: minus the price (a GPU's worth = 1,000) that the node's gaps can still take at
    /// the solved prices, in milli (`1000 / 12` a twelfth). Placing a share of price `p` into a gap `r`
    /// raises it by `p` plus the price the gap can no longer take (`M(r) − p − M(r − s)`),
    /// so among the choices for one share it ranks by that loss.
    pub(crate) fn price_potential(&self, h: &Hypo) -> f64 {
        let table = self
            .price_model
            .iter()
            .find(|(m, _)| *m == h.model.0)
            .map_or(&self.price_any, |(_, t)| t);
        if table.is_empty() {
            return 0.0;
        }
        let units: u64 = h.gpus().iter().map(|&f| table[f.min(1000) as usize] as u64).sum();
        -(units as f64) * 1000.0 / crate::bound::PRICE_UNITS as f64
    }

    /// Sets the weight of the pairing term (term 5; 0 turns it off); for experiments.
    pub fn set_pairing_weight(&mut self, w: f64) {
        self.pairing_weight = w;
    }

    /// Term 5: the expected final waste of the node's GPUs, by their free milli, with the
    /// gaps' host fit ([`Self::gap_host_fit`]) when `host` (and the host fit is on).
    pub(crate) fn fill_waste(&self, h: &Hypo, host: bool) -> f64 {
        let table = self
            .fill_model
            .iter()
            .find(|(m, _)| *m == h.model.0)
            .map_or(&self.fill_any, |(_, t)| t);
        if table.is_empty() {
            return 0.0;
        }
        h.gpus()
            .iter()
            .map(|&f| {
                let v = table[f.min(1000) as usize];
                if f >= 1000 || f == 0 || !host || !self.fill_host_aware {
                    return v;
                }
                // A gap whose node cannot host the tasks that fit it stays as it is.
                let fit = self.gap_host_fit(h, f);
                fit * v + (1.0 - fit) * f as f64
            })
            .sum()
    }

    /// Expected waste of a node: terms 1, 2 and 4 of the module doc.
    fn waste(&self, h: &Hypo) -> f64 {
        let gpus = h.gpus();
        let total: u64 = gpus.iter().map(|&f| f as u64).sum();
        if total == 0 {
            return 0.0;
        }
        let full = gpus.iter().filter(|&&f| f == 1000).count() as u8;
        let t = total as f64;
        let mut waste = 0.0;
        for (c, &ratio) in self.model.classes.iter().zip(&self.cpu_per_milli) {
            if !c.allows(h.model) {
                // The class may not run on this model: all free GPU is out of its reach.
                waste += c.weight * t;
                continue;
            }
            if c.models != 0 {
                // A constrained class may use these GPUs: keep them for it.
                waste -= RESERVE_WEIGHT * c.weight * t;
            }
            let fit_w = c.host_fit_weight(h.cpu_free, h.mem_free);
            // (a task fits by GPU shape, free GPU it cannot use, GPU it can use in whole tasks)
            let (gpu_fits, unusable, usable) = if c.gpus == 1 && c.milli < 1000 {
                let unusable: u64 = gpus.iter().filter(|&&f| f < c.milli).map(|&f| f as u64).sum();
                let usable: u64 = gpus.iter().map(|&f| (f / c.milli) as u64 * c.milli as u64).sum();
                (usable > 0, unusable, usable)
            } else {
                let unusable: u64 = gpus.iter().filter(|&&f| f < 1000).map(|&f| f as u64).sum();
                let usable = (full / c.gpus) as u64 * c.gpus as u64 * 1000;
                (full >= c.gpus, unusable, usable)
            };
            let stranded = (usable as f64 - h.cpu_free as f64 / ratio).max(0.0);
            waste += (c.weight - fit_w) * t
                + fit_w
                    * if gpu_fits {
                        unusable as f64 + CLASS_STRAND_WEIGHT * stranded
                    } else {
                        t
                    };
        }
        waste
    }

    /// Term 3: free GPU beyond what the node's free CPU can feed at the pool's mix.
    fn pool_stranded(&self, h: &Hypo) -> f64 {
        let free: f64 = h.gpus().iter().map(|&f| f as f64).sum();
        if self.pool_cpu_per_milli <= 0.0 {
            return 0.0;
        }
        (free - h.cpu_free as f64 / self.pool_cpu_per_milli).max(0.0)
    }
}

/// The expected final waste `V(r)` of a GPU with `r` free milli (r = 0..=1000) when it is
/// filled until nothing fits: `V(r) = r` when no class fits, else
/// `(1 − q) r + q (RANDOM_FILL × Σ p_c V(r − m_c) + (1 − RANDOM_FILL) × min_c V(r − m_c))` over
/// the fitting classes `c` (`p_c` their weights among them; a whole-GPU class fits only a free
/// GPU and takes all of it): the next task is one drawn at random or the one that completes the
/// gap best. `q` is the chance that the gap is filled at all: `min(1, w / (FILLER_SCARCITY ×
/// s))` with `w` the weight of the fitting classes and `s` that of all fractional classes
/// (`q = 1` for a free GPU).
fn fill_values<'a>(classes: impl Iterator<Item = &'a crate::policy::DemandClass>) -> Vec<f64> {
    // (milli taken from the GPU, weight)
    let mut takes: Vec<(usize, f64)> = Vec::new();
    for c in classes {
        if c.gpus == 0 || c.weight <= 0.0 {
            continue;
        }
        let m = if c.gpus == 1 && c.milli < 1000 {
            c.milli.max(1) as usize
        } else {
            1000
        };
        match takes.iter_mut().find(|t| t.0 == m) {
            Some(t) => t.1 += c.weight,
            None => takes.push((m, c.weight)),
        }
    }
    if takes.is_empty() {
        return Vec::new();
    }
    takes.sort_by_key(|t| t.0);
    let shares: f64 = takes.iter().filter(|t| t.0 < 1000).map(|t| t.1).sum();
    let mut v = vec![0.0; 1001];
    for r in 1..=1000usize {
        // (weighted sum of the fitting classes' V(r − m), their weight, the least V(r − m))
        let (mut sum, mut w, mut best) = (0.0, 0.0, f64::MAX);
        for &(m, cw) in takes.iter().take_while(|t| t.0 <= r) {
            sum += cw * v[r - m];
            w += cw;
            best = best.min(v[r - m]);
        }
        if w == 0.0 {
            v[r] = r as f64;
            continue;
        }
        let next = RANDOM_FILL * sum / w + (1.0 - RANDOM_FILL) * best;
        // How likely the gap is filled at all: 1 for a free GPU (whole-GPU tasks abound) and
        // for gaps that common shares fit; less for gaps only rare shares fit.
        let filled = if r < 1000 && shares > 0.0 {
            (w / (FILLER_SCARCITY * shares)).min(1.0)
        } else {
            1.0
        };
        v[r] = (1.0 - filled) * r as f64 + filled * next;
    }
    v
}

/// Term 6's table: `M(r)`, the most that shares of the classes' sizes fit into `r` free milli
/// at `prices` (in [`crate::bound::PRICE_UNITS`] of a GPU; an unbounded knapsack,
/// r = 0..=1000; sizes of less than [`MIN_PRICED_SHARE`] of the fractional classes' weight
/// left out). A free GPU (`r = 1000`) counts as a whole GPU: whole-GPU tasks fill it exactly.
fn price_values<'a>(
    classes: impl Iterator<Item = &'a crate::policy::DemandClass>,
    prices: &crate::bound::SharePrices,
) -> Vec<u32> {
    let mut sizes: Vec<(u16, f64)> = Vec::new();
    for c in classes {
        if c.gpus == 1 && c.milli > 0 && c.milli < 1000 && c.weight > 0.0 {
            match sizes.iter_mut().find(|s| s.0 == c.milli) {
                Some(s) => s.1 += c.weight,
                None => sizes.push((c.milli, c.weight)),
            }
        }
    }
    let total: f64 = sizes.iter().map(|s| s.1).sum();
    sizes.retain(|s| s.1 >= MIN_PRICED_SHARE * total);
    if sizes.is_empty() {
        return Vec::new();
    }
    let mut m = vec![0u32; 1001];
    for r in 1..=1000usize {
        let mut best = m[r - 1];
        for &(s, _) in &sizes {
            if (s as usize) <= r {
                best = best.max(prices.units(s) as u32 + m[r - s as usize]);
            }
        }
        m[r] = best;
    }
    m[1000] = crate::bound::PRICE_UNITS as u32;
    m
}

impl SharedPolicy for TesseraPolicy {
    fn boxed_clone(&self) -> Box<dyn SharedPolicy> {
        Box::new(self.clone())
    }

    fn name(&self) -> &'static str {
        "tessera"
    }

    fn observe(&mut self, d: &Demand) {
        self.model.observe(d);
        self.learn();
    }

    fn epoch(&self) -> u64 {
        self.model.epoch()
    }

    fn score(&self, view: &NodeView, d: &Demand, choice: Choice) -> Score {
        let before = Hypo::of(view);
        let after = before.after(d, choice);
        let waste = self.waste(&after) - self.waste(&before);
        let strand = self.pool_stranded(&after) - self.pool_stranded(&before);
        let pairing = if self.pairing_weight != 0.0 {
            // The gaps' host fit judges where a share goes, not the CPU of other demands
            // (terms 1-3 judge that).
            let host = d.gpus == 1 && d.milli < 1000;
            self.fill_waste(&after, host) - self.fill_waste(&before, host)
        } else {
            0.0
        };
        let priced = if self.price_weight != 0.0 {
            self.price_potential(&after) - self.price_potential(&before)
        } else {
            0.0
        };
        (
            waste + POOL_STRAND_WEIGHT * strand + self.pairing_weight * pairing + self.price_weight * priced,
            0.0,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Fgd;
    use crate::state::ClusterState;
    use tessera_model::{Fleet, ModelId};

    fn demand(cpu_cores: u64, gpus: u8, milli: u16, models: u64) -> Demand {
        Demand {
            cpu_milli: cpu_cores * 1000,
            memory_mib: 1024,
            gpus,
            milli,
            gpu_mem_mib: 0,
            tenant: None,
            models,
        }
    }

    fn scores(fleet: &Fleet, state: &ClusterState, policy: &dyn SharedPolicy, d: &Demand, choice: Choice) -> Vec<f64> {
        (0..fleet.nodes.len())
            .map(|n| {
                let view = NodeView {
                    node: &fleet.nodes[n],
                    state: &state.nodes[n],
                };
                policy.score(&view, d, choice).0
            })
            .collect()
    }

    #[test]
    fn cpu_only_task_goes_where_it_strands_no_gpu() {
        // n0 is CPU-poor (8 cores per GPU), n1 CPU-rich; same model.
        let fleet = Fleet::from_openb_nodes(
            "sn,cpu_milli,memory_mib,gpu,model\nn0,16000,65536,2,P100\nn1,64000,65536,2,P100\n",
            "nodes.csv",
        )
        .unwrap();
        let state = ClusterState::empty(&fleet);
        // Every GPU task needs 8 cores per GPU.
        let prior = vec![demand(8, 1, 1000, 0); 10];
        let cpu_only = demand(8, 0, 0, 0);
        let fgd = Fgd::new(&prior);
        let tessera = TesseraPolicy::new(WorkloadModel::with_prior(&prior));
        // FGD sees no difference (one more GPU task still fits either node) ...
        let f = scores(&fleet, &state, &fgd, &cpu_only, Choice::Host);
        assert_eq!(f[0], f[1]);
        // ... but on n0 the 8 cores would leave one of its two GPUs without CPU for good.
        let t = scores(&fleet, &state, &tessera, &cpu_only, Choice::Host);
        assert!(t[1] < t[0], "{t:?}");
    }

    #[test]
    fn expected_fill_waste_follows_the_share_histogram() {
        // Shares of 300 and 500 milli, equally common (so every gap they fit is surely filled).
        let prior = [demand(1, 1, 300, 0), demand(1, 1, 500, 0)];
        let t = TesseraPolicy::new(WorkloadModel::with_prior(&prior));
        let v = |r: usize| t.fill_any[r];
        assert_eq!(v(0), 0.0);
        assert_eq!(v(200), 200.0, "nothing fits 200");
        assert_eq!(v(300), 0.0, "a 300 fills it exactly");
        assert_eq!(v(400), 100.0, "only a 300 fits: 100 left");
        // 500: at random a 500 fills it (0) or a 300 leaves 200 (200), half and half (100);
        // the best fill is the 500 (0): 0.25 × 100 + 0.75 × 0.
        assert_eq!(v(500), 25.0);
        // 700: random (V(400) + V(200)) / 2 = 150, best V(400) = 100.
        assert_eq!(v(700), 0.25 * 150.0 + 0.75 * 100.0);
        // 800: random (V(500) + V(300)) / 2 = 12.5, best V(300) = 0.
        assert_eq!(v(800), 0.25 * 12.5);
        // 1000: random (V(700) + V(500)) / 2, best V(500).
        assert_eq!(v(1000), 0.25 * (v(700) + 25.0) / 2.0 + 0.75 * 25.0);
    }

    #[test]
    fn gaps_only_rare_shares_fit_are_not_counted_as_filled() {
        // 24 shares of 600 milli and one of 100: the 100s are 4 % of the shares, so a gap only
        // they fit is filled with chance 0.04 / (FILLER_SCARCITY × 1) = 0.4.
        let mut prior = vec![demand(1, 1, 600, 0); 24];
        prior.push(demand(1, 1, 100, 0));
        let t = TesseraPolicy::new(WorkloadModel::with_prior(&prior));
        let v = |r: usize| t.fill_any[r];
        assert_eq!(v(50), 50.0, "nothing fits");
        assert!((v(100) - 60.0).abs() < 1e-9, "0.6 × 100 + 0.4 × 0: {}", v(100));
        // 600 and more: a 600 or a 100 fits, together all the shares: filled for sure, at
        // random by a 600 (V(0) = 0) or a 100 (V(500)), at best by the 600.
        assert!((v(600) - 0.25 * (24.0 * 0.0 + v(500)) / 25.0).abs() < 1e-9);
        // A free GPU is always filled (here by a 600, or a 100 then the rest).
        let random = (24.0 * v(400) + v(900)) / 25.0;
        assert!((v(1000) - (0.25 * random + 0.75 * v(400).min(v(900)))).abs() < 1e-9);
    }

    #[test]
    fn a_share_avoids_a_remainder_only_rare_shares_fit() {
        // Shares of 400 and 600 are common, 100s rare (2 of 42). A 400 arrives: on n0 (500
        // free) it would leave 100, which only a rare 100 fits; on n1 (800 free) it leaves 400,
        // which a common 400 fills exactly.
        let fleet = Fleet::from_openb_nodes(
            "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,65536,1,G2\nn1,64000,65536,1,G2\n",
            "nodes.csv",
        )
        .unwrap();
        let mut state = ClusterState::empty(&fleet);
        state.nodes[0].gpus[0].used_milli = 500;
        state.nodes[1].gpus[0].used_milli = 200;
        let mut prior = vec![demand(1, 1, 400, 0); 20];
        prior.extend(vec![demand(1, 1, 600, 0); 20]);
        prior.extend(vec![demand(1, 1, 100, 0); 2]);
        let four = demand(1, 1, 400, 0);
        let pairing = |t: &TesseraPolicy| -> Vec<f64> {
            (0..2)
                .map(|n| {
                    let view = NodeView {
                        node: &fleet.nodes[n],
                        state: &state.nodes[n],
                    };
                    let before = Hypo::of(&view);
                    t.fill_waste(&before.after(&four, Choice::Gpu(0)), true) - t.fill_waste(&before, true)
                })
                .collect()
        };
        let t = TesseraPolicy::new(WorkloadModel::with_prior(&prior));
        let p = pairing(&t);
        assert!(p[0] > 0.0 && p[1] < 0.0, "{p:?}");
        // The 100 gap counts as about half wasted (the 100s are 2/42 of the shares: filled
        // with chance 0.48) ...
        assert!((t.fill_any[100] - 100.0 * (1.0 - 20.0 / 42.0)).abs() < 1e-9);
        // ... where the earlier recurrence (random fills only, no scarcity) counts every gap
        // some class fits as filled: both choices would look perfect.
        let mut plain = t.clone();
        plain.fill_any = plain_fill(&plain.model);
        assert_eq!(pairing(&plain), vec![0.0, 0.0]);
    }

    /// The earlier form of `fill_values` (random fills only, no filler scarcity), for
    /// comparison.
    fn plain_fill(model: &WorkloadModel) -> Vec<f64> {
        let mut v = vec![0.0; 1001];
        for r in 1..=1000usize {
            let fit: Vec<_> = model
                .classes
                .iter()
                .filter(|c| c.gpus == 1 && (c.milli as usize) <= r)
                .collect();
            let w: f64 = fit.iter().map(|c| c.weight).sum();
            v[r] = if w > 0.0 {
                fit.iter().map(|c| c.weight * v[r - c.milli as usize]).sum::<f64>() / w
            } else {
                r as f64
            };
        }
        v
    }

    #[test]
    fn a_share_goes_where_its_remainder_pairs_with_a_common_share() {
        // openb's mid-size shares, equally common: 220, 230, 320, 550 and 650 milli. n0's GPU
        // holds a 650 (350 free), n1's a 550 (450 free); a 230 arrives.
        let fleet = Fleet::from_openb_nodes(
            "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,65536,1,G2\nn1,64000,65536,1,G2\n",
            "nodes.csv",
        )
        .unwrap();
        let mut state = ClusterState::empty(&fleet);
        state.nodes[0].gpus[0].used_milli = 650;
        state.nodes[1].gpus[0].used_milli = 550;
        let prior: Vec<Demand> = [220, 230, 320, 550, 650].iter().map(|&m| demand(1, 1, m, 0)).collect();
        let t = TesseraPolicy::new(WorkloadModel::with_prior(&prior));
        let v = |r: usize| t.fill_any[r];
        // 120 left on n0 is dead (nothing fits); 220 left on n1 is what a 220 fills exactly.
        assert_eq!((v(120), v(220)), (120.0, 0.0));
        // Before: 350 at random gets a 220 (130 left), a 230 (120) or a 320 (30); at best the
        // 320. 450: a 220 (V(230)), a 230 (V(220) = 0) or a 320 (130 left); at best the 230.
        assert!((v(350) - (0.25 * (130.0 + 120.0 + 30.0) / 3.0 + 0.75 * 30.0)).abs() < 1e-9);
        assert!((v(450) - 0.25 * (v(230) + 0.0 + 130.0) / 3.0).abs() < 1e-9);
        let two30 = demand(1, 1, 230, 0);
        let pairing: Vec<f64> = (0..2)
            .map(|n| {
                let view = NodeView {
                    node: &fleet.nodes[n],
                    state: &state.nodes[n],
                };
                let before = Hypo::of(&view);
                t.fill_waste(&before.after(&two30, Choice::Gpu(0)), true) - t.fill_waste(&before, true)
            })
            .collect();
        assert!(pairing[1] < 0.0 && pairing[0] > 50.0, "{pairing:?}");
        // FGD's fragmentation falls by 20 on n0 (120 left is unusable to all, 350 was to two
        // of the five classes) and by 4 on n1 (220 left is unusable to four); its integer score
        // (the paper simulator's) rounds both to 50, a tie ...
        let fgd = Fgd::new(&prior);
        let frag = |n: usize, after: bool| {
            let view = NodeView {
                node: &fleet.nodes[n],
                state: &state.nodes[n],
            };
            let mut h = Hypo::of(&view);
            if after {
                h = h.after(&two30, Choice::Gpu(0));
            }
            fgd.typical.frag(h.model, h.cpu_free, h.gpus())
        };
        assert!((frag(0, false) - frag(0, true) - 20.0).abs() < 1e-9);
        assert!((frag(1, false) - frag(1, true) - 4.0).abs() < 1e-9);
        let f = scores(&fleet, &state, &fgd, &two30, Choice::Gpu(0));
        assert_eq!(f, vec![-50.0, -50.0]);
        // ... where Tessera without the pairing term (and the priced fill, which agrees with
        // it here: the 350 could take a 320's 4 twelfths, the 120 nothing, while the 450 keeps
        // 3 of its 4) fills the tighter gap; with it, the 230 completes the 550's GPU up to a
        // size a 220 fills, and the 350 stays for a 320.
        let mut off = TesseraPolicy::new(WorkloadModel::with_prior(&prior));
        off.set_pairing_weight(0.0);
        off.set_price_weight(0.0);
        let s = scores(&fleet, &state, &off, &two30, Choice::Gpu(0));
        assert!(s[0] < s[1], "{s:?}");
        let s = scores(&fleet, &state, &t, &two30, Choice::Gpu(0));
        assert!(s[1] < s[0], "{s:?}");
    }

    #[test]
    fn priced_fill_counts_the_twelfths_a_gap_can_no_longer_take() {
        // Shares of 470, 230 and 220, 33 of each, and one 330: 1 % of the 100 shares, so it
        // counts (MIN_PRICED_SHARE). With the openb default file's prices: 470 → 6, 230 → 3,
        // 220 → 1, 330 → 4 twelfths.
        let mut prior = vec![demand(1, 1, 470, 0); 33];
        prior.extend(vec![demand(1, 1, 230, 0); 33]);
        prior.extend(vec![demand(1, 1, 220, 0); 33]);
        prior.push(demand(1, 1, 330, 0));
        let mut t = TesseraPolicy::new(WorkloadModel::with_prior(&prior));
        t.set_fixed_prices(true);
        let twelfth = (crate::bound::PRICE_UNITS / 12) as u32;
        let m = |r: usize| {
            assert_eq!(t.price_any[r] % twelfth, 0);
            t.price_any[r] / twelfth
        };
        assert_eq!((m(219), m(220), m(229), m(230)), (0, 1, 1, 3));
        assert_eq!(m(330), 4, "a 330");
        assert_eq!(m(450), 4, "230 + 220 (3 + 1), or a 330");
        assert_eq!((m(460), m(470)), (6, 6), "230 + 230, or a 470");
        assert_eq!(m(700), 9, "470 + 230");
        assert_eq!(m(940), 12, "470 + 470");
        assert_eq!(m(1000), 12, "a free GPU");
        // The 330 made 1 % of the shares; at half that (1 of 200) it is left out.
        let mut rare = vec![demand(1, 1, 470, 0); 66];
        rare.extend(vec![demand(1, 1, 230, 0); 66]);
        rare.extend(vec![demand(1, 1, 220, 0); 67]);
        rare.push(demand(1, 1, 330, 0));
        let mut r = TesseraPolicy::new(WorkloadModel::with_prior(&rare));
        r.set_fixed_prices(true);
        assert_eq!(r.price_any[330], 3 * twelfth, "only a 230 counts");
        // n0's GPU has 300 free (a 470 and a 230 on it), n1's 450 (a 330 and a 220). A 220
        // arrives: into 300 it leaves 80, so the gap goes from 3 twelfths (a 230) to 0: 3 × 1000
        // / 12 = 250 milli; into 450 it leaves 230, from 4 to 3: 83.3 milli. The 220's own price
        // (1) is in both; on n0 it also loses the 2 twelfths that a 230 would have made.
        let fleet = Fleet::from_openb_nodes(
            "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,65536,1,G2\nn1,64000,65536,1,G2\n",
            "nodes.csv",
        )
        .unwrap();
        let mut state = ClusterState::empty(&fleet);
        state.nodes[0].gpus[0].used_milli = 700;
        state.nodes[1].gpus[0].used_milli = 550;
        let two20 = demand(1, 1, 220, 0);
        let priced: Vec<f64> = (0..2)
            .map(|n| {
                let view = NodeView {
                    node: &fleet.nodes[n],
                    state: &state.nodes[n],
                };
                let before = Hypo::of(&view);
                t.price_potential(&before.after(&two20, Choice::Gpu(0))) - t.price_potential(&before)
            })
            .collect();
        assert!(
            (priced[0] - 250.0).abs() < 1e-9 && (priced[1] - 1000.0 / 12.0).abs() < 1e-9,
            "{priced:?}"
        );
        // The term adds PRICE_WEIGHT times that to each score, and the 220 goes to n1.
        let mut off = t.clone();
        off.set_price_weight(0.0);
        let without = scores(&fleet, &state, &off, &two20, Choice::Gpu(0));
        let with = scores(&fleet, &state, &t, &two20, Choice::Gpu(0));
        for n in 0..2 {
            assert!((with[n] - without[n] - PRICE_WEIGHT * priced[n]).abs() < 1e-6);
        }
        assert!(with[1] < with[0], "{with:?}");
    }

    #[test]
    fn a_gap_whose_node_cannot_host_its_fillers_counts_as_wasted() {
        // Shares of 300 (1 core, 1 GiB) and 500 (4 cores, 8 GiB), equally common. n0's GPU has
        // a 500 on it (500 free) and the node 6 cores and 4 GiB free: of the tasks that fit the
        // gap by size (both), only the 300s fit the node's memory: host fit 0.5.
        let fleet =
            Fleet::from_openb_nodes("sn,cpu_milli,memory_mib,gpu,model\nn0,8000,16384,1,G2\n", "nodes.csv").unwrap();
        let mut state = ClusterState::empty(&fleet);
        state.nodes[0].gpus[0].used_milli = 500;
        state.nodes[0].cpu_free = 6000;
        state.nodes[0].mem_free = 4096;
        let mut prior = vec![demand(1, 1, 300, 0); 2];
        prior.extend(vec![
            Demand {
                memory_mib: 8192,
                ..demand(4, 1, 500, 0)
            };
            2
        ]);
        let mut t = TesseraPolicy::new(WorkloadModel::with_prior(&prior));
        let view = NodeView {
            node: &fleet.nodes[0],
            state: &state.nodes[0],
        };
        let h = Hypo::of(&view);
        assert_eq!(t.gap_host_fit(&h, 500), 0.5);
        // V(500) = 0.25 × (V(200) + V(0)) / 2 + 0.75 × V(0) = 25 (a 300 leaves 200, which
        // nothing fits; a 500 fills it). Half the fillers can come: 0.5 × 25 + 0.5 × 500.
        assert_eq!(t.fill_any[500], 25.0);
        assert_eq!(t.fill_waste(&h, true), 262.5);
        // Judging a demand other than a share, the gap counts at V(500).
        assert_eq!(t.fill_waste(&h, false), 25.0);
        // A 200 gap: no task fits it by size, host fit 1 (V(200) = 200 either way).
        assert_eq!(t.gap_host_fit(&h, 200), 1.0);
        // With 4 cores left and 16 GiB, both fit: the gap counts at V(500).
        state.nodes[0].cpu_free = 4000;
        state.nodes[0].mem_free = 16384;
        let roomy = Hypo::of(&NodeView {
            node: &fleet.nodes[0],
            state: &state.nodes[0],
        });
        assert_eq!(t.fill_waste(&roomy, true), 25.0);
        // Without the host fit, the memory-poor node's gap also counts at V(500).
        t.set_fill_host_aware(false);
        assert_eq!(t.fill_waste(&h, true), 25.0);
    }

    #[test]
    fn a_cpu_only_task_is_not_judged_by_the_gaps_host_fit() {
        // Shares of 300 (1 core) and 500 (4 cores), equally common, 1 GiB each. n0's GPU holds
        // a 500 (500 free) beside 6 free cores; n1's two GPUs are free beside 6 free cores.
        // A CPU-only task of 3 cores leaves 3: on n0 the 500 gap's fillers fit 1 in 2 (host fit
        // 1 → 0.5), on n1 nothing the pairing term looks at changes (free GPUs have no host fit).
        let fleet = Fleet::from_openb_nodes(
            "sn,cpu_milli,memory_mib,gpu,model\nn0,8000,65536,1,G2\nn1,8000,65536,2,G2\n",
            "nodes.csv",
        )
        .unwrap();
        let mut state = ClusterState::empty(&fleet);
        state.nodes[0].gpus[0].used_milli = 500;
        state.nodes[0].cpu_free = 6000;
        state.nodes[1].cpu_free = 6000;
        let mut prior = vec![demand(1, 1, 300, 0); 2];
        prior.extend(vec![demand(4, 1, 500, 0); 2]);
        let t = TesseraPolicy::new(WorkloadModel::with_prior(&prior));
        let cpu_only = demand(3, 0, 0, 0);
        let pairing = |n: usize, host: bool| {
            let before = Hypo::of(&NodeView {
                node: &fleet.nodes[n],
                state: &state.nodes[n],
            });
            t.fill_waste(&before.after(&cpu_only, Choice::Host), host) - t.fill_waste(&before, host)
        };
        // With the host fit, n0's gap would go from V(500) = 25 to 0.5 × 25 + 0.5 × 500 =
        // 262.5: +237.5 milli, times the pairing weight 8 = 1,900, against nothing on n1. That
        // sent CPU-only tasks to nodes with free GPUs, whose CPU they then stranded (terms 1-3
        // count that at weight 1 or less).
        assert_eq!(pairing(0, true), 237.5);
        assert_eq!(pairing(1, true), 0.0);
        // So the score judges a CPU-only task without it: term 5 sees no change on either node,
        // and terms 1-3 decide.
        assert_eq!(pairing(0, false), 0.0);
        let score = |n: usize| {
            let view = NodeView {
                node: &fleet.nodes[n],
                state: &state.nodes[n],
            };
            t.score(&view, &cpu_only, Choice::Host).0
        };
        let mut off = t.clone();
        off.set_pairing_weight(0.0);
        off.set_price_weight(0.0);
        for n in 0..2 {
            let view = NodeView {
                node: &fleet.nodes[n],
                state: &state.nodes[n],
            };
            assert_eq!(score(n), off.score(&view, &cpu_only, Choice::Host).0);
        }
        // A share is still judged with it: a 300 onto n1 (a free GPU, 700 left) leaves 5 cores,
        // where both fillers of a 700 gap fit, host fit 1; the term is V(700) − V(1000) there.
        let share = demand(1, 1, 300, 0);
        let before = Hypo::of(&NodeView {
            node: &fleet.nodes[1],
            state: &state.nodes[1],
        });
        let after = before.after(&share, Choice::Gpu(0));
        assert_eq!(t.gap_host_fit(&after, 700), 1.0);
        assert_eq!(
            t.fill_waste(&after, true) - t.fill_waste(&before, true),
            t.fill_any[700] - t.fill_any[1000]
        );
    }

    #[test]
    fn flexible_task_leaves_the_scarce_model_to_its_constrained_class() {
        let fleet = Fleet::from_openb_nodes(
            "sn,cpu_milli,memory_mib,gpu,model\nt4,64000,65536,2,T4\ng2,64000,65536,2,G2\n",
            "nodes.csv",
        )
        .unwrap();
        let t4: ModelId = fleet.catalogue.find("T4").unwrap();
        let state = ClusterState::empty(&fleet);
        // Most tasks run anywhere, some only on T4.
        let mut prior = vec![demand(8, 1, 1000, 0); 8];
        prior.extend(vec![demand(8, 1, 1000, 1 << t4.0); 2]);
        let tessera = TesseraPolicy::new(WorkloadModel::with_prior(&prior));
        let flexible = demand(8, 1, 1000, 0);
        let s = scores(&fleet, &state, &tessera, &flexible, Choice::Gpus(0b1));
        assert!(s[1] < s[0], "the flexible task takes the G2 GPU: {s:?}");
    }
}
