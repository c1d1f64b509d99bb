//! Backend work the lifecycle decided — partition, start, stop, unpartition — carried out
//! after the commit that decided it, one operation at a time per workload and in order (so an
//! unpartition never overtakes the stop before it), each reporting its result back to the
//! loop as a [`Cmd::Done`].

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_backend::{Backend, BackendError, PartitionPlan, PartitionReport, RunSpec};
use tessera_domain::WorkloadId;
use tokio::sync::mpsc;

use super::command::Cmd;
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

/// What an operation came to.
#[derive(Debug)]
pub enum OpResult {
    Partitioned(Result<PartitionReport, BackendError>),
    Started(Result<(), BackendError>),
    Stopped(Result<(), BackendError>),
    Unpartitioned(Result<(), BackendError>),
}

/// Runs operations, one at a time per workload.
pub struct Runner {
    backend: Arc<dyn Backend>,
    tx: mpsc::Sender<Cmd>,
    metrics: Arc<Metrics>,
    /// Workloads with an operation in flight, and what waits behind it.
    queues: HashMap<WorkloadId, VecDeque<Op>>,
}

impl Runner {
    pub fn new(backend: Arc<dyn Backend>, tx: mpsc::Sender<Cmd>, metrics: Arc<Metrics>) -> Self {
        Runner {
            backend,
            tx,
            metrics,
            queues: HashMap::new(),
        }
    }

    /// Queues `op` for `id`; runs it now if nothing is in flight for that workload.
    pub fn submit(&mut self, id: WorkloadId, op: Op) {
        match self.queues.get_mut(&id) {
            Some(q) => {
                // A stop makes waiting partitions and starts pointless.
                if matches!(op, Op::Stop { .. }) {
                    q.retain(|o| !matches!(o, Op::Partition(_) | Op::Start(_)));
                }
                q.push_back(op);
            }
            None => {
                self.queues.insert(id, VecDeque::new());
                self.launch(id, op);
            }
        }
    }

    /// The operation in flight for `id` finished: run the next one.
    pub fn done(&mut self, id: WorkloadId) {
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
    }

    fn launch(&mut self, id: WorkloadId, op: Op) {
        let backend = self.backend.clone();
        let tx = self.tx.clone();
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
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
