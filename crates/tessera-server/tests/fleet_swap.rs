//! A fleet that changes while the lifecycle loop runs, as a backend that discovers its nodes
//! (Kubernetes) reports it (`BackendEvent::FleetChanged`): a node that joins receives work
//! without a restart, a node whose GPUs change is followed, a node that leaves loses its work
//! (failed as lost, as when its pods are), and one that comes back takes work again. Through every swap the
//! engine is rebuilt from the store and running work keeps its placement, node by name, although
//! the new fleets number their nodes and pools differently.
//!
//! The backend is the simulated one (it knows every node any of these fleets has) behind an event
//! stream the test adds the backend's node news to.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::TempDir;
use async_trait::async_trait;
use tessera_backend::{
    Backend, BackendError, BackendEvent, Capabilities, NodeChange, PartitionPlan, PartitionReport, ReconcileReport,
    RunSpec,
};
use tessera_backend_sim::{SimBackend, SimConfig};
use tessera_domain::{GpuSpec, Phase, ReasonCode, Workload, WorkloadId, WorkloadSpec};
use tessera_model::Fleet;
use tessera_sched::cycle::GovernConfig;
use tessera_server::lifecycle::Lifecycle;
use tessera_store::Store;
use tessera_store_sqlite::SqliteStore;
use tokio::sync::mpsc;

/// The simulated backend with node news the test sends.
struct Discovering {
    sim: Arc<SimBackend>,
    events: Mutex<Option<mpsc::UnboundedReceiver<BackendEvent>>>,
}

#[async_trait]
impl Backend for Discovering {
    fn name(&self) -> &'static str {
        "discovering"
    }
    fn capabilities(&self) -> Capabilities {
        self.sim.capabilities()
    }
    async fn partition(&self, plan: &PartitionPlan) -> Result<PartitionReport, BackendError> {
        self.sim.partition(plan).await
    }
    async fn unpartition(&self, plan: &PartitionPlan) -> Result<(), BackendError> {
        self.sim.unpartition(plan).await
    }
    async fn start(&self, spec: &RunSpec) -> Result<(), BackendError> {
        self.sim.start(spec).await
    }
    async fn stop(&self, id: u64, grace: Duration) -> Result<(), BackendError> {
        self.sim.stop(id, grace).await
    }
    async fn reconcile(&self, expected: &[RunSpec]) -> Result<ReconcileReport, BackendError> {
        self.sim.reconcile(expected).await
    }
    fn take_events(&self) -> Option<mpsc::UnboundedReceiver<BackendEvent>> {
        self.events.lock().unwrap().take()
    }
}

/// A fleet of H100 nodes: (pool, node, GPUs), pools in the order given.
fn fleet(nodes: &[(&str, &str, u8)]) -> Fleet {
    let mut toml = String::new();
    let mut pools: Vec<&str> = Vec::new();
    for (p, _, _) in nodes {
        if !pools.contains(p) {
            pools.push(p);
        }
    }
    for p in pools {
        toml.push_str(&format!("[[pool]]\nname = \"{p}\"\nsharing = \"whole\"\n\n"));
        for (_, n, g) in nodes.iter().filter(|(q, _, _)| *q == p) {
            toml.push_str(&format!(
                "[[pool.nodes]]\nname = \"{n}\"\ngpu_model = \"H100-80GB-SXM\"\ngpus = {g}\ncpus = 64\nmemory_gib = 512\n\n"
            ));
        }
    }
    Fleet::from_toml(&toml, "test").unwrap()
}

fn whole(name: &str, gpus: u8) -> WorkloadSpec {
    crate::support::workload_spec(name, GpuSpec::Whole { gpus }, None, None, "standard")
}

