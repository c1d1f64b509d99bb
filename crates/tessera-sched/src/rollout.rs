//! Rolling-upgrade planning, pure: which node goes next and whether the limits allow it, and a
//! time-stepped model of a whole rollout to compare plans.
//!
//! A node's *free time* is when the last work that cannot move ends (batch work and gangs run
//! to completion or to their lease; services move to a replacement elsewhere and do not hold
//! a node). The plan takes nodes whose work ends soonest first, never more than
//! `max_parallel` nodes nor `max_unavailable` GPU units out at once (one node is always
//! allowed, so a rollout cannot stall on a node larger than the unit limit).
//!
//! A node is taken (cordoned) only when its free time is within `ahead_ms` ([`take_now`]):
//! until then it keeps serving, so a slot free for the rollout does not turn a node with
//! hours of work left into hours of idle GPUs. Only when nothing of the rollout is out does it
//! take the soonest node however far its free time (nothing better is coming, and a busy pool
//! whose nodes always get new work must not stall the rollout).
//!
//! [`simulate`] walks a rollout in time: **drain-aware** (this plan: services move, nothing
//! is cut off, a node is cordoned only when its turn comes) or **naive** (as the GPU
//! Operator's upgrade controller: nodes in fleet order, cordon, wait up to a deadline, then
//! evict what is left — cut-offs, and the work they had done is lost). Capacity lost counts
//! GPU-unit-hours a node is out of placement without running work (idle while draining, and
//! the upgrade itself) plus the work thrown away by cut-offs.

/// The end of work that neither ends on its own nor moves (batch or interactive work without
/// a duration): a drain waits for it until its deadline, if it has one.
pub const NEVER: i64 = i64::MAX;

/// One piece of work on a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Work {
    /// Thousandths of a GPU.
    pub units_milli: u64,
    /// When it ends (ms; [`NEVER`] when it does not on its own); `None`: a service, which
    /// moves off a draining node.
    pub end_ms: Option<i64>,
    /// When it started (ms), for the work a cut-off loses.
    pub start_ms: i64,
}

/// A node to upgrade.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    /// Its GPU units (thousandths).
    pub units_milli: u64,
    pub work: Vec<Work>,
}

impl Node {
    /// When the last work that cannot move ends (ms; [`NEVER`] if some never does), `now` if
    /// none.
    pub fn free_at(&self, now: i64) -> i64 {
        self.work.iter().filter_map(|w| w.end_ms).fold(now, i64::max)
    }
}

/// How many nodes and GPU units may be out at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_parallel: usize,
    pub max_unavailable_milli: u64,
}

/// The order a drain-aware rollout takes: soonest free first; ties by fewer units, then name.
pub fn order(nodes: &[Node], now: i64) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..nodes.len()).collect();
    idx.sort_by(|&a, &b| {
        let (x, y) = (&nodes[a], &nodes[b]);
        (x.free_at(now), x.units_milli, &x.name).cmp(&(y.free_at(now), y.units_milli, &y.name))
    });
    idx
}

/// Whether one more node of `units` may go out while `out_nodes` nodes holding `out_units`
/// are out.
pub fn admits(limits: Limits, out_nodes: usize, out_units: u64, units: u64) -> bool {
    out_nodes == 0 || (out_nodes < limits.max_parallel && out_units + units <= limits.max_unavailable_milli)
}

/// The nodes to take now, in plan order: soonest free first while the limits allow, each
/// only if its free time is within `ahead_ms` of `now`, or the soonest one when nothing is out
/// (`out_nodes == 0`) whatever its free time.
pub fn take_now(
    nodes: &[Node],
    now: i64,
    limits: Limits,
    out_nodes: usize,
    out_units: u64,
    ahead_ms: i64,
) -> Vec<usize> {
    let mut taken = Vec::new();
    let (mut n_out, mut u_out) = (out_nodes, out_units);
    for k in order(nodes, now) {
        let n = &nodes[k];
        let near = n.free_at(now) <= now + ahead_ms;
        if !(near || n_out == 0) || !admits(limits, n_out, u_out, n.units_milli) {
            break;
        }
        taken.push(k);
        n_out += 1;
        u_out += n.units_milli;
    }
    taken
}

