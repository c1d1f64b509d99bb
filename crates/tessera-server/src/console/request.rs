//! The request form: project, name, pool → model → shape, duration, priority, kind and whether
//! consolidation may move the workload, where each choice offered is valid for the ones before
//! it (the dependent selects are re-rendered by an htmx fragment when the pool or model
//! changes). "Preview" answers the API's dry run — cost,
//! quotas, budget, whether it would start, borrow, wait or be refused — and only the preview
//! offers the button that submits. Values are checked by the API's own rules and handlers; a
//! refusal is shown next to the field it concerns.

use std::collections::BTreeMap;

use askama::Template;
use axum::Extension;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tessera_api::rules::Validate;
use tessera_api::{CreateWorkload, DryRun, GpuShape, MovableMode, WorkloadKind};
use tessera_model::{Fleet, PoolId, Sharing};

use super::{Caller, Chrome, html};
use crate::AppState;
use crate::http::{ApiJson, dryrun, workloads};
use crate::problem::ApiError;

/// What the form sends (every value a string: the form is read leniently and checked after).
#[derive(Deserialize, Default, Clone)]
pub struct Form {
    #[serde(default)]
    pub project: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub pool: String,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub shape: String,
    #[serde(default)]
    pub duration_h: String,
    #[serde(default)]
    pub priority: String,
    /// `batch` (the default), `service` or `interactive`.
    #[serde(default)]
    pub kind: String,
    /// `none` (the default: never moved), `restart` (batch work) or `replace` (services).
    #[serde(default)]
    pub movable: String,
}

/// One `<option>`.
pub struct Opt {
    pub value: String,
    pub label: String,
    pub selected: bool,
}

fn opts(items: impl IntoIterator<Item = (String, String)>, current: &str) -> Vec<Opt> {
    let mut v: Vec<Opt> = items
        .into_iter()
        .map(|(value, label)| Opt {
            selected: value == current,
            value,
            label,
        })
        .collect();
    if !v.iter().any(|o| o.selected)
        && let Some(first) = v.first_mut()
    {
        first.selected = true;
    }
    v
}

fn selected(o: &[Opt]) -> String {
    o.iter()
        .find(|x| x.selected)
        .map(|x| x.value.clone())
        .unwrap_or_default()
}

/// The choices that depend on the pool and the model.
pub struct Dependent {
    pub pools: Vec<Opt>,
    pub models: Vec<Opt>,
    pub shapes: Vec<Opt>,
}

/// Pools; the models of the chosen pool; the shapes that model offers in that pool (whole
/// counts up to its largest node, its MIG profiles, or fractions in shared pools).
pub fn dependent(f: &Fleet, pool: &str, model: &str, shape: &str) -> Dependent {
    let pools = opts(
        f.pools
            .iter()
            .map(|p| (p.name.clone(), format!("{} ({})", p.name, p.sharing))),
        pool,
    );
    let pid = f.pool_by_name(&selected(&pools)).unwrap_or(PoolId(0));
    let p = f.pool(pid);
    let nodes = &f.nodes[p.nodes.start as usize..p.nodes.end as usize];
    let mut per_model: BTreeMap<String, (tessera_model::ModelId, u8)> = BTreeMap::new();
    for n in nodes {
        let name = f.catalogue.get(n.model).name.clone();
        let e = per_model.entry(name).or_insert((n.model, 0));
        e.1 = e.1.max(n.gpus);
    }
    let models = opts(per_model.keys().map(|m| (m.clone(), m.clone())), model);
    let mut shapes: Vec<(String, String)> = Vec::new();
    if let Some(&(mid, most)) = per_model.get(&selected(&models)) {
        let gm = f.catalogue.get(mid);
        match p.sharing {
            Sharing::Mig => {
                if let Some(geom) = gm.mig {
                    for pr in geom.profiles {
                        let name = gm.profile_name(pr);
                        shapes.push((
                            format!("mig:{name}"),
                            format!("MIG {name} ({} GPU units)", gm.profile_units(pr)),
                        ));
                    }
                }
            }
            Sharing::Whole | Sharing::Shared => {
                if p.sharing == Sharing::Shared {
                    for milli in [100, 125, 250, 500, 750] {
                        shapes.push((format!("fraction:{milli}"), format!("{milli}m of a GPU")));
                    }
                }
                for g in (1..=most).filter(|g| g.is_power_of_two() || *g == most) {
                    shapes.push((
                        format!("gpus:{g}"),
                        format!("{g} whole GPU{}", if g > 1 { "s" } else { "" }),
                    ));
                }
            }
        }
    }
    Dependent {
        pools,
        models,
        shapes: opts(shapes, shape),
    }
}

