//! Conversions at the lifecycle's boundaries: a workload's request to the engine's
//! [`Request`], the engine's [`Allocation`] to the domain's [`Placement`] record (and back, when
//! state is rebuilt from the store), and a placement to what the backend is asked to do — a
//! [`PartitionPlan`] and a [`RunSpec`] shaped by the backend's declared capabilities.

use std::collections::HashMap;
use std::time::Duration;

use tessera_backend::{
    Capabilities, DeviceAssignment, Devices, MigInstance, PartitionPlan, Partitioning, Resource, RunSpec, SliceSpec,
};
use tessera_domain::{GpuSpec, Placement, ShapeSpec, Slice, Workload};
use tessera_model::request::{GangRequest, MigChoice};
use tessera_model::{Fleet, GpuUnits, NodeId, Request, Shape, Sharing, TenantId};
use tessera_sched::{Allocation, Grant};

/// A request field that no fleet could accept, named as in the API's request body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub field: &'static str,
    pub message: String,
}

impl FieldError {
    fn new(field: &'static str, message: impl Into<String>) -> Self {
        FieldError {
            field,
            message: message.into(),
        }
    }
}

/// Node names to node ids (the fleet's own lookup is linear).
pub struct NodeIndex(HashMap<String, NodeId>);

impl NodeIndex {
    pub fn new(fleet: &Fleet) -> Self {
        NodeIndex(
            fleet
                .nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (n.name.clone(), NodeId(i as u32)))
                .collect(),
        )
    }

    pub fn get(&self, name: &str) -> Option<NodeId> {
        self.0.get(name).copied()
    }
}

/// Host resources given to a request that names none: per GPU unit, with a floor.
pub const CPU_MILLI_PER_UNIT: u64 = tessera_api::rules::CPU_MILLI_PER_GPU_UNIT;
pub const MEMORY_MIB_PER_UNIT: u64 = tessera_api::rules::MEMORY_MIB_PER_GPU_UNIT;
/// The least a workload gets: the documented minimum of what it may ask for.
pub const MIN_CPU_MILLI: u64 = tessera_api::rules::CPU_MILLI.min as u64;
pub const MIN_MEMORY_MIB: u64 = tessera_api::rules::MEMORY_MIB.min as u64;

/// The default host CPU (milli-cores) and memory (MiB) of a request for `units`.
pub fn default_host(units: GpuUnits) -> (u64, u64) {
    let per = |per_unit: u64, min: u64| (per_unit * units.as_milli() / 1000).max(min);
    (
        per(CPU_MILLI_PER_UNIT, MIN_CPU_MILLI),
        per(MEMORY_MIB_PER_UNIT, MIN_MEMORY_MIB),
    )
}

/// The engine request for a shape, with host resources. Names are resolved against the fleet;
/// errors name the offending field.
pub fn engine_request(fleet: &Fleet, s: &ShapeSpec, cpu_milli: u64, memory_mib: u64) -> Result<Request, FieldError> {
    let cat = &fleet.catalogue;
    let mut models = Vec::new();
    for m in &s.models {
        let found = match cat.find(m) {
            Some(id) => vec![id],
            None => cat.find_family(m),
        };
        if found.is_empty() {
            let known: Vec<&str> = cat.models().map(|(_, m)| m.name.as_str()).collect();
            return Err(FieldError::new(
                "shape.models",
                format!("unknown GPU model `{m}` (known: {})", known.join(", ")),
            ));
        }
        models.extend(found);
    }
    let pool = match &s.pool {
        Some(p) => Some(fleet.pool_by_name(p).ok_or_else(|| {
            let names: Vec<&str> = fleet.pools.iter().map(|p| p.name.as_str()).collect();
            FieldError::new(
                "shape.pool",
                format!("unknown pool `{p}` (pools: {})", names.join(", ")),
            )
        })?),
        None => None,
    };
    let shape = match &s.gpu {
        // What stands for a gang where one request is read (its resource class, host
        // defaults): one of its node-shares. The gang itself is [`engine_gang`].
        GpuSpec::Gang(g) => Shape::Whole {
            gpus: g.gpus_per_node.unwrap_or(8).clamp(1, 16),
        },
        GpuSpec::Whole { gpus } => {
            if *gpus == 0 || *gpus > 16 {
                return Err(FieldError::new(
                    "shape.gpus",
                    format!("{gpus} whole GPUs: must be between 1 and 16"),
                ));
            }
            Shape::Whole { gpus: *gpus }
        }
        GpuSpec::Mig { profile } => {
            let mut choice = MigChoice::resolve(cat, profile).map_err(|e| FieldError::new("shape.mig", e.message))?;
            if !models.is_empty() {
                choice.options.retain(|(m, _)| models.contains(m));
                if choice.options.is_empty() {
                    let names: Vec<String> = models.iter().map(|&m| cat.get(m).name.clone()).collect();
                    return Err(FieldError::new(
                        "shape.mig",
                        format!(
                            "{} {} no MIG profile `{profile}`",
                            names.join(", "),
                            if names.len() == 1 { "has" } else { "have" }
                        ),
                    ));
                }
            }
            Shape::Mig(choice)
        }
        GpuSpec::Fraction { milli, memory_mib } => {
            if *milli == 0 || *milli >= 1000 {
                return Err(FieldError::new(
                    "shape.fraction",
                    format!("{milli} milli-GPU: a fraction must be between 1 and 999; ask for `gpus` for whole GPUs"),
                ));
            }
            Shape::Fraction {
                milli: *milli,
                memory_mib: *memory_mib,
            }
        }
    };
    let mut r = Request::new(shape).with_host(cpu_milli, memory_mib).with_models(models);
    r.pool = pool;
    Ok(r)
}

