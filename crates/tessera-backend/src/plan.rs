//! Partition plans: the MIG instance, layout or share a placement needs before it can start,
//! and what a backend reports after realising one.

use std::fmt;

/// A MIG GPU instance: its profile and its placement in memory slices.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MigInstance {
    /// The profile's name as the driver derives it (`3g.40gb`); for display and device-plugin
    /// resource names.
    pub profile: String,
    /// The device-specific profile ID (`nvidia-smi mig -lgip`): 9 is a 3g on A100/H100.
    pub profile_id: u32,
    /// First memory slice of the placement.
    pub start: u8,
    /// Memory slices the placement occupies.
    pub size: u8,
}

impl MigInstance {
    pub fn new(profile: impl Into<String>, profile_id: u32, start: u8, size: u8) -> Self {
        MigInstance {
            profile: profile.into(),
            profile_id,
            start,
            size,
        }
    }

    /// One past the last memory slice it occupies.
    pub fn end(&self) -> u8 {
        self.start.saturating_add(self.size)
    }

    /// Whether the two placements share a memory slice (NVML refuses such a creation).
    pub fn overlaps(&self, other: &MigInstance) -> bool {
        self.start < other.end() && other.start < self.end()
    }

    /// Same profile at the same placement: the same instance as far as the hardware goes.
    pub fn same_placement(&self, other: &MigInstance) -> bool {
        self.profile_id == other.profile_id && self.start == other.start && self.size == other.size
    }
}

impl fmt::Display for MigInstance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (profile {}) at slices {}..{}",
            self.profile,
            self.profile_id,
            self.start,
            self.end().saturating_sub(1)
        )
    }
}

/// What to partition for a placement.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PartitionPlan {
    /// `Instance` backends: create this instance on this GPU.
    Instance {
        node: String,
        gpu: u8,
        instance: MigInstance,
    },
    /// `WholeGpu` backends: this GPU's complete layout (instances in use are always part of it).
    Layout {
        node: String,
        gpu: u8,
        instances: Vec<MigInstance>,
    },
    /// A time-sliced share of a GPU.
    Share {
        node: String,
        gpu: u8,
        milli: u16,
        memory_mib: Option<u32>,
    },
    /// Nothing to partition (whole GPUs, host resources).
    Nothing { node: String },
}

impl PartitionPlan {
    pub fn node(&self) -> &str {
        match self {
            PartitionPlan::Instance { node, .. }
            | PartitionPlan::Layout { node, .. }
            | PartitionPlan::Share { node, .. }
            | PartitionPlan::Nothing { node } => node,
        }
    }

    /// The GPU the plan is about (`None` for `Nothing`).
    pub fn gpu(&self) -> Option<u8> {
        match self {
            PartitionPlan::Instance { gpu, .. }
            | PartitionPlan::Layout { gpu, .. }
            | PartitionPlan::Share { gpu, .. } => Some(*gpu),
            PartitionPlan::Nothing { .. } => None,
        }
    }
}

/// What realising a plan did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionReport {
    /// A line for the workload's timeline.
    pub detail: String,
    /// True when this call changed the backend's partitioning (created an instance, applied a
    /// layout); false when the plan was realised already or there was nothing to create.
    pub created: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_overlap_exactly_when_they_share_a_memory_slice() {
        let low = MigInstance::new("3g.40gb", 9, 0, 4);
        let high = MigInstance::new("3g.40gb", 9, 4, 4);
        let mid = MigInstance::new("2g.20gb", 14, 2, 2);
        assert!(!low.overlaps(&high) && !high.overlaps(&low));
        assert!(low.overlaps(&mid) && mid.overlaps(&low));
        assert!(!high.overlaps(&mid));
        assert!(low.overlaps(&low));
        assert_eq!(high.to_string(), "3g.40gb (profile 9) at slices 4..7");
    }

    #[test]
    fn same_placement_ignores_the_display_name() {
        let a = MigInstance::new("3g.40gb", 9, 4, 4);
        let renamed = MigInstance::new("3g.39gb", 9, 4, 4);
        assert!(a.same_placement(&renamed));
        assert!(!a.same_placement(&MigInstance::new("4g.40gb", 5, 4, 4)));
    }
}
