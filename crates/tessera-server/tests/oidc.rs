//! Single sign-on against a real OpenID Connect provider (panva/oidc-provider, started on
//! loopback from `tests/oidc/provider.mjs`; `scripts/test.sh` installs it with npm): discovery,
//! JWKS, JWT access tokens mapped to tenant roles by their `groups` claim, and the token attacks,
//! each answered 401.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{Browser, TempDir, TestServer};
use base64::Engine as _;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tessera_server::oidc::{ClaimRule, OidcConfig};
use tessera_server::{ServerConfig, now_ms};

struct Provider {
    child: Child,
    issuer: String,
    private_pem: Vec<u8>,
    public_pem: Vec<u8>,
    /// Where the provider wrote its keys.
    _keys: TempDir,
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

use tessera_testdb::free_port;

fn provider() -> Provider {
    provider_with(None)
}

// The child is kept in `Provider`, whose drop kills and waits for it.
#[allow(clippy::zombie_processes)]
fn provider_with(redirect: Option<&str>) -> Provider {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/oidc");
    assert!(
        dir.join("node_modules/oidc-provider").exists(),
        "the OIDC provider is not installed: run scripts/test.sh, or `npm install --prefix {}`",
        dir.display()
    );
    let port = free_port();
    let keys = TempDir::new(&format!("oidc-{port}"));
    let tmp = &keys.0;
    let mut child = Command::new("node")
        .arg(dir.join("provider.mjs"))
        .env("PORT", port.to_string())
        .env("KEY_OUT", tmp.join("key.pem"))
        .env("PUB_OUT", tmp.join("pub.pem"))
        .env("REDIRECT_URI", redirect.unwrap_or("http://127.0.0.1:1/auth/callback"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("node runs the OIDC provider");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < deadline, "the OIDC provider did not start");
        let line = lines.next().expect("provider output").unwrap();
        if let Some(issuer) = line.strip_prefix("ready ") {
            std::thread::spawn(move || for _ in lines {});
            return Provider {
                child,
                issuer: issuer.to_string(),
                private_pem: std::fs::read(tmp.join("key.pem")).unwrap(),
                public_pem: std::fs::read(tmp.join("pub.pem")).unwrap(),
                _keys: keys,
            };
        }
    }
}

fn b64(v: &Value) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap())
}

/// Access tokens of `issuer` for the audience `tessera`, RS256, mapped to roles by `mapping`.
fn oidc_config(issuer: &str, mapping: Vec<ClaimRule>) -> OidcConfig {
    OidcConfig {
        issuer: issuer.to_string(),
        audience: "tessera".into(),
        algorithms: vec!["RS256".into()],
        leeway_s: 5,
        client_id: None,
        client_secret: None,
        redirect_url: None,
        mapping,
    }
}

