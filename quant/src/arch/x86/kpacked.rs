//! The K-quants (Q4_K, Q6_K) on rows repacked by `crate::pack8`: eight rows per 256-bit
//! register lane group, or sixteen (two groups) per 512-bit register with AVX-512, as the
//! 32-element formats' fast kernels do.
//!
//! Every order these kernels follow forms one exact integer sum per row and super-block
//! (or per 64-element chunk) before any float step, so rows can sit in the lanes of a
//! register and still give the scalar twin's bits:
//!
//! * Q4_K, [`DotOrder::Single`] (`q4_k::vec_dot_q8k`, llama.cpp's `gemv_q4_K_8x8`):
//!   `acc = fma(f32(s1), d·y.d, acc)`, `acc_m = fma(f32(s2), dmin·y.d, acc_m)` per
//!   super-block; also the K-quant fast order (`DotOrder::Fast` for Q4_K sums like this).
//! * Q4_K, [`DotOrder::Gemm4`] (`q4_k::vec_dot_q8k_gemm4`): the same per 64-element chunk.
//! * Q6_K, [`DotOrder::Tiled`] (`q6_k::vec_dot_q8k_tiled`, llama.cpp's tiled GEMM):
//!   `acc = fma(f32(s1)·d, y.d, acc)` per super-block; also Q6_K's fast order.
//!
//! The integer sums, per sub-block and row: `scale · Σ q·y`. With VNNI, `vpdpbusd` forms
//! `Σ q·y` in i32 and one `vpmulld` applies the scale; without it, `maddubs` products
//! are summed in i16 while they provably fit (eight registers of 4-bit weights: at most
//! 16·15·127 = 30480; two of 6-bit ones: 4·63·127 = 32004) and `pmaddwd` with the scale
//! in both i16 halves widens and scales in one step. The Q4_K mins (`Σ m·bsum32`) and the
//! Q6_K offset (`32·Σ sc·bsums`) are `pmaddwd`s of i16 pairs. All of it is exact, so every
//! width and instruction choice gives the same sums, then the same float steps per lane.

use core::arch::x86_64::*;

use super::legacy::bcast4;
use super::simd::{arr, ld128, ld256, prefetch_lines};
use crate::contract::{check_tile_rows, ActSide, TileIntoFn, FAST_TILE_TOKENS};
use crate::formats::common::Block;
use crate::formats::iq4_nl::KVALUES;
use crate::formats::iq4_xs::BlockIq4Xs;
use crate::formats::q3_k::BlockQ3K;
use crate::formats::q4_k::BlockQ4K;
use crate::formats::q5_k::BlockQ5K;
use crate::formats::q6_k::BlockQ6K;
use crate::formats::q8_k::BlockQ8K;
use crate::isa::Isa;

/// Registers (of `ROWS` rows x 4 elements) per super-block.
const REGS: usize = 64;
/// Offsets in a Q8_K block.
const Y_QS: usize = 4;
const Y_BSUMS: usize = 260;

/// A register holding one i32 (or f32) lane per weight row: 8 rows (ymm) or 16 (zmm, two
/// groups). The kernels are written once against this, and instantiated inside functions
/// that enable the features each implementation uses.
trait Rows: Copy {
    // Weight rows per register: 8 (ymm) or 16 (zmm, two groups).
    type I: Copy;
    type F: Copy;
    /// One register from a 256-bit part per group (`f(g)` for group `g`).
    unsafe fn gather(f: impl Fn(usize) -> __m256i) -> Self::I;
    unsafe fn gather_f(f: impl Fn(usize) -> __m256) -> Self::F;
    unsafe fn zero() -> Self::I;
    unsafe fn zero_f() -> Self::F;
    unsafe fn set1(x: i32) -> Self::I;
    unsafe fn set1_ps(x: f32) -> Self::F;
    unsafe fn add(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn sub(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn shl5(a: Self::I) -> Self::I;
    /// i16 pairs times i16 pairs, adjacent products summed into i32 (`pmaddwd`).
    unsafe fn madd(a: Self::I, b: Self::I) -> Self::I;
    /// A sub-block scale (i32 per lane) in the form [`Rows::sub_sums`] takes.
    unsafe fn scale(sc: Self::I) -> Self::I;
    /// A sub-block scale (i32 per lane, fitting i16) in both i16 halves of its lane.
    unsafe fn scale16(sc: Self::I) -> Self::I;
    /// `acc + sc16 · dot4(t, y)` per lane: one register's scaled product (unsigned weights
    /// below 64), `sc16` from [`Rows::scale16`].
    unsafe fn scaled_dot4(acc: Self::I, t: Self::I, y: *const u8, sc16: Self::I) -> Self::I;
    /// For each of `Q` tokens, `acc[q] += scale · Σ_{k<NREG} dot4(t[k], y_q + 4k)`, with
    /// `dot4` the per-lane product of four unsigned weight bytes (at most `2^BITS - 1`)
    /// with four signed activation bytes.
    unsafe fn sub_sums<const Q: usize, const NREG: usize, const BITS: u32>(
        t: &[Self::I],
        ys: [*const u8; Q],
        scale: Self::I,
        acc: &mut [Self::I; Q],
    );
    /// Whether `sub_sums` runs on `vpdpbusd`, which takes unsigned weight bytes up to 255
    /// against any activation byte (without VNNI, `maddubs` pairs overflow past 64).
    const VNNI: bool;
    /// `w + 128` per byte: signed weight bytes as the unsigned ones `vpdpbusd` takes.
    unsafe fn offset8(w: Self::I) -> Self::I;
    /// `a << 7` per i32 lane.
    unsafe fn shl7(a: Self::I) -> Self::I;
    /// `a << 2` per i32 lane.
    unsafe fn shl2(a: Self::I) -> Self::I;
    /// `w - k` per byte (wrapping).
    unsafe fn sub8(w: Self::I, k: i8) -> Self::I;
    /// `|w|` per byte: the unsigned operand of ggml's sign trick for signed weights.
    unsafe fn abs8(w: Self::I) -> Self::I;
    /// [`Rows::scaled_dot4`] for signed weight bytes `w` (`aw` = [`Rows::abs8`]`(w)`,
    /// at most 127): the products `|w| · (y with w's sign)`, ggml's `mul_add_epi8`.
    unsafe fn scaled_dot4_s(
        acc: Self::I,
        aw: Self::I,
        w: Self::I,
        y: *const u8,
        sc16: Self::I,
    ) -> Self::I;
    /// [`Rows::sub_sums`] for signed weight bytes (`aw[k]` = [`Rows::abs8`]`(w[k])`), in
    /// products of the sign trick; `scale` from [`Rows::scale`].
    unsafe fn sub_sums_s<const Q: usize, const NREG: usize>(
        aw: &[Self::I],
        w: &[Self::I],
        ys: [*const u8; Q],
        scale: Self::I,
        acc: &mut [Self::I; Q],
    );
    unsafe fn cvt(a: Self::I) -> Self::F;
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F;
    /// `a · b + c`, one rounding.
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    unsafe fn sub_f(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn add_f(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn store(p: *mut f32, v: Self::F);
}

/// Eight rows, AVX2 without VNNI (`maddubs` + `pmaddwd`).
#[derive(Clone, Copy)]
struct Y2;
/// Eight rows, AVX2 with VNNI on ymm registers (`vpdpbusd`).
#[derive(Clone, Copy)]
struct Yv;
/// Sixteen rows, AVX-512 with VNNI.
#[derive(Clone, Copy)]
struct Z;

macro_rules! ymm_common {
    () => {
        type I = __m256i;
        type F = __m256;
        #[inline(always)]
        unsafe fn gather(f: impl Fn(usize) -> __m256i) -> __m256i {
            f(0)
        }
        #[inline(always)]
        unsafe fn gather_f(f: impl Fn(usize) -> __m256) -> __m256 {
            f(0)
        }
        #[inline(always)]
        unsafe fn zero() -> __m256i {
            _mm256_setzero_si256()
        }
        #[inline(always)]
        unsafe fn zero_f() -> __m256 {
            _mm256_setzero_ps()
        }
        #[inline(always)]
        unsafe fn set1(x: i32) -> __m256i {
            _mm256_set1_epi32(x)
        }
        #[inline(always)]
        unsafe fn set1_ps(x: f32) -> __m256 {
            _mm256_set1_ps(x)
        }
        #[inline(always)]
        unsafe fn add(a: __m256i, b: __m256i) -> __m256i {
            _mm256_add_epi32(a, b)
        }
        #[inline(always)]
        unsafe fn sub(a: __m256i, b: __m256i) -> __m256i {
            _mm256_sub_epi32(a, b)
        }
        #[inline(always)]
        unsafe fn offset8(w: __m256i) -> __m256i {
            _mm256_xor_si256(w, _mm256_set1_epi8(-128))
        }
        #[inline(always)]
        unsafe fn shl7(a: __m256i) -> __m256i {
            _mm256_slli_epi32::<7>(a)
        }
        #[inline(always)]
        unsafe fn shl2(a: __m256i) -> __m256i {
            _mm256_slli_epi32::<2>(a)
        }
        #[inline(always)]
        unsafe fn sub8(w: __m256i, k: i8) -> __m256i {
            _mm256_sub_epi8(w, _mm256_set1_epi8(k))
        }
        #[inline(always)]
        unsafe fn shl5(a: __m256i) -> __m256i {
            _mm256_slli_epi32::<5>(a)
        }
        #[inline(always)]
        unsafe fn madd(a: __m256i, b: __m256i) -> __m256i {
            _mm256_madd_epi16(a, b)
        }
        #[inline(always)]
        unsafe fn cvt(a: __m256i) -> __m256 {
            _mm256_cvtepi32_ps(a)
        }
        #[inline(always)]
        unsafe fn mul(a: __m256, b: __m256) -> __m256 {
            _mm256_mul_ps(a, b)
        }
        #[inline(always)]
        unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
            _mm256_fmadd_ps(a, b, c)
        }
        #[inline(always)]
        unsafe fn sub_f(a: __m256, b: __m256) -> __m256 {
            _mm256_sub_ps(a, b)
        }
        #[inline(always)]
        unsafe fn add_f(a: __m256, b: __m256) -> __m256 {
            _mm256_add_ps(a, b)
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m256) {
            _mm256_storeu_ps(p, v)
        }
    };
}

impl Rows for Y2 {
    ymm_common!();
    const VNNI: bool = false;
    #[inline(always)]
    unsafe fn scale(sc: __m256i) -> __m256i {
        // The i16 scale in both halves of its lane, for `pmaddwd`.
        pair16(sc, sc)
    }
    #[inline(always)]
    unsafe fn scale16(sc: __m256i) -> __m256i {
        pair16(sc, sc)
    }
    #[inline(always)]
    unsafe fn scaled_dot4(acc: __m256i, t: __m256i, y: *const u8, sc16: __m256i) -> __m256i {
        let p = _mm256_maddubs_epi16(t, bcast4(y));
        _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc16))
    }
    #[inline(always)]
    unsafe fn sub_sums<const Q: usize, const NREG: usize, const BITS: u32>(
        t: &[__m256i],
        ys: [*const u8; Q],
        scale: __m256i,
        acc: &mut [__m256i; Q],
    ) {
        // Registers whose maddubs pairs may be summed in i16 without overflow.
        let run = if BITS <= 4 { 8 } else { 2 };
        let mut k0 = 0;
        while k0 < NREG {
            let mut s = [_mm256_setzero_si256(); Q];
            for k in k0..k0 + run.min(NREG - k0) {
                let w = t[k];
                for q in 0..Q {
                    let p = _mm256_maddubs_epi16(w, bcast4(ys[q].add(4 * k)));
                    s[q] = _mm256_add_epi16(s[q], p);
                }
            }
            for q in 0..Q {
                acc[q] = _mm256_add_epi32(acc[q], _mm256_madd_epi16(s[q], scale));
            }
            k0 += run;
        }
    }
    #[inline(always)]
    unsafe fn abs8(w: __m256i) -> __m256i {
        _mm256_sign_epi8(w, w)
    }
    #[inline(always)]
    unsafe fn scaled_dot4_s(
        acc: __m256i,
        aw: __m256i,
        w: __m256i,
        y: *const u8,
        sc16: __m256i,
    ) -> __m256i {
        let p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(bcast4(y), w));
        _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc16))
    }
    #[inline(always)]
    unsafe fn sub_sums_s<const Q: usize, const NREG: usize>(
        aw: &[__m256i],
        w: &[__m256i],
        ys: [*const u8; Q],
        scale: __m256i,
        acc: &mut [__m256i; Q],
    ) {
        // A pair of products reaches 2·127·127: each register's i16 pairs widen alone.
        for k in 0..NREG {
            for q in 0..Q {
                let p =
                    _mm256_maddubs_epi16(aw[k], _mm256_sign_epi8(bcast4(ys[q].add(4 * k)), w[k]));
                acc[q] = _mm256_add_epi32(acc[q], _mm256_madd_epi16(p, scale));
            }
        }
    }
}

