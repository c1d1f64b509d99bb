//! Consolidation moves decided by the scheduler, carried out. The scheduler's consolidate
//! action moves only work whose request says `movable`, so that a request waiting for
//! fragmented capacity fits (see `tessera_sched::cycle`):
//!
//! * restartable batch work (`movable: restart`) is stopped with the grace period under the
//!   preemption code `consolidation` and requeued, like preempted batch work: its usage
//!   interval closes when it stops and a new one opens when it runs again, so metering has
//!   neither gap nor overlap;
//! * a service (`movable: replace`) is moved as a drain moves it: a replacement workload with
//!   the same spec is created on the capacity the scheduler booked for it, and the original is
//!   stopped only once the replacement runs. A replacement that ends before it runs leaves
//!   the original where it is (the scheduler is told the move failed and unbooks it).
//!
//! Both show in the workload's timeline (a `preempted` step with code `consolidation`, a
//! notice naming the replacement) and count in `tessera_consolidation_moves_total{how}`.
//! A service move is stored (a `ServiceMoveRecord` with cause `consolidation`) when its
//! replacement is created and cleared when the move ends, whichever way: a restart or a
//! rebuild from the store in between continues it — no second replacement, and the original
//! stops once the replacement runs.
//!
//! The controller ([`Moves`]) owns the moves booked and in progress; it is handed the world,
//! admission (a replacement is a new workload) and the drains (a move ends the same way).

use std::collections::HashMap;

use tessera_domain::{Input, Phase, PreemptCode, ReasonCode, WorkloadId};
use tessera_store::{MoveCause, ServiceMoveRecord, Store};

use super::admission::{Admission, replacement_of};
use super::batch::Batch;
use super::nodeops::Drains;
use super::world::World;

/// Services being moved by consolidation.
#[derive(Default)]
pub(super) struct Moves {
    /// Services whose replacement the scheduler booked and the loop has yet to create, with
    /// the request each move makes room for.
    pending: Vec<(WorkloadId, u64)>,
    /// Services whose replacement is starting: original → (replacement, the request the move
    /// makes room for).
    replacing: HashMap<WorkloadId, (WorkloadId, Option<WorkloadId>)>,
}

impl Moves {
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty() && self.replacing.is_empty()
    }

    /// A move read back from the store (recovery).
    pub fn restore(&mut self, old: WorkloadId, replacement: WorkloadId, by: Option<WorkloadId>) {
        self.replacing.insert(old, (replacement, by));
    }

    /// Forgets the move of `old`; `false` if it was not being moved.
    pub fn forget(&mut self, old: WorkloadId) -> bool {
        self.replacing.remove(&old).is_some()
    }

    /// The services being moved.
    pub fn originals(&self) -> Vec<WorkloadId> {
        self.replacing.keys().copied().collect()
    }
}

impl Moves {
    /// A consolidation move of `id` so that `by` fits; `replace`: a replacement is booked.
    pub(super) fn on_move(&mut self, w: &mut World, id: u64, by: u64, replace: bool, batch: &mut Batch, now: i64) {
        let wid = WorkloadId(id);
        let movable = w
            .live
            .get(&wid)
            .is_some_and(|l| l.w.phase == Phase::Running && l.w.spec.movable.is_some());
        if !movable {
            tracing::warn!(
                id,
                by,
                "consolidation asked to move a workload that is not running and movable"
            );
            w.sched.move_failed(id);
            return;
        }
        if replace {
            // Creating the replacement needs the store (workload ids): done after the cycle.
            self.pending.push((wid, by));
            return;
        }
        w.metrics.consolidation_move("restart");
        let grace_s = w.settings.grace.as_secs();
        w.apply(
            wid,
            Input::Preempt {
                at: now,
                by: WorkloadId(by),
                code: PreemptCode::Consolidation,
                detail: format!(
                    "moved by consolidation so that workload {by} fits in its fragmented pool; \
                     requeued, it restarts from its last checkpoint"
                ),
                grace_s,
            },
            batch,
            now,
        );
    }

