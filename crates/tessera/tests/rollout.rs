//! A full rolling driver upgrade of the `seed` fleet (all 60 nodes) through the control plane
//! (HTTP, the lifecycle loop, SQLite, the simulated backend with a 1 s upgrade), loaded with
//! the scenario generator's mix (8-GPU and smaller training gangs with leases, MIG inference
//! services, fractional interactive notebooks) from eight tenants, then one rollout per pool.
//! Time is compressed: one second of the scenario's clock stands for one hour (a 2–12 h gang
//! runs 2–12 s), so GPU-unit-seconds read as GPU-unit-hours.
//!
//! The clock is Tokio's, paused and stepped by the test ([`Plane::step`]): the server's
//! clock, its loop's timers and the simulated backend's all follow it, and after each step of
//! 100 ms the test waits until the control plane has done what that step started
//! ([`tessera_server::lifecycle::Lifecycle::settled`]). A loaded machine makes the test take
//! longer, never the rollouts: before, on the wall clock, one CI run under load measured the
//! drain-aware rollout at 23.9 h and 1,512.8 GPU-unit-hours lost (13.7 h and 749.2 alone).
//!
//! It asserts zero cut-offs (no workload stopped before its lease end; services moved
//! replacement-first), that every node passed through upgrading and validation (the audit log),
//! and that every node is back in placement; then, on a second control plane with the same
//! load, it runs a naive rollout the same way (nodes in fleet order, cordon, wait for the
//! deadline, stop what is left), prints both (`cargo test -p tessera --test integration
//! rollout:: -- --nocapture`), and asserts that the drain-aware rollout loses less capacity
//! than the naive one.
//!
//! The CLI verbs' test runs `tessera serve` on the wall clock (`--sim-upgrade-duration 1s`).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::{Serving, TempDir, sim_serve_command, tessera, try_wait_until_serving};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use reqwest::Method;
use serde_json::{Value, json};
use tessera_backend_sim::{SimBackend, SimConfig, SimGpu, SimMode};
use tessera_model::{Fleet, Shape};
use tessera_server::{Running, ServerConfig, now_ms};

/// One scenario second is one scenario hour.
const HOUR_MS: i64 = 3_600_000;
const MAX_PARALLEL: usize = 8;
/// The naive rollout's drain deadline, ms (three scenario hours).
const NAIVE_DEADLINE_MS: i64 = 3_000;
const UPGRADE_MS: i64 = 1_000;
/// How far the clock moves per step (six scenario minutes): the test reads and acts (the
/// naive rollout's controller) between steps.
const STEP: Duration = Duration::from_millis(100);

/// Runs `f` on a current-thread runtime whose clock is paused and moves only when the test
/// steps it: a blocking task held open for the whole run keeps Tokio from advancing the clock
/// by itself while the runtime waits (it would while SQLite's threads work), and the server's
/// clock follows Tokio's.
fn on_stepped_clock<T>(f: impl Future<Output = T>) -> T {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        tessera_server::clock::follow_tokio_clock();
        let (hold, held) = std::sync::mpsc::channel::<()>();
        let holder = tokio::task::spawn_blocking(move || {
            let _ = held.recv();
        });
        let out = f.await;
        drop(hold);
        holder.await.unwrap();
        out
    })
}

/// A control plane in this process on the stepped clock, and what the test reaches it with.
struct Plane {
    running: Running,
    base: String,
    token: String,
    http: reqwest::Client,
    _dir: TempDir,
}

async fn plane(tag: &str) -> Plane {
    let dir = TempDir::new(&format!("rollout-{tag}"));
    let cfg = ServerConfig {
        grace: Duration::from_secs(1),
        sim_upgrade: Some(Duration::from_secs(1)),
        rate_limit: 0.0,
        ..ServerConfig::local(dir.0.clone())
    };
    let sim = SimConfig {
        mode: SimMode::Exact,
        mig_partition_time: Duration::ZERO,
        telemetry_interval: Duration::from_millis(200),
        ..SimConfig::default()
    };
    let backend = Arc::new(SimBackend::new(sim, SimGpu::for_fleet(&cfg.fleet)));
    let store = Arc::new(tessera_store_sqlite::SqliteStore::open_dir(&dir.0).await.unwrap());
    let running = tessera_server::start(cfg, store, backend).await.unwrap();
    Plane {
        base: format!("http://{}", running.addr),
        token: running
            .admin_token
            .clone()
            .expect("a first start makes the admin token"),
        running,
        http: reqwest::Client::new(),
        _dir: dir,
    }
}

