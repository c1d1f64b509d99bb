//! `tessera serve`: the control plane on the embedded defaults (SQLite in `./tessera-data`,
//! the simulated `seed` fleet, API and console on 127.0.0.1:8080), with `--backend local` on
//! this machine's GPUs (`--fake-gpus N`: a documented test mode with fake GPUs and real
//! processes), with `--backend kubernetes` on a Kubernetes cluster's GPU nodes, and on
//! PostgreSQL with `--database postgres://…` (replicas elect a leader).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use tessera_server::{ServerConfig, start};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// The simulated fleet (`--fleet`).
    Sim,
    /// This machine's NVIDIA GPUs through NVML; workloads are local processes.
    Local,
    /// A Kubernetes cluster with the NVIDIA GPU Operator (in-cluster configuration or
    /// KUBECONFIG): GPU nodes from Node objects, workloads as pods bound by Tessera.
    Kubernetes,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum SimModeArg {
    Exact,
    Operator,
}

#[derive(Args)]
pub struct ServeArgs {
    /// Where the admin token lives, and the SQLite database when `--database` is not given.
    #[arg(long, default_value = "./tessera-data", env = "TESSERA_DATA_DIR")]
    data_dir: PathBuf,
    /// Keep state in PostgreSQL (`postgres://user:password@host:port/database`) instead of
    /// SQLite in `--data-dir`; replicas pointing at one database elect a leader.
    #[arg(long, env = "TESSERA_DATABASE", hide_env_values = true)]
    database: Option<String>,
    /// The URL other replicas reach this one at, to forward writes when it leads (default:
    /// the scheme and the address it listens on).
    #[arg(long, env = "TESSERA_ADVERTISE_URL")]
    advertise_url: Option<String>,
    /// This replica's id in the lease and `tessera status` (default: the host name and a
    /// random suffix).
    #[arg(long, env = "TESSERA_REPLICA_ID")]
    replica_id: Option<String>,
    /// How long the leader's lease lasts after each renewal, in milliseconds; it is renewed
    /// every third of that, and a follower takes over within about this long after the
    /// leader dies.
    #[arg(long, default_value_t = 3000)]
    lease_ms: u64,
    /// `seed`, `synthetic:NODES`, or a TOML fleet file (see fleets/seed.toml); the simulated
    /// backend only (the local backend's fleet is this machine).
    #[arg(long, default_value = "seed")]
    fleet: String,
    /// `sim` (simulated fleet), `local` (this machine's GPUs through NVML; exits with one line
    /// when there is no NVIDIA driver) or `kubernetes` (a cluster with the NVIDIA GPU Operator,
    /// through the in-cluster configuration or KUBECONFIG).
    #[arg(long, value_enum, default_value_t = BackendArg::Sim)]
    backend: BackendArg,
    /// Test mode of `--backend local`: N fake GPUs (H100 80GB, MIG off) instead of NVML, real
    /// processes. For machines without a GPU.
    #[arg(long, value_name = "N")]
    fake_gpus: Option<u32>,
    /// With `--fake-gpus`: these fake GPUs (indices, comma-separated) start in MIG mode, the
    /// others not (a machine whose GPUs are in different MIG modes).
    #[arg(long, value_name = "GPUS", value_delimiter = ',')]
    fake_mig: Vec<u32>,
    /// Node name of this machine with `--backend local` (default: the host name).
    #[arg(long)]
    node: Option<String>,
    /// `--backend local`: workload ID runs as uid and gid FIRST + ID % (LAST - FIRST + 1) of
    /// this range (none of them root or this server's uid; keep it clear of real users).
    #[arg(long, value_name = "FIRST-LAST", default_value = tessera_backend_local::isolation::DEFAULT_UID_RANGE)]
    local_uid_range: String,
    /// `--backend local`, development only: run workloads as this server's own user (root if it
    /// runs as root) instead of users of their own. Workloads can then read the data directory
    /// (the admin token, the database) and signal the server and each other.
    #[arg(long)]
    local_allow_root: bool,
    /// `--backend local`: where each workload gets its own directory (WORK_DIR/ID, 0700, its
    /// user's). Default: DATA_DIR's sibling `DATA_DIR-work`.
    #[arg(long, value_name = "DIR")]
    local_work_dir: Option<PathBuf>,
    /// `--backend local`: most output kept per workload log, in MiB; later output is
    /// discarded, with a note at the end of the log.
    #[arg(long, default_value_t = 64, value_name = "MIB")]
    local_log_cap_mib: u64,
    /// `--backend local`: most processes and threads one workload may have at once (its
    /// cgroup's pids limit; 0: no limit).
    #[arg(long, default_value_t = 4096, value_name = "N")]
    local_pids_max: u64,
    /// `--backend local`: each workload in a mount namespace of its own (read-only root, private
    /// /tmp, /var/tmp and /dev/shm, the data directory hidden, only its own work directory
    /// shown): `auto` when the host allows it (a warning says why not), `required` (refuse to
    /// start without it) or `off`.
    #[arg(long, default_value = "auto", value_name = "MODE", value_parser = parse_sandbox)]
    local_sandbox: tessera_backend_local::SandboxMode,
    /// `--backend local`: workloads that name an image run as containers, from this OCI image
    /// layout (fill it with `skopeo copy docker://IMAGE oci:DIR:IMAGE`; Tessera pulls nothing),
    /// through runc or crun, in pid, mount, IPC, UTS and network namespaces of their own, with
    /// the limits, user and GPUs of any local workload. Without it such workloads are refused.
    #[arg(long, value_name = "DIR")]
    local_images: Option<PathBuf>,
    /// `--backend local`: the OCI runtime that runs containers (default: runc, else crun, on
    /// PATH).
    #[arg(long, value_name = "PATH")]
    local_oci_runtime: Option<PathBuf>,
    /// `--backend local`: a container's network: `private` (a namespace of its own with only
    /// loopback) or `host` (this machine's network: no network boundary between workloads).
    #[arg(long, default_value = "private", value_name = "MODE", value_parser = parse_network)]
    local_container_network: tessera_backend_local::ContainerNetwork,
    /// `--backend local`: where the NVIDIA Container Toolkit's CDI specs are (repeat for more).
    #[arg(long, value_name = "DIR", default_values = ["/etc/cdi", "/var/run/cdi"])]
    local_cdi_dir: Vec<PathBuf>,
    /// `--backend kubernetes`: the node label naming a GPU node's Tessera pool (nodes without it
    /// are in the pool `default`).
    #[arg(long, default_value = "tessera.io/pool")]
    kube_pool_label: String,
    /// `--backend kubernetes`: prefix of the namespaces of tenant projects.
    #[arg(long, default_value = "tessera-")]
    kube_namespace_prefix: String,
    /// `--backend kubernetes`: NAMESPACE/NAME of the GPU Operator MIG manager's ConfigMap.
    #[arg(long, default_value = "gpu-operator/default-mig-parted-config")]
    kube_mig_configmap: String,
    /// `--backend kubernetes`: pools of time-sliced nodes where one GPU may hold several
    /// tenants' fractions (comma-separated). Elsewhere a time-sliced node holds one tenant's
    /// fractions, since the device plugin picks the GPU a pod gets.
    #[arg(long, value_delimiter = ',', value_name = "POOL,...")]
    kube_mixing_pools: Vec<String>,
    /// `--backend kubernetes`: the network topology above the node, lowest level first
    /// (comma-separated), each `NAME=LABEL` (the node label naming the node's domain) or a bare
    /// label key, which is then the level's name; e.g.
    /// `rack=topology.kubernetes.io/rack,block=example.com/spine` or `nvidia.com/gpu.clique`.
    /// Gangs ask for a level by its name (`--topology rack`); `tessera nodes` shows each node's
    /// place.
    #[arg(long, value_delimiter = ',', value_name = "NAME=LABEL,...")]
    kube_topology_levels: Vec<String>,
    /// `--backend kubernetes`: NAMESPACE/SELECTOR of the DCGM exporter's pods (one per GPU
    /// node), read for GPU telemetry.
    #[arg(long, default_value = "gpu-operator/app=nvidia-dcgm-exporter")]
    kube_dcgm_exporter: String,
    /// `--backend kubernetes`: how often the DCGM exporters are read, in milliseconds (at least
    /// 1000; 0: no telemetry).
    #[arg(long, default_value_t = 30_000)]
    kube_telemetry_ms: u64,
    /// `--backend kubernetes`: how long a finished workload's pod is kept after its result is
    /// recorded, for `tessera logs` and `kubectl logs` (its log goes with it), e.g. `1h`, `10m`.
    #[arg(long, default_value = "1h", value_parser = parse_duration_s, value_name = "DURATION")]
    kube_finished_pod_ttl: u64,
    /// `--backend kubernetes`: Tessera's own identity on the cluster, `NAMESPACE/NAME` of its
    /// service account (or a user name). Each tenant namespace then gets a RoleBinding giving it
    /// the `tessera-workloads` ClusterRole there (pods, evictions, logs, the namespace's
    /// deletion), so its cluster-wide role needs none of those (deploy/kubernetes sets it).
    #[arg(long, env = "TESSERA_KUBE_IDENTITY", value_name = "NAMESPACE/NAME")]
    kube_identity: Option<String>,
    /// `--backend kubernetes`: namespaces whose GPU pods Tessera's admission webhook passes
    /// unchanged (the GPU Operator's validators request GPUs there). Everywhere else a GPU
    /// pod outside a Tessera project's namespace is refused.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "gpu-operator,kube-system,tessera-system",
        value_name = "NAMESPACES"
    )]
    kube_admission_exempt: Vec<String>,
    /// `--backend kubernetes`: serve the admission webhook (kubectl workloads through Tessera)
    /// over HTTPS on this address, with `--admission-tls-cert`/`--admission-tls-key`
    /// (`deploy/kubernetes/admission/`). Without it the webhook is served on the main listener,
    /// which must then be HTTPS (`--tls-cert`) for the API server to call it.
    #[arg(long, requires_all = ["admission_tls_cert", "admission_tls_key"], value_name = "ADDR")]
    admission_listen: Option<SocketAddr>,
    /// The admission webhook's serving certificate chain (PEM).
    #[arg(long, requires = "admission_listen", value_name = "FILE")]
    admission_tls_cert: Option<PathBuf>,
    /// The admission webhook's private key (PEM).
    #[arg(long, requires = "admission_listen", value_name = "FILE")]
    admission_tls_key: Option<PathBuf>,
    /// Address of the API and the console.
    #[arg(long, default_value = "127.0.0.1:8080", env = "TESSERA_LISTEN")]
    listen: SocketAddr,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Shared-pool placement policy: tessera, fgd, bestfit, random.
    #[arg(long, default_value = "tessera")]
    policy: String,
    /// How the simulated backend behaves: `exact` (creates MIG instances at the engine's
    /// slices and runs workloads on exactly the devices named, as NVML does) or `operator`
    /// (re-lays out a whole GPU at once and only while idle, and picks devices itself from a
    /// per-node count, as on a Kubernetes cluster with the NVIDIA GPU Operator).
    #[arg(long, value_enum, default_value_t = SimModeArg::Exact)]
    sim_mode: SimModeArg,
    /// Simulated time to partition a GPU, in milliseconds (default: 0 in `exact` mode, 2000 in
    /// `operator` mode).
    #[arg(long)]
    sim_mig_partition_ms: Option<u64>,
    /// How often the backend reports telemetry, in milliseconds (simulated and local; at least
    /// 100). 0 on the simulated backend: it reports none.
    #[arg(long, default_value_t = 5000)]
    sim_telemetry_ms: u64,
    /// How often the backend is reconciled with what Tessera expects, in seconds.
    #[arg(long, default_value_t = 30)]
    reconcile_s: u64,
    /// Grace period given to a workload being stopped, in seconds.
    #[arg(long, default_value_t = 30)]
    grace_s: u64,
    /// Price table for usage reports (TOML: `currency = "EUR"` and a `[per_unit_hour]` table
    /// keyed by pool or pool/MODEL).
    #[arg(long)]
    prices: Option<PathBuf>,
    /// Requests per second allowed per API token (bursts of twice that); 0 = no limit.
    #[arg(long, default_value_t = 500.0)]
    rate_limit: f64,
    /// Serve HTTPS: certificate chain (PEM); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// Serve HTTPS: private key (PEM); needs --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Single sign-on settings (TOML: issuer, audience, algorithms, leeway_s, [[mapping]]).
    #[arg(long)]
    oidc: Option<PathBuf>,
    /// Minimum runtime before a workload may be preempted, in seconds.
    #[arg(long, default_value_t = 60)]
    min_runtime_s: u64,
    /// A priority class's own minimum runtime before its work may be preempted, longer than
    /// --min-runtime-s: `CLASS=DURATION` such as `opportunistic=10m` (repeatable).
    #[arg(long = "min-runtime", value_name = "CLASS=DURATION", value_parser = parse_class_duration)]
    min_runtime: Vec<(String, u64)>,
    /// A request within its tenant's guaranteed share takes capacity back from other tenants'
    /// borrowed work only after waiting this long (capacity often frees by itself sooner).
    #[arg(long, default_value = "5m", value_parser = parse_duration_s)]
    reclaim_after: u64,
    /// A priority class preempts lower ones only after waiting this long (capacity often
    /// frees by itself sooner): `CLASS=DURATION` such as `high=2m` (repeatable).
    #[arg(long = "preempt-after", value_name = "CLASS=DURATION", value_parser = parse_class_duration)]
    preempt_after: Vec<(String, u64)>,
    /// At most this many reservations with a start per pool at once: a multi-node gang, or a
    /// request of whole GPUs, that waited past the backfill window holds the nodes where it
    /// starts soonest, and only work that ends by then is placed there meanwhile. More serve
    /// several large requests side by side; each idles what no short work can fill.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    holds_per_pool: u16,
    /// The rules for multi-node gangs, for fleets whose work comes with durations (estimates
    /// or limits): every blocked gang holds nodes at once and moves its hold where it starts
    /// sooner, gangs before single-node work across tenants, reclaim and preemption throw away
    /// at most 10 % of the GPU-time the waiting job waits, whole-GPU work goes where it ends
    /// with the work already there. On the Philly trace they cut 12–32-GPU gangs' waits to
    /// 0.23–0.5 of the best baseline's; where much work has no duration it cannot backfill held nodes
    /// (`on` or `off`).
    #[arg(long, value_enum, default_value_t = Switch::Off)]
    gang_rules: Switch,
    /// Consolidation: move work marked `movable` so that a request waiting for fragmented
    /// capacity fits (`on` or `off`).
    #[arg(long, value_enum, default_value_t = Switch::On)]
    consolidation: Switch,
    /// The disruption budget of consolidation: at most this many moves of one tenant's work
    /// in any hour.
    #[arg(long, default_value_t = 2)]
    consolidation_budget: u32,
    /// Also serve Prometheus metrics (`/metrics`) on this address, without a credential: keep it
    /// on a private network. On the API address `/metrics` needs a `metrics` token.
    #[arg(long, env = "TESSERA_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// An origin whose web pages may call the API from a browser (CORS), such as
    /// https://portal.example.com; repeat for more. Default: none (the console is same-origin).
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    cors_origins: Vec<String>,
    /// What happens to running work on a GPU that fails (critical XID, lost, failed
    /// partition): `leave` it running and tell the tenant, or `requeue` batch work (services
    /// are left running and told). The GPU gets no new work either way.
    #[arg(long, value_enum, default_value_t = OnGpuFailure::Leave)]
    on_gpu_failure: OnGpuFailure,
    /// Rolling upgrades on the simulated backend: how long a node's upgrade takes (90s, 20m,
    /// 1h). Default: off, a rollout waits for `tessera node done NODE` (the external hook).
    #[arg(long, value_parser = parse_duration_s)]
    sim_upgrade_duration: Option<u64>,
    /// For tests: sample the console's history every this many milliseconds instead of every
    /// minute on the minute (each sample is still of its minute), so that a test sees minutes
    /// stored without waiting for them.
    #[arg(long, hide = true, value_name = "MS")]
    sample_every_ms: Option<u64>,
}

