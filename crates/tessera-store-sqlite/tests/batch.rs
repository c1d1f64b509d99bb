//! The lifecycle loop's group commit at its design load, on a file database (WAL,
//! `synchronous=FULL`). Two shapes of batch:
//!
//! * 500 creations and 500 updates, each with its events;
//! * the lifecycle's steady state: per workload an insert with 3 events, then (one batch later
//!   each) an update with 1 event, an update with 3 events that opens a usage interval and an
//!   update with 1 event that closes it, so that a batch holds four cohorts at different steps;
//!   with 20 and with 200 workloads per cohort, and with 20 whose creations carry their audit
//!   records in the batch.
//!
//! Each test checks that everything landed and prints the statements one batch runs (counted
//! from sqlx's statement log on a batch that is not timed) and how long the commits took:
//!
//! ```text
//! cargo test --release -p tessera-store-sqlite --test batch -- --nocapture
//! ```
//!
//! The tests take turns (see [`SERIAL`]) so that they neither share the two cores they are
//! meant to be measured on nor mix their statement counts.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tessera_domain::{
    Event, GpuSpec, Kind, Phase, Placement, Reason, ReasonCode, ShapeSpec, Slice, Step, UsageCursor, Workload,
    WorkloadId, WorkloadSpec,
};
use tessera_model::GpuUnits;
use tessera_store::{
    AuditRecord, AuditStore, Change, IdempotencyKey, LedgerStore, UsageInterval, WorkloadFilter, WorkloadStore,
};
use tessera_store_sqlite::SqliteStore;

const PER_KIND: u32 = 500;
const ROUNDS: usize = 5;

/// One measurement at a time, whichever test thread runs it.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// ----- counting statements -----------------------------------------------------------------

/// Counts the statements a commit runs while [`COUNTING`] is set: sqlx's statement log
/// (`sqlx::query`) and the store's own for the statements it runs on the connection's handle
/// (`tessera_store_sqlite::write`); `BEGIN` and `COMMIT` are not logged. sqlx's events are
/// emitted on its worker thread, so the subscriber is global; it asks to be consulted on every event (`Interest::sometimes`) so
/// that switching it off costs the timed batches one atomic load per statement.
struct StatementCounter;

/// The targets of the statement logs counted.
const COUNTED: [&str; 2] = ["sqlx::query", "tessera_store_sqlite::write"];

static COUNTING: AtomicBool = AtomicBool::new(false);
static STATEMENTS: AtomicU64 = AtomicU64::new(0);

