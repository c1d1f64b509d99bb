//! MIG layouts on one GPU: validity, exhaustive enumeration, and adding an instance to a layout
//! that is applied as a whole.
//!
//! The validity rule (reference §1.2), for the GPU instances on one GPU:
//! 1. each instance uses a `(profile, start)` pair from that profile's legal placements;
//! 2. the memory-slice intervals `[start, start + size)` are pairwise disjoint;
//! 3. the count of instances of a profile never exceeds its `max_instances`;
//! 4. at most one instance has media extensions (`+me`), whatever its profile: a GPU has a
//!    single set of JPEG decoders and OFA to give. On the 8-slice table this is rule 3 again
//!    (one `+me` profile, `instanceCount` 1); on A30 it also forbids `1g.6gb+me` next to
//!    `2g.12gb+me`, which per-profile counts alone would allow (the A30 has one JPEG and one OFA,
//!    reference §2.8, and both `+me` profiles take them). This one rule holds for the catalogue,
//!    the engine and the backends alike.
//!
//! The placement tables already encode the 7-SM-slice limit, so no separate compute check is
//! needed ([I] in the reference; [`enumerate_layouts`] confirms it for the built-in tables).

use std::collections::BTreeSet;
use std::fmt;

use crate::catalogue::MigGeometry;

/// One GPU instance in a layout: index of its profile in the geometry and its start slice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Placed {
    pub profile: u8,
    pub start: u8,
}

/// Why a layout is invalid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LayoutError {
    UnknownProfile(u8),
    IllegalStart {
        profile_id: u32,
        start: u8,
    },
    Overlap {
        slice: u8,
    },
    TooMany {
        profile_id: u32,
        max: u8,
    },
    /// A second `+me` instance: the GPU's media engines already belong to another.
    MediaEngines,
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayoutError::UnknownProfile(i) => write!(f, "unknown profile index {i}"),
            LayoutError::IllegalStart { profile_id, start } => {
                write!(f, "profile {profile_id} cannot be placed at memory slice {start}")
            }
            LayoutError::Overlap { slice } => write!(f, "two instances share memory slice {slice}"),
            LayoutError::TooMany { profile_id, max } => {
                write!(f, "more than {max} instances of profile {profile_id}")
            }
            LayoutError::MediaEngines => f.write_str("more than one +me instance; the GPU's media engines go to one"),
        }
    }
}

impl std::error::Error for LayoutError {}

/// Checks rules 1–4 for `layout` on `geom`. Returns the occupied-slice mask when valid.
pub fn validate(geom: &MigGeometry, layout: &[Placed]) -> Result<u16, LayoutError> {
    let mut mask = 0u16;
    let mut counts = [0u8; 16];
    let mut media = false;
    for p in layout {
        let prof = geom
            .profiles
            .get(p.profile as usize)
            .ok_or(LayoutError::UnknownProfile(p.profile))?;
        if !prof.starts.contains(&p.start) {
            return Err(LayoutError::IllegalStart {
                profile_id: prof.id,
                start: p.start,
            });
        }
        let m = prof.mask_at(p.start);
        if mask & m != 0 {
            return Err(LayoutError::Overlap {
                slice: (mask & m).trailing_zeros() as u8,
            });
        }
        mask |= m;
        counts[p.profile as usize] += 1;
        if counts[p.profile as usize] > prof.max_instances {
            return Err(LayoutError::TooMany {
                profile_id: prof.id,
                max: prof.max_instances,
            });
        }
        if prof.media_extensions {
            if media {
                return Err(LayoutError::MediaEngines);
            }
            media = true;
        }
    }
    Ok(mask)
}

/// Every distinct valid placed layout (as a sorted set of instances), the empty one included.
pub fn enumerate_layouts(geom: &MigGeometry) -> Vec<Vec<Placed>> {
    let options: Vec<Placed> = geom
        .profiles
        .iter()
        .enumerate()
        .flat_map(|(i, p)| {
            p.starts.iter().map(move |&s| Placed {
                profile: i as u8,
                start: s,
            })
        })
        .collect();
    let mut out = Vec::new();
    let mut cur = Vec::new();
    fn rec(geom: &MigGeometry, options: &[Placed], from: usize, cur: &mut Vec<Placed>, out: &mut Vec<Vec<Placed>>) {
        out.push(cur.clone());
        for i in from..options.len() {
            cur.push(options[i]);
            if validate(geom, cur).is_ok() {
                rec(geom, options, i + 1, cur, out);
            }
            cur.pop();
        }
    }
    rec(geom, &options, 0, &mut cur, &mut out);
    out
}

