//! The 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, IQ4_NL) on NEON, with and
//! without `sdot`. Twins: `q4_0::vec_dot_q8_0` and the other formats' `vec_dot_*`, which follow
//! ggml's x86 order: per block eight exact i32 lanes (elements `4l..4l+4`), converted and
//! fused-multiply-added with the block's scale product into eight float lanes, folded by
//! `hsum_lanes` at the end (Q4_1/Q5_1 add their `m * s` running sum after the fold;
//! MXFP4 and IQ4_NL keep even and odd blocks in two sets of lanes, see
//! `formats::lut::vec_dot_paired`). Their repacked order (`formats::lut::vec_dot_repacked`:
//! one integer sum and one FMA per block) puts four weight rows in the lanes of one
//! register ([`rep_tile`]).
//!
//! A block's 32 weights are unpacked once into two signed byte vectors (elements 0..16
//! and 16..32); two `Level::dot`s against the activation quants give lanes 0..4 and 4..8
//! directly, signed times signed, so no sign trick is needed and any activation byte
//! (even -128) is exact.

use core::arch::aarch64::*;

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

/// One 32-element weight format and the activation format it is dotted with.
pub(super) trait Legacy {
    type W: Block;
    type A: Block;
    /// Offset of the activation quants in their block (Q8_0: 2, Q8_1: 4).
    const A_QS: usize;
    /// Signed weights (Q4_0, Q5_0, Q8_0, MXFP4); else unsigned with a min (Q4_1, Q5_1),
    /// which Q8_1's sum `s` multiplies.
    const SIGNED: bool;
    /// Even and odd blocks in two sets of float lanes, an unpaired last block added after
    /// the fold (MXFP4's `vec_dot`).
    const PAIRED: bool = false;
    /// The block's scale, widened (an f16 at the block's start, MXFP4's exponent byte).
    ///
    /// # Safety
    /// `w` points to a whole weight block.
    #[inline(always)]
    unsafe fn d(w: *const u8) -> f32 {
        f16_at(w)
    }
    /// The block's quants (offset subtracted) as signed bytes: elements 0..16, 16..32.
    ///
    /// # Safety
    /// `w` points to a whole weight block.
    unsafe fn unpack(w: *const u8) -> (int8x16_t, int8x16_t);
}

pub(super) struct Q4_0;
pub(super) struct Q4_1;
pub(super) struct Q5_0;
pub(super) struct Q5_1;
pub(super) struct Q8_0;
pub(super) struct Mxfp4;
pub(super) struct Iq4Nl;

/// Low nibbles (elements 0..16) and high nibbles (16..32) of the 16 bytes at `p`.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> (uint8x16_t, uint8x16_t) {
    let q = ld_u8(p);
    (vandq_u8(q, vdupq_n_u8(0x0f)), vshrq_n_u8::<4>(q))
}

#[inline(always)]
unsafe fn s8(v: uint8x16_t) -> int8x16_t {
    vreinterpretq_s8_u8(v)
}

impl Legacy for Q4_0 {
    type W = BlockQ4_0;
    type A = BlockQ8_0;
    const A_QS: usize = 2;
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn unpack(w: *const u8) -> (int8x16_t, int8x16_t) {
        let (lo, hi) = nibbles(w.add(2));
        let eight = vdupq_n_s8(8);
        (vsubq_s8(s8(lo), eight), vsubq_s8(s8(hi), eight))
    }
}

impl Legacy for Q4_1 {
    type W = BlockQ4_1;
    type A = BlockQ8_1;
    const A_QS: usize = 4;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn unpack(w: *const u8) -> (int8x16_t, int8x16_t) {
        let (lo, hi) = nibbles(w.add(4));
        (s8(lo), s8(hi))
    }
}

impl Legacy for Q5_0 {
    type W = BlockQ5_0;
    type A = BlockQ8_0;
    const A_QS: usize = 2;
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn unpack(w: *const u8) -> (int8x16_t, int8x16_t) {
        // q - 16 is the nibble where the fifth bit is set, else the nibble with its top
        // four bits set (nibble - 16 as a byte).
        let (m0, m1) = bit_masks(u32::from_le(w.add(2).cast::<u32>().read_unaligned()));
        let (lo, hi) = nibbles(w.add(6));
        let top = vdupq_n_u8(0xf0);
        (
            s8(vorrq_u8(lo, vbicq_u8(top, m0))),
            s8(vorrq_u8(hi, vbicq_u8(top, m1))),
        )
    }
}

