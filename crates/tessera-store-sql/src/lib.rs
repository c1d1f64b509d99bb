//! # tessera-store-sql
//!
//! The statements of Tessera's SQL stores, written once: every trait of the `tessera-store`
//! contract on SQL — its statements, how their parameters are bound and their rows decoded, the
//! lifecycle batch in few statements, the multi-row writes — generic over a small [`Driver`]
//! trait that `tessera-store-sqlite` and `tessera-store-postgres` implement.
//!
//! A driver supplies what differs between the databases, and nothing else:
//!
//! * **connections and transactions** — its pooled connection, its write transaction (SQLite's
//!   `BEGIN IMMEDIATE`, PostgreSQL's `BEGIN`) and the connection both lend, on which
//!   statements run ([`Driver::execute`], [`Driver::fetch_all`], [`Driver::fetch_optional`]);
//!   failures come back classified ([`DbError`]);
//! * **parameters and rows** — statements bind [`Value`]s (integers, texts, booleans, floats,
//!   each possibly NULL) in `$1, $2 …` order, and read [`Row`]s by column name (and by position,
//!   as [`Cells`], for workloads);
//! * **multi-row statements** — the text of a [`MultiRow`] statement (SQLite: `VALUES` lists of
//!   anonymous `?` in fixed chunk sizes; PostgreSQL: one typed array per column through
//!   `UNNEST`) and how many rows one statement takes ([`Driver::ROWS_PER_STATEMENT`]);
//! * **the statements whose text differs** — row locks ([`Driver::LOCK_TENANT`],
//!   [`Driver::LOCK_REVOCATION`]), the month's closed use ([`Driver::CLOSED_USAGE`]), the lease's
//!   statements, made by [`lease_sql!`] from the database's clock and its fence lock, and the
//!   revocation notice ([`Driver::NOTIFY_REVOCATION`]);
//! * **the reads only one database does its own way** — every active workload at once
//!   ([`Driver::read_active`]) and revocation news from other replicas
//!   ([`Driver::revocation_news`]).
//!
//! The store type itself (`SqliteStore`, `PgStore`) is the driver: it implements [`Driver`], and
//! [`implement_store!`] implements the ten traits of the contract for it by calling this
//! crate's generic functions (one per trait method, in the module of its trait). The macro is
//! only that forwarding: Rust lets a crate implement the contract's traits only for its own
//! types, and the store types keep their names and constructors in their own crates.
//!
//! No SQL driver is compiled here: this crate depends on sqlx's core only, for what both sqlx
//! drivers share whatever their database ([`sqlx_common`]).

pub mod audit;
pub mod batch;
pub mod columns;
pub mod fleet;
pub mod governance;
pub mod lease;
pub mod ledger;
pub mod rollouts;
pub mod rows;
pub mod sqlx_common;
pub mod telemetry;
pub mod tenancy;
pub mod tokens;
pub mod workloads;

use std::borrow::Cow;
use std::future::Future;
use std::marker::PhantomData;
use std::ops::DerefMut;

use columns::Cells;
use tessera_domain::Workload;
use tessera_store::{Result, StoreError};

pub use lease::LeaseSql;
pub use rows::{Group, MultiRow, Values};

// Integer columns: narrowing, and the signed BIGINT form of unsigned values.
pub use columns::{i64_of, narrow, narrow_opt, u64_of};

/// What [`implement_store!`] expands to needs (not part of the API).
#[doc(hidden)]
pub mod __private {
    pub use async_trait::async_trait;
    pub use tessera_domain;
    pub use tessera_store;
    pub use tokio;
}

