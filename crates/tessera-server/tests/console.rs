//! The console over HTTP (no browser): pages behind the sign-in, the strict CSP with no inline
//! script or style, hashed long-cached assets, API-token sign-in to a session cookie, the CSRF
//! token on every change, tenant isolation of the lists, viewers who cannot cancel. The browser
//! tests (crates/tessera/tests/console.rs) drive the same pages in Chromium. About 2 s.

use std::time::Duration;

use crate::support::{Browser, TestServer, poll};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tessera_server::ServerConfig;

/// The value of `attr="…"` after `after` in `html`.
fn attr(html: &str, after: &str, attr: &str) -> String {
    let from = html.find(after).unwrap_or_else(|| panic!("{after} in {html}"));
    let rest = &html[from..];
    let start = rest.find(&format!("{attr}=\"")).unwrap() + attr.len() + 2;
    rest[start..start + rest[start..].find('"').unwrap()].to_string()
}

/// The double-submit token of a fresh sign-in form.
async fn form_token(b: &Browser) -> String {
    attr(&b.page("/console/signin").await, "name=\"form_token\"", "value")
}

/// Signs `b` in with `token`; returns the session's CSRF token from the page.
/// The two tenants the console tests set against each other: vision (project train) and nlp
/// (project p).
async fn vision_and_nlp(s: &TestServer) {
    for (t, p) in [("vision", "train"), ("nlp", "p")] {
        s.tenant_with_project(t, p).await;
    }
}

async fn sign_in(b: &Browser, token: &str) -> String {
    let ft = form_token(b).await;
    let r = b
        .post_form(
            "/console/signin",
            &[("token", token), ("form_token", ft.as_str())],
            None,
        )
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let page = b.page("/console").await;
    let at = page.find("hx-headers='").expect("hx-headers on the body") + "hx-headers='".len();
    let h = &page[at..at + page[at..].find('\'').unwrap()];
    let v: Value = serde_json::from_str(h).unwrap_or_else(|e| panic!("{h}: {e}"));
    v["X-CSRF-Token"].as_str().unwrap().to_string()
}

