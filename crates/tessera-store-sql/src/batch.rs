//! The lifecycle batch ([`WorkloadStore::commit`](tessera_store::WorkloadStore::commit)) in
//! few statements.
//!
//! A batch of the lifecycle loop holds, per workload, an insert or an update with a few events,
//! sometimes a usage interval opened or closed and an audit record; what a commit costs is set
//! by how many statements it runs, not by how much data it writes. So the batch is grouped by
//! kind of row — new workloads, idempotency keys, workload updates, events, intervals opened,
//! intervals closed, audit records — and each group is written with multi-row statements
//! ([`crate::rows`]), in one transaction.
//!
//! Grouping reorders the changes, which is only sound where order cannot matter. Within one
//! group it does not (rows of a group are independent; several updates of one workload
//! coalesce into the last, which is what applying them in turn leaves). Across groups, inserts
//! go before updates and opens before closes, so an update may follow the insert of its
//! workload and a close the open of its interval. The reverse orders — an update before the
//! insert of its workload, a close before the open of its interval — cannot succeed in order
//! (either the first change finds nothing, or the second finds its key taken), and grouped
//! they could; such batches are applied one change at a time instead.
//!
//! A multi-row statement cannot say which of its rows failed, and when several changes of a
//! batch are wrong the contract reports the first. So a grouped batch that fails because of
//! its contents (`Conflict`, `Corrupt`) is rolled back and applied again one change at a time,
//! in order: that run fails at the first wrong change, with its name, exactly as a batch always
//! did. (Should another process have changed the database in between so that the batch now
//! fits, that run commits it, which is as correct.) `Unavailable` is returned as it is.
//!
//! A batch's fences ([`Change::Fence`]) are checked first in either run, inside the
//! transaction, so the lease cannot change hands before the batch commits: on PostgreSQL the
//! check locks the lease row (`FOR SHARE`) until the transaction ends; on SQLite the write
//! transaction (`BEGIN IMMEDIATE`) holds the database's write lock.
//!
//! A failed statement aborts a PostgreSQL transaction; the one-change-at-a-time run starts a
//! new one after the rollback, on either database.
//!
//! A store that writes batches by its own means ([`Driver::commits_batches`]: SQLite on a
//! file, on a connection whose statements stay prepared) is handed the grouped run's rows
//! ([`Driver::commit_groups`]) and runs the whole transaction itself; a batch with fences or
//! MIG records, or one it rolls back because of its contents, takes the path above.
//!
//! On PostgreSQL ([`Driver::ONE_STATEMENT`]) the grouped run is one statement: the fence's
//! check and every group are parts of it (data-modifying common table expressions, see
//! `tessera-store-postgres`'s `rows.rs`), so a batch costs three round trips (`BEGIN`, the
//! statement, `COMMIT`) instead of one per kind of row. Its parts all see the database as it
//! was before the statement, so a batch that updates a workload it inserts, or closes an
//! interval it opens, is written group by group as before (the lifecycle loop never sends one:
//! it merges the changes of one workload in a batch); so is one with several fences.

use std::collections::{HashMap, HashSet};

use tessera_domain::{Event, Workload, WorkloadId};
use tessera_store::{AuditRecord, Change, Fence, IdempotencyKey, Result, StoreError, UsageInterval};

use crate::ledger::{self, Close};
use crate::rows::{self, Group};
use crate::{DbError, Driver, audit, db_error, lease, workloads};

