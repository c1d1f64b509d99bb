//! Restart test, on SQLite and on PostgreSQL: start `tessera serve`, create workloads, `kill
//! -9` it, start it again on the same data directory (or database): the same workloads, states and allocations; no capacity leaked or
//! double-booked; every acknowledged request survives; the console's telemetry charts keep
//! what they showed.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::{Serving, TempDir, serve_command, sim_serve_command, wait_until_serving, xorshift};
use reqwest::Method;
use serde_json::{Value, json};
use tessera_testdb::Db;

fn start(dir: &Path, database: &Option<String>) -> Serving {
    let mut cmd = serve_command();
    if let Some(url) = database {
        // The same id after the restart: the new process takes over its predecessor's lease at
        // once instead of waiting for it to expire.
        cmd.args(["--database", url, "--replica-id", "restarted"]);
    }
    cmd.args(["--listen", "127.0.0.1:0", "--data-dir"]).arg(dir);
    wait_until_serving(&mut cmd, Duration::from_secs(30))
}

/// A fresh data directory, the database of `db` (none: SQLite in the data directory), the first
/// start on them and its admin.
fn first_start(tag: &str, db: Db) -> (TempDir, Option<String>, Serving, Admin) {
    let dir = TempDir::new(&format!("{tag}-{db:?}"));
    let database = db.url();
    let s = start(&dir.0, &database);
    let admin = Admin {
        http: reqwest::Client::new(),
        token: s.admin_token.clone().expect("first start prints the admin token"),
    };
    (dir, database, s, admin)
}

/// The admin's requests to a server.
struct Admin {
    http: reqwest::Client,
    token: String,
}

impl Admin {
    async fn call(&self, s: &Serving, m: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut rb = self
            .http
            .request(m, format!("{}{path}", s.base))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let r = rb.send().await.unwrap();
        let st = r.status().as_u16();
        let t = r.text().await.unwrap();
        (
            st,
            if t.is_empty() {
                Value::Null
            } else {
                serde_json::from_str(&t).unwrap()
            },
        )
    }

    async fn get(&self, s: &Serving, path: &str) -> (u16, Value) {
        self.call(s, Method::GET, path, None).await
    }

    async fn post(&self, s: &Serving, path: &str, body: Value) -> (u16, Value) {
        self.call(s, Method::POST, path, Some(body)).await
    }
}

async fn snapshot(admin: &Admin, s: &Serving) -> (BTreeMap<u64, (String, Value)>, Value, Value) {
    let mut all = BTreeMap::new();
    let mut cursor = String::new();
    loop {
        let (_, page) = admin.get(s, &format!("/api/v1/workloads?limit=500{cursor}")).await;
        for w in page["items"].as_array().unwrap() {
            all.insert(
                w["id"].as_u64().unwrap(),
                (w["state"].as_str().unwrap().to_string(), w["allocation"].clone()),
            );
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => break,
        }
    }
    let (_, pools) = admin.get(s, "/api/v1/pools").await;
    let (_, gpus) = admin.get(s, "/api/v1/gpus?limit=500").await;
    (all, pools, gpus)
}

