//! Gangs beyond one node: N whole GPUs as node-shares of G GPUs each (one share per node, on
//! one NVLink domain of it), placed all together or not at all, in the fewest racks possible.
//!
//! Each whole pool is a tree of *tiers* from its racks up: the lowest level the pool declares
//! (its groups; the pool itself when it declares none), every higher level it declares, and the
//! pool. The engine keeps, per group, how many of its nodes have k free GPUs (`free`), updated
//! as nodes are (re)indexed; a placement reads those counts to find the groups that can hold a
//! share at all and counts exactly (host resources, fences, NVLink domains) only there.
//!
//! Placing `K` shares in segments of `m` nodes (1 without segments): every group's capacity is
//! the segments it can hold now; each tier's domain sums its children. From the lowest tier up
//! to the highest the constraint allows (`required` at a level stops there; `preferred` goes on
//! to the pool), the first tier with a domain that holds the whole gang gives the domain: the
//! one with the least capacity that does (best fit). Within it, each tier down takes the fewest
//! children — the largest first, and the last one the smallest that holds what remains (as
//! Kueue's topology-aware scheduling does) — and in each rack the nodes with the fewest free
//! GPUs that hold a share. Where going block by block would take more racks than the fewest
//! racks under the domain, those racks are taken instead. So a gang that fits one rack takes one
//! rack, and otherwise the fewest racks possible (of the fewest blocks when that costs none).
//!
//! A whole-node gang whose N is no multiple of the node size G (with `remainder` set: the
//! Philly protocol's shape) has ⌈N / G⌉ shares: ⌊N / G⌋ whole nodes and one remainder share
//! of N mod G GPUs (12 = 8 + 4). A rack then also counts
//! whether one of its nodes holds the remainder but no whole share; a domain holds the gang
//! when it has the whole nodes and one share more (a whole node left over or such a node), all
//! shares are counted alike to take the fewest racks, and the remainder goes last, in one of
//! those racks, on the node with the fewest free GPUs that holds it.
//!
//! Cost: O(groups × 17) for the per-group bounds, plus an exact pass over the nodes of the
//! groups that may hold a segment, plus a sort of the children of the chosen domains; never a
//! search over combinations of nodes. A committed gang is one [`GangAllocation`]; each share is
//! an ordinary [`Allocation`] (id [`share_id`]), so every single-node path (release, restore,
//! rebind, fences) treats a share as it treats any booking.

use std::collections::HashMap;
use std::sync::Arc;

use tessera_model::request::{GangRequest, TopologyMode};
use tessera_model::{Fleet, GpuUnits, NodeId, PoolId, Sharing, TenantId, Topology};

use super::{Booking, CommitError, Engine, whole_choice};
use crate::reason::{GangUnplaceable, Pools};
use crate::state::{AllocId, Allocation, Grant, Placement};

/// Set in every node-share's allocation id.
pub const SHARE_BIT: AllocId = 1 << 63;

/// The largest gang id ([`share_id`] keeps 16 bits for the share's index).
pub const MAX_GANG_ID: AllocId = (1 << 47) - 1;

/// The allocation id of share `index` of gang `gang`.
pub fn share_id(gang: AllocId, index: usize) -> AllocId {
    SHARE_BIT | gang << 16 | index as AllocId
}

/// Where a gang would go: one placement per node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GangPlacement {
    pub pool: PoolId,
    /// One whole-GPU placement per node, rack by rack.
    pub shares: Vec<Placement>,
    /// The racks it spans (domains of the pool's lowest level; the pool's name when it
    /// declares none), each with its number of shares, in the order of `shares`.
    pub racks: Vec<(String, u32)>,
    /// The level and domain that hold the whole gang (`("rack", "r2")`, `("pool", "training")`).
    pub within: (String, String),
}

/// A committed gang.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GangAllocation {
    pub id: AllocId,
    pub pool: PoolId,
    /// Its shares' allocation ids, in placement order.
    pub shares: Vec<AllocId>,
    pub tenant: Option<TenantId>,
    pub units: GpuUnits,
}

/// One tier of a pool's tree.
#[derive(Debug)]
struct Tier {
    /// The level's name (`rack`, `block`, a label key) or `pool`.
    name: String,
    /// Tier 0: `(name, nodes)` per group; above: `(name, children in the tier below)`.
    domains: Vec<(String, Vec<u32>)>,
}

/// A whole pool's tiers, lowest first; the last is the pool (and also the first when flat).
#[derive(Debug)]
struct PoolTree {
    tiers: Vec<Tier>,
    /// The global index of the pool's first group.
    base: u32,
}

/// The per-group free counts and the pools' trees.
#[derive(Clone, Debug, Default)]
pub(super) struct GangIndex {
    /// Per node, its global group (`u32::MAX` outside whole pools).
    group_of: Vec<u32>,
    /// Per group, its nodes by number of free GPUs.
    free: Vec<[u32; 17]>,
    /// Per pool (None: not a whole pool).
    trees: Arc<Vec<Option<PoolTree>>>,
}

impl GangIndex {
    pub(super) fn new(fleet: &Fleet) -> GangIndex {
        let levels = &fleet.levels;
        let mut group_of = vec![u32::MAX; fleet.nodes.len()];
        let mut groups = 0u32;
        let mut trees = Vec::new();
        for (pi, pool) in fleet.pools.iter().enumerate() {
            let pid = PoolId(pi as u16);
            if pool.sharing != Sharing::Whole {
                trees.push(None);
                continue;
            }
            let present: Vec<usize> = (0..levels.names().len()).filter(|&l| levels.pool_has(l, pid)).collect();
            let mut tiers: Vec<Tier> = Vec::new();
            // `ids[t]`: fleet domain index at tier t's level → index in the tier.
            let mut ids: Vec<HashMap<u32, u32>> = Vec::new();
            for (t, &l) in present.iter().enumerate() {
                let mut map = HashMap::new();
                let mut domains = Vec::new();
                for (d, dom) in levels.domains(l).iter().enumerate() {
                    if dom.pool != pid {
                        continue;
                    }
                    map.insert(d as u32, domains.len() as u32);
                    let members = if t == 0 { dom.nodes.clone() } else { Vec::new() };
                    domains.push((dom.name.clone(), members));
                }
                tiers.push(Tier {
                    name: levels.names()[l].clone(),
                    domains,
                });
                ids.push(map);
            }
            // Children of each tier above the lowest.
            for t in 1..tiers.len() {
                for c in 0..tiers[t - 1].domains.len() {
                    let first = first_node(&tiers, t - 1, c);
                    let d = levels.domain_of(present[t], NodeId(first)).expect("nested levels");
                    let parent = ids[t][&d] as usize;
                    tiers[t].domains[parent].1.push(c as u32);
                }
            }
            let top = match tiers.len() {
                0 => (pool.name.clone(), pool.nodes.clone().collect()),
                _ => (
                    pool.name.clone(),
                    (0..tiers.last().unwrap().domains.len() as u32).collect(),
                ),
            };
            tiers.push(Tier {
                name: "pool".into(),
                domains: vec![top],
            });
            let base = groups;
            for (gi, (_, nodes)) in tiers[0].domains.iter().enumerate() {
                for &n in nodes {
                    group_of[n as usize] = base + gi as u32;
                }
            }
            groups += tiers[0].domains.len() as u32;
            trees.push(Some(PoolTree { tiers, base }));
        }
        GangIndex {
            group_of,
            free: vec![[0; 17]; groups as usize],
            trees: Arc::new(trees),
        }
    }

