//! What the SQL stores (`tessera-store-sqlite`, `tessera-store-postgres`) share about a stored
//! workload: the columns of the `workloads` table, and the decoding of a row into a
//! [`Workload`] through [`Cells`], which each store implements for its own row type (and
//! SQLite also for a statement stepped on its raw handle). No SQL runs here.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use serde::de::DeserializeOwned;
use tessera_domain::{
    Event, GangSpec, GpuSpec, Kind, Movable, Phase, Placement, PreemptCode, Reason, ReasonCode, ShapeSpec, Slice,
    StopCause, UsageCursor, Workload, WorkloadId, WorkloadSpec,
};
use tessera_model::GpuUnits;
use tessera_model::request::{TopologyConstraint, TopologyMode};

use tessera_store::{Result, StoreError};

/// The columns of `workloads` written only on insert, in the order the stores bind them.
#[macro_export]
macro_rules! workload_spec_columns {
    () => {
        "id, tenant, project, name, kind, gpus, mig_profile, fraction_milli, fraction_memory_mib, gang_gpus, \
         gang_gpus_per_node, gang_topology_level, gang_topology_mode, gang_segment, gang_remainder, shape_models, \
         shape_pool, cpu_milli, memory_mib, duration_s, command, image, env, priority, no_wait, no_requeue, \
         movable, native, units_milli, created_at"
    };
}

/// The columns of `workloads` an update writes too, in the order the stores bind them.
#[macro_export]
macro_rules! workload_lifecycle_columns {
    () => {
        "phase, reason_code, reason_detail, borrowing, running_at, ended_at, updated_at, stop_kind, stop_by, \
         stop_detail, next_event_seq, usage_seq, usage_open, p_pool, p_node, p_model, p_gpus, p_slice, \
         p_mig_profile, p_mig_profile_id, p_mig_start, p_mig_size, p_fraction_milli, p_gpu_memory_mib, p_units_milli, \
         p_shares"
    };
}

/// Every column of `workloads`, in the order an insert binds them and a `SELECT` reads them.
#[macro_export]
macro_rules! workload_columns {
    () => {
        concat!(
            $crate::workload_spec_columns!(),
            ", ",
            $crate::workload_lifecycle_columns!()
        )
    };
}

/// The names in a column list.
pub fn names(list: &'static str) -> impl Iterator<Item = &'static str> {
    list.split(',').map(str::trim)
}

/// Unsigned 64-bit values (ids, milli-units, MiB) are stored in signed BIGINT columns. Every
/// value Tessera produces is far below 2^63; the casts keep the bits, so even one that is not
/// would round-trip unchanged.
pub fn i64_of(v: u64) -> i64 {
    v as i64
}

/// The unsigned value a signed BIGINT column stores.
pub fn u64_of(v: i64) -> u64 {
    v as u64
}

/// An integer column narrowed to the type the record uses, or `Corrupt` naming it.
pub fn narrow<T: TryFrom<i64>>(value: i64, name: &str) -> Result<T> {
    T::try_from(value).map_err(|_| StoreError::Corrupt(format!("column `{name}`: {value} is out of range")))
}

/// An integer column narrowed, when present.
pub fn narrow_opt<T: TryFrom<i64>>(value: Option<i64>, name: &str) -> Result<Option<T>> {
    value.map(|v| narrow(v, name)).transpose()
}

pub fn corrupt(id: WorkloadId, what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("workload {id}: {what}"))
}

/// Serialises strings, numbers, and lists, maps and records of them (which cannot fail).
pub fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("strings, numbers and collections of them always serialise")
}

pub fn from_json<T: DeserializeOwned>(id: WorkloadId, column: &str, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| corrupt(id, format_args!("column `{column}`: {e}")))
}

/// GPU indexes as a bit mask (bit i: GPU i).
pub fn gpu_mask(id: WorkloadId, gpus: &[u8]) -> Result<i64> {
    let mut mask = 0u64;
    for &g in gpus {
        if g >= 64 {
            return Err(corrupt(id, format_args!("GPU index {g} cannot be stored (0 to 63)")));
        }
        mask |= 1 << g;
    }
    Ok(mask as i64)
}

