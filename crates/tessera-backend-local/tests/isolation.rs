//! The local backend's isolation, attacked by real workload processes (issue 28): each attack a
//! hostile tenant tried is run as a workload and must be refused. The backend runs on the fake
//! NVML with real cgroups (v1 or v2 under `/sys/fs/cgroup`), workloads as users of their own, and
//! fake GPU device nodes (char major 195, as NVIDIA's, in a temporary directory: with no NVIDIA
//! driver loaded, opening an allowed node fails with ENXIO, a denied one with EPERM). Needs root;
//! without it each test says so and passes without running.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_backend::{Backend, BackendEvent, Exit, Observation, RunSpec, SliceSpec};
use tessera_backend_local::process::{Cgroups, start_ticks};
use tessera_backend_local::{FakeGpu, FakeNvml, LocalBackend, LocalConfig, RunAs, SandboxMode};
use tokio::sync::mpsc::UnboundedReceiver;

const FIRST_UID: u32 = 220000;

fn root() -> bool {
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: the isolation tests need root (other users, cgroups, device nodes)");
        return false;
    }
    true
}

/// A test's data directory, work directory, fake `/dev`, and cgroups.
struct Env {
    data: PathBuf,
    work: PathBuf,
    dev: PathBuf,
    cg: Cgroups,
}

impl Env {
    fn new(name: &str) -> Env {
        Env::under(&std::env::temp_dir(), name)
    }

    /// In `parent` (a directory others may traverse).
    fn under(parent: &Path, name: &str) -> Env {
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(|| {
            for dir in [std::env::temp_dir().as_path(), Path::new("/run")] {
                crate::local::sweep_earlier_runs(dir, "tessera-iso-");
            }
        });
        let base = parent.join(format!("tessera-iso-{name}-{}", std::process::id()));
        let (data, work, dev) = (base.join("data"), base.join("work"), base.join("dev"));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&dev, std::fs::Permissions::from_mode(0o755)).unwrap();
        for (node, minor) in [("nvidia0", 0), ("nvidia1", 1), ("nvidiactl", 255)] {
            let path = CString::new(dev.join(node).as_os_str().as_bytes()).unwrap();
            // SAFETY: plain syscalls on a path in a fresh directory.
            unsafe {
                assert_eq!(
                    libc::mknod(path.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(195, minor)),
                    0,
                    "mknod {node}"
                );
                libc::chmod(path.as_ptr(), 0o666);
            }
        }
        let cg = Cgroups::detect(
            Path::new("/sys/fs/cgroup"),
            &format!("tessera-test/{name}-{}", std::process::id()),
        );
        assert!(cg.enabled(), "no cgroups: {}", cg.skipped);
        Env { data, work, dev, cg }
    }

    /// The attacks below test users, cgroups and permissions alone (as on a host that allows
    /// no sandbox); the sandbox's own tests turn it on.
    fn config(&self) -> LocalConfig {
        LocalConfig {
            node: "here".into(),
            data_dir: self.data.clone(),
            work_dir: self.work.clone(),
            run_as: RunAs::parse_range(&format!("{FIRST_UID}-{}", FIRST_UID + 9999)).unwrap(),
            log_cap: 1 << 20,
            pids_max: 32,
            dev_dir: self.dev.clone(),
            telemetry_interval: Duration::from_secs(5),
            cgroups: self.cg.clone(),
            lease_grace: Duration::from_millis(300),
            sandbox: SandboxMode::Off,
            containers: None,
        }
    }

    fn backend(&self) -> LocalBackend {
        self.backend_with(self.config())
    }

    fn backend_with(&self, cfg: LocalConfig) -> LocalBackend {
        let nvml = Arc::new(FakeNvml::new(vec![
            FakeGpu::of("H100-80GB-SXM"),
            FakeGpu::of("H100-80GB-SXM"),
        ]));
        LocalBackend::new(nvml, cfg).unwrap()
    }

    /// With the sandbox the host must allow (these tests run as root).
    fn sandboxed(&self) -> LocalBackend {
        let b = self.backend_with(LocalConfig {
            sandbox: SandboxMode::Required,
            ..self.config()
        });
        assert!(b.sandboxed());
        b
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        self.cg.remove_parent();
        if let Some(base) = self.data.parent()
            && !base.starts_with(std::env::temp_dir())
        {
            let _ = std::fs::remove_dir_all(base);
        }
    }
}

/// [`crate::local::spec`] with 512 MiB, whole GPUs (none: host resources only) and `env`.
fn spec(id: u64, gpus: Vec<u8>, cmd: &str, env: &[(&str, String)]) -> RunSpec {
    let slice = if gpus.is_empty() {
        SliceSpec::HostOnly
    } else {
        SliceSpec::Whole
    };
    RunSpec {
        memory_mib: 512,
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect::<BTreeMap<_, _>>(),
        ..crate::local::spec(id, gpus, slice, cmd)
    }
}

async fn exit_of(rx: &mut UnboundedReceiver<BackendEvent>, id: u64) -> Exit {
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Ok(Some(ev)) = tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), rx.recv()).await {
        if let BackendEvent::Exited { id: i, exit, .. } = ev
            && i == id
        {
            return exit;
        }
    }
    panic!("workload {id} did not exit");
}

