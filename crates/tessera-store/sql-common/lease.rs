//! The leader lease and replica heartbeats ([`LeaseStore`]), and the check of a batch's
//! fences. Times come from the database's clock ([`now_ms!`](crate::driver::now_ms)): it is the
//! one every replica (every process sharing the file, on SQLite) agrees on.
//!
//! On PostgreSQL, acquisition is one conditional `UPDATE` of the lease row: of replicas racing,
//! the first takes the row lock, the others wait for it and re-check the condition on the row
//! it wrote (READ COMMITTED re-evaluates an `UPDATE`'s `WHERE` on the newest row version), so
//! exactly one wins. A fence reads the row `FOR SHARE` ([`lock_fence!`](crate::driver::lock_fence)):
//! the lock lasts until the batch's transaction ends, and an acquisition (an `UPDATE`) waits for
//! it, so no replica takes the lease over while a fenced batch is being committed. A holder
//! paused in the middle of such a transaction does not keep the lease forever:
//! `idle_in_transaction_session_timeout` ends its session. On SQLite, every write holds the
//! database's write lock, which serialises the same steps.

use async_trait::async_trait;
use sqlx::Row;
use tessera_store::{Fence, LeaseRecord, LeaseStore, ReplicaRecord, Result, StoreError};

use crate::driver::{DbConnection, DbRow, Store, lock_fence, now_ms};
use crate::{col, db, i64_of, u64_of};

/// Fails with `Fenced` unless every fence's holder holds the lease with its epoch (inside the
/// caller's write transaction, which keeps the lease from changing hands until it ends).
pub(crate) async fn check_fences(conn: &mut DbConnection, fences: &[&Fence]) -> Result<()> {
    for f in fences {
        let held = sqlx::query(concat!(
            "SELECT 1 FROM leader WHERE id = 1 AND holder = $1 AND epoch = $2 AND expires_at > ",
            now_ms!(),
            lock_fence!()
        ))
        .bind(f.holder.as_str())
        .bind(i64_of(f.epoch))
        .fetch_optional(&mut *conn)
        .await
        .map_err(db)?;
        if held.is_none() {
            return Err(StoreError::Fenced(format!(
                "`{}` no longer holds the leader lease with epoch {}",
                f.holder, f.epoch
            )));
        }
    }
    Ok(())
}

fn replica_row(r: &DbRow) -> Result<ReplicaRecord> {
    Ok(ReplicaRecord {
        id: col(r, "id")?,
        url: col(r, "url")?,
        version: col(r, "version")?,
        started_at: col(r, "started_at")?,
        last_seen: col(r, "last_seen")?,
        age_ms: col(r, "age_ms")?,
    })
}

#[async_trait]
impl LeaseStore for Store {
    fn shared(&self) -> bool {
        crate::driver::SHARED
    }

    async fn acquire_lease(&self, holder: &str, url: &str, ttl_ms: u64) -> Result<Option<u64>> {
        // One reading of the clock for the condition and both times.
        let row = sqlx::query(concat!(
            "WITH t (now) AS (SELECT ",
            now_ms!(),
            ") UPDATE leader SET holder = $1, url = $2, epoch = epoch + 1, acquired_at = t.now, \
             expires_at = t.now + $3 FROM t WHERE id = 1 AND (holder IS NULL OR holder = $1 OR expires_at <= t.now) \
             RETURNING epoch"
        ))
        .bind(holder)
        .bind(url)
        .bind(i64_of(ttl_ms))
        .fetch_optional(&mut *self.conn().await?)
        .await
        .map_err(db)?;
        row.map(|r| r.try_get::<i64, _>(0).map(u64_of).map_err(db)).transpose()
    }

    async fn renew_lease(&self, holder: &str, epoch: u64, ttl_ms: u64) -> Result<bool> {
        let r = sqlx::query(concat!(
            "UPDATE leader SET expires_at = ",
            now_ms!(),
            " + $3 WHERE id = 1 AND holder = $1 AND epoch = $2 AND expires_at > ",
            now_ms!()
        ))
        .bind(holder)
        .bind(i64_of(epoch))
        .bind(i64_of(ttl_ms))
        .execute(&mut *self.conn().await?)
        .await
        .map_err(db)?;
        Ok(r.rows_affected() == 1)
    }

    async fn release_lease(&self, holder: &str, epoch: u64) -> Result<()> {
        sqlx::query(concat!(
            "UPDATE leader SET expires_at = ",
            now_ms!(),
            " WHERE id = 1 AND holder = $1 AND epoch = $2 AND expires_at > ",
            now_ms!()
        ))
        .bind(holder)
        .bind(i64_of(epoch))
        .execute(&mut *self.conn().await?)
        .await
        .map_err(db)?;
        Ok(())
    }

    async fn lease(&self) -> Result<Option<LeaseRecord>> {
        let row = sqlx::query(concat!(
            "SELECT holder, url, epoch, acquired_at, expires_at, expires_at - ",
            now_ms!(),
            " AS remaining_ms FROM leader WHERE id = 1 AND holder IS NOT NULL"
        ))
        .fetch_optional(&mut *self.conn().await?)
        .await
        .map_err(db)?;
        row.map(|r| {
            Ok(LeaseRecord {
                holder: col(&r, "holder")?,
                url: col(&r, "url")?,
                epoch: u64_of(col(&r, "epoch")?),
                acquired_at: col(&r, "acquired_at")?,
                expires_at: col(&r, "expires_at")?,
                remaining_ms: col(&r, "remaining_ms")?,
            })
        })
        .transpose()
    }

    async fn heartbeat(&self, r: &ReplicaRecord) -> Result<()> {
        sqlx::query(concat!(
            "INSERT INTO replicas (id, url, version, started_at, last_seen) VALUES ($1, $2, $3, $4, ",
            now_ms!(),
            ") ON CONFLICT (id) DO UPDATE SET url = excluded.url, version = excluded.version, \
             started_at = excluded.started_at, last_seen = excluded.last_seen"
        ))
        .bind(&r.id)
        .bind(&r.url)
        .bind(&r.version)
        .bind(r.started_at)
        .execute(&mut *self.conn().await?)
        .await
        .map_err(db)?;
        Ok(())
    }

    async fn replicas(&self) -> Result<Vec<ReplicaRecord>> {
        let rows = sqlx::query(concat!(
            "SELECT id, url, version, started_at, last_seen, ",
            now_ms!(),
            " - last_seen AS age_ms FROM replicas ORDER BY id"
        ))
        .fetch_all(&mut *self.conn().await?)
        .await
        .map_err(db)?;
        rows.iter().map(replica_row).collect()
    }

    async fn prune_replicas(&self, idle_ms: u64) -> Result<u64> {
        let r = sqlx::query(concat!("DELETE FROM replicas WHERE last_seen < ", now_ms!(), " - $1"))
            .bind(i64_of(idle_ms))
            .execute(&mut *self.conn().await?)
            .await
            .map_err(db)?;
        Ok(r.rows_affected())
    }
}
