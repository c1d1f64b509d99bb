//! Declarations (`POST /api/v1/apply`, `tessera apply -f`): tenants, their projects, quotas,
//! budgets, image policies and priority grants, made to match a file **whole or not at all**.
//! The whole declaration is checked first — its own rules (names, duplicates), then against the
//! server (known pools, models and priority classes, the projects a `project:` quota names,
//! image policies' prefixes and keys) — and the difference from what the store holds is applied
//! in one store transaction ([`tessera_store::TenancyStore::apply_tenancy`]) with one audit
//! record per tenant changed. A dry run answers the same checks and the same list of changes,
//! changing nothing.

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tessera_api::rules::{Validate, Violation};
use tessera_api::{ApplyResult, Declaration, DeclaredTenant, Problem};
use tessera_model::GpuUnits;
use tessera_sched::cycle::Quota;
use tessera_store::{AuditRecord, ImagePolicyRecord, ProjectRecord, QuotaRecord, TenancyChange, TenantRecord};
use utoipa::IntoParams;

use super::imagepolicy::check_policy;
use super::workloads::lifecycle_error;
use super::{ApiJson, ApiQuery};
use crate::audit::{Audited, RequestId};
use crate::auth::PlatformAdmin;
use crate::clock::now_ms;
use crate::lifecycle::Governance;
use crate::problem::{ApiError, ApiResult};
use crate::services::governance::{check_class, units_milli};
use crate::services::tenancy::{check_grant, granted};
use crate::state::AppState;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ApplyParams {
    /// Check the declaration and list what would change, changing nothing.
    #[serde(default)]
    pub dry_run: bool,
}

impl Validate for ApplyParams {
    fn validate(&self) -> Result<(), Violation> {
        Ok(())
    }
}

/// The changes one declared tenant needs: lines for people, changes for the store.
#[derive(Default)]
struct Plan {
    lines: Vec<String>,
    changes: Vec<TenancyChange>,
}

fn lim(l: Option<u64>) -> String {
    l.map(|v| GpuUnits(v).as_f64().to_string())
        .unwrap_or_else(|| "none".into())
}

fn hours(h: Option<f64>) -> String {
    h.map(|b| format!("{b} GPU-unit-hours"))
        .unwrap_or_else(|| "none".into())
}

