//! The MIG placer for GPUs laid out as a whole ([`MigMode::WholeGpu`]), and the engine's view of
//! configured layouts.
//!
//! The GPU Operator's MIG manager applies a GPU's layout (its configured instances) at once and
//! only while none of its instances is in use. So a GPU carries a configured layout besides its
//! occupancy, and a request for a profile takes, in order:
//! 1. a free configured instance on a GPU that already has work: idle GPUs stay idle, the only
//!    ones that can be laid out again;
//! 2. a free configured instance on an idle GPU;
//! 3. an idle GPU laid out again: the new instance at the start the [`MigTable`] deems best for an
//!    empty GPU, plus the configured instances that can stay (fewer changes, and later demand for
//!    the same profiles finds them). Among idle GPUs, the one whose layout loses the fewest
//!    memory slices, then the fullest layout (empty GPUs stay free for large profiles).
//!
//! Free configured instances are indexed per (pool, model, profile) and idle GPUs per (pool,
//! model, layout key), like the occupancy buckets of `Instance` mode: a decision never scans the
//! fleet.
//!
//! [`MigTable`]: crate::mig::MigTable

use std::cmp::Reverse;
use std::collections::BTreeSet;

use tessera_model::layout::{Placed, validate, with_instance};
use tessera_model::request::MigChoice;
use tessera_model::{MigGeometry, ModelId, NodeId, PoolId, Request, Sharing};

use super::{Booking, CommitError, Engine};
use crate::mig::{MigMode, layout_key};
use crate::state::{GpuState, Grant, MigSlot, Placement};

/// Free configured instances and idle GPUs of one (pool, model).
#[derive(Clone)]
pub(super) struct LayoutIndex {
    /// `free[profile][idle]`: free configured instances `(node, gpu, start)`, apart for GPUs with
    /// work (`idle = 0`) and idle GPUs (`idle = 1`).
    free: Vec<[BTreeSet<(u32, u8, u8)>; 2]>,
    /// Idle GPUs `(node, gpu)` by the key of their configured layout ([`layout_key`]).
    idle: Vec<BTreeSet<(u32, u8)>>,
}

impl LayoutIndex {
    fn new(geom: &MigGeometry) -> Self {
        LayoutIndex {
            free: (0..geom.profiles.len()).map(|_| Default::default()).collect(),
            idle: vec![BTreeSet::new(); 1 << (geom.mem_slices + 1)],
        }
    }
}

impl Engine {
    /// Chooses how MIG GPUs are partitioned, to match the backend. Set it before anything is
    /// placed or restored: it is refused while allocations exist. Switching clears every
    /// configured layout.
    pub fn set_mig_mode(&mut self, mode: MigMode) -> Result<(), CommitError> {
        if mode == self.mig_mode {
            return Ok(());
        }
        if !self.state.allocations.is_empty() {
            return Err(CommitError(format!(
                "the MIG mode is set before anything is placed; {} allocations exist",
                self.state.allocations.len()
            )));
        }
        self.mig_index.clear();
        self.layout_index.clear();
        self.mig_mode = mode;
        self.freed.iter_mut().for_each(|g| *g += 1);
        let fleet = self.fleet.clone();
        for (n, node) in fleet.nodes.iter().enumerate() {
            if fleet.pool(node.pool).sharing != Sharing::Mig {
                continue;
            }
            for g in &mut self.state.nodes[n].gpus {
                g.mig_layout.clear();
            }
            self.index(n as u32, u16::MAX);
        }
        Ok(())
    }

    pub fn mig_mode(&self) -> MigMode {
        self.mig_mode
    }

    /// The MIG instances of GPU `gpu` on `node`, ordered by start: in `WholeGpu` mode its
    /// configured layout (in use or free), in `Instance` mode the instances in use (the only
    /// ones that exist). Empty for GPUs that are not partitioned with MIG.
    pub fn mig_layout(&self, node: NodeId, gpu: u8) -> Vec<MigSlot> {
        let Some(geom) = self.mig_geometry(node) else {
            return Vec::new();
        };
        let Some(g) = self.state.nodes[node.0 as usize].gpus.get(gpu as usize) else {
            return Vec::new();
        };
        let slot = |p: &Placed| MigSlot::of(geom, p);
        match self.mig_mode {
            MigMode::WholeGpu => g.mig_layout.iter().map(slot).collect(),
            MigMode::Instance => {
                let mut slots: Vec<MigSlot> = g
                    .holders
                    .iter()
                    .filter_map(|h| match self.state.allocations[h].grant {
                        Grant::Mig { profile, start, .. } => Some(slot(&Placed { profile, start })),
                        _ => None,
                    })
                    .collect();
                slots.sort_unstable_by_key(|s| s.start);
                slots
            }
        }
    }

