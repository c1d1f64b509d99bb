//! The lifecycle of one workload as a pure function:
//! `transition(workload, input) -> (workload, events, effects)`.
//!
//! Inputs come from the scheduler (placed, waiting, refused, preempt), from people (cancel),
//! from the backend (partitioned, running, exited, lost, stopped …) and from crash recovery
//! (what the backend says of a workload after a control-plane restart). The function decides
//! the new phase and returns the timeline events to record and the effects to carry out; it
//! does no I/O and reads no clock (every input carries its time). The lifecycle loop around it
//! only batches, commits, answers and executes the effects.
//!
//! An input that makes no sense in the current phase (a late backend report, a second cancel)
//! changes nothing. Capacity is returned exactly once ([`Effect::Release`] leaves every phase
//! that holds an allocation), a usage interval is open exactly while the workload runs, and the
//! partition is recorded ([`Phase::Partitioned`]) before the workload is started, so recovery
//! never partitions twice.

use std::borrow::Cow;
use std::sync::Arc;

use crate::event::{Event, Step};
use crate::reason::{Reason, ReasonCode};
use crate::workload::{Phase, Placement, PreemptCode, StopCause, Workload};

/// What happened to a workload.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// The scheduler placed it; the engine already holds the allocation. `shares`: a
    /// multi-node gang's node-shares after the first (`placement`); empty otherwise.
    Placed {
        at: i64,
        placement: Placement,
        shares: Vec<Placement>,
        borrowing: bool,
    },
    /// The scheduler says why it waits (sent when the kind of reason changes).
    Waiting {
        at: i64,
        reason: Reason,
    },
    /// The scheduler refuses it for good.
    Refused {
        at: i64,
        reason: Reason,
    },
    /// The scheduler takes its capacity for another workload.
    Preempt {
        at: i64,
        by: crate::WorkloadId,
        code: PreemptCode,
        detail: String,
        grace_s: u64,
    },
    /// A person or token cancels it.
    Cancel {
        at: i64,
        by: String,
        grace_s: u64,
    },
    /// The backend created its partition.
    Partitioned {
        at: i64,
        detail: String,
    },
    PartitionFailed {
        at: i64,
        detail: String,
    },
    /// The backend chose the devices (backends that assign devices per node, not exactly).
    Bound {
        placement: Placement,
    },
    StartFailed {
        at: i64,
        detail: String,
    },
    /// The backend reports it running.
    Running {
        at: i64,
        /// `started by the sim backend`.
        detail: String,
        /// The first telemetry of its GPUs, for the `observed` step.
        observed: String,
    },
    /// It ended on its own.
    Exited {
        at: i64,
        success: bool,
        detail: String,
    },
    /// The backend lost it: node gone, evicted, deleted behind Tessera's back.
    Lost {
        at: i64,
        detail: String,
    },
    /// The backend finished stopping it.
    Stopped {
        at: i64,
    },
    /// After a control-plane restart, what the backend says of it.
    Recovered {
        at: i64,
        observed: Observed,
        grace_s: u64,
    },
    /// News about the workload that changes nothing of its phase (a GPU it runs on became
    /// unhealthy, its node is drained): an `observed` event with a reason code, for the
    /// tenant's timeline. Ignored once the workload has ended.
    Notice {
        at: i64,
        code: ReasonCode,
        detail: String,
    },
    /// After a restart, its stored request or allocation no longer fits the fleet; its
    /// allocation was not restored.
    Invalid {
        at: i64,
        detail: String,
    },
}

/// What the backend reports of a workload when the control plane recovers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observed {
    /// Running since then (when the backend knows).
    Running {
        since: Option<i64>,
    },
    /// Accepted, not running yet.
    Starting,
    Succeeded,
    Failed {
        detail: String,
    },
    /// The backend does not know it.
    Unknown {
        detail: String,
    },
}

/// What the lifecycle loop must do after a transition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Create the placement's partition on the backend (idempotent).
    Partition,
    /// Start the workload on the backend (idempotent).
    Start,
    /// Stop it on the backend (grace period, then forced).
    Stop { grace_s: u64 },
    /// Undo its partition once it is gone.
    Unpartition,
    /// Return its allocation to the scheduler.
    Release,
    /// Put it (back) in the scheduler's queue.
    Requeue,
    /// Take it out of the scheduler's queue.
    Dequeue,
    /// Open usage interval `seq` of the ledger at `at`.
    OpenUsage { seq: u32, at: i64 },
    /// Close usage interval `seq` at `at`.
    CloseUsage { seq: u32, at: i64 },
}

/// The result of a transition: the workload's record after it (`W`: the record, or a shared
/// one from [`transition_shared`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Transition<W = Workload> {
    pub workload: W,
    pub events: Vec<Event>,
    pub effects: Vec<Effect>,
    /// Whether the record changed (and must be stored).
    pub changed: bool,
}

