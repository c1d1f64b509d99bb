//! Helpers shared by the integration tests of the `tessera` binary (each test file that needs
//! them says `mod support;`):
//!
//! * processes: `tessera serve` started and waited for until it serves ([`serve_command`],
//!   [`wait_until_serving`]), the CLI run as a user runs it ([`tessera`]), children killed on
//!   drop, temporary directories, free ports, the OIDC provider of the security tests;
//! * polling with a deadline ([`poll`], [`eventually`]);
//! * for the observability tests, a `tessera serve` on a free loopback port with an admin and a
//!   metrics token ([`Server`]), a strict parser of the Prometheus text format (0.0.4) and the
//!   metric names a PromQL expression uses.

// Every test binary compiles this module on its own and uses only part of it.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The `tessera` binary under test.
pub const TESSERA: &str = env!("CARGO_BIN_EXE_tessera");

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

pub use tessera_testdb::TempDir;

/// A child process killed (and reaped) on drop, also when a test panics.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A free TCP port on 127.0.0.1 for a process a test starts (below the ephemeral range: see
/// [`tessera_testdb::free_port`]).
pub use tessera_testdb::free_port;

/// The admin token the first start of a server wrote to its data directory.
pub fn admin_token(data_dir: &Path) -> String {
    std::fs::read_to_string(data_dir.join("admin-token"))
        .unwrap()
        .trim()
        .to_string()
}

