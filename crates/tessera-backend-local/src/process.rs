//! Workloads as local processes: each in its own process group (and its own cgroup v2 with CPU
//! and memory limits where this machine lets Tessera create cgroups), output captured to a log
//! file, a pid file with the process start time so a restarted control plane adopts live
//! processes and never mistakes a reused pid for one of its own, and stop = SIGTERM to the group,
//! SIGKILL after the grace period.
//!
//! Layout under the data directory: `workloads/<id>/{log,pid,exit}`. A small `sh` wrapper runs
//! the command and writes its exit status to `exit`, so a workload that ends while the control
//! plane is down still reports how it ended.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The pid and kernel start time (clock ticks since boot, `/proc/PID/stat` field 22) of a
/// workload's process-group leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcId {
    pub pid: i32,
    pub start_ticks: u64,
}

/// Start time of `pid`, `None` when it does not exist or is a zombie.
pub fn start_ticks(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state); start time is field 22.
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

impl ProcId {
    /// The same process is still there (not a new one that reused the pid).
    pub fn alive(&self) -> bool {
        start_ticks(self.pid) == Some(self.start_ticks)
    }
}

/// Whether any process of the group led by `pgid` is left.
pub fn group_alive(pgid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence.
    unsafe { libc::kill(-pgid, 0) == 0 }
}

/// Sends `sig` to the whole process group.
pub fn signal_group(pgid: i32, sig: i32) {
    // SAFETY: plain syscall; ESRCH (already gone) is fine.
    unsafe {
        libc::kill(-pgid, sig);
    }
}

