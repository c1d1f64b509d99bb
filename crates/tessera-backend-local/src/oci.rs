//! Local workloads that name a container image: the image from an OCI image layout on this
//! machine, run by an OCI runtime from the distribution (runc or crun).
//!
//! * [`ImageStore`]: `--local-images DIR` is an OCI image layout (what `skopeo copy
//!   docker://busybox:1.36 oci:DIR:busybox:1.36` or `umoci` write: `oci-layout`, `index.json`,
//!   `blobs/sha256/…`). A workload's `image` is matched against the layout's
//!   `org.opencontainers.image.ref.name` annotations; a multi-platform index gives this
//!   machine's platform. Every blob is checked against its digest, and an image is unpacked once
//!   per manifest (layers in order, whiteouts applied, nothing written outside its root) into
//!   `DATA_DIR/images/<digest>`, which the server alone can reach. Tessera pulls nothing: the
//!   admin puts images there, so tenants run only what the platform offers.
//! * [`Bundle`]: each workload gets an OCI bundle in its server-only record directory: an
//!   overlay of the shared image (never written) with an upper layer of its own, and a
//!   `config.json` that runs the command as the workload's own uid with no capabilities and
//!   `noNewPrivileges`, in new pid, mount, IPC, UTS and (unless the host network was asked
//!   for) network namespaces, with a read-only root, a private `/tmp` and `/dev/shm` the size
//!   of its memory, its own directory at `/work` (also `HOME`), the usual masked `/proc` paths,
//!   and only its GPUs' device nodes. Its cgroup is the workload's own cgroup (the runtime
//!   joins the one the server made, with the same limits and device rules), so stop, limits
//!   and adoption after a restart are those of every local workload.
//! * GPUs through the NVIDIA Container Toolkit's CDI spec where one is installed
//!   ([`crate::cdi`]): its device nodes, driver library mounts, hooks and environment; without
//!   one, the GPUs' device nodes only (the image must then bring a matching driver library).

use std::collections::HashSet;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;

use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::cdi::Edits;

const REF_NAME: &str = "org.opencontainers.image.ref.name";
/// The most bytes of a JSON blob (index, manifest, config) read.
const MAX_JSON: u64 = 4 << 20;

/// How a container reaches the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerNetwork {
    /// A network namespace of its own with only loopback: no tenant reaches another, nor the
    /// server, over the network.
    Private,
    /// The machine's network (no network boundary between workloads).
    Host,
}

/// How workloads with an image run.
#[derive(Clone, Debug)]
pub struct ContainerConfig {
    /// The OCI image layout the images come from.
    pub images: PathBuf,
    /// The OCI runtime (`runc` or `crun`, by path).
    pub runtime: PathBuf,
    pub network: ContainerNetwork,
    /// Where CDI specs are looked for (normally `/etc/cdi` and `/var/run/cdi`).
    pub cdi_dirs: Vec<PathBuf>,
}

/// The first of `runc` and `crun` on `PATH`.
pub fn find_runtime() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    ["runc", "crun"]
        .iter()
        .find_map(|name| std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file()))
}

#[derive(Deserialize)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
    #[serde(default)]
    annotations: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Deserialize)]
struct Platform {
    architecture: String,
    os: String,
}

#[derive(Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Manifest {
    config: Descriptor,
    layers: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct ConfigBlob {
    #[serde(default)]
    config: ImageConfig,
}

/// What an image's configuration says about running it.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ImageConfig {
    #[serde(rename = "Env", default)]
    pub env: Option<Vec<String>>,
    #[serde(rename = "Entrypoint", default)]
    pub entrypoint: Option<Vec<String>>,
    #[serde(rename = "Cmd", default)]
    pub cmd: Option<Vec<String>>,
    #[serde(rename = "WorkingDir", default)]
    pub working_dir: Option<String>,
}

/// An image ready to run.
#[derive(Clone, Debug)]
pub struct Image {
    /// The name it was asked for by.
    pub name: String,
    /// Its manifest's digest (`sha256:…`).
    pub digest: String,
    /// The unpacked root file system (shared by every workload of this image; never written).
    pub rootfs: PathBuf,
    pub config: ImageConfig,
}

/// The images of an OCI image layout, unpacked on first use.
pub struct ImageStore {
    layout: PathBuf,
    cache: PathBuf,
    /// One unpack at a time.
    unpack: Mutex<()>,
}

/// This machine's architecture in OCI's words.
fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

