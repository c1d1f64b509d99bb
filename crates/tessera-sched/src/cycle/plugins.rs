//! The cycle's pluggable policies: the order the queue is served in and the cost of preempting a
//! running workload. Each is a small trait with today's behaviour as its default, so a new
//! policy is a new implementation handed to [`Scheduler::with_plugins`], never an edit of the
//! cycle.
//!
//! [`Scheduler::with_plugins`]: super::Scheduler::with_plugins

use super::{Job, Running};

/// Queue position: lower goes first.
pub type OrderKey = (u8, u64, i64, u64);

/// The order in which waiting jobs are considered.
///
/// The queue is kept sorted as jobs come and go, not re-sorted each cycle, so an implementation
/// must keep the relative order of two jobs of the same tenant and priority class whatever the
/// fair share (as it changes, only whole tenants move against each other).
pub trait QueueOrder: Send {
    /// The position of `job`, given its priority class's rank (0 = most important) and its
    /// tenant's fair share (decayed usage over the guarantee; lower = less served).
    fn key(&self, job: &Job, rank: u8, fair_share: f64) -> OrderKey;
}

/// The default order: priority class, then fair share, then arrival.
#[derive(Clone, Copy, Debug, Default)]
pub struct PriorityFairShare;

impl QueueOrder for PriorityFairShare {
    fn key(&self, job: &Job, rank: u8, fair_share: f64) -> OrderKey {
        (rank, (fair_share * 1000.0) as u64, job.submitted_ms, job.id)
    }
}

/// How far ahead of its arrival a gang goes in [`GangsFirst`]: beyond any arrival time in
/// milliseconds since 1970 (2^52 ms is about 140,000 years), so every gang of a tenant and
/// class goes before its other work.
const GANG_LEAD_MS: i64 = 1 << 52;

/// Multi-node gangs first: [`PriorityFairShare`] (priority class, then fair share), but within
/// a tenant's jobs of one priority class its gangs go before its single-node work; gangs by
/// arrival, single-node work by arrival plus `estimate_weight` × its requested duration
/// ([`Job::duration_ms`]: with a weight above 0, of two jobs that arrived together the shorter
/// goes first, and long work is never passed by work that arrived more than `weight` × its
/// own estimate after it), as the Philly replay's `tessera` model orders its classes.
/// A gang needs whole nodes to be free at once, which work placed ahead of it keeps busy; the
/// small work it passes still finds room on the nodes the gang cannot use (its hold lets work
/// that ends before its start backfill there). With `across_tenants`, every gang of a class
/// goes before all its single-node work whatever the tenants' fair shares (gangs are ordered
/// among themselves by fair share, then arrival), as the Philly replay's `tessera` model does.
#[derive(Clone, Copy, Debug, Default)]
pub struct GangsFirst {
    pub estimate_weight: f64,
    pub across_tenants: bool,
}

impl QueueOrder for GangsFirst {
    fn key(&self, job: &Job, rank: u8, fair_share: f64) -> OrderKey {
        let (rank, mut share, at, id) = PriorityFairShare.key(job, rank, fair_share);
        if self.across_tenants {
            // Fair share in the low half: gangs in the first half of the range, the rest after
            // (a tenant's jobs keep their order whatever its share: gangs before the rest).
            share = (share >> 1) | if job.gang.is_some() { 0 } else { 1 << 63 };
        }
        let key = match (&job.gang, job.duration_ms) {
            (Some(_), _) => at.saturating_sub(GANG_LEAD_MS),
            (None, Some(d)) => {
                at.saturating_add((d.max(0) as f64 * self.estimate_weight.max(0.0)).min(GANG_LEAD_MS as f64) as i64)
            }
            (None, None) => at,
        };
        (rank, share, key, id)
    }
}

/// Largest first: priority class, then the number of whole GPUs asked for (a multi-node gang's
/// total, a request of whole GPUs on one node its count; fractions and MIG slices count as
/// none), most first, then fair share, then arrival. Large work needs whole GPUs or whole nodes
/// to be free at once, which smaller work placed ahead of it keeps busy; served first, it takes
/// each node as it frees, while smaller work still backfills around its holds. This is
/// Slurm's job-size priority factor with `PriorityFavorSmall=NO`, taken as strict: the smaller
/// requests of a saturated pool wait for the larger ones.
#[derive(Clone, Copy, Debug, Default)]
pub struct LargestFirst;