pub fn gpus_of(mask: i64) -> Vec<u8> {
    (0..64u8).filter(|&g| (mask as u64) >> g & 1 == 1).collect()
}

/// The latest time the record knows, for `updated_at` (bookkeeping only; nothing reads it).
pub fn updated_at(w: &Workload, events: &[Event]) -> i64 {
    let known = [Some(w.created_at), w.running_at, w.ended_at]
        .into_iter()
        .flatten()
        .max();
    events.iter().map(|e| e.at).chain(known).max().unwrap_or(w.created_at)
}

/// The columns of a workload `SELECT`, in order.
const COLUMNS: &str = workload_columns!();

/// The names in [`COLUMNS`], for errors.
pub static COLUMN_NAMES: LazyLock<Vec<&'static str>> = LazyLock::new(|| names(COLUMNS).collect());

/// The position of `name` in [`COLUMNS`]; evaluated at compile time through [`at!`], so that a
/// misspelt name does not build.
pub const fn position(name: &str) -> usize {
    let list = COLUMNS.as_bytes();
    let name = name.as_bytes();
    let (mut index, mut i) = (0, 0);
    while i < list.len() {
        while list[i] == b' ' {
            i += 1;
        }
        let start = i;
        while i < list.len() && list[i] != b',' {
            i += 1;
        }
        if i - start == name.len() {
            let mut k = 0;
            while k < name.len() && list[start + k] == name[k] {
                k += 1;
            }
            if k == name.len() {
                return index;
            }
        }
        index += 1;
        i += 1;
    }
    panic!("not a column of `workloads`")
}

/// The position of a column in a workload `SELECT`, as a constant.
#[macro_export]
macro_rules! workload_column {
    ($name:literal) => {{
        const I: usize = $crate::columns::position($name);
        I
    }};
}
use workload_column as at;

/// One row of a workload `SELECT`, cell by cell, by position in [`workload_columns!`]: a
/// store's row type, or SQLite's statement stepped on its raw handle.
pub trait Cells {
    /// The integer at position `i`, `None` when NULL.
    fn int(&self, i: usize) -> Result<Option<i64>>;
    /// The text at position `i`, `None` when NULL.
    fn text(&self, i: usize) -> Result<Option<&str>>;

    /// The integer at `i`, which must not be NULL.
    fn int_of(&self, i: usize) -> Result<i64> {
        self.int(i)?.ok_or_else(|| null(i))
    }
    /// The text at `i`, which must not be NULL.
    fn text_of(&self, i: usize) -> Result<&str> {
        self.text(i)?.ok_or_else(|| null(i))
    }
    /// The boolean at `i`, which must not be NULL.
    fn flag(&self, i: usize) -> Result<bool>;
    /// The owned text at `i`, `None` when NULL.
    fn string(&self, i: usize) -> Result<Option<String>> {
        Ok(self.text(i)?.map(str::to_owned))
    }
}

/// `Corrupt`: the column at `i` holds a value of the wrong type.
pub fn mistyped(i: usize, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("column `{}`: {e}", COLUMN_NAMES[i]))
}

/// `Corrupt`: the column at `i` holds NULL where a value must be.
pub fn null(i: usize) -> StoreError {
    StoreError::Corrupt(format!("column `{}`: unexpected NULL", COLUMN_NAMES[i]))
}

