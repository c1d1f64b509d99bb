//! Prometheus metrics: `/metrics` in the Prometheus text format (version 0.0.4), on the API port
//! without authentication like any exporter, and optionally on a port of its own
//! (`tessera serve --metrics-listen`).
//!
//! Two kinds of series:
//!
//! * **events** — counters and histograms updated where things happen: API requests (by
//!   matched route template, method and status), store batch commits, scheduler cycles,
//!   lifecycle steps, refusals, preemptions, ended workloads, metered GPU-unit-seconds. They live
//!   in [`Metrics`], shared by the HTTP layer and the lifecycle loop.
//! * **state** — gauges computed at scrape time from the lifecycle loop's state (through
//!   [`crate::controller::Controller::view`]), the quota and budget records, and the backend's
//!   telemetry: the fleet by pool, model and health, allocations, MIG instances, the queue,
//!   quotas and budgets, and per-GPU telemetry under the DCGM exporter's metric and label names.
//!
//! Label values are bounded: pools, models, MIG profiles, tenants, projects, resource classes,
//! priority classes, states and reason categories, GPUs of the fleet. No workload ID ever
//! becomes a label value.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tessera_api::{Workload, WorkloadState};
use tessera_backend::{Backend, BackendError, GpuSample, SimBackend};
use tessera_model::{Fleet, Sharing};
use tessera_sched::Grant;
use tessera_sched::reason::{PreemptCause, Refusal};

use crate::AppState;
use crate::controller::ViewCtx;

/// A label set: (name, value) pairs in a fixed order.
pub type Labels = Vec<(&'static str, String)>;
type Hist = Family<Labels, Histogram, fn() -> Histogram>;
type FCounter = Family<Labels, Counter<f64, AtomicU64>>;
type FGauge = Family<Labels, Gauge<f64, AtomicU64>>;

const API_BUCKETS: [f64; 11] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];
const STEP_BUCKETS: [f64; 12] = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 60.0, 300.0, 3600.0];
const R2R_BUCKETS: [f64; 14] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0,
];
const STORE_BUCKETS: [f64; 11] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];
const CYCLE_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

fn api_hist() -> Histogram {
    Histogram::new(API_BUCKETS)
}
fn step_hist() -> Histogram {
    Histogram::new(STEP_BUCKETS)
}
fn r2r_hist() -> Histogram {
    Histogram::new(R2R_BUCKETS)
}

/// Every route the API serves is a template; requests no route matched share one label value.
pub const UNMATCHED_ROUTE: &str = "(unmatched)";

