//! Node lifecycle (platform-admin): `cordon` (no new placement), `drain` (cordon, then empty
//! the node without cutting work off), `maintenance` (drained, safe to work on) and
//! `uncordon` (back to `ready`). States are stored, so they survive a restart.
//!
//! A drain, checked every second:
//! * batch work runs to completion (or to the end of its lease) and gets a notice;
//! * a service (no end) is moved: a replacement with the same spec is submitted (the node is
//!   fenced, so it lands elsewhere), and the old one is stopped only once the replacement
//!   runs;
//! * interactive work gets a notice with the deadline;
//! * after the deadline the admin's policy applies: `preempt` stops what is left (with the
//!   grace period; batch work is requeued), `wait` keeps waiting;
//! * once nothing holds capacity on the node it is in `maintenance`.
//!
//! The drain controller ([`Drains`]) owns the drains in progress and the services they move;
//! it is handed a [`NodeCtx`]: the world, the health controller (a node's fence also follows
//! what the backend reports) and admission with the consolidation moves (a moved service's
//! replacement is a new workload).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tessera_domain::{Input, Kind, Phase, PreemptCode, ReasonCode, WorkloadId};
use tessera_store::{DrainRecord, MoveCause, NodeState, NodeStateRecord, ServiceMoveRecord, Store};

use super::admission::{Admission, replacement_of};
use super::batch::Batch;
use super::command::{LifecycleError, NodeOp};
use super::consolidation::Moves;
use super::health::Health;
use super::ops::FleetOps;
use super::snapshot::Published;
use super::world::World;

/// A drain in progress.
#[derive(Clone, Debug, Default)]
pub(super) struct Drain {
    pub deadline_ms: Option<i64>,
    pub preempt: bool,
    /// Workloads already told.
    pub noticed: HashSet<WorkloadId>,
    /// The rolling upgrade that drains the node, named in the notices.
    pub rollout: Option<u64>,
}

impl Drain {
    /// How notices name the drain: `node N is being drained[ for rollout R …]`.
    fn what(&self, node: &str) -> String {
        match self.rollout {
            Some(r) => format!("node {node} is being drained for rolling upgrade {r} (`tessera upgrade status {r}`)"),
            None => format!("node {node} is being drained"),
        }
    }
}

/// The drains in progress and the services being moved (old → replacement).
#[derive(Default)]
pub(super) struct Drains {
    pub nodes: HashMap<String, Drain>,
    pub moves: HashMap<WorkloadId, WorkloadId>,
}

/// What the node controllers (drains here, rolling upgrades) are handed besides their own
/// state: the world, the health controller (a node's fence also follows what the backend
/// reports), and admission with the consolidation moves (a drained service's replacement is
/// a new workload).
pub(super) struct NodeCtx<'a> {
    pub w: &'a mut World,
    pub store: &'a dyn Store,
    pub ops: &'a mut Arc<FleetOps>,
    pub published: &'a Published,
    pub health: &'a Health,
    pub admission: &'a mut Admission,
    pub moves: &'a mut Moves,
}

/// A drain asked for: of which node, by whom, with what deadline and what then (preempt or
/// wait), and for which rolling upgrade, if any (named in the notices).
pub(super) struct DrainOrder<'a> {
    pub node: &'a str,
    pub deadline_ms: Option<i64>,
    pub preempt: bool,
    pub actor: &'a str,
    pub rollout: Option<u64>,
}

impl Drains {
    pub(super) fn holders_of(w: &World, node: &str) -> Vec<(WorkloadId, Kind, Phase)> {
        let mut v: Vec<_> = w
            .live
            .values()
            .filter(|l| l.w.phase.holds_capacity() && l.w.holds_on(node))
            .map(|l| (l.w.id, l.w.spec.kind, l.w.phase))
            .collect();
        v.sort_unstable_by_key(|x| x.0);
        v
    }

    pub(super) async fn set_state(
        &mut self,
        cx: &mut NodeCtx<'_>,
        node: &str,
        state: NodeState,
        detail: String,
        now: i64,
    ) -> Result<(), LifecycleError> {
        let unavailable =
            |e: tessera_store::StoreError| LifecycleError::Unavailable(format!("the store is unavailable: {e}"));
        let mut ops = (**cx.ops).clone();
        match state {
            NodeState::Cordoned | NodeState::Draining | NodeState::Maintenance => {
                let rec = NodeStateRecord {
                    node: node.to_string(),
                    state,
                    since: now,
                    detail,
                };
                cx.store.set_node_state(&rec).await.map_err(unavailable)?;
                ops.nodes.insert(node.to_string(), rec);
            }
            NodeState::Ready => {
                cx.store.clear_node_state(node).await.map_err(unavailable)?;
                ops.nodes.remove(node);
            }
        }
        *cx.ops = Arc::new(ops);
        cx.published.set_ops(cx.ops.clone());
        cx.health.refence(cx.w, cx.ops, node);
        // The platform's own fence too (Kubernetes: `spec.unschedulable`), so nothing else
        // places work there; a failure is logged, Tessera's fence holds either way.
        if let Err(e) = cx.w.backend.cordon(node, state != NodeState::Ready).await {
            tracing::warn!(%node, error = %e, "the backend did not (un)cordon the node");
        }
        tracing::info!(%node, state = state.as_str(), "node state changed");
        Ok(())
    }

