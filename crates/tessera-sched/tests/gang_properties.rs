//! Property tests of gang placement beyond one node over random streams of gangs, single-node
//! work and releases on a fleet of racks and blocks.
//!
//! After every step: a gang is placed whole (N GPUs in node-shares of G on distinct nodes, each
//! segment within one rack, the whole gang within one domain of a required level) or not at all
//! (a refused gang changes nothing); it spans the fewest racks any placement could use (so one
//! rack whenever a rack can hold it) and fails only when no placement exists; the engine's
//! bookkeeping matches its allocations; fenced nodes take no share; and once everything is
//! released every GPU is free. Whole-node gangs with a remainder share (8 × K + r) likewise:
//! K whole nodes and the r-GPU share last, in the fewest racks.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use proptest::prelude::*;
use tessera_model::request::{GangRequest, TopologyConstraint};
use tessera_model::{Fleet, NodeId, Request};
use tessera_sched::replay::make_policy;
use tessera_sched::{ClusterState, Engine, GangUnplaceable, Grant};

/// Pool `training`: racks of 2 to 5 nodes of 8 GPUs, two racks a block.
fn fleet() -> Arc<Fleet> {
    let mut text = String::from("[[pool]]\nname = \"training\"\nsharing = \"whole\"\n");
    for (r, count) in [3, 5, 2, 4, 4, 3].into_iter().enumerate() {
        text += &format!(
            "[[pool.nodes]]\nname = \"n{r}\"\ncount = {count}\ngpu_model = \"H100-80GB-SXM\"\ngpus = 8\ncpus = 64\nmemory_gib = 512\nnvlink = \"nvswitch\"\nrack = \"r{r}\"\nblock = \"b{}\"\n",
            r / 2
        );
    }
    Arc::new(Fleet::from_toml(&text, "test").unwrap())
}

#[derive(Clone, Debug)]
enum Op {
    /// A gang: `nodes` shares of `per` GPUs (`per` 8 = whole nodes), segments of `seg` nodes
    /// (0 = none), constraint 0 none, 1 preferred rack, 2 required rack, 3 required block.
    Gang {
        nodes: u8,
        per: u8,
        seg: u8,
        constraint: u8,
    },
    /// A whole-node gang with a remainder share: `whole` whole nodes and `rem` GPUs more
    /// (8 × whole + rem), constraint as above.
    Remainder {
        whole: u8,
        rem: u8,
        constraint: u8,
    },
    /// Single-node work of `gpus` whole GPUs.
    Single {
        gpus: u8,
    },
    Release(usize),
    /// Takes node `n` (modulo) out of placement or back in.
    Fence {
        n: usize,
        fenced: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u8..12, prop::sample::select(vec![1u8, 2, 4, 8]), 0u8..4, 0u8..4)
            .prop_map(|(nodes, per, seg, constraint)| Op::Gang { nodes, per, seg, constraint }),
        2 => (0u8..10, 1u8..8, 0u8..4).prop_map(|(whole, rem, constraint)| Op::Remainder { whole, rem, constraint }),
        2 => (1u8..9).prop_map(|gpus| Op::Single { gpus }),
        2 => any::<usize>().prop_map(Op::Release),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(n, fenced)| Op::Fence { n, fenced }),
    ]
}

fn gang_of(nodes: u8, per: u8, seg: u8, constraint: u8) -> (GangRequest, u32) {
    let nodes = nodes as u32;
    let mut g = if per == 8 {
        GangRequest::whole_nodes(nodes * 8)
    } else {
        GangRequest::nodes(nodes, per)
    };
    // Segments only where they divide the gang.
    let m = if seg > 1 && nodes.is_multiple_of(seg as u32) {
        seg as u32
    } else {
        1
    };
    if m > 1 {
        g = g.with_segment(m * per as u32);
    }
    g = match constraint {
        1 => g.with_topology(TopologyConstraint::preferred("rack")),
        2 => g.with_topology(TopologyConstraint::required("rack")),
        3 => g.with_topology(TopologyConstraint::required("block")),
        _ => g,
    };
    (g, m)
}

/// Per rack, the nodes that hold a share of `per` GPUs (`per` 8: a whole free node) now.
fn rack_caps(f: &Fleet, e: &Engine, st: &ClusterState, per: u8) -> Vec<u32> {
    f.levels
        .domains(0)
        .iter()
        .map(|d| {
            d.nodes
                .iter()
                .filter(|&&n| !e.node_fenced(n) && st.nodes[n as usize].free_gpus() >= per as u32)
                .count() as u32
        })
        .collect()
}

