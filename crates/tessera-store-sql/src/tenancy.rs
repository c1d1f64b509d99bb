//! Tenants, their projects and image policies ([`TenancyStore`](tessera_store::TenancyStore)).
//!
//! One generic function per method of `TenancyStore`, of the same name, for any [`Driver`];
//! [`implement_store!`](crate::implement_store) calls them.

use tessera_store::{AuditRecord, ImagePolicyRecord, ProjectRecord, Result, StoreError, TenancyChange, TenantRecord};

use crate::{Driver, Query, Row, col, db, db_error, i64_of, query, read_optional};

fn tenant_row(r: &impl Row) -> Result<TenantRecord> {
    Ok(TenantRecord {
        name: col(r, "name")?,
        display_name: col(r, "display_name")?,
        created_at: col(r, "created_at")?,
        priorities: match col::<Option<String>>(r, "priorities")? {
            Some(text) => {
                Some(serde_json::from_str(&text).map_err(|e| StoreError::Corrupt(format!("tenants.priorities: {e}")))?)
            }
            None => None,
        },
    })
}

fn strings(r: &impl Row, name: &str) -> Result<Vec<String>> {
    let text: String = col(r, name)?;
    serde_json::from_str(&text).map_err(|e| StoreError::Corrupt(format!("image_policies.{name}: {e}")))
}

fn priorities_json(classes: Option<&[String]>) -> Option<String> {
    classes.map(|c| serde_json::to_string(c).expect("strings serialise"))
}

fn image_policy_row(r: &impl Row) -> Result<ImagePolicyRecord> {
    Ok(ImagePolicyRecord {
        tenant: col(r, "tenant")?,
        registries: strings(r, "registries")?,
        cosign_keys: strings(r, "cosign_keys")?,
        updated_at: col(r, "updated_at")?,
    })
}

fn project_row(r: &impl Row) -> Result<ProjectRecord> {
    Ok(ProjectRecord {
        tenant: col(r, "tenant")?,
        name: col(r, "name")?,
        created_at: col(r, "created_at")?,
    })
}

/// Inserts tenant `t` on `conn` (`Conflict` naming it if it exists).
async fn insert_tenant<D: Driver>(conn: &mut D::Connection, t: &TenantRecord) -> Result<()> {
    query::<D>("INSERT INTO tenants (name, display_name, created_at, priorities) VALUES ($1, $2, $3, $4)")
        .bind(&t.name)
        .bind(&t.display_name)
        .bind(t.created_at)
        .bind(priorities_json(t.priorities.as_deref()))
        .execute(conn)
        .await
        .map_err(|e| db_error(e, || format!("tenant `{}`", t.name)))?;
    Ok(())
}

/// Inserts project `p` on `conn` (`Conflict` naming it if it exists).
async fn insert_project<D: Driver>(conn: &mut D::Connection, p: &ProjectRecord) -> Result<()> {
    query::<D>("INSERT INTO projects (tenant, name, created_at) VALUES ($1, $2, $3)")
        .bind(&p.tenant)
        .bind(&p.name)
        .bind(p.created_at)
        .execute(conn)
        .await
        .map_err(|e| db_error(e, || format!("project `{}` of tenant `{}`", p.name, p.tenant)))?;
    Ok(())
}

/// Whether tenant `name` exists, its row locked until the transaction `tx` ends where the
/// database has row locks ([`Driver::LOCK_TENANT`]).
async fn lock_tenant<D: Driver>(tx: &mut D::Connection, name: &str) -> Result<bool> {
    let row = query::<D>(D::LOCK_TENANT)
        .bind(name)
        .fetch_optional(tx)
        .await
        .map_err(db)?;
    Ok(row.is_some())
}

pub async fn create_tenant<D: Driver>(s: &D, t: &TenantRecord) -> Result<()> {
    insert_tenant::<D>(&mut *s.conn().await?, t).await
}

pub async fn get_tenant<D: Driver>(s: &D, name: &str) -> Result<Option<TenantRecord>> {
    let q = query::<D>("SELECT name, display_name, created_at, priorities FROM tenants WHERE name = $1").bind(name);
    read_optional(s, q, tenant_row).await
}

pub async fn list_tenants<D: Driver>(s: &D, after: Option<&str>, limit: u32) -> Result<Vec<TenantRecord>> {
    let rows = query::<D>(
        "SELECT name, display_name, created_at, priorities FROM tenants WHERE ($1 IS NULL OR name > $1) \
         ORDER BY name LIMIT $2",
    )
    .bind(after)
    .bind(i64::from(limit))
    .fetch_all(&mut *s.conn().await?)
    .await
    .map_err(db)?;
    rows.iter().map(tenant_row).collect()
}

