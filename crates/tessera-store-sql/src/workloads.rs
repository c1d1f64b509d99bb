//! Workloads in typed columns, their timelines and idempotency keys
//! ([`WorkloadStore`](tessera_store::WorkloadStore)), and the multi-row statements with which a
//! lifecycle batch writes them (see [`crate::batch`]).
//!
//! One generic function per method of `WorkloadStore`, of the same name, for any [`Driver`]
//! (`commit` is [`crate::batch::commit`], `active_workloads` the driver's
//! [`read_active`](crate::Driver::read_active)); [`implement_store!`](crate::implement_store) calls
//! them.

use std::ops::Range;
use std::sync::LazyLock;

use tessera_domain::{Event, GpuSpec, Movable, ReasonCode, Slice, Step, StopCause, Workload, WorkloadId};
use tessera_store::{IdempotencyKey, Result, StoreError, WorkloadFilter, WorkloadOrder};

use crate::columns::{corrupt, gpu_mask, json, names, narrow, shares_json, topology_mode_str, workload_row};
use crate::rows::{self, MultiRow, Values};
use crate::{Driver, Query, Row, col, db, db_error, i64_of, query, read_optional, u64_of};

/// Every column of `workloads`, in the order an insert binds them ([`bind_spec`], then
/// [`bind_lifecycle`]).
macro_rules! columns {
    () => {
        crate::workload_columns!()
    };
}

/// Inserts workloads: every column.
pub static INSERT: LazyLock<MultiRow> = LazyLock::new(|| {
    MultiRow::new(
        concat!("INSERT INTO workloads (", columns!(), ") VALUES "),
        names(columns!()).count(),
        "",
    )
});

/// Updates workloads: the id, then the lifecycle columns, of each row in `v`.
// SQLite names the columns of a bare `VALUES` list `column1, column2 …` and has no `AS v(…)`
// column list, so the rows go through a common table expression, which both SQLite (>= 3.33
// for `UPDATE … FROM`) and PostgreSQL accept. On PostgreSQL the columns of `v` take the types
// of the arrays the driver binds the rows as (`UNNEST($1::BIGINT[], …)`, from each `Value`'s
// type), so `workloads.id = v.id` compares integers without casts.
pub static UPDATE: LazyLock<MultiRow> = LazyLock::new(|| {
    let set: Vec<String> = names(crate::workload_lifecycle_columns!())
        .map(|c| format!("{c} = v.{c}"))
        .collect();
    MultiRow::new(
        concat!("WITH v (id, ", crate::workload_lifecycle_columns!(), ") AS (VALUES "),
        1 + names(crate::workload_lifecycle_columns!()).count(),
        &format!(
            ") UPDATE workloads SET {} FROM v WHERE workloads.id = v.id",
            set.join(", ")
        ),
    )
});

pub static INSERT_EVENTS: LazyLock<MultiRow> = LazyLock::new(|| {
    MultiRow::new(
        "INSERT INTO workload_events (workload_id, seq, step, at, detail, code) VALUES ",
        6,
        "",
    )
});

pub static INSERT_KEYS: LazyLock<MultiRow> = LazyLock::new(|| {
    MultiRow::new(
        "INSERT INTO idempotency_keys (actor, key, request_hash, workload_id, created_at) VALUES ",
        5,
        "",
    )
});

/// `SELECT` of every workload column, then `$rest`.
macro_rules! select {
    ($rest:literal) => {
        concat!("SELECT ", columns!(), " FROM workloads ", $rest)
    };
}

