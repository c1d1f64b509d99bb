//! Why a request cannot be placed, waits or is refused, and why running work is preempted:
//! typed values from the engine and the scheduler cycle all the way to the API, the CLI, the
//! metrics and the timelines.
//!
//! Each value renders the sentence a person reads (`Display`) and gives a stable machine code
//! ([`Unplaceable::code`], [`Wait::code`], [`Refusal::code`], [`PreemptCause::code`]) that the
//! API's problem `type`, metric labels and event codes are derived from. Code never parses a
//! sentence back.

use std::fmt;

use tessera_model::{GpuUnits, Sharing};

/// The class of a placement refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// Not enough free capacity of the kind asked for.
    NoCapacity,
    /// Enough free capacity in total, but not in one place that can hold the request.
    Fragmentation,
    /// No node in scope could ever hold it (too big, wrong model, wrong pool kind).
    Constraint,
    /// It would fit only on GPUs shared with another tenant.
    Isolation,
}

impl Class {
    pub fn as_str(self) -> &'static str {
        match self {
            Class::NoCapacity => "no-capacity",
            Class::Fragmentation => "fragmentation",
            Class::Constraint => "constraint",
            Class::Isolation => "isolation",
        }
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kind of GPU shape a request asks for (decides which request field a constraint names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShapeKind {
    Whole,
    Mig,
    Fraction,
    CpuOnly,
}

impl ShapeKind {
    /// The request field that carries this shape.
    pub fn field(self) -> Field {
        match self {
            ShapeKind::Whole => Field::Gpus,
            ShapeKind::Mig => Field::Mig,
            ShapeKind::Fraction => Field::Fraction,
            ShapeKind::CpuOnly => Field::Shape,
        }
    }
}

/// A request shape as reasons show it: its kind and its label (`8 whole GPUs`, `MIG 3g.40gb`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ShapeLabel {
    pub kind: ShapeKind,
    pub text: String,
}

impl fmt::Display for ShapeLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// The request field a constraint refusal is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Field {
    Shape,
    Gpus,
    Mig,
    Fraction,
    Pool,
    Models,
    CpuMilli,
    MemoryMib,
}

impl Field {
    /// The field's path in the API's request body.
    pub fn as_str(self) -> &'static str {
        match self {
            Field::Shape => "shape",
            Field::Gpus => "shape.gpus",
            Field::Mig => "shape.mig",
            Field::Fraction => "shape.fraction",
            Field::Pool => "shape.pool",
            Field::Models => "shape.models",
            Field::CpuMilli => "cpu_milli",
            Field::MemoryMib => "memory_mib",
        }
    }
}

/// What no node of the pools in scope offers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Missing {
    /// A MIG profile of this name.
    MigProfile(String),
    /// Any of the allowed GPU models.
    AllowedModel,
}

/// Pool names as a reason shows them, with their noun: "pool training", "pools training and
/// development".
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Pools(pub Vec<String>);

impl fmt::Display for Pools {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.len() == 1 { "pool " } else { "pools " })?;
        let last = self.0.len().saturating_sub(1);
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(if i == last { " and " } else { ", " })?;
            }
            f.write_str(p)?;
        }
        Ok(())
    }
}

/// Why the engine cannot place a request: never (the constraint variants) or not now.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Unplaceable {
    /// The shape breaks its own bounds (0 GPUs, a fraction of 1000 …).
    Invalid { field: Field, message: String },
    /// The named pool shares its GPUs in a way that cannot serve the shape.
    PoolCannotServe {
        pool: String,
        sharing: Sharing,
        shape: ShapeLabel,
    },
    /// No pool of the fleet serves the shape.
    NoPoolServes { shape: ShapeLabel },
    /// No node in the pools offers the profile or an allowed model.
    NoEligibleNode {
        pools: Pools,
        missing: Missing,
        shape: ShapeLabel,
    },
    /// More CPU than any eligible node has.
    CpuBeyondNodes {
        pools: Pools,
        requested_milli: u64,
        largest_milli: u64,
    },
    /// More host memory than any eligible node has.
    MemoryBeyondNodes {
        pools: Pools,
        requested_mib: u64,
        largest_mib: u64,
    },
    /// A gang larger than any node's NVLink domain.
    GangBeyondDomain { pools: Pools, gpus: u8, largest: u32 },
    /// The shape fits no eligible node (e.g. GPU memory beyond the board).
    ShapeBeyondNodes { pools: Pools, shape: ShapeLabel },
    /// It would fit only on GPUs time-shared with another tenant.
    Isolation { pools: Pools, shape: ShapeLabel },
    /// Enough free units in total, but not in one place.
    Fragmentation {
        pools: Pools,
        shape: ShapeLabel,
        free: GpuUnits,
        need: GpuUnits,
    },
    /// Not enough free units where the request may go.
    NoCapacity {
        pools: Pools,
        shape: ShapeLabel,
        free: GpuUnits,
        need: GpuUnits,
    },
}

