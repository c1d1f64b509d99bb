//! The client verbs: `run`, `ls`, `describe`, `cancel`, `pools`, `nodes`, `gpus`, `tenants`,
//! `projects`, `token`. Tables by default, `-o json` for scripts.

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand, ValueEnum};
use reqwest::Method;
use serde::Serialize;
use tessera_api::*;
use tessera_model::units::unit_hours;

use crate::client::{Client, Connection};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned columns, for people.
    #[default]
    Table,
    /// The API's JSON, for scripts.
    Json,
    /// CSV (usage reports).
    Csv,
}

#[derive(Args)]
pub struct Common {
    #[command(flatten)]
    pub conn: Connection,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table, global = true)]
    pub output: Output,
}

#[derive(Args)]
pub struct RunArgs {
    /// The tenant whose quota the workload uses.
    #[arg(long)]
    pub tenant: String,
    /// The tenant's project the workload belongs to.
    #[arg(long)]
    pub project: String,
    /// A name for people; need not be unique.
    #[arg(long, default_value = "job")]
    pub name: String,
    /// Whole GPUs: on one node when one node of the pool holds them, else a multi-node gang
    /// of whole nodes (`--gpus 64`).
    #[arg(long, group = "shape")]
    pub gpus: Option<u32>,
    /// A gang of this many node-shares (with --gpus-per-node, or --gpus divided among them).
    #[arg(long)]
    pub nodes: Option<u32>,
    /// A gang's GPUs per node-share (default: whole nodes).
    #[arg(long)]
    pub gpus_per_node: Option<u8>,
    /// Keep a gang within one domain of this topology level: rack, block, pool, or a node
    /// label key the fleet names as a level (required; see --topology-preferred).
    #[arg(long)]
    pub topology: Option<String>,
    /// With --topology: prefer one domain of the level, else the fewest domains above it.
    #[arg(long, requires = "topology")]
    pub topology_preferred: bool,
    /// A gang in segments of this many GPUs, each within one rack.
    #[arg(long)]
    pub segment: Option<u32>,
    /// With --gpus: a gang of whole nodes whose last node-share holds the remainder
    /// (`--gpus 12 --remainder` on 8-GPU nodes: 8 + 4) instead of refusing a count that is
    /// no multiple of the node size.
    #[arg(long, requires = "gpus", conflicts_with_all = ["nodes", "gpus_per_node", "segment"])]
    pub remainder: bool,
    /// A MIG profile, e.g. 3g.40gb.
    #[arg(long, group = "shape")]
    pub mig: Option<String>,
    /// A fraction of a shared GPU in milli-GPU (1-999).
    #[arg(long, group = "shape")]
    pub fraction: Option<u16>,
    /// With --fraction: GPU memory to reserve, MiB.
    #[arg(long)]
    pub gpu_memory: Option<u32>,
    /// Allowed GPU model or family (repeatable), e.g. h100.
    #[arg(long = "model")]
    pub models: Vec<String>,
    /// Only this pool (default: any pool that can serve the shape).
    #[arg(long)]
    pub pool: Option<String>,
    /// Run time or lease: 90s, 30m, 2h, 1h30m.
    #[arg(long, allow_hyphen_values = true)]
    pub duration: Option<String>,
    /// batch, service or interactive.
    #[arg(long, default_value = "batch")]
    pub kind: String,
    /// Priority class: critical, high, standard, opportunistic.
    #[arg(long)]
    pub priority: Option<String>,
    /// Host CPUs (cores, may be fractional).
    #[arg(long)]
    pub cpus: Option<f64>,
    /// Host memory in GiB.
    #[arg(long)]
    pub memory_gib: Option<f64>,
    /// Container image, on backends that run containers (`kubernetes`); checked against the
    /// tenant's image policy.
    #[arg(long)]
    pub image: Option<String>,
    /// An environment variable for the workload, `NAME=VALUE` (repeatable).
    #[arg(long = "env", value_name = "NAME=VALUE")]
    pub env: Vec<String>,
    /// Makes retries safe: the same key and request return the first workload.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// Beyond the tenant's limit or budget: be refused at once instead of waiting.
    #[arg(long)]
    pub no_wait: bool,
    /// If preempted, end instead of going back to the queue.
    #[arg(long)]
    pub no_requeue: bool,
    /// Let consolidation move it so that a request waiting for fragmented capacity fits:
    /// `restart` (batch work, stopped and requeued from its checkpoint) or `replace` (a
    /// service without a lease, a replacement started first).
    #[arg(long, value_parser = ["restart", "replace"])]
    pub movable: Option<String>,
    /// Create nothing: print what the request would cost against the tenant's quotas and
    /// budget, and whether it would start now, borrow, wait or be refused.
    #[arg(long)]
    pub dry_run: bool,
    /// The command to run, after `--`.
    #[arg(last = true)]
    pub command: Vec<String>,
}

#[derive(Args)]
pub struct LsArgs {
    /// Only this tenant's workloads.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only this project's workloads (with --tenant).
    #[arg(long)]
    pub project: Option<String>,
    /// Only workloads in this state: pending, queued, placed, running, stopping, succeeded,
    /// failed, cancelled or preempted.
    #[arg(long)]
    pub state: Option<String>,
    /// At most this many, newest first.
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
}

