//! Prometheus metrics, the event series: counters and histograms updated where things happen
//! — API requests (by matched route template, method and status), store batch commits,
//! scheduler cycles, lifecycle steps, refusals, preemptions, consolidation moves, ended
//! workloads, metered GPU-unit-seconds, backend errors, ghosts found by reconcile. They live in
//! [`Metrics`], shared by the HTTP layer and the lifecycle loop, which write them; the scrape
//! ([`crate::scrape`]) reads them and the published snapshot, and this module knows neither.
//!
//! Label values are bounded: pools, models, MIG profiles, tenants, projects, resource classes,
//! priority classes, phases and reason codes, GPUs of small fleets. No workload ID ever becomes
//! a label value.

use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tessera_backend::BackendError;
use tessera_domain::{Phase, ReasonCode, Workload};

/// A label set: (name, value) pairs in a fixed order.
pub type Labels = Vec<(&'static str, String)>;
type Hist = Family<Labels, Histogram, fn() -> Histogram>;
pub(crate) type FCounter = Family<Labels, Counter<f64, AtomicU64>>;
pub(crate) type FGauge = Family<Labels, Gauge<f64, AtomicU64>>;

/// Fleets with at most this many GPUs get per-GPU DCGM-named series; larger ones get
/// per-pool and per-model aggregates.
pub const PER_GPU_SERIES_MAX: u64 = 4096;

const API_BUCKETS: [f64; 11] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];
const STEP_BUCKETS: [f64; 12] = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 60.0, 300.0, 3600.0];
const R2R_BUCKETS: [f64; 14] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0,
];
const STORE_BUCKETS: [f64; 11] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];
const CYCLE_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

fn db_hist() -> Histogram {
    Histogram::new(STORE_BUCKETS)
}
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

