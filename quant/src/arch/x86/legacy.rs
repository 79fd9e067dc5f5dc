//! The legacy 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and MXFP4 on AVX2, with an
//! AVX-512 VNNI variant that forms the integer lanes with `vpdpbusd` (and, for the exact
//! packed kernels of the 4- and 5-bit formats, the same in AVX-VNNI's VEX encoding).
//! Twins: `q4_0::vec_dot_q8_0` and the other formats' `vec_dot_*` in ggml's AVX2 order;
//! MXFP4's repacked order runs on the fast order's kernels (`mxfp4::vec_dot_q8_0_repacked`,
//! one integer sum and one FMA per block, is what they compute).

use core::arch::x86_64::*;

use super::simd::*;
use crate::contract::{check_tile, ActSide, TILE_MAX_TOKENS};
use crate::formats::common::{check_dot, Block};
use crate::formats::iq4_nl::{self, BlockIq4Nl};
use crate::formats::mxfp4::{self, BlockMxfp4};
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
    /// What `unpack_unsigned` adds to a signed format's quants (0 for the others).
    const OFFSET: i32;
    /// Quants are whole bytes (Q8_0), else nibbles.
    const EIGHT_BIT: bool = false;
    /// Quants have a fifth bit (Q5_0, Q5_1).
    const FIFTH_BIT: bool = false;
    /// The block scale is one E8M0 exponent byte (MXFP4, `2^(e - 128)`), not an f16.
    const E8M0: bool = false;
    /// The nibbles index a value table (MXFP4): `unpack` gives the table's signed values,
    /// `unpack_unsigned` and the packed registers the values plus `OFFSET`.
    const LUT: bool = false;
    /// With `LUT`: the table's values plus `OFFSET`, as bytes (what `unpack_unsigned`
    /// gives and the packed registers hold).
    const UNSIGNED_TABLE: [i8; 16] = [0; 16];
    /// llama.cpp's one-row order (MXFP4's `vec_dot`) sums even blocks into one set of
    /// float lanes and odd ones into another, added before the fold, and an unpaired
    /// last block after it (its whole integer sum times its scale, then added).
    const PAIRED: bool = false;
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

/// Q4_0 / Q5_0 / Q8_0 / MXFP4 / IQ4_NL with Q8_0 activations; Q4_1 / Q5_1 with Q8_1.
/// `Iq4NlRep` is IQ4_NL in llama.cpp's repacked order.
struct Q4_0;
struct Mxfp4;
struct Iq4Nl;
struct Iq4NlRep;
struct Q4_1;
struct Q5_0;
struct Q5_1;
struct Q8_0;

impl Legacy for Q4_0 {
    const WB: usize = BlockQ4_0::BYTES;
    const AB: usize = BlockQ8_0::BYTES;
    const A_QS: usize = 2;
    const SIGNED: bool = true;
    const OFFSET: i32 = 8;
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
    const OFFSET: i32 = 0;
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
    const OFFSET: i32 = 16;
    const FIFTH_BIT: bool = true;
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
    const OFFSET: i32 = 0;
    const FIFTH_BIT: bool = true;
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

/// A value table with `offset` added to every entry, as the bytes the unsigned kernels
/// take (`vpdpbusd`'s unsigned operand).
const fn offset_table(t: &[i8; 16], offset: i32) -> [i8; 16] {
    let mut u = [0i8; 16];
    let mut i = 0;
    while i < 16 {
        u[i] = (t[i] as i32 + offset) as u8 as i8;
        i += 1;
    }
    u
}

/// MXFP4's table values plus [`mxfp4::OFFSET`] (`0..=24`).
const MXFP4_UNSIGNED: [i8; 16] = offset_table(&mxfp4::KVALUES, mxfp4::OFFSET);

/// A 16-entry byte table in both 128-bit halves, for `vpshufb` on nibble indices.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn table16(t: &[i8; 16]) -> __m256i {
    _mm256_broadcastsi128_si256(_mm_loadu_si128(t.as_ptr().cast()))
}

impl Legacy for Mxfp4 {
    const WB: usize = BlockMxfp4::BYTES;
    const AB: usize = BlockQ8_0::BYTES;
    const A_QS: usize = 2;
    const SIGNED: bool = true;
    const OFFSET: i32 = mxfp4::OFFSET;
    const E8M0: bool = true;
    const LUT: bool = true;
    const UNSIGNED_TABLE: [i8; 16] = MXFP4_UNSIGNED;
    const PAIRED: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(w: *const u8) -> __m256i {
        _mm256_shuffle_epi8(table16(&mxfp4::KVALUES), nibbles32(w.add(1)))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack_unsigned(w: *const u8) -> __m256i {
        _mm256_shuffle_epi8(table16(&Self::UNSIGNED_TABLE), nibbles32(w.add(1)))
    }
}

/// IQ4_NL's table values plus [`iq4_nl::OFFSET`] (`1..=241`, as bytes), for the VNNI
/// kernels only: `vpdpbusd` sums its four products in 32 bits, where `maddubs` would
/// saturate a pair of them in 16.
const IQ4_NL_UNSIGNED: [i8; 16] = offset_table(&iq4_nl::KVALUES, iq4_nl::OFFSET);

/// IQ4_NL in ggml's one-row order (`vec_dot`: MXFP4's paired lanes). The AVX2 kernels
/// take the signed path (`|x|` times `y` signed like `x`: pairs of at most 2 x 127 x 127
/// fit `maddubs`'s 16 bits); the VNNI ones the unsigned one.
impl Legacy for Iq4Nl {
    const WB: usize = BlockIq4Nl::BYTES;
    const AB: usize = BlockQ8_0::BYTES;
    const A_QS: usize = 2;
    const SIGNED: bool = true;
    const OFFSET: i32 = iq4_nl::OFFSET;
    const LUT: bool = true;
    const UNSIGNED_TABLE: [i8; 16] = IQ4_NL_UNSIGNED;
    const PAIRED: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(w: *const u8) -> __m256i {
        _mm256_shuffle_epi8(table16(&iq4_nl::KVALUES), nibbles32(w.add(2)))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack_unsigned(w: *const u8) -> __m256i {
        _mm256_shuffle_epi8(table16(&Self::UNSIGNED_TABLE), nibbles32(w.add(2)))
    }
}

/// IQ4_NL in llama.cpp's repacked order (one integer sum per block): the fast order's
/// kernels (`iq4_nl::vec_dot_q8_0_repacked` is what they compute).
impl Legacy for Iq4NlRep {
    const WB: usize = BlockIq4Nl::BYTES;
    const AB: usize = BlockQ8_0::BYTES;
    const A_QS: usize = 2;
    const SIGNED: bool = true;
    const OFFSET: i32 = iq4_nl::OFFSET;
    const LUT: bool = true;
    const UNSIGNED_TABLE: [i8; 16] = IQ4_NL_UNSIGNED;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(w: *const u8) -> __m256i {
        Iq4Nl::unpack(w)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack_unsigned(w: *const u8) -> __m256i {
        Iq4Nl::unpack_unsigned(w)
    }
}

/// `2^(e - 128)` (`mxfp4::e8m0_to_f32_half`) of the exponent byte in each i32 lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn e8m0_half8(e: __m256i) -> __m256 {
    let normal = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, _mm256_set1_epi32(1)));
    let subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
    let is_normal = _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1));
    _mm256_castsi256_ps(_mm256_blendv_epi8(subnormal, normal, is_normal))
}

/// A weight block's scale field as 16 bits: the f16's, or MXFP4's exponent byte.
///
/// # Safety
/// `wb` points to a whole weight block.
#[inline(always)]
unsafe fn scale_field<T: Legacy>(wb: *const u8) -> u16 {
    if T::E8M0 {
        u16::from(*wb)
    } else {
        wb.cast::<u16>().read_unaligned().to_le()
    }
}

/// Eight scale fields (as [`scale_field`] gives them) widened to f32, exactly.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen8<T: Legacy>(h: __m128i) -> __m256 {
    if T::E8M0 {
        e8m0_half8(_mm256_cvtepu16_epi32(h))
    } else {
        _mm256_cvtph_ps(h)
    }
}

/// The first four of eight scale fields widened to f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen4<T: Legacy>(h: __m128i) -> __m128 {
    if T::E8M0 {
        _mm256_castps256_ps128(widen8::<T>(h))
    } else {
        _mm_cvtph_ps(h)
    }
}

/// Decode's prefetch of the block of a packed group at `p`: its lines 1 KiB ahead for the
/// 32-element formats; for MXFP4, whose expert matrices a decode step streams from
/// memory as the K-quants' weights, at the distance `kernels::decode_prefetch` says (the
/// runtime's tuned one, 8 KiB by default). Streaming 24 matrices of 2880 x 2880 on one
/// thread (a Zen 3 VM shared with other work, plain read 9-10 GB/s) went from about 6 to
/// 7-8 GB/s with 4-8 KiB.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn prefetch_packed<T: Legacy>(p: *const u8) {
    if T::E8M0 {
        prefetch_lines(p.wrapping_add(crate::kernels::decode_prefetch()), 8 * T::WB)
    } else {
        prefetch_block(p, 8 * T::WB)
    }
}

/// Bytes before the quants in a block of a packed group: the eight rows' scale fields
/// (and mins).
const fn packed_head<T: Legacy>() -> usize {
    if T::E8M0 {
        8
    } else if T::SIGNED {
        16
    } else {
        32
    }
}

/// The eight rows' scale fields at the start of a block of a packed group, as
/// [`scale_field`] gives them.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn packed_scales<T: Legacy>(p: *const u8) -> __m128i {
    if T::E8M0 {
        _mm_cvtepu8_epi16(_mm_loadl_epi64(p.cast()))
    } else {
        ld128(p)
    }
}

