//! The API's contract and hardening, end to end through HTTP against servers started on free
//! ports (seed fleet, simulated backend, fresh SQLite; the tests that touch the store run once
//! more on a fresh PostgreSQL database): the last platform-admin token cannot be
//! revoked and local recovery issues a new one; audit records name the caller as resolved before
//! the action; every documented input rule is enforced with a problem naming the field; every
//! refusal, including those of the extractors and the middleware, is an
//! `application/problem+json` document; `/metrics` on the API address needs a metrics
//! credential; the CORS policy; and the OpenAPI document states what the server does.

use crate::support::{Parts, Reply, TempDir, TestServer, send};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tessera_api::rules;
use tessera_server::ServerConfig;
use tessera_testdb::Db;

trait Problem {
    /// Asserts the answer is a problem document of `status` and returns it.
    fn problem(&self, status: StatusCode) -> &Value;
}

impl Problem for Reply {
    fn problem(&self, status: StatusCode) -> &Value {
        assert_eq!(self.status, status, "{}", self.body);
        assert_eq!(
            self.headers.get("content-type").map(|v| v.to_str().unwrap()),
            Some("application/problem+json"),
            "{status}: {}",
            self.body
        );
        let p = &self.body;
        assert!(
            p["type"].as_str().unwrap().starts_with("https://tessera.dev/problems/"),
            "{p}"
        );
        assert_eq!(p["status"], status.as_u16(), "{p}");
        assert!(!p["title"].as_str().unwrap().is_empty(), "{p}");
        assert!(!p["detail"].as_str().unwrap().is_empty(), "{p}");
        p
    }
}

async fn server_with(tag: &str, cfg: impl FnOnce(ServerConfig) -> ServerConfig) -> TestServer {
    on(Db::Sqlite, tag, cfg).await
}

/// A server on `db`.
async fn on(db: Db, tag: &str, cfg: impl FnOnce(ServerConfig) -> ServerConfig) -> TestServer {
    TestServer::start_on(&format!("hardening-{tag}-{db:?}"), Parts::on(db.url()), cfg).await
}

async fn server(tag: &str) -> TestServer {
    server_with(tag, |c| c).await
}

/// A new token: its id and its secret.
async fn token(s: &TestServer, body: Value) -> (String, String) {
    let t = s.ok(Method::POST, "/api/v1/tokens", Some(body)).await;
    (t["id"].as_str().unwrap().into(), t["token"].as_str().unwrap().into())
}

/// The audit log, newest first, as the admin token `token` reads it.
async fn audit(s: &TestServer, token: &str) -> Vec<Value> {
    let a = s
        .reply_as(Some(token), Method::GET, "/api/v1/audit?limit=500", None)
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    a.body["items"].as_array().unwrap().clone()
}

fn workload(extra: Value) -> Value {
    let mut w = json!({"tenant": "vision", "project": "train", "name": "job", "shape": {"gpus": 1}});
    for (k, v) in extra.as_object().unwrap() {
        w[k] = v.clone();
    }
    w
}

async fn the_last_admin_token_stays_and_audit_records_name_the_caller_before_the_action(db: Db) {
    let s = on(db, "lockout", |c| c).await;
    let refused = s.reply(Method::DELETE, "/api/v1/tokens/tok-admin", None).await;
    let p = refused.problem(StatusCode::CONFLICT);
    assert_eq!(p["type"], "https://tessera.dev/problems/last-admin");
    assert!(p["detail"].as_str().unwrap().contains("last platform-admin"), "{p}");
    assert_eq!(
        s.reply(Method::GET, "/api/v1/pools", None).await.status,
        StatusCode::OK,
        "the token still works"
    );

    // An admin token that expires is no way back in: it does not count.
    let (expiring, expiring_secret) = token(&s, json!({"role": "platform-admin", "expires_in_s": 3600})).await;
    s.reply(Method::DELETE, "/api/v1/tokens/tok-admin", None)
        .await
        .problem(StatusCode::CONFLICT);

    // With a second lasting admin token the first can go, even by its own hand ...
    let (second, second_secret) = token(&s, json!({"role": "platform-admin", "name": "ops"})).await;
    let own = s.reply(Method::DELETE, "/api/v1/tokens/tok-admin", None).await;
    assert_eq!(own.status, StatusCode::NO_CONTENT, "{}", own.body);
    s.reply(Method::GET, "/api/v1/pools", None)
        .await
        .problem(StatusCode::UNAUTHORIZED);
    // ... but now the second is the last one.
    let last = s
        .reply_as(
            Some(&second_secret),
            Method::DELETE,
            &format!("/api/v1/tokens/{second}"),
            None,
        )
        .await;
    assert_eq!(
        last.problem(StatusCode::CONFLICT)["type"],
        "https://tessera.dev/problems/last-admin"
    );
    let gone = s
        .reply_as(
            Some(&second_secret),
            Method::DELETE,
            &format!("/api/v1/tokens/{expiring}"),
            None,
        )
        .await;
    assert_eq!(gone.status, StatusCode::NO_CONTENT);
    s.reply_as(Some(&expiring_secret), Method::GET, "/api/v1/pools", None)
        .await
        .problem(StatusCode::UNAUTHORIZED);

    // Every revocation's record names the token that asked, resolved before the action: the
    // self-revocation is `tok-admin`'s, not `anonymous`.
    let log = audit(&s, &second_secret).await;
    let revocations: Vec<(String, String, u64)> = log
        .iter()
        .filter(|r| r["action"] == "DELETE /api/v1/tokens/{id}")
        .map(|r| {
            (
                r["actor"].as_str().unwrap().to_string(),
                r["target"].as_str().unwrap().to_string(),
                r["outcome"].as_u64().unwrap(),
            )
        })
        .collect();
    let target = |id: &str| format!("/api/v1/tokens/{id}");
    assert_eq!(
        revocations,
        vec![
            (second.clone(), target(&expiring), 204),
            (second.clone(), target(&second), 409),
            ("tok-admin".into(), target("tok-admin"), 204),
            ("tok-admin".into(), target("tok-admin"), 409),
            ("tok-admin".into(), target("tok-admin"), 409),
        ]
    );
    assert!(
        log.iter().all(|r| r["actor"] != "anonymous" || r["outcome"] == 401),
        "{log:?}"
    );
}

