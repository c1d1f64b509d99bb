//! Restart test, on SQLite and on PostgreSQL: start `tessera serve`, create workloads, `kill
//! -9` it, start it again on the same data directory (or database): the same workloads, states and allocations; no capacity leaked or
//! double-booked; every acknowledged request survives.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tessera_testdb::Db;

struct Server {
    child: Child,
    base: String,
    token: Option<String>,
}

// The child is returned inside `Server`; every test kills and waits for it.
#[allow(clippy::zombie_processes)]
fn start(dir: &std::path::Path, database: &Option<String>) -> Server {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tessera"));
    cmd.arg("serve");
    if let Some(url) = database {
        // The same id after the restart: the new process takes over its predecessor's lease at
        // once instead of waiting for it to expire.
        cmd.args(["--database", url, "--replica-id", "restarted"]);
    }
    let mut child = cmd
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("tessera serve starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut token = None;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < deadline, "server did not come up");
        let line = lines.next().expect("server printed its address").unwrap();
        if let Some(t) = line.strip_prefix("Admin token: ") {
            token = Some(t.trim().to_string());
        }
        if let Some(rest) = line.split("console http://").nth(1) {
            let addr = rest.split('/').next().unwrap().to_string();
            std::thread::spawn(move || for _ in lines {});
            return Server {
                child,
                base: format!("http://{addr}"),
                token,
            };
        }
    }
}

async fn call(
    http: &reqwest::Client,
    s: &Server,
    token: &str,
    m: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut rb = http.request(m, format!("{}{path}", s.base)).bearer_auth(token);
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

async fn snapshot(http: &reqwest::Client, s: &Server, token: &str) -> (BTreeMap<u64, (String, Value)>, Value, Value) {
    let mut all = BTreeMap::new();
    let mut cursor = String::new();
    loop {
        let (_, page) = call(
            http,
            s,
            token,
            reqwest::Method::GET,
            &format!("/api/v1/workloads?limit=500{cursor}"),
            None,
        )
        .await;
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
    let (_, pools) = call(http, s, token, reqwest::Method::GET, "/api/v1/pools", None).await;
    let (_, gpus) = call(http, s, token, reqwest::Method::GET, "/api/v1/gpus?limit=500", None).await;
    (all, pools, gpus)
}

async fn kill_9_and_restart_keeps_every_acknowledged_workload(db: Db) {
    let dir = std::env::temp_dir().join(format!("tessera-restart-{db:?}-{}", std::process::id()));
    let database = db.url();
    let _ = std::fs::remove_dir_all(&dir);
    let mut s = start(&dir, &database);
    let token = s.token.clone().expect("first start prints the admin token");
    let http = reqwest::Client::new();
    let post = |path: &'static str, body: Value| {
        let (http, base, token) = (http.clone(), s.base.clone(), token.clone());
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
    let (before, pools_before, _) = snapshot(&http, &s, &token).await;
    assert!(before.values().any(|(st, _)| st == "queued"), "some work waits");
    assert!(before.values().any(|(st, _)| st == "running"));
    s.child.kill().unwrap(); // SIGKILL
    s.child.wait().unwrap();

    let mut s2 = start(&dir, &database);
    assert!(s2.token.is_none(), "the admin token is created only once");
    let (after, pools_after, gpus) = snapshot(&http, &s2, &token).await;
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
    let (st, _) = call(
        &http,
        &s2,
        &token,
        reqwest::Method::POST,
        &format!("/api/v1/workloads/{running}/cancel"),
        Some(json!({})),
    )
    .await;
    assert_eq!(st, 200);
    let mut ok = false;
    for _ in 0..100 {
        let (_, w) = call(
            &http,
            &s2,
            &token,
            reqwest::Method::GET,
            &format!("/api/v1/workloads/{running}"),
            None,
        )
        .await;
        if w["state"] == "cancelled" {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ok, "cancel completes after a restart");
    s2.child.kill().unwrap();
    s2.child.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
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
    let dir = std::env::temp_dir().join(format!("tessera-ledger-{db:?}-{}", std::process::id()));
    let database = db.url();
    let _ = std::fs::remove_dir_all(&dir);
    let mut s = start(&dir, &database);
    let token = s.token.clone().expect("admin token");
    let http = reqwest::Client::new();
    for t in ["a", "b"] {
        call(
            &http,
            &s,
            &token,
            reqwest::Method::POST,
            "/api/v1/tenants",
            Some(json!({"name": t})),
        )
        .await;
        call(
            &http,
            &s,
            &token,
            reqwest::Method::POST,
            &format!("/api/v1/tenants/{t}/projects"),
            Some(json!({"name": "p"})),
        )
        .await;
    }
    let shapes = [
        json!({"fraction": 250}),
        json!({"mig": "2g.20gb"}),
        json!({"gpus": 2, "pool": "training"}),
        json!({"mig": "7g.80gb"}),
    ];
    // A deterministic pseudo-random stream.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut ids = Vec::new();
    for round in 0..2 {
        for i in 0..30 {
            let r = next();
            let body = json!({
                "tenant": if r % 2 == 0 { "a" } else { "b" },
                "project": "p",
                "name": format!("r{round}-{i}"),
                "shape": shapes[(r >> 8) as usize % shapes.len()],
                "duration_s": 1 + (r >> 16) % 3,
            });
            let (st, w) = call(
                &http,
                &s,
                &token,
                reqwest::Method::POST,
                "/api/v1/workloads",
                Some(body),
            )
            .await;
            assert_eq!(st, 201, "{w}");
            ids.push(w["id"].as_u64().unwrap());
            tokio::time::sleep(Duration::from_millis((r >> 24) % 60)).await;
        }
        if round == 0 {
            // Crash in the middle of the stream, with work running.
            s.child.kill().unwrap();
            s.child.wait().unwrap();
            s = start(&dir, &database);
        }
    }
    // Wait for everything to end.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, page) = call(
            &http,
            &s,
            &token,
            reqwest::Method::GET,
            "/api/v1/workloads?limit=500",
            None,
        )
        .await;
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
        let (_, w) = call(
            &http,
            &s,
            &token,
            reqwest::Method::GET,
            &format!("/api/v1/workloads/{id}"),
            None,
        )
        .await;
        let (_, ev) = call(
            &http,
            &s,
            &token,
            reqwest::Method::GET,
            &format!("/api/v1/workloads/{id}/events"),
            None,
        )
        .await;
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
    let (st, report) = call(
        &http,
        &s,
        &token,
        reqwest::Method::GET,
        "/api/v1/usage?by=tenant&from=2000-01-01",
        None,
    )
    .await;
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
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

tessera_testdb::each_database!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async kill_9_and_restart_keeps_every_acknowledged_workload,
    ledger_matches_allocations_across_kill_9,
);
