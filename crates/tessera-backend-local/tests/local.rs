//! The local backend on the fake NVML with real processes: discovery, MIG adoption, instance
//! create/destroy at exact placements, XIDs, CUDA_VISIBLE_DEVICES, logs, SIGTERM then SIGKILL,
//! and a restart adopting live processes.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_backend::{
    Backend, BackendError, BackendEvent, Devices, Exit, MigInstance, MigModeChange, Observation, PartitionPlan,
    RunSpec, SliceSpec,
};
use tessera_backend_local::process::{Cgroups, group_alive};
use tessera_backend_local::{FakeGpu, FakeNvml, LocalBackend, LocalConfig, Nvml, RunAs, SandboxMode, fake_bus_id};
use tokio::sync::mpsc::UnboundedReceiver;

/// Removes from `dir` what earlier runs of these tests left there: the entries named
/// `PREFIX…-PID` (or `PREFIX…-PID.work`) of a process that is gone. A run keeps its own
/// directories, to be read after a failure, until a later run sweeps them.
pub(crate) fn sweep_earlier_runs(dir: &std::path::Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(prefix) else {
            continue;
        };
        let rest = rest.strip_suffix(".work").unwrap_or(rest);
        let Some(pid) = rest.rsplit('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

pub(crate) fn data_dir(name: &str) -> PathBuf {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| sweep_earlier_runs(&std::env::temp_dir(), "tessera-local-"));
    let d = std::env::temp_dir().join(format!("tessera-local-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    let _ = std::fs::remove_dir_all(work_dir(&d));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The work directory next to a test's data directory.
fn work_dir(data: &std::path::Path) -> PathBuf {
    data.with_extension("work")
}

/// Without cgroups (the process-group fallback); workloads as users of their own when the
/// tests run as root.
pub(crate) fn config(dir: &std::path::Path, interval_ms: u64) -> LocalConfig {
    // SAFETY: plain syscall.
    let root = unsafe { libc::geteuid() } == 0;
    LocalConfig {
        node: "here".into(),
        data_dir: dir.to_path_buf(),
        work_dir: work_dir(dir),
        run_as: if root {
            RunAs::parse_range("210000-219999").unwrap()
        } else {
            RunAs::Server
        },
        log_cap: 64 << 20,
        pids_max: 0,
        dev_dir: "/dev".into(),
        telemetry_interval: Duration::from_millis(interval_ms),
        cgroups: Cgroups::off("tests"),
        lease_grace: Duration::from_millis(300),
        sandbox: SandboxMode::Auto,
        containers: None,
    }
}

/// GPU 0: H100 in MIG mode with a 3g at slice 0 made before Tessera started; GPU 1: H100, MIG
/// off, NVLinked to GPU 0; GPU 2: a model the catalogue does not know.
pub(crate) fn fake() -> Arc<FakeNvml> {
    let mut g0 = FakeGpu::of("H100-80GB-SXM").with_mig(&[(9, 0)]);
    g0.nvlink_peers = vec![fake_bus_id(1)];
    let mut g1 = FakeGpu::of("H100-80GB-SXM");
    g1.nvlink_peers = vec![fake_bus_id(0), "00000000:C0:00.0".into()];
    let g2 = FakeGpu {
        name: "NVIDIA Imaginary X1".into(),
        memory_mib: 12288,
        mig_enabled: None,
        instances: Vec::new(),
        nvlink_peers: Vec::new(),
    };
    Arc::new(FakeNvml::new(vec![g0, g1, g2]))
}

pub(crate) fn spec(id: u64, gpus: Vec<u8>, slice: SliceSpec, cmd: &str) -> RunSpec {
    RunSpec {
        id,
        tenant: "t".into(),
        project: "p".into(),
        name: format!("w{id}"),
        kind: "batch".into(),
        node: "here".into(),
        model: "H100-80GB-SXM".into(),
        model_memory_mib: 81559,
        devices: Devices::Exact { gpus, slice },
        cpu_milli: 1000,
        memory_mib: 1024,
        env: BTreeMap::from([("GREETING".to_string(), "hello".to_string())]),
        command: Some(vec!["sh".into(), "-c".into(), cmd.into()]),
        image: None,
        duration: None,
        running_since_ms: None,
        gang: Vec::new(),
        native: None,
    }
}

/// Makes a `2g.20gb` MIG instance at memory slice 4 of GPU 0.
async fn partition_2g(b: &LocalBackend) -> MigInstance {
    let inst = MigInstance::new("2g.20gb", 14, 4, 2);
    let plan = PartitionPlan::Instance {
        node: "here".into(),
        gpu: 0,
        instance: inst.clone(),
    };
    b.partition(&plan).await.unwrap();
    inst
}

async fn next_for(rx: &mut UnboundedReceiver<BackendEvent>, id: u64, within: Duration) -> Option<BackendEvent> {
    let deadline = Instant::now() + within;
    while let Ok(Some(ev)) = tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), rx.recv()).await {
        if ev.workload() == Some(id) {
            return Some(ev);
        }
    }
    None
}

async fn exit_of(rx: &mut UnboundedReceiver<BackendEvent>, id: u64) -> Exit {
    loop {
        match next_for(rx, id, Duration::from_secs(10)).await {
            Some(BackendEvent::Exited { exit, .. }) => return exit,
            Some(_) => continue,
            None => panic!("workload {id} did not exit"),
        }
    }
}

async fn log_of(b: &LocalBackend, id: u64) -> String {
    let c = b.read_logs(id, 0, 1 << 20).await.unwrap();
    String::from_utf8(c.bytes).unwrap()
}

/// Starts workload `id` on GPU 1 as a command that traps SIGTERM and keeps going (only SIGKILL
/// ends it), and waits until it runs.
async fn start_stubborn(b: &LocalBackend, id: u64) {
    let stubborn = "trap 'echo got TERM' TERM; echo ready; while :; do sleep 0.05; done";
    b.start(&spec(id, vec![1], SliceSpec::Whole, stubborn)).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !log_of(b, id).await.contains("ready") {
        assert!(Instant::now() < deadline, "never became ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The process group of workload `id`, from the pid file the backend keeps in `dir`.
fn process_group(dir: &std::path::Path, id: u64) -> i32 {
    std::fs::read_to_string(dir.join(format!("workloads/{id}/pid")))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_maps_models_mig_instances_and_nvlink() {
    let dir = data_dir("discovery");
    let b = LocalBackend::new(fake(), config(&dir, 1000)).unwrap();
    let d = b.discovery();
    assert_eq!(d.gpus.len(), 3);
    let (g0, g1, g2) = (&d.gpus[0], &d.gpus[1], &d.gpus[2]);
    assert_eq!(g0.model.as_deref(), Some("H100-80GB-SXM"));
    assert_eq!((g0.served_as, g1.served_as), ("mig", "whole"));
    assert_eq!(g0.instances.len(), 1);
    assert_eq!(
        (g0.instances[0].profile_id, g0.instances[0].start, g0.instances[0].size),
        (9, 0, 4)
    );
    assert!(g0.info.uuid.starts_with("GPU-") && g0.info.uuid != g1.info.uuid);
    assert_eq!(g0.nvlink_gpus, vec![1]);
    assert_eq!(
        (g1.nvlink_gpus.clone(), g1.nvlink_other),
        (vec![0], 1),
        "one link to a non-GPU"
    );
    assert_eq!(g2.model, None);
    assert_eq!(g2.served_as, "whole");
    assert!(
        g2.note.as_deref().unwrap().contains("not in Tessera's catalogue"),
        "{:?}",
        g2.note
    );
    let json = serde_json::to_value(d).unwrap();
    assert_eq!(json["gpus"][0]["pci_bus_id"], fake_bus_id(0));
    assert_eq!(json["gpus"][0]["mig_enabled"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mig_instances_are_adopted_created_and_destroyed_at_exact_placements() {
    let dir = data_dir("mig");
    let nvml = fake();
    let b = LocalBackend::new(nvml.clone(), config(&dir, 1000)).unwrap();
    let plan = |profile: &str, id: u32, start: u8, size: u8| PartitionPlan::Instance {
        node: "here".into(),
        gpu: 0,
        instance: MigInstance::new(profile, id, start, size),
    };
    // The 3g at 0 existed before start-up: adopted, never created or destroyed.
    let r = b.partition(&plan("3g.40gb", 9, 0, 4)).await.unwrap();
    assert!(!r.created, "{}", r.detail);
    b.unpartition(&plan("3g.40gb", 9, 0, 4)).await.unwrap();
    assert!(nvml.calls().is_empty(), "{:?}", nvml.calls());
    assert_eq!(
        nvml.instances(0).unwrap().len(),
        1,
        "the adopted instance is still there"
    );
    // A 1g at slice 6, exactly there; twice is one creation.
    assert!(b.partition(&plan("1g.10gb", 19, 6, 1)).await.unwrap().created);
    assert!(!b.partition(&plan("1g.10gb", 19, 6, 1)).await.unwrap().created);
    assert_eq!(nvml.calls(), vec!["create 0 19@6 -> 2"]);
    // A placement whose size is not the profile's memory slices is refused, nothing created.
    let e = b.partition(&plan("2g.20gb", 14, 4, 1)).await.unwrap_err();
    assert!(e.to_string().contains("occupies 2 memory slices"), "{e}");
    assert_eq!(nvml.calls().len(), 1);
    // A 3g at 4 overlaps the 1g at 6: NVML refuses, the backend rejects.
    let e = b.partition(&plan("3g.40gb", 9, 4, 4)).await.unwrap_err();
    assert!(
        matches!(e, BackendError::Rejected(ref m) if m.contains("insufficient resources")),
        "{e}"
    );
    // The reconcile report shows the layout NVML has.
    let layouts = b.reconcile(&[]).await.unwrap().layouts;
    assert_eq!(layouts.len(), 1);
    let starts: Vec<(u32, u8)> = layouts[0].2.iter().map(|i| (i.profile_id, i.start)).collect();
    assert_eq!(starts, vec![(9, 0), (19, 6)]);
    assert_eq!(layouts[0].2[0].profile, "3g.40gb");
    // Destroying the created one, twice is one destruction.
    b.unpartition(&plan("1g.10gb", 19, 6, 1)).await.unwrap();
    b.unpartition(&plan("1g.10gb", 19, 6, 1)).await.unwrap();
    assert_eq!(nvml.calls(), vec!["create 0 19@6 -> 2", "destroy 0 2"]);
    // A GPU not in MIG mode is never switched.
    let e = b
        .partition(&PartitionPlan::Instance {
            node: "here".into(),
            gpu: 1,
            instance: MigInstance::new("1g.10gb", 19, 0, 1),
        })
        .await
        .unwrap_err();
    assert!(e.to_string().contains("never switches MIG mode"), "{e}");
    assert_eq!(nvml.calls().len(), 2);
}

#[tokio::test]
async fn mig_mode_changes_go_through_nvml_and_a_pending_reset_is_reported() {
    let dir = data_dir("migmode");
    let nvml = fake();
    let b = LocalBackend::new(nvml.clone(), config(&dir, 1000)).unwrap();
    assert!(b.capabilities().mig_mode_switch);
    // GPU 1 (MIG off): enabled at once; then an instance can be created there.
    assert_eq!(b.set_mig_mode("here", 1, true).await.unwrap(), MigModeChange::Applied);
    assert_eq!(nvml.gpus().unwrap()[1].mig_enabled, Some(true));
    let one_g = PartitionPlan::Instance {
        node: "here".into(),
        gpu: 1,
        instance: MigInstance::new("1g.10gb", 19, 0, 1),
    };
    assert!(b.partition(&one_g).await.unwrap().created);
    // A GPU holding an instance (created or adopted) is refused before NVML is asked.
    for gpu in [0, 1] {
        let e = b.set_mig_mode("here", gpu, false).await.unwrap_err();
        assert!(e.to_string().contains("GPU instance(s)"), "{e}");
    }
    b.unpartition(&one_g).await.unwrap();
    // Off again, and the same mode twice is one change applied (idempotent).
    assert_eq!(b.set_mig_mode("here", 1, false).await.unwrap(), MigModeChange::Applied);
    assert_eq!(b.set_mig_mode("here", 1, false).await.unwrap(), MigModeChange::Applied);
    assert_eq!(nvml.gpus().unwrap()[1].mig_enabled, Some(false));
    // A driver that needs a GPU reset: the new mode is pending, the GPU keeps its mode.
    nvml.require_reset(1);
    assert_eq!(
        b.set_mig_mode("here", 1, true).await.unwrap(),
        MigModeChange::PendingReset
    );
    let g1 = &nvml.gpus().unwrap()[1];
    assert_eq!((g1.mig_enabled, g1.mig_pending), (Some(false), Some(true)));
    // No MIG on the unknown model; another node's GPU is not this machine's.
    let e = b.set_mig_mode("here", 2, true).await.unwrap_err();
    assert!(e.to_string().contains("not supported"), "{e}");
    let e = b.set_mig_mode("there", 1, true).await.unwrap_err();
    assert!(e.to_string().contains("not there"), "{e}");
    let migs: Vec<String> = nvml.calls().into_iter().filter(|c| c.starts_with("mig")).collect();
    assert_eq!(migs, vec!["mig 1 on", "mig 1 off", "mig 1 off", "mig 1 on"]);
}

/// The MIG mode of the GPUs with MIG, as `BackendEvent::MigMode` reports it: (enabled, pending)
/// of `gpu`, the first report matching `want` within `within`.
async fn mig_mode(
    rx: &mut UnboundedReceiver<BackendEvent>,
    gpu: u8,
    want: (bool, bool),
    within: Duration,
) -> Option<(bool, bool)> {
    let end = Instant::now() + within;
    while let Ok(Some(e)) = tokio::time::timeout(end.saturating_duration_since(Instant::now()), rx.recv()).await {
        if let BackendEvent::MigMode {
            node,
            gpu: g,
            enabled,
            pending,
        } = e
            && g == gpu
        {
            assert_eq!(node, "here");
            if (enabled, pending) == want {
                return Some(want);
            }
        }
    }
    None
}

/// Each GPU's MIG mode is reported at every pass (the GPU without MIG is not); a change pending a
/// GPU reset is reported as pending, and once an operator reset the GPU the backend reads the
/// new mode at its next telemetry pass and reports it applied, without the admin repeating the
/// command. About 0.5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mig_modes_are_reported_and_a_pending_change_comes_back_after_a_reset() {
    let dir = data_dir("migreport");
    let nvml = fake();
    let b = LocalBackend::new(nvml.clone(), config(&dir, 100)).unwrap();
    let mut rx = b.take_events().unwrap();
    let mut first = Vec::new();
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(50), rx.recv()).await {
        if let BackendEvent::MigMode {
            gpu, enabled, pending, ..
        } = e
        {
            first.push((gpu, enabled, pending));
        }
    }
    first.sort_unstable();
    first.dedup();
    assert_eq!(first, vec![(0, true, false), (1, false, false)], "GPU 2 has no MIG");
    nvml.require_reset(1);
    assert_eq!(
        b.set_mig_mode("here", 1, true).await.unwrap(),
        MigModeChange::PendingReset
    );
    let within = Duration::from_millis(1000);
    assert_eq!(mig_mode(&mut rx, 1, (true, true), within).await, Some((true, true)));
    nvml.reset(1);
    assert_eq!(mig_mode(&mut rx, 1, (true, false), within).await, Some((true, false)));
    assert_eq!(nvml.gpus().unwrap()[1].mig_enabled, Some(true));
}

async fn health(rx: &mut UnboundedReceiver<BackendEvent>, within: Duration) -> Option<(u8, bool, Option<u32>, String)> {
    let deadline = Instant::now() + within;
    while let Ok(Some(ev)) = tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), rx.recv()).await {
        if let BackendEvent::GpuHealth {
            gpu,
            healthy,
            xid,
            detail,
            ..
        } = ev
        {
            return Some((gpu, healthy, xid, detail));
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_critical_xid_marks_the_gpu_unhealthy_within_one_interval() {
    let dir = data_dir("xid");
    let nvml = fake();
    let interval = Duration::from_millis(400);
    let b = LocalBackend::new(nvml.clone(), config(&dir, interval.as_millis() as u64)).unwrap();
    let mut rx = b.take_events().unwrap();
    assert!(b.take_events().is_none(), "handed out once");
    // An application XID (13) does not make the GPU unhealthy.
    nvml.inject_xid(1, 13);
    assert_eq!(health(&mut rx, interval * 2).await, None);
    let t = Instant::now();
    nvml.inject_xid(1, 79);
    let (gpu, healthy, xid, detail) = health(&mut rx, interval).await.expect("GpuHealth within one interval");
    assert!(t.elapsed() <= interval, "{:?}", t.elapsed());
    assert_eq!((gpu, healthy, xid), (1, false, Some(79)));
    assert!(detail.contains("XID 79"), "{detail}");
    // Telemetry carries the last XID of the GPU.
    let deadline = Instant::now() + interval * 3;
    let mut seen = None;
    while let Ok(Some(ev)) = tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), rx.recv()).await {
        if let BackendEvent::Telemetry { gpus, .. } = ev {
            seen = Some(gpus);
            break;
        }
    }
    let gpus = seen.expect("a telemetry sample");
    assert_eq!(gpus.len(), 3);
    assert_eq!(gpus[1].xid, 79);
    assert_eq!(gpus[0].xid, 0);
    // A GPU that falls off the bus is unhealthy at the next sample.
    nvml.lose(2);
    let (gpu, healthy, xid, detail) = health(&mut rx, interval * 2).await.expect("lost GPU reported");
    assert_eq!((gpu, healthy, xid), (2, false, None));
    assert!(detail.contains("lost"), "{detail}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_see_their_devices_and_their_output_is_readable() {
    let dir = data_dir("visible");
    let nvml = fake();
    let b = LocalBackend::new(nvml.clone(), config(&dir, 5000)).unwrap();
    let mut rx = b.take_events().unwrap();
    let uuids: Vec<String> = b.discovery().gpus.iter().map(|g| g.info.uuid.clone()).collect();
    // Whole GPU 1.
    b.start(&spec(
        1,
        vec![1],
        SliceSpec::Whole,
        "echo visible=$CUDA_VISIBLE_DEVICES $GREETING; echo oops >&2",
    ))
    .await
    .unwrap();
    assert!(matches!(
        next_for(&mut rx, 1, Duration::from_secs(5)).await,
        Some(BackendEvent::Started { .. })
    ));
    assert!(matches!(
        next_for(&mut rx, 1, Duration::from_secs(5)).await,
        Some(BackendEvent::Running { .. })
    ));
    assert_eq!(exit_of(&mut rx, 1).await, Exit::Succeeded);
    let log = log_of(&b, 1).await;
    assert!(log.contains(&format!("visible={} hello", uuids[1])), "{log}");
    assert!(log.contains("oops"), "stderr is captured too: {log}");
    let c = b.read_logs(1, 0, 1 << 20).await.unwrap();
    assert!(c.done, "ended and read to the end");
    let tail = b.read_logs(1, 8, 4).await.unwrap();
    assert_eq!(tail.bytes.len(), 4);
    assert_eq!(tail.next_offset, 12);
    // Two whole GPUs.
    b.start(&spec(2, vec![0, 1], SliceSpec::Whole, "echo $CUDA_VISIBLE_DEVICES"))
        .await
        .unwrap();
    assert_eq!(exit_of(&mut rx, 2).await, Exit::Succeeded);
    assert_eq!(log_of(&b, 2).await.trim(), format!("{},{}", uuids[0], uuids[1]));
    // A MIG instance: the MIG device's UUID.
    let inst = partition_2g(&b).await;
    let mig_uuid = nvml
        .instances(0)
        .unwrap()
        .into_iter()
        .find(|i| i.start == 4)
        .unwrap()
        .uuid
        .unwrap();
    b.start(&spec(3, vec![0], SliceSpec::Mig(inst), "echo $CUDA_VISIBLE_DEVICES"))
        .await
        .unwrap();
    assert_eq!(exit_of(&mut rx, 3).await, Exit::Succeeded);
    assert_eq!(log_of(&b, 3).await.trim(), mig_uuid);
    assert!(mig_uuid.starts_with("MIG-"));
    // A failing command reports its exit code; an unknown workload has no logs.
    b.start(&spec(4, vec![1], SliceSpec::Whole, "exit 7")).await.unwrap();
    assert!(matches!(
        exit_of(&mut rx, 4).await,
        Exit::Failed { exit_code: Some(7), .. }
    ));
    assert!(b.read_logs(99, 0, 10).await.is_err());
    // No command: one readable refusal.
    let mut no_cmd = spec(5, vec![1], SliceSpec::Whole, "");
    no_cmd.command = None;
    let e = b.start(&no_cmd).await.unwrap_err();
    assert!(e.to_string().contains("runs a command"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_sends_sigterm_then_sigkill_after_the_grace_period() {
    let dir = data_dir("stop");
    let b = LocalBackend::new(fake(), config(&dir, 5000)).unwrap();
    let mut rx = b.take_events().unwrap();
    start_stubborn(&b, 10).await;
    let pgid = process_group(&dir, 10);
    let grace = Duration::from_millis(800);
    let t = Instant::now();
    b.stop(10, grace).await.unwrap();
    b.stop(10, grace).await.unwrap(); // idempotent
    tokio::time::sleep(grace / 2).await;
    assert!(group_alive(pgid), "still running during the grace period");
    assert!(log_of(&b, 10).await.contains("got TERM"), "SIGTERM came first");
    while group_alive(pgid) {
        assert!(t.elapsed() < grace + Duration::from_secs(3), "SIGKILL never came");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        t.elapsed() >= grace,
        "killed before the grace period ended: {:?}",
        t.elapsed()
    );
    // No Exited after stop.
    assert!(
        !matches!(
            next_for(&mut rx, 10, Duration::from_millis(300)).await,
            Some(BackendEvent::Exited { .. })
        ),
        "a stopped workload reports no exit"
    );
    // A polite process ends at SIGTERM, long before its grace.
    b.start(&spec(11, vec![1], SliceSpec::Whole, "sleep 30")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    b.stop(11, Duration::from_secs(20)).await.unwrap();
    let pgid = process_group(&dir, 11);
    while group_alive(pgid) {
        assert!(t.elapsed() < Duration::from_secs(5), "SIGTERM did not end it");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_control_plane_adopts_live_processes() {
    let dir = data_dir("adopt");
    let nvml = fake();
    let w = spec(
        20,
        vec![1],
        SliceSpec::Whole,
        "echo before; sleep 1.5; echo after; exit 3",
    );
    let stray = spec(21, vec![1], SliceSpec::Whole, "sleep 30");
    {
        let first = LocalBackend::new(nvml.clone(), config(&dir, 5000)).unwrap();
        first.start(&w).await.unwrap();
        first.start(&stray).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The control plane goes away; the processes do not.
    }
    let second = LocalBackend::new(nvml.clone(), config(&dir, 5000)).unwrap();
    let mut rx = second.take_events().unwrap();
    let mut expected = w.clone();
    expected.running_since_ms = Some(1234);
    let r = second.reconcile(std::slice::from_ref(&expected)).await.unwrap();
    assert_eq!(r.observation(20), Some(&Observation::Running { since_ms: Some(1234) }));
    assert_eq!(r.orphans.len(), 1, "{:?}", r.orphans);
    assert_eq!(r.orphans[0].id, Some(21));
    // Twice gives the same answer.
    let again = second.reconcile(std::slice::from_ref(&expected)).await.unwrap();
    assert_eq!(again.observation(20), r.observation(20));
    // The adopted process's end is reported with its real exit status.
    assert!(matches!(
        exit_of(&mut rx, 20).await,
        Exit::Failed { exit_code: Some(3), .. }
    ));
    let log = log_of(&second, 20).await;
    assert!(log.contains("before") && log.contains("after"), "{log}");
    assert!(matches!(
        second
            .reconcile(std::slice::from_ref(&expected))
            .await
            .unwrap()
            .observation(20),
        Some(Observation::Failed { .. })
    ));
    // The stray one can be stopped by ID though this run never started it.
    let pgid = process_group(&dir, 21);
    second.stop(21, Duration::from_secs(2)).await.unwrap();
    let t = Instant::now();
    while group_alive(pgid) {
        assert!(t.elapsed() < Duration::from_secs(5), "stray process not stopped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A workload never started here is unknown.
    let r = second
        .reconcile(&[spec(22, vec![1], SliceSpec::Whole, "true")])
        .await
        .unwrap();
    assert_eq!(r.observation(22), Some(&Observation::Unknown));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_reports_each_running_mig_instance() {
    let dir = data_dir("mig-telemetry");
    let b = LocalBackend::new(fake(), config(&dir, 200)).unwrap();
    let mut rx = b.take_events().unwrap();
    let inst = partition_2g(&b).await;
    b.start(&spec(30, vec![0], SliceSpec::Mig(inst), "sleep 5"))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut found = None;
    while let Ok(Some(ev)) = tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), rx.recv()).await {
        if let BackendEvent::Telemetry { gpus, .. } = ev
            && let Some(i) = gpus[0].instances.first()
        {
            found = Some(i.clone());
            break;
        }
    }
    let i = found.expect("a telemetry sample with the MIG instance");
    assert_eq!((i.workload, i.profile.as_str(), i.instance_id), (30, "2g.20gb", 2));
    // 2 of the H100's 8 memory slices.
    assert_eq!(i.fb_free_mib, 81559 * 2 / 8);
    b.stop(30, Duration::from_millis(100)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_is_stopped_when_its_lease_ends() {
    let dir = data_dir("lease");
    let b = LocalBackend::new(fake(), config(&dir, 5000)).unwrap();
    let mut rx = b.take_events().unwrap();
    let mut w = spec(40, vec![1], SliceSpec::Whole, "echo working; sleep 30");
    w.duration = Some(Duration::from_secs(1));
    let t = Instant::now();
    b.start(&w).await.unwrap();
    match exit_of(&mut rx, 40).await {
        Exit::Failed { detail, .. } => assert_eq!(detail, "stopped at the end of its 1 s lease"),
        e => panic!("{e:?}"),
    }
    assert!(
        t.elapsed() >= Duration::from_secs(1) && t.elapsed() < Duration::from_secs(5),
        "{:?}",
        t.elapsed()
    );
    // A workload that ends within its lease is not touched.
    let mut quick = spec(41, vec![1], SliceSpec::Whole, "true");
    quick.duration = Some(Duration::from_secs(1));
    b.start(&quick).await.unwrap();
    assert_eq!(exit_of(&mut rx, 41).await, Exit::Succeeded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_control_plane_still_stops_a_group_whose_leader_is_gone() {
    let dir = data_dir("leaderless");
    let nvml = fake();
    {
        let first = LocalBackend::new(nvml.clone(), config(&dir, 5000)).unwrap();
        start_stubborn(&first, 50).await;
    }
    // SIGTERM reached the group (a stop cut short by a crash): the wrapper, its leader, is gone,
    // the trapping command is not.
    let pgid = process_group(&dir, 50);
    std::process::Command::new("kill")
        .args(["-TERM", "--", &format!("-{pgid}")])
        .status()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(group_alive(pgid), "the trapping command survives SIGTERM");
    let second = LocalBackend::new(nvml, config(&dir, 5000)).unwrap();
    second.stop(50, Duration::from_millis(200)).await.unwrap();
    let t = Instant::now();
    while group_alive(pgid) {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the leaderless group was never killed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
