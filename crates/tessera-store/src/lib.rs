//! # tessera-store
//!
//! Tessera's durable state: tenants, projects, API tokens (hashed), workloads, their event
//! timelines, idempotency keys and usage intervals. SQLite (WAL, `synchronous=FULL`) is the
//! embedded default; the migration set in `migrations/` is portable SQL so that a PostgreSQL
//! implementation reuses it unchanged.
//!
//! Writes go through [`Store::apply`]: a batch of [`Change`]s committed in **one transaction**,
//! so a state change and its events (and its usage interval) land together or not at all. The
//! control plane batches concurrent requests into one commit (group commit) and acknowledges
//! them only after it.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::Row;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use tessera_api::{Event, Project, Tenant, Workload, WorkloadState, rfc3339_ms};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("stored document is corrupt: {0}")]
    Corrupt(String),
    #[error("{0} already exists")]
    Conflict(String),
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// A token record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRecord {
    pub id: String,
    pub tenant: Option<String>,
    pub role: String,
    pub name: String,
    pub expires_at: Option<i64>,
    pub revoked: bool,
}

/// An event to append to a workload's timeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewEvent {
    pub seq: u32,
    pub step: &'static str,
    pub at: i64,
    pub detail: String,
}

/// One usage interval of the ledger.
#[derive(Clone, Debug, PartialEq)]
pub struct UsageInterval {
    pub workload_id: u64,
    pub seq: u32,
    pub tenant: String,
    pub project: String,
    pub pool: String,
    pub model: String,
    pub shape: String,
    pub units_milli: u64,
    pub started_at: i64,
    pub ended_at: Option<i64>,
    /// Measured average utilisation (0..1) over the interval.
    pub util_avg: Option<f64>,
}

/// One audit record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditRecord {
    pub seq: u64,
    pub at: i64,
    pub request_id: String,
    /// Token id, OIDC subject, or `anonymous`.
    pub actor: String,
    pub tenant: Option<String>,
    /// E.g. `POST /api/v1/workloads`, `auth.failure`, `login`.
    pub action: String,
    pub target: String,
    /// HTTP status of the outcome.
    pub outcome: u16,
    pub detail: String,
}

/// A stored token (never the secret).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenInfo {
    pub id: String,
    pub tenant: Option<String>,
    pub role: String,
    pub name: String,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
}

/// A stored quota.
#[derive(Clone, Debug, PartialEq)]
pub struct QuotaRecord {
    pub tenant: String,
    pub class: String,
    pub guaranteed_milli: u64,
    pub limit_milli: Option<u64>,
}

/// One change of a write batch.
#[derive(Clone, Debug)]
pub enum Change {
    /// A new workload with its first events (and its idempotency key).
    Insert {
        workload: Box<Workload>,
        events: Vec<NewEvent>,
        idempotency: Option<(String, String, String)>,
    },
    /// A workload's new document and the events that explain the change.
    Update {
        workload: Box<Workload>,
        events: Vec<NewEvent>,
    },
    OpenUsage(UsageInterval),
    CloseUsage {
        workload_id: u64,
        seq: u32,
        ended_at: i64,
        util_avg: Option<f64>,
    },
}

/// Filter for listing workloads.
#[derive(Clone, Debug, Default)]
pub struct WorkloadFilter {
    /// The caller's tenant scope: `None` for platform-wide callers. Always applied, whatever
    /// the other filters say (isolation is enforced here, not only in the handlers).
    pub scope: Option<String>,
    pub tenant: Option<String>,
    pub project: Option<String>,
    pub state: Option<WorkloadState>,
    /// Only ids below this (pages go from newest to oldest).
    pub before: Option<u64>,
    pub limit: u32,
}

/// The store.
#[derive(Clone)]
pub struct Store {
    pool: SqlitePool,
}

impl Store {
    /// Opens (creating if needed) `<dir>/tessera.db` and applies the migrations.
    pub async fn open_dir(dir: &Path) -> Result<Store> {
        std::fs::create_dir_all(dir)
            .map_err(|e| StoreError::Corrupt(format!("cannot create {}: {e}", dir.display())))?;
        let opts = SqliteConnectOptions::new()
            .filename(dir.join("tessera.db"))
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        Self::connect(opts, 8).await
    }