/// The workload in a row of a `SELECT` of [`workload_columns!`].
pub fn workload_row(r: &impl Cells) -> Result<Workload> {
    let id = WorkloadId(u64_of(r.int_of(at!("id"))?));
    let gang = gang_row(id, r)?;
    let gpu = match (
        r.int(at!("gpus"))?,
        r.text(at!("mig_profile"))?,
        r.int(at!("fraction_milli"))?,
        gang,
    ) {
        (Some(gpus), None, None, None) => GpuSpec::Whole {
            gpus: narrow(gpus, "gpus")?,
        },
        (None, Some(profile), None, None) => GpuSpec::Mig {
            profile: profile.to_owned(),
        },
        (None, None, Some(milli), None) => GpuSpec::Fraction {
            milli: narrow(milli, "fraction_milli")?,
            memory_mib: narrow_opt(r.int(at!("fraction_memory_mib"))?, "fraction_memory_mib")?,
        },
        (None, None, None, Some(gang)) => GpuSpec::Gang(gang),
        _ => {
            return Err(corrupt(
                id,
                "exactly one of gpus, mig_profile, fraction_milli and gang_gpus must be set",
            ));
        }
    };
    let kind = r.text_of(at!("kind"))?;
    let spec = WorkloadSpec {
        tenant: r.text_of(at!("tenant"))?.to_owned(),
        project: r.text_of(at!("project"))?.to_owned(),
        name: r.text_of(at!("name"))?.to_owned(),
        kind: Kind::parse(kind).ok_or_else(|| corrupt(id, format_args!("unknown kind `{kind}`")))?,
        shape: ShapeSpec {
            gpu,
            models: from_json(id, "shape_models", r.text_of(at!("shape_models"))?)?,
            pool: r.string(at!("shape_pool"))?,
        },
        cpu_milli: u64_of(r.int_of(at!("cpu_milli"))?),
        memory_mib: u64_of(r.int_of(at!("memory_mib"))?),
        duration_s: r.int(at!("duration_s"))?.map(u64_of),
        command: r
            .text(at!("command"))?
            .map(|c| from_json(id, "command", c))
            .transpose()?,
        image: r.string(at!("image"))?,
        env: from_json::<BTreeMap<String, String>>(id, "env", r.text_of(at!("env"))?)?,
        priority: r.text_of(at!("priority"))?.to_owned(),
        no_wait: r.flag(at!("no_wait"))?,
        no_requeue: r.flag(at!("no_requeue"))?,
        movable: r
            .text(at!("movable"))?
            .map(|m| Movable::parse(m).ok_or_else(|| corrupt(id, format_args!("unknown movable `{m}`"))))
            .transpose()?,
        native: r.string(at!("native"))?,
    };
    let phase = r.text_of(at!("phase"))?;
    let reason = match (r.text(at!("reason_code"))?, r.text(at!("reason_detail"))?) {
        (None, None) => None,
        (Some(code), Some(detail)) => Some(Reason::new(
            ReasonCode::parse(code).ok_or_else(|| corrupt(id, format_args!("unknown reason code `{code}`")))?,
            detail,
        )),
        _ => return Err(corrupt(id, "a reason needs both its code and its detail")),
    };
    let stop = match r.text(at!("stop_kind"))? {
        None => None,
        Some("cancel") => Some(StopCause::Cancelled {
            by: r
                .string(at!("stop_by"))?
                .ok_or_else(|| corrupt(id, "a cancellation without `stop_by`"))?,
        }),
        Some(kind) => {
            let code =
                PreemptCode::parse(kind).ok_or_else(|| corrupt(id, format_args!("unknown stop kind `{kind}`")))?;
            let by = r
                .text(at!("stop_by"))?
                .and_then(|b| b.parse().ok())
                .ok_or_else(|| corrupt(id, "a preemption needs the preempting workload's id in `stop_by`"))?;
            Some(StopCause::Preempted {
                by: WorkloadId(by),
                code,
                detail: r
                    .string(at!("stop_detail"))?
                    .ok_or_else(|| corrupt(id, "a preemption without `stop_detail`"))?,
            })
        }
    };
    let placement = placement_row(id, r)?;
    let shares = match r.text(at!("p_shares"))? {
        None => Vec::new(),
        Some(_) if placement.is_none() => return Err(corrupt(id, "node-shares (`p_shares`) without a placement")),
        Some(text) => shares_of(id, text)?,
    };
    Ok(Workload {
        id,
        spec,
        units: GpuUnits(u64_of(r.int_of(at!("units_milli"))?)),
        phase: Phase::parse(phase).ok_or_else(|| corrupt(id, format_args!("unknown phase `{phase}`")))?,
        reason,
        placement,
        shares,
        borrowing: r.flag(at!("borrowing"))?,
        created_at: r.int_of(at!("created_at"))?,
        running_at: r.int(at!("running_at"))?,
        ended_at: r.int(at!("ended_at"))?,
        stop,
        next_seq: narrow(r.int_of(at!("next_event_seq"))?, "next_event_seq")?,
        usage: UsageCursor {
            seq: narrow(r.int_of(at!("usage_seq"))?, "usage_seq")?,
            open: r.flag(at!("usage_open"))?,
        },
    })
}

