//! Q8_0: 32 values as `i8 * d`, one f16 scale per block (8.5 bits/weight).
//!
//! Used both as a weight format and as the activation format dotted with Q4_0/Q5_0/Q8_0.

use super::common::{quantize_with, rd_i8_arr, rd_u16, wr_i8_arr, Block};
use super::legacy::{dequantize_block, dot_q8_0, dot_q8_0_fast, dot_q8_0_ref, quants_q8, Quants32};
use crate::f16::f32_to_f16;
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

    /// `quantize_row_q8_0_ref` for one block: `d = amax/127`, `q = roundf(x/d)`.
    fn quantize(x: &[f32]) -> Self {
        let (d, qs) = quants_q8(x, false);
        Self {
            d: f32_to_f16(d),
            qs,
        }
    }

    /// `dequantize_row_q8_0` for one block.
    fn dequantize(&self, y: &mut [f32]) {
        dequantize_block(self, y);
    }
}

impl Quants32 for BlockQ8_0 {
    #[inline(always)]
    fn q(&self, j: usize) -> i32 {
        self.qs[j] as i32
    }
    fn d_bits(&self) -> u16 {
        self.d
    }
}

impl BlockQ8_0 {
    /// The activation quantizer of ggml's x86 SIMD path: `id = 127/amax` and
    /// round-half-to-even. It differs from the reference in rare last-unit roundings; we use
    /// it for activations so that our dot products see the same inputs as llama.cpp's.
    pub fn quantize_simd_rounding(x: &[f32]) -> Self {
        let (d, qs) = quants_q8(x, true);
        Self {
            d: f32_to_f16(d),
            qs,
        }
    }
}

/// Quantizes activations the way ggml's x86 SIMD path does (see
/// [`BlockQ8_0::quantize_simd_rounding`]).
pub fn quantize_activations(src: &[f32], dst: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if crate::isa::avx2() {
        // SAFETY: the active ISA includes AVX2; the caller sized `dst` for `src`.
        return unsafe { crate::arch::x86::q8::quantize_q8(src, dst, false) };
    }
    quantize_activations_scalar(src, dst);
}

/// Scalar twin of [`quantize_activations`].
pub fn quantize_activations_scalar(src: &[f32], dst: &mut [u8]) {
    quantize_with::<BlockQ8_0>(src, dst, BlockQ8_0::quantize_simd_rounding);
}

/// `ggml_vec_dot_q8_0_q8_0_generic`: integer dot per block, scaled by `dx*dy`.
/// Dot with a Q8_0 activation row in ggml's x86 SIMD order (see
/// [`crate::order::lanes_add_block`]); what [`crate::vec_dot`] computes.
pub fn vec_dot_q8_0(w: &[u8], a: &[u8]) -> f32 {
    dot_q8_0::<BlockQ8_0>(w, a)
}

/// ggml's generic (reference) `ggml_vec_dot_q8_0_q8_0`, operation for operation.
pub fn vec_dot_q8_0_ref(w: &[u8], a: &[u8]) -> f32 {
    dot_q8_0_ref::<BlockQ8_0>(w, a)
}

/// Dot with a Q8_0 activation row in the fast order ([`crate::DotOrder::Fast`]).
pub fn vec_dot_q8_0_fast(w: &[u8], a: &[u8]) -> f32 {
    dot_q8_0_fast::<BlockQ8_0>(w, a)
}
