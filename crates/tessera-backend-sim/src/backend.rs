//! [`SimBackend`]: the `Backend` implementation, its timers and telemetry task, fault injection
//! and the counters tests read.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tessera_backend::{
    Backend, BackendError, BackendEvent, Capabilities, DeviceAssignment, Devices, Exit, GpuSample, MigInstance,
    MigModeChange, Observation, Orphan, PartitionPlan, PartitionReport, Partitioning, ReconcileReport, RunSpec,
    Simulated, SliceSpec,
};
use tokio::sync::mpsc;

use crate::bind::{bind_share, bind_start, check_node, in_share};
use crate::partition::{check_instance, check_layout, check_share, destroy_instance, layout_text, sorted};
use crate::state::{Ended, Held, Phase, Run, State};
use crate::telemetry::{sample_all, sample_run};
use crate::{SimConfig, SimGpu, SimMode};

/// The simulated backend. Built with every GPU of the fleet; see the crate doc for its modes.
pub struct SimBackend {
    cfg: SimConfig,
    shared: Arc<Shared>,
}

/// What the backend shares with its timer and telemetry tasks.
struct Shared {
    state: Mutex<State>,
    /// The latest subscriber's channel (see `take_events`).
    tx: Mutex<mpsc::UnboundedSender<BackendEvent>>,
    clock: Clock,
}

/// Wall-clock milliseconds that advance with Tokio's clock, so that timestamps, run times and
/// adoption agree with each other when a test pauses time.
struct Clock {
    /// Microseconds, so that this clock reads what the system's does (to the millisecond)
    /// while Tokio's runs freely: truncating the start to a millisecond would put every
    /// reading up to a millisecond behind the control plane's, and a workload could then
    /// start before it was submitted.
    base_us: i64,
    base: tokio::time::Instant,
}

impl Clock {
    fn new() -> Self {
        let base_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        Clock {
            base_us,
            base: tokio::time::Instant::now(),
        }
    }

    fn now_ms(&self) -> i64 {
        (self.base_us + self.base.elapsed().as_micros() as i64) / 1000
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("sim state lock")
    }

    /// Sent while the caller holds the state lock, so that a workload's events leave in the
    /// order of its state changes. Nobody listening (not taken, or dropped) is fine.
    fn send(&self, event: BackendEvent) {
        let _ = self.tx.lock().expect("events lock").send(event);
    }
}

impl SimBackend {
    /// A simulated fleet of `gpus` (every GPU of the fleet: telemetry covers them all).
    pub fn new(cfg: SimConfig, gpus: Vec<SimGpu>) -> Self {
        // Nobody listens until `take_events`: events sent before are dropped.
        let (tx, _) = mpsc::unbounded_channel();
        SimBackend {
            cfg,
            shared: Arc::new(Shared {
                state: Mutex::new(State::new(gpus)),
                tx: Mutex::new(tx),
                clock: Clock::new(),
            }),
        }
    }

    pub fn config(&self) -> &SimConfig {
        &self.cfg
    }

    /// A telemetry sample of every GPU now, the same as a `Telemetry` event carries.
    pub fn sample(&self) -> Vec<GpuSample> {
        let st = self.shared.lock();
        sample_all(&st, self.shared.clock.now_ms())
    }

    /// Injects an XID error on a GPU (it shows in telemetry, and a `GpuHealth` event reports
    /// the GPU unhealthy); XID 0 clears it and reports the GPU healthy again.
    pub fn inject_xid(&self, node: &str, gpu: u8, xid: u32) -> Result<(), BackendError> {
        let mut st = self.shared.lock();
        let g = st.gpu(node, gpu)?;
        st.gpus[g].xid = xid;
        let detail = match xid {
            0 => "XID error cleared (injected)".to_string(),
            x => match xid_meaning(x) {
                Some(m) => format!("XID {x}: {m} (injected)"),
                None => format!("XID {x} (injected)"),
            },
        };
        self.shared.send(BackendEvent::GpuHealth {
            node: node.to_string(),
            gpu,
            healthy: xid == 0,
            xid: (xid != 0).then_some(xid),
            detail,
        });
        Ok(())
    }