impl QueueOrder for LargestFirst {
    fn key(&self, job: &Job, rank: u8, fair_share: f64) -> OrderKey {
        let (rank, share, at, id) = PriorityFairShare.key(job, rank, fair_share);
        // Size in the top 16 bits (largest first), fair share below.
        let gpus = u64::from(job.whole_gpus()).min(u64::from(u16::MAX));
        let size = (u64::from(u16::MAX) - gpus) << 48;
        (rank, size | share.min((1 << 48) - 1), at, id)
    }
}

/// What preempting a victim costs, compared field by field in this order; cheaper victims are
/// taken first, and victim sets are compared cost by cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct VictimCost {
    /// Admitted within its guarantee (borrowers go first).
    pub within_guarantee: bool,
    /// Higher is more important: `u8::MAX - rank`.
    pub importance: u8,
    /// Work lost: GPU milli-units × milliseconds since it started or last saved its work
    /// ([`Running::work_lost`]).
    pub work_lost: i64,
    /// Tenants furthest above their fair share give first: `u64::MAX - fair share`.
    pub share_room: u64,
}

/// The cost of preempting a running workload.
pub trait VictimOrder: Send {
    /// The cost of stopping `victim` at `now`, given its tenant's fair share.
    fn cost(&self, victim: &Running, fair_share: f64, now: i64) -> VictimCost;
}

/// The default cost: borrowers first, then the lowest priority, the least work lost (GPU units ×
/// time since start or checkpoint), the tenant most above its fair share.
#[derive(Clone, Copy, Debug, Default)]
pub struct CheapestFirst;

impl VictimOrder for CheapestFirst {
    fn cost(&self, r: &Running, fair_share: f64, now: i64) -> VictimCost {
        VictimCost {
            within_guarantee: !r.borrowing,
            importance: u8::MAX - r.rank,
            work_lost: r.work_lost(now).min(i64::MAX as u64) as i64,
            share_room: u64::MAX - (fair_share * 1000.0) as u64,
        }
    }
}

/// The policies a [`Scheduler`](super::Scheduler) runs with.
pub struct Plugins {
    pub queue_order: Box<dyn QueueOrder>,
    pub victim_order: Box<dyn VictimOrder>,
}

