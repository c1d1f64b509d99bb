//! The web console in a real browser: `tessera serve` with single sign-on against the real
//! OIDC provider of the security tests (crates/tessera-server/tests/oidc), driven by
//! console/run.mjs in headless Chromium (Debian's `chromium` through `playwright-core`), with
//! axe-core on every page and screenshots saved under target/console-screenshots/. Nothing is
//! skipped: without Chromium or the npm packages the test fails saying how to get them.
//! About 15 s once built.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::support::{TempDir, free_port, oidc_config, oidc_provider, serve_command, wait_until_serving};

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
    let dir = TempDir::new("console-browser");
    let sport = free_port();
    let base = format!("http://127.0.0.1:{sport}");
    let (provider, issuer) = oidc_provider(Some(&format!("{base}/auth/callback")));
    let client = format!(
        "client_id = \"tessera-console\"\nclient_secret = \"console-secret\"\nredirect_url = \"{base}/auth/callback\"\n"
    );
    let oidc = oidc_config(&dir.0, &issuer, &client);
    let mut cmd = serve_command();
    cmd.args(["--listen", &format!("127.0.0.1:{sport}"), "--data-dir"])
        .arg(dir.0.join("data"))
        .arg("--oidc")
        .arg(oidc);
    let server = wait_until_serving(&mut cmd, Duration::from_secs(60));
    let admin = server.admin_token.clone().unwrap_or_default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (viewer, other, member) = rt.block_on(async {
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
        (
            token("vision", "viewer").await,
            token("nlp", "member").await,
            token("vision", "member").await,
        )
    });
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| here.join("../../target"));
    let shots = target.join("console-screenshots");
    // Only this run's screenshots: the checks below find none left by an earlier run.
    let _ = std::fs::remove_dir_all(&shots);
    let out = Command::new("node")
        .arg(runner.join("run.mjs"))
        .env("BASE", &base)
        .env("ADMIN_TOKEN", &admin)
        .env("VIEWER_TOKEN", &viewer)
        .env("OTHER_TOKEN", &other)
        .env("MEMBER_TOKEN", &member)
        .env("SHOTS", &shots)
        .env("CHROMIUM", &chromium)
        .output()
        .unwrap();
    drop((server, provider));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for page in [
        "overview",
        "request-preview",
        "request-gang-preview",
        "workload",
        "workload-gang",
        "fleet",
        "fleet-racks",
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
        "fleet-drawer-keyboard",
        "fleet-heat-keyboard",
        "fleet-20-tenants",
        "tenants-phone",
        "fleet-phone",
        "request-phone",
        "tenants-quota-prefill",
        "fleet-member",
        "tenants-over-budget",
        "tenants-over-budget-1440",
        "tenants-over-budget-390",
        "fleet-member-1440",
        "fleet-member-390",
        "fleet-member-drawer",
        "fleet-member-empty",
        "signin",
    ] {
        assert!(shots.join(format!("{page}.png")).exists(), "screenshot of {page}");
    }
    // Every page at both sizes (run.mjs also checks that none scrolls sideways on the phone).
    for page in [
        "overview",
        "request",
        "workloads",
        "workload",
        "queue",
        "fleet",
        "fleet-node",
        "charts",
        "tenants",
        "audit",
        "tokens",
        "quota",
        "workload-gang-member",
        "not-found",
        "signin",
    ] {
        for width in [1440, 390] {
            let shot = shots.join(format!("page-{page}-{width}.png"));
            assert!(shot.exists(), "screenshot of {page} at {width} px");
        }
    }
}
