//! The isolation matrix: every API route × every role × an object of the caller's own tenant
//! or of another tenant, with the exact expected status of each cell, on both databases. The test fails when a
//! route is added to the OpenAPI document without an entry here.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::support::{Parts, TestServer};
use reqwest::{Method, StatusCode};
use serde_json::json;
use tessera_server::ServerConfig;
use tessera_testdb::Db;

async fn server(tag: &str, db: Db, cfg: impl FnOnce(ServerConfig) -> ServerConfig) -> TestServer {
    TestServer::start_on(&format!("{tag}-{db:?}"), Parts::on(db.url()), cfg).await
}

/// A new workload of `tenant` (in project `train` of `vision`, else `p`): its id.
async fn workload(s: &TestServer, tenant: &str) -> u64 {
    let project = if tenant == "vision" { "train" } else { "p" };
    let w = s
        .ok(
            Method::POST,
            "/api/v1/workloads",
            Some(json!({"tenant": tenant, "project": project, "name": "w", "shape": {"fraction": 100}})),
        )
        .await;
    w["id"].as_u64().unwrap()
}

/// The id of a new viewer token of `tenant`.
async fn token_of(s: &TestServer, tenant: &str) -> String {
    let t = s
        .ok(
            Method::POST,
            "/api/v1/tokens",
            Some(json!({"tenant": tenant, "role": "viewer"})),
        )
        .await;
    t["id"].as_str().unwrap().to_string()
}

/// Expected statuses for [platform-admin, tenant-admin, member, viewer, anonymous].
type Row = [u16; 5];

