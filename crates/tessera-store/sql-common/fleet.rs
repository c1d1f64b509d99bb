//! Unhealthy GPUs, operator node states, drains and service moves ([`FleetStore`]).

use async_trait::async_trait;
use tessera_domain::WorkloadId;
use tessera_store::{
    DrainRecord, FleetStore, GpuHealthRecord, GpuMigRecord, HealthCause, MoveCause, NodeState, NodeStateRecord, Result,
    ServiceMoveRecord, StoreError,
};

use crate::driver::{Db, Store};
use crate::{col, db, i64_of, narrow, narrow_opt, u64_of};

#[async_trait]
impl FleetStore for Store {
    async fn set_gpu_unhealthy(&self, r: &GpuHealthRecord) -> Result<()> {
        sqlx::query(
            "INSERT INTO gpu_health (node, gpu, since, xid, detail, cause) VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (node, gpu) DO UPDATE SET since = $3, xid = $4, detail = $5, cause = $6",
        )
        .bind(&r.node)
        .bind(i64::from(r.gpu))
        .bind(r.since)
        .bind(r.xid.map(i64::from))
        .bind(&r.detail)
        .bind(r.cause.as_str())
        .execute(&mut *self.conn().await?)
        .await
        .map_err(db)?;
        Ok(())
    }

    async fn clear_gpu_health(&self, node: &str, gpu: u8) -> Result<bool> {
        let r = sqlx::query("DELETE FROM gpu_health WHERE node = $1 AND gpu = $2")
            .bind(node)
            .bind(i64::from(gpu))
            .execute(&mut *self.conn().await?)
            .await
            .map_err(db)?;
        Ok(r.rows_affected() > 0)
    }

    async fn unhealthy_gpus(&self) -> Result<Vec<GpuHealthRecord>> {
        let rows = sqlx::query("SELECT node, gpu, since, xid, detail, cause FROM gpu_health ORDER BY node, gpu")
            .fetch_all(&mut *self.conn().await?)
            .await
            .map_err(db)?;
        rows.iter()
            .map(|r| {
                Ok(GpuHealthRecord {
                    node: col(r, "node")?,
                    gpu: narrow(col(r, "gpu")?, "gpu")?,
                    since: col(r, "since")?,
                    xid: narrow_opt(col(r, "xid")?, "xid")?,
                    detail: col(r, "detail")?,
                    cause: {
                        let c: String = col(r, "cause")?;
                        HealthCause::parse(&c)
                            .ok_or_else(|| StoreError::Corrupt(format!("column `cause`: unknown `{c}`")))?
                    },
                })
            })
            .collect()
    }

    async fn set_node_state(&self, r: &NodeStateRecord) -> Result<()> {
        sqlx::query(
            "INSERT INTO node_states (node, state, since, detail) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (node) DO UPDATE SET state = $2, since = $3, detail = $4",
        )
        .bind(&r.node)
        .bind(r.state.as_str())
        .bind(r.since)
        .bind(&r.detail)
        .execute(&mut *self.conn().await?)
        .await
        .map_err(db)?;
        Ok(())
    }

    async fn clear_node_state(&self, node: &str) -> Result<bool> {
        let r = sqlx::query("DELETE FROM node_states WHERE node = $1")
            .bind(node)
            .execute(&mut *self.conn().await?)
            .await
            .map_err(db)?;
        Ok(r.rows_affected() > 0)
    }

    async fn node_states(&self) -> Result<Vec<NodeStateRecord>> {
        let rows = sqlx::query("SELECT node, state, since, detail FROM node_states ORDER BY node")
            .fetch_all(&mut *self.conn().await?)
            .await
            .map_err(db)?;
        rows.iter()
            .map(|r| {
                let state: String = col(r, "state")?;
                Ok(NodeStateRecord {
                    node: col(r, "node")?,
                    state: NodeState::parse(&state)
                        .ok_or_else(|| StoreError::Corrupt(format!("column `state`: unknown node state `{state}`")))?,
                    since: col(r, "since")?,
                    detail: col(r, "detail")?,
                })
            })
            .collect()
    }

    async fn set_drain(&self, r: &DrainRecord) -> Result<()> {
        sqlx::query(
            "INSERT INTO drains (node, deadline_ms, preempt) VALUES ($1, $2, $3) \
             ON CONFLICT (node) DO UPDATE SET deadline_ms = $2, preempt = $3",
        )
        .bind(&r.node)
        .bind(r.deadline_ms)
        .bind(r.preempt)
        .execute(&mut *self.conn().await?)
        .await
        .map_err(db)?;
        Ok(())
    }

