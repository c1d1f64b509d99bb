//! Quotas and monthly budgets ([`GovernanceStore`]).

use async_trait::async_trait;
use sqlx::Row;
use tessera_store::{GovernanceStore, QuotaRecord, Result};

use crate::driver::Store;
use crate::{col, db, i64_of, u64_of};

#[async_trait]
impl GovernanceStore for Store {
    async fn set_quota(&self, q: &QuotaRecord, at: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO quotas (tenant, class, guaranteed_milli, limit_milli, updated_at) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (tenant, class) DO UPDATE SET guaranteed_milli = $3, limit_milli = $4, updated_at = $5",
        )
        .bind(&q.tenant)
        .bind(&q.class)
        .bind(i64_of(q.guaranteed_milli))
        .bind(q.limit_milli.map(i64_of))
        .bind(at)
        .execute(&mut *self.conn().await?)
        .await
        .map_err(db)?;
        Ok(())
    }

    async fn delete_quota(&self, tenant: &str, class: &str) -> Result<bool> {
        let r = sqlx::query("DELETE FROM quotas WHERE tenant = $1 AND class = $2")
            .bind(tenant)
            .bind(class)
            .execute(&mut *self.conn().await?)
            .await
            .map_err(db)?;
        Ok(r.rows_affected() > 0)
    }

    async fn quotas(&self) -> Result<Vec<QuotaRecord>> {
        let rows =
            sqlx::query("SELECT tenant, class, guaranteed_milli, limit_milli FROM quotas ORDER BY tenant, class")
                .fetch_all(&mut *self.conn().await?)
                .await
                .map_err(db)?;
        rows.iter()
            .map(|r| {
                Ok(QuotaRecord {
                    tenant: col(r, "tenant")?,
                    class: col(r, "class")?,
                    guaranteed_milli: u64_of(col(r, "guaranteed_milli")?),
                    limit_milli: col::<Option<i64>>(r, "limit_milli")?.map(u64_of),
                })
            })
            .collect()
    }

    async fn set_budget(&self, tenant: &str, unit_hours: Option<f64>, at: i64) -> Result<()> {
        match unit_hours {
            Some(hours) => sqlx::query(
                "INSERT INTO budgets (tenant, monthly_unit_hours, updated_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (tenant) DO UPDATE SET monthly_unit_hours = $2, updated_at = $3",
            )
            .bind(tenant)
            .bind(hours)
            .bind(at),
            None => sqlx::query("DELETE FROM budgets WHERE tenant = $1").bind(tenant),
        }
        .execute(&mut *self.conn().await?)
        .await
        .map_err(db)?;
        Ok(())
    }

    async fn budgets(&self) -> Result<Vec<(String, f64)>> {
        let rows = sqlx::query("SELECT tenant, monthly_unit_hours FROM budgets ORDER BY tenant")
            .fetch_all(&mut *self.conn().await?)
            .await
            .map_err(db)?;
        rows.iter()
            .map(|r| Ok((r.try_get(0).map_err(db)?, r.try_get(1).map_err(db)?)))
            .collect()
    }
}
