//! The contract suite: what every [`Backend`] must do, one async check per behaviour of the
//! crate doc's invariants (event order, idempotency, level-triggered reconcile with ghosts and
//! orphans, partition before start), each on a fresh backend that a [`Harness`] makes, and
//! panicking when the backend misbehaves. Built with the `contract` feature (a dev-dependency
//! feature of the backend crates: nothing of it is in a server build).
//!
//! An implementation crate runs the whole suite with
//! [`backend_contract_tests!`](crate::backend_contract_tests), which expands to one test per
//! check, each with the attributes given (the runtime: paused time for a simulation, real time
//! for real processes):
//!
//! ```ignore
//! mod exact {
//!     tessera_backend::backend_contract_tests!(#[tokio::test(start_paused = true)] harness = SimHarness(SimMode::Exact));
//! }
//! ```

use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::{Backend, BackendEvent, Exit, Observation, PartitionPlan, RunSpec};

/// How a workload of the suite behaves once it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Run {
    /// Ends on its own, successfully, soon (well within [`Harness::patience`]).
    Succeeds,
    /// Runs until it is stopped.
    UntilStopped,
}

/// What a backend crate gives the suite: fresh backends and workloads they can run.
#[async_trait]
pub trait Harness: Send + Sync {
    type B: Backend;
    /// A fresh backend, sharing no workload with any other the harness made.
    async fn backend(&self) -> Self::B;
    /// A spec of workload `id` that `b` can start now with no partitioning, behaving as `run`
    /// says. Different ids may run side by side.
    async fn workload(&self, b: &Self::B, id: u64, run: Run) -> RunSpec;
    /// A workload on a MIG instance and the plan that makes the instance, for backends that
    /// partition; `None` where the backend has no MIG GPU (the check then passes vacuously).
    async fn partitioned(&self, b: &Self::B, id: u64) -> Option<(PartitionPlan, RunSpec)>;
    /// How long an event may take to come (of the runtime's clock: cheap when it is paused).
    fn patience(&self) -> Duration;
    /// Added to the suite's workload ids (1 to 7), for a harness whose backends share a
    /// cluster with other tests' workloads.
    fn id_base(&self) -> u64 {
        0
    }
}