#[derive(Args)]
pub struct FleetFilterArgs {
    /// Only this pool.
    #[arg(long)]
    pub pool: Option<String>,
    /// Only this node.
    #[arg(long)]
    pub node: Option<String>,
}

#[derive(Subcommand)]
pub enum TenantCmd {
    /// Create a tenant.
    Create {
        name: String,
        /// A longer name for the console (default: the name).
        #[arg(long)]
        display_name: Option<String>,
        /// The priority classes its workloads may use, comma-separated (default: standard,
        /// opportunistic).
        #[arg(long, value_delimiter = ',')]
        priorities: Option<Vec<String>>,
    },
    /// Change a tenant's settings (platform-admin): the priority classes granted to it.
    Set {
        name: String,
        /// The priority classes its workloads may use, comma-separated (`standard,high`);
        /// `default`: the default grant, standard and opportunistic.
        #[arg(long, value_delimiter = ',', required = true)]
        priorities: Vec<String>,
    },
    /// Delete a tenant without projects, tokens or workloads.
    Delete { name: String },
    /// Show, set or remove a tenant's image policy (allowed registries, cosign keys).
    Policy {
        #[command(subcommand)]
        cmd: PolicyCmd,
    },
}

#[derive(Subcommand)]
pub enum PolicyCmd {
    /// Show a tenant's image policy.
    Get { tenant: String },
    /// Replace a tenant's image policy.
    Set {
        tenant: String,
        /// A registry/repository prefix images may come from (repeatable), e.g.
        /// registry.example.com/team-a/ or docker.io/library/; none: any registry.
        #[arg(long = "registry")]
        registries: Vec<String>,
        /// A cosign public key file (PEM, `cosign.pub`; repeatable): images must carry a
        /// signature one of them verifies; none: no signature required.
        #[arg(long = "cosign-key")]
        cosign_keys: Vec<std::path::PathBuf>,
    },
    /// Remove a tenant's image policy (its workloads may run any image).
    Unset { tenant: String },
}

#[derive(Args)]
pub struct TenantsArgs {
    #[command(subcommand)]
    pub cmd: Option<TenantCmd>,
}

#[derive(Subcommand)]
pub enum ProjectCmd {
    /// Create a project in --tenant.
    Create { name: String },
    /// Delete a project without workloads.
    Delete { name: String },
}

#[derive(Args)]
pub struct ProjectsArgs {
    /// The tenant whose projects these are.
    #[arg(long, global = true)]
    pub tenant: Option<String>,
    #[command(subcommand)]
    pub cmd: Option<ProjectCmd>,
}