/// How many instances of `layout` own media extensions (`+me`). A GPU has one set of media
/// engines to give (on A30 both `1g.6gb+me` and `2g.12gb+me` take its only JPEG decoder and
/// OFA), so a layout the scheduler builds or adopts has at most one.
pub fn media_instances(geom: &MigGeometry, layout: &[Placed]) -> usize {
    layout
        .iter()
        .filter(|p| {
            geom.profiles
                .get(p.profile as usize)
                .is_some_and(|q| q.media_extensions)
        })
        .count()
}

/// `layout` (valid, at most one `+me`) with `new` added: `new` first, then each instance of
/// `layout` in start order that keeps the result valid with at most one `+me` (the ones
/// overlapping `new`, or another `+me`, are dropped). The result is sorted by start.
///
/// This is how a GPU that is laid out as a whole (the GPU Operator's MIG manager) takes a new
/// instance: keeping the instances that can stay means fewer changes, and demand for the same
/// profiles finds them configured again.
pub fn with_instance(geom: &MigGeometry, layout: &[Placed], new: Placed) -> Vec<Placed> {
    let mut out = Vec::with_capacity(layout.len() + 1);
    out.push(new);
    for &p in layout {
        out.push(p);
        if validate(geom, &out).is_err() || media_instances(geom, &out) > 1 {
            out.pop();
        }
    }
    out.sort_unstable_by_key(|p| p.start);
    out
}

/// A multiset of profiles: instance count per profile index.
pub type ProfileMultiset = Vec<u8>;

/// The distinct profile multisets realisable by some valid layout, restricted to the profiles
/// whose indexes are in `allowed` (layouts using other profiles are skipped).
pub fn realisable_multisets(geom: &MigGeometry, allowed: &[usize]) -> BTreeSet<ProfileMultiset> {
    enumerate_layouts(geom)
        .into_iter()
        .filter(|l| l.iter().all(|p| allowed.contains(&(p.profile as usize))))
        .map(|l| {
            let mut m = vec![0u8; geom.profiles.len()];
            for p in l {
                m[p.profile as usize] += 1;
            }
            m
        })
        .collect()
}