impl Unplaceable {
    /// A request whose shape is out of its own bounds ([`tessera_model::Request::check`]),
    /// about the field the check names.
    pub fn invalid(e: &tessera_model::RequestError) -> Self {
        let field = match e.field {
            "gpus" => Field::Gpus,
            "fraction" => Field::Fraction,
            "mig" => Field::Mig,
            _ => Field::Shape,
        };
        Unplaceable::Invalid {
            field,
            message: e.to_string(),
        }
    }

    pub fn class(&self) -> Class {
        match self {
            Unplaceable::Isolation { .. } => Class::Isolation,
            Unplaceable::Fragmentation { .. } => Class::Fragmentation,
            Unplaceable::NoCapacity { .. } => Class::NoCapacity,
            _ => Class::Constraint,
        }
    }

    /// The stable code: the class (`constraint`, `no-capacity`, `fragmentation`, `isolation`).
    pub fn code(&self) -> &'static str {
        self.class().as_str()
    }

    /// Whether the request can never be placed on this fleet.
    pub fn is_constraint(&self) -> bool {
        self.class() == Class::Constraint
    }

    /// The request field a constraint is about.
    pub fn field(&self) -> Field {
        match self {
            Unplaceable::Invalid { field, .. } => *field,
            Unplaceable::PoolCannotServe { .. } => Field::Pool,
            Unplaceable::CpuBeyondNodes { .. } => Field::CpuMilli,
            Unplaceable::MemoryBeyondNodes { .. } => Field::MemoryMib,
            Unplaceable::GangBeyondDomain { .. } => Field::Gpus,
            Unplaceable::NoPoolServes { shape }
            | Unplaceable::NoEligibleNode { shape, .. }
            | Unplaceable::ShapeBeyondNodes { shape, .. }
            | Unplaceable::Isolation { shape, .. }
            | Unplaceable::Fragmentation { shape, .. }
            | Unplaceable::NoCapacity { shape, .. } => shape.kind.field(),
        }
    }

    /// The sentence without the class prefix.
    pub fn message(&self) -> String {
        match self {
            Unplaceable::Invalid { message, .. } => message.clone(),
            Unplaceable::PoolCannotServe { pool, sharing, shape } => {
                let hint = match sharing {
                    Sharing::Mig => "it is MIG-partitioned and serves MIG slices only: ask for a MIG profile",
                    Sharing::Whole => "it hands out whole GPUs only",
                    Sharing::Shared if shape.kind != ShapeKind::Whole => {
                        "it time-slices GPUs: ask for whole GPUs or a fraction"
                    }
                    Sharing::Shared => {
                        "it time-slices GPUs into replicas that may come from different GPUs, so it gives no whole GPU: ask for a fraction, or for whole GPUs in another pool"
                    }
                };
                format!("pool {pool} cannot serve {shape}: {hint}")
            }
            Unplaceable::NoPoolServes { shape } => format!("no pool in this fleet serves {shape}"),
            Unplaceable::NoEligibleNode { pools, missing, .. } => match missing {
                Missing::MigProfile(p) => format!("no node in {pools} offers MIG profile {p}"),
                Missing::AllowedModel => format!("no node in {pools} has an allowed GPU model"),
            },
            Unplaceable::CpuBeyondNodes {
                pools,
                requested_milli,
                largest_milli,
            } => format!(
                "{} CPUs requested; the largest node in {pools} has {}",
                milli_str(*requested_milli),
                milli_str(*largest_milli)
            ),
            Unplaceable::MemoryBeyondNodes {
                pools,
                requested_mib,
                largest_mib,
            } => format!("{requested_mib} MiB of host memory requested; the largest node in {pools} has {largest_mib}"),
            Unplaceable::GangBeyondDomain { pools, gpus, largest } => {
                format!("{gpus} whole GPUs in one gang; the largest node (NVLink domain) in {pools} has {largest}")
            }
            Unplaceable::ShapeBeyondNodes { pools, shape } => {
                format!("{shape} does not fit any node in {pools}")
            }
            Unplaceable::Isolation { pools, shape } => {
                format!(
                    "{shape} would fit only on GPUs time-shared with another tenant; {pools} {} tenants apart",
                    if pools.0.len() == 1 { "keeps" } else { "keep" }
                )
            }
            Unplaceable::Fragmentation {
                pools,
                shape,
                free,
                need,
            } => format!(
                "{} {} free in {pools}, but no single node can hold {shape} ({}) with its host resources",
                gpu_units(*free),
                if free.as_milli() == 1000 { "is" } else { "are" },
                units_word(*need)
            ),
            Unplaceable::NoCapacity {
                pools,
                shape,
                free,
                need,
            } => format!(
                "{shape} needs {}; {pools} {} {free} free where this request may go",
                gpu_units(*need),
                if pools.0.len() == 1 { "has" } else { "have" }
            ),
        }
    }

    /// Same kind of obstacle, figures aside (free units move all the time).
    pub fn same_kind(&self, other: &Unplaceable) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
            && match (self, other) {
                (Unplaceable::Fragmentation { pools: a, .. }, Unplaceable::Fragmentation { pools: b, .. })
                | (Unplaceable::NoCapacity { pools: a, .. }, Unplaceable::NoCapacity { pools: b, .. })
                | (Unplaceable::Isolation { pools: a, .. }, Unplaceable::Isolation { pools: b, .. }) => a == b,
                (a, b) => a == b,
            }
    }
}

