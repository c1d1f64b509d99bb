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
use crate::http::dryrun;
use crate::problem::ApiError;
use crate::services::workloads;
use crate::state::AppState;

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
    /// With the shape `gang`: the GPUs in all, across nodes.
    #[serde(default)]
    pub gang_gpus: String,
    /// With the shape `gang`: how many node-shares (optional).
    #[serde(default)]
    pub gang_nodes: String,
    /// With the shape `gang`: GPUs per node-share (optional; whole nodes by default).
    #[serde(default)]
    pub gang_per_node: String,
    /// With the shape `gang`: a topology level of the fleet to keep the gang within, or "".
    #[serde(default)]
    pub topology: String,
    /// With a topology level: `required` (the default) or `preferred`.
    #[serde(default)]
    pub topology_mode: String,
    /// With the shape `gang`: segments of this many GPUs, each within one rack (optional).
    #[serde(default)]
    pub segment: String,
    /// With the shape `gang`: `on` when the last node takes the rest (the API's
    /// `shape.remainder`: GPUs in all need not be a multiple of the node size).
    #[serde(default)]
    pub remainder: String,
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
    /// The gang's fields, when the shape chosen is a multi-node gang.
    pub gang: Option<GangFields>,
}

/// The fields of a multi-node gang: GPUs in all, optional nodes and GPUs per node, a topology
/// level the pool declares (required or preferred) and an optional segment size.
pub struct GangFields {
    pub gpus: String,
    pub nodes: String,
    pub per_node: String,
    pub segment: String,
    /// Whether "Last node takes the rest" is ticked.
    pub remainder: bool,
    /// `""` (the API's default: the fewest racks possible) and the levels the pool declares.
    pub levels: Vec<Opt>,
    pub modes: Vec<Opt>,
    /// GPUs of the pool's largest node of the model (a gang's default node-share).
    pub node_gpus: u8,
    /// Nodes of the model in the pool.
    pub nodes_in_pool: usize,
    pub errors: BTreeMap<&'static str, String>,
    /// The number fields, in order: `(field name, element id, label, value, note id)`.
    pub inputs: Vec<GangInput>,
}

/// One number field of a gang.
pub struct GangInput {
    pub field: &'static str,
    pub id: &'static str,
    pub label: &'static str,
    pub value: String,
    /// The API's bounds of the field, on the input itself.
    pub min: i64,
    pub max: i64,
    /// The id of the note that explains it, or "".
    pub note: &'static str,
}

impl GangFields {
    /// Starts "GPUs in all" at two whole nodes (when the gang is first chosen).
    pub fn prefill(&mut self) {
        let two = (u32::from(self.node_gpus) * 2).to_string();
        if let Some(i) = self.inputs.iter_mut().find(|i| i.field == "gang_gpus") {
            i.value = two.clone();
        }
        self.gpus = two;
    }

    /// The message for `field`, or "".
    pub fn error(&self, field: &str) -> &str {
        self.errors.get(field).map(String::as_str).unwrap_or("")
    }

    /// A remainder gang on this pool's nodes, as an example: `12 = 8 + 4` on 8-GPU nodes.
    pub fn remainder_example(&self) -> String {
        let n = u32::from(self.node_gpus).max(2);
        format!("{} = {n} + {}", n + n / 2, n / 2)
    }
}

/// The shape value of a multi-node gang.
pub const GANG: &str = "gang";

/// Whether a checkbox's value says it is ticked.
fn ticked(raw: &str) -> bool {
    matches!(raw, "on" | "true")
}

