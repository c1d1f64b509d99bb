//! The fleet's operator state as readers see it: unhealthy GPUs, node states, rolling
//! upgrades and MIG modes. The health, node, rollout and MIG controllers each change their
//! part; the loop publishes the whole.

use std::collections::BTreeMap;

use tessera_store::{GpuHealthRecord, NodeState, NodeStateRecord, RolloutRecord};

/// Unhealthy GPUs and operator node states, as readers see them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetOps {
    /// By `(node, gpu)`.
    pub unhealthy: BTreeMap<(String, u8), GpuHealthRecord>,
    /// Nodes that are not `ready`, by name.
    pub nodes: BTreeMap<String, NodeStateRecord>,
    /// Rolling upgrades, by id (every stored one).
    pub rollouts: BTreeMap<u64, RolloutRecord>,
    /// MIG modes an admin set, by `(node, gpu)`.
    pub mig: BTreeMap<(String, u8), tessera_store::GpuMigRecord>,
}

impl FleetOps {
    /// The operator state of a node: `ready` without a record.
    pub fn node_state(&self, node: &str) -> NodeState {
        self.nodes.get(node).map_or(NodeState::Ready, |r| r.state)
    }
}
