//! The usage ledger ([`LedgerStore`](tessera_store::LedgerStore)) and the multi-row statements that
//! open and close its intervals inside a lifecycle batch (see [`crate::batch`]).
//!
//! One generic function per method of `LedgerStore`, of the same name, for any [`Driver`];
//! [`implement_store!`](crate::implement_store) calls them.

use std::sync::LazyLock;

use tessera_domain::WorkloadId;
use tessera_model::GpuUnits;
use tessera_store::{Result, StoreError, UsageInterval};

use crate::rows::{self, MultiRow, Values};
use crate::{Driver, Row, col, db, db_error, i64_of, narrow, query, u64_of};

pub static OPEN: LazyLock<MultiRow> = LazyLock::new(|| {
    MultiRow::new(
        "INSERT INTO usage_intervals \
         (workload_id, seq, tenant, project, pool, model, shape, units_milli, started_at, ended_at, util_avg) VALUES ",
        11,
        "",
    )
});

// Rows through a common table expression, as for workload updates (see `workloads::UPDATE`):
// SQLite >= 3.33 and PostgreSQL (with typed placeholders) both run it.
pub static CLOSE: LazyLock<MultiRow> = LazyLock::new(|| {
    MultiRow::new(
        "WITH v (workload_id, seq, ended_at, util_avg) AS (VALUES ",
        4,
        ") UPDATE usage_intervals SET ended_at = v.ended_at, util_avg = v.util_avg FROM v \
         WHERE usage_intervals.workload_id = v.workload_id AND usage_intervals.seq = v.seq \
         AND usage_intervals.ended_at IS NULL",
    )
});

/// The close of an open interval.
#[derive(Clone, Copy, Debug)]
pub struct Close {
    pub workload: WorkloadId,
    pub seq: u32,
    pub ended_at: i64,
    pub util_avg: Option<f64>,
}

fn usage_row(r: &impl Row) -> Result<UsageInterval> {
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

/// The values of a row of [`OPEN`].
pub fn open_row<'q>(q: Values<'q>, u: &'q &UsageInterval) -> Result<Values<'q>> {
    Ok(q.bind(i64_of(u.workload.0))
        .bind(i64::from(u.seq))
        .bind(u.tenant.as_str())
        .bind(u.project.as_str())
        .bind(u.pool.as_str())
        .bind(u.model.as_str())
        .bind(u.shape.as_str())
        .bind(i64_of(u.units.as_milli()))
        .bind(u.started_at)
        .bind(u.ended_at)
        .bind(u.util_avg))
}

/// The values of a row of [`CLOSE`].
pub fn close_row<'q>(q: Values<'q>, c: &'q Close) -> Result<Values<'q>> {
    Ok(q.bind(i64_of(c.workload.0))
        .bind(i64::from(c.seq))
        .bind(c.ended_at)
        .bind(c.util_avg))
}

/// Opens intervals (inside the caller's transaction).
pub async fn open<D: Driver>(conn: &mut D::Connection, rows: &[&UsageInterval]) -> Result<()> {
    rows::execute::<D, _>(conn, &OPEN, rows, open_row, |e, rows| {
        db_error(e, || match rows {
            [u] => format!("usage interval {} of workload {}", u.seq, u.workload),
            _ => format!(
                "a usage interval of the workloads {} … {}",
                rows[0].workload,
                rows[rows.len() - 1].workload
            ),
        })
    })
    .await?;
    Ok(())
}

/// Closes open intervals (inside the caller's transaction); `Corrupt` if one is not open.
pub async fn close<D: Driver>(conn: &mut D::Connection, rows: &[Close]) -> Result<()> {
    let closed = rows::execute::<D, _>(conn, &CLOSE, rows, close_row, |e, _| db(e)).await?;
    // An interval changes at most once however many closes name it (a later statement finds
    // it closed), so fewer changes than closes means some were not open, or closed twice.
    if closed != rows.len() as u64 {
        return Err(StoreError::Corrupt(match rows {
            [c] => format!("usage interval {} of workload {} is not open", c.seq, c.workload),
            _ => format!(
                "{} of the {} usage intervals closed are not open",
                rows.len() as u64 - closed,
                rows.len()
            ),
        }));
    }
    Ok(())
}

pub async fn usage_of<D: Driver>(s: &D, id: WorkloadId) -> Result<Vec<UsageInterval>> {
    let rows = query::<D>(
        "SELECT workload_id, seq, tenant, project, pool, model, shape, units_milli, started_at, ended_at, util_avg \
         FROM usage_intervals WHERE workload_id = $1 ORDER BY seq",
    )
    .bind(i64_of(id.0))
    .fetch_all(&mut *s.conn().await?)
    .await
    .map_err(db)?;
    rows.iter().map(usage_row).collect()
}

pub async fn usage_between<D: Driver>(s: &D, tenant: Option<&str>, from: i64, to: i64) -> Result<Vec<UsageInterval>> {
    // A statement per case, so that a tenant's report walks the `(tenant, started_at)` index.
    let q = match tenant {
        Some(tenant) => query::<D>(
            "SELECT workload_id, seq, tenant, project, pool, model, shape, units_milli, started_at, ended_at, \
             util_avg FROM usage_intervals \
             WHERE tenant = $1 AND started_at < $3 AND (ended_at IS NULL OR ended_at > $2) \
             ORDER BY started_at, workload_id, seq",
        )
        .bind(tenant),
        None => query::<D>(
            "SELECT workload_id, seq, tenant, project, pool, model, shape, units_milli, started_at, ended_at, \
             util_avg FROM usage_intervals \
             WHERE started_at < $2 AND (ended_at IS NULL OR ended_at > $1) \
             ORDER BY started_at, workload_id, seq",
        ),
    };
    let rows = q
        .bind(from)
        .bind(to)
        .fetch_all(&mut *s.conn().await?)
        .await
        .map_err(db)?;
    rows.iter().map(usage_row).collect()
}

pub async fn closed_usage<D: Driver>(s: &D, from: i64, to: i64) -> Result<Vec<(String, i64)>> {
    query::<D>(D::CLOSED_USAGE)
        .bind(from)
        .bind(to)
        .fetch_all(&mut *s.conn().await?)
        .await
        .map_err(db)?
        .iter()
        .map(|r| Ok((col(r, "tenant")?, col(r, "used")?)))
        .collect()
}
