//! # tessera-server
//!
//! Tessera's control plane:
//!
//! * [`lifecycle`]: the loop that drives every request from `requested` to `released` — the
//!   scheduler (`tessera-sched`) decides, the pure lifecycle (`tessera-domain`) says what that
//!   means for the workload, the store (`tessera-store`) makes it durable in one transaction
//!   per batch, the backend (`tessera-backend`) carries it out — and publishes what readers see;
//! * [`http`]: the REST API under `/api/v1` (OpenAPI 3.1 at `/api/v1/openapi.json`, RFC 7807
//!   problems), reading from the published snapshot and the store;
//! * identities ([`auth`]: API tokens, [`oidc`]: single sign-on, [`session`]: the console's
//!   sign-in; [`admin`]: the first admin token and local recovery), the request middleware
//!   (`tower-http` for request IDs, CORS, security headers and the body limit; [`audit`]: the
//!   caller, rate limits and the audit log), [`metrics`] and [`usage`] reports;
//! * replicas ([`replica`]): on PostgreSQL any number of servers share the database, elect a
//!   leader that alone runs the loop, and followers forward writes to it ([`forward`]);
//!   `/healthz` and `/readyz` for probes; [`timed`] times every store operation;
//! * the web console ([`console`]: server-rendered pages, assets embedded in the binary).
//!
//! The server depends on the contracts only: [`start`] takes a `tessera_store::Store` and a
//! `tessera_backend::Backend` as trait objects, and which store (SQLite, PostgreSQL) and which
//! backend (simulated, `local`, Kubernetes) is decided by the `tessera` binary that composes
//! them. What only a simulated backend offers (fault injection, simulated node upgrades) is
//! reached through `Backend::simulated`.

pub mod admin;
pub mod audit;
pub mod auth;
pub mod clock;
pub mod console;
pub mod forward;
pub mod history;
pub mod http;
pub mod lifecycle;
pub mod metrics;
pub mod native;
pub mod oidc;
pub mod problem;
pub mod refusals;
pub mod replica;
pub mod scrape;
pub mod services;
pub mod session;
pub mod state;
pub mod tenancy_cache;
pub mod tenancy_sync;
pub mod timed;
pub mod usage;
pub mod workload_history;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow};
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderName, HeaderValue, Method, Uri, header};
use axum::routing::get;
use tessera_backend::Backend;
use tessera_model::Fleet;
use tessera_sched::Engine;
use tessera_sched::cycle::{GovernConfig, Scheduler};
use tessera_store::Store;
use tokio::net::TcpListener;

use crate::auth::Authenticator;
use crate::problem::ApiError;

/// How long a replica sharing its database trusts a token it looked up: a revocation through
/// another replica takes effect here within this.
pub const AUTH_CACHE_TTL: Duration = Duration::from_secs(2);

pub use clock::now_ms;
pub use problem::BODY_LIMIT;
pub use state::AppState;

