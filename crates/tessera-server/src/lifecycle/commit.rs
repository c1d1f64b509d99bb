//! The publication controller and group commit. A [`Batch`] collects what the handling of many
//! commands decided — workload records with their new events (several changes of one workload
//! in one batch become one write), usage intervals, answers and backend work — and
//! [`Publication::commit`] stores it in one transaction. Only after that are callers answered, records and the snapshot published, and
//! backend work started; if the store refuses the batch, every caller is told nothing changed
//! and the loop rebuilds memory from the store. The controller owns the snapshot builder and
//! when the queue and phase counts were last published (and how long that took).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

// Tokio's clock (the system's, unless a test pauses it): publication follows the loop's time.
use tokio::time::Instant;

use tessera_domain::{Workload, WorkloadId};
use tessera_model::Fleet;
use tessera_store::{Change, Fence, Store, StoreError};

use super::batch::{Batch, ReplyTo};
use super::command::LifecycleError;
use super::effects::Runner;
use super::snapshot::Published;
use super::snapshot::{SnapshotBuilder, Trial};
use super::world::World;

/// A full publication that took at least this long last time is made after the batch's
/// answers and backend work instead of before them (see [`Publication::commit`]): on a small fleet it
/// costs microseconds and keeps its place, so an answer comes with counts that include it.
const FULL_BUILD_AFTER_REPLIES: Duration = Duration::from_micros(500);

/// Shortest interval between two publications of the queue and phase counts while they
/// change (they are published every second regardless). 100 ms rather than 50: under 200
/// closed-loop clients a full publication walks some 20,000 live workloads (a cache miss each)
/// and took about 5 % of the server's CPU at 50 ms; at 100 ms creations/s rose from
/// 7,073 / 7,299 / 7,633 to 7,951 / 7,712 / 8,160 (`scripts/bench-api.sh`, alternated).
const QUEUE_PUBLISH_EVERY: Duration = Duration::from_millis(100);
/// A full publication walks every live workload (100,000 and more on a large fleet): while
/// the queue changes, the next one waits at least this many times as long as the last one
/// took, so that publishing takes at most about a tenth of the loop's time.
const QUEUE_PUBLISH_COST: u32 = 10;

/// The publication controller: commits each batch and publishes what readers see.
pub(super) struct Publication {
    /// Where batches are committed.
    store: Arc<dyn Store>,
    /// What readers see.
    published: Arc<Published>,
    builder: SnapshotBuilder,
    /// When queue and phase counts were last published.
    last_full_publish: Instant,
    /// How long building that full snapshot took.
    last_full_build: Duration,
    /// The queue or the phases changed since they were last published.
    queue_dirty: bool,
}

impl Publication {
    pub(super) fn new(fleet: &Fleet, store: Arc<dyn Store>, published: Arc<Published>) -> Publication {
        Publication {
            store,
            published,
            builder: SnapshotBuilder::new(fleet),
            last_full_publish: Instant::now(),
            last_full_build: Duration::ZERO,
            queue_dirty: false,
        }
    }

    /// The queue or the phases changed since they were last published.
    pub(super) fn queue_dirty(&self) -> bool {
        self.queue_dirty
    }

    /// How long until the next full publication is due while the queue changes.
    pub(super) fn wait(&self) -> Duration {
        self.queue_publish_every()
            .saturating_sub(self.last_full_publish.elapsed())
    }

    /// A rebuild from the store: the builder forgets what it cached; `fleet`: on a new fleet.
    pub(super) fn reset(&mut self, fleet: Option<&Fleet>) {
        match fleet {
            Some(f) => self.builder = SnapshotBuilder::new(f),
            None => self.builder.reset(),
        }
    }

    /// The queue or the phases changed outside a batch (a new fleet was adopted).
    pub(super) fn mark_dirty(&mut self) {
        self.queue_dirty = true;
    }

    /// The resource class a request waits for: its pool when only one pool can serve it.
    /// The shortest interval between two full publications while the queue changes:
    /// [`QUEUE_PUBLISH_EVERY`], or longer where building one takes long.
    pub(super) fn queue_publish_every(&self) -> Duration {
        QUEUE_PUBLISH_EVERY.max(self.last_full_build * QUEUE_PUBLISH_COST)
    }

