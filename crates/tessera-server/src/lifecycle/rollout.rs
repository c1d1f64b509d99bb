//! The rolling-upgrade controller, driven by the lifecycle loop (the single writer: under HA
//! only the leader runs it). Each second, for each running rollout:
//!
//! * nodes the rollout took move on: `draining` → `upgrading` once the drain machinery has
//!   emptied the node (it is then in `maintenance`), `upgrading` → `validating` when
//!   `tessera node done NODE` arrives or, with `--sim-upgrade-duration`, when the simulated
//!   upgrade's time is up; `validating` → `done` (the node is uncordoned) when every GPU of the
//!   node reports telemetry again after the upgrade, none is unhealthy and its MIG layout is
//!   the one written down before the drain; → `failed` (the node stays cordoned, the reason
//!   says why) when that does not hold within [`VALIDATE_WITHIN_MS`]. A failed node stops the
//!   rollout from taking more nodes;
//! * the pure planner ([`tessera_sched::rollout`]) then picks the next pending nodes (whose
//!   unmovable work ends soonest first) while `max_parallel` and the unit limit allow, and
//!   drains them with the admin's drain machinery (deadline and `after` policy per node).
//!
//! Every change is stored (the rollout and its nodes), so a restart resumes where it was, and
//! each node step is an audit record committed with the loop's batch.
//!
//! The controller ([`Rollouts`]) keeps only whether telemetry asked for an early step; the
//! rollouts live in the world's operator state. It is handed a [`RolloutCtx`]: the world, the
//! drains and what their steps need, the MIG layouts the backend reported, and the
//! reconciler's "soon".

use tessera_domain::Kind;
use tessera_sched::rollout::{self, Limits};
use tessera_store::{AuditRecord, NodeState, RolloutNodeRecord, RolloutNodeState, RolloutRecord, RolloutState};

use super::batch::Batch;
use super::command::{LifecycleError, NewRollout, Reply};
use super::health::HealthCtx;
use super::migmode::MigModes;
use super::nodeops::{DrainOrder, Drains, NodeCtx};
use super::world::World;

/// A pending node is taken (cordoned) once its unmovable work ends within this (one controller
/// tick): until then it keeps serving, rather than idling its free GPUs while it drains.
pub const CORDON_AHEAD_MS: i64 = 1_000;

/// How long a node may take to pass validation after its upgrade.
pub const VALIDATE_WITHIN_MS: i64 = 60_000;

/// Why a node does not pass validation.
enum Invalid {
    /// It cannot pass (a GPU out for an XID or a failed partition).
    Failed(String),
    /// Not yet (GPUs not back, no fresh telemetry, layout not restored): it may still pass
    /// within [`VALIDATE_WITHIN_MS`].
    NotYet(String),
}

/// What a pending node waits for, as planned: its work that must end before it is drained.
/// `preempt_after_s`: the drain's deadline when its policy then preempts what is left.
fn pending_detail(n: &rollout::Node, preempt_after_s: Option<u64>) -> String {
    let mut parts = Vec::new();
    if let Some(end) = n
        .work
        .iter()
        .filter_map(|w| w.end_ms)
        .filter(|&e| e != rollout::NEVER)
        .max()
    {
        parts.push(format!("its timed work ends {}", tessera_api::rfc3339_ms(end)));
    }
    let open = n.work.iter().filter(|w| w.end_ms == Some(rollout::NEVER)).count();
    if open > 0 {
        parts.push(match preempt_after_s {
            Some(s) => {
                format!("{open} workload(s) without a duration: taken last; its drain preempts them after {s} s")
            }
            None => format!("{open} workload(s) without a duration: taken last; its drain waits for them to end"),
        });
    }
    let services = n.work.iter().filter(|w| w.end_ms.is_none()).count();
    if services > 0 {
        parts.push(format!("{services} service(s) move when it drains"));
    }
    if parts.is_empty() {
        "no work: taken as soon as the limits allow".into()
    } else {
        parts.join("; ")
    }
}

