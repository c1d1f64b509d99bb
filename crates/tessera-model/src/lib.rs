//! # tessera-model
//!
//! The pure fleet model at the heart of Tessera. No I/O, no clocks, no randomness:
//!
//! * [`catalogue`]: every GPU model Tessera knows, with the exact MIG geometry of the
//!   MIG-capable ones (profile IDs, memory and SM slices, instance limits, legal placements),
//!   keyed by `(model, profile ID)`; display names such as `3g.40gb` are derived.
//! * [`layout`]: validity of a MIG layout on one GPU and exhaustive enumeration of layouts.
//! * [`fleet`]: pools, nodes and NVLink topology; the TOML fleet file, the built-in `seed`
//!   preset, synthetic fleets, and the openb (Alibaba trace) node list loader.
//! * [`levels`]: the network topology above the node — ordered levels (rack, block, …) and
//!   each node's domain at each level, from the fleet file or any per-node values (labels).
//! * [`request`]: what a workload asks for (whole GPUs, a MIG profile, a fraction; a gang of
//!   whole GPUs across nodes) and
//!   [`units::GpuUnits`], the one GPU unit used by quota, fair share and metering.
//!
//! Everything here is deterministic so that the scheduler built on it can be property-tested
//! and benchmarked.

pub mod catalogue;
pub mod fleet;
pub mod layout;
pub mod levels;
pub mod request;
pub mod units;

pub use catalogue::{Catalogue, GpuModel, MigGeometry, MigProfile, ModelId};
pub use fleet::{Fleet, FleetError, Node, NodeId, Pool, PoolId, Sharing, Topology};
pub use levels::{Domain, LevelError, Levels};
pub use request::{GangRequest, Request, RequestError, Shape, TenantId, TopologyConstraint, TopologyMode};
pub use units::GpuUnits;
