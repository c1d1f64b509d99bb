//! PostgreSQL as the driver of the SQL code shared by both stores (`tessera-store-sql`): its
//! connections and write transactions, how a statement runs on them through sqlx, how a row is
//! read, the few statements whose text differs from SQLite's, and revocation news through
//! `LISTEN`.

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgArguments, PgConnection, PgRow};
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use sqlx::{AssertSqlSafe, Postgres, Row as _, SqlSafeStr, Transaction};
use tessera_domain::Workload;
use tessera_store::{Fence, Result, StoreError};
use tessera_store_sql::columns::{Cells, mistyped, null, workload_row};
use tessera_store_sql::workloads::ACTIVE;
use tessera_store_sql::{DbError, DbResult, Driver, Group, LeaseSql, MultiRow, OneStatement, Query, Value, db};

use crate::{PgStore, classify, rows};

/// A row a statement returned.
pub struct Row(PgRow);

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
        self.0
            .try_get::<Option<bool>, _>(i)
            .map_err(|e| mistyped(i, e))?
            .ok_or_else(|| null(i))
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

/// The texts of one-statement batches made so far, by shape (see
/// [`PgStore::execute_one_statement`]): a few dozen at most.
static ONE_STATEMENT_TEXTS: LazyLock<Mutex<HashMap<Vec<usize>, Arc<str>>>> = LazyLock::new(Default::default);

/// `Corrupt` naming the answer's column `name`, as a driver error.
fn db_store(name: &str, e: sqlx::Error) -> DbError {
    DbError::Store(mistyped_column(name, e))
}

/// The sqlx statement `sql` with `args` bound in order.
fn sqlx_query<'a>(sql: impl SqlSafeStr, args: Vec<Value<'_>>) -> sqlx::query::Query<'a, Postgres, PgArguments> {
    let mut q = sqlx::query(sql);
    for v in args {
        q = match v {
            Value::Int(v) => q.bind(v),
            Value::Text(v) => q.bind(v),
            Value::Flag(v) => q.bind(v),
            Value::Float(v) => q.bind(v),
        };
    }
    q
}

impl Driver for PgStore {
    type Connection = PgConnection;
    type Pooled = PoolConnection<Postgres>;
    type Transaction = Transaction<'static, Postgres>;
    type Row = Row;

    /// A database server: replicas share it and elect a leader.
    const SHARED: bool = true;

    /// Reads the tenant row and locks it until the transaction ends.
    const LOCK_TENANT: &'static str = "SELECT name FROM tenants WHERE name = $1 FOR UPDATE";

    /// The token being revoked and every lasting platform-admin token, locked until the
    /// transaction ends, in id order so that two revocations never wait for each other in a
    /// cycle.
    const LOCK_REVOCATION: &'static str = "SELECT id, role, revoked_at FROM api_tokens WHERE id = $1 \
         OR (role = $2 AND revoked_at IS NULL AND expires_at IS NULL) ORDER BY id FOR UPDATE";

    /// Tells every replica listening on `tessera_revocations` (at commit) that token `$1` was
    /// revoked: their identity caches forget it at once.
    const NOTIFY_REVOCATION: Option<&'static str> = Some("SELECT pg_notify('tessera_revocations', $1)");

    /// The intervals that ended after `$1` (the `usage_ended` index; open ones have no end) and
    /// began before `$2`.
    const CLOSED_USAGE: &'static str = "SELECT tenant, SUM(units_milli * (LEAST(ended_at, $2) - GREATEST(started_at, $1)))::BIGINT AS used \
         FROM usage_intervals WHERE ended_at > $1 AND started_at < $2 GROUP BY tenant ORDER BY tenant";

    /// Now is the server's clock (`clock_timestamp()`, which moves within a transaction, unlike
    /// `now()`); a fence's read takes a shared row lock that lasts until the batch's
    /// transaction ends, so that no replica acquires the lease (an `UPDATE`) meanwhile.
    const LEASE: LeaseSql = tessera_store_sql::lease_sql!(
        now_ms = "FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT",
        lock_fence = " FOR SHARE",
    );

    /// All rows of a kind in one statement (`crate::rows`): round trips, not rows, are what a
    /// commit to a database in another process pays for.
    const ROWS_PER_STATEMENT: &'static [usize] = &[];

    async fn conn(&self) -> Result<PoolConnection<Postgres>> {
        self.acquire().await
    }

