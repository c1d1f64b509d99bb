//! The conformance suite: what every [`Store`] implementation must do, one async check per
//! behaviour, each taking a fresh, empty store and panicking when the store misbehaves.
//!
//! An implementation crate runs the whole suite with [`store_conformance_tests!`](crate::store_conformance_tests), which
//! expands to one `#[tokio::test]` per check (the calling crate needs `tokio` with the `macros`
//! and `rt` features as a dev-dependency):
//!
//! ```ignore
//! mod in_memory {
//!     tessera_store::store_conformance_tests!(make = async { MyStore::open_memory().await.unwrap() });
//! }
//! ```
//!
//! Workload ids always come from [`WorkloadStore::reserve_workload_ids`](crate::WorkloadStore::reserve_workload_ids), as in the server.

use std::collections::{BTreeMap, BTreeSet};

use tessera_domain::{
    Event, GangSpec, GpuSpec, Kind, Movable, Phase, Placement, PreemptCode, Reason, ReasonCode, ShapeSpec, Slice, Step,
    StopCause, UsageCursor, Workload, WorkloadId, WorkloadSpec,
};
use tessera_model::GpuUnits;
use tessera_model::request::TopologyConstraint;

use crate::{
    AuditRecord, Change, DrainRecord, Fence, GpuHealthRecord, HealthCause, IdempotencyKey, ImagePolicyRecord,
    MoveCause, NodeStateRecord, PLATFORM_ADMIN, ProjectRecord, QuotaRecord, ReplicaRecord, Revocation,
    RolloutNodeRecord, RolloutNodeState, RolloutRecord, RolloutState, ServiceMoveRecord, Store, StoreError,
    TELEMETRY_ROWS_PER_WRITE, TelemetryRecord, TelemetrySeries, TenancyChange, TenantRecord, TokenRecord,
    UsageInterval, WorkloadFilter, WorkloadOrder, WorkloadSeek,
};

/// Expands to one `#[tokio::test]` per conformance check, each on the store that `make` (an
/// expression whose value is a future of a fresh, empty store) yields. Invoke it once per
/// module; wrap several invocations (in-memory, file, …) in modules of their own.
#[macro_export]
macro_rules! store_conformance_tests {
    (make = $make:expr) => {
        $crate::store_conformance_tests!(@each $make;
            batches_are_atomic,
            changes_take_effect_in_batch_order,
            large_batches_commit_whole,
            workloads_round_trip_every_field,
            gangs_round_trip_with_their_node_shares,
            events_round_trip_in_order_with_codes,
            list_workloads_filters,
            list_workloads_orders_page_over_every_workload,
            list_workloads_pages_hold_under_inserts,
            count_workloads_counts_what_the_listing_answers,
            active_workloads_exclude_terminal_phases,
            reserved_ids_are_never_handed_out_twice,
            idempotency_keys_are_unique_per_actor,
            usage_intervals_open_close_and_overlap,
            tenants_and_projects,
            image_policies_round_trip_with_their_audit_record,
            priority_grants_round_trip_with_their_audit_record,
            declarations_apply_whole_or_not_at_all,
            tokens,
            last_platform_admin_token_stays,
            quotas_and_budgets,
            audit_sequence_numbers_come_from_the_store,
            audit_records_commit_with_their_batch,
            reads_are_scoped,
            the_lease_has_one_holder_at_a_time,
            fenced_batches_commit_only_for_the_lease_holder,
            replicas_record_heartbeats,
            gpu_health_and_node_states,
            drains_and_service_moves,
            rollouts_round_trip_and_get_ids_from_the_store,
            telemetry_reads_back_exactly_and_once_per_minute,
            telemetry_folds_workload_minutes_into_hours,
            telemetry_prunes_only_what_is_older,
        );
    };
    (@each $make:expr; $($check:ident),+ $(,)?) => {
        $(
            #[tokio::test]
            async fn $check() {
                let store = $make.await;
                $crate::conformance::$check(&store).await;
            }
        )+
    };
}

// ----- fixtures ------------------------------------------------------------------------------

fn spec(tenant: &str, project: &str, name: &str) -> WorkloadSpec {
    WorkloadSpec {
        cpu_milli: 1000,
        memory_mib: 1024,
        ..WorkloadSpec::new(
            tenant,
            project,
            name,
            Kind::Batch,
            ShapeSpec::any(GpuSpec::Whole { gpus: 1 }),
        )
    }
}

/// A one-GPU batch workload of `tenant`/`project` in `phase`, created at 1,700,000,000,000 + id
/// ms: the suite's fixture, for other tests that need a storable workload.
pub fn workload(id: u64, tenant: &str, project: &str, phase: Phase) -> Workload {
    let mut w = Workload::new(
        WorkloadId(id),
        spec(tenant, project, &format!("w{id}")),
        GpuUnits::ONE_GPU,
        1_700_000_000_000 + id as i64,
    );
    w.phase = phase;
    w.next_seq = 1;
    w
}

fn event(seq: u32, step: Step, code: Option<ReasonCode>) -> Event {
    Event {
        seq,
        step,
        at: 1_700_000_000_000 + i64::from(seq),
        detail: format!("{step} #{seq}"),
        code,
    }
}

/// Inserting `w` with its `requested` event.
fn insert(w: &Workload) -> Change {
    Change::Insert {
        workload: w.clone().into(),
        events: vec![event(0, Step::Requested, None)],
        idempotency: None,
    }
}

fn usage(w: &Workload, seq: u32, started_at: i64, ended_at: Option<i64>) -> UsageInterval {
    UsageInterval {
        workload: w.id,
        seq,
        tenant: w.spec.tenant.clone(),
        project: w.spec.project.clone(),
        pool: "shared".into(),
        model: "H100-80GB-SXM".into(),
        shape: "1 whole GPU".into(),
        units: GpuUnits::ONE_GPU,
        started_at,
        ended_at,
        util_avg: None,
    }
}

/// Creates the tenants `names` (each its own display name, created at 0).
async fn create_tenants(s: &dyn Store, names: &[&str]) {
    for t in names {
        s.create_tenant(&TenantRecord {
            name: (*t).into(),
            display_name: (*t).into(),
            created_at: 0,
            priorities: None,
        })
        .await
        .unwrap();
    }
}

/// What `field` reads of each audit record (of `tenant`, or all), newest first.
async fn audit_log<T>(s: &dyn Store, tenant: Option<&str>, field: impl Fn(AuditRecord) -> T) -> Vec<T> {
    s.audit(tenant, None, 100)
        .await
        .unwrap()
        .into_iter()
        .map(field)
        .collect()
}

/// A platform-level audit record of a login, told apart by `i` (its time and request id): for
/// the stores' own tests of audit sequence numbers.
pub fn login_audit(i: u32) -> AuditRecord {
    AuditRecord {
        seq: 0,
        at: i64::from(i),
        request_id: format!("req-{i}"),
        actor: "tok".into(),
        tenant: None,
        action: "login".into(),
        target: String::new(),
        outcome: 200,
        detail: String::new(),
    }
}

/// The audit record of a workload's submission at 1 by the platform-level token `tok`, told
/// apart by `request_id`, naming `target`: for batches that carry one (and the stores' own
/// tests of them).
pub fn submission_audit(request_id: String, target: &str) -> Change {
    Change::Audit(AuditRecord {
        seq: 0,
        at: 1,
        request_id,
        actor: "tok".into(),
        tenant: None,
        action: "POST /api/v1/workloads".into(),
        target: target.into(),
        outcome: 201,
        detail: String::new(),
    })
}

/// A placed gang of three whole-node shares (24 GPUs within a rack, in segments of 8), asked
/// for with every field of its spec: for the stores' own tests of gang rows.
pub fn placed_gang(id: u64) -> Workload {
    let whole_node = placements()[1].clone().expect("eight whole GPUs");
    let share = |node: &str| Placement {
        node: node.into(),
        ..whole_node.clone()
    };
    let mut w = workload(id, "acme", "train", Phase::Placed);
    w.spec.shape.gpu = GpuSpec::Gang(GangSpec {
        gpus: 24,
        gpus_per_node: Some(8),
        topology: Some(TopologyConstraint::required("rack")),
        segment: Some(8),
        remainder: false,
    });
    w.units = GpuUnits::whole(24);
    w.placement = Some(share("h100-00"));
    w.shares = vec![share("h100-01"), share("h100-02")];
    w
}

/// Asserts that every read of workload `id` (alone, in a listing, among the active ones) fails
/// as [`StoreError::Corrupt`] with a message containing `says`; `corrupt` names the damage
/// done to its row: for the stores' own tests of malformed rows.
pub async fn assert_reads_corrupt(s: &dyn Store, id: WorkloadId, corrupt: &str, says: &str) {
    let listing = WorkloadFilter {
        limit: 10,
        ..Default::default()
    };
    let reads = [
        ("get", s.get_workload(id, None).await.map(|_| ())),
        ("list", s.list_workloads(&listing).await.map(|_| ())),
        ("active", s.active_workloads().await.map(|_| ())),
    ];
    for (read, r) in reads {
        match r {
            Err(StoreError::Corrupt(m)) => assert!(m.contains(says), "{corrupt}, {read}: {m}"),
            other => panic!("{corrupt}, {read}: expected a corrupt row saying {says:?}, got {other:?}"),
        }
    }
}

async fn new_ids(s: &dyn Store, n: u32) -> Vec<u64> {
    let r = s.reserve_workload_ids(n).await.expect("reserve workload ids");
    assert_eq!(r.end - r.start, u64::from(n), "reserved {r:?} for {n} ids");
    r.collect()
}

async fn commit(s: &dyn Store, batch: &[Change]) {
    s.commit(batch).await.expect("commit");
}

fn ids_of(ws: &[Workload]) -> Vec<u64> {
    ws.iter().map(|w| w.id.0).collect()
}

fn placements() -> [Option<Placement>; 6] {
    let on = |gpus: Vec<u8>, slice: Slice, units: u64| {
        Some(Placement {
            pool: "train".into(),
            node: "node-07".into(),
            model: "A100-80GB".into(),
            gpus,
            slice,
            units: GpuUnits(units),
        })
    };
    [
        None,
        on((0..8).collect(), Slice::Whole, 8000),
        on(
            vec![3],
            Slice::Mig {
                profile: "3g.40gb".into(),
                profile_id: 9,
                start: 4,
                size: 4,
            },
            500,
        ),
        on(
            vec![15],
            Slice::Fraction {
                milli: 250,
                gpu_memory_mib: Some(10_240),
            },
            250,
        ),
        on(
            vec![0],
            Slice::Fraction {
                milli: 500,
                gpu_memory_mib: None,
            },
            500,
        ),
        on(Vec::new(), Slice::CpuOnly, 0),
    ]
}

fn stops() -> [Option<StopCause>; 5] {
    [
        None,
        Some(StopCause::Cancelled { by: "tok_alice".into() }),
        Some(StopCause::Preempted {
            by: WorkloadId(77),
            code: PreemptCode::Priority,
            detail: "critical work needed the GPUs".into(),
        }),
        Some(StopCause::Preempted {
            by: WorkloadId(78),
            code: PreemptCode::Reclaim,
            detail: "tenant `acme` reclaims its guarantee".into(),
        }),
        Some(StopCause::Preempted {
            by: WorkloadId(79),
            code: PreemptCode::Consolidation,
            detail: "moved so that workload 79 fits".into(),
        }),
    ]
}

/// Twenty workloads that between them use every phase, slice, stop cause, reason code, GPU
/// shape and kind, and both states of every optional or boolean field.
fn variety(ids: &[u64]) -> Vec<Workload> {
    let gpu_specs = [
        GpuSpec::Whole { gpus: 2 },
        GpuSpec::Mig {
            profile: "A100-80GB:9".into(),
        },
        GpuSpec::Fraction {
            milli: 250,
            memory_mib: Some(8192),
        },
        GpuSpec::Fraction {
            milli: 100,
            memory_mib: None,
        },
    ];
    let kinds = [Kind::Batch, Kind::Service, Kind::Interactive];
    ids.iter()
        .enumerate()
        .map(|(i, &id)| {
            let odd = i % 2 == 1;
            let mut w = workload(id, if odd { "acme" } else { "globex" }, "research", Phase::ALL[i % 10]);
            w.spec.name = format!("variety-{i} «ü»");
            w.spec.kind = kinds[i % 3];
            w.spec.shape = ShapeSpec {
                gpu: gpu_specs[i % 4].clone(),
                models: if odd {
                    vec!["h100".into(), "A100-80GB".into()]
                } else {
                    Vec::new()
                },
                pool: (i % 3 != 0).then(|| "shared".into()),
            };
            w.spec.cpu_milli = 1_500 + i as u64;
            w.spec.memory_mib = 2_000_000 + i as u64;
            w.spec.duration_s = (i % 3 == 1).then_some(86_400 * 365);
            w.spec.command = odd.then(|| {
                vec![
                    "python".into(),
                    "train.py".into(),
                    "--name=\"quoted\"".into(),
                    String::new(),
                ]
            });
            w.spec.image = (i % 4 == 2).then(|| "registry.local/train:1.2".into());
            if odd {
                w.spec.env = BTreeMap::from([("A".into(), "1".into()), ("B".into(), "x=y, {\"z\"}".into())]);
            }
            w.spec.priority = ["standard", "high", "critical"][i % 3].into();
            w.spec.no_wait = odd;
            w.spec.no_requeue = i % 3 == 0;
            w.spec.movable = [None, Some(Movable::Restart), Some(Movable::Replace)][i % 3];
            w.units = GpuUnits(125 * i as u64);
            w.reason =
                (i > 0).then(|| Reason::new(ReasonCode::ALL[(i - 1) % ReasonCode::ALL.len()], format!("why {i}")));
            w.placement = placements()[i % 6].clone();
            w.borrowing = odd;
            w.running_at = odd.then_some(w.created_at + 1_234);
            w.ended_at = (i % 3 == 2).then_some(w.created_at + 9_999);
            w.stop = stops()[i % 5].clone();
            w.next_seq = 1 + i as u32;
            w.usage = UsageCursor {
                seq: i as u32,
                open: odd,
            };
            w
        })
        .collect()
}

/// `w` later in its life: every mutable field changed, the spec untouched.
fn advanced(w: &Workload, i: usize) -> Workload {
    let mut u = w.clone();
    u.phase = Phase::ALL[(i + 3) % 10];
    u.reason = i
        .is_multiple_of(2)
        .then(|| Reason::new(ReasonCode::ALL[i % ReasonCode::ALL.len()], format!("later {i}")));
    u.placement = placements()[(i + 1) % 6].clone();
    u.borrowing = !w.borrowing;
    u.running_at = w.running_at.map_or(Some(w.created_at + 5), |_| None);
    u.ended_at = w.ended_at.map_or(Some(w.created_at + 50), |_| None);
    u.stop = stops()[(i + 1) % 5].clone();
    u.next_seq = w.next_seq + 1;
    u.usage = UsageCursor {
        seq: w.usage.seq + 1,
        open: !w.usage.open,
    };
    u
}