// The three shapes of a listing take the same first parameters: $1 tenant, $2 project, $3
// before, $4 the number of phases asked for (0 = any), $5..$14 the phases (unused ones NULL,
// which matches nothing), $15 the limit. Pages after the first start after the previous page's
// last workload (keyset paging, [`WorkloadFilter::after`]), never by an offset: newest first
// through $3 (the lower of `before` and that workload's id); oldest first after the id in $16;
// by name or phase after the key in $16 and the id in $17 (a larger key, or the same key and a
// smaller id), written `key >= $16 AND (key > $16 OR id < $17)` so the index walk starts at
// the key. A first page binds the lowest key there is (`''`) and no id bound. The shapes with a
// known tenant (and project) let the planner walk the `(tenant, id)` and `(tenant, project,
// id)` indexes newest first instead of every row; by name, the `(tenant, name, id DESC)` and
// `(name, id DESC)` indexes (migration 0017; `name` is `COLLATE "C"` on PostgreSQL, byte order
// as SQLite compares); by phase, `(tenant, phase, id DESC)` and `(phase, id DESC)`. Each shape
// comes in every order of `WorkloadOrder`, in its declaration order ([`order_slot`]). In the
// orders by name and phase the bounds on ids are written `+id`, which changes no value but
// keeps SQLite's planner (which has no statistics) from choosing the `(tenant, id)` index for
// that range and then sorting every row of the tenant.
macro_rules! list_tail {
    ($seek:literal, $order:literal) => {
        concat!(
            "AND ($4 = 0 OR phase IN ($5, $6, $7, $8, $9, $10, $11, $12, $13, $14)) ",
            $seek,
            " ORDER BY ",
            $order,
            " LIMIT $15"
        )
    };
}

/// One shape of a listing (its `WHERE` clause) in every order, then the orders by name and phase
/// read backward (a page before a workload, in the reverse order: the caller reverses it). The
/// orders by id read backward are each other's statement.
macro_rules! listings {
    ($where:literal) => {
        [
            concat!(select!($where), list_tail!("AND id < $3", "id DESC")),
            concat!(select!($where), list_tail!("AND id < $3 AND id > $16", "id ASC")),
            concat!(
                select!($where),
                list_tail!(
                    "AND +id < $3 AND name >= $16 AND (name > $16 OR +id < $17)",
                    "name, id DESC"
                )
            ),
            concat!(
                select!($where),
                list_tail!(
                    "AND +id < $3 AND phase >= $16 AND (phase > $16 OR +id < $17)",
                    "phase, id DESC"
                )
            ),
            concat!(
                select!($where),
                list_tail!(
                    "AND +id < $3 AND name <= $16 AND (name < $16 OR +id > $17)",
                    "name DESC, id ASC"
                )
            ),
            concat!(
                select!($where),
                list_tail!(
                    "AND +id < $3 AND phase <= $16 AND (phase < $16 OR +id > $17)",
                    "phase DESC, id ASC"
                )
            ),
        ]
    };
}

/// The counts of a listing's shape (its `WHERE` clause), one per statement of [`listings!`]:
/// the same conditions with the seek's parameters as `$15` and `$16` (no limit).
macro_rules! counts {
    ($where:literal) => {
        [
            concat!(
                "SELECT COUNT(*) AS n FROM workloads ",
                $where,
                count_tail!("AND id < $3")
            ),
            concat!(
                "SELECT COUNT(*) AS n FROM workloads ",
                $where,
                count_tail!("AND id < $3 AND id > $15")
            ),
            concat!(
                "SELECT COUNT(*) AS n FROM workloads ",
                $where,
                count_tail!("AND +id < $3 AND name >= $15 AND (name > $15 OR +id < $16)")
            ),
            concat!(
                "SELECT COUNT(*) AS n FROM workloads ",
                $where,
                count_tail!("AND +id < $3 AND phase >= $15 AND (phase > $15 OR +id < $16)")
            ),
            concat!(
                "SELECT COUNT(*) AS n FROM workloads ",
                $where,
                count_tail!("AND +id < $3 AND name <= $15 AND (name < $15 OR +id > $16)")
            ),
            concat!(
                "SELECT COUNT(*) AS n FROM workloads ",
                $where,
                count_tail!("AND +id < $3 AND phase <= $15 AND (phase < $15 OR +id > $16)")
            ),
        ]
    };
}

macro_rules! count_tail {
    ($seek:literal) => {
        concat!(
            "AND ($4 = 0 OR phase IN ($5, $6, $7, $8, $9, $10, $11, $12, $13, $14)) ",
            $seek
        )
    };
}

const COUNT_ANY_TENANT: [&str; 6] = counts!("WHERE ($1 IS NULL OR tenant = $1) AND ($2 IS NULL OR project = $2) ");
const COUNT_TENANT: [&str; 6] = counts!("WHERE tenant = $1 AND ($2 IS NULL OR project = $2) ");
const COUNT_PROJECT: [&str; 6] = counts!("WHERE tenant = $1 AND project = $2 ");

