//! Databases written by schema version 1 (a JSON document per workload) keep their data: the
//! store converts their workloads into typed rows when it opens them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sqlx::Row;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use tessera_domain::{
    Event, GangSpec, GpuSpec, Kind, Phase, Placement, Reason, ReasonCode, ShapeSpec, Slice, Step, UsageCursor,
    Workload, WorkloadId, WorkloadSpec,
};
use tessera_model::GpuUnits;
use tessera_model::request::TopologyConstraint;
use tessera_store::{
    AuditRecord, AuditStore, Change, FleetStore, MoveCause, ServiceMoveRecord, StoreError, WorkloadStore,
};
use tessera_store_sqlite::{MIGRATOR, SqliteStore};

/// A fresh directory under cargo's scratch space for integration tests.
fn fresh_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("store-legacy")
        .join(name);
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("cannot clear {}: {e}", dir.display()),
    }
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn raw_pool(dir: &Path) -> SqlitePool {
    let opts = SqliteConnectOptions::new()
        .filename(dir.join("tessera.db"))
        .create_if_missing(true)
        .foreign_keys(true);
    SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(opts)
        .await
        .unwrap()
}

/// A database as version 1 left it: migrations 0001 to 0003 applied, and `rows` in it.
async fn version_1_database(dir: &Path, rows: &[&str]) {
    let pool = raw_pool(dir).await;
    MIGRATOR.run_to(3, &pool).await.unwrap();
    for sql in rows {
        sqlx::query(sqlx::AssertSqlSafe(*sql)).execute(&pool).await.unwrap();
    }
    pool.close().await;
}

async fn count(dir: &Path, table: &str) -> i64 {
    let pool = raw_pool(dir).await;
    let n = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
        .fetch_one(&pool)
        .await
        .unwrap()
        .get(0);
    pool.close().await;
    n
}

/// Running, on a MIG instance, metered now (its second interval is open).
const RUNNING_DOC: &str = r#"{"id":7,"tenant":"acme","project":"train","name":"resnet","kind":"batch",
"shape":{"mig":"3g.40gb","models":["A100-80GB"]},"cpu_milli":4000,"memory_mib":16384,
"command":["python","train.py"],"image":"registry.local/train:1","priority":"high","state":"running",
"borrowing":true,"units":"0.5","allocation":{"pool":"train","node":"node-01","model":"A100-80GB",
"gpus":[2],"kind":"mig","mig_profile":"3g.40gb","mig_profile_id":9,"mig_start":4,"mig_size":4,
"units_milli":500},"created_at":"2023-11-14T22:13:20.000Z","created_at_ms":1700000000000,
"running_at":"2023-11-14T22:13:25.000Z","running_at_ms":1700000005000,"request_to_running_ms":5000}"#;

/// Failed, on a fraction, with its reason and end time; its one interval is closed.
const FAILED_DOC: &str = r#"{"id":12,"tenant":"acme","project":"eval","name":"eval-1","kind":"service",
"shape":{"fraction":250,"gpu_memory_mib":8192,"pool":"shared"},"cpu_milli":1000,"memory_mib":2048,
"duration_s":3600,"priority":"standard","state":"failed","borrowing":false,"reason":"exited with status 1",
"units":"0.25","allocation":{"pool":"shared","node":"node-02","model":"L40S","gpus":[1],"kind":"fraction",
"milli":250,"gpu_memory_mib":8192,"units_milli":250},"created_at":"2023-11-14T22:15:00.000Z",
"created_at_ms":1700000100000,"running_at_ms":1700000101000,"ended_at":"2024-02-29T12:34:56.789Z"}"#;

/// Queued for whole GPUs, never run.
const QUEUED_DOC: &str = r#"{"id":30,"tenant":"globex","project":"p","name":"big","kind":"interactive",
"shape":{"gpus":8},"cpu_milli":32000,"memory_mib":262144,"priority":"standard","state":"queued",
"reason":"no-capacity: no node has 8 free GPUs","units":"8","created_at":"2023-11-14T22:16:40.000Z",
"created_at_ms":1700000200000}"#;

