//! API tokens ([`TokenStore`]); only hashes of their secrets are stored.

use async_trait::async_trait;
use sqlx::Row;
use sqlx::sqlite::SqliteRow;
use tessera_store::{PLATFORM_ADMIN, Result, Revocation, TokenRecord, TokenStore};

use crate::{SqliteStore, col, db, db_error, u64_of};

fn token_row(r: &SqliteRow) -> Result<TokenRecord> {
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
impl TokenStore for SqliteStore {
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
        .execute(&self.pool)
        .await
        .map_err(|e| db_error(e, || format!("token `{}` (or one with the same secret)", t.id)))?;
        Ok(())
    }

    async fn find_token(&self, hash: &str) -> Result<Option<TokenRecord>> {
        let row = sqlx::query(
            "SELECT id, hash, tenant, role, name, created_at, expires_at, revoked_at FROM api_tokens WHERE hash = $1",
        )
        .bind(hash)
        .fetch_optional(&self.pool)
        .await
        .map_err(db)?;
        row.as_ref().map(token_row).transpose()
    }

    async fn get_token(&self, id: &str) -> Result<Option<TokenRecord>> {
        let row = sqlx::query(
            "SELECT id, hash, tenant, role, name, created_at, expires_at, revoked_at FROM api_tokens WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
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
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        rows.iter().map(token_row).collect()
    }

    async fn revoke_token(&self, id: &str, at: i64) -> Result<Revocation> {
        // One statement: the guard and the update cannot be interleaved with another revocation.
        let r = sqlx::query(
            "UPDATE api_tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL \
             AND (role <> $3 OR EXISTS (SELECT 1 FROM api_tokens o WHERE o.id <> $2 AND o.role = $3 \
                  AND o.revoked_at IS NULL AND o.expires_at IS NULL))",
        )
        .bind(at)
        .bind(id)
        .bind(PLATFORM_ADMIN)
        .execute(&self.pool)
        .await
        .map_err(db)?;
        if r.rows_affected() > 0 {
            return Ok(Revocation::Revoked);
        }
        let active = sqlx::query("SELECT 1 FROM api_tokens WHERE id = $1 AND revoked_at IS NULL")
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(db)?;
        Ok(if active.is_some() {
            Revocation::LastPlatformAdmin
        } else {
            Revocation::NotActive
        })
    }

    async fn token_count(&self) -> Result<u64> {
        let n: i64 = sqlx::query("SELECT COUNT(*) FROM api_tokens")
            .fetch_one(&self.pool)
            .await
            .map_err(db)?
            .try_get(0)
            .map_err(db)?;
        Ok(u64_of(n))
    }
}
