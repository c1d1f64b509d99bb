//! Conversion of workloads stored by schema version 1, where each row held the JSON of the
//! REST API's workload, into typed rows.
//!
//! Migration 0004 keeps those rows in `workloads_v1`; SQL cannot decode their documents
//! portably, so the store converts them when it opens, all in one transaction, deleting each
//! converted row. A document that cannot be converted fails the opening (`Corrupt`) and
//! converts nothing, rather than losing a workload. Version 1 had no reason codes, no stop
//! causes, no environment and no `no_wait`/`no_requeue`: converted workloads get
//! [`ReasonCode::Unknown`], no stop cause, an empty environment and `false`.

use std::collections::BTreeMap;

use serde::Deserialize;
use tessera_domain::{
    GpuSpec, Kind, Phase, Placement, Reason, ReasonCode, ShapeSpec, Slice, UsageCursor, Workload, WorkloadId,
    WorkloadSpec,
};
use tessera_model::GpuUnits;
use tessera_store::{Result, StoreError};
use tessera_store_sql::{Driver, col, db, narrow, query, u64_of, workloads};

use crate::SqliteStore;

/// The REST API's workload as version 1 stored it (fields it no longer needs are ignored).
#[derive(Deserialize)]
struct LegacyWorkload {
    tenant: String,
    project: String,
    name: String,
    kind: String,
    shape: LegacyShape,
    cpu_milli: u64,
    memory_mib: u64,
    #[serde(default)]
    duration_s: Option<i64>,
    #[serde(default)]
    command: Option<Vec<String>>,
    #[serde(default)]
    image: Option<String>,
    priority: String,
    state: String,
    #[serde(default)]
    borrowing: bool,
    #[serde(default)]
    reason: Option<String>,
    /// GPU units as a decimal string (`1`, `0.5`, `0.125`).
    units: String,
    #[serde(default)]
    allocation: Option<LegacyAllocation>,
    created_at_ms: i64,
    #[serde(default)]
    running_at_ms: Option<i64>,
    /// RFC 3339 with milliseconds; version 1 kept no milliseconds field for it.
    #[serde(default)]
    ended_at: Option<String>,
}

#[derive(Deserialize)]
struct LegacyShape {
    #[serde(default)]
    gpus: Option<u8>,
    #[serde(default)]
    mig: Option<String>,
    #[serde(default)]
    fraction: Option<u16>,
    #[serde(default)]
    gpu_memory_mib: Option<u32>,
    #[serde(default)]
    models: Vec<String>,
    #[serde(default)]
    pool: Option<String>,
}

#[derive(Deserialize)]
struct LegacyAllocation {
    pool: String,
    node: String,
    model: String,
    gpus: Vec<u8>,
    /// `whole`, `mig`, `fraction` or `cpu`.
    kind: String,
    #[serde(default)]
    mig_profile: Option<String>,
    #[serde(default)]
    mig_profile_id: Option<u32>,
    #[serde(default)]
    mig_start: Option<u8>,
    #[serde(default)]
    mig_size: Option<u8>,
    #[serde(default)]
    milli: Option<u16>,
    #[serde(default)]
    gpu_memory_mib: Option<u32>,
    units_milli: u64,
}

/// Where a workload's timeline and usage ledger stand, from its rows.
struct Bookkeeping {
    next_seq: u32,
    usage: UsageCursor,
}

fn invalid(id: WorkloadId, what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("workload {id} of schema version 1: {what}"))
}

