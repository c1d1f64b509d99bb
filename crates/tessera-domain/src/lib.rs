//! # tessera-domain
//!
//! Tessera's workload domain model and its pure lifecycle. No I/O, no clock, no randomness:
//!
//! * [`workload`]: a workload — its request ([`WorkloadSpec`]), its [`Placement`], its
//!   [`Phase`] and the bookkeeping of its timeline and usage intervals. The store persists
//!   these records; the REST API shows views of them, converted at the edge.
//! * [`reason`]: [`Reason`] — a [`ReasonCode`] and the sentence rendered from the scheduler's
//!   typed value. Problem types, CLI lines, metric labels and event codes come from the code.
//! * [`event`]: the timeline's [`Step`]s and [`Event`]s.
//! * [`lifecycle`]: `transition(workload, input) -> (workload, events, effects)`, unit-tested
//!   for every phase and input and property-tested over random input streams.

pub mod event;
pub mod lifecycle;
pub mod reason;
pub mod workload;

pub use event::{Event, Step};
pub use lifecycle::{Effect, Input, Observed, Transition, transition, transition_shared};
pub use reason::{Reason, ReasonCode};
pub use workload::{
    GangSpec, GpuSpec, Kind, Movable, Phase, Placement, PreemptCode, ShapeSpec, Slice, StopCause, UsageCursor,
    Workload, WorkloadId, WorkloadSpec,
};
