//! A cycle's session: the jobs the cycle considers, in queue order, what has become of each so
//! far, and the decisions taken. Actions read and advance it one after the other; closing it
//! records why the jobs left waiting wait and drops the placed and refused ones from the queue.
//!
//! A job is known by its position in the session's order: every action walks the whole queue,
//! every cycle, so the per-job state is a vector, not a map.

use std::rc::Rc;
use std::sync::Arc;

use tessera_model::PoolId;

use super::admit::Exceeded;
use super::{Decision, Queued, Scheduler};
use crate::reason::{LimitExceeded, PreemptCause, Refusal, Wait};

/// What has become of a job so far this cycle.
#[derive(Debug)]
pub(super) enum Status {
    /// Not looked at yet (or by no action that decides anything for it).
    Pending,
    /// Passed admission: the pools it may go to, in the engine's order, each with the limit it
    /// exceeded at admission, if any.
    Admitted(Vec<(PoolId, Option<LimitExceeded>)>),
    Placed,
    Refused,
    /// Waits for a reason no later action looks at (a limit, a budget, a backoff, victims).
    Waiting(Wait),
    /// Found no capacity. `searchable`: reclaim and preempt may look for victims for it. The
    /// reason is shared by the requests of the same shape that fail after it.
    Starved {
        reason: Rc<Wait>,
        searchable: bool,
    },
}

pub(super) struct Session<'a> {
    pub sched: &'a mut Scheduler,
    pub now: i64,
    /// The jobs this cycle considers, in queue order.
    pub jobs: Rc<[Arc<Queued>]>,
    status: Vec<Status>,
    /// Which jobs have had a victim search this cycle (reclaim and preempt share the budget),
    /// and how many.
    searched: Vec<bool>,
    searches: usize,
    decisions: Vec<Decision>,
}

impl<'a> Session<'a> {
    pub fn new(sched: &'a mut Scheduler, now: i64, jobs: Rc<[Arc<Queued>]>) -> Self {
        let n = jobs.len();
        Session {
            sched,
            now,
            jobs,
            status: (0..n).map(|_| Status::Pending).collect(),
            searched: vec![false; n],
            searches: 0,
            decisions: Vec::new(),
        }
    }

    /// The status of the job at position `i`.
    pub fn status(&self, i: usize) -> &Status {
        &self.status[i]
    }

    pub fn set(&mut self, i: usize, status: Status) {
        self.status[i] = status;
    }

    /// The pools of an admitted job, taken out of its status: whoever takes them sets the
    /// job's next status.
    pub fn take_admitted(&mut self, i: usize) -> Option<Vec<(PoolId, Option<LimitExceeded>)>> {
        match &mut self.status[i] {
            Status::Admitted(pools) => Some(std::mem::take(pools)),
            _ => None,
        }
    }

    /// Gives the job at `i` a victim search, if it has one already or the budget
    /// (`max_preemption_searches`) allows another.
    pub fn search_slot(&mut self, i: usize) -> bool {
        if self.searched[i] {
            return true;
        }
        if self.searches >= self.sched.cfg.max_preemption_searches {
            return false;
        }
        self.searched[i] = true;
        self.searches += 1;
        true
    }

    pub fn decide(&mut self, d: Decision) {
        self.decisions.push(d);
    }

    /// The job at `i`, over a limit or budget, waits, or is refused if it asked not to wait.
    pub fn exceeded(&mut self, i: usize, over: Exceeded) {
        if self.jobs[i].job.wait_if_over_limit {
            self.set(i, Status::Waiting(over.wait()));
        } else {
            self.refuse(i, over.refusal());
        }
    }

    pub fn refuse(&mut self, i: usize, reason: Refusal) {
        let id = self.jobs[i].job.id;
        self.decide(Decision::Refused { id, reason });
        self.set(i, Status::Refused);
    }