async fn log_of(b: &LocalBackend, id: u64) -> String {
    let c = b.read_logs(id, 0, 4 << 20).await.unwrap();
    String::from_utf8_lossy(&c.bytes).into_owned()
}

async fn wait_log(b: &LocalBackend, id: u64, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = log_of(b, id).await;
        if log.contains(needle) {
            return log;
        }
        assert!(
            Instant::now() < deadline,
            "workload {id} never printed {needle:?}: {log}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_until(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn denials(log: &str) -> usize {
    log.matches("Permission denied").count() + log.matches("Operation not permitted").count()
}

/// Attack 1: `cat ../../admin-token`, the database, the server's environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_cannot_read_the_data_directory_or_the_servers_environment() {
    if !root() {
        return;
    }
    let env = Env::new("datadir");
    let b = env.backend();
    let mut rx = b.take_events().unwrap();
    std::fs::write(env.data.join("admin-token"), "tsk_admin_SECRET1\n").unwrap();
    std::fs::set_permissions(env.data.join("admin-token"), std::fs::Permissions::from_mode(0o600)).unwrap();
    // Even a file others could read is out of reach inside the data directory.
    std::fs::write(env.data.join("tessera.db"), "DB_SECRET2").unwrap();
    std::fs::set_permissions(env.data.join("tessera.db"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let cmd = r#"echo uid=$(id -u); cat $D/admin-token; cat ../../data/admin-token; cat $D/tessera.db; ls $D; cat /proc/$S/environ; cat /proc/$S/root/$D/admin-token; echo end"#;
    let vars = [
        ("D", env.data.display().to_string()),
        ("S", std::process::id().to_string()),
    ];
    b.start(&spec(1, vec![1], cmd, &vars)).await.unwrap();
    assert_eq!(exit_of(&mut rx, 1).await, Exit::Succeeded);
    let log = log_of(&b, 1).await;
    assert!(log.contains(&format!("uid={}", FIRST_UID + 1)), "{log}");
    assert!(!log.contains("SECRET"), "{log}");
    assert!(denials(&log) >= 6, "every read refused: {log}");
    assert!(log.contains("end"), "{log}");
    assert_eq!(std::fs::metadata(&env.data).unwrap().mode() & 0o777, 0o700);
    let own = std::fs::metadata(env.work.join("1")).unwrap();
    assert_eq!((own.uid(), own.mode() & 0o777), (FIRST_UID + 1, 0o700));
}

/// Attack 2: another tenant's files, environment and log; signals to it and to the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workloads_cannot_read_write_or_signal_each_other_or_the_server() {
    if !root() {
        return;
    }
    let env = Env::new("neighbours");
    let b = env.backend();
    let mut rx = b.take_events().unwrap();
    let a_cmd = "echo FILE_SECRET3 > secret; chmod 644 secret; echo ready; sleep 30";
    b.start(&spec(1, vec![0], a_cmd, &[("TOKEN", "ENV_SECRET4".into())]))
        .await
        .unwrap();
    wait_log(&b, 1, "ready").await;
    let victims = env.cg.members(1);
    assert!(!victims.is_empty());
    let pids = victims.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(" ");
    let b_cmd = r#"cat $A/secret; ls $A; echo x > $A/planted;
for p in $P; do cat /proc/$p/environ; kill -9 $p && echo killed-$p; done;
kill -TERM $S && echo killed-server;
echo FORGED >> $D/workloads/1/log; echo end"#;
    let vars = [
        ("A", env.work.join("1").display().to_string()),
        ("P", pids),
        ("S", std::process::id().to_string()),
        ("D", env.data.display().to_string()),
    ];
    b.start(&spec(2, vec![1], b_cmd, &vars)).await.unwrap();
    assert_eq!(exit_of(&mut rx, 2).await, Exit::Succeeded);
    let log = log_of(&b, 2).await;
    assert!(!log.contains("SECRET"), "{log}");
    assert!(!log.contains("killed-"), "{log}");
    assert!(denials(&log) >= 4 + victims.len() * 2, "{log}");
    assert!(log.contains("end"), "{log}");
    // The victim is untouched: all its processes still there, no planted file, no forged line.
    assert_eq!(env.cg.members(1), victims);
    assert!(!env.work.join("1/planted").exists());
    assert!(!log_of(&b, 1).await.contains("FORGED"));
    b.stop(1, Duration::from_millis(200)).await.unwrap();
    wait_until("workload 1 is gone", Duration::from_secs(5), || !env.cg.populated(1)).await;
}

/// Attack 3: the workload rewrites "its pid file" to name another process; after a restart the
/// server adopts the workload by its cgroup and stops only that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_process_record_is_neither_adopted_nor_signalled() {
    if !root() {
        return;
    }
    let env = Env::new("forge");
    let mut decoy = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let cmd = r#"echo "$X 0" > pid; echo "$X 0" > $D/workloads/5/pid; echo "$X 0" > $D/workloads/5/log.end; echo ready; sleep 30"#;
    let vars = [("X", decoy.id().to_string()), ("D", env.data.display().to_string())];
    let w = spec(5, vec![1], cmd, &vars);
    let record = env.data.join("workloads/5/pid");
    let before;
    {
        let first = env.backend();
        first.start(&w).await.unwrap();
        let log = wait_log(&first, 5, "ready").await;
        assert!(denials(&log) >= 2, "the server's records are out of reach: {log}");
        before = std::fs::read_to_string(&record).unwrap();
        assert!(!before.starts_with(&decoy.id().to_string()));
    }
    let second = env.backend();
    let r = second.reconcile(std::slice::from_ref(&w)).await.unwrap();
    assert!(matches!(r.observation(5), Some(Observation::Running { .. })), "{r:?}");
    assert_eq!(std::fs::read_to_string(&record).unwrap(), before);
    second.stop(5, Duration::from_millis(200)).await.unwrap();
    wait_until("workload 5 is gone", Duration::from_secs(5), || !env.cg.populated(5)).await;
    assert!(decoy.try_wait().unwrap().is_none(), "the decoy was signalled");
    decoy.kill().unwrap();
    let _ = decoy.wait();
}

