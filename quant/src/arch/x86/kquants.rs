//! The K-quants on AVX2: Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS as tiles (one weight row
//! against up to eight Q8_K activation rows) in each of llama.cpp's x86 kernel orders for
//! them (Q3_K, Q5_K and IQ4_XS: ggml's AVX2 `vec_dot` and the tiled GEMM), and one-row
//! Q2_K in ggml's generic order. Twins: `q4_k::vec_dot_q8k{,_tiled,_gemm4}`,
//! `q6_k::vec_dot_q8k{,_tiled}`, `q2_k::vec_dot_q8k`, `q3_k/q5_k/iq4_xs::vec_dot_q8k{,_tiled}`.

use core::arch::x86_64::*;

use super::simd::*;
use crate::contract::{check_tile, ActSide};
use crate::formats::common::{check_dot, Block};
use crate::formats::iq4_nl::KVALUES;
use crate::formats::iq4_xs::BlockIq4Xs;
use crate::formats::q2_k::BlockQ2K;
use crate::formats::q3_k::{unpack_scales_lanes, BlockQ3K};
use crate::formats::q4_k::{scales_mins_lanes, tiled_step, BlockQ4K};
use crate::formats::q5_k::BlockQ5K;
use crate::formats::q6_k::BlockQ6K;
use crate::formats::q8_k::BlockQ8K;

#[inline(always)]
fn assert_cpu() {
    debug_assert!(crate::isa::Isa::Avx2.available());
}

macro_rules! safe_entry {
    ($name:ident, $w:ty, $a:ty, $imp:expr) => {
        pub(super) fn $name(w: &[u8], a: &[u8]) -> f32 {
            assert_cpu();
            let nb = check_dot::<$w, $a>(w, a);
            // SAFETY: these functions are only handed out (by the kernel table) once AVX2,
            // FMA and F16C were detected, and `check_dot` validated both lengths for `nb`
            // blocks, which is all the raw loads in the kernel read.
            unsafe { $imp(w, a, nb) }
        }
    };
}

safe_entry!(q2_k_q8_k, BlockQ2K, BlockQ8K, q2_k_impl);

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

/// Kernel orders (const parameter `ORD` of the K-quant kernels; see `crate::order::DotOrder`).
const ORD_SINGLE: u8 = 0;
const ORD_TILED: u8 = 1;
const ORD_GEMM4: u8 = 2;

/// The tiled GEMM's mins of a Q4_K/Q5_K super-block (eight i16) as i16 pairs `(m, m)`,
/// so that one `madd` with the raw bsums gives `m[j] * (bsums[2j] + bsums[2j+1])` widened
/// to i32 before the pair sum.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tiled_mins_pairs(mins16: __m128i) -> __m256i {
    let m32 = _mm256_cvtepu16_epi32(mins16);
    _mm256_or_si256(m32, _mm256_slli_epi32::<16>(m32))
}

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
        let mins_pairs = if ORD == ORD_TILED {
            tiled_mins_pairs(mins16)
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
                acc[c] = tiled_step(s1, s2, xd, xdmin, yd, acc[c]);
                continue;
            }
            let q8s = _mm_hadd_epi16(
                _mm256_castsi256_si128(q8sums),
                _mm256_extracti128_si256::<1>(q8sums),
            );
            // Lane k: the mins of 64-element chunk k times its bsums.
            let mins_k = _mm_madd_epi16(mins16, q8s);
            if ORD == ORD_GEMM4 {
                let s: [__m256i; 4] = arr(|k| _mm256_add_epi32(p(2 * k), p(2 * k + 1)));
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

/// One token's super-block in the two orders ggml runs for Q3_K, Q6_K and IQ4_XS, from
/// its eight exact integer lanes: the tiled GEMM's `acc = fma(f32(Σ lanes) · x.d, y.d,
/// acc)`, or `vec_dot`'s `acc8_l = fma(y.d · x.d, f32(lane_l), acc8_l)`.
#[inline(always)]
unsafe fn lanes_step<const ORD: u8>(
    acc8: &mut __m256,
    acc: &mut f32,
    sumi: __m256i,
    xd: f32,
    yd: f32,
) {
    if ORD == ORD_TILED {
        *acc = (hsum_i32(sumi) as f32 * xd).mul_add(yd, *acc);
    } else {
        *acc8 = _mm256_fmadd_ps(_mm256_set1_ps(yd * xd), _mm256_cvtepi32_ps(sumi), *acc8);
    }
}

/// The result of [`lanes_step`]'s accumulators: the tiled float, or `hsum_float_8`.
#[inline(always)]
unsafe fn lanes_result<const ORD: u8>(acc8: __m256, acc: f32) -> f32 {
    if ORD == ORD_TILED {
        acc
    } else {
        hsum_ps(acc8)
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
            lanes_step::<ORD>(&mut acc[c], &mut acc_t[c], sumi, xd, yd);
        }
    }
    for c in 0..N {
        *out.add(c) = lanes_result::<ORD>(acc[c], acc_t[c]);
    }
}