    /// An in-memory database (tests).
    pub async fn open_memory() -> Result<Store> {
        let opts = SqliteConnectOptions::from_str("sqlite::memory:")?.foreign_keys(true);
        Self::connect(opts, 1).await
    }

    async fn connect(opts: SqliteConnectOptions, max: u32) -> Result<Store> {
        let pool = SqlitePoolOptions::new()
            .max_connections(max)
            .min_connections(1)
            .connect_with(opts)
            .await?;
        sqlx::migrate!("./migrations").run(&pool).await?;
        Ok(Store { pool })
    }

    // ----- tokens ---------------------------------------------------------------------------

    pub async fn token_count(&self) -> Result<i64> {
        Ok(sqlx::query("SELECT COUNT(*) FROM api_tokens")
            .fetch_one(&self.pool)
            .await?
            .get(0))
    }

    pub async fn create_token(
        &self,
        id: &str,
        hash: &str,
        tenant: Option<&str>,
        role: &str,
        name: &str,
        now: i64,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO api_tokens (id, hash, tenant, role, name, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(id)
        .bind(hash)
        .bind(tenant)
        .bind(role)
        .bind(name)
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Creates a token with an optional expiry.
    #[allow(clippy::too_many_arguments)]
    pub async fn create_token_expiring(
        &self,
        id: &str,
        hash: &str,
        tenant: Option<&str>,
        role: &str,
        name: &str,
        now: i64,
        expires_at: Option<i64>,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO api_tokens (id, hash, tenant, role, name, created_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(id)
        .bind(hash)
        .bind(tenant)
        .bind(role)
        .bind(name)
        .bind(now)
        .bind(expires_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Tokens, optionally of one tenant, newest first.
    pub async fn list_tokens(&self, tenant: Option<&str>) -> Result<Vec<TokenInfo>> {
        let rows = sqlx::query(
            "SELECT id, tenant, role, name, created_at, expires_at, revoked_at FROM api_tokens \
             WHERE ($1 IS NULL OR tenant = $1) ORDER BY created_at DESC, id",
        )
        .bind(tenant)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| TokenInfo {
                id: r.get(0),
                tenant: r.get(1),
                role: r.get(2),
                name: r.get(3),
                created_at: r.get(4),
                expires_at: r.get(5),
                revoked_at: r.get(6),
            })
            .collect())
    }

    /// Revokes a token; `false` if there is no such active token.
    pub async fn revoke_token(&self, id: &str, now: i64) -> Result<bool> {
        let r = sqlx::query("UPDATE api_tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
            .bind(now)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected() > 0)
    }

    // ----- audit ---------------------------------------------------------------------------------

    pub async fn max_audit_seq(&self) -> Result<u64> {
        let v: Option<i64> = sqlx::query("SELECT MAX(seq) FROM audit_log")
            .fetch_one(&self.pool)
            .await?
            .get(0);
        Ok(v.unwrap_or(0) as u64)
    }

    /// Appends audit records in one transaction.
    pub async fn append_audit(&self, records: &[AuditRecord]) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        for a in records {
            sqlx::query(
                "INSERT INTO audit_log (seq, at, request_id, actor, tenant, action, target, outcome, detail) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            )
            .bind(a.seq as i64)
            .bind(a.at)
            .bind(&a.request_id)
            .bind(&a.actor)
            .bind(&a.tenant)
            .bind(&a.action)
            .bind(&a.target)
            .bind(a.outcome as i64)
            .bind(&a.detail)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Audit records, newest first, optionally of one tenant, below `before`.
    pub async fn audit(&self, tenant: Option<&str>, before: Option<u64>, limit: u32) -> Result<Vec<AuditRecord>> {
        let rows = sqlx::query(
            "SELECT seq, at, request_id, actor, tenant, action, target, outcome, detail FROM audit_log \
             WHERE ($1 IS NULL OR tenant = $1) AND seq < $2 ORDER BY seq DESC LIMIT $3",
        )
        .bind(tenant)
        .bind(before.map(|b| b as i64).unwrap_or(i64::MAX))
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| AuditRecord {
                seq: r.get::<i64, _>(0) as u64,
                at: r.get(1),
                request_id: r.get(2),
                actor: r.get(3),
                tenant: r.get(4),
                action: r.get(5),
                target: r.get(6),
                outcome: r.get::<i64, _>(7) as u16,
                detail: r.get(8),
            })
            .collect())
    }

    pub async fn find_token(&self, hash: &str) -> Result<Option<TokenRecord>> {
        let row = sqlx::query("SELECT id, tenant, role, name, expires_at, revoked_at FROM api_tokens WHERE hash = $1")
            .bind(hash)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| TokenRecord {
            id: r.get(0),
            tenant: r.get(1),
            role: r.get(2),
            name: r.get(3),
            expires_at: r.get(4),
            revoked: r.get::<Option<i64>, _>(5).is_some(),
        }))
    }

    // ----- tenants and projects -----------------------------------------------------------------

    pub async fn create_tenant(&self, name: &str, display: &str, now: i64) -> Result<Tenant> {
        let r = sqlx::query("INSERT INTO tenants (name, display_name, created_at) VALUES ($1, $2, $3)")
            .bind(name)
            .bind(display)
            .bind(now)
            .execute(&self.pool)
            .await;
        match r {
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                Err(StoreError::Conflict(format!("tenant `{name}`")))
            }
            Err(e) => Err(e.into()),
            Ok(_) => Ok(Tenant {
                name: name.into(),
                display_name: display.into(),
                created_at: rfc3339_ms(now),
            }),
        }
    }

