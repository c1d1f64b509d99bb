//! The scheduler cycle: capacity governance — quotas, budgets, priority classes, queueing with
//! fair share and backfill, reclaim and preemption — on top of the placement engine.
//!
//! The [`Scheduler`] keeps the queue, the running set and the [books](books) (quotas, budgets,
//! holdings, fair share). Each cycle opens a [session](session) over them and runs an ordered
//! list of actions, KAI-Scheduler style, each a small unit with a name and one `execute`:
//!
//! 1. [**admit**](admit) — budget and quota checks: a job over its budget, or over a limit in
//!    every pool it may use, waits or is refused (constraints are checked once, at submission);
//! 2. [**allocate**](allocate) — the queue in order (priority class, fair share, arrival, as
//!    the [queue-order plugin](plugins) says), placement, bounded backfill with node reservations;
//! 3. [**consolidate**](consolidate) — a job waiting for fragmentation gets the smallest set of
//!    moves of movable work (restartable batch work requeued, services replaced first) that
//!    frees one node for it, within a disruption budget per tenant and hour;
//! 4. [**reclaim**](reclaim) — a job within its tenant's guarantee takes capacity back from
//!    other tenants' borrowers;
//! 5. [**preempt**](preempt) — a job of a higher priority class displaces lower ones.
//!
//! A cycle looks at the head of the queue only, `max_jobs_per_cycle` jobs, shared fairly between
//! the tenants of the priority class where the budget runs out (so one tenant's flood of jobs
//! cannot keep another's out of every cycle); every job submitted since the last cycle still
//! gets a decision and a reason from it, through the admission checks alone where the cycle
//! did not look at it ([`Scheduler::cycle`]).
//!
//! Reclaim and preempt try victim sets through a [statement](statement) over the engine and rank
//! victims with the [victim-order plugin](plugins). Policies are data (priority classes, quotas)
//! or plugins; the cycle does not change when they do. Decisions come back as [`Decision`]s with
//! typed reasons. Pure and deterministic: time is passed in by the caller.
//!
//! All amounts are GPU units (whole = 1, MIG = memory-slice share, fraction = milli/1000) per
//! resource class: a pool name, or `pool/MODEL` for a GPU model within a pool.
//!
//! **Starvation bound of backfill.** A request that cannot be placed lets smaller ones go ahead
//! only while it has waited less than `backfill_max_wait_ms`; after that the first such request
//! of a pool *reserves* one node there (the one with the most free units): nothing else is
//! placed on that node until the reserving request is, so capacity freed there by finishing
//! work accumulates for it, while smaller requests keep backfilling on every other node. It
//! therefore waits at most `backfill_max_wait_ms`, plus the time the work running on the
//! reserved node needs to finish (their durations or leases), plus any time taken by requests of
//! higher priority (one reservation per pool, taken in queue order).
//!
//! A multi-node gang, or a request of whole GPUs, that has waited past the window *holds* nodes
//! instead ([`Hold`]): the gang in the rack where it will start soonest, the request the node
//! where it fits soonest, by the lease ends of the work running there
//! ([`Running::ends_at_ms`]). It knows that start, and only work that ends by it is placed on
//! those nodes meanwhile, so backfill never delays it; a gang may take victims, by reclaim or
//! preemption, there only. A pool has at most [`GovernConfig::holds_per_pool`] holds at once,
//! taken in queue order on distinct nodes, so several large requests wait for their own nodes
//! side by side rather than one after another. With [`GovernConfig::gang_holds_stack`] (part
//! of the gang rules) holds are also stacked in time: a later gang may hold nodes an earlier
//! hold has, for a window (its start plus its duration) that overlaps none of the earlier
//! windows there, so it plans on the nodes an earlier gang frees once it has run; work goes on
//! a node held twice only if it ends before the first of its holds starts.
//!
//! **Preemption bound (anti-thrash).** Reclaim only takes from *borrowers* (workloads admitted
//! above their tenant's guaranteed share) of other tenants, and only for a request that stays
//! within its own guaranteed share; a reclaimed borrower is requeued and can only come back by
//! borrowing again, which a within-guarantee request can reclaim only after the minimum
//! runtime. Priority preemption only goes downwards in rank, and `critical` is never
//! preempted. So two tenants pushing against each other's guarantees cause at most one
//! preemption per borrower admission, and a workload is preempted at most once per
//! `min_runtime_ms` of running.

mod admit;
mod allocate;
pub use allocate::{GangStart, estimate_gang_start, holder_owner};
mod books;
mod consolidate;
#[cfg(test)]
mod gangs_tests;
pub mod plugins;
mod preempt;
mod queue;
mod reclaim;
mod session;
mod statement;
#[cfg(test)]
mod testing;
mod victims;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::rc::Rc;
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use tessera_model::request::GangRequest;
use tessera_model::{Fleet, GpuUnits, NodeId, PoolId, Request, Shape};

pub use books::{Admission, Quota, check_quotas, project_key};
pub use consolidate::ConsolidationConfig;
pub use plugins::{OrderKey, Plugins, VictimCost};

use crate::engine::Engine;
use crate::reason::{PreemptCause, Refusal, Wait};
use crate::state::Allocation;
use books::Books;
use session::Session;

/// A priority class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PriorityClass {
    pub name: String,
    /// 0 is the most important.
    pub rank: u8,
    /// Whether workloads of this class may ever be preempted.
    pub preemptible: bool,
    /// A workload of this class runs at least this long before it can be preempted (default:
    /// [`GovernConfig::min_runtime_ms`]); a request may ask for longer.
    pub min_runtime_ms: Option<i64>,
    /// A request of this class preempts lower classes only after waiting this long (capacity
    /// often frees by itself sooner); `None`: at once.
    pub preempt_after_ms: Option<i64>,
}

