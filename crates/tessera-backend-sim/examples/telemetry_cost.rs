//! Measures what one telemetry sample costs at fleet scale: 80,000 GPUs (10,000 nodes of 8
//! A100-80GB) with 10,000 running workloads, a third each on whole GPUs, MIG instances and
//! time-slice shares. A `Telemetry` event carries exactly such a sample.
//!
//! `cargo run --release -p tessera-backend-sim --example telemetry_cost`

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tessera_backend::{Backend, Devices, MigInstance, PartitionPlan, RunSpec, SliceSpec};
use tessera_backend_sim::{SimBackend, SimConfig, SimGpu};

const NODES: usize = 10_000;
const WORKLOADS: usize = 10_000;
const SAMPLES: usize = 20;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let gpus: Vec<SimGpu> = (0..NODES)
        .flat_map(|n| {
            (0..8).map(move |index| SimGpu {
                node: format!("a100-{n:05}"),
                index,
                model: "A100-80GB".into(),
                memory_mib: 81920,
                mig_slices: 8,
            })
        })
        .collect();
    let cfg = SimConfig {
        telemetry_interval: Duration::ZERO,
        ..SimConfig::default()
    };
    let b = SimBackend::new(cfg, gpus);
    let mig = MigInstance::new("3g.40gb", 9, 0, 4);
    for i in 0..WORKLOADS {
        let node = format!("a100-{:05}", i % NODES);
        let (gpu, slice) = match i % 3 {
            0 => (0, SliceSpec::Whole),
            1 => (1, SliceSpec::Mig(mig.clone())),
            _ => (
                2,
                SliceSpec::Fraction {
                    milli: 250,
                    memory_mib: None,
                },
            ),
        };
        if let SliceSpec::Mig(instance) = &slice {
            let plan = PartitionPlan::Instance {
                node: node.clone(),
                gpu,
                instance: instance.clone(),
            };
            b.partition(&plan).await.expect("partition");
        }
        let spec = RunSpec {
            id: i as u64 + 1,
            tenant: "acme".into(),
            project: "vision".into(),
            name: format!("w{i}"),
            kind: "service".into(),
            node,
            model: "A100-80GB".into(),
            model_memory_mib: 81920,
            devices: Devices::Exact { gpus: vec![gpu], slice },
            cpu_milli: 1000,
            memory_mib: 4096,
            env: BTreeMap::new(),
            command: None,
            image: None,
            duration: None,
            running_since_ms: None,
            gang: Vec::new(),
            native: None,
        };
        b.start(&spec).await.expect("start");
    }
    // Lets every workload's task mark it running.
    tokio::time::sleep(Duration::from_millis(50)).await;

    let mut times = Vec::with_capacity(SAMPLES);
    let mut shape = (0, 0, 0);
    for _ in 0..SAMPLES {
        let t0 = Instant::now();
        let sample = b.sample();
        times.push(t0.elapsed());
        shape = (
            sample.len(),
            sample.iter().filter(|g| g.util_pct > 0.0).count(),
            sample.iter().map(|g| g.instances.len()).sum::<usize>(),
        );
    }
    times.sort();
    let (gpus, busy, instances) = shape;
    assert_eq!((gpus, busy), (NODES * 8, WORKLOADS), "every GPU, every workload");
    println!(
        "one telemetry sample: {gpus} GPUs ({busy} busy, {instances} instance series): min {:.1} ms, median {:.1} ms, max {:.1} ms over {SAMPLES} samples",
        ms(times[0]),
        ms(times[SAMPLES / 2]),
        ms(times[SAMPLES - 1]),
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
