//! `tessera bench api`: the running server's API under load.
//!
//! `--clients` concurrent clients share one HTTP connection pool. After making sure tenant
//! `bench` and project `load` exist, phase 1 creates `--creates` workloads (a seeded mix of
//! fractions of shared GPUs, MIG slices and 1/2/8 whole GPUs, each running a few seconds so that
//! capacity recycles), phase 2 reads `--reads` random created workloads by id, and a final pass
//! polls every created workload until none is pending, queued or placed any more (or
//! `--settle-s` has passed) and collects its `request_to_running_ms`.
//!
//! Each client acts with its own `member` token of tenant `bench` (created at the start, revoked
//! at the end), as separate clients would, so per-token rate limits apply per client;
//! `--tokens 0` sends everything with the given token instead.
//!
//! Every loop is bounded: by its count, and by `--phase-timeout-s` (phases 1 and 2) or
//! `--settle-s` (the final pass).
//!
//! With `--server-pid` (a server on this machine), the server's CPU time over each of phases 1
//! and 2 is read from `/proc/PID/stat` and reported per request: a figure that another load on
//! the machine changes much less than it changes requests per second.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::json;

use crate::client::Connection;

#[derive(clap::Args)]
pub struct ApiArgs {
    /// Concurrent clients.
    #[arg(long, default_value_t = 200)]
    clients: usize,
    /// Workloads to create in phase 1.
    #[arg(long, default_value_t = 5000)]
    creates: usize,
    /// GET /api/v1/workloads/{id} reads in phase 2.
    #[arg(long, default_value_t = 50_000)]
    reads: usize,
    /// Shortest run time of a created workload, seconds.
    #[arg(long, default_value_t = 2)]
    min_duration_s: i64,
    /// Longest run time of a created workload, seconds.
    #[arg(long, default_value_t = 5)]
    max_duration_s: i64,
    /// Shapes to mix, comma-separated: `fraction` (100–900 milli-GPU), `mig` (1g.10gb,
    /// 2g.20gb, 3g.40gb), `gpus` (1, 2 or 8 whole GPUs).
    #[arg(long, default_value = "fraction,mig,gpus", value_delimiter = ',')]
    shapes: Vec<String>,
    /// Pace phase 1 at this many creations per second (0: as fast as the clients go). A paced
    /// run whose demand fits the fleet measures request-to-running without capacity waits.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// A phase ends after this many seconds even if its count is not reached.
    #[arg(long, default_value_t = 300)]
    phase_timeout_s: u64,
    /// How long to wait for created workloads to leave pending/queued/placed.
    #[arg(long, default_value_t = 30)]
    settle_s: u64,
    /// Member tokens to create and spread the requests over (default: one per client); 0: use
    /// the given token for every request.
    #[arg(long)]
    tokens: Option<usize>,
    /// Worker threads of the load generator (0: one per core).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Seed of the random mix of requests.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// The server's process id, when it runs on this machine (Linux): its CPU time over the
    /// creations and over the reads is reported, per request.
    #[arg(long)]
    server_pid: Option<u32>,
    /// One JSON object instead of the text report.
    #[arg(long)]
    json: bool,
}

const TENANT: &str = "bench";
const PROJECT: &str = "load";

/// What the benchmark reads back from the server.
#[derive(Deserialize)]
struct Brief {
    id: u64,
    state: String,
    #[serde(default)]
    request_to_running_ms: Option<u64>,
}

fn waiting(state: &str) -> bool {
    matches!(state, "pending" | "queued" | "placed")
}

struct Http {
    client: reqwest::Client,
    base: String,
    /// The given token's `Authorization` value.
    admin: String,
    /// Those requests are spread over (request `i` uses `auths[i % len]`).
    auths: Vec<String>,
}

impl Http {
    fn auth(&self, i: usize) -> &str {
        &self.auths[i % self.auths.len()]
    }

    async fn send(&self, rb: reqwest::RequestBuilder, auth: &str) -> Result<(StatusCode, Vec<u8>)> {
        let r = rb.header(reqwest::header::AUTHORIZATION, auth).send().await?;
        let s = r.status();
        Ok((s, r.bytes().await?.to_vec()))
    }