pub async fn delete_tenant<D: Driver>(s: &D, name: &str) -> Result<bool> {
    let mut tx = s.begin_write().await?;
    // The row lock keeps projects and tokens from being added meanwhile (their foreign keys
    // wait for it).
    if !lock_tenant::<D>(&mut tx, name).await? {
        D::rollback(tx).await?;
        return Ok(false);
    }
    let in_use = query::<D>(
        "SELECT (SELECT COUNT(*) FROM projects WHERE tenant = $1) \
         + (SELECT COUNT(*) FROM workloads WHERE tenant = $1) \
         + (SELECT COUNT(*) FROM api_tokens WHERE tenant = $1) AS in_use",
    )
    .bind(name);
    // Quotas and the budget are the tenant's configuration, not its data: they go with it
    // (their foreign keys would refuse the delete otherwise).
    let deletes = [
        query::<D>("DELETE FROM quotas WHERE tenant = $1").bind(name),
        query::<D>("DELETE FROM budgets WHERE tenant = $1").bind(name),
        query::<D>("DELETE FROM image_policies WHERE tenant = $1").bind(name),
        query::<D>("DELETE FROM tenants WHERE name = $1").bind(name),
    ];
    delete_unused(tx, in_use, deletes).await
}

/// In the write transaction `tx`: where `in_use` counts (as `in_use`) any row that still uses
/// what is to be deleted, `false`, rolled back; otherwise runs `deletes` in order, commits, and
/// says whether the last of them deleted a row.
async fn delete_unused<'a, D: Driver>(
    mut tx: D::Transaction,
    in_use: Query<'a, D>,
    deletes: impl IntoIterator<Item = Query<'a, D>, IntoIter: Send> + Send,
) -> Result<bool> {
    let in_use: i64 = in_use
        .fetch_one(&mut tx)
        .await
        .map_err(db)
        .and_then(|r| col(&r, "in_use"))?;
    if in_use > 0 {
        D::rollback(tx).await?;
        return Ok(false);
    }
    let mut deleted = 0;
    for q in deletes {
        deleted = q.execute(&mut tx).await.map_err(db)?;
    }
    D::commit(tx).await?;
    Ok(deleted > 0)
}

pub async fn create_project<D: Driver>(s: &D, p: &ProjectRecord) -> Result<()> {
    insert_project::<D>(&mut *s.conn().await?, p).await
}

pub async fn get_project<D: Driver>(s: &D, tenant: &str, name: &str) -> Result<Option<ProjectRecord>> {
    let q = query::<D>("SELECT tenant, name, created_at FROM projects WHERE tenant = $1 AND name = $2")
        .bind(tenant)
        .bind(name);
    read_optional(s, q, project_row).await
}

pub async fn list_projects<D: Driver>(
    s: &D,
    tenant: &str,
    after: Option<&str>,
    limit: u32,
) -> Result<Vec<ProjectRecord>> {
    let rows = query::<D>(
        "SELECT tenant, name, created_at FROM projects WHERE tenant = $1 AND ($2 IS NULL OR name > $2) \
         ORDER BY name LIMIT $3",
    )
    .bind(tenant)
    .bind(after)
    .bind(i64::from(limit))
    .fetch_all(&mut *s.conn().await?)
    .await
    .map_err(db)?;
    rows.iter().map(project_row).collect()
}

pub async fn delete_project<D: Driver>(s: &D, tenant: &str, name: &str) -> Result<bool> {
    let tx = s.begin_write().await?;
    let in_use = query::<D>("SELECT COUNT(*) AS in_use FROM workloads WHERE tenant = $1 AND project = $2")
        .bind(tenant)
        .bind(name);
    let delete = query::<D>("DELETE FROM projects WHERE tenant = $1 AND name = $2")
        .bind(tenant)
        .bind(name);
    delete_unused(tx, in_use, [delete]).await
}

pub async fn set_image_policy<D: Driver>(s: &D, p: &ImagePolicyRecord, audit: &AuditRecord) -> Result<()> {
    let mut tx = s.begin_write().await?;
    // The tenant row (locked where the database can) must exist for the policy to land.
    if !lock_tenant::<D>(&mut tx, &p.tenant).await? {
        D::rollback(tx).await?;
        return Err(StoreError::Corrupt(format!("no tenant `{}`", p.tenant)));
    }
    upsert_image_policy::<D>(&mut tx, p).await?;
    crate::audit::append::<D>(&mut tx, &[audit]).await?;
    D::commit(tx).await?;
    Ok(())
}

pub async fn image_policy<D: Driver>(s: &D, tenant: &str) -> Result<Option<ImagePolicyRecord>> {
    let q = query::<D>("SELECT tenant, registries, cosign_keys, updated_at FROM image_policies WHERE tenant = $1")
        .bind(tenant);
    read_optional(s, q, image_policy_row).await
}

/// Runs `q` and appends `audit` in one write transaction; `false`, and nothing written, where
/// `q` changed no row.
async fn change_audited<D: Driver>(s: &D, q: Query<'_, D>, audit: &AuditRecord) -> Result<bool> {
    let mut tx = s.begin_write().await?;
    let changed = q.execute(&mut tx).await.map_err(db)?;
    if changed == 0 {
        D::rollback(tx).await?;
        return Ok(false);
    }
    crate::audit::append::<D>(&mut tx, &[audit]).await?;
    D::commit(tx).await?;
    Ok(true)
}

