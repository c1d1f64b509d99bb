//! The console's pages: the overview, and a tenant's workloads (list with filters and live
//! rows, one workload's timeline, cancel). Lists and timelines come from the store, the fleet
//! from the published snapshot; changes go through the REST API's handlers.

use askama::Template;
use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tessera_api::{Event, PoolView, Workload, WorkloadState};
use tessera_domain::WorkloadId;

use super::{Caller, Chrome, html};
use crate::http::{WorkloadPath, views};
use crate::problem::ApiError;
use crate::services::{tokens, workloads};
use crate::state::AppState;

/// One row of a workload table, formatted for people.
pub struct Row {
    pub id: u64,
    pub tenant: String,
    pub project: String,
    pub name: String,
    pub shape: String,
    pub state: &'static str,
    pub reason: String,
    pub placed: String,
    pub created: String,
    pub ended: bool,
}

/// A shape in words: `2 GPU`, `MIG 1g.10gb`, `250m of a GPU`; a multi-node gang's
/// `16 GPU gang` (with its GPUs per node, topology and segments when it names them).
pub fn shape_words(w: &Workload) -> String {
    let s = &w.shape;
    let gang = s.nodes.is_some()
        || s.gpus_per_node.is_some()
        || s.topology.is_some()
        || s.segment.is_some()
        || s.remainder
        || w.allocation.as_ref().is_some_and(|a| !a.shares.is_empty());
    if let Some(g) = s.gpus
        && gang
    {
        let mut out = format!("{g} GPU gang");
        if let Some(per) = s.gpus_per_node {
            out.push_str(&format!(", node-shares of {per} GPUs"));
        }
        if s.remainder {
            out.push_str(", whole nodes, the last with the remainder");
        }
        if let Some(t) = &s.topology {
            let mode = match s.topology_mode.unwrap_or_default() {
                tessera_api::TopologyMode::Required => "required",
                tessera_api::TopologyMode::Preferred => "preferred",
            };
            out.push_str(&format!(", within one {t} ({mode})"));
        }
        if let Some(seg) = s.segment {
            out.push_str(&format!(", segments of {seg} GPUs"));
        }
        out
    } else if let Some(g) = s.gpus {
        format!("{g} GPU")
    } else if let Some(m) = &w.shape.mig {
        format!("MIG {m}")
    } else {
        format!("{}m of a GPU", w.shape.fraction.unwrap_or(0))
    }
}

fn row(w: &Workload) -> Row {
    Row {
        id: w.id,
        tenant: w.tenant.clone(),
        project: w.project.clone(),
        name: w.name.clone(),
        shape: shape_words(w),
        state: w.state.as_str(),
        reason: super::why::sentence(
            w.reason_code.as_deref().unwrap_or_default(),
            w.reason.as_deref().unwrap_or_default(),
        ),
        placed: w
            .allocation
            .as_ref()
            .map(|a| {
                let gpus: Vec<String> = a.gpus.iter().map(|g| g.to_string()).collect();
                match a.shares.len() {
                    0 => format!("{} GPU {}", a.node, gpus.join(",")),
                    1 => format!("{} GPU {} and 1 more node", a.node, gpus.join(",")),
                    k => format!("{} GPU {} and {k} more nodes", a.node, gpus.join(",")),
                }
            })
            .unwrap_or_default(),
        created: w.created_at.get(..19).unwrap_or(&w.created_at).replace('T', " "),
        ended: w.state.is_terminal(),
    }
}

#[derive(Template)]
#[template(path = "console/overview.html")]
struct Overview {
    chrome: Chrome,
    pools: Vec<PoolView>,
    phases: Vec<(String, u64)>,
    recent: Vec<Row>,
}

/// `GET /console`: the pools and the caller's most recent workloads.
pub async fn overview(State(s): State<AppState>, c: Caller) -> Result<Response, ApiError> {
    let snap = s.lifecycle.snapshot();
    let pools = views::pools(&snap);
    let phases = if c.id.is_admin() {
        snap.phases.iter().map(|(p, n)| (p.as_str().to_string(), *n)).collect()
    } else {
        Vec::new()
    };
    let recent = list(&s, &c, &Filter::default(), None, 10, false).await?.rows;
    Ok(html(&Overview {
        chrome: Chrome::new(&c, &s, "overview"),
        pools,
        phases,
        recent,
    }))
}

/// The workload list's filters (query string of the page and of its live rows).
#[derive(Deserialize, Default)]
pub struct Filter {
    #[serde(default)]
    pub state: String,
    /// A project, as `tenant/project` (the form the list shows) or, within the caller's own
    /// tenant, its bare name.
    #[serde(default)]
    pub project: String,
    /// Platform admins: one tenant.
    #[serde(default)]
    pub tenant: String,
    /// `newest` (the default), `oldest`, `name` or `state`.
    #[serde(default)]
    pub sort: String,
    /// Which page: a [`Cursor`] as the pager's links write it (empty: the first page).
    #[serde(default)]
    pub cursor: String,
    /// `rows`: only the table body (the page polls it).
    #[serde(default)]
    pub part: String,
}

/// Rows a page of the workload list shows.
pub const PER_PAGE: usize = 50;
/// The orders the list sorts by, with their words.
const SORTS: [(&str, &str); 4] = [
    ("newest", "newest first"),
    ("oldest", "oldest first"),
    ("name", "name"),
    ("state", "state"),
];

/// The tenant and project `f` asks for: `tenant/project`, or a bare project of the caller's
/// own tenant (platform admins: of the tenant filter).
fn project_filter(c: &Caller, f: &Filter) -> (Option<String>, Option<String>) {
    let tenant = (!f.tenant.is_empty()).then(|| f.tenant.clone());
    match f.project.split_once('/') {
        Some((t, p)) => (Some(t.to_string()), Some(p.to_string())),
        None if f.project.is_empty() => (tenant, None),
        None => (tenant.or_else(|| c.id.tenant.clone()), Some(f.project.clone())),
    }
}

/// The store's order for a sort of [`SORTS`] (newest first for any other word).
fn order_of(sort: &str) -> tessera_store::WorkloadOrder {
    use tessera_store::WorkloadOrder as O;
    match sort {
        "oldest" => O::Oldest,
        "name" => O::Name,
        "state" => O::Phase,
        _ => O::Newest,
    }
}

/// `rows` with the token ids in their reasons named where the caller may see the token
/// ([`tokens::token_names`]): another tenant's or a platform token stays a bare id.
pub async fn name_rows(s: &AppState, c: &Caller, mut rows: Vec<Row>) -> Result<Vec<Row>, ApiError> {
    tokens::name_in(s, &c.id, rows.iter_mut().map(|r| &mut r.reason)).await?;
    Ok(rows)
}