/// What holds of every placed gang: no share on a fenced node, in as many racks as the fewest
/// possible (`expected`), and within one block when its constraint asks for one.
fn where_placed(
    f: &Fleet,
    e: &Engine,
    shares: &[tessera_sched::Allocation],
    expected: Option<usize>,
    one_block: bool,
) -> Result<(), TestCaseError> {
    prop_assert!(
        shares.iter().all(|s| !e.node_fenced(s.node.0)),
        "a share on a fenced node"
    );
    let racks: BTreeSet<u32> = shares.iter().map(|s| f.levels.domain_of(0, s.node).unwrap()).collect();
    prop_assert_eq!(Some(racks.len()), expected, "racks used against the fewest possible");
    if one_block {
        let blocks: BTreeSet<_> = shares.iter().map(|s| f.levels.domain_of(1, s.node)).collect();
        prop_assert_eq!(blocks.len(), 1);
    }
    Ok(())
}

/// The fewest racks that hold `need` segments of `m` nodes, within one block if `block`;
/// `None` if none do.
fn fewest_racks(f: &Fleet, caps: &[u32], need: u32, m: u32, block: Option<bool>) -> Option<usize> {
    let fewest = |racks: Vec<u32>| {
        let mut segs: Vec<u32> = racks.iter().map(|&r| caps[r as usize] / m).collect();
        segs.sort_unstable_by(|a, b| b.cmp(a));
        let mut sum = 0;
        segs.iter()
            .position(|&s| {
                sum += s;
                sum >= need
            })
            .map(|i| i + 1)
    };
    let all: Vec<u32> = (0..caps.len() as u32).collect();
    match block {
        None | Some(false) => fewest(all),
        Some(true) => (0..f.levels.domains(1).len() as u32)
            .filter_map(|b| {
                fewest(
                    all.iter()
                        .copied()
                        .filter(|&r| f.levels.domains(0)[r as usize].parent == Some(b))
                        .collect(),
                )
            })
            .min(),
    }
}

/// The fewest racks that hold `whole` whole nodes and one share of `rem` GPUs more (on a
/// whole node left over or a node with `rem` to 7 GPUs free), by trying every set of racks:
/// one rack if `rack`, within one block if `block`; `None` if none do.
fn fewest_racks_rem(
    f: &Fleet,
    e: &Engine,
    st: &ClusterState,
    whole: u32,
    rem: u8,
    rack: bool,
    block: bool,
) -> Option<usize> {
    let doms = f.levels.domains(0);
    let free = |n: u32| {
        if e.node_fenced(n) {
            0
        } else {
            st.nodes[n as usize].free_gpus()
        }
    };
    let w: Vec<u32> = doms
        .iter()
        .map(|d| d.nodes.iter().filter(|&&n| free(n) == 8).count() as u32)
        .collect();
    let p: Vec<u32> = doms
        .iter()
        .map(|d| d.nodes.iter().any(|&n| (rem as u32..8).contains(&free(n))) as u32)
        .collect();
    (1u32..1 << doms.len())
        .filter(|set| {
            let racks: Vec<usize> = (0..doms.len()).filter(|r| set >> r & 1 == 1).collect();
            let ws: u32 = racks.iter().map(|&r| w[r]).sum();
            let ps: u32 = racks.iter().map(|&r| p[r]).sum();
            let blocks: BTreeSet<_> = racks.iter().map(|&r| doms[r].parent).collect();
            ws >= whole && ws + ps > whole && (!rack || racks.len() == 1) && (!block || blocks.len() == 1)
        })
        .map(|set| set.count_ones() as usize)
        .min()
}

