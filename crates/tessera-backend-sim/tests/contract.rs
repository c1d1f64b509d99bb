//! The contract's guarantees, checked in both modes: event order per workload, idempotent
//! start and stop, stop suppressing Exited, lost workloads, level-triggered reconcile (adoption,
//! ghosts, orphans, layouts), telemetry of every GPU and injected faults.

use std::time::Duration;

use crate::common::*;
use tessera_backend::{
    Backend, BackendEvent, Capabilities, DeviceAssignment, Exit, Observation, PartitionPlan, Partitioning, Resource,
    RunSpec, SliceSpec,
};
use tessera_backend_sim::{SimBackend, SimConfig, SimMode};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;

/// A MIG workload on a100-00 GPU 0 at slices 0..3, partitioned, in the given mode's terms.
async fn mig_workload(b: &SimBackend, id: u64, duration: Option<Duration>) -> RunSpec {
    match b.config().mode {
        SimMode::Exact => {
            let plan = PartitionPlan::Instance {
                node: "a100-00".into(),
                gpu: 0,
                instance: mig3g(0),
            };
            b.partition(&plan).await.unwrap();
            spec(id, "a100-00", exact(&[0], SliceSpec::Mig(mig3g(0))), duration)
        }
        SimMode::Operator => {
            let plan = PartitionPlan::Layout {
                node: "a100-00".into(),
                gpu: 0,
                instances: vec![mig3g(0), mig3g(4)],
            };
            b.partition(&plan).await.unwrap();
            spec(id, "a100-00", count(mig_resource("3g.40gb"), 1), duration)
        }
    }
}

/// Skips layout news, which carries no workload order.
async fn next_of_workloads(rx: &mut UnboundedReceiver<BackendEvent>) -> BackendEvent {
    loop {
        match next(rx).await {
            BackendEvent::PartitionChanged { .. } => continue,
            e => return e,
        }
    }
}

#[tokio::test(start_paused = true)]
async fn each_mode_declares_its_capabilities() {
    let exact = SimBackend::new(SimConfig::default(), fleet());
    assert_eq!(
        exact.capabilities(),
        Capabilities {
            partitioning: Partitioning::Instance,
            devices: DeviceAssignment::Exact,
            logs: false,
            mig_mode_switch: true,
            mig_mode_reported: false,
            confirms_stop: false,
            native_admission: false,
            multi_node: true,
            needs_image: false,
        }
    );
    let operator = SimBackend::new(SimConfig::for_mode(SimMode::Operator), fleet());
    assert_eq!(
        operator.capabilities(),
        Capabilities {
            partitioning: Partitioning::WholeGpu,
            devices: DeviceAssignment::PerNodeCount,
            logs: false,
            mig_mode_switch: false,
            mig_mode_reported: false,
            confirms_stop: false,
            native_admission: false,
            multi_node: true,
            needs_image: false,
        }
    );
    assert_eq!(operator.name(), "sim");
    assert!(operator.take_events().is_some());
}

