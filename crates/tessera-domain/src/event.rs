//! The timeline of a workload: one event per lifecycle step, in order.

use std::fmt;

use crate::reason::ReasonCode;

/// A step of the lifecycle — request → authorise → place → partition → run → observe → meter
/// → release — or one of the detours (queued, failed, cancelled, preempted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    Requested,
    Authorised,
    Queued,
    Placed,
    Partitioned,
    Running,
    Observed,
    Metered,
    Released,
    Failed,
    Cancelled,
    Preempted,
}

impl Step {
    pub const ALL: [Step; 12] = [
        Step::Requested,
        Step::Authorised,
        Step::Queued,
        Step::Placed,
        Step::Partitioned,
        Step::Running,
        Step::Observed,
        Step::Metered,
        Step::Released,
        Step::Failed,
        Step::Cancelled,
        Step::Preempted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Step::Requested => "requested",
            Step::Authorised => "authorised",
            Step::Queued => "queued",
            Step::Placed => "placed",
            Step::Partitioned => "partitioned",
            Step::Running => "running",
            Step::Observed => "observed",
            Step::Metered => "metered",
            Step::Released => "released",
            Step::Failed => "failed",
            Step::Cancelled => "cancelled",
            Step::Preempted => "preempted",
        }
    }

    pub fn parse(s: &str) -> Option<Step> {
        Step::ALL.into_iter().find(|x| x.as_str() == s)
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One event of a workload's timeline.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Event {
    /// Position in the workload's timeline, from 0.
    pub seq: u32,
    pub step: Step,
    /// Milliseconds since the Unix epoch.
    pub at: i64,
    /// What happened, for people.
    pub detail: String,
    /// The reason's code, when the step has one (queued, failed, cancelled, preempted).
    pub code: Option<ReasonCode>,
}