fn child_of(log: &str) -> i32 {
    log.lines()
        .find_map(|l| l.strip_prefix("child="))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Attack 4: a `setsid` child left behind, at cancel and when the command ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_process_of_a_workload_survives_its_cancel_or_its_end() {
    if !root() {
        return;
    }
    let env = Env::new("escape");
    let b = env.backend();
    let mut rx = b.take_events().unwrap();
    let escape = "setsid sh -c 'trap \"\" TERM; echo child=$$; exec sleep 300' &";
    b.start(&spec(1, vec![1], &format!("{escape} sleep 300"), &[]))
        .await
        .unwrap();
    let child = child_of(&wait_log(&b, 1, "child=").await);
    assert!(start_ticks(child).is_some());
    b.stop(1, Duration::from_millis(300)).await.unwrap();
    wait_until("the setsid child is gone after cancel", Duration::from_secs(5), || {
        start_ticks(child).is_none()
    })
    .await;
    assert!(!env.cg.populated(1));
    b.start(&spec(2, vec![1], &format!("{escape} sleep 0.5; exit 0"), &[]))
        .await
        .unwrap();
    let child = child_of(&wait_log(&b, 2, "child=").await);
    assert_eq!(exit_of(&mut rx, 2).await, Exit::Succeeded);
    wait_until("the setsid child is gone after the end", Duration::from_secs(5), || {
        start_ticks(child).is_none()
    })
    .await;
    // The end of a lease takes the setsid child too.
    let mut leased = spec(3, vec![1], &format!("{escape} sleep 300"), &[]);
    leased.duration = Some(Duration::from_secs(1));
    b.start(&leased).await.unwrap();
    let child = child_of(&wait_log(&b, 3, "child=").await);
    match exit_of(&mut rx, 3).await {
        Exit::Failed { detail, .. } => assert_eq!(detail, "stopped at the end of its 1 s lease"),
        e => panic!("{e:?}"),
    }
    wait_until(
        "the setsid child is gone after the lease",
        Duration::from_secs(5),
        || start_ticks(child).is_none(),
    )
    .await;
    assert!(!env.cg.populated(3));
}

/// Attack 5: memory beyond the request is killed; forks beyond the pids limit fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_process_limits_hold() {
    if !root() {
        return;
    }
    let env = Env::new("limits");
    let b = env.backend();
    let mut rx = b.take_events().unwrap();
    let mut hog = spec(1, vec![], r#"awk 'BEGIN { s = "x"; while (1) s = s s }'"#, &[]);
    hog.memory_mib = 64;
    b.start(&hog).await.unwrap();
    match exit_of(&mut rx, 1).await {
        Exit::Failed { detail, .. } => assert!(detail.contains("killed by signal 9"), "{detail}"),
        e => panic!("the memory hog was not killed: {e:?}"),
    }
    let forks = "i=0; while [ $i -lt 100 ]; do sleep 30 & i=$((i+1)); done; echo all-forked";
    b.start(&spec(2, vec![], forks, &[])).await.unwrap();
    let exit = exit_of(&mut rx, 2).await;
    let log = log_of(&b, 2).await;
    assert!(
        log.contains("Cannot fork") && !log.contains("all-forked"),
        "{exit:?}: {log}"
    );
    wait_until("the sleeps are gone", Duration::from_secs(5), || !env.cg.populated(2)).await;
}

/// Attack 5: a busy loop on 0.2 CPU uses about 0.2 CPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_use_is_held_to_the_quota() {
    if !root() {
        return;
    }
    let env = Env::new("cpu");
    let b = env.backend();
    let mut w = spec(1, vec![], "while :; do :; done", &[]);
    w.cpu_milli = 200;
    b.start(&w).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let u0 = env.cg.cpu_usage(1).unwrap();
    let t = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let used = env.cg.cpu_usage(1).unwrap() - u0;
    let wall = t.elapsed();
    assert!(
        used <= wall.mul_f64(0.2 * 1.5),
        "{used:?} of CPU in {wall:?} on a 0.2 CPU quota"
    );
    assert!(used > Duration::ZERO);
    assert!(env.cg.throttled_periods(1).unwrap() > 0, "the quota never throttled it");
    b.stop(1, Duration::from_millis(100)).await.unwrap();
    wait_until("the loop is gone", Duration::from_secs(5), || !env.cg.populated(1)).await;
}

/// Unsetting CUDA_VISIBLE_DEVICES reaches no other GPU: the device cgroup lets a workload open
/// only its GPUs' nodes (and the control node); a CPU-only workload none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_opens_only_the_gpu_devices_it_was_given() {
    if !root() {
        return;
    }
    for sandbox in [false, true] {
        gpu_devices(sandbox).await;
    }
}