impl Rows for Yv {
    ymm_common!();
    const VNNI: bool = true;
    #[inline(always)]
    unsafe fn scale(sc: __m256i) -> __m256i {
        sc
    }
    #[inline(always)]
    unsafe fn scale16(sc: __m256i) -> __m256i {
        pair16(sc, sc)
    }
    #[inline(always)]
    unsafe fn scaled_dot4(acc: __m256i, t: __m256i, y: *const u8, sc16: __m256i) -> __m256i {
        _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(t, bcast4(y)), sc16)
    }
    #[inline(always)]
    unsafe fn sub_sums<const Q: usize, const NREG: usize, const BITS: u32>(
        t: &[__m256i],
        ys: [*const u8; Q],
        scale: __m256i,
        acc: &mut [__m256i; Q],
    ) {
        let mut s0 = [_mm256_setzero_si256(); Q];
        let mut s1 = [_mm256_setzero_si256(); Q];
        for k in (0..NREG).step_by(2) {
            let (w0, w1) = (t[k], t[k + 1]);
            for q in 0..Q {
                s0[q] = _mm256_dpbusd_epi32(s0[q], w0, bcast4(ys[q].add(4 * k)));
                s1[q] = _mm256_dpbusd_epi32(s1[q], w1, bcast4(ys[q].add(4 * k + 4)));
            }
        }
        for q in 0..Q {
            let p = _mm256_add_epi32(s0[q], s1[q]);
            acc[q] = _mm256_add_epi32(acc[q], _mm256_mullo_epi32(p, scale));
        }
    }
    #[inline(always)]
    unsafe fn abs8(w: __m256i) -> __m256i {
        _mm256_sign_epi8(w, w)
    }
    #[inline(always)]
    unsafe fn scaled_dot4_s(
        acc: __m256i,
        aw: __m256i,
        w: __m256i,
        y: *const u8,
        sc16: __m256i,
    ) -> __m256i {
        let p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(bcast4(y), w));
        _mm256_dpwssd_epi32(acc, p, sc16)
    }
    #[inline(always)]
    unsafe fn sub_sums_s<const Q: usize, const NREG: usize>(
        aw: &[__m256i],
        w: &[__m256i],
        ys: [*const u8; Q],
        scale: __m256i,
        acc: &mut [__m256i; Q],
    ) {
        let mut s0 = [_mm256_setzero_si256(); Q];
        let mut s1 = [_mm256_setzero_si256(); Q];
        for k in (0..NREG).step_by(2) {
            for q in 0..Q {
                let y0 = _mm256_sign_epi8(bcast4(ys[q].add(4 * k)), w[k]);
                let y1 = _mm256_sign_epi8(bcast4(ys[q].add(4 * k + 4)), w[k + 1]);
                s0[q] = _mm256_dpbusd_epi32(s0[q], aw[k], y0);
                s1[q] = _mm256_dpbusd_epi32(s1[q], aw[k + 1], y1);
            }
        }
        for q in 0..Q {
            let p = _mm256_add_epi32(s0[q], s1[q]);
            acc[q] = _mm256_add_epi32(acc[q], _mm256_mullo_epi32(p, scale));
        }
    }
}

