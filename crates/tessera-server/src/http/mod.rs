//! The REST API under `/api/v1`, one module per area: [`fleet`] (pools, nodes, GPUs),
//! [`tenancy`] (tenants and projects), [`tokens`] (API tokens), [`audit`] (the audit log),
//! [`workloads`], [`governance`] (quotas and budgets), [`usage`] (reports), [`system`]
//! (health) and, with the simulated backend only, [`sim`] (fault injection). Domain records
//! become REST views in one place, [`views`].
//!
//! Every route is registered through `utoipa-axum`'s `OpenApiRouter`, so the OpenAPI document
//! (`/api/v1/openapi.json`) lists exactly the routes the router serves.

pub mod audit;
pub mod fleet;
pub mod governance;
pub mod logs;
pub mod sim;
pub mod system;
pub mod tenancy;
pub mod tokens;
pub mod usage;
pub mod views;
pub mod workloads;

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tessera_api::Page;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoParams, Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;
use crate::problem::{ApiError, ApiResult};

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
        (name = "system", description = "Health and the API description"),
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
/// fault-injection route exists.
pub fn router(with_sim: bool) -> (axum::Router<AppState>, utoipa::openapi::OpenApi) {
    let mut r = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(system::health))
        .routes(routes!(fleet::list_pools))
        .routes(routes!(fleet::list_nodes))
        .routes(routes!(fleet::list_gpus))
        .routes(routes!(tenancy::list_tenants, tenancy::create_tenant))
        .routes(routes!(tenancy::get_tenant, tenancy::delete_tenant))
        .routes(routes!(tenancy::list_projects, tenancy::create_project))
        .routes(routes!(tenancy::get_project, tenancy::delete_project))
        .routes(routes!(tokens::list_tokens, tokens::create_token))
        .routes(routes!(tokens::revoke_token))
        .routes(routes!(audit::audit_log))
        .routes(routes!(workloads::list_workloads, workloads::create_workload))
        .routes(routes!(workloads::get_workload))
        .routes(routes!(workloads::cancel_workload))
        .routes(routes!(workloads::workload_events))
        .routes(routes!(logs::workload_logs))
        .routes(routes!(governance::get_quotas))
        .routes(routes!(governance::set_quota, governance::delete_quota))
        .routes(routes!(governance::set_budget))
        .routes(routes!(usage::usage_report));
    if with_sim {
        r = r.routes(routes!(sim::inject_fault));
    }
    let (router, mut doc) = r.split_for_parts();
    describe_responses(&mut doc);
    (router, doc)
}

/// OpenAPI 3.1 requires a `description` on every response: give those declared without one
/// the status code's reason phrase.
fn describe_responses(doc: &mut utoipa::openapi::OpenApi) {
    for item in doc.paths.paths.values_mut() {
        let ops = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.options,
            &mut item.head,
            &mut item.patch,
            &mut item.trace,
        ];
        for op in ops.into_iter().flatten() {
            for (code, r) in op.responses.responses.iter_mut() {
                if let utoipa::openapi::RefOr::T(r) = r
                    && r.description.is_empty()
                {
                    r.description = code
                        .parse::<u16>()
                        .ok()
                        .and_then(|c| StatusCode::from_u16(c).ok())
                        .and_then(|c| c.canonical_reason())
                        .unwrap_or("Response")
                        .to_string();
                }
            }
        }
    }
}

/// JSON body extractor whose rejections are problem documents naming what is wrong.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(ApiJson(v)),
            Err(JsonRejection::JsonDataError(e)) => {
                let text = e.body_text();
                // "Failed to deserialize the JSON body into the target type: shape.gpus: invalid type …"
                let detail = text
                    .split_once("target type: ")
                    .map(|(_, d)| d.to_string())
                    .unwrap_or(text);
                let field = detail
                    .split_once(": ")
                    .map(|(f, _)| f.to_string())
                    .filter(|f| !f.contains(' '));
                let field = field.or_else(|| {
                    detail
                        .split('`')
                        .nth(1)
                        .filter(|_| detail.contains("field"))
                        .map(str::to_string)
                });
                Err(ApiError::invalid(field.unwrap_or_else(|| "body".into()), detail))
            }
            Err(JsonRejection::JsonSyntaxError(e)) => Err(ApiError::bad_request(format!(
                "the body is not valid JSON: {}",
                e.body_text().rsplit(": ").next().unwrap_or_default()
            ))),
            Err(JsonRejection::MissingJsonContentType(_)) => Err(ApiError::unsupported_media(
                "send the body as JSON with `Content-Type: application/json`",
            )),
            Err(JsonRejection::BytesRejection(e)) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(ApiError::too_large(format!(
                    "the body is larger than the {} KiB limit",
                    crate::BODY_LIMIT / 1024
                )))
            }
            Err(e) => Err(ApiError::bad_request(e.body_text())),
        }
    }
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Items per page, 1–500 (default 100).
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// The page size asked for, checked.
pub fn limit(p: Option<u32>) -> ApiResult<u32> {
    match p {
        None => Ok(100),
        Some(l) if (1..=500).contains(&l) => Ok(l),
        Some(l) => Err(ApiError::invalid(
            "limit",
            format!("limit {l}: must be between 1 and 500"),
        )),
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

/// Checks a name: a lower-case slug.
pub fn check_slug(field: &str, v: &str) -> ApiResult<()> {
    let ok = !v.is_empty()
        && v.len() <= 40
        && v.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !v.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(
            field,
            format!("`{v}` is not a valid {field}: use 1–40 lower-case letters, digits and `-`"),
        ))
    }
}