    async fn clear_drain(&self, node: &str) -> Result<bool> {
        let r = sqlx::query("DELETE FROM drains WHERE node = $1")
            .bind(node)
            .execute(&mut *self.conn().await?)
            .await
            .map_err(db)?;
        Ok(r.rows_affected() > 0)
    }

    async fn drains(&self) -> Result<Vec<DrainRecord>> {
        let rows = sqlx::query("SELECT node, deadline_ms, preempt FROM drains ORDER BY node")
            .fetch_all(&mut *self.conn().await?)
            .await
            .map_err(db)?;
        rows.iter()
            .map(|r| {
                Ok(DrainRecord {
                    node: col(r, "node")?,
                    deadline_ms: col(r, "deadline_ms")?,
                    preempt: col(r, "preempt")?,
                })
            })
            .collect()
    }

    async fn set_service_move(&self, r: &ServiceMoveRecord) -> Result<()> {
        sqlx::query(
            "INSERT INTO service_moves (old_id, replacement_id, node, cause, by_id) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (old_id) DO UPDATE SET replacement_id = $2, node = $3, cause = $4, by_id = $5",
        )
        .bind(i64_of(r.old.0))
        .bind(i64_of(r.replacement.0))
        .bind(&r.node)
        .bind(r.cause.as_str())
        .bind(r.by.map(|b| i64_of(b.0)))
        .execute(&mut *self.conn().await?)
        .await
        .map_err(db)?;
        Ok(())
    }

    async fn clear_service_move(&self, old: WorkloadId) -> Result<bool> {
        let r = sqlx::query("DELETE FROM service_moves WHERE old_id = $1")
            .bind(i64_of(old.0))
            .execute(&mut *self.conn().await?)
            .await
            .map_err(db)?;
        Ok(r.rows_affected() > 0)
    }

    async fn service_moves(&self) -> Result<Vec<ServiceMoveRecord>> {
        let rows = sqlx::query("SELECT old_id, replacement_id, node, cause, by_id FROM service_moves ORDER BY old_id")
            .fetch_all(&mut *self.conn().await?)
            .await
            .map_err(db)?;
        rows.iter()
            .map(|r| {
                Ok(ServiceMoveRecord {
                    old: WorkloadId(u64_of(col(r, "old_id")?)),
                    replacement: WorkloadId(u64_of(col(r, "replacement_id")?)),
                    node: col(r, "node")?,
                    cause: {
                        let c: String = col(r, "cause")?;
                        MoveCause::parse(&c)
                            .ok_or_else(|| StoreError::Corrupt(format!("column `cause`: unknown `{c}`")))?
                    },
                    by: col::<Option<i64>>(r, "by_id")?.map(|b| WorkloadId(u64_of(b))),
                })
            })
            .collect()
    }

    async fn set_gpu_mig(&self, r: &GpuMigRecord) -> Result<()> {
        write_gpu_mig(&mut *self.conn().await?, r).await
    }

    async fn gpu_mig_modes(&self) -> Result<Vec<GpuMigRecord>> {
        let rows =
            sqlx::query("SELECT node, gpu, enabled, pending, since, detail FROM gpu_mig_modes ORDER BY node, gpu")
                .fetch_all(&mut *self.conn().await?)
                .await
                .map_err(db)?;
        rows.iter()
            .map(|r| {
                Ok(GpuMigRecord {
                    node: col(r, "node")?,
                    gpu: narrow(col(r, "gpu")?, "gpu")?,
                    enabled: col(r, "enabled")?,
                    pending: col(r, "pending")?,
                    since: col(r, "since")?,
                    detail: col(r, "detail")?,
                })
            })
            .collect()
    }
}

/// Upserts a GPU's MIG mode record (alone, or inside a lifecycle batch's transaction).
pub(crate) async fn write_gpu_mig<'c, E>(conn: E, r: &GpuMigRecord) -> Result<()>
where
    E: sqlx::Executor<'c, Database = Db>,
{
    sqlx::query(
        "INSERT INTO gpu_mig_modes (node, gpu, enabled, pending, since, detail) VALUES ($1, $2, $3, $4, $5, $6) \
         ON CONFLICT (node, gpu) DO UPDATE SET enabled = $3, pending = $4, since = $5, detail = $6",
    )
    .bind(&r.node)
    .bind(i64::from(r.gpu))
    .bind(r.enabled)
    .bind(r.pending)
    .bind(r.since)
    .bind(&r.detail)
    .execute(conn)
    .await
    .map_err(db)?;
    Ok(())
}
