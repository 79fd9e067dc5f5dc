//! AVX2 (+FMA, F16C; optionally AVX-512 VNNI) kernels, bit-exact with their scalar twins.
//!
//! How exactness is kept:
//!
//! * Integer parts are exact. `_mm256_maddubs_epi16` multiplies an *unsigned* byte by a
//!   signed one and adds adjacent pairs into a saturating i16; every call here stays below
//!   the saturation bound (weights' unsigned operand at most 128 with activations in
//!   -127..=127 for the 32-element formats, at most 63 against any byte for the K-quants).
//!   `vpdpbusd` (VNNI) forms the same i32 lanes without the i16 step.
//! * Float parts follow the twin operation for operation. Q4_0/Q4_1/Q5_0/Q5_1/Q8_0,
//!   Q4_K and Q6_K use ggml's x86 AVX2 order (eight i32 lanes per block, converted and
//!   fused-multiply-added into eight float lanes, `hsum_float_8` at the end), which the
//!   twins spell out with `f32::mul_add`. Q2_K/Q3_K/Q5_K keep ggml's generic order (lane
//!   `e % 8` per element, multiply then add), reproduced here with byte shuffles.
//! * The multi-row kernels (`DotManyFn`) unpack a weight block once and run the one-row
//!   operation sequence for each activation row, so a row's result never depends on how
//!   many rows were computed with it; the one-row entry points are their N = 1 instances.

use core::arch::x86_64::*;

use crate::common::check_dot;
use crate::q2_k::BlockQ2K;
use crate::q3_k::BlockQ3K;
use crate::q4_0::BlockQ4_0;
use crate::q4_1::BlockQ4_1;
use crate::q4_k::BlockQ4K;
use crate::q5_0::BlockQ5_0;
use crate::q5_1::BlockQ5_1;
use crate::q5_k::BlockQ5K;
use crate::q6_k::BlockQ6K;
use crate::q8_0::BlockQ8_0;
use crate::q8_1::BlockQ8_1;
use crate::q8_k::BlockQ8K;
use crate::{ActSide, Block, DotFn, DotManyFn, DotOrder, GgmlType};
use half::f16;

/// The AVX2 kernel for weights of type `ty` in `order`. Only call after AVX2, FMA and
/// F16C were detected (`super::detected()`); the returned functions rely on it.
pub(crate) fn vec_dot_kernel(ty: GgmlType, vnni: bool, order: DotOrder) -> Option<DotFn> {
    use GgmlType as T;
    match (ty, order.effective(ty)) {
        (T::Q4_K, DotOrder::Tiled) => return Some(q4_k_q8_k_tiled),
        (T::Q4_K, DotOrder::Gemm4) => return Some(q4_k_q8_k_gemm4),
        (T::Q6_K, DotOrder::Tiled) => return Some(q6_k_q8_k_tiled),
        _ => {}
    }
    Some(match (ty, vnni) {
        (T::Q4_0, false) => q4_0_q8_0 as DotFn,
        (T::Q4_1, false) => q4_1_q8_1 as DotFn,
        (T::Q5_0, false) => q5_0_q8_0 as DotFn,
        (T::Q5_1, false) => q5_1_q8_1 as DotFn,
        (T::Q8_0, false) => q8_0_q8_0 as DotFn,
        (T::Q4_0, true) => q4_0_q8_0_vnni as DotFn,
        (T::Q4_1, true) => q4_1_q8_1_vnni as DotFn,
        (T::Q5_0, true) => q5_0_q8_0_vnni as DotFn,
        (T::Q5_1, true) => q5_1_q8_1_vnni as DotFn,
        (T::Q8_0, true) => q8_0_q8_0_vnni as DotFn,
        (T::Q2_K, _) => q2_k_q8_k as DotFn,
        (T::Q3_K, _) => q3_k_q8_k as DotFn,
        (T::Q4_K, _) => q4_k_q8_k as DotFn,
        (T::Q5_K, _) => q5_k_q8_k as DotFn,
        (T::Q6_K, _) => q6_k_q8_k as DotFn,
        _ => return None,
    })
}

#[inline(always)]
fn assert_cpu() {
    debug_assert_eq!(super::detected(), super::SimdLevel::Avx2);
}

macro_rules! safe_entry {
    ($name:ident, $w:ty, $a:ty, $imp:expr) => {
        fn $name(w: &[u8], a: &[u8]) -> f32 {
            assert_cpu();
            let nb = check_dot::<$w, $a>(w, a);
            // SAFETY: these functions are only handed out (by `vec_dot_kernel`) once AVX2,
            // FMA and F16C were detected, and `check_dot` validated both lengths for `nb`
            // blocks, which is all the raw loads in the kernel read.
            unsafe { $imp(w, a, nb) }
        }
    };
}

safe_entry!(q2_k_q8_k, BlockQ2K, BlockQ8K, q2_k_impl);
safe_entry!(q3_k_q8_k, BlockQ3K, BlockQ8K, q3_k_impl);
safe_entry!(q5_k_q8_k, BlockQ5K, BlockQ8K, q5_k_impl);

// ---------------------------------------------------------------------------------------
// Small helpers.

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn ld256(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p.cast())
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn ld128(p: *const u8) -> __m128i {
    _mm_loadu_si128(p.cast())
}

/// The two f16s at `b[off..off + 4]`, widened (exact, as `f16_to_f32`). Loaded through a
/// general register so the conversion does not merge into (and wait for) a live vector.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16x2_at(b: &[u8], off: usize) -> (f32, f32) {
    let bits = u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]]);
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

/// The f16 at `b[off..off + 2]`, widened (see [`f16x2_at`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_at(b: &[u8], off: usize) -> f32 {
    let bits = u16::from_le_bytes([b[off], b[off + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

#[inline(always)]
fn f32_at(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// 16 packed bytes to 32 nibbles: low nibbles (elements 0..16) then high (16..32).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles32(p: *const u8) -> __m256i {
    let q = ld128(p);
    let m4 = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(q, m4);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), m4);
    _mm256_set_m128i(hi, lo)
}

/// Byte `j` is 0xff where bit `j` of `bits` is set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bits_to_bytes(bits: u32) -> __m256i {
    let t = _mm256_set1_epi32(bits as i32);
    let sel = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, //
        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    );
    let bytes = _mm256_shuffle_epi8(t, sel);
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit)
}

/// Sum of the eight i32 lanes (wrapping, so exact whatever the order).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    hsum_i32x4(_mm_add_epi32(
        _mm256_castsi256_si128(v),
        _mm256_extracti128_si256::<1>(v),
    ))
}

/// Sum of the four i32 lanes (wrapping, so exact whatever the order).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_i32x4(v: __m128i) -> i32 {
    let v = _mm_add_epi32(v, _mm_shuffle_epi32::<0b01_00_11_10>(v));
    let v = _mm_add_epi32(v, _mm_shuffle_epi32::<0b10_11_00_01>(v));
    _mm_cvtsi128_si32(v)
}

/// Per 128-bit half, reorders bytes `0..16` as `0, 8, 1, 9, ..., 7, 15`, so that
/// `maddubs` adds elements `e` and `e + 8`, which belong to the same K-quant lane `e % 8`.
/// After it, i16 `p` of each half of a `maddubs` result belongs to lane `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lane_pairs() -> __m256i {
    _mm256_setr_epi8(
        0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15, //
        0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15,
    )
}

/// Folds the two accumulators of [`scale_pairs`] into the eight per-lane sums.
/// `lo` holds lanes 0..4 in both halves, `hi` lanes 4..8.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fold_lanes(lo: __m256i, hi: __m256i) -> __m256i {
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(lo, hi),
        _mm256_permute2x128_si256::<0x31>(lo, hi),
    )
}

