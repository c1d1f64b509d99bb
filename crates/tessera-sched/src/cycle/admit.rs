//! The admit action: a job's budget and quotas before any placement is tried. A job over its
//! tenant's monthly budget, or over a limit in every pool it may use, waits or is refused (as it
//! asked) with the figures; otherwise it goes on to allocate with the pools it may use. The
//! quotas of the pool and model it lands on are checked again on the placement itself, since
//! earlier jobs of the same cycle may have taken the room. Constraints — requests no node could
//! ever hold — are checked once, at submission.

use tessera_model::{GpuUnits, PoolId, Request};

use super::session::{Session, Status};
use super::{Action, Queued, Scheduler};
use crate::engine::Engine;
use crate::reason::{BudgetExceeded, LimitExceeded, Refusal, Unplaceable, Wait};

/// A limit or budget a job would exceed.
pub(super) enum Exceeded {
    Limit(LimitExceeded),
    Budget(BudgetExceeded),
}

impl Exceeded {
    pub fn wait(self) -> Wait {
        match self {
            Exceeded::Limit(l) => Wait::Limit(l),
            Exceeded::Budget(b) => Wait::Budget(b),
        }
    }

    pub fn refusal(self) -> Refusal {
        match self {
            Exceeded::Limit(l) => Refusal::Limit(l),
            Exceeded::Budget(b) => Refusal::Budget(b),
        }
    }
}

pub(super) struct Admit;

impl Action for Admit {
    fn name(&self) -> &'static str {
        "admit"
    }

    fn execute(&self, s: &mut Session<'_>) {
        let jobs = s.jobs.clone();
        for (i, q) in jobs.iter().enumerate() {
            match check(s.sched, q) {
                Ok(pools) => s.set(i, Status::Admitted(pools)),
                Err(over) => s.exceeded(i, over),
            }
        }
    }
}

/// Why no node could ever hold `req`, if that is so.
pub(super) fn constraint(engine: &mut Engine, req: &Request) -> Option<Unplaceable> {
    engine.constraint(req)
}

/// The budget, then the pool-level quotas of each pool in scope: the pools with the limit each
/// exceeds, or what stops the job everywhere.
fn check(s: &Scheduler, q: &Queued) -> Result<Vec<(PoolId, Option<LimitExceeded>)>, Exceeded> {
    if let Some(b) = s.books.budget_exceeded(&q.job.tenant) {
        return Err(Exceeded::Budget(b));
    }
    let units = q.units;
    let pools: Vec<(PoolId, Option<LimitExceeded>)> =
        q.scope.iter().map(|&p| (p, pool_limit(s, q, p, units).err())).collect();
    if !pools.is_empty() && pools.iter().all(|(_, over)| over.is_some()) {
        let (_, first) = pools.into_iter().next().expect("not empty");
        return Err(Exceeded::Limit(first.expect("every pool is over")));
    }
    Ok(pools)
}

/// What [`check`] stops the job with, without listing its pools: the budget, or the
/// limit of the first pool in scope when every pool of its scope is over one.
pub(super) fn blocked(s: &Scheduler, q: &Queued) -> Option<Exceeded> {
    if let Some(b) = s.books.budget_exceeded(&q.job.tenant) {
        return Some(Exceeded::Budget(b));
    }
    let mut first = None;
    for &p in &q.scope {
        match pool_limit(s, q, p, q.units) {
            Ok(()) => return None,
            Err(l) => {
                first.get_or_insert(l);
            }
        }
    }
    first.map(Exceeded::Limit)
}

/// The tenant's quota for `pool` (on any model) and the project's sub-quota, for `units` more.
pub(super) fn pool_limit(s: &Scheduler, q: &Queued, pool: PoolId, units: GpuUnits) -> Result<(), LimitExceeded> {
    let keys = [s.engine.fleet().pool(pool).name.as_str(), q.project_key.as_str()];
    s.books.check(&q.job.tenant, &keys, units).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::super::testing::{job, placed, sched};
    use super::super::{Decision, Quota, project_key};
    use super::*;
    use crate::reason::LimitScope;

    #[test]
    fn limits_make_requests_wait_or_be_refused_with_the_figures() {
        let mut s = sched();
        s.set_quota(
            "a",
            "training",
            Some(Quota {
                guaranteed: GpuUnits::whole(8),
                limit: Some(GpuUnits::whole(10)),
            }),
        );
        assert_eq!(placed(&s.submit(job(1, "a", 8, "standard", 0), 0)), vec![1]);
        let acts = s.submit(job(2, "a", 4, "standard", 0), 0);
        let Decision::Waiting { reason, .. } = &acts[0] else {
            panic!("{acts:?}")
        };
        assert_eq!(reason.code(), "quota");
        assert_eq!(
            reason.to_string(),
            "tenant a holds 8 GPU units in training (guaranteed 8, limit 10); this request needs 4"
        );
        let mut j = job(3, "a", 4, "standard", 0);
        j.wait_if_over_limit = false;
        let acts = s.submit(j, 0);
        assert!(
            matches!(&acts[0], Decision::Refused { id: 3, reason: Refusal::Limit(l) } if l.needs == GpuUnits::whole(4)),
            "{acts:?}"
        );
        // 2 more fit under the limit, and borrow.
        let acts = s.submit(job(4, "a", 2, "standard", 0), 0);
        assert_eq!(placed(&acts), vec![4]);
        assert_eq!(s.is_borrowing(4), Some(true));
    }

    #[test]
    fn project_sub_quotas_cap_a_project() {
        let mut s = sched();
        s.set_quota(
            "a",
            "training",
            Some(Quota {
                guaranteed: GpuUnits::whole(32),
                limit: None,
            }),
        );
        s.set_quota(
            "a",
            &project_key("p"),
            Some(Quota {
                guaranteed: GpuUnits::ZERO,
                limit: Some(GpuUnits::whole(8)),
            }),
        );
        assert_eq!(placed(&s.submit(job(1, "a", 8, "standard", 0), 0)), vec![1]);
        assert_eq!(
            s.is_borrowing(1),
            Some(false),
            "the tenant's guarantee decides borrowing"
        );
        let acts = s.submit(job(2, "a", 1, "standard", 0), 0);
        let Decision::Waiting { reason, .. } = &acts[0] else {
            panic!("{acts:?}")
        };
        let Wait::Limit(l) = reason else { panic!("{reason:?}") };
        assert_eq!(l.scope, LimitScope::Project { project: "p".into() });
        assert_eq!(
            reason.to_string(),
            "project p of tenant a holds 8 GPU units of its limit of 8; this request needs 1"
        );
        let mut other = job(3, "a", 1, "standard", 0);
        other.project = "q".into();
        assert_eq!(
            placed(&s.submit(other, 0)),
            vec![3],
            "another project of the tenant is not capped"
        );
    }

    #[test]
    fn budgets_refuse_with_the_figure() {
        let mut s = sched();
        s.set_budget("a", Some(100.0));
        s.set_spent("a", 100.5);
        let mut j = job(1, "a", 1, "standard", 0);
        j.wait_if_over_limit = false;
        let acts = s.submit(j, 0);
        let Decision::Refused { reason, .. } = &acts[0] else {
            panic!("{acts:?}")
        };
        assert_eq!(reason.code(), "budget");
        assert_eq!(
            reason.to_string(),
            "tenant a has spent 100.5 of its 100.0 GPU-unit-hour budget for this month"
        );
    }
}
