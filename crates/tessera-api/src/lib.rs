//! # tessera-api
//!
//! The types of Tessera's REST API (`/api/v1`): what clients send and receive. The server
//! generates its OpenAPI document from them and converts its domain records to them at the
//! edge; the CLI deserialises responses with them. Plain data and the rules request values
//! follow ([`rules`]), which both the server's checks and the document's schemas come from;
//! time formatting.

pub mod rules;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::rules::{Validate, Violation};

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
    /// `ready`, `cordoned` (no new placement), `draining` (being emptied) or `maintenance`
    /// (drained, safe to work on).
    #[serde(default)]
    pub state: String,
    /// The node's rack, if its pool declares racks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rack: Option<String>,
    /// The node's place at every topology level above it that its pool declares, lowest first
    /// (`rack`, `block`, or label keys).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topology: Vec<TopologyLevelView>,
}

/// A node's domain at one topology level.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct TopologyLevelView {
    /// The level's name (`rack`, `block`, a node label key).
    pub level: String,
    /// The domain's name at that level (`r2`).
    pub domain: String,
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
    /// The priority classes the tenant's workloads may use, as the platform admin granted them
    /// (default: `standard` and `opportunistic`).
    #[serde(default)]
    pub priorities: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTenant {
    #[schema(schema_with = rules::schema::slug)]
    pub name: String,
    /// Shown to people (default: the name).
    #[serde(default)]
    #[schema(schema_with = rules::schema::display_name_opt)]
    pub display_name: Option<String>,
    /// The priority classes granted to the tenant (absent: `standard` and `opportunistic`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = rules::schema::priorities_opt)]
    pub priorities: Option<Vec<String>>,
}

impl Validate for CreateTenant {
    fn validate(&self) -> Result<(), Violation> {
        rules::check_slug("name", &self.name)?;
        if let Some(d) = &self.display_name {
            rules::DISPLAY_NAME.check("display_name", d)?;
        }
        if let Some(p) = &self.priorities {
            rules::check_priorities("priorities", p)?;
        }
        Ok(())
    }
}

/// The priority classes granted to a tenant (`PUT /api/v1/tenants/{tenant}/priorities`,
/// platform-admin). Its workloads may ask only for these; `null`: the default grant.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetPriorities {
    #[schema(schema_with = rules::schema::priorities_opt)]
    pub priorities: Option<Vec<String>>,
}