/// The reason codes of refusals (`tessera_refusals_total{reason}`).
pub const REFUSAL_REASONS: [ReasonCode; 3] = [ReasonCode::Constraint, ReasonCode::Quota, ReasonCode::Budget];

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
    consolidation_moves: Family<Labels, Counter>,
    ended: Family<Labels, Counter>,
    backend_errors: Family<Labels, Counter>,
    ghosts: Counter,
    strangers: Counter,
    admissions: Family<Labels, Counter>,
    evictions_refused: Counter,
    orphans: Gauge,
    gpu_failures: Family<Labels, Counter>,
    allocated: FCounter,
    measured: FCounter,
    database: Hist,
    leadership: Family<Labels, Counter>,
    leader: Gauge,
    /// When this process started (the scrape's uptime).
    pub(crate) started: Instant,
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
            consolidation_moves: Family::default(),
            ended: Family::default(),
            backend_errors: Family::default(),
            ghosts: Counter::default(),
            strangers: Counter::default(),
            admissions: Family::default(),
            evictions_refused: Counter::default(),
            orphans: Gauge::default(),
            gpu_failures: Family::default(),
            allocated: Family::default(),
            measured: Family::default(),
            database: Family::new_with_constructor(db_hist),
            leadership: Family::default(),
            leader: Gauge::default(),
            started: Instant::now(),
        };
        for change in ["acquired", "lost"] {
            let _ = m.leadership.get_or_create(&vec![("change", change.to_string())]);
        }
        // Series that alerts and dashboards expect exist from the start, at zero.
        for r in REFUSAL_REASONS {
            let _ = m.refusals.get_or_create(&vec![("reason", r.as_str().to_string())]);
        }
        for r in ["priority", "reclaim"] {
            let _ = m.preemptions.get_or_create(&vec![("reason", r.to_string())]);
        }
        for h in ["restart", "replace"] {
            let _ = m.consolidation_moves.get_or_create(&vec![("how", h.to_string())]);
        }
        for p in Phase::ALL.into_iter().filter(|p| p.is_terminal()) {
            let _ = m.ended.get_or_create(&vec![("state", p.as_str().to_string())]);
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

    /// One store operation (`op`: the contract's method) and whether it succeeded.
    pub fn database(&self, op: &'static str, ok: bool, elapsed: Duration) {
        self.database
            .get_or_create(&vec![
                ("op", op.to_string()),
                ("outcome", if ok { "ok" } else { "error" }.to_string()),
            ])
            .observe(elapsed.as_secs_f64());
    }

    /// This replica acquired (`acquired`) or lost (`lost`) the leadership.
    pub fn leadership(&self, change: &'static str) {
        self.leadership
            .get_or_create(&vec![("change", change.to_string())])
            .inc();
    }

    /// Whether this replica leads (its lifecycle loop runs).
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// One scheduler cycle over the queue.
    pub fn scheduler_cycle(&self, elapsed: Duration) {
        self.cycle.observe(elapsed.as_secs_f64());
    }

    /// A lifecycle step took `ms` milliseconds: `authorise`, `place` (request to placement,
    /// queueing included).
    pub fn step(&self, step: &'static str, ms: i64) {
        self.steps
            .get_or_create(&vec![("step", step.to_string())])
            .observe(ms.max(0) as f64 / 1000.0);
    }

    /// A backend operation took `elapsed`: `partition`, `start`, `stop`, `unpartition`.
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
    pub fn refused(&self, code: ReasonCode) {
        self.refusals
            .get_or_create(&vec![("reason", code.as_str().to_string())])
            .inc();
    }

    /// A running workload is being preempted: `priority` or `reclaim`.
    pub fn preempted(&self, code: &'static str) {
        self.preemptions
            .get_or_create(&vec![("reason", code.to_string())])
            .inc();
    }

    /// Consolidation moved a running workload: `how` is `restart` (stopped and requeued) or
    /// `replace` (a replacement started first).
    pub fn consolidation_move(&self, how: &'static str) {
        self.consolidation_moves
            .get_or_create(&vec![("how", how.to_string())])
            .inc();
    }

    /// A workload reached a terminal phase.
    pub fn ended(&self, phase: Phase) {
        self.ended
            .get_or_create(&vec![("state", phase.as_str().to_string())])
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

    /// Reconcile found a workload Tessera thought running that the backend does not know.
    pub fn ghost(&self) {
        self.ghosts.inc();
    }

    /// The backend found something posing as a Tessera workload (a stranger's pod wearing a
    /// workload's label).
    pub fn stranger(&self) {
        self.strangers.inc();
    }

    /// The admission webhook answered a review of an object made with the backend's own tools.
    pub fn admission(&self, allowed: bool) {
        let outcome = if allowed { "allowed" } else { "refused" };
        self.admissions
            .get_or_create(&vec![("outcome", outcome.to_string())])
            .inc();
    }

    /// A disruption budget refused a workload's eviction for now.
    pub fn eviction_refused(&self) {
        self.evictions_refused.inc();
    }

    /// A GPU was taken out of placement: `cause` is `xid`, `lost` or `partition-failed`.
    pub fn gpu_failure(&self, pool: &str, model: &str, cause: &'static str) {
        self.gpu_failures
            .get_or_create(&vec![
                ("pool", pool.to_string()),
                ("model", model.to_string()),
                ("cause", cause.to_string()),
            ])
            .inc();
    }

    /// Reconcile found `n` workloads the backend runs that Tessera does not know.
    pub fn orphans(&self, n: usize) {
        self.orphans.set(n as i64);
    }

    /// Metering, for each telemetry sample of a GPU a running workload holds, standing for
    /// `dt_ms`: the workload's share of the GPU × time (allocated), and × the measured
    /// utilisation (measured), in GPU-unit-seconds by tenant and resource class `pool/MODEL`.
    pub fn meter(&self, w: &Workload, util: f64, dt_ms: f64) {
        let Some(p) = &w.placement else { return };
        if p.units.as_milli() == 0 || p.gpus.is_empty() {
            return;
        }
        let units = p.units.as_f64() / p.gpus.len() as f64;
        let labels = vec![
            ("tenant", w.spec.tenant.clone()),
            ("class", format!("{}/{}", p.pool, p.model)),
        ];
        let secs = dt_ms / 1000.0;
        self.allocated.get_or_create(&labels).inc_by(units * secs);
        self.measured
            .get_or_create(&labels)
            .inc_by(units * secs * util.clamp(0.0, 1.0));
    }

    /// Registers every event series in `reg` (a scrape renders them with its state gauges).
    pub fn register(&self, reg: &mut Registry) {
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
            "Duration of lifecycle steps: authorise, place (request to placement, queueing included), and the backend's partition, start, stop and unpartition",
            self.steps.clone(),
        );
        reg.register(
            "tessera_request_to_running_seconds",
            "Time from request to running, by pool",
            self.request_to_running.clone(),
        );
        reg.register(
            "tessera_refusals",
            "Requests refused for good, by reason code (constraint, quota, budget)",
            self.refusals.clone(),
        );
        reg.register(
            "tessera_preemptions",
            "Workloads preempted, by reason (priority, reclaim of a guaranteed share)",
            self.preemptions.clone(),
        );
        reg.register(
            "tessera_consolidation_moves",
            "Running workloads moved by consolidation so that a request waiting for fragmented capacity fits, by how (restart, replace)",
            self.consolidation_moves.clone(),
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
            "tessera_reconcile_ghosts",
            "Workloads Tessera thought running that the backend no longer knew (found by reconcile)",
            self.ghosts.clone(),
        );
        reg.register(
            "tessera_backend_strangers",
            "Objects on the backend posing as Tessera workloads that are not (a pod in another namespace wearing a workload's label): ignored and audited",
            self.strangers.clone(),
        );
        reg.register(
            "tessera_admission_reviews",
            "Reviews of pods made with kubectl answered by the admission webhook, by outcome (allowed, refused)",
            self.admissions.clone(),
        );
        reg.register(
            "tessera_evictions_refused",
            "Evictions a disruption budget refused for now (the drain waits, Tessera retries)",
            self.evictions_refused.clone(),
        );
        reg.register(
            "tessera_gpu_failures",
            "GPUs taken out of placement, by pool, model and cause (xid: a critical XID; lost; partition-failed)",
            self.gpu_failures.clone(),
        );
        reg.register(
            "tessera_reconcile_orphans",
            "Workloads the backend runs that Tessera does not know, at the last reconcile",
            self.orphans.clone(),
        );
        reg.register(
            "tessera_gpu_unit_seconds_allocated",
            "Metered GPU-unit-seconds allocated to running workloads, by tenant and resource class",
            self.allocated.clone(),
        );
        reg.register(
            "tessera_database_duration_seconds",
            "Latency of store operations by operation (the store contract's method) and outcome (ok, error)",
            self.database.clone(),
        );
        reg.register(
            "tessera_leadership_changes",
            "Times this replica acquired or lost the leadership (change: acquired, lost)",
            self.leadership.clone(),
        );
        reg.register(
            "tessera_leader",
            "1 while this replica leads (runs the lifecycle loop), else 0",
            self.leader.clone(),
        );
        reg.register(
            "tessera_gpu_unit_seconds_measured",
            "Metered GPU-unit-seconds weighted by measured utilisation, by tenant and resource class",
            self.measured.clone(),
        );
    }
}

