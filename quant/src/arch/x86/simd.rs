//! Small AVX2 helpers shared by the x86 kernels: loads, f16 fields, nibble and bit
//! unpacking, horizontal sums, the K-quant lane shuffles, and weight prefetch.

use core::arch::x86_64::*;

// Small helpers.

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn ld256(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p.cast())
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn ld128(p: *const u8) -> __m128i {
    _mm_loadu_si128(p.cast())
}

/// The two f16s at `b[off..off + 4]`, widened (exact, as `f16_to_f32`). Loaded through a
/// general register so the conversion does not merge into (and wait for) a live vector.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16x2_at(b: &[u8], off: usize) -> (f32, f32) {
    let bits = u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]]);
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

/// The f16 at `b[off..off + 2]`, widened (see [`f16x2_at`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16_at(b: &[u8], off: usize) -> f32 {
    let bits = u16::from_le_bytes([b[off], b[off + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

#[inline(always)]
pub(super) fn f32_at(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// 16 packed bytes to 32 nibbles: low nibbles (elements 0..16) then high (16..32).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn nibbles32(p: *const u8) -> __m256i {
    let q = ld128(p);
    let m4 = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(q, m4);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), m4);
    _mm256_set_m128i(hi, lo)
}

/// Byte `j` is 0xff where bit `j` of `bits` is set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn bits_to_bytes(bits: u32) -> __m256i {
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
/// Bit `k` of every byte of `v` moved to bit 4, every other bit cleared: the fifth bits
/// of the packed Q5_0/Q5_1/Q5_K layouts, where bit `k` of a byte belongs to register `k`.
/// A 16-bit shift, whose spill into the neighbouring byte stays below (left shifts) or
/// above (right shifts) bit 4, then a mask.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn bit_to_4(v: __m256i, k: usize) -> __m256i {
    let h = match k {
        0 => _mm256_slli_epi16::<4>(v),
        1 => _mm256_slli_epi16::<3>(v),
        2 => _mm256_slli_epi16::<2>(v),
        3 => _mm256_slli_epi16::<1>(v),
        4 => v,
        5 => _mm256_srli_epi16::<1>(v),
        6 => _mm256_srli_epi16::<2>(v),
        _ => _mm256_srli_epi16::<3>(v),
    };
    _mm256_and_si256(h, _mm256_set1_epi8(0x10))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum_i32(v: __m256i) -> i32 {
    hsum_i32x4(_mm_add_epi32(
        _mm256_castsi256_si128(v),
        _mm256_extracti128_si256::<1>(v),
    ))
}

/// Sum of the four i32 lanes (wrapping, so exact whatever the order).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum_i32x4(v: __m128i) -> i32 {
    let v = _mm_add_epi32(v, _mm_shuffle_epi32::<0b01_00_11_10>(v));
    let v = _mm_add_epi32(v, _mm_shuffle_epi32::<0b10_11_00_01>(v));
    _mm_cvtsi128_si32(v)
}

/// How far ahead (bytes) the decode kernels prefetch weights.
pub(super) const PREFETCH: usize = 1024;

/// Prefetches the cache lines of the `bytes`-long block `PREFETCH` bytes past `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn prefetch_block(p: *const u8, bytes: usize) {
    prefetch_lines(p.wrapping_add(PREFETCH), bytes)
}

/// `core::array::from_fn` as a plain loop, always inlined. In the portable build
/// (`x86-64-v3` baseline) code outside a `#[target_feature]` function cannot inline an
/// AVX-512 or VNNI intrinsic: `from_fn` with many call sites was left out of line there
/// (its closure wrapper too), so every intrinsic in its closure became a call, with the
/// vectors passed through memory (qwen2.5 pp512 0.93-0.96x of the native build). Here the
/// closure is called in the caller's own body and inlined with the caller's features.
#[inline(always)]
pub(crate) fn arr<T, const N: usize>(mut f: impl FnMut(usize) -> T) -> [T; N] {
    let mut a = core::mem::MaybeUninit::<[T; N]>::uninit();
    let p = a.as_mut_ptr().cast::<T>();
    for k in 0..N {
        // SAFETY: slot k of the N-element array, written once.
        unsafe { p.add(k).write(f(k)) };
    }
    // SAFETY: all N slots were written (a panic in `f` leaves before this, leaking the
    // written ones, which is safe).
    unsafe { a.assume_init() }
}