// ----- checks --------------------------------------------------------------------------------

/// A batch whose later change fails leaves nothing of its earlier changes.
pub async fn batches_are_atomic(s: &dyn Store) {
    let ids = new_ids(s, 2).await;
    let w1 = workload(ids[0], "acme", "p", Phase::Pending);
    let key = IdempotencyKey {
        actor: "tok_a".into(),
        key: "k1".into(),
        request_hash: "h1".into(),
    };
    commit(
        s,
        &[Change::Insert {
            workload: w1.clone().into(),
            events: vec![event(0, Step::Requested, None)],
            idempotency: Some(key.clone()),
        }],
    )
    .await;
    s.commit(&[]).await.expect("an empty batch commits");

    let mut running = w1.clone();
    running.phase = Phase::Running;
    running.next_seq = 2;
    let w2 = workload(ids[1], "acme", "p", Phase::Pending);
    let failing = [
        Change::Update {
            workload: running.into(),
            events: vec![event(1, Step::Running, None)],
        },
        Change::OpenUsage(usage(&w1, 0, 10, None)),
        insert(&w2),
        // The same id again: this change fails, so the whole batch must.
        insert(&w1),
    ];
    let r = s.commit(&failing).await;
    assert!(
        matches!(r, Err(StoreError::Conflict(_))),
        "duplicate workload id: {r:?}"
    );

    assert_eq!(s.get_workload(w1.id, None).await.unwrap(), Some(w1.clone()));
    assert_eq!(s.events(w1.id, None).await.unwrap().len(), 1);
    assert!(s.usage_of(w1.id).await.unwrap().is_empty());
    assert_eq!(s.get_workload(w2.id, None).await.unwrap(), None);
    assert_eq!(s.active_workloads().await.unwrap(), vec![w1.clone()]);

    // A reused idempotency key fails its batch too.
    let r = s
        .commit(&[
            insert(&w2),
            Change::Insert {
                workload: workload(ids[1] + 1_000_000, "acme", "p", Phase::Pending).into(),
                events: Vec::new(),
                idempotency: Some(key.clone()),
            },
        ])
        .await;
    assert!(
        matches!(r, Err(StoreError::Conflict(_))),
        "duplicate idempotency key: {r:?}"
    );
    assert_eq!(s.get_workload(w2.id, None).await.unwrap(), None);
    assert_eq!(s.idempotent("tok_a", "k1").await.unwrap(), Some(("h1".into(), w1.id)));

    // Updating a workload the store does not hold, or closing an interval that is not open,
    // means the caller's view is wrong: the batch fails and its other changes are undone.
    let r = s
        .commit(&[
            insert(&w2),
            Change::Update {
                workload: workload(ids[1] + 2_000_000, "acme", "p", Phase::Queued).into(),
                events: Vec::new(),
            },
        ])
        .await;
    assert!(
        matches!(r, Err(StoreError::Corrupt(_))),
        "update of an unknown workload: {r:?}"
    );
    let r = s
        .commit(&[
            insert(&w2),
            Change::CloseUsage {
                workload: w1.id,
                seq: 0,
                ended_at: 20,
                util_avg: None,
            },
        ])
        .await;
    assert!(
        matches!(r, Err(StoreError::Corrupt(_))),
        "close of an interval never opened: {r:?}"
    );
    assert_eq!(s.get_workload(w2.id, None).await.unwrap(), None);
    assert_eq!(s.active_workloads().await.unwrap(), vec![w1]);
}

/// Changes take effect in batch order: an update may follow the insert of its workload, a close
/// the open of its interval, and a later update of a workload wins. The reverse orders fail,
/// as they would change by change, and of several failing changes the first decides the error.
pub async fn changes_take_effect_in_batch_order(s: &dyn Store) {
    let ids = new_ids(s, 3).await;
    let w = workload(ids[0], "acme", "p", Phase::Pending);
    let mut running = w.clone();
    running.phase = Phase::Running;
    running.next_seq = 2;
    running.usage = UsageCursor { seq: 0, open: true };
    let mut done = running.clone();
    done.phase = Phase::Succeeded;
    done.next_seq = 3;
    done.usage = UsageCursor { seq: 1, open: true };
    commit(
        s,
        &[
            insert(&w),
            Change::Update {
                workload: running.into(),
                events: vec![event(1, Step::Running, None)],
            },
            Change::OpenUsage(usage(&w, 0, 10, None)),
            Change::CloseUsage {
                workload: w.id,
                seq: 0,
                ended_at: 20,
                util_avg: Some(0.5),
            },
            Change::OpenUsage(usage(&w, 1, 20, None)),
            Change::Update {
                workload: done.clone().into(),
                events: vec![event(2, Step::Released, None)],
            },
        ],
    )
    .await;
    assert_eq!(s.get_workload(w.id, None).await.unwrap(), Some(done.clone()));
    assert_eq!(
        s.events(w.id, None).await.unwrap(),
        vec![
            event(0, Step::Requested, None),
            event(1, Step::Running, None),
            event(2, Step::Released, None)
        ]
    );
    let intervals = vec![
        UsageInterval {
            util_avg: Some(0.5),
            ..usage(&w, 0, 10, Some(20))
        },
        usage(&w, 1, 20, None),
    ];
    assert_eq!(s.usage_of(w.id).await.unwrap(), intervals);

    // What must not change: `w`, its timeline and intervals, and the workload never stored.
    let unknown = workload(ids[1], "acme", "p", Phase::Queued);
    let unchanged = || async {
        assert_eq!(s.get_workload(w.id, None).await.unwrap(), Some(done.clone()));
        assert_eq!(s.events(w.id, None).await.unwrap().len(), 3);
        assert_eq!(s.usage_of(w.id).await.unwrap(), intervals);
        assert_eq!(s.get_workload(unknown.id, None).await.unwrap(), None);
    };
    let fails = |batch: Vec<Change>| async move { s.commit(&batch).await };
    let later = |w: &Workload| Change::Update {
        workload: Workload {
            phase: Phase::Failed,
            ..w.clone()
        }
        .into(),
        events: vec![event(w.next_seq, Step::Failed, None)],
    };

    // An update before the insert of its workload finds nothing to update …
    let r = fails(vec![later(&unknown), insert(&unknown)]).await;
    assert!(matches!(r, Err(StoreError::Corrupt(_))), "update before insert: {r:?}");
    unchanged().await;
    // … or, when the workload is stored, the insert finds its id taken.
    let r = fails(vec![later(&w), insert(&w)]).await;
    assert!(
        matches!(r, Err(StoreError::Conflict(_))),
        "update, then insert again: {r:?}"
    );
    unchanged().await;
    // A close before the open of its interval finds nothing open.
    let r = fails(vec![
        Change::CloseUsage {
            workload: w.id,
            seq: 2,
            ended_at: 30,
            util_avg: None,
        },
        Change::OpenUsage(usage(&w, 2, 25, None)),
    ])
    .await;
    assert!(matches!(r, Err(StoreError::Corrupt(_))), "close before open: {r:?}");
    unchanged().await;
    // An interval closes once.
    let close = Change::CloseUsage {
        workload: w.id,
        seq: 1,
        ended_at: 30,
        util_avg: None,
    };
    let r = fails(vec![close.clone(), close]).await;
    assert!(matches!(r, Err(StoreError::Corrupt(_))), "closed twice: {r:?}");
    unchanged().await;
    // Of two failing changes, the first decides.
    let r = fails(vec![later(&unknown), insert(&w)]).await;
    assert!(
        matches!(r, Err(StoreError::Corrupt(_))),
        "unknown update, then a taken id: {r:?}"
    );
    let r = fails(vec![insert(&w), later(&unknown)]).await;
    assert!(
        matches!(r, Err(StoreError::Conflict(_))),
        "a taken id, then an unknown update: {r:?}"
    );
    unchanged().await;
}

/// A batch of any size commits whole, every field intact, or fails whole: 150 workloads with
/// keys, events, intervals and audit records.
pub async fn large_batches_commit_whole(s: &dyn Store) {
    const N: usize = 150;
    let ids = new_ids(s, N as u32).await;
    let ws = variety(&ids);
    let key = |w: &Workload| IdempotencyKey {
        actor: format!("tok_{}", w.spec.tenant),
        key: format!("create-{}", w.id),
        request_hash: format!("hash-{}", w.id),
    };
    let note = |w: &Workload, action: &str| {
        Change::Audit(AuditRecord {
            seq: 0,
            at: w.created_at,
            request_id: format!("req-{action}-{}", w.id),
            actor: key(w).actor,
            tenant: Some(w.spec.tenant.clone()),
            action: action.into(),
            target: format!("workloads/{}", w.id),
            outcome: 201,
            detail: String::new(),
        })
    };
    let batch: Vec<Change> = ws
        .iter()
        .flat_map(|w| {
            [
                Change::Insert {
                    workload: w.clone().into(),
                    events: vec![event(0, Step::Requested, None), event(1, Step::Authorised, None)],
                    idempotency: Some(key(w)),
                },
                note(w, "create"),
            ]
        })
        .collect();
    commit(s, &batch).await;
    for w in &ws {
        assert_eq!(s.get_workload(w.id, None).await.unwrap().as_ref(), Some(w), "inserted");
        assert_eq!(
            s.idempotent(&key(w).actor, &key(w).key).await.unwrap(),
            Some((key(w).request_hash, w.id))
        );
    }

    // Every workload advances and opens an interval; one update of a workload that is not
    // stored, the batch's last change, undoes all of it.
    let updated: Vec<Workload> = ws.iter().enumerate().map(|(i, w)| advanced(w, i)).collect();
    let mut batch: Vec<Change> = updated
        .iter()
        .flat_map(|w| {
            [
                Change::Update {
                    workload: w.clone().into(),
                    events: vec![event(2, Step::Running, None), event(3, Step::Metered, None)],
                },
                Change::OpenUsage(usage(w, 0, 100, None)),
                note(w, "run"),
            ]
        })
        .collect();
    batch.push(Change::Update {
        workload: workload(ids[N - 1] + 1_000_000, "acme", "p", Phase::Running).into(),
        events: Vec::new(),
    });
    let r = s.commit(&batch).await;
    assert!(matches!(r, Err(StoreError::Corrupt(_))), "unknown workload: {r:?}");
    for w in [&ws[0], &ws[64], &ws[N - 1]] {
        assert_eq!(s.get_workload(w.id, None).await.unwrap().as_ref(), Some(w), "undone");
        assert_eq!(s.events(w.id, None).await.unwrap().len(), 2);
        assert!(s.usage_of(w.id).await.unwrap().is_empty());
    }
    assert_eq!(s.audit(None, None, 1_000).await.unwrap().len(), N);

    batch.pop();
    commit(s, &batch).await;
    // Then every interval closes, one of them twice: the batch fails; without it, it commits.
    let closes: Vec<Change> = updated
        .iter()
        .map(|w| Change::CloseUsage {
            workload: w.id,
            seq: 0,
            ended_at: 200,
            util_avg: Some(0.25),
        })
        .collect();
    let twice: Vec<Change> = closes.iter().chain(&closes[70..71]).cloned().collect();
    let r = s.commit(&twice).await;
    assert!(
        matches!(r, Err(StoreError::Corrupt(_))),
        "an interval closed twice: {r:?}"
    );
    assert_eq!(
        s.usage_of(updated[0].id).await.unwrap(),
        vec![usage(&updated[0], 0, 100, None)]
    );
    commit(s, &closes).await;

    for (i, w) in updated.iter().enumerate() {
        assert_eq!(
            s.get_workload(w.id, None).await.unwrap().as_ref(),
            Some(w),
            "updated {i}"
        );
        assert_eq!(
            s.events(w.id, None).await.unwrap(),
            vec![
                event(0, Step::Requested, None),
                event(1, Step::Authorised, None),
                event(2, Step::Running, None),
                event(3, Step::Metered, None)
            ]
        );
        assert_eq!(
            s.usage_of(w.id).await.unwrap(),
            vec![UsageInterval {
                util_avg: Some(0.25),
                ..usage(w, 0, 100, Some(200))
            }]
        );
    }
    let log = s.audit(None, None, 1_000).await.unwrap();
    assert_eq!(log.len(), 2 * N);
    // Newest first: the batch's records in reverse batch order.
    let want: Vec<String> = ["run", "create"]
        .iter()
        .flat_map(|action| ws.iter().rev().map(move |w| format!("req-{action}-{}", w.id)))
        .collect();
    assert_eq!(log.iter().map(|r| r.request_id.clone()).collect::<Vec<_>>(), want);
}

