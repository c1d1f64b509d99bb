//! Scoring policies for shared (time-sliced) pools, where placement quality is decided: which
//! node, and which GPU on it, a fraction or a gang of whole GPUs should take.
//!
//! A policy is a small pluggable piece: it scores one candidate (node, choice) for a demand and
//! never touches the engine's loop. The engine picks, on each node, the candidate with the lowest
//! `(primary, secondary)` score, then the node with the lowest primary score, breaking exact ties
//! at random with its seeded generator (the openb protocol's "ties at random").
//!
//! * [`Random`]: every feasible node is as good as any other.
//! * [`BestFit`]: the openb paper's BestFit (the replay's sanity baseline).
//! * [`Fgd`]: Fragmentation Gradient Descent (Weng et al., ATC'23), reimplemented from the
//!   paper: minimise the growth of expected fragmentation against the workload's distribution.
//! * [`crate::tessera::TesseraPolicy`]: Tessera's own policy (see that module).

use tessera_model::{ModelId, Node, TenantId};

use crate::state::NodeState;

/// A request reduced to what a shared-pool policy needs. `gpus == 0`: CPU only;
/// `gpus == 1 && milli < 1000`: a fraction; otherwise `gpus` whole GPUs (`milli == 1000`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Demand {
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpus: u8,
    pub milli: u16,
    pub gpu_mem_mib: u32,
    pub tenant: Option<TenantId>,
    /// Allowed GPU models as a bit mask of model ids (bit `i` = `ModelId(i)`); 0 = any model.
    pub models: u64,
}

impl Demand {
    /// Whether the demand may run on `model`.
    pub fn allows(&self, model: ModelId) -> bool {
        mask_allows(self.models, model)
    }

    pub fn is_fraction(&self) -> bool {
        self.gpus == 1 && self.milli < 1000
    }

    /// Total milli-GPU requested.
    pub fn total_milli(&self) -> u64 {
        self.gpus as u64 * self.milli as u64
    }
}

/// Whether a model whitelist mask (0 = any model) admits `model`.
fn mask_allows(mask: u64, model: ModelId) -> bool {
    mask == 0 || (model.0 < 64 && mask >> model.0 & 1 == 1)
}

/// Where on a node a demand would go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Choice {
    /// A fraction on this GPU.
    Gpu(u8),
    /// These whole GPUs (mask).
    Gpus(u16),
    /// Host resources only.
    Host,
}

/// A node as a policy sees it: its description and current state.
#[derive(Clone, Copy)]
pub struct NodeView<'a> {
    pub node: &'a Node,
    pub state: &'a NodeState,
}

impl NodeView<'_> {
    pub fn model(&self) -> ModelId {
        self.node.model
    }

    /// Free milli-GPU summed over the node.
    pub fn free_milli(&self) -> u64 {
        self.state.gpus.iter().map(|g| g.free_milli() as u64).sum()
    }
}

/// Score of one candidate: lower is better; `.0` ranks nodes, `.1` breaks ties within a node.
pub type Score = (f64, f64);

/// A shared-pool scoring policy.
pub trait SharedPolicy: Send {
    fn name(&self) -> &'static str;

    /// Sees every demand offered to a shared pool, before it is placed (to learn the
    /// workload's distribution).
    fn observe(&mut self, _demand: &Demand) {}

    /// Changes whenever the policy's internal model changes; cached scores of an older epoch
    /// are discarded.
    fn epoch(&self) -> u64 {
        0
    }

    /// Scores placing `demand` at `choice` on `view`. Must be a pure function of its arguments
    /// and the policy's epoch (the engine caches it per node state).
    fn score(&self, view: &NodeView, demand: &Demand, choice: Choice) -> Score;

    /// A copy with the same learned model (for an engine copied to try plans on).
    fn boxed_clone(&self) -> Box<dyn SharedPolicy>;
}

/// Uniformly random among feasible nodes.
#[derive(Clone, Debug, Default)]
pub struct Random;

impl SharedPolicy for Random {
    fn boxed_clone(&self) -> Box<dyn SharedPolicy> {
        Box::new(self.clone())
    }

