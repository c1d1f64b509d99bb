//! Scoring policies for shared (time-sliced) pools, where placement quality is decided: which
//! node, and which GPU on it, a fraction or a gang of whole GPUs should take.
//!
//! A policy is a small pluggable piece: it scores one candidate (node, choice) for a demand and
//! never touches the engine's loop. The engine picks, on each node, the candidate with the lowest
//! `(primary, secondary)` score, then the node with the lowest primary score, breaking exact ties
//! at random with its seeded generator (the openb protocol's "ties at random"), or, for a policy
//! that asks ([`SharedPolicy::ties_in_fixed_order`]), by an order of the nodes drawn once.
//!
//! * [`Random`]: every feasible node is as good as any other.
//! * [`BestFit`]: the openb paper's BestFit (the replay's sanity baseline).
//! * [`Fgd`]: Fragmentation Gradient Descent (Weng et al., ATC'23), as the paper's simulator
//!   runs it: minimise the growth of expected fragmentation against the workload's typical
//!   pods, with the simulator's integer score and tie-breaking (`docs/openb-replay.md`).
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

    /// Whether exact ties between nodes go to the first node in an order of the nodes drawn
    /// once per engine from its seed, instead of at random at each decision. The FGD
    /// simulator's scheduler does this: it takes the lexicographically smallest node name, and
    /// the names start with a random permutation drawn once per run.
    fn ties_in_fixed_order(&self) -> bool {
        false
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

/// One of FGD's "typical pods": a pod shape of the target workload and its share of the pods.
/// As in the paper's simulator, a shape is its CPU, GPU count, milli-GPU per GPU and allowed
/// models; memory is not part of it (the simulator's fragmentation measure ignores memory).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TypicalPod {
    pub cpu_milli: u64,
    pub gpus: u8,
    /// Milli-GPU per GPU (0 for a CPU-only pod).
    pub milli: u16,
    /// Allowed models mask, as [`Demand::models`].
    pub models: u64,
    /// Share of the typical pods (the shares sum to 1).
    pub weight: f64,
}

/// FGD's target workload, built as the paper's simulator builds it (`GetTypicalPods` with the
/// artefact's settings: CPU-only pods included, popularity threshold 95 %, step 1, no GPU
/// weighting): count the pods of each shape, sort the shapes by decreasing count, keep the most
/// popular ones until they cover at least 95 % of the pods, and renormalise their shares.
///
/// Built once from a prior (the trace's pod list, as the simulator does) it stays fixed; built
/// without one (a server's pool) it learns from the demands it observes, rebuilt each time the
/// number of observations doubles.
#[derive(Clone, Debug, Default)]
pub struct TypicalPods {
    counts: std::collections::HashMap<(u64, u16, u8, u64), f64>,
    observed: u64,
    next_rebuild: u64,
    epoch: u64,
    fixed: bool,
    pub pods: Vec<TypicalPod>,
}

impl TypicalPods {
    /// The share of the pods the typical shapes must cover.
    pub const POPULARITY: f64 = 0.95;

