//! Allocation and utilisation over time per pool (platform-admins): a uPlot chart of each pool
//! over a chosen window (the last hour, 24 hours, 7 or 30 days) from the server's
//! minute-by-minute history ([`crate::history`]), with the current minute taken live from the
//! published snapshot; axes from zero to the pool's capacity and to 100 %; a summary table; and
//! the numbers behind every chart as CSV or JSON (`/console/charts/data`).

use askama::Template;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::{Caller, Chrome, html};
use crate::history::{Window, sample};
use crate::problem::ApiError;
use crate::state::AppState;

#[derive(Deserialize, Default)]
pub struct ChartQuery {
    /// One pool (default: every pool).
    #[serde(default)]
    pub pool: String,
    /// `csv` or `json` (the data endpoint).
    #[serde(default)]
    pub format: String,
    /// `1h`, `24h` (default), `7d` or `30d`.
    #[serde(default)]
    pub range: String,
}

impl ChartQuery {
    /// The window `range` names; an unknown one is a 422 that lists the known.
    fn window(&self) -> Result<Window, ApiError> {
        window_of(&self.range)
    }
}

/// The window `range` names (empty: the default, 24 hours); an unknown one is a 422 that lists
/// the known.
pub fn window_of(range: &str) -> Result<Window, ApiError> {
    if range.is_empty() {
        return Ok(Window::default());
    }
    Window::ALL
        .into_iter()
        .find(|w| w.key() == range)
        .ok_or_else(|| ApiError::invalid("range", format!("unknown range `{range}` (1h, 24h, 7d, 30d)")))
}

/// A window offered by the range picker.
pub struct RangeLink {
    pub key: &'static str,
    pub href: String,
    pub current: bool,
}

/// A pool's chart and summary.
pub struct PoolChart {
    pub name: String,
    pub capacity: u64,
    pub now: f64,
    pub peak: f64,
    pub util: String,
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
    window: Window,
    ranges: Vec<RangeLink>,
}

/// Records the current minute of every pool from the live snapshot (once per request) and
/// returns each pool's units allocated now.
fn record_live(s: &AppState, now: i64) -> Vec<(String, f64)> {
    let live = sample(&s.lifecycle.snapshot(), &s.lifecycle.published().telemetry(), now);
    let allocated = live.iter().map(|(p, x)| (p.clone(), x.allocated)).collect();
    s.history.record(live);
    allocated
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

/// `GET /console/charts?pool=…&range=1h|24h|7d|30d` (platform-admins): every pool's
/// allocation and utilisation over the window (24 hours by default).
pub async fn charts(State(s): State<AppState>, c: Caller, Query(q): Query<ChartQuery>) -> Result<Response, ApiError> {
    c.id.require_admin()?;
    let window = q.window()?;
    let now = crate::clock::now_ms();
    let allocated_now = record_live(&s, now);
    let pools = checked_pools(&s, &q)?
        .into_iter()
        .map(|(name, capacity)| {
            let v = s.history.window(&name, window, now);
            let x: Vec<i64> = v.iter().map(|p| p.at / 1000).collect();
            let utils: Vec<f64> = v.iter().filter_map(|p| p.util_pct).collect();
            let mut lines = vec![serde_json::json!({
                "label": if window.bucket_minutes() == 1 { "allocated" } else { "allocated (hour's mean)" },
                "values": v.iter().map(|p| p.allocated).collect::<Vec<_>>(),
            })];
            if window.bucket_minutes() > 1 {
                lines.push(serde_json::json!({
                    "label": "peak minute", "values": v.iter().map(|p| p.peak).collect::<Vec<_>>(),
                }));
            }
            lines.push(serde_json::json!({
                "label": "capacity", "values": v.iter().map(|_| capacity).collect::<Vec<_>>(),
            }));
            let allocation = serde_json::json!({
                "title": format!("{name}: GPU units allocated (of {capacity}), {}", window.label()),
                "x": x,
                "y": [0, capacity.max(1)],
                "series": lines,
            });
            let utilisation = serde_json::json!({
                "title": format!("{name}: mean GPU utilisation, %, {}", window.label()),
                "x": x,
                "y": [0, 100],
                "series": [{"label": "utilisation %", "values": v.iter().map(|p| p.util_pct).collect::<Vec<_>>()}],
            });
            PoolChart {
                csv: format!(
                    "/console/charts/data?{}",
                    serde_urlencoded::to_string([("pool", name.as_str()), ("format", "csv"), ("range", window.key())])
                        .unwrap_or_default()
                ),
                now: allocated_now.iter().find(|(p, _)| *p == name).map_or(0.0, |(_, a)| *a),
                peak: v.iter().map(|p| p.peak).fold(0.0, f64::max),
                util: if utils.is_empty() {
                    "not reported".into()
                } else {
                    format!("{:.1} %", utils.iter().sum::<f64>() / utils.len() as f64)
                },
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
        ranges: Window::ALL
            .into_iter()
            .map(|w| RangeLink {
                key: w.key(),
                href: format!(
                    "/console/charts?{}",
                    serde_urlencoded::to_string([("pool", q.pool.as_str()), ("range", w.key())]).unwrap_or_default()
                ),
                current: w == window,
            })
            .collect(),
        window,
        q,
    }))
}

/// `GET /console/charts/data?pool=…&format=csv|json&range=…` (platform-admins): the numbers
/// behind a pool's charts, one row a point (a minute, or an hour with its mean and peak).
pub async fn data(State(s): State<AppState>, c: Caller, Query(q): Query<ChartQuery>) -> Result<Response, ApiError> {
    c.id.require_admin()?;
    if q.pool.is_empty() {
        return Err(ApiError::invalid("pool", "name the pool whose numbers you want"));
    }
    let window = q.window()?;
    let (pool, capacity) = checked_pools(&s, &q)?.remove(0);
    let now = crate::clock::now_ms();
    record_live(&s, now);
    let v = s.history.window(&pool, window, now);
    match q.format.as_str() {
        "" | "csv" => {
            let mut out =
                String::from("start_utc,minutes,pool,allocated_units,peak_units,capacity_units,utilisation_pct\n");
            for p in &v {
                out.push_str(&format!(
                    "{},{},{pool},{},{},{capacity},{}\n",
                    tessera_api::rfc3339_ms(p.at),
                    window.bucket_minutes(),
                    p.allocated,
                    p.peak,
                    p.util_pct.map(|u| format!("{u:.1}")).unwrap_or_default()
                ));
            }
            Ok((
                [
                    (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_string()),
                    (
                        header::CONTENT_DISPOSITION,
                        format!("attachment; filename=\"allocation-{pool}-{}.csv\"", window.key()),
                    ),
                ],
                out,
            )
                .into_response())
        }
        "json" => Ok(axum::Json(serde_json::json!({
            "pool": pool,
            "capacity_units": capacity,
            "range": window.key(),
            "bucket_minutes": window.bucket_minutes(),
            "x": v.iter().map(|p| p.at / 1000).collect::<Vec<_>>(),
            "allocated_units": v.iter().map(|p| p.allocated).collect::<Vec<_>>(),
            "peak_units": v.iter().map(|p| p.peak).collect::<Vec<_>>(),
            "utilisation_pct": v.iter().map(|p| p.util_pct).collect::<Vec<_>>(),
        }))
        .into_response()),
        other => Err(ApiError::invalid(
            "format",
            format!("unknown format `{other}` (csv, json)"),
        )),
    }
}
