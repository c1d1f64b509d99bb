//! The usage ledger ([`LedgerStore`]) and the statements that open and close its intervals
//! inside a lifecycle batch.

use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnection, SqliteRow};
use tessera_domain::WorkloadId;
use tessera_model::GpuUnits;
use tessera_store::{LedgerStore, Result, StoreError, UsageInterval};

use crate::{SqliteStore, col, db, db_error, i64_of, narrow, u64_of};

fn usage_row(r: &SqliteRow) -> Result<UsageInterval> {
    Ok(UsageInterval {
        workload: WorkloadId(u64_of(col(r, "workload_id")?)),
        seq: narrow(col(r, "seq")?, "seq")?,
        tenant: col(r, "tenant")?,
        project: col(r, "project")?,
        pool: col(r, "pool")?,
        model: col(r, "model")?,
        shape: col(r, "shape")?,
        units: GpuUnits(u64_of(col(r, "units_milli")?)),
        started_at: col(r, "started_at")?,
        ended_at: col(r, "ended_at")?,
        util_avg: col(r, "util_avg")?,
    })
}

/// Opens `u` (the batch's transaction).
pub(crate) async fn open(conn: &mut SqliteConnection, u: &UsageInterval) -> Result<()> {
    sqlx::query(
        "INSERT INTO usage_intervals \
         (workload_id, seq, tenant, project, pool, model, shape, units_milli, started_at, ended_at, util_avg) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
    )
    .bind(i64_of(u.workload.0))
    .bind(i64::from(u.seq))
    .bind(&u.tenant)
    .bind(&u.project)
    .bind(&u.pool)
    .bind(&u.model)
    .bind(&u.shape)
    .bind(i64_of(u.units.as_milli()))
    .bind(u.started_at)
    .bind(u.ended_at)
    .bind(u.util_avg)
    .execute(conn)
    .await
    .map_err(|e| db_error(e, || format!("usage interval {} of workload {}", u.seq, u.workload)))?;
    Ok(())
}

/// Closes an open interval (the batch's transaction); `Corrupt` if it is not open.
pub(crate) async fn close(
    conn: &mut SqliteConnection,
    workload: WorkloadId,
    seq: u32,
    ended_at: i64,
    util_avg: Option<f64>,
) -> Result<()> {
    let closed = sqlx::query(
        "UPDATE usage_intervals SET ended_at = $1, util_avg = $2 \
         WHERE workload_id = $3 AND seq = $4 AND ended_at IS NULL",
    )
    .bind(ended_at)
    .bind(util_avg)
    .bind(i64_of(workload.0))
    .bind(i64::from(seq))
    .execute(conn)
    .await
    .map_err(db)?
    .rows_affected();
    if closed == 0 {
        return Err(StoreError::Corrupt(format!(
            "usage interval {seq} of workload {workload} is not open"
        )));
    }
    Ok(())
}

#[async_trait]
impl LedgerStore for SqliteStore {
    async fn usage_of(&self, id: WorkloadId) -> Result<Vec<UsageInterval>> {
        let rows = sqlx::query(
            "SELECT workload_id, seq, tenant, project, pool, model, shape, units_milli, started_at, ended_at, util_avg \
             FROM usage_intervals WHERE workload_id = $1 ORDER BY seq",
        )
        .bind(i64_of(id.0))
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        rows.iter().map(usage_row).collect()
    }

    async fn usage_between(&self, tenant: Option<&str>, from: i64, to: i64) -> Result<Vec<UsageInterval>> {
        // A statement per case, so that a tenant's report walks the `(tenant, started_at)` index.
        let q = match tenant {
            Some(tenant) => sqlx::query(
                "SELECT workload_id, seq, tenant, project, pool, model, shape, units_milli, started_at, ended_at, \
                 util_avg FROM usage_intervals \
                 WHERE tenant = $1 AND started_at < $3 AND (ended_at IS NULL OR ended_at > $2) \
                 ORDER BY started_at, workload_id, seq",
            )
            .bind(tenant),
            None => sqlx::query(
                "SELECT workload_id, seq, tenant, project, pool, model, shape, units_milli, started_at, ended_at, \
                 util_avg FROM usage_intervals \
                 WHERE started_at < $2 AND (ended_at IS NULL OR ended_at > $1) \
                 ORDER BY started_at, workload_id, seq",
            ),
        };
        let rows = q.bind(from).bind(to).fetch_all(&self.pool).await.map_err(db)?;
        rows.iter().map(usage_row).collect()
    }
}
