//! The cgroups of local workloads: how the server knows a workload's processes and holds them to
//! its request.
//!
//! Each workload gets its own cgroup, `NAME/w<ID>`, on cgroup v2 where `ROOT` is a v2 hierarchy
//! (cpu, memory and pids controllers) and otherwise in each cgroup v1 hierarchy Tessera uses
//! (cpu, cpuacct, memory, pids, devices, freezer). The workload joins it between fork and exec,
//! while still root, and cannot leave it (every `cgroup.procs` is root's). The server reads a
//! workload's processes from its cgroup, never from a file the workload can write: stop = SIGTERM
//! to every member, then freeze, SIGKILL every member, thaw (so no fork outruns the kill), and
//! remove the cgroup. Device access (the `devices.allow` rules over the `/dev/nvidia*` nodes) is
//! enforced by the v1 devices controller, and on cgroup v2 by a BPF device program compiled from
//! the same rules ([`crate::devfilter`]) where the kernel lets the server load one.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Limits of one workload's cgroup.
#[derive(Clone, Debug, Default)]
pub struct Limits {
    /// CPU quota in milli-CPUs (0: none).
    pub cpu_milli: u64,
    /// Memory (and memory + swap) limit in MiB (0: none).
    pub memory_mib: u64,
    /// Most processes and threads at once (0: none).
    pub pids: u64,
    /// Devices it may open, as `devices.allow` lines (`c 195:1 rwm`); everything else is denied.
    /// `None`: no device rules.
    pub devices: Option<Vec<String>>,
}

/// A cgroup v1 controller Tessera uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ctrl {
    Cpu,
    Cpuacct,
    Memory,
    Pids,
    Devices,
    Freezer,
}

impl Ctrl {
    fn name(self) -> &'static str {
        match self {
            Ctrl::Cpu => "cpu",
            Ctrl::Cpuacct => "cpuacct",
            Ctrl::Memory => "memory",
            Ctrl::Pids => "pids",
            Ctrl::Devices => "devices",
            Ctrl::Freezer => "freezer",
        }
    }
}

#[derive(Clone, Debug)]
enum Kind {
    Off,
    /// `ROOT/NAME`.
    V2(PathBuf),
    /// `ROOT/<hierarchy>/NAME` and the controllers it serves (one hierarchy may serve several).
    V1(Vec<(Vec<Ctrl>, PathBuf)>),
}

/// Cgroup placement for workloads, or why there is none.
#[derive(Clone, Debug)]
pub struct Cgroups {
    kind: Kind,
    /// Why limits are off (empty when on).
    pub skipped: String,
    /// On v2: BPF device programs can be loaded (device rules are enforced).
    bpf_devices: bool,
    /// `NAME`: the parent of workload cgroups, from each hierarchy's root.
    name: String,
    /// The root the hierarchies are under (normally `/sys/fs/cgroup`).
    root: PathBuf,
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, value).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// The hierarchy directory under `root` that holds controller `name` (`cpu`, `cpu,cpuacct`…).
fn v1_hierarchy(root: &Path, name: &str) -> Option<PathBuf> {
    let direct = root.join(name);
    if direct.join("cgroup.procs").exists() {
        return Some(direct);
    }
    fs::read_dir(root).ok()?.flatten().map(|e| e.path()).find(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.split(',').any(|c| c == name))
            && p.join("cgroup.procs").exists()
    })
}

