//! The legacy 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and MXFP4 on AVX2, with an
//! AVX-512 VNNI variant that forms the integer lanes with `vpdpbusd` (and, for the exact
//! packed kernels of the 4- and 5-bit formats, the same in AVX-VNNI's VEX encoding).
//! Twins: `q4_0::vec_dot_q8_0` and the other formats' `vec_dot_*` in ggml's AVX2 order;
//! MXFP4's repacked order runs on the fast order's kernels (`mxfp4::vec_dot_q8_0_repacked`,
//! one integer sum and one FMA per block, is what they compute).
//!
//! Here: the `Legacy` trait that describes each format to the kernels, the formats' impls
//! and the steps the kernel families share. The families, one file each: `rows` (ggml's
//! order over the file's rows), `fast` (the fast order, and the repacked orders that are
//! its arithmetic), `fast512` (its AVX-512 tile on packed rows), `exact_packed` (ggml's
//! order on packed rows, AVX2 and AVX-512).

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
mod exact_packed;
mod fast;
mod fast512;
mod rows;
pub(in crate::arch::x86) use exact_packed::*;
pub(in crate::arch::x86) use fast::*;
pub(in crate::arch::x86) use fast512::*;
pub(in crate::arch::x86) use rows::*;