/// How to run the server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Where the admin token is written.
    pub data_dir: PathBuf,
    pub fleet: Fleet,
    pub listen: SocketAddr,
    /// Shared-pool placement policy.
    pub policy: String,
    /// Grace period for stopping workloads.
    pub grace: Duration,
    /// How often the backend is reconciled with what Tessera expects.
    pub reconcile_every: Duration,
    /// What happens to running work on a GPU that failed.
    pub on_gpu_failure: lifecycle::GpuFailurePolicy,
    /// The length of a simulated node upgrade in a rollout; `None`: rollouts wait for
    /// `tessera node done NODE`.
    pub sim_upgrade: Option<Duration>,
    /// Priority classes, minimum runtime, fair-share half-life, backfill window.
    pub govern: GovernConfig,
    /// Multi-node gangs go before single-node work, across tenants (the queue order of the
    /// rules for gangs, `cycle::gang_rules_order`, with `GovernConfig::with_gang_rules`;
    /// `serve --gang-rules on`).
    pub gangs_first: bool,
    /// Price per GPU-unit-hour by resource class, for usage reports.
    pub prices: usage::Prices,
    /// Requests per second allowed per API token (bursts of twice that); 0 = no limit.
    pub rate_limit: f64,
    /// Single sign-on: accept the provider's JWT access tokens.
    pub oidc: Option<oidc::OidcConfig>,
    /// Serve HTTPS with this certificate chain and private key (PEM files).
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Origins (`https://portal.example.com`) whose pages may call the API from a browser
    /// (CORS); empty: the same-origin console only.
    pub cors_origins: Vec<String>,
    /// The URL other replicas reach this one at (default: the scheme and the bound address).
    pub advertise_url: Option<String>,
    /// This replica's id (default: the host name and a random suffix).
    pub replica_id: Option<String>,
    /// Leader election timing (PostgreSQL).
    pub ha: replica::HaSettings,
    /// Serve the admission webhook ([`native`]) over HTTPS on a listener of its own.
    pub admission: Option<AdmissionListener>,
    /// How often the console's history is sampled ([`history::spawn`]): `None`, every minute
    /// on the minute; a test's shorter period, so that it need not wait minutes (each sample
    /// is still of its minute: the first stored of a minute is kept).
    pub sample_every: Option<Duration>,
}

/// Where the admission webhook listens, and its serving certificate (PEM files; the API
/// server verifies it against the webhook configuration's `caBundle`).
#[derive(Clone, Debug)]
pub struct AdmissionListener {
    pub addr: SocketAddr,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Largest admission review accepted: a pod with its managed fields, and its old object.
pub const ADMISSION_BODY_LIMIT: usize = 4 * 1024 * 1024;

impl ServerConfig {
    /// The embedded defaults on `data_dir`: the seed fleet, any free loopback port, the
    /// `tessera` policy, no rate limit, no single sign-on, no TLS.
    pub fn local(data_dir: PathBuf) -> Self {
        ServerConfig {
            data_dir,
            fleet: Fleet::seed(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            policy: "tessera".into(),
            grace: Duration::from_secs(1),
            reconcile_every: Duration::from_secs(30),
            on_gpu_failure: lifecycle::GpuFailurePolicy::Leave,
            sim_upgrade: None,
            govern: GovernConfig::default(),
            gangs_first: false,
            prices: usage::Prices::default(),
            rate_limit: 0.0,
            oidc: None,
            tls: None,
            cors_origins: Vec::new(),
            advertise_url: None,
            replica_id: None,
            ha: replica::HaSettings::default(),
            admission: None,
            sample_every: None,
        }
    }
}

/// A started server.
pub struct Running {
    pub addr: SocketAddr,
    /// The admin token, when this start created it.
    pub admin_token: Option<String>,
    pub task: tokio::task::JoinHandle<std::io::Result<()>>,
    /// A router serving only `/metrics`, for [`serve_metrics`] on a port of its own.
    pub metrics_app: axum::Router,
    /// This replica.
    pub replica: Arc<replica::Replica>,
    /// Its supervisor: ends after Ctrl-C, once it has stepped down and released the lease.
    pub replica_task: tokio::task::JoinHandle<()>,
    /// Where the admission webhook listens, when it has a listener of its own.
    pub admission_addr: Option<SocketAddr>,
    /// The handle to the lifecycle loop (a test on a paused clock waits on
    /// [`lifecycle::Lifecycle::settled`] after each step).
    pub lifecycle: lifecycle::Lifecycle,
}

/// Serves `/metrics` alone on `addr` (`tessera serve --metrics-listen`); returns the bound
/// address and the server task.
pub async fn serve_metrics(
    app: axum::Router,
    addr: SocketAddr,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>)> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} for metrics"))?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        axum::serve(listener, app.into_make_service())
            .with_graceful_shutdown(shutdown_signal())
            .await
    });
    Ok((bound, task))
}

