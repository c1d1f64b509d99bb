//! The calls of the OCI distribution API that verification needs: a tag resolved to its
//! manifest digest (`HEAD /v2/<name>/manifests/<tag>`, `Docker-Content-Digest`), the cosign
//! signature manifest under the tag `sha256-<hex>.sig`, and its layers' payload blobs, each
//! checked against its digest. Registries on `localhost` and `127.0.0.0/8` are spoken to over
//! plain HTTP (as Docker treats them as insecure by default), every other one over HTTPS.
//! Registries that answer `401` with a `Bearer` challenge get an anonymous token from the realm
//! they name; credentials for private registries are not supported yet.

use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::{ACCEPT, AUTHORIZATION, HeaderMap, WWW_AUTHENTICATE};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::reference::{ImageRef, check_digest};

/// The manifest types a tag may resolve to (the digest is the one of whatever the registry
/// serves: an index for multi-platform images).
const MANIFEST_TYPES: &str = "application/vnd.oci.image.index.v1+json, \
    application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json, \
    application/vnd.docker.distribution.manifest.v2+json";

/// cosign's annotation holding a layer's base64 signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";

/// The largest manifest or payload blob read (signature payloads are a few hundred bytes).
const MAX_BODY: usize = 1 << 20;

/// Why the registry gave no answer to use.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The tag, manifest or blob does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The registry could not be reached, or answered with an error or garbage.
    #[error("registry {registry}: {why}")]
    Failed { registry: String, why: String },
}

/// One signature of an image: the payload bytes and the layer's base64 signature.
#[derive(Clone, Debug)]
pub struct Signature {
    pub payload: Vec<u8>,
    pub signature: String,
}

#[derive(Deserialize)]
struct Manifest {
    #[serde(default)]
    layers: Vec<Layer>,
}

#[derive(Deserialize)]
struct Layer {
    digest: String,
    #[serde(default)]
    annotations: std::collections::HashMap<String, String>,
}

/// A client for registries (cheap to clone).
#[derive(Clone, Debug)]
pub struct RegistryClient {
    http: reqwest::Client,
}

impl Default for RegistryClient {
    fn default() -> Self {
        Self::new(Duration::from_secs(10))
    }
}

fn plain_http(host: &str) -> bool {
    let h = match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    };
    h == "localhost" || h == "[::1]" || h.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect()
}

/// The anonymous-token request a `Bearer realm="…",service="…",scope="…"` challenge asks for.
fn token_url(challenge: &str) -> Option<String> {
    let rest = challenge.trim().strip_prefix("Bearer ")?;
    let mut realm = None;
    let mut query = Vec::new();
    for part in rest.split(',') {
        let (k, v) = part.trim().split_once('=')?;
        let v = v.trim_matches('"');
        match k {
            "realm" => realm = Some(v.to_string()),
            "service" | "scope" => query.push(format!("{k}={v}")),
            _ => {}
        }
    }
    let realm = realm?;
    Some(if query.is_empty() {
        realm
    } else {
        format!("{realm}?{}", query.join("&"))
    })
}

