//! # tessera-store
//!
//! The contract of Tessera's durable store, without an implementation: the records it keeps,
//! the lifecycle batch ([`Change`]), the workload filter, one async trait per aggregate
//! (tenancy, tokens, workloads, the usage ledger, governance, the audit log, fleet operations:
//! GPU health, node states, drains, service moves and rolling upgrades; the console's
//! telemetry history), the [`Store`]
//! supertrait the control plane holds as `Arc<dyn Store>`, and [`StoreError`].
//!
//! Implementations live in their own crates (`tessera-store-sqlite`, the embedded default, and
//! `tessera-store-postgres`, for replicas sharing one database) so that a database driver is
//! only built where it is used. The statement code of both SQL stores is written once, in
//! `tessera-store-sql`, generic over a driver trait each of them implements (its connections
//! and transactions, and the few statements and reads that differ between the databases).
//! That crate also holds the `workloads` table's columns and the decoding of its rows: no SQL
//! is here. Every implementation must pass
//! the [`conformance`] suite; [`store_conformance_tests!`] runs it as one test per behaviour.
//!
//! Writes of the lifecycle loop go through [`WorkloadStore::commit`]: a batch of [`Change`]s
//! committed in **one transaction**, so a state change, its events, its usage interval and its
//! audit record land together or not at all. Identifiers (workload ids, audit sequence numbers) come from the
//! database, never from the application, so that processes sharing a database never collide.
//!
//! Replicas sharing a database elect one leader through the [`LeaseStore`]: a single lease row
//! with an epoch that grows on every change of holder, timed by the database's clock. The
//! leader's lifecycle batches carry a [`Change::Fence`] with its epoch, so that a leader that
//! lost the lease (paused, partitioned, slow) can never commit: the database refuses the batch.

pub mod conformance;

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use tessera_domain::{Event, Phase, Workload, WorkloadId};
use tessera_model::GpuUnits;

/// The result of a store operation.
pub type Result<T> = std::result::Result<T, StoreError>;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A unique key exists already (tenant, project, token id/hash, workload id, idempotency key).
    #[error("{0} already exists")]
    Conflict(String),
    /// The database cannot be reached or refused the operation for a transient reason.
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
    /// Stored data cannot be decoded (unknown phase, malformed list …).
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// A fenced batch was refused: its holder no longer holds the lease with its epoch.
    #[error("fenced: {0}")]
    Fenced(String),
    /// The database's schema was written by a newer version of Tessera than this one.
    #[error("incompatible database: {0}")]
    Incompatible(String),
}

/// A tenant: the unit of isolation, quota and billing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantRecord {
    pub name: String,
    pub display_name: String,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
    /// The priority classes the platform admin granted the tenant; `None`: the default grant
    /// (the control plane's, `standard` and `opportunistic`).
    pub priorities: Option<Vec<String>>,
}

/// A tenant's image policy: where its workloads' images may come from and who must have
/// signed them. Checked at admission (`tessera-imagepolicy`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImagePolicyRecord {
    pub tenant: String,
    /// Allowed registry/repository prefixes (normalised references); empty: any.
    pub registries: Vec<String>,
    /// cosign public keys (PEM `PUBLIC KEY`, ECDSA P-256); empty: no signature required.
    pub cosign_keys: Vec<String>,
    /// Milliseconds since the Unix epoch.
    pub updated_at: i64,
}

/// A project of a tenant: groups its workloads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProjectRecord {
    pub tenant: String,
    pub name: String,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
}

/// An API token; only the hash of its secret is stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRecord {
    pub id: String,
    /// SHA-256 of the secret, hex.
    pub hash: String,
    /// The tenant it acts for; `None` for platform-wide tokens.
    pub tenant: Option<String>,
    pub role: String,
    pub name: String,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
}

/// The role of platform-wide administrator tokens, which the store keeps at least one of.
pub const PLATFORM_ADMIN: &str = "platform-admin";

/// What [`TokenStore::revoke_token`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Revocation {
    Revoked,
    /// No such token, or it is revoked already.
    NotActive,
    /// The token is the last unrevoked `platform-admin` token without an expiry: revoking it
    /// would lock every administrator out.
    LastPlatformAdmin,
}

/// A tenant's quota on one resource class (a pool, or `pool/MODEL`), in thousandths of a GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaRecord {
    pub tenant: String,
    pub class: String,
    pub guaranteed_milli: u64,
    /// `None`: may borrow without limit.
    pub limit_milli: Option<u64>,
}