/// A page of the workload list other than the first, as the pager's links carry it: the page
/// starts just after a workload in the list's order (or, going back, ends just before one), so
/// a page costs the same at any depth and workloads requested meanwhile shift nothing (keyset
/// paging, [`tessera_store::WorkloadFilter::after`]). `first` is the row number of the page's
/// first row, for the caption only. Written as base64 of its fields and the sort it belongs to;
/// the user sees and edits nothing of it. Whatever a cursor says, the store reads only the
/// caller's own tenant's workloads: a made-up cursor can only move where a page starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cursor {
    pub back: bool,
    pub first: usize,
    pub seek: tessera_store::WorkloadSeek,
}

impl Cursor {
    /// The cursor as a link writes it, for the list sorted by `sort`.
    pub fn encode(&self, sort: &str) -> String {
        use base64::Engine;
        let text = format!(
            "{sort}\n{}\n{}\n{}\n{}",
            if self.back { "b" } else { "a" },
            self.first,
            self.seek.id.0,
            self.seek.key
        );
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
    }

    /// The cursor `text` encodes, if it is one of the list sorted by `sort`.
    pub fn decode(text: &str, sort: &str) -> Option<Cursor> {
        use base64::Engine;
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(text).ok()?;
        let text = String::from_utf8(bytes).ok()?;
        let mut parts = text.splitn(5, '\n');
        if parts.next()? != sort {
            return None;
        }
        let back = match parts.next()? {
            "a" => false,
            "b" => true,
            _ => return None,
        };
        let first = parts.next()?.parse().ok()?;
        let id = WorkloadId(parts.next()?.parse().ok()?);
        let key = parts.next()?.to_string();
        Some(Cursor {
            back,
            first,
            seek: tessera_store::WorkloadSeek { id, key },
        })
    }
}

/// One page of the caller's workloads.
struct Listed {
    rows: Vec<Row>,
    /// How many rows come before its first row.
    first: usize,
    /// How many workloads match, where counted.
    total: Option<u64>,
    /// The cursors of the pages before and after it, where there are such pages.
    prev: Option<Option<Cursor>>,
    next: Option<Cursor>,
}

/// The sort word of `f` (`newest` when none is asked).
fn sort_of(f: &Filter) -> &str {
    if f.sort.is_empty() { "newest" } else { f.sort.as_str() }
}

/// One page of the caller's workloads matching `f`, at `at` (`None`: the first page). The
/// store sorts and pages over every matching workload and always within the caller's tenant
/// (`scope`), whatever the filters or the cursor name.
///
/// `counted`: also count the matching workloads, and number the page's rows by counting those
/// before its first row (two counts by the store); otherwise the number comes from the cursor.
async fn list(
    s: &AppState,
    c: &Caller,
    f: &Filter,
    at: Option<&Cursor>,
    per_page: usize,
    counted: bool,
) -> Result<Listed, ApiError> {
    let phases = WorkloadState::parse(&f.state).map(views::phases).unwrap_or_default();
    let (tenant, project) = project_filter(c, f);
    let order = order_of(&f.sort);
    let filter = tessera_store::WorkloadFilter {
        scope: c.id.scope().map(str::to_string),
        tenant,
        project,
        phases,
        before: None,
        order,
        after: at.map(|a| a.seek.clone()),
        backward: at.is_some_and(|a| a.back),
        limit: u32::try_from(per_page + 1).unwrap_or(u32::MAX),
    };
    let mut all = s.store.list_workloads(&filter).await?;
    let more = all.len() > per_page;
    let (first, prev_exists) = match at {
        Some(a) if a.back => {
            if all.len() < per_page {
                // Back at the start (some went meanwhile): the first page, whole.
                return Box::pin(list(s, c, f, None, per_page, counted)).await;
            }
            // The extra row read is the one before the page.
            if more {
                all.remove(0);
            }
            (if more { a.first.max(1) } else { 0 }, more)
        }
        Some(a) => {
            all.truncate(per_page);
            (a.first, true)
        }
        None => {
            all.truncate(per_page);
            (0, false)
        }
    };
    let next_exists = if at.is_some_and(|a| a.back) { true } else { more };
    let seek = |w: &tessera_domain::Workload| tessera_store::WorkloadSeek::of(order, w);
    // Counted: how many match, and how many come before the page's first row (the same filter
    // read back from that row), so the rows' numbers are exact even when workloads were
    // requested since the pager's link was made.
    let (first, total) = if counted {
        let whole = tessera_store::WorkloadFilter {
            after: None,
            backward: false,
            ..filter.clone()
        };
        let total = s.store.count_workloads(&whole).await?;
        let first = match all.first() {
            Some(w) if at.is_some() => {
                let before = tessera_store::WorkloadFilter {
                    after: Some(seek(w)),
                    backward: true,
                    ..whole
                };
                usize::try_from(s.store.count_workloads(&before).await?).unwrap_or(usize::MAX)
            }
            _ => first,
        };
        (first, Some(total))
    } else {
        (first, None)
    };
    let prev = prev_exists.then(|| {
        // The page before this one ends before its first row; from the second page that is
        // the first page itself.
        match all.first() {
            Some(w) if first > per_page => Some(Cursor {
                back: true,
                first: first - per_page,
                seek: seek(w),
            }),
            _ => None,
        }
    });
    let next = all.last().filter(|_| next_exists).map(|w| Cursor {
        back: false,
        first: first + all.len(),
        seek: seek(w),
    });
    let rows = all.iter().map(|w| row(&views::workload(w))).collect();
    Ok(Listed {
        rows: name_rows(s, c, rows).await?,
        first,
        total,
        prev,
        next,
    })
}