/// What a finished command left: its exit code (-1 when a signal ended it), stdout and stderr.
pub fn exit_and_output(out: Output) -> (i32, String, String) {
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// Runs the `tessera` CLI with `args` and the variables `env`; `TESSERA_TOKEN` is not inherited
/// from the test's environment and there is no stored credential (`XDG_CONFIG_HOME` points
/// nowhere unless `env` sets it). Exit code, stdout and stderr.
pub fn tessera(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    exit_and_output(cli_command(args, env).output().unwrap())
}

/// [`tessera`] with `stdin` written to the command's standard input.
pub fn tessera_with_stdin(args: &[&str], env: &[(&str, &str)], stdin: &str) -> (i32, String, String) {
    let mut child = cli_command(args, env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    exit_and_output(child.wait_with_output().unwrap())
}

fn cli_command(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(TESSERA);
    cmd.args(args)
        .env("XDG_CONFIG_HOME", "/nonexistent")
        .env_remove("TESSERA_TOKEN")
        .envs(env.iter().copied());
    cmd
}

/// A workload's state as `tessera describe ID -o json` shows it.
pub fn workload_state(env: &[(&str, &str)], id: u64) -> String {
    let (code, out, err) = tessera(&["describe", &id.to_string(), "-o", "json"], env);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    v["workload"]["state"]
        .as_str()
        .or(v["state"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// `tessera serve` with quiet logs (`RUST_LOG=warn`) and stderr discarded: the caller adds the
/// flags (and may set another log level or stderr), then starts it with [`wait_until_serving`].
pub fn serve_command() -> Command {
    let mut cmd = Command::new(TESSERA);
    cmd.arg("serve").env("RUST_LOG", "warn").stderr(Stdio::null());
    cmd
}

/// [`serve_command`] on a free loopback port with the Kubernetes backend on the cluster that
/// `kubeconfig` reaches (stderr shown): a 1 s grace, the MIG manager's config map, data in
/// `data`, and the caller's `extra` flags.
pub fn kube_serve_command(data: &Path, kubeconfig: &Path, extra: &[&str]) -> Command {
    let mut cmd = serve_command();
    cmd.args(["--backend", "kubernetes", "--grace-s", "1"])
        .args(["--kube-mig-configmap", "default/mig-parted", "--listen", "127.0.0.1:0"])
        .args(extra)
        .arg("--data-dir")
        .arg(data)
        .env("KUBECONFIG", kubeconfig)
        .stderr(Stdio::inherit());
    cmd
}

/// Starts `cmd` (a [`kube_serve_command`]) and waits up to a minute until it serves, with the
/// cluster's GPU nodes as `fleet` counts them (`16 GPUs on 2 nodes`) in its banner.
pub fn serving_kube(mut cmd: Command, fleet: &str) -> Serving {
    let server = try_wait_until_serving(&mut cmd, Duration::from_secs(60)).expect("server did not start");
    let banner = server.banner();
    assert!(
        banner.contains(&format!("the Kubernetes cluster's GPU nodes ({fleet})")),
        "{banner}"
    );
    server
}

/// Runs `serve` on `dir/data` and the cluster `kubeconfig` reaches off the runtime (it blocks
/// until the server serves): the server, and the admin token it wrote.
pub async fn serve_kube_in(dir: &TempDir, kubeconfig: &Path, serve: fn(&Path, &Path) -> Serving) -> (Serving, String) {
    let data = dir.0.join("data");
    let server = tokio::task::spawn_blocking({
        let (data, kc) = (data.clone(), kubeconfig.to_path_buf());
        move || serve(&data, &kc)
    })
    .await
    .unwrap();
    (server, admin_token(&data))
}

/// [`serve_command`] on a free loopback port, with the simulated backend (the seed fleet),
/// no rate limit and a telemetry sample every `telemetry_ms`.
pub fn sim_serve_command(telemetry_ms: u64) -> Command {
    let mut cmd = serve_command();
    cmd.args(["--listen", "127.0.0.1:0", "--rate-limit", "0"])
        .args(["--sim-telemetry-ms", &telemetry_ms.to_string()]);
    cmd
}

/// A started `tessera serve`, killed (and reaped) on drop.
pub struct Serving {
    pub child: Child,
    /// `http://ADDR`: the API and the console.
    pub base: String,
    /// The admin token printed at the first start on a data directory or database (none later).
    pub admin_token: Option<String>,
    /// What it printed, up to the line with its address.
    pub printed: Vec<String>,
}

impl Serving {
    /// The rest of the printed line that starts with `prefix`.
    pub fn printed_after(&self, prefix: &str) -> Option<&str> {
        self.printed.iter().find_map(|l| l.strip_prefix(prefix))
    }

    /// The line that gave the address (it says what the server serves).
    pub fn banner(&self) -> &str {
        self.printed.last().unwrap()
    }

    /// `kill -9`, and reaps it.
    pub fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `cmd` (a `tessera serve`, see [`serve_command`]) and reads its stdout until it prints
/// its console address, at most `limit` long; then a thread keeps reading stdout so that the
/// server never blocks on a full pipe. Fails the test if it does not serve in time.
pub fn wait_until_serving(cmd: &mut Command, limit: Duration) -> Serving {
    try_wait_until_serving(cmd, limit).unwrap_or_else(|e| panic!("{e}"))
}

/// [`wait_until_serving`], with what went wrong as an error; the process is killed then.
pub fn try_wait_until_serving(cmd: &mut Command, limit: Duration) -> Result<Serving, String> {
    const ADDRESS: &str = "console http://";
    let deadline = Instant::now() + limit;
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("tessera serve does not start: {e}"))?;
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        let mut line = Vec::new();
        while stdout.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
            if let Some(to) = &tx {
                let text = String::from_utf8_lossy(&line)
                    .trim_end_matches(['\r', '\n'])
                    .to_string();
                let last = text.contains(ADDRESS);
                let _ = to.send(text);
                if last {
                    tx = None;
                }
            }
            line.clear();
        }
    });
    let mut printed: Vec<String> = Vec::new();
    let failed = |mut child: Child, why: String| {
        let _ = child.kill();
        let _ = child.wait();
        Err(why)
    };
    while !printed.last().is_some_and(|l| l.contains(ADDRESS)) {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => printed.push(line),
            Err(RecvTimeoutError::Timeout) => {
                return failed(
                    child,
                    format!("tessera serve did not come up within {limit:?}: {printed:?}"),
                );
            }
            Err(RecvTimeoutError::Disconnected) => {
                return failed(child, format!("tessera serve ended before it served: {printed:?}"));
            }
        }
    }
    let address = printed.last().unwrap().split(ADDRESS).nth(1).unwrap();
    let base = format!("http://{}", address.split('/').next().unwrap());
    let admin_token = printed
        .iter()
        .find_map(|l| l.strip_prefix("Admin token: "))
        .map(|t| t.trim().to_string());
    Ok(Serving {
        child,
        base,
        admin_token,
        printed,
    })
}

/// Calls `f` every `every` until it returns `Ok`; fails the test with the last `Err` (what is
/// still missing) once `deadline` has passed.
pub async fn poll<T, F, Fut>(deadline: Instant, every: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    loop {
        match f().await {
            Ok(x) => return x,
            Err(missing) => assert!(Instant::now() < deadline, "{missing}"),
        }
        tokio::time::sleep(every).await;
    }
}

/// A deterministic pseudo-random stream (xorshift64) from `seed`.
pub fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// The OpenID Connect provider of the security tests (panva/oidc-provider, installed by
/// scripts/test.sh in crates/tessera-server/tests/oidc) on a free loopback port, once it is
/// ready; `redirect_uri` is the console's callback, when it signs in. The child and the issuer.
pub fn oidc_provider(redirect_uri: Option<&str>) -> (ChildGuard, String) {
    let oidc_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tessera-server/tests/oidc");
    assert!(
        oidc_dir.join("node_modules/oidc-provider").exists(),
        "the OIDC provider is not installed: run scripts/test.sh"
    );
    let port = free_port();
    let mut cmd = Command::new("node");
    cmd.arg(oidc_dir.join("provider.mjs"))
        .env("PORT", port.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(uri) = redirect_uri {
        cmd.env("REDIRECT_URI", uri);
    }
    let mut provider = cmd.spawn().unwrap();
    let mut lines = BufReader::new(provider.stdout.take().unwrap()).lines();
    let provider = ChildGuard(provider);
    assert!(lines.next().unwrap().unwrap().starts_with("ready"));
    // Keep reading stdout so the provider never writes to a closed or full pipe.
    std::thread::spawn(move || for _ in lines {});
    (provider, format!("http://127.0.0.1:{port}"))
}

/// Writes `oidc.toml` into `dir` for `tessera serve --oidc`: tokens of `issuer` for the
/// `tessera` audience, `client` lines (the console's client, if any), and members of the group
/// `vision-admins` as tenant-admins of `vision`. Returns its path.
pub fn oidc_config(dir: &Path, issuer: &str, client: &str) -> PathBuf {
    let path = dir.join("oidc.toml");
    std::fs::write(
        &path,
        format!(
            "issuer = \"{issuer}\"\naudience = \"tessera\"\nalgorithms = [\"RS256\"]\n{client}[[mapping]]\nclaim = \"groups\"\nvalue = \"vision-admins\"\ntenant = \"vision\"\nrole = \"tenant-admin\"\n"
        ),
    )
    .unwrap();
    path
}

/// A running `tessera serve` on the seed fleet with the simulated backend.
pub struct Server {
    pub base: String,
    /// `--metrics-listen` address, when asked for.
    pub metrics_base: Option<String>,
    pub token: String,
    /// A `metrics` token (made with `tessera token create --role metrics`): what Prometheus
    /// presents to read `/metrics` on the API address.
    pub metrics_token: String,
    pub http: reqwest::Client,
    _serving: Serving,
    _dir: TempDir,
}

impl Server {
    /// Starts `tessera serve` on 127.0.0.1 (a free port), with a fresh data directory.
    pub fn start(tag: &str, metrics_listen: bool) -> Server {
        let dir = TempDir::new(tag);
        let mut cmd = sim_serve_command(250);
        cmd.args(["--min-runtime-s", "0", "--data-dir"]).arg(dir.0.join("data"));
        if metrics_listen {
            cmd.args(["--metrics-listen", "127.0.0.1:0"]);
        }
        let serving = wait_until_serving(&mut cmd, Duration::from_secs(60));
        let metrics_base = serving
            .printed_after("Prometheus metrics: ")
            .map(|m| m.trim().trim_end_matches("/metrics").to_string());
        let base = serving.base.clone();
        let token = serving.admin_token.clone().expect("first start prints the admin token");
        let (code, out, err) = tessera(
            &[
                "--server",
                &base,
                "--token",
                &token,
                "-o",
                "json",
                "token",
                "create",
                "--role",
                "metrics",
                "--name",
                "prometheus",
            ],
            &[],
        );
        assert!(code == 0, "{err}");
        let created: Value = serde_json::from_str(&out).expect("the created token as JSON");
        Server {
            base,
            metrics_base,
            token,
            metrics_token: created["token"].as_str().expect("a secret").to_string(),
            http: reqwest::Client::new(),
            _serving: serving,
            _dir: dir,
        }
    }

    pub async fn call(&self, method: reqwest::Method, path: &str, token: &str, body: Option<Value>) -> (u16, Value) {
        let mut rb = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token);
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let r = rb.send().await.unwrap();
        let st = r.status().as_u16();
        let text = r.text().await.unwrap();
        (st, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call(reqwest::Method::POST, path, &self.token, Some(body)).await
    }

    pub async fn put(&self, path: &str, body: Value) -> (u16, Value) {
        self.call(reqwest::Method::PUT, path, &self.token, Some(body)).await
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.call(reqwest::Method::GET, path, &self.token, None).await
    }

    /// `GET /metrics` on the API address, with the metrics token.
    pub async fn scrape(&self) -> String {
        scrape(&self.http, &self.base, Some(&self.metrics_token)).await
    }

    /// Creates a tenant with projects.
    pub async fn tenant(&self, name: &str, projects: &[&str]) {
        let (st, b) = self.post("/api/v1/tenants", serde_json::json!({ "name": name })).await;
        assert_eq!(st, 201, "{b}");
        for p in projects {
            let (st, b) = self
                .post(
                    &format!("/api/v1/tenants/{name}/projects"),
                    serde_json::json!({ "name": p }),
                )
                .await;
            assert_eq!(st, 201, "{b}");
        }
    }
}

/// `GET {base}/metrics`, with a bearer token (the API address) or without (`--metrics-listen`).
pub async fn scrape(http: &reqwest::Client, base: &str, token: Option<&str>) -> String {
    let mut rb = http.get(format!("{base}/metrics"));
    if let Some(t) = token {
        rb = rb.bearer_auth(t);
    }
    let r = rb.send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let ct = r.headers().get("content-type").unwrap().to_str().unwrap().to_string();
    assert_eq!(ct, "text/plain; version=0.0.4; charset=utf-8");
    r.text().await.unwrap()
}

/// One sample of an exposition.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed exposition: family types and samples.
#[derive(Debug, Default)]
pub struct Exposition {
    pub types: BTreeMap<String, String>,
    pub samples: Vec<Sample>,
}

impl Exposition {
    /// Every sample name (with `_bucket`, `_count`, `_sum`, `_total`).
    pub fn names(&self) -> BTreeSet<String> {
        self.samples.iter().map(|s| s.name.clone()).collect()
    }

    pub fn find<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }
}

fn is_name(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(ch) if ch.is_ascii_alphabetic() || ch == '_' || ch == ':')
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == ':')
}