/// The kind of rollout [`simulate`] walks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Soonest free first, each node taken only when its free time is `ahead_ms` away or less
    /// (see [`take_now`]).
    DrainAware { ahead_ms: i64 },
    /// Fleet order; evict what is left `deadline_ms` after cordoning.
    Naive { deadline_ms: i64 },
}

/// What a rollout cost.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// From the start to the last node back in placement.
    pub duration_ms: i64,
    /// GPU-unit-hours out of placement without running work, plus work thrown away.
    pub lost_unit_hours: f64,
    /// Work stopped before it ended (services included in a naive rollout).
    pub cut_offs: usize,
    /// Nodes that went through maintenance, in order, with (out, back) times.
    pub timeline: Vec<(String, i64, i64)>,
    /// Most nodes and units out at once.
    pub peak_nodes: usize,
    pub peak_units_milli: u64,
}

const HOUR_MS: f64 = 3_600_000.0;

/// Walks a rollout of `nodes` starting at `now`, each upgrade taking `upgrade_ms`.
pub fn simulate(nodes: &[Node], now: i64, limits: Limits, upgrade_ms: i64, plan: Plan) -> Report {
    let mut r = Report::default();
    // (back at, units) of the nodes out.
    let mut out: Vec<(i64, u64)> = Vec::new();
    let mut pending: Vec<usize> = (0..nodes.len()).collect();
    let mut t = now;
    while !pending.is_empty() {
        out.retain(|&(back, _)| back > t);
        let out_units: u64 = out.iter().map(|o| o.1).sum();
        let take: Vec<usize> = match plan {
            Plan::DrainAware { ahead_ms } => {
                let view: Vec<Node> = pending.iter().map(|&i| nodes[i].clone()).collect();
                take_now(&view, t, limits, out.len(), out_units, ahead_ms)
                    .into_iter()
                    .map(|k| pending[k])
                    .collect()
            }
            // Fleet order, as many as the limits allow.
            Plan::Naive { .. } => {
                let (mut n_out, mut u_out) = (out.len(), out_units);
                let mut v = Vec::new();
                for &i in &pending {
                    if !admits(limits, n_out, u_out, nodes[i].units_milli) {
                        break;
                    }
                    v.push(i);
                    n_out += 1;
                    u_out += nodes[i].units_milli;
                }
                v
            }
        };
        for &i in &take {
            let n = &nodes[i];
            let start = t;
            let (drained, lost, cut) = match plan {
                Plan::DrainAware { .. } => {
                    let drained = n.free_at(start);
                    (drained, idle_while_draining(n, start, drained), 0)
                }
                Plan::Naive { deadline_ms } => {
                    let evict = start + deadline_ms;
                    let drained = n.free_at(start).min(evict);
                    let mut lost = idle_while_draining(n, start, drained);
                    let mut cut = 0;
                    for w in &n.work {
                        if w.end_ms.is_none_or(|e| e > drained) {
                            cut += 1;
                            // The work done so far is thrown away.
                            lost += w.units_milli as f64 / 1000.0 * (drained - w.start_ms).max(0) as f64 / HOUR_MS;
                        }
                    }
                    (drained, lost, cut)
                }
            };
            let back = drained.saturating_add(upgrade_ms);
            r.lost_unit_hours += lost + n.units_milli as f64 / 1000.0 * upgrade_ms as f64 / HOUR_MS;
            r.cut_offs += cut;
            r.timeline.push((n.name.clone(), start, back));
            out.push((back, n.units_milli));
            r.peak_nodes = r.peak_nodes.max(out.len());
            r.peak_units_milli = r.peak_units_milli.max(out.iter().map(|o| o.1).sum());
            r.duration_ms = r.duration_ms.max(back - now);
        }
        pending.retain(|i| !take.contains(i));
        if pending.is_empty() {
            break;
        }
        // The next moment something may change: a node back, or (drain-aware) a pending
        // node's free time coming within reach. Something is out here (else a node was taken),
        // so time moves on.
        let back = out.iter().map(|o| o.0).filter(|&b| b > t).min();
        let near = match plan {
            Plan::DrainAware { ahead_ms } => pending
                .iter()
                .map(|&i| nodes[i].free_at(t) - ahead_ms)
                .filter(|&x| x > t)
                .min(),
            Plan::Naive { .. } => None,
        };
        t = match (back, near) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => t + 1,
        };
    }
    r
}