async fn local_recovery_issues_a_working_admin_token_while_the_server_runs(db: Db) {
    let s = on(db, "recover", |c| c).await;
    let store = crate::support::open_store(&s.dir.0, s.database.as_deref()).await;
    let r = tessera_server::admin::recover(store.as_ref(), &s.dir.0).await.unwrap();
    assert!(r.secret.starts_with("tsr_") && r.secret != s.admin);
    assert_eq!(std::fs::read_to_string(&r.file).unwrap().trim(), r.secret);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&r.file).unwrap().permissions().mode() & 0o777, 0o600);
    }
    // The running server knows nothing of it and still accepts it: unknown tokens are looked
    // up in the store.
    let tokens = s.reply_as(Some(&r.secret), Method::GET, "/api/v1/tokens", None).await;
    assert_eq!(tokens.status, StatusCode::OK, "{}", tokens.body);
    let listed = tokens.body.as_array().unwrap();
    let mine = listed.iter().find(|t| t["id"] == r.id.as_str()).expect("listed");
    assert_eq!(mine["role"], "platform-admin");
    assert!(mine.get("expires_at").is_none());
    // With two lasting admin tokens, the old one may be revoked now.
    let revoke = s
        .reply_as(Some(&r.secret), Method::DELETE, "/api/v1/tokens/tok-admin", None)
        .await;
    assert_eq!(revoke.status, StatusCode::NO_CONTENT);
    // The recovery is on the audit log, by the local user.
    let log = audit(&s, &r.secret).await;
    let rec = log
        .iter()
        .find(|e| e["action"] == "admin.recover")
        .expect("the recovery is audited");
    assert!(rec["actor"].as_str().unwrap().starts_with("local:"), "{rec}");
    assert_eq!(rec["target"], format!("/api/v1/tokens/{}", r.id));

    // A store without a platform is refused, and not made into one: no token, no secret.
    let empty = TempDir::new("hardening-recover-empty");
    let fresh = crate::support::open_store(&empty.0, db.url().as_deref()).await;
    let e = tessera_server::admin::recover(fresh.as_ref(), &empty.0)
        .await
        .unwrap_err();
    assert!(format!("{e:#}").contains("holds no Tessera platform"), "{e:#}");
    assert_eq!(fresh.token_count().await.unwrap(), 0);
    assert!(!empty.0.join("admin-token").exists(), "no secret written");
}