impl Default for Plugins {
    fn default() -> Self {
        Plugins {
            queue_order: Box::new(PriorityFairShare),
            victim_order: Box::new(CheapestFirst),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cycle::Scheduler;
    use crate::cycle::testing::{config, engine, guarantee_half_each, job, placed, preempted, sched};

    /// Arrival order only.
    struct Fifo;

    impl QueueOrder for Fifo {
        fn key(&self, job: &Job, _: u8, _: f64) -> OrderKey {
            (0, 0, job.submitted_ms, job.id)
        }
    }

    /// The longest-running victim first (the opposite of the default's least work lost).
    struct OldestFirst;

    impl VictimOrder for OldestFirst {
        fn cost(&self, r: &Running, fair_share: f64, now: i64) -> VictimCost {
            VictimCost {
                work_lost: -(r.work_lost(now) as i64),
                ..CheapestFirst.cost(r, fair_share, now)
            }
        }
    }

    fn with(plugins: Plugins) -> Scheduler {
        Scheduler::new(engine(), config()).with_plugins(plugins)
    }

    /// Tenant `a` has used the whole training pool, `b` nothing; `a`'s 8 GPUs (50) and `b`'s
    /// `b_gpus` (51) wait for the next node.
    fn two_tenants_wait(s: &mut Scheduler, b_gpus: u8) -> Vec<u64> {
        guarantee_half_each(s, None);
        for i in 0..16 {
            s.submit(job(i, "a", 8, "standard", 0), 0);
        }
        s.submit(job(50, "a", 8, "standard", 10), 10);
        s.submit(job(51, "b", b_gpus, "standard", 20), 20);
        s.release(3, 3_600_000);
        placed(&s.cycle(3_600_000))
    }

    #[test]
    fn a_queue_order_plugin_reorders_the_queue_without_touching_the_cycle() {
        assert_eq!(two_tenants_wait(&mut sched(), 8), vec![51], "fair share: b first");
        assert_eq!(
            two_tenants_wait(
                &mut with(Plugins {
                    queue_order: Box::new(Fifo),
                    ..Default::default()
                }),
                8
            ),
            vec![50],
            "arrival order: a's earlier request first"
        );
    }

    #[test]
    fn gangs_first_puts_a_tenants_gangs_ahead_then_arrival_plus_a_share_of_the_estimate() {
        let h = 3_600_000;
        let order = GangsFirst {
            estimate_weight: 0.25,
            ..GangsFirst::default()
        };
        let at = |id: u64, submitted: i64, hours: i64| Job {
            duration_ms: Some(hours * h),
            ..job(id, "a", 8, "standard", submitted)
        };
        // 1: at 0 for 8 h → 0 + 2 h; 2: at 1 h for 1 h → 1 h 15 min; 3: a gang at 5 h for 10 h
        // → 5 h, less the gangs' lead.
        let mut gang = at(3, 5 * h, 10);
        gang.gang = Some(tessera_model::request::GangRequest::whole_nodes(16));
        let k = |j: &Job| order.key(j, 2, 0.5);
        assert_eq!(k(&at(1, 0, 8)), (2, 500, 2 * h, 1));
        assert_eq!(k(&at(2, h, 1)), (2, 500, h + h / 4, 2));
        assert_eq!(k(&gang), (2, 500, 5 * h - GANG_LEAD_MS, 3));
        let mut keys = [k(&at(1, 0, 8)), k(&at(2, h, 1)), k(&gang)];
        keys.sort_unstable();
        assert_eq!(keys.map(|k| k.3), [3, 2, 1]);
        // Fair share and priority still come first: a less-served tenant's single GPU, or a
        // more important class, goes before the gang.
        assert!(order.key(&at(4, 6 * h, 1), 2, 0.1) < k(&gang));
        assert!(order.key(&at(5, 6 * h, 1), 1, 0.5) < k(&gang));
        // Across tenants, the gang goes before the less-served tenant's single GPU too (never
        // before a more important class); gangs among themselves by fair share.
        let across = GangsFirst {
            across_tenants: true,
            ..order
        };
        assert!(across.key(&gang, 2, 0.5) < across.key(&at(4, 6 * h, 1), 2, 0.1));
        assert!(across.key(&at(5, 6 * h, 1), 1, 0.5) < across.key(&gang, 2, 0.5));
        assert!(across.key(&gang, 2, 0.1) < across.key(&gang, 2, 0.5));
        assert_eq!(across.key(&gang, 2, 0.5).1, 250);
        assert_eq!(across.key(&at(4, 6 * h, 1), 2, 0.1).1, (1 << 63) | 50);
    }

    /// The scene both gang-order tests play: `busy` runs the whole training pool (16 nodes of
    /// 8-GPU jobs), `single`'s 8-GPU job waits from 10, `a`'s 16-GPU gang from 20, and two
    /// nodes free at 1,000. Returns the single-node jobs placed and whether the gang was.
    fn two_nodes_freed_before_a_job_and_a_gang(s: &mut Scheduler, busy: &str, single: &str) -> (Vec<u64>, bool) {
        for i in 0..16 {
            s.submit(job(i, busy, 8, "standard", 0), 0);
        }
        s.submit(job(50, single, 8, "standard", 10), 10);
        s.submit(
            Job {
                gang: Some(tessera_model::request::GangRequest::whole_nodes(16).with_pool(tessera_model::PoolId(0))),
                ..job(51, "a", 8, "standard", 20)
            },
            20,
        );
        s.release(0, 1000);
        s.release(1, 1000);
        let d = s.cycle(1000);
        let gang_placed = d
            .iter()
            .any(|x| matches!(x, crate::cycle::Decision::PlacedGang { id: 51, .. }));
        (placed(&d), gang_placed)
    }

    #[test]
    fn with_gangs_first_freed_nodes_go_to_a_tenants_gang_before_its_earlier_single_node_job() {
        // a's 8-GPU job at 10, its 16-GPU gang at 20; b runs the pool.
        let run = |s: &mut Scheduler| two_nodes_freed_before_a_job_and_a_gang(s, "b", "a");
        assert_eq!(
            run(&mut sched()),
            (vec![50], false),
            "arrival: the single job takes a node"
        );
        let mut s = with(Plugins {
            queue_order: Box::new(GangsFirst::default()),
            ..Default::default()
        });
        assert_eq!(run(&mut s), (vec![], true), "gangs first: the gang takes both");
    }

    /// The gang rules' order puts a gang before single-node work across tenants: `a` ran the
    /// whole training pool, `b` nothing; `b`'s 8-GPU job waits from 10, `a`'s 16-GPU gang from
    /// 20, and two nodes free at 1,000. By fair share alone `b`'s job takes one of them; in
    /// the gang rules' order the gang takes both.
    #[test]
    fn in_the_gang_rules_order_freed_nodes_go_to_a_gang_before_a_less_served_tenants_job() {
        let run = |s: &mut Scheduler| two_nodes_freed_before_a_job_and_a_gang(s, "a", "b");
        let within_tenants = GangsFirst {
            across_tenants: false,
            ..crate::cycle::gang_rules_order()
        };
        let mut s = with(Plugins {
            queue_order: Box::new(within_tenants),
            ..Default::default()
        });
        assert_eq!(run(&mut s), (vec![50], false), "fair share first: b's job");
        let mut s = with(Plugins {
            queue_order: Box::new(crate::cycle::gang_rules_order()),
            ..Default::default()
        });
        assert_eq!(run(&mut s), (vec![], true), "the gang rules' order: the gang");
    }

    #[test]
    fn largest_first_orders_by_class_then_whole_gpus_asked_then_fair_share_then_arrival() {
        let order = LargestFirst;
        let k = |j: &Job, rank: u8, share: f64| order.key(j, rank, share);
        let one = job(1, "a", 1, "standard", 0);
        let eight = job(2, "a", 8, "standard", 100);
        let mut gang = job(3, "a", 8, "standard", 200);
        gang.gang = Some(tessera_model::request::GangRequest::whole_nodes(32));
        let mut fraction = job(4, "a", 1, "standard", 0);
        fraction.request.shape = tessera_model::Shape::Fraction {
            milli: 500,
            memory_mib: None,
        };
        // The larger request first, whatever the fair share (a served tenant's 8 GPUs before an
        // unserved tenant's one); a gang by its total.
        assert!(k(&eight, 2, 0.9) < k(&one, 2, 0.0));
        assert!(k(&gang, 2, 0.9) < k(&eight, 2, 0.0));
        assert!(k(&one, 2, 0.9) < k(&fraction, 2, 0.0));
        // The class still first: a more important single GPU before the gang.
        assert!(k(&one, 1, 0.9) < k(&gang, 2, 0.0));
        // Same size: fair share, then arrival; a tenant's own jobs keep their order whatever
        // its share.
        let later_one = job(5, "b", 1, "standard", 50);
        assert!(k(&later_one, 2, 0.1) < k(&one, 2, 0.2));
        assert!(k(&one, 2, 0.3) < k(&job(6, "a", 1, "standard", 10), 2, 0.3));
        assert_eq!(k(&eight, 2, 0.5).1 & ((1 << 48) - 1), 500);
    }

    #[test]
    fn largest_first_gives_a_freed_node_to_the_whole_node_request_before_a_less_served_single_gpu() {
        assert_eq!(
            two_tenants_wait(&mut sched(), 1),
            vec![51],
            "fair share: b's single GPU first"
        );
        let mut s = with(Plugins {
            queue_order: Box::new(LargestFirst),
            ..Default::default()
        });
        assert_eq!(two_tenants_wait(&mut s, 1), vec![50], "largest first: a's whole node");
    }

    /// One node of eight single-GPU opportunistic jobs started one after the other; every other
    /// node runs critical work. A high-priority single GPU needs one of the eight.
    fn preempt_one_of_eight(s: &mut Scheduler) -> Vec<u64> {
        for i in 0..15 {
            s.submit(job(i, "a", 8, "critical", 0), 0);
        }
        for i in 0..8 {
            let acts = s.submit(job(100 + i, "a", 1, "opportunistic", i as i64), i as i64);
            assert_eq!(placed(&acts), vec![100 + i]);
        }
        preempted(&s.submit(job(500, "b", 1, "high", 5000), 5000))
    }

    #[test]
    fn a_victim_order_plugin_changes_who_is_preempted() {
        assert_eq!(
            preempt_one_of_eight(&mut sched()),
            vec![107],
            "default: least work lost"
        );
        assert_eq!(
            preempt_one_of_eight(&mut with(Plugins {
                victim_order: Box::new(OldestFirst),
                ..Default::default()
            })),
            vec![100]
        );
    }
}
