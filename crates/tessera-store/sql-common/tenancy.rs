//! Tenants, their projects and image policies ([`TenancyStore`]).

use async_trait::async_trait;
use sqlx::Row;
use tessera_store::{
    AuditRecord, ImagePolicyRecord, ProjectRecord, Result, StoreError, TenancyChange, TenancyStore, TenantRecord,
};

use crate::driver::{DbRow, LOCK_TENANT, Store};
use crate::{col, db, db_error, i64_of};

fn tenant_row(r: &DbRow) -> Result<TenantRecord> {
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

fn strings(r: &DbRow, name: &str) -> Result<Vec<String>> {
    let text: String = col(r, name)?;
    serde_json::from_str(&text).map_err(|e| StoreError::Corrupt(format!("image_policies.{name}: {e}")))
}

fn priorities_json(classes: Option<&[String]>) -> Option<String> {
    classes.map(|c| serde_json::to_string(c).expect("strings serialise"))
}

fn image_policy_row(r: &DbRow) -> Result<ImagePolicyRecord> {
    Ok(ImagePolicyRecord {
        tenant: col(r, "tenant")?,
        registries: strings(r, "registries")?,
        cosign_keys: strings(r, "cosign_keys")?,
        updated_at: col(r, "updated_at")?,
    })
}

fn project_row(r: &DbRow) -> Result<ProjectRecord> {
    Ok(ProjectRecord {
        tenant: col(r, "tenant")?,
        name: col(r, "name")?,
        created_at: col(r, "created_at")?,
    })
}

#[async_trait]
impl TenancyStore for Store {
    async fn create_tenant(&self, t: &TenantRecord) -> Result<()> {
        sqlx::query("INSERT INTO tenants (name, display_name, created_at, priorities) VALUES ($1, $2, $3, $4)")
            .bind(&t.name)
            .bind(&t.display_name)
            .bind(t.created_at)
            .bind(priorities_json(t.priorities.as_deref()))
            .execute(&mut *self.conn().await?)
            .await
            .map_err(|e| db_error(e, || format!("tenant `{}`", t.name)))?;
        Ok(())
    }

    async fn get_tenant(&self, name: &str) -> Result<Option<TenantRecord>> {
        let row = sqlx::query("SELECT name, display_name, created_at, priorities FROM tenants WHERE name = $1")
            .bind(name)
            .fetch_optional(&mut *self.conn().await?)
            .await
            .map_err(db)?;
        row.as_ref().map(tenant_row).transpose()
    }

    async fn list_tenants(&self, after: Option<&str>, limit: u32) -> Result<Vec<TenantRecord>> {
        let rows = sqlx::query(
            "SELECT name, display_name, created_at, priorities FROM tenants WHERE ($1 IS NULL OR name > $1) \
             ORDER BY name LIMIT $2",
        )
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&mut *self.conn().await?)
        .await
        .map_err(db)?;
        rows.iter().map(tenant_row).collect()
    }

    async fn delete_tenant(&self, name: &str) -> Result<bool> {
        let mut tx = self.begin_write().await?;
        // The row lock keeps projects and tokens from being added meanwhile (their foreign keys
        // wait for it).
        let exists = sqlx::query(LOCK_TENANT)
            .bind(name)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db)?;
        if exists.is_none() {
            tx.rollback().await.map_err(db)?;
            return Ok(false);
        }
        let in_use: i64 = sqlx::query(
            "SELECT (SELECT COUNT(*) FROM projects WHERE tenant = $1) \
             + (SELECT COUNT(*) FROM workloads WHERE tenant = $1) \
             + (SELECT COUNT(*) FROM api_tokens WHERE tenant = $1)",
        )
        .bind(name)
        .fetch_one(&mut *tx)
        .await
        .map_err(db)?
        .try_get(0)
        .map_err(db)?;
        if in_use > 0 {
            tx.rollback().await.map_err(db)?;
            return Ok(false);
        }
        // Quotas and the budget are the tenant's configuration, not its data: they go with it
        // (their foreign keys would refuse the delete otherwise).
        sqlx::query("DELETE FROM quotas WHERE tenant = $1")
            .bind(name)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        sqlx::query("DELETE FROM budgets WHERE tenant = $1")
            .bind(name)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        sqlx::query("DELETE FROM image_policies WHERE tenant = $1")
            .bind(name)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        let deleted = sqlx::query("DELETE FROM tenants WHERE name = $1")
            .bind(name)
            .execute(&mut *tx)
            .await
            .map_err(db)?
            .rows_affected();
        tx.commit().await.map_err(db)?;
        Ok(deleted > 0)
    }

    async fn create_project(&self, p: &ProjectRecord) -> Result<()> {
        sqlx::query("INSERT INTO projects (tenant, name, created_at) VALUES ($1, $2, $3)")
            .bind(&p.tenant)
            .bind(&p.name)
            .bind(p.created_at)
            .execute(&mut *self.conn().await?)
            .await
            .map_err(|e| db_error(e, || format!("project `{}` of tenant `{}`", p.name, p.tenant)))?;
        Ok(())
    }

    async fn get_project(&self, tenant: &str, name: &str) -> Result<Option<ProjectRecord>> {
        let row = sqlx::query("SELECT tenant, name, created_at FROM projects WHERE tenant = $1 AND name = $2")
            .bind(tenant)
            .bind(name)
            .fetch_optional(&mut *self.conn().await?)
            .await
            .map_err(db)?;
        row.as_ref().map(project_row).transpose()
    }

    async fn list_projects(&self, tenant: &str, after: Option<&str>, limit: u32) -> Result<Vec<ProjectRecord>> {
        let rows = sqlx::query(
            "SELECT tenant, name, created_at FROM projects WHERE tenant = $1 AND ($2 IS NULL OR name > $2) \
             ORDER BY name LIMIT $3",
        )
        .bind(tenant)
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&mut *self.conn().await?)
        .await
        .map_err(db)?;
        rows.iter().map(project_row).collect()
    }

    async fn delete_project(&self, tenant: &str, name: &str) -> Result<bool> {
        let mut tx = self.begin_write().await?;
        let in_use: i64 = sqlx::query("SELECT COUNT(*) FROM workloads WHERE tenant = $1 AND project = $2")
            .bind(tenant)
            .bind(name)
            .fetch_one(&mut *tx)
            .await
            .map_err(db)?
            .try_get(0)
            .map_err(db)?;
        if in_use > 0 {
            tx.rollback().await.map_err(db)?;
            return Ok(false);
        }
        let deleted = sqlx::query("DELETE FROM projects WHERE tenant = $1 AND name = $2")
            .bind(tenant)
            .bind(name)
            .execute(&mut *tx)
            .await
            .map_err(db)?
            .rows_affected();
        tx.commit().await.map_err(db)?;
        Ok(deleted > 0)
    }

    async fn set_image_policy(&self, p: &ImagePolicyRecord, audit: &AuditRecord) -> Result<()> {
        let mut tx = self.begin_write().await?;
        // The tenant row (locked where the database can) must exist for the policy to land.
        let exists = sqlx::query(LOCK_TENANT)
            .bind(&p.tenant)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db)?;
        if exists.is_none() {
            tx.rollback().await.map_err(db)?;
            return Err(StoreError::Corrupt(format!("no tenant `{}`", p.tenant)));
        }
        upsert_image_policy(&mut tx, p).await?;
        crate::audit::append(&mut tx, &[audit]).await?;
        tx.commit().await.map_err(db)?;
        Ok(())
    }

    async fn image_policy(&self, tenant: &str) -> Result<Option<ImagePolicyRecord>> {
        let row =
            sqlx::query("SELECT tenant, registries, cosign_keys, updated_at FROM image_policies WHERE tenant = $1")
                .bind(tenant)
                .fetch_optional(&mut *self.conn().await?)
                .await
                .map_err(db)?;
        row.as_ref().map(image_policy_row).transpose()
    }

    async fn delete_image_policy(&self, tenant: &str, audit: &AuditRecord) -> Result<bool> {
        let mut tx = self.begin_write().await?;
        let deleted = sqlx::query("DELETE FROM image_policies WHERE tenant = $1")
            .bind(tenant)
            .execute(&mut *tx)
            .await
            .map_err(db)?
            .rows_affected();
        if deleted == 0 {
            tx.rollback().await.map_err(db)?;
            return Ok(false);
        }
        crate::audit::append(&mut tx, &[audit]).await?;
        tx.commit().await.map_err(db)?;
        Ok(true)
    }

    async fn set_tenant_priorities(
        &self,
        tenant: &str,
        classes: Option<&[String]>,
        audit: &AuditRecord,
    ) -> Result<bool> {
        let mut tx = self.begin_write().await?;
        let updated = sqlx::query("UPDATE tenants SET priorities = $2 WHERE name = $1")
            .bind(tenant)
            .bind(priorities_json(classes))
            .execute(&mut *tx)
            .await
            .map_err(db)?
            .rows_affected();
        if updated == 0 {
            tx.rollback().await.map_err(db)?;
            return Ok(false);
        }
        crate::audit::append(&mut tx, &[audit]).await?;
        tx.commit().await.map_err(db)?;
        Ok(true)
    }

    async fn apply_tenancy(&self, changes: &[TenancyChange], audit: &[AuditRecord]) -> Result<()> {
        let mut tx = self.begin_write().await?;
        // Every tenant a change names exists (created by an earlier change or before), its
        // row locked where the database can: checked once per tenant.
        let mut present: Vec<&str> = Vec::new();
        for ch in changes {
            let tenant = match ch {
                TenancyChange::CreateTenant(t) => {
                    sqlx::query(
                        "INSERT INTO tenants (name, display_name, created_at, priorities) VALUES ($1, $2, $3, $4)",
                    )
                    .bind(&t.name)
                    .bind(&t.display_name)
                    .bind(t.created_at)
                    .bind(priorities_json(t.priorities.as_deref()))
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| db_error(e, || format!("tenant `{}`", t.name)))?;
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
                let exists = sqlx::query(LOCK_TENANT)
                    .bind(tenant)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(db)?;
                if exists.is_none() {
                    tx.rollback().await.map_err(db)?;
                    return Err(StoreError::Corrupt(format!("no tenant `{tenant}`")));
                }
                present.push(tenant);
            }
            match ch {
                TenancyChange::CreateTenant(_) => unreachable!("handled above"),
                TenancyChange::SetPriorities { tenant, classes } => {
                    sqlx::query("UPDATE tenants SET priorities = $2 WHERE name = $1")
                        .bind(tenant)
                        .bind(priorities_json(classes.as_deref()))
                        .execute(&mut *tx)
                        .await
                        .map_err(db)?;
                }
                TenancyChange::CreateProject(p) => {
                    sqlx::query("INSERT INTO projects (tenant, name, created_at) VALUES ($1, $2, $3)")
                        .bind(&p.tenant)
                        .bind(&p.name)
                        .bind(p.created_at)
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| db_error(e, || format!("project `{}` of tenant `{}`", p.name, p.tenant)))?;
                }
                TenancyChange::SetQuota { quota: q, at } => {
                    sqlx::query(
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
                    sqlx::query("DELETE FROM quotas WHERE tenant = $1 AND class = $2")
                        .bind(tenant)
                        .bind(class)
                        .execute(&mut *tx)
                        .await
                        .map_err(db)?;
                }
                TenancyChange::SetBudget { tenant, unit_hours, at } => {
                    match unit_hours {
                        Some(hours) => sqlx::query(
                            "INSERT INTO budgets (tenant, monthly_unit_hours, updated_at) VALUES ($1, $2, $3) \
                             ON CONFLICT (tenant) DO UPDATE SET monthly_unit_hours = $2, updated_at = $3",
                        )
                        .bind(tenant)
                        .bind(*hours)
                        .bind(*at),
                        None => sqlx::query("DELETE FROM budgets WHERE tenant = $1").bind(tenant),
                    }
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
                }
                TenancyChange::SetImagePolicy(p) => upsert_image_policy(&mut tx, p).await?,
            }
        }
        let refs: Vec<&AuditRecord> = audit.iter().collect();
        crate::audit::append(&mut tx, &refs).await?;
        tx.commit().await.map_err(db)?;
        Ok(())
    }
}

/// Writes a tenant's image policy (inserted or replaced), inside the caller's transaction.
async fn upsert_image_policy(tx: &mut crate::driver::DbConnection, p: &ImagePolicyRecord) -> Result<()> {
    let json = |v: &Vec<String>| serde_json::to_string(v).expect("strings serialise");
    sqlx::query(
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
