//! The placement engine: given the fleet state and a request, a placement or a structured
//! reason why not; committing and releasing allocations exactly.
//!
//! One engine serves every caller (the trace replay, the benchmarks, the server). Each pool's
//! sharing mode has its own placer:
//!
//! * **whole** pools: gangs of whole GPUs on one node and one NVLink domain. Nodes are indexed by
//!   their number of free GPUs and a request takes the node with the fewest free GPUs that can
//!   hold it (best fit), so whole nodes stay free for 8-GPU jobs.
//! * **mig** pools: GPUs are partitioned on demand, in one of two [`MigMode`]s chosen for the
//!   backend with [`Engine::set_mig_mode`] before anything is placed:
//!   * `Instance` (the default; NVML creates one instance at a chosen placement while the others
//!     run): GPUs are indexed by occupancy and the precomputed [`MigTable`] gives, per occupancy,
//!     the start that costs the least future flexibility; the request takes the cheapest
//!     (GPU, start) over the pool. An instance exists while it is in use.
//!   * `WholeGpu` (the GPU Operator's MIG manager lays out a whole GPU, only while none of its
//!     instances is in use): each GPU has a configured layout besides its occupancy. A request
//!     takes a free configured instance on a GPU that already has work, else one on an idle GPU,
//!     else an idle GPU is laid out again: the new instance at the table's best start for an
//!     empty GPU plus the configured instances that can stay ([`Placement::relayout`]). Released
//!     instances stay configured. [`Engine::mig_layout`] and [`Engine::adopt_layout`] read and
//!     set layouts.
//!
//!   Running instances are never moved in either mode. In `Instance` mode an admin may take a
//!   GPU of a mig pool out of MIG mode ([`Engine::set_gpu_mig`]): it then serves whole GPUs
//!   (gangs only of such GPUs) and no instances, until MIG is enabled again; a GPU whose mode
//!   change waits for a reset serves neither ([`Engine::set_gpu_mig_pending`]).
//! * **shared** pools: fractions and whole GPUs on time-sliced GPUs, scored by a pluggable
//!   [`SharedPolicy`]; one tenant per GPU unless the pool allows mixing — and one tenant per
//!   *node* under [`DeviceBinding::PerNodeCount`], where the device plugin, not Tessera, picks
//!   which time-sliced GPU a fraction gets (see [`Engine::node_isolation`]). Scores are cached
//!   per node state, and per demand type a min-tree over the nodes' best scores lets a
//!   placement read only the nodes that can win ([`shared_index`]).
//!
//! Bookings name exact devices. Where the backend picks the devices itself and reports them
//! afterwards (the stock device plugin: "N devices on node X"), [`DeviceBinding::PerNodeCount`]
//! makes a commit provisional until [`Engine::bind`] or [`Engine::rebind`] (which moves it to
//! the devices the backend chose, swapping with other provisional bookings of the same shape)
//! makes it bound; accounting per node, GPU and tenant stays exact throughout.
//!
//! [`MigMode`]: crate::mig::MigMode

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_model::request::MigChoice;
use tessera_model::{Fleet, GpuUnits, ModelId, NodeId, PoolId, Request, Shape, Sharing, TenantId, Topology};

use crate::mig::{MigTable, state_key};
use crate::policy::{Choice, Demand, NodeView, Score, SharedPolicy};
use crate::reason::{Missing, Pools, ShapeKind, ShapeLabel, Unplaceable};
use crate::state::{AllocId, Allocation, ClusterState, Grant, Placement};

/// A commit that does not fit the current state (a stale or foreign placement).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitError(pub String);

impl fmt::Display for CommitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CommitError {}

mod gang;
mod rebind;
mod shared_index;
mod whole_gpu;

pub use gang::{GangAllocation, GangPlacement, MAX_GANG_ID, SHARE_BIT, share_id};
pub use rebind::DeviceBinding;

/// How an allocation comes to be booked; what must hold differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Booking {
    /// A placement from [`Engine::plan`], which says whether it lays out its GPU anew.
    Commit { relayout: bool },
    /// An allocation that exists on the backend already (read from the store, or put back
    /// after a trial release).
    Restore,
    /// An allocation moved to the devices the backend chose.
    Rebind,
}

/// A cached best choice on one node: `(node epoch, policy epoch, best)`.
type CacheEntry = (u64, u64, Option<(Choice, Score)>);

/// GPUs `(node, gpu)` of one (pool, model), bucketed by MIG occupancy key.
type MigBuckets = Vec<BTreeSet<(u32, u8)>>;

/// Per (demand type, node) cache of a shared policy's best choice on that node.
#[derive(Default)]
struct ScoreCache {
    types: HashMap<Demand, u32>,
    /// `entries[type][node]`.
    entries: Vec<Vec<CacheEntry>>,
    /// Per (demand type, shared pool), its nodes by best score ([`shared_index`]).
    trees: rustc_hash::FxHashMap<(u32, u16), shared_index::ScoreTree>,
}

const MAX_CACHED_TYPES: usize = 2048;

/// A shared-pool request as the shared placer reads it.
struct SharedDemand<'a> {
    req: &'a Request,
    d: &'a Demand,
    mix: bool,
    node_iso: bool,
    policy_epoch: u64,
    /// Its demand type in the score cache, if it has one.
    type_id: Option<usize>,
}

/// At most this many (demand type, pool) score trees; further types scan the pool.
const MAX_SCORE_TREES: usize = 256;

/// Shared pools with fewer nodes are scanned: reading a few dozen nodes costs less than
/// keeping their score trees.
const MIN_TREE_NODES: usize = 64;

/// Added to the score of opening an empty GPU for a fraction in a pool that keeps tenants
/// apart: larger than any policy score, so own partly used GPUs always come first.
const OPEN_GPU_PENALTY: f64 = 1e12;

/// The placement engine over one fleet.
pub struct Engine {
    fleet: Arc<Fleet>,
    state: ClusterState,
    policy: Box<dyn SharedPolicy>,
    rng: ChaCha8Rng,
    /// MIG table per model (None for non-MIG models).
    mig_tables: Vec<Option<Arc<MigTable>>>,
    /// Whole pools: `by_free[pool][k]` = nodes with exactly `k` free GPUs.
    by_free: Vec<Vec<BTreeSet<u32>>>,
    /// MIG pools: per (pool, model), GPUs `(node, gpu)` bucketed by occupancy key
    /// (`Instance` mode).
    mig_index: HashMap<(u16, u16), MigBuckets>,
    mig_mode: crate::mig::MigMode,
    /// MIG pools in `WholeGpu` mode: per (pool, model), free configured instances and idle GPUs.
    layout_index: HashMap<(u16, u16), whole_gpu::LayoutIndex>,
    binding: DeviceBinding,
    /// Provisional allocations released since the last commit. The scheduler tries a plan by
    /// releasing allocations and restoring them; such a restore must leave them provisional,
    /// whereas an allocation restored from the store is bound.
    released_unbound: Vec<AllocId>,
    cache: ScoreCache,
    /// Nodes held back for a reservation: no placement goes there while set.
    blocked: rustc_hash::FxHashSet<u32>,
    /// Nodes taken out of placement by an operator (cordoned, draining, in maintenance): no
    /// new placement goes there; what runs there stays.
    fenced_nodes: std::collections::HashSet<u32>,
    /// Per node, the GPUs taken out of placement (unhealthy): no new placement on them.
    fenced_gpus: HashMap<u32, u16>,
    /// MIG pools, per node: the GPUs an admin took out of MIG mode (they serve whole GPUs).
    mig_off: HashMap<u32, u16>,
    /// Per node, the GPUs whose MIG mode change waits for a GPU reset: out of placement.
    mig_pending: HashMap<u32, u16>,
    next_epoch: u64,
    scratch: Vec<Choice>,
    /// Per pool, a counter bumped whenever capacity there may have grown (a release, a fence
    /// lifted, a MIG change): a request that found no room at one value finds none while it
    /// holds ([`Engine::freed_generation`]).
    freed: Vec<u64>,
    /// Per pool, its nodes grouped by GPU model (the fleet never changes): the eligible nodes
    /// of a request without a pass over every node.
    pool_models: Vec<Vec<(ModelId, Vec<u32>)>>,
    /// Per node, the free milli-GPU summed over its GPUs, as of its last (re)indexing: a
    /// diagnosis sums it over the eligible nodes without reading every GPU.
    node_free: Vec<u64>,
    /// Per shared pool, the nodes whose epoch changed (the score trees catch up from it).
    changes: Vec<shared_index::ChangeLog>,
    /// Whole pools: per rack (or pool without racks), its nodes by free GPUs, and the pools'
    /// topology trees (gangs beyond one node).
    gang_index: gang::GangIndex,
    /// Committed gangs; their shares are ordinary allocations.
    gangs: HashMap<AllocId, GangAllocation>,
    /// Per node, its rank in an order of the nodes drawn once from the engine's seed, for a
    /// policy whose exact ties go to the first node in such an order
    /// ([`SharedPolicy::ties_in_fixed_order`]); `None`: ties go at random.
    tie_rank: Option<Arc<Vec<u32>>>,
}