async fn isolation_matrix(db: Db) {
    let s = server("rbac", db, |c| c).await;
    for (t, p) in [("vision", "train"), ("nlp", "p")] {
        s.tenant_with_project(t, p).await;
    }
    // Tokens by role: the platform admin, then tenant `vision`'s tenant-admin, member and viewer, then none.
    let mut tokens: Vec<(&str, Option<String>)> = vec![("platform-admin", Some(s.admin.clone()))];
    for role in ["tenant-admin", "member", "viewer"] {
        tokens.push((role, Some(s.token("vision", role).await)));
    }
    tokens.push(("anonymous", None));
    let own_wl = workload(&s, "vision").await;
    let other_wl = workload(&s, "nlp").await;

    // (method, path template, [own row, other row]).
    let matrix: Vec<(&str, &str, Row, Row)> = vec![
        (
            "GET",
            "/api/v1/health",
            [200, 200, 200, 200, 200],
            [200, 200, 200, 200, 200],
        ),
        (
            "GET",
            "/api/v1/replicas",
            [200, 200, 200, 200, 401],
            [200, 200, 200, 200, 401],
        ),
        (
            "GET",
            "/api/v1/pools",
            [200, 200, 200, 200, 401],
            [200, 200, 200, 200, 401],
        ),
        (
            "GET",
            "/api/v1/nodes",
            [200, 200, 200, 200, 401],
            [200, 200, 200, 200, 401],
        ),
        (
            "GET",
            "/api/v1/gpus",
            [200, 200, 200, 200, 401],
            [200, 200, 200, 200, 401],
        ),
        (
            "GET",
            "/api/v1/tenants",
            [200, 200, 200, 200, 401],
            [200, 200, 200, 200, 401],
        ),
        (
            "POST",
            "/api/v1/tenants",
            [201, 403, 403, 403, 401],
            [201, 403, 403, 403, 401],
        ),
        (
            "GET",
            "/api/v1/tenants/{tenant}",
            [200, 200, 200, 200, 401],
            [200, 404, 404, 404, 401],
        ),
        (
            "DELETE",
            "/api/v1/tenants/{tenant}",
            [409, 403, 403, 403, 401],
            [409, 403, 403, 403, 401],
        ),
        (
            "GET",
            "/api/v1/tenants/{tenant}/projects",
            [200, 200, 200, 200, 401],
            [200, 404, 404, 404, 401],
        ),
        (
            "POST",
            "/api/v1/tenants/{tenant}/projects",
            [201, 201, 403, 403, 401],
            [201, 404, 404, 404, 401],
        ),
        (
            "GET",
            "/api/v1/tenants/{tenant}/projects/{project}",
            [200, 200, 200, 200, 401],
            [200, 404, 404, 404, 401],
        ),
        (
            "DELETE",
            "/api/v1/tenants/{tenant}/projects/{project}",
            [409, 409, 403, 403, 401],
            [409, 404, 404, 404, 401],
        ),
        (
            "PUT",
            "/api/v1/tenants/{tenant}/image-policy",
            [200, 200, 403, 403, 401],
            [200, 404, 404, 404, 401],
        ),
        (
            "GET",
            "/api/v1/tenants/{tenant}/image-policy",
            [200, 200, 200, 200, 401],
            [200, 404, 404, 404, 401],
        ),
        (
            "DELETE",
            "/api/v1/tenants/{tenant}/image-policy",
            [204, 204, 403, 403, 401],
            [204, 404, 404, 404, 401],
        ),
        (
            "GET",
            "/api/v1/tenants/{tenant}/quotas",
            [200, 200, 200, 200, 401],
            [200, 404, 404, 404, 401],
        ),
        (
            "PUT",
            "/api/v1/tenants/{tenant}/quotas/{class}",
            [200, 403, 403, 403, 401],
            [200, 403, 403, 403, 401],
        ),
        (
            "DELETE",
            "/api/v1/tenants/{tenant}/quotas/{class}",
            [204, 403, 403, 403, 401],
            [204, 403, 403, 403, 401],
        ),
        (
            "PUT",
            "/api/v1/tenants/{tenant}/budget",
            [204, 403, 403, 403, 401],
            [204, 403, 403, 403, 401],
        ),
        // Only the platform admin grants priority classes: a tenant cannot grant itself any, and
        // any other caller is refused before the tenant is looked up (403 for every tenant).
        (
            "PUT",
            "/api/v1/tenants/{tenant}/priorities",
            [200, 403, 403, 403, 401],
            [200, 403, 403, 403, 401],
        ),
        (
            "POST",
            "/api/v1/apply",
            [200, 403, 403, 403, 401],
            [200, 403, 403, 403, 401],
        ),
        (
            "GET",
            "/api/v1/tokens",
            [200, 200, 403, 403, 401],
            [200, 200, 403, 403, 401],
        ),
        (
            "POST",
            "/api/v1/tokens",
            [201, 201, 403, 403, 401],
            [201, 403, 403, 403, 401],
        ),
        (
            "DELETE",
            "/api/v1/tokens/{id}",
            [204, 204, 404, 404, 401],
            [204, 404, 404, 404, 401],
        ),
        (
            "GET",
            "/api/v1/audit",
            [200, 200, 403, 403, 401],
            [200, 200, 403, 403, 401],
        ),
        (
            "GET",
            "/api/v1/workloads",
            [200, 200, 200, 200, 401],
            [200, 200, 200, 200, 401],
        ),
        (
            "POST",
            "/api/v1/workloads",
            [201, 201, 201, 403, 401],
            [201, 422, 422, 422, 401],
        ),
        (
            // Answers what creation would do, creating nothing: the same rights as creation.
            "POST",
            "/api/v1/workloads/dry-run",
            [200, 200, 200, 403, 401],
            [200, 422, 422, 422, 401],
        ),
        (
            "GET",
            "/api/v1/workloads/{id}",
            [200, 200, 200, 200, 401],
            [200, 404, 404, 404, 401],
        ),
        (
            "POST",
            "/api/v1/workloads/{id}/cancel",
            [200, 200, 200, 403, 401],
            [200, 404, 404, 404, 401],
        ),
        (
            "GET",
            "/api/v1/workloads/{id}/events",
            [200, 200, 200, 200, 401],
            [200, 404, 404, 404, 401],
        ),
        (
            // The simulated backend keeps no logs: 409 once the workload is visible.
            "GET",
            "/api/v1/workloads/{id}/logs",
            [409, 409, 409, 409, 401],
            [409, 404, 404, 404, 401],
        ),
        (
            "GET",
            "/api/v1/usage",
            [200, 200, 200, 200, 401],
            [200, 404, 404, 404, 401],
        ),
        (
            "GET",
            "/api/v1/usage/intervals",
            [200, 200, 200, 200, 401],
            [200, 404, 404, 404, 401],
        ),
        (
            "POST",
            "/api/v1/sim/faults",
            [200, 403, 403, 403, 401],
            [200, 403, 403, 403, 401],
        ),
        (
            "POST",
            "/api/v1/nodes/{node}/drain",
            [200, 403, 403, 403, 401],
            [200, 403, 403, 403, 401],
        ),
        (
            "POST",
            "/api/v1/nodes/{node}/{action}",
            [200, 403, 403, 403, 401],
            [200, 403, 403, 403, 401],
        ),
        // MIG mode: platform-admin only; h100-00 is in a whole pool, so the admin's call is
        // refused as not MIG-capable.
        (
            "POST",
            "/api/v1/nodes/{node}/gpus/{gpu}/mig",
            [422, 403, 403, 403, 401],
            [422, 403, 403, 403, 401],
        ),
        (
            "GET",
            "/api/v1/gpus/health",
            [200, 403, 403, 403, 401],
            [200, 403, 403, 403, 401],
        ),
        (
            "POST",
            "/api/v1/gpus/{node}/{gpu}/clear",
            [409, 403, 403, 403, 401],
            [409, 403, 403, 403, 401],
        ),
        // Rolling upgrades: platform-admin only. The first admin call starts rollout 1 of the
        // development pool, the second conflicts with it; cancel works once.
        (
            "POST",
            "/api/v1/rollouts",
            [201, 403, 403, 403, 401],
            [409, 403, 403, 403, 401],
        ),
        (
            "GET",
            "/api/v1/rollouts",
            [200, 403, 403, 403, 401],
            [200, 403, 403, 403, 401],
        ),
        (
            "GET",
            "/api/v1/rollouts/{id}",
            [200, 403, 403, 403, 401],
            [200, 403, 403, 403, 401],
        ),
        (
            "POST",
            "/api/v1/rollouts/{id}/cancel",
            [200, 403, 403, 403, 401],
            [409, 403, 403, 403, 401],
        ),
    ];

    // Every documented route has a row, and every row is documented.
    let (_, doc) = s.call_as(None, Method::GET, "/api/v1/openapi.json", None).await;
    let documented: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(p, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .map(move |m| (m.to_uppercase(), p.clone()))
        })
        .collect();
    let covered: BTreeSet<(String, String)> = matrix
        .iter()
        .map(|(m, p, _, _)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(
        documented, covered,
        "the isolation matrix must list every route of the API"
    );

    let mut failures = Vec::new();
    let mut n = 0;
    for (method, template, own_row, other_row) in &matrix {
        for (scope, row) in [("own", own_row), ("other", other_row)] {
            let (tenant, project) = if scope == "own" {
                ("vision", "train")
            } else {
                ("nlp", "p")
            };
            for (ri, (role, token)) in tokens.iter().enumerate() {
                n += 1;
                // Fresh objects for cells that consume them.
                let mut path = template
                    .replace("{tenant}", tenant)
                    .replace("{project}", project)
                    .replace("{class}", "training")
                    .replace("{node}", "h100-00")
                    .replace("{gpu}", "0")
                    .replace("{action}", "uncordon");
                if template.contains("/rollouts/{id}") {
                    path = path.replace("{id}", "1");
                } else if template.contains("/tokens/{id}") {
                    path = path.replace("{id}", &token_of(&s, tenant).await);
                } else if template.ends_with("/cancel") {
                    let id = workload(&s, tenant).await;
                    path = path.replace("{id}", &id.to_string());
                } else {
                    path = path.replace("{id}", &(if scope == "own" { own_wl } else { other_wl }).to_string());
                }
                if *method == "DELETE" && template.ends_with("/image-policy") {
                    s.ok(
                        Method::PUT,
                        &path,
                        Some(json!({"registries": ["registry.example.com/"]})),
                    )
                    .await;
                }
                if *method == "DELETE" && template.contains("/quotas/") {
                    s.ok(Method::PUT, &path, Some(json!({"guaranteed": 1}))).await;
                }
                if (*template == "/api/v1/usage" || *template == "/api/v1/usage/intervals") && scope == "other" {
                    path.push_str("?tenant=nlp");
                }
                let body = match (*method, *template) {
                    ("POST", "/api/v1/tenants") => Some(json!({"name": format!("t{n}")})),
                    ("POST", "/api/v1/tenants/{tenant}/projects") => Some(json!({"name": format!("p{n}")})),
                    ("POST", "/api/v1/tokens") => Some(json!({"tenant": tenant, "role": "member"})),
                    ("POST", "/api/v1/workloads" | "/api/v1/workloads/dry-run") => {
                        Some(json!({"tenant": tenant, "project": project, "name": "m", "shape": {"fraction": 100}}))
                    }
                    ("POST", "/api/v1/sim/faults") => Some(json!({"node": "h100-00", "gpu": 0, "xid": 0})),
                    ("POST", "/api/v1/rollouts") => Some(json!({"pool": "development"})),
                    ("POST", "/api/v1/nodes/{node}/gpus/{gpu}/mig") => Some(json!({"enabled": false})),
                    ("PUT", _) if template.ends_with("budget") => Some(json!({"monthly_unit_hours": 1000})),
                    ("PUT", _) if template.ends_with("priorities") => Some(json!({"priorities": ["standard"]})),
                    ("POST", "/api/v1/apply") => Some(json!({"tenants": []})),
                    ("PUT", _) if template.ends_with("image-policy") => {
                        Some(json!({"registries": ["registry.example.com/team-a/"]}))
                    }
                    ("PUT", _) => Some(json!({"guaranteed": 1})),
                    ("POST", _) => Some(json!({})),
                    _ => None,
                };
                let m = Method::from_bytes(method.as_bytes()).unwrap();
                let (st, v) = s.call_as(token.as_deref(), m, &path, body).await;
                if st.as_u16() != row[ri] {
                    failures.push(format!(
                        "{method} {path} as {role} ({scope}): expected {}, got {} {v}",
                        row[ri],
                        st.as_u16()
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {n} cells differ:\n{}",
        failures.len(),
        failures.join("\n")
    );

    // Denials and authentication failures are on the audit log.
    let (_, audit) = s.call(Method::GET, "/api/v1/audit?limit=500", None).await;
    let actions: Vec<&str> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert!(actions.contains(&"auth.failure"));
    assert!(actions.iter().any(|a| a.starts_with("denied ")));
    assert!(actions.iter().any(|a| a.starts_with("POST /api/v1/workloads")));
}

async fn revoked_and_expired_tokens_fail_at_once_and_rate_limits_answer_429(db: Db) {
    let s = server("tokens", db, |c| ServerConfig { rate_limit: 5.0, ..c }).await;
    s.ok(Method::POST, "/api/v1/tenants", Some(json!({"name": "vision"})))
        .await;
    let t = s
        .ok(
            Method::POST,
            "/api/v1/tokens",
            Some(json!({"tenant": "vision", "role": "member"})),
        )
        .await;
    let secret = t["token"].as_str().unwrap().to_string();
    // How the tenant's page answers `token`.
    let tenant_as = async |token: &str| {
        s.call_as(Some(token), Method::GET, "/api/v1/tenants/vision", None)
            .await
            .0
    };
    assert_eq!(tenant_as(&secret).await, StatusCode::OK);
    let (st, _) = s
        .call(
            Method::DELETE,
            &format!("/api/v1/tokens/{}", t["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    assert_eq!(tenant_as(&secret).await, StatusCode::UNAUTHORIZED, "revoked at once");
    let e = s
        .ok(
            Method::POST,
            "/api/v1/tokens",
            Some(json!({"tenant": "vision", "role": "viewer", "expires_in_s": 1})),
        )
        .await;
    let exp = e["token"].as_str().unwrap().to_string();
    assert_eq!(tenant_as(&exp).await, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(tenant_as(&exp).await, StatusCode::UNAUTHORIZED, "expired");
    // 5 requests/s, bursts of 10: the 11th immediate request is refused with Retry-After.
    let mut limited = None;
    for _ in 0..30 {
        let r = s
            .request(Some(&s.admin), Method::GET, "/api/v1/pools")
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            limited = Some(r);
            break;
        }
    }
    let r = limited.expect("the rate limit answers 429");
    assert!(r.headers().get("retry-after").is_some());
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
}

/// A tenant probing a platform-admin operation learns nothing from it: whatever it sends (a
/// valid body, an invalid value, broken JSON, another content type, a bad query, a tenant or
/// class that does not exist) the answer is the same 403, given before the request is read.
/// The platform admin gets 422 (or 400/415) for the same invalid requests, so each probe is one
/// the operation's validation would otherwise have answered.
async fn a_tenant_probing_a_platform_admin_operation_gets_403_whatever_it_sends(db: Db) {
    let s = server("probe", db, |c| c).await;
    s.tenant_with_project("vision", "train").await;
    let tenant_admin = s.token("vision", "tenant-admin").await;
    let member = s.token("vision", "member").await;
    enum Probe {
        Json(serde_json::Value),
        Raw(&'static str, &'static str),
        Nothing,
    }
    use Probe::{Json, Nothing, Raw};
    // (method, path, a request the admin's validation refuses).
    let probes: Vec<(Method, &str, Probe)> = vec![
        (Method::POST, "/api/v1/tenants", Json(json!({"name": "Not A Name!"}))),
        (Method::POST, "/api/v1/tenants", Raw("application/json", "{\"name\": ")),
        (
            Method::PUT,
            "/api/v1/tenants/vision/priorities",
            Json(json!({"priorities": ["no-such-class"]})),
        ),
        (
            Method::PUT,
            "/api/v1/tenants/vision/quotas/no-such-pool",
            Json(json!({"guaranteed": 1})),
        ),
        (
            Method::PUT,
            "/api/v1/tenants/vision/quotas/training",
            Json(json!({"guaranteed": 4, "limit": 2})),
        ),
        (
            Method::PUT,
            "/api/v1/tenants/vision/quotas/training",
            Raw("text/plain", "guaranteed=1"),
        ),
        (
            Method::PUT,
            "/api/v1/tenants/no-such-tenant/quotas/training",
            Json(json!({"guaranteed": 1})),
        ),
        (
            Method::PUT,
            "/api/v1/tenants/vision/budget",
            Json(json!({"monthly_unit_hours": -5})),
        ),
        (
            Method::POST,
            "/api/v1/apply",
            Json(json!({"tenants": [{"name": "vision", "quotas": {"no-such-pool": {"guaranteed": 1}}}]})),
        ),
        (
            Method::POST,
            "/api/v1/apply?dry_run=maybe",
            Json(json!({"tenants": []})),
        ),
        (
            Method::POST,
            "/api/v1/rollouts",
            Json(json!({"pool": "training", "max_parallel": "all"})),
        ),
        (Method::GET, "/api/v1/rollouts?limit=0", Nothing),
        (
            Method::POST,
            "/api/v1/nodes/h100-00/drain?after=preempt",
            Json(json!({"deadline_s": -1})),
        ),
        (Method::POST, "/api/v1/nodes/h100-00/cordon?deadline_s=60", Nothing),
        (
            Method::POST,
            "/api/v1/nodes/a100-00/gpus/0/mig",
            Json(json!({"enabled": "yes"})),
        ),
        (
            Method::POST,
            "/api/v1/sim/faults",
            Json(json!({"node": "h100-00", "gpu": 0, "xid": "boom"})),
        ),
    ];
    for (method, path, probe) in &probes {
        let send = |token: &str| {
            let rb = s.request(Some(token), method.clone(), path);
            let rb = match probe {
                Json(v) => rb.json(v),
                Raw(ct, text) => rb.header("content-type", *ct).body(*text),
                Nothing => rb,
            };
            async move {
                let r = rb.send().await.unwrap();
                let st = r.status();
                let body: serde_json::Value = r.json().await.unwrap_or_default();
                (st, body)
            }
        };
        let (st, v) = send(&s.admin).await;
        assert!(
            matches!(st.as_u16(), 400 | 404 | 415 | 422),
            "{method} {path}: the admin's request is invalid, got {st} {v}"
        );
        for (role, token) in [("tenant-admin", &tenant_admin), ("member", &member)] {
            let (st, v) = send(token).await;
            assert_eq!(st, StatusCode::FORBIDDEN, "{method} {path} as {role}: {v}");
            let detail = v["detail"].as_str().unwrap_or_default();
            assert!(
                detail.contains("platform-admin") && !detail.contains("no-such") && !detail.contains("guaranteed"),
                "{method} {path} as {role}: the refusal says the role and nothing of the request: {detail}"
            );
        }
    }
}

tessera_testdb::each_database!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async isolation_matrix,
    revoked_and_expired_tokens_fail_at_once_and_rate_limits_answer_429,
    a_tenant_probing_a_platform_admin_operation_gets_403_whatever_it_sends,
);
