//! The append-only audit log ([`AuditStore`]); sequence numbers come from the `audit` row of
//! the `sequences` table, taken inside the appending transaction.

use async_trait::async_trait;
use sqlx::Row;
use sqlx::sqlite::SqliteRow;
use tessera_store::{AuditRecord, AuditStore, Result};

use crate::{SqliteStore, col, db, i64_of, narrow, u64_of};

fn audit_row(r: &SqliteRow) -> Result<AuditRecord> {
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

#[async_trait]
impl AuditStore for SqliteStore {
    async fn append_audit(&self, records: &[AuditRecord]) -> Result<Vec<u64>> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let n = records.len() as i64;
        let mut tx = self.begin_write().await?;
        // The row lock taken by this update holds every other appender until we commit, so the
        // numbers of one append are consecutive and later appends get higher ones.
        let last: i64 = sqlx::query("UPDATE sequences SET value = value + $1 WHERE name = 'audit' RETURNING value")
            .bind(n)
            .fetch_one(&mut *tx)
            .await
            .map_err(db)?
            .try_get(0)
            .map_err(db)?;
        let first = last - n + 1;
        let mut seqs = Vec::with_capacity(records.len());
        for (i, a) in records.iter().enumerate() {
            let seq = first + i as i64;
            sqlx::query(
                "INSERT INTO audit_log (seq, at, request_id, actor, tenant, action, target, outcome, detail) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            )
            .bind(seq)
            .bind(a.at)
            .bind(&a.request_id)
            .bind(&a.actor)
            .bind(&a.tenant)
            .bind(&a.action)
            .bind(&a.target)
            .bind(i64::from(a.outcome))
            .bind(&a.detail)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
            seqs.push(u64_of(seq));
        }
        tx.commit().await.map_err(db)?;
        Ok(seqs)
    }

    async fn audit(&self, tenant: Option<&str>, before: Option<u64>, limit: u32) -> Result<Vec<AuditRecord>> {
        // A statement per case, so that a tenant's page walks the `(tenant, seq)` index instead
        // of the whole log.
        let q = match tenant {
            Some(tenant) => sqlx::query(
                "SELECT seq, at, request_id, actor, tenant, action, target, outcome, detail FROM audit_log \
                 WHERE tenant = $1 AND seq < $2 ORDER BY seq DESC LIMIT $3",
            )
            .bind(tenant),
            None => sqlx::query(
                "SELECT seq, at, request_id, actor, tenant, action, target, outcome, detail FROM audit_log \
                 WHERE seq < $1 ORDER BY seq DESC LIMIT $2",
            ),
        };
        let rows = q
            .bind(before.map_or(i64::MAX, i64_of))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(db)?;
        rows.iter().map(audit_row).collect()
    }
}