/// `NODE: output` lines of a workload given GPU 1 only: GPU 0 refused, GPU 1 and the control
/// node allowed (the open reaches the absent driver).
fn assert_only_gpu_1(log: &str) {
    let line = |n: &str| {
        log.lines()
            .find(|l| l.starts_with(&format!("{n}:")))
            .unwrap()
            .to_string()
    };
    assert!(line("nvidia0").contains("Operation not permitted"), "{log}");
    assert!(line("nvidia1").contains("No such device or address"), "{log}");
    assert!(line("nvidiactl").contains("No such device or address"), "{log}");
}

/// Where this host mounts a cgroup v2 hierarchy (`/sys/fs/cgroup` on a v2 host, often
/// `/sys/fs/cgroup/unified` beside v1 ones).
fn cgroup2_mount() -> Option<PathBuf> {
    std::fs::read_to_string("/proc/self/mounts")
        .ok()?
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.get(2) == Some(&"cgroup2"))
        .map(|f| PathBuf::from(f[1]))
}

/// cgroup v2 device rules: the BPF program compiled from a workload's `devices.allow` lines,
/// attached to a cgroup of this host's v2 hierarchy, holds a process in it to them. (The full
/// path through the backend is `a_workload_opens_only_the_gpu_devices_it_was_given`, on a
/// cgroup v2 host.)
#[test]
fn a_bpf_device_program_holds_a_cgroup_v2_to_its_rules() {
    if !root() {
        return;
    }
    let Some(v2) = cgroup2_mount() else {
        eprintln!("skipped: this host mounts no cgroup v2 hierarchy");
        return;
    };
    let env = Env::new("devbpf");
    let cg = v2.join(format!("tessera-test-devbpf-{}", std::process::id()));
    std::fs::create_dir_all(&cg).unwrap();
    let rules = tessera_backend_local::isolation::gpu_device_rules(&env.dev, &[1], false);
    tessera_backend_local::devfilter::attach(&cg, &rules).unwrap();
    let procs = CString::new(cg.join("cgroup.procs").as_os_str().as_bytes()).unwrap();
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(r#"for n in nvidia0 nvidia1 nvidiactl; do echo "$n: $(cat $V/$n 2>&1)"; done; echo "null: $(echo x > /dev/null && echo ok)"; mknod $V/made c 195 7 2>&1"#)
        .env("V", &env.dev);
    // SAFETY: only syscalls between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
            if fd < 0
                || libc::write(
                    fd,
                    b"0
"
                    .as_ptr()
                    .cast(),
                    2,
                ) != 2
            {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(fd);
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let _ = std::fs::remove_dir(&cg);
    let log = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_only_gpu_1(&log);
    assert!(log.contains("null: ok"), "{log}");
    assert!(
        log.contains("Operation not permitted") && !env.dev.join("made").exists(),
        "mknod refused: {log}"
    );
}

/// The device rules, with and without the sandbox (which must keep the device directory, here
/// a test's, in view).
async fn gpu_devices(sandbox: bool) {
    let env = Env::new(if sandbox { "devices-sbx" } else { "devices" });
    if !env.cg.devices_enforced() {
        eprintln!("skipped: device rules need the cgroup v1 devices controller (cgroup v2 needs BPF)");
        return;
    }
    let b = if sandbox { env.sandboxed() } else { env.backend() };
    let mut rx = b.take_events().unwrap();
    let cmd =
        r#"unset CUDA_VISIBLE_DEVICES; for n in nvidia0 nvidia1 nvidiactl; do echo "$n: $(cat $V/$n 2>&1)"; done"#;
    let vars = [("V", env.dev.display().to_string())];
    b.start(&spec(1, vec![1], cmd, &vars)).await.unwrap();
    assert_eq!(exit_of(&mut rx, 1).await, Exit::Succeeded);
    let log = log_of(&b, 1).await;
    assert_only_gpu_1(&log);
    b.start(&spec(2, vec![], cmd, &vars)).await.unwrap();
    assert_eq!(exit_of(&mut rx, 2).await, Exit::Succeeded);
    let log = log_of(&b, 2).await;
    assert_eq!(log.matches("Operation not permitted").count(), 3, "{log}");
}

/// Attack 5: a workload writing 5 MB into a log capped at 1 MiB; the log API still reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_is_capped_and_says_so() {
    if !root() {
        return;
    }
    let env = Env::new("logcap");
    let b = env.backend();
    let mut rx = b.take_events().unwrap();
    b.start(&spec(
        1,
        vec![],
        "echo first; head -c 5000000 /dev/zero | tr '\\0' x; echo; echo last",
        &[],
    ))
    .await
    .unwrap();
    assert_eq!(exit_of(&mut rx, 1).await, Exit::Succeeded);
    let note = tessera_backend_local::isolation::truncation_note(1 << 20);
    let len = std::fs::metadata(env.data.join("workloads/1/log")).unwrap().len();
    assert_eq!(len, (1 << 20) + note.len() as u64);
    let c = b.read_logs(1, 0, 8 << 20).await.unwrap();
    assert!(c.done);
    let text = String::from_utf8(c.bytes).unwrap();
    assert!(text.starts_with("first\nxxx"), "{}", &text[..20]);
    assert!(text.ends_with(&note) && !text.contains("last"));
    let tail = b.read_logs(1, len - 10, 100).await.unwrap();
    assert_eq!((tail.bytes.len(), tail.next_offset), (10, len));
    // The log is the server's: the workload never had it open for writing.
    let meta = std::fs::metadata(env.data.join("workloads/1/log")).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o600));
}