#[derive(Template)]
#[template(path = "console/workloads.html")]
struct Workloads {
    chrome: Chrome,
    rows: Vec<Row>,
    states: Vec<(&'static str, bool)>,
    /// `(tenant/project, selected)`: the projects the caller may see.
    projects: Vec<(String, bool)>,
    /// Platform admins: `(tenant, selected)`.
    tenants: Vec<(String, bool)>,
    sorts: Vec<(&'static str, &'static str, bool)>,
    query: String,
    can_write: bool,
    /// How many rows come before the first shown.
    first: usize,
    /// How many workloads match the filters, with thousands separated (`1,234`).
    total: String,
    prev: Option<String>,
    next: Option<String>,
}

#[derive(Template)]
#[template(path = "console/workload_rows.html")]
struct WorkloadRows {
    rows: Vec<Row>,
    can_write: bool,
}

/// `GET /console/workloads`: the caller's workloads (all, for platform-admins), newest first,
/// filtered by state and project; `part=rows` answers only the rows (polled every 3 s).
pub async fn workloads(State(s): State<AppState>, c: Caller, Query(f): Query<Filter>) -> Result<Response, ApiError> {
    if !f.state.is_empty() && WorkloadState::parse(&f.state).is_none() {
        return Err(ApiError::invalid(
            "state",
            format!(
                "unknown state `{}` ({})",
                f.state,
                WorkloadState::ALL.map(WorkloadState::as_str).join(", ")
            ),
        ));
    }
    if !f.sort.is_empty() && !SORTS.iter().any(|(k, _)| *k == f.sort) {
        return Err(ApiError::invalid(
            "sort",
            format!("unknown order `{}` ({})", f.sort, SORTS.map(|(k, _)| k).join(", ")),
        ));
    }
    let sort = sort_of(&f);
    let at = if f.cursor.is_empty() {
        None
    } else {
        let c = Cursor::decode(&f.cursor, sort);
        if c.is_none() {
            return Err(ApiError::invalid(
                "cursor",
                "not a page of this list: the pager's links carry it, start again from the first page".to_string(),
            ));
        }
        c
    };
    let admin = c.id.is_admin();
    let can_write = admin || c.id.role != crate::auth::Role::Viewer;
    if f.part == "rows" {
        // The polled rows: the filters were checked when the page was made.
        let rows = list(&s, &c, &f, at.as_ref(), PER_PAGE, false).await?.rows;
        return Ok(html(&WorkloadRows { rows, can_write }));
    }
    // The tenants and projects the caller may see: the choices of the filters. A value that
    // is not among them is refused, not answered with an empty list.
    let tenants: Vec<String> = if admin {
        super::tenant_names(&s).await?
    } else {
        c.id.tenant.clone().into_iter().collect()
    };
    let tenant_ok = f.tenant.is_empty() || (admin && tenants.contains(&f.tenant));
    if !tenant_ok {
        return Err(ApiError::invalid(
            "tenant",
            format!("no tenant `{}` to choose", f.tenant),
        ));
    }
    let mut projects: Vec<String> = Vec::new();
    for t in tenants.iter().filter(|t| f.tenant.is_empty() || **t == f.tenant) {
        for p in s.store.list_projects(t, None, 1000).await? {
            projects.push(format!("{}/{}", p.tenant, p.name));
        }
    }
    let (pt, pp) = project_filter(&c, &f);
    let asked = pp.as_ref().map(|p| format!("{}/{p}", pt.clone().unwrap_or_default()));
    if let Some(a) = &asked
        && !projects.contains(a)
    {
        return Err(ApiError::invalid(
            "project",
            format!("no project `{}` to choose", f.project),
        ));
    }
    let listed = list(&s, &c, &f, at.as_ref(), PER_PAGE, true).await?;
    // The filters and page as a query string: the pager's links and the rows' refresh.
    let query_of = |at: Option<&Cursor>| {
        serde_urlencoded::to_string([
            ("state", f.state.as_str()),
            ("tenant", f.tenant.as_str()),
            ("project", f.project.as_str()),
            ("sort", f.sort.as_str()),
            ("cursor", &at.map(|a| a.encode(sort)).unwrap_or_default()),
        ])
        .unwrap_or_default()
    };
    let link = |at: Option<&Cursor>| format!("/console/workloads?{}", query_of(at));
    let query = query_of(at.as_ref());
    Ok(html(&Workloads {
        chrome: Chrome::new(&c, &s, "workloads"),
        states: WorkloadState::ALL
            .iter()
            .map(|x| (x.as_str(), x.as_str() == f.state))
            .collect(),
        projects: projects
            .into_iter()
            .map(|p| {
                let sel = asked.as_deref() == Some(p.as_str());
                (p, sel)
            })
            .collect(),
        tenants: if admin {
            tenants.into_iter().map(|t| (t.clone(), t == f.tenant)).collect()
        } else {
            Vec::new()
        },
        sorts: SORTS.iter().map(|(k, w)| (*k, *w, *k == sort)).collect(),
        query,
        can_write,
        first: listed.first,
        total: listed.total.map(thousands).unwrap_or_default(),
        prev: listed.prev.map(|p| link(p.as_ref())),
        next: listed.next.as_ref().map(|n| link(Some(n))),
        rows: listed.rows,
    }))
}

/// `n` with its thousands separated by commas: `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}

/// One step of a timeline, with how long the workload spent before the next one.
pub struct Step {
    pub step: String,
    pub at: String,
    pub took: String,
    pub detail: String,
}

/// A duration in words: `850 ms`, `12.3 s`, `4 min 05 s`, `2 h 10 min`.
pub fn took(ms: i64) -> String {
    match ms {
        ..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{} min {:02} s", ms / 60_000, (ms % 60_000) / 1000),
        _ => format!("{} h {:02} min", ms / 3_600_000, (ms % 3_600_000) / 60_000),
    }
}

/// The timeline's steps; each step's duration runs to the next step (the last one's to now,
/// unless the workload has ended).
pub fn steps(events: &[Event], ended: bool, now: i64) -> Vec<Step> {
    events
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let next = events.get(i + 1).map(|n| n.at_ms).or((!ended).then_some(now));
            Step {
                step: e.step.clone(),
                at: e.at.get(..23).unwrap_or(&e.at).replace('T', " "),
                took: next.map(|n| took((n - e.at_ms).max(0))).unwrap_or_default(),
                detail: e.detail.clone(),
            }
        })
        .collect()
}

#[derive(Template)]
#[template(path = "console/workload.html")]
struct WorkloadPage {
    chrome: Chrome,
    id: u64,
    name: String,
    live: WorkloadLive,
}

