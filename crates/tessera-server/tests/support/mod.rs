//! Set-up shared by the integration tests of `tessera-server` (each test file that needs it says
//! `mod support;`):
//!
//! * a temporary directory removed on drop ([`TempDir`]);
//! * a server started on one, with its admin token, a client and JSON calls made with that
//!   token or another ([`TestServer`]): tenants with a project, tokens for roles, waiting for a
//!   workload's state, the metrics text;
//! * polling until a condition holds ([`poll`]);
//! * a browser for the console that keeps cookies and does not follow redirects ([`Browser`]);
//! * for the tests that drive the lifecycle loop directly: a workload spec, its creation by the
//!   platform admin, and the scheduler factory ([`workload_spec`], [`new_workload`],
//!   [`sched_factory`]).

// Every test binary compiles this module on its own and uses only part of it.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::HeaderMap;
use reqwest::{Client, Method, RequestBuilder, Response, StatusCode};
use serde_json::{Value, json};
use tessera_backend_sim::{SimBackend, SimConfig, SimGpu};
use tessera_domain::{GpuSpec, Kind, ShapeSpec, WorkloadSpec};
use tessera_model::Fleet;
use tessera_sched::Engine;
use tessera_sched::cycle::{GovernConfig, Scheduler};
use tessera_server::lifecycle::{Lifecycle, NewWorkload, SchedFactory, Settings, placement};
use tessera_server::{Running, ServerConfig, start};
use tessera_store::Store;
use tessera_store_postgres::PgStore;
use tessera_store_sqlite::SqliteStore;

pub use tessera_testdb::TempDir;

/// One answer: status, headers and the body (JSON when it parses, else the text as a string).
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
}

/// Sends `rb` and reads the whole answer.
pub async fn send(rb: RequestBuilder) -> Reply {
    let r = rb.send().await.unwrap();
    let (status, headers) = (r.status(), r.headers().clone());
    let text = r.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Reply { status, headers, body }
}

/// Sends `rb`: the answer's text.
pub async fn text(rb: RequestBuilder) -> String {
    rb.send().await.unwrap().text().await.unwrap()
}

/// What a test server runs on besides its configuration: the choices the `tessera` binary
/// makes for a real server (which store, which backend).
#[derive(Clone, Debug, Default)]
pub struct Parts {
    /// A PostgreSQL database; `None`: SQLite in the data directory.
    pub database: Option<String>,
    /// The simulated backend's settings.
    pub sim: SimConfig,
}

impl Parts {
    /// On `database` (`None`: SQLite), with the simulated backend's defaults.
    pub fn on(database: Option<String>) -> Parts {
        Parts {
            database,
            ..Parts::default()
        }
    }
}

/// The store `database` names (PostgreSQL), or SQLite in `dir`.
pub async fn open_store(dir: &std::path::Path, database: Option<&str>) -> Arc<dyn Store> {
    match database {
        Some(url) => Arc::new(PgStore::connect(url).await.unwrap()),
        None => Arc::new(SqliteStore::open_dir(dir).await.unwrap()),
    }
}

/// Starts a server on `cfg` with the store and the simulated backend `parts` name, as the
/// binary composes them; the simulated backend is returned for fault injection.
pub async fn serve(cfg: ServerConfig, parts: &Parts) -> (Running, Arc<SimBackend>) {
    let store = open_store(&cfg.data_dir, parts.database.as_deref()).await;
    let sim = Arc::new(SimBackend::new(parts.sim.clone(), SimGpu::for_fleet(&cfg.fleet)));
    let running = start(cfg, store, sim.clone()).await.unwrap();
    (running, sim)
}

/// A server started on a temporary data directory (the seed fleet and the simulated backend
/// unless the configuration says otherwise), with the admin token its first start created.
pub struct TestServer {
    pub running: Running,
    /// Its simulated backend (fault injection).
    pub sim: Arc<SimBackend>,
    /// `http://` and the address it listens on.
    pub base: String,
    /// The platform admin's token.
    pub admin: String,
    /// The store and backend it runs on (a restart runs on the same).
    pub parts: Parts,
    /// The PostgreSQL database, when the server runs on one.
    pub database: Option<String>,
    pub http: Client,
    /// Shared with the servers [`Self::restart`] starts on it; removed when the last is dropped.
    pub dir: Arc<TempDir>,
}

impl TestServer {
    /// A server on `ServerConfig::local`, its data in `TempDir::new(tag)`.
    pub async fn start(tag: &str) -> TestServer {
        Self::start_with(tag, |c| c).await
    }

