//! `tessera plan` on the usage ledger of a running `tessera serve` (seed fleet, simulated
//! backend): workloads run and end, `tessera usage --by interval -o csv` exports the ledger,
//! and the planner replays it on candidate fleets; bad input is one readable line.
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