fn is_label_name(s: &str) -> bool {
    is_name(s) && !s.contains(':') && !s.starts_with("__")
}

fn parse_value(v: &str) -> Result<f64, String> {
    match v {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => v.parse::<f64>().map_err(|_| format!("bad value `{v}`")),
    }
}

/// The family a sample belongs to, given the declared types.
fn family_of<'a>(name: &'a str, types: &BTreeMap<String, String>) -> &'a str {
    for suffix in ["_bucket", "_count", "_sum"] {
        if let Some(base) = name.strip_suffix(suffix)
            && types.get(base).is_some_and(|t| t == "histogram" || t == "summary")
        {
            return base;
        }
    }
    name
}

/// Parses the Prometheus text format strictly: names and label syntax, escapes, values, one
/// TYPE per family before its samples, families not interleaved, no duplicate series, counters
/// named `_total`, histogram buckets cumulative with `+Inf` equal to `_count`.
pub fn parse_exposition(text: &str) -> Result<Exposition, String> {
    let mut e = Exposition::default();
    let mut seen_series: HashMap<String, ()> = HashMap::new();
    let mut done_families: BTreeSet<String> = BTreeSet::new();
    let mut current: Option<String> = None;
    let mut helps: BTreeSet<String> = BTreeSet::new();
    for (i, line) in text.lines().enumerate() {
        let ln = i + 1;
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let rest = rest.trim_start();
            let mut parts = rest.splitn(3, ' ');
            match parts.next() {
                Some("HELP") => {
                    let name = parts.next().ok_or(format!("line {ln}: HELP without a name"))?;
                    if !is_name(name) || !helps.insert(name.to_string()) {
                        return Err(format!("line {ln}: bad or repeated HELP for `{name}`"));
                    }
                }
                Some("TYPE") => {
                    let name = parts.next().ok_or(format!("line {ln}: TYPE without a name"))?;
                    let ty = parts.next().ok_or(format!("line {ln}: TYPE without a type"))?;
                    if !is_name(name) {
                        return Err(format!("line {ln}: bad metric name `{name}`"));
                    }
                    if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&ty) {
                        return Err(format!("line {ln}: unknown type `{ty}`"));
                    }
                    if e.types.insert(name.to_string(), ty.to_string()).is_some() {
                        return Err(format!("line {ln}: second TYPE for `{name}`"));
                    }
                    if done_families.contains(name) || current.as_deref() == Some(name) {
                        return Err(format!("line {ln}: TYPE for `{name}` after its samples"));
                    }
                    if ty == "counter" && !name.ends_with("_total") {
                        return Err(format!("line {ln}: counter `{name}` is not named _total"));
                    }
                }
                _ => {}
            }
            continue;
        }
        // name{labels} value [timestamp]
        let (name, rest) = match line.find(['{', ' ']) {
            Some(p) => (&line[..p], &line[p..]),
            None => return Err(format!("line {ln}: no value")),
        };
        if !is_name(name) {
            return Err(format!("line {ln}: bad metric name `{name}`"));
        }
        let mut labels = BTreeMap::new();
        let rest = if let Some(body) = rest.strip_prefix('{') {
            let mut chars = body.char_indices().peekable();
            let end;
            loop {
                while chars.peek().is_some_and(|(_, c)| *c == ' ') {
                    chars.next();
                }
                match chars.peek() {
                    Some((p, '}')) => {
                        end = *p;
                        break;
                    }
                    None => return Err(format!("line {ln}: unterminated labels")),
                    _ => {}
                }
                let mut key = String::new();
                while let Some((_, c)) = chars.peek() {
                    if *c == '=' {
                        break;
                    }
                    key.push(*c);
                    chars.next();
                }
                if chars.next().map(|x| x.1) != Some('=') || chars.next().map(|x| x.1) != Some('"') {
                    return Err(format!("line {ln}: label `{key}` without =\"value\""));
                }
                if !is_label_name(&key) {
                    return Err(format!("line {ln}: bad label name `{key}`"));
                }
                let mut val = String::new();
                loop {
                    match chars.next() {
                        Some((_, '\\')) => match chars.next() {
                            Some((_, 'n')) => val.push('\n'),
                            Some((_, '\\')) => val.push('\\'),
                            Some((_, '"')) => val.push('"'),
                            other => return Err(format!("line {ln}: bad escape {other:?}")),
                        },
                        Some((_, '"')) => break,
                        Some((_, c)) => val.push(c),
                        None => return Err(format!("line {ln}: unterminated label value")),
                    }
                }
                if labels.insert(key.clone(), val).is_some() {
                    return Err(format!("line {ln}: label `{key}` twice"));
                }
                match chars.next() {
                    Some((_, ',')) => continue,
                    Some((p, '}')) => {
                        end = p;
                        break;
                    }
                    other => return Err(format!("line {ln}: expected , or }} after a label, got {other:?}")),
                }
            }
            &body[end + 1..]
        } else {
            rest
        };
        let mut fields = rest.split_whitespace();
        let value =
            parse_value(fields.next().ok_or(format!("line {ln}: no value"))?).map_err(|m| format!("line {ln}: {m}"))?;
        if let Some(ts) = fields.next() {
            ts.parse::<i64>()
                .map_err(|_| format!("line {ln}: bad timestamp `{ts}`"))?;
        }
        if fields.next().is_some() {
            return Err(format!("line {ln}: trailing fields"));
        }
        let family = family_of(name, &e.types).to_string();
        if current.as_deref() != Some(family.as_str()) {
            if let Some(c) = current.take() {
                done_families.insert(c);
            }
            if done_families.contains(&family) {
                return Err(format!("line {ln}: samples of `{family}` are not grouped together"));
            }
            current = Some(family.clone());
        }
        let key = format!("{name}{labels:?}");
        if seen_series.insert(key.clone(), ()).is_some() {
            return Err(format!("line {ln}: duplicate series {key}"));
        }
        e.samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    check_histograms(&e)?;
    Ok(e)
}