/// One entry of the append-only audit log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditRecord {
    /// Assigned by the store on append (ignored when appending).
    pub seq: u64,
    /// Milliseconds since the Unix epoch.
    pub at: i64,
    pub request_id: String,
    /// Token id, OIDC subject, or `anonymous`.
    pub actor: String,
    pub tenant: Option<String>,
    /// E.g. `POST /api/v1/workloads`, `auth.failure`, `login`.
    pub action: String,
    pub target: String,
    /// HTTP status of the outcome.
    pub outcome: u16,
    pub detail: String,
}

/// One interval of the usage ledger: opened when a workload starts running, closed when it
/// releases its capacity, in the same transactions as those changes.
#[derive(Clone, Debug, PartialEq)]
pub struct UsageInterval {
    pub workload: WorkloadId,
    /// Position among the workload's intervals, from 0.
    pub seq: u32,
    pub tenant: String,
    pub project: String,
    pub pool: String,
    pub model: String,
    pub shape: String,
    pub units: GpuUnits,
    /// Milliseconds since the Unix epoch.
    pub started_at: i64,
    /// `None` while the workload is metered.
    pub ended_at: Option<i64>,
    /// Measured average utilisation (0..1) over the interval, where telemetry exists.
    pub util_avg: Option<f64>,
}

/// The `Idempotency-Key` of a workload creation, per actor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdempotencyKey {
    pub actor: String,
    pub key: String,
    /// Hash of the request body, to tell a retry from a different request with the same key.
    pub request_hash: String,
}

/// One change of a lifecycle batch; a batch commits in one transaction, all or nothing.
/// Workload records are shared (`Arc`): the caller keeps the record it commits (the lifecycle
/// loop holds and publishes it) without a copy for the store.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// A new workload with its first events and, optionally, its idempotency key.
    Insert {
        workload: Arc<Workload>,
        events: Vec<Event>,
        idempotency: Option<IdempotencyKey>,
    },
    /// A workload's new record and the events that explain the change. The spec is immutable
    /// once inserted: an update writes the lifecycle, the placement and the bookkeeping. The
    /// workload must be stored (else the batch fails with `Corrupt`: the caller's view of the
    /// store is wrong).
    Update {
        workload: Arc<Workload>,
        events: Vec<Event>,
    },
    /// Opens a usage interval.
    OpenUsage(UsageInterval),
    /// Closes an open usage interval (else the batch fails with `Corrupt`, as for `Update`).
    CloseUsage {
        workload: WorkloadId,
        seq: u32,
        ended_at: i64,
        util_avg: Option<f64>,
    },
    /// Commits the batch only if [`Fence::holder`] holds the leader lease with
    /// [`Fence::epoch`] and the lease has not expired by the database's clock; otherwise the
    /// batch fails with [`StoreError::Fenced`] and changes nothing. Checked before any other
    /// change wherever it stands in the batch; the check holds the lease until the batch
    /// commits or rolls back, so the lease cannot change hands in between.
    Fence(Fence),
    /// Appends a record to the audit log with the batch, so that an action and its audit
    /// record land together or not at all. Its sequence number comes from the same counter as
    /// [`AuditStore::append_audit`]'s (the record's `seq` is ignored): numbers stay unique and
    /// increasing across both paths, and the records of one batch get them in batch order.
    Audit(AuditRecord),
    /// Records (or replaces) the MIG mode an admin set on a GPU, as
    /// [`FleetStore::set_gpu_mig`] does, with the batch (and so with its audit record).
    GpuMig(GpuMigRecord),
}

/// The leader's credentials in a fenced batch ([`Change::Fence`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    /// The replica that acquired the lease.
    pub holder: String,
    /// The epoch [`LeaseStore::acquire_lease`] returned.
    pub epoch: u64,
}

/// The leader lease as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRecord {
    /// The replica that holds (or last held) it.
    pub holder: String,
    /// The URL the holder advertises: followers forward writes there.
    pub url: String,
    /// Grows by one whenever the lease is acquired.
    pub epoch: u64,
    /// When it was acquired and when it expires, ms since the epoch by the database's clock.
    pub acquired_at: i64,
    pub expires_at: i64,
    /// `expires_at` minus the database's clock when read: positive while the lease is valid.
    pub remaining_ms: i64,
}

impl LeaseRecord {
    /// Whether the lease had not expired when it was read.
    pub fn valid(&self) -> bool {
        self.remaining_ms > 0
    }
}

/// A replica of the control plane, as its heartbeats record it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaRecord {
    pub id: String,
    /// The URL it advertises.
    pub url: String,
    /// Its version of Tessera.
    pub version: String,
    /// When it started, ms since the epoch (its own clock).
    pub started_at: i64,
    /// Its last heartbeat by the database's clock (set by the store).
    pub last_seen: i64,
    /// Milliseconds since that heartbeat by the database's clock when read (set by the store).
    pub age_ms: i64,
}