fn placement_row(id: WorkloadId, r: &impl Cells) -> Result<Option<Placement>> {
    let Some(kind) = r.text(at!("p_slice"))? else {
        return Ok(None);
    };
    let required = |column: usize| -> Result<i64> {
        r.int(column)?.ok_or_else(|| {
            corrupt(
                id,
                format_args!("a {kind} placement without `{}`", COLUMN_NAMES[column]),
            )
        })
    };
    let slice = match kind {
        "whole" => Slice::Whole,
        "mig" => Slice::Mig {
            profile: r
                .string(at!("p_mig_profile"))?
                .ok_or_else(|| corrupt(id, "a MIG placement without `p_mig_profile`"))?,
            profile_id: narrow(required(at!("p_mig_profile_id"))?, "p_mig_profile_id")?,
            start: narrow(required(at!("p_mig_start"))?, "p_mig_start")?,
            size: narrow(required(at!("p_mig_size"))?, "p_mig_size")?,
        },
        "fraction" => Slice::Fraction {
            milli: narrow(required(at!("p_fraction_milli"))?, "p_fraction_milli")?,
            gpu_memory_mib: narrow_opt(r.int(at!("p_gpu_memory_mib"))?, "p_gpu_memory_mib")?,
        },
        "cpu" => Slice::CpuOnly,
        other => return Err(corrupt(id, format_args!("unknown placement slice `{other}`"))),
    };
    let text = |column: usize| -> Result<String> {
        r.string(column)?
            .ok_or_else(|| corrupt(id, format_args!("a placement without `{}`", COLUMN_NAMES[column])))
    };
    Ok(Some(Placement {
        pool: text(at!("p_pool"))?,
        node: text(at!("p_node"))?,
        model: text(at!("p_model"))?,
        gpus: gpus_of(required(at!("p_gpus"))?),
        slice,
        units: GpuUnits(u64_of(required(at!("p_units_milli"))?)),
    }))
}

/// The gang columns of a row: `None` when the workload is no gang (every gang column NULL).
fn gang_row(id: WorkloadId, r: &impl Cells) -> Result<Option<GangSpec>> {
    let gpus = r.int(at!("gang_gpus"))?;
    let gpus_per_node = r.int(at!("gang_gpus_per_node"))?;
    let level = r.text(at!("gang_topology_level"))?;
    let mode = r.text(at!("gang_topology_mode"))?;
    let segment = r.int(at!("gang_segment"))?;
    let remainder = r.flag(at!("gang_remainder"))?;
    let Some(gpus) = gpus else {
        if gpus_per_node.is_some() || level.is_some() || mode.is_some() || segment.is_some() || remainder {
            return Err(corrupt(id, "gang columns are set but `gang_gpus` is NULL"));
        }
        return Ok(None);
    };
    let topology = match (level, mode) {
        (None, None) => None,
        (Some(level), Some(mode)) => Some(TopologyConstraint {
            level: level.to_owned(),
            mode: topology_mode_of(mode)
                .ok_or_else(|| corrupt(id, format_args!("unknown gang topology mode `{mode}`")))?,
        }),
        _ => {
            return Err(corrupt(
                id,
                "a gang's topology needs both `gang_topology_level` and `gang_topology_mode`",
            ));
        }
    };
    Ok(Some(GangSpec {
        gpus: narrow(gpus, "gang_gpus")?,
        gpus_per_node: narrow_opt(gpus_per_node, "gang_gpus_per_node")?,
        topology,
        segment: narrow_opt(segment, "gang_segment")?,
        remainder,
    }))
}