impl Legacy for Q8_0 {
    const WB: usize = BlockQ8_0::BYTES;
    const AB: usize = BlockQ8_0::BYTES;
    const A_QS: usize = 2;
    const SIGNED: bool = true;
    const OFFSET: i32 = 128;
    const EIGHT_BIT: bool = true;
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
            // `PAIRED` only: the odd blocks' lanes, and an unpaired last block's scale
            // product and integer sum.
            let mut acc_odd = [[_mm256_setzero_ps(); N]; R];
            let mut tail = [[(0.0f32, 0i32); N]; R];
            let paired = if T::PAIRED { nb - nb % 2 } else { nb };
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
                    if T::E8M0 {
                        dx[r] = _mm256_set1_ps(mxfp4::e8m0_to_f32_half(*wb));
                    } else {
                        let wd = _mm_cvtph_ps(_mm_cvtsi32_si128(
                            wb.cast::<u32>().read_unaligned().to_le() as i32,
                        ));
                        dx[r] = _mm256_broadcastss_ps(wd);
                        mx[r] = _mm_cvtss_f32(_mm_movehdup_ps(wd));
                    }
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
                        let d = _mm256_mul_ps(dx[r], dy);
                        if T::PAIRED && i >= paired {
                            tail[r][c] = (_mm256_cvtss_f32(d), hsum_i32(isum));
                        } else if T::PAIRED && i % 2 == 1 {
                            let p = _mm256_cvtepi32_ps(isum);
                            acc_odd[r][c] = _mm256_fmadd_ps(d, p, acc_odd[r][c]);
                        } else {
                            let p = _mm256_cvtepi32_ps(isum);
                            acc[r][c] = _mm256_fmadd_ps(d, p, acc[r][c]);
                        }
                        if !T::SIGNED {
                            summs[r][c] = mx[r].mul_add(sy, summs[r][c]);
                        }
                    }
                }
            }
            for r in 0..R {
                for c in 0..N {
                    let h = if T::PAIRED {
                        let h = hsum_ps(_mm256_add_ps(acc[r][c], acc_odd[r][c]));
                        let (d, sumi) = tail[r][c];
                        if paired < nb {
                            h + d * sumi as f32
                        } else {
                            h
                        }
                    } else {
                        hsum_ps(acc[r][c])
                    };
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

many_entry!(mxfp4_many, Mxfp4, BlockMxfp4, BlockQ8_0, legacy_avx2, false);
many_entry!(
    mxfp4_many_vnni,
    Mxfp4,
    BlockMxfp4,
    BlockQ8_0,
    legacy_vnni,
    true
);

many_entry!(
    iq4_nl_many,
    Iq4Nl,
    BlockIq4Nl,
    BlockQ8_0,
    legacy_avx2,
    false
);
many_entry!(
    iq4_nl_many_vnni,
    Iq4Nl,
    BlockIq4Nl,
    BlockQ8_0,
    legacy_vnni,
    true
);

single_from_many!(q4_0_q8_0, BlockQ4_0, BlockQ8_0, q4_0_many);
single_from_many!(iq4_nl_q8_0, BlockIq4Nl, BlockQ8_0, iq4_nl_many);
single_from_many!(iq4_nl_q8_0_vnni, BlockIq4Nl, BlockQ8_0, iq4_nl_many_vnni);
single_from_many!(iq4_nl_rep, BlockIq4Nl, BlockQ8_0, iq4_nl_rep_many);
single_from_many!(iq4_nl_rep_vnni, BlockIq4Nl, BlockQ8_0, iq4_nl_rep_many_vnni);
single_from_many!(mxfp4_q8_0, BlockMxfp4, BlockQ8_0, mxfp4_many);
single_from_many!(mxfp4_q8_0_vnni, BlockMxfp4, BlockQ8_0, mxfp4_many_vnni);
single_from_many!(q4_1_q8_1, BlockQ4_1, BlockQ8_1, q4_1_many);
single_from_many!(q5_0_q8_0, BlockQ5_0, BlockQ8_0, q5_0_many);
single_from_many!(q5_1_q8_1, BlockQ5_1, BlockQ8_1, q5_1_many);
single_from_many!(q8_0_q8_0, BlockQ8_0, BlockQ8_0, q8_0_many);
single_from_many!(q4_0_q8_0_vnni, BlockQ4_0, BlockQ8_0, q4_0_many_vnni);
single_from_many!(q4_1_q8_1_vnni, BlockQ4_1, BlockQ8_1, q4_1_many_vnni);
single_from_many!(q5_0_q8_0_vnni, BlockQ5_0, BlockQ8_0, q5_0_many_vnni);
single_from_many!(q5_1_q8_1_vnni, BlockQ5_1, BlockQ8_1, q5_1_many_vnni);
single_from_many!(q8_0_q8_0_vnni, BlockQ8_0, BlockQ8_0, q8_0_many_vnni);

// The fast order (`DotOrder::Fast`): eight weight rows at a time, one row per register
// lane. Each block of the eight rows is unpacked once and transposed (register `k` holds
// elements 4k..4k+4 of every row), then each token needs only eight integer products with
// its broadcast 4-byte groups, one conversion and one FMA for all eight rows. The integer
// sum of a block is exact however it is formed, so every instantiation (and the scalar
// twin `dot_q8_0_fast` / `dot_q8_1_fast`) gives the same bits.

/// How the exact integer block sums are formed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FastInt {
    /// `vpdpbusd` on unsigned weights (signed formats: `q + offset`, corrected by the
    /// offset sums).
    Vnni,
    /// `maddubs` on unsigned weights of at most 31, four products summed in i16 before
    /// widening (at most 4 * 2 * 31 * 127 = 31496, no saturation).
    Avx2Small,
    /// `maddubs` on `|q|` with the activation given q's sign (Q8_0 without VNNI).
    Avx2Sign,
}

/// Transposes eight vectors of eight dwords: lane `r` of output `k` is lane `k` of input
/// `r`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn transpose8x8(v: &[__m256i; 8]) -> [__m256i; 8] {
    let t0 = _mm256_unpacklo_epi32(v[0], v[1]);
    let t1 = _mm256_unpackhi_epi32(v[0], v[1]);
    let t2 = _mm256_unpacklo_epi32(v[2], v[3]);
    let t3 = _mm256_unpackhi_epi32(v[2], v[3]);
    let t4 = _mm256_unpacklo_epi32(v[4], v[5]);
    let t5 = _mm256_unpackhi_epi32(v[4], v[5]);
    let t6 = _mm256_unpacklo_epi32(v[6], v[7]);
    let t7 = _mm256_unpackhi_epi32(v[6], v[7]);
    let u0 = _mm256_unpacklo_epi64(t0, t2);
    let u1 = _mm256_unpackhi_epi64(t0, t2);
    let u2 = _mm256_unpacklo_epi64(t1, t3);
    let u3 = _mm256_unpackhi_epi64(t1, t3);
    let u4 = _mm256_unpacklo_epi64(t4, t6);
    let u5 = _mm256_unpackhi_epi64(t4, t6);
    let u6 = _mm256_unpacklo_epi64(t5, t7);
    let u7 = _mm256_unpackhi_epi64(t5, t7);
    [
        _mm256_permute2x128_si256::<0x20>(u0, u4),
        _mm256_permute2x128_si256::<0x20>(u1, u5),
        _mm256_permute2x128_si256::<0x20>(u2, u6),
        _mm256_permute2x128_si256::<0x20>(u3, u7),
        _mm256_permute2x128_si256::<0x31>(u0, u4),
        _mm256_permute2x128_si256::<0x31>(u1, u5),
        _mm256_permute2x128_si256::<0x31>(u2, u6),
        _mm256_permute2x128_si256::<0x31>(u3, u7),
    ]
}

/// `-offset * Σ y` of one activation block, for calls without precomputed offset sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn neg_offset_sum(yq: *const u8, off: i32) -> i32 {
    let y = ld256(yq);
    let s = _mm256_madd_epi16(
        _mm256_maddubs_epi16(_mm256_set1_epi8(1), y),
        _mm256_set1_epi16(1),
    );
    -off * hsum_i32(s)
}

/// The eight transposed quant registers of one block of a packed group
/// (`crate::formats::packed`), `q` at its quants: Q8_0's signed bytes, the other formats'
/// unsigned stored values (MXFP4's table values plus its offset).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn packed_regs<T: Legacy>(q: *const u8) -> [__m256i; 8] {
    let mut t = [_mm256_setzero_si256(); 8];
    if T::EIGHT_BIT {
        for (k, t) in t.iter_mut().enumerate() {
            *t = ld256(q.add(32 * k));
        }
        return t;
    }
    let m4 = _mm256_set1_epi8(0x0f);
    for v in 0..4 {
        let x = ld256(q.add(32 * v));
        t[2 * v] = _mm256_and_si256(x, m4);
        t[2 * v + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(x), m4);
    }
    if T::LUT {
        let table = table16(&T::UNSIGNED_TABLE);
        for t in &mut t {
            *t = _mm256_shuffle_epi8(table, *t);
        }
    }
    if T::FIFTH_BIT {
        // Bit k of each byte is register k's fifth bit.
        let h = ld256(q.add(128));
        for (k, t) in t.iter_mut().enumerate() {
            *t = _mm256_or_si256(*t, bit_to_4(h, k));
        }
    }
    t
}

/// Blocks of eight rows unpacked and transposed at a time into the kernel's stack scratch
/// (8 KiB of quants): every token of the call then reads them from L1.
const FAST_CHUNK: usize = 32;

/// Four activation bytes broadcast to every dword lane, as one load (the compiler would
/// otherwise merge neighbouring loads into one vector load and shuffle it apart).
/// Compiled with AVX2 even in a baseline build (the fuzz targets' own RUSTFLAGS), where a
/// `ymm` register would otherwise be refused.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn bcast4(p: *const u8) -> __m256i {
    let v: __m256i;
    core::arch::asm!(
        "vpbroadcastd {v}, dword ptr [{p}]",
        p = in(reg) p,
        v = out(ymm_reg) v,
        options(pure, readonly, nostack, preserves_flags)
    );
    v
}

/// One fast-order tile call, validated by `check_tile_rows`: `rows` (1..=8) weight rows
/// of `nb` blocks `wstride` bytes apart at `w`; `n` activation rows `stride` bytes apart at
/// `a`; activation block scales as f32 at `ad` when `ad_stride > 0`; one offset sum per
/// activation block at `sums` (rows `nb` apart) when `use_sums`; `rows * n` results at
/// `out` (`out[r * n + c]`).
#[derive(Clone, Copy)]
struct FastCall {
    w: *const u8,
    wstride: usize,
    rows: usize,
    a: *const u8,
    stride: usize,
    n: usize,
    ad: *const f32,
    ad_stride: usize,
    sums: *const i32,
    use_sums: bool,
    nb: usize,
    out: *mut f32,
    /// Result (r, c) goes to `out[r * out_row + c * out_col]`.
    out_row: usize,
    out_col: usize,
}

/// Token `c`'s block `i` scale and (Q8_1) sum, as f32: from the side scales where the
/// call has them, else from the activation block at `ab` (its first two f16 fields; the
/// sum is 0 for the signed formats, whose activations have none).
///
/// # Safety
/// Token `c` and block `i` of a validated call; `ab` that block; F16C available.
#[inline(always)]
unsafe fn act_scales<T: Legacy>(f: &FastCall, c: usize, i: usize, ab: *const u8) -> (f32, f32) {
    if f.ad_stride > 0 {
        let q =
            f.ad.add(c * f.ad_stride + i * if T::SIGNED { 1 } else { 2 });
        (*q, if T::SIGNED { 0.0 } else { *q.add(1) })
    } else {
        let v = _mm_cvtph_ps(_mm_cvtsi32_si128(
            ab.cast::<u32>().read_unaligned().to_le() as i32
        ));
        let sy = if T::SIGNED {
            0.0
        } else {
            _mm_cvtss_f32(_mm_movehdup_ps(v))
        };
        (_mm_cvtss_f32(v), sy)
    }
}