impl Validate for SetPriorities {
    fn validate(&self) -> Result<(), Violation> {
        match &self.priorities {
            Some(p) => rules::check_priorities("priorities", p),
            None => Ok(()),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct Project {
    pub tenant: String,
    pub name: String,
    pub created_at: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateProject {
    #[schema(schema_with = rules::schema::slug)]
    pub name: String,
}

impl Validate for CreateProject {
    fn validate(&self) -> Result<(), Violation> {
        rules::check_slug("name", &self.name)
    }
}

/// How strictly a gang keeps within one domain of its topology level.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, ToSchema, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum TopologyMode {
    /// The whole gang within one domain of the level, or it waits (refused if none could ever
    /// hold it).
    #[default]
    Required,
    /// One domain of the level when one has room, else the fewest domains above it.
    Preferred,
}

/// The GPU shape of a workload: exactly one of whole GPUs (`gpus`, or a gang's `nodes`),
/// `mig`, `fraction`. Whole GPUs beyond one node are a multi-node gang: node-shares of
/// `gpus_per_node` GPUs (whole nodes by default), started and ended together, kept within
/// `topology`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields)]
pub struct GpuShape {
    /// Whole GPUs: on one node (and one NVLink domain) when one node of the pool can hold
    /// them, else a gang of whole nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = rules::schema::gang_gpus_opt)]
    pub gpus: Option<u32>,
    /// A gang of this many node-shares (with `gpus_per_node`, or `gpus` divided among them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = rules::schema::nodes_opt)]
    pub nodes: Option<u32>,
    /// A gang's GPUs per node-share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = rules::schema::gpus_per_node_opt)]
    pub gpus_per_node: Option<u8>,
    /// A gang's topology level (`rack`, `block`, `pool`, a label key): by default the fewest
    /// racks possible, preferred.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = rules::schema::topology_opt)]
    pub topology: Option<String>,
    /// With `topology`: `required` (the default) or `preferred`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_mode: Option<TopologyMode>,
    /// A gang in segments of this many GPUs, each within one rack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = rules::schema::segment_opt)]
    pub segment: Option<u32>,
    /// A gang of whole nodes whose `gpus` need not be a multiple of the node size: the last
    /// node-share holds the remainder on one node (12 GPUs on 8-GPU nodes: 8 + 4). With `gpus`
    /// alone (no `nodes`, `gpus_per_node` or `segment`), more GPUs than one node has and no
    /// multiple of it; the quota counts all of them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub remainder: bool,
    /// A MIG profile: a name such as `3g.40gb`, or `MODEL:PROFILE_ID`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<String>,
    /// A fraction of a time-shared GPU in milli-GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = rules::schema::fraction_opt)]
    pub fraction: Option<u16>,
    /// With `fraction`: GPU memory to reserve, MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = rules::schema::gpu_memory_mib_opt)]
    pub gpu_memory_mib: Option<u32>,
    /// Allowed GPU models or families (`h100`, `A100-80GB`); empty = any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// Restrict to one pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = rules::schema::slug_opt)]
    pub pool: Option<String>,
}

impl Validate for GpuShape {
    fn validate(&self) -> Result<(), Violation> {
        let whole = self.gpus.is_some() || self.nodes.is_some();
        let set = [whole, self.mig.is_some(), self.fraction.is_some()]
            .iter()
            .filter(|x| **x)
            .count();
        if set != 1 {
            return Err(Violation::new(
                "shape",
                "give exactly one of `gpus` or `nodes` (whole GPUs), `mig` (a MIG profile) or `fraction` (milli-GPU)",
            ));
        }
        if let Some(g) = self.gpus {
            rules::GANG_GPUS.check("shape.gpus", g.into())?;
        }
        if let Some(n) = self.nodes {
            rules::NODES.check("shape.nodes", n.into())?;
            match (self.gpus, self.gpus_per_node) {
                (None, None) => {
                    return Err(Violation::new(
                        "shape.gpus_per_node",
                        "a gang of `nodes` node-shares needs `gpus_per_node` (or `gpus` in all)",
                    ));
                }
                (Some(g), None) if g % n != 0 => {
                    return Err(Violation::new(
                        "shape.gpus",
                        format!("{g} GPUs over {n} nodes: ask for a multiple of {n}, or give `gpus_per_node`"),
                    ));
                }
                (Some(g), Some(per)) if g != n * u32::from(per) => {
                    return Err(Violation::new(
                        "shape.gpus",
                        format!("{g} GPUs is not {n} nodes × {per} GPUs per node: give two of the three"),
                    ));
                }
                _ => {}
            }
        }
        if let Some(per) = self.gpus_per_node {
            rules::GPUS.check("shape.gpus_per_node", per.into())?;
            if !whole {
                return Err(Violation::new(
                    "shape.gpus_per_node",
                    "gpus_per_node goes with whole GPUs",
                ));
            }
            if self.nodes.is_none() && self.gpus.is_some_and(|g| g % u32::from(per) != 0) {
                return Err(Violation::new(
                    "shape.gpus",
                    format!(
                        "{} GPUs as node-shares of {per}: ask for a multiple of {per}",
                        self.gpus.unwrap_or(0)
                    ),
                ));
            }
        }
        if let Some(t) = &self.topology {
            rules::check_level("shape.topology", t)?;
        }
        if self.topology_mode.is_some() && self.topology.is_none() {
            return Err(Violation::new(
                "shape.topology_mode",
                "topology_mode goes with `topology`",
            ));
        }
        if let Some(seg) = self.segment {
            rules::GANG_GPUS.check("shape.segment", seg.into())?;
        }
        if self.remainder && (self.gpus.is_none() || self.nodes.is_some() || self.gpus_per_node.is_some()) {
            return Err(Violation::new(
                "shape.remainder",
                "a remainder share goes with a gang of whole nodes: give `gpus` alone, without `nodes` or `gpus_per_node` (the node size is the pool's)",
            ));
        }
        if self.remainder && self.segment.is_some() {
            return Err(Violation::new(
                "shape.remainder",
                "a gang with a remainder share has no segments: leave out `segment` or `remainder`",
            ));
        }
        if !whole && (self.topology.is_some() || self.segment.is_some()) {
            return Err(Violation::new(
                "shape.topology",
                "topology and segment go with whole GPUs (a gang across nodes)",
            ));
        }
        if let Some(f) = self.fraction {
            rules::FRACTION.check("shape.fraction", f.into())?;
        }
        if let Some(m) = self.gpu_memory_mib {
            if self.fraction.is_none() {
                return Err(Violation::new(
                    "shape.gpu_memory_mib",
                    "gpu_memory_mib goes with `fraction` only (whole GPUs and MIG instances come with their memory)",
                ));
            }
            rules::GPU_MEMORY_MIB.check("shape.gpu_memory_mib", m.into())?;
        }
        if let Some(p) = &self.pool {
            rules::check_slug("shape.pool", p)?;
        }
        Ok(())
    }
}

impl GpuShape {
    /// The rules among the fields that [`Validate`] checks and a schema can state, as JSON
    /// Schema keywords the OpenAPI document adds to `GpuShape` (the derive cannot say them):
    /// exactly one kind (whole GPUs: `gpus`, or `nodes` with `gpus_per_node`; `mig`;
    /// `fraction`), `gpus_per_node`, `topology` and `segment` with whole GPUs only,
    /// `gpu_memory_mib` with `fraction` only, `topology_mode` with `topology` only, `remainder`
    /// with `gpus` alone. A field given as `null` is absent. What no schema states (`gpus` a
    /// multiple of `nodes` or of `gpus_per_node`, a profile or a shape some node can hold) is
    /// [`GpuShape::RULES_NOT_IN_SCHEMA`].
    pub fn schema_rules() -> serde_json::Value {
        use serde_json::{Map, Value, json};
        // Given means present and not null; each field's type and range is its own schema's.
        let absent = |fields: &[&str]| -> Value {
            let props: Map<String, Value> = fields
                .iter()
                .map(|f| (f.to_string(), json!({"type": "null"})))
                .collect();
            Value::Object(props)
        };
        let with = |props: Value, others: &[&str]| -> Value {
            let mut p = absent(others);
            p.as_object_mut()
                .expect("an object")
                .extend(props.as_object().expect("an object").clone());
            p
        };
        json!({
            "oneOf": [
                {
                    "title": "Whole GPUs: `gpus`, or a gang's `nodes` with `gpus_per_node`",
                    "anyOf": [
                        {"required": ["gpus"], "properties": {"gpus": {"not": {"type": "null"}}}},
                        {
                            "required": ["nodes", "gpus_per_node"],
                            "properties": {"nodes": {"not": {"type": "null"}}, "gpus_per_node": {"not": {"type": "null"}}}
                        }
                    ],
                    "properties": absent(&["mig", "fraction", "gpu_memory_mib"])
                },
                {
                    "title": "A MIG instance: `mig`",
                    "required": ["mig"],
                    "properties": with(json!({"mig": {"not": {"type": "null"}}}), &[
                        "gpus", "nodes", "gpus_per_node", "topology", "topology_mode", "segment", "fraction", "gpu_memory_mib"
                    ])
                },
                {
                    "title": "A fraction of a time-shared GPU: `fraction` (and `gpu_memory_mib`)",
                    "required": ["fraction"],
                    "properties": with(json!({"fraction": {"not": {"type": "null"}}}), &[
                        "gpus", "nodes", "gpus_per_node", "topology", "topology_mode", "segment", "mig"
                    ])
                }
            ],
            "anyOf": [
                {"title": "No `topology_mode`", "properties": {"topology_mode": {"type": "null"}}},
                {
                    "title": "`topology_mode` with `topology`",
                    "required": ["topology"],
                    "properties": {"topology": {"not": {"type": "null"}}}
                }
            ],
            // A second alternative of its own (a schema has one `anyOf`): `remainder` with
            // `gpus` alone (the `oneOf` above then rules out `mig` and `fraction`).
            "allOf": [{
                "anyOf": [
                    {"title": "No `remainder`", "properties": {"remainder": {"const": false}}},
                    {
                        "title": "`remainder` with `gpus` alone",
                        "required": ["gpus"],
                        "properties": with(json!({"gpus": {"not": {"type": "null"}}}), &[
                            "nodes", "gpus_per_node", "segment"
                        ])
                    }
                ]
            }]
        })
    }

    /// The shape's rules the schema cannot state (refused with 422).
    pub const RULES_NOT_IN_SCHEMA: &str = "`gpus` must be a multiple of `nodes` (without `gpus_per_node`) \
        or of `gpus_per_node` (without `nodes`), and `nodes` × `gpus_per_node` when all three are given; \
        a `remainder` gang's `gpus` must be more than one node of the pool holds and no multiple of it; \
        a shape no node of the fleet can ever hold, an unknown MIG profile, model or pool is refused \
        (problem type …/constraint)";
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
    #[schema(schema_with = rules::schema::slug)]
    pub tenant: String,
    #[schema(schema_with = rules::schema::slug)]
    pub project: String,
    #[schema(schema_with = rules::schema::name)]
    pub name: String,
    #[serde(default)]
    pub kind: WorkloadKind,
    pub shape: GpuShape,
    /// Host CPU in milli-cores (default 4000 per GPU unit, at least 500).
    #[serde(default)]
    #[schema(schema_with = rules::schema::cpu_milli_opt)]
    pub cpu_milli: Option<u64>,
    /// Host memory in MiB (default 16 GiB per GPU unit, at least 1 GiB).
    #[serde(default)]
    #[schema(schema_with = rules::schema::memory_mib_opt)]
    pub memory_mib: Option<u64>,
    /// Run time in seconds for batch work; a lease for services and interactive sessions.
    /// Absent: runs until cancelled.
    #[serde(default)]
    #[schema(schema_with = rules::schema::duration_s_opt)]
    pub duration_s: Option<i64>,
    #[serde(default)]
    pub command: Option<Vec<String>>,
    #[serde(default)]
    pub image: Option<String>,
    /// Environment variables given to the workload.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Priority class name (default `standard`).
    #[serde(default)]
    pub priority: Option<String>,
    /// Beyond the tenant's limit: be refused at once instead of waiting.
    #[serde(default)]
    pub no_wait: bool,
    /// If preempted, end as `preempted` instead of being requeued (batch work is requeued by
    /// default; services and interactive sessions are not).
    #[serde(default)]
    pub no_requeue: bool,
    /// Whether consolidation may move it once it runs, so that a request waiting for
    /// fragmented capacity fits (absent: never). `restart`: batch work that can be stopped and
    /// requeued (it restarts from its last checkpoint; not with `no_requeue`). `replace`: a
    /// service without a lease, moved by starting a replacement first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub movable: Option<MovableMode>,
}

/// How consolidation may move a running workload.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum MovableMode {
    /// Batch work: stopped (grace period) and requeued; it restarts from its checkpoint.
    Restart,
    /// A service: a replacement workload starts elsewhere first, then this one stops.
    Replace,
}

impl MovableMode {
    pub fn as_str(self) -> &'static str {
        match self {
            MovableMode::Restart => "restart",
            MovableMode::Replace => "replace",
        }
    }
}

impl CreateWorkload {
    /// [`Validate`]'s rules between `movable` and the other fields as JSON Schema keywords the
    /// OpenAPI document adds to `CreateWorkload`: `restart` for batch work without
    /// `no_requeue`, `replace` for a service without `duration_s`.
    pub fn schema_rules() -> serde_json::Value {
        serde_json::json!({
            "anyOf": [
                {"title": "Not movable", "properties": {"movable": {"type": "null"}}},
                {
                    "title": "`restart`: batch work that may be requeued",
                    "required": ["movable"],
                    "properties": {"movable": {"const": "restart"}, "kind": {"const": "batch"}, "no_requeue": {"const": false}}
                },
                {
                    "title": "`replace`: a service without a lease",
                    "required": ["movable", "kind"],
                    "properties": {"movable": {"const": "replace"}, "kind": {"const": "service"}, "duration_s": {"type": "null"}}
                }
            ]
        })
    }
}

impl Validate for CreateWorkload {
    fn validate(&self) -> Result<(), Violation> {
        rules::check_slug("tenant", &self.tenant)?;
        rules::check_slug("project", &self.project)?;
        rules::NAME.check("name", &self.name)?;
        self.shape.validate()?;
        if let Some(c) = self.cpu_milli {
            rules::CPU_MILLI.check_u64("cpu_milli", c)?;
        }
        if let Some(m) = self.memory_mib {
            rules::MEMORY_MIB.check_u64("memory_mib", m)?;
        }
        if let Some(d) = self.duration_s {
            rules::DURATION_S.check("duration_s", d)?;
        }
        match self.movable {
            Some(MovableMode::Restart) if self.kind != WorkloadKind::Batch => Err(Violation::new(
                "movable",
                "`restart` is for batch work (stopped and requeued); a service may be `replace`",
            )),
            Some(MovableMode::Restart) if self.no_requeue => Err(Violation::new(
                "movable",
                "`restart` requeues the workload, which `no_requeue` forbids",
            )),
            Some(MovableMode::Replace) if self.kind != WorkloadKind::Service => Err(Violation::new(
                "movable",
                "`replace` is for services (a replacement starts first); batch work may be `restart`",
            )),
            Some(MovableMode::Replace) if self.duration_s.is_some() => Err(Violation::new(
                "movable",
                "`replace` is for services without a lease (a replacement would start its lease again)",
            )),
            _ => Ok(()),
        }
    }
}

/// Lifecycle state of a workload.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadState {
    /// Accepted and recorded, not yet decided by a scheduler cycle: the next cycle (at most a
    /// second away) gives it a state and a reason, however long the queue. A create answers
    /// after that cycle.
    Pending,
    /// Waiting, with a reason: for capacity, quota or budget, or to be looked at by a cycle
    /// (`not-considered`: on a deep queue a cycle looks at a bounded number of jobs).
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
    /// Every state, in the order of a workload's life.
    pub const ALL: [WorkloadState; 9] = [
        WorkloadState::Pending,
        WorkloadState::Queued,
        WorkloadState::Placed,
        WorkloadState::Running,
        WorkloadState::Stopping,
        WorkloadState::Succeeded,
        WorkloadState::Failed,
        WorkloadState::Cancelled,
        WorkloadState::Preempted,
    ];

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
        Self::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// Terminal states hold no capacity and never change again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            WorkloadState::Succeeded | WorkloadState::Failed | WorkloadState::Cancelled | WorkloadState::Preempted
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
    /// GPU units held, in thousandths (a gang: by all its node-shares).
    pub units_milli: u64,
    /// A multi-node gang's node-shares after the first (which the fields above describe), in
    /// gang order; empty on one node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<ShareView>,
}

