//! # tessera
//!
//! The `tessera` binary: one executable that is both the server and the command-line client.
//! This crate holds only argument parsing, file I/O and output formatting; the fleet model and
//! the placement engine live in `tessera-model` and `tessera-sched`.
//!
//! `serve` runs the control plane; `run`, `ls`, `describe`, `cancel`, `pools`, `nodes`,
//! `gpus`, `tenants`, `projects`, `token` and `logs` talk to it; `admin recover` issues an
//! admin token through the data directory; `gpu-check` shows this machine's GPUs (and the hidden
//! `device-report` builds the report of `scripts/device-check.sh`); `sim openb`
//! replays the Alibaba trace, `sim philly` the Philly trace under five policies, `bench` measures the engine and the API, `fleet` shows a fleet
//! description and `openapi` prints the API document.

/// mimalloc instead of glibc's malloc: the server allocates on every core for every request,
/// and under `scripts/bench-api.sh` glibc's arenas (`_int_malloc`, `malloc_consolidate`, …)
/// took about a fifth of the server's CPU in `perf`.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod bench;
mod benchapi;
mod cli;
mod client;
mod compose;
mod devreport;
mod fleetcmd;
mod govcli;
mod local;
mod login;
mod opscli;
mod phillycmd;
mod plancmd;
mod serve;
mod sim;
mod timedcmd;
mod upgradecli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "tessera",
    version,
    about = "Tessera: GPU-as-a-service for on-premises NVIDIA fleets"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    common: cli::Common,
}

#[derive(Subcommand)]
enum Command {
    /// Store a credential for --server, in a file readable by you only: a token pasted on
    /// standard input, or with --sso ISSUER a sign-in through the identity provider.
    Login(login::LoginArgs),
    /// Forget the stored credential for --server.
    Logout,
    /// Run the control plane (SQLite + simulated fleet by default).
    Serve(Box<serve::ServeArgs>),
    /// Request GPUs: --gpus N, --mig PROFILE or --fraction MILLI.
    Run(cli::RunArgs),
    /// List workloads.
    Ls(cli::LsArgs),
    /// Show a workload and its timeline with step durations.
    Describe { id: u64 },
    /// Cancel a workload; its capacity returns to the fleet.
    Cancel { id: u64 },
    /// The replicas of the control plane and which one leads.
    Status,
    /// A workload's output (stdout and stderr), from backends that keep it (`local`).
    Logs(cli::LogsArgs),
    /// Pools and their use.
    Pools,
    /// Nodes and their free resources.
    Nodes(cli::FleetFilterArgs),
    /// A compact map of every GPU: slices and holders.
    Gpus(cli::FleetFilterArgs),
    /// GPU health (platform-admin): `health` lists unhealthy GPUs, `clear NODE/GPU` puts one back.
    Gpu {
        #[command(subcommand)]
        cmd: opscli::GpuCmd,
    },
    /// Rolling upgrades of a pool (platform-admin): rollout, status, cancel.
    Upgrade {
        #[command(subcommand)]
        cmd: upgradecli::UpgradeCmd,
    },
    /// Node lifecycle (platform-admin): cordon, drain, maintenance, uncordon; `done` ends a
    /// node's upgrade in a rollout.
    Node {
        #[command(subcommand)]
        cmd: opscli::NodeCmd,
    },
    /// List, create or delete tenants.
    Tenants(cli::TenantsArgs),
    /// List, create or delete projects of a tenant.
    Projects(cli::ProjectsArgs),
    /// API tokens: create (shown once), list, revoke.
    Token {
        #[command(subcommand)]
        cmd: cli::TokenCmd,
    },
    /// The audit log (platform-admin: all; tenant-admin: its tenant).
    Audit(cli::AuditArgs),
    /// Print the OpenAPI 3.1 document of the REST API.
    Openapi,
    /// Tenant quotas per resource class (a pool, pool/MODEL, or project:NAME), in GPU units.
    Quota {
        #[command(subcommand)]
        cmd: govcli::QuotaCmd,
    },
    /// Set or remove a tenant's monthly GPU-unit-hour budget.
    Budget(govcli::BudgetArgs),
    /// Usage report: GPU-unit-hours and cost, allocated and measured (-o csv for CSV).
    Usage(govcli::UsageArgs),
    /// Create or update tenants, projects, quotas and budgets from a YAML file (idempotent).
    Apply(govcli::ApplyArgs),
    /// Simulations: replay public cluster traces through the placement engine.
    Sim {
        #[command(subcommand)]
        what: sim::SimCommand,
    },
    /// Capacity planning: replay a demand (the openb trace, the scenario model, or a usage
    /// ledger) on candidate fleets and find the cheapest that meets a p95 wait target per class.
    Plan(plancmd::PlanArgs),
    /// Benchmarks: the placement engine, and the running server's API.
    Bench {
        #[command(subcommand)]
        what: bench::BenchCommand,
    },
    /// Inspect or validate a fleet description.
    Fleet(fleetcmd::FleetArgs),
    /// Local administration through the data directory (no server or token needed).
    Admin {
        #[command(subcommand)]
        cmd: AdminCmd,
    },
    /// This machine's NVIDIA GPUs through NVML, read-only: discovery and one telemetry sample as
    /// JSON (what `--backend local` would serve). Never changes MIG mode, clocks or settings.
    GpuCheck(local::GpuCheckArgs),
    /// The report of scripts/device-check.sh: compares what it recorded in DIR/raw/ (gpu-check,
    /// nvidia-smi, /metrics and NVML samples, describe, usage) check by check and writes
    /// DIR/report.json; exits 1 when a check failed.
    #[command(hide = true)]
    DeviceReport(devreport::DeviceReportArgs),
}

