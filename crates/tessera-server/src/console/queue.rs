//! The queue view: waiting workloads by tenant and priority with the scheduler's typed waiting
//! reason (code and sentence), their age and shape, and the recent refusals and preemptions.
//! Platform-admins see every tenant; anyone else sees their own tenant only.
//!
//! The waiting workloads come from the published snapshot (the loop lists them at most once a
//! second, oldest first), so a page costs the loop nothing; with thousands waiting the page
//! shows aggregates (per tenant and priority, per reason) and 100 workloads a page. Refusals
//! and preemptions are ended workloads, read from the store (newest 500 scanned). The live part
//! of the page is a fragment htmx polls every 3 s.

use std::collections::BTreeMap;

use askama::Template;
use axum::extract::{Query, State};
use axum::response::Response;
use serde::Deserialize;
use tessera_api::WorkloadState;

use super::pages::took;
use super::{Caller, Chrome, html, why};
use crate::http::views;
use crate::lifecycle::snapshot::Waiting;
use crate::problem::ApiError;
use crate::state::AppState;

/// The view's filters (query string of the page and of its live fragment).
#[derive(Deserialize, Default)]
pub struct QueueQuery {
    /// The resource class waited for: a pool, or `any`.
    #[serde(default)]
    pub pool: String,
    #[serde(default)]
    pub tenant: String,
    #[serde(default)]
    pub priority: String,
    /// A reason code: only the workloads waiting for it.
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub page: usize,
    /// `live`: only the refreshed fragment.
    #[serde(default)]
    pub part: String,
}

/// Waiting workloads of one tenant at one priority.
pub struct Group {
    pub tenant: String,
    pub priority: String,
    pub count: u64,
    pub units: String,
    pub oldest: String,
}

/// One waiting workload, formatted for people.
pub struct WaitRow {
    pub id: u64,
    pub tenant: String,
    pub project: String,
    pub name: String,
    pub class: String,
    pub priority: String,
    pub shape: String,
    pub age: String,
    pub code: &'static str,
    /// Why it waits, as one sentence, and what to do.
    pub detail: String,
    pub next: String,
    /// Its place in its tenant's queue: `3rd of 7`.
    pub position: String,
}

/// How many wait for one reason, with a link to them.
pub struct ReasonCount {
    pub code: &'static str,
    pub label: &'static str,
    pub count: u64,
    pub href: String,
    pub selected: bool,
}

/// A refusal or preemption.
pub struct Ended {
    pub id: u64,
    pub tenant: String,
    pub project: String,
    pub name: String,
    pub state: &'static str,
    pub code: String,
    pub detail: String,
    pub at: String,
}

struct Live {
    total: usize,
    groups: Vec<Group>,
    reasons: Vec<ReasonCount>,
    rows: Vec<WaitRow>,
    first: usize,
    next: Option<String>,
    prev: Option<String>,
    recent: Vec<Ended>,
    /// Requests refused at submission (never stored): from the server's ring of them.
    refused: Vec<RefusedRow>,
    query: String,
}

/// A request refused at submission.
pub struct RefusedRow {
    pub at: String,
    pub tenant: String,
    pub project: String,
    pub name: String,
    pub code: &'static str,
    pub detail: String,
}

/// The newest refusals at submission that `tenant` (every tenant when empty, for admins) may
/// see, up to 20.
fn refused(s: &AppState, admin: bool, tenant: &str) -> Vec<RefusedRow> {
    if !admin && tenant.is_empty() {
        return Vec::new();
    }
    s.refusals
        .recent((!tenant.is_empty()).then_some(tenant), 20)
        .into_iter()
        .map(|r| RefusedRow {
            at: tessera_api::rfc3339_ms(r.at)
                .get(..19)
                .unwrap_or_default()
                .replace('T', " "),
            tenant: r.tenant,
            project: r.project,
            name: r.name,
            detail: why::sentence(r.code, &r.detail),
            code: r.code,
        })
        .collect()
}

