//! The reasons a workload shows: why it waits, why it was refused, why it ended.
//!
//! A [`Reason`] is a [`ReasonCode`] — a closed set the API's problem `type`, the CLI, metric
//! labels and event codes are derived from — with the sentence rendered from the typed value
//! (the scheduler's [`Wait`], [`Refusal`], [`PreemptCause`], or a backend failure) when it was
//! decided. The sentence is for people; code only ever looks at the code.

use std::fmt;

use tessera_sched::reason::{Class, PreemptCause, Refusal, Unplaceable, Wait};

/// Every reason Tessera gives, as a stable code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReasonCode {
    /// Not enough free capacity where the request may go.
    NoCapacity,
    /// Enough free capacity in total, not in one place.
    Fragmentation,
    /// It would fit only next to another tenant.
    Isolation,
    /// It fits only where capacity is held for a long-waiting request.
    Held,
    /// No node could ever hold it.
    Constraint,
    /// Over a quota limit.
    Quota,
    /// Over the monthly budget.
    Budget,
    /// Preempted recently; may not borrow yet.
    Backoff,
    /// Waiting for preempted workloads to stop.
    Preemption,
    /// Back in the queue after being preempted.
    Requeued,
    /// Not looked at by a scheduler cycle yet: the cycle's budget of jobs went to jobs ahead.
    NotConsidered,
    /// Cancelled by a person or token.
    Cancelled,
    /// Preempted by higher-priority work.
    PreemptedPriority,
    /// Preempted to give a tenant its guaranteed share back.
    PreemptedReclaim,
    /// The backend could not create the partition.
    PartitionFailed,
    /// The backend could not start it.
    StartFailed,
    /// It exited with a failure.
    ExitFailure,
    /// The backend lost it (node gone, evicted, unknown after a restart).
    Lost,
    /// The stored request or allocation no longer fits the fleet description.
    Invalid,
    /// A GPU it runs on became unhealthy (a critical XID, lost, or a failed partition).
    GpuUnhealthy,
    /// Its node is drained: moved elsewhere, or stopped after the drain deadline.
    NodeDrain,
    /// Moved by consolidation so that a waiting request fits.
    Consolidation,
    /// The image is not from a registry the tenant's image policy allows.
    ImageRegistryNotAllowed,
    /// The tenant's image policy requires a cosign signature and the image has none.
    ImageSignatureMissing,
    /// The image's signatures do not verify with the tenant's keys for its digest.
    ImageSignatureInvalid,
    /// A reason recorded before reasons had codes.
    Unknown,
}

impl ReasonCode {
    pub const ALL: [ReasonCode; 26] = [
        ReasonCode::NoCapacity,
        ReasonCode::Fragmentation,
        ReasonCode::Isolation,
        ReasonCode::Held,
        ReasonCode::Constraint,
        ReasonCode::Quota,
        ReasonCode::Budget,
        ReasonCode::Backoff,
        ReasonCode::Preemption,
        ReasonCode::Requeued,
        ReasonCode::NotConsidered,
        ReasonCode::Cancelled,
        ReasonCode::PreemptedPriority,
        ReasonCode::PreemptedReclaim,
        ReasonCode::PartitionFailed,
        ReasonCode::StartFailed,
        ReasonCode::ExitFailure,
        ReasonCode::Lost,
        ReasonCode::Invalid,
        ReasonCode::GpuUnhealthy,
        ReasonCode::NodeDrain,
        ReasonCode::Consolidation,
        ReasonCode::ImageRegistryNotAllowed,
        ReasonCode::ImageSignatureMissing,
        ReasonCode::ImageSignatureInvalid,
        ReasonCode::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReasonCode::NoCapacity => "no-capacity",
            ReasonCode::Fragmentation => "fragmentation",
            ReasonCode::Isolation => "isolation",
            ReasonCode::Held => "held",
            ReasonCode::Constraint => "constraint",
            ReasonCode::Quota => "quota",
            ReasonCode::Budget => "budget",
            ReasonCode::Backoff => "backoff",
            ReasonCode::Preemption => "preemption",
            ReasonCode::Requeued => "requeued",
            ReasonCode::NotConsidered => "not-considered",
            ReasonCode::Cancelled => "cancelled",
            ReasonCode::PreemptedPriority => "preempted-priority",
            ReasonCode::PreemptedReclaim => "preempted-reclaim",
            ReasonCode::PartitionFailed => "partition-failed",
            ReasonCode::StartFailed => "start-failed",
            ReasonCode::ExitFailure => "exit-failure",
            ReasonCode::Lost => "lost",
            ReasonCode::Invalid => "invalid",
            ReasonCode::GpuUnhealthy => "gpu-unhealthy",
            ReasonCode::NodeDrain => "node-drain",
            ReasonCode::Consolidation => "consolidation",
            ReasonCode::ImageRegistryNotAllowed => "image-registry-not-allowed",
            ReasonCode::ImageSignatureMissing => "image-signature-missing",
            ReasonCode::ImageSignatureInvalid => "image-signature-invalid",
            ReasonCode::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> Option<ReasonCode> {
        ReasonCode::ALL.into_iter().find(|c| c.as_str() == s)
    }

    fn of_class(c: Class) -> ReasonCode {
        match c {
            Class::NoCapacity => ReasonCode::NoCapacity,
            Class::Fragmentation => ReasonCode::Fragmentation,
            Class::Constraint => ReasonCode::Constraint,
            Class::Isolation => ReasonCode::Isolation,
        }
    }
}

impl fmt::Display for ReasonCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A reason: its code and the sentence rendered from the typed value it came from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Reason {
    pub code: ReasonCode,
    pub detail: String,
}

impl Reason {
    pub fn new(code: ReasonCode, detail: impl Into<String>) -> Self {
        Reason {
            code,
            detail: detail.into(),
        }
    }

