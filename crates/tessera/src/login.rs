//! `tessera login` / `tessera logout`: keep a credential for a server in
//! `$XDG_CONFIG_HOME/tessera/credentials.json` (or `~/.config/...`), readable by the user only.
//!
//! `tessera login` takes a token pasted on standard input (an API token, or an access token
//! from the organisation's identity provider), checks it against the server, and stores it.

use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{Context, Result, anyhow, bail};

use crate::client::Connection;

pub fn credentials_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("tessera").join("credentials.json"))
}

fn load() -> BTreeMap<String, String> {
    credentials_path()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

/// The stored credential for `server`, if any.
pub fn stored_token(server: &str) -> Option<String> {
    load().get(server.trim_end_matches('/')).cloned()
}

fn save(all: &BTreeMap<String, String>) -> Result<PathBuf> {
    let path = credentials_path().ok_or_else(|| anyhow!("cannot find a home directory for the credentials file"))?;
    let dir = path.parent().expect("a file path has a parent");
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = path.with_extension("tmp");
    {
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut f = opts
            .open(&tmp)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        f.write_all(serde_json::to_string_pretty(all)?.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

pub async fn login(conn: &Connection) -> Result<()> {
    let server = conn.base_url();
    let token = match &conn.token {
        Some(t) => t.trim().to_string(),
        None => {
            if std::io::stdin().is_terminal() {
                eprint!("Paste an API token or an access token for {server}: ");
                std::io::stderr().flush().ok();
            }
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line)?;
            line.trim().to_string()
        }
    };
    if token.is_empty() {
        bail!("no token given");
    }
    // Check it before storing it.
    let r = reqwest::Client::new()
        .get(format!("{server}/api/v1/tenants?limit=1"))
        .bearer_auth(&token)
        .send()
        .await
        .map_err(|e| anyhow!("cannot reach the Tessera server at {server}: {e}"))?;
    if !r.status().is_success() {
        bail!("the server at {server} refused this token ({})", r.status());
    }
    let mut all = load();
    all.insert(server.clone(), token);
    let path = save(&all)?;
    println!(
        "logged in to {server}; credential stored in {} (mode 0600)",
        path.display()
    );
    Ok(())
}

pub fn logout(conn: &Connection) -> Result<()> {
    let server = conn.base_url();
    let mut all = load();
    if all.remove(&server).is_none() {
        println!("no stored credential for {server}");
        return Ok(());
    }
    let path = save(&all)?;
    println!("credential for {server} removed from {}", path.display());
    Ok(())
}