fn workload_row(id: u64, tenant: &str, project: &str, state: &str, doc: &str) -> String {
    format!(
        "INSERT INTO workloads (id, tenant, project, state, created_at, updated_at, doc) \
         VALUES ({id}, '{tenant}', '{project}', '{state}', 1, 2, '{doc}')"
    )
}

fn event_rows(id: u64, steps: &[&str]) -> Vec<String> {
    steps
        .iter()
        .enumerate()
        .map(|(seq, step)| {
            format!(
                "INSERT INTO workload_events (workload_id, seq, step, at, detail) VALUES ({id}, {seq}, '{step}', {}, 'old {step}')",
                1_700_000_000_000u64 + seq as u64
            )
        })
        .collect()
}

fn expected() -> [Workload; 3] {
    let running = Workload {
        id: WorkloadId(7),
        spec: WorkloadSpec {
            cpu_milli: 4000,
            memory_mib: 16_384,
            command: Some(vec!["python".into(), "train.py".into()]),
            image: Some("registry.local/train:1".into()),
            priority: "high".into(),
            ..WorkloadSpec::new(
                "acme",
                "train",
                "resnet",
                Kind::Batch,
                ShapeSpec {
                    gpu: GpuSpec::Mig {
                        profile: "3g.40gb".into(),
                    },
                    models: vec!["A100-80GB".into()],
                    pool: None,
                },
            )
        },
        units: GpuUnits(500),
        phase: Phase::Running,
        reason: None,
        placement: Some(Placement {
            pool: "train".into(),
            node: "node-01".into(),
            model: "A100-80GB".into(),
            gpus: vec![2],
            slice: Slice::Mig {
                profile: "3g.40gb".into(),
                profile_id: 9,
                start: 4,
                size: 4,
            },
            units: GpuUnits(500),
        }),
        shares: Vec::new(),
        borrowing: true,
        created_at: 1_700_000_000_000,
        running_at: Some(1_700_000_005_000),
        ended_at: None,
        stop: None,
        next_seq: 7,
        usage: UsageCursor { seq: 1, open: true },
    };
    let failed = Workload {
        id: WorkloadId(12),
        spec: WorkloadSpec {
            cpu_milli: 1000,
            memory_mib: 2048,
            duration_s: Some(3600),
            ..WorkloadSpec::new(
                "acme",
                "eval",
                "eval-1",
                Kind::Service,
                ShapeSpec {
                    gpu: GpuSpec::Fraction {
                        milli: 250,
                        memory_mib: Some(8192),
                    },
                    models: Vec::new(),
                    pool: Some("shared".into()),
                },
            )
        },
        units: GpuUnits(250),
        phase: Phase::Failed,
        reason: Some(Reason::new(ReasonCode::Unknown, "exited with status 1")),
        placement: Some(Placement {
            pool: "shared".into(),
            node: "node-02".into(),
            model: "L40S".into(),
            gpus: vec![1],
            slice: Slice::Fraction {
                milli: 250,
                gpu_memory_mib: Some(8192),
            },
            units: GpuUnits(250),
        }),
        shares: Vec::new(),
        borrowing: false,
        created_at: 1_700_000_100_000,
        running_at: Some(1_700_000_101_000),
        ended_at: Some(1_709_210_096_789),
        stop: None,
        next_seq: 3,
        usage: UsageCursor { seq: 1, open: false },
    };
    let queued = Workload {
        id: WorkloadId(30),
        spec: WorkloadSpec {
            cpu_milli: 32_000,
            memory_mib: 262_144,
            ..WorkloadSpec::new(
                "globex",
                "p",
                "big",
                Kind::Interactive,
                ShapeSpec {
                    gpu: GpuSpec::Whole { gpus: 8 },
                    models: Vec::new(),
                    pool: None,
                },
            )
        },
        units: GpuUnits(8000),
        phase: Phase::Queued,
        reason: Some(Reason::new(ReasonCode::Unknown, "no-capacity: no node has 8 free GPUs")),
        placement: None,
        shares: Vec::new(),
        borrowing: false,
        created_at: 1_700_000_200_000,
        running_at: None,
        ended_at: None,
        stop: None,
        next_seq: 2,
        usage: UsageCursor::default(),
    };
    [running, failed, queued]
}

