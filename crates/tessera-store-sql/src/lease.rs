//! The leader lease and replica heartbeats ([`LeaseStore`](tessera_store::LeaseStore)), and the
//! check of a batch's fences. Times come from the database's clock (the `now_ms` of
//! [`lease_sql!`](crate::lease_sql)): it is the one every replica (every process sharing the
//! file, on SQLite) agrees on.
//!
//! On PostgreSQL, acquisition is one conditional `UPDATE` of the lease row: of replicas racing,
//! the first takes the row lock, the others wait for it and re-check the condition on the row
//! it wrote (READ COMMITTED re-evaluates an `UPDATE`'s `WHERE` on the newest row version), so
//! exactly one wins. A fence reads the row `FOR SHARE` (the `lock_fence` of
//! [`lease_sql!`](crate::lease_sql)): the lock lasts until the batch's transaction ends, and an
//! acquisition (an `UPDATE`) waits for it, so no replica takes the lease over while a fenced
//! batch is being committed. A holder paused in the middle of such a transaction does not keep
//! the lease forever: `idle_in_transaction_session_timeout` ends its session. On SQLite, every
//! write holds the database's write lock, which serialises the same steps.

use tessera_store::{Fence, LeaseRecord, ReplicaRecord, Result, StoreError};

use crate::{Driver, Row, col, db, i64_of, query, u64_of};

/// The lease's statements in one database's SQL ([`Driver::LEASE`]), made by [`lease_sql!`](crate::lease_sql).
#[derive(Clone, Copy, Debug)]
pub struct LeaseSql {
    /// `1` when `$1` holds the lease with epoch `$2` (a fence), locking the row where needed.
    pub check_fence: &'static str,
    /// Takes the lease for `$1` at `$2` for `$3` ms when free, expired or its own: the new epoch.
    pub acquire: &'static str,
    /// Extends `$1`'s lease of epoch `$2` by `$3` ms from now, if it still holds it.
    pub renew: &'static str,
    /// Ends `$1`'s lease of epoch `$2` now, if it still holds it.
    pub release: &'static str,
    /// The lease row, with `remaining_ms`.
    pub lease: &'static str,
    /// Records a replica's heartbeat (`last_seen` now).
    pub heartbeat: &'static str,
    /// Every replica, with `age_ms`.
    pub replicas: &'static str,
    /// Forgets replicas not seen for `$1` ms.
    pub prune: &'static str,
}

/// The lease's statements ([`LeaseSql`]) of a database whose clock, in milliseconds since the
/// Unix epoch, is the SQL expression `now_ms`, and whose fence read ends with `lock_fence`
/// (a row lock that keeps the lease until the transaction ends, or nothing where a write
/// transaction already holds the database's write lock). Both are string literals.
#[macro_export]
macro_rules! lease_sql {
    (now_ms = $now:literal, lock_fence = $fence:literal $(,)?) => {
        $crate::LeaseSql {
            check_fence: concat!(
                "SELECT 1 FROM leader WHERE id = 1 AND holder = $1 AND epoch = $2 AND expires_at > ",
                $now,
                $fence
            ),
            // One reading of the clock for the condition and both times.
            acquire: concat!(
                "WITH t (now) AS (SELECT ",
                $now,
                ") UPDATE leader SET holder = $1, url = $2, epoch = epoch + 1, acquired_at = t.now, \
                 expires_at = t.now + $3 FROM t WHERE id = 1 AND (holder IS NULL OR holder = $1 OR expires_at <= t.now) \
                 RETURNING epoch"
            ),
            renew: concat!(
                "UPDATE leader SET expires_at = ",
                $now,
                " + $3 WHERE id = 1 AND holder = $1 AND epoch = $2 AND expires_at > ",
                $now
            ),
            release: concat!(
                "UPDATE leader SET expires_at = ",
                $now,
                " WHERE id = 1 AND holder = $1 AND epoch = $2 AND expires_at > ",
                $now
            ),
            lease: concat!(
                "SELECT holder, url, epoch, acquired_at, expires_at, expires_at - ",
                $now,
                " AS remaining_ms FROM leader WHERE id = 1 AND holder IS NOT NULL"
            ),
            heartbeat: concat!(
                "INSERT INTO replicas (id, url, version, started_at, last_seen) VALUES ($1, $2, $3, $4, ",
                $now,
                ") ON CONFLICT (id) DO UPDATE SET url = excluded.url, version = excluded.version, \
                 started_at = excluded.started_at, last_seen = excluded.last_seen"
            ),
            replicas: concat!(
                "SELECT id, url, version, started_at, last_seen, ",
                $now,
                " - last_seen AS age_ms FROM replicas ORDER BY id"
            ),
            prune: concat!("DELETE FROM replicas WHERE last_seen < ", $now, " - $1"),
        }
    };
}