    fn name(&self) -> &'static str {
        "random"
    }

    fn score(&self, _: &NodeView, _: &Demand, _: Choice) -> Score {
        (0.0, 0.0)
    }
}

/// The openb paper's BestFit: the node minimising
/// `0.5 × (free CPU − requested) / 128,000 + 0.5 × (free milli-GPU − requested) / 8,000`;
/// on it, a fraction goes to the GPU with the least free milli-GPU that still fits.
#[derive(Clone, Debug, Default)]
pub struct BestFit;

impl SharedPolicy for BestFit {
    fn boxed_clone(&self) -> Box<dyn SharedPolicy> {
        Box::new(self.clone())
    }

    fn name(&self) -> &'static str {
        "bestfit"
    }

    fn score(&self, view: &NodeView, d: &Demand, choice: Choice) -> Score {
        let cpu = (view.state.cpu_free - d.cpu_milli) as f64 / 128_000.0;
        let gpu = (view.free_milli() - d.total_milli()) as f64 / 8_000.0;
        let within = match choice {
            Choice::Gpu(g) => view.state.gpus[g as usize].free_milli() as f64,
            _ => 0.0,
        };
        (0.5 * cpu + 0.5 * gpu, within)
    }
}

/// The distribution of demands a pool sees: GPU demand classes, each with the host
/// requirements of its members and their weights. Learned online, optionally seeded with a
/// prior (the trace's pod list, as the FGD paper does).
#[derive(Clone, Debug, Default)]
pub struct WorkloadModel {
    counts: std::collections::HashMap<(u8, u16, u64, u64, u64), f64>,
    observed: u64,
    next_rebuild: u64,
    epoch: u64,
    /// Frozen view used for scoring.
    pub classes: Vec<DemandClass>,
}

/// All demands with the same GPU shape.
#[derive(Clone, Debug, Default)]
pub struct DemandClass {
    pub gpus: u8,
    pub milli: u16,
    /// Allowed models mask, as [`Demand::models`].
    pub models: u64,
    /// Total weight of the class (weights of all classes sum to 1).
    pub weight: f64,
    /// Members `(cpu_milli, memory_mib, weight)`, sorted by CPU.
    pub hosts: Vec<(u64, u64, f64)>,
}

impl DemandClass {
    /// Whether tasks of this class may run on `model`.
    pub fn allows(&self, model: ModelId) -> bool {
        mask_allows(self.models, model)
    }

    /// The weight of this class's tasks whose host CPU and memory fit the given free amounts.
    pub fn host_fit_weight(&self, cpu_free: u64, mem_free: u64) -> f64 {
        self.hosts
            .iter()
            .take_while(|h| h.0 <= cpu_free)
            .filter(|h| h.1 <= mem_free)
            .map(|h| h.2)
            .sum()
    }
}

