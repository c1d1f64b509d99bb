//! [`TimedStore`]: the store the server holds, timing every operation into
//! `tessera_database_duration_seconds{op, outcome}` — the database latency as the control plane
//! sees it, whichever database it is — and telling the create path's [`TenancyCache`] when the
//! tenancy changed.

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use tessera_domain::{Event, Workload, WorkloadId};
use tessera_store::{
    AuditRecord, AuditStore, Change, DrainRecord, FleetStore, GovernanceStore, GpuHealthRecord, GpuMigRecord,
    ImagePolicyRecord, LeaseRecord, LeaseStore, LedgerStore, NodeStateRecord, ProjectRecord, QuotaRecord,
    ReplicaRecord, Result, Revocation, RolloutRecord, RolloutStore, ServiceMoveRecord, Store, TelemetryRecord,
    TelemetryStore, TenancyChange, TenancyStore, TenantRecord, TokenRecord, TokenStore, UsageInterval, WorkloadFilter,
    WorkloadStore,
};

use crate::metrics::Metrics;
use crate::tenancy_cache::TenancyCache;

/// A store whose every operation is timed.
pub struct TimedStore {
    inner: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    /// Forgotten after every tenancy write (which all go through this store).
    tenancy_cache: Arc<TenancyCache>,
}

impl TimedStore {
    pub fn new(inner: Arc<dyn Store>, metrics: Arc<Metrics>, tenancy_cache: Arc<TenancyCache>) -> TimedStore {
        TimedStore {
            inner,
            metrics,
            tenancy_cache,
        }
    }

    /// A tenancy write, timed; what the create path remembers is forgotten once it is done
    /// (whatever its outcome: a failed write may still have landed).
    async fn tenancy_write<T>(&self, op: &'static str, f: impl Future<Output = Result<T>>) -> Result<T> {
        let r = self.timed(op, f).await;
        self.tenancy_cache.forget();
        r
    }

    async fn timed<T>(&self, op: &'static str, f: impl Future<Output = Result<T>>) -> Result<T> {
        let t0 = Instant::now();
        let r = f.await;
        self.metrics.database(op, r.is_ok(), t0.elapsed());
        r
    }
}

#[async_trait]
impl TenancyStore for TimedStore {
    async fn create_tenant(&self, t: &TenantRecord) -> Result<()> {
        self.tenancy_write("create_tenant", self.inner.create_tenant(t)).await
    }
    async fn get_tenant(&self, name: &str) -> Result<Option<TenantRecord>> {
        self.timed("get_tenant", self.inner.get_tenant(name)).await
    }
    async fn list_tenants(&self, after: Option<&str>, limit: u32) -> Result<Vec<TenantRecord>> {
        self.timed("list_tenants", self.inner.list_tenants(after, limit)).await
    }
    async fn delete_tenant(&self, name: &str) -> Result<bool> {
        self.tenancy_write("delete_tenant", self.inner.delete_tenant(name))
            .await
    }
    async fn create_project(&self, p: &ProjectRecord) -> Result<()> {
        self.tenancy_write("create_project", self.inner.create_project(p)).await
    }
    async fn get_project(&self, tenant: &str, name: &str) -> Result<Option<ProjectRecord>> {
        self.timed("get_project", self.inner.get_project(tenant, name)).await
    }
    async fn list_projects(&self, tenant: &str, after: Option<&str>, limit: u32) -> Result<Vec<ProjectRecord>> {
        self.timed("list_projects", self.inner.list_projects(tenant, after, limit))
            .await
    }
    async fn delete_project(&self, tenant: &str, name: &str) -> Result<bool> {
        self.tenancy_write("delete_project", self.inner.delete_project(tenant, name))
            .await
    }
    async fn set_image_policy(&self, p: &ImagePolicyRecord, audit: &AuditRecord) -> Result<()> {
        self.timed("set_image_policy", self.inner.set_image_policy(p, audit))
            .await
    }
    async fn image_policy(&self, tenant: &str) -> Result<Option<ImagePolicyRecord>> {
        self.timed("image_policy", self.inner.image_policy(tenant)).await
    }
    async fn delete_image_policy(&self, tenant: &str, audit: &AuditRecord) -> Result<bool> {
        self.timed("delete_image_policy", self.inner.delete_image_policy(tenant, audit))
            .await
    }
    async fn set_tenant_priorities(
        &self,
        tenant: &str,
        classes: Option<&[String]>,
        audit: &AuditRecord,
    ) -> Result<bool> {
        self.tenancy_write(
            "set_tenant_priorities",
            self.inner.set_tenant_priorities(tenant, classes, audit),
        )
        .await
    }
    async fn apply_tenancy(&self, changes: &[TenancyChange], audit: &[AuditRecord]) -> Result<()> {
        self.tenancy_write("apply_tenancy", self.inner.apply_tenancy(changes, audit))
            .await
    }
}