/// Checks tenant `i` of the declaration against the server and the store, and plans what it
/// changes.
async fn plan_tenant(s: &AppState, i: usize, t: &DeclaredTenant, at: i64, out: &mut Plan) -> ApiResult<()> {
    let here = |f: &str| format!("tenants[{i}].{f}");
    let retag = |f: String| {
        move |mut e: ApiError| {
            e.field = Some(f.clone());
            e
        }
    };
    if let Some(p) = &t.priorities {
        check_grant(s, &here("priorities"), p)?;
    }
    let existing = s.store.get_tenant(&t.name).await?;
    // Projects, as the store has them and as the tenant will have them.
    let have_projects: Vec<String> = match &existing {
        Some(_) => s
            .store
            .list_projects(&t.name, None, u32::MAX)
            .await?
            .into_iter()
            .map(|p| p.name)
            .collect(),
        None => Vec::new(),
    };
    let mut quotas = Vec::new();
    for (class, q) in &t.quotas {
        let field = here(&format!("quotas.{class}"));
        check_class(s, class).map_err(retag(field.clone()))?;
        if let Some(project) = class.strip_prefix("project:")
            && !t.projects.iter().chain(&have_projects).any(|p| p == project)
        {
            return Err(ApiError::invalid(
                field,
                format!(
                    "tenant `{}` has no project `{project}`: declare it under `projects`",
                    t.name
                ),
            ));
        }
        let g = units_milli(&format!("{field}.guaranteed"), q.guaranteed)?;
        let l = q.limit.map(|l| units_milli(&format!("{field}.limit"), l)).transpose()?;
        quotas.push(QuotaRecord {
            tenant: t.name.clone(),
            class: class.clone(),
            guaranteed_milli: g,
            limit_milli: l,
        });
    }
    if let Some(p) = &t.image_policy {
        check_policy(p, &here("image_policy."))?;
    }

    match &existing {
        None => {
            out.lines.push(match &t.priorities {
                Some(p) => format!("+ tenant {} (priority classes {})", t.name, p.join(", ")),
                None => format!("+ tenant {}", t.name),
            });
            out.changes.push(TenancyChange::CreateTenant(TenantRecord {
                name: t.name.clone(),
                display_name: t.display_name.clone().unwrap_or_else(|| t.name.clone()),
                created_at: at,
                priorities: t.priorities.clone(),
            }));
        }
        Some(have) => {
            if let Some(want) = &t.priorities {
                let now = granted(s, have);
                if &now != want {
                    out.lines.push(format!(
                        "~ priorities {}: {} → {}",
                        t.name,
                        now.join(", "),
                        want.join(", ")
                    ));
                    out.changes.push(TenancyChange::SetPriorities {
                        tenant: t.name.clone(),
                        classes: Some(want.clone()),
                    });
                }
            }
        }
    }
    for p in &t.projects {
        if !have_projects.contains(p) {
            out.lines.push(format!("+ project {}/{p}", t.name));
            out.changes.push(TenancyChange::CreateProject(ProjectRecord {
                tenant: t.name.clone(),
                name: p.clone(),
                created_at: at,
            }));
        }
    }
    let current: Vec<QuotaRecord> = if existing.is_some() {
        s.store
            .quotas()
            .await?
            .into_iter()
            .filter(|q| q.tenant == t.name)
            .collect()
    } else {
        Vec::new()
    };
    for q in quotas {
        let now = current.iter().find(|x| x.class == q.class);
        if now.is_some_and(|n| n == &q) {
            continue;
        }
        let g = |m: u64| GpuUnits(m).as_f64();
        out.lines.push(match now {
            Some(n) => format!(
                "~ quota {}/{}: guaranteed {} → {}, limit {} → {}",
                t.name,
                q.class,
                g(n.guaranteed_milli),
                g(q.guaranteed_milli),
                lim(n.limit_milli),
                lim(q.limit_milli)
            ),
            None => format!(
                "+ quota {}/{}: guaranteed {}, limit {}",
                t.name,
                q.class,
                g(q.guaranteed_milli),
                lim(q.limit_milli)
            ),
        });
        out.changes.push(TenancyChange::SetQuota { quota: q, at });
    }
    for q in &current {
        if !t.quotas.contains_key(&q.class) {
            out.lines.push(format!("- quota {}/{}", t.name, q.class));
            out.changes.push(TenancyChange::DeleteQuota {
                tenant: t.name.clone(),
                class: q.class.clone(),
            });
        }
    }
    let have_budget = if existing.is_some() {
        s.store
            .budgets()
            .await?
            .into_iter()
            .find(|(n, _)| n == &t.name)
            .map(|(_, b)| b)
    } else {
        None
    };
    if have_budget != t.monthly_gpu_hours {
        out.lines.push(format!(
            "~ budget {}: {} → {}",
            t.name,
            hours(have_budget),
            hours(t.monthly_gpu_hours)
        ));
        out.changes.push(TenancyChange::SetBudget {
            tenant: t.name.clone(),
            unit_hours: t.monthly_gpu_hours,
            at,
        });
    }
    if let Some(want) = &t.image_policy {
        let have = match &existing {
            Some(_) => s.store.image_policy(&t.name).await?,
            None => None,
        };
        let keys = |k: &[String]| k.iter().map(|k| k.trim().to_string()).collect::<Vec<_>>();
        let same = have
            .as_ref()
            .is_some_and(|h| h.registries == want.registries && keys(&h.cosign_keys) == keys(&want.cosign_keys));
        if !same {
            let describe = |r: &[String], k: usize| {
                format!(
                    "registries [{}], {k} cosign key(s)",
                    if r.is_empty() { "any".to_string() } else { r.join(", ") }
                )
            };
            let wanted = describe(&want.registries, want.cosign_keys.len());
            out.lines.push(match &have {
                Some(h) => format!(
                    "~ image policy {}: {} → {wanted}",
                    t.name,
                    describe(&h.registries, h.cosign_keys.len())
                ),
                None => format!("+ image policy {}: {wanted}", t.name),
            });
            out.changes.push(TenancyChange::SetImagePolicy(ImagePolicyRecord {
                tenant: t.name.clone(),
                registries: want.registries.clone(),
                cosign_keys: want.cosign_keys.clone(),
                updated_at: at,
            }));
        }
    }
    Ok(())
}