/// Pools; the models of the chosen pool; the shapes that model offers in that pool (whole
/// counts up to its largest node, its MIG profiles, or fractions in shared pools; in a whole
/// pool of more than one node, a multi-node gang with its own fields).
pub fn dependent(f: &Fleet, v: &Form) -> Dependent {
    let pools = opts(
        f.pools
            .iter()
            .map(|p| (p.name.clone(), format!("{} ({})", p.name, p.sharing))),
        &v.pool,
    );
    let pid = f.pool_by_name(&selected(&pools)).unwrap_or(PoolId(0));
    let p = f.pool(pid);
    let nodes = &f.nodes[p.nodes.start as usize..p.nodes.end as usize];
    let mut per_model: BTreeMap<String, (tessera_model::ModelId, u8, usize)> = BTreeMap::new();
    for n in nodes {
        let name = f.catalogue.get(n.model).name.clone();
        let e = per_model.entry(name).or_insert((n.model, 0, 0));
        e.1 = e.1.max(n.gpus);
        e.2 += 1;
    }
    let models = opts(per_model.keys().map(|m| (m.clone(), m.clone())), &v.model);
    let mut shapes: Vec<(String, String)> = Vec::new();
    let mut gang_possible = None;
    if let Some(&(mid, most, count)) = per_model.get(&selected(&models)) {
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
                // A gang takes whole nodes of a whole pool (the engine's rule).
                if p.sharing == Sharing::Whole && count > 1 && most > 0 {
                    shapes.push((
                        GANG.to_string(),
                        "a multi-node gang: whole GPUs across nodes".to_string(),
                    ));
                    gang_possible = Some((most, count));
                }
            }
        }
    }
    let shapes = opts(shapes, &v.shape);
    let gang = gang_possible
        .filter(|_| selected(&shapes) == GANG)
        .map(|(most, count)| {
            let levels = opts(
                std::iter::once((String::new(), "any: the fewest racks possible".to_string())).chain(
                    f.levels
                        .names()
                        .iter()
                        .enumerate()
                        .filter(|(l, _)| f.levels.pool_has(*l, pid))
                        .map(|(_, n)| (n.clone(), n.clone())),
                ),
                &v.topology,
            );
            let modes = opts(
                [
                    ("required", "required: within one domain of the level, or wait"),
                    ("preferred", "preferred: one domain if one has room, else the fewest"),
                ]
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string())),
                &v.topology_mode,
            );
            let gpus = v.gang_gpus.clone();
            use tessera_api::rules::{GANG_GPUS, GPUS, IntRule, NODES};
            let input = |field, id, label, value: &str, note, rule: IntRule| GangInput {
                field,
                id,
                label,
                value: value.to_string(),
                min: rule.min,
                max: rule.max,
                note,
            };
            GangFields {
                inputs: vec![
                    input("gang_gpus", "f-gang-gpus", "GPUs in all", &gpus, "", GANG_GPUS),
                    input(
                        "gang_nodes",
                        "f-gang-nodes",
                        "Nodes (optional)",
                        &v.gang_nodes,
                        "",
                        NODES,
                    ),
                    input(
                        "gang_per_node",
                        "f-gang-per-node",
                        "GPUs per node (optional)",
                        &v.gang_per_node,
                        "",
                        GPUS,
                    ),
                    input(
                        "segment",
                        "f-segment",
                        "Segment size in GPUs (optional)",
                        &v.segment,
                        "segment-note",
                        GANG_GPUS,
                    ),
                ],
                gpus,
                nodes: v.gang_nodes.clone(),
                per_node: v.gang_per_node.clone(),
                segment: v.segment.clone(),
                remainder: ticked(&v.remainder),
                levels,
                modes,
                node_gpus: most,
                nodes_in_pool: count,
                errors: BTreeMap::new(),
            }
        });
    Dependent {
        pools,
        models,
        shapes,
        gang,
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
    /// How the preview's amounts read (or that no price list is configured).
    pub money: super::Money,
}

impl FormView {
    /// The message for `field`, or "".
    pub fn error(&self, field: &str) -> &str {
        self.errors.get(field).map(String::as_str).unwrap_or("")
    }

    /// The most characters a workload name may have (the API's own rule), for the name box.
    pub fn name_max(&self) -> usize {
        tessera_api::rules::NAME.max_chars
    }

    /// The longest duration in hours (the API's own rule), for the duration box.
    pub fn hours_max(&self) -> i64 {
        tessera_api::rules::DURATION_S.max / 3600
    }

