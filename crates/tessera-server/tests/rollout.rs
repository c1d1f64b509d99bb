//! Rolling upgrades through the running control plane (HTTP, the lifecycle loop, SQLite, the
//! simulated backend) on a small fleet (`synthetic:8`: 2 training nodes), and the node-ops gaps
//! a restart used to open: a drain keeps its deadline and policy, a service move is not
//! started twice, and a node the backend removes loses its GPUs until it comes back.
//!
//! Restarts are real crashes: each control plane runs on its own Tokio runtime, dropped
//! mid-flight, and a new one starts on the same data directory. About 25 s of wall time in all.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::support::TempDir;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tessera_backend::Backend;
use tessera_backend_sim::{SimBackend, SimConfig};
use tessera_model::Fleet;
use tessera_server::ServerConfig;
use tokio::runtime::Runtime;

/// A control plane on its own runtime: dropping it is a crash.
struct Plane {
    rt: Runtime,
    base: String,
    token: String,
    sim: Arc<SimBackend>,
    http: reqwest::Client,
}

fn boot(dir: &Path, upgrade: Option<Duration>, token: Option<String>) -> Plane {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let cfg = ServerConfig {
        fleet: Fleet::synthetic(8),
        sim_upgrade: upgrade,
        ..ServerConfig::local(dir.to_path_buf())
    };
    let parts = crate::support::Parts {
        database: None,
        sim: SimConfig {
            telemetry_interval: Duration::from_millis(200),
            ..SimConfig::default()
        },
    };
    let (r, sim) = rt.block_on(crate::support::serve(cfg, &parts));
    Plane {
        base: format!("http://{}", r.addr),
        token: token.or(r.admin_token).expect("an admin token"),
        sim,
        http: reqwest::Client::new(),
        rt,
    }
}

impl Plane {
    fn call(&self, m: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        self.call_as(&self.token, m, path, body)
    }

    fn call_as(&self, token: &str, m: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        self.rt.block_on(async {
            let mut rb = self.http.request(m, format!("{}{path}", self.base)).bearer_auth(token);
            if let Some(b) = body {
                rb = rb.json(&b);
            }
            let r = rb.send().await.unwrap();
            let st = r.status();
            let text = r.text().await.unwrap();
            (st, serde_json::from_str(&text).unwrap_or(Value::String(text)))
        })
    }

    fn get(&self, path: &str) -> Value {
        let (st, v) = self.call(Method::GET, path, None);
        assert_eq!(st, StatusCode::OK, "{path}: {v}");
        v
    }

    fn tenant(&self) {
        self.call(Method::POST, "/api/v1/tenants", Some(json!({"name": "vision"})));
        self.call(
            Method::POST,
            "/api/v1/tenants/vision/projects",
            Some(json!({"name": "train"})),
        );
    }

    /// Submits a workload on the training pool and waits until it runs (or, `wait == false`,
    /// returns at once).
    fn submit(&self, name: &str, kind: &str, gpus: u32, duration_s: Option<u64>, wait: bool) -> Value {
        let mut body = json!({"tenant": "vision", "project": "train", "name": name, "kind": kind,
            "shape": {"gpus": gpus, "pool": "training"}});
        if let Some(d) = duration_s {
            body["duration_s"] = json!(d);
        }
        let (st, w) = self.call(Method::POST, "/api/v1/workloads", Some(body));
        assert_eq!(st, StatusCode::CREATED, "{w}");
        let id = w["id"].as_u64().unwrap();
        if !wait {
            return w;
        }
        self.until(&format!("workload {id} running"), 10, || {
            let w = self.get(&format!("/api/v1/workloads/{id}"));
            (w["state"] == "running").then_some(w)
        })
    }

