//! What one batch of commands decided, collected for its commit: workload records with their
//! new events (several changes of one workload in one batch become one write), usage
//! intervals, audit records and fleet changes, the answers to give and the backend work to
//! start once it is stored.

use std::collections::HashMap;
use std::sync::Arc;

use tessera_domain::{Event, Workload, WorkloadId};
use tessera_store::{Change, IdempotencyKey};

use super::command::{MigOutcome, Reply};
use super::effects::Op;

/// Whom to answer after the commit, and with what.
pub(super) enum ReplyTo {
    /// A creation: the workload, and whether it was created now (`false`: an idempotent retry).
    Created(Reply<(Arc<Workload>, bool)>, WorkloadId, bool),
    /// The workload's record after the batch.
    Workload(Reply<Arc<Workload>>, WorkloadId),
    Done(Reply<()>),
    /// An admin's MIG mode change, answered once it is stored.
    Mig(Reply<MigOutcome>, MigOutcome),
}

struct Pending {
    insert: bool,
    idempotency: Option<IdempotencyKey>,
    workload: Arc<Workload>,
    events: Vec<Event>,
}

/// A batch taken apart: what to store, what to publish, what to run.
pub(super) struct Parts {
    pub changes: Vec<Change>,
    pub records: Vec<Arc<Workload>>,
    pub ops: Vec<(WorkloadId, Op)>,
}

/// What a batch of commands decided.
#[derive(Default)]
pub(super) struct Batch {
    order: Vec<WorkloadId>,
    records: HashMap<WorkloadId, Pending>,
    usage: Vec<Change>,
    audit: Vec<Change>,
    pub(super) ops: Vec<(WorkloadId, Op)>,
    pub(super) replies: Vec<ReplyTo>,
    /// Idempotency keys used in this batch: (actor, key) → (request hash, workload).
    idempotency: HashMap<(String, String), (String, WorkloadId)>,
    /// Recompute the queue and phase counts of the snapshot too.
    pub full_publish: bool,
    /// Creations in this batch were left to the next cycle (capacity was changing): their
    /// callers wait for it.
    pub undecided: bool,
    /// The queue or the phases changed: the next full publication is due sooner.
    pub queue_changed: bool,
}

impl Batch {
    /// A new workload with its first events.
    pub fn insert(&mut self, workload: Arc<Workload>, events: Vec<Event>, idempotency: Option<IdempotencyKey>) {
        if let Some(k) = &idempotency {
            self.idempotency
                .insert((k.actor.clone(), k.key.clone()), (k.request_hash.clone(), workload.id));
        }
        self.order.push(workload.id);
        self.records.insert(
            workload.id,
            Pending {
                insert: true,
                idempotency,
                workload,
                events,
            },
        );
    }

    /// A workload's new record and the events explaining the change.
    pub fn update(&mut self, workload: Arc<Workload>, events: Vec<Event>) {
        match self.records.get_mut(&workload.id) {
            Some(p) => {
                p.workload = workload;
                p.events.extend(events);
            }
            None => {
                self.order.push(workload.id);
                self.records.insert(
                    workload.id,
                    Pending {
                        insert: false,
                        idempotency: None,
                        workload,
                        events,
                    },
                );
            }
        }
    }

    /// A usage interval opened or closed.
    pub fn usage(&mut self, c: Change) {
        self.usage.push(c);
    }

    /// An audit record committed with the batch.
    pub fn audit(&mut self, r: tessera_store::AuditRecord) {
        self.audit.push(Change::Audit(r));
    }

    /// A fleet change (a GPU's MIG mode) committed with the batch, before its audit record.
    pub fn change(&mut self, c: Change) {
        self.audit.push(c);
    }

    /// Backend work to start after the commit.
    pub fn op(&mut self, id: WorkloadId, op: Op) {
        self.ops.push((id, op));
    }

    pub fn reply(&mut self, r: ReplyTo) {
        self.replies.push(r);
    }

    /// The batch's changes in commit order (workload records, then usage intervals), the
    /// records to publish, and the backend work.
    pub fn into_parts(mut self) -> Parts {
        let (changes, records) = self.take_changes();
        Parts {
            changes,
            records: records.into_values().collect(),
            ops: self.ops,
        }
    }

    pub(super) fn take_changes(&mut self) -> (Vec<Change>, HashMap<WorkloadId, Arc<Workload>>) {
        let mut changes = Vec::with_capacity(self.order.len() + self.usage.len());
        let mut records = HashMap::with_capacity(self.order.len());
        for id in std::mem::take(&mut self.order) {
            let p = self.records.remove(&id).expect("ordered ids have records");
            records.insert(id, p.workload.clone());
            changes.push(if p.insert {
                Change::Insert {
                    workload: p.workload,
                    events: p.events,
                    idempotency: p.idempotency,
                }
            } else {
                Change::Update {
                    workload: p.workload,
                    events: p.events,
                }
            });
        }
        changes.append(&mut self.usage);
        changes.append(&mut self.audit);
        (changes, records)
    }

    /// The earlier use of an idempotency key in this batch.
    pub fn idempotent(&self, actor: &str, key: &str) -> Option<(String, WorkloadId)> {
        self.idempotency.get(&(actor.to_string(), key.to_string())).cloned()
    }
}
