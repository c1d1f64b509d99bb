//! The console's telemetry history ([`TelemetryStore`](tessera_store::TelemetryStore)): one row
//! per series (`pool:NAME` or `workload:ID`), span (a minute or an hour) and start, in the
//! table `telemetry_samples`, whose primary key is `(at, series, span_minutes)` — time first,
//! so that the reads since a time, the fold and the prune are range scans of the key itself
//! and no other index is kept.
//!
//! Writes are `INSERT … ON CONFLICT … DO UPDATE`: a record already stored takes the figures
//! written last (the sampler's latest sample of that minute; a retried write writes the same
//! figures again, so it changes nothing). They go in
//! statements of at most [`TELEMETRY_ROWS_PER_WRITE`] rows, each in a transaction of its own:
//! the write lock (SQLite's, in particular) is never held for more than one such statement, and
//! the lifecycle loop's commits wait at most that long.
//!
//! One generic function per method of `TelemetryStore`, of the same name, for any [`Driver`];
//! [`implement_store!`](crate::implement_store) calls them.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::LazyLock;

use tessera_store::{Result, StoreError, TELEMETRY_ROWS_PER_WRITE, TelemetryRecord, TelemetrySeries};

use crate::rows::{self, MultiRow, Values};
use crate::{Driver, Row, col, db, i64_of, narrow, narrow_opt, query, u64_of};

pub static INSERT: LazyLock<MultiRow> = LazyLock::new(|| {
    MultiRow::new(
        "INSERT INTO telemetry_samples \
         (series, at, span_minutes, minutes, util_sum, used_mib_sum, total_mib) VALUES ",
        7,
        " ON CONFLICT (at, series, span_minutes) DO UPDATE SET minutes = excluded.minutes, \
         util_sum = excluded.util_sum, used_mib_sum = excluded.used_mib_sum, total_mib = excluded.total_mib",
    )
});

/// The key text of a series.
pub fn series_key(s: &TelemetrySeries) -> String {
    match s {
        TelemetrySeries::Pool(name) => format!("pool:{name}"),
        TelemetrySeries::Workload(id) => format!("workload:{id}"),
    }
}

/// The series a key text names, or `Corrupt`.
pub fn series_of(key: &str) -> Result<TelemetrySeries> {
    if let Some(name) = key.strip_prefix("pool:") {
        return Ok(TelemetrySeries::Pool(name.to_string()));
    }
    key.strip_prefix("workload:")
        .and_then(|id| id.parse().ok())
        .map(TelemetrySeries::Workload)
        .ok_or_else(|| StoreError::Corrupt(format!("column `series`: `{key}` names no series")))
}

fn record_values<'q>(q: Values<'q>, r: &'q (String, &TelemetryRecord)) -> Result<Values<'q>> {
    let (key, t) = r;
    Ok(q.bind(key.as_str())
        .bind(t.at)
        .bind(i64::from(t.span_minutes))
        .bind(i64::from(t.minutes))
        .bind(t.util_sum)
        .bind(t.used_mib_sum)
        .bind(t.total_mib.map(i64_of)))
}

fn record_row(r: &impl Row) -> Result<TelemetryRecord> {
    Ok(TelemetryRecord {
        series: series_of(&col::<String>(r, "series")?)?,
        at: col(r, "at")?,
        span_minutes: narrow(col(r, "span_minutes")?, "span_minutes")?,
        minutes: narrow(col(r, "minutes")?, "minutes")?,
        util_sum: col(r, "util_sum")?,
        used_mib_sum: col(r, "used_mib_sum")?,
        total_mib: narrow_opt::<i64>(col(r, "total_mib")?, "total_mib")?.map(u64_of),
    })
}

pub async fn append_telemetry<D: Driver>(s: &D, records: &[TelemetryRecord]) -> Result<u64> {
    // One row per key, the last written of it: PostgreSQL refuses a statement that would
    // update one row twice, and SQLite would apply them in turn (the last wins) anyway.
    let mut keyed: Vec<(String, &TelemetryRecord)> = Vec::with_capacity(records.len());
    let mut at: HashMap<(&TelemetrySeries, i64, u32), usize> = HashMap::with_capacity(records.len());
    for r in records {
        match at.entry((&r.series, r.at, r.span_minutes)) {
            Entry::Occupied(i) => keyed[*i.get()].1 = r,
            Entry::Vacant(v) => {
                v.insert(keyed.len());
                keyed.push((series_key(&r.series), r));
            }
        }
    }
    let mut added = 0;
    for chunk in keyed.chunks(TELEMETRY_ROWS_PER_WRITE) {
        let mut tx = s.begin_write().await?;
        added += rows::execute::<D, _>(&mut tx, &INSERT, chunk, record_values, |e, _| db(e)).await?;
        D::commit(tx).await?;
    }
    Ok(added)
}

pub async fn telemetry_between<D: Driver>(s: &D, from: i64, to: i64) -> Result<Vec<TelemetryRecord>> {
    let rows = query::<D>(
        "SELECT series, at, span_minutes, minutes, util_sum, used_mib_sum, total_mib FROM telemetry_samples \
         WHERE at >= $1 AND at < $2 ORDER BY at",
    )
    .bind(from)
    .bind(to)
    .fetch_all(&mut *s.conn().await?)
    .await
    .map_err(db)?;
    rows.iter().map(record_row).collect()
}

pub async fn fold_telemetry<D: Driver>(s: &D, from: i64, before: i64) -> Result<u64> {
    let mut tx = s.begin_write().await?;
    // Every minute of an hour in the span is folded at once (the caller's bounds are hours'
    // starts), so an hour is written whole; one already there keeps its figures. The span
    // bounds what the transaction reads (the key starts with the time): not the 30 days of
    // hour rows before it.
    let folded = query::<D>(
        "INSERT INTO telemetry_samples (series, at, span_minutes, minutes, util_sum, used_mib_sum, total_mib) \
         SELECT series, at - at % 3600000, 60, SUM(minutes), SUM(util_sum), SUM(used_mib_sum), MAX(total_mib) \
         FROM telemetry_samples WHERE at >= $1 AND at < $2 AND span_minutes = 1 AND series LIKE 'workload:%' \
         GROUP BY series, at - at % 3600000 ON CONFLICT DO NOTHING",
    )
    .bind(from)
    .bind(before)
    .execute(&mut tx)
    .await
    .map_err(db)?;
    query::<D>(
        "DELETE FROM telemetry_samples WHERE at >= $1 AND at < $2 AND span_minutes = 1 AND series LIKE 'workload:%'",
    )
    .bind(from)
    .bind(before)
    .execute(&mut tx)
    .await
    .map_err(db)?;
    D::commit(tx).await?;
    Ok(folded)
}

pub async fn prune_telemetry<D: Driver>(s: &D, before: i64) -> Result<u64> {
    query::<D>("DELETE FROM telemetry_samples WHERE at < $1")
        .bind(before)
        .execute(&mut *s.conn().await?)
        .await
        .map_err(db)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_keys_read_back() {
        for s in [
            TelemetrySeries::Pool("training".into()),
            TelemetrySeries::Pool("a:b".into()),
            TelemetrySeries::Workload(u64::MAX),
        ] {
            assert_eq!(series_of(&series_key(&s)).unwrap(), s);
        }
        assert!(matches!(series_of("node:x"), Err(StoreError::Corrupt(_))));
        assert!(matches!(series_of("workload:x"), Err(StoreError::Corrupt(_))));
    }
}
