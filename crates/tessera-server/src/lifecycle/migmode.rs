//! MIG mode as an explicit platform-admin action (`tessera node mig enable|disable`): Tessera
//! never switches a GPU's MIG mode on its own.
//!
//! The rule: the GPU's node is out of placement (cordoned, draining or in maintenance: nothing
//! new lands there while the mode changes) and the GPU itself holds no work; the backend can
//! switch MIG mode ([`tessera_backend::Capabilities::mig_mode_switch`]); the GPU is in a mig
//! pool of a model with MIG (a GPU out of MIG mode then serves whole GPUs, one in MIG mode
//! serves instances). The change is made on the backend first, then the engine follows and the
//! stored record commits with the audit record; a restart re-applies the stored modes to the
//! engine (before allocations are restored into it) and to the backend (the simulated one
//! forgets them). A change the driver applies only after a GPU reset is `pending`: the GPU gets
//! no placement until the reset applied it. Backends that read MIG mode back (local, through
//! NVML) report each GPU's mode at every telemetry pass
//! ([`tessera_backend::BackendEvent::MigMode`]); the engine and the stored record follow
//! ([`MigModes::backend_mig_mode`]), so a pending change comes back by itself after the reset, and a
//! machine whose GPUs are in different modes is served as it is. Elsewhere the admin sends the
//! same change again after the reset.
//!
//! The controller ([`MigModes`]) owns what the backend last reported of each GPU's MIG
//! instances; each step is handed the part of the world it uses ([`MigCtx`]: the fleet, the
//! engine, the backend and the operator state; never the workloads, the store or the ledger),
//! the batch and the time.

use std::collections::HashMap;
use std::sync::Arc;

use tessera_backend::{Backend, BackendError, Capabilities, MigInstance, MigModeChange, Partitioning};
use tessera_model::Fleet;
use tessera_sched::cycle::Scheduler;
use tessera_store::{AuditRecord, Change, GpuMigRecord};

use super::batch::{Batch, ReplyTo};
use super::command::{LifecycleError, MigOutcome, MigRefusal, Reply};
use super::ops::FleetOps;
use super::placement::{self, NodeIndex};
use super::snapshot::Published;
use super::world::World;

/// The MIG-mode controller: an admin's mode changes, the modes backends read back, stored
/// modes re-applied on a rebuild, and the layouts `whole-gpu` backends report. It owns what
/// the backend last reported of each GPU's MIG instances (an upgraded node's validation
/// compares them with the engine's layout).
#[derive(Default)]
pub(super) struct MigModes {
    /// Per GPU, the MIG instances the backend last reported (reconcile, a layout applied) and
    /// when.
    reported: HashMap<(String, u8), (i64, Vec<MigInstance>)>,
}

/// An admin's MIG mode change, or the mode a backend read: which GPU, and the mode.
pub(super) struct ModeChange {
    pub node: String,
    pub gpu: u8,
    pub enabled: bool,
}

impl ModeChange {
    /// The stored record of this mode, in effect (or `pending` a reset) since `now`.
    fn record(&self, pending: bool, now: i64, detail: String) -> GpuMigRecord {
        GpuMigRecord {
            node: self.node.clone(),
            gpu: self.gpu,
            enabled: self.enabled,
            pending,
            since: now,
            detail,
        }
    }
}

/// What the MIG-mode controller is handed of the world: the fleet, the engine (the modes and
/// layouts it places by), the backend, and the operator state it records modes in.
pub(super) struct MigCtx<'a> {
    pub fleet: &'a Fleet,
    pub nodes: &'a NodeIndex,
    pub sched: &'a mut Scheduler,
    pub backend: &'a dyn Backend,
    pub caps: &'a Capabilities,
    pub ops: &'a mut Arc<FleetOps>,
    pub published: &'a Published,
}

impl<'a> MigCtx<'a> {
    /// The controller's part of the world.
    pub(super) fn of(w: &'a mut World, ops: &'a mut Arc<FleetOps>, published: &'a Published) -> Self {
        MigCtx {
            fleet: &w.fleet,
            nodes: &w.nodes,
            sched: &mut w.sched,
            backend: &*w.backend,
            caps: &w.caps,
            ops,
            published,
        }
    }

    /// Records `record` as its GPU's mode, in the batch and in the operator state readers see.
    fn record_mode(&mut self, record: GpuMigRecord, batch: &mut Batch) {
        batch.change(Change::GpuMig(record.clone()));
        let mut ops = (**self.ops).clone();
        ops.mig.insert((record.node.clone(), record.gpu), record);
        *self.ops = Arc::new(ops);
        self.published.set_ops(self.ops.clone());
    }
}