#[derive(Template)]
#[template(path = "console/queue.html")]
struct QueuePage {
    chrome: Chrome,
    q: QueueQuery,
    pools: Vec<String>,
    /// Admins: the tenants to filter by (every tenant, and those that have work waiting).
    tenants: Vec<String>,
    priorities: Vec<String>,
    admin: bool,
    live: Live,
}

#[derive(Template)]
#[template(path = "console/queue_live.html")]
struct QueueLive {
    live: Live,
}

const PER_PAGE: usize = 100;
/// Reason codes of a refusal or a preemption that ended a workload.
const ENDED_CODES: [&str; 5] = [
    "quota",
    "budget",
    "constraint",
    "preempted-priority",
    "preempted-reclaim",
];

fn matches(w: &Waiting, q: &QueueQuery) -> bool {
    let spec = &w.workload.spec;
    (q.pool.is_empty() || *w.class == *q.pool)
        && (q.tenant.is_empty() || spec.tenant == q.tenant)
        && (q.priority.is_empty() || spec.priority == q.priority)
}

fn code_of(w: &tessera_domain::Workload) -> &'static str {
    w.reason.as_ref().map_or(why::NOT_YET, |r| r.code.as_str())
}

/// Aggregates and the page of waiting workloads that match `q` (the reason counts over all
/// that match the other filters, so each links to its own list); `ranks`: the priority
/// classes, most important first (for each row's place in its tenant's queue); `admin`: the
/// reader raises quotas and budgets themselves.
fn waiting(all: &[Waiting], q: &QueueQuery, now: i64, ranks: &[String], admin: bool) -> Live {
    let mut groups: BTreeMap<(&str, &str), (u64, u64, i64)> = BTreeMap::new();
    let mut reasons: BTreeMap<&'static str, u64> = BTreeMap::new();
    let first = q.page * PER_PAGE;
    let mut total = 0;
    let mut rows = Vec::new();
    let mut page_tenants: Vec<&str> = Vec::new();
    for (entry, w) in all.iter().filter(|w| matches(w, q)).map(|e| (e, &*e.workload)) {
        let code = code_of(w);
        *reasons.entry(code).or_default() += 1;
        if !q.reason.is_empty() && code != q.reason {
            continue;
        }
        total += 1;
        let g = groups
            .entry((&w.spec.tenant, &w.spec.priority))
            .or_insert((0, 0, w.created_at));
        g.0 += 1;
        g.1 += w.units.as_milli();
        g.2 = g.2.min(w.created_at);
        if total > first && rows.len() < PER_PAGE {
            if !page_tenants.contains(&w.spec.tenant.as_str()) {
                page_tenants.push(&w.spec.tenant);
            }
            rows.push(WaitRow {
                id: w.id.0,
                tenant: w.spec.tenant.clone(),
                project: w.spec.project.clone(),
                name: w.spec.name.clone(),
                class: entry.class.to_string(),
                priority: w.spec.priority.clone(),
                shape: w.spec.shape.gpu.to_string(),
                age: took((now - w.created_at).max(0)),
                detail: w
                    .reason
                    .as_ref()
                    .map(|r| why::sentence(code, &r.detail))
                    .unwrap_or_default(),
                next: why::next_step(code, admin, now),
                position: String::new(),
                code,
            });
        }
    }
    // Each row's place in its tenant's queue, among all the tenant's waiting work.
    let places = why::positions(all, ranks, |t| page_tenants.contains(&t));
    for r in &mut rows {
        if let Some(p) = places.get(&r.id) {
            r.position = why::position_words(&r.tenant, *p);
        }
    }
    let link = |page: usize, reason: &str| {
        serde_urlencoded::to_string([
            ("pool", q.pool.as_str()),
            ("tenant", q.tenant.as_str()),
            ("priority", q.priority.as_str()),
            ("reason", reason),
            ("page", &page.to_string()),
        ])
        .map(|qs| format!("/console/queue?{qs}#waiting-h"))
        .unwrap_or_default()
    };
    let mut reasons: Vec<ReasonCount> = reasons
        .into_iter()
        .map(|(code, count)| ReasonCount {
            code,
            label: why::label(code),
            count,
            href: link(0, if q.reason == code { "" } else { code }),
            selected: q.reason == code,
        })
        .collect();
    reasons.sort_by(|a, b| b.count.cmp(&a.count).then(a.code.cmp(b.code)));
    Live {
        total,
        groups: groups
            .into_iter()
            .map(|((t, p), (count, milli, oldest))| Group {
                tenant: t.to_string(),
                priority: p.to_string(),
                count,
                units: tessera_model::GpuUnits(milli).to_string(),
                oldest: took((now - oldest).max(0)),
            })
            .collect(),
        reasons,
        rows,
        first,
        next: (total > first + PER_PAGE).then(|| link(q.page + 1, &q.reason)),
        prev: (q.page > 0).then(|| link(q.page - 1, &q.reason)),
        recent: Vec::new(),
        refused: Vec::new(),
        query: String::new(),
    }
}