    /// The shortest duration in hours, rounded up to what the box shows (the API's one second).
    pub fn hours_min(&self) -> &'static str {
        HOURS_MIN
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
    let dep = dependent(&s.fleet(), &v);
    let priority = if v.priority.is_empty() { "standard" } else { &v.priority };
    // Only the classes the caller may submit: a tenant's token its tenant's grant, a
    // platform-admin every class.
    let offered: Vec<String> = match (&c.id.tenant, c.id.is_admin()) {
        (_, true) | (None, false) => s.priorities.to_vec(),
        (Some(t), false) => match s.store.get_tenant(t).await? {
            Some(t) => crate::services::tenancy::granted(s, &t),
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
        money: super::Money::new(&s.prices),
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
    let mut dep = dependent(&s.fleet(), &v);
    // A gang just chosen starts at two whole nodes.
    if let Some(g) = &mut dep.gang
        && v.gang_gpus.trim().is_empty()
        && v.gang_nodes.trim().is_empty()
    {
        g.prefill();
    }
    html(&DependentFragment { dep })
}

/// A form field and what is wrong with it, in the form's words.
pub type FieldError = (&'static str, String);

/// An optional whole number of the form (`""`: not given), checked by the API's own `rule`
/// under the field's label.
fn number(raw: &str, label: &str, rule: tessera_api::rules::IntRule) -> Result<Option<u32>, String> {
    let t = raw.trim();
    if t.is_empty() {
        return Ok(None);
    }
    let n: i64 = t
        .parse()
        .map_err(|_| format!("`{t}`: {label} must be a whole number"))?;
    rule.check(label, n).map_err(|v| v.message)?;
    Ok(Some(n as u32))
}

/// The gang fields of a form as the API's shape fields (`gpus`, `nodes`, `gpus_per_node`,
/// `topology`, `topology_mode`, `segment`); every field's problem at once.
fn gang_shape(v: &Form, shape: &mut GpuShape, errors: &mut Vec<FieldError>) {
    use tessera_api::rules;
    let mut take = |field: &'static str, label: &str, raw: &str, rule| match number(raw, label, rule) {
        Ok(n) => n,
        Err(e) => {
            errors.push((field, e));
            None
        }
    };
    let gpus = take("gang_gpus", "GPUs in all", &v.gang_gpus, rules::GANG_GPUS);
    let nodes = take("gang_nodes", "Nodes", &v.gang_nodes, rules::NODES);
    let per_node = take("gang_per_node", "GPUs per node", &v.gang_per_node, rules::GPUS);
    let segment = take("segment", "Segment", &v.segment, rules::GANG_GPUS);
    let given = |raw: &str| !raw.trim().is_empty();
    if !given(&v.gang_gpus) && !given(&v.gang_nodes) {
        errors.push((
            "gang_gpus",
            "give the GPUs in all (or Nodes and GPUs per node)".to_string(),
        ));
    }
    // The last node taking the rest goes with GPUs in all alone: the nodes are the pool's.
    let remainder = ticked(&v.remainder);
    if remainder {
        let mut others: Vec<&str> = Vec::new();
        for (raw, label) in [
            (&v.gang_nodes, "Nodes"),
            (&v.gang_per_node, "GPUs per node"),
            (&v.segment, "Segment size"),
        ] {
            if given(raw) {
                others.push(label);
            }
        }
        if !others.is_empty() {
            errors.push((
                "remainder",
                format!(
                    "the last node takes the rest of GPUs in all on whole nodes of the pool: leave {} blank, \
                     or untick this",
                    others.join(" and ")
                ),
            ));
        } else if !given(&v.gang_gpus) {
            errors.push((
                "remainder",
                "give GPUs in all: the last node takes the rest".to_string(),
            ));
        }
    }
    shape.gpus = gpus;
    shape.nodes = nodes;
    shape.gpus_per_node = per_node.map(|p| p as u8);
    shape.segment = segment;
    shape.remainder = remainder;
    let level = v.topology.trim();
    if !level.is_empty() {
        shape.topology = Some(level.to_string());
        shape.topology_mode = Some(match v.topology_mode.as_str() {
            "" | "required" => tessera_api::TopologyMode::Required,
            "preferred" => tessera_api::TopologyMode::Preferred,
            _ => {
                errors.push(("topology_mode", "choose required or preferred".to_string()));
                tessera_api::TopologyMode::Required
            }
        });
    }
}

/// The shortest duration the hours box takes: one second (the API's least), rounded up.
const HOURS_MIN: &str = "0.0003";

/// The duration box in seconds: a number of hours within the API's bounds, said in hours.
fn duration_s(raw: &str) -> Result<Option<i64>, String> {
    let h = raw.trim();
    if h.is_empty() {
        return Ok(None);
    }
    let hours = h
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && *x > 0.0)
        .ok_or_else(|| format!("`{h}` is not a number of hours above 0"))?;
    let rule = tessera_api::rules::DURATION_S;
    let max_h = rule.max / 3600;
    if hours > max_h as f64 {
        return Err(format!(
            "{h} hours is longer than the longest duration, {max_h} hours ({} days)",
            max_h / 24
        ));
    }
    let s = (hours * 3600.0).round() as i64;
    if s < rule.min {
        return Err(format!("{h} hours is shorter than one second ({HOURS_MIN} hours)"));
    }
    Ok(Some(s))
}

/// The API request a form describes, or every form field it cannot be made from.
pub fn to_api(v: &Form) -> Result<CreateWorkload, Vec<FieldError>> {
    let (b, errors) = to_api_all(v);
    if errors.is_empty() { Ok(b) } else { Err(errors) }
}

/// The API request a form describes as far as it can be made, with every form field it cannot
/// be made from (in the form's words and units).
fn to_api_all(v: &Form) -> (CreateWorkload, Vec<FieldError>) {
    let mut errors: Vec<FieldError> = Vec::new();
    if let Err(e) = tessera_api::rules::NAME.check("name", v.name.trim()) {
        errors.push(("name", e.message));
    }
    let (tenant, project) = match v.project.split_once('/') {
        Some(tp) => tp,
        None => {
            errors.push(("project", "choose a project".to_string()));
            ("", "")
        }
    };
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
    match v.shape.split_once(':') {
        _ if v.shape == GANG => gang_shape(v, &mut shape, &mut errors),
        Some(("gpus", n)) => match n.parse() {
            Ok(n) => shape.gpus = Some(n),
            Err(_) => errors.push(bad_shape()),
        },
        Some(("mig", p)) => shape.mig = Some(p.to_string()),
        Some(("fraction", m)) => match m.parse() {
            Ok(m) => shape.fraction = Some(m),
            Err(_) => errors.push(bad_shape()),
        },
        _ => errors.push(bad_shape()),
    }
    let duration_s = match duration_s(&v.duration_h) {
        Ok(d) => d,
        Err(e) => {
            errors.push(("duration_h", e));
            None
        }
    };
    let kind = match v.kind.as_str() {
        "" | "batch" => WorkloadKind::Batch,
        "service" => WorkloadKind::Service,
        "interactive" => WorkloadKind::Interactive,
        _ => {
            errors.push(("kind", "choose a kind from the list".to_string()));
            WorkloadKind::Batch
        }
    };
    let movable = match v.movable.as_str() {
        "" | "none" => None,
        "restart" => Some(MovableMode::Restart),
        "replace" => Some(MovableMode::Replace),
        _ => {
            errors.push(("movable", "choose from the list".to_string()));
            None
        }
    };
    let b = CreateWorkload {
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
    };
    (b, errors)
}

/// Every rule of the API's that `b` breaks, a field at a time: after each violation its field
/// is set to a value that passes, so that the next one is found (a shape's stops the search).
fn violations(b: &CreateWorkload) -> Vec<tessera_api::rules::Violation> {
    let mut b = b.clone();
    let mut out = Vec::new();
    while let Err(v) = b.validate() {
        let passed = match v.field.as_str() {
            "tenant" if b.tenant != "x" => {
                b.tenant = "x".into();
                true
            }
            "project" if b.project != "x" => {
                b.project = "x".into();
                true
            }
            "name" if b.name != "x" => {
                b.name = "x".into();
                true
            }
            "duration_s" if b.duration_s.is_some() => {
                b.duration_s = None;
                true
            }
            "movable" if b.movable.is_some() => {
                b.movable = None;
                true
            }
            _ => false,
        };
        out.push(v);
        if !passed {
            break;
        }
    }
    out
}

/// The form field an API field belongs to (`gang`: the form asks for a multi-node gang, whose
/// shape fields have fields of their own).
fn form_field(api: &str, gang: bool) -> &'static str {
    match api {
        "name" => "name",
        "tenant" | "project" => "project",
        "priority" => "priority",
        "duration_s" => "duration_h",
        "kind" => "kind",
        "movable" => "movable",
        "shape.pool" => "pool",
        "shape.models" => "model",
        "shape.gpus" if gang => "gang_gpus",
        "shape.nodes" if gang => "gang_nodes",
        "shape.gpus_per_node" if gang => "gang_per_node",
        "shape.topology" | "shape.topology_mode" if gang => "topology",
        "shape.segment" if gang => "segment",
        "shape.remainder" if gang => "remainder",
        _ => "shape",
    }
}