/// Members of the group `group` get `role` (in `tenant`, if given).
fn group_rule(group: &str, tenant: Option<&str>, role: &str) -> ClaimRule {
    ClaimRule {
        claim: "groups".into(),
        value: group.into(),
        tenant: tenant.map(str::to_string),
        role: role.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sso_tokens_and_attacks() {
    let p = provider();
    let oidc = oidc_config(
        &p.issuer,
        vec![
            group_rule("platform-ops", None, "platform-admin"),
            group_rule("vision-admins", Some("vision"), "tenant-admin"),
        ],
    );
    let s = TestServer::start_with("sso", |c| ServerConfig { oidc: Some(oidc), ..c }).await;
    let get = async |token: String, path: &str| s.call_as(Some(&token), Method::GET, path, None).await.0;
    let (st, _) = s.post("/api/v1/tenants", json!({"name": "vision"})).await;
    assert_eq!(st, StatusCode::CREATED);

    // A real access token from the provider (client credentials, resource indicator).
    let tok: Value = s
        .http
        .post(format!("{}/token", p.issuer))
        .basic_auth("tessera-ci", Some("ci-secret"))
        .form(&[
            ("grant_type", "client_credentials"),
            ("scope", "api"),
            ("resource", "https://tessera.test/api"),
        ])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let real = tok["access_token"].as_str().expect("an access token").to_string();
    assert_eq!(
        get(real.clone(), "/api/v1/tenants/vision").await,
        StatusCode::OK,
        "mapped to vision's tenant-admin"
    );
    let (st, _) = s
        .call_as(
            Some(&real),
            Method::POST,
            "/api/v1/tenants",
            Some(json!({"name": "evil"})),
        )
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN, "a tenant-admin cannot create tenants");

    // Forged tokens: all claims right, signed by the provider's key → accepted (the control);
    // then one defect at a time → 401.
    let now = now_ms() / 1000;
    let claims = json!({"sub": "mallory", "iss": p.issuer, "aud": "tessera", "exp": now + 600, "iat": now, "groups": ["vision-admins"]});
    let key = EncodingKey::from_rsa_pem(&p.private_pem).unwrap();
    let sign = |h: Header, c: &Value| encode(&h, c, &key).unwrap();
    let rs = |kid: &str| {
        let mut h = Header::new(Algorithm::RS256);
        h.kid = Some(kid.into());
        h
    };
    let control = sign(rs("k1"), &claims);
    assert_eq!(
        get(control, "/api/v1/tenants/vision").await,
        StatusCode::OK,
        "a correctly signed token is accepted"
    );

    let with = |k: &str, v: Value| {
        let mut c = claims.clone();
        c[k] = v;
        c
    };
    let mut attacks: Vec<(&str, String)> = vec![
        (
            "alg none",
            format!(
                "{}.{}.",
                b64(&json!({"alg": "none", "typ": "JWT", "kid": "k1"})),
                b64(&claims)
            ),
        ),
        (
            "wrong iss",
            sign(rs("k1"), &with("iss", json!("http://127.0.0.1:1/evil"))),
        ),
        ("wrong aud", sign(rs("k1"), &with("aud", json!("someone-else")))),
        ("expired", sign(rs("k1"), &with("exp", json!(now - 3600)))),
        ("not yet valid", sign(rs("k1"), &with("nbf", json!(now + 3600)))),
        ("unknown kid", sign(rs("k2"), &claims)),
    ];
    // HS256 with the provider's public key as the HMAC secret.
    let mut hs = Header::new(Algorithm::HS256);
    hs.kid = Some("k1".into());
    attacks.push((
        "HS256 with the public key",
        encode(&hs, &claims, &EncodingKey::from_secret(&p.public_pem).unwrap()).unwrap(),
    ));
    // Tampered payload: the real token with its groups changed to platform-ops.
    let parts: Vec<&str> = real.split('.').collect();
    let mut payload: Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(parts[1])
            .unwrap(),
    )
    .unwrap();
    payload["groups"] = json!(["platform-ops"]);
    attacks.push((
        "tampered payload",
        format!("{}.{}.{}", parts[0], b64(&payload), parts[2]),
    ));
    for (name, token) in attacks {
        assert_eq!(
            get(token, "/api/v1/tenants/vision").await,
            StatusCode::UNAUTHORIZED,
            "{name} must be refused"
        );
    }
    // Validation cost with a cached JWKS (printed; see the README for the figure).
    let verifier = tessera_server::oidc::OidcVerifier::discover(oidc_config(
        &p.issuer,
        vec![group_rule("vision-admins", Some("vision"), "member")],
    ))
    .await
    .unwrap();
    let mut ns = Vec::new();
    let t = Instant::now();
    verifier.verify(&real).await.unwrap();
    println!(
        "JWT first validation (signature checked): {:.1} µs",
        t.elapsed().as_nanos() as f64 / 1000.0
    );
    for _ in 0..3000 {
        let t = Instant::now();
        verifier.verify(&real).await.unwrap();
        ns.push(t.elapsed().as_nanos() as u64);
    }
    ns.sort_unstable();
    println!(
        "JWT validation (RS256, cached JWKS), {} runs: p50 {:.1} µs, p99 {:.1} µs",
        ns.len(),
        ns[ns.len() / 2] as f64 / 1000.0,
        ns[ns.len() * 99 / 100] as f64 / 1000.0
    );
    // Failures are on the audit log.
    let audit = s.get("/api/v1/audit?limit=100").await;
    let failures = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "auth.failure")
        .count();
    assert!(failures >= 8, "{audit}");
}

