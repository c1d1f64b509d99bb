//! The file-system view of a local workload: a mount namespace of its own in which the
//! machine's root is read-only, `/tmp`, `/var/tmp` and `/dev/shm` are private and empty, the data
//! directory is an empty, read-only cover, and the work directory (a read-only cover) shows only
//! the workload's own directory (writable, `nosuid`, `nodev`). Entered between fork and exec
//! ([`Sandbox::enter`]), while the child is still root, before it drops to the workload's user.
//!
//! Built on the mount API of Linux 5.12 and later (`open_tree`, `move_mount`, `mount_setattr`
//! with `AT_RECURSIVE`): the workload's directory and the device directory are cloned before
//! anything is covered, then the whole tree is made read-only in one call, and the clones are
//! moved into the covers. [`probe`] runs the same steps once at start-up in a throwaway child,
//! so that a host that does not allow them (no `CAP_SYS_ADMIN`, an older kernel, a seccomp
//! filter) is known and reported then, not at the first workload.
//!
//! `/proc` is a procfs instance of its own with `hidepid=invisible`: a workload sees its own
//! processes only (each workload runs as its own user).
//!
//! What it does not do: a network namespace (workloads share the machine's network) or a pid
//! namespace (pids are the machine's; a container, [`crate::oci`], has both).

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

/// Whether workloads get their own view (`--local-sandbox`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SandboxMode {
    /// When the host allows it ([`probe`]); otherwise a warning at start-up says why not.
    #[default]
    Auto,
    /// Refuse to start when the host does not allow it.
    Required,
    /// Never: workloads see the machine's file system (within their user's permissions).
    Off,
}

impl SandboxMode {
    pub fn parse(s: &str) -> Option<SandboxMode> {
        Some(match s {
            "auto" => SandboxMode::Auto,
            "required" => SandboxMode::Required,
            "off" => SandboxMode::Off,
            _ => return None,
        })
    }
}

// The mount API's constants (linux/mount.h), not in the libc crate.
const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_NOEXEC: u64 = 0x8;

/// `struct mount_attr`, version 0.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// A path and the directories above it, top-down, for a `mkdir -p` between fork and exec.
#[derive(Clone, Debug)]
struct DeepPath {
    path: CString,
    /// Every ancestor below `/`, top-down, then the path itself.
    chain: Vec<CString>,
}

fn cstring(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(io::Error::other)
}

impl DeepPath {
    fn new(p: &Path) -> io::Result<DeepPath> {
        let mut chain: Vec<CString> = p
            .ancestors()
            .filter(|a| a.parent().is_some())
            .map(cstring)
            .collect::<io::Result<_>>()?;
        chain.reverse();
        Ok(DeepPath {
            path: cstring(p)?,
            chain,
        })
    }
}

/// Everything the child needs, prepared before fork (after it, only syscalls).
#[derive(Clone, Debug)]
pub struct Sandbox {
    /// `WORK_DIR/ID`: the workload's directory, the only writable place besides its `/tmp`.
    own: CString,
    /// `WORK_DIR`, covered so that only `own` shows in it.
    work_root: DeepPath,
    /// The data directory, covered by an empty read-only directory.
    data: CString,
    /// The device directory when it is not `/dev` (tests' fake nodes), kept visible.
    dev: Option<DeepPath>,
    /// `/tmp`, `/var/tmp`, `/dev/shm` where they exist.
    private: Vec<CString>,
    /// The tmpfs options of the private directories (mode, size).
    tmp_options: CString,
}

impl Sandbox {
    /// The view of workload `own` (a directory under `work_root`), with a private `/tmp` of at
    /// most `tmp_mib` MiB (0: the kernel's default; its pages count against the workload's
    /// memory limit either way).
    pub fn new(data_dir: &Path, work_root: &Path, own: &Path, dev_dir: &Path, tmp_mib: u64) -> io::Result<Sandbox> {
        let abs = std::path::absolute;
        let (data_dir, work_root, own, dev_dir) = (abs(data_dir)?, abs(work_root)?, abs(own)?, abs(dev_dir)?);
        if own.parent() != Some(work_root.as_path()) {
            return Err(io::Error::other(format!(
                "{} is not directly under {}",
                own.display(),
                work_root.display()
            )));
        }
        let private = ["/tmp", "/var/tmp", "/dev/shm"]
            .into_iter()
            .filter(|p| Path::new(p).is_dir())
            .map(|p| CString::new(p).map_err(io::Error::other))
            .collect::<io::Result<_>>()?;
        let size = if tmp_mib > 0 {
            format!(",size={tmp_mib}m")
        } else {
            String::new()
        };
        Ok(Sandbox {
            own: cstring(&own)?,
            work_root: DeepPath::new(&work_root)?,
            data: cstring(&data_dir)?,
            dev: (dev_dir != Path::new("/dev"))
                .then(|| DeepPath::new(&dev_dir))
                .transpose()?,
            private,
            tmp_options: CString::new(format!("mode=1777{size}")).map_err(io::Error::other)?,
        })
    }

