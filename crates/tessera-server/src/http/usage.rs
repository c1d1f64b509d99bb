//! Usage reports from the ledger: GPU-unit-hours and cost, allocated and measured.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tessera_api::rules::{self, Validate, Violation};
use tessera_api::{LedgerExport, LedgerInterval, Problem, UsageReport, month_start_ms, parse_time_ms, rfc3339_ms};
use tessera_domain::GpuSpec;
use utoipa::{IntoParams, ToSchema};

use super::ApiQuery;
use crate::auth::Identity;
use crate::clock::now_ms;
use crate::problem::{ApiError, ApiResult};
use crate::state::AppState;
use crate::usage::{By, csv, report};

/// The report's format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    #[default]
    Json,
    Csv,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UsageParams {
    /// Only this tenant (required for tenant tokens: their own).
    pub tenant: Option<String>,
    /// Start (default: the first of this month, UTC).
    #[param(schema_with = rules::schema::date_or_time)]
    pub from: Option<String>,
    /// End, exclusive, after `from` (default: now).
    #[param(schema_with = rules::schema::date_or_time)]
    pub to: Option<String>,
    /// How rows are grouped (default `day`).
    #[param(inline)]
    pub by: Option<By>,
    /// `json` (default) or `csv`.
    #[param(inline)]
    pub format: Option<Format>,
}

impl Validate for UsageParams {
    fn validate(&self) -> Result<(), Violation> {
        check_dates(&self.from, &self.to)
    }
}

/// `from` and `to`, when given, are dates or RFC 3339 times.
fn check_dates(from: &Option<String>, to: &Option<String>) -> Result<(), Violation> {
    for (field, v) in [("from", from), ("to", to)] {
        if let Some(x) = v
            && parse_time_ms(x).is_none()
        {
            return Err(Violation::new(
                field,
                format!("`{x}` is not a date (YYYY-MM-DD) or RFC 3339 time"),
            ));
        }
    }
    Ok(())
}

/// The tenant a usage query may read (a tenant token's own unless it names one it may see) and
/// its period: `from` defaults to the first of this month, `to` to now, and must follow `from`.
fn scope(
    id: &Identity,
    tenant: &Option<String>,
    from: &Option<String>,
    to: &Option<String>,
    now: i64,
) -> ApiResult<(Option<String>, i64, i64)> {
    let tenant = match (tenant, &id.tenant) {
        (Some(t), _) if !id.can_read(t) => return Err(ApiError::not_found(format!("no tenant `{t}`"))),
        (None, Some(own)) if !id.is_admin() => Some(own.clone()),
        (t, _) => t.clone(),
    };
    // Checked by `check_dates`.
    let time = |v: &Option<String>, default: i64| v.as_deref().and_then(parse_time_ms).unwrap_or(default);
    let (from, to) = (time(from, month_start_ms(now)), time(to, now));
    if to <= from {
        return Err(ApiError::invalid("to", "`to` must be after `from`"));
    }
    Ok((tenant, from, to))
}

/// GPU-unit-hours and cost, allocated and measured, from the usage ledger.
#[utoipa::path(get, path = "/api/v1/usage", tag = "governance", params(UsageParams),
    responses((status = 200, description = "The report", content((UsageReport = "application/json"), (String = "text/csv"))),
        (status = 404, description = "No such tenant, or one the caller may not see", body = Problem),
        (status = 422, description = "A value breaks a rule, or `to` is not after `from`", body = Problem)))]