const LIST_ANY_TENANT: [&str; 6] = listings!("WHERE ($1 IS NULL OR tenant = $1) AND ($2 IS NULL OR project = $2) ");
const LIST_TENANT: [&str; 6] = listings!("WHERE tenant = $1 AND ($2 IS NULL OR project = $2) ");
const LIST_PROJECT: [&str; 6] = listings!("WHERE tenant = $1 AND project = $2 ");

/// Where the statement of an order, read forward or backward, stands in a shape's
/// [`listings!`], and the order it reads in.
fn order_slot(o: WorkloadOrder, backward: bool) -> (usize, WorkloadOrder) {
    use WorkloadOrder::*;
    match (o, backward) {
        (Newest, false) | (Oldest, true) => (0, Newest),
        (Oldest, false) | (Newest, true) => (1, Oldest),
        (Name, false) => (2, Name),
        (Phase, false) => (3, Phase),
        (Name, true) => (4, Name),
        (Phase, true) => (5, Phase),
    }
}
/// As many phases as a listing can ask for.
const PHASE_SLOTS: usize = 10;

/// The phases that are not terminal, as `active_workloads` selects them (an `IN` list the
/// `(phase, id)` index serves, where `NOT IN` would scan every row).
pub const ACTIVE: &str =
    select!("WHERE phase IN ('pending', 'queued', 'placed', 'partitioned', 'running', 'stopping') ORDER BY id");

/// Binds the insert-only columns (`id` to `created_at`).
fn bind_spec<'q>(q: Values<'q>, w: &'q Workload) -> Values<'q> {
    let s = &w.spec;
    let (gpus, mig_profile, fraction_milli, fraction_memory_mib, gang) = match &s.shape.gpu {
        GpuSpec::Whole { gpus } => (Some(i64::from(*gpus)), None, None, None, None),
        GpuSpec::Mig { profile } => (None, Some(profile.as_str()), None, None, None),
        GpuSpec::Fraction { milli, memory_mib } => {
            (None, None, Some(i64::from(*milli)), memory_mib.map(i64::from), None)
        }
        GpuSpec::Gang(g) => (None, None, None, None, Some(g)),
    };
    let topology = gang.and_then(|g| g.topology.as_ref());
    q.bind(i64_of(w.id.0))
        .bind(&s.tenant)
        .bind(&s.project)
        .bind(&s.name)
        .bind(s.kind.as_str())
        .bind(gpus)
        .bind(mig_profile)
        .bind(fraction_milli)
        .bind(fraction_memory_mib)
        .bind(gang.map(|g| i64::from(g.gpus)))
        .bind(gang.and_then(|g| g.gpus_per_node).map(i64::from))
        .bind(topology.map(|t| t.level.as_str()))
        .bind(topology.map(|t| topology_mode_str(t.mode)))
        .bind(gang.and_then(|g| g.segment).map(i64::from))
        .bind(gang.is_some_and(|g| g.remainder))
        .bind(json(&s.shape.models))
        .bind(&s.shape.pool)
        .bind(i64_of(s.cpu_milli))
        .bind(i64_of(s.memory_mib))
        .bind(s.duration_s.map(i64_of))
        .bind(s.command.as_ref().map(json))
        .bind(&s.image)
        .bind(json(&s.env))
        .bind(&s.priority)
        .bind(s.no_wait)
        .bind(s.no_requeue)
        .bind(s.movable.map(Movable::as_str))
        .bind(&s.native)
        .bind(i64_of(w.units.as_milli()))
        .bind(w.created_at)
}