/// The event-driven series (counters and histograms).
pub struct Metrics {
    api: Hist,
    store_commit: Histogram,
    store_failures: Counter,
    cycle: Histogram,
    steps: Hist,
    request_to_running: Hist,
    refusals: Family<Labels, Counter>,
    preemptions: Family<Labels, Counter>,
    ended: Family<Labels, Counter>,
    backend_errors: Family<Labels, Counter>,
    allocated: FCounter,
    measured: FCounter,
    started: Instant,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let m = Metrics {
            api: Family::new_with_constructor(api_hist),
            store_commit: Histogram::new(STORE_BUCKETS),
            store_failures: Counter::default(),
            cycle: Histogram::new(CYCLE_BUCKETS),
            steps: Family::new_with_constructor(step_hist),
            request_to_running: Family::new_with_constructor(r2r_hist),
            refusals: Family::default(),
            preemptions: Family::default(),
            ended: Family::default(),
            backend_errors: Family::default(),
            allocated: Family::default(),
            measured: Family::default(),
            started: Instant::now(),
        };
        // Series that alerts and dashboards expect exist from the start, at zero.
        for r in REFUSAL_REASONS {
            let _ = m.refusals.get_or_create(&vec![("reason", r.to_string())]);
        }
        for r in ["priority", "reclaim"] {
            let _ = m.preemptions.get_or_create(&vec![("reason", r.to_string())]);
        }
        for s in ["succeeded", "failed", "cancelled", "preempted"] {
            let _ = m.ended.get_or_create(&vec![("state", s.to_string())]);
        }
        for op in ["partition", "start", "stop", "unpartition"] {
            for kind in ["unreachable", "rejected"] {
                let _ = m
                    .backend_errors
                    .get_or_create(&vec![("op", op.to_string()), ("kind", kind.to_string())]);
            }
        }
        m
    }

    /// One API request: its matched route template, method, status and latency.
    pub fn api_request(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        let method = match method {
            "GET" | "POST" | "PUT" | "DELETE" | "PATCH" | "HEAD" | "OPTIONS" => method,
            _ => "other",
        };
        self.api
            .get_or_create(&vec![
                ("method", method.to_string()),
                ("route", route.to_string()),
                ("status", status.to_string()),
            ])
            .observe(elapsed.as_secs_f64());
    }

    /// One batch commit of the lifecycle loop to the store.
    pub fn store_commit(&self, elapsed: Duration, ok: bool) {
        self.store_commit.observe(elapsed.as_secs_f64());
        if !ok {
            self.store_failures.inc();
        }
    }

    /// One scheduler cycle over the queue.
    pub fn scheduler_cycle(&self, elapsed: Duration) {
        self.cycle.observe(elapsed.as_secs_f64());
    }

    /// A lifecycle step took `ms` milliseconds: `authorise`, `place` (request to placement,
    /// queueing included), `partition`, `start`, `stop`.
    pub fn step(&self, step: &'static str, ms: i64) {
        self.steps
            .get_or_create(&vec![("step", step.to_string())])
            .observe(ms.max(0) as f64 / 1000.0);
    }

    /// The same, timed by the caller.
    pub fn step_elapsed(&self, step: &'static str, elapsed: Duration) {
        self.steps
            .get_or_create(&vec![("step", step.to_string())])
            .observe(elapsed.as_secs_f64());
    }

    /// A workload reached `running`.
    pub fn running(&self, pool: &str, request_to_running_ms: i64) {
        self.request_to_running
            .get_or_create(&vec![("pool", pool.to_string())])
            .observe(request_to_running_ms.max(0) as f64 / 1000.0);
    }

    /// A request was refused for good (at submission or later in the queue).
    pub fn refused(&self, reason: &Refusal) {
        let code = reason.code();
        let label = REFUSAL_REASONS.iter().find(|r| **r == code).copied().unwrap_or("other");
        self.refusals.get_or_create(&vec![("reason", label.to_string())]).inc();
    }

    /// A running workload is being preempted (`priority` or `reclaim`).
    pub fn preempted(&self, cause: &PreemptCause) {
        self.preemptions
            .get_or_create(&vec![("reason", cause.code().to_string())])
            .inc();
    }

    /// A workload reached a terminal state.
    pub fn ended(&self, state: WorkloadState) {
        self.ended
            .get_or_create(&vec![("state", state.as_str().to_string())])
            .inc();
    }

    /// A backend call failed.
    pub fn backend_error(&self, op: &'static str, e: &BackendError) {
        let kind = match e {
            BackendError::Unreachable(_) => "unreachable",
            BackendError::Rejected(_) => "rejected",
        };
        self.backend_errors
            .get_or_create(&vec![("op", op.to_string()), ("kind", kind.to_string())])
            .inc();
    }

    /// Metering, called for each telemetry sample of a GPU a running workload holds, every
    /// `dt_ms`: the workload's share of the GPU × time (allocated), and × the measured
    /// utilisation (measured), in GPU-unit-seconds by tenant and resource class `pool/MODEL`.
    pub fn meter(&self, wl: &Workload, util: f64, dt_ms: f64) {
        let Some(a) = &wl.allocation else { return };
        if a.units_milli == 0 || a.gpus.is_empty() {
            return;
        }
        let units = a.units_milli as f64 / 1000.0 / a.gpus.len() as f64;
        let labels = vec![
            ("tenant", wl.tenant.clone()),
            ("class", format!("{}/{}", a.pool, a.model)),
        ];
        let secs = dt_ms / 1000.0;
        self.allocated.get_or_create(&labels).inc_by(units * secs);
        self.measured
            .get_or_create(&labels)
            .inc_by(units * secs * util.clamp(0.0, 1.0));
    }

    fn register(&self, reg: &mut Registry) {
        reg.register(
            "tessera_api_request_duration_seconds",
            "API request latency by matched route template, method and HTTP status",
            self.api.clone(),
        );
        reg.register(
            "tessera_store_commit_duration_seconds",
            "Time of each batch commit of the lifecycle loop to the store",
            self.store_commit.clone(),
        );
        reg.register(
            "tessera_store_commit_failures",
            "Batch commits the store refused (the loop then rebuilds its state from the store)",
            self.store_failures.clone(),
        );
        reg.register(
            "tessera_scheduler_cycle_duration_seconds",
            "Time of each scheduler cycle over the queue",
            self.cycle.clone(),
        );
        reg.register(
            "tessera_lifecycle_step_duration_seconds",
            "Duration of lifecycle steps: authorise, place (request to placement, queueing included), partition, start, stop",
            self.steps.clone(),
        );
        reg.register(
            "tessera_request_to_running_seconds",
            "Time from request to running, by pool",
            self.request_to_running.clone(),
        );
        reg.register(
            "tessera_refusals",
            "Requests refused for good, by reason",
            self.refusals.clone(),
        );
        reg.register(
            "tessera_preemptions",
            "Workloads preempted, by reason (priority, reclaim of a guaranteed share)",
            self.preemptions.clone(),
        );
        reg.register(
            "tessera_workloads_ended",
            "Workloads that reached a terminal state, by state",
            self.ended.clone(),
        );
        reg.register(
            "tessera_backend_errors",
            "Failed backend calls by operation and kind (unreachable, rejected)",
            self.backend_errors.clone(),
        );
        reg.register(
            "tessera_gpu_unit_seconds_allocated",
            "Metered GPU-unit-seconds allocated to running workloads, by tenant and resource class",
            self.allocated.clone(),
        );
        reg.register(
            "tessera_gpu_unit_seconds_measured",
            "Metered GPU-unit-seconds weighted by measured utilisation, by tenant and resource class",
            self.measured.clone(),
        );
    }
}