/// Every field of a workload survives an insert, and every mutable field an update.
pub async fn workloads_round_trip_every_field(s: &dyn Store) {
    let ids = new_ids(s, 20).await;
    let ws = variety(&ids);
    let batch: Vec<Change> = ws.iter().map(insert).collect();
    commit(s, &batch).await;
    for w in &ws {
        assert_eq!(s.get_workload(w.id, None).await.unwrap().as_ref(), Some(w), "inserted");
    }
    let listed = s
        .list_workloads(&WorkloadFilter {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    let newest_first: Vec<Workload> = ws.iter().rev().cloned().collect();
    assert_eq!(listed, newest_first);
    let active: Vec<Workload> = ws.iter().filter(|w| !w.phase.is_terminal()).cloned().collect();
    assert_eq!(s.active_workloads().await.unwrap(), active);

    let updated: Vec<Workload> = ws.iter().enumerate().map(|(i, w)| advanced(w, i)).collect();
    let batch: Vec<Change> = updated
        .iter()
        .map(|w| Change::Update {
            workload: w.clone().into(),
            events: vec![event(1, Step::Queued, Some(ReasonCode::NoCapacity))],
        })
        .collect();
    commit(s, &batch).await;
    for w in &updated {
        assert_eq!(s.get_workload(w.id, None).await.unwrap().as_ref(), Some(w), "updated");
    }
}

/// A multi-node gang keeps its spec (every field, or whole nodes with a remainder share) and,
/// once placed, its
/// node-shares in gang order, in single reads, listings and the active set; requeued, it holds
/// none again.
pub async fn gangs_round_trip_with_their_node_shares(s: &dyn Store) {
    let ids = new_ids(s, 3).await;
    let gang = |id: u64, spec: GangSpec| {
        let mut w = workload(id, "acme", "train", Phase::Queued);
        w.units = GpuUnits::whole(u64::from(spec.gpus));
        w.spec.shape.gpu = GpuSpec::Gang(spec);
        w.spec.shape.pool = Some("training".into());
        w.spec.shape.models = vec!["H100-80GB-SXM".into()];
        w.reason = Some(Reason::new(ReasonCode::NoCapacity, "no rack has 32 free GPUs"));
        w
    };
    let full = gang(
        ids[0],
        GangSpec {
            gpus: 32,
            gpus_per_node: Some(8),
            topology: Some(TopologyConstraint::required("rack")),
            segment: Some(16),
            remainder: false,
        },
    );
    let bare = gang(
        ids[1],
        GangSpec {
            gpus: 12,
            gpus_per_node: None,
            topology: None,
            segment: None,
            remainder: true,
        },
    );
    let preferred = gang(
        ids[2],
        GangSpec {
            gpus: 4,
            gpus_per_node: Some(4),
            topology: Some(TopologyConstraint::preferred("topology.example.com/block")),
            segment: None,
            remainder: false,
        },
    );
    let queued = vec![full.clone(), bare.clone(), preferred.clone()];
    commit(s, &queued.iter().map(insert).collect::<Vec<_>>()).await;
    let all = WorkloadFilter {
        limit: 100,
        ..Default::default()
    };
    let reads = |want: Vec<Workload>| {
        let all = all.clone();
        async move {
            for w in &want {
                assert_eq!(s.get_workload(w.id, None).await.unwrap().as_ref(), Some(w), "get");
                assert_eq!(
                    s.get_workload(w.id, Some("acme")).await.unwrap().as_ref(),
                    Some(w),
                    "get in scope"
                );
            }
            let newest_first: Vec<Workload> = want.iter().rev().cloned().collect();
            assert_eq!(s.list_workloads(&all).await.unwrap(), newest_first, "listed");
            let by_tenant = WorkloadFilter {
                tenant: Some("acme".into()),
                project: Some("train".into()),
                ..all.clone()
            };
            assert_eq!(
                s.list_workloads(&by_tenant).await.unwrap(),
                newest_first,
                "listed in a project"
            );
            assert_eq!(s.active_workloads().await.unwrap(), want, "active");
        }
    };
    reads(queued).await;

    // Placed: the full gang on four nodes (its first share in `placement`, the others after
    // it, in gang order and not by name); the preferred one within one node, with no shares.
    let share = |node: &str, gpus: std::ops::Range<u8>| Placement {
        pool: "training".into(),
        node: node.into(),
        model: "H100-80GB-SXM".into(),
        units: GpuUnits::whole(gpus.len() as u64),
        gpus: gpus.collect(),
        slice: Slice::Whole,
    };
    let placed = |w: &Workload, first: Placement, shares: Vec<Placement>| Workload {
        phase: Phase::Placed,
        reason: None,
        placement: Some(first),
        shares,
        borrowing: true,
        next_seq: w.next_seq + 1,
        ..w.clone()
    };
    let full_placed = placed(
        &full,
        share("h100-00", 0..8),
        vec![
            share("h100-07", 0..8),
            share("h100-02 \"rack «b»\"", 8..16),
            share("h100-01", 0..8),
        ],
    );
    let preferred_placed = placed(&preferred, share("h100-05", 4..8), Vec::new());
    let update = |w: &Workload, step: Step| Change::Update {
        workload: w.clone().into(),
        events: vec![event(w.next_seq - 1, step, None)],
    };
    commit(
        s,
        &[
            update(&full_placed, Step::Placed),
            update(&preferred_placed, Step::Placed),
        ],
    )
    .await;
    assert_eq!(full_placed.held_units(), GpuUnits::whole(32));
    reads(vec![full_placed.clone(), bare.clone(), preferred_placed.clone()]).await;
    let placed_only = WorkloadFilter {
        phases: vec![Phase::Placed],
        ..all.clone()
    };
    assert_eq!(
        s.list_workloads(&placed_only).await.unwrap(),
        vec![preferred_placed.clone(), full_placed.clone()]
    );

    // Requeued: no placement and no shares, as a workload on one node that never ran.
    let requeued = Workload {
        phase: Phase::Queued,
        reason: Some(Reason::new(ReasonCode::Preemption, "node h100-07 drained")),
        placement: None,
        shares: vec![],
        borrowing: false,
        next_seq: full_placed.next_seq + 1,
        ..full_placed.clone()
    };
    commit(s, &[update(&requeued, Step::Queued)]).await;
    let back = s.get_workload(requeued.id, None).await.unwrap().unwrap();
    assert!(back.placement.is_none() && back.shares.is_empty(), "{back:?}");
    assert_eq!(back, requeued);
    reads(vec![requeued.clone(), bare, preferred_placed]).await;

    // Placed again elsewhere, then ended: the shares of the new placement replace nothing old.
    let again = placed(&requeued, share("h100-10", 0..8), vec![share("h100-11", 0..8)]);
    let ended = Workload {
        phase: Phase::Succeeded,
        ended_at: Some(again.created_at + 60_000),
        next_seq: again.next_seq + 1,
        ..again.clone()
    };
    commit(s, &[update(&again, Step::Placed), update(&ended, Step::Released)]).await;
    assert_eq!(s.get_workload(ended.id, None).await.unwrap(), Some(ended.clone()));
    assert!(!s.active_workloads().await.unwrap().iter().any(|w| w.id == ended.id));
}

/// Events come back in order with their steps, times, details and codes.
pub async fn events_round_trip_in_order_with_codes(s: &dyn Store) {
    let ids = new_ids(s, 2).await;
    let w = workload(ids[0], "acme", "p", Phase::Pending);
    let other = workload(ids[1], "acme", "p", Phase::Pending);
    let first = vec![
        event(0, Step::Requested, None),
        Event {
            detail: "line one\nline two, «ü» and \"quotes\"".into(),
            ..event(1, Step::Authorised, None)
        },
    ];
    commit(
        s,
        &[
            Change::Insert {
                workload: w.clone().into(),
                events: first.clone(),
                idempotency: None,
            },
            insert(&other),
        ],
    )
    .await;
    // Every step, then every code.
    let mut later = Vec::new();
    for step in Step::ALL {
        later.push(event(2 + later.len() as u32, step, None));
    }
    for code in ReasonCode::ALL {
        later.push(event(2 + later.len() as u32, Step::Queued, Some(code)));
    }
    let (a, b) = later.split_at(7);
    for events in [a, b] {
        commit(
            s,
            &[Change::Update {
                workload: w.clone().into(),
                events: events.to_vec(),
            }],
        )
        .await;
    }
    let want: Vec<Event> = first.into_iter().chain(later).collect();
    assert_eq!(s.events(w.id, None).await.unwrap(), want);
    assert_eq!(
        s.events(other.id, None).await.unwrap(),
        vec![event(0, Step::Requested, None)]
    );
    assert!(s.events(WorkloadId(ids[1] + 1_000), None).await.unwrap().is_empty());
}

/// Scope, tenant, project, phases, `before` and `limit`, newest first.
/// The tenant and project of the `i`th workload of the listing tests: tenants alternate,
/// every third is in project `q`.
fn spread(i: usize) -> (&'static str, &'static str) {
    (
        if i.is_multiple_of(2) { "acme" } else { "globex" },
        if i.is_multiple_of(3) { "q" } else { "p" },
    )
}

pub async fn list_workloads_filters(s: &dyn Store) {
    let ids = new_ids(s, 12).await;
    let phases = [Phase::Queued, Phase::Running, Phase::Failed, Phase::Succeeded];
    let ws: Vec<Workload> = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            let (tenant, project) = spread(i);
            workload(id, tenant, project, phases[i % 4])
        })
        .collect();
    commit(s, &ws.iter().map(insert).collect::<Vec<_>>()).await;

    let some = |x: &str| Some(x.to_string());
    let f =
        |scope: Option<String>, tenant: Option<String>, project: Option<String>, phases: Vec<Phase>| WorkloadFilter {
            scope,
            tenant,
            project,
            phases,
            before: None,
            limit: 100,
            ..Default::default()
        };
    let cases = vec![
        f(None, None, None, vec![]),
        f(some("acme"), None, None, vec![]),
        f(some("acme"), some("acme"), None, vec![]),
        f(some("acme"), some("globex"), None, vec![]),
        f(some("globex"), None, some("q"), vec![]),
        f(None, some("globex"), None, vec![]),
        f(None, None, some("q"), vec![]),
        f(None, some("acme"), some("p"), vec![]),
        f(None, None, None, vec![Phase::Queued]),
        f(None, None, None, vec![Phase::Running, Phase::Failed]),
        f(
            some("acme"),
            None,
            some("p"),
            vec![Phase::Queued, Phase::Failed, Phase::Pending],
        ),
        WorkloadFilter {
            before: Some(WorkloadId(ids[7])),
            ..f(None, None, None, vec![])
        },
        WorkloadFilter {
            before: Some(WorkloadId(ids[9])),
            limit: 2,
            ..f(some("globex"), None, None, vec![Phase::Running, Phase::Succeeded])
        },
        WorkloadFilter {
            limit: 3,
            ..f(None, None, None, vec![])
        },
    ];
    for filter in &cases {
        let want: Vec<u64> = ws
            .iter()
            .rev()
            .filter(|w| filter.scope.as_ref().is_none_or(|t| *t == w.spec.tenant))
            .filter(|w| filter.tenant.as_ref().is_none_or(|t| *t == w.spec.tenant))
            .filter(|w| filter.project.as_ref().is_none_or(|p| *p == w.spec.project))
            .filter(|w| filter.phases.is_empty() || filter.phases.contains(&w.phase))
            .filter(|w| filter.before.is_none_or(|b| w.id < b))
            .take(filter.limit as usize)
            .map(|w| w.id.0)
            .collect();
        let got = s.list_workloads(filter).await.unwrap();
        assert_eq!(ids_of(&got), want, "{filter:?}");
    }
    // Spelled out: another tenant's scope hides everything, whatever the tenant filter says.
    assert!(s.list_workloads(&cases[3]).await.unwrap().is_empty());

    // Paging with `before` visits every workload once, newest first.
    let mut seen = Vec::new();
    let mut before = None;
    loop {
        let page = s
            .list_workloads(&WorkloadFilter {
                before,
                limit: 5,
                ..Default::default()
            })
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        before = Some(last.id);
        seen.extend(ids_of(&page));
    }
    assert_eq!(seen, ids.iter().rev().copied().collect::<Vec<_>>());
}

/// Every order a workload listing has.
const ORDERS: [WorkloadOrder; 4] = [
    WorkloadOrder::Newest,
    WorkloadOrder::Oldest,
    WorkloadOrder::Name,
    WorkloadOrder::Phase,
];

/// `n` new workloads spread over tenants and projects ([`spread`]), with names that sort
/// differently by byte and by locale and every kind of phase, stored: their ids and the
/// workloads.
async fn names_and_phases(s: &dyn Store, n: u32) -> (Vec<u64>, Vec<Workload>) {
    let ids = new_ids(s, n).await;
    let names = ["b", "B", "a-x", "ax", "Zeta", "a x", "é", "b"];
    let phases = [
        Phase::Queued,
        Phase::Running,
        Phase::Failed,
        Phase::Succeeded,
        Phase::Cancelled,
    ];
    let ws: Vec<Workload> = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            let (tenant, project) = spread(i);
            let mut w = workload(id, tenant, project, phases[(i * 3) % 5]);
            w.spec.name = names[(i * 5) % names.len()].to_string();
            w
        })
        .collect();
    commit(s, &ws.iter().map(insert).collect::<Vec<_>>()).await;
    (ids, ws)
}

