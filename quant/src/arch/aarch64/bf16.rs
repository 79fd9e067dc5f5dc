//! BF16 weights against bf16 activations on NEON, in llama.cpp's x86 orders
//! (`order::Bf16Order`; twins: `formats::float::vec_dot_bf16_in`). A bf16 element widens
//! to f32 by a 16-bit shift (exact); for `vdpbf16ps`'s order the pair in a 32-bit word
//! splits into its odd element (masked) and its even one (shifted up), added in that
//! order. The product of two bf16 values is exact in f32, so `vfmaq_f32` rounds as the
//! twin's add does. The order's 16 (or 8) float lanes are four (two) q registers.

use core::arch::aarch64::*;

use crate::contract::ActSide;
use crate::formats::float::{bf16_vec_dot_finish, rd_bf16};
use crate::order::{bf16_order, Bf16Order};

const DP: u8 = Bf16Order::Dpbf16.id();
const W16: u8 = Bf16Order::Avx512.id();
const W8: u8 = Bf16Order::Avx2.id();

/// Elements per tinyBLAS step of order `O` (a [`Bf16Order::id`]).
const fn step_of(o: u8) -> usize {
    Bf16Order::from_id(o).gemm_step()
}

/// A register of the order's lanes: four q registers (16 lanes) or two (8).
type Reg = [float32x4_t; 4];

/// One step's operand at `p`: `DP`: 16 pairs as [odd 0..4, even 0..4, odd 4..8, ..];
/// `W16`: 16 elements; `W8`: eight.
#[inline(always)]
unsafe fn operand<const O: u8>(p: *const u8) -> [float32x4_t; 8] {
    let z = vdupq_n_f32(0.0);
    let mut v = [z; 8];
    match O {
        DP => {
            let hi = vdupq_n_u32(0xffff_0000);
            for q in 0..4 {
                let w = vld1q_u32(p.add(16 * q).cast());
                v[2 * q] = vreinterpretq_f32_u32(vandq_u32(w, hi));
                v[2 * q + 1] = vreinterpretq_f32_u32(vshlq_n_u32::<16>(w));
            }
        }
        _ => {
            let halves = if O == W16 { 2 } else { 1 };
            for h in 0..halves {
                let x = vld1q_u16(p.add(16 * h).cast());
                v[2 * h] = vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(x)));
                v[2 * h + 1] = vreinterpretq_f32_u32(vshll_high_n_u16::<16>(x));
            }
        }
    }
    v
}

#[inline(always)]
unsafe fn madd<const O: u8>(acc: &mut Reg, x: &[float32x4_t; 8], y: &[float32x4_t; 8]) {
    match O {
        DP => {
            for q in 0..4 {
                acc[q] = vfmaq_f32(acc[q], x[2 * q], y[2 * q]);
                acc[q] = vfmaq_f32(acc[q], x[2 * q + 1], y[2 * q + 1]);
            }
        }
        W16 => {
            for q in 0..4 {
                acc[q] = vfmaq_f32(acc[q], x[q], y[q]);
            }
        }
        _ => {
            for q in 0..2 {
                acc[q] = vfmaq_f32(acc[q], x[q], y[q]);
            }
        }
    }
}

/// The register halved down to one float: lane l plus l + 8 (16 lanes), l + 4, l + 2,
/// l + 1.
#[inline(always)]
unsafe fn halve<const O: u8>(acc: &Reg) -> f32 {
    let t = if O == W8 {
        vaddq_f32(acc[0], acc[1])
    } else {
        vaddq_f32(vaddq_f32(acc[0], acc[2]), vaddq_f32(acc[1], acc[3]))
    };
    let (t0, t1) = (vgetq_lane_f32::<0>(t), vgetq_lane_f32::<1>(t));
    let (t2, t3) = (vgetq_lane_f32::<2>(t), vgetq_lane_f32::<3>(t));
    (t0 + t2) + (t1 + t3)
}

/// tinyBLAS's order for one weight row and `T` tokens, `k` a multiple of the step.
///
/// # Safety
/// Every pointer holds `k` bf16 values.
#[inline(always)]
unsafe fn gemm<const O: u8, const T: usize>(k: usize, w: *const u8, a: [*const u8; T]) -> [f32; T] {
    let mut acc = [[vdupq_n_f32(0.0); 4]; T];
    let mut i = 0;
    while i < k {
        let wv = operand::<O>(w.add(2 * i));
        for t in 0..T {
            madd::<O>(&mut acc[t], &wv, &operand::<O>(a[t].add(2 * i)));
        }
        i += step_of(O);
    }
    core::array::from_fn(|t| halve::<O>(&acc[t]))
}

