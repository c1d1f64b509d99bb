//! The state every handler, console page and background task of the server shares
//! ([`AppState`]): the store, the lifecycle and its published fleet, the backend, identities,
//! the audit log and rate limits, the replica, observability and the console's history. Built
//! once by `start` in `lib.rs`, which only wires the parts together; the parts import this
//! module, never the crate root.

use std::sync::Arc;

use tessera_backend::Backend;
use tessera_model::Fleet;
use tessera_store::Store;

use crate::auth::Authenticator;
use crate::lifecycle::Lifecycle;
use crate::lifecycle::placement::NodeIndex;
use crate::{audit, history, lifecycle, refusals, replica, scrape, session, usage, workload_history};

/// Shared state of the handlers: one pointer to [`Shared`], so that the clone axum makes for
/// every extractor and layer of every request is one reference count, not twenty (profiled
/// under `scripts/bench-api.sh`, cloning and dropping the fields one by one took about 3 % of
/// the server's CPU).
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl AppState {
    /// The state made of its parts.
    pub fn new(parts: Shared) -> AppState {
        AppState(Arc::new(parts))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// What [`AppState`] shares.
pub struct Shared {
    pub store: Arc<dyn Store>,
    /// The fleet, as the backend last reported it ([`AppState::fleet`]).
    pub fleet_cell: lifecycle::FleetCell,
    pub lifecycle: Lifecycle,
    /// The priority classes requests may name.
    pub priorities: Arc<Vec<String>>,
    pub auth: Arc<Authenticator>,
    pub backend_name: &'static str,
    /// The backend, for what the lifecycle does not carry (workload logs).
    pub backend: Arc<dyn Backend>,
    pub prices: Arc<usage::Prices>,
    pub audit: audit::AuditLog,
    pub limiter: Arc<audit::RateLimiter>,
    pub sessions: Arc<session::Sessions>,
    /// The tenancy the create path remembers while this replica leads (projects known to
    /// exist, tenants' grants); the store forgets it on every tenancy write.
    pub tenancy_cache: Arc<crate::tenancy_cache::TenancyCache>,
    /// Metrics and (simulated backend) fault injection.
    pub obs: Arc<scrape::Observability>,
    /// This replica: its role, and where the leader is.
    pub replica: Arc<replica::Replica>,
    /// The client a follower forwards writes to the leader with.
    pub forward: reqwest::Client,
    /// Wakes the backend tenancy sync (a project was created).
    pub tenancy: Arc<tokio::sync::Notify>,
    /// Asks registries about images (image policies that require a signature).
    pub registry: tessera_imagepolicy::RegistryClient,
    /// Allocation and utilisation per pool over the last 24 hours (the console's charts).
    pub history: Arc<history::History>,
    /// GPU telemetry per workload over the last 30 days (the workload page's chart).
    pub workload_history: Arc<workload_history::WorkloadHistory>,
    /// Requests refused at submission (never stored), newest kept (the console's queue view).
    pub refusals: Arc<refusals::Refusals>,
}

impl Shared {
    /// The fleet now: what requests are checked against (a backend that discovers its nodes
    /// may report another while the server runs).
    pub fn fleet(&self) -> Arc<Fleet> {
        self.fleet_cell.get()
    }

    /// The fleet now with its node index (names to indexes), read together.
    pub fn fleet_and_index(&self) -> (Arc<Fleet>, Arc<NodeIndex>) {
        self.fleet_cell.with_index()
    }
}
