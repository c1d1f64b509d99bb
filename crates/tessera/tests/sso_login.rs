//! `tessera login --sso`: the OAuth device authorization grant against a real OpenID Connect
//! provider (panva/oidc-provider from crates/tessera-server/tests/oidc, installed by
//! scripts/test.sh), confirmed through the provider's own pages; the access token is then
//! accepted by `tessera serve --oidc` and stored with mode 0600.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{TESSERA, TempDir, oidc_config, oidc_provider, serve_command, tessera, wait_until_serving};

/// The first form of a page: its action and hidden fields.
fn form(html: &str) -> Option<(String, Vec<(String, String)>)> {
    let start = html.find("<form")?;
    let body = &html[start..start + html[start..].find("</form>")?];
    let attr = |tag: &str, name: &str| {
        let k = format!("{name}=\"");
        tag.find(&k)
            .map(|i| tag[i + k.len()..].split('"').next().unwrap_or_default().to_string())
    };
    let action = attr(body, "action")?.replace("&#x2F;", "/").replace("&amp;", "&");
    let mut fields = Vec::new();
    for part in body.split("<input").skip(1) {
        let tag = &part[..part.find('>').unwrap_or(part.len())];
        if tag.contains("type=\"hidden\"")
            && let (Some(n), Some(v)) = (attr(tag, "name"), attr(tag, "value"))
        {
            fields.push((n, v));
        }
    }
    Some((action, fields))
}

#[test]
fn device_grant_login() {
    let (mut provider, issuer) = oidc_provider(None);
    let dir = TempDir::new("sso-login");
    let oidc = oidc_config(&dir.0, &issuer, "");
    let mut cmd = serve_command();
    cmd.args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.0.join("data"))
        .arg("--oidc")
        .arg(oidc);
    let mut server = wait_until_serving(&mut cmd, Duration::from_secs(60));
    let admin = server.admin_token.clone().unwrap_or_default();
    let addr = server.base.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let r = reqwest::Client::new()
            .post(format!("{addr}/api/v1/tenants"))
            .bearer_auth(&admin)
            .json(&serde_json::json!({"name": "vision"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    });
    // The CLI starts the device grant and waits for the confirmation.
    let config = dir.0.join("config");
    let mut cli = Command::new(TESSERA)
        .args([
            "login",
            "--sso",
            &issuer,
            "--client-id",
            "tessera-cli",
            "--resource",
            "https://tessera.test/api",
        ])
        .env("TESSERA_SERVER", &addr)
        .env("XDG_CONFIG_HOME", &config)
        .env_remove("TESSERA_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut elines = BufReader::new(cli.stderr.take().unwrap()).lines();
    let prompt = elines.next().unwrap().unwrap();
    let url = prompt
        .split("open ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .to_string();
    assert!(url.starts_with(&issuer), "{prompt}");
    // A person confirms the code in a browser: the provider's device page, login and consent.
    rt.block_on(async {
        let browser = reqwest::Client::builder()
            .cookie_store(true)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let abs = |l: &str| {
            if l.starts_with("http") {
                l.to_string()
            } else {
                format!("{issuer}{l}")
            }
        };
        let mut next = browser.get(&url).send().await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            assert!(Instant::now() < deadline, "the device confirmation did not finish");
            if next.status().is_redirection() {
                let l = abs(next.headers()["location"].to_str().unwrap());
                next = browser.get(&l).send().await.unwrap();
                continue;
            }
            let html = next.text().await.unwrap();
            let Some((action, mut fields)) = form(&html) else {
                assert!(html.to_lowercase().contains("success"), "unexpected page: {html}");
                break;
            };
            if html.contains("name=\"login\"") {
                fields.push(("login".into(), "bob".into()));
                fields.push(("password".into(), "any".into()));
            }
            if html.contains("op.deviceConfirmForm") && !fields.iter().any(|(k, _)| k == "confirm") {
                fields.push(("confirm".into(), "yes".into()));
            }
            next = browser.post(abs(&action)).form(&fields).send().await.unwrap();
        }
    });
    let out = cli.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("mode 0600"), "{stdout}");
    // The stored provider token works with the CLI: a tenant-admin of vision.
    let (code, _, err) = tessera(
        &["projects", "--tenant", "vision", "create", "train"],
        &[("TESSERA_SERVER", &addr), ("XDG_CONFIG_HOME", config.to_str().unwrap())],
    );
    assert!(code == 0, "{err}");
    for c in [&mut server.child, &mut provider.0] {
        c.kill().unwrap();
        c.wait().unwrap();
    }
}
