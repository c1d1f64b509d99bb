//! Usage reports from the ledger: GPU-unit-hours and cost, allocated and measured.

use axum::Json;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tessera_api::{Problem, UsageReport, month_start_ms, parse_time_ms, rfc3339_ms};
use utoipa::IntoParams;

use crate::auth::Identity;
use crate::problem::{ApiError, ApiResult};
use crate::usage::{By, csv, report};
use crate::{AppState, now_ms};

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UsageParams {
    /// Only this tenant (required for tenant tokens: their own).
    pub tenant: Option<String>,
    /// Start, `YYYY-MM-DD` or RFC 3339 (default: the first of this month, UTC).
    pub from: Option<String>,
    /// End, exclusive (default: now).
    pub to: Option<String>,
    /// `day`, `class`, `project` or `tenant` (default `day`).
    pub by: Option<String>,
    /// `json` (default) or `csv`.
    pub format: Option<String>,
}

/// GPU-unit-hours and cost, allocated and measured, from the usage ledger.
#[utoipa::path(get, path = "/api/v1/usage", tag = "governance", params(UsageParams),
    responses((status = 200, body = UsageReport), (status = 422, body = Problem)))]
pub async fn usage_report(
    State(s): State<AppState>,
    id: Identity,
    Query(q): Query<UsageParams>,
) -> ApiResult<Response> {
    let now = now_ms();
    let tenant = match (&q.tenant, &id.tenant) {
        (Some(t), _) if !id.can_read(t) => return Err(ApiError::not_found(format!("no tenant `{t}`"))),
        (None, Some(own)) if !id.is_admin() => Some(own.clone()),
        (t, _) => t.clone(),
    };
    let parse = |field: &str, v: &Option<String>, default: i64| -> ApiResult<i64> {
        match v {
            None => Ok(default),
            Some(x) => parse_time_ms(x)
                .ok_or_else(|| ApiError::invalid(field, format!("`{x}` is not a date (YYYY-MM-DD) or RFC 3339 time"))),
        }
    };
    let from = parse("from", &q.from, month_start_ms(now))?;
    let to = parse("to", &q.to, now)?;
    if to <= from {
        return Err(ApiError::invalid("to", "`to` must be after `from`"));
    }
    let by_s = q.by.clone().unwrap_or_else(|| "day".into());
    let by = By::parse(&by_s)
        .ok_or_else(|| ApiError::invalid("by", format!("`{by_s}`: group by day, class, project or tenant")))?;
    let intervals = s.store.usage_between(tenant.as_deref(), from, to).await?;
    let snap = s.lifecycle.snapshot();
    let (rows, total) = report(&intervals, from, to, now, by, &s.prices, &snap.utilisation);
    match q.format.as_deref().unwrap_or("json") {
        "json" => Ok(Json(UsageReport {
            from: rfc3339_ms(from),
            to: rfc3339_ms(to),
            by: by_s,
            currency: s.prices.currency.clone(),
            rows,
            total,
        })
        .into_response()),
        "csv" => Ok((
            [(axum::http::header::CONTENT_TYPE, "text/csv; charset=utf-8")],
            csv(by, &s.prices.currency, &rows, &total),
        )
            .into_response()),
        f => Err(ApiError::invalid("format", format!("`{f}`: json or csv"))),
    }
}