    /// From the target workload `prior`; learns online instead if it is empty.
    pub fn from_prior<'a>(prior: impl IntoIterator<Item = &'a Demand>) -> Self {
        let mut t = TypicalPods::default();
        for d in prior {
            t.add(d);
        }
        t.fixed = t.observed > 0;
        t.rebuild();
        t
    }

    fn add(&mut self, d: &Demand) {
        let milli = if d.gpus == 0 { 0 } else { d.milli };
        *self.counts.entry((d.cpu_milli, milli, d.gpus, d.models)).or_default() += 1.0;
        self.observed += 1;
    }

    /// Learns from one demand, unless the target workload was given up front.
    pub fn observe(&mut self, d: &Demand) {
        if self.fixed {
            return;
        }
        self.add(d);
        if self.observed >= self.next_rebuild {
            self.rebuild();
        }
    }

    fn rebuild(&mut self) {
        self.next_rebuild = (self.observed * 2).max(16);
        self.epoch += 1;
        let total: f64 = self.counts.values().sum();
        let mut shapes: Vec<_> = self.counts.iter().map(|(&k, &c)| (k, c)).collect();
        // Decreasing count; equal counts by decreasing shape (CPU, milli, GPUs, models), as the
        // simulator's reverse sort does (it compares the model list as text; the mask here).
        shapes.sort_by(|a, b| b.1.total_cmp(&a.1).then(b.0.cmp(&a.0)));
        let mut cum = 0.0;
        let mut kept = 0;
        while kept < shapes.len() && cum < Self::POPULARITY * total {
            cum += shapes[kept].1;
            kept += 1;
        }
        self.pods = shapes[..kept]
            .iter()
            .map(|&((cpu_milli, milli, gpus, models), c)| TypicalPod {
                cpu_milli,
                gpus,
                milli,
                models,
                weight: c / cum,
            })
            .collect();
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// FGD's fragmentation of a node (the simulator's `NodeGpuShareFragAmountScore`), in
    /// milli-GPU: for each typical pod, weighted by its share, the free GPU milli it could not
    /// use there. All of the node's free GPU counts for a CPU-only pod, for a pod whose models
    /// exclude the node's, and for a pod whose GPUs or CPU do not fit; for a pod that fits, the
    /// free milli of the GPUs with less free than it asks per GPU. Memory is not considered.
    pub fn frag(&self, model: ModelId, cpu_free: u64, gpus: &[u16]) -> f64 {
        let total: u64 = gpus.iter().map(|&f| f as u64).sum();
        if total == 0 {
            return 0.0;
        }
        let t = total as f64;
        let mut frag = 0.0;
        for p in &self.pods {
            let unusable = if p.gpus == 0 || p.milli == 0 || !mask_allows(p.models, model) {
                t
            } else {
                let fits = gpus.iter().filter(|&&f| f >= p.milli).count() >= p.gpus as usize;
                if fits && cpu_free >= p.cpu_milli {
                    gpus.iter().filter(|&&f| f < p.milli).map(|&f| f as u64).sum::<u64>() as f64
                } else {
                    t
                }
            };
            frag += p.weight * unusable;
        }
        frag
    }
}

/// Fragmentation Gradient Descent (Weng et al., ATC'23), as the paper's simulator
/// (`hkust-adsl/kubernetes-scheduler-simulator`, `FGDScore` with GPU selection `FGD`) runs it:
/// the score of a placement is `⌊100 × sigmoid((frag before − frag after) / 1000)⌋`, an integer
/// from 0 to 100; a node scores its best GPU (the first in index order among equal scores),
/// and the node with the highest score wins, ties going to the first node in an order drawn
/// once per run (the simulator's patched Kubernetes scheduler takes the lexicographically
/// smallest node name, and prefixes each name with its place in a random permutation). Both
/// matter: differences under about 40 milli of expected fragmentation tie, and ties broken at
/// random at each decision instead leave about twice as much GPU unallocated on openb.
#[derive(Clone, Debug)]
pub struct Fgd {
    pub typical: TypicalPods,
}

impl Fgd {
    /// FGD against the target workload `prior` (learned online if empty).
    pub fn new(prior: &[Demand]) -> Self {
        Fgd {
            typical: TypicalPods::from_prior(prior),
        }
    }

    /// The simulator's integer score (higher is better) of placing `d` at `choice`.
    pub fn node_score(&self, view: &NodeView, d: &Demand, choice: Choice) -> i64 {
        let before = Hypo::of(view);
        let after = before.after(d, choice);
        let fb = self.typical.frag(before.model, before.cpu_free, before.gpus());
        let fa = self.typical.frag(after.model, after.cpu_free, after.gpus());
        let sigmoid = 1.0 / (1.0 + (-(fb - fa) / 1000.0).exp());
        (sigmoid * 100.0) as i64
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
        self.typical.observe(d);
    }

    fn epoch(&self) -> u64 {
        self.typical.epoch()
    }

    fn ties_in_fixed_order(&self) -> bool {
        true
    }