    /// Sets the configured layout of GPU `gpu` on `node` from what the backend reports (at
    /// start-up, or when it announces a layout change), in `WholeGpu` mode. Refused, changing
    /// nothing, when a slot does not match the model's geometry, when the layout is invalid
    /// (placement tables, per-profile limits, at most one `+me` instance), or when it lacks an
    /// instance in use.
    pub fn adopt_layout(&mut self, node: NodeId, gpu: u8, slots: &[MigSlot]) -> Result<(), CommitError> {
        let n = node.0 as usize;
        let name = self.fleet.nodes.get(n).map_or("?", |x| x.name.as_str());
        let bad = |m: String| Err(CommitError(format!("layout of GPU {gpu} on {name}: {m}")));
        if self.mig_mode != MigMode::WholeGpu {
            return bad("instances are created one at a time here; only whole-GPU layouts are adopted".into());
        }
        let Some(geom) = self.mig_geometry(node) else {
            return bad("not a MIG GPU".into());
        };
        let Some(g) = self.state.nodes[n].gpus.get(gpu as usize) else {
            return bad("no such GPU".into());
        };
        let mut layout = Vec::with_capacity(slots.len());
        for s in slots {
            match geom.profiles.get(s.profile as usize) {
                Some(p) if p.id == s.profile_id && p.mem_slices == s.size => layout.push(Placed {
                    profile: s.profile,
                    start: s.start,
                }),
                _ => {
                    return bad(format!(
                        "profile index {} is not profile ID {} of {} slices in the {} geometry",
                        s.profile, s.profile_id, s.size, geom.name
                    ));
                }
            }
        }
        // One rule everywhere: `validate` includes the single media-engine set (rule 4).
        if let Err(e) = validate(geom, &layout) {
            return bad(e.to_string());
        }
        for h in &g.holders {
            if let Grant::Mig { profile, start, .. } = self.state.allocations[h].grant
                && !layout.contains(&Placed { profile, start })
            {
                return bad(format!(
                    "allocation {h} uses profile ID {} at slice {start}, which the layout drops",
                    geom.profiles[profile as usize].id
                ));
            }
        }
        layout.sort_unstable_by_key(|p| p.start);
        self.unindex(node.0, 1 << gpu);
        self.state.nodes[n].gpus[gpu as usize].mig_layout = layout;
        self.stamp(node.0);
        self.index(node.0, 1 << gpu);
        self.freed_on(node.0);
        Ok(())
    }

