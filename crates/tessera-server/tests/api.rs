//! End-to-end tests through HTTP against a server started on a free port, on the seed fleet
//! with the simulated backend, each once on a fresh SQLite database and once on a fresh
//! PostgreSQL database.

use std::sync::Arc;
use std::time::Duration;

use crate::support::{Parts, TestServer, poll};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tessera_server::ServerConfig;
use tessera_testdb::Db;

/// Calls to a server with one token; every refusal must be problem JSON.
struct Srv {
    server: Arc<TestServer>,
    token: String,
}

async fn server(db: Db, tag: &str) -> Srv {
    let server = TestServer::start_on(&format!("test-{tag}-{db:?}"), Parts::on(db.url()), |c| ServerConfig {
        grace: Duration::from_secs(5),
        govern: tessera_sched::cycle::GovernConfig {
            min_runtime_ms: 0,
            reclaim_after_ms: 0,
            ..Default::default()
        },
        ..c
    })
    .await;
    let token = server.admin.clone();
    let dir = &server.dir.0;
    let on_disk = std::fs::read_to_string(dir.join("admin-token")).unwrap();
    assert_eq!(on_disk.trim(), token);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(dir.join("admin-token")).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
    Srv {
        server: Arc::new(server),
        token,
    }
}

impl Srv {
    /// The same server, called with `token`.
    fn with_token(&self, token: &str) -> Srv {
        Srv {
            server: self.server.clone(),
            token: token.to_string(),
        }
    }

    /// A request for `path` with this caller's token.
    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.server.request(Some(&self.token), method, path)
    }

    async fn req(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> (StatusCode, Value) {
        let mut rb = self.request(method, path);
        for (k, v) in headers {
            rb = rb.header(*k, *v);
        }
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let r = rb.send().await.unwrap();
        let status = r.status();
        let ct = r
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let text = r.text().await.unwrap();
        if !status.is_success() {
            assert_eq!(
                ct, "application/problem+json",
                "errors are problem JSON: {status} {text}"
            );
        }
        (
            status,
            if text.is_empty() {
                Value::Null
            } else {
                serde_json::from_str(&text).unwrap()
            },
        )
    }

    async fn get(&self, path: &str) -> Value {
        let (s, v) = self.req(reqwest::Method::GET, path, None, &[]).await;
        assert_eq!(s, StatusCode::OK, "{path}: {v}");
        v
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.req(reqwest::Method::POST, path, Some(body), &[]).await
    }

    /// Creates `tenant` with one project, `project`.
    async fn tenant(&self, tenant: &str, project: &str) {
        assert_eq!(
            self.post("/api/v1/tenants", json!({"name": tenant})).await.0,
            StatusCode::CREATED
        );
        assert_eq!(
            self.post(&format!("/api/v1/tenants/{tenant}/projects"), json!({"name": project}))
                .await
                .0,
            StatusCode::CREATED
        );
    }

    async fn wait_state(&self, id: u64, state: &str) -> Value {
        self.server.wait_state(id, &[state]).await
    }

    /// A report as CSV: its text.
    async fn csv(&self, path: &str) -> String {
        let r = self.request(reqwest::Method::GET, path).send().await.unwrap();
        assert_eq!(r.headers()["content-type"], "text/csv; charset=utf-8");
        r.text().await.unwrap()
    }

    async fn units_used(&self, pool: &str) -> String {
        let p = self.get("/api/v1/pools").await;
        p["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == pool)
            .unwrap()["units_used"]
            .as_str()
            .unwrap()
            .to_string()
    }

    async fn workload_count(&self) -> usize {
        self.get("/api/v1/workloads?limit=500").await["items"]
            .as_array()
            .unwrap()
            .len()
    }
}

fn wl(shape: Value) -> Value {
    json!({"tenant": "vision", "project": "train", "name": "job", "shape": shape})
}

async fn create_run_cancel_release(db: Db) {
    let s = server(db, "lifecycle").await;
    s.tenant("vision", "train").await;
    let (st, w) = s.post("/api/v1/workloads", wl(json!({"mig": "3g.40gb"}))).await;
    assert_eq!(st, StatusCode::CREATED, "{w}");
    let id = w["id"].as_u64().unwrap();
    let running = s.wait_state(id, "running").await;
    assert_eq!(running["allocation"]["kind"], "mig");
    assert_eq!(running["allocation"]["mig_profile_id"], 9);
    assert_eq!(running["units"], "0.5");
    assert!(running["request_to_running_ms"].as_u64().unwrap() < 1000);
    assert_eq!(s.units_used("serving").await, "0.5");

    // 8 whole H100s.
    let (st, big) = s
        .post("/api/v1/workloads", wl(json!({"gpus": 8, "models": ["h100"]})))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{big}");
    let big_id = big["id"].as_u64().unwrap();
    let big = s.wait_state(big_id, "running").await;
    assert_eq!(big["allocation"]["gpus"], json!([0, 1, 2, 3, 4, 5, 6, 7]));
    assert_eq!(s.units_used("training").await, "8");

    // list and get agree
    let list = s.get("/api/v1/workloads?tenant=vision").await;
    let from_list = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["id"] == id)
        .unwrap()
        .clone();
    assert_eq!(from_list, s.get(&format!("/api/v1/workloads/{id}")).await);

    // GPU view shows the holder
    let gpus = s.get("/api/v1/gpus?pool=serving&node=a100-00").await;
    let g0 = &gpus["items"][0];
    assert_eq!(g0["mig_slices"], "....####");
    assert_eq!(g0["slices"][0]["workload"], id);
    assert_eq!(g0["slices"][0]["tenant"], "vision");

    // cancel → released, capacity back
    let (st, c) = s.post(&format!("/api/v1/workloads/{id}/cancel"), json!({})).await;
    assert_eq!(st, StatusCode::OK, "{c}");
    s.wait_state(id, "cancelled").await;
    assert_eq!(s.units_used("serving").await, "0");
    let (st, _) = s.post(&format!("/api/v1/workloads/{id}/cancel"), json!({})).await;
    assert_eq!(st, StatusCode::CONFLICT, "cancelling an ended workload");

    let events = s.get(&format!("/api/v1/workloads/{id}/events")).await;
    let steps: Vec<&str> = events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["step"].as_str().unwrap())
        .collect();
    assert_eq!(
        steps,
        [
            "requested",
            "authorised",
            "placed",
            "partitioned",
            "running",
            "observed",
            "metered",
            "cancelled",
            "released"
        ]
    );
}

async fn batch_workloads_complete_and_queue_drains(db: Db) {
    let s = server(db, "queue").await;
    s.tenant("vision", "train").await;
    // Fill the training pool (16 nodes × 8) with short jobs, then one more waits.
    let mut ids = Vec::new();
    for _ in 0..16 {
        let (st, w) = s.post("/api/v1/workloads", json!({"tenant": "vision", "project": "train", "name": "fill", "shape": {"gpus": 8, "pool": "training"}, "duration_s": 1})).await;
        assert_eq!(st, StatusCode::CREATED);
        ids.push(w["id"].as_u64().unwrap());
    }
    let (_, w) = s.post("/api/v1/workloads", json!({"tenant": "vision", "project": "train", "name": "wait", "shape": {"gpus": 8, "pool": "training"}, "duration_s": 1})).await;
    assert_eq!(w["state"], "queued", "{w}");
    assert_eq!(w["reason_code"], "no-capacity", "{w}");
    let wid = w["id"].as_u64().unwrap();
    s.wait_state(ids[0], "succeeded").await;
    s.wait_state(wid, "running").await;
    s.wait_state(wid, "succeeded").await;
    assert_eq!(s.units_used("training").await, "0");
}

