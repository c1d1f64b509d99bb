//! Tenants, projects, quotas, budgets and priority grants: platform-admins see every tenant (50
//! a page) and edit them — create a tenant or project, set or remove a quota, set or remove the
//! monthly budget, delete a project, grant the priority classes (or reset to the default grant);
//! a tenant-admin reads its own tenant. Every change goes through the service the REST API's
//! handler calls ([`crate::services`]: the same validation, RBAC and audit record: the request
//! middleware's, or for a grant the one the service commits with it), from an htmx form that
//! carries the CSRF token. A refusal
//! re-renders the tenant's card with the message next to the field (422); a success re-renders
//! it with the new values.

use std::collections::HashMap;

use askama::Template;
use axum::Extension;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tessera_api::{CreateProject, CreateTenant, SetBudget, SetPriorities, SetQuota, TenantQuotas};

use super::{Caller, Chrome, html};
use crate::audit::{Audited, RequestId};
use crate::problem::ApiError;
use crate::services::{governance, tenancy};
use crate::state::AppState;

/// The form a refusal belongs to, its field, message and what was typed.
#[derive(Default)]
pub struct FormError {
    pub form: &'static str,
    pub field: String,
    pub message: String,
    pub values: HashMap<String, String>,
}

/// One tenant with its projects, quotas and budget.
pub struct Card {
    pub name: String,
    pub display: String,
    pub projects: Vec<String>,
    pub quotas: TenantQuotas,
    pub classes: Vec<String>,
    /// The priority classes the tenant may use (its grant, or the default grant).
    pub priorities: Vec<String>,
    /// Whether the platform admin granted them (else they are the default grant).
    pub explicit: bool,
    /// Every priority class of the scheduler's configuration, offered by the grant form.
    pub priority_classes: Vec<String>,
    pub edit: bool,
    pub err: FormError,
}

impl Card {
    /// The message for `field` of `form`, if the last change from it was refused there.
    pub fn error(&self, form: &str, field: &str) -> &str {
        if self.err.form == form && self.err.field == field {
            &self.err.message
        } else {
            ""
        }
    }

    /// What was typed into `field` of `form` before a refusal (empty otherwise).
    pub fn value(&self, form: &str, field: &str) -> &str {
        if self.err.form == form {
            self.err.values.get(field).map(String::as_str).unwrap_or("")
        } else {
            ""
        }
    }

    /// The budget field's value: as typed before a refusal, else the budget set (empty: none).
    pub fn budget_value(&self) -> String {
        if self.err.form == "budget" {
            return self.value("budget", "monthly_unit_hours").to_string();
        }
        self.quotas
            .budget
            .as_ref()
            .map(|b| b.monthly_unit_hours.to_string())
            .unwrap_or_default()
    }

    /// The class the quota form shows: as posted before a refusal, else the first class with a
    /// quota set (so its current values fill the form), else the first class offered.
    pub fn quota_class(&self) -> &str {
        if self.err.form == "quota" {
            return self.value("quota", "class");
        }
        self.quotas
            .quotas
            .first()
            .map(|q| q.class.as_str())
            .or(self.classes.first().map(String::as_str))
            .unwrap_or("")
    }

    /// The quota set for `class`, if any.
    pub fn quota_of(&self, class: &str) -> Option<&tessera_api::QuotaView> {
        self.quotas.quotas.iter().find(|q| q.class == class)
    }

    /// A quota field's value (`guaranteed` or `limit`): as typed before a refusal, else the
    /// current value of the class the form shows (empty: none set).
    pub fn quota_value(&self, field: &str) -> String {
        if self.err.form == "quota" {
            return self.value("quota", field).to_string();
        }
        let Some(q) = self.quota_of(self.quota_class()) else {
            return String::new();
        };
        match field {
            "guaranteed" => q.guaranteed.to_string(),
            "limit" => q.limit.map(|l| l.to_string()).unwrap_or_default(),
            _ => String::new(),
        }
    }