/// The actor the controller's own audit records name.
const CONTROLLER: &str = "rollout-controller";

/// The rollout controller's state; the rollouts themselves are stored and published in the
/// world's operator state (`World::ops`).
#[derive(Default)]
pub(super) struct Rollouts {
    /// Telemetry arrived while a rollout runs: its drains and steps are taken after this batch
    /// rather than at the next tick (a node that emptied or came back from its upgrade moves on
    /// within one telemetry interval).
    pub soon: bool,
}

/// What the rollout controller is handed: the node context (a rollout drains nodes and
/// moves their services like an admin's drain), the drains, the MIG layouts the backend
/// reported, and the reconciler's "reconcile soon".
pub(super) struct RolloutCtx<'a> {
    pub node: NodeCtx<'a>,
    pub drains: &'a mut Drains,
    pub mig: &'a MigModes,
    pub reconcile_soon: &'a mut bool,
}

impl<'a> RolloutCtx<'a> {
    /// The drains, and the context their steps are handed.
    fn nodes(&mut self) -> (&mut Drains, &mut NodeCtx<'a>) {
        (&mut *self.drains, &mut self.node)
    }

    async fn set_state(
        &mut self,
        node: &str,
        state: NodeState,
        detail: String,
        now: i64,
    ) -> Result<(), LifecycleError> {
        let (drains, cx) = self.nodes();
        drains.set_state(cx, node, state, detail, now).await
    }

    async fn start_drain(&mut self, order: DrainOrder<'_>, batch: &mut Batch, now: i64) -> Result<(), LifecycleError> {
        let (drains, cx) = self.nodes();
        drains.start_drain(cx, order, batch, now).await
    }
}

impl Rollouts {
    /// An admin's new rollout: answered at once (what is stored is its record).
    pub(super) async fn on_start(
        &mut self,
        cx: &mut RolloutCtx<'_>,
        spec: NewRollout,
        actor: &str,
        reply: Reply<RolloutRecord>,
        batch: &mut Batch,
        now: i64,
    ) {
        let r = self.start_rollout(cx, spec, actor, batch, now).await;
        if r.is_ok() {
            batch.full_publish = true;
        }
        let _ = reply.send(r);
    }

    /// The planner's view of the nodes of a pool: units and the work on each (when it ends;
    /// services never end and move).
    fn plan_nodes(&self, cx: &RolloutCtx<'_>, names: &[String]) -> Vec<rollout::Node> {
        names
            .iter()
            .map(|name| {
                let units = cx
                    .node
                    .w
                    .fleet
                    .node_by_name(name)
                    .map(|n| cx.node.w.fleet.node(n).gpus as u64 * 1000);
                let work = cx
                    .node
                    .w
                    .live
                    .values()
                    .filter(|l| l.w.phase.holds_capacity() && l.w.holds_on(name))
                    .map(|l| rollout::Work {
                        units_milli: l.w.units.0,
                        end_ms: match (l.w.spec.kind, l.w.spec.duration_s) {
                            (Kind::Service, _) => None,
                            (_, Some(d)) => Some(l.w.running_at.unwrap_or(l.w.created_at) + d as i64 * 1000),
                            // Runs to completion, which no one knows: the drain waits for it.
                            (_, None) => Some(rollout::NEVER),
                        },
                        start_ms: l.w.running_at.unwrap_or(l.w.created_at),
                    })
                    .collect();
                rollout::Node {
                    name: name.clone(),
                    units_milli: units.unwrap_or(0),
                    work,
                }
            })
            .collect()
    }