    /// The MIG geometry of `node`'s GPUs if it is in a MIG pool.
    fn mig_geometry(&self, node: NodeId) -> Option<&'static MigGeometry> {
        let fnode = self.fleet.nodes.get(node.0 as usize)?;
        if self.fleet.pool(fnode.pool).sharing != Sharing::Mig {
            return None;
        }
        self.fleet.catalogue.get(fnode.model).mig
    }

    pub(super) fn choose_mig_whole_gpu(
        &mut self,
        pool: PoolId,
        req: &Request,
        choice: &MigChoice,
    ) -> Option<Placement> {
        for idle in [false, true] {
            for &(model, pi) in &choice.options {
                if !req.allows_model(model) {
                    continue;
                }
                let Some(index) = self.layout_index.get(&(pool.0, model.0)) else {
                    continue;
                };
                if let Some(&(n, g, start)) = index.free[pi as usize][idle as usize]
                    .iter()
                    .find(|&&(n, g, _)| self.host_fits(n, req) && !self.gpu_fenced(n, g))
                {
                    return Some(self.mig_placement(n, g, model, pi, start, false));
                }
            }
        }
        // (slices the layout loses, Reverse(slices it keeps), model, profile, layout key, start)
        let mut cands: Vec<(u32, Reverse<u32>, u16, u8, usize, u8)> = Vec::new();
        for &(model, pi) in &choice.options {
            if !req.allows_model(model) {
                continue;
            }
            let Some(index) = self.layout_index.get(&(pool.0, model.0)) else {
                continue;
            };
            let table = self.mig_tables[model.0 as usize]
                .as_ref()
                .expect("MIG model has a table");
            let Some((start, _)) = table.best(0, pi as usize) else {
                continue;
            };
            let geom = table.geom;
            let p = &geom.profiles[pi as usize];
            let new = p.mask_at(start);
            for (key, bucket) in index.idle.iter().enumerate() {
                if bucket.is_empty() {
                    continue;
                }
                let configured = key as u16 & geom.full_mask();
                let me = key >> geom.mem_slices & 1 == 1;
                let lost = (configured & new).count_ones() + (me && p.media_extensions) as u32;
                let kept = (configured & !new).count_ones();
                cands.push((lost, Reverse(kept), model.0, pi, key, start));
            }
        }
        cands.sort_unstable();
        for (_, _, model, pi, key, start) in cands {
            let bucket = &self.layout_index[&(pool.0, model)].idle[key];
            if let Some(&(n, g)) = bucket
                .iter()
                .find(|&&(n, g)| self.host_fits(n, req) && !self.gpu_fenced(n, g))
            {
                return Some(self.mig_placement(n, g, ModelId(model), pi, start, true));
            }
        }
        None
    }

    fn mig_placement(&self, n: u32, gpu: u8, model: ModelId, pi: u8, start: u8, relayout: bool) -> Placement {
        let gm = self.fleet.catalogue.get(model);
        let p = &gm.mig.expect("MIG model").profiles[pi as usize];
        Placement {
            node: NodeId(n),
            grant: Grant::Mig {
                gpu,
                profile: pi,
                profile_id: p.id,
                start,
                size: p.mem_slices,
            },
            units: gm.profile_units(p),
            relayout,
        }
    }

    /// Adds or removes the `WholeGpu` index entries of the GPUs in `gpus` on node `n`.
    // Out of line: `reindex` runs twice per placement in `Instance` mode too.
    #[inline(never)]
    pub(super) fn reindex_layouts(&mut self, n: u32, gpus: u16, insert: bool) {
        let node = &self.fleet.nodes[n as usize];
        let Some(geom) = self.fleet.catalogue.get(node.model).mig else {
            return;
        };
        let index = self
            .layout_index
            .entry((node.pool.0, node.model.0))
            .or_insert_with(|| LayoutIndex::new(geom));
        for (i, g) in self.state.nodes[n as usize].gpus.iter().enumerate() {
            if gpus >> i & 1 == 0 {
                continue;
            }
            let idle = g.holders.is_empty();
            for p in &g.mig_layout {
                if geom.profiles[p.profile as usize].mask_at(p.start) & g.mig_mask != 0 {
                    continue;
                }
                let set = &mut index.free[p.profile as usize][idle as usize];
                if insert {
                    set.insert((n, i as u8, p.start));
                } else {
                    set.remove(&(n, i as u8, p.start));
                }
            }
            if idle {
                let set = &mut index.idle[layout_key(geom, &g.mig_layout)];
                if insert {
                    set.insert((n, i as u8));
                } else {
                    set.remove(&(n, i as u8));
                }
            }
        }
    }
}

/// What a `WholeGpu` booking of the instance `(profile, start)` on GPU `g` requires of its
/// layout: a commit lays the GPU out anew exactly when the instance is not configured, and only
/// while the GPU has no holder; a rebind targets a configured instance; a restore may add its
/// instance to the layout (it exists on the backend).
// Out of line, like `configure`: the commit path of `Instance` mode stays as small as it was.
#[inline(never)]
pub(super) fn check_layout(g: &GpuState, profile: u8, start: u8, how: Booking) -> Result<(), &'static str> {
    let configured = g.mig_layout.contains(&Placed { profile, start });
    match how {
        Booking::Commit { relayout } if relayout == configured => Err(if relayout {
            "stale placement: the instance is configured already"
        } else {
            "stale placement: the instance is no longer configured"
        }),
        Booking::Commit { .. } if !configured && !g.holders.is_empty() => {
            Err("the GPU has instances in use, so its layout cannot change")
        }
        Booking::Rebind if !configured => Err("not a configured instance of the GPU's layout"),
        _ => Ok(()),
    }
}