fn check_histograms(e: &Exposition) -> Result<(), String> {
    for (fam, ty) in &e.types {
        if ty != "histogram" {
            continue;
        }
        let mut buckets: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        let mut counts: BTreeMap<String, f64> = BTreeMap::new();
        for s in &e.samples {
            let mut l = s.labels.clone();
            if s.name == format!("{fam}_bucket") {
                let le = l.remove("le").ok_or(format!("{fam}: bucket without le"))?;
                let le = parse_value(&le)?;
                buckets.entry(format!("{l:?}")).or_default().push((le, s.value));
            } else if s.name == format!("{fam}_count") {
                counts.insert(format!("{l:?}"), s.value);
            }
        }
        for (k, mut b) in buckets {
            b.sort_by(|x, y| x.0.partial_cmp(&y.0).unwrap());
            if b.windows(2).any(|w| w[1].1 < w[0].1) {
                return Err(format!("{fam}{k}: buckets are not cumulative"));
            }
            let last = b.last().unwrap();
            if last.0 != f64::INFINITY {
                return Err(format!("{fam}{k}: no +Inf bucket"));
            }
            if counts.get(&k) != Some(&last.1) {
                return Err(format!("{fam}{k}: _count differs from the +Inf bucket"));
            }
        }
    }
    Ok(())
}