/// What [`WorkloadStore::list_workloads`] returns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkloadFilter {
    /// The caller's tenant scope: `None` for platform-wide callers. Always applied, whatever the
    /// other filters say (isolation is enforced in the query, not only in handlers).
    pub scope: Option<String>,
    pub tenant: Option<String>,
    pub project: Option<String>,
    /// Any of these phases; empty = any phase.
    pub phases: Vec<Phase>,
    /// Only ids below this (pages go from newest to oldest).
    pub before: Option<WorkloadId>,
    /// The order of the answer (newest first unless said).
    pub order: WorkloadOrder,
    /// Where the page starts: just after this workload in `order` (the last one of the
    /// previous page). Pages read this way (keyset paging) cost the same at any depth and skip
    /// or repeat nothing when workloads are added between them.
    pub after: Option<WorkloadSeek>,
    /// Instead, the page that ends just before `after` (a pager's Previous), still in `order`.
    pub backward: bool,
    pub limit: u32,
}

/// A position in an ordered listing ([`WorkloadFilter::after`]): a workload's id and the value
/// it is sorted by (its name or phase; unused by the orders by id).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadSeek {
    pub id: WorkloadId,
    pub key: String,
}

impl WorkloadSeek {
    /// The position of `w` in `order`.
    pub fn of(order: WorkloadOrder, w: &Workload) -> Self {
        let key = match order {
            WorkloadOrder::Newest | WorkloadOrder::Oldest => String::new(),
            WorkloadOrder::Name => w.spec.name.clone(),
            WorkloadOrder::Phase => w.phase.as_str().to_string(),
        };
        WorkloadSeek { id: w.id, key }
    }
}

/// The order of a [`WorkloadFilter`]'s answer, kept by the database over every matching
/// workload (not only over a window of the newest).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WorkloadOrder {
    /// The newest (highest id) first.
    #[default]
    Newest,
    /// The oldest (lowest id) first.
    Oldest,
    /// By name in byte order (`B` before `a`, whatever the database's locale), the newest
    /// first among equal names.
    Name,
    /// By phase name in byte order (`cancelled` … `succeeded`), the newest first within a phase.
    Phase,
}

/// One change of a declaration applied whole ([`TenancyStore::apply_tenancy`]).
#[derive(Clone, Debug, PartialEq)]
pub enum TenancyChange {
    /// Creates a tenant; `Conflict` if one of that name exists.
    CreateTenant(TenantRecord),
    /// Grants a tenant exactly these priority classes (`None`: the default grant).
    SetPriorities {
        tenant: String,
        classes: Option<Vec<String>>,
    },
    /// Creates a project; `Conflict` if the tenant has one of that name.
    CreateProject(ProjectRecord),
    /// Creates or replaces a quota.
    SetQuota { quota: QuotaRecord, at: i64 },
    /// Removes a quota (nothing if there is none).
    DeleteQuota { tenant: String, class: String },
    /// Sets (`Some`) or removes (`None`) a monthly budget.
    SetBudget {
        tenant: String,
        unit_hours: Option<f64>,
        at: i64,
    },
    /// Creates or replaces an image policy.
    SetImagePolicy(ImagePolicyRecord),
}

/// Tenants and their projects.
#[async_trait]
pub trait TenancyStore: Send + Sync {
    /// Creates a tenant; `Conflict` if one of that name exists.
    async fn create_tenant(&self, t: &TenantRecord) -> Result<()>;
    async fn get_tenant(&self, name: &str) -> Result<Option<TenantRecord>>;
    /// Tenants ordered by name, after `after`.
    async fn list_tenants(&self, after: Option<&str>, limit: u32) -> Result<Vec<TenantRecord>>;
    /// Deletes a tenant without projects, tokens or workloads; `false` if it still has some (or
    /// does not exist). Its quotas, budget and image policy go with it.
    async fn delete_tenant(&self, name: &str) -> Result<bool>;
    /// Creates a project of an existing tenant; `Conflict` if the tenant has one of that name.
    async fn create_project(&self, p: &ProjectRecord) -> Result<()>;
    async fn get_project(&self, tenant: &str, name: &str) -> Result<Option<ProjectRecord>>;
    /// A tenant's projects ordered by name, after `after`.
    async fn list_projects(&self, tenant: &str, after: Option<&str>, limit: u32) -> Result<Vec<ProjectRecord>>;
    /// Deletes a project without workloads; `false` if it has some (or does not exist).
    async fn delete_project(&self, tenant: &str, name: &str) -> Result<bool>;
    /// Creates or replaces an existing tenant's image policy, appending `audit` in the same
    /// transaction (its `seq` is ignored); `Corrupt` if the tenant does not exist.
    async fn set_image_policy(&self, p: &ImagePolicyRecord, audit: &AuditRecord) -> Result<()>;
    /// A tenant's image policy; `None`: its workloads may run any image.
    async fn image_policy(&self, tenant: &str) -> Result<Option<ImagePolicyRecord>>;
    /// Removes a tenant's image policy, appending `audit` in the same transaction when there
    /// was one; `false` (and no audit record) if there was none.
    async fn delete_image_policy(&self, tenant: &str, audit: &AuditRecord) -> Result<bool>;
    /// Grants an existing tenant exactly these priority classes (`None`: back to the default
    /// grant), appending `audit` in the same transaction (its `seq` is ignored); `false` (and
    /// no audit record) if there is no such tenant.
    async fn set_tenant_priorities(
        &self,
        tenant: &str,
        classes: Option<&[String]>,
        audit: &AuditRecord,
    ) -> Result<bool>;
    /// Makes every change, in order, and appends `audit`, in **one transaction**: all of them
    /// land or none does (a `Conflict`, a change naming a tenant that does not exist —
    /// `Corrupt` —, or a database error rolls everything back).
    async fn apply_tenancy(&self, changes: &[TenancyChange], audit: &[AuditRecord]) -> Result<()>;
}