/// A flag's duration (90s, 20m, 1h30m) in seconds.
fn parse_duration_s(s: &str) -> Result<u64, String> {
    crate::cli::parse_duration(s)
        .map(|d| d as u64)
        .map_err(|e| e.to_string().replace("--duration: ", ""))
}

/// `CLASS=DURATION` (a priority class and a duration in seconds).
fn parse_class_duration(s: &str) -> Result<(String, u64), String> {
    let Some((class, d)) = s.split_once('=') else {
        return Err(format!("`{s}` is not CLASS=DURATION (example: opportunistic=10m)"));
    };
    let d = parse_duration_s(d)?;
    Ok((class.trim().to_string(), d))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Switch {
    On,
    Off,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum OnGpuFailure {
    Leave,
    Requeue,
}

/// A flag's `NAMESPACE/REST` value, both parts non-empty; `what` names the rest in the error.
fn namespaced(flag: &str, what: &str, value: &str) -> Result<(String, String)> {
    match value.split_once('/') {
        Some((ns, rest)) if !ns.is_empty() && !rest.is_empty() => Ok((ns.to_string(), rest.to_string())),
        _ => anyhow::bail!("{flag}: give NAMESPACE/{what}, not {value:?}"),
    }
}

pub fn run(mut a: ServeArgs) -> Result<()> {
    // Absolute from here on: what runs in another working directory (a local workload's
    // wrapper, which writes its exit file there) must find the same directory.
    a.data_dir = std::path::absolute(&a.data_dir).with_context(|| format!("--data-dir {}", a.data_dir.display()))?;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,sqlx=warn".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match a.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
    if a.fake_gpus.is_some() && a.backend != BackendArg::Local {
        anyhow::bail!("--fake-gpus is a test mode of --backend local");
    }
    let sim_fleet = match a.backend {
        BackendArg::Sim => Some(crate::bench::load_fleet(&a.fleet)?),
        BackendArg::Local | BackendArg::Kubernetes => None,
    };
    let (mig_namespace, mig_configmap) = namespaced("--kube-mig-configmap", "NAME", &a.kube_mig_configmap)?;
    let (dcgm_namespace, dcgm_selector) = namespaced(
        "--kube-dcgm-exporter",
        "SELECTOR (e.g. gpu-operator/app=nvidia-dcgm-exporter)",
        &a.kube_dcgm_exporter,
    )?;
    let topology_levels = a
        .kube_topology_levels
        .iter()
        .map(|l| tessera_backend_kube::fleet::TopologyLevel::parse(l))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("--kube-topology-levels: {e}"))?;
    let kube_cfg = tessera_backend_kube::KubeConfig {
        pool_label: a.kube_pool_label.clone(),
        topology_levels,
        namespace_prefix: a.kube_namespace_prefix.clone(),
        mig_namespace,
        mig_configmap,
        mixing_pools: a.kube_mixing_pools.iter().cloned().collect(),
        dcgm_namespace,
        dcgm_selector,
        telemetry_every: (a.kube_telemetry_ms > 0).then(|| Duration::from_millis(a.kube_telemetry_ms.max(1000))),
        finished_pod_ttl: Duration::from_secs(a.kube_finished_pod_ttl),
        identity: a.kube_identity.clone(),
        admission_exempt: a.kube_admission_exempt.iter().cloned().collect(),
        ..Default::default()
    };
    let prices = match &a.prices {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("--prices: cannot read {}", p.display()))?;
            toml::from_str::<tessera_server::usage::Prices>(&text)
                .map_err(|e| anyhow::anyhow!("{}: {}", p.display(), e.message().replace('\n', " ")))?
        }
        None => Default::default(),
    };
    let oidc = match &a.oidc {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("--oidc: cannot read {}", p.display()))?;
            Some(
                toml::from_str::<tessera_server::oidc::OidcConfig>(&text)
                    .map_err(|e| anyhow::anyhow!("{}: {}", p.display(), e.message().replace('\n', " ")))?,
            )
        }
        None => None,
    };
    let mut govern = tessera_sched::cycle::GovernConfig {
        min_runtime_ms: a.min_runtime_s as i64 * 1000,
        reclaim_after_ms: a.reclaim_after as i64 * 1000,
        ..Default::default()
    };
    govern.holds_per_pool = usize::from(a.holds_per_pool);
    if a.gang_rules == Switch::On {
        govern = govern.with_gang_rules();
    }
    govern.consolidation.enabled = a.consolidation == Switch::On;
    govern.consolidation.moves_per_tenant_per_hour = a.consolidation_budget;
    let known: Vec<String> = govern.classes.iter().map(|c| c.name.clone()).collect();
    for (flag, values) in [("--min-runtime", &a.min_runtime), ("--preempt-after", &a.preempt_after)] {
        for (class, s) in values {
            let Some(c) = govern.classes.iter_mut().find(|c| c.name == *class) else {
                anyhow::bail!("{flag}: no priority class `{class}` (there are {})", known.join(", "));
            };
            let ms = Some(*s as i64 * 1000);
            match flag {
                "--min-runtime" => c.min_runtime_ms = ms,
                _ => c.preempt_after_ms = ms,
            }
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(async move {
        let (fleet, backend, serving) = match sim_fleet {
            Some(fleet) => {
                let serving = format!(
                    "the simulated fleet ({} GPUs, {} mode)",
                    fleet.gpu_count(),
                    match a.sim_mode {
                        SimModeArg::Exact => "exact",
                        SimModeArg::Operator => "operator",
                    }
                );
                let mode = match a.sim_mode {
                    SimModeArg::Exact => tessera_backend_sim::SimMode::Exact,
                    SimModeArg::Operator => tessera_backend_sim::SimMode::Operator,
                };
                let telemetry = match a.sim_telemetry_ms {
                    0 => Duration::ZERO,
                    ms => Duration::from_millis(ms.max(100)),
                };
                let sim = crate::compose::sim_backend(&fleet, mode, a.sim_mig_partition_ms, telemetry);
                let backend: Arc<dyn tessera_backend::Backend> = sim;
                (fleet, backend, serving)
            }
            None if a.backend == BackendArg::Kubernetes => {
                let (b, fleet) = tessera_backend_kube::connect_default(kube_cfg)
                    .await
                    .map_err(|e| anyhow::anyhow!("--backend kubernetes: {e}"))?;
                let what = format!(
                    "the Kubernetes cluster's GPU nodes ({} GPUs on {} nodes)",
                    fleet.gpu_count(),
                    fleet.nodes.len()
                );
                let backend: Arc<dyn tessera_backend::Backend> = Arc::new(b);
                (fleet, backend, what)
            }
            None => {
                let iso = crate::local::Isolation {
                    uid_range: a.local_uid_range.clone(),
                    allow_root: a.local_allow_root,
                    work_dir: a.local_work_dir.clone(),
                    log_cap_mib: a.local_log_cap_mib,
                    pids_max: a.local_pids_max,
                    sandbox: a.local_sandbox,
                    images: a.local_images.clone(),
                    oci_runtime: a.local_oci_runtime.clone(),
                    container_network: a.local_container_network,
                    cdi_dirs: a.local_cdi_dir.clone(),
                };
                let (b, fleet, what) = crate::local::backend(
                    a.fake_gpus,
                    &a.fake_mig,
                    a.node.clone(),
                    &a.data_dir,
                    Duration::from_millis(a.sim_telemetry_ms.max(100)),
                    Duration::from_secs(a.grace_s),
                    &iso,
                )?;
                let backend: Arc<dyn tessera_backend::Backend> = Arc::new(b);
                (fleet, backend, what)
            }
        };
        let cfg = ServerConfig {
            data_dir: a.data_dir.clone(),
            fleet,
            listen: a.listen,
            policy: a.policy,
            grace: Duration::from_secs(a.grace_s),
            reconcile_every: Duration::from_secs(a.reconcile_s.max(1)),
            on_gpu_failure: match a.on_gpu_failure {
                OnGpuFailure::Leave => tessera_server::lifecycle::GpuFailurePolicy::Leave,
                OnGpuFailure::Requeue => tessera_server::lifecycle::GpuFailurePolicy::Requeue,
            },
            sim_upgrade: a.sim_upgrade_duration.map(Duration::from_secs),
            govern,
            gangs_first: a.gang_rules == Switch::On,
            prices,
            rate_limit: a.rate_limit,
            oidc,
            tls: a.tls_cert.clone().zip(a.tls_key.clone()),
            admission: a.admission_listen.map(|addr| tessera_server::AdmissionListener {
                addr,
                cert: a.admission_tls_cert.clone().expect("clap requires it"),
                key: a.admission_tls_key.clone().expect("clap requires it"),
            }),
            cors_origins: a.cors_origins,
            sample_every: a.sample_every_ms.map(|ms| Duration::from_millis(ms.max(10))),
            advertise_url: a.advertise_url.clone(),
            replica_id: a.replica_id.clone(),
            ha: {
                let lease = Duration::from_millis(a.lease_ms.max(500));
                tessera_server::replica::HaSettings {
                    lease,
                    renew_every: lease / 3,
                    ..Default::default()
                }
            },
        };
        let store = crate::compose::open_store(&a.data_dir, a.database.as_deref()).await?;
        let running = start(cfg, store, backend).await?;
        if let Some(t) = &running.admin_token {
            println!("Admin token: {t}");
            println!(
                "(written to {}; it is shown only once)",
                a.data_dir.join("admin-token").display()
            );
        }
        let metrics_task = match a.metrics_listen {
            Some(addr) => {
                let (bound, task) = tessera_server::serve_metrics(running.metrics_app.clone(), addr)
                    .await
                    .map_err(|e| anyhow::anyhow!("--metrics-listen: {e}"))?;
                println!("Prometheus metrics: http://{bound}/metrics");
                Some(task)
            }
            None => None,
        };
        if let Some(addr) = running.admission_addr {
            println!("Admission webhook: https://{addr}/admission/mutate and /admission/validate");
        }
        println!(
            "Tessera is serving {serving}: console http://{0}/  API http://{0}/api/v1",
            running.addr
        );
        if let Some(url) = &a.database {
            let st = running.replica.state();
            println!(
                "Replica {} on PostgreSQL ({}): {}",
                running.replica.id,
                redact(url),
                match (st.role, &st.leader_url) {
                    (tessera_server::replica::Role::Leader, _) => "leading".to_string(),
                    (_, Some(l)) => format!("following the leader at {l}"),
                    (_, None) => "no leader yet".to_string(),
                }
            );
        }
        tracing::info!(addr = %running.addr, "serving");
        running.task.await.context("server task")?.context("server")?;
        // Step down and release the lease, so that another replica takes over at once.
        let _ = tokio::time::timeout(Duration::from_secs(5), running.replica_task).await;
        if let Some(t) = metrics_task {
            t.await.context("metrics server task")?.context("metrics server")?;
        }
        Ok(())
    })
}

/// A database URL without its password.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{user}@{}", &url[..scheme + 3], &url[at + 1..])
        }
        _ => url.to_string(),
    }
}

fn parse_network(s: &str) -> Result<tessera_backend_local::ContainerNetwork, String> {
    match s {
        "private" => Ok(tessera_backend_local::ContainerNetwork::Private),
        "host" => Ok(tessera_backend_local::ContainerNetwork::Host),
        _ => Err(format!("{s:?}: give private or host")),
    }
}

fn parse_sandbox(s: &str) -> Result<tessera_backend_local::SandboxMode, String> {
    tessera_backend_local::SandboxMode::parse(s).ok_or_else(|| format!("{s:?}: give auto, required or off"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn database_urls_lose_their_password() {
        assert_eq!(
            super::redact("postgres://tessera:s3cret@db:5432/tessera"),
            "postgres://tessera@db:5432/tessera"
        );
        assert_eq!(super::redact("postgres://db/tessera"), "postgres://db/tessera");
    }
}