/// Binds the columns an update writes (`phase` to `p_shares`).
fn bind_lifecycle<'q>(q: Values<'q>, w: &'q Workload, updated_at: i64) -> Result<Values<'q>> {
    let (stop_kind, stop_by, stop_detail) = match &w.stop {
        None => (None, None, None),
        Some(StopCause::Cancelled { by }) => (Some("cancel"), Some(by.clone()), None),
        Some(StopCause::Preempted { by, code, detail }) => {
            (Some(code.as_str()), Some(by.to_string()), Some(detail.as_str()))
        }
    };
    let p = w.placement.as_ref();
    let gpus = p.map(|p| gpu_mask(w.id, &p.gpus)).transpose()?;
    let shares = shares_json(w)?;
    let (mig_profile, mig_profile_id, mig_start, mig_size) = match p.map(|p| &p.slice) {
        Some(Slice::Mig {
            profile,
            profile_id,
            start,
            size,
        }) => (
            Some(profile.as_str()),
            Some(i64::from(*profile_id)),
            Some(i64::from(*start)),
            Some(i64::from(*size)),
        ),
        _ => (None, None, None, None),
    };
    let (fraction_milli, gpu_memory_mib) = match p.map(|p| &p.slice) {
        Some(Slice::Fraction { milli, gpu_memory_mib }) => (Some(i64::from(*milli)), gpu_memory_mib.map(i64::from)),
        _ => (None, None),
    };
    Ok(q.bind(w.phase.as_str())
        .bind(w.reason.as_ref().map(|r| r.code.as_str()))
        .bind(w.reason.as_ref().map(|r| r.detail.as_str()))
        .bind(w.borrowing)
        .bind(w.running_at)
        .bind(w.ended_at)
        .bind(updated_at)
        .bind(stop_kind)
        .bind(stop_by)
        .bind(stop_detail)
        .bind(i64::from(w.next_seq))
        .bind(i64::from(w.usage.seq))
        .bind(w.usage.open)
        .bind(p.map(|p| p.pool.as_str()))
        .bind(p.map(|p| p.node.as_str()))
        .bind(p.map(|p| p.model.as_str()))
        .bind(gpus)
        .bind(p.map(|p| p.slice.kind()))
        .bind(mig_profile)
        .bind(mig_profile_id)
        .bind(mig_start)
        .bind(mig_size)
        .bind(fraction_milli)
        .bind(gpu_memory_mib)
        .bind(p.map(|p| i64_of(p.units.as_milli())))
        .bind(shares))
}

fn event_row(id: WorkloadId, r: &impl Row) -> Result<Event> {
    let step: String = col(r, "step")?;
    let code: Option<String> = col(r, "code")?;
    Ok(Event {
        seq: narrow(col(r, "seq")?, "seq")?,
        step: Step::parse(&step).ok_or_else(|| corrupt(id, format_args!("unknown step `{step}`")))?,
        at: col(r, "at")?,
        detail: col(r, "detail")?,
        code: code
            .map(|c| ReasonCode::parse(&c).ok_or_else(|| corrupt(id, format_args!("unknown event code `{c}`"))))
            .transpose()?,
    })
}

/// The values of a row of [`INSERT`]: a new workload and its `updated_at`.
pub fn insert_row<'q>(q: Values<'q>, (w, updated_at): &'q (&Workload, i64)) -> Result<Values<'q>> {
    bind_lifecycle(bind_spec(q, w), w, *updated_at)
}

/// The values of a row of [`UPDATE`]: a stored workload and its `updated_at`.
pub fn update_row<'q>(q: Values<'q>, (w, updated_at): &'q (&Workload, i64)) -> Result<Values<'q>> {
    bind_lifecycle(q.bind(i64_of(w.id.0)), w, *updated_at)
}

/// The values of a row of [`INSERT_EVENTS`].
pub fn event_values<'q>(q: Values<'q>, (id, e): &'q (WorkloadId, &Event)) -> Result<Values<'q>> {
    Ok(q.bind(i64_of(id.0))
        .bind(i64::from(e.seq))
        .bind(e.step.as_str())
        .bind(e.at)
        .bind(e.detail.as_str())
        .bind(e.code.map(ReasonCode::as_str)))
}

/// The values of a row of [`INSERT_KEYS`]: a key, its workload and the workload's creation.
pub fn key_row<'q>(q: Values<'q>, (k, id, at): &'q (&IdempotencyKey, WorkloadId, i64)) -> Result<Values<'q>> {
    Ok(q.bind(k.actor.as_str())
        .bind(k.key.as_str())
        .bind(k.request_hash.as_str())
        .bind(i64_of(id.0))
        .bind(*at))
}

/// Inserts new workloads with the `updated_at` each gets (inside the caller's transaction).
pub async fn insert_workloads<D: Driver>(conn: &mut D::Connection, rows: &[(&Workload, i64)]) -> Result<()> {
    rows::execute::<D, _>(conn, &INSERT, rows, insert_row, |e, rows| {
        db_error(e, || match rows {
            [(w, _)] => format!("workload {}", w.id),
            _ => format!("one of the workloads {} … {}", rows[0].0.id, rows[rows.len() - 1].0.id),
        })
    })
    .await?;
    Ok(())
}