/// Expands to one test per contract check, each with the attributes given before `harness`
/// and on the harness `$h` (an expression). Invoke it once per module.
#[macro_export]
macro_rules! backend_contract_tests {
    ($(#[$m:meta])* harness = $h:expr) => {
        $crate::backend_contract_tests!(@each [$(#[$m])*] $h;
            a_workload_reports_started_running_then_its_exit,
            starting_a_workload_twice_starts_it_once,
            a_stopped_workload_sends_nothing_more_and_stopping_again_is_harmless,
            reconcile_sees_running_work_and_answers_the_same_twice,
            reconcile_reports_ghosts_and_orphans_and_changes_nothing,
            a_partition_is_made_once_before_its_workload_starts,
        );
    };
    (@each [$($attr:tt)*] $h:expr; $name:ident, $($rest:ident,)*) => {
        $($attr)*
        async fn $name() {
            $crate::contract::$name(&$h).await
        }
        $crate::backend_contract_tests!(@each [$($attr)*] $h; $($rest,)*);
    };
    (@each [$($attr:tt)*] $h:expr;) => {};
}

/// The events of workload `id` that arrive within `within`, until (and with) the first that
/// `last` accepts; the others are dropped.
async fn events_of(
    rx: &mut UnboundedReceiver<BackendEvent>,
    id: u64,
    within: Duration,
    last: impl Fn(&BackendEvent) -> bool,
) -> Vec<BackendEvent> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    while let Ok(Some(e)) = tokio::time::timeout_at(deadline, rx.recv()).await {
        if e.workload() != Some(id) {
            continue;
        }
        let done = last(&e);
        seen.push(e);
        if done {
            break;
        }
    }
    seen
}

fn is_running(e: &BackendEvent) -> bool {
    matches!(e, BackendEvent::Running { .. })
}

/// Starts `spec` on `b` and waits until it runs.
async fn start_running<B: Backend>(b: &B, rx: &mut UnboundedReceiver<BackendEvent>, spec: &RunSpec, within: Duration) {
    b.start(spec).await.expect("the backend starts the workload");
    let seen = events_of(rx, spec.id, within, is_running).await;
    assert!(
        seen.last().is_some_and(is_running),
        "workload {} should run within {within:?}; its events: {seen:?}",
        spec.id
    );
}

/// Stops workload `spec` and waits until it is gone: where the backend confirms stops, for its
/// `Stopped`; elsewhere until reconcile no longer sees it running (a stop may end the work
/// after returning, and a check must leave nothing running behind it).
async fn stop_and_wait<B: Backend>(b: &B, rx: &mut UnboundedReceiver<BackendEvent>, spec: &RunSpec, within: Duration) {
    let id = spec.id;
    b.stop(id, Duration::from_secs(1))
        .await
        .expect("the backend stops the workload");
    if b.capabilities().confirms_stop {
        let seen = events_of(rx, id, within, |e| matches!(e, BackendEvent::Stopped { .. })).await;
        assert!(
            matches!(seen.last(), Some(BackendEvent::Stopped { .. })),
            "a backend that confirms stops says Stopped for {id}: {seen:?}"
        );
        return;
    }
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let r = b.reconcile(std::slice::from_ref(spec)).await.expect("reconcile");
        if !matches!(
            r.observation(id),
            Some(Observation::Running { .. } | Observation::Starting)
        ) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "workload {id} still runs {within:?} after its stop: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Started, then Running, then (after any `Bound`) one `Exited` with success, and nothing
/// after it.
pub async fn a_workload_reports_started_running_then_its_exit<H: Harness>(h: &H) {
    let b = h.backend().await;
    let mut rx = b.take_events().expect("a fresh backend's events");
    let id = h.id_base() + 1;
    let spec = h.workload(&b, id, Run::Succeeds).await;
    b.start(&spec).await.expect("the backend starts the workload");
    let seen = events_of(&mut rx, id, h.patience(), |e| {
        matches!(e, BackendEvent::Exited { .. } | BackendEvent::Lost { .. })
    })
    .await;
    let kinds: Vec<&str> = seen
        .iter()
        .map(|e| match e {
            BackendEvent::Started { .. } => "started",
            BackendEvent::Running { .. } => "running",
            BackendEvent::Bound { .. } => "bound",
            BackendEvent::Exited { .. } => "exited",
            _ => "other",
        })
        .filter(|k| *k != "bound")
        .collect();
    assert_eq!(
        kinds,
        ["started", "running", "exited"],
        "in this order, once each: {seen:?}"
    );
    let Some(BackendEvent::Exited { exit, .. }) = seen.last() else {
        unreachable!("checked above")
    };
    assert_eq!(exit, &Exit::Succeeded, "{seen:?}");
    let after = events_of(&mut rx, id, h.patience() / 4, |_| false).await;
    assert!(after.is_empty(), "nothing follows the exit: {after:?}");
    let r = b.reconcile(std::slice::from_ref(&spec)).await.expect("reconcile");
    assert!(
        matches!(r.observation(id), Some(Observation::Succeeded | Observation::Unknown)),
        "an ended workload is not seen running: {r:?}"
    );
}

/// `start` repeated with the same spec (a retry) is one start: one `Started`, one `Running`.
pub async fn starting_a_workload_twice_starts_it_once<H: Harness>(h: &H) {
    let b = h.backend().await;
    let mut rx = b.take_events().expect("a fresh backend's events");
    let id = h.id_base() + 2;
    let spec = h.workload(&b, id, Run::UntilStopped).await;
    b.start(&spec).await.expect("the first start");
    b.start(&spec).await.expect("a repeated start is accepted");
    let seen = events_of(&mut rx, id, h.patience(), is_running).await;
    assert!(seen.last().is_some_and(is_running), "it runs: {seen:?}");
    let more = events_of(&mut rx, id, h.patience() / 4, |_| false).await;
    let starts = seen
        .iter()
        .chain(&more)
        .filter(|e| matches!(e, BackendEvent::Started { .. }))
        .count();
    let runs = seen.iter().chain(&more).filter(|e| is_running(e)).count();
    assert_eq!(
        (starts, runs),
        (1, 1),
        "one Started and one Running: {seen:?} then {more:?}"
    );
    let r = b.reconcile(std::slice::from_ref(&spec)).await.expect("reconcile");
    assert!(r.orphans.iter().all(|o| o.id != Some(id)), "no second copy runs: {r:?}");
    stop_and_wait(&b, &mut rx, &spec, h.patience()).await;
}

/// After `stop`, no `Running`, `Exited` or `Lost` for the workload; a second `stop` is
/// accepted and changes nothing; reconcile no longer sees it.
pub async fn a_stopped_workload_sends_nothing_more_and_stopping_again_is_harmless<H: Harness>(h: &H) {
    let b = h.backend().await;
    let mut rx = b.take_events().expect("a fresh backend's events");
    let id = h.id_base() + 3;
    let spec = h.workload(&b, id, Run::UntilStopped).await;
    start_running(&b, &mut rx, &spec, h.patience()).await;
    stop_and_wait(&b, &mut rx, &spec, h.patience()).await;
    b.stop(id, Duration::from_secs(1))
        .await
        .expect("a repeated stop is accepted");
    let after = events_of(&mut rx, id, h.patience() / 4, |_| false).await;
    assert!(
        !after.iter().any(|e| matches!(
            e,
            BackendEvent::Running { .. } | BackendEvent::Exited { .. } | BackendEvent::Lost { .. }
        )),
        "nothing of its life follows a stop: {after:?}"
    );
    let r = b.reconcile(std::slice::from_ref(&spec)).await.expect("reconcile");
    assert_eq!(
        r.observation(id),
        Some(&Observation::Unknown),
        "a stopped workload is gone: {r:?}"
    );
    assert!(r.orphans.iter().all(|o| o.id != Some(id)), "nor an orphan: {r:?}");
}

/// A running workload is seen `Running`; asking twice gives the same answer (level-triggered,
/// nothing changed by asking).
pub async fn reconcile_sees_running_work_and_answers_the_same_twice<H: Harness>(h: &H) {
    let b = h.backend().await;
    let mut rx = b.take_events().expect("a fresh backend's events");
    let id = h.id_base() + 4;
    let spec = h.workload(&b, id, Run::UntilStopped).await;
    start_running(&b, &mut rx, &spec, h.patience()).await;
    let first = b.reconcile(std::slice::from_ref(&spec)).await.expect("reconcile");
    let second = b.reconcile(std::slice::from_ref(&spec)).await.expect("reconcile again");
    assert!(
        matches!(first.observation(id), Some(Observation::Running { .. })),
        "it runs: {first:?}"
    );
    assert_eq!(first.workloads, second.workloads, "the same answer twice");
    assert_eq!(first.orphans, second.orphans, "the same answer twice");
    assert!(
        first.orphans.iter().all(|o| o.id != Some(id)),
        "an expected workload is no orphan: {first:?}"
    );
    stop_and_wait(&b, &mut rx, &spec, h.patience()).await;
}

/// Expected but never started here: a ghost (`Unknown`), never started by reconcile. Running
/// but not expected: an orphan with its id, left running (reconcile only reports).
pub async fn reconcile_reports_ghosts_and_orphans_and_changes_nothing<H: Harness>(h: &H) {
    let b = h.backend().await;
    let mut rx = b.take_events().expect("a fresh backend's events");
    let id = h.id_base() + 5;
    let running = h.workload(&b, id, Run::UntilStopped).await;
    start_running(&b, &mut rx, &running, h.patience()).await;
    let ghost_id = h.id_base() + 6;
    let ghost = h.workload(&b, ghost_id, Run::UntilStopped).await;
    let r = b.reconcile(std::slice::from_ref(&ghost)).await.expect("reconcile");
    assert_eq!(r.observation(ghost_id), Some(&Observation::Unknown), "a ghost: {r:?}");
    assert!(
        r.orphans.iter().any(|o| o.id == Some(id) && o.node == running.node),
        "the unexpected workload is an orphan named by its id and node: {r:?}"
    );
    let ghost_events = events_of(&mut rx, ghost_id, h.patience() / 4, |_| false).await;
    assert!(ghost_events.is_empty(), "reconcile starts nothing: {ghost_events:?}");
    let again = b.reconcile(std::slice::from_ref(&running)).await.expect("reconcile");
    assert!(
        matches!(again.observation(id), Some(Observation::Running { .. })),
        "the orphan was left running: {again:?}"
    );
    stop_and_wait(&b, &mut rx, &running, h.patience()).await;
}

/// A partition is made by its plan before the workload on it starts: the first `partition`
/// creates, a repeat creates nothing; the workload runs on it; after its stop the plan is
/// undone, twice without harm.
pub async fn a_partition_is_made_once_before_its_workload_starts<H: Harness>(h: &H) {
    let b = h.backend().await;
    let mut rx = b.take_events().expect("a fresh backend's events");
    let id = h.id_base() + 7;
    let Some((plan, spec)) = h.partitioned(&b, id).await else {
        return;
    };
    let first = b.partition(&plan).await.expect("the plan is made");
    assert!(first.created, "the first partition creates: {first:?}");
    let again = b.partition(&plan).await.expect("a repeated plan is accepted");
    assert!(!again.created, "a repeated partition creates nothing: {again:?}");
    start_running(&b, &mut rx, &spec, h.patience()).await;
    stop_and_wait(&b, &mut rx, &spec, h.patience()).await;
    b.unpartition(&plan).await.expect("the plan is undone");
    b.unpartition(&plan).await.expect("undoing it again is harmless");
}