/// Every order of a listing holds over every matching workload, in pages each read after the
/// last workload of the one before (keyset paging): oldest
/// first, by name in byte order (`B` < `Zeta` < `a x` < `a-x` < `ax` < `b` < `é`, whatever the
/// database's locale) and by phase, the newest first among equals; with the scope, tenant,
/// project and phase filters as the newest-first listing has them.
pub async fn list_workloads_orders_page_over_every_workload(s: &dyn Store) {
    let (_, ws) = names_and_phases(s, 40).await;
    let some = |x: &str| Some(x.to_string());
    let filters = [
        WorkloadFilter::default(),
        WorkloadFilter {
            scope: some("acme"),
            ..Default::default()
        },
        WorkloadFilter {
            tenant: some("globex"),
            project: some("p"),
            ..Default::default()
        },
        WorkloadFilter {
            scope: some("acme"),
            tenant: some("globex"),
            ..Default::default()
        },
        WorkloadFilter {
            project: some("q"),
            phases: vec![Phase::Queued, Phase::Failed],
            ..Default::default()
        },
    ];
    for order in ORDERS {
        for filter in &filters {
            let mut want: Vec<&Workload> = ws
                .iter()
                .filter(|w| filter.scope.as_ref().is_none_or(|t| *t == w.spec.tenant))
                .filter(|w| filter.tenant.as_ref().is_none_or(|t| *t == w.spec.tenant))
                .filter(|w| filter.project.as_ref().is_none_or(|p| *p == w.spec.project))
                .filter(|w| filter.phases.is_empty() || filter.phases.contains(&w.phase))
                .collect();
            match order {
                WorkloadOrder::Newest => want.sort_by_key(|w| std::cmp::Reverse(w.id)),
                WorkloadOrder::Oldest => want.sort_by_key(|w| w.id),
                WorkloadOrder::Name => {
                    want.sort_by(|a, b| a.spec.name.as_bytes().cmp(b.spec.name.as_bytes()).then(b.id.cmp(&a.id)))
                }
                WorkloadOrder::Phase => {
                    want.sort_by(|a, b| a.phase.as_str().cmp(b.phase.as_str()).then(b.id.cmp(&a.id)))
                }
            }
            let want: Vec<u64> = want.iter().map(|w| w.id.0).collect();
            // Pages of 7, each after the last of the one before, until one comes back short.
            let mut pages: Vec<Vec<Workload>> = Vec::new();
            let mut after = None;
            loop {
                let rows = s
                    .list_workloads(&WorkloadFilter {
                        order,
                        after: after.clone(),
                        limit: 7,
                        ..filter.clone()
                    })
                    .await
                    .unwrap();
                let full = rows.len() == 7;
                after = rows.last().map(|last| WorkloadSeek::of(order, last));
                pages.push(rows);
                if !full {
                    break;
                }
            }
            let got: Vec<u64> = pages.iter().flat_map(|p| ids_of(p)).collect();
            // And backward: the page before each page's first workload is the page before it.
            for pair in pages.windows(2) {
                let Some(first) = pair[1].first() else { continue };
                let back = s
                    .list_workloads(&WorkloadFilter {
                        order,
                        after: Some(WorkloadSeek::of(order, first)),
                        backward: true,
                        limit: 7,
                        ..filter.clone()
                    })
                    .await
                    .unwrap();
                assert_eq!(ids_of(&back), ids_of(&pair[0]), "{order:?} {filter:?} backward");
            }
            assert_eq!(got, want, "{order:?} {filter:?}");
        }
    }
    // Names in byte order, spelled out for the whole list.
    let by_name = s
        .list_workloads(&WorkloadFilter {
            order: WorkloadOrder::Name,
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut seen: Vec<&str> = by_name.iter().map(|w| w.spec.name.as_str()).collect();
    seen.dedup();
    assert_eq!(seen, ["B", "Zeta", "a x", "a-x", "ax", "b", "é"]);
}

/// [`WorkloadStore::count_workloads`] counts what the listing answers without its limit: with
/// every filter (a tenant scope counts only that tenant's workloads, whatever the tenant filter
/// says), and in every order the workloads after a position (before it, backward) — the row
/// number of a page's first row.
pub async fn count_workloads_counts_what_the_listing_answers(s: &dyn Store) {
    let (ids, _) = names_and_phases(s, 30).await;
    let some = |x: &str| Some(x.to_string());
    let all = |f: WorkloadFilter| WorkloadFilter { limit: 1000, ..f };
    // Spelled out: 15 workloads each of acme and globex, none across.
    let acme = WorkloadFilter {
        scope: some("acme"),
        ..Default::default()
    };
    assert_eq!(s.count_workloads(&acme).await.unwrap(), 15);
    let across = WorkloadFilter {
        scope: some("acme"),
        tenant: some("globex"),
        ..Default::default()
    };
    assert_eq!(s.count_workloads(&across).await.unwrap(), 0);
    assert_eq!(s.count_workloads(&WorkloadFilter::default()).await.unwrap(), 30);
    let filters = [
        WorkloadFilter::default(),
        acme.clone(),
        across,
        WorkloadFilter {
            tenant: some("globex"),
            project: some("p"),
            ..Default::default()
        },
        WorkloadFilter {
            scope: some("globex"),
            project: some("q"),
            phases: vec![Phase::Queued, Phase::Failed, Phase::Queued],
            ..Default::default()
        },
        WorkloadFilter {
            before: Some(WorkloadId(ids[20])),
            phases: vec![Phase::Running, Phase::Succeeded],
            // The limit is not counted.
            limit: 2,
            ..Default::default()
        },
    ];
    for order in ORDERS {
        for filter in &filters {
            let f = WorkloadFilter {
                order,
                ..filter.clone()
            };
            let listed = s.list_workloads(&all(f.clone())).await.unwrap();
            let n = listed.len() as u64;
            assert_eq!(s.count_workloads(&f).await.unwrap(), n, "{f:?}");
            for (k, w) in listed.iter().enumerate() {
                let at = Some(WorkloadSeek::of(order, w));
                let after = WorkloadFilter {
                    after: at.clone(),
                    ..f.clone()
                };
                let before = WorkloadFilter {
                    after: at,
                    backward: true,
                    ..f.clone()
                };
                assert_eq!(
                    s.count_workloads(&after).await.unwrap(),
                    n - k as u64 - 1,
                    "after #{k} {f:?}"
                );
                assert_eq!(s.count_workloads(&before).await.unwrap(), k as u64, "before #{k} {f:?}");
            }
        }
    }
}

/// Pages read after a workload ([`WorkloadFilter::after`]) neither repeat nor skip a workload
/// when others are added between two pages, in every order: the pages read are the full
/// listing's order with none of the earlier workloads missing, and the new workloads appear
/// exactly where they sort after the page already read.
pub async fn list_workloads_pages_hold_under_inserts(s: &dyn Store) {
    let names = ["m", "c", "x", "m", "a", "t"];
    let phases = [Phase::Queued, Phase::Running, Phase::Failed];
    let make = |ids: &[u64], shift: usize| -> Vec<Workload> {
        ids.iter()
            .enumerate()
            .map(|(i, &id)| {
                let mut w = workload(id, "acme", "p", phases[(i + shift) % 3]);
                w.spec.name = names[(i + shift) % names.len()].to_string();
                w
            })
            .collect()
    };
    for order in ORDERS {
        let tenant = format!("t-{order:?}");
        let first = make(&new_ids(s, 12).await, 0);
        let first: Vec<Workload> = first
            .into_iter()
            .map(|mut w| {
                w.spec.tenant = tenant.clone();
                w
            })
            .collect();
        commit(s, &first.iter().map(insert).collect::<Vec<_>>()).await;
        let filter = WorkloadFilter {
            tenant: Some(tenant.clone()),
            order,
            limit: 5,
            ..Default::default()
        };
        let page = |after: Option<WorkloadSeek>| {
            let f = WorkloadFilter {
                after,
                ..filter.clone()
            };
            async move { s.list_workloads(&f).await.unwrap() }
        };
        let mut read = page(None).await;
        assert_eq!(read.len(), 5, "{order:?}");
        // Six more, sorting before, among and after the first page in every order.
        let more: Vec<Workload> = make(&new_ids(s, 6).await, 1)
            .into_iter()
            .map(|mut w| {
                w.spec.tenant = tenant.clone();
                w
            })
            .collect();
        commit(s, &more.iter().map(insert).collect::<Vec<_>>()).await;
        loop {
            let after = read.last().map(|w| WorkloadSeek::of(order, w));
            let rows = page(after).await;
            let done = rows.len() < 5;
            read.extend(rows);
            if done {
                break;
            }
        }
        let all = s
            .list_workloads(&WorkloadFilter {
                limit: 100,
                ..filter.clone()
            })
            .await
            .unwrap();
        assert_eq!(all.len(), 18, "{order:?}");
        let read_ids = ids_of(&read);
        // In the listing's order, nothing twice …
        let in_order: Vec<u64> = ids_of(&all).into_iter().filter(|id| read_ids.contains(id)).collect();
        assert_eq!(read_ids, in_order, "{order:?}");
        // … every workload there before the first page was read …
        for w in &first {
            assert!(read_ids.contains(&w.id.0), "{order:?}: {} skipped", w.id);
        }
        // … and every later one that sorts after the first page, none before it.
        let first_page_end = all.iter().position(|w| w.id == read[4].id).unwrap();
        for (i, w) in all.iter().enumerate() {
            let is_new = more.iter().any(|m| m.id == w.id);
            if is_new {
                assert_eq!(read_ids.contains(&w.id.0), i > first_page_end, "{order:?}: {}", w.id);
            }
        }
    }
}

/// `active_workloads` is every workload not in a terminal phase, oldest first.
pub async fn active_workloads_exclude_terminal_phases(s: &dyn Store) {
    let ids = new_ids(s, 20).await;
    let ws: Vec<Workload> = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| workload(id, "acme", "p", Phase::ALL[(i * 7) % 10]))
        .collect();
    commit(s, &ws.iter().map(insert).collect::<Vec<_>>()).await;
    let want: Vec<Workload> = ws.iter().filter(|w| !w.phase.is_terminal()).cloned().collect();
    assert_eq!(want.len(), 12);
    assert_eq!(s.active_workloads().await.unwrap(), want);

    // A workload that ends leaves the active set.
    let mut ended = want[0].clone();
    ended.phase = Phase::Succeeded;
    commit(
        s,
        &[Change::Update {
            workload: ended.into(),
            events: Vec::new(),
        }],
    )
    .await;
    assert_eq!(s.active_workloads().await.unwrap(), want[1..].to_vec());
}

/// Reserved ids are never handed out twice, also to reservers racing each other.
pub async fn reserved_ids_are_never_handed_out_twice(s: &dyn Store) {
    let a = s.reserve_workload_ids(5).await.unwrap();
    let b = s.reserve_workload_ids(1).await.unwrap();
    let none = s.reserve_workload_ids(0).await.unwrap();
    assert_eq!((a.end - a.start, b.end - b.start), (5, 1));
    assert!(a.start >= 1, "ids start at 1: {a:?}");
    assert!(b.start >= a.end, "{a:?} then {b:?}");
    assert!(none.is_empty());

    let reserver = || async {
        let mut got = Vec::new();
        for n in 1..=40u32 {
            got.extend(s.reserve_workload_ids(n % 3 + 1).await.unwrap());
        }
        got
    };
    let (x, y) = tokio::join!(reserver(), reserver());
    let mut all: BTreeSet<u64> = a.chain(b).collect();
    for id in x.iter().chain(&y) {
        assert!(all.insert(*id), "id {id} handed out twice");
    }
    assert_eq!(all.len(), 6 + x.len() + y.len());
}

/// An idempotency key is unique per actor and finds its workload and request hash.
pub async fn idempotency_keys_are_unique_per_actor(s: &dyn Store) {
    let ids = new_ids(s, 3).await;
    let key = |actor: &str, hash: &str| IdempotencyKey {
        actor: actor.into(),
        key: "create-1".into(),
        request_hash: hash.into(),
    };
    let with_key = |id: u64, k: IdempotencyKey| Change::Insert {
        workload: workload(id, "acme", "p", Phase::Pending).into(),
        events: vec![event(0, Step::Requested, None)],
        idempotency: Some(k),
    };
    assert_eq!(s.idempotent("tok_a", "create-1").await.unwrap(), None);
    commit(s, &[with_key(ids[0], key("tok_a", "h-a"))]).await;
    assert_eq!(
        s.idempotent("tok_a", "create-1").await.unwrap(),
        Some(("h-a".into(), WorkloadId(ids[0])))
    );
    assert_eq!(s.idempotent("tok_b", "create-1").await.unwrap(), None);
    assert_eq!(s.idempotent("tok_a", "create-2").await.unwrap(), None);

    let r = s.commit(&[with_key(ids[1], key("tok_a", "h-other"))]).await;
    assert!(matches!(r, Err(StoreError::Conflict(_))), "same actor and key: {r:?}");
    assert_eq!(s.get_workload(WorkloadId(ids[1]), None).await.unwrap(), None);
    assert_eq!(
        s.idempotent("tok_a", "create-1").await.unwrap(),
        Some(("h-a".into(), WorkloadId(ids[0])))
    );

    commit(s, &[with_key(ids[2], key("tok_b", "h-b"))]).await;
    assert_eq!(
        s.idempotent("tok_b", "create-1").await.unwrap(),
        Some(("h-b".into(), WorkloadId(ids[2])))
    );
}

/// Intervals open and close; `usage_between` returns those overlapping `[from, to)`, and
/// `closed_usage` sums the closed ones cut to the range, per tenant.
pub async fn usage_intervals_open_close_and_overlap(s: &dyn Store) {
    let ids = new_ids(s, 3).await;
    let w1 = workload(ids[0], "acme", "p", Phase::Running);
    let w2 = workload(ids[1], "acme", "q", Phase::Running);
    let w3 = workload(ids[2], "globex", "p", Phase::Running);
    commit(s, &[insert(&w1), insert(&w2), insert(&w3)]).await;

    let mut a0 = usage(&w1, 0, 10, None);
    a0.units = GpuUnits(125);
    a0.shape = "MIG 1g.10gb".into();
    commit(s, &[Change::OpenUsage(a0.clone())]).await;
    assert_eq!(s.usage_of(w1.id).await.unwrap(), vec![a0.clone()]);
    commit(
        s,
        &[
            Change::CloseUsage {
                workload: w1.id,
                seq: 0,
                ended_at: 20,
                util_avg: Some(0.625),
            },
            Change::OpenUsage(usage(&w1, 1, 20, None)),
        ],
    )
    .await;
    commit(
        s,
        &[Change::CloseUsage {
            workload: w1.id,
            seq: 1,
            ended_at: 30,
            util_avg: None,
        }],
    )
    .await;
    let b0 = usage(&w2, 0, 25, None);
    let c0 = usage(&w3, 0, 15, None);
    commit(s, &[Change::OpenUsage(b0.clone()), Change::OpenUsage(c0.clone())]).await;
    commit(
        s,
        &[Change::CloseUsage {
            workload: w3.id,
            seq: 0,
            ended_at: 40,
            util_avg: Some(1.0),
        }],
    )
    .await;

    let a0 = UsageInterval {
        ended_at: Some(20),
        util_avg: Some(0.625),
        ..a0
    };
    let a1 = usage(&w1, 1, 20, Some(30));
    let c0 = UsageInterval {
        ended_at: Some(40),
        util_avg: Some(1.0),
        ..c0
    };
    assert_eq!(s.usage_of(w1.id).await.unwrap(), vec![a0.clone(), a1.clone()]);
    assert_eq!(s.usage_of(w2.id).await.unwrap(), vec![b0.clone()]);

    // a0 [10, 20), a1 [20, 30), b0 [25, open), c0 [15, 40): an interval overlaps [from, to)
    // when it starts before `to` and has not ended by `from`.
    let between =
        |tenant: Option<&'static str>, from, to| async move { s.usage_between(tenant, from, to).await.unwrap() };
    assert_eq!(
        between(None, 0, 100).await,
        vec![a0.clone(), c0.clone(), a1.clone(), b0.clone()]
    );
    assert_eq!(between(None, 20, 25).await, vec![c0.clone(), a1.clone()]);
    assert_eq!(between(None, 19, 20).await, vec![a0.clone(), c0.clone()]);
    assert_eq!(between(None, 1_000, 2_000).await, vec![b0.clone()]);
    assert_eq!(between(None, 0, 10).await, Vec::<UsageInterval>::new());
    assert_eq!(between(Some("acme"), 0, 100).await, vec![a0, a1, b0]);
    assert_eq!(between(Some("globex"), 30, 41).await, vec![c0]);
    assert!(between(Some("initech"), 0, 100).await.is_empty());

    // Closed use within [from, to), per tenant, in milli-GPU-unit milliseconds: a0 (125 milli)
    // and a1, c0 (1,000 milli) cut to the range; b0 is open and never counts.
    let closed = |from, to| async move { s.closed_usage(from, to).await.unwrap() };
    let acme_globex = |acme: i64, globex: i64| vec![("acme".to_string(), acme), ("globex".to_string(), globex)];
    assert_eq!(closed(0, 100).await, acme_globex(125 * 10 + 1_000 * 10, 1_000 * 25));
    assert_eq!(closed(18, 35).await, acme_globex(125 * 2 + 1_000 * 10, 1_000 * 17));
    assert_eq!(closed(30, 35).await, vec![("globex".to_string(), 1_000 * 5)]);
    assert_eq!(closed(12, 16).await, acme_globex(125 * 4, 1_000));
    assert!(closed(40, 100).await.is_empty());
    assert!(closed(0, 10).await.is_empty());
}

/// Tenants and projects: create, conflicts, get, ordered pages, and delete refusals.
/// An image policy is stored whole, replaced whole, removed with its tenant, and its audit
/// record lands with each change (and only with a change).
pub async fn image_policies_round_trip_with_their_audit_record(s: &dyn Store) {
    s.create_tenant(&TenantRecord {
        name: "acme".into(),
        display_name: "Acme".into(),
        created_at: 1,
        priorities: None,
    })
    .await
    .unwrap();
    let audit = |action: &str| AuditRecord {
        seq: 0,
        at: 7,
        request_id: "req-p".into(),
        actor: "tok_a".into(),
        tenant: Some("acme".into()),
        action: action.into(),
        target: "/api/v1/tenants/acme/image-policy".into(),
        outcome: 200,
        detail: String::new(),
    };
    let pem = "-----BEGIN PUBLIC KEY-----\nMFkw«ü»\n-----END PUBLIC KEY-----\n";
    let mut p = ImagePolicyRecord {
        tenant: "acme".into(),
        registries: vec!["registry.example.com/team-a/".into(), "docker.io/library/".into()],
        cosign_keys: vec![pem.into(), format!("{pem}\n")],
        updated_at: 10,
    };
    assert_eq!(s.image_policy("acme").await.unwrap(), None);
    s.set_image_policy(&p, &audit("PUT set")).await.unwrap();
    assert_eq!(s.image_policy("acme").await.unwrap(), Some(p.clone()));
    p.registries.clear();
    p.updated_at = 11;
    s.set_image_policy(&p, &audit("PUT replace")).await.unwrap();
    assert_eq!(s.image_policy("acme").await.unwrap(), Some(p.clone()));
    let r = s
        .set_image_policy(
            &ImagePolicyRecord {
                tenant: "nobody".into(),
                ..p.clone()
            },
            &audit("PUT nobody"),
        )
        .await;
    assert!(matches!(r, Err(StoreError::Corrupt(_))), "{r:?}");
    assert!(s.delete_image_policy("acme", &audit("DELETE")).await.unwrap());
    assert!(!s.delete_image_policy("acme", &audit("DELETE again")).await.unwrap());
    assert_eq!(s.image_policy("acme").await.unwrap(), None);
    let actions = audit_log(s, Some("acme"), |a| a.action).await;
    assert_eq!(actions, ["DELETE", "PUT replace", "PUT set"]);

    // The policy goes with its tenant.
    s.set_image_policy(&p, &audit("PUT again")).await.unwrap();
    assert!(s.delete_tenant("acme").await.unwrap());
    assert_eq!(s.image_policy("acme").await.unwrap(), None);
}

/// A tenant's priority grant is stored at creation or set later, read back in the order given
/// (by `get_tenant` and `list_tenants`), reset to the default with `None`, and each change's
/// audit record lands with it; a grant for a tenant that does not exist changes nothing and
/// leaves no record.
pub async fn priority_grants_round_trip_with_their_audit_record(s: &dyn Store) {
    let classes = |c: &[&str]| c.iter().map(|c| c.to_string()).collect::<Vec<_>>();
    s.create_tenant(&TenantRecord {
        name: "acme".into(),
        display_name: "Acme".into(),
        created_at: 1,
        priorities: Some(classes(&["high", "standard"])),
    })
    .await
    .unwrap();
    create_tenants(s, &["globex"]).await;
    let audit = |tenant: &str, detail: &str| AuditRecord {
        seq: 0,
        at: 7,
        request_id: "req-g".into(),
        actor: "tok_admin".into(),
        tenant: Some(tenant.into()),
        action: "PUT /api/v1/tenants/{tenant}/priorities".into(),
        target: format!("/api/v1/tenants/{tenant}/priorities"),
        outcome: 200,
        detail: detail.into(),
    };
    let grant = |t: &'static str| async move { s.get_tenant(t).await.unwrap().unwrap().priorities };
    assert_eq!(grant("acme").await, Some(classes(&["high", "standard"])));
    assert_eq!(grant("globex").await, None);

    let critical = classes(&["critical", "opportunistic"]);
    assert!(
        s.set_tenant_priorities("globex", Some(&critical), &audit("globex", "grant critical"))
            .await
            .unwrap()
    );
    assert_eq!(grant("globex").await, Some(critical.clone()));
    let listed: Vec<_> = s
        .list_tenants(None, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|t| (t.name, t.priorities))
        .collect();
    assert_eq!(
        listed,
        [
            ("acme".to_string(), Some(classes(&["high", "standard"]))),
            ("globex".to_string(), Some(critical)),
        ]
    );
    assert!(
        s.set_tenant_priorities("globex", None, &audit("globex", "default"))
            .await
            .unwrap()
    );
    assert_eq!(grant("globex").await, None);
    assert!(
        !s.set_tenant_priorities("nobody", Some(&classes(&["critical"])), &audit("nobody", "x"))
            .await
            .unwrap()
    );
    assert!(s.get_tenant("nobody").await.unwrap().is_none());
    let details = audit_log(s, None, |a| a.detail).await;
    assert_eq!(details, ["default", "grant critical"]);
}

/// `apply_tenancy` makes every change of a declaration and its audit record in one
/// transaction: a valid one lands whole; one whose last change conflicts, or that names a
/// tenant that does not exist, leaves nothing behind (not the tenants, projects, quotas,
/// budgets, policies and grants before it, nor its audit record).
pub async fn declarations_apply_whole_or_not_at_all(s: &dyn Store) {
    create_tenants(s, &["acme"]).await;
    let tenant = |name: &str| TenantRecord {
        name: name.into(),
        display_name: name.into(),
        created_at: 3,
        priorities: None,
    };
    let project = |tenant: &str, name: &str| ProjectRecord {
        tenant: tenant.into(),
        name: name.into(),
        created_at: 3,
    };
    let quota = |tenant: &str, class: &str| QuotaRecord {
        tenant: tenant.into(),
        class: class.into(),
        guaranteed_milli: 8000,
        limit_milli: Some(16_000),
    };
    let audit = |detail: &str| AuditRecord {
        seq: 0,
        at: 3,
        request_id: "req-apply".into(),
        actor: "tok_admin".into(),
        tenant: None,
        action: "POST /api/v1/apply".into(),
        target: "/api/v1/apply".into(),
        outcome: 200,
        detail: detail.into(),
    };
    let everything = |t: &str| {
        vec![
            TenancyChange::CreateTenant(tenant(t)),
            TenancyChange::SetPriorities {
                tenant: t.into(),
                classes: Some(vec!["high".into(), "standard".into()]),
            },
            TenancyChange::CreateProject(project(t, "train")),
            TenancyChange::SetQuota {
                quota: quota(t, "training"),
                at: 3,
            },
            TenancyChange::SetBudget {
                tenant: t.into(),
                unit_hours: Some(100.0),
                at: 3,
            },
            TenancyChange::SetImagePolicy(ImagePolicyRecord {
                tenant: t.into(),
                registries: vec!["registry.example.com/".into()],
                cosign_keys: vec![],
                updated_at: 3,
            }),
            TenancyChange::SetQuota {
                quota: quota("acme", "serving"),
                at: 3,
            },
        ]
    };
    // What the store holds, told apart by tenant.
    let state = || async {
        let tenants: Vec<TenantRecord> = s.list_tenants(None, 100).await.unwrap();
        let mut projects = Vec::new();
        for t in &tenants {
            projects.extend(s.list_projects(&t.name, None, 100).await.unwrap());
        }
        let mut policies = Vec::new();
        for t in &tenants {
            policies.push(s.image_policy(&t.name).await.unwrap());
        }
        (
            tenants,
            projects,
            s.quotas().await.unwrap(),
            s.budgets().await.unwrap(),
            policies,
            s.audit(None, None, 100).await.unwrap().len(),
        )
    };

    let before = state().await;
    // The last change conflicts (acme exists): nothing of the batch lands.
    let mut conflicting = everything("good1");
    conflicting.push(TenancyChange::CreateTenant(tenant("acme")));
    let r = s.apply_tenancy(&conflicting, &[audit("conflicting")]).await;
    assert!(matches!(r, Err(StoreError::Conflict(_))), "{r:?}");
    assert_eq!(state().await, before, "a conflicting declaration changes nothing");
    assert!(s.get_tenant("good1").await.unwrap().is_none());
    // A change naming a tenant nobody created: nothing lands.
    let mut dangling = everything("good2");
    dangling.push(TenancyChange::CreateProject(project("nobody", "p")));
    let r = s.apply_tenancy(&dangling, &[audit("dangling")]).await;
    assert!(matches!(r, Err(StoreError::Corrupt(_))), "{r:?}");
    assert_eq!(state().await, before, "a dangling reference changes nothing");
    // A project twice: nothing lands.
    let mut twice = everything("good3");
    twice.push(TenancyChange::CreateProject(project("good3", "train")));
    let r = s.apply_tenancy(&twice, &[audit("twice")]).await;
    assert!(matches!(r, Err(StoreError::Conflict(_))), "{r:?}");
    assert_eq!(state().await, before, "a duplicate project changes nothing");

    // A valid declaration lands whole, with its audit record.
    let mut valid = everything("good1");
    valid.push(TenancyChange::DeleteQuota {
        tenant: "acme".into(),
        class: "serving".into(),
    });
    valid.push(TenancyChange::SetBudget {
        tenant: "acme".into(),
        unit_hours: None,
        at: 4,
    });
    s.apply_tenancy(&valid, &[audit("valid")]).await.unwrap();
    let t = s.get_tenant("good1").await.unwrap().unwrap();
    assert_eq!(t.priorities, Some(vec!["high".to_string(), "standard".to_string()]));
    assert!(s.get_project("good1", "train").await.unwrap().is_some());
    assert_eq!(s.quotas().await.unwrap(), vec![quota("good1", "training")]);
    assert_eq!(s.budgets().await.unwrap(), vec![("good1".to_string(), 100.0)]);
    assert!(s.image_policy("good1").await.unwrap().is_some());
    let details = audit_log(s, None, |a| a.detail).await;
    assert_eq!(details, ["valid"]);
}

pub async fn tenants_and_projects(s: &dyn Store) {
    let tenant = |name: &str, at: i64| TenantRecord {
        name: name.into(),
        display_name: format!("{name} Ltd «ü»"),
        created_at: at,
        priorities: None,
    };
    let project = |tenant: &str, name: &str| ProjectRecord {
        tenant: tenant.into(),
        name: name.into(),
        created_at: 5,
    };
    for (i, name) in ["globex", "acme", "initech", "hooli"].iter().enumerate() {
        s.create_tenant(&tenant(name, i as i64)).await.unwrap();
    }
    let r = s.create_tenant(&tenant("acme", 99)).await;
    assert!(matches!(r, Err(StoreError::Conflict(_))), "tenant twice: {r:?}");
    assert_eq!(s.get_tenant("acme").await.unwrap(), Some(tenant("acme", 1)));
    assert_eq!(s.get_tenant("nobody").await.unwrap(), None);
    let names = |ts: Vec<TenantRecord>| ts.into_iter().map(|t| t.name).collect::<Vec<_>>();
    assert_eq!(
        names(s.list_tenants(None, 10).await.unwrap()),
        ["acme", "globex", "hooli", "initech"]
    );
    assert_eq!(names(s.list_tenants(None, 2).await.unwrap()), ["acme", "globex"]);
    assert_eq!(
        names(s.list_tenants(Some("globex"), 10).await.unwrap()),
        ["hooli", "initech"]
    );

    for name in ["train", "eval", "serve"] {
        s.create_project(&project("acme", name)).await.unwrap();
    }
    s.create_project(&project("globex", "train")).await.unwrap();
    let r = s.create_project(&project("acme", "train")).await;
    assert!(matches!(r, Err(StoreError::Conflict(_))), "project twice: {r:?}");
    assert_eq!(
        s.get_project("acme", "eval").await.unwrap(),
        Some(project("acme", "eval"))
    );
    assert_eq!(s.get_project("globex", "eval").await.unwrap(), None);
    let pnames = |ps: Vec<ProjectRecord>| ps.into_iter().map(|p| p.name).collect::<Vec<_>>();
    assert_eq!(
        pnames(s.list_projects("acme", None, 10).await.unwrap()),
        ["eval", "serve", "train"]
    );
    assert_eq!(
        pnames(s.list_projects("acme", Some("eval"), 1).await.unwrap()),
        ["serve"]
    );
    assert_eq!(pnames(s.list_projects("globex", None, 10).await.unwrap()), ["train"]);

    // A project with workloads stays; one without goes.
    let id = new_ids(s, 1).await[0];
    commit(s, &[insert(&workload(id, "acme", "train", Phase::Queued))]).await;
    assert!(!s.delete_project("acme", "train").await.unwrap());
    assert!(s.delete_project("acme", "eval").await.unwrap());
    assert!(!s.delete_project("acme", "eval").await.unwrap(), "already gone");
    assert_eq!(s.get_project("acme", "eval").await.unwrap(), None);

    // A tenant with projects, workloads or tokens stays.
    assert!(!s.delete_tenant("acme").await.unwrap());
    assert!(!s.delete_tenant("globex").await.unwrap());
    assert!(s.delete_project("globex", "train").await.unwrap());
    s.create_token(&TokenRecord {
        id: "tok_h".into(),
        hash: "hash-h".into(),
        tenant: Some("hooli".into()),
        role: "member".into(),
        name: "ci".into(),
        created_at: 1,
        expires_at: None,
        revoked_at: None,
    })
    .await
    .unwrap();
    assert!(!s.delete_tenant("hooli").await.unwrap());
    let id = new_ids(s, 1).await[0];
    commit(s, &[insert(&workload(id, "initech", "gone", Phase::Succeeded))]).await;
    assert!(!s.delete_tenant("initech").await.unwrap());

    assert!(s.delete_tenant("globex").await.unwrap());
    assert!(!s.delete_tenant("globex").await.unwrap(), "already gone");
    assert_eq!(s.get_tenant("globex").await.unwrap(), None);
    assert_eq!(
        names(s.list_tenants(None, 10).await.unwrap()),
        ["acme", "hooli", "initech"]
    );
}

/// Tokens: create, conflicts on id and hash, lookups, listing, revocation and count.
pub async fn tokens(s: &dyn Store) {
    create_tenants(s, &["acme", "globex"]).await;
    let token = |id: &str, tenant: Option<&str>, created_at: i64| TokenRecord {
        id: id.into(),
        hash: format!("sha256-of-{id}"),
        tenant: tenant.map(Into::into),
        role: if tenant.is_some() {
            "tenant-admin"
        } else {
            "platform-admin"
        }
        .into(),
        name: format!("token {id}"),
        created_at,
        expires_at: (created_at % 2 == 0).then_some(created_at + 3_600_000),
        revoked_at: None,
    };
    assert_eq!(s.token_count().await.unwrap(), 0);
    let root = token("tok_root", None, 1);
    let a1 = token("tok_a1", Some("acme"), 2);
    let a2 = token("tok_a2", Some("acme"), 3);
    let g1 = token("tok_g1", Some("globex"), 4);
    for t in [&root, &a1, &a2, &g1] {
        s.create_token(t).await.unwrap();
    }
    let r = s.create_token(&token("tok_a1", Some("globex"), 9)).await;
    assert!(matches!(r, Err(StoreError::Conflict(_))), "same id: {r:?}");
    let r = s
        .create_token(&TokenRecord {
            id: "tok_new".into(),
            ..a2.clone()
        })
        .await;
    assert!(matches!(r, Err(StoreError::Conflict(_))), "same hash: {r:?}");
    assert_eq!(s.token_count().await.unwrap(), 4);

    assert_eq!(s.find_token("sha256-of-tok_a2").await.unwrap(), Some(a2.clone()));
    assert_eq!(s.find_token("unknown").await.unwrap(), None);
    assert_eq!(s.get_token("tok_root").await.unwrap(), Some(root.clone()));
    assert_eq!(s.get_token("tok_nope").await.unwrap(), None);
    assert_eq!(
        s.list_tokens(None).await.unwrap(),
        vec![g1.clone(), a2.clone(), a1.clone(), root.clone()]
    );
    assert_eq!(s.list_tokens(Some("acme")).await.unwrap(), vec![a2.clone(), a1.clone()]);
    assert!(s.list_tokens(Some("initech")).await.unwrap().is_empty());

    assert_eq!(s.revoke_token("tok_a1", 50).await.unwrap(), Revocation::Revoked);
    assert_eq!(
        s.revoke_token("tok_a1", 60).await.unwrap(),
        Revocation::NotActive,
        "already revoked"
    );
    assert_eq!(s.revoke_token("tok_nope", 60).await.unwrap(), Revocation::NotActive);
    let revoked = TokenRecord {
        revoked_at: Some(50),
        ..a1
    };
    assert_eq!(s.get_token("tok_a1").await.unwrap(), Some(revoked.clone()));
    assert_eq!(s.find_token(&revoked.hash).await.unwrap(), Some(revoked));
    assert_eq!(s.token_count().await.unwrap(), 4, "revoked tokens still count");
}

/// The last platform-admin token without an expiry cannot be revoked; others can, and the
/// guard counts neither revoked nor expiring admin tokens.
pub async fn last_platform_admin_token_stays(s: &dyn Store) {
    let admin = |id: &str, expires_at: Option<i64>| TokenRecord {
        id: id.into(),
        hash: format!("sha256-of-{id}"),
        tenant: None,
        role: PLATFORM_ADMIN.into(),
        name: id.into(),
        created_at: 1,
        expires_at,
        revoked_at: None,
    };
    s.create_token(&admin("tok_root", None)).await.unwrap();
    s.create_token(&admin("tok_expiring", Some(9_999_999_999_999)))
        .await
        .unwrap();
    assert_eq!(
        s.revoke_token("tok_root", 10).await.unwrap(),
        Revocation::LastPlatformAdmin,
        "an admin token that expires is no way back in"
    );
    assert_eq!(s.get_token("tok_root").await.unwrap().unwrap().revoked_at, None);
    assert_eq!(s.revoke_token("tok_expiring", 10).await.unwrap(), Revocation::Revoked);
    s.create_token(&admin("tok_second", None)).await.unwrap();
    assert_eq!(s.revoke_token("tok_root", 20).await.unwrap(), Revocation::Revoked);
    assert_eq!(
        s.revoke_token("tok_second", 30).await.unwrap(),
        Revocation::LastPlatformAdmin,
        "tok_root is revoked now: tok_second is the last"
    );
    assert_eq!(s.revoke_token("tok_root", 40).await.unwrap(), Revocation::NotActive);

    // Two revocations racing for the last two lasting admin tokens: exactly one wins, so one
    // way in always remains.
    let mut survivor = "tok_second".to_string();
    for round in 0..10 {
        let other = format!("tok_round{round}");
        s.create_token(&admin(&other, None)).await.unwrap();
        let (a, b) = tokio::join!(
            s.revoke_token(&survivor, 50 + round),
            s.revoke_token(&other, 50 + round)
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        let outcomes = [a, b];
        assert!(
            outcomes.contains(&Revocation::Revoked) && outcomes.contains(&Revocation::LastPlatformAdmin),
            "round {round}: {outcomes:?}"
        );
        if a == Revocation::Revoked {
            survivor = other;
        }
        let active: Vec<String> = s
            .list_tokens(None)
            .await
            .unwrap()
            .into_iter()
            .filter(|t| t.role == PLATFORM_ADMIN && t.revoked_at.is_none() && t.expires_at.is_none())
            .map(|t| t.id)
            .collect();
        assert_eq!(active, [survivor.clone()], "round {round}");
    }
    // Other roles are revoked as before.
    create_tenants(s, &["acme"]).await;
    s.create_token(&TokenRecord {
        tenant: Some("acme".into()),
        role: "tenant-admin".into(),
        ..admin("tok_tenant_admin", None)
    })
    .await
    .unwrap();
    assert_eq!(
        s.revoke_token("tok_tenant_admin", 60).await.unwrap(),
        Revocation::Revoked
    );
}

/// Quotas and budgets: upsert, delete, ordering; they go with their tenant.
pub async fn quotas_and_budgets(s: &dyn Store) {
    create_tenants(s, &["globex", "acme"]).await;
    let quota = |tenant: &str, class: &str, guaranteed: u64, limit: Option<u64>| QuotaRecord {
        tenant: tenant.into(),
        class: class.into(),
        guaranteed_milli: guaranteed,
        limit_milli: limit,
    };
    s.set_quota(&quota("globex", "train", 4000, None), 1).await.unwrap();
    s.set_quota(&quota("acme", "train/H100-80GB-SXM", 8000, Some(16_000)), 1)
        .await
        .unwrap();
    s.set_quota(&quota("acme", "shared", 500, Some(2000)), 1).await.unwrap();
    assert_eq!(
        s.quotas().await.unwrap(),
        vec![
            quota("acme", "shared", 500, Some(2000)),
            quota("acme", "train/H100-80GB-SXM", 8000, Some(16_000)),
            quota("globex", "train", 4000, None),
        ]
    );
    s.set_quota(&quota("acme", "shared", 1000, None), 2).await.unwrap();
    s.set_quota(&quota("globex", "train", 0, Some(1000)), 2).await.unwrap();
    assert!(s.delete_quota("acme", "train/H100-80GB-SXM").await.unwrap());
    assert!(!s.delete_quota("acme", "train/H100-80GB-SXM").await.unwrap());
    assert!(!s.delete_quota("globex", "shared").await.unwrap());
    assert_eq!(
        s.quotas().await.unwrap(),
        vec![
            quota("acme", "shared", 1000, None),
            quota("globex", "train", 0, Some(1000))
        ]
    );

    s.set_budget("globex", Some(120.5), 1).await.unwrap();
    s.set_budget("acme", Some(1_000.0), 1).await.unwrap();
    assert_eq!(
        s.budgets().await.unwrap(),
        vec![("acme".into(), 1_000.0), ("globex".into(), 120.5)]
    );
    s.set_budget("acme", Some(0.25), 2).await.unwrap();
    s.set_budget("globex", None, 2).await.unwrap();
    s.set_budget("globex", None, 3).await.unwrap();
    assert_eq!(s.budgets().await.unwrap(), vec![("acme".into(), 0.25)]);

    // Deleting a tenant takes its quotas and budget with it.
    assert!(s.delete_tenant("acme").await.unwrap());
    assert_eq!(s.quotas().await.unwrap(), vec![quota("globex", "train", 0, Some(1000))]);
    assert!(s.budgets().await.unwrap().is_empty());
}

/// The store assigns audit sequence numbers, strictly increasing, also to racing appends.
pub async fn audit_sequence_numbers_come_from_the_store(s: &dyn Store) {
    let record = |i: usize, tenant: Option<&str>| AuditRecord {
        // Ignored: the store assigns sequence numbers.
        seq: 999_999,
        at: 1_000 + i as i64,
        request_id: format!("req-{i}"),
        actor: "tok_a".into(),
        tenant: tenant.map(Into::into),
        action: "POST /api/v1/workloads".into(),
        target: format!("workloads/{i}"),
        outcome: if i.is_multiple_of(2) { 201 } else { 403 },
        detail: "«ü»".into(),
    };
    assert!(s.append_audit(&[]).await.unwrap().is_empty());
    let first: Vec<AuditRecord> = (0..3).map(|i| record(i, Some("acme"))).collect();
    let a = s.append_audit(&first).await.unwrap();
    let b = s.append_audit(&[record(3, None)]).await.unwrap();
    assert_eq!(a.len(), 3);
    assert!(a.windows(2).all(|p| p[0] < p[1]), "{a:?}");
    assert!(b.len() == 1 && b[0] > a[2], "{a:?} then {b:?}");

    let racing = |tenant: &'static str| {
        let records: Vec<AuditRecord> = (10..30).map(|i| record(i, Some(tenant))).collect();
        async move { s.append_audit(&records).await.unwrap() }
    };
    let (x, y) = tokio::join!(racing("acme"), racing("globex"));
    for seqs in [&x, &y] {
        assert_eq!(seqs.len(), 20);
        assert!(seqs.windows(2).all(|p| p[0] < p[1]), "{seqs:?}");
    }
    let all: BTreeSet<u64> = a.iter().chain(&b).chain(&x).chain(&y).copied().collect();
    assert_eq!(all.len(), 44, "every sequence number handed out once");

    let log = s.audit(None, None, 100).await.unwrap();
    let seqs: Vec<u64> = log.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, all.iter().rev().copied().collect::<Vec<_>>(), "newest first");
    let stored = |seq: u64| log.iter().find(|r| r.seq == seq).unwrap().clone();
    assert_eq!(
        stored(a[1]),
        AuditRecord {
            seq: a[1],
            ..first[1].clone()
        }
    );
    assert_eq!(
        stored(b[0]),
        AuditRecord {
            seq: b[0],
            ..record(3, None)
        }
    );

    let acme = s.audit(Some("acme"), None, 100).await.unwrap();
    assert_eq!(acme.len(), 23);
    assert!(acme.iter().all(|r| r.tenant.as_deref() == Some("acme")));
    let page = s.audit(None, Some(b[0]), 2).await.unwrap();
    assert_eq!(page.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![a[2], a[1]]);
    assert!(s.audit(Some("acme"), Some(a[0]), 10).await.unwrap().is_empty());
}

