//! What the conformance suite does not show: the durability settings of a file database,
//! sequences shared by every store (process) that opens the same file and surviving restarts,
//! the store held the way the server holds it, as an `Arc<dyn Store>` shared by tasks, the
//! failing change a failed batch names although its rows are written many to a statement, and
//! gang rows: malformed ones named as corrupt, node-shares the columns cannot hold refused; and
//! checkpoints kept out of commits.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use sqlx::Row;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use tessera_domain::{Event, GpuSpec, Kind, Phase, ShapeSpec, Slice, Step, Workload, WorkloadId, WorkloadSpec};
use tessera_model::GpuUnits;
use tessera_store::conformance::{assert_reads_corrupt, login_audit, placed_gang};
use tessera_store::{AuditStore, Change, IdempotencyKey, Store, StoreError, TenancyStore, TenantRecord, WorkloadStore};
use tessera_store_sqlite::SqliteStore;

fn fresh_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("store-sqlite")
        .join(name);
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("cannot clear {}: {e}", dir.display()),
    }
    dir
}

/// A connection of its own to the store's file in `dir`, beside the store's pool.
async fn side_pool(dir: &std::path::Path) -> sqlx::SqlitePool {
    let opts = SqliteConnectOptions::new().filename(dir.join("tessera.db"));
    SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(opts)
        .await
        .unwrap()
}

#[tokio::test]
async fn the_database_file_is_in_wal_mode() {
    let dir = fresh_dir("wal");
    let _store = SqliteStore::open_dir(&dir).await.unwrap();
    let pool = side_pool(&dir).await;
    let mode: String = sqlx::query("PRAGMA journal_mode")
        .fetch_one(&pool)
        .await
        .unwrap()
        .get(0);
    assert_eq!(mode, "wal");
}

/// Checkpoints run in the background, not inside commits: the store's connections never
/// checkpoint on their own (`wal_autocheckpoint=0`), yet the write-ahead log does not grow with
/// what is written — the background checkpointer copies it back and the next writer starts it
/// over. Twenty rounds of 50 tenants of 4 KB (each round ~0.9 MB of log), each after the
/// checkpointer's period, leave the log under 4 MiB (without checkpoints it holds all ~17 MB).
#[tokio::test]
async fn checkpoints_run_in_the_background_and_keep_the_log_small() {
    let dir = fresh_dir("checkpoint");
    let store = SqliteStore::open_dir(&dir).await.unwrap();
    let wal = dir.join("tessera.db-wal");
    let big = "x".repeat(4000);
    for round in 0..20 {
        for i in 0..50 {
            store
                .create_tenant(&TenantRecord {
                    name: format!("t{round}-{i}"),
                    display_name: big.clone(),
                    created_at: 0,
                    priorities: None,
                })
                .await
                .unwrap();
        }
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    }
    let size = std::fs::metadata(&wal).unwrap().len();
    assert!(size < 4 << 20, "the log holds {size} bytes after 20 rounds of writes");
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM tenants")
        .fetch_one(&side_pool(&dir).await)
        .await
        .unwrap();
    assert_eq!(n, 1000);
}

#[tokio::test]
async fn stores_sharing_a_file_never_hand_out_an_id_or_audit_number_twice_also_after_a_restart() {
    let dir = fresh_dir("shared");
    let a = SqliteStore::open_dir(&dir).await.unwrap();
    let b = SqliteStore::open_dir(&dir).await.unwrap();

    let reserve = |s: SqliteStore| async move {
        let mut ids = Vec::new();
        for n in 0..60u32 {
            ids.extend(s.reserve_workload_ids(n % 4 + 1).await.unwrap());
        }
        ids
    };
    let append = |s: SqliteStore| async move {
        let mut seqs = Vec::new();
        for i in 0..30 {
            seqs.extend(s.append_audit(&[login_audit(i), login_audit(i)]).await.unwrap());
        }
        seqs
    };
    // Separate tasks on a multi-threaded runtime would be closer to two processes, but two
    // pools already mean two sets of connections contending for SQLite's write lock.
    let (ids_a, ids_b, seqs_a, seqs_b) = tokio::join!(
        reserve(a.clone()),
        reserve(b.clone()),
        append(a.clone()),
        append(b.clone())
    );
    let ids: BTreeSet<u64> = ids_a.iter().chain(&ids_b).copied().collect();
    assert_eq!(ids.len(), ids_a.len() + ids_b.len(), "an id was handed out twice");
    let seqs: BTreeSet<u64> = seqs_a.iter().chain(&seqs_b).copied().collect();
    assert_eq!(seqs.len(), 120, "an audit number was handed out twice");
    assert_eq!(a.audit(None, None, 1000).await.unwrap().len(), 120);

    drop((a, b));
    let reopened = SqliteStore::open_dir(&dir).await.unwrap();
    let next = reopened.reserve_workload_ids(1).await.unwrap();
    assert!(next.start > *ids.last().unwrap(), "{next:?} after {:?}", ids.last());
    let seq = reopened.append_audit(&[login_audit(99)]).await.unwrap();
    assert!(seq[0] > *seqs.last().unwrap());
}

