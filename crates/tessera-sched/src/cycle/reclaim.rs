//! The reclaim action: a job within its tenant's guaranteed share, having waited
//! `reclaim_after_ms` (capacity often frees by itself sooner; reclaiming at once would churn),
//! takes capacity back from other tenants' borrowers — workloads admitted above their own
//! tenant's guarantee. Never from a workload within its guarantee, never within a tenant (see
//! the preemption bound in the [cycle](super) doc).

use super::session::Session;
use super::victims::{self, Victim, VictimRule};
use super::{Action, Job, Scheduler};
use crate::reason::PreemptCause;

pub(super) struct Reclaim;

impl Action for Reclaim {
    fn name(&self) -> &'static str {
        "reclaim"
    }

    fn execute(&self, s: &mut Session<'_>) {
        victims::pass(s, self);
    }
}

impl VictimRule for Reclaim {
    fn applies(&self, s: &Scheduler, job: &Job, now: i64) -> bool {
        now - job.submitted_ms >= after_ms(s, job) && within_guarantee(s, job)
    }

    fn due_in_ms(&self, s: &Scheduler, job: &Job, now: i64) -> Option<i64> {
        let wait = after_ms(s, job) - (now - job.submitted_ms);
        (wait > 0 && within_guarantee(s, job)).then_some(wait)
    }

    fn may_take(&self, job: &Job, _: u8, victim: &Victim<'_>) -> bool {
        victim.borrowing && victim.tenant != job.tenant
    }

    fn cause(&self, job: &Job) -> PreemptCause {
        PreemptCause::Reclaim {
            by: job.id,
            tenant: job.tenant.clone(),
        }
    }

    fn code(&self) -> &'static str {
        "reclaim"
    }
}

/// How long `job` waits before it may reclaim: a gang's own setting, if any.
fn after_ms(s: &Scheduler, job: &Job) -> i64 {
    match (&job.gang, s.cfg.gang_reclaim_after_ms) {
        (Some(_), Some(after)) => after,
        _ => s.cfg.reclaim_after_ms,
    }
}