impl MigModes {
    /// An admin's MIG mode change, answered once it is stored (at once when nothing changed or
    /// it was refused).
    pub(super) async fn on_set_mig_mode(
        &mut self,
        w: &mut MigCtx<'_>,
        c: ModeChange,
        audit: AuditRecord,
        reply: Reply<MigOutcome>,
        batch: &mut Batch,
        now: i64,
    ) {
        match self.set_mig_mode(w, &c, audit, batch, now).await {
            Ok(o) if o.changed => {
                batch.full_publish = true;
                batch.reply(ReplyTo::Mig(reply, o));
            }
            r => {
                let _ = reply.send(r);
            }
        }
    }

    /// What the backend last reported of a GPU's MIG instances, and when.
    pub(super) fn reported(&self, node: &str, gpu: u8) -> Option<&(i64, Vec<MigInstance>)> {
        self.reported.get(&(node.to_string(), gpu))
    }

    /// Forgets what was reported of nodes that left the fleet.
    pub(super) fn forget_nodes(&mut self, gone: &[String]) {
        self.reported.retain(|(node, _), _| !gone.contains(node));
    }

    /// Switches MIG mode of `gpu` on `node` (the caller checked that the GPU exists). On a
    /// change, the stored record and `audit` go into `batch`.
    pub(super) async fn set_mig_mode(
        &mut self,
        w: &mut MigCtx<'_>,
        c: &ModeChange,
        mut audit: AuditRecord,
        batch: &mut Batch,
        now: i64,
    ) -> Result<MigOutcome, LifecycleError> {
        let (node, gpu, enabled) = (c.node.as_str(), c.gpu, c.enabled);
        let refuse = |r: MigRefusal, detail: String| Err(LifecycleError::Mig(r, detail));
        let Some(n) = w.fleet.node_by_name(node) else {
            return Err(LifecycleError::Conflict(format!("no node `{node}` in the fleet")));
        };
        if !w.caps.mig_mode_switch {
            return refuse(
                MigRefusal::Unsupported,
                format!(
                    "the {} backend does not switch MIG mode (on Kubernetes the GPU Operator's MIG manager owns it)",
                    w.backend.name()
                ),
            );
        }
        if let Err(e) = w.sched.engine.mig_switchable(n.0, gpu) {
            return refuse(MigRefusal::NotMigCapable, e.0);
        }
        let engine = &w.sched.engine;
        let off = engine.mig_off_gpus(n.0) >> gpu & 1 == 1;
        let pending = engine.mig_pending_gpus(n.0) >> gpu & 1 == 1;
        if off != enabled && !pending {
            return Ok(MigOutcome {
                record: w
                    .ops
                    .mig
                    .get(&(node.to_string(), gpu))
                    .cloned()
                    .unwrap_or(GpuMigRecord {
                        node: node.to_string(),
                        gpu,
                        enabled,
                        pending: false,
                        since: now,
                        detail: "the pool's mode".into(),
                    }),
                changed: false,
            });
        }
        let state = w.ops.node_state(node);
        if state == tessera_store::NodeState::Ready {
            return refuse(
                MigRefusal::NodeInPlacement,
                format!(
                    "node {node} is in placement; drain it first (`tessera node drain {node}`): MIG mode changes only on a drained GPU"
                ),
            );
        }
        let holders = engine.state().nodes[n.0 as usize].gpus[gpu as usize].holders.len();
        if holders > 0 {
            return refuse(
                MigRefusal::GpuBusy,
                format!("GPU {gpu} of {node} still holds {holders} workload(s); wait until the drain has emptied it"),
            );
        }
        let pending = match w.backend.set_mig_mode(node, gpu, enabled).await {
            Ok(MigModeChange::Applied) => false,
            Ok(MigModeChange::PendingReset) => true,
            Err(BackendError::Rejected(why)) => return refuse(MigRefusal::BackendRefused, why),
            Err(e @ BackendError::Unreachable(_)) => return Err(LifecycleError::Unavailable(e.to_string())),
        };
        if let Err(e) = w.sched.engine.set_gpu_mig(n.0, gpu, enabled) {
            // Checked above within this loop turn; a failure here is a bug, not a state.
            tracing::error!(%node, gpu, error = %e.0, "the engine refused a MIG mode the backend applied");
            return Err(LifecycleError::Conflict(e.0));
        }
        w.sched.engine.set_gpu_mig_pending(n.0, gpu, pending);
        let mode = if enabled { "on" } else { "off" };
        let detail = if pending {
            format!(
                "MIG mode {mode} by {}, pending a GPU reset (Tessera never resets a GPU)",
                audit.actor
            )
        } else {
            format!("MIG mode {mode} by {}", audit.actor)
        };
        let record = c.record(pending, now, detail);
        audit.detail = record.detail.clone();
        w.record_mode(record.clone(), batch);
        batch.audit(audit);
        tracing::info!(%node, gpu, enabled, pending, "MIG mode changed by an admin");
        Ok(MigOutcome { record, changed: true })
    }

