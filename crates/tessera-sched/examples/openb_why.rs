//! Where the unallocated GPU at arrived 100 % comes from in one openb replay: the failed pods by
//! shape, and the free milli left on GPUs by amount (for policy work).
//!
//! `cargo run -p tessera-sched --release --example openb_why -- [FILE] [SEED] [POLICY]`
//! `PAIR_WEIGHT=x` and `PRICE_WEIGHT=x` set the `tessera` policy's pairing and priced-fill weights,
//! `FILL_HOST_AWARE=0` turns off the pairing term's host fit, `PRICES=fixed` gives its priced fill
//! the default file's fixed price table (it prints the prices it uses, in twelfths of a GPU);
//! `UPTO=130` stops at 130 % arrived; `TIMELINE=1` prints the free GPU every 250 pods. With `COMPOSITION=1`, also the GPUs holding fractions at arrived 100 % by the multiset of
//! fractions on them, with the free milli each combination leaves (where the pairing wastes).

use std::collections::BTreeMap;
use std::sync::Arc;

use tessera_model::Fleet;
use tessera_sched::Engine;
use tessera_sched::bound::price_twelfths;
use tessera_sched::engine::demand_of;
use tessera_sched::policy::{Demand, WorkloadModel};
use tessera_sched::replay::{make_policy, parse_pods, workload};
use tessera_sched::tessera::TesseraPolicy;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let file = args.get(1).map(String::as_str).unwrap_or("default");
    let seed: u64 = args.get(2).map_or(42, |s| s.parse().unwrap());
    let policy = args.get(3).map(String::as_str).unwrap_or("tessera");
    let dir = std::env::var("TESSERA_OPENB_DIR").unwrap_or_else(|_| "../shared/traces/openb".into());
    let fleet = Arc::new(
        Fleet::from_openb_nodes(
            &std::fs::read_to_string(format!("{dir}/openb_node_list_gpu_node.csv")).unwrap(),
            "nodes",
        )
        .unwrap(),
    );
    let text = std::fs::read_to_string(format!("{dir}/openb_pod_list_{file}.csv")).unwrap();
    let pods = parse_pods(&text, file, &fleet.catalogue).unwrap();
    let prior: Vec<Demand> = pods.iter().filter_map(|p| demand_of(&p.request())).collect();
    let pair = std::env::var("PAIR_WEIGHT").ok();
    let price = std::env::var("PRICE_WEIGHT").ok();
    let policy_box: Box<dyn tessera_sched::policy::SharedPolicy> = if policy == "tessera" {
        let mut p = TesseraPolicy::new(WorkloadModel::with_prior(&prior));
        if let Some(w) = pair {
            p.set_pairing_weight(w.parse().unwrap());
        }
        if let Some(w) = price {
            p.set_price_weight(w.parse().unwrap());
        }
        if let Ok(v) = std::env::var("FILL_HOST_AWARE") {
            p.set_fill_host_aware(v == "1");
        }
        if std::env::var("PRICES").is_ok_and(|v| v == "fixed") {
            p.set_fixed_prices(true);
        }
        let twelfths: Vec<String> = p
            .prices()
            .steps()
            .iter()
            .map(|&(m, u)| {
                format!(
                    "{m}+: {:.3}",
                    u as f64 * 12.0 / tessera_sched::bound::PRICE_UNITS as f64
                )
            })
            .collect();
        println!(
            "priced fill's prices (twelfths of a GPU, by share size): {}",
            twelfths.join(", ")
        );
        Box::new(p)
    } else {
        make_policy(policy, &prior).unwrap()
    };
    let mut engine = Engine::new(fleet.clone(), policy_box, seed);
    let cap = fleet.gpu_count() * 1000;
    let order = workload(&pods, cap, seed);
    // `UPTO=130`: stop at 130 % arrived instead of 100 %.
    let upto: u64 = std::env::var("UPTO").ok().map_or(100, |v| v.parse().unwrap());
    let mut arrived = 0u64;
    let mut gapfill: BTreeMap<(u16, u16), u32> = BTreeMap::new();
    let mut failed: BTreeMap<(u8, u16, bool), (u64, u64)> = BTreeMap::new();
    for (k, &i) in order.iter().enumerate() {
        let p = &pods[i];
        arrived += p.gpu_demand();
        if arrived * 100 > cap * upto {
            break;
        }
        if std::env::var("TIMELINE").is_ok() && k % 250 == 0 {
            let free: u64 = engine
                .state()
                .nodes
                .iter()
                .flat_map(|n| &n.gpus)
                .map(|g| g.free_milli() as u64)
                .sum();
            let whole = engine
                .state()
                .nodes
                .iter()
                .flat_map(|n| &n.gpus)
                .filter(|g| g.free_milli() == 1000)
                .count();
            // The free milli beyond the bound's prices on the GPUs holding shares (the slack
            // of `docs/openb-replay.md`: 1000 × (12 − Σ price) / 12 per GPU).
            let mut slack = 0u64;
            for st in &engine.state().nodes {
                for g in &st.gpus {
                    let prices: Vec<u64> = g
                        .holders
                        .iter()
                        .filter_map(|id| match engine.allocation(*id)?.grant {
                            tessera_sched::Grant::Fraction { milli, .. } => Some(price_twelfths(milli)),
                            _ => None,
                        })
                        .collect();
                    let twelfths: u64 = prices.iter().sum();
                    if !prices.is_empty() && twelfths < 12 {
                        slack += (12 - twelfths) * 1000 / 12;
                    }
                }
            }
            eprintln!(
                "pod {k}: arrived {:.2} % free {free} whole free GPUs {whole} slack {slack}",
                arrived as f64 * 100.0 / cap as f64
            );
        }
        let before = engine.state().clone();
        let ok = engine.try_place(k as u64, &p.request());
        if ok && p.num_gpu == 1 && p.gpu_milli < 1000 {
            let a = engine.allocation(k as u64).unwrap();
            if let tessera_sched::Grant::Fraction { gpu, .. } = a.grant {
                let f = before.nodes[a.node.0 as usize].gpus[gpu as usize].free_milli();
                *gapfill.entry((p.gpu_milli, f)).or_insert(0u32) += 1;
            }
        }
        if !ok {
            let e = failed
                .entry((p.num_gpu, p.gpu_milli, !p.models.is_empty()))
                .or_default();
            e.0 += 1;
            e.1 += p.gpu_demand();
        }
    }
    for ((m, f), c) in &gapfill {
        if *m <= 240 || std::env::var("ALL").is_ok() {
            println!("  {m} into gap {f}: {c}");
        }
    }
    println!("failed before arrived 100 %: (gpus, milli, constrained) -> (pods, milli)");
    let mut tot = 0;
    for (k, v) in &failed {
        tot += v.1;
        println!("  {k:?} -> {v:?}");
    }
    println!(
        "  total {tot} milli = {:.2} % of capacity",
        tot as f64 * 100.0 / cap as f64
    );
    let mut free: BTreeMap<u16, u64> = BTreeMap::new();
    let mut by_model: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (n, st) in engine.state().nodes.iter().enumerate() {
        let m = fleet.catalogue.get(fleet.nodes[n].model).name.to_string();
        for g in &st.gpus {
            let f = g.free_milli();
            *free.entry(f).or_default() += 1;
            let e = by_model.entry(m.clone()).or_default();
            e.0 += f as u64;
            e.1 += 1000;
        }
    }
    if std::env::var("STRANDED").is_ok() {
        // GPUs with 200 milli or more free at the end, with their node's free CPU and memory.
        for (n, st) in engine.state().nodes.iter().enumerate() {
            for g in &st.gpus {
                if g.free_milli() >= 200 {
                    println!(
                        "  node {n} ({}): GPU free {}, CPU free {}, memory free {} MiB",
                        fleet.catalogue.get(fleet.nodes[n].model).name,
                        g.free_milli(),
                        st.cpu_free,
                        st.mem_free
                    );
                }
            }
        }
    }
    println!("GPUs by free milli at the end of arrived 100 %:");
    for (f, c) in free {
        if f > 0 {
            println!("  {f:4} x {c}");
        }
    }
    for (m, (f, c)) in by_model {
        println!("  {m}: free {f} of {c}");
    }
    if std::env::var("COMPOSITION").is_ok() {
        // (fractions on the GPU, largest first) -> GPUs
        let mut combos: BTreeMap<Vec<u16>, u64> = BTreeMap::new();
        for st in &engine.state().nodes {
            for g in &st.gpus {
                let mut shares: Vec<u16> = g
                    .holders
                    .iter()
                    .filter_map(|id| match engine.allocation(*id)?.grant {
                        tessera_sched::Grant::Fraction { milli, .. } => Some(milli),
                        _ => None,
                    })
                    .collect();
                if shares.is_empty() {
                    continue;
                }
                shares.sort_unstable_by(|a, b| b.cmp(a));
                *combos.entry(shares).or_default() += 1;
            }
        }
        let mut rows: Vec<_> = combos.into_iter().collect();
        rows.sort_by_key(|(s, c)| std::cmp::Reverse(c * (1000 - s.iter().sum::<u16>()) as u64));
        println!("GPUs with fractions by combination (free milli, GPUs, total free):");
        for (s, c) in rows {
            let free = 1000 - s.iter().sum::<u16>();
            if free > 0 {
                println!("  {s:?}: {free} x {c} = {}", free as u64 * c);
            }
        }
    }
}
