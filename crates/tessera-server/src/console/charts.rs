//! Allocation and utilisation over time per pool (platform-admins): a uPlot chart of each pool
//! from the server's minute-by-minute history ([`crate::history`]), with the current minute
//! taken live from the published snapshot, a summary table, and the numbers behind every
//! chart as CSV or JSON (`/console/charts/data`).

use askama::Template;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::{Caller, Chrome, html};
use crate::AppState;
use crate::history::{Sample, minute, sample};
use crate::problem::ApiError;

#[derive(Deserialize, Default)]
pub struct ChartQuery {
    /// One pool (default: every pool).
    #[serde(default)]
    pub pool: String,
    /// `csv` or `json` (the data endpoint).
    #[serde(default)]
    pub format: String,
}

/// A pool's chart and summary.
pub struct PoolChart {
    pub name: String,
    pub capacity: u64,
    pub now: f64,
    pub peak: f64,
    pub util: String,
    pub points: usize,
    pub allocation: String,
    pub utilisation: String,
    pub csv: String,
}

#[derive(Template)]
#[template(path = "console/charts.html")]
struct ChartsPage {
    chrome: Chrome,
    pools: Vec<PoolChart>,
    names: Vec<String>,
    q: ChartQuery,
}

/// The pool's samples, the current minute from the live snapshot.
fn series(s: &AppState, pool: &str) -> Vec<Sample> {
    let now = crate::clock::now_ms();
    let mut v = s.history.series(pool);
    let live = sample(&s.lifecycle.snapshot(), &s.lifecycle.published().telemetry(), now)
        .into_iter()
        .find(|(p, _)| p == pool)
        .map(|(_, x)| x);
    if let Some(live) = live {
        match v.last_mut() {
            Some(last) if last.at == minute(now) => *last = live,
            _ => v.push(live),
        }
    }
    v
}

fn checked_pools(s: &AppState, q: &ChartQuery) -> Result<Vec<(String, u64)>, ApiError> {
    let f = &s.fleet();
    let all: Vec<(String, u64)> = f
        .pools
        .iter()
        .map(|p| {
            let gpus = f.nodes[p.nodes.start as usize..p.nodes.end as usize]
                .iter()
                .map(|n| n.gpus as u64)
                .sum();
            (p.name.clone(), gpus)
        })
        .collect();
    if q.pool.is_empty() {
        return Ok(all);
    }
    match all.iter().find(|(p, _)| *p == q.pool) {
        Some(p) => Ok(vec![p.clone()]),
        None => Err(ApiError::invalid(
            "pool",
            format!(
                "unknown pool `{}` ({})",
                q.pool,
                all.iter().map(|p| p.0.as_str()).collect::<Vec<_>>().join(", ")
            ),
        )),
    }
}

/// `GET /console/charts` (platform-admins): every pool's allocation and utilisation over the
/// last 24 hours.
pub async fn charts(State(s): State<AppState>, c: Caller, Query(q): Query<ChartQuery>) -> Result<Response, ApiError> {
    c.id.require_admin()?;
    let pools = checked_pools(&s, &q)?
        .into_iter()
        .map(|(name, capacity)| {
            let v = series(&s, &name);
            let x: Vec<i64> = v.iter().map(|p| p.at / 1000).collect();
            let utils: Vec<f64> = v.iter().filter_map(|p| p.util_pct).collect();
            let allocation = serde_json::json!({
                "title": format!("{name}: GPU units allocated (of {capacity})"),
                "x": x,
                "series": [
                    {"label": "allocated", "values": v.iter().map(|p| p.allocated).collect::<Vec<_>>()},
                    {"label": "capacity", "values": v.iter().map(|_| capacity).collect::<Vec<_>>()},
                ],
            });
            let utilisation = serde_json::json!({
                "title": format!("{name}: mean GPU utilisation, %"),
                "x": x,
                "series": [{"label": "utilisation %", "values": v.iter().map(|p| p.util_pct).collect::<Vec<_>>()}],
            });
            PoolChart {
                csv: format!(
                    "/console/charts/data?{}",
                    serde_urlencoded::to_string([("pool", name.as_str()), ("format", "csv")]).unwrap_or_default()
                ),
                now: v.last().map_or(0.0, |p| p.allocated),
                peak: v.iter().map(|p| p.allocated).fold(0.0, f64::max),
                util: if utils.is_empty() {
                    "not reported".into()
                } else {
                    format!("{:.1} %", utils.iter().sum::<f64>() / utils.len() as f64)
                },
                points: v.len(),
                allocation: allocation.to_string(),
                utilisation: utilisation.to_string(),
                name,
                capacity,
            }
        })
        .collect();
    Ok(html(&ChartsPage {
        chrome: Chrome::new(&c, &s, "charts"),
        pools,
        names: s.fleet().pools.iter().map(|p| p.name.clone()).collect(),
        q,
    }))
}

/// `GET /console/charts/data?pool=…&format=csv|json` (platform-admins): the numbers behind a
/// pool's charts, one row a minute.
pub async fn data(State(s): State<AppState>, c: Caller, Query(q): Query<ChartQuery>) -> Result<Response, ApiError> {
    c.id.require_admin()?;
    if q.pool.is_empty() {
        return Err(ApiError::invalid("pool", "name the pool whose numbers you want"));
    }
    let (pool, capacity) = checked_pools(&s, &q)?.remove(0);
    let v = series(&s, &pool);
    match q.format.as_str() {
        "" | "csv" => {
            let mut out = String::from("minute_utc,pool,allocated_units,capacity_units,utilisation_pct\n");
            for p in &v {
                out.push_str(&format!(
                    "{},{pool},{},{capacity},{}\n",
                    tessera_api::rfc3339_ms(p.at),
                    p.allocated,
                    p.util_pct.map(|u| format!("{u:.1}")).unwrap_or_default()
                ));
            }
            Ok((
                [
                    (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_string()),
                    (
                        header::CONTENT_DISPOSITION,
                        format!("attachment; filename=\"allocation-{pool}.csv\""),
                    ),
                ],
                out,
            )
                .into_response())
        }
        "json" => Ok(axum::Json(serde_json::json!({
            "pool": pool,
            "capacity_units": capacity,
            "x": v.iter().map(|p| p.at / 1000).collect::<Vec<_>>(),
            "allocated_units": v.iter().map(|p| p.allocated).collect::<Vec<_>>(),
            "utilisation_pct": v.iter().map(|p| p.util_pct).collect::<Vec<_>>(),
        }))
        .into_response()),
        other => Err(ApiError::invalid(
            "format",
            format!("unknown format `{other}` (csv, json)"),
        )),
    }
}