const KEYWORDS: [&str; 14] = [
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "atan2",
    "inf",
    "nan",
];

/// Aggregation operators, which may be followed by `by (...)` before their parentheses.
const AGGREGATIONS: [&str; 14] = [
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// The metric names a PromQL expression (or a Grafana `label_values(...)` query) selects.
pub fn promql_metric_names(expr: &str) -> BTreeSet<String> {
    // Grafana template queries: label_values(selector, label) / label_values(label).
    if let Some(inner) = expr.trim().strip_prefix("label_values(") {
        let inner = inner.trim_end().trim_end_matches(')');
        return match inner.rsplit_once(',') {
            Some((sel, _)) => promql_metric_names(sel),
            None => BTreeSet::new(),
        };
    }
    if let Some(inner) = expr.trim().strip_prefix("query_result(") {
        return promql_metric_names(inner.trim_end().trim_end_matches(')'));
    }
    let chars: Vec<char> = expr.chars().collect();
    let mut out = BTreeSet::new();
    let mut i = 0;
    let mut after_grouping_keyword = false;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => {
                i += 1;
                while i < chars.len() && chars[i] != c {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
            '{' | '[' => {
                let close = if c == '{' { '}' } else { ']' };
                while i < chars.len() && chars[i] != close {
                    if chars[i] == '"' {
                        i += 1;
                        while i < chars.len() && chars[i] != '"' {
                            if chars[i] == '\\' {
                                i += 1;
                            }
                            i += 1;
                        }
                    }
                    i += 1;
                }
                i += 1;
            }
            '$' => {
                // Grafana variables: $name, ${name...}
                i += 1;
                if i < chars.len() && chars[i] == '{' {
                    while i < chars.len() && chars[i] != '}' {
                        i += 1;
                    }
                    i += 1;
                } else {
                    while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                        i += 1;
                    }
                }
            }
            '(' if after_grouping_keyword => {
                // by (...), on (...), group_left (...): label names, not metrics.
                while i < chars.len() && chars[i] != ')' {
                    i += 1;
                }
                i += 1;
                after_grouping_keyword = false;
            }
            c if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit())) => {
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    // 1e-3
                    if (chars[i] == 'e' || chars[i] == 'E') && chars.get(i + 1).is_some_and(|x| *x == '-' || *x == '+')
                    {
                        i += 1;
                    }
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':') {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut j = i;
                while j < chars.len() && chars[j].is_whitespace() {
                    j += 1;
                }
                let lower = word.to_ascii_lowercase();
                if ["by", "without", "on", "ignoring", "group_left", "group_right"].contains(&lower.as_str()) {
                    after_grouping_keyword = true;
                    continue;
                }
                after_grouping_keyword = false;
                let is_call = j < chars.len() && chars[j] == '(';
                if is_call || KEYWORDS.contains(&lower.as_str()) || AGGREGATIONS.contains(&lower.as_str()) {
                    continue;
                }
                out.insert(word);
            }
            c if c.is_whitespace() => i += 1,
            _ => {
                after_grouping_keyword = false;
                i += 1;
            }
        }
    }
    out
}