/// The sandbox: the machine's root is read-only, `/tmp` and `/dev/shm` are the workload's own,
/// the data directory is an empty cover, and the work directory shows only the workload's own
/// directory. Tenant A leaves files in its `/tmp` and `/dev/shm`; tenant B finds none of them,
/// nor A's directory, nor a world-readable file in the machine's `/tmp`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxed_workload_sees_a_read_only_root_and_only_its_own_files() {
    if !root() {
        return;
    }
    // Outside /tmp, so that the covers of the data and work directories are what hides them.
    let env = Env::under(Path::new("/run"), "sandbox");
    let b = env.sandboxed();
    let mut rx = b.take_events().unwrap();
    let n = format!("tessera-sbx-{}", std::process::id());
    let host_tmp = std::env::temp_dir().join(&n);
    std::fs::write(&host_tmp, "HOST_SECRET5").unwrap();
    std::fs::set_permissions(&host_tmp, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(env.data.join("admin-token"), "tsk_admin_SECRET1\n").unwrap();
    std::fs::set_permissions(env.data.join("admin-token"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let a_cmd = r#"cat /tmp/$N; echo TMP_SECRET6 > /tmp/$N; echo SHM_SECRET7 > /dev/shm/$N; chmod 644 /tmp/$N /dev/shm/$N;
echo "own=$(cat /tmp/$N)"; echo mine > mine; echo "file=$(cat $W/1/mine)";
for p in /etc/$N /usr/$N /$N $W/$N; do touch $p; done; touch $D/$N;
echo "work=$(ls $W | tr '\n' ' ')"; ls $D; cat $D/admin-token; echo ready; sleep 30"#;
    let vars = [
        ("N", n.clone()),
        ("W", env.work.display().to_string()),
        ("D", env.data.display().to_string()),
    ];
    b.start(&spec(1, vec![0], a_cmd, &vars)).await.unwrap();
    let log = wait_log(&b, 1, "ready").await;
    assert!(log.contains("own=TMP_SECRET6"), "its /tmp is its own to use: {log}");
    assert!(log.contains("file=mine"), "its directory is writable: {log}");
    assert_eq!(log.matches("Read-only file system").count(), 4, "{log}");
    assert!(log.contains("work=1 "), "only its own directory: {log}");
    assert!(!log.contains("SECRET5") && !log.contains("SECRET1"), "{log}");
    assert!(denials(&log) >= 3, "the data directory's cover is closed: {log}");
    assert_eq!(std::fs::read_to_string(env.work.join("1/mine")).unwrap(), "mine\n");
    for planted in [format!("/etc/{n}"), format!("/usr/{n}"), format!("/{n}")] {
        assert!(!Path::new(&planted).exists(), "{planted}");
    }
    assert!(!env.work.join(&n).exists() && !env.data.join(&n).exists());
    assert_eq!(std::fs::read_to_string(&host_tmp).unwrap(), "HOST_SECRET5");
    assert!(!Path::new("/dev/shm").join(&n).exists());

    // B also tries to lift the covers from a user namespace of its own, where it would hold
    // CAP_SYS_ADMIN (the kernel keeps inherited mounts locked together).
    let b_cmd = r#"cat /tmp/$N /dev/shm/$N $W/1/mine; echo "work=$(ls $W | tr '\n' ' ')";
echo "undo=$(unshare -Urm sh -c "$U -l $W; $U -l /tmp; ls $W; cat /tmp/$N" 2>&1 | tr '\n' ' ')";
echo "procs=$(ls /proc | grep -c '^[0-9]')"; for p in $S $A; do test -e /proc/$p && echo sees-$p; done; echo end"#;
    let a_pids = env.cg.members(1);
    assert!(!a_pids.is_empty());
    let mut b_vars = vars.to_vec();
    b_vars.push(("S", std::process::id().to_string()));
    // umount(2) itself (util-linux's umount first looks for the mount in /proc/self/mountinfo).
    let umount = if Path::new("/bin/busybox").is_file() {
        "/bin/busybox umount"
    } else {
        "umount"
    };
    b_vars.push(("U", umount.to_string()));
    b_vars.push(("A", a_pids.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(" ")));
    b.start(&spec(2, vec![1], b_cmd, &b_vars)).await.unwrap();
    assert_eq!(exit_of(&mut rx, 2).await, Exit::Succeeded);
    let log = log_of(&b, 2).await;
    assert!(!log.contains("SECRET"), "{log}");
    assert!(log.matches("No such file or directory").count() >= 3, "{log}");
    assert!(log.contains("work=2 ") && log.contains("end"), "{log}");
    // Its /proc shows its own processes only: not the server's, not A's.
    assert!(!log.contains("sees-"), "{log}");
    let procs: usize = log
        .lines()
        .find_map(|l| l.strip_prefix("procs="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap();
    // The wrapper, its shell, the command substitution, ls and grep: none of the machine's.
    assert!(procs <= 6, "{log}");
    let undo = log.lines().find_map(|l| l.strip_prefix("undo=")).unwrap();
    assert!(
        !undo.split_whitespace().any(|w| w == "1"),
        "A's directory revealed: {log}"
    );
    b.stop(1, Duration::from_millis(200)).await.unwrap();
    wait_until("workload 1 is gone", Duration::from_secs(5), || !env.cg.populated(1)).await;
    let _ = std::fs::remove_file(&host_tmp);
}

// ---- containers (`--local-images`) ------------------------------------------------------------

/// Debian's `busybox-static` and `runc` (scripts/test.sh installs both, for the kubelet tests).
fn container_tools() -> (PathBuf, PathBuf) {
    let busybox = PathBuf::from("/bin/busybox");
    let runc = tessera_backend_local::oci::find_runtime();
    match (busybox.is_file(), runc) {
        (true, Some(r)) => (busybox, r),
        _ => panic!(
            "the container tests need Debian's busybox-static and runc (scripts/test.sh installs them): apt-get install busybox-static runc"
        ),
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// A gzip tar layer from `(path, contents or symlink target, is_link)` entries.
fn layer(entries: &[(&str, Vec<u8>, bool)]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut t = tar::Builder::new(gz);
    for (path, data, link) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_uid(0);
        h.set_gid(0);
        if *link {
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            h.set_mode(0o777);
            t.append_link(&mut h, path, std::str::from_utf8(data).unwrap()).unwrap();
        } else if path.ends_with('/') {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_size(0);
            h.set_mode(0o755);
            t.append_data(&mut h, path, &[][..]).unwrap();
        } else {
            h.set_entry_type(tar::EntryType::Regular);
            h.set_size(data.len() as u64);
            h.set_mode(0o755);
            t.append_data(&mut h, path, &data[..]).unwrap();
        }
    }
    t.into_inner().unwrap().finish().unwrap()
}

/// An OCI image layout holding `busybox:test`: a base layer with busybox and `etc/secret`, and
/// a second layer that removes `etc/secret` (a whiteout) and adds `etc/added`; its config sets
/// an entrypoint, a command and an environment variable.
fn image_layout(dir: &Path, busybox: &Path) -> PathBuf {
    let layout = dir.join("images");
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| -> String {
        let hex = sha256_hex(bytes);
        std::fs::write(blobs.join(&hex), bytes).unwrap();
        format!("sha256:{hex}")
    };
    let mut base = vec![
        ("bin/", Vec::new(), false),
        ("etc/", Vec::new(), false),
        ("bin/busybox", std::fs::read(busybox).unwrap(), false),
        ("etc/secret", b"IMAGE_SECRET\n".to_vec(), false),
    ];
    for applet in [
        "sh", "cat", "ls", "id", "echo", "sleep", "kill", "touch", "hostname", "mknod", "wget", "head", "tr", "setsid",
        "ps", "wc", "grep",
    ] {
        base.push((
            Box::leak(format!("bin/{applet}").into_boxed_str()),
            b"busybox".to_vec(),
            true,
        ));
    }
    let l1 = layer(&base);
    let l2 = layer(&[
        ("etc/.wh.secret", Vec::new(), false),
        ("etc/added", b"from layer two\n".to_vec(), false),
    ]);
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/bin/sh", "-c"], "Cmd": ["echo default command; cat /etc/added"],
                   "Env": ["PATH=/bin", "FROM_IMAGE=yes"]},
        "rootfs": {"type": "layers", "diff_ids": []}
    });
    let config = serde_json::to_vec(&config).unwrap();
    let gz = "application/vnd.oci.image.layer.v1.tar+gzip";
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": put(&config), "size": config.len()},
        "layers": [
            {"mediaType": gz, "digest": put(&l1), "size": l1.len()},
            {"mediaType": gz, "digest": put(&l2), "size": l2.len()}
        ]
    });
    let manifest = serde_json::to_vec(&manifest).unwrap();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": put(&manifest),
                       "size": manifest.len(), "annotations": {"org.opencontainers.image.ref.name": "busybox:test"}}]
    });
    std::fs::write(layout.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    std::fs::write(layout.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    layout
}

impl Env {
    fn with_containers(&self, cdi: Vec<PathBuf>) -> LocalBackend {
        let (busybox, runtime) = container_tools();
        let images = image_layout(self.data.parent().unwrap(), &busybox);
        self.backend_with(LocalConfig {
            containers: Some(tessera_backend_local::ContainerConfig {
                images,
                runtime,
                network: tessera_backend_local::ContainerNetwork::Private,
                cdi_dirs: cdi,
            }),
            ..self.config()
        })
    }
}

fn image_spec(id: u64, gpus: Vec<u8>, cmd: Option<&str>) -> RunSpec {
    RunSpec {
        image: Some("busybox:test".into()),
        command: cmd.map(|c| vec!["sh".into(), "-c".into(), c.into()]),
        memory_mib: 64,
        ..spec(id, gpus, "", &[("TOKEN", "from-the-request".into())])
    }
}

/// A workload with an image runs as a container: layers and whiteouts applied, the image's
/// entrypoint, command and environment used unless the request gives a command, as the
/// workload's own user in pid, network, mount, UTS and IPC namespaces of its own, in its own
/// cgroup, with a read-only root, its own `/work`, and only its GPU's device node. Tenant A
/// attacks from inside: the server and tenant B's container are not visible, not signallable and
/// not reachable over the network, and the host's data directory is not there. An image not in
/// the store is refused with what the store holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_runs_as_its_user_in_namespaces_of_its_own_and_reaches_no_one() {
    if !root() {
        return;
    }
    let env = Env::new("oci");
    let b = env.with_containers(Vec::new());
    let mut rx = b.take_events().unwrap();
    // The image's own command and environment.
    b.start(&image_spec(1, vec![], None)).await.unwrap();
    assert_eq!(exit_of(&mut rx, 1).await, Exit::Succeeded);
    let log = log_of(&b, 1).await;
    assert!(
        log.contains("default command") && log.contains("from layer two"),
        "{log}"
    );
    assert!(!log.contains("level="), "no word from the runtime itself: {log}");
    // By digest, as an image policy rewrites a reference (`name@sha256:…`).
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(env.data.parent().unwrap().join("images/index.json")).unwrap()).unwrap();
    let mut by_digest = image_spec(5, vec![], Some("echo by-digest"));
    by_digest.image = Some(format!(
        "registry.example/busybox@{}",
        index["manifests"][0]["digest"].as_str().unwrap()
    ));
    b.start(&by_digest).await.unwrap();
    assert_eq!(exit_of(&mut rx, 5).await, Exit::Succeeded);
    assert!(log_of(&b, 5).await.contains("by-digest"));
    // Tenant B: a long-running container listening nowhere, whose pids A tries to find.
    b.start(&image_spec(2, vec![0], Some("echo b-ready; sleep 30")))
        .await
        .unwrap();
    wait_log(&b, 2, "b-ready").await;
    let b_pids = env.cg.members(2);
    assert!(b_pids.len() >= 2, "runtime and container in B's cgroup: {b_pids:?}");
    // A service on the host's loopback that A tries to reach.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let a_cmd = r#"echo uid=$(id -u) pid=$$ host=$(hostname) image=$FROM_IMAGE token=$TOKEN cuda=$CUDA_VISIBLE_DEVICES;
