//! The K-quants on NEON. Q4_K and Q6_K as tiles (one weight block unpacked once for up to
//! eight Q8_K activation rows) in each of llama.cpp's kernel orders, and Q2_K, with and
//! without `sdot`; Q3_K, Q5_K and IQ4_XS one-row on plain NEON. Twins:
//! `q4_k::vec_dot_q8k{,_tiled,_gemm4}`, `q6_k::vec_dot_q8k{,_tiled}`, `q2_k::vec_dot_q8k`,
//! `q3_k/q5_k/iq4_xs::vec_dot_q8k{,_tiled}`.
//!
//! Q4_K, Q6_K's tiled order and Q2_K need only exact integer sums per super-block (or per
//! 64-element chunk), whatever lanes form them. Q6_K's and Q5_K's one-row orders keep
//! eight lanes of 4-element groups, exactly what `sdot` forms (Q5_K forms them with
//! widening multiplies and pairwise adds), as do Q3_K's and IQ4_XS's (IQ4_XS after
//! x86's sign trick, which `sdot` would not reproduce for a forged -128).
//!
//! Q8_K block: d (f32) at 0, qs at 4..260, bsums (16 x i16) at 260..292.

use core::arch::aarch64::*;

use super::simd::*;
use crate::contract::{check_tile, ActSide};
use crate::formats::common::{check_dot, Block};
use crate::formats::iq4_xs::BlockIq4Xs;
use crate::formats::q2_k::BlockQ2K;
use crate::formats::q3_k::{unpack_scales_lanes, BlockQ3K};
use crate::formats::q4_k::{scales_mins_lanes, tiled_step, BlockQ4K};
use crate::formats::q5_k::BlockQ5K;
use crate::formats::q6_k::BlockQ6K;
use crate::formats::q8_k::BlockQ8K;

const Q8K_QS: usize = 4;
const Q8K_BSUMS: usize = 260;

/// Kernel orders (const parameter `ORD`; see `crate::order::DotOrder`).
pub(super) const ORD_SINGLE: u8 = 0;
pub(super) const ORD_TILED: u8 = 1;
pub(super) const ORD_GEMM4: u8 = 2;

#[inline(always)]
unsafe fn s8(v: uint8x16_t) -> int8x16_t {
    vreinterpretq_s8_u8(v)
}

/// The 16 bsums of the Q8_K block at `y`: groups 0..8 and 8..16.
#[inline(always)]
unsafe fn bsums(y: *const u8) -> (int16x8_t, int16x8_t) {
    let p = y.add(Q8K_BSUMS).cast::<i16>();
    (vld1q_s16(p), vld1q_s16(p.add(8)))
}

/// The eight scales and mins of a Q4_K/Q5_K block from its 12 packed bytes at `p`.
#[inline(always)]
unsafe fn scales_mins(p: *const u8) -> ([u8; 8], [u8; 8]) {
    let (sc, mn) = scales_mins_lanes(core::slice::from_raw_parts(p, 12));
    (sc.to_le_bytes(), mn.to_le_bytes())
}

/// Eight bytes as i16 lanes.
#[inline(always)]
unsafe fn widen8(b: &[u8; 8]) -> int16x8_t {
    vreinterpretq_s16_u16(vmovl_u8(vld1_u8(b.as_ptr())))
}

/// `a[j] * b[j]` for the eight i16 lanes, widened (exact), lanes `j` and `j + 4` added.
#[inline(always)]
unsafe fn dot_i16(a: int16x8_t, b: int16x8_t) -> int32x4_t {
    vmlal_high_s16(vmull_s16(vget_low_s16(a), vget_low_s16(b)), a, b)
}

// ---------------------------------------------------------------------------------------
// Q4_K: one weight row against `N` activation rows.

