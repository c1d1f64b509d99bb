//! Provisional bookings and rebinding them to the devices a backend chose.
//!
//! The engine always books exact devices: its accounting per GPU needs them. A backend that is
//! asked for "N devices of this resource on node X" (Kubernetes' stock device plugin, where the
//! kubelet picks the devices) may run the workload on other devices of the same node than the
//! ones booked, and says which afterwards. Under [`DeviceBinding::PerNodeCount`] a commit is
//! therefore provisional until the backend reports: [`Engine::bind`] when it chose the booked
//! devices, [`Engine::rebind`] when it chose others. A rebind moves the booking to the reported
//! devices; where they are booked provisionally by allocations of the same shape (the kubelet
//! handed two pods each other's devices), those take the devices the moved one leaves. Bound
//! allocations are never moved by someone else's rebind.

use std::collections::BTreeSet;

use super::{Booking, CommitError, Engine};
use crate::state::{AllocId, Allocation, Grant};

/// Whether the backend runs workloads on exactly the devices the engine books.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DeviceBinding {
    /// The backend is told the exact GPUs or instance: a commit is bound at once.
    #[default]
    Exact,
    /// The backend is told a number of devices on the node and picks them itself: a commit is
    /// provisional until [`Engine::bind`] or [`Engine::rebind`].
    PerNodeCount,
}

impl Engine {
    /// Sets how the backend binds devices; commits made from now on follow it.
    pub fn set_device_binding(&mut self, binding: DeviceBinding) {
        self.binding = binding;
        self.freed.iter_mut().for_each(|g| *g += 1);
    }

    pub fn device_binding(&self) -> DeviceBinding {
        self.binding
    }

    /// Whether allocation `id` is bound to its devices (`None`: no such allocation).
    pub fn is_bound(&self, id: AllocId) -> Option<bool> {
        self.state
            .allocations
            .contains_key(&id)
            .then(|| !self.state.unbound.contains(&id))
    }

    /// Marks allocation `id` bound: the backend runs it on exactly the devices booked.
    pub fn bind(&mut self, id: AllocId) -> Result<(), CommitError> {
        if !self.state.allocations.contains_key(&id) {
            return Err(CommitError(format!("allocation {id} does not exist")));
        }
        self.state.unbound.remove(&id);
        Ok(())
    }

