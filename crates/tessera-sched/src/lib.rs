//! # tessera-sched
//!
//! Tessera's placement engine, pure and deterministic (seeded randomness only):
//!
//! * [`engine::Engine`]: places requests on a fleet snapshot (whole-GPU gangs, on-demand MIG,
//!   time-sliced fractions), explains refusals, releases capacity exactly. It follows the
//!   backend: MIG instances created one at a time or whole GPUs laid out at once
//!   ([`mig::MigMode`]), devices named exactly or picked by the backend and rebound
//!   ([`engine::DeviceBinding`]). Gangs beyond one node ([`Engine::plan_gang`]) go whole or
//!   not at all into the fewest racks of a whole pool.
//! * [`cycle`]: the scheduler cycle — quotas, budgets, priority classes, fair-share queue
//!   with bounded backfill, reclaim and preemption, as ordered actions over a session.
//! * [`reason`]: typed reasons (why a request cannot be placed, waits, is refused or preempts).
//! * [`mig`]: precomputed MIG flexibility tables that drive on-demand partitioning, and the
//!   MIG modes.
//! * [`policy`]: pluggable scoring for shared pools (random, bestfit, FGD) and
//!   [`tessera`]: Tessera's own fragmentation-aware policy.
//! * [`replay`]: the openb (Alibaba GPU trace) replay protocol, and [`bound`]: lower bounds on
//!   what any placement of the fractional shares leaves free, and on what any scheduler, or any
//!   that never refuses a pod that fits, leaves unallocated.
//! * [`scenario`]: a multi-tenant scenario in simulated time through the scheduler.
//! * [`plan`]: capacity planning — the cheapest candidate fleet whose timed replay of a demand
//!   meets a p95 wait target per class.
//! * [`timed`]: time-based replay of a demand (the openb trace's own times) through the
//!   scheduler cycle, with allocation over time, wait percentiles and refusals.
//!
//! * [`philly`]: the Philly trace replay protocol (racks of 8-GPU nodes, gangs in the fewest
//!   racks, tenant guarantees) with fifo, EASY backfill, topology-bestfit, quota-backfill and
//!   Tessera's policy side by side.
//! * [`bench`]: the scheduler-cycle benchmark (`tessera bench cycle`).
//!
//! The same engine serves the trace replay, the benchmarks and the server.

pub mod bench;
pub mod bound;
pub mod cycle;
pub mod engine;
pub mod mig;
pub mod philly;
pub mod plan;
pub mod policy;
pub mod reason;
pub mod replay;
pub mod rollout;
pub mod scenario;
pub mod state;
pub mod tessera;
pub mod timed;

pub use cycle::{Decision, GovernConfig, Job, Quota, Scheduler};
pub use engine::{Engine, GangAllocation, GangPlacement};
pub use policy::SharedPolicy;
pub use reason::{GangUnplaceable, Unplaceable};
pub use state::{AllocId, Allocation, ClusterState, Grant, Placement};