impl Engine {
    pub fn new(fleet: Arc<Fleet>, policy: Box<dyn SharedPolicy>, seed: u64) -> Self {
        let state = ClusterState::empty(&fleet);
        let mut tables: HashMap<&'static str, Arc<MigTable>> = HashMap::new();
        let mig_tables = fleet
            .catalogue
            .models()
            .map(|(_, m)| {
                m.mig.map(|g| {
                    tables
                        .entry(g.name)
                        .or_insert_with(|| Arc::new(MigTable::new(g)))
                        .clone()
                })
            })
            .collect();
        let mut e = Engine {
            state,
            policy,
            rng: ChaCha8Rng::seed_from_u64(seed),
            mig_tables,
            by_free: Vec::new(),
            mig_index: HashMap::new(),
            mig_mode: crate::mig::MigMode::Instance,
            layout_index: HashMap::new(),
            binding: DeviceBinding::Exact,
            released_unbound: Vec::new(),
            cache: ScoreCache::default(),
            blocked: Default::default(),
            fenced_nodes: Default::default(),
            fenced_gpus: HashMap::new(),
            mig_off: HashMap::new(),
            mig_pending: HashMap::new(),
            next_epoch: 1,
            scratch: Vec::new(),
            freed: vec![0; fleet.pools.len()],
            node_free: vec![0; fleet.nodes.len()],
            changes: vec![Default::default(); fleet.pools.len()],
            gang_index: gang::GangIndex::new(&fleet),
            gangs: HashMap::new(),
            tie_rank: None,
            pool_models: fleet
                .pools
                .iter()
                .map(|p| {
                    let mut by_model: Vec<(ModelId, Vec<u32>)> = Vec::new();
                    for n in p.nodes.clone() {
                        let m = fleet.nodes[n as usize].model;
                        match by_model.iter_mut().find(|(x, _)| *x == m) {
                            Some((_, v)) => v.push(n),
                            None => by_model.push((m, vec![n])),
                        }
                    }
                    by_model
                })
                .collect(),
            fleet,
        };
        let slots = e.fleet.max_gpus_per_node(None) as usize + 1;
        e.by_free = e
            .fleet
            .pools
            .iter()
            .map(|p| {
                if p.sharing == Sharing::Whole {
                    vec![BTreeSet::new(); slots]
                } else {
                    Vec::new()
                }
            })
            .collect();
        for n in 0..e.fleet.nodes.len() as u32 {
            e.index(n, u16::MAX);
        }
        if e.policy.ties_in_fixed_order() {
            use rand::seq::SliceRandom;
            let mut rank: Vec<u32> = (0..e.fleet.nodes.len() as u32).collect();
            rank.shuffle(&mut e.rng);
            e.tie_rank = Some(Arc::new(rank));
        }
        e
    }

    pub fn fleet(&self) -> &Arc<Fleet> {
        &self.fleet
    }

    /// An independent copy with the same state, fences, MIG layouts and policy model (its
    /// score cache starts empty): [`Engine::plan`] on it answers as this engine would now,
    /// without touching this one. Costs one pass over the fleet's state.
    pub fn copy(&self) -> Engine {
        Engine {
            fleet: self.fleet.clone(),
            state: self.state.clone(),
            policy: self.policy.boxed_clone(),
            rng: self.rng.clone(),
            mig_tables: self.mig_tables.clone(),
            by_free: self.by_free.clone(),
            mig_index: self.mig_index.clone(),
            mig_mode: self.mig_mode,
            layout_index: self.layout_index.clone(),
            binding: self.binding,
            released_unbound: self.released_unbound.clone(),
            cache: ScoreCache::default(),
            blocked: self.blocked.clone(),
            fenced_nodes: self.fenced_nodes.clone(),
            fenced_gpus: self.fenced_gpus.clone(),
            mig_off: self.mig_off.clone(),
            mig_pending: self.mig_pending.clone(),
            next_epoch: self.next_epoch,
            scratch: Vec::new(),
            freed: self.freed.clone(),
            pool_models: self.pool_models.clone(),
            node_free: self.node_free.clone(),
            changes: vec![Default::default(); self.fleet.pools.len()],
            gang_index: self.gang_index.clone(),
            gangs: self.gangs.clone(),
            tie_rank: self.tie_rank.clone(),
        }
    }

    pub fn state(&self) -> &ClusterState {
        &self.state
    }

    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    pub fn allocation(&self, id: AllocId) -> Option<&Allocation> {
        self.state.allocations.get(&id)
    }

    /// Lets the policy learn from a request without placing it.
    pub fn observe(&mut self, req: &Request) {
        if let Some(d) = demand_of(req) {
            self.policy.observe(&d);
        }
    }

    /// Decides where `req` would go, without changing the state.
    pub fn plan(&mut self, req: &Request) -> Result<Placement, Unplaceable> {
        if let Err(e) = req.check() {
            return Err(Unplaceable::invalid(&e));
        }
        let scope = self.scope(req)?;
        for &pool in &scope {
            if let Some(p) = self.choose_in_pool(pool, req) {
                return Ok(p);
            }
        }
        Err(self.diagnose(req, &scope))
    }

    /// Where `req` would go, without changing the state, or `None` (no diagnosis: see
    /// [`Engine::explain`]). `req` must be valid ([`Engine::constraint`] says so).
    pub fn find(&mut self, req: &Request) -> Option<Placement> {
        let scope = self.scope(req).ok()?;
        scope.into_iter().find_map(|pool| self.choose_in_pool(pool, req))
    }

    /// A counter of `pool` that moves whenever capacity there may have grown. A request
    /// [`Engine::find`] found no room for in the pool, with no node blocked, finds none while
    /// the counter stays the same.
    pub fn freed_generation(&self, pool: PoolId) -> u64 {
        self.freed.get(pool.0 as usize).copied().unwrap_or(0)
    }

    /// Every pool's [freed generation](Engine::freed_generation), in pool order.
    pub fn freed_generations(&self) -> Vec<u64> {
        self.freed.clone()
    }

    /// Puts back freed generations taken with [`Engine::freed_generations`]: only right when
    /// the state is exactly as it was then (a trial fully rolled back).
    pub fn reset_freed_generations(&mut self, freed: &[u64]) {
        if freed.len() == self.freed.len() {
            self.freed.copy_from_slice(freed);
        }
    }

    /// Whether nodes are held back from placement ([`Engine::set_blocked`]).
    pub fn blocking(&self) -> bool {
        !self.blocked.is_empty()
    }

    /// Capacity on node `n` may have grown.
    fn freed_on(&mut self, n: u32) {
        if let Some(node) = self.fleet.nodes.get(n as usize)
            && let Some(g) = self.freed.get_mut(node.pool.0 as usize)
        {
            *g += 1;
        }
    }

    /// Decides and commits in one step (observing the request first), or says why not.
    pub fn place(&mut self, id: AllocId, req: &Request) -> Result<&Allocation, Unplaceable> {
        self.observe(req);
        let p = self.plan(req)?;
        Ok(self.commit(id, req, p).expect("a fresh plan always commits"))
    }

    /// Like [`Engine::place`] but without the diagnosis on failure (for replays).
    pub fn try_place(&mut self, id: AllocId, req: &Request) -> bool {
        self.observe(req);
        let Ok(scope) = self.scope(req) else {
            return false;
        };
        for &pool in &scope {
            if let Some(p) = self.choose_in_pool(pool, req) {
                self.commit(id, req, p).expect("a fresh plan always commits");
                return true;
            }
        }
        false
    }

    /// Commits a placement (from [`Engine::plan`], or restored from a store). Fails, changing
    /// nothing, if the id is taken or the placement does not fit the current state.
    pub fn commit(&mut self, id: AllocId, req: &Request, p: Placement) -> Result<&Allocation, CommitError> {
        let how = Booking::Commit { relayout: p.relayout };
        let alloc = Allocation {
            id,
            node: p.node,
            grant: p.grant,
            cpu_milli: req.cpu_milli,
            memory_mib: req.memory_mib,
            tenant: req.tenant,
            units: p.units,
        };
        self.book(alloc, how)
    }

    /// Re-applies a known allocation (e.g. from the store at start-up), checking it fits. A
    /// restored allocation is bound (its devices are the ones the backend runs it on), and in
    /// `WholeGpu` mode its MIG instance joins the GPU's layout.
    pub fn restore(&mut self, alloc: Allocation) -> Result<&Allocation, CommitError> {
        self.book(alloc, Booking::Restore)
    }

    fn book(&mut self, alloc: Allocation, how: Booking) -> Result<&Allocation, CommitError> {
        if self.state.allocations.contains_key(&alloc.id) {
            return Err(CommitError(format!("allocation {} already exists", alloc.id)));
        }
        self.check_fits(&alloc, how)?;
        let id = alloc.id;
        self.apply(&alloc, true);
        self.state.allocations.insert(id, alloc);
        match how {
            Booking::Commit { .. } => {
                self.released_unbound.clear();
                if self.binding == DeviceBinding::PerNodeCount {
                    self.state.unbound.insert(id);
                }
            }
            Booking::Rebind => {}
            Booking::Restore => {
                if let Some(i) = self.released_unbound.iter().position(|&r| r == id) {
                    self.released_unbound.swap_remove(i);
                    self.state.unbound.insert(id);
                }
            }
        }
        Ok(&self.state.allocations[&id])
    }

    /// Returns an allocation's capacity exactly. In `WholeGpu` mode its MIG instance stays
    /// configured, free for the next request of its profile.
    pub fn release(&mut self, id: AllocId) -> Option<Allocation> {
        let alloc = self.state.allocations.remove(&id)?;
        self.apply(&alloc, false);
        if !self.state.unbound.is_empty() && self.state.unbound.remove(&id) {
            self.released_unbound.push(id);
        }
        Some(alloc)
    }

    // ----- scope and diagnosis -------------------------------------------------------------

    /// The pools a request may go to, in the order they are tried (a request naming a pool
    /// gets just that one), or why none can serve its shape.
    pub fn scope(&self, req: &Request) -> Result<Vec<PoolId>, Unplaceable> {
        let fits = |pool: PoolId| self.serves(req, pool);
        if let Some(pool) = req.pool {
            let p = self.fleet.pool(pool);
            if !fits(pool) {
                return Err(Unplaceable::PoolCannotServe {
                    pool: p.name.clone(),
                    sharing: p.sharing,
                    shape: shape_label(&req.shape),
                });
            }
            return Ok(vec![pool]);
        }
        // Whole GPUs: dedicated pools first, then shared ones.
        let mut pools: Vec<PoolId> = (0..self.fleet.pools.len() as u16)
            .map(PoolId)
            .filter(|&p| fits(p))
            .collect();
        pools.sort_by_key(|&p| match self.fleet.pool(p).sharing {
            Sharing::Whole => 0,
            Sharing::Mig => 1,
            Sharing::Shared => 2,
        });
        if pools.is_empty() {
            return Err(Unplaceable::NoPoolServes {
                shape: shape_label(&req.shape),
            });
        }
        Ok(pools)
    }

