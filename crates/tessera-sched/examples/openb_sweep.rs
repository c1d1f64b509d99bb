//! Replays openb workload files over seeds, in parallel, with the `tessera` policy's tuning
//! knobs read from the environment: the fast loop for policy work (no server or CLI rebuild).
//!
//! `cargo run -p tessera-sched --release --example openb_sweep -- [FILES] [SEEDS] [POLICY]`
//! FILES: comma-separated pod-list names (`default,cpu050` or `published` for the 17 files
//! with published figures), SEEDS: `42-51`. Trace folder: `TESSERA_OPENB_DIR` or
//! `../shared/traces/openb`. `PAIR_WEIGHT=x` overrides the pairing weight of the `tessera`
//! policy (POLICY `tessera-w`), `PRICE_WEIGHT=x` its priced-fill weight, `FILL_HOST_AWARE=0`
//! turns off the pairing term's host fit, `PRICES=fixed` gives its priced fill the fixed price
//! table of the default file instead of the prices solved from the workload's share mix, `ORDER=simulator` builds the arrival order as the
//! paper's simulator does (`replay::Order::Simulator`). `JSON=1` prints one JSON object per file instead: the means
//! over the seeds of every figure of the replay (unallocated %, failed pods and shares, the
//! share limit and the floors).

use std::sync::{Arc, Mutex};

use tessera_model::Fleet;
use tessera_sched::policy::WorkloadModel;
use tessera_sched::replay::{Order, SeedResult, make_policy, parse_pods, replay_seed_in};
use tessera_sched::tessera::TesseraPolicy;

const PUBLISHED: &str = "default,cpu050,cpu100,cpu200,cpu250,gpushare40,gpushare60,gpushare80,gpushare100,\
gpuspec10,gpuspec20,gpuspec25,gpuspec33,multigpu20,multigpu30,multigpu40,multigpu50";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let files = args.get(1).map(String::as_str).unwrap_or("default");
    let files = if files == "published" { PUBLISHED } else { files };
    let seeds = args.get(2).map(String::as_str).unwrap_or("42-51");
    let (a, b) = seeds.split_once('-').unwrap_or((seeds, seeds));
    let seeds: Vec<u64> = (a.parse().unwrap()..=b.parse().unwrap()).collect();
    let policy = args.get(3).cloned().unwrap_or_else(|| "tessera".into());
    let dir = std::env::var("TESSERA_OPENB_DIR").unwrap_or_else(|_| "../shared/traces/openb".into());
    let pair: Option<f64> = std::env::var("PAIR_WEIGHT").ok().map(|v| v.parse().unwrap());
    let price: Option<f64> = std::env::var("PRICE_WEIGHT").ok().map(|v| v.parse().unwrap());
    let fill_host: Option<bool> = std::env::var("FILL_HOST_AWARE").ok().map(|v| v == "1");
    let fixed_prices = std::env::var("PRICES").is_ok_and(|v| v == "fixed");
    let order = match std::env::var("ORDER").as_deref() {
        Ok("simulator") => Order::Simulator,
        _ => Order::Protocol,
    };
    let threads: usize = std::env::var("THREADS").ok().map_or(2, |v| v.parse().unwrap());
    let fleet = Fleet::from_openb_nodes(
        &std::fs::read_to_string(format!("{dir}/openb_node_list_gpu_node.csv")).unwrap(),
        "nodes",
    )
    .unwrap();
    let fleet = Arc::new(fleet);
    let mut jobs = Vec::new();
    let mut all_pods = Vec::new();
    for f in files.split(',') {
        let text = std::fs::read_to_string(format!("{dir}/openb_pod_list_{f}.csv")).unwrap();
        all_pods.push(Arc::new(parse_pods(&text, f, &fleet.catalogue).unwrap()));
        for &s in &seeds {
            jobs.push((all_pods.len() - 1, s));
        }
    }
    let started = std::time::Instant::now();
    let jobs = Mutex::new(jobs.into_iter().enumerate().collect::<Vec<_>>());
    let results: Mutex<Vec<(usize, usize, SeedResult)>> = Mutex::new(Vec::new());
    std::thread::scope(|sc| {
        for _ in 0..threads {
            sc.spawn(|| {
                loop {
                    let Some((k, (fi, seed))) = jobs.lock().unwrap().pop() else {
                        break;
                    };
                    let r = replay_seed_in(&fleet, &all_pods[fi], seed, order, |prior| {
                        if policy == "tessera-w" {
                            let mut p = TesseraPolicy::new(WorkloadModel::with_prior(prior));
                            if let Some(w) = pair {
                                p.set_pairing_weight(w);
                            }
                            if let Some(w) = price {
                                p.set_price_weight(w);
                            }
                            if let Some(on) = fill_host {
                                p.set_fill_host_aware(on);
                            }
                            if fixed_prices {
                                p.set_fixed_prices(true);
                            }
                            Box::new(p)
                        } else {
                            make_policy(&policy, prior).unwrap()
                        }
                    })
                    .unwrap();
                    results.lock().unwrap().push((k, fi, r));
                }
            });
        }
    });
    let results = results.into_inner().unwrap();
    let (mut s100, mut s130) = (0.0, 0.0);
    let json = std::env::var("JSON").is_ok_and(|v| v == "1");
    let per_seed = std::env::var("PER_SEED").is_ok_and(|v| v == "1");
    for (fi, f) in files.split(',').enumerate() {
        let rs: Vec<_> = results.iter().filter(|r| r.1 == fi).collect();
        let n = rs.len() as f64;
        let mean = |g: &dyn Fn(&SeedResult) -> f64| rs.iter().map(|r| g(&r.2)).sum::<f64>() / n;
        let m100 = mean(&|s| s.unallocated_100);
        let m130 = mean(&|s| s.unallocated_130);
        if per_seed {
            let mut by_seed: Vec<(u64, f64)> = rs
                .iter()
                .map(|r| (seeds[r.0 % seeds.len()], r.2.unallocated_100))
                .collect();
            by_seed.sort_by_key(|x| x.0);
            let sd = (by_seed.iter().map(|x| (x.1 - m100).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt();
            eprintln!("{f} per seed at 100 %: {by_seed:?} (sd {sd:.2})");
        }
        if json {
            let v = serde_json::json!({
                "file": f,
                "policy": policy,
                "seeds": seeds,
                "unallocated_100": m100,
                "unallocated_130": m130,
                "failed_pods": mean(&|s| s.failed_pods as f64),
                "failed_shares": mean(&|s| s.failed_shares as f64),
                "failed_pods_100": mean(&|s| s.failed_pods_100 as f64),
                "failed_shares_100": mean(&|s| s.failed_shares_100 as f64),
                "share_limit_100": mean(&|s| s.share_limit_100),
                "any_floor_100": mean(&|s| s.any_floor_100),
                "non_refusing_floor_100": mean(&|s| s.non_refusing_floor_100),
                "non_refusing_floor_130": mean(&|s| s.non_refusing_floor_130),
                "packing_limit_100": mean(&|s| s.packing_limit_100),
            });
            println!("{v}");
            continue;
        }
        s100 += m100;
        s130 += m130;
        println!("{f:<12} {m100:6.2} {m130:6.2}");
    }
    if json {
        return;
    }
    let nf = files.split(',').count() as f64;
    println!(
        "{:<12} {:6.2} {:6.2}   ({policy}, pair {pair:?}, {:.1} s)",
        "mean",
        s100 / nf,
        s130 / nf,
        started.elapsed().as_secs_f64()
    );
}