/// Fails with `Fenced` unless every fence's holder holds the lease with its epoch (inside the
/// caller's write transaction, which keeps the lease from changing hands until it ends).
pub async fn check_fences<D: Driver>(conn: &mut D::Connection, fences: &[&Fence]) -> Result<()> {
    for f in fences {
        let held = query::<D>(D::LEASE.check_fence)
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

fn replica_row(r: &impl Row) -> Result<ReplicaRecord> {
    Ok(ReplicaRecord {
        id: col(r, "id")?,
        url: col(r, "url")?,
        version: col(r, "version")?,
        started_at: col(r, "started_at")?,
        last_seen: col(r, "last_seen")?,
        age_ms: col(r, "age_ms")?,
    })
}

pub async fn acquire_lease<D: Driver>(s: &D, holder: &str, url: &str, ttl_ms: u64) -> Result<Option<u64>> {
    let row = query::<D>(D::LEASE.acquire)
        .bind(holder)
        .bind(url)
        .bind(i64_of(ttl_ms))
        .fetch_optional(&mut *s.conn().await?)
        .await
        .map_err(db)?;
    row.map(|r| col(&r, "epoch").map(u64_of)).transpose()
}

pub async fn renew_lease<D: Driver>(s: &D, holder: &str, epoch: u64, ttl_ms: u64) -> Result<bool> {
    let changed = query::<D>(D::LEASE.renew)
        .bind(holder)
        .bind(i64_of(epoch))
        .bind(i64_of(ttl_ms))
        .execute(&mut *s.conn().await?)
        .await
        .map_err(db)?;
    Ok(changed == 1)
}

pub async fn release_lease<D: Driver>(s: &D, holder: &str, epoch: u64) -> Result<()> {
    query::<D>(D::LEASE.release)
        .bind(holder)
        .bind(i64_of(epoch))
        .execute(&mut *s.conn().await?)
        .await
        .map_err(db)?;
    Ok(())
}

pub async fn lease<D: Driver>(s: &D) -> Result<Option<LeaseRecord>> {
    let row = query::<D>(D::LEASE.lease)
        .fetch_optional(&mut *s.conn().await?)
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

pub async fn heartbeat<D: Driver>(s: &D, r: &ReplicaRecord) -> Result<()> {
    query::<D>(D::LEASE.heartbeat)
        .bind(&r.id)
        .bind(&r.url)
        .bind(&r.version)
        .bind(r.started_at)
        .execute(&mut *s.conn().await?)
        .await
        .map_err(db)?;
    Ok(())
}

pub async fn replicas<D: Driver>(s: &D) -> Result<Vec<ReplicaRecord>> {
    let rows = query::<D>(D::LEASE.replicas)
        .fetch_all(&mut *s.conn().await?)
        .await
        .map_err(db)?;
    rows.iter().map(replica_row).collect()
}

pub async fn prune_replicas<D: Driver>(s: &D, idle_ms: u64) -> Result<u64> {
    query::<D>(D::LEASE.prune)
        .bind(i64_of(idle_ms))
        .execute(&mut *s.conn().await?)
        .await
        .map_err(db)
}