/// The engine's request for a multi-node gang shape, with host resources per node-share and
/// the tenant; `None` for a shape on one node. Names are resolved as [`engine_request`] does.
pub fn engine_gang(
    fleet: &Fleet,
    s: &ShapeSpec,
    cpu_milli: u64,
    memory_mib: u64,
    tenant: TenantId,
) -> Result<Option<GangRequest>, FieldError> {
    let GpuSpec::Gang(g) = &s.gpu else {
        return Ok(None);
    };
    // Models and pool, resolved and checked by the single-node path.
    let r = engine_request(fleet, s, cpu_milli, memory_mib)?;
    let mut gang = GangRequest::whole_nodes(g.gpus)
        .with_host(cpu_milli, memory_mib)
        .with_models(r.models)
        .with_tenant(tenant);
    gang.gpus_per_node = g.gpus_per_node;
    gang.pool = r.pool;
    gang.topology = g.topology.clone();
    gang.segment = g.segment;
    gang.remainder = g.remainder;
    if let Some(per) = g.gpus_per_node {
        gang.check_with(per)
            .map_err(|e| FieldError::new(gang_field(e.field), e.message))?;
    }
    if g.remainder {
        check_remainder(fleet, &gang)?;
    }
    Ok(Some(gang))
}

/// A gang with a remainder share (`shape.remainder`) must need one: in some pool it may use,
/// more GPUs than one of its nodes holds and no multiple of that node size (the size of a
/// whole-node share there: the pool's largest node of an allowed model). Otherwise a 422
/// naming the rule, with the node size of the first such pool.
fn check_remainder(fleet: &Fleet, g: &GangRequest) -> Result<(), FieldError> {
    let sizes: Vec<(&str, u32)> = fleet
        .pools
        .iter()
        .enumerate()
        .filter(|(i, p)| p.sharing == Sharing::Whole && g.pool.is_none_or(|x| usize::from(x.0) == *i))
        .filter_map(|(_, p)| {
            let largest = fleet.nodes[p.nodes.start as usize..p.nodes.end as usize]
                .iter()
                .filter(|n| g.allows_model(n.model))
                .map(|n| u32::from(n.gpus))
                .max()?;
            Some((p.name.as_str(), largest))
        })
        .collect();
    let needed = |&(_, size): &(&str, u32)| size > 0 && g.gpus > size && !g.gpus.is_multiple_of(size);
    match sizes.first() {
        // No pool can take it: the engine says why at submission.
        None => Ok(()),
        Some(_) if sizes.iter().any(needed) => Ok(()),
        Some((pool, size)) if g.gpus <= *size => Err(FieldError::new(
            "shape.remainder",
            format!(
                "{} GPUs fit on one node of {size} GPUs (pool {pool}): a remainder share is for a gang of more GPUs \
                 than one node holds; leave out `remainder` to run them on one node",
                g.gpus
            ),
        )),
        Some((pool, size)) => Err(FieldError::new(
            "shape.remainder",
            format!(
                "{} GPUs as whole nodes of {size} GPUs (pool {pool}) leave no remainder: a remainder share is for \
                 more GPUs than one node holds that are no multiple of it (12 on 8-GPU nodes: 8 + 4); leave out \
                 `remainder`",
                g.gpus
            ),
        )),
    }
}