/// The reason categories of refusals.
pub const REFUSAL_REASONS: [&str; 7] = [
    "constraint",
    "quota",
    "budget",
    "fragmentation",
    "no-capacity",
    "isolation",
    "other",
];

/// The `tessera_queue_blocked` label of a waiting workload, from its reason code
/// (`Wait::code`, `requeued`, or none yet).
pub fn blocked_label(code: Option<&str>) -> &'static str {
    match code {
        None => "pending",
        // `held` (it fits only where a reservation holds capacity for a long-waiting request)
        // is a capacity problem to an operator, and the alerts and dashboards read it so.
        Some("held") => "no-capacity",
        // Preempted work back in the queue waits out its backoff first.
        Some("requeued") => "backoff",
        Some(c) => WAIT_REASONS.iter().find(|r| **r == c).copied().unwrap_or("other"),
    }
}

/// The reason categories of waiting requests.
const WAIT_REASONS: [&str; 9] = [
    "pending",
    "fragmentation",
    "no-capacity",
    "isolation",
    "budget",
    "quota",
    "preemption",
    "backoff",
    "other",
];

/// What the `/metrics` handler needs besides the lifecycle loop.
pub struct Observability {
    pub metrics: Arc<Metrics>,
    pub backend: Arc<dyn Backend>,
    /// The simulated backend, when that is the backend (fault injection).
    pub sim: Option<Arc<SimBackend>>,
    pub version: &'static str,
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

/// A quota and its use, GPU units.
struct QuotaUse {
    guaranteed: f64,
    limit: Option<f64>,
    used: f64,
    borrowed: f64,
}

/// The state gauges, computed inside the lifecycle loop.
#[derive(Default)]
pub struct Snapshot {
    pool_models: BTreeMap<(String, String), PoolModel>,
    /// pool → (free milli in "whole" form: free nodes for whole pools, free GPUs otherwise; all free milli).
    frag: BTreeMap<String, (u64, u64)>,
    mig: BTreeMap<(String, String, String), u64>,
    tenant_alloc: BTreeMap<(String, String, String), u64>,
    /// (tenant, class, priority) → (depth, oldest submission ms).
    queue: BTreeMap<(String, String, String), (u64, i64)>,
    blocked: BTreeMap<(String, String), u64>,
    states: BTreeMap<&'static str, u64>,
    /// (tenant, class) → quota and use.
    quotas: BTreeMap<(String, String), QuotaUse>,
    /// tenant → (budget, spent), GPU-unit-hours.
    budgets: BTreeMap<String, (f64, f64)>,
    /// (node, gpu) → (tenant, project) of the GPU's holders ("" when none or mixed).
    gpu_owner: HashMap<(String, u8), (String, String)>,
    /// workload → (tenant, project), for workloads holding GPUs.
    owner: HashMap<u64, (String, String)>,
    now: i64,
}

impl Snapshot {
    /// Reads the loop's state. `tenants`: tenants with quota or budget records.
    pub fn take(ctx: &ViewCtx, tenants: &[String]) -> Snapshot {
        let f = ctx.fleet;
        let st = ctx.sched.engine.state();
        let mut s = Snapshot {
            now: ctx.now,
            ..Default::default()
        };
        let owner_of = |id: &u64| {
            ctx.workloads
                .get(id)
                .map(|l| (l.wl.tenant.clone(), l.wl.project.clone()))
        };
        for p in &f.pools {
            let (mut whole_free, mut all_free) = (0u64, 0u64);
            for ni in p.nodes.start as usize..p.nodes.end as usize {
                let n = &f.nodes[ni];
                let model = f.catalogue.get(n.model);
                let ns = &st.nodes[ni];
                let pm = s.pool_models.entry((p.name.clone(), model.name.clone())).or_default();
                let node_free: u64 = ns.gpus.iter().map(|g| g.free_milli() as u64).sum();
                all_free += node_free;
                if p.sharing == Sharing::Whole {
                    if ns.gpus.iter().all(|g| g.is_free()) {
                        whole_free += node_free;
                    }
                } else {
                    whole_free += ns.gpus.iter().filter(|g| g.is_free()).count() as u64 * 1000;
                }
                if let Some(geom) = model.mig.filter(|_| p.sharing == Sharing::Mig) {
                    for prof in geom.profiles {
                        s.mig
                            .entry((p.name.clone(), model.name.clone(), model.profile_name(prof)))
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
                    let mut tenant: Option<String> = None;
                    let mut project: Option<String> = None;
                    let mut mixed = (false, false);
                    for h in &g.holders {
                        let Some(a) = st.allocations.get(h) else { continue };
                        match a.grant {
                            Grant::Mig { profile, .. } => {
                                if let Some(geom) = model.mig {
                                    let name = model.profile_name(&geom.profiles[profile as usize]);
                                    *s.mig.entry((p.name.clone(), model.name.clone(), name)).or_insert(0) += 1;
                                }
                            }
                            Grant::Fraction { .. } => pm.fractions += 1,
                            _ => {}
                        }
                        if let Some((t, pr)) = owner_of(h) {
                            if tenant.as_ref().is_some_and(|x| *x != t) {
                                mixed.0 = true;
                            }
                            if project.as_ref().is_some_and(|x| *x != pr) {
                                mixed.1 = true;
                            }
                            tenant = Some(t.clone());
                            project = Some(pr.clone());
                            s.owner.insert(*h, (t, pr));
                        }
                    }
                    if let Some(t) = tenant {
                        let t = if mixed.0 { String::new() } else { t };
                        let pr = if mixed.0 || mixed.1 {
                            String::new()
                        } else {
                            project.unwrap_or_default()
                        };
                        s.gpu_owner.insert((n.name.clone(), gi as u8), (t, pr));
                    }
                }
            }
            s.frag.insert(p.name.clone(), (whole_free, all_free));
        }
        for a in st.allocations.values() {
            let Some((tenant, _)) = owner_of(&a.id) else { continue };
            let n = f.node(a.node);
            let key = (
                tenant,
                f.pool(n.pool).name.clone(),
                f.catalogue.get(n.model).name.clone(),
            );
            *s.tenant_alloc.entry(key).or_insert(0) += a.units.as_milli();
        }
        for j in ctx.sched.queue() {
            let class = queue_class(f, ctx, &j.request);
            let e = s
                .queue
                .entry((j.tenant.clone(), class.clone(), j.priority.clone()))
                .or_insert((0, j.submitted_ms));
            e.0 += 1;
            e.1 = e.1.min(j.submitted_ms);
            let code = ctx.workloads.get(&j.id).and_then(|l| l.reason_code);
            *s.blocked.entry((class, blocked_label(code).to_string())).or_insert(0) += 1;
        }
        for l in ctx.workloads.values() {
            *s.states.entry(l.wl.state.as_str()).or_insert(0) += 1;
        }
        for t in tenants {
            for (class, q) in ctx.sched.quotas_of(t) {
                let used = ctx.sched.held(t, &class);
                let borrowed = used.as_f64() - q.guaranteed.as_f64();
                s.quotas.insert(
                    (t.clone(), class),
                    QuotaUse {
                        guaranteed: q.guaranteed.as_f64(),
                        limit: q.limit.map(|l| l.as_f64()),
                        used: used.as_f64(),
                        borrowed: borrowed.max(0.0),
                    },
                );
            }
            if let Some(b) = ctx.sched.budget(t) {
                s.budgets.insert(t.clone(), (b, ctx.sched.spent(t)));
            }
        }
        s
    }
}

/// The resource class a queued request waits for: its pool when only one pool can serve it,
/// else `any`.
fn queue_class(f: &Fleet, ctx: &ViewCtx, r: &tessera_model::Request) -> String {
    if let Some(p) = r.pool {
        return f.pool(p).name.clone();
    }
    match ctx.sched.engine.scope(r) {
        Ok(pools) if pools.len() == 1 => f.pool(pools[0]).name.clone(),
        _ => "any".into(),
    }
}

fn l(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

fn gauge(reg: &mut Registry, name: &str, help: &str, fam: FGauge) {
    reg.register(name, help, fam);
}

/// Renders the whole exposition.
pub fn render(obs: &Observability, fleet: &Fleet, snap: Option<&Snapshot>, telemetry: &[GpuSample]) -> String {
    let mut reg = Registry::default();
    obs.metrics.register(&mut reg);

    let info = FGauge::default();
    info.get_or_create(&l(&[("version", obs.version), ("backend", obs.backend.name())]))
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
    let by_gpu: HashMap<(&str, u8), &GpuSample> = telemetry.iter().map(|s| ((s.node.as_str(), s.gpu), s)).collect();
    let gpus = FGauge::default();
    let lost = FGauge::default();
    let mut health: BTreeMap<(String, String), (u64, u64, u64)> = BTreeMap::new();
    for n in &fleet.nodes {
        let key = (
            fleet.pool(n.pool).name.clone(),
            fleet.catalogue.get(n.model).name.clone(),
        );
        let e = health.entry(key).or_default();
        for g in 0..n.gpus {
            match by_gpu.get(&(n.name.as_str(), g)) {
                Some(s) if s.xid == 0 => e.0 += 1,
                Some(_) => e.1 += 1,
                None => {
                    e.1 += 1;
                    e.2 += 1;
                }
            }
        }
    }
    for ((pool, model), (healthy, unhealthy, gone)) in &health {
        for (state, v) in [("healthy", *healthy), ("unhealthy", *unhealthy), ("cordoned", 0)] {
            gpus.get_or_create(&l(&[("pool", pool), ("model", model), ("state", state)]))
                .set(v as f64);
        }
        lost.get_or_create(&l(&[("pool", pool), ("model", model)]))
            .set(*gone as f64);
    }
    gauge(
        &mut reg,
        "tessera_gpus",
        "GPUs by pool, model and state: healthy, unhealthy (an XID error reported by telemetry, or no telemetry), cordoned",
        gpus,
    );
    gauge(
        &mut reg,
        "tessera_gpus_lost",
        "GPUs of the fleet the backend reports no telemetry for",
        lost,
    );

    if let Some(s) = snap {
        render_state(&mut reg, s);
    }
    render_dcgm(&mut reg, telemetry, snap);

    let mut out = String::with_capacity(1 << 20);
    prometheus_text::encode(&mut out, &reg).expect("writing to a String cannot fail");
    out
}

fn render_state(reg: &mut Registry, s: &Snapshot) {
    let (alloc, free, cap, occ, by_occ, fractions) = (
        FGauge::default(),
        FGauge::default(),
        FGauge::default(),
        FGauge::default(),
        FGauge::default(),
        FGauge::default(),
    );
    for ((pool, model), pm) in &s.pool_models {
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

    let frag = FGauge::default();
    for (pool, (whole_free, all_free)) in &s.frag {
        let r = if *all_free == 0 {
            0.0
        } else {
            1.0 - *whole_free as f64 / *all_free as f64
        };
        frag.get_or_create(&l(&[("pool", pool)])).set(r);
    }
    gauge(
        reg,
        "tessera_pool_fragmentation_ratio",
        "Share of a pool's free GPU units that are not in whole free units: free GPUs on partly used nodes (whole pools), free slices on partly used GPUs (MIG and shared pools)",
        frag,
    );

    let mig = FGauge::default();
    for ((pool, model, profile), n) in &s.mig {
        mig.get_or_create(&l(&[("pool", pool), ("model", model), ("profile", profile)]))
            .set(*n as f64);
    }
    gauge(
        reg,
        "tessera_mig_instances",
        "MIG instances by pool, model and profile",
        mig,
    );

    let tenant_alloc = FGauge::default();
    for ((tenant, pool, model), m) in &s.tenant_alloc {
        tenant_alloc
            .get_or_create(&l(&[("tenant", tenant), ("pool", pool), ("model", model)]))
            .set(*m as f64 / 1000.0);
    }
    gauge(
        reg,
        "tessera_tenant_gpu_units_allocated",
        "GPU units allocated, by tenant, pool and model",
        tenant_alloc,
    );

    let (depth, oldest) = (FGauge::default(), FGauge::default());
    for ((tenant, class, priority), (n, since)) in &s.queue {
        let lb = l(&[("tenant", tenant), ("class", class), ("priority", priority)]);
        depth.get_or_create(&lb).set(*n as f64);
        oldest.get_or_create(&lb).set((s.now - since).max(0) as f64 / 1000.0);
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
    for ((class, reason), n) in &s.blocked {
        blocked
            .get_or_create(&l(&[("pool", class), ("reason", reason)]))
            .set(*n as f64);
    }
    // Stable series for the reasons alerts look at.
    for p in s.frag.keys() {
        for r in ["fragmentation", "no-capacity"] {
            let _ = blocked.get_or_create(&l(&[("pool", p), ("reason", r)]));
        }
    }
    gauge(
        reg,
        "tessera_queue_blocked",
        "Requests waiting, by the pool they wait for (`any` when several can serve them) and why",
        blocked,
    );

    let states = FGauge::default();
    for st in ["pending", "queued", "placed", "running", "stopping"] {
        let n = s.states.get(st).copied().unwrap_or(0);
        states.get_or_create(&l(&[("state", st)])).set(n as f64);
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
    for ((tenant, class), q) in &s.quotas {
        let lb = l(&[("tenant", tenant), ("class", class)]);
        qg.get_or_create(&lb).set(q.guaranteed);
        if let Some(x) = q.limit {
            ql.get_or_create(&lb).set(x);
        }
        qu.get_or_create(&lb).set(q.used);
        qb.get_or_create(&lb).set(q.borrowed);
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
    let (bb, bs, br) = (FGauge::default(), FGauge::default(), FGauge::default());
    // Budgets are set in GPU-unit-hours; exported in the base unit, seconds, like metering.
    for (tenant, (b, spent)) in &s.budgets {
        let lb = l(&[("tenant", tenant)]);
        bb.get_or_create(&lb).set(b * 3600.0);
        bs.get_or_create(&lb).set(spent * 3600.0);
        br.get_or_create(&lb).set((b - spent).max(0.0) * 3600.0);
    }
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
/// `tenant` and `project` of the holders.
fn render_dcgm(reg: &mut Registry, telemetry: &[GpuSample], snap: Option<&Snapshot>) {
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
    for s in telemetry {
        let (tenant, project) = snap
            .and_then(|x| x.gpu_owner.get(&(s.node.clone(), s.gpu)))
            .unwrap_or(&empty);
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
            let (t, p) = snap.and_then(|x| x.owner.get(&i.workload)).cloned().unwrap_or_default();
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

/// `GET /metrics`.
pub async fn scrape(State(s): State<AppState>) -> Response {
    let obs = s.obs.clone();
    let mut tenants: Vec<String> = Vec::new();
    match s.store.quotas().await {
        Ok(q) => tenants.extend(q.into_iter().map(|q| q.tenant)),
        Err(e) => tracing::warn!(error = %e, "metrics: cannot read quotas"),
    }
    match s.store.budgets().await {
        Ok(b) => tenants.extend(b.into_iter().map(|(t, _)| t)),
        Err(e) => tracing::warn!(error = %e, "metrics: cannot read budgets"),
    }
    tenants.sort();
    tenants.dedup();
    let snap = match s.controller.view(move |ctx| Snapshot::take(ctx, &tenants)).await {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    let fleet = s.fleet.clone();
    let body = tokio::task::spawn_blocking(move || {
        let telemetry = obs.backend.telemetry();
        render(&obs, &fleet, Some(&snap), &telemetry)
    })
    .await;
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

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_model::GpuUnits;
    use tessera_sched::reason::{
        BudgetExceeded, LimitExceeded, LimitScope, Pools, ShapeKind, ShapeLabel, Unplaceable, Wait,
    };

    fn pools() -> Pools {
        Pools(vec!["training".into()])
    }

    fn shape() -> ShapeLabel {
        ShapeLabel {
            kind: ShapeKind::Whole,
            text: "8 whole GPUs".into(),
        }
    }

    fn limit() -> LimitExceeded {
        LimitExceeded {
            tenant: "a".into(),
            scope: LimitScope::Class {
                class: "training".into(),
                guaranteed: GpuUnits::whole(1),
            },
            held: GpuUnits::whole(1),
            limit: GpuUnits::whole(2),
            needs: GpuUnits::whole(8),
        }
    }

    #[test]
    fn every_wait_code_has_a_bounded_label() {
        let budget = BudgetExceeded {
            tenant: "a".into(),
            spent: 10.0,
            budget: 10.0,
        };
        let figures = (GpuUnits::whole(3), GpuUnits::whole(8));
        let waits = [
            Wait::Unplaceable(Unplaceable::NoCapacity {
                pools: pools(),
                shape: shape(),
                free: figures.0,
                need: figures.1,
            }),
            Wait::Unplaceable(Unplaceable::Fragmentation {
                pools: pools(),
                shape: shape(),
                free: figures.1,
                need: figures.1,
            }),
            Wait::Unplaceable(Unplaceable::Isolation {
                pools: pools(),
                shape: shape(),
            }),
            Wait::Held,
            Wait::Limit(limit()),
            Wait::Budget(budget),
            Wait::Backoff {
                times: 1,
                retry_in_s: 60,
            },
            Wait::Preempting {
                victims: 2,
                cause: PreemptCause::Priority {
                    by: 7,
                    class: "high".into(),
                },
            },
        ];
        for w in &waits {
            let label = blocked_label(Some(w.code()));
            assert!(WAIT_REASONS.contains(&label), "{w:?}");
            assert_ne!(label, "other", "{w:?}");
        }
        assert_eq!(blocked_label(Some(Wait::Held.code())), "no-capacity");
        assert_eq!(blocked_label(Some(waits[4].code())), "quota");
        assert_eq!(blocked_label(Some(waits[7].code())), "preemption");
        assert_eq!(blocked_label(Some("requeued")), "backoff");
        assert_eq!(blocked_label(None), "pending");
        assert_eq!(blocked_label(Some("something-new")), "other");
    }

    #[test]
    fn event_series_render_in_text_format() {
        let m = Metrics::new();
        m.api_request("GET", "/api/v1/workloads/{id}", 200, Duration::from_millis(3));
        m.api_request("BREW", "/x", 418, Duration::from_millis(3));
        m.refused(&Refusal::Constraint(Unplaceable::GangBeyondDomain {
            pools: pools(),
            gpus: 9,
            largest: 8,
        }));
        m.refused(&Refusal::Limit(limit()));
        m.preempted(&PreemptCause::Reclaim {
            by: 3,
            tenant: "b".into(),
        });
        let mut reg = Registry::default();
        m.register(&mut reg);
        let mut out = String::new();
        prometheus_text::encode(&mut out, &reg).unwrap();
        assert!(out.contains("# TYPE tessera_refusals_total counter"), "{out}");
        assert!(out.contains("tessera_refusals_total{reason=\"constraint\"} 1"), "{out}");
        assert!(out.contains("tessera_refusals_total{reason=\"quota\"} 1"), "{out}");
        assert!(out.contains("tessera_refusals_total{reason=\"budget\"} 0"), "{out}");
        assert!(out.contains("tessera_preemptions_total{reason=\"reclaim\"} 1"), "{out}");
        assert!(
            out.contains("tessera_preemptions_total{reason=\"priority\"} 0"),
            "{out}"
        );
        assert!(out.contains(
            "tessera_api_request_duration_seconds_count{method=\"GET\",route=\"/api/v1/workloads/{id}\",status=\"200\"} 1"
        ));
        assert!(out.contains("method=\"other\""));
        assert!(!out.contains("# EOF"), "Prometheus text format, not OpenMetrics");
    }
}
