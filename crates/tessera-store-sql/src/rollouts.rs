//! Rolling upgrades and the state of each of their nodes
//! ([`RolloutStore`](tessera_store::RolloutStore)).
//!
//! One generic function per method of `RolloutStore`, of the same name, for any [`Driver`];
//! [`implement_store!`](crate::implement_store) calls them.

use tessera_store::{Result, RolloutNodeRecord, RolloutNodeState, RolloutRecord, RolloutState, StoreError};

use crate::{Driver, Query, col, db, i64_of, narrow, narrow_opt, query, u64_of};

async fn write_nodes<D: Driver>(tx: &mut D::Connection, r: &RolloutRecord) -> Result<()> {
    query::<D>("DELETE FROM rollout_nodes WHERE rollout_id = $1")
        .bind(i64_of(r.id))
        .execute(&mut *tx)
        .await
        .map_err(db)?;
    for (i, n) in r.nodes.iter().enumerate() {
        query::<D>(
            "INSERT INTO rollout_nodes (rollout_id, position, node, state, since, started_at, ended_at, \
             upgrade_until, layout, detail) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(i64_of(r.id))
        .bind(i as i64)
        .bind(&n.node)
        .bind(n.state.as_str())
        .bind(n.since)
        .bind(n.started_at)
        .bind(n.ended_at)
        .bind(n.upgrade_until)
        .bind(&n.layout)
        .bind(&n.detail)
        .execute(&mut *tx)
        .await
        .map_err(db)?;
    }
    Ok(())
}

/// Binds a rollout's columns in the order of its statements: `$1` the id, then `pool` to
/// `detail`.
fn bind_rollout<'q, D: Driver>(q: Query<'q, D>, id: i64, r: &'q RolloutRecord) -> Query<'q, D> {
    q.bind(id)
        .bind(&r.pool)
        .bind(i64::from(r.max_parallel))
        .bind(i64_of(r.max_unavailable_milli))
        .bind(r.deadline_s.map(i64_of))
        .bind(r.preempt)
        .bind(r.upgrade_s.map(i64_of))
        .bind(r.state.as_str())
        .bind(r.created_at)
        .bind(&r.created_by)
        .bind(r.ended_at)
        .bind(&r.detail)
}

pub async fn create_rollout<D: Driver>(s: &D, r: &RolloutRecord) -> Result<u64> {
    let mut tx = s.begin_write().await?;
    let id: i64 = query::<D>("UPDATE sequences SET value = value + 1 WHERE name = 'rollout' RETURNING value")
        .fetch_one(&mut *tx)
        .await
        .map_err(db)
        .and_then(|r| col(&r, "value"))?;
    let insert = query::<D>(
        "INSERT INTO rollouts (id, pool, max_parallel, max_unavailable_milli, deadline_s, preempt, upgrade_s, \
         state, created_at, created_by, ended_at, detail) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
    );
    bind_rollout(insert, id, r).execute(&mut *tx).await.map_err(db)?;
    let stored = RolloutRecord {
        id: u64_of(id),
        ..r.clone()
    };
    write_nodes::<D>(&mut tx, &stored).await?;
    D::commit(tx).await?;
    Ok(u64_of(id))
}

pub async fn save_rollout<D: Driver>(s: &D, r: &RolloutRecord) -> Result<()> {
    let mut tx = s.begin_write().await?;
    let update = query::<D>(
        "UPDATE rollouts SET pool = $2, max_parallel = $3, max_unavailable_milli = $4, deadline_s = $5, \
         preempt = $6, upgrade_s = $7, state = $8, created_at = $9, created_by = $10, ended_at = $11, \
         detail = $12 WHERE id = $1",
    );
    let updated = bind_rollout(update, i64_of(r.id), r)
        .execute(&mut *tx)
        .await
        .map_err(db)?;
    if updated == 0 {
        return Err(StoreError::Corrupt(format!("no rollout {} to save", r.id)));
    }
    write_nodes::<D>(&mut tx, r).await?;
    D::commit(tx).await?;
    Ok(())
}

pub async fn rollouts<D: Driver>(s: &D) -> Result<Vec<RolloutRecord>> {
    let heads = query::<D>(
        "SELECT id, pool, max_parallel, max_unavailable_milli, deadline_s, preempt, upgrade_s, state, \
         created_at, created_by, ended_at, detail FROM rollouts ORDER BY id DESC",
    )
    .fetch_all(&mut *s.conn().await?)
    .await
    .map_err(db)?;
    let nodes = query::<D>(
        "SELECT rollout_id, node, state, since, started_at, ended_at, upgrade_until, layout, detail \
         FROM rollout_nodes ORDER BY rollout_id, position",
    )
    .fetch_all(&mut *s.conn().await?)
    .await
    .map_err(db)?;
    let mut out = Vec::with_capacity(heads.len());
    for h in &heads {
        let state: String = col(h, "state")?;
        out.push(RolloutRecord {
            id: u64_of(col(h, "id")?),
            pool: col(h, "pool")?,
            max_parallel: narrow(col(h, "max_parallel")?, "max_parallel")?,
            max_unavailable_milli: u64_of(col(h, "max_unavailable_milli")?),
            deadline_s: narrow_opt(col(h, "deadline_s")?, "deadline_s")?,
            preempt: col(h, "preempt")?,
            upgrade_s: narrow_opt(col(h, "upgrade_s")?, "upgrade_s")?,
            state: RolloutState::parse(&state)
                .ok_or_else(|| StoreError::Corrupt(format!("column `state`: unknown rollout state `{state}`")))?,
            created_at: col(h, "created_at")?,
            created_by: col(h, "created_by")?,
            ended_at: col(h, "ended_at")?,
            detail: col(h, "detail")?,
            nodes: Vec::new(),
        });
    }
    for n in &nodes {
        let id = u64_of(col(n, "rollout_id")?);
        let state: String = col(n, "state")?;
        let rec = RolloutNodeRecord {
            node: col(n, "node")?,
            state: RolloutNodeState::parse(&state)
                .ok_or_else(|| StoreError::Corrupt(format!("column `state`: unknown node state `{state}`")))?,
            since: col(n, "since")?,
            started_at: col(n, "started_at")?,
            ended_at: col(n, "ended_at")?,
            upgrade_until: col(n, "upgrade_until")?,
            layout: col(n, "layout")?,
            detail: col(n, "detail")?,
        };
        if let Some(r) = out.iter_mut().find(|r| r.id == id) {
            r.nodes.push(rec);
        }
    }
    Ok(out)
}
