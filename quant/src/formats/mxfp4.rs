//! MXFP4 (OCP microscaling FP4, what gpt-oss stores its expert matrices in): 32 values as
//! `KVALUES[q] * 2^(e - 128)` with 4-bit indices `q` into a table of doubled E2M1 values
//! and one E8M0 exponent byte `e` per block (4.25 bits/weight). Element `j` sits in the
//! low nibble of byte `j`, element `j + 16` in its high nibble, as in Q4_0.
//!
//! The table holds twice the E2M1 values (so they are integers) and the scale is half the
//! E8M0 value, `2^(e - 127) / 2`: the product is the format's value, and the dot products
//! with Q8_0 activations are exact integer sums times one float per block.
//!
//! Dot products come in the orders of llama.cpp's x86 backend for MXFP4, written once
//! for it and IQ4_NL in [`super::lut`]: `vec_dot` for matrices that are not repacked
//! ([`vec_dot_q8_0`], [`crate::DotOrder::Single`]), the repacked `mxfp4_8x8_q8_0` gemv and
//! gemm ([`vec_dot_q8_0_repacked`], [`crate::DotOrder::Gemm4`] and the fast order; their
//! activations, `quantize_row_q8_0` and `ggml_quantize_mat_q8_0_4x8`, round identically
//! on x86, so one twin serves every token), and ggml's generic C dot
//! ([`vec_dot_q8_0_ref`]), kept to prove the integer parts against ggml.

use super::common::{rd_arr, Block};
use super::legacy::{nibble, pack_q4, QK};
use super::lut::{self, Lut32};
use crate::GgmlType;

/// ggml's `kvalues_mxfp4`: the sixteen E2M1 values, doubled.
pub const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// What the SIMD kernels add to a value to make it an unsigned byte (`0..=24`), so that
/// `maddubs`/`vpdpbusd` can take it, the activations' sum times this subtracted again.
pub const OFFSET: i32 = 12;

/// `block_mxfp4`: the exponent byte, then 16 bytes of 4-bit indices.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockMxfp4 {
    /// E8M0 exponent: the block's scale is `2^(e - 128)` ([`e8m0_to_f32_half`]).
    pub e: u8,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockMxfp4>() == 17);

/// ggml's `GGML_E8M0_TO_FP32_HALF(e)`: `2^(e - 128)`, exactly (a subnormal for `e < 2`;
/// `e = 255` is `2^127`, not a NaN).
#[inline(always)]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    f32::from_bits(if e < 2 {
        0x0020_0000 << e
    } else {
        (e as u32 - 1) << 23
    })
}

/// C's conversion of a float to `uint8_t` as x86 code does it: truncation to a 32-bit
/// integer (`cvttss2si`, which gives `i32::MIN` for NaN and out-of-range values), then its
/// low byte. Only reached for the exponent of blocks below `2^-125` or infinite.
#[inline]
fn c_float_to_u8(v: f32) -> u8 {
    let i = if v.is_nan() || !(-2_147_483_648.0..2_147_483_648.0).contains(&v) {
        i32::MIN
    } else {
        v as i32
    };
    i as u8
}

/// `best_index_mxfp4`: the first table entry nearest to `x` at scale `d`.
#[inline]
fn best_index(x: f32, d: f32) -> u8 {
    let mut best = 0;
    // `kvalues * d` is exact (a small integer times a power of two), so ggml's possible
    // contraction of `kvalues * d - x` into an FMA rounds the same way.
    let mut best_err = (KVALUES[0] as f32 * d - x).abs();
    for (i, &k) in KVALUES.iter().enumerate().skip(1) {
        let err = (k as f32 * d - x).abs();
        if err < best_err {
            best = i;
            best_err = err;
        }
    }
    best as u8
}

impl BlockMxfp4 {
    /// The block's value table entry of element `j` (a doubled E2M1 value, `-12..=12`).
    #[inline(always)]
    pub fn value(&self, j: usize) -> i32 {
        KVALUES[nibble(&self.qs, j) as usize] as i32
    }
}