#[derive(Subcommand)]
pub enum TokenCmd {
    /// Create a token (the secret is shown once).
    Create {
        /// Tenant the token acts for (omit for a platform-admin token).
        #[arg(long)]
        tenant: Option<String>,
        /// platform-admin, tenant-admin, member, viewer, or metrics (reads /metrics only: for
        /// Prometheus).
        #[arg(long, default_value = "member", value_parser = parse_role)]
        role: tessera_api::TokenRole,
        /// A label to recognise the token by in `token ls` and the audit log.
        #[arg(long)]
        name: Option<String>,
        /// Lifetime: 90s, 30m, 12h, 30d (default: until revoked).
        #[arg(long)]
        expires_in: Option<String>,
    },
    /// List tokens (never their secrets).
    Ls {
        /// Only this tenant's tokens.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Revoke a token: it fails from the next request on.
    Revoke { id: String },
}

#[derive(Args)]
pub struct AuditArgs {
    /// Only this tenant's entries.
    #[arg(long)]
    pub tenant: Option<String>,
    /// At most this many, newest first.
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
}

/// Parses a duration in whole seconds: plain seconds (`90`), or jiff's friendly format (`90s`,
/// `30m`, `2h`, `1h30m`, `1d` = 24 hours, `2 hours 30 minutes`).
pub fn parse_duration(s: &str) -> Result<i64> {
    let t = s.trim();
    if t.starts_with('-') {
        bail!("--duration: `{s}` is negative; give a positive duration such as 30m or 2h");
    }
    if let Ok(n) = t.parse::<i64>() {
        return Ok(n);
    }
    let not_one = || anyhow::anyhow!("--duration: `{s}` is not a duration (examples: 90s, 30m, 2h, 1h30m, 1d)");
    let span: jiff::Span = t.parse().map_err(|_| not_one())?;
    let d = span
        .to_duration(jiff::SpanRelativeTo::days_are_24_hours())
        .map_err(|_| not_one())?;
    if d.is_negative() || d.is_zero() || d.subsec_nanos() != 0 {
        return Err(not_one());
    }
    Ok(d.as_secs())
}

pub fn print_json<T: Serialize>(v: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// A plain text table with aligned columns.
pub fn table(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut w: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i + 1 == cells.len() {
                    c.clone()
                } else {
                    format!("{c:<width$}", width = w[i])
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = line(head.iter().map(|h| h.to_string()).collect());
    for r in rows {
        out.push('\n');
        out.push_str(&line(r.clone()));
    }
    out
}

fn shape_str(s: &GpuShape) -> String {
    let mut out = if let Some(g) = s.gpus {
        match (s.gpus_per_node, &s.topology) {
            (Some(per), _) => format!("{g}×GPU ({}×{per})", g / u32::from(per.max(1))),
            _ if s.remainder => format!("{g}×GPU (whole nodes, the last with the remainder)"),
            _ => format!("{g}×GPU"),
        }
    } else if let Some(m) = &s.mig {
        format!("mig {m}")
    } else if let Some(f) = s.fraction {
        format!("{f}m")
    } else {
        "cpu".into()
    };
    if !s.models.is_empty() {
        out.push_str(&format!(" [{}]", s.models.join(",")));
    }
    out
}

fn where_str(w: &Workload) -> String {
    match &w.allocation {
        None => String::new(),
        Some(a) => match a.kind.as_str() {
            "mig" => format!(
                "{}/gpu{} slices {}-{}",
                a.node,
                a.gpus[0],
                a.mig_start.unwrap_or(0),
                a.mig_start.unwrap_or(0) + a.mig_size.unwrap_or(1) - 1
            ),
            "fraction" => format!("{}/gpu{}", a.node, a.gpus[0]),
            "cpu" => a.node.clone(),
            _ if !a.shares.is_empty() => format!("{} +{} nodes", a.node, a.shares.len()),
            _ => format!("{}/gpu{}", a.node, compact(&a.gpus)),
        },
    }
}

/// `[0,1,2,3]` → `0-3`, `[0,2]` → `0,2`.
fn compact(g: &[u8]) -> String {
    if g.len() > 1 && g.windows(2).all(|w| w[1] == w[0] + 1) {
        format!("{}-{}", g[0], g[g.len() - 1])
    } else {
        g.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",")
    }
}

fn workload_rows(items: &[Workload]) -> Vec<Vec<String>> {
    items
        .iter()
        .map(|w| {
            vec![
                w.id.to_string(),
                format!("{}/{}", w.tenant, w.project),
                w.name.clone(),
                shape_str(&w.shape),
                state_str(w),
                where_str(w),
                w.request_to_running_ms.map(|m| format!("{m} ms")).unwrap_or_default(),
            ]
        })
        .collect()
}

/// The state, and for queued work the code of why it waits (`queued (quota)`); `describe`
/// has the sentence.
fn state_str(w: &Workload) -> String {
    match (&w.state, &w.reason_code) {
        (WorkloadState::Queued, Some(code)) => format!("queued ({code})"),
        (state, _) => state.as_str().to_string(),
    }
}

const WORKLOAD_HEAD: [&str; 7] = ["ID", "TENANT/PROJECT", "NAME", "SHAPE", "STATE", "WHERE", "TO RUNNING"];

pub async fn run(c: &Common, a: RunArgs) -> Result<()> {
    let client = Client::new(&c.conn)?;
    let kind = match a.kind.as_str() {
        "batch" => WorkloadKind::Batch,
        "service" => WorkloadKind::Service,
        "interactive" => WorkloadKind::Interactive,
        k => bail!("--kind: `{k}` is not one of batch, service, interactive"),
    };
    if a.gpus.is_none() && a.nodes.is_none() && a.mig.is_none() && a.fraction.is_none() {
        bail!("give one of --gpus N (or --nodes K --gpus-per-node G), --mig PROFILE or --fraction MILLI");
    }
    let mut env = std::collections::BTreeMap::new();
    for kv in &a.env {
        let Some((k, v)) = kv.split_once('=').filter(|(k, _)| !k.is_empty()) else {
            bail!("--env: `{kv}` is not NAME=VALUE");
        };
        env.insert(k.to_string(), v.to_string());
    }
    let body = CreateWorkload {
        tenant: a.tenant,
        project: a.project,
        name: a.name,
        kind,
        shape: GpuShape {
            gpus: a.gpus,
            nodes: a.nodes,
            gpus_per_node: a.gpus_per_node,
            topology: a.topology,
            topology_mode: a.topology_preferred.then_some(tessera_api::TopologyMode::Preferred),
            segment: a.segment,
            remainder: a.remainder,
            mig: a.mig,
            fraction: a.fraction,
            gpu_memory_mib: a.gpu_memory,
            models: a.models,
            pool: a.pool,
        },
        cpu_milli: a.cpus.map(|c| (c * 1000.0).round() as u64),
        memory_mib: a.memory_gib.map(|m| (m * 1024.0).round() as u64),
        duration_s: a.duration.as_deref().map(parse_duration).transpose()?,
        command: (!a.command.is_empty()).then_some(a.command),
        image: a.image,
        env,
        priority: a.priority,
        no_wait: a.no_wait,
        no_requeue: a.no_requeue,
        movable: a.movable.as_deref().map(|m| match m {
            "replace" => tessera_api::MovableMode::Replace,
            _ => tessera_api::MovableMode::Restart,
        }),
    };
    if a.dry_run {
        let (_, d): (_, tessera_api::DryRun) = client
            .call(Method::POST, "/api/v1/workloads/dry-run", Some(&body), &[])
            .await?;
        return match c.output {
            Output::Json | Output::Csv => print_json(&d),
            Output::Table => {
                print!("{}", dry_run_text(&d));
                Ok(())
            }
        };
    }
    let extra: Vec<(&str, String)> = a
        .idempotency_key
        .map(|k| vec![("Idempotency-Key", k)])
        .unwrap_or_default();
    let (_, w): (_, Workload) = client
        .call(Method::POST, "/api/v1/workloads", Some(&body), &extra)
        .await?;
    match c.output {
        Output::Json | Output::Csv => print_json(&w),
        Output::Table => {
            println!("{}", table(&WORKLOAD_HEAD, &workload_rows(std::slice::from_ref(&w))));
            if let Some(r) = &w.reason {
                println!("reason: {r}");
            }
            Ok(())
        }
    }
}

/// A dry run's answer for people.
pub fn dry_run_text(d: &tessera_api::DryRun) -> String {
    // `refused` is a state, the others verbs: "would be refused", "would start".
    let mut out = match d.outcome.as_str() {
        "refused" => "would be refused".to_string(),
        o => format!("would {o}"),
    };
    if let Some(p) = &d.pool {
        out.push_str(&format!(" in pool {p}"));
    }
    if let Some(n) = &d.node {
        out.push_str(&format!(" on node {n}"));
    }
    if let (Some(code), Some(r)) = (&d.reason_code, &d.reason) {
        // The reason may already start with its code ("no-capacity: …"): say it once.
        let r = r
            .strip_prefix(code.as_str())
            .and_then(|r| r.strip_prefix(": "))
            .unwrap_or(r);
        out.push_str(&format!(" ({code}): {r}"));
    }
    out.push('\n');
    out.push_str(&format!("  GPU units   {}\n", d.units));
    if let Some(h) = d.unit_hours {
        out.push_str(&format!("  unit-hours  {h:.2}\n"));
    }
    match d.cost {
        _ if !d.priced => out.push_str("  cost        no price list configured\n"),
        Some(cost) => out.push_str(&format!("  cost        {cost:.2} {}\n", d.currency)),
        None => {}
    }
    for q in &d.quotas {
        let limit = q.limit.map(|l| l.to_string()).unwrap_or_else(|| "none".into());
        out.push_str(&format!(
            "  quota {}: guaranteed {}, limit {limit}, used {} -> {}\n",
            q.class, q.guaranteed, q.used, q.after
        ));
    }
    if let Some(b) = &d.budget {
        out.push_str(&format!(
            "  budget      {} of {} unit-hours left",
            unit_hours(b.left),
            unit_hours(b.budget)
        ));
        if b.running > 0.0 {
            out.push_str(&format!(", {} of them for work running now", unit_hours(b.running)));
        }
        if let Some(after) = b.left_after {
            let what = if b.running > 0.0 {
                "that and this request"
            } else {
                "this request"
            };
            out.push_str(&format!(", {} after {what}", unit_hours(after)));
        }
        out.push('\n');
    }
    out
}

pub async fn ls(c: &Common, a: LsArgs) -> Result<()> {
    let client = Client::new(&c.conn)?;
    let mut q = vec![format!("limit={}", a.limit)];
    for (k, v) in [("tenant", &a.tenant), ("project", &a.project), ("state", &a.state)] {
        if let Some(v) = v {
            q.push(format!("{k}={v}"));
        }
    }
    let page: Page<Workload> = client.get(&format!("/api/v1/workloads?{}", q.join("&"))).await?;
    match c.output {
        Output::Json | Output::Csv => print_json(&page.items),
        Output::Table => {
            println!("{}", table(&WORKLOAD_HEAD, &workload_rows(&page.items)));
            Ok(())
        }
    }
}

fn ms_gap(a: i64, b: i64) -> String {
    let d = (b - a).max(0);
    if d < 1000 {
        format!("+{d} ms")
    } else {
        format!("+{:.1} s", d as f64 / 1000.0)
    }
}

pub async fn describe(c: &Common, id: u64) -> Result<()> {
    let client = Client::new(&c.conn)?;
    let w: Workload = client.get(&format!("/api/v1/workloads/{id}")).await?;
    let events: Vec<Event> = client.get(&format!("/api/v1/workloads/{id}/events")).await?;
    if let Output::Json = c.output {
        return print_json(&serde_json::json!({"workload": w, "events": events}));
    }
    println!("Workload {}  {}/{}  {}", w.id, w.tenant, w.project, w.name);
    println!(
        "  kind        {}  priority {}{}",
        w.kind.as_str(),
        w.priority,
        w.movable
            .map(|m| format!("  movable {}", m.as_str()))
            .unwrap_or_default()
    );
    let gang = w.shape.nodes.is_some()
        || w.shape.gpus_per_node.is_some()
        || w.shape.topology.is_some()
        || w.shape.segment.is_some()
        || w.shape.remainder
        || w.allocation.as_ref().is_some_and(|a| !a.shares.is_empty());
    println!(
        "  shape       {}  ({} GPU units)  host {} CPUs, {} GiB{}",
        shape_str(&w.shape),
        w.units,
        w.cpu_milli as f64 / 1000.0,
        w.memory_mib as f64 / 1024.0,
        if gang { " per node-share" } else { "" }
    );
    println!(
        "  state       {}{}",
        w.state.as_str(),
        w.reason.as_ref().map(|r| format!(" — {r}")).unwrap_or_default()
    );
    if let Some(e) = &w.expected_start {
        println!("  expected    {e} (it holds nodes once it has waited past the backfill window)");
    }
    if let Some(a) = &w.allocation {
        println!(
            "  placed on   {} in pool {} ({}): {}",
            a.node,
            a.pool,
            a.model,
            where_str(&w)
        );
        if !a.shares.is_empty() {
            // A gang: each node-share with its rack.
            let nodes: Vec<NodeView> = all_pages(&client, &format!("/api/v1/nodes?limit=500&pool={}", a.pool))
                .await
                .unwrap_or_default();
            let rack = |n: &str| {
                nodes
                    .iter()
                    .find(|v| v.name == n)
                    .and_then(|v| v.rack.clone())
                    .unwrap_or_else(|| "-".into())
            };
            let mut rows = vec![vec!["0".to_string(), a.node.clone(), rack(&a.node), compact(&a.gpus)]];
            for (i, s) in a.shares.iter().enumerate() {
                rows.push(vec![
                    (i + 1).to_string(),
                    s.node.clone(),
                    rack(&s.node),
                    compact(&s.gpus),
                ]);
            }
            println!(
                "  node-shares {} ({} GPU units)",
                rows.len(),
                a.units_milli as f64 / 1000.0
            );
            for l in table(&["SHARE", "NODE", "RACK", "GPUS"], &rows).lines() {
                println!("    {l}");
            }
        }
    }
    if let Some(d) = w.duration_s {
        println!("  duration    {d} s");
    }
    if let Some(r) = w.request_to_running_ms {
        println!("  request → running  {r} ms");
    }
    println!("\nTimeline:");
    let mut prev = events.first().map(|e| e.at_ms).unwrap_or(0);
    let rows: Vec<Vec<String>> = events
        .iter()
        .map(|e| {
            let gap = ms_gap(prev, e.at_ms);
            prev = e.at_ms;
            vec![e.at.clone(), gap, e.step.clone(), e.detail.clone()]
        })
        .collect();
    println!("{}", table(&["AT", "STEP TIME", "STEP", "DETAIL"], &rows));
    Ok(())
}

#[derive(Args)]
pub struct LogsArgs {
    /// The workload.
    pub id: u64,
    /// Keep following the output until the workload ends.
    #[arg(long, short)]
    pub follow: bool,
}

pub async fn logs(c: &Common, a: LogsArgs) -> Result<()> {
    let client = Client::new(&c.conn)?;
    let path = format!("/api/v1/workloads/{}/logs?follow={}", a.id, a.follow);
    client.stream(&path, &mut std::io::stdout()).await
}

pub async fn cancel(c: &Common, id: u64) -> Result<()> {
    let client = Client::new(&c.conn)?;
    let w: Workload = client
        .post(&format!("/api/v1/workloads/{id}/cancel"), &serde_json::json!({}))
        .await?;
    match c.output {
        Output::Json | Output::Csv => print_json(&w),
        Output::Table => {
            println!("workload {} is {}", w.id, w.state.as_str());
            Ok(())
        }
    }
}

pub async fn pools(c: &Common) -> Result<()> {
    let client = Client::new(&c.conn)?;
    let p: Page<PoolView> = client.get("/api/v1/pools").await?;
    match c.output {
        Output::Json | Output::Csv => print_json(&p.items),
        Output::Table => {
            let rows: Vec<Vec<String>> = p
                .items
                .iter()
                .map(|p| {
                    vec![
                        p.name.clone(),
                        p.sharing.clone(),
                        p.nodes.to_string(),
                        p.gpus.to_string(),
                        format!("{} / {}", p.units_used, p.units_total),
                        p.models.join(", "),
                    ]
                })
                .collect();
            println!(
                "{}",
                table(&["POOL", "SHARING", "NODES", "GPUS", "UNITS USED", "MODELS"], &rows)
            );
            Ok(())
        }
    }
}

/// `tessera status`: the replicas of the control plane and which one leads.
pub async fn status(c: &Common) -> Result<()> {
    let client = Client::new(&c.conn)?;
    let r: ReplicasView = client.get("/api/v1/replicas").await?;
    match c.output {
        Output::Json | Output::Csv => print_json(&r),
        Output::Table => {
            match &r.leader {
                Some(l) => println!(
                    "Leader: {} at {} (epoch {}, lease valid for another {} ms)",
                    l.id, l.url, l.epoch, l.expires_in_ms
                ),
                // No lease on SQLite: its one process leads.
                None if r.database == "sqlite" => println!("Leader: {} (SQLite: the only replica)", r.this),
                None => println!("Leader: none (an election is under way, or the database is unavailable)"),
            }
            println!("Database: {}; answered by {}", r.database, r.this);
            let rows: Vec<Vec<String>> = r
                .replicas
                .iter()
                .map(|x| {
                    vec![
                        x.id.clone(),
                        x.role.clone(),
                        x.url.clone(),
                        x.version.clone(),
                        x.started_at.clone(),
                        format!("{:.1} s ago", x.last_seen_ms_ago as f64 / 1000.0),
                    ]
                })
                .collect();
            println!(
                "{}",
                table(
                    &["REPLICA", "ROLE", "URL", "VERSION", "STARTED", "LAST HEARTBEAT"],
                    &rows
                )
            );
            Ok(())
        }
    }
}

fn filter_query(f: &FleetFilterArgs) -> String {
    let mut q = vec!["limit=500".to_string()];
    if let Some(p) = &f.pool {
        q.push(format!("pool={p}"));
    }
    if let Some(n) = &f.node {
        q.push(format!("node={n}"));
    }
    q.join("&")
}

pub(crate) async fn all_pages<T: serde::de::DeserializeOwned>(client: &Client, path: &str) -> Result<Vec<T>> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let url = match &cursor {
            Some(c) => format!("{path}&cursor={c}"),
            None => path.to_string(),
        };
        let p: Page<T> = client.get(&url).await?;
        out.extend(p.items);
        match p.next_cursor {
            Some(c) => cursor = Some(c.replace('/', "%2F")),
            None => return Ok(out),
        }
    }
}