#[derive(Template)]
#[template(path = "console/request.html")]
struct RequestPage {
    chrome: Chrome,
    form: FormView,
}

/// The form as rendered: values, choices, messages by field, and the preview when there is one.
pub struct FormView {
    pub v: Form,
    pub projects: Vec<Opt>,
    pub dep: Dependent,
    pub priorities: Vec<Opt>,
    pub kinds: Vec<Opt>,
    pub movables: Vec<Opt>,
    pub errors: BTreeMap<&'static str, String>,
    pub preview: Option<DryRun>,
    pub can_submit: bool,
}

impl FormView {
    /// The message for `field`, or "".
    pub fn error(&self, field: &str) -> &str {
        self.errors.get(field).map(String::as_str).unwrap_or("")
    }
}

#[derive(Template)]
#[template(path = "console/request_form.html")]
struct FormFragment {
    form: FormView,
}

#[derive(Template)]
#[template(path = "console/request_dependent.html")]
struct DependentFragment {
    dep: Dependent,
}

/// The `tenant/project` pairs the caller may request for.
async fn projects(s: &AppState, c: &Caller) -> Result<Vec<String>, ApiError> {
    let tenants: Vec<String> = match (&c.id.tenant, c.id.is_admin()) {
        (_, true) => s
            .store
            .list_tenants(None, 500)
            .await?
            .into_iter()
            .map(|t| t.name)
            .collect(),
        (Some(t), false) => vec![t.clone()],
        (None, false) => vec![],
    };
    let mut out = Vec::new();
    for t in tenants {
        for p in s.store.list_projects(&t, None, 500).await? {
            out.push(format!("{t}/{}", p.name));
        }
    }
    Ok(out)
}

async fn view(s: &AppState, c: &Caller, v: Form) -> Result<FormView, ApiError> {
    let projects = opts(projects(s, c).await?.into_iter().map(|p| (p.clone(), p)), &v.project);
    let dep = dependent(&s.fleet(), &v.pool, &v.model, &v.shape);
    let priority = if v.priority.is_empty() { "standard" } else { &v.priority };
    // Only the classes the caller may submit: a tenant's token its tenant's grant, a
    // platform-admin every class.
    let offered: Vec<String> = match (&c.id.tenant, c.id.is_admin()) {
        (_, true) | (None, false) => s.priorities.to_vec(),
        (Some(t), false) => match s.store.get_tenant(t).await? {
            Some(t) => crate::http::tenancy::granted(s, &t),
            None => Vec::new(),
        },
    };
    let priorities = opts(offered.iter().map(|p| (p.clone(), p.clone())), priority);
    let pairs = |xs: &[(&str, &str)]| {
        xs.iter()
            .map(|(v, l)| (v.to_string(), l.to_string()))
            .collect::<Vec<_>>()
    };
    let kinds = opts(
        pairs(&[
            ("batch", "batch: runs to completion"),
            ("service", "service: runs until stopped"),
            ("interactive", "interactive: a session"),
        ]),
        &v.kind,
    );
    let movables = opts(
        pairs(&[
            ("none", "never: it stays where it starts"),
            (
                "restart",
                "restart (batch work): may be stopped and requeued so that a waiting request fits",
            ),
            (
                "replace",
                "replace (services without a lease): a replacement starts elsewhere first",
            ),
        ]),
        &v.movable,
    );
    Ok(FormView {
        v,
        projects,
        dep,
        priorities,
        kinds,
        movables,
        errors: BTreeMap::new(),
        preview: None,
        can_submit: c.id.is_admin() || c.id.role != crate::auth::Role::Viewer,
    })
}

