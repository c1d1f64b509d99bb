//! The preempt action: a job of a higher priority class displaces lower-ranked work, only ever
//! downwards in rank, never a class that is not preemptible (`critical`), never work younger
//! than its minimum runtime, and only once the job has waited its class's `preempt_after_ms`.

use super::session::Session;
use super::victims::{self, Victim, VictimRule};
use super::{Action, Job, Scheduler};
use crate::reason::PreemptCause;

pub(super) struct Preempt;

impl Action for Preempt {
    fn name(&self) -> &'static str {
        "preempt"
    }

    fn execute(&self, s: &mut Session<'_>) {
        victims::pass(s, self);
    }
}

impl VictimRule for Preempt {
    fn applies(&self, s: &Scheduler, job: &Job, now: i64) -> bool {
        let after = s.class(&job.priority).and_then(|c| c.preempt_after_ms).unwrap_or(0);
        now - job.submitted_ms >= after
    }

    fn due_in_ms(&self, s: &Scheduler, job: &Job, now: i64) -> Option<i64> {
        let after = s.class(&job.priority).and_then(|c| c.preempt_after_ms).unwrap_or(0);
        let wait = after - (now - job.submitted_ms);
        (wait > 0).then_some(wait)
    }

    fn may_take(&self, _: &Job, rank: u8, victim: &Victim<'_>) -> bool {
        victim.rank > rank
    }

    fn cause(&self, job: &Job) -> PreemptCause {
        PreemptCause::Priority {
            by: job.id,
            class: job.priority.clone(),
        }
    }

    fn code(&self) -> &'static str {
        "priority"
    }
}

#[cfg(test)]
mod tests {
    use super::super::Decision;
    use super::super::Scheduler;
    use super::super::testing::{config, engine, job, preempted, sched};
    use crate::reason::{PreemptCause, Wait};

    #[test]
    fn a_class_preempts_only_after_waiting_its_preempt_after() {
        let mut cfg = config();
        for c in &mut cfg.classes {
            if c.name == "high" {
                c.preempt_after_ms = Some(60_000);
            }
        }
        let mut s = Scheduler::new(engine(), cfg);
        for i in 0..16 {
            s.submit(job(i, "a", 8, "standard", 0), 0);
        }
        let d = s.submit(job(100, "b", 8, "high", 10_000), 10_000);
        let [Decision::Waiting { reason, .. }] = &d[..] else {
            panic!("{d:?}")
        };
        assert!(
            reason
                .to_string()
                .ends_with("; priority high: may preempt lower-priority work at 00:01:10 UTC (in 60 s) unless capacity frees sooner"),
            "{reason}"
        );
        assert!(preempted(&s.cycle(69_999)).is_empty(), "waited 59.999 s");
        assert_eq!(preempted(&s.cycle(70_000)).len(), 1, "waited a minute");
        // Critical has no such wait.
        let d = s.submit(job(101, "b", 8, "critical", 70_001), 70_001);
        assert_eq!(preempted(&d).len(), 1, "{d:?}");
    }

    #[test]
    fn priority_preemption_picks_the_minimal_victim_set_and_spares_critical() {
        let mut s = sched();
        // Fill 15 nodes with one 8-GPU opportunistic job each, and one node with 8 single GPUs.
        for i in 0..15 {
            s.submit(job(i, "a", 8, if i == 0 { "critical" } else { "opportunistic" }, 0), 0);
        }
        for i in 0..8 {
            s.submit(job(100 + i, "a", 1, "opportunistic", 0), 0);
        }
        let acts = s.submit(job(500, "b", 8, "high", 5000), 5000);
        let v = preempted(&acts);
        assert_eq!(v.len(), 1, "one 8-GPU victim beats eight 1-GPU ones: {acts:?}");
        assert_ne!(v[0], 0, "critical is never preempted");
        assert!(v[0] < 15);
    }

    #[test]
    fn priority_preemption_never_goes_sideways_or_up_and_waits_for_the_minimum_runtime() {
        let mut s = sched();
        for i in 0..16 {
            s.submit(job(i, "a", 8, if i < 8 { "high" } else { "standard" }, 0), 0);
        }
        assert!(
            preempted(&s.submit(job(100, "b", 8, "standard", 10), 10)).is_empty(),
            "same rank: no preemption"
        );
        assert!(
            preempted(&s.submit(job(101, "b", 8, "high", 500), 500)).is_empty(),
            "lower ranks are younger than the minimum runtime"
        );
        let d = s.cycle(2000);
        let v = preempted(&d);
        assert_eq!(v.len(), 1, "{d:?}");
        assert!(v[0] >= 8, "only the standard work is taken: {v:?}");
        let reason = d.iter().find_map(|d| match d {
            Decision::Waiting { id: 101, reason } => Some(reason.clone()),
            _ => None,
        });
        assert!(
            matches!(
                reason,
                Some(Wait::Preempting {
                    victims: 1,
                    cause: PreemptCause::Priority { by: 101, .. }
                })
            ),
            "{reason:?}"
        );
    }
}
