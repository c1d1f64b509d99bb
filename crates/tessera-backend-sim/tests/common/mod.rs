//! Fixtures shared by the simulated backend's tests: a small fleet, run specs, and event
//! helpers that work under Tokio's paused clock.

#![allow(dead_code)] // each test binary uses its own part of the fixtures

use std::collections::BTreeMap;
use std::time::Duration;

use tessera_backend::{Backend, BackendEvent, Devices, MigInstance, Resource, RunSpec, SliceSpec};
use tessera_backend_sim::{SimBackend, SimConfig, SimGpu, SimMode};
use tokio::sync::mpsc::UnboundedReceiver;

pub const A100_MIB: u32 = 81920;

/// Two A100-80GB nodes of 8 GPUs (MIG, 8 memory slices) and one L40S node of 4 (no MIG).
pub fn fleet() -> Vec<SimGpu> {
    let mut gpus = Vec::new();
    for node in ["a100-00", "a100-01"] {
        for index in 0..8 {
            gpus.push(SimGpu {
                node: node.into(),
                index,
                model: "A100-80GB".into(),
                memory_mib: A100_MIB,
                mig_slices: 8,
            });
        }
    }
    for index in 0..4 {
        gpus.push(SimGpu {
            node: "l40s-00".into(),
            index,
            model: "L40S".into(),
            memory_mib: 46068,
            mig_slices: 0,
        });
    }
    gpus
}

pub const FLEET_GPUS: usize = 20;

/// A mode's defaults without periodic telemetry, so that event streams hold only what a test
/// caused.
pub fn quiet(mode: SimMode) -> SimConfig {
    SimConfig {
        telemetry_interval: Duration::ZERO,
        ..SimConfig::for_mode(mode)
    }
}

/// Both modes, quiet, with MIG partitioning that takes no time.
pub fn both_modes() -> [SimConfig; 2] {
    [SimMode::Exact, SimMode::Operator].map(|mode| SimConfig {
        mig_partition_time: Duration::ZERO,
        ..quiet(mode)
    })
}

pub fn backend(cfg: SimConfig) -> (SimBackend, UnboundedReceiver<BackendEvent>) {
    let b = SimBackend::new(cfg, fleet());
    let rx = b.take_events().expect("events not taken yet");
    (b, rx)
}

pub fn mig3g(start: u8) -> MigInstance {
    MigInstance::new("3g.40gb", 9, start, 4)
}

pub fn spec(id: u64, node: &str, devices: Devices, duration: Option<Duration>) -> RunSpec {
    RunSpec {
        id,
        tenant: "acme".into(),
        project: "vision".into(),
        name: format!("train-{id}"),
        kind: "batch".into(),
        node: node.into(),
        model: "A100-80GB".into(),
        model_memory_mib: A100_MIB,
        devices,
        cpu_milli: 4000,
        memory_mib: 16384,
        env: BTreeMap::from([("EPOCHS".to_string(), "3".to_string())]),
        command: Some(vec!["python".into(), "train.py".into()]),
        image: None,
        duration,
        running_since_ms: None,
        gang: Vec::new(),
        native: None,
    }
}

pub fn exact(gpus: &[u8], slice: SliceSpec) -> Devices {
    Devices::Exact {
        gpus: gpus.to_vec(),
        slice,
    }
}

pub fn count(resource: Resource, count: u8) -> Devices {
    Devices::Count { resource, count }
}

pub fn mig_resource(profile: &str) -> Resource {
    Resource::Mig {
        profile: profile.into(),
    }
}

/// The next event; under a paused clock the wait advances time to the next timer.
pub async fn next(rx: &mut UnboundedReceiver<BackendEvent>) -> BackendEvent {
    tokio::time::timeout(Duration::from_secs(24 * 3600), rx.recv())
        .await
        .expect("an event within a day")
        .expect("the stream is open")
}

/// Asserts that nothing arrives within `within` (of paused time, so cheap).
pub async fn silent(rx: &mut UnboundedReceiver<BackendEvent>, within: Duration) {
    if let Ok(e) = tokio::time::timeout(within, rx.recv()).await {
        panic!("expected no event, got {e:?}");
    }
}

/// Asserts that the next event is workload 1's exit, 50 s (± 0.1) of paused time from now: the
/// rest of its 60 s, adopted 10 s into them.
pub async fn exits_after_the_rest_of_its_time(rx: &mut UnboundedReceiver<BackendEvent>, mode: SimMode) {
    let t0 = tokio::time::Instant::now();
    match next(rx).await {
        BackendEvent::Exited { id: 1, .. } => {
            let left = t0.elapsed().as_secs_f64();
            assert!((49.9..=50.1).contains(&left), "{mode}: {left} s left of 60");
        }
        other => panic!("{mode}: expected Exited, got {other:?}"),
    }
}

pub fn rejected(e: tessera_backend::BackendError) -> String {
    match e {
        tessera_backend::BackendError::Rejected(m) => m,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// Wall-clock ms of the sim clock's "now" as a test sees it (for `running_since_ms`).
pub fn epoch_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}