    /// Whether pool `pool`'s sharing mode can serve `req`'s shape (a whole GPU from a MIG
    /// pool only where a GPU there has MIG off).
    fn serves(&self, req: &Request, pool: PoolId) -> bool {
        match (&req.shape, self.fleet.pool(pool).sharing) {
            (Shape::Whole { .. }, s) => match s {
                Sharing::Whole => true,
                Sharing::Shared => self.fleet.pool(pool).whole_gpus,
                Sharing::Mig => self.pool_has_mig_off(pool),
            },
            (Shape::Mig(_), s) => s == Sharing::Mig,
            (Shape::Fraction { .. }, s) => s == Sharing::Shared,
            (Shape::CpuOnly, _) => true,
        }
    }

    /// Every pool of the fleet that cannot serve `req`'s shape, and why
    /// ([`Unplaceable::PoolCannotServe`]), whichever pool the request names: what a person
    /// reads beside a waiting request to know where else not to look.
    pub fn pools_not_serving(&self, req: &Request) -> Vec<Unplaceable> {
        (0..self.fleet.pools.len() as u16)
            .map(PoolId)
            .filter(|&p| !self.serves(req, p))
            .map(|p| {
                let pool = self.fleet.pool(p);
                Unplaceable::PoolCannotServe {
                    pool: pool.name.clone(),
                    sharing: pool.sharing,
                    shape: shape_label(&req.shape),
                }
            })
            .collect()
    }

    /// Why no node could ever hold `req` (whatever else runs), if that is so: an invalid
    /// shape, no pool that serves it, or no eligible node large enough. Cheap (no placement is
    /// searched): the scheduler checks every submission with it.
    pub fn constraint(&self, req: &Request) -> Option<Unplaceable> {
        if let Err(e) = req.check() {
            return Some(Unplaceable::invalid(&e));
        }
        match self.scope(req) {
            Err(u) => Some(u),
            Ok(scope) => self.constraint_in(req, &scope, &self.eligible(req, &scope)),
        }
    }

    /// Why `req` cannot be placed now, as [`Engine::plan`] would say when it fails (the caller
    /// knows that it does: nothing is searched).
    pub fn explain(&self, req: &Request) -> Unplaceable {
        match (req.check(), self.scope(req)) {
            (Ok(_), Ok(scope)) => self.diagnose(req, &scope),
            _ => self
                .constraint(req)
                .expect("an invalid request, or one no pool serves, is a constraint"),
        }
    }

    fn diagnose(&self, req: &Request, scope: &[PoolId]) -> Unplaceable {
        let eligible = self.eligible(req, scope);
        if let Some(u) = self.constraint_in(req, scope, &eligible) {
            return u;
        }
        self.diagnose_capacity(req, scope, &eligible)
    }

    /// The nodes of `scope` whose model `req` may use.
    fn eligible(&self, req: &Request, scope: &[PoolId]) -> Vec<u32> {
        let mut out = Vec::new();
        for &p in scope {
            for (model, nodes) in &self.pool_models[p.0 as usize] {
                let allowed = req.allows_model(*model)
                    && match &req.shape {
                        Shape::Mig(c) => c.options.iter().any(|o| o.0 == *model),
                        _ => true,
                    };
                if allowed {
                    out.extend_from_slice(nodes);
                }
            }
        }
        out
    }

    /// The pools a reason names: those of `scope` with a node in `eligible`, or all of `scope`
    /// when no node is eligible (a request for an H100 is not told about the L40S pool).
    fn reason_pools(&self, scope: &[PoolId], eligible: &[u32]) -> Pools {
        let fleet = &*self.fleet;
        let named = |p: PoolId| eligible.is_empty() || eligible.iter().any(|&n| fleet.nodes[n as usize].pool == p);
        Pools(
            scope
                .iter()
                .filter(|&&p| named(p))
                .map(|&p| fleet.pool(p).name.clone())
                .collect(),
        )
    }

    fn constraint_in(&self, req: &Request, scope: &[PoolId], eligible: &[u32]) -> Option<Unplaceable> {
        let fleet = &*self.fleet;
        let pools = self.reason_pools(scope, eligible);
        let shape = shape_label(&req.shape);
        if eligible.is_empty() {
            let missing = match &req.shape {
                Shape::Mig(c) => Missing::MigProfile(c.name.clone()),
                _ => Missing::AllowedModel,
            };
            return Some(Unplaceable::NoEligibleNode { pools, missing, shape });
        }
        let could_ever = |n: u32| -> bool {
            let node = &fleet.nodes[n as usize];
            if req.cpu_milli > node.cpu_milli || req.memory_mib > node.memory_mib {
                return false;
            }
            match &req.shape {
                Shape::Whole { gpus } => {
                    let domain = node
                        .topology
                        .domains(node.gpus)
                        .iter()
                        .map(|d| d.count_ones())
                        .max()
                        .unwrap_or(0);
                    *gpus as u32
                        <= if node.topology == Topology::None {
                            node.gpus as u32
                        } else {
                            domain
                        }
                }
                Shape::Fraction { memory_mib, .. } => {
                    let m = fleet.catalogue.get(node.model).memory_mib;
                    node.gpus > 0 && (m == 0 || memory_mib.unwrap_or(0) <= m)
                }
                Shape::Mig(_) | Shape::CpuOnly => true,
            }
        };
        if !eligible.iter().any(|&n| could_ever(n)) {
            let max_cpu = eligible
                .iter()
                .map(|&n| fleet.nodes[n as usize].cpu_milli)
                .max()
                .unwrap_or(0);
            let max_mem = eligible
                .iter()
                .map(|&n| fleet.nodes[n as usize].memory_mib)
                .max()
                .unwrap_or(0);
            return Some(if req.cpu_milli > max_cpu {
                Unplaceable::CpuBeyondNodes {
                    pools,
                    requested_milli: req.cpu_milli,
                    largest_milli: max_cpu,
                }
            } else if req.memory_mib > max_mem {
                Unplaceable::MemoryBeyondNodes {
                    pools,
                    requested_mib: req.memory_mib,
                    largest_mib: max_mem,
                }
            } else if let Shape::Whole { gpus } = req.shape {
                let largest = eligible
                    .iter()
                    .map(|&n| {
                        let node = &fleet.nodes[n as usize];
                        if node.topology == Topology::None {
                            node.gpus as u32
                        } else {
                            node.topology
                                .domains(node.gpus)
                                .iter()
                                .map(|d| d.count_ones())
                                .max()
                                .unwrap_or(0)
                        }
                    })
                    .max()
                    .unwrap_or(0);
                Unplaceable::GangBeyondDomain { pools, gpus, largest }
            } else {
                Unplaceable::ShapeBeyondNodes { pools, shape }
            });
        }
        None
    }

    fn diagnose_capacity(&self, req: &Request, scope: &[PoolId], eligible: &[u32]) -> Unplaceable {
        let fleet = &*self.fleet;
        let pools = self.reason_pools(scope, eligible);
        let shape = shape_label(&req.shape);
        // Would it fit if tenants could mix?
        if let (Some(d), Shape::Fraction { .. }) = (demand_of(req), &req.shape) {
            let mut buf = Vec::new();
            let blocked = eligible.iter().any(|&n| {
                let st = &self.state.nodes[n as usize];
                buf.clear();
                if st.cpu_free >= d.cpu_milli && st.mem_free >= d.memory_mib {
                    fraction_choices(fleet, n, st, &d, true, &mut buf);
                }
                !buf.is_empty()
            });
            if blocked {
                return Unplaceable::Isolation { pools, shape };
            }
        }
        let need = req.units(&fleet.catalogue);
        let free = GpuUnits::milli(eligible.iter().map(|&n| self.node_free[n as usize]).sum());
        if free >= need && need > GpuUnits::ZERO {
            Unplaceable::Fragmentation {
                pools,
                shape,
                free,
                need,
            }
        } else {
            Unplaceable::NoCapacity {
                pools,
                shape,
                free,
                need,
            }
        }
    }

    // ----- choosing --------------------------------------------------------------------------

    fn choose_in_pool(&mut self, pool: PoolId, req: &Request) -> Option<Placement> {
        match (self.fleet.pool(pool).sharing, &req.shape) {
            (Sharing::Whole, Shape::Whole { gpus }) => self.choose_whole(pool, req, *gpus),
            (Sharing::Mig, Shape::Whole { gpus }) => self.choose_whole_mig_off(pool, req, *gpus),
            (Sharing::Mig, Shape::Mig(c)) => self.choose_mig(pool, req, c),
            (Sharing::Whole | Sharing::Mig, Shape::CpuOnly) => self.choose_host(pool, req),
            (Sharing::Shared, _) => self.choose_shared(pool, req),
            _ => None,
        }
    }

    /// The nodes held back from every placement ([`Engine::set_blocked`]).
    pub fn blocked(&self) -> &rustc_hash::FxHashSet<u32> {
        &self.blocked
    }

    /// Holds nodes back from every placement until changed (backfill reservations).
    pub fn set_blocked(&mut self, nodes: rustc_hash::FxHashSet<u32>) {
        if nodes != self.blocked {
            // A new generation (see `generation`); no node's epoch needs to change.
            self.next_epoch += 1;
        }
        self.blocked = nodes;
    }

    /// Changes whenever anything a placement depends on changes (a node's state, fences, MIG
    /// modes and layouts, reservations): a copy of an equal generation answers as this engine.
    pub fn generation(&self) -> u64 {
        self.next_epoch
    }

