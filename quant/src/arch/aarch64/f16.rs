//! f32 x f16 kernels for attention over the f16 KV cache on NEON, in llama.cpp's x86
//! orders (twins in `crate::ops::f16`): every partial sum the twin keeps is a float lane
//! here, accumulated with a multiply then an add as the twin does, and the twin's own
//! reductions (`hsum`, `reduce4`) fold the lanes. f16 values are widened with `fcvtl`
//! (exact).

use core::arch::aarch64::*;

use half::f16;

use super::simd::f16x8_at;
use crate::order::{hsum, reduce4, F16Order, Flavor};

/// `ops::f16::sum_rows_f16_scalar` over slots `0, step, 2 * step, ..`: 32 output elements
/// stay in registers while every such slot's row adds into them (multiply, then add, slot
/// order), then the next 32.
///
/// # Safety
/// Every `slots[s] * stride + offset + out.len() <= cache.len()`, `ps.len() == slots.len()`.
pub(crate) unsafe fn sum_rows_f16(
    out: &mut [f32],
    ps: &[f32],
    cache: &[f16],
    slots: &[usize],
    stride: usize,
    offset: usize,
    step: usize,
) {
    let n = out.len();
    let cp = cache.as_ptr().cast::<u16>();
    let op = out.as_mut_ptr();
    let row = |s: usize| cp.add(slots[s] * stride + offset);
    let mut i = 0;
    while i + 32 <= n {
        let mut acc = [vdupq_n_f32(0.0); 8];
        for s in (0..ps.len()).step_by(step) {
            let p = ps[s];
            let r = row(s).add(i);
            for k in 0..4 {
                let (lo, hi) = f16x8_at(r.add(8 * k));
                acc[2 * k] = vaddq_f32(acc[2 * k], vmulq_n_f32(lo, p));
                acc[2 * k + 1] = vaddq_f32(acc[2 * k + 1], vmulq_n_f32(hi, p));
            }
        }
        for (k, acc) in acc.iter().enumerate() {
            vst1q_f32(op.add(i + 4 * k), *acc);
        }
        i += 32;
    }
    while i + 8 <= n {
        let mut acc = [vdupq_n_f32(0.0); 2];
        for s in (0..ps.len()).step_by(step) {
            let p = ps[s];
            let (lo, hi) = f16x8_at(row(s).add(i));
            acc[0] = vaddq_f32(acc[0], vmulq_n_f32(lo, p));
            acc[1] = vaddq_f32(acc[1], vmulq_n_f32(hi, p));
        }
        vst1q_f32(op.add(i), acc[0]);
        vst1q_f32(op.add(i + 4), acc[1]);
        i += 8;
    }
    for j in i..n {
        let mut acc = 0.0f32;
        for s in (0..ps.len()).step_by(step) {
            acc += ps[s] * f16::from_bits(*row(s).add(j)).to_f32();
        }
        *op.add(j) = acc;
    }
}

/// `ops::f16::dot_f16_scalar` with NEON registers: the twin's `lanes` (8 or 16) partial
/// sums as two or four registers (times four accumulators for [`F16Order::VecDot`]),
/// each `+= a * b` as a multiply then an add, then the twin's reduction of the stored
/// lanes.
///
/// # Safety
/// `a` and `b` have equal lengths.
pub(crate) unsafe fn dot_f16(fl: Flavor, ord: F16Order, a: &[f32], b: &[f16]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len();
    let lanes = fl.lanes();
    let regs = lanes / 4;
    let (pa, pb) = (a.as_ptr(), b.as_ptr().cast::<u16>());
    // Adds a[i..i + 8] * b[i..i + 8] into two registers.
    let step8 = |acc: &mut [float32x4_t], i: usize| {
        // SAFETY (all loads): callers only pass i + 8 <= n.
        unsafe {
            let (lo, hi) = f16x8_at(pb.add(i));
            acc[0] = vaddq_f32(acc[0], vmulq_f32(vld1q_f32(pa.add(i)), lo));
            acc[1] = vaddq_f32(acc[1], vmulq_f32(vld1q_f32(pa.add(i + 4)), hi));
        }
    };
    match ord {
        F16Order::Gemm => {
            // Lane k of the twin's 8 or 16 partial sums is lane k % 4 of register k / 4.
            let mut acc = [vdupq_n_f32(0.0); 4];
            let mut i = 0;
            while i + lanes <= n {
                for h in (0..regs).step_by(2) {
                    step8(&mut acc[h..h + 2], i + 4 * h);
                }
                i += lanes;
            }
            let mut l = [0.0f32; 16];
            for (k, acc) in acc.iter().enumerate().take(regs) {
                vst1q_f32(l.as_mut_ptr().add(4 * k), *acc);
            }
            for k in i..n {
                l[k - i] += a[k] * b[k].to_f32();
            }
            hsum(fl, &mut l)
        }
        F16Order::VecDot => {
            let step = 4 * lanes;
            let np = n - n % step;
            let mut acc = [[vdupq_n_f32(0.0); 4]; 4];
            let mut i = 0;
            while i < np {
                for (j, acc) in acc.iter_mut().enumerate() {
                    for h in (0..regs).step_by(2) {
                        step8(&mut acc[h..h + 2], i + j * lanes + 4 * h);
                    }
                }
                i += step;
            }
            let mut l = [[0.0f32; 16]; 4];
            for (l, acc) in l.iter_mut().zip(&acc) {
                for (k, acc) in acc.iter().enumerate().take(regs) {
                    vst1q_f32(l.as_mut_ptr().add(4 * k), *acc);
                }
            }
            let mut s = reduce4(fl, &mut l) as f64;
            for k in np..n {
                s += (a[k] * b[k].to_f32()) as f64;
            }
            s as f32
        }
    }
}
