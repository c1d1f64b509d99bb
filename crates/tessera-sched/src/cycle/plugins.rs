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

    /// Tenant `a` has used the whole training pool, `b` nothing; both wait for the next node.
    fn two_tenants_wait(s: &mut Scheduler) -> Vec<u64> {
        guarantee_half_each(s, None);
        for i in 0..16 {
            s.submit(job(i, "a", 8, "standard", 0), 0);
        }
        s.submit(job(50, "a", 8, "standard", 10), 10);
        s.submit(job(51, "b", 8, "standard", 20), 20);
        s.release(3, 3_600_000);
        placed(&s.cycle(3_600_000))
    }

    #[test]
    fn a_queue_order_plugin_reorders_the_queue_without_touching_the_cycle() {
        assert_eq!(two_tenants_wait(&mut sched()), vec![51], "fair share: b first");
        assert_eq!(
            two_tenants_wait(&mut with(Plugins {
                queue_order: Box::new(Fifo),
                ..Default::default()
            })),
            vec![50],
            "arrival order: a's earlier request first"
        );
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
