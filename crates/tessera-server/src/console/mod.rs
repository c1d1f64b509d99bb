//! The web console: server-rendered pages (askama templates, checked at compile time) with
//! progressive enhancement by htmx, and uPlot for charts. Every asset — our CSS and script, the
//! vendored htmx and uPlot — is embedded in the binary ([`assets`]) and served under a URL that
//! carries its content hash, so it can be cached for a year. No page has inline script or
//! style, so the Content-Security-Policy allows neither.
//!
//! Who is signed in comes from the console's session cookie ([`crate::session`]: single
//! sign-on where configured, else the API-token form of [`signin`]). Every change made from a
//! page is an htmx request that carries the session's CSRF token in `X-CSRF-Token` (set on
//! `<body hx-headers>`); the request middleware refuses one without it (403 problem) before
//! any handler runs. Pages read the lifecycle's published snapshot and the store, never the
//! loop; changes go through the same handlers as the REST API, so rules, RBAC and audit
//! records are the API's.

pub mod account;
pub mod assets;
pub mod charts;
pub mod errors;
pub mod fleet;
pub mod pages;
pub mod queue;
pub mod request;
pub mod signin;
pub mod tenants;
pub mod why;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};

use crate::auth::{Identity, Resolved, Role};
use crate::problem::ApiError;
use crate::state::AppState;

/// The console's routes (the middleware stack is the application's).
pub fn router(state: &AppState) -> axum::Router<AppState> {
    axum::Router::new()
        .route("/", get(|| async { redirect("/console") }))
        .route("/console", get(pages::overview))
        .route("/console/signin", get(signin::form).post(signin::submit))
        .route("/console/signout", post(signin::signout))
        .route("/console/request", get(request::page).post(request::submit))
        .route("/console/request/fields", get(request::fields))
        .route("/console/request/preview", post(request::preview))
        .route("/console/fleet", get(fleet::fleet))
        .route("/console/fleet/nodes/{name}", get(fleet::node))
        .route("/console/fleet/nodes/{name}/{action}", post(fleet::node_op))
        .route("/console/audit", get(fleet::audit))
        .route("/console/queue", get(queue::queue))
        .route("/console/charts", get(charts::charts))
        .route("/console/charts/data", get(charts::data))
        .route("/console/tenants", get(tenants::page).post(tenants::create_tenant))
        .route("/console/tenants/{tenant}/projects", post(tenants::create_project))
        .route(
            "/console/tenants/{tenant}/projects/{project}/delete",
            post(tenants::delete_project),
        )
        .route("/console/tenants/{tenant}/quotas", post(tenants::set_quota))
        .route("/console/tenants/{tenant}/quotas/remove", post(tenants::remove_quota))
        .route("/console/tenants/{tenant}/budget", post(tenants::set_budget))
        .route("/console/tenants/{tenant}/priorities", post(tenants::set_priorities))
        .route("/console/quota", get(account::quota))
        .route("/console/tokens", get(account::tokens_page).post(account::create))
        .route("/console/tokens/{id}/revoke", post(account::revoke))
        .route("/console/workloads", get(pages::workloads))
        .route("/console/workloads/{id}", get(pages::workload))
        .route("/console/workloads/{id}/live", get(pages::workload_live))
        .route("/console/workloads/{id}/telemetry", get(pages::workload_telemetry))
        .route("/console/workloads/{id}/cancel", post(pages::cancel))
        .route("/assets/{hash}/{*file}", get(assets::serve))
        // Any other console address: a page that does not exist (after the sign-in).
        .route("/console/{*rest}", axum::routing::any(errors::no_page))
        // A page a browser loads answers its errors as a page with the navigation.
        .layer(axum::middleware::from_fn_with_state(state.clone(), errors::middleware))
        // Pages and assets are sent gzip-compressed to browsers that accept it.
        .layer(tower_http::compression::CompressionLayer::new().gzip(true))
}

/// Every tenant's name, sorted (the first 1,000): the choices of a platform admin's tenant
/// filter. Only ever called for platform admins.
pub async fn tenant_names(s: &AppState) -> Result<Vec<String>, ApiError> {
    Ok(s.store
        .list_tenants(None, 1000)
        .await?
        .into_iter()
        .map(|t| t.name)
        .collect())
}

/// Whether the request middleware resolves the caller of `path` (and, for changes, checks the
/// CSRF token): every console route but the sign-in form and the assets.
pub fn guarded(path: &str) -> bool {
    (path == "/console" || path.starts_with("/console/")) && path != "/console/signin"
}

/// A `303 See Other` to `to`.
pub fn redirect(to: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    r.headers_mut().insert(
        header::LOCATION,
        HeaderValue::from_str(to).unwrap_or(HeaderValue::from_static("/console")),
    );
    r
}

