//! # tessera-store-sqlite
//!
//! Tessera's embedded store: [`SqliteStore`] implements every trait of the `tessera-store`
//! contract on SQLite with sqlx, and passes its conformance suite.
//!
//! The database runs in WAL mode with `synchronous=FULL` (a commit is on disk before it is
//! acknowledged), foreign keys on and a busy timeout, so several processes may share one file.
//! Checkpoints (copying the write-ahead log back into the database file, with its own fsync)
//! run in the background ([`checkpoint`]), not inside whichever commit crossed SQLite's
//! automatic threshold: a commit waits only for its own log write.
//! Workloads are stored in typed columns; workload ids and audit sequence numbers come from the
//! database's `sequences` table, never from the application.
//!
//! A lifecycle batch is written group by group with multi-row statements (`batch` and `rows`),
//! so that its cost follows the kinds of rows it holds rather than their number. On a file it
//! is written on a connection of the store's own, not sqlx's (`raw::BatchConnection`): its
//! statements stay prepared from one batch to the next, and the whole transaction runs on the
//! committing thread instead of a round trip to sqlx's worker thread per statement.
//!
//! The migrations in `migrations/` are written in SQL both databases understand (`$1`
//! placeholders, `BIGINT`, `TEXT`, no `AUTOINCREMENT`); `tessera-store-postgres` keeps its own
//! set with the same tables and numbering where PostgreSQL's stricter types differ.
//! Statements that only SQLite understands say so where they are written. On opening, the
//! store refuses a database whose schema a newer Tessera wrote ([`StoreError::Incompatible`]),
//! applies the migrations and then converts workloads stored by schema version 1 (a JSON
//! document per row) into typed rows.
//!
//! The leader lease ([`tessera_store::LeaseStore`]) is implemented too, timed by SQLite's
//! clock, so that the contract holds whole; the server runs one process on SQLite and does not
//! elect.
//!
//! The statements, with their binding and decoding, are written once for both SQL stores in
//! `tessera-store-sql`, generic over its `Driver` trait; [`SqliteStore`] is SQLite's driver
//! (`driver.rs`: connections, transactions, rows, the statements whose text differs, the read of
//! every active workload) and `rows.rs` makes SQLite's texts of the multi-row statements.

mod checkpoint;
mod driver;
mod legacy;
#[cfg(test)]
mod plans;
mod raw;
mod rows;

use std::path::Path;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use tessera_store::{Result, StoreError};
use tessera_store_sql::DbError;
use tessera_store_sql::sqlx_common::{check_applied, classify_common};

/// The migrations of the store's schema, applied on opening.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// The contract of `tessera-store` on a SQLite database.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    /// Reads and single statements.
    pool: SqlitePool,
    /// Write transactions: one connection of its own on a file (the same pool in memory), see
    /// [`SqliteStore::open_dir`].
    writer: SqlitePool,
    /// The connection lifecycle batches are written on (a file's; none in memory), see
    /// [`raw::BatchConnection`].
    batch: Option<std::sync::Arc<tokio::sync::Mutex<raw::BatchConnection>>>,
    /// The background checkpointer of a database file (none in memory); it stops when the
    /// last clone of the store is dropped.
    _checkpointer: Option<std::sync::Arc<checkpoint::Checkpointer>>,
}

tessera_store_sql::implement_store!(SqliteStore);

/// The page cache of the write connection (`cache_size`; negative: KiB): 32 MiB, a few
/// thousand batches' worth of the pages a lifecycle batch changes.
const WRITER_CACHE: &str = "-32768";

/// How long a connection waits for another's write lock before it gives up.
const BUSY_TIMEOUT_MS: std::ffi::c_int = 10_000;

/// The database file in a data directory.
pub const DB_FILE: &str = "tessera.db";

/// How many rows a connection's worker thread reads ahead of the task taking them (sqlx's
/// default is 50): with 50, a long read (the telemetry of the last 30 days, millions of rows at
/// start) handed rows over nearly one at a time, each hand-over waking the other thread.
const ROWS_AHEAD: usize = 4_096;

