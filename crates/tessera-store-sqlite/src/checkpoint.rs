//! The background checkpointer of an on-disk database.
//!
//! In WAL mode a commit appends to the write-ahead log and fsyncs it; a *checkpoint* later
//! copies the logged pages into the database file and fsyncs that. By default SQLite runs a
//! checkpoint inside the commit that makes the log pass 1,000 pages, so one commit in a few
//! hundred waits for a second, larger write (the create path's p99). The store turns automatic
//! checkpoints off (`wal_autocheckpoint=0` on every connection) and this task runs a
//! `PASSIVE` checkpoint on its own connection every [`EVERY`] instead: it never waits for a
//! writer or a reader, so commits keep their own latency, and durability is unchanged (a
//! commit is on disk once its log write is, whether or not a checkpoint has run).
//!
//! The log is reset by the first writer after a checkpoint has copied all of it, so it stays
//! about as large as [`EVERY`]'s worth of writes. The task stops when the store's last clone is
//! dropped; the connection pool's own close checkpoints what is left when the last connection
//! closes.

use std::time::Duration;

use sqlx::SqlitePool;
use tokio::task::JoinHandle;

/// How often the log is copied back into the database file.
pub const EVERY: Duration = Duration::from_millis(250);

/// Runs checkpoints until dropped.
#[derive(Debug)]
pub struct Checkpointer {
    task: JoinHandle<()>,
}

impl Checkpointer {
    /// Starts checkpointing `pool`'s database every [`EVERY`].
    pub fn start(pool: SqlitePool) -> Checkpointer {
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                // (busy, log frames, frames copied); a failure (the database is busy or
                // gone) is retried at the next tick.
                if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)").execute(&pool).await {
                    tracing::debug!(error = %e, "checkpoint failed; retrying");
                }
            }
        });
        Checkpointer { task }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