/// The scheduler's settings.
#[derive(Clone, Debug)]
pub struct GovernConfig {
    pub classes: Vec<PriorityClass>,
    /// A workload runs at least this long before it can be preempted (unless its class or its
    /// request says longer): at most one preemption per this much running.
    pub min_runtime_ms: i64,
    /// Half-life of the usage history used for fair share.
    pub half_life_ms: i64,
    /// How long a blocked head lets smaller requests backfill before it reserves its pools.
    pub backfill_max_wait_ms: i64,
    /// At most this many reservations with a start ([`Hold`]s: multi-node gangs and requests
    /// of whole GPUs that waited past the backfill window) per pool at once, taken in queue
    /// order on distinct nodes. More serve big work sooner; each idles the capacity freed on
    /// its nodes that no work short enough to end before its start can use.
    pub holds_per_pool: usize,
    /// A multi-node gang that finds no room takes a [`Hold`] once it has waited this long;
    /// `None`: after the backfill window (`backfill_max_wait_ms`), as a request of whole GPUs.
    /// `Some(0)`: every blocked gang holds nodes at once (conservative backfill for gangs:
    /// meanwhile only work that ends before its start goes on its nodes).
    pub gang_hold_after_ms: Option<i64>,
    /// A gang's hold moves to other nodes each cycle where it would start strictly sooner
    /// there (its nodes are otherwise kept until it is placed, however work elsewhere ends),
    /// as a conservative backfill recomputes its reservations each pass; its start never
    /// moves later.
    pub gang_holds_move: bool,
    /// At most this many gangs' holds per pool at once, counted apart from the holds of
    /// single-node requests (which keep [`Self::holds_per_pool`]); `None`: gangs and
    /// single-node requests share `holds_per_pool`.
    pub gang_holds_per_pool: Option<usize>,
    /// Time-stacked holds: a multi-node gang may hold nodes already held for the jobs whose
    /// holds were taken before its own (earlier in the queue of holds), for a window that does
    /// not overlap theirs: on each such node it starts once every earlier window there has
    /// ended (the earlier holder's start plus its [`Job::duration_ms`]), or ends before the
    /// earlier one starts. So a later gang plans on the nodes an earlier gang will free once
    /// it has run, as a conservative backfill stacks its reservations in time. Work is placed on
    /// a node meanwhile only if it ends before every hold there starts; an earlier hold never
    /// waits for a later one. Off: each hold has nodes of its own.
    pub gang_holds_stack: bool,
    /// The bound on the work reclaim and preemption throw away: the victims of one search lose
    /// at most this many GPU-unit-milliseconds of work ([`Running::work_lost`]: units × time
    /// since start or last checkpoint, summed over the victims) per GPU-unit-millisecond the
    /// waiting job has waited (its units × the time since it was submitted). A victim that
    /// alone loses more is never taken; the cheapest victims are taken first. A gang's reason
    /// that says when it will take capacity names the time its victims together are within
    /// the bound (not one of them alone). `None`: no bound.
    /// E.g. `Some(1.0)`: a 16-GPU gang that waited 4 h may throw away at most 64 GPU-hours, so
    /// an 8-GPU job that ran 142 h without a checkpoint is never reclaimed for it.
    pub max_loss_per_wait: Option<f64>,
    /// A multi-node gang within its guarantee reclaims after waiting this long; `None`:
    /// [`Self::reclaim_after_ms`]. With [`Self::max_loss_per_wait`] a gang may reclaim early
    /// and still lose little: only work cheaper than its wait is taken.
    pub gang_reclaim_after_ms: Option<i64>,
    /// Places a request of whole GPUs with a requested duration ([`Job::duration_ms`]) on the
    /// node of a whole-GPU pool whose busy horizon (the latest lease end of the work running
    /// there; now when it is empty) it extends least, then in the rack with the fewest free
    /// GPUs, then on the node with the fewest free GPUs, instead of where the placement policy
    /// says: work that ends together shares nodes, so whole nodes and racks free up together
    /// for gangs, and small work stays off empty nodes while it fits elsewhere. Off: the
    /// placement policy decides alone.
    pub place_by_end: bool,
    /// At most this many jobs search for victims per cycle (reclaim and preemption together).
    pub max_preemption_searches: usize,
    /// A request within its guarantee reclaims from borrowers only after waiting this long
    /// (capacity often frees by itself sooner; reclaiming at once would churn).
    pub reclaim_after_ms: i64,
    pub consolidation: ConsolidationConfig,
    /// A cycle considers at most this many jobs from the head of the queue (in queue order,
    /// shared fairly between tenants within a priority class: see [`queue`](self::queue)); the
    /// rest wait for a later cycle, in the same order. Bounds a cycle's work on a deep queue.
    /// A job submitted since the last cycle gets a decision from it all the same, with a
    /// reason that says what is true ([`Scheduler::cycle`]).
    pub max_jobs_per_cycle: usize,
}

impl GovernConfig {
    /// These settings with the rules for multi-node gangs the Philly replay's `engine` row
    /// measures (`philly/engine.rs`), for fleets whose work is submitted with durations
    /// (estimates or limits): every blocked gang holds nodes at once, any number per pool,
    /// stacked in time behind the holds taken before it ([`Self::gang_holds_stack`]), and
    /// moves its hold where it would start sooner (conservative backfill for gangs); reclaim
    /// and preemption throw away at most 10 % of the GPU-time the waiting job waits
    /// ([`Self::max_loss_per_wait`]); whole-GPU work with a duration goes on the node whose busy
    /// horizon it extends least ([`Self::place_by_end`]). The queue order that goes with them,
    /// gangs first across tenants, is the [`plugins::GangsFirst`] plugin
    /// ([`gang_rules_order`]). Where much work comes without a duration it cannot backfill
    /// held nodes: in `tessera sim scenario` these rules cut the training pool's placements,
    /// which is why they are not the default.
    pub fn with_gang_rules(self) -> Self {
        GovernConfig {
            gang_hold_after_ms: Some(0),
            gang_holds_per_pool: Some(usize::MAX),
            gang_holds_move: true,
            gang_holds_stack: true,
            max_loss_per_wait: Some(0.1),
            place_by_end: true,
            ..self
        }
    }
}

/// The queue order of [`GovernConfig::with_gang_rules`]: within a priority class, every
/// multi-node gang before single-node work, whatever the tenants' fair shares (gangs among
/// themselves by fair share, then arrival), and single-node work by fair share, then arrival
/// plus a quarter of its duration. A gang needs whole nodes of one rack free at once: placed or
/// holding before the single-node work of the same cycle, it takes those nodes (or keeps them
/// from work that would end after its start) before that work, which fits on partly busy nodes
/// too, spreads over them. Only the share of whole free nodes moves between tenants: each
/// tenant's guarantee is kept by reclaim as before.
pub fn gang_rules_order() -> plugins::GangsFirst {
    plugins::GangsFirst {
        estimate_weight: 0.25,
        across_tenants: true,
    }
}

impl Default for GovernConfig {
    fn default() -> Self {
        GovernConfig {
            classes: vec![
                PriorityClass {
                    name: "critical".into(),
                    rank: 0,
                    preemptible: false,
                    min_runtime_ms: None,
                    preempt_after_ms: None,
                },
                PriorityClass {
                    name: "high".into(),
                    rank: 1,
                    preemptible: true,
                    min_runtime_ms: None,
                    preempt_after_ms: None,
                },
                PriorityClass {
                    name: "standard".into(),
                    rank: 2,
                    preemptible: true,
                    min_runtime_ms: None,
                    preempt_after_ms: None,
                },
                PriorityClass {
                    name: "opportunistic".into(),
                    rank: 3,
                    preemptible: true,
                    min_runtime_ms: None,
                    preempt_after_ms: None,
                },
            ],
            min_runtime_ms: 60_000,
            half_life_ms: 3_600_000,
            backfill_max_wait_ms: 300_000,
            holds_per_pool: 1,
            gang_hold_after_ms: None,
            gang_holds_per_pool: None,
            gang_holds_move: false,
            gang_holds_stack: false,
            max_loss_per_wait: None,
            gang_reclaim_after_ms: None,
            place_by_end: false,
            max_preemption_searches: 8,
            reclaim_after_ms: 300_000,
            consolidation: ConsolidationConfig::default(),
            max_jobs_per_cycle: 1_000,
        }
    }
}

/// A request as the scheduler sees it.
#[derive(Clone, Debug)]
pub struct Job {
    pub id: u64,
    pub tenant: String,
    pub project: String,
    pub request: Request,
    pub priority: String,
    pub submitted_ms: i64,
    /// Beyond the tenant's limit or budget: wait (true) or be refused (false).
    pub wait_if_over_limit: bool,
    /// Runs at least this long before it can be preempted, if longer than its class's minimum.
    pub min_runtime_ms: Option<i64>,
    /// Whether and how consolidation may move it once it runs (`None`: never).
    pub movable: Option<Movable>,
    /// A gang beyond one node: placed all or nothing as node-shares by
    /// [`Engine::place_gang`] instead of `request` (which is then not read), never moved by
    /// consolidation.
    pub gang: Option<GangRequest>,
    /// How long it asked to run (its lease), in milliseconds; `None`: no limit. A waiting
    /// gang's reservation starts when enough of the work on its nodes has ended by these, and
    /// only work that ends before then is placed on its nodes meanwhile.
    pub duration_ms: Option<i64>,
}

/// Whole GPUs asked for: a gang's total, else the request's whole GPUs (0 for a fraction or a
/// MIG slice).
pub fn whole_gpus(gang: Option<&GangRequest>, request: &Request) -> u32 {
    match (gang, &request.shape) {
        (Some(g), _) => g.gpus,
        (None, Shape::Whole { gpus }) => u32::from(*gpus),
        _ => 0,
    }
}

impl Job {
    /// Whole GPUs asked for ([`whole_gpus`]).
    pub fn whole_gpus(&self) -> u32 {
        whole_gpus(self.gang.as_ref(), &self.request)
    }