#[tokio::test]
async fn the_server_can_share_it_as_an_arc_dyn_store_across_tasks() {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_memory().await.unwrap());
    let task = {
        let store = store.clone();
        tokio::spawn(async move {
            let tenant = TenantRecord {
                name: "acme".into(),
                display_name: "Acme".into(),
                created_at: 1,
                priorities: None,
            };
            store.create_tenant(&tenant).await.unwrap();
        })
    };
    task.await.unwrap();
    assert_eq!(
        store.get_tenant("acme").await.unwrap().map(|t| t.display_name),
        Some("Acme".into())
    );
}

fn workload(id: u64) -> Workload {
    let spec = WorkloadSpec {
        cpu_milli: 1000,
        memory_mib: 1024,
        ..WorkloadSpec::new(
            "acme",
            "train",
            &format!("job-{id}"),
            Kind::Batch,
            ShapeSpec::any(GpuSpec::Whole { gpus: 1 }),
        )
    };
    Workload::new(WorkloadId(id), spec, GpuUnits::ONE_GPU, 1_000)
}

fn created(w: &Workload, key: &str) -> Change {
    Change::Insert {
        workload: w.clone().into(),
        events: vec![Event {
            seq: 0,
            step: Step::Requested,
            at: 1_000,
            detail: String::new(),
            code: None,
        }],
        idempotency: Some(IdempotencyKey {
            actor: "tok_ci".into(),
            key: key.into(),
            request_hash: "h".into(),
        }),
    }
}

fn queued(w: &Workload) -> Change {
    Change::Update {
        workload: Workload {
            phase: Phase::Queued,
            ..w.clone()
        }
        .into(),
        events: Vec::new(),
    }
}

/// In memory, batches are written through sqlx; on a file, on the store's own batch
/// connection: both name the same change, and both leave nothing of a failed batch.
#[tokio::test]
async fn a_failed_batch_names_its_first_failing_change() {
    failed_batches_name_their_first_failing_change(SqliteStore::open_memory().await.unwrap()).await;
    let dir = fresh_dir("failed-batch");
    failed_batches_name_their_first_failing_change(SqliteStore::open_dir(&dir).await.unwrap()).await;
}

async fn failed_batches_name_their_first_failing_change(store: SqliteStore) {
    let ids: Vec<u64> = store.reserve_workload_ids(200).await.unwrap().collect();
    let ws: Vec<Workload> = ids.iter().map(|&id| workload(id)).collect();
    let key = |i: usize| format!("k-{i}");
    // Workloads 100 to 179 are stored, the others not.
    let stored: Vec<Change> = (100..180).map(|i| created(&ws[i], &key(i))).collect();
    store.commit(&stored).await.unwrap();
    let expect = |r: tessera_store::Result<()>, want: String| match r {
        Err(e @ (StoreError::Conflict(_) | StoreError::Corrupt(_))) => assert_eq!(e.to_string(), want),
        other => panic!("expected {want:?}, got {other:?}"),
    };
    let creations = || (0..100).map(|i| created(&ws[i], &key(i))).collect::<Vec<_>>();

    // 100 new workloads, the 71st of which is stored already.
    let mut batch = creations();
    batch[70] = created(&ws[150], "k-other");
    expect(
        store.commit(&batch).await,
        format!("workload {} already exists", ws[150].id),
    );
    // The same with the key of a stored workload, from the 91st on.
    let mut batch = creations();
    for (i, change) in batch.iter_mut().enumerate().skip(90) {
        *change = created(&ws[i], &key(i + 60));
    }
    expect(
        store.commit(&batch).await,
        "idempotency key `k-150` of `tok_ci` already exists".into(),
    );
    // 80 updates, from the 71st on of workloads that are not stored.
    let batch: Vec<Change> = ws[110..180].iter().chain(&ws[..10]).map(queued).collect();
    expect(
        store.commit(&batch).await,
        format!(
            "stored data is corrupt: workload {}: cannot be updated: it is not stored",
            ws[0].id
        ),
    );
    // Closes of intervals never opened.
    let close = |w: &Workload| Change::CloseUsage {
        workload: w.id,
        seq: 3,
        ended_at: 2_000,
        util_avg: None,
    };
    let batch: Vec<Change> = ws[100..180]
        .iter()
        .map(queued)
        .chain(ws[120..140].iter().map(close))
        .collect();
    expect(
        store.commit(&batch).await,
        format!(
            "stored data is corrupt: usage interval 3 of workload {} is not open",
            ws[120].id
        ),
    );

    for i in [0, 70, 99] {
        assert_eq!(store.get_workload(ws[i].id, None).await.unwrap(), None);
        assert_eq!(store.idempotent("tok_ci", &key(i)).await.unwrap(), None);
    }
    for i in [100, 150, 179] {
        assert_eq!(store.get_workload(ws[i].id, None).await.unwrap(), Some(ws[i].clone()));
    }
    // After the failures, the next batch commits.
    store.commit(&creations()).await.unwrap();
    assert_eq!(store.get_workload(ws[70].id, None).await.unwrap(), Some(ws[70].clone()));
}