    pub async fn get_tenant(&self, name: &str) -> Result<Option<Tenant>> {
        let row = sqlx::query("SELECT name, display_name, created_at FROM tenants WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| Tenant {
            name: r.get(0),
            display_name: r.get(1),
            created_at: rfc3339_ms(r.get(2)),
        }))
    }

    /// Tenants ordered by name, after `after`.
    pub async fn list_tenants(&self, after: Option<&str>, limit: u32) -> Result<Vec<Tenant>> {
        let rows =
            sqlx::query("SELECT name, display_name, created_at FROM tenants WHERE name > $1 ORDER BY name LIMIT $2")
                .bind(after.unwrap_or(""))
                .bind(limit as i64)
                .fetch_all(&self.pool)
                .await?;
        Ok(rows
            .into_iter()
            .map(|r| Tenant {
                name: r.get(0),
                display_name: r.get(1),
                created_at: rfc3339_ms(r.get(2)),
            })
            .collect())
    }

    /// Deletes a tenant that has no projects, tokens or workloads left; `false` if it had.
    pub async fn delete_tenant(&self, name: &str) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        let used: i64 = sqlx::query(
            "SELECT (SELECT COUNT(*) FROM projects WHERE tenant = $1) + (SELECT COUNT(*) FROM workloads WHERE tenant = $1) + (SELECT COUNT(*) FROM api_tokens WHERE tenant = $1)",
        )
        .bind(name)
        .fetch_one(&mut *tx)
        .await?
        .get(0);
        if used > 0 {
            return Ok(false);
        }
        sqlx::query("DELETE FROM tenants WHERE name = $1")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    }

    pub async fn create_project(&self, tenant: &str, name: &str, now: i64) -> Result<Project> {
        let r = sqlx::query("INSERT INTO projects (tenant, name, created_at) VALUES ($1, $2, $3)")
            .bind(tenant)
            .bind(name)
            .bind(now)
            .execute(&self.pool)
            .await;
        match r {
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                Err(StoreError::Conflict(format!("project `{name}` in tenant `{tenant}`")))
            }
            Err(e) => Err(e.into()),
            Ok(_) => Ok(Project {
                tenant: tenant.into(),
                name: name.into(),
                created_at: rfc3339_ms(now),
            }),
        }
    }

    pub async fn get_project(&self, tenant: &str, name: &str) -> Result<Option<Project>> {
        let row = sqlx::query("SELECT tenant, name, created_at FROM projects WHERE tenant = $1 AND name = $2")
            .bind(tenant)
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| Project {
            tenant: r.get(0),
            name: r.get(1),
            created_at: rfc3339_ms(r.get(2)),
        }))
    }

    pub async fn list_projects(&self, tenant: &str, after: Option<&str>, limit: u32) -> Result<Vec<Project>> {
        let rows = sqlx::query(
            "SELECT tenant, name, created_at FROM projects WHERE tenant = $1 AND name > $2 ORDER BY name LIMIT $3",
        )
        .bind(tenant)
        .bind(after.unwrap_or(""))
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| Project {
                tenant: r.get(0),
                name: r.get(1),
                created_at: rfc3339_ms(r.get(2)),
            })
            .collect())
    }

    /// Deletes a project without workloads; `false` if it has some.
    pub async fn delete_project(&self, tenant: &str, name: &str) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        let used: i64 = sqlx::query("SELECT COUNT(*) FROM workloads WHERE tenant = $1 AND project = $2")
            .bind(tenant)
            .bind(name)
            .fetch_one(&mut *tx)
            .await?
            .get(0);
        if used > 0 {
            return Ok(false);
        }
        sqlx::query("DELETE FROM projects WHERE tenant = $1 AND name = $2")
            .bind(tenant)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    }

    // ----- workloads ------------------------------------------------------------------------

    pub async fn max_workload_id(&self) -> Result<u64> {
        let v: Option<i64> = sqlx::query("SELECT MAX(id) FROM workloads")
            .fetch_one(&self.pool)
            .await?
            .get(0);
        Ok(v.unwrap_or(0) as u64)
    }

    fn decode(doc: &str) -> Result<Workload> {
        serde_json::from_str(doc).map_err(|e| StoreError::Corrupt(e.to_string()))
    }

    pub async fn get_workload(&self, id: u64) -> Result<Option<Workload>> {
        self.get_workload_in(id, None).await
    }

    /// Workloads that are not in a terminal state, oldest first.
    pub async fn active_workloads(&self) -> Result<Vec<Workload>> {
        let rows = sqlx::query(
            "SELECT doc FROM workloads WHERE state NOT IN ('succeeded', 'failed', 'cancelled', 'preempted') ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Self::decode(r.get(0))).collect()
    }

    /// Newest first.
    pub async fn list_workloads(&self, f: &WorkloadFilter) -> Result<Vec<Workload>> {
        let rows = sqlx::query(
            "SELECT doc FROM workloads WHERE ($1 IS NULL OR tenant = $1) AND ($2 IS NULL OR project = $2) \
             AND ($3 IS NULL OR state = $3) AND id < $4 AND ($6 IS NULL OR tenant = $6) ORDER BY id DESC LIMIT $5",
        )
        .bind(f.tenant.as_deref())
        .bind(f.project.as_deref())
        .bind(f.state.map(|s| s.as_str()))
        .bind(f.before.map(|b| b as i64).unwrap_or(i64::MAX))
        .bind(f.limit as i64)
        .bind(f.scope.as_deref())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Self::decode(r.get(0))).collect()
    }

    /// A workload, if it exists within the caller's tenant scope (`None` = platform-wide).
    pub async fn get_workload_in(&self, id: u64, scope: Option<&str>) -> Result<Option<Workload>> {
        let row = sqlx::query("SELECT doc FROM workloads WHERE id = $1 AND ($2 IS NULL OR tenant = $2)")
            .bind(id as i64)
            .bind(scope)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| Self::decode(r.get(0))).transpose()
    }

    /// A workload's events, within the caller's tenant scope.
    pub async fn events_in(&self, id: u64, scope: Option<&str>) -> Result<Vec<Event>> {
        let rows = sqlx::query(
            "SELECT e.seq, e.step, e.at, e.detail FROM workload_events e JOIN workloads w ON w.id = e.workload_id \
             WHERE e.workload_id = $1 AND ($2 IS NULL OR w.tenant = $2) ORDER BY e.seq",
        )
        .bind(id as i64)
        .bind(scope)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let at: i64 = r.get(2);
                Event {
                    seq: r.get::<i64, _>(0) as u32,
                    step: r.get(1),
                    at: rfc3339_ms(at),
                    at_ms: at,
                    detail: r.get(3),
                }
            })
            .collect())
    }

    /// A workload's events, platform-wide.
    pub async fn events(&self, id: u64) -> Result<Vec<Event>> {
        self.events_in(id, None).await
    }

    /// The highest event and usage sequence numbers of every workload that has any, in two
    /// queries (used at start-up to continue timelines).
    pub async fn sequences(&self) -> Result<std::collections::HashMap<u64, (u32, u32)>> {
        let mut out: std::collections::HashMap<u64, (u32, u32)> = std::collections::HashMap::new();
        let ev = sqlx::query(
            "SELECT e.workload_id, MAX(e.seq) FROM workload_events e JOIN workloads w ON w.id = e.workload_id \
             WHERE w.state NOT IN ('succeeded', 'failed', 'cancelled', 'preempted') GROUP BY e.workload_id",
        )
        .fetch_all(&self.pool)
        .await?;
        for r in ev {
            out.entry(r.get::<i64, _>(0) as u64).or_default().0 = r.get::<i64, _>(1) as u32 + 1;
        }
        let us = sqlx::query(
            "SELECT u.workload_id, MAX(u.seq) FROM usage_intervals u JOIN workloads w ON w.id = u.workload_id \
             WHERE w.state NOT IN ('succeeded', 'failed', 'cancelled', 'preempted') GROUP BY u.workload_id",
        )
        .fetch_all(&self.pool)
        .await?;
        for r in us {
            out.entry(r.get::<i64, _>(0) as u64).or_default().1 = r.get::<i64, _>(1) as u32 + 1;
        }
        Ok(out)
    }

    /// The workload created earlier by `actor` with idempotency `key`, with the request hash.
    pub async fn idempotent(&self, actor: &str, key: &str) -> Result<Option<(String, u64)>> {
        let row = sqlx::query("SELECT request_hash, workload_id FROM idempotency_keys WHERE actor = $1 AND key = $2")
            .bind(actor)
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| (r.get(0), r.get::<i64, _>(1) as u64)))
    }

    pub async fn usage(&self, workload_id: u64) -> Result<Vec<UsageInterval>> {
        let rows = sqlx::query(
            "SELECT workload_id, seq, tenant, project, pool, model, shape, units_milli, started_at, ended_at, util_avg \
             FROM usage_intervals WHERE workload_id = $1 ORDER BY seq",
        )
        .bind(workload_id as i64)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(usage_row).collect())
    }

    /// Usage intervals that overlap `[from, to)`, optionally of one tenant, oldest first.
    pub async fn usage_between(&self, tenant: Option<&str>, from: i64, to: i64) -> Result<Vec<UsageInterval>> {
        let rows = sqlx::query(
            "SELECT workload_id, seq, tenant, project, pool, model, shape, units_milli, started_at, ended_at, util_avg \
             FROM usage_intervals WHERE ($1 IS NULL OR tenant = $1) AND started_at < $3 AND (ended_at IS NULL OR ended_at > $2) \
             ORDER BY started_at, workload_id, seq",
        )
        .bind(tenant)
        .bind(from)
        .bind(to)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(usage_row).collect())
    }

    // ----- quotas and budgets -------------------------------------------------------------------

    pub async fn set_quota(&self, q: &QuotaRecord, now: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO quotas (tenant, class, guaranteed_milli, limit_milli, updated_at) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (tenant, class) DO UPDATE SET guaranteed_milli = $3, limit_milli = $4, updated_at = $5",
        )
        .bind(&q.tenant)
        .bind(&q.class)
        .bind(q.guaranteed_milli as i64)
        .bind(q.limit_milli.map(|l| l as i64))
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn delete_quota(&self, tenant: &str, class: &str) -> Result<bool> {
        let r = sqlx::query("DELETE FROM quotas WHERE tenant = $1 AND class = $2")
            .bind(tenant)
            .bind(class)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected() > 0)
    }

    pub async fn quotas(&self) -> Result<Vec<QuotaRecord>> {
        let rows =
            sqlx::query("SELECT tenant, class, guaranteed_milli, limit_milli FROM quotas ORDER BY tenant, class")
                .fetch_all(&self.pool)
                .await?;
        Ok(rows
            .into_iter()
            .map(|r| QuotaRecord {
                tenant: r.get(0),
                class: r.get(1),
                guaranteed_milli: r.get::<i64, _>(2) as u64,
                limit_milli: r.get::<Option<i64>, _>(3).map(|l| l as u64),
            })
            .collect())
    }

    pub async fn set_budget(&self, tenant: &str, unit_hours: Option<f64>, now: i64) -> Result<()> {
        match unit_hours {
            Some(b) => {
                sqlx::query(
                    "INSERT INTO budgets (tenant, monthly_unit_hours, updated_at) VALUES ($1, $2, $3) \
                     ON CONFLICT (tenant) DO UPDATE SET monthly_unit_hours = $2, updated_at = $3",
                )
                .bind(tenant)
                .bind(b)
                .bind(now)
                .execute(&self.pool)
                .await?;
            }
            None => {
                sqlx::query("DELETE FROM budgets WHERE tenant = $1")
                    .bind(tenant)
                    .execute(&self.pool)
                    .await?;
            }
        }
        Ok(())
    }

    pub async fn budgets(&self) -> Result<Vec<(String, f64)>> {
        let rows = sqlx::query("SELECT tenant, monthly_unit_hours FROM budgets ORDER BY tenant")
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// Commits a batch of changes in one transaction.
    pub async fn apply(&self, batch: &[Change]) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        for c in batch {
            match c {
                Change::Insert {
                    workload,
                    events,
                    idempotency,
                } => {
                    let doc = serde_json::to_string(&**workload).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                    let now = events.first().map(|e| e.at).unwrap_or(0);
                    sqlx::query(
                        "INSERT INTO workloads (id, tenant, project, state, created_at, updated_at, doc) VALUES ($1, $2, $3, $4, $5, $5, $6)",
                    )
                    .bind(workload.id as i64)
                    .bind(&workload.tenant)
                    .bind(&workload.project)
                    .bind(workload.state.as_str())
                    .bind(now)
                    .bind(doc)
                    .execute(&mut *tx)
                    .await?;
                    if let Some((actor, key, hash)) = idempotency {
                        sqlx::query(
                            "INSERT INTO idempotency_keys (actor, key, request_hash, workload_id, created_at) VALUES ($1, $2, $3, $4, $5)",
                        )
                        .bind(actor)
                        .bind(key)
                        .bind(hash)
                        .bind(workload.id as i64)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?;
                    }
                    insert_events(&mut tx, workload.id, events).await?;
                }
                Change::Update { workload, events } => {
                    let doc = serde_json::to_string(&**workload).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                    let now = events.last().map(|e| e.at).unwrap_or(0);
                    sqlx::query("UPDATE workloads SET state = $1, updated_at = $2, doc = $3 WHERE id = $4")
                        .bind(workload.state.as_str())
                        .bind(now)
                        .bind(doc)
                        .bind(workload.id as i64)
                        .execute(&mut *tx)
                        .await?;
                    insert_events(&mut tx, workload.id, events).await?;
                }
                Change::OpenUsage(u) => {
                    sqlx::query(
                        "INSERT INTO usage_intervals (workload_id, seq, tenant, project, pool, model, shape, units_milli, started_at) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                    )
                    .bind(u.workload_id as i64)
                    .bind(u.seq as i64)
                    .bind(&u.tenant)
                    .bind(&u.project)
                    .bind(&u.pool)
                    .bind(&u.model)
                    .bind(&u.shape)
                    .bind(u.units_milli as i64)
                    .bind(u.started_at)
                    .execute(&mut *tx)
                    .await?;
                }
                Change::CloseUsage {
                    workload_id,
                    seq,
                    ended_at,
                    util_avg,
                } => {
                    sqlx::query(
                        "UPDATE usage_intervals SET ended_at = $1, util_avg = $4 WHERE workload_id = $2 AND seq = $3 AND ended_at IS NULL",
                    )
                    .bind(ended_at)
                    .bind(*workload_id as i64)
                    .bind(*seq as i64)
                    .bind(util_avg)
                    .execute(&mut *tx)
                    .await?;
                }
            }
        }
        tx.commit().await?;
        Ok(())
    }
}