/// Makes tenants, their projects, quotas, budgets, image policies and priority grants match a
/// declaration (platform-admin), whole or not at all: every tenant is checked before anything
/// changes, and the changes commit in one transaction with their audit records. Quotas of a
/// declared tenant that it does not list are removed, as is its budget when it gives none;
/// projects are only added; an image policy or grant it does not give is left as it is.
/// `dry_run=true` answers the same checks and changes, and changes nothing.
#[utoipa::path(post, path = "/api/v1/apply", tag = "governance", params(ApplyParams), request_body = Declaration,
    responses((status = 200, description = "What changed (or, for a dry run, would change)", body = ApplyResult),
        (status = 403, body = Problem),
        (status = 409, description = "Something the declaration creates was created meanwhile; nothing changed", body = Problem),
        (status = 422, description = "A tenant declared twice, a project twice, an unknown pool, model, priority class or project, a bad quota, budget or policy (the field names the entry, such as `tenants[2].name`); nothing changed", body = Problem)))]
pub async fn apply(
    State(s): State<AppState>,
    PlatformAdmin(id): PlatformAdmin,
    rid: Option<Extension<RequestId>>,
    ApiQuery(q): ApiQuery<ApplyParams>,
    ApiJson(d): ApiJson<Declaration>,
) -> ApiResult<Response> {
    let at = now_ms();
    let mut plans = Vec::with_capacity(d.tenants.len());
    for (i, t) in d.tenants.iter().enumerate() {
        let mut p = Plan::default();
        plan_tenant(&s, i, t, at, &mut p).await?;
        plans.push((t, p));
    }
    let changes: Vec<String> = plans.iter().flat_map(|(_, p)| p.lines.iter().cloned()).collect();
    if q.dry_run || changes.is_empty() {
        return Ok(Json(ApplyResult {
            changes,
            applied: false,
        })
        .into_response());
    }
    let request_id = rid.map(|Extension(r)| r.0).unwrap_or_default();
    let audit: Vec<AuditRecord> = plans
        .iter()
        .filter(|(_, p)| !p.lines.is_empty())
        .map(|(t, p)| AuditRecord {
            seq: 0,
            at,
            request_id: request_id.clone(),
            actor: id.actor.clone(),
            tenant: Some(t.name.clone()),
            action: "POST /api/v1/apply".into(),
            target: "/api/v1/apply".into(),
            outcome: StatusCode::OK.as_u16(),
            detail: p.lines.join("; "),
        })
        .collect();
    let all: Vec<TenancyChange> = plans.into_iter().flat_map(|(_, p)| p.changes).collect();
    s.store.apply_tenancy(&all, &audit).await?;
    // The scheduler learns the new quotas and budgets; the backend the new projects.
    for ch in &all {
        let g = match ch {
            TenancyChange::SetQuota { quota, .. } => Governance::Quota {
                tenant: quota.tenant.clone(),
                class: quota.class.clone(),
                quota: Some(Quota {
                    guaranteed: GpuUnits(quota.guaranteed_milli),
                    limit: quota.limit_milli.map(GpuUnits),
                }),
            },
            TenancyChange::DeleteQuota { tenant, class } => Governance::Quota {
                tenant: tenant.clone(),
                class: class.clone(),
                quota: None,
            },
            TenancyChange::SetBudget { tenant, unit_hours, .. } => Governance::Budget {
                tenant: tenant.clone(),
                unit_hours: *unit_hours,
            },
            _ => continue,
        };
        s.lifecycle.govern(g).await.map_err(lifecycle_error)?;
    }
    if all.iter().any(|c| matches!(c, TenancyChange::CreateProject(_))) {
        s.tenancy.notify_one();
    }
    tracing::info!(changes = changes.len(), actor = %id.actor, "declaration applied");
    let mut r = Json(ApplyResult { changes, applied: true }).into_response();
    r.extensions_mut().insert(Audited);
    Ok(r)
}