impl WorkloadModel {
    pub fn with_prior<'a>(prior: impl IntoIterator<Item = &'a Demand>) -> Self {
        let mut m = WorkloadModel::default();
        for d in prior {
            m.add(d);
        }
        m.rebuild();
        m
    }

    fn add(&mut self, d: &Demand) {
        if d.gpus == 0 {
            return;
        }
        *self
            .counts
            .entry((d.gpus, d.milli, d.models, d.cpu_milli, d.memory_mib))
            .or_default() += 1.0;
        self.observed += 1;
    }

    /// Adds one observation; the frozen view is rebuilt each time the number of observations
    /// doubles (so cached scores stay valid most of the time).
    pub fn observe(&mut self, d: &Demand) {
        self.add(d);
        if self.observed >= self.next_rebuild {
            self.rebuild();
        }
    }

    fn rebuild(&mut self) {
        self.next_rebuild = (self.observed * 2).max(16);
        self.epoch += 1;
        let total: f64 = self.counts.values().sum();
        let mut classes: Vec<DemandClass> = Vec::new();
        let mut keys: Vec<_> = self.counts.iter().collect();
        keys.sort_by(|a, b| a.0.cmp(b.0));
        for (&(gpus, milli, models, cpu, mem), &w) in keys {
            let w = w / total;
            match classes
                .iter_mut()
                .find(|c| c.gpus == gpus && c.milli == milli && c.models == models)
            {
                Some(c) => {
                    c.weight += w;
                    c.hosts.push((cpu, mem, w));
                }
                None => classes.push(DemandClass {
                    gpus,
                    milli,
                    models,
                    weight: w,
                    hosts: vec![(cpu, mem, w)],
                }),
            }
        }
        for c in &mut classes {
            c.hosts.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
        }
        self.classes = classes;
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

/// A hypothetical node: free host resources and per-GPU free milli.
#[derive(Clone, Copy, Debug)]
pub struct Hypo {
    pub model: ModelId,
    pub cpu_free: u64,
    pub mem_free: u64,
    pub free: [u16; 16],
    pub n: usize,
}

impl Hypo {
    pub fn of(view: &NodeView) -> Self {
        let mut free = [0u16; 16];
        for (i, g) in view.state.gpus.iter().enumerate() {
            free[i] = g.free_milli();
        }
        Hypo {
            model: view.node.model,
            cpu_free: view.state.cpu_free,
            mem_free: view.state.mem_free,
            free,
            n: view.state.gpus.len(),
        }
    }

    /// The node after `d` is placed at `choice`.
    pub fn after(mut self, d: &Demand, choice: Choice) -> Self {
        self.cpu_free -= d.cpu_milli;
        self.mem_free -= d.memory_mib;
        match choice {
            Choice::Gpu(g) => self.free[g as usize] -= d.milli,
            Choice::Gpus(mask) => {
                for g in 0..self.n {
                    if mask >> g & 1 == 1 {
                        self.free[g] = 0;
                    }
                }
            }
            Choice::Host => {}
        }
        self
    }

    pub fn gpus(&self) -> &[u16] {
        &self.free[..self.n]
    }
}

/// FGD's expected fragmentation of a node against the workload model: for each demand class,
/// the free GPU milli that a task of that class could not use there (all of it if the task
/// cannot run on the node at all), weighted by the class's popularity.
pub fn fgd_fragmentation(model: &WorkloadModel, h: &Hypo) -> f64 {
    let gpus = h.gpus();
    let total: u64 = gpus.iter().map(|&f| f as u64).sum();
    if total == 0 {
        return 0.0;
    }
    let full = gpus.iter().filter(|&&f| f == 1000).count() as u8;
    let mut frag = 0.0;
    let t = total as f64;
    for c in &model.classes {
        if !c.allows(h.model) {
            // The class may not run on this model: all free GPU is out of its reach.
            frag += c.weight * t;
            continue;
        }
        let fit_w = c.host_fit_weight(h.cpu_free, h.mem_free);
        let (gpu_fits, unusable) = if c.gpus == 1 && c.milli < 1000 {
            let fits = gpus.iter().any(|&f| f >= c.milli);
            let un: u64 = gpus.iter().filter(|&&f| f < c.milli).map(|&f| f as u64).sum();
            (fits, un)
        } else {
            let un: u64 = gpus.iter().filter(|&&f| f < 1000).map(|&f| f as u64).sum();
            (full >= c.gpus, un)
        };
        frag += (c.weight - fit_w) * t + fit_w * if gpu_fits { unusable as f64 } else { t };
    }
    frag
}

/// Fragmentation Gradient Descent: place where expected fragmentation grows least.
#[derive(Clone, Debug)]
pub struct Fgd {
    pub model: WorkloadModel,
}

impl Fgd {
    pub fn new(model: WorkloadModel) -> Self {
        Fgd { model }
    }
}

impl SharedPolicy for Fgd {
    fn boxed_clone(&self) -> Box<dyn SharedPolicy> {
        Box::new(self.clone())
    }

    fn name(&self) -> &'static str {
        "fgd"
    }

    fn observe(&mut self, d: &Demand) {
        self.model.observe(d);
    }

    fn epoch(&self) -> u64 {
        self.model.epoch()
    }

    fn score(&self, view: &NodeView, d: &Demand, choice: Choice) -> Score {
        let before = Hypo::of(view);
        let after = before.after(d, choice);
        (
            fgd_fragmentation(&self.model, &after) - fgd_fragmentation(&self.model, &before),
            0.0,
        )
    }
}