/// # Safety
/// The level is available; `w` holds `nb` Q4_K blocks, `a` `N` rows of `nb` Q8_K blocks
/// `stride` bytes apart, `out` `N` slots. `ORD` picks the twin: `q4_k::vec_dot_q8k`
/// (single), `vec_dot_q8k_tiled` or `vec_dot_q8k_gemm4`.
#[inline(always)]
unsafe fn q4_k_body<D: Level, const N: usize, const ORD: u8>(
    w: *const u8,
    a: *const u8,
    stride: usize,
    nb: usize,
    out: *mut f32,
) {
    let mut acc = [0.0f32; N];
    let mut acc_m = [0.0f32; N];
    let zero = vdupq_n_s32(0);
    for i in 0..nb {
        let x = w.add(i * BlockQ4K::BYTES);
        let (xd, xdmin) = (f16_at(x), f16_at(x.add(2)));
        let (sc, mn) = scales_mins(x.add(4));
        let sc16 = widen8(&sc);
        // Scales of sub-blocks 0..4 and 4..8 as i32 lanes.
        let sc_a = vmovl_s16(vget_low_s16(sc16));
        let sc_b = vmovl_high_s16(sc16);
        let mins = widen8(&mn);
        // Sub-block 2k: low nibbles of qs[32k..32k + 32]; 2k + 1: their high nibbles.
        let mut q = [(vdupq_n_s8(0), vdupq_n_s8(0)); 8];
        for k in 0..4 {
            let b0 = ld_u8(x.add(16 + 32 * k));
            let b1 = ld_u8(x.add(32 + 32 * k));
            let m4 = vdupq_n_u8(0x0f);
            q[2 * k] = (s8(vandq_u8(b0, m4)), s8(vandq_u8(b1, m4)));
            q[2 * k + 1] = (s8(vshrq_n_u8::<4>(b0)), s8(vshrq_n_u8::<4>(b1)));
        }
        for c in 0..N {
            let y = a.add(c * stride + i * BlockQ8K::BYTES);
            let yd = f32_at(y);
            let yq = y.add(Q8K_QS);
            // Per sub-block sums of q * y, four lanes each, then one lane per sub-block.
            // (A plain loop: a closure here would not inherit the level's features, so
            // its `sdot`s would not inline.)
            let mut s = [zero; 8];
            for (b, s) in s.iter_mut().enumerate() {
                let p = D::dot(zero, q[b].0, ld_s8(yq.add(32 * b)));
                *s = D::dot(p, q[b].1, ld_s8(yq.add(32 * b + 16)));
            }
            let sub_a = vpaddq_s32(vpaddq_s32(s[0], s[1]), vpaddq_s32(s[2], s[3]));
            let sub_b = vpaddq_s32(vpaddq_s32(s[4], s[5]), vpaddq_s32(s[6], s[7]));
            // Lane j: scale[j] * sum of sub-block j (a: j < 4, b: j >= 4).
            let t_a = vmulq_s32(sub_a, sc_a);
            let t_b = vmulq_s32(sub_b, sc_b);
            let (bs0, bs1) = bsums(y);
            if ORD == ORD_TILED {
                // The bsum pairs widened to i32 before they are added.
                let pairs_a = vpaddlq_s16(bs0);
                let pairs_b = vpaddlq_s16(bs1);
                let m_a = vmovl_s16(vget_low_s16(mins));
                let m_b = vmovl_high_s16(mins);
                let s2 = vaddvq_s32(vmlaq_s32(vmulq_s32(pairs_a, m_a), pairs_b, m_b));
                let s1 = vaddvq_s32(vaddq_s32(t_a, t_b));
                acc[c] = tiled_step(s1, s2, xd, xdmin, yd, acc[c]);
                continue;
            }
            // The bsums of each 32-element sub-block, added in i16 (wrapping, as ggml's
            // `hadd_epi16`), times its min: lane j of `mp` for sub-blocks 0..4, 4..8.
            let bs32 = vpaddq_s16(bs0, bs1);
            let mp_a = vmull_s16(vget_low_s16(bs32), vget_low_s16(mins));
            let mp_b = vmull_high_s16(bs32, mins);
            if ORD == ORD_GEMM4 {
                // Lane k: chunk k = sub-blocks 2k, 2k + 1.
                let s1 = vcvtq_f32_s32(vpaddq_s32(t_a, t_b));
                let s2 = vcvtq_f32_s32(vpaddq_s32(mp_a, mp_b));
                let mut f1 = [0.0f32; 4];
                let mut f2 = [0.0f32; 4];
                vst1q_f32(f1.as_mut_ptr(), s1);
                vst1q_f32(f2.as_mut_ptr(), s2);
                let (d, dmin) = (xd * yd, xdmin * yd);
                for k in 0..4 {
                    acc[c] = f1[k].mul_add(d, acc[c]);
                    acc_m[c] = f2[k].mul_add(dmin, acc_m[c]);
                }
                continue;
            }
            let s1 = vaddvq_s32(vaddq_s32(t_a, t_b));
            let s2 = vaddvq_s32(vaddq_s32(mp_a, mp_b));
            acc[c] = (s1 as f32).mul_add(xd * yd, acc[c]);
            acc_m[c] = (s2 as f32).mul_add(xdmin * yd, acc_m[c]);
        }
    }
    for c in 0..N {
        *out.add(c) = if ORD == ORD_TILED {
            acc[c]
        } else {
            acc[c] - acc_m[c]
        };
    }
}