    /// Job `id` of `tenant`/`project` asking for `request` at `priority`, submitted at
    /// `submitted_ms`, with nothing more: it waits when over its limit, has no minimum runtime
    /// of its own, is never moved, no gang, no end known. The others are set with struct update
    /// syntax.
    pub fn new(id: u64, tenant: &str, project: &str, request: Request, priority: &str, submitted_ms: i64) -> Job {
        Job {
            id,
            tenant: tenant.into(),
            project: project.into(),
            request,
            priority: priority.into(),
            submitted_ms,
            wait_if_over_limit: true,
            min_runtime_ms: None,
            movable: None,
            gang: None,
            duration_ms: None,
        }
    }
}

/// How a running workload may be moved to defragment its pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Movable {
    /// Restartable batch work: stopped and requeued (it restarts from its last checkpoint).
    Restart,
    /// A service: a replacement starts elsewhere first, then the original stops.
    Replace,
}

/// What the scheduler decided for a job or a running workload.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// The job got an allocation. `borrowing`: admitted above the tenant's guaranteed share
    /// (preemptible by reclaim).
    Placed {
        id: u64,
        alloc: Allocation,
        borrowing: bool,
    },
    /// A gang got its node-shares (allocations `share_id(id, i)`, in gang order), all at once.
    PlacedGang {
        id: u64,
        shares: Vec<Allocation>,
        borrowing: bool,
    },
    /// The job waits; the kind of reason changed ([`Wait::same_kind`]).
    Waiting { id: u64, reason: Wait },
    /// The job is refused for good.
    Refused { id: u64, reason: Refusal },
    /// Stop `victim` (grace period, then force) so that `by` can run.
    Preempt { victim: u64, by: u64, cause: PreemptCause },
    /// Consolidation moves `id` so that `by` can run. `to: None`: restartable batch work, stop
    /// it and requeue it (it is not a preemption: it is requeued as it was). `to: Some`: a
    /// service; its replacement is booked there: start it, then stop the original and call
    /// [`Scheduler::replaced`] (or [`Scheduler::move_failed`]).
    Move { id: u64, by: u64, to: Option<Allocation> },
}

/// A workload holding capacity.
#[derive(Clone, Debug)]
pub struct Running {
    pub id: u64,
    pub tenant: String,
    pub rank: u8,
    pub preemptible: bool,
    pub borrowing: bool,
    pub running_since_ms: i64,
    pub units: GpuUnits,
    pub keys: Vec<String>,
    /// Being stopped (for a preemption or a cancel): not a candidate again.
    pub stopping: bool,
    /// Not preempted before it has run this long (the longest of the scheduler's, its
    /// class's and its request's minimum runtimes).
    pub min_runtime_ms: i64,
    /// When its work was last saved ([`Scheduler::checkpointed`]): preempting it loses the work
    /// since then, or since it started.
    pub checkpoint_ms: Option<i64>,
    pub movable: Option<Movable>,
    /// What it asked for (consolidation places it elsewhere with it).
    pub request: Request,
    /// The node it runs on (a gang's first node-share).
    pub node: NodeId,
    /// A gang's other nodes, in gang order (empty on one node).
    pub gang_nodes: Vec<NodeId>,
    /// When its lease ends: its start plus its requested duration ([`Job::duration_ms`]);
    /// `None`: no limit.
    pub ends_at_ms: Option<i64>,
}

impl Running {
    /// Every node it holds capacity on.
    pub fn nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        std::iter::once(self.node).chain(self.gang_nodes.iter().copied())
    }
}

impl Running {
    /// The work preempting it at `now` loses: GPU units × milliseconds since it started or last
    /// saved its work, in milli-unit-milliseconds.
    pub fn work_lost(&self, now: i64) -> u64 {
        let since = self
            .checkpoint_ms
            .map_or(self.running_since_ms, |c| c.max(self.running_since_ms));
        (now - since).max(0) as u64 * self.units.as_milli()
    }
}

/// One step of a cycle: a name and one pass over the session.
trait Action: Send {
    fn name(&self) -> &'static str;
    fn execute(&self, session: &mut Session<'_>);
}

/// The actions a cycle runs, in order.
fn default_actions() -> Vec<Box<dyn Action>> {
    vec![
        Box::new(admit::Admit),
        Box::new(allocate::Allocate),
        Box::new(consolidate::Consolidate),
        Box::new(reclaim::Reclaim),
        Box::new(preempt::Preempt),
    ]
}

/// A waiting job and what every cycle needs to know about it, computed once.
struct Queued {
    job: Job,
    /// What decides whether it finds capacity ([`capacity_key`]).
    key: Request,
    /// The pools it may go to, in the engine's order (an engine's fleet never changes).
    scope: Vec<PoolId>,
    /// The quota key of its project.
    project_key: String,
    /// The GPU units it asks for.
    units: GpuUnits,
    /// Its arrival sequence number.
    seq: u64,
    /// Its tenant's number in the queue ([`WaitQueue::tenant_no`](queue::WaitQueue::tenant_no)).
    tenant: usize,
    /// Its priority class's rank.
    rank: u8,
    /// Its queue-order key at a zero fair share (its place among its tenant's jobs of its class).
    base_key: OrderKey,
}

/// The capacity key of every gang: no request asks for zero whole GPUs, so no single-node
/// request shares it. Gangs never use the caches keyed by it (each gang is planned afresh);
/// it only buckets them in the queue.
fn gang_key() -> Request {
    Request::new(Shape::Whole { gpus: 0 })
}

/// What decides whether a request finds capacity: everything but the tenant, which matters
/// only for fractions (time-shared GPUs keep tenants apart).
fn capacity_key(r: &Request) -> Request {
    let mut k = r.clone();
    if !matches!(k.shape, tessera_model::Shape::Fraction { .. }) {
        k.tenant = None;
    }
    k
}

/// The resource-class keys of capacity on `node`: its pool and `pool/MODEL`.
pub fn class_keys(fleet: &Fleet, node: NodeId) -> Vec<String> {
    let node = fleet.node(node);
    let pool = &fleet.pool(node.pool).name;
    vec![pool.clone(), format!("{pool}/{}", fleet.catalogue.get(node.model).name)]
}

/// The reservations a new gang's hold is planned around, copied out of the scheduler
/// ([`Scheduler::hold_book`]) so that a dry run, which holds no scheduler, answers with the
/// start and place the gang would be given once submitted
/// ([`HoldBook::gang_start`](Self::gang_start)): the holds in the order they were taken, the
/// nodes reserved or nominated for other jobs, when each running workload ends, and the
/// settings that decide how holds share nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HoldBook {
    holds: Vec<Hold>,
    /// Nodes reserved for a single-node head or nominated for a preemptor.
    others: Vec<u32>,
    /// When each running workload's lease ends (`None`: no end; `Some(i64::MIN)`: being
    /// stopped, so at once).
    ends: FxHashMap<u64, Option<i64>>,
    /// [`GovernConfig::gang_holds_stack`].
    stack: bool,
    /// [`GovernConfig::holds_per_pool`] and [`GovernConfig::gang_holds_per_pool`].
    limits: (usize, Option<usize>),
}

impl HoldBook {
    /// How many holds it has.
    pub fn holds(&self) -> usize {
        self.holds.len()
    }
}

/// A preemptor waiting for its victims to stop. The victims' nodes are held for it (nothing
/// else is placed there, and no other search takes victims there) until it is placed or gives
/// up, so capacity freed by its first victims is not taken by others before the last has
/// stopped (KAI-Scheduler's pipelining).
#[derive(Clone, Debug, Default)]
struct Nomination {
    victims: HashSet<u64>,
    nodes: HashSet<u32>,
}