cat /etc/secret; echo procs=$(ls /proc | grep -c '^[0-9]');
for p in $B_PIDS $SERVER; do kill -9 $p && echo killed-$p; done;
ls $DATA; cat $DATA/admin-token;
touch /etc/x /bin/x; echo mine > /work/f && cat /work/f; echo tmp > /tmp/t && cat /tmp/t;
ls /dev | grep nvidia; cat /dev/nvidia1; cat /dev/nvidia0; mknod /dev/evil c 195 0 && echo made-node;
cat /proc/net/dev | grep -c ':'; echo ifaces;
echo hello | nc -w 2 127.0.0.1 $PORT && echo reached-host;
echo cgroup=$(grep -c "/w3/ctr$" /proc/self/cgroup);
echo end"#;
    let mut a = image_spec(3, vec![1], Some(a_cmd));
    a.env.insert(
        "B_PIDS".into(),
        b_pids.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(" "),
    );
    a.env.insert("SERVER".into(), std::process::id().to_string());
    a.env.insert("DATA".into(), env.data.display().to_string());
    a.env.insert("PORT".into(), port.to_string());
    std::fs::write(env.data.join("admin-token"), "tsk_admin_SECRET9\n").unwrap();
    b.start(&a).await.unwrap();
    let exit = exit_of(&mut rx, 3).await;
    let log = log_of(&b, 3).await;
    assert_eq!(exit, Exit::Succeeded, "{log}");
    let uid = FIRST_UID + 3;
    assert!(
        log.contains(&format!(
            "uid={uid} pid=1 host=tessera-w3 image=yes token=from-the-request cuda=GPU-"
        )),
        "{log}"
    );
    assert!(
        !log.contains("SECRET"),
        "the whiteout removed it, the data directory is not there: {log}"
    );
    let procs: usize = log
        .lines()
        .find_map(|l| l.strip_prefix("procs="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(99);
    assert!(procs <= 4, "only its own processes (sh, a subshell, ls, grep): {log}");
    assert!(!log.contains("killed-"), "{log}");
    assert_eq!(env.cg.members(2), b_pids, "B untouched");
    assert!(log.matches("Read-only file system").count() >= 2, "{log}");
    assert!(log.contains("mine\ntmp"), "{log}");
    assert!(log.contains("nvidia1") && log.contains("nvidiactl"), "{log}");
    assert!(!log.contains("nvidia0\n"), "GPU 0 is not in its /dev: {log}");
    assert!(
        log.contains("No such device or address"),
        "its GPU opens (no driver here): {log}"
    );
    assert!(!log.contains("made-node"), "{log}");
    assert!(log.contains("\n1\nifaces"), "only loopback: {log}");
    assert!(!log.contains("reached-host"), "{log}");
    assert!(listener.accept().is_err(), "the host's loopback was reached");
    assert!(log.contains("cgroup=1"), "in the workload's cgroup: {log}");
    assert!(log.contains("end"), "{log}");
    let own = std::fs::metadata(env.work.join("3/f")).unwrap();
    assert_eq!(own.uid(), uid, "its files are its user's");
    // Nothing of A's container is left: no process, no runtime record, no mount.
    wait_until("A's bundle is gone", Duration::from_secs(5), || {
        !env.data.join("workloads/3/bundle").exists()
    })
    .await;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains("workloads/3/bundle"), "{mounts}");
    // An image the store does not hold.
    let mut missing = image_spec(4, vec![], None);
    missing.image = Some("evil:latest".into());
    let e = b.start(&missing).await.unwrap_err().to_string();
    assert!(
        e.contains("not in this machine's image store") && e.contains("busybox:test"),
        "{e}"
    );
    b.stop(2, Duration::from_millis(200)).await.unwrap();
    wait_until("B is gone", Duration::from_secs(10), || !env.cg.populated(2)).await;
}