    /// Takes node `n` out of placement (`fenced`) or back in: a cordoned, draining or
    /// maintenance node gets no new placement from the next plan on; allocations on it stay.
    pub fn fence_node(&mut self, n: u32, fenced: bool) {
        let changed = if fenced {
            self.fenced_nodes.insert(n)
        } else {
            self.fenced_nodes.remove(&n)
        };
        if changed {
            self.touch(n);
        }
    }

    /// Takes GPU `gpu` of node `n` out of placement (an unhealthy GPU) or back in; allocations
    /// on it stay.
    pub fn fence_gpu(&mut self, n: u32, gpu: u8, fenced: bool) {
        if gpu >= 16 || n as usize >= self.fleet.nodes.len() {
            return;
        }
        if set_gpu_bit(&mut self.fenced_gpus, n, gpu, fenced) {
            self.touch(n);
        }
    }

    /// Takes GPU `gpu` of node `n` (a mig pool, `Instance` mode) out of MIG mode (`enabled:
    /// false`: it serves whole GPUs) or back into it; only while the GPU holds nothing.
    pub fn set_gpu_mig(&mut self, n: u32, gpu: u8, enabled: bool) -> Result<(), CommitError> {
        self.mig_switchable(n, gpu)?;
        let st = &self.state.nodes[n as usize];
        if !st.gpus[gpu as usize].holders.is_empty() {
            return Err(CommitError(format!(
                "GPU {gpu} of {} holds {} allocation(s)",
                self.fleet.nodes[n as usize].name,
                st.gpus[gpu as usize].holders.len()
            )));
        }
        set_gpu_bit(&mut self.mig_off, n, gpu, !enabled);
        self.touch(n);
        Ok(())
    }

    /// Why GPU `gpu` of node `n` cannot change MIG mode in the engine, if it cannot: not a GPU,
    /// not in a mig pool, a model without MIG, or GPUs laid out as a whole.
    pub fn mig_switchable(&self, n: u32, gpu: u8) -> Result<(), CommitError> {
        let Some(node) = self.fleet.nodes.get(n as usize) else {
            return Err(CommitError(format!("node #{n} does not exist")));
        };
        if gpu >= node.gpus {
            return Err(CommitError(format!("{} has no GPU {gpu}", node.name)));
        }
        let model = self.fleet.catalogue.get(node.model);
        if model.mig.is_none() {
            return Err(CommitError(format!("{} GPUs have no MIG", model.name)));
        }
        let pool = self.fleet.pool(node.pool);
        if pool.sharing != Sharing::Mig {
            return Err(CommitError(format!(
                "pool {} serves {} GPUs; MIG mode is per GPU only in mig pools",
                pool.name,
                match pool.sharing {
                    Sharing::Shared => "shared",
                    _ => "whole",
                }
            )));
        }
        if self.mig_mode != crate::mig::MigMode::Instance {
            return Err(CommitError(
                "GPUs laid out as a whole follow their configured layout; MIG mode is not switched per GPU".into(),
            ));
        }
        Ok(())
    }

    /// Marks GPU `gpu` of node `n` as waiting for a reset to apply a MIG mode change (out of
    /// placement while set).
    pub fn set_gpu_mig_pending(&mut self, n: u32, gpu: u8, pending: bool) {
        if gpu >= 16 || n as usize >= self.fleet.nodes.len() {
            return;
        }
        set_gpu_bit(&mut self.mig_pending, n, gpu, pending);
        self.touch(n);
    }

    /// The GPUs of node `n` out of MIG mode (mig pools), as a mask.
    pub fn mig_off_gpus(&self, n: u32) -> u16 {
        self.mig_off.get(&n).copied().unwrap_or(0)
    }

    /// The GPUs of node `n` waiting for a reset to change MIG mode, as a mask.
    pub fn mig_pending_gpus(&self, n: u32) -> u16 {
        self.mig_pending.get(&n).copied().unwrap_or(0)
    }

    fn pool_has_mig_off(&self, pool: PoolId) -> bool {
        self.mig_off.keys().any(|&n| self.fleet.nodes[n as usize].pool == pool)
    }

    /// Whether node `n` is out of placement.
    pub fn node_fenced(&self, n: u32) -> bool {
        self.fenced_nodes.contains(&n)
    }

    /// The GPUs of node `n` out of placement, as a mask.
    pub fn fenced_gpus(&self, n: u32) -> u16 {
        self.fenced_gpus.get(&n).copied().unwrap_or(0)
    }

    /// The GPUs of node `n` no new placement may use: unhealthy or waiting for a reset.
    fn out_gpus(&self, n: u32) -> u16 {
        self.fenced_gpus(n) | self.mig_pending_gpus(n)
    }

    fn gpu_fenced(&self, n: u32, gpu: u8) -> bool {
        self.out_gpus(n) >> gpu & 1 == 1
    }

    /// Bumps a node's epoch so that cached scores of it are recomputed.
    fn touch(&mut self, n: u32) {
        if (n as usize) < self.state.nodes.len() {
            self.stamp(n);
        }
        self.freed_on(n);
    }

    /// Gives node `n` a new epoch (its cached scores are recomputed) and logs the change for
    /// the score trees of its pool if it is shared.
    fn stamp(&mut self, n: u32) {
        self.state.nodes[n as usize].epoch = self.next_epoch;
        self.next_epoch += 1;
        let pool = self.fleet.nodes[n as usize].pool;
        let p = self.fleet.pool(pool);
        if p.sharing == Sharing::Shared {
            let cap = 4 * p.nodes.len().max(256);
            self.changes[pool.0 as usize].push(n, cap);
        }
    }

    fn host_fits(&self, n: u32, req: &Request) -> bool {
        if self.blocked.contains(&n) || self.fenced_nodes.contains(&n) {
            return false;
        }
        let st = &self.state.nodes[n as usize];
        st.cpu_free >= req.cpu_milli
            && st.mem_free >= req.memory_mib
            && req.allows_model(self.fleet.nodes[n as usize].model)
    }

    fn choose_host(&mut self, pool: PoolId, req: &Request) -> Option<Placement> {
        self.fleet
            .pool(pool)
            .nodes
            .clone()
            .find(|&n| self.host_fits(n, req))
            .map(|n| Placement {
                node: NodeId(n),
                grant: Grant::CpuOnly,
                units: GpuUnits::ZERO,
                relayout: false,
            })
    }

    fn choose_whole(&mut self, pool: PoolId, req: &Request, gpus: u8) -> Option<Placement> {
        let buckets = &self.by_free[pool.0 as usize];
        for bucket in buckets.iter().skip(gpus as usize) {
            for &n in bucket {
                if !self.host_fits(n, req) {
                    continue;
                }
                let node = &self.fleet.nodes[n as usize];
                let free = self.state.nodes[n as usize].free_mask & !self.out_gpus(n);
                if let Some(mask) = whole_choice(node.topology, node.gpus, free, gpus) {
                    return Some(Placement {
                        node: NodeId(n),
                        grant: Grant::Whole { gpus: mask },
                        units: GpuUnits::whole(gpus as u64),
                        relayout: false,
                    });
                }
            }
        }
        None
    }

    /// Whole GPUs in a mig pool: only the GPUs an admin took out of MIG mode, best fit by node.
    fn choose_whole_mig_off(&mut self, pool: PoolId, req: &Request, gpus: u8) -> Option<Placement> {
        let mut best: Option<(u32, u32, u16)> = None;
        for (&n, &off) in &self.mig_off {
            let node = &self.fleet.nodes[n as usize];
            if node.pool != pool || !self.host_fits(n, req) {
                continue;
            }
            let free = self.state.nodes[n as usize].free_mask & off & !self.out_gpus(n);
            if let Some(mask) = whole_choice(node.topology, node.gpus, free, gpus) {
                let key = (free.count_ones(), n);
                if best.is_none_or(|(f, b, _)| key < (f, b)) {
                    best = Some((key.0, n, mask));
                }
            }
        }
        best.map(|(_, n, mask)| Placement {
            node: NodeId(n),
            grant: Grant::Whole { gpus: mask },
            units: GpuUnits::whole(gpus as u64),
            relayout: false,
        })
    }

    fn choose_mig(&mut self, pool: PoolId, req: &Request, choice: &MigChoice) -> Option<Placement> {
        if self.mig_mode == crate::mig::MigMode::WholeGpu {
            return self.choose_mig_whole_gpu(pool, req, choice);
        }
        // (cost, model, profile index, occupancy key, start)
        let mut cands: Vec<(u32, u16, u8, usize, u8)> = Vec::new();
        for &(model, pi) in &choice.options {
            if !req.allows_model(model) {
                continue;
            }
            let Some(index) = self.mig_index.get(&(pool.0, model.0)) else {
                continue;
            };
            let table = self.mig_tables[model.0 as usize]
                .as_ref()
                .expect("MIG model has a table");
            for (key, bucket) in index.iter().enumerate() {
                if bucket.is_empty() {
                    continue;
                }
                if let Some((start, cost)) = table.best(key, pi as usize) {
                    cands.push((cost, model.0, pi, key, start));
                }
            }
        }
        cands.sort_unstable();
        for (_, model, pi, key, start) in cands {
            let bucket = &self.mig_index[&(pool.0, model)][key];
            for &(n, g) in bucket {
                if !self.host_fits(n, req) || self.gpu_fenced(n, g) || self.mig_off_gpus(n) >> g & 1 == 1 {
                    continue;
                }
                let gm = self.fleet.catalogue.get(tessera_model::ModelId(model));
                let p = &gm.mig.expect("MIG model").profiles[pi as usize];
                return Some(Placement {
                    node: NodeId(n),
                    grant: Grant::Mig {
                        gpu: g,
                        profile: pi,
                        profile_id: p.id,
                        start,
                        size: p.mem_slices,
                    },
                    units: gm.profile_units(p),
                    relayout: false,
                });
            }
        }
        None
    }