fn no_inline_code(html: &str) {
    assert!(!html.contains("<style"), "no inline style element");
    assert!(!html.contains(" style="), "no style attribute");
    assert!(
        !html.contains(" on") || !html.contains("onclick="),
        "no inline handlers"
    );
    for (i, _) in html.match_indices("<script") {
        let tag = &html[i..i + html[i..].find('>').unwrap()];
        assert!(
            tag.contains(" src=\"/assets/"),
            "every script is an embedded file: {tag}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_pages_are_signed_in_csrf_guarded_and_free_of_inline_code() {
    let s = TestServer::start("console").await;
    vision_and_nlp(&s).await;
    let (member, viewer, other) = (
        s.token("vision", "member").await,
        s.token("vision", "viewer").await,
        s.token("nlp", "member").await,
    );
    let (_, w) = s
        .post(
            "/api/v1/workloads",
            json!({"tenant": "vision", "project": "train", "name": "nb", "shape": {"mig": "1g.10gb"}, "duration_s": 3600}),
        )
        .await;
    let wid = w["id"].as_u64().unwrap();

    // Without a session every page leads to the sign-in form; `/` leads to the console.
    let b = s.browser();
    let root = b.get("/").await;
    assert_eq!(root.headers()["location"], "/console");
    for page in ["/console", "/console/workloads", &format!("/console/workloads/{wid}")] {
        let r = b.get(page).await;
        assert_eq!(r.status(), StatusCode::SEE_OTHER, "{page}");
        assert_eq!(r.headers()["location"], "/console/signin", "{page}");
    }
    let form = b.get("/console/signin").await;
    let csp = form.headers()["content-security-policy"].to_str().unwrap().to_string();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    let html = form.text().await.unwrap();
    no_inline_code(&html);

    // A sign-in form post without its double-submit token is refused; a wrong token gets a
    // message next to the field.
    let forged = b
        .post_form(
            "/console/signin",
            &[("token", member.as_str()), ("form_token", "x")],
            None,
        )
        .await;
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);
    assert_eq!(forged.headers()["content-type"], "application/problem+json");
    let ft = form_token(&b).await;
    let wrong = b
        .post_form(
            "/console/signin",
            &[("token", "tsr_nope"), ("form_token", ft.as_str())],
            None,
        )
        .await;
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let wrong = wrong.text().await.unwrap();
    assert!(
        wrong.contains("id=\"token-error\"") && wrong.contains("aria-invalid=\"true\""),
        "{wrong}"
    );

    // The member signs in: a session cookie, pages with their CSRF token, every asset hashed
    // and cached for a year.
    let ft = form_token(&b).await;
    let ok = b
        .post_form(
            "/console/signin",
            &[("token", member.as_str()), ("form_token", ft.as_str())],
            None,
        )
        .await;
    let cookies: Vec<String> = ok
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    let session = cookies
        .iter()
        .find(|c| c.starts_with("tessera_session="))
        .expect("a session cookie");
    assert!(
        session.contains("HttpOnly") && session.contains("SameSite=Lax") && !session.contains("Secure"),
        "{session}"
    );
    let csrf = sign_in(&b, &member).await;
    assert_eq!(csrf.len(), 64);
    let page = b.page("/console").await;
    no_inline_code(&page);
    assert!(page.contains("<main") && page.contains("<nav") && page.contains("<header"));
    let mut assets = 0;
    for (i, _) in page.match_indices("/assets/") {
        let url = &page[i..i + page[i..].find('"').unwrap()];
        let a = b.get(url).await;
        assert_eq!(a.status(), StatusCode::OK, "{url}");
        assert_eq!(a.headers()["cache-control"], "public, max-age=31536000, immutable");
        assets += 1;
        let stale = url.replacen("/assets/", "/assets/0", 1);
        assert_eq!(b.get(&stale).await.status(), StatusCode::NOT_FOUND);
    }
    assert!(assets >= 3, "stylesheet, htmx and the console script");

    // The list shows the member's workload; its page shows the timeline.
    let list = b.page("/console/workloads").await;
    assert!(list.contains(&format!("id=\"w-{wid}\"")), "{list}");
    let detail = b.page(&format!("/console/workloads/{wid}")).await;
    assert!(detail.contains("Timeline") && detail.contains("requested"), "{detail}");
    let bad = b.get("/console/workloads?state=bogus").await;
    assert_eq!(bad.status(), StatusCode::UNPROCESSABLE_ENTITY);

    // Cancelling needs the CSRF token.
    let cancel = format!("/console/workloads/{wid}/cancel");
    let refused = b.post(&cancel, None).await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert_eq!(refused.headers()["content-type"], "application/problem+json");
    let done = b.post(&cancel, Some(&csrf)).await;
    assert_eq!(done.status(), StatusCode::OK);
    let row = done.text().await.unwrap();
    assert!(row.contains("cancelled") || row.contains("stopping"), "{row}");

    // Another tenant's member does not see it; a viewer cannot cancel.
    let o = s.browser();
    sign_in(&o, &other).await;
    let theirs = o.page("/console/workloads").await;
    assert!(!theirs.contains(&format!("id=\"w-{wid}\"")));
    let missing = o.get(&format!("/console/workloads/{wid}")).await;
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    let (_, w2) = s
        .post(
            "/api/v1/workloads",
            json!({"tenant": "vision", "project": "train", "name": "w2", "shape": {"fraction": 250}}),
        )
        .await;
    let v = s.browser();
    let vcsrf = sign_in(&v, &viewer).await;
    let vlist = v.page("/console/workloads").await;
    assert!(
        vlist.contains(&format!("id=\"w-{}\"", w2["id"])) && !vlist.contains("/cancel\""),
        "viewers get no cancel button"
    );
    let vc = v
        .post(&format!("/console/workloads/{}/cancel", w2["id"]), Some(&vcsrf))
        .await;
    assert_eq!(vc.status(), StatusCode::FORBIDDEN);

    // Signing out ends the session.
    let out = b.post("/console/signout", Some(&csrf)).await;
    assert_eq!(out.status(), StatusCode::NO_CONTENT);
    let after = b.get("/console").await;
    assert_eq!(after.status(), StatusCode::SEE_OTHER);
}

/// A dry run, which must answer 200.
async fn dry_run(s: &TestServer, body: Value) -> Value {
    let (st, d) = s.post("/api/v1/workloads/dry-run", body).await;
    assert_eq!(st, StatusCode::OK);
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_says_start_borrow_wait_or_refused_with_cost_quota_and_budget_and_changes_nothing() {
    let s = TestServer::start("dryrun").await;
    s.tenant_with_project("vision", "train").await;
    s.ok(
        Method::PUT,
        "/api/v1/tenants/vision/quotas/serving",
        Some(json!({"guaranteed": 1.0, "limit": 2.0})),
    )
    .await;
    s.ok(
        Method::PUT,
        "/api/v1/tenants/vision/budget",
        Some(json!({"monthly_unit_hours": 10.0})),
    )
    .await;
    let body = |mig: &str, no_wait: bool| {
        json!({"tenant": "vision", "project": "train", "name": "nb", "shape": {"mig": mig, "pool": "serving"},
               "duration_s": 7200, "no_wait": no_wait})
    };

    // Within the guarantee: starts; half a GPU for two hours is one unit-hour of the budget.
    let d = dry_run(&s, body("3g.40gb", false)).await;
    assert_eq!(d["outcome"], "start", "{d}");
    assert_eq!(d["pool"], "serving");
    assert_eq!(d["units"], "0.5");
    assert_eq!(d["unit_hours"], 1.0);
    assert_eq!(d["budget"]["left"], 10.0);
    assert_eq!(d["budget"]["left_after"], 9.0);
    assert_eq!(
        d["quotas"][0],
        json!({"class": "serving", "guaranteed": 1.0, "limit": 2.0, "used": 0.0, "after": 0.5})
    );
    let none = s.get("/api/v1/workloads").await;
    assert_eq!(none["items"].as_array().unwrap().len(), 0, "a dry run creates nothing");

    // Holding the whole guarantee, more borrows; over the limit it waits, or is refused when
    // it asked not to wait.
    let (_, w) = s.post("/api/v1/workloads", body("7g.80gb", false)).await;
    s.wait_state(w["id"].as_u64().unwrap(), &["placed", "running"]).await;
    let d = dry_run(&s, body("3g.40gb", false)).await;
    assert_eq!(d["outcome"], "borrow", "{d}");
    assert_eq!(d["quotas"][0]["used"], 1.0);
    let (_, w2) = s.post("/api/v1/workloads", body("7g.80gb", false)).await;
    s.wait_state(w2["id"].as_u64().unwrap(), &["placed", "running"]).await;
    let d = dry_run(&s, body("1g.10gb", false)).await;
    assert_eq!(
        (d["outcome"].as_str(), d["reason_code"].as_str()),
        (Some("wait"), Some("quota")),
        "{d}"
    );
    assert!(d["reason"].as_str().unwrap().contains("limit 2"), "{d}");
    let d = dry_run(&s, body("1g.10gb", true)).await;
    assert_eq!(d["outcome"], "refused");

    // A gang no node can hold is refused as a constraint.
    let d = dry_run(
        &s,
        json!({"tenant": "vision", "project": "train", "name": "big", "shape": {"gpus": 9}}),
    )
    .await;
    assert_eq!(
        (d["outcome"].as_str(), d["reason_code"].as_str()),
        (Some("refused"), Some("constraint")),
        "{d}"
    );
    // Bad input is refused as creation refuses it.
    let (st, p) = s
        .post(
            "/api/v1/workloads/dry-run",
            json!({"tenant": "vision", "project": "nope", "name": "x", "shape": {"gpus": 1}}),
        )
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(p["field"], "project");
}

/// Creates a workload, which must answer 201: its id.
async fn submit(s: &TestServer, body: Value) -> u64 {
    let (st, w) = s.post("/api/v1/workloads", body).await;
    assert_eq!(st, StatusCode::CREATED);
    w["id"].as_u64().unwrap()
}

/// Two nodes of two whole GPUs. The dry run asks the scheduler's engine (a copy of it the
/// snapshot carries): "start" names the node a submission then lands on; with one free GPU on
/// each node, two GPUs fit by units but not on one node, so the answer is "wait" with the
/// engine's `fragmentation` reason — and a submission indeed waits for that reason. About 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_asks_the_engine_start_names_the_node_and_fragmented_units_wait() {
    let fleet = tessera_model::Fleet::from_toml(
        "[[pool]]\nname = \"training\"\nsharing = \"whole\"\n[[pool.nodes]]\nname = \"h\"\ncount = 2\ngpu_model = \"H100-80GB-SXM\"\ngpus = 2\ncpus = 64\nmemory_gib = 512\nnvlink = \"nvswitch\"\n",
        "test",
    )
    .unwrap();
    let s = TestServer::start_with("dryrun-frag", |c| ServerConfig { fleet, ..c }).await;
    s.tenant_with_project("vision", "train").await;
    s.ok(
        Method::PUT,
        "/api/v1/tenants/vision/quotas/training",
        Some(json!({"guaranteed": 4.0, "limit": 4.0})),
    )
    .await;
    let gpus = |n: u32, name: &str| json!({"tenant": "vision", "project": "train", "name": name, "shape": {"gpus": n, "pool": "training"}});
    let d = dry_run(&s, gpus(1, "a")).await;
    assert_eq!(d["outcome"], "start", "{d}");
    let named = d["node"].as_str().unwrap().to_string();
    let a = submit(&s, gpus(1, "a")).await;
    let wa = s.wait_state(a, &["placed", "running"]).await;
    assert_eq!(
        wa["allocation"]["node"],
        named.as_str(),
        "the dry run named the node it went to"
    );
    let mut on: std::collections::HashMap<String, Vec<u64>> = Default::default();
    on.entry(named).or_default().push(a);
    for name in ["b", "c"] {
        let id = submit(&s, gpus(1, name)).await;
        let w = s.wait_state(id, &["placed", "running"]).await;
        on.entry(w["allocation"]["node"].as_str().unwrap().to_string())
            .or_default()
            .push(id);
    }
    // Free one GPU of the full node: one free GPU on each node.
    let full = on.values().find(|ids| ids.len() == 2).expect("a full node")[0];
    let (st, c) = s.post(&format!("/api/v1/workloads/{full}/cancel"), json!({})).await;
    assert!(st.is_success(), "{c}");
    s.wait_state(full, &["cancelled"]).await;
    // Dry runs ask the engine as of the last full snapshot, at most 50 ms behind a change of
    // phase: until then the freed GPU may not show, and the answer is `no-capacity`.
    let d = poll(
        60,
        Duration::from_millis(50),
        async || dry_run(&s, gpus(2, "pair")).await,
        |d| d["reason_code"] == "fragmentation",
    )
    .await;
    assert_eq!(
        (d["outcome"].as_str(), d["reason_code"].as_str()),
        (Some("wait"), Some("fragmentation")),
        "two free GPUs, on two nodes: {d}"
    );
    assert!(d["node"].is_null() && !d["reason"].as_str().unwrap().is_empty(), "{d}");
    let pair = submit(&s, gpus(2, "pair")).await;
    let pair_path = format!("/api/v1/workloads/{pair}");
    let w = poll(
        100,
        Duration::from_millis(25),
        async || s.get(&pair_path).await,
        |w| w["reason_code"].is_string(),
    )
    .await;
    assert_eq!(
        (w["state"].as_str(), w["reason_code"].as_str()),
        (Some("queued"), Some("fragmentation")),
        "the submission gets the dry run's answer: {w}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_form_offers_only_valid_choices_previews_then_submits_and_puts_errors_by_their_field() {
    let srv = TestServer::start("reqform").await;
    srv.tenant_with_project("vision", "train").await;
    let (member, viewer) = (srv.token("vision", "member").await, srv.token("vision", "viewer").await);
    let b = srv.browser();
    let csrf = sign_in(&b, &member).await;
    let page = b.page("/console/request").await;
    no_inline_code(&page);
    for pool in ["training", "serving", "development"] {
        assert!(page.contains(&format!("<option value=\"{pool}\"")), "{pool}");
    }
    assert!(page.contains("value=\"vision/train\""));
    // The MIG pool offers its model's profiles and no whole GPUs; the shared pool fractions.
    let mig = b.page("/console/request/fields?pool=serving").await;
    assert!(
        mig.contains("value=\"mig:3g.40gb\"") && !mig.contains("value=\"gpus:") && !mig.contains("fraction:"),
        "{mig}"
    );
    let shared = b.page("/console/request/fields?pool=development").await;
    assert!(
        shared.contains("value=\"fraction:250\"") && !shared.contains("mig:"),
        "{shared}"
    );

    let form = |name: &str, hours: &str| {
        vec![
            ("project", "vision/train".to_string()),
            ("name", name.to_string()),
            ("pool", "serving".into()),
            ("model", "A100-80GB".into()),
            ("shape", "mig:1g.10gb".into()),
            ("duration_h", hours.to_string()),
            ("priority", "standard".into()),
        ]
    };
    let post = |path: &'static str, f: Vec<(&'static str, String)>, csrf: Option<&str>| {
        let rb = b.client.post(b.url(path)).form(&f).header("hx-request", "true");
        crate::support::with_csrf(rb, csrf).send()
    };
    // Without the CSRF token: refused before anything is read.
    assert_eq!(
        post("/console/request/preview", form("nb", "1"), None)
            .await
            .unwrap()
            .status(),
        StatusCode::FORBIDDEN
    );
    // Bad values: the message sits next to its field.
    let bad = post("/console/request/preview", form("", "1"), Some(&csrf))
        .await
        .unwrap();
    assert_eq!(bad.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let bad = bad.text().await.unwrap();
    assert!(
        bad.contains("id=\"name-error\"") && bad.contains("aria-describedby=\"name-error\""),
        "{bad}"
    );
    let bad = post("/console/request/preview", form("nb", "soon"), Some(&csrf))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        bad.contains("id=\"duration_h-error\"") && bad.contains("not a number of hours"),
        "{bad}"
    );
    // The preview first, with its submit button; then the submission.
    let p = post("/console/request/preview", form("nb", "2"), Some(&csrf))
        .await
        .unwrap();
    assert_eq!(p.status(), StatusCode::OK);
    let p = p.text().await.unwrap();
    assert!(
        p.contains("Cost preview") && p.contains("<strong>borrow</strong>") && p.contains("id=\"submit-button\""),
        "{p}"
    );
    let s = post("/console/request", form("nb", "2"), Some(&csrf)).await.unwrap();
    assert_eq!(s.status(), StatusCode::NO_CONTENT);
    let to = s.headers()["hx-redirect"].to_str().unwrap().to_string();
    assert!(to.starts_with("/console/workloads/"), "{to}");
    let detail = b.page(&to).await;
    assert!(detail.contains("MIG 1g.10gb"), "{detail}");
    assert!(detail.contains("batch, never moved"), "{detail}");
    // Movable: offered on the form, checked by the API's rules (by kind and lease), shown on
    // the workload's page.
    assert!(page.contains("id=\"f-movable\"") && page.contains("<option value=\"replace\""));
    let with = |kind: &str, movable: &str, hours: &str| {
        let mut f = form("svc", hours);
        f.push(("kind", kind.to_string()));
        f.push(("movable", movable.to_string()));
        f
    };
    for (kind, movable, hours, says) in [
        ("batch", "replace", "1", "`replace` is for services"),
        ("service", "replace", "2", "without a lease"),
        ("service", "restart", "", "`restart` is for batch work"),
        ("batch", "sometimes", "1", "choose from the list"),
    ] {
        let bad = post("/console/request/preview", with(kind, movable, hours), Some(&csrf))
            .await
            .unwrap();
        assert_eq!(bad.status(), StatusCode::UNPROCESSABLE_ENTITY, "{kind} {movable}");
        let bad = bad.text().await.unwrap();
        assert!(
            bad.contains("id=\"movable-error\"") && bad.contains(says) && bad.contains("aria-invalid=\"true\""),
            "{kind} {movable}: {bad}"
        );
    }
    let p = post("/console/request/preview", with("service", "replace", ""), Some(&csrf))
        .await
        .unwrap();
    assert_eq!(p.status(), StatusCode::OK);
    assert!(p.text().await.unwrap().contains("id=\"submit-button\""));
    let s = post("/console/request", with("service", "replace", ""), Some(&csrf))
        .await
        .unwrap();
    assert_eq!(s.status(), StatusCode::NO_CONTENT);
    let to = s.headers()["hx-redirect"].to_str().unwrap().to_string();
    let id: u64 = to.trim_start_matches("/console/workloads/").parse().unwrap();
    let w = srv.get(&format!("/api/v1/workloads/{id}")).await;
    assert_eq!(
        (w["kind"].as_str(), w["movable"].as_str()),
        (Some("service"), Some("replace"))
    );
    let detail = b.page(&to).await;
    assert!(
        detail.contains("service, movable: may be replaced elsewhere"),
        "{detail}"
    );
    // A viewer sees the form without the button and cannot preview or submit.
    let v = srv.browser();
    let vcsrf = sign_in(&v, &viewer).await;
    let vpage = v.page("/console/request").await;
    assert!(!vpage.contains("id=\"preview-button\""));
    let vs = v.post_form("/console/request", &form("nb", "1"), Some(&vcsrf)).await;
    assert_eq!(vs.status(), StatusCode::FORBIDDEN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_page_shows_shares_budget_chart_and_csv_and_tokens_are_shown_once_then_revoked() {
    let s = TestServer::start("account").await;
    s.post("/api/v1/tenants", json!({"name": "vision"})).await;
    let (ta, member) = (
        s.token("vision", "tenant-admin").await,
        s.token("vision", "member").await,
    );
    let b = s.browser();
    let csrf = sign_in(&b, &ta).await;
    let q = b.page("/console/quota").await;
    no_inline_code(&q);
    assert!(q.contains("No quota is set") && q.contains("No monthly budget"), "{q}");
    s.put(
        "/api/v1/tenants/vision/quotas/serving",
        json!({"guaranteed": 2.0, "limit": 4.0}),
    )
    .await;
    s.put("/api/v1/tenants/vision/budget", json!({"monthly_unit_hours": 50.0}))
        .await;
    let q = b.page("/console/quota").await;
    assert!(
        q.contains("<td>serving</td>") && q.contains("<strong>50.0</strong> of 50.0"),
        "{q}"
    );
    assert!(
        q.contains("data-chart=\"") && q.contains("vendor/uPlot.iife.min.js"),
        "the chart and its library"
    );
    let csv_at = q.find("/api/v1/usage?").unwrap();
    let csv_url = q[csv_at..csv_at + q[csv_at..].find('"').unwrap()]
        .replace("&amp;", "&")
        .replace("&#38;", "&");
    let csv = b.get(&csv_url).await;
    assert_eq!(csv.status(), StatusCode::OK, "{csv_url}");
    assert!(csv.headers()["content-type"].to_str().unwrap().starts_with("text/csv"));

    // A token: its secret shown once, usable, then revoked.
    let form = |name: &str, role: &str, days: &str| {
        vec![
            ("name", name.to_string()),
            ("role", role.to_string()),
            ("expires_days", days.to_string()),
        ]
    };
    let bad = b
        .post_form("/console/tokens", &form("ci", "member", "soon"), Some(&csrf))
        .await;
    assert_eq!(bad.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(bad.text().await.unwrap().contains("id=\"expires_days-error\""));
    let made = b
        .post_form("/console/tokens", &form("ci", "member", "30"), Some(&csrf))
        .await
        .text()
        .await
        .unwrap();
    let at = made
        .find("id=\"new-secret\" class=\"secret\">")
        .expect("the secret, once")
        + "id=\"new-secret\" class=\"secret\">".len();
    let secret = made[at..at + 68].to_string();
    assert!(secret.starts_with("tsr_"), "{secret}");
    let use_it = async || s.call_as(Some(&secret), Method::GET, "/api/v1/workloads", None).await.0;
    assert_eq!(use_it().await, StatusCode::OK);
    let list = b.page("/console/tokens").await;
    assert!(!list.contains(&secret), "the secret is never shown again");
    let id_at = made.find("<h2 id=\"created-h\">Token ").unwrap() + "<h2 id=\"created-h\">Token ".len();
    let tid = made[id_at..id_at + made[id_at..].find(' ').unwrap()].to_string();
    let revoke = format!("/console/tokens/{tid}/revoke");
    assert_eq!(
        b.post(&revoke, None).await.status(),
        StatusCode::FORBIDDEN,
        "no CSRF token"
    );
    let after = b.post(&revoke, Some(&csrf)).await;
    assert_eq!(after.status(), StatusCode::OK);
    assert!(after.text().await.unwrap().contains("revoked"));
    assert_eq!(use_it().await, StatusCode::UNAUTHORIZED);

    // Members do not manage tokens.
    let m = s.browser();
    let mcsrf = sign_in(&m, &member).await;
    let page = m.page("/console/tokens").await;
    assert!(page.contains("managed by its tenant-admins"));
    let refused = m
        .post_form("/console/tokens", &form("x", "member", ""), Some(&mcsrf))
        .await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_map_shows_a_tenants_mig_slice_coloured_with_detail_on_demand_and_members_their_own() {
    let s = TestServer::start("fleetmap").await;
    s.tenant_with_project("vision", "train").await;
    let member = s.token("vision", "member").await;
    let (_, w) = s
        .post(
            "/api/v1/workloads",
            json!({"tenant": "vision", "project": "train", "name": "nb", "shape": {"mig": "3g.40gb"}}),
        )
        .await;
    let id = w["id"].as_u64().unwrap();
    let w = s.wait_state(id, &["placed", "running"]).await;
    let node = w["allocation"]["node"].as_str().unwrap().to_string();
    let b = s.browser();
    sign_in(&b, &s.admin).await;
    let map = b.page("/console/fleet?tenant=vision").await;
    no_inline_code(&map);
    assert!(
        map.contains("1 nodes match"),
        "the tenant filter keeps the one node: {map}"
    );
    let colour: String = map
        .split("<span class=\"sw t")
        .nth(1)
        .unwrap()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    assert!(
        map.contains(&format!("class=\"cell t{colour} part\"")) && map.contains(&format!("vision #{id}")),
        "the slice's GPU is coloured as vision in the legend: {map}"
    );
    let all = b.page("/console/fleet").await;
    assert!(
        all.contains("60 nodes match") && !all.contains("Next 100"),
        "seed: 60 nodes on one page"
    );
    let detail = b.page(&format!("/console/fleet/nodes/{node}")).await;
    assert!(
        detail.contains("3g.40gb at slice")
            && detail.contains(&format!("vision/train <a href=\"/console/workloads/{id}\">")),
        "{detail}"
    );
    // Cordon from the node's detail (CSRF token required), then find it in the audit log.
    let csrf = sign_in(&b, &s.admin).await;
    let cordon = format!("/console/fleet/nodes/{node}/cordon");
    assert_eq!(b.post(&cordon, None).await.status(), StatusCode::FORBIDDEN);
    let done = b.post(&cordon, Some(&csrf)).await.text().await.unwrap();
    assert!(done.contains("cordoned)") && done.contains("/uncordon\""), "{done}");
    let cordoned = b.page("/console/fleet?state=cordoned").await;
    assert!(cordoned.contains("1 nodes match") && cordoned.contains(&format!("id=\"node-{node}\"")));
    let audit = b.page("/console/audit?action=cordon").await;
    no_inline_code(&audit);
    assert!(
        audit.contains(&format!("<td class=\"what\">node {node}: cordon</td>")),
        "the row names the node: {audit}"
    );
    assert!(!audit.contains("auth.failure"), "filtered by action");
    let bad = b.get("/console/fleet?state=broken").await;
    assert_eq!(bad.status(), StatusCode::UNPROCESSABLE_ENTITY);
    // A member's map is where their own tenant's work runs: the slice's node, its cell in
    // vision's colour, its detail without node operations, which stay the platform admin's.
    let m = s.browser();
    let mcsrf = sign_in(&m, &member).await;
    let page = m.page("/console").await;
    assert!(
        page.contains("href=\"/console/fleet\""),
        "the member's navigation offers the map"
    );
    let mine = m.page("/console/fleet").await;
    no_inline_code(&mine);
    assert!(
        mine.contains("Where vision&#39;s work runs") || mine.contains("Where vision's work runs"),
        "{mine}"
    );
    assert!(
        mine.contains("1 nodes match")
            && mine.contains(&format!("id=\"node-{node}\""))
            && mine.contains(&format!("vision #{id}")),
        "the member's map holds the slice's node: {mine}"
    );
    let detail = m.page(&format!("/console/fleet/nodes/{node}")).await;
    assert!(
        detail.contains(&format!("vision/train <a href=\"/console/workloads/{id}\">"))
            && !detail.contains("/cordon\"")
            && !detail.contains("/uncordon\""),
        "the member's node detail: {detail}"
    );
    let op = m
        .post(&format!("/console/fleet/nodes/{node}/uncordon"), Some(&mcsrf))
        .await;
    assert_eq!(op.status(), StatusCode::FORBIDDEN, "a member cannot uncordon");
    let still = b.page("/console/fleet?state=cordoned").await;
    assert!(
        still.contains(&format!("id=\"node-{node}\"")),
        "the node is still cordoned"
    );
    let audit = m.get("/console/audit").await;
    assert_eq!(audit.status(), StatusCode::FORBIDDEN);
}

/// A fleet with blocks (spines) above its racks: the whole-fleet heat map and the node rows
/// are grouped by pool, block and rack, each rack heading naming its block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_map_groups_racks_by_their_block() {
    let group = |name: &str, count: u32, racks: &str, block: &str| {
        format!(
            "[[pool.nodes]]\nname = \"{name}\"\ncount = {count}\ngpu_model = \"H100-80GB-SXM\"\ngpus = 2\ncpus = 64\nmemory_gib = 512\nnvlink = \"nvswitch\"\n{racks}\nblock = \"{block}\"\n"
        )
    };
    let toml = format!(
        "[[pool]]\nname = \"training\"\nsharing = \"whole\"\n{}{}",
        group("h", 4, "nodes_per_rack = 2\nrack_prefix = \"r\"", "b0"),
        group("g", 2, "rack = \"r9\"", "b1"),
    );
    let fleet = tessera_model::Fleet::from_toml(&toml, "test").unwrap();
    let s = TestServer::start_with("fleetblocks", |c| ServerConfig { fleet, ..c }).await;
    let b = s.browser();
    sign_in(&b, &s.admin).await;
    let map = b.page("/console/fleet").await;
    for (block, rack) in [("b0", "r0"), ("b0", "r1"), ("b1", "r9")] {
        assert!(
            map.contains(&format!("training · block {block} · rack {rack}: 4 of 4 GPUs free")),
            "the heat map's group of rack {rack} in block {block}: {map}"
        );
        assert!(
            map.contains(&format!("Rack {rack}</a> (training, block {block}):")),
            "the rack heading of {rack} names block {block}: {map}"
        );
    }
    let b0 = map.find("block b0 · rack r1").unwrap();
    let b1 = map.find("block b1 · rack r9").unwrap();
    assert!(b0 < b1, "block b0's racks before block b1's");
}

/// Changes made through the REST API name their object on the audit page as the console's own
/// forms do: the tenant, the project, the token (id and name, never its secret) and the
/// workload a request made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_rows_of_api_changes_name_the_tenant_project_token_and_workload() {
    let s = TestServer::start("auditapi").await;
    s.tenant_with_project("stark", "main").await;
    let (_, t) = s
        .post(
            "/api/v1/tokens",
            json!({"tenant": "stark", "role": "member", "name": "ci-bot"}),
        )
        .await;
    let tok = t["id"].as_str().unwrap().to_string();
    let secret = t["token"].as_str().unwrap().to_string();
    let (_, w) = s
        .post(
            "/api/v1/workloads",
            json!({"tenant": "stark", "project": "main", "name": "w", "shape": {"fraction": 100}}),
        )
        .await;
    let id = w["id"].as_u64().unwrap();
    let b = s.browser();
    sign_in(&b, &s.admin).await;
    let audit = b.page("/console/audit").await;
    for what in [
        "created tenant stark".to_string(),
        "created project stark/main".to_string(),
        format!("created token {tok} (ci-bot), member of tenant stark"),
        format!("requested workload {id}"),
    ] {
        assert!(
            audit.contains(&format!("<td class=\"what\">{what}</td>")),
            "the audit page names {what}: {audit}"
        );
    }
    assert!(!audit.contains(&secret), "never the token's secret");
}

/// The seconds of the day of the first `YYYY-MM-DD HH:MM:SS UTC` after `after` in `page`.
fn time_after(page: &str, after: &str) -> u32 {
    let at = page.find(after).unwrap_or_else(|| panic!("{after} in {page}")) + after.len();
    let t = &page[at + 11..at + 19];
    let p: Vec<u32> = t.split(':').map(|x| x.parse().unwrap()).collect();
    p[0] * 3600 + p[1] * 60 + p[2]
}

/// A workload waiting for capacity is told when it may expect some (its next step's "wait
/// until"): when the running work in its pool is first due to end by its lease — the running
/// workload's own "ends at about" —; a member of another tenant learns nothing of that work
/// but the time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_waiting_for_capacity_is_told_when_running_work_is_due_to_end() {
    let fleet = tessera_model::Fleet::from_toml(
        "[[pool]]\nname = \"training\"\nsharing = \"whole\"\n[[pool.nodes]]\nname = \"h\"\ncount = 1\ngpu_model = \"H100-80GB-SXM\"\ngpus = 2\ncpus = 64\nmemory_gib = 512\nnvlink = \"nvswitch\"\n",
        "test",
    )
    .unwrap();
    let s = TestServer::start_with("waituntil", |c| ServerConfig { fleet, ..c }).await;
    vision_and_nlp(&s).await;
    let gpus = |t: &str, p: &str, n: u32, name: &str| json!({"tenant": t, "project": p, "name": name, "shape": {"gpus": n, "pool": "training"}, "duration_s": 7200});
    let busy = submit(&s, gpus("vision", "train", 2, "busy")).await;
    s.wait_state(busy, &["running"]).await;
    let waiting = submit(&s, gpus("nlp", "p", 1, "later")).await;
    let b = s.browser();
    sign_in(&b, &s.admin).await;
    let running = page_until(&b, &format!("/console/workloads/{busy}"), |p| {
        p.contains("ends at about")
    })
    .await;
    let ends = time_after(&running, "ends at about ");
    let m = s.browser();
    sign_in(&m, &s.token("nlp", "member").await).await;
    let page = page_until(&m, &format!("/console/workloads/{waiting}"), |p| {
        p.contains("due to end from about")
    })
    .await;
    let at = page.find("id=\"waits-next\"").unwrap_or_else(|| panic!("{page}"));
    let next = &page[at..at + page[at..].find("</p>").unwrap()];
    assert!(
        next.contains("Running work in pool training is due to end from about "),
        "{next}"
    );
    let told = time_after(next, "due to end from about ");
    assert!(
        told.abs_diff(ends) <= 2,
        "told {told} s, the running workload ends at {ends} s: {next}"
    );
    assert!(
        !page.contains("busy") && !page.contains("vision"),
        "nothing of vision's work: {page}"
    );
}

/// Ten tenants with work on the fleet map: ten distinct colours and key letters in the legend and
/// their cells; `?highlight=` dims every other tenant's cells and keeps the colours; a member can
/// use neither the map nor the parameter to learn another tenant's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_map_gives_ten_tenants_ten_colours_and_highlights_one_to_admins_only() {
    let s = TestServer::start("fleetcolours").await;
    let names = [
        "ads", "chat", "maps", "nlp", "robotics", "search", "speech", "stark", "vision", "wayne",
    ];
    let mut ids = Vec::new();
    for t in names {
        s.tenant_with_project(t, "p").await;
        let (_, w) = s
            .post(
                "/api/v1/workloads",
                json!({"tenant": t, "project": "p", "name": "x", "shape": {"gpus": 1, "pool": "training"}}),
            )
            .await;
        ids.push(w["id"].as_u64().unwrap());
    }
    let mut nodes = Vec::new();
    for id in &ids {
        let w = s.wait_state(*id, &["placed", "running"]).await;
        nodes.push(w["allocation"]["node"].as_str().unwrap().to_string());
    }
    let b = s.browser();
    sign_in(&b, &s.admin).await;
    // Search by workload and by node; sort by free capacity (most free first, no rack headings).
    let by_w = b.page(&format!("/console/fleet?workload=%23{}", ids[3])).await;
    assert!(
        by_w.contains("1 nodes match") && by_w.contains(&format!("id=\"node-{}\"", nodes[3])),
        "{by_w}"
    );
    let by_n = b.page(&format!("/console/fleet?node={}", nodes[0])).await;
    assert!(by_n.contains(&format!("id=\"node-{}\"", nodes[0])), "{by_n}");
    let sorted = b.page("/console/fleet?sort=free&pool=training").await;
    assert!(
        !sorted.contains("class=\"rack-h\""),
        "sorted by free capacity, no rack headings"
    );
    let pos = |n: &str| sorted.find(&format!("id=\"node-{n}\"")).unwrap();
    let busy = nodes.iter().map(|n| pos(n)).min().unwrap();
    let first = sorted.find("id=\"node-").unwrap();
    assert!(first < busy, "a wholly free node comes before the nodes with work");
    assert_eq!(
        b.get("/console/fleet?sort=name").await.status(),
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(
        b.get("/console/fleet?workload=abc").await.status(),
        StatusCode::UNPROCESSABLE_ENTITY
    );
    let map = b.page("/console/fleet").await;
    no_inline_code(&map);
    let legend = map
        .split("class=\"legend\"")
        .nth(1)
        .unwrap()
        .split("</ul>")
        .next()
        .unwrap();
    let swatch = |t: &str| -> (String, String) {
        let li = legend
            .split("<li")
            .find(|li| li.contains(&format!(">{t}</a>")))
            .unwrap_or_else(|| panic!("{t} in the legend: {legend}"));
        let c: String = li
            .split("class=\"sw t")
            .nth(1)
            .unwrap()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        let k = li
            .split("aria-hidden=\"true\">")
            .nth(1)
            .unwrap()
            .split('<')
            .next()
            .unwrap();
        (c, k.to_string())
    };
    let swatches: Vec<(String, String)> = names.iter().map(|t| swatch(t)).collect();
    let colours: std::collections::HashSet<&String> = swatches.iter().map(|(c, _)| c).collect();
    let keys: std::collections::HashSet<&String> = swatches.iter().map(|(_, k)| k).collect();
    assert_eq!(colours.len(), 10, "ten distinct colours: {swatches:?}");
    assert_eq!(keys.len(), 10, "ten distinct keys: {swatches:?}");
    assert!(
        !colours.contains(&"16".to_string()),
        "no tenant has free capacity's colour"
    );
    for (t, (c, k)) in names.iter().zip(&swatches) {
        assert!(
            map.contains(&format!("class=\"cell t{c} full\"")) && map.contains(&format!(">{k}</span>")),
            "{t}'s GPU has its colour t{c} and key {k}"
        );
    }
    // The colours stay on another page, filter or highlight.
    let one = b.page("/console/fleet?tenant=vision").await;
    assert!(one.contains(&format!("class=\"cell t{} full\"", swatches[8].0)));
    // Highlight vision: the others' cells are dimmed (without their letter), vision's are not.
    let hl = b.page("/console/fleet?highlight=vision").await;
    no_inline_code(&hl);
    assert!(hl.contains("Highlighting vision"), "{hl}");
    assert!(
        hl.contains(&format!("class=\"cell t{} full\"", swatches[8].0)),
        "vision's cell is not dimmed"
    );
    assert_eq!(
        hl.matches(" dim\"").count(),
        9,
        "the nine other tenants' cells are dimmed"
    );
    assert!(
        hl.contains("aria-current=\"true\""),
        "the legend marks the highlighted tenant"
    );
    assert!(
        hl.contains("name=\"highlight\" value=\"vision\""),
        "the filter form keeps the highlight"
    );
    for (t, (c, _)) in names.iter().zip(&swatches) {
        assert!(
            hl.contains(&format!("class=\"sw t{c}\"")),
            "{t} keeps its colour while highlighting"
        );
    }
    // The whole-fleet heat map: a character per GPU of the fleet, by pool and rack; the
    // highlighted tenant's one GPU marked `h`.
    let heat: String = map
        .split("data-heat=\"")
        .skip(1)
        .map(|h| h.split('"').next().unwrap().replace(',', ""))
        .collect();
    assert_eq!(heat.matches('2').count(), 10, "ten full GPUs on the heat map: {heat}");
    assert!(!heat.contains('h'));
    let hl_heat: String = hl
        .split("data-heat=\"")
        .skip(1)
        .map(|h| h.split('"').next().unwrap().replace(',', ""))
        .collect();
    assert_eq!(
        (hl_heat.matches('h').count(), hl_heat.matches('2').count()),
        (1, 9),
        "{hl_heat}"
    );
    assert_eq!(hl_heat.len(), heat.len(), "every GPU of the fleet");
    assert!(
        map.contains("data-nodes=\"") && map.contains("· rack r"),
        "grouped by rack"
    );
    // An unknown tenant highlights nothing and is not echoed.
    let none = b.page("/console/fleet?highlight=nobody").await;
    assert!(!none.contains(" dim\"") && !none.contains("nobody"), "{none}");
    // A member's map shows their own tenant's work only: neither the tenant filter, the
    // highlight, a workload search nor a node's detail names another tenant or its workloads.
    let member = s.token("vision", "member").await;
    let m = s.browser();
    sign_in(&m, &member).await;
    let nlp = ids[names.iter().position(|n| *n == "nlp").unwrap()];
    let vision = ids[names.iter().position(|n| *n == "vision").unwrap()];
    let own = m.page(&format!("/console/fleet?workload={vision}")).await;
    assert!(
        own.contains("1 nodes match") && own.contains(&format!("vision #{vision}")),
        "{own}"
    );
    for path in [
        "/console/fleet".to_string(),
        "/console/fleet?highlight=vision".to_string(),
        "/console/fleet?highlight=nlp".to_string(),
        "/console/fleet?tenant=nlp&highlight=nlp".to_string(),
        format!("/console/fleet?workload={nlp}"),
        format!(
            "/console/fleet/nodes/{}",
            nodes[names.iter().position(|n| *n == "nlp").unwrap()]
        ),
    ] {
        let r = m.get(&path).await;
        assert_eq!(r.status(), StatusCode::OK, "{path}");
        let body = r.text().await.unwrap();
        if path.contains("workload=") {
            assert!(
                body.contains(">0 nodes match") && !body.contains(&format!("#{nlp}")),
                "{path}: {body}"
            );
        }
        for other in names.iter().filter(|t| **t != "vision") {
            assert!(
                !body.contains(&format!(">{other}<")) && !body.contains(&format!("{other} #")),
                "{path} names {other}: {body}"
            );
        }
    }
    let page = m.page("/console").await;
    for other in ["robotics", "wayne"] {
        assert!(!page.contains(other), "the member's console names {other}");
    }
}

/// A remainder gang through the request form (issue 29 item 6): the gang's fields offer "Last
/// node takes the rest" with its example on this pool's nodes; the dry run of 12 GPUs answers
/// on two node-shares; a remainder with Nodes or a Segment, or where it fits one node or leaves
/// no remainder, is refused next to the checkbox in the form's words (never `shape.remainder`
/// or `` `remainder` ``); the submitted gang runs as 8 + 4 and the API says `remainder`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remainder_gang_through_the_form() {
    let s = TestServer::start("console-remainder").await;
    s.tenant_with_project("vision", "train").await;
    let b = s.browser();
    let csrf = sign_in(&b, &s.token("vision", "member").await).await;
    let fields = b
        .page("/console/request/fields?pool=training&model=H100-80GB-SXM&shape=gang")
        .await;
    assert!(
        fields.contains("id=\"f-remainder\" name=\"remainder\" value=\"on\" type=\"checkbox\"")
            && fields.contains("Last node takes the rest")
            && fields.contains("the last node takes the rest, e.g. 12 = 8 + 4"),
        "{fields}"
    );
    let ticked = b
        .page("/console/request/fields?pool=training&model=H100-80GB-SXM&shape=gang&remainder=on")
        .await;
    assert!(ticked.contains("type=\"checkbox\" checked"), "{ticked}");
    let form = |extra: &[(&'static str, &str)]| {
        let mut f: Vec<(&'static str, String)> = vec![
            ("project", "vision/train".to_string()),
            ("name", "rest".to_string()),
            ("pool", "training".into()),
            ("model", "H100-80GB-SXM".into()),
            ("shape", "gang".into()),
            ("duration_h", "1".into()),
            ("priority", "standard".into()),
        ];
        f.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
        f
    };
    let post = |path: &'static str, f: Vec<(&'static str, String)>| {
        let rb = b.client.post(b.url(path)).form(&f).header("hx-request", "true");
        crate::support::with_csrf(rb, Some(&csrf)).send()
    };
    let twelve = [("gang_gpus", "12"), ("remainder", "on")];
    let ok = post("/console/request/preview", form(&twelve)).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    let ok = ok.text().await.unwrap();
    assert!(
        ok.contains("<strong>borrow</strong>")
            && ok.contains("2 node-shares in r")
            && ok.contains("<dt>GPU units</dt><dd>12</dd>")
            && ok.contains("id=\"submit-button\""),
        "{ok}"
    );
    // Without the box, 12 is no multiple of the 8-GPU nodes: refused next to GPUs in all.
    let plain = post("/console/request/preview", form(&[("gang_gpus", "12")]))
        .await
        .unwrap();
    assert_eq!(plain.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let plain = plain.text().await.unwrap();
    assert!(
        plain.contains("id=\"gang_gpus-error\"")
            && plain.contains("12 GPUs are no multiple of this pool&#39;s 8-GPU nodes")
            && plain.contains("(12 = 8 + 4)"),
        "{plain}"
    );
    for (extra, words) in [
        (
            vec![
                ("gang_gpus", "12"),
                ("remainder", "on"),
                ("gang_nodes", "2"),
                ("segment", "4"),
            ],
            "leave Nodes and Segment size blank",
        ),
        (
            vec![("gang_gpus", "4"), ("remainder", "on")],
            "4 GPUs fit on one node of 8 GPUs (pool training)",
        ),
        (
            vec![("gang_gpus", "16"), ("remainder", "on")],
            "16 GPUs as whole nodes of 8 GPUs (pool training) leave no remainder",
        ),
    ] {
        let r = post("/console/request/preview", form(&extra)).await.unwrap();
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{extra:?}");
        let page = r.text().await.unwrap();
        assert!(
            page.contains("id=\"remainder-error\"") && page.contains(words),
            "{extra:?}: {page}"
        );
        assert!(
            page.contains("aria-describedby=\"remainder-note remainder-error\"")
                && page.contains("type=\"checkbox\" checked"),
            "{extra:?}: {page}"
        );
        assert!(
            !page.contains("shape.remainder") && !page.contains("`remainder`") && !page.contains("`gpus`"),
            "{extra:?}: {page}"
        );
    }
    let r = post("/console/request", form(&twelve)).await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let to = r.headers()["hx-redirect"].to_str().unwrap().to_string();
    let id: u64 = to.rsplit('/').next().unwrap().parse().unwrap();
    let w = s.wait_state(id, &["running"]).await;
    assert_eq!(
        (&w["units"], &w["shape"]["remainder"]),
        (&json!("12"), &json!(true)),
        "{w}"
    );
    let a = &w["allocation"];
    let shares = a["shares"].as_array().unwrap();
    assert_eq!(
        (
            a["gpus"].as_array().map(Vec::len),
            shares.len(),
            shares[0]["gpus"].as_array().map(Vec::len)
        ),
        (Some(8), 1, Some(4)),
        "one whole node and the remainder: {w}"
    );
}

/// A multi-node gang through the console on the seed fleet (racks of 4 nodes of 8 GPUs): the
/// form's gang fields with the pool's levels, the dry run's answers (never within one rack; the
/// form's words for several bad fields at once; where its node-shares would go), the
/// submission, the gang's node-shares by rack on its page, and the admin's fleet map by rack
/// with the gang's cells — and its tenant and id on the API's GPU view of each share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_through_the_form_with_its_racks_on_its_page_and_the_fleet_map() {
    let s = TestServer::start("console-gang").await;
    s.tenant_with_project("vision", "train").await;
    let member = s.token("vision", "member").await;
    let b = s.browser();
    let csrf = sign_in(&b, &member).await;
    let fields = b
        .page("/console/request/fields?pool=training&model=H100-80GB-SXM&shape=gang")
        .await;
    assert!(
        fields.contains("name=\"gang_gpus\" value=\"16\"") && fields.contains("<option value=\"rack\">rack</option>"),
        "{fields}"
    );
    let serving = b.page("/console/request/fields?pool=serving&shape=gang").await;
    assert!(
        !serving.contains("value=\"gang\"") && !serving.contains("f-gang-gpus"),
        "{serving}"
    );
    let form = |gpus: &str, segment: &str, hours: &str| {
        vec![
            ("project", "vision/train".to_string()),
            ("name", "allreduce".to_string()),
            ("pool", "training".into()),
            ("model", "H100-80GB-SXM".into()),
            ("shape", "gang".into()),
            ("gang_gpus", gpus.to_string()),
            ("segment", segment.to_string()),
            ("topology", "rack".into()),
            ("topology_mode", "required".into()),
            ("duration_h", hours.to_string()),
            ("priority", "standard".into()),
        ]
    };
    let post = |path: &'static str, f: Vec<(&'static str, String)>| {
        let rb = b.client.post(b.url(path)).form(&f).header("hx-request", "true");
        crate::support::with_csrf(rb, Some(&csrf)).send()
    };
    let never = post("/console/request/preview", form("40", "", "1")).await.unwrap();
    assert_eq!(never.status(), StatusCode::OK);
    let never = never.text().await.unwrap();
    assert!(
        never.contains("<strong>refused</strong>: constraint: 40 GPUs in one rack; the largest rack of pool training")
            && never.contains("could hold at most 32 of it")
            && !never.contains("id=\"submit-button\""),
        "{never}"
    );
    let bad = post("/console/request/preview", form("lots", "0", "soon"))
        .await
        .unwrap();
    assert_eq!(bad.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let bad = bad.text().await.unwrap();
    for (id, words) in [
        ("gang_gpus-error", "`lots`: GPUs in all must be a whole number"),
        ("segment-error", "0: Segment must be between 1 and"),
        ("duration_h-error", "`soon` is not a number of hours"),
    ] {
        assert!(
            bad.contains(&format!("id=\"{id}\"")) && bad.contains(words),
            "{id}: {bad}"
        );
    }
    assert!(!bad.contains("shape.") && !bad.contains("gpus_per_node"), "{bad}");
    let ok = post("/console/request/preview", form("16", "", "1"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        ok.contains("<strong>borrow</strong>")
            && ok.contains("2 node-shares in r")
            && ok.contains("id=\"submit-button\""),
        "{ok}"
    );
    let r = post("/console/request", form("16", "", "1")).await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let to = r.headers()["hx-redirect"].to_str().unwrap().to_string();
    let id: u64 = to.rsplit('/').next().unwrap().parse().unwrap();
    let w = s.wait_state(id, &["running"]).await;
    let nodes: Vec<String> = std::iter::once(&w["allocation"])
        .chain(w["allocation"]["shares"].as_array().unwrap())
        .map(|x| x["node"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(nodes.len(), 2, "{w}");
    let page = b.page(&to).await;
    no_inline_code(&page);
    assert!(
        page.contains("16 GPU gang, within one rack (required)")
            && page.contains("id=\"gang-shares\"")
            && page.contains("2 node-shares in rack r")
            && nodes.iter().all(|n| page.contains(&format!("<td>{n}</td>"))),
        "{page}"
    );
    // With the gang running, one of the whole pool (no level asked: the API's default) waits,
    // saying why in the engine's words.
    let mut all = form("128", "", "1");
    all.retain(|(k, _)| !k.starts_with("topology"));
    // The preview answers on the last published snapshot, which may lag the gang's placement
    // by a publication: asked again until it has it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let waits = loop {
        let page = post("/console/request/preview", all.clone())
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if !page.contains("outcome-borrow") || std::time::Instant::now() > deadline {
            break page;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        waits.contains(
            "<strong>wait</strong>: no-capacity: 128 GPUs in one gang; pool training has room for 112 of it now"
        ),
        "{waits}"
    );
    // The admin's map: a heading per rack, the gang's cells on both nodes, named.
    let a = s.browser();
    sign_in(&a, &s.admin).await;
    let map = a.page("/console/fleet?pool=training").await;
    no_inline_code(&map);
    assert_eq!(map.matches("class=\"rack-h\"").count(), 4, "{map}");
    assert!(map.contains("of 32 GPUs free"), "{map}");
    assert_eq!(map.matches(&format!("gang\" data-gang=\"{id}\"")).count(), 16, "{map}");
    assert_eq!(map.matches(&format!("gang #{id} · 2 nodes")).count(), 2, "{map}");
    assert!(
        map.contains(&format!("vision #{id}; gang #{id} across 2 nodes")),
        "{map}"
    );
    // Each node-share is the gang's on the API's GPU view (its id and tenant, not the share's).
    for n in &nodes {
        let gpus = s.get(&format!("/api/v1/gpus?node={n}")).await;
        let slices: Vec<&Value> = gpus["items"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["slices"].as_array().unwrap())
            .collect();
        assert_eq!(slices.len(), 8, "{gpus}");
        assert!(
            slices.iter().all(|x| x["workload"] == id && x["tenant"] == "vision"),
            "{gpus}"
        );
    }
}

/// The priority options of a request form page.
fn priority_options(page: &str) -> Vec<String> {
    let at = page.find("id=\"f-priority\"").expect("the priority select");
    let select = &page[at..at + page[at..].find("</select>").unwrap()];
    select
        .match_indices("<option value=\"")
        .map(|(i, m)| {
            let rest = &select[i + m.len()..];
            rest[..rest.find('"').unwrap()].to_string()
        })
        .collect()
}

/// The request form offers a member only the priority classes its tenant was granted; a
/// class sent anyway is refused next to the field (and nothing is created); once the admin
/// grants `high`, the form offers it and it is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_form_offers_only_the_granted_priority_classes() {
    let srv = TestServer::start("reqprio").await;
    srv.tenant_with_project("vision", "train").await;
    let member = srv.token("vision", "member").await;
    let b = srv.browser();
    let csrf = sign_in(&b, &member).await;
    let page = b.page("/console/request").await;
    assert_eq!(priority_options(&page), ["standard", "opportunistic"]);
    let form = |priority: &str| {
        vec![
            ("project", "vision/train".to_string()),
            ("name", "p".to_string()),
            ("pool", "serving".into()),
            ("model", "A100-80GB".into()),
            ("shape", "mig:1g.10gb".into()),
            ("duration_h", "1".to_string()),
            ("priority", priority.to_string()),
        ]
    };
    let post = |path: &'static str, f: Vec<(&'static str, String)>| {
        let rb = b.client.post(b.url(path)).form(&f).header("hx-request", "true");
        crate::support::with_csrf(rb, Some(&csrf)).send()
    };
    for path in ["/console/request/preview", "/console/request"] {
        let r = post(path, form("critical")).await.unwrap();
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{path}");
        let html = r.text().await.unwrap();
        assert!(
            html.contains("id=\"priority-error\"")
                && html.contains("may use the priority classes standard, opportunistic"),
            "{path}: {html}"
        );
        assert!(!priority_options(&html).contains(&"critical".to_string()));
    }
    let listed = srv.get("/api/v1/workloads").await;
    assert_eq!(listed["items"], serde_json::json!([]), "nothing was created");

    let (st, _) = srv
        .put(
            "/api/v1/tenants/vision/priorities",
            serde_json::json!({"priorities": ["standard", "high"]}),
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    let page = b.page("/console/request").await;
    assert_eq!(priority_options(&page), ["standard", "high"]);
    let r = post("/console/request", form("high")).await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
}

/// The grant actions of the audit log: `(action, outcome, detail)` of each record whose action
/// names the priorities of a tenant (the API's route or the console's).
async fn grant_records(s: &TestServer) -> Vec<(String, u64, String)> {
    let audit = s.get("/api/v1/audit?limit=500").await;
    audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["action"].as_str().unwrap_or("").ends_with("/priorities"))
        .map(|a| {
            (
                a["action"].as_str().unwrap().to_string(),
                a["outcome"].as_u64().unwrap(),
                a["detail"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// A platform admin grants priority classes from the tenants page: the form checks the
/// current grant; a grant goes through the API's handler (the API's tenant view shows it, one
/// audit record, the API's); the tenant's member may then submit `critical` while another
/// tenant's member may not; an unknown class or an empty grant is refused next to the form;
/// a tenant-admin or member of the tenant gets no form and is refused (403) when posting it,
/// the grant unchanged; "reset to default" restores the default grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn platform_admin_grants_priority_classes_from_the_tenants_page() {
    let s = TestServer::start("consoleprio").await;
    s.tenant_with_project("vision", "train").await;
    s.tenant_with_project("nlp", "serve").await;
    let (member, tadmin, other) = (
        s.token("vision", "member").await,
        s.token("vision", "tenant-admin").await,
        s.token("nlp", "member").await,
    );
    let view = async || s.get("/api/v1/tenants/vision").await["priorities"].clone();
    let b = s.browser();
    let csrf = sign_in(&b, &s.admin).await;
    let page = b.page("/console/tenants").await;
    no_inline_code(&page);
    assert!(
        page.contains("id=\"vision-priorities-granted\">default: standard, opportunistic</p>"),
        "{page}"
    );
    assert!(
        page.contains("hx-post=\"/console/tenants/vision/priorities\"")
            && page.contains("name=\"priorities\" value=\"critical\">")
            && page.contains("name=\"priorities\" value=\"standard\" checked>")
            && page.contains("name=\"reset\" value=\"default\""),
        "{page}"
    );

    let grant = "/console/tenants/vision/priorities";
    let classes = |cs: &[&'static str]| cs.iter().map(|c| ("priorities", *c)).collect::<Vec<_>>();
    assert_eq!(
        b.post_form(grant, &classes(&["critical"]), None).await.status(),
        StatusCode::FORBIDDEN,
        "no CSRF token"
    );
    // Refusals land on the form, with what was checked; nothing changes.
    let bad = b.post_form(grant, &classes(&["standard", "urgent"]), Some(&csrf)).await;
    assert_eq!(bad.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let bad = bad.text().await.unwrap();
    assert!(
        bad.contains("id=\"vision-priorities-priorities-error\"")
            && bad.contains("unknown priority class")
            && bad.contains("urgent"),
        "{bad}"
    );
    assert!(bad.contains("value=\"standard\" checked>") && !bad.contains("value=\"opportunistic\" checked>"));
    let empty = b.post_form(grant, &classes(&[]), Some(&csrf)).await;
    assert_eq!(empty.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        empty
            .text()
            .await
            .unwrap()
            .contains("id=\"vision-priorities-priorities-error\"")
    );
    assert_eq!(view().await, json!(["standard", "opportunistic"]));
    let missing = b
        .post_form("/console/tenants/nobody/priorities", &classes(&["high"]), Some(&csrf))
        .await;
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);

    // The grant: the card shows it, the API's view has it, one audit record (the API's).
    let ok = b
        .post_form(grant, &classes(&["standard", "critical"]), Some(&csrf))
        .await;
    assert_eq!(ok.status(), StatusCode::OK);
    let card = ok.text().await.unwrap();
    assert!(
        card.contains("granted: standard, critical") && card.contains("value=\"critical\" checked>"),
        "{card}"
    );
    assert_eq!(view().await, json!(["standard", "critical"]));
    let granted: Vec<_> = grant_records(&s)
        .await
        .into_iter()
        .filter(|(_, outcome, _)| *outcome == 200)
        .collect();
    assert_eq!(
        granted,
        [(
            "PUT /api/v1/tenants/{tenant}/priorities".to_string(),
            200,
            "priority classes standard, opportunistic → standard, critical".to_string()
        )],
        "one record, the API's"
    );

    // vision's member may now submit `critical`; nlp's may not.
    let job = |tenant: &str, project: &str| json!({"tenant": tenant, "project": project, "name": "c", "shape": {"fraction": 100}, "priority": "critical"});
    let (st, w) = s
        .call_as(
            Some(&member),
            Method::POST,
            "/api/v1/workloads",
            Some(job("vision", "train")),
        )
        .await;
    assert_eq!(
        (st, w["priority"].as_str()),
        (StatusCode::CREATED, Some("critical")),
        "{w}"
    );
    let (st, p) = s
        .call_as(
            Some(&other),
            Method::POST,
            "/api/v1/workloads",
            Some(job("nlp", "serve")),
        )
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{p}");
    assert_eq!(p["type"], "https://tessera.dev/problems/priority-not-granted", "{p}");

    // The tenant's admin sees its grant but no form; it and the member are refused.
    let ta = s.browser();
    let tacsrf = sign_in(&ta, &tadmin).await;
    let tpage = ta.page("/console/tenants").await;
    assert!(
        tpage.contains("granted: standard, critical") && !tpage.contains("/priorities\""),
        "{tpage}"
    );
    let m = s.browser();
    let mcsrf = sign_in(&m, &member).await;
    let denials = async || {
        grant_records(&s)
            .await
            .iter()
            .filter(|(action, outcome, _)| action.starts_with("denied POST /console/tenants/") && *outcome == 403)
            .count()
    };
    let before = denials().await;
    for (who, token) in [(&ta, &tacsrf), (&m, &mcsrf)] {
        let r = who.post_form(grant, &classes(&["standard", "high"]), Some(token)).await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        let r = who.post_form(grant, &[("reset", "default")], Some(token)).await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
    }
    assert_eq!(view().await, json!(["standard", "critical"]), "unchanged");
    assert_eq!(denials().await - before, 4, "each refusal is on the audit log");

    // Reset to the default grant.
    let reset = b.post_form(grant, &[("reset", "default")], Some(&csrf)).await;
    assert_eq!(reset.status(), StatusCode::OK);
    assert!(reset.text().await.unwrap().contains("default: standard, opportunistic"));
    assert_eq!(view().await, json!(["standard", "opportunistic"]));
    let (st, p) = s
        .call_as(
            Some(&member),
            Method::POST,
            "/api/v1/workloads",
            Some(job("vision", "train")),
        )
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN, "the default grant again: {p}");
    assert!(
        grant_records(&s)
            .await
            .iter()
            .any(|(_, outcome, d)| *outcome == 200
                && d == "priority classes standard, critical → standard, opportunistic"),
        "the reset is audited"
    );
}

/// The queue counts in words ("1 workload waits"), shows a reason's text once beside its code
/// (not `no-capacity no-capacity: …`), and the request form's name box takes as many characters
/// as the API does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_says_one_workload_and_each_reason_once_and_the_name_box_holds_what_the_api_takes() {
    let s = TestServer::start("queuewords").await;
    s.tenant_with_project("vision", "train").await;
    let (st, w) = s
        .post(
            "/api/v1/workloads",
            json!({"tenant": "vision", "project": "train", "name": "one", "shape": {"gpus": 8, "pool": "training"}}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{w}");
    s.wait_state(w["id"].as_u64().unwrap(), &["running"]).await;
    // A gang of the whole pool waits for that node.
    let (st, g) = s
        .post(
            "/api/v1/workloads",
            json!({"tenant": "vision", "project": "train", "name": "all", "shape": {"gpus": 128, "pool": "training"}}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{g}");
    let id = g["id"].as_u64().unwrap();
    let b = s.browser();
    sign_in(&b, &s.admin).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let page = loop {
        let page = b.page("/console/queue").await;
        if page.contains(&format!("id=\"q-{id}\"")) && page.contains("no-capacity</code>")
            || std::time::Instant::now() > deadline
        {
            break page;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert!(page.contains("1 workload waits;"), "{page}");
    assert!(
        page.contains("<code class=\"reason\">no-capacity</code> <span class=\"why\">128 GPUs in one gang"),
        "{page}"
    );
    assert!(!page.contains("no-capacity: 128"), "the code once: {page}");
    let form = b.page("/console/request").await;
    assert!(form.contains("maxlength=\"63\""), "{form}");
    assert!(!form.contains("maxlength=\"200\""), "{form}");
}

/// The text of `id="…">…<` in `html` (an element's first text).
fn text_of(html: &str, id: &str) -> String {
    let at = html
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("#{id} in {html}"));
    let rest = &html[at..];
    let start = rest.find('>').unwrap() + 1;
    rest[start..start + rest[start..].find('<').unwrap()].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn money_says_no_price_list_budgets_to_the_hundredth_flags_over_budget_and_costs_each_workload() {
    let s = TestServer::start("money").await;
    vision_and_nlp(&s).await;
    s.put("/api/v1/tenants/vision/budget", json!({"monthly_unit_hours": 0.04}))
        .await;
    // nlp spends its 0.001 unit-hours within a second of running 8 GPUs.
    s.put("/api/v1/tenants/nlp/budget", json!({"monthly_unit_hours": 0.001}))
        .await;
    let id = submit(
        &s,
        json!({"tenant": "nlp", "project": "p", "name": "big", "shape": {"gpus": 8, "pool": "training"}, "duration_s": 7200}),
    )
    .await;
    s.wait_state(id, &["running"]).await;

    // The platform-admin's tenants page: the 0.04 budget as the CLI prints it, nlp flagged in
    // words (not by colour alone), vision not.
    let admin = s.browser();
    sign_in(&admin, &s.admin).await;
    let page = poll(
        40,
        Duration::from_millis(250),
        async || admin.page("/console/tenants").await,
        |p| p.contains("id=\"nlp-over-budget\""),
    )
    .await;
    no_inline_code(&page);
    assert!(page.contains("0.04 GPU-unit-hours a month"), "{page}");
    assert!(!page.contains("0.0 GPU-unit-hours a month"), "{page}");
    assert!(
        text_of(&page, "nlp-over-budget").contains("Over budget") && !page.contains("id=\"vision-over-budget\""),
        "{page}"
    );

    // nlp's tenant-admin sees its own flag and no other tenant's name or money.
    let nlp_admin = s.token("nlp", "tenant-admin").await;
    let b = s.browser();
    sign_in(&b, &nlp_admin).await;
    for path in ["/console/tenants", "/console/quota"] {
        let p = b.page(path).await;
        assert!(p.contains("Over budget"), "{path}: {p}");
        assert!(!p.contains("vision") && !p.contains("0.04"), "{path}: {p}");
    }
    // With no price list, money reads so — never 0.00.
    let q = b.page("/console/quota").await;
    assert_eq!(text_of(&q, "usage-cost"), "no price list configured", "{q}");
    assert!(!q.contains("0.00 EUR") && !q.contains(" EUR"), "{q}");

    // The workload's page: its cost so far and what it will have cost at its lease's end.
    let w = b.page(&format!("/console/workloads/{id}")).await;
    let so_far = text_of(&w, "cost-so-far");
    assert!(so_far.contains("GPU-unit-hours: no price list configured"), "{so_far}");
    let at_end = text_of(&w, "cost-at-end");
    assert!(
        at_end.contains("GPU-unit-hours: no price list configured") && at_end.contains("ends at about"),
        "{at_end}"
    );

    // The dry run's budget after a request counts the work already running (8 GPUs for
    // nearly 2 hours more), not only what is spent.
    let d = poll(
        40,
        Duration::from_millis(250),
        async || {
            dry_run(
                &s,
                json!({"tenant": "nlp", "project": "p", "name": "x", "shape": {"gpus": 1, "pool": "training"}, "duration_s": 3600}),
            )
            .await
        },
        |d| d["budget"]["running"].as_f64().unwrap_or(0.0) > 15.0,
    )
    .await;
    let b_ = &d["budget"];
    let (left, running, after) = (
        b_["left"].as_f64().unwrap(),
        b_["running"].as_f64().unwrap(),
        b_["left_after"].as_f64().unwrap(),
    );
    assert!(running > 15.0 && running <= 16.0, "{d}");
    assert!((after - (left - running - 1.0)).abs() < 1e-9, "{d}");

    // vision's preview in the form: a borrow that says it may be preempted, the budget to the
    // hundredth, no price list.
    let member = s.token("vision", "member").await;
    let v = s.browser();
    let csrf = sign_in(&v, &member).await;
    let form = [
        ("project", "vision/train"),
        ("name", "nb"),
        ("pool", "serving"),
        ("model", "A100-80GB"),
        ("shape", "mig:1g.10gb"),
        ("duration_h", "1"),
        ("priority", "standard"),
    ];
    let p = v
        .post_form("/console/request/preview", &form, Some(&csrf))
        .await
        .text()
        .await
        .unwrap();
    assert!(p.contains("<strong>borrow</strong>"), "{p}");
    assert!(
        text_of(&p, "borrow-note").contains("may be preempted when the owner needs it back"),
        "{p}"
    );
    assert_eq!(text_of(&p, "preview-cost"), "no price list configured", "{p}");
    let budget = text_of(&p, "preview-budget");
    assert!(
        budget.starts_with("0.04 of 0.04 unit-hours") && budget.contains("-0.085 after this request"),
        "{budget}"
    );
    assert!(!p.contains("nlp"), "no other tenant in vision's form: {p}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_price_list_a_workload_shows_its_cost_so_far_and_at_its_end_in_money() {
    let s = TestServer::start_with("priced", |c| ServerConfig {
        prices: tessera_server::usage::Prices {
            currency: "EUR".into(),
            per_unit_hour: [("training".to_string(), 2.0)].into(),
        },
        ..c
    })
    .await;
    s.tenant_with_project("vision", "train").await;
    let id = submit(
        &s,
        json!({"tenant": "vision", "project": "train", "name": "big", "shape": {"gpus": 8, "pool": "training"}, "duration_s": 7200}),
    )
    .await;
    s.wait_state(id, &["running"]).await;
    let b = s.browser();
    sign_in(&b, &s.token("vision", "member").await).await;
    let w = b.page(&format!("/console/workloads/{id}")).await;
    assert!(text_of(&w, "cost-so-far").ends_with(" EUR"), "{w}");
    // 8 GPU units for 2 hours at 2.00 a unit-hour.
    let at_end = text_of(&w, "cost-at-end");
    assert!(at_end.contains(": 32.00 EUR (ends at about"), "{at_end}");
    let q = b.page("/console/quota").await;
    assert!(text_of(&q, "usage-cost").ends_with(" EUR"), "{q}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_and_missing_pages_are_html_with_navigation_and_the_form_says_every_error_at_once() {
    let s = TestServer::start("errpages").await;
    vision_and_nlp(&s).await;
    let member = s.token("vision", "member").await;
    let theirs = submit(
        &s,
        json!({"tenant": "nlp", "project": "p", "name": "secret-run", "shape": {"fraction": 250}}),
    )
    .await;
    let b = s.browser();
    let csrf = sign_in(&b, &member).await;
    // A page the member's role may not see, a workload that does not exist, another tenant's
    // workload, an address that is no page: HTML with the console's navigation.
    for (path, status, says) in [
        ("/console/tenants", StatusCode::FORBIDDEN, "Not allowed"),
        ("/console/workloads/999999", StatusCode::NOT_FOUND, "Not found"),
        (
            &format!("/console/workloads/{theirs}"),
            StatusCode::NOT_FOUND,
            "Not found",
        ),
        ("/console/nowhere", StatusCode::NOT_FOUND, "Not found"),
    ] {
        let r = b.get(path).await;
        assert_eq!(r.status(), status, "{path}");
        assert!(
            r.headers()["content-type"].to_str().unwrap().starts_with("text/html"),
            "{path}"
        );
        let page = r.text().await.unwrap();
        no_inline_code(&page);
        assert!(
            page.contains("<nav aria-label=\"Console\">") && page.contains("href=\"/console/workloads\""),
            "{path}: {page}"
        );
        assert!(text_of(&page, "error-h").contains(says), "{path}: {page}");
        assert!(!page.contains("secret-run") && !page.contains("nlp"), "{path}: {page}");
    }
    assert!(text_of(&b.page("/console/nowhere").await, "error-detail").contains("no console page at /console/nowhere"));
    // A change sent to an address that is no console action is "not found" too (not "method
    // not allowed", which would say there is something there).
    let post = b.post("/console/nowhere/delete", Some(&csrf)).await;
    assert_eq!(post.status(), StatusCode::NOT_FOUND);
    assert!(post.text().await.unwrap().contains("no route /console/nowhere/delete"));
    // Without a session a missing page still leads to the sign-in form.
    let anon = s.browser();
    assert_eq!(anon.get("/console/nowhere").await.status(), StatusCode::SEE_OTHER);
    // The API and htmx requests keep problem JSON.
    let api = s
        .request(Some(&member), Method::GET, "/api/v1/workloads/999999")
        .send()
        .await
        .unwrap();
    assert_eq!(api.status(), StatusCode::NOT_FOUND);
    assert_eq!(api.headers()["content-type"], "application/problem+json");
    let hx = b
        .client
        .get(b.url("/console/workloads/999999/live"))
        .header("hx-request", "true")
        .send()
        .await
        .unwrap();
    assert_eq!(hx.status(), StatusCode::NOT_FOUND);
    assert_eq!(hx.headers()["content-type"], "application/problem+json");

    // The form's inputs carry the API's limits.
    let page = b.page("/console/request").await;
    assert!(
        page.contains("id=\"f-name\" name=\"name\" value=\"job\" maxlength=\"63\""),
        "{page}"
    );
    assert!(
        page.contains("type=\"number\" min=\"0.0003\" max=\"8784\" step=\"any\""),
        "{page}"
    );
    let gang = b.page("/console/request/fields?pool=training&shape=gang").await;
    assert!(
        gang.contains("id=\"f-gang-gpus\" name=\"gang_gpus\" value=\"16\" type=\"number\" min=\"1\" max=\"65536\"")
            && gang.contains("name=\"gang_nodes\" value=\"\" type=\"number\" min=\"1\" max=\"4096\""),
        "{gang}"
    );

    // Every bad field at once, in the form's terms and units: a name too long, hours past the
    // longest duration, a movable mode the kind cannot have.
    let long = "n".repeat(200);
    let form = [
        ("project", "vision/train"),
        ("name", long.as_str()),
        ("pool", "serving"),
        ("model", "A100-80GB"),
        ("shape", "mig:1g.10gb"),
        ("duration_h", "100000"),
        ("priority", "standard"),
        ("kind", "service"),
        ("movable", "restart"),
    ];
    let bad = b.post_form("/console/request/preview", &form, Some(&csrf)).await;
    assert_eq!(bad.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let bad = bad.text().await.unwrap();
    assert_eq!(
        text_of(&bad, "name-error"),
        "200 characters: a name has 1–63 characters"
    );
    assert_eq!(
        text_of(&bad, "duration_h-error"),
        "100000 hours is longer than the longest duration, 8784 hours (366 days)"
    );
    assert!(
        text_of(&bad, "movable-error").contains("`restart` is for batch work"),
        "{bad}"
    );
    assert!(
        !bad.contains("duration_s") && !bad.contains("31622400"),
        "the API's field and unit stay out of the form: {bad}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charts_take_a_time_range_with_fixed_axes_and_numbers_per_point_to_admins_only() {
    let s = TestServer::start("charts-range").await;
    s.tenant_with_project("vision", "train").await;
    let member = s.token("vision", "member").await;
    let (_, w) = s
        .post(
            "/api/v1/workloads",
            json!({"tenant": "vision", "project": "train", "name": "two", "shape": {"gpus": 2, "pool": "training"}}),
        )
        .await;
    let id = w["id"].as_u64().unwrap();
    s.wait_state(id, &["running"]).await;
    let b = s.browser();
    sign_in(&b, &s.admin).await;
    // Its page says what it uses of its two GPUs now, from the simulator's telemetry.
    let use_now = poll(
        50,
        Duration::from_millis(100),
        async || b.page(&format!("/console/workloads/{id}")).await,
        |p| p.contains("over 2 devices"),
    )
    .await;
    assert!(use_now.contains("GPU use now"), "{use_now}");
    // The node's detail shows each GPU's telemetry.
    let node = s.get(&format!("/api/v1/workloads/{id}")).await["allocation"]["node"]
        .as_str()
        .unwrap()
        .to_string();
    let detail = b.page(&format!("/console/fleet/nodes/{node}")).await;
    assert!(detail.contains("GPU telemetry: sampled at"), "{detail}");
    assert!(detail.contains("class=\"gpu-telemetry\">utilisation"), "{detail}");
    // The default is the last 24 hours, a point a minute; the picker offers the four windows
    // and marks the current one.
    let day = b.page("/console/charts?pool=training").await;
    no_inline_code(&day);
    // The header names the signed-in token by its name, with its id.
    assert!(
        day.contains("admin (created at first start) (tok-admin) · platform-admin"),
        "{day}"
    );
    assert!(day.contains("The last 24 hours (UTC), one point a minute"), "{day}");
    for r in ["1h", "24h", "7d", "30d"] {
        assert!(day.contains(&format!("range={r}\"")), "a link to {r}");
    }
    assert!(day.contains("aria-current=\"page\" class=\"current\">24h<"), "{day}");
    assert!(!day.contains("Samples"), "no bare sample count");
    // The allocation axis runs from zero to the pool's capacity, utilisation to 100 %; the
    // running 2 GPUs are allocated now.
    let charts: Vec<Value> = day
        .split("data-chart=\"")
        .skip(1)
        .map(|c| {
            let raw = &c[..c.find('"').unwrap()];
            let json = raw
                .replace("&#34;", "\"")
                .replace("&quot;", "\"")
                .replace("&#39;", "'")
                .replace("&amp;", "&");
            serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"))
        })
        .collect();
    assert_eq!(charts.len(), 2);
    assert_eq!(charts[0]["y"], json!([0, 128]), "{}", charts[0]);
    assert_eq!(charts[1]["y"], json!([0, 100]));
    let allocated = charts[0]["series"][0]["values"].as_array().unwrap();
    assert_eq!(allocated.last().unwrap().as_f64(), Some(2.0), "{}", charts[0]);
    // A week is drawn in hours, with the hour's peak beside its mean.
    let week = b.page("/console/charts?pool=training&range=7d").await;
    assert!(week.contains("The last 7 days (UTC), one point an hour"), "{week}");
    assert!(week.contains("peak minute"));
    let csv = b.page("/console/charts/data?pool=training&range=7d&format=csv").await;
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("start_utc,minutes,pool,allocated_units,peak_units,capacity_units,utilisation_pct")
    );
    let last = lines.last().expect("a row for the current hour");
    let cells: Vec<&str> = last.split(',').collect();
    assert_eq!(
        (cells[1], cells[2], cells[4], cells[5]),
        ("60", "training", "2", "128"),
        "{last}"
    );
    assert!(cells[0].ends_with(":00:00.000Z"), "an hour starts on the hour: {last}");
    // An unknown range is the form's error, not an empty chart.
    let bad = b.get("/console/charts?range=2y").await;
    assert_eq!(bad.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        bad.text()
            .await
            .unwrap()
            .contains("unknown range `2y` (1h, 24h, 7d, 30d)")
    );
    // A tenant's member sees no fleet-wide chart, in any window, nor its numbers.
    let m = s.browser();
    sign_in(&m, &member).await;
    for path in [
        "/console/charts?range=30d",
        "/console/charts/data?pool=training&range=1h&format=json",
    ] {
        assert_eq!(m.get(path).await.status(), StatusCode::FORBIDDEN, "{path}");
    }
}

/// The workload's page as `b` sees it until `done` holds (5 s at most).
/// `html` with the entities askama writes for `&` and `'` read back.
fn unescape(html: &str) -> String {
    html.replace("&#38;", "&").replace("&#39;", "'").replace("&amp;", "&")
}

async fn page_until(b: &crate::support::Browser, path: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let page = unescape(&b.page(path).await);
        if done(&page) || std::time::Instant::now() > deadline {
            return page;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_workload_says_why_in_one_sentence_what_to_do_its_place_and_the_pools_that_cannot_serve_it() {
    let s = TestServer::start("whywaits").await;
    vision_and_nlp(&s).await;
    s.ok(
        Method::PUT,
        "/api/v1/tenants/vision/quotas/training",
        Some(json!({"guaranteed": 8.0, "limit": 8.0})),
    )
    .await;
    let gpus = |n: u32, name: &str| json!({"tenant": "vision", "project": "train", "name": name, "shape": {"gpus": n, "pool": "training"}});
    let a = submit(&s, gpus(8, "first")).await;
    s.wait_state(a, &["placed", "running"]).await;
    let b_id = submit(&s, gpus(8, "second")).await;
    let c_id = submit(&s, gpus(1, "third")).await;
    let member = s.browser();
    sign_in(&member, &s.token("vision", "member").await).await;
    let queue = page_until(&member, "/console/queue", |p| p.matches("quota</code>").count() >= 3).await;
    // Counts in words, each linking to its list.
    assert!(queue.contains("over quota: 2 workloads</a>"), "{queue}");
    assert!(
        queue.contains("href=\"/console/queue?pool=&tenant=vision&priority=&reason=quota&page=0#waiting-h\""),
        "{queue}"
    );
    assert!(!queue.contains('`'), "no backticks: {queue}");
    assert!(!queue.contains("1 units") && !queue.contains("1 workloads"), "{queue}");
    assert!(
        queue.contains("Tenant vision holds 8 GPU units in training (guaranteed 8, limit 8); this request needs 8."),
        "{queue}"
    );
    assert!(
        queue.contains("Next: ask your platform admin to raise your tenant's quota"),
        "{queue}"
    );
    assert!(queue.contains("1st of 2 waiting in tenant vision"), "{queue}");
    assert!(queue.contains("2nd of 2 waiting in tenant vision"), "{queue}");
    // The link lists those waiting for that reason; another reason lists none of them.
    let quota = member.page("/console/queue?reason=quota").await;
    assert!(
        quota.contains(&format!("id=\"q-{b_id}\"")) && quota.contains(&format!("id=\"q-{c_id}\"")),
        "{quota}"
    );
    let none = member.page("/console/queue?reason=no-capacity").await;
    assert!(!none.contains(&format!("id=\"q-{b_id}\"")), "{none}");
    assert!(none.contains("Nothing waits for that reason."), "{none}");
    let bad = member.get("/console/queue?reason=nonsense").await;
    assert_eq!(bad.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let bad = member.get("/console/queue?priority=nonsense").await;
    assert_eq!(bad.status(), StatusCode::UNPROCESSABLE_ENTITY);
    // The workload's own page: why, what to do, its place, the pools that cannot serve it.
    let page = unescape(&member.page(&format!("/console/workloads/{c_id}")).await);
    assert!(page.contains("<h2 id=\"waits-h\">Why it waits</h2>"), "{page}");
    assert!(
        page.contains("It is 2nd of 2 waiting in tenant vision's queue"),
        "{page}"
    );
    assert!(
        page.contains("Pool serving cannot serve 1 whole GPU: it is MIG-partitioned and serves MIG slices only"),
        "{page}"
    );
    assert!(page.contains("Next: ask your platform admin"), "{page}");
    assert!(!page.contains("quota: tenant"), "the code once: {page}");
    // An admin is told to raise it themselves, and filters by tenant from a list.
    let admin = s.browser();
    sign_in(&admin, &s.admin).await;
    let q = unescape(&admin.page("/console/queue").await);
    assert!(q.contains("Next: raise the tenant's quota on the Tenants page"), "{q}");
    assert!(q.contains("<select id=\"qf-tenant\" name=\"tenant\">"), "{q}");
    assert!(
        q.contains("<option value=\"nlp\">nlp</option>") && q.contains("<option value=\"vision\">vision</option>"),
        "{q}"
    );
    assert!(q.contains("<select id=\"qf-priority\" name=\"priority\">"), "{q}");
    // Tenant nlp sees none of it: not through the tenant filter, the reason link, the
    // workload's page, nor its place in the queue.
    let other = s.browser();
    sign_in(&other, &s.token("nlp", "member").await).await;
    for path in [
        "/console/queue?tenant=vision",
        "/console/queue?tenant=vision&reason=quota",
        "/console/queue?reason=quota&part=live&tenant=vision",
    ] {
        let p = other.page(path).await;
        assert!(!p.contains("vision"), "{path}: {p}");
        assert!(!p.contains(&format!("q-{b_id}")), "{path}: {p}");
        assert!(!p.contains("qf-tenant"), "no tenant filter for members: {p}");
    }
    let r = other.get(&format!("/console/workloads/{c_id}")).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let body = r.text().await.unwrap();
    assert!(!body.contains("vision") && !body.contains("third"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_page_sort_and_filter_by_real_values_and_never_across_tenants() {
    let s = TestServer::start("lists").await;
    vision_and_nlp(&s).await;
    let mut ids = Vec::new();
    for i in 0..55 {
        ids.push(
            submit(
                &s,
                json!({"tenant": "vision", "project": "train", "name": format!("v{i:02}"), "shape": {"gpus": 1, "pool": "training"}}),
            )
            .await,
        );
    }
    let secret_id = submit(
        &s,
        json!({"tenant": "nlp", "project": "p", "name": "nlp-secret", "shape": {"gpus": 1, "pool": "training"}}),
    )
    .await;
    let member = s.browser();
    sign_in(&member, &s.token("vision", "member").await).await;
    // Pages of 50, newest first, and the rest on the next page.
    let first = unescape(&member.page("/console/workloads").await);
    assert_eq!(first.matches("<tr id=\"w-").count(), 50, "{first}");
    assert!(first.contains("Workloads 1–50"), "{first}");
    assert!(first.contains(&format!("id=\"w-{}\"", ids[54])), "newest first");
    assert!(!first.contains("rel=\"prev\""), "{first}");
    let next = pager_link(&first, "next").expect("a next page");
    assert!(
        next.starts_with("/console/workloads?state=&tenant=&project=&sort=&cursor="),
        "{next}"
    );
    let second = unescape(&member.page(&next).await);
    assert_eq!(second.matches("<tr id=\"w-").count(), 5, "{second}");
    assert!(second.contains("Workloads 51–55"), "{second}");
    assert!(!second.contains("rel=\"next\""), "{second}");
    // Back to the first page, as it was.
    let back = unescape(
        &member
            .page(&pager_link(&second, "prev").expect("a previous page"))
            .await,
    );
    assert_eq!(row_ids(&back), row_ids(&first));
    // The cursor is the pager's: a made-up one, or one of another sort, is refused.
    let cursor = next.split("cursor=").nth(1).unwrap();
    for path in [
        "/console/workloads?cursor=not-a-cursor".to_string(),
        format!("/console/workloads?sort=name&cursor={cursor}"),
    ] {
        let r = member.get(&path).await;
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{path}");
        assert!(r.text().await.unwrap().contains("not a page of this list"), "{path}");
    }
    let oldest = member.page("/console/workloads?sort=oldest").await;
    let at = |p: &str, id: u64| p.find(&format!("id=\"w-{id}\"")).unwrap_or(usize::MAX);
    assert!(at(&oldest, ids[0]) < at(&oldest, ids[1]), "oldest first");
    let by_name = member.page("/console/workloads?sort=name").await;
    assert!(at(&by_name, ids[0]) < at(&by_name, ids[2]), "v00 before v02");
    assert_eq!(
        member.get("/console/workloads?sort=size").await.status(),
        StatusCode::UNPROCESSABLE_ENTITY
    );
    // The project filter takes the form the list shows, and the bare name of one's own tenant.
    for path in [
        "/console/workloads?project=vision/train",
        "/console/workloads?project=train",
    ] {
        let p = member.page(path).await;
        assert_eq!(p.matches("<tr id=\"w-").count(), 50, "{path}");
        assert!(p.contains("<option value=\"vision/train\" selected>"), "{path}: {p}");
    }
    // The filters offer only the caller's own projects, and no tenant choice.
    assert!(!first.contains("nlp"), "{first}");
    assert!(!first.contains("id=\"f-tenant\""), "{first}");
    // Another tenant's names get the answer an unknown name gets: refused, nothing shown.
    for path in [
        "/console/workloads?project=nlp/p",
        "/console/workloads?tenant=nlp",
        "/console/workloads?project=nope",
    ] {
        let r = member.get(path).await;
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{path}");
        let body = r.text().await.unwrap();
        assert!(
            !body.contains("nlp-secret") && !body.contains(&format!("w-{secret_id}")),
            "{path}: {body}"
        );
    }
    let rows = member.page("/console/workloads?part=rows&project=nlp/p").await;
    assert!(
        !rows.contains("nlp-secret"),
        "the polled rows stay in the tenant: {rows}"
    );
    // Admins choose a tenant and any tenant's project from lists.
    let admin = s.browser();
    let csrf = sign_in(&admin, &s.admin).await;
    let all = admin.page("/console/workloads").await;
    assert!(
        all.contains("<option value=\"nlp\">nlp</option>") && all.contains("<option value=\"nlp/p\">nlp/p</option>"),
        "{all}"
    );
    let nlp = admin.page("/console/workloads?tenant=nlp").await;
    assert!(nlp.contains("nlp-secret") && !nlp.contains(">v00<"), "{nlp}");
    assert_eq!(
        admin.get("/console/workloads?tenant=ghost").await.status(),
        StatusCode::UNPROCESSABLE_ENTITY
    );

    // Tenants: a summary table, panels with the values set, Remove as a danger action.
    s.ok(
        Method::PUT,
        "/api/v1/tenants/vision/budget",
        Some(json!({"monthly_unit_hours": 500.0})),
    )
    .await;
    s.ok(
        Method::PUT,
        "/api/v1/tenants/vision/quotas/training",
        Some(json!({"guaranteed": 8.0, "limit": 16.0})),
    )
    .await;
    let tenants = admin.page("/console/tenants").await;
    assert!(
        tenants.contains("<table id=\"tenant-summary\" class=\"cards\">"),
        "{tenants}"
    );
    assert!(
        tenants.contains("id=\"sum-vision\"") && tenants.contains("id=\"sum-nlp\""),
        "{tenants}"
    );
    assert!(
        tenants.contains("training: 0 used of 8 guaranteed, limit 16") || tenants.contains("training: "),
        "{tenants}"
    );
    assert!(
        tenants.contains("id=\"vision-budget-monthly_unit_hours\" name=\"monthly_unit_hours\" type=\"number\" min=\"0\" step=\"any\" inputmode=\"decimal\" placeholder=\"none\" value=\"500\""),
        "the budget field shows the budget set: {tenants}"
    );
    assert!(
        tenants.contains("class=\"danger\" aria-label=\"Remove the training quota\""),
        "{tenants}"
    );
    assert!(
        tenants.contains("<details class=\"tenant-panel\" id=\"panel-vision\""),
        "{tenants}"
    );

    // Audit rows name the object; tokens show their tenant and role; platform tokens too.
    let made = admin
        .post_form("/console/tenants", &[("name", "stark")], Some(&csrf))
        .await;
    assert_eq!(made.status(), StatusCode::OK);
    let tok = admin
        .post_form(
            "/console/tokens",
            &[
                ("tenant", "_platform"),
                ("name", "ops-bot"),
                ("role", "platform-admin"),
                ("expires_days", ""),
            ],
            Some(&csrf),
        )
        .await;
    assert_eq!(tok.status(), StatusCode::OK);
    let tok = tok.text().await.unwrap();
    assert!(
        tok.contains("data-copy=\"#new-secret\"") && tok.contains("TESSERA_TOKEN"),
        "{tok}"
    );
    assert!(
        tok.contains("<td>ops-bot</td><td>platform-wide</td><td>platform-admin</td>"),
        "{tok}"
    );
    let platform = admin.page("/console/tokens?tenant=_platform").await;
    assert!(
        platform.contains("<option value=\"platform-admin\">platform-admin</option>"),
        "{platform}"
    );
    assert!(
        platform.contains("<td>platform-wide</td><td>platform-admin</td>"),
        "{platform}"
    );
    let vision_tokens = admin.page("/console/tokens?tenant=vision").await;
    assert!(
        vision_tokens.contains("<td>vision</td><td>member</td>"),
        "{vision_tokens}"
    );
    let audit = unescape(&admin.page("/console/audit").await);
    assert!(
        audit.contains("<td class=\"what\">created tenant stark</td>"),
        "{audit}"
    );
    assert!(
        audit.contains("created token ") && audit.contains("(ops-bot), platform-admin platform-wide"),
        "{audit}"
    );
    assert!(audit.contains("<td class=\"what\">budget of tenant vision"), "{audit}");
    assert!(audit.contains("<select id=\"a-tenant\" name=\"tenant\">"), "{audit}");
    // A tenant-admin of nlp sees neither vision's nor the platform's tokens, whatever it asks.
    let nlp_admin = s.browser();
    sign_in(&nlp_admin, &s.token("nlp", "tenant-admin").await).await;
    for path in ["/console/tokens?tenant=vision", "/console/tokens?tenant=_platform"] {
        let p = nlp_admin.page(path).await;
        assert!(
            !p.contains("ops-bot") && !p.contains("platform-wide") && !p.contains("<td>vision</td>"),
            "{path}: {p}"
        );
        assert!(!p.contains("platform-admin</option>"), "{path}: {p}");
    }
    let forged = nlp_admin
        .post_form(
            "/console/tokens",
            &[
                ("tenant", "_platform"),
                ("name", "x"),
                ("role", "platform-admin"),
                ("expires_days", ""),
            ],
            None,
        )
        .await;
    assert_eq!(forged.status(), StatusCode::FORBIDDEN, "no CSRF token");
    let nlp_tenants = nlp_admin.page("/console/tenants").await;
    assert!(
        !nlp_tenants.contains("vision") && !nlp_tenants.contains("stark"),
        "{nlp_tenants}"
    );
    assert_eq!(nlp_admin.get("/console/audit").await.status(), StatusCode::FORBIDDEN);
}

/// The legend's swatches of the fleet map: `(tenant, classes, key)` in order.
fn legend_swatches(map: &str) -> Vec<(String, String, String)> {
    let legend = map
        .split("class=\"legend\"")
        .nth(1)
        .unwrap_or_else(|| panic!("a legend: {map}"))
        .split("</ul>")
        .next()
        .unwrap();
    legend
        .split("<li")
        .filter(|li| li.contains("<a href="))
        .map(|li| {
            let classes = li.split("class=\"sw ").nth(1).unwrap().split('"').next().unwrap();
            let key = li
                .split("aria-hidden=\"true\">")
                .nth(1)
                .unwrap()
                .split('<')
                .next()
                .unwrap();
            let tenant = li.split("</span>").nth(1).unwrap().split("</a>").next().unwrap();
            (tenant.to_string(), classes.to_string(), key.to_string())
        })
        .collect()
}

/// Beyond the 16 colours the map adds a pattern: 20 tenants with work get 20 distinct
/// colour-and-pattern pairs (the last four hatched) and 20 keys, on the map, the legend and the
/// node drawer; the drawer is a modal dialog and the heat map says how to use it by keyboard.
/// A member of nlp gets none of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_tenants_never_look_the_same_on_the_fleet_map_and_a_member_sees_none() {
    let s = TestServer::start("fleet20").await;
    let names: Vec<String> = (0..20).map(|i| format!("team{i:02}")).collect();
    let mut ids = Vec::new();
    for t in &names {
        s.tenant_with_project(t, "p").await;
        let (st, w) = s
            .post(
                "/api/v1/workloads",
                json!({"tenant": t, "project": "p", "name": "x", "shape": {"gpus": 1, "pool": "training"}}),
            )
            .await;
        assert!(st.is_success(), "{w}");
        ids.push(w["id"].as_u64().unwrap());
    }
    let mut nodes = Vec::new();
    for id in &ids {
        let w = s.wait_state(*id, &["placed", "running"]).await;
        nodes.push(w["allocation"]["node"].as_str().unwrap().to_string());
    }
    let b = s.browser();
    sign_in(&b, &s.admin).await;
    // Every tenant's node on the first page: one page of 100 rows holds the 16 training nodes.
    let map = b.page("/console/fleet?pool=training").await;
    no_inline_code(&map);
    let sw = legend_swatches(&map);
    assert_eq!(sw.len(), 20, "{sw:?}");
    let pairs: std::collections::HashSet<&String> = sw.iter().map(|(_, c, _)| c).collect();
    assert_eq!(pairs.len(), 20, "twenty distinct colour-and-pattern pairs: {sw:?}");
    let keys: std::collections::HashSet<&String> = sw.iter().map(|(_, _, k)| k).collect();
    assert_eq!(keys.len(), 20, "twenty distinct keys: {sw:?}");
    let hatched: Vec<&(String, String, String)> = sw.iter().filter(|(_, c, _)| c.ends_with(" p1")).collect();
    assert_eq!(hatched.len(), 4, "the 17th to 20th tenants are hatched: {sw:?}");
    assert!(
        hatched.iter().all(|(t, _, _)| t.as_str() >= "team16"),
        "in name order: {hatched:?}"
    );
    // Two tenants share a colour only with different patterns.
    for (t, c, _) in &hatched {
        let colour = c.split(' ').next().unwrap();
        assert!(
            sw.iter().any(|(u, d, _)| u != t && d == colour),
            "{t}'s colour {colour} is also a solid tenant's (16 colours, 20 tenants)"
        );
    }
    assert!(map.contains("20 tenants: past the 16 colours"), "said on the page");
    // Each tenant's cell carries its colour and pattern.
    for (t, c, k) in &sw {
        assert!(
            map.contains(&format!("class=\"cell {c} full\"")),
            "{t}'s cell has classes {c} (key {k})"
        );
    }
    // The drawer is a modal dialog; the heat map's groups are labelled and its keys said.
    assert!(map.contains("role=\"dialog\" aria-modal=\"true\""), "{map}");
    assert!(map.contains("the arrow keys move between nodes"), "{map}");
    assert!(map.contains("role=\"group\" aria-label=\"training rack r0: "), "{map}");
    // The node detail (the drawer's content) draws the hatched tenant's slice the same way.
    let (t19, c19, _) = sw.iter().find(|(t, _, _)| t == "team19").unwrap();
    let node19 = &nodes[names.iter().position(|n| n == t19).unwrap()];
    let detail = b.page(&format!("/console/fleet/nodes/{node19}")).await;
    assert!(detail.contains(&format!("class=\"sw {c19}\"")), "{detail}");
    // A member of nlp (no work on the fleet): their map and a node's detail name no tenant
    // and show no tenant's swatch, only "another tenant" (t17) and free (t16).
    s.tenant_with_project("nlp", "p").await;
    let m = s.browser();
    sign_in(&m, &s.token("nlp", "member").await).await;
    for path in [
        "/console/fleet".to_string(),
        "/console/fleet?highlight=team19".to_string(),
        format!("/console/fleet/nodes/{node19}"),
    ] {
        let r = m.get(&path).await;
        assert_eq!(r.status(), StatusCode::OK, "{path}");
        let body = r.text().await.unwrap();
        assert!(!body.contains("team"), "{path} names a tenant: {body}");
        for (i, _) in body.match_indices("class=\"sw t") {
            let rest = &body[i + "class=\"sw t".len()..];
            assert!(
                rest.starts_with("16\"") || rest.starts_with("17\""),
                "{path} shows a tenant's swatch: {}",
                &rest[..20.min(rest.len())]
            );
        }
    }
    let empty = m.page("/console/fleet").await;
    assert!(empty.contains("No node holds nlp"), "{empty}");
}

/// Events record a token's id; the workload's page names it at display time — to callers who
/// may see that token. A member of nlp sees its own token's name, but not the name of the
/// platform admin's token that cancelled its workload, and nothing of vision's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeline_names_tokens_only_to_those_who_may_see_them() {
    let s = TestServer::start("tokennames").await;
    vision_and_nlp(&s).await;
    let server = &s;
    let token = |tenant: Option<&str>, role: &str, name: &str| {
        let s = server;
        let body = json!({"tenant": tenant, "role": role, "name": name});
        async move {
            let t = s.ok(Method::POST, "/api/v1/tokens", Some(body)).await;
            (
                t["id"].as_str().unwrap().to_string(),
                t["token"].as_str().unwrap().to_string(),
            )
        }
    };
    let (vid, vsecret) = token(Some("vision"), "member", "vision-ci").await;
    let (nid, nsecret) = token(Some("nlp"), "member", "nlp-bot").await;
    let (oid, osecret) = token(None, "platform-admin", "ops-night-shift").await;
    let submit_as = |secret: String, tenant: &'static str, project: &'static str| {
        let s = server;
        let body =
            json!({"tenant": tenant, "project": project, "name": "w", "shape": {"fraction": 250}, "duration_s": 3600});
        async move {
            let (st, w) = s
                .call_as(Some(&secret), Method::POST, "/api/v1/workloads", Some(body))
                .await;
            assert!(st.is_success(), "{w}");
            w["id"].as_u64().unwrap()
        }
    };
    let vw = submit_as(vsecret.clone(), "vision", "train").await;
    let nw = submit_as(nsecret.clone(), "nlp", "p").await;
    s.wait_state(nw, &["placed", "running"]).await;
    let (st, body) = s
        .call_as(
            Some(&osecret),
            Method::POST,
            &format!("/api/v1/workloads/{nw}/cancel"),
            None,
        )
        .await;
    assert!(st.is_success(), "{body}");
    s.wait_state(nw, &["cancelled"]).await;
    // vision's member: its own token by name.
    let v = s.browser();
    sign_in(&v, &vsecret).await;
    let page = unescape(&v.page(&format!("/console/workloads/{vw}")).await);
    assert!(page.contains(&format!("vision-ci ({vid})")), "{page}");
    // nlp's member: its token by name, the admin's by id alone, vision's page not at all.
    let n = s.browser();
    sign_in(&n, &nsecret).await;
    let page = unescape(&n.page(&format!("/console/workloads/{nw}")).await);
    assert!(page.contains(&format!("nlp-bot ({nid})")), "{page}");
    assert!(page.contains(&format!("cancelled by {oid}")), "{page}");
    assert!(
        !page.contains("ops-night-shift") && !page.contains("(deleted)"),
        "{page}"
    );
    // The API's timeline and workload (what `tessera describe` prints) name them alike.
    let api = |secret: String, path: String| {
        let s = server;
        async move {
            let (st, v) = s.call_as(Some(&secret), Method::GET, &path, None).await;
            assert!(st.is_success(), "{path}: {v}");
            v.to_string()
        }
    };
    let events = api(nsecret.clone(), format!("/api/v1/workloads/{nw}/events")).await;
    assert!(events.contains(&format!("nlp-bot ({nid})")), "{events}");
    assert!(events.contains(&format!("cancelled by {oid}")), "{events}");
    let w = api(nsecret.clone(), format!("/api/v1/workloads/{nw}")).await;
    assert!(w.contains(&format!("by {oid}")), "{w}");
    let listed = api(nsecret.clone(), "/api/v1/workloads".to_string()).await;
    assert!(listed.contains(&format!("by {oid}")), "{listed}");
    for shown in [&events, &w, &listed] {
        assert!(
            !shown.contains("ops-night-shift") && !shown.contains("(deleted)"),
            "{shown}"
        );
    }
    let events = api(s.admin.clone(), format!("/api/v1/workloads/{nw}/events")).await;
    assert!(
        events.contains(&format!("cancelled by ops-night-shift ({oid})")),
        "{events}"
    );
    assert!(events.contains(&format!("nlp-bot ({nid})")), "{events}");
    let w = api(s.admin.clone(), format!("/api/v1/workloads/{nw}")).await;
    assert!(w.contains(&format!("by ops-night-shift ({oid})")), "{w}");
    let listed = api(s.admin.clone(), "/api/v1/workloads".to_string()).await;
    assert!(listed.contains(&format!("by ops-night-shift ({oid})")), "{listed}");
    let r = n.get(&format!("/console/workloads/{vw}")).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let body = r.text().await.unwrap();
    assert!(!body.contains("vision-ci") && !body.contains(&vid), "{body}");
    // The platform admin: every token by name.
    let a = s.browser();
    sign_in(&a, &s.admin).await;
    let page = unescape(&a.page(&format!("/console/workloads/{nw}")).await);
    assert!(
        page.contains(&format!("cancelled by ops-night-shift ({oid})")),
        "{page}"
    );
    assert!(page.contains(&format!("nlp-bot ({nid})")), "{page}");

    // The workload lists name tokens as the timelines do. vision cancels its own with its
    // token; nlp's second workload is cancelled by nlp's own token.
    let (st, body) = s
        .call_as(
            Some(&vsecret),
            Method::POST,
            &format!("/api/v1/workloads/{vw}/cancel"),
            None,
        )
        .await;
    assert!(st.is_success(), "{body}");
    let nw2 = submit_as(nsecret.clone(), "nlp", "p").await;
    let (st, body) = s
        .call_as(
            Some(&nsecret),
            Method::POST,
            &format!("/api/v1/workloads/{nw2}/cancel"),
            None,
        )
        .await;
    assert!(st.is_success(), "{body}");
    s.wait_state(vw, &["cancelled"]).await;
    s.wait_state(nw2, &["cancelled"]).await;
    let list = unescape(&v.page("/console/workloads").await);
    assert!(list.contains(&format!("by vision-ci ({vid})")), "{list}");
    // nlp's member, on every list it may ask for: its own token by name, the admin's by id
    // alone, nothing of vision's token (nor on the overview, whose table has no reasons).
    for path in [
        "/console/workloads",
        "/console/workloads?sort=name",
        "/console/workloads?state=cancelled",
        "/console/workloads?part=rows",
        "/console",
        "/console/workloads?part=rows&tenant=vision",
        "/console/workloads?part=rows&project=vision/train",
    ] {
        let list = unescape(&n.page(path).await);
        if path.starts_with("/console/workloads") && !path.contains("vision") {
            assert!(list.contains(&format!("by nlp-bot ({nid})")), "{path}: {list}");
            assert!(list.contains(&format!("by {oid}")), "{path}: {list}");
        }
        for secret in ["ops-night-shift", "vision-ci", vid.as_str(), "(deleted)"] {
            assert!(!list.contains(secret), "{path}: {secret} in {list}");
        }
    }
    // The admin's list names every token.
    let list = unescape(&a.page("/console/workloads").await);
    for shown in [
        format!("by ops-night-shift ({oid})"),
        format!("by nlp-bot ({nid})"),
        format!("by vision-ci ({vid})"),
    ] {
        assert!(list.contains(&shown), "{shown} in {list}");
    }
}

/// The quota form shows the tenant's current quota (the first class set, its guaranteed and
/// limit; each class's values on its option for the script), a tenant without one shows empty
/// fields; nlp's tenant-admin sees only nlp's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quota_form_is_filled_with_the_current_quota() {
    let s = TestServer::start("quotaprefill").await;
    vision_and_nlp(&s).await;
    s.ok(
        Method::PUT,
        "/api/v1/tenants/vision/quotas/training",
        Some(json!({"guaranteed": 8.0, "limit": 16.0})),
    )
    .await;
    s.ok(
        Method::PUT,
        "/api/v1/tenants/vision/quotas/serving",
        Some(json!({"guaranteed": 2.5})),
    )
    .await;
    let a = s.browser();
    sign_in(&a, &s.admin).await;
    let page = a.page("/console/tenants").await;
    let panel = |t: &str| -> String {
        page.split(&format!("id=\"panel-{t}\""))
            .nth(1)
            .unwrap()
            .split("</details>")
            .next()
            .unwrap()
            .to_string()
    };
    let vision = panel("vision");
    let first = vision
        .split("class=\"grid2 quota-form\"")
        .nth(1)
        .unwrap()
        .split("</form>")
        .next()
        .unwrap();
    // The quotas are listed by class name: serving first, so the form shows serving's values.
    let selected = first.split(" selected").next().unwrap();
    let sel_value = selected.rsplit("<option value=\"").next().unwrap();
    let shown = sel_value.split('"').next().unwrap();
    assert!(
        !attr(first, "name=\"guaranteed\"", "value").is_empty() && ["training", "serving"].contains(&shown),
        "{first}"
    );
    let (g, l) = if shown == "training" { ("8", "16") } else { ("2.5", "") };
    assert_eq!(attr(first, "name=\"guaranteed\"", "value"), g, "{first}");
    assert_eq!(attr(first, "name=\"limit\"", "value"), l, "{first}");
    assert!(
        first.contains("value=\"training\" data-guaranteed=\"8\" data-limit=\"16\">training (set)"),
        "{first}"
    );
    assert!(
        first.contains("data-guaranteed=\"2.5\" data-limit=\"\">serving (set)"),
        "{first}"
    );
    let nlp = panel("nlp");
    assert_eq!(attr(&nlp, "name=\"guaranteed\"", "value"), "", "no quota, empty: {nlp}");
    assert!(!nlp.contains("(set)"), "{nlp}");
    // nlp's tenant-admin: its own form, nothing of vision's values or name.
    let t = s.browser();
    sign_in(&t, &s.token("nlp", "tenant-admin").await).await;
    let own = t.page("/console/tenants").await;
    assert!(own.contains("id=\"panel-nlp\""), "{own}");
    assert!(
        !own.contains("vision") && !own.contains("data-guaranteed=\"8\""),
        "{own}"
    );
    let m = s.browser();
    sign_in(&m, &s.token("nlp", "member").await).await;
    let r = m.get("/console/tenants").await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(!r.text().await.unwrap().contains("vision"));
}

/// A waiting multi-node gang's page names the pools that cannot serve it (the MIG and the
/// time-sliced pool: a gang needs a whole pool); nlp sees nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_gang_names_the_pools_that_cannot_serve_it() {
    let s = TestServer::start("gangwaits").await;
    vision_and_nlp(&s).await;
    s.ok(
        Method::PUT,
        "/api/v1/tenants/vision/quotas/training",
        Some(json!({"guaranteed": 16.0, "limit": 16.0})),
    )
    .await;
    let gpus = |n: u32, name: &str| json!({"tenant": "vision", "project": "train", "name": name, "shape": {"gpus": n, "pool": "training"}});
    let a = submit(&s, gpus(8, "first")).await;
    s.wait_state(a, &["placed", "running"]).await;
    let gang = submit(&s, gpus(16, "gang")).await;
    let member = s.browser();
    sign_in(&member, &s.token("vision", "member").await).await;
    let page = unescape(
        &page_until(&member, &format!("/console/workloads/{gang}"), |p| {
            p.contains("Why it waits")
        })
        .await,
    );
    assert!(
        page.contains("Pool serving shares its GPUs by mig; a multi-node gang needs a whole pool."),
        "{page}"
    );
    assert!(
        page.contains("Pool development shares its GPUs by shared; a multi-node gang needs a whole pool."),
        "{page}"
    );
    assert!(!page.contains("Pool training shares"), "{page}");
    let other = s.browser();
    sign_in(&other, &s.token("nlp", "member").await).await;
    let r = other.get(&format!("/console/workloads/{gang}")).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let body = r.text().await.unwrap();
    assert!(!body.contains("vision") && !body.contains("Pool serving"), "{body}");
}

/// A gang that waits for room and holds no nodes yet says on its page when and where it would
/// start if it held nodes now, as the API's `expected_start` and the dry run say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_gangs_page_says_when_and_where_it_would_start() {
    let s = TestServer::start("gangexpected").await;
    vision_and_nlp(&s).await;
    let gpus = |n: u32, name: &str| json!({"tenant": "vision", "project": "train", "name": name, "shape": {"gpus": n, "pool": "training"}, "duration_s": 3600});
    let mut fill = Vec::new();
    for i in 0..16 {
        fill.push(submit(&s, gpus(8, &format!("fill{i}"))).await);
    }
    for id in &fill {
        s.wait_state(*id, &["running"]).await;
    }
    let gang = submit(&s, gpus(32, "gang")).await;
    let w = s.wait_state(gang, &["queued"]).await;
    let expected = w["expected_start"]
        .as_str()
        .expect("a start for a gang without a hold")
        .to_string();
    assert!(expected.starts_with("if it waits, it starts at about "), "{expected}");
    let member = s.browser();
    sign_in(&member, &s.token("vision", "member").await).await;
    let page = unescape(
        &page_until(&member, &format!("/console/workloads/{gang}"), |p| {
            p.contains("id=\"waits-expected\"")
        })
        .await,
    );
    let rest = &expected["if it waits, it starts at about ".len()..];
    assert!(
        page.contains(&format!(
            "If it waits, it starts at about {rest}. It holds nodes once it has waited past the backfill window."
        )),
        "API: {expected}\npage: {}",
        page.split("waits-expected\">")
            .nth(1)
            .and_then(|p| p.split('<').next())
            .unwrap_or_default()
    );
    // A running workload's page has no such line.
    let page = unescape(
        &member
            .get(&format!("/console/workloads/{}", fill[0]))
            .await
            .text()
            .await
            .unwrap(),
    );
    assert!(!page.contains("waits-expected"), "{page}");
}

/// The workload ids of a list page's rows, in order.
/// The pager's link marked `rel` (`next`, `prev`) on an unescaped page.
fn pager_link(page: &str, rel: &str) -> Option<String> {
    let end = page.find(&format!("\" rel=\"{rel}\""))?;
    let start = page[..end].rfind("href=\"")? + "href=\"".len();
    Some(page[start..end].to_string())
}

fn row_ids(page: &str) -> Vec<u64> {
    page.match_indices("<tr id=\"w-")
        .map(|(i, m)| {
            let rest = &page[i + m.len()..];
            rest[..rest.find('"').unwrap()].parse().unwrap()
        })
        .collect()
}

/// Every sort of the workload list holds across its pages: the store sorts and pages over
/// every matching workload (no window of the newest is sorted), by name, oldest first, newest
/// first and by state (the cancelled first, newest first among them); no page says the order is
/// partial; the pager's cursors lead forward and back over three pages; nlp's workload, named
/// to sort first, is on none of vision's pages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sort_of_the_workload_list_holds_across_its_pages() {
    let s = TestServer::start("sortpages").await;
    vision_and_nlp(&s).await;
    let mut made: Vec<(u64, String)> = Vec::new();
    for i in 0..110u32 {
        // A name order unlike the order of creation: 0, 37, 74, 1, … (37 and 110 are coprime).
        let name = format!("n{:03}", (i * 37) % 110);
        let body = json!({"tenant": "vision", "project": "train", "name": name, "shape": {"fraction": 250}, "duration_s": 3600});
        made.push((submit(&s, body).await, name));
    }
    let secret = submit(
        &s,
        json!({"tenant": "nlp", "project": "p", "name": "a-nlp-first", "shape": {"fraction": 250}}),
    )
    .await;
    // Every third ends cancelled: a state that stays while the pages are read.
    let mut cancelled: Vec<u64> = made.iter().step_by(3).map(|(id, _)| *id).collect();
    for id in &cancelled {
        s.ok(Method::POST, &format!("/api/v1/workloads/{id}/cancel"), None)
            .await;
    }
    for id in &cancelled {
        s.wait_state(*id, &["cancelled"]).await;
    }
    let member = s.browser();
    sign_in(&member, &s.token("vision", "member").await).await;
    // Forward through the pager's Next links, then back through its Previous links: each page
    // read back is the page read forward.
    let both_pages = |sort: &'static str| {
        let member = &member;
        async move {
            let mut pages: Vec<Vec<u64>> = Vec::new();
            let mut path = format!("/console/workloads?sort={sort}");
            let last = loop {
                let p = unescape(&member.page(&path).await);
                assert!(!p.contains("sort-note") && !p.contains("newest 5"), "{p}");
                assert!(!p.contains("a-nlp-first") && !p.contains(&format!("w-{secret}")), "{p}");
                pages.push(row_ids(&p));
                match pager_link(&p, "next") {
                    Some(n) => path = n,
                    None => break p,
                }
            };
            assert_eq!(pages.len(), 3, "{sort}: 110 workloads are three pages of 50");
            let mut p = last;
            for want in pages.iter().rev().skip(1) {
                let prev = pager_link(&p, "prev").expect("a previous page");
                p = unescape(&member.page(&prev).await);
                assert_eq!(&row_ids(&p), want, "{sort}: back a page");
            }
            assert!(
                pager_link(&p, "prev").is_none(),
                "{sort}: the first page has no previous"
            );
            pages.concat()
        }
    };
    let mut by_name = made.clone();
    by_name.sort_by(|a, b| a.1.cmp(&b.1));
    let want: Vec<u64> = by_name.iter().map(|(id, _)| *id).collect();
    assert_eq!(both_pages("name").await, want, "by name over both pages");
    let oldest: Vec<u64> = made.iter().map(|(id, _)| *id).collect();
    assert_eq!(both_pages("oldest").await, oldest, "oldest first over both pages");
    let newest: Vec<u64> = oldest.iter().rev().copied().collect();
    assert_eq!(both_pages("newest").await, newest, "newest first over both pages");
    let by_state = both_pages("state").await;
    assert_eq!(by_state.len(), 110);
    cancelled.reverse();
    let n = cancelled.len();
    assert_eq!(by_state[..n], cancelled[..], "the cancelled first, newest first");
    let mut rest = by_state[n..].to_vec();
    rest.sort_unstable();
    let mut others: Vec<u64> = oldest.iter().filter(|id| !cancelled.contains(id)).copied().collect();
    others.sort_unstable();
    assert_eq!(rest, others, "then every other workload once");
}

/// A cursor crafted from another tenant's workload moves only where nlp's page starts: nlp's
/// member, handed cursors built from vision's workloads (its id and name, forward and back, in
/// every sort), sees nlp's rows and never vision's names, ids or count, on the page and in the
/// polled rows; the API's cursor (a workload id) of vision's workload likewise lists only nlp's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_from_another_tenants_workload_shows_none_of_it() {
    use base64::Engine;
    let s = TestServer::start("cursor-tenants").await;
    vision_and_nlp(&s).await;
    let mut vision = Vec::new();
    for i in 0..4 {
        let body = json!({"tenant": "vision", "project": "train", "name": format!("vis-secret-{i}"), "shape": {"fraction": 250}});
        vision.push(submit(&s, body).await);
    }
    let mut nlp = Vec::new();
    for name in ["a-nlp", "m-nlp", "z-nlp"] {
        let body = json!({"tenant": "nlp", "project": "p", "name": name, "shape": {"fraction": 250}});
        nlp.push(submit(&s, body).await);
    }
    let member = s.browser();
    let token = s.token("nlp", "member").await;
    sign_in(&member, &token).await;
    let cursor = |sort: &str, dir: &str, id: u64, key: &str| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{sort}\n{dir}\n0\n{id}\n{key}"))
    };
    for sort in ["newest", "oldest", "name", "state"] {
        for dir in ["a", "b"] {
            for (i, &vid) in vision.iter().enumerate() {
                let key = match sort {
                    "name" => format!("vis-secret-{i}"),
                    "state" => "running".to_string(),
                    _ => String::new(),
                };
                let c = cursor(sort, dir, vid, &key);
                for path in [
                    format!("/console/workloads?sort={sort}&cursor={c}"),
                    format!("/console/workloads?sort={sort}&cursor={c}&part=rows"),
                ] {
                    let r = member.get(&path).await;
                    assert_eq!(r.status(), StatusCode::OK, "{path}");
                    let page = unescape(&r.text().await.unwrap());
                    assert!(
                        !page.contains("vis-secret") && !page.contains("vision"),
                        "{path}: {page}"
                    );
                    for id in row_ids(&page) {
                        assert!(nlp.contains(&id), "{path}: row {id} is not nlp's");
                    }
                    for v in &vision {
                        assert!(!page.contains(&format!("w-{v}\"")), "{path}: {page}");
                    }
                }
            }
        }
    }
    // The name sort after vision's "vis-secret-0": only nlp's "z-nlp" sorts after it.
    let c = cursor("name", "a", vision[0], "vis-secret-0");
    let page = member.page(&format!("/console/workloads?sort=name&cursor={c}")).await;
    assert_eq!(row_ids(&page), vec![nlp[2]], "{page}");
    // The API: a vision id as the cursor lists nlp's workloads below it, nothing of vision's.
    let r = s
        .request(
            Some(&token),
            Method::GET,
            &format!("/api/v1/workloads?cursor={}", vision[3]),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let body = r.text().await.unwrap();
    assert!(!body.contains("vis-secret") && !body.contains("\"vision\""), "{body}");
}

/// A running workload's page shows each device it holds as the simulator's telemetry reports it
/// (two whole GPUs; a share of a GPU), and its GPUs' use over time with the numbers behind the
/// chart; a member of another tenant finds neither the page, its fragment nor the numbers.
/// About 6 s (the simulator reports telemetry every 5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_workloads_page_shows_its_gpus_telemetry_now_and_over_time_to_its_own_tenant_only() {
    let s = TestServer::start("wl-telemetry").await;
    vision_and_nlp(&s).await;
    let id = submit(
        &s,
        json!({"tenant": "vision", "project": "train", "name": "trainer", "shape": {"gpus": 2, "pool": "training"}, "duration_s": 3600}),
    )
    .await;
    let share = submit(
        &s,
        json!({"tenant": "vision", "project": "train", "name": "notebook", "shape": {"fraction": 250}, "duration_s": 3600}),
    )
    .await;
    let w = s.wait_state(id, &["running"]).await;
    s.wait_state(share, &["running"]).await;
    let node = w["allocation"]["node"].as_str().unwrap().to_string();
    let gpus: Vec<u64> = w["allocation"]["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_u64().unwrap())
        .collect();
    assert_eq!(gpus.len(), 2, "{w}");

    let vision = s.browser();
    sign_in(&vision, &s.token("vision", "member").await).await;
    let path = format!("/console/workloads/{id}");
    let page = page_until(&vision, &path, |p| p.contains("id=\"gpus-table\"")).await;
    for g in &gpus {
        assert!(
            page.contains(&format!(
                "<tr><td>{node}</td><td class=\"num\">{g}</td><td>GPU</td><td class=\"num\">"
            )),
            "GPU {g} of {node}: {page}"
        );
    }
    assert!(text_of(&page, "gpus-note").starts_with("Sampled at"), "{page}");
    assert!(!page.contains("No telemetry reported"), "{page}");
    // Over time: at least this minute, with the range picker.
    assert!(page.contains("id=\"telemetry-summary\""), "{page}");
    assert!(
        page.contains(&format!("href=\"/console/workloads/{id}?range=7d#telemetry-h\"")),
        "{page}"
    );
    // The charts sit with the table of its GPUs, above the timeline and the logs, inside the
    // part of the page that refreshes (which keeps the chosen range).
    let at = |p: &str, what: &str| p.find(what).unwrap_or_else(|| panic!("{what} in {p}"));
    assert!(
        at(&page, "id=\"gpus-table\"") < at(&page, "id=\"telemetry-h\""),
        "{page}"
    );
    assert!(
        at(&page, "id=\"telemetry-h\"") < at(&page, "id=\"timeline-h\""),
        "{page}"
    );
    assert!(at(&page, "id=\"telemetry-h\"") < at(&page, "id=\"logs-h\""), "{page}");
    let week = vision.page(&format!("{path}?range=7d")).await;
    assert!(
        week.contains(&format!("hx-get=\"/console/workloads/{id}/live?range=7d\"")),
        "{week}"
    );
    let fragment = vision.page(&format!("{path}/live?range=7d")).await;
    assert!(fragment.starts_with("<div id=\"workload-live\""), "{fragment}");
    assert!(fragment.contains("id=\"telemetry-summary\""), "{fragment}");
    assert!(fragment.contains("the last 7 days"), "{fragment}");
    assert_eq!(
        vision.get(&format!("{path}/live?range=2y")).await.status(),
        StatusCode::UNPROCESSABLE_ENTITY
    );
    let data: Value = vision
        .get(&format!("/console/workloads/{id}/telemetry?format=json&range=1h"))
        .await
        .json()
        .await
        .unwrap();
    let util = data["utilisation_pct"].as_array().unwrap();
    assert!(!util.is_empty(), "{data}");
    assert!(
        util.iter().all(|u| u.as_f64().unwrap() > 0.0),
        "the simulator keeps them busy: {data}"
    );
    assert!(
        data["memory_mib"][0].as_u64().unwrap() >= data["memory_used_mib"][0].as_f64().unwrap() as u64,
        "{data}"
    );
    let csv = vision
        .page(&format!("/console/workloads/{id}/telemetry?range=24h"))
        .await;
    assert!(csv.starts_with("start_utc,minutes,workload,utilisation_pct"), "{csv}");
    assert!(csv.contains(&format!(",1,{id},")), "{csv}");
    // A share of a GPU: its own figures.
    let page = page_until(&vision, &format!("/console/workloads/{share}"), |p| {
        p.contains("id=\"gpus-table\"")
    })
    .await;
    assert!(page.contains("<td>share of the GPU</td>"), "{page}");
    // An unknown range is refused, as on the charts page.
    assert_eq!(
        vision.get(&format!("{path}?range=2y")).await.status(),
        StatusCode::UNPROCESSABLE_ENTITY
    );

    // A member of nlp: vision's workload is not found, page, fragment or numbers.
    let nlp = s.browser();
    sign_in(&nlp, &s.token("nlp", "member").await).await;
    for p in [
        path.clone(),
        format!("{path}?range=7d"),
        format!("{path}/live"),
        format!("{path}/telemetry"),
        format!("{path}/telemetry?format=json&range=1h"),
    ] {
        let r = nlp.get(&p).await;
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{p}");
        let body = r.text().await.unwrap();
        assert!(
            !body.contains("trainer")
                && !body.contains("utilisation")
                && !body.contains("gpus-table")
                && !body.contains("start_utc"),
            "{p}: {body}"
        );
    }
}

/// A store that refuses the telemetry the sampler writes (its table renamed away behind the
/// server's back, from another SQLite connection) stops neither the sampler nor the history:
/// the workload's telemetry is still shown from memory, and once the table is back the
/// sampler (which went on sampling every 100 ms here) stores its minutes again. About 3 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_refusing_telemetry_stops_neither_the_sampler_nor_the_history() {
    let parts = crate::support::Parts {
        sim: tessera_backend_sim::SimConfig {
            telemetry_interval: Duration::from_millis(200),
            ..tessera_backend_sim::SimConfig::default()
        },
        ..crate::support::Parts::default()
    };
    let s = TestServer::start_on("telemetry-store-down", parts, |c| ServerConfig {
        sample_every: Some(Duration::from_millis(100)),
        ..c
    })
    .await;
    vision_and_nlp(&s).await;
    let mut db = behind_the_server(&s).await;
    rename_table(&mut db, "telemetry_samples", "telemetry_gone").await;
    let id = submit(
        &s,
        json!({"tenant": "vision", "project": "train", "name": "trainer", "shape": {"gpus": 1, "pool": "training"}, "duration_s": 3600}),
    )
    .await;
    s.wait_state(id, &["running"]).await;
    let series = format!("workload:{id}");
    let stored = async |db: &mut sqlx::SqliteConnection, table: &str| -> i64 {
        let q = format!("SELECT COUNT(*) FROM {table} WHERE series = ?");
        sqlx::query_scalar(sqlx::AssertSqlSafe(q))
            .bind(&series)
            .fetch_one(db)
            .await
            .unwrap()
    };
    // Telemetry comes and the sampler's writes fail for a while.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(stored(&mut db, "telemetry_gone").await, 0, "nothing could be written");
    let vision = s.browser();
    sign_in(&vision, &s.token("vision", "member").await).await;
    let data: Value = vision
        .get(&format!("/console/workloads/{id}/telemetry?format=json&range=1h"))
        .await
        .json()
        .await
        .unwrap();
    assert!(!data["utilisation_pct"].as_array().unwrap().is_empty(), "{data}");

    // The table is back: the sampler, still running, stores the minute.
    rename_table(&mut db, "telemetry_gone", "telemetry_samples").await;
    let mut rows = 0;
    for _ in 0..100 {
        rows = stored(&mut db, "telemetry_samples").await;
        if rows > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(rows >= 1, "this minute, written once the store took it");
}

/// A console page whose store read fails answers the 5xx page for people: the store's table
/// behind the audit page is renamed away behind the server's back (SQLite, from another
/// connection), so the page's read fails as with a broken database. A browser gets the HTML
/// error page with the navigation, the server's real status (503, with Retry-After) and no
/// internal detail (no SQL, no table name, no problem JSON); an htmx request for the same page
/// still gets problem JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_whose_store_read_fails_is_the_5xx_page_with_navigation_and_no_internals() {
    let s = TestServer::start("err5xx").await;
    let admin = s.browser();
    sign_in(&admin, &s.admin).await;
    assert_eq!(admin.get("/console/audit").await.status(), StatusCode::OK);
    let mut db = behind_the_server(&s).await;
    rename_table(&mut db, "audit_log", "audit_log_gone").await;

    let r = admin.get("/console/audit").await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        r.headers()["content-type"].to_str().unwrap().starts_with("text/html"),
        "{:?}",
        r.headers()
    );
    assert_eq!(r.headers()["retry-after"], "1");
    let page = r.text().await.unwrap();
    no_inline_code(&page);
    assert!(
        page.contains("<nav aria-label=\"Console\">") && page.contains("href=\"/console/workloads\""),
        "{page}"
    );
    assert_eq!(text_of(&page, "error-h"), "Something went wrong", "{page}");
    assert!(
        text_of(&page, "error-detail").contains("the store is unavailable"),
        "{page}"
    );
    for internal in [
        "audit_log",
        "no such table",
        "SELECT",
        "sqlite",
        "application/problem+json",
        "\"status\":",
    ] {
        assert!(!page.contains(internal), "{internal} leaked: {page}");
    }

    let hx = admin
        .client
        .get(admin.url("/console/audit"))
        .header("hx-request", "true")
        .send()
        .await
        .unwrap();
    assert_eq!(hx.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(hx.headers()["content-type"], "application/problem+json");
    let problem: Value = hx.json().await.unwrap();
    assert_eq!(problem["status"], 503, "{problem}");
    assert!(!problem.to_string().contains("audit_log"), "{problem}");
}

/// The workload list's caption numbers its rows exactly and says of how many, counted by the
/// store within the caller's tenant: vision's member reads "of 52" with nlp's workloads
/// present; after five more workloads (three vision's, two nlp's) the same second-page link
/// numbers its rows by what now comes before them, not by the number the link carried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workload_lists_caption_counts_exactly_within_the_tenant() {
    let s = TestServer::start("list-count").await;
    vision_and_nlp(&s).await;
    let fraction = |tenant: &str, project: &str, name: String| json!({"tenant": tenant, "project": project, "name": name, "shape": {"fraction": 250}, "duration_s": 3600});
    for i in 0..52 {
        submit(&s, fraction("vision", "train", format!("v{i:02}"))).await;
    }
    for i in 0..4 {
        submit(&s, fraction("nlp", "p", format!("n{i}"))).await;
    }
    let member = s.browser();
    sign_in(&member, &s.token("vision", "member").await).await;
    let first = unescape(&member.page("/console/workloads").await);
    assert!(first.contains("<caption>Workloads 1–50 of 52;"), "{first}");
    let next = pager_link(&first, "next").expect("a next page");
    let second = unescape(&member.page(&next).await);
    assert!(second.contains("<caption>Workloads 51–52 of 52;"), "{second}");
    let rows = row_ids(&second);

    for i in 0..3 {
        submit(&s, fraction("vision", "train", format!("late{i}"))).await;
    }
    for i in 0..2 {
        submit(&s, fraction("nlp", "p", format!("late-n{i}"))).await;
    }
    let again = unescape(&member.page(&next).await);
    assert_eq!(row_ids(&again), rows, "the page after the cursor holds the same rows");
    assert!(again.contains("<caption>Workloads 54–55 of 55;"), "{again}");
    // A filter is counted too: nlp's member counts nlp's six, the admin all 61.
    let nlp = s.browser();
    sign_in(&nlp, &s.token("nlp", "member").await).await;
    let theirs = unescape(&nlp.page("/console/workloads").await);
    assert!(theirs.contains("<caption>Workloads 1–6 of 6;"), "{theirs}");
    let admin = s.browser();
    sign_in(&admin, &s.admin).await;
    let all = unescape(&admin.page("/console/workloads").await);
    assert!(all.contains("<caption>Workloads 1–50 of 61;"), "{all}");
    let vision_only = unescape(&admin.page("/console/workloads?tenant=vision").await);
    assert!(vision_only.contains("<caption>Workloads 1–50 of 55;"), "{vision_only}");
}

/// A connection of its own to the SQLite database of `s`, to change it behind the server's back.
async fn behind_the_server(s: &TestServer) -> sqlx::SqliteConnection {
    use sqlx::Connection;
    let file = s.dir.0.join(tessera_store_sqlite::DB_FILE);
    sqlx::SqliteConnection::connect(&format!("sqlite://{}", file.display()))
        .await
        .unwrap()
}

/// Renames table `from` to `to` on `db`.
async fn rename_table(db: &mut sqlx::SqliteConnection, from: &str, to: &str) {
    sqlx::query(sqlx::AssertSqlSafe(format!("ALTER TABLE {from} RENAME TO {to}")))
        .execute(db)
        .await
        .unwrap();
}