impl fmt::Display for Unplaceable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.class(), self.message())
    }
}

impl std::error::Error for Unplaceable {}

/// Why the engine cannot place a gang beyond one node ([`crate::Engine::plan_gang`]): never
/// (the constraint variants, refused at submission) or not now ([`GangUnplaceable::NoRoomAtLevel`],
/// a wait). Every capacity is in GPUs as the gang counts them (whole node-shares, segments).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum GangUnplaceable {
    /// The gang breaks its own arithmetic (`field`: `gpus`, `gpus_per_node`, `segment`,
    /// `topology`).
    Invalid { field: &'static str, message: String },
    /// The constraint names a level the fleet does not have.
    UnknownLevel { level: String, levels: Vec<String> },
    /// `required` at a level the pool does not declare.
    PoolLacksLevel { pool: String, level: String },
    /// The named pool does not hand out whole GPUs by the node.
    PoolCannotServe { pool: String, sharing: Sharing },
    /// No whole pool in the fleet.
    NoPoolServes,
    /// No node of the pools has an allowed GPU model.
    NoEligibleNode { pools: Pools },
    /// No domain of the level could ever hold the gang, even empty: the largest holds
    /// `capacity` GPUs of it (`level` `pool`: the whole pool).
    BeyondLevel {
        pool: String,
        level: String,
        domain: String,
        gpus: u32,
        capacity: u32,
        segment: Option<u32>,
    },
    /// No domain of the level has room now: the one with the most has `free` GPUs free for it;
    /// the pool has `pool_free`.
    NoRoomAtLevel {
        pool: String,
        level: String,
        domain: String,
        gpus: u32,
        free: u32,
        pool_free: u32,
        segment: Option<u32>,
    },
}

impl GangUnplaceable {
    pub fn class(&self) -> Class {
        match self {
            GangUnplaceable::NoRoomAtLevel { gpus, pool_free, .. } if pool_free < gpus => Class::NoCapacity,
            GangUnplaceable::NoRoomAtLevel { .. } => Class::Fragmentation,
            _ => Class::Constraint,
        }
    }

