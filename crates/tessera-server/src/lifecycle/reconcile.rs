//! The reconciler: periodically, and soon after a backend operation that left doubt, asks the
//! backend what it runs, and turns what changed behind Tessera's back into lifecycle input —
//! workloads the backend lost (ghosts) and work it runs that Tessera does not know (orphans,
//! audited once when first seen). MIG layouts the report carries go to the MIG controller.

use std::collections::{HashMap, HashSet};

use tessera_domain::{Input, Observed, Phase, WorkloadId};
use tokio::sync::mpsc;

use super::batch::Batch;
use super::command::{Cmd, Reconciled};
use super::effects::Runner;
use super::live::now_ms;
use super::placement;
use super::world::World;

/// The reconcile controller's state.
#[derive(Default)]
pub(super) struct Reconciler {
    /// A periodic reconcile is in flight.
    running: bool,
    /// Reconcile at the next opportunity rather than at the next interval.
    pub soon: bool,
    /// When the reconcile in flight was asked for.
    asked: i64,
    /// The orphans the last periodic reconcile reported (by their description): each is
    /// audited once, when first seen, not at every interval.
    orphans_seen: HashSet<String>,
}

impl Reconciler {
    /// The reconcile in flight came back (its report is handled next).
    pub(super) fn finished(&mut self) {
        self.running = false;
    }

    /// Asks the backend what it runs (unless a reconcile is in flight); the report comes back
    /// as [`Cmd::Reconciled`].
    pub(super) fn start(&mut self, w: &World, runner: &mut Runner, tx: mpsc::Sender<Cmd>) {
        if self.running {
            return;
        }
        let mut expected = Vec::new();
        let mut phases = Vec::new();
        for l in w.live.values() {
            if matches!(l.w.phase, Phase::Partitioned | Phase::Running | Phase::Stopping) && !runner.busy(l.w.id) {
                expected.push(placement::run_spec(&w.fleet, &w.nodes, &l.w, &w.caps));
                phases.push((l.w.id, l.w.phase));
            }
        }
        self.running = true;
        self.asked = now_ms();
        let backend = w.backend.clone();
        runner.spawn(async move {
            let report = backend.reconcile(&expected).await.map_err(|e| e.to_string());
            let _ = tx.send(Cmd::Reconciled(Reconciled { report, phases })).await;
        });
    }

    /// When the reconcile in flight (or the last one) was asked for: the MIG layouts it
    /// reports are adopted as of then (`MigModes::adopt_layouts`).
    pub(super) fn asked(&self) -> i64 {
        self.asked
    }

    /// A periodic reconcile came back: what changed behind Tessera's back becomes input, for
    /// workloads whose phase did not move meanwhile and that have no backend work in flight.
    /// (The MIG layouts it reports go to the MIG-mode controller first, from the loop.)
    pub(super) fn on_reconciled(
        &mut self,
        w: &mut World,
        runner: &Runner,
        back: Reconciled,
        batch: &mut Batch,
        now: i64,
    ) {
        let report = match back.report {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "reconcile with the backend failed; retrying at the next interval");
                return;
            }
        };
        let phases: HashMap<WorkloadId, Phase> = back.phases.into_iter().collect();
        for (id, observation) in report.workloads {
            let id = WorkloadId(id);
            let unchanged = w
                .live
                .get(&id)
                .is_some_and(|l| phases.get(&id) == Some(&l.w.phase) && !runner.busy(id));
            if !unchanged {
                continue;
            }
            let observed = w.observed(observation, "found by the periodic reconcile");
            if matches!(observed, Observed::Unknown { .. }) {
                w.metrics.ghost();
            }
            let grace_s = w.settings.grace.as_secs();
            w.apply(
                id,
                Input::Recovered {
                    at: now,
                    observed,
                    grace_s,
                },
                batch,
                now,
            );
        }
        self.note_orphans(w, &report.orphans, batch, now);
    }

    /// Work the backend runs that Tessera does not know: counted, logged, and audited the first
    /// time a reconcile reports it (`backend.orphan`, as strangers are `backend.stranger`), so an
    /// operator finds it in the audit log without one record per interval. One that goes and
    /// comes back is audited again.
    fn note_orphans(&mut self, w: &World, orphans: &[tessera_backend::Orphan], batch: &mut Batch, now: i64) {
        w.metrics.orphans(orphans.len());
        let mut seen = std::collections::HashSet::with_capacity(orphans.len());
        for o in orphans {
            let key = format!("{}|{:?}|{}", o.node, o.id, o.detail);
            if !self.orphans_seen.contains(&key) {
                tracing::warn!(node = %o.node, id = ?o.id, detail = %o.detail, "the backend runs work Tessera does not know (orphan)");
                batch.audit(tessera_store::AuditRecord {
                    seq: 0,
                    at: now,
                    request_id: format!("backend-orphan-{now}-{}", seen.len()),
                    actor: format!("{}-backend", w.backend.name()),
                    tenant: None,
                    action: "backend.orphan".into(),
                    target: match o.id {
                        Some(id) => format!("workloads/{id} on {}", o.node),
                        None => format!("nodes/{}", o.node),
                    },
                    outcome: 409,
                    detail: o.detail.clone(),
                });
            }
            seen.insert(key);
        }
        self.orphans_seen = seen;
    }
}