/// Writes the lifecycle of stored workloads, at most one row per workload; `Corrupt` if one is
/// not stored.
pub async fn update_workloads<D: Driver>(conn: &mut D::Connection, rows: &[(&Workload, i64)]) -> Result<()> {
    let updated = rows::execute::<D, _>(conn, &UPDATE, rows, update_row, |e, _| db(e)).await?;
    // Each row matches at most one stored workload (ids are the primary key and distinct in
    // `rows`), so fewer changes than rows means some are not stored.
    if updated != rows.len() as u64 {
        let missing = rows.len() as u64 - updated;
        let (first, last) = (rows[0].0.id, rows[rows.len() - 1].0.id);
        return Err(match rows {
            [(w, _)] => corrupt(w.id, "cannot be updated: it is not stored"),
            _ => StoreError::Corrupt(format!(
                "{missing} of the {} workloads updated ({first} … {last}) are not stored",
                rows.len()
            )),
        });
    }
    Ok(())
}

/// Appends timeline events of workloads.
pub async fn insert_events<D: Driver>(conn: &mut D::Connection, rows: &[(WorkloadId, &Event)]) -> Result<()> {
    rows::execute::<D, _>(conn, &INSERT_EVENTS, rows, event_values, |err, rows| {
        db_error(err, || match rows {
            [(id, e)] => format!("event {} of workload {id}", e.seq),
            _ => format!("an event of the workloads {} … {}", rows[0].0, rows[rows.len() - 1].0),
        })
    })
    .await?;
    Ok(())
}

/// Stores the idempotency keys of new workloads, each with its workload and creation time.
pub async fn insert_idempotency_keys<D: Driver>(
    conn: &mut D::Connection,
    rows: &[(&IdempotencyKey, WorkloadId, i64)],
) -> Result<()> {
    rows::execute::<D, _>(conn, &INSERT_KEYS, rows, key_row, |e, rows| {
        db_error(e, || match rows {
            [(k, _, _)] => format!("idempotency key `{}` of `{}`", k.key, k.actor),
            _ => format!("one of {} idempotency keys", rows.len()),
        })
    })
    .await?;
    Ok(())
}

pub async fn reserve_workload_ids<D: Driver>(s: &D, n: u32) -> Result<Range<u64>> {
    // One statement: the increment and the read are atomic, also across processes.
    let last: i64 = query::<D>("UPDATE sequences SET value = value + $1 WHERE name = 'workload' RETURNING value")
        .bind(i64::from(n))
        .fetch_one(&mut *s.conn().await?)
        .await
        .map_err(db)
        .and_then(|r| col(&r, "value"))?;
    let end = u64_of(last) + 1;
    Ok(end - u64::from(n)..end)
}

pub async fn get_workload<D: Driver>(s: &D, id: WorkloadId, scope: Option<&str>) -> Result<Option<Workload>> {
    let q = query::<D>(select!("WHERE id = $1 AND ($2 IS NULL OR tenant = $2)"))
        .bind(i64_of(id.0))
        .bind(scope);
    read_optional(s, q, workload_row).await
}