    /// The quotas in one line for the summary table: `training 8 of 8 guaranteed (limit 16)`.
    pub fn quota_summary(&self) -> String {
        if self.quotas.quotas.is_empty() {
            return "none".into();
        }
        self.quotas
            .quotas
            .iter()
            .map(|q| {
                let limit = q.limit.map(|l| format!(", limit {l}")).unwrap_or_default();
                format!("{}: {} used of {} guaranteed{limit}", q.class, q.used, q.guaranteed)
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The budget in one line for the summary table.
    pub fn budget_summary(&self) -> String {
        match &self.quotas.budget {
            Some(b) => format!(
                "{} of {} GPU-unit-hours spent",
                super::uh(b.spent_unit_hours),
                super::uh(b.monthly_unit_hours)
            ),
            None => "no budget".into(),
        }
    }

    /// The grant as shown: `granted: standard, high`, or `default: standard, opportunistic`.
    pub fn grant_text(&self) -> String {
        let classes = self.priorities.join(", ");
        if self.explicit {
            format!("granted: {classes}")
        } else {
            format!("default: {classes}")
        }
    }

    /// Whether the grant form checks `class`: as posted after a refusal, else as granted.
    pub fn grants(&self, class: &str) -> bool {
        if self.err.form == "priorities" {
            self.value("priorities", "priorities").split(',').any(|c| c == class)
        } else {
            self.priorities.iter().any(|c| c == class)
        }
    }

    /// Whether the tenant has spent its monthly budget (new requests wait, as the scheduler's
    /// budget check has it).
    pub fn over_budget(&self) -> bool {
        self.quotas
            .budget
            .as_ref()
            .is_some_and(|b| b.spent_unit_hours >= b.monthly_unit_hours)
    }

    /// An id for a form element: `tenant-form-field`.
    pub fn fid(&self, form: &str, field: &str) -> String {
        format!("{}-{form}-{field}", self.name)
    }
}

#[derive(Template)]
#[template(path = "console/tenants.html")]
struct TenantsPage {
    chrome: Chrome,
    cards: Vec<Card>,
    admin: bool,
    next: Option<String>,
    create: FormError,
}

impl TenantsPage {
    fn create_error(&self, field: &str) -> &str {
        if self.create.field == field {
            &self.create.message
        } else {
            ""
        }
    }

    fn create_value(&self, field: &str) -> &str {
        self.create.values.get(field).map(String::as_str).unwrap_or("")
    }
}

#[derive(Template)]
#[template(path = "console/tenant_card.html")]
struct CardFragment {
    card: Card,
}

#[derive(Template)]
#[template(path = "console/tenant_create.html")]
struct CreateFragment {
    create: FormError,
}

impl CreateFragment {
    fn create_error(&self, field: &str) -> &str {
        if self.create.field == field {
            &self.create.message
        } else {
            ""
        }
    }

    fn create_value(&self, field: &str) -> &str {
        self.create.values.get(field).map(String::as_str).unwrap_or("")
    }
}

const PER_PAGE: u32 = 50;

/// Quota classes offered by the form: every pool and every pool/model.
fn classes(s: &AppState) -> Vec<String> {
    let f = &s.fleet();
    let mut out = Vec::new();
    for p in &f.pools {
        out.push(p.name.clone());
        let mut models: Vec<&str> = f.nodes[p.nodes.start as usize..p.nodes.end as usize]
            .iter()
            .map(|n| f.catalogue.get(n.model).name.as_str())
            .collect();
        models.sort();
        models.dedup();
        out.extend(models.into_iter().map(|m| format!("{}/{m}", p.name)));
    }
    out
}

async fn card(s: &AppState, c: &Caller, tenant: &str, err: FormError) -> Result<Card, ApiError> {
    let t = tenancy::tenant_visible(s, &c.id, tenant).await?;
    let priorities = tenancy::granted(s, &t);
    let projects = s
        .store
        .list_projects(tenant, None, 200)
        .await?
        .into_iter()
        .map(|p| p.name)
        .collect();
    let quotas = governance::quotas(s, &c.id, tenant).await?;
    Ok(Card {
        name: t.name,
        display: t.display_name,
        projects,
        quotas,
        classes: classes(s),
        priorities,
        explicit: t.priorities.is_some(),
        priority_classes: s.priorities.to_vec(),
        edit: c.id.is_admin(),
        err,
    })
}

#[derive(Deserialize, Default)]
pub struct PageQuery {
    /// Tenants after this name (the next page).
    #[serde(default)]
    pub after: String,
}

/// `GET /console/tenants`: every tenant for platform-admins (50 a page), a tenant-admin's own.
pub async fn page(State(s): State<AppState>, c: Caller, Query(q): Query<PageQuery>) -> Result<Response, ApiError> {
    let admin = c.id.is_admin();
    if !admin && c.id.role != crate::auth::Role::TenantAdmin {
        return Err(ApiError::forbidden(
            "tenants and quotas are shown to platform-admins and tenant-admins",
        ));
    }
    let names: Vec<String> = if admin {
        let after = Some(q.after.as_str()).filter(|a| !a.is_empty());
        s.store
            .list_tenants(after, PER_PAGE)
            .await?
            .into_iter()
            .map(|t| t.name)
            .collect()
    } else {
        c.id.tenant.clone().into_iter().collect()
    };
    let next = (admin && names.len() == PER_PAGE as usize)
        .then(|| names.last())
        .flatten()
        .map(|last| {
            format!(
                "/console/tenants?{}",
                serde_urlencoded::to_string([("after", last.as_str())]).unwrap_or_default()
            )
        });
    let mut cards = Vec::with_capacity(names.len());
    for n in &names {
        cards.push(card(&s, &c, n, FormError::default()).await?);
    }
    Ok(html(&TenantsPage {
        chrome: Chrome::new(&c, &s, "tenants"),
        cards,
        admin,
        next,
        create: FormError::default(),
    }))
}

fn form(body: &Bytes) -> HashMap<String, String> {
    serde_urlencoded::from_bytes::<Vec<(String, String)>>(body)
        .unwrap_or_default()
        .into_iter()
        .collect()
}

fn unprocessable(mut r: Response) -> Response {
    *r.status_mut() = StatusCode::UNPROCESSABLE_ENTITY;
    r
}

/// A refusal of the API's handler as a field error of `form` (`fallback` when the problem
/// names no field the form has).
fn refusal(
    form: &'static str,
    fields: &[&str],
    fallback: &str,
    e: &ApiError,
    values: HashMap<String, String>,
) -> FormError {
    let field = e
        .field
        .as_deref()
        .filter(|f| fields.contains(f))
        .unwrap_or(fallback)
        .to_string();
    FormError {
        form,
        field,
        message: e.detail.clone(),
        values,
    }
}

/// The card after a change: refreshed on success; with the message by the field on a 422 or
/// 409 (other refusals — 403, 404 — answer the problem, shown in the page's alert).
async fn answer(
    s: &AppState,
    c: &Caller,
    tenant: &str,
    result: Result<(), ApiError>,
    to_form: impl FnOnce(&ApiError) -> FormError,
) -> Result<Response, ApiError> {
    match result {
        Ok(()) => Ok(html(&CardFragment {
            card: card(s, c, tenant, FormError::default()).await?,
        })),
        Err(e) if e.status == StatusCode::UNPROCESSABLE_ENTITY || e.status == StatusCode::CONFLICT => {
            // 422 for a conflict too: htmx swaps 422 answers only, and the card carries the message.
            let err = to_form(&e);
            Ok(unprocessable(html(&CardFragment {
                card: card(s, c, tenant, err).await?,
            })))
        }
        Err(e) => Err(e),
    }
}

/// A number typed into a form; blank is `None`.
fn number(field: &str, raw: &str) -> Result<Option<f64>, ApiError> {
    match raw.trim() {
        "" => Ok(None),
        t => t
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .map(Some)
            .ok_or_else(|| ApiError::invalid(field, format!("`{t}` is not a number"))),
    }
}

/// `POST /console/tenants` (platform-admins): creates a tenant; the page reloads to show it.
pub async fn create_tenant(State(s): State<AppState>, c: Caller, body: Bytes) -> Result<Response, ApiError> {
    let f = form(&body);
    let b = CreateTenant {
        name: f.get("name").map(|n| n.trim().to_string()).unwrap_or_default(),
        display_name: f
            .get("display_name")
            .map(|d| d.trim().to_string())
            .filter(|d| !d.is_empty()),
        priorities: None,
    };
    let name = b.name.clone();
    let made = tenancy::create_tenant(&s, &c.id, b).await.map(|_| ());
    match made {
        Ok(()) => {
            let mut r = StatusCode::OK.into_response();
            r.headers_mut().insert("hx-refresh", HeaderValue::from_static("true"));
            r.extensions_mut()
                .insert(crate::audit::AuditObject(format!("created tenant {name}")));
            Ok(r)
        }
        Err(e) if e.status == StatusCode::UNPROCESSABLE_ENTITY || e.status == StatusCode::CONFLICT => {
            let create = refusal("create", &["name", "display_name"], "name", &e, f);
            Ok(unprocessable(html(&CreateFragment { create })))
        }
        Err(e) => Err(e),
    }
}

/// `POST /console/tenants/{tenant}/projects`: creates a project.
pub async fn create_project(
    State(s): State<AppState>,
    c: Caller,
    Path(tenant): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let f = form(&body);
    let b = CreateProject {
        name: f.get("name").map(|n| n.trim().to_string()).unwrap_or_default(),
    };
    let what = format!("created project {tenant}/{}", b.name);
    let result = tenancy::create_project(&s, &c.id, &tenant, b).await.map(|_| ());
    let mut r = answer(&s, &c, &tenant, result, |e| refusal("project", &["name"], "name", e, f)).await?;
    if r.status().is_success() {
        r.extensions_mut().insert(crate::audit::AuditObject(what));
    }
    Ok(r)
}

/// `POST /console/tenants/{tenant}/projects/{project}/delete`: deletes a project (refused while
/// it has workloads on record).
pub async fn delete_project(
    State(s): State<AppState>,
    c: Caller,
    Path((tenant, project)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let result = tenancy::delete_project(&s, &c.id, &tenant, &project).await;
    answer(&s, &c, &tenant, result, |e| {
        refusal("projects", &[], "list", e, HashMap::new())
    })
    .await
}

/// `POST /console/tenants/{tenant}/quotas`: sets a quota (class, guaranteed, limit — blank
/// for none).
pub async fn set_quota(
    State(s): State<AppState>,
    c: Caller,
    Path(tenant): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let f = form(&body);
    let get = |k: &str| f.get(k).cloned().unwrap_or_default();
    let class = get("class");
    let result = async {
        let guaranteed = number("guaranteed", &get("guaranteed"))?
            .ok_or_else(|| ApiError::invalid("guaranteed", "give the guaranteed GPU units (0 for none)"))?;
        let limit = number("limit", &get("limit"))?;
        let b = SetQuota { guaranteed, limit };
        governance::set_quota(&s, &c.id, &tenant, &class, &b).await.map(|_| ())
    }
    .await;
    answer(&s, &c, &tenant, result, |e| {
        refusal("quota", &["class", "guaranteed", "limit"], "guaranteed", e, f.clone())
    })
    .await
}

/// `POST /console/tenants/{tenant}/quotas/remove`: removes the quota of the form's `class`.
pub async fn remove_quota(
    State(s): State<AppState>,
    c: Caller,
    Path(tenant): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let class = form(&body).remove("class").unwrap_or_default();
    let result = governance::delete_quota(&s, &c.id, &tenant, &class).await;
    answer(&s, &c, &tenant, result, |e| {
        refusal("quotas", &[], "list", e, HashMap::new())
    })
    .await
}

/// `POST /console/tenants/{tenant}/budget`: sets the monthly budget in GPU-unit-hours (blank
/// removes it).
pub async fn set_budget(
    State(s): State<AppState>,
    c: Caller,
    Path(tenant): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let f = form(&body);
    let raw = f.get("monthly_unit_hours").cloned().unwrap_or_default();
    let result = async {
        let b = SetBudget {
            monthly_unit_hours: number("monthly_unit_hours", &raw)?,
        };
        governance::set_budget(&s, &c.id, &tenant, &b).await
    }
    .await;
    answer(&s, &c, &tenant, result, |e| {
        refusal("budget", &["monthly_unit_hours"], "monthly_unit_hours", e, f.clone())
    })
    .await
}

/// `POST /console/tenants/{tenant}/priorities` (platform-admins): grants the checked priority
/// classes (`priorities`, one field a class), or the default grant when the form sends
/// `reset`. The API's handler checks and stores the grant and commits its audit record with
/// it; anyone else is refused (403) before anything is read.
pub async fn set_priorities(
    State(s): State<AppState>,
    c: Caller,
    rid: Option<Extension<RequestId>>,
    Path(tenant): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    if !c.id.is_admin() {
        return Err(ApiError::forbidden("granting priority classes needs a platform-admin"));
    }
    let fields: Vec<(String, String)> = serde_urlencoded::from_bytes(&body).unwrap_or_default();
    let reset = fields.iter().any(|(k, _)| k == "reset");
    let checked: Vec<String> = fields
        .into_iter()
        .filter(|(k, _)| k == "priorities")
        .map(|(_, v)| v)
        .collect();
    let values = HashMap::from([("priorities".to_string(), checked.join(","))]);
    let b = SetPriorities {
        priorities: if reset { None } else { Some(checked) },
    };
    let rid = rid.map(|Extension(r)| r.0).unwrap_or_default();
    let result = tenancy::set_priorities(&s, &c.id, rid, &tenant, &b).await;
    let granted = result.is_ok();
    let mut r = answer(&s, &c, &tenant, result.map(|_| ()), |e| {
        refusal("priorities", &["priorities"], "priorities", e, values)
    })
    .await?;
    // The service committed the audit record with the grant: the middleware adds none.
    if granted {
        r.extensions_mut().insert(Audited);
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_numbers_are_checked_and_blank_is_none() {
        assert_eq!(number("limit", " ").unwrap(), None);
        assert_eq!(number("limit", "2.5").unwrap(), Some(2.5));
        let e = number("limit", "lots").unwrap_err();
        assert_eq!(
            (e.field.as_deref(), e.detail.as_str()),
            (Some("limit"), "`lots` is not a number")
        );
        assert!(number("limit", "NaN").is_err(), "not a finite number");
    }

    #[test]
    fn a_refusal_lands_on_the_field_it_names_or_the_forms_fallback() {
        let e = ApiError::invalid("limit", "below guaranteed");
        let f = refusal(
            "quota",
            &["class", "guaranteed", "limit"],
            "guaranteed",
            &e,
            HashMap::new(),
        );
        assert_eq!((f.form, f.field.as_str()), ("quota", "limit"));
        let other = ApiError::invalid("tenant", "no such tenant");
        let f = refusal(
            "quota",
            &["class", "guaranteed", "limit"],
            "guaranteed",
            &other,
            HashMap::new(),
        );
        assert_eq!(f.field, "guaranteed");
    }
}
