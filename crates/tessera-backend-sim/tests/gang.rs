//! Multi-node gangs (`RunSpec::gang`), in both modes: one workload whose node-shares start
//! together or not at all, run and end together, are lost together when one node goes, are
//! stopped together, and are reconciled and adopted as one workload.

use std::time::Duration;

use crate::common::*;
use tessera_backend::{Backend, BackendEvent, Exit, GangShare, NodeChange, Observation, Resource, RunSpec, SliceSpec};
use tessera_backend_sim::{SimBackend, SimConfig, SimGpu, SimMode};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;

const NODES: [&str; 4] = ["h100-00", "h100-01", "h100-02", "h100-03"];

/// Four nodes of 8 H100s.
fn gang_fleet() -> Vec<SimGpu> {
    NODES
        .iter()
        .flat_map(|node| {
            (0..8).map(|index| SimGpu {
                node: node.to_string(),
                index,
                model: "H100-80GB".into(),
                memory_mib: 81559,
                mig_slices: 8,
            })
        })
        .collect()
}

fn gang_backend(cfg: SimConfig) -> (SimBackend, UnboundedReceiver<BackendEvent>) {
    let b = SimBackend::new(cfg, gang_fleet());
    let rx = b.take_events().expect("events not taken yet");
    (b, rx)
}

/// `n` whole GPUs of a node, in the mode's terms (exact: GPUs `first..first + n`).
fn whole(mode: SimMode, first: u8, n: u8) -> tessera_backend::Devices {
    match mode {
        SimMode::Exact => exact(&(first..first + n).collect::<Vec<_>>(), SliceSpec::Whole),
        SimMode::Operator => count(Resource::Gpu, n),
    }
}

/// A gang of all 8 GPUs of each of `nodes`, in gang order.
fn gang(mode: SimMode, id: u64, nodes: &[&str], duration: Option<Duration>) -> RunSpec {
    let mut s = spec(id, nodes[0], whole(mode, 0, 8), duration);
    s.model = "H100-80GB".into();
    s.gang = nodes[1..]
        .iter()
        .map(|n| GangShare {
            node: n.to_string(),
            devices: whole(mode, 0, 8),
        })
        .collect();
    s
}

/// How many GPUs of `node` are busy (running work) in a sample now.
fn busy(b: &SimBackend, node: &str) -> usize {
    b.sample().iter().filter(|g| g.node == node && g.util_pct > 0.0).count()
}

fn busy_by_node(b: &SimBackend) -> Vec<usize> {
    NODES.iter().map(|n| busy(b, n)).collect()
}

