//! Q5_0: 32 values as `(q - 16) * d` with 5-bit `q` (4 low bits in nibbles, the fifth bit
//! of element `j` in bit `j` of the little-endian u32 `qh`), one f16 scale.

use crate::common::{
    check_dot, dequantize_with, hsum_lanes, lanes_add_block, quantize_with, rd_arr, rd_u16, Block,
};
use crate::f16::{f16_to_f32, f32_to_f16};
use crate::q8_0::BlockQ8_0;
use crate::GgmlType;

/// Values per block.
pub const QK: usize = 32;

/// `block_q5_0`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5_0 {
    pub d: u16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);

impl Block for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    const BLOCK_ELEMS: usize = QK;
    const BYTES: usize = 22;
    fn read(b: &[u8]) -> Self {
        Self {
            d: rd_u16(b, 0),
            qh: rd_arr(b, 2),
            qs: rd_arr(b, 6),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..6].copy_from_slice(&self.qh);
        out[6..22].copy_from_slice(&self.qs);
    }
}

impl BlockQ5_0 {
    /// `quantize_row_q5_0_ref`: the signed value of largest magnitude maps to -16.
    pub fn quantize(x: &[f32]) -> Self {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in &x[..QK] {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; QK / 2];
        let mut qh = 0u32;
        for j in 0..QK / 2 {
            let xi0 = ((x[j] * id + 16.5) as i8).min(31) as u8;
            let xi1 = ((x[QK / 2 + j] * id + 16.5) as i8).min(31) as u8;
            qs[j] = (xi0 & 0x0f) | ((xi1 & 0x0f) << 4);
            qh |= ((xi0 as u32 & 0x10) >> 4) << j;
            qh |= ((xi1 as u32 & 0x10) >> 4) << (j + QK / 2);
        }
        Self {
            d: f32_to_f16(d),
            qh: qh.to_le_bytes(),
            qs,
        }
    }

    /// `dequantize_row_q5_0` for one block.
    pub fn dequantize(&self, y: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let qh = u32::from_le_bytes(self.qh);
        for j in 0..QK / 2 {
            let xh0 = ((qh >> j) << 4) as u8 & 0x10;
            let xh1 = (qh >> (j + 12)) as u8 & 0x10;
            let x0 = ((self.qs[j] & 0x0f) | xh0) as i32 - 16;
            let x1 = ((self.qs[j] >> 4) | xh1) as i32 - 16;
            y[j] = x0 as f32 * d;
            y[j + QK / 2] = x1 as f32 * d;
        }
    }
}

/// Dequantizes a row (`src.len() == dst.len() / 32 * 22`).
pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    dequantize_with::<BlockQ5_0>(src, dst, |b, y| b.dequantize(y));
}

/// Quantizes a row with ggml's reference algorithm.
pub fn quantize(src: &[f32], dst: &mut [u8]) {
    quantize_with::<BlockQ5_0>(src, dst, BlockQ5_0::quantize);
}

/// `ggml_vec_dot_q5_0_q8_0_generic`.
/// Dot with a Q8_0 activation row in ggml's x86 SIMD order (see
/// [`crate::common::lanes_add_block`]); what [`crate::vec_dot`] computes.
pub fn vec_dot_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ5_0, BlockQ8_0>(w, a);
    let mut acc = [0.0f32; 8];
    for i in 0..nb {
        let x = BlockQ5_0::read(&w[i * BlockQ5_0::BYTES..]);
        let y = BlockQ8_0::read(&a[i * BlockQ8_0::BYTES..]);
        let qh = u32::from_le_bytes(x.qh);
        let xv = |j: usize| {
            let lo = if j < QK / 2 {
                x.qs[j] & 0x0f
            } else {
                x.qs[j - QK / 2] >> 4
            };
            (lo as u32 | ((qh >> j) & 1) << 4) as i32 - 16
        };
        let d = f16_to_f32(x.d) * f16_to_f32(y.d);
        lanes_add_block(&mut acc, d, |j| xv(j) * y.qs[j] as i32);
    }
    hsum_lanes(&acc)
}

/// ggml's generic (reference) `ggml_vec_dot_q5_0_q8_0`, operation for operation.
pub fn vec_dot_q8_0_ref(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ5_0, BlockQ8_0>(w, a);
    let mut sumf = 0.0f32;
    for i in 0..nb {
        let x = BlockQ5_0::read(&w[i * BlockQ5_0::BYTES..]);
        let y = BlockQ8_0::read(&a[i * BlockQ8_0::BYTES..]);
        let qh = u32::from_le_bytes(x.qh);
        let (mut sumi0, mut sumi1) = (0i32, 0i32);
        for j in 0..QK / 2 {
            let xh0 = (((qh >> j) & 1) << 4) as u8;
            let xh1 = (((qh >> (j + 16)) & 1) << 4) as u8;
            let x0 = ((x.qs[j] & 0x0f) | xh0) as i32 - 16;
            let x1 = ((x.qs[j] >> 4) | xh1) as i32 - 16;
            sumi0 += x0 * y.qs[j] as i32;
            sumi1 += x1 * y.qs[j + QK / 2] as i32;
        }
        let sumi = sumi0 + sumi1;
        sumf += (f16_to_f32(x.d) * f16_to_f32(y.d)) * sumi as f32;
    }
    sumf
}
