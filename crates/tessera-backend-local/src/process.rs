//! Workloads as local processes: each in its own process group and its own cgroup
//! ([`crate::cgroup`]), as its own user in its own directory ([`crate::isolation`]), output
//! relayed into a capped log the workload cannot open, and stop = SIGTERM to every process of
//! the cgroup, SIGKILL after the grace period. Where the host allows it, the workload also gets
//! a file-system view of its own ([`crate::sandbox`]). Without cgroups (development, or a machine
//! where Tessera may not create them) the process group stands in for the cgroup, and a pid file
//! with the process start time (in the server-only data directory) for adoption after a restart.
//!
//! Layout: `DATA_DIR/workloads/<id>/{log,log.end,pid}` (the server's, 0700) and
//! `WORK_DIR/<id>/` (the workload's, 0700, its working directory and `HOME`). A small `sh`
//! wrapper runs the command and writes its exit status to `WORK_DIR/<id>/.tessera-exit`, so a
//! workload that ends while the control plane is down still reports how it ended (the workload
//! may write that file itself: it only ever says how the workload itself ended).

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

pub use crate::cgroup::{Cgroups, Limits};
use crate::isolation::{RunAs, read_untrusted, spawn_log_relay, workload_dir};
use crate::sandbox::Sandbox;

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
    if pgid <= 1 {
        return false;
    }
    // SAFETY: kill with signal 0 only checks for existence.
    unsafe { libc::kill(-pgid, 0) == 0 }
}