fn hex_of(digest: &str) -> io::Result<&str> {
    let hex = digest
        .strip_prefix("sha256:")
        .ok_or_else(|| io::Error::other(format!("unsupported digest {digest} (only sha256)")))?;
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
        return Err(io::Error::other(format!("malformed digest {digest}")));
    }
    Ok(hex)
}

impl ImageStore {
    /// The layout at `layout`; images are unpacked under `cache` (the server's alone).
    pub fn open(layout: &Path, cache: &Path) -> io::Result<ImageStore> {
        if !layout.join("oci-layout").is_file() || !layout.join("index.json").is_file() {
            return Err(io::Error::other(format!(
                "{} is not an OCI image layout (no oci-layout and index.json): fill it with `skopeo copy docker://IMAGE oci:{}:IMAGE`",
                layout.display(),
                layout.display()
            )));
        }
        fs::create_dir_all(cache)?;
        fs::set_permissions(cache, fs::Permissions::from_mode(0o700))?;
        Ok(ImageStore {
            layout: layout.to_path_buf(),
            cache: cache.to_path_buf(),
            unpack: Mutex::new(()),
        })
    }

    fn blob_path(&self, digest: &str) -> io::Result<PathBuf> {
        Ok(self.layout.join("blobs/sha256").join(hex_of(digest)?))
    }

    /// A blob's bytes, checked against its digest.
    fn json_blob<T: serde::de::DeserializeOwned>(&self, digest: &str) -> io::Result<T> {
        let path = self.blob_path(digest)?;
        let mut bytes = Vec::new();
        fs::File::open(&path)
            .map_err(|e| io::Error::other(format!("{}: {e}", path.display())))?
            .take(MAX_JSON)
            .read_to_end(&mut bytes)?;
        let got = hex::encode(Sha256::digest(&bytes));
        if got != hex_of(digest)? {
            return Err(io::Error::other(format!(
                "blob {digest} is corrupt (its content hashes to sha256:{got})"
            )));
        }
        serde_json::from_slice(&bytes).map_err(|e| io::Error::other(format!("blob {digest}: {e}")))
    }

    /// Checks a (large) blob file against its digest.
    fn verify_file(&self, digest: &str) -> io::Result<PathBuf> {
        let path = self.blob_path(digest)?;
        let mut f = fs::File::open(&path).map_err(|e| io::Error::other(format!("{}: {e}", path.display())))?;
        let mut h = Sha256::new();
        io::copy(&mut f, &mut h)?;
        let got = hex::encode(h.finalize());
        if got != hex_of(digest)? {
            return Err(io::Error::other(format!(
                "layer {digest} is corrupt (its content hashes to sha256:{got})"
            )));
        }
        Ok(path)
    }