pub async fn nodes(c: &Common, f: FleetFilterArgs) -> Result<()> {
    let client = Client::new(&c.conn)?;
    let items: Vec<NodeView> = all_pages(&client, &format!("/api/v1/nodes?{}", filter_query(&f))).await?;
    match c.output {
        Output::Json | Output::Csv => print_json(&items),
        Output::Table => {
            // Where the fleet declares a topology above the node (racks, blocks, label
            // levels), each node's place in it, lowest level first.
            let topology = items.iter().any(|n| !n.topology.is_empty());
            let rows: Vec<Vec<String>> = items
                .iter()
                .map(|n| {
                    let mut row = vec![
                        n.name.clone(),
                        n.pool.clone(),
                        n.model.clone(),
                        format!("{}/{}", n.gpus_free, n.gpus),
                        n.units_used.clone(),
                        format!("{}/{}", n.cpus_free, n.cpus),
                        format!("{}/{}", n.memory_gib_free, n.memory_gib),
                        n.nvlink.clone(),
                    ];
                    if topology {
                        let at: Vec<String> = n.topology.iter().map(|t| format!("{} {}", t.level, t.domain)).collect();
                        row.push(if at.is_empty() { "-".into() } else { at.join(", ") });
                    }
                    row.push(n.state.clone());
                    row
                })
                .collect();
            let mut head = vec![
                "NODE",
                "POOL",
                "MODEL",
                "GPUS FREE",
                "UNITS USED",
                "CPUS FREE",
                "MEM GIB FREE",
                "NVLINK",
            ];
            if topology {
                head.push("TOPOLOGY");
            }
            head.push("STATE");
            println!("{}", table(&head, &rows));
            Ok(())
        }
    }
}

