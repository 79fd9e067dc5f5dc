//! ggml's soft-max of one attention row.

use super::act::expf;
use super::fma_twin;
use crate::order::{hsum, Flavor};

fma_twin! {
    /// Soft-max of one attention row in place, as ggml's `soft_max` op with the row
    /// starting at KV cell `first_cell` (cells before it are masked, so zero):
    /// `exp(x - max)` by [`expf`], summed per vector of cells aligned at cell 0 into an
    /// f64, then scaled by `(f32)(1 / sum)`.
    pub fn softmax(fl: Flavor, x: &mut [f32], first_cell: usize) = softmax_scalar
}

/// Scalar twin of [`softmax`].
#[inline(always)]
pub fn softmax_scalar(fl: Flavor, x: &mut [f32], first_cell: usize) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for v in x.iter_mut() {
        *v = expf(fl, *v - max);
    }
    let n = fl.lanes();
    let mut sum = 0.0f64;
    let mut lanes = [0.0f32; 16];
    let mut lane = first_cell % n;
    for &v in x.iter() {
        lanes[lane] = v;
        lane += 1;
        if lane == n {
            sum += hsum(fl, &mut lanes) as f64;
            lanes = [0.0; 16];
            lane = 0;
        }
    }
    if lane != 0 {
        sum += hsum(fl, &mut lanes) as f64;
    }
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_sums_to_one_and_matches_its_twin() {
        for fl in [Flavor::Avx2, Flavor::Avx512] {
            for first in [0, 5, 17] {
                let x0: Vec<f32> = (0..37).map(|i| ((i * 7919) % 13) as f32 * 0.3).collect();
                let (mut a, mut b) = (x0.clone(), x0);
                softmax(fl, &mut a, first);
                softmax_scalar(fl, &mut b, first);
                let s: f32 = a.iter().sum();
                assert!((s - 1.0).abs() < 1e-5);
                assert!(a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()));
            }
        }
    }
}