/// `GET /console/request`: the empty form (first pool, its first model and shape).
pub async fn page(State(s): State<AppState>, c: Caller) -> Result<Response, ApiError> {
    let form = view(
        &s,
        &c,
        Form {
            name: "job".into(),
            duration_h: "1".into(),
            ..Form::default()
        },
    )
    .await?;
    Ok(html(&RequestPage {
        chrome: Chrome::new(&c, &s, "request"),
        form,
    }))
}

/// `GET /console/request/fields?pool=…&model=…`: the pool, model and shape selects for a new
/// pool or model.
pub async fn fields(State(s): State<AppState>, _c: Caller, Query(v): Query<Form>) -> Response {
    html(&DependentFragment {
        dep: dependent(&s.fleet(), &v.pool, &v.model, &v.shape),
    })
}

/// The API request a form describes, or the form field it cannot be made from.
fn to_api(v: &Form) -> Result<CreateWorkload, (&'static str, String)> {
    let (tenant, project) = v
        .project
        .split_once('/')
        .ok_or(("project", "choose a project".to_string()))?;
    let mut shape = GpuShape {
        pool: Some(v.pool.clone()).filter(|p| !p.is_empty()),
        models: if v.model.is_empty() {
            vec![]
        } else {
            vec![v.model.clone()]
        },
        ..GpuShape::default()
    };
    let bad_shape = || ("shape", "choose a shape from the list".to_string());
    match v.shape.split_once(':').ok_or_else(bad_shape)? {
        ("gpus", n) => shape.gpus = Some(n.parse().map_err(|_| bad_shape())?),
        ("mig", p) => shape.mig = Some(p.to_string()),
        ("fraction", m) => shape.fraction = Some(m.parse().map_err(|_| bad_shape())?),
        _ => return Err(bad_shape()),
    }
    let duration_s = match v.duration_h.trim() {
        "" => None,
        h => {
            let hours: f64 = h
                .parse()
                .ok()
                .filter(|x: &f64| x.is_finite() && *x > 0.0)
                .ok_or(("duration_h", format!("`{h}` is not a number of hours above 0")))?;
            Some((hours * 3600.0).round() as i64)
        }
    };
    let kind = match v.kind.as_str() {
        "" | "batch" => WorkloadKind::Batch,
        "service" => WorkloadKind::Service,
        "interactive" => WorkloadKind::Interactive,
        _ => return Err(("kind", "choose a kind from the list".to_string())),
    };
    let movable = match v.movable.as_str() {
        "" | "none" => None,
        "restart" => Some(MovableMode::Restart),
        "replace" => Some(MovableMode::Replace),
        _ => return Err(("movable", "choose from the list".to_string())),
    };
    Ok(CreateWorkload {
        tenant: tenant.to_string(),
        project: project.to_string(),
        name: v.name.trim().to_string(),
        kind,
        shape,
        cpu_milli: None,
        memory_mib: None,
        duration_s,
        command: None,
        image: None,
        env: BTreeMap::new(),
        priority: Some(v.priority.clone()).filter(|p| !p.is_empty()),
        no_wait: false,
        no_requeue: false,
        movable,
    })
}

/// The form field an API field belongs to.
fn form_field(api: &str) -> &'static str {
    match api {
        "name" => "name",
        "tenant" | "project" => "project",
        "priority" => "priority",
        "duration_s" => "duration_h",
        "kind" => "kind",
        "movable" => "movable",
        "shape.pool" => "pool",
        "shape.models" => "model",
        _ => "shape",
    }
}

fn refused(e: &ApiError) -> (&'static str, String) {
    let field = e.field.as_deref().map(form_field).unwrap_or("form");
    (field, e.detail.clone())
}