/// `ggml_vec_dot_bf16`'s vector loop into `acc` (the twin's registers); returns the
/// elements covered.
///
/// # Safety
/// Both pointers hold `n` bf16 values.
unsafe fn vec_dot<const O: u8>(
    w: *const u8,
    a: *const u8,
    n: usize,
    acc: &mut [[f32; 16]; 4],
) -> usize {
    let (regs, width) = if O == W8 { (4, 8) } else { (2, step_of(O)) };
    let np = n - n % (regs * width);
    let mut c = [[vdupq_n_f32(0.0); 4]; 4];
    let mut i = 0;
    while i < np {
        for (r, c) in c.iter_mut().enumerate().take(regs) {
            let off = 2 * (i + r * width);
            madd::<O>(c, &operand::<O>(w.add(off)), &operand::<O>(a.add(off)));
        }
        i += regs * width;
    }
    for (r, c) in c.iter().enumerate().take(regs) {
        for (q, c) in c.iter().enumerate() {
            vst1q_f32(acc[r].as_mut_ptr().add(4 * q), *c);
        }
    }
    np
}

/// One row's dot in order `o` (`tiled`: tinyBLAS's where the row is whole steps).
pub(crate) fn dot(o: Bf16Order, tiled: bool, w: &[u8], a: &[u8]) -> f32 {
    assert_eq!(w.len(), a.len(), "vec_dot BF16: length mismatch");
    let n = w.len() / 2;
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    // SAFETY: both rows hold n values; tinyBLAS's only over whole steps.
    unsafe {
        if tiled && n.is_multiple_of(o.gemm_step()) {
            return match o.id() {
                DP => gemm::<DP, 1>(n, wp, [ap]),
                W16 => gemm::<W16, 1>(n, wp, [ap]),
                _ => gemm::<W8, 1>(n, wp, [ap]),
            }[0];
        }
        let mut acc = [[0f32; 16]; 4];
        let done = match o.id() {
            DP => vec_dot::<DP>(wp, ap, n, &mut acc),
            W16 => vec_dot::<W16>(wp, ap, n, &mut acc),
            _ => vec_dot::<W8>(wp, ap, n, &mut acc),
        };
        bf16_vec_dot_finish(o, &mut acc, done, n, |i| rd_bf16(w, i) * rd_bf16(a, i))
    }
}

/// The tile: each weight row against tokens in fours (tinyBLAS's order over whole steps),
/// else the one-row kernel per pair; every output the one-row kernel's bits.
fn tile(tiled: bool, w: &[u8], rows: usize, a: &[u8], stride: usize, out: &mut [f32]) {
    let n_tok = out.len() / rows.max(1);
    let row = w.len() / rows.max(1);
    assert!(
        (1..=crate::contract::EXACT_TILE_ROWS).contains(&rows)
            && out.len() == rows * n_tok
            && (1..=crate::contract::TILE_MAX_TOKENS).contains(&n_tok)
            && w.len() == rows * row
            && row.is_multiple_of(2)
            && (n_tok == 1 || stride >= row)
            && a.len() >= (n_tok - 1) * stride + row,
        "BF16 tile: {} weight bytes in {rows} rows, {} activation bytes, stride {stride}, \
         {} outputs",
        w.len(),
        a.len(),
        out.len()
    );
    let o = bf16_order();
    let n = row / 2;
    let ar = |c: usize| &a[c * stride..c * stride + row];
    for r in 0..rows {
        let wr = &w[r * row..(r + 1) * row];
        let mut c = 0;
        if tiled && n.is_multiple_of(o.gemm_step()) {
            while c + 4 <= n_tok {
                let ap: [*const u8; 4] = core::array::from_fn(|t| ar(c + t).as_ptr());
                // SAFETY: every pointer holds n values (checked above), n whole steps.
                let v = unsafe {
                    match o.id() {
                        DP => gemm::<DP, 4>(n, wr.as_ptr(), ap),
                        W16 => gemm::<W16, 4>(n, wr.as_ptr(), ap),
                        _ => gemm::<W8, 4>(n, wr.as_ptr(), ap),
                    }
                };
                out[r * n_tok + c..][..4].copy_from_slice(&v);
                c += 4;
            }
        }
        for c in c..n_tok {
            out[r * n_tok + c] = dot(o, tiled, wr, ar(c));
        }
    }
}

pub(super) fn single(w: &[u8], a: &[u8]) -> f32 {
    dot(bf16_order(), false, w, a)
}

pub(super) fn tiled(w: &[u8], a: &[u8]) -> f32 {
    dot(bf16_order(), true, w, a)
}

pub(super) fn single_many(
    w: &[u8],
    rows: usize,
    a: &[u8],
    stride: usize,
    _side: ActSide<'_>,
    out: &mut [f32],
) {
    tile(false, w, rows, a, stride, out)
}

pub(super) fn tiled_many(
    w: &[u8],
    rows: usize,
    a: &[u8],
    stride: usize,
    _side: ActSide<'_>,
    out: &mut [f32],
) {
    tile(true, w, rows, a, stride, out)
}