// ---------------------------------------------------------------------------------------
// Q6_K: one weight row against `N` activation rows.

/// # Safety
/// As [`q4_k_body`], with Q6_K weights (`ORD`: `q6_k::vec_dot_q8k` or
/// `vec_dot_q8k_tiled`).
#[inline(always)]
unsafe fn q6_k_body<D: Level, const N: usize, const ORD: u8>(
    w: *const u8,
    a: *const u8,
    stride: usize,
    nb: usize,
    out: *mut f32,
) {
    let mut acc = [F8::zero(); N];
    let mut acc_t = [0.0f32; N];
    let zero = vdupq_n_s32(0);
    for i in 0..nb {
        let x = w.add(i * BlockQ6K::BYTES);
        let xd = f16_at(x.add(208));
        let scales = ld_s8(x.add(192));
        let mut sc = [0i32; 16];
        for (j, s) in sc.iter_mut().enumerate() {
            *s = *x.add(192 + j) as i8 as i32;
        }
        let sc16_a = vmovl_s8(vget_low_s8(scales));
        let sc16_b = vmovl_high_s8(scales);
        // The unsigned 6-bit quants of 32-element chunk m = 4h + t (elements 32m..32m+32)
        // as two vectors: low or high nibbles of ql, bit pair t of qh on top.
        let mut q = [(vdupq_n_s8(0), vdupq_n_s8(0)); 8];
        let m4 = vdupq_n_u8(0x0f);
        let top2 = vdupq_n_u8(0x30);
        for h in 0..2 {
            for half in 0..2 {
                let l0 = ld_u8(x.add(64 * h + 16 * half));
                let l1 = ld_u8(x.add(64 * h + 32 + 16 * half));
                let qh = ld_u8(x.add(128 + 32 * h + 16 * half));
                let v = [
                    vorrq_u8(vandq_u8(l0, m4), vandq_u8(vshlq_n_u8::<4>(qh), top2)),
                    vorrq_u8(vandq_u8(l1, m4), vandq_u8(vshlq_n_u8::<2>(qh), top2)),
                    vorrq_u8(vshrq_n_u8::<4>(l0), vandq_u8(qh, top2)),
                    vorrq_u8(vshrq_n_u8::<4>(l1), vandq_u8(vshrq_n_u8::<2>(qh), top2)),
                ];
                for (t, v) in v.into_iter().enumerate() {
                    if half == 0 {
                        q[4 * h + t].0 = s8(v);
                    } else {
                        q[4 * h + t].1 = s8(v);
                    }
                }
            }
        }
        for c in 0..N {
            let y = a.add(c * stride + i * BlockQ8K::BYTES);
            let yd = f32_at(y);
            let yq = y.add(Q8K_QS);
            // Lanes 0..4 (elements 32m + 4l..) take scale 2m, lanes 4..8 scale 2m + 1.
            let mut lo = zero;
            let mut hi = zero;
            for m in 0..8 {
                let p0 = D::dot(zero, q[m].0, ld_s8(yq.add(32 * m)));
                let p1 = D::dot(zero, q[m].1, ld_s8(yq.add(32 * m + 16)));
                lo = vmlaq_n_s32(lo, p0, sc[2 * m]);
                hi = vmlaq_n_s32(hi, p1, sc[2 * m + 1]);
            }
            // The -32 offset: lane l subtracts 32 (bsums[2l] sc[2l] + bsums[2l+1] sc[2l+1]).
            let (bs0, bs1) = bsums(y);
            let sub_lo = vpaddq_s32(
                vmull_s16(vget_low_s16(bs0), vget_low_s16(sc16_a)),
                vmull_high_s16(bs0, sc16_a),
            );
            let sub_hi = vpaddq_s32(
                vmull_s16(vget_low_s16(bs1), vget_low_s16(sc16_b)),
                vmull_high_s16(bs1, sc16_b),
            );
            let lo = vsubq_s32(lo, vshlq_n_s32::<5>(sub_lo));
            let hi = vsubq_s32(hi, vshlq_n_s32::<5>(sub_hi));
            if ORD == ORD_TILED {
                let s1 = vaddvq_s32(vaddq_s32(lo, hi));
                acc_t[c] = (s1 as f32 * xd).mul_add(yd, acc_t[c]);
            } else {
                acc[c] = acc[c].fma(yd * xd, lo, hi);
            }
        }
    }
    for c in 0..N {
        *out.add(c) = if ORD == ORD_TILED {
            acc_t[c]
        } else {
            acc[c].hsum()
        };
    }
}