    async fn post(&self, auth: &str, path: &str, body: &serde_json::Value) -> Result<(StatusCode, Vec<u8>)> {
        self.send(self.client.post(format!("{}{path}", self.base)).json(body), auth)
            .await
    }

    async fn get(&self, auth: &str, path: &str) -> Result<(StatusCode, Vec<u8>)> {
        self.send(self.client.get(format!("{}{path}", self.base)), auth).await
    }

    async fn delete(&self, auth: &str, path: &str) -> Result<(StatusCode, Vec<u8>)> {
        self.send(self.client.delete(format!("{}{path}", self.base)), auth)
            .await
    }
}

/// A creation body of the mix: each kind of `kinds` equally often.
fn shape(rng: &mut ChaCha8Rng, kinds: &[Kind]) -> serde_json::Value {
    match kinds[rng.random_range(0..kinds.len())] {
        Kind::Fraction => json!({"fraction": rng.random_range(1..=9u16) * 100}),
        Kind::Mig => {
            let p = ["1g.10gb", "2g.20gb", "3g.40gb"][rng.random_range(0..3)];
            json!({ "mig": p })
        }
        Kind::Gpus => {
            let g = [1u8, 2, 8][rng.random_range(0..3)];
            json!({ "gpus": g })
        }
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Fraction,
    Mig,
    Gpus,
}

fn kinds(names: &[String]) -> Result<Vec<Kind>> {
    let mut out = Vec::new();
    for n in names {
        out.push(match n.trim() {
            "fraction" => Kind::Fraction,
            "mig" => Kind::Mig,
            "gpus" => Kind::Gpus,
            other => bail!("--shapes: `{other}` is not one of fraction, mig, gpus"),
        });
    }
    if out.is_empty() {
        bail!("--shapes: give at least one of fraction, mig, gpus");
    }
    Ok(out)
}

fn percentile_ms(sorted_us: &[u64], p: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let i = ((sorted_us.len() as f64 - 1.0) * p).round() as usize;
    (sorted_us[i] as f64 / 10.0).round() / 100.0
}

/// CPU seconds (user and system, every thread) process `pid` has used so far, from
/// `/proc/PID/stat`.
fn process_cpu_s(pid: u32) -> Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("--server-pid: cannot read {path}"))?;
    // The command name (field 2) is in parentheses and may hold spaces: count from after it.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .with_context(|| format!("{path}: not a process status line"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks = |i: usize| -> Result<f64> {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .map(|t| t as f64)
            .with_context(|| format!("{path}: no CPU time in field {}", i + 3))
    };
    // SAFETY: sysconf has no preconditions; it reads a constant of the running system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz <= 0 {
        bail!("--server-pid: the system's clock tick is unknown");
    }
    Ok((ticks(11)? + ticks(12)?) / hz as f64)
}

/// CPU time of the server over a phase: microseconds per request, `None` without a pid.
fn cpu_per_request_us(before: Option<f64>, after: Option<f64>, requests: usize) -> Option<f64> {
    let (b, a) = (before?, after?);
    (requests > 0).then(|| ((a - b) * 1e6 / requests as f64).round())
}

fn problem_line(status: StatusCode, body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let detail = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("detail").and_then(|d| d.as_str()).map(str::to_string))
        .unwrap_or_else(|| text.chars().take(200).collect());
    format!("{status}: {detail}")
}

pub fn run(conn: &Connection, a: ApiArgs) -> Result<()> {
    if a.clients == 0 {
        bail!("--clients: give at least 1");
    }
    if a.min_duration_s < 1 || a.max_duration_s < a.min_duration_s {
        bail!("--min-duration-s / --max-duration-s: need 1 <= min <= max");
    }
    if !(a.rate >= 0.0 && a.rate.is_finite()) {
        bail!("--rate: give a number of creations per second, or 0 for no pacing");
    }
    kinds(&a.shapes)?;
    if let Some(pid) = a.server_pid {
        process_cpu_s(pid)?;
    }
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if a.threads > 0 {
        rt.worker_threads(a.threads);
    }
    let rt = rt.enable_all().build().context("starting the runtime")?;
    rt.block_on(bench(conn, a))
}