impl Cgroups {
    /// Uses `ROOT/NAME` (normally `/sys/fs/cgroup/tessera…`) when `ROOT` is a cgroup v2 hierarchy
    /// in which Tessera may enable the cpu, memory and pids controllers, or `ROOT/<ctrl>/NAME` in
    /// each cgroup v1 hierarchy of the cpu, cpuacct, memory, pids, devices and freezer
    /// controllers (all needed but devices, whose absence only turns device rules off).
    pub fn detect(root: &Path, name: &str) -> Cgroups {
        let off = |why: String| Cgroups {
            kind: Kind::Off,
            skipped: why,
            bpf_devices: false,
            name: String::new(),
            root: root.to_path_buf(),
        };
        if root.join("cgroup.controllers").exists() {
            let base = root.join(name);
            if let Err(e) = fs::create_dir_all(&base) {
                return off(format!("cannot create {}: {e}", base.display()));
            }
            // Enable the controllers at each level from the root down to NAME.
            let mut dir = root.to_path_buf();
            let mut levels = vec![dir.clone()];
            for part in Path::new(name).components() {
                dir = dir.join(part);
                levels.push(dir.clone());
            }
            for dir in &levels {
                if let Err(e) = fs::write(dir.join("cgroup.subtree_control"), "+cpu +memory +pids") {
                    return off(format!(
                        "cannot enable the cpu, memory and pids controllers in {}: {e}",
                        dir.display()
                    ));
                }
            }
            let bpf_devices = match crate::devfilter::available() {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(reason = %e, "cgroup v2 without device rules");
                    false
                }
            };
            return Cgroups {
                kind: Kind::V2(base),
                skipped: String::new(),
                bpf_devices,
                name: name.to_string(),
                root: root.to_path_buf(),
            };
        }
        let mut dirs = Vec::new();
        for ctrl in [
            Ctrl::Cpu,
            Ctrl::Cpuacct,
            Ctrl::Memory,
            Ctrl::Pids,
            Ctrl::Devices,
            Ctrl::Freezer,
        ] {
            let Some(h) = v1_hierarchy(root, ctrl.name()) else {
                if ctrl == Ctrl::Devices || ctrl == Ctrl::Cpuacct {
                    continue;
                }
                return off(format!(
                    "{} is neither a cgroup v2 hierarchy nor holds a cgroup v1 {} hierarchy",
                    root.display(),
                    ctrl.name()
                ));
            };
            let base = h.join(name);
            if let Err(e) = fs::create_dir_all(&base) {
                return off(format!("cannot create {}: {e}", base.display()));
            }
            let canon = fs::canonicalize(&base).unwrap_or(base);
            match dirs.iter_mut().find(|(_, b): &&mut (Vec<Ctrl>, PathBuf)| *b == canon) {
                Some((ctrls, _)) => ctrls.push(ctrl),
                None => dirs.push((vec![ctrl], canon)),
            }
        }
        Cgroups {
            kind: Kind::V1(dirs),
            skipped: String::new(),
            bpf_devices: false,
            name: name.to_string(),
            root: root.to_path_buf(),
        }
    }

    /// No cgroups (tests, or when asked).
    pub fn off(why: &str) -> Cgroups {
        Cgroups {
            kind: Kind::Off,
            skipped: why.into(),
            bpf_devices: false,
            name: String::new(),
            root: PathBuf::new(),
        }
    }

    pub fn enabled(&self) -> bool {
        !matches!(self.kind, Kind::Off)
    }

    /// `v1`, `v2` or `off`.
    pub fn version(&self) -> &'static str {
        match self.kind {
            Kind::Off => "off",
            Kind::V1(_) => "v1",
            Kind::V2(_) => "v2",
        }
    }

    /// Whether device rules are enforced: cgroup v1 with the devices controller, or v2 with BPF
    /// device programs.
    pub fn devices_enforced(&self) -> bool {
        match &self.kind {
            Kind::Off => false,
            Kind::V1(d) => d.iter().any(|(c, _)| c.contains(&Ctrl::Devices)),
            Kind::V2(_) => self.bpf_devices,
        }
    }

    fn leaf(id: u64) -> String {
        format!("w{id}")
    }

    /// The cgroup an OCI runtime puts workload `id`'s container in, as a path from each
    /// hierarchy's root (`/NAME/wID/ctr`, its `cgroupsPath`): a child of the workload's cgroup,
    /// beside `rt`, which holds the runtime itself ([`Cgroups::prepare_container`]); `None`
    /// when cgroups are off.
    pub fn oci_path(&self, id: u64) -> Option<String> {
        self.enabled()
            .then(|| format!("/{}/{}/ctr", self.name.trim_matches('/'), Self::leaf(id)))
    }

    /// Whether a memory limit can also forbid swap (v2, or v1 with swap accounting).
    pub fn swap_limitable(&self) -> bool {
        match &self.kind {
            Kind::Off => false,
            Kind::V2(_) => true,
            Kind::V1(list) => list
                .iter()
                .any(|(c, b)| c.contains(&Ctrl::Memory) && b.join("memory.memsw.limit_in_bytes").exists()),
        }
    }

    /// Creates workload `id`'s cgroup for a container: the workload's cgroup with its device
    /// rules only, and in it `rt` for the runtime and the server's wrapper (returned: the
    /// `cgroup.procs` files they join). The runtime makes `ctr` beside it with the
    /// container's CPU, memory and pids limits ([`Cgroups::oci_path`]). The workload's cgroup
    /// then holds no process itself, as cgroup v2 requires of a parent.
    pub fn prepare_container(&self, id: u64, devices: Option<Vec<String>>) -> io::Result<Vec<PathBuf>> {
        self.prepare(
            id,
            &Limits {
                cpu_milli: 0,
                memory_mib: 0,
                pids: 0,
                devices,
            },
        )?;
        let mut procs = Vec::new();
        for (_, dir) in self.dirs(id) {
            let rt = dir.join("rt");
            fs::create_dir_all(&rt)?;
            procs.push(rt.join("cgroup.procs"));
        }
        Ok(procs)
    }

    /// The distinct directories of workload `id`'s cgroup, with the controllers each serves.
    fn dirs(&self, id: u64) -> Vec<(Vec<Ctrl>, PathBuf)> {
        match &self.kind {
            Kind::Off => Vec::new(),
            Kind::V2(base) => vec![(Vec::new(), base.join(Self::leaf(id)))],
            Kind::V1(list) => list.iter().map(|(c, b)| (c.clone(), b.join(Self::leaf(id)))).collect(),
        }
    }

    /// The directory of `id`'s cgroup that serves `ctrl` (v2: the one directory).
    fn dir_of(&self, id: u64, ctrl: Ctrl) -> Option<PathBuf> {
        match &self.kind {
            Kind::Off => None,
            Kind::V2(base) => Some(base.join(Self::leaf(id))),
            Kind::V1(list) => list
                .iter()
                .find(|(c, _)| c.contains(&ctrl))
                .map(|(_, b)| b.join(Self::leaf(id))),
        }
    }

    /// Creates workload `id`'s cgroup with its limits and returns the `cgroup.procs` files the
    /// workload joins before it runs (empty when cgroups are off).
    pub fn prepare(&self, id: u64, limits: &Limits) -> io::Result<Vec<PathBuf>> {
        let mut procs = Vec::new();
        for (ctrls, dir) in self.dirs(id) {
            fs::create_dir_all(&dir)?;
            let v2 = ctrls.is_empty();
            let has = |c: Ctrl| v2 || ctrls.contains(&c);
            if has(Ctrl::Cpu) && limits.cpu_milli > 0 {
                // 1000 milli-CPUs = one CPU = 100000 µs of every 100000 µs period.
                let quota = (limits.cpu_milli * 100).max(1000);
                if v2 {
                    write(&dir.join("cpu.max"), &format!("{quota} 100000"))?;
                } else {
                    write(&dir.join("cpu.cfs_period_us"), "100000")?;
                    write(&dir.join("cpu.cfs_quota_us"), &quota.to_string())?;
                }
            }
            if has(Ctrl::Memory) && limits.memory_mib > 0 {
                let bytes = (limits.memory_mib * 1024 * 1024).to_string();
                if v2 {
                    write(&dir.join("memory.max"), &bytes)?;
                    let swap = dir.join("memory.swap.max");
                    if swap.exists() {
                        write(&swap, "0")?;
                    }
                } else {
                    write(&dir.join("memory.limit_in_bytes"), &bytes)?;
                    let memsw = dir.join("memory.memsw.limit_in_bytes");
                    if memsw.exists() {
                        write(&memsw, &bytes)?;
                    }
                }
            }
            if has(Ctrl::Pids) && limits.pids > 0 {
                write(&dir.join("pids.max"), &limits.pids.to_string())?;
            }
            if !v2
                && ctrls.contains(&Ctrl::Devices)
                && let Some(allow) = &limits.devices
            {
                write(&dir.join("devices.deny"), "a")?;
                for line in allow {
                    write(&dir.join("devices.allow"), line)?;
                }
            }
            if v2
                && self.bpf_devices
                && let Some(allow) = &limits.devices
            {
                crate::devfilter::attach(&dir, allow)?;
            }
            procs.push(dir.join("cgroup.procs"));
        }
        Ok(procs)
    }

    /// The processes in workload `id`'s cgroup and the cgroups below it (a container's
    /// runtime and the container itself), empty when it has none or cgroups are off.
    pub fn members(&self, id: u64) -> Vec<i32> {
        let Some(dir) = self.dir_of(id, Ctrl::Freezer) else {
            return Vec::new();
        };
        let mut pids = Vec::new();
        let mut todo = vec![dir];
        while let Some(d) = todo.pop() {
            pids.extend(
                fs::read_to_string(d.join("cgroup.procs"))
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| l.trim().parse::<i32>().ok()),
            );
            todo.extend(
                fs::read_dir(&d)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
        pids
    }

    /// Whether any process of workload `id` is left in its cgroup.
    pub fn populated(&self, id: u64) -> bool {
        !self.members(id).is_empty()
    }

    /// CPU time used by workload `id`'s cgroup so far.
    pub fn cpu_usage(&self, id: u64) -> Option<Duration> {
        match &self.kind {
            Kind::Off => None,
            Kind::V2(_) => {
                let stat = fs::read_to_string(self.dir_of(id, Ctrl::Cpu)?.join("cpu.stat")).ok()?;
                let us = stat
                    .lines()
                    .find_map(|l| l.strip_prefix("usage_usec "))?
                    .trim()
                    .parse()
                    .ok()?;
                Some(Duration::from_micros(us))
            }
            Kind::V1(_) => {
                let ns = fs::read_to_string(self.dir_of(id, Ctrl::Cpuacct)?.join("cpuacct.usage")).ok()?;
                Some(Duration::from_nanos(ns.trim().parse().ok()?))
            }
        }
    }

    /// How many CPU periods workload `id` was throttled in (the cfs quota at work).
    pub fn throttled_periods(&self, id: u64) -> Option<u64> {
        let stat = fs::read_to_string(self.dir_of(id, Ctrl::Cpu)?.join("cpu.stat")).ok()?;
        stat.lines()
            .find_map(|l| l.strip_prefix("nr_throttled "))?
            .trim()
            .parse()
            .ok()
    }

    /// Sends `sig` to every process in workload `id`'s cgroup.
    pub fn signal_all(&self, id: u64, sig: i32) {
        for pid in self.members(id) {
            // SAFETY: plain syscall on a pid read from the cgroup; ESRCH (gone) is fine.
            unsafe {
                libc::kill(pid, sig);
            }
        }
    }

    fn set_frozen(&self, id: u64, frozen: bool) {
        match &self.kind {
            Kind::Off => {}
            Kind::V2(_) => {
                if let Some(d) = self.dir_of(id, Ctrl::Freezer) {
                    let _ = fs::write(d.join("cgroup.freeze"), if frozen { "1" } else { "0" });
                }
            }
            Kind::V1(_) => {
                if let Some(d) = self.dir_of(id, Ctrl::Freezer) {
                    let _ = fs::write(d.join("freezer.state"), if frozen { "FROZEN" } else { "THAWED" });
                }
            }
        }
    }

    fn is_frozen(&self, id: u64) -> bool {
        let Some(d) = self.dir_of(id, Ctrl::Freezer) else {
            return false;
        };
        match &self.kind {
            Kind::V2(_) => fs::read_to_string(d.join("cgroup.events"))
                .unwrap_or_default()
                .lines()
                .any(|l| l.trim() == "frozen 1"),
            _ => fs::read_to_string(d.join("freezer.state")).unwrap_or_default().trim() == "FROZEN",
        }
    }

    /// Kills every process of workload `id`: freeze (so none forks meanwhile), SIGKILL each
    /// member, thaw, wait until the cgroup is empty (up to 5 s), remove it. Returns whether it
    /// emptied.
    pub async fn kill_all(&self, id: u64) -> bool {
        if !self.enabled() {
            return true;
        }
        self.set_frozen(id, true);
        let t = Instant::now();
        while self.populated(id) && !self.is_frozen(id) && t.elapsed() < Duration::from_secs(1) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.signal_all(id, libc::SIGKILL);
        self.set_frozen(id, false);
        let t = Instant::now();
        while self.populated(id) {
            if t.elapsed() > Duration::from_secs(5) {
                return false;
            }
            // Anything forked between the listing and the freeze taking hold.
            self.signal_all(id, libc::SIGKILL);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.remove(id);
        true
    }

    /// SIGTERM to every member, then [`Cgroups::kill_all`] once `grace` has passed with any
    /// process left. Returns whether SIGKILL was needed.
    pub async fn terminate(&self, id: u64, grace: Duration) -> bool {
        self.signal_all(id, libc::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if !self.populated(id) {
                self.remove(id);
                return false;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let needed = self.populated(id);
        self.kill_all(id).await;
        needed
    }

    /// Removes the parent `NAME` cgroup: first every empty workload cgroup left in it, then
    /// itself (a cgroup with processes stays).
    pub fn remove_parent(&self) {
        let bases: Vec<&PathBuf> = match &self.kind {
            Kind::Off => Vec::new(),
            Kind::V2(base) => vec![base],
            Kind::V1(list) => list.iter().map(|(_, b)| b).collect(),
        };
        for base in bases {
            for e in fs::read_dir(base).into_iter().flatten().flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    let _ = fs::remove_dir(e.path());
                }
            }
            let _ = fs::remove_dir(base);
        }
    }

    /// Removes workload `id`'s cgroup and those below it (only empty ones can be removed), in
    /// every hierarchy under the root (a container's runtime makes it in all of them).
    pub fn remove(&self, id: u64) {
        let mut dirs: Vec<PathBuf> = self.dirs(id).into_iter().map(|(_, d)| d).collect();
        if let Kind::V1(_) = self.kind {
            dirs.extend(
                fs::read_dir(&self.root)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path().join(&self.name).join(Self::leaf(id)))
                    .filter(|d| d.is_dir()),
            );
        }
        for dir in dirs {
            remove_tree(&dir);
        }
    }
}

/// Removes the cgroup `dir` and its descendants, deepest first (cgroup directories are removed
/// with rmdir, their files never).
fn remove_tree(dir: &Path) {
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&e.path());
        }
    }
    let _ = fs::remove_dir(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroups_are_skipped_with_a_reason_without_a_hierarchy() {
        let dir = std::env::temp_dir().join(format!("tessera-nocg-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let c = Cgroups::detect(&dir, "tessera");
        assert!(!c.enabled());
        assert!(
            c.skipped
                .contains("neither a cgroup v2 hierarchy nor holds a cgroup v1 cpu hierarchy"),
            "{}",
            c.skipped
        );
        assert!(c.members(1).is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }
}