    fn index(&self) -> io::Result<Index> {
        let bytes = fs::read(self.layout.join("index.json"))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| io::Error::other(format!("{}/index.json: {e}", self.layout.display())))
    }

    /// The names the layout offers.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .index()
            .map(|i| {
                i.manifests
                    .into_iter()
                    .filter_map(|d| d.annotations.get(REF_NAME).cloned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names.dedup();
        names
    }

    /// The manifest descriptor `name` stands for: its exact ref name, or `name:latest` for a
    /// name without a tag.
    fn find(&self, name: &str) -> io::Result<Descriptor> {
        let index = self.index()?;
        // `name@sha256:…` (what an image policy runs): the manifest of that digest.
        if let Some((_, digest)) = name.split_once('@') {
            return index.manifests.into_iter().find(|d| d.digest == digest).ok_or_else(|| {
                io::Error::other(format!(
                    "image {name:?}: no manifest {digest} in this machine's image store {}",
                    self.layout.display()
                ))
            });
        }
        let tagless = !name.rsplit('/').next().unwrap_or(name).contains(':') && !name.contains('@');
        let latest = format!("{name}:latest");
        let mut hits = index.manifests.into_iter().filter(|d| {
            d.annotations
                .get(REF_NAME)
                .is_some_and(|r| r == name || (tagless && *r == latest))
        });
        match hits.next() {
            Some(d) => Ok(d),
            None => {
                let names = self.names();
                Err(io::Error::other(format!(
                    "image {name:?} is not in this machine's image store {} ({}); an admin adds it with `skopeo copy docker://{name} oci:{}:{name}`",
                    self.layout.display(),
                    if names.is_empty() {
                        "it holds none".to_string()
                    } else {
                        format!("it holds {}", names.join(", "))
                    },
                    self.layout.display()
                )))
            }
        }
    }

    /// The manifest of `d`, through an image index to this machine's platform.
    fn manifest(&self, d: Descriptor) -> io::Result<(String, Manifest)> {
        let mut d = d;
        for _ in 0..4 {
            if d.media_type.ends_with("image.index.v1+json") || d.media_type.ends_with("manifest.list.v2+json") {
                let index: Index = self.json_blob(&d.digest)?;
                let arch = oci_arch();
                d = index
                    .manifests
                    .into_iter()
                    .find(|m| {
                        m.platform
                            .as_ref()
                            .is_some_and(|p| p.os == "linux" && p.architecture == arch)
                    })
                    .ok_or_else(|| io::Error::other(format!("the image has no linux/{arch} manifest")))?;
                continue;
            }
            return Ok((d.digest.clone(), self.json_blob(&d.digest)?));
        }
        Err(io::Error::other("image indexes nested too deep"))
    }

    /// The image `name`, unpacked (once) and ready to run.
    pub fn get(&self, name: &str) -> io::Result<Image> {
        let (digest, manifest) = self.manifest(self.find(name)?)?;
        let config: ConfigBlob = self.json_blob(&manifest.config.digest)?;
        let rootfs = self.cache.join(hex_of(&digest)?);
        let _one = self.unpack.lock().unwrap_or_else(|e| e.into_inner());
        if !rootfs.is_dir() {
            let tmp = self.cache.join(format!("{}.partial", hex_of(&digest)?));
            let _ = fs::remove_dir_all(&tmp);
            fs::create_dir(&tmp)?;
            for layer in &manifest.layers {
                let path = self.verify_file(&layer.digest)?;
                apply_layer(&path, &layer.media_type, &tmp)
                    .map_err(|e| io::Error::other(format!("layer {}: {e}", layer.digest)))?;
            }
            // The container's user must be able to reach its own root.
            fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))?;
            fs::rename(&tmp, &rootfs)?;
        }
        Ok(Image {
            name: name.to_string(),
            digest,
            rootfs,
            config: config.config,
        })
    }
}

