//! Q4_1: 32 values as `q * d + m` with 4-bit `q`, f16 scale and minimum (5 bits/weight).

use super::common::{rd_arr, rd_u16, Block};
use super::legacy::{
    dequantize_block, dot_q8_1, dot_q8_1_fast, dot_q8_1_ref, min_max, nibble, pack_q4, Quants32,
};
use crate::f16::f32_to_f16;
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

    /// `quantize_row_q4_1_ref`: min/max affine mapping onto 0..=15.
    fn quantize(x: &[f32]) -> Self {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let qs = pack_q4(|j| (((x[j] - min) * id + 0.5) as i8).min(15) as u8);
        Self {
            d: f32_to_f16(d),
            m: f32_to_f16(min),
            qs,
        }
    }

    /// `dequantize_row_q4_1` for one block.
    fn dequantize(&self, y: &mut [f32]) {
        dequantize_block(self, y);
    }
}

impl Quants32 for BlockQ4_1 {
    #[inline(always)]
    fn q(&self, j: usize) -> i32 {
        nibble(&self.qs, j) as i32
    }
    fn d_bits(&self) -> u16 {
        self.d
    }
    fn m_bits(&self) -> Option<u16> {
        Some(self.m)
    }
}

/// `ggml_vec_dot_q4_1_q8_1_generic`: the minimum contributes `m * s` through Q8_1's sum.
/// Dot with a Q8_1 activation row in ggml's x86 SIMD order (see
/// [`crate::order::lanes_add_block`]; the `m * s` terms go to a separate running sum,
/// fused-multiply-added, and are added after the lanes are folded); what
/// [`crate::vec_dot`] computes.
pub fn vec_dot_q8_1(w: &[u8], a: &[u8]) -> f32 {
    dot_q8_1::<BlockQ4_1>(w, a)
}

/// ggml's generic (reference) `ggml_vec_dot_q4_1_q8_1`, operation for operation.
pub fn vec_dot_q8_1_ref(w: &[u8], a: &[u8]) -> f32 {
    dot_q8_1_ref::<BlockQ4_1>(w, a)
}

/// Dot with a Q8_1 activation row in the fast order ([`crate::DotOrder::Fast`]).
pub fn vec_dot_q8_1_fast(w: &[u8], a: &[u8]) -> f32 {
    dot_q8_1_fast::<BlockQ4_1>(w, a)
}