impl Legacy for Q5_1 {
    type W = BlockQ5_1;
    type A = BlockQ8_1;
    const A_QS: usize = 4;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn unpack(w: *const u8) -> (int8x16_t, int8x16_t) {
        let (m0, m1) = bit_masks(u32::from_le(w.add(4).cast::<u32>().read_unaligned()));
        let (lo, hi) = nibbles(w.add(8));
        let bit4 = vdupq_n_u8(0x10);
        (
            s8(vorrq_u8(lo, vandq_u8(m0, bit4))),
            s8(vorrq_u8(hi, vandq_u8(m1, bit4))),
        )
    }
}

impl Legacy for Mxfp4 {
    type W = BlockMxfp4;
    type A = BlockQ8_0;
    const A_QS: usize = 2;
    const SIGNED: bool = true;
    const PAIRED: bool = true;
    #[inline(always)]
    unsafe fn d(w: *const u8) -> f32 {
        mxfp4::e8m0_to_f32_half(*w)
    }
    #[inline(always)]
    unsafe fn unpack(w: *const u8) -> (int8x16_t, int8x16_t) {
        let (lo, hi) = nibbles(w.add(1));
        let table = vld1q_s8(mxfp4::KVALUES.as_ptr());
        (vqtbl1q_s8(table, lo), vqtbl1q_s8(table, hi))
    }
}

/// IQ4_NL: MXFP4's layout and orders with its own table (values up to 127 in magnitude:
/// products of two such bytes, and sums of two products, still fit 16 bits) and an f16
/// scale.
impl Legacy for Iq4Nl {
    type W = BlockIq4Nl;
    type A = BlockQ8_0;
    const A_QS: usize = 2;
    const SIGNED: bool = true;
    const PAIRED: bool = true;
    #[inline(always)]
    unsafe fn unpack(w: *const u8) -> (int8x16_t, int8x16_t) {
        let (lo, hi) = nibbles(w.add(2));
        let table = vld1q_s8(iq4_nl::KVALUES.as_ptr());
        (vqtbl1q_s8(table, lo), vqtbl1q_s8(table, hi))
    }
}

impl Legacy for Q8_0 {
    type W = BlockQ8_0;
    type A = BlockQ8_0;
    const A_QS: usize = 2;
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn unpack(w: *const u8) -> (int8x16_t, int8x16_t) {
        (ld_s8(w.add(2)), ld_s8(w.add(18)))
    }
}