impl Block for BlockMxfp4 {
    const TYPE: GgmlType = GgmlType::MXFP4;
    const BLOCK_ELEMS: usize = QK;
    const BYTES: usize = 17;
    fn read(b: &[u8]) -> Self {
        Self {
            e: b[0],
            qs: rd_arr(b, 1),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[0] = self.e;
        out[1..17].copy_from_slice(&self.qs);
    }

    /// `quantize_row_mxfp4_ref`: the exponent from the largest magnitude (`floor(log2)`,
    /// with the C library's `log2f`, less two: 12 is the largest table value, about
    /// `2^3.6`), then each element's nearest table entry (the first on ties).
    fn quantize(x: &[f32]) -> Self {
        let mut amax = 0.0f32;
        for &v in &x[..QK] {
            if amax < v.abs() {
                amax = v.abs();
            }
        }
        let e = if amax > 0.0 {
            c_float_to_u8(amax.log2().floor() - 2.0 + 127.0)
        } else {
            0
        };
        let d = e8m0_to_f32_half(e);
        Self {
            e,
            qs: pack_q4(|j| best_index(x[j], d)),
        }
    }

    /// `dequantize_row_mxfp4` for one block: `KVALUES[q] * 2^(e - 128)`.
    fn dequantize(&self, y: &mut [f32]) {
        let d = e8m0_to_f32_half(self.e);
        for (j, y) in y[..QK].iter_mut().enumerate() {
            *y = self.value(j) as f32 * d;
        }
    }
}

impl Lut32 for BlockMxfp4 {
    #[inline(always)]
    fn value(&self, j: usize) -> i32 {
        BlockMxfp4::value(self, j)
    }
    #[inline(always)]
    fn scale(&self) -> f32 {
        e8m0_to_f32_half(self.e)
    }
}

/// Dot with a Q8_0 activation row in the order of `ggml_vec_dot_mxfp4_q8_0` on AVX2
/// ([`crate::DotOrder::Single`]; what [`crate::vec_dot`] computes).
pub fn vec_dot_q8_0(w: &[u8], a: &[u8]) -> f32 {
    lut::vec_dot_paired::<BlockMxfp4>(w, a)
}

/// Dot with a Q8_0 activation row in the order of llama.cpp's repacked MXFP4 kernels
/// (`gemv`/`gemm_mxfp4_8x8_q8_0`; [`crate::DotOrder::Gemm4`] and the fast order): one
/// exact integer sum per block, `acc = (e_half * d_y).mul_add(sumi, acc)`.
pub fn vec_dot_q8_0_repacked(w: &[u8], a: &[u8]) -> f32 {
    lut::vec_dot_repacked::<BlockMxfp4>(w, a)
}

/// ggml's generic C `ggml_vec_dot_mxfp4_q8_0_generic`: `sumf += d * sumi` per block,
/// the product rounded before the sum (as ggml's GCC build computes it).
pub fn vec_dot_q8_0_ref(w: &[u8], a: &[u8]) -> f32 {
    lut::vec_dot_generic::<BlockMxfp4>(w, a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::q8_0::BlockQ8_0;

    #[test]
    fn e8m0_half_is_a_power_of_two() {
        for e in 0..=255u8 {
            assert_eq!(e8m0_to_f32_half(e) as f64, 2f64.powi(e as i32 - 128), "{e}");
        }
    }

    #[test]
    fn quantizer_picks_the_exponent_and_nearest_values() {
        // amax 6 = 1.5 * 2^2: e = 2 - 2 + 127, scale 2^-1, so 6 is table value 12.
        let mut x = [0.0f32; 32];
        x[0] = 6.0;
        x[1] = -0.5;
        x[17] = 0.74; // 1.48 doubled-units: nearest 1 (0.5) vs 2 (1.0): 0.5 is nearer
        let b = BlockMxfp4::quantize(&x);
        assert_eq!(b.e, 127);
        assert_eq!(b.value(0), 12);
        assert_eq!(b.value(1), -1);
        assert_eq!(b.value(17), 1);
        // Zero maps to index 0, not to the table's negative zero.
        assert_eq!(b.qs[2] & 0x0f, 0);
        let mut y = [0.0f32; 32];
        b.dequantize(&mut y);
        assert_eq!((y[0], y[1], y[17]), (6.0, -0.5, 0.5));
        assert_eq!(BlockMxfp4::quantize(&[0.0; 32]).e, 0);
        // Below 2^-125 the exponent wraps as x86's conversion does; infinity gives 0.
        let mut t = [0.0f32; 32];
        t[0] = 2f32.powi(-127);
        assert_eq!(BlockMxfp4::quantize(&t).e, 254);
        t[0] = f32::INFINITY;
        assert_eq!(BlockMxfp4::quantize(&t).e, 0);
    }

    #[test]
    fn orders_agree_on_exact_inputs() {
        // Small integers: every order is exact, so all agree.
        let mut w = vec![0u8; 3 * 17];
        let mut a = vec![0u8; 3 * 34];
        for i in 0..3 {
            w[i * 17] = 128; // scale 1
            for j in 0..16 {
                w[i * 17 + 1 + j] = j as u8 * 7 + i as u8;
            }
            a[i * 34..i * 34 + 2].copy_from_slice(&crate::f16::f32_to_f16(1.0).to_le_bytes());
            for j in 0..32 {
                a[i * 34 + 2 + j] = (j as i8 - 16) as u8;
            }
        }
        let exact: i32 = (0..3)
            .map(|i| {
                lut::block_sum(
                    &BlockMxfp4::read(&w[i * 17..]),
                    &BlockQ8_0::read(&a[i * 34..]),
                )
            })
            .sum();
        assert_eq!(vec_dot_q8_0(&w, &a), exact as f32);
        assert_eq!(vec_dot_q8_0_repacked(&w, &a), exact as f32);
        assert_eq!(vec_dot_q8_0_ref(&w, &a), exact as f32);
    }
}
