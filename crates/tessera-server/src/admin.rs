//! The way in for administrators: the first platform-admin token, made when the store has no
//! token at all, and local recovery (`tessera admin recover --data-dir DIR`) for an operator
//! who has lost every admin token. Recovery needs write access to the data directory, which is
//! what proves the operator; it works whether the server runs or not, since a token unknown to
//! a running server is looked up in the store.
//!
//! The API cannot take the last way in away: the store refuses to revoke the last
//! platform-admin token without an expiry (`tessera_store::Revocation::LastPlatformAdmin`).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use tessera_store::{AuditRecord, PLATFORM_ADMIN, Store, TokenRecord};

use crate::auth::{hash, new_secret};
use crate::clock::now_ms;

/// The file the admin token's secret is written to, in the data directory (mode 0600).
pub const ADMIN_TOKEN_FILE: &str = "admin-token";

/// On a store without any token, creates `tok-admin` and writes its secret to
/// [`ADMIN_TOKEN_FILE`]; returns the secret when it did.
pub async fn bootstrap(store: &dyn Store, data_dir: &Path) -> anyhow::Result<Option<String>> {
    if store.token_count().await? > 0 {
        return Ok(None);
    }
    let secret = new_secret();
    store
        .create_token(&TokenRecord {
            id: "tok-admin".into(),
            hash: hash(&secret),
            tenant: None,
            role: PLATFORM_ADMIN.into(),
            name: "admin (created at first start)".into(),
            created_at: now_ms(),
            expires_at: None,
            revoked_at: None,
        })
        .await?;
    write_secret(&data_dir.join(ADMIN_TOKEN_FILE), &secret)?;
    Ok(Some(secret))
}

/// A token made by [`recover`].
#[derive(Debug)]
pub struct Recovered {
    pub id: String,
    pub secret: String,
    /// Where the secret was written.
    pub file: PathBuf,
}

/// Issues a fresh platform-admin token on `store` (which must hold one: a mistyped data
/// directory or database is not silently made into a new, empty platform), writes its secret to
/// [`ADMIN_TOKEN_FILE`] in `data_dir` and puts the recovery on the audit log, naming the local
/// user. Which store is the caller's business (`tessera admin recover` opens the server's);
/// access to it is what proves the operator.
pub async fn recover(store: &dyn Store, data_dir: &Path) -> anyhow::Result<Recovered> {
    if store.token_count().await? == 0 {
        bail!("the store holds no Tessera platform yet (no token at all); start `tessera serve` on it first");
    }
    std::fs::create_dir_all(data_dir).with_context(|| format!("cannot create {}", data_dir.display()))?;
    let secret = new_secret();
    let h = hash(&secret);
    let id = format!("tok-{}", &h[..12]);
    let now = now_ms();
    store
        .create_token(&TokenRecord {
            id: id.clone(),
            hash: h,
            tenant: None,
            role: PLATFORM_ADMIN.into(),
            name: "admin (recovered locally)".into(),
            created_at: now,
            expires_at: None,
            revoked_at: None,
        })
        .await?;
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".into());
    store
        .append_audit(&[AuditRecord {
            seq: 0,
            at: now,
            request_id: format!("local-{}", &new_secret()[4..20]),
            actor: format!("local:{user}"),
            tenant: None,
            action: "admin.recover".into(),
            target: format!("/api/v1/tokens/{id}"),
            outcome: 201,
            detail: format!("platform-admin token {id} issued through the data directory"),
        }])
        .await?;
    let file = data_dir.join(ADMIN_TOKEN_FILE);
    write_secret(&file, &secret)?;
    Ok(Recovered { id, secret, file })
}

/// Writes a secret to a file only its owner can read.
fn write_secret(path: &Path, secret: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    writeln!(f, "{secret}")?;
    Ok(())
}