/// Adds `s0 * p0 + s1 * p1` into the per-lane accumulators, where `p0`, `p1` are
/// lane-ordered `maddubs` results (see [`lane_pairs`]) and `s` holds the i16 scale pairs
/// `(s0, s1)` for each half.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_pairs(
    acc: (__m256i, __m256i),
    p0: __m256i,
    p1: __m256i,
    s: __m256i,
) -> (__m256i, __m256i) {
    (
        _mm256_add_epi32(acc.0, _mm256_madd_epi16(_mm256_unpacklo_epi16(p0, p1), s)),
        _mm256_add_epi32(acc.1, _mm256_madd_epi16(_mm256_unpackhi_epi16(p0, p1), s)),
    )
}

/// `sums[l] += d * aux32[l] as f32` for the eight lanes (multiply, then add).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lanes_update(sums: __m256, d: f32, aux32: __m256i) -> __m256 {
    _mm256_add_ps(
        sums,
        _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(aux32)),
    )
}

/// The eight float lanes as an array, for the twin's sequential final sum.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lanes_array(v: __m256) -> [f32; 8] {
    let mut out = [0.0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), v);
    out
}

// ---------------------------------------------------------------------------------------
// Legacy 32-element formats, one weight row against up to eight activation rows.
//
// Per block: the weight quants are unpacked once into 32 bytes; for signed weights the
// unsigned operand is |x| and each activation gets x's sign (`sign_epi8`), which is exact
// because activation quants are in -127..=127 (the `DotManyFn` contract); `maddubs` pairs
// never saturate (|x| <= 128, |y| <= 127). The eight i32 lanes (elements 4l..4l+4) are the
// twin's `lanes_add_block` sums; with AVX-512 VNNI one `vpdpbusd` forms them directly.

/// One legacy weight format dotted with its 32-element activation format.
trait Legacy {
    /// Weight / activation block bytes.
    const WB: usize;
    const AB: usize;
    /// Offset of the activation quants in its block (Q8_0: 2, Q8_1: 4).
    const A_QS: usize;
    /// Weights are signed (Q4_0, Q5_0, Q8_0) rather than unsigned with a min (Q4_1, Q5_1).
    const SIGNED: bool;
    /// The 32 weight quants of the block at `w`, element `j` in byte `j`: signed values
    /// when `SIGNED`, else unsigned.
    ///
    /// # Safety
    /// AVX2 available; `w` points to a whole weight block.
    unsafe fn unpack(w: *const u8) -> __m256i;
    /// The quants as unsigned bytes: `q + offset` for the signed formats (the raw stored
    /// quant; Q8_0 flips the sign bit), the same as `unpack` for the others.
    ///
    /// # Safety
    /// As `unpack`.
    unsafe fn unpack_unsigned(w: *const u8) -> __m256i;
}

/// Q4_0 / Q5_0 / Q8_0 with Q8_0 activations; Q4_1 / Q5_1 with Q8_1.
struct Q4_0;
struct Q4_1;
struct Q5_0;
struct Q5_1;
struct Q8_0;

impl Legacy for Q4_0 {
    const WB: usize = BlockQ4_0::BYTES;
    const AB: usize = BlockQ8_0::BYTES;
    const A_QS: usize = 2;
    const SIGNED: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(w: *const u8) -> __m256i {
        _mm256_sub_epi8(nibbles32(w.add(2)), _mm256_set1_epi8(8))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack_unsigned(w: *const u8) -> __m256i {
        nibbles32(w.add(2))
    }
}

impl Legacy for Q4_1 {
    const WB: usize = BlockQ4_1::BYTES;
    const AB: usize = BlockQ8_1::BYTES;
    const A_QS: usize = 4;
    const SIGNED: bool = false;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(w: *const u8) -> __m256i {
        nibbles32(w.add(4))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack_unsigned(w: *const u8) -> __m256i {
        Self::unpack(w)
    }
}

impl Legacy for Q5_0 {
    const WB: usize = BlockQ5_0::BYTES;
    const AB: usize = BlockQ8_0::BYTES;
    const A_QS: usize = 2;
    const SIGNED: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(w: *const u8) -> __m256i {
        // q - 16 = low nibble | 0xf0 (as i8) where the fifth bit is clear, else the nibble.
        let qh = w.add(2).cast::<u32>().read_unaligned().to_le();
        let hi = _mm256_andnot_si256(bits_to_bytes(qh), _mm256_set1_epi8(0xf0u8 as i8));
        _mm256_or_si256(nibbles32(w.add(6)), hi)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack_unsigned(w: *const u8) -> __m256i {
        let qh = w.add(2).cast::<u32>().read_unaligned().to_le();
        let hb = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10));
        _mm256_or_si256(nibbles32(w.add(6)), hb)
    }
}

impl Legacy for Q5_1 {
    const WB: usize = BlockQ5_1::BYTES;
    const AB: usize = BlockQ8_1::BYTES;
    const A_QS: usize = 4;
    const SIGNED: bool = false;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(w: *const u8) -> __m256i {
        let qh = w.add(4).cast::<u32>().read_unaligned().to_le();
        let hb = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10));
        _mm256_or_si256(nibbles32(w.add(8)), hb)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack_unsigned(w: *const u8) -> __m256i {
        Self::unpack(w)
    }
}

impl Legacy for Q8_0 {
    const WB: usize = BlockQ8_0::BYTES;
    const AB: usize = BlockQ8_0::BYTES;
    const A_QS: usize = 2;
    const SIGNED: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(w: *const u8) -> __m256i {
        ld256(w.add(2))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack_unsigned(w: *const u8) -> __m256i {
        _mm256_xor_si256(ld256(w.add(2)), _mm256_set1_epi8(0x80u8 as i8))
    }
}

/// How far ahead (bytes) the decode kernels prefetch weights.
const PREFETCH: usize = 1024;

/// Prefetches the cache lines of the `bytes`-long block `PREFETCH` bytes past `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn prefetch_block(p: *const u8, bytes: usize) {
    let mut off = 0;
    while off < bytes {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH + off).cast());
        off += 64;
    }
}

/// ggml's `hsum_float_8` (the twin's `hsum_lanes`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_ps(x: __m256) -> f32 {
    let r = _mm_add_ps(_mm256_extractf128_ps::<1>(x), _mm256_castps256_ps128(x));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    let r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn isum_maddubs(u: __m256i, s: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn isum_vnni(u: __m256i, s: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
}

/// `init + Σ u·y` per lane, unsigned weights up to 255 (no i16 step, so no saturation).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn isum_from_vnni(init: __m256i, u: __m256i, y: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(init, u, y)
}

/// The plain AVX2 kernels never take the offset-sum path (`maddubs` could saturate on
/// unsigned Q8_0 bytes); the dispatcher only sets `SUMS` for the VNNI kernels.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn isum_from_never(_init: __m256i, _u: __m256i, _y: __m256i) -> __m256i {
    unreachable!("offset sums are only used with VNNI")
}