/// A transition in progress. The record is copied on its first change ([`Draft::w`]), so that
/// an input that changes nothing copies nothing.
struct Draft<'a> {
    w: Cow<'a, Workload>,
    events: Vec<Event>,
    effects: Vec<Effect>,
    changed: bool,
}

impl Draft<'_> {
    /// The record, to change.
    fn w(&mut self) -> &mut Workload {
        self.w.to_mut()
    }

    fn event(&mut self, step: Step, at: i64, detail: String, code: Option<ReasonCode>) {
        self.events.push(Event {
            seq: self.w.next_seq,
            step,
            at,
            detail,
            code,
        });
        self.w().next_seq += 1;
        self.changed = true;
    }

    fn phase(&mut self, p: Phase) {
        self.w().phase = p;
        self.changed = true;
    }

    /// Closes the open usage interval, if any.
    fn close_usage(&mut self, at: i64) {
        if self.w.usage.open {
            self.effects.push(Effect::CloseUsage {
                seq: self.w.usage.seq,
                at,
            });
            self.w().usage.seq += 1;
            self.w().usage.open = false;
            self.changed = true;
        }
    }

    /// Returns the allocation (with the `released` event) and closes the usage interval.
    fn release(&mut self, at: i64) {
        if self.w.phase.holds_capacity() {
            let units = self.w.held_units();
            let node = self
                .w
                .placements()
                .map(|p| p.node.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            let held_ms = self.w.running_at.map(|r| (at - r).max(0)).unwrap_or(0);
            let unit_hours = units.as_f64() * held_ms as f64 / 3_600_000.0;
            self.effects.push(Effect::Release);
            self.event(
                Step::Released,
                at,
                format!(
                    "returned {units} GPU units on {node}; held {:.1} s ({unit_hours:.4} GPU-unit-hours)",
                    held_ms as f64 / 1000.0
                ),
                None,
            );
        }
        self.close_usage(at);
    }

    /// Ends the workload in a terminal phase.
    fn finish(&mut self, phase: Phase, at: i64, reason: Option<Reason>) {
        self.release(at);
        self.w().phase = phase;
        self.w().reason = reason;
        self.w().ended_at = Some(at);
        self.w().stop = None;
        self.changed = true;
    }

    /// Ends a workload that fails, with a `failed` event.
    fn fail(&mut self, at: i64, reason: Reason, unpartition: bool) {
        self.event(Step::Failed, at, reason.detail.clone(), Some(reason.code));
        if unpartition {
            self.effects.push(Effect::Unpartition);
        }
        self.finish(Phase::Failed, at, Some(reason));
    }

    /// Starts stopping a workload that holds capacity.
    fn stop(&mut self, cause: StopCause, grace_s: u64) {
        self.w().stop = Some(cause);
        self.phase(Phase::Stopping);
        self.effects.push(Effect::Stop { grace_s });
    }

    /// The backend says it runs: the `running`, `observed` and `metered` steps.
    ///
    /// A backend's clock is not the control plane's (a kubelet's, a simulator's): a start it
    /// dates before the request was received is taken as the request's time, so that no usage
    /// interval begins before its workload was submitted.
    fn running(&mut self, at: i64, detail: String, observed: String) {
        let at = at.max(self.w.created_at);
        self.event(Step::Running, at, detail, None);
        self.event(Step::Observed, at, observed, None);
        let units = self.w.held_units();
        let (model, pool) = self
            .w
            .placement
            .as_ref()
            .map(|p| (p.model.clone(), p.pool.clone()))
            .unwrap_or_default();
        self.event(
            Step::Metered,
            at,
            format!("usage interval opened: {units} GPU units of {model} in pool {pool}"),
            None,
        );
        self.w().running_at = Some(at);
        self.w().usage.open = true;
        self.effects.push(Effect::OpenUsage {
            seq: self.w.usage.seq,
            at,
        });
        self.phase(Phase::Running);
    }

    /// The stop finished: requeue preempted batch work, or end it.
    fn stopped(&mut self, at: i64) {
        self.effects.push(Effect::Unpartition);
        match self.w.stop.clone() {
            Some(StopCause::Preempted { by, code, detail }) => {
                let why = match code {
                    PreemptCode::Health | PreemptCode::Drain | PreemptCode::Consolidation => {
                        format!("stopped: {detail}")
                    }
                    _ => format!("preempted by workload {by}: {detail}"),
                };
                if self.w.spec.requeue_on_preemption() {
                    self.release(at);
                    let reason = Reason::new(ReasonCode::Requeued, format!("requeued after being {why}"));
                    self.event(Step::Queued, at, reason.detail.clone(), Some(reason.code));
                    self.w().phase = Phase::Queued;
                    self.w().reason = Some(reason);
                    self.w().placement = None;
                    self.w().shares.clear();
                    self.w().running_at = None;
                    self.w().borrowing = false;
                    self.w().stop = None;
                    self.effects.push(Effect::Requeue);
                } else {
                    self.finish(Phase::Preempted, at, Some(Reason::new(preempt_reason(code), why)));
                }
            }
            Some(StopCause::Cancelled { by }) => {
                self.finish(
                    Phase::Cancelled,
                    at,
                    Some(Reason::new(ReasonCode::Cancelled, format!("cancelled by {by}"))),
                );
            }
            None => {
                let reason = self.w.reason.clone();
                self.finish(Phase::Cancelled, at, reason);
            }
        }
    }
}