    /// A server on `cfg(ServerConfig::local(…))`, SQLite and the simulated backend.
    pub async fn start_with(tag: &str, cfg: impl FnOnce(ServerConfig) -> ServerConfig) -> TestServer {
        Self::start_on(tag, Parts::default(), cfg).await
    }

    /// A server on `cfg(ServerConfig::local(…))` and `parts`.
    pub async fn start_on(tag: &str, parts: Parts, cfg: impl FnOnce(ServerConfig) -> ServerConfig) -> TestServer {
        let dir = Arc::new(TempDir::new(tag));
        let cfg = cfg(ServerConfig::local(dir.0.clone()));
        let (running, sim) = serve(cfg, &parts).await;
        let admin = running
            .admin_token
            .clone()
            .expect("first start creates the admin token");
        TestServer {
            base: format!("http://{}", running.addr),
            admin,
            database: parts.database.clone(),
            parts,
            http: Client::new(),
            running,
            sim,
            dir,
        }
    }

    /// Another server on this one's data directory and database, as after a restart, on
    /// `cfg(…)`; it is called with this one's admin token.
    pub async fn restart(&self, cfg: impl FnOnce(ServerConfig) -> ServerConfig) -> TestServer {
        let (running, sim) = serve(cfg(ServerConfig::local(self.dir.0.clone())), &self.parts).await;
        TestServer {
            base: format!("http://{}", running.addr),
            admin: self.admin.clone(),
            parts: self.parts.clone(),
            database: self.database.clone(),
            http: Client::new(),
            running,
            sim,
            dir: self.dir.clone(),
        }
    }

    /// The URL of `path` on this server.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A request for `path` with `token` as its bearer token (none: anonymous).
    pub fn request(&self, token: Option<&str>, m: Method, path: &str) -> RequestBuilder {
        let rb = self.http.request(m, self.url(path));
        match token {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        }
    }

    /// `m path` with `token` (none: anonymous) and `body` as JSON.
    pub async fn reply_as(&self, token: Option<&str>, m: Method, path: &str, body: Option<Value>) -> Reply {
        let mut rb = self.request(token, m, path);
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        send(rb).await
    }

    /// [`Self::reply_as`] the platform admin.
    pub async fn reply(&self, m: Method, path: &str, body: Option<Value>) -> Reply {
        self.reply_as(Some(&self.admin), m, path, body).await
    }

    /// [`Self::reply_as`]: the status and the body.
    pub async fn call_as(
        &self,
        token: Option<&str>,
        m: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let r = self.reply_as(token, m, path, body).await;
        (r.status, r.body)
    }

    /// [`Self::call_as`] the platform admin.
    pub async fn call(&self, m: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        self.call_as(Some(&self.admin), m, path, body).await
    }

    /// `POST path` with `body`, as the platform admin.
    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, path, Some(body)).await
    }

    /// `PUT path` with `body`, as the platform admin.
    pub async fn put(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::PUT, path, Some(body)).await
    }

    /// `GET path` as the platform admin, which must answer 200: the body.
    pub async fn get(&self, path: &str) -> Value {
        let (st, v) = self.call(Method::GET, path, None).await;
        assert_eq!(st, StatusCode::OK, "{path}: {v}");
        v
    }

    /// A call of the platform admin that must succeed: the body.
    pub async fn ok(&self, m: Method, path: &str, body: Option<Value>) -> Value {
        let (st, v) = self.call(m, path, body).await;
        assert!(st.is_success(), "{path}: {st} {v}");
        v
    }

    /// Creates `tenant` with one project, `project`.
    pub async fn tenant_with_project(&self, tenant: &str, project: &str) {
        self.ok(Method::POST, "/api/v1/tenants", Some(json!({"name": tenant})))
            .await;
        self.ok(
            Method::POST,
            &format!("/api/v1/tenants/{tenant}/projects"),
            Some(json!({"name": project})),
        )
        .await;
    }

    /// The secret of a new token of `tenant` with `role`.
    pub async fn token(&self, tenant: &str, role: &str) -> String {
        let t = self
            .ok(
                Method::POST,
                "/api/v1/tokens",
                Some(json!({"tenant": tenant, "role": role})),
            )
            .await;
        t["token"].as_str().unwrap().to_string()
    }

    /// Polls workload `id` until its state is one of `states` (10 s at most).
    pub async fn wait_state(&self, id: u64, states: &[&str]) -> Value {
        let path = format!("/api/v1/workloads/{id}");
        let reached = |w: &Value| states.contains(&w["state"].as_str().unwrap_or_default());
        let w = poll(400, Duration::from_millis(25), async || self.get(&path).await, reached).await;
        assert!(reached(&w), "workload {id} never reached {states:?}: {w}");
        w
    }

    /// `/metrics`, read with the admin token.
    pub async fn metrics(&self) -> String {
        text(self.request(Some(&self.admin), Method::GET, "/metrics")).await
    }

    /// A new browser on this server.
    pub fn browser(&self) -> Browser {
        Browser::new(&self.base)
    }
}

