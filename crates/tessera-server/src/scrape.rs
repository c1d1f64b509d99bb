//! `/metrics` in the Prometheus text format (version 0.0.4). On the API address it needs a
//! `metrics` (or `platform-admin`) token, since it names every tenant and project with their
//! use; on a port of its own (`tessera serve --metrics-listen`, for a private network) it is
//! open like any exporter.
//!
//! A scrape renders two kinds of series: the **event** series of [`Metrics`] (written by the
//! HTTP layer and the lifecycle loop, see [`crate::metrics`]), and **state** gauges computed
//! here at scrape time from the lifecycle's published [`Snapshot`] (never from inside the loop)
//! and the backend's latest telemetry: the fleet by pool, model and health, allocations, MIG
//! instances, the queue, quotas and budgets, and telemetry. Per-GPU telemetry is exported under
//! the DCGM exporter's metric and label names for fleets up to [`PER_GPU_SERIES_MAX`] GPUs;
//! larger fleets get per-pool aggregates instead (per-GPU series belong to the DCGM exporters
//! on the nodes there), so a scrape stays small at 80,000 GPUs.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::prometheus_text;
use prometheus_client::registry::Registry;
use tessera_backend::GpuSample;
use tessera_domain::Phase;
use tessera_model::Sharing;
use tessera_sched::Grant;
use tessera_store::NodeState;

use crate::lifecycle::{Snapshot, Telemetry};
use crate::metrics::{FGauge, Labels, Metrics, PER_GPU_SERIES_MAX, UNMATCHED_ROUTE, wait_label};
use crate::state::AppState;

/// What the `/metrics` handler needs besides the snapshot.
pub struct Observability {
    pub metrics: Arc<Metrics>,
    pub version: &'static str,
}