pub async fn usage_report(
    State(s): State<AppState>,
    id: Identity,
    ApiQuery(q): ApiQuery<UsageParams>,
) -> ApiResult<Response> {
    let now = now_ms();
    let (tenant, from, to) = scope(&id, &q.tenant, &q.from, &q.to, now)?;
    let by = q.by.unwrap_or(By::Day);
    let intervals = s.store.usage_between(tenant.as_deref(), from, to).await?;
    let snap = s.lifecycle.snapshot();
    let (rows, total) = report(&intervals, from, to, now, by, &s.prices, &snap.utilisation);
    Ok(match q.format.unwrap_or_default() {
        Format::Json => Json(UsageReport {
            from: rfc3339_ms(from),
            to: rfc3339_ms(to),
            by: by.as_str().into(),
            currency: s.prices.currency.clone(),
            priced: s.prices.configured(),
            rows,
            total,
        })
        .into_response(),
        Format::Csv => (
            [(axum::http::header::CONTENT_TYPE, "text/csv; charset=utf-8")],
            csv(by, &s.prices.currency, &rows, &total),
        )
            .into_response(),
    })
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct IntervalParams {
    /// Only this tenant (required for tenant tokens: their own).
    pub tenant: Option<String>,
    /// Start (default: the first of this month, UTC).
    #[param(schema_with = rules::schema::date_or_time)]
    pub from: Option<String>,
    /// End, exclusive, after `from` (default: now).
    #[param(schema_with = rules::schema::date_or_time)]
    pub to: Option<String>,
    /// `json` (default) or `csv`.
    #[param(inline)]
    pub format: Option<Format>,
}

impl Validate for IntervalParams {
    fn validate(&self) -> Result<(), Violation> {
        check_dates(&self.from, &self.to)
    }
}

/// The ledger's intervals overlapping the period, each with what its workload asked for
/// (shape, host resources, priority, submission time): the demand `tessera plan` replays.
#[utoipa::path(get, path = "/api/v1/usage/intervals", tag = "governance", params(IntervalParams),
    responses((status = 200, description = "The intervals", content((LedgerExport = "application/json"), (String = "text/csv"))),
        (status = 404, description = "No such tenant, or one the caller may not see", body = Problem),
        (status = 422, description = "A value breaks a rule, or `to` is not after `from`", body = Problem)))]
pub async fn usage_intervals(
    State(s): State<AppState>,
    id: Identity,
    ApiQuery(q): ApiQuery<IntervalParams>,
) -> ApiResult<Response> {
    let now = now_ms();
    let (tenant, from, to) = scope(&id, &q.tenant, &q.from, &q.to, now)?;
    let ledger = s.store.usage_between(tenant.as_deref(), from, to).await?;
    let mut specs = std::collections::HashMap::new();
    let mut intervals = Vec::with_capacity(ledger.len());
    for u in ledger {
        if let std::collections::hash_map::Entry::Vacant(e) = specs.entry(u.workload) {
            e.insert(s.store.get_workload(u.workload, None).await?);
        }
        // Intervals outlive nothing: a workload's record is kept as long as its ledger.
        let Some(w) = specs[&u.workload].as_ref() else {
            continue;
        };
        let gpu = match &w.spec.shape.gpu {
            GpuSpec::Whole { gpus } => format!("whole:{gpus}"),
            GpuSpec::Gang(g) => format!("gang:{}", g.gpus),
            GpuSpec::Mig { profile } => format!("mig:{profile}"),
            GpuSpec::Fraction { milli, .. } => format!("fraction:{milli}"),
        };
        intervals.push(LedgerInterval {
            workload: u.workload.0,
            seq: u.seq,
            tenant: u.tenant,
            project: u.project,
            priority: w.spec.priority.clone(),
            gpu,
            cpu_milli: w.spec.cpu_milli,
            memory_mib: w.spec.memory_mib,
            pool: u.pool,
            model: u.model,
            units: u.units.as_f64(),
            submitted_at: rfc3339_ms(w.created_at),
            started_at: rfc3339_ms(u.started_at),
            ended_at: u.ended_at.map(rfc3339_ms),
        });
    }
    Ok(match q.format.unwrap_or_default() {
        Format::Json => Json(LedgerExport {
            from: rfc3339_ms(from),
            to: rfc3339_ms(to),
            intervals,
        })
        .into_response(),
        Format::Csv => (
            [(axum::http::header::CONTENT_TYPE, "text/csv; charset=utf-8")],
            intervals_csv(&intervals),
        )
            .into_response(),
    })
}

/// The intervals as CSV, the columns `tessera plan --demand usage:FILE` reads. No field needs
/// quoting: tenant and project names are slugs, pools, models, classes and MIG profiles are
/// configured names without commas.
pub fn intervals_csv(intervals: &[LedgerInterval]) -> String {
    let mut out = String::from(
        "workload,seq,tenant,project,priority,gpu,cpu_milli,memory_mib,pool,model,units,submitted_at,started_at,ended_at\n",
    );
    for i in intervals {
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{:.3},{},{},{}\n",
            i.workload,
            i.seq,
            i.tenant,
            i.project,
            i.priority,
            i.gpu,
            i.cpu_milli,
            i.memory_mib,
            i.pool,
            i.model,
            i.units,
            i.submitted_at,
            i.started_at,
            i.ended_at.as_deref().unwrap_or("")
        ));
    }
    out
}