/// `R` weight rows (`wstride` bytes apart) against `N` activation rows (`stride` apart),
/// `nb` blocks each; `out[r * N + c]`. With `ad_stride != 0`, `ad` holds each activation
/// row's block scales widened to f32 (`d`, or `(d, s)` for Q8_1), rows `ad_stride` floats
/// apart.
///
/// # Safety
/// The level is available; every pointer covers what it is said to hold.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn legacy_body<T: Legacy, D: Level, const R: usize, const N: usize>(
    w: *const u8,
    wstride: usize,
    a: *const u8,
    stride: usize,
    ad: *const f32,
    ad_stride: usize,
    nb: usize,
    out: *mut f32,
) {
    let per = if T::SIGNED { 1 } else { 2 };
    let mut acc = [[F8::zero(); N]; R];
    let mut summs = [[0.0f32; N]; R];
    // `PAIRED` only: the odd blocks' lanes, and an unpaired last block's scale product
    // and integer sum.
    let mut acc_odd = [[F8::zero(); N]; R];
    let mut tail = [[(0.0f32, 0i32); N]; R];
    let paired = if T::PAIRED { nb - nb % 2 } else { nb };
    let zero = vdupq_n_s32(0);
    for i in 0..nb {
        let mut x = [(vdupq_n_s8(0), vdupq_n_s8(0)); R];
        let mut dx = [0.0f32; R];
        let mut mx = [0.0f32; R];
        for r in 0..R {
            let wb = w.add(r * wstride + i * T::W::BYTES);
            x[r] = T::unpack(wb);
            dx[r] = T::d(wb);
            if !T::SIGNED {
                mx[r] = f16_at(wb.add(2));
            }
        }
        for c in 0..N {
            let ab = a.add(c * stride + i * T::A::BYTES);
            let y0 = ld_s8(ab.add(T::A_QS));
            let y1 = ld_s8(ab.add(T::A_QS + 16));
            let (dy, sy) = if ad_stride != 0 {
                let q = ad.add(c * ad_stride + i * per);
                (*q, if T::SIGNED { 0.0 } else { *q.add(1) })
            } else {
                (f16_at(ab), if T::SIGNED { 0.0 } else { f16_at(ab.add(2)) })
            };
            for r in 0..R {
                let lo = D::dot(zero, x[r].0, y0);
                let hi = D::dot(zero, x[r].1, y1);
                if T::PAIRED && i >= paired {
                    tail[r][c] = (dx[r] * dy, vaddvq_s32(vaddq_s32(lo, hi)));
                } else if T::PAIRED && i % 2 == 1 {
                    acc_odd[r][c] = acc_odd[r][c].fma(dx[r] * dy, lo, hi);
                } else {
                    acc[r][c] = acc[r][c].fma(dx[r] * dy, lo, hi);
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
                let (a, b) = (acc[r][c], acc_odd[r][c]);
                let both = F8 {
                    lo: vaddq_f32(a.lo, b.lo),
                    hi: vaddq_f32(a.hi, b.hi),
                };
                let (d, sumi) = tail[r][c];
                if paired < nb {
                    both.hsum() + d * sumi as f32
                } else {
                    both.hsum()
                }
            } else {
                acc[r][c].hsum()
            };
            *out.add(r * N + c) = if T::SIGNED { h } else { h + summs[r][c] };
        }
    }
}

/// The tile kernel (`TileFn`) for format `T` at level `D`. Two weight rows take four
/// activation rows at a time (16 accumulator registers), one row all eight.
pub(super) fn tile<T: Legacy, D: Level>(
    w: &[u8],
    rows: usize,
    a: &[u8],
    stride: usize,
    side: ActSide<'_>,
    out: &mut [f32],
) {
    let k = check_tile::<T::W, T::A>(w, rows, a, stride, side, out.len());
    let mut c0 = 0;
    while c0 < k.cols {
        let n = if k.rows == 2 {
            (k.cols - c0).min(4)
        } else {
            k.cols - c0
        };
        let wp = w.as_ptr();
        let ap = a.as_ptr().wrapping_add(c0 * stride);
        // `ad_stride` is 0 when no scales were passed; the pointer is then never read.
        let dp = side.scales.as_ptr().wrapping_add(c0 * k.ad_stride);
        let mut tmp = [0.0f32; 2 * TILE_MAX_TOKENS];
        let tp = tmp.as_mut_ptr();
        macro_rules! go {
            ($r:literal, $n:literal) => {
                D::run(|| {
                    legacy_body::<T, D, $r, $n>(
                        wp,
                        k.wstride,
                        ap,
                        stride,
                        dp,
                        k.ad_stride,
                        k.nb,
                        tp,
                    )
                })
            };
        }
        // SAFETY: the kernel table hands this level out only where it was detected;
        // `check_tile` validated every weight, activation and scale the body reads, and
        // `tmp` holds the R * n results.
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
                (_, _) => go!(2, 4),
            }
        }
        for r in 0..k.rows {
            out[r * k.cols + c0..r * k.cols + c0 + n].copy_from_slice(&tmp[r * n..r * n + n]);
        }
        c0 += n;
    }
}

/// The one-row kernel (`DotFn`): the tile's one-row instance, so a row alone and a row
/// in a batch give the same bits by construction.
pub(super) fn dot<T: Legacy, D: Level>(w: &[u8], a: &[u8]) -> f32 {
    check_dot::<T::W, T::A>(w, a);
    let mut out = [0.0f32];
    tile::<T, D>(w, 1, a, a.len(), ActSide::default(), &mut out);
    out[0]
}

