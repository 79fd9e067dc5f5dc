//! The 32-element formats whose nibbles index a table of signed integers, one scale per
//! block: MXFP4 (doubled E2M1 values, an E8M0 exponent) and IQ4_NL (a non-linear table,
//! an f16 scale). ggml multiplies both by Q8_0 activations with the same code, only the
//! table and the scale differing, so their dot products in each of llama.cpp's orders
//! are written once here:
//!
//! - [`vec_dot_paired`] ([`crate::DotOrder::Single`]): ggml's AVX2 `vec_dot` for
//!   matrices that are not repacked (a row count that is not a multiple of eight). Eight
//!   exact i32 lanes per block (elements `4l..4l+4`) fused into eight float lanes, even
//!   blocks into one accumulator and odd ones into another; the two are added lane by
//!   lane and folded by `hsum_float_8`; an unpaired last block is added after the fold,
//!   its whole integer sum times its scale product rounded first (`sumf += d * sumi`,
//!   which ggml's GCC build leaves unfused).
//! - [`vec_dot_repacked`] ([`crate::DotOrder::Gemm4`]): the repacked 8x8 `gemv` and
//!   `gemm` (`gemv_q4_b32_8x8_q8_0_lut_avx` and its gemm), which sum alike: one exact
//!   integer sum per block, `acc = fma(sumi, d_x * d_y, acc)`.
//! - [`vec_dot_generic`]: ggml's generic C dot, `sumf += d * sumi` per block, unfused,
//!   kept to prove the integer parts against ggml.

use super::common::{check_dot, Block};
use super::legacy::QK;
use super::q8_0::BlockQ8_0;
use crate::f16::f16_to_f32;
use crate::order::{hsum_lanes, lanes_add_block};

/// A block of 32 table indices and one scale.
pub trait Lut32: Block {
    /// Element `j`'s table value.
    fn value(&self, j: usize) -> i32;
    /// The block's scale as f32 (exactly what ggml's conversion gives).
    fn scale(&self) -> f32;
}

/// Block `i` of the two rows and its scale product `d_y * d_x`.
#[inline(always)]
fn blocks<B: Lut32>(w: &[u8], a: &[u8], i: usize) -> (B, BlockQ8_0, f32) {
    let x = B::read(&w[i * B::BYTES..]);
    let y = BlockQ8_0::read(&a[i * BlockQ8_0::BYTES..]);
    let d = f16_to_f32(y.d) * x.scale();
    (x, y, d)
}

/// The exact integer sum of one block's products.
#[inline(always)]
pub(crate) fn block_sum<B: Lut32>(x: &B, y: &BlockQ8_0) -> i32 {
    (0..QK).map(|j| x.value(j) * y.qs[j] as i32).sum()
}

/// ggml's AVX2 `vec_dot` order (see the module docs).
pub fn vec_dot_paired<B: Lut32>(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<B, BlockQ8_0>(w, a);
    let mut acc = [[0.0f32; 8]; 2];
    let paired = nb - nb % 2;
    for i in 0..paired {
        let (x, y, d) = blocks::<B>(w, a, i);
        lanes_add_block(&mut acc[i % 2], d, |j| x.value(j) * y.qs[j] as i32);
    }
    let both: [f32; 8] = std::array::from_fn(|l| acc[0][l] + acc[1][l]);
    let mut sumf = hsum_lanes(&both);
    if paired < nb {
        let (x, y, d) = blocks::<B>(w, a, paired);
        sumf += d * block_sum(&x, &y) as f32;
    }
    sumf
}

/// The repacked gemv/gemm order: one exact integer sum per block, fused into the
/// accumulator.
pub fn vec_dot_repacked<B: Lut32>(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<B, BlockQ8_0>(w, a);
    let mut acc = 0.0f32;
    for i in 0..nb {
        let (x, y, d) = blocks::<B>(w, a, i);
        acc = d.mul_add(block_sum(&x, &y) as f32, acc);
    }
    acc
}

/// ggml's generic C order: `sumf += d * sumi` per block, the product rounded first.
pub fn vec_dot_generic<B: Lut32>(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<B, BlockQ8_0>(w, a);
    let mut sumf = 0.0f32;
    for i in 0..nb {
        let (x, y, d) = blocks::<B>(w, a, i);
        sumf += d * block_sum(&x, &y) as f32;
    }
    sumf
}
