//! The workload state the controllers that change workloads act on: the fleet, the
//! scheduler, the live workloads, the tenants' numbers and this month's usage, with the
//! settings, the backend and the metrics a transition uses; and the one way a workload
//! changes ([`World::apply`]: its transition, and the effects that touch the scheduler and the
//! ledger). Controllers own their own state and are handed the world, the batch and the time
//! for each step, and besides it only what else they use: the store (admission, moves,
//! health, drains, rollouts, publication), the fleet-operations state and the readers' view
//! (health, drains, rollouts, MIG modes, publication), never the loop. Those that change no
//! workload are handed only the fields they use (the MIG modes' `MigCtx`, metering's
//! `MeterCtx`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tessera_backend::{Backend, Capabilities, MigInstance, PartitionPlan};
use tessera_domain::{Input, Observed, Reason, WorkloadId, transition_shared};
use tessera_model::{Fleet, Request, TenantId};
use tessera_sched::cycle::Scheduler;
use tessera_store::{Change, UsageInterval};

use super::batch::Batch;
use super::config::{SchedFactory, Settings};
use super::effects::Op;
use super::live::{Live, class_of, fresh_scheduler};
use super::metering::MonthBook;
use super::placement::{self, NodeIndex};
use crate::metrics::Metrics;

/// What the controllers that change workloads read and change.
pub(super) struct World {
    pub fleet: Arc<Fleet>,
    pub nodes: Arc<NodeIndex>,
    pub sched: Scheduler,
    pub factory: SchedFactory,
    pub backend: Arc<dyn Backend>,
    pub caps: Capabilities,
    pub live: HashMap<WorkloadId, Live>,
    /// The engine's numbers for tenant names.
    pub tenants: HashMap<String, TenantId>,
    pub settings: Settings,
    /// This month's usage per tenant (budgets).
    pub month: MonthBook,
    pub metrics: Arc<Metrics>,
}

impl World {
    /// A new scheduler whose engine honours the backend's capabilities.
    pub(super) fn fresh_scheduler(&self) -> Scheduler {
        fresh_scheduler(&self.factory, self.fleet.clone(), &self.caps)
    }

    pub(super) fn tenant_id(&mut self, name: &str) -> TenantId {
        let n = self.tenants.len() as u32;
        *self.tenants.entry(name.to_string()).or_insert(TenantId(n))
    }

    pub(super) fn class_of(&self, r: &Request) -> String {
        class_of(&self.fleet, &self.sched, r)
    }

    /// Backend news becomes lifecycle input.
    /// Tells a native workload's owner, on its object, why it waits (when the reason changed)
    /// or that it was refused.
    pub(super) fn tell_native(&self, id: WorkloadId, reason: &Reason, refused: bool) {
        let Some(l) = self.live.get(&id) else { return };
        let Some(native) = l.w.spec.native.as_deref() else {
            return;
        };
        if !refused && l.w.reason.as_ref() == Some(reason) {
            return;
        }
        crate::native::tell(&*self.backend, native, refused, &reason.detail);
    }