    /// Node `n` has `free` free GPUs (`insert`) or no longer has (`!insert`).
    pub(super) fn update(&mut self, n: u32, free: u32, insert: bool) {
        let g = self.group_of[n as usize];
        if g != u32::MAX {
            let c = &mut self.free[g as usize][free as usize];
            if insert {
                *c += 1;
            } else {
                *c -= 1;
            }
        }
    }
}

/// The fewest of `kids` (`(capacity, id)`) that hold `need`: the largest first, and the last
/// the smallest that holds what remains; `(id, amount)` each. The kids hold `need` in all.
fn pick(kids: impl Iterator<Item = (u32, u32)>, need: u32) -> Vec<(usize, u32)> {
    let mut kids: Vec<(u32, u32)> = kids.filter(|&(c, _)| c > 0).collect();
    kids.sort_unstable_by_key(|&(c, k)| (std::cmp::Reverse(c), k));
    let mut out = Vec::new();
    let mut left = need;
    let mut i = 0;
    while left > 0 {
        if kids[i].0 >= left {
            // The smallest child from here on that holds what is left.
            let j = i + kids[i..].partition_point(|&(c, _)| c >= left) - 1;
            out.push((kids[j].1 as usize, left));
            left = 0;
        } else {
            out.push((kids[i].1 as usize, kids[i].0));
            left -= kids[i].0;
            i += 1;
        }
    }
    out
}

/// Some node under domain `d` of tier `t`.
fn first_node(tiers: &[Tier], mut t: usize, mut d: usize) -> u32 {
    while t > 0 {
        d = tiers[t].domains[d].1[0] as usize;
        t -= 1;
    }
    tiers[0].domains[d].1[0]
}

/// The racks (tier-0 domains) under domain `d` of tier `t`.
fn under(tree: &PoolTree, t: usize, d: usize) -> impl Iterator<Item = u32> + '_ {
    let mut racks = vec![d as u32];
    for t in (1..=t).rev() {
        racks = racks
            .iter()
            .flat_map(|&d| tree.tiers[t].domains[d as usize].1.iter().copied())
            .collect();
    }
    racks.into_iter()
}

/// Per tier, each domain's capacity: `full` in whole segments; `parts` (a gang with a
/// remainder only, else empty) its nodes that hold the remainder share but no whole one.
struct Caps {
    full: Vec<Vec<u32>>,
    parts: Vec<Vec<u32>>,
}

impl Caps {
    /// Shares domain `d` of tier `t` holds counting its remainder-only nodes.
    fn slots(&self, t: usize, d: usize) -> u32 {
        self.full[t][d] + self.parts.get(t).map_or(0, |p| p[d])
    }

    /// Whether domain `d` of tier `t` holds the gang: its whole segments, and with a
    /// remainder one share more (on a whole node left over or a node that holds only it).
    fn holds(&self, spec: Spec, t: usize, d: usize) -> bool {
        self.full[t][d] >= spec.need && (spec.rem == 0 || self.slots(t, d) > spec.need)
    }
}

/// A gang resolved against one pool.
#[derive(Clone, Copy, Debug)]
struct Spec {
    /// GPUs per share (G).
    per_node: u8,
    /// Shares only on nodes of exactly G GPUs, all free.
    whole_nodes: bool,
    /// Segments needed (K / m).
    need: u32,
    /// Nodes per segment (m).
    seg_nodes: u32,
    /// GPUs of the one remainder share beyond the `need` whole shares (0: none; whole nodes
    /// only, without segments, so `seg_nodes` is 1 then).
    rem: u8,
    /// The highest tier the gang may be held in as one domain.
    limit: usize,
}

impl Spec {
    /// The remainder share as a share of its own: `rem` GPUs on any node that has them free
    /// in one NVLink domain.
    fn rem_spec(self) -> Spec {
        Spec {
            per_node: self.rem,
            whole_nodes: false,
            ..self
        }
    }
}

impl Engine {
    /// A committed gang.
    pub fn gang(&self, id: AllocId) -> Option<&GangAllocation> {
        self.gangs.get(&id)
    }

    /// Every committed gang.
    pub fn gangs(&self) -> impl Iterator<Item = &GangAllocation> {
        self.gangs.values()
    }

    /// Why `g` could never be placed on this fleet (whatever runs), if that is so: checked at
    /// submission, so a gang beyond every domain of its level is refused at once.
    pub fn gang_constraint(&self, g: &GangRequest) -> Option<GangUnplaceable> {
        match self.gang_scope(g) {
            Err(u) => Some(u),
            Ok(scope) => self.gang_never(g, &scope).err(),
        }
    }

    /// The whole pools `g` may go to, in the engine's order (empty if none may).
    pub fn gang_pools(&self, g: &GangRequest) -> Vec<PoolId> {
        self.gang_scope(g)
            .map(|scope| scope.into_iter().map(|(p, _)| p).collect())
            .unwrap_or_default()
    }

    /// Where `g` would go, without changing the state, or why not (never, or not now).
    pub fn plan_gang(&mut self, g: &GangRequest) -> Result<GangPlacement, GangUnplaceable> {
        let scope = self.gang_scope(g)?;
        for &(pool, spec) in &scope {
            if let Some(p) = self.choose_gang(pool, g, spec) {
                return Ok(p);
            }
        }
        Err(self
            .gang_never(g, &scope)
            .err()
            .unwrap_or_else(|| self.gang_now(g, &scope)))
    }

    /// Plans and commits `g` as gang `id`.
    pub fn place_gang(&mut self, id: AllocId, g: &GangRequest) -> Result<&GangAllocation, GangUnplaceable> {
        let p = self.plan_gang(g)?;
        Ok(self.commit_gang(id, g, p).expect("a fresh gang plan always commits"))
    }