/// The statement that sets tenant `tenant`'s priority classes.
fn update_priorities<'a, D: Driver>(tenant: &'a str, classes: Option<&[String]>) -> Query<'a, D> {
    query::<D>("UPDATE tenants SET priorities = $2 WHERE name = $1")
        .bind(tenant)
        .bind(priorities_json(classes))
}

pub async fn delete_image_policy<D: Driver>(s: &D, tenant: &str, audit: &AuditRecord) -> Result<bool> {
    change_audited(
        s,
        query::<D>("DELETE FROM image_policies WHERE tenant = $1").bind(tenant),
        audit,
    )
    .await
}

pub async fn set_tenant_priorities<D: Driver>(
    s: &D,
    tenant: &str,
    classes: Option<&[String]>,
    audit: &AuditRecord,
) -> Result<bool> {
    change_audited(s, update_priorities::<D>(tenant, classes), audit).await
}

pub async fn apply_tenancy<D: Driver>(s: &D, changes: &[TenancyChange], audit: &[AuditRecord]) -> Result<()> {
    let mut tx = s.begin_write().await?;
    // Every tenant a change names exists (created by an earlier change or before), its
    // row locked where the database can: checked once per tenant.
    let mut present: Vec<&str> = Vec::new();
    for ch in changes {
        let tenant = match ch {
            TenancyChange::CreateTenant(t) => {
                insert_tenant::<D>(&mut tx, t).await?;
                present.push(&t.name);
                continue;
            }
            TenancyChange::SetPriorities { tenant, .. }
            | TenancyChange::DeleteQuota { tenant, .. }
            | TenancyChange::SetBudget { tenant, .. } => tenant.as_str(),
            TenancyChange::CreateProject(p) => p.tenant.as_str(),
            TenancyChange::SetQuota { quota, .. } => quota.tenant.as_str(),
            TenancyChange::SetImagePolicy(p) => p.tenant.as_str(),
        };
        if !present.contains(&tenant) {
            if !lock_tenant::<D>(&mut tx, tenant).await? {
                D::rollback(tx).await?;
                return Err(StoreError::Corrupt(format!("no tenant `{tenant}`")));
            }
            present.push(tenant);
        }
        match ch {
            TenancyChange::CreateTenant(_) => unreachable!("handled above"),
            TenancyChange::SetPriorities { tenant, classes } => {
                update_priorities::<D>(tenant, classes.as_deref())
                    .execute(&mut tx)
                    .await
                    .map_err(db)?;
            }
            TenancyChange::CreateProject(p) => insert_project::<D>(&mut tx, p).await?,
            TenancyChange::SetQuota { quota: q, at } => {
                query::<D>(
                    "INSERT INTO quotas (tenant, class, guaranteed_milli, limit_milli, updated_at) \
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant, class) DO UPDATE \
                     SET guaranteed_milli = $3, limit_milli = $4, updated_at = $5",
                )
                .bind(&q.tenant)
                .bind(&q.class)
                .bind(i64_of(q.guaranteed_milli))
                .bind(q.limit_milli.map(i64_of))
                .bind(*at)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
            }
            TenancyChange::DeleteQuota { tenant, class } => {
                query::<D>("DELETE FROM quotas WHERE tenant = $1 AND class = $2")
                    .bind(tenant)
                    .bind(class)
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
            }
            TenancyChange::SetBudget { tenant, unit_hours, at } => {
                match unit_hours {
                    Some(hours) => query::<D>(
                        "INSERT INTO budgets (tenant, monthly_unit_hours, updated_at) VALUES ($1, $2, $3) \
                         ON CONFLICT (tenant) DO UPDATE SET monthly_unit_hours = $2, updated_at = $3",
                    )
                    .bind(tenant)
                    .bind(*hours)
                    .bind(*at),
                    None => query::<D>("DELETE FROM budgets WHERE tenant = $1").bind(tenant),
                }
                .execute(&mut *tx)
                .await
                .map_err(db)?;
            }
            TenancyChange::SetImagePolicy(p) => upsert_image_policy::<D>(&mut tx, p).await?,
        }
    }
    let refs: Vec<&AuditRecord> = audit.iter().collect();
    crate::audit::append::<D>(&mut tx, &refs).await?;
    D::commit(tx).await?;
    Ok(())
}

/// Writes a tenant's image policy (inserted or replaced), inside the caller's transaction.
async fn upsert_image_policy<D: Driver>(tx: &mut D::Connection, p: &ImagePolicyRecord) -> Result<()> {
    let json = |v: &Vec<String>| serde_json::to_string(v).expect("strings serialise");
    query::<D>(
        "INSERT INTO image_policies (tenant, registries, cosign_keys, updated_at) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (tenant) DO UPDATE SET registries = excluded.registries, \
         cosign_keys = excluded.cosign_keys, updated_at = excluded.updated_at",
    )
    .bind(&p.tenant)
    .bind(json(&p.registries))
    .bind(json(&p.cosign_keys))
    .bind(p.updated_at)
    .execute(&mut *tx)
    .await
    .map_err(db)?;
    Ok(())
}