/// Dispatches a tile call to the `N`-row instantiation of a one-weight-row K-quant body,
/// one weight row at a time.
macro_rules! k_tile {
    ($name:ident, $w:ty, $body:ident) => {
        pub(super) fn $name<D: Level, const ORD: u8>(
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
                macro_rules! go {
                    ($n:literal) => {
                        D::run(|| $body::<D, $n, ORD>(wp, ap, stride, k.nb, op))
                    };
                }
                // SAFETY: the kernel table hands this level out only where it was
                // detected; `check_tile` validated every byte the body reads, and `out`
                // has `cols` slots from `op`.
                unsafe {
                    match k.cols {
                        1 => go!(1),
                        2 => go!(2),
                        3 => go!(3),
                        4 => go!(4),
                        5 => go!(5),
                        6 => go!(6),
                        7 => go!(7),
                        _ => go!(8),
                    }
                }
            }
        }
    };
}

k_tile!(q4_k_tile, BlockQ4K, q4_k_body);
k_tile!(q6_k_tile, BlockQ6K, q6_k_body);

/// The one-row Q4_K kernel in order `ORD` (the tile's one-row instance).
pub(super) fn q4_k_dot<D: Level, const ORD: u8>(w: &[u8], a: &[u8]) -> f32 {
    check_dot::<BlockQ4K, BlockQ8K>(w, a);
    let mut out = [0.0f32];
    q4_k_tile::<D, ORD>(w, 1, a, a.len(), ActSide::default(), &mut out);
    out[0]
}

/// The one-row Q6_K kernel in order `ORD` (the tile's one-row instance).
pub(super) fn q6_k_dot<D: Level, const ORD: u8>(w: &[u8], a: &[u8]) -> f32 {
    check_dot::<BlockQ6K, BlockQ8K>(w, a);
    let mut out = [0.0f32];
    q6_k_tile::<D, ORD>(w, 1, a, a.len(), ActSide::default(), &mut out);
    out[0]
}

// ---------------------------------------------------------------------------------------
// Q2_K: one exact integer sum per super-block.

