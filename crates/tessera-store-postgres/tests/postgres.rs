//! What the conformance suite does not show on PostgreSQL: clear errors when the database
//! cannot be reached or was upgraded by a newer Tessera, statements that give up instead of
//! hanging, a store that recovers by itself when the database returns, ids and audit numbers
//! that stay unique across stores (processes) sharing the database, malformed gang rows named
//! as corrupt, and workloads that keep their data through the upgrade to gangs (version 15).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use sqlx::{Connection, Row};
use tessera_domain::{Phase, Placement, Slice, Workload, WorkloadId};
use tessera_model::GpuUnits;
use tessera_store::conformance::{assert_reads_corrupt, login_audit, placed_gang, submission_audit, workload};
use tessera_store::{AuditStore, Change, StoreError, TenancyStore, TenantRecord, WorkloadStore};
use tessera_store_postgres::{MIGRATOR, PgOptions, PgStore};
use tessera_testdb::{Cluster, database_url};

fn quick() -> PgOptions {
    PgOptions {
        acquire_timeout: Duration::from_millis(800),
        statement_timeout: Duration::from_millis(300),
        ..PgOptions::default()
    }
}

#[tokio::test]
async fn an_unreachable_database_is_named_in_the_error() {
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t0 = Instant::now();
    let r = PgStore::connect_with(&format!("postgres://tessera:secret@127.0.0.1:{port}/tessera"), &quick()).await;
    let err = r.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains(&format!("cannot connect to PostgreSQL at 127.0.0.1:{port}/tessera")),
        "{text}"
    );
    assert!(!text.contains("secret"), "no password in messages: {text}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());

    let r = PgStore::connect("mysql://localhost/x").await;
    assert!(
        matches!(&r, Err(StoreError::Unavailable(m)) if m.contains("not a PostgreSQL URL")),
        "{r:?}"
    );
}

#[tokio::test]
async fn a_schema_written_by_a_newer_tessera_is_refused() {
    let url = database_url();
    let store = PgStore::connect(&url).await.unwrap();
    store.close().await;
    // Reconnecting to a database at the binary's own version is fine.
    PgStore::connect(&url).await.unwrap().close().await;
    let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (9999, 'from the future', TRUE, '\\x00', 0)",
    )
    .execute(&mut c)
    .await
    .unwrap();
    let err = PgStore::connect(&url).await.unwrap_err();
    assert!(matches!(err, StoreError::Incompatible(_)), "{err:?}");
    assert!(err.to_string().contains("version 9999"), "{err}");
    assert!(err.to_string().contains("newer Tessera"), "{err}");
}