/// Commits `batch` in one transaction.
pub async fn commit<D: Driver>(store: &D, batch: &[Change]) -> Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    let fences: Vec<&Fence> = batch
        .iter()
        .filter_map(|c| match c {
            Change::Fence(f) => Some(f),
            _ => None,
        })
        .collect();
    if let Some(plan) = Plan::grouped(batch) {
        if store.commits_batches() && fences.is_empty() && plan.mig.is_empty() {
            let (groups, audit) = plan.groups()?;
            match store.commit_groups(groups, audit).await {
                Ok(None) => return Ok(()),
                // A counted group changed fewer rows than it has, or a row exists already:
                // rolled back; the run below names the change.
                Ok(Some(_)) | Err(DbError::UniqueViolation | DbError::Store(StoreError::Corrupt(_))) => {}
                Err(DbError::Store(e)) => return Err(e),
            }
            return commit_one_by_one::<D>(store, batch, &fences).await;
        }
        let mut tx = store.begin_write().await?;
        let written = match fences.as_slice() {
            [] | [_] if D::ONE_STATEMENT && plan.fits_one_statement() => {
                plan.write_one_statement::<D>(&mut tx, fences.first().copied()).await
            }
            _ => {
                lease::check_fences::<D>(&mut tx, &fences).await?;
                plan.write::<D>(&mut tx).await
            }
        };
        match written {
            Ok(()) => return D::commit(tx).await,
            Err(e @ (StoreError::Unavailable(_) | StoreError::Fenced(_) | StoreError::Incompatible(_))) => {
                return Err(e);
            }
            Err(StoreError::Conflict(_) | StoreError::Corrupt(_)) => D::rollback(tx).await?,
        }
    }
    commit_one_by_one::<D>(store, batch, &fences).await
}

/// Commits `batch` one change at a time, in order, after checking `fences`: it fails at the
/// first wrong change, with its name.
async fn commit_one_by_one<D: Driver>(store: &D, batch: &[Change], fences: &[&Fence]) -> Result<()> {
    let mut tx = store.begin_write().await?;
    lease::check_fences::<D>(&mut tx, fences).await?;
    for change in batch {
        Plan::new(std::slice::from_ref(change)).write::<D>(&mut tx).await?;
    }
    D::commit(tx).await
}