#[async_trait]
impl TokenStore for TimedStore {
    async fn create_token(&self, t: &TokenRecord) -> Result<()> {
        self.timed("create_token", self.inner.create_token(t)).await
    }
    async fn find_token(&self, hash: &str) -> Result<Option<TokenRecord>> {
        self.timed("find_token", self.inner.find_token(hash)).await
    }
    async fn get_token(&self, id: &str) -> Result<Option<TokenRecord>> {
        self.timed("get_token", self.inner.get_token(id)).await
    }
    async fn list_tokens(&self, tenant: Option<&str>) -> Result<Vec<TokenRecord>> {
        self.timed("list_tokens", self.inner.list_tokens(tenant)).await
    }
    async fn revoke_token(&self, id: &str, at: i64) -> Result<Revocation> {
        self.timed("revoke_token", self.inner.revoke_token(id, at)).await
    }
    async fn token_count(&self) -> Result<u64> {
        self.timed("token_count", self.inner.token_count()).await
    }
    async fn revocations(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<String>> {
        self.inner.revocations().await
    }
}

#[async_trait]
impl WorkloadStore for TimedStore {
    async fn reserve_workload_ids(&self, n: u32) -> Result<Range<u64>> {
        self.timed("reserve_workload_ids", self.inner.reserve_workload_ids(n))
            .await
    }
    async fn commit(&self, batch: &[Change]) -> Result<()> {
        self.timed("commit", self.inner.commit(batch)).await
    }
    async fn get_workload(&self, id: WorkloadId, scope: Option<&str>) -> Result<Option<Workload>> {
        self.timed("get_workload", self.inner.get_workload(id, scope)).await
    }
    async fn list_workloads(&self, f: &WorkloadFilter) -> Result<Vec<Workload>> {
        self.timed("list_workloads", self.inner.list_workloads(f)).await
    }
    async fn count_workloads(&self, f: &WorkloadFilter) -> Result<u64> {
        self.timed("count_workloads", self.inner.count_workloads(f)).await
    }
    async fn events(&self, id: WorkloadId, scope: Option<&str>) -> Result<Vec<Event>> {
        self.timed("events", self.inner.events(id, scope)).await
    }
    async fn active_workloads(&self) -> Result<Vec<Workload>> {
        self.timed("active_workloads", self.inner.active_workloads()).await
    }
    async fn idempotent(&self, actor: &str, key: &str) -> Result<Option<(String, WorkloadId)>> {
        self.timed("idempotent", self.inner.idempotent(actor, key)).await
    }
}

#[async_trait]
impl LedgerStore for TimedStore {
    async fn usage_of(&self, id: WorkloadId) -> Result<Vec<UsageInterval>> {
        self.timed("usage_of", self.inner.usage_of(id)).await
    }
    async fn usage_between(&self, tenant: Option<&str>, from: i64, to: i64) -> Result<Vec<UsageInterval>> {
        self.timed("usage_between", self.inner.usage_between(tenant, from, to))
            .await
    }
    async fn closed_usage(&self, from: i64, to: i64) -> Result<Vec<(String, i64)>> {
        self.timed("closed_usage", self.inner.closed_usage(from, to)).await
    }
}

#[async_trait]
impl GovernanceStore for TimedStore {
    async fn set_quota(&self, q: &QuotaRecord, at: i64) -> Result<()> {
        self.timed("set_quota", self.inner.set_quota(q, at)).await
    }
    async fn delete_quota(&self, tenant: &str, class: &str) -> Result<bool> {
        self.timed("delete_quota", self.inner.delete_quota(tenant, class)).await
    }
    async fn quotas(&self) -> Result<Vec<QuotaRecord>> {
        self.timed("quotas", self.inner.quotas()).await
    }
    async fn set_budget(&self, tenant: &str, unit_hours: Option<f64>, at: i64) -> Result<()> {
        self.timed("set_budget", self.inner.set_budget(tenant, unit_hours, at))
            .await
    }
    async fn budgets(&self) -> Result<Vec<(String, f64)>> {
        self.timed("budgets", self.inner.budgets()).await
    }
}

#[async_trait]
impl AuditStore for TimedStore {
    async fn append_audit(&self, records: &[AuditRecord]) -> Result<Vec<u64>> {
        self.timed("append_audit", self.inner.append_audit(records)).await
    }
    async fn audit(&self, tenant: Option<&str>, before: Option<u64>, limit: u32) -> Result<Vec<AuditRecord>> {
        self.timed("audit", self.inner.audit(tenant, before, limit)).await
    }
}

#[async_trait]
impl LeaseStore for TimedStore {
    fn shared(&self) -> bool {
        self.inner.shared()
    }
    async fn acquire_lease(&self, holder: &str, url: &str, ttl_ms: u64) -> Result<Option<u64>> {
        self.timed("acquire_lease", self.inner.acquire_lease(holder, url, ttl_ms))
            .await
    }
    async fn renew_lease(&self, holder: &str, epoch: u64, ttl_ms: u64) -> Result<bool> {
        self.timed("renew_lease", self.inner.renew_lease(holder, epoch, ttl_ms))
            .await
    }
    async fn release_lease(&self, holder: &str, epoch: u64) -> Result<()> {
        self.timed("release_lease", self.inner.release_lease(holder, epoch))
            .await
    }
    async fn lease(&self) -> Result<Option<LeaseRecord>> {
        self.timed("lease", self.inner.lease()).await
    }
    async fn heartbeat(&self, r: &ReplicaRecord) -> Result<()> {
        self.timed("heartbeat", self.inner.heartbeat(r)).await
    }
    async fn replicas(&self) -> Result<Vec<ReplicaRecord>> {
        self.timed("replicas", self.inner.replicas()).await
    }
    async fn prune_replicas(&self, idle_ms: u64) -> Result<u64> {
        self.timed("prune_replicas", self.inner.prune_replicas(idle_ms)).await
    }
}

#[async_trait]
impl FleetStore for TimedStore {
    async fn set_gpu_unhealthy(&self, r: &GpuHealthRecord) -> Result<()> {
        self.timed("set_gpu_unhealthy", self.inner.set_gpu_unhealthy(r)).await
    }
    async fn clear_gpu_health(&self, node: &str, gpu: u8) -> Result<bool> {
        self.timed("clear_gpu_health", self.inner.clear_gpu_health(node, gpu))
            .await
    }
    async fn unhealthy_gpus(&self) -> Result<Vec<GpuHealthRecord>> {
        self.timed("unhealthy_gpus", self.inner.unhealthy_gpus()).await
    }
    async fn set_node_state(&self, r: &NodeStateRecord) -> Result<()> {
        self.timed("set_node_state", self.inner.set_node_state(r)).await
    }
    async fn clear_node_state(&self, node: &str) -> Result<bool> {
        self.timed("clear_node_state", self.inner.clear_node_state(node)).await
    }
    async fn node_states(&self) -> Result<Vec<NodeStateRecord>> {
        self.timed("node_states", self.inner.node_states()).await
    }
    async fn set_drain(&self, r: &DrainRecord) -> Result<()> {
        self.timed("set_drain", self.inner.set_drain(r)).await
    }
    async fn clear_drain(&self, node: &str) -> Result<bool> {
        self.timed("clear_drain", self.inner.clear_drain(node)).await
    }
    async fn drains(&self) -> Result<Vec<DrainRecord>> {
        self.timed("drains", self.inner.drains()).await
    }
    async fn set_service_move(&self, r: &ServiceMoveRecord) -> Result<()> {
        self.timed("set_service_move", self.inner.set_service_move(r)).await
    }
    async fn clear_service_move(&self, old: WorkloadId) -> Result<bool> {
        self.timed("clear_service_move", self.inner.clear_service_move(old))
            .await
    }
    async fn service_moves(&self) -> Result<Vec<ServiceMoveRecord>> {
        self.timed("service_moves", self.inner.service_moves()).await
    }
    async fn set_gpu_mig(&self, r: &GpuMigRecord) -> Result<()> {
        self.timed("set_gpu_mig", self.inner.set_gpu_mig(r)).await
    }
    async fn gpu_mig_modes(&self) -> Result<Vec<GpuMigRecord>> {
        self.timed("gpu_mig_modes", self.inner.gpu_mig_modes()).await
    }
}

#[async_trait]
impl RolloutStore for TimedStore {
    async fn create_rollout(&self, r: &RolloutRecord) -> Result<u64> {
        self.timed("create_rollout", self.inner.create_rollout(r)).await
    }
    async fn save_rollout(&self, r: &RolloutRecord) -> Result<()> {
        self.timed("save_rollout", self.inner.save_rollout(r)).await
    }
    async fn rollouts(&self) -> Result<Vec<RolloutRecord>> {
        self.timed("rollouts", self.inner.rollouts()).await
    }
}

#[async_trait]
impl TelemetryStore for TimedStore {
    async fn append_telemetry(&self, records: &[TelemetryRecord]) -> Result<u64> {
        self.timed("append_telemetry", self.inner.append_telemetry(records))
            .await
    }
    async fn telemetry_between(&self, from: i64, to: i64) -> Result<Vec<TelemetryRecord>> {
        self.timed("telemetry_between", self.inner.telemetry_between(from, to))
            .await
    }
    async fn fold_telemetry(&self, from: i64, before: i64) -> Result<u64> {
        self.timed("fold_telemetry", self.inner.fold_telemetry(from, before))
            .await
    }
    async fn prune_telemetry(&self, before: i64) -> Result<u64> {
        self.timed("prune_telemetry", self.inner.prune_telemetry(before)).await
    }
}