/// The part of a workload's page that refreshes while it runs: its facts, its GPUs now and
/// over the chosen window (the charts with the table of its devices, above the logs), its
/// timeline and logs.
/// The fragment asks to be fetched again (htmx `every 2s`) only while the workload has not
/// ended, so polling stops by itself at a terminal state.
#[derive(Template)]
#[template(path = "console/workload_live.html")]
struct WorkloadLive {
    w: Row,
    priority: String,
    units: String,
    /// The kind, and whether and how consolidation may move it, in words.
    kind: String,
    steps: Vec<Step>,
    can_cancel: bool,
    /// The tail of the captured output; `None` when the backend keeps no logs.
    logs: Option<String>,
    /// Said above the logs (how much is shown, or why there is none).
    logs_note: String,
    /// A placed multi-node gang's node-shares, in gang order, each with its rack.
    shares: Vec<ShareRow>,
    /// The same by rack: `(rack, node-shares, GPUs)`, in the order the gang reaches them.
    racks: Vec<(String, usize, usize)>,
    /// What it has cost so far and is expected to cost at its end.
    cost: Cost,
    /// Its GPUs' use now from telemetry, in words ([`gpu_use`]); empty when not running.
    gpu_use: String,
    /// While it runs: each of its devices in the latest telemetry.
    gpus: Option<GpusNow>,
    /// While it waits: why, what to do, its place in the queue, the pools that cannot serve it.
    waits: Option<Waits>,
    /// Its GPUs' use over the chosen window (the fragment keeps the window when it refreshes).
    telemetry: TelemetryChart,
}

/// Workload `id`'s devices in telemetry `t` ([`crate::workload_history::readings`]): each MIG
/// instance or share the backend names it the holder of, and the whole GPUs it holds, `whole`,
/// that no sample names a holder of.
pub fn devices_of(
    t: &crate::lifecycle::Telemetry,
    id: u64,
    whole: &[(&str, u8)],
) -> Vec<crate::workload_history::Reading> {
    crate::workload_history::readings(t, |node, gpu| whole.contains(&(node, gpu)).then_some(id))
        .remove(&id)
        .unwrap_or_default()
}

/// What workload `id` uses of its GPUs now, from the latest telemetry no older than two
/// minutes: the engines' activity (DCGM's `GR_ENGINE_ACTIVE` of each MIG instance or share;
/// the GPU's utilisation for a whole GPU, [`devices_of`]) averaged over its devices, and its
/// memory in use of what it was given.
pub fn gpu_use(t: &crate::lifecycle::Telemetry, id: u64, whole: &[(&str, u8)], now: i64) -> String {
    if let Some(why) = super::stale_telemetry(t, now) {
        return why;
    }
    let devices = devices_of(t, id, whole);
    let n = devices.len() as u32;
    let active: f64 = devices.iter().map(|d| d.util_pct / 100.0).sum();
    let used: u64 = devices.iter().map(|d| d.used_mib).sum();
    let total: u64 = devices.iter().map(|d| d.total_mib).sum();
    if n == 0 {
        return "not in the latest telemetry".into();
    }
    let what = if n == 1 {
        "1 device".to_string()
    } else {
        format!("{n} devices")
    };
    if total > 0 {
        format!(
            "engines {:.0} % busy · memory {used} of {total} MiB ({:.0} %) · over {what}",
            active * 100.0 / f64::from(n),
            used as f64 * 100.0 / total as f64
        )
    } else {
        format!(
            "engines {:.0} % busy · memory {used} MiB · over {what}",
            active * 100.0 / f64::from(n)
        )
    }
}

/// A running workload's devices in the latest telemetry, on its page.
pub struct GpusNow {
    /// One row per device: node, GPU, device, utilisation, memory in use.
    pub rows: Vec<[String; 5]>,
    /// When the telemetry was sampled and how long ago, or that none was reported.
    pub note: String,
}

/// Workload `id`'s devices (its whole GPUs `whole`, and the instances and shares telemetry
/// names it the holder of) as the latest telemetry reports them, with the reading's age; the
/// age is said to be stale past two minutes. With no reading of its devices the note says so
/// (never zeros).
pub fn gpus_now(t: &crate::lifecycle::Telemetry, id: u64, whole: &[(&str, u8)], now: i64) -> GpusNow {
    let devices = if t.at > 0 { devices_of(t, id, whole) } else { Vec::new() };
    if devices.is_empty() {
        return GpusNow {
            rows: Vec::new(),
            note: if t.at > 0 {
                format!(
                    "No telemetry reported for these GPUs (the latest telemetry, {} ago, names none of them).",
                    took((now - t.at).max(0))
                )
            } else {
                "No telemetry reported for these GPUs: the backend has reported no telemetry.".into()
            },
        };
    }
    let age = (now - t.at).max(0);
    let note = if super::stale_telemetry(t, now).is_some() {
        format!(
            "Stale: the last reading, sampled at {}, is {} old; the backend has reported nothing since.",
            tessera_api::rfc3339_ms(t.at),
            took(age)
        )
    } else {
        format!("Sampled at {} ({} ago).", tessera_api::rfc3339_ms(t.at), took(age))
    };
    let rows = devices
        .iter()
        .map(|d| {
            let memory = if d.total_mib > 0 {
                format!(
                    "{} of {} MiB ({:.0} %)",
                    d.used_mib,
                    d.total_mib,
                    d.used_mib as f64 * 100.0 / d.total_mib as f64
                )
            } else {
                format!("{} MiB", d.used_mib)
            };
            [
                d.node.clone(),
                d.gpu.to_string(),
                d.device.clone(),
                format!("{:.0} %", d.util_pct),
                memory,
            ]
        })
        .collect();
    GpusNow { rows, note }
}

/// Why a waiting workload waits, on its page.
pub struct Waits {
    pub code: &'static str,
    pub sentence: String,
    pub next: String,
    /// `3rd of 7 waiting in tenant vision's queue`.
    pub position: String,
    /// Each pool whose sharing cannot serve the shape, as a sentence.
    pub not_serving: Vec<String>,
    /// The queue page listing the workloads waiting for the same reason.
    pub same_reason: String,
    /// For a gang that holds no nodes yet: when and where it would start if it held them now
    /// (the API's `expected_start`); empty otherwise.
    pub expected: String,
}

/// For a request waiting for capacity (no room, fragmented, kept apart): when running
/// work in the pool it waits for (its class; every pool for `any`) is first due to end by its
/// lease, as the "wait until" of its next step; `None` when no such work has a lease.
fn capacity_frees(snap: &crate::lifecycle::Snapshot, code: &str, class: &str) -> Option<String> {
    if !matches!(code, "no-capacity" | "fragmentation" | "isolation") {
        return None;
    }
    let pools: Vec<usize> = match snap.fleet.pool_by_name(class) {
        Some(p) => vec![p.0 as usize],
        None => (0..snap.fleet.pools.len()).collect(),
    };
    let (end, pool) = pools
        .into_iter()
        .filter_map(|p| Some((snap.queue.next_end.get(p).copied().flatten()?, p)))
        .min()?;
    let name = &snap.fleet.pools[pool].name;
    Some(format!(
        "Running work in pool {name} is due to end from about {} (by its lease); capacity frees up then at the earliest.",
        tessera_sched::reason::utc_datetime(end)
    ))
}