    /// Runs `input` through the lifecycle of workload `id` and carries out the effects that
    /// touch the scheduler and the ledger; backend work and the record wait for the commit.
    pub(super) fn apply(&mut self, id: WorkloadId, input: Input, batch: &mut Batch, now: i64) {
        let Some(mut live) = self.live.remove(&id) else {
            return;
        };
        // The placement and running time before the transition: a requeue clears them, and the
        // unpartition and the month's spend still need them.
        let before = live.w.placement.clone();
        let before_units = live.w.held_units();
        let ran_since = live.w.running_at;
        let before_phase = live.w.phase;
        // A drain's stop goes through the platform's eviction (Kubernetes: the Eviction API).
        let evict = matches!(
            input,
            Input::Preempt {
                code: tessera_domain::PreemptCode::Drain,
                ..
            }
        );
        let mut follow = Vec::new();
        let t = transition_shared(live.w, input);
        live.w = t.workload;
        for e in &t.effects {
            match e {
                tessera_domain::Effect::Release => {
                    self.sched.release(id.0, now);
                }
                // One without a reason was never decided (accepted before a crash): the next
                // cycle decides it like a new one.
                tessera_domain::Effect::Requeue if live.w.reason.is_none() => self.sched.enqueue_undecided(live.job()),
                tessera_domain::Effect::Requeue => self.sched.enqueue(live.job()),
                tessera_domain::Effect::Dequeue => {
                    self.sched.dequeue(id.0);
                }
                tessera_domain::Effect::OpenUsage { seq, at } => {
                    let p = live.w.placement.as_ref().expect("a running workload has a placement");
                    live.util = (0.0, 0.0);
                    batch.usage(Change::OpenUsage(UsageInterval {
                        workload: id,
                        seq: *seq,
                        tenant: live.w.spec.tenant.clone(),
                        project: live.w.spec.project.clone(),
                        pool: p.pool.clone(),
                        model: p.model.clone(),
                        shape: if live.w.shares.is_empty() {
                            p.to_string()
                        } else {
                            format!("{} ({} node-shares)", live.w.spec.shape.gpu, live.w.shares.len() + 1)
                        },
                        // Every node-share of a gang.
                        units: live.w.held_units(),
                        started_at: *at,
                        ended_at: None,
                        util_avg: None,
                    }));
                }
                tessera_domain::Effect::CloseUsage { seq, at } => {
                    let util_avg = live.utilisation();
                    live.util = (0.0, 0.0);
                    if let (Some(_), Some(r)) = (before.as_ref(), ran_since) {
                        self.month.close(&live.w.spec.tenant, before_units, r, *at);
                    }
                    batch.usage(Change::CloseUsage {
                        workload: id,
                        seq: *seq,
                        ended_at: *at,
                        util_avg,
                    });
                }
                tessera_domain::Effect::Partition => {
                    let p = live.w.placement.as_ref().expect("a placed workload has a placement");
                    match placement::partition_plan(p, &self.caps, || self.layout(p)) {
                        // Whole GPUs and host resources: nothing to create, so nothing a crash
                        // could make twice; the step is recorded at once and the start follows.
                        PartitionPlan::Nothing { node } => follow.push(Input::Partitioned {
                            at: now,
                            detail: match p.slice {
                                tessera_domain::Slice::Whole if !live.w.shares.is_empty() => {
                                    let shares: Vec<String> = live
                                        .w
                                        .placements()
                                        .map(|s| format!("{} {:?}", s.node, s.gpus))
                                        .collect();
                                    format!(
                                        "whole GPUs on {} node-shares ({}): nothing to partition",
                                        shares.len(),
                                        shares.join(", ")
                                    )
                                }
                                tessera_domain::Slice::Whole => {
                                    format!("whole GPUs {:?} on {node}: nothing to partition", p.gpus)
                                }
                                _ => format!("host resources on {node}: nothing to partition"),
                            },
                        }),
                        plan => batch.op(id, Op::Partition(plan)),
                    }
                }
                tessera_domain::Effect::Start => {
                    let spec = placement::run_spec(&self.fleet, &self.nodes, &live.w, &self.caps);
                    batch.op(id, Op::Start(Box::new(spec)));
                }
                tessera_domain::Effect::Stop { grace_s } => {
                    self.sched.stopping(id.0);
                    batch.op(
                        id,
                        Op::Stop {
                            grace: Duration::from_secs(*grace_s),
                            evict,
                        },
                    );
                }
                tessera_domain::Effect::Unpartition => {
                    if let Some(p) = before.as_ref().or(live.w.placement.as_ref()) {
                        let plan = placement::partition_plan(p, &self.caps, Vec::new);
                        if !matches!(plan, PartitionPlan::Nothing { .. } | PartitionPlan::Layout { .. }) {
                            batch.op(id, Op::Unpartition(plan));
                        }
                    }
                }
            }
        }
        if live.w.phase.is_terminal() {
            self.metrics.ended(live.w.phase);
        }
        if t.changed && (before_phase != live.w.phase || live.w.phase.is_waiting()) {
            batch.queue_changed = true;
        }
        if t.changed {
            batch.update(live.w.clone(), t.events);
        }
        if !live.w.phase.is_terminal() {
            self.live.insert(id, live);
        }
        for input in follow {
            self.apply(id, input, batch, now);
        }
    }