    /// Books every share of a gang placement, or none (changing nothing) if one does not fit,
    /// the id is taken or beyond [`MAX_GANG_ID`], or two shares share a node.
    pub fn commit_gang(
        &mut self,
        id: AllocId,
        g: &GangRequest,
        p: GangPlacement,
    ) -> Result<&GangAllocation, CommitError> {
        if id > MAX_GANG_ID {
            return Err(CommitError(format!("gang id {id} is beyond {MAX_GANG_ID}")));
        }
        if self.gangs.contains_key(&id) || p.shares.len() > 1 << 16 {
            return Err(CommitError(format!("gang {id} already exists or has too many shares")));
        }
        let mut nodes: Vec<u32> = p.shares.iter().map(|s| s.node.0).collect();
        nodes.sort_unstable();
        if nodes.windows(2).any(|w| w[0] == w[1]) {
            return Err(CommitError(format!("gang {id} has two shares on one node")));
        }
        let allocs: Vec<Allocation> = p
            .shares
            .iter()
            .enumerate()
            .map(|(i, s)| Allocation {
                id: share_id(id, i),
                node: s.node,
                grant: s.grant.clone(),
                cpu_milli: g.cpu_milli,
                memory_mib: g.memory_mib,
                tenant: g.tenant,
                units: s.units,
            })
            .collect();
        let how = Booking::Commit { relayout: false };
        for a in &allocs {
            if self.state.allocations.contains_key(&a.id) {
                return Err(CommitError(format!("allocation {} already exists", a.id)));
            }
            if !matches!(a.grant, Grant::Whole { .. }) {
                return Err(CommitError(format!("gang {id}: a share holds whole GPUs")));
            }
            self.check_fits(a, how)?;
        }
        let units = allocs.iter().map(|a| a.units).fold(GpuUnits::ZERO, |s, u| s + u);
        let shares = allocs.iter().map(|a| a.id).collect();
        for a in allocs {
            self.book(a, how).expect("checked: distinct nodes, each fits");
        }
        self.gangs.insert(
            id,
            GangAllocation {
                id,
                pool: p.pool,
                shares,
                tenant: g.tenant,
                units,
            },
        );
        Ok(&self.gangs[&id])
    }

    /// Re-applies a known gang (read from the store at start-up): its shares, ids as
    /// [`share_id`] gives them, each checked as [`Engine::restore`] checks an allocation; all
    /// or none (changing nothing).
    pub fn restore_gang(
        &mut self,
        id: AllocId,
        pool: PoolId,
        shares: Vec<Allocation>,
    ) -> Result<&GangAllocation, CommitError> {
        if id > MAX_GANG_ID || self.gangs.contains_key(&id) || shares.is_empty() {
            return Err(CommitError(format!(
                "gang {id} already exists, has no share or is beyond {MAX_GANG_ID}"
            )));
        }
        let mut nodes: Vec<u32> = shares.iter().map(|s| s.node.0).collect();
        nodes.sort_unstable();
        if nodes.windows(2).any(|w| w[0] == w[1]) {
            return Err(CommitError(format!("gang {id} has two shares on one node")));
        }
        for (i, a) in shares.iter().enumerate() {
            if a.id != share_id(id, i) || self.state.allocations.contains_key(&a.id) {
                return Err(CommitError(format!(
                    "gang {id}: share {i} has id {} or it is taken",
                    a.id
                )));
            }
            if !matches!(a.grant, Grant::Whole { .. }) {
                return Err(CommitError(format!("gang {id}: a share holds whole GPUs")));
            }
            self.check_fits(a, Booking::Restore)?;
        }
        let units = shares.iter().map(|a| a.units).fold(GpuUnits::ZERO, |s, u| s + u);
        let tenant = shares[0].tenant;
        let ids = shares.iter().map(|a| a.id).collect();
        for a in shares {
            self.book(a, Booking::Restore)
                .expect("checked: distinct nodes, each fits");
        }
        self.gangs.insert(
            id,
            GangAllocation {
                id,
                pool,
                shares: ids,
                tenant,
                units,
            },
        );
        Ok(&self.gangs[&id])
    }

    /// Returns every share of gang `id` exactly (release a gang's shares only through this).
    pub fn release_gang(&mut self, id: AllocId) -> Option<GangAllocation> {
        let gang = self.gangs.remove(&id)?;
        for &s in &gang.shares {
            self.release(s);
        }
        Some(gang)
    }

    // ----- scope ---------------------------------------------------------------------------

    /// The whole pools `g` may go to, each with the gang resolved against it, or why none.
    fn gang_scope(&self, g: &GangRequest) -> Result<Vec<(PoolId, Spec)>, GangUnplaceable> {
        let fleet = &*self.fleet;
        let pools: Vec<PoolId> = match g.pool {
            Some(p) => {
                let pool = fleet.pool(p);
                if pool.sharing != Sharing::Whole {
                    return Err(GangUnplaceable::PoolCannotServe {
                        pool: pool.name.clone(),
                        sharing: pool.sharing,
                    });
                }
                vec![p]
            }
            None => (0..fleet.pools.len() as u16)
                .map(PoolId)
                .filter(|&p| fleet.pool(p).sharing == Sharing::Whole)
                .collect(),
        };
        if pools.is_empty() {
            return Err(GangUnplaceable::NoPoolServes);
        }
        let level = match &g.topology {
            None => None,
            Some(t) if t.level == "node" => {
                return Err(GangUnplaceable::Invalid {
                    field: "topology",
                    message: "a gang within one node is a request of whole GPUs".into(),
                });
            }
            Some(t) if t.level == "pool" => None,
            Some(t) => match fleet.levels.level(&t.level) {
                Some(l) => Some((l, t)),
                None => {
                    return Err(GangUnplaceable::UnknownLevel {
                        level: t.level.clone(),
                        levels: fleet.levels.names().to_vec(),
                    });
                }
            },
        };
        let mut out = Vec::new();
        let mut first_err = None;
        for p in pools {
            let per_node = match g.gpus_per_node {
                Some(x) => x,
                None => self.pool_models[p.0 as usize]
                    .iter()
                    .filter(|(m, _)| g.allows_model(*m))
                    .flat_map(|(_, ns)| ns.iter().map(|&n| fleet.nodes[n as usize].gpus))
                    .max()
                    .unwrap_or(0),
            };
            if per_node == 0 {
                first_err.get_or_insert(GangUnplaceable::NoEligibleNode {
                    pools: Pools(vec![fleet.pool(p).name.clone()]),
                });
                continue;
            }
            if let Err(e) = g.check_with(per_node) {
                return Err(GangUnplaceable::Invalid {
                    field: e.field,
                    message: e.message,
                });
            }
            let tree = self.gang_index.trees[p.0 as usize]
                .as_ref()
                .expect("a whole pool has a tree");
            let top = tree.tiers.len() - 1;
            let limit = match level {
                Some((l, t)) if t.mode == TopologyMode::Required => {
                    match tree.tiers[..top]
                        .iter()
                        .position(|tier| tier.name == fleet.levels.names()[l])
                    {
                        Some(tier) => tier,
                        None => {
                            first_err.get_or_insert(GangUnplaceable::PoolLacksLevel {
                                pool: fleet.pool(p).name.clone(),
                                level: t.level.clone(),
                            });
                            continue;
                        }
                    }
                }
                _ => top,
            };
            let shares = g.gpus / per_node as u32;
            let seg_nodes = g.segment.map_or(1, |s| s / per_node as u32);
            out.push((
                p,
                Spec {
                    per_node,
                    whole_nodes: g.gpus_per_node.is_none(),
                    need: shares / seg_nodes,
                    seg_nodes,
                    rem: g.remainder_gpus(per_node) as u8,
                    limit,
                },
            ));
        }
        if out.is_empty() {
            return Err(first_err.expect("a pool in scope or a reason"));
        }
        Ok(out)
    }

