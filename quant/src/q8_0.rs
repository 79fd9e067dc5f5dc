//! Q8_0: 32 values as `i8 * d`, one f16 scale per block (8.5 bits/weight).
//!
//! Used both as a weight format and as the activation format dotted with Q4_0/Q5_0/Q8_0.

use crate::common::{
    c_max, check_dot, dequantize_with, hsum_lanes, lanes_add_block, quantize_with, rd_i8_arr,
    rd_u16, wr_i8_arr, Block,
};
use crate::f16::{f16_to_f32, f32_to_f16};
use crate::GgmlType;

/// Values per block.
pub const QK: usize = 32;

/// `block_q8_0`: f16 scale followed by 32 signed quants.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8_0 {
    /// f16 bits of the scale.
    pub d: u16,
    pub qs: [i8; QK],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

impl Block for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const BLOCK_ELEMS: usize = QK;
    const BYTES: usize = 34;
    fn read(b: &[u8]) -> Self {
        Self {
            d: rd_u16(b, 0),
            qs: rd_i8_arr(b, 2),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d.to_le_bytes());
        wr_i8_arr(out, 2, &self.qs);
    }
}

impl BlockQ8_0 {
    /// `quantize_row_q8_0_ref` for one block: `d = amax/127`, `q = roundf(x/d)`.
    pub fn quantize(x: &[f32]) -> Self {
        let mut amax = 0.0f32;
        for &v in &x[..QK] {
            amax = c_max(amax, v.abs());
        }
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0i8; QK];
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = (v * id).round() as i8;
        }
        Self {
            d: f32_to_f16(d),
            qs,
        }
    }

    /// The activation quantizer of ggml's x86 SIMD path: `id = 127/amax` and
    /// round-half-to-even. It differs from the reference in rare last-unit roundings; we use
    /// it for activations so that our dot products see the same inputs as llama.cpp's.
    pub fn quantize_simd_rounding(x: &[f32]) -> Self {
        let mut amax = 0.0f32;
        for &v in &x[..QK] {
            amax = c_max(amax, v.abs());
        }
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut qs = [0i8; QK];
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = (v * id).round_ties_even() as i8;
        }
        Self {
            d: f32_to_f16(d),
            qs,
        }
    }

    /// `dequantize_row_q8_0` for one block.
    pub fn dequantize(&self, y: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (y, &q) in y[..QK].iter_mut().zip(&self.qs) {
            *y = q as f32 * d;
        }
    }
}

/// Dequantizes a row (`src.len() == dst.len() / 32 * 34`).
pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    dequantize_with::<BlockQ8_0>(src, dst, |b, y| b.dequantize(y));
}

/// Quantizes a row with ggml's reference algorithm.
pub fn quantize(src: &[f32], dst: &mut [u8]) {
    quantize_with::<BlockQ8_0>(src, dst, BlockQ8_0::quantize);
}

/// Quantizes activations the way ggml's x86 SIMD path does (see
/// [`BlockQ8_0::quantize_simd_rounding`]).
pub fn quantize_activations(src: &[f32], dst: &mut [u8]) {
    quantize_with::<BlockQ8_0>(src, dst, BlockQ8_0::quantize_simd_rounding);
}

/// `ggml_vec_dot_q8_0_q8_0_generic`: integer dot per block, scaled by `dx*dy`.
/// Dot with a Q8_0 activation row in ggml's x86 SIMD order (see
/// [`crate::common::lanes_add_block`]); what [`crate::vec_dot`] computes.
pub fn vec_dot_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ8_0, BlockQ8_0>(w, a);
    let mut acc = [0.0f32; 8];
    for i in 0..nb {
        let x = BlockQ8_0::read(&w[i * 34..]);
        let y = BlockQ8_0::read(&a[i * 34..]);
        let d = f16_to_f32(x.d) * f16_to_f32(y.d);
        lanes_add_block(&mut acc, d, |j| x.qs[j] as i32 * y.qs[j] as i32);
    }
    hsum_lanes(&acc)
}

/// ggml's generic (reference) `ggml_vec_dot_q8_0_q8_0`, operation for operation.
pub fn vec_dot_q8_0_ref(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ8_0, BlockQ8_0>(w, a);
    let mut sumf = 0.0f32;
    for i in 0..nb {
        let x = BlockQ8_0::read(&w[i * 34..]);
        let y = BlockQ8_0::read(&a[i * 34..]);
        let mut sumi = 0i32;
        for j in 0..QK {
            sumi += x.qs[j] as i32 * y.qs[j] as i32;
        }
        sumf += sumi as f32 * (f16_to_f32(x.d) * f16_to_f32(y.d));
    }
    sumf
}