/// A container's cancel leaves nothing: a `setsid` child, the runtime and the container's init
/// all go with its cgroup; its memory limit holds (the process that exceeds it is killed); an
/// exit code comes back; after a restart the server adopts a live container by its cgroup and
/// stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_leaves_nothing_after_cancel_and_holds_its_limits() {
    if !root() {
        return;
    }
    let env = Env::new("ocistop");
    let b = env.with_containers(Vec::new());
    let mut rx = b.take_events().unwrap();
    b.start(&image_spec(
        1,
        vec![],
        Some("setsid sleep 1000 & echo started; sleep 1000"),
    ))
    .await
    .unwrap();
    wait_log(&b, 1, "started").await;
    wait_until("the child is there", Duration::from_secs(5), || {
        env.cg.members(1).len() >= 4
    })
    .await;
    b.stop(1, Duration::from_millis(300)).await.unwrap();
    wait_until("every process of 1 is gone", Duration::from_secs(10), || {
        !env.cg.populated(1)
    })
    .await;
    // Exit codes, and the memory limit (64 MiB; the shell tries to hold 200 MB).
    b.start(&image_spec(2, vec![], Some("exit 3"))).await.unwrap();
    assert!(matches!(
        exit_of(&mut rx, 2).await,
        Exit::Failed { exit_code: Some(3), .. }
    ));
    b.start(&image_spec(
        3,
        vec![],
        Some("x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo survived ${#x}"),
    ))
    .await
    .unwrap();
    let exit = exit_of(&mut rx, 3).await;
    let log = log_of(&b, 3).await;
    assert!(!log.contains("survived 200000000"), "{log}");
    assert!(matches!(exit, Exit::Failed { .. }), "{exit:?} {log}");
    // Adopted after a restart, then stopped.
    let w = image_spec(4, vec![], Some("echo up; sleep 1000"));
    b.start(&w).await.unwrap();
    wait_log(&b, 4, "up").await;
    drop(rx);
    drop(b);
    let second = env.with_containers(Vec::new());
    let r = second.reconcile(std::slice::from_ref(&w)).await.unwrap();
    assert!(matches!(r.observation(4), Some(Observation::Running { .. })), "{r:?}");
    second.stop(4, Duration::from_millis(300)).await.unwrap();
    wait_until("the adopted container is gone", Duration::from_secs(10), || {
        !env.cg.populated(4)
    })
    .await;
}