    // ----- choosing ------------------------------------------------------------------------

    /// The whole GPUs (a mask of G) a share of `g` takes on node `n` now, if it fits there.
    fn share_fits(&self, n: u32, g: &GangRequest, spec: Spec) -> Option<u16> {
        if self.blocked.contains(&n) || self.fenced_nodes.contains(&n) {
            return None;
        }
        let node = &self.fleet.nodes[n as usize];
        let st = &self.state.nodes[n as usize];
        if st.cpu_free < g.cpu_milli || st.mem_free < g.memory_mib || !g.allows_model(node.model) {
            return None;
        }
        let free = st.free_mask & !self.out_gpus(n);
        if spec.whole_nodes {
            return (node.gpus == spec.per_node && free.count_ones() == node.gpus as u32).then_some(free);
        }
        whole_choice(node.topology, node.gpus, free, spec.per_node)
    }

    /// Whether a share of `g` could ever go on node `n` (an empty node of its size).
    fn share_could(&self, n: u32, g: &GangRequest, spec: Spec) -> bool {
        let node = &self.fleet.nodes[n as usize];
        if g.cpu_milli > node.cpu_milli || g.memory_mib > node.memory_mib || !g.allows_model(node.model) {
            return false;
        }
        if spec.whole_nodes {
            return node.gpus == spec.per_node;
        }
        let all = if node.gpus == 0 {
            0
        } else {
            ((1u32 << node.gpus) - 1) as u16
        };
        let domain = match node.topology {
            Topology::None | Topology::NvSwitch => node.gpus as u32,
            Topology::Pairs => 2.min(node.gpus as u32),
        };
        all != 0 && spec.per_node as u32 <= domain
    }

    /// Per tier, each domain's capacity in segments: now (`now`), or ever.
    fn gang_caps(&self, pool: PoolId, g: &GangRequest, spec: Spec, now: bool) -> Caps {
        let tree = self.gang_index.trees[pool.0 as usize].as_ref().expect("whole pool");
        let mut caps: Vec<Vec<u32>> = Vec::with_capacity(tree.tiers.len());
        let mut c0 = Vec::with_capacity(tree.tiers[0].domains.len());
        let mut part0 = Vec::new();
        let rs = spec.rem_spec();
        for (gi, (_, nodes)) in tree.tiers[0].domains.iter().enumerate() {
            if spec.rem > 0 {
                // A node that holds the remainder share but not a whole one.
                let free = &self.gang_index.free[(tree.base as usize) + gi];
                let p = if now {
                    free[spec.rem as usize..].iter().sum::<u32>() > 0
                        && nodes
                            .iter()
                            .any(|&n| self.share_fits(n, g, spec).is_none() && self.share_fits(n, g, rs).is_some())
                } else {
                    nodes
                        .iter()
                        .any(|&n| !self.share_could(n, g, spec) && self.share_could(n, g, rs))
                };
                part0.push(p as u32);
            }
            let cap = if now {
                // Nodes with at least G free GPUs (all of them in whole-node mode): a bound.
                let free = &self.gang_index.free[(tree.base as usize) + gi];
                let bound: u32 = free[spec.per_node as usize..].iter().sum();
                if bound < spec.seg_nodes {
                    0
                } else {
                    nodes.iter().filter(|&&n| self.share_fits(n, g, spec).is_some()).count() as u32
                }
            } else {
                nodes.iter().filter(|&&n| self.share_could(n, g, spec)).count() as u32
            };
            c0.push(cap / spec.seg_nodes);
        }
        let mut parts = Vec::new();
        caps.push(c0);
        if spec.rem > 0 {
            parts.push(part0);
        }
        for t in 1..tree.tiers.len() {
            let sum = |below: &Vec<u32>| -> Vec<u32> {
                tree.tiers[t]
                    .domains
                    .iter()
                    .map(|(_, kids)| kids.iter().map(|&k| below[k as usize]).sum())
                    .collect()
            };
            caps.push(sum(&caps[t - 1]));
            if spec.rem > 0 {
                parts.push(sum(&parts[t - 1]));
            }
        }
        Caps { full: caps, parts }
    }

    /// The racks (tier-0 domains) under domain `dom` of tier `tier` that hold `need` shares
    /// (`cap(t, d)`: domain d of tier t's capacity): down the tiers the fewest children, the
    /// largest first and the tightest last; unless that takes more racks than the fewest racks
    /// under the domain would. `(rack, shares)` each.
    fn descend(
        tree: &PoolTree,
        tier: usize,
        dom: usize,
        need: u32,
        cap: &dyn Fn(usize, usize) -> u32,
    ) -> Vec<(usize, u32)> {
        let mut take: Vec<(usize, u32)> = vec![(dom, need)];
        for t in (1..=tier).rev() {
            let mut next = Vec::new();
            for &(d, need) in &take {
                let kids = tree.tiers[t].domains[d].1.iter().map(|&k| (cap(t - 1, k as usize), k));
                next.extend(pick(kids, need));
            }
            take = next;
        }
        if tier > 1 {
            let flat = pick(under(tree, tier, dom).map(|r| (cap(0, r as usize), r)), need);
            if flat.len() < take.len() {
                take = flat;
            }
        }
        take
    }

