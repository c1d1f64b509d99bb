//! What keeps a local workload away from the server and from other workloads, besides its
//! cgroup ([`crate::cgroup`]):
//!
//! * [`RunAs`]: each workload runs as its own unprivileged uid and gid (`first + ID % count` of
//!   a configured range), with no supplementary groups and `no_new_privs`; running workloads as
//!   the server's own user is a development mode the operator asks for.
//! * [`secure_dirs`]: the data directory (database, admin token, the server's records and logs
//!   of every workload) is the server's alone (0700); each workload works in `WORK_DIR/ID`, owned
//!   by its uid, mode 0700, under a `WORK_DIR` others may traverse but not list (0711).
//! * [`spawn_log_relay`]: a workload's stdout and stderr go into a pipe; a small relay process
//!   of the server's (forked, outside the workload's cgroup, surviving a server restart) appends
//!   them to the log in the data directory, up to a cap, and notes the truncation there. The
//!   workload never holds the log file itself.
//! * [`gpu_device_rules`]: the `devices.allow` lines of a workload: the usual harmless devices,
//!   and of the `/dev/nvidia*` nodes only the control nodes and the GPUs it was given.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Which user a workload runs as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunAs {
    /// Workload `ID` as uid and gid `first + ID % count`.
    Range { first: u32, count: u32 },
    /// The server's own user: no boundary between workloads, nor between a workload and the
    /// server's data (development only).
    Server,
}

/// The default `--local-uid-range`.
pub const DEFAULT_UID_RANGE: &str = "200000-299999";

impl RunAs {
    /// `FIRST-LAST`, inclusive; root (0) and the server's own uid are refused.
    pub fn parse_range(s: &str) -> Result<RunAs, String> {
        let bad = || format!("give the uid range as FIRST-LAST (e.g. {DEFAULT_UID_RANGE}), not {s:?}");
        let (a, b) = s.split_once('-').ok_or_else(bad)?;
        let first: u32 = a.trim().parse().map_err(|_| bad())?;
        let last: u32 = b.trim().parse().map_err(|_| bad())?;
        if last < first {
            return Err(bad());
        }
        // SAFETY: plain syscall.
        let me = unsafe { libc::geteuid() };
        if first == 0 || (first..=last).contains(&me) {
            return Err(format!(
                "the uid range {first}-{last} holds root or this server's own uid ({me}): workloads would run as a privileged user"
            ));
        }
        if last == u32::MAX {
            return Err(format!("the uid range {s} reaches uid {} (nobody's -1)", u32::MAX));
        }
        Ok(RunAs::Range {
            first,
            count: last - first + 1,
        })
    }

    /// The uid and gid of workload `id` (`None`: the server's own).
    pub fn ids(&self, id: u64) -> Option<(u32, u32)> {
        match *self {
            RunAs::Range { first, count } => {
                let uid = first + (id % count as u64) as u32;
                Some((uid, uid))
            }
            RunAs::Server => None,
        }
    }
}

fn with_path(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// Makes the data directory and its `workloads` directory the server's alone (0700), and
/// `work_dir` traversable but not listable (0711, created if missing). With other users running
/// workloads, every directory above `work_dir` must be traversable by them.
pub fn secure_dirs(data_dir: &Path, work_dir: &Path, run_as: RunAs) -> Result<(), String> {
    for d in [data_dir.to_path_buf(), data_dir.join("workloads")] {
        fs::create_dir_all(&d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
        fs::set_permissions(&d, fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("cannot make {} the server's alone: {e}", d.display()))?;
    }
    fs::create_dir_all(work_dir).map_err(|e| format!("cannot create {}: {e}", work_dir.display()))?;
    let work = fs::canonicalize(work_dir).map_err(|e| format!("{}: {e}", work_dir.display()))?;
    let data = fs::canonicalize(data_dir).map_err(|e| format!("{}: {e}", data_dir.display()))?;
    if work.starts_with(&data) {
        return Err(format!(
            "the work directory {} is inside the data directory {}, which only the server may enter",
            work.display(),
            data.display()
        ));
    }
    fs::set_permissions(&work, fs::Permissions::from_mode(0o711))
        .map_err(|e| format!("cannot set the mode of {}: {e}", work.display()))?;
    if run_as != RunAs::Server {
        for a in work.ancestors().skip(1) {
            let mode = fs::metadata(a).map(|m| m.mode()).unwrap_or(0);
            if mode & 0o001 == 0 {
                return Err(format!(
                    "workloads run as other users cannot reach the work directory {}: {} is not traversable by others (mode {:o}); choose another --local-work-dir",
                    work.display(),
                    a.display(),
                    mode & 0o777
                ));
            }
        }
    }
    Ok(())
}

/// Creates workload `id`'s private directory `work_dir/ID`, owned by its user, mode 0700.
pub fn workload_dir(work_dir: &Path, id: u64, run_as: RunAs) -> io::Result<PathBuf> {
    let dir = work_dir.join(id.to_string());
    match fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(with_path(&dir, e)),
    }
    // The directory may be a leftover of a workload with the same ID: never follow a link.
    let meta = fs::symlink_metadata(&dir).map_err(|e| with_path(&dir, e))?;
    if !meta.is_dir() {
        return Err(io::Error::other(format!("{} is not a directory", dir.display())));
    }
    if let Some((uid, gid)) = run_as.ids(id) {
        std::os::unix::fs::lchown(&dir, Some(uid), Some(gid)).map_err(|e| with_path(&dir, e))?;
    }
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).map_err(|e| with_path(&dir, e))?;
    Ok(dir)
}

