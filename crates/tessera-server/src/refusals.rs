//! Requests refused at submission: a quota limit or budget with `no_wait`, the tenant's image
//! policy, or a shape no node can ever hold. Such a request is never stored as a workload, so
//! the console's queue view ("recent refusals") reads them from this bounded ring in memory:
//! the newest [`KEPT`] of this replica since it started (a follower forwards writes to the
//! leader, so the leader's ring holds them). Authorisation failures are not refusals and are
//! not kept.

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::problem::ApiError;

/// How many refusals are kept.
pub const KEPT: usize = 200;

/// One refused request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Milliseconds since the Unix epoch.
    pub at: i64,
    pub tenant: String,
    pub project: String,
    pub name: String,
    pub actor: String,
    /// The problem type's code (`quota`, `budget`, `constraint`, `image-…`).
    pub code: &'static str,
    /// The sentence the caller got.
    pub detail: String,
}

/// The ring of recent refusals.
#[derive(Debug, Default)]
pub struct Refusals {
    ring: Mutex<VecDeque<Refusal>>,
}

impl Refusals {
    /// Whether an answer to a submission is a refusal worth keeping: refused by quota, budget or
    /// image policy (403 with a reason code), or a shape no node can hold (422 `constraint`).
    pub fn is_refusal(e: &ApiError) -> bool {
        (e.status == axum::http::StatusCode::FORBIDDEN && e.kind != "forbidden")
            || (e.status == axum::http::StatusCode::UNPROCESSABLE_ENTITY && e.kind == "constraint")
    }

    /// Keeps `r`, dropping the oldest beyond [`KEPT`].
    pub fn record(&self, r: Refusal) {
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        if ring.len() == KEPT {
            ring.pop_front();
        }
        ring.push_back(r);
    }

    /// The newest first, at most `n`, of `tenant` (all with `None`).
    pub fn recent(&self, tenant: Option<&str>, n: usize) -> Vec<Refusal> {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        ring.iter()
            .rev()
            .filter(|r| tenant.is_none_or(|t| r.tenant == t))
            .take(n)
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(i: usize, tenant: &str) -> Refusal {
        Refusal {
            at: i as i64,
            tenant: tenant.into(),
            project: "p".into(),
            name: format!("w{i}"),
            actor: "token:1".into(),
            code: "quota",
            detail: "over".into(),
        }
    }

    #[test]
    fn the_ring_keeps_the_newest_and_filters_by_tenant() {
        let r = Refusals::default();
        for i in 0..KEPT + 5 {
            r.record(refusal(i, if i % 2 == 0 { "vision" } else { "nlp" }));
        }
        let all = r.recent(None, usize::MAX);
        assert_eq!(all.len(), KEPT);
        assert_eq!(all[0].at, (KEPT + 4) as i64, "newest first");
        assert_eq!(all[KEPT - 1].at, 5, "the oldest five were dropped");
        let nlp = r.recent(Some("nlp"), 3);
        assert_eq!(nlp.iter().map(|x| x.at).collect::<Vec<_>>(), [203, 201, 199]);
    }

    #[test]
    fn only_refusals_by_reason_are_kept_not_authorisation_failures() {
        assert!(Refusals::is_refusal(&ApiError::refused("quota", "over")));
        assert!(Refusals::is_refusal(&ApiError::unprocessable("constraint", "never")));
        assert!(!Refusals::is_refusal(&ApiError::forbidden("a viewer token")));
        assert!(!Refusals::is_refusal(&ApiError::invalid("name", "empty")));
    }
}