/// Weight rows the decode kernels read together.
const DECODE_ROWS: usize = 2;

macro_rules! legacy_fast {
    ($name:ident, $dec:ident, $feat:literal, $int:expr) => {
        /// # Safety
        /// The features named are available; `w` holds `rows` (1..=8) weight rows of `nb`
        /// blocks, `wstride` bytes apart; `a` holds `n` activation rows of `nb` blocks,
        /// `stride` bytes apart; `out` has `rows * n` slots. `ad` (when `ad_stride > 0`)
        /// holds the activation block scales as f32, `sums` (when `use_sums`) one offset
        /// sum per activation block (`fast_offset_sums`), rows `nb` apart.
        #[target_feature(enable = $feat)]
        unsafe fn $name<T: Legacy, const PACKED: bool>(f: FastCall) {
            let FastCall {
                w,
                wstride,
                rows,
                a,
                stride,
                n,
                sums,
                use_sums,
                nb,
                out,
                out_row,
                out_col,
                ..
            } = f;
            const INT: FastInt = $int;
            let sign_trick = INT == FastInt::Avx2Sign;
            let mut acc_m =
                core::mem::MaybeUninit::<[__m256; crate::contract::FAST_TILE_TOKENS]>::uninit();
            let acc = init_prefix(&mut acc_m, n, _mm256_setzero_ps());
            // One block of the eight rows, as the products want it: the transposed quants
            // (|q| with the sign trick), their signs, the rows' scales and mins.
            let block = |i: usize| -> ([__m256i; 8], [__m256i; 8], __m256, __m256) {
                let (t, dh, mh) = if PACKED {
                    // SAFETY (this closure): block i of the group is inside `w`.
                    let p = w.add(i * 8 * T::WB);
                    if n <= 2 {
                        prefetch_packed::<T>(p);
                    }
                    let mut t = packed_regs::<T>(p.add(packed_head::<T>()));
                    if T::EIGHT_BIT != sign_trick {
                        // Stored signed (Q8_0) but wanted unsigned, or the reverse.
                        for x in &mut t {
                            *x = if T::EIGHT_BIT {
                                _mm256_xor_si256(*x, _mm256_set1_epi8(0x80u8 as i8))
                            } else {
                                _mm256_sub_epi8(*x, _mm256_set1_epi8(T::OFFSET as i8))
                            };
                        }
                    }
                    (
                        t,
                        packed_scales::<T>(p),
                        if T::SIGNED {
                            _mm_setzero_si128()
                        } else {
                            ld128(p.add(16))
                        },
                    )
                } else {
                    let mut v = [_mm256_setzero_si256(); 8];
                    let mut dh = [0u16; 8];
                    let mut mh = [0u16; 8];
                    for (r, v) in v.iter_mut().enumerate() {
                        // Missing rows repeat row 0; their lanes are never stored.
                        let rr = if r < rows { r } else { 0 };
                        let wb = w.add(rr * wstride + i * T::WB);
                        if n <= 2 {
                            _mm_prefetch::<_MM_HINT_T0>(wb.wrapping_add(PREFETCH).cast());
                        }
                        *v = if sign_trick {
                            T::unpack(wb)
                        } else {
                            T::unpack_unsigned(wb)
                        };
                        dh[r] = scale_field::<T>(wb);
                        if !T::SIGNED {
                            mh[r] = wb.add(2).cast::<u16>().read_unaligned().to_le();
                        }
                    }
                    (
                        transpose8x8(&v),
                        _mm_loadu_si128(dh.as_ptr().cast()),
                        _mm_loadu_si128(mh.as_ptr().cast()),
                    )
                };
                let dx = widen8::<T>(dh);
                let mx = if T::SIGNED {
                    _mm256_setzero_ps()
                } else {
                    _mm256_cvtph_ps(mh)
                };
                if sign_trick {
                    (t.map(|x| _mm256_sign_epi8(x, x)), t, dx, mx)
                } else {
                    (t, t, dx, mx)
                }
            };
            // Token c's product with block i of the eight rows, added into `acc_c`.
            // Where token c's block i starts, and the integer sum's starting value there
            // (minus the offset times the activation sum where the signed formats' quants
            // enter unsigned without the sign trick).
            let act = |c: usize, i: usize| -> (*const u8, i32) {
                // SAFETY (this closure): token c < n, block i < nb of the checked call.
                let ab = a.add(c * stride + i * T::AB);
                let init = if !T::SIGNED || sign_trick {
                    0
                } else if use_sums {
                    *sums.add(c * nb + i)
                } else {
                    neg_offset_sum(ab.add(T::A_QS), T::OFFSET)
                };
                (ab, init)
            };
            // Token c's block i folded into `acc_c`: its exact integer sum `isum` times
            // the scales, plus the mins term for the unsigned formats.
            let fold = |c: usize, i: usize, ab: *const u8, isum: __m256i, dx, mx, acc_c| {
                // SAFETY (this closure): as `act`.
                let (dy, sy) = act_scales::<T>(&f, c, i, ab);
                let d = _mm256_mul_ps(dx, _mm256_set1_ps(dy));
                let mut acc_c = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), acc_c);
                if !T::SIGNED {
                    acc_c = _mm256_fmadd_ps(mx, _mm256_set1_ps(sy), acc_c);
                }
                acc_c
            };
            // Token c's product with block i of the eight rows, added into `acc_c`.
            let product = |c: usize,
                           i: usize,
                           t: &[__m256i; 8],
                           ts: &[__m256i; 8],
                           dx: __m256,
                           mx: __m256,
                           acc_c: __m256|
             -> __m256 {
                let (ab, init) = act(c, i);
                let yq = ab.add(T::A_QS);
                let isum = match INT {
                    FastInt::Vnni => {
                        let mut s0 = _mm256_set1_epi32(init);
                        let mut s1 = _mm256_setzero_si256();
                        for k in (0..8).step_by(2) {
                            s0 = fast_dpbusd_vnni(s0, t[k], bcast4(yq.add(4 * k)));
                            s1 = fast_dpbusd_vnni(s1, t[k + 1], bcast4(yq.add(4 * k + 4)));
                        }
                        _mm256_add_epi32(s0, s1)
                    }
                    FastInt::Avx2Small => {
                        let ones = _mm256_set1_epi16(1);
                        let mut s = _mm256_set1_epi32(init);
                        for g in 0..2 {
                            let k = 4 * g;
                            let m = |k: usize| _mm256_maddubs_epi16(t[k], bcast4(yq.add(4 * k)));
                            let p = _mm256_add_epi16(
                                _mm256_add_epi16(m(k), m(k + 1)),
                                _mm256_add_epi16(m(k + 2), m(k + 3)),
                            );
                            s = _mm256_add_epi32(s, _mm256_madd_epi16(p, ones));
                        }
                        s
                    }
                    FastInt::Avx2Sign => {
                        let ones = _mm256_set1_epi16(1);
                        let mut s = _mm256_setzero_si256();
                        for k in 0..8 {
                            let y = _mm256_sign_epi8(bcast4(yq.add(4 * k)), ts[k]);
                            s = _mm256_add_epi32(
                                s,
                                _mm256_madd_epi16(_mm256_maddubs_epi16(t[k], y), ones),
                            );
                        }
                        s
                    }
                };
                fold(c, i, ab, isum, dx, mx, acc_c)
            };
            if PACKED && n <= 2 {
                // Decode from packed rows: one stream, nothing to stage.
                for i in 0..nb {
                    let (t, ts, dx, mx) = block(i);
                    for (c, acc) in acc.iter_mut().enumerate().take(n) {
                        *acc = product(c, i, &t, &ts, dx, mx, *acc);
                    }
                }
            } else {
                // Transposed quants (|q| with the sign trick), their signs, scales and mins
                // of one chunk of blocks. Uninitialized: zeroing 16 KiB per call would cost
                // more than a few tokens' products. Entries 0..nc are written (through raw
                // pointers) before any is read.
                let mut tq_m = core::mem::MaybeUninit::<[[__m256i; 8]; FAST_CHUNK]>::uninit();
                let mut ts_m = core::mem::MaybeUninit::<[[__m256i; 8]; FAST_CHUNK]>::uninit();
                let mut dxs_m = core::mem::MaybeUninit::<[__m256; FAST_CHUNK]>::uninit();
                let mut ms_m = core::mem::MaybeUninit::<[__m256; FAST_CHUNK]>::uninit();
                let tq = tq_m.as_mut_ptr().cast::<[__m256i; 8]>();
                let ts = ts_m.as_mut_ptr().cast::<[__m256i; 8]>();
                let dxs = dxs_m.as_mut_ptr().cast::<__m256>();
                let ms = ms_m.as_mut_ptr().cast::<__m256>();
                let mut i0 = 0;
                while i0 < nb {
                    let nc = (nb - i0).min(FAST_CHUNK);
                    for j in 0..nc {
                        let (t, s, dx, mx) = block(i0 + j);
                        tq.add(j).write(t);
                        if sign_trick {
                            ts.add(j).write(s);
                        }
                        dxs.add(j).write(dx);
                        ms.add(j).write(mx);
                    }
                    // With VNNI, four tokens per pass over the chunk: each staged weight
                    // register is loaded once for four `vpdpbusd` instead of one (the
                    // pass was bound by loads). Every token's integer sums are exact and
                    // its float operations are the one-token sequence: the same bits.
                    let mut c0 = 0;
                    if INT == FastInt::Vnni {
                        while c0 + 4 <= n {
                            let mut acc4: [__m256; 4] = arr(|q| acc[c0 + q]);
                            for j in 0..nc {
                                let i = i0 + j;
                                // SAFETY: entry j < nc was written above.
                                let t = &*tq.add(j);
                                let ai: [(*const u8, i32); 4] = arr(|q| act(c0 + q, i));
                                let mut s0 = ai.map(|(_, init)| _mm256_set1_epi32(init));
                                let mut s1 = [_mm256_setzero_si256(); 4];
                                for k in (0..8).step_by(2) {
                                    for q in 0..4 {
                                        let yq = ai[q].0.add(T::A_QS);
                                        s0[q] =
                                            fast_dpbusd_vnni(s0[q], t[k], bcast4(yq.add(4 * k)));
                                        s1[q] = fast_dpbusd_vnni(
                                            s1[q],
                                            t[k + 1],
                                            bcast4(yq.add(4 * k + 4)),
                                        );
                                    }
                                }
                                for q in 0..4 {
                                    let isum = _mm256_add_epi32(s0[q], s1[q]);
                                    acc4[q] = fold(
                                        c0 + q,
                                        i,
                                        ai[q].0,
                                        isum,
                                        *dxs.add(j),
                                        *ms.add(j),
                                        acc4[q],
                                    );
                                }
                            }
                            acc[c0..c0 + 4].copy_from_slice(&acc4);
                            c0 += 4;
                        }
                    }
                    for (c, acc) in acc.iter_mut().enumerate().take(n).skip(c0) {
                        let mut acc_c = *acc;
                        for j in 0..nc {
                            // SAFETY: entry j < nc was written above (`ts` only read with
                            // the sign trick, which wrote it).
                            let t = &*tq.add(j);
                            let s = if sign_trick { &*ts.add(j) } else { t };
                            acc_c = product(c, i0 + j, t, s, *dxs.add(j), *ms.add(j), acc_c);
                        }
                        *acc = acc_c;
                    }
                    i0 += nc;
                }
            }
            for (c, acc) in acc.iter().enumerate().take(n) {
                if rows == 8 && out_row == 1 {
                    _mm256_storeu_ps(out.add(c * out_col), *acc);
                    continue;
                }
                let mut l = [0.0f32; 8];
                _mm256_storeu_ps(l.as_mut_ptr(), *acc);
                for (r, &v) in l.iter().enumerate().take(rows) {
                    *out.add(r * out_row + c * out_col) = v;
                }
            }
        }

        /// The same products for one or two tokens (decode), four weight rows at a time
        /// so that only four rows stream from memory together: each row's block is
        /// multiplied whole and the four lane vectors are folded into one (exact
        /// integers, so the same bits as the transposed kernel).
        ///
        /// # Safety
        /// As the transposed kernel, with `n` at most 2.
        #[target_feature(enable = $feat)]
        unsafe fn $dec<T: Legacy>(f: FastCall) {
            let FastCall {
                w,
                wstride,
                rows,
                a,
                stride,
                n,
                sums,
                use_sums,
                nb,
                out,
                out_row,
                out_col,
                ..
            } = f;
            const INT: FastInt = $int;
            let ones = _mm256_set1_epi16(1);
            let mut r0 = 0;
            while r0 < rows {
                let nr = (rows - r0).min(DECODE_ROWS);
                let mut acc = [_mm_setzero_ps(); 2];
                for i in 0..nb {
                    let mut u = [_mm256_setzero_si256(); 4];
                    let mut dh = [0u16; 4];
                    let mut mh = [0u16; 4];
                    for (q, u) in u.iter_mut().enumerate().take(DECODE_ROWS) {
                        let rr = r0 + if q < nr { q } else { 0 };
                        let wb = w.add(rr * wstride + i * T::WB);
                        _mm_prefetch::<_MM_HINT_T0>(wb.wrapping_add(PREFETCH).cast());
                        *u = if INT == FastInt::Avx2Sign {
                            T::unpack(wb)
                        } else {
                            T::unpack_unsigned(wb)
                        };
                        dh[q] = scale_field::<T>(wb);
                        if !T::SIGNED {
                            mh[q] = wb.add(2).cast::<u16>().read_unaligned().to_le();
                        }
                    }
                    let dx = widen4::<T>(_mm_loadl_epi64(dh.as_ptr().cast()));
                    let mx = _mm_cvtph_ps(_mm_loadl_epi64(mh.as_ptr().cast()));
                    for (c, acc) in acc.iter_mut().enumerate().take(n) {
                        let ab = a.add(c * stride + i * T::AB);
                        let yq = ab.add(T::A_QS);
                        let y = ld256(yq);
                        let mut p = [_mm256_setzero_si256(); 4];
                        for (q, p) in p.iter_mut().enumerate().take(DECODE_ROWS) {
                            *p = match INT {
                                FastInt::Vnni => fast_dpbusd_vnni(_mm256_setzero_si256(), u[q], y),
                                FastInt::Avx2Small => {
                                    _mm256_madd_epi16(_mm256_maddubs_epi16(u[q], y), ones)
                                }
                                FastInt::Avx2Sign => _mm256_madd_epi16(
                                    _mm256_maddubs_epi16(
                                        _mm256_sign_epi8(u[q], u[q]),
                                        _mm256_sign_epi8(y, u[q]),
                                    ),
                                    ones,
                                ),
                            };
                        }
                        // Fold: lane q of the result is the sum of p[q]'s eight lanes.
                        let h = _mm256_hadd_epi32(
                            _mm256_hadd_epi32(p[0], p[1]),
                            _mm256_hadd_epi32(p[2], p[3]),
                        );
                        let mut s4 = _mm_add_epi32(
                            _mm256_castsi256_si128(h),
                            _mm256_extracti128_si256::<1>(h),
                        );
                        if T::SIGNED && INT != FastInt::Avx2Sign {
                            let init = if use_sums {
                                *sums.add(c * nb + i)
                            } else {
                                neg_offset_sum(yq, T::OFFSET)
                            };
                            s4 = _mm_add_epi32(s4, _mm_set1_epi32(init));
                        }
                        let (dy, sy) = act_scales::<T>(&f, c, i, ab);
                        let d = _mm_mul_ps(dx, _mm_set1_ps(dy));
                        *acc = _mm_fmadd_ps(d, _mm_cvtepi32_ps(s4), *acc);
                        if !T::SIGNED {
                            *acc = _mm_fmadd_ps(mx, _mm_set1_ps(sy), *acc);
                        }
                    }
                }
                for (c, acc) in acc.iter().enumerate().take(n) {
                    let mut l = [0.0f32; 4];
                    _mm_storeu_ps(l.as_mut_ptr(), *acc);
                    for (q, &v) in l.iter().enumerate().take(nr) {
                        *out.add((r0 + q) * out_row + c * out_col) = v;
                    }
                }
                r0 += nr;
            }
        }
    };
}