/// # Safety
/// The level is available; `w` holds `nb` Q2_K blocks and `a` `nb` Q8_K blocks.
#[inline(always)]
unsafe fn q2_k_body<D: Level>(w: *const u8, a: *const u8, nb: usize) -> f32 {
    let zero = vdupq_n_s32(0);
    let m3 = vdupq_n_u8(3);
    let mut sumf = 0.0f32;
    for i in 0..nb {
        let x = w.add(i * BlockQ2K::BYTES);
        let y = a.add(i * BlockQ8K::BYTES);
        let yq = y.add(Q8K_QS);
        // scales at 0..16 (low nibble scale, high nibble min), qs at 16..80, d, dmin.
        let sb = ld_u8(x);
        let sc16_a = vmovl_u8(vget_low_u8(vandq_u8(sb, vdupq_n_u8(0x0f))));
        let sc16_b = vmovl_high_u8(vandq_u8(sb, vdupq_n_u8(0x0f)));
        // Scales of sub-blocks 4g..4g + 4 as i32 lanes.
        let sc = [
            vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(sc16_a))),
            vreinterpretq_s32_u32(vmovl_high_u16(sc16_a)),
            vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(sc16_b))),
            vreinterpretq_s32_u32(vmovl_high_u16(sc16_b)),
        ];
        let mins_a = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(vshrq_n_u8::<4>(sb))));
        let mins_b = vreinterpretq_s16_u16(vmovl_high_u8(vshrq_n_u8::<4>(sb)));
        let (bs0, bs1) = bsums(y);
        let summs = vaddvq_s32(vaddq_s32(dot_i16(bs0, mins_a), dot_i16(bs1, mins_b)));
        let mut isum = zero;
        for h in 0..2 {
            // Bytes 0..16 and 16..32 of this half's quants; shift j holds elements
            // 128h + 32j + (0..16 | 16..32), sub-blocks 8h + 2j and 8h + 2j + 1.
            let mut q0 = ld_u8(x.add(16 + 32 * h));
            let mut q1 = ld_u8(x.add(32 + 32 * h));
            let mut s = [zero; 4];
            for j in 0..4 {
                let v0 = s8(vandq_u8(q0, m3));
                let v1 = s8(vandq_u8(q1, m3));
                q0 = vshrq_n_u8::<2>(q0);
                q1 = vshrq_n_u8::<2>(q1);
                let base = yq.add(128 * h + 32 * j);
                let p0 = D::dot(zero, v0, ld_s8(base));
                let p1 = D::dot(zero, v1, ld_s8(base.add(16)));
                s[j] = vpaddq_s32(p0, p1);
            }
            // Lane k: the sum of sub-block 8h + 4g + k (g = 0, 1), times its scale.
            isum = vmlaq_s32(isum, vpaddq_s32(s[0], s[1]), sc[2 * h]);
            isum = vmlaq_s32(isum, vpaddq_s32(s[2], s[3]), sc[2 * h + 1]);
        }
        let isum = vaddvq_s32(isum);
        let yd = f32_at(y);
        let (xd, xdmin) = (f16_at(x.add(80)), f16_at(x.add(82)));
        let dall = yd * xd;
        let dmin = yd * xdmin;
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

/// The one-row Q2_K kernel.
pub(super) fn q2_k_dot<D: Level>(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ2K, BlockQ8K>(w, a);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    // SAFETY: the kernel table hands this level out only where it was detected;
    // `check_dot` validated both rows for `nb` blocks.
    unsafe { D::run(|| q2_k_body::<D>(wp, ap, nb)) }
}

// ---------------------------------------------------------------------------------------
// Q3_K and Q5_K in ggml's generic order: integer lane e % 8, float lanes multiply-add.

/// Q3_K's 16 six-bit scales minus 32 (`q3_k::unpack_scales(..) - 32`), from the 12 bytes
/// at `p`.
#[inline(always)]
unsafe fn q3_k_scales(p: *const u8) -> [i16; 16] {
    let (a, b) = unpack_scales_lanes(core::slice::from_raw_parts(p, 12));
    let (a, b) = (a.to_le_bytes(), b.to_le_bytes());
    core::array::from_fn(|j| if j < 8 { a[j] } else { b[j - 8] } as i16 - 32)
}