fn l(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

fn gauge(reg: &mut Registry, name: &str, help: &str, fam: FGauge) {
    reg.register(name, help, fam);
}

/// Per (pool, model).
#[derive(Default, Clone)]
struct PoolModel {
    gpus: u64,
    used_milli: u64,
    idle: u64,
    partial: u64,
    full: u64,
    fractions: u64,
}

/// Renders the whole exposition.
pub fn render(
    obs: &Observability,
    backend: &str,
    snap: &Snapshot,
    telemetry: &Telemetry,
    ops: &crate::lifecycle::FleetOps,
) -> String {
    let mut reg = Registry::default();
    obs.metrics.register(&mut reg);
    let f = &snap.fleet;

    let info = FGauge::default();
    info.get_or_create(&l(&[("version", obs.version), ("backend", backend)]))
        .set(1.0);
    gauge(
        &mut reg,
        "tessera_build_info",
        "Always 1: the running Tessera version and backend",
        info,
    );
    let uptime = FGauge::default();
    uptime
        .get_or_create(&Vec::new())
        .set(obs.metrics.started.elapsed().as_secs_f64());
    gauge(
        &mut reg,
        "tessera_uptime_seconds",
        "Seconds since this control plane started",
        uptime,
    );

    // GPU health from telemetry, by pool and model.
    let by_gpu: HashMap<(&str, u8), &GpuSample> =
        telemetry.gpus.iter().map(|s| ((s.node.as_str(), s.gpu), s)).collect();
    let (gpus, lost) = (FGauge::default(), FGauge::default());
    // (healthy, unhealthy, lost, cordoned: healthy GPUs of nodes not ready)
    let mut health: BTreeMap<(String, String), (u64, u64, u64, u64)> = BTreeMap::new();
    for n in &f.nodes {
        let key = (f.pool(n.pool).name.clone(), f.catalogue.get(n.model).name.clone());
        let e = health.entry(key).or_default();
        let out = ops.node_state(&n.name) != NodeState::Ready;
        for g in 0..n.gpus {
            if ops.unhealthy.contains_key(&(n.name.clone(), g)) {
                e.1 += 1;
                continue;
            }
            match by_gpu.get(&(n.name.as_str(), g)) {
                Some(s) if s.xid == 0 && out => e.3 += 1,
                Some(s) if s.xid == 0 => e.0 += 1,
                Some(_) => e.1 += 1,
                // No telemetry yet at all: not counted as lost.
                None if telemetry.at == 0 && out => e.3 += 1,
                None if telemetry.at == 0 => e.0 += 1,
                None => {
                    e.1 += 1;
                    e.2 += 1;
                }
            }
        }
    }
    for ((pool, model), (healthy, unhealthy, gone, cordoned)) in &health {
        for (state, v) in [
            ("healthy", *healthy),
            ("unhealthy", *unhealthy),
            ("cordoned", *cordoned),
        ] {
            gpus.get_or_create(&l(&[("pool", pool), ("model", model), ("state", state)]))
                .set(v as f64);
        }
        lost.get_or_create(&l(&[("pool", pool), ("model", model)]))
            .set(*gone as f64);
    }
    // Nodes by pool and operator state; every state exists from the start.
    let node_states = FGauge::default();
    let mut by_state: BTreeMap<(String, &str), u64> = BTreeMap::new();
    for p in &f.pools {
        for st in NodeState::ALL {
            by_state.insert((p.name.clone(), st.as_str()), 0);
        }
    }
    for n in &f.nodes {
        let st = ops.node_state(&n.name).as_str();
        *by_state.entry((f.pool(n.pool).name.clone(), st)).or_default() += 1;
    }
    for ((pool, st), v) in &by_state {
        node_states
            .get_or_create(&l(&[("pool", pool), ("state", st)]))
            .set(*v as f64);
    }
    gauge(
        &mut reg,
        "tessera_nodes",
        "Nodes by pool and operator state: ready, cordoned (no new placement), draining, maintenance (drained)",
        node_states,
    );
    // Rolling upgrades: those running, and the latest one whatever its state (a bounded set).
    let (rollout_nodes, rollout_progress) = (FGauge::default(), FGauge::default());
    let latest = ops.rollouts.keys().next_back().copied();
    for r in ops.rollouts.values() {
        if r.state != tessera_store::RolloutState::Running && Some(r.id) != latest {
            continue;
        }
        let id = r.id.to_string();
        let mut done = 0;
        for st in tessera_store::RolloutNodeState::ALL {
            let n = r.nodes.iter().filter(|x| x.state == st).count();
            if st == tessera_store::RolloutNodeState::Done {
                done = n;
            }
            rollout_nodes
                .get_or_create(&l(&[("rollout", &id), ("pool", &r.pool), ("state", st.as_str())]))
                .set(n as f64);
        }
        let ratio = if r.nodes.is_empty() {
            1.0
        } else {
            done as f64 / r.nodes.len() as f64
        };
        rollout_progress
            .get_or_create(&l(&[("rollout", &id), ("pool", &r.pool), ("state", r.state.as_str())]))
            .set(ratio);
    }
    gauge(
        &mut reg,
        "tessera_rollout_nodes",
        "Nodes of a rolling upgrade (running ones and the latest) by state: pending, draining, upgrading, validating, done, failed",
        rollout_nodes,
    );
    gauge(
        &mut reg,
        "tessera_rollout_progress_ratio",
        "Share of a rolling upgrade's nodes done (0 to 1), labelled with the rollout's state: running, done, failed, cancelled",
        rollout_progress,
    );
    gauge(
        &mut reg,
        "tessera_gpus",
        "GPUs by pool, model and state: healthy, unhealthy (marked unhealthy, an XID error reported by telemetry, or no telemetry), cordoned (healthy, on a node cordoned, draining or in maintenance)",
        gpus,
    );
    gauge(
        &mut reg,
        "tessera_gpus_lost",
        "GPUs of the fleet the backend reports no telemetry for",
        lost,
    );

    let owners = render_fleet(&mut reg, snap);
    render_queue_and_quotas(&mut reg, snap);
    if f.gpu_count() <= PER_GPU_SERIES_MAX {
        render_dcgm(&mut reg, &telemetry.gpus, &owners);
    } else {
        render_telemetry_aggregates(&mut reg, snap, &telemetry.gpus);
    }

    let mut out = String::with_capacity(1 << 16);
    prometheus_text::encode(&mut out, &reg).expect("writing to a String cannot fail");
    out
}

/// Who holds each GPU and each workload, for the DCGM series' `tenant` and `project` labels.
#[derive(Default)]
struct Owners {
    /// (node, gpu) → (tenant, project) of its holders ("" when mixed), and the workloads the
    /// engine booked on it.
    gpu: HashMap<(String, u8), GpuOwner>,
    /// workload → (tenant, project).
    workload: HashMap<u64, (String, String)>,
}

/// (tenant, project) of a GPU's holders, and the workloads the engine booked on it.
type GpuOwner = ((String, String), Vec<u64>);

fn render_fleet(reg: &mut Registry, s: &Snapshot) -> Owners {
    let f = &s.fleet;
    let small = f.gpu_count() <= PER_GPU_SERIES_MAX;
    let mut owners = Owners::default();
    let mut pool_models: BTreeMap<(String, String), PoolModel> = BTreeMap::new();
    let mut frag: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut mig: BTreeMap<(String, String, String), u64> = BTreeMap::new();
    let mut tenant_alloc: BTreeMap<(String, String, String), u64> = BTreeMap::new();
    for p in &f.pools {
        let (mut whole_free, mut all_free) = (0u64, 0u64);
        for ni in p.nodes.start as usize..p.nodes.end as usize {
            let n = &f.nodes[ni];
            let model = f.catalogue.get(n.model);
            let ns = &s.nodes[ni];
            let pm = pool_models.entry((p.name.clone(), model.name.clone())).or_default();
            let node_free: u64 = ns.gpus.iter().map(|g| 1000 - g.used_milli.min(1000) as u64).sum();
            all_free += node_free;
            if p.sharing == Sharing::Whole {
                if ns.gpus.iter().all(|g| g.holders.is_empty()) {
                    whole_free += node_free;
                }
            } else {
                whole_free += ns.gpus.iter().filter(|g| g.holders.is_empty()).count() as u64 * 1000;
            }
            if let Some(geom) = model.mig.filter(|_| p.sharing == Sharing::Mig) {
                for prof in geom.profiles {
                    mig.entry((p.name.clone(), model.name.clone(), model.profile_name(prof)))
                        .or_insert(0);
                }
            }
            for (gi, g) in ns.gpus.iter().enumerate() {
                pm.gpus += 1;
                pm.used_milli += g.used_milli as u64;
                match g.used_milli {
                    0 if g.holders.is_empty() => pm.idle += 1,
                    1000.. => pm.full += 1,
                    _ => pm.partial += 1,
                }
                let mut owner: Option<(String, String)> = None;
                let mut mixed = (false, false);
                for h in &g.holders {
                    match h.grant {
                        Grant::Mig { profile, .. } => {
                            if let Some(geom) = model.mig {
                                let name = model.profile_name(&geom.profiles[profile as usize]);
                                *mig.entry((p.name.clone(), model.name.clone(), name)).or_insert(0) += 1;
                            }
                        }
                        Grant::Fraction { .. } => pm.fractions += 1,
                        _ => {}
                    }
                    if h.tenant.is_empty() {
                        continue;
                    }
                    if let Some((t, pr)) = &owner {
                        mixed.0 |= *t != h.tenant;
                        mixed.1 |= *pr != h.project;
                    }
                    owner = Some((h.tenant.clone(), h.project.clone()));
                    if small {
                        owners
                            .workload
                            .insert(h.workload, (h.tenant.clone(), h.project.clone()));
                    }
                }
                // A gang holds several GPUs: count it once, at its first.
                for h in g.holders.iter().filter(|h| !h.tenant.is_empty()) {
                    if h.grant.gpu_mask().trailing_zeros() == gi as u32 {
                        *tenant_alloc
                            .entry((h.tenant.clone(), p.name.clone(), model.name.clone()))
                            .or_insert(0) += h.units.as_milli();
                    }
                }
                if let (Some((t, pr)), true) = (owner, small) {
                    let t = if mixed.0 { String::new() } else { t };
                    let pr = if mixed.0 || mixed.1 { String::new() } else { pr };
                    let booked = g.holders.iter().map(|h| h.workload).collect();
                    owners.gpu.insert((n.name.clone(), gi as u8), ((t, pr), booked));
                }
            }
        }
        frag.insert(p.name.clone(), (whole_free, all_free));
    }
    let (alloc, free, cap, occ, by_occ, fractions) = (
        FGauge::default(),
        FGauge::default(),
        FGauge::default(),
        FGauge::default(),
        FGauge::default(),
        FGauge::default(),
    );
    for ((pool, model), pm) in &pool_models {
        let lb = l(&[("pool", pool), ("model", model)]);
        let capacity = pm.gpus as f64;
        let used = pm.used_milli as f64 / 1000.0;
        alloc.get_or_create(&lb).set(used);
        free.get_or_create(&lb).set(capacity - used);
        cap.get_or_create(&lb).set(capacity);
        occ.get_or_create(&lb)
            .set(if capacity > 0.0 { used / capacity } else { 0.0 });
        for (o, v) in [("idle", pm.idle), ("partial", pm.partial), ("full", pm.full)] {
            by_occ
                .get_or_create(&l(&[("pool", pool), ("model", model), ("occupancy", o)]))
                .set(v as f64);
        }
        fractions.get_or_create(&lb).set(pm.fractions as f64);
    }
    gauge(
        reg,
        "tessera_gpu_units_allocated",
        "GPU units allocated, by pool and model (1 = one whole GPU)",
        alloc,
    );
    gauge(reg, "tessera_gpu_units_free", "GPU units free, by pool and model", free);
    gauge(
        reg,
        "tessera_gpu_units_capacity",
        "GPU units in the fleet, by pool and model",
        cap,
    );
    gauge(
        reg,
        "tessera_gpu_occupancy_ratio",
        "Allocated share of the GPU units, by pool and model (0..1)",
        occ,
    );
    gauge(
        reg,
        "tessera_gpus_by_occupancy",
        "GPUs by occupancy: idle (nothing on it), partial (MIG instances or fractions, room left), full",
        by_occ,
    );
    gauge(
        reg,
        "tessera_fraction_shares",
        "Time-sliced fractions placed, by pool and model",
        fractions,
    );
    let fr = FGauge::default();
    for (pool, (whole_free, all_free)) in &frag {
        let r = if *all_free == 0 {
            0.0
        } else {
            1.0 - *whole_free as f64 / *all_free as f64
        };
        fr.get_or_create(&l(&[("pool", pool)])).set(r);
    }
    gauge(
        reg,
        "tessera_pool_fragmentation_ratio",
        "Share of a pool's free GPU units that are not in whole free units: free GPUs on partly used nodes (whole pools), free slices on partly used GPUs (MIG and shared pools)",
        fr,
    );
    let m = FGauge::default();
    for ((pool, model, profile), n) in &mig {
        m.get_or_create(&l(&[("pool", pool), ("model", model), ("profile", profile)]))
            .set(*n as f64);
    }
    gauge(
        reg,
        "tessera_mig_instances",
        "MIG instances by pool, model and profile",
        m,
    );
    let ta = FGauge::default();
    for ((tenant, pool, model), milli) in &tenant_alloc {
        ta.get_or_create(&l(&[("tenant", tenant), ("pool", pool), ("model", model)]))
            .set(*milli as f64 / 1000.0);
    }
    gauge(
        reg,
        "tessera_tenant_gpu_units_allocated",
        "GPU units allocated, by tenant, pool and model",
        ta,
    );
    owners
}

fn render_queue_and_quotas(reg: &mut Registry, s: &Snapshot) {
    let (depth, oldest) = (FGauge::default(), FGauge::default());
    for ((tenant, class, priority), (n, since)) in &s.queue.depth {
        let lb = l(&[("tenant", tenant), ("class", class), ("priority", priority)]);
        depth.get_or_create(&lb).set(*n as f64);
        oldest.get_or_create(&lb).set((s.at - since).max(0) as f64 / 1000.0);
    }
    gauge(
        reg,
        "tessera_queue_depth",
        "Requests waiting, by tenant, resource class and priority class",
        depth,
    );
    gauge(
        reg,
        "tessera_queue_oldest_wait_seconds",
        "Age of the oldest waiting request, by tenant, resource class and priority class",
        oldest,
    );
    let blocked = FGauge::default();
    let mut by_label: BTreeMap<(String, &'static str), u64> = BTreeMap::new();
    for ((class, code), n) in &s.queue.blocked {
        *by_label.entry((class.clone(), wait_label(*code))).or_insert(0) += n;
    }
    for ((class, reason), n) in &by_label {
        blocked
            .get_or_create(&l(&[("pool", class), ("reason", reason)]))
            .set(*n as f64);
    }
    // Stable series for the reasons alerts look at.
    for p in &s.fleet.pools {
        for r in ["fragmentation", "no-capacity"] {
            let _ = blocked.get_or_create(&l(&[("pool", &p.name), ("reason", r)]));
        }
    }
    gauge(
        reg,
        "tessera_queue_blocked",
        "Requests waiting, by the pool they wait for (`any` when several can serve them) and why",
        blocked,
    );
    let states = FGauge::default();
    for p in Phase::ALL.into_iter().filter(|p| !p.is_terminal()) {
        // `partitioned` is part of `placed` in the API's states.
        if p == Phase::Partitioned {
            continue;
        }
        let mut n = s.phases.get(&p).copied().unwrap_or(0);
        if p == Phase::Placed {
            n += s.phases.get(&Phase::Partitioned).copied().unwrap_or(0);
        }
        states.get_or_create(&l(&[("state", p.as_str())])).set(n as f64);
    }
    gauge(
        reg,
        "tessera_workloads",
        "Live workloads by state (ended ones: tessera_workloads_ended_total)",
        states,
    );
    let (qg, ql, qu, qb) = (
        FGauge::default(),
        FGauge::default(),
        FGauge::default(),
        FGauge::default(),
    );
    let (bb, bs, br) = (FGauge::default(), FGauge::default(), FGauge::default());
    for (tenant, t) in s.tenants.iter() {
        for (class, q, used) in &t.quotas {
            let lb = l(&[("tenant", tenant), ("class", class)]);
            qg.get_or_create(&lb).set(q.guaranteed.as_f64());
            if let Some(x) = q.limit {
                ql.get_or_create(&lb).set(x.as_f64());
            }
            qu.get_or_create(&lb).set(used.as_f64());
            qb.get_or_create(&lb)
                .set((used.as_f64() - q.guaranteed.as_f64()).max(0.0));
        }
        // Budgets are set in GPU-unit-hours; exported in the base unit, seconds, like metering.
        if let Some((b, spent)) = t.budget {
            let lb = l(&[("tenant", tenant)]);
            bb.get_or_create(&lb).set(b * 3600.0);
            bs.get_or_create(&lb).set(spent * 3600.0);
            br.get_or_create(&lb).set((b - spent).max(0.0) * 3600.0);
        }
    }
    gauge(
        reg,
        "tessera_quota_guaranteed_gpu_units",
        "Guaranteed GPU units of a tenant's quota, by resource class",
        qg,
    );
    gauge(
        reg,
        "tessera_quota_limit_gpu_units",
        "Limit of a tenant's quota in GPU units (absent: no limit)",
        ql,
    );
    gauge(
        reg,
        "tessera_quota_used_gpu_units",
        "GPU units a tenant holds in a resource class with a quota",
        qu,
    );
    gauge(
        reg,
        "tessera_quota_borrowed_gpu_units",
        "GPU units a tenant holds above its guarantee (preemptible by reclaim)",
        qb,
    );
    gauge(
        reg,
        "tessera_budget_gpu_unit_seconds",
        "A tenant's monthly budget in GPU-unit-seconds (GPU-unit-hours × 3600)",
        bb,
    );
    gauge(
        reg,
        "tessera_budget_spent_gpu_unit_seconds",
        "GPU-unit-seconds a tenant has used this month",
        bs,
    );
    gauge(
        reg,
        "tessera_budget_remaining_gpu_unit_seconds",
        "GPU-unit-seconds left of a tenant's monthly budget",
        br,
    );
}

/// Per-GPU and per-MIG-instance telemetry under the DCGM exporter's names and labels, plus
/// `tenant` and `project` of the holders (fleets up to [`PER_GPU_SERIES_MAX`] GPUs).
fn render_dcgm(reg: &mut Registry, telemetry: &[GpuSample], owners: &Owners) {
    let names = [
        ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)"),
        ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)"),
        ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)"),
        ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)"),
        ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)"),
        ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered"),
        (
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "Ratio of time the graphics engine is active (in %)",
        ),
    ];
    let fams: Vec<FGauge> = names.iter().map(|_| FGauge::default()).collect();
    let empty = (String::new(), String::new());
    let named = tessera_backend::named_workloads(telemetry);
    for s in telemetry {
        // Whoever the backend says holds the GPU (a pod the exporter maps to it), else whoever
        // the engine booked on it, unless the backend saw them on another GPU (a device plugin
        // picks the devices itself).
        let held_by = s.whole_holders().next().and_then(|w| owners.workload.get(&w));
        let booked_here = || {
            let (owner, booked) = owners.gpu.get(&(s.node.clone(), s.gpu))?;
            let here = (s.node.as_str(), s.gpu);
            let moved = booked.iter().any(|h| named.get(h).is_some_and(|at| *at != here));
            (!moved).then_some(owner)
        };
        let (tenant, project) = held_by.or_else(booked_here).unwrap_or(&empty);
        let base = |extra: &[(&'static str, String)], tenant: &str, project: &str| -> Labels {
            let mut v: Labels = vec![
                ("gpu", s.gpu.to_string()),
                ("UUID", s.uuid.clone()),
                ("device", format!("nvidia{}", s.gpu)),
                ("modelName", s.model.clone()),
            ];
            v.extend(extra.iter().cloned());
            v.push(("Hostname", s.node.clone()));
            v.push(("tenant", tenant.to_string()));
            v.push(("project", project.to_string()));
            v
        };
        let g = base(&[], tenant, project);
        let values = [
            s.util_pct,
            s.fb_used_mib as f64,
            s.fb_free_mib as f64,
            s.temp_c,
            s.power_w,
            s.xid as f64,
            s.util_pct / 100.0,
        ];
        for (fam, v) in fams.iter().zip(values) {
            fam.get_or_create(&g).set(v);
        }
        // MIG instances: GPU_UTIL is not defined per instance; engine activity and framebuffer are.
        for i in s.instances.iter().filter(|i| !i.profile.is_empty()) {
            let (t, p) = owners.workload.get(&i.workload).cloned().unwrap_or_default();
            let lb = base(
                &[
                    ("GPU_I_PROFILE", i.profile.clone()),
                    ("GPU_I_ID", i.instance_id.to_string()),
                ],
                &t,
                &p,
            );
            fams[1].get_or_create(&lb).set(i.fb_used_mib as f64);
            fams[2].get_or_create(&lb).set(i.fb_free_mib as f64);
            fams[6].get_or_create(&lb).set(i.gr_engine_active);
        }
    }
    for ((name, help), fam) in names.iter().zip(fams) {
        reg.register(*name, *help, fam);
    }
}

