//! Q5_1: 32 values as `q * d + m` with 5-bit `q` (layout of Q5_0 plus an f16 minimum).

use crate::common::{
    check_dot, dequantize_with, hsum_lanes, lanes_add_block, quantize_with, rd_arr, rd_u16, Block,
};
use crate::f16::{f16_to_f32, f32_to_f16};
use crate::q8_1::BlockQ8_1;
use crate::GgmlType;

/// Values per block.
pub const QK: usize = 32;

/// `block_q5_1`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5_1 {
    pub d: u16,
    pub m: u16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);

impl Block for BlockQ5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    const BLOCK_ELEMS: usize = QK;
    const BYTES: usize = 24;
    fn read(b: &[u8]) -> Self {
        Self {
            d: rd_u16(b, 0),
            m: rd_u16(b, 2),
            qh: rd_arr(b, 4),
            qs: rd_arr(b, 8),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..4].copy_from_slice(&self.m.to_le_bytes());
        out[4..8].copy_from_slice(&self.qh);
        out[8..24].copy_from_slice(&self.qs);
    }
}

impl BlockQ5_1 {
    /// `quantize_row_q5_1_ref`: min/max affine mapping onto 0..=31.
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
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; QK / 2];
        let mut qh = 0u32;
        for j in 0..QK / 2 {
            // ggml has no clamp here: `(uint8_t)(x + 0.5f)`.
            let xi0 = ((x[j] - min) * id + 0.5) as u8;
            let xi1 = ((x[QK / 2 + j] - min) * id + 0.5) as u8;
            qs[j] = (xi0 & 0x0f) | ((xi1 & 0x0f) << 4);
            qh |= ((xi0 as u32 & 0x10) >> 4) << j;
            qh |= ((xi1 as u32 & 0x10) >> 4) << (j + QK / 2);
        }
        Self {
            d: f32_to_f16(d),
            m: f32_to_f16(min),
            qh: qh.to_le_bytes(),
            qs,
        }
    }

    /// `dequantize_row_q5_1` for one block.
    pub fn dequantize(&self, y: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let m = f16_to_f32(self.m);
        let qh = u32::from_le_bytes(self.qh);
        for j in 0..QK / 2 {
            let xh0 = ((qh >> j) << 4) as u8 & 0x10;
            let xh1 = (qh >> (j + 12)) as u8 & 0x10;
            let x0 = (self.qs[j] & 0x0f) | xh0;
            let x1 = (self.qs[j] >> 4) | xh1;
            y[j] = x0 as f32 * d + m;
            y[j + QK / 2] = x1 as f32 * d + m;
        }
    }
}

/// Dequantizes a row (`src.len() == dst.len() / 32 * 24`).
pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    dequantize_with::<BlockQ5_1>(src, dst, |b, y| b.dequantize(y));
}

/// Quantizes a row with ggml's reference algorithm.
pub fn quantize(src: &[f32], dst: &mut [u8]) {
    quantize_with::<BlockQ5_1>(src, dst, BlockQ5_1::quantize);
}

/// `ggml_vec_dot_q5_1_q8_1_generic`.
/// Dot with a Q8_1 activation row in ggml's x86 SIMD order (as
/// [`crate::q4_1::vec_dot_q8_1`]); what [`crate::vec_dot`] computes.
pub fn vec_dot_q8_1(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ5_1, BlockQ8_1>(w, a);
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for i in 0..nb {
        let x = BlockQ5_1::read(&w[i * BlockQ5_1::BYTES..]);
        let y = BlockQ8_1::read(&a[i * BlockQ8_1::BYTES..]);
        summs = f16_to_f32(x.m).mul_add(f16_to_f32(y.s), summs);
        let qh = u32::from_le_bytes(x.qh);
        let xv = |j: usize| {
            let lo = if j < QK / 2 {
                x.qs[j] & 0x0f
            } else {
                x.qs[j - QK / 2] >> 4
            };
            (lo as u32 | ((qh >> j) & 1) << 4) as i32
        };
        let d = f16_to_f32(x.d) * f16_to_f32(y.d);
        lanes_add_block(&mut acc, d, |j| xv(j) * y.qs[j] as i32);
    }
    hsum_lanes(&acc) + summs
}

/// ggml's generic (reference) `ggml_vec_dot_q5_1_q8_1`, operation for operation.
pub fn vec_dot_q8_1_ref(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ5_1, BlockQ8_1>(w, a);
    let mut sumf = 0.0f32;
    for i in 0..nb {
        let x = BlockQ5_1::read(&w[i * BlockQ5_1::BYTES..]);
        let y = BlockQ8_1::read(&a[i * BlockQ8_1::BYTES..]);
        let qh = u32::from_le_bytes(x.qh);
        let (mut sumi0, mut sumi1) = (0i32, 0i32);
        for j in 0..QK / 2 {
            let xh0 = ((qh >> j) << 4) as u8 & 0x10;
            let xh1 = (qh >> (j + 12)) as u8 & 0x10;
            let x0 = ((x.qs[j] & 0x0f) | xh0) as i32;
            let x1 = ((x.qs[j] >> 4) | xh1) as i32;
            sumi0 += x0 * y.qs[j] as i32;
            sumi1 += x1 * y.qs[j + QK / 2] as i32;
        }
        let sumi = sumi0 + sumi1;
        sumf +=
            (f16_to_f32(x.d) * f16_to_f32(y.d)) * sumi as f32 + f16_to_f32(x.m) * f16_to_f32(y.s);
    }
    sumf
}