/// An audit record in a batch lands with the batch or not at all, numbered from the same
/// sequence as `append_audit`'s, also when the two race.
pub async fn audit_records_commit_with_their_batch(s: &dyn Store) {
    let record = |request: &str| AuditRecord {
        // Ignored: the store assigns sequence numbers.
        seq: 999_999,
        at: 2_000,
        request_id: request.into(),
        actor: "tok_a".into(),
        tenant: Some("acme".into()),
        action: "POST /api/v1/workloads".into(),
        target: format!("workloads/{request}"),
        outcome: 201,
        detail: "«ü»".into(),
    };
    let ids = new_ids(s, 2).await;
    let w = workload(ids[0], "acme", "p", Phase::Pending);

    let a = s.append_audit(&[record("a0"), record("a1")]).await.unwrap();
    commit(
        s,
        &[insert(&w), Change::Audit(record("b0")), Change::Audit(record("b1"))],
    )
    .await;
    let c = s.append_audit(&[record("c0")]).await.unwrap();
    commit(s, &[Change::Audit(record("d0"))]).await;

    // A failing batch leaves no record, whether it conflicts or finds nothing to update.
    let r = s.commit(&[Change::Audit(record("x0")), insert(&w)]).await;
    assert!(matches!(r, Err(StoreError::Conflict(_))), "taken id: {r:?}");
    let r = s
        .commit(&[
            Change::Audit(record("x1")),
            Change::Update {
                workload: workload(ids[1], "acme", "p", Phase::Queued).into(),
                events: Vec::new(),
            },
        ])
        .await;
    assert!(matches!(r, Err(StoreError::Corrupt(_))), "unknown workload: {r:?}");

    let log = s.audit(None, None, 100).await.unwrap();
    let requests: Vec<&str> = log.iter().map(|r| r.request_id.as_str()).collect();
    assert_eq!(
        requests,
        ["d0", "c0", "b1", "b0", "a1", "a0"],
        "newest first, no failed record"
    );
    let seqs: Vec<u64> = log.iter().rev().map(|r| r.seq).collect();
    assert!(
        seqs.windows(2).all(|p| p[0] < p[1]),
        "increasing in commit order: {seqs:?}"
    );
    assert_eq!(
        (&seqs[..2], seqs[4]),
        (&a[..], c[0]),
        "append_audit's numbers are the stored ones"
    );
    assert_eq!(
        log[3],
        AuditRecord {
            seq: seqs[2],
            ..record("b0")
        }
    );

    // Racing: an appender and a committer, each one record at a time.
    let appender = || async {
        for i in 0..20 {
            s.append_audit(&[record(&format!("r-append-{i}"))]).await.unwrap();
        }
    };
    let committer = || async {
        for i in 0..20 {
            commit(s, &[Change::Audit(record(&format!("r-commit-{i}")))]).await;
        }
    };
    tokio::join!(appender(), committer());
    let log = s.audit(None, None, 100).await.unwrap();
    assert_eq!(log.len(), 46);
    let all: BTreeSet<u64> = log.iter().map(|r| r.seq).collect();
    assert_eq!(all.len(), 46, "every sequence number handed out once");
    for path in ["r-append-", "r-commit-"] {
        let mut mine: Vec<(usize, u64)> = log
            .iter()
            .filter_map(|r| Some((r.request_id.strip_prefix(path)?.parse().ok()?, r.seq)))
            .collect();
        mine.sort();
        assert_eq!(mine.len(), 20, "{path}");
        assert!(mine.windows(2).all(|p| p[0].1 < p[1].1), "{path} in order: {mine:?}");
    }
}