impl tracing::Subscriber for StatementCounter {
    fn register_callsite(&self, m: &'static tracing::Metadata<'static>) -> tracing::subscriber::Interest {
        if COUNTED.contains(&m.target()) {
            tracing::subscriber::Interest::sometimes()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        COUNTED.contains(&m.target()) && COUNTING.load(Ordering::Relaxed)
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, _: &tracing::Event<'_>) {
        STATEMENTS.fetch_add(1, Ordering::Relaxed);
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

/// Commits `batch` and returns the number of statements it ran.
async fn counted_commit(store: &SqliteStore, batch: &[Change]) -> u64 {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| tracing::subscriber::set_global_default(StatementCounter).unwrap());
    STATEMENTS.store(0, Ordering::Relaxed);
    COUNTING.store(true, Ordering::Relaxed);
    store.commit(batch).await.unwrap();
    COUNTING.store(false, Ordering::Relaxed);
    STATEMENTS.load(Ordering::Relaxed)
}

// ----- fixtures ----------------------------------------------------------------------------

async fn fresh_store(name: &str) -> SqliteStore {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("cannot clear {}: {e}", dir.display()),
    }
    SqliteStore::open_dir(&dir).await.unwrap()
}

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
        movable: None,
        native: None,
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
        workload: w.clone().into(),
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

fn on_mig(w: &Workload) -> Placement {
    Placement {
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
    }
}

/// `w` placed on a MIG instance: the update and its event.
fn placed(w: &Workload, at: i64) -> Change {
    let mut p = w.clone();
    p.phase = Phase::Placed;
    p.reason = Some(Reason::new(ReasonCode::NoCapacity, "waited for a free 3g.40gb"));
    p.placement = Some(on_mig(w));
    p.next_seq = 3;
    Change::Update {
        events: vec![event(2, Step::Placed, at, None)],
        workload: p.into(),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

// ----- 500 creations and 500 updates -------------------------------------------------------

#[tokio::test]
async fn a_batch_of_500_creations_and_500_updates_commits_at_once() {
    let _turn = SERIAL.lock().await;
    let store = fresh_store("store-batch").await;

    // Round 0 only creates, so that every later round updates the previous round's work;
    // round 1 counts statements, the rest are timed.
    let mut previous: Vec<Workload> = Vec::new();
    let mut timings = Vec::new();
    let mut statements = 0;
    for round in 0..=ROUNDS + 1 {
        let at = 1_700_000_000_000 + round as i64 * 1000;
        let ids = store.reserve_workload_ids(PER_KIND).await.unwrap();
        let new: Vec<Workload> = ids.map(|id| created(id, at)).collect();
        let batch: Vec<Change> = new
            .iter()
            .map(insert)
            .chain(previous.iter().map(|w| placed(w, at)))
            .collect();
        match round {
            0 => store.commit(&batch).await.unwrap(),
            1 => statements = counted_commit(&store, &batch).await,
            _ => {
                assert_eq!(batch.len(), 2 * PER_KIND as usize);
                let started = Instant::now();
                store.commit(&batch).await.unwrap();
                timings.push(started.elapsed());
            }
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
    assert_eq!(all.len(), (ROUNDS + 2) * PER_KIND as usize);
    let placed_count = all.iter().filter(|w| w.phase == Phase::Placed).count();
    assert_eq!(placed_count, (ROUNDS + 1) * PER_KIND as usize);
    let sample = &all[all.len() - 1];
    assert_eq!(store.events(sample.id, None).await.unwrap().len(), 3);
    // 3,000 rows: 500 workloads, their keys and 1,000 events, 500 updates and their events.
    // Written one statement per row, they took 3,000 statements; grouped, a few per kind.
    assert!((1..=300).contains(&statements), "{statements} statements");

    timings.sort();
    eprintln!(
        "commit of {PER_KIND} inserts (2 events and an idempotency key each) + {PER_KIND} updates (1 event each), \
         file database: {statements} statements (+ BEGIN, COMMIT); {ROUNDS} rounds: min {:.1} ms, median {:.1} ms, \
         max {:.1} ms",
        ms(timings[0]),
        ms(timings[ROUNDS / 2]),
        ms(timings[ROUNDS - 1]),
    );
}

// ----- the lifecycle's steady state --------------------------------------------------------

/// The changes of one cohort of workloads at one step of its life (0: created, 1: placed,
/// 2: running, 3: succeeded), with the records the cohort has after it. Records go first, then
/// usage intervals, as the lifecycle orders a batch.
fn step(
    cohort: &[Workload],
    step: usize,
    at: i64,
    audit: bool,
    records: &mut Vec<Change>,
    usage: &mut Vec<Change>,
) -> Vec<Workload> {
    cohort
        .iter()
        .map(|w| {
            let mut next = w.clone();
            let seq = w.next_seq;
            let events = match step {
                0 => {
                    next.phase = Phase::Queued;
                    next.next_seq = 3;
                    let events = vec![
                        event(0, Step::Requested, at, None),
                        event(1, Step::Authorised, at, None),
                        event(2, Step::Queued, at, Some(ReasonCode::NoCapacity)),
                    ];
                    records.push(Change::Insert {
                        workload: next.clone().into(),
                        events,
                        idempotency: None,
                    });
                    if audit {
                        records.push(Change::Audit(AuditRecord {
                            seq: 0,
                            at,
                            request_id: format!("req-{}", w.id),
                            actor: "tok_ci".into(),
                            tenant: Some(w.spec.tenant.clone()),
                            action: "POST /api/v1/workloads".into(),
                            target: format!("workloads/{}", w.id),
                            outcome: 201,
                            detail: String::new(),
                        }));
                    }
                    return next;
                }
                1 => {
                    next.phase = Phase::Placed;
                    next.placement = Some(on_mig(w));
                    vec![event(seq, Step::Placed, at, None)]
                }
                2 => {
                    next.phase = Phase::Running;
                    next.running_at = Some(at);
                    next.usage = UsageCursor { seq: 0, open: true };
                    usage.push(Change::OpenUsage(UsageInterval {
                        workload: w.id,
                        seq: 0,
                        tenant: w.spec.tenant.clone(),
                        project: w.spec.project.clone(),
                        pool: "train".into(),
                        model: "A100-80GB".into(),
                        shape: "MIG 3g.40gb".into(),
                        units: w.units,
                        started_at: at,
                        ended_at: None,
                        util_avg: None,
                    }));
                    vec![
                        event(seq, Step::Partitioned, at, None),
                        event(seq + 1, Step::Running, at, None),
                        event(seq + 2, Step::Metered, at, None),
                    ]
                }
                _ => {
                    next.phase = Phase::Succeeded;
                    next.ended_at = Some(at);
                    next.usage = UsageCursor { seq: 1, open: false };
                    usage.push(Change::CloseUsage {
                        workload: w.id,
                        seq: 0,
                        ended_at: at,
                        util_avg: Some(0.75),
                    });
                    vec![event(seq, Step::Released, at, None)]
                }
            };
            next.next_seq = seq + events.len() as u32;
            records.push(Change::Update {
                workload: next.clone().into(),
                events,
            });
            next
        })
        .collect()
}

/// Runs batches of `per_cohort` creations (each with its audit record, if `audit`) plus the
/// next step of the three cohorts before them, times `timed` full batches, checks what they
/// stored and prints the measurement.
async fn lifecycle_batches(name: &str, per_cohort: u32, timed: usize, audit: bool) {
    let _turn = SERIAL.lock().await;
    let store = fresh_store(name).await;
    // The pipeline is full from batch 3 on; batch 3 counts statements, the later ones are timed.
    let batches = 3 + 1 + timed;
    let mut cohorts: Vec<Vec<Workload>> = Vec::new();
    let mut timings = Vec::new();
    let mut statements = 0;
    let mut changes_per_batch = 0;
    for b in 0..batches {
        let at = 1_700_000_000_000 + b as i64 * 1000;
        let ids = store.reserve_workload_ids(per_cohort).await.unwrap();
        cohorts.push(ids.map(|id| created(id, at)).collect());
        let (mut records, mut usage) = (Vec::new(), Vec::new());
        // Cohort i was created in batch i, so it takes step b - i now: the oldest of the last
        // four goes first (step 3), the newest is created (step 0).
        for (i, cohort) in cohorts.iter_mut().enumerate().skip((b + 1).saturating_sub(4)) {
            *cohort = step(cohort, b - i, at, audit, &mut records, &mut usage);
        }
        records.append(&mut usage);
        let batch = records;
        match b {
            0..3 => store.commit(&batch).await.unwrap(),
            3 => {
                changes_per_batch = batch.len();
                statements = counted_commit(&store, &batch).await;
            }
            _ => {
                assert_eq!(batch.len(), changes_per_batch);
                let started = Instant::now();
                store.commit(&batch).await.unwrap();
                timings.push(started.elapsed());
            }
        }
    }

    // Every cohort is where its last step left it, with its whole timeline and interval.
    let n = per_cohort as usize;
    let all = store
        .list_workloads(&WorkloadFilter {
            limit: 100_000,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(all.len(), batches * n);
    for (i, cohort) in cohorts.iter().enumerate() {
        for w in [&cohort[0], &cohort[n - 1]] {
            assert_eq!(store.get_workload(w.id, None).await.unwrap().as_ref(), Some(w));
            assert_eq!(store.events(w.id, None).await.unwrap().len() as u32, w.next_seq);
        }
        let usage = store.usage_of(cohort[0].id).await.unwrap();
        match batches - 1 - i {
            0 | 1 => assert!(usage.is_empty(), "cohort {i}: {usage:?}"),
            2 => assert!(usage.len() == 1 && usage[0].ended_at.is_none(), "cohort {i}: {usage:?}"),
            _ => assert!(usage.len() == 1 && usage[0].ended_at.is_some(), "cohort {i}: {usage:?}"),
        }
    }
    let succeeded = all.iter().filter(|w| w.phase == Phase::Succeeded).count();
    assert_eq!(succeeded, (batches - 3) * n);
    let audited = store.audit(None, None, 100_000).await.unwrap().len();
    assert_eq!(audited, if audit { batches * n } else { 0 });
    // Rows per workload: an insert with 3 events, 3 updates with 5 events between them, an
    // interval opened and closed (and an audit record). Once a statement each.
    let rows = per_cohort as u64 * if audit { 15 } else { 14 };
    assert!(
        (1..=rows / 10).contains(&statements),
        "{statements} statements for {rows} rows"
    );

    timings.sort();
    let median = timings[timed / 2];
    eprintln!(
        "lifecycle batch of {per_cohort} workloads per step ({changes_per_batch} changes: {per_cohort} inserts with \
         3 events{}, 3 × {per_cohort} updates with 1, 3 and 1 events, {per_cohort} usage opens and closes), file \
         database: {statements} statements (+ BEGIN, COMMIT); {timed} batches: min {:.2} ms, median {:.2} ms, \
         p90 {:.2} ms, max {:.2} ms; median {:.1} µs per workload step",
        if audit { " and an audit record" } else { "" },
        ms(timings[0]),
        ms(median),
        ms(timings[timed * 9 / 10]),
        ms(timings[timed - 1]),
        median.as_secs_f64() * 1e6 / (4 * per_cohort) as f64,
    );
}

#[tokio::test]
async fn lifecycle_batches_of_20_workloads_per_step() {
    lifecycle_batches("store-batch-lifecycle-20", 20, 60, false).await;
}

#[tokio::test]
async fn lifecycle_batches_of_200_workloads_per_step() {
    lifecycle_batches("store-batch-lifecycle-200", 200, 15, false).await;
}

#[tokio::test]
async fn lifecycle_batches_of_20_workloads_per_step_with_their_audit_records() {
    lifecycle_batches("store-batch-lifecycle-20-audit", 20, 60, true).await;
}