/// `vpdpbusd` where the kernel has VNNI; never reached from the AVX2 instantiations.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn fast_dpbusd_vnni(s: __m256i, u: __m256i, y: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(s, u, y)
}

/// The same instruction in AVX-VNNI's VEX encoding (CPUs without AVX-512).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn dpbusd_vex(s: __m256i, u: __m256i, y: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(s, u, y)
}

legacy_fast!(
    fast_avx2_small,
    fast_avx2_small_decode,
    "avx2,fma,f16c",
    FastInt::Avx2Small
);
legacy_fast!(
    fast_avx2_sign,
    fast_avx2_sign_decode,
    "avx2,fma,f16c",
    FastInt::Avx2Sign
);
legacy_fast!(
    fast_vnni,
    fast_vnni_decode,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    FastInt::Vnni
);

/// Dispatches a fast-order tile call to the instantiation for its token count.
/// Validates a fast-order tile call and runs the kernel for its token count, results
/// to `out[r * out_row + c * out_col]`.
///
/// # Safety
/// The kernels' features are available; every result slot is valid for writes and
/// written by nobody else during the call.
#[allow(clippy::too_many_arguments)]
unsafe fn fast_call<W: Block, A: Block>(
    wa: (&[u8], usize, &[u8], usize),
    side: ActSide<'_>,
    n: usize,
    out: (*mut f32, usize, usize),
    sums: bool,
    imp: unsafe fn(FastCall),
    dec: Option<unsafe fn(FastCall)>,
) {
    fast_call_rows::<W, A>(8, wa, side, n, out, usize::from(sums), imp, dec)
}

/// [`fast_call`] for kernels of up to `max_rows` weight rows that read `sums` offset sums
/// per activation block (0: none; 1: the fast order's per-block sum; 8: llama.cpp's
/// order's per-lane sums).
///
/// # Safety
/// As [`fast_call`].
#[allow(clippy::too_many_arguments)]
unsafe fn fast_call_rows<W: Block, A: Block>(
    max_rows: usize,
    (w, rows, a, stride): (&[u8], usize, &[u8], usize),
    side: ActSide<'_>,
    n: usize,
    (out, out_row, out_col): (*mut f32, usize, usize),
    sums: usize,
    imp: unsafe fn(FastCall),
    dec: Option<unsafe fn(FastCall)>,
) {
    let k = crate::contract::check_tile_rows::<W, A>(
        w,
        rows,
        a,
        stride,
        side,
        rows * n,
        (max_rows, crate::contract::FAST_TILE_TOKENS),
        sums.max(1),
    );
    let call = FastCall {
        w: w.as_ptr(),
        wstride: k.wstride,
        rows: k.rows,
        a: a.as_ptr(),
        stride,
        n: k.cols,
        ad: side.scales.as_ptr(),
        ad_stride: k.ad_stride,
        sums: k.sums,
        use_sums: sums > 0 && k.use_sums,
        nb: k.nb,
        out,
        out_row,
        out_col,
    };
    match dec {
        Some(dec) if k.cols <= 2 => dec(call),
        _ => imp(call),
    }
}

macro_rules! fast_entry {
    ($name:ident, $into:ident, $packed:ident, $ty:ident, $w:ty, $a:ty, $imp:ident, $dec:ident, $sums:literal) => {
        pub(super) fn $name(
            w: &[u8],
            rows: usize,
            a: &[u8],
            stride: usize,
            side: ActSide<'_>,
            out: &mut [f32],
        ) {
            assert!(
                rows >= 1 && out.len().is_multiple_of(rows),
                "tile: {rows} weight rows, {} outputs",
                out.len()
            );
            let n = out.len() / rows;
            // SAFETY: handed out by the kernel table only after the features were
            // detected; the slots r * n + c (r < rows, c < n) are exactly `out`.
            unsafe {
                fast_call::<$w, $a>(
                    (w, rows, a, stride),
                    side,
                    n,
                    (out.as_mut_ptr(), n, 1),
                    $sums,
                    $imp::<$ty, false>,
                    Some($dec::<$ty>),
                )
            }
        }

        /// # Safety
        /// See [`crate::contract::TileIntoFn`].
        #[allow(clippy::too_many_arguments)]
        pub(super) unsafe fn $into(
            w: &[u8],
            rows: usize,
            a: &[u8],
            stride: usize,
            side: ActSide<'_>,
            n: usize,
            out: *mut f32,
            out_stride: usize,
        ) {
            fast_call::<$w, $a>(
                (w, rows, a, stride),
                side,
                n,
                (out, 1, out_stride),
                $sums,
                $imp::<$ty, false>,
                Some($dec::<$ty>),
            )
        }

        /// `$into` for rows repacked by `crate::pack8`: one whole group of eight rows.
        ///
        /// # Safety
        /// See [`crate::contract::TileIntoFn`].
        #[allow(clippy::too_many_arguments)]
        pub(super) unsafe fn $packed(
            w: &[u8],
            rows: usize,
            a: &[u8],
            stride: usize,
            side: ActSide<'_>,
            n: usize,
            out: *mut f32,
            out_stride: usize,
        ) {
            assert_eq!(rows, 8, "packed tile: {rows} rows, not one group of eight");
            fast_call::<$w, $a>(
                (w, rows, a, stride),
                side,
                n,
                (out, 1, out_stride),
                $sums,
                $imp::<$ty, true>,
                None,
            )
        }
    };
}