/// API tokens.
#[async_trait]
pub trait TokenStore: Send + Sync {
    /// Stores a token (its tenant, if any, must exist); `Conflict` if its id or hash exists.
    async fn create_token(&self, t: &TokenRecord) -> Result<()>;
    /// The token whose secret hashes to `hash` (revoked or expired ones included).
    async fn find_token(&self, hash: &str) -> Result<Option<TokenRecord>>;
    async fn get_token(&self, id: &str) -> Result<Option<TokenRecord>>;
    /// Tokens, optionally of one tenant, newest first.
    async fn list_tokens(&self, tenant: Option<&str>) -> Result<Vec<TokenRecord>>;
    /// Revokes a token unless that would leave no way in: a `platform-admin` token is revoked
    /// only while another unrevoked `platform-admin` token without an expiry remains. The check
    /// and the revocation must be one atomic step, so that two concurrent revocations of the
    /// last two cannot both pass (SQLite serialises writers; a PostgreSQL implementation would
    /// lock the admin rows, `SELECT … FOR UPDATE`, in the revoking transaction).
    async fn revoke_token(&self, id: &str, at: i64) -> Result<Revocation>;
    /// Every stored token, revoked ones included (zero means the platform is not bootstrapped).
    async fn token_count(&self) -> Result<u64>;
    /// News of revocations made by any replica sharing this store, for replicas that cache
    /// identities: a message (the revoked token's id, or empty when some may have been missed,
    /// after a reconnect) soon after each revocation commits. `None` where the store has no
    /// such channel (SQLite: one process, which invalidates its own cache). No default: a
    /// wrapper that forgot to pass it on would leave replicas trusting revoked tokens.
    async fn revocations(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<String>>;
}

/// Workloads, their timelines and idempotency keys.
#[async_trait]
pub trait WorkloadStore: Send + Sync {
    /// Reserves `n` consecutive workload ids from the database's own sequence: never handed out
    /// twice, also across processes sharing the database and across restarts.
    async fn reserve_workload_ids(&self, n: u32) -> Result<Range<u64>>;
    /// Commits a lifecycle batch in one transaction: all or nothing. The changes take effect in
    /// batch order (an `Update` may follow the `Insert` of its workload, a `CloseUsage` the
    /// `OpenUsage` of its interval); when the batch fails, the error is the one its first failing
    /// change causes.
    async fn commit(&self, batch: &[Change]) -> Result<()>;
    /// A workload within the caller's tenant scope (`None` = platform-wide).
    async fn get_workload(&self, id: WorkloadId, scope: Option<&str>) -> Result<Option<Workload>>;
    /// Newest first.
    async fn list_workloads(&self, f: &WorkloadFilter) -> Result<Vec<Workload>>;
    /// How many workloads [`Self::list_workloads`] would answer for `f` without its `limit`:
    /// every workload matching the scope, tenant, project, phases and `before`, and — with
    /// `after` — only those after it in `f.order` (before it, with `backward`). The scope is
    /// always applied, as for the listing.
    async fn count_workloads(&self, f: &WorkloadFilter) -> Result<u64>;
    /// A workload's timeline within the caller's scope, in order.
    async fn events(&self, id: WorkloadId, scope: Option<&str>) -> Result<Vec<Event>>;
    /// Every workload not in a terminal phase, oldest first (start-up and failover).
    async fn active_workloads(&self) -> Result<Vec<Workload>>;
    /// The request hash and workload of an idempotency key of `actor`.
    async fn idempotent(&self, actor: &str, key: &str) -> Result<Option<(String, WorkloadId)>>;
}

/// The usage ledger.
#[async_trait]
pub trait LedgerStore: Send + Sync {
    /// A workload's intervals in order.
    async fn usage_of(&self, id: WorkloadId) -> Result<Vec<UsageInterval>>;
    /// Intervals overlapping `[from, to)`, optionally of one tenant, oldest first.
    async fn usage_between(&self, tenant: Option<&str>, from: i64, to: i64) -> Result<Vec<UsageInterval>>;
    /// Per tenant (by name), the closed intervals' use within `[from, to)`: each interval cut to
    /// it, in milli-GPU-unit milliseconds (`units_milli × ms`, summed exactly). Open intervals
    /// do not count; a tenant with nothing closed in the range is absent. What budgets are
    /// checked against, summed by the database so that a start-up does not read the month.
    async fn closed_usage(&self, from: i64, to: i64) -> Result<Vec<(String, i64)>>;
}

/// Quotas and budgets.
#[async_trait]
pub trait GovernanceStore: Send + Sync {
    /// Creates or replaces the quota of an existing tenant on one class.
    async fn set_quota(&self, q: &QuotaRecord, at: i64) -> Result<()>;
    /// `false` if there was no such quota.
    async fn delete_quota(&self, tenant: &str, class: &str) -> Result<bool>;
    /// Every quota, by tenant then class.
    async fn quotas(&self) -> Result<Vec<QuotaRecord>>;
    /// Sets (`Some`) or removes (`None`) a tenant's monthly GPU-unit-hour budget.
    async fn set_budget(&self, tenant: &str, unit_hours: Option<f64>, at: i64) -> Result<()>;
    /// Every budget, by tenant.
    async fn budgets(&self) -> Result<Vec<(String, f64)>>;
}

/// The audit log.
#[async_trait]
pub trait AuditStore: Send + Sync {
    /// Appends records in one transaction; the database assigns their sequence numbers, returned
    /// in order. Append-only: nothing updates or deletes audit rows.
    async fn append_audit(&self, records: &[AuditRecord]) -> Result<Vec<u64>>;
    /// Newest first, optionally of one tenant, below `before`.
    async fn audit(&self, tenant: Option<&str>, before: Option<u64>, limit: u32) -> Result<Vec<AuditRecord>>;
}

/// Leader election among replicas sharing the database, and their heartbeats.
///
/// One row holds the lease: its holder, the URL it advertises, an epoch that grows on every
/// acquisition, and its expiry. Every time is the database's clock, so replicas' clocks need
/// not agree. A holder keeps the lease by renewing it before it expires; a lease that expired
/// (its holder died, paused or lost the database) may be acquired by any replica, with the
/// next epoch. Batches fenced with an older epoch are refused ([`Change::Fence`]).
#[async_trait]
pub trait LeaseStore: Send + Sync {
    /// Whether several replicas may share this store (a database server): they then elect a
    /// leader through the lease, and the server runs as one replica among them. An embedded
    /// store (a file of one process) keeps the default, `false`.
    fn shared(&self) -> bool {
        false
    }
    /// Acquires the lease for `holder` (advertising `url`) for `ttl_ms`, if nobody holds it,
    /// it has expired, or `holder` holds it already (a replica restarted with the same id takes
    /// over at once; its previous incarnation's epoch is fenced): returns the new epoch, or
    /// `None` when another holder's lease is valid. Of replicas racing, exactly one wins.
    async fn acquire_lease(&self, holder: &str, url: &str, ttl_ms: u64) -> Result<Option<u64>>;
    /// Extends the lease `holder` holds with `epoch` to `ttl_ms` from now; `false` (and
    /// nothing changes) if it has expired or another replica acquired it since.
    async fn renew_lease(&self, holder: &str, epoch: u64, ttl_ms: u64) -> Result<bool>;
    /// Gives the lease up (it expires now) if `holder` holds it with `epoch`.
    async fn release_lease(&self, holder: &str, epoch: u64) -> Result<()>;
    /// The lease, valid or not; `None` if it was never acquired.
    async fn lease(&self) -> Result<Option<LeaseRecord>>;
    /// Records a heartbeat of a replica (its `last_seen` and `age_ms` are ignored).
    async fn heartbeat(&self, r: &ReplicaRecord) -> Result<()>;
    /// Every replica that sent a heartbeat and was not pruned, by id.
    async fn replicas(&self) -> Result<Vec<ReplicaRecord>>;
    /// Forgets replicas silent for more than `idle_ms`; returns how many.
    async fn prune_replicas(&self, idle_ms: u64) -> Result<u64>;
}

/// A GPU taken out of placement because it failed; kept until a platform admin clears it, so
/// that a restart does not put work on it again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuHealthRecord {
    pub node: String,
    pub gpu: u8,
    /// Milliseconds since the Unix epoch.
    pub since: i64,
    /// The critical XID, when one caused it.
    pub xid: Option<u32>,
    /// What happened, for people.
    pub detail: String,
    /// Why it failed (a node that comes back clears only [`HealthCause::Lost`]).
    pub cause: HealthCause,
}

