//! # tessera-backend-sim
//!
//! The simulated backend: an in-process fleet that implements the `tessera-backend` contract,
//! for the embedded default server, demos and tests. Workloads run for their declared duration
//! (or until stopped), GPUs report plausible telemetry under DCGM names, and faults can be
//! injected. It touches no hardware.
//!
//! Two modes model the two kinds of real fleet Tessera targets:
//!
//! * [`SimMode::Exact`] (the default), like one GPU server driven through NVML: MIG instances
//!   are created one at a time at exact placements and workloads are given exact GPUs.
//! * [`SimMode::Operator`], like a Kubernetes cluster with NVIDIA's GPU Operator: a GPU's MIG
//!   layout is replaced as a whole and only while the GPU is idle, and workloads ask for a count
//!   of a device-plugin resource; the simulated kubelet picks the devices.
//!
//! Its state lives in the control plane's process, so it forgets everything on a restart; with
//! [`SimConfig::adopt_unknown`] (the default) `reconcile` adopts the workloads Tessera recorded
//! as running (`running_since_ms` set), as hardware that outlived the control plane would still
//! run them. Layouts are not remembered: an adopted operator-mode MIG workload gets its device
//! once a layout offering its profile is applied on its node again.
//!
//! ## Multi-node gangs
//!
//! A spec with node-shares in `RunSpec::gang` runs as one workload (one id), in both modes
//! ([`Capabilities::multi_node`](tessera_backend::Capabilities::multi_node)), as the
//! Kubernetes backend runs one pod per share and folds their states into one:
//!
//! * `start` binds every share on its own node as it binds a workload on one node, on distinct
//!   nodes that are up, before any share holds anything: the gang starts whole or not at all,
//!   and a refusal names the share (`node-share 2 of gang workload 7 on h100-02: …`). Its
//!   `Started` carries no `bound` in either mode (`Bound` names GPUs of one node); in operator
//!   mode the simulated kubelet still picks each share's devices on its node.
//! * Its shares run and end together: one `Running` (a sample of every share's GPUs), one
//!   `Exited` after its `duration`; `stop` stops every share at once (the backend does not
//!   confirm stops, so no `Stopped` follows).
//! * A share's node removed ([`SimBackend::remove_node`], a reboot) or the share deleted
//!   ([`SimBackend::lose_share`]) loses the whole gang: one `Lost` naming the share index and
//!   its node, and every share's devices freed. A share that vanishes without a word
//!   ([`SimBackend::forget_share`]) frees its devices only; `reconcile` then reports the gang
//!   `Failed`, and its end is a `Lost`.
//! * `reconcile` reports a gang once (`Running` when all its shares run), adopts all its
//!   shares or none (a share whose node is down fails the adoption), and counts an unexpected
//!   gang as one orphan, at its first share's node.
//!
//! Behaviour a caller relies on:
//!
//! * `start` sends `Started` before it returns; `Running` follows as soon as the runtime runs
//!   the workload's task, and `Exited` after its `duration` from then.
//! * `start` refuses a node that is down ([`SimBackend::remove_node`], a reboot), and in exact
//!   mode devices another workload holds in a way they cannot be shared: a whole GPU, a MIG
//!   instance, or time-slice shares past a whole GPU (operator mode's kubelet picks free
//!   devices only).
//! * Time-slice shares and `Nothing` plans have nothing to create: `partition` checks them and
//!   reports `created: false`. MIG instances (exact) and layouts (operator) count in
//!   [`SimBackend::partitions_created`].
//! * A workload stopped or lost in this process is reported `Unknown` by `reconcile` and never
//!   adopted again while Tessera still expects it.
//! * [`Backend::take_events`](tessera_backend::Backend::take_events) also starts the periodic
//!   `Telemetry` events (first one at once); [`SimBackend::sample`] gives the same sample on
//!   demand.

mod backend;
mod bind;
mod partition;
mod state;
mod telemetry;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

pub use backend::SimBackend;
pub use telemetry::sim_uuid;

