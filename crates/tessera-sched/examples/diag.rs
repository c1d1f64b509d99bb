use std::sync::Arc;
use tessera_model::Fleet;
use tessera_sched::engine::{Engine, demand_of};
use tessera_sched::policy::Demand;
use tessera_sched::replay::*;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let policy = args.get(1).cloned().unwrap_or("fgd".into());
    let podsf = args
        .get(2)
        .cloned()
        .unwrap_or("openb_pod_list_default.csv".into());
    let dir = "/work/shared/traces/openb/";
    let fleet = Fleet::from_openb_nodes(
        &std::fs::read_to_string(format!("{dir}openb_node_list_gpu_node.csv")).unwrap(),
        "n",
    )
    .unwrap();
    let pods = parse_pods(
        &std::fs::read_to_string(format!("{dir}{podsf}")).unwrap(),
        "p",
        &fleet.catalogue,
    )
    .unwrap();
    let fleet = Arc::new(fleet);
    let cap = fleet.gpu_count() * 1000;
    let prior: Vec<Demand> = pods
        .iter()
        .filter_map(|p| demand_of(&p.request()))
        .collect();
    let seed = 42;
    let mut e = Engine::new(fleet.clone(), make_policy(&policy, &prior).unwrap(), seed);
    let order = workload(&pods, cap, seed);
    let mut arrived = 0u64;
    let mut failed: std::collections::BTreeMap<(u8, u16), (u64, u64)> = Default::default();
    for (k, &i) in order.iter().enumerate() {
        let d = pods[i].gpu_demand();
        if arrived + d > cap {
            break;
        }
        arrived += d;
        if !e.try_place(k as u64, &pods[i].request()) {
            let f = failed
                .entry((pods[i].num_gpu, pods[i].gpu_milli))
                .or_default();
            f.0 += 1;
            f.1 += d;
        }
    }
    println!("failed by class (num_gpu, milli): count, milli");
    let mut tot = 0;
    for (k, v) in &failed {
        println!("  {:?}: {} pods, {} milli", k, v.0, v.1);
        tot += v.1;
    }
    println!(
        "total failed {} = {:.2}%",
        tot,
        tot as f64 * 100.0 / cap as f64
    );
    // free capacity analysis
    let (mut free_full, mut free_partial, mut stranded_cpu) = (0u64, 0u64, 0u64);
    let mut by_model: std::collections::BTreeMap<String, (u64, u64, u64)> = Default::default();
    for (n, st) in e.state().nodes.iter().enumerate() {
        let node = &fleet.nodes[n];
        let free: u64 = st.gpus.iter().map(|g| g.free_milli() as u64).sum();
        let full = st.gpus.iter().filter(|g| g.used_milli == 0).count() as u64 * 1000;
        let m = by_model
            .entry(fleet.catalogue.get(node.model).name.clone())
            .or_default();
        if st.cpu_free < 4000 {
            stranded_cpu += free;
            m.2 += free;
            continue;
        }
        free_full += full;
        free_partial += free - full;
        m.0 += full;
        m.1 += free - full;
    }
    println!(
        "free: full GPUs {} milli, partial {} milli, on CPU-starved nodes (<4 cores) {}",
        free_full, free_partial, stranded_cpu
    );
    let mut hist: std::collections::BTreeMap<u16, (u64, u64)> = Default::default();
    for st in e.state().nodes.iter() {
        for g in &st.gpus {
            if g.used_milli > 0 && g.used_milli < 1000 {
                let h = hist.entry(g.free_milli() / 50 * 50).or_default();
                h.0 += 1;
                h.1 += g.free_milli() as u64;
            }
        }
    }
    for (k, v) in &hist {
        println!("  free~{k}: {} gpus, {} milli", v.0, v.1);
    }
    for (k, v) in by_model {
        println!("  {k}: full {} partial {} starved {}", v.0, v.1, v.2);
    }
}
