//! Q5_1: 32 values as `q * d + m` with 5-bit `q` (layout of Q5_0 plus an f16 minimum).

use super::common::{rd_arr, rd_u16, Block};
use super::legacy::{
    dequantize_block, dot_q8_1, dot_q8_1_fast, dot_q8_1_ref, min_max, nibble, pack_q5, Quants32,
};
use crate::f16::f32_to_f16;
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

    /// `quantize_row_q5_1_ref`: min/max affine mapping onto 0..=31.
    fn quantize(x: &[f32]) -> Self {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        // ggml has no clamp here: `(uint8_t)(x + 0.5f)`.
        let (qs, qh) = pack_q5(|j| ((x[j] - min) * id + 0.5) as u8);
        Self {
            d: f32_to_f16(d),
            m: f32_to_f16(min),
            qh,
            qs,
        }
    }

    /// `dequantize_row_q5_1` for one block.
    fn dequantize(&self, y: &mut [f32]) {
        dequantize_block(self, y);
    }
}

impl Quants32 for BlockQ5_1 {
    #[inline(always)]
    fn q(&self, j: usize) -> i32 {
        (nibble(&self.qs, j) as u32 | ((u32::from_le_bytes(self.qh) >> j) & 1) << 4) as i32
    }
    fn d_bits(&self) -> u16 {
        self.d
    }
    fn m_bits(&self) -> Option<u16> {
        Some(self.m)
    }
}

/// `ggml_vec_dot_q5_1_q8_1_generic`.
/// Dot with a Q8_1 activation row in ggml's x86 SIMD order (as
/// [`super::q4_1::vec_dot_q8_1`]); what [`crate::vec_dot`] computes.
pub fn vec_dot_q8_1(w: &[u8], a: &[u8]) -> f32 {
    dot_q8_1::<BlockQ5_1>(w, a)
}

/// ggml's generic (reference) `ggml_vec_dot_q5_1_q8_1`, operation for operation.
pub fn vec_dot_q8_1_ref(w: &[u8], a: &[u8]) -> f32 {
    dot_q8_1_ref::<BlockQ5_1>(w, a)
}

/// Dot with a Q8_1 activation row in the fast order ([`crate::DotOrder::Fast`]).
pub fn vec_dot_q8_1_fast(w: &[u8], a: &[u8]) -> f32 {
    dot_q8_1_fast::<BlockQ5_1>(w, a)
}