/// Reads the form and checks it as the API checks a creation.
async fn checked(
    s: &AppState,
    c: &Caller,
    body: &[u8],
) -> Result<(Form, CreateWorkload, workloads::Checked), (Form, (&'static str, String))> {
    let v: Form = serde_urlencoded::from_bytes(body).unwrap_or_default();
    let b = match to_api(&v) {
        Ok(b) => b,
        Err(e) => return Err((v, e)),
    };
    if let Err(e) = b.validate() {
        return Err((v, refused(&ApiError::from(e))));
    }
    match workloads::check_create(s, &c.id, &b).await {
        Ok(k) => Ok((v, b, k)),
        Err(e) => Err((v, refused(&e))),
    }
}

async fn with_error(
    s: &AppState,
    c: &Caller,
    v: Form,
    (field, msg): (&'static str, String),
) -> Result<Response, ApiError> {
    let mut form = view(s, c, v).await?;
    form.errors.insert(field, msg);
    let mut r = html(&FormFragment { form });
    *r.status_mut() = StatusCode::UNPROCESSABLE_ENTITY;
    Ok(r)
}

/// `POST /console/request/preview` (htmx, with the CSRF token): the form again, with the dry
/// run's answer and the submit button — or with the refusal next to its field.
pub async fn preview(State(s): State<AppState>, c: Caller, body: Bytes) -> Result<Response, ApiError> {
    if !c.id.is_admin() && c.id.role == crate::auth::Role::Viewer {
        return Err(ApiError::forbidden("viewer tokens cannot request workloads"));
    }
    match checked(&s, &c, &body).await {
        Err((v, e)) => with_error(&s, &c, v, e).await,
        Ok((v, b, k)) => {
            let snap = s.lifecycle.snapshot();
            let run = dryrun::preview(&s, &snap, &b, &k);
            let mut form = view(&s, &c, v).await?;
            form.preview = Some(run);
            Ok(html(&FormFragment { form }))
        }
    }
}

/// `POST /console/request` (htmx, with the CSRF token): creates the workload through the API's
/// handler and sends the browser to its page; a refusal is shown next to its field.
pub async fn submit(
    State(s): State<AppState>,
    c: Caller,
    rid: Option<Extension<crate::audit::RequestId>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    if !c.id.is_admin() && c.id.role == crate::auth::Role::Viewer {
        return Err(ApiError::forbidden("viewer tokens cannot request workloads"));
    }
    let (v, b) = match checked(&s, &c, &body).await {
        Err((v, e)) => return with_error(&s, &c, v, e).await,
        Ok((v, b, _)) => (v, b),
    };
    let mut plain = HeaderMap::new();
    if let Some(k) = headers.get("idempotency-key") {
        plain.insert("idempotency-key", k.clone());
    }
    match workloads::create_workload(State(s.clone()), c.id.clone(), rid, plain, ApiJson(b)).await {
        Ok(r) => {
            let audited = r.extensions().get::<crate::audit::Audited>().copied();
            let body = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap_or_default();
            let id = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|w| w["id"].as_u64())
                .unwrap_or_default();
            let mut out = StatusCode::NO_CONTENT.into_response();
            out.headers_mut().insert(
                "hx-redirect",
                HeaderValue::from_str(&format!("/console/workloads/{id}")).expect("ascii"),
            );
            if let Some(a) = audited {
                out.extensions_mut().insert(a);
            }
            Ok(out)
        }
        Err(e)
            if e.status == StatusCode::UNPROCESSABLE_ENTITY
                || e.status == StatusCode::FORBIDDEN && e.field.is_some() =>
        {
            with_error(&s, &c, v, refused(&e)).await
        }
        Err(e) if e.status == StatusCode::FORBIDDEN && e.kind != "forbidden" => {
            // Refused by a quota limit or the budget: said next to the shape.
            with_error(&s, &c, v, ("shape", e.detail.clone())).await
        }
        Err(e) => Err(e),
    }
}