/// Reads a small file a workload may control (its exit file) without following a link or
/// blocking on a FIFO: `None` unless it is a regular file.
pub fn read_untrusted(path: &Path, max: usize) -> Option<String> {
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut buf = Vec::new();
    io::Read::read_to_end(&mut io::Read::take(f, max as u64), &mut buf).ok()?;
    String::from_utf8(buf).ok()
}

/// The note a capped log ends with.
pub fn truncation_note(cap: u64) -> String {
    format!("\n[tessera: this log reached its cap of {cap} bytes; later output was discarded]\n")
}

/// Starts the relay of one workload's output: returns the write end of a pipe (the workload's
/// stdout and stderr) whose bytes a forked process appends to `log` (0600, the server's), up to
/// `cap` bytes in all, then the truncation note; when every writer has closed the pipe it creates
/// `end_marker`. The relay is the server's user, in a session of its own, outside the
/// workload's cgroup, and keeps running across a server restart.
pub fn spawn_log_relay(log: &Path, end_marker: &Path, cap: u64) -> io::Result<OwnedFd> {
    let _ = fs::remove_file(end_marker);
    let logf = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(log)
        .map_err(|e| with_path(log, e))?;
    let already = logf.metadata()?.len();
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 fills two fds.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh fds from pipe2, owned here.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // Everything the relay needs is prepared before fork: after it, only syscalls.
    let note = truncation_note(cap).into_bytes();
    let marker = CString::new(end_marker.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let mut buf = vec![0u8; 64 * 1024];
    let (rfd, lfd) = (rd.as_raw_fd(), logf.as_raw_fd());
    // SAFETY: the child and grandchild run only async-signal-safe syscalls on memory prepared
    // above, and end with _exit.
    unsafe {
        let pid = libc::fork();
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            libc::setsid();
            if libc::fork() != 0 {
                libc::_exit(0);
            }
            relay(rfd, lfd, already, cap, &note, &marker, &mut buf);
        }
        let mut status = 0;
        libc::waitpid(pid, &mut status, 0);
    }
    drop(rd);
    drop(logf);
    Ok(wr)
}

/// The relay loop (in the forked grandchild).
unsafe fn relay(rfd: i32, lfd: i32, already: u64, cap: u64, note: &[u8], marker: &CString, buf: &mut [u8]) -> ! {
    // SAFETY (whole body): raw syscalls only.
    unsafe {
        libc::dup2(rfd, 0);
        libc::dup2(lfd, 1);
        // Close everything else the server had open (its sockets, its database, other pipes).
        if libc::syscall(libc::SYS_close_range, 2u32, u32::MAX, 0u32) != 0 {
            for fd in 2..65536 {
                libc::close(fd);
            }
        }
        let write_all = |mut p: *const u8, mut n: usize| {
            while n > 0 {
                let w = libc::write(1, p.cast(), n);
                if w < 0 {
                    if *libc::__errno_location() == libc::EINTR {
                        continue;
                    }
                    return;
                }
                p = p.add(w as usize);
                n -= w as usize;
            }
        };
        let mut written = already;
        let mut noted = already >= cap;
        loop {
            let n = libc::read(0, buf.as_mut_ptr().cast(), buf.len());
            if n < 0 {
                if *libc::__errno_location() == libc::EINTR {
                    continue;
                }
                break;
            }
            if n == 0 {
                break;
            }
            let n = n as u64;
            let take = n.min(cap.saturating_sub(written));
            write_all(buf.as_ptr(), take as usize);
            written += take;
            if take < n && !noted {
                write_all(note.as_ptr(), note.len());
                noted = true;
            }
        }
        let fd = libc::open(
            marker.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
            0o600,
        );
        if fd >= 0 {
            libc::close(fd);
        }
        libc::_exit(0)
    }
}