/// Prefetches the cache lines of the `bytes`-long block at `p`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn prefetch_lines(p: *const u8, bytes: usize) {
    let mut off = 0;
    while off < bytes {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off).cast());
        off += 64;
    }
}

/// ggml's `hsum_float_8` (the twin's `hsum_lanes`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum_ps(x: __m256) -> f32 {
    let r = _mm_add_ps(_mm256_extractf128_ps::<1>(x), _mm256_castps256_ps128(x));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    let r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

/// The first `n` entries of `m` set to `v`, the rest left uninitialized and untouched: a
/// kernel's per-token accumulators for the call's tokens only (zeroing the whole array of
/// 64 tokens cost a decode call more than its products).
#[inline(always)]
pub(super) fn init_prefix<T: Copy, const N: usize>(
    m: &mut core::mem::MaybeUninit<[T; N]>,
    n: usize,
    v: T,
) -> &mut [T] {
    assert!(n <= N, "{n} accumulators of {N}");
    let p = m.as_mut_ptr().cast::<T>();
    // SAFETY (the writes): i < n <= N is inside the array. Decode's one or two tokens are
    // two plain stores, not a call to `memset` (which the loop becomes).
    match n {
        1 => unsafe { p.write(v) },
        2 => unsafe {
            p.write(v);
            p.add(1).write(v);
        },
        _ => {
            for i in 0..n {
                unsafe { p.add(i).write(v) };
            }
        }
    }
    // SAFETY: entries 0..n were written above.
    unsafe { core::slice::from_raw_parts_mut(p, n) }
}

/// Four registers of eight lanes each halved down to one float, as [`hsum_ps`] does one
/// (lane l plus l + 4, then l + 2, then l + 1), with the four sums sharing shuffles.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn halve4(y: [__m256; 4]) -> [f32; 4] {
    // [a0+a4 .. a3+a7 | b0+b4 .. b3+b7], and the same of c and d.
    let ab = _mm256_add_ps(
        _mm256_permute2f128_ps::<0x20>(y[0], y[1]),
        _mm256_permute2f128_ps::<0x31>(y[0], y[1]),
    );
    let cd = _mm256_add_ps(
        _mm256_permute2f128_ps::<0x20>(y[2], y[3]),
        _mm256_permute2f128_ps::<0x31>(y[2], y[3]),
    );
    // Per half: [a'0+a'2, a'1+a'3, c'0+c'2, c'1+c'3] (b and d in the upper half).
    let s = _mm256_add_ps(
        _mm256_shuffle_ps::<0b01_00_01_00>(ab, cd),
        _mm256_shuffle_ps::<0b11_10_11_10>(ab, cd),
    );
    // Per half: [a, c, a, c] / [b, d, b, d].
    let u = _mm256_hadd_ps(s, s);
    let lo = _mm256_castps256_ps128(u);
    let hi = _mm256_extractf128_ps::<1>(u);
    [
        _mm_cvtss_f32(lo),
        _mm_cvtss_f32(hi),
        _mm_cvtss_f32(_mm_movehdup_ps(lo)),
        _mm_cvtss_f32(_mm_movehdup_ps(hi)),
    ]
}

/// A zmm's first halving step: lane l plus lane l + 8.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub(super) unsafe fn half512(x: __m512) -> __m256 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)));
    _mm256_add_ps(_mm512_castps512_ps256(x), hi)
}