/// The API's name of a gang request's field (`gpus`, `gpus_per_node`, `segment`, `topology`).
pub fn gang_field(field: &str) -> &'static str {
    match field {
        "gpus_per_node" => "shape.gpus_per_node",
        "segment" => "shape.segment",
        "topology" => "shape.topology",
        _ => "shape.gpus",
    }
}

/// The engine's requests for a stored or new workload's shape, for `tenant`: the single-node
/// request (for a gang, one of its node-shares) and the gang's, if it is one.
pub fn resolve(
    fleet: &Fleet,
    spec: &tessera_domain::WorkloadSpec,
    tenant: TenantId,
) -> Result<(Request, Option<GangRequest>), FieldError> {
    let r = engine_request(fleet, &spec.shape, spec.cpu_milli, spec.memory_mib)?;
    let gang = engine_gang(fleet, &spec.shape, spec.cpu_milli, spec.memory_mib, tenant)?;
    Ok((r.with_tenant(tenant), gang))
}

/// The largest whole-GPU count one node (NVLink domain) of the pools `s` may use can hold:
/// whole GPUs beyond it are a multi-node gang.
pub fn largest_whole_node(fleet: &Fleet, s: &ShapeSpec) -> u32 {
    let pool = s.pool.as_deref().and_then(|p| fleet.pool_by_name(p));
    fleet
        .nodes
        .iter()
        .filter(|n| fleet.pool(n.pool).sharing == Sharing::Whole && pool.is_none_or(|p| p == n.pool))
        .filter_map(|n| n.topology.domains(n.gpus).iter().map(|d| d.count_ones()).max())
        .max()
        .unwrap_or(0)
}

/// The placement record of an engine allocation.
pub fn placement_of(fleet: &Fleet, a: &Allocation) -> Placement {
    let node = fleet.node(a.node);
    let model = fleet.catalogue.get(node.model);
    let slice = match a.grant {
        Grant::Whole { .. } => Slice::Whole,
        Grant::Mig {
            profile,
            profile_id,
            start,
            size,
            ..
        } => Slice::Mig {
            profile: model
                .mig
                .map(|g| model.profile_name(&g.profiles[profile as usize]))
                .unwrap_or_default(),
            profile_id,
            start,
            size,
        },
        Grant::Fraction { milli, memory_mib, .. } => Slice::Fraction {
            milli,
            gpu_memory_mib: (memory_mib > 0).then_some(memory_mib),
        },
        Grant::CpuOnly => Slice::CpuOnly,
    };
    Placement {
        pool: fleet.pool(node.pool).name.clone(),
        node: node.name.clone(),
        model: model.name.clone(),
        gpus: (0..node.gpus).filter(|g| a.grant.gpu_mask() >> g & 1 == 1).collect(),
        slice,
        units: a.units,
    }
}

/// Rebuilds the engine allocation of a stored placement (start-up, failover), or says why the
/// fleet can no longer hold it.
pub fn allocation_of(
    fleet: &Fleet,
    nodes: &NodeIndex,
    id: u64,
    p: &Placement,
    host: (u64, u64),
    tenant: TenantId,
) -> Result<Allocation, String> {
    let node = nodes
        .get(&p.node)
        .ok_or_else(|| format!("node {} is not in the fleet", p.node))?;
    let n = fleet.node(node);
    let model = fleet.catalogue.get(n.model);
    if model.name != p.model {
        return Err(format!("node {} now has {} GPUs, not {}", p.node, model.name, p.model));
    }
    if let Some(g) = p.gpus.iter().find(|g| **g >= n.gpus) {
        return Err(format!("node {} has no GPU {g}", p.node));
    }
    let gpu = p.gpus.first().copied().unwrap_or(0);
    let grant = match &p.slice {
        Slice::Whole => Grant::Whole {
            gpus: p.gpus.iter().fold(0u16, |m, g| m | 1 << g),
        },
        Slice::Mig { profile_id, start, .. } => {
            let geom = model
                .mig
                .filter(|_| fleet.pool(n.pool).sharing == Sharing::Mig)
                .ok_or("the node is not in a MIG pool")?;
            let profile = geom
                .profile_index(*profile_id)
                .ok_or_else(|| format!("{} has no MIG profile {profile_id}", model.name))?;
            Grant::Mig {
                gpu,
                profile: profile as u8,
                profile_id: *profile_id,
                start: *start,
                size: geom.profiles[profile].mem_slices,
            }
        }
        Slice::Fraction { milli, gpu_memory_mib } => Grant::Fraction {
            gpu,
            milli: *milli,
            memory_mib: gpu_memory_mib.unwrap_or(0),
        },
        Slice::CpuOnly => Grant::CpuOnly,
    };
    Ok(Allocation {
        id,
        node,
        grant,
        cpu_milli: host.0,
        memory_mib: host.1,
        tenant: Some(tenant),
        units: p.units,
    })
}