    /// The node goes away (a reboot, a removal): its GPUs leave telemetry and a
    /// `NodeChanged { Removed }` event follows. What ran there is lost (`Lost` events): a
    /// multi-node gang with a node-share there is lost whole, every share's devices freed, and
    /// its `Lost` names the share and the node.
    pub fn remove_node(&self, node: &str) -> Result<(), BackendError> {
        let mut lost: Vec<(u64, Option<usize>)> = {
            let mut st = self.shared.lock();
            let gpus: Vec<usize> = (0..st.gpus.len()).filter(|&g| st.gpus[g].gpu.node == node).collect();
            if gpus.is_empty() {
                return Err(BackendError::Rejected(format!(
                    "no node `{node}` in the simulated fleet"
                )));
            }
            for &g in &gpus {
                st.gpus[g].gone = true;
            }
            st.runs
                .iter()
                .filter_map(|(id, r)| {
                    let share = r.shares_on(node).next()?;
                    Some((*id, (r.shares.len() > 1).then_some(share)))
                })
                .collect()
        };
        lost.sort_unstable();
        for (id, share) in lost {
            match share {
                None => self.lose(id),
                Some(i) => self.lose_with(id, |run| {
                    format!(
                        "node-share {i} of {} on {node} was lost: {node} went away (injected); the gang ends with it",
                        run.shares.len()
                    )
                }),
            };
        }
        self.shared.send(BackendEvent::NodeChanged {
            node: node.to_string(),
            change: tessera_backend::NodeChange::Removed,
        });
        Ok(())
    }

    /// The node is back (empty, MIG instances gone as after a reboot): its GPUs report
    /// telemetry again and a `NodeChanged { Added }` event follows.
    pub fn restore_node(&self, node: &str) -> Result<(), BackendError> {
        let mut st = self.shared.lock();
        let mut found = false;
        for g in st.gpus.iter_mut().filter(|g| g.gpu.node == node) {
            g.gone = false;
            found = true;
        }
        if !found {
            return Err(BackendError::Rejected(format!(
                "no node `{node}` in the simulated fleet"
            )));
        }
        self.shared.send(BackendEvent::NodeChanged {
            node: node.to_string(),
            change: tessera_backend::NodeChange::Added,
        });
        Ok(())
    }

    /// A simulated reboot (a driver upgrade): the node goes away now (`NodeChanged { Removed }`)
    /// and comes back after `down_for` (`NodeChanged { Added }`), as [`SimBackend::remove_node`]
    /// and [`SimBackend::restore_node`] do. Must be called inside a Tokio runtime.
    pub fn reboot(&self, node: &str, down_for: Duration) -> Result<(), BackendError> {
        self.remove_node(node)?;
        let weak = Arc::downgrade(&self.shared);
        let cfg = self.cfg.clone();
        let node = node.to_string();
        tokio::spawn(async move {
            tokio::time::sleep(down_for).await;
            if let Some(shared) = weak.upgrade() {
                // The node was found when it went away, so it is found now.
                let _ = SimBackend { cfg, shared }.restore_node(&node);
            }
        });
        Ok(())
    }

    /// Makes a workload vanish as if deleted behind Tessera's back: its devices (every
    /// node-share's) are freed and a `Lost` event follows (none when it is being stopped).
    /// False when it was not running.
    pub fn lose(&self, id: u64) -> bool {
        self.lose_with(id, |run| {
            let nodes: Vec<&str> = (0..run.shares.len()).map(|i| run.node(i)).collect();
            format!("workload {id} vanished from {} (injected)", nodes.join(", "))
        })
    }

