//! Q8_1: like Q8_0 plus `s = d * sum(q)`, the activation format for Q4_1/Q5_1 whose
//! per-block minimum needs the activation sum.

use super::common::{quantize_with, rd_i8_arr, rd_u16, wr_i8_arr, Block};
use super::legacy::{dequantize_block, quants_q8, Quants32};
use crate::f16::f32_to_f16;
use crate::GgmlType;

/// Values per block.
pub const QK: usize = 32;

/// `block_q8_1`: f16 scale, f16 `d * sum(qs)`, 32 signed quants.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8_1 {
    pub d: u16,
    pub s: u16,
    pub qs: [i8; QK],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);

impl Block for BlockQ8_1 {
    const TYPE: GgmlType = GgmlType::Q8_1;
    const BLOCK_ELEMS: usize = QK;
    const BYTES: usize = 36;
    fn read(b: &[u8]) -> Self {
        Self {
            d: rd_u16(b, 0),
            s: rd_u16(b, 2),
            qs: rd_i8_arr(b, 4),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..4].copy_from_slice(&self.s.to_le_bytes());
        wr_i8_arr(out, 4, &self.qs);
    }

    /// `quantize_row_q8_1_ref` for one block.
    fn quantize(x: &[f32]) -> Self {
        BlockQ8_1::with_sum(quants_q8(x, false))
    }

    /// Dequantizes one block (`q * d`; ggml has no row function for Q8_1, this is the
    /// obvious one and ignores `s`).
    fn dequantize(&self, y: &mut [f32]) {
        dequantize_block(self, y);
    }
}

impl Quants32 for BlockQ8_1 {
    #[inline(always)]
    fn q(&self, j: usize) -> i32 {
        self.qs[j] as i32
    }
    fn d_bits(&self) -> u16 {
        self.d
    }
}

impl BlockQ8_1 {
    /// ggml's x86 SIMD activation quantizer: `id = 127/amax`, round-half-to-even, and
    /// `s = d * sum(q)` (see `BlockQ8_0::quantize_simd_rounding`).
    pub fn quantize_simd_rounding(x: &[f32]) -> Self {
        BlockQ8_1::with_sum(quants_q8(x, true))
    }

    /// The block for scale `d` and quants `qs`, with `s = d * sum(qs)`.
    fn with_sum((d, qs): (f32, [i8; QK])) -> Self {
        let sum: i32 = qs.iter().map(|&q| q as i32).sum();
        Self {
            d: f32_to_f16(d),
            s: f32_to_f16(sum as f32 * d),
            qs,
        }
    }
}

/// Quantizes activations the way ggml's x86 SIMD path does.
pub fn quantize_activations(src: &[f32], dst: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if crate::isa::avx2() {
        // SAFETY: the active ISA includes AVX2; the caller sized `dst` for `src`.
        return unsafe { crate::arch::x86::q8::quantize_q8(src, dst, true) };
    }
    quantize_activations_scalar(src, dst);
}

/// Scalar twin of [`quantize_activations`].
pub fn quantize_activations_scalar(src: &[f32], dst: &mut [u8]) {
    quantize_with::<BlockQ8_1>(src, dst, BlockQ8_1::quantize_simd_rounding);
}