/// One node-share of a multi-node gang: whole GPUs of one node.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct ShareView {
    pub node: String,
    /// GPU indexes on the node.
    pub gpus: Vec<u8>,
    /// GPU units it holds, in thousandths.
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
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    pub priority: String,
    /// Whether and how consolidation may move it (absent: never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub movable: Option<MovableMode>,
    pub state: WorkloadState,
    /// Admitted above the tenant's guaranteed share: may be preempted to reclaim it.
    #[serde(default)]
    pub borrowing: bool,
    /// Why the workload waits, failed, was refused or stopped, in a sentence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The reason's stable code: `no-capacity`, `fragmentation`, `isolation`, `held`, `quota`,
    /// `budget`, `backoff`, `preemption`, `requeued`, `not-considered`, `constraint`, `cancelled`,
    /// `preempted-priority`, `preempted-reclaim`, `partition-failed`, `start-failed`,
    /// `exit-failure`, `lost`, `invalid`, `gpu-unhealthy`, `node-drain`, `consolidation` or
    /// `unknown`. Creation
    /// refusals by a tenant's image policy are problem types: `image-registry-not-allowed`,
    /// `image-signature-missing`, `image-signature-invalid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason_code: Option<String>,
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
    /// For a multi-node gang waiting for capacity that holds no nodes yet (in the answer for
    /// one workload, not in lists): when and where it would start if it held nodes now ("if
    /// it waits, it starts at about 2026-12-06 19:45:47 UTC in rack r0 when 1 workload there
    /// ends"), as the dry run says. It holds nodes once it has waited past the backfill
    /// window, and its reason then says when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_start: Option<String>,
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
    /// The reason code of queued, failed, cancelled and preempted steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