impl RegistryClient {
    pub fn new(timeout: Duration) -> Self {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .user_agent(concat!("tessera/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("a reqwest client");
        RegistryClient { http }
    }

    fn url(image: &ImageRef, path: &str) -> String {
        let host = image.api_host();
        let scheme = if plain_http(host) { "http" } else { "https" };
        format!("{scheme}://{host}/v2/{}/{path}", image.repository)
    }

    fn failed(image: &ImageRef, why: impl std::fmt::Display) -> RegistryError {
        RegistryError::Failed {
            registry: image.registry.clone(),
            why: why.to_string(),
        }
    }

    /// Sends a request, answering a `Bearer` challenge once with an anonymous token.
    async fn send(
        &self,
        image: &ImageRef,
        method: reqwest::Method,
        url: &str,
        accept: &str,
    ) -> Result<reqwest::Response, RegistryError> {
        let req = || self.http.request(method.clone(), url).header(ACCEPT, accept);
        let resp = req().send().await.map_err(|e| Self::failed(image, e))?;
        if resp.status() != StatusCode::UNAUTHORIZED {
            return Ok(resp);
        }
        let Some(turl) = resp
            .headers()
            .get(WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .and_then(token_url)
        else {
            return Ok(resp);
        };
        #[derive(Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let t: Token = self
            .http
            .get(&turl)
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(|e| Self::failed(image, format!("anonymous token: {e}")))?
            .json()
            .await
            .map_err(|e| Self::failed(image, format!("anonymous token: {e}")))?;
        let Some(token) = t.token.or(t.access_token) else {
            return Err(Self::failed(image, "the token service returned no token"));
        };
        req()
            .header(AUTHORIZATION, format!("Bearer {token}"))
            .send()
            .await
            .map_err(|e| Self::failed(image, e))
    }

    async fn body(image: &ImageRef, resp: reqwest::Response) -> Result<Vec<u8>, RegistryError> {
        if resp.content_length().is_some_and(|n| n as usize > MAX_BODY) {
            return Err(Self::failed(image, "response too large"));
        }
        let b = resp.bytes().await.map_err(|e| Self::failed(image, e))?;
        if b.len() > MAX_BODY {
            return Err(Self::failed(image, "response too large"));
        }
        Ok(b.to_vec())
    }

    fn check_status(image: &ImageRef, resp: &reqwest::Response, what: &str) -> Result<(), RegistryError> {
        match resp.status() {
            s if s.is_success() => Ok(()),
            StatusCode::NOT_FOUND => Err(RegistryError::NotFound(format!(
                "{what} not found in registry {}",
                image.registry
            ))),
            s => Err(Self::failed(image, format!("{what}: HTTP {s}"))),
        }
    }

    /// The manifest digest the image's reference names: its own digest, or the one the
    /// registry reports for its tag.
    pub async fn resolve(&self, image: &ImageRef) -> Result<String, RegistryError> {
        if let Some(d) = &image.digest {
            return Ok(d.clone());
        }
        let tag = image.tag.as_deref().unwrap_or("latest");
        let url = Self::url(image, &format!("manifests/{tag}"));
        let what = format!("tag {tag} of {}", image.repository);
        let head = self.send(image, reqwest::Method::HEAD, &url, MANIFEST_TYPES).await?;
        Self::check_status(image, &head, &what)?;
        if let Some(d) = content_digest(head.headers()) {
            return Ok(d);
        }
        // No digest header: the digest of the manifest bytes as served.
        let get = self.send(image, reqwest::Method::GET, &url, MANIFEST_TYPES).await?;
        Self::check_status(image, &get, &what)?;
        let body = Self::body(image, get).await?;
        Ok(format!("sha256:{}", sha256_hex(&body)))
    }

    /// The cosign signatures stored for `digest` (empty when there is no signature manifest).
    pub async fn signatures(&self, image: &ImageRef, digest: &str) -> Result<Vec<Signature>, RegistryError> {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        let url = Self::url(image, &format!("manifests/sha256-{hex}.sig"));
        let resp = self
            .send(
                image,
                reqwest::Method::GET,
                &url,
                "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json",
            )
            .await?;
        if resp.status() == StatusCode::NOT_FOUND {
            return Ok(vec![]);
        }
        Self::check_status(image, &resp, "signature manifest")?;
        let body = Self::body(image, resp).await?;
        let m: Manifest =
            serde_json::from_slice(&body).map_err(|e| Self::failed(image, format!("signature manifest: {e}")))?;
        let mut out = Vec::new();
        for l in m.layers {
            let Some(sig) = l.annotations.get(SIGNATURE_ANNOTATION) else {
                continue;
            };
            check_digest(&l.digest).map_err(|e| Self::failed(image, format!("signature layer: {e}")))?;
            let resp = self
                .send(
                    image,
                    reqwest::Method::GET,
                    &Self::url(image, &format!("blobs/{}", l.digest)),
                    "*/*",
                )
                .await?;
            Self::check_status(image, &resp, &format!("signature payload {}", l.digest))?;
            let payload = Self::body(image, resp).await?;
            // A blob is what its digest says, or it is not used.
            if format!("sha256:{}", sha256_hex(&payload)) != l.digest {
                return Err(Self::failed(
                    image,
                    format!("blob {} does not match its digest", l.digest),
                ));
            }
            out.push(Signature {
                payload,
                signature: sig.clone(),
            });
        }
        Ok(out)
    }
}

fn content_digest(h: &HeaderMap) -> Option<String> {
    let d = h.get("docker-content-digest")?.to_str().ok()?;
    check_digest(d).ok()?;
    Some(d.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_registries_use_plain_http() {
        assert!(plain_http("localhost:5000"));
        assert!(plain_http("127.0.0.1:41234"));
        assert!(!plain_http("registry.example.com"));
        assert!(!plain_http("127.example.com"));
    }

    #[test]
    fn a_bearer_challenge_names_the_token_request() {
        let c = r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/ubuntu:pull""#;
        assert_eq!(
            token_url(c).as_deref(),
            Some("https://auth.docker.io/token?service=registry.docker.io&scope=repository:library/ubuntu:pull")
        );
        assert_eq!(token_url("Basic realm=\"x\""), None);
    }
}