/// A reservation with a start: the nodes held for a multi-node gang, or the node held for a
/// request of whole GPUs, that waited past the backfill window, and when it fits there by the
/// ends of the work running on them. Work is placed on these nodes meanwhile only if it ends by
/// then ([`Job::duration_ms`]), so it never delays the holder.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Hold {
    job: u64,
    pool: PoolId,
    nodes: Vec<u32>,
    /// GPUs the gang needs free on each held node.
    per_node: u32,
    /// GPUs it needs on its last held node: a gang's remainder share (12 = 8 + 4: 4), else
    /// `per_node`.
    last: u32,
    /// When it fits on `nodes` (never before the time it was computed at), the work there
    /// ending by the lease ends of the running work ([`Running::ends_at_ms`]); `None`: some
    /// of the work it waits for has no end.
    starts_at_ms: Option<i64>,
    /// How many running workloads must end for it to fit.
    ending: usize,
    /// A multi-node gang's (counted against [`GovernConfig::gang_holds_per_pool`]).
    gang: bool,
    /// How long the holder runs once placed ([`Job::duration_ms`]; `None`: no limit): with
    /// [`GovernConfig::gang_holds_stack`] its nodes are taken from its start for this long.
    duration_ms: Option<i64>,
}

impl Hold {
    /// Whether work of `duration_ms` placed at `now` ends by the gang's start.
    fn ends_before(&self, duration_ms: Option<i64>, now: i64) -> bool {
        match (self.starts_at_ms, duration_ms) {
            (Some(start), Some(d)) => d >= 0 && now.saturating_add(d) <= start,
            _ => false,
        }
    }

    /// When its nodes are taken, as a window `(start, end)` for the holds stacked after it
    /// ([`GovernConfig::gang_holds_stack`]): from its start for its duration; from `now` on
    /// without end when its start or its duration is not known.
    fn window(&self, now: i64) -> (i64, i64) {
        match (self.starts_at_ms, self.duration_ms) {
            (Some(t), Some(d)) => (t, t.saturating_add(d.max(0))),
            (Some(t), None) => (t, i64::MAX),
            (None, _) => (now, i64::MAX),
        }
    }
}

/// The scheduler: queue, books, running set and the engine.
pub struct Scheduler {
    pub engine: Engine,
    pub cfg: GovernConfig,
    books: Books,
    plugins: Plugins,
    actions: Vec<Box<dyn Action>>,
    queue: queue::WaitQueue,
    running: FxHashMap<u64, Running>,
    /// How many running workloads are movable (consolidation has nothing to move without one).
    movable_running: usize,
    /// The preemptible running workloads by node, for the victim searches.
    victim_index: victims::VictimIndex,
    /// Preemptors waiting for their victims to stop: job → victims and the nodes held for it.
    nominated: BTreeMap<u64, Nomination>,
    /// Why each waiting job waits, as last recorded.
    reasons: FxHashMap<u64, Wait>,
    /// Per pool, the head that waited past the backfill window and the node held for it.
    reservations: HashMap<PoolId, (u64, u32)>,
    /// The gangs and requests of whole GPUs that waited past the backfill window, the nodes
    /// held for each and when it will start there, in the order they were taken (at most
    /// [`GovernConfig::holds_per_pool`] per pool; see the starvation bound in the module doc).
    holds: Vec<Hold>,
    /// Workloads preempted so far: how often and when last.
    preempted: FxHashMap<u64, (u32, i64)>,
    /// For gangs holding no nodes yet, when each would take capacity by each victim rule
    /// ([`victims`]: keyed by job and the rule's cause code), and when that was forecast; kept
    /// for the jobs a pass looked at.
    forecasts: FxHashMap<(u64, &'static str), (i64, Option<i64>)>,
    /// Capacity or quotas changed since the last full pass over the queue.
    dirty: bool,
    /// Per tenant, when its work was moved by consolidation (the disruption budget).
    disruptions: HashMap<String, std::collections::VecDeque<i64>>,
    /// Services being moved: their replacement is booked under `REPLACEMENT | id`.
    replacing: FxHashSet<u64>,
    /// Per capacity key, the pools where it last found no room, with the pool's
    /// [freed generation](Engine::freed_generation) then (see allocate).
    unfit: FxHashMap<Request, Vec<(PoolId, u64)>>,
    /// Per capacity key, the engine's last diagnosis of why it found no room.
    explained: FxHashMap<Request, Wait>,
    /// Submitted jobs not decided yet: the next cycle gives each a decision, whether it looks
    /// at them or not ([`Scheduler::cycle`]).
    fresh: FxHashSet<u64>,
}

impl fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scheduler")
            .field("actions", &self.actions.iter().map(|a| a.name()).collect::<Vec<_>>())
            .field("queued", &self.queue.len())
            .field("running", &self.running.len())
            .finish()
    }
}

impl Scheduler {
    pub fn new(engine: Engine, cfg: GovernConfig) -> Self {
        Scheduler {
            engine,
            cfg,
            books: Books::default(),
            plugins: Plugins::default(),
            actions: default_actions(),
            queue: queue::WaitQueue::default(),
            running: FxHashMap::default(),
            movable_running: 0,
            victim_index: victims::VictimIndex::default(),
            nominated: BTreeMap::new(),
            reasons: FxHashMap::default(),
            reservations: HashMap::new(),
            holds: Vec::new(),
            preempted: FxHashMap::default(),
            forecasts: FxHashMap::default(),
            dirty: true,
            disruptions: HashMap::new(),
            replacing: FxHashSet::default(),
            unfit: FxHashMap::default(),
            explained: FxHashMap::default(),
            fresh: FxHashSet::default(),
        }
    }

    /// The same scheduler with other queue-order or victim-order policies.
    pub fn with_plugins(mut self, plugins: Plugins) -> Self {
        self.plugins = plugins;
        for q in self.queue.drain() {
            let job = Arc::try_unwrap(q).map_or_else(|q| q.job.clone(), |q| q.job);
            self.enqueue(job);
        }
        self.dirty = true;
        self
    }

    /// A job as the queue keeps it.
    fn queued_job(&mut self, job: Job) -> Arc<Queued> {
        let rank = self.rank(&job.priority);
        let (key, scope, units) = match &job.gang {
            Some(g) => (gang_key(), self.engine.gang_pools(g), g.units()),
            None => (
                capacity_key(&job.request),
                self.engine.scope(&job.request).unwrap_or_default(),
                job.request.units(&self.engine.fleet().catalogue),
            ),
        };
        Arc::new(Queued {
            key,
            scope,
            project_key: project_key(&job.project),
            units,
            seq: self.queue.next_seq(),
            tenant: self.queue.tenant_no(&job.tenant),
            rank,
            base_key: self.plugins.queue_order.key(&job, rank, 0.0),
            job,
        })
    }

    pub fn class(&self, name: &str) -> Option<&PriorityClass> {
        self.cfg.classes.iter().find(|c| c.name == name)
    }

    fn rank(&self, name: &str) -> u8 {
        self.class(name).map(|c| c.rank).unwrap_or(u8::MAX / 2)
    }

    /// Sets (or with `None` removes) a tenant's quota for a resource class.
    pub fn set_quota(&mut self, tenant: &str, class: &str, q: Option<Quota>) {
        self.books.set_quota(tenant, class, q);
        self.dirty = true;
    }

    pub fn quota(&self, tenant: &str, class: &str) -> Option<Quota> {
        self.books.quota(tenant, class)
    }

    /// Every quota of a tenant.
    pub fn quotas_of(&self, tenant: &str) -> Vec<(String, Quota)> {
        self.books.quotas_of(tenant)
    }

    /// Every quota: (tenant, resource class, quota), in no particular order.
    pub fn all_quotas(&self) -> impl Iterator<Item = (&String, &String, Quota)> {
        self.books.all_quotas()
    }

    /// Every budget: (tenant, GPU-unit-hours per month), in no particular order.
    pub fn all_budgets(&self) -> impl Iterator<Item = (&String, f64)> {
        self.books.all_budgets()
    }

    /// Sets a tenant's monthly budget in GPU-unit-hours (`None` = unlimited).
    pub fn set_budget(&mut self, tenant: &str, unit_hours: Option<f64>) {
        self.books.set_budget(tenant, unit_hours);
        self.dirty = true;
    }

    pub fn budget(&self, tenant: &str) -> Option<f64> {
        self.books.budget(tenant)
    }