/// # Safety
/// As [`q4_k_many`], with Q5_K weights. `ORD` picks the twin: `q5_k::vec_dot_q8k` (ggml's
/// AVX2 `vec_dot`: eight integer lanes of four-element groups fused into float lanes,
/// the mins into one float, the lanes summed as `hsum_float_8`) or `vec_dot_q8k_tiled`
/// (the tiled GEMM: Q4_K's with a fifth bit).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_k_many<const N: usize, const ORD: u8>(
    w: *const u8,
    a: *const u8,
    stride: usize,
    nb: usize,
    out: *mut f32,
) {
    let m4 = _mm256_set1_epi8(0x0f);
    let one = _mm256_set1_epi8(1);
    let mut acc8 = [_mm256_setzero_ps(); N];
    let mut summs = [0.0f32; N];
    let mut acc = [0.0f32; N];
    for i in 0..nb {
        // d, dmin at 0, scales at 4..16, qh at 16..48, qs at 48..176.
        let x = w.add(i * BlockQ5K::BYTES);
        if N <= 2 {
            prefetch_block(x, BlockQ5K::BYTES);
        }
        let xb = std::slice::from_raw_parts(x, BlockQ5K::BYTES);
        let (xd, xdmin) = f16x2_at(xb, 0);
        let (scl, mnl) = scales_mins_lanes(&xb[4..16]);
        let mins16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mnl as i64));
        let qh = ld256(x.add(16));
        let mut q5 = [_mm256_setzero_si256(); 8];
        let mut sc = [_mm256_setzero_si256(); 8];
        for j in 0..4 {
            let bits = ld256(x.add(48 + 32 * j));
            // Bit 2j of qh[l] is the fifth bit of element l of sub-block 2j, bit 2j + 1
            // that of sub-block 2j + 1 (a 16-bit shift, then a mask per byte).
            let h = |bit: usize| {
                let b = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(bit as i32));
                _mm256_slli_epi16::<4>(_mm256_and_si256(b, one))
            };
            q5[2 * j] = _mm256_or_si256(_mm256_and_si256(bits, m4), h(2 * j));
            q5[2 * j + 1] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4),
                h(2 * j + 1),
            );
        }
        for (b, sc) in sc.iter_mut().enumerate() {
            *sc = _mm256_set1_epi16(((scl >> (8 * b)) & 0xff) as i16);
        }
        let mins_pairs = if ORD == ORD_TILED {
            tiled_mins_pairs(mins16)
        } else {
            _mm256_setzero_si256()
        };
        for c in 0..N {
            let y = a.add(c * stride + i * Q8K_BYTES);
            let yd = y.cast::<f32>().read_unaligned();
            let q8sums = ld256(y.add(Q8K_BSUMS));
            let mut sumi = _mm256_setzero_si256();
            for b in 0..8 {
                let q8 = ld256(y.add(Q8K_QS + 32 * b));
                let p = _mm256_madd_epi16(sc[b], _mm256_maddubs_epi16(q5[b], q8));
                sumi = _mm256_add_epi32(sumi, p);
            }
            if ORD == ORD_TILED {
                let s2 = hsum_i32(_mm256_madd_epi16(q8sums, mins_pairs));
                acc[c] = tiled_step(hsum_i32(sumi), s2, xd, xdmin, yd, acc[c]);
                continue;
            }
            // The 32-element sums as i16 pair sums (`hadd_epi16`, wrapping).
            let q8s = _mm_hadd_epi16(
                _mm256_castsi256_si128(q8sums),
                _mm256_extracti128_si256::<1>(q8sums),
            );
            let m = hsum_i32x4(_mm_madd_epi16(mins16, q8s));
            acc8[c] = _mm256_fmadd_ps(_mm256_set1_ps(yd * xd), _mm256_cvtepi32_ps(sumi), acc8[c]);
            summs[c] = (-yd * xdmin).mul_add(m as f32, summs[c]);
        }
    }
    for c in 0..N {
        *out.add(c) = if ORD == ORD_TILED {
            acc[c]
        } else {
            let mut l = [0.0f32; 8];
            _mm256_storeu_ps(l.as_mut_ptr(), acc8[c]);
            crate::order::hsum_lanes(&l) + summs[c]
        };
    }
}