/// Why a GPU was taken out of placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HealthCause {
    /// A critical XID error.
    Xid,
    /// The GPU or its node disappeared.
    Lost,
    /// Creating a partition on it failed.
    Partition,
}

impl HealthCause {
    pub fn as_str(self) -> &'static str {
        match self {
            HealthCause::Xid => "xid",
            HealthCause::Lost => "lost",
            HealthCause::Partition => "partition-failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [HealthCause::Xid, HealthCause::Lost, HealthCause::Partition]
            .into_iter()
            .find(|c| c.as_str() == s)
    }
}

/// Where a node stands for placement, as operators (a cordon, a drain, maintenance, a rolling
/// upgrade) made it: `ready` (no record), `cordoned`, `draining` or `maintenance`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NodeState {
    /// Open to new work (a node without a [`NodeStateRecord`]).
    Ready,
    /// Closed to new work; what runs stays.
    Cordoned,
    /// Closed to new work while what runs is moved or ends (`tessera node drain`).
    Draining,
    /// Closed and empty: the node may be worked on.
    Maintenance,
}

impl NodeState {
    pub const ALL: [NodeState; 4] = [
        NodeState::Ready,
        NodeState::Cordoned,
        NodeState::Draining,
        NodeState::Maintenance,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Ready => "ready",
            NodeState::Cordoned => "cordoned",
            NodeState::Draining => "draining",
            NodeState::Maintenance => "maintenance",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|x| x.as_str() == s)
    }
}

