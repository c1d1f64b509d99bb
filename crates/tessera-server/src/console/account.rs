//! The tenant's own pages: quota and usage (guaranteed / limit / used / borrowed per class,
//! budget left, GPU-unit-hours per day over the last 30 days as a uPlot chart, a CSV export
//! through the usage API) and API tokens (list, create — the secret shown once — and revoke).
//! Platform-admins pick the tenant. Reads come from the published snapshot and the store;
//! changes go through the API's handlers.

use askama::Template;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::response::Response;
use serde::Deserialize;
use tessera_api::{CreateToken, TenantQuotas, TokenRole, TokenView, rfc3339_ms};

use super::request::Opt;
use super::{Caller, Chrome, html};
use crate::problem::ApiError;
use crate::services::{governance, tokens};
use crate::state::AppState;
use crate::usage::{By, report};

#[derive(Deserialize, Default)]
pub struct TenantQuery {
    #[serde(default)]
    pub tenant: String,
}

/// The tenant a page is about: the caller's own, or (platform-admins) the chosen one.
async fn tenant_of(s: &AppState, c: &Caller, asked: &str) -> Result<(String, Vec<Opt>), ApiError> {
    if !c.id.is_admin() {
        return Ok((c.id.tenant.clone().unwrap_or_default(), Vec::new()));
    }
    let all: Vec<String> = s
        .store
        .list_tenants(None, 500)
        .await?
        .into_iter()
        .map(|t| t.name)
        .collect();
    let chosen = if all.iter().any(|t| t == asked) {
        asked.to_string()
    } else {
        all.first().cloned().unwrap_or_default()
    };
    let opts = all
        .into_iter()
        .map(|t| Opt {
            selected: t == chosen,
            label: t.clone(),
            value: t,
        })
        .collect();
    Ok((chosen, opts))
}

#[derive(Template)]
#[template(path = "console/quota.html")]
struct QuotaPage {
    chrome: Chrome,
    tenant: String,
    tenants: Vec<Opt>,
    quotas: Option<TenantQuotas>,
    chart: String,
    csv: String,
    total_unit_hours: f64,
    total_cost: f64,
    money: super::Money,
}

const DAY_MS: i64 = 86_400_000;

/// `GET /console/quota`: quotas, budget, and use per day over the last 30 days.
pub async fn quota(State(s): State<AppState>, c: Caller, Query(q): Query<TenantQuery>) -> Result<Response, ApiError> {
    let (tenant, tenants) = tenant_of(&s, &c, &q.tenant).await?;
    let quotas = if tenant.is_empty() {
        None
    } else {
        Some(governance::quotas(&s, &c.id, &tenant).await?)
    };
    let now = crate::clock::now_ms();
    let from = tessera_api::day_start_ms(now) - 29 * DAY_MS;
    let intervals = s.store.usage_between(Some(&tenant), from, now).await?;
    let snap = s.lifecycle.snapshot();
    let (rows, total) = report(&intervals, from, now, now, By::Day, &s.prices, &snap.utilisation);
    // One point per day, days without use included (uPlot wants aligned series).
    let days: Vec<i64> = (0..30).map(|d| from + d * DAY_MS).collect();
    let value = |d: i64, f: fn(&tessera_api::UsageRow) -> f64| {
        let key = rfc3339_ms(d)[..10].to_string();
        rows.iter().find(|r| r.key == key).map(f).unwrap_or(0.0)
    };
    let chart = serde_json::json!({
        "title": "GPU-unit-hours per day (UTC)",
        "x": days.iter().map(|d| d / 1000).collect::<Vec<_>>(),
        "series": [
            {"label": "allocated", "values": days.iter().map(|&d| value(d, |r| r.allocated_unit_hours)).collect::<Vec<_>>()},
            {"label": "measured", "values": days.iter().map(|&d| value(d, |r| r.measured_unit_hours)).collect::<Vec<_>>()},
        ],
    })
    .to_string();
    let csv = format!(
        "/api/v1/usage?{}",
        serde_urlencoded::to_string([
            ("tenant", tenant.as_str()),
            ("from", &rfc3339_ms(from)[..10]),
            ("format", "csv")
        ])
        .unwrap_or_default()
    );
    Ok(html(&QuotaPage {
        chrome: Chrome::new(&c, &s, "quota"),
        tenant,
        tenants,
        quotas,
        chart,
        csv,
        total_unit_hours: total.allocated_unit_hours,
        total_cost: total.cost_allocated,
        money: super::Money::new(&s.prices),
    }))
}