/// # Safety
/// As [`q4_k_many`], with IQ4_XS weights. `ORD` picks the twin: `iq4_xs::vec_dot_q8k`
/// (ggml's AVX2 `vec_dot`: eight integer lanes of four-element groups fused into float
/// lanes, `hsum_float_8` at the end) or `vec_dot_q8k_tiled` (the tiled GEMM: one integer
/// sum and two float steps per super-block). The products are ggml's `mul_add_epi8`
/// (`|w|` times `y` with `w`'s sign): pairs of table values (`|w| <= 127`) with
/// activations fit an i16.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4_xs_many<const N: usize, const ORD: u8>(
    w: *const u8,
    a: *const u8,
    stride: usize,
    nb: usize,
    out: *mut f32,
) {
    let table = _mm256_broadcastsi128_si256(ld128(KVALUES.as_ptr().cast()));
    let mut acc8 = [_mm256_setzero_ps(); N];
    let mut acc = [0.0f32; N];
    for i in 0..nb {
        // d at 0, scales_h at 2, scales_l at 4..8, qs at 8..136 (16 bytes per sub-block).
        let x = w.add(i * BlockIq4Xs::BYTES);
        if N <= 2 {
            prefetch_block(x, BlockIq4Xs::BYTES);
        }
        let xb = std::slice::from_raw_parts(x, BlockIq4Xs::BYTES);
        let xd = f16_at(xb, 0);
        let sh = u16::from_le_bytes([xb[2], xb[3]]);
        let mut q = [_mm256_setzero_si256(); 8];
        let mut aq = [_mm256_setzero_si256(); 8];
        let mut sc = [_mm256_setzero_si256(); 8];
        for b in 0..8 {
            q[b] = _mm256_shuffle_epi8(table, nibbles32(x.add(8 + 16 * b)));
            aq[b] = _mm256_sign_epi8(q[b], q[b]);
            let lo = (xb[4 + b / 2] >> (4 * (b % 2))) & 0x0f;
            let hi = ((sh >> (2 * b)) & 3) as u8;
            sc[b] = _mm256_set1_epi16((lo | (hi << 4)) as i16 - 32);
        }
        for c in 0..N {
            let y = a.add(c * stride + i * Q8K_BYTES);
            let yd = y.cast::<f32>().read_unaligned();
            let mut sumi = _mm256_setzero_si256();
            for b in 0..8 {
                let sy = _mm256_sign_epi8(ld256(y.add(Q8K_QS + 32 * b)), q[b]);
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(aq[b], sy), sc[b]);
                sumi = _mm256_add_epi32(sumi, p);
            }
            lanes_step::<ORD>(&mut acc8[c], &mut acc[c], sumi, xd, yd);
        }
    }
    for c in 0..N {
        *out.add(c) = lanes_result::<ORD>(acc8[c], acc[c]);
    }
}