async fn wait_for(lc: &Lifecycle, id: WorkloadId, what: &str, ok: impl Fn(&Workload) -> bool) -> Arc<Workload> {
    for _ in 0..400 {
        if let Some(w) = lc.workload(id)
            && ok(&w)
        {
            return w;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("workload {id}: never {what}: {:?}", lc.workload(id));
}

fn node_of(w: &Workload) -> Option<(&str, &[u8])> {
    w.placement.as_ref().map(|p| (p.node.as_str(), p.gpus.as_slice()))
}

/// The GPUs the published snapshot shows on `node`, and how many of them hold work.
fn shown(lc: &Lifecycle, node: &str) -> Option<(usize, usize)> {
    let s = lc.snapshot();
    let n = s.fleet.node_by_name(node)?;
    let gpus = &s.nodes[n.0 as usize].gpus;
    assert_eq!(
        gpus.len(),
        s.fleet.node(n).gpus as usize,
        "the snapshot's nodes follow its fleet"
    );
    Some((gpus.len(), gpus.iter().filter(|g| !g.holders.is_empty()).count()))
}

async fn until(what: &str, ok: impl Fn() -> bool) {
    for _ in 0..400 {
        if ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("never: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_that_join_change_and_leave_are_followed_by_name() {
    let one = fleet(&[("training", "b-0", 8)]);
    // The joining node's pool comes first: every index of `one` moves.
    let two = fleet(&[("burst", "a-0", 8), ("training", "b-0", 8)]);
    let shrunk = fleet(&[("burst", "a-0", 4), ("training", "b-0", 8)]);
    let dir = TempDir::new("fleet-swap");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(&dir.0).await.unwrap());
    let sim = Arc::new(SimBackend::new(
        SimConfig::default(),
        tessera_backend_sim::SimGpu::for_fleet(&two),
    ));
    let (news, events) = mpsc::unbounded_channel();
    let mut sim_events = sim.take_events().unwrap();
    let forward = news.clone();
    tokio::spawn(async move {
        while let Some(e) = sim_events.recv().await {
            let _ = forward.send(e);
        }
    });
    let backend = Arc::new(Discovering {
        sim: sim.clone(),
        events: Mutex::new(Some(events)),
    });
    let govern = GovernConfig {
        min_runtime_ms: 0,
        reclaim_after_ms: 0,
        ..Default::default()
    };
    let lc = crate::support::start_loop(Arc::new(one.clone()), govern, store.clone(), backend).await;
    let create = |spec: WorkloadSpec| {
        let lc = lc.clone();
        async move {
            let (w, _) = lc
                .create(crate::support::new_workload(&lc.fleet(), spec))
                .await
                .unwrap();
            w.id
        }
    };

    // The only node is full; an 8-GPU request waits.
    let first = create(whole("first", 8)).await;
    let running = wait_for(&lc, first, "running on b-0", |w| w.phase == Phase::Running).await;
    let placed = running.placement.clone().unwrap();
    assert_eq!(placed.node, "b-0");
    let second = create(whole("second", 8)).await;
    wait_for(&lc, second, "waiting", |w| w.phase.is_waiting()).await;

    // A node joins: the waiting request is placed there, without a restart.
    let _ = news.send(BackendEvent::NodeChanged {
        node: "a-0".into(),
        change: NodeChange::Added,
    });
    let _ = news.send(BackendEvent::FleetChanged {
        fleet: Arc::new(two.clone()),
    });
    let w = wait_for(&lc, second, "running on the new node", |w| w.phase == Phase::Running).await;
    assert_eq!(node_of(&w).unwrap().0, "a-0");
    assert_eq!(
        lc.fleet().nodes.len(),
        2,
        "the API checks requests against the new fleet"
    );
    assert_eq!(shown(&lc, "a-0"), Some((8, 8)));
    // The running workload kept its node and GPUs (b-0 is node 1 now, it was node 0).
    let w = lc.workload(first).unwrap();
    assert_eq!(w.phase, Phase::Running);
    assert_eq!(w.placement.as_ref(), Some(&placed));
    assert_eq!(shown(&lc, "b-0"), Some((8, 8)));
    // The new node's GPUs change (fewer advertised): once its work is gone, a 4-GPU request
    // fits there and the snapshot shows 4 GPUs.
    lc.cancel(second, "tok-test".into()).await.unwrap();
    wait_for(&lc, second, "cancelled", |w| w.phase == Phase::Cancelled).await;
    // A request resolved against the old fleet's numbering (its pool 0, `training`, is `burst`
    // in the new one, where a GPU is free now) is resolved again by the loop, by name.
    let late = lc
        .create(crate::support::new_workload(
            &one,
            crate::support::workload_spec("pooled", GpuSpec::Whole { gpus: 1 }, Some("training"), None, "standard"),
        ))
        .await
        .unwrap()
        .0;
    let w = wait_for(&lc, late.id, "decided", |w| {
        w.phase.is_waiting() || w.placement.is_some()
    })
    .await;
    assert!(w.phase.is_waiting() && w.placement.is_none(), "training is full: {w:?}");
    lc.cancel(late.id, "tok-test".into()).await.unwrap();
    wait_for(&lc, late.id, "cancelled", |w| w.phase == Phase::Cancelled).await;
    let _ = news.send(BackendEvent::NodeChanged {
        node: "a-0".into(),
        change: NodeChange::Capacity,
    });
    let _ = news.send(BackendEvent::FleetChanged {
        fleet: Arc::new(shrunk.clone()),
    });
    until("the snapshot shows a-0 with 4 GPUs", || {
        shown(&lc, "a-0") == Some((4, 0))
    })
    .await;
    let third = create(whole("third", 4)).await;
    let w = wait_for(&lc, third, "running on a-0", |w| w.phase == Phase::Running).await;
    assert_eq!(node_of(&w), Some(("a-0", &[0, 1, 2, 3][..])));
    assert_eq!(lc.workload(first).unwrap().placement.as_ref(), Some(&placed));

    // The node leaves: its work is lost (failed, as when its pods are lost); the workload
    // elsewhere runs on.
    let _ = news.send(BackendEvent::NodeChanged {
        node: "a-0".into(),
        change: NodeChange::Removed,
    });
    let _ = news.send(BackendEvent::FleetChanged {
        fleet: Arc::new(one.clone()),
    });
    until("the snapshot has no a-0", || shown(&lc, "a-0").is_none()).await;
    let mut gone = None;
    for _ in 0..400 {
        gone = store.get_workload(third, None).await.unwrap();
        if gone.as_ref().is_some_and(|w| w.phase.is_terminal()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let gone = gone.unwrap();
    assert_eq!(gone.phase, Phase::Failed, "{gone:?}");
    let reason = gone.reason.clone().unwrap();
    assert_eq!(reason.code, ReasonCode::Lost, "{reason:?}");
    assert!(reason.detail.contains("node a-0 left the cluster"), "{reason:?}");
    assert!(lc.fleet().node_by_name("a-0").is_none());
    // What ran there is gone with the node: the simulator, which was not told, forgets it too
    // (it refuses to start work on GPUs it still thinks are held).
    sim.forget(third.0);
    let w = lc.workload(first).unwrap();
    assert_eq!((w.phase, w.placement.as_ref()), (Phase::Running, Some(&placed)));
    assert_eq!(shown(&lc, "b-0"), Some((8, 8)));

    // It comes back: it takes work again.
    let _ = news.send(BackendEvent::NodeChanged {
        node: "a-0".into(),
        change: NodeChange::Added,
    });
    let _ = news.send(BackendEvent::FleetChanged {
        fleet: Arc::new(shrunk.clone()),
    });
    until("the snapshot shows a-0 again", || shown(&lc, "a-0") == Some((4, 0))).await;
    let fourth = create(whole("fourth", 4)).await;
    let w = wait_for(&lc, fourth, "running on a-0 again", |w| w.phase == Phase::Running).await;
    assert_eq!(node_of(&w).unwrap().0, "a-0");
    assert_eq!(lc.workload(first).unwrap().placement.as_ref(), Some(&placed));
}