impl Rows for Z {
    type I = __m512i;
    type F = __m512;
    const VNNI: bool = true;
    #[inline(always)]
    unsafe fn offset8(w: __m512i) -> __m512i {
        _mm512_xor_si512(w, _mm512_set1_epi8(-128))
    }
    #[inline(always)]
    unsafe fn shl7(a: __m512i) -> __m512i {
        _mm512_slli_epi32::<7>(a)
    }
    #[inline(always)]
    unsafe fn shl2(a: __m512i) -> __m512i {
        _mm512_slli_epi32::<2>(a)
    }
    #[inline(always)]
    unsafe fn sub8(w: __m512i, k: i8) -> __m512i {
        _mm512_sub_epi8(w, _mm512_set1_epi8(k))
    }
    #[inline(always)]
    unsafe fn gather(f: impl Fn(usize) -> __m256i) -> __m512i {
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(f(0)), f(1))
    }
    #[inline(always)]
    unsafe fn gather_f(f: impl Fn(usize) -> __m256) -> __m512 {
        _mm512_insertf32x8::<1>(_mm512_castps256_ps512(f(0)), f(1))
    }
    #[inline(always)]
    unsafe fn zero() -> __m512i {
        _mm512_setzero_si512()
    }
    #[inline(always)]
    unsafe fn zero_f() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn set1(x: i32) -> __m512i {
        _mm512_set1_epi32(x)
    }
    #[inline(always)]
    unsafe fn set1_ps(x: f32) -> __m512 {
        _mm512_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn add(a: __m512i, b: __m512i) -> __m512i {
        _mm512_add_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: __m512i, b: __m512i) -> __m512i {
        _mm512_sub_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn shl5(a: __m512i) -> __m512i {
        _mm512_slli_epi32::<5>(a)
    }
    #[inline(always)]
    unsafe fn madd(a: __m512i, b: __m512i) -> __m512i {
        _mm512_madd_epi16(a, b)
    }
    #[inline(always)]
    unsafe fn scale(sc: __m512i) -> __m512i {
        sc
    }
    #[inline(always)]
    unsafe fn scale16(sc: __m512i) -> __m512i {
        _mm512_or_si512(
            _mm512_and_si512(sc, _mm512_set1_epi32(0xffff)),
            _mm512_slli_epi32::<16>(sc),
        )
    }
    #[inline(always)]
    unsafe fn scaled_dot4(acc: __m512i, t: __m512i, y: *const u8, sc16: __m512i) -> __m512i {
        let yb = _mm512_set1_epi32(y.cast::<i32>().read_unaligned());
        _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(t, yb), sc16)
    }
    #[inline(always)]
    unsafe fn sub_sums<const Q: usize, const NREG: usize, const BITS: u32>(
        t: &[__m512i],
        ys: [*const u8; Q],
        scale: __m512i,
        acc: &mut [__m512i; Q],
    ) {
        let bc = |p: *const u8| _mm512_set1_epi32(p.cast::<i32>().read_unaligned());
        let mut s0 = [_mm512_setzero_si512(); Q];
        let mut s1 = [_mm512_setzero_si512(); Q];
        for k in (0..NREG).step_by(2) {
            let (w0, w1) = (t[k], t[k + 1]);
            for q in 0..Q {
                s0[q] = _mm512_dpbusd_epi32(s0[q], w0, bc(ys[q].add(4 * k)));
                s1[q] = _mm512_dpbusd_epi32(s1[q], w1, bc(ys[q].add(4 * k + 4)));
            }
        }
        for q in 0..Q {
            let p = _mm512_add_epi32(s0[q], s1[q]);
            acc[q] = _mm512_add_epi32(acc[q], _mm512_mullo_epi32(p, scale));
        }
    }
    #[inline(always)]
    unsafe fn cvt(a: __m512i) -> __m512 {
        _mm512_cvtepi32_ps(a)
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        _mm512_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn sub_f(a: __m512, b: __m512) -> __m512 {
        _mm512_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn add_f(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        _mm512_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn abs8(w: __m512i) -> __m512i {
        _mm512_abs_epi8(w)
    }
    #[inline(always)]
    unsafe fn scaled_dot4_s(
        acc: __m512i,
        aw: __m512i,
        w: __m512i,
        y: *const u8,
        sc16: __m512i,
    ) -> __m512i {
        let yb = _mm512_set1_epi32(y.cast::<i32>().read_unaligned());
        _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(aw, sign512(yb, w)), sc16)
    }
    #[inline(always)]
    unsafe fn sub_sums_s<const Q: usize, const NREG: usize>(
        aw: &[__m512i],
        w: &[__m512i],
        ys: [*const u8; Q],
        scale: __m512i,
        acc: &mut [__m512i; Q],
    ) {
        let bc = |p: *const u8| _mm512_set1_epi32(p.cast::<i32>().read_unaligned());
        let mut s0 = [_mm512_setzero_si512(); Q];
        let mut s1 = [_mm512_setzero_si512(); Q];
        for k in (0..NREG).step_by(2) {
            for q in 0..Q {
                let y0 = sign512(bc(ys[q].add(4 * k)), w[k]);
                let y1 = sign512(bc(ys[q].add(4 * k + 4)), w[k + 1]);
                s0[q] = _mm512_dpbusd_epi32(s0[q], aw[k], y0);
                s1[q] = _mm512_dpbusd_epi32(s1[q], aw[k + 1], y1);
            }
        }
        for q in 0..Q {
            let p = _mm512_add_epi32(s0[q], s1[q]);
            acc[q] = _mm512_add_epi32(acc[q], _mm512_mullo_epi32(p, scale));
        }
    }
}

/// One validated packed call: `rows` weight rows (`ROWS` of the instantiation) of `nb`
/// super-blocks, the groups `group` bytes apart at `w`; `n` activation rows `stride` bytes
/// apart at `a`; result (r, c) to `out[c * out_stride + r]`.
#[derive(Clone, Copy)]
struct KCall {
    w: *const u8,
    group: usize,
    /// Groups of eight rows one after the other (one or two tokens only; else 1).
    groups: usize,
    nb: usize,
    a: *const u8,
    stride: usize,
    n: usize,
    out: *mut f32,
    out_stride: usize,
}

/// The low nibbles (`HI = false`) or high nibbles of 32 bytes.
#[inline(always)]
unsafe fn nib<const HI: bool>(v: __m256i) -> __m256i {
    let m = _mm256_set1_epi8(0x0f);
    if HI {
        _mm256_and_si256(_mm256_srli_epi16::<4>(v), m)
    } else {
        _mm256_and_si256(v, m)
    }
}

/// Eight bytes at `p` widened to i32 lanes, unsigned or (`SIGNED`) signed.
#[inline(always)]
unsafe fn bytes8<const SIGNED: bool>(p: *const u8) -> __m256i {
    let v = _mm_loadl_epi64(p.cast());
    if SIGNED {
        _mm256_cvtepi8_epi32(v)
    } else {
        _mm256_cvtepu8_epi32(v)
    }
}

/// Eight f16 at `p` as f32 lanes.
#[inline(always)]
unsafe fn halfs8(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(ld128(p))
}

/// `_mm256_sign_epi8(y, w)` (AVX-512 has no byte sign) but where `w` is 0: `y` negated
/// where `w` is negative. Its one use multiplies by `|w|`, so a zero `w` gives 0 alike.
#[inline(always)]
unsafe fn sign512(y: __m512i, w: __m512i) -> __m512i {
    _mm512_mask_sub_epi8(y, _mm512_movepi8_mask(w), _mm512_setzero_si512(), y)
}

/// ggml's `hsum_float_8` across eight lane accumulators, vertically: `v_i = x_{i+4} +
/// x_i`, then `(v0 + v2) + (v1 + v3)`.
#[inline(always)]
unsafe fn hsum8<V: Rows>(acc: &[V::F; ACC]) -> V::F {
    let v: [V::F; 4] = arr(|i| V::add_f(acc[i + 4], acc[i]));
    V::add_f(V::add_f(v[0], v[2]), V::add_f(v[1], v[3]))
}

/// `Σ_j pairs[j] · (bsums[2j], bsums[2j+1])` per lane, for the Q8_K block at `y`: each
/// i16 pair of `pairs[j]` against two adjacent 16-element sums (one 4-byte broadcast).
#[inline(always)]
unsafe fn bsum_pairs_dot<V: Rows>(pairs: &[V::I; 8], y: *const u8) -> V::I {
    let mut c = V::zero();
    for (j, p) in pairs.iter().enumerate() {
        let bs = y.add(Y_BSUMS + 4 * j).cast::<i32>().read_unaligned();
        c = V::add(c, V::madd(*p, V::set1(bs)));
    }
    c
}

/// Eight rows' six-bit scales minus 32 as i32 lanes, packed as IQ4_XS and Q3_K pack them:
/// the low nibbles at `lo` (nibble `lo_nib`), the top bit pairs at `hi` (bits
/// `2·hi_pair..`).
#[inline(always)]
unsafe fn six_bit_scales(lo: *const u8, lo_nib: usize, hi: *const u8, hi_pair: usize) -> __m256i {
    let l = _mm256_srl_epi32(bytes8::<false>(lo), _mm_cvtsi32_si128(4 * lo_nib as i32));
    let h = _mm256_srl_epi32(bytes8::<false>(hi), _mm_cvtsi32_si128(2 * hi_pair as i32));
    let ls = _mm256_or_si256(
        _mm256_and_si256(l, _mm256_set1_epi32(0x0f)),
        _mm256_slli_epi32::<4>(_mm256_and_si256(h, _mm256_set1_epi32(3))),
    );
    _mm256_sub_epi32(ls, _mm256_set1_epi32(32))
}

/// `lo` in the low i16 of each lane, `hi` in the high one (both i32 lanes whose value fits
/// i16).
#[inline(always)]
unsafe fn pair16(lo: __m256i, hi: __m256i) -> __m256i {
    _mm256_or_si256(
        _mm256_and_si256(lo, _mm256_set1_epi32(0xffff)),
        _mm256_slli_epi32::<16>(hi),
    )
}

/// Float accumulators per token: Q4_K keeps the mins apart (2), Q6_K's `Single` order
/// has ggml's eight lanes (8), Q5_K's those and its mins (9).
const ACC: usize = 9;

/// Registers per unit: a Q4_K or Q5_K sub-block, two Q6_K sub-blocks.
const UNIT: usize = 8;
/// Units per super-block.
const UNITS: usize = REGS / UNIT;

/// The per-row data of a super-block besides its quants.
#[derive(Clone, Copy)]
struct Head<V: Rows> {
    /// Sub-block scales as [`Rows::scale`] wants them (8 for Q4_K, 16 for Q6_K).
    sc: [V::I; 16],
    /// i16 pairs for the per-super-block `pmaddwd`s: Q4_K mins (m_{2k}, m_{2k+1}) of chunk
    /// `k`; Q6_K scales (sc_{2j}, sc_{2j+1}).
    pairs: [V::I; 8],
    d: V::F,
    dmin: V::F,
}

/// What differs between the formats: how a packed super-block is unpacked and how a
/// token's integer sums become floats.
trait KFormat {
    /// The format's block (one row's super-block).
    type Block: Block;
    /// The registers of unit `j` of super-block `i` of the groups at `w` (`group` bytes
    /// apart): register `k` of the unit holds elements `4k..4k+4` of it, unsigned.
    unsafe fn unit<V: Rows>(w: *const u8, group: usize, i: usize, j: usize) -> [V::I; UNIT];
    /// The scales, mins and super-block scales of super-block `i`.
    unsafe fn head<V: Rows, const ALT: bool>(w: *const u8, group: usize, i: usize) -> Head<V>;
    /// `Q` tokens' products with one super-block: `ys[q]` is token `q`'s Q8_K block,
    /// `acc[q]` its accumulators, `t(j)` the registers of unit `j`.
    unsafe fn tokens<V: Rows, const Q: usize, const ALT: bool>(
        h: &Head<V>,
        t: impl Fn(usize) -> [V::I; UNIT],
        ys: [*const u8; Q],
        acc: &mut [[V::F; ACC]; Q],
    );
    /// The result from a token's accumulators: by default `ALT`'s eight lane accumulators
    /// summed as `hsum_float_8`, the other order's one float (Q6_K, Q3_K, IQ4_XS).
    #[inline(always)]
    unsafe fn finish<V: Rows, const ALT: bool>(acc: [V::F; ACC]) -> V::F {
        if ALT {
            hsum8::<V>(&acc)
        } else {
            acc[0]
        }
    }
}

/// The head of a Q4_K or Q5_K super-block of a group (at `off` in each group; the same
/// layout for both): the rows' `d` and `dmin`, the scales as [`Rows::scale`] wants them
/// (`ALT`: [`Rows::scale16`]), and the mins as i16 pairs: those of 64-element chunk `k` in
/// `pairs[k]`, or (`PER_SUB`) sub-block `b`'s min twice in `pairs[b]`.
#[inline(always)]
unsafe fn k45_head<V: Rows, const ALT: bool, const PER_SUB: bool>(
    w: *const u8,
    group: usize,
    off: usize,
) -> Head<V> {
    let at = |g: usize| w.add(g * group + off);
    let sc = |g: usize, b: usize| bytes8::<false>(at(g).add(32 + 8 * b));
    let mins = |g: usize, b: usize| {
        let lo = bytes8::<false>(at(g).add(96 + 8 * (b % 4)));
        let lo = if b >= 4 {
            _mm256_srli_epi32::<4>(lo)
        } else {
            lo
        };
        let lo = _mm256_and_si256(lo, _mm256_set1_epi32(0x0f));
        let hi = _mm256_slli_epi32::<4>(_mm256_srli_epi32::<6>(sc(g, b)));
        _mm256_or_si256(lo, hi)
    };
    let mut h = Head {
        sc: [V::zero(); 16],
        pairs: [V::zero(); 8],
        d: V::gather_f(|g| halfs8(at(g))),
        dmin: V::gather_f(|g| halfs8(at(g).add(16))),
    };
    for b in 0..8 {
        let raw = V::gather(|g| _mm256_and_si256(sc(g, b), _mm256_set1_epi32(0x3f)));
        h.sc[b] = if ALT { V::scale16(raw) } else { V::scale(raw) };
    }
    if PER_SUB {
        for b in 0..8 {
            h.pairs[b] = V::gather(|g| pair16(mins(g, b), mins(g, b)));
        }
    } else {
        for k in 0..4 {
            h.pairs[k] = V::gather(|g| pair16(mins(g, 2 * k), mins(g, 2 * k + 1)));
        }
    }
    h
}

struct Q4K;
struct Q5K;
struct Q6K;
struct Iq4Xs;
struct Q3K;

impl KFormat for Q4K {
    type Block = BlockQ4K;

    #[inline(always)]
    unsafe fn unit<V: Rows>(w: *const u8, group: usize, i: usize, b: usize) -> [V::I; UNIT] {
        let q = |g: usize, v: usize| {
            ld256(w.add(g * group + i * 8 * <Self::Block as Block>::BYTES + 128 + 128 * b + 32 * v))
        };
        arr(|k| {
            if k % 2 == 0 {
                V::gather(|g| nib::<false>(q(g, k / 2)))
            } else {
                V::gather(|g| nib::<true>(q(g, k / 2)))
            }
        })
    }

    #[inline(always)]
    unsafe fn head<V: Rows, const ALT: bool>(w: *const u8, group: usize, i: usize) -> Head<V> {
        k45_head::<V, false, false>(w, group, i * 8 * <Self::Block as Block>::BYTES)
    }

    #[inline(always)]
    unsafe fn tokens<V: Rows, const Q: usize, const ALT: bool>(
        h: &Head<V>,
        t: impl Fn(usize) -> [V::I; UNIT],
        ys: [*const u8; Q],
        acc: &mut [[V::F; ACC]; Q],
    ) {
        let qs = ys.map(|y| y.add(Y_QS));
        // The 32-element block sums of each chunk as one i16 pair (wrapping, as ggml's
        // `hadd_epi16`), broadcast.
        let bsum_pairs = |y: *const u8, k: usize| {
            let b = |j: usize| y.add(Y_BSUMS + 2 * j).cast::<i16>().read_unaligned();
            let lo = b(4 * k).wrapping_add(b(4 * k + 1));
            let hi = b(4 * k + 2).wrapping_add(b(4 * k + 3));
            V::set1((lo as u16 as u32 | (hi as u16 as u32) << 16) as i32)
        };
        let yd = ys.map(|y| V::set1_ps(y.cast::<f32>().read_unaligned()));
        if ALT {
            let d: [V::F; Q] = arr(|q| V::mul(h.d, yd[q]));
            let dm: [V::F; Q] = arr(|q| V::mul(h.dmin, yd[q]));
            for k in 0..4 {
                let mut s1 = [V::zero(); Q];
                for b in [2 * k, 2 * k + 1] {
                    let y: [*const u8; Q] = qs.map(|p| p.add(32 * b));
                    V::sub_sums::<Q, 8, 4>(&t(b), y, h.sc[b], &mut s1);
                }
                for q in 0..Q {
                    let s2 = V::madd(h.pairs[k], bsum_pairs(ys[q], k));
                    acc[q][0] = V::fmadd(V::cvt(s1[q]), d[q], acc[q][0]);
                    acc[q][1] = V::fmadd(V::cvt(s2), dm[q], acc[q][1]);
                }
            }
            return;
        }
        let mut s1 = [V::zero(); Q];
        for b in 0..8 {
            let y: [*const u8; Q] = qs.map(|p| p.add(32 * b));
            V::sub_sums::<Q, 8, 4>(&t(b), y, h.sc[b], &mut s1);
        }
        for q in 0..Q {
            let mut s2 = V::zero();
            for k in 0..4 {
                s2 = V::add(s2, V::madd(h.pairs[k], bsum_pairs(ys[q], k)));
            }
            acc[q][0] = V::fmadd(V::cvt(s1[q]), V::mul(h.d, yd[q]), acc[q][0]);
            acc[q][1] = V::fmadd(V::cvt(s2), V::mul(h.dmin, yd[q]), acc[q][1]);
        }
    }

    #[inline(always)]
    unsafe fn finish<V: Rows, const ALT: bool>(acc: [V::F; ACC]) -> V::F {
        V::sub_f(acc[0], acc[1])
    }
}

/// Q5_K: Q4_K's head, and per sub-block `b` (unit `b`, at `128 + 160b`) its 128 bytes of
/// nibbles as Q4_K's, then 32 bytes of fifth bits (bit `k` of byte `4r + e`: register
/// `k`'s element `e` of row `r`). `ALT` is ggml's AVX2 `vec_dot` order (`Single`), the
/// other the tiled GEMM's (`Tiled`, also Q5_K's fast order).
impl KFormat for Q5K {
    type Block = BlockQ5K;

    #[inline(always)]
    unsafe fn unit<V: Rows>(w: *const u8, group: usize, i: usize, b: usize) -> [V::I; UNIT] {
        let base =
            |g: usize| w.add(g * group + i * 8 * <Self::Block as Block>::BYTES + 128 + 160 * b);
        let bit4 = _mm256_set1_epi8(0x10);
        arr(|k| {
            V::gather(|g| {
                let q = ld256(base(g).add(32 * (k / 2)));
                let nb = if k % 2 == 0 {
                    nib::<false>(q)
                } else {
                    nib::<true>(q)
                };
                // Bit k of each byte to bit 4: a 16-bit shift whose spill into the
                // neighbouring byte stays away from bit 4.
                let f = ld256(base(g).add(128));
                let h = match k {
                    0 => _mm256_slli_epi16::<4>(f),
                    1 => _mm256_slli_epi16::<3>(f),
                    2 => _mm256_slli_epi16::<2>(f),
                    3 => _mm256_slli_epi16::<1>(f),
                    4 => f,
                    5 => _mm256_srli_epi16::<1>(f),
                    6 => _mm256_srli_epi16::<2>(f),
                    _ => _mm256_srli_epi16::<3>(f),
                };
                _mm256_or_si256(nb, _mm256_and_si256(h, bit4))
            })
        })
    }

    #[inline(always)]
    unsafe fn head<V: Rows, const ALT: bool>(w: *const u8, group: usize, i: usize) -> Head<V> {
        k45_head::<V, ALT, true>(w, group, i * 8 * <Self::Block as Block>::BYTES)
    }

    #[inline(always)]
    unsafe fn tokens<V: Rows, const Q: usize, const ALT: bool>(
        h: &Head<V>,
        t: impl Fn(usize) -> [V::I; UNIT],
        ys: [*const u8; Q],
        acc: &mut [[V::F; ACC]; Q],
    ) {
        let qs = ys.map(|y| y.add(Y_QS));
        let bsum = |y: *const u8, j: usize| y.add(Y_BSUMS + 2 * j).cast::<i16>().read_unaligned();
        let yd = ys.map(|y| y.cast::<f32>().read_unaligned());
        if ALT {
            // ggml's lane l of eight: register l of every sub-block (elements 4l..4l+4),
            // each times its sub-block's scale.
            let mut il = [[V::zero(); 8]; Q];
            for b in 0..UNITS {
                let r = t(b);
                for l in 0..8 {
                    for q in 0..Q {
                        il[q][l] =
                            V::scaled_dot4(il[q][l], r[l], qs[q].add(32 * b + 4 * l), h.sc[b]);
                    }
                }
            }
            for q in 0..Q {
                let d = V::mul(V::set1_ps(yd[q]), h.d);
                for l in 0..8 {
                    acc[q][l] = V::fmadd(d, V::cvt(il[q][l]), acc[q][l]);
                }
                // The mins against the 32-element sums, each an i16 pair sum (wrapping).
                let mut m = V::zero();
                for b in 0..8 {
                    let s = bsum(ys[q], 2 * b).wrapping_add(bsum(ys[q], 2 * b + 1));
                    m = V::add(m, V::madd(h.pairs[b], V::set1(s as u16 as i32)));
                }
                let dmin = V::mul(V::set1_ps(-yd[q]), h.dmin);
                acc[q][8] = V::fmadd(dmin, V::cvt(m), acc[q][8]);
            }
            return;
        }
        let mut s1 = [V::zero(); Q];
        for b in 0..UNITS {
            let y: [*const u8; Q] = qs.map(|p| p.add(32 * b));
            V::sub_sums::<Q, 8, 5>(&t(b), y, h.sc[b], &mut s1);
        }
        let neg_dmin = V::mul(h.dmin, V::set1_ps(-1.0));
        for q in 0..Q {
            // The mins against the bsums, widened to i32 before the pair sum.
            let m = bsum_pairs_dot::<V>(&h.pairs, ys[q]);
            let r = V::fmadd(neg_dmin, V::cvt(m), V::mul(V::cvt(s1[q]), h.d));
            acc[q][0] = V::fmadd(r, V::set1_ps(yd[q]), acc[q][0]);
        }
    }

    #[inline(always)]
    unsafe fn finish<V: Rows, const ALT: bool>(acc: [V::F; ACC]) -> V::F {
        if ALT {
            // `hsum_float_8` across the lane accumulators, then the mins.
            V::add_f(hsum8::<V>(&acc), acc[8])
        } else {
            acc[0]
        }
    }
}

impl KFormat for Q6K {
    type Block = BlockQ6K;

    #[inline(always)]
    unsafe fn unit<V: Rows>(w: *const u8, group: usize, i: usize, j: usize) -> [V::I; UNIT] {
        let at = |g: usize| w.add(g * group + i * 8 * <Self::Block as Block>::BYTES);
        let m = _mm256_set1_epi8(0x30);
        // Registers 8j..8j+8: sub-blocks 2j and 2j+1 (four registers each); register
        // 4u + r takes its low nibble, then its bit pair r moved to bits 4..6.
        arr(|k| {
            V::gather(|g| {
                let unit = at(g).add(144 + 192 * j);
                let lo = ld256(unit.add(32 * (k / 2)));
                let hb = ld256(unit.add(128 + 32 * (k / 4)));
                let (nb, h) = match k % 4 {
                    0 => (nib::<false>(lo), _mm256_slli_epi16::<4>(hb)),
                    1 => (nib::<true>(lo), _mm256_slli_epi16::<2>(hb)),
                    2 => (nib::<false>(lo), hb),
                    _ => (nib::<true>(lo), _mm256_srli_epi16::<2>(hb)),
                };
                _mm256_or_si256(nb, _mm256_and_si256(h, m))
            })
        })
    }

    #[inline(always)]
    unsafe fn head<V: Rows, const ALT: bool>(w: *const u8, group: usize, i: usize) -> Head<V> {
        let at = |g: usize| w.add(g * group + i * 8 * <Self::Block as Block>::BYTES);
        let sc = |g: usize, j: usize| bytes8::<true>(at(g).add(16 + 8 * j));
        let mut h = Head {
            sc: [V::zero(); 16],
            pairs: [V::zero(); 8],
            d: V::gather_f(|g| halfs8(at(g))),
            dmin: V::zero_f(),
        };
        for j in 0..16 {
            let raw = V::gather(|g| sc(g, j));
            h.sc[j] = if ALT { V::scale16(raw) } else { V::scale(raw) };
        }
        for j in 0..8 {
            h.pairs[j] = V::gather(|g| pair16(sc(g, 2 * j), sc(g, 2 * j + 1)));
        }
        h
    }

    #[inline(always)]
    unsafe fn tokens<V: Rows, const Q: usize, const ALT: bool>(
        h: &Head<V>,
        t: impl Fn(usize) -> [V::I; UNIT],
        ys: [*const u8; Q],
        acc: &mut [[V::F; ACC]; Q],
    ) {
        let qs = ys.map(|y| y.add(Y_QS));
        if ALT {
            // ggml's AVX2 order (`Single`): lane l of ggml's eight holds elements
            // 32c + 4l..+4 of every chunk c, i.e. register l of every unit, each times
            // its own 16-element scale; then the offset, one FMA per lane.
            let mut il = [[V::zero(); 8]; Q];
            for j in 0..UNITS {
                let r = t(j);
                for l in 0..8 {
                    let sc = h.sc[2 * j + l / 4];
                    for q in 0..Q {
                        il[q][l] = V::scaled_dot4(il[q][l], r[l], qs[q].add(32 * j + 4 * l), sc);
                    }
                }
            }
            for q in 0..Q {
                let d = V::mul(V::set1_ps(ys[q].cast::<f32>().read_unaligned()), h.d);
                for l in 0..8 {
                    let bs = ys[q].add(Y_BSUMS + 4 * l).cast::<i32>().read_unaligned();
                    let sub = V::madd(h.pairs[l], V::set1(bs));
                    let v = V::cvt(V::sub(il[q][l], V::shl5(sub)));
                    acc[q][l] = V::fmadd(d, v, acc[q][l]);
                }
            }
            return;
        }
        let mut s1 = [V::zero(); Q];
        for j in 0..UNITS {
            let r = t(j);
            for half in 0..2 {
                let sb = 2 * j + half;
                let y: [*const u8; Q] = qs.map(|p| p.add(16 * sb));
                V::sub_sums::<Q, 4, 6>(&r[4 * half..4 * half + 4], y, h.sc[sb], &mut s1);
            }
        }
        for q in 0..Q {
            // The -32 offset of the stored quants: 32 · Σ sc · bsums (pairs of adjacent
            // 16-element sums, one 4-byte broadcast each).
            let s1 = V::sub(s1[q], V::shl5(bsum_pairs_dot::<V>(&h.pairs, ys[q])));
            let yd = V::set1_ps(ys[q].cast::<f32>().read_unaligned());
            acc[q][0] = V::fmadd(V::mul(V::cvt(s1), h.d), yd, acc[q][0]);
        }
    }
}

/// IQ4_XS: the rows' `d` (f16 x 8) and their six-bit sub-block scales in 48 bytes (low
/// nibbles of sub-block `b` at `16 + 8·(b % 4)`, in nibble `b / 4`; top bit pairs at
/// `48 + 8·(b % 2)`, in bits `2·(b / 2)..`), then per sub-block `b` (unit `b`, at
/// `64 + 128b`) its table indices as Q4_K's nibbles. The registers hold the table values,
/// offset to unsigned bytes for `vpdpbusd` with VNNI, else signed for ggml's sign trick.
/// `ALT` is ggml's AVX2 `vec_dot` order (`Single`), the other the tiled GEMM's (`Tiled`,
/// also IQ4_XS's fast order).
impl KFormat for Iq4Xs {
    type Block = BlockIq4Xs;

    #[inline(always)]
    unsafe fn unit<V: Rows>(w: *const u8, group: usize, i: usize, b: usize) -> [V::I; UNIT] {
        let q = |g: usize, v: usize| {
            ld256(w.add(g * group + i * 8 * <Self::Block as Block>::BYTES + 64 + 128 * b + 32 * v))
        };
        // VNNI multiplies the values offset to unsigned bytes (`vpdpbusd`), AVX2 signed
        // (the sign trick): the table gives each form directly.
        let table = if V::VNNI {
            _mm256_xor_si256(
                _mm256_broadcastsi128_si256(ld128(KVALUES.as_ptr().cast())),
                _mm256_set1_epi8(-128),
            )
        } else {
            _mm256_broadcastsi128_si256(ld128(KVALUES.as_ptr().cast()))
        };
        arr(|k| {
            if k % 2 == 0 {
                V::gather(|g| _mm256_shuffle_epi8(table, nib::<false>(q(g, k / 2))))
            } else {
                V::gather(|g| _mm256_shuffle_epi8(table, nib::<true>(q(g, k / 2))))
            }
        })
    }

    #[inline(always)]
    unsafe fn head<V: Rows, const ALT: bool>(w: *const u8, group: usize, i: usize) -> Head<V> {
        let at = |g: usize| w.add(g * group + i * 8 * <Self::Block as Block>::BYTES);
        let mut h = Head {
            sc: [V::zero(); 16],
            pairs: [V::zero(); 8],
            d: V::gather_f(|g| halfs8(at(g))),
            dmin: V::zero_f(),
        };
        for b in 0..8 {
            let raw = V::gather(|g| {
                six_bit_scales(
                    at(g).add(16 + 8 * (b % 4)),
                    b / 4,
                    at(g).add(48 + 8 * (b % 2)),
                    b / 2,
                )
            });
            h.sc[b] = if ALT { V::scale16(raw) } else { V::scale(raw) };
            h.pairs[b] = V::scale16(raw);
        }
        h
    }

    #[inline(always)]
    unsafe fn tokens<V: Rows, const Q: usize, const ALT: bool>(
        h: &Head<V>,
        t: impl Fn(usize) -> [V::I; UNIT],
        ys: [*const u8; Q],
        acc: &mut [[V::F; ACC]; Q],
    ) {
        let qs = ys.map(|y| y.add(Y_QS));
        let yd = ys.map(|y| V::set1_ps(y.cast::<f32>().read_unaligned()));
        if V::VNNI && !ALT {
            // The values offset to unsigned bytes, then `128 · Σ_b ls_b · bsum32_b` taken
            // off (the bsums are the activations' own sums): the sign trick's exact sums
            // for every activation Q8_K's quantizer writes (-127..=127), with one
            // correction per token instead of a sign per register.
            let mut s1 = [V::zero(); Q];
            for b in 0..UNITS {
                let y: [*const u8; Q] = qs.map(|p| p.add(32 * b));
                V::sub_sums::<Q, 8, 8>(&t(b), y, h.sc[b], &mut s1);
            }
            for q in 0..Q {
                let c = bsum_pairs_dot::<V>(&h.pairs, ys[q]);
                let s = V::cvt(V::sub(s1[q], V::shl7(c)));
                acc[q][0] = V::fmadd(V::mul(s, h.d), yd[q], acc[q][0]);
            }
            return;
        }
        if ALT {
            // ggml's lane l of eight: register l of every sub-block (elements 4l..4l+4),
            // each times its sub-block's scale.
            let mut il = [[V::zero(); 8]; Q];
            for b in 0..UNITS {
                let r = t(b);
                // The sign trick takes the signed values (VNNI's registers hold them
                // offset).
                let r = if V::VNNI { r.map(|w| V::offset8(w)) } else { r };
                for l in 0..8 {
                    let a = V::abs8(r[l]);
                    for q in 0..Q {
                        let y = qs[q].add(32 * b + 4 * l);
                        il[q][l] = V::scaled_dot4_s(il[q][l], a, r[l], y, h.sc[b]);
                    }
                }
            }
            for q in 0..Q {
                let d = V::mul(yd[q], h.d);
                for l in 0..8 {
                    acc[q][l] = V::fmadd(d, V::cvt(il[q][l]), acc[q][l]);
                }
            }
            return;
        }
        let mut s1 = [V::zero(); Q];
        for b in 0..UNITS {
            let r = t(b);
            let a: [V::I; UNIT] = arr(|k| V::abs8(r[k]));
            let y: [*const u8; Q] = qs.map(|p| p.add(32 * b));
            V::sub_sums_s::<Q, 8>(&a, &r, y, h.sc[b], &mut s1);
        }
        for q in 0..Q {
            acc[q][0] = V::fmadd(V::mul(V::cvt(s1[q]), h.d), yd[q], acc[q][0]);
        }
    }
}

/// Q3_K: the rows' `d` (f16 x 8) and their 16 six-bit scales in 96 bytes (low nibbles of
/// sub-block `s` at `16 + 8·(s % 8)`, in nibble `s / 8`; top bit pairs at `80 + 8·(s %
/// 4)`, in bits `2·(s / 4)..`), then per 32-element chunk `j` (unit `j`, at `112 + 96j`)
/// two vectors of low bit pairs (vector `h`: register `4h + i`'s in bits `2i..2i+2`) and
/// one of high bits (bit `k`: register `k`'s). The registers hold `q + 4` (0..=7). `ALT` is
/// ggml's AVX2 `vec_dot` order (`Single`: the signed values, by the sign trick, in
/// ggml's lanes), the other the tiled GEMM's (`Tiled`, also Q3_K's fast order: the
/// offset taken off once per token, `4 · Σ_s sc_s · bsum_s`, as Q6_K's).
impl KFormat for Q3K {
    type Block = BlockQ3K;

    #[inline(always)]
    unsafe fn unit<V: Rows>(w: *const u8, group: usize, i: usize, j: usize) -> [V::I; UNIT] {
        let at = |g: usize| w.add(g * group + i * 8 * <Self::Block as Block>::BYTES + 112 + 96 * j);
        let m3 = _mm256_set1_epi8(3);
        let b2 = _mm256_set1_epi8(4);
        arr(|k| {
            V::gather(|g| {
                let lo = ld256(at(g).add(32 * (k / 4)));
                let lo = match k % 4 {
                    0 => lo,
                    1 => _mm256_srli_epi16::<2>(lo),
                    2 => _mm256_srli_epi16::<4>(lo),
                    _ => _mm256_srli_epi16::<6>(lo),
                };
                // Bit k of each byte to bit 2 (a 16-bit shift whose spill into the
                // neighbouring byte stays away from bit 2).
                let f = ld256(at(g).add(64));
                let h = match k {
                    0 => _mm256_slli_epi16::<2>(f),
                    1 => _mm256_slli_epi16::<1>(f),
                    2 => f,
                    3 => _mm256_srli_epi16::<1>(f),
                    4 => _mm256_srli_epi16::<2>(f),
                    5 => _mm256_srli_epi16::<3>(f),
                    6 => _mm256_srli_epi16::<4>(f),
                    _ => _mm256_srli_epi16::<5>(f),
                };
                _mm256_or_si256(_mm256_and_si256(lo, m3), _mm256_and_si256(h, b2))
            })
        })
    }

    #[inline(always)]
    unsafe fn head<V: Rows, const ALT: bool>(w: *const u8, group: usize, i: usize) -> Head<V> {
        let at = |g: usize| w.add(g * group + i * 8 * <Self::Block as Block>::BYTES);
        let mut h = Head {
            sc: [V::zero(); 16],
            pairs: [V::zero(); 8],
            d: V::gather_f(|g| halfs8(at(g))),
            dmin: V::zero_f(),
        };
        let raw = |g: usize, s: usize| {
            six_bit_scales(
                at(g).add(16 + 8 * (s % 8)),
                s / 8,
                at(g).add(80 + 8 * (s % 4)),
                s / 4,
            )
        };
        for s in 0..16 {
            let r = V::gather(|g| raw(g, s));
            h.sc[s] = if ALT { V::scale16(r) } else { V::scale(r) };
        }
        if !ALT {
            for j in 0..8 {
                h.pairs[j] = V::gather(|g| pair16(raw(g, 2 * j), raw(g, 2 * j + 1)));
            }
        }
        h
    }

    #[inline(always)]
    unsafe fn tokens<V: Rows, const Q: usize, const ALT: bool>(
        h: &Head<V>,
        t: impl Fn(usize) -> [V::I; UNIT],
        ys: [*const u8; Q],
        acc: &mut [[V::F; ACC]; Q],
    ) {
        let qs = ys.map(|y| y.add(Y_QS));
        let yd = ys.map(|y| V::set1_ps(y.cast::<f32>().read_unaligned()));
        if ALT {
            // ggml's lane l of eight: register l of every chunk (elements 4l..4l+4), each
            // times its 16-element sub-block's scale; the signed values by the sign trick.
            let mut il = [[V::zero(); 8]; Q];
            for j in 0..UNITS {
                let r = t(j).map(|u| V::sub8(u, 4));
                for l in 0..8 {
                    let a = V::abs8(r[l]);
                    let sc = h.sc[2 * j + l / 4];
                    for q in 0..Q {
                        let y = qs[q].add(32 * j + 4 * l);
                        il[q][l] = V::scaled_dot4_s(il[q][l], a, r[l], y, sc);
                    }
                }
            }
            for q in 0..Q {
                let d = V::mul(yd[q], h.d);
                for l in 0..8 {
                    acc[q][l] = V::fmadd(d, V::cvt(il[q][l]), acc[q][l]);
                }
            }
            return;
        }
        let mut s1 = [V::zero(); Q];
        for j in 0..UNITS {
            let r = t(j);
            for half in 0..2 {
                let sb = 2 * j + half;
                let y: [*const u8; Q] = qs.map(|p| p.add(16 * sb));
                V::sub_sums::<Q, 4, 3>(&r[4 * half..4 * half + 4], y, h.sc[sb], &mut s1);
            }
        }
        for q in 0..Q {
            // The +4 of the stored values: 4 · Σ sc · bsums (pairs of adjacent 16-element
            // sums, one 4-byte broadcast each).
            let s = V::cvt(V::sub(s1[q], V::shl2(bsum_pairs_dot::<V>(&h.pairs, ys[q]))));
            acc[q][0] = V::fmadd(V::mul(s, h.d), yd[q], acc[q][0]);
        }
    }
}

/// The kernel body, super-block by super-block. Decode (one or two tokens) unpacks each
/// unit into registers as it multiplies it; longer calls unpack a super-block once into
/// a staging area and multiply it with four tokens at a time, so a staged register serves
/// four tokens.
#[inline(always)]
unsafe fn body<V: Rows, K: KFormat, const ALT: bool>(c: KCall) {
    let KCall {
        w,
        group,
        groups,
        nb,
        a,
        stride,
        n,
        out,
        out_stride,
    } = c;
    let y = |c: usize, i: usize| a.add(c * stride + i * BlockQ8K::BYTES);
    let store =
        |c: usize, acc: [V::F; ACC]| V::store(out.add(c * out_stride), K::finish::<V, ALT>(acc));
    if n <= 2 {
        // The packed rows are one ascending stream per group (and the groups of a
        // thread's share follow each other), read at memory speed: each super-block asks
        // for the bytes `decode_prefetch()` further on (tuned while decoding, see
        // `crate::kernels::set_decode_prefetch`). Without it the weight loads stalled
        // (perf); 8B model, tg32, t=2, Zen 5, alternated: 9.0-9.3 -> 9.6-9.7 t/s with
        // 16 KiB. Prefetching only the next super-block measured 28% slower on Zen 4:
        // too close, it competes with the demand loads. The super-block's lines are asked
        // for a few at a time, as each unit is read (each of the `UNITS` calls of `t`
        // takes its share), not all at its start: `decode_stream`, Zen 5, same process,
        // alternated passes, 43.4 -> 46.7 GB/s with the memory slow (plain read 46.3) and
        // 63.9 -> 71.7 fast (plain read 73.1).
        // A call may take a decode task's groups one after the other: the stream goes on
        // across them (they are consecutive), and the call's checks are made once.
        let sb = 8 * <K::Block as Block>::BYTES;
        let lines = sb.div_ceil(64);
        let ahead = crate::kernels::decode_prefetch();
        for g in 0..groups {
            let w = w.add(g * group);
            let mut acc = [[V::zero_f(); ACC]; 2];
            for i in 0..nb {
                let pf = w.wrapping_add(i * sb + ahead);
                let h = K::head::<V, ALT>(w, group, i);
                let t = |j: usize| {
                    let (from, to) = (j * lines / UNITS, (j + 1) * lines / UNITS);
                    prefetch_lines(pf.wrapping_add(64 * from), 64 * (to - from));
                    K::unit::<V>(w, group, i, j)
                };
                if n == 2 {
                    K::tokens::<V, 2, ALT>(&h, t, [y(0, i), y(1, i)], &mut acc);
                } else {
                    let mut one = [acc[0]];
                    K::tokens::<V, 1, ALT>(&h, t, [y(0, i)], &mut one);
                    acc[0] = one[0];
                }
            }
            for (c, acc) in acc.into_iter().enumerate().take(n) {
                V::store(out.add(c * out_stride + 8 * g), K::finish::<V, ALT>(acc));
            }
        }
        return;
    }
    // Only the first `n` token slots are used: initialized here, not all of them.
    let mut acc_m = core::mem::MaybeUninit::<[[V::F; ACC]; FAST_TILE_TOKENS]>::uninit();
    let acc = acc_m.as_mut_ptr().cast::<[V::F; ACC]>();
    for c in 0..n {
        acc.add(c).write([V::zero_f(); ACC]);
    }
    // SAFETY: slots 0..n were written just above (n <= FAST_TILE_TOKENS, checked).
    let acc = core::slice::from_raw_parts_mut(acc, n);
    let mut staged = core::mem::MaybeUninit::<[[V::I; UNIT]; UNITS]>::uninit();
    let st = staged.as_mut_ptr().cast::<[V::I; UNIT]>();
    for i in 0..nb {
        for j in 0..UNITS {
            st.add(j).write(K::unit::<V>(w, group, i, j));
        }
        let h = K::head::<V, ALT>(w, group, i);
        // SAFETY: every unit was written just above.
        let t = |j: usize| *st.add(j);
        let mut c0 = 0;
        while c0 + 4 <= n {
            let mut acc4: [[V::F; ACC]; 4] = arr(|q| acc[c0 + q]);
            let ys = arr(|q| y(c0 + q, i));
            K::tokens::<V, 4, ALT>(&h, t, ys, &mut acc4);
            acc[c0..c0 + 4].copy_from_slice(&acc4);
            c0 += 4;
        }
        for (c, acc) in acc.iter_mut().enumerate().skip(c0) {
            let mut one = [*acc];
            K::tokens::<V, 1, ALT>(&h, t, [y(c, i)], &mut one);
            *acc = one[0];
        }
    }
    for (c, acc) in acc.iter().enumerate() {
        store(c, *acc);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2<K: KFormat, const ALT: bool>(c: KCall) {
    body::<Y2, K, ALT>(c)
}

#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn run_vnni<K: KFormat, const ALT: bool>(c: KCall) {
    body::<Yv, K, ALT>(c)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
unsafe fn run_512<K: KFormat, const ALT: bool>(c: KCall) {
    body::<Z, K, ALT>(c)
}

/// Validates a packed call of `rows` rows (whole groups, at most `max_rows`) and builds it.
#[allow(clippy::too_many_arguments)]
fn kcall<W: Block>(
    max_rows: usize,
    w: &[u8],
    rows: usize,
    a: &[u8],
    stride: usize,
    side: ActSide<'_>,
    n: usize,
    out: *mut f32,
    out_stride: usize,
) -> KCall {
    let stream = n <= 2;
    assert!(
        rows == 8 || rows == max_rows || (stream && rows.is_multiple_of(8)),
        "packed tile: {rows} rows, not one group of eight or {max_rows} rows (or, for \
         one or two tokens, whole groups)"
    );
    let limit = if stream { STREAM_ROWS } else { max_rows };
    let k = check_tile_rows::<W, BlockQ8K>(
        w,
        rows,
        a,
        stride,
        side,
        rows * n,
        (limit, FAST_TILE_TOKENS),
        1,
    );
    KCall {
        w: w.as_ptr(),
        group: 8 * k.wstride,
        groups: if stream { rows / 8 } else { 1 },
        nb: k.nb,
        a: a.as_ptr(),
        stride,
        n: k.cols,
        out,
        out_stride,
    }
}

/// The x86 levels a packed entry runs at (its `LEVEL`).
const AVX2: u8 = 0;
const VNNI: u8 = 1;
const AVX512: u8 = 2;

/// Rows of one AVX-512 packed call: two groups.
pub(super) const PACKED512_ROWS: usize = 16;

/// Most rows of one packed call for one or two tokens (`KernelRow::stream_rows`): whole
/// groups of eight, streamed one after the other by the eight-row kernel.
pub(super) const STREAM_ROWS: usize = 1 << 16;

/// A packed tile (`crate::contract::TileIntoFn`) of format `K` (`ALT`: its second order)
/// at `LEVEL`: AVX2 and AVX2+VNNI take one group of eight rows, AVX-512 sixteen rows (or
/// one group, through the VNNI ymm kernel).
///
/// # Safety
/// See [`crate::contract::TileIntoFn`]; the features of `LEVEL` available.
#[allow(clippy::too_many_arguments)]
unsafe fn packed<K: KFormat, const ALT: bool, const LEVEL: u8>(
    w: &[u8],
    rows: usize,
    a: &[u8],
    stride: usize,
    side: ActSide<'_>,
    n: usize,
    out: *mut f32,
    out_stride: usize,
) {
    let max_rows = if LEVEL == AVX512 { PACKED512_ROWS } else { 8 };
    let c = kcall::<K::Block>(max_rows, w, rows, a, stride, side, n, out, out_stride);
    match LEVEL {
        AVX2 => run_avx2::<K, ALT>(c),
        VNNI => run_vnni::<K, ALT>(c),
        _ if rows == 8 => run_vnni::<K, ALT>(c),
        // Decode streams each group through the ymm kernel in turn (`c.groups` of them):
        // one ascending stream at a time. The sixteen-row pass reads two groups at once
        // and measured 5.5-5.8 vs 7.7-8.6 t/s on the 8B model's tg32 (Zen 4); on Zen 5 it
        // is faster from cache (Q4_K 104 vs 87-92 G multiply-adds/s) but 0.71-0.75 of a
        // plain read from memory against the ymm kernel's 0.92, even with both groups'
        // super-blocks interleaved into one stream.
        _ if c.n <= 2 => run_vnni::<K, ALT>(c),
        _ => run_512::<K, ALT>(c),
    }
}

/// The packed tiles of one format and order at each x86 level.
pub(super) struct Tiles {
    avx2: TileIntoFn,
    vnni: TileIntoFn,
    avx512: TileIntoFn,
}

impl Tiles {
    const fn of<K: KFormat, const ALT: bool>() -> Tiles {
        Tiles {
            avx2: packed::<K, ALT, AVX2>,
            vnni: packed::<K, ALT, VNNI>,
            avx512: packed::<K, ALT, AVX512>,
        }
    }

    /// The tile written for `isa` and the rows it takes per call at most.
    pub(super) const fn at(&self, isa: Isa) -> (TileIntoFn, usize) {
        match isa {
            Isa::Avx512 => (self.avx512, PACKED512_ROWS),
            Isa::Avx2Vnni => (self.vnni, 8),
            _ => (self.avx2, 8),
        }
    }
}

/// Q4_K in its `Single` order (also its fast order) and its `Gemm4` order.
pub(super) const Q4_K_SINGLE: Tiles = Tiles::of::<Q4K, false>();
pub(super) const Q4_K_GEMM4: Tiles = Tiles::of::<Q4K, true>();
/// Q5_K in its `Tiled` order (also its fast order) and its `Single` order.
pub(super) const Q5_K_TILED: Tiles = Tiles::of::<Q5K, false>();
pub(super) const Q5_K_SINGLE: Tiles = Tiles::of::<Q5K, true>();
/// Q6_K in its `Tiled` order (also its fast order) and its `Single` order.
pub(super) const Q6_K_TILED: Tiles = Tiles::of::<Q6K, false>();
pub(super) const Q6_K_SINGLE: Tiles = Tiles::of::<Q6K, true>();
/// Q3_K in its `Tiled` order (also its fast order) and its `Single` order.
pub(super) const Q3_K_TILED: Tiles = Tiles::of::<Q3K, false>();
pub(super) const Q3_K_SINGLE: Tiles = Tiles::of::<Q3K, true>();
/// IQ4_XS in its `Tiled` order (also its fast order) and its `Single` order.
pub(super) const IQ4_XS_TILED: Tiles = Tiles::of::<Iq4Xs, false>();
pub(super) const IQ4_XS_SINGLE: Tiles = Tiles::of::<Iq4Xs, true>();