/// Why workload `id` waits, if it is in the published queue.
fn waits(s: &AppState, admin: bool, id: u64) -> Option<Waits> {
    let snap = s.lifecycle.snapshot();
    let w = snap.queue.waiting.iter().find(|w| w.workload.id.0 == id)?;
    let wl = &*w.workload;
    let code = wl.reason.as_ref().map_or(super::why::NOT_YET, |r| r.code.as_str());
    let tenant = wl.spec.tenant.as_str();
    let places = super::why::positions(&snap.queue.waiting, &s.priorities, |t| t == tenant);
    let fleet = &snap.fleet;
    let not_serving = match (&snap.trial, &wl.spec.shape.gpu) {
        (Some(trial), g) if !matches!(g, tessera_domain::GpuSpec::Gang(_)) => {
            crate::lifecycle::placement::engine_request(fleet, &wl.spec.shape, wl.spec.cpu_milli, wl.spec.memory_mib)
                .map(|req| {
                    trial
                        .pools_not_serving(&req)
                        .iter()
                        .map(|u| super::why::sentence("", &u.message()))
                        .collect()
                })
                .unwrap_or_default()
        }
        (_, tessera_domain::GpuSpec::Gang(g)) => {
            // The allowed models as the scheduler resolves them (none: any model).
            let models = crate::lifecycle::placement::engine_request(
                fleet,
                &wl.spec.shape,
                wl.spec.cpu_milli,
                wl.spec.memory_mib,
            )
            .map(|r| r.models)
            .unwrap_or_default();
            super::why::gang_pools_not_serving(fleet, g.gpus_per_node, &models)
        }
        _ => Vec::new(),
    };
    let same_reason = serde_urlencoded::to_string([("tenant", tenant), ("reason", code)])
        .map(|q| format!("/console/queue?{q}#waiting-h"))
        .unwrap_or_default();
    Some(Waits {
        code,
        sentence: wl
            .reason
            .as_ref()
            .map(|r| super::why::sentence(code, &r.detail))
            .unwrap_or_else(|| "The scheduler has not looked at it yet.".into()),
        next: {
            let mut next = super::why::next_step(code, admin, crate::clock::now_ms());
            if let Some(t) = capacity_frees(&snap, code, &w.class) {
                next = format!("{next} {t}");
            }
            next
        },
        position: places
            .get(&id)
            .map(|p| super::why::position_words(tenant, *p))
            .unwrap_or_default(),
        expected: String::new(),
        not_serving,
        same_reason,
    })
}

/// A workload's cost on its page: its use so far from the ledger, and — with a duration —
/// what it will have used at its lease's end.
pub struct Cost {
    /// GPU-unit-hours used so far and their cost (or that no price list is configured).
    pub so_far_unit_hours: String,
    pub so_far: String,
    /// `Some((unit-hours, money, when))` when the workload has a duration; `when` says when it
    /// ends (or that it ends that long after it starts).
    pub at_end: Option<(String, String, String)>,
    /// Why there is no expected cost at the end, when there is none.
    pub no_end: &'static str,
}

/// The cost of `w` from its usage intervals: so far (open intervals to `now`) and at its end.
pub fn cost(
    w: &Workload,
    intervals: &[tessera_store::UsageInterval],
    prices: &crate::usage::Prices,
    util: &std::collections::HashMap<WorkloadId, f64>,
    now: i64,
) -> Cost {
    let money = super::Money::new(prices);
    let (_, total) = crate::usage::report(intervals, 0, i64::MAX, now, crate::usage::By::Tenant, prices, util);
    let units: f64 = w.units.parse().unwrap_or(0.0);
    // The price where it runs (its last interval), else where it asked to run.
    let price = intervals.last().map(|i| prices.price(&i.pool, &i.model)).or_else(|| {
        let pool = w.shape.pool.as_deref()?;
        Some(prices.price(pool, w.shape.models.first().map(String::as_str).unwrap_or("")))
    });
    let at_end = w.duration_s.map(|d| {
        let d_ms = d.saturating_mul(1000);
        let (more_ms, when) = if w.state.is_terminal() {
            (0, "ended".to_string())
        } else if let Some(since) = w.running_at_ms {
            let end = since.saturating_add(d_ms);
            (
                (end - now).max(0),
                format!("ends at about {}", tessera_sched::reason::utc_datetime(end)),
            )
        } else {
            (d_ms, format!("ends {} after it starts", took(d_ms)))
        };
        let more = units * more_ms as f64 / 3_600_000.0;
        let h = total.allocated_unit_hours + more;
        let m = match price {
            Some(p) => money.show(total.cost_allocated + more * p),
            None if money.priced => "depends on the pool it runs in".to_string(),
            None => super::NO_PRICES.to_string(),
        };
        (super::uh(h), m, when)
    });
    Cost {
        so_far_unit_hours: super::uh(total.allocated_unit_hours),
        so_far: money.show(total.cost_allocated),
        at_end,
        no_end: if w.duration_s.is_none() {
            "no duration: it runs until it ends or is cancelled"
        } else {
            ""
        },
    }
}

/// One node-share of a gang on the workload's page.
pub struct ShareRow {
    pub rack: String,
    pub node: String,
    pub gpus: String,
    pub units: String,
}

/// A placed gang's node-shares with their racks (from the fleet's topology; `-` where the
/// node's pool declares no racks), and the count by rack.
fn gang_shares(f: &tessera_model::Fleet, w: &Workload) -> (Vec<ShareRow>, Vec<(String, usize, usize)>) {
    let Some(a) = w.allocation.as_ref().filter(|a| !a.shares.is_empty()) else {
        return (Vec::new(), Vec::new());
    };
    let level = f.levels.level("rack");
    let rack = |node: &str| {
        f.node_by_name(node)
            .zip(level)
            .and_then(|(n, l)| f.levels.domain_name(l, n))
            .unwrap_or("-")
            .to_string()
    };
    let others: u64 = a.shares.iter().map(|x| x.units_milli).sum();
    let all = std::iter::once((a.node.as_str(), a.gpus.as_slice(), a.units_milli.saturating_sub(others))).chain(
        a.shares
            .iter()
            .map(|x| (x.node.as_str(), x.gpus.as_slice(), x.units_milli)),
    );
    let mut shares = Vec::new();
    let mut racks: Vec<(String, usize, usize)> = Vec::new();
    for (node, gpus, units) in all {
        let r = rack(node);
        match racks.iter_mut().find(|(x, _, _)| *x == r) {
            Some(e) => {
                e.1 += 1;
                e.2 += gpus.len();
            }
            None => racks.push((r.clone(), 1, gpus.len())),
        }
        shares.push(ShareRow {
            rack: r,
            node: node.to_string(),
            gpus: gpus.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(","),
            units: tessera_model::GpuUnits(units).to_string(),
        });
    }
    (shares, racks)
}

