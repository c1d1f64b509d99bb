//! A fleet that changes while the control plane runs: a backend that discovers its nodes
//! (Kubernetes) reports a new fleet when a GPU node joins or leaves the cluster or a node's GPUs,
//! pool or model change ([`BackendEvent::FleetChanged`](tessera_backend::BackendEvent)).
//!
//! * [`FleetCell`] holds the fleet the backend last reported. The [`Lifecycle`](super::command::Lifecycle)
//!   handle owns it and updates it as the news arrives, whether this replica leads or not, so a
//!   loop started later, a follower's view and the API (validation, dry runs, `tessera nodes`)
//!   read the same fleet.
//! * The loop adopts the new fleet after the batch the news came in is committed
//!   (`Core::adopt_fleet`, in the loop; `World::lost_on` finds the work lost): work still holding capacity on a node that left is lost (as when
//!   its pods are — requeued or failed by its lifecycle), that is committed, and then the
//!   engine is rebuilt from the store on the new fleet the way it is after a failed commit
//!   ([`recover`](super::recover)). Placements are recorded by node name and GPU index, so
//!   running work keeps its GPUs even where the new fleet numbers its nodes differently, and
//!   every per-node state (fences, health, drains, MIG modes, closed nodes) is kept by name.

use std::sync::{Arc, RwLock};

use tessera_model::Fleet;

use super::placement::NodeIndex;

/// The current fleet and its node index, shared and swappable.
#[derive(Clone)]
pub struct FleetCell(Arc<RwLock<(Arc<Fleet>, Arc<NodeIndex>)>>);

impl FleetCell {
    pub fn new(fleet: Arc<Fleet>) -> FleetCell {
        let nodes = Arc::new(NodeIndex::new(&fleet));
        FleetCell(Arc::new(RwLock::new((fleet, nodes))))
    }

    /// The fleet now.
    pub fn get(&self) -> Arc<Fleet> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).0.clone()
    }

    /// The fleet now with its node index (one reading: they match).
    pub fn with_index(&self) -> (Arc<Fleet>, Arc<NodeIndex>) {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the fleet.
    pub fn set(&self, fleet: Arc<Fleet>) {
        let nodes = Arc::new(NodeIndex::new(&fleet));
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = (fleet, nodes);
    }
}

impl std::fmt::Debug for FleetCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let fleet = self.get();
        f.debug_struct("FleetCell")
            .field("nodes", &fleet.nodes.len())
            .field("gpus", &fleet.gpu_count())
            .finish()
    }
}

/// The names of the nodes of `old` that `new` does not have.
pub(super) fn departed(old: &Fleet, new: &Fleet) -> Vec<String> {
    let kept = NodeIndex::new(new);
    old.nodes
        .iter()
        .filter(|n| kept.get(&n.name).is_none())
        .map(|n| n.name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet(nodes: &[(&str, &str)]) -> Arc<Fleet> {
        let mut toml = String::new();
        for (pool, node) in nodes {
            toml.push_str(&format!(
                "[[pool]]\nname = \"{pool}\"\nsharing = \"whole\"\n\n[[pool.nodes]]\nname = \"{node}\"\ngpu_model = \"H100-80GB-SXM\"\ngpus = 8\ncpus = 64\nmemory_gib = 512\n\n"
            ));
        }
        Arc::new(Fleet::from_toml(&toml, "test").unwrap())
    }

    #[test]
    fn departed_nodes_are_named_whatever_their_index() {
        let old = fleet(&[("a", "n-0"), ("b", "n-1"), ("c", "n-2")]);
        // n-1 left; n-2 is node 0 now; n-3 joined.
        let new = fleet(&[("c", "n-2"), ("a", "n-0"), ("d", "n-3")]);
        assert_eq!(departed(&old, &new), ["n-1"]);
        assert!(departed(&new, &new).is_empty());
    }

    #[test]
    fn the_cell_hands_out_a_fleet_and_its_index_together() {
        let cell = FleetCell::new(fleet(&[("a", "n-0")]));
        let held = cell.get();
        cell.set(fleet(&[("b", "n-1"), ("a", "n-0")]));
        let (f, index) = cell.with_index();
        assert_eq!(f.nodes.len(), 2);
        assert_eq!(index.get("n-0"), f.node_by_name("n-0"));
        assert_eq!(index.get("n-0").map(|n| n.0), Some(1));
        // What a reader took before the swap stays whole.
        assert_eq!(held.nodes.len(), 1);
        assert_eq!(cell.clone().get().nodes.len(), 2, "clones share the cell");
    }
}