    /// Makes node-share `share` of a multi-node gang vanish as if deleted behind Tessera's
    /// back: the gang is lost with it, as [`SimBackend::lose`] loses a workload, and the
    /// `Lost` names the share and its node. False when there is no such running share.
    pub fn lose_share(&self, id: u64, share: usize) -> bool {
        let known = self
            .shared
            .lock()
            .runs
            .get(&id)
            .is_some_and(|r| r.shares.get(share).is_some_and(|h| !h.gone));
        known
            && self.lose_with(id, |run| {
                format!(
                    "node-share {share} of {} vanished from {} (injected); the gang ends with it",
                    run.shares.len(),
                    run.node(share)
                )
            })
    }

    /// Removes a run as lost, with a `Lost` event saying `detail` unless it is being stopped.
    fn lose_with(&self, id: u64, detail: impl FnOnce(&Run) -> String) -> bool {
        let mut st = self.shared.lock();
        let Some(run) = st.remove_run(id, Ended::Lost) else {
            return false;
        };
        if !run.stopping {
            self.shared.send(BackendEvent::Lost {
                id,
                at_ms: self.shared.clock.now_ms(),
                detail: detail(&run),
            });
        }
        true
    }

    /// A workload vanishes without a word (a missed event): only a reconcile can tell.
    pub fn forget(&self, id: u64) -> bool {
        self.shared.lock().remove_run(id, Ended::Lost).is_some()
    }

    /// Node-share `share` of a multi-node gang vanishes without a word (a missed event): its
    /// devices are freed, the other shares keep theirs until the gang is stopped, `reconcile`
    /// reports the gang `Failed`, and it cannot end well (its end is a `Lost`, not an `Exited`).
    /// False when there is no such share, or it vanished already.
    pub fn forget_share(&self, id: u64, share: usize) -> bool {
        self.shared.lock().drop_share(id, share)
    }

    /// The next `partition` call, whatever its plan, is `Rejected` with this detail.
    pub fn fail_next_partition(&self, detail: impl Into<String>) {
        self.shared.lock().fail_next_partition = Some(detail.into());
    }

    /// How many `partition` calls changed something (created an instance, applied a layout).
    pub fn partitions_created(&self) -> u64 {
        self.shared.lock().partitions_created
    }

    /// How many `start` calls started a workload (repeated starts and adoptions do not count).
    pub fn starts(&self) -> u64 {
        self.shared.lock().starts
    }

    /// Runs a workload's life on a timer: `Running` (unless it was adopted running), then after
    /// `remaining` the `Exited` event, unless it was stopped or lost meanwhile. Every node-share
    /// of a gang runs and ends together, so these are the whole gang's events.
    fn spawn_run(&self, id: u64, generation: u64, remaining: Option<Duration>, announce: bool) {
        let weak: Weak<Shared> = Arc::downgrade(&self.shared);
        tokio::spawn(async move {
            let current = |r: &Run| r.generation == generation && !r.stopping;
            if announce {
                let Some(shared) = weak.upgrade() else {
                    return;
                };
                let mut st = shared.lock();
                let now = shared.clock.now_ms();
                let Some(run) = st.runs.get_mut(&id).filter(|r| current(r)) else {
                    return;
                };
                if let Some(detail) = broken(run) {
                    st.remove_run(id, Ended::Lost);
                    shared.send(BackendEvent::Lost { id, at_ms: now, detail });
                    return;
                }
                run.phase = Phase::Running;
                run.since_ms = Some(now);
                let sample = sample_run(&st, id, now);
                shared.send(BackendEvent::Running { id, at_ms: now, sample });
            }
            let Some(d) = remaining else {
                return;
            };
            tokio::time::sleep(d).await;
            let Some(shared) = weak.upgrade() else {
                return;
            };
            let mut st = shared.lock();
            let Some(run) = st.runs.get(&id).filter(|r| current(r)) else {
                return;
            };
            // A gang that lost a node-share without a word cannot have finished its work.
            if let Some(detail) = broken(run) {
                st.remove_run(id, Ended::Lost);
                shared.send(BackendEvent::Lost {
                    id,
                    at_ms: shared.clock.now_ms(),
                    detail,
                });
                return;
            }
            st.remove_run(id, Ended::Succeeded);
            shared.send(BackendEvent::Exited {
                id,
                at_ms: shared.clock.now_ms(),
                exit: Exit::Succeeded,
            });
        });
    }

