//! Admission and dispatch: a new workload is checked for an idempotent retry, numbered,
//! recorded with its `requested` and `authorised` steps and handed to the scheduler; the
//! scheduler's decisions (placed, waiting, refused, preempted, moved) become lifecycle inputs.
//! Cancellations and quota and budget changes come in here too.
//!
//! The controller owns the workload ids reserved from the store and the creations whose answer
//! waits for the next scheduling cycle; it is handed the [`World`], the batch and the time, and
//! the consolidation [`Moves`] a decision may start.

use std::ops::Range;
use std::sync::Arc;

use tessera_domain::{Event, Input, Reason, Step, Workload, WorkloadId, WorkloadSpec};
use tessera_model::request::GangRequest;
use tessera_sched::cycle::{Decision, Job};
use tessera_sched::reason::Refusal;
use tessera_store::Store;

use super::batch::{Batch, ReplyTo};
use super::command::{Governance, LifecycleError, NewWorkload, Reply};
use super::consolidation::Moves;
use super::live::Live;
use super::placement;
use super::snapshot::Published;
use super::world::World;

/// Workload ids reserved from the store at a time.
const ID_BLOCK: u32 = 1024;

/// The admission and dispatch controller.
pub(super) struct Admission {
    /// Where ids are reserved and earlier uses of an idempotency key are found.
    store: Arc<dyn Store>,
    /// Workload ids reserved from the store and not yet used.
    ids: Range<u64>,
    /// Creations answered after the next cycle decides them (they were submitted while
    /// capacity was changing).
    pub deferred: Vec<ReplyTo>,
}

fn unavailable(e: tessera_store::StoreError) -> LifecycleError {
    LifecycleError::Unavailable(format!("the store is unavailable: {e}"))
}

impl Admission {
    pub(super) fn new(store: Arc<dyn Store>) -> Admission {
        Admission {
            store,
            ids: 0..0,
            deferred: Vec::new(),
        }
    }

    /// Forgets the reserved ids (a rebuild from the store reserves new ones).
    pub(super) fn reset(&mut self) {
        self.ids = 0..0;
    }