impl std::fmt::Display for NodeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A node an operator took out of placement: `cordoned`, `draining` or `maintenance`
/// (a node without a record is `ready`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeStateRecord {
    pub node: String,
    pub state: NodeState,
    /// Milliseconds since the Unix epoch.
    pub since: i64,
    /// Who asked, and why.
    pub detail: String,
}

/// The MIG mode an admin set on a GPU (a GPU without a record has its pool's mode).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuMigRecord {
    pub node: String,
    pub gpu: u8,
    /// The mode asked for.
    pub enabled: bool,
    /// The driver applies it only after a GPU reset (Tessera never resets a GPU).
    pub pending: bool,
    /// Milliseconds since the Unix epoch.
    pub since: i64,
    /// Who asked.
    pub detail: String,
}

/// A drain in progress: what its policy is, so that a restart resumes it unchanged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainRecord {
    pub node: String,
    /// When the policy applies (ms since the epoch); `None`: no deadline.
    pub deadline_ms: Option<i64>,
    /// After the deadline: preempt what is left (else keep waiting).
    pub preempt: bool,
}

/// A service being moved — off a draining node, or by consolidation so that a waiting request
/// fits: the replacement runs before the old one stops. Stored when the replacement is
/// created, cleared when the move ends (the replacement runs and the old one stops, or the
/// replacement ends before it runs), so that a restart mid-move neither starts a second
/// replacement nor leaves both running.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceMoveRecord {
    pub old: WorkloadId,
    pub replacement: WorkloadId,
    /// The node the service is moved off (the node being drained, or where it ran).
    pub node: String,
    /// Why it moves.
    pub cause: MoveCause,
    /// The request the move makes room for (consolidation only).
    pub by: Option<WorkloadId>,
}

/// Why a service is being moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MoveCause {
    /// Its node is drained.
    Drain,
    /// Consolidation: a request waiting for fragmented capacity fits once it moves.
    Consolidation,
}

impl MoveCause {
    pub fn as_str(self) -> &'static str {
        match self {
            MoveCause::Drain => "drain",
            MoveCause::Consolidation => "consolidation",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [MoveCause::Drain, MoveCause::Consolidation]
            .into_iter()
            .find(|c| c.as_str() == s)
    }
}