    /// Sends a `Telemetry` event to the subscriber `tx` every interval, until it goes away.
    fn spawn_telemetry(&self, tx: mpsc::UnboundedSender<BackendEvent>) {
        let interval = self.cfg.telemetry_interval;
        if interval.is_zero() {
            return;
        }
        let weak: Weak<Shared> = Arc::downgrade(&self.shared);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(shared) = weak.upgrade() else {
                    return;
                };
                if tx.is_closed() {
                    return;
                }
                let st = shared.lock();
                let at_ms = shared.clock.now_ms();
                let gpus = sample_all(&st, at_ms);
                let _ = tx.send(BackendEvent::Telemetry { at_ms, gpus });
            }
        });
    }

    async fn create_instance(
        &self,
        node: &str,
        gpu: u8,
        instance: &MigInstance,
    ) -> Result<PartitionReport, BackendError> {
        let exists = || PartitionReport {
            detail: format!("MIG GPU instance {instance} on {node} GPU {gpu} exists already"),
            created: false,
        };
        {
            let st = self.shared.lock();
            let g = st.gpu(node, gpu)?;
            if !check_instance(&st, g, instance)? {
                return Ok(exists());
            }
        }
        if !self.cfg.mig_partition_time.is_zero() {
            tokio::time::sleep(self.cfg.mig_partition_time).await;
        }
        // Checked again: an identical plan may have been realised while this one waited.
        let mut st = self.shared.lock();
        let g = st.gpu(node, gpu)?;
        if !check_instance(&st, g, instance)? {
            return Ok(exists());
        }
        let instances = &mut st.gpus[g].instances;
        instances.push(instance.clone());
        *instances = sorted(instances);
        st.partitions_created += 1;
        Ok(PartitionReport {
            detail: format!("created MIG GPU instance {instance} on {node} GPU {gpu}"),
            created: true,
        })
    }

    async fn apply_layout(
        &self,
        node: &str,
        gpu: u8,
        instances: &[MigInstance],
    ) -> Result<PartitionReport, BackendError> {
        let current = || PartitionReport {
            detail: format!(
                "MIG layout of {node} GPU {gpu} is already {}",
                layout_text(&sorted(instances))
            ),
            created: false,
        };
        {
            let st = self.shared.lock();
            let g = st.gpu(node, gpu)?;
            if !check_layout(&st, g, instances)? {
                return Ok(current());
            }
        }
        if !self.cfg.mig_partition_time.is_zero() {
            tokio::time::sleep(self.cfg.mig_partition_time).await;
        }
        // Checked again: a workload may have been bound on this GPU while the layout was applied.
        let mut st = self.shared.lock();
        let g = st.gpu(node, gpu)?;
        if !check_layout(&st, g, instances)? {
            return Ok(current());
        }
        let layout = sorted(instances);
        st.gpus[g].instances = layout.clone();
        st.partitions_created += 1;
        self.shared.send(BackendEvent::PartitionChanged {
            node: node.to_string(),
            gpu,
            instances: layout.clone(),
        });
        rebind_adopted(&mut st, node);
        Ok(PartitionReport {
            detail: format!("applied MIG layout {} to {node} GPU {gpu}", layout_text(&layout)),
            created: true,
        })
    }

    /// The refusal of a plan of the other mode's kind.
    fn wrong_plan(&self) -> BackendError {
        BackendError::Rejected(match self.cfg.mode {
            SimMode::Exact => {
                "the sim backend in exact mode creates single MIG instances; it does not apply whole-GPU layouts".into()
            }
            SimMode::Operator => "the sim backend in operator mode lays out whole GPUs, as the GPU Operator's MIG \
                                  manager does; it cannot create a single instance"
                .into(),
        })
    }

    /// Takes over an expected workload this process does not know, for the rest of its run
    /// time: every node-share of a gang, or none (each share is checked before anything
    /// changes). Returns its generation for the timer.
    fn adopt(&self, st: &mut State, spec: &RunSpec, since_ms: i64) -> Result<u64, BackendError> {
        let size = spec.gang_size();
        let share = |i: usize| spec.share(i).expect("an index below the gang size");
        for i in 0..size {
            let (node, devices) = share(i);
            let checked = check_node(st, spec, i).and_then(|()| match (devices, self.cfg.mode) {
                // Its instance is restored below, once every share is known to fit.
                (
                    Devices::Exact {
                        gpus,
                        slice: SliceSpec::Mig(instance),
                    },
                    SimMode::Exact,
                ) => match gpus[..] {
                    [g] => check_instance(st, st.gpu(node, g)?, instance).map(drop),
                    _ => bind_share(st, self.cfg.mode, node, devices).map(drop),
                },
                (Devices::Count { .. }, SimMode::Operator) => Ok(()),
                _ => bind_share(st, self.cfg.mode, node, devices).map(drop),
            });
            checked.map_err(|e| in_share(spec, i, e))?;
        }
        let mut shares = Vec::with_capacity(size);
        for i in 0..size {
            let (node, devices) = share(i);
            let binding = match (devices, self.cfg.mode) {
                (
                    Devices::Exact {
                        gpus,
                        slice: SliceSpec::Mig(instance),
                    },
                    SimMode::Exact,
                ) => {
                    // The instance outlived the control plane with its workload.
                    if let [g] = gpus[..] {
                        let g = st.gpu(node, g)?;
                        if check_instance(st, g, instance)? {
                            st.gpus[g].instances.push(instance.clone());
                            st.gpus[g].instances = sorted(&st.gpus[g].instances);
                        }
                    }
                    Some(bind_share(st, self.cfg.mode, node, devices))
                }
                // Layouts do not survive this process: a MIG workload waits for its layout to
                // come back (`rebind_adopted`) instead of failing work that real hardware still
                // runs.
                (Devices::Count { .. }, SimMode::Operator) => bind_share(st, self.cfg.mode, node, devices).ok().map(Ok),
                _ => Some(bind_share(st, self.cfg.mode, node, devices)),
            };
            shares.push(match binding.transpose().map_err(|e| in_share(spec, i, e))? {
                Some(b) => Held::new(b.gpus, b.slice),
                None => Held::new(Vec::new(), SliceSpec::HostOnly),
            });
        }
        let generation = st.next_generation();
        st.insert_run(Run {
            spec: spec.clone(),
            shares,
            phase: Phase::Running,
            since_ms: Some(since_ms),
            stopping: false,
            generation,
        });
        Ok(generation)
    }
}