/// Runs one workload of all 8 GPUs on each node given, so that their GPUs are known free;
/// each is stopped again.
async fn whole_nodes_are_free(b: &SimBackend, nodes: &[&str], first_id: u64) {
    let mode = b.config().mode;
    for (k, node) in nodes.iter().enumerate() {
        let id = first_id + k as u64;
        b.start(&spec(id, node, whole(mode, 0, 8), None))
            .await
            .unwrap_or_else(|e| panic!("{mode}: all 8 GPUs of {node} are free: {e}"));
        b.stop(id, Duration::ZERO).await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_gang_starts_runs_holds_every_share_and_exits_as_one() {
    for cfg in both_modes() {
        let mode = cfg.mode;
        let (b, mut rx) = gang_backend(cfg);
        let g = gang(mode, 1, &NODES[..3], Some(Duration::from_secs(120)));
        b.start(&g).await.unwrap();
        b.start(&g).await.expect("starting a gang twice starts it once");

        assert_eq!(
            next(&mut rx).await,
            BackendEvent::Started { id: 1, bound: None },
            "{mode}: one Started, with no one-node binding to report"
        );
        let running_at = match next(&mut rx).await {
            BackendEvent::Running { id: 1, at_ms, sample } => {
                assert_eq!(sample.len(), 24, "{mode}: a sample of every share's GPUs");
                for node in &NODES[..3] {
                    let on: Vec<_> = sample.iter().filter(|s| s.node == *node).collect();
                    assert_eq!(on.len(), 8, "{mode}: {node}");
                    assert!(on.iter().all(|s| s.util_pct > 0.0), "{mode}: {node}");
                }
                at_ms
            }
            other => panic!("{mode}: expected Running, got {other:?}"),
        };
        assert_eq!(b.starts(), 1, "{mode}");
        assert_eq!(
            busy_by_node(&b),
            vec![8, 8, 8, 0],
            "{mode}: every share's GPUs are busy"
        );

        // Its nodes are full; the fourth is not.
        let e = b.start(&spec(2, "h100-01", whole(mode, 3, 1), None)).await.unwrap_err();
        let why = rejected(e);
        match mode {
            SimMode::Exact => assert_eq!(why, "GPU 3 on h100-01 is in use by workload 1"),
            SimMode::Operator => assert_eq!(why, "only 0 free nvidia.com/gpu on h100-01, 1 asked"),
        }
        let e = b.start(&gang(mode, 3, &NODES[2..], None)).await.unwrap_err();
        assert!(
            rejected(e).starts_with("node-share 0 of gang workload 3 on h100-02: "),
            "{mode}"
        );
        b.start(&spec(4, "h100-03", whole(mode, 0, 1), None)).await.unwrap();
        b.stop(4, Duration::ZERO).await.unwrap();
        assert!(matches!(next(&mut rx).await, BackendEvent::Started { id: 4, .. }));

        let r = b.reconcile(std::slice::from_ref(&g)).await.unwrap();
        assert_eq!(
            r.workloads,
            vec![(
                1,
                Observation::Running {
                    since_ms: Some(running_at)
                }
            )],
            "{mode}: reported once"
        );
        assert!(r.orphans.is_empty(), "{mode}: a gang's shares are no orphans");

        let t0 = Instant::now();
        match next(&mut rx).await {
            BackendEvent::Exited {
                id: 1,
                at_ms,
                exit: Exit::Succeeded,
            } => {
                assert_eq!(at_ms - running_at, 120_000, "{mode}");
                assert!(t0.elapsed() <= Duration::from_secs(120), "{mode}");
            }
            other => panic!("{mode}: expected Exited, got {other:?}"),
        }
        silent(&mut rx, Duration::from_secs(3600)).await;
        assert_eq!(busy_by_node(&b), vec![0, 0, 0, 0], "{mode}: every share ended with it");
        let r = b.reconcile(std::slice::from_ref(&g)).await.unwrap();
        assert_eq!(r.workloads, vec![(1, Observation::Succeeded)], "{mode}");
        whole_nodes_are_free(&b, &NODES[..3], 10).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_gang_that_cannot_start_a_share_starts_nothing() {
    for cfg in both_modes() {
        let mode = cfg.mode;
        let (b, mut rx) = gang_backend(cfg);
        // One GPU of the third share's node is taken.
        b.start(&spec(9, "h100-02", whole(mode, 5, 1), None)).await.unwrap();
        assert!(matches!(next(&mut rx).await, BackendEvent::Started { id: 9, .. }));
        assert!(matches!(next(&mut rx).await, BackendEvent::Running { id: 9, .. }));

        let e = b.start(&gang(mode, 1, &NODES[..3], None)).await.unwrap_err();
        let why = rejected(e);
        match mode {
            SimMode::Exact => assert_eq!(
                why,
                "node-share 2 of gang workload 1 on h100-02: GPU 5 on h100-02 is in use by workload 9"
            ),
            SimMode::Operator => assert_eq!(
                why,
                "node-share 2 of gang workload 1 on h100-02: only 7 free nvidia.com/gpu on h100-02, 8 asked"
            ),
        }
        assert_eq!(b.starts(), 1, "{mode}");
        assert_eq!(
            busy_by_node(&b),
            vec![0, 0, 1, 0],
            "{mode}: only workload 9 holds a GPU"
        );

        // An unknown node, a node that is down, a node named twice: nothing either.
        let e = b
            .start(&gang(mode, 2, &["h100-00", "h100-01", "h100-09"], None))
            .await
            .unwrap_err();
        assert_eq!(
            rejected(e),
            "node-share 2 of gang workload 2 on h100-09: no node `h100-09` in the simulated fleet",
            "{mode}"
        );
        b.remove_node("h100-03").unwrap();
        assert!(matches!(
            next(&mut rx).await,
            BackendEvent::NodeChanged {
                change: NodeChange::Removed,
                ..
            }
        ));
        let e = b
            .start(&gang(mode, 3, &["h100-00", "h100-01", "h100-03"], None))
            .await
            .unwrap_err();
        assert_eq!(
            rejected(e),
            "node-share 2 of gang workload 3 on h100-03: node `h100-03` is down (removed or rebooting)",
            "{mode}"
        );
        let e = b
            .start(&gang(mode, 4, &["h100-00", "h100-01", "h100-00"], None))
            .await
            .unwrap_err();
        assert!(
            rejected(e).contains("node-share 0 of the gang is on h100-00 already"),
            "{mode}"
        );
        silent(&mut rx, Duration::from_secs(3600)).await;
        assert_eq!(b.starts(), 1, "{mode}");
        let r = b.reconcile(&[]).await.unwrap();
        assert_eq!(r.orphans.len(), 1, "{mode}: workload 9 only");
        // Every share's devices stayed free: whole nodes start on them.
        whole_nodes_are_free(&b, &NODES[..2], 10).await;
    }
}

#[tokio::test(start_paused = true)]
async fn losing_the_node_of_one_share_loses_the_gang_once_and_frees_every_share() {
    for cfg in both_modes() {
        let mode = cfg.mode;
        let (b, mut rx) = gang_backend(cfg);
        let g = gang(mode, 1, &NODES[..3], Some(Duration::from_secs(600)));
        b.start(&g).await.unwrap();
        next(&mut rx).await;
        assert!(matches!(next(&mut rx).await, BackendEvent::Running { id: 1, .. }));

        b.remove_node("h100-02").unwrap();
        match next(&mut rx).await {
            BackendEvent::Lost { id: 1, detail, .. } => assert_eq!(
                detail, "node-share 2 of 3 on h100-02 was lost: h100-02 went away (injected); the gang ends with it",
                "{mode}"
            ),
            other => panic!("{mode}: expected Lost, got {other:?}"),
        }
        assert_eq!(
            next(&mut rx).await,
            BackendEvent::NodeChanged {
                node: "h100-02".into(),
                change: NodeChange::Removed
            }
        );
        silent(&mut rx, Duration::from_secs(3600)).await;
        assert_eq!(busy_by_node(&b), vec![0, 0, 0, 0], "{mode}");
        let r = b.reconcile(std::slice::from_ref(&g)).await.unwrap();
        assert_eq!(
            r.workloads,
            vec![(1, Observation::Unknown)],
            "{mode}: lost here, never adopted again"
        );
        whole_nodes_are_free(&b, &NODES[..2], 10).await;

        // A share deleted behind Tessera's back loses the gang the same way.
        b.restore_node("h100-02").unwrap();
        let g = gang(mode, 2, &NODES[1..], None);
        b.start(&g).await.unwrap();
        assert!(!b.lose_share(2, 3), "{mode}: no share 3");
        assert!(b.lose_share(2, 1), "{mode}");
        let detail = loop {
            match next(&mut rx).await {
                BackendEvent::Lost { id: 2, detail, .. } => break detail,
                BackendEvent::Lost { .. } => panic!("{mode}: only the gang is lost"),
                _ => {}
            }
        };
        assert_eq!(
            detail, "node-share 1 of 3 vanished from h100-02 (injected); the gang ends with it",
            "{mode}"
        );
        assert_eq!(busy_by_node(&b), vec![0, 0, 0, 0], "{mode}");
        whole_nodes_are_free(&b, &NODES[1..], 20).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_stop_stops_every_share_at_once() {
    for cfg in both_modes() {
        let mode = cfg.mode;
        let (b, mut rx) = gang_backend(SimConfig {
            stop_time: Duration::from_secs(20),
            ..cfg
        });
        let g = gang(mode, 1, &NODES[..3], Some(Duration::from_secs(30)));
        b.start(&g).await.unwrap();
        next(&mut rx).await;
        next(&mut rx).await;
        assert_eq!(busy_by_node(&b), vec![8, 8, 8, 0], "{mode}");

        let t0 = Instant::now();
        b.stop(1, Duration::from_secs(5)).await.unwrap();
        assert_eq!(
            t0.elapsed(),
            Duration::from_secs(5),
            "{mode}: one grace period for the gang"
        );
        assert_eq!(busy_by_node(&b), vec![0, 0, 0, 0], "{mode}: every share stopped");
        silent(&mut rx, Duration::from_secs(3600)).await;
        b.stop(1, Duration::from_secs(5)).await.expect("stop is idempotent");
        assert!(
            !b.capabilities().confirms_stop,
            "{mode}: `stop` returning is the end, so no Stopped event is owed"
        );
        let r = b.reconcile(std::slice::from_ref(&g)).await.unwrap();
        assert_eq!(r.workloads, vec![(1, Observation::Unknown)], "{mode}");
        whole_nodes_are_free(&b, &NODES[..3], 10).await;

        // Stopped before it ran: no Running either.
        let g = gang(mode, 2, &NODES[1..], Some(Duration::from_secs(30)));
        b.start(&g).await.unwrap();
        b.stop(2, Duration::ZERO).await.unwrap();
        // After the Started of the whole-node workloads above, each stopped before it ran.
        for id in [10, 11, 12, 2] {
            assert!(matches!(next(&mut rx).await, BackendEvent::Started { id: got, .. } if got == id));
        }
        silent(&mut rx, Duration::from_secs(3600)).await;
        assert_eq!(busy_by_node(&b), vec![0, 0, 0, 0], "{mode}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_restarted_control_plane_reconciles_and_adopts_the_gang_as_one() {
    for cfg in both_modes() {
        let mode = cfg.mode;
        // A fresh backend: what a control plane restarted over running hardware finds.
        let (b, mut rx) = gang_backend(cfg.clone());
        let now = epoch_ms();
        let mut g = gang(mode, 1, &NODES[..3], Some(Duration::from_secs(60)));
        g.running_since_ms = Some(now - 10_000);

        let r = b.reconcile(std::slice::from_ref(&g)).await.unwrap();
        let running = Observation::Running {
            since_ms: Some(now - 10_000),
        };
        assert_eq!(r.workloads, vec![(1, running.clone())], "{mode}");
        assert!(r.orphans.is_empty(), "{mode}");
        assert_eq!(busy_by_node(&b), vec![8, 8, 8, 0], "{mode}: every share adopted");
        let again = b.reconcile(std::slice::from_ref(&g)).await.unwrap();
        assert_eq!(again.workloads, vec![(1, running)], "{mode}: adopted once");
        assert_eq!(b.starts(), 0, "{mode}");
        let e = b.start(&spec(2, "h100-02", whole(mode, 0, 1), None)).await.unwrap_err();
        assert!(
            rejected(e).contains("h100-02"),
            "{mode}: the adopted shares hold their GPUs"
        );

        // Not expected any more: one orphan for the gang, at its first node.
        let r = b.reconcile(&[]).await.unwrap();
        assert_eq!(r.orphans.len(), 1, "{mode}");
        let o = &r.orphans[0];
        assert_eq!((o.id, o.node.as_str()), (Some(1), "h100-00"), "{mode}");
        assert_eq!(
            o.detail,
            "batch workload 1 `train-1` of acme/vision runs on h100-00, h100-01, h100-02 (a gang of 3 node-shares) but is not expected"
        );

        exits_after_the_rest_of_its_time(&mut rx, mode).await;
        assert_eq!(busy_by_node(&b), vec![0, 0, 0, 0], "{mode}");

        // A share whose node is down cannot be adopted: the gang fails, and holds nothing.
        let (b, _rx) = gang_backend(cfg.clone());
        b.remove_node("h100-02").unwrap();
        let mut g = gang(mode, 3, &NODES[..3], None);
        g.running_since_ms = Some(epoch_ms() - 10_000);
        let r = b.reconcile(std::slice::from_ref(&g)).await.unwrap();
        assert_eq!(
            r.workloads,
            vec![(
                3,
                Observation::Failed {
                    detail: "cannot adopt it after a control-plane restart: node-share 2 of gang workload 3 on \
                             h100-02: node `h100-02` is down (removed or rebooting)"
                        .into()
                }
            )],
            "{mode}"
        );
        assert_eq!(busy_by_node(&b), vec![0, 0, 0, 0], "{mode}: nothing adopted");
        whole_nodes_are_free(&b, &NODES[..2], 10).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_gang_whose_share_vanished_silently_is_reported_failed() {
    for cfg in both_modes() {
        let mode = cfg.mode;
        let (b, mut rx) = gang_backend(cfg);
        let g = gang(mode, 1, &NODES[..3], Some(Duration::from_secs(60)));
        b.start(&g).await.unwrap();
        next(&mut rx).await;
        next(&mut rx).await;

        assert!(b.forget_share(1, 2), "{mode}");
        assert!(!b.forget_share(1, 2), "{mode}: gone already");
        assert_eq!(busy_by_node(&b), vec![8, 8, 0, 0], "{mode}: only its devices are freed");
        let failed = Observation::Failed {
            detail: "node-share 2 of 3 on h100-02 is gone; the gang cannot go on without it".into(),
        };
        let r = b.reconcile(std::slice::from_ref(&g)).await.unwrap();
        assert_eq!(r.workloads, vec![(1, failed.clone())], "{mode}");
        assert!(r.orphans.is_empty(), "{mode}");

        // Unstopped, its end is a loss, not a success.
        match next(&mut rx).await {
            BackendEvent::Lost { id: 1, detail, .. } => assert_eq!(
                detail, "node-share 2 of 3 on h100-02 is gone; the gang cannot go on without it",
                "{mode}"
            ),
            other => panic!("{mode}: expected Lost, got {other:?}"),
        }
        assert_eq!(busy_by_node(&b), vec![0, 0, 0, 0], "{mode}");

        // Stopped, every share left is freed.
        let g = gang(mode, 2, &NODES[..3], None);
        b.start(&g).await.unwrap();
        next(&mut rx).await;
        next(&mut rx).await;
        assert!(b.forget_share(2, 0), "{mode}");
        b.stop(2, Duration::ZERO).await.unwrap();
        silent(&mut rx, Duration::from_secs(3600)).await;
        assert_eq!(busy_by_node(&b), vec![0, 0, 0, 0], "{mode}");
        whole_nodes_are_free(&b, &NODES[..3], 10).await;
    }
}

#[tokio::test(start_paused = true)]
async fn telemetry_covers_every_shares_gpus() {
    let cfg = SimConfig {
        telemetry_interval: Duration::from_secs(5),
        ..SimConfig::for_mode(SimMode::Operator)
    };
    let b = SimBackend::new(cfg, gang_fleet());
    let mut rx = b.take_events().unwrap();
    b.start(&gang(SimMode::Operator, 1, &NODES[1..], None)).await.unwrap();
    let mut seen = 0;
    while seen < 2 {
        if let BackendEvent::Telemetry { gpus, .. } = next(&mut rx).await {
            seen += 1;
            if seen == 2 {
                assert_eq!(gpus.len(), 32);
                for node in &NODES {
                    let hot = gpus.iter().filter(|g| g.node == *node && g.util_pct > 0.0).count();
                    assert_eq!(hot, if *node == "h100-00" { 0 } else { 8 }, "{node}");
                }
            }
        }
    }
}