/// Takes the `action` of the first form in an HTML page.
fn form_action(html: &str) -> String {
    let i = html.find("action=\"").expect("a form") + 8;
    html[i..i + html[i..].find('"').unwrap()]
        .replace("&#x2F;", "/")
        .replace("&amp;", "&")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_sign_in_with_pkce_session_cookie_csrf_and_logout() {
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let p = provider_with(Some(&format!("{base}/auth/callback")));
    let oidc = OidcConfig {
        client_id: Some("tessera-console".into()),
        client_secret: Some("console-secret".into()),
        redirect_url: Some(format!("{base}/auth/callback")),
        ..oidc_config(
            &p.issuer,
            vec![group_rule("vision-admins", Some("vision"), "tenant-admin")],
        )
    };
    let s = TestServer::start_with("console-sso", |c| ServerConfig {
        listen: format!("127.0.0.1:{port}").parse().unwrap(),
        oidc: Some(oidc),
        ..c
    })
    .await;
    s.tenant_with_project("vision", "train").await;

    // A browser: keeps cookies, and we follow redirects by hand to see each step.
    let b = Browser::new(&base);
    let browser = &b.client;
    let location = |r: &reqwest::Response| r.headers()["location"].to_str().unwrap().to_string();
    let r1 = b.get("/auth/login").await;
    assert_eq!(r1.status(), StatusCode::SEE_OTHER);
    let to_provider = location(&r1);
    assert!(
        to_provider.starts_with(&p.issuer)
            && to_provider.contains("code_challenge_method=S256")
            && to_provider.contains("nonce="),
        "{to_provider}"
    );
    let absolute = |l: String| {
        if l.starts_with("http") {
            l
        } else {
            format!("{}{l}", p.issuer)
        }
    };
    // Provider: authorize → login page → (login) → consent page → (confirm) → back to Tessera.
    let mut url = to_provider;
    let mut callback = None;
    for _ in 0..12 {
        let resp = browser.get(&url).send().await.unwrap();
        if resp.status().is_redirection() {
            let l = absolute(location(&resp));
            if l.starts_with(&format!("{base}/auth/callback")) {
                callback = Some(l);
                break;
            }
            url = l;
            continue;
        }
        let html = resp.text().await.unwrap();
        let action = absolute(form_action(&html));
        let form: Vec<(&str, &str)> = if html.contains("name=\"login\"") {
            vec![("prompt", "login"), ("login", "alice"), ("password", "any")]
        } else {
            vec![("prompt", "consent")]
        };
        let posted = browser.post(&action).form(&form).send().await.unwrap();
        assert!(
            posted.status().is_redirection(),
            "{} {}",
            posted.status(),
            posted.text().await.unwrap()
        );
        url = absolute(location(&posted));
    }
    let callback = callback.expect("the provider sends the browser back to Tessera with a code");
    // A forged state is refused.
    let forged = callback.replace("state=", "state=x");
    assert_eq!(
        browser.get(&forged).send().await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    let done = browser.get(&callback).send().await.unwrap();
    assert_eq!(done.status(), StatusCode::SEE_OTHER, "{}", done.text().await.unwrap());
    let set_cookie = done.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(
        set_cookie.contains("HttpOnly") && set_cookie.contains("SameSite=Lax"),
        "{set_cookie}"
    );
    // The session: who we are, and the CSRF token.
    let who: Value = b.get("/auth/session").await.json().await.unwrap();
    assert_eq!(who["actor"], "oidc:alice");
    assert_eq!(who["role"], "tenant-admin");
    let csrf = who["csrf_token"].as_str().unwrap().to_string();
    // Reads work with the cookie; changes need the CSRF token.
    assert_eq!(b.get("/api/v1/tenants/vision").await.status(), StatusCode::OK);
    let wl = json!({"tenant": "vision", "project": "train", "name": "nb", "shape": {"fraction": 250}});
    let no_csrf = browser.post(b.url("/api/v1/workloads")).json(&wl).send().await.unwrap();
    assert_eq!(no_csrf.status(), StatusCode::FORBIDDEN);
    let ok = browser
        .post(b.url("/api/v1/workloads"))
        .header("x-csrf-token", &csrf)
        .json(&wl)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::CREATED);
    // Logout clears the session.
    let out = b.post("/auth/logout", Some(&csrf)).await;
    assert_eq!(out.status(), StatusCode::NO_CONTENT);
    assert!(out.headers()["set-cookie"].to_str().unwrap().contains("Max-Age=0"));
    assert_eq!(b.get("/api/v1/tenants/vision").await.status(), StatusCode::UNAUTHORIZED);
    // The sign-in is on the audit log.
    let audit = s.get("/api/v1/audit?limit=100").await;
    assert!(
        audit["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["action"] == "login" && e["actor"] == "oidc:alice"),
        "{audit}"
    );
}