/// The multi-row kernel body, instantiated for plain AVX2 and for AVX-512 VNNI (which only
/// changes how the exact i32 lanes are formed).
macro_rules! legacy_many {
    ($name:ident, $feat:literal, $isum:ident, $isum_from:ident) => {
        /// # Safety
        /// The features named are available; `w` holds `R` weight rows of `nb` blocks,
        /// `wstride` bytes apart, and `a` holds `N` rows of `nb` activation blocks, `stride`
        /// bytes apart; `out` has `R * N` slots (`out[r * N + c]`). With `PRE`, `ad` holds
        /// each activation row's block scales as f32 (`nb` per row for Q8_0, `2 nb` for
        /// Q8_1's `(d, s)` pairs), rows `ad_stride` floats apart. With `SUMS` (signed
        /// formats, VNNI only), `sums` holds `-offset` times each activation block's eight
        /// lane sums, rows `nb * 8` apart, and the weights go in as unsigned quants.
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = $feat)]
        unsafe fn $name<
            T: Legacy,
            const R: usize,
            const N: usize,
            const PRE: bool,
            const SUMS: bool,
        >(
            w: *const u8,
            wstride: usize,
            a: *const u8,
            stride: usize,
            ad: *const f32,
            ad_stride: usize,
            sums: *const i32,
            nb: usize,
            out: *mut f32,
        ) {
            let mut acc = [[_mm256_setzero_ps(); N]; R];
            let mut summs = [[0.0f32; N]; R];
            let per = if T::SIGNED { 1 } else { 2 };
            for i in 0..nb {
                let mut x = [_mm256_setzero_si256(); R];
                let mut u = [_mm256_setzero_si256(); R];
                let mut dx = [_mm256_setzero_ps(); R];
                let mut mx = [0.0f32; R];
                for r in 0..R {
                    let wb = w.add(r * wstride + i * T::WB);
                    if N <= 2 {
                        // Decode streams weights from memory: ask for them well ahead.
                        _mm_prefetch::<_MM_HINT_T0>(wb.wrapping_add(PREFETCH).cast());
                    }
                    if SUMS {
                        u[r] = T::unpack_unsigned(wb);
                    } else {
                        x[r] = T::unpack(wb);
                        u[r] = if T::SIGNED {
                            _mm256_sign_epi8(x[r], x[r])
                        } else {
                            x[r]
                        };
                    }
                    let wd = _mm_cvtph_ps(_mm_cvtsi32_si128(
                        wb.cast::<u32>().read_unaligned().to_le() as i32,
                    ));
                    dx[r] = _mm256_broadcastss_ps(wd);
                    mx[r] = _mm_cvtss_f32(_mm_movehdup_ps(wd));
                }
                for c in 0..N {
                    let ab = a.add(c * stride + i * T::AB);
                    let y = ld256(ab.add(T::A_QS));
                    // dy broadcast once per activation block; `dx * dy` is then one
                    // lane-wise multiply per weight row (the same rounding as a scalar one).
                    let (dy, sy) = if PRE {
                        let q = ad.add(c * ad_stride + i * per);
                        (
                            _mm256_broadcast_ss(&*q),
                            if T::SIGNED { 0.0 } else { *q.add(1) },
                        )
                    } else {
                        let v = _mm_cvtph_ps(_mm_cvtsi32_si128(
                            ab.cast::<u32>().read_unaligned().to_le() as i32,
                        ));
                        (_mm256_broadcastss_ps(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
                    };
                    // Σ (q - off) y = Σ q y + (-off Σ y): the lane sums start the count.
                    let init = if SUMS {
                        ld256(sums.add((c * nb + i) * 8).cast())
                    } else {
                        _mm256_setzero_si256()
                    };
                    for r in 0..R {
                        let isum = if SUMS {
                            $isum_from(init, u[r], y)
                        } else {
                            let s = if T::SIGNED {
                                _mm256_sign_epi8(y, x[r])
                            } else {
                                y
                            };
                            $isum(u[r], s)
                        };
                        let p = _mm256_cvtepi32_ps(isum);
                        acc[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(dx[r], dy), p, acc[r][c]);
                        if !T::SIGNED {
                            summs[r][c] = mx[r].mul_add(sy, summs[r][c]);
                        }
                    }
                }
            }
            for r in 0..R {
                for c in 0..N {
                    let h = hsum_ps(acc[r][c]);
                    *out.add(r * N + c) = if T::SIGNED { h } else { h + summs[r][c] };
                }
            }
        }
    };
}

legacy_many!(legacy_avx2, "avx2,fma,f16c", isum_maddubs, isum_from_never);
legacy_many!(
    legacy_vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    isum_vnni,
    isum_from_vnni
);

/// A validated `DotManyFn` call: block count, weight row stride in bytes, rows, columns,
/// scale row stride in floats (0 when no scales were passed), and the offset sums.
struct ManyCall {
    nb: usize,
    wstride: usize,
    rows: usize,
    cols: usize,
    ad_stride: usize,
    use_sums: bool,
    sums: *const i32,
}

/// Validates a `DotManyFn` call.
fn check_many<W: Block, A: Block>(
    w: &[u8],
    rows: usize,
    a: &[u8],
    stride: usize,
    side: ActSide<'_>,
    out_len: usize,
) -> ManyCall {
    assert!(
        (1..=crate::DOT_MANY_ROWS).contains(&rows) && out_len.is_multiple_of(rows),
        "vec_dot_many: {rows} weight rows, {out_len} outputs"
    );
    let n = out_len / rows;
    assert!(
        (1..=crate::DOT_MANY_MAX).contains(&n),
        "vec_dot_many: {n} activation rows (1..={} allowed)",
        crate::DOT_MANY_MAX
    );
    assert!(
        w.len().is_multiple_of(rows) && (w.len() / rows).is_multiple_of(W::BYTES),
        "vec_dot_many {}: {} weight bytes are not {rows} rows of whole blocks",
        W::TYPE,
        w.len()
    );
    let wstride = w.len() / rows;
    let nb = wstride / W::BYTES;
    let row = nb * A::BYTES;
    assert!(
        (n == 1 || stride >= row) && a.len() >= (n - 1) * stride + row,
        "vec_dot_many {}x{}: {} activation bytes, stride {stride}, cannot hold {n} rows of {row}",
        W::TYPE,
        A::TYPE,
        a.len()
    );
    let per = crate::activation_scales_per_block(A::TYPE);
    let ad_stride = if side.scales.is_empty() || per == 0 {
        0
    } else {
        assert!(
            side.scales.len() == n * nb * per,
            "vec_dot_many {}: {} activation scales for {n} rows of {nb} blocks",
            W::TYPE,
            side.scales.len()
        );
        nb * per
    };
    let use_sums = !side.sums.is_empty() && crate::signed_offset(W::TYPE) != 0;
    if use_sums {
        assert!(
            side.sums.len() == n * nb * 8,
            "vec_dot_many {}: {} offset sums for {n} rows of {nb} blocks",
            W::TYPE,
            side.sums.len()
        );
    }
    ManyCall {
        nb,
        wstride,
        rows,
        cols: n,
        ad_stride,
        use_sums,
        sums: side.sums.as_ptr(),
    }
}

