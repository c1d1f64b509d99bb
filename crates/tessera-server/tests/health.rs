//! GPU health end to end on the simulated backend: a critical XID takes the GPU out of
//! placement at once, tells the workload on it (a `gpu-unhealthy` event), shows in
//! `/api/v1/gpus/health` and `/metrics`, survives a restart, and only a platform admin's clear
//! (audited) puts it back; a non-critical XID does none of that. And node lifecycle: a drain
//! moves a service (its replacement runs elsewhere before the old one stops), lets batch work
//! finish, and ends in maintenance.

use std::time::Duration;

use crate::support::{TestServer, poll};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tessera_server::{ServerConfig, lifecycle::GpuFailurePolicy};

/// A server acting on GPU failures by `policy`, with tenant `vision` and its project `train`.
async fn server(tag: &str, policy: GpuFailurePolicy) -> TestServer {
    let s = TestServer::start_with(&format!("health-{tag}"), |c| ServerConfig {
        on_gpu_failure: policy,
        ..c
    })
    .await;
    s.tenant_with_project("vision", "train").await;
    s
}

/// A second control plane on the same database, as after a restart.
async fn restart(s: &TestServer, policy: GpuFailurePolicy) -> TestServer {
    s.restart(|c| ServerConfig {
        on_gpu_failure: policy,
        ..c
    })
    .await
}

async fn run(s: &TestServer, shape: Value) -> Value {
    run_body(
        s,
        json!({"tenant": "vision", "project": "train", "name": "job", "shape": shape}),
    )
    .await
}

async fn run_body(s: &TestServer, body: Value) -> Value {
    let (st, w) = s.post("/api/v1/workloads", body).await;
    assert_eq!(st, StatusCode::CREATED, "{w}");
    s.wait_state(w["id"].as_u64().unwrap(), &["running"]).await
}

async fn health(s: &TestServer) -> Vec<Value> {
    s.get("/api/v1/gpus/health").await.as_array().unwrap().clone()
}

async fn until_unhealthy(s: &TestServer, n: usize) -> Vec<Value> {
    let h = poll(
        300,
        Duration::from_millis(20),
        async || health(s).await,
        |h| h.len() >= n,
    )
    .await;
    assert!(h.len() >= n, "never {n} unhealthy GPUs: {h:?}");
    h
}

async fn fault(s: &TestServer, node: &str, gpu: u64, xid: u32) {
    let (st, v) = s
        .post("/api/v1/sim/faults", json!({"node": node, "gpu": gpu, "xid": xid}))
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
}

/// Polls `GET path` (25 ms apart, 10 s at most) until `done` holds for it; returns the last answer.
async fn until(s: &TestServer, path: &str, done: impl Fn(&Value) -> bool) -> Value {
    poll(400, Duration::from_millis(25), async || s.get(path).await, done).await
}