/// An API message about a gang's shape in the form's words: the API's field names
/// (`gpus_per_node`, `shape.segment`) become the form's labels.
fn gang_words(msg: &str) -> String {
    const NAMES: [(&str, &str); 15] = [
        ("leave out `remainder`", "untick \"Last node takes the rest\""),
        ("`remainder`", "\"Last node takes the rest\""),
        ("shape.remainder", "Last node takes the rest"),
        ("shape.gpus_per_node", "GPUs per node"),
        ("shape.gpus", "GPUs in all"),
        ("shape.nodes", "Nodes"),
        ("shape.segment", "Segment"),
        ("shape.topology_mode", "Topology mode"),
        ("shape.topology", "Topology"),
        ("`gpus_per_node`", "GPUs per node"),
        ("gpus_per_node", "GPUs per node"),
        ("`nodes`", "Nodes"),
        ("`gpus`", "GPUs in all"),
        ("`segment`", "Segment"),
        ("`topology`", "Topology"),
    ];
    NAMES
        .iter()
        .fold(msg.to_string(), |m, (api, label)| m.replace(api, label))
}

fn refused(e: &ApiError, v: &Form) -> FieldError {
    let gang = v.shape == GANG;
    let field = e.field.as_deref().map(|f| form_field(f, gang)).unwrap_or("form");
    let detail = if gang { gang_words(&e.detail) } else { e.detail.clone() };
    (field, detail)
}

