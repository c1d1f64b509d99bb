//! Fleet views computed from the lifecycle loop's state. Tenants see the whole fleet's shape,
//! but slices held by other tenants are shown without names.

use tessera_api::{GpuView, NodeView, PoolView, SliceView};
use tessera_model::{GpuUnits, Sharing};
use tessera_sched::Grant;

use crate::auth::Identity;
use crate::controller::ViewCtx;

pub fn pools(ctx: &ViewCtx, _id: &Identity) -> Vec<PoolView> {
    let f = ctx.fleet;
    f.pools
        .iter()
        .map(|p| {
            let nodes = &f.nodes[p.nodes.start as usize..p.nodes.end as usize];
            let states = &ctx.sched.engine.state().nodes[p.nodes.start as usize..p.nodes.end as usize];
            let used: u64 = states
                .iter()
                .flat_map(|s| s.gpus.iter())
                .map(|g| g.used_milli as u64)
                .sum();
            let gpus: u64 = nodes.iter().map(|n| n.gpus as u64).sum();
            let mut models: Vec<String> = nodes.iter().map(|n| f.catalogue.get(n.model).name.clone()).collect();
            models.sort();
            models.dedup();
            PoolView {
                name: p.name.clone(),
                sharing: p.sharing.to_string(),
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

pub fn nodes(ctx: &ViewCtx, _id: &Identity, pool: Option<&str>, node: Option<&str>) -> Vec<NodeView> {
    let f = ctx.fleet;
    f.nodes
        .iter()
        .zip(&ctx.sched.engine.state().nodes)
        .filter(|(n, _)| pool.is_none_or(|p| f.pool(n.pool).name == p) && node.is_none_or(|x| n.name == x))
        .map(|(n, s)| NodeView {
            name: n.name.clone(),
            pool: f.pool(n.pool).name.clone(),
            model: f.catalogue.get(n.model).name.clone(),
            gpus: n.gpus,
            nvlink: match n.topology {
                tessera_model::Topology::NvSwitch => "nvswitch",
                tessera_model::Topology::Pairs => "pairs",
                tessera_model::Topology::None => "none",
            }
            .into(),
            cpus: n.cpu_milli as f64 / 1000.0,
            cpus_free: s.cpu_free as f64 / 1000.0,
            memory_gib: n.memory_mib as f64 / 1024.0,
            memory_gib_free: s.mem_free as f64 / 1024.0,
            gpus_free: s.free_gpus() as u8,
            units_used: GpuUnits(s.gpus.iter().map(|g| g.used_milli as u64).sum()).to_string(),
        })
        .collect()
}

pub fn gpus(ctx: &ViewCtx, id: &Identity, pool: Option<&str>, node: Option<&str>) -> Vec<GpuView> {
    let f = ctx.fleet;
    let st = ctx.sched.engine.state();
    let mut out = Vec::new();
    for (ni, n) in f.nodes.iter().enumerate() {
        let p = f.pool(n.pool);
        if pool.is_some_and(|x| p.name != x) || node.is_some_and(|x| n.name != x) {
            continue;
        }
        let model = f.catalogue.get(n.model);
        for (gi, g) in st.nodes[ni].gpus.iter().enumerate() {
            let mut slices = Vec::new();
            for h in &g.holders {
                let Some(a) = st.allocations.get(h) else {
                    continue;
                };
                let (tenant, project, workload) = match ctx.workloads.get(h) {
                    Some(l) if id.can_read(&l.wl.tenant) => (l.wl.tenant.clone(), l.wl.project.clone(), *h),
                    Some(_) => ("(another tenant)".to_string(), String::new(), 0),
                    None => (String::new(), String::new(), *h),
                };
                let mut s = SliceView {
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
                match a.grant {
                    Grant::Whole { .. } => {
                        s.kind = "whole".into();
                        s.what = "whole".into();
                        s.units = "1".into();
                    }
                    Grant::Mig {
                        profile,
                        profile_id,
                        start,
                        size,
                        ..
                    } => {
                        s.kind = "mig".into();
                        s.what = model
                            .mig
                            .map(|geom| model.profile_name(&geom.profiles[profile as usize]))
                            .unwrap_or_default();
                        s.profile_id = Some(profile_id);
                        s.start = Some(start);
                        s.size = Some(size);
                        s.units = a.units.to_string();
                    }
                    Grant::Fraction { milli, .. } => {
                        s.kind = "fraction".into();
                        s.what = format!("{milli}m");
                        s.units = GpuUnits(milli as u64).to_string();
                    }
                    Grant::CpuOnly => continue,
                }
                slices.push(s);
            }
            let mig_slices = (p.sharing == Sharing::Mig).then(|| {
                let geom = model.mig.expect("MIG pool model");
                (0..geom.mem_slices)
                    .map(|i| if g.mig_mask >> i & 1 == 1 { '#' } else { '.' })
                    .collect()
            });
            out.push(GpuView {
                node: n.name.clone(),
                index: gi as u8,
                pool: p.name.clone(),
                model: model.name.clone(),
                sharing: p.sharing.to_string(),
                units_used: GpuUnits(g.used_milli as u64).to_string(),
                mig_slices,
                slices,
            });
        }
    }
    out
}
