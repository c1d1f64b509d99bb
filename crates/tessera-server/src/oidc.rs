//! OIDC bearer tokens: discovery, a cached JWKS (refreshed on an unknown `kid`, at most once per
//! `REFRESH_EVERY`), strict JWT validation, and the mapping from claims to tenants and roles.
//!
//! Validation: the header's `alg` must be in the configured allow-list of asymmetric algorithms
//! (`none` and every HMAC algorithm are refused outright, so a public key can never be used as an
//! HMAC secret); the key is chosen by `kid` from the provider's JWKS and must agree with the
//! algorithm; `iss`, `aud`, `exp` and `nbf` are checked with a small clock skew.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode, decode_header};
use serde::Deserialize;

use crate::auth::{Identity, Role};
use crate::problem::ApiError;

/// How often an unknown `kid` may trigger a JWKS refetch.
const REFRESH_EVERY: Duration = Duration::from_secs(30);

/// OIDC settings (`tessera serve --oidc FILE`, TOML).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OidcConfig {
    /// The issuer URL; discovery reads `<issuer>/.well-known/openid-configuration`.
    pub issuer: String,
    /// The audience Tessera's tokens must carry (`aud`).
    pub audience: String,
    /// Allowed signing algorithms (default RS256, ES256).
    #[serde(default = "default_algorithms")]
    pub algorithms: Vec<String>,
    /// Clock skew allowed on `exp` and `nbf`, seconds.
    #[serde(default = "default_leeway")]
    pub leeway_s: u64,
    /// Claim → tenant and role rules; the first match wins.
    #[serde(default)]
    pub mapping: Vec<ClaimRule>,
    /// Console sign-in (Authorization Code + PKCE): the client registered for Tessera.
    #[serde(default)]
    pub client_id: Option<String>,
    #[serde(default)]
    pub client_secret: Option<String>,
    /// Where the provider sends the browser back: `https://tessera.example/auth/callback`.
    #[serde(default)]
    pub redirect_url: Option<String>,
}

fn default_algorithms() -> Vec<String> {
    vec!["RS256".into(), "ES256".into()]
}

fn default_leeway() -> u64 {
    30
}

/// When `claim` holds `value` (or an array containing it), the caller gets `role`, in `tenant`
/// (absent for platform-admin).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimRule {
    pub claim: String,
    pub value: String,
    #[serde(default)]
    pub tenant: Option<String>,
    pub role: String,
}

struct Keys {
    keys: HashMap<String, (DecodingKey, Option<Algorithm>)>,
    fetched: Instant,
}

/// Verifies OIDC access tokens.
pub struct OidcVerifier {
    pub cfg: OidcConfig,
    algorithms: Vec<Algorithm>,
    jwks_uri: String,
    /// From discovery: where the console sends browsers to sign in, and redeems codes.
    pub authorization_endpoint: Option<String>,
    pub token_endpoint: Option<String>,
    http: reqwest::Client,
    keys: RwLock<Keys>,
    /// Access tokens already verified: SHA-256 of the token → identity and expiry (seconds).
    verified: RwLock<HashMap<[u8; 32], (Identity, i64)>>,
}

/// Most verified tokens remembered; beyond it, expired ones are dropped (or all, if none).
const VERIFIED_MAX: usize = 10_000;

#[derive(Deserialize)]
struct Discovery {
    issuer: String,
    jwks_uri: String,
    #[serde(default)]
    authorization_endpoint: Option<String>,
    #[serde(default)]
    token_endpoint: Option<String>,
}

fn parse_alg(s: &str) -> Result<Algorithm, String> {
    let a: Algorithm = s.parse().map_err(|_| format!("unknown algorithm `{s}`"))?;
    if matches!(a, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512) {
        return Err(format!(
            "`{s}` is a shared-secret algorithm; only asymmetric algorithms are allowed"
        ));
    }
    Ok(a)
}