/// Whether `job` stays within its tenant's guaranteed share in some pool it may use (a gang
/// counted whole).
fn within_guarantee(s: &Scheduler, job: &Job) -> bool {
    let (units, pools) = match &job.gang {
        Some(g) => (g.units(), s.engine.gang_pools(g)),
        None => (
            job.request.units(&s.engine.fleet().catalogue),
            s.pools_for(&job.request),
        ),
    };
    pools.iter().any(|&p| {
        let k = &s.engine.fleet().pool(p).name;
        s.quota(&job.tenant, k)
            .is_some_and(|q| s.held(&job.tenant, k) + units <= q.guaranteed)
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::{config, engine, guarantee_half_each, job, placed, preempted, sched, waiting};
    use super::super::{Decision, GovernConfig, Scheduler};
    use tessera_model::GpuUnits;

    #[test]
    fn a_tenant_within_its_guarantee_reclaims_from_borrowers_after_the_minimum_runtime() {
        let mut s = sched();
        // training: 128 GPUs; each tenant is guaranteed 64.
        guarantee_half_each(&mut s, Some(128));
        // a borrows the whole pool.
        for i in 0..16 {
            let acts = s.submit(job(i, "a", 8, "standard", 0), 0);
            assert_eq!(placed(&acts), vec![i]);
        }
        assert_eq!(s.is_borrowing(15), Some(true));
        assert_eq!(s.is_borrowing(0), Some(false));
        // b asks within its guarantee: waits, and after the minimum runtime reclaims.
        let acts = s.submit(job(100, "b", 8, "standard", 10), 10);
        assert!(preempted(&acts).is_empty(), "minimum runtime honoured: {acts:?}");
        let acts = s.cycle(2000);
        let v = preempted(&acts);
        assert_eq!(v.len(), 1, "{acts:?}");
        assert!(s.is_borrowing(v[0]).unwrap(), "only borrowers are reclaimed");
        // the victim stops; the owner is admitted.
        s.release(v[0], 2100);
        let acts = s.cycle(2100);
        assert_eq!(placed(&acts), vec![100]);
        assert_eq!(s.is_borrowing(100), Some(false));
    }

    #[test]
    fn a_job_waiting_to_reclaim_is_told_when() {
        let mut s = Scheduler::new(
            engine(),
            GovernConfig {
                reclaim_after_ms: 60_000,
                ..config()
            },
        );
        guarantee_half_each(&mut s, None);
        // a borrows the whole pool.
        for i in 0..16 {
            s.submit(job(i, "a", 8, "standard", 0), 0);
        }
        // b, within its guarantee, is told it takes capacity back in 60 s.
        let acts = s.submit(job(100, "b", 8, "standard", 1000), 1000);
        assert_eq!(
            waiting(&acts),
            vec![
                "no-capacity: 8 whole GPUs needs 8 GPU units; pool training has 0 free where this request may go; \
                 within tenant b's guaranteed share: may take back capacity lent to other tenants at 00:01:01 UTC (in 60 s) unless some frees sooner"
            ]
        );
        let Decision::Waiting { reason, .. } = &acts[0] else {
            panic!()
        };
        assert_eq!(reason.code(), "no-capacity");
        // Nothing new to record while it waits; then it reclaims.
        assert!(s.cycle(31_000).is_empty());
        let acts = s.cycle(61_000);
        assert_eq!(preempted(&acts).len(), 1, "{acts:?}");
        // a, over its guarantee, is not told it will reclaim from b.
        let acts = s.submit(job(200, "a", 8, "standard", 62_000), 62_000);
        assert_eq!(waiting(&acts).len(), 1);
        assert!(!waiting(&acts)[0].contains("take back"), "{acts:?}");

        // Borrowers younger than their minimum runtime put the time off.
        let cfg = GovernConfig {
            reclaim_after_ms: 60_000,
            min_runtime_ms: 120_000,
            ..config()
        };
        let mut s = Scheduler::new(engine(), cfg);
        guarantee_half_each(&mut s, None);
        for i in 0..16 {
            s.submit(job(i, "a", 8, "standard", 0), 0);
        }
        let acts = s.submit(job(100, "b", 8, "standard", 1000), 1000);
        assert!(
            waiting(&acts)[0].ends_with("at 00:02:00 UTC (in 119 s) unless some frees sooner"),
            "{acts:?}"
        );
        assert!(preempted(&s.cycle(119_999)).is_empty());
        assert_eq!(preempted(&s.cycle(120_000)).len(), 1);
    }

    /// Reclaim after a minute, losing at most `factor` × the waiting job's GPU-time; `a` and
    /// `b` each guaranteed half the training pool.
    fn loss_bounded(factor: f64) -> Scheduler {
        let mut s = Scheduler::new(
            engine(),
            GovernConfig {
                reclaim_after_ms: 60_000,
                max_loss_per_wait: Some(factor),
                ..config()
            },
        );
        guarantee_half_each(&mut s, None);
        s
    }

    /// The reason says when the job will take capacity back only where the loss bound
    /// (`max_loss_per_wait`) lets the search take a victim then: by hand, a borrower of 8 GPUs
    /// running since 0 loses 8 × t GPU-ms at t; the bound of an 8-GPU job submitted at `sub` is
    /// 8 × factor × (t − sub).
    #[test]
    fn a_job_is_told_it_reclaims_only_when_the_loss_bound_lets_it() {
        let run = |factor: f64, sub: i64| {
            let mut s = loss_bounded(factor);
            for i in 0..16 {
                s.submit(job(i, "a", 8, "standard", 0), 0);
            }
            let d = s.submit(job(100, "b", 8, "standard", sub), sub);
            (s, waiting(&d))
        };
        // Factor 2, submitted at 1 s: at 61 s the victim loses 488 GPU-s, the bound is 960.
        let (mut s, w) = run(2.0, 1000);
        assert!(
            w[0].ends_with("at 00:01:01 UTC (in 60 s) unless some frees sooner"),
            "{w:?}"
        );
        assert_eq!(preempted(&s.cycle(61_000)).len(), 1);
        // Factor 1: 8 × 61 s lost > 8 × 60 s bound, and the loss grows as fast as the bound:
        // no victim is ever cheap enough, so the reason promises no reclaim, and none comes.
        let (mut s, w) = run(1.0, 1000);
        assert_eq!(w.len(), 1);
        assert!(!w[0].contains("take back"), "{w:?}");
        assert!(preempted(&s.cycle(61_000)).is_empty());
        assert!(preempted(&s.cycle(36_000_000)).is_empty());
        // Factor 1.5, submitted at 100 s: at 160 s the victim loses 1,280 GPU-s against a
        // bound of 720; the bound (12 per ms) outgrows the loss (8 per ms) and meets it when
        // 8 t = 12 (t − 100 s): at 300 s, which the reason says, and when it reclaims.
        let (mut s, w) = run(1.5, 100_000);
        assert!(
            w[0].ends_with("at 00:05:00 UTC (in 200 s) unless some frees sooner"),
            "{w:?}"
        );
        assert!(preempted(&s.cycle(160_000)).is_empty());
        assert!(preempted(&s.cycle(299_999)).is_empty());
        assert_eq!(preempted(&s.cycle(300_000)).len(), 1);
    }

    /// A job that needs two victims on one node is promised reclaim only when the two lose
    /// little enough *together*, as the search requires, not when each alone would.
    #[test]
    fn a_job_is_told_when_its_victims_together_are_cheap_enough() {
        let run = |factor: f64, sub: i64| {
            let mut s = loss_bounded(factor);
            // 32 four-GPU jobs of `a`, two per node; the second half borrow.
            for i in 0..32 {
                s.submit(job(i, "a", 4, "standard", 0), 0);
            }
            let d = s.submit(job(100, "b", 8, "standard", sub), sub);
            (s, waiting(&d))
        };
        // Factor 1.25, submitted at 100 s: the bound is 10 GPU-s per s of wait, two victims
        // lose 8 GPU-s per s since 0: 8 t = 10 (t − 100 s) at 500 s (one victim alone, 4 t,
        // would be cheap enough from 166.7 s).
        let (mut s, w) = run(1.25, 100_000);
        assert!(
            w[0].ends_with("at 00:08:20 UTC (in 400 s) unless some frees sooner"),
            "{w:?}"
        );
        assert!(preempted(&s.cycle(166_667)).is_empty());
        assert!(preempted(&s.cycle(499_999)).is_empty());
        assert_eq!(preempted(&s.cycle(500_000)).len(), 2);
        // Factor 0.75: each victim alone is within the bound from 61 s on (4 × 61 against
        // 6 × 60), but two lose 8 GPU-s per s against a bound growing by 6: never together.
        let (mut s, w) = run(0.75, 1000);
        assert_eq!(w.len(), 1);
        assert!(!w[0].contains("take back"), "{w:?}");
        assert!(preempted(&s.cycle(61_000)).is_empty());
        assert!(preempted(&s.cycle(36_000_000)).is_empty());
    }

    #[test]
    fn two_tenants_pushing_against_their_guarantees_settle_without_thrash() {
        let mut s = sched();
        guarantee_half_each(&mut s, None);
        let mut now = 0;
        let mut id = 0;
        let mut preemptions = 0;
        let mut admissions = 0;
        let mut running: Vec<u64> = Vec::new();
        // Both tenants keep 12 requests of 8 GPUs outstanding against a 16-node pool.
        for _round in 0..50 {
            for t in ["a", "b"] {
                let mine = s.queue().filter(|j| j.tenant == t).count();
                for _ in mine..12 {
                    id += 1;
                    let acts = s.submit(job(id, t, 8, "standard", now), now);
                    admissions += placed(&acts).len();
                    for v in preempted(&acts) {
                        preemptions += 1;
                        s.release(v, now);
                    }
                    running.extend(placed(&acts));
                }
            }
            now += 1000;
            let acts = s.cycle(now);
            admissions += placed(&acts).len();
            for v in preempted(&acts) {
                preemptions += 1;
                s.release(v, now);
            }
        }
        let borrowed: usize = s.running().filter(|r| r.borrowing).count();
        // Bound: each preemption removes a borrower, and a borrower exists only by admission.
        assert!(
            preemptions <= admissions,
            "{preemptions} preemptions for {admissions} admissions"
        );
        // Stable state: each tenant holds its guarantee, nobody borrows, nothing more moves.
        assert_eq!(s.held("a", "training"), GpuUnits::whole(64));
        assert_eq!(s.held("b", "training"), GpuUnits::whole(64));
        assert_eq!(borrowed, 0);
        let before = preemptions;
        let acts = s.cycle(now + 100_000);
        assert!(
            preempted(&acts).is_empty() && placed(&acts).is_empty(),
            "stable: {acts:?} after {before}"
        );
    }
}