    /// The job at `i` waits for `victims` to stop: they are marked stopping and told to stop,
    /// and the job goes first once they have.
    pub fn nominate(&mut self, i: usize, victims: Vec<u64>, cause: PreemptCause) {
        let now = self.now;
        let by = self.jobs[i].job.id;
        for &v in &victims {
            self.sched.stopping(v);
            let e = self.sched.preempted.entry(v).or_insert((0, now));
            *e = (e.0 + 1, now);
            self.decide(Decision::Preempt {
                victim: v,
                by,
                cause: cause.clone(),
            });
        }
        let reason = Wait::Preempting {
            victims: victims.len(),
            cause,
        };
        self.set(i, Status::Waiting(reason));
        let nodes = victims
            .iter()
            .flat_map(|v| match self.sched.running.get(v) {
                Some(r) => r.nodes().map(|n| n.0).collect::<Vec<_>>(),
                None => self.sched.engine.allocation(*v).map(|a| a.node.0).into_iter().collect(),
            })
            .collect();
        let victims = victims.into_iter().collect();
        self.sched.nominated.insert(by, super::Nomination { victims, nodes });
    }

    /// The starved job at `i` will look for victims once it has waited `in_ms` more (`cause`
    /// says whose capacity it may take): its reason says so, the sooner of two rules winning.
    /// It stays starved, for the actions after this one.
    pub fn preempts_in(&mut self, i: usize, cause: PreemptCause, in_ms: i64) {
        let Status::Starved { reason, searchable } = &self.status[i] else {
            return;
        };
        let in_s = (in_ms + 999) / 1000;
        let now = match &**reason {
            Wait::PreemptsIn { in_s: sooner, .. } if *sooner <= in_s => return,
            Wait::PreemptsIn { now, .. } => now.clone(),
            other => Box::new(other.clone()),
        };
        let reason = Rc::new(Wait::PreemptsIn {
            now,
            cause,
            at_ms: self.now + in_ms,
            in_s,
        });
        self.status[i] = Status::Starved {
            reason,
            searchable: *searchable,
        };
    }

    /// The job at `i` waits for consolidation `moves` (see [`consolidate`](super::consolidate)):
    /// the moved work is marked stopping and told to move, counted against its tenant's
    /// disruption budget, and the nodes it leaves (`nodes`) are held for the job.
    pub fn consolidate(&mut self, i: usize, moves: Vec<super::consolidate::Move>, nodes: Vec<u32>) {
        let now = self.now;
        let by = self.jobs[i].job.id;
        for m in &moves {
            self.sched.stopping(m.id);
            if let Some(r) = self.sched.running.get(&m.id) {
                let t = self.sched.disruptions.entry(r.tenant.clone()).or_default();
                t.retain(|&at| now - at < 3_600_000);
                t.push_back(now);
            }
            let to = (m.how == super::Movable::Replace).then(|| m.to.clone());
            if to.is_some() {
                self.sched.replacing.insert(m.id);
            }
            self.decide(Decision::Move { id: m.id, by, to });
        }
        if let Status::Starved { reason, .. } = &self.status[i] {
            let reason = (**reason).clone();
            self.set(i, Status::Waiting(reason));
        }
        let victims = moves.iter().map(|m| m.id).collect();
        let nodes = nodes.into_iter().collect();
        self.sched.nominated.insert(by, super::Nomination { victims, nodes });
    }

    /// Ends the cycle: a `Waiting` decision for each job whose kind of reason changed
    /// ([`Wait::same_kind`]; a free-unit count moving is not worth a stored event), in queue
    /// order, and the placed and refused jobs leave the queue.
    pub fn close(self) -> Vec<Decision> {
        let Session {
            sched,
            jobs,
            status,
            mut decisions,
            ..
        } = self;
        let mut done: Vec<u64> = Vec::new();
        for (q, st) in jobs.iter().zip(status) {
            let id = q.job.id;
            let changed = |sched: &Scheduler, r: &Wait| sched.reasons.get(&id).is_none_or(|old| !old.same_kind(r));
            let reason = match st {
                Status::Placed => {
                    done.push(id);
                    continue;
                }
                Status::Refused => {
                    sched.reasons.remove(&id);
                    sched.nominated.remove(&id);
                    done.push(id);
                    continue;
                }
                Status::Waiting(reason) if changed(sched, &reason) => reason,
                Status::Starved { reason, .. } if changed(sched, &reason) => Rc::unwrap_or_clone(reason),
                Status::Pending | Status::Admitted(_) | Status::Waiting(_) | Status::Starved { .. } => continue,
            };
            sched.reasons.insert(id, reason.clone());
            decisions.push(Decision::Waiting { id, reason });
        }
        for id in done {
            sched.queue.remove(id);
        }
        decisions
    }
}
