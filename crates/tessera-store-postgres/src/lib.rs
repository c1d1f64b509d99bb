//! # tessera-store-postgres
//!
//! Tessera's shared store: [`PgStore`] implements every trait of the `tessera-store` contract
//! on PostgreSQL with sqlx, and passes its conformance suite. It is what several `tessera serve`
//! replicas point at (`--database postgres://…`); they elect their leader through the lease
//! row ([`tessera_store::LeaseStore`]) and the leader fences its lifecycle batches with its
//! epoch.
//!
//! The connection pool ([`PgOptions`]) bounds how long a caller waits for a connection, and
//! every session runs with a `statement_timeout` and an `idle_in_transaction_session_timeout`
//! (set as startup options, so no statement runs without them): a database that stops
//! answering yields [`StoreError::Unavailable`] within seconds instead of a request that hangs,
//! and a client paused inside a transaction cannot hold its locks (the leader lease among
//! them) for ever. [`PgStore::connect`] says plainly when the database cannot be reached and
//! refuses a database whose schema a newer Tessera wrote ([`StoreError::Incompatible`]).
//!
//! ## Its own migration set
//!
//! `migrations/` has the same tables, columns, keys and numbering (0001–0018) as the SQLite
//! store's, and differs where PostgreSQL must:
//!
//! * **types** — SQLite's `INTEGER` is 64 bits, PostgreSQL's is 32, and sqlx decodes a
//!   PostgreSQL column only into a Rust type of its exact width; every integer column is
//!   `BIGINT` here so that both stores read and bind `i64` alike. Keys and names that the store
//!   orders and pages by are `COLLATE "C"`: byte order, as SQLite compares, whatever locale the
//!   database was created with.
//! * **upserts and clocks** — `ON CONFLICT … DO UPDATE` is the same in both, but what "now" is
//!   differs (`clock_timestamp()` here, `julianday('now')` there), so each store's driver says
//!   what "now" is and `tessera_store_sql::lease_sql!` makes the lease's statements with it.
//!
//! Schema version 1 kept each workload as a JSON document; PostgreSQL support arrived after
//! version 4, so no PostgreSQL database holds such rows and this store has no conversion of
//! them (migration 0004 keeps the empty `workloads_v1` table only so that both schemas have the
//! same shape).
//!
//! The statements, with their binding and decoding, are written once for both SQL stores in
//! `tessera-store-sql`, generic over its `Driver` trait; [`PgStore`] is PostgreSQL's driver
//! (`driver.rs`: connections, transactions, rows, the statements whose text differs, revocation
//! news). A lifecycle batch is written group by group in multi-row statements, each kind of row
//! in one statement of arrays (`rows.rs`), in one transaction.

mod driver;
mod rows;

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, Postgres, Transaction};
use tessera_store::{Result, StoreError};
use tessera_store_sql::DbError;
use tessera_store_sql::sqlx_common::{check_applied, classify_common};

/// The migrations of the store's schema, applied on connecting.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// How the store uses the database.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgOptions {
    /// Connections in the pool.
    pub max_connections: u32,
    /// How long an operation waits for a connection before failing with `Unavailable`.
    pub acquire_timeout: Duration,
    /// The server cancels a statement running longer than this.
    pub statement_timeout: Duration,
    /// The server ends a session idle inside a transaction for longer than this.
    pub idle_in_transaction_timeout: Duration,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            max_connections: 16,
            acquire_timeout: Duration::from_secs(2),
            statement_timeout: Duration::from_secs(5),
            idle_in_transaction_timeout: Duration::from_secs(5),
        }
    }
}

/// The contract of `tessera-store` on a PostgreSQL database.
#[derive(Clone, Debug)]
pub struct PgStore {
    pool: PgPool,
    /// `host:port/database`, for messages (never the password).
    target: String,
    /// Until when (ms since the epoch, this process's clock) operations fail at once: the
    /// pool could not get a connection moments ago.
    down_until: Arc<AtomicI64>,
}

tessera_store_sql::implement_store!(PgStore);

/// How long operations fail at once after the pool could not get a connection: a request
/// that needs several round trips answers 503 after one connection attempt, not one per trip.
const FAIL_FAST: Duration = Duration::from_millis(1_000);

impl PgStore {
    /// Connects to `url` (`postgres://user:password@host:port/database?…`) with the default
    /// [`PgOptions`] and applies the migrations.
    pub async fn connect(url: &str) -> Result<PgStore> {
        Self::connect_with(url, &PgOptions::default()).await
    }

