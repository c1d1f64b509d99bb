//! # tessera-api
//!
//! The types of Tessera's REST API (`/api/v1`): what clients send and receive. The server
//! generates its OpenAPI document from them, the store persists workload specs in this shape,
//! and the CLI deserialises responses with them. Plain data, no behaviour beyond validation
//! helpers and time formatting.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// RFC 7807 problem details, returned with every error (`application/problem+json`).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct Problem {
    /// A URI naming the problem type, e.g. `https://tessera.dev/problems/validation`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Short summary of the problem type.
    pub title: String,
    /// HTTP status code.
    pub status: u16,
    /// What went wrong, in a sentence a person can act on.
    pub detail: String,
    /// The request path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// For validation problems: the offending request field.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// One page of a list. Pass `next_cursor` back as `cursor` to get the next page.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// How a pool shares its GPUs.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct PoolView {
    pub name: String,
    /// `whole`, `mig` or `shared`.
    pub sharing: String,
    pub allow_tenant_mixing: bool,
    pub nodes: u64,
    pub gpus: u64,
    pub models: Vec<String>,
    /// GPU units in use / in total, as decimal strings (`"22.5"`).
    pub units_used: String,
    pub units_total: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct NodeView {
    pub name: String,
    pub pool: String,
    pub model: String,
    pub gpus: u8,
    /// `nvswitch`, `pairs` or `none`.
    pub nvlink: String,
    pub cpus: f64,
    pub cpus_free: f64,
    pub memory_gib: f64,
    pub memory_gib_free: f64,
    pub gpus_free: u8,
    pub units_used: String,
}

/// One slice of a GPU: a MIG instance, a time-slice share, or the whole GPU.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct SliceView {
    /// `whole`, `mig` or `fraction`.
    pub kind: String,
    /// MIG profile name (`3g.40gb`), or the fraction (`250m`), or `whole`.
    pub what: String,
    /// MIG: NVML profile ID and placement (`start`, `size` in memory slices).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile_id: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u8>,
    pub units: String,
    pub workload: u64,
    pub tenant: String,
    pub project: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct GpuView {
    pub node: String,
    pub index: u8,
    pub pool: String,
    pub model: String,
    /// `whole`, `mig` or `shared`.
    pub sharing: String,
    pub units_used: String,
    /// MIG: occupied memory slices as a string of `#` and `.` (slice 0 first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig_slices: Option<String>,
    pub slices: Vec<SliceView>,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct Tenant {
    pub name: String,
    pub display_name: String,
    pub created_at: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct CreateTenant {
    /// Lower-case slug: letters, digits and `-`, 1–40 characters.
    pub name: String,
    #[serde(default)]
    pub display_name: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct Project {
    pub tenant: String,
    pub name: String,
    pub created_at: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct CreateProject {
    pub name: String,
}

/// The GPU shape of a workload: exactly one of `gpus`, `mig`, `fraction`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields)]
pub struct GpuShape {
    /// Whole GPUs on one node (and one NVLink domain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u8>,
    /// A MIG profile: a name such as `3g.40gb`, or `MODEL:PROFILE_ID`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<String>,
    /// A fraction of a time-shared GPU in milli-GPU, 1–999.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<u16>,
    /// With `fraction`: GPU memory to reserve, MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_mib: Option<u32>,
    /// Allowed GPU models or families (`h100`, `A100-80GB`); empty = any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// Restrict to one pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, ToSchema, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadKind {
    #[default]
    Batch,
    Service,
    Interactive,
}

impl WorkloadKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::Batch => "batch",
            WorkloadKind::Service => "service",
            WorkloadKind::Interactive => "interactive",
        }
    }
}

/// A request for GPUs.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields)]
pub struct CreateWorkload {
    pub tenant: String,
    pub project: String,
    /// 1–63 characters.
    pub name: String,
    #[serde(default)]
    pub kind: WorkloadKind,
    pub shape: GpuShape,
    /// Host CPU in milli-cores (default 1000 per GPU unit, at least 500).
    #[serde(default)]
    pub cpu_milli: Option<u64>,
    /// Host memory in MiB (default 8 GiB per GPU unit, at least 1 GiB).
    #[serde(default)]
    pub memory_mib: Option<u64>,
    /// Run time in seconds for batch work; a lease for services and interactive sessions.
    /// Absent: runs until cancelled.
    #[serde(default)]
    pub duration_s: Option<i64>,
    #[serde(default)]
    pub command: Option<Vec<String>>,
    #[serde(default)]
    pub image: Option<String>,
    /// Priority class name (default `standard`).
    #[serde(default)]
    pub priority: Option<String>,
}

/// Lifecycle state of a workload.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadState {
    /// Accepted and recorded, not yet placed.
    Pending,
    /// Waiting for capacity.
    Queued,
    /// Placed by the scheduler; the backend is partitioning and starting it.
    Placed,
    Running,
    /// Being stopped (grace period).
    Stopping,
    Succeeded,
    Failed,
    Cancelled,
    Preempted,
}

