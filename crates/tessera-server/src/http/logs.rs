//! Workload logs: what the backend captured of a workload's output, streamed as plain text
//! (backends with the `logs` capability; the simulated backend has none).

use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tessera_api::Problem;
use tessera_api::rules::{Validate, Violation};
use tessera_backend::BackendError;
use utoipa::IntoParams;

use super::{ApiQuery, WorkloadIdParams, WorkloadPath};
use crate::auth::Identity;
use crate::problem::{ApiError, ApiResult};
use crate::services::workloads::find as find_workload;
use crate::state::AppState;

/// Where to start and whether to keep following.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LogQuery {
    /// Byte offset to start from (default 0).
    #[serde(default)]
    #[param(minimum = 0, maximum = 9_223_372_036_854_775_807_i64)]
    pub offset: u64,
    /// Keep the response open and send new output until the workload ends.
    #[serde(default)]
    pub follow: bool,
}

// Any offset a file can have is valid (past the end reads nothing yet).
impl Validate for LogQuery {
    fn validate(&self) -> Result<(), Violation> {
        if self.offset > i64::MAX as u64 {
            return Err(Violation::new(
                "offset",
                format!("{}: at most {}", self.offset, i64::MAX),
            ));
        }
        Ok(())
    }
}

const CHUNK: usize = 64 * 1024;

/// The workload's captured stdout and stderr, as plain text.
#[utoipa::path(get, path = "/api/v1/workloads/{id}/logs", tag = "workloads",
    params(WorkloadIdParams, LogQuery),
    responses((status = 200, description = "the log, as text/plain", content_type = "text/plain", body = String),
        (status = 409, description = "The backend keeps no logs", body = Problem)))]
pub async fn workload_logs(
    State(s): State<AppState>,
    id: Identity,
    WorkloadPath(wid): WorkloadPath,
    ApiQuery(q): ApiQuery<LogQuery>,
) -> ApiResult<Response> {
    find_workload(&s, &id, wid).await?;
    if !s.backend.capabilities().logs {
        return Err(ApiError::conflict(format!(
            "the {} backend keeps no workload logs",
            s.backend_name
        )));
    }
    // The first read answers errors as problems; the rest streams.
    let first = s.backend.read_logs(wid.0, q.offset, CHUNK).await.map_err(|e| match e {
        BackendError::Rejected(m) => ApiError::not_found(m),
        BackendError::Unreachable(m) => ApiError::conflict(m),
    })?;
    let backend = s.backend.clone();
    let follow = q.follow;
    let stream = futures_util::stream::unfold(Some((Some(first), q.offset)), move |st| {
        let backend = backend.clone();
        async move {
            let (mut pending, mut off) = st?;
            loop {
                let c = match pending.take() {
                    Some(c) => c,
                    None => match backend.read_logs(wid.0, off, CHUNK).await {
                        Ok(c) => c,
                        Err(e) => return Some((Err(std::io::Error::other(e.to_string())), None)),
                    },
                };
                off = c.next_offset;
                if !c.bytes.is_empty() {
                    return Some((Ok::<_, std::io::Error>(c.bytes), Some((None, off))));
                }
                if c.done || !follow {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    });
    Ok((
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        Body::from_stream(stream),
    )
        .into_response())
}
