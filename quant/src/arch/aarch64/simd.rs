//! NEON helpers shared by the aarch64 kernels: the two ways of forming exact 4-byte dot
//! product lanes ([`Level`]), f16 fields and f16 vectors widened to f32, eight float lanes
//! kept in two registers, and the twin's horizontal sum.

use core::arch::aarch64::*;
use core::arch::asm;

use crate::f16::f16_to_f32;

/// How a kernel forms its exact i32 lanes: lane `l` of [`Level::dot`] adds the products
/// of bytes `4l..4l+4`. Kernels are generic over the level and run their body through
/// [`Level::run`], which compiles it with the level's target features, so the `dot`s
/// inline into single instructions.
pub(super) trait Level {
    /// `acc[l] + Σ_{k<4} x[4l+k] · y[4l+k]` for each of the four i32 lanes (exact: the
    /// sum of four i8 products fits an i32 many times over).
    ///
    /// # Safety
    /// The level is available on this CPU.
    unsafe fn dot(acc: int32x4_t, x: int8x16_t, y: int8x16_t) -> int32x4_t;

    /// Runs `f` inside a function compiled with this level's target features.
    ///
    /// # Safety
    /// The level is available on this CPU, and `f` is safe to call.
    unsafe fn run<R>(f: impl FnOnce() -> R) -> R;
}

/// Plain NEON, every aarch64 CPU: widening multiplies (exact in i16) and pairwise adds.
pub(super) struct Plain;

/// FEAT_DotProd's `sdot`, one instruction per 16 bytes.
pub(super) struct Dotprod;

impl Level for Plain {
    #[inline(always)]
    unsafe fn dot(acc: int32x4_t, x: int8x16_t, y: int8x16_t) -> int32x4_t {
        let lo = vmull_s8(vget_low_s8(x), vget_low_s8(y));
        let hi = vmull_high_s8(x, y);
        // Pairs widen to i32 before the second pairwise add: two products of -128 * -128
        // would not fit an i16.
        vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)))
    }

    #[inline(always)]
    unsafe fn run<R>(f: impl FnOnce() -> R) -> R {
        f()
    }
}

impl Level for Dotprod {
    #[inline]
    #[target_feature(enable = "dotprod")]
    unsafe fn dot(mut acc: int32x4_t, x: int8x16_t, y: int8x16_t) -> int32x4_t {
        // `vdotq_s32` is not stable yet; the instruction is the same.
        asm!(
            "sdot {acc:v}.4s, {x:v}.16b, {y:v}.16b",
            acc = inout(vreg) acc,
            x = in(vreg) x,
            y = in(vreg) y,
            options(pure, nomem, nostack, preserves_flags)
        );
        acc
    }

    #[inline]
    #[target_feature(enable = "dotprod")]
    unsafe fn run<R>(f: impl FnOnce() -> R) -> R {
        f()
    }
}

/// The f16 at `p` (two little-endian bytes, any alignment), widened (exact).
#[inline(always)]
pub(super) unsafe fn f16_at(p: *const u8) -> f32 {
    f16_to_f32(u16::from_le(p.cast::<u16>().read_unaligned()))
}

/// The f32 at `p` (four little-endian bytes, any alignment).
#[inline(always)]
pub(super) unsafe fn f32_at(p: *const u8) -> f32 {
    f32::from_bits(u32::from_le(p.cast::<u32>().read_unaligned()))
}

/// 16 bytes at `p` as signed bytes.
#[inline(always)]
pub(super) unsafe fn ld_s8(p: *const u8) -> int8x16_t {
    vld1q_s8(p.cast())
}

/// 16 bytes at `p` as unsigned bytes.
#[inline(always)]
pub(super) unsafe fn ld_u8(p: *const u8) -> uint8x16_t {
    vld1q_u8(p)
}

/// Eight f16 values at `p` widened to f32 (exact), lanes 0..4 and 4..8. `fcvtl` is base
/// Armv8 SIMD; only its intrinsic needs the unstable f16 vector types.
#[inline(always)]
pub(super) unsafe fn f16x8_at(p: *const u16) -> (float32x4_t, float32x4_t) {
    let h = vld1q_u16(p);
    let lo: float32x4_t;
    let hi: float32x4_t;
    asm!(
        "fcvtl {lo:v}.4s, {h:v}.4h",
        "fcvtl2 {hi:v}.4s, {h:v}.8h",
        h = in(vreg) h,
        lo = out(vreg) lo,
        hi = out(vreg) hi,
        options(pure, nomem, nostack, preserves_flags)
    );
    (lo, hi)
}

/// Eight float lanes in two registers (lanes 0..4, 4..8): the twins' `[f32; 8]`
/// accumulators.
#[derive(Clone, Copy)]
pub(super) struct F8 {
    pub lo: float32x4_t,
    pub hi: float32x4_t,
}

impl F8 {
    #[inline(always)]
    pub unsafe fn zero() -> F8 {
        F8 {
            lo: vdupq_n_f32(0.0),
            hi: vdupq_n_f32(0.0),
        }
    }

    /// `self[l] = fma(d, f32(lanes[l]), self[l])`: the twin's `d.mul_add(s as f32, acc)`.
    #[inline(always)]
    pub unsafe fn fma(self, d: f32, lo: int32x4_t, hi: int32x4_t) -> F8 {
        let d = vdupq_n_f32(d);
        F8 {
            lo: vfmaq_f32(self.lo, vcvtq_f32_s32(lo), d),
            hi: vfmaq_f32(self.hi, vcvtq_f32_s32(hi), d),
        }
    }

    /// `crate::order::hsum_lanes` (ggml's `hsum_float_8`): `v[i] = x[i + 4] + x[i]`, then
    /// `(v0 + v2) + (v1 + v3)`.
    #[inline(always)]
    pub unsafe fn hsum(self) -> f32 {
        let v = vaddq_f32(self.hi, self.lo);
        let (v0, v1) = (vgetq_lane_f32::<0>(v), vgetq_lane_f32::<1>(v));
        let (v2, v3) = (vgetq_lane_f32::<2>(v), vgetq_lane_f32::<3>(v));
        (v0 + v2) + (v1 + v3)
    }
}

/// Byte `j` of the result pair (`j < 16` in the first vector, `16..32` in the second) is
/// 0xff where bit `j` of `bits` is set, else 0: the Q5 formats' fifth bits as masks.
#[inline(always)]
pub(super) unsafe fn bit_masks(bits: u32) -> (uint8x16_t, uint8x16_t) {
    const SEL: [u8; 32] = [
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, //
        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    ];
    let v = vreinterpretq_u8_u32(vdupq_n_u32(bits));
    let bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
    (
        vtstq_u8(vqtbl1q_u8(v, vld1q_u8(SEL.as_ptr())), bit),
        vtstq_u8(vqtbl1q_u8(v, vld1q_u8(SEL.as_ptr().add(16))), bit),
    )
}
