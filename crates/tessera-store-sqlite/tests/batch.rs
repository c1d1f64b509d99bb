//! The lifecycle loop's group commit at its design load: one batch of 500 creations and 500
//! updates, each with its events, on a file database (WAL, `synchronous=FULL`). The test
//! checks that the whole batch lands and prints how long the commits took:
//!
//! ```text
//! cargo test --release -p tessera-store-sqlite --test batch -- --nocapture
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tessera_domain::{
    Event, GpuSpec, Kind, Phase, Placement, Reason, ReasonCode, ShapeSpec, Slice, Step, Workload, WorkloadId,
    WorkloadSpec,
};
use tessera_model::GpuUnits;
use tessera_store::{Change, IdempotencyKey, WorkloadFilter, WorkloadStore};
use tessera_store_sqlite::SqliteStore;

const PER_KIND: u32 = 500;
const ROUNDS: usize = 5;

fn created(id: u64, at: i64) -> Workload {
    let spec = WorkloadSpec {
        tenant: format!("tenant-{}", id % 7),
        project: "train".into(),
        name: format!("job-{id}"),
        kind: Kind::Batch,
        shape: ShapeSpec {
            gpu: GpuSpec::Mig {
                profile: "3g.40gb".into(),
            },
            models: vec!["A100-80GB".into()],
            pool: Some("train".into()),
        },
        cpu_milli: 4000,
        memory_mib: 16_384,
        duration_s: Some(600),
        command: Some(vec!["python".into(), "train.py".into(), format!("--seed={id}")]),
        image: Some("registry.local/train:1".into()),
        env: BTreeMap::from([("EPOCHS".into(), "3".into())]),
        priority: "standard".into(),
        no_wait: false,
        no_requeue: false,
    };
    let mut w = Workload::new(WorkloadId(id), spec, GpuUnits(500), at);
    w.next_seq = 2;
    w
}

fn event(seq: u32, step: Step, at: i64, code: Option<ReasonCode>) -> Event {
    Event {
        seq,
        step,
        at,
        detail: format!("{step} at {at}"),
        code,
    }
}

fn insert(w: &Workload) -> Change {
    Change::Insert {
        workload: w.clone(),
        events: vec![
            event(0, Step::Requested, w.created_at, None),
            event(1, Step::Authorised, w.created_at, None),
        ],
        idempotency: Some(IdempotencyKey {
            actor: "tok_ci".into(),
            key: format!("create-{}", w.id),
            request_hash: format!("{:064x}", w.id.0),
        }),
    }
}

/// `w` placed on a MIG instance: the update and its event.
fn placed(w: &Workload, at: i64) -> Change {
    let mut p = w.clone();
    p.phase = Phase::Placed;
    p.reason = Some(Reason::new(ReasonCode::NoCapacity, "waited for a free 3g.40gb"));
    p.placement = Some(Placement {
        pool: "train".into(),
        node: format!("node-{:02}", w.id.0 % 32),
        model: "A100-80GB".into(),
        gpus: vec![(w.id.0 % 8) as u8],
        slice: Slice::Mig {
            profile: "3g.40gb".into(),
            profile_id: 9,
            start: 4,
            size: 4,
        },
        units: GpuUnits(500),
    });
    p.next_seq = 3;
    Change::Update {
        events: vec![event(2, Step::Placed, at, None)],
        workload: p,
    }
}

#[tokio::test]
async fn a_batch_of_500_creations_and_500_updates_commits_at_once() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("store-batch");
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("cannot clear {}: {e}", dir.display()),
    }
    let store = SqliteStore::open_dir(&dir).await.unwrap();

    // Round 0 only creates, so that every measured round updates the previous round's work.
    let mut previous: Vec<Workload> = Vec::new();
    let mut timings = Vec::new();
    for round in 0..=ROUNDS {
        let at = 1_700_000_000_000 + round as i64 * 1000;
        let ids = store.reserve_workload_ids(PER_KIND).await.unwrap();
        let new: Vec<Workload> = ids.map(|id| created(id, at)).collect();
        let batch: Vec<Change> = new
            .iter()
            .map(insert)
            .chain(previous.iter().map(|w| placed(w, at)))
            .collect();
        let started = Instant::now();
        store.commit(&batch).await.unwrap();
        if round > 0 {
            assert_eq!(batch.len(), 2 * PER_KIND as usize);
            timings.push(started.elapsed());
        }
        previous = new;
    }

    let all = store
        .list_workloads(&WorkloadFilter {
            limit: 10_000,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(all.len(), (ROUNDS + 1) * PER_KIND as usize);
    let placed_count = all.iter().filter(|w| w.phase == Phase::Placed).count();
    assert_eq!(placed_count, ROUNDS * PER_KIND as usize);
    let sample = &all[all.len() - 1];
    assert_eq!(store.events(sample.id, None).await.unwrap().len(), 3);

    timings.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    eprintln!(
        "commit of {PER_KIND} inserts (2 events and an idempotency key each) + {PER_KIND} updates (1 event each), \
         file database, {ROUNDS} rounds: min {:.1} ms, median {:.1} ms, max {:.1} ms",
        ms(timings[0]),
        ms(timings[ROUNDS / 2]),
        ms(timings[ROUNDS - 1]),
    );
}