/// The statement of a workload listing (`LIST_*`) or count (`COUNT_*`) for `f`, with its
/// parameters, and the slot (order and direction) it reads in; `None` when the scope and the
/// tenant filter name different tenants (nothing matches). `limit`: the listing's page size
/// (a count has none).
fn filtered<'q, D: Driver>(
    f: &'q WorkloadFilter,
    statements: [&[&'static str; 6]; 3],
    limit: Option<u32>,
) -> Option<(Query<'q, D>, usize)> {
    let tenant = match (&f.scope, &f.tenant) {
        (Some(scope), Some(tenant)) if scope != tenant => return None,
        (scope, tenant) => scope.as_ref().or(tenant.as_ref()),
    };
    let mut phases: Vec<&'static str> = Vec::with_capacity(PHASE_SLOTS);
    for p in &f.phases {
        if !phases.contains(&p.as_str()) {
            phases.push(p.as_str());
        }
    }
    let (slot, read_as) = order_slot(f.order, f.backward && f.after.is_some());
    let [any_tenant, one_tenant, one_project] = statements;
    let sql = match (tenant, &f.project) {
        (None, _) => any_tenant,
        (Some(_), None) => one_tenant,
        (Some(_), Some(_)) => one_project,
    }[slot];
    let before = f.before.map_or(i64::MAX, |b| i64_of(b.0));
    let after_id = f.after.as_ref().map(|a| i64_of(a.id.0));
    // Newest first, the page after a workload is the ids below its id.
    let bound = match (read_as, after_id) {
        (WorkloadOrder::Newest, Some(a)) => before.min(a),
        _ => before,
    };
    let mut q = query::<D>(sql)
        .bind(tenant)
        .bind(&f.project)
        .bind(bound)
        .bind(phases.len() as i64);
    for slot in 0..PHASE_SLOTS {
        q = q.bind(phases.get(slot).copied());
    }
    if let Some(limit) = limit {
        q = q.bind(i64::from(limit));
    }
    q = match read_as {
        WorkloadOrder::Newest => q,
        WorkloadOrder::Oldest => q.bind(after_id.unwrap_or(-1)),
        WorkloadOrder::Name | WorkloadOrder::Phase => match &f.after {
            Some(a) => q.bind(a.key.clone()).bind(i64_of(a.id.0)),
            None => q.bind(String::new()).bind(i64::MAX),
        },
    };
    Some((q, slot))
}

pub async fn list_workloads<D: Driver>(s: &D, f: &WorkloadFilter) -> Result<Vec<Workload>> {
    let Some((q, slot)) = filtered::<D>(f, [&LIST_ANY_TENANT, &LIST_TENANT, &LIST_PROJECT], Some(f.limit)) else {
        return Ok(Vec::new());
    };
    let rows = q.fetch_all(&mut *s.conn().await?).await.map_err(db)?;
    let mut ws = rows.iter().map(workload_row).collect::<Result<Vec<_>>>()?;
    if slot != order_slot(f.order, false).0 {
        ws.reverse();
    }
    Ok(ws)
}

/// How many workloads `list_workloads(f)` answers without its limit (the same statements'
/// conditions, counted).
pub async fn count_workloads<D: Driver>(s: &D, f: &WorkloadFilter) -> Result<u64> {
    let Some((q, _)) = filtered::<D>(f, [&COUNT_ANY_TENANT, &COUNT_TENANT, &COUNT_PROJECT], None) else {
        return Ok(0);
    };
    let row = q.fetch_one(&mut *s.conn().await?).await.map_err(db)?;
    let n: i64 = col(&row, "n")?;
    Ok(u64_of(n))
}

pub async fn events<D: Driver>(s: &D, id: WorkloadId, scope: Option<&str>) -> Result<Vec<Event>> {
    let rows = query::<D>(
        "SELECT e.seq, e.step, e.at, e.detail, e.code FROM workload_events e \
         JOIN workloads w ON w.id = e.workload_id \
         WHERE e.workload_id = $1 AND ($2 IS NULL OR w.tenant = $2) ORDER BY e.seq",
    )
    .bind(i64_of(id.0))
    .bind(scope)
    .fetch_all(&mut *s.conn().await?)
    .await
    .map_err(db)?;
    rows.iter().map(|r| event_row(id, r)).collect()
}

pub async fn idempotent<D: Driver>(s: &D, actor: &str, key: &str) -> Result<Option<(String, WorkloadId)>> {
    let row = query::<D>("SELECT request_hash, workload_id FROM idempotency_keys WHERE actor = $1 AND key = $2")
        .bind(actor)
        .bind(key)
        .fetch_optional(&mut *s.conn().await?)
        .await
        .map_err(db)?;
    row.map(|r| Ok((col(&r, "request_hash")?, WorkloadId(u64_of(col(&r, "workload_id")?)))))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_domain::Phase;

    #[test]
    fn the_active_list_is_every_phase_that_is_not_terminal() {
        let listed: Vec<&str> = ACTIVE
            .split_once("phase IN (")
            .and_then(|(_, rest)| rest.split_once(')'))
            .map(|(list, _)| list.split(", ").map(|p| p.trim_matches('\'')).collect())
            .unwrap();
        let active: Vec<&str> = Phase::ALL
            .into_iter()
            .filter(|p| !p.is_terminal())
            .map(Phase::as_str)
            .collect();
        assert_eq!(listed, active);
    }

    #[test]
    fn every_phase_fits_a_listing() {
        assert_eq!(Phase::ALL.len(), PHASE_SLOTS);
    }
}