    fn choose_shared(&mut self, pool: PoolId, req: &Request) -> Option<Placement> {
        let d = demand_of(req)?;
        let fleet = self.fleet.clone();
        let pool_def = fleet.pool(pool);
        let mix = pool_def.allow_tenant_mixing;
        let node_iso = !mix && self.binding == DeviceBinding::PerNodeCount;
        let policy_epoch = self.policy.epoch();
        let type_id = match self.cache.types.get(&d) {
            Some(&t) => Some(t as usize),
            None if self.cache.types.len() < MAX_CACHED_TYPES => {
                let t = self.cache.types.len();
                self.cache.types.insert(d, t as u32);
                self.cache.entries.push(vec![(u64::MAX, 0, None); fleet.nodes.len()]);
                Some(t)
            }
            None => None,
        };
        let on = SharedDemand {
            req,
            d: &d,
            mix,
            node_iso,
            policy_epoch,
            type_id,
        };
        let mut scratch = std::mem::take(&mut self.scratch);
        // A demand type's tree stands for every request of that type only where the type's
        // model mask says exactly which models the request allows (ids below 64).
        let indexed =
            type_id.is_some() && req.models.iter().all(|m| m.0 < 64) && pool_def.nodes.len() >= MIN_TREE_NODES;
        let best = match indexed {
            true => self.shared_best_indexed(pool, &on, &mut scratch),
            false => None,
        };
        let best = match best {
            Some(b) => b,
            None => self.shared_best_scan(pool, &on, &mut scratch),
        };
        self.scratch = scratch;
        let (n, c, _) = best?;
        let grant = match c {
            Choice::Gpu(g) => Grant::Fraction {
                gpu: g,
                milli: d.milli,
                memory_mib: d.gpu_mem_mib,
            },
            Choice::Gpus(mask) => Grant::Whole { gpus: mask },
            Choice::Host => Grant::CpuOnly,
        };
        Some(Placement {
            node: NodeId(n),
            grant,
            units: GpuUnits::milli(d.total_milli()),
            relayout: false,
        })
    }

    /// The best choice for a shared demand on node `n`, as the policy scores it (cached per
    /// node epoch), or `None` if it cannot go there. Nodes held back (blocked, fenced) are the
    /// caller's to skip.
    fn shared_node_best(
        &mut self,
        n: u32,
        on: &SharedDemand<'_>,
        scratch: &mut Vec<Choice>,
    ) -> Option<(Choice, Score)> {
        let d = on.d;
        let fenced = self.fenced_gpus(n);
        let fleet = &*self.fleet;
        let node = &fleet.nodes[n as usize];
        let st = &self.state.nodes[n as usize];
        if st.cpu_free < d.cpu_milli || st.mem_free < d.memory_mib || !on.req.allows_model(node.model) {
            return None;
        }
        if on.node_iso && d.gpus == 1 && d.milli < 1000 && other_tenant_on(st, d.tenant) {
            return None;
        }
        if let Some(t) = on.type_id {
            let e = &self.cache.entries[t][n as usize];
            if e.0 == st.epoch && e.1 == on.policy_epoch {
                return e.2;
            }
        }
        scratch.clear();
        choices(fleet, n, st, d, on.mix, fenced, scratch);
        let view = NodeView { node, state: st };
        let mut nb: Option<(Choice, Score)> = None;
        for &c in scratch.iter() {
            let mut s = self.policy.score(&view, d, c);
            // Where tenants may not share a GPU, a tenant's fractions fill the GPUs
            // it already holds before opening new ones: space left on its own GPUs
            // is unusable by anyone else.
            // With one tenant per node, opening a node is what costs.
            if !on.mix
                && let Choice::Gpu(g) = c
                && if on.node_iso {
                    st.gpus.iter().all(|g| g.holders.is_empty())
                } else {
                    st.gpus[g as usize].holders.is_empty()
                }
            {
                s.0 += OPEN_GPU_PENALTY;
            }
            if nb.is_none_or(|(_, b)| s.0 < b.0 || (s.0 == b.0 && s.1 < b.1)) {
                nb = Some((c, s));
            }
        }
        if let Some(t) = on.type_id {
            self.cache.entries[t][n as usize] = (st.epoch, on.policy_epoch, nb);
        }
        nb
    }

    /// The node of `pool` with the lowest primary score for the demand, exact ties broken at
    /// random by reservoir sampling in node order: every node is read.
    fn shared_best_scan(
        &mut self,
        pool: PoolId,
        on: &SharedDemand<'_>,
        scratch: &mut Vec<Choice>,
    ) -> Option<(u32, Choice, f64)> {
        let mut best: Option<(u32, Choice, f64)> = None;
        let mut ties = 0u32;
        for n in self.fleet.pool(pool).nodes.clone() {
            if self.blocked.contains(&n) || self.fenced_nodes.contains(&n) {
                continue;
            }
            let Some((c, s)) = self.shared_node_best(n, on, scratch) else {
                continue;
            };
            self.tie_break(&mut best, &mut ties, n, c, s.0);
        }
        best
    }

    /// Reservoir sampling of the lowest score: node `n` scoring `s` against the best so far
    /// (nodes come in fleet order); with a fixed tie order, the node of lower rank.
    fn tie_break(&mut self, best: &mut Option<(u32, Choice, f64)>, ties: &mut u32, n: u32, c: Choice, s: f64) {
        match *best {
            Some((_, _, b)) if s > b => {}
            Some((m, _, b)) if s == b => {
                if let Some(rank) = &self.tie_rank {
                    if rank[n as usize] < rank[m as usize] {
                        *best = Some((n, c, s));
                    }
                    return;
                }
                *ties += 1;
                if self.rng.random_range(0..*ties) == 0 {
                    *best = Some((n, c, s));
                }
            }
            _ => {
                *best = Some((n, c, s));
                *ties = 1;
            }
        }
    }

    /// The same answer as [`Engine::shared_best_scan`] (the same random draws), reading only
    /// the nodes that can win from the demand type's [score tree](shared_index), brought up to
    /// date first. `None` (outer) where no tree can stand for the scan: too many trees, or a
    /// score that is not a finite number.
    fn shared_best_indexed(
        &mut self,
        pool: PoolId,
        on: &SharedDemand<'_>,
        scratch: &mut Vec<Choice>,
    ) -> Option<Option<(u32, Choice, f64)>> {
        let t = on.type_id? as u32;
        let nodes = self.fleet.pool(pool).nodes.clone();
        let key = (t, pool.0);
        let log_end = self.changes[pool.0 as usize].end();
        let mut tree = self.cache.trees.remove(&key);
        let current = tree.as_ref().is_some_and(|tr| {
            tr.policy_epoch == on.policy_epoch
                && tr.node_iso == on.node_iso
                && self.changes[pool.0 as usize].since(tr.seen).is_some()
        });
        if !current {
            if tree.is_none() && self.cache.trees.len() >= MAX_SCORE_TREES {
                return None;
            }
            let mut fresh = shared_index::ScoreTree::new(nodes.len(), log_end, on.policy_epoch, on.node_iso);
            for (i, n) in nodes.clone().enumerate() {
                let b = self.shared_node_best(n, on, scratch);
                if b.is_some_and(|b| !b.1.0.is_finite()) {
                    return None;
                }
                fresh.init(i, b.map(|(c, s)| (c, s.0)));
            }
            fresh.build();
            tree = Some(fresh);
        } else if let Some(tr) = tree.as_mut() {
            for seq in tr.seen..log_end {
                let n = self.changes[pool.0 as usize].at(seq).expect("checked above");
                let b = self.shared_node_best(n, on, scratch);
                if b.is_some_and(|b| !b.1.0.is_finite()) {
                    return None;
                }
                tr.set((n - nodes.start) as usize, b.map(|(c, s)| (c, s.0)));
            }
            tr.seen = log_end;
        }
        let tree = tree.expect("built or brought up to date");
        let mut best: Option<(u32, Choice, f64)> = None;
        let mut ties = 0u32;
        let mut from = 0;
        while let Some(i) = tree.first(from, best.map_or(f64::MAX, |b| b.2)) {
            from = i + 1;
            let n = nodes.start + i as u32;
            if self.blocked.contains(&n) || self.fenced_nodes.contains(&n) {
                continue;
            }
            let (c, s) = tree.get(i).expect("a node scoring at most a finite bound has a choice");
            self.tie_break(&mut best, &mut ties, n, c, s);
        }
        self.cache.trees.insert(key, tree);
        Some(best)
    }

    // ----- applying --------------------------------------------------------------------------