/// One GPU as a compact cell: `[####....] 3g.40gb:vision 4g.40gb:nlp`.
fn gpu_cell(g: &GpuView) -> String {
    let holders: Vec<String> = g
        .slices
        .iter()
        .map(|s| {
            if s.tenant.is_empty() {
                s.what.clone()
            } else {
                format!("{}:{}", s.what, s.tenant)
            }
        })
        .collect();
    let bar = match &g.mig_slices {
        Some(m) => format!("[{m}]"),
        None => {
            let used: f64 = g.units_used.parse().unwrap_or(0.0);
            let filled = (used * 8.0).round() as usize;
            format!("[{}{}]", "#".repeat(filled), ".".repeat(8 - filled.min(8)))
        }
    };
    if holders.is_empty() {
        bar
    } else {
        format!("{bar} {}", holders.join(" "))
    }
}

pub async fn gpus(c: &Common, f: FleetFilterArgs) -> Result<()> {
    let client = Client::new(&c.conn)?;
    let items: Vec<GpuView> = all_pages(&client, &format!("/api/v1/gpus?{}", filter_query(&f))).await?;
    if let Output::Json = c.output {
        return print_json(&items);
    }
    let mut node = String::new();
    for g in &items {
        if g.node != node {
            node = g.node.clone();
            println!("{} ({}, {}, {})", g.node, g.pool, g.model, g.sharing);
        }
        println!("  gpu{:<2} {:>5}  {}", g.index, g.units_used, gpu_cell(g));
    }
    Ok(())
}

