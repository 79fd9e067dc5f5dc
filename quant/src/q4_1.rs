//! Q4_1: 32 values as `q * d + m` with 4-bit `q`, f16 scale and minimum (5 bits/weight).

use crate::common::{
    check_dot, dequantize_with, hsum_lanes, lanes_add_block, quantize_with, rd_arr, rd_u16, Block,
};
use crate::f16::{f16_to_f32, f32_to_f16};
use crate::q8_1::BlockQ8_1;
use crate::GgmlType;

/// Values per block.
pub const QK: usize = 32;

/// `block_q4_1`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4_1 {
    pub d: u16,
    pub m: u16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);

impl Block for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    const BLOCK_ELEMS: usize = QK;
    const BYTES: usize = 20;
    fn read(b: &[u8]) -> Self {
        Self {
            d: rd_u16(b, 0),
            m: rd_u16(b, 2),
            qs: rd_arr(b, 4),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..4].copy_from_slice(&self.m.to_le_bytes());
        out[4..20].copy_from_slice(&self.qs);
    }
}

impl BlockQ4_1 {
    /// `quantize_row_q4_1_ref`: min/max affine mapping onto 0..=15.
    pub fn quantize(x: &[f32]) -> Self {
        let mut min = f32::MAX;
        let mut max = -f32::MAX;
        for &v in &x[..QK] {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; QK / 2];
        for (j, q) in qs.iter_mut().enumerate() {
            let xi0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
            let xi1 = (((x[QK / 2 + j] - min) * id + 0.5) as i8).min(15) as u8;
            *q = xi0 | (xi1 << 4);
        }
        Self {
            d: f32_to_f16(d),
            m: f32_to_f16(min),
            qs,
        }
    }

    /// `dequantize_row_q4_1` for one block.
    pub fn dequantize(&self, y: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let m = f16_to_f32(self.m);
        for j in 0..QK / 2 {
            y[j] = (self.qs[j] & 0x0f) as f32 * d + m;
            y[j + QK / 2] = (self.qs[j] >> 4) as f32 * d + m;
        }
    }
}

/// Dequantizes a row (`src.len() == dst.len() / 32 * 20`).
pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    dequantize_with::<BlockQ4_1>(src, dst, |b, y| b.dequantize(y));
}

/// Quantizes a row with ggml's reference algorithm.
pub fn quantize(src: &[f32], dst: &mut [u8]) {
    quantize_with::<BlockQ4_1>(src, dst, BlockQ4_1::quantize);
}

/// `ggml_vec_dot_q4_1_q8_1_generic`: the minimum contributes `m * s` through Q8_1's sum.
/// Dot with a Q8_1 activation row in ggml's x86 SIMD order (see
/// [`crate::common::lanes_add_block`]; the `m * s` terms go to a separate running sum,
/// fused-multiply-added, and are added after the lanes are folded); what
/// [`crate::vec_dot`] computes.
pub fn vec_dot_q8_1(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ4_1, BlockQ8_1>(w, a);
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for i in 0..nb {
        let x = BlockQ4_1::read(&w[i * BlockQ4_1::BYTES..]);
        let y = BlockQ8_1::read(&a[i * BlockQ8_1::BYTES..]);
        summs = f16_to_f32(x.m).mul_add(f16_to_f32(y.s), summs);
        let xv = |j: usize| {
            let q = if j < QK / 2 {
                x.qs[j] & 0x0f
            } else {
                x.qs[j - QK / 2] >> 4
            };
            q as i32
        };
        let d = f16_to_f32(x.d) * f16_to_f32(y.d);
        lanes_add_block(&mut acc, d, |j| xv(j) * y.qs[j] as i32);
    }
    hsum_lanes(&acc) + summs
}

/// ggml's generic (reference) `ggml_vec_dot_q4_1_q8_1`, operation for operation.
pub fn vec_dot_q8_1_ref(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ4_1, BlockQ8_1>(w, a);
    let mut sumf = 0.0f32;
    for i in 0..nb {
        let x = BlockQ4_1::read(&w[i * BlockQ4_1::BYTES..]);
        let y = BlockQ8_1::read(&a[i * BlockQ8_1::BYTES..]);
        let (mut sumi0, mut sumi1) = (0i32, 0i32);
        for j in 0..QK / 2 {
            sumi0 += (x.qs[j] & 0x0f) as i32 * y.qs[j] as i32;
            sumi1 += (x.qs[j] >> 4) as i32 * y.qs[j + QK / 2] as i32;
        }
        let sumi = sumi0 + sumi1;
        sumf +=
            (f16_to_f32(x.d) * f16_to_f32(y.d)) * sumi as f32 + f16_to_f32(x.m) * f16_to_f32(y.s);
    }
    sumf
}