/// Fleet operations: unhealthy GPUs, operator node states, drains and service moves, all
/// surviving restarts.
#[async_trait]
pub trait FleetStore: Send + Sync {
    /// Records (or replaces) an unhealthy GPU.
    async fn set_gpu_unhealthy(&self, r: &GpuHealthRecord) -> Result<()>;
    /// Clears an unhealthy GPU; `false` if it was not recorded.
    async fn clear_gpu_health(&self, node: &str, gpu: u8) -> Result<bool>;
    /// Every unhealthy GPU, by node then GPU.
    async fn unhealthy_gpus(&self) -> Result<Vec<GpuHealthRecord>>;
    /// Records (or replaces) a node's state.
    async fn set_node_state(&self, r: &NodeStateRecord) -> Result<()>;
    /// Returns a node to `ready`; `false` if it had no state recorded.
    async fn clear_node_state(&self, node: &str) -> Result<bool>;
    /// Every node with a state, by node.
    async fn node_states(&self) -> Result<Vec<NodeStateRecord>>;
    /// Records (or replaces) the policy of a node's drain.
    async fn set_drain(&self, r: &DrainRecord) -> Result<()>;
    /// Forgets a node's drain; `false` if none was recorded.
    async fn clear_drain(&self, node: &str) -> Result<bool>;
    /// Every drain in progress, by node.
    async fn drains(&self) -> Result<Vec<DrainRecord>>;
    /// Records (or replaces) the replacement of a service being moved.
    async fn set_service_move(&self, r: &ServiceMoveRecord) -> Result<()>;
    /// Forgets the move of `old`; `false` if none was recorded.
    async fn clear_service_move(&self, old: WorkloadId) -> Result<bool>;
    /// Every service move in progress, by old workload.
    async fn service_moves(&self) -> Result<Vec<ServiceMoveRecord>>;
    /// Records (or replaces) the MIG mode an admin set on a GPU.
    async fn set_gpu_mig(&self, r: &GpuMigRecord) -> Result<()>;
    /// Every GPU whose MIG mode an admin set, by node then GPU.
    async fn gpu_mig_modes(&self) -> Result<Vec<GpuMigRecord>>;
}

/// Where a rolling upgrade stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RolloutState {
    /// Taking nodes (or waiting for the ones it took).
    Running,
    /// Every node upgraded and back in placement.
    Done,
    /// A node failed validation: no more nodes are taken.
    Failed,
    /// Cancelled by an admin: no more nodes are taken; those already out finish.
    Cancelled,
}

impl RolloutState {
    pub const ALL: [RolloutState; 4] = [
        RolloutState::Running,
        RolloutState::Done,
        RolloutState::Failed,
        RolloutState::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RolloutState::Running => "running",
            RolloutState::Done => "done",
            RolloutState::Failed => "failed",
            RolloutState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|x| x.as_str() == s)
    }
}

/// Where one node of a rolling upgrade stands: pending → draining → upgrading → validating →
/// done | failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RolloutNodeState {
    Pending,
    Draining,
    Upgrading,
    Validating,
    Done,
    Failed,
}

impl RolloutNodeState {
    pub const ALL: [RolloutNodeState; 6] = [
        RolloutNodeState::Pending,
        RolloutNodeState::Draining,
        RolloutNodeState::Upgrading,
        RolloutNodeState::Validating,
        RolloutNodeState::Done,
        RolloutNodeState::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RolloutNodeState::Pending => "pending",
            RolloutNodeState::Draining => "draining",
            RolloutNodeState::Upgrading => "upgrading",
            RolloutNodeState::Validating => "validating",
            RolloutNodeState::Done => "done",
            RolloutNodeState::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// Out of placement because of the rollout.
    pub fn is_out(self) -> bool {
        matches!(
            self,
            RolloutNodeState::Draining | RolloutNodeState::Upgrading | RolloutNodeState::Validating
        )
    }
}

/// One node of a rolling upgrade.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutNodeRecord {
    pub node: String,
    pub state: RolloutNodeState,
    /// When it entered its state (ms since the epoch).
    pub since: i64,
    /// When the rollout took it (its drain began).
    pub started_at: Option<i64>,
    /// When it was done or failed.
    pub ended_at: Option<i64>,
    /// A simulated upgrade's end (ms since the epoch), while `upgrading` on the sim backend.
    pub upgrade_until: Option<i64>,
    /// The node's MIG layout before the drain, as the controller wrote it down, to compare at
    /// validation.
    pub layout: String,
    /// Why it is in its state, for people.
    pub detail: String,
}

/// A rolling upgrade of one pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutRecord {
    /// Assigned by the store ([`RolloutStore::create_rollout`]).
    pub id: u64,
    pub pool: String,
    pub max_parallel: u32,
    /// GPU units (thousandths) that may be out at once.
    pub max_unavailable_milli: u64,
    /// Per-node drain deadline, seconds; `None`: no deadline.
    pub deadline_s: Option<u64>,
    /// After a node's drain deadline: preempt (else wait).
    pub preempt: bool,
    /// A simulated upgrade's length, seconds; `None`: wait for `node done`.
    pub upgrade_s: Option<u64>,
    pub state: RolloutState,
    pub created_at: i64,
    pub created_by: String,
    pub ended_at: Option<i64>,
    pub detail: String,
    /// In plan order at creation; the controller may take them in another order.
    pub nodes: Vec<RolloutNodeRecord>,
}