    /// The backend read GPU `gpu` of `node` in MIG mode `enabled` (switching to it, `pending` a
    /// reset): the engine and the stored record follow when they differ. A GPU outside a mig
    /// pool, or one still holding work in its old mode, is left as it is (logged).
    pub(super) fn backend_mig_mode(
        &mut self,
        w: &mut MigCtx<'_>,
        c: &ModeChange,
        pending: bool,
        batch: &mut Batch,
        now: i64,
    ) {
        let (node, gpu, enabled) = (c.node.as_str(), c.gpu, c.enabled);
        let Some(n) = w.fleet.node_by_name(node) else {
            return;
        };
        let engine = &w.sched.engine;
        if engine.mig_switchable(n.0, gpu).is_err() {
            return;
        }
        let was_on = engine.mig_off_gpus(n.0) >> gpu & 1 == 0;
        let was_pending = engine.mig_pending_gpus(n.0) >> gpu & 1 == 1;
        if (was_on, was_pending) == (enabled, pending) {
            return;
        }
        if let Err(e) = w.sched.engine.set_gpu_mig(n.0, gpu, enabled) {
            tracing::warn!(%node, gpu, enabled, error = %e.0, "the backend reports a MIG mode the engine cannot follow yet");
            return;
        }
        w.sched.engine.set_gpu_mig_pending(n.0, gpu, pending);
        let mode = if enabled { "on" } else { "off" };
        let detail = match (pending, was_pending && was_on == enabled) {
            (true, _) => format!(
                "MIG mode {mode} pending a GPU reset, as the {} backend reads it",
                w.backend.name()
            ),
            (false, true) => format!("MIG mode {mode}: the GPU reset applied the pending change"),
            (false, false) => format!("MIG mode {mode}, as the {} backend reads it", w.backend.name()),
        };
        w.record_mode(c.record(pending, now, detail.clone()), batch);
        batch.audit(AuditRecord {
            seq: 0,
            at: now,
            request_id: format!("backend-mig-{node}-{gpu}"),
            actor: format!("{}-backend", w.backend.name()),
            tenant: None,
            action: "gpu.mig".into(),
            target: format!("nodes/{node}/gpus/{gpu}"),
            outcome: 200,
            detail,
        });
        batch.full_publish = true;
        tracing::info!(%node, gpu, enabled, pending, "MIG mode read from the backend");
    }

    /// At start-up: the stored MIG modes, into the engine (before any allocation is restored)
    /// and onto the backend (idempotent; the simulated backend forgot them) unless it reports
    /// the modes itself (then its reports correct the engine when the GPUs changed meanwhile).
    pub(super) async fn restore(&mut self, w: &mut MigCtx<'_>, records: Vec<GpuMigRecord>, ops: &mut FleetOps) {
        for r in records {
            let Some(n) = w.fleet.node_by_name(&r.node) else {
                continue;
            };
            if let Err(e) = w.sched.engine.set_gpu_mig(n.0, r.gpu, r.enabled) {
                tracing::warn!(node = %r.node, gpu = r.gpu, error = %e.0, "a stored MIG mode no longer applies");
                continue;
            }
            w.sched.engine.set_gpu_mig_pending(n.0, r.gpu, r.pending);
            if !r.pending
                && w.caps.mig_mode_switch
                && !w.caps.mig_mode_reported
                && let Err(e) = w.backend.set_mig_mode(&r.node, r.gpu, r.enabled).await
            {
                tracing::warn!(node = %r.node, gpu = r.gpu, error = %e, "the backend did not take the stored MIG mode");
            }
            ops.mig.insert((r.node.clone(), r.gpu), r);
        }
    }

    /// Adopts MIG layouts a `whole-gpu` backend reports (start-up, reconcile, a layout applied).
    /// `at`: when the backend read them (a reconcile: when it was asked).
    pub(super) fn adopt_layouts(&mut self, w: &mut MigCtx<'_>, layouts: &[(String, u8, Vec<MigInstance>)], at: i64) {
        for (node, gpu, instances) in layouts {
            self.reported.insert((node.clone(), *gpu), (at, instances.clone()));
        }
        if w.caps.partitioning != Partitioning::WholeGpu {
            return;
        }
        for (node, gpu, instances) in layouts {
            let Some(n) = w.nodes.get(node) else {
                tracing::warn!(%node, "the backend reports a MIG layout on a node the fleet does not have");
                continue;
            };
            let Some(slots) = placement::mig_slots(w.fleet, n, instances) else {
                tracing::warn!(%node, gpu, "the backend reports MIG profiles this GPU model does not have");
                continue;
            };
            if let Err(e) = w.sched.engine.adopt_layout(n, *gpu, &slots) {
                tracing::warn!(%node, gpu, error = %e, "cannot adopt the MIG layout the backend reports");
            }
        }
    }
}