/// The repacked order of MXFP4, IQ4_NL and Q4_0 (`formats::lut::vec_dot_repacked`) for up to
/// four weight rows
/// (`rows`, `wstride` bytes apart; missing rows repeat row 0 and are not stored) against
/// `N` activation rows: row `r` in lane `r`. Per block and token each row's 32 products
/// form four exact i32 lanes (two `Level::dot`s), pairwise adds fold the four rows' lanes
/// into one register of whole-block sums, and one `vfmaq_f32` with the rows' scale
/// products adds them: the twin's `(e_half * d_y).mul_add(sumi, acc)` per lane.
/// `out[r * N + c]` for `r < rows`; `ad`, `ad_stride` as for [`legacy_body`].
///
/// # Safety
/// The level is available; every pointer covers what it is said to hold.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn rep_body<T: Legacy, D: Level, const N: usize>(
    w: *const u8,
    wstride: usize,
    rows: usize,
    a: *const u8,
    stride: usize,
    ad: *const f32,
    ad_stride: usize,
    nb: usize,
    out: *mut f32,
) {
    let mut acc = [vdupq_n_f32(0.0); N];
    let zero = vdupq_n_s32(0);
    for i in 0..nb {
        let mut x = [(vdupq_n_s8(0), vdupq_n_s8(0)); 4];
        let mut dxa = [0.0f32; 4];
        for r in 0..4 {
            let rr = if r < rows { r } else { 0 };
            let wb = w.add(rr * wstride + i * T::W::BYTES);
            x[r] = T::unpack(wb);
            dxa[r] = T::d(wb);
        }
        let dx = vld1q_f32(dxa.as_ptr());
        for (c, acc) in acc.iter_mut().enumerate() {
            let ab = a.add(c * stride + i * BlockQ8_0::BYTES);
            let y0 = ld_s8(ab.add(2));
            let y1 = ld_s8(ab.add(18));
            let dy = if ad_stride != 0 {
                *ad.add(c * ad_stride + i)
            } else {
                f16_at(ab)
            };
            let p = |r: usize| D::dot(D::dot(zero, x[r].0, y0), x[r].1, y1);
            let sumi = vpaddq_s32(vpaddq_s32(p(0), p(1)), vpaddq_s32(p(2), p(3)));
            *acc = vfmaq_f32(*acc, vmulq_n_f32(dx, dy), vcvtq_f32_s32(sumi));
        }
    }
    for (c, acc) in acc.iter().enumerate() {
        let mut l = [0.0f32; 4];
        vst1q_f32(l.as_mut_ptr(), *acc);
        for (r, &v) in l.iter().enumerate().take(rows) {
            *out.add(r * N + c) = v;
        }
    }
}

/// The tile kernel (`TileFn`) of `T`'s repacked order (MXFP4, IQ4_NL, Q4_0) at level `D`: up to eight weight
/// rows, four per pass, eight activation rows at a time. Offset sums are never read.
pub(super) fn rep_tile<T: Legacy, D: Level>(
    w: &[u8],
    rows: usize,
    a: &[u8],
    stride: usize,
    side: ActSide<'_>,
    out: &mut [f32],
) {
    let side = ActSide { sums: &[], ..side };
    let k = crate::contract::check_tile_rows::<T::W, T::A>(
        w,
        rows,
        a,
        stride,
        side,
        out.len(),
        (crate::contract::TILE_MAX_ROWS, TILE_MAX_TOKENS),
        1,
    );
    let mut r0 = 0;
    while r0 < k.rows {
        let nr = (k.rows - r0).min(4);
        let wp = w.as_ptr().wrapping_add(r0 * k.wstride);
        let dp = side.scales.as_ptr();
        let mut tmp = [0.0f32; 4 * TILE_MAX_TOKENS];
        let tp = tmp.as_mut_ptr();
        let ap = a.as_ptr();
        macro_rules! go {
            ($n:literal) => {
                D::run(|| {
                    rep_body::<T, D, $n>(wp, k.wstride, nr, ap, stride, dp, k.ad_stride, k.nb, tp)
                })
            };
        }
        // SAFETY: the kernel table hands this level out only where it was detected;
        // `check_tile_rows` validated every weight, activation and scale the body reads
        // (rows r0..r0 + nr of the call), and `tmp` holds the 4 * n results.
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
        let n = k.cols;
        for r in 0..nr {
            out[(r0 + r) * n..(r0 + r + 1) * n].copy_from_slice(&tmp[r * n..r * n + n]);
        }
        r0 += nr;
    }
}

/// The one-row kernel of the repacked order: [`rep_tile`]'s one-row instance.
pub(super) fn rep_dot<T: Legacy, D: Level>(w: &[u8], a: &[u8]) -> f32 {
    check_dot::<T::W, T::A>(w, a);
    let mut out = [0.0f32];
    rep_tile::<T, D>(w, 1, a, a.len(), ActSide::default(), &mut out);
    out[0]
}