/// The `tessera_queue_blocked{reason}` label of a waiting workload's reason code: the kinds
/// alerts and dashboards group by. `held` (it fits only where capacity is reserved) counts as
/// `no-capacity`; `requeued` (back after a preemption) as `backoff`; `not-considered` (past the
/// cycle's budget of jobs on a deep queue) is its own.
pub fn wait_label(code: Option<ReasonCode>) -> &'static str {
    match code {
        None => "pending",
        Some(ReasonCode::Fragmentation) => "fragmentation",
        Some(ReasonCode::NoCapacity | ReasonCode::Held) => "no-capacity",
        Some(ReasonCode::Isolation) => "isolation",
        Some(ReasonCode::Budget) => "budget",
        Some(ReasonCode::Quota) => "quota",
        Some(ReasonCode::Preemption) => "preemption",
        Some(ReasonCode::Backoff | ReasonCode::Requeued) => "backoff",
        Some(ReasonCode::NotConsidered) => "not-considered",
        Some(_) => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_labels_are_bounded() {
        let labels = [
            "pending",
            "fragmentation",
            "no-capacity",
            "isolation",
            "budget",
            "quota",
            "preemption",
            "backoff",
            "not-considered",
            "other",
        ];
        assert!(labels.contains(&wait_label(None)));
        for c in ReasonCode::ALL {
            assert!(labels.contains(&wait_label(Some(c))), "{c}");
        }
        assert_eq!(wait_label(Some(ReasonCode::Held)), "no-capacity");
    }

    #[test]
    fn event_series_render_in_text_format() {
        use prometheus_client::encoding::prometheus_text;
        let m = Metrics::new();
        m.api_request("GET", "/api/v1/workloads/{id}", 200, Duration::from_millis(3));
        m.api_request("BREW", "/x", 418, Duration::from_millis(3));
        m.refused(ReasonCode::Constraint);
        let mut reg = Registry::default();
        m.register(&mut reg);
        let mut out = String::new();
        prometheus_text::encode(&mut out, &reg).unwrap();
        assert!(out.contains("# TYPE tessera_refusals_total counter"), "{out}");
        assert!(out.contains("tessera_refusals_total{reason=\"constraint\"} 1"), "{out}");
        assert!(out.contains(
            "tessera_api_request_duration_seconds_count{method=\"GET\",route=\"/api/v1/workloads/{id}\",status=\"200\"} 1"
        ));
        assert!(out.contains("method=\"other\""));
        assert!(!out.contains("# EOF"), "Prometheus text format, not OpenMetrics");
    }
}
