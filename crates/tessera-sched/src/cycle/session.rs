//! A cycle's session: the jobs the cycle considers, in queue order, what has become of each so
//! far, and the decisions taken. Actions read and advance it one after the other; closing it
//! records why the jobs left waiting wait and drops the placed and refused ones from the queue.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tessera_model::PoolId;

use super::admit::Exceeded;
use super::{Decision, Job, Queued, Scheduler};
use crate::reason::{LimitExceeded, PreemptCause, Refusal, Wait};

/// What has become of a job so far this cycle.
#[derive(Clone, Debug)]
pub(super) enum Status {
    /// Passed admission: the pools it may go to, in the engine's order, each with the limit it
    /// exceeded at admission, if any.
    Admitted(Vec<(PoolId, Option<LimitExceeded>)>),
    Placed,
    Refused,
    /// Waits for a reason no later action looks at (a limit, a budget, a backoff, victims).
    Waiting(Wait),
    /// Found no capacity. `searchable`: reclaim and preempt may look for victims for it.
    Starved {
        reason: Wait,
        searchable: bool,
    },
}

pub(super) struct Session<'a> {
    pub sched: &'a mut Scheduler,
    pub now: i64,
    /// The jobs this cycle considers, in queue order.
    pub jobs: Vec<Arc<Queued>>,
    /// Jobs that have searched for victims this cycle (reclaim and preempt share the budget).
    pub searched: HashSet<u64>,
    status: HashMap<u64, Status>,
    decisions: Vec<Decision>,
}

impl<'a> Session<'a> {
    pub fn new(sched: &'a mut Scheduler, now: i64, jobs: Vec<Arc<Queued>>) -> Self {
        Session {
            sched,
            now,
            jobs,
            searched: HashSet::new(),
            status: HashMap::new(),
            decisions: Vec::new(),
        }
    }

    pub fn status(&self, id: u64) -> Option<&Status> {
        self.status.get(&id)
    }

    /// The pools of an admitted job, taken out of its status: whoever takes them sets the
    /// job's next status.
    pub fn take_admitted(&mut self, id: u64) -> Option<Vec<(PoolId, Option<LimitExceeded>)>> {
        match self.status.get_mut(&id) {
            Some(Status::Admitted(pools)) => Some(std::mem::take(pools)),
            _ => None,
        }
    }

    pub fn set(&mut self, id: u64, status: Status) {
        self.status.insert(id, status);
    }

    pub fn decide(&mut self, d: Decision) {
        self.decisions.push(d);
    }

    /// A job over a limit or budget waits, or is refused if it asked not to wait.
    pub fn exceeded(&mut self, job: &Job, over: Exceeded) {
        if job.wait_if_over_limit {
            self.set(job.id, Status::Waiting(over.wait()));
        } else {
            self.refuse(job.id, over.refusal());
        }
    }

    pub fn refuse(&mut self, id: u64, reason: Refusal) {
        self.decide(Decision::Refused { id, reason });
        self.set(id, Status::Refused);
    }

    /// `job` waits for `victims` to stop: they are marked stopping and told to stop, and `job`
    /// goes first once they have.
    pub fn nominate(&mut self, job: &Job, victims: Vec<u64>, cause: PreemptCause) {
        let now = self.now;
        for &v in &victims {
            self.sched.stopping(v);
            let e = self.sched.preempted.entry(v).or_insert((0, now));
            *e = (e.0 + 1, now);
            self.decide(Decision::Preempt {
                victim: v,
                by: job.id,
                cause: cause.clone(),
            });
        }
        let reason = Wait::Preempting {
            victims: victims.len(),
            cause,
        };
        self.set(job.id, Status::Waiting(reason));
        self.sched.nominated.insert(job.id, victims.into_iter().collect());
    }

    /// Ends the cycle: a `Waiting` decision for each job whose kind of reason changed
    /// ([`Wait::same_kind`]; a free-unit count moving is not worth a stored event), in queue
    /// order, and the placed and refused jobs leave the queue.
    pub fn close(self) -> Vec<Decision> {
        let Session {
            sched,
            jobs,
            mut status,
            mut decisions,
            ..
        } = self;
        let mut done: HashSet<u64> = HashSet::new();
        for q in &jobs {
            let id = q.job.id;
            match status.remove(&id) {
                Some(Status::Placed) => {
                    done.insert(id);
                }
                Some(Status::Refused) => {
                    sched.reasons.remove(&id);
                    sched.nominated.remove(&id);
                    done.insert(id);
                }
                Some(Status::Waiting(reason) | Status::Starved { reason, .. }) => {
                    if sched.reasons.get(&id).is_none_or(|old| !old.same_kind(&reason)) {
                        sched.reasons.insert(id, reason.clone());
                        decisions.push(Decision::Waiting { id, reason });
                    }
                }
                Some(Status::Admitted(_)) | None => {}
            }
        }
        if !done.is_empty() {
            sched.queue.retain(|q| !done.contains(&q.job.id));
        }
        decisions
    }
}