    /// The node's MIG layout as the engine holds it, GPU by GPU (`whole-gpu` backends, whose
    /// layouts are a property of the node); on instance-mode backends, which create instances
    /// per workload (a drain removes them), the MIG mode of each GPU.
    fn layout_text(&self, cx: &RolloutCtx<'_>, node: &str) -> String {
        if cx.node.w.caps.partitioning != tessera_backend::Partitioning::WholeGpu {
            return self.mig_modes_text(cx, node);
        }
        let Some(n) = cx.node.w.nodes.get(node) else {
            return String::new();
        };
        let gpus = cx
            .node
            .w
            .fleet
            .node_by_name(node)
            .map(|i| cx.node.w.fleet.node(i).gpus)
            .unwrap_or(0);
        (0..gpus)
            .map(|g| {
                let slots: Vec<String> = cx
                    .node
                    .w
                    .sched
                    .engine
                    .mig_layout(n, g)
                    .iter()
                    .map(|s| {
                        let m = super::placement::mig_instance_of(&cx.node.w.fleet, n, s);
                        format!("{}@{}", m.profile, m.start)
                    })
                    .collect();
                format!("{g}:{}", slots.join("+"))
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Instance-granularity backends: the MIG mode of each GPU of a node's mig pool (`0:mig
    /// 1:whole 2:pending`), as the engine holds it; empty elsewhere.
    fn mig_modes_text(&self, cx: &RolloutCtx<'_>, node: &str) -> String {
        let Some(n) = cx.node.w.fleet.node_by_name(node) else {
            return String::new();
        };
        let engine = &cx.node.w.sched.engine;
        (0..cx.node.w.fleet.node(n).gpus)
            .filter(|&g| engine.mig_switchable(n.0, g).is_ok())
            .map(|g| {
                let mode = if engine.mig_pending_gpus(n.0) >> g & 1 == 1 {
                    "pending"
                } else if engine.mig_off_gpus(n.0) >> g & 1 == 1 {
                    "whole"
                } else {
                    "mig"
                };
                format!("{g}:{mode}")
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Instance-granularity backends: whether the MIG instances the backend reports on each GPU
    /// of the node, in a report taken since `since`, are the ones the engine holds (after a
    /// drain: none). `Ok(false)`: the backend reports no instances for this node (it does not
    /// report them): nothing was compared.
    fn instances_as_engine_holds(&self, cx: &RolloutCtx<'_>, node: &str, since: i64) -> Result<bool, String> {
        let Some(n) = cx.node.w.fleet.node_by_name(node) else {
            return Ok(false);
        };
        let mut compared = false;
        for g in 0..cx.node.w.fleet.node(n).gpus {
            let mut engine: Vec<(u32, u8)> = cx
                .node
                .w
                .sched
                .engine
                .mig_layout(n, g)
                .iter()
                .map(|s| (s.profile_id, s.start))
                .collect();
            engine.sort_unstable();
            let reported = match cx.mig.reported(node, g) {
                Some((at, _)) if *at < since => {
                    return Err("no report of MIG instances from the backend since the upgrade".into());
                }
                Some((_, inst)) => inst,
                None if engine.is_empty() => continue,
                None => return Err(format!("the backend reports no MIG instances on GPU {g}")),
            };
            let mut seen: Vec<(u32, u8)> = reported.iter().map(|i| (i.profile_id, i.start)).collect();
            seen.sort_unstable();
            if seen != engine {
                let show = |v: &[(u32, u8)]| {
                    if v.is_empty() {
                        "none".to_string()
                    } else {
                        v.iter()
                            .map(|(p, s)| format!("profile {p}@{s}"))
                            .collect::<Vec<_>>()
                            .join("+")
                    }
                };
                return Err(format!(
                    "GPU {g}: the backend reports MIG instances {}, the engine holds {}",
                    show(&seen),
                    show(&engine)
                ));
            }
            compared = true;
        }
        Ok(compared)
    }

    /// Starts a rollout of every node of a pool: answers with the stored record (its nodes in
    /// plan order).
    pub(super) async fn start_rollout(
        &mut self,
        cx: &mut RolloutCtx<'_>,
        spec: NewRollout,
        actor: &str,
        batch: &mut Batch,
        now: i64,
    ) -> Result<RolloutRecord, LifecycleError> {
        if let Some(r) = cx
            .node
            .ops
            .rollouts
            .values()
            .find(|r| r.pool == spec.pool && r.state == RolloutState::Running)
        {
            return Err(LifecycleError::Conflict(format!(
                "rollout {} of pool `{}` is still running; cancel it first (`tessera upgrade cancel {}`)",
                r.id, r.pool, r.id
            )));
        }
        let names: Vec<String> = cx
            .node
            .w
            .fleet
            .nodes
            .iter()
            .filter(|n| cx.node.w.fleet.pool(n.pool).name == spec.pool)
            .map(|n| n.name.clone())
            .collect();
        let plan = self.plan_nodes(cx, &names);
        let nodes = rollout::order(&plan, now)
            .into_iter()
            .map(|i| RolloutNodeRecord {
                node: plan[i].name.clone(),
                state: RolloutNodeState::Pending,
                since: now,
                started_at: None,
                ended_at: None,
                upgrade_until: None,
                layout: String::new(),
                detail: pending_detail(&plan[i], spec.deadline_s.filter(|_| spec.preempt)),
            })
            .collect();
        let mut r = RolloutRecord {
            id: 0,
            pool: spec.pool,
            max_parallel: spec.max_parallel,
            max_unavailable_milli: spec.max_unavailable_milli,
            deadline_s: spec.deadline_s,
            preempt: spec.preempt,
            upgrade_s: cx.node.w.settings.sim_upgrade.map(|d| d.as_secs()),
            state: RolloutState::Running,
            created_at: now,
            created_by: actor.to_string(),
            ended_at: None,
            detail: String::new(),
            nodes,
        };
        r.id = cx
            .node
            .store
            .create_rollout(&r)
            .await
            .map_err(|e| LifecycleError::Unavailable(format!("the store is unavailable: {e}")))?;
        tracing::info!(id = r.id, pool = %r.pool, nodes = r.nodes.len(), "rollout started");
        self.publish_rollout(cx, &r);
        self.rollout_step(cx, r.id, batch, now).await;
        Ok(cx.node.ops.rollouts[&r.id].clone())
    }

    /// Cancels a running rollout: no more nodes are taken; the nodes already out finish their
    /// upgrade and validation.
    pub(super) async fn cancel_rollout(
        &mut self,
        cx: &mut RolloutCtx<'_>,
        id: u64,
        actor: &str,
        now: i64,
    ) -> Result<RolloutRecord, LifecycleError> {
        let Some(mut r) = cx.node.ops.rollouts.get(&id).cloned() else {
            return Err(LifecycleError::Conflict(format!("no rollout {id}")));
        };
        if r.state != RolloutState::Running {
            return Err(LifecycleError::Conflict(format!(
                "rollout {id} is {} already",
                r.state.as_str()
            )));
        }
        r.state = RolloutState::Cancelled;
        r.detail = format!("cancelled by {actor}; nodes already out finish");
        if !r.nodes.iter().any(|n| n.state.is_out()) {
            r.ended_at = Some(now);
        }
        self.save_rollout(cx, &r).await?;
        Ok(r)
    }

    /// The hook: the upgrade of `node` is finished. It must be `upgrading` in a rollout.
    pub(super) async fn upgrade_done(
        &mut self,
        cx: &mut RolloutCtx<'_>,
        node: &str,
        actor: &str,
        batch: &mut Batch,
        now: i64,
    ) -> Result<(), LifecycleError> {
        let found = cx.node.ops.rollouts.values().find_map(|r| {
            let i = r
                .nodes
                .iter()
                .position(|n| n.node == node && n.state == RolloutNodeState::Upgrading)?;
            Some((r.id, i))
        });
        let Some((id, i)) = found else {
            return Err(LifecycleError::Conflict(format!(
                "node {node} is not being upgraded by a rollout (`tessera upgrade status`)"
            )));
        };
        let mut r = cx.node.ops.rollouts[&id].clone();
        self.move_node(
            &mut r,
            i,
            RolloutNodeState::Validating,
            format!("upgrade reported done by {actor}"),
            batch,
            now,
        );
        self.save_rollout(cx, &r).await?;
        self.rollout_step(cx, id, batch, now).await;
        Ok(())
    }

    /// One step of every running rollout (and of the nodes still out in ended ones).
    pub(super) async fn rollouts_step(&mut self, cx: &mut RolloutCtx<'_>, batch: &mut Batch, now: i64) {
        let ids: Vec<u64> = cx
            .node
            .ops
            .rollouts
            .values()
            .filter(|r| r.state == RolloutState::Running || r.nodes.iter().any(|n| n.state.is_out()))
            .map(|r| r.id)
            .collect();
        for id in ids {
            self.rollout_step(cx, id, batch, now).await;
        }
    }

    async fn rollout_step(&mut self, cx: &mut RolloutCtx<'_>, id: u64, batch: &mut Batch, now: i64) {
        let Some(mut r) = cx.node.ops.rollouts.get(&id).cloned() else {
            return;
        };
        let before = r.clone();
        self.step_nodes(cx, &mut r, batch, now).await;
        if r.state == RolloutState::Running && r.nodes.iter().any(|n| n.state == RolloutNodeState::Failed) {
            r.state = RolloutState::Failed;
            r.detail = "a node failed: no more nodes are taken".into();
        }
        if r.state == RolloutState::Running {
            if self.take_nodes(cx, &mut r, batch, now).await {
                // Nodes taken empty are in maintenance already: their upgrade starts now.
                self.step_nodes(cx, &mut r, batch, now).await;
            }
            if r.nodes.iter().all(|n| n.state == RolloutNodeState::Done) {
                r.state = RolloutState::Done;
                r.detail = format!("{} node(s) upgraded", r.nodes.len());
            }
        }
        if r.state != RolloutState::Running && r.ended_at.is_none() && !r.nodes.iter().any(|n| n.state.is_out()) {
            r.ended_at = Some(now);
        }
        if r != before
            && let Err(e) = self.save_rollout(cx, &r).await
        {
            tracing::error!(id, error = %e, "cannot store a rollout's progress; retrying at the next tick");
        }
    }

    /// Moves the rollout's nodes that are out on, each through every step due now.
    async fn step_nodes(&mut self, cx: &mut RolloutCtx<'_>, r: &mut RolloutRecord, batch: &mut Batch, now: i64) {
        for i in 0..r.nodes.len() {
            // A node takes every step that is due now in one pass (drained → upgrading → ...),
            // so no step waits for the next tick.
            loop {
                let n = r.nodes[i].clone();
                match n.state {
                    RolloutNodeState::Draining => {
                        let drained = cx.node.ops.node_state(&n.node) == NodeState::Maintenance
                            && !cx.drains.nodes.contains_key(&n.node);
                        if drained {
                            let (until, detail) = match r.upgrade_s {
                                Some(s) => (
                                    Some(now + s as i64 * 1000),
                                    format!(
                                        "drained; simulated upgrade until {}",
                                        tessera_api::rfc3339_ms(now + s as i64 * 1000)
                                    ),
                                ),
                                None => (None, format!("drained; waiting for `tessera node done {}`", n.node)),
                            };
                            r.nodes[i].upgrade_until = until;
                            // The simulated upgrade reboots the node of a simulated backend: gone
                            // now, back when it ends (validation waits for its GPUs).
                            if let (Some(s), Some(sim)) = (r.upgrade_s, cx.node.w.backend.simulated())
                                && let Err(e) = sim.reboot(&n.node, std::time::Duration::from_secs(s))
                            {
                                tracing::warn!(node = %n.node, error = %e, "the simulated upgrade cannot reboot the node");
                            }
                            self.move_node(r, i, RolloutNodeState::Upgrading, detail, batch, now);
                        } else if cx.node.ops.node_state(&n.node) == NodeState::Ready {
                            let detail = "the node was uncordoned during its drain".to_string();
                            self.fail_node(cx, r, i, detail, batch, now).await;
                        }
                    }
                    RolloutNodeState::Upgrading if n.upgrade_until.is_some_and(|t| now >= t) => {
                        let detail = "simulated upgrade finished".to_string();
                        self.move_node(r, i, RolloutNodeState::Validating, detail, batch, now);
                    }
                    RolloutNodeState::Validating => {
                        if self.lost_but_reporting(cx, &n) {
                            // The node is back though its return was not seen (a control-plane restart
                            // while it was away, or not yet): its lost GPUs report again, so they are back.
                            let mut h = HealthCtx {
                                w: &mut *cx.node.w,
                                store: cx.node.store,
                                ops: &mut *cx.node.ops,
                                published: cx.node.published,
                            };
                            cx.node.health.node_back(&mut h, &n.node).await;
                        }
                        match self.validate(cx, &n) {
                            Ok(detail) => {
                                if let Err(e) = cx.set_state(&n.node, NodeState::Ready, String::new(), now).await {
                                    tracing::error!(node = %n.node, error = %e, "cannot uncordon an upgraded node; retrying");
                                    break;
                                }
                                r.nodes[i].ended_at = Some(now);
                                self.move_node(r, i, RolloutNodeState::Done, detail, batch, now);
                            }
                            Err(Invalid::Failed(why)) => {
                                self.fail_node(cx, r, i, format!("validation failed: {why}"), batch, now)
                                    .await;
                            }
                            Err(Invalid::NotYet(why)) if now - n.since >= VALIDATE_WITHIN_MS => {
                                let within = VALIDATE_WITHIN_MS / 1000;
                                let why = format!("validation failed: {why} within {within} s of the upgrade");
                                self.fail_node(cx, r, i, why, batch, now).await;
                            }
                            Err(Invalid::NotYet(why)) => {
                                // The backend's MIG instances are read at reconcile: ask for one.
                                *cx.reconcile_soon |= why.contains("MIG instances");
                            }
                        }
                    }
                    _ => {}
                }
                if r.nodes[i].state == n.state {
                    break;
                }
            }
        }
    }

    /// Takes the next pending nodes in plan order while the limits allow, each only once its
    /// unmovable work ends within [`CORDON_AHEAD_MS`] (or the soonest when none is out, see
    /// [`rollout::take_now`]). Whether it took any.
    async fn take_nodes(
        &mut self,
        cx: &mut RolloutCtx<'_>,
        r: &mut RolloutRecord,
        batch: &mut Batch,
        now: i64,
    ) -> bool {
        let limits = Limits {
            max_parallel: r.max_parallel.max(1) as usize,
            max_unavailable_milli: r.max_unavailable_milli,
        };
        let units = |w: &World, name: &str| {
            w.fleet
                .node_by_name(name)
                .map(|n| w.fleet.node(n).gpus as u64 * 1000)
                .unwrap_or(0)
        };
        let out_nodes = r.nodes.iter().filter(|n| n.state.is_out()).count();
        let out_units: u64 = r
            .nodes
            .iter()
            .filter(|n| n.state.is_out())
            .map(|n| units(cx.node.w, &n.node))
            .sum();
        let pending: Vec<String> = r
            .nodes
            .iter()
            .filter(|n| n.state == RolloutNodeState::Pending)
            .map(|n| n.node.clone())
            .collect();
        if pending.is_empty() {
            return false;
        }
        let plan = self.plan_nodes(cx, &pending);
        let mut took = false;
        for k in rollout::take_now(&plan, now, limits, out_nodes, out_units, CORDON_AHEAD_MS) {
            let name = plan[k].name.clone();
            let i = r
                .nodes
                .iter()
                .position(|n| n.node == name)
                .expect("a pending node of this rollout");
            r.nodes[i].layout = self.layout_text(cx, &name);
            r.nodes[i].started_at = Some(now);
            let deadline_ms = r.deadline_s.map(|s| now + s as i64 * 1000);
            let actor = format!("rollout {}", r.id);
            let order = DrainOrder {
                node: &name,
                deadline_ms,
                preempt: r.preempt,
                actor: &actor,
                rollout: Some(r.id),
            };
            if let Err(e) = cx.start_drain(order, batch, now).await {
                tracing::error!(node = %name, error = %e, "cannot drain a node for a rollout; retrying");
                break;
            }
            let detail = match r.deadline_s {
                Some(s) => format!(
                    "draining; deadline in {s} s, then {}",
                    if r.preempt { "preempt" } else { "wait" }
                ),
                None => "draining; no deadline".into(),
            };
            self.move_node(r, i, RolloutNodeState::Draining, detail, batch, now);
            took = true;
        }
        took
    }

    /// Whether node `n` has GPUs marked lost that report telemetry taken since its step began.
    fn lost_but_reporting(&self, cx: &RolloutCtx<'_>, n: &RolloutNodeRecord) -> bool {
        let t = cx.node.published.telemetry();
        let mut lost = cx
            .node
            .ops
            .unhealthy
            .iter()
            .filter(|((node, _), h)| node == &n.node && h.cause == tessera_store::HealthCause::Lost)
            .peekable();
        lost.peek().is_some()
            && t.at >= n.since
            && lost.all(|((_, g), _)| t.gpus.iter().any(|s| s.node == n.node && s.gpu == *g && s.xid == 0))
    }

    /// Validates an upgraded node: `Ok(what was checked)`, or why not.
    fn validate(&self, cx: &RolloutCtx<'_>, n: &RolloutNodeRecord) -> Result<String, Invalid> {
        use Invalid::{Failed, NotYet};
        let Some(idx) = cx.node.w.fleet.node_by_name(&n.node) else {
            return Err(Failed(format!("node {} is not in the fleet", n.node)));
        };
        let gpus = cx.node.w.fleet.node(idx).gpus;
        // A GPU lost may come back (the node reboots); one out for an XID or a failed
        // partition stays out until an admin clears it.
        if let Some(((_, g), h)) = cx.node.ops.unhealthy.iter().find(|((node, _), _)| node == &n.node) {
            let why = format!("GPU {g} is unhealthy ({})", h.detail);
            return Err(if h.cause == tessera_store::HealthCause::Lost {
                NotYet(why)
            } else {
                Failed(why)
            });
        }
        let t = cx.node.published.telemetry();
        let back = if t.at == 0 {
            "no telemetry from the backend to check GPUs against".to_string()
        } else {
            if t.at < n.since {
                return Err(NotYet("no telemetry since the upgrade".into()));
            }
            for g in 0..gpus {
                match t.gpus.iter().find(|s| s.node == n.node && s.gpu == g) {
                    None => return Err(NotYet(format!("GPU {g} is not back"))),
                    Some(s) if s.xid != 0 => return Err(NotYet(format!("GPU {g} reports XID {}", s.xid))),
                    Some(_) => {}
                }
            }
            format!("all {gpus} GPU(s) back and healthy")
        };
        let layout = self.layout_text(cx, &n.node);
        // A rollout stored before MIG modes were written down (empty) is not held to them.
        let instance_mode = cx.node.w.caps.partitioning != tessera_backend::Partitioning::WholeGpu;
        if layout != n.layout && !(instance_mode && n.layout.is_empty()) {
            return Err(NotYet(format!(
                "MIG layout `{layout}` differs from `{}` before the drain",
                n.layout
            )));
        }
        if !instance_mode {
            return Ok(format!("validated: {back}; MIG layout as before the drain"));
        }
        match self.instances_as_engine_holds(cx, &n.node, n.since) {
            Ok(true) => Ok(format!(
                "validated: {back}; MIG modes as before the drain; MIG instances as the engine holds them"
            )),
            Ok(false) => Ok(format!("validated: {back}; MIG modes as before the drain")),
            Err(why) => Err(NotYet(why)),
        }
    }

    async fn fail_node(
        &mut self,
        cx: &mut RolloutCtx<'_>,
        r: &mut RolloutRecord,
        i: usize,
        why: String,
        batch: &mut Batch,
        now: i64,
    ) {
        let node = r.nodes[i].node.clone();
        let detail = format!("rollout {}: {why}", r.id);
        if let Err(e) = cx.set_state(&node, NodeState::Cordoned, detail, now).await {
            tracing::error!(%node, error = %e, "cannot keep a failed node cordoned");
        }
        r.nodes[i].ended_at = Some(now);
        self.move_node(r, i, RolloutNodeState::Failed, why, batch, now);
    }

    /// One node step: its new state, and the audit record committed with the batch.
    fn move_node(
        &mut self,
        r: &mut RolloutRecord,
        i: usize,
        to: RolloutNodeState,
        detail: String,
        batch: &mut Batch,
        now: i64,
    ) {
        let n = &mut r.nodes[i];
        tracing::info!(rollout = r.id, node = %n.node, from = n.state.as_str(), to = to.as_str(), %detail, "rollout step");
        batch.audit(AuditRecord {
            seq: 0,
            at: now,
            request_id: format!("rollout-{}", r.id),
            actor: CONTROLLER.into(),
            tenant: None,
            action: format!("rollout.{}", to.as_str()),
            target: format!("rollouts/{}/nodes/{}", r.id, n.node),
            outcome: 200,
            detail: format!("{} → {}: {detail}", n.state.as_str(), to.as_str()),
        });
        n.state = to;
        n.since = now;
        n.detail = detail;
    }

    async fn save_rollout(&mut self, cx: &mut RolloutCtx<'_>, r: &RolloutRecord) -> Result<(), LifecycleError> {
        cx.node
            .store
            .save_rollout(r)
            .await
            .map_err(|e| LifecycleError::Unavailable(format!("the store is unavailable: {e}")))?;
        self.publish_rollout(cx, r);
        Ok(())
    }

    fn publish_rollout(&mut self, cx: &mut RolloutCtx<'_>, r: &RolloutRecord) {
        let mut ops = (**cx.node.ops).clone();
        ops.rollouts.insert(r.id, r.clone());
        *cx.node.ops = std::sync::Arc::new(ops);
        cx.node.published.set_ops(cx.node.ops.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(ends: &[Option<i64>]) -> rollout::Node {
        rollout::Node {
            name: "n".into(),
            units_milli: 8000,
            work: ends
                .iter()
                .map(|&end_ms| rollout::Work {
                    units_milli: 1000,
                    end_ms,
                    start_ms: 0,
                })
                .collect(),
        }
    }

    #[test]
    fn a_pending_node_says_what_it_waits_for() {
        assert_eq!(
            pending_detail(&node(&[]), None),
            "no work: taken as soon as the limits allow"
        );
        assert_eq!(
            pending_detail(&node(&[Some(1_000), Some(2_000), None]), None),
            "its timed work ends 1970-01-01T00:00:02.000Z; 1 service(s) move when it drains"
        );
        let open = node(&[Some(rollout::NEVER), Some(rollout::NEVER)]);
        assert_eq!(
            pending_detail(&open, None),
            "2 workload(s) without a duration: taken last; its drain waits for them to end"
        );
        assert_eq!(
            pending_detail(&open, Some(600)),
            "2 workload(s) without a duration: taken last; its drain preempts them after 600 s"
        );
    }
}