/// Telemetry of a large fleet, aggregated per pool and model.
fn render_telemetry_aggregates(reg: &mut Registry, snap: &Snapshot, telemetry: &[GpuSample]) {
    let f = &snap.fleet;
    let pool_of: HashMap<&str, &str> = f
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), f.pool(n.pool).name.as_str()))
        .collect();
    /// Per pool and model.
    #[derive(Default)]
    struct Agg {
        sampled: u64,
        util_pct: f64,
        fb_used_mib: f64,
        with_xid: u64,
        max_temp_c: f64,
    }
    let mut agg: BTreeMap<(&str, &str), Agg> = BTreeMap::new();
    for s in telemetry {
        let Some(pool) = pool_of.get(s.node.as_str()) else {
            continue;
        };
        let e = agg.entry((pool, s.model.as_str())).or_default();
        e.sampled += 1;
        e.util_pct += s.util_pct;
        e.fb_used_mib += s.fb_used_mib as f64;
        e.with_xid += (s.xid != 0) as u64;
        e.max_temp_c = e.max_temp_c.max(s.temp_c);
    }
    let (util, fb, xid, temp) = (
        FGauge::default(),
        FGauge::default(),
        FGauge::default(),
        FGauge::default(),
    );
    for ((pool, model), a) in &agg {
        let lb = l(&[("pool", pool), ("model", model)]);
        util.get_or_create(&lb).set(if a.sampled > 0 {
            a.util_pct / a.sampled as f64
        } else {
            0.0
        });
        fb.get_or_create(&lb).set(a.fb_used_mib);
        xid.get_or_create(&lb).set(a.with_xid as f64);
        temp.get_or_create(&lb).set(a.max_temp_c);
    }
    gauge(
        reg,
        "tessera_gpu_utilization_percent",
        "Mean GPU utilisation by pool and model (fleets too large for per-GPU series)",
        util,
    );
    gauge(
        reg,
        "tessera_gpu_fb_used_mib",
        "Framebuffer in use by pool and model, MiB (fleets too large for per-GPU series)",
        fb,
    );
    gauge(
        reg,
        "tessera_gpus_with_xid",
        "GPUs whose last telemetry reported an XID error, by pool and model",
        xid,
    );
    gauge(
        reg,
        "tessera_gpu_temperature_max_celsius",
        "Hottest GPU by pool and model, °C",
        temp,
    );
}