/// The newest refusals and preemptions (ended workloads whose reason says so), up to 20.
async fn recent(s: &AppState, c: &Caller, q: &QueueQuery) -> Result<Vec<Ended>, ApiError> {
    let phases = [WorkloadState::Failed, WorkloadState::Preempted]
        .into_iter()
        .flat_map(views::phases)
        .collect();
    let filter = tessera_store::WorkloadFilter {
        scope: c.id.scope().map(str::to_string),
        tenant: (!q.tenant.is_empty()).then(|| q.tenant.clone()),
        project: None,
        phases,
        before: None,
        limit: 500,
        ..Default::default()
    };
    Ok(s.store
        .list_workloads(&filter)
        .await?
        .iter()
        .map(views::workload)
        .filter(|w| w.reason_code.as_deref().is_some_and(|c| ENDED_CODES.contains(&c)))
        .filter(|w| q.priority.is_empty() || w.priority == q.priority)
        .filter(|w| q.pool.is_empty() || w.allocation.as_ref().is_none_or(|a| a.pool == q.pool))
        .take(20)
        .map(|w| Ended {
            id: w.id,
            state: w.state.as_str(),
            code: w.reason_code.clone().unwrap_or_default(),
            detail: why::sentence(
                w.reason_code.as_deref().unwrap_or_default(),
                w.reason.as_deref().unwrap_or_default(),
            ),
            at: w
                .ended_at
                .as_deref()
                .map(|t| t.get(..19).unwrap_or(t).replace('T', " "))
                .unwrap_or_default(),
            tenant: w.tenant,
            project: w.project,
            name: w.name,
        })
        .collect())
}