/// `rel` as a path inside the root: no root or `..` components.
fn clean(rel: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in rel.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// The directory `root/rel` if it resolves (links followed) inside `root`.
fn dir_inside(root: &Path, rel: &Path) -> Option<PathBuf> {
    let root = fs::canonicalize(root).ok()?;
    let dir = fs::canonicalize(root.join(rel)).ok()?;
    dir.starts_with(&root).then_some(dir)
}

/// Removes `path` without following a link at its end.
fn remove_any(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Applies one layer (a tar, plain or gzip) onto `root`: whiteouts (`.wh.NAME` removes NAME,
/// `.wh..wh..opq` empties its directory of what lower layers put there), then every entry
/// through the `tar` crate's `unpack_in`, which refuses to write outside `root`. Device nodes
/// and FIFOs are skipped (the runtime makes `/dev`).
fn apply_layer(path: &Path, media_type: &str, root: &Path) -> io::Result<()> {
    let f = fs::File::open(path)?;
    let reader: Box<dyn Read> = if media_type.ends_with("gzip") {
        Box::new(flate2::read::GzDecoder::new(io::BufReader::new(f)))
    } else if media_type.ends_with(".tar") || media_type.ends_with("tar") {
        Box::new(io::BufReader::new(f))
    } else {
        return Err(io::Error::other(format!(
            "unsupported layer type {media_type} (plain and gzip tar layers are supported)"
        )));
    };
    let mut archive = tar::Archive::new(reader);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(true);
    archive.set_unpack_xattrs(false);
    archive.set_overwrite(true);
    let mut this_layer: HashSet<PathBuf> = HashSet::new();
    for entry in archive.entries()? {
        let mut entry = entry?;
        let rel = clean(&entry.path()?).ok_or_else(|| io::Error::other("an entry's path leaves the root"))?;
        let Some(name) = rel.file_name().and_then(|n| n.to_str()).map(str::to_string) else {
            continue;
        };
        let parent = rel.parent().unwrap_or(Path::new("")).to_path_buf();
        if name == ".wh..wh..opq" {
            if let Some(dir) = dir_inside(root, &parent) {
                for child in fs::read_dir(&dir)?.flatten() {
                    if !this_layer.contains(&parent.join(child.file_name())) {
                        remove_any(&child.path())?;
                    }
                }
            }
            continue;
        }
        if let Some(hidden) = name.strip_prefix(".wh.") {
            if let Some(dir) = dir_inside(root, &parent) {
                remove_any(&dir.join(hidden))?;
            }
            continue;
        }
        use tar::EntryType as T;
        match entry.header().entry_type() {
            T::Block | T::Char | T::Fifo => continue,
            _ => {}
        }
        // A directory replaced by a file (or the other way round) between layers.
        let existing = root.join(&rel);
        if let Ok(m) = fs::symlink_metadata(&existing)
            && (m.is_dir() != entry.header().entry_type().is_dir())
            && dir_inside(root, &parent).is_some()
        {
            remove_any(&existing)?;
        }
        entry.unpack_in(root)?;
        this_layer.insert(rel);
    }
    Ok(())
}

/// A workload's OCI bundle: `DIR/bundle/{config.json,rootfs}` with the image's overlay mounted
/// on `rootfs` (upper layer and work directory beside it).
pub struct Bundle {
    pub dir: PathBuf,
}

/// What a container runs and with what.
pub struct ContainerSpec<'a> {
    pub id: u64,
    pub image: &'a Image,
    /// The command given with the request (replaces the image's entrypoint and command).
    pub command: Option<&'a [String]>,
    /// `KEY=VALUE` after the image's own environment.
    pub env: Vec<String>,
    /// The workload's own directory on the host, mounted at `/work`.
    pub work: &'a Path,
    pub uid: u32,
    pub gid: u32,
    /// The workload's cgroup, from the hierarchy's root (`/tessera/…/wID`).
    pub cgroups_path: String,
    /// `devices.allow` lines: what the runtime writes into the cgroup (the same as the server's).
    pub device_rules: &'a [String],
    /// GPU device nodes to create in the container: host path and major/minor numbers.
    pub devices: &'a [(PathBuf, u32, u32)],
    pub memory_mib: u64,
    /// CPU limit in milli-CPUs (0: none).
    pub cpu_milli: u64,
    /// Most processes and threads (0: none).
    pub pids: u64,
    /// Whether the memory limit also forbids swap.
    pub no_swap: bool,
    pub network: ContainerNetwork,
    /// From the CDI spec, when one is installed.
    pub cdi: &'a Edits,
}

/// The container ID of workload `id` for the runtime.
pub fn container_id(id: u64) -> String {
    format!("tessera-w{id}")
}

/// The runtime's state directory (the server's alone).
pub fn state_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("oci")
}

fn bundle_dir(record_dir: &Path) -> PathBuf {
    record_dir.join("bundle")
}

/// A `devices.allow` line (`c 195:0 rwm`, `c 136:* rwm`) as an OCI device cgroup rule.
fn device_rule(line: &str) -> Option<Value> {
    let mut it = line.split_whitespace();
    let kind = it.next()?;
    let (maj, min) = it.next()?.split_once(':')?;
    let access = it.next().unwrap_or("rwm");
    let num = |s: &str| -> Option<Value> {
        match s {
            "*" => Some(Value::Null),
            n => n.parse::<i64>().ok().map(Value::from),
        }
    };
    let mut rule = json!({"allow": true, "type": kind, "access": access});
    match num(maj)? {
        Value::Null => {}
        v => rule["major"] = v,
    }
    match num(min)? {
        Value::Null => {}
        v => rule["minor"] = v,
    }
    Some(rule)
}

/// The OCI runtime configuration of `c` (runtime-spec 1.0.2) with its root at `rootfs`.
pub fn config_json(c: &ContainerSpec<'_>, rootfs: &Path) -> Value {
    let cfg = &c.image.config;
    let args: Vec<String> = match c.command {
        Some(cmd) if !cmd.is_empty() => cmd.to_vec(),
        _ => cfg
            .entrypoint
            .clone()
            .unwrap_or_default()
            .into_iter()
            .chain(cfg.cmd.clone().unwrap_or_default())
            .collect(),
    };
    let mut env: Vec<String> = cfg.env.clone().unwrap_or_default();
    if !env.iter().any(|e| e.starts_with("PATH=")) {
        env.push("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    }
    env.push("HOME=/work".into());
    env.extend(c.cdi.env.iter().cloned());
    env.extend(c.env.iter().cloned());
    let cwd = cfg
        .working_dir
        .clone()
        .filter(|w| w.starts_with('/'))
        .unwrap_or_else(|| "/work".into());
    let size = format!("size={}m", c.memory_mib.max(16));
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
               "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
               "options": ["nosuid", "noexec", "nodev", "mode=1777", size]}),
        json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
               "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "nodev", "mode=1777", format!("size={}m", c.memory_mib.max(16))]}),
        json!({"destination": "/work", "type": "bind", "source": c.work,
               "options": ["rbind", "rw", "nosuid", "nodev"]}),
    ];
    let mut namespaces = vec![
        json!({"type": "pid"}),
        json!({"type": "ipc"}),
        json!({"type": "uts"}),
        json!({"type": "mount"}),
    ];
    match c.network {
        ContainerNetwork::Private => {
            namespaces.push(json!({"type": "network"}));
            mounts.push(json!({"destination": "/sys", "type": "sysfs", "source": "sysfs",
                               "options": ["nosuid", "noexec", "nodev", "ro"]}));
        }
        ContainerNetwork::Host => {
            // sysfs cannot be mounted afresh without a network namespace of its own.
            mounts.push(json!({"destination": "/sys", "type": "bind", "source": "/sys",
                               "options": ["rbind", "nosuid", "noexec", "nodev", "ro"]}));
            if Path::new("/etc/resolv.conf").exists() {
                mounts.push(
                    json!({"destination": "/etc/resolv.conf", "type": "bind", "source": "/etc/resolv.conf",
                                   "options": ["rbind", "ro", "nosuid", "nodev"]}),
                );
            }
        }
    }
    for m in &c.cdi.mounts {
        let mut options = m.options.clone();
        if !options.iter().any(|o| o == "bind" || o == "rbind") && m.kind.as_deref().is_none_or(|t| t == "bind") {
            options.push("rbind".into());
        }
        mounts.push(
            json!({"destination": m.container_path, "type": m.kind.clone().unwrap_or_else(|| "bind".into()),
                           "source": m.host_path, "options": options}),
        );
    }
    let mut rules = vec![json!({"allow": false, "access": "rwm"})];
    rules.extend(c.device_rules.iter().filter_map(|l| device_rule(l)));
    let mut devices: Vec<Value> = c
        .devices
        .iter()
        .map(|(host, maj, min)| {
            let name = host
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default();
            let inside = if host
                .parent()
                .and_then(|p| p.file_name())
                .is_some_and(|p| p == "nvidia-caps")
            {
                format!("/dev/nvidia-caps/{name}")
            } else {
                format!("/dev/{name}")
            };
            json!({"path": inside, "type": "c", "major": maj, "minor": min, "fileMode": 0o666, "uid": 0, "gid": 0})
        })
        .collect();
    for d in &c.cdi.device_nodes {
        if devices.iter().any(|v| v["path"] == d.path.as_str()) {
            continue;
        }
        devices.push(
            json!({"path": d.path, "type": d.kind, "major": d.major, "minor": d.minor,
                            "fileMode": 0o666, "uid": 0, "gid": 0}),
        );
        rules.push(json!({"allow": true, "type": d.kind, "major": d.major, "minor": d.minor, "access": "rwm"}));
    }
    let mut resources = json!({"devices": rules});
    if c.memory_mib > 0 {
        let bytes = c.memory_mib * 1024 * 1024;
        resources["memory"] = json!({"limit": bytes});
        if c.no_swap {
            resources["memory"]["swap"] = json!(bytes);
        }
    }
    if c.cpu_milli > 0 {
        resources["cpu"] = json!({"quota": (c.cpu_milli * 100).max(1000), "period": 100000});
    }
    if c.pids > 0 {
        resources["pids"] = json!({"limit": c.pids});
    }
    let mut hooks = serde_json::Map::new();
    for h in &c.cdi.hooks {
        let list = hooks
            .entry(h.hook_name.clone())
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(a) = list {
            a.push(json!({"path": h.path, "args": h.args, "env": h.env}));
        }
    }
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": c.uid, "gid": c.gid, "additionalGids": [], "umask": 0o077},
            "args": args,
            "env": env,
            "cwd": cwd,
            "capabilities": {"bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": []},
            "noNewPrivileges": true
        },
        "root": {"path": rootfs, "readonly": true},
        "hostname": container_id(c.id),
        "mounts": mounts,
        "hooks": hooks,
        "linux": {
            "namespaces": namespaces,
            "cgroupsPath": c.cgroups_path,
            "resources": resources,
            "devices": devices,
            "maskedPaths": ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                            "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
                            "/sys/firmware", "/sys/devices/virtual/powercap"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
        }
    })
}