fast_entry!(
    q4_0_fast_many,
    q4_0_fast_many_into,
    q4_0_fast_packed_into,
    Q4_0,
    BlockQ4_0,
    BlockQ8_0,
    fast_avx2_small,
    fast_avx2_small_decode,
    true
);
fast_entry!(
    q4_1_fast_many,
    q4_1_fast_many_into,
    q4_1_fast_packed_into,
    Q4_1,
    BlockQ4_1,
    BlockQ8_1,
    fast_avx2_small,
    fast_avx2_small_decode,
    false
);
fast_entry!(
    q5_0_fast_many,
    q5_0_fast_many_into,
    q5_0_fast_packed_into,
    Q5_0,
    BlockQ5_0,
    BlockQ8_0,
    fast_avx2_small,
    fast_avx2_small_decode,
    true
);
fast_entry!(
    q5_1_fast_many,
    q5_1_fast_many_into,
    q5_1_fast_packed_into,
    Q5_1,
    BlockQ5_1,
    BlockQ8_1,
    fast_avx2_small,
    fast_avx2_small_decode,
    false
);
fast_entry!(
    q8_0_fast_many,
    q8_0_fast_many_into,
    q8_0_fast_packed_into,
    Q8_0,
    BlockQ8_0,
    BlockQ8_0,
    fast_avx2_sign,
    fast_avx2_sign_decode,
    false
);
fast_entry!(
    q4_0_fast_many_vnni,
    q4_0_fast_many_vnni_into,
    q4_0_fast_packed_vnni_into,
    Q4_0,
    BlockQ4_0,
    BlockQ8_0,
    fast_vnni,
    fast_vnni_decode,
    true
);
fast_entry!(
    q4_1_fast_many_vnni,
    q4_1_fast_many_vnni_into,
    q4_1_fast_packed_vnni_into,
    Q4_1,
    BlockQ4_1,
    BlockQ8_1,
    fast_vnni,
    fast_vnni_decode,
    false
);
fast_entry!(
    q5_0_fast_many_vnni,
    q5_0_fast_many_vnni_into,
    q5_0_fast_packed_vnni_into,
    Q5_0,
    BlockQ5_0,
    BlockQ8_0,
    fast_vnni,
    fast_vnni_decode,
    true
);
fast_entry!(
    q5_1_fast_many_vnni,
    q5_1_fast_many_vnni_into,
    q5_1_fast_packed_vnni_into,
    Q5_1,
    BlockQ5_1,
    BlockQ8_1,
    fast_vnni,
    fast_vnni_decode,
    false
);
fast_entry!(
    q8_0_fast_many_vnni,
    q8_0_fast_many_vnni_into,
    q8_0_fast_packed_vnni_into,
    Q8_0,
    BlockQ8_0,
    BlockQ8_0,
    fast_vnni,
    fast_vnni_decode,
    true
);

// MXFP4's repacked order (llama.cpp's `gemv`/`gemm_mxfp4_8x8_q8_0`) is the fast order's
// arithmetic: its table values plus 12 (at most 24) go in unsigned, the activations'
// block sums times -12 start the integer sums.
fast_entry!(
    mxfp4_rep_many,
    mxfp4_rep_many_into,
    mxfp4_rep_packed_into,
    Mxfp4,
    BlockMxfp4,
    BlockQ8_0,
    fast_avx2_small,
    fast_avx2_small_decode,
    true
);
fast_entry!(
    mxfp4_rep_many_vnni,
    mxfp4_rep_many_vnni_into,
    mxfp4_rep_packed_vnni_into,
    Mxfp4,
    BlockMxfp4,
    BlockQ8_0,
    fast_vnni,
    fast_vnni_decode,
    true
);

// IQ4_NL's repacked order (`gemv`/`gemm_iq4_nl_8x8_q8_0`) is MXFP4's with its own table
// and an f16 scale: one exact integer sum per block, one FMA with the scale product. Its
// table values plus 128 reach 241, too large for `maddubs` pairs: AVX2 takes the sign
// trick (|x| <= 127), VNNI the unsigned values with offset sums.
fast_entry!(
    iq4_nl_rep_many,
    iq4_nl_rep_many_into,
    iq4_nl_rep_packed_into,
    Iq4NlRep,
    BlockIq4Nl,
    BlockQ8_0,
    fast_avx2_sign,
    fast_avx2_sign_decode,
    false
);
fast_entry!(
    iq4_nl_rep_many_vnni,
    iq4_nl_rep_many_vnni_into,
    iq4_nl_rep_packed_vnni_into,
    Iq4NlRep,
    BlockIq4Nl,
    BlockQ8_0,
    fast_vnni,
    fast_vnni_decode,
    true
);

single_from_many!(q4_0_fast, BlockQ4_0, BlockQ8_0, q4_0_fast_many);
single_from_many!(mxfp4_rep, BlockMxfp4, BlockQ8_0, mxfp4_rep_many);
single_from_many!(mxfp4_rep_vnni, BlockMxfp4, BlockQ8_0, mxfp4_rep_many_vnni);
single_from_many!(q4_1_fast, BlockQ4_1, BlockQ8_1, q4_1_fast_many);
single_from_many!(q5_0_fast, BlockQ5_0, BlockQ8_0, q5_0_fast_many);
single_from_many!(q5_1_fast, BlockQ5_1, BlockQ8_1, q5_1_fast_many);
single_from_many!(q8_0_fast, BlockQ8_0, BlockQ8_0, q8_0_fast_many);
single_from_many!(q4_0_fast_vnni, BlockQ4_0, BlockQ8_0, q4_0_fast_many_vnni);
single_from_many!(q4_1_fast_vnni, BlockQ4_1, BlockQ8_1, q4_1_fast_many_vnni);
single_from_many!(q5_0_fast_vnni, BlockQ5_0, BlockQ8_0, q5_0_fast_many_vnni);
single_from_many!(q5_1_fast_vnni, BlockQ5_1, BlockQ8_1, q5_1_fast_many_vnni);
single_from_many!(q8_0_fast_vnni, BlockQ8_0, BlockQ8_0, q8_0_fast_many_vnni);

// ---------------------------------------------------------------------------------------
// AVX-512 (F, BW, VNNI): two packed groups, sixteen rows, in the lanes of one register.
//
// The same products as `fast_vnni` on packed rows, lane r of a 512-bit register holding
// row r of the sixteen: each broadcast activation group and each float step then serves
// sixteen rows instead of eight, and a staged weight register is one load for four tokens'
// `vpdpbusd`. Every lane does exactly the ymm kernel's operations for its row (exact
// integer sums, then the same multiply and FMAs), so the bits are the same.

/// Rows of one AVX-512 packed call: two groups.
pub(super) const PACKED512_ROWS: usize = 16;

/// Block `pa` of one packed group and block `pb` of another (`pa` again for a call of one
/// group): the sixteen rows' quants as unsigned bytes (register k = elements 4k..4k+4 of
/// every row; Q8_0's signed bytes flipped to `q + 128`), their scales and (unsigned
/// formats) mins.
///
/// # Safety
/// AVX-512 F/BW available; `pa` and `pb` point to whole blocks of packed groups.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn stage512<T: Legacy>(
    pa: *const u8,
    pb: *const u8,
    prefetch: bool,
) -> ([__m512i; 8], __m512, __m512) {
    if prefetch {
        prefetch_packed::<T>(pa);
        if pb != pa {
            prefetch_packed::<T>(pb);
        }
    }
    let ta = packed_regs::<T>(pa.add(packed_head::<T>()));
    let tb = packed_regs::<T>(pb.add(packed_head::<T>()));
    let flip = _mm512_set1_epi8(0x80u8 as i8);
    let t: [__m512i; 8] = arr(|k| {
        let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(ta[k]), tb[k]);
        // Q8_0 is stored signed; VNNI wants the weights unsigned (`q + 128`).
        if T::EIGHT_BIT {
            _mm512_xor_si512(v, flip)
        } else {
            v
        }
    });
    let h16 = |off: usize| {
        _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(ld128(pa.add(off))),
            ld128(pb.add(off)),
        ))
    };
    let dx = if T::E8M0 {
        // The ymm conversion for each group, joined.
        let (lo, hi) = (
            widen8::<T>(packed_scales::<T>(pa)),
            widen8::<T>(packed_scales::<T>(pb)),
        );
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(
            _mm512_castps_pd(_mm512_castps256_ps512(lo)),
            _mm256_castps_pd(hi),
        ))
    } else {
        h16(0)
    };
    let mx = if T::SIGNED {
        _mm512_setzero_ps()
    } else {
        h16(16)
    };
    (t, dx, mx)
}