/// Dispatches a call to the `R x N` instantiation. Without VNNI (16 vector registers) two
/// weight rows take at most four activation rows at a time.
macro_rules! many_entry {
    ($name:ident, $ty:ident, $w:ty, $a:ty, $imp:ident, $wide:literal) => {
        fn $name(
            w: &[u8],
            rows: usize,
            a: &[u8],
            stride: usize,
            side: ActSide<'_>,
            out: &mut [f32],
        ) {
            let k = check_many::<$w, $a>(w, rows, a, stride, side, out.len());
            let (wp, dp, op) = (w.as_ptr(), side.scales.as_ptr(), out.as_mut_ptr());
            let mut c0 = 0;
            while c0 < k.cols {
                let n = if k.rows == 2 && !$wide {
                    (k.cols - c0).min(4)
                } else {
                    k.cols - c0
                };
                let ap = a.as_ptr().wrapping_add(c0 * stride);
                let dp = dp.wrapping_add(c0 * k.ad_stride);
                let mut tmp = [0.0f32; 2 * crate::DOT_MANY_MAX];
                let tp = tmp.as_mut_ptr();
                let sp = k.sums.wrapping_add(c0 * k.nb * 8);
                // `ad_stride` is 0 when no scales were passed, so every instantiation
                // takes the same arguments.
                macro_rules! go {
                    ($r:literal, $n:literal) => {{
                        macro_rules! call {
                            ($pre:literal, $sums:literal) => {
                                $imp::<$ty, $r, $n, $pre, $sums>(
                                    wp,
                                    k.wstride,
                                    ap,
                                    stride,
                                    dp,
                                    k.ad_stride,
                                    sp,
                                    k.nb,
                                    tp,
                                )
                            };
                        }
                        match (k.ad_stride != 0, k.use_sums && $wide) {
                            (true, true) => call!(true, true),
                            (true, false) => call!(true, false),
                            (false, true) => call!(false, true),
                            (false, false) => call!(false, false),
                        }
                    }};
                }
                // SAFETY: handed out by `vec_dot_many_kernel` only after the features were
                // detected; `check_many` validated every byte the kernel reads, and `tmp`
                // holds R * N results.
                unsafe {
                    match (k.rows, n) {
                        (1, 1) => go!(1, 1),
                        (1, 2) => go!(1, 2),
                        (1, 3) => go!(1, 3),
                        (1, 4) => go!(1, 4),
                        (1, 5) => go!(1, 5),
                        (1, 6) => go!(1, 6),
                        (1, 7) => go!(1, 7),
                        (1, _) => go!(1, 8),
                        (_, 1) => go!(2, 1),
                        (_, 2) => go!(2, 2),
                        (_, 3) => go!(2, 3),
                        (_, 4) => go!(2, 4),
                        (_, 5) => go!(2, 5),
                        (_, 6) => go!(2, 6),
                        (_, 7) => go!(2, 7),
                        (_, _) => go!(2, 8),
                    }
                }
                for r in 0..k.rows {
                    for c in 0..n {
                        // SAFETY: r * cols + c0 + c < rows * cols = out.len().
                        unsafe { *op.add(r * k.cols + c0 + c) = tmp[r * n + c] };
                    }
                }
                c0 += n;
            }
        }
    };
}

many_entry!(q4_0_many, Q4_0, BlockQ4_0, BlockQ8_0, legacy_avx2, false);
many_entry!(q4_1_many, Q4_1, BlockQ4_1, BlockQ8_1, legacy_avx2, false);
many_entry!(q5_0_many, Q5_0, BlockQ5_0, BlockQ8_0, legacy_avx2, false);
many_entry!(q5_1_many, Q5_1, BlockQ5_1, BlockQ8_1, legacy_avx2, false);
many_entry!(q8_0_many, Q8_0, BlockQ8_0, BlockQ8_0, legacy_avx2, false);
many_entry!(
    q4_0_many_vnni,
    Q4_0,
    BlockQ4_0,
    BlockQ8_0,
    legacy_vnni,
    true
);
many_entry!(
    q4_1_many_vnni,
    Q4_1,
    BlockQ4_1,
    BlockQ8_1,
    legacy_vnni,
    true
);
many_entry!(
    q5_0_many_vnni,
    Q5_0,
    BlockQ5_0,
    BlockQ8_0,
    legacy_vnni,
    true
);
many_entry!(
    q5_1_many_vnni,
    Q5_1,
    BlockQ5_1,
    BlockQ8_1,
    legacy_vnni,
    true
);
many_entry!(
    q8_0_many_vnni,
    Q8_0,
    BlockQ8_0,
    BlockQ8_0,
    legacy_vnni,
    true
);

/// The multi-row kernel for weights of type `ty` in `order`; `vnni` picks the AVX-512
/// VNNI variant (only after `avx512vnni` and `avx512vl` were detected).
pub(crate) fn vec_dot_many_kernel(ty: GgmlType, vnni: bool, order: DotOrder) -> Option<DotManyFn> {
    use GgmlType as T;
    match (ty, order.effective(ty)) {
        (T::Q4_K, DotOrder::Tiled) => return Some(q4_k_tiled_many_entry),
        (T::Q4_K, DotOrder::Gemm4) => return Some(q4_k_gemm4_many_entry),
        (T::Q6_K, DotOrder::Tiled) => return Some(q6_k_tiled_many_entry),
        _ => {}
    }
    Some(match (ty, vnni) {
        (T::Q4_0, false) => q4_0_many as DotManyFn,
        (T::Q4_1, false) => q4_1_many as DotManyFn,
        (T::Q5_0, false) => q5_0_many as DotManyFn,
        (T::Q5_1, false) => q5_1_many as DotManyFn,
        (T::Q8_0, false) => q8_0_many as DotManyFn,
        (T::Q4_0, true) => q4_0_many_vnni as DotManyFn,
        (T::Q4_1, true) => q4_1_many_vnni as DotManyFn,
        (T::Q5_0, true) => q5_0_many_vnni as DotManyFn,
        (T::Q5_1, true) => q5_1_many_vnni as DotManyFn,
        (T::Q8_0, true) => q8_0_many_vnni as DotManyFn,
        (T::Q4_K, _) => q4_k_many_entry as DotManyFn,
        (T::Q6_K, _) => q6_k_many_entry as DotManyFn,
        _ => return None,
    })
}

// ---------------------------------------------------------------------------------------
// Q4_K and Q6_K, one weight row against up to eight Q8_K activation rows, in ggml's AVX2
// order (the twins `q4_k::vec_dot_q8k`, `q6_k::vec_dot_q8k`). Q8_K: d (f32) at 0, qs at
// 4..260, bsums (16 x i16) at 260..292.

const Q8K_BYTES: usize = 292;

/// Byte shuffle broadcasting i16 scale pair `k` (bytes 2k, 2k+1) to every i16 slot.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_bcast_k4(k: i8) -> __m256i {
    _mm256_set1_epi16(((2 * k + 1) as i16) << 8 | (2 * k) as i16)
}

/// Kernel orders (const parameter `ORD` of the K-quant kernels; see `crate::DotOrder`).
const ORD_SINGLE: u8 = 0;
const ORD_TILED: u8 = 1;
const ORD_GEMM4: u8 = 2;

