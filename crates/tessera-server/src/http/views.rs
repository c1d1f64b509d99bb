//! Domain records and snapshots as REST views: the one place where the API's wire types are
//! made. Fleet views hide other tenants' names.

use tessera_api::{
    AllocationView, Event as EventView, GpuShape, GpuView, NodeView, PoolView, SliceView, Workload as WorkloadView,
    WorkloadKind, WorkloadState, rfc3339_ms,
};
use tessera_domain::{Event, GpuSpec, Kind, Phase, Placement, Slice, Workload};
use tessera_model::{Fleet, GpuUnits, Sharing, Topology};
use tessera_sched::Grant;

use crate::auth::Identity;
use crate::lifecycle::{NodeSnap, Snapshot};

/// The API state of a phase (`partitioned` shows as `placed`: the backend is still bringing
/// the workload up).
pub fn state(p: Phase) -> WorkloadState {
    match p {
        Phase::Pending => WorkloadState::Pending,
        Phase::Queued => WorkloadState::Queued,
        Phase::Placed | Phase::Partitioned => WorkloadState::Placed,
        Phase::Running => WorkloadState::Running,
        Phase::Stopping => WorkloadState::Stopping,
        Phase::Succeeded => WorkloadState::Succeeded,
        Phase::Failed => WorkloadState::Failed,
        Phase::Cancelled => WorkloadState::Cancelled,
        Phase::Preempted => WorkloadState::Preempted,
    }
}

/// The phases an API state stands for.
pub fn phases(s: WorkloadState) -> Vec<Phase> {
    match s {
        WorkloadState::Pending => vec![Phase::Pending],
        WorkloadState::Queued => vec![Phase::Queued],
        WorkloadState::Placed => vec![Phase::Placed, Phase::Partitioned],
        WorkloadState::Running => vec![Phase::Running],
        WorkloadState::Stopping => vec![Phase::Stopping],
        WorkloadState::Succeeded => vec![Phase::Succeeded],
        WorkloadState::Failed => vec![Phase::Failed],
        WorkloadState::Cancelled => vec![Phase::Cancelled],
        WorkloadState::Preempted => vec![Phase::Preempted],
    }
}

pub fn kind(k: Kind) -> WorkloadKind {
    match k {
        Kind::Batch => WorkloadKind::Batch,
        Kind::Service => WorkloadKind::Service,
        Kind::Interactive => WorkloadKind::Interactive,
    }
}

pub fn shape(w: &Workload) -> GpuShape {
    let s = &w.spec.shape;
    let mut g = GpuShape {
        models: s.models.clone(),
        pool: s.pool.clone(),
        ..Default::default()
    };
    match &s.gpu {
        GpuSpec::Whole { gpus } => g.gpus = Some(u32::from(*gpus)),
        GpuSpec::Gang(gang) => {
            g.gpus = Some(gang.gpus);
            g.gpus_per_node = gang.gpus_per_node;
            g.topology = gang.topology.as_ref().map(|t| t.level.clone());
            g.topology_mode = gang.topology.as_ref().map(|t| match t.mode {
                tessera_model::request::TopologyMode::Required => tessera_api::TopologyMode::Required,
                tessera_model::request::TopologyMode::Preferred => tessera_api::TopologyMode::Preferred,
            });
            g.segment = gang.segment;
            g.remainder = gang.remainder;
        }
        GpuSpec::Mig { profile } => g.mig = Some(profile.clone()),
        GpuSpec::Fraction { milli, memory_mib } => {
            g.fraction = Some(*milli);
            g.gpu_memory_mib = *memory_mib;
        }
    }
    g
}

