//! End to end with a real Prometheus: `tessera serve` on the seed fleet (simulated backend),
//! a Prometheus server of this test's own (own config, port on 127.0.0.1 and data directory;
//! scrape and rule evaluation every second; `deploy/prometheus/alerts.yaml` loaded) scraping it;
//! an XID injected through the API must turn the GPU-health alert `firing` in Prometheus'
//! `/api/v1/alerts` within a bounded time. Prometheus runs the bundled
//! `deploy/prometheus/prometheus.yml` (target and intervals changed), so it reads `/metrics` on
//! the API address with a `metrics` token, as operators are told to.
//!
//! Needs `/usr/bin/prometheus` (Debian's `prometheus` package): `scripts/test.sh` installs it.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::*;
use serde_json::{Value, json};

const PROMETHEUS: &str = "/usr/bin/prometheus";

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
    // The bundled configuration, pointed at this server and scraping every second; its
    // `authorization` reads the metrics token from `tessera-metrics-token` next to it.
    let bundled = repo_root().join("deploy/prometheus");
    let mut config: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(bundled.join("prometheus.yml")).unwrap()).unwrap();
    for key in ["scrape_interval", "evaluation_interval"] {
        config["global"][key] = "1s".into();
    }
    config["global"]["scrape_timeout"] = "1s".into();
    config["rule_files"] = serde_yaml_ng::to_value([bundled.join("alerts.yaml")]).unwrap();
    let job = &mut config["scrape_configs"][0];
    assert_eq!(job["job_name"], "tessera");
    assert_eq!(
        job["authorization"]["credentials_file"], "tessera-metrics-token",
        "the bundled job presents a metrics token"
    );
    job["static_configs"][0]["targets"] = serde_yaml_ng::to_value([target.as_str()]).unwrap();
    std::fs::write(dir.0.join("tessera-metrics-token"), &s.metrics_token).unwrap();
    let config_file = dir.0.join("prometheus.yml");
    std::fs::write(&config_file, serde_yaml_ng::to_string(&config).unwrap()).unwrap();
    let port = free_port();
    let prom_base = format!("http://127.0.0.1:{port}");
    let _prometheus = ChildGuard(
        Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config_file.display()))
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