    /// The stable code: the class (`constraint`, `no-capacity`, `fragmentation`).
    pub fn code(&self) -> &'static str {
        self.class().as_str()
    }

    /// Whether the gang can never be placed on this fleet.
    pub fn is_constraint(&self) -> bool {
        self.class() == Class::Constraint
    }

    /// The level a capacity reason names.
    pub fn level(&self) -> Option<&str> {
        match self {
            GangUnplaceable::BeyondLevel { level, .. }
            | GangUnplaceable::NoRoomAtLevel { level, .. }
            | GangUnplaceable::PoolLacksLevel { level, .. }
            | GangUnplaceable::UnknownLevel { level, .. } => Some(level),
            _ => None,
        }
    }

    /// The sentence without the class prefix.
    pub fn message(&self) -> String {
        let segments = |s: &Option<u32>| match s {
            Some(s) => format!(" in segments of {s} GPUs, each within one rack"),
            None => String::new(),
        };
        let within = |level: &str, domain: &str, pool: &str| {
            if level == "pool" {
                format!("pool {pool}")
            } else {
                format!("{level} {domain} of pool {pool}")
            }
        };
        match self {
            GangUnplaceable::Invalid { message, .. } => message.clone(),
            GangUnplaceable::UnknownLevel { level, levels } => {
                let known = if levels.is_empty() {
                    "the fleet declares none".to_string()
                } else {
                    format!("the fleet's are {}", levels.join(", "))
                };
                format!("no topology level {level}: {known} (and pool)")
            }
            GangUnplaceable::PoolLacksLevel { pool, level } => {
                format!("pool {pool} declares no {level}, so no gang can be required within one")
            }
            GangUnplaceable::PoolCannotServe { pool, sharing } => {
                format!("pool {pool} shares its GPUs by {sharing}; a multi-node gang needs a whole pool")
            }
            GangUnplaceable::NoPoolServes => "no whole pool in this fleet serves a multi-node gang".into(),
            GangUnplaceable::NoEligibleNode { pools } => format!("no node in {pools} has an allowed GPU model"),
            GangUnplaceable::BeyondLevel {
                pool,
                level,
                domain,
                gpus,
                capacity,
                segment,
            } => {
                let seg = segments(segment);
                if level == "pool" {
                    format!("{gpus} GPUs in one gang{seg}; pool {pool} could hold at most {capacity} of it")
                } else {
                    format!(
                        "{gpus} GPUs in one {level}{seg}; the largest {level} of pool {pool}, {domain}, could hold at most {capacity} of it"
                    )
                }
            }
            GangUnplaceable::NoRoomAtLevel {
                pool,
                level,
                domain,
                gpus,
                free,
                segment,
                ..
            } => {
                let seg = segments(segment);
                if level == "pool" {
                    format!(
                        "{gpus} GPUs in one gang{seg}; {} has room for {free} of it now",
                        within(level, domain, pool)
                    )
                } else {
                    format!(
                        "{gpus} GPUs in one {level}{seg}; no {level} of pool {pool} has room now (the most, {free}, in {})",
                        within(level, domain, pool)
                    )
                }
            }
        }
    }
}

impl fmt::Display for GangUnplaceable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.class(), self.message())
    }
}

impl std::error::Error for GangUnplaceable {}

/// GPU units with their noun: `1 GPU unit`, `0.5 GPU units`, `8 GPU units`.
pub fn gpu_units(u: GpuUnits) -> String {
    format!("{u} GPU {}", units_word_noun(u))
}

/// Units with their noun: `1 unit`, `8 units`.
pub fn units_word(u: GpuUnits) -> String {
    format!("{u} {}", units_word_noun(u))
}

fn units_word_noun(u: GpuUnits) -> &'static str {
    if u.as_milli() == 1000 { "unit" } else { "units" }
}

/// Milli-CPU as a decimal count of CPUs: `2`, `0.5`.
pub fn milli_str(m: u64) -> String {
    GpuUnits(m).to_string()
}

/// What a quota limit applies to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LimitScope {
    /// A tenant's resource class (`training`, `serving/A100-80GB`).
    Class { class: String, guaranteed: GpuUnits },
    /// A project's sub-quota within its tenant.
    Project { project: String },
}

/// A request that would take its tenant (or project) over a quota limit.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LimitExceeded {
    pub tenant: String,
    pub scope: LimitScope,
    pub held: GpuUnits,
    pub limit: GpuUnits,
    pub needs: GpuUnits,
}

