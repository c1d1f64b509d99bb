//! Fencing, deterministically: a lifecycle loop started with the lease's epoch commits while
//! its replica holds the lease, and once another replica holds it, every batch it tries is
//! refused by PostgreSQL and the loop stops by itself — nothing it decided after that is
//! stored. (The process-level tests in `crates/tessera/tests/ha.rs` pause a real leader.)

use std::sync::Arc;
use std::time::Duration;

use tessera_backend::Backend;
use tessera_backend_sim::{SimBackend, SimConfig};
use tessera_domain::{GpuSpec, Kind, Phase, ShapeSpec, WorkloadId, WorkloadSpec};
use tessera_model::Fleet;
use tessera_sched::Engine;
use tessera_sched::cycle::{GovernConfig, Scheduler};
use tessera_server::lifecycle::{Lifecycle, LifecycleError, LoopConfig, NewWorkload, Settings, placement};
use tessera_server::metrics::Metrics;
use tessera_store::{Fence, Store, WorkloadFilter};
use tessera_store_postgres::PgStore;

fn spec(name: &str) -> WorkloadSpec {
    WorkloadSpec {
        tenant: "vision".into(),
        project: "train".into(),
        name: name.into(),
        kind: Kind::Batch,
        shape: ShapeSpec {
            gpu: GpuSpec::Whole { gpus: 1 },
            models: vec![],
            pool: None,
        },
        cpu_milli: 1000,
        memory_mib: 1024,
        duration_s: Some(600),
        command: None,
        image: None,
        env: Default::default(),
        priority: "standard".into(),
        no_wait: false,
        no_requeue: false,
        movable: None,
    }
}

fn new_workload(fleet: &Fleet, name: &str) -> NewWorkload {
    let spec = spec(name);
    NewWorkload {
        request: placement::engine_request(fleet, &spec.shape, spec.cpu_milli, spec.memory_mib).unwrap(),
        spec,
        actor: "tok-test".into(),
        role: "platform-admin".into(),
        idempotency: None,
        received_at: tessera_server::now_ms(),
        audit: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_whose_lease_was_taken_over_commits_nothing_and_stops() {
    let store: Arc<dyn Store> = Arc::new(PgStore::connect(&tessera_testdb::database_url()).await.unwrap());
    let fleet = Arc::new(Fleet::seed());
    let backend: Arc<dyn Backend> = Arc::new(SimBackend::new(SimConfig::default(), tessera_server::sim_gpus(&fleet)));
    let f = fleet.clone();
    let cfg = LoopConfig {
        fleet: fleet.clone(),
        factory: Arc::new(move || {
            let p = tessera_sched::replay::make_policy("tessera", &[]).unwrap();
            Scheduler::new(Engine::new(f.clone(), p, 1), GovernConfig::default())
        }),
        store: store.clone(),
        backend,
        settings: Settings::default(),
        metrics: Arc::new(Metrics::new()),
    };
    let lc = Lifecycle::new(fleet.clone());

    let epoch = store.acquire_lease("a", "http://a", 1_000).await.unwrap().unwrap();
    let leading = lc
        .lead(
            &cfg,
            Some(Fence {
                holder: "a".into(),
                epoch,
            }),
        )
        .await
        .unwrap();
    assert!(lc.is_leading());
    let (first, created) = lc.create(new_workload(&fleet, "while-leading")).await.unwrap();
    assert!(created);
    assert_eq!(
        store.get_workload(first.id, None).await.unwrap().map(|w| w.phase),
        Some(first.phase),
        "committed while the lease is held"
    );

    // Nobody renews `a`'s lease: it expires, and `b` acquires it.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let taken = store.acquire_lease("b", "http://b", 60_000).await.unwrap();
    assert_eq!(taken, Some(epoch + 1));

    let r = lc.create(new_workload(&fleet, "after-the-takeover")).await;
    assert!(matches!(r, Err(LifecycleError::Unavailable(_))), "{r:?}");
    let r = lc.cancel(first.id, "tok-test".into()).await;
    assert!(matches!(r, Err(LifecycleError::Unavailable(_))), "{r:?}");
    for _ in 0..100 {
        if leading.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(leading.is_finished(), "a fenced loop stops by itself");
    drop(leading);
    assert!(!lc.is_leading());
    assert!(
        lc.workload(first.id).is_none(),
        "a replica that does not lead reads the store"
    );

    // Nothing after the takeover is stored: one workload, not cancelled.
    let all = store
        .list_workloads(&WorkloadFilter {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(all.iter().map(|w| w.id).collect::<Vec<WorkloadId>>(), vec![first.id]);
    assert_ne!(all[0].phase, Phase::Cancelled);
    assert_ne!(all[0].phase, Phase::Stopping);
    let steps = store.events(first.id, None).await.unwrap();
    assert!(
        steps.iter().all(|e| e.step != tessera_domain::Step::Cancelled),
        "{steps:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_rebuilds_from_the_store() {
    // The loop of the next epoch sees what the previous one committed.
    let store: Arc<dyn Store> = Arc::new(PgStore::connect(&tessera_testdb::database_url()).await.unwrap());
    let fleet = Arc::new(Fleet::seed());
    let f = fleet.clone();
    let cfg = |backend: Arc<dyn Backend>| LoopConfig {
        fleet: fleet.clone(),
        factory: {
            let f = f.clone();
            Arc::new(move || {
                let p = tessera_sched::replay::make_policy("tessera", &[]).unwrap();
                Scheduler::new(Engine::new(f.clone(), p, 1), GovernConfig::default())
            })
        },
        store: store.clone(),
        backend,
        settings: Settings::default(),
        metrics: Arc::new(Metrics::new()),
    };
    let sim = |fleet: &Fleet| -> Arc<dyn Backend> {
        Arc::new(SimBackend::new(SimConfig::default(), tessera_server::sim_gpus(fleet)))
    };
    let a = Lifecycle::new(fleet.clone());
    let e1 = store.acquire_lease("a", "http://a", 60_000).await.unwrap().unwrap();
    let leading = a
        .lead(
            &cfg(sim(&fleet)),
            Some(Fence {
                holder: "a".into(),
                epoch: e1,
            }),
        )
        .await
        .unwrap();
    let (w, _) = a.create(new_workload(&fleet, "survives")).await.unwrap();
    drop(leading);
    store.release_lease("a", e1).await.unwrap();

    let b = Lifecycle::new(fleet.clone());
    let e2 = store.acquire_lease("b", "http://b", 60_000).await.unwrap().unwrap();
    let _leading = b
        .lead(
            &cfg(sim(&fleet)),
            Some(Fence {
                holder: "b".into(),
                epoch: e2,
            }),
        )
        .await
        .unwrap();
    let seen = b.workload(w.id).expect("the new leader holds the workload");
    assert!(!seen.phase.is_terminal(), "{:?}", seen.phase);
    // The new leader's engine holds its allocation: a cancellation releases it.
    let cancelled = b.cancel(w.id, "tok-test".into()).await.unwrap();
    assert!(
        matches!(cancelled.phase, Phase::Stopping | Phase::Cancelled),
        "{:?}",
        cancelled.phase
    );
}