/// Single workloads and timelines are only visible within the caller's tenant scope.
pub async fn reads_are_scoped(s: &dyn Store) {
    let ids = new_ids(s, 1).await;
    let w = workload(ids[0], "acme", "p", Phase::Queued);
    commit(
        s,
        &[Change::Insert {
            workload: w.clone().into(),
            events: vec![event(0, Step::Requested, None), event(1, Step::Authorised, None)],
            idempotency: None,
        }],
    )
    .await;
    assert_eq!(s.get_workload(w.id, Some("acme")).await.unwrap(), Some(w.clone()));
    assert_eq!(s.get_workload(w.id, None).await.unwrap(), Some(w.clone()));
    assert_eq!(s.get_workload(w.id, Some("globex")).await.unwrap(), None);
    assert_eq!(s.events(w.id, Some("acme")).await.unwrap().len(), 2);
    assert_eq!(s.events(w.id, None).await.unwrap().len(), 2);
    assert!(s.events(w.id, Some("globex")).await.unwrap().is_empty());
}

/// The leader lease: one holder at a time, epochs that grow with every acquisition, renewals
/// only by the holder of the current epoch, expiry by the database's clock, and racing
/// acquisitions of which exactly one wins.
pub async fn the_lease_has_one_holder_at_a_time(s: &dyn Store) {
    const LONG: u64 = 60_000;
    assert_eq!(s.lease().await.unwrap(), None, "never acquired");
    assert!(!s.renew_lease("a", 1, LONG).await.unwrap(), "nothing to renew");

    let e1 = s
        .acquire_lease("a", "http://a:8080", LONG)
        .await
        .unwrap()
        .expect("a free lease");
    let lease = s.lease().await.unwrap().expect("acquired");
    assert_eq!(
        (lease.holder.as_str(), lease.url.as_str(), lease.epoch),
        ("a", "http://a:8080", e1)
    );
    assert!(lease.valid() && lease.remaining_ms <= LONG as i64, "{lease:?}");
    assert!(lease.expires_at - lease.acquired_at == LONG as i64, "{lease:?}");
    assert_eq!(s.acquire_lease("b", "http://b", LONG).await.unwrap(), None, "held by a");
    assert!(s.renew_lease("a", e1, LONG).await.unwrap());
    assert!(!s.renew_lease("b", e1, LONG).await.unwrap(), "not b's");
    assert!(!s.renew_lease("a", e1 + 1, LONG).await.unwrap(), "not that epoch");
    // `a` again (restarted with the same id): a new epoch at once, the old one is over.
    let e1 = {
        let again = s
            .acquire_lease("a", "http://a:9090", LONG)
            .await
            .unwrap()
            .expect("its own lease");
        assert!(again > e1, "{e1} then {again}");
        assert!(
            !s.renew_lease("a", e1, LONG).await.unwrap(),
            "the previous incarnation's epoch"
        );
        assert_eq!(s.lease().await.unwrap().unwrap().url, "http://a:9090");
        again
    };

    // Released: the next acquisition, by anyone, has the next epoch.
    s.release_lease("b", e1).await.unwrap();
    assert!(s.lease().await.unwrap().unwrap().valid(), "only the holder releases");
    s.release_lease("a", e1).await.unwrap();
    assert!(!s.lease().await.unwrap().unwrap().valid());
    assert!(
        !s.renew_lease("a", e1, LONG).await.unwrap(),
        "a released lease is not renewed"
    );

    // Expiry, by the database's clock: a short lease not renewed in time is taken over, and
    // its holder can no longer renew it.
    let e2 = s.acquire_lease("b", "http://b", 300).await.unwrap().expect("released");
    assert!(e2 > e1, "{e1} then {e2}");
    assert_eq!(s.acquire_lease("a", "http://a", LONG).await.unwrap(), None);
    tokio::time::sleep(std::time::Duration::from_millis(450)).await;
    let lease = s.lease().await.unwrap().unwrap();
    assert!(!lease.valid(), "expired: {lease:?}");
    assert!(!s.renew_lease("b", e2, LONG).await.unwrap(), "too late to renew");
    let e3 = s.acquire_lease("a", "http://a", LONG).await.unwrap().expect("expired");
    assert!(e3 > e2, "{e2} then {e3}");
    assert!(!s.renew_lease("b", e2, LONG).await.unwrap());
    assert_eq!(s.lease().await.unwrap().unwrap().holder, "a");

    // Racing acquisitions of a free lease: exactly one wins.
    s.release_lease("a", e3).await.unwrap();
    let race = |h: &'static str| async move { s.acquire_lease(h, h, LONG).await.unwrap() };
    let (x, y, z) = tokio::join!(race("x"), race("y"), race("z"));
    let won: Vec<u64> = [x, y, z].into_iter().flatten().collect();
    assert_eq!(won.len(), 1, "{x:?} {y:?} {z:?}");
    assert!(won[0] > e3);
    let holder = s.lease().await.unwrap().unwrap().holder;
    assert!(["x", "y", "z"].contains(&holder.as_str()));
}