    /// A creation command: accepted (its answer waits for the commit) or refused at once.
    pub(super) async fn on_create(
        &mut self,
        w: &mut World,
        moves: &mut Moves,
        nw: NewWorkload,
        reply: Reply<(std::sync::Arc<Workload>, bool)>,
        batch: &mut Batch,
        now: i64,
    ) {
        match self.create(w, moves, nw, batch, now).await {
            Ok((id, created)) => batch.reply(ReplyTo::Created(reply, id, created)),
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }

    /// Accepts a new workload: records it with its `requested` and `authorised` steps and hands
    /// it to the scheduler. A request refused at once is answered with the refusal and nothing
    /// is stored.
    async fn create(
        &mut self,
        w: &mut World,
        moves: &mut Moves,
        mut nw: NewWorkload,
        batch: &mut Batch,
        now: i64,
    ) -> Result<(WorkloadId, bool), LifecycleError> {
        let audit = nw.audit.take();
        let (id, created) = self.accept(w, moves, nw, batch, now).await?;
        if let Some(mut r) = audit {
            r.outcome = if created { 201 } else { 200 };
            r.target = format!("{} (workload {id})", r.target);
            batch.audit(r);
        }
        Ok((id, created))
    }

    /// [`create`](Self::create) without the audit record.
    pub(super) async fn accept(
        &mut self,
        w: &mut World,
        moves: &mut Moves,
        nw: NewWorkload,
        batch: &mut Batch,
        now: i64,
    ) -> Result<(WorkloadId, bool), LifecycleError> {
        self.accept_as(w, moves, nw, None, batch, now).await
    }

    /// [`accept`](Self::accept); `replacing`: the new workload is the replacement of that
    /// service, moved by consolidation, and takes the capacity the scheduler booked for it
    /// instead of queueing.
    pub(super) async fn accept_as(
        &mut self,
        w: &mut World,
        moves: &mut Moves,
        nw: NewWorkload,
        replacing: Option<WorkloadId>,
        batch: &mut Batch,
        now: i64,
    ) -> Result<(WorkloadId, bool), LifecycleError> {
        if let Some(id) = earlier_use(&*self.store, &nw, batch).await? {
            return Ok((id, false));
        }
        let id = self.next_id().await?;
        let NewWorkload {
            spec,
            actor,
            role,
            idempotency,
            received_at,
            ..
        } = nw;
        let (live, events) = match authorise(w, id, spec, &role, &actor, received_at, now) {
            Ok(a) => a,
            Err(e) => {
                self.ids.start -= 1;
                return Err(e);
            }
        };
        let job = live.job();
        w.live.insert(id, live);
        batch.queue_changed = true;
        let actions = match self.submit(w, id, job, replacing, batch, now) {
            Ok(a) => a,
            Err(e) => {
                w.live.remove(&id);
                self.ids.start -= 1;
                return Err(e);
            }
        };
        let refusal = actions.iter().find_map(|a| match a {
            Decision::Refused { id: r, reason } if *r == id.0 => Some(reason.clone()),
            _ => None,
        });
        if let Some(refusal) = refusal {
            let refused = self.refused(w, id, refusal);
            // The scheduler's other decisions are carried out.
            for a in actions {
                if !matches!(&a, Decision::Refused { id: r, .. } if *r == id.0) {
                    self.on_decision(w, moves, a, now, batch);
                }
            }
            return Err(refused);
        }
        let l = &w.live[&id];
        w.metrics.step("authorise", now - l.w.created_at);
        batch.insert(
            l.w.clone(),
            events,
            idempotency.map(|(key, request_hash)| tessera_store::IdempotencyKey {
                actor,
                key,
                request_hash,
            }),
        );
        for a in actions {
            self.on_decision(w, moves, a, now, batch);
        }
        Ok((id, true))
    }

    /// The next workload id, reserving a block from the store when none is left.
    async fn next_id(&mut self) -> Result<WorkloadId, LifecycleError> {
        if self.ids.is_empty() {
            self.ids = self.store.reserve_workload_ids(ID_BLOCK).await.map_err(unavailable)?;
        }
        let id = WorkloadId(self.ids.start);
        self.ids.start += 1;
        Ok(id)
    }

    /// Hands the new workload's job to the scheduler: the capacity booked for a replacement,
    /// the next cycle while capacity is changing, else a decision now.
    fn submit(
        &mut self,
        w: &mut World,
        id: WorkloadId,
        job: Job,
        replacing: Option<WorkloadId>,
        batch: &mut Batch,
        now: i64,
    ) -> Result<Vec<Decision>, LifecycleError> {
        // While capacity is changing, the next cycle (at most CYCLE_EVERY away) decides: a burst
        // of submissions then costs one pass over the queue, and freed capacity goes to the
        // queue in order. The caller's answer waits for that cycle.
        Ok(if let Some(old) = replacing {
            match w.sched.adopt_replacement(old.0, &job, now) {
                Some((alloc, borrowing)) => vec![Decision::Placed {
                    id: id.0,
                    alloc,
                    borrowing,
                }],
                None => {
                    return Err(LifecycleError::Conflict(format!(
                        "no replacement of workload {old} is booked"
                    )));
                }
            }
        } else if w.sched.needs_cycle() {
            batch.undecided = true;
            w.sched
                .submit_for_next_cycle(job)
                .map(|reason| Decision::Refused { id: id.0, reason })
                .into_iter()
                .collect()
        } else {
            w.sched.submit(job, now)
        })
    }

    /// A new workload refused at once: it is forgotten (its id goes to the next request), and
    /// the caller gets the refusal.
    fn refused(&mut self, w: &mut World, id: WorkloadId, refusal: Refusal) -> LifecycleError {
        w.live.remove(&id);
        // The id was never used: the next request takes it.
        self.ids.start -= 1;
        let reason = Reason::refused(&refusal);
        w.metrics.refused(reason.code);
        let (field, message) = match &refusal {
            Refusal::Constraint(u) => (Some(u.field().as_str()), u.message()),
            Refusal::Gang(u) => (Some(gang_field(u)), u.message()),
            _ => (None, reason.detail.clone()),
        };
        LifecycleError::Refused { reason, field, message }
    }

    /// Turns a scheduler decision into a lifecycle input.
    pub(super) fn on_decision(&mut self, w: &mut World, moves: &mut Moves, a: Decision, now: i64, batch: &mut Batch) {
        match a {
            Decision::Placed { id, alloc, borrowing } => {
                let wid = WorkloadId(id);
                let Some(l) = w.live.get(&wid) else {
                    tracing::error!(id, "placed a workload the loop does not know; releasing");
                    w.sched.release(id, now);
                    return;
                };
                w.metrics.step("place", now - l.w.created_at);
                let placement = placement::placement_of(&w.fleet, &alloc);
                w.apply(
                    wid,
                    Input::Placed {
                        at: now,
                        placement,
                        shares: Vec::new(),
                        borrowing,
                    },
                    batch,
                    now,
                );
            }
            Decision::PlacedGang { id, shares, borrowing } => {
                let wid = WorkloadId(id);
                let Some(l) = w.live.get(&wid) else {
                    tracing::error!(id, "placed a gang the loop does not know; releasing");
                    w.sched.release(id, now);
                    return;
                };
                w.metrics.step("place", now - l.w.created_at);
                let mut placements = shares.iter().map(|a| placement::placement_of(&w.fleet, a));
                let placement = placements.next().expect("a gang has a node-share");
                let input = Input::Placed {
                    at: now,
                    placement,
                    shares: placements.collect(),
                    borrowing,
                };
                w.apply(wid, input, batch, now);
            }
            Decision::Waiting { id, reason } => {
                let reason = Reason::waiting(&reason);
                w.tell_native(WorkloadId(id), &reason, false);
                w.apply(WorkloadId(id), Input::Waiting { at: now, reason }, batch, now);
            }
            Decision::Refused { id, reason } => {
                let reason = Reason::refused(&reason);
                w.tell_native(WorkloadId(id), &reason, true);
                w.metrics.refused(reason.code);
                w.apply(WorkloadId(id), Input::Refused { at: now, reason }, batch, now);
            }
            Decision::Preempt { victim, by, cause } => {
                w.metrics.preempted(cause.code());
                let code = match cause {
                    tessera_sched::reason::PreemptCause::Priority { .. } => tessera_domain::PreemptCode::Priority,
                    tessera_sched::reason::PreemptCause::Reclaim { .. } => tessera_domain::PreemptCode::Reclaim,
                };
                let input = Input::Preempt {
                    at: now,
                    by: WorkloadId(by),
                    code,
                    detail: cause.to_string(),
                    grace_s: w.settings.grace.as_secs(),
                };
                w.apply(WorkloadId(victim), input, batch, now);
            }
            Decision::Move { id, by, to } => moves.on_move(w, id, by, to.is_some(), batch, now),
        }
    }

    /// Runs a scheduling cycle's decisions, then answers the creations that waited for it.
    pub(super) fn on_cycle(
        &mut self,
        w: &mut World,
        moves: &mut Moves,
        actions: Vec<Decision>,
        batch: &mut Batch,
        now: i64,
    ) {
        for a in actions {
            self.on_decision(w, moves, a, now, batch);
        }
        for r in std::mem::take(&mut self.deferred) {
            batch.reply(r);
        }
    }

    /// A cancellation: refused for a workload that ended or never was, else answered with the
    /// record after the commit.
    pub(super) fn on_cancel(
        w: &mut World,
        published: &Published,
        id: WorkloadId,
        actor: String,
        reply: Reply<std::sync::Arc<Workload>>,
        batch: &mut Batch,
        now: i64,
    ) {
        if !w.live.contains_key(&id) {
            let err = match published.workload(id) {
                Some(_) => LifecycleError::Ended { id },
                None => LifecycleError::NotFound { id },
            };
            let _ = reply.send(Err(err));
            return;
        }
        let grace_s = w.settings.grace.as_secs();
        w.apply(
            id,
            Input::Cancel {
                at: now,
                by: actor,
                grace_s,
            },
            batch,
            now,
        );
        batch.reply(ReplyTo::Workload(reply, id));
    }

    /// A quota or budget set by an admin.
    pub(super) fn on_govern(w: &mut World, g: Governance, reply: Reply<()>, batch: &mut Batch, now: i64) {
        match g {
            Governance::Quota { tenant, class, quota } => w.sched.set_quota(&tenant, &class, quota),
            Governance::Budget { tenant, unit_hours } => {
                w.sched.set_budget(&tenant, unit_hours);
                let spent = w.month.spent(&tenant, w.live.values().map(|l| &*l.w), now);
                w.sched.set_spent(&tenant, spent);
            }
        }
        batch.full_publish = true;
        batch.reply(ReplyTo::Done(reply));
    }
}

/// The workload an idempotency key was already used for, in this batch or in the store; an
/// error when the key was used for another request.
async fn earlier_use(store: &dyn Store, nw: &NewWorkload, batch: &Batch) -> Result<Option<WorkloadId>, LifecycleError> {
    let Some((key, hash)) = &nw.idempotency else {
        return Ok(None);
    };
    let prior = match batch.idempotent(&nw.actor, key) {
        Some(p) => Some(p),
        None => store.idempotent(&nw.actor, key).await.map_err(unavailable)?,
    };
    match prior {
        Some((h, _)) if &h != hash => Err(LifecycleError::IdempotencyMismatch { key: key.clone() }),
        Some((_, id)) => Ok(Some(id)),
        None => Ok(None),
    }
}

/// The new workload as the loop keeps it, resolved against the loop's own fleet, with its
/// `requested` and `authorised` events.
fn authorise(
    w: &mut World,
    id: WorkloadId,
    spec: WorkloadSpec,
    role: &str,
    actor: &str,
    received_at: i64,
    now: i64,
) -> Result<(Live, Vec<Event>), LifecycleError> {
    let tenant = w.tenant_id(&spec.tenant);
    // Resolved again against the loop's own fleet: pools and models are numbered by the
    // fleet, and the caller may have read a newer (or older) one than the loop holds.
    let (request, gang) = placement::resolve(&w.fleet, &spec, tenant)
        .map_err(|e| LifecycleError::Conflict(format!("{}: {}", e.field, e.message)))?;
    // A gang asks for all its GPUs (`request` stands for one node-share).
    let units = gang
        .as_ref()
        .map_or_else(|| request.units(&w.fleet.catalogue), GangRequest::units);
    let mut wl = Workload::new(id, spec, units, received_at);
    let events = vec![
        Event {
            seq: 0,
            step: Step::Requested,
            at: received_at,
            detail: format!(
                "{} for {}/{} ({units} GPU units)",
                wl.spec.shape.gpu, wl.spec.tenant, wl.spec.project
            ),
            code: None,
        },
        Event {
            seq: 1,
            step: Step::Authorised,
            at: now,
            detail: format!(
                "{} token {} may create workloads in tenant {}; quota and budget checked",
                role, actor, wl.spec.tenant
            ),
            code: None,
        },
    ];
    wl.next_seq = 2;
    if w.sched.budget(&wl.spec.tenant).is_some() {
        let spent = w.month.spent(&wl.spec.tenant, w.live.values().map(|l| &*l.w), now);
        w.sched.set_spent(&wl.spec.tenant, spent);
    }
    let live = Live {
        class: w.class_of(&request).into(),
        request,
        gang,
        w: wl.into(),
        util: (0.0, 0.0),
    };
    Ok((live, events))
}

/// A new workload with `l`'s spec and request, submitted by the control plane itself (a
/// service moved by a drain or by consolidation: the replacement starts first).
pub(super) fn replacement_of(l: &Live, actor: String, now: i64) -> NewWorkload {
    NewWorkload {
        spec: l.w.spec.clone(),
        request: l.request.clone(),
        actor,
        role: "platform-admin".into(),
        idempotency: None,
        received_at: now,
        audit: None,
    }
}

/// The API's name of the field a gang refusal is about.
fn gang_field(u: &tessera_sched::GangUnplaceable) -> &'static str {
    match u {
        tessera_sched::GangUnplaceable::Invalid { field, .. } => placement::gang_field(field),
        tessera_sched::GangUnplaceable::UnknownLevel { .. } | tessera_sched::GangUnplaceable::PoolLacksLevel { .. } => {
            "shape.topology"
        }
        tessera_sched::GangUnplaceable::PoolCannotServe { .. } => "shape.pool",
        tessera_sched::GangUnplaceable::NoEligibleNode { .. } => "shape.models",
        _ => "shape.gpus",
    }
}
