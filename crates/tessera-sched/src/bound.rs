//! A lower bound on the GPU that fractional shares leave free, whatever the placement.
//!
//! Shares of one GPU (`milli < 1000`) are items of a bin-packing problem with bins of 1000. Any
//! placement of a multiset of shares uses at least as many GPUs as the linear-programming
//! relaxation of that bin packing, and the relaxation is bounded below by any *dual-feasible
//! price*: a price per share size such that no set of shares that fits on one GPU costs more
//! than 1. Then `GPUs ≥ Σ price(share)`, so the free milli on the GPUs that hold shares is at
//! least `1000 × Σ price − Σ milli`.
//!
//! [`price_twelfths`] is such a price, in twelfths of a GPU so that it is exact integer
//! arithmetic. It is the optimal dual of the relaxation on the openb default pod list, and it
//! is feasible for shares of any size (a test checks every set of integer shares that fits one
//! GPU), so the bound holds for any demand. Shares also never fit in fewer GPUs than their
//! total milli needs, which is the bound where small shares dominate.
//!
//! The bound answers "how close to the limit is a policy that places every share that
//! arrives": on the openb default file, the 810-milli shares alone strand 190 milli each that
//! only the rare shares of 160 milli or less can use.

/// Milli per GPU.
const GPU: u64 = tessera_model::GpuUnits::ONE_GPU.0;

/// Twelfths of a GPU that a share of `milli` costs at least, by size band: 0 below 220, 1 for
/// 220-229, 3 for 230-319, 4 for 320-459, 6 for 460-549, 8 for 550-809, 12 from 810. For
/// example 220 + 230 + 550 = 1000 costs 1 + 3 + 8 = 12, and 470 + 470 costs 12.
pub fn price_twelfths(milli: u16) -> u64 {
    match milli {
        0..220 => 0,
        220..230 => 1,
        230..320 => 3,
        320..460 => 4,
        460..550 => 6,
        550..810 => 8,
        _ => 12,
    }
}

/// Running totals of shares, with the bound on the free milli any placement of them
/// leaves on the GPUs that hold them.
#[derive(Clone, Debug, Default)]
pub struct ShareBound {
    twelfths: u64,
    milli: u64,
}

impl ShareBound {
    /// Adds one share (ignores whole GPUs and zero).
    pub fn add(&mut self, milli: u16) {
        if milli == 0 || milli as u64 >= GPU {
            return;
        }
        self.twelfths += price_twelfths(milli);
        self.milli += milli as u64;
    }

    /// At least this many GPUs hold these shares, however they are placed.
    pub fn gpus(&self) -> u64 {
        self.twelfths.div_ceil(12).max(self.milli.div_ceil(GPU))
    }

    /// At least this many milli stay free on the GPUs that hold these shares, however they are
    /// placed.
    pub fn free_milli(&self) -> u64 {
        self.gpus() * GPU - self.milli
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The most that any set of shares fitting one GPU costs, over every integer share size:
    /// a knapsack over the milli used.
    fn most_costly_gpu() -> u64 {
        let mut best = [0u64; GPU as usize + 1];
        for used in 1..=GPU as usize {
            for m in 1..used.min(GPU as usize - 1) + 1 {
                best[used] = best[used].max(best[used - m] + price_twelfths(m as u16));
            }
        }
        best[GPU as usize]
    }

    #[test]
    fn no_set_of_shares_that_fits_a_gpu_costs_more_than_one_gpu() {
        assert_eq!(most_costly_gpu(), 12);
    }

    #[test]
    fn the_price_is_tight_on_exact_openb_pairings() {
        for set in [
            &[470u16, 470][..],
            &[650, 320],
            &[550, 230, 220],
            &[810],
            &[320, 320, 320],
        ] {
            assert!(set.iter().map(|&m| m as u64).sum::<u64>() <= GPU);
            assert_eq!(set.iter().map(|&m| price_twelfths(m)).sum::<u64>(), 12, "{set:?}");
        }
    }

    #[test]
    fn the_bound_counts_what_any_placement_strands() {
        let mut b = ShareBound::default();
        assert_eq!((b.gpus(), b.free_milli()), (0, 0));
        // Four 470s cost two GPUs: 2,000 - 1,880 = 120 milli free at least.
        for _ in 0..4 {
            b.add(470);
        }
        assert_eq!((b.gpus(), b.free_milli()), (2, 120));
        // An 810 strands 190 that a 160 can use: 120 + 190 - 160.
        b.add(810);
        b.add(160);
        assert_eq!((b.gpus(), b.free_milli()), (3, 150));
        // A fifth 470 needs a GPU of its own (2.5 GPUs rounded up).
        b.add(470);
        assert_eq!((b.gpus(), b.free_milli()), (4, 680));
        // Small shares cost nothing but still need room: eleven 100s need two GPUs.
        let mut small = ShareBound::default();
        for _ in 0..11 {
            small.add(100);
        }
        assert_eq!((small.gpus(), small.free_milli()), (2, 900));
        // Whole GPUs are not shares.
        b.add(1000);
        b.add(0);
        assert_eq!((b.gpus(), b.free_milli()), (4, 680));
    }
}