    /// What the tenant has spent this month (GPU-unit-hours), as the ledger says.
    pub fn set_spent(&mut self, tenant: &str, unit_hours: f64) {
        self.books.set_spent(tenant, unit_hours);
    }

    pub fn spent(&self, tenant: &str) -> f64 {
        self.books.spent(tenant)
    }

    /// Units a tenant holds in a class.
    pub fn held(&self, tenant: &str, class: &str) -> GpuUnits {
        self.books.held(tenant, class)
    }

    /// Fair-share key: decayed usage relative to the guaranteed share (lower goes first).
    pub fn fair_share(&self, tenant: &str) -> f64 {
        self.books.fair_share(tenant)
    }

    /// A job's queue position (lower goes first), as the queue-order plugin computes it.
    pub fn order_key(&self, j: &Job) -> OrderKey {
        self.plugins
            .queue_order
            .key(j, self.rank(&j.priority), self.fair_share(&j.tenant))
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// The waiting jobs, in arrival order.
    pub fn queue(&self) -> impl Iterator<Item = &Job> {
        self.queue.in_arrival_order().map(|q| &q.job)
    }

    pub fn running(&self) -> impl Iterator<Item = &Running> {
        self.running.values()
    }

    pub fn is_borrowing(&self, id: u64) -> Option<bool> {
        self.running.get(&id).map(|r| r.borrowing)
    }

    /// Checks a new job: refused at once if no node could ever hold it, otherwise queued and,
    /// if capacity has not changed since the last cycle, tried on its own.
    pub fn submit(&mut self, job: Job, now: i64) -> Vec<Decision> {
        if let Some(reason) = self.refusal_at_submission(&job) {
            return vec![Decision::Refused { id: job.id, reason }];
        }
        let id = job.id;
        let q = self.queued_job(job);
        self.queue.push(q);
        self.fresh.insert(id);
        // Unchanged capacity: only the newcomer can be placed now.
        let only = if self.dirty { None } else { Some(id) };
        self.run(now, only)
    }

    /// Checks a new job like [`Self::submit`] but leaves the decision to the next cycle: a
    /// refusal if no node could ever hold it, otherwise it is queued. Callers that run cycles
    /// themselves use it while capacity is changing ([`Self::needs_cycle`]), so that a burst of
    /// submissions costs one pass over the queue, not one pass each.
    pub fn submit_for_next_cycle(&mut self, job: Job) -> Option<Refusal> {
        if let Some(reason) = self.refusal_at_submission(&job) {
            return Some(reason);
        }
        self.fresh.insert(job.id);
        let q = self.queued_job(job);
        self.queue.push(q);
        self.dirty = true;
        None
    }

    /// Why no node (or, for a gang, no domain of its level) could ever hold `job`, if so; a
    /// single-node request the engine may hold is noted for its shape indexes.
    fn refusal_at_submission(&mut self, job: &Job) -> Option<Refusal> {
        if let Some(g) = &job.gang {
            return self.engine.gang_constraint(g).map(Refusal::Gang);
        }
        if let Some(u) = admit::constraint(&mut self.engine, &job.request) {
            return Some(Refusal::Constraint(u));
        }
        self.engine.observe(&job.request);
        None
    }

    /// Restores a gang that already holds its node-shares (start-up): all or none.
    pub fn restore_gang(
        &mut self,
        job: &Job,
        pool: PoolId,
        shares: Vec<Allocation>,
        borrowing: bool,
        running_since_ms: i64,
    ) -> Result<(), String> {
        let Some(first) = shares.first() else {
            return Err(format!("gang {} has no node-share", job.id));
        };
        let mut keys = class_keys(self.engine.fleet(), first.node);
        keys.push(project_key(&job.project));
        let gang = self.engine.restore_gang(job.id, pool, shares).map_err(|e| e.0)?;
        let units = gang.units;
        let nodes = self.gang_nodes(job.id);
        self.hold_on(job, keys, units, nodes, borrowing, running_since_ms);
        Ok(())
    }

    /// The nodes of committed gang `id`, in gang order.
    fn gang_nodes(&self, id: u64) -> Vec<NodeId> {
        self.engine.gang(id).map_or_else(Vec::new, |g| {
            g.shares
                .iter()
                .filter_map(|s| self.engine.allocation(*s).map(|a| a.node))
                .collect()
        })
    }

    /// Restores a workload that already holds an allocation (start-up).
    pub fn restore(
        &mut self,
        job: &Job,
        alloc: Allocation,
        borrowing: bool,
        running_since_ms: i64,
    ) -> Result<(), String> {
        let mut keys = class_keys(self.engine.fleet(), alloc.node);
        keys.push(project_key(&job.project));
        let units = alloc.units;
        let node = alloc.node;
        self.engine.restore(alloc).map_err(|e| e.0)?;
        self.hold(job, keys, units, node, borrowing, running_since_ms);
        Ok(())
    }

    /// Puts a job back in the queue (start-up, or a preempted batch job being requeued).
    pub fn enqueue(&mut self, job: Job) {
        let q = self.queued_job(job);
        self.queue.push(q);
        self.dirty = true;
    }

    /// Puts back in the queue a job no cycle has decided yet (recorded as accepted before a
    /// crash, found at start-up): the next cycle gives it a decision, as to a new submission.
    pub fn enqueue_undecided(&mut self, job: Job) {
        self.fresh.insert(job.id);
        self.enqueue(job);
    }

    /// Records that a running workload saved its work at `at_ms` (a checkpoint): preempting it
    /// later loses only what it did since.
    pub fn checkpointed(&mut self, id: u64, at_ms: i64) {
        if let Some(r) = self.running.get_mut(&id) {
            r.checkpoint_ms = Some(at_ms);
        }
    }

    /// Marks a running workload as being stopped (cancel or preemption in progress).
    pub fn stopping(&mut self, id: u64) {
        if let Some(r) = self.running.get_mut(&id) {
            r.stopping = true;
            self.victim_index.set_stopping(r);
        }
    }

    /// Removes a queued job (cancelled before placement).
    pub fn dequeue(&mut self, id: u64) -> bool {
        let removed = self.queue.remove(id).is_some();
        self.fresh.remove(&id);
        self.reasons.remove(&id);
        self.nominated.remove(&id);
        self.preempted.remove(&id);
        removed
    }

    /// A moved service's replacement runs and the original has stopped: the replacement's
    /// booking becomes the workload's allocation (returned), and the capacity it left goes to
    /// the job it was moved for.
    pub fn replaced(&mut self, id: u64) -> Option<Allocation> {
        if !self.replacing.remove(&id) {
            return None;
        }
        let mut a = self.engine.release(consolidate::REPLACEMENT | id)?;
        self.engine.release(id);
        a.id = id;
        // Same pool and GPU model (see consolidate): the same units and quota keys.
        let a = self
            .engine
            .restore(a)
            .expect("the replacement's booking fits back")
            .clone();
        if let Some(r) = self.running.get_mut(&id) {
            self.victim_index.remove(r);
            r.stopping = false;
            r.node = a.node;
            self.victim_index.add(r);
        }
        for n in self.nominated.values_mut() {
            n.victims.remove(&id);
        }
        self.dirty = true;
        Some(a)
    }

    /// A moved service's replacement runs as a workload of its own, `job` (a caller that
    /// starts a new workload with the same request rather than moving the original): the
    /// booking made for the replacement becomes `job`'s allocation, held as running since
    /// `now` and borrowing as the original did (returned with the allocation). The original
    /// keeps its capacity, stopping, and stays awaited by the job it makes room for until it
    /// is released. `None` if no replacement of `id` is booked.
    pub fn adopt_replacement(&mut self, id: u64, job: &Job, now: i64) -> Option<(Allocation, bool)> {
        if !self.replacing.remove(&id) {
            return None;
        }
        let mut a = self.engine.release(consolidate::REPLACEMENT | id)?;
        a.id = job.id;
        let borrowing = self.running.get(&id).is_some_and(|r| r.borrowing);
        let mut keys = class_keys(self.engine.fleet(), a.node);
        keys.push(project_key(&job.project));
        let units = a.units;
        // Same capacity just released: it fits back.
        let a = self.engine.restore(a).ok()?.clone();
        self.hold(job, keys, units, a.node, borrowing, now);
        self.dirty = true;
        Some((a, borrowing))
    }

    /// A consolidation move of `id` will not happen (a replacement that could not start, or a
    /// caller that does not move work): a replacement's booking is released, the workload
    /// stays where it is and is no longer awaited by the job it was to make room for (which
    /// then searches again).
    pub fn move_failed(&mut self, id: u64) {
        if self.replacing.remove(&id) {
            self.engine.release(consolidate::REPLACEMENT | id);
        }
        if let Some(r) = self.running.get_mut(&id) {
            r.stopping = false;
            self.victim_index.set_stopping(r);
        }
        for n in self.nominated.values_mut() {
            n.victims.remove(&id);
        }
        self.dirty = true;
    }

    /// Returns a workload's capacity.
    pub fn release(&mut self, id: u64, now: i64) -> Option<Allocation> {
        if self.replacing.remove(&id) {
            self.engine.release(consolidate::REPLACEMENT | id);
        }
        let a = match self.engine.gang(id) {
            // A gang: every share goes back; the first stands for it.
            Some(_) => {
                let first = self.engine.gang(id).and_then(|g| g.shares.first().copied());
                let first = first.and_then(|s| self.engine.allocation(s).cloned());
                self.engine.release_gang(id);
                first?
            }
            None => self.engine.release(id)?,
        };
        if let Some(r) = self.running.remove(&id) {
            if r.movable.is_some() {
                self.movable_running -= 1;
            }
            self.victim_index.remove(&r);
            self.books
                .account(&r.tenant, &r.keys, r.units, false, now, self.cfg.half_life_ms);
        }
        for n in self.nominated.values_mut() {
            n.victims.remove(&id);
        }
        self.dirty = true;
        Some(a)
    }

    /// One scheduling cycle over the whole queue: the actions run over at most
    /// `max_jobs_per_cycle` jobs of its head (shared fairly between tenants, see
    /// [`queue`](self::queue)), and every job submitted since the last cycle gets a decision
    /// even if the cycle did not look at it: refused or waiting over its budget or quota (the
    /// admission checks, which cost a few look-ups), waiting for capacity its shape is already
    /// known not to find, or waiting as not considered yet ([`Wait::NotConsidered`]).
    pub fn cycle(&mut self, now: i64) -> Vec<Decision> {
        self.run(now, None)
    }

    /// Whether something changed since the last full pass (capacity, quotas, the queue).
    pub fn needs_cycle(&self) -> bool {
        self.dirty
    }

    /// Runs the actions over a session of the whole queue, or of the one job `only`.
    fn run(&mut self, now: i64, only: Option<u64>) -> Vec<Decision> {
        let jobs: Vec<Arc<Queued>> = match only {
            // Unchanged capacity: only the newcomer is tried, no need to order the queue.
            Some(id) => self.queue.get(id).cloned().into_iter().collect(),
            None => {
                let limit = self.cfg.max_jobs_per_cycle.max(1);
                // Keys of requests long gone do not pile up.
                if self.unfit.len() + self.explained.len() > 16_384 {
                    self.unfit.clear();
                    self.explained.clear();
                }
                let (jobs, cut) = allocate::queue_order(self, now, limit);
                // Jobs that may fit beyond the cut have not seen the change: the next cycle
                // looks again.
                self.dirty = cut;
                jobs
            }
        };
        // The jobs the cycle looks at are decided by it; the other new ones after it.
        if !self.fresh.is_empty() {
            for q in &jobs {
                self.fresh.remove(&q.job.id);
            }
        }
        let jobs: Rc<[Arc<Queued>]> = jobs.into();
        let actions = std::mem::take(&mut self.actions);
        let mut session = Session::new(self, now, jobs.clone());
        for a in &actions {
            a.execute(&mut session);
        }
        let mut decisions = session.close();
        self.actions = actions;
        if !self.fresh.is_empty() {
            self.decide_the_rest(&jobs, &mut decisions);
        }
        decisions
    }

    /// Gives each job submitted since the last cycle that this cycle did not look at (`looked`:
    /// those it did) and that has no reason yet a decision, with the cheap checks that still
    /// tell what is true: the admission checks (budget and quotas, as of now), then whether
    /// its shape is known to find no room in every pool it may use (the engine's last
    /// diagnosis of that shape), else that the cycle's budget went to jobs ahead of it.
    fn decide_the_rest(&mut self, looked: &[Arc<Queued>], out: &mut Vec<Decision>) {
        // In arrival order, sorted by the sequence number beside each job (not read through it).
        let mut rest: Vec<(u64, Arc<Queued>)> = std::mem::take(&mut self.fresh)
            .into_iter()
            .filter(|id| !self.reasons.contains_key(id))
            .filter_map(|id| self.queue.get(id).map(|q| (q.seq, q.clone())))
            .collect();
        if rest.is_empty() {
            return;
        }
        rest.sort_unstable_by_key(|&(seq, _)| seq);
        // The jobs this cycle looked at, by tenant number.
        let mut considered = vec![0usize; self.queue.tenant_count()];
        for q in looked {
            considered[q.tenant] += 1;
        }
        let budget = self.cfg.max_jobs_per_cycle.max(1);
        self.reasons.reserve(rest.len());
        out.reserve(rest.len());
        for (_, q) in rest {
            let id = q.job.id;
            let reason = match admit::blocked(self, &q) {
                Some(over) if !q.job.wait_if_over_limit => {
                    self.queue.remove(id);
                    self.nominated.remove(&id);
                    out.push(Decision::Refused {
                        id,
                        reason: over.refusal(),
                    });
                    continue;
                }
                Some(over) => over.wait(),
                None if !q.scope.is_empty() && allocate::known_unfit_in_scope(self, &q) => {
                    match self.explained.get(&q.key) {
                        Some(w) => w.clone(),
                        None => {
                            let w = Wait::Unplaceable(self.engine.explain(&q.job.request));
                            self.explained.insert(q.key.clone(), w.clone());
                            w
                        }
                    }
                }
                None => Wait::NotConsidered {
                    budget,
                    tenant: q.job.tenant.clone(),
                    considered: considered[q.tenant],
                    waiting: self.queue.waiting_of(q.tenant),
                },
            };
            self.reasons.insert(id, reason.clone());
            out.push(Decision::Waiting { id, reason });
        }
    }

    /// Books a job's new allocation against its tenant and records it as running.
    fn hold(&mut self, job: &Job, keys: Vec<String>, units: GpuUnits, node: NodeId, borrowing: bool, since: i64) {
        self.hold_on(job, keys, units, vec![node], borrowing, since);
    }

    /// [`Self::hold`] on every node of a gang (`nodes[0]` first; one node for other work).
    fn hold_on(
        &mut self,
        job: &Job,
        keys: Vec<String>,
        units: GpuUnits,
        nodes: Vec<NodeId>,
        borrowing: bool,
        since: i64,
    ) {
        let mut nodes = nodes.into_iter();
        let node = nodes.next().expect("a workload holds capacity on a node");
        let gang_nodes: Vec<NodeId> = nodes.collect();
        // Consolidation moves work by re-placing its one request: never a gang.
        let movable = if job.gang.is_some() { None } else { job.movable };
        self.books
            .account(&job.tenant, &keys, units, true, since, self.cfg.half_life_ms);
        let class = self.class(&job.priority);
        let min_runtime_ms = [
            Some(self.cfg.min_runtime_ms),
            class.and_then(|c| c.min_runtime_ms),
            job.min_runtime_ms,
        ]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(0);
        let running = Running {
            id: job.id,
            tenant: job.tenant.clone(),
            rank: self.rank(&job.priority),
            preemptible: class.is_none_or(|c| c.preemptible),
            borrowing,
            running_since_ms: since,
            units,
            keys,
            stopping: false,
            min_runtime_ms,
            checkpoint_ms: None,
            movable,
            request: job.request.clone(),
            node,
            gang_nodes,
            ends_at_ms: job.duration_ms.map(|d| since.saturating_add(d)),
        };
        if let Some(old) = self.running.remove(&job.id) {
            if old.movable.is_some() {
                self.movable_running -= 1;
            }
            self.victim_index.remove(&old);
        }
        if movable.is_some() {
            self.movable_running += 1;
        }
        self.victim_index.add(&running);
        self.running.insert(job.id, running);
    }

    /// The nodes held for jobs other than `job`: backfill reservations, reservations with a
    /// start and the victims' nodes of waiting preemptors.
    fn held_for_others(&self, job: u64) -> FxHashSet<u32> {
        self.held_for(job, |_| true)
    }

    /// The nodes `job`, placed at `now`, may not use: [`Self::held_for_others`] less the
    /// nodes of reservations with a start ([`Hold`]) that start after it ends (backfill into
    /// reserved capacity, which never delays the holder). With
    /// [`GovernConfig::gang_holds_stack`], a job that holds nodes may also use those of its
    /// nodes that holds taken after its own hold too: their starts there follow its window
    /// (it starts no later than its hold's start, so it ends by its window's end).
    fn held_for_placing(&self, job: &Job, now: i64) -> FxHashSet<u32> {
        let own = if self.cfg.gang_holds_stack {
            self.holds.iter().position(|h| h.job == job.id)
        } else {
            None
        };
        let blocks = |h: &Hold| !h.ends_before(job.duration_ms, now);
        let Some(i) = own else {
            return self.held_for(job.id, blocks);
        };
        let mut held = self.held_for(job.id, |_| false);
        let mine = &self.holds[i].nodes;
        for (k, h) in self.holds.iter().enumerate() {
            if h.job != job.id && blocks(h) {
                held.extend(h.nodes.iter().copied().filter(|n| k < i || !mine.contains(n)));
            }
        }
        held
    }

    /// The nodes `job` is kept off where it fits elsewhere: `blocked`, those it may not use
    /// ([`Scheduler::held_for_placing`]), and every other job's held nodes, but for those of
    /// its own hold. Backfill goes on held nodes only where it fits nowhere else, so they
    /// drain: leases overstate how long work runs, and a holder whose nodes hold only the work
    /// that was there starts when that work really ends, not when the backfill placed after it
    /// ends.
    fn held_anywhere(&self, job: &Job, blocked: &FxHashSet<u32>) -> FxHashSet<u32> {
        let own: &[u32] = self
            .holds
            .iter()
            .find(|h| h.job == job.id)
            .map_or(&[], |h| h.nodes.as_slice());
        let mut held = blocked.clone();
        held.extend(
            self.holds
                .iter()
                .filter(|h| h.job != job.id)
                .flat_map(|h| h.nodes.iter().copied())
                .filter(|n| !own.contains(n)),
        );
        held
    }

    /// Whether `job`, placed at `now`, may use the nodes of some reservation with a start.
    fn backfills_a_hold(&self, job: &Job, now: i64) -> bool {
        self.holds
            .iter()
            .any(|h| h.job != job.id && h.ends_before(job.duration_ms, now))
    }

    /// The nodes held for jobs other than `job`, of reservations with a start only those `hold`
    /// says.
    fn held_for(&self, job: u64, hold: impl Fn(&Hold) -> bool) -> FxHashSet<u32> {
        let reserved = self.reservations.values().filter(|(j, _)| *j != job).map(|(_, n)| *n);
        let gangs = self
            .holds
            .iter()
            .filter(|h| h.job != job && hold(h))
            .flat_map(|h| h.nodes.iter().copied());
        let nominated = self
            .nominated
            .iter()
            .filter(|(j, _)| **j != job)
            .flat_map(|(_, n)| n.nodes.iter().copied());
        reserved.chain(gangs).chain(nominated).collect()
    }

    /// When gang job `job` — not queued: a dry run's, as if submitted at `now` and finding no
    /// room — would take capacity from running work, by reclaim within its tenant's guarantee
    /// or by its priority class: the cause and the time (ms since the epoch), the forecast its
    /// queue reason will give once it waits ([`Wait::PreemptsIn`]); `None` where neither rule
    /// would. Decides nothing: trial evictions are rolled back. `job.id` should be one no
    /// queued or running job has.
    pub fn new_gang_forecast(&mut self, job: &Job, now: i64) -> Option<(PreemptCause, i64)> {
        victims::new_gang_forecast(self, job, now)
    }

    /// A copy of the reservations a new gang's hold is planned around ([`HoldBook`]).
    pub fn hold_book(&self) -> HoldBook {
        HoldBook {
            holds: self.holds.clone(),
            others: self.other_reserved(),
            ends: self
                .running
                .values()
                .map(|r| (r.id, if r.stopping { Some(i64::MIN) } else { r.ends_at_ms }))
                .collect(),
            stack: self.cfg.gang_holds_stack,
            limits: (self.cfg.holds_per_pool, self.cfg.gang_holds_per_pool),
        }
    }

    /// Whether `book` still has this scheduler's holds and other reservations (its running
    /// work's ends aside): a cheap check before copying a new one.
    pub fn holds_match(&self, book: &HoldBook) -> bool {
        book.holds == self.holds && book.others == self.other_reserved()
    }

    /// The nodes reserved for single-node heads or nominated for preemptors, sorted, each once.
    fn other_reserved(&self) -> Vec<u32> {
        let mut others: Vec<u32> = self
            .reservations
            .values()
            .map(|(_, n)| *n)
            .chain(self.nominated.values().flat_map(|n| n.nodes.iter().copied()))
            .collect();
        others.sort_unstable();
        others.dedup();
        others
    }

    /// The pools a request may go to, in the engine's order.
    fn pools_for(&self, req: &Request) -> Vec<PoolId> {
        self.engine.scope(req).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{job, placed, sched};
    use super::*;

    #[test]
    fn the_cycle_runs_admit_allocate_consolidate_reclaim_preempt_in_that_order() {
        let s = sched();
        let names: Vec<&str> = s.actions.iter().map(|a| a.name()).collect();
        assert_eq!(names, ["admit", "allocate", "consolidate", "reclaim", "preempt"]);
    }

    #[test]
    fn a_request_no_node_could_ever_hold_is_refused_at_submission() {
        let mut s = sched();
        let d = s.submit(job(1, "a", 9, "standard", 0), 0);
        let [Decision::Refused { id: 1, reason }] = d.as_slice() else {
            panic!("{d:?}")
        };
        assert_eq!(reason.code(), "constraint");
        assert_eq!(s.queued(), 0, "nothing is queued");
    }

    #[test]
    fn a_job_submitted_for_the_next_cycle_is_decided_there_in_queue_order() {
        let mut s = sched();
        for i in 0..16 {
            assert_eq!(placed(&s.submit(job(i, "a", 8, "standard", 0), 0)), vec![i]);
        }
        assert!(placed(&s.submit(job(50, "b", 8, "standard", 1), 1)).is_empty());
        s.release(3, 2);
        // Capacity changed: the newcomer waits for the cycle, and the older job gets the node.
        assert!(s.submit_for_next_cycle(job(51, "c", 8, "standard", 2)).is_none());
        assert_eq!(s.queued(), 2);
        assert_eq!(placed(&s.cycle(3)), vec![50]);
        let r = s.submit_for_next_cycle(job(52, "c", 9, "standard", 3));
        assert_eq!(
            r.map(|r| r.code()),
            Some("constraint"),
            "constraints are refused at once"
        );
        assert_eq!(s.queued(), 1);
    }

    #[test]
    fn a_cycle_takes_at_most_its_cut_of_the_queue_and_the_next_one_goes_on_in_the_same_order() {
        let mut s = Scheduler::new(
            super::testing::engine(),
            GovernConfig {
                max_jobs_per_cycle: 3,
                ..super::testing::config()
            },
        );
        // Two tenants and two classes: the order interleaves the per-tenant, per-class queues.
        for (id, tenant, class, at) in [
            (1, "a", "standard", 5),
            (2, "b", "standard", 1),
            (3, "a", "high", 9),
            (4, "b", "high", 8),
            (5, "a", "standard", 2),
        ] {
            assert!(s.submit_for_next_cycle(job(id, tenant, 1, class, at)).is_none());
        }
        assert_eq!(placed(&s.cycle(10)), vec![4, 3, 2]);
        assert!(s.needs_cycle(), "jobs that may fit were left for the next cycle");
        assert_eq!(placed(&s.cycle(11)), vec![5, 1]);
        assert!(!s.needs_cycle());
        assert_eq!(s.queued(), 0);
    }

    /// Every decision of `d` by job id: what became of each job.
    fn decided(d: &[Decision]) -> HashMap<u64, &Decision> {
        d.iter()
            .filter_map(|x| match x {
                Decision::Placed { id, .. } | Decision::Waiting { id, .. } | Decision::Refused { id, .. } => {
                    Some((*id, x))
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn every_job_submitted_gets_a_decision_from_the_next_cycle_even_past_its_budget() {
        let mut s = Scheduler::new(
            super::testing::engine(),
            GovernConfig {
                max_jobs_per_cycle: 10,
                ..super::testing::config()
            },
        );
        // 40 jobs of a whole node for 16 nodes; the cycle looks at 10.
        for i in 0..40 {
            assert!(s.submit_for_next_cycle(job(i, "a", 8, "standard", i as i64)).is_none());
        }
        let d = s.cycle(100);
        let by_id = decided(&d);
        assert_eq!(by_id.len(), 40, "every job has a decision: {d:?}");
        assert_eq!(placed(&d), (0..10).collect::<Vec<_>>(), "the ten looked at are placed");
        for i in 10..40 {
            let Decision::Waiting { reason, .. } = by_id[&i] else {
                panic!("{:?}", by_id[&i])
            };
            assert_eq!(reason.code(), "not-considered");
            assert_eq!(
                reason.to_string(),
                "not considered yet: the scheduler cycle looks at 10 jobs at most, taken in queue order (priority class, fair share, arrival) and shared between the tenants waiting, and jobs ahead of this one took them (this cycle looked at 10 of tenant a's jobs; 30 still wait); a later cycle looks at this one once fewer jobs are ahead of it"
            );
        }
        assert!(s.needs_cycle());
        // The next cycle looks at the next ten: six placed, four told why they wait now; the
        // others keep their reason (no new decision for the same kind of reason).
        let d = s.cycle(200);
        assert_eq!(placed(&d), (10..16).collect::<Vec<_>>());
        let waits: Vec<(u64, &str)> = d
            .iter()
            .filter_map(|x| match x {
                Decision::Waiting { id, reason } => Some((*id, reason.code())),
                _ => None,
            })
            .collect();
        assert_eq!(waits, (16..20).map(|i| (i, "no-capacity")).collect::<Vec<_>>());
    }

    #[test]
    fn jobs_past_the_budget_get_the_reason_the_cheap_checks_find() {
        let mut s = Scheduler::new(
            super::testing::engine(),
            GovernConfig {
                max_jobs_per_cycle: 2,
                ..super::testing::config()
            },
        );
        s.set_quota(
            "q",
            "training",
            Some(Quota {
                guaranteed: GpuUnits::whole(4),
                limit: Some(GpuUnits::whole(4)),
            }),
        );
        // Two jobs take the cycle's budget; behind them, one over its tenant's limit that
        // waits, one over it that asked not to, and one of a tenant with no limit.
        assert!(s.submit_for_next_cycle(job(1, "a", 1, "critical", 0)).is_none());
        assert!(s.submit_for_next_cycle(job(2, "a", 1, "critical", 0)).is_none());
        assert!(s.submit_for_next_cycle(job(3, "q", 8, "standard", 0)).is_none());
        let mut refuse = job(4, "q", 8, "standard", 0);
        refuse.wait_if_over_limit = false;
        assert!(s.submit_for_next_cycle(refuse).is_none());
        assert!(s.submit_for_next_cycle(job(5, "z", 1, "standard", 0)).is_none());
        let d = s.cycle(10);
        let by_id = decided(&d);
        assert_eq!(placed(&d), vec![1, 2]);
        assert!(
            matches!(
                by_id[&3],
                Decision::Waiting {
                    reason: Wait::Limit(_),
                    ..
                }
            ),
            "{d:?}"
        );
        assert!(
            matches!(
                by_id[&4],
                Decision::Refused {
                    reason: Refusal::Limit(_),
                    ..
                }
            ),
            "{d:?}"
        );
        assert!(
            matches!(
                by_id[&5],
                Decision::Waiting {
                    reason: Wait::NotConsidered {
                        considered: 0,
                        waiting: 1,
                        ..
                    },
                    ..
                }
            ),
            "{d:?}"
        );
        assert_eq!(s.queued(), 2, "the refused job left the queue");
    }

    #[test]
    fn a_tenant_flooding_the_queue_cannot_keep_another_tenants_job_out_of_every_cycle() {
        let mut s = Scheduler::new(
            super::testing::engine(),
            GovernConfig {
                max_jobs_per_cycle: 100,
                ..super::testing::config()
            },
        );
        // Tenant b holds 7 GPUs of every node (its fair share comes after the flooding
        // tenant's, which holds nothing); one GPU is free on each node.
        for n in 0..16 {
            assert_eq!(placed(&s.submit(job(n, "b", 7, "standard", 0), 0)), vec![n]);
        }
        // A hostile tenant floods the queue with whole-node jobs that cannot fit; b's single
        // 1-GPU job comes after them and would fit.
        for i in 0..5_000 {
            assert!(
                s.submit_for_next_cycle(job(1_000 + i, "flood", 8, "standard", 1))
                    .is_none()
            );
        }
        assert!(s.submit_for_next_cycle(job(99, "b", 1, "standard", 2)).is_none());
        // The flood takes the budget's share of one of the two tenants waiting, not all of it.
        let d = s.cycle(10);
        assert_eq!(
            placed(&d),
            vec![99],
            "b's job is looked at and placed in the first cycle"
        );
        assert_eq!(decided(&d).len(), 5_001, "every job is decided once");
        // Every flood job has the reason the cycle, or its shape's diagnosis, gives.
        assert!(s.reasons.values().all(|r| r.code() == "fragmentation"));
        assert_eq!(s.reasons.len(), 5_000);
    }

    #[test]
    fn a_shape_that_found_no_room_is_searched_again_only_once_capacity_is_freed() {
        let mut s = sched();
        for i in 0..16 {
            assert_eq!(placed(&s.submit(job(i, "a", 8, "standard", 0), 0)), vec![i]);
        }
        let training = s.engine.scope(&job(0, "a", 8, "standard", 0).request).unwrap()[0];
        let before = s.engine.freed_generation(training);
        assert!(placed(&s.submit(job(50, "b", 8, "standard", 1), 1)).is_empty());
        assert!(s.unfit.values().any(|v| v.contains(&(training, before))), "remembered");
        assert_eq!(s.engine.freed_generation(training), before, "a placement frees nothing");
        s.release(3, 2);
        assert_ne!(s.engine.freed_generation(training), before, "a release does");
        assert_eq!(placed(&s.cycle(2)), vec![50]);
    }

    #[test]
    fn released_capacity_goes_to_the_queue_on_the_next_cycle() {
        let mut s = sched();
        for i in 0..16 {
            assert_eq!(placed(&s.submit(job(i, "a", 8, "standard", 0), 0)), vec![i]);
        }
        assert!(placed(&s.submit(job(99, "b", 8, "standard", 1), 1)).is_empty());
        assert!(!s.needs_cycle());
        s.release(4, 2);
        assert!(s.needs_cycle());
        assert_eq!(placed(&s.cycle(2)), vec![99]);
        assert_eq!(s.held("b", "training"), GpuUnits::whole(8));
        assert_eq!(s.queued(), 0);
    }
}
