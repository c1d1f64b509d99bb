//! Backend work the lifecycle decided — partition, start, stop, unpartition — carried out
//! after the commit that decided it, one operation at a time per workload and in order (so an
//! unpartition never overtakes the stop before it), each reporting its result back to the
//! loop as a [`Cmd::Done`].
//!
//! Across workloads one order matters too: the engine returns a released workload's MIG slices
//! or GPU share at once, so the next workload may be placed there while the unpartition of the
//! previous one is still queued. A partition of a GPU waits until every unpartition queued for
//! that GPU has run; otherwise it could find the old instance ("exists already") and lose it to
//! the old workload's unpartition a moment later.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_backend::{Backend, PartitionPlan, RunSpec};
use tessera_domain::WorkloadId;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::command::{Cmd, OpResult};
use crate::metrics::Metrics;

/// One backend operation for one workload.
#[derive(Clone, Debug)]
pub enum Op {
    Partition(PartitionPlan),
    Start(Box<RunSpec>),
    /// `evict`: a drain's stop, through [`Backend::evict`].
    Stop {
        grace: Duration,
        evict: bool,
    },
    Unpartition(PartitionPlan),
}

impl Op {
    fn name(&self) -> &'static str {
        match self {
            Op::Partition(_) => "partition",
            Op::Start(_) => "start",
            Op::Stop { .. } => "stop",
            Op::Unpartition(_) => "unpartition",
        }
    }
}

/// Runs operations, one at a time per workload. Its tasks end with it: when the loop stops
/// (its leader stepped down), operations still in flight are aborted, so a replica that no
/// longer leads stops acting on the backend.
pub struct Runner {
    backend: Arc<dyn Backend>,
    tx: mpsc::Sender<Cmd>,
    metrics: Arc<Metrics>,
    /// Workloads with an operation in flight, and what waits behind it.
    queues: HashMap<WorkloadId, VecDeque<Op>>,
    /// The operations' tasks (and the loop's other backend calls); aborted on drop.
    tasks: JoinSet<()>,
    /// GPUs with unpartitions queued or in flight, and how many.
    clearing: HashMap<GpuKey, usize>,
    /// The GPU of the unpartition in flight, per workload.
    clearing_now: HashMap<WorkloadId, GpuKey>,
    /// Partitions waiting for their GPU's unpartitions, in order of arrival.
    parked: VecDeque<(WorkloadId, Op)>,
}

/// A GPU: node name and index.
type GpuKey = (String, u8);

/// The GPU a partition plan touches (none for whole GPUs and host resources).
fn gpu_of(plan: &PartitionPlan) -> Option<GpuKey> {
    match plan {
        PartitionPlan::Instance { node, gpu, .. }
        | PartitionPlan::Layout { node, gpu, .. }
        | PartitionPlan::Share { node, gpu, .. } => Some((node.clone(), *gpu)),
        PartitionPlan::Nothing { .. } => None,
    }
}

impl Runner {
    pub fn new(backend: Arc<dyn Backend>, tx: mpsc::Sender<Cmd>, metrics: Arc<Metrics>) -> Self {
        Runner {
            backend,
            tx,
            metrics,
            queues: HashMap::new(),
            tasks: JoinSet::new(),
            clearing: HashMap::new(),
            clearing_now: HashMap::new(),
            parked: VecDeque::new(),
        }
    }

    /// Runs `task` (backend work of the loop) until it ends or the runner is dropped.
    pub fn spawn(&mut self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        // Forget the tasks that ended.
        while self.tasks.try_join_next().is_some() {}
        self.tasks.spawn(task);
    }

    /// Queues `op` for `id`; runs it now if nothing is in flight for that workload.
    pub fn submit(&mut self, id: WorkloadId, op: Op) {
        if let Op::Unpartition(plan) = &op
            && let Some(key) = gpu_of(plan)
        {
            *self.clearing.entry(key).or_default() += 1;
        }
        match self.queues.get_mut(&id) {
            Some(q) => {
                // A stop makes waiting partitions and starts pointless.
                if matches!(op, Op::Stop { .. }) {
                    q.retain(|o| !matches!(o, Op::Partition(_) | Op::Start(_)));
                    let before = self.parked.len();
                    self.parked.retain(|(w, _)| *w != id);
                    if self.parked.len() < before {
                        // Its parked partition was what it waited for: the stop runs now.
                        self.launch(id, op);
                        return;
                    }
                }
                q.push_back(op);
            }
            None => {
                self.queues.insert(id, VecDeque::new());
                self.launch(id, op);
            }
        }
    }

    /// Operations started or queued and not yet [`Runner::done`] (a parked one may count twice:
    /// only whether there are any matters).
    pub fn in_flight(&self) -> usize {
        self.queues.values().map(|q| q.len() + 1).sum::<usize>() + self.parked.len()
    }