/// How much of a log the page shows (its end), and how much it reads at most to find it.
const LOG_TAIL: usize = 16 * 1024;
const LOG_READ_MAX: u64 = 1024 * 1024;

/// The last [`LOG_TAIL`] bytes of the first [`LOG_READ_MAX`] of a workload's log, and a note.
async fn log_tail(s: &AppState, wid: WorkloadId) -> (Option<String>, String) {
    if !s.backend.capabilities().logs {
        return (None, format!("No logs from this backend ({}).", s.backend_name));
    }
    let mut tail: Vec<u8> = Vec::new();
    let mut off = 0;
    loop {
        let c = match s.backend.read_logs(wid.0, off, 64 * 1024).await {
            Ok(c) => c,
            Err(e) => return (None, format!("No logs: {e}.")),
        };
        tail.extend_from_slice(&c.bytes);
        if tail.len() > LOG_TAIL {
            tail.drain(..tail.len() - LOG_TAIL);
        }
        let more = !c.bytes.is_empty() && c.next_offset < LOG_READ_MAX;
        off = c.next_offset;
        if !more {
            break;
        }
    }
    let note = if off == 0 {
        "No output yet.".to_string()
    } else if off as usize > tail.len() {
        format!("The last {} KB of {} KB of output.", tail.len() / 1024, off / 1024)
    } else {
        format!("{off} bytes of output.")
    };
    (Some(String::from_utf8_lossy(&tail).into_owned()), note)
}

fn workload_id(raw: &str) -> Result<WorkloadId, ApiError> {
    raw.parse::<u64>()
        .ok()
        .filter(|v| *v <= i64::MAX as u64)
        .map(WorkloadId)
        .ok_or_else(|| ApiError::not_found(format!("no workload {raw}")))
}

/// The live part of a workload's page (through the API's service, so tenant scoping applies).
async fn live(
    s: &AppState,
    c: &Caller,
    wid: WorkloadId,
    window: crate::history::Window,
) -> Result<WorkloadLive, ApiError> {
    let w = workloads::get(s, &c.id, wid).await?;
    let events: Vec<Event> = s
        .store
        .events(wid, c.id.scope())
        .await?
        .iter()
        .map(views::event)
        .collect();
    let mut r = row(&w);
    let can_cancel = !r.ended && c.id.can_write(&w.tenant);
    // Events and reasons record a token's id: name it where the caller may see the token.
    let texts = events.iter().map(|e| e.detail.as_str()).chain([r.reason.as_str()]);
    let names = tokens::token_names(s, &c.id, texts).await?;
    r.reason = tokens::name_tokens(&r.reason, &names);
    let (logs, logs_note) = log_tail(s, wid).await;
    let (shares, racks) = gang_shares(&s.fleet(), &w);
    let intervals = s.store.usage_of(wid).await?;
    let cost = cost(
        &w,
        &intervals,
        &s.prices,
        &s.lifecycle.snapshot().utilisation,
        crate::clock::now_ms(),
    );
    let (gpu_use, gpus) = if w.state == tessera_api::WorkloadState::Running {
        let whole: Vec<(&str, u8)> = w
            .allocation
            .iter()
            .filter(|a| a.kind == "whole")
            .flat_map(|a| {
                let first = a.gpus.iter().map(|g| (a.node.as_str(), *g));
                let rest = a
                    .shares
                    .iter()
                    .flat_map(|x| x.gpus.iter().map(|g| (x.node.as_str(), *g)));
                first.chain(rest)
            })
            .collect();
        let t = s.lifecycle.published().telemetry();
        let now = crate::clock::now_ms();
        (gpu_use(&t, wid.0, &whole, now), Some(gpus_now(&t, wid.0, &whole, now)))
    } else {
        (String::new(), None)
    };
    let waits = if r.ended || w.state != WorkloadState::Queued {
        None
    } else {
        waits(s, c.id.is_admin(), w.id).map(|x| Waits {
            // A gang not yet holding nodes: when and where it would start if it held them now.
            expected: w
                .expected_start
                .as_deref()
                .map(|e| super::why::sentence("", e))
                .unwrap_or_default(),
            ..x
        })
    };
    Ok(WorkloadLive {
        telemetry: telemetry_chart(s, wid.0, window, crate::clock::now_ms()),
        waits,
        cost,
        gpu_use,
        gpus,
        shares,
        racks,
        steps: steps(&events, r.ended, crate::clock::now_ms())
            .into_iter()
            .map(|mut x| {
                x.detail = tokens::name_tokens(&x.detail, &names);
                x
            })
            .collect(),
        w: r,
        priority: w.priority.clone(),
        units: w.units.clone(),
        kind: format!(
            "{}, {}",
            w.kind.as_str(),
            match w.movable {
                None => "never moved",
                Some(tessera_api::MovableMode::Restart) => "movable: may be stopped and requeued to make room",
                Some(tessera_api::MovableMode::Replace) => "movable: may be replaced elsewhere (replacement first)",
            }
        ),
        can_cancel,
        logs,
        logs_note,
    })
}

/// The workload page's query: the chart's time range; the data's format.
#[derive(Deserialize, Default)]
pub struct TelemetryQuery {
    /// `1h`, `24h` (default), `7d` or `30d`.
    #[serde(default)]
    pub range: String,
    /// `csv` (default) or `json` (the data endpoint).
    #[serde(default)]
    pub format: String,
}

/// A workload's GPU use over a window, for its page.
pub struct TelemetryChart {
    pub window: crate::history::Window,
    pub ranges: Vec<super::charts::RangeLink>,
    /// How many points there are (0: no telemetry reported in the window).
    pub points: usize,
    /// The charts' data (`data-chart`): mean utilisation, and memory in use of the devices'.
    pub util: String,
    pub memory: String,
    /// The window's mean utilisation and most memory in use, in words.
    pub mean_util: String,
    pub peak_memory: String,
    /// The numbers as CSV.
    pub csv: String,
}