/// Every `expr` of an alerts file and every query of a Grafana dashboard: (where, expression).
pub fn alert_exprs(path: &Path) -> Vec<(String, String)> {
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut out = Vec::new();
    for g in doc["groups"].as_sequence().unwrap() {
        for r in g["rules"].as_sequence().unwrap() {
            let name = r["alert"].as_str().or(r["record"].as_str()).unwrap_or("?");
            out.push((name.to_string(), r["expr"].as_str().unwrap().to_string()));
        }
    }
    out
}

pub fn dashboard_exprs(v: &Value, at: &str, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(m) => {
            // A data-source variable's `query` is a plugin type, not PromQL.
            let datasource_var = m.get("type").and_then(Value::as_str) == Some("datasource");
            for (k, x) in m {
                if datasource_var && k == "query" {
                    continue;
                }
                match (k.as_str(), x) {
                    ("expr", Value::String(s)) => out.push((at.to_string(), s.clone())),
                    ("query", Value::String(s)) | ("definition", Value::String(s)) if !s.is_empty() => {
                        out.push((at.to_string(), s.clone()))
                    }
                    ("query", Value::Object(q)) => {
                        if let Some(Value::String(s)) = q.get("query") {
                            out.push((at.to_string(), s.clone()));
                        }
                    }
                    _ => {
                        let title = m.get("title").and_then(Value::as_str).unwrap_or("");
                        let here = if title.is_empty() {
                            at.to_string()
                        } else {
                            format!("{at} / {title}")
                        };
                        dashboard_exprs(x, &here, out)
                    }
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| dashboard_exprs(x, at, out)),
        _ => {}
    }
}

/// The DCGM exporter's metric names (default counters, `etc/default-counters.csv`, and the
/// commonly enabled optional ones).
pub const DCGM_METRICS: &[&str] = &[
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
];

/// Polls `f` every `every` until it returns `Some`, at most `limit` long.
pub async fn eventually<T, F, Fut>(limit: Duration, every: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(x) = f().await {
            return Some(x);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod self_tests {
    use super::*;

    #[test]
    fn metric_names_of_promql() {
        let n = promql_metric_names(
            r#"sum by (pool) (rate(tessera_x_total{a="b,c}"}[5m])) / on (pool) group_left(model) tessera_y > 0.9 and absent(up{job="t"}) or vector(1e-3) + $var * 2"#,
        );
        assert_eq!(
            n.into_iter().collect::<Vec<_>>(),
            vec!["tessera_x_total", "tessera_y", "up"]
        );
        let n = promql_metric_names("label_values(tessera_gpus{pool=~\"$pool\"}, model)");
        assert_eq!(n.into_iter().collect::<Vec<_>>(), vec!["tessera_gpus"]);
        let n = promql_metric_names("max(DCGM_FI_DEV_GPU_TEMP) without (gpu) offset 5m");
        assert_eq!(n.into_iter().collect::<Vec<_>>(), vec!["DCGM_FI_DEV_GPU_TEMP"]);
    }

    #[test]
    fn exposition_parser_rejects_bad_text() {
        assert!(parse_exposition("# TYPE a gauge\na{x=\"1\"} 1\na{x=\"2\"} 2\n").is_ok());
        assert!(parse_exposition("a{x=\"1} 1\n").is_err());
        assert!(parse_exposition("a 1\nb 1\na 2\n").is_err(), "not grouped / duplicate");
        assert!(
            parse_exposition("# TYPE c counter\nc 1\n").is_err(),
            "counter without _total"
        );
        assert!(parse_exposition("a{x=\"1\"} one\n").is_err());
        assert!(
            parse_exposition("# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\nh_sum 1\n")
                .is_err()
        );
    }
}