    /// Stores the batch in one transaction, then publishes, answers and starts backend work.
    pub(super) async fn commit(
        &mut self,
        w: &mut World,
        runner: &mut Runner,
        fence: Option<&Fence>,
        deferred: &mut Vec<ReplyTo>,
        mut batch: Batch,
        now: i64,
    ) -> Result<(), StoreError> {
        self.queue_dirty |= batch.queue_changed;
        let (mut changes, records) = batch.take_changes();
        let wrote = !changes.is_empty();
        if wrote {
            if let Some(f) = fence {
                changes.insert(0, Change::Fence(f.clone()));
            }
            let t0 = Instant::now();
            let store = self.store.clone();
            let n = changes.len();
            let stored = writer()
                .spawn(async move { store.commit(&changes).await })
                .await
                .unwrap_or_else(|e| Err(StoreError::Unavailable(format!("the commit task ended: {e}"))));
            w.metrics.store_commit(t0.elapsed(), stored.is_ok());
            if let Err(e) = stored {
                tracing::error!(error = %e, changes = n, "commit failed; rebuilding state from the store");
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
                return Err(e);
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
        if wrote || (full && !full_after) {
            self.publish_snapshot(w, now, full && !full_after);
        }
        // Records after the snapshot: whoever reads a record (a workload that ended) then reads
        // the snapshot sees capacity at least as new as that record.
        self.published.put_workloads(records.values().cloned());
        for r in batch.replies {
            match r {
                ReplyTo::Created(tx, id, created) => {
                    let rec = record(&*self.store, &self.published, id, &records).await;
                    // Not decided yet (submitted while capacity was changing): answer after the
                    // next cycle.
                    if matches!(&rec, Ok(r) if r.phase == tessera_domain::Phase::Pending) && w.sched.needs_cycle() {
                        deferred.push(ReplyTo::Created(tx, id, created));
                        continue;
                    }
                    let _ = tx.send(rec.map(|r| (r, created)));
                }
                ReplyTo::Workload(tx, id) => {
                    let rec = record(&*self.store, &self.published, id, &records).await;
                    let _ = tx.send(rec);
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
            runner.submit(id, op);
        }
        if full_after {
            self.publish_snapshot(w, now, true);
        }
        Ok(())
    }

    /// Publishes the full snapshot of a state rebuilt from the store.
    pub(super) fn publish_rebuilt(&mut self, w: &World, now: i64) {
        let snap = self.builder.build(&w.fleet, &w.sched, &w.live, &w.tenants, now, true);
        self.published.set_snapshot(snap);
    }

    /// The placement engine and holds as they are now, for a dry run that found the published
    /// snapshot's copy older than that snapshot (see [`Snapshot::trial_current`](super::snapshot::Snapshot::trial_current)).
    pub(super) fn current_trial(&mut self, w: &World) -> Arc<Trial> {
        self.builder.current_trial(&w.sched, &w.tenants)
    }

    /// Builds and publishes the snapshot; `full`: with the queue and phase counts.
    pub(super) fn publish_snapshot(&mut self, w: &World, now: i64, full: bool) {
        let t0 = Instant::now();
        let snap = self.builder.build(&w.fleet, &w.sched, &w.live, &w.tenants, now, full);
        if full {
            self.last_full_publish = Instant::now();
            self.last_full_build = t0.elapsed();
            self.queue_dirty = false;
        }
        self.published.set_snapshot(snap);
    }
}

/// The runtime that drives the loop's commits: a current-thread runtime on a thread of its
/// own, so that a commit's round trips to the database wake a task that runs at once instead
/// of one queued behind the HTTP connections' tasks, and so that a store that writes on the
/// caller's thread (SQLite's batch connection) holds no thread anything else waits for.
fn writer() -> &'static tokio::runtime::Handle {
    static WRITER: std::sync::LazyLock<tokio::runtime::Handle> = std::sync::LazyLock::new(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("starting the commit runtime");
        let handle = runtime.handle().clone();
        std::thread::Builder::new()
            .name("tessera-commit".into())
            .spawn(move || runtime.block_on(std::future::pending::<()>()))
            .expect("starting the commit thread");
        handle
    });
    &WRITER
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