fn cstring(p: &Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(io::Error::other)
}

impl Bundle {
    /// Makes workload `c`'s bundle under its record directory (the server's alone): the
    /// image's overlay (a fresh upper layer; the shared image is its read-only lower layer)
    /// and its `config.json`.
    pub fn create(record_dir: &Path, c: &ContainerSpec<'_>) -> io::Result<Bundle> {
        let dir = bundle_dir(record_dir);
        cleanup_bundle(record_dir);
        let (rootfs, upper, work) = (dir.join("rootfs"), dir.join("upper"), dir.join("ovl"));
        for d in [&rootfs, &upper, &work] {
            fs::create_dir_all(d)?;
        }
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))?;
        let lower = c.image.rootfs.to_string_lossy().to_string();
        for p in [
            &lower,
            &upper.to_string_lossy().to_string(),
            &work.to_string_lossy().to_string(),
        ] {
            if p.contains(',') || p.contains(':') {
                return Err(io::Error::other(format!(
                    "{p}: an overlay layer's path may hold neither ',' nor ':' (choose another --data-dir)"
                )));
            }
        }
        let opts = format!(
            "lowerdir={lower},upperdir={},workdir={}",
            upper.display(),
            work.display()
        );
        let (src, target, fstype, data) = (
            std::ffi::CString::new("overlay").map_err(io::Error::other)?,
            cstring(&rootfs)?,
            std::ffi::CString::new("overlay").map_err(io::Error::other)?,
            std::ffi::CString::new(opts).map_err(io::Error::other)?,
        );
        // SAFETY: plain syscall on NUL-terminated strings that outlive it.
        let rc = unsafe {
            libc::mount(
                src.as_ptr(),
                target.as_ptr(),
                fstype.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                data.as_ptr().cast(),
            )
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::other(format!(
                "cannot mount the image's overlay on {}: {e}",
                rootfs.display()
            )));
        }
        let config = serde_json::to_vec_pretty(&config_json(c, &rootfs)).map_err(io::Error::other)?;
        fs::write(dir.join("config.json"), config)?;
        Ok(Bundle { dir })
    }
}

