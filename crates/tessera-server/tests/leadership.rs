//! Fencing, deterministically: a lifecycle loop started with the lease's epoch commits while
//! its replica holds the lease, and once another replica holds it, every batch it tries is
//! refused by PostgreSQL and the loop stops by itself — nothing it decided after that is
//! stored. (The process-level tests in `crates/tessera/tests/ha.rs` pause a real leader.)

use std::sync::Arc;
use std::time::Duration;

use crate::support::poll;
use tessera_backend_sim::{SimBackend, SimConfig};
use tessera_domain::{GpuSpec, Phase, WorkloadId};
use tessera_model::Fleet;
use tessera_sched::cycle::GovernConfig;
use tessera_server::lifecycle::{Leading, Lifecycle, LifecycleError, LoopConfig, NewWorkload, Settings};
use tessera_server::metrics::Metrics;
use tessera_store::{Fence, Store, WorkloadFilter};
use tessera_store_postgres::PgStore;

/// A one-GPU batch job of ten minutes, `name`, created by the platform admin.
fn new_workload(fleet: &Fleet, name: &str) -> NewWorkload {
    let spec = crate::support::workload_spec(name, GpuSpec::Whole { gpus: 1 }, None, Some(600), "standard");
    crate::support::new_workload(fleet, spec)
}

/// A store on a fresh PostgreSQL database.
async fn store() -> Arc<dyn Store> {
    Arc::new(PgStore::connect(&tessera_testdb::database_url()).await.unwrap())
}

/// A loop on `fleet` and `store` with a simulated backend of its own.
fn loop_config(fleet: &Arc<Fleet>, store: &Arc<dyn Store>) -> LoopConfig {
    LoopConfig {
        factory: crate::support::sched_factory(GovernConfig::default()),
        store: store.clone(),
        backend: Arc::new(SimBackend::new(
            SimConfig::default(),
            tessera_backend_sim::SimGpu::for_fleet(fleet),
        )),
        settings: Settings::default(),
        metrics: Arc::new(Metrics::new()),
    }
}

/// `lc` leads with `cfg`, fenced by the lease `holder` acquired at `epoch`.
async fn lead(lc: &Lifecycle, cfg: &LoopConfig, holder: &str, epoch: u64) -> Leading {
    lc.lead(
        cfg,
        Some(Fence {
            holder: holder.into(),
            epoch,
        }),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_whose_lease_was_taken_over_commits_nothing_and_stops() {
    let store = store().await;
    let fleet = Arc::new(Fleet::seed());
    let cfg = loop_config(&fleet, &store);
    let lc = Lifecycle::new(fleet.clone());

    let epoch = store.acquire_lease("a", "http://a", 1_000).await.unwrap().unwrap();
    let leading = lead(&lc, &cfg, "a", epoch).await;
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
    poll(100, Duration::from_millis(20), async || leading.is_finished(), |f| *f).await;
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
    let store = store().await;
    let fleet = Arc::new(Fleet::seed());
    let a = Lifecycle::new(fleet.clone());
    let e1 = store.acquire_lease("a", "http://a", 60_000).await.unwrap().unwrap();
    let leading = lead(&a, &loop_config(&fleet, &store), "a", e1).await;
    let (w, _) = a.create(new_workload(&fleet, "survives")).await.unwrap();
    drop(leading);
    store.release_lease("a", e1).await.unwrap();

    let b = Lifecycle::new(fleet.clone());
    let e2 = store.acquire_lease("b", "http://b", 60_000).await.unwrap().unwrap();
    let _leading = lead(&b, &loop_config(&fleet, &store), "b", e2).await;
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
