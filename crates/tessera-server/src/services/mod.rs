//! The operations the API and the console share: one function per operation (create a
//! tenant, set a quota, create or cancel a workload, cordon a node, …) that checks who may do
//! it, checks the input against the rules, and does it. The HTTP handlers ([`crate::http`])
//! and the console's pages ([`crate::console`]) are thin callers of these; neither calls the
//! other.

pub mod governance;
pub mod nodes;
pub mod tenancy;
pub mod tokens;
pub mod workloads;

use crate::lifecycle::LifecycleError;
use crate::problem::ApiError;

/// A lifecycle refusal as a problem document: the problem type is the reason's code.
pub fn lifecycle_error(e: LifecycleError) -> ApiError {
    match e {
        LifecycleError::Refused { reason, field, message } => match field {
            Some(f) => ApiError::invalid(f, message).with_kind(reason.code.as_str()),
            None => ApiError::refused(reason.code.as_str(), reason.detail),
        },
        LifecycleError::IdempotencyMismatch { .. } => ApiError::invalid("Idempotency-Key", e.to_string()),
        LifecycleError::Ended { .. } => ApiError::conflict(e.to_string()),
        LifecycleError::NotFound { .. } => ApiError::not_found(e.to_string()),
        LifecycleError::Unavailable(why) => ApiError::unavailable(why),
        LifecycleError::Conflict(why) => ApiError::conflict(why),
        LifecycleError::Mig(r, why) if r.is_state() => ApiError::conflict(why).with_kind(r.code()),
        LifecycleError::Mig(r, why) => ApiError::unprocessable(r.code(), why),
    }
}
