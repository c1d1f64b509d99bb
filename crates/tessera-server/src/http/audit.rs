//! Reading the audit log (the middleware in `crate::audit` writes it).

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use tessera_api::rules::{self, Validate, Violation};
use tessera_api::{AuditEntry, Page, rfc3339_ms};
use utoipa::IntoParams;

use super::{ApiQuery, DEFAULT_LIMIT, check_limit, page};
use crate::auth::Identity;
use crate::problem::ApiResult;
use crate::services::tokens::admin_scope;
use crate::state::AppState;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditParams {
    pub tenant: Option<String>,
    /// Records per page (default 100).
    #[param(schema_with = rules::schema::page_limit)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page (a sequence number).
    #[param(schema_with = rules::schema::cursor_id)]
    pub cursor: Option<u64>,
}

impl Validate for AuditParams {
    fn validate(&self) -> Result<(), Violation> {
        check_limit(self.limit)?;
        if let Some(c) = self.cursor {
            rules::ID.check_u64("cursor", c)?;
        }
        Ok(())
    }
}

/// The audit log, newest first (platform-admin: all; tenant-admin: its tenant).
#[utoipa::path(get, path = "/api/v1/audit", tag = "tenancy", params(AuditParams),
    responses((status = 200, body = Page<AuditEntry>)))]
pub async fn audit_log(
    State(s): State<AppState>,
    id: Identity,
    ApiQuery(q): ApiQuery<AuditParams>,
) -> ApiResult<Json<Page<AuditEntry>>> {
    let tenant = admin_scope(&id, &q.tenant, "the audit log")?;
    let l = q.limit.unwrap_or(DEFAULT_LIMIT);
    let rows = s.store.audit(tenant.as_deref(), q.cursor, l + 1).await?;
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
            detail: r.detail,
        })
        .collect();
    Ok(Json(page(items, l, |a| a.seq.to_string())))
}
