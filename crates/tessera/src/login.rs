//! `tessera login` / `tessera logout`: keep a credential for a server in
//! `$XDG_CONFIG_HOME/tessera/credentials.json` (or `~/.config/...`), readable by the user only.
//!
//! `tessera login` takes a token pasted on standard input (an API token, or an access token
//! from the organisation's identity provider); `tessera login --sso ISSUER` signs in through the
//! provider with the OAuth device authorization grant. Either way the token is checked against
//! the server before it is stored.

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

/// Single sign-on from the terminal: the OAuth 2.0 device authorization grant (RFC 8628).
#[derive(clap::Args, Default)]
pub struct LoginArgs {
    /// Sign in through the identity provider at this issuer URL instead of pasting a token.
    #[arg(long)]
    pub sso: Option<String>,
    /// The public client registered for the CLI at the provider.
    #[arg(long, default_value = "tessera-cli")]
    pub client_id: String,
    /// Resource indicator asking the provider for a token for Tessera's audience.
    #[arg(long)]
    pub resource: Option<String>,
}

async fn device_login(issuer: &str, a: &LoginArgs) -> Result<String> {
    let http = reqwest::Client::new();
    let disc: serde_json::Value = http
        .get(format!(
            "{}/.well-known/openid-configuration",
            issuer.trim_end_matches('/')
        ))
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .map_err(|e| anyhow!("OIDC discovery at {issuer} failed: {e}"))?
        .json()
        .await?;
    let (Some(device), Some(token)) = (
        disc["device_authorization_endpoint"].as_str(),
        disc["token_endpoint"].as_str(),
    ) else {
        bail!(
            "the provider at {issuer} does not offer the device authorization grant; paste a token instead (`tessera login`)"
        );
    };
    let mut form = vec![("client_id", a.client_id.clone()), ("scope", "openid".to_string())];
    if let Some(r) = &a.resource {
        form.push(("resource", r.clone()));
    }
    let start: serde_json::Value = http.post(device).form(&form).send().await?.json().await?;
    let device_code = start["device_code"]
        .as_str()
        .ok_or_else(|| anyhow!("the provider refused the sign-in: {start}"))?
        .to_string();
    let url = start["verification_uri_complete"]
        .as_str()
        .or(start["verification_uri"].as_str())
        .unwrap_or_default();
    eprintln!(
        "To sign in, open {url} and confirm the code {}",
        start["user_code"].as_str().unwrap_or_default()
    );
    let mut interval = std::time::Duration::from_secs(start["interval"].as_u64().unwrap_or(5).max(1));
    let deadline =
        std::time::Instant::now() + std::time::Duration::from_secs(start["expires_in"].as_u64().unwrap_or(600));
    while std::time::Instant::now() < deadline {
        tokio::time::sleep(interval).await;
        let mut poll = vec![
            ("grant_type", "urn:ietf:params:oauth:grant-type:device_code".to_string()),
            ("device_code", device_code.clone()),
            ("client_id", a.client_id.clone()),
        ];
        if let Some(r) = &a.resource {
            poll.push(("resource", r.clone()));
        }
        let v: serde_json::Value = http.post(token).form(&poll).send().await?.json().await?;
        if let Some(t) = v["access_token"].as_str() {
            return Ok(t.to_string());
        }
        match v["error"].as_str() {
            Some("authorization_pending") => {}
            Some("slow_down") => interval += std::time::Duration::from_secs(5),
            Some(e) => bail!(
                "sign-in failed: {e} {}",
                v["error_description"].as_str().unwrap_or_default()
            ),
            None => bail!("unexpected answer from the provider: {v}"),
        }
    }
    bail!("the sign-in was not confirmed in time")
}

pub async fn login(conn: &Connection, a: &LoginArgs) -> Result<()> {
    let server = conn.base_url();
    let token = match (&conn.token, &a.sso) {
        (_, Some(issuer)) => device_login(issuer, a).await?,
        (Some(t), None) => t.trim().to_string(),
        (None, None) => {
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