/// The full HTTP application: API, OpenAPI document, console, `/metrics` (for metrics
/// tokens). Around every route, outermost first: CORS (answers preflights), request IDs (an
/// incoming one kept if plain, else a new one; echoed), security headers, errors made problem
/// documents, API metrics, the audit middleware (caller, rate limit, audit record), the body
/// limit.
pub fn app(state: AppState, cors_origins: &[HeaderValue]) -> axum::Router {
    use tower_http::request_id::{PropagateRequestIdLayer, SetRequestIdLayer};
    use tower_http::set_header::SetResponseHeaderLayer as Set;
    let (api, doc) = http::router(state.backend.simulated().is_some(), &state.priorities);
    let doc_json = doc.to_string();
    let stack = tower::ServiceBuilder::new()
        .layer(cors(cors_origins))
        .layer(axum::middleware::map_request(audit::drop_unsafe_request_id))
        .layer(SetRequestIdLayer::new(audit::X_REQUEST_ID, audit::MakeId))
        .layer(PropagateRequestIdLayer::new(audit::X_REQUEST_ID))
        .layer(Set::overriding(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")))
        .layer(Set::overriding(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")))
        .layer(Set::overriding(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")))
        // Hashed console assets say how long they may be cached; everything else is no-store.
        .layer(Set::if_not_present(header::CACHE_CONTROL, HeaderValue::from_static("no-store")))
        .layer(Set::if_not_present(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(
                "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
            ),
        ))
        .layer(axum::middleware::map_response(problem::ensure_problem))
        .layer(axum::middleware::from_fn_with_state(state.clone(), scrape::track))
        .layer(axum::middleware::from_fn_with_state(state.clone(), audit::middleware))
        .layer(tower_http::limit::RequestBodyLimitLayer::new(BODY_LIMIT))
        .layer(DefaultBodyLimit::disable());
    axum::Router::new()
        .route("/auth/login", get(session::login))
        .route("/auth/callback", get(session::callback))
        .route("/auth/session", get(session::whoami))
        .route("/auth/logout", axum::routing::post(session::logout))
        .route(
            "/api/v1/openapi.json",
            get(move || {
                let d = doc_json.clone();
                async move { ([(header::CONTENT_TYPE, "application/json")], d) }
            }),
        )
        .route("/metrics", get(scrape::scrape_authorised))
        .route("/healthz", get(http::system::healthz))
        .route("/readyz", get(http::system::readyz))
        .route("/admission/mutate", axum::routing::post(native::mutate))
        .route("/admission/validate", axum::routing::post(native::validate))
        .merge(api)
        .merge(console::router(&state))
        .fallback(not_found)
        .layer(stack)
        // Outermost: a follower's writes go to the leader before anything else looks at them.
        .layer(axum::middleware::from_fn_with_state(state.clone(), forward::middleware))
        .with_state(state)
}

/// The CORS policy: browsers may call the API from the listed origins only (bearer tokens, no
/// cookies); with none listed, only the console, which is same-origin, can. Preflight requests
/// are answered here, with or without permission.
fn cors(origins: &[HeaderValue]) -> tower_http::cors::CorsLayer {
    use tower_http::cors::{AllowOrigin, CorsLayer};
    CorsLayer::new()
        .allow_origin(AllowOrigin::list(origins.iter().cloned()))
        .allow_methods([Method::GET, Method::POST, Method::PUT, Method::DELETE])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            HeaderName::from_static("idempotency-key"),
            audit::X_REQUEST_ID,
        ])
        .expose_headers([audit::X_REQUEST_ID, header::RETRY_AFTER])
        .max_age(Duration::from_secs(600))
}

/// Checks `--cors-origin` values: `scheme://host[:port]`, no path, no wildcard.
pub fn parse_cors_origins(origins: &[String]) -> anyhow::Result<Vec<HeaderValue>> {
    origins
        .iter()
        .map(|o| {
            let uri: Uri = o.parse().with_context(|| format!("--cors-origin {o}: not a URL"))?;
            let plain = matches!(uri.scheme_str(), Some("http" | "https"))
                && uri.host().is_some()
                && uri.path_and_query().is_none_or(|p| p.as_str() == "/" || p.as_str().is_empty())
                && !o.ends_with('/');
            if !plain {
                return Err(anyhow!(
                    "--cors-origin {o}: give an origin such as https://portal.example.com (scheme, host, optional port; no path)"
                ));
            }
            HeaderValue::from_str(o).with_context(|| format!("--cors-origin {o}"))
        })
        .collect()
}

/// The OpenAPI document of a server on the embedded default (the simulated backend, the
/// default priority classes), without starting one.
pub fn openapi() -> serde_json::Value {
    let classes: Vec<String> = GovernConfig::default().classes.iter().map(|c| c.name.clone()).collect();
    let (_, mut doc) = http::router(true, &classes);
    doc["info"]["version"] = env!("CARGO_PKG_VERSION").into();
    doc
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::not_found(format!(
        "no route {}; the API lives under /api/v1 (see /api/v1/openapi.json)",
        uri.path()
    ))
}

/// Serves on `store` and `backend`, which the caller chose and opened (the `tessera` binary
/// decides which store and which backend; the server knows only their contracts): creates the
/// admin token on first start, rebuilds state (or, on a store replicas share, joins the
/// election), and serves.
pub async fn start(cfg: ServerConfig, store: Arc<dyn Store>, backend: Arc<dyn Backend>) -> anyhow::Result<Running> {
    let cors_origins = parse_cors_origins(&cfg.cors_origins)?;
    let metrics = Arc::new(metrics::Metrics::new());
    let shared = store.shared();
    // The admin token is written there, whichever the store.
    std::fs::create_dir_all(&cfg.data_dir).with_context(|| format!("cannot create {}", cfg.data_dir.display()))?;
    let tenancy_cache = Arc::new(tenancy_cache::TenancyCache::default());
    let store: Arc<dyn Store> = Arc::new(timed::TimedStore::new(store, metrics.clone(), tenancy_cache.clone()));
    let admin_token = admin::bootstrap(store.as_ref(), &cfg.data_dir).await?;
    let fleet = Arc::new(cfg.fleet);
    tessera_sched::replay::make_policy(&cfg.policy, &[]).map_err(|e| anyhow!(e))?;
    let factory: lifecycle::SchedFactory = {
        let (policy, govern, gangs_first) = (cfg.policy.clone(), cfg.govern.clone(), cfg.gangs_first);
        Arc::new(move |fleet: Arc<Fleet>| {
            let p = tessera_sched::replay::make_policy(&policy, &[]).expect("policy name checked at start");
            let s = Scheduler::new(Engine::new(fleet.clone(), p, 1), govern.clone());
            if gangs_first {
                s.with_plugins(tessera_sched::cycle::plugins::Plugins {
                    queue_order: Box::new(tessera_sched::cycle::gang_rules_order()),
                    ..Default::default()
                })
            } else {
                s
            }
        })
    };
    let listener = TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("cannot listen on {}", cfg.listen))?;
    let addr = listener.local_addr()?;
    let url = match cfg.advertise_url.clone() {
        Some(u) => u.trim_end_matches('/').to_string(),
        None => {
            let scheme = if cfg.tls.is_some() { "https" } else { "http" };
            if shared && addr.ip().is_unspecified() {
                tracing::warn!(%addr, "listening on every address: set --advertise-url so that other replicas can forward writes here");
            }
            let host = if addr.ip().is_unspecified() {
                SocketAddr::from(([127, 0, 0, 1], addr.port()))
            } else {
                addr
            };
            format!("{scheme}://{host}")
        }
    };
    let replica = Arc::new(replica::Replica::new(
        cfg.replica_id.clone().unwrap_or_else(replica::new_id),
        url,
        shared,
    ));
    let lifecycle = lifecycle::Lifecycle::new(fleet.clone());
    let (native_tx, native_rx) = tokio::sync::mpsc::unbounded_channel();
    if let Some(events) = backend.take_events() {
        lifecycle.forward_backend_events(events, Some(native_tx));
    }
    let loop_cfg = lifecycle::LoopConfig {
        factory,
        store: store.clone(),
        backend: backend.clone(),
        settings: lifecycle::Settings {
            grace: cfg.grace,
            reconcile_every: cfg.reconcile_every,
            on_gpu_failure: cfg.on_gpu_failure,
            sim_upgrade: cfg.sim_upgrade,
        },
        metrics: metrics.clone(),
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
        // Keep the sender: a closed channel would read as a change to the supervisor.
        std::future::pending::<()>().await;
    });
    let supervisor = replica::Supervisor {
        replica: replica.clone(),
        lifecycle: lifecycle.clone(),
        cfg: loop_cfg.clone(),
        settings: cfg.ha.clone(),
        metrics: metrics.clone(),
        shutdown: stop_rx,
    };
    let started = std::time::Instant::now();
    let replica_task = if shared {
        let task = tokio::spawn(supervisor.run());
        // Serve once the first round is done: leading (state rebuilt), or following.
        replica.settled(Duration::from_secs(60)).await;
        task
    } else {
        let leading = lifecycle.lead(&loop_cfg, None).await.map_err(|e| anyhow!(e))?;
        supervisor.lead_alone();
        tokio::spawn(supervisor.run_alone(leading))
    };
    let st = replica.state();
    tracing::info!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        replica = %replica.id,
        role = %st.role,
        leader = ?st.leader_url,
        "state rebuilt"
    );
    let claim_rules = cfg.oidc.as_ref().map(|o| o.mapping.clone()).unwrap_or_default();
    let tenancy = Arc::new(tokio::sync::Notify::new());
    if backend.simulated().is_none() {
        // A backend on real machines (local, kubernetes) may keep tenancy of its own.
        tenancy_sync::spawn(
            store.clone(),
            backend.clone(),
            lifecycle.fleet_cell().clone(),
            claim_rules,
            cfg.reconcile_every,
            tenancy.clone(),
        );
    }
    let oidc = match cfg.oidc {
        Some(o) => Some(oidc::OidcVerifier::discover(o).await.map_err(|e| anyhow!(e))?),
        None => None,
    };
    let auth = Arc::new(if shared {
        Authenticator::new(store.clone(), oidc).with_cache_ttl(AUTH_CACHE_TTL)
    } else {
        Authenticator::new(store.clone(), oidc)
    });
    // Replicas sharing a database hear of each other's revocations at once (PostgreSQL
    // LISTEN/NOTIFY) and forget their cached identities; the cache's TTL stays as the bound
    // when the news cannot be had.
    if shared && let Some(mut news) = store.revocations().await {
        let auth = auth.clone();
        tokio::spawn(async move {
            while news.recv().await.is_some() {
                auth.invalidate();
            }
        });
    }
    let state = AppState::new(state::Shared {
        store: store.clone(),
        fleet_cell: lifecycle.fleet_cell().clone(),
        lifecycle: lifecycle.clone(),
        // Most important first (the order the scheduler takes a tenant's jobs in).
        priorities: Arc::new({
            let mut classes: Vec<_> = cfg.govern.classes.iter().collect();
            classes.sort_by_key(|c| c.rank);
            classes.into_iter().map(|c| c.name.clone()).collect()
        }),
        auth,
        audit: audit::AuditLog::start(store),
        backend_name: backend.name(),
        backend: backend.clone(),
        prices: Arc::new(cfg.prices),
        limiter: Arc::new(audit::RateLimiter::new(cfg.rate_limit, cfg.rate_limit * 2.0)),
        sessions: Arc::new(session::Sessions::new(cfg.tls.is_some())),
        tenancy_cache,
        obs: Arc::new(scrape::Observability {
            metrics,
            version: env!("CARGO_PKG_VERSION"),
        }),
        replica: replica.clone(),
        forward: forward::client(),
        tenancy,
        registry: tessera_imagepolicy::RegistryClient::default(),
        history: history::new(),
        workload_history: Arc::default(),
        refusals: Arc::default(),
    });
    history::spawn(state.clone(), cfg.sample_every);
    native::spawn_intake(state.clone(), native_rx);
    let metrics_app = scrape::router(state.clone());
    let admission_addr = match &cfg.admission {
        Some(a) => {
            let listener = TcpListener::bind(a.addr)
                .await
                .with_context(|| format!("cannot listen on {} for the admission webhook", a.addr))?;
            let bound = listener.local_addr()?;
            let acceptor = tls_acceptor(&a.cert, &a.key)?;
            tokio::spawn(serve_tls(
                listener,
                admission_app(state.clone()).with_state(()),
                acceptor,
            ));
            Some(bound)
        }
        None => None,
    };
    // Every route turned into its service once, here, rather than for each connection (what
    // `axum::serve` does with a plain `Router`: a copy of the whole route table, about 0.3 ms
    // of CPU per connection with the console's routes) or each request (TLS).
    let app = app(state, &cors_origins).with_state(());
    let task = match &cfg.tls {
        None => tokio::spawn(async move {
            axum::serve(listener, app.into_make_service())
                .with_graceful_shutdown(shutdown_signal())
                .await
        }),
        Some((cert, key)) => {
            let acceptor = tls_acceptor(cert, key)?;
            tokio::spawn(serve_tls(listener, app, acceptor))
        }
    };
    Ok(Running {
        addr,
        admin_token,
        task,
        metrics_app,
        replica,
        replica_task,
        admission_addr,
        lifecycle,
    })
}

/// The admission webhook alone (its own listener): the API server's reviews, no API tokens.
fn admission_app(state: AppState) -> axum::Router {
    axum::Router::new()
        .route("/admission/mutate", axum::routing::post(native::mutate))
        .route("/admission/validate", axum::routing::post(native::validate))
        .route("/healthz", get(http::system::healthz))
        .layer(tower_http::limit::RequestBodyLimitLayer::new(ADMISSION_BODY_LIMIT))
        .layer(DefaultBodyLimit::disable())
        .with_state(state)
}

/// Loads a PEM certificate chain and key into a TLS acceptor (TLS 1.2 and 1.3, HTTP/2 and 1.1).
fn tls_acceptor(cert: &std::path::Path, key: &std::path::Path) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("--tls-cert {}", cert.display()))?;
    if certs.is_empty() {
        return Err(anyhow!("--tls-cert {}: no certificate in the file", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key).with_context(|| format!("--tls-key {}", key.display()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("TLS certificate and key do not fit together")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Serves `app` over TLS until Ctrl-C.
/// Resolves at the first request to stop: Ctrl-C (SIGINT) or SIGTERM, what systemd and
/// Kubernetes send. Either shuts down gracefully: a leader steps down and releases its lease at
/// once, so a follower takes over without waiting for the lease to expire.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C shuts down gracefully");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

async fn serve_tls(
    listener: TcpListener,
    app: axum::Router,
    acceptor: tokio_rustls::TlsAcceptor,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::service::TowerToHyperService;
    let stop = shutdown_signal();
    tokio::pin!(stop);
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => r?,
            _ = &mut stop => return Ok(()),
        };
        let (acceptor, app) = (acceptor.clone(), app.clone());
        tokio::spawn(async move {
            match acceptor.accept(tcp).await {
                Ok(tls) => {
                    let svc = TowerToHyperService::new(app);
                    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    if let Err(e) = builder.serve_connection_with_upgrades(TokioIo::new(tls), svc).await {
                        tracing::debug!(%peer, error = %e, "TLS connection ended with an error");
                    }
                }
                Err(e) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
            }
        });
    }
}