/// Another connection (another process) holds the write lock: the batch waits for it, then
/// commits; neither write is lost. (Multi-threaded: the batch's wait holds its thread, and
/// the other writer's commit needs one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_waits_for_another_writer_and_then_commits() {
    let dir = fresh_dir("busy-writer");
    let store = SqliteStore::open_dir(&dir).await.unwrap();
    let ids: Vec<u64> = store.reserve_workload_ids(2).await.unwrap().collect();
    let side = side_pool(&dir).await;
    let mut other = side.begin_with("BEGIN IMMEDIATE").await.unwrap();
    sqlx::query("INSERT INTO tenants (name, display_name, created_at) VALUES ('side', 'Side', 1)")
        .execute(&mut *other)
        .await
        .unwrap();
    let w = workload(ids[0]);
    let batch = vec![created(&w, "k-busy")];
    let commit = tokio::spawn({
        let store = store.clone();
        async move { store.commit(&batch).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!commit.is_finished(), "the batch waits for the write lock");
    other.commit().await.unwrap();
    commit.await.unwrap().unwrap();
    assert_eq!(store.get_workload(w.id, None).await.unwrap(), Some(w));
    let tenants: Vec<String> = sqlx::query("SELECT name FROM tenants")
        .fetch_all(&side)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(tenants.contains(&"side".to_string()), "{tenants:?}");
}

#[tokio::test]
async fn a_schema_written_by_a_newer_tessera_is_refused() {
    let dir = fresh_dir("newer");
    let store = SqliteStore::open_dir(&dir).await.unwrap();
    drop(store);
    SqliteStore::open_dir(&dir).await.expect("its own version opens");
    let pool = side_pool(&dir).await;
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (9999, 'from the future', TRUE, x'00', 0)",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    let err = SqliteStore::open_dir(&dir).await.unwrap_err();
    assert!(matches!(err, StoreError::Incompatible(_)), "{err:?}");
    assert!(err.to_string().contains("version 9999"), "{err}");
}

/// Recovery's read of every active workload (stepped on SQLite's handle, off the async
/// threads of a multi-threaded runtime) returns what single reads return, and a cell of the
/// wrong type is an error that names its column in both, never a guess.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bulk_read_of_active_workloads_decodes_as_single_reads_and_names_a_corrupt_column() {
    let dir = fresh_dir("bulk-read");
    let store = SqliteStore::open_dir(&dir).await.unwrap();
    let ids: Vec<u64> = store.reserve_workload_ids(3).await.unwrap().collect();
    let ws: Vec<Workload> = ids.iter().map(|&id| workload(id)).collect();
    let mut batch: Vec<Change> = ws
        .iter()
        .enumerate()
        .map(|(i, w)| created(w, &format!("k-{i}")))
        .collect();
    batch.extend(ws[..2].iter().map(queued));
    store.commit(&batch).await.unwrap();
    let mut single = Vec::new();
    for w in &ws {
        single.push(store.get_workload(w.id, None).await.unwrap().unwrap());
    }
    assert_eq!(single[0].phase, Phase::Queued);
    assert_eq!(store.active_workloads().await.unwrap(), single);

    let pool = side_pool(&dir).await;
    let set = |set: &str| {
        let sql = format!("UPDATE workloads SET {set} WHERE id = {}", ids[1]);
        let pool = &pool;
        async move { sqlx::query(sqlx::AssertSqlSafe(sql)).execute(pool).await.unwrap() }
    };
    for (corrupt, column) in [("cpu_milli = 'lots'", "cpu_milli"), ("env = 42", "env")] {
        set(corrupt).await;
        for read in [
            store.active_workloads().await.map(|_| ()),
            store.get_workload(WorkloadId(ids[1]), None).await.map(|_| ()),
        ] {
            match read {
                Err(StoreError::Corrupt(m)) => assert!(m.contains(&format!("column `{column}`")), "{m}"),
                other => panic!("expected a corrupt `{column}`, got {other:?}"),
            }
        }
        set("cpu_milli = 1000, env = '{}'").await;
    }
    assert_eq!(store.active_workloads().await.unwrap(), single);
}

