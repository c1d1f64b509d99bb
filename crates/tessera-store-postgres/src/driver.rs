//! What the statement code shared by the SQL stores (`crates/tessera-store/sql-common`, compiled
//! into each of them) needs from PostgreSQL: the sqlx names it is written against, the few
//! statements whose text differs between the databases, and the decoding and reads that differ.

use sqlx::Row;
use tessera_domain::Workload;
use tessera_store::Result;
use tessera_store::sql::{Cells, mistyped, null, workload_row};

use crate::db;
use crate::workloads::ACTIVE;

pub(crate) type Db = sqlx::Postgres;
pub(crate) type DbRow = sqlx::postgres::PgRow;
pub(crate) type DbConnection = sqlx::PgConnection;
pub(crate) use crate::PgStore as Store;

/// Reads the tenant row and locks it until the transaction ends.
pub(crate) const LOCK_TENANT: &str = "SELECT name FROM tenants WHERE name = $1 FOR UPDATE";

/// A database server: replicas share it and elect a leader.
pub(crate) const SHARED: bool = true;

/// Tells every replica listening on `tessera_revocations` (at commit) that token `$1` was
/// revoked: their identity caches forget it at once.
pub(crate) const NOTIFY_REVOCATION: Option<&str> = Some("SELECT pg_notify('tessera_revocations', $1)");

/// The token being revoked and every lasting platform-admin token, locked until the
/// transaction ends, in id order so that two revocations never wait for each other in a cycle.
pub(crate) const LOCK_REVOCATION: &str = "SELECT id, role, revoked_at FROM api_tokens WHERE id = $1 \
     OR (role = $2 AND revoked_at IS NULL AND expires_at IS NULL) ORDER BY id FOR UPDATE";

/// Closed use per tenant within `[$1, $2)` ([`tessera_store::LedgerStore::closed_usage`]):
/// the intervals that ended after `$1` (the `usage_ended` index; open ones have no end) and
/// began before `$2`.
pub(crate) const CLOSED_USAGE: &str = "SELECT tenant, SUM(units_milli * (LEAST(ended_at, $2) - GREATEST(started_at, $1)))::BIGINT AS used \
     FROM usage_intervals WHERE ended_at > $1 AND started_at < $2 GROUP BY tenant ORDER BY tenant";

/// Milliseconds since the Unix epoch by the server's clock (`clock_timestamp()`, which moves
/// within a transaction, unlike `now()`).
macro_rules! now_ms {
    () => {
        "FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT"
    };
}
pub(crate) use now_ms;

/// What ends a fence's read of the lease row: a shared row lock that lasts until the batch's
/// transaction ends, so that no replica acquires the lease (an `UPDATE`) meanwhile.
macro_rules! lock_fence {
    () => {
        " FOR SHARE"
    };
}
pub(crate) use lock_fence;

/// A sqlx row of a workload `SELECT`, read by position.
pub(crate) struct RowCells<'r>(pub(crate) &'r DbRow);

impl Cells for RowCells<'_> {
    fn int(&self, i: usize) -> Result<Option<i64>> {
        self.0.try_get(i).map_err(|e| mistyped(i, e))
    }
    fn text(&self, i: usize) -> Result<Option<&str>> {
        self.0.try_get(i).map_err(|e| mistyped(i, e))
    }
    fn flag(&self, i: usize) -> Result<bool> {
        self.0
            .try_get::<Option<bool>, _>(i)
            .map_err(|e| mistyped(i, e))?
            .ok_or_else(|| null(i))
    }
}

/// Every active workload ([`tessera_store::WorkloadStore::active_workloads`]).
pub(crate) async fn active_workloads(store: &Store) -> Result<Vec<Workload>> {
    let rows = sqlx::query(ACTIVE)
        .fetch_all(&mut *store.conn().await?)
        .await
        .map_err(db)?;
    rows.iter().map(|r| workload_row(&RowCells(r))).collect()
}

/// Revocation news from every replica: `LISTEN tessera_revocations` ([`NOTIFY_REVOCATION`]).
pub(crate) async fn revocations(s: &Store) -> Option<tokio::sync::mpsc::UnboundedReceiver<String>> {
    s.revocation_news().await
}
