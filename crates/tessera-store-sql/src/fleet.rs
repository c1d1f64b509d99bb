//! Unhealthy GPUs, operator node states, drains and service moves
//! ([`FleetStore`](tessera_store::FleetStore)).
//!
//! One generic function per method of `FleetStore`, of the same name, for any [`Driver`];
//! [`implement_store!`](crate::implement_store) calls them.

use tessera_domain::WorkloadId;
use tessera_store::{
    DrainRecord, GpuHealthRecord, GpuMigRecord, HealthCause, MoveCause, NodeState, NodeStateRecord, Result,
    ServiceMoveRecord, StoreError,
};

use crate::{Driver, col, db, i64_of, narrow, narrow_opt, query, u64_of};

pub async fn set_gpu_unhealthy<D: Driver>(s: &D, r: &GpuHealthRecord) -> Result<()> {
    query::<D>(
        "INSERT INTO gpu_health (node, gpu, since, xid, detail, cause) VALUES ($1, $2, $3, $4, $5, $6) \
         ON CONFLICT (node, gpu) DO UPDATE SET since = $3, xid = $4, detail = $5, cause = $6",
    )
    .bind(&r.node)
    .bind(i64::from(r.gpu))
    .bind(r.since)
    .bind(r.xid.map(i64::from))
    .bind(&r.detail)
    .bind(r.cause.as_str())
    .execute(&mut *s.conn().await?)
    .await
    .map_err(db)?;
    Ok(())
}

pub async fn clear_gpu_health<D: Driver>(s: &D, node: &str, gpu: u8) -> Result<bool> {
    let r = query::<D>("DELETE FROM gpu_health WHERE node = $1 AND gpu = $2")
        .bind(node)
        .bind(i64::from(gpu))
        .execute(&mut *s.conn().await?)
        .await
        .map_err(db)?;
    Ok(r > 0)
}

pub async fn unhealthy_gpus<D: Driver>(s: &D) -> Result<Vec<GpuHealthRecord>> {
    let rows = query::<D>("SELECT node, gpu, since, xid, detail, cause FROM gpu_health ORDER BY node, gpu")
        .fetch_all(&mut *s.conn().await?)
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

pub async fn set_node_state<D: Driver>(s: &D, r: &NodeStateRecord) -> Result<()> {
    query::<D>(
        "INSERT INTO node_states (node, state, since, detail) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (node) DO UPDATE SET state = $2, since = $3, detail = $4",
    )
    .bind(&r.node)
    .bind(r.state.as_str())
    .bind(r.since)
    .bind(&r.detail)
    .execute(&mut *s.conn().await?)
    .await
    .map_err(db)?;
    Ok(())
}

pub async fn clear_node_state<D: Driver>(s: &D, node: &str) -> Result<bool> {
    let r = query::<D>("DELETE FROM node_states WHERE node = $1")
        .bind(node)
        .execute(&mut *s.conn().await?)
        .await
        .map_err(db)?;
    Ok(r > 0)
}

pub async fn node_states<D: Driver>(s: &D) -> Result<Vec<NodeStateRecord>> {
    let rows = query::<D>("SELECT node, state, since, detail FROM node_states ORDER BY node")
        .fetch_all(&mut *s.conn().await?)
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

pub async fn set_drain<D: Driver>(s: &D, r: &DrainRecord) -> Result<()> {
    query::<D>(
        "INSERT INTO drains (node, deadline_ms, preempt) VALUES ($1, $2, $3) \
         ON CONFLICT (node) DO UPDATE SET deadline_ms = $2, preempt = $3",
    )
    .bind(&r.node)
    .bind(r.deadline_ms)
    .bind(r.preempt)
    .execute(&mut *s.conn().await?)
    .await
    .map_err(db)?;
    Ok(())
}

pub async fn clear_drain<D: Driver>(s: &D, node: &str) -> Result<bool> {
    let r = query::<D>("DELETE FROM drains WHERE node = $1")
        .bind(node)
        .execute(&mut *s.conn().await?)
        .await
        .map_err(db)?;
    Ok(r > 0)
}

pub async fn drains<D: Driver>(s: &D) -> Result<Vec<DrainRecord>> {
    let rows = query::<D>("SELECT node, deadline_ms, preempt FROM drains ORDER BY node")
        .fetch_all(&mut *s.conn().await?)
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

pub async fn set_service_move<D: Driver>(s: &D, r: &ServiceMoveRecord) -> Result<()> {
    query::<D>(
        "INSERT INTO service_moves (old_id, replacement_id, node, cause, by_id) VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (old_id) DO UPDATE SET replacement_id = $2, node = $3, cause = $4, by_id = $5",
    )
    .bind(i64_of(r.old.0))
    .bind(i64_of(r.replacement.0))
    .bind(&r.node)
    .bind(r.cause.as_str())
    .bind(r.by.map(|b| i64_of(b.0)))
    .execute(&mut *s.conn().await?)
    .await
    .map_err(db)?;
    Ok(())
}

pub async fn clear_service_move<D: Driver>(s: &D, old: WorkloadId) -> Result<bool> {
    let r = query::<D>("DELETE FROM service_moves WHERE old_id = $1")
        .bind(i64_of(old.0))
        .execute(&mut *s.conn().await?)
        .await
        .map_err(db)?;
    Ok(r > 0)
}

pub async fn service_moves<D: Driver>(s: &D) -> Result<Vec<ServiceMoveRecord>> {
    let rows = query::<D>("SELECT old_id, replacement_id, node, cause, by_id FROM service_moves ORDER BY old_id")
        .fetch_all(&mut *s.conn().await?)
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
                    MoveCause::parse(&c).ok_or_else(|| StoreError::Corrupt(format!("column `cause`: unknown `{c}`")))?
                },
                by: col::<Option<i64>>(r, "by_id")?.map(|b| WorkloadId(u64_of(b))),
            })
        })
        .collect()
}

pub async fn set_gpu_mig<D: Driver>(s: &D, r: &GpuMigRecord) -> Result<()> {
    write_gpu_mig::<D>(&mut *s.conn().await?, r).await
}

pub async fn gpu_mig_modes<D: Driver>(s: &D) -> Result<Vec<GpuMigRecord>> {
    let rows = query::<D>("SELECT node, gpu, enabled, pending, since, detail FROM gpu_mig_modes ORDER BY node, gpu")
        .fetch_all(&mut *s.conn().await?)
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

/// Upserts a GPU's MIG mode record (alone, or inside a lifecycle batch's transaction).
pub async fn write_gpu_mig<D: Driver>(conn: &mut D::Connection, r: &GpuMigRecord) -> Result<()> {
    query::<D>(
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