    fn until<T>(&self, what: &str, secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
        let end = std::time::Instant::now() + Duration::from_secs(secs);
        while std::time::Instant::now() < end {
            if let Some(v) = f() {
                return v;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("timed out waiting for {what}");
    }

    fn workloads(&self) -> Vec<Value> {
        self.get("/api/v1/workloads?limit=200")["items"]
            .as_array()
            .unwrap()
            .clone()
    }

    /// Starts a rolling upgrade of `pool`, one node at a time: the rollout.
    fn start_rollout(&self, pool: &str) -> Value {
        let (st, r) = self.call(
            Method::POST,
            "/api/v1/rollouts",
            Some(json!({"pool": pool, "max_parallel": 1})),
        );
        assert_eq!(st, StatusCode::CREATED, "{r}");
        r
    }

    /// Waits until the first node of rollout `id` is upgrading.
    fn until_first_node_upgrading(&self, id: u64) {
        self.until("the first node upgrading", 10, || {
            let r = self.get(&format!("/api/v1/rollouts/{id}"));
            (r["nodes"][0]["state"] == "upgrading").then_some(())
        });
    }

    fn node_state(&self, node: &str) -> String {
        self.get(&format!("/api/v1/nodes?node={node}"))["items"][0]["state"]
            .as_str()
            .unwrap()
            .to_string()
    }
}

fn node_of(w: &Value) -> String {
    w["allocation"]["node"].as_str().unwrap().to_string()
}

/// No workload ended by preemption or loss before its lease; services that were stopped were
/// stopped for a drain, with a replacement of theirs.
fn assert_nothing_cut_off(ws: &[Value]) {
    for w in ws {
        let st = w["state"].as_str().unwrap();
        match st {
            "preempted" => {
                assert_eq!(w["kind"], "service", "only services are moved: {w}");
                assert_eq!(w["reason_code"], "node-drain", "{w}");
                assert!(
                    ws.iter()
                        .any(|r| r["name"] == w["name"] && r["id"] != w["id"] && r["state"] == "running"),
                    "a replacement of {} runs",
                    w["id"]
                );
            }
            "failed" | "lost" => panic!("cut off: {w}"),
            _ => {}
        }
    }
}

#[test]
fn a_rollout_upgrades_every_node_without_cut_offs_and_resumes_after_a_crash() {
    let d = TempDir::new("rollout-resume");
    let a = boot(&d.0, Some(Duration::from_secs(1)), None);
    a.tenant();
    let svc = a.submit("svc", "service", 1, None, true);
    let job = a.submit("job", "batch", 1, Some(3), true);
    let busy = node_of(&svc);
    assert_eq!(node_of(&job), busy, "best fit packs both on one node");

    // Bad input: problem JSON naming the field; a second rollout of the pool conflicts.
    let (st, p) = a.call(Method::POST, "/api/v1/rollouts", Some(json!({"pool": "nope"})));
    assert_eq!(st, StatusCode::NOT_FOUND, "{p}");
    for (body, field) in [
        (json!({"pool": "training", "after": "preempt"}), "after"),
        (json!({"pool": "training", "max_parallel": 0}), "max_parallel"),
    ] {
        let (st, p) = a.call(Method::POST, "/api/v1/rollouts", Some(body.clone()));
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {p}");
        assert_eq!(p["field"], field, "{p}");
    }
    let (st, r) = a.call(
        Method::POST,
        "/api/v1/rollouts",
        Some(json!({"pool": "training", "max_parallel": 1, "deadline_s": 600, "after": "wait"})),
    );
    assert_eq!(st, StatusCode::CREATED, "{r}");
    let id = r["id"].as_u64().unwrap();
    let (plan, details): (Vec<&str>, Vec<&str>) = r["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["node"].as_str().unwrap(), n["detail"].as_str().unwrap()))
        .unzip();
    assert_eq!(plan.len(), 2);
    assert_ne!(plan[0], busy, "the empty node first: its work ends soonest");
    // The empty node is out at once; the busy one says what it waits for.
    assert!(
        details[1].starts_with("its timed work ends ") && details[1].ends_with("; 1 service(s) move when it drains"),
        "{details:?}"
    );
    assert_eq!(r["upgrade_s"], 1);
    let (st, p) = a.call(Method::POST, "/api/v1/rollouts", Some(json!({"pool": "training"})));
    assert_eq!(st, StatusCode::CONFLICT, "{p}");
    let (st, _) = a.call(Method::GET, "/api/v1/rollouts/999", None);
    assert_eq!(st, StatusCode::NOT_FOUND);

    // Crash once the first node is upgrading (the busy one waits: one node at a time).
    a.until_first_node_upgrading(id);
    // The simulated upgrade reboots the node: its GPUs are reported lost while it is away.
    a.until("the upgrading node reported gone", 5, || {
        let h = a.get("/api/v1/gpus/health");
        h.as_array().unwrap().iter().any(|g| g["node"] == plan[0]).then_some(())
    });
    assert_eq!(
        a.node_state(&busy),
        "ready",
        "max_parallel = 1: the busy node is not taken yet"
    );
    let token = a.token.clone();
    drop(a);

    let b = boot(&d.0, Some(Duration::from_secs(1)), Some(token));
    let done = b.until("the rollout done", 30, || {
        let r = b.get(&format!("/api/v1/rollouts/{id}"));
        (r["state"] != "running").then_some(r)
    });
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(done["progress"], 1.0);
    for n in done["nodes"].as_array().unwrap() {
        assert_eq!(n["state"], "done", "{n}");
        assert!(n["detail"].as_str().unwrap().starts_with("validated"), "{n}");
        assert_eq!(b.node_state(n["node"].as_str().unwrap()), "ready");
    }
    let ws = b.workloads();
    assert_nothing_cut_off(&ws);
    let job_now = ws.iter().find(|w| w["id"] == job["id"]).unwrap();
    assert_eq!(job_now["state"], "succeeded", "the batch job ran to its end: {job_now}");
    let events = b.get(&format!("/api/v1/workloads/{}/events", svc["id"])).to_string();
    assert!(
        events.contains(&format!("being drained for rolling upgrade {id}")),
        "the moved service's notice names the rollout: {events}"
    );

    // Every node went pending → draining → upgrading → validating → done, audited.
    let audit = b.get("/api/v1/audit?limit=200");
    let steps: Vec<(String, String)> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["actor"] == "rollout-controller")
        .map(|r| {
            (
                r["target"].as_str().unwrap().to_string(),
                r["action"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for n in &plan {
        for step in [
            "rollout.draining",
            "rollout.upgrading",
            "rollout.validating",
            "rollout.done",
        ] {
            let target = format!("rollouts/{id}/nodes/{n}");
            assert!(
                steps.iter().any(|(t, a)| t == &target && a == step),
                "{n}: {step} not audited: {steps:?}"
            );
        }
    }
    let m = b.rt.block_on(crate::support::text(
        b.http.get(format!("{}/metrics", b.base)).bearer_auth(&b.token),
    ));
    let line = |name: &str, label: &str| {
        m.lines()
            .find(|l| l.starts_with(name) && l.contains(label))
            .unwrap_or_else(|| panic!("{name} {label} missing"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse::<f64>()
            .unwrap()
    };
    assert_eq!(line("tessera_rollout_progress_ratio{", "state=\"done\""), 1.0);
    assert_eq!(line("tessera_rollout_nodes{", "state=\"done\""), 2.0);
    let list = b.get("/api/v1/rollouts");
    assert_eq!(list["items"][0]["id"], id);
    assert_eq!(list["next_cursor"], Value::Null);
}

#[test]
fn without_a_simulated_upgrade_a_node_waits_for_the_done_hook_and_a_failed_gpu_fails_it() {
    let d = TempDir::new("rollout-hook");
    let a = boot(&d.0, None, None);
    let r = a.start_rollout("training");
    let id = r["id"].as_u64().unwrap();
    let first = r["nodes"][0]["node"].as_str().unwrap().to_string();
    let second = r["nodes"][1]["node"].as_str().unwrap().to_string();
    let (st, p) = a.call(Method::POST, &format!("/api/v1/nodes/{second}/done"), None);
    assert_eq!(st, StatusCode::CONFLICT, "not upgrading: {p}");
    a.until_first_node_upgrading(id);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        a.get(&format!("/api/v1/rollouts/{id}"))["nodes"][0]["state"],
        "upgrading",
        "it waits for the hook"
    );
    let (st, v) = a.call(Method::POST, &format!("/api/v1/nodes/{first}/done"), None);
    assert_eq!(st, StatusCode::OK, "{v}");
    a.until("the first node done, the second upgrading", 10, || {
        let r = a.get(&format!("/api/v1/rollouts/{id}"));
        (r["nodes"][0]["state"] == "done" && r["nodes"][1]["state"] == "upgrading").then_some(())
    });
    assert_eq!(a.node_state(&first), "ready");

    // A critical XID on the second node while it is upgrading: validation fails, the node
    // stays cordoned with the reason, the rollout stops.
    a.sim.inject_xid(&second, 3, 79).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let (st, _) = a.call(Method::POST, &format!("/api/v1/nodes/{second}/done"), None);
    assert_eq!(st, StatusCode::OK);
    let r = a.until("the rollout failed", 10, || {
        let r = a.get(&format!("/api/v1/rollouts/{id}"));
        (r["state"] == "failed").then_some(r)
    });
    let n = &r["nodes"][1];
    assert_eq!(n["state"], "failed", "{r}");
    assert!(n["detail"].as_str().unwrap().contains("GPU 3 is unhealthy"), "{n}");
    assert_eq!(a.node_state(&second), "cordoned");
    let (st, p) = a.call(Method::POST, &format!("/api/v1/rollouts/{id}/cancel"), None);
    assert_eq!(st, StatusCode::CONFLICT, "an ended rollout: {p}");
}

#[test]
fn a_drain_resumed_after_a_crash_keeps_its_deadline_and_policy() {
    let d = TempDir::new("rollout-drain");
    let a = boot(&d.0, None, None);
    a.tenant();
    let job = a.submit("long", "batch", 1, Some(3600), true);
    let node = node_of(&job);
    let (st, v) = a.call(
        Method::POST,
        &format!("/api/v1/nodes/{node}/drain?deadline_s=3&after=preempt"),
        None,
    );
    assert_eq!(st, StatusCode::OK, "{v}");
    let token = a.token.clone();
    drop(a);
    let b = boot(&d.0, None, Some(token));
    let id = job["id"].as_u64().unwrap();
    let events = b.until("the job preempted at the deadline", 15, || {
        let e = b.get(&format!("/api/v1/workloads/{id}/events"));
        e.as_array()
            .unwrap()
            .iter()
            .any(|e| e["step"] == "preempted")
            .then_some(e)
    });
    assert!(events.to_string().contains("deadline has passed"), "{events}");
    b.until("the node in maintenance", 10, || {
        (b.node_state(&node) == "maintenance").then_some(())
    });
}

#[test]
fn a_crash_during_a_service_move_does_not_start_a_second_replacement() {
    let d = TempDir::new("rollout-move");
    let a = boot(&d.0, None, None);
    a.tenant();
    // The service on one node; the other node full, so the replacement waits in the queue.
    let svc = a.submit("svc", "service", 1, None, true);
    let node = node_of(&svc);
    let blocker = a.submit("blocker", "batch", 8, Some(3600), true);
    assert_ne!(node_of(&blocker), node);
    let (st, _) = a.call(Method::POST, &format!("/api/v1/nodes/{node}/drain"), None);
    assert_eq!(st, StatusCode::OK);
    a.until("a replacement submitted", 10, || {
        (a.workloads().iter().filter(|w| w["name"] == "svc").count() == 2).then_some(())
    });
    let token = a.token.clone();
    drop(a);
    let b = boot(&d.0, None, Some(token));
    std::thread::sleep(Duration::from_secs(3));
    let ws = b.workloads();
    let svcs: Vec<&Value> = ws.iter().filter(|w| w["name"] == "svc").collect();
    assert_eq!(svcs.len(), 2, "one replacement, not two: {svcs:?}");
    let old = svcs.iter().find(|w| w["id"] == svc["id"]).unwrap();
    assert_eq!(old["state"], "running", "the old one runs until its replacement does");
}

#[test]
fn a_removed_node_loses_its_gpus_and_its_return_clears_only_that_cause() {
    let d = TempDir::new("rollout-removed");
    let a = boot(&d.0, None, None);
    let node = "h100-00";
    a.sim.inject_xid(node, 5, 79).unwrap();
    a.until("the XID recorded", 10, || {
        (a.get("/api/v1/gpus/health").as_array().unwrap().len() == 1).then_some(())
    });
    a.sim.remove_node(node).unwrap();
    let h = a.until("all 8 GPUs out", 10, || {
        let h = a.get("/api/v1/gpus/health");
        (h.as_array().unwrap().len() == 8).then_some(h)
    });
    assert!(h.to_string().contains("removed"), "{h}");
    a.sim.restore_node(node).unwrap();
    let h = a.until("the lost GPUs back", 10, || {
        let h = a.get("/api/v1/gpus/health");
        (h.as_array().unwrap().len() == 1).then_some(h)
    });
    assert_eq!(h[0]["gpu"], 5, "the XID stays until an admin clears it: {h}");
}

/// `POST /api/v1/nodes/{node}/gpus/{gpu}/mig`: refused while the node is in placement or the GPU
/// holds work, accepted on an idle GPU of a cordoned node, after which the GPU serves whole GPUs
/// (a whole-GPU request to the mig pool lands on it), audited with the change, kept across a
/// crash; viewers and tenant members are refused.
#[test]
fn mig_mode_is_an_admin_action_on_a_drained_gpu_and_survives_a_crash() {
    let d = TempDir::new("rollout-mig");
    let a = boot(&d.0, None, None);
    a.tenant();
    let mig_as = |p: &Plane, token: &str, node: &str, gpu: u64, enabled: bool| {
        p.call_as(
            token,
            Method::POST,
            &format!("/api/v1/nodes/{node}/gpus/{gpu}/mig"),
            Some(json!({ "enabled": enabled })),
        )
    };
    let mig = |p: &Plane, node: &str, gpu: u64, enabled: bool| mig_as(p, &p.token, node, gpu, enabled);
    let whole_on_serving = json!({"tenant": "vision", "project": "train", "name": "w", "kind": "batch",
        "shape": {"gpus": 1, "pool": "serving"}});
    let (st, p) = a.call(Method::POST, "/api/v1/workloads", Some(whole_on_serving.clone()));
    assert_eq!(
        st,
        StatusCode::UNPROCESSABLE_ENTITY,
        "MIG everywhere: no whole GPU: {p}"
    );

    let (st, inst) = a.call(
        Method::POST,
        "/api/v1/workloads",
        Some(
            json!({"tenant": "vision", "project": "train", "name": "i", "kind": "service",
            "shape": {"mig": "1g.10gb", "pool": "serving"}}),
        ),
    );
    assert_eq!(st, StatusCode::CREATED, "{inst}");
    let inst = a.until("the instance running", 10, || {
        let w = a.get(&format!("/api/v1/workloads/{}", inst["id"]));
        (w["state"] == "running").then_some(w)
    });
    let node = node_of(&inst);
    let busy = inst["allocation"]["gpus"][0].as_u64().unwrap();
    let idle = (busy + 1) % 8;

    // Bad input, then the rule: the node out of placement and the GPU idle.
    let (st, p) = mig(&a, &node, 99, false);
    assert_eq!(st, StatusCode::NOT_FOUND, "{p}");
    let (st, p) = mig(&a, "h100-00", 0, false);
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
    assert!(p["type"].as_str().unwrap().ends_with("not-mig-capable"), "{p}");
    let (st, p) = a.call(
        Method::POST,
        &format!("/api/v1/nodes/{node}/gpus/{idle}/mig"),
        Some(json!({"enabled": "no"})),
    );
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
    let (st, p) = mig(&a, &node, idle, false);
    assert_eq!(st, StatusCode::CONFLICT, "{p}");
    assert!(p["type"].as_str().unwrap().ends_with("node-in-placement"), "{p}");
    let (st, _) = a.call(Method::POST, &format!("/api/v1/nodes/{node}/cordon"), None);
    assert_eq!(st, StatusCode::OK);
    let (st, p) = mig(&a, &node, busy, false);
    assert_eq!(st, StatusCode::CONFLICT, "{p}");
    assert!(p["type"].as_str().unwrap().ends_with("gpu-busy"), "{p}");
    let (st, v) = mig(&a, &node, idle, false);
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(
        (&v["enabled"], &v["pending"], &v["serves"], &v["changed"]),
        (&json!(false), &json!(false), &json!("whole"), &json!(true)),
        "{v}"
    );
    let (st, v) = mig(&a, &node, idle, false);
    assert_eq!(
        (st, &v["changed"]),
        (StatusCode::OK, &json!(false)),
        "the same mode twice: {v}"
    );

    // Audited with the change.
    let audit = a.get("/api/v1/audit?limit=50");
    let target = format!("/api/v1/nodes/{node}/gpus/{idle}/mig");
    assert!(
        audit["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["target"] == target.as_str() && r["outcome"] == 200 && r["actor"].is_string()),
        "{audit}"
    );

    // Back in placement, the GPU serves a whole GPU.
    a.call(Method::POST, &format!("/api/v1/nodes/{node}/uncordon"), None);
    let (st, w) = a.call(Method::POST, "/api/v1/workloads", Some(whole_on_serving.clone()));
    assert_eq!(st, StatusCode::CREATED, "{w}");
    let w = a.until("the whole GPU running", 10, || {
        let w = a.get(&format!("/api/v1/workloads/{}", w["id"]));
        (w["state"] == "running").then_some(w)
    });
    assert_eq!(node_of(&w), node);
    assert_eq!(w["allocation"]["gpus"], json!([idle]));

    // Viewers and tenant members cannot.
    let (_, t) = a.call(
        Method::POST,
        "/api/v1/tokens",
        Some(json!({"tenant": "vision", "role": "member"})),
    );
    let (st, p) = mig_as(&a, t["token"].as_str().unwrap(), &node, idle, true);
    assert_eq!(st, StatusCode::FORBIDDEN, "{p}");

    // A crash: the mode is restored before the allocations (the whole GPU is re-applied onto
    // the GPU out of MIG mode), and the simulated backend is told again.
    let token = a.token.clone();
    drop(a);
    let b = boot(&d.0, None, Some(token));
    let w = b.get(&format!("/api/v1/workloads/{}", w["id"]));
    assert_eq!(w["state"], "running", "{w}");
    let (st, v) = mig(&b, &node, idle, false);
    assert_eq!((st, &v["changed"]), (StatusCode::OK, &json!(false)), "{v}");
    let plan = tessera_backend::PartitionPlan::Instance {
        node: node.clone(),
        gpu: idle as u8,
        instance: tessera_backend::MigInstance::new("1g.10gb", 19, 0, 1),
    };
    let e = b.rt.block_on(b.sim.partition(&plan)).unwrap_err();
    assert!(e.to_string().contains("not in MIG mode"), "{e}");
}

/// Validation on an instance-granularity backend (the simulator in exact mode): an upgraded
/// node whose backend reports a MIG instance the engine does not hold (left behind, or made
/// behind Tessera's back) stays in validation until the instance is gone; then it passes with
/// its MIG modes as before the drain and the instances as the engine holds them. About 4 s.
#[test]
fn validation_compares_the_backends_mig_instances_with_the_engines_layout() {
    let d = TempDir::new("rollout-instances");
    let a = boot(&d.0, None, None);
    let r = a.start_rollout("serving");
    let id = r["id"].as_u64().unwrap();
    let first = r["nodes"][0]["node"].as_str().unwrap().to_string();
    a.until_first_node_upgrading(id);
    let stray = tessera_backend::PartitionPlan::Instance {
        node: first.clone(),
        gpu: 0,
        instance: tessera_backend::MigInstance::new("1g.10gb", 19, 0, 1),
    };
    assert!(a.rt.block_on(a.sim.partition(&stray)).unwrap().created);
    let (st, v) = a.call(Method::POST, &format!("/api/v1/nodes/{first}/done"), None);
    assert_eq!(st, StatusCode::OK, "{v}");
    std::thread::sleep(Duration::from_millis(2500));
    let r = a.get(&format!("/api/v1/rollouts/{id}"));
    assert_eq!(
        r["nodes"][0]["state"], "validating",
        "a MIG instance the engine does not hold: {r}"
    );
    a.rt.block_on(a.sim.unpartition(&stray)).unwrap();
    let n = a.until("the node validated", 10, || {
        let r = a.get(&format!("/api/v1/rollouts/{id}"));
        (r["nodes"][0]["state"] == "done").then(|| r["nodes"][0].clone())
    });
    let detail = n["detail"].as_str().unwrap();
    assert!(
        detail.contains("MIG modes as before the drain") && detail.contains("MIG instances as the engine holds them"),
        "{n}"
    );
}