/// A configured MIG slot of the engine as backends name it.
pub fn mig_instance_of(fleet: &Fleet, node: NodeId, slot: &tessera_sched::state::MigSlot) -> MigInstance {
    let model = fleet.catalogue.get(fleet.node(node).model);
    MigInstance {
        profile: model
            .mig
            .map(|g| model.profile_name(&g.profiles[slot.profile as usize]))
            .unwrap_or_default(),
        profile_id: slot.profile_id,
        start: slot.start,
        size: slot.size,
    }
}

/// A backend's MIG instances as the engine's slots; `None` if the node's model does not have
/// one of the profiles.
pub fn mig_slots(fleet: &Fleet, node: NodeId, instances: &[MigInstance]) -> Option<Vec<tessera_sched::state::MigSlot>> {
    let geom = fleet.catalogue.get(fleet.node(node).model).mig?;
    instances
        .iter()
        .map(|i| {
            geom.profile_index(i.profile_id).map(|p| tessera_sched::state::MigSlot {
                profile: p as u8,
                profile_id: i.profile_id,
                start: i.start,
                size: geom.profiles[p].mem_slices,
            })
        })
        .collect()
}

/// The MIG instance of a placement, as backends name it.
pub fn mig_instance(p: &Placement) -> Option<MigInstance> {
    match &p.slice {
        Slice::Mig {
            profile,
            profile_id,
            start,
            size,
        } => Some(MigInstance {
            profile: profile.clone(),
            profile_id: *profile_id,
            start: *start,
            size: *size,
        }),
        _ => None,
    }
}

/// What the backend must partition for `p`. `layout` is the GPU's complete MIG layout after
/// this placement, which backends that re-lay out whole GPUs need.
pub fn partition_plan(p: &Placement, caps: &Capabilities, layout: impl FnOnce() -> Vec<MigInstance>) -> PartitionPlan {
    let gpu = p.gpus.first().copied().unwrap_or(0);
    match &p.slice {
        Slice::Mig { .. } => match caps.partitioning {
            Partitioning::WholeGpu => PartitionPlan::Layout {
                node: p.node.clone(),
                gpu,
                instances: layout(),
            },
            _ => PartitionPlan::Instance {
                node: p.node.clone(),
                gpu,
                instance: mig_instance(p).expect("a MIG slice"),
            },
        },
        Slice::Fraction { milli, gpu_memory_mib } => PartitionPlan::Share {
            node: p.node.clone(),
            gpu,
            milli: *milli,
            memory_mib: *gpu_memory_mib,
        },
        Slice::Whole | Slice::CpuOnly => PartitionPlan::Nothing { node: p.node.clone() },
    }
}

/// What the backend runs for a placed workload.
pub fn run_spec(fleet: &Fleet, nodes: &NodeIndex, w: &Workload, caps: &Capabilities) -> RunSpec {
    let p = w.placement.as_ref().expect("a placed workload has a placement");
    RunSpec {
        gang: w
            .shares
            .iter()
            .map(|s| tessera_backend::GangShare {
                node: s.node.clone(),
                devices: devices_of(s, caps),
            })
            .collect(),
        ..one_node_spec(fleet, nodes, w, p, caps)
    }
}