/// # Safety
/// As [`q4_k_many`], with Q3_K weights. `ORD` picks the twin: `q3_k::vec_dot_q8k` (ggml's
/// AVX2 `vec_dot`: eight integer lanes of four-element groups fused into float lanes,
/// `hsum_float_8` at the end) or `vec_dot_q8k_tiled` (the tiled GEMM: one integer sum and
/// two float steps per super-block). The products are ggml's: the two low bits times the
/// activations, less 4 times them where the high bit is clear.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3_k_many<const N: usize, const ORD: u8>(
    w: *const u8,
    a: *const u8,
    stride: usize,
    nb: usize,
    out: *mut f32,
) {
    let m3 = _mm256_set1_epi8(3);
    let four = _mm256_set1_epi8(4);
    let mut acc8 = [_mm256_setzero_ps(); N];
    let mut acc = [0.0f32; N];
    for i in 0..nb {
        // hmask at 0..32, qs at 32..96, scales at 96..108, d at 108.
        let x = w.add(i * BlockQ3K::BYTES);
        if N <= 2 {
            prefetch_block(x, BlockQ3K::BYTES);
        }
        let xb = std::slice::from_raw_parts(x, BlockQ3K::BYTES);
        let xd = f16_at(xb, 108);
        let (s_lo, s_hi) = unpack_scales_lanes(&xb[96..108]);
        let scale = |j: usize| {
            let lanes = if j < 8 { s_lo } else { s_hi };
            ((lanes >> (8 * (j % 8))) & 0xff) as i16 - 32
        };
        let hbits = ld256(x);
        let mut ql = [_mm256_setzero_si256(); 8];
        let mut qh = [_mm256_setzero_si256(); 8];
        let mut sc = [_mm256_setzero_si256(); 8];
        for c in 0..8 {
            // Chunk c = 4h + k: bit pair k of qs[32h..], high bit c of hmask (4 where it
            // is clear), scales 2c (elements 0..16) and 2c + 1 (16..32).
            let (h, k) = (c / 4, c % 4);
            let bits = ld256(x.add(32 + 32 * h));
            ql[c] = _mm256_and_si256(_mm256_srl_epi16(bits, _mm_cvtsi32_si128(2 * k as i32)), m3);
            let hb = _mm256_srl_epi16(hbits, _mm_cvtsi32_si128(c as i32));
            qh[c] = _mm256_andnot_si256(_mm256_slli_epi16::<2>(hb), four);
            sc[c] = _mm256_set_m128i(
                _mm_set1_epi16(scale(2 * c + 1)),
                _mm_set1_epi16(scale(2 * c)),
            );
        }
        for c in 0..N {
            let y = a.add(c * stride + i * Q8K_BYTES);
            let yd = y.cast::<f32>().read_unaligned();
            let mut sumi = _mm256_setzero_si256();
            for b in 0..8 {
                let q8 = ld256(y.add(Q8K_QS + 32 * b));
                let p = _mm256_sub_epi16(
                    _mm256_maddubs_epi16(ql[b], q8),
                    _mm256_maddubs_epi16(qh[b], q8),
                );
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, sc[b]));
            }
            lanes_step::<ORD>(&mut acc8[c], &mut acc[c], sumi, xd, yd);
        }
    }
    for c in 0..N {
        *out.add(c) = lanes_result::<ORD>(acc8[c], acc[c]);
    }
}

/// Dispatches a call to the `N`-row instantiation of a K-quant kernel in order `$ord`.
macro_rules! many_entry_k {
    ($name:ident, $w:ty, $imp:ident, $ord:expr) => {
        pub(super) fn $name(
            w: &[u8],
            rows: usize,
            a: &[u8],
            stride: usize,
            side: ActSide<'_>,
            out: &mut [f32],
        ) {
            let k = check_tile::<$w, BlockQ8K>(w, rows, a, stride, side, out.len());
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
many_entry_k!(q5_k_many_entry, BlockQ5K, q5_k_many, ORD_SINGLE);
many_entry_k!(q5_k_tiled_many_entry, BlockQ5K, q5_k_many, ORD_TILED);
many_entry_k!(q3_k_many_entry, BlockQ3K, q3_k_many, ORD_SINGLE);
many_entry_k!(q3_k_tiled_many_entry, BlockQ3K, q3_k_many, ORD_TILED);
many_entry_k!(iq4_xs_many_entry, BlockIq4Xs, iq4_xs_many, ORD_SINGLE);
many_entry_k!(iq4_xs_tiled_many_entry, BlockIq4Xs, iq4_xs_many, ORD_TILED);

single_from_many!(q4_k_q8_k, BlockQ4K, BlockQ8K, q4_k_many_entry);
single_from_many!(q6_k_q8_k, BlockQ6K, BlockQ8K, q6_k_many_entry);
single_from_many!(q4_k_q8_k_tiled, BlockQ4K, BlockQ8K, q4_k_tiled_many_entry);
single_from_many!(q4_k_q8_k_gemm4, BlockQ4K, BlockQ8K, q4_k_gemm4_many_entry);
single_from_many!(q6_k_q8_k_tiled, BlockQ6K, BlockQ8K, q6_k_tiled_many_entry);
single_from_many!(q5_k_q8_k, BlockQ5K, BlockQ8K, q5_k_many_entry);
single_from_many!(q5_k_q8_k_tiled, BlockQ5K, BlockQ8K, q5_k_tiled_many_entry);
single_from_many!(q3_k_q8_k, BlockQ3K, BlockQ8K, q3_k_many_entry);
single_from_many!(q3_k_q8_k_tiled, BlockQ3K, BlockQ8K, q3_k_tiled_many_entry);
single_from_many!(iq4_xs_q8_k, BlockIq4Xs, BlockQ8K, iq4_xs_many_entry);
single_from_many!(
    iq4_xs_q8_k_tiled,
    BlockIq4Xs,
    BlockQ8K,
    iq4_xs_tiled_many_entry
);

// ---------------------------------------------------------------------------------------
// K-quants. Q8_K block: d (f32) at 0, qs at 4..260, bsums (16 x i16) at 260..292.

const Q8K_QS: usize = 4;
const Q8K_BSUMS: usize = 260;

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
