//! The REST API under `/api/v1`, one module per area: [`fleet`] (pools, nodes, GPUs),
//! [`tenancy`] (tenants and projects), [`tokens`] (API tokens), [`audit`] (the audit log),
//! [`workloads`], [`governance`] (quotas and budgets), [`usage`] (reports), [`system`]
//! (health) and, with the simulated backend only, [`sim`] (fault injection). Domain records
//! become REST views in one place, [`views`].
//!
//! Every route is registered through `utoipa-axum`'s `OpenApiRouter`, so the OpenAPI document
//! (`/api/v1/openapi.json`) lists exactly the routes the router serves. Requests are read by
//! this module's extractors ([`ApiJson`], [`ApiQuery`], [`ApiPath`]), which check each value
//! against the rules of `tessera_api::rules` — the same rules the document's schemas are made
//! from — and answer every refusal with a problem document; [`complete`] adds to each operation
//! the statuses those extractors and the middleware produce.

pub mod apply;
pub mod audit;
pub mod dryrun;
pub mod fleet;
pub mod governance;
pub mod health;
pub mod imagepolicy;
pub mod logs;
pub mod nodeops;
mod openapi;
pub mod rollouts;
pub mod sim;
pub mod system;
pub mod tenancy;
pub mod tokens;
pub mod usage;
pub mod views;
pub mod workloads;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tessera_api::Page;
use tessera_api::rules::{self, Validate, Violation};
use tessera_domain::WorkloadId;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoParams, Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::problem::{ApiError, PROBLEM_JSON};
use crate::state::AppState;

#[derive(OpenApi)]
#[openapi(
    info(title = "Tessera API", description = "GPU-as-a-service for on-premises NVIDIA fleets: request whole GPUs, MIG slices or fractions of shared GPUs, and follow each request from placement to release."),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
    tags(
        (name = "fleet", description = "Pools, nodes and GPUs (read-only)"),
        (name = "tenancy", description = "Tenants, projects and API tokens"),
        (name = "workloads", description = "GPU requests and their lifecycle"),
        (name = "governance", description = "Quotas, budgets and usage"),
        (name = "system", description = "Health, the replicas of the control plane and the API description"),
    )
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The API router and its OpenAPI document. `with_sim`: the simulated backend runs, so its
/// fault-injection route exists; `priorities`: the priority classes requests may name.
pub fn router(with_sim: bool, priorities: &[String]) -> (axum::Router<AppState>, serde_json::Value) {
    let mut r = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(system::health))
        .routes(routes!(system::replicas))
        .routes(routes!(fleet::list_pools))
        .routes(routes!(fleet::list_nodes))
        .routes(routes!(fleet::list_gpus))
        .routes(routes!(health::gpu_health))
        .routes(routes!(health::clear_gpu))
        .routes(routes!(nodeops::drain_node))
        .routes(routes!(nodeops::node_action))
        .routes(routes!(nodeops::set_mig_mode))
        .routes(routes!(rollouts::list_rollouts, rollouts::create_rollout))
        .routes(routes!(rollouts::get_rollout))
        .routes(routes!(rollouts::cancel_rollout))
        .routes(routes!(tenancy::list_tenants, tenancy::create_tenant))
        .routes(routes!(tenancy::get_tenant, tenancy::delete_tenant))
        .routes(routes!(tenancy::set_priorities))
        .routes(routes!(
            imagepolicy::get_image_policy,
            imagepolicy::set_image_policy,
            imagepolicy::delete_image_policy
        ))
        .routes(routes!(tenancy::list_projects, tenancy::create_project))
        .routes(routes!(tenancy::get_project, tenancy::delete_project))
        .routes(routes!(tokens::list_tokens, tokens::create_token))
        .routes(routes!(tokens::revoke_token))
        .routes(routes!(audit::audit_log))
        .routes(routes!(workloads::list_workloads, workloads::create_workload))
        .routes(routes!(dryrun::dry_run))
        .routes(routes!(workloads::get_workload))
        .routes(routes!(workloads::cancel_workload))
        .routes(routes!(workloads::workload_events))
        .routes(routes!(logs::workload_logs))
        .routes(routes!(governance::get_quotas))
        .routes(routes!(governance::set_quota, governance::delete_quota))
        .routes(routes!(governance::set_budget))
        .routes(routes!(apply::apply))
        .routes(routes!(usage::usage_report))
        .routes(routes!(usage::usage_intervals));
    if with_sim {
        r = r.routes(routes!(sim::inject_fault));
    }
    let (router, doc) = r.split_for_parts();
    let mut doc = serde_json::to_value(&doc).expect("the OpenAPI document serialises");
    complete(&mut doc, priorities);
    openapi::state_rules(&mut doc);
    (router, doc)
}