/// # Safety
/// AVX-512 F/BW/VL/VNNI available; `f` was validated by `fast_call_rows` with `rows` 16 of
/// rows packed by `crate::pack8` (two consecutive groups) and `out_row` 1.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn fast_vnni512_packed<T: Legacy>(f: FastCall) {
    let FastCall {
        w,
        wstride,
        rows,
        a,
        stride,
        n,
        sums,
        use_sums,
        nb,
        out,
        out_row,
        out_col,
        ..
    } = f;
    debug_assert!(rows == PACKED512_ROWS && out_row == 1);
    let group = 8 * wstride;
    // Block i of both groups: the sixteen rows' quants as unsigned bytes (register k =
    // elements 4k..4k+4 of every row), their scales and mins.
    let block = |i: usize| -> ([__m512i; 8], __m512, __m512) {
        // SAFETY (this closure): block i < nb of both groups is inside `w`.
        let pa = w.add(i * 8 * T::WB);
        stage512::<T>(pa, pa.add(group), n <= 2)
    };
    // Where token c's block i starts, and its integer sum's starting value.
    let act = |c: usize, i: usize| -> (*const u8, i32) {
        // SAFETY (this closure): token c < n, block i < nb of the checked call.
        let ab = a.add(c * stride + i * T::AB);
        let init = if !T::SIGNED {
            0
        } else if use_sums {
            *sums.add(c * nb + i)
        } else {
            neg_offset_sum(ab.add(T::A_QS), T::OFFSET)
        };
        (ab, init)
    };
    let bcast = |p: *const u8| _mm512_set1_epi32(p.cast::<i32>().read_unaligned());
    let fold = |c: usize, i: usize, ab: *const u8, isum: __m512i, dx, mx, acc: __m512| {
        // SAFETY (this closure): as `act`.
        let (dy, sy) = act_scales::<T>(&f, c, i, ab);
        let d = _mm512_mul_ps(dx, _mm512_set1_ps(dy));
        let mut acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(isum), acc);
        if !T::SIGNED {
            acc = _mm512_fmadd_ps(mx, _mm512_set1_ps(sy), acc);
        }
        acc
    };
    // Token c's product with one block, into `acc`.
    let product = |c: usize, i: usize, t: &[__m512i; 8], dx, mx, acc| {
        let (ab, init) = act(c, i);
        let yq = ab.add(T::A_QS);
        let mut s0 = _mm512_set1_epi32(init);
        let mut s1 = _mm512_setzero_si512();
        for k in (0..8).step_by(2) {
            s0 = _mm512_dpbusd_epi32(s0, t[k], bcast(yq.add(4 * k)));
            s1 = _mm512_dpbusd_epi32(s1, t[k + 1], bcast(yq.add(4 * k + 4)));
        }
        fold(c, i, ab, _mm512_add_epi32(s0, s1), dx, mx, acc)
    };
    let mut acc_m = core::mem::MaybeUninit::<[__m512; crate::contract::FAST_TILE_TOKENS]>::uninit();
    let acc = init_prefix(&mut acc_m, n, _mm512_setzero_ps());
    if n <= 2 {
        // Decode: the two groups stream, nothing to stage.
        for i in 0..nb {
            let (t, dx, mx) = block(i);
            for (c, acc) in acc.iter_mut().enumerate().take(n) {
                *acc = product(c, i, &t, dx, mx, *acc);
            }
        }
    } else {
        // Staged quants, scales and mins of one chunk of blocks. Uninitialized: entries
        // 0..nc are written (through raw pointers) before any is read.
        let mut tq_m = core::mem::MaybeUninit::<[[__m512i; 8]; FAST_CHUNK]>::uninit();
        let mut dxs_m = core::mem::MaybeUninit::<[__m512; FAST_CHUNK]>::uninit();
        let mut ms_m = core::mem::MaybeUninit::<[__m512; FAST_CHUNK]>::uninit();
        let tq = tq_m.as_mut_ptr().cast::<[__m512i; 8]>();
        let dxs = dxs_m.as_mut_ptr().cast::<__m512>();
        let ms = ms_m.as_mut_ptr().cast::<__m512>();
        let mut i0 = 0;
        while i0 < nb {
            let nc = (nb - i0).min(FAST_CHUNK);
            for j in 0..nc {
                let (t, dx, mx) = block(i0 + j);
                tq.add(j).write(t);
                dxs.add(j).write(dx);
                ms.add(j).write(mx);
            }
            // Four tokens per pass: each staged register is loaded once for four.
            let mut c0 = 0;
            while c0 + 4 <= n {
                let mut acc4: [__m512; 4] = arr(|q| acc[c0 + q]);
                for j in 0..nc {
                    let i = i0 + j;
                    // SAFETY: entry j < nc was written above.
                    let t = &*tq.add(j);
                    let ai: [(*const u8, i32); 4] = arr(|q| act(c0 + q, i));
                    let mut s0 = ai.map(|(_, init)| _mm512_set1_epi32(init));
                    let mut s1 = [_mm512_setzero_si512(); 4];
                    for k in (0..8).step_by(2) {
                        for q in 0..4 {
                            let yq = ai[q].0.add(T::A_QS);
                            s0[q] = _mm512_dpbusd_epi32(s0[q], t[k], bcast(yq.add(4 * k)));
                            s1[q] = _mm512_dpbusd_epi32(s1[q], t[k + 1], bcast(yq.add(4 * k + 4)));
                        }
                    }
                    for q in 0..4 {
                        let isum = _mm512_add_epi32(s0[q], s1[q]);
                        acc4[q] = fold(c0 + q, i, ai[q].0, isum, *dxs.add(j), *ms.add(j), acc4[q]);
                    }
                }
                acc[c0..c0 + 4].copy_from_slice(&acc4);
                c0 += 4;
            }
            for (c, acc) in acc.iter_mut().enumerate().take(n).skip(c0) {
                let mut acc_c = *acc;
                for j in 0..nc {
                    // SAFETY: entry j < nc was written above.
                    acc_c = product(c, i0 + j, &*tq.add(j), *dxs.add(j), *ms.add(j), acc_c);
                }
                *acc = acc_c;
            }
            i0 += nc;
        }
    }
    for (c, acc) in acc.iter().enumerate().take(n) {
        _mm512_storeu_ps(out.add(c * out_col), *acc);
    }
}

macro_rules! fast_packed512 {
    ($name:ident, $ty:ident, $w:ty, $a:ty, $ymm:ident, $sums:literal) => {
        /// The packed tile for AVX-512: sixteen rows (two groups) per call, or one group
        /// through the VNNI ymm kernel (same bits).
        ///
        /// # Safety
        /// See [`crate::contract::TileIntoFn`].
        #[allow(clippy::too_many_arguments)]
        pub(super) unsafe fn $name(
            w: &[u8],
            rows: usize,
            a: &[u8],
            stride: usize,
            side: ActSide<'_>,
            n: usize,
            out: *mut f32,
            out_stride: usize,
        ) {
            // Decode (one or two tokens) streams the groups one at a time through the
            // ymm kernel: measured faster than the sixteen-row pass (smollm2 tg128 on a
            // Zen 4: 218 vs 175 t/s), which only pays off once a staged register serves
            // several tokens.
            if rows == 8 || (n <= 2 && rows == PACKED512_ROWS) {
                let half = w.len() / rows * 8;
                for g in 0..rows / 8 {
                    $ymm(
                        &w[g * half..(g + 1) * half],
                        8,
                        a,
                        stride,
                        side,
                        n,
                        out.add(8 * g),
                        out_stride,
                    );
                }
                return;
            }
            assert_eq!(
                rows, PACKED512_ROWS,
                "packed tile: {rows} rows, not two groups of eight"
            );
            fast_call_rows::<$w, $a>(
                PACKED512_ROWS,
                (w, rows, a, stride),
                side,
                n,
                (out, 1, out_stride),
                usize::from($sums),
                fast_vnni512_packed::<$ty>,
                None,
            )
        }
    };
}

fast_packed512!(
    q4_0_fast_packed512_into,
    Q4_0,
    BlockQ4_0,
    BlockQ8_0,
    q4_0_fast_packed_vnni_into,
    true
);
fast_packed512!(
    q4_1_fast_packed512_into,
    Q4_1,
    BlockQ4_1,
    BlockQ8_1,
    q4_1_fast_packed_vnni_into,
    false
);
fast_packed512!(
    q5_0_fast_packed512_into,
    Q5_0,
    BlockQ5_0,
    BlockQ8_0,
    q5_0_fast_packed_vnni_into,
    true
);
fast_packed512!(
    q5_1_fast_packed512_into,
    Q5_1,
    BlockQ5_1,
    BlockQ8_1,
    q5_1_fast_packed_vnni_into,
    false
);
fast_packed512!(
    mxfp4_rep_packed512_into,
    Mxfp4,
    BlockMxfp4,
    BlockQ8_0,
    mxfp4_rep_packed_vnni_into,
    true
);
fast_packed512!(
    iq4_nl_rep_packed512_into,
    Iq4NlRep,
    BlockIq4Nl,
    BlockQ8_0,
    iq4_nl_rep_packed_vnni_into,
    true
);
fast_packed512!(
    q8_0_fast_packed512_into,
    Q8_0,
    BlockQ8_0,
    BlockQ8_0,
    q8_0_fast_packed_vnni_into,
    true
);

// ---------------------------------------------------------------------------------------
// llama.cpp's own order (`DotOrder::Single`) on packed rows, AVX2: one group of eight
// rows per call, every format.
//
// ggml's x86 kernels sum a block in eight i32 lanes, lane `l` holding elements
// `4l..4l+4`, and fuse each lane into its own float accumulator: exactly register `l` of
// a packed block (`crate::formats::packed`), for eight rows at once. So per token and
// block these kernels do eight integer products (one per register), eight conversions
// and eight FMAs for eight rows, and one `dx * dy` multiply for all eight, where ggml
// unpacks the block, signs the activations and multiplies the scales for every row; the
// end is `hsum_float_8` done vertically across the eight accumulators. Each lane does the
// twin's operations for its row: the bits of `vec_dot_*`. A lane's integer sum is exact
// however it is formed (`ExactInt`): Q4_0 and Q5_0 go in as their stored unsigned quants
// (`q + offset`, at most 31) with the lane started at `-offset * Σ y`, precomputed once
// per activation block (`crate::contract::offset_sums`); Q8_0 without VNNI keeps ggml's
// sign trick, since `q + 128` would saturate `maddubs`' i16 pairs. (A first version
// measured slower than the file rows' tiles: its per-token step was a closure LLVM did
// not inline, which kept the accumulators in memory; see ARCHITECTURE.md.)

/// How the AVX2 exact packed kernels form a lane's integer sum.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ExactInt {
    /// `maddubs` on the stored unsigned quants (at most 31), plus the offset sum for
    /// Q4_0 and Q5_0.
    Maddubs,
    /// `maddubs` on `|q|` with each activation given q's sign (Q8_0 without VNNI).
    Sign,
    /// `vpdpbusd` on unsigned quants (Q8_0 flipped to `q + 128`) from the offset sum.
    Vnni,
    /// The same in the VEX encoding (AVX-VNNI).
    VnniVex,
}

/// Which `vpdpbusd` an exact packed kernel is compiled for, if any.
const NO_VNNI: u8 = 0;
const EVEX: u8 = 1;
const VEX: u8 = 2;

impl ExactInt {
    const fn of<T: Legacy>(vnni: u8) -> ExactInt {
        if vnni == EVEX {
            ExactInt::Vnni
        } else if vnni == VEX {
            ExactInt::VnniVex
        } else if T::EIGHT_BIT {
            ExactInt::Sign
        } else {
            ExactInt::Maddubs
        }
    }
}