/// One super-block in the two orders ggml runs for Q3_K and IQ4_XS, from its eight exact
/// integer lanes (`s_lo`: 0..4, `s_hi`: 4..8): the tiled GEMM's `acc = fma(f32(Σ lanes) ·
/// x.d, y.d, acc)`, or `vec_dot`'s `acc8_l = fma(y.d · x.d, f32(lane_l), acc8_l)`.
#[inline(always)]
unsafe fn lanes_step<const TILED: bool>(
    acc8: &mut F8,
    acc: &mut f32,
    (s_lo, s_hi): (int32x4_t, int32x4_t),
    xd: f32,
    yd: f32,
) {
    if TILED {
        let s = vaddvq_s32(vaddq_s32(s_lo, s_hi));
        *acc = (s as f32 * xd).mul_add(yd, *acc);
    } else {
        *acc8 = acc8.fma(yd * xd, s_lo, s_hi);
    }
}

/// # Safety
/// `w` holds `nb` Q3_K blocks and `a` `nb` Q8_K blocks. Without `TILED` ggml's AVX2
/// `vec_dot` order (`q3_k::vec_dot_q8k`): lane `l` of eight sums `(sc_s - 32) · Σ q·y`
/// over elements `32c + 4l..+4` of every chunk `c`, fused into float lanes, summed as
/// `hsum_float_8`; with it the tiled GEMM's order (`q3_k::vec_dot_q8k_tiled`).
#[inline(always)]
unsafe fn q3_k_body<const TILED: bool>(w: *const u8, a: *const u8, nb: usize) -> f32 {
    let m3 = vdupq_n_u8(3);
    let four = vdupq_n_u8(4);
    let mut acc8 = F8::zero();
    let mut acc = 0.0f32;
    for i in 0..nb {
        let x = w.add(i * BlockQ3K::BYTES);
        let y = a.add(i * BlockQ8K::BYTES);
        let yq = y.add(Q8K_QS);
        // hmask at 0..32, qs at 32..96, scales at 96..108, d at 108.
        let sc = q3_k_scales(x.add(96));
        let hm = [ld_u8(x), ld_u8(x.add(16))];
        let (mut s_lo, mut s_hi) = (vdupq_n_s32(0), vdupq_n_s32(0));
        for h in 0..2 {
            let mut q = [ld_u8(x.add(32 + 32 * h)), ld_u8(x.add(48 + 32 * h))];
            for c in 0..4 {
                // Elements 128h + 32c + 16half + (0..16), sub-block 8h + 2c + half:
                // bits 2c.. of qs, minus 4 where bit 4h + c of hmask is clear. The first
                // half gives lanes 0..4, the second lanes 4..8.
                let bit = vdupq_n_u8(1 << (4 * h + c));
                let v: [int8x16_t; 2] = core::array::from_fn(|half| {
                    let low = vandq_u8(q[half], m3);
                    s8(vsubq_u8(low, vbicq_u8(four, vtstq_u8(hm[half], bit))))
                });
                let sb = yq.add(128 * h + 32 * c);
                let s = 8 * h + 2 * c;
                s_lo = vmlaq_n_s32(s_lo, sum4(v[0], ld_s8(sb)), sc[s] as i32);
                s_hi = vmlaq_n_s32(s_hi, sum4(v[1], ld_s8(sb.add(16))), sc[s + 1] as i32);
                q = [vshrq_n_u8::<2>(q[0]), vshrq_n_u8::<2>(q[1])];
            }
        }
        let (yd, xd) = (f32_at(y), f16_at(x.add(108)));
        lanes_step::<TILED>(&mut acc8, &mut acc, (s_lo, s_hi), xd, yd);
    }
    if TILED {
        acc
    } else {
        acc8.hsum()
    }
}

/// `Σ q·y` over each group of four consecutive bytes of `q` and `y`: lanes 0..4 for
/// bytes 0..16 (exact: a widened product of two bytes fits an i16).
#[inline(always)]
unsafe fn sum4(q: int8x16_t, y: int8x16_t) -> int32x4_t {
    let lo = vpaddlq_s16(vmull_s8(vget_low_s8(q), vget_low_s8(y)));
    let hi = vpaddlq_s16(vmull_high_s8(q, y));
    vpaddq_s32(lo, hi)
}