/// Which kind of fleet the simulated backend behaves like.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SimMode {
    /// NVML-like: `Instance` partitioning, `Exact` devices.
    #[default]
    Exact,
    /// GPU Operator-like: `WholeGpu` partitioning, `PerNodeCount` devices.
    Operator,
}

impl fmt::Display for SimMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SimMode::Exact => "exact",
            SimMode::Operator => "operator",
        })
    }
}

impl FromStr for SimMode {
    type Err = String;

    /// Parses `exact` or `operator` (the values of `--sim-mode`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "exact" => Ok(SimMode::Exact),
            "operator" => Ok(SimMode::Operator),
            _ => Err(format!("unknown simulation mode `{s}`: expected `exact` or `operator`")),
        }
    }
}

/// Settings of the simulated backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimConfig {
    pub mode: SimMode,
    /// Time to create a MIG instance (exact mode) or apply a GPU's layout (operator mode).
    pub mig_partition_time: Duration,
    /// Time a workload takes to stop after being asked (capped by the grace period).
    pub stop_time: Duration,
    /// Period of `Telemetry` events; zero turns them off.
    pub telemetry_interval: Duration,
    /// Whether `reconcile` adopts expected workloads it does not know (see the crate doc).
    pub adopt_unknown: bool,
}

impl SimConfig {
    /// The defaults of a mode: instance creation is instantaneous in exact mode (tests and
    /// demos want no wait), while a layout takes 2 s in operator mode, as the MIG manager's
    /// reconfiguration is slow on real clusters.
    pub fn for_mode(mode: SimMode) -> Self {
        SimConfig {
            mode,
            mig_partition_time: match mode {
                SimMode::Exact => Duration::ZERO,
                SimMode::Operator => Duration::from_secs(2),
            },
            stop_time: Duration::ZERO,
            telemetry_interval: Duration::from_secs(5),
            adopt_unknown: true,
        }
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig::for_mode(SimMode::Exact)
    }
}

/// One GPU of the simulated fleet. Every GPU given at construction is reported by telemetry,
/// idle or not, and only these GPUs can be partitioned or bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimGpu {
    pub node: String,
    pub index: u8,
    pub model: String,
    /// Board memory in MiB (0 = unknown).
    pub memory_mib: u32,
    /// Memory slices in MIG mode (8, or 4 on an A30); 0 when the model has no MIG.
    pub mig_slices: u8,
}

impl SimGpu {
    /// Every GPU of `fleet`, as the simulated backend of that fleet has them.
    pub fn for_fleet(fleet: &tessera_model::Fleet) -> Vec<SimGpu> {
        fleet
            .nodes
            .iter()
            .flat_map(|n| {
                let model = fleet.catalogue.get(n.model);
                let mig_slices = model.mig.map(|g| g.mem_slices).unwrap_or(0);
                (0..n.gpus).map(move |i| SimGpu {
                    node: n.name.clone(),
                    index: i,
                    model: model.name.clone(),
                    memory_mib: model.memory_mib,
                    mig_slices,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_from_their_flag_values() {
        assert_eq!("operator".parse::<SimMode>(), Ok(SimMode::Operator));
        assert_eq!("exact".parse::<SimMode>(), Ok(SimMode::Exact));
        assert!(
            "kubernetes"
                .parse::<SimMode>()
                .unwrap_err()
                .contains("`exact` or `operator`")
        );
        assert_eq!(SimMode::Operator.to_string(), "operator");
    }

    #[test]
    fn operator_mode_partitions_slowly_by_default() {
        assert_eq!(SimConfig::default().mode, SimMode::Exact);
        assert_eq!(SimConfig::default().mig_partition_time, Duration::ZERO);
        let op = SimConfig::for_mode(SimMode::Operator);
        assert_eq!(op.mig_partition_time, Duration::from_secs(2));
        assert_eq!(op.telemetry_interval, Duration::from_secs(5));
        assert!(op.adopt_unknown);
    }
}
