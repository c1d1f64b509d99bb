//! API tokens ([`TokenStore`](tessera_store::TokenStore)); only hashes of their secrets are stored.
//!
//! One generic function per method of `TokenStore`, of the same name, for any [`Driver`]
//! (`revocations` is the driver's [`revocation_news`](crate::Driver::revocation_news));
//! [`implement_store!`](crate::implement_store) calls them.

use tessera_store::{PLATFORM_ADMIN, Result, Revocation, TokenRecord};

use crate::{Driver, Row, col, db, db_error, query, read_optional, u64_of};

fn token_row(r: &impl Row) -> Result<TokenRecord> {
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

pub async fn create_token<D: Driver>(s: &D, t: &TokenRecord) -> Result<()> {
    query::<D>(
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
    .execute(&mut *s.conn().await?)
    .await
    .map_err(|e| db_error(e, || format!("token `{}` (or one with the same secret)", t.id)))?;
    Ok(())
}

pub async fn find_token<D: Driver>(s: &D, hash: &str) -> Result<Option<TokenRecord>> {
    let q = query::<D>(
        "SELECT id, hash, tenant, role, name, created_at, expires_at, revoked_at FROM api_tokens WHERE hash = $1",
    )
    .bind(hash);
    read_optional(s, q, token_row).await
}

pub async fn get_token<D: Driver>(s: &D, id: &str) -> Result<Option<TokenRecord>> {
    let q = query::<D>(
        "SELECT id, hash, tenant, role, name, created_at, expires_at, revoked_at FROM api_tokens WHERE id = $1",
    )
    .bind(id);
    read_optional(s, q, token_row).await
}

pub async fn list_tokens<D: Driver>(s: &D, tenant: Option<&str>) -> Result<Vec<TokenRecord>> {
    let rows = query::<D>(
        "SELECT id, hash, tenant, role, name, created_at, expires_at, revoked_at FROM api_tokens \
         WHERE ($1 IS NULL OR tenant = $1) ORDER BY created_at DESC, id",
    )
    .bind(tenant)
    .fetch_all(&mut *s.conn().await?)
    .await
    .map_err(db)?;
    rows.iter().map(token_row).collect()
}

pub async fn revoke_token<D: Driver>(s: &D, id: &str, at: i64) -> Result<Revocation> {
    // The token and every lasting platform-admin token are locked first (see
    // `Driver::LOCK_REVOCATION`); a revocation racing this one waits, then sees what this
    // one left.
    let mut tx = s.begin_write().await?;
    let rows = query::<D>(D::LOCK_REVOCATION)
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
            query::<D>("UPDATE api_tokens SET revoked_at = $1 WHERE id = $2")
                .bind(at)
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
            if let Some(notify) = D::NOTIFY_REVOCATION {
                query::<D>(notify).bind(id).execute(&mut *tx).await.map_err(db)?;
            }
            Revocation::Revoked
        }
    };
    D::commit(tx).await?;
    Ok(outcome)
}

pub async fn token_count<D: Driver>(s: &D) -> Result<u64> {
    let n: i64 = query::<D>("SELECT COUNT(*) AS n FROM api_tokens")
        .fetch_one(&mut *s.conn().await?)
        .await
        .map_err(db)
        .and_then(|r| col(&r, "n"))?;
    Ok(u64_of(n))
}
