//! GPU health end to end on the simulated backend: a critical XID takes the GPU out of
//! placement at once, tells the workload on it (a `gpu-unhealthy` event), shows in
//! `/api/v1/gpus/health` and `/metrics`, survives a restart, and only a platform admin's clear
//! (audited) puts it back; a non-critical XID does none of that. And node lifecycle: a drain
//! moves a service (its replacement runs elsewhere before the old one stops), lets batch work
//! finish, and ends in maintenance.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tessera_server::{ServerConfig, lifecycle::GpuFailurePolicy, start};

struct Srv {
    base: String,
    token: String,
    http: reqwest::Client,
}

fn dir(tag: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!(
        "tessera-health-{tag}-{}-{}",
        std::process::id(),
        tessera_server::now_ms()
    ));
    std::fs::create_dir_all(&p).unwrap();
    p
}

async fn server(dir: &std::path::Path, policy: GpuFailurePolicy, token: Option<String>) -> Srv {
    let cfg = ServerConfig {
        on_gpu_failure: policy,
        ..ServerConfig::local(dir.to_path_buf())
    };
    let r = start(cfg).await.unwrap();
    Srv {
        base: format!("http://{}", r.addr),
        token: token.or(r.admin_token).expect("an admin token"),
        http: reqwest::Client::new(),
    }
}