impl Plane {
    /// Moves the clock one [`STEP`] and waits until the control plane has done what that
    /// started.
    async fn step(&self) {
        tokio::time::advance(STEP).await;
        self.running.lifecycle.settled().await.expect("the loop runs");
    }

    async fn call(&self, m: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut rb = self
            .http
            .request(m, format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let r = rb.send().await.unwrap();
        let st = r.status().as_u16();
        (st, r.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> Value {
        let (st, v) = self.call(Method::GET, path, None).await;
        assert_eq!(st, 200, "{path}: {v}");
        v
    }

    async fn post(&self, path: &str, body: Option<Value>) -> Value {
        let (st, v) = self.call(Method::POST, path, body).await;
        assert!((200..300).contains(&st), "{path}: {st} {v}");
        v
    }

    /// Every page of a listing.
    async fn all(&self, path: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let sep = if path.contains('?') { '&' } else { '?' };
            let p = match &cursor {
                Some(c) => format!("{path}{sep}limit=500&cursor={c}"),
                None => format!("{path}{sep}limit=500"),
            };
            let v = self.get(&p).await;
            out.extend(v["items"].as_array().unwrap().iter().cloned());
            match v["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_string()),
                None => return out,
            }
        }
    }

    /// The scenario generator's mix, seeded: the same load on every control plane; returns
    /// once what fits has started (at most 20 scenario hours later).
    async fn load(&self, fleet: &Fleet) -> usize {
        for t in 0..8 {
            self.post("/api/v1/tenants", Some(json!({"name": format!("team-{t:02}")})))
                .await;
            self.post(
                &format!("/api/v1/tenants/team-{t:02}/projects"),
                Some(json!({"name": "p"})),
            )
            .await;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut n = 0;
        for (kind, count) in [(0usize, 40), (1, 110), (2, 160)] {
            for i in 0..count {
                let (req, dur_ms, _) = tessera_sched::scenario::draw(fleet, kind, &mut rng);
                let hours = (dur_ms / HOUR_MS).max(1);
                let (shape, kind_s, duration) = match (&req.shape, kind) {
                    (Shape::Whole { gpus }, _) => (json!({"gpus": gpus, "pool": "training"}), "batch", Some(hours)),
                    (Shape::Mig(m), _) => (json!({"mig": m.name, "pool": "serving"}), "service", None),
                    (Shape::Fraction { milli, .. }, _) => (
                        json!({"fraction": milli, "pool": "development"}),
                        "interactive",
                        Some(hours),
                    ),
                    (s, _) => panic!("the mix has no {s:?}"),
                };
                let mut body = json!({"tenant": format!("team-{:02}", i % 8), "project": "p",
                    "name": format!("{kind_s}-{i}"), "kind": kind_s, "shape": shape});
                if let Some(d) = duration {
                    body["duration_s"] = json!(d);
                }
                self.post("/api/v1/workloads", Some(body)).await;
                n += 1;
            }
        }
        for _ in 0..200 {
            self.step().await;
            let waiting = self.all("/api/v1/workloads?state=pending").await.len()
                + self.all("/api/v1/workloads?state=placed").await.len();
            if waiting == 0 {
                break;
            }
        }
        n
    }
}

fn ms(rfc3339: &Value) -> Option<i64> {
    rfc3339
        .as_str()
        .map(|s| s.parse::<jiff::Timestamp>().unwrap().as_millisecond())
}

fn units(w: &Value) -> f64 {
    w["units"].as_str().unwrap().parse().unwrap()
}

/// GPU-unit-ms a node's work held it during `[from, to)`.
fn busy(ws: &[Value], node: &str, from: i64, to: i64) -> f64 {
    ws.iter()
        .filter(|w| w["allocation"]["node"] == node)
        .filter_map(|w| {
            let start = w["running_at_ms"].as_i64()?;
            let end = ms(&w["ended_at"]).unwrap_or(to);
            Some(units(w) * (end.min(to) - start.max(from)).max(0) as f64)
        })
        .sum()
}

struct Outcome {
    duration_s: f64,
    lost_unit_hours: f64,
    cut_offs: usize,
}

/// Workloads stopped before their lease end: anything preempted, lost or failed, except
/// services moved for a drain whose replacement runs.
fn cut_offs(ws: &[Value]) -> Vec<Value> {
    ws.iter()
        .filter(|w| match w["state"].as_str().unwrap() {
            "preempted" => {
                !(w["kind"] == "service"
                    && w["reason_code"] == "node-drain"
                    && ws
                        .iter()
                        .any(|r| r["name"] == w["name"] && r["tenant"] == w["tenant"] && r["state"] == "running"))
            }
            "failed" | "lost" => true,
            "cancelled" => true,
            _ => false,
        })
        .cloned()
        .collect()
}

/// One rollout per pool through the API, followed step by step until all are done; what it
/// cost, and the workloads cut off.
async fn drain_aware(s: &Plane, fleet: &Fleet) -> (Outcome, Vec<Value>) {
    let t0 = now_ms();
    let mut ids = Vec::new();
    for p in &fleet.pools {
        let r = s
            .post(
                "/api/v1/rollouts",
                Some(json!({"pool": p.name, "max_parallel": MAX_PARALLEL, "max_unavailable_units": MAX_PARALLEL * 8})),
            )
            .await;
        let in_pool = fleet.nodes.iter().filter(|n| fleet.pool(n.pool).name == p.name).count();
        assert_eq!(r["nodes"].as_array().unwrap().len(), in_pool);
        ids.push(r["id"].as_u64().unwrap());
    }
    let end = t0 + 120_000;
    let rollouts: Vec<Value> = loop {
        assert!(now_ms() < end, "the rollouts did not end in 120 scenario hours");
        s.step().await;
        let mut rs = Vec::new();
        for i in &ids {
            rs.push(s.get(&format!("/api/v1/rollouts/{i}")).await);
        }
        if rs.iter().all(|r| r["state"] != "running") {
            break rs;
        }
    };
    let t1 = rollouts
        .iter()
        .flat_map(|r| r["nodes"].as_array().unwrap())
        .filter_map(|n| ms(&n["ended_at"]))
        .max()
        .unwrap();
    for r in &rollouts {
        assert_eq!(r["state"], "done", "{r}");
    }
    let ws = s.all("/api/v1/workloads").await;
    let mut lost = 0.0;
    for n in rollouts.iter().flat_map(|r| r["nodes"].as_array().unwrap()) {
        let node = n["node"].as_str().unwrap();
        let (a, b) = (ms(&n["started_at"]).unwrap(), ms(&n["ended_at"]).unwrap());
        lost += 8.0 * (b - a) as f64 - busy(&ws, node, a, b);
    }
    // Every node went through maintenance (upgrading) and validation, and is back.
    let audit = s.all("/api/v1/audit").await;
    for step in [
        "rollout.draining",
        "rollout.upgrading",
        "rollout.validating",
        "rollout.done",
    ] {
        let mut nodes: Vec<&str> = audit
            .iter()
            .filter(|r| r["action"] == step)
            .map(|r| r["target"].as_str().unwrap().rsplit('/').next().unwrap())
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        assert_eq!(nodes.len(), 60, "{step}");
    }
    let states: Vec<Value> = s.all("/api/v1/nodes").await;
    assert_eq!(states.len(), 60);
    assert!(states.iter().all(|n| n["state"] == "ready"), "every node uncordoned");
    let cut = cut_offs(&ws);
    let outcome = Outcome {
        duration_s: (t1 - t0) as f64 / 1000.0,
        lost_unit_hours: lost / 1000.0,
        cut_offs: cut.len(),
    };
    (outcome, cut)
}

/// The GPU Operator's way, driven through the same API at each step: nodes in fleet order, at
/// most `MAX_PARALLEL` per pool out at once; cordon, wait until empty or the deadline, then
/// stop what is left (cancel), upgrade, uncordon.
async fn naive(s: &Plane, fleet: &Fleet) -> Outcome {
    #[derive(Clone, Copy)]
    enum St {
        Cordoned { since: i64 },
        Upgrading { until: i64 },
    }
    let t0 = now_ms();
    let mut queues: Vec<Vec<String>> = fleet
        .pools
        .iter()
        .map(|p| {
            fleet
                .nodes
                .iter()
                .filter(|n| fleet.pool(n.pool).name == p.name)
                .rev()
                .map(|n| n.name.clone())
                .collect()
        })
        .collect();
    let mut out: Vec<HashMap<String, St>> = vec![HashMap::new(); queues.len()];
    let mut intervals: Vec<(String, i64, i64)> = Vec::new();
    let mut thrown = 0.0;
    let mut cut = 0;
    let end = t0 + 180_000;
    while queues.iter().any(|q| !q.is_empty()) || out.iter().any(|o| !o.is_empty()) {
        assert!(now_ms() < end, "the naive rollout did not end in 180 scenario hours");
        let now = now_ms();
        let nodes: HashMap<String, Value> = s
            .all("/api/v1/nodes")
            .await
            .into_iter()
            .map(|n| (n["name"].as_str().unwrap().to_string(), n))
            .collect();
        for (pool, o) in out.iter_mut().enumerate() {
            let names: Vec<String> = o.keys().cloned().collect();
            for name in names {
                match o[&name] {
                    St::Cordoned { since } => {
                        let empty = nodes[&name]["units_used"].as_str().unwrap().parse::<f64>().unwrap() == 0.0;
                        if empty {
                            s.post(&format!("/api/v1/nodes/{name}/maintenance"), None).await;
                            o.insert(
                                name,
                                St::Upgrading {
                                    until: now + UPGRADE_MS,
                                },
                            );
                        } else if now >= since + NAIVE_DEADLINE_MS {
                            let mut holders = s.all("/api/v1/workloads?state=running").await;
                            holders.extend(s.all("/api/v1/workloads?state=placed").await);
                            for w in holders {
                                if w["allocation"]["node"] == name.as_str() {
                                    let (st, _) = s
                                        .call(Method::POST, &format!("/api/v1/workloads/{}/cancel", w["id"]), None)
                                        .await;
                                    if st == 200 {
                                        cut += 1;
                                        let start = w["running_at_ms"].as_i64().unwrap_or(now);
                                        thrown += units(&w) * (now - start).max(0) as f64;
                                    }
                                }
                            }
                            // Wait for the stops, then maintenance.
                            o.insert(name, St::Cordoned { since: i64::MAX / 2 });
                        }
                    }
                    St::Upgrading { until } if now >= until => {
                        s.post(&format!("/api/v1/nodes/{name}/uncordon"), None).await;
                        let start = intervals.iter().position(|i| i.0 == name && i.2 == 0).unwrap();
                        intervals[start].2 = now;
                        o.remove(&name);
                    }
                    St::Upgrading { .. } => {}
                }
            }
            while o.len() < MAX_PARALLEL
                && let Some(name) = queues[pool].pop()
            {
                s.post(&format!("/api/v1/nodes/{name}/cordon"), None).await;
                intervals.push((name.clone(), now, 0));
                o.insert(name, St::Cordoned { since: now });
            }
        }
        s.step().await;
    }
    let ws = s.all("/api/v1/workloads").await;
    let t1 = intervals.iter().map(|i| i.2).max().unwrap();
    let mut lost = thrown;
    for (node, a, b) in &intervals {
        lost += 8.0 * (b - a) as f64 - busy(&ws, node, *a, *b);
    }
    Outcome {
        duration_s: (t1 - t0) as f64 / 1000.0,
        lost_unit_hours: lost / 1000.0,
        cut_offs: cut,
    }
}

#[test]
fn a_full_fleet_rollout_through_the_control_plane_cuts_nothing_off() {
    let fleet = Fleet::seed();
    let t = Instant::now();
    // One after the other, each on its own control plane and stepped clock: what they measure
    // does not depend on how busy the machine is, only how long the test takes does.
    let (submitted, smart, cut) = on_stepped_clock(async {
        let s = plane("smart").await;
        let submitted = s.load(&fleet).await;
        let (smart, cut) = drain_aware(&s, &fleet).await;
        (submitted, smart, cut)
    });
    let naive = on_stepped_clock(async {
        let s = plane("naive").await;
        s.load(&fleet).await;
        naive(&s, &fleet).await
    });
    assert!(cut.is_empty(), "{} workloads cut off: {cut:?}", cut.len());
    assert_eq!(smart.cut_offs, 0);
    println!(
        "full-fleet rollout of the seed fleet (60 nodes, {submitted} workloads; 1 s = 1 scenario hour on a stepped \
         clock, upgrade 1 h, max {MAX_PARALLEL} nodes per pool at once):"
    );
    for (name, o) in [("drain-aware", &smart), ("naive (deadline 3 h, then stop)", &naive)] {
        println!(
            "  {name:32} rollout time {:6.1} h   capacity lost {:8.1} GPU-unit-hours   cut-offs {}",
            o.duration_s, o.lost_unit_hours, o.cut_offs
        );
    }
    println!("  (wall time {:.0} s)", t.elapsed().as_secs_f64());
    assert!(naive.cut_offs > 0, "the naive rollout stops work at its deadline");
    assert!(
        smart.lost_unit_hours < naive.lost_unit_hours,
        "drain-aware loses {:.1} GPU-unit-hours, naive {:.1}",
        smart.lost_unit_hours,
        naive.lost_unit_hours
    );
}

/// `tessera serve` on the wall clock, for the CLI verbs; killed, and its data removed, on drop.
struct Serve {
    server: Serving,
    token: String,
    dir: TempDir,
}

fn serve(tag: &str) -> Serve {
    let dir = TempDir::new(&format!("rollout-{tag}"));
    let mut cmd = sim_serve_command(200);
    cmd.args(["--grace-s", "1", "--sim-upgrade-duration", "1s", "--data-dir"])
        .arg(&dir.0);
    let server = try_wait_until_serving(&mut cmd, Duration::from_secs(30)).expect("tessera serve did not start");
    Serve {
        token: server.admin_token.clone().unwrap_or_default(),
        server,
        dir,
    }
}

fn cli(s: &Serve, args: &[&str]) -> (i32, String, String) {
    let config = s.dir.0.join("cli-config");
    let env = [
        ("TESSERA_SERVER", s.server.base.as_str()),
        ("TESSERA_TOKEN", s.token.as_str()),
        ("XDG_CONFIG_HOME", config.to_str().unwrap()),
    ];
    tessera(args, &env)
}

/// The CLI verbs on an idle fleet: the plan, `--wait` until done, status, and one readable
/// line for each error. About 10 s.
#[test]
fn the_upgrade_verbs_print_the_plan_follow_it_and_say_what_is_wrong_in_one_line() {
    let s = serve("cli");
    for (args, says) in [
        (vec!["upgrade", "rollout", "--pool", "nope"], "no pool `nope`"),
        (
            vec!["upgrade", "rollout", "--pool", "training", "--deadline", "soon"],
            "--deadline",
        ),
        (
            vec!["upgrade", "rollout", "--pool", "training", "--after", "preempt"],
            "needs a `deadline_s`",
        ),
        (vec!["node", "done", "h100-00"], "not being upgraded by a rollout"),
        (vec!["upgrade", "status", "9"], "no rollout 9"),
    ] {
        let (code, _, err) = cli(&s, &args);
        assert_ne!(code, 0, "{args:?}");
        assert!(err.contains(says) && err.trim().lines().count() == 1, "{args:?}: {err}");
    }
    let (code, out, err) = cli(
        &s,
        &[
            "upgrade",
            "rollout",
            "--pool",
            "training",
            "--max-parallel",
            "8",
            "--wait",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("rollout 1 of pool training: running"), "{out}");
    assert_eq!(out.matches("h100-").count(), 16, "the plan lists every node: {out}");
    let (code, out, _) = cli(&s, &["upgrade", "status"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("training") && out.contains("done") && out.contains("16/16"),
        "{out}"
    );
    let (code, _, err) = cli(&s, &["upgrade", "cancel", "1"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("rollout 1 is done already") && err.trim().lines().count() == 1,
        "{err}"
    );
}