/// `GET /metrics`.
pub async fn scrape(State(s): State<AppState>) -> Response {
    let obs = s.obs.clone();
    let snap = s.lifecycle.snapshot();
    let telemetry = s.lifecycle.published().telemetry();
    let ops = s.lifecycle.published().ops();
    let backend = s.backend_name;
    let body = tokio::task::spawn_blocking(move || render(&obs, backend, &snap, &telemetry, &ops)).await;
    match body {
        Ok(b) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, prometheus_text::CONTENT_TYPE)],
            b,
        )
            .into_response(),
        Err(e) => crate::problem::ApiError::internal(format!("rendering metrics: {e}")).into_response(),
    }
}

/// `/metrics` on the API address: for `metrics` and `platform-admin` tokens.
pub async fn scrape_authorised(_: crate::auth::MetricsReader, s: State<AppState>) -> Response {
    scrape(s).await
}

/// Times every HTTP request by its matched route template (not the raw path).
pub async fn track(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().as_str().to_string();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_else(|| UNMATCHED_ROUTE.to_string());
    let resp = next.run(req).await;
    s.obs
        .metrics
        .api_request(&method, &route, resp.status().as_u16(), started.elapsed());
    resp
}

/// A router serving only `/metrics`, for a listener of its own.
pub fn router(state: AppState) -> axum::Router {
    axum::Router::new()
        .route("/metrics", axum::routing::get(scrape))
        .with_state(state)
}
