//! Partitioning and device binding in each mode: single MIG instances that are created once and
//! never overlap (exact), whole-GPU layouts that change only while idle (operator), and the
//! simulated kubelet's choice of devices.

use std::time::Duration;

use crate::common::*;
use tessera_backend::{Backend, BackendEvent, Bound, MigInstance, PartitionPlan, Resource, SliceSpec};
use tessera_backend_sim::{SimConfig, SimMode};
use tokio::time::Instant;

fn instance(node: &str, gpu: u8, instance: MigInstance) -> PartitionPlan {
    PartitionPlan::Instance {
        node: node.into(),
        gpu,
        instance,
    }
}

fn layout(node: &str, gpu: u8, instances: Vec<MigInstance>) -> PartitionPlan {
    PartitionPlan::Layout {
        node: node.into(),
        gpu,
        instances,
    }
}

fn share(node: &str, gpu: u8, milli: u16) -> PartitionPlan {
    PartitionPlan::Share {
        node: node.into(),
        gpu,
        milli,
        memory_mib: None,
    }
}

async fn bound_of(rx: &mut tokio::sync::mpsc::UnboundedReceiver<BackendEvent>, id: u64) -> Bound {
    loop {
        match next(rx).await {
            // Earlier workloads' Running events may come first; only the order per workload is
            // guaranteed.
            BackendEvent::Running { id: other, .. } if other != id => continue,
            BackendEvent::Started { id: got, bound } => {
                assert_eq!(got, id);
                return bound.expect("operator mode reports the devices it bound");
            }
            other => panic!("expected Started for {id}, got {other:?}"),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn exact_partition_is_idempotent_and_refuses_overlapping_instances() {
    let (b, _rx) = backend(quiet(SimMode::Exact));
    let r = b.partition(&instance("a100-00", 0, mig3g(4))).await.unwrap();
    assert!(r.created, "{}", r.detail);
    assert!(r.detail.contains("slices 4..7"), "{}", r.detail);
    let again = b.partition(&instance("a100-00", 0, mig3g(4))).await.unwrap();
    assert!(!again.created, "a realised plan is not created twice: {}", again.detail);
    assert_eq!(b.partitions_created(), 1);

    let e = b
        .partition(&instance("a100-00", 0, MigInstance::new("2g.20gb", 14, 4, 2)))
        .await
        .unwrap_err();
    assert_eq!(rejected(e), "slices 4..5 of GPU 0 on a100-00 are taken by 3g.40gb");
    let e = b
        .partition(&instance("a100-00", 0, MigInstance::new("4g.40gb", 5, 2, 4)))
        .await
        .unwrap_err();
    assert_eq!(rejected(e), "slices 4..5 of GPU 0 on a100-00 are taken by 3g.40gb");

    assert!(b.partition(&instance("a100-00", 0, mig3g(0))).await.unwrap().created);
    assert!(b.partition(&instance("a100-00", 1, mig3g(4))).await.unwrap().created);
    assert_eq!(b.partitions_created(), 3);

    let e = b.partition(&instance("a100-00", 2, mig3g(6))).await.unwrap_err();
    assert!(rejected(e).contains("does not fit the 8 memory slices"));
    let e = b.partition(&instance("l40s-00", 0, mig3g(0))).await.unwrap_err();
    assert_eq!(rejected(e), "GPU 0 on l40s-00 (L40S) is not MIG-capable");
    let e = b.partition(&instance("a100-00", 9, mig3g(0))).await.unwrap_err();
    assert_eq!(rejected(e), "no GPU 9 on a100-00");
    assert_eq!(b.partitions_created(), 3);
}

#[tokio::test(start_paused = true)]
async fn exact_mode_refuses_layouts_and_device_counts() {
    let (b, _rx) = backend(quiet(SimMode::Exact));
    let e = b.partition(&layout("a100-00", 0, vec![mig3g(0)])).await.unwrap_err();
    assert!(rejected(e).contains("exact mode creates single MIG instances"));
    let s = spec(1, "a100-00", count(Resource::Gpu, 1), None);
    let e = b.start(&s).await.unwrap_err();
    assert!(rejected(e).contains("given exact devices, not a count of nvidia.com/gpu"));
    assert_eq!(b.starts(), 0);
}

#[tokio::test(start_paused = true)]
async fn exact_start_needs_its_instance_partitioned_first() {
    let (b, mut rx) = backend(quiet(SimMode::Exact));
    let s = spec(1, "a100-00", exact(&[3], SliceSpec::Mig(mig3g(4))), None);
    let e = b.start(&s).await.unwrap_err();
    assert!(rejected(e).contains("partition it first"));
    silent(&mut rx, Duration::from_secs(1)).await;

    b.partition(&instance("a100-00", 3, mig3g(4))).await.unwrap();
    b.start(&s).await.unwrap();
    assert!(matches!(
        next(&mut rx).await,
        BackendEvent::Started { id: 1, bound: None }
    ));
    assert_eq!(b.starts(), 1);
}

#[tokio::test(start_paused = true)]
async fn exact_start_refuses_devices_another_workload_holds() {
    let (b, _rx) = backend(quiet(SimMode::Exact));
    b.start(&spec(1, "a100-00", exact(&[0, 1], SliceSpec::Whole), None))
        .await
        .unwrap();
    let e = b
        .start(&spec(2, "a100-00", exact(&[1, 2], SliceSpec::Whole), None))
        .await
        .unwrap_err();
    assert_eq!(rejected(e), "GPU 1 on a100-00 is in use by workload 1");
    b.start(&spec(2, "a100-01", exact(&[1], SliceSpec::Whole), None))
        .await
        .expect("the same GPU of another node is free");

    // A MIG instance is held by one workload; its neighbour is free.
    b.partition(&instance("a100-00", 3, mig3g(0))).await.unwrap();
    b.partition(&instance("a100-00", 3, mig3g(4))).await.unwrap();
    b.start(&spec(3, "a100-00", exact(&[3], SliceSpec::Mig(mig3g(0))), None))
        .await
        .unwrap();
    let e = b
        .start(&spec(4, "a100-00", exact(&[3], SliceSpec::Mig(mig3g(0))), None))
        .await
        .unwrap_err();
    assert_eq!(rejected(e), "GPU 3 on a100-00 is in use by workload 3");
    b.start(&spec(4, "a100-00", exact(&[3], SliceSpec::Mig(mig3g(4))), None))
        .await
        .unwrap();
    let e = b
        .start(&spec(5, "a100-00", exact(&[3], SliceSpec::Whole), None))
        .await
        .unwrap_err();
    assert!(rejected(e).contains("in use by workload"));

    // Time-slice shares go together up to a whole GPU.
    let fraction = |milli| SliceSpec::Fraction {
        milli,
        memory_mib: None,
    };
    b.start(&spec(6, "l40s-00", exact(&[0], fraction(600)), None))
        .await
        .unwrap();
    b.start(&spec(7, "l40s-00", exact(&[0], fraction(400)), None))
        .await
        .unwrap();
    let e = b
        .start(&spec(8, "l40s-00", exact(&[0], fraction(100)), None))
        .await
        .unwrap_err();
    assert_eq!(
        rejected(e),
        "GPU 0 on l40s-00 has 0 milli-GPU of time-slice shares left, 100 asked"
    );
    let e = b
        .start(&spec(8, "l40s-00", exact(&[0], SliceSpec::Whole), None))
        .await
        .unwrap_err();
    assert!(rejected(e).contains("in use by workload"));

    b.stop(1, Duration::ZERO).await.unwrap();
    b.start(&spec(9, "a100-00", exact(&[1, 2], SliceSpec::Whole), None))
        .await
        .expect("freed by the stop");
    assert_eq!(b.starts(), 7);
}

#[tokio::test(start_paused = true)]
async fn no_mode_starts_work_on_a_node_that_is_down() {
    for mode in [SimMode::Exact, SimMode::Operator] {
        let (b, _rx) = backend(quiet(mode));
        let devices = match mode {
            SimMode::Exact => exact(&[0], SliceSpec::Whole),
            SimMode::Operator => count(Resource::Gpu, 1),
        };
        b.remove_node("l40s-00").unwrap();
        let e = b.start(&spec(1, "l40s-00", devices.clone(), None)).await.unwrap_err();
        assert_eq!(rejected(e), "node `l40s-00` is down (removed or rebooting)", "{mode}");
        b.restore_node("l40s-00").unwrap();
        b.start(&spec(1, "l40s-00", devices, None)).await.expect("back up");
    }
}

#[tokio::test(start_paused = true)]
async fn exact_unpartition_destroys_the_instance_but_not_while_it_is_in_use() {
    let (b, _rx) = backend(quiet(SimMode::Exact));
    let plan = instance("a100-00", 0, mig3g(0));
    b.partition(&plan).await.unwrap();
    b.start(&spec(5, "a100-00", exact(&[0], SliceSpec::Mig(mig3g(0))), None))
        .await
        .unwrap();
    let e = b.unpartition(&plan).await.unwrap_err();
    assert!(rejected(e).contains("is in use by workload 5"));

    b.stop(5, Duration::from_secs(10)).await.unwrap();
    b.unpartition(&plan).await.unwrap();
    b.unpartition(&plan).await.expect("unpartition is idempotent");
    let r = b.partition(&plan).await.unwrap();
    assert!(r.created, "the instance was destroyed, so it is created anew");
    assert_eq!(b.partitions_created(), 2);
}

#[tokio::test(start_paused = true)]
async fn creating_an_instance_takes_the_partition_time_and_a_repeat_does_not() {
    let cfg = SimConfig {
        mig_partition_time: Duration::from_secs(1),
        ..quiet(SimMode::Exact)
    };
    let (b, _rx) = backend(cfg);
    let t0 = Instant::now();
    b.partition(&instance("a100-00", 0, mig3g(0))).await.unwrap();
    assert_eq!(t0.elapsed(), Duration::from_secs(1));
    let t1 = Instant::now();
    assert!(!b.partition(&instance("a100-00", 0, mig3g(0))).await.unwrap().created);
    assert_eq!(t1.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn shares_need_a_gpu_out_of_mig_mode_in_both_modes() {
    for mode in [SimMode::Exact, SimMode::Operator] {
        let (b, _rx) = backend(SimConfig {
            mig_partition_time: Duration::ZERO,
            ..quiet(mode)
        });
        let r = b.partition(&share("a100-00", 2, 250)).await.unwrap();
        assert!(!r.created, "a share has nothing to create: {}", r.detail);
        assert_eq!(r.detail, "time-slice share of 250 milli-GPU on a100-00 GPU 2");
        let mig = match mode {
            SimMode::Exact => instance("a100-00", 0, mig3g(0)),
            SimMode::Operator => layout("a100-00", 0, vec![mig3g(0)]),
        };
        b.partition(&mig).await.unwrap();
        let e = b.partition(&share("a100-00", 0, 250)).await.unwrap_err();
        assert_eq!(
            rejected(e),
            "GPU 0 on a100-00 has MIG instances; it cannot be time-sliced"
        );
        let e = b.partition(&share("a100-00", 2, 0)).await.unwrap_err();
        assert!(rejected(e).contains("1..=1000 milli-GPU"));
        let nothing = PartitionPlan::Nothing { node: "l40s-00".into() };
        assert!(!b.partition(&nothing).await.unwrap().created);
        let e = b
            .partition(&PartitionPlan::Nothing { node: "h100-99".into() })
            .await
            .unwrap_err();
        assert_eq!(rejected(e), "no node `h100-99` in the simulated fleet");
        b.unpartition(&share("a100-00", 2, 250)).await.unwrap();
        assert_eq!(b.partitions_created(), 1, "{mode}");
    }
}

#[tokio::test(start_paused = true)]
async fn operator_layout_takes_the_partition_time_and_emits_partition_changed_once() {
    let (b, mut rx) = backend(quiet(SimMode::Operator));
    let t0 = Instant::now();
    let r = b
        .partition(&layout("a100-00", 0, vec![mig3g(4), mig3g(0)]))
        .await
        .unwrap();
    assert!(r.created);
    assert_eq!(t0.elapsed(), Duration::from_secs(2), "the operator-mode default");
    assert_eq!(r.detail, "applied MIG layout 3g.40gb@0, 3g.40gb@4 to a100-00 GPU 0");
    assert_eq!(
        next(&mut rx).await,
        BackendEvent::PartitionChanged {
            node: "a100-00".into(),
            gpu: 0,
            instances: vec![mig3g(0), mig3g(4)],
        }
    );

    let t1 = Instant::now();
    let again = b
        .partition(&layout("a100-00", 0, vec![mig3g(0), mig3g(4)]))
        .await
        .unwrap();
    assert!(!again.created, "{}", again.detail);
    assert_eq!(t1.elapsed(), Duration::ZERO);
    silent(&mut rx, Duration::from_secs(60)).await;
    assert_eq!(b.partitions_created(), 1);

    let e = b
        .partition(&layout(
            "a100-00",
            1,
            vec![mig3g(0), MigInstance::new("2g.20gb", 14, 2, 2)],
        ))
        .await
        .unwrap_err();
    assert!(rejected(e).contains("overlaps itself"));
}

#[tokio::test(start_paused = true)]
async fn operator_layout_changes_only_while_the_gpu_is_idle() {
    let cfg = SimConfig {
        mig_partition_time: Duration::from_millis(10),
        ..quiet(SimMode::Operator)
    };
    let (b, mut rx) = backend(cfg);
    b.partition(&layout("a100-00", 0, vec![mig3g(0), mig3g(4)]))
        .await
        .unwrap();
    assert!(matches!(next(&mut rx).await, BackendEvent::PartitionChanged { .. }));
    b.start(&spec(7, "a100-00", count(mig_resource("3g.40gb"), 1), None))
        .await
        .unwrap();
    assert_eq!(bound_of(&mut rx, 7).await.mig, Some(mig3g(0)));

    // Keeping the busy instance does not help: the MIG manager re-lays out the whole GPU.
    let keeps_it = vec![
        mig3g(0),
        MigInstance::new("2g.20gb", 14, 4, 2),
        MigInstance::new("1g.20gb", 15, 6, 2),
    ];
    let e = b.partition(&layout("a100-00", 0, keeps_it.clone())).await.unwrap_err();
    let msg = rejected(e);
    assert!(msg.contains("while it is in use"), "{msg}");
    assert!(
        msg.contains("3g.40gb (profile 9) at slices 0..3 by workload 7"),
        "{msg}"
    );
    let same = b
        .partition(&layout("a100-00", 0, vec![mig3g(0), mig3g(4)]))
        .await
        .unwrap();
    assert!(!same.created, "the current layout is accepted even in use");
    let e = b.partition(&layout("a100-00", 0, Vec::new())).await.unwrap_err();
    assert!(rejected(e).contains("in use"));

    b.stop(7, Duration::from_secs(30)).await.unwrap();
    assert!(b.partition(&layout("a100-00", 0, keeps_it)).await.unwrap().created);
    match next(&mut rx).await {
        BackendEvent::PartitionChanged { node, gpu, instances } => {
            assert_eq!((node.as_str(), gpu, instances.len()), ("a100-00", 0, 3));
        }
        other => panic!("expected PartitionChanged, got {other:?}"),
    }
    assert_eq!(b.partitions_created(), 2);
}

#[tokio::test(start_paused = true)]
async fn operator_mode_refuses_single_instances_and_exact_devices() {
    let (b, _rx) = backend(quiet(SimMode::Operator));
    let e = b.partition(&instance("a100-00", 0, mig3g(0))).await.unwrap_err();
    assert!(rejected(e).contains("operator mode lays out whole GPUs"));
    let e = b.unpartition(&instance("a100-00", 0, mig3g(0))).await.unwrap_err();
    assert!(rejected(e).contains("operator mode lays out whole GPUs"));
    let e = b
        .start(&spec(1, "a100-00", exact(&[0], SliceSpec::Whole), None))
        .await
        .unwrap_err();
    assert!(rejected(e).contains("the kubelet picks them"));
    b.unpartition(&layout("a100-00", 0, Vec::new()))
        .await
        .expect("a layout has nothing to undo");
}

#[tokio::test(start_paused = true)]
async fn the_kubelet_binds_the_lowest_free_whole_gpus() {
    let cfg = SimConfig {
        mig_partition_time: Duration::ZERO,
        ..quiet(SimMode::Operator)
    };
    let (b, mut rx) = backend(cfg);
    b.partition(&layout("a100-00", 1, vec![mig3g(0)])).await.unwrap();
    assert!(matches!(
        next(&mut rx).await,
        BackendEvent::PartitionChanged { gpu: 1, .. }
    ));

    b.start(&spec(1, "a100-00", count(Resource::Gpu, 2), None))
        .await
        .unwrap();
    assert_eq!(
        bound_of(&mut rx, 1).await,
        Bound {
            gpus: vec![0, 2],
            mig: None
        },
        "GPU 1 is in MIG mode and not offered as nvidia.com/gpu"
    );
    b.start(&spec(2, "a100-00", count(Resource::Gpu, 1), None))
        .await
        .unwrap();
    assert_eq!(bound_of(&mut rx, 2).await.gpus, vec![3]);
    let e = b
        .start(&spec(3, "a100-00", count(Resource::Gpu, 5), None))
        .await
        .unwrap_err();
    assert_eq!(rejected(e), "only 4 free nvidia.com/gpu on a100-00, 5 asked");

    b.stop(1, Duration::ZERO).await.unwrap();
    b.start(&spec(4, "a100-00", count(Resource::Gpu, 1), None))
        .await
        .unwrap();
    assert_eq!(bound_of(&mut rx, 4).await.gpus, vec![0], "freed by the stop");
}

#[tokio::test(start_paused = true)]
async fn the_kubelet_binds_a_free_instance_of_the_profile() {
    let cfg = SimConfig {
        mig_partition_time: Duration::ZERO,
        ..quiet(SimMode::Operator)
    };
    let (b, mut rx) = backend(cfg);
    b.partition(&layout("a100-00", 2, vec![mig3g(0), mig3g(4)]))
        .await
        .unwrap();
    next(&mut rx).await;

    b.start(&spec(1, "a100-00", count(mig_resource("3g.40gb"), 1), None))
        .await
        .unwrap();
    assert_eq!(
        bound_of(&mut rx, 1).await,
        Bound {
            gpus: vec![2],
            mig: Some(mig3g(0))
        }
    );
    b.start(&spec(2, "a100-00", count(mig_resource("3g.40gb"), 1), None))
        .await
        .unwrap();
    assert_eq!(bound_of(&mut rx, 2).await.mig, Some(mig3g(4)));
    let e = b
        .start(&spec(3, "a100-00", count(mig_resource("3g.40gb"), 1), None))
        .await
        .unwrap_err();
    assert_eq!(rejected(e), "no free 3g.40gb on a100-00");
    let e = b
        .start(&spec(3, "a100-01", count(mig_resource("3g.40gb"), 1), None))
        .await
        .unwrap_err();
    assert_eq!(
        rejected(e),
        "no free 3g.40gb on a100-01",
        "layouts are per GPU, not fleet-wide"
    );
    assert_eq!(b.starts(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_kubelet_spreads_time_sliced_replicas_over_the_gpus() {
    let (b, mut rx) = backend(quiet(SimMode::Operator));
    let mut picked = Vec::new();
    for id in 1..=5 {
        let s = spec(id, "l40s-00", count(Resource::SharedGpu { milli: 250 }, 1), None);
        b.start(&s).await.unwrap();
        let bound = bound_of(&mut rx, id).await;
        assert_eq!(bound.mig, None);
        picked.push(bound.gpus[0]);
    }
    assert_eq!(
        picked,
        vec![0, 1, 2, 3, 0],
        "fewest replicas first, then the lowest index"
    );

    // 1250 of the node's 4000 milli-GPU are held: 11 more replicas of 250 fit, then none.
    let mut fitted = 0;
    for id in 6..=20 {
        let s = spec(id, "l40s-00", count(Resource::SharedGpu { milli: 250 }, 1), None);
        match b.start(&s).await {
            Ok(()) => fitted += 1,
            Err(e) => assert_eq!(
                rejected(e),
                "no nvidia.com/gpu.shared on l40s-00 has 250 milli-GPU left"
            ),
        }
    }
    assert_eq!(fitted, 11);
    let e = b
        .start(&spec(21, "l40s-00", count(Resource::Gpu, 1), None))
        .await
        .unwrap_err();
    assert_eq!(rejected(e), "only 0 free nvidia.com/gpu on l40s-00, 1 asked");
}