/// A gang of whole nodes (GPUs in all alone, no remainder) whose GPUs are no multiple of the
/// chosen pool's node size: said next to GPUs in all, with the remainder that would take it
/// (the engine would refuse it as a shape no pool can hold).
fn no_multiple(v: &Form, b: &CreateWorkload, fleet: &Fleet) -> Option<FieldError> {
    let gpus = b.shape.gpus?;
    if v.shape != GANG || b.shape.remainder || b.shape.nodes.is_some() || b.shape.gpus_per_node.is_some() {
        return None;
    }
    let n = u32::from(dependent(fleet, v).gang?.node_gpus);
    if n == 0 || gpus <= n || gpus.is_multiple_of(n) {
        return None;
    }
    let (whole, rest) = (gpus / n, gpus % n);
    let split = if whole <= 3 {
        vec![n.to_string(); whole as usize].join(" + ")
    } else {
        format!("{whole} × {n}")
    };
    Some((
        "gang_gpus",
        format!(
            "{gpus} GPUs are no multiple of this pool's {n}-GPU nodes: give a multiple of {n}, or tick \
             \"Last node takes the rest\" ({gpus} = {split} + {rest})"
        ),
    ))
}

/// Reads the form and checks it as the API checks a creation.
async fn checked(
    s: &AppState,
    c: &Caller,
    body: &[u8],
) -> Result<(Form, CreateWorkload, workloads::Checked), (Form, Vec<FieldError>)> {
    let v: Form = serde_urlencoded::from_bytes(body).unwrap_or_default();
    // Every field's problem at once: the form's own checks, then the API's rules on the rest.
    let (b, mut errors) = to_api_all(&v);
    if let Some(e) = no_multiple(&v, &b, &s.fleet()) {
        errors.push(e);
    }
    for e in violations(&b) {
        let e = refused(&ApiError::from(e), &v);
        if !errors.iter().any(|(f, _)| *f == e.0) {
            errors.push(e);
        }
    }
    if !errors.is_empty() {
        return Err((v, errors));
    }
    match workloads::check_create(s, &c.id, &b).await {
        Ok(k) => Ok((v, b, k)),
        Err(e) => {
            let e = refused(&e, &v);
            Err((v, vec![e]))
        }
    }
}

