//! Reading the audit log (the middleware in `crate::audit` writes it).

use axum::Json;
use axum::extract::{Query, State};
use serde::Deserialize;
use tessera_api::{AuditEntry, Page, Problem, rfc3339_ms};
use utoipa::IntoParams;

use super::tokens::admin_scope;
use super::{limit, page};
use crate::AppState;
use crate::auth::Identity;
use crate::problem::{ApiError, ApiResult};

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditParams {
    pub tenant: Option<String>,
    pub limit: Option<u32>,
    pub cursor: Option<String>,
}

/// The audit log, newest first (platform-admin: all; tenant-admin: its tenant).
#[utoipa::path(get, path = "/api/v1/audit", tag = "tenancy", params(AuditParams),
    responses((status = 200, body = Page<AuditEntry>), (status = 403, body = Problem)))]
pub async fn audit_log(
    State(s): State<AppState>,
    id: Identity,
    Query(q): Query<AuditParams>,
) -> ApiResult<Json<Page<AuditEntry>>> {
    let tenant = admin_scope(&id, &q.tenant, "the audit log")?;
    let l = limit(q.limit)?;
    let before = match &q.cursor {
        Some(c) => Some(
            c.parse::<u64>()
                .map_err(|_| ApiError::invalid("cursor", "not a cursor from this API"))?,
        ),
        None => None,
    };
    let rows = s.store.audit(tenant.as_deref(), before, l + 1).await?;
    let items: Vec<AuditEntry> = rows
        .into_iter()
        .map(|r| AuditEntry {
            seq: r.seq,
            at: rfc3339_ms(r.at),
            request_id: r.request_id,
            actor: r.actor,
            tenant: r.tenant,
            action: r.action,
            target: r.target,
            outcome: r.outcome,
        })
        .collect();
    Ok(Json(page(items, l, |a| a.seq.to_string())))
}