/// Rolling upgrades, so that a restart mid-rollout resumes where it was.
#[async_trait]
pub trait RolloutStore: Send + Sync {
    /// Stores a new rollout with its nodes; the id comes from the database's own sequence
    /// (the record's is ignored) and is returned.
    async fn create_rollout(&self, r: &RolloutRecord) -> Result<u64>;
    /// Replaces a stored rollout and its nodes in one transaction; `Corrupt` if it is not
    /// stored.
    async fn save_rollout(&self, r: &RolloutRecord) -> Result<()>;
    /// Every rollout, newest first, with its nodes in their stored order.
    async fn rollouts(&self) -> Result<Vec<RolloutRecord>>;
}

/// What a stored telemetry series is of ([`TelemetryStore`]).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TelemetrySeries {
    /// A pool's mean GPU utilisation.
    Pool(String),
    /// A workload's devices: their mean utilisation and memory.
    Workload(u64),
}

/// A telemetry record ([`TelemetryStore`]): one minute of a series, or (for a workload's
/// minutes older than a day, [`TelemetryStore::fold_telemetry`]) an hour's minutes taken
/// together. The figures are sums over the minutes it takes together, so that hours add up
/// exactly; a minute's sums are its figures.
#[derive(Clone, Debug, PartialEq)]
pub struct TelemetryRecord {
    pub series: TelemetrySeries,
    /// Its start, ms since the epoch (a minute's, or an hour's for an hour record).
    pub at: i64,
    /// How long it spans: 1 (a minute) or 60 (an hour).
    pub span_minutes: u32,
    /// How many minutes' samples it takes together (1 for a minute).
    pub minutes: u32,
    /// Sum of the minutes' utilisation, percent; `None` where none was reported.
    pub util_sum: Option<f64>,
    /// Sum of the minutes' memory in use, MiB (workloads only).
    pub used_mib_sum: Option<f64>,
    /// The most memory the devices had in one of its minutes, MiB (workloads only).
    pub total_mib: Option<u64>,
}

/// The console's telemetry history, so that its charts survive a restart and a failover: the
/// minute samples the server takes of each pool and each workload, hours for a workload's
/// minutes older than a day, nothing older than the caller prunes.
///
/// A record is keyed by its series, its span and its start: writing one that is already
/// stored replaces its figures (the sampler samples a minute again as its figures come in;
/// a retry writes the same figures, so it is harmless).
#[async_trait]
pub trait TelemetryStore: Send + Sync {
    /// Stores `records`, in statements of at most [`TELEMETRY_ROWS_PER_WRITE`] rows each
    /// committed on its own (a long write never holds the database for long), replacing the
    /// figures of any already stored (within one write, the last of a key wins); returns how
    /// many it wrote.
    async fn append_telemetry(&self, records: &[TelemetryRecord]) -> Result<u64>;
    /// Every record starting at or after `from` and before `to`, oldest first (those of the
    /// same start in no particular order). A caller reading much reads it in spans (the
    /// server reads 30 days a day at a time).
    async fn telemetry_between(&self, from: i64, to: i64) -> Result<Vec<TelemetryRecord>>;
    /// Folds the workload minutes starting at or after `from` and before `before` (both an
    /// hour's start) into one hour record per workload and hour, and deletes those minutes, in
    /// one transaction that reads only that span; an hour already stored keeps its figures (the
    /// minutes are deleted all the same). Pools' minutes are left as they are. Returns how many
    /// hour records were written. The server folds an hour at a time.
    async fn fold_telemetry(&self, from: i64, before: i64) -> Result<u64>;
    /// Forgets every record starting before `before`; returns how many.
    async fn prune_telemetry(&self, before: i64) -> Result<u64>;
}

/// The most rows one statement of [`TelemetryStore::append_telemetry`] writes.
pub const TELEMETRY_ROWS_PER_WRITE: usize = 500;

/// Everything the control plane needs from its database.
pub trait Store:
    TenancyStore
    + TokenStore
    + WorkloadStore
    + LedgerStore
    + GovernanceStore
    + AuditStore
    + FleetStore
    + LeaseStore
    + RolloutStore
    + TelemetryStore
    + 'static
{
}

impl<
    T: TenancyStore
        + TokenStore
        + WorkloadStore
        + LedgerStore
        + GovernanceStore
        + AuditStore
        + FleetStore
        + LeaseStore
        + RolloutStore
        + TelemetryStore
        + 'static,
> Store for T
{
}
