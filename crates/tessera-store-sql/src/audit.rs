//! The append-only audit log ([`AuditStore`](tessera_store::AuditStore)), and the append that both
//! [`AuditStore::append_audit`](tessera_store::AuditStore::append_audit) and a lifecycle batch's
//! `Change::Audit` records use: sequence numbers come from the `audit` row of the `sequences`
//! table, taken inside the appending transaction.
//!
//! One generic function per method of `AuditStore`, of the same name, for any [`Driver`];
//! [`implement_store!`](crate::implement_store) calls them.

use std::sync::LazyLock;

use tessera_store::{AuditRecord, Result};

use crate::rows::{self, MultiRow, Values};
use crate::{Driver, Row, col, db, i64_of, narrow, query, u64_of};

/// The columns of `audit_log` after `seq`, in the order [`record_values`] binds them.
pub const AFTER_SEQ: &str = "at, request_id, actor, tenant, action, target, outcome, detail";

pub static INSERT: LazyLock<MultiRow> = LazyLock::new(|| {
    MultiRow::new(
        "INSERT INTO audit_log (seq, at, request_id, actor, tenant, action, target, outcome, detail) VALUES ",
        9,
        "",
    )
});

/// The records of a batch without their sequence numbers ([`AFTER_SEQ`]), which
/// [`Driver::execute_one_statement`](crate::Driver::execute_one_statement) numbers.
pub static UNNUMBERED: LazyLock<MultiRow> = LazyLock::new(|| {
    MultiRow::new(
        "INSERT INTO audit_log (at, request_id, actor, tenant, action, target, outcome, detail) VALUES ",
        8,
        "",
    )
});

/// Takes `$1` audit sequence numbers and returns the last of them (`value`), inside the
/// caller's transaction. The row lock it takes holds every other appender until the caller
/// commits, so the numbers of one append are consecutive and later appends get higher ones.
pub const NEXT_NUMBERS: &str = "UPDATE sequences SET value = value + $1 WHERE name = 'audit' RETURNING value";

/// The values of a record after its sequence number ([`AFTER_SEQ`]).
pub fn record_values<'q>(q: Values<'q>, a: &'q &AuditRecord) -> Result<Values<'q>> {
    Ok(q.bind(a.at)
        .bind(a.request_id.as_str())
        .bind(a.actor.as_str())
        .bind(a.tenant.as_deref())
        .bind(a.action.as_str())
        .bind(a.target.as_str())
        .bind(i64::from(a.outcome))
        .bind(a.detail.as_str()))
}

fn audit_row(r: &impl Row) -> Result<AuditRecord> {
    Ok(AuditRecord {
        seq: u64_of(col(r, "seq")?),
        at: col(r, "at")?,
        request_id: col(r, "request_id")?,
        actor: col(r, "actor")?,
        tenant: col(r, "tenant")?,
        action: col(r, "action")?,
        target: col(r, "target")?,
        outcome: narrow(col(r, "outcome")?, "outcome")?,
        detail: col(r, "detail")?,
    })
}

/// Appends `records` (inside the caller's transaction) and returns their sequence numbers, in
/// order.
pub async fn append<D: Driver>(conn: &mut D::Connection, records: &[&AuditRecord]) -> Result<Vec<u64>> {
    if records.is_empty() {
        return Ok(Vec::new());
    }
    let n = records.len() as i64;
    let last: i64 = query::<D>(NEXT_NUMBERS)
        .bind(n)
        .fetch_one(&mut *conn)
        .await
        .map_err(db)
        .and_then(|r| col(&r, "value"))?;
    let first = last - n + 1;
    let numbered: Vec<(i64, &AuditRecord)> = (first..).zip(records.iter().copied()).collect();
    rows::execute::<D, _>(
        conn,
        &INSERT,
        &numbered,
        |q, (seq, a)| record_values(q.bind(*seq), a),
        |e, _| db(e),
    )
    .await?;
    Ok(numbered.into_iter().map(|(seq, _)| u64_of(seq)).collect())
}

pub async fn append_audit<D: Driver>(s: &D, records: &[AuditRecord]) -> Result<Vec<u64>> {
    if records.is_empty() {
        return Ok(Vec::new());
    }
    let mut tx = s.begin_write().await?;
    let seqs = append::<D>(&mut tx, &records.iter().collect::<Vec<_>>()).await?;
    D::commit(tx).await?;
    Ok(seqs)
}

pub async fn audit<D: Driver>(
    s: &D,
    tenant: Option<&str>,
    before: Option<u64>,
    limit: u32,
) -> Result<Vec<AuditRecord>> {
    // A statement per case, so that a tenant's page walks the `(tenant, seq)` index instead
    // of the whole log.
    let q = match tenant {
        Some(tenant) => query::<D>(
            "SELECT seq, at, request_id, actor, tenant, action, target, outcome, detail FROM audit_log \
             WHERE tenant = $1 AND seq < $2 ORDER BY seq DESC LIMIT $3",
        )
        .bind(tenant),
        None => query::<D>(
            "SELECT seq, at, request_id, actor, tenant, action, target, outcome, detail FROM audit_log \
             WHERE seq < $1 ORDER BY seq DESC LIMIT $2",
        ),
    };
    let rows = q
        .bind(before.map_or(i64::MAX, i64_of))
        .bind(i64::from(limit))
        .fetch_all(&mut *s.conn().await?)
        .await
        .map_err(db)?;
    rows.iter().map(audit_row).collect()
}