/// A newly created API token (the secret is shown once).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct CreatedToken {
    pub id: String,
    pub token: String,
    pub tenant: Option<String>,
    pub role: String,
}

/// What a token may do. `platform-admin`: everything; `tenant-admin`, `member`, `viewer`: in
/// one tenant; `metrics`: read `/metrics` only (for Prometheus), nothing else.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum TokenRole {
    PlatformAdmin,
    TenantAdmin,
    Member,
    Viewer,
    Metrics,
}

impl TokenRole {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenRole::PlatformAdmin => "platform-admin",
            TokenRole::TenantAdmin => "tenant-admin",
            TokenRole::Member => "member",
            TokenRole::Viewer => "viewer",
            TokenRole::Metrics => "metrics",
        }
    }

    /// Every role.
    pub const ALL: [TokenRole; 5] = [
        TokenRole::PlatformAdmin,
        TokenRole::TenantAdmin,
        TokenRole::Member,
        TokenRole::Viewer,
        TokenRole::Metrics,
    ];

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// Whether tokens of this role act for one tenant (and must name it).
    pub fn is_tenant_role(self) -> bool {
        matches!(self, TokenRole::TenantAdmin | TokenRole::Member | TokenRole::Viewer)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// The tenant the token acts for: required for `tenant-admin`, `member` and `viewer`,
    /// absent for `platform-admin` and `metrics`.
    #[serde(default)]
    #[schema(schema_with = rules::schema::slug_opt)]
    pub tenant: Option<String>,
    pub role: TokenRole,
    #[serde(default)]
    #[schema(schema_with = rules::schema::name_opt)]
    pub name: Option<String>,
    /// Lifetime in seconds; absent = until revoked.
    #[serde(default)]
    #[schema(schema_with = rules::schema::expires_in_s_opt)]
    pub expires_in_s: Option<i64>,
}

impl CreateToken {
    /// [`Validate`]'s rule between `role` and `tenant` as JSON Schema keywords the OpenAPI
    /// document adds to `CreateToken`: a tenant role names its tenant, the other roles name
    /// none (`null` is none).
    pub fn schema_rules() -> serde_json::Value {
        use serde_json::json;
        let roles = |tenant: bool| -> Vec<&str> {
            TokenRole::ALL
                .into_iter()
                .filter(|r| r.is_tenant_role() == tenant)
                .map(TokenRole::as_str)
                .collect()
        };
        json!({
            "oneOf": [
                {
                    "title": "A tenant's token: names its tenant",
                    "required": ["tenant"],
                    "properties": {"role": {"enum": roles(true)}, "tenant": {"type": "string"}}
                },
                {
                    "title": "A platform token: no tenant",
                    "properties": {"role": {"enum": roles(false)}, "tenant": {"type": "null"}}
                }
            ]
        })
    }
}