    /// Forgets a node's drain, in memory and in the store.
    async fn end_drain(&mut self, cx: &mut NodeCtx<'_>, node: &str) {
        if self.nodes.remove(node).is_some()
            && let Err(e) = cx.store.clear_drain(node).await
        {
            tracing::error!(%node, error = %e, "cannot forget a drain in the store");
        }
    }

    /// Forgets a service move — a drain's or consolidation's — in memory and in the store.
    pub(super) async fn end_move(&mut self, moves: &mut Moves, store: &dyn Store, old: WorkloadId) {
        let drained = self.moves.remove(&old).is_some();
        if (drained | moves.forget(old))
            && let Err(e) = store.clear_service_move(old).await
        {
            tracing::error!(%old, error = %e, "cannot forget a service move in the store");
        }
    }

    /// Carries out an admin's node operation (the caller checked that the node exists).
    pub(super) async fn node_op(
        &mut self,
        cx: &mut NodeCtx<'_>,
        node: &str,
        op: NodeOp,
        actor: &str,
        batch: &mut Batch,
        now: i64,
    ) -> Result<(), LifecycleError> {
        match op {
            // Routed to the rollout controller by the loop.
            NodeOp::UpgradeDone => Err(LifecycleError::Conflict(
                "an upgrade's end is taken by the rollout controller".into(),
            )),
            NodeOp::Cordon => {
                self.end_drain(cx, node).await;
                self.set_state(cx, node, NodeState::Cordoned, format!("cordoned by {actor}"), now)
                    .await
            }
            NodeOp::Uncordon => {
                self.end_drain(cx, node).await;
                self.set_state(cx, node, NodeState::Ready, String::new(), now).await
            }
            NodeOp::Maintenance => {
                let busy = Self::holders_of(cx.w, node).len();
                if busy > 0 {
                    return Err(LifecycleError::Conflict(format!(
                        "node {node} still holds {busy} workload(s); drain it first (`tessera node drain {node}`)"
                    )));
                }
                self.end_drain(cx, node).await;
                self.set_state(cx, node, NodeState::Maintenance, format!("maintenance by {actor}"), now)
                    .await
            }
            NodeOp::Drain { deadline_ms, preempt } => {
                let order = DrainOrder {
                    node,
                    deadline_ms,
                    preempt,
                    actor,
                    rollout: None,
                };
                self.start_drain(cx, order, batch, now).await
            }
        }
    }

    /// Drains a node: cordoned, its policy stored, and the first drain step taken at once.
    pub(super) async fn start_drain(
        &mut self,
        cx: &mut NodeCtx<'_>,
        order: DrainOrder<'_>,
        batch: &mut Batch,
        now: i64,
    ) -> Result<(), LifecycleError> {
        let DrainOrder {
            node,
            deadline_ms,
            preempt,
            actor,
            rollout,
        } = order;
        let detail = match deadline_ms {
            Some(d) => format!(
                "drained by {actor}; deadline {}; then {}",
                tessera_api::rfc3339_ms(d),
                if preempt { "preempt" } else { "wait" }
            ),
            None => format!("drained by {actor}; no deadline"),
        };
        cx.store
            .set_drain(&DrainRecord {
                node: node.to_string(),
                deadline_ms,
                preempt,
            })
            .await
            .map_err(|e| LifecycleError::Unavailable(format!("the store is unavailable: {e}")))?;
        self.set_state(cx, node, NodeState::Draining, detail, now).await?;
        self.nodes.insert(
            node.to_string(),
            Drain {
                deadline_ms,
                preempt,
                noticed: HashSet::new(),
                rollout,
            },
        );
        self.drain_step(cx, batch, now).await;
        Ok(())
    }