    fn choose_gang(&self, pool: PoolId, g: &GangRequest, spec: Spec) -> Option<GangPlacement> {
        let caps = self.gang_caps(pool, g, spec, true);
        let tree = self.gang_index.trees[pool.0 as usize].as_ref().expect("whole pool");
        // The lowest tier with a domain that holds the gang; there, the tightest such domain.
        let (tier, dom) = (0..=spec.limit).find_map(|t| {
            (0..caps.full[t].len())
                .filter(|&d| caps.holds(spec, t, d))
                .min_by_key(|&d| (caps.slots(t, d), d))
                .map(|d| (t, d))
        })?;
        let rs = spec.rem_spec();
        // `(rack, whole shares)` each, and with a remainder the rack that holds it too.
        let (mut take, mut rem_rack): (Vec<(usize, u32)>, Option<usize>) = if spec.rem == 0 {
            (Self::descend(tree, tier, dom, spec.need, &|t, d| caps.full[t][d]), None)
        } else {
            // Every share counted alike (a rack holds its whole nodes and at most one node that
            // holds only the remainder), so the fewest racks hold the gang.
            let take = Self::descend(tree, tier, dom, spec.need + 1, &|t, d| caps.slots(t, d));
            let over: Vec<usize> = (0..take.len())
                .filter(|&i| take[i].1 > caps.full[0][take[i].0])
                .collect();
            match over.len() {
                // A rack that uses its remainder-only node takes the remainder.
                1 => {
                    let mut take = take;
                    take[over[0]].1 -= 1;
                    (take, Some(over[0]))
                }
                // Any rack can take it: the one with the tightest node that holds it.
                0 => {
                    let j = (0..take.len())
                        .filter_map(|i| {
                            let (gi, a) = take[i];
                            self.rem_node(tree, gi, a - 1, g, spec, rs).map(|(f, n, _)| (f, n, i))
                        })
                        .min()
                        .map(|(_, _, i)| i)
                        .expect("a rack of the gang holds its remainder");
                    let mut take = take;
                    take[j].1 -= 1;
                    (take, Some(j))
                }
                // Two racks would each need their remainder-only node: the racks of the domain
                // by whole nodes, then by a remainder-only node, the fewest that hold the whole
                // shares and one more (the fewest possible: of m racks, these have the most
                // whole nodes and, among those, remainder-only nodes); the remainder then in
                // the first of them with room.
                _ => {
                    let mut racks: Vec<usize> = under(tree, tier, dom).map(|r| r as usize).collect();
                    racks.sort_by_key(|&r| {
                        (
                            std::cmp::Reverse(caps.full[0][r]),
                            std::cmp::Reverse(caps.slots(0, r)),
                            r,
                        )
                    });
                    let (mut whole, mut slots) = (0, 0);
                    let mut take = Vec::new();
                    for r in racks {
                        if whole >= spec.need && slots > spec.need {
                            break;
                        }
                        take.push((r, caps.full[0][r].min(spec.need - whole.min(spec.need))));
                        whole += caps.full[0][r];
                        slots += caps.slots(0, r);
                    }
                    (take, None)
                }
            }
        };
        if spec.rem > 0 && rem_rack.is_none() {
            let j = (0..take.len()).find(|&i| self.rem_node(tree, take[i].0, take[i].1, g, spec, rs).is_some());
            rem_rack = Some(match j {
                Some(j) => j,
                None => {
                    let r = under(tree, tier, dom)
                        .map(|r| r as usize)
                        .filter(|&r| take.iter().all(|&(gi, _)| gi != r) && caps.slots(0, r) > 0)
                        .min_by_key(|&r| (caps.slots(0, r), r))
                        .expect("the domain holds the remainder");
                    take.push((r, 0));
                    take.len() - 1
                }
            });
        }
        // The remainder's rack last, so the remainder is the last share.
        if let Some(j) = rem_rack {
            let e = take.remove(j);
            take.push(e);
        }
        // In each group, the nodes with the fewest free GPUs that hold a share.
        let mut shares = Vec::with_capacity((spec.need * spec.seg_nodes) as usize + 1);
        let mut racks = Vec::with_capacity(take.len());
        let last = take.len() - 1;
        for (i, (gi, segs)) in take.into_iter().enumerate() {
            let name = &tree.tiers[0].domains[gi].0;
            let k = (segs * spec.seg_nodes) as usize;
            let cands = self.full_nodes(tree, gi, k, g, spec);
            shares.extend(cands.iter().map(|&(_, n, mask)| Placement {
                node: NodeId(n),
                grant: Grant::Whole { gpus: mask },
                units: GpuUnits::whole(spec.per_node as u64),
                relayout: false,
            }));
            let mut count = k as u32;
            if spec.rem > 0 && i == last {
                let (_, n, mask) = self.rem_node(tree, gi, segs, g, spec, rs)?;
                shares.push(Placement {
                    node: NodeId(n),
                    grant: Grant::Whole { gpus: mask },
                    units: GpuUnits::whole(spec.rem as u64),
                    relayout: false,
                });
                count += 1;
            }
            racks.push((name.clone(), count));
        }
        Some(GangPlacement {
            pool,
            shares,
            racks,
            within: (tree.tiers[tier].name.clone(), tree.tiers[tier].domains[dom].0.clone()),
        })
    }

    /// The `k` nodes of group `gi` with the fewest free GPUs that hold a whole share of `g`
    /// now, with their masks, by (free GPUs, node).
    fn full_nodes(&self, tree: &PoolTree, gi: usize, k: usize, g: &GangRequest, spec: Spec) -> Vec<(u32, u32, u16)> {
        let mut cands: Vec<(u32, u32, u16)> = Vec::new();
        for &n in &tree.tiers[0].domains[gi].1 {
            if let Some(mask) = self.share_fits(n, g, spec) {
                cands.push((self.state.nodes[n as usize].free_gpus(), n, mask));
            }
        }
        if cands.len() > k {
            cands.select_nth_unstable(k);
            cands.truncate(k);
        }
        cands.sort_unstable();
        cands
    }

    /// The node of group `gi` with the fewest free GPUs (then the first) that holds the
    /// remainder share of `g` beside the group's `fulls` whole shares ([`Self::full_nodes`]).
    fn rem_node(
        &self,
        tree: &PoolTree,
        gi: usize,
        fulls: u32,
        g: &GangRequest,
        spec: Spec,
        rs: Spec,
    ) -> Option<(u32, u32, u16)> {
        let used = self.full_nodes(tree, gi, fulls as usize, g, spec);
        tree.tiers[0].domains[gi]
            .1
            .iter()
            .filter(|&&n| used.iter().all(|&(_, u, _)| u != n))
            .filter_map(|&n| {
                self.share_fits(n, g, rs)
                    .map(|mask| (self.state.nodes[n as usize].free_gpus(), n, mask))
            })
            .min()
    }

    // ----- reasons -------------------------------------------------------------------------

    /// `Err` with why `g` can never be placed in any pool of `scope`, or `Ok`.
    fn gang_never(&self, g: &GangRequest, scope: &[(PoolId, Spec)]) -> Result<(), GangUnplaceable> {
        let mut first = None;
        for &(pool, spec) in scope {
            let caps = self.gang_caps(pool, g, spec, false);
            match self.beyond(pool, g, spec, &caps, false) {
                None => return Ok(()),
                Some(u) => {
                    first.get_or_insert(u);
                }
            }
        }
        Err(first.expect("a pool in scope"))
    }