impl Validate for CreateToken {
    fn validate(&self) -> Result<(), Violation> {
        match (&self.tenant, self.role.is_tenant_role()) {
            (None, true) => return Err(Violation::new("tenant", "tenant roles need a `tenant`")),
            (Some(_), false) => {
                return Err(Violation::new(
                    "tenant",
                    format!("{} tokens are not tied to a tenant", self.role.as_str()),
                ));
            }
            (Some(t), true) => rules::check_slug("tenant", t)?,
            (None, false) => {}
        }
        if let Some(n) = &self.name {
            rules::NAME.check("name", n)?;
        }
        if let Some(e) = self.expires_in_s {
            rules::EXPIRES_IN_S.check("expires_in_s", e)?;
        }
        Ok(())
    }
}

/// An API token as listed (never the secret).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct TokenView {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    pub role: String,
    pub name: String,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<String>,
}

/// One audit record.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct AuditEntry {
    pub seq: u64,
    pub at: String,
    pub request_id: String,
    pub actor: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    pub action: String,
    pub target: String,
    /// HTTP status of the outcome.
    pub outcome: u16,
    /// What the change was, where the action records it (a grant's classes before and after).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// The timestamp of `ms` milliseconds since the epoch, clamped to what jiff represents.
fn timestamp(ms: i64) -> jiff::Timestamp {
    jiff::Timestamp::from_millisecond(ms).unwrap_or(if ms < 0 {
        jiff::Timestamp::MIN
    } else {
        jiff::Timestamp::MAX
    })
}

/// Milliseconds since the epoch of the first instant of the UTC calendar month holding `ms`.
pub fn month_start_ms(ms: i64) -> i64 {
    let utc = jiff::tz::Offset::UTC;
    let first = utc
        .to_datetime(timestamp(ms))
        .date()
        .first_of_month()
        .to_datetime(jiff::civil::Time::midnight());
    utc.to_timestamp(first).map(|t| t.as_millisecond()).unwrap_or(ms)
}

/// Milliseconds since the epoch of the UTC midnight that starts the day holding `ms`.
pub fn day_start_ms(ms: i64) -> i64 {
    ms - ms.rem_euclid(86_400_000)
}

/// Parses `YYYY-MM-DD` (UTC midnight) or an RFC 3339 time into milliseconds since the epoch
/// (the syntax is [`rules::DATE_OR_TIME_PATTERN`]).
pub fn parse_time_ms(s: &str) -> Option<i64> {
    let t = if s.len() == 10 {
        let d: jiff::civil::Date = s.parse().ok()?;
        jiff::tz::Offset::UTC
            .to_timestamp(d.to_datetime(jiff::civil::Time::midnight()))
            .ok()?
    } else {
        s.parse::<jiff::Timestamp>().ok()?
    };
    Some(t.as_millisecond())
}