/// What every operation can answer besides its own results, by what it takes: the statuses
/// the extractors, the middleware and the store produce (handlers declare the rest: 403, 404
/// and 409 of their own), each a problem document.
fn complete(doc: &mut serde_json::Value, priorities: &[String]) {
    use serde_json::{Value, json};
    let problem = |why: &str| {
        json!({
            "description": why,
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}
        })
    };
    let paths = doc["paths"].as_object_mut().expect("paths");
    for item in paths.values_mut() {
        let item = item.as_object_mut().expect("path item");
        for op in item.values_mut().filter(|op| op.get("responses").is_some()) {
            let takes = |place: &str| {
                op["parameters"]
                    .as_array()
                    .is_some_and(|ps| ps.iter().any(|p| p["in"] == place))
            };
            let (path, query, header) = (takes("path"), takes("query"), takes("header"));
            if let Some(ps) = op.get_mut("parameters").and_then(serde_json::Value::as_array_mut) {
                // A path parameter is always required (schema_with leaves it unmarked).
                for p in ps.iter_mut().filter(|p| p["in"] == "path") {
                    p["required"] = json!(true);
                }
            }
            let body = op.get("requestBody").is_some();
            let open = op["security"] == json!([{}]);
            let mut extra: Vec<(&str, &str)> = Vec::new();
            if path || body {
                extra.push((
                    "400",
                    "Malformed: a path parameter of the wrong type, or a body that is not JSON",
                ));
            }
            if !open {
                extra.push(("401", "No credential, or an unknown, expired or revoked one"));
                extra.push(("403", "The credential may not do this"));
            }
            if path {
                extra.push(("404", "No such resource, or one the caller may not see"));
            }
            if body {
                extra.push(("413", "The body is larger than 64 KiB"));
                extra.push(("415", "The body is not sent as `application/json`"));
            }
            if body || query || header {
                extra.push(("422", "A value breaks a documented rule; `field` names it"));
            }
            extra.push(("429", "Rate limit of the credential exceeded; see `Retry-After`"));
            if !open {
                extra.push(("503", "The store or the audit log is unavailable; retry shortly"));
            }
            let responses = op["responses"].as_object_mut().expect("responses");
            for (code, why) in extra {
                responses.entry(code).or_insert_with(|| problem(why));
            }
            responses["429"]["headers"] = json!({
                "Retry-After": {"description": "Seconds to wait", "schema": {"type": "integer", "minimum": 1}}
            });
            for (code, r) in responses.iter_mut() {
                // Errors are sent as problem documents: say so where a handler declared `body = Problem`.
                if let Some(content) = r.get_mut("content").and_then(Value::as_object_mut)
                    && let Some(json) = content.get("application/json").cloned()
                    && json["schema"]["$ref"] == "#/components/schemas/Problem"
                {
                    content.remove("application/json");
                    content.insert(PROBLEM_JSON.into(), json);
                }
                // OpenAPI 3.1 requires a description on every response.
                if r.get("description").is_none_or(|d| d == "") {
                    r["description"] = json!(
                        code.parse::<u16>()
                            .ok()
                            .and_then(|c| StatusCode::from_u16(c).ok())
                            .and_then(|c| c.canonical_reason())
                            .unwrap_or("Response")
                    );
                }
            }
        }
    }
    if let Some(p) = doc.pointer_mut("/components/schemas/CreateWorkload/properties/priority") {
        let mut names: Vec<Value> = priorities.iter().map(|p| json!(p)).collect();
        names.push(Value::Null);
        *p = json!({
            "type": ["string", "null"],
            "enum": names,
            "description": "Priority class name (default `standard`); a tenant's token may use only the classes granted to the tenant (`Tenant.priorities`)"
        });
    }
    // A grant names the classes the server knows.
    for schema in ["SetPriorities", "CreateTenant", "DeclaredTenant"] {
        if let Some(items) = doc.pointer_mut(&format!("/components/schemas/{schema}/properties/priorities/items")) {
            items["enum"] = json!(priorities);
        }
    }
}

/// JSON body extractor: the body must be `application/json`, within the size limit, of the
/// type's shape, and follow the type's rules ([`Validate`]); every refusal is a problem
/// document naming what is wrong (and the field, for data that breaks a rule).
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned + Validate, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let json = is_json(&req);
        if !json {
            return Err(not_json());
        }
        let bytes = read_body(req, state).await?;
        Ok(ApiJson(json_body(&bytes)?))
    }
}

/// Whether the request says its body is JSON (`application/json` or `application/…+json`).
fn is_json(req: &Request) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|m| m.trim().to_ascii_lowercase())
        .is_some_and(|m| m == "application/json" || (m.starts_with("application/") && m.ends_with("+json")))
}

/// The refusal of a body that is not JSON.
fn not_json() -> ApiError {
    ApiError::unsupported_media("send the body as JSON with `Content-Type: application/json`")
}

/// The body's bytes, within the size limit (413 beyond it).
async fn read_body<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state).await.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::from_status(StatusCode::PAYLOAD_TOO_LARGE)
        } else {
            ApiError::bad_request(format!("the body could not be read: {}", e.body_text()))
        }
    })
}

/// A deserialisation error as a 422 naming the field; at the top level the field is in the
/// message (`missing field `name``), else it is `whole` (`body`, `query`).
fn field_error<E: std::fmt::Display>(e: serde_path_to_error::Error<E>, whole: &str) -> ApiError {
    let field = e.path().to_string();
    let message = e.into_inner().to_string();
    let field = if field == "." {
        message.split('`').nth(1).unwrap_or(whole).to_string()
    } else {
        field
    };
    ApiError::invalid(field, message)
}