/// Block `p` of a packed group as `int` multiplies it: the eight quant registers
/// (unsigned; `|q|` for `Sign`), the quants themselves for `Sign` (their signs, else
/// zero), the rows' scales and (unsigned formats) mins.
///
/// # Safety
/// AVX2/F16C available; `p` points to a whole block of a packed group.
#[inline(always)]
unsafe fn stage8<T: Legacy>(
    p: *const u8,
    int: ExactInt,
    prefetch: bool,
) -> ([__m256i; 8], [__m256i; 8], __m256, __m256) {
    if prefetch {
        prefetch_block(p, 8 * T::WB);
    }
    let heads = if T::SIGNED { 1 } else { 2 };
    let q = packed_regs::<T>(p.add(16 * heads));
    let (t, sgn) = match int {
        ExactInt::Sign => (q.map(|v| _mm256_sign_epi8(v, v)), q),
        ExactInt::Vnni | ExactInt::VnniVex if T::EIGHT_BIT => (
            q.map(|v| _mm256_xor_si256(v, _mm256_set1_epi8(0x80u8 as i8))),
            [_mm256_setzero_si256(); 8],
        ),
        _ => (q, [_mm256_setzero_si256(); 8]),
    };
    let dx = _mm256_cvtph_ps(ld128(p));
    let mx = if T::SIGNED {
        _mm256_setzero_ps()
    } else {
        _mm256_cvtph_ps(ld128(p.add(16)))
    };
    (t, sgn, dx, mx)
}

/// One token's products with one staged block: `t` its registers, `sgn` the quants
/// (`Sign` only, read nowhere else), `init(k)` lane k's offset sum (signed formats, `Maddubs` and
/// `Vnni`), `(dx, mx)` the rows' scales and mins, `(dy, sy)` the token's block scale and
/// sum.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn exact_block<T: Legacy>(
    int: ExactInt,
    t: &[__m256i; 8],
    sgn: *const [__m256i; 8],
    yq: *const u8,
    init: impl Fn(usize) -> __m256i,
    (dx, mx): (__m256, __m256),
    (dy, sy): (f32, f32),
    acc: &mut [__m256; 8],
    summs: &mut __m256,
) {
    let d = _mm256_mul_ps(dx, _mm256_set1_ps(dy));
    let ones = _mm256_set1_epi16(1);
    for k in 0..8 {
        let y = bcast4(yq.add(4 * k));
        let isum = match int {
            ExactInt::Vnni => fast_dpbusd_vnni(init(k), t[k], y),
            ExactInt::VnniVex => dpbusd_vex(init(k), t[k], y),
            ExactInt::Sign => _mm256_madd_epi16(
                _mm256_maddubs_epi16(t[k], _mm256_sign_epi8(y, (*sgn)[k])),
                ones,
            ),
            ExactInt::Maddubs => {
                let s = _mm256_madd_epi16(_mm256_maddubs_epi16(t[k], y), ones);
                if T::SIGNED {
                    _mm256_add_epi32(init(k), s)
                } else {
                    s
                }
            }
        };
        acc[k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), acc[k]);
    }
    if !T::SIGNED {
        *summs = _mm256_fmadd_ps(mx, _mm256_set1_ps(sy), *summs);
    }
}

/// Token c's products with block i of the call `f`, from its staged registers (`t`, `sgn`,
/// `dm` as [`exact_block`] takes them). A function, not a closure: the closure was not
/// inlined and kept the accumulators in memory.
///
/// # Safety
/// Token c < n and block i < nb of the validated call.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn exact_token<T: Legacy>(
    f: &FastCall,
    int: ExactInt,
    (c, i): (usize, usize),
    t: &[__m256i; 8],
    sgn: *const [__m256i; 8],
    dm: (__m256, __m256),
    acc: &mut [__m256; 8],
    summs: &mut __m256,
) {
    let ab = f.a.add(c * f.stride + i * T::AB);
    let yq = ab.add(T::A_QS);
    let ys = act_scales::<T>(f, c, i, ab);
    let init = |k: usize| _mm256_set1_epi32(lane_start::<T>(f, c, i, yq, k));
    exact_block::<T>(int, t, sgn, yq, init, dm, ys, acc, summs);
}

/// The kernel over one packed group (eight rows), `f` validated for it (eight offset sums
/// per activation block when `use_sums`).
#[inline(always)]
unsafe fn exact_packed_body<T: Legacy, const VNNI: u8>(f: FastCall) {
    let int = ExactInt::of::<T>(VNNI);
    let FastCall {
        w,
        n,
        nb,
        out,
        out_col,
        ..
    } = f;
    let block = |i: usize| {
        // SAFETY (this closure): block i < nb of the group is inside `w`.
        stage8::<T>(w.add(i * 8 * T::WB), int, n <= 2)
    };
    let mut acc_m =
        core::mem::MaybeUninit::<[[__m256; 8]; crate::contract::FAST_TILE_TOKENS]>::uninit();
    let mut summs_m =
        core::mem::MaybeUninit::<[__m256; crate::contract::FAST_TILE_TOKENS]>::uninit();
    let acc = init_prefix(&mut acc_m, n, [_mm256_setzero_ps(); 8]);
    let summs = init_prefix(&mut summs_m, n, _mm256_setzero_ps());
    if n <= 2 {
        // Decode: the group streams, nothing to stage.
        for i in 0..nb {
            let (t, sgn, dx, mx) = block(i);
            for c in 0..n {
                exact_token::<T>(
                    &f,
                    int,
                    (c, i),
                    &t,
                    &sgn,
                    (dx, mx),
                    &mut acc[c],
                    &mut summs[c],
                );
            }
        }
    } else {
        // Staged registers, scales and mins (and for `Sign` the quants' signs) of one
        // chunk of blocks. Uninitialized: entries 0..nc are written before any is read.
        type Staged = ([__m256i; 8], __m256, __m256);
        let mut tq_m = core::mem::MaybeUninit::<[Staged; FAST_CHUNK]>::uninit();
        let mut sq_m = core::mem::MaybeUninit::<[[__m256i; 8]; FAST_CHUNK]>::uninit();
        let tq = tq_m.as_mut_ptr().cast::<Staged>();
        let sq = sq_m.as_mut_ptr().cast::<[__m256i; 8]>();
        let mut i0 = 0;
        while i0 < nb {
            let nc = (nb - i0).min(FAST_CHUNK);
            for j in 0..nc {
                let (t, sgn, dx, mx) = block(i0 + j);
                tq.add(j).write((t, dx, mx));
                if int == ExactInt::Sign {
                    sq.add(j).write(sgn);
                }
            }
            for c in 0..n {
                let mut a8 = acc[c];
                let mut sm = summs[c];
                for j in 0..nc {
                    // SAFETY: entry j < nc was written above (its signs too for `Sign`,
                    // the only kernel that reads them).
                    let (t, dx, mx) = &*tq.add(j);
                    exact_token::<T>(
                        &f,
                        int,
                        (c, i0 + j),
                        t,
                        sq.add(j),
                        (*dx, *mx),
                        &mut a8,
                        &mut sm,
                    );
                }
                acc[c] = a8;
                summs[c] = sm;
            }
            i0 += nc;
        }
    }
    for c in 0..n {
        // `hsum_float_8`, lane by lane: v_i = x_{i+4} + x_i, then (v0 + v2) + (v1 + v3),
        // then the unsigned formats' mins.
        let x = &acc[c];
        let v: [__m256; 4] = arr(|i| _mm256_add_ps(x[i + 4], x[i]));
        let mut r = _mm256_add_ps(_mm256_add_ps(v[0], v[2]), _mm256_add_ps(v[1], v[3]));
        if !T::SIGNED {
            r = _mm256_add_ps(r, summs[c]);
        }
        _mm256_storeu_ps(out.add(c * out_col), r);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn exact_packed_avx2<T: Legacy>(f: FastCall) {
    exact_packed_body::<T, NO_VNNI>(f)
}

#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn exact_packed_vnni<T: Legacy>(f: FastCall) {
    exact_packed_body::<T, EVEX>(f)
}

/// The AVX-VNNI level's kernel (16 ymm registers). Only the 4- and 5-bit formats have a
/// row there: on a Zen 5 (`packed_gemm`, single thread, 64 tokens) it ran Q4_1 and Q5_1
/// 17-18% faster than the AVX2 kernel and Q4_0, Q5_0 3-4%, but Q8_0 5% slower (its
/// weights need the sign flip `maddubs`' sign trick avoids).
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn exact_packed_vex<T: Legacy>(f: FastCall) {
    exact_packed_body::<T, VEX>(f)
}

macro_rules! exact_packed_entry {
    ($name:ident, $ty:ident, $w:ty, $a:ty, $imp:ident, $max_rows:expr) => {
        /// llama.cpp's order on one packed group of eight rows (or `$max_rows` rows).
        ///
        /// # Safety
        /// See [`crate::contract::TileIntoFn`]; the kernel's features available.
        #[allow(clippy::too_many_arguments)]
        pub(super) unsafe fn $name(
            w: &[u8],
            rows: usize,
            a: &[u8],
            stride: usize,
            side: ActSide<'_>,
            n: usize,
            out: *mut f32,
            out_stride: usize,
        ) {
            assert!(
                rows == 8 || rows == $max_rows,
                "packed tile: {rows} rows, not one group of eight or {} rows",
                $max_rows
            );
            // Eight offset sums per block where the side has them: one per lane.
            fast_call_rows::<$w, $a>(
                $max_rows,
                (w, rows, a, stride),
                side,
                n,
                (out, 1, out_stride),
                8,
                $imp::<$ty>,
                None,
            )
        }
    };
}

exact_packed_entry!(
    q4_0_packed_avx2,
    Q4_0,
    BlockQ4_0,
    BlockQ8_0,
    exact_packed_avx2,
    8
);
exact_packed_entry!(
    q4_1_packed_avx2,
    Q4_1,
    BlockQ4_1,
    BlockQ8_1,
    exact_packed_avx2,
    8
);
exact_packed_entry!(
    q5_0_packed_avx2,
    Q5_0,
    BlockQ5_0,
    BlockQ8_0,
    exact_packed_avx2,
    8
);
exact_packed_entry!(
    q5_1_packed_avx2,
    Q5_1,
    BlockQ5_1,
    BlockQ8_1,
    exact_packed_avx2,
    8
);
exact_packed_entry!(
    q8_0_packed_avx2,
    Q8_0,
    BlockQ8_0,
    BlockQ8_0,
    exact_packed_avx2,
    8
);
exact_packed_entry!(
    q4_0_packed_vnni,
    Q4_0,
    BlockQ4_0,
    BlockQ8_0,
    exact_packed_vnni,
    8
);
exact_packed_entry!(
    q4_1_packed_vnni,
    Q4_1,
    BlockQ4_1,
    BlockQ8_1,
    exact_packed_vnni,
    8
);
exact_packed_entry!(
    q5_0_packed_vnni,
    Q5_0,
    BlockQ5_0,
    BlockQ8_0,
    exact_packed_vnni,
    8
);
exact_packed_entry!(
    q5_1_packed_vnni,
    Q5_1,
    BlockQ5_1,
    BlockQ8_1,
    exact_packed_vnni,
    8
);
exact_packed_entry!(
    q8_0_packed_vnni,
    Q8_0,
    BlockQ8_0,
    BlockQ8_0,
    exact_packed_vnni,
    8
);

exact_packed_entry!(
    q4_0_packed_vex,
    Q4_0,
    BlockQ4_0,
    BlockQ8_0,
    exact_packed_vex,
    8
);
exact_packed_entry!(
    q4_1_packed_vex,
    Q4_1,
    BlockQ4_1,
    BlockQ8_1,
    exact_packed_vex,
    8
);
exact_packed_entry!(
    q5_0_packed_vex,
    Q5_0,
    BlockQ5_0,
    BlockQ8_0,
    exact_packed_vex,
    8
);
exact_packed_entry!(
    q5_1_packed_vex,
    Q5_1,
    BlockQ5_1,
    BlockQ8_1,
    exact_packed_vex,
    8
);

// ---------------------------------------------------------------------------------------
// llama.cpp's order on packed rows with AVX-512: sixteen rows (two groups) in the lanes of
// a 512-bit register, every format.
//
// The same lane sums as `exact_packed_body`: register `k` of a block holds elements
// `4k..4k+4` of each row, so one `vpdpbusd` forms ggml's i32 lane `k` for sixteen rows
// and each lane keeps its own float accumulator (`acc[k]`), folded by `hsum_float_8`'s
// additions at the end. The signed formats take their weights unsigned (`q + offset`,
// Q8_0's sign bit flipped) and start each lane's integer sum at `-offset * Σ y` of the
// lane's four activations (`crate::contract::offset_sums`), so the lane holds exactly
// `Σ q·y`: no per-row sign work at all, where ggml signs the activations for every row.

/// One token's products with one staged block of sixteen rows, into `acc` (and the
/// unsigned formats' min term into `summs`).
#[inline(always)]
unsafe fn exact512_block<T: Legacy>(
    t: &[__m512i; 8],
    (dx, mx): (__m512, __m512),
    yq: *const u8,
    init: impl Fn(usize) -> __m512i,
    (dy, sy): (f32, f32),
    acc: &mut [__m512; 8],
    summs: &mut __m512,
) {
    let d = _mm512_mul_ps(dx, _mm512_set1_ps(dy));
    for k in 0..8 {
        let y = _mm512_set1_epi32(yq.add(4 * k).cast::<i32>().read_unaligned());
        let isum = _mm512_dpbusd_epi32(init(k), t[k], y);
        acc[k] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(isum), acc[k]);
    }
    if !T::SIGNED {
        *summs = _mm512_fmadd_ps(mx, _mm512_set1_ps(sy), *summs);
    }
}