/// SIGTERM to the group, then SIGKILL once `grace` has passed with any process left. Returns
/// whether SIGKILL was needed.
pub async fn terminate(pgid: i32, grace: Duration) -> bool {
    signal_group(pgid, libc::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !group_alive(pgid) {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    if !group_alive(pgid) {
        return false;
    }
    signal_group(pgid, libc::SIGKILL);
    true
}

/// Cgroup v2 placement for workloads, or why there is none.
#[derive(Clone, Debug)]
pub struct Cgroups {
    base: Option<PathBuf>,
    /// Why limits are off (empty when on).
    pub skipped: String,
}

impl Cgroups {
    /// Uses `ROOT/tessera` (normally `/sys/fs/cgroup/tessera`) when `ROOT` is a cgroup v2
    /// hierarchy in which Tessera may create cgroups and enable the cpu and memory controllers.
    pub fn detect(root: &Path) -> Cgroups {
        let off = |why: String| Cgroups {
            base: None,
            skipped: why,
        };
        if !root.join("cgroup.controllers").exists() {
            return off(format!("{} is not a cgroup v2 hierarchy", root.display()));
        }
        let base = root.join("tessera");
        if let Err(e) = fs::create_dir_all(&base) {
            return off(format!("cannot create {}: {e}", base.display()));
        }
        for dir in [root, base.as_path()] {
            if let Err(e) = fs::write(dir.join("cgroup.subtree_control"), "+cpu +memory") {
                return off(format!(
                    "cannot enable the cpu and memory controllers in {}: {e}",
                    dir.display()
                ));
            }
        }
        Cgroups {
            base: Some(base),
            skipped: String::new(),
        }
    }

    /// No cgroups (tests, or when asked).
    pub fn off(why: &str) -> Cgroups {
        Cgroups {
            base: None,
            skipped: why.into(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.base.is_some()
    }

    /// Creates the workload's cgroup with its limits and returns its `cgroup.procs` path.
    fn prepare(&self, id: u64, cpu_milli: u64, memory_mib: u64) -> io::Result<Option<PathBuf>> {
        let Some(base) = &self.base else { return Ok(None) };
        let dir = base.join(format!("w{id}"));
        fs::create_dir_all(&dir)?;
        if cpu_milli > 0 {
            // cpu.max: quota and period in µs; 1000 milli-CPUs = one CPU = 100000/100000.
            fs::write(dir.join("cpu.max"), format!("{} 100000", cpu_milli * 100))?;
        }
        if memory_mib > 0 {
            fs::write(dir.join("memory.max"), (memory_mib * 1024 * 1024).to_string())?;
        }
        Ok(Some(dir.join("cgroup.procs")))
    }

    /// Removes the (empty) cgroup of a workload that ended.
    pub fn remove(&self, id: u64) {
        if let Some(base) = &self.base {
            let _ = fs::remove_dir(base.join(format!("w{id}")));
        }
    }
}

/// What to launch.
#[derive(Clone, Debug)]
pub struct Launch {
    pub id: u64,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// `CUDA_VISIBLE_DEVICES`: GPU or MIG UUIDs, comma-separated.
    pub cuda_visible_devices: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
}

/// The files of a workload.
#[derive(Clone, Debug)]
pub struct Files {
    pub dir: PathBuf,
}

impl Files {
    pub fn new(data_dir: &Path, id: u64) -> Files {
        Files {
            dir: data_dir.join("workloads").join(id.to_string()),
        }
    }
    pub fn log(&self) -> PathBuf {
        self.dir.join("log")
    }
    fn pid(&self) -> PathBuf {
        self.dir.join("pid")
    }
    fn exit(&self) -> PathBuf {
        self.dir.join("exit")
    }

    /// The process recorded in the pid file.
    pub fn read_pid(&self) -> Option<ProcId> {
        let text = fs::read_to_string(self.pid()).ok()?;
        let mut it = text.split_whitespace();
        Some(ProcId {
            pid: it.next()?.parse().ok()?,
            start_ticks: it.next()?.parse().ok()?,
        })
    }

    /// The exit status the wrapper recorded, if the command ended.
    pub fn read_exit(&self) -> Option<i32> {
        fs::read_to_string(self.exit()).ok()?.trim().parse().ok()
    }

    /// Workload IDs with a directory under `data_dir`.
    pub fn all(data_dir: &Path) -> Vec<u64> {
        let mut ids: Vec<u64> = fs::read_dir(data_dir.join("workloads"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        ids.sort_unstable();
        ids
    }
}

/// Starts the workload: `sh` wrapper in a new process group, joined to its cgroup before the
/// command runs, output appended to the log. Returns the child and its identity (also written to
/// the pid file).
pub fn spawn(data_dir: &Path, cgroups: &Cgroups, l: &Launch) -> io::Result<(tokio::process::Child, ProcId)> {
    // The wrapper runs in the workload's directory: a relative data directory would put its
    // exit file somewhere else, and an exit seen only through that file (the server was down)
    // would be lost.
    let data_dir = std::path::absolute(data_dir)?;
    let files = Files::new(&data_dir, l.id);
    fs::create_dir_all(&files.dir)?;
    let _ = fs::remove_file(files.exit());
    let log = OpenOptions::new().create(true).append(true).open(files.log())?;
    let procs = cgroups.prepare(l.id, l.cpu_milli, l.memory_mib)?;
    let mut cmd = tokio::process::Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(r#""$@"; s=$?; echo $s > "$0"; exit $s"#)
        .arg(files.exit())
        .args(&l.command)
        .env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into()),
        )
        .envs(&l.env)
        .env("CUDA_VISIBLE_DEVICES", &l.cuda_visible_devices)
        .env("TESSERA_WORKLOAD_ID", l.id.to_string())
        .current_dir(&files.dir)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log))
        .process_group(0);
    if let Some(procs) = procs {
        let path = CString::new(procs.as_os_str().as_bytes()).map_err(io::Error::other)?;
        // SAFETY: only async-signal-safe syscalls between fork and exec, on a path built before.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let ok = libc::write(fd, b"0\n".as_ptr().cast(), 2) == 2;
                libc::close(fd);
                if ok { Ok(()) } else { Err(io::Error::last_os_error()) }
            });
        }
    }
    let child = cmd.spawn()?;
    let pid = child
        .id()
        .ok_or_else(|| io::Error::other("child exited before it was seen"))? as i32;
    // The start time is there as soon as the process exists; a process that exited in between
    // is a zombie until reaped, and then the exit file says how it ended.
    let start_ticks = start_ticks(pid).unwrap_or(0);
    let id = ProcId { pid, start_ticks };
    fs::write(files.pid(), format!("{pid} {start_ticks}\n"))?;
    Ok((child, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_process_has_a_start_time_and_pid_reuse_is_caught() {
        let me = std::process::id() as i32;
        let t = start_ticks(me).expect("own start time");
        assert!(
            ProcId {
                pid: me,
                start_ticks: t
            }
            .alive()
        );
        assert!(
            !ProcId {
                pid: me,
                start_ticks: t + 1
            }
            .alive(),
            "another start time: another process"
        );
        assert_eq!(start_ticks(i32::MAX), None);
    }

    /// With a relative data directory (the server's default, `./tessera-data`), the wrapper,
    /// which runs in the workload's own directory, still writes the exit file where the server
    /// reads it: an exit seen only through that file (the server was down) is not lost.
    #[tokio::test]
    async fn a_relative_data_dir_still_gets_its_exit_files() {
        let rel = PathBuf::from(format!("tessera-relative-{}", std::process::id()));
        assert!(rel.is_relative());
        let nocg = std::env::temp_dir().join(format!("tessera-nocg-rel-{}", std::process::id()));
        fs::create_dir_all(&nocg).unwrap();
        let cgroups = Cgroups::detect(&nocg);
        for (id, cmd, code) in [(7, "true", 0), (8, "false", 1)] {
            let launch = Launch {
                id,
                command: vec![cmd.into()],
                env: BTreeMap::new(),
                cuda_visible_devices: String::new(),
                cpu_milli: 1000,
                memory_mib: 64,
            };
            let (mut child, _) = spawn(&rel, &cgroups, &launch).unwrap();
            child.wait().await.unwrap();
            assert_eq!(Files::new(&rel, id).read_exit(), Some(code), "{cmd}");
        }
        fs::remove_dir_all(&rel).unwrap();
        fs::remove_dir_all(&nocg).unwrap();
    }

    #[test]
    fn cgroups_are_skipped_with_a_reason_outside_cgroup_v2() {
        let dir = std::env::temp_dir().join(format!("tessera-nocg-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let c = Cgroups::detect(&dir);
        assert!(!c.enabled());
        assert!(c.skipped.contains("not a cgroup v2 hierarchy"), "{}", c.skipped);
        fs::remove_dir_all(&dir).unwrap();
    }
}