    /// The MIG layout of the GPU a placement is on, as the engine holds it (`whole-gpu`
    /// backends: the configured layout, this instance included).
    pub(super) fn layout(&self, p: &tessera_domain::Placement) -> Vec<MigInstance> {
        let Some(n) = self.nodes.get(&p.node) else {
            return Vec::new();
        };
        let gpu = p.gpus.first().copied().unwrap_or(0);
        self.sched
            .engine
            .mig_layout(n, gpu)
            .iter()
            .map(|slot| placement::mig_instance_of(&self.fleet, n, slot))
            .collect()
    }

    /// Moves a workload's booking to the devices a per-node-count backend chose; returns the
    /// new placements of every workload whose booking changed (a swap moves two).
    pub(super) fn rebind(
        &mut self,
        id: WorkloadId,
        p: &tessera_domain::Placement,
        bound: &tessera_backend::Bound,
    ) -> Result<Vec<(WorkloadId, tessera_domain::Placement)>, String> {
        let mut q = p.clone();
        q.gpus = bound.gpus.clone();
        if let (tessera_domain::Slice::Mig { start, .. }, Some(m)) = (&mut q.slice, &bound.mig) {
            *start = m.start;
        }
        if q == *p {
            self.sched.engine.bind(id.0).map_err(|e| e.to_string())?;
            return Ok(Vec::new());
        }
        let l = self.live.get(&id).ok_or("not live")?;
        let tenant = self.tenants.get(&l.w.spec.tenant).copied().unwrap_or(TenantId(0));
        let alloc = placement::allocation_of(
            &self.fleet,
            &self.nodes,
            id.0,
            &q,
            (l.w.spec.cpu_milli, l.w.spec.memory_mib),
            tenant,
        )?;
        let moved = self.sched.engine.rebind(id.0, alloc.grant).map_err(|e| e.to_string())?;
        Ok(moved
            .into_iter()
            .filter_map(|m| {
                let a = self.sched.engine.allocation(m)?;
                Some((WorkloadId(m), placement::placement_of(&self.fleet, a)))
            })
            .collect())
    }

    /// A backend observation as lifecycle input.
    pub(super) fn observed(&self, o: tessera_backend::Observation, when: &str) -> Observed {
        match o {
            tessera_backend::Observation::Running { since_ms } => Observed::Running { since: since_ms },
            tessera_backend::Observation::Starting => Observed::Starting,
            tessera_backend::Observation::Succeeded => Observed::Succeeded,
            tessera_backend::Observation::Failed { detail } => Observed::Failed { detail },
            tessera_backend::Observation::Unknown => Observed::Unknown {
                detail: format!(
                    "the {} backend no longer knows this workload ({when})",
                    self.backend.name()
                ),
            },
        }
    }

    /// The live workloads still holding capacity on a node that left, with that node (any
    /// node-share of a gang: the whole gang is lost), in id order.
    pub(super) fn lost_on(&self, gone: &[String]) -> Vec<(WorkloadId, String)> {
        let mut lost: Vec<(WorkloadId, String)> = self
            .live
            .values()
            .filter(|l| l.w.phase.holds_capacity())
            .filter_map(|l| {
                let node = &l.w.placements().find(|p| gone.contains(&p.node))?.node;
                Some((l.w.id, node.clone()))
            })
            .collect();
        lost.sort_unstable();
        lost
    }
}