#[derive(Template)]
#[template(path = "console/tokens.html")]
struct TokensPage {
    chrome: Chrome,
    tenant: String,
    tenants: Vec<Opt>,
    list: TokenList,
    manage: bool,
}

/// The token list with the form, re-rendered after a creation (with the new secret, once) or
/// a refusal (with its message by the field).
struct TokenList {
    tenant: String,
    tokens: Vec<TokenView>,
    created: Option<(String, String)>,
    name: String,
    error_field: &'static str,
    error: String,
}

impl TokenList {
    fn error_for(&self, field: &str) -> &str {
        if self.error_field == field { &self.error } else { "" }
    }
}

#[derive(Template)]
#[template(path = "console/token_list.html")]
struct TokenListFragment {
    list: TokenList,
}

/// The tokens page's choice for the platform-wide tokens (platform-admin and metrics), which
/// belong to no tenant (no tenant name starts with `_`).
pub const PLATFORM: &str = "_platform";

async fn token_list(s: &AppState, c: &Caller, tenant: &str) -> Result<Vec<TokenView>, ApiError> {
    if tenant == PLATFORM {
        // Platform admins only (others never get here: their tenant is their own).
        c.id.require_admin()?;
        return Ok(tokens::list(s, &c.id, &None)
            .await?
            .into_iter()
            .filter(|t| t.tenant.is_none())
            .collect());
    }
    Ok(tokens::list(s, &c.id, &Some(tenant.to_string()))
        .await?
        .into_iter()
        .filter(|t| t.tenant.as_deref() == Some(tenant))
        .collect())
}

/// The tenant of the tokens page: as [`tenant_of`], with the platform-wide tokens offered to
/// platform admins.
async fn token_tenant(s: &AppState, c: &Caller, asked: &str) -> Result<(String, Vec<Opt>), ApiError> {
    let (mut tenant, mut opts) = tenant_of(s, c, asked).await?;
    if c.id.is_admin() {
        let platform = asked == PLATFORM;
        if platform {
            tenant = PLATFORM.to_string();
            for o in &mut opts {
                o.selected = false;
            }
        }
        opts.insert(
            0,
            Opt {
                value: PLATFORM.to_string(),
                label: "platform-wide (platform-admin and metrics tokens)".into(),
                selected: platform,
            },
        );
    }
    Ok((tenant, opts))
}

fn manages(c: &Caller) -> bool {
    c.id.is_admin() || c.id.role == crate::auth::Role::TenantAdmin
}

/// `GET /console/tokens`: the tenant's tokens (tenant-admins and platform-admins manage them;
/// others are told so).
pub async fn tokens_page(
    State(s): State<AppState>,
    c: Caller,
    Query(q): Query<TenantQuery>,
) -> Result<Response, ApiError> {
    let (tenant, tenants) = token_tenant(&s, &c, &q.tenant).await?;
    let manage = manages(&c);
    let tokens = if manage {
        token_list(&s, &c, &tenant).await?
    } else {
        Vec::new()
    };
    Ok(html(&TokensPage {
        chrome: Chrome::new(&c, &s, "tokens"),
        list: TokenList {
            tenant: tenant.clone(),
            tokens,
            created: None,
            name: String::new(),
            error_field: "",
            error: String::new(),
        },
        tenant,
        tenants,
        manage,
    }))
}

#[derive(Deserialize, Default)]
struct NewToken {
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    role: String,
    #[serde(default)]
    expires_days: String,
}