fn usage_row(r: sqlx::sqlite::SqliteRow) -> UsageInterval {
    UsageInterval {
        workload_id: r.get::<i64, _>(0) as u64,
        seq: r.get::<i64, _>(1) as u32,
        tenant: r.get(2),
        project: r.get(3),
        pool: r.get(4),
        model: r.get(5),
        shape: r.get(6),
        units_milli: r.get::<i64, _>(7) as u64,
        started_at: r.get(8),
        ended_at: r.get(9),
        util_avg: r.get(10),
    }
}

async fn insert_events(tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>, id: u64, events: &[NewEvent]) -> Result<()> {
    for e in events {
        sqlx::query("INSERT INTO workload_events (workload_id, seq, step, at, detail) VALUES ($1, $2, $3, $4, $5)")
            .bind(id as i64)
            .bind(e.seq as i64)
            .bind(e.step)
            .bind(e.at)
            .bind(&e.detail)
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_api::{GpuShape, WorkloadKind};

    fn wl(id: u64, state: WorkloadState) -> Workload {
        Workload {
            id,
            tenant: "vision".into(),
            project: "p".into(),
            name: format!("w{id}"),
            kind: WorkloadKind::Batch,
            shape: GpuShape {
                gpus: Some(1),
                ..Default::default()
            },
            cpu_milli: 1000,
            memory_mib: 1024,
            duration_s: None,
            command: None,
            image: None,
            priority: "standard".into(),
            state,
            borrowing: false,
            reason: None,
            units: "1".into(),
            allocation: None,
            created_at: rfc3339_ms(0),
            created_at_ms: 0,
            running_at: None,
            running_at_ms: None,
            ended_at: None,
            request_to_running_ms: None,
        }
    }

    fn ev(seq: u32, step: &'static str) -> NewEvent {
        NewEvent {
            seq,
            step,
            at: 1000 + seq as i64,
            detail: String::new(),
        }
    }

    #[tokio::test]
    async fn batches_are_atomic() {
        let s = Store::open_memory().await.unwrap();
        s.create_tenant("vision", "Vision", 1).await.unwrap();
        assert!(matches!(
            s.create_tenant("vision", "V", 1).await,
            Err(StoreError::Conflict(_))
        ));
        s.create_project("vision", "p", 1).await.unwrap();
        s.apply(&[Change::Insert {
            workload: Box::new(wl(1, WorkloadState::Pending)),
            events: vec![ev(0, "requested")],
            idempotency: Some(("admin".into(), "k".into(), "h".into())),
        }])
        .await
        .unwrap();
        // A batch whose second change fails (duplicate id) leaves nothing behind.
        let r = s
            .apply(&[
                Change::Update {
                    workload: Box::new(wl(1, WorkloadState::Running)),
                    events: vec![ev(1, "running")],
                },
                Change::Insert {
                    workload: Box::new(wl(1, WorkloadState::Pending)),
                    events: vec![],
                    idempotency: None,
                },
            ])
            .await;
        assert!(r.is_err());
        assert_eq!(s.get_workload(1).await.unwrap().unwrap().state, WorkloadState::Pending);
        assert_eq!(s.events(1).await.unwrap().len(), 1);
        assert_eq!(s.idempotent("admin", "k").await.unwrap(), Some(("h".into(), 1)));
        assert_eq!(s.active_workloads().await.unwrap().len(), 1);
        assert!(!s.delete_tenant("vision").await.unwrap(), "tenant with workloads stays");
        let page = s
            .list_workloads(&WorkloadFilter {
                tenant: Some("vision".into()),
                limit: 10,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(page.len(), 1);
        // The caller's scope is enforced by the query itself.
        let other = s
            .list_workloads(&WorkloadFilter {
                scope: Some("nlp".into()),
                tenant: Some("vision".into()),
                limit: 10,
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(other.is_empty());
        assert!(s.get_workload_in(1, Some("nlp")).await.unwrap().is_none());
        assert!(s.get_workload_in(1, Some("vision")).await.unwrap().is_some());
        assert!(s.events_in(1, Some("nlp")).await.unwrap().is_empty());
        assert_eq!(s.events_in(1, None).await.unwrap().len(), 1);
    }
}