pub async fn tenants(c: &Common, a: TenantsArgs) -> Result<()> {
    let client = Client::new(&c.conn)?;
    match a.cmd {
        Some(TenantCmd::Create {
            name,
            display_name,
            priorities,
        }) => {
            let t: Tenant = client
                .post(
                    "/api/v1/tenants",
                    &CreateTenant {
                        name,
                        display_name,
                        priorities,
                    },
                )
                .await?;
            match c.output {
                Output::Json | Output::Csv => print_json(&t),
                Output::Table => {
                    println!("tenant {} created", t.name);
                    Ok(())
                }
            }
        }
        Some(TenantCmd::Set { name, priorities }) => {
            let priorities = match priorities.as_slice() {
                [d] if d == "default" => None,
                _ => Some(priorities),
            };
            let (_, t): (_, Tenant) = client
                .call(
                    Method::PUT,
                    &format!("/api/v1/tenants/{name}/priorities"),
                    Some(&SetPriorities { priorities }),
                    &[],
                )
                .await?;
            match c.output {
                Output::Json | Output::Csv => print_json(&t),
                Output::Table => {
                    println!(
                        "tenant {} may use the priority classes {}",
                        t.name,
                        t.priorities.join(", ")
                    );
                    Ok(())
                }
            }
        }
        Some(TenantCmd::Delete { name }) => {
            client
                .call::<(), serde_json::Value>(Method::DELETE, &format!("/api/v1/tenants/{name}"), None, &[])
                .await?;
            println!("tenant {name} deleted");
            Ok(())
        }
        Some(TenantCmd::Policy { cmd }) => image_policy(c, &client, cmd).await,
        None => {
            let items: Vec<Tenant> = all_pages(&client, "/api/v1/tenants?limit=500").await?;
            match c.output {
                Output::Json | Output::Csv => print_json(&items),
                Output::Table => {
                    let rows: Vec<Vec<String>> = items
                        .iter()
                        .map(|t| {
                            vec![
                                t.name.clone(),
                                t.display_name.clone(),
                                t.priorities.join(","),
                                t.created_at.clone(),
                            ]
                        })
                        .collect();
                    println!("{}", table(&["TENANT", "DISPLAY NAME", "PRIORITIES", "CREATED"], &rows));
                    Ok(())
                }
            }
        }
    }
}