/// Calls `f` up to `tries` times, `every` apart, until `done` holds for its answer; returns
/// that answer, or the last one (for the caller to assert on).
pub async fn poll<T>(tries: u32, every: Duration, mut f: impl AsyncFnMut() -> T, done: impl Fn(&T) -> bool) -> T {
    let mut last = f().await;
    for _ in 1..tries {
        if done(&last) {
            return last;
        }
        tokio::time::sleep(every).await;
        last = f().await;
    }
    last
}

/// A browser: keeps cookies, and follows no redirect, so that a test sees each step.
pub struct Browser {
    pub client: Client,
    /// Where relative paths go.
    pub base: String,
}

impl Browser {
    pub fn new(base: &str) -> Browser {
        Browser {
            client: Client::builder()
                .cookie_store(true)
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            base: base.to_string(),
        }
    }

    /// The URL of `path` on the server.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Response {
        self.client.get(self.url(path)).send().await.unwrap()
    }

    /// The text of the page at `path`.
    pub async fn page(&self, path: &str) -> String {
        self.get(path).await.text().await.unwrap()
    }

    /// `POST path` without a body, with the session's CSRF token if any.
    pub async fn post(&self, path: &str, csrf: Option<&str>) -> Response {
        with_csrf(self.client.post(self.url(path)), csrf).send().await.unwrap()
    }

    /// `POST path` with a form, and the session's CSRF token if any.
    pub async fn post_form<F: serde::Serialize + ?Sized>(&self, path: &str, form: &F, csrf: Option<&str>) -> Response {
        with_csrf(self.client.post(self.url(path)).form(form), csrf)
            .send()
            .await
            .unwrap()
    }
}

/// `rb` with the `X-CSRF-Token` header, if there is a token.
pub fn with_csrf(rb: RequestBuilder, csrf: Option<&str>) -> RequestBuilder {
    match csrf {
        Some(c) => rb.header("x-csrf-token", c),
        None => rb,
    }
}

/// A batch workload `name` of tenant `vision`'s project `train`, with 1 CPU and 1 GiB.
pub fn workload_spec(
    name: &str,
    gpu: GpuSpec,
    pool: Option<&str>,
    duration_s: Option<u64>,
    priority: &str,
) -> WorkloadSpec {
    WorkloadSpec {
        tenant: "vision".into(),
        project: "train".into(),
        name: name.into(),
        kind: Kind::Batch,
        shape: ShapeSpec {
            gpu,
            models: vec![],
            pool: pool.map(str::to_string),
        },
        cpu_milli: 1000,
        memory_mib: 1024,
        duration_s,
        command: None,
        image: None,
        env: Default::default(),
        priority: priority.into(),
        no_wait: false,
        no_requeue: false,
        movable: None,
        native: None,
    }
}

/// The creation of `spec` on `fleet` by the platform admin `tok-test`.
pub fn new_workload(fleet: &Fleet, spec: WorkloadSpec) -> NewWorkload {
    NewWorkload {
        request: placement::engine_request(fleet, &spec.shape, spec.cpu_milli, spec.memory_mib).unwrap(),
        spec,
        actor: "tok-test".into(),
        role: "platform-admin".into(),
        idempotency: None,
        received_at: tessera_server::now_ms(),
        audit: None,
    }
}

/// Schedulers of the `tessera` policy on the fleet they are given, governed by `govern`.
pub fn sched_factory(govern: GovernConfig) -> SchedFactory {
    Arc::new(move |fleet: Arc<Fleet>| {
        let p = tessera_sched::replay::make_policy("tessera", &[]).unwrap();
        Scheduler::new(Engine::new(fleet, p, 1), govern.clone())
    })
}

/// Starts a lifecycle loop on `fleet` as the server's tests want one that restarts and
/// reconciles quickly: a 1 s grace, a reconcile every 500 ms, metrics of its own.
pub async fn start_loop(
    fleet: Arc<Fleet>,
    govern: GovernConfig,
    store: Arc<dyn Store>,
    backend: Arc<dyn tessera_backend::Backend>,
) -> Lifecycle {
    let settings = Settings {
        grace: Duration::from_secs(1),
        reconcile_every: Duration::from_millis(500),
        ..Default::default()
    };
    let metrics = Arc::new(tessera_server::metrics::Metrics::new());
    tessera_server::lifecycle::start(fleet, sched_factory(govern), store, backend, settings, metrics)
        .await
        .unwrap()
}
