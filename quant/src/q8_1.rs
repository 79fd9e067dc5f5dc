//! Q8_1: like Q8_0 plus `s = d * sum(q)`, the activation format for Q4_1/Q5_1 whose
//! per-block minimum needs the activation sum.

use crate::common::{c_max, dequantize_with, quantize_with, rd_i8_arr, rd_u16, wr_i8_arr, Block};
use crate::f16::{f16_to_f32, f32_to_f16};
use crate::GgmlType;

/// Values per block.
pub const QK: usize = 32;

/// `block_q8_1`: f16 scale, f16 `d * sum(qs)`, 32 signed quants.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8_1 {
    pub d: u16,
    pub s: u16,
    pub qs: [i8; QK],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);

impl Block for BlockQ8_1 {
    const TYPE: GgmlType = GgmlType::Q8_1;
    const BLOCK_ELEMS: usize = QK;
    const BYTES: usize = 36;
    fn read(b: &[u8]) -> Self {
        Self {
            d: rd_u16(b, 0),
            s: rd_u16(b, 2),
            qs: rd_i8_arr(b, 4),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..4].copy_from_slice(&self.s.to_le_bytes());
        wr_i8_arr(out, 4, &self.qs);
    }
}

impl BlockQ8_1 {
    /// `quantize_row_q8_1_ref` for one block.
    pub fn quantize(x: &[f32]) -> Self {
        let mut amax = 0.0f32;
        for &v in &x[..QK] {
            amax = c_max(amax, v.abs());
        }
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0i8; QK];
        let mut sum = 0i32;
        for j in 0..QK / 2 {
            qs[j] = (x[j] * id).round() as i8;
            qs[QK / 2 + j] = (x[QK / 2 + j] * id).round() as i8;
            sum += qs[j] as i32 + qs[QK / 2 + j] as i32;
        }
        Self {
            d: f32_to_f16(d),
            s: f32_to_f16(sum as f32 * d),
            qs,
        }
    }

    /// ggml's x86 SIMD activation quantizer: `id = 127/amax`, round-half-to-even, and
    /// `s = d * sum(q)` (see `BlockQ8_0::quantize_simd_rounding`).
    pub fn quantize_simd_rounding(x: &[f32]) -> Self {
        let mut amax = 0.0f32;
        for &v in &x[..QK] {
            amax = c_max(amax, v.abs());
        }
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut qs = [0i8; QK];
        let mut sum = 0i32;
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = (v * id).round_ties_even() as i8;
            sum += *q as i32;
        }
        Self {
            d: f32_to_f16(d),
            s: f32_to_f16(d * sum as f32),
            qs,
        }
    }

    /// Dequantizes one block (`q * d`; ggml has no row function for Q8_1, this is the
    /// obvious one and ignores `s`).
    pub fn dequantize(&self, y: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (y, &q) in y[..QK].iter_mut().zip(&self.qs) {
            *y = q as f32 * d;
        }
    }
}

/// Dequantizes a row (`src.len() == dst.len() / 32 * 36`).
pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    dequantize_with::<BlockQ8_1>(src, dst, |b, y| b.dequantize(y));
}

/// Quantizes a row with ggml's reference algorithm.
pub fn quantize(src: &[f32], dst: &mut [u8]) {
    quantize_with::<BlockQ8_1>(src, dst, BlockQ8_1::quantize);
}

/// Quantizes activations the way ggml's x86 SIMD path does.
pub fn quantize_activations(src: &[f32], dst: &mut [u8]) {
    quantize_with::<BlockQ8_1>(src, dst, BlockQ8_1::quantize_simd_rounding);
}