/// Why a run cannot go on: one of its node-shares vanished ([`SimBackend::forget_share`]).
fn broken(run: &Run) -> Option<String> {
    let i = run.gone_share()?;
    Some(format!(
        "node-share {i} of {} on {} is gone; the gang cannot go on without it",
        run.shares.len(),
        run.node(i)
    ))
}

/// Binds the node-shares on `node` of adopted operator-mode workloads that are still waiting
/// for a device.
fn rebind_adopted(st: &mut State, node: &str) {
    let mut waiting: Vec<(u64, usize, Devices)> = st
        .runs
        .values()
        .flat_map(|r| {
            r.shares_on(node).filter_map(move |i| {
                let held = &r.shares[i];
                let (_, devices) = r.spec.share(i)?;
                (held.gpus.is_empty() && !held.gone && matches!(devices, Devices::Count { .. }))
                    .then(|| (r.spec.id, i, devices.clone()))
            })
        })
        .collect();
    waiting.sort_unstable_by_key(|(id, i, _)| (*id, *i));
    for (id, i, devices) in waiting {
        if let Ok(b) = bind_share(st, SimMode::Operator, node, &devices) {
            st.bind_run(id, i, b.gpus, b.slice);
        }
    }
}

/// What an XID usually means, for the `GpuHealth` detail (NVIDIA's XID catalogue).
fn xid_meaning(xid: u32) -> Option<&'static str> {
    Some(match xid {
        13 => "graphics engine exception",
        31 => "GPU memory page fault",
        43 => "GPU stopped processing",
        48 => "double-bit ECC error",
        74 => "NVLink error",
        79 => "GPU has fallen off the bus",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        _ => return None,
    })
}