impl OidcVerifier {
    /// Discovers the provider and fetches its keys.
    pub async fn discover(cfg: OidcConfig) -> Result<OidcVerifier, String> {
        let algorithms = cfg
            .algorithms
            .iter()
            .map(|a| parse_alg(a))
            .collect::<Result<Vec<_>, _>>()?;
        for r in &cfg.mapping {
            Role::parse(&r.role).ok_or_else(|| format!("mapping: unknown role `{}`", r.role))?;
        }
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| e.to_string())?;
        let url = format!("{}/.well-known/openid-configuration", cfg.issuer.trim_end_matches('/'));
        let d: Discovery = http
            .get(&url)
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(|e| format!("OIDC discovery at {url} failed: {e}"))?
            .json()
            .await
            .map_err(|e| format!("OIDC discovery at {url}: {e}"))?;
        if d.issuer.trim_end_matches('/') != cfg.issuer.trim_end_matches('/') {
            return Err(format!(
                "OIDC discovery: the provider calls itself `{}`, not `{}`",
                d.issuer, cfg.issuer
            ));
        }
        let v = OidcVerifier {
            cfg,
            algorithms,
            jwks_uri: d.jwks_uri,
            authorization_endpoint: d.authorization_endpoint,
            token_endpoint: d.token_endpoint,
            http,
            keys: RwLock::new(Keys {
                keys: HashMap::new(),
                fetched: Instant::now() - REFRESH_EVERY * 2,
            }),
            verified: RwLock::default(),
        };
        v.refresh().await?;
        Ok(v)
    }

    async fn refresh(&self) -> Result<(), String> {
        let set: JwkSet = self
            .http
            .get(&self.jwks_uri)
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(|e| format!("fetching the JWKS at {} failed: {e}", self.jwks_uri))?
            .json()
            .await
            .map_err(|e| format!("the JWKS at {} is not valid: {e}", self.jwks_uri))?;
        let mut keys = HashMap::new();
        for k in &set.keys {
            let Some(kid) = k.common.key_id.clone() else { continue };
            let alg = k
                .common
                .key_algorithm
                .and_then(|a| a.to_string().parse::<Algorithm>().ok());
            if let Ok(dk) = DecodingKey::from_jwk(k) {
                keys.insert(kid, (dk, alg));
            }
        }
        *self.keys.write().expect("lock") = Keys {
            keys,
            fetched: Instant::now(),
        };
        Ok(())
    }

    /// Whether a bearer credential looks like a JWT (three dot-separated parts).
    pub fn looks_like_jwt(token: &str) -> bool {
        token.split('.').count() == 3
    }

    /// Validates a JWT access token (audience: Tessera's) and maps it to an identity.
    ///
    /// A token that verified once is remembered until its `exp` (a JWT cannot change), so a
    /// client reusing its access token pays for the signature check once.
    pub async fn verify(&self, token: &str) -> Result<Identity, ApiError> {
        use sha2::Digest;
        let key: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        let now = crate::clock::now_ms() / 1000;
        if let Some((id, exp)) = self.verified.read().expect("lock").get(&key)
            && *exp + self.cfg.leeway_s as i64 > now
        {
            return Ok(id.clone());
        }
        let (id, exp) = self.verify_claims(token, &self.cfg.audience.clone(), None).await?;
        let mut v = self.verified.write().expect("lock");
        if v.len() >= VERIFIED_MAX {
            v.retain(|_, (_, e)| *e > now);
            if v.len() >= VERIFIED_MAX {
                v.clear();
            }
        }
        v.insert(key, (id.clone(), exp));
        Ok(id)
    }

    /// Validates an ID token from the console sign-in (audience: the client; nonce checked).
    pub async fn verify_id_token(&self, token: &str, nonce: &str) -> Result<Identity, ApiError> {
        let aud = self.cfg.client_id.clone().unwrap_or_default();
        Ok(self.verify_claims(token, &aud, Some(nonce)).await?.0)
    }

    /// Redeems an authorization code (with the PKCE verifier) for tokens; returns the ID token.
    pub async fn redeem(&self, code: &str, verifier: &str) -> Result<String, String> {
        let endpoint = self
            .token_endpoint
            .as_deref()
            .ok_or("the provider has no token endpoint")?;
        let (Some(id), Some(redirect)) = (&self.cfg.client_id, &self.cfg.redirect_url) else {
            return Err("console sign-in is not configured (client_id, redirect_url)".into());
        };
        let mut rb = self.http.post(endpoint).form(&[
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", redirect.as_str()),
            ("code_verifier", verifier),
            ("client_id", id.as_str()),
        ]);
        if let Some(secret) = &self.cfg.client_secret {
            rb = rb.basic_auth(id, Some(secret));
        }
        let v: serde_json::Value = rb
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(|e| format!("the provider refused the code: {e}"))?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        v.get("id_token")
            .and_then(|t| t.as_str())
            .map(str::to_string)
            .ok_or_else(|| "no id_token in the answer".into())
    }

    /// Verifies signature and claims; returns the identity and the token's `exp`.
    async fn verify_claims(
        &self,
        token: &str,
        audience: &str,
        nonce: Option<&str>,
    ) -> Result<(Identity, i64), ApiError> {
        let bad = |why: String| ApiError::unauthorized(format!("invalid token: {why}"));
        let header = decode_header(token).map_err(|e| bad(format!("malformed header ({e})")))?;
        if !self.algorithms.contains(&header.alg) {
            return Err(bad(format!("algorithm {:?} is not allowed", header.alg)));
        }
        let kid = header.kid.clone().ok_or_else(|| bad("no `kid` in the header".into()))?;
        let known = self.keys.read().expect("lock").keys.contains_key(&kid);
        if !known {
            let stale = self.keys.read().expect("lock").fetched.elapsed() >= REFRESH_EVERY;
            if stale {
                self.refresh().await.map_err(|e| {
                    tracing::warn!(error = %e, "JWKS refresh failed");
                    bad("signing keys unavailable".into())
                })?;
            }
        }
        let keys = self.keys.read().expect("lock");
        let (key, key_alg) = keys
            .keys
            .get(&kid)
            .ok_or_else(|| bad(format!("unknown key id `{kid}`")))?;
        if key_alg.is_some_and(|a| a != header.alg) {
            return Err(bad("the key does not sign with this algorithm".into()));
        }
        let mut v = Validation::new(header.alg);
        v.algorithms = vec![header.alg];
        v.set_issuer(&[
            self.cfg.issuer.trim_end_matches('/'),
            &format!("{}/", self.cfg.issuer.trim_end_matches('/')),
        ]);
        v.set_audience(&[audience]);
        v.leeway = self.cfg.leeway_s;
        v.validate_nbf = true;
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        let data = decode::<serde_json::Value>(token, key, &v).map_err(|e| bad(e.to_string()))?;
        drop(keys);
        if let Some(n) = nonce
            && data.claims.get("nonce").and_then(|x| x.as_str()) != Some(n)
        {
            return Err(bad("the nonce does not match the sign-in".into()));
        }
        let exp = data.claims.get("exp").and_then(|e| e.as_i64()).unwrap_or(0);
        Ok((self.map(&data.claims)?, exp))
    }

    fn map(&self, claims: &serde_json::Value) -> Result<Identity, ApiError> {
        let sub = claims.get("sub").and_then(|s| s.as_str()).unwrap_or("unknown");
        for r in &self.cfg.mapping {
            let hit = match claims.get(&r.claim) {
                Some(serde_json::Value::String(s)) => s == &r.value,
                Some(serde_json::Value::Array(a)) => a.iter().any(|x| x.as_str() == Some(&r.value)),
                _ => false,
            };
            if hit {
                let role = Role::parse(&r.role).expect("checked at start");
                return Ok(Identity {
                    actor: format!("oidc:{sub}"),
                    name: String::new(),
                    role,
                    tenant: r.tenant.clone(),
                });
            }
        }
        Err(ApiError::forbidden(format!(
            "signed in as {sub}, but no claim of yours maps to a Tessera role; ask the platform team"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_secret_algorithms_are_refused_in_configuration() {
        assert!(parse_alg("HS256").is_err());
        assert!(parse_alg("none").is_err());
        assert_eq!(parse_alg("RS256"), Ok(Algorithm::RS256));
        assert!(OidcVerifier::looks_like_jwt("a.b.c"));
        assert!(!OidcVerifier::looks_like_jwt("tsr_abc"));
    }
}
