//! The HTTP client the CLI verbs use. Server errors (problem JSON) become one readable line.

use anyhow::{Result, anyhow};
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tessera_api::Problem;

/// Where the server is and who we are.
#[derive(Clone, clap::Args)]
pub struct Connection {
    /// Server URL.
    #[arg(long, env = "TESSERA_SERVER", default_value = "http://127.0.0.1:8080", global = true)]
    pub server: String,
    /// API token [default: the contents of ./tessera-data/admin-token when present].
    #[arg(long, env = "TESSERA_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
}

impl Connection {
    /// The server URL without a trailing `/`.
    pub fn base_url(&self) -> String {
        self.server.trim_end_matches('/').to_string()
    }

    /// `--token` / `TESSERA_TOKEN`, else the credential stored by `tessera login` for this
    /// server, else the contents of `./tessera-data/admin-token`.
    pub fn resolve_token(&self) -> Result<String> {
        if let Some(t) = crate::login::stored_token(&self.base_url()).filter(|_| self.token.is_none()) {
            return Ok(t);
        }
        match &self.token {
            Some(t) => Ok(t.trim().to_string()),
            None => std::fs::read_to_string("tessera-data/admin-token").map(|t| t.trim().to_string()).map_err(|_| {
                anyhow!("no API token: run `tessera login`, pass --token or set TESSERA_TOKEN (the server printed the admin token at first start and wrote it to <data-dir>/admin-token)")
            }),
        }
    }
}

pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    pub fn new(c: &Connection) -> Result<Client> {
        Ok(Client {
            http: reqwest::Client::new(),
            base: c.base_url(),
            token: c.resolve_token()?,
        })
    }

    pub async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        extra: &[(&str, String)],
    ) -> Result<(StatusCode, T)> {
        let mut rb = self.http.request(method, format!("{}{path}", self.base));
        for (k, v) in extra {
            rb = rb.header(*k, v);
        }
        if let Some(b) = body {
            rb = rb.json(b);
        }
        let (url, resp) = self.send(rb).await?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| anyhow!("reading the response from {url}: {e}"))?;
        let v = if bytes.is_empty() {
            serde_json::from_slice(b"null")
        } else {
            serde_json::from_slice(&bytes)
        };
        Ok((status, v.map_err(|e| anyhow!("unexpected response from {url}: {e}"))?))
    }

    /// GET returning the body as text (CSV reports).
    pub async fn text(&self, path: &str) -> Result<String> {
        let (url, resp) = self.send(self.http.get(format!("{}{path}", self.base))).await?;
        resp.text()
            .await
            .map_err(|e| anyhow!("reading the response from {url}: {e}"))
    }

    /// GET copying the body to `out` as it arrives (followed logs).
    pub async fn stream(&self, path: &str, out: &mut impl std::io::Write) -> Result<()> {
        let (url, mut resp) = self.send(self.http.get(format!("{}{path}", self.base))).await?;
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| anyhow!("reading the response from {url}: {e}"))?
        {
            out.write_all(&chunk)?;
            out.flush()?;
        }
        Ok(())
    }

    /// Sends `rb` with our token: the URL and the response when it succeeded, else the server's
    /// problem (or the status) as one readable line.
    async fn send(&self, rb: reqwest::RequestBuilder) -> Result<(reqwest::Url, reqwest::Response)> {
        let resp = rb
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| anyhow!("cannot reach the Tessera server at {}: {}", self.base, root_cause(&e)))?;
        let url = resp.url().clone();
        let status = resp.status();
        if status.is_success() {
            return Ok((url, resp));
        }
        let body = resp.bytes().await.unwrap_or_default();
        if let Ok(p) = serde_json::from_slice::<Problem>(&body) {
            let field = p.field.map(|f| format!(" (field `{f}`)")).unwrap_or_default();
            return Err(anyhow!("{} {}: {}{field}", p.status, p.title, p.detail));
        }
        Err(anyhow!("{status} from {url}"))
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        Ok(self.call::<(), T>(Method::GET, path, None, &[]).await?.1)
    }

    pub async fn post<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> Result<T> {
        Ok(self.call(Method::POST, path, Some(body), &[]).await?.1)
    }
}

fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(s) = cur.source() {
        cur = s;
    }
    cur.to_string()
}