    /// Enters the view: to be called in the child between fork and exec, as root. Leaves the
    /// working directory at the workload's own directory.
    ///
    /// # Safety
    /// Only async-signal-safe syscalls on memory prepared before fork; call it only in a
    /// freshly forked child.
    pub unsafe fn enter(&self) -> io::Result<()> {
        // SAFETY: the caller's contract; every pointer below comes from a live CString.
        unsafe {
            libc::umask(0o022);
            check(libc::unshare(libc::CLONE_NEWNS))?;
            // Nothing done here propagates back to the machine.
            check(libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            // Clones of what must stay visible, taken before anything covers it.
            let own = open_tree(&self.own, 0)?;
            let dev = match &self.dev {
                Some(d) => Some(open_tree(&d.path, AT_RECURSIVE)?),
                None => None,
            };
            setattr(libc::AT_FDCWD, c"/", AT_RECURSIVE, MOUNT_ATTR_RDONLY)?;
            for p in &self.private {
                check(libc::mount(
                    c"tmpfs".as_ptr(),
                    p.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    self.tmp_options.as_ptr().cast(),
                ))?;
            }
            // A /proc of its own in which other users' processes (the server's, every other
            // workload's) are invisible: a fresh procfs instance (per mount since Linux 5.8),
            // so the machine's /proc keeps its options.
            check(libc::mount(
                c"proc".as_ptr(),
                c"/proc".as_ptr(),
                c"proc".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                c"hidepid=invisible".as_ptr().cast(),
            ))?;
            // The data directory: hidden under an empty read-only cover (or already gone from
            // view, when it lies in a private directory).
            let r = libc::mount(
                c"tmpfs".as_ptr(),
                self.data.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                c"mode=0700,size=4k".as_ptr().cast(),
            );
            if r != 0 && *libc::__errno_location() != libc::ENOENT {
                return Err(io::Error::last_os_error());
            }
            // The work directory: a cover showing only the workload's own directory.
            mkdir_p(&self.work_root)?;
            check(libc::mount(
                c"tmpfs".as_ptr(),
                self.work_root.path.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                c"mode=0755,size=4k".as_ptr().cast(),
            ))?;
            check(libc::mkdir(self.own.as_ptr(), 0o700))?;
            move_mount(own, &self.own)?;
            setattr(
                own,
                c"",
                libc::AT_EMPTY_PATH as libc::c_uint,
                MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            )?;
            libc::close(own);
            setattr(
                libc::AT_FDCWD,
                &self.work_root.path,
                0,
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
            )?;
            if let (Some(fd), Some(d)) = (dev, &self.dev) {
                mkdir_p(d)?;
                move_mount(fd, &d.path)?;
                setattr(
                    fd,
                    c"",
                    libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE,
                    MOUNT_ATTR_RDONLY,
                )?;
                libc::close(fd);
            }
            check(libc::chdir(self.own.as_ptr()))?;
        }
        Ok(())
    }
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A detached clone of the mount tree at `path` (`AT_RECURSIVE`: with its submounts).
unsafe fn open_tree(path: &CString, flags: libc::c_uint) -> io::Result<libc::c_int> {
    // SAFETY: a live C string; the syscall only reads it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            path.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | flags,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd as libc::c_int)
}

unsafe fn move_mount(fd: libc::c_int, to: &CString) -> io::Result<()> {
    // SAFETY: live C strings; the syscall only reads them.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            fd,
            c"".as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

unsafe fn setattr(dirfd: libc::c_int, path: &std::ffi::CStr, flags: libc::c_uint, set: u64) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: a live C string and a mount_attr of the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dirfd,
            path.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `mkdir -p` (0755): a directory that exists, even on a read-only mount, is fine.
unsafe fn mkdir_p(p: &DeepPath) -> io::Result<()> {
    for dir in &p.chain {
        // SAFETY: a live C string.
        if unsafe { libc::mkdir(dir.as_ptr(), 0o755) } != 0 {
            // SAFETY: reads this thread's errno.
            let e = unsafe { *libc::__errno_location() };
            if e != libc::EEXIST {
                return Err(io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// Whether this host lets the server give workloads their own view: the same steps as a
/// workload's, once, in a child that then exits. `Err` says why not.
pub fn probe(data_dir: &Path, work_root: &Path, dev_dir: &Path) -> Result<(), String> {
    let own: PathBuf = work_root.join("sandbox-probe");
    std::fs::create_dir_all(&own).map_err(|e| format!("{}: {e}", own.display()))?;
    let result = (|| {
        let sandbox = Sandbox::new(data_dir, work_root, &own, dev_dir, 1).map_err(|e| e.to_string())?;
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.args(["-c", "touch /tmp/w && ! touch /probe-ro 2>/dev/null && touch ./w"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        // SAFETY: `enter` keeps to async-signal-safe syscalls.
        unsafe {
            cmd.pre_exec(move || sandbox.enter());
        }
        let status = cmd.status().map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!(
                "the view was made but does not hold (a private /tmp, a read-only root, a writable work directory): {status}"
            ));
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&own);
    result
}