impl LegacyWorkload {
    fn into_workload(self, id: WorkloadId, books: Bookkeeping) -> Result<Workload> {
        let s = self.shape;
        // The API accepted exactly one of the three; the order only matters for rows it never
        // wrote.
        let gpu = match (s.gpus, s.mig, s.fraction) {
            (Some(gpus), _, _) => GpuSpec::Whole { gpus },
            (None, Some(profile), _) => GpuSpec::Mig { profile },
            (None, None, Some(milli)) => GpuSpec::Fraction {
                milli,
                memory_mib: s.gpu_memory_mib,
            },
            (None, None, None) => return Err(invalid(id, "its shape has no GPU part")),
        };
        let spec = WorkloadSpec {
            tenant: self.tenant,
            project: self.project,
            name: self.name,
            kind: Kind::parse(&self.kind).ok_or_else(|| invalid(id, format_args!("unknown kind `{}`", self.kind)))?,
            shape: ShapeSpec {
                gpu,
                models: s.models,
                pool: s.pool,
            },
            cpu_milli: self.cpu_milli,
            memory_mib: self.memory_mib,
            duration_s: self
                .duration_s
                .map(|d| u64::try_from(d).map_err(|_| invalid(id, format_args!("negative duration {d}"))))
                .transpose()?,
            command: self.command,
            image: self.image,
            env: BTreeMap::new(),
            priority: self.priority,
            no_wait: false,
            no_requeue: false,
            movable: None,
            native: None,
        };
        let ended_at = self
            .ended_at
            .map(|t| parse_rfc3339_ms(&t).ok_or_else(|| invalid(id, format_args!("unreadable end time `{t}`"))))
            .transpose()?;
        Ok(Workload {
            id,
            spec,
            units: parse_units(&self.units)
                .ok_or_else(|| invalid(id, format_args!("unreadable GPU units `{}`", self.units)))?,
            phase: Phase::parse(&self.state)
                .ok_or_else(|| invalid(id, format_args!("unknown state `{}`", self.state)))?,
            reason: self.reason.map(|detail| Reason::new(ReasonCode::Unknown, detail)),
            placement: self.allocation.map(|a| a.into_placement(id)).transpose()?,
            // Version 1 had no multi-node gangs.
            shares: Vec::new(),
            borrowing: self.borrowing,
            created_at: self.created_at_ms,
            running_at: self.running_at_ms,
            ended_at,
            stop: None,
            next_seq: books.next_seq,
            usage: books.usage,
        })
    }
}

impl LegacyAllocation {
    fn into_placement(self, id: WorkloadId) -> Result<Placement> {
        let missing = |field: &str| invalid(id, format_args!("a {} allocation without `{field}`", self.kind));
        let slice = match self.kind.as_str() {
            "whole" => Slice::Whole,
            "mig" => Slice::Mig {
                profile: self.mig_profile.clone().ok_or_else(|| missing("mig_profile"))?,
                profile_id: self.mig_profile_id.ok_or_else(|| missing("mig_profile_id"))?,
                start: self.mig_start.ok_or_else(|| missing("mig_start"))?,
                size: self.mig_size.ok_or_else(|| missing("mig_size"))?,
            },
            "fraction" => Slice::Fraction {
                milli: self.milli.ok_or_else(|| missing("milli"))?,
                gpu_memory_mib: self.gpu_memory_mib,
            },
            "cpu" => Slice::CpuOnly,
            other => return Err(invalid(id, format_args!("unknown allocation kind `{other}`"))),
        };
        Ok(Placement {
            pool: self.pool,
            node: self.node,
            model: self.model,
            gpus: self.gpus,
            slice,
            units: GpuUnits(self.units_milli),
        })
    }
}