/// The signed-in user of a console page, with the session's CSRF token for the page to send
/// back. Without a session, a page load is sent to the sign-in form (an htmx request is told
/// to go there with `HX-Redirect`); a change is refused with the middleware's problem.
pub struct Caller {
    pub id: Identity,
    pub csrf: String,
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, s: &AppState) -> Result<Self, Self::Rejection> {
        let resolved = match parts.extensions.get::<Resolved>() {
            Some(Resolved(r)) => r.clone(),
            None => crate::auth::resolve(&parts.headers, &parts.method, s).await,
        };
        match resolved {
            Ok(id) if id.role == Role::Metrics => Err(ApiError::forbidden(
                "a metrics token cannot use the console; sign in with a tenant or platform-admin token",
            )
            .into_response()),
            Ok(id) => {
                let csrf = s
                    .sessions
                    .from_headers(&parts.headers)
                    .map(|x| x.csrf)
                    .unwrap_or_default();
                Ok(Caller { id, csrf })
            }
            Err(e) if parts.method == Method::GET && e.status == StatusCode::UNAUTHORIZED => {
                if parts.headers.contains_key("hx-request") {
                    let mut r = StatusCode::NO_CONTENT.into_response();
                    r.headers_mut()
                        .insert("hx-redirect", HeaderValue::from_static("/console/signin"));
                    Err(r)
                } else {
                    Err(redirect("/console/signin"))
                }
            }
            Err(e) => Err(e.into_response()),
        }
    }
}

/// What every page's frame needs: who is signed in, the CSRF token, the asset URLs, which
/// navigation entry is current.
pub struct Chrome {
    pub actor: String,
    pub role: &'static str,
    pub tenant: String,
    pub admin: bool,
    pub csrf: String,
    pub assets: &'static assets::Urls,
    pub current: &'static str,
    pub sso: bool,
}

impl Chrome {
    pub fn new(c: &Caller, s: &AppState, current: &'static str) -> Chrome {
        Chrome::of(Some(&c.id), c.csrf.clone(), s, current)
    }

    /// The frame for `id` (`None`: nobody is signed in, as on an error page before sign-in).
    pub fn of(id: Option<&Identity>, csrf: String, s: &AppState, current: &'static str) -> Chrome {
        Chrome {
            actor: id.map(|i| i.shown()).unwrap_or_default(),
            role: id.map(|i| i.role.as_str()).unwrap_or(""),
            tenant: id.and_then(|i| i.tenant.clone()).unwrap_or_default(),
            admin: id.is_some_and(Identity::is_admin),
            csrf,
            assets: assets::urls(),
            current,
            sso: s.auth.oidc().is_some_and(|o| o.authorization_endpoint.is_some()),
        }
    }

    /// `aria-current="page"` on the current navigation entry.
    pub fn here(&self, entry: &str) -> &'static str {
        if self.current == entry { "page" } else { "false" }
    }
}

/// Telemetry older than this is not shown as the GPUs' state now.
const TELEMETRY_FRESH_MS: i64 = 120_000;

/// Why the latest telemetry says nothing about now, in words: the backend never reported any, or
/// the last sample is older than two minutes; `None` when it is fresh.
pub fn stale_telemetry(t: &crate::lifecycle::Telemetry, now: i64) -> Option<String> {
    if t.at == 0 {
        Some("the backend has reported no telemetry".into())
    } else if now - t.at > TELEMETRY_FRESH_MS {
        Some(format!("no telemetry since {}", tessera_api::rfc3339_ms(t.at)))
    } else {
        None
    }
}

/// A rendered template as an HTML response (a template error is a 500 problem).
pub fn html<T: askama::Template>(t: &T) -> Response {
    match t.render() {
        Ok(body) => Html(body).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "console template failed");
            ApiError::internal("the page could not be rendered").into_response()
        }
    }
}

/// GPU-unit-hours as the CLI prints them ([`tessera_model::unit_hours`]): one decimal, more
/// where that is what tells a small amount from zero (a 0.04 budget reads `0.04`, not `0.0`).
pub fn uh(h: impl Amount) -> String {
    tessera_model::units::unit_hours(h.amount())
}

/// Whether an amount is above zero (templates compare through it).
pub fn above_zero(x: impl Amount) -> bool {
    x.amount() > 0.0
}

/// A number as templates pass it (by value or by reference).
pub trait Amount {
    fn amount(&self) -> f64;
}

impl Amount for f64 {
    fn amount(&self) -> f64 {
        *self
    }
}

impl<T: Amount + ?Sized> Amount for &T {
    fn amount(&self) -> f64 {
        (**self).amount()
    }
}

/// Money as the console shows it: an amount in the price list's currency, or — with no price
/// list configured — that there is none (never `0.00`, which reads as free).
#[derive(Clone, Debug)]
pub struct Money {
    pub currency: String,
    /// Whether the platform configured any price.
    pub priced: bool,
}

/// What every amount reads when no price list is configured.
pub const NO_PRICES: &str = "no price list configured";

impl Money {
    pub fn new(p: &crate::usage::Prices) -> Money {
        Money {
            currency: p.currency.clone(),
            priced: p.configured(),
        }
    }

    /// `12.50 EUR`, or [`NO_PRICES`].
    pub fn show(&self, amount: impl Amount) -> String {
        if self.priced {
            format!("{:.2} {}", amount.amount(), self.currency)
        } else {
            NO_PRICES.to_string()
        }
    }
}