/// What the SQL code needs from one database: its connections and transactions, how a
/// statement runs on them, and the few statements whose text differs. Implemented by each SQL
/// store's type; see the crate's documentation.
pub trait Driver: Sized + Send + Sync + 'static {
    /// A connection, on which statements run (lent by [`Driver::Pooled`] and
    /// [`Driver::Transaction`]).
    type Connection: Send;
    /// A connection of the pool, for reads and single statements.
    type Pooled: DerefMut<Target = Self::Connection> + Send;
    /// A transaction that writes; rolled back if dropped without [`Driver::commit`].
    type Transaction: DerefMut<Target = Self::Connection> + Send;
    /// A row a statement returned.
    type Row: Row;

    /// Whether replicas share the database and elect a leader ([`tessera_store::LeaseStore::shared`]).
    const SHARED: bool;
    /// Reads `name` of the tenant `$1`, locking the row until the transaction ends where the
    /// database has row locks.
    const LOCK_TENANT: &'static str;
    /// Reads `id, role, revoked_at` of the token `$1` and of every lasting token of role `$2`,
    /// in id order, locked until the transaction ends where the database has row locks.
    const LOCK_REVOCATION: &'static str;
    /// Tells the other replicas (at commit) that token `$1` was revoked, where they can hear it.
    const NOTIFY_REVOCATION: Option<&'static str>;
    /// Closed use per tenant (`tenant`, `used`) within `[$1, $2)`
    /// ([`tessera_store::LedgerStore::closed_usage`]).
    const CLOSED_USAGE: &'static str;
    /// The lease's statements on the database's clock ([`lease_sql!`]).
    const LEASE: LeaseSql;
    /// How many rows one multi-row statement writes: the sizes, largest first, into which the
    /// rows are split greedily, the rest (fewer than the smallest) in one last statement; empty:
    /// all of them in one statement.
    const ROWS_PER_STATEMENT: &'static [usize];

    /// A connection of the pool.
    fn conn(&self) -> impl Future<Output = Result<Self::Pooled>> + Send;
    /// Begins a transaction that writes.
    fn begin_write(&self) -> impl Future<Output = Result<Self::Transaction>> + Send;
    /// Commits `tx`.
    fn commit(tx: Self::Transaction) -> impl Future<Output = Result<()>> + Send;
    /// Rolls `tx` back.
    fn rollback(tx: Self::Transaction) -> impl Future<Output = Result<()>> + Send;

    /// Runs `q`; the number of rows it changed.
    fn execute(conn: &mut Self::Connection, q: Query<'_, Self>) -> impl Future<Output = DbResult<u64>> + Send;
    /// Runs `q`; every row it returned.
    fn fetch_all(
        conn: &mut Self::Connection,
        q: Query<'_, Self>,
    ) -> impl Future<Output = DbResult<Vec<Self::Row>>> + Send;
    /// Runs `q`; its first row, if any.
    fn fetch_optional(
        conn: &mut Self::Connection,
        q: Query<'_, Self>,
    ) -> impl Future<Output = DbResult<Option<Self::Row>>> + Send;
    /// Runs `statement` for `rows` rows (at most the largest of [`Driver::ROWS_PER_STATEMENT`]),
    /// `values` holding each row's values in turn; the number of rows it changed.
    fn execute_rows(
        conn: &mut Self::Connection,
        statement: &'static MultiRow,
        rows: usize,
        values: Vec<Value<'_>>,
    ) -> impl Future<Output = DbResult<u64>> + Send;

    /// Whether [`Driver::execute_one_statement`] writes a lifecycle batch in one statement
    /// ([`crate::batch`]); `false`: each group of rows is a statement of its own.
    const ONE_STATEMENT: bool = false;

    /// Writes `groups`, then `audit` (the values of audit records without their sequence
    /// numbers, [`audit::AFTER_SEQ`], numbered from the `audit` row of `sequences`), in one
    /// statement inside the caller's transaction, after checking `fence` as
    /// [`LeaseSql::check_fence`] does (locking the lease row until the transaction ends). Only
    /// for drivers with [`Driver::ONE_STATEMENT`]; the sub-statements see the database as it was
    /// before the statement (an update does not find a row the same statement inserts), which
    /// the caller allows for.
    fn execute_one_statement(
        conn: &mut Self::Connection,
        fence: Option<&tessera_store::Fence>,
        groups: Vec<rows::Group<'_>>,
        audit: Option<rows::Group<'_>>,
    ) -> impl Future<Output = DbResult<OneStatement>> + Send {
        let _ = (conn, fence, groups, audit);
        async { unreachable!("only drivers with ONE_STATEMENT write a batch in one statement") }
    }

    /// Whether [`Driver::commit_groups`] writes a whole lifecycle batch by this store's own
    /// means ([`crate::batch`]).
    fn commits_batches(&self) -> bool {
        false
    }

    /// Writes `groups` in order, then `audit` (the values of audit records without their
    /// sequence numbers, [`audit::AFTER_SEQ`], numbered from the `audit` row of `sequences`),
    /// in a write transaction of its own; each group sees the rows the earlier ones wrote.
    /// Committed, `Ok(None)`; where a counted group ([`rows::Group::counted`]) changed fewer
    /// rows than it has, rolled back and `Ok(Some(i))`, `i` its index in `groups`; on an error
    /// rolled back too. Only for stores whose [`Driver::commits_batches`] says so.
    fn commit_groups(
        &self,
        groups: Vec<rows::Group<'_>>,
        audit: Option<rows::Group<'_>>,
    ) -> impl Future<Output = DbResult<Option<usize>>> + Send {
        let _ = (groups, audit);
        async { unreachable!("only stores that commit batches by their own means are asked to") }
    }

    /// Every active workload ([`tessera_store::WorkloadStore::active_workloads`]), selected by
    /// [`workloads::ACTIVE`].
    fn read_active(&self) -> impl Future<Output = Result<Vec<Workload>>> + Send;
    /// Revocation news from other replicas ([`tessera_store::TokenStore::revocations`]).
    fn revocation_news(&self) -> impl Future<Output = Option<tokio::sync::mpsc::UnboundedReceiver<String>>> + Send;
}