async fn with_error(s: &AppState, c: &Caller, v: Form, errors: Vec<FieldError>) -> Result<Response, ApiError> {
    let mut form = view(s, c, v).await?;
    for (field, msg) in errors {
        form.errors.entry(field).or_insert(msg);
    }
    if let Some(g) = &mut form.dep.gang {
        g.errors = form.errors.clone();
    }
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
            let run = dryrun::answer(&s, &b, &k).await;
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
    let rid = rid.map(|Extension(r)| r.0).unwrap_or_default();
    let key = headers.get("idempotency-key").map(|k| k.as_bytes());
    match workloads::create(&s, &c.id, rid, key, b).await {
        Ok((w, _)) => {
            let mut out = StatusCode::NO_CONTENT.into_response();
            out.headers_mut().insert(
                "hx-redirect",
                HeaderValue::from_str(&format!("/console/workloads/{}", w.id)).expect("ascii"),
            );
            // The audit record committed with the workload: the middleware adds none.
            out.extensions_mut().insert(crate::audit::Audited);
            Ok(out)
        }
        Err(e)
            if e.status == StatusCode::UNPROCESSABLE_ENTITY
                || e.status == StatusCode::FORBIDDEN && e.field.is_some() =>
        {
            let e = refused(&e, &v);
            with_error(&s, &c, v, vec![e]).await
        }
        Err(e) if e.status == StatusCode::FORBIDDEN && e.kind != "forbidden" => {
            // Refused by a quota limit or the budget: said next to the shape.
            let field = if v.shape == GANG { "gang_gpus" } else { "shape" };
            with_error(&s, &c, v, vec![(field, e.detail.clone())]).await
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gang_form() -> Form {
        Form {
            project: "vision/train".into(),
            name: "big".into(),
            pool: "training".into(),
            model: "H100-80GB-SXM".into(),
            shape: GANG.into(),
            duration_h: "1".into(),
            gang_gpus: "16".into(),
            ..Form::default()
        }
    }

    #[test]
    fn a_gang_form_becomes_the_apis_gang_shape() {
        let mut v = gang_form();
        v.topology = "rack".into();
        v.topology_mode = "preferred".into();
        v.segment = "8".into();
        v.gang_per_node = "4".into();
        let b = to_api(&v).expect("valid");
        assert_eq!(b.shape.gpus, Some(16));
        assert_eq!(b.shape.nodes, None);
        assert_eq!(b.shape.gpus_per_node, Some(4));
        assert_eq!(b.shape.topology.as_deref(), Some("rack"));
        assert_eq!(b.shape.topology_mode, Some(tessera_api::TopologyMode::Preferred));
        assert_eq!(b.shape.segment, Some(8));
        assert_eq!(b.shape.pool.as_deref(), Some("training"));
        b.validate().expect("the API's rules hold");
        // Without a level, no topology and no mode (the API's default: the fewest racks).
        let b = to_api(&gang_form()).expect("valid");
        assert_eq!((b.shape.topology, b.shape.topology_mode), (None, None));
        // Nodes and GPUs per node instead of GPUs in all.
        let mut v = gang_form();
        v.gang_gpus = String::new();
        v.gang_nodes = "3".into();
        v.gang_per_node = "8".into();
        let b = to_api(&v).expect("valid");
        assert_eq!(
            (b.shape.gpus, b.shape.nodes, b.shape.gpus_per_node),
            (None, Some(3), Some(8))
        );
        b.validate().expect("the API's rules hold");
    }

    #[test]
    fn every_bad_field_is_named_at_once_in_the_forms_words() {
        let mut v = gang_form();
        v.gang_gpus = "lots".into();
        v.gang_nodes = "0".into();
        v.segment = "-8".into();
        v.duration_h = "soon".into();
        v.topology = "rack".into();
        v.topology_mode = "sometimes".into();
        let errors = to_api(&v).expect_err("invalid");
        let fields: Vec<&str> = errors.iter().map(|(f, _)| *f).collect();
        assert_eq!(
            fields,
            ["gang_gpus", "gang_nodes", "segment", "topology_mode", "duration_h"],
            "{errors:?}"
        );
        let msg = |f: &str| errors.iter().find(|(x, _)| *x == f).map(|(_, m)| m.as_str()).unwrap();
        assert_eq!(msg("gang_gpus"), "`lots`: GPUs in all must be a whole number");
        assert_eq!(msg("gang_nodes"), "0: Nodes must be between 1 and 4096 nodes");
        assert!(
            msg("segment").starts_with("-8: Segment must be between 1 and"),
            "{errors:?}"
        );
        assert!(errors.iter().all(|(_, m)| !m.contains("shape.")), "{errors:?}");
        // Neither GPUs nor nodes.
        let mut v = gang_form();
        v.gang_gpus = " ".into();
        let errors = to_api(&v).expect_err("invalid");
        assert_eq!(errors[0].0, "gang_gpus");
        assert!(errors[0].1.contains("GPUs per node"), "{errors:?}");
    }

    #[test]
    fn the_duration_is_checked_in_hours_and_every_api_rule_is_found_at_once() {
        assert_eq!(duration_s(" "), Ok(None));
        assert_eq!(duration_s("1.5"), Ok(Some(5400)));
        assert_eq!(
            duration_s(HOURS_MIN),
            Ok(Some(1)),
            "the box's least is the API's one second"
        );
        assert_eq!(
            duration_s("8785"),
            Err("8785 hours is longer than the longest duration, 8784 hours (366 days)".to_string())
        );
        assert!(duration_s("0.0001").unwrap_err().contains("shorter than one second"));
        let mut v = gang_form();
        v.kind = "service".into();
        v.movable = "restart".into();
        v.name = "n".repeat(64);
        let (b, errors) = to_api_all(&v);
        assert_eq!(errors.iter().map(|(f, _)| *f).collect::<Vec<_>>(), ["name"]);
        let fields: Vec<String> = violations(&b).into_iter().map(|x| x.field).collect();
        assert_eq!(fields, ["name", "movable"], "each rule broken, not only the first");
    }

    #[test]
    fn the_apis_gang_refusals_are_told_in_the_forms_words() {
        let mut v = gang_form();
        v.gang_nodes = "3".into();
        let b = to_api(&v).expect("the form reads");
        let e = refused(&ApiError::from(b.validate().expect_err("16 over 3 nodes")), &v);
        assert_eq!(e.0, "gang_gpus");
        assert_eq!(
            e.1,
            "16 GPUs over 3 nodes: ask for a multiple of 3, or give GPUs per node"
        );
        let mut v = gang_form();
        v.gang_gpus = "12".into();
        v.gang_per_node = "8".into();
        let b = to_api(&v).expect("the form reads");
        let e = refused(&ApiError::from(b.validate().expect_err("12 by 8")), &v);
        assert_eq!(
            e,
            (
                "gang_gpus",
                "12 GPUs as node-shares of 8: ask for a multiple of 8".to_string()
            )
        );
        // A single-node shape keeps the API's field for the shape select.
        assert_eq!(form_field("shape.gpus", false), "shape");
        assert_eq!(form_field("shape.segment", true), "segment");
        assert_eq!(form_field("shape.topology_mode", true), "topology");
    }

    #[test]
    fn the_gang_shape_is_offered_in_whole_pools_with_the_pools_levels() {
        let f = Fleet::seed();
        let mut v = Form {
            pool: "training".into(),
            ..Form::default()
        };
        let d = dependent(&f, &v);
        assert!(d.shapes.iter().any(|o| o.value == GANG), "a gang in the training pool");
        assert!(d.gang.is_none(), "its fields only once it is chosen");
        v.shape = GANG.into();
        let d = dependent(&f, &v);
        let g = d.gang.expect("the gang's fields");
        let levels: Vec<&str> = g.levels.iter().map(|o| o.value.as_str()).collect();
        assert_eq!(levels, ["", "rack"]);
        assert_eq!((g.node_gpus, g.nodes_in_pool), (8, 16));
        assert_eq!(g.gpus, "", "as the form sent it");
        let mut g = g;
        g.prefill();
        assert_eq!(
            (g.gpus.as_str(), g.inputs[0].value.as_str()),
            ("16", "16"),
            "two whole nodes to start from"
        );
        for pool in ["serving", "development"] {
            v.pool = pool.into();
            let d = dependent(&f, &v);
            assert!(!d.shapes.iter().any(|o| o.value == GANG), "no gang in {pool}");
            assert!(d.gang.is_none());
        }
    }
}
