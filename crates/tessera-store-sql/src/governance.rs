//! Quotas and monthly budgets ([`GovernanceStore`](tessera_store::GovernanceStore)).
//!
//! One generic function per method of `GovernanceStore`, of the same name, for any [`Driver`];
//! [`implement_store!`](crate::implement_store) calls them.

use tessera_store::{QuotaRecord, Result};

use crate::{Driver, col, db, i64_of, query, u64_of};

pub async fn set_quota<D: Driver>(s: &D, q: &QuotaRecord, at: i64) -> Result<()> {
    query::<D>(
        "INSERT INTO quotas (tenant, class, guaranteed_milli, limit_milli, updated_at) VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (tenant, class) DO UPDATE SET guaranteed_milli = $3, limit_milli = $4, updated_at = $5",
    )
    .bind(&q.tenant)
    .bind(&q.class)
    .bind(i64_of(q.guaranteed_milli))
    .bind(q.limit_milli.map(i64_of))
    .bind(at)
    .execute(&mut *s.conn().await?)
    .await
    .map_err(db)?;
    Ok(())
}

pub async fn delete_quota<D: Driver>(s: &D, tenant: &str, class: &str) -> Result<bool> {
    let r = query::<D>("DELETE FROM quotas WHERE tenant = $1 AND class = $2")
        .bind(tenant)
        .bind(class)
        .execute(&mut *s.conn().await?)
        .await
        .map_err(db)?;
    Ok(r > 0)
}

pub async fn quotas<D: Driver>(s: &D) -> Result<Vec<QuotaRecord>> {
    let rows = query::<D>("SELECT tenant, class, guaranteed_milli, limit_milli FROM quotas ORDER BY tenant, class")
        .fetch_all(&mut *s.conn().await?)
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

pub async fn set_budget<D: Driver>(s: &D, tenant: &str, unit_hours: Option<f64>, at: i64) -> Result<()> {
    match unit_hours {
        Some(hours) => query::<D>(
            "INSERT INTO budgets (tenant, monthly_unit_hours, updated_at) VALUES ($1, $2, $3) \
             ON CONFLICT (tenant) DO UPDATE SET monthly_unit_hours = $2, updated_at = $3",
        )
        .bind(tenant)
        .bind(hours)
        .bind(at),
        None => query::<D>("DELETE FROM budgets WHERE tenant = $1").bind(tenant),
    }
    .execute(&mut *s.conn().await?)
    .await
    .map_err(db)?;
    Ok(())
}

pub async fn budgets<D: Driver>(s: &D) -> Result<Vec<(String, f64)>> {
    let rows = query::<D>("SELECT tenant, monthly_unit_hours FROM budgets ORDER BY tenant")
        .fetch_all(&mut *s.conn().await?)
        .await
        .map_err(db)?;
    rows.iter()
        .map(|r| Ok((col(r, "tenant")?, col(r, "monthly_unit_hours")?)))
        .collect()
}
