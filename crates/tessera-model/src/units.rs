//! The one GPU unit.
//!
//! A whole GPU is 1.0; a MIG instance is the share of the GPU's memory slices its placement
//! occupies (3g.40gb on an A100-80GB occupies 4 of 8 slices = 0.5, 1g.10gb = 0.125, a 1g on an
//! A30 = 0.25); a fraction of a shared GPU is `milli / 1000`. Every one of these is an exact
//! multiple of 1/1000, so the unit is stored as an integer count of thousandths and sums are
//! exact: quota, fair share and metering never accumulate rounding error.

use std::fmt;
use std::iter::Sum;
use std::ops::{Add, AddAssign, Sub, SubAssign};

use serde::{Deserialize, Serialize};

/// An amount of GPU, in thousandths of one whole GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GpuUnits(pub u64);

impl GpuUnits {
    pub const ZERO: GpuUnits = GpuUnits(0);
    pub const ONE_GPU: GpuUnits = GpuUnits(1000);

    /// `n` whole GPUs.
    pub const fn whole(n: u64) -> Self {
        GpuUnits(n * 1000)
    }

    /// A fraction of one GPU given in milli-GPU (1..=1000).
    pub const fn milli(m: u64) -> Self {
        GpuUnits(m)
    }

    /// A MIG instance occupying `size` of `slices` memory slices. Exact for 8 and 4 slices.
    pub const fn mig(size: u8, slices: u8) -> Self {
        GpuUnits(1000 * size as u64 / slices as u64)
    }

    pub const fn as_milli(self) -> u64 {
        self.0
    }

    pub fn as_f64(self) -> f64 {
        self.0 as f64 / 1000.0
    }
}

impl fmt::Display for GpuUnits {
    /// Prints the shortest exact decimal: `1`, `0.5`, `0.125`, `22.5`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.0 / 1000;
        let frac = self.0 % 1000;
        if frac == 0 {
            return write!(f, "{whole}");
        }
        let mut s = format!("{frac:03}");
        while s.ends_with('0') {
            s.pop();
        }
        write!(f, "{whole}.{s}")
    }
}

/// GPU-unit-hours as people read them: one decimal, up to three where that is what tells a
/// small amount from zero (`100.0`, `12.5`, `0.001`).
pub fn unit_hours(h: f64) -> String {
    // Less than what is shown is zero, whatever its sign.
    let h = if h.abs() < 0.0005 { 0.0 } else { h };
    let mut s = format!("{h:.3}");
    while s.ends_with('0') && !s.ends_with(".0") {
        s.pop();
    }
    s
}

impl Add for GpuUnits {
    type Output = GpuUnits;
    fn add(self, rhs: Self) -> Self {
        GpuUnits(self.0 + rhs.0)
    }
}

impl AddAssign for GpuUnits {
    fn add_assign(&mut self, rhs: Self) {
        self.0 += rhs.0;
    }
}

impl Sub for GpuUnits {
    type Output = GpuUnits;
    fn sub(self, rhs: Self) -> Self {
        GpuUnits(self.0 - rhs.0)
    }
}

impl SubAssign for GpuUnits {
    fn sub_assign(&mut self, rhs: Self) {
        self.0 -= rhs.0;
    }
}

impl Sum for GpuUnits {
    fn sum<I: Iterator<Item = Self>>(iter: I) -> Self {
        GpuUnits(iter.map(|u| u.0).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_hours_keep_what_tells_a_small_amount_from_zero() {
        let shown: Vec<String> = [100.0, 100.5, 12.25, 0.001, 0.0004, -0.0002, -0.5, 2.3456]
            .map(unit_hours)
            .into();
        assert_eq!(
            shown,
            ["100.0", "100.5", "12.25", "0.001", "0.0", "0.0", "-0.5", "2.346"]
        );
    }

    #[test]
    fn reference_values() {
        assert_eq!(GpuUnits::mig(4, 8).to_string(), "0.5");
        assert_eq!(GpuUnits::mig(1, 8).to_string(), "0.125");
        assert_eq!(GpuUnits::mig(1, 4).to_string(), "0.25");
        assert_eq!(GpuUnits::mig(8, 8), GpuUnits::ONE_GPU);
        assert_eq!(GpuUnits::whole(8).to_string(), "8");
        assert_eq!(GpuUnits::milli(250).to_string(), "0.25");
        assert_eq!((GpuUnits::whole(22) + GpuUnits::milli(500)).to_string(), "22.5");
    }
}
