//! `/metrics` of a running `tessera serve` (seed fleet, simulated backend):
//!
//! * it parses as the Prometheus text format (a strict parser here, and `promtool check
//!   metrics`) and stays under a fixed number of series with 1,000 workloads;
//! * every metric name the alert rules (`deploy/prometheus/alerts.yaml`) and the Grafana
//!   dashboards (`deploy/grafana/*.json`) use is exported by Tessera or is a DCGM exporter name;
//! * the simulated-fault route (`POST /api/v1/sim/faults`) and the DCGM series it drives.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::*;
use serde_json::{Value, json};

/// The most series `/metrics` may have on the seed fleet (480 GPUs: 128 H100 in `training`,
/// 224 A100-80GB in `serving` (MIG), 128 L40S in `development`), whatever the number of
/// workloads:
///
/// * DCGM telemetry: 7 series per GPU (`GPU_UTIL`, `FB_USED`, `FB_FREE`, `GPU_TEMP`,
///   `POWER_USAGE`, `XID_ERRORS`, `GR_ENGINE_ACTIVE`) = 3,360, plus 3 per MIG instance
///   (`FB_USED`, `FB_FREE`, `GR_ENGINE_ACTIVE`): at most 7 instances × 224 GPUs = 1,568
///   instances = 4,704. Together at most 8,064.
/// * Tessera's own series do not grow with the number of workloads: they are bounded by pools,
///   models, MIG profiles, tenants × resource classes × priority classes, states, reasons and
///   route templates × methods × statuses (13 series per API histogram). 3,936 leave room for
///   tens of tenants.
///
/// 12,000 series per scrape is modest for Prometheus (a fleet of this size scraped from DCGM
/// exporters directly has about as many).
const MAX_SERIES: usize = 12_000;

const WORKLOADS: usize = 1_000;

fn promtool() -> &'static str {
    let p = "/usr/bin/promtool";
    assert!(
        std::path::Path::new(p).exists(),
        "{p} is missing: run scripts/test.sh, which installs Debian's `prometheus` package (promtool and prometheus)"
    );
    p
}