/// A JSON body read into its type and checked by its rules (see [`ApiJson`]).
fn json_body<T: DeserializeOwned + Validate>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut raw: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    // Every body is an object: serde would also read a struct from an array of its fields.
    if !raw.is_object() {
        return Err(ApiError::invalid("body", "the body must be a JSON object"));
    }
    integral_numbers_as_integers(&mut raw);
    let value: T = serde_path_to_error::deserialize(raw).map_err(|e| field_error(e, "body"))?;
    value.validate()?;
    Ok(value)
}

/// An optional JSON body: none (`None`) when the request has an empty body or the JSON `null`
/// (as the document's `oneOf [T, null]` allows), else what [`ApiJson`] reads (a non-empty body
/// must be `application/json`).
pub struct OptionalApiJson<T>(pub Option<T>);

impl<T: DeserializeOwned + Validate, S: Send + Sync> FromRequest<S> for OptionalApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let json = is_json(&req);
        let bytes = read_body(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalApiJson(None));
        }
        if !json {
            return Err(not_json());
        }
        if bytes.trim_ascii() == b"null" {
            return Ok(OptionalApiJson(None));
        }
        Ok(OptionalApiJson(Some(json_body(&bytes)?)))
    }
}

/// JSON has one number type: `33.0` is the integer 33 to JSON Schema (and so to the OpenAPI
/// document), while serde refuses it for an integer field. Whole numbers written with a
/// fraction become integers before the body is read into its type.
fn integral_numbers_as_integers(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|f| n.is_f64() && f.fract() == 0.0) {
                // Within ±2^63 (and up to 2^64 for unsigned): beyond, it stays a float and is
                // out of every documented range anyway.
                if f >= -(2f64.powi(63)) && f < 2f64.powi(63) {
                    *n = (f as i64).into();
                } else if f >= 0.0 && f < 2f64.powi(64) {
                    *n = (f as u64).into();
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_numbers_as_integers),
        Value::Object(fields) => fields.values_mut().for_each(integral_numbers_as_integers),
        Value::String(_) | Value::Bool(_) | Value::Null => {}
    }
}

/// Query-string extractor: parameters of the type's shape that follow its rules; a refusal is
/// a 422 problem naming the parameter.
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned + Validate, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let q = parts.uri.query().unwrap_or_default();
        let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(q.as_bytes()));
        let value: T = serde_path_to_error::deserialize(de).map_err(|e| field_error(e, "query"))?;
        value.validate()?;
        Ok(ApiQuery(value))
    }
}

/// Path-parameter extractor whose refusals (a parameter of the wrong type) are 400 problems.
pub struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(v)) => Ok(ApiPath(v)),
            Err(e) => Err(ApiError::bad_request(e.body_text())),
        }
    }
}

/// A workload id in the path: a whole number the store can hold (0 to 2^63 − 1).
pub struct WorkloadPath(pub WorkloadId);

/// The document's side of [`WorkloadPath`].
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // only its schema is used
pub struct WorkloadIdParams {
    /// The workload's id.
    #[param(schema_with = rules::schema::id)]
    id: u64,
}

impl<S: Send + Sync> FromRequestParts<S> for WorkloadPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let ApiPath(raw) = ApiPath::<String>::from_request_parts(parts, state).await?;
        let id = raw
            .parse::<u64>()
            .ok()
            .filter(|v| rules::ID.check_u64("id", *v).is_ok())
            .ok_or_else(|| {
                let mut e = ApiError::bad_request(format!(
                    "`{raw}` is not a workload id (a whole number from 0 to {})",
                    i64::MAX
                ));
                e.field = Some("id".into());
                e
            })?;
        Ok(WorkloadPath(WorkloadId(id)))
    }
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Items per page (default 100).
    #[param(schema_with = rules::schema::page_limit)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

impl Validate for PageParams {
    fn validate(&self) -> Result<(), Violation> {
        check_limit(self.limit)
    }
}

impl PageParams {
    pub fn limit(&self) -> u32 {
        self.limit.unwrap_or(DEFAULT_LIMIT)
    }
}

/// Items per page when a list request does not say.
pub const DEFAULT_LIMIT: u32 = rules::PAGE_DEFAULT;

/// The page size rule of every list.
pub fn check_limit(limit: Option<u32>) -> Result<(), Violation> {
    match limit {
        Some(l) => rules::PAGE_LIMIT.check("limit", l.into()),
        None => Ok(()),
    }
}

/// One page of `items` (fetched with one more than `limit` to know whether another follows).
pub fn page<T, F: Fn(&T) -> String>(mut items: Vec<T>, limit: u32, cursor_of: F) -> Page<T> {
    let next_cursor = (items.len() > limit as usize).then(|| {
        items.truncate(limit as usize);
        items.last().map(&cursor_of).unwrap_or_default()
    });
    Page { items, next_cursor }
}