fn print_policy(p: &ImagePolicy) {
    let registries = if p.registries.is_empty() {
        "any".to_string()
    } else {
        p.registries.join(", ")
    };
    println!("image policy of {}: registries {registries}", p.tenant);
    if p.cosign_keys.is_empty() {
        println!("  no signature required");
    } else {
        println!("  cosign signature required, by one of {} key(s)", p.cosign_keys.len());
    }
}

async fn image_policy(c: &Common, client: &Client, cmd: PolicyCmd) -> Result<()> {
    let path = |t: &str| format!("/api/v1/tenants/{t}/image-policy");
    let p: ImagePolicy = match cmd {
        PolicyCmd::Get { tenant } => client.get(&path(&tenant)).await?,
        PolicyCmd::Set {
            tenant,
            registries,
            cosign_keys,
        } => {
            let cosign_keys = cosign_keys
                .iter()
                .map(|f| std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display())))
                .collect::<Result<Vec<_>>>()?;
            let body = SetImagePolicy {
                registries,
                cosign_keys,
            };
            let (_, p) = client.call(Method::PUT, &path(&tenant), Some(&body), &[]).await?;
            p
        }
        PolicyCmd::Unset { tenant } => {
            client
                .call::<(), serde_json::Value>(Method::DELETE, &path(&tenant), None, &[])
                .await?;
            println!("image policy of {tenant} removed");
            return Ok(());
        }
    };
    match c.output {
        Output::Json | Output::Csv => print_json(&p),
        Output::Table => {
            print_policy(&p);
            Ok(())
        }
    }
}

pub async fn projects(c: &Common, a: ProjectsArgs) -> Result<()> {
    let client = Client::new(&c.conn)?;
    let Some(tenant) = a.tenant else {
        bail!("--tenant is required")
    };
    match a.cmd {
        Some(ProjectCmd::Create { name }) => {
            let p: Project = client
                .post(&format!("/api/v1/tenants/{tenant}/projects"), &CreateProject { name })
                .await?;
            match c.output {
                Output::Json | Output::Csv => print_json(&p),
                Output::Table => {
                    println!("project {}/{} created", p.tenant, p.name);
                    Ok(())
                }
            }
        }
        Some(ProjectCmd::Delete { name }) => {
            client
                .call::<(), serde_json::Value>(
                    Method::DELETE,
                    &format!("/api/v1/tenants/{tenant}/projects/{name}"),
                    None,
                    &[],
                )
                .await?;
            println!("project {tenant}/{name} deleted");
            Ok(())
        }
        None => {
            let items: Vec<Project> =
                all_pages(&client, &format!("/api/v1/tenants/{tenant}/projects?limit=500")).await?;
            match c.output {
                Output::Json | Output::Csv => print_json(&items),
                Output::Table => {
                    let rows: Vec<Vec<String>> = items
                        .iter()
                        .map(|p| vec![p.tenant.clone(), p.name.clone(), p.created_at.clone()])
                        .collect();
                    println!("{}", table(&["TENANT", "PROJECT", "CREATED"], &rows));
                    Ok(())
                }
            }
        }
    }
}

fn parse_role(s: &str) -> std::result::Result<tessera_api::TokenRole, String> {
    tessera_api::TokenRole::parse(s)
        .ok_or_else(|| format!("`{s}`: platform-admin, tenant-admin, member, viewer or metrics"))
}