/// What [`Driver::execute_one_statement`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OneStatement {
    /// The fence holds (`true` without one).
    pub held: bool,
    /// The rows changed by each counted group ([`rows::Group::counted`]), in order.
    pub counts: Vec<u64>,
}

/// A row a statement returned: its columns by name, and (for workloads, whose columns are read
/// by position) [`Cells`].
pub trait Row: Cells + Send + Sync + 'static {
    /// The integer column `name`, `None` when NULL; `Corrupt` naming it if it holds no integer.
    fn get_int(&self, name: &str) -> Result<Option<i64>>;
    /// The text column `name`, `None` when NULL.
    fn get_text(&self, name: &str) -> Result<Option<&str>>;
    /// The floating-point column `name`, `None` when NULL.
    fn get_float(&self, name: &str) -> Result<Option<f64>>;
    /// The boolean column `name`, `None` when NULL.
    fn get_flag(&self, name: &str) -> Result<Option<bool>>;
}

/// A type a column decodes into ([`col`]).
pub trait Column: Sized {
    /// Column `name` of `row`.
    fn decode(row: &impl Row, name: &str) -> Result<Self>;
}

impl Column for Option<i64> {
    fn decode(row: &impl Row, name: &str) -> Result<Self> {
        row.get_int(name)
    }
}

impl Column for Option<String> {
    fn decode(row: &impl Row, name: &str) -> Result<Self> {
        Ok(row.get_text(name)?.map(str::to_owned))
    }
}

impl Column for Option<f64> {
    fn decode(row: &impl Row, name: &str) -> Result<Self> {
        row.get_float(name)
    }
}

impl Column for Option<bool> {
    fn decode(row: &impl Row, name: &str) -> Result<Self> {
        row.get_flag(name)
    }
}

/// A column that must not be NULL: its `Option`'s value.
macro_rules! not_null {
    ($($ty:ty),*) => {
        $(
            impl Column for $ty {
                fn decode(row: &impl Row, name: &str) -> Result<Self> {
                    Option::<$ty>::decode(row, name)?
                        .ok_or_else(|| StoreError::Corrupt(format!("column `{name}`: unexpected NULL")))
                }
            }
        )*
    };
}

not_null!(i64, String, f64, bool);

/// A column of `row`, or `Corrupt` naming it.
pub fn col<T: Column>(row: &impl Row, name: &str) -> Result<T> {
    T::decode(row, name)
}

/// A failed statement, as the driver classified it.
#[derive(Debug)]
pub enum DbError {
    /// A unique key is violated: the caller says what exists ([`db_error`]).
    UniqueViolation,
    /// Any other failure, in the contract's terms (`Unavailable`, `Corrupt` …).
    Store(StoreError),
}