async fn kill_9_and_restart_keeps_every_acknowledged_workload(db: Db) {
    let (dir, database, mut s, admin) = first_start("restart", db);
    let post = |path: &'static str, body: Value| {
        let (http, base, token) = (admin.http.clone(), s.base.clone(), admin.token.clone());
        async move {
            let r = http
                .post(format!("{base}{path}"))
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    assert_eq!(post("/api/v1/tenants", json!({"name": "vision"})).await.0, 201);
    assert_eq!(
        post("/api/v1/tenants/vision/projects", json!({"name": "train"}))
            .await
            .0,
        201
    );
    let shapes = [
        json!({"mig": "3g.40gb"}),
        json!({"mig": "1g.10gb"}),
        json!({"mig": "2g.20gb"}),
        json!({"gpus": 8, "pool": "training"}),
        json!({"gpus": 2, "pool": "training"}),
        json!({"fraction": 300}),
        json!({"fraction": 650}),
    ];
    // Enough whole-GPU work to fill the training pool and leave some queued.
    let mut acked = Vec::new();
    for i in 0..77 {
        let shape = if i < 70 {
            shapes[i % shapes.len()].clone()
        } else {
            json!({"gpus": 8, "pool": "training"})
        };
        let (st, w) = post("/api/v1/workloads", json!({"tenant": "vision", "project": "train", "name": format!("w{i}"), "shape": shape, "duration_s": 3600})).await;
        assert_eq!(st, 201, "{w}");
        acked.push(w["id"].as_u64().unwrap());
    }
    // Let them reach running, then fire a burst and kill -9 right after the acknowledgements.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let burst: Vec<_> = (0..20)
        .map(|i| post("/api/v1/workloads", json!({"tenant": "vision", "project": "train", "name": format!("b{i}"), "shape": {"mig": "1g.10gb"}, "duration_s": 3600})))
        .collect();
    for (st, w) in futures_join(burst).await {
        assert_eq!(st, 201, "{w}");
        acked.push(w["id"].as_u64().unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (before, pools_before, _) = snapshot(&admin, &s).await;
    assert!(before.values().any(|(st, _)| st == "queued"), "some work waits");
    assert!(before.values().any(|(st, _)| st == "running"));
    s.kill(); // SIGKILL

    let mut s2 = start(&dir.0, &database);
    assert!(s2.admin_token.is_none(), "the admin token is created only once");
    let (after, pools_after, gpus) = snapshot(&admin, &s2).await;
    for id in &acked {
        assert!(after.contains_key(id), "acknowledged workload {id} survived");
    }
    assert_eq!(before, after, "same workloads, states and allocations");
    assert_eq!(pools_before, pools_after, "same capacity in use");
    // No GPU double-booked: every GPU holds at most 1 unit and MIG slices do not overlap.
    for g in gpus["items"].as_array().unwrap() {
        let used: f64 = g["units_used"].as_str().unwrap().parse().unwrap();
        assert!(used <= 1.0, "{g}");
        let slices = g["slices"].as_array().unwrap();
        let mut mask = 0u32;
        for sl in slices.iter().filter(|x| x["kind"] == "mig") {
            let m = ((1u32 << sl["size"].as_u64().unwrap()) - 1) << sl["start"].as_u64().unwrap();
            assert_eq!(mask & m, 0, "overlapping MIG instances: {g}");
            mask |= m;
        }
    }
    // The restarted server still works: cancel one running workload, its capacity returns.
    let running = after
        .iter()
        .find(|(_, (st, a))| st == "running" && a["kind"] == "mig")
        .map(|(id, _)| *id)
        .unwrap();
    let (st, _) = admin
        .post(&s2, &format!("/api/v1/workloads/{running}/cancel"), json!({}))
        .await;
    assert_eq!(st, 200);
    let mut ok = false;
    for _ in 0..100 {
        let (_, w) = admin.get(&s2, &format!("/api/v1/workloads/{running}")).await;
        if w["state"] == "cancelled" {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ok, "cancel completes after a restart");
    s2.kill();
}

/// Awaits every future concurrently.
async fn futures_join<F: std::future::Future<Output = T> + Send + 'static, T: Send + 'static>(fs: Vec<F>) -> Vec<T> {
    let handles: Vec<_> = fs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

/// The usage ledger equals the integral of allocated units over time, per tenant, to the
/// millisecond, across a `kill -9` and restart in the middle of a random workload stream.
async fn ledger_matches_allocations_across_kill_9(db: Db) {
    let (dir, database, mut s, admin) = first_start("ledger", db);
    for t in ["a", "b"] {
        admin.post(&s, "/api/v1/tenants", json!({"name": t})).await;
        admin
            .post(&s, &format!("/api/v1/tenants/{t}/projects"), json!({"name": "p"}))
            .await;
    }
    let shapes = [
        json!({"fraction": 250}),
        json!({"mig": "2g.20gb"}),
        json!({"gpus": 2, "pool": "training"}),
        json!({"mig": "7g.80gb"}),
    ];
    // A deterministic pseudo-random stream.
    let mut next = xorshift(0x9E37_79B9_7F4A_7C15);
    let mut ids = Vec::new();
    for round in 0..2 {
        for i in 0..30 {
            let r = next();
            let body = json!({
                "tenant": if r.is_multiple_of(2) { "a" } else { "b" },
                "project": "p",
                "name": format!("r{round}-{i}"),
                "shape": shapes[(r >> 8) as usize % shapes.len()],
                "duration_s": 1 + (r >> 16) % 3,
            });
            let (st, w) = admin.post(&s, "/api/v1/workloads", body).await;
            assert_eq!(st, 201, "{w}");
            ids.push(w["id"].as_u64().unwrap());
            tokio::time::sleep(Duration::from_millis((r >> 24) % 60)).await;
        }
        if round == 0 {
            // Crash in the middle of the stream, with work running.
            s.kill();
            s = start(&dir.0, &database);
        }
    }
    // Wait for everything to end.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, page) = admin.get(&s, "/api/v1/workloads?limit=500").await;
        let items = page["items"].as_array().unwrap();
        if items.len() == ids.len()
            && items
                .iter()
                .all(|w| ["succeeded", "failed", "cancelled"].contains(&w["state"].as_str().unwrap()))
        {
            break;
        }
        assert!(Instant::now() < deadline, "workloads did not finish");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Integral of allocated units over time from the timelines (running → released events).
    let mut expected: BTreeMap<String, f64> = BTreeMap::new();
    for id in &ids {
        let (_, w) = admin.get(&s, &format!("/api/v1/workloads/{id}")).await;
        let (_, ev) = admin.get(&s, &format!("/api/v1/workloads/{id}/events")).await;
        let ev = ev.as_array().unwrap();
        let at = |step: &str| {
            ev.iter()
                .filter(|e| e["step"] == step)
                .map(|e| e["at_ms"].as_i64().unwrap())
                .collect::<Vec<_>>()
        };
        let (running, released) = (at("running"), at("released"));
        assert_eq!(
            running.len(),
            released.len(),
            "every run is released exactly once: {ev:?}"
        );
        let units = w["allocation"]["units_milli"].as_u64().unwrap_or(0) as f64 / 1000.0;
        let ms: i64 = running.iter().zip(&released).map(|(r, e)| e - r).sum();
        *expected.entry(w["tenant"].as_str().unwrap().to_string()).or_default() += units * ms as f64 / 3_600_000.0;
    }
    let (st, report) = admin.get(&s, "/api/v1/usage?by=tenant&from=2000-01-01").await;
    assert_eq!(st, 200, "{report}");
    for row in report["rows"].as_array().unwrap() {
        let t = row["key"].as_str().unwrap();
        let ledger = row["allocated_unit_hours"].as_f64().unwrap();
        let want = expected[t];
        assert!(want > 0.0);
        // Equal to the millisecond (1 ms of one GPU unit = 2.8e-7 unit-hours).
        assert!(
            (ledger - want).abs() < 1e-9,
            "tenant {t}: ledger {ledger} vs allocations {want}"
        );
    }
    assert_eq!(report["rows"].as_array().unwrap().len(), expected.len());
    s.kill();
}

/// A GET with `token`: the status and the JSON body (`Null` when it is not JSON).
async fn get_as(http: &reqwest::Client, s: &Serving, token: &str, path: &str) -> (u16, Value) {
    let r = http
        .get(format!("{}{path}", s.base))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    (
        st,
        serde_json::from_str(&r.text().await.unwrap()).unwrap_or(Value::Null),
    )
}

/// The minutes (`x`, seconds) of a chart's data whose `field` has a value.
fn minutes_with(data: &Value, field: &str) -> Vec<i64> {
    let x = data["x"].as_array().unwrap();
    let v = data[field].as_array().unwrap();
    assert_eq!(x.len(), v.len(), "{data}");
    x.iter()
        .zip(v)
        .filter(|(_, v)| !v.is_null())
        .map(|(x, _)| x.as_i64().unwrap())
        .collect()
}

/// The console's telemetry survives `kill -9`: a workload runs on the simulator (telemetry
/// every 200 ms, the history sampled every 200 ms instead of every minute — each sample still
/// of its minute) and ends; the server is killed and started again without any telemetry
/// (the simulator reports none), so that what the charts show after the restart can only
/// come from the store. The workload's telemetry (its tenant's JSON) has its earlier minutes
/// with their figures, the training pool's utilisation its earlier minutes; the other tenant
/// still finds nothing.
async fn telemetry_survives_kill_9(db: Db) {
    let dir = TempDir::new(&format!("telemetry-{db:?}"));
    let database = db.url();
    let start = |telemetry_ms: u64| {
        let mut cmd = sim_serve_command(telemetry_ms);
        cmd.args(["--sample-every-ms", "200"]);
        if let Some(url) = &database {
            cmd.args(["--database", url, "--replica-id", "restarted"]);
        }
        cmd.arg("--data-dir").arg(&dir.0);
        wait_until_serving(&mut cmd, Duration::from_secs(30))
    };
    let mut s = start(200);
    let admin = Admin {
        http: reqwest::Client::new(),
        token: s.admin_token.clone().expect("first start prints the admin token"),
    };
    let mut tokens = BTreeMap::new();
    for (t, p) in [("vision", "train"), ("nlp", "p")] {
        assert_eq!(admin.post(&s, "/api/v1/tenants", json!({"name": t})).await.0, 201);
        let (st, _) = admin
            .post(&s, &format!("/api/v1/tenants/{t}/projects"), json!({"name": p}))
            .await;
        assert_eq!(st, 201);
        let (st, tok) = admin
            .post(&s, "/api/v1/tokens", json!({"tenant": t, "role": "member"}))
            .await;
        assert_eq!(st, 201, "{tok}");
        tokens.insert(t, tok["token"].as_str().unwrap().to_string());
    }
    let (st, w) = admin
        .post(
            &s,
            "/api/v1/workloads",
            json!({"tenant": "vision", "project": "train", "name": "trainer", "shape": {"gpus": 2, "pool": "training"}, "duration_s": 2}),
        )
        .await;
    assert_eq!(st, 201, "{w}");
    let id = w["id"].as_u64().unwrap();
    let telemetry = format!("/console/workloads/{id}/telemetry?format=json&range=1h");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, w) = admin.get(&s, &format!("/api/v1/workloads/{id}")).await;
        if w["state"] == "succeeded" {
            break;
        }
        assert!(Instant::now() < deadline, "the workload did not end: {w}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A few more samples (of the pools) are taken and stored.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let (st, before) = get_as(&admin.http, &s, &tokens["vision"], &telemetry).await;
    assert_eq!(st, 200, "{before}");
    let before_minutes = minutes_with(&before, "utilisation_pct");
    assert!(!before_minutes.is_empty(), "it ran with telemetry: {before}");
    let pool = "/console/charts/data?pool=training&format=json&range=1h";
    let (st, pool_before) = get_as(&admin.http, &s, &admin.token, pool).await;
    assert_eq!(st, 200, "{pool_before}");
    let pool_minutes = minutes_with(&pool_before, "utilisation_pct");
    assert!(!pool_minutes.is_empty(), "{pool_before}");
    s.kill(); // SIGKILL

    let s = start(0);
    // Read back by the sampler's task, which starts with the server.
    let deadline = Instant::now() + Duration::from_secs(10);
    let after = loop {
        let (st, after) = get_as(&admin.http, &s, &tokens["vision"], &telemetry).await;
        assert_eq!(st, 200, "{after}");
        if !minutes_with(&after, "utilisation_pct").is_empty() || Instant::now() > deadline {
            break after;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let after_minutes = minutes_with(&after, "utilisation_pct");
    assert!(!after_minutes.is_empty(), "the workload's telemetry survived: {after}");
    assert!(
        after_minutes.iter().all(|m| before_minutes.contains(m)),
        "the minutes it ran in: {before} / {after}"
    );
    for (i, u) in after["utilisation_pct"].as_array().unwrap().iter().enumerate() {
        let u = u.as_f64().unwrap();
        assert!(u > 0.0 && u <= 100.0, "the simulator kept its GPUs busy: {after}");
        let (used, total) = (
            after["memory_used_mib"][i].as_f64().unwrap(),
            after["memory_mib"][i].as_u64().unwrap(),
        );
        assert!(used > 0.0 && total >= used as u64 && total > 0, "{after}");
    }
    let (_, pool_after) = get_as(&admin.http, &s, &admin.token, pool).await;
    let pool_after_minutes = minutes_with(&pool_after, "utilisation_pct");
    assert!(
        !pool_after_minutes.is_empty(),
        "the pool's utilisation survived: {pool_after}"
    );
    assert!(
        pool_after_minutes.iter().all(|m| pool_minutes.contains(m)),
        "{pool_before} / {pool_after}"
    );
    // The other tenant still finds nothing.
    for path in [telemetry.clone(), format!("/console/workloads/{id}/telemetry?range=7d")] {
        let r = admin
            .http
            .get(format!("{}{path}", s.base))
            .bearer_auth(&tokens["nlp"])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 404, "{path}");
        let body = r.text().await.unwrap();
        assert!(
            !body.contains("utilisation") && !body.contains("start_utc") && !body.contains("trainer"),
            "{body}"
        );
    }
}

tessera_testdb::each_database!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async kill_9_and_restart_keeps_every_acknowledged_workload,
    ledger_matches_allocations_across_kill_9,
    telemetry_survives_kill_9,
);