    fn score(&self, view: &NodeView, d: &Demand, choice: Choice) -> Score {
        (-(self.node_score(view, d, choice) as f64), 0.0)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tessera_model::{Fleet, Request, Shape};

    use super::*;
    use crate::engine::Engine;
    use crate::state::ClusterState;

    fn demand(cpu: u64, gpus: u8, milli: u16) -> Demand {
        Demand {
            cpu_milli: cpu,
            memory_mib: 1024,
            gpus,
            milli,
            gpu_mem_mib: 0,
            tenant: None,
            models: 0,
        }
    }

    /// 10 shares of 500, 6 CPU-only pods, 3 of two whole GPUs and one share of 250: the most
    /// popular shapes up to 95 % of the 20 pods are the first three (19 pods).
    fn prior() -> Vec<Demand> {
        let mut p = vec![demand(1000, 1, 500); 10];
        p.extend(vec![demand(2000, 0, 0); 6]);
        p.extend(vec![demand(4000, 2, 1000); 3]);
        p.push(demand(1000, 1, 250));
        p
    }

    #[test]
    fn typical_pods_are_the_popular_shapes_up_to_95_percent() {
        let t = TypicalPods::from_prior(&prior());
        let got: Vec<_> = t
            .pods
            .iter()
            .map(|p| (p.cpu_milli, p.gpus, p.milli, p.weight))
            .collect();
        assert_eq!(
            got,
            vec![
                (1000, 1, 500, 10.0 / 19.0),
                (2000, 0, 0, 6.0 / 19.0),
                (4000, 2, 1000, 3.0 / 19.0)
            ]
        );
        // Given up front, the target workload does not move.
        let mut fixed = t.clone();
        fixed.observe(&demand(1000, 1, 250));
        assert_eq!((&fixed.pods, fixed.epoch()), (&t.pods, t.epoch()));
    }

    #[test]
    fn fragmentation_and_the_integer_score_by_hand() {
        let fleet =
            Fleet::from_openb_nodes("sn,cpu_milli,memory_mib,gpu,model\nn0,4000,65536,2,G2\n", "n.csv").unwrap();
        let mut state = ClusterState::empty(&fleet);
        state.nodes[0].gpus[1].used_milli = 700;
        let fgd = Fgd::new(&prior());
        let view = NodeView {
            node: &fleet.nodes[0],
            state: &state.nodes[0],
        };
        let h = Hypo::of(&view);
        // Free [1000, 300], 4 cores: a 500 fits and cannot use the 300; a CPU-only pod counts
        // all 1,300; two whole GPUs do not fit: all 1,300.
        let before = fgd.typical.frag(h.model, h.cpu_free, h.gpus());
        assert!((before - (10.0 * 300.0 + 6.0 * 1300.0 + 3.0 * 1300.0) / 19.0).abs() < 1e-9);
        // A 500 on GPU 0 leaves [500, 300] and 3 cores: 10 × 300 + 6 × 800 + 3 × 800, a fall of
        // 4,500 / 19 = 236.8: ⌊100 × sigmoid(0.2368)⌋ = 55.
        let share = demand(1000, 1, 500);
        let a = h.after(&share, Choice::Gpu(0));
        let after = fgd.typical.frag(a.model, a.cpu_free, a.gpus());
        assert!((before - after - 4500.0 / 19.0).abs() < 1e-9);
        assert_eq!(fgd.node_score(&view, &share, Choice::Gpu(0)), 55);
        assert_eq!(fgd.score(&view, &share, Choice::Gpu(0)), (-55.0, 0.0));
    }

    /// CPU-only typical pods see every free GPU as fragment whatever the CPU, so a CPU-only pod
    /// scores the same (50) everywhere: FGD's ties go to the first node of an order drawn once,
    /// so the pods fill one node before the next, where ties at random would spread them.
    #[test]
    fn fgd_ties_go_to_one_node_order_drawn_once() {
        let nodes: String = (0..4).map(|i| format!("n{i},8000,65536,2,G2\n")).collect();
        let fleet =
            Arc::new(Fleet::from_openb_nodes(&format!("sn,cpu_milli,memory_mib,gpu,model\n{nodes}"), "n.csv").unwrap());
        let cpu = Request::new(Shape::CpuOnly).with_host(1000, 1024);
        let mut firsts = std::collections::HashSet::new();
        for seed in 0..16 {
            let mut e = Engine::new(fleet.clone(), Box::new(Fgd::new(&[demand(1000, 0, 0)])), seed);
            for id in 0..9 {
                assert!(e.try_place(id, &cpu));
            }
            let full: Vec<usize> = (0..4).filter(|&n| e.state().nodes[n].cpu_free == 0).collect();
            let used = (0..4).filter(|&n| e.state().nodes[n].cpu_free < 8000).count();
            assert_eq!((full.len(), used), (1, 2), "seed {seed}");
            firsts.insert(full[0]);
        }
        assert!(firsts.len() > 1, "the order is drawn per seed: {firsts:?}");
    }
}