impl From<StoreError> for DbError {
    fn from(e: StoreError) -> Self {
        DbError::Store(e)
    }
}

/// What a statement returns, or how it failed.
pub type DbResult<T> = std::result::Result<T, DbError>;

/// A database error, in the contract's terms: a unique-key violation says what exists.
pub fn db_error(e: DbError, what: impl FnOnce() -> String) -> StoreError {
    match e {
        DbError::UniqueViolation => StoreError::Conflict(what()),
        DbError::Store(e) => e,
    }
}

/// A database error of an operation that violates no unique key of its own.
pub fn db(e: DbError) -> StoreError {
    db_error(e, || "a row".into())
}

/// A parameter of a statement. The variant is the SQL type (`BIGINT`, `TEXT`, `BOOLEAN`,
/// `DOUBLE PRECISION`), also when the value is NULL.
#[derive(Clone, Debug, PartialEq)]
pub enum Value<'a> {
    Int(Option<i64>),
    Text(Option<Cow<'a, str>>),
    Flag(Option<bool>),
    Float(Option<f64>),
}

macro_rules! values {
    ($($ty:ty => |$v:ident| $e:expr),* $(,)?) => {
        $(
            impl<'a> From<$ty> for Value<'a> {
                fn from($v: $ty) -> Self {
                    $e
                }
            }
        )*
    };
}

values! {
    i64 => |v| Value::Int(Some(v)),
    Option<i64> => |v| Value::Int(v),
    bool => |v| Value::Flag(Some(v)),
    Option<bool> => |v| Value::Flag(v),
    f64 => |v| Value::Float(Some(v)),
    Option<f64> => |v| Value::Float(v),
    &'a str => |v| Value::Text(Some(Cow::Borrowed(v))),
    Option<&'a str> => |v| Value::Text(v.map(Cow::Borrowed)),
    &'a String => |v| Value::Text(Some(Cow::Borrowed(v.as_str()))),
    Option<&'a String> => |v| Value::Text(v.map(|s| Cow::Borrowed(s.as_str()))),
    &'a Option<String> => |v| Value::Text(v.as_deref().map(Cow::Borrowed)),
    String => |v| Value::Text(Some(Cow::Owned(v))),
    Option<String> => |v| Value::Text(v.map(Cow::Owned)),
}

/// A statement with its parameters, for driver `D`: `query::<D>("… $1 …").bind(x)`, then run
/// on a connection.
#[derive(Debug)]
pub struct Query<'a, D> {
    sql: &'static str,
    args: Vec<Value<'a>>,
    driver: PhantomData<fn() -> D>,
}

/// The statement `sql` (placeholders `$1, $2 …`), no parameters bound yet.
pub fn query<'a, D: Driver>(sql: &'static str) -> Query<'a, D> {
    Query {
        sql,
        args: Vec::new(),
        driver: PhantomData,
    }
}

impl<'a, D: Driver> Query<'a, D> {
    /// The statement with `v` as its next parameter.
    pub fn bind(mut self, v: impl Into<Value<'a>>) -> Self {
        self.args.push(v.into());
        self
    }

    /// The statement's text.
    pub fn sql(&self) -> &'static str {
        self.sql
    }

    /// The parameters, in order.
    pub fn into_args(self) -> Vec<Value<'a>> {
        self.args
    }

    /// Runs the statement; the number of rows it changed.
    pub async fn execute(self, conn: &mut D::Connection) -> DbResult<u64> {
        D::execute(conn, self).await
    }

    /// Runs the statement; every row it returned.
    pub async fn fetch_all(self, conn: &mut D::Connection) -> DbResult<Vec<D::Row>> {
        D::fetch_all(conn, self).await
    }

    /// Runs the statement; its first row, if any.
    pub async fn fetch_optional(self, conn: &mut D::Connection) -> DbResult<Option<D::Row>> {
        D::fetch_optional(conn, self).await
    }

    /// Runs the statement; its first row, which must be there (`Corrupt` otherwise).
    pub async fn fetch_one(self, conn: &mut D::Connection) -> DbResult<D::Row> {
        D::fetch_optional(conn, self).await?.ok_or_else(|| {
            DbError::Store(StoreError::Corrupt(
                "no rows returned by a query that expected to return at least one row".into(),
            ))
        })
    }
}