impl fmt::Display for LimitExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let LimitExceeded {
            tenant,
            held,
            limit,
            needs,
            ..
        } = self;
        match &self.scope {
            LimitScope::Class { class, guaranteed } => write!(
                f,
                "tenant {tenant} holds {} in {class} (guaranteed {guaranteed}, limit {limit}); this request needs {needs}",
                gpu_units(*held)
            ),
            LimitScope::Project { project } => write!(
                f,
                "project {project} of tenant {tenant} holds {} of its limit of {limit}; this request needs {needs}",
                gpu_units(*held)
            ),
        }
    }
}

/// A tenant that has spent its monthly budget.
#[derive(Clone, Debug, PartialEq)]
pub struct BudgetExceeded {
    pub tenant: String,
    /// GPU-unit-hours spent this month.
    pub spent: f64,
    /// The monthly budget, GPU-unit-hours.
    pub budget: f64,
}

impl fmt::Display for BudgetExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tenant {} has spent {} of its {} GPU-unit-hour budget for this month",
            self.tenant,
            tessera_model::units::unit_hours(self.spent),
            tessera_model::units::unit_hours(self.budget)
        )
    }
}

/// Why running work is preempted.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PreemptCause {
    /// A request of a higher priority class needs the capacity.
    Priority { by: u64, class: String },
    /// A tenant within its guaranteed share takes it back from borrowers.
    Reclaim { by: u64, tenant: String },
}

impl PreemptCause {
    /// `priority` or `reclaim`.
    pub fn code(&self) -> &'static str {
        match self {
            PreemptCause::Priority { .. } => "priority",
            PreemptCause::Reclaim { .. } => "reclaim",
        }
    }

    /// The workload the capacity goes to.
    pub fn by(&self) -> u64 {
        match self {
            PreemptCause::Priority { by, .. } | PreemptCause::Reclaim { by, .. } => *by,
        }
    }
}

impl fmt::Display for PreemptCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PreemptCause::Priority { by, class } => {
                write!(f, "priority {class} (job {by}) preempts lower-priority work")
            }
            PreemptCause::Reclaim { by, tenant } => {
                write!(
                    f,
                    "tenant {tenant} reclaims its guaranteed share from borrowers (job {by})"
                )
            }
        }
    }
}

/// A request refused for good.
#[derive(Clone, Debug, PartialEq)]
pub enum Refusal {
    /// No node could ever hold it.
    Constraint(Unplaceable),
    /// Over a quota limit, and it asked not to wait.
    Limit(LimitExceeded),
    /// Over the monthly budget, and it asked not to wait.
    Budget(BudgetExceeded),
    /// A multi-node gang no domain of its level could ever hold.
    Gang(GangUnplaceable),
}

impl Refusal {
    /// `constraint`, `quota` or `budget`.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::Constraint(_) | Refusal::Gang(_) => "constraint",
            Refusal::Limit(_) => "quota",
            Refusal::Budget(_) => "budget",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Constraint(u) => u.fmt(f),
            Refusal::Gang(u) => u.fmt(f),
            Refusal::Limit(l) => l.fmt(f),
            Refusal::Budget(b) => b.fmt(f),
        }
    }
}

/// The time of day of `ms` since the epoch, `HH:MM:SS UTC` (a reason is read beside the time
/// it was given).
fn utc_clock(ms: i64) -> String {
    let s = ms.div_euclid(1000).rem_euclid(86_400);
    format!("{:02}:{:02}:{:02} UTC", s / 3600, s / 60 % 60, s % 60)
}

/// `ms` since the epoch as `YYYY-MM-DD HH:MM:SS UTC`: for times that may be days away (when a
/// gang is expected to start).
pub fn utc_datetime(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    // Civil date from days since 1970-01-01 (proleptic Gregorian; H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {}", utc_clock(ms))
}