/// Formats milliseconds since the Unix epoch as RFC 3339 UTC with milliseconds.
pub fn rfc3339_ms(ms: i64) -> String {
    timestamp(ms).strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
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
    fn months_and_parsing() {
        let t = parse_time_ms("2026-11-29T10:40:00.123Z").unwrap();
        assert_eq!(t, 1_795_948_800_123);
        assert_eq!(rfc3339_ms(month_start_ms(t)), "2026-11-01T00:00:00.000Z");
        assert_eq!(
            rfc3339_ms(parse_time_ms("2024-02-29").unwrap()),
            "2024-02-29T00:00:00.000Z"
        );
        assert!(parse_time_ms("2024-13-01").is_none());
        assert!(parse_time_ms("2023-02-29").is_none(), "not a leap year");
        assert!(parse_time_ms("yesterday").is_none());
        assert!(parse_time_ms("").is_none());
        assert_eq!(
            parse_time_ms("2026-11-29T11:40:00.123+01:00"),
            Some(t),
            "offsets are honoured"
        );
        assert_eq!(parse_time_ms("1970-01-01T00:00:00.000000001Z"), Some(0));
        assert_eq!(day_start_ms(t), parse_time_ms("2026-11-29").unwrap());
        assert_eq!(rfc3339_ms(month_start_ms(-1)), "1969-12-01T00:00:00.000Z");
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

    #[test]
    fn movable_is_restart_for_requeued_batch_work_and_replace_for_services_without_a_lease() {
        let w = |kind, movable, duration_s, no_requeue| -> CreateWorkload {
            let mut v: CreateWorkload = serde_json::from_value(serde_json::json!({
                "tenant": "vision", "project": "train", "name": "w", "shape": {"gpus": 1}
            }))
            .unwrap();
            v.kind = kind;
            v.movable = movable;
            v.duration_s = duration_s;
            v.no_requeue = no_requeue;
            v
        };
        use MovableMode::{Replace, Restart};
        use WorkloadKind::{Batch, Interactive, Service};
        for (kind, movable, duration, no_requeue, ok) in [
            (Batch, Some(Restart), Some(60), false, true),
            (Batch, Some(Restart), None, true, false),
            (Batch, Some(Replace), None, false, false),
            (Service, Some(Replace), None, false, true),
            (Service, Some(Replace), Some(3600), false, false),
            (Service, Some(Restart), None, false, false),
            (Interactive, Some(Restart), None, false, false),
            (Interactive, None, None, false, true),
        ] {
            let r = w(kind, movable, duration, no_requeue).validate();
            assert_eq!(r.is_ok(), ok, "{kind:?} {movable:?} {duration:?} {no_requeue}: {r:?}");
            if let Err(v) = r {
                assert_eq!(v.field, "movable");
            }
        }
        let bad = serde_json::from_value::<CreateWorkload>(serde_json::json!({
            "tenant": "vision", "project": "train", "name": "w", "shape": {"gpus": 1}, "movable": "sometimes"
        }));
        assert!(bad.is_err(), "an unknown mode is refused");
    }
}

/// A tenant's share of one resource class (a pool, or `pool/MODEL`), in GPU units.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct QuotaView {
    pub class: String,
    /// Always available to the tenant, reclaimable from borrowers.
    pub guaranteed: f64,
    /// The most it may hold, borrowing included; absent = no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<f64>,
    /// Units held now.
    pub used: f64,
    /// Units held above the guarantee.
    pub borrowed: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct BudgetView {
    pub monthly_unit_hours: f64,
    /// GPU-unit-hours used this calendar month (UTC), running work included.
    pub spent_unit_hours: f64,
    pub remaining_unit_hours: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct TenantQuotas {
    pub tenant: String,
    pub quotas: Vec<QuotaView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetView>,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SetQuota {
    /// GPU units always available to the tenant (thousandths at most).
    #[schema(schema_with = rules::schema::guaranteed)]
    pub guaranteed: f64,
    /// The most it may hold, borrowing included (at least `guaranteed`); absent = no limit.
    #[serde(default)]
    #[schema(schema_with = rules::schema::quota_limit_opt)]
    pub limit: Option<f64>,
}

impl Validate for SetQuota {
    fn validate(&self) -> Result<(), Violation> {
        rules::UNITS.check("guaranteed", self.guaranteed)?;
        if let Some(l) = self.limit {
            rules::UNITS.check("limit", l)?;
            if l < self.guaranteed {
                return Err(Violation::new(
                    "limit",
                    format!("limit {l} is below the guarantee {}", self.guaranteed),
                ));
            }
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SetBudget {
    /// GPU-unit-hours per calendar month; `null` removes the budget.
    #[schema(schema_with = rules::schema::budget_opt)]
    pub monthly_unit_hours: Option<f64>,
}

impl Validate for SetBudget {
    fn validate(&self) -> Result<(), Violation> {
        match self.monthly_unit_hours {
            Some(v) => rules::UNITS.check("monthly_unit_hours", v),
            None => Ok(()),
        }
    }
}

/// How a node is drained (`POST /api/v1/nodes/{node}/drain`), as a JSON body; the same
/// values may be given as query parameters instead.
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    /// Seconds until the drain's policy applies (default: no deadline; at most 30 days).
    #[serde(default)]
    #[schema(minimum = 0, maximum = 2_592_000)]
    pub deadline_s: Option<u64>,
    /// After the deadline, `preempt` what is left (with the grace period; batch work is
    /// requeued) or `wait` (default).
    #[serde(default)]
    #[schema(schema_with = rules::schema::drain_after_opt)]
    pub after: Option<String>,
}

impl Validate for DrainRequest {
    fn validate(&self) -> Result<(), Violation> {
        Ok(())
    }
}

/// One tenant of a declaration (`POST /api/v1/apply`, `tessera apply -f`).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DeclaredTenant {
    #[schema(schema_with = rules::schema::slug)]
    pub name: String,
    /// Shown to people (default: the name; given for a tenant that exists, left as it is).
    #[serde(default)]
    #[schema(schema_with = rules::schema::display_name_opt)]
    pub display_name: Option<String>,
    /// Projects the tenant must have (others it has are kept).
    #[serde(default)]
    #[schema(schema_with = rules::schema::declared_projects)]
    pub projects: Vec<String>,
    /// Resource class → quota: exactly the tenant's quotas (others it has are removed).
    #[serde(default)]
    #[schema(schema_with = rules::schema::declared_quotas)]
    pub quotas: BTreeMap<String, SetQuota>,
    /// GPU-unit-hours per calendar month; absent: no budget.
    #[serde(default)]
    #[schema(schema_with = rules::schema::budget_opt)]
    pub monthly_gpu_hours: Option<f64>,
    /// The tenant's image policy; absent: left as it is.
    #[serde(default)]
    pub image_policy: Option<SetImagePolicy>,
    /// The priority classes granted to the tenant; absent: left as it is (a new tenant gets
    /// the default grant, `standard` and `opportunistic`).
    #[serde(default)]
    #[schema(schema_with = rules::schema::priorities_opt)]
    pub priorities: Option<Vec<String>>,
}

/// The most tenants one declaration may name.
pub const MAX_DECLARED_TENANTS: usize = 1000;

/// What the server should hold for each tenant named: applied whole or not at all.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Declaration {
    pub tenants: Vec<DeclaredTenant>,
}

impl Validate for Declaration {
    fn validate(&self) -> Result<(), Violation> {
        let within = |at: String| move |v: Violation| Violation::new(format!("{at}.{}", v.field), v.message);
        if self.tenants.len() > MAX_DECLARED_TENANTS {
            return Err(Violation::new(
                "tenants",
                format!(
                    "{} tenants: at most {MAX_DECLARED_TENANTS} in one declaration",
                    self.tenants.len()
                ),
            ));
        }
        for (i, t) in self.tenants.iter().enumerate() {
            let at = format!("tenants[{i}]");
            rules::check_slug("name", &t.name).map_err(within(at.clone()))?;
            if let Some(j) = self.tenants[..i].iter().position(|o| o.name == t.name) {
                return Err(Violation::new(
                    format!("{at}.name"),
                    format!("tenant `{}` is declared twice (tenants[{j}] and tenants[{i}])", t.name),
                ));
            }
            if let Some(d) = &t.display_name {
                rules::DISPLAY_NAME
                    .check("display_name", d)
                    .map_err(within(at.clone()))?;
            }
            for (k, p) in t.projects.iter().enumerate() {
                rules::check_slug(&format!("projects[{k}]"), p).map_err(within(at.clone()))?;
                if let Some(j) = t.projects[..k].iter().position(|o| o == p) {
                    return Err(Violation::new(
                        format!("{at}.projects[{k}]"),
                        format!(
                            "project `{p}` of tenant `{}` is declared twice (projects[{j}] and projects[{k}])",
                            t.name
                        ),
                    ));
                }
            }
            for (class, q) in &t.quotas {
                if class.is_empty() || class.chars().count() > rules::QUOTA_CLASS_MAX {
                    return Err(Violation::new(
                        format!("{at}.quotas"),
                        "a quota class is 1–200 characters",
                    ));
                }
                q.validate().map_err(within(format!("{at}.quotas.{class}")))?;
            }
            if let Some(h) = t.monthly_gpu_hours {
                rules::UNITS.check("monthly_gpu_hours", h).map_err(within(at.clone()))?;
            }
            if let Some(p) = &t.image_policy {
                p.validate().map_err(within(format!("{at}.image_policy")))?;
            }
            if let Some(p) = &t.priorities {
                rules::check_priorities("priorities", p).map_err(within(at.clone()))?;
            }
        }
        Ok(())
    }
}

/// What a declaration changes (`+` created, `~` changed, `-` removed), and whether it was
/// applied (`false`: a dry run).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct ApplyResult {
    pub changes: Vec<String>,
    pub applied: bool,
}

/// A tenant's image policy, as set (`PUT /api/v1/tenants/{tenant}/image-policy`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SetImagePolicy {
    #[serde(default)]
    #[schema(schema_with = rules::schema::registries)]
    pub registries: Vec<String>,
    #[serde(default)]
    #[schema(schema_with = rules::schema::cosign_keys)]
    pub cosign_keys: Vec<String>,
}

impl Validate for SetImagePolicy {
    fn validate(&self) -> Result<(), Violation> {
        rules::check_list(
            "registries",
            &self.registries,
            rules::MAX_REGISTRIES,
            rules::REGISTRY_PREFIX_MAX,
        )?;
        rules::check_list(
            "cosign_keys",
            &self.cosign_keys,
            rules::MAX_COSIGN_KEYS,
            rules::COSIGN_KEY_MAX,
        )
    }
}

/// A tenant's image policy.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct ImagePolicy {
    pub tenant: String,
    /// Allowed registry/repository prefixes; empty: any registry.
    pub registries: Vec<String>,
    /// cosign public keys (PEM); empty: no signature required.
    pub cosign_keys: Vec<String>,
    /// RFC 3339 UTC.
    pub updated_at: String,
}