/// Records this minute of every workload from the latest telemetry (as the pools' charts do
/// on each request), and returns workload `id`'s points in `window`.
fn telemetry_points(
    s: &AppState,
    id: u64,
    window: crate::history::Window,
    now: i64,
) -> Vec<crate::workload_history::Point> {
    let live = crate::workload_history::sample(&s.lifecycle.snapshot(), &s.lifecycle.published().telemetry(), now);
    s.workload_history.record(now, live);
    s.workload_history.window(id, window, now)
}

fn telemetry_chart(s: &AppState, id: u64, window: crate::history::Window, now: i64) -> TelemetryChart {
    let v = telemetry_points(s, id, window, now);
    let x: Vec<i64> = v.iter().map(|p| p.at / 1000).collect();
    let total = v.iter().map(|p| p.total_mib).max().unwrap_or(0);
    let hourly = window.bucket_minutes() > 1;
    // The time axis spans the whole window, however few minutes it ran in it.
    let from = window.start(now);
    let x_range = [from / 1000, now / 1000];
    let util = serde_json::json!({
        "title": format!("Mean GPU utilisation of its devices, %, {}", window.label()),
        "x": x,
        "xRange": x_range,
        "y": [0, 100],
        "series": [{"label": if hourly { "utilisation % (hour's mean)" } else { "utilisation %" }, "values": v.iter().map(|p| p.util_pct).collect::<Vec<_>>()}],
    });
    // Memory in GiB: the axis' numbers stay short.
    let gib = |mib: f64| (mib / 1024.0 * 100.0).round() / 100.0;
    let memory = serde_json::json!({
        "title": format!("GPU memory in use, GiB (of {}), {}", gib(f64::from(total)), window.label()),
        "x": x,
        "xRange": x_range,
        "y": [0.0, gib(f64::from(total.max(1)))],
        "series": [
            {"label": if hourly { "in use (hour's mean)" } else { "in use" }, "values": v.iter().map(|p| gib(p.used_mib)).collect::<Vec<_>>()},
            {"label": "its devices' memory", "values": v.iter().map(|p| gib(f64::from(p.total_mib))).collect::<Vec<_>>()},
        ],
    });
    let query = |range: &str, format: Option<&str>| {
        let mut q = vec![("range", range)];
        q.extend(format.map(|f| ("format", f)));
        serde_urlencoded::to_string(q).unwrap_or_default()
    };
    TelemetryChart {
        window,
        ranges: crate::history::Window::ALL
            .into_iter()
            .map(|w| super::charts::RangeLink {
                key: w.key(),
                href: format!("/console/workloads/{id}?{}#telemetry-h", query(w.key(), None)),
                current: w == window,
            })
            .collect(),
        points: v.len(),
        util: util.to_string(),
        memory: memory.to_string(),
        mean_util: if v.is_empty() {
            String::new()
        } else {
            format!("{:.1} %", v.iter().map(|p| p.util_pct).sum::<f64>() / v.len() as f64)
        },
        peak_memory: format!("{:.0} MiB", v.iter().map(|p| p.used_mib).fold(0.0, f64::max)),
        csv: format!("/console/workloads/{id}/telemetry?{}", query(window.key(), Some("csv"))),
    }
}

/// `GET /console/workloads/{id}?range=1h|24h|7d|30d`: one workload, its timeline with step
/// durations and its logs, refreshed in place while it runs; its GPUs' use over the window.
pub async fn workload(
    State(s): State<AppState>,
    c: Caller,
    Path(raw): Path<String>,
    Query(q): Query<TelemetryQuery>,
) -> Result<Response, ApiError> {
    let window = super::charts::window_of(&q.range)?;
    let live = live(&s, &c, workload_id(&raw)?, window).await?;
    Ok(html(&WorkloadPage {
        chrome: Chrome::new(&c, &s, "workloads"),
        id: live.w.id,
        name: live.w.name.clone(),
        live,
    }))
}

/// `GET /console/workloads/{id}/telemetry?range=…&format=csv|json`: the numbers behind the
/// workload's GPU charts, one row a point (a minute, or an hour's mean). The workload is read
/// through the API's service first, so another tenant's is not found.
pub async fn workload_telemetry(
    State(s): State<AppState>,
    c: Caller,
    Path(raw): Path<String>,
    Query(q): Query<TelemetryQuery>,
) -> Result<Response, ApiError> {
    let wid = workload_id(&raw)?;
    // Read for access only (another tenant's is not found): `find`, not `get`, which would
    // also plan a waiting gang's start.
    let id = workloads::find(&s, &c.id, wid).await?.id.0;
    let window = super::charts::window_of(&q.range)?;
    let v = telemetry_points(&s, id, window, crate::clock::now_ms());
    match q.format.as_str() {
        "" | "csv" => {
            let mut out = String::from("start_utc,minutes,workload,utilisation_pct,memory_used_mib,memory_mib\n");
            for p in &v {
                out.push_str(&format!(
                    "{},{},{},{:.1},{:.0},{}\n",
                    tessera_api::rfc3339_ms(p.at),
                    window.bucket_minutes(),
                    id,
                    p.util_pct,
                    p.used_mib,
                    p.total_mib
                ));
            }
            Ok((
                [
                    (axum::http::header::CONTENT_TYPE, "text/csv; charset=utf-8".to_string()),
                    (
                        axum::http::header::CONTENT_DISPOSITION,
                        format!("attachment; filename=\"workload-{}-gpus-{}.csv\"", id, window.key()),
                    ),
                ],
                out,
            )
                .into_response())
        }
        "json" => Ok(axum::Json(serde_json::json!({
            "workload": id,
            "range": window.key(),
            "bucket_minutes": window.bucket_minutes(),
            "x": v.iter().map(|p| p.at / 1000).collect::<Vec<_>>(),
            "utilisation_pct": v.iter().map(|p| p.util_pct).collect::<Vec<_>>(),
            "memory_used_mib": v.iter().map(|p| p.used_mib).collect::<Vec<_>>(),
            "memory_mib": v.iter().map(|p| p.total_mib).collect::<Vec<_>>(),
        }))
        .into_response()),
        other => Err(ApiError::invalid(
            "format",
            format!("unknown format `{other}` (csv, json)"),
        )),
    }
}

/// `GET /console/workloads/{id}/live?range=…`: the refreshing fragment of the workload's page
/// (its telemetry charts over the window `range` names, 24 hours by default).
pub async fn workload_live(
    State(s): State<AppState>,
    c: Caller,
    Path(raw): Path<String>,
    Query(q): Query<TelemetryQuery>,
) -> Result<Response, ApiError> {
    let window = super::charts::window_of(&q.range)?;
    Ok(html(&live(&s, &c, workload_id(&raw)?, window).await?))
}