/// # Safety
/// `w` holds `nb` Q5_K blocks and `a` `nb` Q8_K blocks. Without `TILED` ggml's AVX2
/// `vec_dot` order (`q5_k::vec_dot_q8k`): lane `l` of eight sums `scale[b] · Σ q·y` over
/// elements `4l..4l+4` of every sub-block `b`, fused into float lanes, the mins into one
/// float, the lanes summed as `hsum_float_8`; with it the tiled GEMM's order
/// (`q5_k::vec_dot_q8k_tiled`).
#[inline(always)]
unsafe fn q5_k_body<const TILED: bool>(w: *const u8, a: *const u8, nb: usize) -> f32 {
    let m4 = vdupq_n_u8(0x0f);
    let bit4 = vdupq_n_u8(0x10);
    let mut acc8 = F8::zero();
    let mut summs = 0.0f32;
    let mut acc = 0.0f32;
    for i in 0..nb {
        let x = w.add(i * BlockQ5K::BYTES);
        let y = a.add(i * BlockQ8K::BYTES);
        let yq = y.add(Q8K_QS);
        // d, dmin at 0, scales at 4..16, qh at 16..48, qs at 48..176.
        let (sc, mn) = scales_mins(x.add(4));
        let qh = [ld_u8(x.add(16)), ld_u8(x.add(32))];
        let (mut s_lo, mut s_hi) = (vdupq_n_s32(0), vdupq_n_s32(0));
        for k in 0..4 {
            let b = [ld_u8(x.add(48 + 32 * k)), ld_u8(x.add(64 + 32 * k))];
            // Sub-block 2k: low nibbles, fifth bit 2k of qh; 2k + 1: high nibbles, bit
            // 2k + 1. Elements 0..16 of a sub-block give lanes 0..4, 16..32 lanes 4..8.
            for s in 0..2 {
                let bit = vdupq_n_u8(1 << (2 * k + s));
                let v: [uint8x16_t; 2] = core::array::from_fn(|half| {
                    let nib = if s == 0 {
                        vandq_u8(b[half], m4)
                    } else {
                        vshrq_n_u8::<4>(b[half])
                    };
                    vorrq_u8(nib, vandq_u8(vtstq_u8(qh[half], bit), bit4))
                });
                let sb = yq.add(64 * k + 32 * s);
                let scale = sc[2 * k + s] as i32;
                s_lo = vmlaq_n_s32(s_lo, sum4(s8(v[0]), ld_s8(sb)), scale);
                s_hi = vmlaq_n_s32(s_hi, sum4(s8(v[1]), ld_s8(sb.add(16))), scale);
            }
        }
        let yd = f32_at(y);
        let (xd, xdmin) = (f16_at(x), f16_at(x.add(2)));
        let bsum = |j: usize| y.add(Q8K_BSUMS + 2 * j).cast::<i16>().read_unaligned();
        if TILED {
            let s = vaddvq_s32(vaddq_s32(s_lo, s_hi));
            let m: i32 = (0..8)
                .map(|j| mn[j] as i32 * (bsum(2 * j) as i32 + bsum(2 * j + 1) as i32))
                .sum();
            acc = tiled_step(s, m, xd, xdmin, yd, acc);
        } else {
            acc8 = acc8.fma(yd * xd, s_lo, s_hi);
            // The 32-element sums as an i16 pair sum (wrapping), as the twin.
            let m: i32 = (0..8)
                .map(|j| mn[j] as i32 * bsum(2 * j).wrapping_add(bsum(2 * j + 1)) as i32)
                .sum();
            summs = (-yd * xdmin).mul_add(m as f32, summs);
        }
    }
    if TILED {
        acc
    } else {
        acc8.hsum() + summs
    }
}

/// `Σ |w|·(y with w's sign)` over each group of four consecutive bytes: lanes 0..4 for
/// bytes 0..16. ggml's x86 sign trick (`mul_add_epi8`), which the IQ4_XS twin follows:
/// the exact products for every activation the quantizer writes, and the x86 kernels'
/// for a forged -128 (its negation wraps).
#[inline(always)]
unsafe fn sum4_sign(w: int8x16_t, y: int8x16_t) -> int32x4_t {
    let aw = vabsq_s8(w);
    let sy = vbslq_s8(vcltzq_s8(w), vnegq_s8(y), y);
    let lo = vpaddlq_s16(vmull_s8(vget_low_s8(aw), vget_low_s8(sy)));
    let hi = vpaddlq_s16(vmull_high_s8(aw, sy));
    vpaddq_s32(lo, hi)
}