    /// Moves allocation `id` to `grant` on its node, the devices the backend reports it runs on,
    /// and marks it bound. `grant` must have the allocation's shape (as many whole GPUs, the same
    /// MIG profile, the same fraction). Target devices must be free or booked provisionally by
    /// allocations of the same shape, which then take the devices `id` leaves; in `WholeGpu` mode
    /// a MIG target must be an instance of the GPU's configured layout. Returns the allocations
    /// whose grant changed (empty when `grant` is the booked one). Refused, changing nothing,
    /// otherwise. `id` itself may be bound already: what the backend reports last is where it
    /// runs. Capacity per node and tenant is unchanged, and per GPU it follows the allocations.
    pub fn rebind(&mut self, id: AllocId, grant: Grant) -> Result<Vec<AllocId>, CommitError> {
        let Some(a) = self.state.allocations.get(&id).cloned() else {
            return Err(CommitError(format!("allocation {id} does not exist")));
        };
        if a.grant == grant {
            self.state.unbound.remove(&id);
            return Ok(Vec::new());
        }
        let name = self.fleet.nodes[a.node.0 as usize].name.clone();
        let bad = |m: String| CommitError(format!("cannot rebind allocation {id} on {name}: {m}"));
        if !same_shape(&a.grant, &grant) {
            return Err(bad(format!(
                "it holds {}, not {}",
                describe(&a.grant),
                describe(&grant)
            )));
        }
        let mut last = None;
        for moves in self.rebind_candidates(&a, &grant).map_err(bad)? {
            match self.move_grants(&moves) {
                Ok(()) => {
                    self.state.unbound.remove(&id);
                    return Ok(moves.into_iter().map(|(m, _)| m).collect());
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| bad("the target devices are taken".into())))
    }

    /// The ways to move `a` to `grant`, in order of preference: each a list of (allocation, new
    /// grant), `a` first. `Err` says why the target devices cannot be had.
    fn rebind_candidates(&self, a: &Allocation, grant: &Grant) -> Result<Vec<Vec<(AllocId, Grant)>>, String> {
        let node_gpus = self.fleet.nodes[a.node.0 as usize].gpus;
        let beyond = match *grant {
            Grant::Whole { gpus } => (gpus as u32) >> node_gpus != 0,
            Grant::Mig { gpu, .. } | Grant::Fraction { gpu, .. } => gpu >= node_gpus,
            Grant::CpuOnly => false,
        };
        if beyond {
            return Err(format!("the node has {node_gpus} GPUs"));
        }
        let st = &self.state.nodes[a.node.0 as usize];
        let holders = |g: usize| st.gpus[g].holders.iter().copied().filter(|&h| h != a.id);
        let movable = |h: AllocId, why: &str| -> Result<&Allocation, String> {
            let b = &self.state.allocations[&h];
            if !self.state.unbound.contains(&h) {
                return Err(format!("{why} is held by allocation {h}, which is bound"));
            }
            if !same_shape(&a.grant, &b.grant) {
                return Err(format!(
                    "{why} is held by allocation {h}, which holds {}",
                    describe(&b.grant)
                ));
            }
            Ok(b)
        };
        let mut moves = vec![(a.id, grant.clone())];
        match (&a.grant, grant) {
            (&Grant::Whole { gpus: old }, &Grant::Whole { gpus: new }) => {
                let taken = new & !old;
                let mut freed = old & !new;
                let mut displaced = BTreeSet::new();
                for g in 0..node_gpus as usize {
                    if taken >> g & 1 == 1 {
                        displaced.extend(holders(g));
                    }
                }
                for h in displaced {
                    let Grant::Whole { gpus } = movable(h, "a target GPU")?.grant else {
                        unreachable!("same shape as a whole-GPU grant");
                    };
                    // It takes as many of the GPUs `a` leaves as it loses.
                    let mut next = gpus & !taken;
                    for _ in 0..(gpus & taken).count_ones() {
                        let lowest = freed & freed.wrapping_neg();
                        next |= lowest;
                        freed &= !lowest;
                    }
                    moves.push((h, Grant::Whole { gpus: next }));
                }
                Ok(vec![moves])
            }
            (
                Grant::Mig { .. },
                &Grant::Mig {
                    gpu, profile, start, ..
                },
            ) => {
                let geom = self.fleet.catalogue.get(self.fleet.nodes[a.node.0 as usize].model).mig;
                let Some(p) = geom.and_then(|g| g.profiles.get(profile as usize)) else {
                    return Err("no such MIG profile on this node".into());
                };
                let target = p.mask_at(start);
                let overlapping: Vec<AllocId> = holders(gpu as usize)
                    .filter(|h| match self.state.allocations[h].grant {
                        Grant::Mig { profile, start, .. } => {
                            geom.expect("MIG").profiles[profile as usize].mask_at(start) & target != 0
                        }
                        _ => true,
                    })
                    .collect();
                match overlapping[..] {
                    [] => {}
                    [h] => {
                        let b = movable(h, "the instance")?;
                        if b.grant != *grant {
                            return Err(format!(
                                "the slices are held by allocation {h}, an instance at another start"
                            ));
                        }
                        moves.push((h, a.grant.clone()));
                    }
                    _ => return Err("the slices are held by several instances".into()),
                }
                Ok(vec![moves])
            }
            (Grant::Fraction { .. }, &Grant::Fraction { gpu, .. }) => {
                // Moving may fit beside what the GPU holds; otherwise a provisional fraction of
                // the same shape there takes `a`'s place.
                let mut out = vec![moves];
                for h in holders(gpu as usize) {
                    if self.state.unbound.contains(&h) && self.state.allocations[&h].grant == *grant {
                        out.push(vec![(a.id, grant.clone()), (h, a.grant.clone())]);
                    }
                }
                Ok(out)
            }
            _ => unreachable!("same_shape admits only these pairs"),
        }
    }

    /// Gives each allocation in `moves` its new grant, all or nothing: if one does not fit, the
    /// node is put back exactly as it was.
    fn move_grants(&mut self, moves: &[(AllocId, Grant)]) -> Result<(), CommitError> {
        let n = self.state.allocations[&moves[0].0].node.0;
        let saved = self.state.nodes[n as usize].clone();
        let mut old = Vec::with_capacity(moves.len());
        for (id, _) in moves {
            let a = self.state.allocations.remove(id).expect("moved allocations exist");
            self.apply(&a, false);
            old.push(a);
        }
        for (a, (_, grant)) in old.iter().zip(moves) {
            let moved = Allocation {
                grant: grant.clone(),
                ..a.clone()
            };
            if let Err(e) = self.check_fits(&moved, Booking::Rebind) {
                self.unindex(n, u16::MAX);
                self.state.nodes[n as usize] = saved;
                self.stamp(n);
                self.index(n, u16::MAX);
                for a in old {
                    self.state.allocations.insert(a.id, a);
                }
                return Err(e);
            }
            self.apply(&moved, true);
            self.state.allocations.insert(moved.id, moved);
        }
        Ok(())
    }
}

/// Same kind and size: as many whole GPUs, the same MIG profile, the same fraction.
fn same_shape(a: &Grant, b: &Grant) -> bool {
    match (a, b) {
        (Grant::Whole { gpus: x }, Grant::Whole { gpus: y }) => x.count_ones() == y.count_ones(),
        (
            Grant::Mig {
                profile: p,
                profile_id: i,
                size: s,
                ..
            },
            Grant::Mig {
                profile: q,
                profile_id: j,
                size: t,
                ..
            },
        ) => p == q && i == j && s == t,
        (
            Grant::Fraction {
                milli: m,
                memory_mib: x,
                ..
            },
            Grant::Fraction {
                milli: n,
                memory_mib: y,
                ..
            },
        ) => m == n && x == y,
        (Grant::CpuOnly, Grant::CpuOnly) => true,
        _ => false,
    }
}

/// A grant's shape, for refusals.
fn describe(g: &Grant) -> String {
    match *g {
        Grant::Whole { gpus } => format!("{} whole GPUs", gpus.count_ones()),
        Grant::Mig { profile_id, size, .. } => format!("a MIG instance of profile ID {profile_id} ({size} slices)"),
        Grant::Fraction { milli, memory_mib, .. } => {
            format!("a {milli} milli-GPU fraction with {memory_mib} MiB")
        }
        Grant::CpuOnly => "no GPU".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tessera_model::{Fleet, GpuUnits, NodeId, Request, TenantId};

    use super::*;
    use crate::mig::MigMode;
    use crate::policy::BestFit;
    use crate::state::MigSlot;

    /// The seed fleet, with bookings provisional until bound.
    fn engine() -> Engine {
        let mut e = Engine::new(Arc::new(Fleet::seed()), Box::new(BestFit), 1);
        e.set_device_binding(DeviceBinding::PerNodeCount);
        e
    }

    fn gpus(e: &Engine, id: AllocId) -> u16 {
        e.allocation(id).unwrap().grant.gpu_mask()
    }

    /// GPU units held per node and per tenant.
    fn totals(e: &Engine) -> (Vec<u64>, Vec<(Option<TenantId>, u64)>) {
        let per_node = e
            .state()
            .nodes
            .iter()
            .map(|n| n.gpus.iter().map(|g| g.used_milli as u64).sum())
            .collect();
        let mut per_tenant: Vec<(Option<TenantId>, u64)> = Vec::new();
        for a in e.state().allocations.values() {
            match per_tenant.iter_mut().find(|(t, _)| *t == a.tenant) {
                Some((_, u)) => *u += a.units.as_milli(),
                None => per_tenant.push((a.tenant, a.units.as_milli())),
            }
        }
        per_tenant.sort();
        (per_node, per_tenant)
    }

    #[test]
    fn commits_are_provisional_only_where_the_backend_picks_the_devices() {
        let mut exact = Engine::new(Arc::new(Fleet::seed()), Box::new(BestFit), 1);
        exact.place(1, &Request::whole(1)).unwrap();
        assert_eq!(exact.is_bound(1), Some(true));
        let mut e = engine();
        let a = e.place(1, &Request::whole(1)).unwrap().clone();
        assert_eq!(e.is_bound(1), Some(false));
        e.bind(1).unwrap();
        assert_eq!(e.is_bound(1), Some(true));
        assert_eq!(e.allocation(1).unwrap(), &a, "binding moves nothing");
        assert!(e.bind(2).is_err());
        assert_eq!(e.is_bound(2), None);
        let mut restored = a.clone();
        restored.id = 3;
        restored.grant = Grant::Whole { gpus: 0b10 };
        e.restore(restored).unwrap();
        assert_eq!(e.is_bound(3), Some(true), "restored allocations are bound");
    }

    #[test]
    fn a_trial_release_and_restore_keeps_a_booking_provisional() {
        let mut e = engine();
        let a = e.place(1, &Request::whole(2)).unwrap().clone();
        let released = e.release(1).unwrap();
        e.restore(released).unwrap();
        assert_eq!(e.is_bound(1), Some(false));
        assert_eq!(e.allocation(1).unwrap(), &a);
        // A release followed by a new commit ends the trial: a later restore is bound.
        let r = e.release(1).unwrap();
        e.place(2, &Request::fraction(100)).unwrap();
        e.restore(r).unwrap();
        assert_eq!(e.is_bound(1), Some(true));
    }

    #[test]
    fn rebind_moves_to_free_devices_and_binds() {
        let mut e = engine();
        e.place(1, &Request::whole(1)).unwrap();
        assert_eq!(gpus(&e, 1), 0b1);
        let before = totals(&e);
        assert_eq!(e.rebind(1, Grant::Whole { gpus: 0b1000 }), Ok(vec![1]));
        assert_eq!(gpus(&e, 1), 0b1000);
        assert_eq!(e.is_bound(1), Some(true));
        let node = &e.state().nodes[e.allocation(1).unwrap().node.0 as usize];
        assert_eq!(node.free_mask & 0b1111, 0b0111);
        assert_eq!(totals(&e), before);
        assert_eq!(e.rebind(1, Grant::Whole { gpus: 0b1000 }), Ok(vec![]), "idempotent");
    }

    #[test]
    fn rebind_reaches_the_last_gpu_of_a_sixteen_gpu_node() {
        let text = "[[pool]]\nname = \"whole\"\nsharing = \"whole\"\n[[pool.nodes]]\nname = \"big\"\ncount = 1\ngpu_model = \"H100-80GB-PCIE\"\ngpus = 16\ncpus = 64\nmemory_gib = 256\n";
        let mut e = Engine::new(Arc::new(Fleet::from_toml(text, "test").unwrap()), Box::new(BestFit), 1);
        e.set_device_binding(DeviceBinding::PerNodeCount);
        e.place(1, &Request::whole(1)).unwrap();
        assert_eq!(e.rebind(1, Grant::Whole { gpus: 1 << 15 }), Ok(vec![1]));
        assert_eq!(gpus(&e, 1), 1 << 15);
    }

    #[test]
    fn rebind_swaps_with_a_provisional_booking_of_the_same_shape() {
        let mut e = engine();
        e.place(1, &Request::whole(1)).unwrap();
        e.place(2, &Request::whole(1)).unwrap();
        let (g1, g2) = (gpus(&e, 1), gpus(&e, 2));
        let before = totals(&e);
        assert_eq!(e.rebind(1, Grant::Whole { gpus: g2 }), Ok(vec![1, 2]));
        assert_eq!((gpus(&e, 1), gpus(&e, 2)), (g2, g1));
        assert_eq!(e.is_bound(1), Some(true));
        assert_eq!(e.is_bound(2), Some(false), "the swapped one waits for its own report");
        assert_eq!(e.rebind(2, Grant::Whole { gpus: g1 }), Ok(vec![]));
        assert_eq!(e.is_bound(2), Some(true));
        assert_eq!(totals(&e), before);
    }

    #[test]
    fn a_displaced_gang_takes_the_gpus_the_rebound_one_leaves() {
        let mut e = engine();
        e.place(1, &Request::whole(2)).unwrap();
        e.place(2, &Request::whole(2)).unwrap();
        assert_eq!((gpus(&e, 1), gpus(&e, 2)), (0b0011, 0b1100));
        assert_eq!(e.rebind(1, Grant::Whole { gpus: 0b0110 }), Ok(vec![1, 2]));
        assert_eq!((gpus(&e, 1), gpus(&e, 2)), (0b0110, 0b1001));
    }

    #[test]
    fn rebind_refuses_bound_holders_other_shapes_and_missing_devices_changing_nothing() {
        let mut e = engine();
        e.place(1, &Request::whole(1)).unwrap();
        e.place(2, &Request::whole(1)).unwrap();
        e.place(3, &Request::whole(2)).unwrap();
        e.bind(2).unwrap();
        let before = e.state().clone();
        let (g2, g3) = (gpus(&e, 2), gpus(&e, 3));
        let bound = e.rebind(1, Grant::Whole { gpus: g2 }).unwrap_err();
        assert!(bound.0.contains("allocation 2, which is bound"), "{bound}");
        let other = e
            .rebind(
                1,
                Grant::Whole {
                    gpus: g3 & g3.wrapping_neg(),
                },
            )
            .unwrap_err();
        assert!(other.0.contains("which holds 2 whole GPUs"), "{other}");
        let shape = e.rebind(1, Grant::Whole { gpus: 0b1100_0000 }).unwrap_err();
        assert!(shape.0.contains("it holds 1 whole GPUs, not 2 whole GPUs"), "{shape}");
        let far = e.rebind(1, Grant::Whole { gpus: 1 << 9 }).unwrap_err();
        assert!(far.0.contains("the node has 8 GPUs"), "{far}");
        assert!(e.rebind(9, Grant::Whole { gpus: 1 }).is_err(), "no such allocation");
        assert!(e.state().same_holdings(&before), "refusals change nothing");
    }

    #[test]
    fn fractions_move_beside_others_or_swap_with_the_same_fraction() {
        let mut e = engine();
        let dev = e.fleet().pool_by_name("development").unwrap();
        let t = TenantId(1);
        let r = Request::fraction(600).with_tenant(t).with_pool(dev);
        let a = e.place(1, &r).unwrap().clone();
        let b = e.place(2, &r).unwrap().clone();
        assert_eq!(a.node, b.node);
        let before = totals(&e);
        let Grant::Fraction { gpu: ga, .. } = a.grant else {
            panic!()
        };
        let Grant::Fraction { gpu: gb, .. } = b.grant else {
            panic!()
        };
        // GPU `gb` has no room for a second 600: `2` takes `1`'s GPU.
        let to_b = on_gpu(&a.grant, gb);
        assert_eq!(e.rebind(1, to_b.clone()), Ok(vec![1, 2]));
        assert_eq!(e.allocation(1).unwrap().grant, to_b);
        assert_eq!(e.allocation(2).unwrap().grant, on_gpu(&b.grant, ga));
        assert_eq!(totals(&e), before);
        // A smaller fraction moves beside `1` on its GPU, which has room.
        let small = e
            .place(3, &Request::fraction(300).with_tenant(t).with_pool(dev))
            .unwrap()
            .clone();
        let Grant::Fraction { gpu: gs, .. } = small.grant else {
            panic!()
        };
        let target = if gs == gb { ga } else { gb };
        let moved = on_gpu(&small.grant, target);
        assert_eq!(e.rebind(3, moved), Ok(vec![3]));
        assert_eq!(totals(&e), before_plus(&before, small.node, 300, t));
    }

    fn on_gpu(g: &Grant, gpu: u8) -> Grant {
        let Grant::Fraction { milli, memory_mib, .. } = *g else {
            panic!("not a fraction: {g:?}")
        };
        Grant::Fraction { gpu, milli, memory_mib }
    }

    fn before_plus(
        before: &(Vec<u64>, Vec<(Option<TenantId>, u64)>),
        node: NodeId,
        milli: u64,
        t: TenantId,
    ) -> (Vec<u64>, Vec<(Option<TenantId>, u64)>) {
        let mut out = before.clone();
        out.0[node.0 as usize] += milli;
        out.1.iter_mut().find(|(x, _)| *x == Some(t)).unwrap().1 += milli;
        out
    }

    #[test]
    fn whole_gpu_mig_rebind_swaps_configured_instances_and_never_leaves_the_layout() {
        let text = "[[pool]]\nname = \"mig\"\nsharing = \"mig\"\n[[pool.nodes]]\nname = \"a100\"\ncount = 1\ngpu_model = \"A100-80GB\"\ngpus = 2\ncpus = 64\nmemory_gib = 256\n";
        let mut e = Engine::new(Arc::new(Fleet::from_toml(text, "test").unwrap()), Box::new(BestFit), 1);
        e.set_mig_mode(MigMode::WholeGpu).unwrap();
        e.set_device_binding(DeviceBinding::PerNodeCount);
        let three_g = |start| MigSlot {
            profile: 4,
            profile_id: 9,
            start,
            size: 4,
        };
        e.adopt_layout(NodeId(0), 0, &[three_g(0), three_g(4)]).unwrap();
        let r = Request::mig(&e.fleet().catalogue, "3g.40gb").unwrap();
        let a = e.place(1, &r).unwrap().grant.clone();
        let b = e.place(2, &r).unwrap().grant.clone();
        assert_eq!(e.rebind(1, b.clone()), Ok(vec![1, 2]));
        assert_eq!(
            (&e.allocation(1).unwrap().grant, &e.allocation(2).unwrap().grant),
            (&b, &a)
        );
        assert_eq!(e.mig_layout(NodeId(0), 0), vec![three_g(0), three_g(4)]);
        // GPU 1 has no configured instance: the backend cannot have bound one there.
        let elsewhere = Grant::Mig {
            gpu: 1,
            profile: 4,
            profile_id: 9,
            start: 4,
            size: 4,
        };
        let err = e.rebind(2, elsewhere.clone()).unwrap_err();
        assert!(err.0.contains("not a configured instance"), "{err}");
        assert!(e.mig_layout(NodeId(0), 1).is_empty());
        // Where instances are created one at a time, the same move is fine.
        let mut i = Engine::new(e.fleet().clone(), Box::new(BestFit), 1);
        i.set_device_binding(DeviceBinding::PerNodeCount);
        i.place(1, &r).unwrap();
        assert_eq!(i.rebind(1, elsewhere.clone()), Ok(vec![1]));
        assert_eq!(i.allocation(1).unwrap().grant, elsewhere);
        assert_eq!(i.allocation(1).unwrap().units, GpuUnits::milli(500));
    }

    #[test]
    fn a_mig_rebind_onto_another_profile_s_slices_is_refused() {
        let text = "[[pool]]\nname = \"mig\"\nsharing = \"mig\"\n[[pool.nodes]]\nname = \"a100\"\ncount = 1\ngpu_model = \"A100-80GB\"\ngpus = 1\ncpus = 64\nmemory_gib = 256\n";
        let mut e = Engine::new(Arc::new(Fleet::from_toml(text, "test").unwrap()), Box::new(BestFit), 1);
        e.set_device_binding(DeviceBinding::PerNodeCount);
        let cat = e.fleet().catalogue.clone();
        let a = e.place(1, &Request::mig(&cat, "3g.40gb").unwrap()).unwrap().clone();
        let Grant::Mig { start: s3, .. } = a.grant else {
            panic!()
        };
        let b = e.place(2, &Request::mig(&cat, "1g.10gb").unwrap()).unwrap().clone();
        let before = e.state().clone();
        let inside_3g = Grant::Mig {
            gpu: 0,
            profile: 0,
            profile_id: 19,
            start: s3 + 1,
            size: 1,
        };
        let err = e.rebind(2, inside_3g).unwrap_err();
        assert!(
            err.0
                .contains("held by allocation 1, which holds a MIG instance of profile ID 9"),
            "{err}"
        );
        let as_2g = Grant::Mig {
            gpu: 0,
            profile: 3,
            profile_id: 14,
            start: 0,
            size: 2,
        };
        assert!(
            e.rebind(2, as_2g)
                .unwrap_err()
                .0
                .contains("not a MIG instance of profile ID 14")
        );
        assert!(e.state().same_holdings(&before));
        assert_eq!(e.allocation(2).unwrap(), &b);
    }
}