impl Srv {
    async fn call(&self, m: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut rb = self
            .http
            .request(m, format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let r = rb.send().await.unwrap();
        let st = r.status();
        let text = r.text().await.unwrap();
        (st, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> Value {
        let (st, v) = self.call(Method::GET, path, None).await;
        assert_eq!(st, StatusCode::OK, "{path}: {v}");
        v
    }

    async fn run(&self, shape: Value) -> Value {
        self.run_body(json!({"tenant": "vision", "project": "train", "name": "job", "shape": shape}))
            .await
    }

    async fn run_body(&self, body: Value) -> Value {
        let (st, w) = self.call(Method::POST, "/api/v1/workloads", Some(body)).await;
        assert_eq!(st, StatusCode::CREATED, "{w}");
        let id = w["id"].as_u64().unwrap();
        for _ in 0..300 {
            let w = self.get(&format!("/api/v1/workloads/{id}")).await;
            if w["state"] == "running" {
                return w;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("workload {id} never ran");
    }

    async fn health(&self) -> Vec<Value> {
        self.get("/api/v1/gpus/health").await.as_array().unwrap().clone()
    }

    async fn until_unhealthy(&self, n: usize) -> Vec<Value> {
        for _ in 0..300 {
            let h = self.health().await;
            if h.len() >= n {
                return h;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("never {n} unhealthy GPUs");
    }

    async fn fault(&self, node: &str, gpu: u64, xid: u32) {
        let (st, v) = self
            .call(
                Method::POST,
                "/api/v1/sim/faults",
                Some(json!({"node": node, "gpu": gpu, "xid": xid})),
            )
            .await;
        assert_eq!(st, StatusCode::OK, "{v}");
    }

    async fn metrics(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

fn where_(w: &Value) -> (String, u64) {
    let a = &w["allocation"];
    (a["node"].as_str().unwrap().to_string(), a["gpus"][0].as_u64().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_critical_xid_fences_the_gpu_until_an_admin_clears_it() {
    let d = dir("fence");
    let s = server(&d, GpuFailurePolicy::Leave, None).await;
    s.call(Method::POST, "/api/v1/tenants", Some(json!({"name": "vision"})))
        .await;
    s.call(
        Method::POST,
        "/api/v1/tenants/vision/projects",
        Some(json!({"name": "train"})),
    )
    .await;
    let w = s.run(json!({"gpus": 1, "pool": "training"})).await;
    let id = w["id"].as_u64().unwrap();
    let (node, gpu) = where_(&w);

    // A non-critical XID (13: graphics engine exception, an application fault) changes nothing.
    s.fault(&node, gpu, 13).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(s.health().await.is_empty());

    s.fault(&node, gpu, 79).await;
    let h = s.until_unhealthy(1).await;
    assert_eq!(
        (h[0]["node"].as_str().unwrap(), h[0]["gpu"].as_u64().unwrap()),
        (node.as_str(), gpu)
    );
    assert_eq!(h[0]["xid"], 79);
    assert_eq!(h[0]["workloads"], json!([id]), "{h:?}");

    // The workload keeps running (policy `leave`) and its timeline says why.
    let w = s.get(&format!("/api/v1/workloads/{id}")).await;
    assert_eq!(w["state"], "running");
    let mut text = String::new();
    for _ in 0..100 {
        text = s.get(&format!("/api/v1/workloads/{id}/events")).await.to_string();
        if text.contains("gpu-unhealthy") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        text.contains("gpu-unhealthy") && text.contains("keeps running"),
        "{text}"
    );

    // Nothing new lands on that GPU: the next 1-GPU jobs (best fit would pick the partly used
    // node first) go elsewhere.
    for _ in 0..3 {
        let other = s.run(json!({"gpus": 1, "pool": "training"})).await;
        assert_ne!(where_(&other), (node.clone(), gpu), "placed on the unhealthy GPU");
    }

    let m = s.metrics().await;
    let sum = |name: &str, labels: &[&str]| -> f64 {
        m.lines()
            .filter(|l| l.starts_with(name) && labels.iter().all(|x| l.contains(x)))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum()
    };
    assert_eq!(sum("tessera_gpu_failures_total{", &["cause=\"xid\""]), 1.0, "{m}");
    assert_eq!(
        sum("tessera_gpus{", &["pool=\"training\"", "state=\"unhealthy\""]),
        1.0,
        "metrics show the unhealthy GPU"
    );

    // The backend calling the GPU healthy again does not put it back: only an admin does.
    s.fault(&node, gpu, 0).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(s.health().await.len(), 1);

    // A second control plane on the same database (as after a restart) still fences it.
    let again = server(&d, GpuFailurePolicy::Leave, Some(s.token.clone())).await;
    let h = again.health().await;
    assert_eq!(h.len(), 1, "health survives a restart");
    assert_eq!(h[0]["node"], node.as_str());

    // Bad input answers problem JSON; the clear is audited.
    let (st, p) = s
        .call(Method::POST, &format!("/api/v1/gpus/{node}/99/clear"), None)
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("there is no GPU 99"));
    let (st, _) = s
        .call(Method::POST, &format!("/api/v1/gpus/{node}/{gpu}/clear"), None)
        .await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    assert!(s.health().await.is_empty());
    let (st, p) = s
        .call(Method::POST, &format!("/api/v1/gpus/{node}/{gpu}/clear"), None)
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{p}");
    let audit = s.get("/api/v1/audit?limit=50").await;
    let target = format!("/api/v1/gpus/{node}/{gpu}/clear");
    let cleared: Vec<&Value> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["target"] == target.as_str() && r["outcome"] == 204)
        .collect();
    assert_eq!(cleared.len(), 1, "one audit record of the clear: {audit}");
    assert_eq!(cleared[0]["actor"], "tok-admin");
    let _ = std::fs::remove_dir_all(&d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_policy_stops_batch_work_on_a_failed_gpu() {
    let d = dir("requeue");
    let s = server(&d, GpuFailurePolicy::Requeue, None).await;
    s.call(Method::POST, "/api/v1/tenants", Some(json!({"name": "vision"})))
        .await;
    s.call(
        Method::POST,
        "/api/v1/tenants/vision/projects",
        Some(json!({"name": "train"})),
    )
    .await;
    let w = s.run(json!({"gpus": 1, "pool": "training"})).await;
    let id = w["id"].as_u64().unwrap();
    let (node, gpu) = where_(&w);
    s.fault(&node, gpu, 48).await;
    // Stopped, requeued and placed again: never on the failed GPU.
    let mut placed_again = None;
    for _ in 0..400 {
        let w = s.get(&format!("/api/v1/workloads/{id}")).await;
        if w["state"] == "running" && where_(&w) != (node.clone(), gpu) {
            placed_again = Some(w);
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let w = placed_again.expect("the batch job runs again elsewhere");
    assert_ne!(where_(&w), (node, gpu));
    let events = s.get(&format!("/api/v1/workloads/{id}/events")).await.to_string();
    assert!(
        events.contains("gpu-unhealthy") && events.contains("requeued"),
        "{events}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

fn step_at(events: &Value, step: &str) -> Option<i64> {
    events
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["step"] == step)
        .map(|e| e["at_ms"].as_i64().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_moves_services_first_lets_batch_work_finish_and_ends_in_maintenance() {
    let d = dir("drain");
    let s = server(&d, GpuFailurePolicy::Leave, None).await;
    s.call(Method::POST, "/api/v1/tenants", Some(json!({"name": "vision"})))
        .await;
    s.call(
        Method::POST,
        "/api/v1/tenants/vision/projects",
        Some(json!({"name": "train"})),
    )
    .await;
    let shape = json!({"gpus": 1, "pool": "training"});
    let svc = s
        .run_body(json!({"tenant": "vision", "project": "train", "name": "svc", "kind": "service", "shape": shape}))
        .await;
    let svc_id = svc["id"].as_u64().unwrap();
    let (node, _) = where_(&svc);
    // Best fit puts the batch job next to the service.
    let job = s
        .run_body(json!({"tenant": "vision", "project": "train", "name": "job", "shape": shape, "duration_s": 2}))
        .await;
    let job_id = job["id"].as_u64().unwrap();
    assert_eq!(where_(&job).0, node);

    // Bad input: problem JSON naming the field.
    let (st, p) = s
        .call(
            Method::POST,
            &format!("/api/v1/nodes/{node}/drain?after=kill&deadline_s=5"),
            None,
        )
        .await;
    assert_eq!(
        (st, p["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("after")),
        "{p}"
    );
    let (st, _) = s.call(Method::POST, "/api/v1/nodes/nope/drain", None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, p) = s
        .call(Method::POST, &format!("/api/v1/nodes/{node}/maintenance"), None)
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "maintenance needs an empty node: {p}");

    let (st, v) = s.call(Method::POST, &format!("/api/v1/nodes/{node}/drain"), None).await;
    assert_eq!((st, v["state"].as_str()), (StatusCode::OK, Some("draining")), "{v}");

    // The service ends only after its replacement runs, on another node.
    let mut old = Value::Null;
    for _ in 0..400 {
        old = s.get(&format!("/api/v1/workloads/{svc_id}")).await;
        if old["state"] == "preempted" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(old["state"], "preempted", "{old}");
    assert_eq!(old["reason_code"], "node-drain");
    let list = s.get("/api/v1/workloads?limit=50").await;
    let repl = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == "svc" && w["id"] != svc_id)
        .expect("a replacement service")
        .clone();
    let repl_id = repl["id"].as_u64().unwrap();
    assert_eq!(repl["state"], "running");
    assert_ne!(where_(&repl).0, node, "the replacement runs elsewhere");
    let old_events = s.get(&format!("/api/v1/workloads/{svc_id}/events")).await;
    let new_events = s.get(&format!("/api/v1/workloads/{repl_id}/events")).await;
    let stopped_at = step_at(&old_events, "preempted").expect("the old service was stopped");
    let replaced_at = step_at(&new_events, "running").expect("the replacement ran");
    assert!(
        replaced_at <= stopped_at,
        "replacement running at {replaced_at}, old stopped at {stopped_at}"
    );

    // The batch job is not cut off: it finishes, then the node is in maintenance.
    let mut state = String::new();
    for _ in 0..400 {
        let nodes = s.get(&format!("/api/v1/nodes?node={node}")).await;
        state = nodes["items"][0]["state"].as_str().unwrap().to_string();
        if state == "maintenance" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(state, "maintenance");
    assert_eq!(
        s.get(&format!("/api/v1/workloads/{job_id}")).await["state"],
        "succeeded"
    );
    let job_events = s.get(&format!("/api/v1/workloads/{job_id}/events")).await.to_string();
    assert!(
        job_events.contains("node-drain"),
        "the batch job was told: {job_events}"
    );
    let m = s.metrics().await;
    assert!(
        m.lines().any(|l| l.starts_with("tessera_nodes{")
            && l.contains("pool=\"training\"")
            && l.contains("state=\"maintenance\"")
            && l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() == 1.0),
        "{m}"
    );

    // Survives a restart; uncordon makes it ready.
    let again = server(&d, GpuFailurePolicy::Leave, Some(s.token.clone())).await;
    let nodes = again.get(&format!("/api/v1/nodes?node={node}")).await;
    assert_eq!(nodes["items"][0]["state"], "maintenance");
    let (st, v) = s
        .call(Method::POST, &format!("/api/v1/nodes/{node}/uncordon"), None)
        .await;
    assert_eq!((st, v["state"].as_str()), (StatusCode::OK, Some("ready")), "{v}");
    let _ = std::fs::remove_dir_all(&d);
}