/// `POST /console/tokens` (htmx, with the CSRF token): creates a token through the API; the
/// answer shows its secret once.
pub async fn create(State(s): State<AppState>, c: Caller, body: Bytes) -> Result<Response, ApiError> {
    let f: NewToken = serde_urlencoded::from_bytes(&body).unwrap_or_default();
    let tenant = if c.id.is_admin() {
        f.tenant.clone()
    } else {
        c.id.tenant.clone().unwrap_or_default()
    };
    let platform = c.id.is_admin() && tenant == PLATFORM;
    let refuse = |field: &'static str, msg: String, tokens: Vec<TokenView>| TokenList {
        tenant: tenant.clone(),
        tokens,
        created: None,
        name: f.name.clone(),
        error_field: field,
        error: msg,
    };
    let role = match f.role.as_str() {
        "viewer" if !platform => TokenRole::Viewer,
        "member" if !platform => TokenRole::Member,
        "tenant-admin" if !platform => TokenRole::TenantAdmin,
        "platform-admin" if platform => TokenRole::PlatformAdmin,
        "metrics" if platform => TokenRole::Metrics,
        _ => {
            let list = refuse(
                "role",
                if platform {
                    "choose platform-admin or metrics".into()
                } else {
                    "choose viewer, member or tenant-admin".into()
                },
                token_list(&s, &c, &tenant).await?,
            );
            return Ok(unprocessable(html(&TokenListFragment { list })));
        }
    };
    let expires_in_s = match f.expires_days.trim() {
        "" => None,
        d => match d.parse::<i64>() {
            Ok(n) if n > 0 => Some(n * 86_400),
            _ => {
                let list = refuse(
                    "expires_days",
                    format!("`{d}` is not a whole number of days above 0"),
                    token_list(&s, &c, &tenant).await?,
                );
                return Ok(unprocessable(html(&TokenListFragment { list })));
            }
        },
    };
    let b = CreateToken {
        tenant: (!platform).then(|| tenant.clone()),
        role,
        name: Some(f.name.trim().to_string()).filter(|n| !n.is_empty()),
        expires_in_s,
    };
    let made = tokens::create(&s, &c.id, b).await;
    match made {
        Ok(t) => {
            let what = format!(
                "created token {} ({}), {} {}",
                t.id,
                if f.name.trim().is_empty() {
                    "no name"
                } else {
                    f.name.trim()
                },
                role.as_str(),
                if platform {
                    "platform-wide".to_string()
                } else {
                    format!("of tenant {tenant}")
                }
            );
            let list = TokenList {
                tenant: tenant.clone(),
                tokens: token_list(&s, &c, &tenant).await?,
                created: Some((t.id, t.token)),
                name: String::new(),
                error_field: "",
                error: String::new(),
            };
            let mut r = html(&TokenListFragment { list });
            r.extensions_mut().insert(crate::audit::AuditObject(what));
            Ok(r)
        }
        Err(e) if e.status == axum::http::StatusCode::UNPROCESSABLE_ENTITY => {
            let field = match e.field.as_deref() {
                Some("expires_in_s") => "expires_days",
                Some("role") => "role",
                _ => "name",
            };
            let list = refuse(field, e.detail.clone(), token_list(&s, &c, &tenant).await?);
            Ok(unprocessable(html(&TokenListFragment { list })))
        }
        Err(e) => Err(e),
    }
}

fn unprocessable(mut r: Response) -> Response {
    *r.status_mut() = axum::http::StatusCode::UNPROCESSABLE_ENTITY;
    r
}

/// `POST /console/tokens/{id}/revoke` (htmx, with the CSRF token): revokes through the API and
/// answers the list.
pub async fn revoke(
    State(s): State<AppState>,
    c: Caller,
    Path(tid): Path<String>,
    Query(q): Query<TenantQuery>,
) -> Result<Response, ApiError> {
    tokens::revoke(&s, &c.id, &tid).await?;
    let (tenant, _) = token_tenant(&s, &c, &q.tenant).await?;
    let list = TokenList {
        tokens: token_list(&s, &c, &tenant).await?,
        tenant,
        created: None,
        name: String::new(),
        error_field: "",
        error: String::new(),
    };
    Ok(html(&TokenListFragment { list }))
}
