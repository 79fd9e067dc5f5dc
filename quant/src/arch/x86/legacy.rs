//! The legacy 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) on AVX2, with an AVX-512
//! VNNI variant that forms the integer lanes with `vpdpbusd`. Twins: `q4_0::vec_dot_q8_0`
//! and the other formats' `vec_dot_*` in ggml's AVX2 order.

use core::arch::x86_64::*;

use super::simd::*;
use crate::contract::{check_tile, ActSide, TILE_MAX_TOKENS};
use crate::formats::common::{check_dot, Block};
use crate::formats::q4_0::BlockQ4_0;
use crate::formats::q4_1::BlockQ4_1;
use crate::formats::q5_0::BlockQ5_0;
use crate::formats::q5_1::BlockQ5_1;
use crate::formats::q8_0::BlockQ8_0;
use crate::formats::q8_1::BlockQ8_1;

// Legacy 32-element formats, one weight row against up to eight activation rows.
//
// Per block: the weight quants are unpacked once into 32 bytes; for signed weights the
// unsigned operand is |x| and each activation gets x's sign (`sign_epi8`), which is exact
// because activation quants are in -127..=127 (the `TileFn` contract); `maddubs` pairs
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

/// Dispatches a call to the `R x N` instantiation. Without VNNI (16 vector registers) two
/// weight rows take at most four activation rows at a time.
macro_rules! many_entry {
    ($name:ident, $ty:ident, $w:ty, $a:ty, $imp:ident, $wide:literal) => {
        pub(super) fn $name(
            w: &[u8],
            rows: usize,
            a: &[u8],
            stride: usize,
            side: ActSide<'_>,
            out: &mut [f32],
        ) {
            let k = check_tile::<$w, $a>(w, rows, a, stride, side, out.len());
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
                let mut tmp = [0.0f32; 2 * TILE_MAX_TOKENS];
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
                // SAFETY: handed out by `the kernel table` only after the features were
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
