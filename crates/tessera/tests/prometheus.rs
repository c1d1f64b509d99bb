//! End to end with a real Prometheus: `tessera serve` on the seed fleet (simulated backend),
//! a Prometheus server of this test's own (own config, port on 127.0.0.1 and data directory;
//! scrape and rule evaluation every second; `deploy/prometheus/alerts.yaml` loaded) scraping it;
//! an XID injected through the API must turn the GPU-health alert `firing` in Prometheus'
//! `/api/v1/alerts` within a bounded time.
//!
//! Needs `/usr/bin/prometheus` (Debian's `prometheus` package): `scripts/test.sh` installs it.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use support::*;

const PROMETHEUS: &str = "/usr/bin/prometheus";

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

async fn get_json(http: &reqwest::Client, url: &str) -> Option<Value> {
    let r = http.get(url).send().await.ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.json().await.ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xid_injected_through_the_api_fires_the_gpu_health_alert_in_prometheus() {
    assert!(
        std::path::Path::new(PROMETHEUS).exists(),
        "{PROMETHEUS} is missing: run scripts/test.sh, which installs Debian's `prometheus` package \
         (apt-get install -y --no-install-recommends prometheus)"
    );
    let s = Server::start("prometheus-e2e", false);
    let target = s.base.trim_start_matches("http://").to_string();
    let dir = TempDir::new("prometheus-e2e-tsdb");
    let rules = repo_root().join("deploy/prometheus/alerts.yaml");
    let config = dir.0.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: tessera\n    metrics_path: /metrics\n    static_configs:\n      - targets: ['{target}']\n",
            rules.display()
        ),
    )
    .unwrap();
    let port = free_port();
    let prom_base = format!("http://127.0.0.1:{port}");
    let _prometheus = ChildGuard(
        Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.0.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus starts"),
    );
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();

    // Prometheus is up, has loaded the rules and scrapes Tessera.
    let groups = eventually(Duration::from_secs(60), Duration::from_millis(250), || {
        let (http, url) = (http.clone(), format!("{prom_base}/api/v1/rules"));
        async move {
            let v = get_json(&http, &url).await?;
            let n = v["data"]["groups"].as_array()?.len();
            (n > 0).then_some(n)
        }
    })
    .await
    .expect("Prometheus answers /api/v1/rules within 60 s");
    assert_eq!(groups, 5, "the five alert groups are loaded");
    eventually(Duration::from_secs(60), Duration::from_millis(250), || {
        let (http, url) = (
            http.clone(),
            format!("{prom_base}/api/v1/query?query=tessera_build_info%7Bjob%3D%22tessera%22%7D"),
        );
        async move {
            let v = get_json(&http, &url).await?;
            (!v["data"]["result"].as_array()?.is_empty()).then_some(())
        }
    })
    .await
    .expect("Prometheus scrapes tessera within 60 s");
    let xid_alerts = |v: &Value| -> Vec<Value> {
        v["data"]["alerts"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|x| x["labels"]["alertname"] == "TesseraGpuXidError")
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    };
    let before = get_json(&http, &format!("{prom_base}/api/v1/alerts")).await.unwrap();
    assert!(
        xid_alerts(&before).is_empty(),
        "no XID alert before the fault: {before}"
    );

    let (st, b) = s
        .post("/api/v1/sim/faults", json!({"node": "h100-05", "gpu": 3, "xid": 48}))
        .await;
    assert_eq!(st, 200, "{b}");

    let started = std::time::Instant::now();
    let alert = eventually(Duration::from_secs(60), Duration::from_millis(250), || {
        let (http, url) = (http.clone(), format!("{prom_base}/api/v1/alerts"));
        async move {
            let v = get_json(&http, &url).await?;
            xid_alerts(&v).into_iter().find(|a| a["state"] == "firing")
        }
    })
    .await
    .expect("TesseraGpuXidError fires within 60 s of the injected XID");
    println!(
        "TesseraGpuXidError firing {:.1} s after the fault: {alert}",
        started.elapsed().as_secs_f64()
    );
    let l = &alert["labels"];
    assert_eq!(l["Hostname"], "h100-05");
    assert_eq!(l["gpu"], "3");
    assert_eq!(l["UUID"], b["uuid"]);
    assert_eq!(l["severity"], "critical");
    assert_eq!(
        alert["annotations"]["runbook_url"],
        "docs/runbooks/gpu-health.md#tesseragpuxiderror"
    );
    assert!(
        alert["annotations"]["summary"]
            .as_str()
            .unwrap()
            .contains("XID 48 on GPU 3 of h100-05")
    );

    // Nothing else fires on a healthy, idle simulated fleet.
    let all = get_json(&http, &format!("{prom_base}/api/v1/alerts")).await.unwrap();
    let firing: Vec<&str> = all["data"]["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["state"] == "firing")
        .map(|a| a["labels"]["alertname"].as_str().unwrap())
        .collect();
    assert_eq!(firing, ["TesseraGpuXidError"], "{all}");
}