/// Converts every row left in `workloads_v1`; returns how many there were.
pub(crate) async fn convert(store: &SqliteStore) -> Result<usize> {
    let mut tx = store.begin_write().await?;
    let rows = query::<SqliteStore>("SELECT id, updated_at, doc FROM workloads_v1 ORDER BY id")
        .fetch_all(&mut *tx)
        .await
        .map_err(db)?;
    for row in &rows {
        let raw_id: i64 = col(row, "id")?;
        let id = WorkloadId(u64_of(raw_id));
        let updated_at: i64 = col(row, "updated_at")?;
        let doc: String = col(row, "doc")?;
        let old: LegacyWorkload = serde_json::from_str(&doc).map_err(|e| invalid(id, e))?;

        let last_event: Option<i64> =
            query::<SqliteStore>("SELECT MAX(seq) AS last FROM workload_events WHERE workload_id = $1")
                .bind(raw_id)
                .fetch_one(&mut *tx)
                .await
                .map_err(db)
                .and_then(|r| col(&r, "last"))?;
        let last_interval = query::<SqliteStore>(
            "SELECT seq, ended_at FROM usage_intervals WHERE workload_id = $1 ORDER BY seq DESC LIMIT 1",
        )
        .bind(raw_id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?;
        let usage = match last_interval {
            None => UsageCursor::default(),
            Some(r) => {
                let seq: u32 = narrow(col(&r, "seq")?, "seq")?;
                if col::<Option<i64>>(&r, "ended_at")?.is_none() {
                    UsageCursor { seq, open: true }
                } else {
                    UsageCursor {
                        seq: seq + 1,
                        open: false,
                    }
                }
            }
        };
        let books = Bookkeeping {
            next_seq: last_event.map_or(Ok(0), |s| narrow::<u32>(s + 1, "seq"))?,
            usage,
        };
        let workload = old.into_workload(id, books)?;
        workloads::insert_workloads::<SqliteStore>(&mut tx, &[(&workload, updated_at)]).await?;
        query::<SqliteStore>("DELETE FROM workloads_v1 WHERE id = $1")
            .bind(raw_id)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
    }
    SqliteStore::commit(tx).await?;
    Ok(rows.len())
}

/// GPU units from their decimal form (`1`, `0.5`, `0.125`, `22.5`): exact thousandths.
fn parse_units(s: &str) -> Option<GpuUnits> {
    let (whole, frac) = match s.split_once('.') {
        Some((whole, frac)) if !frac.is_empty() && frac.len() <= 3 => (whole, frac),
        Some(_) => return None,
        None => (s, ""),
    };
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|c| c.is_ascii_digit());
    if !digits(whole) || !(frac.is_empty() || digits(frac)) {
        return None;
    }
    let whole: u64 = whole.parse().ok()?;
    let milli: u64 = format!("{frac:0<3}").parse().ok()?;
    Some(GpuUnits(whole.checked_mul(1000)?.checked_add(milli)?))
}

/// Milliseconds since the epoch of `YYYY-MM-DDTHH:MM:SS.mmmZ`, the only form version 1 wrote.
fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let separators = [
        (4, b'-'),
        (7, b'-'),
        (10, b'T'),
        (13, b':'),
        (16, b':'),
        (19, b'.'),
        (23, b'Z'),
    ];
    if b.len() != 24 || separators.iter().any(|&(i, c)| b[i] != c) {
        return None;
    }
    s.parse::<jiff::Timestamp>().ok().map(|t| t.as_millisecond())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_as_version_1_printed_them() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00.000Z"), Some(0));
        assert_eq!(parse_rfc3339_ms("2024-02-29T12:34:56.789Z"), Some(1_709_210_096_789));
        assert_eq!(parse_rfc3339_ms("1999-12-31T23:59:59.999Z"), Some(946_684_799_999));
        assert_eq!(parse_rfc3339_ms("2000-03-01T00:00:00.001Z"), Some(951_868_800_001));
        assert_eq!(parse_rfc3339_ms("2023-11-14T22:13:20.000Z"), Some(1_700_000_000_000));
        for bad in [
            "",
            "2024-02-29T12:34:56Z",
            "2024-02-29 12:34:56.789Z",
            "2024-13-01T00:00:00.000Z",
            "2024-02-29T24:00:00.000Z",
            "2024-02-29T12:34:56.78xZ",
            "2024-02-29T12:34:56.789+00:00",
        ] {
            assert_eq!(parse_rfc3339_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn units_parse_to_exact_thousandths() {
        for (text, milli) in [
            ("1", 1000),
            ("0.5", 500),
            ("0.125", 125),
            ("22.5", 22_500),
            ("0", 0),
            ("8", 8000),
        ] {
            assert_eq!(parse_units(text), Some(GpuUnits(milli)), "{text}");
        }
        for bad in ["", ".5", "1.", "0.1250", "-1", "1e3", "one", "1.2.3"] {
            assert_eq!(parse_units(bad), None, "{bad}");
        }
    }
}
