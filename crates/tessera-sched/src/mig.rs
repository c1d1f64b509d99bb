//! On-demand MIG partitioning: which GPU and which start slice a new instance should take.
//!
//! A new GPU instance may only be created in free memory slices; running instances are never
//! moved. What matters for the future of a GPU is therefore its occupancy: the mask of occupied
//! memory slices plus whether the single `+me` instance exists (every other instance limit is
//! implied by the legal placements). For each occupancy we count the layouts that can still be
//! added to it (its *flexibility*: how many future combinations of requests it can still
//! serve); placing an instance costs the flexibility it destroys. The engine puts a request on
//! the (GPU, start) with the smallest cost, which
//! * keeps aligned free blocks for large profiles (a 1g goes to slice 6 before slice 0, so
//!   a 4g or 3g can still use slices 0–3), and
//! * fills partly used GPUs before opening empty ones, because a nearly full GPU has little
//!   flexibility left to lose.
//!
//! All of it is precomputed per geometry (≤ 512 occupancies × 7 profiles), so a decision is a
//! table lookup per occupied state, independent of the fleet's size.
//!
//! How instances come to exist depends on the backend, hence [`MigMode`]: created one at a time
//! where the request lands (NVML), or as part of a layout applied to a whole idle GPU (the GPU
//! Operator's MIG manager). The same table serves both: in the second mode it picks the start of
//! a new instance on a GPU being laid out afresh.

use tessera_model::MigGeometry;
use tessera_model::layout::{Placed, enumerate_layouts};

/// How the backend partitions MIG GPUs, and therefore where the engine may put an instance.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MigMode {
    /// Instances are created one at a time at a chosen placement while the others keep running
    /// (NVML's `CreateGpuInstanceWithPlacement`); an instance exists only while in use.
    #[default]
    Instance,
    /// A GPU's layout is applied as a whole and only while none of its instances is in use
    /// (the GPU Operator's MIG manager). Instances stay configured after release; a request
    /// takes a free configured instance, or an idle GPU is laid out again around it.
    WholeGpu,
}

/// Occupancy key of a GPU: mask of occupied memory slices, plus one bit for `+me`.
pub fn state_key(geom: &MigGeometry, mask: u16, me: bool) -> usize {
    mask as usize | ((me as usize) << geom.mem_slices)
}

/// The same key for a configured layout: the slices it covers and whether it has the `+me`
/// instance.
pub fn layout_key(geom: &MigGeometry, layout: &[Placed]) -> usize {
    let (mask, me) = layout.iter().fold((0u16, false), |(m, me), p| {
        let prof = &geom.profiles[p.profile as usize];
        (m | prof.mask_at(p.start), me || prof.media_extensions)
    });
    state_key(geom, mask, me)
}

/// Precomputed flexibility and best moves for one MIG geometry.
#[derive(Debug)]
pub struct MigTable {
    pub geom: &'static MigGeometry,
    /// Flexibility of each occupancy key.
    pub flexibility: Vec<u32>,
    /// `best[key * profiles + p]`: the best start for profile `p` from that occupancy and the
    /// flexibility it costs; `None` when the profile does not fit.
    best: Vec<Option<(u8, u32)>>,
}

impl MigTable {
    pub fn new(geom: &'static MigGeometry) -> Self {
        let layouts: Vec<(u16, bool)> = enumerate_layouts(geom)
            .iter()
            .map(|l| {
                let mask = l
                    .iter()
                    .fold(0u16, |m, p| m | geom.profiles[p.profile as usize].mask_at(p.start));
                let me = l.iter().any(|p| geom.profiles[p.profile as usize].media_extensions);
                (mask, me)
            })
            .collect();
        let states = 1usize << (geom.mem_slices + 1);
        let full = geom.full_mask();
        let mut flexibility = vec![0u32; states];
        for (key, flex) in flexibility.iter_mut().enumerate() {
            let mask = key as u16 & full;
            let me = key >> geom.mem_slices & 1 == 1;
            *flex = layouts.iter().filter(|(m, lme)| m & mask == 0 && !(me && *lme)).count() as u32;
        }
        let np = geom.profiles.len();
        let mut best = vec![None; states * np];
        for key in 0..states {
            let mask = key as u16 & full;
            let me = key >> geom.mem_slices & 1 == 1;
            for (pi, p) in geom.profiles.iter().enumerate() {
                if p.media_extensions && me {
                    continue;
                }
                // Prefer high starts on ties: low, aligned blocks stay free for big profiles.
                let mut choice: Option<(u8, u32)> = None;
                for &s in p.starts.iter().rev() {
                    let m = p.mask_at(s);
                    if m & mask != 0 {
                        continue;
                    }
                    let nk = state_key(geom, mask | m, me || p.media_extensions);
                    let loss = flexibility[key] - flexibility[nk];
                    if choice.is_none_or(|(_, l)| loss < l) {
                        choice = Some((s, loss));
                    }
                }
                best[key * np + pi] = choice;
            }
        }
        MigTable {
            geom,
            flexibility,
            best,
        }
    }

    /// Best start for profile index `p` on a GPU in occupancy `key`, with its cost.
    pub fn best(&self, key: usize, p: usize) -> Option<(u8, u32)> {
        self.best[key * self.geom.profiles.len() + p]
    }

    pub fn states(&self) -> usize {
        self.flexibility.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_model::catalogue::{MIG_8_SLICE, MIG_A30};

    #[test]
    fn empty_gpu_counts_every_layout() {
        let t = MigTable::new(&MIG_8_SLICE);
        assert_eq!(t.flexibility[0], 2319);
        assert_eq!(t.flexibility[state_key(&MIG_8_SLICE, 0xff, false)], 1);
        // 76: layouts with two +me instances are invalid (tessera-model::layout rule 4).
        assert_eq!(MigTable::new(&MIG_A30).flexibility[0], 76);
    }

    #[test]
    fn first_instances_keep_large_blocks_free() {
        let g = &MIG_8_SLICE;
        let t = MigTable::new(g);
        let p1g = g.profile_index(19).unwrap();
        let (start, _) = t.best(0, p1g).unwrap();
        // After the first 1g, a 3g and a 2g must still fit beside it (7 compute slices).
        let k = state_key(g, g.profiles[p1g].mask_at(start), false);
        let p3 = g.profile_index(9).unwrap();
        let (s3, _) = t.best(k, p3).expect("a 3g still fits");
        let k2 = state_key(g, g.profiles[p1g].mask_at(start) | g.profiles[p3].mask_at(s3), false);
        assert!(
            t.best(k2, g.profile_index(14).unwrap()).is_some(),
            "and a 2g beside them"
        );
        // A 3g on an empty GPU takes slices 4..7, leaving the only 4g placement free.
        let (s3, _) = t.best(0, p3).unwrap();
        assert_eq!(s3, 4);
        let k = state_key(g, g.profiles[p3].mask_at(4), false);
        assert_eq!(t.best(k, g.profile_index(5).unwrap()).map(|b| b.0), Some(0));
    }

    #[test]
    fn partially_used_gpus_lose_less() {
        let g = &MIG_8_SLICE;
        let t = MigTable::new(g);
        let p1g = g.profile_index(19).unwrap();
        let (_, loss_empty) = t.best(0, p1g).unwrap();
        let half = state_key(g, 0xf0, false);
        let (_, loss_half) = t.best(half, p1g).unwrap();
        assert!(loss_half < loss_empty);
    }
}