/// # Safety
/// AVX2/FMA/F16C; `w` holds `nb` Q4_K blocks, `a` `N` rows of `nb` Q8_K blocks `stride`
/// bytes apart, `out` `N` slots. `ORD` picks the twin: `q4_k::vec_dot_q8k` (single),
/// `vec_dot_q8k_tiled` or `vec_dot_q8k_gemm4`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_many<const N: usize, const ORD: u8>(
    w: *const u8,
    a: *const u8,
    stride: usize,
    nb: usize,
    out: *mut f32,
) {
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = [0.0f32; N];
    let mut acc_m = [0.0f32; N];
    for i in 0..nb {
        let x = w.add(i * BlockQ4K::BYTES);
        if N <= 2 {
            prefetch_block(x, BlockQ4K::BYTES);
        }
        let xb = std::slice::from_raw_parts(x, BlockQ4K::BYTES);
        let (xd, xdmin) = f16x2_at(xb, 0);
        let u = |k: usize| {
            u32::from_le_bytes([xb[4 + 4 * k], xb[5 + 4 * k], xb[6 + 4 * k], xb[7 + 4 * k]])
        };
        let (u0, u1, u2) = (u(0), u(1), u(2));
        let (km1, km2, km3) = (0x3f3f_3f3fu32, 0x0f0f_0f0fu32, 0x0303_0303u32);
        let t3 = ((u2 >> 4) & km2) | (((u1 >> 6) & km3) << 4);
        let t2 = u1 & km1;
        let t1 = (u2 & km2) | (((u0 >> 6) & km3) << 4);
        let t0 = u0 & km1;
        let ms = _mm256_cvtepu8_epi16(_mm_set_epi32(t3 as i32, t2 as i32, t1 as i32, t0 as i32));
        let mins16 = _mm256_extracti128_si256::<1>(ms);
        let sc128 = _mm256_castsi256_si128(ms);
        let scales = _mm256_set_m128i(sc128, sc128);
        let mut q4 = [_mm256_setzero_si256(); 8];
        let mut sc = [_mm256_setzero_si256(); 8];
        for j in 0..4 {
            let bits = ld256(x.add(16 + 32 * j));
            q4[2 * j] = _mm256_and_si256(bits, m4);
            q4[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
            sc[2 * j] = _mm256_shuffle_epi8(scales, scale_bcast_k4(2 * j as i8));
            sc[2 * j + 1] = _mm256_shuffle_epi8(scales, scale_bcast_k4(2 * j as i8 + 1));
        }
        // Tiled: each min as an i16 pair (m, m), so one madd with the raw bsums gives
        // `m[j] * (bsums[2j] + bsums[2j+1])` widened to i32 before the pair sum.
        let mins_pairs = if ORD == ORD_TILED {
            let m32 = _mm256_cvtepu16_epi32(mins16);
            _mm256_or_si256(m32, _mm256_slli_epi32::<16>(m32))
        } else {
            _mm256_setzero_si256()
        };
        for c in 0..N {
            let y = a.add(c * stride + i * Q8K_BYTES);
            let yd = y.cast::<f32>().read_unaligned();
            let q8sums = ld256(y.add(Q8K_BSUMS));
            let q8 = |b: usize| ld256(y.add(Q8K_QS + 32 * b));
            let p = |b: usize| _mm256_madd_epi16(sc[b], _mm256_maddubs_epi16(q4[b], q8(b)));
            if ORD == ORD_TILED {
                let s2 = hsum_i32(_mm256_madd_epi16(q8sums, mins_pairs));
                let mut sumi = _mm256_setzero_si256();
                for b in 0..8 {
                    sumi = _mm256_add_epi32(sumi, p(b));
                }
                let s1 = hsum_i32(sumi);
                let r = (-xdmin).mul_add(s2 as f32, s1 as f32 * xd);
                acc[c] = r.mul_add(yd, acc[c]);
                continue;
            }
            let q8s = _mm_hadd_epi16(
                _mm256_castsi256_si128(q8sums),
                _mm256_extracti128_si256::<1>(q8sums),
            );
            // Lane k: the mins of 64-element chunk k times its bsums.
            let mins_k = _mm_madd_epi16(mins16, q8s);
            if ORD == ORD_GEMM4 {
                let s: [__m256i; 4] =
                    std::array::from_fn(|k| _mm256_add_epi32(p(2 * k), p(2 * k + 1)));
                let h =
                    _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
                let s1 = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
                let mut f1 = [0.0f32; 4];
                let mut f2 = [0.0f32; 4];
                _mm_storeu_ps(f1.as_mut_ptr(), _mm_cvtepi32_ps(s1));
                _mm_storeu_ps(f2.as_mut_ptr(), _mm_cvtepi32_ps(mins_k));
                let (d, dmin) = (xd * yd, xdmin * yd);
                for k in 0..4 {
                    acc[c] = f1[k].mul_add(d, acc[c]);
                    acc_m[c] = f2[k].mul_add(dmin, acc_m[c]);
                }
                continue;
            }
            let s2 = hsum_i32x4(mins_k);
            acc_m[c] = (s2 as f32).mul_add(xdmin * yd, acc_m[c]);
            let mut sumi = _mm256_setzero_si256();
            for b in 0..8 {
                sumi = _mm256_add_epi32(sumi, p(b));
            }
            let s1 = hsum_i32(sumi);
            acc[c] = (s1 as f32).mul_add(xd * yd, acc[c]);
        }
    }
    for c in 0..N {
        *out.add(c) = acc[c] - acc_m[c];
    }
}

/// # Safety
/// As [`q4_k_many`], with Q6_K weights (`ORD`: `q6_k::vec_dot_q8k` or
/// `vec_dot_q8k_tiled`).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_many<const N: usize, const ORD: u8>(
    w: *const u8,
    a: *const u8,
    stride: usize,
    nb: usize,
    out: *mut f32,
) {
    let m3 = _mm256_set1_epi8(3);
    let m15 = _mm256_set1_epi8(15);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut acc_t = [0.0f32; N];
    for i in 0..nb {
        let x = w.add(i * BlockQ6K::BYTES);
        if N <= 2 {
            prefetch_block(x, BlockQ6K::BYTES);
        }
        let xb = std::slice::from_raw_parts(x, BlockQ6K::BYTES);
        let xd = f16_at(xb, 208);
        let scales = ld128(x.add(192));
        let scales_16 = _mm256_cvtepi8_epi16(scales);
        let mut q6 = [_mm256_setzero_si256(); 8];
        let mut sc = [_mm256_setzero_si256(); 8];
        for j in 0..2 {
            let b1 = ld256(x.add(64 * j));
            let b2 = ld256(x.add(64 * j + 32));
            let bh = ld256(x.add(128 + 32 * j));
            let h0 = _mm256_slli_epi16::<4>(_mm256_and_si256(bh, m3));
            let h1 = _mm256_slli_epi16::<2>(_mm256_and_si256(bh, _mm256_set1_epi8(12)));
            let h2 = _mm256_and_si256(bh, _mm256_set1_epi8(48));
            let h3 = _mm256_srli_epi16::<2>(_mm256_and_si256(bh, _mm256_set1_epi8(-64)));
            q6[4 * j] = _mm256_or_si256(_mm256_and_si256(b1, m15), h0);
            q6[4 * j + 1] = _mm256_or_si256(_mm256_and_si256(b2, m15), h1);
            q6[4 * j + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(b1), m15), h2);
            q6[4 * j + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(b2), m15), h3);
        }
        for (m, sc) in sc.iter_mut().enumerate() {
            // Scales 2m (first 16 elements of chunk m) and 2m + 1, each widened 8 times.
            let lo = _mm_set1_epi16(*xb.get_unchecked(192 + 2 * m) as i8 as i16);
            let hi = _mm_set1_epi16(*xb.get_unchecked(193 + 2 * m) as i8 as i16);
            *sc = _mm256_set_m128i(hi, lo);
        }
        for c in 0..N {
            let y = a.add(c * stride + i * Q8K_BYTES);
            let yd = y.cast::<f32>().read_unaligned();
            let q8sums = ld256(y.add(Q8K_BSUMS));
            let sub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(q8sums, scales_16));
            let mut sumi = _mm256_setzero_si256();
            for m in 0..8 {
                let q8 = ld256(y.add(Q8K_QS + 32 * m));
                let p = _mm256_madd_epi16(sc[m], _mm256_maddubs_epi16(q6[m], q8));
                sumi = _mm256_add_epi32(sumi, p);
            }
            let sumi = _mm256_sub_epi32(sumi, sub);
            if ORD == ORD_TILED {
                let s1 = hsum_i32(sumi);
                acc_t[c] = (s1 as f32 * xd).mul_add(yd, acc_t[c]);
            } else {
                let d = yd * xd;
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc[c]);
            }
        }
    }
    for c in 0..N {
        *out.add(c) = if ORD == ORD_TILED {
            acc_t[c]
        } else {
            hsum_ps(acc[c])
        };
    }
}

