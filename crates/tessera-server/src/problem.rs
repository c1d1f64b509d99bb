//! RFC 7807 problem responses.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tessera_api::Problem;

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
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        // Unavailable is temporary (the database, an election): say when to come back.
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