/// Makes sure the instance being booked is part of `g`'s layout (`check_layout` has made sure
/// the layout may change if it is not).
#[inline(never)]
pub(super) fn configure(geom: &MigGeometry, g: &mut GpuState, profile: u8, start: u8) {
    let placed = Placed { profile, start };
    if !g.mig_layout.contains(&placed) {
        g.mig_layout = with_instance(geom, &g.mig_layout, placed);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tessera_model::{Fleet, GpuUnits, Request};

    use super::*;
    use crate::policy::BestFit;
    use crate::state::Allocation;

    /// One A100-80GB node with `gpus` GPUs in a MIG pool, in `mode`.
    /// One GPU in `WholeGpu` mode laid out as two 3g.40gb instances (at slices 0 and 4).
    fn two_3g() -> Engine {
        let mut e = engine(1, MigMode::WholeGpu);
        e.adopt_layout(NodeId(0), 0, &[slot(9, 0), slot(9, 4)]).unwrap();
        e
    }

    fn engine(gpus: u8, mode: MigMode) -> Engine {
        let text = format!(
            "[[pool]]\nname = \"mig\"\nsharing = \"mig\"\n[[pool.nodes]]\nname = \"a100\"\ncount = 1\ngpu_model = \"A100-80GB\"\ngpus = {gpus}\ncpus = 64\nmemory_gib = 256\n"
        );
        let mut e = Engine::new(Arc::new(Fleet::from_toml(&text, "test").unwrap()), Box::new(BestFit), 1);
        e.set_mig_mode(mode).unwrap();
        e
    }

    fn req(e: &Engine, profile: &str) -> Request {
        Request::mig(&e.fleet().catalogue, profile).unwrap()
    }

    /// A slot of profile ID `id` at `start` on the A100's 8-slice geometry.
    fn slot(id: u32, start: u8) -> MigSlot {
        slot_of(&tessera_model::catalogue::MIG_8_SLICE, id, start)
    }

    /// A slot of profile ID `id` at `start` on geometry `g`.
    fn slot_of(g: &MigGeometry, id: u32, start: u8) -> MigSlot {
        let profile = g.profile_index(id).unwrap() as u8;
        MigSlot::of(g, &Placed { profile, start })
    }

    /// `(gpu, start)` of a MIG grant.
    fn at(p: &Grant) -> (u8, u8) {
        match *p {
            Grant::Mig { gpu, start, .. } => (gpu, start),
            ref other => panic!("not a MIG grant: {other:?}"),
        }
    }

    #[test]
    fn a_free_configured_instance_on_a_gpu_with_work_comes_first() {
        let mut e = engine(2, MigMode::WholeGpu);
        let two_3g = [slot(9, 0), slot(9, 4)];
        e.adopt_layout(NodeId(0), 0, &two_3g).unwrap();
        e.adopt_layout(NodeId(0), 1, &two_3g).unwrap();
        let r = req(&e, "3g.40gb");
        let a = e.plan(&r).unwrap();
        assert!(!a.relayout, "a configured instance needs no new layout");
        let first = at(&a.grant);
        e.commit(1, &r, a).unwrap();
        let b = e.plan(&r).unwrap();
        assert!(!b.relayout);
        assert_eq!(at(&b.grant).0, first.0, "the GPU with work, keeping the other idle");
        assert_ne!(at(&b.grant).1, first.1);
        e.commit(2, &r, b).unwrap();
        let c = e.place(3, &r).unwrap().clone();
        assert_ne!(at(&c.grant).0, first.0, "then the idle GPU's instance");
        assert_eq!(e.mig_layout(NodeId(0), 0), two_3g);
        assert_eq!(e.mig_layout(NodeId(0), 1), two_3g);
    }

    #[test]
    fn an_idle_gpu_is_laid_out_again_around_the_new_instance_keeping_what_fits() {
        let mut e = two_3g();
        let r = req(&e, "1g.10gb");
        let p = e.plan(&r).unwrap();
        assert!(p.relayout, "no 1g is configured: the idle GPU gets a new layout");
        let (_, start) = at(&p.grant);
        let table = crate::mig::MigTable::new(&tessera_model::catalogue::MIG_8_SLICE);
        assert_eq!(
            Some(start),
            table.best(0, 0).map(|b| b.0),
            "the best start on an empty GPU"
        );
        e.commit(1, &r, p).unwrap();
        let kept = if start < 4 { slot(9, 4) } else { slot(9, 0) };
        let mut expected = vec![kept, slot(19, start)];
        expected.sort_unstable_by_key(|s| s.start);
        assert_eq!(
            e.mig_layout(NodeId(0), 0),
            expected,
            "the 3g that does not overlap stays configured"
        );
    }

    #[test]
    fn the_idle_gpu_that_loses_least_and_keeps_most_is_laid_out() {
        let mut e = engine(3, MigMode::WholeGpu);
        e.adopt_layout(NodeId(0), 0, &[slot(9, 0), slot(9, 4)]).unwrap();
        e.adopt_layout(NodeId(0), 2, &[slot(9, 4)]).unwrap();
        // A 4g can only start at 0: GPU 0 would lose a 3g, GPUs 1 and 2 lose nothing, and GPU 2
        // keeps its 3g beside it, leaving GPU 1 empty for a 7g.
        let a = e.place(1, &req(&e, "4g.40gb")).unwrap().clone();
        assert_eq!(at(&a.grant), (2, 0));
        assert_eq!(e.mig_layout(NodeId(0), 2), vec![slot(5, 0), slot(9, 4)]);
        let b = e.place(2, &req(&e, "7g.80gb")).unwrap().clone();
        assert_eq!(at(&b.grant), (1, 0));
        assert_eq!(e.mig_layout(NodeId(0), 0), vec![slot(9, 0), slot(9, 4)], "untouched");
    }

    #[test]
    fn a_gpu_with_a_holder_is_never_laid_out_again() {
        let mut e = engine(1, MigMode::WholeGpu);
        let a = e.place(1, &req(&e, "3g.40gb")).unwrap().clone();
        assert_eq!(at(&a.grant), (0, 4));
        let layout = e.mig_layout(NodeId(0), 0);
        // Slices 0..3 are free, but a 4g there would change the layout of a GPU in use.
        let r = req(&e, "4g.40gb");
        assert!(e.plan(&r).is_err());
        let forced = Placement {
            node: NodeId(0),
            grant: Grant::Mig {
                gpu: 0,
                profile: 5,
                profile_id: 5,
                start: 0,
                size: 4,
            },
            units: GpuUnits::milli(500),
            relayout: true,
        };
        let err = e.commit(2, &r, forced).unwrap_err();
        assert!(err.0.contains("layout cannot change"), "{err}");
        assert_eq!(e.mig_layout(NodeId(0), 0), layout);
        // Instance mode creates the 4g beside the running 3g.
        let mut i = engine(1, MigMode::Instance);
        i.place(1, &req(&i, "3g.40gb")).unwrap();
        assert_eq!(at(&i.place(2, &r).unwrap().grant), (0, 0));
    }

    #[test]
    fn release_leaves_the_instance_configured_for_the_next_request() {
        let mut e = engine(2, MigMode::WholeGpu);
        let before = e.state().clone();
        let r = req(&e, "2g.20gb");
        let a = e.place(1, &r).unwrap().clone();
        e.release(1).unwrap();
        assert!(e.state().same_occupancy(&before), "the occupancy is back");
        assert!(!e.state().same_holdings(&before), "the layout stays");
        let (gpu, start) = at(&a.grant);
        assert_eq!(e.mig_layout(NodeId(0), gpu), vec![slot(14, start)]);
        let p = e.plan(&r).unwrap();
        assert!(!p.relayout);
        assert_eq!(p.grant, a.grant, "the same instance again");
    }

    #[test]
    fn a_placement_made_stale_by_a_layout_change_is_refused() {
        let mut e = engine(1, MigMode::WholeGpu);
        let r = req(&e, "3g.40gb");
        let p = e.plan(&r).unwrap();
        assert!(p.relayout);
        let (_, start) = at(&p.grant);
        e.adopt_layout(NodeId(0), 0, &[slot(9, start)]).unwrap();
        let err = e.commit(1, &r, p).unwrap_err();
        assert!(err.0.contains("stale"), "{err}");
        assert!(e.allocation(1).is_none());
    }

    #[test]
    fn adopt_layout_refuses_invalid_layouts_and_dropping_instances_in_use() {
        let mut e = engine(1, MigMode::WholeGpu);
        let n = NodeId(0);
        let overlap = e.adopt_layout(n, 0, &[slot(9, 0), slot(14, 2)]).unwrap_err();
        assert!(overlap.0.contains("share memory slice 2"), "{overlap}");
        let mut wrong = slot(9, 0);
        wrong.profile_id = 5;
        assert!(e.adopt_layout(n, 0, &[wrong]).is_err(), "profile index and ID disagree");
        assert!(e.adopt_layout(n, 1, &[]).is_err(), "no such GPU");
        assert!(e.mig_layout(n, 0).is_empty(), "refusals change nothing");
        let a = e.place(1, &req(&e, "3g.40gb")).unwrap().clone();
        let (_, start) = at(&a.grant);
        let drop = e.adopt_layout(n, 0, &[slot(9, 4 - start)]).unwrap_err();
        assert!(drop.0.contains("allocation 1"), "{drop}");
        e.adopt_layout(n, 0, &[slot(9, 0), slot(9, 4)]).unwrap();
        assert_eq!(e.mig_layout(n, 0), vec![slot(9, 0), slot(9, 4)]);
        // The new free 3g is found again.
        let b = e.place(2, &req(&e, "3g.40gb")).unwrap().clone();
        assert_eq!(at(&b.grant), (0, 4 - start));
        let mut i = engine(1, MigMode::Instance);
        assert!(
            i.adopt_layout(n, 0, &[slot(9, 0)]).is_err(),
            "Instance mode has no layouts"
        );
    }

    #[test]
    fn adopt_layout_refuses_two_media_extension_instances() {
        let text = "[[pool]]\nname = \"mig\"\nsharing = \"mig\"\n[[pool.nodes]]\nname = \"a30\"\ncount = 1\ngpu_model = \"A30-24GB\"\ngpus = 1\ncpus = 64\nmemory_gib = 256\n";
        let mut e = Engine::new(Arc::new(Fleet::from_toml(text, "test").unwrap()), Box::new(BestFit), 1);
        e.set_mig_mode(MigMode::WholeGpu).unwrap();
        let g = &tessera_model::catalogue::MIG_A30;
        let a30 = |id: u32, start: u8| slot_of(g, id, start);
        // 1g.6gb+me and 2g.12gb+me are different profiles, one instance each, yet both want the
        // GPU's only JPEG decoder and OFA.
        let err = e.adopt_layout(NodeId(0), 0, &[a30(21, 0), a30(6, 2)]).unwrap_err();
        assert!(err.0.contains("more than one +me"), "{err}");
        assert!(e.mig_layout(NodeId(0), 0).is_empty());
        let one = [a30(21, 0), a30(14, 1), a30(5, 2)];
        e.adopt_layout(NodeId(0), 0, &one).unwrap();
        assert_eq!(e.mig_layout(NodeId(0), 0), one);
    }

    #[test]
    fn restore_puts_the_instance_into_the_layout() {
        let mut e = two_3g();
        let r = req(&e, "1g.10gb");
        let a = Allocation {
            id: 7,
            node: NodeId(0),
            grant: Grant::Mig {
                gpu: 0,
                profile: 0,
                profile_id: 19,
                start: 5,
                size: 1,
            },
            cpu_milli: r.cpu_milli,
            memory_mib: r.memory_mib,
            tenant: None,
            units: GpuUnits::milli(125),
        };
        e.restore(a).unwrap();
        assert_eq!(e.mig_layout(NodeId(0), 0), vec![slot(9, 0), slot(19, 5)]);
        assert_eq!(e.is_bound(7), Some(true));
    }

    #[test]
    fn the_mig_mode_is_set_before_anything_is_placed() {
        let mut e = engine(1, MigMode::Instance);
        e.place(1, &req(&e, "3g.40gb")).unwrap();
        assert!(e.set_mig_mode(MigMode::WholeGpu).is_err());
        assert_eq!(e.mig_mode(), MigMode::Instance);
        e.release(1).unwrap();
        e.set_mig_mode(MigMode::WholeGpu).unwrap();
        assert!(e.place(2, &req(&e, "3g.40gb")).is_ok());
    }

    #[test]
    fn in_instance_mode_the_layout_is_the_instances_in_use() {
        let mut e = engine(1, MigMode::Instance);
        e.place(1, &req(&e, "3g.40gb")).unwrap();
        e.place(2, &req(&e, "1g.10gb")).unwrap();
        let starts: Vec<(u32, u8)> = e
            .mig_layout(NodeId(0), 0)
            .iter()
            .map(|s| (s.profile_id, s.start))
            .collect();
        assert_eq!(starts.len(), 2);
        assert!(starts.windows(2).all(|w| w[0].1 < w[1].1), "ordered by start");
        e.release(1).unwrap();
        e.release(2).unwrap();
        assert!(
            e.mig_layout(NodeId(0), 0).is_empty(),
            "released instances are destroyed"
        );
    }
}