    /// The operation in flight for `id` finished: run the next one.
    pub fn done(&mut self, id: WorkloadId) {
        if let Some(key) = self.clearing_now.remove(&id) {
            if let Some(n) = self.clearing.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    self.clearing.remove(&key);
                }
            }
            // Partitions that waited for this GPU (and no other unpartition of it) run now.
            let parked = std::mem::take(&mut self.parked);
            for (w, op) in parked {
                self.launch(w, op);
            }
        }
        let next = self.queues.get_mut(&id).and_then(|q| q.pop_front());
        match next {
            Some(op) => self.launch(id, op),
            None => {
                self.queues.remove(&id);
            }
        }
    }

    /// Whether backend work for `id` is in flight or waiting.
    pub fn busy(&self, id: WorkloadId) -> bool {
        self.queues.contains_key(&id)
    }

    /// Forgets everything queued (the loop rebuilds from the store; operations in flight still
    /// report back and are ignored if no longer relevant).
    pub fn clear(&mut self) {
        self.queues.clear();
        self.parked.clear();
        self.clearing.clear();
        for key in self.clearing_now.values() {
            *self.clearing.entry(key.clone()).or_default() += 1;
        }
    }

    fn launch(&mut self, id: WorkloadId, op: Op) {
        match &op {
            Op::Partition(plan) => {
                if let Some(key) = gpu_of(plan)
                    && self.clearing.contains_key(&key)
                {
                    self.parked.push_back((id, op));
                    return;
                }
            }
            Op::Unpartition(plan) => {
                if let Some(key) = gpu_of(plan) {
                    self.clearing_now.insert(id, key);
                }
            }
            _ => {}
        }
        let backend = self.backend.clone();
        let tx = self.tx.clone();
        let metrics = self.metrics.clone();
        self.spawn(async move {
            let t0 = Instant::now();
            let name = op.name();
            let result = match op {
                Op::Partition(plan) => OpResult::Partitioned(backend.partition(&plan).await),
                Op::Start(spec) => OpResult::Started(backend.start(&spec).await),
                Op::Stop { grace, evict: false } => OpResult::Stopped(backend.stop(id.0, grace).await),
                Op::Stop { grace, evict: true } => OpResult::Stopped(backend.evict(id.0, grace).await),
                Op::Unpartition(plan) => OpResult::Unpartitioned(backend.unpartition(&plan).await),
            };
            let err = match &result {
                OpResult::Partitioned(r) => r.as_ref().err(),
                OpResult::Started(r) | OpResult::Stopped(r) | OpResult::Unpartitioned(r) => r.as_ref().err(),
            };
            match err {
                Some(e) => metrics.backend_error(name, e),
                None => metrics.step_elapsed(name, t0.elapsed()),
            }
            let _ = tx.send(Cmd::Done(id, result)).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use tessera_backend::MigInstance;
    use tessera_backend_sim::{SimBackend, SimConfig, SimGpu, SimMode};

    use super::*;

    /// The next report of an operation, as `(workload, operation, created)`.
    async fn next(rx: &mut mpsc::Receiver<Cmd>) -> (u64, &'static str, Option<bool>) {
        let cmd = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("an operation reports within 5 s")
            .expect("the runner holds a sender");
        match cmd {
            Cmd::Done(id, r) => match r {
                OpResult::Partitioned(r) => (id.0, "partition", Some(r.expect("partitioned").created)),
                OpResult::Started(_) => (id.0, "start", None),
                OpResult::Stopped(_) => (id.0, "stop", None),
                OpResult::Unpartitioned(r) => {
                    r.expect("unpartitioned");
                    (id.0, "unpartition", None)
                }
            },
            _ => panic!("only operation reports are sent"),
        }
    }

    /// A workload placed on the slices another one just gave back waits for their
    /// unpartition: its partition creates a new instance rather than finding the old one, which
    /// the old workload's unpartition would then destroy under it.
    #[tokio::test]
    async fn a_partition_waits_for_the_unpartition_of_its_gpu() {
        let gpu = SimGpu {
            node: "a100-00".into(),
            index: 1,
            model: "A100-80GB".into(),
            memory_mib: 81920,
            mig_slices: 8,
        };
        let backend: Arc<dyn Backend> = Arc::new(SimBackend::new(SimConfig::for_mode(SimMode::Exact), vec![gpu]));
        let (tx, mut rx) = mpsc::channel(16);
        let mut runner = Runner::new(backend, tx, Arc::new(Metrics::new()));
        let plan = PartitionPlan::Instance {
            node: "a100-00".into(),
            gpu: 1,
            instance: MigInstance {
                profile: "7g.80gb".into(),
                profile_id: 0,
                start: 0,
                size: 8,
            },
        };
        let (a, b) = (WorkloadId(1), WorkloadId(2));
        runner.submit(a, Op::Partition(plan.clone()));
        assert_eq!(next(&mut rx).await, (1, "partition", Some(true)));
        runner.done(a);

        // `a` ends: its stop runs, its unpartition waits behind it; `b` is placed on the same
        // slices meanwhile.
        runner.submit(
            a,
            Op::Stop {
                grace: Duration::from_millis(10),
                evict: false,
            },
        );
        runner.submit(a, Op::Unpartition(plan.clone()));
        runner.submit(b, Op::Partition(plan.clone()));
        assert_eq!(next(&mut rx).await, (1, "stop", None));
        assert!(rx.try_recv().is_err(), "b's partition waits");
        runner.done(a);
        assert_eq!(next(&mut rx).await, (1, "unpartition", None));
        runner.done(a);
        assert_eq!(next(&mut rx).await, (2, "partition", Some(true)), "a new instance");
        runner.done(b);

        // A stop of a workload whose partition waits drops the partition and runs at once.
        let c = WorkloadId(3);
        let stop = || Op::Stop {
            grace: Duration::from_millis(10),
            evict: false,
        };
        runner.submit(b, stop());
        runner.submit(b, Op::Unpartition(plan.clone()));
        runner.submit(c, Op::Partition(plan.clone()));
        runner.submit(c, stop());
        let mut first = [next(&mut rx).await, next(&mut rx).await];
        first.sort();
        assert_eq!(first, [(2, "stop", None), (3, "stop", None)]);
        runner.done(c);
        assert!(!runner.busy(c));
        runner.done(b);
        assert_eq!(next(&mut rx).await, (2, "unpartition", None));
        runner.done(b);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(rx.try_recv().is_err(), "c's partition was dropped");
    }
}
