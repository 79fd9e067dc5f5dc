//! Q5_0: 32 values as `(q - 16) * d` with 5-bit `q` (4 low bits in nibbles, the fifth bit
//! of element `j` in bit `j` of the little-endian u32 `qh`), one f16 scale.

use super::common::{rd_arr, rd_u16, Block};
use super::legacy::{
    dequantize_block, dot_q8_0, dot_q8_0_fast, dot_q8_0_ref, nibble, pack_q5, signed_extreme,
    Quants32,
};
use crate::f16::f32_to_f16;
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

    /// `quantize_row_q5_0_ref`: the signed value of largest magnitude maps to -16.
    fn quantize(x: &[f32]) -> Self {
        let d = signed_extreme(x) / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let (qs, qh) = pack_q5(|j| ((x[j] * id + 16.5) as i8).min(31) as u8);
        Self {
            d: f32_to_f16(d),
            qh,
            qs,
        }
    }

    /// `dequantize_row_q5_0` for one block.
    fn dequantize(&self, y: &mut [f32]) {
        dequantize_block(self, y);
    }
}

impl Quants32 for BlockQ5_0 {
    #[inline(always)]
    fn q(&self, j: usize) -> i32 {
        (nibble(&self.qs, j) as u32 | ((u32::from_le_bytes(self.qh) >> j) & 1) << 4) as i32 - 16
    }
    fn d_bits(&self) -> u16 {
        self.d
    }
}

/// `ggml_vec_dot_q5_0_q8_0_generic`.
/// Dot with a Q8_0 activation row in ggml's x86 SIMD order (see
/// [`crate::order::lanes_add_block`]); what [`crate::vec_dot`] computes.
pub fn vec_dot_q8_0(w: &[u8], a: &[u8]) -> f32 {
    dot_q8_0::<BlockQ5_0>(w, a)
}

/// ggml's generic (reference) `ggml_vec_dot_q5_0_q8_0`, operation for operation.
pub fn vec_dot_q8_0_ref(w: &[u8], a: &[u8]) -> f32 {
    dot_q8_0_ref::<BlockQ5_0>(w, a)
}

/// Dot with a Q8_0 activation row in the fast order ([`crate::DotOrder::Fast`]).
pub fn vec_dot_q8_0_fast(w: &[u8], a: &[u8]) -> f32 {
    dot_q8_0_fast::<BlockQ5_0>(w, a)
}