/// A gang that cannot start now is told, in the dry run, when and where it would: the rack
/// where the work running on enough nodes ends first, by its leases.
async fn a_gangs_dry_run_says_when_and_where_it_would_start(db: Db) {
    let s = server(db, "gangstart").await;
    s.tenant("vision", "train").await;
    // The training pool (16 nodes of 8 in racks of 4) full: the first four jobs' leases end in
    // an hour, the next eight in two, the last four have none.
    let mut ids = Vec::new();
    for i in 0..16 {
        let mut body =
            json!({"tenant": "vision", "project": "train", "name": "fill", "shape": {"gpus": 8, "pool": "training"}});
        match i {
            0..4 => body["duration_s"] = json!(3600),
            4..12 => body["duration_s"] = json!(7200),
            _ => {}
        }
        let (st, w) = s.post("/api/v1/workloads", body).await;
        assert_eq!(st, StatusCode::CREATED, "{w}");
        ids.push(w["id"].as_u64().unwrap());
    }
    for id in &ids {
        s.wait_state(*id, "running").await;
    }
    let gang = |gpus: u32| json!({"tenant": "vision", "project": "train", "name": "g", "shape": {"gpus": gpus, "pool": "training"}});
    // The dry run answers on the last published snapshot, which may lag the placements by a
    // publication.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let d = loop {
        let (st, d) = s.post("/api/v1/workloads/dry-run", gang(32)).await;
        assert_eq!(st, StatusCode::OK, "{d}");
        if d["outcome"] == "wait" || std::time::Instant::now() > deadline {
            break d;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(d["outcome"], "wait", "{d}");
    // This server has no price list: the dry run says so beside its 0 price.
    assert_eq!(
        (&d["priced"], &d["price_per_unit_hour"]),
        (&json!(false), &json!(0.0)),
        "{d}"
    );
    let reason = d["reason"].as_str().unwrap();
    let first = s.get(&format!("/api/v1/workloads/{}", ids[0])).await;
    let node = first["allocation"]["node"].as_str().unwrap().to_string();
    let nodes = s.get("/api/v1/nodes?pool=training").await;
    let list = nodes.as_array().or_else(|| nodes["items"].as_array()).unwrap();
    let rack = list
        .iter()
        .find(|n| n["name"] == node.as_str())
        .and_then(|n| n["rack"].as_str())
        .expect("the seed's training nodes are in racks")
        .to_string();
    assert!(reason.contains("if it waits, it starts at about 20"), "{reason}");
    assert!(
        reason.contains(&format!(" UTC in rack {rack} when 4 workloads there end")),
        "the rack whose work ends first: {reason}"
    );
    // 128 GPUs need every node, four of which run work with no lease: no time is promised.
    let (_, d) = s.post("/api/v1/workloads/dry-run", gang(128)).await;
    let reason = d["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("its start") && reason.contains("is unknown"), "{d}");
    // Submitted, the 32-GPU gang waits without a hold (inside the backfill window); the answer
    // for it says what the dry run said, the list does not compute it.
    let expected = reason_start(&s, gang(32)).await;
    let (st, w) = s.post("/api/v1/workloads", gang(32)).await;
    assert_eq!(st, StatusCode::CREATED, "{w}");
    let id = w["id"].as_u64().unwrap();
    let w = s.wait_state(id, "queued").await;
    assert!(
        !w["reason"].as_str().unwrap_or_default().contains("held for it"),
        "no hold yet: {w}"
    );
    assert_eq!(w["expected_start"].as_str(), Some(expected.as_str()), "{w}");
    let list = s.get("/api/v1/workloads?state=queued").await;
    let row = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["id"] == id)
        .cloned();
    assert!(row.is_some_and(|r| r.get("expected_start").is_none()), "{list}");
    // A running workload has none.
    let first = s.get(&format!("/api/v1/workloads/{}", ids[0])).await;
    assert!(first.get("expected_start").is_none(), "{first}");
}

/// The "if it waits, it starts at about …" part of a gang's dry-run reason.
async fn reason_start(s: &Srv, body: Value) -> String {
    let (_, d) = s.post("/api/v1/workloads/dry-run", body).await;
    let reason = d["reason"].as_str().unwrap_or_default();
    let at = reason.find("if it waits, it starts at about").expect("a start");
    reason[at..].to_string()
}

async fn idempotent_create(db: Db) {
    let s = server(db, "idem").await;
    s.tenant("vision", "train").await;
    let create = async |body: Value| {
        s.req(
            reqwest::Method::POST,
            "/api/v1/workloads",
            Some(body),
            &[("Idempotency-Key", "k-1")],
        )
        .await
    };
    let body = wl(json!({"fraction": 250}));
    let (a_st, a) = create(body.clone()).await;
    let (b_st, b) = create(body.clone()).await;
    assert_eq!((a_st, b_st), (StatusCode::CREATED, StatusCode::OK));
    assert_eq!(a["id"], b["id"]);
    assert_eq!(s.workload_count().await, 1);
    let (c_st, c) = create(wl(json!({"fraction": 300}))).await;
    assert_eq!(c_st, StatusCode::UNPROCESSABLE_ENTITY, "{c}");
    assert_eq!(c["field"], "Idempotency-Key");
    assert_eq!(s.workload_count().await, 1);
}

async fn bad_input_is_refused_with_the_field_and_nothing_is_stored(db: Db) {
    let s = server(db, "bad").await;
    s.tenant("vision", "train").await;
    let cases: Vec<(Value, StatusCode, &str)> = vec![
        (
            wl(json!({"gpus": 1, "models": ["h900"]})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "shape.models",
        ),
        (
            wl(json!({"mig": "5g.50gb"})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "shape.mig",
        ),
        (
            wl(json!({"mig": "3g.71gb", "models": ["a100-80gb"]})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "shape.mig",
        ),
        (wl(json!({"gpus": 9})), StatusCode::UNPROCESSABLE_ENTITY, "shape.gpus"),
        (
            wl(json!({"fraction": 0})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "shape.fraction",
        ),
        (
            wl(json!({"fraction": 1000})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "shape.fraction",
        ),
        (
            wl(json!({"gpus": 1, "mig": "1g.10gb"})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "shape",
        ),
        (
            json!({"tenant": "vision", "project": "train", "name": "j", "shape": {"gpus": 1}, "duration_s": -5}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "duration_s",
        ),
        (
            json!({"tenant": "nobody", "project": "train", "name": "j", "shape": {"gpus": 1}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "tenant",
        ),
        (
            json!({"tenant": "vision", "project": "nope", "name": "j", "shape": {"gpus": 1}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "project",
        ),
        (
            json!({"tenant": "vision", "project": "train", "name": "j", "shape": {"gpus": "two"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "shape.gpus",
        ),
        (
            json!({"tenant": "vision", "project": "train", "name": "j", "shape": {"gpus": 1}, "priority": "urgent"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "priority",
        ),
        (
            json!({"tenant": "vision", "project": "train", "name": "j", "shape": {"gpus": 1}, "cpu_milli": 999999999}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "cpu_milli",
        ),
        (
            json!({"tenant": "vision", "project": "train", "shape": {"gpus": 1}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "name",
        ),
    ];
    for (body, status, field) in cases {
        let (st, p) = s.post("/api/v1/workloads", body.clone()).await;
        assert_eq!(st, status, "{body} → {p}");
        assert_eq!(p["field"], field, "{body} → {p}");
        assert_eq!(p["status"], status.as_u16());
        assert!(!p["detail"].as_str().unwrap().is_empty());
    }
    // malformed JSON
    let r = s
        .request(reqwest::Method::POST, "/api/v1/workloads")
        .header("content-type", "application/json")
        .body("{\"tenant\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    // oversized body
    let big = json!({"tenant": "vision", "project": "train", "name": "j", "shape": {"gpus": 1}, "command": vec!["x".repeat(1000); 100]});
    let (st, p) = s.post("/api/v1/workloads", big).await;
    assert_eq!(st, StatusCode::PAYLOAD_TOO_LARGE, "{p}");
    // no token
    let r = s
        .server
        .request(None, reqwest::Method::GET, "/api/v1/pools")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(s.workload_count().await, 0, "nothing stored");
}

async fn tenant_tokens_see_only_their_tenant(db: Db) {
    let s = server(db, "scope").await;
    s.tenant("vision", "train").await;
    s.tenant("nlp", "p").await;
    let (_, other) = s
        .post(
            "/api/v1/workloads",
            json!({"tenant": "nlp", "project": "p", "name": "x", "shape": {"fraction": 100}}),
        )
        .await;
    let (st, t) = s
        .post("/api/v1/tokens", json!({"tenant": "vision", "role": "member"}))
        .await;
    assert_eq!(st, StatusCode::CREATED);
    let member = s.with_token(t["token"].as_str().unwrap());
    let (st, _) = member
        .req(
            reqwest::Method::GET,
            &format!("/api/v1/workloads/{}", other["id"]),
            None,
            &[],
        )
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "no existence leak");
    let (st, _) = member.post("/api/v1/tenants", json!({"name": "evil"})).await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let (st, w) = member.post("/api/v1/workloads", wl(json!({"fraction": 100}))).await;
    assert_eq!(st, StatusCode::CREATED, "{w}");
    let mine = member.get("/api/v1/workloads").await;
    assert_eq!(mine["items"].as_array().unwrap().len(), 1);
    let (st, _) = member
        .post(
            "/api/v1/workloads",
            json!({"tenant": "nlp", "project": "p", "name": "x", "shape": {"fraction": 100}}),
        )
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    // The GPU view hides the other tenant's name.
    let gpus = member.get("/api/v1/gpus?pool=development").await;
    let names: Vec<String> = gpus["items"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| {
            g["slices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x["tenant"].as_str().unwrap().to_string())
        })
        .collect();
    assert!(names.contains(&"vision".to_string()));
    assert!(!names.contains(&"nlp".to_string()));
}

async fn every_documented_route_is_served(db: Db) {
    let s = server(db, "openapi").await;
    let r = s
        .server
        .request(None, reqwest::Method::GET, "/api/v1/openapi.json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let doc: Value = r.json().await.unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() >= 11, "{:?}", paths.keys());
    for (path, ops) in paths {
        let concrete = path
            .replace("{tenant}", "nobody")
            .replace("{project}", "nothing")
            .replace("{id}", "999999");
        for method in ops.as_object().unwrap().keys() {
            let m = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let body = (m == reqwest::Method::POST).then(|| json!({}));
            let (st, v) = s.req(m.clone(), &concrete, body, &[]).await;
            let fallback =
                st == StatusCode::NOT_FOUND && v["detail"].as_str().is_some_and(|d| d.starts_with("no route"));
            assert!(
                !fallback && st != StatusCode::METHOD_NOT_ALLOWED,
                "{method} {path} is documented but not routed ({st})"
            );
        }
    }
    // And an undocumented path gets the fallback problem.
    let (st, v) = s.req(reqwest::Method::GET, "/api/v1/nope", None, &[]).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert!(v["detail"].as_str().unwrap().starts_with("no route"));
}

async fn put(s: &Srv, path: &str, body: Value) -> (StatusCode, Value) {
    s.req(reqwest::Method::PUT, path, Some(body), &[]).await
}

/// A server with tenant `vision` (project `train`) guaranteed 8 GPUs of pool `training`, up
/// to 16.
async fn vision_with_a_training_quota(db: Db, name: &str) -> Srv {
    let s = server(db, name).await;
    s.tenant("vision", "train").await;
    let (st, q) = put(
        &s,
        "/api/v1/tenants/vision/quotas/training",
        json!({"guaranteed": 8, "limit": 16}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{q}");
    s
}

async fn quotas_borrowing_limits_budgets_and_usage(db: Db) {
    let s = vision_with_a_training_quota(db, "quota").await;
    let (st, p) = put(&s, "/api/v1/tenants/vision/quotas/nowhere", json!({"guaranteed": 8})).await;
    assert_eq!(
        (st, p["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("class"))
    );
    let (st, p) = put(
        &s,
        "/api/v1/tenants/vision/quotas/training",
        json!({"guaranteed": 8, "limit": 4}),
    )
    .await;
    assert_eq!(
        (st, p["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("limit"))
    );
    let gang = |no_wait: bool| json!({"tenant": "vision", "project": "train", "name": "g", "shape": {"gpus": 8, "pool": "training"}, "no_wait": no_wait});
    let (_, a) = s.post("/api/v1/workloads", gang(false)).await;
    let (_, b) = s.post("/api/v1/workloads", gang(false)).await;
    assert_eq!(a["borrowing"], false);
    assert_eq!(b["borrowing"], true, "above the guarantee, within the limit: borrowing");
    let (st, p) = s.post("/api/v1/workloads", gang(true)).await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{p}");
    assert_eq!(p["type"], "https://tessera.dev/problems/quota", "{p}");
    assert_eq!(
        p["detail"],
        "tenant vision holds 16 GPU units in training (guaranteed 8, limit 16); this request needs 8"
    );
    let (st, w) = s.post("/api/v1/workloads", gang(false)).await;
    assert_eq!(st, StatusCode::CREATED);
    assert_eq!(w["state"], "queued");
    assert_eq!(w["reason_code"], "quota");
    assert_eq!(
        w["reason"],
        "tenant vision holds 16 GPU units in training (guaranteed 8, limit 16); this request needs 8"
    );
    let quotas = s.get("/api/v1/tenants/vision/quotas").await;
    assert_eq!(
        quotas["quotas"][0],
        json!({"class": "training", "guaranteed": 8.0, "limit": 16.0, "used": 16.0, "borrowed": 8.0})
    );

    // A budget already spent refuses new work with the figure.
    s.wait_state(a["id"].as_u64().unwrap(), "running").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        put(
            &s,
            "/api/v1/tenants/vision/budget",
            json!({"monthly_unit_hours": 0.001})
        )
        .await
        .0,
        StatusCode::NO_CONTENT
    );
    let (st, p) = s
        .post(
            "/api/v1/workloads",
            wl(json!({"fraction": 100}))
                .as_object()
                .unwrap()
                .clone()
                .into_iter()
                .chain([("no_wait".to_string(), json!(true))])
                .collect::<serde_json::Map<_, _>>()
                .into(),
        )
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{p}");
    assert_eq!(p["type"], "https://tessera.dev/problems/budget", "{p}");
    let quotas = s.get("/api/v1/tenants/vision/quotas").await;
    assert!(quotas["budget"]["spent_unit_hours"].as_f64().unwrap() > 0.001);

    // Usage: the ledger has the two running gangs.
    let u = s.get("/api/v1/usage?by=class").await;
    assert_eq!(u["rows"][0]["key"], "training/H100-80GB-SXM");
    assert!(u["total"]["allocated_unit_hours"].as_f64().unwrap() > 0.0);
    let csv = s.csv("/api/v1/usage?by=project&format=csv").await;
    assert!(
        csv.starts_with(
            "project,allocated_unit_hours,measured_unit_hours,cost_allocated_EUR,cost_measured_EUR\nvision/train,"
        ),
        "{csv}"
    );

    // The ledger itself, each interval with what its workload asked for (`tessera plan`'s demand).
    let l = s.get("/api/v1/usage/intervals").await;
    let iv = l["intervals"].as_array().unwrap();
    assert_eq!(iv.len(), 2, "{l}");
    for i in iv {
        assert_eq!(
            (i["gpu"].as_str(), i["pool"].as_str()),
            (Some("whole:8"), Some("training")),
            "{i}"
        );
        assert_eq!((i["seq"].as_u64(), i["units"].as_f64()), (Some(0), Some(8.0)), "{i}");
        assert!(
            i["ended_at"].is_null() && i["submitted_at"].as_str() <= i["started_at"].as_str(),
            "{i}"
        );
    }
    let csv = s.csv("/api/v1/usage/intervals?format=csv&tenant=vision").await;
    assert!(
        csv.starts_with("workload,seq,tenant,project,priority,gpu,cpu_milli,memory_mib,pool,model,units,submitted_at,started_at,ended_at\n"),
        "{csv}"
    );
    assert_eq!(csv.lines().count(), 3, "{csv}");
    let (st, p) = s
        .req(
            reqwest::Method::GET,
            "/api/v1/usage/intervals?from=yesterday",
            None,
            &[],
        )
        .await;
    assert_eq!(
        (st, p["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("from")),
        "{p}"
    );
}

/// A gang within its tenant's guarantee that waits while another tenant borrows the pool says
/// when it will take its share back (once it holds nodes, past the backfill window), and is
/// not promised a start by the end of the borrowed work, an hour later.
async fn a_gang_within_its_guarantee_says_when_it_takes_its_share_back(db: Db) {
    let s = server(db, "gangreclaim").await;
    s.tenant("vision", "train").await;
    s.tenant("nlp", "p").await;
    put(&s, "/api/v1/tenants/nlp/quotas/training", json!({"guaranteed": 64})).await;
    // vision (guarantee 0) borrows the whole training pool for an hour.
    borrow_the_training_pool(&s, Some(3600)).await;
    let body = json!({"tenant": "nlp", "project": "p", "name": "g", "duration_s": 600,
                      "shape": {"gpus": 32, "pool": "training", "topology": "rack"}});
    // The backfill window is 5 minutes: it holds nodes, and reclaims there, 300 s after it
    // came. The words, and the time of day `HH:MM:SS` in seconds, in `reason`.
    let said = "within tenant nlp's guaranteed share: may take back capacity lent to other tenants at ";
    let time_in = |reason: &str, w: &Value| -> i64 {
        let at = reason
            .find(said)
            .map(|i| &reason[i + said.len()..])
            .unwrap_or_else(|| panic!("{w}"));
        assert!(at[8..].starts_with(" UTC (in "), "{w}");
        let clock: Vec<i64> = at[..8].split(':').map(|x| x.parse().unwrap()).collect();
        clock[0] * 3600 + clock[1] * 60 + clock[2]
    };
    // The dry run says so before it is submitted, in the same words.
    let asked = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let (st, dry) = s.post("/api/v1/workloads/dry-run", body.clone()).await;
    assert_eq!(st, StatusCode::OK, "{dry}");
    assert_eq!(
        (dry["outcome"].as_str(), dry["reason_code"].as_str()),
        (Some("wait"), Some("no-capacity")),
        "{dry}"
    );
    let dry_reason = dry["reason"].as_str().unwrap_or_default();
    let dry_at = time_in(dry_reason, &dry);
    assert!(
        (dry_at - (asked / 1000 + 300).rem_euclid(86_400)).rem_euclid(86_400) <= 2,
        "a dry run at {asked} ms: {dry}"
    );
    assert!(
        !dry_reason.contains("if it waits, it starts"),
        "not the borrowed work's end: {dry}"
    );
    let (st, w) = s.post("/api/v1/workloads", body.clone()).await;
    assert_eq!(st, StatusCode::CREATED, "{w}");
    let id = w["id"].as_u64().unwrap();
    let created = w["created_at_ms"].as_i64().unwrap();
    let w = s.wait_state(id, "queued").await;
    let reason = w["reason"].as_str().unwrap_or_default();
    assert_eq!(w["reason_code"], "no-capacity", "{w}");
    let of_day = time_in(reason, &w);
    let due = (created / 1000 + 300).rem_euclid(86_400);
    assert!(
        (of_day - due).rem_euclid(86_400) <= 2,
        "for a request at {created} ms: {w}"
    );
    let words = |r: &str| r.find(said).map(|i| r[..i + said.len()].to_string());
    assert_eq!(words(dry_reason), words(reason), "the dry run's words are the queue's");
    // A tenant firing gang dry runs cannot keep the loop from its work: at most 10 forecasts a
    // second (of the loop's clock) are made for one tenant, 20 in all; beyond, the answer
    // says nothing of a start.
    let secs = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    let first = secs();
    let mut dry = body.clone();
    dry["name"] = json!("burst");
    let answers =
        futures_util::future::join_all((0..60).map(|_| s.post("/api/v1/workloads/dry-run", dry.clone()))).await;
    let windows = secs() - first + 1;
    let mut told = 0;
    for (st, d) in &answers {
        assert_eq!(*st, StatusCode::OK, "{d}");
        let r = d["reason"].as_str().unwrap_or_default();
        assert!(!r.contains("if it waits"), "never the borrowed work's end: {d}");
        told += usize::from(r.contains(said));
    }
    let most = 10 * windows as usize;
    assert!(told >= 1 && told <= most, "{told} forecasts in {windows} s");
    assert!(
        answers.len() - told >= 60usize.saturating_sub(most),
        "{told} of 60 in {windows} s"
    );
    assert!(
        w.get("expected_start").is_none(),
        "no start by the borrowed work's end: {w}"
    );
}

/// Tenant vision (project train, no guarantee) fills the training pool with 8-GPU work,
/// borrowing all of it (lasting `duration_s`, if given); its ids once every one runs.
async fn borrow_the_training_pool(s: &Srv, duration_s: Option<u64>) -> Vec<u64> {
    let mut borrowers = Vec::new();
    for _ in 0..16 {
        let mut body =
            json!({"tenant": "vision", "project": "train", "name": "b", "shape": {"gpus": 8, "pool": "training"}});
        if let Some(d) = duration_s {
            body["duration_s"] = json!(d);
        }
        let (_, w) = s.post("/api/v1/workloads", body).await;
        assert_eq!(w["borrowing"], true, "{w}");
        borrowers.push(w["id"].as_u64().unwrap());
    }
    for id in &borrowers {
        s.wait_state(*id, "running").await;
    }
    borrowers
}

async fn owner_reclaims_its_guarantee_from_a_borrower(db: Db) {
    let s = server(db, "reclaim").await;
    s.tenant("vision", "train").await;
    s.tenant("nlp", "p").await;
    put(&s, "/api/v1/tenants/nlp/quotas/training", json!({"guaranteed": 64})).await;
    // vision (no quota: guarantee 0) borrows the whole training pool.
    let borrowers = borrow_the_training_pool(&s, None).await;
    let (_, own) = s
        .post(
            "/api/v1/workloads",
            json!({"tenant": "nlp", "project": "p", "name": "mine", "shape": {"gpus": 8, "pool": "training"}}),
        )
        .await;
    let own_id = own["id"].as_u64().unwrap();
    let running = s.wait_state(own_id, "running").await;
    assert_eq!(running["borrowing"], false);
    let events = s.get(&format!("/api/v1/workloads/{own_id}/events")).await;
    assert!(
        events
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["step"] == "queued" && e["code"] == "preemption"),
        "the owner waited for its victim to stop: {events}"
    );
    // The victim: the one borrower whose timeline has a reclaim preemption.
    let mut victims = Vec::new();
    for id in &borrowers {
        let ev = s.get(&format!("/api/v1/workloads/{id}/events")).await;
        if ev
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["step"] == "preempted" && e["code"] == "preempted-reclaim")
        {
            victims.push(*id);
        }
    }
    assert_eq!(victims.len(), 1, "one borrower gives the owner its guarantee back");
    let victim = victims[0];
    s.wait_state(victim, "queued").await;
    let vev = s.get(&format!("/api/v1/workloads/{victim}/events")).await;
    let ev = vev.as_array().unwrap();
    let steps: Vec<&str> = ev.iter().map(|e| e["step"].as_str().unwrap()).collect();
    let at = steps
        .iter()
        .position(|s| *s == "preempted")
        .expect("the victim records its preemption");
    assert_eq!(&steps[at..at + 3], ["preempted", "released", "queued"], "{steps:?}");
    assert!(
        ev[at]["detail"]
            .as_str()
            .unwrap()
            .starts_with(&format!("preempted by workload {own_id}")),
        "{vev}"
    );
    assert!(
        ev[at + 2]["detail"]
            .as_str()
            .unwrap()
            .starts_with("requeued after being preempted"),
        "{vev}"
    );
}

/// An OCI registry on 127.0.0.1 serving what the test pushes (path under `/v2/` → body), with
/// `Docker-Content-Digest` on manifests.
mod registry {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    use axum::extract::{Path, State};
    use axum::http::{HeaderMap, StatusCode};
    use base64::Engine;
    use p256::ecdsa::signature::Signer;
    use p256::ecdsa::{Signature, SigningKey};
    use p256::pkcs8::{EncodePublicKey, LineEnding};
    use sha2::{Digest, Sha256};

    type Objects = Arc<Mutex<HashMap<String, Vec<u8>>>>;

    pub struct Registry {
        objects: Objects,
        pub host: String,
        key: SigningKey,
    }

    pub fn digest(b: &[u8]) -> String {
        format!(
            "sha256:{}",
            Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect::<String>()
        )
    }

    async fn serve(State(o): State<Objects>, Path(path): Path<String>) -> (StatusCode, HeaderMap, Vec<u8>) {
        let Some(body) = o.lock().unwrap().get(&path).cloned() else {
            return (StatusCode::NOT_FOUND, HeaderMap::new(), vec![]);
        };
        let mut h = HeaderMap::new();
        if path.contains("/manifests/") {
            h.insert("docker-content-digest", digest(&body).parse().unwrap());
        }
        (StatusCode::OK, h, body)
    }

    impl Registry {
        pub async fn start() -> Registry {
            let objects = Objects::default();
            let app = axum::Router::new()
                .route("/v2/{*path}", axum::routing::get(serve))
                .with_state(objects.clone());
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let host = format!("127.0.0.1:{}", l.local_addr().unwrap().port());
            tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
            Registry {
                objects,
                host,
                key: SigningKey::from_slice(&[5u8; 32]).unwrap(),
            }
        }

        pub fn public_key_pem(&self) -> String {
            self.key.verifying_key().to_public_key_pem(LineEnding::LF).unwrap()
        }

        /// Pushes `repo:tag` (signed as cosign would, if `sign`); returns its digest.
        pub fn push(&self, repo: &str, tag: &str, sign: bool) -> String {
            let m = serde_json::json!({"schemaVersion": 2, "layers": [], "tag": tag})
                .to_string()
                .into_bytes();
            let d = digest(&m);
            let mut o = self.objects.lock().unwrap();
            o.insert(format!("{repo}/manifests/{tag}"), m);
            if sign {
                let payload = serde_json::json!({"critical": {"identity": {"docker-reference": format!("{}/{repo}", self.host)},
                    "image": {"docker-manifest-digest": d}, "type": "cosign container image signature"}, "optional": null})
                .to_string()
                .into_bytes();
                let sig: Signature = self.key.sign(&payload);
                let sig = base64::engine::general_purpose::STANDARD.encode(sig.to_der().as_bytes());
                let pd = digest(&payload);
                let sm = serde_json::json!({"schemaVersion": 2, "layers": [{"mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
                    "digest": pd, "size": payload.len(), "annotations": {"dev.cosignproject.cosign/signature": sig}}]});
                o.insert(format!("{repo}/blobs/{pd}"), payload);
                o.insert(
                    format!("{repo}/manifests/sha256-{}.sig", &d[7..]),
                    sm.to_string().into_bytes(),
                );
            }
            d
        }
    }
}

/// A tenant's image policy: set by its admins (a bad key or prefix is a 422 naming the entry;
/// the change and its audit record commit together), enforced before a workload exists
/// (registry prefixes, then cosign signatures fetched from a real registry endpoint), and an
/// admitted image runs pinned to the digest that was verified.
async fn image_policy_is_validated_audited_and_enforced_at_admission(db: Db) {
    let s = server(db, "imagepolicy").await;
    s.tenant("vision", "train").await;
    let reg = registry::Registry::start().await;
    let signed = reg.push("team-a/train", "v1", true);
    reg.push("team-a/train", "unsigned", false);
    let path = "/api/v1/tenants/vision/image-policy";
    let (st, p) = s.req(reqwest::Method::GET, path, None, &[]).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{p}");

    let (st, p) = put(
        &s,
        path,
        json!({"cosign_keys": ["-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----"]}),
    )
    .await;
    assert_eq!(
        (st, p["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("cosign_keys[0]")),
        "{p}"
    );
    let (st, p) = put(&s, path, json!({"registries": ["registry.example.com/", "team-a/"]})).await;
    assert_eq!(
        (st, p["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("registries[1]")),
        "{p}"
    );
    let (st, p) = s.req(reqwest::Method::GET, path, None, &[]).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "a refused policy changes nothing: {p}");

    let policy = json!({"registries": [format!("{}/team-a/", reg.host)], "cosign_keys": [reg.public_key_pem()]});
    let (st, p) = put(&s, path, policy.clone()).await;
    assert_eq!(st, StatusCode::OK, "{p}");
    let got = s.get(path).await;
    assert_eq!(
        (&got["registries"], &got["cosign_keys"]),
        (&policy["registries"], &policy["cosign_keys"])
    );

    let count = s.workload_count().await;
    let with_image = |image: &str| json!({"tenant": "vision", "project": "train", "name": "img", "shape": {"fraction": 100}, "image": image});
    for (image, code) in [
        ("ubuntu:22.04".to_string(), "image-registry-not-allowed"),
        (format!("{}/team-b/train:v1", reg.host), "image-registry-not-allowed"),
        (format!("{}/team-a/train:unsigned", reg.host), "image-signature-missing"),
    ] {
        let (st, p) = s.post("/api/v1/workloads", with_image(&image)).await;
        assert_eq!(st, StatusCode::FORBIDDEN, "{image}: {p}");
        assert_eq!(p["type"], format!("https://tessera.dev/problems/{code}"), "{p}");
        assert!(
            p["detail"]
                .as_str()
                .unwrap()
                .contains(image.trim_start_matches("ubuntu")),
            "{p}"
        );
        let (st, _) = s.post("/api/v1/workloads/dry-run", with_image(&image)).await;
        assert_eq!(st, StatusCode::FORBIDDEN, "the dry run refuses what creation refuses");
    }
    let (st, p) = s
        .post(
            "/api/v1/workloads",
            with_image(&format!("{}/team-a/train:nope", reg.host)),
        )
        .await;
    assert_eq!(
        (st, p["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("image")),
        "{p}"
    );
    assert_eq!(s.workload_count().await, count, "nothing refused was created");

    let (st, w) = s
        .post(
            "/api/v1/workloads",
            with_image(&format!("{}/team-a/train:v1", reg.host)),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{w}");
    assert_eq!(
        w["image"],
        format!("{}/team-a/train@{signed}", reg.host),
        "runs pinned to the verified digest"
    );

    // The successful change is on the audit log once, committed with it.
    let audit = s.get("/api/v1/audit?limit=500").await;
    let puts: Vec<&Value> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["action"] == "PUT /api/v1/tenants/{tenant}/image-policy" && a["outcome"] == 200)
        .collect();
    assert_eq!(puts.len(), 1, "{audit}");
    assert_eq!(puts[0]["tenant"], "vision");

    let (st, _) = s.req(reqwest::Method::DELETE, path, None, &[]).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (st, w) = s.post("/api/v1/workloads", with_image("ubuntu:22.04")).await;
    assert_eq!(
        (st, w["image"].as_str()),
        (StatusCode::CREATED, Some("ubuntu:22.04")),
        "{w}"
    );
}

/// What the create path remembers of the tenancy never outlives it: a project (then its
/// tenant) that a member's requests were checked against, deleted by the platform admin, is
/// refused at once on the next creation and dry run (422 naming the field), and made again it
/// is accepted again.
async fn a_deleted_project_or_tenant_is_refused_at_once(db: Db) {
    let s = server(db, "forgotten").await;
    s.tenant("vision", "scratch").await;
    let member = s.with_token(&s.server.token("vision", "member").await);
    let job = json!({"tenant": "vision", "project": "scratch", "name": "p", "shape": {"fraction": 100}});
    // Checked twice (the second from what the first remembered).
    for _ in 0..2 {
        let (st, p) = member.post("/api/v1/workloads/dry-run", job.clone()).await;
        assert_eq!(st, StatusCode::OK, "{p}");
    }
    let (st, _) = s
        .req(
            reqwest::Method::DELETE,
            "/api/v1/tenants/vision/projects/scratch",
            None,
            &[],
        )
        .await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    for path in ["/api/v1/workloads/dry-run", "/api/v1/workloads"] {
        let (st, p) = member.post(path, job.clone()).await;
        assert_eq!(
            (st, p["field"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some("project")),
            "{path}: {p}"
        );
    }
    let (st, _) = s
        .post("/api/v1/tenants/vision/projects", json!({"name": "scratch"}))
        .await;
    assert_eq!(st, StatusCode::CREATED);
    let (st, p) = member.post("/api/v1/workloads/dry-run", job.clone()).await;
    assert_eq!(st, StatusCode::OK, "made again: {p}");

    // The same for a tenant: remembered by an admin's check, then deleted with its project.
    s.tenant("nlp", "serve").await;
    let nlp = json!({"tenant": "nlp", "project": "serve", "name": "p", "shape": {"fraction": 100}});
    let (st, p) = s.post("/api/v1/workloads/dry-run", nlp.clone()).await;
    assert_eq!(st, StatusCode::OK, "{p}");
    for path in ["/api/v1/tenants/nlp/projects/serve", "/api/v1/tenants/nlp"] {
        let (st, _) = s.req(reqwest::Method::DELETE, path, None, &[]).await;
        assert_eq!(st, StatusCode::NO_CONTENT, "{path}");
    }
    let (st, p) = s.post("/api/v1/workloads/dry-run", nlp).await;
    assert_eq!(
        (st, p["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("tenant")),
        "{p}"
    );
}

/// Priority classes are granted by the platform admin, never chosen by a tenant: a member
/// asking for `critical` is refused (403 naming the classes it may use, on creation and on the
/// dry run, nothing stored); neither it nor its tenant-admin can grant itself more, nor see
/// another tenant's grant; a grant must name known classes, each once; once the admin grants
/// `high`, the same member gets it (and only what was granted); each change is on the audit log
/// with the grant before and after; `null` restores the default.
async fn priority_classes_are_granted_by_the_platform_admin(db: Db) {
    let s = server(db, "priorities").await;
    s.tenant("vision", "train").await;
    s.tenant("nlp", "serve").await;
    let member = s.with_token(&s.server.token("vision", "member").await);
    let tadmin = s.with_token(&s.server.token("vision", "tenant-admin").await);
    let job = |priority: &str| json!({"tenant": "vision", "project": "train", "name": "p", "shape": {"fraction": 100}, "priority": priority});

    let t = member.get("/api/v1/tenants/vision").await;
    assert_eq!(t["priorities"], json!(["standard", "opportunistic"]), "{t}");
    let count = s.workload_count().await;
    for c in ["critical", "high"] {
        for path in ["/api/v1/workloads", "/api/v1/workloads/dry-run"] {
            let (st, p) = member.post(path, job(c)).await;
            assert_eq!(st, StatusCode::FORBIDDEN, "{path} {c}: {p}");
            assert_eq!(p["type"], "https://tessera.dev/problems/priority-not-granted", "{p}");
            assert_eq!(p["field"], "priority");
            let d = p["detail"].as_str().unwrap();
            assert!(d.contains("standard, opportunistic") && d.contains(c), "{d}");
        }
    }
    assert_eq!(s.workload_count().await, count, "nothing refused was created");

    // The tenant cannot grant itself a class, nor another tenant one: refused by its role
    // before any tenant is looked up, the same 403 whether the tenant exists or not.
    let grant = |classes: Value| json!({ "priorities": classes });
    for who in [&member, &tadmin] {
        for tenant in ["vision", "nlp", "no-such-tenant"] {
            let path = format!("/api/v1/tenants/{tenant}/priorities");
            let (st, p) = put(who, &path, grant(json!(["critical"]))).await;
            assert_eq!(st, StatusCode::FORBIDDEN, "{path}: {p}");
        }
        let (st, p) = who
            .post("/api/v1/tenants", json!({"name": "mine", "priorities": ["critical"]}))
            .await;
        assert_eq!(st, StatusCode::FORBIDDEN, "{p}");
    }
    // A grant names known classes, each once, at least one.
    for (bad, field) in [
        (json!([]), "priorities"),
        (json!(["standard", "urgent"]), "priorities[1]"),
        (json!(["high", "high"]), "priorities[1]"),
        (json!(["High"]), "priorities[0]"),
    ] {
        let (st, p) = put(&s, "/api/v1/tenants/vision/priorities", grant(bad.clone())).await;
        assert_eq!(
            (st, p["field"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some(field)),
            "{bad}: {p}"
        );
    }
    let (st, p) = put(&s, "/api/v1/tenants/nobody/priorities", grant(json!(["high"]))).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{p}");
    assert_eq!(
        member.get("/api/v1/tenants/vision").await["priorities"],
        json!(["standard", "opportunistic"]),
        "refused grants change nothing"
    );

    let (st, t) = put(
        &s,
        "/api/v1/tenants/vision/priorities",
        grant(json!(["standard", "high"])),
    )
    .await;
    assert_eq!(
        (st, &t["priorities"]),
        (StatusCode::OK, &json!(["standard", "high"])),
        "{t}"
    );
    let (st, w) = member.post("/api/v1/workloads", job("high")).await;
    assert_eq!((st, w["priority"].as_str()), (StatusCode::CREATED, Some("high")), "{w}");
    for c in ["critical", "opportunistic"] {
        let (st, p) = member.post("/api/v1/workloads", job(c)).await;
        assert_eq!(st, StatusCode::FORBIDDEN, "only what was granted: {c}: {p}");
        assert!(p["detail"].as_str().unwrap().contains("standard, high"), "{p}");
    }
    // Another tenant's grant is untouched, and a platform-admin may submit any class.
    assert_eq!(
        s.get("/api/v1/tenants/nlp").await["priorities"],
        json!(["standard", "opportunistic"])
    );
    let (st, w) = s.post("/api/v1/workloads", job("critical")).await;
    assert_eq!(st, StatusCode::CREATED, "{w}");

    let (st, _) = put(&s, "/api/v1/tenants/vision/priorities", grant(Value::Null)).await;
    assert_eq!(st, StatusCode::OK);
    let (st, p) = member.post("/api/v1/workloads", job("high")).await;
    assert_eq!(st, StatusCode::FORBIDDEN, "the default grant again: {p}");

    // Each change is audited once, with the grant before and after; refusals as denials.
    let audit = s.get("/api/v1/audit?tenant=vision&limit=500").await;
    let grants: Vec<(&str, u64)> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["action"] == "PUT /api/v1/tenants/{tenant}/priorities" && a["outcome"] == 200)
        .map(|a| (a["detail"].as_str().unwrap_or(""), a["outcome"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        grants,
        [
            ("priority classes standard, high → standard, opportunistic", 200),
            ("priority classes standard, opportunistic → standard, high", 200),
        ],
        "{audit}"
    );
    let denied = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["action"] == "denied PUT /api/v1/tenants/{tenant}/priorities")
        .count();
    assert_eq!(denied, 2, "{audit}");
}

/// What the server holds of tenants: each with its grant, projects, quotas and budget.
async fn tenancy_state(s: &Srv) -> Vec<Value> {
    let mut out = Vec::new();
    for t in s.get("/api/v1/tenants?limit=500").await["items"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        let projects = s.get(&format!("/api/v1/tenants/{name}/projects?limit=500")).await;
        let quotas = s.get(&format!("/api/v1/tenants/{name}/quotas")).await;
        let (_, policy) = s
            .req(
                reqwest::Method::GET,
                &format!("/api/v1/tenants/{name}/image-policy"),
                None,
                &[],
            )
            .await;
        out.push(json!([t, projects["items"], quotas, policy["registries"]]));
    }
    out
}

/// `POST /api/v1/apply` is all or nothing: a declaration with any fault — a bad name after a
/// good tenant, a tenant or project listed twice, an unknown pool, priority class or project, a
/// bad policy or quota — is refused whole with the field at fault, by the dry run exactly as by
/// the apply, and nothing changes; tenant tokens cannot apply; a valid one lands whole (the
/// scheduler sees its quotas), audited per tenant, and applying it again changes nothing.
async fn apply_is_all_or_nothing(db: Db) {
    let s = server(db, "apply").await;
    s.tenant("acme", "p").await;
    let good1 = json!({"name": "good1", "projects": ["train"], "quotas": {"training": {"guaranteed": 8, "limit": 16}},
        "monthly_gpu_hours": 100, "priorities": ["standard", "high"]});
    let before = tenancy_state(&s).await;
    let audit_len = |a: Value| a["items"].as_array().unwrap().len();
    let audit_before = audit_len(s.get("/api/v1/audit?limit=500").await);
    let bad = [
        (json!([good1, {"name": "Bad_Name"}]), "tenants[1].name"),
        (json!([good1, {"name": "acme"}, {"name": "good1"}]), "tenants[2].name"),
        (
            json!([{"name": "good1", "projects": ["a", "b", "a"]}]),
            "tenants[0].projects[2]",
        ),
        (
            json!([good1, {"name": "good2", "quotas": {"nopool": {"guaranteed": 1}}}]),
            "tenants[1].quotas.nopool",
        ),
        (
            json!([good1, {"name": "good2", "quotas": {"training/B200": {"guaranteed": 1}}}]),
            "tenants[1].quotas.training/B200",
        ),
        (
            json!([good1, {"name": "acme", "quotas": {"project:ghost": {"guaranteed": 1}}}]),
            "tenants[1].quotas.project:ghost",
        ),
        (
            json!([{"name": "good1", "quotas": {"training": {"guaranteed": 8, "limit": 4}}}]),
            "tenants[0].quotas.training.limit",
        ),
        (
            json!([good1, {"name": "good2", "priorities": ["standard", "urgent"]}]),
            "tenants[1].priorities[1]",
        ),
        (
            json!([good1, {"name": "good2", "priorities": ["high", "high"]}]),
            "tenants[1].priorities[1]",
        ),
        (
            json!([good1, {"name": "acme", "image_policy": {"registries": ["team-a/"]}}]),
            "tenants[1].image_policy.registries[0]",
        ),
        (
            json!([good1, {"name": "good2", "monthly_gpu_hours": -1}]),
            "tenants[1].monthly_gpu_hours",
        ),
        (
            json!([good1, {"name": "good2", "projects": ["Train"]}]),
            "tenants[1].projects[0]",
        ),
    ];
    for (tenants, field) in bad {
        for path in ["/api/v1/apply", "/api/v1/apply?dry_run=true"] {
            let (st, p) = s.post(path, json!({ "tenants": tenants })).await;
            assert_eq!(
                (st, p["field"].as_str()),
                (StatusCode::UNPROCESSABLE_ENTITY, Some(field)),
                "{path} {tenants}: {p}"
            );
        }
    }
    let (_, p) = s.post("/api/v1/apply", json!({"tenants": [good1, good1]})).await;
    assert!(p["detail"].as_str().unwrap().contains("declared twice"), "{p}");
    assert_eq!(tenancy_state(&s).await, before, "a refused declaration changes nothing");

    // A tenant's tokens cannot apply, not even to their own tenant or as a dry run.
    let tadmin = s.with_token(&s.server.token("acme", "tenant-admin").await);
    let own = json!({"tenants": [{"name": "acme", "priorities": ["critical"]}]});
    for path in ["/api/v1/apply", "/api/v1/apply?dry_run=true"] {
        let (st, p) = tadmin.post(path, own.clone()).await;
        assert_eq!(st, StatusCode::FORBIDDEN, "{p}");
    }
    assert_eq!(tenancy_state(&s).await, before);
    assert_eq!(
        s.get("/api/v1/tenants/acme").await["priorities"],
        json!(["standard", "opportunistic"])
    );

    let valid = json!({"tenants": [good1, {"name": "acme", "projects": ["p", "serve"], "quotas": {"project:serve": {"guaranteed": 2}}}]});
    let (st, r) = s.post("/api/v1/apply?dry_run=true", valid.clone()).await;
    assert_eq!((st, &r["applied"]), (StatusCode::OK, &json!(false)), "{r}");
    let changes: Vec<&str> = r["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(
        changes,
        [
            "+ tenant good1 (priority classes standard, high)",
            "+ project good1/train",
            "+ quota good1/training: guaranteed 8, limit 16",
            "~ budget good1: none → 100 GPU-unit-hours",
            "+ project acme/serve",
            "+ quota acme/project:serve: guaranteed 2, limit none",
        ]
    );
    assert_eq!(tenancy_state(&s).await, before, "a dry run changes nothing");

    let (st, r) = s.post("/api/v1/apply", valid.clone()).await;
    assert_eq!((st, &r["applied"]), (StatusCode::OK, &json!(true)), "{r}");
    assert_eq!(r["changes"].as_array().unwrap().len(), 6);
    let t = s.get("/api/v1/tenants/good1").await;
    assert_eq!(t["priorities"], json!(["standard", "high"]));
    let q = s.get("/api/v1/tenants/good1/quotas").await;
    assert_eq!(
        (
            &q["quotas"][0]["class"],
            &q["quotas"][0]["guaranteed"],
            &q["budget"]["monthly_unit_hours"]
        ),
        (&json!("training"), &json!(8.0), &json!(100.0)),
        "the scheduler has the new quota and budget: {q}"
    );
    let audit = s.get("/api/v1/audit?limit=500").await;
    let applied: Vec<(&str, &str)> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["action"] == "POST /api/v1/apply" && a["outcome"] == 200 && a["detail"].is_string())
        .map(|a| (a["tenant"].as_str().unwrap(), a["detail"].as_str().unwrap()))
        .collect();
    assert_eq!(applied.len(), 2, "one record per tenant changed: {audit}");
    assert!(
        applied.contains(&(
            "acme",
            "+ project acme/serve; + quota acme/project:serve: guaranteed 2, limit none"
        )),
        "{applied:?}"
    );
    assert!(audit_len(audit.clone()) > audit_before);
    let (st, r) = s.post("/api/v1/apply", valid).await;
    assert_eq!(
        (st, &r["changes"], &r["applied"]),
        (StatusCode::OK, &json!([]), &json!(false)),
        "{r}"
    );
}

/// A gang of whole nodes with a remainder share through the API: `{"gpus": 12, "remainder":
/// true}` on the training pool's 8-GPU nodes is placed as 8 + 4 on two nodes, shown with its
/// remainder, counted as 12 units, and released whole.
async fn a_remainder_gang_runs_as_whole_nodes_and_the_remainder(db: Db) {
    let s = server(db, "remainder").await;
    s.tenant("vision", "train").await;
    let body = json!({"tenant": "vision", "project": "train", "name": "g", "shape": {"gpus": 12, "pool": "training", "remainder": true}});
    let (st, d) = s.post("/api/v1/workloads/dry-run", body.clone()).await;
    // A tenant without a guarantee borrows: it would start, on two nodes, counted as 12.
    assert_eq!(
        (st, &d["outcome"], &d["units"]),
        (StatusCode::OK, &json!("borrow"), &json!("12")),
        "{d}"
    );
    assert_eq!(d["node"], "2 node-shares in r0 (2 nodes)", "{d}");
    let (st, w) = s.post("/api/v1/workloads", body).await;
    assert_eq!(st, StatusCode::CREATED, "{w}");
    assert_eq!(
        (&w["units"], &w["shape"]["remainder"]),
        (&json!("12"), &json!(true)),
        "{w}"
    );
    let id = w["id"].as_u64().unwrap();
    let w = s.wait_state(id, "running").await;
    let a = &w["allocation"];
    let shares = a["shares"].as_array().expect("a second node-share");
    assert_eq!(shares.len(), 1, "{w}");
    assert_eq!(
        (
            a["gpus"].as_array().unwrap().len(),
            shares[0]["gpus"].as_array().unwrap().len()
        ),
        (8, 4),
        "a whole node and the remainder: {w}"
    );
    assert_ne!(a["node"], shares[0]["node"], "{w}");
    assert_eq!(a["units_milli"], 12_000, "{w}");
    // The timeline speaks of every node-share, not the first alone.
    let events = s.get(&format!("/api/v1/workloads/{id}/events")).await;
    let detail = |step: &str| {
        events
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["step"] == step)
            .and_then(|e| e["detail"].as_str())
            .unwrap_or_default()
            .to_string()
    };
    let (first, second) = (a["node"].as_str().unwrap(), shares[0]["node"].as_str().unwrap());
    let partitioned = detail("partitioned");
    assert!(
        partitioned.starts_with("whole GPUs on 2 node-shares")
            && partitioned.contains(&format!("{first} [0, 1, 2, 3, 4, 5, 6, 7]"))
            && partitioned.contains(second),
        "{partitioned}"
    );
    let observed = detail("observed");
    assert!(
        observed.contains("of the gang's 12 GPUs on 2 nodes reported"),
        "{observed}"
    );
    assert_eq!(s.units_used("training").await, "12");
    let (st, c) = s.post(&format!("/api/v1/workloads/{id}/cancel"), json!({})).await;
    assert_eq!(st, StatusCode::OK, "{c}");
    s.wait_state(id, "cancelled").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while s.units_used("training").await != "0" && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(s.units_used("training").await, "0", "both shares released");
    let w = s.get(&format!("/api/v1/workloads/{id}")).await;
    assert_eq!(w["shape"]["remainder"], true, "{w}");
}

/// A tenant cannot use a remainder share to slip past its quota (the gang counts all its
/// GPUs, the remainder too), and a remainder asked for where it has no meaning is refused with
/// 422 naming `shape.remainder` and the rule, storing nothing.
async fn a_remainder_gang_is_held_to_the_quota_and_its_rules(db: Db) {
    let s = vision_with_a_training_quota(db, "remainder-rules").await;
    let (st, w) = s
        .post("/api/v1/workloads", wl(json!({"gpus": 8, "pool": "training"})))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{w}");
    s.wait_state(w["id"].as_u64().unwrap(), "running").await;
    // 8 held + 12 asked > 16: refused with no_wait, queued on the quota otherwise.
    let gang = |no_wait: bool| json!({"tenant": "vision", "project": "train", "name": "g", "shape": {"gpus": 12, "pool": "training", "remainder": true}, "no_wait": no_wait});
    let (st, d) = s.post("/api/v1/workloads/dry-run", gang(false)).await;
    assert_eq!((st, &d["reason_code"]), (StatusCode::OK, &json!("quota")), "{d}");
    let (st, p) = s.post("/api/v1/workloads", gang(true)).await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{p}");
    assert_eq!(
        p["detail"],
        "tenant vision holds 8 GPU units in training (guaranteed 8, limit 16); this request needs 12"
    );
    let (st, w) = s.post("/api/v1/workloads", gang(false)).await;
    assert_eq!(st, StatusCode::CREATED, "{w}");
    assert_eq!(
        (&w["state"], &w["reason_code"]),
        (&json!("queued"), &json!("quota")),
        "{w}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let again = s.get(&format!("/api/v1/workloads/{}", w["id"])).await;
    assert_eq!(again["state"], "queued", "never placed past the limit: {again}");
    assert_eq!(s.units_used("training").await, "8");
    let before = s.workload_count().await;
    let bad: Vec<(Value, &str)> = vec![
        // Not whole nodes: the node size is the pool's.
        (
            json!({"gpus": 12, "gpus_per_node": 4, "remainder": true}),
            "goes with a gang of whole nodes",
        ),
        (
            json!({"nodes": 2, "gpus_per_node": 8, "remainder": true}),
            "goes with a gang of whole nodes",
        ),
        (json!({"gpus": 12, "segment": 12, "remainder": true}), "has no segments"),
        (
            json!({"fraction": 500, "remainder": true}),
            "goes with a gang of whole nodes",
        ),
        // A multiple of the node size, or no more than one node: nothing to remain.
        (
            json!({"gpus": 16, "pool": "training", "remainder": true}),
            "leave no remainder",
        ),
        (
            json!({"gpus": 4, "pool": "training", "remainder": true}),
            "fit on one node",
        ),
    ];
    for (shape, rule) in bad {
        let (st, p) = s.post("/api/v1/workloads", wl(shape.clone())).await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{shape}: {p}");
        assert_eq!(p["field"], "shape.remainder", "{shape}: {p}");
        assert!(p["detail"].as_str().unwrap_or_default().contains(rule), "{shape}: {p}");
    }
    // Without the opt-in, 12 GPUs on 8-GPU nodes are still refused.
    let (st, p) = s
        .post("/api/v1/workloads", wl(json!({"gpus": 12, "pool": "training"})))
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
    assert!(
        p["detail"].as_str().unwrap_or_default().contains("multiple of 8"),
        "{p}"
    );
    assert_eq!(s.workload_count().await, before, "nothing stored");
}

/// Every page of `path` (a workload list with a `limit`), following `next_cursor`: the ids in
/// the order served, and `between` called before each next page (to add workloads meanwhile).
async fn all_pages(s: &Srv, path: &str, mut between: impl AsyncFnMut()) -> Vec<u64> {
    let mut ids = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..100 {
        let p = match &cursor {
            None => path.to_string(),
            Some(c) => format!("{path}&cursor={}", urlencode(c)),
        };
        let page = s.get(&p).await;
        ids.extend(
            page["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|w| w["id"].as_u64().unwrap()),
        );
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return ids,
        }
        between().await;
    }
    panic!("{path}: more than 100 pages");
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `GET /workloads?sort=`: by name, state and oldest first over every matching workload, page
/// after page through `next_cursor`, with workloads added between pages neither repeated nor
/// skipped; a cursor of another sort or made up is refused as `cursor`; a member sorting or
/// forging a cursor from another tenant's workload sees only their own tenant's.
async fn the_workload_list_sorts_by_name_state_and_age_across_pages(db: Db) {
    let s = server(db, "sorted").await;
    s.tenant("vision", "train").await;
    s.tenant("nlp", "p").await;
    // Names out of id order, two alike; three cancelled, the others running.
    let names = ["kilo", "alpha", "Zulu", "mike", "alpha", "bravo", "echo"];
    let mut made: Vec<(u64, String)> = Vec::new();
    for n in names {
        let body = json!({"tenant": "vision", "project": "train", "name": n, "shape": {"fraction": 100}});
        let (st, w) = s.post("/api/v1/workloads", body).await;
        assert_eq!(st, StatusCode::CREATED, "{w}");
        made.push((w["id"].as_u64().unwrap(), n.to_string()));
    }
    let (st, theirs) = s
        .post(
            "/api/v1/workloads",
            json!({"tenant": "nlp", "project": "p", "name": "aaa-secret", "shape": {"fraction": 100}}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{theirs}");
    let theirs = theirs["id"].as_u64().unwrap();
    let cancelled = [made[1].0, made[3].0, made[6].0];
    for (id, _) in &made {
        if cancelled.contains(id) {
            let (st, w) = s.post(&format!("/api/v1/workloads/{id}/cancel"), json!({})).await;
            assert_eq!(st, StatusCode::OK, "{w}");
            s.wait_state(*id, "cancelled").await;
        } else {
            s.wait_state(*id, "running").await;
        }
    }
    // By name in byte order (`Z` before `a`), the newest first among equal names.
    let mut by_name = made.clone();
    by_name.sort_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)));
    let want: Vec<u64> = by_name.iter().map(|w| w.0).collect();
    let got = all_pages(&s, "/api/v1/workloads?tenant=vision&sort=name&limit=2", async || {}).await;
    assert_eq!(got, want, "by name over 4 pages");
    // By state: the cancelled ones (newest first), then the running ones.
    let mut want: Vec<u64> = cancelled.to_vec();
    want.sort_by(|a, b| b.cmp(a));
    let mut running: Vec<u64> = made.iter().map(|w| w.0).filter(|id| !cancelled.contains(id)).collect();
    running.sort_by(|a, b| b.cmp(a));
    want.extend(running);
    let got = all_pages(&s, "/api/v1/workloads?tenant=vision&sort=state&limit=3", async || {}).await;
    assert_eq!(got, want, "by state over 3 pages");
    // Oldest first, with a workload added after each page: each added one comes at the end,
    // none earlier is repeated or skipped.
    let mut added = Vec::new();
    let got = all_pages(&s, "/api/v1/workloads?tenant=vision&sort=oldest&limit=3", async || {
        let body = json!({"tenant": "vision", "project": "train", "name": "late", "shape": {"fraction": 100}});
        let (st, w) = s.post("/api/v1/workloads", body).await;
        assert_eq!(st, StatusCode::CREATED, "{w}");
        added.push(w["id"].as_u64().unwrap());
    })
    .await;
    let mut want: Vec<u64> = made.iter().map(|w| w.0).collect();
    want.extend(&added);
    assert_eq!(got, want, "oldest first, the added ones at the end, once each");
    // Newest first keeps its plain id cursor.
    let newest = s.get("/api/v1/workloads?tenant=vision&limit=2").await;
    let c = newest["next_cursor"].as_str().unwrap();
    assert!(c.parse::<u64>().is_ok(), "{newest}");
    // A cursor of another sort, or made up, is refused and names the parameter.
    for bad in [
        format!("sort=name&cursor={}", made[0].0),
        "sort=state&cursor=5:sleeping".to_string(),
        "sort=oldest&cursor=5:alpha".to_string(),
        "cursor=abc".to_string(),
        // Longer than the document's maxLength (300), though it reads as the id 0.
        format!("cursor={}", "0".repeat(301)),
        "sort=size".to_string(),
    ] {
        let (st, p) = s
            .req(reqwest::Method::GET, &format!("/api/v1/workloads?{bad}"), None, &[])
            .await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {p}");
        if bad.contains("cursor") {
            assert!(p.to_string().contains("cursor"), "{bad}: {p}");
        }
    }
    // An empty cursor is the first page, as none is (the same workloads; their states move on).
    let empty = s.get("/api/v1/workloads?tenant=vision&limit=2&cursor=").await;
    let ids = |p: &Value| {
        p["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["id"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&empty), ids(&newest), "an empty cursor: the first page");
    assert_eq!(empty["next_cursor"], newest["next_cursor"]);
    // A member of vision: sorting and a cursor forged from nlp's workload show only vision's.
    let (_, t) = s
        .post("/api/v1/tokens", json!({"tenant": "vision", "role": "member"}))
        .await;
    let member = s.with_token(t["token"].as_str().unwrap());
    for path in [
        "/api/v1/workloads?sort=name&limit=50".to_string(),
        format!("/api/v1/workloads?sort=name&limit=50&cursor={theirs}:aaa-secret"),
        format!("/api/v1/workloads?sort=oldest&limit=50&cursor={}", theirs - 1),
        "/api/v1/workloads?tenant=nlp&sort=state".to_string(),
    ] {
        let page = member.get(&path).await;
        for w in page["items"].as_array().unwrap() {
            assert_eq!(w["tenant"], "vision", "{path}: {page}");
        }
        assert!(!page.to_string().contains("aaa-secret"), "{path}: {page}");
    }
    let mine = member.get("/api/v1/workloads?sort=name&limit=50").await;
    assert_eq!(mine["items"].as_array().unwrap().len(), made.len() + added.len());
}

tessera_testdb::each_database!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async create_run_cancel_release,
    batch_workloads_complete_and_queue_drains,
    a_gangs_dry_run_says_when_and_where_it_would_start,
    a_remainder_gang_runs_as_whole_nodes_and_the_remainder,
    a_remainder_gang_is_held_to_the_quota_and_its_rules,
    idempotent_create,
    bad_input_is_refused_with_the_field_and_nothing_is_stored,
    tenant_tokens_see_only_their_tenant,
    every_documented_route_is_served,
    quotas_borrowing_limits_budgets_and_usage,
    owner_reclaims_its_guarantee_from_a_borrower,
    a_gang_within_its_guarantee_says_when_it_takes_its_share_back,
    image_policy_is_validated_audited_and_enforced_at_admission,
    priority_classes_are_granted_by_the_platform_admin,
    a_deleted_project_or_tenant_is_refused_at_once,
    apply_is_all_or_nothing,
    the_workload_list_sorts_by_name_state_and_age_across_pages,
);

/// With the rules for gangs (`serve --gang-rules on`), a gang that finds no room holds a rack
/// at once — where the work running there ends first, by its leases — instead of after the
/// backfill window; with the default settings it only waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_gang_rules_a_blocked_gang_holds_a_rack_at_once() {
    async fn blocked_gang_reason(rules: bool) -> String {
        let s = TestServer::start_with(&format!("gang-rules-{rules}"), |c| {
            let govern = tessera_sched::cycle::GovernConfig {
                min_runtime_ms: 0,
                reclaim_after_ms: 0,
                ..Default::default()
            };
            ServerConfig {
                govern: if rules { govern.with_gang_rules() } else { govern },
                gangs_first: rules,
                ..c
            }
        })
        .await;
        s.tenant_with_project("vision", "train").await;
        // The training pool (16 nodes of 8 in racks of 4) full: the first four jobs end in an
        // hour, the rest have no end.
        let mut ids = Vec::new();
        for i in 0..16 {
            let mut body = json!({"tenant": "vision", "project": "train", "name": "fill", "shape": {"gpus": 8, "pool": "training"}});
            if i < 4 {
                body["duration_s"] = json!(3600);
            }
            let (st, w) = s.post("/api/v1/workloads", body).await;
            assert_eq!(st, StatusCode::CREATED, "{w}");
            ids.push(w["id"].as_u64().unwrap());
        }
        for id in &ids {
            s.wait_state(*id, &["running"]).await;
        }
        let (st, g) = s
            .post(
                "/api/v1/workloads",
                json!({"tenant": "vision", "project": "train", "name": "gang", "shape": {"gpus": 32, "pool": "training"}}),
            )
            .await;
        assert_eq!(st, StatusCode::CREATED, "{g}");
        let id = g["id"].as_u64().unwrap();
        // The reason the next cycles give.
        let w = poll(
            40,
            Duration::from_millis(50),
            async || s.get(&format!("/api/v1/workloads/{id}")).await,
            |w| w["reason"].as_str().is_some_and(|r| r.contains("held for it")),
        )
        .await;
        assert_eq!(w["state"], "queued", "{w}");
        w["reason"].as_str().unwrap_or_default().to_string()
    }
    let with_rules = blocked_gang_reason(true).await;
    assert!(with_rules.contains("held for it"), "{with_rules}");
    assert!(with_rules.contains("starts at about"), "{with_rules}");
    let without = blocked_gang_reason(false).await;
    assert!(!without.contains("held for it"), "{without}");
}

/// The time and rack a gang's start is given at in `reason` (a queue reason or a dry run's):
/// `("YYYY-MM-DD HH:MM", rack, workloads ending first)`.
fn start_in(reason: &str) -> (String, String, String) {
    let at = reason
        .split("starts at about ")
        .nth(1)
        .and_then(|r| r.split(" UTC").next())
        .unwrap_or_else(|| panic!("no start in {reason}"))
        .to_string();
    let rack = reason
        .split(" in rack ")
        .nth(1)
        .and_then(|r| r.split([' ', ':', ';']).next())
        .unwrap_or_else(|| panic!("no rack in {reason}"))
        .to_string();
    let ending = reason
        .split(" when ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("no count in {reason}"))
        .to_string();
    (at, rack, ending)
}

/// With the gang rules' stacked holds, the dry run plans a gang behind the gangs already
/// waiting with holds: it promises no start before theirs have run, and the reason the gang
/// gets once submitted names the same start, rack and count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gangs_dry_run_counts_the_holds_of_the_gangs_waiting_before_it() {
    let s = TestServer::start_with("gang-dry-run-holds", |c| ServerConfig {
        govern: tessera_sched::cycle::GovernConfig {
            min_runtime_ms: 0,
            reclaim_after_ms: 0,
            ..Default::default()
        }
        .with_gang_rules(),
        gangs_first: true,
        ..c
    })
    .await;
    s.tenant_with_project("vision", "train").await;
    // The training pool (16 nodes of 8 in racks of 4) full: four jobs end in an hour (in one
    // rack, by the gang rules' placement by end), the rest never.
    let mut ids = Vec::new();
    for i in 0..16 {
        let mut body =
            json!({"tenant": "vision", "project": "train", "name": "fill", "shape": {"gpus": 8, "pool": "training"}});
        if i < 4 {
            body["duration_s"] = json!(3600);
        }
        let (st, w) = s.post("/api/v1/workloads", body).await;
        assert_eq!(st, StatusCode::CREATED, "{w}");
        ids.push(w["id"].as_u64().unwrap());
    }
    let mut racks = std::collections::BTreeSet::new();
    let nodes = s.get("/api/v1/nodes?pool=training").await;
    let list = nodes.as_array().or_else(|| nodes["items"].as_array()).unwrap().clone();
    for id in &ids[..4] {
        let w = s.wait_state(*id, &["running"]).await;
        let node = w["allocation"]["node"].as_str().unwrap().to_string();
        let n = list.iter().find(|n| n["name"] == node.as_str()).unwrap();
        racks.insert(n["rack"].as_str().unwrap().to_string());
    }
    assert_eq!(racks.len(), 1, "the leased jobs share a rack: {racks:?}");
    let r0 = racks.into_iter().next().unwrap();
    for id in &ids[4..] {
        s.wait_state(*id, &["running"]).await;
    }
    let gang = json!({"tenant": "vision", "project": "train", "name": "g", "shape": {"gpus": 32, "pool": "training"}, "duration_s": 3600});
    let held = async |id: u64| {
        let w = poll(
            100,
            Duration::from_millis(50),
            async || s.get(&format!("/api/v1/workloads/{id}")).await,
            |w| w["reason"].as_str().is_some_and(|r| r.contains("held for it")),
        )
        .await;
        assert_eq!(w["state"], "queued", "{w}");
        w["reason"].as_str().unwrap().to_string()
    };
    // Two gangs wait, stacked on the rack: the first from the leases' end, the second after it.
    let mut starts = Vec::new();
    for _ in 0..2 {
        let (st, g) = s.post("/api/v1/workloads", gang.clone()).await;
        assert_eq!(st, StatusCode::CREATED, "{g}");
        starts.push(start_in(&held(g["id"].as_u64().unwrap()).await));
    }
    assert_eq!((&starts[0].1, &starts[0].2[..]), (&r0, "4"), "{starts:?}");
    assert_eq!((&starts[1].1, &starts[1].2[..]), (&r0, "5"), "{starts:?}");
    assert!(starts[1].0 > starts[0].0, "{starts:?}");
    // The dry run of a third, right after the second hold is read and several times over:
    // each answer waits behind both gangs. (The snapshot published between full ones carried
    // an older copy of the engine and holds: dry runs right after the hold answered "borrow"
    // on a rack that was full, or a wait behind one gang or none.)
    let mut answers = Vec::new();
    for _ in 0..10 {
        let (st, d) = s.post("/api/v1/workloads/dry-run", gang.clone()).await;
        assert_eq!(st, StatusCode::OK, "{d}");
        answers.push(d);
    }
    for d in &answers {
        assert_eq!(d["outcome"], "wait", "{d}");
        assert!(
            d["reason"].as_str().unwrap_or_default().contains("when 6 workloads"),
            "{d}"
        );
    }
    let dry = answers[0]["reason"].as_str().unwrap().to_string();
    let promised = start_in(&dry);
    assert_eq!((&promised.1, &promised.2[..]), (&r0, "6"), "behind both gangs: {dry}");
    assert!(
        promised.0 > starts[1].0,
        "no earlier than after the second gang: {dry} / {starts:?}"
    );
    // Submitted, it is told the same.
    let (st, g) = s.post("/api/v1/workloads", gang.clone()).await;
    assert_eq!(st, StatusCode::CREATED, "{g}");
    let reason = held(g["id"].as_u64().unwrap()).await;
    assert_eq!(start_in(&reason), promised, "{reason} / {dry}");
}