/// Unmounts a workload's overlay and removes its bundle (after it ended, or before it starts
/// again).
pub fn cleanup_bundle(record_dir: &Path) {
    let dir = bundle_dir(record_dir);
    let rootfs = dir.join("rootfs");
    if let Ok(target) = cstring(&rootfs) {
        // SAFETY: plain syscall; EINVAL (not mounted) and ENOENT are fine.
        unsafe {
            libc::umount2(target.as_ptr(), libc::MNT_DETACH);
        }
    }
    let _ = fs::remove_dir_all(&dir);
}

/// Deletes the runtime's record of workload `id`'s container (the runtime may have been killed
/// with it), then its bundle.
pub fn cleanup(runtime: &Path, data_dir: &Path, record_dir: &Path, id: u64) {
    let _ = std::process::Command::new(runtime)
        .arg("--root")
        .arg(state_dir(data_dir))
        .args(["delete", "--force", &container_id(id)])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    cleanup_bundle(record_dir);
}

/// The command that runs workload `id`'s container in the foreground (kept after it exits, so
/// that the runtime never races the server for the cgroup; [`cleanup`] deletes it).
pub fn run_command(runtime: &Path, data_dir: &Path, bundle: &Bundle, id: u64) -> Vec<String> {
    vec![
        runtime.to_string_lossy().to_string(),
        "--root".into(),
        state_dir(data_dir).to_string_lossy().to_string(),
        "run".into(),
        "--keep".into(),
        "--bundle".into(),
        bundle.dir.to_string_lossy().to_string(),
        container_id(id),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_lines_become_oci_rules() {
        assert_eq!(
            device_rule("c 195:0 rwm").unwrap(),
            json!({"allow": true, "type": "c", "major": 195, "minor": 0, "access": "rwm"})
        );
        assert_eq!(
            device_rule("c 136:* rwm").unwrap(),
            json!({"allow": true, "type": "c", "major": 136, "access": "rwm"})
        );
        assert!(device_rule("nonsense").is_none());
    }

    #[test]
    fn entry_paths_never_leave_the_root() {
        assert_eq!(clean(Path::new("./usr/bin/x")), Some(PathBuf::from("usr/bin/x")));
        assert_eq!(clean(Path::new("/etc/passwd")), Some(PathBuf::from("etc/passwd")));
        assert_eq!(clean(Path::new("a/../../etc")), None);
    }

    #[test]
    fn digests_are_checked_for_form() {
        assert!(hex_of("sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef").is_ok());
        assert!(hex_of("sha512:00").is_err());
        assert!(hex_of("sha256:../../etc/passwd").is_err());
    }
}