#[tokio::test]
async fn version_1_workloads_become_typed_rows_with_their_timelines_and_ledger() {
    let dir = fresh_dir("converted");
    let mut rows = vec![
        workload_row(7, "acme", "train", "running", RUNNING_DOC),
        workload_row(12, "acme", "eval", "failed", FAILED_DOC),
        workload_row(30, "globex", "p", "queued", QUEUED_DOC),
        "INSERT INTO usage_intervals (workload_id, seq, tenant, project, pool, model, shape, units_milli, started_at, ended_at) \
         VALUES (7, 0, 'acme', 'train', 'train', 'A100-80GB', 'MIG 3g.40gb', 500, 10, 20)"
            .into(),
        "INSERT INTO usage_intervals (workload_id, seq, tenant, project, pool, model, shape, units_milli, started_at) \
         VALUES (7, 1, 'acme', 'train', 'train', 'A100-80GB', 'MIG 3g.40gb', 500, 30)"
            .into(),
        "INSERT INTO usage_intervals (workload_id, seq, tenant, project, pool, model, shape, units_milli, started_at, ended_at) \
         VALUES (12, 0, 'acme', 'eval', 'shared', 'L40S', '250 milli-GPU', 250, 10, 20)"
            .into(),
        "INSERT INTO idempotency_keys (actor, key, request_hash, workload_id, created_at) VALUES ('tok_a', 'k', 'h', 7, 1)"
            .into(),
        "INSERT INTO audit_log (seq, at, request_id, actor, tenant, action, target, outcome, detail) \
         VALUES (41, 1, 'r', 'tok_a', 'acme', 'POST /api/v1/workloads', 'workloads/7', 201, '')"
            .into(),
    ];
    rows.extend(event_rows(
        7,
        &[
            "requested",
            "authorised",
            "placed",
            "partitioned",
            "running",
            "observed",
            "metered",
        ],
    ));
    rows.extend(event_rows(12, &["requested", "authorised", "failed"]));
    rows.extend(event_rows(30, &["requested", "queued"]));
    let rows: Vec<&str> = rows.iter().map(String::as_str).collect();
    version_1_database(&dir, &rows).await;

    let store = SqliteStore::open_dir(&dir).await.unwrap();
    let [running, failed, queued] = expected();
    for w in [&running, &failed, &queued] {
        assert_eq!(store.get_workload(w.id, None).await.unwrap().as_ref(), Some(w));
    }
    assert_eq!(
        store.active_workloads().await.unwrap(),
        vec![running.clone(), queued.clone()]
    );
    let timeline = store.events(running.id, None).await.unwrap();
    assert_eq!(timeline.len(), 7);
    assert_eq!(
        timeline[4],
        Event {
            seq: 4,
            step: Step::Running,
            at: 1_700_000_000_004,
            detail: "old running".into(),
            code: None,
        }
    );
    assert_eq!(
        store.idempotent("tok_a", "k").await.unwrap(),
        Some(("h".into(), running.id))
    );
    assert_eq!(
        count(&dir, "workloads_v1").await,
        0,
        "converted rows leave the old table"
    );

    // The sequences continue after what version 1 handed out.
    assert_eq!(store.reserve_workload_ids(2).await.unwrap(), 31..33);
    let record = AuditRecord {
        seq: 0,
        at: 2,
        request_id: "r2".into(),
        actor: "tok_a".into(),
        tenant: None,
        action: "login".into(),
        target: String::new(),
        outcome: 200,
        detail: String::new(),
    };
    assert_eq!(store.append_audit(&[record]).await.unwrap(), vec![42]);

    // The converted workload's lifecycle goes on where version 1 left it.
    let mut ended = running.clone();
    ended.phase = Phase::Succeeded;
    ended.next_seq = 8;
    ended.usage = UsageCursor { seq: 2, open: false };
    store
        .commit(&[
            Change::Update {
                workload: ended.clone().into(),
                events: vec![Event {
                    seq: 7,
                    step: Step::Released,
                    at: 40,
                    detail: "exited 0".into(),
                    code: None,
                }],
            },
            Change::CloseUsage {
                workload: running.id,
                seq: 1,
                ended_at: 40,
                util_avg: None,
            },
        ])
        .await
        .unwrap();
    drop(store);

    // Opening again converts nothing twice.
    let store = SqliteStore::open_dir(&dir).await.unwrap();
    assert_eq!(store.get_workload(running.id, None).await.unwrap(), Some(ended));
    assert_eq!(store.active_workloads().await.unwrap(), vec![queued]);
    assert_eq!(count(&dir, "workloads").await, 3);
}

