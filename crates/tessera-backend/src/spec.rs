//! Run specs: what to run, where, for whom, and the devices it gets.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::plan::MigInstance;

/// The devices a workload gets.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Devices {
    /// `Exact` backends: these GPUs of the node, and the share of them.
    Exact { gpus: Vec<u8>, slice: SliceSpec },
    /// `PerNodeCount` backends: `count` devices of `resource` on the node.
    Count { resource: Resource, count: u8 },
}

/// The share of the named GPUs a workload gets.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SliceSpec {
    Whole,
    Mig(MigInstance),
    Fraction {
        milli: u16,
        memory_mib: Option<u32>,
    },
    /// CPU and memory of the node only.
    HostOnly,
}

/// A device-plugin resource: `nvidia.com/gpu`, `nvidia.com/mig-3g.40gb`, a time-sliced replica.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Resource {
    Gpu,
    Mig { profile: String },
    SharedGpu { milli: u16 },
}

impl fmt::Display for Resource {
    /// The device plugin's resource name (mixed MIG strategy; time-slicing with
    /// `renameByDefault`, which advertises `<name>.shared`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resource::Gpu => f.write_str("nvidia.com/gpu"),
            // The device plugin cannot put `+` in a resource name: `1g.10gb+me` → `1g.10gb.me`.
            Resource::Mig { profile } => write!(f, "nvidia.com/mig-{}", profile.replace('+', ".")),
            Resource::SharedGpu { .. } => f.write_str("nvidia.com/gpu.shared"),
        }
    }
}

/// What to run, where, for whom.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunSpec {
    pub id: u64,
    pub tenant: String,
    pub project: String,
    pub name: String,
    /// `batch`, `service` or `interactive`.
    pub kind: String,
    pub node: String,
    pub model: String,
    /// Board memory in MiB (0 = unknown).
    pub model_memory_mib: u32,
    pub devices: Devices,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub env: BTreeMap<String, String>,
    pub command: Option<Vec<String>>,
    pub image: Option<String>,
    /// Batch run time / lease; `None` runs until stopped.
    pub duration: Option<Duration>,
    /// When it started running (ms since the epoch), for workloads already running (reconcile).
    pub running_since_ms: Option<i64>,
    /// A gang spanning several nodes: its node-shares after the first (which is `node` and
    /// `devices`), in gang order. Empty for a workload on one node — every placement the engine
    /// makes today; a backend that cannot run a multi-node gang
    /// ([`crate::Capabilities::multi_node`] false) refuses a spec with shares here.
    pub gang: Vec<GangShare>,
    /// A workload asked for with the backend's own tools: the object to run (already there)
    /// instead of one the backend makes.
    pub native: Option<crate::NativeRef>,
}

/// One node-share of a gang that spans several nodes: the node and the devices there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GangShare {
    pub node: String,
    pub devices: Devices,
}

impl RunSpec {
    /// How many node-shares (pods, processes) the workload has: 1 unless it is a multi-node gang.
    pub fn gang_size(&self) -> usize {
        1 + self.gang.len()
    }

    /// The node and devices of node-share `index` (0 is `node`/`devices`).
    pub fn share(&self, index: usize) -> Option<(&str, &Devices)> {
        match index {
            0 => Some((&self.node, &self.devices)),
            i => self.gang.get(i - 1).map(|g| (g.node.as_str(), &g.devices)),
        }
    }
}

/// A [`TenancySpec::quota`] key prefix naming a time-sliced pool (`shared:<pool>`) instead of a
/// device-plugin resource: the backend turns it into every replica that pool advertises, under
/// the resource names its device plugins use (a fraction is one replica whatever its size, so
/// a limit in GPU units cannot be mirrored there; Tessera's own quota decides).
pub const SHARED_POOL_QUOTA: &str = "shared:";

/// A tenant project as a backend with tenancy of its own isolates it
/// ([`crate::Backend::ensure_tenancy`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenancySpec {
    pub tenant: String,
    pub project: String,
    /// Single sign-on groups whose members may act in the project's namespace.
    pub groups: Vec<String>,
    /// Hard limits by device-plugin resource name (`nvidia.com/gpu` → 16,
    /// `nvidia.com/mig-3g.40gb` → 4), mirroring Tessera's quota.
    pub quota: BTreeMap<String, u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_carry_the_device_plugin_names() {
        assert_eq!(Resource::Gpu.to_string(), "nvidia.com/gpu");
        let mig = Resource::Mig {
            profile: "3g.40gb".into(),
        };
        assert_eq!(mig.to_string(), "nvidia.com/mig-3g.40gb");
        let me = Resource::Mig {
            profile: "1g.10gb+me".into(),
        };
        assert_eq!(me.to_string(), "nvidia.com/mig-1g.10gb.me");
        assert_eq!(Resource::SharedGpu { milli: 250 }.to_string(), "nvidia.com/gpu.shared");
    }
}
