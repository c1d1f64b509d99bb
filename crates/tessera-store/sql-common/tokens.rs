//! API tokens ([`TokenStore`]); only hashes of their secrets are stored.

use async_trait::async_trait;
use sqlx::Row;
use tessera_store::{PLATFORM_ADMIN, Result, Revocation, TokenRecord, TokenStore};

use crate::driver::{DbRow, LOCK_REVOCATION, NOTIFY_REVOCATION, Store};
use crate::{col, db, db_error, u64_of};

fn token_row(r: &DbRow) -> Result<TokenRecord> {
    Ok(TokenRecord {
        id: col(r, "id")?,
        hash: col(r, "hash")?,
        tenant: col(r, "tenant")?,
        role: col(r, "role")?,
        name: col(r, "name")?,
        created_at: col(r, "created_at")?,
        expires_at: col(r, "expires_at")?,
        revoked_at: col(r, "revoked_at")?,
    })
}

#[async_trait]
impl TokenStore for Store {
    async fn create_token(&self, t: &TokenRecord) -> Result<()> {
        sqlx::query(
            "INSERT INTO api_tokens (id, hash, tenant, role, name, created_at, expires_at, revoked_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&t.id)
        .bind(&t.hash)
        .bind(&t.tenant)
        .bind(&t.role)
        .bind(&t.name)
        .bind(t.created_at)
        .bind(t.expires_at)
        .bind(t.revoked_at)
        .execute(&mut *self.conn().await?)
        .await
        .map_err(|e| db_error(e, || format!("token `{}` (or one with the same secret)", t.id)))?;
        Ok(())
    }

    async fn find_token(&self, hash: &str) -> Result<Option<TokenRecord>> {
        let row = sqlx::query(
            "SELECT id, hash, tenant, role, name, created_at, expires_at, revoked_at FROM api_tokens WHERE hash = $1",
        )
        .bind(hash)
        .fetch_optional(&mut *self.conn().await?)
        .await
        .map_err(db)?;
        row.as_ref().map(token_row).transpose()
    }

    async fn get_token(&self, id: &str) -> Result<Option<TokenRecord>> {
        let row = sqlx::query(
            "SELECT id, hash, tenant, role, name, created_at, expires_at, revoked_at FROM api_tokens WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&mut *self.conn().await?)
        .await
        .map_err(db)?;
        row.as_ref().map(token_row).transpose()
    }

    async fn list_tokens(&self, tenant: Option<&str>) -> Result<Vec<TokenRecord>> {
        let rows = sqlx::query(
            "SELECT id, hash, tenant, role, name, created_at, expires_at, revoked_at FROM api_tokens \
             WHERE ($1 IS NULL OR tenant = $1) ORDER BY created_at DESC, id",
        )
        .bind(tenant)
        .fetch_all(&mut *self.conn().await?)
        .await
        .map_err(db)?;
        rows.iter().map(token_row).collect()
    }

    async fn revoke_token(&self, id: &str, at: i64) -> Result<Revocation> {
        // The token and every lasting platform-admin token are locked first (see
        // `driver::LOCK_REVOCATION`); a revocation racing this one waits, then sees what this
        // one left.
        let mut tx = self.begin_write().await?;
        let rows = sqlx::query(LOCK_REVOCATION)
            .bind(id)
            .bind(PLATFORM_ADMIN)
            .fetch_all(&mut *tx)
            .await
            .map_err(db)?;
        let mut target = None;
        let mut other_admins = 0;
        for r in &rows {
            let rid: String = col(r, "id")?;
            if rid == id {
                target = Some((col::<String>(r, "role")?, col::<Option<i64>>(r, "revoked_at")?));
            } else {
                other_admins += 1;
            }
        }
        let outcome = match target {
            None | Some((_, Some(_))) => Revocation::NotActive,
            Some((role, None)) if role == PLATFORM_ADMIN && other_admins == 0 => Revocation::LastPlatformAdmin,
            Some(_) => {
                sqlx::query("UPDATE api_tokens SET revoked_at = $1 WHERE id = $2")
                    .bind(at)
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
                if let Some(notify) = NOTIFY_REVOCATION {
                    sqlx::query(notify).bind(id).execute(&mut *tx).await.map_err(db)?;
                }
                Revocation::Revoked
            }
        };
        tx.commit().await.map_err(db)?;
        Ok(outcome)
    }

    async fn revocations(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<String>> {
        crate::driver::revocations(self).await
    }

    async fn token_count(&self) -> Result<u64> {
        let n: i64 = sqlx::query("SELECT COUNT(*) FROM api_tokens")
            .fetch_one(&mut *self.conn().await?)
            .await
            .map_err(db)?
            .try_get(0)
            .map_err(db)?;
        Ok(u64_of(n))
    }
}