/// Sends `sig` to the whole process group (refused for 0 and 1).
pub fn signal_group(pgid: i32, sig: i32) {
    // Never the caller's own group (0) or every process (-1, 1).
    if pgid <= 1 {
        return;
    }
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

/// What to launch.
#[derive(Clone, Debug)]
pub struct Launch {
    pub id: u64,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// `CUDA_VISIBLE_DEVICES`: GPU or MIG UUIDs, comma-separated.
    pub cuda_visible_devices: String,
    /// Its cgroup's limits (CPU, memory, pids, devices).
    pub limits: Limits,
    /// A workload with an image: the OCI runtime's command that runs its container
    /// ([`crate::oci`]), as root (the runtime drops to the workload's user inside the
    /// container) and without the sandbox (the container has a root of its own); `command`
    /// is then in the container's configuration.
    pub container: Option<Vec<String>>,
}

/// The files of a workload: the server's records in the data directory, and the workload's own
/// directory.
#[derive(Clone, Debug)]
pub struct Files {
    /// `DATA_DIR/workloads/ID`: the server's alone.
    pub dir: PathBuf,
    /// `WORK_DIR/ID`: the workload's.
    pub work: PathBuf,
}

impl Files {
    pub fn new(data_dir: &Path, work_dir: &Path, id: u64) -> Files {
        Files {
            dir: data_dir.join("workloads").join(id.to_string()),
            work: work_dir.join(id.to_string()),
        }
    }
    pub fn log(&self) -> PathBuf {
        self.dir.join("log")
    }
    /// Created by the log relay once the workload's output has all been written.
    pub fn log_end(&self) -> PathBuf {
        self.dir.join("log.end")
    }
    fn pid(&self) -> PathBuf {
        self.dir.join("pid")
    }
    fn exit(&self) -> PathBuf {
        self.work.join(".tessera-exit")
    }
    /// The exit status of a container's runtime, written by the server's wrapper into its own
    /// directory (the wrapper runs as root, so never into the workload's).
    fn container_exit(&self) -> PathBuf {
        self.dir.join("exit")
    }

    /// The process the server recorded when it started the workload.
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
        if let Ok(s) = fs::read_to_string(self.container_exit()) {
            return s.trim().parse().ok();
        }
        read_untrusted(&self.exit(), 32)?.trim().parse().ok()
    }

    /// Whether all of the workload's output is in its log.
    pub fn log_complete(&self) -> bool {
        self.log_end().exists()
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

/// Where and as whom workloads run.
#[derive(Clone, Copy, Debug)]
pub struct Place<'a> {
    pub data_dir: &'a Path,
    pub work_dir: &'a Path,
    pub cgroups: &'a Cgroups,
    pub run_as: RunAs,
    /// Most bytes of output kept in a workload's log.
    pub log_cap: u64,
    /// Each workload in a mount namespace of its own ([`crate::sandbox`]), seeing this
    /// device directory; `None`: the machine's file system.
    pub sandbox: Option<&'a Path>,
}

/// Starts the workload: `sh` wrapper in a new process group, in its cgroup and as its user
/// before the command runs, in its own directory, output relayed into the capped log. Returns
/// the child and its identity (also recorded in the server's pid file).
pub fn spawn(place: Place<'_>, l: &Launch) -> io::Result<(tokio::process::Child, ProcId)> {
    // The wrapper runs in the workload's directory: a relative data or work directory (the
    // server's default is relative) would put its exit file somewhere else, and an exit seen
    // only through that file (the server was down) would be lost.
    let (data_dir, work_dir) = (
        std::path::absolute(place.data_dir)?,
        std::path::absolute(place.work_dir)?,
    );
    let place = Place {
        data_dir: &data_dir,
        work_dir: &work_dir,
        ..place
    };
    let files = Files::new(place.data_dir, place.work_dir, l.id);
    fs::create_dir_all(&files.dir)?;
    fs::set_permissions(&files.dir, fs::Permissions::from_mode(0o700))?;
    let work = workload_dir(place.work_dir, l.id, place.run_as)?;
    let _ = fs::remove_file(files.exit());
    let _ = fs::remove_file(files.container_exit());
    let procs = match &l.container {
        Some(_) => place.cgroups.prepare_container(l.id, l.limits.devices.clone())?,
        None => place.cgroups.prepare(l.id, &l.limits)?,
    };
    let out = spawn_log_relay(&files.log(), &files.log_end(), place.log_cap)?;
    let err = out.try_clone()?;
    // A container's runtime runs as root, outside the sandbox, and records its exit in the
    // server's directory; the workload's user and view are set inside the container.
    let container = l.container.is_some();
    let ids = if container { None } else { place.run_as.ids(l.id) };
    let sandbox = place
        .sandbox
        .filter(|_| !container)
        .map(|dev| Sandbox::new(place.data_dir, place.work_dir, &work, dev, l.limits.memory_mib))
        .transpose()?;
    let mut cmd = tokio::process::Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(r#""$@"; s=$?; echo $s > "$0"; exit $s"#)
        .arg(if container {
            files.container_exit()
        } else {
            files.exit()
        })
        .args(l.container.as_ref().unwrap_or(&l.command))
        .env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into()),
        );
    if !container {
        cmd.env("HOME", &work)
            .envs(&l.env)
            .env("CUDA_VISIBLE_DEVICES", &l.cuda_visible_devices)
            .env("TESSERA_WORKLOAD_ID", l.id.to_string());
    }
    cmd.current_dir(&work)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .process_group(0);
    let procs: Vec<CString> = procs
        .iter()
        .map(|p| CString::new(p.as_os_str().as_bytes()).map_err(io::Error::other))
        .collect::<io::Result<_>>()?;
    // SAFETY: only async-signal-safe syscalls between fork and exec, on data built before.
    unsafe {
        cmd.pre_exec(move || {
            // Into its cgroup while still root (cgroup.procs is root's), then never out again.
            for path in &procs {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let ok = libc::write(fd, b"0\n".as_ptr().cast(), 2) == 2;
                let e = io::Error::last_os_error();
                libc::close(fd);
                if !ok {
                    return Err(e);
                }
            }
            // Its own view of the file system, while still root.
            if let Some(s) = &sandbox {
                s.enter()?;
            }
            // (The runtime sets it for the container's own process.)
            if !container && libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // A container's runtime makes mount points in the image's overlay, which its user
            // must be able to traverse (the container's own umask is in its configuration).
            libc::umask(if container { 0o022 } else { 0o077 });
            if let Some((uid, gid)) = ids {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setresgid(gid, gid, gid) != 0
                    || libc::setresuid(uid, uid, uid) != 0
                {
                    return Err(io::Error::last_os_error());
                }
                // Refuse to go on if privileges could be regained.
                if libc::setuid(0) == 0 {
                    return Err(io::Error::other("uid 0 regained after setuid"));
                }
            }
            Ok(())
        });
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
}
