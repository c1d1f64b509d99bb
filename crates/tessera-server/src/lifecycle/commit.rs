//! Group commit. A batch collects what the handling of many commands decided — workload
//! records with their new events (several changes of one workload in one batch become one
//! write), usage intervals, answers and backend work — and [`Core::commit`] stores it in one
//! transaction. Only after that are callers answered, records and the snapshot published, and
//! backend work started; if the store refuses the batch, every caller is told nothing changed
//! and memory is rebuilt from the store.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_domain::{Workload, WorkloadId};
use tessera_store::{Change, Store, StoreError};

use super::Core;
use super::batch::{Batch, ReplyTo};
use super::command::LifecycleError;
use super::snapshot::Published;

/// A full publication that took at least this long last time is made after the batch's
/// answers and backend work instead of before them (see [`Core::commit`]): on a small fleet it
/// costs microseconds and keeps its place, so an answer comes with counts that include it.
const FULL_BUILD_AFTER_REPLIES: Duration = Duration::from_micros(500);

impl Core {
    /// Rebuilds the loop's state from the store ([`Core::recover`]), retrying with backoff
    /// until it succeeds; `false` (and the loop marked fenced) when another replica leads.
    pub(super) async fn recover_until_done(&mut self, failing: &str) -> bool {
        let mut delay = Duration::from_millis(100);
        loop {
            match self.recover().await {
                Ok(()) => return true,
                Err(StoreError::Fenced(_)) => {
                    self.fenced = true;
                    return false;
                }
                Err(e) => {
                    tracing::error!(error = %e, "{failing}");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(10));
                }
            }
        }
    }

    /// Stores the batch in one transaction, then publishes, answers and starts backend work.
    pub(super) async fn commit(&mut self, mut batch: Batch, now: i64) {
        self.queue_dirty |= batch.queue_changed;
        let (mut changes, records) = batch.take_changes();
        if !changes.is_empty() {
            if let Some(f) = &self.fence {
                changes.insert(0, Change::Fence(f.clone()));
            }
            let t0 = Instant::now();
            let stored = self.w.store.commit(&changes).await;
            self.w.metrics.store_commit(t0.elapsed(), stored.is_ok());
            if let Err(e) = stored {
                let fenced = matches!(e, StoreError::Fenced(_));
                tracing::error!(error = %e, changes = changes.len(), "commit failed; rebuilding state from the store");
                let err = || {
                    LifecycleError::Unavailable(
                        "the store could not record the change; nothing was changed, retry shortly".into(),
                    )
                };
                for r in batch.replies {
                    match r {
                        ReplyTo::Created(tx, _, _) => {
                            let _ = tx.send(Err(err()));
                        }
                        ReplyTo::Workload(tx, _) => {
                            let _ = tx.send(Err(err()));
                        }
                        ReplyTo::Done(tx) => {
                            let _ = tx.send(Err(err()));
                        }
                        ReplyTo::Mig(tx, _) => {
                            let _ = tx.send(Err(err()));
                        }
                    }
                }
                if fenced {
                    // Another replica leads: nothing to rebuild, this loop stops.
                    self.fenced = true;
                    return;
                }
                // Memory must not run ahead of the store: rebuild it from what is durable.
                self.recover_until_done("cannot rebuild state from the store; retrying")
                    .await;
                return;
            }
        }
        let since = self.last_full_publish.elapsed();
        let full = batch.full_publish
            || since >= Duration::from_secs(1)
            || (self.queue_dirty && since >= self.queue_publish_every());
        // A full publication that takes long (a large fleet: it walks every live workload) is
        // not waited for by the callers of this batch nor by its backend work: they get the
        // cheap one (capacity and records as of this batch), and the full one follows at once.
        let full_after = full && !batch.replies.is_empty() && self.last_full_build >= FULL_BUILD_AFTER_REPLIES;
        if !changes.is_empty() || (full && !full_after) {
            self.publish_snapshot(now, full && !full_after);
        }
        // Records after the snapshot: whoever reads a record (a workload that ended) then reads
        // the snapshot sees capacity at least as new as that record.
        self.w.published.put_workloads(records.values().cloned());
        for r in batch.replies {
            match r {
                ReplyTo::Created(tx, id, created) => {
                    let w = record(&*self.w.store, &self.w.published, id, &records).await;
                    // Not decided yet (submitted while capacity was changing): answer after the
                    // next cycle.
                    if matches!(&w, Ok(w) if w.phase == tessera_domain::Phase::Pending) && self.w.sched.needs_cycle() {
                        self.deferred.push(ReplyTo::Created(tx, id, created));
                        continue;
                    }
                    let _ = tx.send(w.map(|w| (w, created)));
                }
                ReplyTo::Workload(tx, id) => {
                    let w = record(&*self.w.store, &self.w.published, id, &records).await;
                    let _ = tx.send(w);
                }
                ReplyTo::Done(tx) => {
                    let _ = tx.send(Ok(()));
                }
                ReplyTo::Mig(tx, outcome) => {
                    let _ = tx.send(Ok(outcome));
                }
            }
        }
        for (id, op) in batch.ops {
            self.runner.submit(id, op);
        }
        if full_after {
            self.publish_snapshot(now, true);
        }
    }

    /// Builds and publishes the snapshot; `full`: with the queue and phase counts.
    fn publish_snapshot(&mut self, now: i64, full: bool) {
        let t0 = Instant::now();
        let snap = self
            .builder
            .build(&self.w.fleet, &self.w.sched, &self.w.live, &self.w.tenants, now, full);
        if full {
            self.last_full_publish = Instant::now();
            self.last_full_build = t0.elapsed();
            self.queue_dirty = false;
        }
        self.w.published.set_snapshot(snap);
    }
}

/// A workload's committed record: from this batch, the published cache, or the store.
async fn record(
    store: &dyn Store,
    published: &Published,
    id: WorkloadId,
    records: &HashMap<WorkloadId, Arc<Workload>>,
) -> Result<Arc<Workload>, LifecycleError> {
    if let Some(w) = records.get(&id) {
        return Ok(w.clone());
    }
    if let Some(w) = published.workload(id) {
        return Ok(w);
    }
    match store.get_workload(id, None).await {
        Ok(Some(w)) => Ok(Arc::new(w)),
        Ok(None) => Err(LifecycleError::NotFound { id }),
        Err(e) => Err(LifecycleError::Unavailable(format!("the store is unavailable: {e}"))),
    }
}
