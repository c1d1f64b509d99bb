//! Tenants' image policies: set, read and removed here (platform-admin, or the tenant's own
//! tenant-admin; the audit record commits with the change), and enforced at workload
//! admission ([`admit_image`]) before anything is created, through `tessera-imagepolicy`.

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tessera_api::{ImagePolicy, Problem, SetImagePolicy, rfc3339_ms};
use tessera_domain::ReasonCode;
use tessera_imagepolicy::{Denied, PublicKey, Refusal, reference::check_prefix};
use tessera_store::{AuditRecord, ImagePolicyRecord};

use super::{ApiJson, ApiPath};
use crate::audit::{Audited, RequestId};
use crate::auth::{Identity, Role};
use crate::clock::now_ms;
use crate::problem::{ApiError, ApiResult};
use crate::services::tenancy::tenant_visible;
use crate::state::AppState;

fn view(p: ImagePolicyRecord) -> ImagePolicy {
    ImagePolicy {
        tenant: p.tenant,
        registries: p.registries,
        cosign_keys: p.cosign_keys,
        updated_at: rfc3339_ms(p.updated_at),
    }
}

/// The policy as enforced: prefixes as stored, keys parsed.
fn compile(p: &ImagePolicyRecord) -> ApiResult<tessera_imagepolicy::ImagePolicy> {
    let keys = p
        .cosign_keys
        .iter()
        .map(|k| PublicKey::from_pem(k))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            ApiError::unavailable(format!(
                "tenant `{}`'s stored image policy is unreadable: {e}",
                p.tenant
            ))
        })?;
    Ok(tessera_imagepolicy::ImagePolicy {
        registries: p.registries.clone(),
        keys,
    })
}

/// Checks a policy's prefixes and keys as enforcement will read them (422 naming the entry,
/// its field after `at`).
pub(crate) fn check_policy(b: &SetImagePolicy, at: &str) -> ApiResult<()> {
    for (i, p) in b.registries.iter().enumerate() {
        check_prefix(p).map_err(|e| ApiError::invalid(format!("{at}registries[{i}]"), e))?;
    }
    for (i, k) in b.cosign_keys.iter().enumerate() {
        PublicKey::from_pem(k).map_err(|e| ApiError::invalid(format!("{at}cosign_keys[{i}]"), e))?;
    }
    Ok(())
}

fn require_policy_admin(id: &Identity, tenant: &str) -> ApiResult<()> {
    if id.is_admin() || (id.role == Role::TenantAdmin && id.tenant.as_deref() == Some(tenant)) {
        Ok(())
    } else {
        Err(ApiError::forbidden(
            "setting an image policy needs a platform-admin token or the tenant's tenant-admin",
        ))
    }
}

fn audit_record(
    id: &Identity,
    rid: Option<Extension<RequestId>>,
    method: &str,
    tenant: &str,
    outcome: StatusCode,
) -> AuditRecord {
    AuditRecord {
        seq: 0,
        at: now_ms(),
        request_id: rid.map(|Extension(r)| r.0).unwrap_or_default(),
        actor: id.actor.clone(),
        tenant: Some(tenant.to_string()),
        action: format!("{method} /api/v1/tenants/{{tenant}}/image-policy"),
        target: format!("/api/v1/tenants/{tenant}/image-policy"),
        outcome: outcome.as_u16(),
        detail: String::new(),
    }
}

/// A tenant's image policy.
#[utoipa::path(get, path = "/api/v1/tenants/{tenant}/image-policy", tag = "tenancy", params(("tenant" = String, Path)),
    responses((status = 200, body = ImagePolicy), (status = 404, description = "No such tenant, or it has no image policy", body = Problem)))]
pub async fn get_image_policy(
    State(s): State<AppState>,
    id: Identity,
    ApiPath(tenant): ApiPath<String>,
) -> ApiResult<Json<ImagePolicy>> {
    tenant_visible(&s, &id, &tenant).await?;
    let p = s.store.image_policy(&tenant).await?.ok_or_else(|| {
        ApiError::not_found(format!(
            "tenant `{tenant}` has no image policy: its workloads may run any image"
        ))
    })?;
    Ok(Json(view(p)))
}