/// One line of a usage report.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct UsageRow {
    /// The day (`2026-11-29`), class (`serving/A100-80GB`), `tenant/project`, or tenant.
    pub key: String,
    /// GPU-unit-hours allocated.
    pub allocated_unit_hours: f64,
    /// GPU-unit-hours actually used: allocated × measured utilisation, where telemetry exists.
    pub measured_unit_hours: f64,
    pub cost_allocated: f64,
    pub cost_measured: f64,
}

/// One interval of the usage ledger with what its workload asked for: enough to rebuild the
/// demand (`tessera plan --demand usage:FILE`).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct LedgerInterval {
    pub workload: u64,
    /// Position among the workload's intervals (a requeued workload has several).
    pub seq: u32,
    pub tenant: String,
    pub project: String,
    /// Priority class.
    pub priority: String,
    /// What it asked for: `whole:N`, `mig:PROFILE` or `fraction:MILLI`.
    pub gpu: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    /// Where it ran.
    pub pool: String,
    pub model: String,
    /// GPU units held.
    pub units: f64,
    /// When the workload was submitted, RFC 3339.
    pub submitted_at: String,
    pub started_at: String,
    /// Absent while it runs.
    pub ended_at: Option<String>,
}

/// The ledger's intervals that overlap a period.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct LedgerExport {
    pub from: String,
    pub to: String,
    pub intervals: Vec<LedgerInterval>,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct UsageReport {
    pub from: String,
    pub to: String,
    /// `day`, `class`, `project` or `tenant`.
    pub by: String,
    pub currency: String,
    /// Whether the server has a price list: without one every cost reads 0 and means nothing.
    #[serde(default)]
    pub priced: bool,
    pub rows: Vec<UsageRow>,
    pub total: UsageRow,
}

/// The leader among the replicas of the control plane.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct LeaderView {
    /// The replica id of the lease holder.
    pub id: String,
    /// The URL it advertises (followers forward writes there).
    pub url: String,
    /// Grows by one at every change of leader.
    pub epoch: u64,
    /// Milliseconds until its lease expires unless renewed (by the database's clock).
    pub expires_in_ms: i64,
}

/// One replica of the control plane, as its heartbeats record it.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct ReplicaView {
    pub id: String,
    /// The URL it advertises.
    pub url: String,
    pub version: String,
    /// `leader`, `follower`, or `gone` (no heartbeat for 10 s).
    pub role: String,
    /// RFC 3339.
    pub started_at: String,
    /// Milliseconds since its last heartbeat (by the database's clock).
    pub last_seen_ms_ago: i64,
}

/// The replicas of the control plane and which one leads (`GET /api/v1/replicas`).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct ReplicasView {
    /// `postgres` (replicas elect a leader) or `sqlite` (one process, always the leader).
    pub database: String,
    /// The replica that answered.
    pub this: String,
    /// Absent while no replica holds a valid lease.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader: Option<LeaderView>,
    pub replicas: Vec<ReplicaView>,
}

/// A GPU out of placement because it failed (a critical XID, lost, or a failed partition),
/// until a platform admin clears it.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct GpuHealthView {
    pub node: String,
    pub gpu: u8,
    pub pool: String,
    pub model: String,
    /// When it was marked unhealthy (RFC 3339).
    pub since: String,
    /// The critical XID, when one caused it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xid: Option<u32>,
    pub detail: String,
    /// Workloads still on it.
    pub workloads: Vec<u64>,
}

/// Switches a GPU's MIG mode (`POST /api/v1/nodes/{node}/gpus/{gpu}/mig`, platform-admin).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetMigMode {
    /// `true`: MIG mode on (the GPU serves MIG instances); `false`: off (it serves whole GPUs).
    pub enabled: bool,
}

impl Validate for SetMigMode {
    fn validate(&self) -> Result<(), Violation> {
        Ok(())
    }
}

/// A GPU's MIG mode after an admin's change.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct GpuMigView {
    pub node: String,
    pub gpu: u8,
    /// The mode asked for.
    pub enabled: bool,
    /// The driver applies the new mode only after a GPU reset, which Tessera never performs:
    /// until then the GPU gets no placement. After the reset, send the same change again.
    pub pending: bool,
    /// What the GPU serves now: `instances`, `whole` or `nothing` (pending a reset).
    pub serves: String,
    /// `false` when the GPU was in that mode already.
    pub changed: bool,
    pub detail: String,
}

/// The longest drain deadline of a rollout's nodes, seconds (30 days).
pub const MAX_ROLLOUT_DEADLINE_S: u64 = 2_592_000;