/// Dispatches a call to the `N`-row instantiation of a K-quant kernel in order `$ord`.
macro_rules! many_entry_k {
    ($name:ident, $w:ty, $imp:ident, $ord:expr) => {
        fn $name(
            w: &[u8],
            rows: usize,
            a: &[u8],
            stride: usize,
            side: ActSide<'_>,
            out: &mut [f32],
        ) {
            let k = check_many::<$w, BlockQ8K>(w, rows, a, stride, side, out.len());
            let ap = a.as_ptr();
            for r in 0..k.rows {
                let wp = w[r * k.wstride..].as_ptr();
                let op = out[r * k.cols..].as_mut_ptr();
                // SAFETY: as in `many_entry`.
                unsafe {
                    match k.cols {
                        1 => $imp::<1, { $ord }>(wp, ap, stride, k.nb, op),
                        2 => $imp::<2, { $ord }>(wp, ap, stride, k.nb, op),
                        3 => $imp::<3, { $ord }>(wp, ap, stride, k.nb, op),
                        4 => $imp::<4, { $ord }>(wp, ap, stride, k.nb, op),
                        5 => $imp::<5, { $ord }>(wp, ap, stride, k.nb, op),
                        6 => $imp::<6, { $ord }>(wp, ap, stride, k.nb, op),
                        7 => $imp::<7, { $ord }>(wp, ap, stride, k.nb, op),
                        _ => $imp::<8, { $ord }>(wp, ap, stride, k.nb, op),
                    }
                }
            }
        }
    };
}

many_entry_k!(q4_k_many_entry, BlockQ4K, q4_k_many, ORD_SINGLE);
many_entry_k!(q4_k_tiled_many_entry, BlockQ4K, q4_k_many, ORD_TILED);
many_entry_k!(q4_k_gemm4_many_entry, BlockQ4K, q4_k_many, ORD_GEMM4);
many_entry_k!(q6_k_many_entry, BlockQ6K, q6_k_many, ORD_SINGLE);
many_entry_k!(q6_k_tiled_many_entry, BlockQ6K, q6_k_many, ORD_TILED);

/// Single-row entry points: the one-row instantiation of the multi-row kernels (so a row
/// alone and a row in a batch give the same bits by construction).
macro_rules! single_from_many {
    ($name:ident, $w:ty, $a:ty, $many:ident) => {
        fn $name(w: &[u8], a: &[u8]) -> f32 {
            check_dot::<$w, $a>(w, a);
            let mut out = [0.0f32];
            $many(w, 1, a, a.len(), ActSide::default(), &mut out);
            out[0]
        }
    };
}

single_from_many!(q4_0_q8_0, BlockQ4_0, BlockQ8_0, q4_0_many);
single_from_many!(q4_1_q8_1, BlockQ4_1, BlockQ8_1, q4_1_many);
single_from_many!(q5_0_q8_0, BlockQ5_0, BlockQ8_0, q5_0_many);
single_from_many!(q5_1_q8_1, BlockQ5_1, BlockQ8_1, q5_1_many);
single_from_many!(q8_0_q8_0, BlockQ8_0, BlockQ8_0, q8_0_many);
single_from_many!(q4_0_q8_0_vnni, BlockQ4_0, BlockQ8_0, q4_0_many_vnni);
single_from_many!(q4_1_q8_1_vnni, BlockQ4_1, BlockQ8_1, q4_1_many_vnni);
single_from_many!(q5_0_q8_0_vnni, BlockQ5_0, BlockQ8_0, q5_0_many_vnni);
single_from_many!(q5_1_q8_1_vnni, BlockQ5_1, BlockQ8_1, q5_1_many_vnni);
single_from_many!(q8_0_q8_0_vnni, BlockQ8_0, BlockQ8_0, q8_0_many_vnni);
single_from_many!(q4_k_q8_k, BlockQ4K, BlockQ8K, q4_k_many_entry);
single_from_many!(q6_k_q8_k, BlockQ6K, BlockQ8K, q6_k_many_entry);
single_from_many!(q4_k_q8_k_tiled, BlockQ4K, BlockQ8K, q4_k_tiled_many_entry);
single_from_many!(q4_k_q8_k_gemm4, BlockQ4K, BlockQ8K, q4_k_gemm4_many_entry);
single_from_many!(q6_k_q8_k_tiled, BlockQ6K, BlockQ8K, q6_k_tiled_many_entry);

// ---------------------------------------------------------------------------------------
// K-quants. Q8_K block: d (f32) at 0, qs at 4..260, bsums (16 x i16) at 260..292.

const Q8K_QS: usize = 4;
const Q8K_BSUMS: usize = 260;

/// The eight 6-bit scales and mins of a Q4_K/Q5_K block as little-endian byte lanes
/// (byte `j` = `get_scale_min_k4(j)`).
#[inline(always)]
fn scales_mins_k4(s: &[u8]) -> (u64, u64) {
    let a0 = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    let a1 = u32::from_le_bytes([s[4], s[5], s[6], s[7]]);
    let a2 = u32::from_le_bytes([s[8], s[9], s[10], s[11]]);
    let sc_lo = a0 & 0x3f3f_3f3f;
    let mn_lo = a1 & 0x3f3f_3f3f;
    let sc_hi = (a2 & 0x0f0f_0f0f) | ((a0 >> 2) & 0x3030_3030);
    let mn_hi = ((a2 >> 4) & 0x0f0f_0f0f) | ((a1 >> 2) & 0x3030_3030);
    (
        sc_lo as u64 | (sc_hi as u64) << 32,
        mn_lo as u64 | (mn_hi as u64) << 32,
    )
}

/// `sum_j bsums[j] * mins[j / 2]` for Q4_K/Q5_K (`mins` as 8 byte lanes).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bsums_times_mins8(y: *const u8, mins: u64) -> i32 {
    let m = _mm_cvtsi64_si128(mins as i64);
    let m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m));
    hsum_i32(_mm256_madd_epi16(ld256(y.add(Q8K_BSUMS)), m16))
}

/// The four i16 scale-pair vectors for sub-blocks `(2k, 2k+1)`, `k = 0..4`, from eight
/// byte scales (Q4_K/Q5_K: one scale per 32-element sub-block, both halves alike).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_pairs_32(scales: u64) -> [__m256i; 4] {
    // i16 lanes [s0..s8]; as i32 lanes, element k is the pair (s_2k, s_2k+1).
    let s16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(scales as i64));
    let b = _mm256_broadcastsi128_si256(s16);
    [
        _mm256_shuffle_epi32::<0x00>(b),
        _mm256_shuffle_epi32::<0x55>(b),
        _mm256_shuffle_epi32::<0xaa>(b),
        _mm256_shuffle_epi32::<0xff>(b),
    ]
}

/// The four i16 scale-pair vectors for 16-element sub-blocks (Q3_K, Q6_K): for half `h`
/// of the super-block and vector pair `c` (vectors `2c`, `2c+1`, each covering two
/// sub-blocks), the low 128 bits hold `(s[8h+4c], s[8h+4c+2])`, the high bits
/// `(s[8h+4c+1], s[8h+4c+3])`. `sc16` holds the 16 scales as i16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_pairs_16(sc16: __m256i) -> [__m256i; 4] {
    let b0 = _mm256_permute2x128_si256::<0x00>(sc16, sc16);
    let b1 = _mm256_permute2x128_si256::<0x11>(sc16, sc16);
    let m01 = _mm256_setr_epi8(
        0, 1, 4, 5, 0, 1, 4, 5, 0, 1, 4, 5, 0, 1, 4, 5, //
        2, 3, 6, 7, 2, 3, 6, 7, 2, 3, 6, 7, 2, 3, 6, 7,
    );
    let m23 = _mm256_setr_epi8(
        8, 9, 12, 13, 8, 9, 12, 13, 8, 9, 12, 13, 8, 9, 12, 13, //
        10, 11, 14, 15, 10, 11, 14, 15, 10, 11, 14, 15, 10, 11, 14, 15,
    );
    [
        _mm256_shuffle_epi8(b0, m01),
        _mm256_shuffle_epi8(b0, m23),
        _mm256_shuffle_epi8(b1, m01),
        _mm256_shuffle_epi8(b1, m23),
    ]
}