/// `POST /console/workloads/{id}/cancel` (htmx, with the CSRF token): cancels through the
/// API's service and answers the workload's updated row.
pub async fn cancel(
    State(s): State<AppState>,
    c: Caller,
    path: WorkloadPath,
    rid: Option<Extension<crate::audit::RequestId>>,
) -> Result<Response, ApiError> {
    let _ = rid;
    let w = workloads::cancel(&s, &c.id, path.0).await?;
    let can_write = c.id.can_write(&w.tenant);
    Ok(html(&WorkloadRows {
        rows: name_rows(&s, &c, vec![row(&w)]).await?,
        can_write,
    })
    .into_response())
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_cursor_reads_back_only_in_its_own_sort() {
        let c = Cursor {
            back: true,
            first: 10_000,
            seek: tessera_store::WorkloadSeek {
                id: WorkloadId(12_345),
                key: "a name\nwith a newline".to_string(),
            },
        };
        let text = c.encode("name");
        assert!(
            text.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
            "{text}"
        );
        assert_eq!(Cursor::decode(&text, "name"), Some(c.clone()));
        assert_eq!(Cursor::decode(&text, "state"), None, "another sort's cursor");
        use base64::Engine;
        let wrong_way = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("name\nx\n0\n1\nk");
        let no_id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("name\na\n0\nid\nk");
        for bad in ["", "not-a-cursor", "bmFtZQ", &wrong_way, &no_id] {
            assert_eq!(Cursor::decode(bad, "name"), None, "{bad}");
        }
    }

    #[test]
    fn thousands_are_separated() {
        let got: Vec<String> = [0, 7, 999, 1_000, 12_345, 1_234_567].map(thousands).into();
        assert_eq!(got, ["0", "7", "999", "1,000", "12,345", "1,234,567"]);
    }

    use super::*;

    #[test]
    fn gpu_use_takes_named_instances_and_the_whole_gpus_held() {
        use tessera_backend::{GpuSample, InstanceSample};
        let gpu = |node: &str, i: u8, util: f64, instances: Vec<InstanceSample>| GpuSample {
            node: node.into(),
            gpu: i,
            uuid: String::new(),
            model: "A100".into(),
            util_pct: util,
            fb_used_mib: 30_000,
            fb_free_mib: 50_000,
            temp_c: 40.0,
            power_w: 200.0,
            xid: 0,
            instances,
        };
        let inst = |workload: u64, active: f64| InstanceSample {
            workload,
            profile: "3g.40gb".into(),
            instance_id: 1,
            gr_engine_active: active,
            fb_used_mib: 10_000,
            fb_free_mib: 30_000,
        };
        let t = crate::lifecycle::Telemetry {
            at: 1_000,
            gpus: std::sync::Arc::new(vec![
                gpu("a", 0, 90.0, vec![inst(7, 0.5), inst(8, 0.1)]),
                gpu("a", 1, 40.0, Vec::new()),
                gpu("b", 0, 80.0, Vec::new()),
            ]),
        };
        // A MIG slice: its own instance's figures, not the GPU's.
        assert_eq!(
            gpu_use(&t, 7, &[], 2_000),
            "engines 50 % busy · memory 10000 of 40000 MiB (25 %) · over 1 device"
        );
        // Two whole GPUs on two nodes: their utilisation and memory.
        assert_eq!(
            gpu_use(&t, 9, &[("a", 1), ("b", 0)], 2_000),
            "engines 60 % busy · memory 60000 of 160000 MiB (38 %) · over 2 devices"
        );
        // A whole GPU another's instances are on is not taken as this one's.
        assert_eq!(gpu_use(&t, 9, &[("a", 0)], 2_000), "not in the latest telemetry");
        assert!(gpu_use(&t, 7, &[], 200_000).starts_with("no telemetry since"));

        // Each device on its own row, with the reading's age; stale past two minutes.
        let now = gpus_now(&t, 9, &[("a", 1), ("b", 0)], 31_000);
        assert_eq!(
            now.rows,
            [
                ["a", "1", "GPU", "40 %", "30000 of 80000 MiB (38 %)"].map(String::from),
                ["b", "0", "GPU", "80 %", "30000 of 80000 MiB (38 %)"].map(String::from),
            ]
        );
        assert_eq!(now.note, "Sampled at 1970-01-01T00:00:01.000Z (30.0 s ago).");
        let mig = gpus_now(&t, 7, &[], 200_000);
        assert_eq!(
            mig.rows,
            [[
                "a",
                "0",
                "MIG 3g.40gb (instance 1)",
                "50 %",
                "10000 of 40000 MiB (25 %)"
            ]
            .map(String::from)]
        );
        assert!(
            mig.note
                .starts_with("Stale: the last reading, sampled at 1970-01-01T00:00:01.000Z, is 3 min 19 s old"),
            "{}",
            mig.note
        );
        // No reading of its devices: said, not zeros.
        let none = gpus_now(&t, 9, &[("c", 0)], 2_000);
        assert!(none.rows.is_empty());
        assert!(
            none.note.starts_with("No telemetry reported for these GPUs"),
            "{}",
            none.note
        );
        let never = crate::lifecycle::Telemetry {
            at: 0,
            gpus: Default::default(),
        };
        assert_eq!(
            gpus_now(&never, 9, &[("a", 1)], 2_000).note,
            "No telemetry reported for these GPUs: the backend has reported no telemetry."
        );
    }

    fn ev(step: &str, at_ms: i64) -> Event {
        Event {
            seq: 0,
            step: step.into(),
            at: tessera_api::rfc3339_ms(at_ms),
            at_ms,
            detail: String::new(),
            code: None,
        }
    }

    #[test]
    fn each_step_lasts_until_the_next_and_the_last_until_now_while_live() {
        let e = [ev("requested", 1_000), ev("queued", 1_250), ev("running", 4_250)];
        let live = steps(&e, false, 10_250);
        let took: Vec<&str> = live.iter().map(|s| s.took.as_str()).collect();
        assert_eq!(took, ["250 ms", "3.0 s", "6.0 s"]);
        let ended = steps(&e, true, 10_250);
        assert_eq!(ended[2].took, "", "an ended workload's last step has no duration");
        assert_eq!(took_words(), ["4 min 05 s", "2 h 10 min"]);
    }

    fn took_words() -> [String; 2] {
        [took(245_000), took(7_800_000)]
    }
}
