//! # tessera-testdb
//!
//! Test support for everything that runs against PostgreSQL (and the temporary directories of
//! every integration test, [`TempDir`], and their test TLS certificates,
//! [`test_certificates`]): a private cluster (`initdb` in a
//! temporary directory, `postgres` on a free loopback port, trust authentication for the
//! `postgres` role), and a fresh database per test (`CREATE DATABASE`), so that tests run in
//! parallel without seeing each other's rows.
//!
//! [`database_url`] uses one cluster per test binary, started on first use. Tests that stop and
//! start PostgreSQL (an outage) start a [`Cluster`] of their own. `initdb` runs once per
//! machine: clusters are copies of an initialised template. Clusters live in `/dev/shm` when
//! it has room (or `$TESSERA_PG_DIR`), else in the temporary directory.
//!
//! PostgreSQL refuses to run as root. Run as an ordinary user, the cluster runs as that user;
//! run as root (as CI does), `initdb` and `postgres` run as the `postgres` system user that
//! Debian's package creates, in a directory given to it. The binaries are found in
//! `$TESSERA_PG_BIN`, else in the newest `/usr/lib/postgresql/*/bin` (Debian's layout).
//!
//! A cluster dies with the test binary: `postgres` is started with a parent-death signal
//! (`SIGQUIT`, PostgreSQL's immediate shutdown) from a thread that lives as long as the
//! process, so nothing outlives a test run, even one that is killed. Data directories of runs
//! that are gone are removed by the next run.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

/// How long a cluster may take to accept connections.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// The database a parametrised test runs on (see [`each_database!`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Db {
    /// The embedded default: SQLite in the server's data directory.
    Sqlite,
    /// A fresh database on this test binary's PostgreSQL cluster.
    Postgres,
}

impl Db {
    /// What `tessera serve --database` takes: `None` for SQLite,
    /// the URL of a fresh database for PostgreSQL.
    pub fn url(self) -> Option<String> {
        match self {
            Db::Sqlite => None,
            Db::Postgres => Some(database_url()),
        }
    }
}