/// The devices a backend is given for placement `p`.
fn devices_of(p: &Placement, caps: &Capabilities) -> Devices {
    match caps.devices {
        DeviceAssignment::Exact => Devices::Exact {
            gpus: p.gpus.clone(),
            slice: match &p.slice {
                Slice::Whole => SliceSpec::Whole,
                Slice::Mig { .. } => SliceSpec::Mig(mig_instance(p).expect("a MIG slice")),
                Slice::Fraction { milli, gpu_memory_mib } => SliceSpec::Fraction {
                    milli: *milli,
                    memory_mib: *gpu_memory_mib,
                },
                Slice::CpuOnly => SliceSpec::HostOnly,
            },
        },
        DeviceAssignment::PerNodeCount => match &p.slice {
            Slice::Whole => Devices::Count {
                resource: Resource::Gpu,
                count: p.gpus.len() as u8,
            },
            Slice::Mig { profile, .. } => Devices::Count {
                resource: Resource::Mig {
                    profile: profile.clone(),
                },
                count: 1,
            },
            Slice::Fraction { milli, .. } => Devices::Count {
                resource: Resource::SharedGpu { milli: *milli },
                count: 1,
            },
            Slice::CpuOnly => Devices::Count {
                resource: Resource::Gpu,
                count: 0,
            },
        },
    }
}

/// The run spec of `w` on the node of `p`, its first (or only) node-share.
fn one_node_spec(fleet: &Fleet, nodes: &NodeIndex, w: &Workload, p: &Placement, caps: &Capabilities) -> RunSpec {
    let memory = nodes
        .get(&p.node)
        .map(|n| fleet.catalogue.get(fleet.node(n).model).memory_mib)
        .unwrap_or(0);
    let devices = devices_of(p, caps);
    RunSpec {
        id: w.id.0,
        tenant: w.spec.tenant.clone(),
        project: w.spec.project.clone(),
        name: w.spec.name.clone(),
        kind: w.spec.kind.as_str().to_string(),
        node: p.node.clone(),
        model: p.model.clone(),
        model_memory_mib: memory,
        devices,
        cpu_milli: w.spec.cpu_milli,
        memory_mib: w.spec.memory_mib,
        env: w.spec.env.clone(),
        command: w.spec.command.clone(),
        image: w.spec.image.clone(),
        duration: w.spec.duration_s.map(Duration::from_secs),
        running_since_ms: w.running_at,
        gang: Vec::new(),
        native: w
            .spec
            .native
            .as_deref()
            .and_then(tessera_backend::NativeRef::from_record),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_sched::Engine;
    use tessera_sched::policy::BestFit;

    fn shape(gpu: GpuSpec) -> ShapeSpec {
        ShapeSpec {
            gpu,
            models: vec![],
            pool: None,
        }
    }

    #[test]
    fn placements_round_trip_through_the_engine() {
        let fleet = std::sync::Arc::new(Fleet::seed());
        let nodes = NodeIndex::new(&fleet);
        let mut e = Engine::new(fleet.clone(), Box::new(BestFit), 1);
        for (id, gpu) in [
            (1, GpuSpec::Whole { gpus: 8 }),
            (
                2,
                GpuSpec::Mig {
                    profile: "3g.40gb".into(),
                },
            ),
            (
                3,
                GpuSpec::Fraction {
                    milli: 250,
                    memory_mib: Some(4096),
                },
            ),
        ] {
            let req = engine_request(&fleet, &shape(gpu), 1000, 1024)
                .unwrap()
                .with_tenant(TenantId(4));
            let a = e.place(id, &req).unwrap().clone();
            let p = placement_of(&fleet, &a);
            let back = allocation_of(&fleet, &nodes, id, &p, (1000, 1024), TenantId(4)).unwrap();
            assert_eq!(back, a, "{p:?}");
        }
    }

    #[test]
    fn bad_shapes_name_their_field() {
        let fleet = Fleet::seed();
        let e = engine_request(&fleet, &shape(GpuSpec::Whole { gpus: 0 }), 0, 0).unwrap_err();
        assert_eq!(e.field, "shape.gpus");
        let mut s = shape(GpuSpec::Mig {
            profile: "3g.40gb".into(),
        });
        s.models = vec!["L40S".into()];
        assert_eq!(engine_request(&fleet, &s, 0, 0).unwrap_err().field, "shape.mig");
        s.pool = Some("nope".into());
        s.models.clear();
        assert_eq!(engine_request(&fleet, &s, 0, 0).unwrap_err().field, "shape.pool");
        assert_eq!(default_host(GpuUnits::milli(125)), (500, 2048));
        assert_eq!(default_host(GpuUnits::whole(2)), (8000, 32768));
    }
}