/// Runs `q` on a connection of `s`'s pool; its first row, if any, as `read` reads it.
pub(crate) async fn read_optional<D: Driver, T>(
    s: &D,
    q: Query<'_, D>,
    read: impl FnOnce(&D::Row) -> Result<T> + Send,
) -> Result<Option<T>> {
    let row = q.fetch_optional(&mut *s.conn().await?).await.map_err(db)?;
    row.as_ref().map(read).transpose()
}

/// Implements the ten traits of the `tessera-store` contract for a store type that implements
/// [`Driver`], each method calling this crate's generic function of the same name in the module
/// of its trait (`TenancyStore::create_tenant` → [`tenancy::create_tenant`], …).
#[macro_export]
macro_rules! implement_store {
    ($store:ty) => {
        const _: () = {
            use $crate::__private::tessera_domain::{Event, Workload, WorkloadId};
            use $crate::__private::tessera_store::{
                AuditRecord, AuditStore, Change, DrainRecord, FleetStore, GovernanceStore, GpuHealthRecord,
                GpuMigRecord, ImagePolicyRecord, LeaseRecord, LeaseStore, LedgerStore, NodeStateRecord, ProjectRecord,
                QuotaRecord, ReplicaRecord, Result, Revocation, RolloutRecord, RolloutStore, ServiceMoveRecord,
                TelemetryRecord, TelemetryStore, TenancyChange, TenancyStore, TenantRecord, TokenRecord, TokenStore,
                UsageInterval, WorkloadFilter, WorkloadStore,
            };
            use $crate::{audit, fleet, governance, lease, ledger, rollouts, telemetry, tenancy, tokens, workloads};

            #[$crate::__private::async_trait]
            impl TenancyStore for $store {
                async fn create_tenant(&self, t: &TenantRecord) -> Result<()> {
                    tenancy::create_tenant(self, t).await
                }
                async fn get_tenant(&self, name: &str) -> Result<Option<TenantRecord>> {
                    tenancy::get_tenant(self, name).await
                }
                async fn list_tenants(&self, after: Option<&str>, limit: u32) -> Result<Vec<TenantRecord>> {
                    tenancy::list_tenants(self, after, limit).await
                }
                async fn delete_tenant(&self, name: &str) -> Result<bool> {
                    tenancy::delete_tenant(self, name).await
                }
                async fn create_project(&self, p: &ProjectRecord) -> Result<()> {
                    tenancy::create_project(self, p).await
                }
                async fn get_project(&self, tenant: &str, name: &str) -> Result<Option<ProjectRecord>> {
                    tenancy::get_project(self, tenant, name).await
                }
                async fn list_projects(
                    &self,
                    tenant: &str,
                    after: Option<&str>,
                    limit: u32,
                ) -> Result<Vec<ProjectRecord>> {
                    tenancy::list_projects(self, tenant, after, limit).await
                }
                async fn delete_project(&self, tenant: &str, name: &str) -> Result<bool> {
                    tenancy::delete_project(self, tenant, name).await
                }
                async fn set_image_policy(&self, p: &ImagePolicyRecord, audit: &AuditRecord) -> Result<()> {
                    tenancy::set_image_policy(self, p, audit).await
                }
                async fn image_policy(&self, tenant: &str) -> Result<Option<ImagePolicyRecord>> {
                    tenancy::image_policy(self, tenant).await
                }
                async fn delete_image_policy(&self, tenant: &str, audit: &AuditRecord) -> Result<bool> {
                    tenancy::delete_image_policy(self, tenant, audit).await
                }
                async fn set_tenant_priorities(
                    &self,
                    tenant: &str,
                    classes: Option<&[String]>,
                    audit: &AuditRecord,
                ) -> Result<bool> {
                    tenancy::set_tenant_priorities(self, tenant, classes, audit).await
                }
                async fn apply_tenancy(&self, changes: &[TenancyChange], audit: &[AuditRecord]) -> Result<()> {
                    tenancy::apply_tenancy(self, changes, audit).await
                }
            }

            #[$crate::__private::async_trait]
            impl TokenStore for $store {
                async fn create_token(&self, t: &TokenRecord) -> Result<()> {
                    tokens::create_token(self, t).await
                }
                async fn find_token(&self, hash: &str) -> Result<Option<TokenRecord>> {
                    tokens::find_token(self, hash).await
                }
                async fn get_token(&self, id: &str) -> Result<Option<TokenRecord>> {
                    tokens::get_token(self, id).await
                }
                async fn list_tokens(&self, tenant: Option<&str>) -> Result<Vec<TokenRecord>> {
                    tokens::list_tokens(self, tenant).await
                }
                async fn revoke_token(&self, id: &str, at: i64) -> Result<Revocation> {
                    tokens::revoke_token(self, id, at).await
                }
                async fn token_count(&self) -> Result<u64> {
                    tokens::token_count(self).await
                }
                async fn revocations(&self) -> Option<$crate::__private::tokio::sync::mpsc::UnboundedReceiver<String>> {
                    <$store as $crate::Driver>::revocation_news(self).await
                }
            }

            #[$crate::__private::async_trait]
            impl WorkloadStore for $store {
                async fn reserve_workload_ids(&self, n: u32) -> Result<std::ops::Range<u64>> {
                    workloads::reserve_workload_ids(self, n).await
                }
                async fn commit(&self, batch: &[Change]) -> Result<()> {
                    $crate::batch::commit(self, batch).await
                }
                async fn get_workload(&self, id: WorkloadId, scope: Option<&str>) -> Result<Option<Workload>> {
                    workloads::get_workload(self, id, scope).await
                }
                async fn list_workloads(&self, f: &WorkloadFilter) -> Result<Vec<Workload>> {
                    workloads::list_workloads(self, f).await
                }
                async fn count_workloads(&self, f: &WorkloadFilter) -> Result<u64> {
                    workloads::count_workloads(self, f).await
                }
                async fn events(&self, id: WorkloadId, scope: Option<&str>) -> Result<Vec<Event>> {
                    workloads::events(self, id, scope).await
                }
                async fn active_workloads(&self) -> Result<Vec<Workload>> {
                    <$store as $crate::Driver>::read_active(self).await
                }
                async fn idempotent(&self, actor: &str, key: &str) -> Result<Option<(String, WorkloadId)>> {
                    workloads::idempotent(self, actor, key).await
                }
            }

            #[$crate::__private::async_trait]
            impl LedgerStore for $store {
                async fn usage_of(&self, id: WorkloadId) -> Result<Vec<UsageInterval>> {
                    ledger::usage_of(self, id).await
                }
                async fn usage_between(&self, tenant: Option<&str>, from: i64, to: i64) -> Result<Vec<UsageInterval>> {
                    ledger::usage_between(self, tenant, from, to).await
                }
                async fn closed_usage(&self, from: i64, to: i64) -> Result<Vec<(String, i64)>> {
                    ledger::closed_usage(self, from, to).await
                }
            }

            #[$crate::__private::async_trait]
            impl GovernanceStore for $store {
                async fn set_quota(&self, q: &QuotaRecord, at: i64) -> Result<()> {
                    governance::set_quota(self, q, at).await
                }
                async fn delete_quota(&self, tenant: &str, class: &str) -> Result<bool> {
                    governance::delete_quota(self, tenant, class).await
                }
                async fn quotas(&self) -> Result<Vec<QuotaRecord>> {
                    governance::quotas(self).await
                }
                async fn set_budget(&self, tenant: &str, unit_hours: Option<f64>, at: i64) -> Result<()> {
                    governance::set_budget(self, tenant, unit_hours, at).await
                }
                async fn budgets(&self) -> Result<Vec<(String, f64)>> {
                    governance::budgets(self).await
                }
            }

            #[$crate::__private::async_trait]
            impl AuditStore for $store {
                async fn append_audit(&self, records: &[AuditRecord]) -> Result<Vec<u64>> {
                    audit::append_audit(self, records).await
                }
                async fn audit(
                    &self,
                    tenant: Option<&str>,
                    before: Option<u64>,
                    limit: u32,
                ) -> Result<Vec<AuditRecord>> {
                    audit::audit(self, tenant, before, limit).await
                }
            }

            #[$crate::__private::async_trait]
            impl LeaseStore for $store {
                fn shared(&self) -> bool {
                    <$store as $crate::Driver>::SHARED
                }
                async fn acquire_lease(&self, holder: &str, url: &str, ttl_ms: u64) -> Result<Option<u64>> {
                    lease::acquire_lease(self, holder, url, ttl_ms).await
                }
                async fn renew_lease(&self, holder: &str, epoch: u64, ttl_ms: u64) -> Result<bool> {
                    lease::renew_lease(self, holder, epoch, ttl_ms).await
                }
                async fn release_lease(&self, holder: &str, epoch: u64) -> Result<()> {
                    lease::release_lease(self, holder, epoch).await
                }
                async fn lease(&self) -> Result<Option<LeaseRecord>> {
                    lease::lease(self).await
                }
                async fn heartbeat(&self, r: &ReplicaRecord) -> Result<()> {
                    lease::heartbeat(self, r).await
                }
                async fn replicas(&self) -> Result<Vec<ReplicaRecord>> {
                    lease::replicas(self).await
                }
                async fn prune_replicas(&self, idle_ms: u64) -> Result<u64> {
                    lease::prune_replicas(self, idle_ms).await
                }
            }

            #[$crate::__private::async_trait]
            impl FleetStore for $store {
                async fn set_gpu_unhealthy(&self, r: &GpuHealthRecord) -> Result<()> {
                    fleet::set_gpu_unhealthy(self, r).await
                }
                async fn clear_gpu_health(&self, node: &str, gpu: u8) -> Result<bool> {
                    fleet::clear_gpu_health(self, node, gpu).await
                }
                async fn unhealthy_gpus(&self) -> Result<Vec<GpuHealthRecord>> {
                    fleet::unhealthy_gpus(self).await
                }
                async fn set_node_state(&self, r: &NodeStateRecord) -> Result<()> {
                    fleet::set_node_state(self, r).await
                }
                async fn clear_node_state(&self, node: &str) -> Result<bool> {
                    fleet::clear_node_state(self, node).await
                }
                async fn node_states(&self) -> Result<Vec<NodeStateRecord>> {
                    fleet::node_states(self).await
                }
                async fn set_drain(&self, r: &DrainRecord) -> Result<()> {
                    fleet::set_drain(self, r).await
                }
                async fn clear_drain(&self, node: &str) -> Result<bool> {
                    fleet::clear_drain(self, node).await
                }
                async fn drains(&self) -> Result<Vec<DrainRecord>> {
                    fleet::drains(self).await
                }
                async fn set_service_move(&self, r: &ServiceMoveRecord) -> Result<()> {
                    fleet::set_service_move(self, r).await
                }
                async fn clear_service_move(&self, old: WorkloadId) -> Result<bool> {
                    fleet::clear_service_move(self, old).await
                }
                async fn service_moves(&self) -> Result<Vec<ServiceMoveRecord>> {
                    fleet::service_moves(self).await
                }
                async fn set_gpu_mig(&self, r: &GpuMigRecord) -> Result<()> {
                    fleet::set_gpu_mig(self, r).await
                }
                async fn gpu_mig_modes(&self) -> Result<Vec<GpuMigRecord>> {
                    fleet::gpu_mig_modes(self).await
                }
            }

            #[$crate::__private::async_trait]
            impl RolloutStore for $store {
                async fn create_rollout(&self, r: &RolloutRecord) -> Result<u64> {
                    rollouts::create_rollout(self, r).await
                }
                async fn save_rollout(&self, r: &RolloutRecord) -> Result<()> {
                    rollouts::save_rollout(self, r).await
                }
                async fn rollouts(&self) -> Result<Vec<RolloutRecord>> {
                    rollouts::rollouts(self).await
                }
            }

            #[$crate::__private::async_trait]
            impl TelemetryStore for $store {
                async fn append_telemetry(&self, records: &[TelemetryRecord]) -> Result<u64> {
                    telemetry::append_telemetry(self, records).await
                }
                async fn telemetry_between(&self, from: i64, to: i64) -> Result<Vec<TelemetryRecord>> {
                    telemetry::telemetry_between(self, from, to).await
                }
                async fn fold_telemetry(&self, from: i64, before: i64) -> Result<u64> {
                    telemetry::fold_telemetry(self, from, before).await
                }
                async fn prune_telemetry(&self, before: i64) -> Result<u64> {
                    telemetry::prune_telemetry(self, before).await
                }
            }
        };
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row of named integer, text, float and boolean columns, any of them NULL.
    struct Named(Vec<(&'static str, Value<'static>)>);

    impl Named {
        fn get(&self, name: &str) -> Result<&Value<'static>> {
            self.0
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v)
                .ok_or_else(|| StoreError::Corrupt(format!("column `{name}`: no such column")))
        }
    }

    impl Cells for Named {
        fn int(&self, _: usize) -> Result<Option<i64>> {
            unreachable!("read by name")
        }
        fn text(&self, _: usize) -> Result<Option<&str>> {
            unreachable!("read by name")
        }
        fn flag(&self, _: usize) -> Result<bool> {
            unreachable!("read by name")
        }
    }

    impl Row for Named {
        fn get_int(&self, name: &str) -> Result<Option<i64>> {
            match self.get(name)? {
                Value::Int(v) => Ok(*v),
                _ => Err(StoreError::Corrupt(format!("column `{name}`: not an integer"))),
            }
        }
        fn get_text(&self, name: &str) -> Result<Option<&str>> {
            match self.get(name)? {
                Value::Text(v) => Ok(v.as_deref()),
                _ => Err(StoreError::Corrupt(format!("column `{name}`: not a text"))),
            }
        }
        fn get_float(&self, name: &str) -> Result<Option<f64>> {
            match self.get(name)? {
                Value::Float(v) => Ok(*v),
                _ => Err(StoreError::Corrupt(format!("column `{name}`: not a float"))),
            }
        }
        fn get_flag(&self, name: &str) -> Result<Option<bool>> {
            match self.get(name)? {
                Value::Flag(v) => Ok(*v),
                _ => Err(StoreError::Corrupt(format!("column `{name}`: not a boolean"))),
            }
        }
    }

    #[test]
    fn columns_decode_by_type_and_null_only_into_options() {
        let row = Named(vec![
            ("n", Value::from(7i64)),
            ("s", Value::from("x")),
            ("f", Value::from(0.5)),
            ("b", Value::from(true)),
            ("none", Value::from(None::<i64>)),
        ]);
        assert_eq!(col::<i64>(&row, "n").unwrap(), 7);
        assert_eq!(col::<String>(&row, "s").unwrap(), "x");
        assert_eq!(col::<f64>(&row, "f").unwrap(), 0.5);
        assert!(col::<bool>(&row, "b").unwrap());
        assert_eq!(col::<Option<i64>>(&row, "none").unwrap(), None);
        assert_eq!(col::<Option<String>>(&row, "s").unwrap().as_deref(), Some("x"));
        match col::<i64>(&row, "none") {
            Err(StoreError::Corrupt(m)) => assert_eq!(m, "column `none`: unexpected NULL"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(col::<String>(&row, "n"), Err(StoreError::Corrupt(_))));
    }

    #[test]
    fn a_unique_violation_names_what_exists_and_other_errors_pass_through() {
        match db_error(DbError::UniqueViolation, || "tenant `a`".into()) {
            StoreError::Conflict(m) => assert_eq!(m, "tenant `a`"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(db(DbError::UniqueViolation), StoreError::Conflict(m) if m == "a row"));
        let down = DbError::from(StoreError::Unavailable("down".into()));
        assert!(matches!(db_error(down, || unreachable!()), StoreError::Unavailable(m) if m == "down"));
    }

    #[test]
    fn values_keep_their_sql_type_when_null() {
        assert_eq!(Value::from(None::<&str>), Value::Text(None));
        assert_eq!(Value::from(&None::<String>), Value::Text(None));
        assert_eq!(Value::from(None::<f64>), Value::Float(None));
        assert_eq!(Value::from(Some(3i64)), Value::Int(Some(3)));
        assert_eq!(Value::from(String::from("y")), Value::Text(Some(Cow::Borrowed("y"))));
    }
}
