//! RFC 7807 problem responses: every error the server sends is one, with the content type
//! `application/problem+json` (the OpenAPI document says so for every operation).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tessera_api::Problem;
use tessera_api::rules::Violation;

/// The content type of every error response.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Largest accepted request body (a larger one is answered 413 naming this limit).
pub const BODY_LIMIT: usize = 64 * 1024;

/// An API error, rendered as `application/problem+json`.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub title: &'static str,
    pub detail: String,
    pub field: Option<String>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, title: &'static str, detail: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            title,
            detail: detail.into(),
            field: None,
        }
    }

    /// 422: a field of the request is invalid.
    pub fn invalid(field: impl Into<String>, detail: impl Into<String>) -> Self {
        let mut e = Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation",
            "Invalid request",
            detail,
        );
        e.field = Some(field.into());
        e
    }

    /// 422 for a well-formed request the target can never satisfy (no field at fault); `kind`
    /// is the reason's code.
    pub fn unprocessable(kind: &'static str, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, kind, "Cannot be done here", detail)
    }

    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "malformed", "Malformed request", detail)
    }

    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not-found", "Not found", detail)
    }

    pub fn conflict(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", "Conflict", detail)
    }

    /// 403: refused by a quota limit (`quota`) or a budget (`budget`); `kind` is the reason's
    /// code.
    pub fn refused(kind: &'static str, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, kind, "Refused by quota or budget", detail)
    }

    /// 403: the tenant's image policy refuses the workload's image (`kind`: its reason code).
    pub fn refused_by_image_policy(kind: &'static str, detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            kind,
            "Refused by the tenant's image policy",
            detail,
        )
    }

    /// 403: the workload asks for a priority class its tenant was not granted (the detail
    /// names those it was).
    pub fn priority_not_granted(detail: impl Into<String>) -> Self {
        let mut e = Self::new(
            StatusCode::FORBIDDEN,
            "priority-not-granted",
            "Priority class not granted",
            detail,
        );
        e.field = Some("priority".into());
        e
    }

    /// The same problem with another type (a reason code).
    pub fn with_kind(mut self, kind: &'static str) -> Self {
        self.kind = kind;
        self
    }

    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", "Unauthorized", detail)
    }

    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", "Forbidden", detail)
    }

    pub fn too_large(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too-large",
            "Request body too large",
            detail,
        )
    }

    pub fn unsupported_media(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "media-type",
            "Unsupported media type",
            detail,
        )
    }

    /// 429: a rate limit.
    pub fn too_many(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate-limited",
            "Too many requests",
            detail,
        )
    }

    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "Service unavailable",
            detail,
        )
    }

    pub fn internal(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "Internal error", detail)
    }

    /// 405: the path exists, the method does not (the `Allow` header lists those that do).
    pub fn method_not_allowed(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method-not-allowed",
            "Method not allowed",
            detail,
        )
    }

    /// The problem for an error answered by a layer below the handlers (routing, body limit,
    /// CORS), which knows only the status.
    pub fn from_status(status: StatusCode) -> Self {
        match status {
            StatusCode::METHOD_NOT_ALLOWED => {
                Self::method_not_allowed("this path does not take that method; see the `Allow` header")
            }
            StatusCode::PAYLOAD_TOO_LARGE => {
                Self::too_large(format!("the body is larger than the {} KiB limit", BODY_LIMIT / 1024))
            }
            StatusCode::NOT_FOUND => Self::not_found("no such resource"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE => {
                Self::unsupported_media("send the body as JSON with `Content-Type: application/json`")
            }
            s if s.is_server_error() => Self::new(s, "unavailable", "Service unavailable", "retry shortly"),
            s => Self::new(
                s,
                "malformed",
                "Malformed request",
                s.canonical_reason().unwrap_or("the request was refused"),
            ),
        }
    }

    pub fn to_problem(&self, instance: Option<String>) -> Problem {
        Problem {
            kind: format!("https://tessera.dev/problems/{}", self.kind),
            title: self.title.to_string(),
            status: self.status.as_u16(),
            detail: self.detail.clone(),
            instance,
            field: self.field.clone(),
        }
    }
}

impl From<Violation> for ApiError {
    fn from(v: Violation) -> Self {
        ApiError::invalid(v.field, v.message)
    }
}

/// Makes any error response that is not a problem document yet (axum's 405, the body limit's
/// 413) into one, keeping its status and headers (`Allow`, `Retry-After`).
pub async fn ensure_problem(response: Response) -> Response {
    let status = response.status();
    // The console's pages answer some errors with a page of their own (a form with the
    // message next to its field): those are kept.
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == PROBLEM_JSON.as_bytes() || v.as_bytes().starts_with(b"text/html"));
    if !(status.is_client_error() || status.is_server_error()) || is_problem {
        return response;
    }
    let (mut parts, _) = response.into_parts();
    let mut fresh = ApiError::from_status(status).into_response();
    parts.headers.remove(header::CONTENT_LENGTH);
    for (name, value) in fresh.headers() {
        parts.headers.insert(name.clone(), value.clone());
    }
    std::mem::swap(fresh.headers_mut(), &mut parts.headers);
    fresh
}

impl From<tessera_store::StoreError> for ApiError {
    fn from(e: tessera_store::StoreError) -> Self {
        match e {
            tessera_store::StoreError::Conflict(what) => ApiError::conflict(format!("{what} already exists")),
            tessera_store::StoreError::Fenced(_) => {
                ApiError::unavailable("this replica lost the leadership; retry shortly")
            }
            other => {
                tracing::error!(error = %other, "store error");
                ApiError::unavailable("the store is unavailable; retry shortly")
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.to_problem(None)).unwrap_or_default();
        let mut r = (self.status, body).into_response();
        r.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        // Unavailable is temporary (the database, an election): say when to come back.
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