#[tokio::test(start_paused = true)]
async fn the_latest_subscriber_gets_the_events_and_forgotten_work_goes_silently() {
    let b = SimBackend::new(SimConfig::default(), fleet());
    let mut old = b.take_events().unwrap();
    let mut new = b.take_events().unwrap();
    let s = mig_workload(&b, 1, None).await;
    b.start(&s).await.unwrap();
    let started = tokio::time::timeout(Duration::from_secs(1), async {
        loop {
            if let Some(BackendEvent::Started { id, .. }) = new.recv().await {
                return id;
            }
        }
    })
    .await
    .expect("the new subscriber hears the start");
    assert_eq!(started, 1);
    while let Ok(e) = old.try_recv() {
        assert!(
            !matches!(e, BackendEvent::Started { .. }),
            "the replaced subscriber hears nothing more: {e:?}"
        );
    }
    assert!(b.forget(1));
    let r = b.reconcile(std::slice::from_ref(&s)).await.unwrap();
    assert_eq!(r.workloads, vec![(1, Observation::Unknown)], "a ghost");
    assert!(
        !std::iter::from_fn(|| new.try_recv().ok()).any(|e| matches!(e, BackendEvent::Lost { .. })),
        "forget sends nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn a_workload_reports_started_running_then_exited_after_its_run_time() {
    for cfg in both_modes() {
        let mode = cfg.mode;
        let (b, mut rx) = backend(cfg);
        let s = mig_workload(&b, 1, Some(Duration::from_secs(90))).await;
        b.start(&s).await.unwrap();

        match next_of_workloads(&mut rx).await {
            BackendEvent::Started { id: 1, bound } => match mode {
                SimMode::Exact => assert_eq!(bound, None),
                SimMode::Operator => assert_eq!(bound.and_then(|b| b.mig), Some(mig3g(0))),
            },
            other => panic!("{mode}: expected Started, got {other:?}"),
        }
        let running_at = match next_of_workloads(&mut rx).await {
            BackendEvent::Running { id: 1, at_ms, sample } => {
                assert_eq!(sample.len(), 1, "{mode}: a sample of its one GPU");
                let g = &sample[0];
                assert_eq!((g.node.as_str(), g.gpu), ("a100-00", 0));
                assert!(g.util_pct > 0.0);
                let i = &g.instances[0];
                assert_eq!((i.workload, i.profile.as_str(), i.instance_id), (1, "3g.40gb", 1));
                assert_eq!(i.fb_used_mib + i.fb_free_mib, A100_MIB as u64 / 2);
                at_ms
            }
            other => panic!("{mode}: expected Running, got {other:?}"),
        };
        let t0 = Instant::now();
        match next_of_workloads(&mut rx).await {
            BackendEvent::Exited {
                id: 1,
                at_ms,
                exit: Exit::Succeeded,
            } => {
                assert_eq!(t0.elapsed(), Duration::from_secs(90), "{mode}");
                assert_eq!(at_ms - running_at, 90_000, "{mode}");
            }
            other => panic!("{mode}: expected Exited, got {other:?}"),
        }
        silent(&mut rx, Duration::from_secs(3600)).await;
        let sample = b.sample();
        assert!(sample.iter().all(|g| g.instances.is_empty() && g.util_pct == 0.0));
    }
}

#[tokio::test(start_paused = true)]
async fn starting_a_workload_twice_starts_it_once() {
    for cfg in both_modes() {
        let (b, mut rx) = backend(cfg);
        let s = mig_workload(&b, 3, None).await;
        b.start(&s).await.unwrap();
        b.start(&s).await.unwrap();
        assert!(matches!(
            next_of_workloads(&mut rx).await,
            BackendEvent::Started { id: 3, .. }
        ));
        assert!(matches!(
            next_of_workloads(&mut rx).await,
            BackendEvent::Running { id: 3, .. }
        ));
        silent(&mut rx, Duration::from_secs(3600)).await;
        assert_eq!(b.starts(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn stop_waits_at_most_the_grace_period_and_suppresses_exited() {
    for cfg in both_modes() {
        let mode = cfg.mode;
        let (b, mut rx) = backend(SimConfig {
            stop_time: Duration::from_secs(20),
            ..cfg
        });
        let s = mig_workload(&b, 4, Some(Duration::from_secs(30))).await;
        b.start(&s).await.unwrap();
        next_of_workloads(&mut rx).await;
        assert!(matches!(
            next_of_workloads(&mut rx).await,
            BackendEvent::Running { id: 4, .. }
        ));

        // Its run time ends while it is being stopped: still no Exited.
        tokio::time::sleep(Duration::from_secs(28)).await;
        let t0 = Instant::now();
        b.stop(4, Duration::from_secs(5)).await.unwrap();
        assert_eq!(
            t0.elapsed(),
            Duration::from_secs(5),
            "{mode}: capped by the grace period"
        );
        silent(&mut rx, Duration::from_secs(3600)).await;
        b.stop(4, Duration::from_secs(5)).await.expect("stop is idempotent");
        b.stop(999, Duration::from_secs(5)).await.expect("unknown ids are fine");
        assert!(b.sample().iter().all(|g| g.instances.is_empty()), "{mode}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_stop_before_the_workload_runs_suppresses_running_too() {
    for cfg in both_modes() {
        let (b, mut rx) = backend(cfg);
        let s = mig_workload(&b, 5, Some(Duration::from_secs(30))).await;
        b.start(&s).await.unwrap();
        b.stop(5, Duration::from_secs(10)).await.unwrap();
        assert!(matches!(
            next_of_workloads(&mut rx).await,
            BackendEvent::Started { id: 5, .. }
        ));
        silent(&mut rx, Duration::from_secs(3600)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_lost_workload_reports_lost_and_frees_its_device() {
    for cfg in both_modes() {
        let mode = cfg.mode;
        let (b, mut rx) = backend(cfg);
        let s = mig_workload(&b, 6, Some(Duration::from_secs(60))).await;
        b.start(&s).await.unwrap();
        next_of_workloads(&mut rx).await;
        next_of_workloads(&mut rx).await;

        assert!(b.lose(6));
        match next_of_workloads(&mut rx).await {
            BackendEvent::Lost { id: 6, detail, .. } => assert!(detail.contains("vanished from a100-00"), "{detail}"),
            other => panic!("{mode}: expected Lost, got {other:?}"),
        }
        silent(&mut rx, Duration::from_secs(3600)).await;
        assert!(!b.lose(6), "already gone");

        let mut again = s.clone();
        again.id = 7;
        b.start(&again).await.unwrap();
        match next_of_workloads(&mut rx).await {
            BackendEvent::Started { id: 7, bound } if mode == SimMode::Operator => {
                assert_eq!(
                    bound.and_then(|b| b.mig),
                    Some(mig3g(0)),
                    "the lost one's instance is free"
                );
            }
            BackendEvent::Started { id: 7, bound: None } => {}
            other => panic!("{mode}: expected Started, got {other:?}"),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn reconcile_adopts_work_that_was_running_for_the_rest_of_its_time() {
    for cfg in both_modes() {
        let mode = cfg.mode;
        let (b, mut rx) = backend(cfg);
        let now = epoch_ms();
        let mut running = match mode {
            SimMode::Exact => spec(1, "a100-00", exact(&[0], SliceSpec::Mig(mig3g(4))), None),
            SimMode::Operator => spec(1, "a100-00", count(Resource::Gpu, 1), None),
        };
        running.duration = Some(Duration::from_secs(60));
        running.running_since_ms = Some(now - 10_000);
        let mut done = spec(
            2,
            "a100-00",
            exact(&[1], SliceSpec::Whole),
            Some(Duration::from_secs(60)),
        );
        done.running_since_ms = Some(now - 120_000);
        let never_started = spec(3, "a100-00", exact(&[2], SliceSpec::Whole), None);

        let r = b
            .reconcile(&[running.clone(), done.clone(), never_started.clone()])
            .await
            .unwrap();
        assert_eq!(
            r.observation(1),
            Some(&Observation::Running {
                since_ms: Some(now - 10_000)
            }),
            "{mode}"
        );
        assert_eq!(
            r.observation(2),
            Some(&Observation::Succeeded),
            "{mode}: its time is up"
        );
        assert_eq!(
            r.observation(3),
            Some(&Observation::Unknown),
            "{mode}: nothing says it was ever started"
        );
        assert!(r.orphans.is_empty());
        let busy: Vec<_> = b.sample().into_iter().filter(|g| g.util_pct > 0.0).collect();
        assert_eq!(busy.len(), 1, "{mode}: the adopted workload shows in telemetry");

        let again = b.reconcile(&[running.clone()]).await.unwrap();
        assert_eq!(again.workloads, vec![(1, r.observation(1).unwrap().clone())], "{mode}");
        assert_eq!((b.starts(), b.partitions_created()), (0, 0), "{mode}");
        if mode == SimMode::Exact {
            let plan = PartitionPlan::Instance {
                node: "a100-00".into(),
                gpu: 0,
                instance: mig3g(4),
            };
            let p = b.partition(&plan).await.unwrap();
            assert!(
                !p.created,
                "the adopted workload's instance outlived the control plane too"
            );
        }

        exits_after_the_rest_of_its_time(&mut rx, mode).await;
        let after = b.reconcile(&[running]).await.unwrap();
        assert_eq!(after.observation(1), Some(&Observation::Succeeded), "{mode}");
    }
}

#[tokio::test(start_paused = true)]
async fn reconcile_without_adoption_reports_ghosts() {
    for cfg in both_modes() {
        let (b, _rx) = backend(SimConfig {
            adopt_unknown: false,
            ..cfg
        });
        let mut ghost = spec(8, "a100-00", exact(&[0], SliceSpec::Whole), None);
        if b.config().mode == SimMode::Operator {
            ghost.devices = count(Resource::Gpu, 1);
        }
        ghost.running_since_ms = Some(epoch_ms() - 5_000);
        let r = b.reconcile(&[ghost]).await.unwrap();
        assert_eq!(r.workloads, vec![(8, Observation::Unknown)]);
        assert!(b.sample().iter().all(|g| g.util_pct == 0.0), "nothing was adopted");
    }
}

#[tokio::test(start_paused = true)]
async fn reconcile_reports_orphans_and_starting_work() {
    for cfg in both_modes() {
        let (b, _rx) = backend(cfg);
        let s = mig_workload(&b, 9, None).await;
        b.start(&s).await.unwrap();
        // Before the runtime has run the workload's task: accepted, not running yet.
        let r = b.reconcile(std::slice::from_ref(&s)).await.unwrap();
        assert_eq!(r.workloads, vec![(9, Observation::Starting)]);

        tokio::time::sleep(Duration::from_millis(1)).await;
        let r = b.reconcile(std::slice::from_ref(&s)).await.unwrap();
        assert!(matches!(
            r.observation(9),
            Some(Observation::Running { since_ms: Some(_) })
        ));

        let r = b.reconcile(&[]).await.unwrap();
        assert_eq!(r.orphans.len(), 1);
        let o = &r.orphans[0];
        assert_eq!((o.id, o.node.as_str()), (Some(9), "a100-00"));
        assert_eq!(
            o.detail,
            "batch workload 9 `train-9` of acme/vision runs on a100-00 but is not expected"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn reconcile_never_brings_back_work_that_was_stopped_or_lost() {
    for cfg in both_modes() {
        let mode = cfg.mode;
        let (b, _rx) = backend(cfg);
        let mut stopped = mig_workload(&b, 10, Some(Duration::from_secs(600))).await;
        b.start(&stopped).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
        stopped.running_since_ms = Some(epoch_ms());
        b.stop(10, Duration::from_secs(1)).await.unwrap();

        let mut lost = stopped.clone();
        lost.id = 11;
        b.start(&lost).await.unwrap();
        assert!(b.lose(11));

        // Tessera still expects both (their stop or loss is not recorded yet): neither is adopted.
        let r = b.reconcile(&[stopped.clone(), lost.clone()]).await.unwrap();
        assert_eq!(
            r.workloads,
            vec![(10, Observation::Unknown), (11, Observation::Unknown)],
            "{mode}"
        );
        assert!(b.sample().iter().all(|g| g.util_pct == 0.0), "{mode}");
    }
}

#[tokio::test(start_paused = true)]
async fn operator_reconcile_reports_layouts_and_adopted_mig_work_waits_for_its_layout() {
    let cfg = SimConfig {
        mig_partition_time: Duration::ZERO,
        ..quiet(SimMode::Operator)
    };
    let (b, mut rx) = backend(cfg);
    let mut s = spec(12, "a100-00", count(mig_resource("3g.40gb"), 1), None);
    s.running_since_ms = Some(epoch_ms() - 60_000);

    let r = b.reconcile(std::slice::from_ref(&s)).await.unwrap();
    assert!(matches!(r.observation(12), Some(Observation::Running { .. })));
    assert_eq!(r.layouts.len(), 16, "every MIG GPU, none of the L40S");
    assert!(
        r.layouts.iter().all(|(_, _, l)| l.is_empty()),
        "layouts do not outlive the process"
    );
    assert!(
        b.sample().iter().all(|g| g.instances.is_empty()),
        "no device to show it on yet"
    );

    let plan = PartitionPlan::Layout {
        node: "a100-00".into(),
        gpu: 5,
        instances: vec![mig3g(0), mig3g(4)],
    };
    assert!(b.partition(&plan).await.unwrap().created);
    assert!(matches!(
        next(&mut rx).await,
        BackendEvent::PartitionChanged { gpu: 5, .. }
    ));
    let gpu5 = b
        .sample()
        .into_iter()
        .find(|g| g.node == "a100-00" && g.gpu == 5)
        .unwrap();
    assert_eq!(gpu5.instances.len(), 1);
    assert_eq!((gpu5.instances[0].workload, gpu5.instances[0].instance_id), (12, 1));

    let r = b.reconcile(&[s]).await.unwrap();
    let layout = r.layouts.iter().find(|(n, g, _)| n == "a100-00" && *g == 5).unwrap();
    assert_eq!(layout.2, vec![mig3g(0), mig3g(4)]);
    let disable = PartitionPlan::Layout {
        node: "a100-00".into(),
        gpu: 5,
        instances: Vec::new(),
    };
    let e = b.partition(&disable).await.unwrap_err();
    assert!(rejected(e).contains("by workload 12"), "the adopted workload holds it");
}

#[tokio::test(start_paused = true)]
async fn telemetry_events_cover_every_gpu_and_carry_injected_xids() {
    let cfg = SimConfig {
        telemetry_interval: Duration::from_secs(5),
        ..SimConfig::default()
    };
    let b = SimBackend::new(cfg, fleet());
    let mut rx = b.take_events().unwrap();
    b.inject_xid("a100-01", 5, 79).unwrap();
    assert_eq!(
        next(&mut rx).await,
        BackendEvent::GpuHealth {
            node: "a100-01".into(),
            gpu: 5,
            healthy: false,
            xid: Some(79),
            detail: "XID 79: GPU has fallen off the bus (injected)".into(),
        }
    );

    let (first_at, gpus) = match next(&mut rx).await {
        BackendEvent::Telemetry { at_ms, gpus } => (at_ms, gpus),
        other => panic!("expected Telemetry, got {other:?}"),
    };
    assert_eq!(gpus.len(), FLEET_GPUS, "idle GPUs are reported too");
    let uuids: std::collections::HashSet<&str> = gpus.iter().map(|g| g.uuid.as_str()).collect();
    assert_eq!(uuids.len(), FLEET_GPUS);
    for g in &gpus {
        let expected_xid = if (g.node.as_str(), g.gpu) == ("a100-01", 5) {
            79
        } else {
            0
        };
        assert_eq!(g.xid, expected_xid, "{} {}", g.node, g.gpu);
        assert_eq!((g.util_pct, g.fb_used_mib), (0.0, 0));
        assert!(g.fb_free_mib == A100_MIB as u64 || g.model == "L40S");
    }

    b.start(&spec(1, "l40s-00", exact(&[2], SliceSpec::Whole), None))
        .await
        .unwrap();
    assert!(matches!(next(&mut rx).await, BackendEvent::Started { id: 1, .. }));
    assert!(matches!(next(&mut rx).await, BackendEvent::Running { id: 1, .. }));
    let gpus = match next(&mut rx).await {
        BackendEvent::Telemetry { at_ms, gpus } => {
            assert_eq!(at_ms - first_at, 5_000, "every telemetry_interval");
            gpus
        }
        other => panic!("expected Telemetry, got {other:?}"),
    };
    assert_eq!(gpus.len(), FLEET_GPUS);
    let busy = gpus.iter().find(|g| g.node == "l40s-00" && g.gpu == 2).unwrap();
    assert!(busy.util_pct >= 35.0 && busy.fb_used_mib > 0 && busy.power_w > 60.0);
    assert!(busy.instances.is_empty(), "a whole GPU has no instance series");

    b.inject_xid("a100-01", 5, 0).unwrap();
    match next(&mut rx).await {
        BackendEvent::GpuHealth { healthy, xid, .. } => assert_eq!((healthy, xid), (true, None)),
        other => panic!("expected GpuHealth, got {other:?}"),
    }
    match next(&mut rx).await {
        BackendEvent::Telemetry { gpus, .. } => assert!(gpus.iter().all(|g| g.xid == 0), "XID 0 clears it"),
        other => panic!("expected Telemetry, got {other:?}"),
    }
    let e = b.inject_xid("a100-01", 8, 79).unwrap_err();
    assert_eq!(rejected(e), "no GPU 8 on a100-01");
}

#[tokio::test(start_paused = true)]
async fn an_injected_partition_failure_rejects_exactly_the_next_partition() {
    for cfg in both_modes() {
        let (b, _rx) = backend(cfg);
        b.fail_next_partition("nvmlDeviceCreateGpuInstanceWithPlacement: insufficient resources");
        let nothing = PartitionPlan::Nothing { node: "a100-00".into() };
        let e = b.partition(&nothing).await.unwrap_err();
        assert_eq!(
            rejected(e),
            "nvmlDeviceCreateGpuInstanceWithPlacement: insufficient resources"
        );
        b.partition(&nothing).await.expect("only the next one fails");
        assert_eq!(b.partitions_created(), 0);
    }
}

#[tokio::test]
async fn exact_mode_switches_mig_mode_of_an_idle_gpu_and_operator_mode_refuses() {
    let (b, _rx) = backend(quiet(SimMode::Exact));
    let instance = |gpu: u8| PartitionPlan::Instance {
        node: "a100-00".into(),
        gpu,
        instance: mig3g(0),
    };
    b.partition(&instance(0)).await.unwrap();
    // A GPU holding an instance keeps its mode; an idle one switches, and then takes no
    // instance until MIG is enabled again.
    assert!(rejected(b.set_mig_mode("a100-00", 0, false).await.unwrap_err()).contains("idle GPU"));
    assert_eq!(
        b.set_mig_mode("a100-00", 1, false).await.unwrap(),
        tessera_backend::MigModeChange::Applied
    );
    assert!(rejected(b.partition(&instance(1)).await.unwrap_err()).contains("not in MIG mode"));
    b.set_mig_mode("a100-00", 1, true).await.unwrap();
    assert!(b.partition(&instance(1)).await.unwrap().created);
    // No MIG on an L40S; none of this in operator mode.
    assert!(rejected(b.set_mig_mode("l40s-00", 0, false).await.unwrap_err()).contains("has no MIG"));
    let (op, _rx) = backend(quiet(SimMode::Operator));
    assert!(!op.capabilities().mig_mode_switch);
    assert!(rejected(op.set_mig_mode("a100-00", 1, false).await.unwrap_err()).contains("MIG manager"));
}