fn where_(w: &Value) -> (String, u64) {
    let a = &w["allocation"];
    (a["node"].as_str().unwrap().to_string(), a["gpus"][0].as_u64().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_critical_xid_fences_the_gpu_until_an_admin_clears_it() {
    let s = server("fence", GpuFailurePolicy::Leave).await;
    let w = run(&s, json!({"gpus": 1, "pool": "training"})).await;
    let id = w["id"].as_u64().unwrap();
    let (node, gpu) = where_(&w);

    // A non-critical XID (13: graphics engine exception, an application fault) changes nothing.
    fault(&s, &node, gpu, 13).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(health(&s).await.is_empty());

    fault(&s, &node, gpu, 79).await;
    let h = until_unhealthy(&s, 1).await;
    assert_eq!(
        (h[0]["node"].as_str().unwrap(), h[0]["gpu"].as_u64().unwrap()),
        (node.as_str(), gpu)
    );
    assert_eq!(h[0]["xid"], 79);
    assert_eq!(h[0]["workloads"], json!([id]), "{h:?}");

    // The workload keeps running (policy `leave`) and its timeline says why.
    let w = s.get(&format!("/api/v1/workloads/{id}")).await;
    assert_eq!(w["state"], "running");
    let events = format!("/api/v1/workloads/{id}/events");
    let text = poll(
        100,
        Duration::from_millis(20),
        async || s.get(&events).await.to_string(),
        |t| t.contains("gpu-unhealthy"),
    )
    .await;
    assert!(
        text.contains("gpu-unhealthy") && text.contains("keeps running"),
        "{text}"
    );

    // Nothing new lands on that GPU: the next 1-GPU jobs (best fit would pick the partly used
    // node first) go elsewhere.
    for _ in 0..3 {
        let other = run(&s, json!({"gpus": 1, "pool": "training"})).await;
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
    fault(&s, &node, gpu, 0).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(health(&s).await.len(), 1);

    // A second control plane on the same database (as after a restart) still fences it.
    let again = restart(&s, GpuFailurePolicy::Leave).await;
    let h = health(&again).await;
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
    assert!(health(&s).await.is_empty());
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_policy_stops_batch_work_on_a_failed_gpu() {
    let s = server("requeue", GpuFailurePolicy::Requeue).await;
    let w = run(&s, json!({"gpus": 1, "pool": "training"})).await;
    let id = w["id"].as_u64().unwrap();
    let (node, gpu) = where_(&w);
    fault(&s, &node, gpu, 48).await;
    // Stopped, requeued and placed again: never on the failed GPU.
    let elsewhere = |w: &Value| w["state"] == "running" && where_(w) != (node.clone(), gpu);
    let w = until(&s, &format!("/api/v1/workloads/{id}"), elsewhere).await;
    let placed_again = elsewhere(&w).then_some(w);
    let w = placed_again.expect("the batch job runs again elsewhere");
    assert_ne!(where_(&w), (node, gpu));
    let events = s.get(&format!("/api/v1/workloads/{id}/events")).await.to_string();
    assert!(
        events.contains("gpu-unhealthy") && events.contains("requeued"),
        "{events}"
    );
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
    let s = server("drain", GpuFailurePolicy::Leave).await;
    let shape = json!({"gpus": 1, "pool": "training"});
    let svc = run_body(
        &s,
        json!({"tenant": "vision", "project": "train", "name": "svc", "kind": "service", "shape": shape}),
    )
    .await;
    let svc_id = svc["id"].as_u64().unwrap();
    let (node, _) = where_(&svc);
    // Best fit puts the batch job next to the service.
    let job = run_body(
        &s,
        json!({"tenant": "vision", "project": "train", "name": "job", "shape": shape, "duration_s": 2}),
    )
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
    let old = until(&s, &format!("/api/v1/workloads/{svc_id}"), |w| {
        w["state"] == "preempted"
    })
    .await;
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
    let nodes = until(&s, &format!("/api/v1/nodes?node={node}"), |n| {
        n["items"][0]["state"] == "maintenance"
    })
    .await;
    let state = nodes["items"][0]["state"].as_str().unwrap().to_string();
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
    let again = restart(&s, GpuFailurePolicy::Leave).await;
    let nodes = again.get(&format!("/api/v1/nodes?node={node}")).await;
    assert_eq!(nodes["items"][0]["state"], "maintenance");
    let (st, v) = s
        .call(Method::POST, &format!("/api/v1/nodes/{node}/uncordon"), None)
        .await;
    assert_eq!((st, v["state"].as_str()), (StatusCode::OK, Some("ready")), "{v}");
}

/// A drain's deadline and policy may come as a JSON body as well as query parameters: a body
/// `{"deadline_s": 1, "after": "preempt"}` preempts what is left after a second (before, the
/// body was ignored and the drain waited for ever). A body breaking a rule, one that disagrees
/// with the query, a body for another action and a tenant's token are refused with problem JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_takes_its_deadline_from_a_json_body() {
    let s = server("drainbody", GpuFailurePolicy::Leave).await;
    let job = run(&s, json!({"gpus": 1, "pool": "training"})).await;
    let id = job["id"].as_u64().unwrap();
    let (node, _) = where_(&job);
    let drain = format!("/api/v1/nodes/{node}/drain");
    for (path, body, status, field) in [
        (drain.clone(), json!({"deadline_s": 1, "after": "kill"}), 422, "after"),
        (drain.clone(), json!({"after": "preempt"}), 422, "after"),
        (drain.clone(), json!({"deadline_s": 99_999_999}), 422, "deadline_s"),
        (drain.clone(), json!({"deadline": 5}), 422, "deadline"),
        (
            format!("{drain}?deadline_s=5"),
            json!({"deadline_s": 6}),
            422,
            "deadline_s",
        ),
        (
            format!("/api/v1/nodes/{node}/cordon"),
            json!({"deadline_s": 6}),
            422,
            "deadline_s",
        ),
    ] {
        let (st, p) = s.call(Method::POST, &path, Some(body.clone())).await;
        assert_eq!(
            (st.as_u16(), p["field"].as_str()),
            (status, Some(field)),
            "{path} {body}: {p}"
        );
    }
    let r = s
        .request(Some(&s.admin), Method::POST, &drain)
        .header("content-type", "text/plain")
        .body("deadline_s=1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let member = s.token("vision", "member").await;
    let (st, _) = s
        .call_as(Some(&member), Method::POST, &drain, Some(json!({"deadline_s": 1})))
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let n = s.get(&format!("/api/v1/nodes?node={node}")).await;
    assert_eq!(n["items"][0]["state"], "ready", "refused drains change nothing: {n}");
    assert_eq!(s.get(&format!("/api/v1/workloads/{id}")).await["state"], "running");

    let (st, v) = s
        .call(Method::POST, &drain, Some(json!({"deadline_s": 1, "after": "preempt"})))
        .await;
    assert_eq!((st, v["state"].as_str()), (StatusCode::OK, Some("draining")), "{v}");
    // The job runs until cancelled: only the body's deadline and policy end it on this node.
    let w = until(&s, &format!("/api/v1/workloads/{id}"), |w| {
        w["state"] != "running" || w["allocation"]["node"].as_str() != Some(node.as_str())
    })
    .await;
    assert_ne!(
        (w["state"].as_str(), w["allocation"]["node"].as_str()),
        (Some("running"), Some(node.as_str())),
        "the body's deadline applied: {w}"
    );
    let events = s.get(&format!("/api/v1/workloads/{id}/events")).await.to_string();
    assert!(events.contains("node-drain"), "{events}");
    let n = until(&s, &format!("/api/v1/nodes?node={node}"), |n| {
        n["items"][0]["state"] == "maintenance"
    })
    .await;
    assert_eq!(n["items"][0]["state"], "maintenance", "{n}");
}
