//! Q8_K: 256 values as `q * d` with an f32 scale and per-16 sums, the activation format
//! every K-quant weight is dotted against (the sums let the weight minimums be applied
//! without touching the individual quants).

use super::common::{nearest_int, quantize_with, rd_i8_arr, wr_i8_arr, Block, QK_K};
use crate::GgmlType;

/// `block_q8_K`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8K {
    /// Scale (a full f32 here, unlike every other format).
    pub d: f32,
    pub qs: [i8; QK_K],
    /// Sum of each group of 16 quants.
    pub bsums: [i16; QK_K / 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);

impl Block for BlockQ8K {
    const TYPE: GgmlType = GgmlType::Q8_K;
    const BLOCK_ELEMS: usize = QK_K;
    const BYTES: usize = 292;
    fn read(b: &[u8]) -> Self {
        let mut bsums = [0i16; QK_K / 16];
        for (j, s) in bsums.iter_mut().enumerate() {
            *s = i16::from_le_bytes([b[260 + 2 * j], b[261 + 2 * j]]);
        }
        Self {
            d: f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            qs: rd_i8_arr(b, 4),
            bsums,
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[..4].copy_from_slice(&self.d.to_le_bytes());
        wr_i8_arr(out, 4, &self.qs);
        for (j, s) in self.bsums.iter().enumerate() {
            out[260 + 2 * j..262 + 2 * j].copy_from_slice(&s.to_le_bytes());
        }
    }

    /// `quantize_row_q8_K_ref`: the signed extreme maps to -127 (ggml moved from -128 so
    /// quants stay in `-127..=127`).
    fn quantize(x: &[f32]) -> Self {
        let mut max = 0.0f32;
        let mut amax = 0.0f32;
        for &v in &x[..QK_K] {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        Self::with_extreme(x, max)
    }

    /// `dequantize_row_q8_K` for one block.
    fn dequantize(&self, y: &mut [f32]) {
        for (y, &q) in y[..QK_K].iter_mut().zip(&self.qs) {
            *y = self.d * q as f32;
        }
    }
}

impl BlockQ8K {
    /// The block as ggml's x86 `ggml_quantize_mat_q8_K_4x8` forms it for the tokens its
    /// repacked Q4_K GEMM takes four at a time: the same as [`Self::quantize`] except
    /// for the sign of the scale, which is negative (the extreme maps to -127) whenever
    /// some element equals `+amax`, where the reference follows the first extreme. (Its
    /// `round_ps` to nearest-even gives the same quants as the reference's `nearest_int`.)
    pub fn quantize_4x8(x: &[f32]) -> Self {
        let amax = x[..QK_K].iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let max = if x[..QK_K].contains(&amax) {
            amax
        } else {
            -amax
        };
        Self::with_extreme(x, max)
    }

    /// The block for `iscale = -127 / max` (all zero when `max` is 0).
    fn with_extreme(x: &[f32], max: f32) -> Self {
        let mut b = BlockQ8K {
            d: 0.0,
            qs: [0; QK_K],
            bsums: [0; QK_K / 16],
        };
        if max == 0.0 {
            return b;
        }
        let iscale = -127.0f32 / max;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (s, g) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = g.iter().map(|&q| q as i32).sum::<i32>() as i16;
        }
        b.d = 1.0 / iscale;
        b
    }
}

/// Quantizes a row as [`BlockQ8K::quantize_4x8`] does.
pub fn quantize_4x8(src: &[f32], dst: &mut [u8]) {
    quantize_with::<BlockQ8K>(src, dst, BlockQ8K::quantize_4x8);
}
