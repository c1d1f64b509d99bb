//! `tessera plan` on the usage ledger of a running `tessera serve` (seed fleet, simulated
//! backend): workloads run and end, `tessera usage --by interval -o csv` exports the ledger,
//! and the planner replays it on candidate fleets; bad input is one readable line. And
//! `tessera plan --demand philly` on a hand-made job table whose waits are known per fleet.
//! Cost: one server start and a few seconds of workloads.

use std::time::{Duration, Instant};

use crate::support::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_replays_the_usage_ledger_of_a_running_server() {
    let s = Server::start("plan", false);
    s.tenant("vision", &["train"]).await;
    for (name, shape, priority) in [
        ("g1", json!({"gpus": 8, "pool": "training"}), "standard"),
        ("g2", json!({"gpus": 8, "pool": "training"}), "high"),
        ("m1", json!({"mig": "3g.40gb", "pool": "serving"}), "standard"),
    ] {
        let (st, b) = s
            .post(
                "/api/v1/workloads",
                json!({"tenant": "vision", "project": "train", "name": name, "shape": shape, "priority": priority, "duration_s": 1}),
            )
            .await;
        assert_eq!(st, 201, "{b}");
    }
    let dir = TempDir::new("plan-files");
    let conn = ["--server", s.base.as_str(), "--token", s.token.as_str()];
    // The ledger, once the three intervals have closed.
    let deadline = Instant::now() + Duration::from_secs(30);
    let csv = loop {
        let (code, out, err) = tessera(&[&conn[..], &["-o", "csv", "usage", "--by", "interval"]].concat(), &[]);
        assert_eq!(code, 0, "{err}");
        let closed = out.lines().skip(1).filter(|l| !l.ends_with(',')).count();
        if closed == 3 {
            break out;
        }
        assert!(Instant::now() < deadline, "the intervals did not close: {out}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some(
            "workload,seq,tenant,project,priority,gpu,cpu_milli,memory_mib,pool,model,units,submitted_at,started_at,ended_at"
        )
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    let gpus: Vec<(&str, &str, &str)> = rows.iter().map(|r| (r[4], r[5], r[8])).collect();
    assert!(gpus.contains(&("high", "whole:8", "training")), "{csv}");
    assert!(gpus.contains(&("standard", "mig:3g.40gb", "serving")), "{csv}");
    let file = dir.0.join("ledger.csv");
    std::fs::write(&file, &csv).unwrap();
    let demand = format!("usage:{}", file.display());
    let chart = dir.0.join("plan.svg");

    let (code, out, err) = tessera(
        &[
            "plan",
            "--demand",
            &demand,
            "--candidate",
            "training@whole:H100=1..2;serving@mig:A100=1",
            "--price",
            "H100=4,A100=2",
            "--target-p95",
            "60",
            "--chart",
            chart.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(
            "cheapest fleet meeting the target: training@whole:H100=1x8;serving@mig:A100=1x8 (16 GPUs, 48.00/h)"
        ),
        "{out}"
    );
    assert!(out.contains("P95 high") && out.contains("P95 standard"), "{out}");
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains(">chosen</text>"), "{svg}");

    // Bad input: one readable line and a failure code.
    for (args, expect) in [
        (
            vec!["--candidate", "training@whole:H100=1", "--price", "H100=4"],
            "error: the candidate has no pool `serving`, which the ledger's workloads use",
        ),
        (
            vec![
                "--candidate",
                "training@whole:H100=1;serving@mig:A100=1",
                "--price",
                "H100=4",
            ],
            "error: no price for GPU model `A100`: pass --price A100=PRICE_PER_GPU_HOUR",
        ),
        (
            vec!["--candidate", "training@whole:H100=two", "--price", "H100=4"],
            "error: candidate `training@whole:H100=two`: `training@whole:H100=two`: `H100=two`: `two` is not a node count",
        ),
    ] {
        let (code, out, err) = tessera(
            &[&["plan", "--demand", &demand, "--target-p95", "60"], &args[..]].concat(),
            &[],
        );
        assert_ne!(code, 0, "{out}");
        assert_eq!(err.trim(), expect);
    }
}

/// A job table in the Philly format: a warm-up job on day 0, then on day 15 (in the measured
/// window) two 64-GPU gangs, each one rack, and a 16-GPU gang, all at once and for 1,000 s.
/// One rack: the second 64-GPU gang waits 1,000 s and the 16-GPU one 2,000 s at most; two
/// racks: both 64-GPU gangs start, the 16-GPU one waits 1,000 s; three: nobody waits.
const PHILLY_TABLE: &str = "timestamp,duration,num_gpus,gpu_time,cluster
2017-10-01 00:00:00,10.0,1,10.0,vc-a
2017-10-16 00:00:00,1000.0,64,64000.0,vc-a
2017-10-16 00:00:00,1000.0,64,64000.0,vc-b
2017-10-16 00:00:00,1000.0,16,16000.0,vc-b
";

#[test]
fn plan_sizes_a_fleet_for_the_philly_demand_with_its_gangs() {
    let dir = TempDir::new("plan-philly");
    let table = dir.0.join("philly_jobs.csv");
    std::fs::write(&table, PHILLY_TABLE).unwrap();
    let chart = dir.0.join("philly.svg");
    let args = |racks: &'static str| {
        vec![
            "plan".to_string(),
            "--demand".into(),
            "philly".into(),
            "--trace".into(),
            table.display().to_string(),
            "--racks".into(),
            racks.into(),
            "--target-p95".into(),
            "60".into(),
            "--chart".into(),
            chart.display().to_string(),
        ]
    };
    let run = |v: Vec<String>| {
        let a: Vec<&str> = v.iter().map(String::as_str).collect();
        tessera(&a, &[])
    };

    let (code, out, err) = run([&args("1..3")[..], &["--json".to_string()]].concat());
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let rows = v["philly"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "{v}");
    let row = |racks: u64| rows.iter().find(|r| r["racks"] == racks).unwrap();
    for racks in 1..=3 {
        let r = row(racks);
        // The three gangs of the window are measured (the warm-up job is before it).
        assert_eq!(r["multi_node_jobs"], 3, "{r}");
        assert_eq!(r["gpus"], racks * 64, "{r}");
        assert_eq!(r["refused"], 0, "{r}");
    }
    // The waits the table is built for: one rack, the last gang waits two runs; two racks, one
    // run; three racks, none.
    assert!(row(1)["multi_node_p95_s"].as_f64().unwrap() >= 1000.0, "{}", row(1));
    assert!(row(2)["multi_node_p95_s"].as_f64().unwrap() >= 1000.0, "{}", row(2));
    assert!(row(3)["multi_node_p95_s"].as_f64().unwrap() < 60.0, "{}", row(3));
    assert_eq!(row(3)["chosen"], true, "{v}");
    assert_eq!(
        (row(1)["meets"].clone(), row(2)["meets"].clone()),
        (json!(false), json!(false))
    );

    // The table: one row per fleet and the answer in words.
    let (code, out, err) = run(args("2..3"));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("philly demand: 4 jobs, 2 tenants"), "{out}");
    assert!(
        out.contains("smallest fleet meeting the target: philly-192 (3 racks, 192 GPUs)"),
        "{out}"
    );

    // Bad input: one readable line.
    for (racks, extra, expect) in [
        ("0", vec![], "error: --racks: `0` is not a rack count or a range A..B"),
        (
            "1",
            vec!["--days", "3"],
            "error: --days must be more than 14 with --demand philly",
        ),
        (
            "1",
            vec!["--candidate", "training@whole:H100=1"],
            "error: --demand philly takes its candidate fleets from --racks, not --candidate",
        ),
    ] {
        let a = [args(racks), extra.iter().map(|s| s.to_string()).collect()].concat();
        let (code, out, err) = run(a);
        assert_ne!(code, 0, "{out}");
        assert!(err.trim().starts_with(expect), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    let (code, _, err) = run(vec![
        "plan".into(),
        "--demand".into(),
        "philly".into(),
        "--trace".into(),
        dir.0.join("nowhere").display().to_string(),
        "--target-p95".into(),
        "60".into(),
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("not found: the Philly trace"), "{err}");
}