/// The maximal multisets: those that no other realisable multiset strictly contains.
pub fn maximal_multisets(geom: &MigGeometry, allowed: &[usize]) -> Vec<ProfileMultiset> {
    let all = realisable_multisets(geom, allowed);
    all.iter()
        .filter(|m| {
            !all.iter()
                .any(|o| o != *m && o.iter().zip(m.iter()).all(|(a, b)| a >= b))
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogue::{MIG_8_SLICE, MIG_A30};

    fn idx(geom: &MigGeometry, id: u32) -> u8 {
        geom.profile_index(id).unwrap() as u8
    }

    fn at(geom: &MigGeometry, id: u32, start: u8) -> Placed {
        Placed {
            profile: idx(geom, id),
            start,
        }
    }

    #[test]
    fn reference_examples() {
        let g = &MIG_8_SLICE;
        // 4g + 3g: 4g@0, 3g@4.
        assert!(validate(g, &[at(g, 5, 0), at(g, 9, 4)]).is_ok());
        // 3g + 3g at 0 and 4.
        assert_eq!(validate(g, &[at(g, 9, 0), at(g, 9, 4)]), Ok(0xff));
        // 4g + 4g: only one legal 4g placement, and at most one instance.
        assert!(validate(g, &[at(g, 5, 0), at(g, 5, 0)]).is_err());
        assert!(validate(g, &[at(g, 5, 0), at(g, 5, 4)]).is_err());
        // 7 × 1g fills slices 0..6 and leaves memory slice 7 idle.
        let seven: Vec<_> = (0..7).map(|s| at(g, 19, s)).collect();
        assert_eq!(validate(g, &seven), Ok(0x7f));
        // and no 1g can ever take slice 7.
        assert!(matches!(
            validate(g, &[at(g, 19, 7)]),
            Err(LayoutError::IllegalStart { .. })
        ));
        // +me is limited to one instance.
        assert!(matches!(
            validate(g, &[at(g, 20, 0), at(g, 20, 1)]),
            Err(LayoutError::TooMany { profile_id: 20, max: 1 })
        ));
        // overlap
        assert!(matches!(
            validate(g, &[at(g, 14, 0), at(g, 19, 1)]),
            Err(LayoutError::Overlap { slice: 1 })
        ));
    }

    #[test]
    fn eight_slice_counts_match_the_reference() {
        let g = &MIG_8_SLICE;
        let layouts = enumerate_layouts(g);
        assert_eq!(layouts.len(), 2319, "distinct placed layouts, empty included");
        let all: Vec<usize> = (0..g.profiles.len()).collect();
        assert_eq!(realisable_multisets(g, &all).len(), 128);
        assert_eq!(maximal_multisets(g, &all).len(), 44);
        let base: Vec<usize> = [19, 14, 9, 5, 0]
            .iter()
            .map(|&id| g.profile_index(id).unwrap())
            .collect();
        assert_eq!(realisable_multisets(g, &base).len(), 38);
        assert_eq!(maximal_multisets(g, &base).len(), 12);
        // never more than 7 compute slices
        for l in &layouts {
            let sm: u8 = l.iter().map(|p| g.profiles[p.profile as usize].sm_slices).sum();
            assert!(sm <= 7);
        }
    }

    #[test]
    fn with_instance_keeps_what_does_not_overlap() {
        let g = &MIG_8_SLICE;
        // Two 3g; a 1g at slice 6 replaces the 3g at 4 and keeps the one at 0.
        let l = with_instance(g, &[at(g, 9, 0), at(g, 9, 4)], at(g, 19, 6));
        assert_eq!(l, vec![at(g, 9, 0), at(g, 19, 6)]);
        assert!(validate(g, &l).is_ok());
        // Sorted by start whatever the order of the input.
        let l = with_instance(g, &[at(g, 19, 5), at(g, 19, 1)], at(g, 14, 2));
        assert_eq!(l, vec![at(g, 19, 1), at(g, 14, 2), at(g, 19, 5)]);
        // A second +me is never kept, even where the slices are free.
        let l = with_instance(g, &[at(g, 20, 0), at(g, 19, 1)], at(g, 20, 6));
        assert_eq!(l, vec![at(g, 19, 1), at(g, 20, 6)]);
        // An empty layout gets just the new instance.
        assert_eq!(with_instance(g, &[], at(g, 0, 0)), vec![at(g, 0, 0)]);
        // On A30 the two +me profiles differ, but the media engines still go to one instance.
        let a30 = &MIG_A30;
        let l = with_instance(a30, &[at(a30, 21, 0), at(a30, 14, 1)], at(a30, 6, 2));
        assert_eq!(l, vec![at(a30, 14, 1), at(a30, 6, 2)]);
        assert_eq!(media_instances(a30, &l), 1);
        assert_eq!(
            validate(a30, &[at(a30, 21, 0), at(a30, 6, 2)]),
            Err(LayoutError::MediaEngines),
            "per-profile limits alone would allow both; rule 4 does not"
        );
    }

    /// Reference §2.9 counts 84 A30 layouts, 22 multisets and 9 maximal ones with rules 1–3
    /// only; its maximal `1g+1g+me+2g+me` gives the GPU's single JPEG/OFA set (§2.8: one JPG and
    /// one OFA on the whole A30) to two instances. With rule 4 (the engine's stricter rule, which
    /// is the one that holds everywhere now) the 8 layouts pairing `1g.6gb+me` with `2g.12gb+me`
    /// go: 76 layouts, 20 multisets, 8 maximal.
    #[test]
    fn a30_counts_follow_the_reference_with_one_media_engine_set() {
        let g = &MIG_A30;
        let layouts = enumerate_layouts(g);
        assert_eq!(layouts.len(), 76);
        assert!(layouts.iter().all(|l| media_instances(g, l) <= 1));
        let all: Vec<usize> = (0..g.profiles.len()).collect();
        assert_eq!(realisable_multisets(g, &all).len(), 20);
        let maximal = maximal_multisets(g, &all);
        assert_eq!(maximal.len(), 8);
        // profile order: 1g, 1g+me, 2g, 2g+me, 4g
        assert!(!maximal.contains(&vec![1, 1, 0, 1, 0]), "1g + 1g+me + 2g+me is gone");
        assert!(maximal.contains(&vec![0, 0, 1, 1, 0]), "2g + 2g+me stays");
        assert!(maximal.contains(&vec![3, 1, 0, 0, 0]), "3×1g + 1g+me stays");
        for l in enumerate_layouts(g) {
            let sm: u8 = l.iter().map(|p| g.profiles[p.profile as usize].sm_slices).sum();
            assert!(sm <= 4);
        }
    }
}