/// The reason code of a preemption kind.
fn preempt_reason(code: PreemptCode) -> ReasonCode {
    match code {
        PreemptCode::Priority => ReasonCode::PreemptedPriority,
        PreemptCode::Reclaim => ReasonCode::PreemptedReclaim,
        PreemptCode::Health => ReasonCode::GpuUnhealthy,
        PreemptCode::Drain => ReasonCode::NodeDrain,
        PreemptCode::Consolidation => ReasonCode::Consolidation,
    }
}

/// Applies `input` to `w`.
pub fn transition(w: Workload, input: Input) -> Transition {
    let t = apply(Cow::Owned(w), input);
    Transition {
        workload: t.workload.into_owned(),
        events: t.events,
        effects: t.effects,
        changed: t.changed,
    }
}

/// Applies `input` to a shared record: the record comes back as it was (the same `Arc`, not a
/// copy) unless the input changes it.
pub fn transition_shared(w: Arc<Workload>, input: Input) -> Transition<Arc<Workload>> {
    let t = apply(Cow::Borrowed(&*w), input);
    Transition {
        workload: match t.workload {
            Cow::Owned(changed) => Arc::new(changed),
            Cow::Borrowed(_) => w.clone(),
        },
        events: t.events,
        effects: t.effects,
        changed: t.changed,
    }
}