    /// One step of every drain in progress.
    pub(super) async fn drain_step(&mut self, cx: &mut NodeCtx<'_>, batch: &mut Batch, now: i64) {
        // Moves whose old workload ended: forget them.
        let ended: Vec<WorkloadId> = self
            .moves
            .keys()
            .filter(|old| cx.w.live.get(old).is_none_or(|l| l.w.phase.is_terminal()))
            .copied()
            .collect();
        for old in ended {
            self.end_move(cx.moves, cx.store, old).await;
        }
        let nodes: Vec<String> = self.nodes.keys().cloned().collect();
        let grace_s = cx.w.settings.grace.as_secs();
        for node in nodes {
            let holders = Self::holders_of(cx.w, &node);
            if holders.is_empty() {
                self.end_drain(cx, &node).await;
                let detail = format!("drained at {}", tessera_api::rfc3339_ms(now));
                if let Err(e) = self.set_state(cx, &node, NodeState::Maintenance, detail, now).await {
                    tracing::error!(%node, error = %e, "cannot record the end of a drain");
                }
                continue;
            }
            let Some(d) = self.nodes.get(&node).cloned() else {
                continue;
            };
            let past = d.deadline_ms.is_some_and(|t| now >= t);
            let deadline = d
                .deadline_ms
                .map(|t| format!("by {}", tessera_api::rfc3339_ms(t)))
                .unwrap_or_else(|| "with no deadline".into());
            for (id, kind, phase) in holders {
                if phase == Phase::Stopping {
                    continue;
                }
                if kind == Kind::Service {
                    self.move_service(cx, &node, id, batch, now).await;
                    continue;
                }
                if past && d.preempt {
                    cx.w.apply(
                        id,
                        Input::Preempt {
                            at: now,
                            by: id,
                            code: PreemptCode::Drain,
                            detail: format!("node {node} is drained and its deadline has passed"),
                            grace_s,
                        },
                        batch,
                        now,
                    );
                    continue;
                }
                if self.nodes.get(&node).is_some_and(|x| x.noticed.contains(&id)) {
                    continue;
                }
                let what = d.what(&node);
                let text = match kind {
                    Kind::Interactive => format!(
                        "{what}: please finish and end this session {deadline}{}",
                        if d.preempt && d.deadline_ms.is_some() {
                            "; it is stopped then"
                        } else {
                            ""
                        }
                    ),
                    _ => format!("{what}: this workload runs to completion, and nothing new starts there"),
                };
                cx.w.apply(
                    id,
                    Input::Notice {
                        at: now,
                        code: ReasonCode::NodeDrain,
                        detail: text,
                    },
                    batch,
                    now,
                );
                if let Some(x) = self.nodes.get_mut(&node) {
                    x.noticed.insert(id);
                }
            }
        }
    }

    /// Moves a service off a draining node: a replacement first, the old one stopped only once
    /// the replacement runs.
    async fn move_service(&mut self, cx: &mut NodeCtx<'_>, node: &str, old: WorkloadId, batch: &mut Batch, now: i64) {
        let grace_s = cx.w.settings.grace.as_secs();
        if let Some(&new) = self.moves.get(&old) {
            match cx.w.live.get(&new).map(|l| l.w.phase) {
                Some(Phase::Running) => {
                    self.end_move(cx.moves, cx.store, old).await;
                    cx.w.apply(
                        old,
                        Input::Preempt {
                            at: now,
                            by: new,
                            code: PreemptCode::Drain,
                            detail: format!("node {node} is drained; replacement workload {new} runs elsewhere"),
                            grace_s,
                        },
                        batch,
                        now,
                    );
                }
                Some(_) => {}
                // The replacement ended before it ran: try again next time.
                None => {
                    self.end_move(cx.moves, cx.store, old).await;
                }
            }
            return;
        }
        let Some(l) = cx.w.live.get(&old) else { return };
        let nw = replacement_of(l, format!("drain of {node}"), now);
        match cx.admission.accept(cx.w, cx.moves, nw, batch, now).await {
            Ok((new, _)) => {
                // Stored before the replacement's batch commits: should that commit fail, the
                // recovery finds no replacement and the move starts again; a restart after it
                // finds this pairing and starts no second replacement.
                let rec = ServiceMoveRecord {
                    old,
                    replacement: new,
                    node: node.to_string(),
                    cause: MoveCause::Drain,
                    by: None,
                };
                if let Err(e) = cx.store.set_service_move(&rec).await {
                    tracing::error!(%old, %new, error = %e, "cannot store a service move");
                }
                self.moves.insert(old, new);
                cx.w.apply(
                    old,
                    Input::Notice {
                        at: now,
                        code: ReasonCode::NodeDrain,
                        detail: format!(
                            "{}: replacement workload {new} starts elsewhere; this one stops once it runs",
                            self.nodes
                                .get(node)
                                .map(|d| d.what(node))
                                .unwrap_or_else(|| format!("node {node} is being drained"))
                        ),
                    },
                    batch,
                    now,
                );
            }
            Err(e) => {
                tracing::warn!(%node, %old, error = %e, "cannot submit the replacement of a service; retrying");
            }
        }
    }
}