/// `GET /console/queue`: the waiting workloads and recent refusals and preemptions, filtered by
/// pool, tenant and priority; `part=live` answers only the fragment the page polls.
pub async fn queue(
    State(s): State<AppState>,
    c: Caller,
    Query(mut q): Query<QueueQuery>,
) -> Result<Response, ApiError> {
    let admin = c.id.is_admin();
    if !admin {
        q.tenant = c.id.tenant.clone().unwrap_or_default();
    }
    let snap = s.lifecycle.snapshot();
    let pools: Vec<String> = snap
        .fleet
        .pools
        .iter()
        .map(|p| p.name.clone())
        .chain(["any".to_string()])
        .collect();
    if !q.pool.is_empty() && !pools.contains(&q.pool) {
        return Err(ApiError::invalid(
            "pool",
            format!("unknown pool `{}` ({})", q.pool, pools.join(", ")),
        ));
    }
    if !q.reason.is_empty() && tessera_domain::ReasonCode::parse(&q.reason).is_none() && q.reason != why::NOT_YET {
        return Err(ApiError::invalid("reason", format!("unknown reason `{}`", q.reason)));
    }
    if !q.priority.is_empty() && !s.priorities.contains(&q.priority) {
        return Err(ApiError::invalid(
            "priority",
            format!("unknown priority class `{}` ({})", q.priority, s.priorities.join(", ")),
        ));
    }
    let tenants = if admin {
        super::tenant_names(&s).await?
    } else {
        Vec::new()
    };
    if admin && !q.tenant.is_empty() && !tenants.contains(&q.tenant) {
        return Err(ApiError::invalid("tenant", format!("no tenant `{}`", q.tenant)));
    }
    let mut live = waiting(&snap.queue.waiting, &q, crate::clock::now_ms(), &s.priorities, admin);
    live.recent = recent(&s, &c, &q).await?;
    live.refused = refused(&s, admin, &q.tenant);
    live.query = serde_urlencoded::to_string([
        ("pool", q.pool.as_str()),
        ("tenant", q.tenant.as_str()),
        ("priority", q.priority.as_str()),
        ("reason", q.reason.as_str()),
        ("page", &q.page.to_string()),
    ])
    .unwrap_or_default();
    if q.part == "live" {
        return Ok(html(&QueueLive { live }));
    }
    Ok(html(&QueuePage {
        chrome: Chrome::new(&c, &s, "queue"),
        q,
        pools,
        tenants,
        priorities: s.priorities.to_vec(),
        admin,
        live,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_domain::{GpuSpec, Phase, Reason, ReasonCode};
    use tessera_model::GpuUnits;

    fn w(id: u64, tenant: &str, priority: &str, created_at: i64, reason: Option<ReasonCode>) -> Waiting {
        let mut w = tessera_store::conformance::workload(id, tenant, "p", Phase::Queued);
        w.spec.priority = priority.into();
        w.spec.shape.gpu = GpuSpec::Whole { gpus: 1 };
        w.units = GpuUnits(1000);
        w.created_at = created_at;
        w.reason = reason.map(|c| Reason::new(c, "why"));
        Waiting {
            workload: w.into(),
            class: "serving".into(),
        }
    }

    #[test]
    fn the_queue_aggregates_all_it_matches_and_pages_through_the_rows() {
        let all: Vec<Waiting> = (0..250)
            .map(|i| {
                let tenant = if i % 2 == 0 { "vision" } else { "nlp" };
                w(
                    i,
                    tenant,
                    "normal",
                    1_000 + i as i64,
                    (i % 5 == 0).then_some(ReasonCode::Quota),
                )
            })
            .collect();
        let q = QueueQuery {
            tenant: "vision".into(),
            page: 1,
            ..QueueQuery::default()
        };
        let ranks = ["normal".to_string()];
        let live = waiting(&all, &q, 61_000, &ranks, false);
        assert_eq!(live.total, 125);
        assert_eq!(live.first, 100);
        assert_eq!(live.rows.len(), 25, "the second page holds the rest");
        assert!(live.rows.iter().all(|r| r.tenant == "vision"));
        assert!(live.next.is_none() && live.prev.is_some());
        assert_eq!(live.groups.len(), 1);
        assert_eq!(live.groups[0].count, 125);
        assert_eq!(
            live.groups[0].oldest, "1 min 00 s",
            "the oldest of the group waited 60 s"
        );
        let counts: Vec<(&str, u64)> = live.reasons.iter().map(|r| (r.code, r.count)).collect();
        assert_eq!(counts, [("not-yet-scheduled", 100), ("quota", 25)]);
        assert!(
            live.reasons[1].href.contains("reason=quota") && live.reasons[1].href.contains("tenant=vision"),
            "{}",
            live.reasons[1].href
        );
        assert_eq!(live.rows[0].position, "101st of 125 waiting in tenant vision's queue");
        assert!(live.rows[0].next.starts_with("Next: "));
        let quota = QueueQuery {
            tenant: "vision".into(),
            reason: "quota".into(),
            ..QueueQuery::default()
        };
        let only = waiting(&all, &quota, 61_000, &ranks, false);
        assert_eq!(only.total, 25, "the quota link lists the 25 over quota");
        assert!(only.rows.iter().all(|r| r.code == "quota"));
        assert_eq!(only.reasons.len(), 2, "the other counts stay to switch to");
        assert!(only.reasons[1].selected && !only.reasons[1].href.contains("reason=quota"));
        let everyone = waiting(&all, &QueueQuery::default(), 61_000, &ranks, true);
        assert_eq!(
            (everyone.total, everyone.rows.len(), everyone.groups.len()),
            (250, 100, 2)
        );
        assert!(everyone.next.is_some());
        assert_eq!(everyone.rows[0].id, 0, "oldest first");
    }
}