fn apply(w: Cow<'_, Workload>, input: Input) -> Transition<Cow<'_, Workload>> {
    let mut s = Draft {
        w,
        events: Vec::new(),
        effects: Vec::new(),
        changed: false,
    };
    let phase = s.w.phase;
    match input {
        Input::Placed {
            at,
            placement,
            shares,
            borrowing,
        } if phase.is_waiting() => {
            let mut detail = if shares.is_empty() {
                format!(
                    "{placement} on {} ({}), {} GPU units",
                    placement.node, placement.pool, placement.units
                )
            } else {
                let units = shares.iter().fold(placement.units, |u, p| u + p.units);
                let nodes: Vec<String> = std::iter::once(&placement)
                    .chain(shares.iter())
                    .map(|p| format!("{} ({} GPUs)", p.node, p.gpus.len()))
                    .collect();
                format!(
                    "a gang of {} node-shares in pool {}: {}; {units} GPU units",
                    shares.len() + 1,
                    placement.pool,
                    nodes.join(", ")
                )
            };
            if borrowing {
                detail.push_str("; borrowing idle capacity above the tenant's guaranteed share (preemptible)");
            }
            s.w().placement = Some(placement);
            s.w().shares = shares;
            s.w().borrowing = borrowing;
            s.w().reason = None;
            s.phase(Phase::Placed);
            s.event(Step::Placed, at, detail, None);
            s.effects.push(Effect::Partition);
        }
        Input::Waiting { at, reason } if phase.is_waiting() => {
            s.event(Step::Queued, at, reason.detail.clone(), Some(reason.code));
            s.w().reason = Some(reason);
            s.phase(Phase::Queued);
        }
        Input::Refused { at, reason } if phase.is_waiting() => {
            let reason = Reason::new(reason.code, format!("refused: {}", reason.detail));
            s.effects.push(Effect::Dequeue);
            s.fail(at, reason, false);
        }
        Input::Cancel { at, by, .. } if phase.is_waiting() => {
            let reason = Reason::new(ReasonCode::Cancelled, format!("cancelled by {by} before it was placed"));
            s.event(Step::Cancelled, at, reason.detail.clone(), Some(reason.code));
            s.effects.push(Effect::Dequeue);
            s.finish(Phase::Cancelled, at, Some(reason));
        }
        Input::Cancel { at, by, grace_s } if matches!(phase, Phase::Placed | Phase::Partitioned | Phase::Running) => {
            s.event(
                Step::Cancelled,
                at,
                format!("cancelled by {by}; stopping within {grace_s} s"),
                Some(ReasonCode::Cancelled),
            );
            s.w().reason = Some(Reason::new(ReasonCode::Cancelled, format!("cancelled by {by}")));
            s.stop(StopCause::Cancelled { by }, grace_s);
        }
        Input::Preempt {
            at,
            by,
            code,
            detail,
            grace_s,
        } if matches!(phase, Phase::Placed | Phase::Partitioned | Phase::Running) => {
            let rc = preempt_reason(code);
            let text = match code {
                PreemptCode::Health | PreemptCode::Drain | PreemptCode::Consolidation => {
                    format!("{detail}; stopping within {grace_s} s")
                }
                _ => format!("preempted by workload {by}: {detail}; stopping within {grace_s} s"),
            };
            s.event(Step::Preempted, at, text, Some(rc));
            s.stop(StopCause::Preempted { by, code, detail }, grace_s);
        }
        Input::Partitioned { at, detail } if phase == Phase::Placed => {
            s.event(Step::Partitioned, at, detail, None);
            s.phase(Phase::Partitioned);
            s.effects.push(Effect::Start);
        }
        Input::PartitionFailed { at, detail } if phase == Phase::Placed => {
            s.fail(at, Reason::new(ReasonCode::PartitionFailed, detail), true);
        }
        Input::Bound { placement }
            if matches!(phase, Phase::Placed | Phase::Partitioned | Phase::Running)
                && s.w.placement.as_ref() != Some(&placement) =>
        {
            s.w().placement = Some(placement);
            s.changed = true;
        }
        Input::StartFailed { at, detail } if phase == Phase::Partitioned => {
            s.fail(at, Reason::new(ReasonCode::StartFailed, detail), true);
        }
        Input::Running { at, detail, observed } if phase == Phase::Partitioned => {
            s.running(at, detail, observed);
        }
        Input::Exited { at, success, detail } if matches!(phase, Phase::Partitioned | Phase::Running) => {
            if success {
                s.effects.push(Effect::Unpartition);
                s.finish(Phase::Succeeded, at, None);
            } else {
                s.fail(at, Reason::new(ReasonCode::ExitFailure, detail), true);
            }
        }
        Input::Lost { at, detail } if matches!(phase, Phase::Placed | Phase::Partitioned | Phase::Running) => {
            s.fail(at, Reason::new(ReasonCode::Lost, detail), true);
        }
        Input::Lost { at, .. } | Input::Stopped { at } if phase == Phase::Stopping => s.stopped(at),
        Input::Recovered { at, observed, grace_s } => match (phase, observed) {
            (Phase::Pending | Phase::Queued, _) => {
                if phase == Phase::Pending {
                    s.phase(Phase::Queued);
                }
                s.effects.push(Effect::Requeue);
            }
            // The partition may or may not exist: creating it again is idempotent.
            (Phase::Placed, _) => s.effects.push(Effect::Partition),
            (Phase::Partitioned, Observed::Running { since }) => s.running(
                since.unwrap_or(at),
                "running on the backend; adopted after a control-plane restart".into(),
                "no telemetry taken at adoption".into(),
            ),
            (Phase::Partitioned, Observed::Starting) => {}
            (Phase::Partitioned, Observed::Unknown { .. }) => s.effects.push(Effect::Start),
            (Phase::Partitioned | Phase::Running, Observed::Succeeded) => {
                s.effects.push(Effect::Unpartition);
                s.finish(Phase::Succeeded, at, None);
            }
            (Phase::Partitioned | Phase::Running, Observed::Failed { detail }) => {
                s.fail(at, Reason::new(ReasonCode::ExitFailure, detail), true);
            }
            (Phase::Running, Observed::Unknown { detail }) => {
                s.fail(at, Reason::new(ReasonCode::Lost, detail), true);
            }
            (Phase::Running, Observed::Running { .. } | Observed::Starting) => {}
            (Phase::Stopping, Observed::Running { .. } | Observed::Starting) => {
                s.effects.push(Effect::Stop { grace_s });
            }
            (Phase::Stopping, _) => s.stopped(at),
            (_, _) => {}
        },
        Input::Notice { at, code, detail } if !phase.is_terminal() => {
            s.event(Step::Observed, at, detail, Some(code));
        }
        Input::Invalid { at, detail } if !phase.is_terminal() => {
            let reason = Reason::new(ReasonCode::Invalid, format!("no longer valid on this fleet: {detail}"));
            // The allocation was never restored: nothing to return to the scheduler.
            s.event(Step::Failed, at, reason.detail.clone(), Some(reason.code));
            s.effects.push(Effect::Dequeue);
            s.close_usage(at);
            s.w().placement = None;
            s.w().shares.clear();
            s.w().phase = Phase::Failed;
            s.w().reason = Some(reason);
            s.w().ended_at = Some(at);
            s.w().stop = None;
        }
        _ => {}
    }
    Transition {
        workload: s.w,
        events: s.events,
        effects: s.effects,
        changed: s.changed,
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::workload::{GpuSpec, Kind, ShapeSpec, Slice, WorkloadId, WorkloadSpec};
    use tessera_model::GpuUnits;

    fn spec(kind: Kind) -> WorkloadSpec {
        let shape = ShapeSpec::any(GpuSpec::Mig {
            profile: "3g.40gb".into(),
        });
        WorkloadSpec {
            cpu_milli: 2000,
            memory_mib: 8192,
            duration_s: Some(60),
            ..WorkloadSpec::new("vision", "train", "w", kind, shape)
        }
    }

    fn placement() -> Placement {
        Placement {
            pool: "serving".into(),
            node: "a100-00".into(),
            model: "A100-80GB".into(),
            gpus: vec![0],
            slice: Slice::Mig {
                profile: "3g.40gb".into(),
                profile_id: 9,
                start: 4,
                size: 4,
            },
            units: GpuUnits::milli(500),
        }
    }

    /// A workload in `phase`, as the lifecycle would have left it.
    fn in_phase(phase: Phase, kind: Kind) -> Workload {
        let mut w = Workload::new(WorkloadId(1), spec(kind), GpuUnits::milli(500), 1_000);
        w.phase = phase;
        w.next_seq = 2;
        if phase.holds_capacity() {
            w.placement = Some(placement());
        }
        if matches!(phase, Phase::Running | Phase::Stopping) {
            w.running_at = Some(2_000);
            w.usage.open = true;
        }
        if phase == Phase::Stopping {
            w.stop = Some(StopCause::Preempted {
                by: WorkloadId(9),
                code: PreemptCode::Priority,
                detail: "priority high (job 9) preempts lower-priority work".into(),
            });
        }
        if phase.is_terminal() {
            w.ended_at = Some(3_000);
        }
        w
    }

    /// One input of each kind.
    fn inputs() -> Vec<(&'static str, Input)> {
        let reason = Reason::new(ReasonCode::NoCapacity, "no-capacity: none free");
        vec![
            (
                "placed",
                Input::Placed {
                    at: 5_000,
                    placement: placement(),
                    shares: Vec::new(),
                    borrowing: false,
                },
            ),
            (
                "waiting",
                Input::Waiting {
                    at: 5_000,
                    reason: reason.clone(),
                },
            ),
            ("refused", Input::Refused { at: 5_000, reason }),
            (
                "preempt",
                Input::Preempt {
                    at: 5_000,
                    by: WorkloadId(9),
                    code: PreemptCode::Reclaim,
                    detail: "tenant b reclaims its guaranteed share from borrowers (job 9)".into(),
                    grace_s: 30,
                },
            ),
            (
                "cancel",
                Input::Cancel {
                    at: 5_000,
                    by: "tok-admin".into(),
                    grace_s: 30,
                },
            ),
            (
                "partitioned",
                Input::Partitioned {
                    at: 5_000,
                    detail: "created".into(),
                },
            ),
            (
                "partition-failed",
                Input::PartitionFailed {
                    at: 5_000,
                    detail: "partitioning failed: busy".into(),
                },
            ),
            (
                "bound",
                Input::Bound {
                    placement: Placement {
                        gpus: vec![3],
                        ..placement()
                    },
                },
            ),
            (
                "start-failed",
                Input::StartFailed {
                    at: 5_000,
                    detail: "start failed: no image".into(),
                },
            ),
            (
                "running",
                Input::Running {
                    at: 5_000,
                    detail: "started by the sim backend".into(),
                    observed: "a100-00 GPU 0: busy".into(),
                },
            ),
            (
                "exited-ok",
                Input::Exited {
                    at: 5_000,
                    success: true,
                    detail: "completed".into(),
                },
            ),
            (
                "exited-failed",
                Input::Exited {
                    at: 5_000,
                    success: false,
                    detail: "exit code 1".into(),
                },
            ),
            (
                "lost",
                Input::Lost {
                    at: 5_000,
                    detail: "node gone".into(),
                },
            ),
            ("stopped", Input::Stopped { at: 5_000 }),
            (
                "recovered-running",
                Input::Recovered {
                    at: 5_000,
                    observed: Observed::Running { since: Some(4_000) },
                    grace_s: 30,
                },
            ),
            (
                "recovered-starting",
                Input::Recovered {
                    at: 5_000,
                    observed: Observed::Starting,
                    grace_s: 30,
                },
            ),
            (
                "recovered-succeeded",
                Input::Recovered {
                    at: 5_000,
                    observed: Observed::Succeeded,
                    grace_s: 30,
                },
            ),
            (
                "recovered-failed",
                Input::Recovered {
                    at: 5_000,
                    observed: Observed::Failed {
                        detail: "exit code 2".into(),
                    },
                    grace_s: 30,
                },
            ),
            (
                "recovered-unknown",
                Input::Recovered {
                    at: 5_000,
                    observed: Observed::Unknown {
                        detail: "the sim backend no longer knows this workload".into(),
                    },
                    grace_s: 30,
                },
            ),
            (
                "invalid",
                Input::Invalid {
                    at: 5_000,
                    detail: "node a100-00 is not in the fleet".into(),
                },
            ),
        ]
    }

    use Effect as E;
    use Phase as P;

    /// Every transition that does something: (phase, input) → (new phase, effects). Every pair
    /// not listed must leave the workload exactly as it was.
    fn table() -> Vec<(Phase, &'static str, Phase, Vec<Effect>)> {
        let stop = E::Stop { grace_s: 30 };
        let open = E::OpenUsage { seq: 0, at: 5_000 };
        let close = E::CloseUsage { seq: 0, at: 5_000 };
        // Every recovery's report; where a workload waits or is placed, each gives the same.
        let recovered = [
            "recovered-running",
            "recovered-starting",
            "recovered-succeeded",
            "recovered-failed",
            "recovered-unknown",
        ];
        let mut t = Vec::new();
        for p in [P::Pending, P::Queued] {
            t.push((p, "placed", P::Placed, vec![E::Partition]));
            t.push((p, "waiting", P::Queued, vec![]));
            t.push((p, "refused", P::Failed, vec![E::Dequeue]));
            t.push((p, "cancel", P::Cancelled, vec![E::Dequeue]));
            for r in recovered {
                t.push((p, r, P::Queued, vec![E::Requeue]));
            }
            t.push((p, "invalid", P::Failed, vec![E::Dequeue]));
        }
        for p in [P::Placed, P::Partitioned, P::Running] {
            t.push((p, "preempt", P::Stopping, vec![stop.clone()]));
            t.push((p, "cancel", P::Stopping, vec![stop.clone()]));
            t.push((p, "bound", p, vec![]));
            let mut lost = vec![E::Unpartition, E::Release];
            if p == P::Running {
                lost.push(close.clone());
            }
            t.push((p, "lost", P::Failed, lost));
            t.push((
                p,
                "invalid",
                P::Failed,
                if p == P::Running {
                    vec![E::Dequeue, close.clone()]
                } else {
                    vec![E::Dequeue]
                },
            ));
        }
        t.push((P::Placed, "partitioned", P::Partitioned, vec![E::Start]));
        t.push((
            P::Placed,
            "partition-failed",
            P::Failed,
            vec![E::Unpartition, E::Release],
        ));
        for r in recovered {
            t.push((P::Placed, r, P::Placed, vec![E::Partition]));
        }
        // Ended before it ran: the partition and the allocation go back.
        for (i, to) in [
            ("start-failed", P::Failed),
            ("exited-ok", P::Succeeded),
            ("exited-failed", P::Failed),
            ("recovered-succeeded", P::Succeeded),
            ("recovered-failed", P::Failed),
        ] {
            t.push((P::Partitioned, i, to, vec![E::Unpartition, E::Release]));
        }
        t.push((P::Partitioned, "running", P::Running, vec![open]));
        t.push((
            P::Partitioned,
            "recovered-running",
            P::Running,
            vec![E::OpenUsage { seq: 0, at: 4_000 }],
        ));
        t.push((P::Partitioned, "recovered-unknown", P::Partitioned, vec![E::Start]));
        let end = vec![E::Unpartition, E::Release, close.clone()];
        t.push((P::Running, "exited-ok", P::Succeeded, end.clone()));
        t.push((P::Running, "exited-failed", P::Failed, end.clone()));
        t.push((P::Running, "recovered-succeeded", P::Succeeded, end.clone()));
        t.push((P::Running, "recovered-failed", P::Failed, end.clone()));
        t.push((P::Running, "recovered-unknown", P::Failed, end.clone()));
        // A stopping workload here was preempted (batch: requeued).
        let requeue = vec![E::Unpartition, E::Release, close, E::Requeue];
        for i in [
            "stopped",
            "lost",
            "recovered-succeeded",
            "recovered-failed",
            "recovered-unknown",
        ] {
            t.push((P::Stopping, i, P::Queued, requeue.clone()));
        }
        for i in ["recovered-running", "recovered-starting"] {
            t.push((P::Stopping, i, P::Stopping, vec![stop.clone()]));
        }
        t.push((
            P::Stopping,
            "invalid",
            P::Failed,
            vec![E::Dequeue, E::CloseUsage { seq: 0, at: 5_000 }],
        ));
        t
    }

    /// On a shared record a transition gives what it gives on an owned one, and hands back the
    /// same record, uncopied, exactly when the input leaves it as it was.
    #[test]
    fn a_shared_record_is_copied_only_when_it_changes() {
        for phase in Phase::ALL {
            for (name, input) in inputs() {
                let before = Arc::new(in_phase(phase, Kind::Batch));
                let owned = transition((*before).clone(), input.clone());
                let shared = transition_shared(before.clone(), input);
                assert_eq!(*shared.workload, owned.workload, "{phase} + {name}");
                assert_eq!(
                    (&shared.events, &shared.effects, shared.changed),
                    (&owned.events, &owned.effects, owned.changed),
                    "{phase} + {name}"
                );
                assert_eq!(
                    Arc::ptr_eq(&shared.workload, &before),
                    owned.workload == *before,
                    "{phase} + {name}"
                );
            }
        }
    }

    #[test]
    fn every_phase_and_input() {
        let table = table();
        let mut covered = 0;
        for phase in Phase::ALL {
            for (name, input) in inputs() {
                let before = in_phase(phase, Kind::Batch);
                let t = transition(before.clone(), input);
                match table.iter().find(|(p, i, _, _)| *p == phase && *i == name) {
                    Some((_, _, to, effects)) => {
                        covered += 1;
                        assert_eq!(t.workload.phase, *to, "{phase} + {name}");
                        assert_eq!(&t.effects, effects, "{phase} + {name}");
                        assert_eq!(
                            t.changed,
                            t.workload != before,
                            "{phase} + {name}: changed says whether the record changed"
                        );
                        // Events are numbered on from the workload's timeline.
                        for (k, e) in t.events.iter().enumerate() {
                            assert_eq!(e.seq, before.next_seq + k as u32);
                        }
                        assert_eq!(t.workload.next_seq, before.next_seq + t.events.len() as u32);
                        if to.is_terminal() {
                            assert!(t.workload.ended_at.is_some() && t.workload.stop.is_none());
                            assert!(!t.workload.usage.open);
                        }
                    }
                    None => {
                        assert_eq!(t.workload, before, "{phase} + {name} must change nothing");
                        assert!(
                            t.events.is_empty() && t.effects.is_empty() && !t.changed,
                            "{phase} + {name}"
                        );
                    }
                }
            }
        }
        assert_eq!(covered, table.len(), "every table row names a real phase and input");
    }

    #[test]
    fn a_gang_holds_every_share_until_it_is_released_and_requeued() {
        let share = |node: &str| Placement {
            pool: "training".into(),
            node: node.into(),
            model: "H100-80GB-SXM".into(),
            gpus: (0..8).collect(),
            slice: Slice::Whole,
            units: GpuUnits::whole(8),
        };
        let w = Workload::new(WorkloadId(3), spec(Kind::Batch), GpuUnits::whole(24), 1_000);
        let t = transition(
            w,
            Input::Placed {
                at: 1_010,
                placement: share("h100-00"),
                shares: vec![share("h100-01"), share("h100-02")],
                borrowing: false,
            },
        );
        assert_eq!(t.workload.held_units(), GpuUnits::whole(24));
        assert!(t.workload.holds_on("h100-02") && !t.workload.holds_on("h100-03"));
        assert!(
            t.events[0].detail.contains("a gang of 3 node-shares in pool training: h100-00 (8 GPUs), h100-01 (8 GPUs), h100-02 (8 GPUs); 24 GPU units"),
            "{}",
            t.events[0].detail
        );
        let t = transition(
            t.workload,
            Input::Partitioned {
                at: 1_020,
                detail: String::new(),
            },
        );
        let t = transition(
            t.workload,
            Input::Running {
                at: 1_030,
                detail: String::new(),
                observed: String::new(),
            },
        );
        let metered = t.events.iter().find(|e| e.step == Step::Metered).unwrap();
        assert!(metered.detail.contains("24 GPU units"), "{}", metered.detail);
        let t = transition(
            t.workload,
            Input::Preempt {
                at: 4_030,
                by: WorkloadId(9),
                code: PreemptCode::Drain,
                detail: "node h100-01 drained".into(),
                grace_s: 0,
            },
        );
        let t = transition(t.workload, Input::Stopped { at: 4_040 });
        let released = t.events.iter().find(|e| e.step == Step::Released).unwrap();
        assert!(
            released
                .detail
                .contains("returned 24 GPU units on h100-00, h100-01, h100-02"),
            "{}",
            released.detail
        );
        assert_eq!(t.workload.phase, Phase::Queued);
        assert!(t.workload.placement.is_none() && t.workload.shares.is_empty());
        assert_eq!(t.effects.iter().filter(|e| matches!(e, Effect::Release)).count(), 1);
    }

    #[test]
    fn a_start_dated_before_the_request_opens_usage_at_the_request() {
        let w = Workload::new(WorkloadId(7), spec(Kind::Batch), GpuUnits::milli(500), 1_000);
        let t = transition(
            w,
            Input::Placed {
                at: 1_000,
                placement: placement(),
                shares: Vec::new(),
                borrowing: false,
            },
        );
        let t = transition(
            t.workload,
            Input::Partitioned {
                at: 1_000,
                detail: String::new(),
            },
        );
        // The backend's clock is a millisecond behind the control plane's.
        let t = transition(
            t.workload,
            Input::Running {
                at: 999,
                detail: String::new(),
                observed: String::new(),
            },
        );
        assert!(
            t.effects.contains(&Effect::OpenUsage { seq: 0, at: 1_000 }),
            "{:?}",
            t.effects
        );
        assert!(t.events.iter().all(|e| e.at == 1_000), "{:?}", t.events);
        assert_eq!(t.workload.request_to_running_ms(), Some(0));
    }

    #[test]
    fn a_workload_walks_the_whole_path() {
        let w = Workload::new(WorkloadId(7), spec(Kind::Batch), GpuUnits::milli(500), 1_000);
        let t = transition(
            w,
            Input::Placed {
                at: 1_010,
                placement: placement(),
                shares: Vec::new(),
                borrowing: true,
            },
        );
        assert!(t.events[0].detail.contains(
            "MIG 3g.40gb (profile 9) at slices 4..7 of GPU 0 on a100-00 (serving), 0.5 GPU units; borrowing"
        ));
        let t = transition(
            t.workload,
            Input::Partitioned {
                at: 1_020,
                detail: "created MIG GPU instance".into(),
            },
        );
        let t = transition(
            t.workload,
            Input::Running {
                at: 1_030,
                detail: "started by the sim backend".into(),
                observed: "busy".into(),
            },
        );
        let steps: Vec<Step> = t.events.iter().map(|e| e.step).collect();
        assert_eq!(steps, [Step::Running, Step::Observed, Step::Metered]);
        assert_eq!(t.workload.request_to_running_ms(), Some(30));
        let t = transition(
            t.workload,
            Input::Exited {
                at: 3_601_030,
                success: true,
                detail: "completed".into(),
            },
        );
        assert_eq!(t.workload.phase, Phase::Succeeded);
        assert_eq!(
            t.events[0].detail,
            "returned 0.5 GPU units on a100-00; held 3600.0 s (0.5000 GPU-unit-hours)"
        );
        assert_eq!(t.workload.usage.seq, 1, "the next interval would be the second");
    }

    #[test]
    fn preempted_services_end_and_preempted_batch_work_is_requeued() {
        for (kind, no_requeue, end) in [
            (Kind::Batch, false, Phase::Queued),
            (Kind::Batch, true, Phase::Preempted),
            (Kind::Service, false, Phase::Preempted),
        ] {
            let mut w = in_phase(Phase::Running, kind);
            w.spec.no_requeue = no_requeue;
            let t = transition(
                w,
                Input::Preempt {
                    at: 5_000,
                    by: WorkloadId(9),
                    code: PreemptCode::Priority,
                    detail: "priority high (job 9) preempts lower-priority work".into(),
                    grace_s: 30,
                },
            );
            let t = transition(t.workload, Input::Stopped { at: 6_000 });
            assert_eq!(t.workload.phase, end, "{kind:?} no_requeue={no_requeue}");
            let reason = t.workload.reason.clone().unwrap();
            if end == Phase::Queued {
                assert_eq!(reason.code, ReasonCode::Requeued);
                assert!(t.workload.placement.is_none() && t.workload.running_at.is_none());
            } else {
                assert_eq!(reason.code, ReasonCode::PreemptedPriority);
                assert_eq!(
                    reason.detail,
                    "preempted by workload 9: priority high (job 9) preempts lower-priority work"
                );
            }
        }
    }

    #[test]
    fn a_notice_adds_a_coded_event_and_changes_nothing_else() {
        let w = in_phase(Phase::Running, Kind::Service);
        let t = transition(
            w.clone(),
            Input::Notice {
                at: 7_000,
                code: ReasonCode::GpuUnhealthy,
                detail: "GPU 3 of a100-00 is unhealthy: XID 79".into(),
            },
        );
        assert!(t.changed && t.effects.is_empty());
        assert_eq!(t.workload.phase, Phase::Running);
        assert_eq!(t.events.len(), 1);
        assert_eq!(
            (t.events[0].step, t.events[0].code),
            (Step::Observed, Some(ReasonCode::GpuUnhealthy))
        );
        let mut done = w;
        done.phase = Phase::Succeeded;
        let t = transition(
            done,
            Input::Notice {
                at: 7_000,
                code: ReasonCode::GpuUnhealthy,
                detail: "late".into(),
            },
        );
        assert!(!t.changed && t.events.is_empty(), "ended work takes no notices");
    }

    #[test]
    fn a_health_stop_requeues_batch_work_and_ends_services() {
        for (kind, end, code) in [
            (Kind::Batch, Phase::Queued, ReasonCode::Requeued),
            (Kind::Service, Phase::Preempted, ReasonCode::GpuUnhealthy),
        ] {
            let w = in_phase(Phase::Running, kind);
            let id = w.id;
            let t = transition(
                w,
                Input::Preempt {
                    at: 5_000,
                    by: id,
                    code: PreemptCode::Health,
                    detail: "GPU 3 of a100-00 failed (XID 79)".into(),
                    grace_s: 10,
                },
            );
            assert_eq!(t.events[0].code, Some(ReasonCode::GpuUnhealthy));
            assert_eq!(
                t.events[0].detail,
                "GPU 3 of a100-00 failed (XID 79); stopping within 10 s"
            );
            let t = transition(t.workload, Input::Stopped { at: 6_000 });
            assert_eq!(t.workload.phase, end, "{kind:?}");
            assert_eq!(t.workload.reason.unwrap().code, code);
        }
    }

    #[test]
    fn a_cancelled_workload_says_who_cancelled_it() {
        let t = transition(
            in_phase(Phase::Running, Kind::Service),
            Input::Cancel {
                at: 5_000,
                by: "tok-1".into(),
                grace_s: 10,
            },
        );
        assert_eq!(t.events[0].detail, "cancelled by tok-1; stopping within 10 s");
        let t = transition(t.workload, Input::Stopped { at: 5_500 });
        assert_eq!(t.workload.phase, Phase::Cancelled);
        assert_eq!(t.workload.reason.unwrap().detail, "cancelled by tok-1");
    }
}