impl SqliteStore {
    /// Opens (creating if needed) `<dir>/tessera.db`, applies the migrations and converts the
    /// workloads of schema version 1.
    pub async fn open_dir(dir: &Path) -> Result<SqliteStore> {
        std::fs::create_dir_all(dir)
            .map_err(|e| StoreError::Unavailable(format!("cannot create {}: {e}", dir.display())))?;
        let opts = SqliteConnectOptions::new()
            .filename(dir.join(DB_FILE))
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_millis(BUSY_TIMEOUT_MS as u64))
            // 1 MiB of page cache per connection (SQLite's default is 2 MiB): the pool's
            // connections cache the same hot pages, and the OS page cache holds the file.
            .pragma("cache_size", "-1024")
            // No checkpoint inside a commit: the background checkpointer does them.
            .pragma("wal_autocheckpoint", "0")
            .row_buffer_size(ROWS_AHEAD);
        // sqlx pings a connection before lending it by default: a round trip to the
        // connection's worker thread before every read and every batch, which tells nothing of
        // a file this process has open.
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .min_connections(1)
            .test_before_acquire(false)
            .connect_with(opts.clone())
            .await
            .map_err(db)?;
        // Write transactions take one connection of their own, with a larger page cache. A
        // connection whose database another connection changed drops its whole page cache at
        // its next transaction (WAL mode), so a write transaction on whichever pooled
        // connection was free read most pages it changed back from the file (`pread` and a
        // search of the log's index per page); the writer's cache stays valid between its
        // commits, as only it writes in the hot path. Writers of this process also wait for
        // the connection in turn instead of polling SQLite's write lock (the busy handler
        // sleeps 1, 2, 5 … ms between tries).
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .test_before_acquire(false)
            .connect_with(opts.pragma("cache_size", WRITER_CACHE))
            .await
            .map_err(db)?;
        let mut store = Self::prepare(pool, Some(writer)).await?;
        // Opened once the file is migrated (by `prepare`).
        let batch = raw::BatchConnection::open(&dir.join(DB_FILE), BUSY_TIMEOUT_MS, WRITER_CACHE)?;
        store.batch = Some(std::sync::Arc::new(tokio::sync::Mutex::new(batch)));
        store._checkpointer = Some(std::sync::Arc::new(checkpoint::Checkpointer::start(store.pool.clone())));
        Ok(store)
    }

    /// A private in-memory database (tests, simulations).
    pub async fn open_memory() -> Result<SqliteStore> {
        let opts = SqliteConnectOptions::new().in_memory(true).foreign_keys(true);
        // An in-memory database lives and dies with its one connection: the pool must hold
        // exactly one and never retire it.
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(opts)
            .await
            .map_err(db)?;
        Self::prepare(pool, None).await
    }

    /// Migrates and converts the database; `writer`: the pool of write transactions (`None`:
    /// `pool` itself).
    async fn prepare(pool: SqlitePool, writer: Option<SqlitePool>) -> Result<SqliteStore> {
        check_schema(&pool).await?;
        MIGRATOR.run(&pool).await.map_err(|e| match e {
            sqlx::migrate::MigrateError::Execute(e) => db(e),
            other => StoreError::Corrupt(format!("schema migrations: {other}")),
        })?;
        let store = SqliteStore {
            writer: writer.unwrap_or_else(|| pool.clone()),
            pool,
            batch: None,
            _checkpointer: None,
        };
        legacy::convert(&store).await?;
        Ok(store)
    }
}

/// Refuses a database whose applied migrations include versions this binary does not know: a
/// newer Tessera upgraded it, and this one would misread what it wrote.
async fn check_schema(pool: &SqlitePool) -> Result<()> {
    let exists: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'")
            .fetch_one(pool)
            .await
            .map_err(db)?;
    check_applied(pool, exists > 0, &MIGRATOR, classify).await
}

/// A database error, classified for the contract: unique-key violations are the caller's to
/// name (`tessera_store_sql::db_error`).
fn classify(e: sqlx::Error) -> DbError {
    match &e {
        sqlx::Error::Database(d) if d.is_unique_violation() => DbError::UniqueViolation,
        sqlx::Error::Database(d) => {
            // SQLite-specific result codes: SQLITE_CORRUPT (11) and SQLITE_NOTADB (26), in the
            // low byte of extended codes.
            let primary = d.code().and_then(|c| c.parse::<i32>().ok()).map(|c| c & 0xff);
            if matches!(primary, Some(11 | 26)) {
                DbError::Store(StoreError::Corrupt(e.to_string()))
            } else {
                DbError::Store(StoreError::Unavailable(e.to_string()))
            }
        }
        _ => classify_common(e),
    }
}

/// A database error of an operation that violates no unique key of its own.
fn db(e: sqlx::Error) -> StoreError {
    tessera_store_sql::db(classify(e))
}