    /// Why `g` waits now (it could fit some pool of `scope` once work ends).
    fn gang_now(&self, g: &GangRequest, scope: &[(PoolId, Spec)]) -> GangUnplaceable {
        for &(pool, spec) in scope {
            let ever = self.gang_caps(pool, g, spec, false);
            if self.beyond(pool, g, spec, &ever, false).is_some() {
                continue;
            }
            let caps = self.gang_caps(pool, g, spec, true);
            return self.beyond(pool, g, spec, &caps, true).expect("no room now");
        }
        unreachable!("gang_now is asked only when some pool could hold the gang")
    }

    /// The reason when no domain of the gang's highest allowed tier holds it in `caps`.
    fn beyond(&self, pool: PoolId, g: &GangRequest, spec: Spec, caps: &Caps, now: bool) -> Option<GangUnplaceable> {
        let tree = self.gang_index.trees[pool.0 as usize].as_ref().expect("whole pool");
        let t = spec.limit;
        if (0..caps.full[t].len()).any(|d| caps.holds(spec, t, d)) {
            return None;
        }
        // The GPUs of the shares domain `d` of tier `t` holds (whole segments, and with a
        // remainder its remainder-only nodes' remainder shares).
        let gpus_of = |t: usize, d: usize| {
            let parts = caps.slots(t, d) - caps.full[t][d];
            caps.full[t][d] * spec.seg_nodes * spec.per_node as u32 + parts * spec.rem as u32
        };
        let d = (0..caps.full[t].len()).max_by_key(|&d| (gpus_of(t, d), std::cmp::Reverse(d)))?;
        let best = gpus_of(t, d);
        let top = caps.full.len() - 1;
        let level = tree.tiers[t].name.clone();
        let domain = tree.tiers[t].domains[d].0.clone();
        let pool_name = self.fleet.pool(pool).name.clone();
        let segment = g.segment;
        Some(if now {
            GangUnplaceable::NoRoomAtLevel {
                pool: pool_name,
                level,
                domain,
                gpus: g.gpus,
                free: best,
                pool_free: if caps.full[top].is_empty() { 0 } else { gpus_of(top, 0) },
                segment,
            }
        } else {
            GangUnplaceable::BeyondLevel {
                pool: pool_name,
                level,
                domain,
                gpus: g.gpus,
                capacity: best,
                segment,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tessera_model::request::{GangRequest, TopologyConstraint};
    use tessera_model::{Fleet, Request};

    use super::*;
    use crate::replay::make_policy;

    /// `racks` racks of `per_rack` 8-GPU nodes in pool `training`, `per_block` racks a block.
    fn fleet(racks: u32, per_rack: u32, per_block: Option<u32>) -> Arc<Fleet> {
        let mut text = String::from("[[pool]]\nname = \"training\"\nsharing = \"whole\"\n");
        for r in 0..racks {
            text += &format!(
                "[[pool.nodes]]\nname = \"n{r}\"\ncount = {per_rack}\ngpu_model = \"H100-80GB-SXM\"\ngpus = 8\ncpus = 112\nmemory_gib = 2048\nnvlink = \"nvswitch\"\nrack = \"r{r}\"\n"
            );
            if let Some(b) = per_block {
                text += &format!("block = \"b{}\"\n", r / b);
            }
        }
        Arc::new(Fleet::from_toml(&text, "test").unwrap())
    }

    fn engine(f: &Arc<Fleet>) -> Engine {
        Engine::new(f.clone(), make_policy("tessera", &[]).unwrap(), 1)
    }

    fn racks_of(p: &GangPlacement) -> Vec<(&str, u32)> {
        p.racks.iter().map(|(r, n)| (r.as_str(), *n)).collect()
    }

    /// Fills `k` GPUs of node `n` with a single-node allocation.
    fn fill(e: &mut Engine, id: AllocId, n: u32, k: u8) {
        let node = NodeId(n);
        e.commit(
            id,
            &Request::whole(k),
            Placement {
                node,
                grant: Grant::Whole {
                    gpus: ((1u32 << k) - 1) as u16,
                },
                units: GpuUnits::whole(k as u64),
                relayout: false,
            },
        )
        .unwrap();
    }

    #[test]
    fn fewest_racks_then_best_fit() {
        let f = fleet(4, 4, None);
        let mut e = engine(&f);
        // Rack r0: 1 node busy; r1: 2 busy; r2, r3 free.
        fill(&mut e, 1, 0, 1);
        fill(&mut e, 2, 4, 8);
        fill(&mut e, 3, 5, 8);
        // 16 GPUs as whole nodes: the tightest rack that holds 2 free nodes is r1.
        let p = e.plan_gang(&GangRequest::whole_nodes(16)).unwrap();
        assert_eq!(racks_of(&p), [("r1", 2)]);
        assert_eq!(p.within, ("rack".to_string(), "r1".to_string()));
        // 24 GPUs: r0 has 3 whole free nodes (one is partly used) — best fit.
        let p = e.plan_gang(&GangRequest::whole_nodes(24)).unwrap();
        assert_eq!(racks_of(&p), [("r0", 3)]);
        // 48 GPUs = 6 nodes: no rack holds it; two racks: r2 (4) and then the tightest for 2.
        let p = e.plan_gang(&GangRequest::whole_nodes(48)).unwrap();
        assert_eq!(racks_of(&p), [("r2", 4), ("r1", 2)]);
        assert_eq!(p.within.0, "pool");
        // 4 nodes × 4 GPUs: partly used nodes first (node 0 has 7 free).
        let p = e.plan_gang(&GangRequest::nodes(4, 4)).unwrap();
        assert_eq!(racks_of(&p), [("r0", 4)]);
        assert_eq!(p.shares[0].node, NodeId(0));
        assert_eq!(p.shares[0].grant, Grant::Whole { gpus: 0b1_1110 });
    }

    #[test]
    fn all_or_nothing_and_exact_release() {
        let f = fleet(2, 4, None);
        let mut e = engine(&f);
        let before = e.state().clone();
        let g = GangRequest::whole_nodes(48).with_tenant(TenantId(3));
        let a = e.place_gang(7, &g).unwrap().clone();
        assert_eq!(a.shares.len(), 6);
        assert_eq!(a.units, GpuUnits::whole(48));
        assert_eq!(e.allocation(share_id(7, 0)).unwrap().tenant, Some(TenantId(3)));
        // What is left (16 GPUs) cannot hold another 48: nothing is booked.
        let snapshot = e.state().clone();
        let u = e.place_gang(8, &g).unwrap_err();
        assert!(!u.is_constraint(), "{u}");
        assert!(e.state().same_holdings(&snapshot));
        assert!(e.gang(8).is_none());
        // A stale plan commits nothing.
        let mut other = e.copy();
        let p = other.plan_gang(&GangRequest::whole_nodes(16)).unwrap();
        fill(&mut e, 50, p.shares[1].node.0, 1);
        let snapshot = e.state().clone();
        assert!(e.commit_gang(9, &GangRequest::whole_nodes(16), p).is_err());
        assert!(e.state().same_holdings(&snapshot));
        e.release(50).unwrap();
        // A restart: the gang restored from its shares is the same booking.
        let placed = e.state().clone();
        let shares: Vec<Allocation> = a.shares.iter().map(|&s| e.allocation(s).unwrap().clone()).collect();
        assert_eq!(e.release_gang(7).unwrap().shares.len(), 6);
        assert!(e.state().same_holdings(&before));
        assert!(e.release_gang(7).is_none());
        let mut wrong = shares.clone();
        wrong.swap(0, 1);
        assert!(e.restore_gang(7, a.pool, wrong).is_err());
        assert!(e.state().same_holdings(&before));
        assert_eq!(e.restore_gang(7, a.pool, shares.clone()).unwrap(), &a);
        assert!(e.state().same_holdings(&placed));
        assert!(e.restore_gang(7, a.pool, shares).is_err());
        e.release_gang(7).unwrap();
        assert!(e.state().same_holdings(&before));
    }

    #[test]
    fn required_level_refuses_or_waits_naming_the_level() {
        let f = fleet(4, 4, Some(2));
        let mut e = engine(&f);
        // Never: 64 GPUs in one rack of 32.
        let g = GangRequest::whole_nodes(64).with_topology(TopologyConstraint::required("rack"));
        let u = e.gang_constraint(&g).unwrap();
        assert_eq!(
            u.to_string(),
            "constraint: 64 GPUs in one rack; the largest rack of pool training, r0, could hold at most 32 of it"
        );
        assert_eq!(u.level(), Some("rack"));
        assert_eq!(e.plan_gang(&g).unwrap_err(), u);
        // A block (2 racks = 64 GPUs) holds it.
        let g = GangRequest::whole_nodes(64).with_topology(TopologyConstraint::required("block"));
        assert!(e.gang_constraint(&g).is_none());
        let p = e.plan_gang(&g).unwrap();
        assert_eq!(racks_of(&p), [("r0", 4), ("r1", 4)]);
        assert_eq!(p.within, ("block".to_string(), "b0".to_string()));
        // Not now: one node busy in each block.
        fill(&mut e, 1, 0, 1);
        fill(&mut e, 2, 8, 1);
        let u = e.plan_gang(&g).unwrap_err();
        assert_eq!(
            u.to_string(),
            "fragmentation: 64 GPUs in one block; no block of pool training has room now (the most, 56, in block b0 of pool training)"
        );
        assert_eq!(u.level(), Some("block"));
        // Preferred goes on to the pool, in the fewest racks: r1 and r3 (4 free nodes each),
        // although block by block would take three.
        let p = e.plan_gang(&GangRequest::whole_nodes(64)).unwrap();
        assert_eq!(racks_of(&p), [("r1", 4), ("r3", 4)]);
        // The whole pool busy beyond the gang: a no-capacity wait naming the pool.
        let u = e.plan_gang(&GangRequest::whole_nodes(128)).unwrap_err();
        assert_eq!(u.code(), "no-capacity");
        assert_eq!(
            u.message(),
            "128 GPUs in one gang; pool training has room for 112 of it now"
        );
    }

    #[test]
    fn segments_stay_within_a_rack() {
        let f = fleet(3, 4, None);
        let mut e = engine(&f);
        // r0: 3 free nodes, r1: 3, r2: 2.
        fill(&mut e, 1, 0, 8);
        fill(&mut e, 2, 4, 8);
        fill(&mut e, 3, 8, 8);
        fill(&mut e, 4, 9, 8);
        // 48 GPUs in segments of 16 (2 nodes): a rack of 3 free nodes holds one segment only.
        let g = GangRequest::whole_nodes(48).with_segment(16);
        let p = e.plan_gang(&g).unwrap();
        let mut counts: Vec<u32> = p.racks.iter().map(|r| r.1).collect();
        counts.sort();
        assert_eq!(counts, [2, 2, 2]);
        // 64 GPUs in segments of 32 (4 nodes): no rack has 4 free nodes; each could hold one.
        let u = e.plan_gang(&GangRequest::whole_nodes(64).with_segment(32)).unwrap_err();
        assert_eq!(
            u.to_string(),
            "no-capacity: 64 GPUs in one gang in segments of 32 GPUs, each within one rack; pool training has room for 0 of it now"
        );
        // Segments larger than any rack can never fit.
        let u = e
            .gang_constraint(&GangRequest::whole_nodes(64).with_segment(64))
            .unwrap();
        assert!(u.is_constraint(), "{u}");
    }

    /// The GPUs of each share: (node, GPUs).
    fn shares_of(p: &GangPlacement) -> Vec<(u32, u32)> {
        p.shares
            .iter()
            .map(|s| (s.node.0, s.grant.gpu_mask().count_ones()))
            .collect()
    }

    #[test]
    fn remainder_share_on_the_tightest_node_of_the_same_rack() {
        let f = fleet(3, 4, None);
        let mut e = engine(&f);
        // r0: only node 3 free (no node with 4 free beside it).
        fill(&mut e, 1, 0, 8);
        fill(&mut e, 2, 1, 8);
        fill(&mut e, 3, 2, 5);
        // r1: node 4 free, node 5 with 4 free, node 6 with 6 free, node 7 full.
        fill(&mut e, 4, 5, 4);
        fill(&mut e, 5, 6, 2);
        fill(&mut e, 6, 7, 8);
        // r2: all free (4 whole nodes: a looser fit than r1's whole node + 4-free node).
        let g = GangRequest::whole_nodes(12)
            .with_remainder()
            .with_topology(TopologyConstraint::required("rack"));
        let p = e.plan_gang(&g).unwrap();
        assert_eq!(racks_of(&p), [("r1", 2)]);
        // 8 on the whole node 4, the remainder 4 on node 5 (4 free, tighter than node 6).
        assert_eq!(shares_of(&p), [(4, 8), (5, 4)]);
        assert_eq!(p.shares[1].grant, Grant::Whole { gpus: 0xF0 });
        assert_eq!(p.shares[1].units, GpuUnits::whole(4));
        let a = e.commit_gang(9, &g, p).unwrap().clone();
        assert_eq!(a.units, GpuUnits::whole(12));
        assert_eq!(e.state().nodes[5].free_gpus(), 0);
        // The next 12: r1 has no whole node left; r2 (all free): 8 + 4 on its first two nodes.
        let p = e.plan_gang(&g).unwrap();
        assert_eq!(racks_of(&p), [("r2", 2)]);
        assert_eq!(shares_of(&p), [(8, 8), (9, 4)]);
        // Released exactly.
        e.release_gang(9).unwrap();
        assert_eq!(e.state().nodes[5].free_gpus(), 4);
        assert_eq!(e.state().nodes[4].free_gpus(), 8);
    }

    #[test]
    fn remainder_waits_without_a_node_for_it_in_the_rack() {
        let f = fleet(2, 2, None);
        let mut e = engine(&f);
        // r0: node 0 free, node 1 with 3 free; r1: node 2 with 3 free, node 3 with 2 free.
        fill(&mut e, 1, 1, 5);
        fill(&mut e, 2, 2, 5);
        fill(&mut e, 3, 3, 6);
        let g = GangRequest::whole_nodes(12)
            .with_remainder()
            .with_topology(TopologyConstraint::required("rack"));
        let before = e.state().clone();
        let u = e.place_gang(7, &g).unwrap_err();
        assert!(!u.is_constraint(), "{u}");
        assert!(matches!(u, GangUnplaceable::NoRoomAtLevel { free: 8, .. }), "{u}");
        assert!(e.state().same_holdings(&before));
        // 8 + 3 would fit r0, as would 4 + 4 (equal shares) nowhere: only the 12 waits.
        assert!(e.plan_gang(&GangRequest::whole_nodes(11).with_remainder()).is_ok());
        // Node 1 frees: r0 holds 8 + 4, the remainder on the first node left.
        e.release(1);
        let p = e.plan_gang(&g).unwrap();
        assert_eq!(shares_of(&p), [(0, 8), (1, 4)]);
    }

    #[test]
    fn remainder_across_racks_takes_the_fewest() {
        // 20 = 8 + 8 + 4 on racks of 2 nodes: no rack holds 3 shares.
        let f = fleet(2, 2, None);
        let mut e = engine(&f);
        fill(&mut e, 1, 2, 4);
        let p = e.plan_gang(&GangRequest::whole_nodes(20).with_remainder()).unwrap();
        assert_eq!(p.within.0, "pool");
        // r0's two whole nodes, the remainder on node 2 (4 free) rather than a whole node.
        assert_eq!(racks_of(&p), [("r0", 2), ("r1", 1)]);
        assert_eq!(shares_of(&p), [(0, 8), (1, 8), (2, 4)]);
        // Racks r0 and r1 each a whole node and a 4-free node, r2 only a 4-free node: counting
        // shares alike would take r0 (2) and r2 (1), but r2 holds no whole share: r1's whole
        // node and r0's whole node and 4-free node instead.
        let f = fleet(3, 2, None);
        let mut e = engine(&f);
        fill(&mut e, 1, 1, 4);
        fill(&mut e, 2, 3, 4);
        fill(&mut e, 3, 4, 4);
        fill(&mut e, 4, 5, 8);
        let p = e.plan_gang(&GangRequest::whole_nodes(20).with_remainder()).unwrap();
        assert_eq!(racks_of(&p), [("r1", 1), ("r0", 2)]);
        assert_eq!(shares_of(&p), [(2, 8), (0, 8), (1, 4)]);
        let a = e
            .commit_gang(5, &GangRequest::whole_nodes(20).with_remainder(), p)
            .unwrap();
        assert_eq!(a.units, GpuUnits::whole(20));
        // A remainder alone (4 on 8-GPU nodes) is one share on the tightest node.
        let p = e.plan_gang(&GangRequest::whole_nodes(4).with_remainder()).unwrap();
        assert_eq!(shares_of(&p), [(3, 4)]);
    }

    #[test]
    fn invalid_and_unknown_levels() {
        let f = fleet(2, 2, None);
        let e = engine(&f);
        // A multiple of the node's 8 GPUs, unless a remainder share is asked for (12 = 8 + 4),
        // up to what the pool holds (4 nodes: 32 GPUs); equal shares need a multiple anyway.
        let u = e.gang_constraint(&GangRequest::whole_nodes(12)).unwrap();
        assert!(matches!(u, GangUnplaceable::Invalid { field: "gpus", .. }), "{u}");
        let mut equal = GangRequest::nodes(3, 4).with_remainder();
        equal.gpus = 14;
        let u = e.gang_constraint(&equal).unwrap();
        assert!(matches!(u, GangUnplaceable::Invalid { field: "gpus", .. }), "{u}");
        assert!(
            e.gang_constraint(&GangRequest::whole_nodes(12).with_remainder())
                .is_none()
        );
        assert!(
            e.gang_constraint(&GangRequest::whole_nodes(28).with_remainder())
                .is_none()
        );
        let u = e
            .gang_constraint(&GangRequest::whole_nodes(36).with_remainder())
            .unwrap();
        assert_eq!(
            u.message(),
            "36 GPUs in one gang; pool training could hold at most 32 of it"
        );
        let u = e
            .gang_constraint(&GangRequest::whole_nodes(16).with_topology(TopologyConstraint::required("block")))
            .unwrap();
        assert_eq!(
            u.to_string(),
            "constraint: no topology level block: the fleet's are rack (and pool)"
        );
        // The seed fleet: training has racks; serving is not a whole pool.
        let seed = Arc::new(Fleet::seed());
        let e = engine(&seed);
        let serving = seed.pool_by_name("serving").unwrap();
        let u = e
            .gang_constraint(&GangRequest::whole_nodes(16).with_pool(serving))
            .unwrap();
        assert!(matches!(u, GangUnplaceable::PoolCannotServe { .. }), "{u}");
        let g = GangRequest::whole_nodes(128).with_topology(TopologyConstraint::preferred("rack"));
        assert!(e.gang_constraint(&g).is_none());
        let u = e.gang_constraint(&GangRequest::whole_nodes(136)).unwrap();
        assert_eq!(
            u.message(),
            "136 GPUs in one gang; pool training could hold at most 128 of it"
        );
    }

    #[test]
    fn flat_pools_take_best_fit_nodes() {
        // No topology above the node (the synthetic fleet has racks).
        let f = Arc::new(
            Fleet::from_toml(
                "[[pool]]\nname = \"training\"\nsharing = \"whole\"\n[[pool.nodes]]\nname = \"h100\"\ncount = 16\ngpu_model = \"H100-80GB-SXM\"\ngpus = 8\ncpus = 112\nmemory_gib = 2048\nnvlink = \"nvswitch\"\n",
                "flat",
            )
            .unwrap(),
        );
        let mut e = engine(&f);
        fill(&mut e, 1, 3, 4);
        let p = e.plan_gang(&GangRequest::nodes(2, 4)).unwrap();
        assert_eq!(p.shares[0].node, NodeId(3));
        assert_eq!(p.within.0, "pool");
        let u = e
            .gang_constraint(&GangRequest::whole_nodes(16).with_topology(TopologyConstraint::required("rack")))
            .unwrap();
        assert!(matches!(u, GangUnplaceable::UnknownLevel { .. }), "{u}");
    }
}