pub async fn token(c: &Common, cmd: TokenCmd) -> Result<()> {
    let client = Client::new(&c.conn)?;
    match cmd {
        TokenCmd::Create {
            tenant,
            role,
            name,
            expires_in,
        } => {
            let expires_in_s = expires_in.as_deref().map(parse_duration).transpose()?;
            let t: CreatedToken = client
                .post(
                    "/api/v1/tokens",
                    &CreateToken {
                        tenant,
                        role,
                        name,
                        expires_in_s,
                    },
                )
                .await?;
            match c.output {
                Output::Json | Output::Csv => print_json(&t),
                Output::Table => {
                    let of = t.tenant.map(|t| format!(" of {t}")).unwrap_or_default();
                    println!("token {} ({}{of}): {}", t.id, t.role, t.token);
                    println!("the secret is shown only now; store it safely");
                    Ok(())
                }
            }
        }
        TokenCmd::Ls { tenant } => {
            let path = match tenant {
                Some(t) => format!("/api/v1/tokens?tenant={t}"),
                None => "/api/v1/tokens".into(),
            };
            let list: Vec<TokenView> = client.get(&path).await?;
            if c.output != Output::Table {
                return print_json(&list);
            }
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|t| {
                    let state = if t.revoked_at.is_some() {
                        "revoked".to_string()
                    } else {
                        t.expires_at
                            .clone()
                            .map(|e| format!("expires {e}"))
                            .unwrap_or("active".into())
                    };
                    vec![
                        t.id.clone(),
                        t.tenant.clone().unwrap_or("-".into()),
                        t.role.clone(),
                        t.name.clone(),
                        t.created_at.clone(),
                        state,
                    ]
                })
                .collect();
            println!(
                "{}",
                table(&["ID", "TENANT", "ROLE", "NAME", "CREATED", "STATE"], &rows)
            );
            Ok(())
        }
        TokenCmd::Revoke { id } => {
            client
                .call::<(), serde_json::Value>(Method::DELETE, &format!("/api/v1/tokens/{id}"), None, &[])
                .await?;
            println!("token {id} revoked");
            Ok(())
        }
    }
}

pub async fn audit(c: &Common, a: AuditArgs) -> Result<()> {
    let client = Client::new(&c.conn)?;
    let mut path = format!("/api/v1/audit?limit={}", a.limit);
    if let Some(t) = &a.tenant {
        path.push_str(&format!("&tenant={t}"));
    }
    let page: Page<AuditEntry> = client.get(&path).await?;
    if c.output != Output::Table {
        return print_json(&page.items);
    }
    let rows: Vec<Vec<String>> = page
        .items
        .iter()
        .map(|e| {
            vec![
                e.at.clone(),
                e.actor.clone(),
                e.tenant.clone().unwrap_or("-".into()),
                e.action.clone(),
                e.outcome.to_string(),
                e.request_id.clone(),
                e.detail.clone(),
            ]
        })
        .collect();
    println!(
        "{}",
        table(
            &["AT", "ACTOR", "TENANT", "ACTION", "OUTCOME", "REQUEST", "DETAIL"],
            &rows
        )
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dry_run_says_its_reason_code_once_and_no_cost_without_a_price_list() {
        let dry = |priced: bool| -> tessera_api::DryRun {
            serde_json::from_str(&format!(
                r#"{{"outcome":"wait","units":"32","unit_hours":32.0,"price_per_unit_hour":0.0,"cost":0.0,"currency":"EUR","priced":{priced},"quotas":[],
                   "reason_code":"no-capacity","reason":"no-capacity: 32 GPUs in one rack; no rack has room now"}}"#
            ))
            .unwrap()
        };
        let text = dry_run_text(&dry(false));
        assert!(
            text.starts_with("would wait (no-capacity): 32 GPUs in one rack; no rack has room now\n"),
            "{text}"
        );
        assert!(text.contains("  cost        no price list configured\n"), "{text}");
        assert!(!text.contains("0.00"), "{text}");
        let text = dry_run_text(&dry(true));
        assert!(
            text.contains("  cost        0.00 EUR\n"),
            "a price of 0 is a price: {text}"
        );
    }

    #[test]
    fn the_dry_runs_budget_line_names_the_running_work_it_counts() {
        let dry = |budget: &str| -> tessera_api::DryRun {
            serde_json::from_str(&format!(
                r#"{{"outcome":"start","units":"8","unit_hours":16.0,"price_per_unit_hour":0.0,"currency":"EUR","quotas":[],"budget":{budget}}}"#
            ))
            .unwrap()
        };
        let text = dry_run_text(&dry(
            r#"{"budget":100.0,"spent":40.0,"left":60.0,"running":24.0,"left_after":20.0}"#,
        ));
        assert!(
            text.contains(
                "budget      60.0 of 100.0 unit-hours left, 24.0 of them for work running now, 20.0 after that and this request"
            ),
            "{text}"
        );
        let text = dry_run_text(&dry(r#"{"budget":0.04,"spent":0.0,"left":0.04,"left_after":0.03}"#));
        assert!(
            text.contains("budget      0.04 of 0.04 unit-hours left, 0.03 after this request\n"),
            "{text}"
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2h").unwrap(), 7200);
        assert_eq!(parse_duration("1h30m").unwrap(), 5400);
        assert_eq!(parse_duration("90").unwrap(), 90);
        assert!(parse_duration("-5m").is_err());
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("h").is_err());
        assert_eq!(parse_duration("1d").unwrap(), 86_400);
        assert_eq!(parse_duration("2 hours 30 minutes").unwrap(), 9000);
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("1.5s").is_err(), "whole seconds");
        assert!(parse_duration("99999999999999999999d").is_err(), "no overflow");
    }

    #[test]
    fn tables_align() {
        let t = table(&["A", "BB"], &[vec!["xxx".into(), "y".into()]]);
        assert_eq!(t, "A    BB\nxxx  y");
        assert_eq!(compact(&[0, 1, 2, 3]), "0-3");
        assert_eq!(compact(&[0, 2]), "0,2");
    }
}