/// Why a queued request waits.
#[derive(Clone, Debug, PartialEq)]
pub enum Wait {
    /// The engine has no room for it now.
    Unplaceable(Unplaceable),
    /// A multi-node gang finds no room now at its level.
    Gang(GangUnplaceable),
    /// A gang that waited past the backfill window and holds `nodes` nodes in `racks`: only
    /// work that ends before the gang starts is placed there; `now` says why it does not fit
    /// yet. It fits there at about `starts_at_ms` (ms since the epoch), once `ending` running
    /// workloads have ended by their leases; `None`: some of them have no end.
    GangHeld {
        now: Box<Wait>,
        nodes: usize,
        racks: Vec<String>,
        starts_at_ms: Option<i64>,
        ending: usize,
    },
    /// It fits, but only where capacity is held back (a reservation for a long-waiting request).
    Held,
    /// Over a quota limit.
    Limit(LimitExceeded),
    /// Over the monthly budget.
    Budget(BudgetExceeded),
    /// Preempted recently: may not borrow idle capacity again yet.
    Backoff { times: u32, retry_in_s: i64 },
    /// Victims were chosen for it and are being stopped.
    Preempting { victims: usize, cause: PreemptCause },
    /// It does not fit (`now` says why), and it will look for victims (`cause` says whose
    /// capacity it may take) at `at_ms` (ms since the epoch), `in_s` seconds after the reason
    /// was given, unless capacity frees sooner.
    PreemptsIn {
        now: Box<Wait>,
        cause: PreemptCause,
        at_ms: i64,
        in_s: i64,
    },
    /// Not looked at by the cycle: its budget of jobs (`max_jobs_per_cycle`) went to jobs ahead
    /// of it in queue order, shared between tenants. The cycle looked at `considered` jobs of
    /// `tenant`, which has `waiting` jobs left in the queue.
    NotConsidered {
        budget: usize,
        tenant: String,
        considered: usize,
        waiting: usize,
    },
}

/// The words with which a [`Wait::PreemptsIn`] says when the job will take capacity (by reclaim,
/// by priority): a reader of the stored text knows from them that the reason already says when
/// the job starts ([`takes_capacity`]).
const TAKES_CAPACITY: [&str; 2] = [
    "may take back capacity lent to other tenants",
    "may preempt lower-priority work",
];

/// Whether a waiting reason's text says when its job will take capacity from running work
/// ([`Wait::PreemptsIn`]).
pub fn takes_capacity(detail: &str) -> bool {
    TAKES_CAPACITY.iter().any(|w| detail.contains(w))
}