    /// Creates the replacements booked since the last step, and stops each original whose
    /// replacement runs.
    pub(super) async fn step(
        &mut self,
        w: &mut World,
        store: &dyn Store,
        admission: &mut Admission,
        drains: &mut Drains,
        batch: &mut Batch,
        now: i64,
    ) {
        for (old, by) in std::mem::take(&mut self.pending) {
            self.start_replacement(w, store, admission, (old, by), batch, now).await;
        }
        let grace_s = w.settings.grace.as_secs();
        let mut moves: Vec<_> = self.replacing.iter().map(|(o, (n, by))| (*o, *n, *by)).collect();
        moves.sort_unstable();
        for (old, new, by) in moves {
            match w.live.get(&new).map(|l| l.w.phase) {
                Some(Phase::Running) => {
                    drains.end_move(self, store, old).await;
                    let why = by.map(|b| format!(" so that workload {b} fits")).unwrap_or_default();
                    w.apply(
                        old,
                        Input::Preempt {
                            at: now,
                            by: new,
                            code: PreemptCode::Consolidation,
                            detail: format!("moved by consolidation{why}: replacement workload {new} runs"),
                            grace_s,
                        },
                        batch,
                        now,
                    );
                }
                Some(p) if !p.is_waiting() => {}
                // The replacement ended or went back to the queue before it ran: the original
                // stays, and the job it was to make room for searches again.
                _ => {
                    drains.end_move(self, store, old).await;
                    w.sched.move_failed(old.0);
                    w.apply(
                        old,
                        Input::Notice {
                            at: now,
                            code: ReasonCode::Consolidation,
                            detail: format!("replacement workload {new} did not start; this one stays"),
                        },
                        batch,
                        now,
                    );
                }
            }
        }
    }

    /// Creates the replacement of service `old` on the capacity booked for it.
    async fn start_replacement(
        &mut self,
        w: &mut World,
        store: &dyn Store,
        admission: &mut Admission,
        (old, by): (WorkloadId, u64),
        batch: &mut Batch,
        now: i64,
    ) {
        let Some(l) = w.live.get(&old).filter(|l| l.w.phase == Phase::Running) else {
            w.sched.move_failed(old.0);
            return;
        };
        let nw = replacement_of(l, format!("consolidation for workload {by}"), now);
        let from = l.w.placement.as_ref().map(|p| p.node.clone()).unwrap_or_default();
        match admission.accept_as(w, self, nw, Some(old), batch, now).await {
            Ok((new, _)) => {
                // Stored before the replacement's batch commits: should that commit fail, the
                // recovery finds no replacement and ends the move (the original stays); a
                // restart after it finds this pairing and waits for the replacement to run.
                let rec = ServiceMoveRecord {
                    old,
                    replacement: new,
                    node: from,
                    cause: MoveCause::Consolidation,
                    by: Some(WorkloadId(by)),
                };
                if let Err(e) = store.set_service_move(&rec).await {
                    tracing::error!(%old, %new, error = %e, "cannot store a consolidation move");
                }
                w.metrics.consolidation_move("replace");
                self.replacing.insert(old, (new, Some(WorkloadId(by))));
                let node = w
                    .live
                    .get(&new)
                    .and_then(|l| l.w.placement.as_ref())
                    .map(|p| p.node.clone())
                    .unwrap_or_default();
                w.apply(
                    old,
                    Input::Notice {
                        at: now,
                        code: ReasonCode::Consolidation,
                        detail: format!(
                            "moved by consolidation so that workload {by} fits: replacement workload {new} \
                             starts on {node}; this one stops once it runs"
                        ),
                    },
                    batch,
                    now,
                );
            }
            Err(e) => {
                tracing::warn!(%old, by, error = %e, "cannot create the replacement of a service; it stays");
                w.sched.move_failed(old.0);
            }
        }
    }
}