    fn check_fits(&self, a: &Allocation, how: Booking) -> Result<(), CommitError> {
        let fleet = &*self.fleet;
        let n = a.node.0 as usize;
        let (Some(node), Some(st)) = (fleet.nodes.get(n), self.state.nodes.get(n)) else {
            return Err(CommitError(format!("node #{n} does not exist")));
        };
        let bad = |m: &str| Err(CommitError(format!("allocation {} on {}: {m}", a.id, node.name)));
        if st.cpu_free < a.cpu_milli || st.mem_free < a.memory_mib {
            return bad("not enough host CPU or memory");
        }
        let sharing = fleet.pool(node.pool).sharing;
        match a.grant {
            Grant::Whole { gpus } => {
                let off = if sharing == Sharing::Mig {
                    self.mig_off_gpus(a.node.0)
                } else {
                    u16::MAX
                };
                if gpus & !off != 0 || gpus == 0 || gpus & !st.free_mask != 0 {
                    return bad("GPUs are not free");
                }
            }
            Grant::Mig {
                gpu, profile, start, ..
            } => {
                let Some(geom) = fleet.catalogue.get(node.model).mig.filter(|_| sharing == Sharing::Mig) else {
                    return bad("not a MIG pool");
                };
                let Some(g) = st.gpus.get(gpu as usize) else {
                    return bad("no such GPU");
                };
                if self.mig_off_gpus(a.node.0) >> gpu & 1 == 1 {
                    return bad("the GPU is out of MIG mode");
                }
                let Some(p) = geom.profiles.get(profile as usize) else {
                    return bad("no such profile");
                };
                if !p.starts.contains(&start) || p.mask_at(start) & g.mig_mask != 0 || (p.media_extensions && g.mig_me)
                {
                    return bad("MIG placement overlaps or is illegal");
                }
                if self.mig_mode == crate::mig::MigMode::WholeGpu {
                    if let Err(m) = whole_gpu::check_layout(g, profile, start, how) {
                        return bad(m);
                    }
                } else if how == (Booking::Commit { relayout: true }) {
                    return bad("the placement lays out the GPU anew, but instances are created one at a time");
                }
            }
            Grant::Fraction { gpu, milli, memory_mib } => {
                let Some(g) = st.gpus.get(gpu as usize) else {
                    return bad("no such GPU");
                };
                let mem = fleet.catalogue.get(node.model).memory_mib;
                let mix = fleet.pool(node.pool).allow_tenant_mixing;
                if sharing != Sharing::Shared
                    || g.used_milli + milli > 1000
                    || (mem > 0 && g.mem_used_mib + memory_mib > mem)
                    || (!mix && !g.holders.is_empty() && g.tenant != a.tenant)
                    || (!mix && self.binding == DeviceBinding::PerNodeCount && other_tenant_on(st, a.tenant))
                {
                    return bad("fraction does not fit the GPU");
                }
            }
            Grant::CpuOnly => {}
        }
        Ok(())
    }

    /// Adds (`add`) or removes an allocation's holdings, keeping the indexes in step. In
    /// `WholeGpu` mode an added MIG instance that is not configured yet joins the GPU's layout
    /// (`check_fits` has made sure that only happens where the layout may change).
    fn apply(&mut self, a: &Allocation, add: bool) {
        let n = a.node.0;
        let touched = a.grant.gpu_mask();
        self.unindex(n, touched);
        let fleet = self.fleet.clone();
        let node = &fleet.nodes[n as usize];
        let st = &mut self.state.nodes[n as usize];
        if add {
            st.cpu_free -= a.cpu_milli;
            st.mem_free -= a.memory_mib;
        } else {
            st.cpu_free += a.cpu_milli;
            st.mem_free += a.memory_mib;
        }
        let hold = |g: &mut crate::state::GpuState| {
            if add {
                g.holders.push(a.id);
            } else if let Some(i) = g.holders.iter().rposition(|&h| h == a.id) {
                g.holders.remove(i);
            }
        };
        match a.grant {
            Grant::Whole { gpus } => {
                for i in 0..node.gpus {
                    if gpus >> i & 1 == 1 {
                        let g = &mut st.gpus[i as usize];
                        g.used_milli = if add { 1000 } else { 0 };
                        g.tenant = if add { a.tenant } else { None };
                        hold(g);
                    }
                }
            }
            Grant::Mig {
                gpu, profile, start, ..
            } => {
                let geom = fleet.catalogue.get(node.model).mig.expect("MIG");
                let p = &geom.profiles[profile as usize];
                let g = &mut st.gpus[gpu as usize];
                let units = a.units.as_milli() as u16;
                if add && self.mig_mode == crate::mig::MigMode::WholeGpu {
                    whole_gpu::configure(geom, g, profile, start);
                }
                if add {
                    g.mig_mask |= p.mask_at(start);
                    g.used_milli += units;
                } else {
                    g.mig_mask &= !p.mask_at(start);
                    g.used_milli -= units;
                }
                if p.media_extensions {
                    g.mig_me = add;
                }
                hold(g);
            }
            Grant::Fraction { gpu, milli, memory_mib } => {
                let g = &mut st.gpus[gpu as usize];
                if add {
                    g.used_milli += milli;
                    g.mem_used_mib += memory_mib;
                    g.tenant = a.tenant;
                } else {
                    g.used_milli -= milli;
                    g.mem_used_mib -= memory_mib;
                }
                hold(g);
                if g.holders.is_empty() {
                    g.tenant = None;
                }
            }
            Grant::CpuOnly => {}
        }
        for i in 0..node.gpus {
            if touched >> i & 1 == 1 {
                if st.gpus[i as usize].holders.is_empty() {
                    st.free_mask |= 1 << i;
                } else {
                    st.free_mask &= !(1 << i);
                }
            }
        }
        self.stamp(n);
        self.index(n, touched);
        // A release frees room; in `WholeGpu` mode a booking may also lay a GPU out anew.
        if !add || self.mig_mode == crate::mig::MigMode::WholeGpu {
            self.freed_on(n);
        }
    }

    fn unindex(&mut self, n: u32, gpus: u16) {
        self.reindex(n, gpus, false);
    }

    fn index(&mut self, n: u32, gpus: u16) {
        self.reindex(n, gpus, true);
    }

    fn reindex(&mut self, n: u32, gpus: u16, insert: bool) {
        let node = &self.fleet.nodes[n as usize];
        let st = &self.state.nodes[n as usize];
        if insert {
            self.node_free[n as usize] = st.gpus.iter().map(|g| g.free_milli() as u64).sum();
        }
        match self.fleet.pool(node.pool).sharing {
            Sharing::Whole => {
                let b = &mut self.by_free[node.pool.0 as usize][st.free_gpus() as usize];
                if insert {
                    b.insert(n);
                } else {
                    b.remove(&n);
                }
                self.gang_index.update(n, st.free_gpus(), insert);
            }
            Sharing::Mig if self.mig_mode == crate::mig::MigMode::WholeGpu => self.reindex_layouts(n, gpus, insert),
            Sharing::Mig => {
                let Some(table) = self.mig_tables[node.model.0 as usize].as_ref() else {
                    return;
                };
                let states = table.states();
                let index = self
                    .mig_index
                    .entry((node.pool.0, node.model.0))
                    .or_insert_with(|| vec![BTreeSet::new(); states]);
                for (i, g) in st.gpus.iter().enumerate() {
                    if gpus >> i & 1 == 1 {
                        let key = state_key(table.geom, g.mig_mask, g.mig_me);
                        if insert {
                            index[key].insert((n, i as u8));
                        } else {
                            index[key].remove(&(n, i as u8));
                        }
                    }
                }
            }
            Sharing::Shared => {}
        }
    }
}

/// A request's shape as reasons name it.
pub fn shape_label(shape: &Shape) -> ShapeLabel {
    let kind = match shape {
        Shape::Whole { .. } => ShapeKind::Whole,
        Shape::Mig(_) => ShapeKind::Mig,
        Shape::Fraction { .. } => ShapeKind::Fraction,
        Shape::CpuOnly => ShapeKind::CpuOnly,
    };
    ShapeLabel {
        kind,
        text: shape.to_string(),
    }
}

/// The shared-pool demand of a request.
pub fn demand_of(req: &Request) -> Option<Demand> {
    let (gpus, milli, gpu_mem) = match req.shape {
        Shape::Whole { gpus } => (gpus, 1000, 0),
        Shape::Fraction { milli, memory_mib } => (1, milli, memory_mib.unwrap_or(0)),
        Shape::CpuOnly => (0, 0, 0),
        Shape::Mig(_) => return None,
    };
    Some(Demand {
        cpu_milli: req.cpu_milli,
        memory_mib: req.memory_mib,
        gpus,
        milli,
        gpu_mem_mib: gpu_mem,
        tenant: req.tenant,
        models: models_mask(&req.models),
    })
}

/// Sets (`on`) or clears bit `gpu` of node `n`'s GPU mask in `masks`, dropping a mask that
/// becomes empty; whether the mask changed.
fn set_gpu_bit(masks: &mut HashMap<u32, u16>, n: u32, gpu: u8, on: bool) -> bool {
    let mask = masks.entry(n).or_default();
    let before = *mask;
    if on {
        *mask |= 1 << gpu;
    } else {
        *mask &= !(1 << gpu);
    }
    let after = *mask;
    if after == 0 {
        masks.remove(&n);
    }
    before != after
}

/// A model whitelist as a bit mask (0 = any). A whitelist naming only models beyond the mask's
/// reach (or unknown ones) keeps a non-zero mask so it never reads as "any".
fn models_mask(models: &[tessera_model::ModelId]) -> u64 {
    let m = models
        .iter()
        .fold(0u64, |m, id| if id.0 < 64 { m | 1 << id.0 } else { m });
    if m == 0 && !models.is_empty() { 1 << 63 } else { m }
}

/// Which whole GPUs a gang of `k` takes on a node with free mask `free`, or `None`.
/// NVSwitch and PCIe-only nodes: the lowest free GPUs. NVLink pairs: `k <= 2` inside one pair;
/// a single GPU prefers a pair whose partner is busy, keeping intact pairs for 2-GPU gangs.
pub fn whole_choice(topology: Topology, gpus: u8, free: u16, k: u8) -> Option<u16> {
    if free.count_ones() < k as u32 || k == 0 {
        return None;
    }
    match topology {
        Topology::NvSwitch | Topology::None => {
            let mut mask = 0u16;
            let mut left = k;
            for i in 0..gpus {
                if left > 0 && free >> i & 1 == 1 {
                    mask |= 1 << i;
                    left -= 1;
                }
            }
            Some(mask)
        }
        Topology::Pairs => {
            let domains = topology.domains(gpus);
            if k == 1 {
                let broken = domains.iter().find(|&&d| d & free != 0 && d & free != d);
                let d = broken.or_else(|| domains.iter().find(|&&d| d & free != 0))?;
                let f = d & free;
                return Some(f & f.wrapping_neg());
            }
            domains
                .iter()
                .find(|&&d| d & free == d && d.count_ones() == k as u32)
                .copied()
        }
    }
}

/// Whether a GPU of the node holds fractions of a tenant other than `tenant`.
fn other_tenant_on(st: &crate::state::NodeState, tenant: Option<TenantId>) -> bool {
    st.gpus.iter().any(|g| !g.holders.is_empty() && g.tenant != tenant)
}

