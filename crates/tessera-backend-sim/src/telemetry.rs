//! Simulated telemetry: plausible per-GPU and per-instance values under DCGM names, stable for
//! a workload over ten-second steps, and stable NVML-style GPU UUIDs.

use tessera_backend::{GpuSample, InstanceSample, SliceSpec};

use crate::state::{Phase, State};

/// Every GPU of the fleet whose node is there, in node and index order. Costs one pass over the
/// GPUs plus one over each GPU's running workloads.
pub(crate) fn sample_all(state: &State, now_ms: i64) -> Vec<GpuSample> {
    (0..state.gpus.len())
        .filter(|&g| !state.gpus[g].gone)
        .map(|g| sample_gpu(state, g, now_ms))
        .collect()
}

/// The GPUs workload `id` runs on (on every node, for a multi-node gang).
pub(crate) fn sample_run(state: &State, id: u64, now_ms: i64) -> Vec<GpuSample> {
    state
        .runs
        .get(&id)
        .map(|r| r.gpus().map(|g| sample_gpu(state, g, now_ms)).collect())
        .unwrap_or_default()
}

pub(crate) fn sample_gpu(state: &State, g: usize, now_ms: i64) -> GpuSample {
    let gpu = &state.gpus[g];
    let board = gpu.gpu.memory_mib as u64;
    let mut s = GpuSample {
        node: gpu.gpu.node.clone(),
        gpu: gpu.gpu.index,
        uuid: gpu.uuid.clone(),
        model: gpu.gpu.model.clone(),
        util_pct: 0.0,
        fb_used_mib: 0,
        fb_free_mib: board,
        temp_c: 34.0,
        power_w: 60.0,
        xid: gpu.xid,
        instances: Vec::new(),
    };
    for id in &gpu.holders {
        let Some(run) = state.runs.get(id) else {
            continue;
        };
        let Some(since) = run.since_ms.filter(|_| run.phase == Phase::Running) else {
            continue;
        };
        let Some(slice) = run.slice_on(g) else {
            continue;
        };
        let mem = if board > 0 {
            board
        } else {
            run.spec.model_memory_mib as u64
        };
        let age = ((now_ms - since).max(0) / 10_000) as u64;
        let busy = 0.35 + 0.6 * noise(*id, age);
        let (share, profile) = match slice {
            SliceSpec::Mig(i) => (
                i.size as f64 / gpu.gpu.mig_slices.max(i.size).max(1) as f64,
                i.profile.clone(),
            ),
            SliceSpec::Fraction { milli, .. } => (*milli as f64 / 1000.0, String::new()),
            SliceSpec::Whole => (1.0, String::new()),
            SliceSpec::HostOnly => (0.0, String::new()),
        };
        let used = (mem as f64 * share * (0.5 + 0.4 * noise(*id, 7))) as u64;
        s.fb_used_mib = (s.fb_used_mib + used).min(mem);
        s.fb_free_mib = mem - s.fb_used_mib;
        s.util_pct = (s.util_pct + 100.0 * busy * share).min(100.0);
        s.temp_c = 34.0 + s.util_pct * 0.45;
        s.power_w = 60.0 + s.util_pct * 5.5;
        let instance = match slice {
            // GI IDs are the driver's choice; start + 1 is stable and unique per GPU.
            SliceSpec::Mig(i) => Some((i.start as u32 + 1, (mem as f64 * share) as u64)),
            SliceSpec::Fraction {
                memory_mib: Some(m), ..
            } => Some((0, *m as u64)),
            SliceSpec::Fraction { memory_mib: None, .. } => Some((0, (mem as f64 * share) as u64)),
            SliceSpec::Whole | SliceSpec::HostOnly => None,
        };
        if let Some((instance_id, size)) = instance {
            s.instances.push(InstanceSample {
                workload: *id,
                profile,
                instance_id,
                gr_engine_active: busy,
                fb_used_mib: used,
                fb_free_mib: size.saturating_sub(used),
            });
        }
    }
    s.instances.sort_by_key(|i| (i.instance_id, i.workload));
    s
}

/// A stable UUID in the form NVML reports (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`) for GPU
/// `gpu` of a simulated node.
pub fn sim_uuid(node: &str, gpu: u8) -> String {
    // FNV-1a of the node name and index, then two SplitMix64 draws for 128 bits.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in node.bytes().chain([0xff, gpu]) {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let (a, b) = (mix(h ^ 1), mix(h ^ 2));
    format!(
        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A stable pseudo-random number in [0, 1) from `a` and `b` (SplitMix64).
fn noise(a: u64, b: u64) -> f64 {
    let mut z = a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.wrapping_add(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_stable_nvml_shaped_and_distinct() {
        let a = sim_uuid("a100-00", 3);
        assert_eq!(a, sim_uuid("a100-00", 3));
        assert!(a.starts_with("GPU-") && a.len() == 40, "{a}");
        assert_ne!(a, sim_uuid("a100-00", 4));
        assert_ne!(a, sim_uuid("a100-01", 3));
    }

    #[test]
    fn noise_stays_in_the_unit_interval() {
        for a in 0..200 {
            let n = noise(a, a * 7 + 1);
            assert!((0.0..1.0).contains(&n), "{n}");
        }
    }
}
