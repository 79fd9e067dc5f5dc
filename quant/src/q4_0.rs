//! Q4_0: 32 values as `(q - 8) * d` with 4-bit `q`, one f16 scale (4.5 bits/weight).
//! Element `j` sits in the low nibble of byte `j`, element `j + 16` in its high nibble.

use crate::common::{
    check_dot, dequantize_with, hsum_lanes, lanes_add_block, quantize_with, rd_arr, rd_u16, Block,
};
use crate::f16::{f16_to_f32, f32_to_f16};
use crate::q8_0::BlockQ8_0;
use crate::GgmlType;

/// Values per block.
pub const QK: usize = 32;

/// `block_q4_0`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4_0 {
    pub d: u16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);

impl Block for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    const BLOCK_ELEMS: usize = QK;
    const BYTES: usize = 18;
    fn read(b: &[u8]) -> Self {
        Self {
            d: rd_u16(b, 0),
            qs: rd_arr(b, 2),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..18].copy_from_slice(&self.qs);
    }
}

impl BlockQ4_0 {
    /// `quantize_row_q4_0_ref`: the signed value of largest magnitude maps to -8.
    pub fn quantize(x: &[f32]) -> Self {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in &x[..QK] {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; QK / 2];
        for (j, q) in qs.iter_mut().enumerate() {
            // `(int8_t)(x + 8.5f)` truncates toward zero, then `MIN(15, ..)`.
            let xi0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
            let xi1 = ((x[QK / 2 + j] * id + 8.5) as i8).min(15) as u8;
            *q = xi0 | (xi1 << 4);
        }
        Self {
            d: f32_to_f16(d),
            qs,
        }
    }

    /// `dequantize_row_q4_0` for one block.
    pub fn dequantize(&self, y: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for j in 0..QK / 2 {
            let x0 = (self.qs[j] & 0x0f) as i32 - 8;
            let x1 = (self.qs[j] >> 4) as i32 - 8;
            y[j] = x0 as f32 * d;
            y[j + QK / 2] = x1 as f32 * d;
        }
    }
}

/// Dequantizes a row (`src.len() == dst.len() / 32 * 18`).
pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    dequantize_with::<BlockQ4_0>(src, dst, |b, y| b.dequantize(y));
}

/// Quantizes a row with ggml's reference algorithm.
pub fn quantize(src: &[f32], dst: &mut [u8]) {
    quantize_with::<BlockQ4_0>(src, dst, BlockQ4_0::quantize);
}

/// `ggml_vec_dot_q4_0_q8_0_generic`.
/// Dot with a Q8_0 activation row in ggml's x86 SIMD order (see
/// [`crate::common::lanes_add_block`]); what [`crate::vec_dot`] computes.
pub fn vec_dot_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ4_0, BlockQ8_0>(w, a);
    let mut acc = [0.0f32; 8];
    for i in 0..nb {
        let x = BlockQ4_0::read(&w[i * BlockQ4_0::BYTES..]);
        let y = BlockQ8_0::read(&a[i * BlockQ8_0::BYTES..]);
        let xv = |j: usize| {
            let q = if j < QK / 2 {
                x.qs[j] & 0x0f
            } else {
                x.qs[j - QK / 2] >> 4
            };
            q as i32 - 8
        };
        let d = f16_to_f32(x.d) * f16_to_f32(y.d);
        lanes_add_block(&mut acc, d, |j| xv(j) * y.qs[j] as i32);
    }
    hsum_lanes(&acc)
}

/// ggml's generic (reference) `ggml_vec_dot_q4_0_q8_0`, operation for operation.
pub fn vec_dot_q8_0_ref(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ4_0, BlockQ8_0>(w, a);
    let mut sumf = 0.0f32;
    for i in 0..nb {
        let x = BlockQ4_0::read(&w[i * BlockQ4_0::BYTES..]);
        let y = BlockQ8_0::read(&a[i * BlockQ8_0::BYTES..]);
        let (mut sumi0, mut sumi1) = (0i32, 0i32);
        for j in 0..QK / 2 {
            let v0 = (x.qs[j] & 0x0f) as i32 - 8;
            let v1 = (x.qs[j] >> 4) as i32 - 8;
            sumi0 += v0 * y.qs[j] as i32;
            sumi1 += v1 * y.qs[j + QK / 2] as i32;
        }
        let sumi = sumi0 + sumi1;
        sumf += sumi as f32 * f16_to_f32(x.d) * f16_to_f32(y.d);
    }
    sumf
}