/// A fenced batch commits only while its holder holds the lease with its epoch: a stale
/// epoch, another holder, an expired lease or a lease never acquired refuse it whole.
pub async fn fenced_batches_commit_only_for_the_lease_holder(s: &dyn Store) {
    const LONG: u64 = 60_000;
    let ids = new_ids(s, 4).await;
    let ws: Vec<Workload> = ids
        .iter()
        .map(|&id| workload(id, "acme", "p", Phase::Pending))
        .collect();
    let fence = |holder: &str, epoch: u64| {
        Change::Fence(Fence {
            holder: holder.into(),
            epoch,
        })
    };
    let note = |i: usize| submission_audit(format!("fenced-{i}"), "");
    let refused = |r: crate::Result<()>, why: &str| {
        assert!(matches!(r, Err(StoreError::Fenced(_))), "{why}: {r:?}");
    };

    refused(s.commit(&[fence("a", 1), insert(&ws[0])]).await, "never acquired");
    let e1 = s.acquire_lease("a", "http://a", LONG).await.unwrap().unwrap();
    commit(s, &[fence("a", e1), insert(&ws[0]), note(0)]).await;
    // The fence is checked first wherever it stands.
    commit(s, &[insert(&ws[1]), fence("a", e1)]).await;
    refused(s.commit(&[insert(&ws[2]), fence("b", e1)]).await, "another holder");
    refused(s.commit(&[insert(&ws[2]), fence("a", e1 + 1)]).await, "another epoch");

    // Taken over after expiry: the old holder's batches are refused, the new one's commit.
    s.release_lease("a", e1).await.unwrap();
    refused(s.commit(&[fence("a", e1), insert(&ws[2]), note(2)]).await, "released");
    let e2 = s.acquire_lease("b", "http://b", 300).await.unwrap().unwrap();
    refused(
        s.commit(&[fence("a", e1), insert(&ws[2]), note(2)]).await,
        "stale epoch",
    );
    let mut running = ws[0].clone();
    running.phase = Phase::Running;
    refused(
        s.commit(&[
            fence("a", e1),
            Change::Update {
                workload: running.clone().into(),
                events: vec![event(1, Step::Running, None)],
            },
        ])
        .await,
        "stale update",
    );
    commit(s, &[fence("b", e2), insert(&ws[3])]).await;
    tokio::time::sleep(std::time::Duration::from_millis(450)).await;
    refused(
        s.commit(&[fence("b", e2), insert(&ws[2])]).await,
        "expired, not taken over",
    );

    // Nothing of the refused batches landed.
    assert_eq!(s.get_workload(ws[0].id, None).await.unwrap(), Some(ws[0].clone()));
    assert_eq!(s.events(ws[0].id, None).await.unwrap().len(), 1);
    assert_eq!(s.get_workload(ws[1].id, None).await.unwrap(), Some(ws[1].clone()));
    assert_eq!(s.get_workload(ws[2].id, None).await.unwrap(), None);
    assert_eq!(s.get_workload(ws[3].id, None).await.unwrap(), Some(ws[3].clone()));
    let log = s.audit(None, None, 10).await.unwrap();
    assert_eq!(
        log.iter().map(|r| r.request_id.as_str()).collect::<Vec<_>>(),
        ["fenced-0"]
    );
}

/// Heartbeats: one row per replica, its last heartbeat by the database's clock, pruning.
pub async fn replicas_record_heartbeats(s: &dyn Store) {
    let replica = |id: &str, url: &str| ReplicaRecord {
        id: id.into(),
        url: url.into(),
        version: "0.1.0".into(),
        started_at: 1_700_000_000_000,
        // Set by the store.
        last_seen: -1,
        age_ms: -1,
    };
    assert!(s.replicas().await.unwrap().is_empty());
    s.heartbeat(&replica("r2", "http://r2")).await.unwrap();
    s.heartbeat(&replica("r1", "http://r1")).await.unwrap();
    let first = s.replicas().await.unwrap();
    assert_eq!(first.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["r1", "r2"]);
    for r in &first {
        assert!(r.last_seen > 1_600_000_000_000, "{r:?}");
        assert!((0..5_000).contains(&r.age_ms), "{r:?}");
        assert_eq!(r.started_at, 1_700_000_000_000);
    }
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    s.heartbeat(&replica("r1", "http://r1.new")).await.unwrap();
    let second = s.replicas().await.unwrap();
    assert_eq!(second.len(), 2, "one row per replica");
    assert_eq!(second[0].url, "http://r1.new");
    assert!(second[0].last_seen > first[0].last_seen, "{first:?} {second:?}");
    assert!(second[1].age_ms >= 300, "r2 fell silent: {second:?}");
    assert_eq!(s.prune_replicas(300).await.unwrap(), 1);
    let left = s.replicas().await.unwrap();
    assert_eq!(left.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["r1"]);
    assert_eq!(s.prune_replicas(60_000).await.unwrap(), 0);
}

/// Unhealthy GPUs and node states: upserted, listed in key order, cleared one by one.
pub async fn gpu_health_and_node_states(s: &dyn Store) {
    let gpu = |node: &str, gpu: u8, since: i64, xid: Option<u32>| GpuHealthRecord {
        node: node.into(),
        gpu,
        since,
        xid,
        detail: format!("failed at {since}"),
        cause: match (xid, since % 2) {
            (Some(_), _) => HealthCause::Xid,
            (None, 0) => HealthCause::Partition,
            (None, _) => HealthCause::Lost,
        },
    };
    assert!(s.unhealthy_gpus().await.unwrap().is_empty());
    s.set_gpu_unhealthy(&gpu("h100-03", 7, 10, Some(79))).await.unwrap();
    s.set_gpu_unhealthy(&gpu("a100-01", 2, 11, None)).await.unwrap();
    s.set_gpu_unhealthy(&gpu("h100-03", 1, 12, Some(48))).await.unwrap();
    // A second failure of the same GPU replaces the first.
    s.set_gpu_unhealthy(&gpu("h100-03", 7, 13, Some(94))).await.unwrap();
    assert_eq!(
        s.unhealthy_gpus().await.unwrap(),
        vec![
            gpu("a100-01", 2, 11, None),
            gpu("h100-03", 1, 12, Some(48)),
            gpu("h100-03", 7, 13, Some(94)),
        ]
    );
    assert!(s.clear_gpu_health("h100-03", 7).await.unwrap());
    assert!(!s.clear_gpu_health("h100-03", 7).await.unwrap());
    assert!(!s.clear_gpu_health("a100-01", 3).await.unwrap());
    assert_eq!(
        s.unhealthy_gpus().await.unwrap(),
        vec![gpu("a100-01", 2, 11, None), gpu("h100-03", 1, 12, Some(48))]
    );

    let node = |node: &str, state: &str, since: i64| NodeStateRecord {
        node: node.into(),
        state: crate::NodeState::parse(state).expect("a node state"),
        since,
        detail: format!("{state} by admin"),
    };
    assert!(s.node_states().await.unwrap().is_empty());
    s.set_node_state(&node("l40s-02", "cordoned", 1)).await.unwrap();
    s.set_node_state(&node("a100-00", "draining", 2)).await.unwrap();
    s.set_node_state(&node("l40s-02", "maintenance", 3)).await.unwrap();
    assert_eq!(
        s.node_states().await.unwrap(),
        vec![node("a100-00", "draining", 2), node("l40s-02", "maintenance", 3)]
    );
    assert!(s.clear_node_state("a100-00").await.unwrap());
    assert!(!s.clear_node_state("a100-00").await.unwrap());
    assert_eq!(s.node_states().await.unwrap(), vec![node("l40s-02", "maintenance", 3)]);

    let mig = |node: &str, gpu: u8, enabled: bool, pending: bool, since: i64| crate::GpuMigRecord {
        node: node.into(),
        gpu,
        enabled,
        pending,
        since,
        detail: format!("set by admin at {since}"),
    };
    assert!(s.gpu_mig_modes().await.unwrap().is_empty());
    s.set_gpu_mig(&mig("a100-01", 3, false, false, 4)).await.unwrap();
    s.set_gpu_mig(&mig("a100-00", 7, true, true, 5)).await.unwrap();
    // A later change of the same GPU replaces the earlier one.
    s.set_gpu_mig(&mig("a100-01", 3, true, false, 6)).await.unwrap();
    assert_eq!(
        s.gpu_mig_modes().await.unwrap(),
        vec![mig("a100-00", 7, true, true, 5), mig("a100-01", 3, true, false, 6)]
    );
    // Through a lifecycle batch, as an admin's change commits with its audit record.
    s.commit(&[crate::Change::GpuMig(mig("a100-00", 7, false, false, 7))])
        .await
        .unwrap();
    assert_eq!(s.gpu_mig_modes().await.unwrap()[0], mig("a100-00", 7, false, false, 7));
}

/// Drains keep their deadline and policy, service moves their replacement; both upserted,
/// listed in key order, cleared one by one.
pub async fn drains_and_service_moves(s: &dyn Store) {
    let drain = |node: &str, deadline_ms: Option<i64>, preempt: bool| DrainRecord {
        node: node.into(),
        deadline_ms,
        preempt,
    };
    assert!(s.drains().await.unwrap().is_empty());
    s.set_drain(&drain("l40s-02", Some(1_700_000_000_000), true))
        .await
        .unwrap();
    s.set_drain(&drain("a100-00", None, false)).await.unwrap();
    s.set_drain(&drain("l40s-02", Some(5), false)).await.unwrap();
    assert_eq!(
        s.drains().await.unwrap(),
        vec![drain("a100-00", None, false), drain("l40s-02", Some(5), false)]
    );
    assert!(s.clear_drain("a100-00").await.unwrap());
    assert!(!s.clear_drain("a100-00").await.unwrap());
    assert_eq!(s.drains().await.unwrap(), vec![drain("l40s-02", Some(5), false)]);

    let mv = |old: u64, new: u64| ServiceMoveRecord {
        old: WorkloadId(old),
        replacement: WorkloadId(new),
        node: "h100-03".into(),
        cause: MoveCause::Drain,
        by: None,
    };
    // A consolidation move keeps the request it makes room for; an upsert replaces every field.
    let consolidation = |old: u64, new: u64, by: u64| ServiceMoveRecord {
        node: "h100-05".into(),
        cause: MoveCause::Consolidation,
        by: Some(WorkloadId(by)),
        ..mv(old, new)
    };
    assert!(s.service_moves().await.unwrap().is_empty());
    s.set_service_move(&mv(9, 12)).await.unwrap();
    s.set_service_move(&mv(3, 10)).await.unwrap();
    s.set_service_move(&consolidation(9, 13, u64::from(u32::MAX) + 7))
        .await
        .unwrap();
    assert_eq!(
        s.service_moves().await.unwrap(),
        vec![mv(3, 10), consolidation(9, 13, u64::from(u32::MAX) + 7)]
    );
    assert!(s.clear_service_move(WorkloadId(3)).await.unwrap());
    assert!(!s.clear_service_move(WorkloadId(3)).await.unwrap());
    s.set_service_move(&mv(9, 14)).await.unwrap();
    assert_eq!(s.service_moves().await.unwrap(), vec![mv(9, 14)]);
}