async fn every_documented_input_rule_is_enforced_with_the_field_named(db: Db) {
    let s = on(db, "rules", |c| c).await;
    s.tenant_with_project("vision", "train").await;
    let too_long = "é".repeat(64);
    // (method, path, body, expected status, field)
    let cases: Vec<(Method, String, Option<Value>, StatusCode, &str)> = vec![
        // Host resources: at least 500 milli-CPU and 1 GiB.
        (
            Method::POST,
            "/api/v1/workloads".into(),
            Some(workload(json!({"cpu_milli": 0}))),
            StatusCode::UNPROCESSABLE_ENTITY,
            "cpu_milli",
        ),
        (
            Method::POST,
            "/api/v1/workloads".into(),
            Some(workload(json!({"cpu_milli": 499}))),
            StatusCode::UNPROCESSABLE_ENTITY,
            "cpu_milli",
        ),
        (
            Method::POST,
            "/api/v1/workloads".into(),
            Some(workload(json!({"memory_mib": 0}))),
            StatusCode::UNPROCESSABLE_ENTITY,
            "memory_mib",
        ),
        (
            Method::POST,
            "/api/v1/workloads".into(),
            Some(workload(json!({"memory_mib": 1023}))),
            StatusCode::UNPROCESSABLE_ENTITY,
            "memory_mib",
        ),
        // Durations: 1 s to 366 days.
        (
            Method::POST,
            "/api/v1/workloads".into(),
            Some(workload(json!({"duration_s": i64::MAX}))),
            StatusCode::UNPROCESSABLE_ENTITY,
            "duration_s",
        ),
        (
            Method::POST,
            "/api/v1/workloads".into(),
            Some(workload(json!({"duration_s": rules::DURATION_S.max + 1}))),
            StatusCode::UNPROCESSABLE_ENTITY,
            "duration_s",
        ),
        (
            Method::POST,
            "/api/v1/workloads".into(),
            Some(workload(json!({"duration_s": 0}))),
            StatusCode::UNPROCESSABLE_ENTITY,
            "duration_s",
        ),
        // Names: 1–63 characters, no control or bidirectional formatting characters.
        (
            Method::POST,
            "/api/v1/workloads".into(),
            Some(workload(json!({"name": ""}))),
            StatusCode::UNPROCESSABLE_ENTITY,
            "name",
        ),
        (
            Method::POST,
            "/api/v1/workloads".into(),
            Some(workload(json!({"name": too_long}))),
            StatusCode::UNPROCESSABLE_ENTITY,
            "name",
        ),
        (
            Method::POST,
            "/api/v1/workloads".into(),
            Some(workload(json!({"name": "invoice\u{202E}fdp.exe"}))),
            StatusCode::UNPROCESSABLE_ENTITY,
            "name",
        ),
        (
            Method::POST,
            "/api/v1/workloads".into(),
            Some(workload(json!({"name": "two\nlines"}))),
            StatusCode::UNPROCESSABLE_ENTITY,
            "name",
        ),
        (
            Method::POST,
            "/api/v1/workloads".into(),
            Some(workload(json!({"project": ""}))),
            StatusCode::UNPROCESSABLE_ENTITY,
            "project",
        ),
        (
            Method::POST,
            "/api/v1/workloads".into(),
            Some(workload(json!({"tenant": "Vision"}))),
            StatusCode::UNPROCESSABLE_ENTITY,
            "tenant",
        ),
        // Whole numbers are whole: 1.5 GPUs is not one.
        (
            Method::POST,
            "/api/v1/workloads".into(),
            Some(workload(json!({"shape": {"gpus": 1.5}}))),
            StatusCode::UNPROCESSABLE_ENTITY,
            "shape.gpus",
        ),
        (
            Method::POST,
            "/api/v1/workloads".into(),
            Some(workload(json!({"shape": {"gpus": 1, "gpu_memory_mib": 100}}))),
            StatusCode::UNPROCESSABLE_ENTITY,
            "shape.gpu_memory_mib",
        ),
        (
            Method::POST,
            "/api/v1/workloads".into(),
            Some(workload(json!({"shape": {"fraction": 100}, "surprise": 1}))),
            StatusCode::UNPROCESSABLE_ENTITY,
            "surprise",
        ),
        (
            Method::POST,
            "/api/v1/workloads".into(),
            Some(json!({"tenant": "vision", "project": "train", "name": "j"})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "shape",
        ),
        // Tokens: lifetimes up to two years (no overflow), names as above, tenants where needed.
        (
            Method::POST,
            "/api/v1/tokens".into(),
            Some(json!({"role": "viewer", "tenant": "vision", "expires_in_s": i64::MAX})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "expires_in_s",
        ),
        (
            Method::POST,
            "/api/v1/tokens".into(),
            Some(json!({"role": "viewer", "tenant": "vision", "expires_in_s": 0})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "expires_in_s",
        ),
        (
            Method::POST,
            "/api/v1/tokens".into(),
            Some(json!({"role": "viewer", "tenant": "vision", "name": "ci\u{2067}"})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "name",
        ),
        (
            Method::POST,
            "/api/v1/tokens".into(),
            Some(json!({"role": "viewer"})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "tenant",
        ),
        (
            Method::POST,
            "/api/v1/tokens".into(),
            Some(json!({"role": "metrics", "tenant": "vision"})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "tenant",
        ),
        (
            Method::POST,
            "/api/v1/tokens".into(),
            Some(json!({"role": "root"})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "role",
        ),
        // Tenants and projects.
        (
            Method::POST,
            "/api/v1/tenants".into(),
            Some(json!({"name": "acme", "display_name": "\u{2066}ACME"})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "display_name",
        ),
        (
            Method::POST,
            "/api/v1/tenants".into(),
            Some(json!({"name": "a".repeat(rules::SLUG_MAX + 1)})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "name",
        ),
        (
            Method::POST,
            "/api/v1/tenants/vision/projects".into(),
            Some(json!({"name": "-x"})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "name",
        ),
        // Quotas and budgets.
        (
            Method::PUT,
            "/api/v1/tenants/vision/quotas/training".into(),
            Some(json!({"guaranteed": -1})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "guaranteed",
        ),
        (
            Method::PUT,
            "/api/v1/tenants/vision/quotas/training".into(),
            Some(json!({"guaranteed": 4, "limit": 2})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "limit",
        ),
        (
            Method::PUT,
            "/api/v1/tenants/vision/budget".into(),
            Some(json!({"monthly_unit_hours": 1e12})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "monthly_unit_hours",
        ),
        // Pages: 1–500 items; cursors and ids are numbers the store can hold.
        (
            Method::GET,
            "/api/v1/workloads?limit=0".into(),
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "limit",
        ),
        (
            Method::GET,
            "/api/v1/workloads?limit=-1".into(),
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "limit",
        ),
        (
            Method::GET,
            "/api/v1/tenants?limit=501".into(),
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "limit",
        ),
        (
            Method::GET,
            "/api/v1/audit?cursor=x".into(),
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "cursor",
        ),
        (
            Method::GET,
            "/api/v1/workloads?cursor=9223372036854775808".into(),
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "cursor",
        ),
        (
            Method::GET,
            "/api/v1/workloads?state=lost".into(),
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "state",
        ),
        (
            Method::GET,
            "/api/v1/workloads/18446744073709551616".into(),
            None,
            StatusCode::BAD_REQUEST,
            "id",
        ),
        (
            Method::GET,
            "/api/v1/workloads/9223372036854775808".into(),
            None,
            StatusCode::BAD_REQUEST,
            "id",
        ),
        (
            Method::GET,
            "/api/v1/workloads/abc/events".into(),
            None,
            StatusCode::BAD_REQUEST,
            "id",
        ),
        // Report dates.
        (
            Method::GET,
            "/api/v1/usage?from=".into(),
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "from",
        ),
        (
            Method::GET,
            "/api/v1/usage?from=2023-02-29".into(),
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "from",
        ),
        (
            Method::GET,
            "/api/v1/usage?from=2026-11-02&to=2026-11-01".into(),
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "to",
        ),
        (
            Method::GET,
            "/api/v1/usage?by=week".into(),
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "by",
        ),
    ];
    for (m, path, body, status, field) in cases {
        let a = s.reply(m.clone(), &path, body.clone()).await;
        let p = a.problem(status);
        assert_eq!(p["field"], field, "{m} {path} {body:?} → {p}");
    }
    let stored = s.ok(Method::GET, "/api/v1/workloads", None).await;
    assert_eq!(stored["items"], json!([]), "nothing refused was stored");
    let tokens = s.ok(Method::GET, "/api/v1/tokens", None).await;
    assert_eq!(tokens.as_array().unwrap().len(), 1, "only the admin token");

    // The edges of each rule are accepted.
    let e63 = "é".repeat(63);
    assert_eq!(e63.len(), 126, "126 bytes, 63 characters");
    let accepted = [
        workload(json!({"name": e63, "cpu_milli": 500, "memory_mib": 1024, "duration_s": 1})),
        workload(json!({"name": "訓練 🚀", "duration_s": rules::DURATION_S.max})),
        workload(json!({"shape": {"gpus": 1.0}})),
    ];
    for body in accepted {
        let a = s.reply(Method::POST, "/api/v1/workloads", Some(body.clone())).await;
        assert_eq!(a.status, StatusCode::CREATED, "{body} → {}", a.body);
    }
    let max = s
        .ok(
            Method::POST,
            "/api/v1/tokens",
            Some(json!({"role": "viewer", "tenant": "vision", "expires_in_s": rules::EXPIRES_IN_S.max})),
        )
        .await;
    let listed = s.ok(Method::GET, "/api/v1/tokens", None).await;
    let t = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == max["id"])
        .unwrap();
    let expires = tessera_api::parse_time_ms(t["expires_at"].as_str().unwrap()).unwrap();
    let lifetime = expires - tessera_server::now_ms();
    assert!(
        lifetime > (rules::EXPIRES_IN_S.max - 60) * 1000,
        "a valid token for two years, not one that expired at creation: {t}"
    );
    let works = s
        .reply_as(max["token"].as_str(), Method::GET, "/api/v1/tenants/vision", None)
        .await;
    assert_eq!(works.status, StatusCode::OK);
    for path in [
        "/api/v1/workloads?limit=1",
        "/api/v1/tenants?limit=500",
        "/api/v1/usage?from=2026-01-01",
    ] {
        assert_eq!(s.reply(Method::GET, path, None).await.status, StatusCode::OK, "{path}");
    }

    // Defaults: 4000 milli-CPU and 16 GiB per GPU unit.
    let w = s
        .ok(
            Method::POST,
            "/api/v1/workloads",
            Some(workload(json!({"shape": {"gpus": 2}}))),
        )
        .await;
    assert_eq!(
        (w["cpu_milli"].as_u64(), w["memory_mib"].as_u64()),
        (
            Some(2 * rules::CPU_MILLI_PER_GPU_UNIT),
            Some(2 * rules::MEMORY_MIB_PER_GPU_UNIT)
        )
    );
    assert_eq!(
        (rules::CPU_MILLI_PER_GPU_UNIT, rules::MEMORY_MIB_PER_GPU_UNIT),
        (4000, 16 * 1024),
        "the defaults the README states"
    );
    // A small fraction gets the floor: the documented minimum.
    let w = s
        .ok(
            Method::POST,
            "/api/v1/workloads",
            Some(workload(json!({"shape": {"fraction": 50}}))),
        )
        .await;
    assert_eq!(
        (w["cpu_milli"].as_i64(), w["memory_mib"].as_i64()),
        (Some(rules::CPU_MILLI.min), Some(rules::MEMORY_MIB.min))
    );
}

async fn every_refusal_is_a_problem_document(db: Db) {
    let s = on(db, "problems", |c| c).await;
    let admin = |m: Method, path: &str| s.request(Some(&s.admin), m, path);
    // A tenant's creation with `body` as it is, said to be of `content_type`.
    let raw_tenant = |content_type: Option<&str>, body: &'static str| {
        let rb = admin(Method::POST, "/api/v1/tenants");
        send(
            match content_type {
                Some(t) => rb.header("content-type", t),
                None => rb,
            }
            .body(body),
        )
    };

    // Not JSON, or not said to be.
    let a = raw_tenant(Some("text/plain"), r#"{"name": "x"}"#).await;
    a.problem(StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let a = raw_tenant(None, r#"{"name": "x"}"#).await;
    a.problem(StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let a = raw_tenant(Some("application/json"), r#"{"name": "#).await;
    assert!(
        a.problem(StatusCode::BAD_REQUEST)["detail"]
            .as_str()
            .unwrap()
            .contains("not valid JSON")
    );
    let a = raw_tenant(Some("application/json"), r#"{"name": "x"} trailing"#).await;
    a.problem(StatusCode::BAD_REQUEST);
    // A body that is JSON but not an object: serde alone would read a struct from an array of
    // its fields (`["x"]` as `{"name": "x"}`); every body is an object.
    for body in [r#"["x"]"#, "null", "3", r#""x""#] {
        let a = raw_tenant(Some("application/json"), body).await;
        let p = a.problem(StatusCode::UNPROCESSABLE_ENTITY);
        assert!(
            p["detail"].as_str().unwrap().contains("the body must be a JSON object"),
            "{body}: {p}"
        );
    }
    // An optional body (a drain's parameters) may be the JSON `null` the document allows
    // (`oneOf [DrainRequest, null]`): the same as none. Before, it was refused as not an object.
    let drained = send(
        admin(Method::POST, "/api/v1/nodes/h100-15/drain")
            .header("content-type", "application/json")
            .body("null"),
    )
    .await;
    assert_eq!(drained.status, StatusCode::OK, "{}", drained.body);
    assert!(
        ["draining", "maintenance"].contains(&drained.body["state"].as_str().unwrap_or_default()),
        "{}",
        drained.body
    );
    // Too large, announced or streamed (raw connections: the server answers before it has
    // read the whole body, and closes).
    let big = format!(r#"{{"name": "{}"}}"#, "x".repeat(tessera_server::BODY_LIMIT));
    for chunked in [false, true] {
        let (status, rest) = post_raw(s.running.addr, "/api/v1/tenants", &s.admin, big.as_bytes(), chunked).await;
        assert!(status.starts_with("HTTP/1.1 413"), "chunked {chunked}: {status}");
        assert!(rest.contains("content-type: application/problem+json"), "{rest}");
        assert!(rest.contains("\"status\":413"), "{rest}");
    }
    // A method the path does not take: 405 with `Allow`.
    let a = s.reply(Method::PATCH, "/api/v1/tenants", Some(json!({}))).await;
    a.problem(StatusCode::METHOD_NOT_ALLOWED);
    let allow = a.headers["allow"].to_str().unwrap();
    assert!(allow.contains("GET") && allow.contains("POST"), "{allow}");
    // No such route, no credential, a wrong one.
    s.reply(Method::GET, "/api/v1/nothing", None)
        .await
        .problem(StatusCode::NOT_FOUND);
    s.reply_as(None, Method::GET, "/api/v1/pools", None)
        .await
        .problem(StatusCode::UNAUTHORIZED);
    s.reply_as(Some("tsr_guess"), Method::GET, "/api/v1/pools", None)
        .await
        .problem(StatusCode::UNAUTHORIZED);
    let a = send(
        s.request(None, Method::GET, "/api/v1/pools")
            .header("authorization", "Basic YWRtaW46YWRtaW4="),
    )
    .await;
    a.problem(StatusCode::UNAUTHORIZED);
    // An `Idempotency-Key` that breaks its rule.
    let a = send(
        admin(Method::POST, "/api/v1/workloads")
            .header("idempotency-key", "has space")
            .json(&workload(json!({}))),
    )
    .await;
    assert!(a.status.is_client_error());
    a.problem(a.status);

    // Every answer carries a request ID (an incoming plain one is kept, others replaced) and
    // the security headers.
    let a = send(
        s.request(None, Method::GET, "/api/v1/health")
            .header("x-request-id", "trace-42_a"),
    )
    .await;
    assert_eq!(a.headers["x-request-id"], "trace-42_a");
    let a = send(
        s.request(None, Method::GET, "/api/v1/health")
            .header("x-request-id", "<script>alert(1)</script>"),
    )
    .await;
    let rid = a.headers["x-request-id"].to_str().unwrap();
    assert!(rid.starts_with("req-") && rid.len() == 20, "{rid}");
    for h in [
        a.headers.clone(),
        s.reply_as(None, Method::GET, "/nope", None).await.headers,
    ] {
        assert_eq!(h["x-content-type-options"], "nosniff");
        assert_eq!(h["x-frame-options"], "DENY");
        assert_eq!(h["referrer-policy"], "no-referrer");
        assert_eq!(h["cache-control"], "no-store");
        assert!(h.contains_key("x-request-id"));
    }
}

/// Sends `body` to `path` over a raw connection, with its length or (`chunked`) without;
/// returns the status line and the rest of the answer (lower-cased).
async fn post_raw(addr: std::net::SocketAddr, path: &str, token: &str, body: &[u8], chunked: bool) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    let framing = if chunked {
        "transfer-encoding: chunked".to_string()
    } else {
        format!("content-length: {}", body.len())
    };
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\n{framing}\r\nconnection: close\r\n\r\n"
    );
    c.write_all(head.as_bytes()).await.unwrap();
    for chunk in body.chunks(4096) {
        let sent = async {
            if chunked {
                c.write_all(format!("{:x}\r\n", chunk.len()).as_bytes()).await?;
            }
            c.write_all(chunk).await?;
            if chunked {
                c.write_all(b"\r\n").await?;
            }
            Ok::<_, std::io::Error>(())
        };
        // The server may answer and close before the whole body is sent.
        if sent.await.is_err() {
            break;
        }
    }
    if chunked {
        let _ = c.write_all(b"0\r\n\r\n").await;
    }
    let mut answer = Vec::new();
    let _ = c.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer).to_string();
    let (status, rest) = answer.split_once("\r\n").unwrap_or((&answer, ""));
    (status.to_string(), rest.to_ascii_lowercase())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_a_metrics_credential_on_the_api_address() {
    let s = server("metrics").await;
    s.tenant_with_project("vision", "train").await;
    let (_, metrics) = token(&s, json!({"role": "metrics", "name": "prometheus"})).await;
    let (_, member) = token(&s, json!({"role": "member", "tenant": "vision"})).await;
    let (_, tenant_admin) = token(&s, json!({"role": "tenant-admin", "tenant": "vision"})).await;
    s.ok(
        Method::POST,
        "/api/v1/workloads",
        Some(workload(json!({"name": "visible-only-to-operators"}))),
    )
    .await;

    s.reply_as(None, Method::GET, "/metrics", None)
        .await
        .problem(StatusCode::UNAUTHORIZED);
    for t in [&member, &tenant_admin] {
        s.reply_as(Some(t), Method::GET, "/metrics", None)
            .await
            .problem(StatusCode::FORBIDDEN);
    }
    for t in [&metrics, &s.admin] {
        let a = s.reply_as(Some(t), Method::GET, "/metrics", None).await;
        assert_eq!(a.status, StatusCode::OK);
        assert!(a.body.as_str().unwrap().contains("tessera_build_info"));
        assert!(a.body.as_str().unwrap().contains("tenant=\"vision\""));
    }

    // A metrics token reads /metrics and nothing else: every documented operation refuses it.
    let doc = s.ok(Method::GET, "/api/v1/openapi.json", None).await;
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        let concrete = path
            .replace("{tenant}", "vision")
            .replace("{project}", "train")
            .replace("{class}", "training")
            .replace("{id}", "1");
        for (method, op) in item.as_object().unwrap() {
            if op["security"] == json!([{}]) {
                continue;
            }
            let m = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let body = op.get("requestBody").map(|_| json!({}));
            let a = s.reply_as(Some(&metrics), m, &concrete, body).await;
            a.problem(StatusCode::FORBIDDEN);
            checked += 1;
        }
    }
    assert!(checked >= 20, "{checked} operations");

    // Only platform-admins make metrics tokens.
    let a = s
        .reply_as(
            Some(&tenant_admin),
            Method::POST,
            "/api/v1/tokens",
            Some(json!({"role": "metrics"})),
        )
        .await;
    a.problem(StatusCode::FORBIDDEN);

    // `--metrics-listen`: the same metrics without a credential, on an address of its own.
    let (addr, task) = tessera_server::serve_metrics(s.running.metrics_app.clone(), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let r = s.http.get(format!("http://{addr}/metrics")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.text().await.unwrap().contains("tessera_build_info"));
    let r = s.http.get(format!("http://{addr}/api/v1/pools")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND, "only /metrics there");
    task.abort();

    // Refused scrapes are on the audit log.
    let log = audit(&s, &s.admin).await;
    assert!(
        log.iter()
            .any(|r| r["action"] == "denied GET /metrics" && r["outcome"] == 403),
        "{log:?}"
    );
}

async fn preflight(s: &TestServer, origin: &str, method: &str) -> Reply {
    send(
        s.request(None, Method::OPTIONS, "/api/v1/workloads")
            .header("origin", origin)
            .header("access-control-request-method", method)
            .header("access-control-request-headers", "authorization, content-type"),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_answers_preflights_and_allows_only_listed_origins() {
    // Default: no origin is allowed (the console is same-origin), preflights are answered, not 405.
    let s = server("cors-default").await;
    let a = preflight(&s, "https://evil.example", "POST").await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(
        a.headers.get("access-control-allow-origin").is_none(),
        "{:?}",
        a.headers
    );
    let a = send(
        s.request(Some(&s.admin), Method::GET, "/api/v1/pools")
            .header("origin", "https://evil.example"),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.headers.get("access-control-allow-origin").is_none());

    // An allow-list: those origins, and only they, may call with a bearer token.
    let portal = "https://portal.example.com";
    let s = server_with("cors-list", |c| ServerConfig {
        cors_origins: vec![portal.into(), "http://localhost:3000".into()],
        ..c
    })
    .await;
    let a = preflight(&s, portal, "POST").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.headers["access-control-allow-origin"], portal);
    let methods = a.headers["access-control-allow-methods"].to_str().unwrap().to_string();
    assert!(methods.contains("POST") && methods.contains("DELETE"), "{methods}");
    let headers = a.headers["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_ascii_lowercase();
    assert!(
        headers.contains("authorization") && headers.contains("content-type"),
        "{headers}"
    );
    assert!(
        a.headers.get("access-control-allow-credentials").is_none(),
        "no cookies"
    );
    let a = send(
        s.request(Some(&s.admin), Method::GET, "/api/v1/pools")
            .header("origin", portal),
    )
    .await;
    assert_eq!(a.headers["access-control-allow-origin"], portal);
    assert!(
        a.headers["access-control-expose-headers"]
            .to_str()
            .unwrap()
            .to_ascii_lowercase()
            .contains("x-request-id")
    );
    let a = preflight(&s, "https://portal.example.com.evil.example", "POST").await;
    assert!(a.headers.get("access-control-allow-origin").is_none());

    // Origins are checked at start: scheme and host, no path, no wildcard.
    for bad in [
        "*",
        "portal.example.com",
        "https://portal.example.com/app",
        "ftp://x.example",
    ] {
        assert!(tessera_server::parse_cors_origins(&[bad.to_string()]).is_err(), "{bad}");
    }
    assert!(tessera_server::parse_cors_origins(&["https://a.example:8443".into()]).is_ok());
}

/// The integer properties of a schema (following `$ref`s), with their paths.
fn integers<'a>(doc: &'a Value, schema: &'a Value, at: String, out: &mut Vec<(String, &'a Value)>) {
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.trim_start_matches("#/components/schemas/");
        return integers(doc, &doc["components"]["schemas"][name], at, out);
    }
    let is_integer = match &schema["type"] {
        Value::String(t) => t == "integer",
        Value::Array(ts) => ts.iter().any(|t| t == "integer"),
        _ => false,
    };
    if is_integer {
        out.push((at.clone(), schema));
    }
    for key in ["oneOf", "anyOf", "allOf"] {
        for s in schema[key].as_array().into_iter().flatten() {
            integers(doc, s, at.clone(), out);
        }
    }
    if let Some(props) = schema["properties"].as_object() {
        for (k, v) in props {
            integers(doc, v, format!("{at}.{k}"), out);
        }
    }
    if schema.get("items").is_some() {
        integers(doc, &schema["items"], format!("{at}[]"), out);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_states_every_status_and_rule() {
    let s = server("openapi").await;
    let doc = s.ok(Method::GET, "/api/v1/openapi.json", None).await;
    assert_eq!(
        doc,
        tessera_server::openapi(),
        "`tessera openapi` prints what the server serves"
    );
    let mut operations = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            operations += 1;
            let what = format!("{method} {path}");
            let responses = op["responses"].as_object().unwrap();
            let open = op["security"] == json!([{}]);
            let body = op.get("requestBody").is_some();
            let params = op["parameters"].as_array().cloned().unwrap_or_default();
            let has = |place: &str| params.iter().any(|p| p["in"] == place);
            let mut want: Vec<&str> = vec!["429"];
            if !open {
                want.extend(["401", "403", "503"]);
            }
            if body {
                want.extend(["400", "413", "415", "422"]);
            }
            if has("path") {
                want.extend(["400", "404"]);
            }
            if has("query") || has("header") {
                want.push("422");
            }
            for code in want {
                assert!(responses.contains_key(code), "{what} does not document {code}");
            }
            assert!(
                responses.keys().any(|c| c.starts_with('2')),
                "{what}: no success status"
            );
            for (code, r) in responses {
                assert!(!r["description"].as_str().unwrap_or("").is_empty(), "{what} {code}");
                if code.starts_with('4') || code.starts_with('5') {
                    let types: Vec<&String> = r["content"].as_object().unwrap().keys().collect();
                    assert_eq!(types, ["application/problem+json"], "{what} {code}");
                    assert_eq!(
                        r["content"]["application/problem+json"]["schema"]["$ref"],
                        "#/components/schemas/Problem"
                    );
                }
            }
            assert!(responses["429"]["headers"].get("Retry-After").is_some(), "{what}");
            for p in params.iter().filter(|p| p["in"] == "path") {
                assert_eq!(p["required"], true, "{what}: {p}");
            }
            // Every whole number a client sends has a documented range, so an out-of-range value
            // is a documented refusal and never a surprise.
            let mut ints = Vec::new();
            for p in &params {
                integers(&doc, &p["schema"], format!("{what} {}", p["name"]), &mut ints);
            }
            if body {
                let schema = &op["requestBody"]["content"]["application/json"]["schema"];
                integers(&doc, schema, format!("{what} body"), &mut ints);
            }
            for (at, schema) in ints {
                assert!(
                    schema["minimum"].is_number() && schema["maximum"].is_number(),
                    "{at}: {schema}"
                );
            }
        }
    }
    assert!(operations >= 25, "{operations}");

    // The body rules are the rules the server checks.
    let schemas = &doc["components"]["schemas"];
    let w = &schemas["CreateWorkload"]["properties"];
    let pattern = w["name"]["pattern"].as_str().unwrap();
    assert_eq!(
        (&w["name"]["minLength"], &w["name"]["maxLength"]),
        (&json!(rules::NAME.min_chars), &json!(rules::NAME.max_chars))
    );
    assert!(pattern.contains(r"\u202A-\u202E"), "{pattern}");
    assert_eq!(w["cpu_milli"]["minimum"].as_f64(), Some(rules::CPU_MILLI.min as f64));
    assert_eq!(w["memory_mib"]["minimum"].as_f64(), Some(rules::MEMORY_MIB.min as f64));
    assert_eq!(w["duration_s"]["maximum"].as_f64(), Some(rules::DURATION_S.max as f64));
    assert_eq!(w["tenant"]["maxLength"], json!(rules::SLUG_MAX));
    // The defaults the server applies are the ones documented.
    let cpu = w["cpu_milli"]["description"].as_str().unwrap();
    assert!(
        cpu.contains(&format!("default {} per GPU unit", rules::CPU_MILLI_PER_GPU_UNIT)),
        "{cpu}"
    );
    let mem = w["memory_mib"]["description"].as_str().unwrap();
    assert!(
        mem.contains(&format!("default {} per GPU unit", rules::MEMORY_MIB_PER_GPU_UNIT)),
        "{mem}"
    );
    assert_eq!(
        w["priority"]["enum"],
        json!(["critical", "high", "standard", "opportunistic", null])
    );
    let t = &schemas["CreateToken"]["properties"];
    assert_eq!(
        t["expires_in_s"]["maximum"].as_f64(),
        Some(rules::EXPIRES_IN_S.max as f64)
    );
    assert_eq!(
        schemas["TokenRole"]["enum"],
        json!(["platform-admin", "tenant-admin", "member", "viewer", "metrics"])
    );
    // The rules between fields: exactly one kind of GPU shape, a token's tenant by its role.
    let shape = &schemas["GpuShape"];
    let kinds = shape["oneOf"].as_array().expect("GpuShape has a oneOf");
    assert_eq!(kinds.len(), 3, "{shape}");
    assert_eq!(kinds[0]["anyOf"][0]["required"], json!(["gpus"]));
    assert_eq!(kinds[1]["required"], json!(["mig"]));
    assert_eq!(kinds[2]["required"], json!(["fraction"]));
    assert_eq!(kinds[1]["properties"]["gpu_memory_mib"]["type"], "null");
    assert_eq!(kinds[0]["properties"]["gpu_memory_mib"]["type"], "null");
    assert!(kinds[2]["properties"].get("gpu_memory_mib").is_none());
    // `remainder` with `gpus` alone: a remainder with `nodes` (or `mig`, `fraction`) was
    // schema-valid and refused with 422.
    let remainder = &shape["allOf"][0]["anyOf"];
    assert_eq!(
        remainder[0]["properties"]["remainder"],
        json!({"const": false}),
        "{shape}"
    );
    assert_eq!(remainder[1]["required"], json!(["gpus"]));
    assert_eq!(remainder[1]["properties"]["nodes"]["type"], "null");
    let token = schemas["CreateToken"]["oneOf"]
        .as_array()
        .expect("CreateToken has a oneOf");
    assert_eq!(token[0]["required"], json!(["tenant"]));
    assert_eq!(
        token[0]["properties"]["role"]["enum"],
        json!(["tenant-admin", "member", "viewer"])
    );
    assert_eq!(token[1]["properties"]["tenant"]["type"], "null");
    // A drain is its own operation with its parameters; the other node actions take none.
    let drain = &doc["paths"]["/api/v1/nodes/{node}/drain"]["post"];
    let names: Vec<&str> = drain["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["node", "deadline_s", "after"]);
    assert!(drain.get("requestBody").is_some());
    let other = &doc["paths"]["/api/v1/nodes/{node}/{action}"]["post"];
    assert!(other.get("requestBody").is_none(), "{other}");
    let params = other["parameters"].as_array().unwrap();
    assert_eq!(params.len(), 2, "{other}");
    assert_eq!(
        params[1]["schema"]["enum"],
        json!(["cordon", "uncordon", "maintenance", "done"])
    );
    // Refusals no schema can state are in the operation's description.
    let d = doc["paths"]["/api/v1/usage"]["get"]["description"].as_str().unwrap();
    assert!(d.contains("`to` not after `from`"), "{d}");
    let limit = doc["paths"]["/api/v1/workloads"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "limit")
        .unwrap();
    assert_eq!(
        (limit["schema"]["minimum"].as_f64(), limit["schema"]["maximum"].as_f64()),
        (Some(1.0), Some(500.0))
    );
}

tessera_testdb::each_database!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async the_last_admin_token_stays_and_audit_records_name_the_caller_before_the_action,
    local_recovery_issues_a_working_admin_token_while_the_server_runs,
    every_documented_input_rule_is_enforced_with_the_field_named,
    every_refusal_is_a_problem_document,
);