/// How `gang_topology_mode` stores a gang's topology mode.
pub fn topology_mode_str(mode: TopologyMode) -> &'static str {
    match mode {
        TopologyMode::Required => "required",
        TopologyMode::Preferred => "preferred",
    }
}

/// The topology mode `gang_topology_mode` holds, `None` for a value it never holds.
pub fn topology_mode_of(text: &str) -> Option<TopologyMode> {
    match text {
        "required" => Some(TopologyMode::Required),
        "preferred" => Some(TopologyMode::Preferred),
        _ => None,
    }
}

/// One node-share of a multi-node gang after the first, as `p_shares` stores it (a JSON
/// array of these). A node-share always holds whole GPUs, so its slice is not stored.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredShare {
    pool: String,
    node: String,
    model: String,
    /// GPU indexes on the node, as the placement lists them.
    gpus: Vec<u8>,
    units_milli: u64,
}

/// `p_shares` of a workload's node-shares after the first: `None` when it has none. `Corrupt`
/// (nothing is written) for a share that holds less than whole GPUs, or shares without a
/// first placement, which the column could not give back as they were.
pub fn shares_json(w: &Workload) -> Result<Option<String>> {
    if w.shares.is_empty() {
        return Ok(None);
    }
    if w.placement.is_none() {
        return Err(corrupt(w.id, "cannot store node-shares without a placement"));
    }
    let stored = w
        .shares
        .iter()
        .map(|p| match p.slice {
            Slice::Whole => Ok(StoredShare {
                pool: p.pool.clone(),
                node: p.node.clone(),
                model: p.model.clone(),
                gpus: p.gpus.clone(),
                units_milli: p.units.as_milli(),
            }),
            _ => Err(corrupt(
                w.id,
                format_args!(
                    "cannot store a node-share on {} of slice `{}`: node-shares hold whole GPUs",
                    p.node,
                    p.slice.kind()
                ),
            )),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(json(&stored)))
}

/// The node-shares `p_shares` holds.
pub fn shares_of(id: WorkloadId, text: &str) -> Result<Vec<Placement>> {
    let stored: Vec<StoredShare> = from_json(id, "p_shares", text)?;
    Ok(stored
        .into_iter()
        .map(|s| Placement {
            pool: s.pool,
            node: s.node,
            model: s.model,
            gpus: s.gpus,
            slice: Slice::Whole,
            units: GpuUnits(s.units_milli),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_column_is_found_at_its_place_in_the_select() {
        assert_eq!(COLUMN_NAMES.len(), 56);
        for (i, name) in COLUMN_NAMES.iter().enumerate() {
            assert_eq!(position(name), i, "{name}");
        }
        assert_eq!(workload_column!("id"), 0);
        assert_eq!(workload_column!("gang_remainder"), 14);
        assert_eq!(workload_column!("p_units_milli"), 54);
        assert_eq!(workload_column!("p_shares"), 55);
    }

    #[test]
    #[should_panic(expected = "not a column")]
    fn a_name_that_is_no_column_has_no_place() {
        position("shape");
    }

    #[test]
    fn gpu_masks_round_trip_up_to_index_63() {
        let id = WorkloadId(1);
        for gpus in [vec![], vec![0], vec![1, 5, 7], (0..16).collect(), vec![62, 63]] {
            assert_eq!(gpus_of(gpu_mask(id, &gpus).unwrap()), gpus);
        }
        assert!(matches!(gpu_mask(id, &[64]), Err(StoreError::Corrupt(_))));
    }
}