    /// Why a queued request waits.
    pub fn waiting(w: &Wait) -> Self {
        Reason::new(Self::wait_code(w), w.to_string())
    }

    /// The code of a wait: that of why it waits now.
    fn wait_code(w: &Wait) -> ReasonCode {
        match w {
            Wait::Unplaceable(u) => ReasonCode::of_class(u.class()),
            Wait::Gang(u) => ReasonCode::of_class(u.class()),
            Wait::GangHeld { now, .. } => Self::wait_code(now),
            Wait::Held => ReasonCode::Held,
            Wait::Limit(_) => ReasonCode::Quota,
            Wait::Budget(_) => ReasonCode::Budget,
            Wait::Backoff { .. } => ReasonCode::Backoff,
            Wait::Preempting { .. } => ReasonCode::Preemption,
            Wait::PreemptsIn { now, .. } => Self::wait_code(now),
            Wait::NotConsidered { .. } => ReasonCode::NotConsidered,
        }
    }

    /// Why a request was refused for good.
    pub fn refused(r: &Refusal) -> Self {
        Reason::new(Self::refusal_code(r), r.to_string())
    }

    /// The code of a refusal.
    pub fn refusal_code(r: &Refusal) -> ReasonCode {
        match r {
            Refusal::Constraint(u) => ReasonCode::of_class(u.class()),
            Refusal::Gang(u) => ReasonCode::of_class(u.class()),
            Refusal::Limit(_) => ReasonCode::Quota,
            Refusal::Budget(_) => ReasonCode::Budget,
        }
    }

    /// Why a request can never be placed.
    pub fn unplaceable(u: &Unplaceable) -> Self {
        Reason::new(ReasonCode::of_class(u.class()), u.to_string())
    }

    /// The code of a preemption.
    pub fn preemption_code(c: &PreemptCause) -> ReasonCode {
        match c {
            PreemptCause::Priority { .. } => ReasonCode::PreemptedPriority,
            PreemptCause::Reclaim { .. } => ReasonCode::PreemptedReclaim,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for c in ReasonCode::ALL {
            assert_eq!(ReasonCode::parse(c.as_str()), Some(c));
            assert!(seen.insert(c.as_str()));
        }
        assert_eq!(ReasonCode::parse("nonsense"), None);
    }

    #[test]
    fn scheduler_values_keep_their_sentence_and_get_a_code() {
        let w = Wait::Backoff {
            times: 2,
            retry_in_s: 30,
        };
        let r = Reason::waiting(&w);
        assert_eq!(r.code, ReasonCode::Backoff);
        assert_eq!(r.detail, w.to_string());
        let c = PreemptCause::Reclaim {
            by: 7,
            tenant: "vision".into(),
        };
        assert_eq!(Reason::preemption_code(&c), ReasonCode::PreemptedReclaim);
    }
}