/// GPU-unit-hours of a node out of placement and not running work between `from` and `to`
/// (services have moved; batch work keeps its units until it ends).
fn idle_while_draining(n: &Node, from: i64, to: i64) -> f64 {
    if to <= from {
        return 0.0;
    }
    let busy: f64 = n
        .work
        .iter()
        .filter_map(|w| w.end_ms.map(|e| (w.units_milli, e)))
        .map(|(u, e)| u as f64 / 1000.0 * (e.min(to) - from).max(0) as f64)
        .sum();
    (n.units_milli as f64 / 1000.0 * (to - from) as f64 - busy).max(0.0) / HOUR_MS
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn node(name: &str, units: u64, ends: &[Option<i64>]) -> Node {
        Node {
            name: name.into(),
            units_milli: units,
            work: ends
                .iter()
                .map(|&e| Work {
                    units_milli: 1000,
                    end_ms: e,
                    start_ms: 0,
                })
                .collect(),
        }
    }

    #[test]
    fn soonest_free_first_services_do_not_hold_a_node() {
        let nodes = vec![
            node("a", 8000, &[Some(5_000)]),
            node("b", 8000, &[None, Some(1_000)]),
            node("c", 8000, &[]),
        ];
        assert_eq!(order(&nodes, 0), vec![2, 1, 0]);
    }

    #[test]
    fn work_without_an_end_goes_last_and_is_taken_only_when_nothing_is_out() {
        let nodes = vec![
            node("a", 8000, &[Some(NEVER)]),
            node("b", 8000, &[Some(60_000)]),
            node("c", 8000, &[]),
        ];
        assert_eq!(order(&nodes, 0), vec![2, 1, 0]);
        assert_eq!(nodes[0].free_at(0), NEVER);
        let l = Limits {
            max_parallel: 3,
            max_unavailable_milli: u64::MAX,
        };
        assert_eq!(
            take_now(&nodes, 0, l, 0, 0, 1_000),
            vec![2],
            "only the idle node is near"
        );
        assert_eq!(take_now(&nodes[..1], 0, l, 0, 0, 1_000), vec![0], "alone, it is taken");
        assert!(take_now(&nodes[..1], 0, l, 1, 8000, 1_000).is_empty());
    }

    #[test]
    fn one_node_always_goes_even_past_the_unit_limit() {
        let l = Limits {
            max_parallel: 2,
            max_unavailable_milli: 4000,
        };
        assert!(admits(l, 0, 0, 8000));
        assert!(!admits(l, 1, 8000, 1000));
        assert!(admits(l, 1, 2000, 2000));
        assert!(!admits(l, 2, 2000, 1000), "max_parallel");
    }

    #[test]
    fn naive_rollouts_cut_off_what_outlives_the_deadline() {
        let nodes = vec![node("a", 1000, &[Some(10_000)]), node("b", 1000, &[None])];
        let l = Limits {
            max_parallel: 1,
            max_unavailable_milli: 1000,
        };
        let naive = simulate(&nodes, 0, l, 100, Plan::Naive { deadline_ms: 1_000 });
        assert_eq!(naive.cut_offs, 2);
        let smart = simulate(&nodes, 0, l, 100, Plan::DrainAware { ahead_ms: 0 });
        assert_eq!(smart.cut_offs, 0);
        // b (service only) first, then a once its work ends at 10 s.
        assert_eq!(smart.timeline[0].0, "b");
        assert_eq!(smart.duration_ms, 10_100);
    }

    #[test]
    fn a_node_with_long_work_waits_for_its_free_time_unless_nothing_is_out() {
        let nodes = vec![node("long", 8000, &[Some(50_000)]), node("idle", 8000, &[])];
        let l = Limits {
            max_parallel: 2,
            max_unavailable_milli: 16_000,
        };
        // The idle node goes; the busy one keeps serving though a slot is free.
        assert_eq!(take_now(&nodes, 0, l, 0, 0, 1_000), vec![1]);
        assert_eq!(take_now(&nodes, 0, l, 1, 8000, 1_000), vec![1]);
        assert_eq!(take_now(&nodes[..1], 0, l, 1, 8000, 1_000), Vec::<usize>::new());
        // Within the horizon of its free time it goes; with nothing out it goes anyway.
        assert_eq!(take_now(&nodes[..1], 49_500, l, 1, 8000, 1_000), vec![0]);
        assert_eq!(take_now(&nodes[..1], 0, l, 0, 0, 1_000), vec![0]);
        // A node with 7 idle GPUs for 50 s: cordoned at its free time it loses only the upgrade.
        let busy = vec![
            node("a", 8000, &[Some(50_000)]),
            node("b", 8000, &[Some(1_000)]),
            node("c", 8000, &[Some(40_000)]),
        ];
        let late = simulate(&busy, 0, l, 100, Plan::DrainAware { ahead_ms: 0 });
        let eager = simulate(&busy, 0, l, 100, Plan::DrainAware { ahead_ms: i64::MAX / 4 });
        assert_eq!(late.cut_offs + eager.cut_offs, 0);
        assert!(late.lost_unit_hours < eager.lost_unit_hours, "{late:?} {eager:?}");
    }

    fn arb_nodes() -> impl Strategy<Value = Vec<Node>> {
        proptest::collection::vec(
            (
                1u64..=8,
                proptest::collection::vec((1u64..=8, proptest::option::of(0i64..100_000)), 0..4),
            ),
            1..25,
        )
        .prop_map(|v| {
            v.into_iter()
                .enumerate()
                .map(|(i, (gpus, work))| Node {
                    name: format!("n{i:02}"),
                    units_milli: gpus * 1000,
                    work: work
                        .into_iter()
                        .map(|(u, e)| Work {
                            units_milli: u.min(gpus) * 1000,
                            end_ms: e,
                            start_ms: 0,
                        })
                        .collect(),
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn every_node_once_within_limits_and_nothing_cut_off(
            nodes in arb_nodes(),
            par in 1usize..6,
            cap in 1u64..40,
            up in 0i64..10_000,
        ) {
            let limits = Limits { max_parallel: par, max_unavailable_milli: cap * 1000 };
            let r = simulate(&nodes, 0, limits, up, Plan::DrainAware { ahead_ms: 0 });
            prop_assert_eq!(r.cut_offs, 0);
            let mut names: Vec<&str> = r.timeline.iter().map(|t| t.0.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            prop_assert_eq!(names.len(), nodes.len());
            prop_assert!(r.peak_nodes <= par.max(1));
            // The limits at every start, from the timeline itself: nodes, and units unless a
            // single node is out alone.
            let units = |name: &str| nodes.iter().find(|n| n.name == name).unwrap().units_milli;
            for (i, (_, s, _)) in r.timeline.iter().enumerate() {
                let out: Vec<&(String, i64, i64)> = r.timeline.iter().filter(|(_, a, b)| a <= s && s < b).collect();
                prop_assert!(out.len() <= par, "node {} starts with {} out", i, out.len());
                let u: u64 = out.iter().map(|o| units(&o.0)).sum();
                prop_assert!(u <= cap * 1000 || out.len() == 1, "node {} starts with {} units out", i, u);
            }
            // No node goes out before its non-movable work could end... it waits for it.
            for (name, s, b) in &r.timeline {
                let n = nodes.iter().find(|n| &n.name == name).unwrap();
                prop_assert!(*b >= n.free_at(*s) + up);
            }
            // The naive rollout never loses less than the drain-aware one where both run in
            // the same order and the deadline cuts work off.
            let naive = simulate(&nodes, 0, limits, up, Plan::Naive { deadline_ms: 0 });
            prop_assert!(naive.cut_offs >= r.cut_offs);
        }
    }
}