impl Wait {
    /// The stable code: `no-capacity`, `fragmentation`, `isolation`, `held`, `quota`, `budget`,
    /// `backoff`, `preemption` or `not-considered` (a [`Wait::PreemptsIn`] has the code of why it
    /// waits now).
    pub fn code(&self) -> &'static str {
        match self {
            Wait::PreemptsIn { now, .. } => now.code(),
            Wait::Unplaceable(u) => u.code(),
            Wait::Gang(u) => u.code(),
            Wait::GangHeld { now, .. } => now.code(),
            Wait::Held => "held",
            Wait::Limit(_) => "quota",
            Wait::Budget(_) => "budget",
            Wait::Backoff { .. } => "backoff",
            Wait::Preempting { .. } => "preemption",
            Wait::NotConsidered { .. } => "not-considered",
        }
    }

    /// Same kind of obstacle, figures aside: a new `queued` event is worth recording only when
    /// this changes. `self` is the reason last recorded, `other` the new one: a job that is
    /// told it will take capacity in some seconds ([`Wait::PreemptsIn`]) is news, one that
    /// stops being told so (it is not among the jobs searching for victims this cycle) is not.
    pub fn same_kind(&self, other: &Wait) -> bool {
        match (self, other) {
            (Wait::PreemptsIn { now: a, cause: ca, .. }, Wait::PreemptsIn { now: b, cause: cb, .. }) => {
                a.same_kind(b) && ca.code() == cb.code()
            }
            (Wait::PreemptsIn { now, .. }, b) => now.same_kind(b),
            (_, Wait::PreemptsIn { .. }) => false,
            (Wait::Unplaceable(a), Wait::Unplaceable(b)) => a.same_kind(b),
            (Wait::Gang(a), Wait::Gang(b)) => a.class() == b.class() && a.level() == b.level(),
            (Wait::GangHeld { now: a, racks: ra, .. }, Wait::GangHeld { now: b, racks: rb, .. }) => {
                ra == rb && a.same_kind(b)
            }
            (Wait::Held, Wait::Held) => true,
            (Wait::Limit(a), Wait::Limit(b)) => a.tenant == b.tenant && a.scope == b.scope,
            (Wait::Budget(a), Wait::Budget(b)) => a.tenant == b.tenant,
            (Wait::Backoff { .. }, Wait::Backoff { .. }) => true,
            (Wait::Preempting { cause: a, .. }, Wait::Preempting { cause: b, .. }) => a == b,
            (Wait::NotConsidered { .. }, Wait::NotConsidered { .. }) => true,
            _ => false,
        }
    }
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Wait::Unplaceable(u) => u.fmt(f),
            Wait::Gang(u) => u.fmt(f),
            Wait::GangHeld {
                now,
                nodes,
                racks,
                starts_at_ms,
                ending,
            } => {
                let where_ = match racks.len() {
                    0 => String::new(),
                    1 => format!(" in rack {}", racks[0]),
                    _ => format!(" in racks {}", racks.join(", ")),
                };
                let workloads = if *ending == 1 { "workload" } else { "workloads" };
                let held = if *nodes == 1 {
                    format!("a node{where_} is")
                } else {
                    format!("{nodes} nodes{where_} are")
                };
                write!(f, "{now}; {held} held for it (it waited past the backfill window): ")?;
                match starts_at_ms {
                    Some(at) if *ending == 0 => write!(f, "it starts at about {}", utc_datetime(*at))?,
                    Some(at) => write!(
                        f,
                        "it starts at about {} when {ending} {workloads} there {}",
                        utc_datetime(*at),
                        if *ending == 1 { "ends" } else { "end" }
                    )?,
                    None => write!(
                        f,
                        "its start is unknown: it waits for {ending} {workloads} there to end, and some have no end time"
                    )?,
                }
                match starts_at_ms {
                    Some(_) => f.write_str("; only work that ends by then is placed there meanwhile"),
                    None => f.write_str("; nothing else is placed there meanwhile"),
                }
            }
            Wait::Held => f.write_str("waiting for capacity within its quota"),
            Wait::Limit(l) => l.fmt(f),
            Wait::Budget(b) => b.fmt(f),
            Wait::Backoff { times, retry_in_s } => write!(
                f,
                "preempted {}; may borrow idle capacity again in {retry_in_s} s, or run at once within its guaranteed share",
                match times {
                    1 => "once".to_string(),
                    n => format!("{n} times"),
                }
            ),
            Wait::Preempting { victims, cause } => {
                let w = if *victims == 1 { "workload" } else { "workloads" };
                write!(f, "waiting for {victims} preempted {w} to stop: {cause}")
            }
            Wait::NotConsidered {
                budget,
                tenant,
                considered,
                waiting,
            } => write!(
                f,
                "not considered yet: the scheduler cycle looks at {budget} jobs at most, taken in queue order (priority class, fair share, arrival) and shared between the tenants waiting, and jobs ahead of this one took them (this cycle looked at {considered} of tenant {tenant}'s jobs; {waiting} still wait); a later cycle looks at this one once fewer jobs are ahead of it"
            ),
            Wait::PreemptsIn {
                now,
                cause,
                at_ms,
                in_s,
            } => {
                write!(f, "{now}; ")?;
                let when = format!("at {} (in {in_s} s)", utc_clock(*at_ms));
                match cause {
                    PreemptCause::Reclaim { tenant, .. } => write!(
                        f,
                        "within tenant {tenant}'s guaranteed share: {} {when} unless some frees sooner",
                        TAKES_CAPACITY[0]
                    ),
                    PreemptCause::Priority { class, .. } => write!(
                        f,
                        "priority {class}: {} {when} unless capacity frees sooner",
                        TAKES_CAPACITY[1]
                    ),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn datetimes_are_civil_utc() {
        assert_eq!(utc_datetime(0), "1970-01-01 00:00:00 UTC");
        // 2026-12-04 14:20:00 UTC, leap days on the way included.
        assert_eq!(utc_datetime(1_796_394_000_000), "2026-12-04 14:20:00 UTC");
        assert_eq!(utc_datetime(951_782_400_000), "2000-02-29 00:00:00 UTC");
    }

    use super::*;

    fn shape() -> ShapeLabel {
        ShapeLabel {
            kind: ShapeKind::Whole,
            text: "8 whole GPUs".into(),
        }
    }

    #[test]
    fn constraints_name_their_field() {
        let p = Pools(vec!["training".into()]);
        let cpu = Unplaceable::CpuBeyondNodes {
            pools: p.clone(),
            requested_milli: 500_000,
            largest_milli: 224_000,
        };
        assert_eq!(cpu.field().as_str(), "cpu_milli");
        assert_eq!(
            cpu.to_string(),
            "constraint: 500 CPUs requested; the largest node in pool training has 224"
        );
        let two = Unplaceable::GangBeyondDomain {
            pools: Pools(vec!["training".into(), "development".into()]),
            gpus: 16,
            largest: 8,
        };
        assert_eq!(
            two.to_string(),
            "constraint: 16 whole GPUs in one gang; the largest node (NVLink domain) in pools training and development has 8"
        );
        let three = Pools(vec!["a".into(), "b".into(), "c".into()]);
        assert_eq!(three.to_string(), "pools a, b and c");
        let gang = Unplaceable::GangBeyondDomain {
            pools: p.clone(),
            gpus: 9,
            largest: 8,
        };
        assert_eq!(gang.field(), Field::Gpus);
        assert!(gang.is_constraint());
        let frag = Unplaceable::Fragmentation {
            pools: p,
            shape: shape(),
            free: GpuUnits::whole(12),
            need: GpuUnits::whole(8),
        };
        assert!(!frag.is_constraint());
        assert_eq!(frag.code(), "fragmentation");
    }

    #[test]
    fn sentences_count_in_words_and_name_pools_plainly() {
        let p = Pools(vec!["training".into()]);
        let one = Unplaceable::NoCapacity {
            pools: p.clone(),
            shape: ShapeLabel {
                kind: ShapeKind::Whole,
                text: "1 whole GPU".into(),
            },
            free: GpuUnits(0),
            need: GpuUnits::whole(1),
        };
        assert_eq!(
            one.message(),
            "1 whole GPU needs 1 GPU unit; pool training has 0 free where this request may go"
        );
        let frag = Unplaceable::Fragmentation {
            pools: Pools(vec!["a".into(), "b".into()]),
            shape: shape(),
            free: GpuUnits::whole(1),
            need: GpuUnits::whole(1),
        };
        assert_eq!(
            frag.message(),
            "1 GPU unit is free in pools a and b, but no single node can hold 8 whole GPUs (1 unit) with its host resources"
        );
        let mig = Unplaceable::PoolCannotServe {
            pool: "serving".into(),
            sharing: Sharing::Mig,
            shape: shape(),
        };
        assert_eq!(
            mig.message(),
            "pool serving cannot serve 8 whole GPUs: it is MIG-partitioned and serves MIG slices only: ask for a MIG profile"
        );
        assert_eq!(
            Wait::Backoff {
                times: 1,
                retry_in_s: 30
            }
            .to_string(),
            "preempted once; may borrow idle capacity again in 30 s, or run at once within its guaranteed share"
        );
        let cause = PreemptCause::Priority {
            by: 7,
            class: "high".into(),
        };
        assert!(
            Wait::Preempting { victims: 1, cause }
                .to_string()
                .starts_with("waiting for 1 preempted workload to stop")
        );
        for w in [one.to_string(), frag.to_string(), mig.to_string()] {
            assert!(!w.contains('`'), "{w}");
        }
    }

    #[test]
    fn same_kind_ignores_figures_only() {
        let nc = |free: u64, pool: &str| {
            Wait::Unplaceable(Unplaceable::NoCapacity {
                pools: Pools(vec![pool.into()]),
                shape: shape(),
                free: GpuUnits::whole(free),
                need: GpuUnits::whole(8),
            })
        };
        assert!(nc(3, "a").same_kind(&nc(5, "a")));
        assert!(!nc(3, "a").same_kind(&nc(3, "b")));
        assert!(!nc(3, "a").same_kind(&Wait::Held));
        let limit = |held: u64| {
            Wait::Limit(LimitExceeded {
                tenant: "a".into(),
                scope: LimitScope::Class {
                    class: "training".into(),
                    guaranteed: GpuUnits::whole(8),
                },
                held: GpuUnits::whole(held),
                limit: GpuUnits::whole(10),
                needs: GpuUnits::whole(4),
            })
        };
        assert!(limit(8).same_kind(&limit(9)));
        assert_eq!(
            limit(8).to_string(),
            "tenant a holds 8 GPU units in training (guaranteed 8, limit 10); this request needs 4"
        );
        assert_eq!(limit(8).code(), "quota");
    }
}