#[tokio::test]
async fn a_statement_stuck_behind_a_lock_gives_up_at_the_statement_timeout() {
    let url = database_url();
    let store = PgStore::connect_with(&url, &quick()).await.unwrap();
    // Another session holds the audit counter's row lock and does not let go.
    let mut other = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut tx = other.begin().await.unwrap();
    sqlx::query("SELECT value FROM sequences WHERE name = 'audit' FOR UPDATE")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let t0 = Instant::now();
    let r = store.append_audit(&[login_audit(1)]).await;
    assert!(
        matches!(&r, Err(StoreError::Unavailable(m)) if m.contains("statement timeout")),
        "{r:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    tx.rollback().await.unwrap();
    assert_eq!(store.append_audit(&[login_audit(2)]).await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_stopped_database_answers_unavailable_quickly_and_the_store_recovers_when_it_returns() {
    let cluster = Cluster::start();
    let store = PgStore::connect_with(&cluster.create_database(), &quick())
        .await
        .unwrap();
    let tenant = |name: &str| TenantRecord {
        name: name.into(),
        display_name: name.into(),
        created_at: 1,
        priorities: None,
    };
    store.create_tenant(&tenant("before")).await.unwrap();
    cluster.stop();
    let t0 = Instant::now();
    let r = store.get_tenant("before").await;
    assert!(
        matches!(&r, Err(StoreError::Unavailable(m)) if m.contains("cannot reach PostgreSQL at 127.0.0.1")),
        "{r:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    // Right after, operations fail at once instead of each waiting for a connection.
    for _ in 0..3 {
        let t0 = Instant::now();
        let r = store.create_tenant(&tenant("lost")).await;
        assert!(
            matches!(&r, Err(StoreError::Unavailable(m)) if m.contains("moments ago")),
            "{r:?}"
        );
        assert!(t0.elapsed() < Duration::from_millis(100), "{:?}", t0.elapsed());
    }
    cluster.resume();
    // The pool replaces the connections the restart broke; a caller may see one more failure.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match store.create_tenant(&tenant("after")).await {
            Ok(()) => break,
            Err(StoreError::Unavailable(e)) if Instant::now() < deadline => {
                eprintln!("not yet: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    let names: Vec<String> = store
        .list_tenants(None, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["after", "before"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_sharing_a_database_never_hand_out_an_id_or_audit_number_twice() {
    let url = database_url();
    let a = PgStore::connect(&url).await.unwrap();
    let b = PgStore::connect(&url).await.unwrap();
    let reserve = |s: PgStore| {
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for n in 0..60u32 {
                ids.extend(s.reserve_workload_ids(n % 4 + 1).await.unwrap());
            }
            ids
        })
    };
    let append = |s: PgStore| {
        tokio::spawn(async move {
            let mut seqs = Vec::new();
            for i in 0..30 {
                seqs.extend(s.append_audit(&[login_audit(i), login_audit(i)]).await.unwrap());
            }
            seqs
        })
    };
    let (ids_a, ids_b, seqs_a, seqs_b) = (reserve(a.clone()), reserve(b.clone()), append(a.clone()), append(b));
    let (ids_a, ids_b) = (ids_a.await.unwrap(), ids_b.await.unwrap());
    let (seqs_a, seqs_b) = (seqs_a.await.unwrap(), seqs_b.await.unwrap());
    let ids: BTreeSet<u64> = ids_a.iter().chain(&ids_b).copied().collect();
    assert_eq!(ids.len(), ids_a.len() + ids_b.len(), "an id was handed out twice");
    let seqs: BTreeSet<u64> = seqs_a.iter().chain(&seqs_b).copied().collect();
    assert_eq!(seqs.len(), 120, "an audit number was handed out twice");
    for s in [&seqs_a, &seqs_b] {
        assert!(s.windows(2).all(|p| p[0] < p[1]), "each appender's numbers increase");
    }
    assert_eq!(a.audit(None, None, 1000).await.unwrap().len(), 120);
}

fn insert(w: &Workload) -> Change {
    Change::Insert {
        workload: w.clone().into(),
        events: Vec::new(),
        idempotency: None,
    }
}

/// A gang row whose columns disagree, or whose node-shares are no JSON array of shares, is
/// `Corrupt` with a message that says what is wrong, in single reads, listings and the read
/// of active workloads alike.
#[tokio::test]
async fn a_malformed_gang_row_is_corrupt_and_says_why() {
    let url = database_url();
    let store = PgStore::connect(&url).await.unwrap();
    let id = store.reserve_workload_ids(1).await.unwrap().start;
    let gang = placed_gang(id);
    store.commit(&[insert(&gang)]).await.unwrap();
    assert_eq!(store.get_workload(gang.id, None).await.unwrap(), Some(gang.clone()));

    let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
    let good_shares: String = sqlx::query("SELECT p_shares FROM workloads WHERE id = $1")
        .bind(id as i64)
        .fetch_one(&mut c)
        .await
        .unwrap()
        .get(0);
    let restore = format!(
        "gang_gpus = 24, gang_gpus_per_node = 8, gang_topology_level = 'rack', gang_topology_mode = 'required', \
         gang_segment = 8, gpus = NULL, p_slice = 'whole', p_shares = '{good_shares}'"
    );
    for (corrupt, says) in [
        ("gang_gpus = NULL", "gang columns are set but `gang_gpus` is NULL"),
        ("gang_topology_mode = 'strict'", "unknown gang topology mode `strict`"),
        (
            "gang_topology_mode = NULL",
            "needs both `gang_topology_level` and `gang_topology_mode`",
        ),
        (
            "gang_gpus_per_node = 300",
            "column `gang_gpus_per_node`: 300 is out of range",
        ),
        (
            "gpus = 2",
            "exactly one of gpus, mig_profile, fraction_milli and gang_gpus must be set",
        ),
        ("p_shares = 'not json'", "column `p_shares`"),
        (
            r#"p_shares = '[{"pool": "training"}]'"#,
            "column `p_shares`: missing field",
        ),
        ("p_slice = NULL", "node-shares (`p_shares`) without a placement"),
    ] {
        let sql = format!("UPDATE workloads SET {corrupt} WHERE id = {id}");
        sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&mut c).await.unwrap();
        assert_reads_corrupt(&store, gang.id, corrupt, says).await;
        let sql = format!("UPDATE workloads SET {restore} WHERE id = {id}");
        sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&mut c).await.unwrap();
        assert_eq!(store.get_workload(gang.id, None).await.unwrap(), Some(gang.clone()));
    }
}

/// A workload stored at schema version 14 (before gangs) reads back unchanged once the store
/// upgrades the database to the latest version, and the upgraded database stores a placed gang.
#[tokio::test]
async fn workloads_of_version_14_keep_their_data_through_the_gang_migration() {
    let url = database_url();
    let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
    MIGRATOR.run_to(14, &mut c).await.unwrap();
    let old = workload(7, "acme", "train", Phase::Running);
    sqlx::query(
        "INSERT INTO workloads (id, tenant, project, name, kind, gpus, shape_models, cpu_milli, memory_mib, env, \
         priority, no_wait, no_requeue, units_milli, created_at, phase, borrowing, updated_at, next_event_seq, \
         usage_seq, usage_open, p_pool, p_node, p_model, p_gpus, p_slice, p_units_milli) \
         VALUES (7, 'acme', 'train', 'w7', 'batch', 1, '[]', 1000, 1024, '{}', 'standard', FALSE, FALSE, 1000, \
         $1, 'running', FALSE, $1, 1, 0, FALSE, 'training', 'h100-03', 'H100-80GB-SXM', 8, 'whole', 1000)",
    )
    .bind(old.created_at)
    .execute(&mut c)
    .await
    .unwrap();
    sqlx::query("UPDATE sequences SET value = 7 WHERE name = 'workload'")
        .execute(&mut c)
        .await
        .unwrap();

    let store = PgStore::connect(&url).await.unwrap();
    let latest: i64 = sqlx::query("SELECT MAX(version) FROM _sqlx_migrations")
        .fetch_one(&mut c)
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
        placement: Some(Placement {
            pool: "training".into(),
            node: "h100-03".into(),
            model: "H100-80GB-SXM".into(),
            gpus: vec![3],
            slice: Slice::Whole,
            units: GpuUnits::ONE_GPU,
        }),
        ..old
    };
    assert!(want.shares.is_empty());
    assert_eq!(
        store.get_workload(WorkloadId(7), None).await.unwrap(),
        Some(want.clone())
    );

    let id = store.reserve_workload_ids(1).await.unwrap().start;
    assert_eq!(id, 8);
    let gang = placed_gang(id);
    store.commit(&[insert(&gang)]).await.unwrap();
    assert_eq!(store.active_workloads().await.unwrap(), vec![want, gang]);
}

/// A loopback proxy in front of PostgreSQL that counts the statements its clients run: simple
/// queries (`Q`: sqlx's `BEGIN` and `COMMIT`) and executions of prepared statements (`E`), each
/// a round trip of its own. (The pool's check of a connection before lending it, a `Sync`
/// without a statement, is not counted.)
struct Statements {
    url: String,
    count: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Statements {
    /// A counting proxy for the database at `url` (`postgres://user@127.0.0.1:PORT/NAME`).
    async fn proxy(url: &str) -> Statements {
        use std::sync::atomic::{AtomicU64, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let (_, rest) = url.split_once("127.0.0.1:").expect("a loopback URL");
        let (port, name) = rest.split_once('/').expect("a database name");
        let target = format!("127.0.0.1:{port}");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "postgres://postgres@{}/{name}?sslmode=disable",
            listener.local_addr().unwrap()
        );
        let count = std::sync::Arc::new(AtomicU64::new(0));
        let counter = count.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = tokio::net::TcpStream::connect(&target).await.unwrap();
                let (mut from_client, mut to_client) = client.into_split();
                let (mut from_server, mut to_server) = server.into_split();
                tokio::spawn(async move { tokio::io::copy(&mut from_server, &mut to_client).await });
                let counter = counter.clone();
                tokio::spawn(async move {
                    // The startup messages have no type byte: the length, then the body, whose
                    // first four bytes say what it is (an SSL or GSS request comes before the
                    // startup message proper).
                    loop {
                        let n = from_client.read_u32().await? as usize;
                        let mut body = vec![0; n - 4];
                        from_client.read_exact(&mut body).await?;
                        to_server.write_u32(n as u32).await?;
                        to_server.write_all(&body).await?;
                        let code = u32::from_be_bytes(body[..4].try_into().unwrap());
                        if code != 80_877_103 && code != 80_877_104 {
                            break;
                        }
                    }
                    loop {
                        let kind = from_client.read_u8().await?;
                        let n = from_client.read_u32().await? as usize;
                        let mut body = vec![0; n - 4];
                        from_client.read_exact(&mut body).await?;
                        if kind == b'Q' || kind == b'E' {
                            counter.fetch_add(1, Ordering::SeqCst);
                        }
                        to_server.write_u8(kind).await?;
                        to_server.write_u32(n as u32).await?;
                        to_server.write_all(&body).await?;
                    }
                    #[allow(unreachable_code)]
                    Ok::<(), std::io::Error>(())
                });
            }
        });
        Statements { url, count }
    }

    fn now(&self) -> u64 {
        self.count.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A lifecycle batch on PostgreSQL is one statement between `BEGIN` and `COMMIT`, whatever
/// kinds of rows it holds (new workloads, their events and idempotency keys, updates of others,
/// usage intervals opened and closed, audit records numbered from the store) and with its
/// fence checked in it: three statements, each a round trip, where each kind of row and the
/// fence were one more.
/// It writes what the changes say; with a stale fence, or a row that exists already, nothing.
#[tokio::test]
async fn a_lifecycle_batch_is_three_statements() {
    use tessera_domain::{Event, Step};
    use tessera_store::{Fence, IdempotencyKey, LeaseStore, LedgerStore, UsageInterval};

    let url = database_url();
    let statements = Statements::proxy(&url).await;
    // One connection, so that every batch finds its statements prepared on it.
    let one = PgOptions {
        max_connections: 1,
        ..PgOptions::default()
    };
    let store = PgStore::connect_with(&statements.url, &one).await.unwrap();
    let epoch = store.acquire_lease("a", "http://a", 60_000).await.unwrap().unwrap();
    let fence = || {
        Change::Fence(Fence {
            holder: "a".into(),
            epoch,
        })
    };
    let event = |seq: u32, step: Step| Event {
        seq,
        step,
        at: 10 + i64::from(seq),
        detail: format!("{} {seq}", step.as_str()),
        code: None,
    };
    let note = |i: u64| submission_audit(format!("req-{i}"), "/api/v1/workloads");
    let usage = |w: &Workload, started_at: i64| UsageInterval {
        workload: w.id,
        seq: 0,
        tenant: w.spec.tenant.clone(),
        project: w.spec.project.clone(),
        pool: "default".into(),
        model: "A100-80GB".into(),
        shape: "whole".into(),
        units: GpuUnits(1000),
        started_at,
        ended_at: None,
        util_avg: None,
    };
    // Each round of the loop: a new workload (its events, key and audit record), the previous
    // one running (its events, its interval opened), the one before that ended (its interval
    // closed).
    let ids: Vec<u64> = store.reserve_workload_ids(4).await.unwrap().collect();
    let ws: Vec<Workload> = ids
        .iter()
        .map(|&id| workload(id, "acme", "p", Phase::Pending))
        .collect();
    let running = |w: &Workload| {
        let mut r = w.clone();
        r.phase = Phase::Running;
        r.next_seq = 2;
        r.usage.open = true;
        r
    };
    let round = |i: usize| {
        let mut changes = vec![
            fence(),
            Change::Insert {
                workload: ws[i].clone().into(),
                events: vec![event(0, Step::Requested)],
                idempotency: Some(IdempotencyKey {
                    actor: "tok".into(),
                    key: format!("k{i}"),
                    request_hash: "h".into(),
                }),
            },
            note(i as u64),
        ];
        if i >= 1 {
            changes.push(Change::Update {
                workload: running(&ws[i - 1]).into(),
                events: vec![event(1, Step::Running)],
            });
            changes.push(Change::OpenUsage(usage(&ws[i - 1], 20)));
        }
        if i >= 2 {
            let mut done = running(&ws[i - 2]);
            done.phase = Phase::Succeeded;
            done.usage.open = false;
            done.next_seq = 3;
            changes.push(Change::Update {
                workload: done.into(),
                events: vec![event(2, Step::Released)],
            });
            changes.push(Change::CloseUsage {
                workload: ws[i - 2].id,
                seq: 0,
                ended_at: 30,
                util_avg: Some(0.5),
            });
        }
        changes
    };
    // Counted: the fourth round, whose batch holds every kind of row.
    for i in 0..3 {
        store.commit(&round(i)).await.unwrap();
    }
    let before = statements.now();
    store.commit(&round(3)).await.unwrap();
    assert_eq!(statements.now() - before, 3, "BEGIN, the batch, COMMIT");

    // All of it landed, as the changes say.
    assert_eq!(store.get_workload(ws[3].id, None).await.unwrap(), Some(ws[3].clone()));
    assert_eq!(store.get_workload(ws[2].id, None).await.unwrap(), Some(running(&ws[2])));
    assert_eq!(
        store.get_workload(ws[1].id, None).await.unwrap().unwrap().phase,
        Phase::Succeeded
    );
    let steps: Vec<Step> = store
        .events(ws[1].id, None)
        .await
        .unwrap()
        .iter()
        .map(|e| e.step)
        .collect();
    assert_eq!(steps, [Step::Requested, Step::Running, Step::Released]);
    let ledger = store.usage_of(ws[1].id).await.unwrap();
    assert_eq!(
        (ledger.len(), ledger[0].ended_at, ledger[0].util_avg),
        (1, Some(30), Some(0.5))
    );
    assert!(store.usage_of(ws[2].id).await.unwrap()[0].ended_at.is_none());
    assert_eq!(
        store.idempotent("tok", "k3").await.unwrap(),
        Some(("h".into(), ws[3].id))
    );
    let log = store.audit(None, None, 10).await.unwrap();
    let seqs: Vec<(u64, &str)> = log.iter().map(|r| (r.seq, r.request_id.as_str())).collect();
    assert_eq!(seqs, [(4, "req-3"), (3, "req-2"), (2, "req-1"), (1, "req-0")]);

    // A stale fence: refused, nothing written.
    let more: Vec<u64> = store.reserve_workload_ids(1).await.unwrap().collect();
    let extra = workload(more[0], "acme", "p", Phase::Pending);
    let stale = Change::Fence(Fence {
        holder: "a".into(),
        epoch: epoch + 1,
    });
    let r = store.commit(&[stale, insert(&extra), note(9)]).await;
    assert!(matches!(r, Err(StoreError::Fenced(_))), "{r:?}");
    assert_eq!(store.get_workload(extra.id, None).await.unwrap(), None);
    assert_eq!(store.audit(None, None, 10).await.unwrap().len(), 4);

    // A workload that exists already: the batch fails whole and names it (applied again one
    // change at a time).
    let r = store.commit(&[fence(), insert(&extra), insert(&ws[0]), note(9)]).await;
    match r {
        Err(StoreError::Conflict(why)) => assert!(why.contains(&ws[0].id.to_string()), "{why}"),
        other => panic!("a duplicate workload: {other:?}"),
    }
    assert_eq!(store.get_workload(extra.id, None).await.unwrap(), None);
    assert_eq!(store.audit(None, None, 10).await.unwrap().len(), 4);
}