/// Fraction candidates on a node: one per distinct (used milli, GPU memory used) level, the
/// first GPU of each level (GPUs at the same level are interchangeable).
fn fraction_choices(fleet: &Fleet, n: u32, st: &crate::state::NodeState, d: &Demand, mix: bool, out: &mut Vec<Choice>) {
    let node = &fleet.nodes[n as usize];
    let mem = fleet.catalogue.get(node.model).memory_mib;
    let mut seen: [(u16, u32); 16] = [(u16::MAX, 0); 16];
    let mut k = 0;
    for (i, g) in st.gpus.iter().enumerate() {
        if g.used_milli + d.milli > 1000 {
            continue;
        }
        if mem > 0 && d.gpu_mem_mib > 0 && g.mem_used_mib + d.gpu_mem_mib > mem {
            continue;
        }
        if !mix && !g.holders.is_empty() && g.tenant != d.tenant {
            continue;
        }
        let level = (g.used_milli, g.mem_used_mib);
        if seen[..k].contains(&level) {
            continue;
        }
        seen[k] = level;
        k += 1;
        out.push(Choice::Gpu(i as u8));
    }
}

/// Every feasible choice for `d` on node `n` (host resources already checked).
/// `fenced`: GPUs out of placement.
fn choices(
    fleet: &Fleet,
    n: u32,
    st: &crate::state::NodeState,
    d: &Demand,
    mix: bool,
    fenced: u16,
    out: &mut Vec<Choice>,
) {
    if d.gpus == 0 {
        out.push(Choice::Host);
    } else if d.is_fraction() {
        fraction_choices(fleet, n, st, d, mix, out);
        out.retain(|c| !matches!(c, Choice::Gpu(g) if fenced >> g & 1 == 1));
    } else {
        let node = &fleet.nodes[n as usize];
        if let Some(mask) = whole_choice(node.topology, node.gpus, st.free_mask & !fenced, d.gpus) {
            out.push(Choice::Gpus(mask));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::BestFit;
    use crate::reason::Field;
    use tessera_model::{Request, TenantId};

    fn seed_engine() -> Engine {
        Engine::new(Arc::new(Fleet::seed()), Box::new(BestFit), 1)
    }

    #[test]
    fn whole_gangs_best_fit_and_keep_full_nodes() {
        let mut e = seed_engine();
        let a = e.place(1, &Request::whole(1)).unwrap().clone();
        let b = e.place(2, &Request::whole(2)).unwrap().clone();
        assert_eq!(a.node, b.node, "the 2-GPU gang joins the partly used node");
        assert_eq!(a.grant, Grant::Whole { gpus: 0b1 });
        assert_eq!(b.grant, Grant::Whole { gpus: 0b110 });
        let c = e.place(3, &Request::whole(8)).unwrap().clone();
        assert_ne!(c.node, a.node);
        assert_eq!(c.units, GpuUnits::whole(8));
    }

    #[test]
    fn fenced_gpus_and_nodes_get_no_new_placement() {
        let mut e = seed_engine();
        let f = e.fleet().clone();
        let first = e.plan(&Request::whole(1)).unwrap();
        let (n, Grant::Whole { gpus }) = (first.node.0, first.grant.clone()) else {
            panic!("{first:?}")
        };
        let g = gpus.trailing_zeros() as u8;
        e.fence_gpu(n, g, true);
        let p = e.plan(&Request::whole(1)).unwrap();
        assert!(
            p.node.0 != n || !matches!(p.grant, Grant::Whole { gpus } if gpus >> g & 1 == 1),
            "an unhealthy GPU gets no placement: {p:?}"
        );
        // A node with one unhealthy GPU can no longer take an 8-GPU gang.
        let eight = e.plan(&Request::whole(8)).unwrap();
        assert_ne!(eight.node.0, n);
        e.fence_gpu(n, g, false);
        assert_eq!(
            e.plan(&Request::whole(1)).unwrap(),
            first,
            "cleared: the GPU is chosen again"
        );

        // A cordoned node: nothing new, whatever the shape; a fenced MIG GPU: no instance on it.
        let mig = Request::mig(&f.catalogue, "1g.10gb").unwrap();
        let m = e.plan(&mig).unwrap();
        let Grant::Mig { gpu: mg, .. } = m.grant else { panic!() };
        e.fence_gpu(m.node.0, mg, true);
        let m2 = e.plan(&mig).unwrap();
        assert!(
            m2.node != m.node || !matches!(m2.grant, Grant::Mig { gpu, .. } if gpu == mg),
            "{m2:?}"
        );
        e.fence_node(m2.node.0, true);
        assert_ne!(e.plan(&mig).unwrap().node, m2.node);
        let frac = e.plan(&Request::fraction(250)).unwrap();
        e.fence_node(frac.node.0, true);
        assert!(e.node_fenced(frac.node.0));
        assert_ne!(e.plan(&Request::fraction(250)).unwrap().node, frac.node);
        // Every other node of the pool fenced, this one back: only it can take the fraction.
        let pool = f.nodes[frac.node.0 as usize].pool;
        for n in f.pool(pool).nodes.clone() {
            e.fence_node(n, n != frac.node.0);
        }
        assert!(!e.node_fenced(frac.node.0));
        assert_eq!(e.plan(&Request::fraction(250).with_pool(pool)).unwrap().node, frac.node);
        e.fence_node(frac.node.0, true);
        assert!(
            e.plan(&Request::fraction(250).with_pool(pool)).is_err(),
            "the whole pool is fenced"
        );
    }

    #[test]
    fn fencing_keeps_what_runs() {
        let mut e = seed_engine();
        let a = e.place(1, &Request::whole(2)).unwrap().clone();
        let Grant::Whole { gpus } = a.grant else { panic!() };
        e.fence_node(a.node.0, true);
        e.fence_gpu(a.node.0, gpus.trailing_zeros() as u8, true);
        assert_eq!(e.allocation(1), Some(&a));
        assert_eq!(e.fenced_gpus(a.node.0), 1 << gpus.trailing_zeros());
        assert!(e.release(1).is_some(), "work on a fenced GPU is released normally");
    }

    #[test]
    fn refusals_are_structured() {
        let mut e = seed_engine();
        let r = e.plan(&Request::whole(9)).unwrap_err();
        assert!(r.is_constraint());
        assert_eq!(r.field(), Field::Gpus);
        assert!(
            matches!(
                r,
                Unplaceable::GangBeyondDomain {
                    gpus: 9,
                    largest: 8,
                    ..
                }
            ),
            "{r:?}"
        );
        assert_eq!(
            r.to_string(),
            "constraint: 9 whole GPUs in one gang; the largest node (NVLink domain) in pools training and development has 8"
        );
        // A request for one model is told only about the pools that have it.
        let h100 = e.fleet().catalogue.find("H100-80GB-SXM").unwrap();
        let r = e.plan(&Request::whole(16).with_models(vec![h100])).unwrap_err();
        assert_eq!(
            r.to_string(),
            "constraint: 16 whole GPUs in one gang; the largest node (NVLink domain) in pool training has 8"
        );
        let r = e.plan(&Request::whole(0)).unwrap_err();
        assert_eq!(r.field(), Field::Gpus);
        assert_eq!(
            r.to_string(),
            "constraint: gpus: 0 whole GPUs: must be between 1 and 16"
        );
        let f = e.fleet().clone();
        let r = e
            .plan(&Request::fraction(250).with_pool(f.pool_by_name("training").unwrap()))
            .unwrap_err();
        assert_eq!(r.field(), Field::Pool);
        assert_eq!(
            r.to_string(),
            "constraint: pool training cannot serve 250 milli-GPU: it hands out whole GPUs only"
        );
        // Every pool that cannot serve the shape, whichever the request names, and why.
        let not: Vec<String> = e
            .pools_not_serving(&Request::fraction(250))
            .iter()
            .map(Unplaceable::message)
            .collect();
        assert_eq!(
            not,
            [
                "pool training cannot serve 250 milli-GPU: it hands out whole GPUs only",
                "pool serving cannot serve 250 milli-GPU: it is MIG-partitioned and serves MIG slices only: ask for a MIG profile"
            ]
        );
        // Fill the training pool: 16 × 8 GPUs.
        for i in 0..16 {
            e.place(100 + i, &Request::whole(8).with_pool(PoolId(0))).unwrap();
        }
        let r = e.plan(&Request::whole(8).with_pool(PoolId(0))).unwrap_err();
        assert_eq!(r.code(), "no-capacity", "{r}");
    }

    #[test]
    fn mig_partitions_on_demand() {
        let mut e = seed_engine();
        let cat = e.fleet().catalogue.clone();
        let a = e.place(1, &Request::mig(&cat, "3g.40gb").unwrap()).unwrap().clone();
        assert_eq!(a.units, GpuUnits::milli(500));
        let Grant::Mig { gpu, start, size, .. } = a.grant else {
            panic!()
        };
        assert_eq!((start, size), (4, 4));
        let b = e.place(2, &Request::mig(&cat, "4g.40gb").unwrap()).unwrap().clone();
        assert_eq!(
            b.grant,
            Grant::Mig {
                gpu,
                profile: 5,
                profile_id: 5,
                start: 0,
                size: 4
            },
            "4g fills the same GPU"
        );
        let c = e.place(3, &Request::mig(&cat, "1g.10gb").unwrap()).unwrap().clone();
        assert_ne!(c.grant.gpu_mask(), a.grant.gpu_mask(), "full GPU is skipped");
        assert_eq!(c.units, GpuUnits::milli(125));
    }

    #[test]
    fn a_gpu_out_of_mig_mode_serves_whole_gpus_and_no_instances() {
        let fleet = Arc::new(
            Fleet::from_toml(
                "[[pool]]\nname = \"serving\"\nsharing = \"mig\"\n[[pool.nodes]]\nname = \"a\"\ngpu_model = \"A100-80GB\"\ngpus = 2\ncpus = 64\nmemory_gib = 512\nnvlink = \"nvswitch\"\n",
                "test",
            )
            .unwrap(),
        );
        let mut e = Engine::new(fleet.clone(), Box::new(BestFit), 1);
        let cat = fleet.catalogue.clone();
        let serving = fleet.pool_by_name("serving").unwrap();
        let whole = Request::whole(1).with_pool(serving);
        assert_eq!(
            e.plan(&whole).unwrap_err().field(),
            Field::Pool,
            "MIG everywhere: no whole GPU"
        );
        // A GPU holding an instance cannot switch; an idle one can.
        let a = e.place(1, &Request::mig(&cat, "1g.10gb").unwrap()).unwrap().clone();
        let busy = a.grant.gpu_mask().trailing_zeros() as u8;
        assert!(e.set_gpu_mig(0, busy, false).is_err());
        let idle = 1 - busy;
        e.set_gpu_mig(0, idle, false).unwrap();
        assert_eq!(e.mig_off_gpus(0), 1 << idle);
        // The idle GPU serves one whole GPU (never two: the other is in MIG mode) and no
        // instance: the next 7g cannot go anywhere while the busy GPU holds its 1g.
        assert!(e.plan(&Request::whole(2).with_pool(serving)).is_err());
        let w = e.place(2, &whole).unwrap().clone();
        assert_eq!(w.grant, Grant::Whole { gpus: 1 << idle });
        assert!(e.plan(&Request::mig(&cat, "7g.80gb").unwrap()).is_err());
        assert!(e.set_gpu_mig(0, idle, true).is_err(), "it holds a whole GPU now");
        e.release(2).unwrap();
        // A whole GPU on a GPU in MIG mode, or an instance on one out of it, is refused.
        let mut stale = w.clone();
        stale.id = 3;
        stale.grant = Grant::Whole { gpus: 1 << busy };
        assert!(e.restore(stale).is_err());
        // Back into MIG mode: instances again, no whole GPUs.
        e.set_gpu_mig(0, idle, true).unwrap();
        let b = e.place(4, &Request::mig(&cat, "7g.80gb").unwrap()).unwrap().clone();
        assert_eq!(b.grant.gpu_mask(), 1 << idle);
        assert!(e.plan(&whole).is_err());
        // Pending a reset: out of placement altogether.
        e.release(4).unwrap();
        e.set_gpu_mig_pending(0, idle, true);
        assert!(e.plan(&Request::mig(&cat, "7g.80gb").unwrap()).is_err());
        e.set_gpu_mig_pending(0, idle, false);
        assert!(e.plan(&Request::mig(&cat, "7g.80gb").unwrap()).is_ok());
        // Only mig pools switch per GPU.
        let seed = seed_engine();
        let training = seed.fleet().pool_by_name("training").unwrap();
        let n = seed.fleet().pool(training).nodes.start;
        assert!(seed.mig_switchable(n, 0).unwrap_err().0.contains("serves whole GPUs"));
    }

    #[test]
    fn shared_gpus_hold_one_tenant() {
        let mut e = seed_engine();
        let dev = e.fleet().pool_by_name("development").unwrap();
        let a = e
            .place(1, &Request::fraction(500).with_tenant(TenantId(1)).with_pool(dev))
            .unwrap()
            .clone();
        let b = e
            .place(2, &Request::fraction(500).with_tenant(TenantId(2)).with_pool(dev))
            .unwrap()
            .clone();
        assert!(a.node != b.node || a.grant.gpu_mask() != b.grant.gpu_mask());
        let c = e
            .place(3, &Request::fraction(500).with_tenant(TenantId(1)).with_pool(dev))
            .unwrap()
            .clone();
        assert_eq!(
            (c.node, c.grant.gpu_mask()),
            (a.node, a.grant.gpu_mask()),
            "same tenant packs"
        );
    }

    #[test]
    fn with_per_node_device_counts_a_shared_node_holds_one_tenant() {
        // The device plugin picks the time-sliced GPU: tenants apart per GPU is not enough.
        let mut e = seed_engine();
        e.set_device_binding(DeviceBinding::PerNodeCount);
        let dev = e.fleet().pool_by_name("development").unwrap();
        let frac = |t| Request::fraction(300).with_tenant(TenantId(t)).with_pool(dev);
        let a = e.place(1, &frac(1)).unwrap().clone();
        let b = e.place(2, &frac(2)).unwrap().clone();
        assert_ne!(a.node, b.node, "two tenants, two shared nodes");
        // The first tenant's fractions fill its node before opening another: its GPU, then the
        // node's other GPUs.
        let mut used = a.grant.gpu_mask();
        for id in 3..=8 {
            let c = e.place(id, &frac(1)).unwrap().clone();
            assert_eq!(c.node, a.node, "fraction {id} packs onto the tenant's node");
            used |= c.grant.gpu_mask();
        }
        // A booking of tenant 2 on an idle GPU of tenant 1's node is refused at commit too (a
        // restore), though no GPU would be shared.
        let idle = (0..8u8).find(|g| used >> g & 1 == 0).expect("an idle GPU on the node");
        let mut bad = b.clone();
        bad.id = 99;
        bad.node = a.node;
        bad.grant = Grant::Fraction {
            gpu: idle,
            milli: 300,
            memory_mib: 0,
        };
        assert!(e.restore(bad.clone()).is_err());
        // Where the engine names the GPU itself, only the GPU must hold one tenant.
        e.set_device_binding(DeviceBinding::Exact);
        assert!(e.restore(bad).is_ok());
    }

    /// The shared placer's score trees decide exactly as a scan of every node, drawing the same
    /// random numbers for ties, while nodes fill, empty, are fenced and are held back.
    #[test]
    fn shared_score_trees_decide_as_a_scan_of_every_node() {
        use rand::{Rng, SeedableRng};
        for policy in ["random", "bestfit", "tessera", "fgd"] {
            let fleet = Arc::new(Fleet::synthetic(300));
            let dev = fleet.pool_by_name("development").unwrap();
            let nodes = fleet.pool(dev).nodes.clone();
            let mut e = Engine::new(fleet.clone(), crate::replay::make_policy(policy, &[]).unwrap(), 3);
            let mut ops = rand_chacha::ChaCha8Rng::seed_from_u64(11);
            let mut live: Vec<u64> = Vec::new();
            for id in 0..600u64 {
                match ops.random_range(0..10) {
                    0..=5 => {
                        let mut req = match ops.random_range(0..6) {
                            0 => Request::whole(ops.random_range(1..=2)),
                            _ => Request::fraction([100, 250, 500, 750][ops.random_range(0..4)]),
                        }
                        .with_tenant(TenantId(ops.random_range(0..3)))
                        .with_pool(dev);
                        req.cpu_milli = ops.random_range(0..4) * 2000;
                        e.observe(&req);
                        // The scan, on a copy: the same state, policy and generator.
                        let mut scan = e.copy();
                        let d = demand_of(&req).unwrap();
                        let on = SharedDemand {
                            req: &req,
                            d: &d,
                            mix: false,
                            node_iso: false,
                            policy_epoch: scan.policy.epoch(),
                            type_id: None,
                        };
                        let by_scan = scan.shared_best_scan(dev, &on, &mut Vec::new());
                        let planned = e.plan(&req).ok();
                        assert_eq!(
                            planned.as_ref().map(|p| p.node.0),
                            by_scan.map(|b| b.0),
                            "{policy}, op {id}: {req:?}"
                        );
                        assert_eq!(e.rng.clone().random::<u64>(), scan.rng.clone().random::<u64>());
                        if let Some(p) = planned {
                            e.commit(id, &req, p).unwrap();
                            live.push(id);
                        }
                    }
                    6..=7 if !live.is_empty() => {
                        let id = live.swap_remove(ops.random_range(0..live.len()));
                        e.release(id).unwrap();
                    }
                    8 => {
                        let n = ops.random_range(nodes.clone());
                        e.fence_node(n, !e.node_fenced(n));
                        e.fence_gpu(
                            ops.random_range(nodes.clone()),
                            ops.random_range(0..8),
                            ops.random_bool(0.5),
                        );
                    }
                    _ => {
                        let held = (0..ops.random_range(0..3)).map(|_| ops.random_range(nodes.clone()));
                        e.set_blocked(held.collect());
                    }
                }
            }
            assert!(!e.cache.trees.is_empty(), "{policy}: the trees were used");
        }
    }

    #[test]
    fn release_restores_exactly() {
        let mut e = seed_engine();
        let before = e.state().clone();
        let cat = e.fleet().catalogue.clone();
        e.place(1, &Request::whole(4)).unwrap();
        e.place(2, &Request::mig(&cat, "2g.20gb").unwrap()).unwrap();
        e.place(3, &Request::fraction(300)).unwrap();
        for id in [2, 3, 1] {
            e.release(id).unwrap();
        }
        assert!(e.state().same_holdings(&before));
        assert!(e.release(1).is_none());
    }

    #[test]
    fn restore_rejects_double_booking() {
        let mut e = seed_engine();
        let a = e.place(1, &Request::whole(8)).unwrap().clone();
        let mut dup = a.clone();
        dup.id = 2;
        assert!(e.restore(dup).is_err());
        assert!(e.restore(a).is_err(), "same id twice");
    }

    #[test]
    fn pairs_topology() {
        assert_eq!(
            whole_choice(Topology::Pairs, 4, 0b1110, 1),
            Some(0b0010),
            "breaks the broken pair"
        );
        assert_eq!(whole_choice(Topology::Pairs, 4, 0b1110, 2), Some(0b1100));
        assert_eq!(whole_choice(Topology::Pairs, 4, 0b1111, 4), None);
        assert_eq!(whole_choice(Topology::None, 4, 0b1010, 2), Some(0b1010));
    }
}