/// Expands test functions that take a [`Db`] into one test per database, in modules `sqlite`
/// and `postgres`, each with the given test attribute:
///
/// ```text
/// async fn creates_and_cancels(db: Db) { … }
/// tessera_testdb::each_database!(#[tokio::test] async creates_and_cancels);
/// fn restarts(db: Db) { … }
/// tessera_testdb::each_database!(#[test] restarts);
/// ```
#[macro_export]
macro_rules! each_database {
    (#[$attr:meta] async $($name:ident),+ $(,)?) => {
        mod sqlite {
            $(#[$attr] async fn $name() { super::$name($crate::Db::Sqlite).await })+
        }
        mod postgres {
            $(#[$attr] async fn $name() { super::$name($crate::Db::Postgres).await })+
        }
    };
    (#[$attr:meta] $($name:ident),+ $(,)?) => {
        mod sqlite {
            $(#[$attr] fn $name() { super::$name($crate::Db::Sqlite) })+
        }
        mod postgres {
            $(#[$attr] fn $name() { super::$name($crate::Db::Postgres) })+
        }
    };
}

/// A URL of a fresh, empty database on this test binary's cluster (started on first use).
pub fn database_url() -> String {
    static SHARED: OnceLock<Cluster> = OnceLock::new();
    SHARED.get_or_init(Cluster::start).create_database()
}

/// A PostgreSQL cluster of this process: stopped and removed on drop, killed with the process.
pub struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    /// The user `postgres` runs as when this process is root.
    run_as: Option<(u32, u32)>,
    postmaster: Mutex<Option<Child>>,
    databases: AtomicU32,
}

impl Cluster {
    /// Initialises a cluster in a new temporary directory and starts it on a free port.
    ///
    /// Panics (with what to do) when PostgreSQL is not installed or does not start.
    pub fn start() -> Cluster {
        static CLUSTERS: AtomicU32 = AtomicU32::new(0);
        let base = base_dir();
        remove_stale_dirs(&base);
        let bin = bin_dir();
        let run_as = run_as();
        let template = template(&base, &bin, run_as);
        let dir = base.join(format!(
            "tessera-pg-{}-{}",
            std::process::id(),
            CLUSTERS.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the cluster's directory");
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("give the cluster's directory to postgres");
        }
        // A copy of an initialised cluster: `initdb` once per machine, not once per test binary.
        let out = Command::new("cp")
            .arg("-a")
            .arg(template.join("data"))
            .arg(dir.join("data"))
            .output()
            .expect("run cp");
        assert!(
            out.status.success(),
            "copying the template cluster: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port();
        let c = Cluster {
            bin,
            dir,
            port,
            run_as,
            postmaster: Mutex::new(None),
            databases: AtomicU32::new(0),
        };
        c.resume();
        c
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of database `name` (trust authentication: no password).
    pub fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// Creates a new, empty database and returns its URL.
    pub fn create_database(&self) -> String {
        let name = format!("t{}", self.databases.fetch_add(1, Ordering::Relaxed));
        self.sql(&format!("CREATE DATABASE {name}"))
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
        self.url(&name)
    }

    /// Runs SQL on the `postgres` database with `psql`; its output, or why it failed.
    pub fn sql(&self, sql: &str) -> Result<String, String> {
        self.sql_on("postgres", sql)
    }

    /// Runs SQL on database `db` with `psql` (unaligned, tuples only).
    pub fn sql_on(&self, db: &str, sql: &str) -> Result<String, String> {
        let out = Command::new(self.bin.join("psql"))
            .args([
                "-X",
                "-w",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
            ])
            .args(["-p", &self.port.to_string(), "-d", db, "-c", sql])
            .env_remove("PGPASSWORD")
            .output()
            .map_err(|e| format!("cannot run psql: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }

    /// Stops PostgreSQL (fast shutdown: sessions are ended, nothing committed is lost) and
    /// waits until it has exited.
    pub fn stop(&self) {
        if let Some(mut child) = self.postmaster.lock().unwrap().take() {
            // SAFETY: signalling a child process this cluster started and has not reaped.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
            let _ = child.wait();
        }
    }

    /// Starts PostgreSQL again on the same directory and port (after [`stop`](Self::stop)),
    /// and waits until it accepts connections.
    pub fn resume(&self) {
        let mut guard = self.postmaster.lock().unwrap();
        assert!(guard.is_none(), "the cluster is running");
        let mut cmd = as_user(Command::new(self.bin.join("postgres")), self.run_as);
        cmd.current_dir(&self.dir)
            .args(["-D", "data", "-p", &self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", self.dir.display()))
            // A test cluster: a crash of the machine loses it anyway, so skip the disk flushes.
            .args([
                "-c",
                "fsync=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=400",
            ])
            .args(["-c", "log_min_messages=fatal"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = spawn_with_parent_death_signal(cmd);
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                panic!("postgres exited at start ({status}): {err}");
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() && self.sql("SELECT 1").is_ok() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "postgres did not accept connections within {READY_WITHIN:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // Its log goes nowhere once it runs (a full pipe must never block it).
        drop(child.stderr.take());
        *guard = Some(child);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Where PostgreSQL's server binaries are.
fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TESSERA_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, bin): &(u32, PathBuf)| bin.join("postgres").exists() && bin.join("initdb").exists())
        .collect();
    versions.sort();
    match versions.pop() {
        Some((_, bin)) => bin,
        None => panic!(
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/postgres): install Debian's \
             `postgresql` package (scripts/test.sh does so when run as root) or set TESSERA_PG_BIN"
        ),
    }
}

/// The `postgres` user's ids when this process is root (PostgreSQL refuses to run as root).
fn run_as() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let name = c"postgres";
    // SAFETY: getpwnam reads a NUL-terminated name and returns a pointer to static storage or
    // NULL; it is read at once, before any other call could overwrite it.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(
        !pw.is_null(),
        "running as root, the cluster must run as the `postgres` user, which does not exist: install \
         Debian's `postgresql` package"
    );
    // SAFETY: `pw` is non-null and points to a valid passwd record.
    Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
}

fn as_user(mut cmd: Command, run_as: Option<(u32, u32)>) -> Command {
    if let Some((uid, gid)) = run_as {
        cmd.uid(uid).gid(gid).env("HOME", "/tmp");
    }
    cmd
}

/// A loopback port nobody listens on now, for a process a test starts (PostgreSQL, etcd, an
/// API server, a kubelet, an OIDC provider) to listen on a moment later.
///
/// It is taken below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`), not from
/// `bind(…:0)`: a port from the ephemeral range is free when asked, but any outgoing
/// connection (an API server's to its etcd, a client's to the server) may be given it before
/// the process binds it, and the process then fails with "address already in use" (it did,
/// in CI). Below that range only listeners compete, and every test picks its listeners here:
/// candidates run up from a place drawn once per process from its id and the clock, and each
/// is handed out at most once per process, and only if it binds now.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    static START: OnceLock<u32> = OnceLock::new();
    let (lo, hi) = non_ephemeral_range();
    let span = u32::from(hi - lo);
    let start = *START.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        std::process::id().wrapping_mul(7919) ^ nanos
    });
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = lo + (start.wrapping_add(n) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Ports a test may listen on: the 10,000 below the start of the ephemeral range.
fn non_ephemeral_range() -> (u16, u16) {
    let start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    (start.saturating_sub(10_000).max(1024), start.max(2048))
}

/// Spawns `cmd` from a thread that lives as long as the process, with `SIGQUIT` as its
/// parent-death signal: Linux sends it when the spawning thread exits, that is, with the
/// process.
fn spawn_with_parent_death_signal(mut cmd: Command) -> Child {
    type Job = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("testdb-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
                // Never return: the children's parent-death signal follows this thread.
                loop {
                    std::thread::park();
                }
            })
            .expect("start the spawner thread");
        Mutex::new(tx)
    });
    // SAFETY: the closure runs in the child between fork and exec and only calls prctl and
    // getppid, which are async-signal-safe. std runs it after switching user, so the setting
    // is not reset by the change of credentials.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGQUIT) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() == 1 {
                // The parent died before the setting took effect.
                return Err(std::io::Error::other("the test process is gone"));
            }
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    spawner
        .lock()
        .unwrap()
        .send((cmd, tx))
        .expect("the spawner thread runs");
    rx.recv().expect("the spawner thread answers").expect("start postgres")
}

/// Where clusters live: `$TESSERA_PG_DIR`, else `/dev/shm` when it has room (a cluster in
/// memory starts and creates databases several times faster than on a busy disk), else the
/// temporary directory.
fn base_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TESSERA_PG_DIR") {
        return PathBuf::from(dir);
    }
    let shm = PathBuf::from("/dev/shm");
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let path = c"/dev/shm";
    // SAFETY: statvfs writes into the struct it is given; the path is NUL-terminated.
    let ok = unsafe { libc::statvfs(path.as_ptr(), &mut st) } == 0;
    let free = st.f_bavail as u64 * st.f_frsize as u64;
    if ok && free >= 2 << 30 {
        shm
    } else {
        std::env::temp_dir()
    }
}

/// An initialised cluster to copy (made once, by whichever test process comes first).
fn template(base: &std::path::Path, bin: &std::path::Path, run_as: Option<(u32, u32)>) -> PathBuf {
    let version = bin
        .parent()
        .and_then(|p| p.file_name())
        .and_then(|v| v.to_str())
        .unwrap_or("pg")
        .to_string();
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let template = base.join(format!("tessera-pg-template-{version}-{uid}"));
    // One maker per process; other processes race through the rename below.
    static MAKING: Mutex<()> = Mutex::new(());
    let _making = MAKING.lock().unwrap();
    if template.join("data").join("PG_VERSION").exists() {
        return template;
    }
    let scratch = base.join(format!("tessera-pg-{}-template", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).expect("create the template's directory");
    if let Some((uid, gid)) = run_as {
        std::os::unix::fs::chown(&scratch, Some(uid), Some(gid)).expect("give the template's directory to postgres");
    }
    let out = as_user(Command::new(bin.join("initdb")), run_as)
        .current_dir(&scratch)
        .args([
            "-D",
            "data",
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ])
        .output()
        .expect("run initdb");
    assert!(
        out.status.success(),
        "initdb failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Another process may have made one meanwhile: either is fine.
    if std::fs::rename(&scratch, &template).is_err() {
        let _ = std::fs::remove_dir_all(&scratch);
    }
    template
}

/// Removes the directories of clusters whose test process has exited.
fn remove_stale_dirs(base: &std::path::Path) {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        for entry in std::fs::read_dir(base).into_iter().flatten().flatten() {
            let name = entry.file_name();
            let Some(pid) = name
                .to_str()
                .and_then(|n| n.strip_prefix("tessera-pg-"))
                .and_then(|rest| rest.split('-').next())
                .and_then(|p| p.parse::<libc::pid_t>().ok())
            else {
                continue;
            };
            if !alive(pid) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    });
}

fn alive(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 || *libc::__errno_location() != libc::ESRCH }
}

/// A fresh temporary directory, `tessera-{tag}-{pid}-{nanos}`, removed on drop. The tag names
/// the test: tests of one binary run at once, in one process.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let p = std::env::temp_dir().join(format!("tessera-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Makes in `dir` a test CA named `ca_name` (`ca.pem`) and a server certificate for 127.0.0.1
/// signed by it (`cert.pem`, its key `key.pem`), valid for a day, with openssl; their paths
/// `(ca, cert, key)`.
pub fn test_certificates(dir: &Path, ca_name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let script = format!(
        "set -e; cd {d}; \
         openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN={ca_name} -keyout ca.key -out ca.pem 2>/dev/null; \
         openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout key.pem -out server.csr 2>/dev/null; \
         printf 'subjectAltName=IP:127.0.0.1\\nbasicConstraints=CA:FALSE\\nextendedKeyUsage=serverAuth\\n' > ext.cnf; \
         openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -extfile ext.cnf -out cert.pem 2>/dev/null",
        d = dir.display()
    );
    let ok = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .output()
        .expect("bash and openssl (Debian package openssl)");
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    (dir.join("ca.pem"), dir.join("cert.pem"), dir.join("key.pem"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn databases_are_fresh_and_separate() {
        let a = database_url();
        let b = database_url();
        assert_ne!(a, b);
        let cluster = Cluster::start();
        let db = cluster.create_database();
        let name = db.rsplit('/').next().unwrap();
        cluster.sql_on(name, "CREATE TABLE t (x BIGINT)").unwrap();
        cluster.sql_on(name, "INSERT INTO t VALUES (41), (1)").unwrap();
        assert_eq!(cluster.sql_on(name, "SELECT SUM(x) FROM t").unwrap(), "42");
        let other = cluster.create_database();
        let other = other.rsplit('/').next().unwrap();
        assert!(
            cluster.sql_on(other, "SELECT * FROM t").is_err(),
            "a fresh database has no tables"
        );
    }

    #[test]
    fn a_cluster_stops_and_resumes_with_its_data() {
        let cluster = Cluster::start();
        let db = cluster.create_database();
        let name = db.rsplit('/').next().unwrap().to_string();
        cluster
            .sql_on(&name, "CREATE TABLE t (x BIGINT); INSERT INTO t VALUES (7)")
            .unwrap();
        cluster.stop();
        assert!(cluster.sql("SELECT 1").is_err(), "stopped");
        assert!(TcpStream::connect(("127.0.0.1", cluster.port())).is_err());
        cluster.resume();
        assert_eq!(cluster.sql_on(&name, "SELECT x FROM t").unwrap(), "7");
        let dir = cluster.dir.clone();
        drop(cluster);
        assert!(!dir.exists(), "removed on drop");
    }
}