/// Sets (replaces) a tenant's image policy (platform-admin, or the tenant's tenant-admin).
/// Applies to workloads created from now on that name an image (the kubernetes backend runs
/// images; `local` and `sim` run commands).
#[utoipa::path(put, path = "/api/v1/tenants/{tenant}/image-policy", tag = "tenancy", params(("tenant" = String, Path)),
    request_body = SetImagePolicy,
    responses((status = 200, body = ImagePolicy), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 422, description = "A prefix that does not start with a registry host, or a key that is not a PEM ECDSA P-256 public key (the field names the entry)", body = Problem)))]
pub async fn set_image_policy(
    State(s): State<AppState>,
    id: Identity,
    rid: Option<Extension<RequestId>>,
    ApiPath(tenant): ApiPath<String>,
    ApiJson(b): ApiJson<SetImagePolicy>,
) -> ApiResult<Response> {
    tenant_visible(&s, &id, &tenant).await?;
    require_policy_admin(&id, &tenant)?;
    check_policy(&b, "")?;
    let rec = ImagePolicyRecord {
        tenant: tenant.clone(),
        registries: b.registries,
        cosign_keys: b.cosign_keys,
        updated_at: now_ms(),
    };
    s.store
        .set_image_policy(&rec, &audit_record(&id, rid, "PUT", &tenant, StatusCode::OK))
        .await?;
    tracing::info!(%tenant, registries = ?rec.registries, keys = rec.cosign_keys.len(), actor = %id.actor, "image policy set");
    let mut r = Json(view(rec)).into_response();
    r.extensions_mut().insert(Audited);
    Ok(r)
}

/// Removes a tenant's image policy: its workloads may run any image again.
#[utoipa::path(delete, path = "/api/v1/tenants/{tenant}/image-policy", tag = "tenancy", params(("tenant" = String, Path)),
    responses((status = 204), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn delete_image_policy(
    State(s): State<AppState>,
    id: Identity,
    rid: Option<Extension<RequestId>>,
    ApiPath(tenant): ApiPath<String>,
) -> ApiResult<Response> {
    tenant_visible(&s, &id, &tenant).await?;
    require_policy_admin(&id, &tenant)?;
    let audit = audit_record(&id, rid, "DELETE", &tenant, StatusCode::NO_CONTENT);
    if !s.store.delete_image_policy(&tenant, &audit).await? {
        return Err(ApiError::not_found(format!("tenant `{tenant}` has no image policy")));
    }
    tracing::info!(%tenant, actor = %id.actor, "image policy removed");
    let mut r = StatusCode::NO_CONTENT.into_response();
    r.extensions_mut().insert(Audited);
    Ok(r)
}

fn reason_code(r: &Refusal) -> ReasonCode {
    match r {
        Refusal::RegistryNotAllowed { .. } => ReasonCode::ImageRegistryNotAllowed,
        Refusal::SignatureMissing { .. } => ReasonCode::ImageSignatureMissing,
        Refusal::SignatureInvalid { .. } => ReasonCode::ImageSignatureInvalid,
    }
}

/// Admission: the image a workload of `tenant` may run, under the tenant's image policy —
/// unchanged, or pinned to the digest whose signature was verified — or the refusal (403 with
/// the reason code as problem type; 422 `image` for a reference that cannot be parsed or a tag
/// the registry does not have; 503 when the registry cannot be asked).
pub(crate) async fn admit_image(s: &AppState, tenant: &str, image: Option<&str>) -> ApiResult<Option<String>> {
    let Some(image) = image else {
        return Ok(None);
    };
    let Some(rec) = s.store.image_policy(tenant).await? else {
        return Ok(Some(image.to_string()));
    };
    match compile(&rec)?.admit(image, &s.registry).await {
        Ok(admitted) => Ok(Some(admitted)),
        Err(Denied::Refused(r)) => {
            tracing::info!(%tenant, %image, code = reason_code(&r).as_str(), "image refused");
            Err(ApiError::refused_by_image_policy(
                reason_code(&r).as_str(),
                r.to_string(),
            ))
        }
        Err(Denied::BadImage(why)) => Err(ApiError::invalid("image", why)),
        Err(Denied::Unavailable(why)) => Err(ApiError::unavailable(format!(
            "cannot check the image against tenant `{tenant}`'s image policy: {why}"
        ))),
    }
}