#[derive(Subcommand)]
enum AdminCmd {
    /// Issue a fresh platform-admin token for an operator who has lost theirs: writes it to
    /// DIR/admin-token (mode 0600), prints it, and records the recovery in the audit log.
    /// Needs write access to the data directory; works while the server runs.
    Recover {
        /// The server's data directory (where the token is written).
        #[arg(long, default_value = "./tessera-data", env = "TESSERA_DATA_DIR")]
        data_dir: std::path::PathBuf,
        /// The replicas' PostgreSQL database, when they run on one (`tessera serve --database`).
        #[arg(long, env = "TESSERA_DATABASE", hide_env_values = true)]
        database: Option<String>,
    },
}

fn main() -> ExitCode {
    // Behave like other command-line tools when the reader of our output goes away
    // (`tessera gpus | head`): end quietly instead of panicking on a broken pipe.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // glibc gives every thread that allocates its own heap arena (up to 8 per core); a server
    // whose tokio workers, blocking pool and SQLite threads all allocate ends up with a dozen
    // half-empty arenas, which doubled the resident size for the same live heap. Two arenas
    // keep allocation contention low on the few threads Tessera runs. MALLOC_ARENA_MAX, when
    // set, still wins (glibc reads it at the first allocation, before this runs).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only changes allocator tuning; called before any thread starts.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
    let cli = Cli::parse();
    let c = &cli.common;
    let client = |f: std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<()>> + '_>>| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(f))
    };
    let result = match cli.command {
        Command::Serve(a) => serve::run(*a),
        Command::Login(a) => client(Box::pin(async move { login::login(&c.conn, &a).await })),
        Command::Logout => login::logout(&c.conn),
        Command::Run(a) => client(Box::pin(cli::run(c, a))),
        Command::Ls(a) => client(Box::pin(cli::ls(c, a))),
        Command::Describe { id } => client(Box::pin(cli::describe(c, id))),
        Command::Cancel { id } => client(Box::pin(cli::cancel(c, id))),
        Command::Status => client(Box::pin(cli::status(c))),
        Command::Logs(a) => client(Box::pin(cli::logs(c, a))),
        Command::Pools => client(Box::pin(cli::pools(c))),
        Command::Nodes(f) => client(Box::pin(cli::nodes(c, f))),
        Command::Gpus(f) => client(Box::pin(cli::gpus(c, f))),
        Command::Gpu { cmd } => client(Box::pin(opscli::gpu(c, cmd))),
        Command::Node { cmd } => client(Box::pin(opscli::node(c, cmd))),
        Command::Upgrade { cmd } => client(Box::pin(upgradecli::upgrade(c, cmd))),
        Command::Tenants(a) => client(Box::pin(cli::tenants(c, a))),
        Command::Projects(a) => client(Box::pin(cli::projects(c, a))),
        Command::Token { cmd } => client(Box::pin(cli::token(c, cmd))),
        Command::Audit(a) => client(Box::pin(cli::audit(c, a))),
        Command::Quota { cmd } => client(Box::pin(govcli::quota(c, cmd))),
        Command::Budget(a) => client(Box::pin(govcli::budget(c, a))),
        Command::Usage(a) => client(Box::pin(govcli::usage(c, a))),
        Command::Apply(a) => client(Box::pin(govcli::apply(c, a))),
        Command::Openapi => serde_json::to_string_pretty(&tessera_server::openapi())
            .map(|s| println!("{s}"))
            .map_err(Into::into),
        Command::Sim { what } => sim::run(what),
        Command::Plan(a) => plancmd::run(a),
        Command::Bench { what } => bench::run(what, &c.conn),
        Command::Fleet(args) => fleetcmd::run(args),
        Command::Admin {
            cmd: AdminCmd::Recover { data_dir, database },
        } => client(Box::pin(async move {
            let store = compose::open_existing_store(&data_dir, database.as_deref()).await?;
            let r = tessera_server::admin::recover(store.as_ref(), &data_dir).await?;
            println!("Admin token: {}", r.secret);
            println!(
                "(platform-admin token {} written to {}; it is shown only once)",
                r.id,
                r.file.display()
            );
            Ok(())
        })),
        Command::GpuCheck(a) => local::gpu_check(a),
        Command::DeviceReport(a) => devreport::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One readable line.
            eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}
