//! SQLite as the driver of the SQL code shared by both stores (`tessera-store-sql`): its
//! connections and write transactions, how a statement runs on them through sqlx, how a row is
//! read, the few statements whose text differs from PostgreSQL's, and the read of every active
//! workload straight from SQLite's buffers.

use std::borrow::Cow;

use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteArguments, SqliteConnection, SqliteRow};
use sqlx::{AssertSqlSafe, Row as _, SqlSafeStr, Sqlite, Transaction};
use tessera_domain::Workload;
use tessera_store::{Result, StoreError};
use tessera_store_sql::columns::{COLUMN_NAMES, Cells, mistyped, workload_row};
use tessera_store_sql::workloads::ACTIVE;
use tessera_store_sql::{DbResult, Driver, LeaseSql, MultiRow, Query, Value};

use crate::{SqliteStore, classify, db, rows};

/// A row a statement returned. Booleans are integers 0 and 1 in SQLite.
pub struct Row(SqliteRow);

/// `Corrupt` naming column `name`.
fn mistyped_column(name: &str, e: sqlx::Error) -> StoreError {
    StoreError::Corrupt(format!("column `{name}`: {e}"))
}

impl Cells for Row {
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

impl tessera_store_sql::Row for Row {
    fn get_int(&self, name: &str) -> Result<Option<i64>> {
        self.0.try_get(name).map_err(|e| mistyped_column(name, e))
    }
    fn get_text(&self, name: &str) -> Result<Option<&str>> {
        self.0.try_get(name).map_err(|e| mistyped_column(name, e))
    }
    fn get_float(&self, name: &str) -> Result<Option<f64>> {
        self.0.try_get(name).map_err(|e| mistyped_column(name, e))
    }
    fn get_flag(&self, name: &str) -> Result<Option<bool>> {
        self.0.try_get(name).map_err(|e| mistyped_column(name, e))
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

/// Runs `f`, which holds the calling thread for a while (SQLite called directly): on a
/// multi-threaded runtime the runtime first moves its other tasks away (`block_in_place`); a
/// current-thread runtime waits.
fn holding_the_thread<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// The sqlx statement `sql` with `args` bound in order.
fn sqlx_query<'a>(sql: impl SqlSafeStr, args: Vec<Value<'_>>) -> sqlx::query::Query<'a, Sqlite, SqliteArguments> {
    let mut q = sqlx::query(sql);
    for v in args {
        q = match v {
            Value::Int(v) => q.bind(v),
            Value::Text(v) => q.bind(v.map(Cow::into_owned)),
            Value::Flag(v) => q.bind(v),
            Value::Float(v) => q.bind(v),
        };
    }
    q
}

impl Driver for SqliteStore {
    type Connection = SqliteConnection;
    type Pooled = PoolConnection<Sqlite>;
    type Transaction = Transaction<'static, Sqlite>;
    type Row = Row;

    /// A file of one process: one replica alone.
    const SHARED: bool = false;

    /// SQLite has no row locks: the write transaction (`BEGIN IMMEDIATE`) already holds the
    /// database's write lock, so a plain read of the tenant row is enough.
    const LOCK_TENANT: &'static str = "SELECT name FROM tenants WHERE name = $1";

    /// The token being revoked and every lasting platform-admin token. SQLite has no row
    /// locks: the write transaction (`BEGIN IMMEDIATE`) already holds the database's write
    /// lock, so a revocation racing another waits for it and then sees what it left.
    const LOCK_REVOCATION: &'static str = "SELECT id, role, revoked_at FROM api_tokens WHERE id = $1 \
         OR (role = $2 AND revoked_at IS NULL AND expires_at IS NULL) ORDER BY id";

    /// SQLite serves one process: no other replica to tell of a revocation.
    const NOTIFY_REVOCATION: Option<&'static str> = None;

    /// The intervals that ended after `$1` (open ones have no end) and began before `$2`.
    /// `INDEXED BY`, because SQLite's planner would rather walk the `(tenant, started_at)`
    /// index for the grouping, which reads the whole ledger.
    const CLOSED_USAGE: &'static str = "SELECT tenant, SUM(units_milli * (MIN(ended_at, $2) - MAX(started_at, $1))) AS used \
         FROM usage_intervals INDEXED BY usage_ended WHERE ended_at > $1 AND started_at < $2 \
         GROUP BY tenant ORDER BY tenant";

    /// Now is SQLite's clock (`julianday('now')`, millisecond precision, one reading per
    /// statement); a fence's read needs no lock, as the write transaction (`BEGIN IMMEDIATE`)
    /// already holds the database's write lock.
    const LEASE: LeaseSql = tessera_store_sql::lease_sql!(
        now_ms = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
        lock_fence = "",
    );

