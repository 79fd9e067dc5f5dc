//! Q4_0: 32 values as `(q - 8) * d` with 4-bit `q`, one f16 scale (4.5 bits/weight).
//! Element `j` sits in the low nibble of byte `j`, element `j + 16` in its high nibble.

use super::common::{rd_arr, rd_u16, Block};
use super::legacy::{
    dequantize_block, dot_q8_0, dot_q8_0_fast, dot_q8_0_ref, nibble, pack_q4, signed_extreme,
    Quants32,
};
use crate::f16::f32_to_f16;
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

    /// `quantize_row_q4_0_ref`: the signed value of largest magnitude maps to -8.
    fn quantize(x: &[f32]) -> Self {
        let d = signed_extreme(x) / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        // `(int8_t)(x + 8.5f)` truncates toward zero, then `MIN(15, ..)`.
        let qs = pack_q4(|j| ((x[j] * id + 8.5) as i8).min(15) as u8);
        Self {
            d: f32_to_f16(d),
            qs,
        }
    }

    /// `dequantize_row_q4_0` for one block.
    fn dequantize(&self, y: &mut [f32]) {
        dequantize_block(self, y);
    }
}

impl Quants32 for BlockQ4_0 {
    const REF_SCALES_LEFT_TO_RIGHT: bool = true;
    #[inline(always)]
    fn q(&self, j: usize) -> i32 {
        nibble(&self.qs, j) as i32 - 8
    }
    fn d_bits(&self) -> u16 {
        self.d
    }
}

/// `ggml_vec_dot_q4_0_q8_0_generic`.
/// Dot with a Q8_0 activation row in ggml's x86 SIMD order (see
/// [`crate::order::lanes_add_block`]); what [`crate::vec_dot`] computes.
pub fn vec_dot_q8_0(w: &[u8], a: &[u8]) -> f32 {
    dot_q8_0::<BlockQ4_0>(w, a)
}

/// ggml's generic (reference) `ggml_vec_dot_q4_0_q8_0`, operation for operation.
pub fn vec_dot_q8_0_ref(w: &[u8], a: &[u8]) -> f32 {
    dot_q8_0_ref::<BlockQ4_0>(w, a)
}

/// Dot with a Q8_0 activation row in the fast order ([`crate::DotOrder::Fast`]), which
/// is also the order of llama.cpp's repacked Q4_0 kernels on x86 (`gemv`/
/// `gemm_q4_0_8x8_q8_0`, IQ4_NL's templates with a table of signed nibbles;
/// [`crate::DotOrder::Gemm4`]): one exact integer sum per block,
/// `acc = fma(sumi, d_x * d_y, acc)`.
pub fn vec_dot_q8_0_fast(w: &[u8], a: &[u8]) -> f32 {
    dot_q8_0_fast::<BlockQ4_0>(w, a)
}
