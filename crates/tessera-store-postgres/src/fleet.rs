//! Unhealthy GPUs and operator node states ([`FleetStore`]) on PostgreSQL.

use async_trait::async_trait;
use tessera_store::{FleetStore, GpuHealthRecord, NodeStateRecord, Result};

use crate::{PgStore, col, db, narrow, narrow_opt};

#[async_trait]
impl FleetStore for PgStore {
    async fn set_gpu_unhealthy(&self, r: &GpuHealthRecord) -> Result<()> {
        sqlx::query(
            "INSERT INTO gpu_health (node, gpu, since, xid, detail) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (node, gpu) DO UPDATE SET since = $3, xid = $4, detail = $5",
        )
        .bind(&r.node)
        .bind(i64::from(r.gpu))
        .bind(r.since)
        .bind(r.xid.map(i64::from))
        .bind(&r.detail)
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
        let rows = sqlx::query("SELECT node, gpu, since, xid, detail FROM gpu_health ORDER BY node, gpu")
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
        .bind(&r.state)
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
                Ok(NodeStateRecord {
                    node: col(r, "node")?,
                    state: col(r, "state")?,
                    since: col(r, "since")?,
                    detail: col(r, "detail")?,
                })
            })
            .collect()
    }
}