/// Q4_K and Q5_K share everything but the high bit; `qh` is `Some(offset)` for Q5_K.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q45_k_impl<const WB: usize, const QS: usize, const QH: usize, const HAS_QH: bool>(
    w: &[u8],
    a: &[u8],
    nb: usize,
) -> f32 {
    let perm = lane_pairs();
    let m4 = _mm256_set1_epi8(0x0f);
    let bit4 = _mm256_set1_epi8(0x10);
    let mut sums = _mm256_setzero_ps();
    let mut sumf = 0.0f32;
    for i in 0..nb {
        let x = &w[i * WB..(i + 1) * WB];
        let y = &a[i * BlockQ8K::BYTES..(i + 1) * BlockQ8K::BYTES];
        let (xp, yp) = (x.as_ptr(), y.as_ptr());
        let (sc, mn) = scales_mins_k4(&x[4..16]);
        let sumi = bsums_times_mins8(yp, mn);
        let s = scale_pairs_32(sc);
        let mut hv = if HAS_QH {
            _mm256_shuffle_epi8(ld256(xp.add(QH)), perm)
        } else {
            _mm256_setzero_si256()
        };
        let mut acc = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for (k, &s) in s.iter().enumerate() {
            let q = _mm256_shuffle_epi8(ld256(xp.add(QS + 32 * k)), perm);
            let mut lo = _mm256_and_si256(q, m4);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
            if HAS_QH {
                // Bit 2k of qh[l] is the fifth bit of sub-block 2k, bit 2k+1 of 2k+1.
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16::<4>(hv), bit4));
                hv = _mm256_srli_epi16::<1>(hv);
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16::<4>(hv), bit4));
                hv = _mm256_srli_epi16::<1>(hv);
            }
            let y0 = _mm256_shuffle_epi8(ld256(yp.add(Q8K_QS + 64 * k)), perm);
            let y1 = _mm256_shuffle_epi8(ld256(yp.add(Q8K_QS + 64 * k + 32)), perm);
            let p0 = _mm256_maddubs_epi16(lo, y0);
            let p1 = _mm256_maddubs_epi16(hi, y1);
            acc = scale_pairs(acc, p0, p1, s);
        }
        let yd = f32_at(y, 0);
        let (xd, xdmin) = f16x2_at(x, 0);
        let d = xd * yd;
        sums = lanes_update(sums, d, fold_lanes(acc.0, acc.1));
        let dmin = xdmin * yd;
        sumf -= dmin * sumi as f32;
    }
    for s in lanes_array(sums) {
        sumf += s;
    }
    sumf
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_k_impl(w: &[u8], a: &[u8], nb: usize) -> f32 {
    q45_k_impl::<{ BlockQ5K::BYTES }, 48, 16, true>(w, a, nb)
}

/// Q3_K's 16 six-bit scales (`q3_k::unpack_scales`) as 16 bytes, little-endian.
#[inline(always)]
fn q3_k_scales(s: &[u8]) -> (u64, u64) {
    let lo = u64::from_le_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]);
    let a2 = u32::from_le_bytes([s[8], s[9], s[10], s[11]]);
    let m2 = 0x0303_0303u32;
    let m4 = 0x0f0f_0f0f_0f0f_0f0fu64;
    // Scale j: low nibble from byte j (j < 8) or the high nibble of byte j - 8, top two
    // bits from bits 2*(j/4).. of byte 8 + j%4.
    let top_a = (a2 & m2) as u64 | (((a2 >> 2) & m2) as u64) << 32;
    let top_b = ((a2 >> 4) & m2) as u64 | (((a2 >> 6) & m2) as u64) << 32;
    ((lo & m4) | top_a << 4, ((lo >> 4) & m4) | top_b << 4)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3_k_impl(w: &[u8], a: &[u8], nb: usize) -> f32 {
    let perm = lane_pairs();
    let m3 = _mm256_set1_epi8(3);
    let one = _mm256_set1_epi8(1);
    let mut sums = _mm256_setzero_ps();
    for i in 0..nb {
        let x = &w[i * BlockQ3K::BYTES..(i + 1) * BlockQ3K::BYTES];
        let y = &a[i * BlockQ8K::BYTES..(i + 1) * BlockQ8K::BYTES];
        let (xp, yp) = (x.as_ptr(), y.as_ptr());
        // hmask at 0..32, qs at 32..96, scales at 96..108, d at 108.
        let (s_lo, s_hi) = q3_k_scales(&x[96..108]);
        let sc8 = _mm_set_epi64x(s_hi as i64, s_lo as i64);
        let sc16 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(sc8), _mm256_set1_epi16(32));
        let s = scale_pairs_16(sc16);
        let mut hm = _mm256_shuffle_epi8(ld256(xp), perm);
        let mut acc = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for h in 0..2 {
            let mut q = _mm256_shuffle_epi8(ld256(xp.add(32 + 32 * h)), perm);
            let mut p = [_mm256_setzero_si256(); 4];
            for (c, p) in p.iter_mut().enumerate() {
                // Element 128h + 32c + l: bits 2c.. of qs[32h + l], minus 4 unless bit
                // 4h + c of hmask[l] is set.
                let v = _mm256_and_si256(q, m3);
                q = _mm256_srli_epi16::<2>(q);
                let sub4 = _mm256_slli_epi16::<2>(_mm256_xor_si256(_mm256_and_si256(hm, one), one));
                hm = _mm256_srli_epi16::<1>(hm);
                let yv = _mm256_shuffle_epi8(ld256(yp.add(Q8K_QS + 128 * h + 32 * c)), perm);
                *p = _mm256_sub_epi16(_mm256_maddubs_epi16(v, yv), _mm256_maddubs_epi16(sub4, yv));
            }
            acc = scale_pairs(acc, p[0], p[1], s[2 * h]);
            acc = scale_pairs(acc, p[2], p[3], s[2 * h + 1]);
        }
        let d = f16_at(x, 108) * f32_at(y, 0);
        sums = lanes_update(sums, d, fold_lanes(acc.0, acc.1));
    }
    let mut sumf = 0.0f32;
    for s in lanes_array(sums) {
        sumf += s;
    }
    sumf
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2_k_impl(w: &[u8], a: &[u8], nb: usize) -> f32 {
    let m3 = _mm256_set1_epi8(3);
    let m4 = _mm_set1_epi8(0x0f);
    let mut sumf = 0.0f32;
    for i in 0..nb {
        let x = &w[i * BlockQ2K::BYTES..(i + 1) * BlockQ2K::BYTES];
        let y = &a[i * BlockQ8K::BYTES..(i + 1) * BlockQ8K::BYTES];
        let (xp, yp) = (x.as_ptr(), y.as_ptr());
        // scales at 0..16 (low nibble scale, high nibble min), qs at 16..80, d, dmin.
        let sc = ld128(xp);
        let mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(sc), m4));
        let summs = hsum_i32(_mm256_madd_epi16(ld256(yp.add(Q8K_BSUMS)), mins16));
        let scl = _mm256_broadcastsi128_si256(_mm_and_si128(sc, m4));
        let mut acc = _mm256_setzero_si256();
        for h in 0..2 {
            let mut q = ld256(xp.add(16 + 32 * h));
            for j in 0..4 {
                let v = _mm256_and_si256(q, m3);
                q = _mm256_srli_epi16::<2>(q);
                let yv = ld256(yp.add(Q8K_QS + 128 * h + 32 * j));
                // Sub-block 8h+2j covers the low 16 elements, 8h+2j+1 the high 16.
                let is = (8 * h + 2 * j) as i16;
                let pick = _mm256_set_m128i(
                    _mm_set1_epi16((is + 1) | (0x80u16 << 8) as i16),
                    _mm_set1_epi16(is | (0x80u16 << 8) as i16),
                );
                let scale = _mm256_shuffle_epi8(scl, pick);
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(v, yv), scale));
            }
        }
        let isum = hsum_i32(acc);
        let yd = f32_at(y, 0);
        let (xd, xdmin) = f16x2_at(x, 80);
        let dall = yd * xd;
        let dmin = yd * xdmin;
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