pub fn allocation(p: &Placement) -> AllocationView {
    let mut v = AllocationView {
        pool: p.pool.clone(),
        node: p.node.clone(),
        model: p.model.clone(),
        gpus: p.gpus.clone(),
        kind: p.slice.kind().to_string(),
        mig_profile: None,
        mig_profile_id: None,
        mig_start: None,
        mig_size: None,
        milli: None,
        gpu_memory_mib: None,
        units_milli: p.units.as_milli(),
        shares: Vec::new(),
    };
    if let Some(m) = crate::lifecycle::placement::mig_instance(p) {
        v.mig_profile = Some(m.profile);
        v.mig_profile_id = Some(m.profile_id);
        v.mig_start = Some(m.start);
        v.mig_size = Some(m.size);
    }
    if let Slice::Fraction { milli, gpu_memory_mib } = &p.slice {
        v.milli = Some(*milli);
        v.gpu_memory_mib = *gpu_memory_mib;
    }
    v
}

pub fn workload(w: &Workload) -> WorkloadView {
    WorkloadView {
        id: w.id.0,
        tenant: w.spec.tenant.clone(),
        project: w.spec.project.clone(),
        name: w.spec.name.clone(),
        kind: kind(w.spec.kind),
        shape: shape(w),
        cpu_milli: w.spec.cpu_milli,
        memory_mib: w.spec.memory_mib,
        duration_s: w.spec.duration_s.map(|d| d as i64),
        command: w.spec.command.clone(),
        image: w.spec.image.clone(),
        env: w.spec.env.clone(),
        priority: w.spec.priority.clone(),
        movable: w.spec.movable.map(|m| match m {
            tessera_domain::Movable::Restart => tessera_api::MovableMode::Restart,
            tessera_domain::Movable::Replace => tessera_api::MovableMode::Replace,
        }),
        state: state(w.phase),
        borrowing: w.borrowing,
        reason: w.reason.as_ref().map(|r| r.detail.clone()),
        reason_code: w.reason.as_ref().map(|r| r.code.as_str().to_string()),
        units: w.units.to_string(),
        allocation: w.placement.as_ref().map(|p| {
            let mut v = allocation(p);
            if !w.shares.is_empty() {
                v.units_milli = w.held_units().as_milli();
                v.shares = w
                    .shares
                    .iter()
                    .map(|s| tessera_api::ShareView {
                        node: s.node.clone(),
                        gpus: s.gpus.clone(),
                        units_milli: s.units.as_milli(),
                    })
                    .collect();
            }
            v
        }),
        created_at: rfc3339_ms(w.created_at),
        created_at_ms: w.created_at,
        running_at: w.running_at.map(rfc3339_ms),
        running_at_ms: w.running_at,
        ended_at: w.ended_at.map(rfc3339_ms),
        request_to_running_ms: w.request_to_running_ms(),
        expected_start: None,
    }
}

pub fn event(e: &Event) -> EventView {
    EventView {
        seq: e.seq,
        step: e.step.as_str().to_string(),
        at: rfc3339_ms(e.at),
        at_ms: e.at,
        detail: e.detail.clone(),
        code: e.code.map(|c| c.as_str().to_string()),
    }
}

fn sharing(s: Sharing) -> String {
    s.to_string()
}

pub fn pools(snap: &Snapshot) -> Vec<PoolView> {
    let f = &snap.fleet;
    f.pools
        .iter()
        .map(|p| {
            let range = p.nodes.start as usize..p.nodes.end as usize;
            let used: u64 = snap.nodes[range.clone()].iter().map(|n| n.used_milli()).sum();
            let nodes = &f.nodes[range];
            let gpus: u64 = nodes.iter().map(|n| n.gpus as u64).sum();
            let mut models: Vec<String> = nodes.iter().map(|n| f.catalogue.get(n.model).name.clone()).collect();
            models.sort();
            models.dedup();
            PoolView {
                name: p.name.clone(),
                sharing: sharing(p.sharing),
                allow_tenant_mixing: p.allow_tenant_mixing,
                nodes: nodes.len() as u64,
                gpus,
                models,
                units_used: GpuUnits(used).to_string(),
                units_total: GpuUnits::whole(gpus).to_string(),
            }
        })
        .collect()
}