impl WorkloadState {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadState::Pending => "pending",
            WorkloadState::Queued => "queued",
            WorkloadState::Placed => "placed",
            WorkloadState::Running => "running",
            WorkloadState::Stopping => "stopping",
            WorkloadState::Succeeded => "succeeded",
            WorkloadState::Failed => "failed",
            WorkloadState::Cancelled => "cancelled",
            WorkloadState::Preempted => "preempted",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => WorkloadState::Pending,
            "queued" => WorkloadState::Queued,
            "placed" => WorkloadState::Placed,
            "running" => WorkloadState::Running,
            "stopping" => WorkloadState::Stopping,
            "succeeded" => WorkloadState::Succeeded,
            "failed" => WorkloadState::Failed,
            "cancelled" => WorkloadState::Cancelled,
            "preempted" => WorkloadState::Preempted,
            _ => return None,
        })
    }

    /// Terminal states hold no capacity and never change again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            WorkloadState::Succeeded
                | WorkloadState::Failed
                | WorkloadState::Cancelled
                | WorkloadState::Preempted
        )
    }

    /// States in which the workload holds an allocation.
    pub fn holds_capacity(self) -> bool {
        matches!(
            self,
            WorkloadState::Placed | WorkloadState::Running | WorkloadState::Stopping
        )
    }
}

/// Where a workload was placed.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct AllocationView {
    pub pool: String,
    pub node: String,
    pub model: String,
    /// GPU indexes on the node.
    pub gpus: Vec<u8>,
    /// `whole`, `mig`, `fraction` or `cpu`.
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_profile_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_start: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_size: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub milli: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_mib: Option<u32>,
    /// GPU units held, in thousandths.
    pub units_milli: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct Workload {
    pub id: u64,
    pub tenant: String,
    pub project: String,
    pub name: String,
    pub kind: WorkloadKind,
    pub shape: GpuShape,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    pub priority: String,
    pub state: WorkloadState,
    /// Why the workload waits, failed or was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// GPU units the shape asks for (decimal string).
    pub units: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation: Option<AllocationView>,
    /// RFC 3339 UTC.
    pub created_at: String,
    /// `created_at` in milliseconds since the epoch.
    pub created_at_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_at_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    /// Milliseconds from `requested` to `running`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_to_running_ms: Option<u64>,
}

/// One step of a workload's timeline.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct Event {
    pub seq: u32,
    /// `requested`, `authorised`, `placed`, `partitioned`, `running`, `observed`, `metered`,
    /// `released`, or `queued`, `failed`, `cancelled`, `preempted`.
    pub step: String,
    /// RFC 3339 UTC with milliseconds.
    pub at: String,
    /// Milliseconds since the epoch (for step durations).
    pub at_ms: i64,
    pub detail: String,
}

/// A newly created API token (the secret is shown once).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct CreatedToken {
    pub id: String,
    pub token: String,
    pub tenant: Option<String>,
    pub role: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct CreateToken {
    /// The tenant the token acts for; absent = platform-wide (platform-admin only).
    #[serde(default)]
    pub tenant: Option<String>,
    /// `platform-admin`, `tenant-admin`, `member` or `viewer`.
    pub role: String,
    #[serde(default)]
    pub name: Option<String>,
}

/// Formats milliseconds since the Unix epoch as RFC 3339 UTC with milliseconds.
pub fn rfc3339_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let milli = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{milli:03}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_rfc3339() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_795_948_800_123), "2026-11-29T10:40:00.123Z");
        assert_eq!(rfc3339_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn states_round_trip() {
        for s in [
            "pending",
            "queued",
            "placed",
            "running",
            "stopping",
            "succeeded",
            "failed",
            "cancelled",
            "preempted",
        ] {
            assert_eq!(WorkloadState::parse(s).unwrap().as_str(), s);
        }
        assert!(WorkloadState::Cancelled.is_terminal());
        assert!(WorkloadState::Running.holds_capacity());
    }
}