/// The rows a batch writes, grouped by kind, each group in batch order.
#[derive(Debug, Default)]
struct Plan<'b> {
    /// New workloads and their `updated_at`.
    inserts: Vec<(&'b Workload, i64)>,
    keys: Vec<(&'b IdempotencyKey, WorkloadId, i64)>,
    /// Updated workloads and their `updated_at`, one per workload: its last update.
    updates: Vec<(&'b Workload, i64)>,
    events: Vec<(WorkloadId, &'b Event)>,
    opens: Vec<&'b UsageInterval>,
    closes: Vec<Close>,
    audit: Vec<&'b AuditRecord>,
    mig: Vec<&'b tessera_store::GpuMigRecord>,
}

impl<'b> Plan<'b> {
    /// The plan of `batch`, or `None` when grouping would change what it does: an update before
    /// the insert of its workload, or a close before the open of its interval.
    fn grouped(batch: &'b [Change]) -> Option<Plan<'b>> {
        let mut updated = HashSet::new();
        let mut closed = HashSet::new();
        for change in batch {
            match change {
                Change::Insert { workload, .. } if updated.contains(&workload.id) => return None,
                Change::Update { workload, .. } => {
                    updated.insert(workload.id);
                }
                Change::OpenUsage(u) if closed.contains(&(u.workload, u.seq)) => return None,
                Change::CloseUsage { workload, seq, .. } => {
                    closed.insert((*workload, *seq));
                }
                _ => {}
            }
        }
        Some(Plan::new(batch))
    }

    /// The plan of `batch`, whatever its order.
    fn new(batch: &'b [Change]) -> Plan<'b> {
        let mut plan = Plan::default();
        // Where each workload's update is in `plan.updates`, so that a later one replaces it.
        let mut update_of: HashMap<WorkloadId, usize> = HashMap::new();
        for change in batch {
            match change {
                Change::Insert {
                    workload,
                    events,
                    idempotency,
                } => {
                    plan.inserts
                        .push((&**workload, crate::columns::updated_at(workload, events)));
                    if let Some(k) = idempotency {
                        plan.keys.push((k, workload.id, workload.created_at));
                    }
                    plan.events.extend(events.iter().map(|e| (workload.id, e)));
                }
                Change::Update { workload, events } => {
                    let row = (&**workload, crate::columns::updated_at(workload, events));
                    match update_of.get(&workload.id) {
                        Some(&i) => plan.updates[i] = row,
                        None => {
                            update_of.insert(workload.id, plan.updates.len());
                            plan.updates.push(row);
                        }
                    }
                    plan.events.extend(events.iter().map(|e| (workload.id, e)));
                }
                Change::OpenUsage(u) => plan.opens.push(u),
                Change::CloseUsage {
                    workload,
                    seq,
                    ended_at,
                    util_avg,
                } => plan.closes.push(Close {
                    workload: *workload,
                    seq: *seq,
                    ended_at: *ended_at,
                    util_avg: *util_avg,
                }),
                Change::Audit(a) => plan.audit.push(a),
                Change::GpuMig(r) => plan.mig.push(r),
                // Checked before the plan is written (see `commit`).
                Change::Fence(_) => {}
            }
        }
        plan
    }

    /// Whether the plan means the same in one statement, whose parts all see the database as it
    /// was before it: no update of a workload it inserts, no close of an interval it opens.
    fn fits_one_statement(&self) -> bool {
        let inserted: HashSet<WorkloadId> = self.inserts.iter().map(|(w, _)| w.id).collect();
        let opened: HashSet<(WorkloadId, u32)> = self.opens.iter().map(|u| (u.workload, u.seq)).collect();
        !self.updates.iter().any(|(w, _)| inserted.contains(&w.id))
            && !self.closes.iter().any(|c| opened.contains(&(c.workload, c.seq)))
    }

    /// Writes the plan inside the caller's transaction in one statement with the check of
    /// `fence` ([`Driver::execute_one_statement`]), then its MIG records, if any. The statement
    /// cannot say which row failed: `Conflict` and `Corrupt` say only that one did (the caller
    /// then applies the batch one change at a time, which names it).
    async fn write_one_statement<D: Driver>(&self, conn: &mut D::Connection, fence: Option<&Fence>) -> Result<()> {
        let (groups, audit) = self.groups()?;
        let done = D::execute_one_statement(conn, fence, groups, audit)
            .await
            .map_err(|e| db_error(e, || "a row of the batch exists already".into()))?;
        if let Some(f) = fence
            && !done.held
        {
            return Err(StoreError::Fenced(format!(
                "`{}` no longer holds the leader lease with epoch {}",
                f.holder, f.epoch
            )));
        }
        // The counted groups in order: the updates, then the closes (each where it has rows).
        let mut counts = done.counts.into_iter();
        if !self.updates.is_empty() && counts.next() != Some(self.updates.len() as u64) {
            return Err(StoreError::Corrupt(
                "a workload updated by the batch is not stored".into(),
            ));
        }
        if !self.closes.is_empty() && counts.next() != Some(self.closes.len() as u64) {
            return Err(StoreError::Corrupt(
                "a usage interval closed by the batch is not open".into(),
            ));
        }
        for r in &self.mig {
            crate::fleet::write_gpu_mig::<D>(conn, r).await?;
        }
        Ok(())
    }

    /// The plan's rows as the groups of multi-row statements, in the order [`Plan::write`]
    /// writes them (empty ones left out), and its audit records without their sequence numbers.
    fn groups(&self) -> Result<(Vec<Group<'_>>, Option<Group<'_>>)> {
        let groups = [
            rows::group(&workloads::INSERT, &self.inserts, workloads::insert_row, false)?,
            rows::group(&workloads::INSERT_KEYS, &self.keys, workloads::key_row, false)?,
            rows::group(&workloads::UPDATE, &self.updates, workloads::update_row, true)?,
            rows::group(&workloads::INSERT_EVENTS, &self.events, workloads::event_values, false)?,
            rows::group(&ledger::OPEN, &self.opens, ledger::open_row, false)?,
            rows::group(&ledger::CLOSE, &self.closes, ledger::close_row, true)?,
        ]
        .into_iter()
        .flatten()
        .collect();
        let audit = rows::group(&audit::UNNUMBERED, &self.audit, audit::record_values, false)?;
        Ok((groups, audit))
    }

    /// Writes the plan inside the caller's transaction (an empty group runs no statement).
    async fn write<D: Driver>(&self, conn: &mut D::Connection) -> Result<()> {
        workloads::insert_workloads::<D>(conn, &self.inserts).await?;
        workloads::insert_idempotency_keys::<D>(conn, &self.keys).await?;
        workloads::update_workloads::<D>(conn, &self.updates).await?;
        workloads::insert_events::<D>(conn, &self.events).await?;
        ledger::open::<D>(conn, &self.opens).await?;
        ledger::close::<D>(conn, &self.closes).await?;
        audit::append::<D>(conn, &self.audit).await?;
        for r in &self.mig {
            crate::fleet::write_gpu_mig::<D>(conn, r).await?;
        }
        Ok(())
    }
}