// ---------------------------------------------------------------------------------------
// f32 x f16 helpers for attention (see `crate::attn` for the summation order).

/// `attn::axpy_f16_scalar`, vectorised: `y[i] += alpha * x[i]` (multiply, then add).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn axpy_f16(y: &mut [f32], alpha: f32, x: &[f16]) {
    debug_assert_eq!(y.len(), x.len());
    let n = y.len();
    let (yp, xp) = (y.as_mut_ptr(), x.as_ptr().cast::<u8>());
    let va = _mm256_set1_ps(alpha);
    let mut i = 0;
    while i + 16 <= n {
        let x0 = _mm256_cvtph_ps(_mm_loadu_si128(xp.add(2 * i).cast()));
        let x1 = _mm256_cvtph_ps(_mm_loadu_si128(xp.add(2 * i + 16).cast()));
        let y0 = _mm256_add_ps(_mm256_loadu_ps(yp.add(i)), _mm256_mul_ps(va, x0));
        let y1 = _mm256_add_ps(_mm256_loadu_ps(yp.add(i + 8)), _mm256_mul_ps(va, x1));
        _mm256_storeu_ps(yp.add(i), y0);
        _mm256_storeu_ps(yp.add(i + 8), y1);
        i += 16;
    }
    while i + 8 <= n {
        let x0 = _mm256_cvtph_ps(_mm_loadu_si128(xp.add(2 * i).cast()));
        _mm256_storeu_ps(
            yp.add(i),
            _mm256_add_ps(_mm256_loadu_ps(yp.add(i)), _mm256_mul_ps(va, x0)),
        );
        i += 8;
    }
    for j in i..n {
        y[j] += alpha * x[j].to_f32();
    }
}

/// `attn::weighted_rows_f16_scalar`, vectorised: 32 output elements stay in registers while
/// every slot's row adds into them (multiply, then add, slot order), then the next 32.
///
/// # Safety
/// AVX2/FMA/F16C available; every `slots[s] * stride + offset + out.len() <= cache.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn weighted_rows_f16(
    out: &mut [f32],
    ps: &[f32],
    cache: &[f16],
    slots: &[usize],
    stride: usize,
    offset: usize,
) {
    let n = out.len();
    let cp = cache.as_ptr().cast::<u8>();
    let op = out.as_mut_ptr();
    let row = |s: usize| cp.add(2 * (slots[s] * stride + offset));
    let mut i = 0;
    while i + 32 <= n {
        let mut acc = [_mm256_setzero_ps(); 4];
        for (s, &p) in ps.iter().enumerate() {
            let r = row(s).add(2 * i);
            let pv = _mm256_set1_ps(p);
            for (k, acc) in acc.iter_mut().enumerate() {
                let v = _mm256_cvtph_ps(_mm_loadu_si128(r.add(16 * k).cast()));
                *acc = _mm256_add_ps(*acc, _mm256_mul_ps(pv, v));
            }
        }
        for (k, acc) in acc.iter().enumerate() {
            _mm256_storeu_ps(op.add(i + 8 * k), *acc);
        }
        i += 32;
    }
    while i + 8 <= n {
        let mut acc = _mm256_setzero_ps();
        for (s, &p) in ps.iter().enumerate() {
            let v = _mm256_cvtph_ps(_mm_loadu_si128(row(s).add(2 * i).cast()));
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(p), v));
        }
        _mm256_storeu_ps(op.add(i), acc);
        i += 8;
    }
    for j in i..n {
        let mut acc = 0.0f32;
        for (s, &p) in ps.iter().enumerate() {
            acc += p * (*row(s).add(2 * j).cast::<f16>()).to_f32();
        }
        *op.add(j) = acc;
    }
}

/// [`crate::ggml_math::dot_f16`] with ymm registers: same partial sums (the products of
/// f16 values are exact in f32, so FMA adds them exactly like the scalar multiply-add),
/// same reductions.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `a` and `b` must have equal lengths.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_f16_ggml(
    fl: crate::ggml_math::Flavor,
    ord: crate::ggml_math::F16Order,
    a: &[f32],
    b: &[f16],
) -> f32 {
    use crate::ggml_math::{hsum, F16Order};
    debug_assert_eq!(a.len(), b.len());
    let n = a.len();
    let lanes = fl.lanes();
    let regs = lanes / 8;
    let (pa, pb) = (a.as_ptr(), b.as_ptr().cast::<__m128i>());
    // SAFETY (all loads): every index read is below n.
    let ld = |i: usize| unsafe {
        (
            _mm256_loadu_ps(pa.add(i)),
            _mm256_cvtph_ps(_mm_loadu_si128(pb.cast::<u16>().add(i).cast())),
        )
    };
    match ord {
        F16Order::Gemm => {
            let mut acc = [_mm256_setzero_ps(); 2];
            let mut i = 0;
            while i + lanes <= n {
                for (h, acc) in acc.iter_mut().enumerate().take(regs) {
                    let (x, y) = ld(i + 8 * h);
                    *acc = _mm256_fmadd_ps(x, y, *acc);
                }
                i += lanes;
            }
            if i == n {
                // The halving tree: (l, l+8) for 16 lanes, then hsum_float_8's order.
                return hsum_ps(if regs == 2 {
                    _mm256_add_ps(acc[0], acc[1])
                } else {
                    acc[0]
                });
            }
            let mut l = [0.0f32; 16];
            _mm256_storeu_ps(l.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(l.as_mut_ptr().add(8), acc[1]);
            for k in i..n {
                l[k - i] += a[k] * b[k].to_f32();
            }
            hsum(fl, &mut l)
        }
        F16Order::VecDot => {
            let step = 4 * lanes;
            let np = n - n % step;
            let mut acc = [[_mm256_setzero_ps(); 2]; 4];
            let mut i = 0;
            while i < np {
                for (j, acc) in acc.iter_mut().enumerate() {
                    for (h, acc) in acc.iter_mut().enumerate().take(regs) {
                        let (x, y) = ld(i + j * lanes + 8 * h);
                        *acc = _mm256_fmadd_ps(x, y, *acc);
                    }
                }
                i += step;
            }
            // Fold the four accumulators (0+2, 1+3, 0+1), then reduce as ggml does.
            let mut f = [_mm256_setzero_ps(); 2];
            for (h, f) in f.iter_mut().enumerate().take(regs) {
                let a02 = _mm256_add_ps(acc[0][h], acc[2][h]);
                let a13 = _mm256_add_ps(acc[1][h], acc[3][h]);
                *f = _mm256_add_ps(a02, a13);
            }
            let r = if regs == 2 {
                hsum_ps(_mm256_add_ps(f[0], f[1]))
            } else {
                let t0 = _mm_add_ps(
                    _mm256_castps256_ps128(f[0]),
                    _mm256_extractf128_ps::<1>(f[0]),
                );
                let t1 = _mm_hadd_ps(t0, t0);
                _mm_cvtss_f32(_mm_hadd_ps(t1, t1))
            };
            let mut s = r as f64;
            for k in np..n {
                s += (a[k] * b[k].to_f32()) as f64;
            }
            s as f32
        }
    }
}
