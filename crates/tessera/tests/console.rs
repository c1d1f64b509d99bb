//! The web console in a real browser: `tessera serve` with single sign-on against the real
//! OIDC provider of the security tests (crates/tessera-server/tests/oidc), driven by
//! console/run.mjs in headless Chromium (Debian's `chromium` through `playwright-core`), with
//! axe-core on every page and screenshots saved under target/console-screenshots/. Nothing is
//! skipped: without Chromium or the npm packages the test fails saying how to get them.
//! About 15 s once built.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn console_in_a_real_browser() {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        std::path::Path::new(&chromium).exists(),
        "Chromium is missing ({chromium}): run scripts/test.sh as root to install Debian's chromium"
    );
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let runner = here.join("tests/console");
    assert!(
        runner.join("node_modules/playwright-core").exists() && runner.join("node_modules/axe-core").exists(),
        "the browser test's npm packages are missing: run scripts/test.sh (npm ci in crates/tessera/tests/console)"
    );
    let oidc_dir = here.join("../tessera-server/tests/oidc");
    assert!(
        oidc_dir.join("node_modules/oidc-provider").exists(),
        "the OIDC provider is not installed: run scripts/test.sh"
    );
    let dir = std::env::temp_dir().join(format!("tessera-console-browser-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (pport, sport) = (free_port(), free_port());
    let base = format!("http://127.0.0.1:{sport}");
    let mut provider = Command::new("node")
        .arg(oidc_dir.join("provider.mjs"))
        .env("PORT", pport.to_string())
        .env("REDIRECT_URI", format!("{base}/auth/callback"))
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
            "issuer = \"{issuer}\"\naudience = \"tessera\"\nalgorithms = [\"RS256\"]\nclient_id = \"tessera-console\"\nclient_secret = \"console-secret\"\nredirect_url = \"{base}/auth/callback\"\n[[mapping]]\nclaim = \"groups\"\nvalue = \"vision-admins\"\ntenant = \"vision\"\nrole = \"tenant-admin\"\n"
        ),
    )
    .unwrap();
    let mut server = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["serve", "--listen", &format!("127.0.0.1:{sport}"), "--data-dir"])
        .arg(dir.join("data"))
        .arg("--oidc")
        .arg(dir.join("oidc.toml"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut slines = BufReader::new(server.stdout.take().unwrap()).lines();
    let mut admin = String::new();
    loop {
        let l = slines.next().unwrap().unwrap();
        if let Some(t) = l.strip_prefix("Admin token: ") {
            admin = t.to_string();
        }
        if l.contains("console http://") {
            break;
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (viewer, other) = rt.block_on(async {
        let http = reqwest::Client::new();
        let post = |path: &str, body: serde_json::Value| {
            http.post(format!("{base}{path}"))
                .bearer_auth(&admin)
                .json(&body)
                .send()
        };
        for (t, p) in [("vision", "train"), ("nlp", "p")] {
            assert!(
                post("/api/v1/tenants", serde_json::json!({"name": t}))
                    .await
                    .unwrap()
                    .status()
                    .is_success()
            );
            let path = format!("/api/v1/tenants/{t}/projects");
            assert!(
                post(&path, serde_json::json!({"name": p}))
                    .await
                    .unwrap()
                    .status()
                    .is_success()
            );
        }
        let token = |tenant: &'static str, role: &'static str| {
            let f = post("/api/v1/tokens", serde_json::json!({"tenant": tenant, "role": role}));
            async move {
                let v: serde_json::Value = f.await.unwrap().json().await.unwrap();
                v["token"].as_str().unwrap().to_string()
            }
        };
        (token("vision", "viewer").await, token("nlp", "member").await)
    });
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| here.join("../../target"));
    let shots = target.join("console-screenshots");
    let out = Command::new("node")
        .arg(runner.join("run.mjs"))
        .env("BASE", &base)
        .env("ADMIN_TOKEN", &admin)
        .env("VIEWER_TOKEN", &viewer)
        .env("OTHER_TOKEN", &other)
        .env("SHOTS", &shots)
        .env("CHROMIUM", &chromium)
        .output()
        .unwrap();
    for mut c in [server, provider] {
        let _ = c.kill();
        let _ = c.wait();
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for page in [
        "overview",
        "request-preview",
        "workload",
        "fleet",
        "fleet-unhealthy",
        "workload-live",
        "workloads",
        "quota",
        "tokens",
        "audit",
        "queue",
        "charts",
        "tenants",
        "tenants-error",
        "signin",
    ] {
        assert!(shots.join(format!("{page}.png")).exists(), "screenshot of {page}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