    /// Connects to `url` with `options` and applies the migrations.
    pub async fn connect_with(url: &str, options: &PgOptions) -> Result<PgStore> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(StoreError::Unavailable(
                "the database URL is not a PostgreSQL URL: it must start with postgres:// or postgresql://".into(),
            ));
        }
        let opts = PgConnectOptions::from_str(url)
            .map_err(|e| StoreError::Unavailable(format!("the database URL is not a PostgreSQL URL: {e}")))?;
        let target = format!(
            "{}:{}/{}",
            opts.get_host(),
            opts.get_port(),
            opts.get_database().unwrap_or("")
        );
        let opts = opts
            .application_name("tessera")
            .options([
                ("statement_timeout", options.statement_timeout.as_millis().to_string()),
                (
                    "idle_in_transaction_session_timeout",
                    options.idle_in_transaction_timeout.as_millis().to_string(),
                ),
            ])
            .log_statements(tracing::log::LevelFilter::Trace);
        // One connection first, to report why the database cannot be reached (the pool would
        // only say that it timed out).
        let unreachable = |e: &dyn std::fmt::Display| {
            StoreError::Unavailable(format!("cannot connect to PostgreSQL at {target}: {e}"))
        };
        match tokio_timeout(options.acquire_timeout, opts.connect()).await {
            Some(Ok(c)) => {
                let _ = c.close().await;
            }
            Some(Err(e)) => return Err(unreachable(&e)),
            None => return Err(unreachable(&format!("no answer within {:?}", options.acquire_timeout))),
        }
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .min_connections(1)
            .acquire_timeout(options.acquire_timeout)
            .connect_with(opts)
            .await
            .map_err(|e| unreachable(&e))?;
        check_schema(&pool).await?;
        MIGRATOR.run(&pool).await.map_err(|e| match e {
            sqlx::migrate::MigrateError::Execute(e) => db(e),
            other => StoreError::Corrupt(format!("schema migrations: {other}")),
        })?;
        Ok(PgStore {
            pool,
            target,
            down_until: Arc::default(),
        })
    }

    /// A connection from the pool, or `Unavailable` naming the database — at once while the
    /// database was found unreachable less than [`FAIL_FAST`] ago.
    async fn acquire(&self) -> Result<PoolConnection<Postgres>> {
        self.check_up()?;
        self.pool.acquire().await.map_err(|e| match e {
            sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) => self.unreachable(e),
            other => db(other),
        })
    }

    /// `Unavailable` while the database was found unreachable moments ago.
    fn check_up(&self) -> Result<()> {
        if now_ms() < self.down_until.load(Ordering::Relaxed) {
            return Err(StoreError::Unavailable(format!(
                "PostgreSQL at {} was unreachable moments ago",
                self.target
            )));
        }
        Ok(())
    }

    /// The error of a failed attempt to get a connection; starts the fail-fast window.
    fn unreachable(&self, e: sqlx::Error) -> StoreError {
        self.down_until
            .store(now_ms() + FAIL_FAST.as_millis() as i64, Ordering::Relaxed);
        StoreError::Unavailable(format!("cannot reach PostgreSQL at {}: {e}", self.target))
    }

    /// `host:port/database` of the database (no credentials).
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Closes the pool's connections.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Begins a transaction that writes. PostgreSQL's row locks do what SQLite's `BEGIN
    /// IMMEDIATE` does there: the `sequences` rows serialise the appenders of audit records, a
    /// fence's `FOR SHARE` keeps the lease, `FOR UPDATE` keeps a tenant from changing.
    async fn begin(&self) -> Result<Transaction<'static, Postgres>> {
        self.check_up()?;
        self.pool.begin().await.map_err(|e| match e {
            sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) => self.unreachable(e),
            other => db(other),
        })
    }
}

/// Milliseconds since the Unix epoch (this process's clock).
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// `fut`, or `None` when it takes longer than `limit`.
async fn tokio_timeout<F: std::future::Future>(limit: Duration, fut: F) -> Option<F::Output> {
    tokio::time::timeout(limit, fut).await.ok()
}

/// Refuses a database whose applied migrations include versions this binary does not know: a
/// newer Tessera upgraded it, and this one would misread what it wrote.
impl PgStore {
    /// Listens on `tessera_revocations` for as long as the receiver lives: each notification's
    /// payload (a revoked token's id) is passed on; after a lost connection, an empty message
    /// (some may have been missed) once listening again, every second until it is.
    pub(crate) async fn listen_revocations(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<String>> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let pool = self.pool.clone();
        tokio::spawn(async move {
            let mut missed = false;
            loop {
                let listener = async {
                    let mut l = sqlx::postgres::PgListener::connect_with(&pool).await?;
                    l.listen("tessera_revocations").await?;
                    Ok::<_, sqlx::Error>(l)
                };
                let mut l = match listener.await {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot listen for revocations; retrying in 1 s");
                        missed = true;
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                        continue;
                    }
                };
                if missed && tx.send(String::new()).is_err() {
                    return;
                }
                loop {
                    match l.try_recv().await {
                        Ok(Some(n)) => {
                            if tx.send(n.payload().to_string()).is_err() {
                                return;
                            }
                        }
                        // The connection was lost (and re-established by the listener):
                        // notifications in between may be missed.
                        Ok(None) => {
                            if tx.send(String::new()).is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "revocation listener");
                            missed = true;
                            break;
                        }
                    }
                }
            }
        });
        Some(rx)
    }
}

async fn check_schema(pool: &PgPool) -> Result<()> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(pool)
        .await
        .map_err(db)?;
    check_applied(pool, exists, &MIGRATOR, classify).await
}

/// A database error, classified for the contract: unique-key violations are the caller's to
/// name (`tessera_store_sql::db_error`).
fn classify(e: sqlx::Error) -> DbError {
    match &e {
        sqlx::Error::Database(d) if d.is_unique_violation() => DbError::UniqueViolation,
        // SQLSTATE class XX: data_corrupted, index_corrupted.
        sqlx::Error::Database(d) if d.code().is_some_and(|c| c.starts_with("XX0")) => {
            DbError::Store(StoreError::Corrupt(e.to_string()))
        }
        // Undecodable rows are corrupt; timeouts (57014), connections lost (08…), the server
        // shutting down (57P…), serialisation failures and deadlocks (40…) may succeed if
        // retried.
        _ => classify_common(e),
    }
}

/// A database error of an operation that violates no unique key of its own.
fn db(e: sqlx::Error) -> StoreError {
    tessera_store_sql::db(classify(e))
}