#[tokio::test]
async fn a_version_1_document_that_cannot_be_converted_converts_nothing() {
    let dir = fresh_dir("unconvertible");
    let bad = QUEUED_DOC.replace(r#""state":"queued""#, r#""state":"sleeping""#);
    version_1_database(
        &dir,
        &[
            &workload_row(7, "acme", "train", "running", RUNNING_DOC),
            &workload_row(30, "globex", "p", "sleeping", &bad),
        ],
    )
    .await;
    let r = SqliteStore::open_dir(&dir).await;
    match r {
        Err(StoreError::Corrupt(why)) => assert!(why.contains("workload 30") && why.contains("sleeping"), "{why}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(count(&dir, "workloads_v1").await, 2);
    assert_eq!(count(&dir, "workloads").await, 0);

    // Once the document is repaired, both convert.
    let pool = raw_pool(&dir).await;
    sqlx::query("UPDATE workloads_v1 SET doc = $1 WHERE id = 30")
        .bind(QUEUED_DOC)
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let store = SqliteStore::open_dir(&dir).await.unwrap();
    assert_eq!(store.active_workloads().await.unwrap().len(), 2);
}

/// A service move stored before moves recorded their cause (schema version 10) was a drain's:
/// the upgraded store reads it back as one, with no request it makes room for.
#[tokio::test]
async fn service_moves_of_version_10_read_back_as_drains() {
    let dir = fresh_dir("moves-v10");
    let pool = raw_pool(&dir).await;
    MIGRATOR.run_to(10, &pool).await.unwrap();
    sqlx::query("INSERT INTO service_moves (old_id, replacement_id, node) VALUES (4, 9, 'h100-01')")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let store = SqliteStore::open_dir(&dir).await.unwrap();
    assert_eq!(
        store.service_moves().await.unwrap(),
        vec![ServiceMoveRecord {
            old: WorkloadId(4),
            replacement: WorkloadId(9),
            node: "h100-01".into(),
            cause: MoveCause::Drain,
            by: None,
        }]
    );
}

/// A workload stored at schema version 14 (before gangs) reads back unchanged once the store
/// upgrades the database to the latest version: no gang, no node-shares; and the upgraded database
/// stores a placed gang with its node-shares.
#[tokio::test]
async fn workloads_of_version_14_keep_their_data_through_the_gang_migration() {
    let dir = fresh_dir("gangs-v14");
    let pool = raw_pool(&dir).await;
    MIGRATOR.run_to(14, &pool).await.unwrap();
    sqlx::query(
        "INSERT INTO workloads (id, tenant, project, name, kind, gpus, shape_models, shape_pool, cpu_milli, \
         memory_mib, env, priority, no_wait, no_requeue, units_milli, created_at, phase, borrowing, running_at, \
         updated_at, next_event_seq, usage_seq, usage_open, p_pool, p_node, p_model, p_gpus, p_slice, \
         p_units_milli) VALUES (41, 'acme', 'train', 'resnet', 'batch', 2, '[\"H100-80GB-SXM\"]', 'training', \
         4000, 16384, '{\"A\":\"1\"}', 'high', FALSE, TRUE, 2000, 1700000000000, 'running', TRUE, 1700000005000, \
         1700000005000, 4, 0, TRUE, 'training', 'h100-03', 'H100-80GB-SXM', 12, 'whole', 2000)",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("UPDATE sequences SET value = 41 WHERE name = 'workload'")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;

    let store = SqliteStore::open_dir(&dir).await.unwrap();
    let latest: i64 = sqlx::query("SELECT MAX(version) FROM _sqlx_migrations")
        .fetch_one(&raw_pool(&dir).await)
        .await
        .unwrap()
        .get(0);
    let newest = MIGRATOR.iter().map(|m| m.version).max().unwrap();
    assert_eq!(
        (latest, newest >= 18),
        (newest, true),
        "every migration after it ran too"
    );
    let want = Workload {
        id: WorkloadId(41),
        spec: WorkloadSpec {
            cpu_milli: 4000,
            memory_mib: 16_384,
            env: BTreeMap::from([("A".into(), "1".into())]),
            priority: "high".into(),
            no_requeue: true,
            ..WorkloadSpec::new(
                "acme",
                "train",
                "resnet",
                Kind::Batch,
                ShapeSpec {
                    gpu: GpuSpec::Whole { gpus: 2 },
                    models: vec!["H100-80GB-SXM".into()],
                    pool: Some("training".into()),
                },
            )
        },
        units: GpuUnits(2000),
        phase: Phase::Running,
        reason: None,
        placement: Some(Placement {
            pool: "training".into(),
            node: "h100-03".into(),
            model: "H100-80GB-SXM".into(),
            gpus: vec![2, 3],
            slice: Slice::Whole,
            units: GpuUnits(2000),
        }),
        shares: Vec::new(),
        borrowing: true,
        created_at: 1_700_000_000_000,
        running_at: Some(1_700_000_005_000),
        ended_at: None,
        stop: None,
        next_seq: 4,
        usage: UsageCursor { seq: 0, open: true },
    };
    assert_eq!(
        store.get_workload(WorkloadId(41), None).await.unwrap(),
        Some(want.clone())
    );
    assert_eq!(store.active_workloads().await.unwrap(), vec![want.clone()]);

    // A gang beside it, placed on two nodes.
    let id = WorkloadId(store.reserve_workload_ids(1).await.unwrap().start);
    assert_eq!(id, WorkloadId(42));
    let share = |node: &str| Placement {
        node: node.into(),
        gpus: (0..8).collect(),
        units: GpuUnits::whole(8),
        ..want.placement.clone().unwrap()
    };
    let gang = Workload {
        id,
        spec: WorkloadSpec {
            name: "llm".into(),
            shape: ShapeSpec {
                gpu: GpuSpec::Gang(GangSpec {
                    gpus: 16,
                    gpus_per_node: Some(8),
                    topology: Some(TopologyConstraint::preferred("rack")),
                    segment: None,
                    remainder: false,
                }),
                ..want.spec.shape.clone()
            },
            ..want.spec.clone()
        },
        units: GpuUnits::whole(16),
        phase: Phase::Placed,
        placement: Some(share("h100-04")),
        shares: vec![share("h100-05")],
        running_at: None,
        next_seq: 0,
        usage: UsageCursor::default(),
        ..want.clone()
    };
    store
        .commit(&[Change::Insert {
            workload: gang.clone().into(),
            events: Vec::new(),
            idempotency: None,
        }])
        .await
        .unwrap();
    assert_eq!(store.active_workloads().await.unwrap(), vec![want, gang]);
}