    async fn begin_write(&self) -> Result<Transaction<'static, Postgres>> {
        self.begin().await
    }

    async fn commit(tx: Transaction<'static, Postgres>) -> Result<()> {
        tx.commit().await.map_err(|e| db(classify(e)))
    }

    async fn rollback(tx: Transaction<'static, Postgres>) -> Result<()> {
        tx.rollback().await.map_err(|e| db(classify(e)))
    }

    async fn execute(conn: &mut PgConnection, q: Query<'_, Self>) -> DbResult<u64> {
        let sql = q.sql();
        let done = sqlx_query(sql, q.into_args()).execute(conn).await.map_err(classify)?;
        Ok(done.rows_affected())
    }

    async fn fetch_all(conn: &mut PgConnection, q: Query<'_, Self>) -> DbResult<Vec<Row>> {
        let sql = q.sql();
        let rows = sqlx_query(sql, q.into_args()).fetch_all(conn).await.map_err(classify)?;
        Ok(rows.into_iter().map(Row).collect())
    }

    async fn fetch_optional(conn: &mut PgConnection, q: Query<'_, Self>) -> DbResult<Option<Row>> {
        let sql = q.sql();
        let row = sqlx_query(sql, q.into_args())
            .fetch_optional(conn)
            .await
            .map_err(classify)?;
        Ok(row.map(Row))
    }

    async fn execute_rows(
        conn: &mut PgConnection,
        statement: &'static MultiRow,
        rows: usize,
        values: Vec<Value<'_>>,
    ) -> DbResult<u64> {
        let q = rows::query(statement, rows, &values);
        Ok(q.execute(conn).await.map_err(classify)?.rows_affected())
    }

    /// A lifecycle batch is one statement of data-modifying common table expressions
    /// (`crate::rows::one_statement_text`): with `BEGIN` and `COMMIT`, three round trips
    /// whatever kinds of rows it holds.
    const ONE_STATEMENT: bool = true;

    async fn execute_one_statement(
        conn: &mut PgConnection,
        fence: Option<&Fence>,
        groups: Vec<Group<'_>>,
        audit: Option<Group<'_>>,
    ) -> DbResult<OneStatement> {
        // The text depends on which parts the batch has (the types of each part's columns
        // are fixed by its statement): made once per shape.
        let mut shape = vec![usize::from(fence.is_some()), usize::from(audit.is_some())];
        for g in &groups {
            shape.extend([std::ptr::from_ref(g.statement) as usize, usize::from(g.counted)]);
        }
        let text = {
            let mut texts = ONE_STATEMENT_TEXTS.lock().unwrap_or_else(|e| e.into_inner());
            texts
                .entry(shape)
                .or_insert_with(|| {
                    rows::one_statement_text(fence.map(|_| Self::LEASE.check_fence), &groups, audit.as_ref()).into()
                })
                .clone()
        };
        let mut q = sqlx::query(AssertSqlSafe(text));
        if let Some(f) = fence {
            q = q.bind(f.holder.as_str()).bind(tessera_store_sql::i64_of(f.epoch));
        }
        for g in &groups {
            q = rows::bind_columns(q, g.statement.columns(), &g.values);
        }
        if let Some(a) = &audit {
            q = rows::bind_columns(q.bind(a.rows as i64), a.statement.columns(), &a.values);
        }
        let row = q.fetch_one(conn).await.map_err(classify)?;
        let int = |name: &str| -> DbResult<i64> { row.try_get::<i64, _>(name).map_err(|e| db_store(name, e)) };
        let counted = groups.iter().filter(|g| g.counted).count();
        Ok(OneStatement {
            held: int("held")? > 0,
            counts: (0..counted)
                .map(|i| int(&format!("n{i}")).map(tessera_store_sql::u64_of))
                .collect::<DbResult<_>>()?,
        })
    }

    async fn read_active(&self) -> Result<Vec<Workload>> {
        let rows = sqlx::query(ACTIVE)
            .fetch_all(&mut *self.acquire().await?)
            .await
            .map_err(|e| db(classify(e)))?;
        rows.into_iter().map(|r| workload_row(&Row(r))).collect()
    }

    /// Revocation news from every replica: `LISTEN tessera_revocations`
    /// ([`Driver::NOTIFY_REVOCATION`]).
    async fn revocation_news(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<String>> {
        self.listen_revocations().await
    }
}