/// Runs `clients` tasks that each call `step(i)` for the next unclaimed index `i < count`, until
/// the count is reached or the deadline passes; with `rate > 0`, step `i` starts no earlier than
/// `i / rate` seconds after the start. Returns the wall time.
async fn drive<F, Fut>(clients: usize, count: usize, deadline: Instant, rate: f64, step: F) -> f64
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let step = Arc::new(step);
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(clients);
    for _ in 0..clients.min(count.max(1)) {
        let (next, step) = (next.clone(), step.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count || Instant::now() >= deadline {
                    break;
                }
                if rate > 0.0 {
                    let at = start + Duration::from_secs_f64(i as f64 / rate);
                    if at >= deadline {
                        break;
                    }
                    tokio::time::sleep_until(at.into()).await;
                }
                step(i).await;
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    start.elapsed().as_secs_f64()
}

#[derive(Default)]
struct Tally {
    lat_us: Vec<u64>,
    errors: u64,
    first_error: Option<String>,
}

impl Tally {
    fn error(&mut self, e: String) {
        self.errors += 1;
        self.first_error.get_or_insert(e);
    }
}

async fn bench(conn: &Connection, a: ApiArgs) -> Result<()> {
    let token = conn.resolve_token()?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(a.clients)
        .timeout(Duration::from_secs(30))
        .build()?;
    let admin = format!("Bearer {token}");
    let mut http = Http {
        client,
        base: conn.base_url(),
        admin: admin.clone(),
        auths: vec![admin],
    };

    // Tenant and project (409: they exist already).
    let (s, b) = http
        .get(&http.admin, "/api/v1/health")
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach the Tessera server at {}: {e}", http.base))?;
    if !s.is_success() {
        bail!("health check: {}", problem_line(s, &b));
    }
    for (path, body) in [
        ("/api/v1/tenants".to_string(), json!({"name": TENANT})),
        (format!("/api/v1/tenants/{TENANT}/projects"), json!({"name": PROJECT})),
    ] {
        let (s, b) = http.post(&http.admin, &path, &body).await?;
        if !s.is_success() && s != StatusCode::CONFLICT {
            bail!("POST {path}: {}", problem_line(s, &b));
        }
    }
    // One member token per client (they expire after an hour if the revocation below is missed).
    let mut token_ids = Vec::new();
    let n_tokens = a.tokens.unwrap_or(a.clients);
    if n_tokens > 0 {
        let mut auths = Vec::with_capacity(n_tokens);
        for i in 0..n_tokens {
            let body =
                json!({"tenant": TENANT, "role": "member", "name": format!("bench-api-{i}"), "expires_in_s": 3600});
            let (s, b) = http.post(&http.admin, "/api/v1/tokens", &body).await?;
            if !s.is_success() {
                bail!("POST /api/v1/tokens: {}", problem_line(s, &b));
            }
            #[derive(Deserialize)]
            struct Created {
                id: String,
                token: String,
            }
            let c: Created = serde_json::from_slice(&b).context("reading a created token")?;
            token_ids.push(c.id);
            auths.push(format!("Bearer {}", c.token));
        }
        http.auths = auths;
    }
    let http = Arc::new(http);

    // Phase 1: creations.
    let mut rng = ChaCha8Rng::seed_from_u64(a.seed);
    let mix = kinds(&a.shapes)?;
    let bodies: Arc<Vec<serde_json::Value>> = Arc::new(
        (0..a.creates)
            .map(|i| {
                json!({
                    "tenant": TENANT,
                    "project": PROJECT,
                    "name": format!("load-{i}"),
                    "shape": shape(&mut rng, &mix),
                    "duration_s": rng.random_range(a.min_duration_s..=a.max_duration_s),
                })
            })
            .collect(),
    );
    let created = Arc::new(std::sync::Mutex::new(Vec::<(u64, bool)>::with_capacity(a.creates)));
    let tally = Arc::new(std::sync::Mutex::new(Tally::default()));
    let timeout = Duration::from_secs(a.phase_timeout_s);
    let server_cpu = || a.server_pid.and_then(|pid| process_cpu_s(pid).ok());
    let cpu_before_creates = server_cpu();
    let create_wall = {
        let (http, bodies, created, tally) = (http.clone(), bodies.clone(), created.clone(), tally.clone());
        drive(a.clients, a.creates, Instant::now() + timeout, a.rate, move |i| {
            let (http, bodies, created, tally) = (http.clone(), bodies.clone(), created.clone(), tally.clone());
            async move {
                let t = Instant::now();
                let r = http.post(http.auth(i), "/api/v1/workloads", &bodies[i]).await;
                let us = t.elapsed().as_micros() as u64;
                match r {
                    Ok((s, b)) if s == StatusCode::CREATED => match serde_json::from_slice::<Brief>(&b) {
                        Ok(w) => {
                            tally.lock().expect("lock").lat_us.push(us);
                            created.lock().expect("lock").push((w.id, w.state == "queued"));
                        }
                        Err(e) => tally
                            .lock()
                            .expect("lock")
                            .error(format!("unexpected creation response: {e}")),
                    },
                    Ok((s, b)) => tally.lock().expect("lock").error(problem_line(s, &b)),
                    Err(e) => tally.lock().expect("lock").error(format!("{e:#}")),
                }
            }
        })
        .await
    };
    let cpu_after_creates = server_cpu();
    let created: Vec<(u64, bool)> = std::mem::take(&mut *created.lock().expect("lock"));
    let mut create = std::mem::take(&mut *tally.lock().expect("lock"));
    create.lat_us.sort_unstable();
    if created.is_empty() {
        bail!(
            "no workload was created ({} errors; first: {})",
            create.errors,
            create.first_error.unwrap_or_default()
        );
    }
    let queued_at_create = created.iter().filter(|c| c.1).count();

    // Phase 2: reads of random created workloads.
    let ids: Arc<Vec<u64>> = Arc::new(created.iter().map(|c| c.0).collect());
    let picks: Arc<Vec<u64>> = Arc::new((0..a.reads).map(|_| ids[rng.random_range(0..ids.len())]).collect());
    let cpu_before_reads = server_cpu();
    let read_wall = {
        let (http, picks, tally) = (http.clone(), picks.clone(), tally.clone());
        drive(a.clients, a.reads, Instant::now() + timeout, 0.0, move |i| {
            let (http, picks, tally) = (http.clone(), picks.clone(), tally.clone());
            async move {
                let t = Instant::now();
                let r = http.get(http.auth(i), &format!("/api/v1/workloads/{}", picks[i])).await;
                let us = t.elapsed().as_micros() as u64;
                match r {
                    Ok((s, _)) if s.is_success() => tally.lock().expect("lock").lat_us.push(us),
                    Ok((s, b)) => tally.lock().expect("lock").error(problem_line(s, &b)),
                    Err(e) => tally.lock().expect("lock").error(format!("{e:#}")),
                }
            }
        })
        .await
    };
    let cpu_after_reads = server_cpu();
    let mut read = std::mem::take(&mut *tally.lock().expect("lock"));
    read.lat_us.sort_unstable();
    // Every request of the phase counts, refused ones too: each cost the server its work.
    let create_cpu_us = cpu_per_request_us(
        cpu_before_creates,
        cpu_after_creates,
        created.len() + create.errors as usize,
    );
    let read_cpu_us = cpu_per_request_us(
        cpu_before_reads,
        cpu_after_reads,
        read.lat_us.len() + read.errors as usize,
    );

    // Final pass: request-to-running of every created workload.
    let settle_deadline = Instant::now() + Duration::from_secs(a.settle_s);
    let mut todo: Vec<(u64, bool)> = created.clone();
    let mut r2r_all = Vec::new();
    let mut r2r_direct = Vec::new();
    let mut r2r_queued = Vec::new();
    let mut never_ran_ended = 0u64;
    let mut read_errors = 0u64;
    loop {
        let results = Arc::new(std::sync::Mutex::new(Vec::with_capacity(todo.len())));
        let batch = Arc::new(todo.clone());
        {
            let (http, batch, results) = (http.clone(), batch.clone(), results.clone());
            drive(a.clients, batch.len(), settle_deadline, 0.0, move |i| {
                let (http, batch, results) = (http.clone(), batch.clone(), results.clone());
                async move {
                    let (id, queued) = batch[i];
                    let r = http.get(http.auth(i), &format!("/api/v1/workloads/{id}")).await;
                    let w = match r {
                        Ok((s, b)) if s.is_success() => serde_json::from_slice::<Brief>(&b).ok(),
                        _ => None,
                    };
                    results.lock().expect("lock").push((id, queued, w));
                }
            })
            .await;
        }
        let results = std::mem::take(&mut *results.lock().expect("lock"));
        let seen: std::collections::HashSet<u64> = results.iter().map(|r| r.0).collect();
        let mut again: Vec<(u64, bool)> = todo.into_iter().filter(|c| !seen.contains(&c.0)).collect();
        for (id, queued, w) in results {
            match w {
                None => {
                    read_errors += 1;
                    again.push((id, queued));
                }
                Some(w) if waiting(&w.state) => again.push((w.id, queued)),
                Some(w) => match w.request_to_running_ms {
                    Some(ms) => {
                        r2r_all.push(ms * 1000);
                        if queued {
                            r2r_queued.push(ms * 1000);
                        } else {
                            r2r_direct.push(ms * 1000);
                        }
                    }
                    None => never_ran_ended += 1,
                },
            }
        }
        todo = again;
        if todo.is_empty() || Instant::now() >= settle_deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let never_ran = never_ran_ended + todo.len() as u64;
    for id in &token_ids {
        let _ = http.delete(&http.admin, &format!("/api/v1/tokens/{id}")).await;
    }
    for v in [&mut r2r_all, &mut r2r_direct, &mut r2r_queued] {
        v.sort_unstable();
    }

    let creates_per_sec = (created.len() as f64 / create_wall).round();
    let reads_per_sec = (read.lat_us.len() as f64 / read_wall).round();
    let out = json!({
        "clients": a.clients,
        "shapes": a.shapes.join(","),
        "rate": a.rate,
        "duration_s": [a.min_duration_s, a.max_duration_s],
        "created": created.len(),
        "create_errors": create.errors,
        "creates_per_sec": creates_per_sec,
        "create_p50_ms": percentile_ms(&create.lat_us, 0.5),
        "create_p99_ms": percentile_ms(&create.lat_us, 0.99),
        "reads": read.lat_us.len(),
        "read_errors": read.errors,
        "reads_per_sec": reads_per_sec,
        "read_p50_ms": percentile_ms(&read.lat_us, 0.5),
        "read_p99_ms": percentile_ms(&read.lat_us, 0.99),
        "ran": r2r_all.len(),
        "request_to_running_p50_ms": percentile_ms(&r2r_all, 0.5),
        "request_to_running_p99_ms": percentile_ms(&r2r_all, 0.99),
        "queued_at_create": queued_at_create,
        "placed_at_once_request_to_running_p50_ms": percentile_ms(&r2r_direct, 0.5),
        "placed_at_once_request_to_running_p99_ms": percentile_ms(&r2r_direct, 0.99),
        "queued_request_to_running_p50_ms": percentile_ms(&r2r_queued, 0.5),
        "queued_request_to_running_p99_ms": percentile_ms(&r2r_queued, 0.99),
        "never_ran": never_ran,
        "still_waiting": todo.len(),
        "server_cpu_us_per_create": create_cpu_us,
        "server_cpu_us_per_read": read_cpu_us,
    });
    if a.json {
        println!("{out}");
        return Ok(());
    }
    println!(
        "API benchmark against {} with {} clients; shapes {}, runs of {}-{} s{}",
        http.base,
        a.clients,
        a.shapes.join(","),
        a.min_duration_s,
        a.max_duration_s,
        if a.rate > 0.0 {
            format!(", creations paced at {}/s", a.rate)
        } else {
            String::new()
        }
    );
    println!(
        "  creations     {} in {create_wall:.2} s: {creates_per_sec:.0}/s   latency p50 {} ms  p99 {} ms{}",
        created.len(),
        out["create_p50_ms"],
        out["create_p99_ms"],
        errors_note(&create)
    );
    println!(
        "  reads         {} in {read_wall:.2} s: {reads_per_sec:.0}/s   latency p50 {} ms  p99 {} ms{}",
        read.lat_us.len(),
        out["read_p50_ms"],
        out["read_p99_ms"],
        errors_note(&read)
    );
    println!(
        "  to running    p50 {} ms  p99 {} ms over {} that ran; {} never ran{}",
        out["request_to_running_p50_ms"],
        out["request_to_running_p99_ms"],
        r2r_all.len(),
        never_ran,
        if todo.is_empty() {
            String::new()
        } else {
            format!(" ({} still waiting after {} s)", todo.len(), a.settle_s)
        }
    );
    println!(
        "    placed at once   {}: p50 {} ms  p99 {} ms",
        r2r_direct.len(),
        out["placed_at_once_request_to_running_p50_ms"],
        out["placed_at_once_request_to_running_p99_ms"]
    );
    println!(
        "    queued first     {}: p50 {} ms  p99 {} ms",
        r2r_queued.len(),
        out["queued_request_to_running_p50_ms"],
        out["queued_request_to_running_p99_ms"]
    );
    if read_errors > 0 {
        println!("  ({read_errors} failed reads while collecting request-to-running, retried)");
    }
    if let Some(pid) = a.server_pid {
        let us = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0} µs"));
        println!(
            "  server CPU    (pid {pid}) {} a creation, {} a read",
            us(create_cpu_us),
            us(read_cpu_us)
        );
    }
    Ok(())
}

fn errors_note(t: &Tally) -> String {
    match &t.first_error {
        None => String::new(),
        Some(e) => format!("\n    {} errors; first: {e}", t.errors),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_in_ms() {
        let v: Vec<u64> = (1..=100).map(|x| x * 1000).collect();
        assert_eq!(percentile_ms(&v, 0.5), 51.0);
        assert_eq!(percentile_ms(&v, 0.99), 99.0);
        assert_eq!(percentile_ms(&[], 0.99), 0.0);
    }

    #[test]
    fn this_process_cpu_time_is_read_and_grows() {
        let me = std::process::id();
        let before = process_cpu_s(me).unwrap();
        // Burn CPU until the reading moves (clock ticks are coarse): it must, and not backwards.
        let t = Instant::now();
        let mut after = before;
        let mut x = 0u64;
        while after <= before && t.elapsed() < Duration::from_secs(10) {
            let burst = Instant::now();
            while burst.elapsed() < Duration::from_millis(20) {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
            after = process_cpu_s(me).unwrap();
        }
        std::hint::black_box(x);
        assert!(after > before, "{before} -> {after}");
        assert!(
            process_cpu_s(u32::MAX)
                .unwrap_err()
                .to_string()
                .contains("--server-pid")
        );
    }

    #[test]
    fn cpu_per_request() {
        assert_eq!(cpu_per_request_us(Some(1.0), Some(1.5), 1000), Some(500.0));
        assert_eq!(cpu_per_request_us(None, Some(1.5), 1000), None);
        assert_eq!(cpu_per_request_us(Some(1.0), Some(1.5), 0), None);
    }

    #[test]
    fn mix_has_every_kind() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let all = kinds(&["fraction".into(), "mig".into(), "gpus".into()]).unwrap();
        let shapes: Vec<_> = (0..300).map(|_| shape(&mut rng, &all)).collect();
        for k in ["fraction", "mig", "gpus"] {
            assert!(shapes.iter().any(|s| s.get(k).is_some()), "{k}");
        }
        assert!(shapes.iter().all(|s| {
            s.get("fraction")
                .is_none_or(|f| (100..=900).contains(&f.as_u64().unwrap()))
        }));
    }
}