/// GPUs through the NVIDIA Container Toolkit's CDI spec: its device nodes, mounts and
/// environment reach the container (a spec written the way `nvidia-ctk cdi generate` writes it,
/// over the fake device nodes), and only for the GPU given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_gets_its_gpu_through_the_cdi_spec() {
    if !root() {
        return;
    }
    let env = Env::new("ocicdi");
    let cdi = env.data.parent().unwrap().join("cdi");
    std::fs::create_dir_all(&cdi).unwrap();
    let lib = env.data.parent().unwrap().join("libcuda.so.1");
    std::fs::write(&lib, "FAKE DRIVER LIBRARY\n").unwrap();
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o644)).unwrap();
    let d = env.dev.display();
    std::fs::write(
        cdi.join("nvidia.yaml"),
        format!(
            r#"cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
      hostPath: {d}/nvidia0
- name: "1"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia1
      hostPath: {d}/nvidia1
containerEdits:
  env:
  - NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu
  deviceNodes:
  - path: /dev/nvidiactl
    hostPath: {d}/nvidiactl
  mounts:
  - hostPath: {lib}
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.1
    options: [ro, nosuid, nodev, bind]
"#,
            lib = lib.display()
        ),
    )
    .unwrap();
    let b = env.with_containers(vec![cdi]);
    let mut rx = b.take_events().unwrap();
    let cmd = "ls /dev | grep nvidia; cat /usr/lib/x86_64-linux-gnu/libcuda.so.1; echo dir=$NVIDIA_CTK_LIBCUDA_DIR; cat /dev/nvidia1; echo x > /usr/lib/x86_64-linux-gnu/libcuda.so.1";
    b.start(&image_spec(1, vec![1], Some(cmd))).await.unwrap();
    let exit = exit_of(&mut rx, 1).await;
    let log = log_of(&b, 1).await;
    assert!(matches!(exit, Exit::Failed { .. }), "the last write fails: {log}");
    assert!(
        log.contains("nvidia1\nnvidiactl") || (log.contains("nvidia1") && log.contains("nvidiactl")),
        "{log}"
    );
    assert!(!log.contains("nvidia0"), "{log}");
    assert!(
        log.contains("FAKE DRIVER LIBRARY") && log.contains("dir=/usr/lib/x86_64-linux-gnu"),
        "{log}"
    );
    assert!(log.contains("No such device or address"), "{log}");
    assert!(
        log.contains("can't create /usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        "{log}"
    );
    assert_eq!(std::fs::read_to_string(&lib).unwrap(), "FAKE DRIVER LIBRARY\n");
}