fn check_books(e: &Engine) {
    let st = e.state();
    let mut held: BTreeMap<u32, u16> = BTreeMap::new();
    for a in st.allocations.values() {
        if let Grant::Whole { gpus } = a.grant {
            let m = held.entry(a.node.0).or_default();
            assert_eq!(*m & gpus, 0, "two allocations on one GPU");
            *m |= gpus;
        }
    }
    for (n, node) in st.nodes.iter().enumerate() {
        let h = held.get(&(n as u32)).copied().unwrap_or(0);
        let all = ((1u32 << node.gpus.len()) - 1) as u16;
        assert_eq!(node.free_mask, all & !h, "node {n}: free mask against the allocations");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn gangs_whole_or_nothing_in_the_fewest_racks(ops in prop::collection::vec(op(), 1..60)) {
        let f = fleet();
        let mut e = Engine::new(f.clone(), make_policy("tessera", &[]).unwrap(), 3);
        let empty = e.state().clone();
        let mut gangs: Vec<u64> = Vec::new();
        let mut singles: Vec<u64> = Vec::new();
        let mut next = 1u64;
        for o in ops {
            match o {
                Op::Gang { nodes, per, seg, constraint } => {
                    let (g, m) = gang_of(nodes, per, seg, constraint);
                    let before = e.state().clone();
                    let caps = rack_caps(&f, &e, &before, per);
                    let need = nodes as u32 / m;
                    let block = match constraint { 2 => None, 3 => Some(true), _ => Some(false) };
                    let expected = if constraint == 2 {
                        caps.iter().any(|&c| c / m >= need).then_some(1)
                    } else {
                        fewest_racks(&f, &caps, need, m, block)
                    };
                    next += 1;
                    match e.place_gang(next, &g) {
                        Ok(a) => {
                            let a = a.clone();
                            prop_assert_eq!(a.shares.len() as u32, nodes as u32);
                            let shares: Vec<_> = a.shares.iter().map(|&s| e.allocation(s).unwrap().clone()).collect();
                            let distinct: BTreeSet<NodeId> = shares.iter().map(|s| s.node).collect();
                            prop_assert_eq!(distinct.len(), shares.len());
                            let gpus: u32 = shares.iter().map(|s| s.grant.gpu_mask().count_ones()).sum();
                            prop_assert_eq!(gpus, g.gpus);
                            let rack = |s: &tessera_sched::Allocation| f.levels.domain_of(0, s.node).unwrap();
                            for seg in shares.chunks(m as usize) {
                                prop_assert!(seg.iter().all(|s| rack(s) == rack(&seg[0])), "a segment across racks");
                            }
                            where_placed(&f, &e, &shares, expected, constraint == 3)?;
                            gangs.push(next);
                        }
                        Err(u) => {
                            prop_assert!(e.state().same_holdings(&before), "a refused gang changed the state");
                            prop_assert!(e.gang(next).is_none());
                            if !matches!(u, GangUnplaceable::Invalid { .. }) {
                                prop_assert_eq!(expected, None, "refused, but a placement exists: {}", u);
                            }
                        }
                    }
                }
                Op::Remainder { whole, rem, constraint } => {
                    let (mut g, _) = gang_of(1, 8, 0, constraint);
                    g.gpus = whole as u32 * 8 + rem as u32;
                    let g = g.with_remainder();
                    let before = e.state().clone();
                    let expected = fewest_racks_rem(&f, &e, &before, whole as u32, rem, constraint == 2, constraint == 3);
                    next += 1;
                    match e.place_gang(next, &g) {
                        Ok(a) => {
                            let a = a.clone();
                            prop_assert_eq!(a.shares.len() as u32, whole as u32 + 1);
                            let shares: Vec<_> = a.shares.iter().map(|&s| e.allocation(s).unwrap().clone()).collect();
                            let distinct: BTreeSet<NodeId> = shares.iter().map(|s| s.node).collect();
                            prop_assert_eq!(distinct.len(), shares.len());
                            let sizes: Vec<u32> = shares.iter().map(|s| s.grant.gpu_mask().count_ones()).collect();
                            let mut want = vec![8; whole as usize];
                            want.push(rem as u32);
                            prop_assert_eq!(sizes, want, "whole nodes, then the remainder");
                            where_placed(&f, &e, &shares, expected, constraint == 3)?;
                            gangs.push(next);
                        }
                        Err(u) => {
                            prop_assert!(e.state().same_holdings(&before), "a refused gang changed the state");
                            prop_assert!(e.gang(next).is_none());
                            prop_assert_eq!(expected, None, "refused, but a placement exists: {}", u);
                        }
                    }
                }
                Op::Fence { n, fenced } => e.fence_node((n % f.nodes.len()) as u32, fenced),
                Op::Single { gpus } => {
                    next += 1;
                    if e.place(next, &Request::whole(gpus)).is_ok() {
                        singles.push(next);
                    }
                }
                Op::Release(i) => {
                    let total = gangs.len() + singles.len();
                    if total > 0 {
                        let i = i % total;
                        if i < gangs.len() {
                            let id = gangs.swap_remove(i);
                            let shares = e.gang(id).unwrap().shares.clone();
                            e.release_gang(id).unwrap();
                            prop_assert!(shares.iter().all(|&s| e.allocation(s).is_none()));
                        } else {
                            e.release(singles.swap_remove(i - gangs.len())).unwrap();
                        }
                    }
                }
            }
            check_books(&e);
        }
        for id in gangs {
            e.release_gang(id).unwrap();
        }
        for id in singles {
            e.release(id).unwrap();
        }
        prop_assert!(e.state().same_holdings(&empty), "capacity not conserved");
        prop_assert_eq!(e.gangs().count(), 0);
    }
}
