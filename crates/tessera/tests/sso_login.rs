//! `tessera login --sso`: the OAuth device authorization grant against a real OpenID Connect
//! provider (panva/oidc-provider from crates/tessera-server/tests/oidc, installed by
//! scripts/test.sh), confirmed through the provider's own pages; the access token is then
//! accepted by `tessera serve --oidc` and stored with mode 0600.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

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
    let oidc_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tessera-server/tests/oidc");
    assert!(
        oidc_dir.join("node_modules/oidc-provider").exists(),
        "the OIDC provider is not installed: run scripts/test.sh"
    );
    let dir = std::env::temp_dir().join(format!("tessera-sso-login-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let pport = free_port();
    let mut provider = Command::new("node")
        .arg(oidc_dir.join("provider.mjs"))
        .env("PORT", pport.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let issuer = format!("http://127.0.0.1:{pport}");
    let mut plines = BufReader::new(provider.stdout.take().unwrap()).lines();
    assert!(plines.next().unwrap().unwrap().starts_with("ready"));
    std::fs::write(
        dir.join("oidc.toml"),
        format!(
            "issuer = \"{issuer}\"\naudience = \"tessera\"\nalgorithms = [\"RS256\"]\n[[mapping]]\nclaim = \"groups\"\nvalue = \"vision-admins\"\ntenant = \"vision\"\nrole = \"tenant-admin\"\n"
        ),
    )
    .unwrap();
    let mut server = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .arg("--oidc")
        .arg(dir.join("oidc.toml"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut slines = BufReader::new(server.stdout.take().unwrap()).lines();
    let (mut admin, mut addr) = (String::new(), String::new());
    while addr.is_empty() {
        let l = slines.next().unwrap().unwrap();
        if let Some(t) = l.strip_prefix("Admin token: ") {
            admin = t.to_string();
        }
        if let Some(rest) = l.split("console http://").nth(1) {
            addr = format!("http://{}", rest.split('/').next().unwrap());
        }
    }
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
    let config = dir.join("config");
    let mut cli = Command::new(env!("CARGO_BIN_EXE_tessera"))
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
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["projects", "--tenant", "vision", "create", "train"])
        .env("TESSERA_SERVER", &addr)
        .env("XDG_CONFIG_HOME", &config)
        .env_remove("TESSERA_TOKEN")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for mut c in [server, provider] {
        c.kill().unwrap();
        c.wait().unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