    /// 64 rows per statement, and the rest in one, whose text is one of four fixed sizes (see
    /// `crate::rows`).
    const ROWS_PER_STATEMENT: &'static [usize] = &rows::PER_STATEMENT;

    async fn conn(&self) -> Result<PoolConnection<Sqlite>> {
        self.pool.acquire().await.map_err(db)
    }

    async fn begin_write(&self) -> Result<Transaction<'static, Sqlite>> {
        // SQLite-specific: `BEGIN IMMEDIATE` takes the write lock up front (waiting up to the
        // busy timeout), so a transaction that reads before it writes never fails half-way
        // because another connection wrote in between. PostgreSQL's plain `BEGIN` is the
        // equivalent there (row locks do the rest).
        // On a file, on the store's write connection (see `SqliteStore::open_dir`).
        self.writer.begin_with("BEGIN IMMEDIATE").await.map_err(db)
    }

    async fn commit(tx: Transaction<'static, Sqlite>) -> Result<()> {
        tx.commit().await.map_err(db)
    }

    async fn rollback(tx: Transaction<'static, Sqlite>) -> Result<()> {
        tx.rollback().await.map_err(db)
    }

    async fn execute(conn: &mut SqliteConnection, q: Query<'_, Self>) -> DbResult<u64> {
        let sql = q.sql();
        let done = sqlx_query(sql, q.into_args()).execute(conn).await.map_err(classify)?;
        Ok(done.rows_affected())
    }

    async fn fetch_all(conn: &mut SqliteConnection, q: Query<'_, Self>) -> DbResult<Vec<Row>> {
        let sql = q.sql();
        let rows = sqlx_query(sql, q.into_args()).fetch_all(conn).await.map_err(classify)?;
        Ok(rows.into_iter().map(Row).collect())
    }

    async fn fetch_optional(conn: &mut SqliteConnection, q: Query<'_, Self>) -> DbResult<Option<Row>> {
        let sql = q.sql();
        let row = sqlx_query(sql, q.into_args())
            .fetch_optional(conn)
            .await
            .map_err(classify)?;
        Ok(row.map(Row))
    }

    async fn execute_rows(
        conn: &mut SqliteConnection,
        statement: &'static MultiRow,
        rows: usize,
        values: Vec<Value<'_>>,
    ) -> DbResult<u64> {
        // The text of the next size up, its extra rows all NULL (see `rows::text`).
        let size = rows::padded(rows);
        let mut values = values;
        values.resize(size * statement.columns(), Value::Int(None));
        let text = rows::text(statement, size);
        let done = sqlx_query(AssertSqlSafe(text), values)
            .execute(conn)
            .await
            .map_err(classify)?;
        Ok(done.rows_affected())
    }

    /// A store on a file writes lifecycle batches on a connection of its own
    /// (`crate::raw::BatchConnection`), with statements it keeps prepared: no round trip to
    /// sqlx's worker thread per statement, no copy of each value into sqlx's arguments.
    fn commits_batches(&self) -> bool {
        self.batch.is_some()
    }

    /// The batch is written on the caller's thread, which it holds for the transaction (about
    /// a millisecond for a batch of a few hundred rows, plus the log's fsync, plus any wait
    /// for another process's write lock): on a multi-threaded runtime the runtime moves its
    /// other tasks away meanwhile (`block_in_place`); a current-thread runtime waits. The
    /// server commits on a current-thread runtime of its own, where nothing else waits. The
    /// store's write connection is held meanwhile, so that this process's writers still take
    /// turns instead of polling SQLite's write lock.
    async fn commit_groups(
        &self,
        groups: Vec<tessera_store_sql::rows::Group<'_>>,
        audit: Option<tessera_store_sql::rows::Group<'_>>,
    ) -> DbResult<Option<usize>> {
        let batch = self.batch.as_ref().expect("asked only where `commits_batches`");
        let _turn = self.writer.acquire().await.map_err(classify)?;
        let mut conn = batch.lock().await;
        holding_the_thread(|| conn.write_batch(&groups, audit.as_ref()))
    }

    /// Every active workload at once (recovery: 100,000 rows and more), decoded straight from
    /// SQLite's buffers rather than through a copy of each row (see `crate::raw`).
    async fn read_active(&self) -> Result<Vec<Workload>> {
        let mut conn = self.conn().await?;
        let mut handle = conn.lock_handle().await.map_err(db)?;
        let read = || {
            let mut statement = crate::raw::Statement::prepare(&mut handle, ACTIVE, &COLUMN_NAMES)?;
            let mut out = Vec::new();
            while statement.step()? {
                out.push(workload_row(&statement)?);
            }
            Ok(out)
        };
        holding_the_thread(read)
    }

    /// No revocation news: one process serves a SQLite store.
    async fn revocation_news(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<String>> {
        None
    }
}