/// Starts a rolling upgrade of every node of a pool (`POST /api/v1/rollouts`).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRollout {
    /// The pool whose nodes are upgraded.
    #[schema(min_length = 1, max_length = 63)]
    pub pool: String,
    /// Nodes out at once (default 1).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1000)]
    pub max_parallel: Option<u32>,
    /// Whole GPU units out at once (default: no limit beyond `max_parallel`); one node is
    /// always allowed, so a node larger than the limit still goes, alone.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1000000)]
    pub max_unavailable_units: Option<u32>,
    /// Per-node drain deadline, seconds (default: none; at most 30 days).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 2592000)]
    pub deadline_s: Option<u64>,
    /// After a node's drain deadline: `preempt` what is left (with the grace period; batch work
    /// is requeued) or `wait` (default). `preempt` needs a `deadline_s`.
    #[serde(default)]
    pub after: Option<RolloutAfter>,
}

/// What happens to what is left on a node at its drain deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum RolloutAfter {
    Preempt,
    Wait,
}

impl Validate for CreateRollout {
    fn validate(&self) -> Result<(), Violation> {
        if self.pool.is_empty() || self.pool.chars().count() > 63 {
            return Err(Violation::new("pool", "a pool name has 1 to 63 characters"));
        }
        if let Some(p) = self.max_parallel
            && !(1..=1000).contains(&p)
        {
            return Err(Violation::new("max_parallel", format!("{p}: between 1 and 1000 nodes")));
        }
        if let Some(u) = self.max_unavailable_units
            && !(1..=1_000_000).contains(&u)
        {
            return Err(Violation::new(
                "max_unavailable_units",
                format!("{u}: between 1 and 1000000 GPU units"),
            ));
        }
        if let Some(d) = self.deadline_s
            && !(1..=MAX_ROLLOUT_DEADLINE_S).contains(&d)
        {
            return Err(Violation::new(
                "deadline_s",
                format!("{d}: a drain deadline is 1 s to {MAX_ROLLOUT_DEADLINE_S} s (30 days)"),
            ));
        }
        if self.after == Some(RolloutAfter::Preempt) && self.deadline_s.is_none() {
            return Err(Violation::new("after", "`after: preempt` needs a `deadline_s`"));
        }
        Ok(())
    }
}

/// One node of a rolling upgrade.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct RolloutNodeView {
    pub node: String,
    /// `pending`, `draining`, `upgrading`, `validating`, `done` or `failed`.
    pub state: String,
    /// When it entered its state (RFC 3339).
    pub since: String,
    /// When the rollout took it (its drain began).
    pub started_at: Option<String>,
    /// When it was done or failed.
    pub ended_at: Option<String>,
    /// Why it is in its state.
    pub detail: String,
}

/// A rolling upgrade of one pool.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct RolloutView {
    pub id: u64,
    pub pool: String,
    /// `running`, `done`, `failed` (a node failed validation: no more nodes are taken) or
    /// `cancelled`.
    pub state: String,
    pub max_parallel: u32,
    /// GPU units out at once at most.
    pub max_unavailable_units: f64,
    pub deadline_s: Option<u64>,
    /// `preempt` or `wait`.
    pub after: String,
    /// A simulated upgrade's length (sim backend), seconds; absent: each node waits for
    /// `POST /api/v1/nodes/{node}/done`.
    pub upgrade_s: Option<u64>,
    pub created_at: String,
    pub created_by: String,
    pub ended_at: Option<String>,
    pub detail: String,
    /// Nodes done out of all, 0 to 1.
    pub progress: f64,
    /// In plan order at creation (the node whose unmovable work ends soonest first).
    pub nodes: Vec<RolloutNodeView>,
}

/// What a request would do if it were made now (`POST /api/v1/workloads/dry-run`): its cost,
/// its effect on the tenant's quotas and budget, and whether it would start, borrow, wait or be
/// refused. Computed on the published snapshot with the scheduler's quota check; nothing is
/// changed, and requests already queued ahead of it may take free capacity first.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct DryRun {
    /// `start` (within the tenant's guarantee), `borrow` (above it: reclaimable), `wait` or
    /// `refused`.
    pub outcome: String,
    /// Why it would wait or be refused: `quota`, `budget`, `no-capacity`, `fragmentation`,
    /// `isolation` or `constraint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason_code: Option<String>,
    /// The same, in a sentence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The pool it would start in (for `start` and `borrow`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// The node the scheduler's placement engine would put it on now (for `start` and
    /// `borrow`); for a multi-node gang, its node-shares by rack (`4 node-shares in r1 (4 nodes)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// GPU units the shape asks for (decimal string).
    pub units: String,
    /// GPU-unit-hours over `duration_s` (absent without a duration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit_hours: Option<f64>,
    /// Price per GPU-unit-hour where it would run (0 when no price is configured).
    pub price_per_unit_hour: f64,
    /// `unit_hours` × price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    pub currency: String,
    /// Whether the server has a price list: without one the price and cost read 0 and mean
    /// nothing (a configured price of 0 reads 0 with `priced`).
    #[serde(default)]
    pub priced: bool,
    /// The tenant's quotas the request counts against: units held now and after it.
    pub quotas: Vec<DryRunQuota>,
    /// The tenant's monthly budget, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<DryRunBudget>,
}

/// One quota a dry run counts against.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct DryRunQuota {
    /// A pool, `pool/MODEL`, or `project:NAME`.
    pub class: String,
    pub guaranteed: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<f64>,
    /// Units held now.
    pub used: f64,
    /// Units held if the request started.
    pub after: f64,
}

/// A tenant's monthly budget in a dry run, GPU-unit-hours.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct DryRunBudget {
    pub budget: f64,
    pub spent: f64,
    /// Left this month before the request.
    pub left: f64,
    /// GPU-unit-hours the tenant's running work will still use this month: each workload to
    /// its lease's end, work without one to the month's end.
    #[serde(default)]
    pub running: f64,
    /// Left after the running work and the request's `unit_hours` (absent without a
    /// duration): `left - running - unit_hours`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left_after: Option<f64>,
}