/// Rollouts get increasing ids from the store, round-trip every field of theirs and of their
/// nodes (in order), list newest first, and a save replaces the nodes whole.
pub async fn rollouts_round_trip_and_get_ids_from_the_store(s: &dyn Store) {
    let node = |name: &str, state: RolloutNodeState, i: i64| RolloutNodeRecord {
        node: name.into(),
        state,
        since: 100 + i,
        started_at: (i % 2 == 1).then_some(50 + i),
        ended_at: (i % 3 == 2).then_some(200 + i),
        upgrade_until: (i == 1).then_some(1_700_000_000_000),
        layout: if i == 0 {
            String::new()
        } else {
            format!("0:3g.40gb@{i} «ü»")
        },
        detail: format!("{} #{i}", state.as_str()),
    };
    let rollout = |pool: &str| RolloutRecord {
        id: 999,
        pool: pool.into(),
        max_parallel: 3,
        max_unavailable_milli: 24_000,
        deadline_s: Some(1_200),
        preempt: true,
        upgrade_s: Some(1_200),
        state: RolloutState::Running,
        created_at: 1_700_000_000_000,
        created_by: "tok_root".into(),
        ended_at: None,
        detail: String::new(),
        nodes: RolloutNodeState::ALL
            .iter()
            .enumerate()
            .map(|(i, st)| node(&format!("h100-{i:02}"), *st, i as i64))
            .collect(),
    };
    assert!(s.rollouts().await.unwrap().is_empty());
    let a = s.create_rollout(&rollout("train")).await.unwrap();
    let mut second = rollout("shared");
    second.deadline_s = None;
    second.preempt = false;
    second.upgrade_s = None;
    second.nodes.truncate(1);
    let b = s.create_rollout(&second).await.unwrap();
    assert!(b > a, "{a} then {b}");
    let all = s.rollouts().await.unwrap();
    assert_eq!(
        all,
        vec![
            RolloutRecord { id: b, ..second },
            RolloutRecord {
                id: a,
                ..rollout("train")
            }
        ],
        "newest first, every field"
    );

    let mut done = all[1].clone();
    done.state = RolloutState::Failed;
    done.ended_at = Some(1_700_000_100_000);
    done.detail = "h100-03 failed validation".into();
    done.nodes.swap(0, 2);
    done.nodes.pop();
    done.nodes[1].state = RolloutNodeState::Done;
    s.save_rollout(&done).await.unwrap();
    assert_eq!(s.rollouts().await.unwrap()[1], done);
    let r = s
        .save_rollout(&RolloutRecord {
            id: b + 100,
            ..done.clone()
        })
        .await;
    assert!(matches!(r, Err(StoreError::Corrupt(_))), "unknown rollout: {r:?}");
    assert_eq!(s.rollouts().await.unwrap().len(), 2);
    for st in RolloutState::ALL {
        assert_eq!(RolloutState::parse(st.as_str()), Some(st));
    }
}

// ----- telemetry -----------------------------------------------------------------------------

const MINUTE_MS: i64 = 60_000;
const HOUR_MS: i64 = 3_600_000;
/// An hour's start, the base of the telemetry checks' times.
const T0: i64 = 1_700_000_000_000 - 1_700_000_000_000 % HOUR_MS;

fn pool_minute(pool: &str, minute: i64, util: Option<f64>) -> TelemetryRecord {
    TelemetryRecord {
        series: TelemetrySeries::Pool(pool.into()),
        at: T0 + minute * MINUTE_MS,
        span_minutes: 1,
        minutes: 1,
        util_sum: util,
        used_mib_sum: None,
        total_mib: None,
    }
}

fn workload_minute(id: u64, minute: i64, util: f64, used: f64, total: u64) -> TelemetryRecord {
    TelemetryRecord {
        series: TelemetrySeries::Workload(id),
        at: T0 + minute * MINUTE_MS,
        span_minutes: 1,
        minutes: 1,
        util_sum: Some(util),
        used_mib_sum: Some(used),
        total_mib: Some(total),
    }
}

/// Records by start, then series, then span (`telemetry_between` promises the start's order
/// only).
fn in_read_order(mut v: Vec<TelemetryRecord>) -> Vec<TelemetryRecord> {
    v.sort_by(|a, b| (a.at, &a.series, a.span_minutes).cmp(&(b.at, &b.series, b.span_minutes)));
    v
}

/// Telemetry records read back exactly as written (every figure, `None`s, a pool whose name
/// has a colon, the largest workload id), oldest first, from the time asked; writing a minute
/// again — the same figures or others, in the same write or a later one — keeps one row with
/// the figures written last; a write larger than one statement lands whole, once.
pub async fn telemetry_reads_back_exactly_and_once_per_minute(s: &dyn Store) {
    assert!(s.telemetry_between(i64::MIN, i64::MAX).await.unwrap().is_empty());
    let written = vec![
        workload_minute(7, 2, 33.25, 1_234.5, 81_920),
        pool_minute("training", 0, Some(12.5)),
        pool_minute("inference:a", 0, None),
        workload_minute(u64::MAX, 0, 0.0, 0.0, 0),
        workload_minute(7, 0, 99.875, 40_000.0, 81_920),
        pool_minute("training", 1, Some(0.1 + 0.2)),
        TelemetryRecord {
            span_minutes: 60,
            minutes: 45,
            ..workload_minute(7, 0, 4_000.5, 1_800_000.0, 81_920)
        },
    ];
    assert_eq!(s.append_telemetry(&written).await.unwrap(), 7);
    let read = s.telemetry_between(i64::MIN, i64::MAX).await.unwrap();
    assert!(read.windows(2).all(|w| w[0].at <= w[1].at), "oldest first: {read:?}");
    let read = in_read_order(read);
    assert_eq!(read, in_read_order(written.clone()));
    assert_eq!(
        in_read_order(s.telemetry_between(T0 + MINUTE_MS, i64::MAX).await.unwrap()),
        in_read_order(written[5..6].iter().chain(&written[..1]).cloned().collect()),
        "from a time on"
    );
    assert_eq!(
        s.telemetry_between(T0 + MINUTE_MS, T0 + 2 * MINUTE_MS).await.unwrap(),
        written[5..6],
        "up to a time, not including it"
    );

    // The same minutes again (other figures), and a duplicate within one write: one row each,
    // the figures written last (the sampler's later sample of a minute replaces its first).
    let again = vec![
        workload_minute(7, 2, 1.0, 1.0, 1),
        pool_minute("training", 0, Some(77.0)),
        pool_minute("training", 3, Some(5.0)),
        pool_minute("training", 3, Some(6.0)),
    ];
    assert_eq!(s.append_telemetry(&again).await.unwrap(), 3, "one row a key");
    let read = in_read_order(s.telemetry_between(i64::MIN, i64::MAX).await.unwrap());
    assert_eq!(read.len(), 8);
    assert!(read.contains(&again[0]) && read.contains(&again[1]), "{read:?}");
    assert!(!read.contains(&written[0]) && !read.contains(&written[1]), "{read:?}");
    assert_eq!(
        read.iter()
            .filter(|r| r.at == T0 + 3 * MINUTE_MS)
            .map(|r| r.util_sum)
            .collect::<Vec<_>>(),
        [Some(6.0)]
    );
    assert_eq!(s.append_telemetry(&again).await.unwrap(), 3);
    assert_eq!(
        in_read_order(s.telemetry_between(i64::MIN, i64::MAX).await.unwrap()),
        read,
        "a retry changes nothing"
    );
    // Written back: the first figures again, and nothing else changed.
    s.append_telemetry(&written).await.unwrap();
    let read = in_read_order(s.telemetry_between(i64::MIN, i64::MAX).await.unwrap());
    assert_eq!(read.len(), 8);
    assert!(written.iter().all(|w| read.contains(w)), "{read:?}");

    // More rows than one statement writes: all of them, once.
    let many: Vec<TelemetryRecord> = (0..TELEMETRY_ROWS_PER_WRITE as u64 * 2 + 17)
        .map(|id| workload_minute(1_000 + id, 10, id as f64, 2.0 * id as f64, id))
        .collect();
    assert_eq!(s.append_telemetry(&many).await.unwrap(), many.len() as u64);
    assert_eq!(s.append_telemetry(&many).await.unwrap(), many.len() as u64);
    let tenth = in_read_order(s.telemetry_between(T0 + 10 * MINUTE_MS, i64::MAX).await.unwrap());
    assert_eq!(tenth, in_read_order(many.clone()));
    assert_eq!(s.append_telemetry(&[]).await.unwrap(), 0);
}

/// Folding takes a workload's minutes before the given hour into one record per hour (sums,
/// minute count, most memory), deletes those minutes, and leaves pools' minutes, later
/// minutes and hours already stored as they are; folding again finds nothing.
pub async fn telemetry_folds_workload_minutes_into_hours(s: &dyn Store) {
    let mut written = Vec::new();
    // Workload 1: minutes 0..90 (an hour and a half); workload 2: minutes 10 and 70.
    for m in 0..90 {
        written.push(workload_minute(1, m, (m % 60) as f64, 100.0, 1_000 + m as u64));
    }
    written.push(workload_minute(2, 10, 50.0, 10.0, 20));
    written.push(workload_minute(2, 70, 60.0, 30.0, 40));
    // A pool's minutes are never folded.
    written.push(pool_minute("training", 5, Some(1.0)));
    written.push(pool_minute("training", 65, None));
    // Workload 3 has its first hour stored already (as another replica folded it).
    let stored_hour = TelemetryRecord {
        span_minutes: 60,
        minutes: 2,
        ..workload_minute(3, 0, 10.0, 10.0, 10)
    };
    written.push(stored_hour.clone());
    written.push(workload_minute(3, 30, 99.0, 99.0, 99));
    s.append_telemetry(&written).await.unwrap();

    assert_eq!(
        s.fold_telemetry(T0, T0 + HOUR_MS).await.unwrap(),
        2,
        "the first hour of 1 and 2"
    );
    let read = s.telemetry_between(i64::MIN, i64::MAX).await.unwrap();
    let hour = |id: u64, at: i64| {
        read.iter()
            .find(|r| r.series == TelemetrySeries::Workload(id) && r.span_minutes == 60 && r.at == at)
            .cloned()
    };
    assert_eq!(
        hour(1, T0),
        Some(TelemetryRecord {
            series: TelemetrySeries::Workload(1),
            at: T0,
            span_minutes: 60,
            minutes: 60,
            util_sum: Some(1_770.0),
            used_mib_sum: Some(6_000.0),
            total_mib: Some(1_059),
        })
    );
    assert_eq!(hour(2, T0).map(|h| (h.minutes, h.util_sum)), Some((1, Some(50.0))));
    assert_eq!(
        hour(3, T0),
        Some(stored_hour),
        "an hour already stored keeps its figures"
    );
    let minutes = |pred: &dyn Fn(&TelemetryRecord) -> bool| {
        read.iter()
            .filter(|r| r.span_minutes == 1 && pred(r))
            .map(|r| (r.series.clone(), (r.at - T0) / MINUTE_MS))
            .collect::<Vec<_>>()
    };
    assert!(
        minutes(&|r| matches!(r.series, TelemetrySeries::Workload(_)) && r.at < T0 + HOUR_MS).is_empty(),
        "the folded minutes are gone: {read:?}"
    );
    assert_eq!(
        minutes(&|r| r.series == TelemetrySeries::Workload(1)).len(),
        30,
        "the second hour's minutes stay"
    );
    assert_eq!(
        minutes(&|r| r.series == TelemetrySeries::Workload(2)),
        [(TelemetrySeries::Workload(2), 70)]
    );
    assert_eq!(
        minutes(&|r| matches!(r.series, TelemetrySeries::Pool(_))),
        [
            (TelemetrySeries::Pool("training".into()), 5),
            (TelemetrySeries::Pool("training".into()), 65)
        ],
        "pools keep their minutes"
    );
    assert_eq!(read.len(), 3 + 30 + 1 + 2);
    assert_eq!(s.fold_telemetry(T0, T0 + HOUR_MS).await.unwrap(), 0);
    // A span after the second hour folds nothing of it: the fold reads its span only.
    assert_eq!(s.fold_telemetry(T0 + 2 * HOUR_MS, T0 + 3 * HOUR_MS).await.unwrap(), 0);
    assert_eq!(
        in_read_order(s.telemetry_between(i64::MIN, i64::MAX).await.unwrap()),
        in_read_order(read)
    );
}

/// Pruning forgets exactly the records that start before the given time, of every series and
/// span, and counts them.
pub async fn telemetry_prunes_only_what_is_older(s: &dyn Store) {
    let written = vec![
        pool_minute("training", 0, Some(1.0)),
        pool_minute("training", 59, Some(2.0)),
        pool_minute("training", 60, Some(3.0)),
        workload_minute(4, 59, 1.0, 1.0, 1),
        workload_minute(4, 60, 1.0, 1.0, 1),
        TelemetryRecord {
            span_minutes: 60,
            minutes: 60,
            ..workload_minute(5, 0, 1.0, 1.0, 1)
        },
        TelemetryRecord {
            span_minutes: 60,
            minutes: 60,
            ..workload_minute(5, 60, 1.0, 1.0, 1)
        },
    ];
    s.append_telemetry(&written).await.unwrap();
    assert_eq!(s.prune_telemetry(T0 + HOUR_MS).await.unwrap(), 4);
    let kept: Vec<TelemetryRecord> = written.iter().filter(|r| r.at >= T0 + HOUR_MS).cloned().collect();
    assert_eq!(
        in_read_order(s.telemetry_between(i64::MIN, i64::MAX).await.unwrap()),
        in_read_order(kept.clone())
    );
    assert_eq!(s.prune_telemetry(T0 + HOUR_MS).await.unwrap(), 0);
    assert_eq!(s.prune_telemetry(T0).await.unwrap(), 0);
    assert_eq!(s.telemetry_between(i64::MIN, i64::MAX).await.unwrap().len(), kept.len());
}