/// `promtool check metrics`: the text must parse (exit 1 is a parse error); the only lint
/// allowed is the DCGM exporter's own camelCase label names (`modelName`, `UUID`,
/// `Hostname`, `GPU_I_PROFILE`), which dashboards and alerts written for DCGM expect.
fn promtool_check(text: &str) {
    let run = |input: &str| {
        let mut child = Command::new(promtool())
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(input.as_bytes()).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        let msg = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), msg)
    };
    let (code, msg) = run(text);
    assert_ne!(code, Some(1), "promtool cannot parse /metrics: {msg}");
    for line in msg.lines().filter(|l| !l.trim().is_empty()) {
        assert!(
            line.starts_with("DCGM_FI_") && line.contains("label names should be written in 'snake_case'"),
            "promtool check metrics: {line}"
        );
    }
    // Tessera's own families are lint-clean.
    let own: String = text
        .lines()
        .filter(|l| {
            !l.starts_with("DCGM_FI_") && !l.starts_with("# HELP DCGM_FI_") && !l.starts_with("# TYPE DCGM_FI_")
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let (code, msg) = run(&own);
    assert_eq!(code, Some(0), "promtool check metrics on Tessera's own series: {msg}");
}

async fn workload(s: &Server, tenant: &str, project: &str, name: String, shape: Value, priority: &str) -> (u16, Value) {
    s.post(
        "/api/v1/workloads",
        json!({"tenant": tenant, "project": project, "name": name, "shape": shape, "priority": priority}),
    )
    .await
}

/// Quotas and budgets: `PUT path body`, each answered with its status.
async fn put_all<const N: usize>(s: &Server, puts: [(&str, Value, u16); N]) {
    for (path, body, status) in puts {
        assert_eq!(s.put(path, body).await.0, status, "PUT {path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exposition_is_valid_and_bounded_with_1000_workloads() {
    let s = std::sync::Arc::new(Server::start("metrics-1000", false));
    let tenants = ["vision", "nlp", "speech", "robotics"];
    for t in tenants {
        s.tenant(t, &["train", "serve"]).await;
    }
    put_all(
        &s,
        [
            (
                "/api/v1/tenants/vision/quotas/training",
                json!({"guaranteed": 32, "limit": 64}),
                200,
            ),
            ("/api/v1/tenants/nlp/budget", json!({"monthly_unit_hours": 10000}), 204),
        ],
    )
    .await;
    let shapes = [
        json!({"mig": "1g.10gb"}),
        json!({"mig": "2g.20gb"}),
        json!({"mig": "3g.40gb"}),
        json!({"mig": "1g.20gb"}),
        json!({"fraction": 250}),
        json!({"fraction": 500}),
        json!({"fraction": 100}),
        json!({"gpus": 1, "pool": "training"}),
        json!({"gpus": 2, "pool": "training"}),
        json!({"gpus": 8, "pool": "training"}),
    ];
    let priorities = ["standard", "high", "opportunistic", "critical"];
    let mut tasks = tokio::task::JoinSet::new();
    let per_task = WORKLOADS / 10;
    for k in 0..10 {
        let s = s.clone();
        let shapes = shapes.clone();
        tasks.spawn(async move {
            let mut created = 0;
            for j in 0..per_task {
                let i = k * per_task + j;
                let (tenant, project) = (tenants[i % 4], ["train", "serve"][i / 4 % 2]);
                let (st, b) = workload(
                    &s,
                    tenant,
                    project,
                    format!("w{i}"),
                    shapes[i % shapes.len()].clone(),
                    priorities[i / 7 % 4],
                )
                .await;
                assert!(st == 201 || st == 403, "{st} {b}");
                created += (st == 201) as usize;
            }
            created
        });
    }
    let mut created = 0;
    while let Some(n) = tasks.join_next().await {
        created += n.unwrap();
    }
    assert!(created >= WORKLOADS * 9 / 10, "{created} workloads created");
    // Let the launches finish, the metering tick run and a telemetry sample see every MIG
    // instance (DCGM series come from the latest sample, MIG instances from the engine).
    let dcgm_of = |e: &Exposition| e.samples.iter().filter(|x| x.name.starts_with("DCGM_")).count() as f64;
    let mig_of = |e: &Exposition| e.find("tessera_mig_instances").map(|x| x.value).sum::<f64>();
    let (text, e) = eventually(Duration::from_secs(60), Duration::from_millis(500), || {
        let s = s.clone();
        async move {
            let text = s.scrape().await;
            let e = parse_exposition(&text).unwrap_or_else(|m| panic!("/metrics is not valid exposition text: {m}"));
            let placed = e
                .find("tessera_workloads")
                .find(|x| x.labels["state"] == "placed")
                .map(|x| x.value)?;
            let metered = e.find("tessera_gpu_unit_seconds_allocated_total").count();
            (placed == 0.0 && metered > 0 && dcgm_of(&e) == 7.0 * 480.0 + 3.0 * mig_of(&e)).then_some((text, e))
        }
    })
    .await
    .expect("every placed workload reaches running, is metered and has its DCGM series (7 per GPU, 3 per MIG instance) within 60 s");
    promtool_check(&text);

    let n = e.samples.len();
    let dcgm = dcgm_of(&e);
    let mig_instances = mig_of(&e);
    let live: f64 = e.find("tessera_workloads").map(|x| x.value).sum();
    println!(
        "/metrics on seed with {created} workloads ({live} live, {mig_instances} MIG instances): {n} series ({dcgm} DCGM, {} Tessera); bound {MAX_SERIES}",
        n - dcgm as usize
    );
    assert!(n <= MAX_SERIES, "{n} series exceed the bound of {MAX_SERIES}");
    // Bounded labels: no workload identities.
    for x in &e.samples {
        for k in x.labels.keys() {
            assert!(
                !["id", "workload", "workload_id", "name", "request_id"].contains(&k.as_str()),
                "label {k} on {}",
                x.name
            );
        }
        if let Some(r) = x.labels.get("route") {
            assert!(
                r == "(unmatched)" || r.starts_with('/') && !r.split('/').any(|seg| seg.parse::<u64>().is_ok()),
                "raw path as a route label: {r}"
            );
        }
    }
    // Every GPU is reported, idle ones included.
    assert_eq!(e.find("DCGM_FI_DEV_GPU_UTIL").count(), 480);
    let gpus: f64 = e.find("tessera_gpus").map(|x| x.value).sum();
    assert_eq!(gpus, 480.0);
    let queued: f64 = e.find("tessera_queue_depth").map(|x| x.value).sum();
    assert!(queued > 0.0, "some of the whole-GPU work waits");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboards_and_alerts_use_only_exported_metrics() {
    let s = Server::start("metrics-names", true);
    s.tenant("vision", &["train"]).await;
    s.tenant("nlp", &["serve"]).await;
    put_all(
        &s,
        [
            (
                "/api/v1/tenants/vision/quotas/training",
                json!({"guaranteed": 16, "limit": 200}),
                200,
            ),
            ("/api/v1/tenants/nlp/quotas/serving", json!({"guaranteed": 4}), 200),
            ("/api/v1/tenants/nlp/budget", json!({"monthly_unit_hours": 500}), 204),
        ],
    )
    .await;
    let mut ids = Vec::new();
    // 17 eight-GPU jobs for 16 nodes: one waits.
    for i in 0..17 {
        let (st, b) = workload(
            &s,
            "vision",
            "train",
            format!("big{i}"),
            json!({"gpus": 8, "pool": "training"}),
            "standard",
        )
        .await;
        assert_eq!(st, 201, "{b}");
        ids.push(b["id"].as_u64().unwrap());
    }
    for (i, shape) in [
        json!({"mig": "3g.40gb"}),
        json!({"mig": "1g.10gb"}),
        json!({"fraction": 300}),
    ]
    .into_iter()
    .enumerate()
    {
        let (st, b) = workload(&s, "nlp", "serve", format!("small{i}"), shape, "high").await;
        assert_eq!(st, 201, "{b}");
    }
    // A refusal (256 GPUs: more than the whole pool, even as a gang) and a templated route.
    let (st, _) = workload(
        &s,
        "nlp",
        "serve",
        "huge".into(),
        json!({"gpus": 256, "pool": "training"}),
        "standard",
    )
    .await;
    assert_eq!(st, 422);
    let (st, _) = s.get(&format!("/api/v1/workloads/{}", ids[0])).await;
    assert_eq!(st, 200);
    // A rolling upgrade (its series exist while one is running or was the latest).
    let (st, b) = s.post("/api/v1/rollouts", json!({"pool": "development"})).await;
    assert_eq!(st, 201, "{b}");

    // A scrape is timed like any request: it shows in the next one.
    s.scrape().await;
    let e = eventually(Duration::from_secs(30), Duration::from_millis(300), || async {
        let e = parse_exposition(&s.scrape().await).unwrap();
        let metered = e
            .find("tessera_gpu_unit_seconds_allocated_total")
            .any(|x| x.value > 0.0);
        let running = e.find("tessera_request_to_running_seconds_count").count() > 0;
        (metered && running).then_some(e)
    })
    .await
    .expect("workloads run and are metered within 30 s");

    // Route labels are templates.
    let routes: BTreeSet<&str> = e
        .find("tessera_api_request_duration_seconds_count")
        .map(|x| x.labels["route"].as_str())
        .collect();
    assert!(routes.contains("/api/v1/workloads/{id}"), "{routes:?}");
    assert!(routes.contains("/metrics"), "{routes:?}");
    let id = ids[0].to_string();
    assert!(!routes.iter().any(|r| r.split('/').any(|seg| seg == id)), "{routes:?}");

    // On the API address `/metrics` needs the metrics credential; the separate metrics port
    // (for a private network) serves the same families without one.
    let anonymous = s.http.get(format!("{}/metrics", s.base)).send().await.unwrap();
    assert_eq!(anonymous.status().as_u16(), 401);
    assert_eq!(anonymous.headers()["content-type"], "application/problem+json");
    // (Families such as the queue's exist only while something waits: compare two scrapes
    // taken back to back, again if the queue changed between them.)
    let families = |e: &Exposition| e.types.keys().cloned().collect::<Vec<_>>();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let api = families(&parse_exposition(&s.scrape().await).unwrap());
        let other =
            families(&parse_exposition(&scrape(&s.http, s.metrics_base.as_ref().unwrap(), None).await).unwrap());
        if api == other {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "--metrics-listen serves the same metrics: {api:?} vs {other:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let exported = e.names();
    let dcgm: BTreeSet<&str> = DCGM_METRICS.iter().copied().collect();
    let root = repo_root();
    let mut exprs = alert_exprs(&root.join("deploy/prometheus/alerts.yaml"));
    let mut dashboards = 0;
    for f in std::fs::read_dir(root.join("deploy/grafana")).unwrap() {
        let p = f.unwrap().path();
        if p.extension().is_some_and(|x| x == "json") {
            let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            dashboard_exprs(&v, &p.file_name().unwrap().to_string_lossy(), &mut exprs);
            dashboards += 1;
        }
    }
    assert!(dashboards >= 4, "four dashboards");
    let mut missing = Vec::new();
    let mut used = BTreeSet::new();
    for (at, expr) in &exprs {
        for name in promql_metric_names(expr) {
            if !exported.contains(&name) && !dcgm.contains(name.as_str()) {
                missing.push(format!("{at}: {name} (in `{expr}`)"));
            }
            used.insert(name);
        }
    }
    assert!(
        missing.is_empty(),
        "metric names neither exported by Tessera nor DCGM exporter names:\n{}",
        missing.join("\n")
    );
    assert!(used.len() > 30, "the extractor found the names: {used:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_faults_show_in_dcgm_xid_errors() {
    let s = Server::start("metrics-faults", false);
    s.tenant("vision", &["train"]).await;
    let (st, tok) = s
        .post("/api/v1/tokens", json!({"tenant": "vision", "role": "tenant-admin"}))
        .await;
    assert_eq!(st, 201, "{tok}");
    let member = tok["token"].as_str().unwrap().to_string();
    let fault = json!({"node": "a100-03", "gpu": 6, "xid": 48});
    let (st, b) = s
        .call(
            reqwest::Method::POST,
            "/api/v1/sim/faults",
            &member,
            Some(fault.clone()),
        )
        .await;
    assert_eq!(st, 403, "platform-admin only: {b}");
    let (st, b) = s
        .post("/api/v1/sim/faults", json!({"node": "a100-03", "gpu": 8, "xid": 48}))
        .await;
    assert_eq!((st, b["status"].as_u64()), (404, Some(404)), "{b}");
    let (st, _) = s
        .post("/api/v1/sim/faults", json!({"node": "z-99", "gpu": 0, "xid": 48}))
        .await;
    assert_eq!(st, 404);
    let (st, _) = s.post("/api/v1/sim/faults", json!({"node": "a100-03"})).await;
    assert_eq!(st, 422);
    let (st, b) = s.post("/api/v1/sim/faults", fault).await;
    assert_eq!(st, 200, "{b}");
    let uuid = b["uuid"].as_str().unwrap().to_string();

    // Telemetry arrives every interval: the XID shows in the next sample.
    let e = eventually(Duration::from_secs(10), Duration::from_millis(100), || async {
        let e = parse_exposition(&s.scrape().await).unwrap();
        let found = e.find("DCGM_FI_DEV_XID_ERRORS").any(|x| x.value != 0.0);
        found.then_some(e)
    })
    .await
    .expect("the XID is reported within a telemetry interval");
    let xid: Vec<_> = e.find("DCGM_FI_DEV_XID_ERRORS").filter(|x| x.value != 0.0).collect();
    assert_eq!(xid.len(), 1, "{xid:?}");
    let l = &xid[0].labels;
    assert_eq!(
        (
            l["Hostname"].as_str(),
            l["gpu"].as_str(),
            l["UUID"].as_str(),
            xid[0].value
        ),
        ("a100-03", "6", uuid.as_str(), 48.0)
    );
    assert_eq!(l["modelName"], "A100-80GB");
    let unhealthy: f64 = e
        .find("tessera_gpus")
        .filter(|x| x.labels["state"] == "unhealthy" && x.labels["pool"] == "serving")
        .map(|x| x.value)
        .sum();
    assert_eq!(unhealthy, 1.0);

    // MIG instances carry GPU_I_PROFILE / GPU_I_ID and the holder's tenant and project;
    // GPU_UTIL is never reported per instance.
    let (st, w) = workload(&s, "vision", "train", "m".into(), json!({"mig": "3g.40gb"}), "standard").await;
    assert_eq!(st, 201, "{w}");
    let e = eventually(Duration::from_secs(20), Duration::from_millis(200), || async {
        let e = parse_exposition(&s.scrape().await).unwrap();
        let found = e
            .find("DCGM_FI_PROF_GR_ENGINE_ACTIVE")
            .any(|x| x.labels.contains_key("GPU_I_PROFILE"));
        found.then_some(e)
    })
    .await
    .expect("the MIG instance is reported");
    let inst: Vec<_> = e
        .samples
        .iter()
        .filter(|x| x.labels.contains_key("GPU_I_PROFILE"))
        .collect();
    assert_eq!(inst.len(), 3, "FB_USED, FB_FREE, GR_ENGINE_ACTIVE: {inst:?}");
    for x in &inst {
        assert_eq!(x.labels["GPU_I_PROFILE"], "3g.40gb");
        assert_eq!(
            (x.labels["tenant"].as_str(), x.labels["project"].as_str()),
            ("vision", "train")
        );
        assert_ne!(x.name, "DCGM_FI_DEV_GPU_UTIL");
    }
    let profiles: f64 = e
        .find("tessera_mig_instances")
        .filter(|x| x.labels["profile"] == "3g.40gb")
        .map(|x| x.value)
        .sum();
    assert_eq!(profiles, 1.0);

    // XID 0 clears the fault.
    let (st, _) = s
        .post("/api/v1/sim/faults", json!({"node": "a100-03", "gpu": 6, "xid": 0}))
        .await;
    assert_eq!(st, 200);
    let cleared = eventually(Duration::from_secs(10), Duration::from_millis(100), || async {
        let e = parse_exposition(&s.scrape().await).unwrap();
        e.find("DCGM_FI_DEV_XID_ERRORS").all(|x| x.value == 0.0).then_some(())
    })
    .await;
    assert!(cleared.is_some(), "XID 0 clears the fault in the next sample");

    // Documented in the OpenAPI document like every route.
    let (_, doc) = s.get("/api/v1/openapi.json").await;
    let op = &doc["paths"]["/api/v1/sim/faults"]["post"];
    assert!(op.is_object(), "the fault route is in the OpenAPI document");
    for code in ["200", "403", "404", "409"] {
        assert!(op["responses"][code].is_object(), "response {code} documented");
    }
}

#[test]
fn alert_rules_have_severity_summary_description_and_runbook() {
    let root = repo_root();
    let doc: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(root.join("deploy/prometheus/alerts.yaml")).unwrap()).unwrap();
    let groups = doc["groups"].as_sequence().unwrap();
    let names: Vec<&str> = groups.iter().map(|g| g["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["gpu-health", "capacity", "quota-budget", "control-plane", "metering"]
    );
    let tests = std::fs::read_to_string(root.join("deploy/prometheus/alerts_test.yaml")).unwrap();
    for g in groups {
        let group = g["name"].as_str().unwrap();
        let runbook = root.join(format!("docs/runbooks/{group}.md"));
        let page = std::fs::read_to_string(&runbook).unwrap_or_else(|_| panic!("{} exists", runbook.display()));
        for r in g["rules"].as_sequence().unwrap() {
            let alert = r["alert"].as_str().unwrap();
            assert!(
                ["critical", "warning", "info"].contains(&r["labels"]["severity"].as_str().unwrap_or("")),
                "{alert}: severity"
            );
            let a = &r["annotations"];
            assert!(a["summary"].as_str().is_some_and(|x| !x.is_empty()), "{alert}: summary");
            assert!(
                a["description"].as_str().is_some_and(|x| x.len() > 20),
                "{alert}: description"
            );
            let url = a["runbook_url"].as_str().unwrap_or("");
            assert_eq!(
                url,
                format!("docs/runbooks/{group}.md#{}", alert.to_lowercase()),
                "{alert}: runbook_url"
            );
            assert!(
                page.contains(&format!("## {alert}")),
                "{alert}: a section in {group}.md"
            );
            // Unit-tested firing and not firing.
            let firing = format!("alertname: {alert}\n        exp_alerts:\n          - exp_labels");
            let quiet = format!("alertname: {alert}\n        exp_alerts: []");
            assert!(tests.contains(&firing), "{alert}: a firing test in alerts_test.yaml");
            assert!(tests.contains(&quiet), "{alert}: a not-firing test in alerts_test.yaml");
        }
    }
}