impl Simulated for SimBackend {
    fn inject_xid(&self, node: &str, gpu: u8, xid: u32) -> Result<String, BackendError> {
        SimBackend::inject_xid(self, node, gpu, xid)?;
        Ok(crate::sim_uuid(node, gpu))
    }

    fn reboot(&self, node: &str, down_for: Duration) -> Result<(), BackendError> {
        SimBackend::reboot(self, node, down_for)
    }
}

#[async_trait]
impl Backend for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn simulated(&self) -> Option<&dyn Simulated> {
        Some(self)
    }

    fn capabilities(&self) -> Capabilities {
        match self.cfg.mode {
            SimMode::Exact => Capabilities {
                partitioning: Partitioning::Instance,
                devices: DeviceAssignment::Exact,
                logs: false,
                mig_mode_switch: true,
                mig_mode_reported: false,
                confirms_stop: false,
                native_admission: false,
                multi_node: true,
                needs_image: false,
            },
            SimMode::Operator => Capabilities {
                partitioning: Partitioning::WholeGpu,
                devices: DeviceAssignment::PerNodeCount,
                logs: false,
                mig_mode_switch: false,
                mig_mode_reported: false,
                confirms_stop: false,
                native_admission: false,
                multi_node: true,
                needs_image: false,
            },
        }
    }

    async fn partition(&self, plan: &PartitionPlan) -> Result<PartitionReport, BackendError> {
        if let Some(detail) = self.shared.lock().fail_next_partition.take() {
            return Err(BackendError::Rejected(detail));
        }
        match (self.cfg.mode, plan) {
            (SimMode::Exact, PartitionPlan::Instance { node, gpu, instance }) => {
                self.create_instance(node, *gpu, instance).await
            }
            (SimMode::Operator, PartitionPlan::Layout { node, gpu, instances }) => {
                self.apply_layout(node, *gpu, instances).await
            }
            (SimMode::Exact, PartitionPlan::Layout { .. }) | (SimMode::Operator, PartitionPlan::Instance { .. }) => {
                Err(self.wrong_plan())
            }
            (
                _,
                PartitionPlan::Share {
                    node,
                    gpu,
                    milli,
                    memory_mib,
                },
            ) => {
                let st = self.shared.lock();
                let g = st.gpu(node, *gpu)?;
                check_share(&st, g, *milli)?;
                let memory = memory_mib.map(|m| format!(", {m} MiB")).unwrap_or_default();
                // A share is a property of how the workload is started; nothing to create first.
                Ok(PartitionReport {
                    detail: format!("time-slice share of {milli} milli-GPU{memory} on {node} GPU {gpu}"),
                    created: false,
                })
            }
            (_, PartitionPlan::Nothing { node }) => {
                self.shared.lock().node_gpus(node)?;
                Ok(PartitionReport {
                    detail: format!("nothing to partition on {node}"),
                    created: false,
                })
            }
        }
    }

    async fn unpartition(&self, plan: &PartitionPlan) -> Result<(), BackendError> {
        let mut st = self.shared.lock();
        match (self.cfg.mode, plan) {
            (SimMode::Exact, PartitionPlan::Instance { node, gpu, instance }) => {
                let g = st.gpu(node, *gpu)?;
                destroy_instance(&mut st, g, instance)
            }
            (SimMode::Exact, PartitionPlan::Layout { .. }) | (SimMode::Operator, PartitionPlan::Instance { .. }) => {
                Err(self.wrong_plan())
            }
            (_, PartitionPlan::Layout { node, gpu, .. } | PartitionPlan::Share { node, gpu, .. }) => {
                st.gpu(node, *gpu).map(drop)
            }
            (_, PartitionPlan::Nothing { node }) => st.node_gpus(node).map(drop),
        }
    }

    /// A multi-node gang starts whole or not at all: every node-share is bound on its node,
    /// as a workload on one node is, before any holds its devices. `Started` of a gang carries
    /// no `bound` ([`tessera_backend::Bound`] names GPUs of one node), as the Kubernetes
    /// backend reports none for a gang's pods.
    async fn start(&self, spec: &RunSpec) -> Result<(), BackendError> {
        let generation = {
            let mut st = self.shared.lock();
            if st.runs.contains_key(&spec.id) {
                return Ok(());
            }
            let mut bindings = bind_start(&st, self.cfg.mode, spec)?;
            let bound = match &mut bindings[..] {
                [one] => one.bound.take(),
                _ => None,
            };
            let generation = st.next_generation();
            st.insert_run(Run {
                spec: spec.clone(),
                shares: bindings.into_iter().map(|b| Held::new(b.gpus, b.slice)).collect(),
                phase: Phase::Starting,
                since_ms: None,
                stopping: false,
                generation,
            });
            st.starts += 1;
            self.shared.send(BackendEvent::Started { id: spec.id, bound });
            generation
        };
        self.spawn_run(spec.id, generation, spec.duration, true);
        Ok(())
    }

    async fn stop(&self, id: u64, grace: Duration) -> Result<(), BackendError> {
        let generation = {
            let mut st = self.shared.lock();
            let Some(run) = st.runs.get_mut(&id) else {
                return Ok(());
            };
            run.stopping = true;
            run.generation
        };
        let wait = self.cfg.stop_time.min(grace);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        let mut st = self.shared.lock();
        if st.runs.get(&id).is_some_and(|r| r.generation == generation) {
            st.remove_run(id, Ended::Stopped);
        }
        Ok(())
    }

    async fn reconcile(&self, expected: &[RunSpec]) -> Result<ReconcileReport, BackendError> {
        let mut adopted = Vec::new();
        let report = {
            let mut st = self.shared.lock();
            let now = self.shared.clock.now_ms();
            let mut workloads = Vec::with_capacity(expected.len());
            for spec in expected {
                let seen = match (st.runs.get(&spec.id), st.ended.get(&spec.id)) {
                    (Some(run), _) => Some(match (broken(run), run.phase) {
                        (Some(detail), _) => Observation::Failed { detail },
                        (None, Phase::Starting) => Observation::Starting,
                        (None, Phase::Running) => Observation::Running { since_ms: run.since_ms },
                    }),
                    (None, Some(Ended::Succeeded)) => Some(Observation::Succeeded),
                    (None, Some(Ended::Stopped | Ended::Lost)) => Some(Observation::Unknown),
                    (None, None) => None,
                };
                let observation = match (seen, spec.running_since_ms) {
                    (Some(o), _) => o,
                    // Adopt only what Tessera saw running: nothing says an unknown workload
                    // without a start time was ever started.
                    (None, Some(since)) if self.cfg.adopt_unknown => {
                        let elapsed = Duration::from_millis((now - since).max(0) as u64);
                        match spec.duration {
                            Some(d) if d <= elapsed => Observation::Succeeded,
                            d => match self.adopt(&mut st, spec, since) {
                                Ok(generation) => {
                                    adopted.push((spec.id, generation, d.map(|d| d - elapsed)));
                                    Observation::Running { since_ms: Some(since) }
                                }
                                Err(e) => Observation::Failed {
                                    detail: format!("cannot adopt it after a control-plane restart: {e}"),
                                },
                            },
                        }
                    }
                    (None, _) => Observation::Unknown,
                };
                workloads.push((spec.id, observation));
            }
            let ids: HashSet<u64> = expected.iter().map(|s| s.id).collect();
            let mut orphans: Vec<Orphan> = st
                .runs
                .values()
                .filter(|r| !ids.contains(&r.spec.id))
                // One per workload, a multi-node gang's included (at its first node-share).
                .map(|r| {
                    let nodes: Vec<&str> = (0..r.shares.len()).map(|i| r.node(i)).collect();
                    let gang = match nodes.len() {
                        1 => String::new(),
                        n => format!(" (a gang of {n} node-shares)"),
                    };
                    Orphan {
                        id: Some(r.spec.id),
                        node: r.spec.node.clone(),
                        detail: format!(
                            "{} workload {} `{}` of {}/{} runs on {}{gang} but is not expected",
                            r.spec.kind,
                            r.spec.id,
                            r.spec.name,
                            r.spec.tenant,
                            r.spec.project,
                            nodes.join(", ")
                        ),
                    }
                })
                .collect();
            orphans.sort_by_key(|o| o.id);
            // Tessera no longer expects these, so it will not ask about them again.
            st.ended.retain(|id, _| ids.contains(id));
            // The instances of every MIG GPU: the configured layouts (operator), the instances
            // made for workloads (exact), which an upgraded node's validation compares.
            let layouts = st
                .gpus
                .iter()
                .filter(|g| g.gpu.mig_slices > 0)
                .map(|g| (g.gpu.node.clone(), g.gpu.index, g.instances.clone()))
                .collect();
            ReconcileReport {
                workloads,
                orphans,
                layouts,
            }
        };
        for (id, generation, remaining) in adopted {
            self.spawn_run(id, generation, remaining, false);
        }
        Ok(report)
    }

    /// Each call subscribes anew and the latest subscriber gets the events — the simulated
    /// fleet outlives a control plane restarted in the same process, as hardware outlives a
    /// crashed one. Also starts the subscriber's periodic `Telemetry` events, so it must be
    /// called inside a Tokio runtime.
    /// Exact mode only (operator mode stands for a cluster whose MIG manager owns the mode):
    /// flips the GPU's mode at once; refused while the GPU holds work or instances.
    async fn set_mig_mode(&self, node: &str, gpu: u8, enabled: bool) -> Result<MigModeChange, BackendError> {
        if self.cfg.mode != SimMode::Exact {
            return Err(BackendError::Rejected(
                "in operator mode the GPU Operator's MIG manager owns MIG mode".into(),
            ));
        }
        let mut st = self.shared.lock();
        let g = st.gpu(node, gpu)?;
        let name = st.gpu_name(g);
        let gs = &mut st.gpus[g];
        if gs.gpu.mig_slices == 0 {
            return Err(BackendError::Rejected(format!("{name} ({}) has no MIG", gs.gpu.model)));
        }
        if gs.mig_off != enabled {
            return Ok(MigModeChange::Applied);
        }
        if !gs.holders.is_empty() || !gs.instances.is_empty() {
            return Err(BackendError::Rejected(format!(
                "{name} holds {} workload(s) and {} MIG instance(s); MIG mode changes only on an idle GPU",
                gs.holders.len(),
                gs.instances.len()
            )));
        }
        gs.mig_off = !enabled;
        Ok(MigModeChange::Applied)
    }

    fn take_events(&self) -> Option<mpsc::UnboundedReceiver<BackendEvent>> {
        let (tx, rx) = mpsc::unbounded_channel();
        *self.shared.tx.lock().expect("events lock") = tx.clone();
        self.spawn_telemetry(tx);
        Some(rx)
    }
}