pub(crate) fn char_dev(path: &Path) -> Option<(u32, u32)> {
    use std::os::unix::fs::FileTypeExt;
    let m = fs::metadata(path).ok()?;
    if !m.file_type().is_char_device() {
        return None;
    }
    let rdev = m.rdev();
    Some((libc::major(rdev), libc::minor(rdev)))
}

/// The `devices.allow` lines of a workload given `gpus` (NVML indices, `/dev/nvidiaN`) with the
/// device nodes in `dev_dir`: /dev/null, zero, full, random, urandom, tty, ptmx and ptys; with
/// any GPU the control nodes (`nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`, `nvidia-modeset`)
/// and, with `mig`, every `nvidia-caps` node; and the GPUs' own nodes. Any other
/// `/dev/nvidiaN` is denied.
pub fn gpu_device_rules(dev_dir: &Path, gpus: &[u32], mig: bool) -> Vec<String> {
    let mut rules: Vec<String> = [
        "c 1:3 rwm",
        "c 1:5 rwm",
        "c 1:7 rwm",
        "c 1:8 rwm",
        "c 1:9 rwm",
        "c 5:0 rwm",
        "c 5:2 rwm",
        "c 136:* rwm",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    rules.extend(
        gpu_device_nodes(dev_dir, gpus, mig)
            .iter()
            .map(|(_, maj, min)| format!("c {maj}:{min} rwm")),
    );
    rules
}

/// The NVIDIA device nodes in `dev_dir` a workload given `gpus` may open, with their major and
/// minor numbers: none without a GPU; else the control nodes, with `mig` every `nvidia-caps`
/// node, and the GPUs' own nodes (those that exist).
pub fn gpu_device_nodes(dev_dir: &Path, gpus: &[u32], mig: bool) -> Vec<(PathBuf, u32, u32)> {
    if gpus.is_empty() {
        return Vec::new();
    }
    let mut nodes: Vec<PathBuf> = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"]
        .iter()
        .map(|n| dev_dir.join(n))
        .collect();
    nodes.extend(gpus.iter().map(|g| dev_dir.join(format!("nvidia{g}"))));
    if mig {
        let mut caps: Vec<PathBuf> = fs::read_dir(dev_dir.join("nvidia-caps"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect();
        caps.sort();
        nodes.extend(caps);
    }
    nodes
        .into_iter()
        .filter_map(|p| {
            let (maj, min) = char_dev(&p)?;
            Some((p, maj, min))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uid_ranges_parse_and_refuse_root() {
        assert_eq!(
            RunAs::parse_range("200000-299999"),
            Ok(RunAs::Range {
                first: 200000,
                count: 100000
            })
        );
        let r = RunAs::parse_range("200000-200009").unwrap();
        assert_eq!(r.ids(3), Some((200003, 200003)));
        assert_eq!(r.ids(13), Some((200003, 200003)), "wraps around the range");
        assert!(RunAs::parse_range("0-10").unwrap_err().contains("root"));
        assert!(RunAs::parse_range("10-5").unwrap_err().contains("FIRST-LAST"));
        assert!(RunAs::parse_range("abc").unwrap_err().contains("FIRST-LAST"));
        assert_eq!(RunAs::Server.ids(3), None);
    }

    #[test]
    fn the_work_directory_may_not_be_inside_the_data_directory() {
        let base = std::env::temp_dir().join(format!("tessera-iso-{}", std::process::id()));
        let data = base.join("data");
        let e = secure_dirs(&data, &data.join("work"), RunAs::Server).unwrap_err();
        assert!(e.contains("inside the data directory"), "{e}");
        secure_dirs(&data, &base.join("work"), RunAs::Server).unwrap();
        assert_eq!(fs::metadata(&data).unwrap().mode() & 0o777, 0o700);
        assert_eq!(fs::metadata(base.join("work")).unwrap().mode() & 0o777, 0o711);
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn untrusted_files_are_read_only_when_regular() {
        let base = std::env::temp_dir().join(format!("tessera-untrusted-{}", std::process::id()));
        fs::create_dir_all(&base).unwrap();
        fs::write(base.join("exit"), "3\n").unwrap();
        assert_eq!(read_untrusted(&base.join("exit"), 32).as_deref(), Some("3\n"));
        std::os::unix::fs::symlink(base.join("exit"), base.join("link")).unwrap();
        assert_eq!(read_untrusted(&base.join("link"), 32), None, "a link is not followed");
        let fifo = CString::new(base.join("fifo").as_os_str().as_bytes()).unwrap();
        // SAFETY: plain syscall on a path in a fresh directory.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert_eq!(read_untrusted(&base.join("fifo"), 32), None, "a FIFO does not block");
        fs::remove_dir_all(&base).unwrap();
    }
}