pub fn node(f: &Fleet, i: usize, s: &NodeSnap, state: tessera_store::NodeState) -> NodeView {
    let n = &f.nodes[i];
    NodeView {
        name: n.name.clone(),
        pool: f.pool(n.pool).name.clone(),
        model: f.catalogue.get(n.model).name.clone(),
        gpus: n.gpus,
        nvlink: match n.topology {
            Topology::NvSwitch => "nvswitch",
            Topology::Pairs => "pairs",
            Topology::None => "none",
        }
        .into(),
        cpus: n.cpu_milli as f64 / 1000.0,
        cpus_free: s.cpu_free as f64 / 1000.0,
        memory_gib: n.memory_mib as f64 / 1024.0,
        memory_gib_free: s.mem_free as f64 / 1024.0,
        gpus_free: s.free_gpus() as u8,
        units_used: GpuUnits(s.used_milli()).to_string(),
        state: state.to_string(),
        rack: f
            .levels
            .level("rack")
            .and_then(|l| f.levels.domain_name(l, tessera_model::NodeId(i as u32)))
            .map(str::to_string),
        topology: f
            .levels
            .path(tessera_model::NodeId(i as u32))
            .into_iter()
            .map(|(level, domain)| tessera_api::TopologyLevelView {
                level: level.to_string(),
                domain: domain.to_string(),
            })
            .collect(),
    }
}

/// The GPUs of node `i`; slices of tenants `id` may not read show no names.
pub fn gpus_of(f: &Fleet, i: usize, s: &NodeSnap, id: &Identity, out: &mut Vec<GpuView>) {
    let n = &f.nodes[i];
    let p = f.pool(n.pool);
    let model = f.catalogue.get(n.model);
    for (gi, g) in s.gpus.iter().enumerate() {
        let mut slices = Vec::new();
        for h in &g.holders {
            let (tenant, project, workload) = if h.tenant.is_empty() {
                (String::new(), String::new(), h.workload)
            } else if id.can_read(&h.tenant) {
                (h.tenant.clone(), h.project.clone(), h.workload)
            } else {
                ("(another tenant)".to_string(), String::new(), 0)
            };
            let mut v = SliceView {
                kind: String::new(),
                what: String::new(),
                profile_id: None,
                start: None,
                size: None,
                units: String::new(),
                workload,
                tenant,
                project,
            };
            match h.grant {
                Grant::Whole { .. } => {
                    v.kind = "whole".into();
                    v.what = "whole".into();
                    v.units = "1".into();
                }
                Grant::Mig {
                    profile,
                    profile_id,
                    start,
                    size,
                    ..
                } => {
                    v.kind = "mig".into();
                    v.what = model
                        .mig
                        .map(|geom| model.profile_name(&geom.profiles[profile as usize]))
                        .unwrap_or_default();
                    v.profile_id = Some(profile_id);
                    v.start = Some(start);
                    v.size = Some(size);
                    v.units = h.units.to_string();
                }
                Grant::Fraction { milli, .. } => {
                    v.kind = "fraction".into();
                    v.what = format!("{milli}m");
                    v.units = GpuUnits(milli as u64).to_string();
                }
                Grant::CpuOnly => continue,
            }
            slices.push(v);
        }
        let mig_slices = (p.sharing == Sharing::Mig).then_some(model.mig).flatten().map(|geom| {
            (0..geom.mem_slices)
                .map(|i| if g.mig_mask >> i & 1 == 1 { '#' } else { '.' })
                .collect()
        });
        out.push(GpuView {
            node: n.name.clone(),
            index: gi as u8,
            pool: p.name.clone(),
            model: model.name.clone(),
            sharing: sharing(p.sharing),
            units_used: GpuUnits(g.used_milli as u64).to_string(),
            mig_slices,
            slices,
        });
    }
}
