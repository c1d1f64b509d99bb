//! What the statement code shared by the SQL stores (`crates/tessera-store/sql-common`, compiled
//! into each of them) needs from SQLite: the sqlx names it is written against, the few
//! statements whose text differs between the databases, and the decoding and reads that differ.

use sqlx::Row;
use tessera_domain::Workload;
use tessera_store::Result;
use tessera_store::sql::{COLUMN_NAMES, Cells, mistyped, workload_row};

use crate::db;
use crate::workloads::ACTIVE;

pub(crate) type Db = sqlx::Sqlite;
pub(crate) type DbRow = sqlx::sqlite::SqliteRow;
pub(crate) type DbConnection = sqlx::SqliteConnection;
pub(crate) use crate::SqliteStore as Store;

/// SQLite has no row locks: the write transaction (`BEGIN IMMEDIATE`) already holds the
/// database's write lock, so a plain read of the tenant row is enough.
pub(crate) const LOCK_TENANT: &str = "SELECT name FROM tenants WHERE name = $1";

/// A file of one process: one replica alone.
pub(crate) const SHARED: bool = false;

/// SQLite serves one process: no other replica to tell of a revocation.
pub(crate) const NOTIFY_REVOCATION: Option<&str> = None;

/// The token being revoked and every lasting platform-admin token. SQLite has no row locks:
/// the write transaction (`BEGIN IMMEDIATE`) already holds the database's write lock, so a
/// revocation racing another waits for it and then sees what it left.
pub(crate) const LOCK_REVOCATION: &str = "SELECT id, role, revoked_at FROM api_tokens WHERE id = $1 \
     OR (role = $2 AND revoked_at IS NULL AND expires_at IS NULL) ORDER BY id";

/// Closed use per tenant within `[$1, $2)` ([`tessera_store::LedgerStore::closed_usage`]):
/// the intervals that ended after `$1` (open ones have no end) and began before `$2`.
/// `INDEXED BY`, because SQLite's planner would rather walk the `(tenant, started_at)` index
/// for the grouping, which reads the whole ledger.
pub(crate) const CLOSED_USAGE: &str = "SELECT tenant, SUM(units_milli * (MIN(ended_at, $2) - MAX(started_at, $1))) AS used \
     FROM usage_intervals INDEXED BY usage_ended WHERE ended_at > $1 AND started_at < $2 \
     GROUP BY tenant ORDER BY tenant";

/// Milliseconds since the Unix epoch by SQLite's clock (`julianday('now')`, millisecond
/// precision, one reading per statement).
macro_rules! now_ms {
    () => {
        "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"
    };
}
pub(crate) use now_ms;

/// What ends a fence's read of the lease row: nothing on SQLite, whose write transaction
/// (`BEGIN IMMEDIATE`) already holds the database's write lock.
macro_rules! lock_fence {
    () => {
        ""
    };
}
pub(crate) use lock_fence;

/// A sqlx row of a workload `SELECT`, read by position. Booleans are integers 0 and 1 in
/// SQLite.
pub(crate) struct RowCells<'r>(pub(crate) &'r DbRow);

impl Cells for RowCells<'_> {
    fn int(&self, i: usize) -> Result<Option<i64>> {
        self.0.try_get(i).map_err(|e| mistyped(i, e))
    }
    fn text(&self, i: usize) -> Result<Option<&str>> {
        self.0.try_get(i).map_err(|e| mistyped(i, e))
    }
    fn flag(&self, i: usize) -> Result<bool> {
        self.int_of(i).map(|v| v != 0)
    }
}

impl Cells for crate::raw::Statement<'_> {
    fn int(&self, i: usize) -> Result<Option<i64>> {
        crate::raw::Statement::int(self, i)
    }
    fn text(&self, i: usize) -> Result<Option<&str>> {
        crate::raw::Statement::text(self, i)
    }
    fn flag(&self, i: usize) -> Result<bool> {
        self.int_of(i).map(|v| v != 0)
    }
}

/// Every active workload ([`tessera_store::WorkloadStore::active_workloads`]) at once
/// (recovery: 100,000 rows and more), decoded straight from SQLite's buffers rather than
/// through a copy of each row (see `crate::raw`).
pub(crate) async fn active_workloads(store: &Store) -> Result<Vec<Workload>> {
    let mut conn = store.conn().await?;
    let mut handle = conn.lock_handle().await.map_err(db)?;
    let mut read = || {
        let mut statement = crate::raw::Statement::prepare(&mut handle, ACTIVE, &COLUMN_NAMES)?;
        let mut out = Vec::new();
        while statement.step()? {
            out.push(workload_row(&statement)?);
        }
        Ok(out)
    };
    // The read takes the thread for a while: let the runtime move its other tasks away.
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(read),
        _ => read(),
    }
}

/// No revocation news: one process serves a SQLite store.
pub(crate) async fn revocations(_: &Store) -> Option<tokio::sync::mpsc::UnboundedReceiver<String>> {
    None
}