/// Token pairs (`M` = 2) or one token (`M` = 1) at `c0` against the `nc` staged blocks
/// starting at block `i0`: from zero at block 0, else continuing the accumulators in
/// `acc` / `summs` (entries `c0..c0 + M`, written here either way).
///
/// # Safety
/// As the kernel's; entries `c0..c0 + M` of `acc` and `summs` are valid for writes, and
/// for reads when `i0 > 0`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn exact512_tokens<T: Legacy, const M: usize>(
    f: &FastCall,
    c0: usize,
    i0: usize,
    staged: impl Fn(usize) -> ([__m512i; 8], __m512, __m512),
    nc: usize,
    acc: *mut [__m512; 8],
    summs: *mut __m512,
) {
    let (mut a, mut s): ([[__m512; 8]; M], [__m512; M]) = if i0 == 0 {
        ([[_mm512_setzero_ps(); 8]; M], [_mm512_setzero_ps(); M])
    } else {
        (
            arr(|q| acc.add(c0 + q).read()),
            arr(|q| summs.add(c0 + q).read()),
        )
    };
    for j in 0..nc {
        let i = i0 + j;
        let (t, dx, mx) = staged(j);
        for q in 0..M {
            let c = c0 + q;
            // SAFETY: token c < n and block i < nb of the validated call.
            let ab = f.a.add(c * f.stride + i * T::AB);
            let yq = ab.add(T::A_QS);
            let ys = act_scales::<T>(f, c, i, ab);
            let init = |k: usize| _mm512_set1_epi32(lane_start::<T>(f, c, i, yq, k));
            exact512_block::<T>(&t, (dx, mx), yq, init, ys, &mut a[q], &mut s[q]);
        }
    }
    for q in 0..M {
        acc.add(c0 + q).write(a[q]);
        summs.add(c0 + q).write(s[q]);
    }
}

/// The sum of the four signed activation bytes at `p` (a lane's sum, for calls without
/// precomputed offset sums).
#[inline(always)]
unsafe fn lane_sum(p: *const u8) -> i32 {
    (0..4).map(|e| *p.add(e) as i8 as i32).sum()
}

/// Where lane `k` of token `c`'s products with block `i` starts in llama.cpp's order on
/// packed rows (ymm and zmm alike): `-offset * Σ y` of its four activations for a signed
/// format (precomputed where the call has offset sums, else summed from `yq`, the
/// block's quants), 0 for an unsigned one.
///
/// # Safety
/// Token c < n and block i < nb of the validated call `f`, `yq` their activation quants.
#[inline(always)]
unsafe fn lane_start<T: Legacy>(f: &FastCall, c: usize, i: usize, yq: *const u8, k: usize) -> i32 {
    if !T::SIGNED {
        0
    } else if f.use_sums {
        *f.sums.add((c * f.nb + i) * 8 + k)
    } else {
        -T::OFFSET * lane_sum(yq.add(4 * k))
    }
}

/// llama.cpp's order over one or two packed groups (8 or 16 rows) with AVX-512.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI available; `f` validated for 8 or 16 packed rows with `out_row`
/// 1 and, when `use_sums`, eight offset sums per block (`offset_sums`).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn exact_vnni512_packed<T: Legacy>(f: FastCall) {
    let FastCall {
        w,
        wstride,
        rows,
        n,
        nb,
        out,
        out_col,
        ..
    } = f;
    debug_assert!((rows == 8 || rows == PACKED512_ROWS) && f.out_row == 1);
    if n <= 2 {
        // Decode: one group at a time in ymm registers (the same operations lane for
        // lane), which streams faster than two groups in the halves of zmm registers.
        for g in 0..rows / 8 {
            exact_packed_body::<T, EVEX>(FastCall {
                w: w.add(g * 8 * wstride),
                rows: 8,
                out: out.add(8 * g),
                ..f
            });
        }
        return;
    }
    // A call of one group runs it in both halves and stores one.
    let group = if rows == PACKED512_ROWS {
        8 * wstride
    } else {
        0
    };
    let block = |i: usize| {
        // SAFETY (this closure): block i < nb of the groups is inside `w`.
        let pa = w.add(i * 8 * T::WB);
        stage512::<T>(pa, pa.add(group), n <= 2)
    };
    // Accumulators, uninitialized: the first chunk of blocks writes entries 0..n (from
    // zero), nothing reads others. (Zeroing all 64 tokens' 36 KiB cost a decode call more
    // than its products, and even a memset of one token's was 10% of gemma3's tg.)
    let mut acc_m =
        core::mem::MaybeUninit::<[[__m512; 8]; crate::contract::FAST_TILE_TOKENS]>::uninit();
    let mut summs_m =
        core::mem::MaybeUninit::<[__m512; crate::contract::FAST_TILE_TOKENS]>::uninit();
    debug_assert!(n <= crate::contract::FAST_TILE_TOKENS);
    let acc = acc_m.as_mut_ptr().cast::<[__m512; 8]>();
    let summs = summs_m.as_mut_ptr().cast::<__m512>();
    if n <= 2 {
        // Decode: the groups stream, nothing to stage.
        let staged = |j: usize| block(j);
        if n == 2 {
            exact512_tokens::<T, 2>(&f, 0, 0, staged, nb, acc, summs);
        } else {
            exact512_tokens::<T, 1>(&f, 0, 0, staged, nb, acc, summs);
        }
    } else {
        // Staged quants, scales and mins of one chunk of blocks. Uninitialized: entries
        // 0..nc are written (through raw pointers) before any is read.
        type Staged = ([__m512i; 8], __m512, __m512);
        let mut tq_m = core::mem::MaybeUninit::<[Staged; FAST_CHUNK]>::uninit();
        let tq = tq_m.as_mut_ptr().cast::<Staged>();
        let mut i0 = 0;
        while i0 < nb {
            let nc = (nb - i0).min(FAST_CHUNK);
            for j in 0..nc {
                tq.add(j).write(block(i0 + j));
            }
            // SAFETY: entry j < nc was written above.
            let staged = |j: usize| *tq.add(j);
            let mut c0 = 0;
            while c0 + 2 <= n {
                exact512_tokens::<T, 2>(&f, c0, i0, staged, nc, acc, summs);
                c0 += 2;
            }
            if c0 < n {
                exact512_tokens::<T, 1>(&f, c0, i0, staged, nc, acc, summs);
            }
            i0 += nc;
        }
    }
    let mask: __mmask16 = if rows == PACKED512_ROWS {
        0xffff
    } else {
        0x00ff
    };
    for c in 0..n {
        // `hsum_float_8`, lane by lane: v_i = x_{i+4} + x_i, then (v0 + v2) + (v1 + v3);
        // then the mins' sum for the unsigned formats.
        // SAFETY: entries 0..n were written by the first chunk.
        let x = &*acc.add(c);
        let v: [__m512; 4] = arr(|i| _mm512_add_ps(x[i + 4], x[i]));
        let mut r = _mm512_add_ps(_mm512_add_ps(v[0], v[2]), _mm512_add_ps(v[1], v[3]));
        if !T::SIGNED {
            r = _mm512_add_ps(r, *summs.add(c));
        }
        _mm512_mask_storeu_ps(out.add(c * out_col), mask, r);
    }
}

exact_packed_entry!(
    q4_0_packed512,
    Q4_0,
    BlockQ4_0,
    BlockQ8_0,
    exact_vnni512_packed,
    PACKED512_ROWS
);
exact_packed_entry!(
    q4_1_packed512,
    Q4_1,
    BlockQ4_1,
    BlockQ8_1,
    exact_vnni512_packed,
    PACKED512_ROWS
);
exact_packed_entry!(
    q5_0_packed512,
    Q5_0,
    BlockQ5_0,
    BlockQ8_0,
    exact_vnni512_packed,
    PACKED512_ROWS
);
exact_packed_entry!(
    q5_1_packed512,
    Q5_1,
    BlockQ5_1,
    BlockQ8_1,
    exact_vnni512_packed,
    PACKED512_ROWS
);
exact_packed_entry!(
    q8_0_packed512,
    Q8_0,
    BlockQ8_0,
    BlockQ8_0,
    exact_vnni512_packed,
    PACKED512_ROWS
);