/// # Safety
/// `w` holds `nb` IQ4_XS blocks and `a` `nb` Q8_K blocks. Without `TILED` ggml's AVX2
/// `vec_dot` order (`iq4_xs::vec_dot_q8k`): lane `l` of eight sums `ls_b · Σ q·y` over
/// elements `4l..4l+4` of every sub-block `b`, fused into float lanes, summed as
/// `hsum_float_8`; with it the tiled GEMM's order (`iq4_xs::vec_dot_q8k_tiled`).
#[inline(always)]
unsafe fn iq4_xs_body<const TILED: bool>(w: *const u8, a: *const u8, nb: usize) -> f32 {
    let table = vld1q_s8(crate::formats::iq4_nl::KVALUES.as_ptr());
    let m4 = vdupq_n_u8(0x0f);
    let mut acc8 = F8::zero();
    let mut acc = 0.0f32;
    for i in 0..nb {
        // d at 0, scales_h at 2, scales_l at 4..8, qs at 8..136 (16 bytes per sub-block).
        let x = w.add(i * BlockIq4Xs::BYTES);
        let y = a.add(i * BlockQ8K::BYTES);
        let yq = y.add(Q8K_QS);
        let sh = x.add(2).cast::<u16>().read_unaligned();
        let (mut s_lo, mut s_hi) = (vdupq_n_s32(0), vdupq_n_s32(0));
        for b in 0..8 {
            let lo = (*x.add(4 + b / 2) >> (4 * (b % 2))) & 0x0f;
            let ls = (lo | (((sh >> (2 * b)) & 3) as u8) << 4) as i32 - 32;
            let q = ld_u8(x.add(8 + 16 * b));
            // Elements 0..16 (low nibbles) give lanes 0..4, 16..32 lanes 4..8.
            let v0 = vqtbl1q_s8(table, vandq_u8(q, m4));
            let v1 = vqtbl1q_s8(table, vshrq_n_u8::<4>(q));
            let sb = yq.add(32 * b);
            s_lo = vmlaq_n_s32(s_lo, sum4_sign(v0, ld_s8(sb)), ls);
            s_hi = vmlaq_n_s32(s_hi, sum4_sign(v1, ld_s8(sb.add(16))), ls);
        }
        let (yd, xd) = (f32_at(y), f16_at(x));
        lanes_step::<TILED>(&mut acc8, &mut acc, (s_lo, s_hi), xd, yd);
    }
    if TILED {
        acc
    } else {
        acc8.hsum()
    }
}

/// The one-row IQ4_XS kernel (plain NEON) in its one-token order, or with `TILED` in the
/// tiled GEMM's.
pub(super) fn iq4_xs_dot<const TILED: bool>(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockIq4Xs, BlockQ8K>(w, a);
    // SAFETY: NEON is part of every aarch64 target; `check_dot` validated both rows for
    // `nb` blocks.
    unsafe { iq4_xs_body::<TILED>(w.as_ptr(), a.as_ptr(), nb) }
}

/// The one-row Q3_K kernel (plain NEON) in its one-token order, or with `TILED` in the
/// tiled GEMM's.
pub(super) fn q3_k_dot<const TILED: bool>(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ3K, BlockQ8K>(w, a);
    // SAFETY: NEON is part of every aarch64 target; `check_dot` validated both rows for
    // `nb` blocks.
    unsafe { q3_k_body::<TILED>(w.as_ptr(), a.as_ptr(), nb) }
}

/// The one-row Q5_K kernel (plain NEON) in its one-token order, or with `TILED` in the
/// tiled GEMM's.
pub(super) fn q5_k_dot<const TILED: bool>(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ5K, BlockQ8K>(w, a);
    // SAFETY: as `q3_k_dot`.
    unsafe { q5_k_body::<TILED>(w.as_ptr(), a.as_ptr(), nb) }
}