/// A gang row whose columns disagree, or whose node-shares are no JSON array of shares, is
/// `Corrupt` with a message that says what is wrong, in single reads, listings and the bulk
/// read of active workloads alike, never a guess.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_gang_row_is_corrupt_and_says_why() {
    let dir = fresh_dir("gang-corrupt");
    let store = SqliteStore::open_dir(&dir).await.unwrap();
    let id = store.reserve_workload_ids(1).await.unwrap().start;
    let gang = placed_gang(id);
    store.commit(&[created(&gang, "k")]).await.unwrap();
    assert_eq!(store.get_workload(gang.id, None).await.unwrap(), Some(gang.clone()));

    let pool = side_pool(&dir).await;
    let set = |set: &str| {
        let sql = format!("UPDATE workloads SET {set} WHERE id = {id}");
        let pool = &pool;
        async move { sqlx::query(sqlx::AssertSqlSafe(sql)).execute(pool).await.unwrap() }
    };
    let restore = "gang_gpus = 24, gang_gpus_per_node = 8, gang_topology_level = 'rack', \
         gang_topology_mode = 'required', gang_segment = 8, gpus = NULL, p_slice = 'whole'";
    let good_shares: String = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT p_shares FROM workloads WHERE id = {id}"
    )))
    .fetch_one(&pool)
    .await
    .unwrap()
    .get(0);
    for (corrupt, says) in [
        ("gang_gpus = NULL", "gang columns are set but `gang_gpus` is NULL"),
        ("gang_topology_mode = 'strict'", "unknown gang topology mode `strict`"),
        (
            "gang_topology_level = NULL",
            "needs both `gang_topology_level` and `gang_topology_mode`",
        ),
        (
            "gang_gpus_per_node = 300",
            "column `gang_gpus_per_node`: 300 is out of range",
        ),
        ("gang_gpus = -1", "column `gang_gpus`: -1 is out of range"),
        (
            "gpus = 2",
            "exactly one of gpus, mig_profile, fraction_milli and gang_gpus must be set",
        ),
        ("p_shares = 'not json'", "column `p_shares`"),
        ("p_shares = '{}'", "column `p_shares`"),
        (
            r#"p_shares = '[{"pool": "training", "node": "h100-01"}]'"#,
            "column `p_shares`: missing field",
        ),
        (
            r#"p_shares = '[{"pool": "p", "node": "n", "model": "m", "gpus": [0], "units_milli": 1000, "slice": "mig"}]'"#,
            "column `p_shares`: unknown field `slice`",
        ),
        (
            r#"p_shares = '[{"pool": "p", "node": "n", "model": "m", "gpus": [256], "units_milli": 1}]'"#,
            "column `p_shares`",
        ),
        ("p_shares = 42", "column `p_shares`"),
        ("p_slice = NULL", "node-shares (`p_shares`) without a placement"),
    ] {
        set(corrupt).await;
        assert_reads_corrupt(&store, gang.id, corrupt, says).await;
        set(&format!("{restore}, p_shares = '{good_shares}'")).await;
        assert_eq!(store.get_workload(gang.id, None).await.unwrap(), Some(gang.clone()));
    }
}

/// What `p_shares` could not give back as it was is refused before anything is written:
/// node-shares without a first placement, and a node-share of less than whole GPUs.
#[tokio::test]
async fn node_shares_the_columns_cannot_hold_are_refused() {
    let store = SqliteStore::open_memory().await.unwrap();
    let id = store.reserve_workload_ids(1).await.unwrap().start;
    let gang = placed_gang(id);
    let mut unplaced = gang.clone();
    unplaced.placement = None;
    let mut sliced = gang.clone();
    sliced.shares[1].slice = Slice::Fraction {
        milli: 500,
        gpu_memory_mib: None,
    };
    for (w, says) in [
        (&unplaced, "cannot store node-shares without a placement"),
        (&sliced, "cannot store a node-share on h100-02 of slice `fraction`"),
    ] {
        match store.commit(&[created(w, "k")]).await {
            Err(StoreError::Corrupt(m)) => assert!(m.contains(says), "{m}"),
            other => panic!("expected {says:?}, got {other:?}"),
        }
        assert_eq!(store.get_workload(gang.id, None).await.unwrap(), None);
    }
    store.commit(&[created(&gang, "k")]).await.unwrap();
    for (w, says) in [
        (&unplaced, "cannot store node-shares without a placement"),
        (&sliced, "cannot store a node-share on h100-02 of slice `fraction`"),
    ] {
        let update = Change::Update {
            workload: w.clone().into(),
            events: Vec::new(),
        };
        match store.commit(&[update]).await {
            Err(StoreError::Corrupt(m)) => assert!(m.contains(says), "{m}"),
            other => panic!("expected {says:?}, got {other:?}"),
        }
        assert_eq!(store.get_workload(gang.id, None).await.unwrap(), Some(gang.clone()));
    }
}
