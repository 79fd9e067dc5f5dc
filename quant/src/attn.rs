//! f32 × f16 helpers for attention over an f16 KV cache: `q · k` ([`dot_f32_f16`]) and
//! `out += p · v` ([`axpy_f16`]).
//!
//! The summation order of [`dot_f32_f16`] is *defined* as the SIMD one, and the scalar
//! twins spell it out, so both paths return the same bits on every CPU:
//!
//! * element `i` is multiplied in f32 (`a[i] * f32(b[i])`, rounded once) and added to
//!   partial sum `i % LANES` (`LANES = 32`), in increasing `i`;
//! * the 32 partial sums are combined by [`combine_lanes`]: first
//!   `v[k] = (l[k] + l[k+8]) + (l[k+16] + l[k+24])` for `k < 8`, then
//!   `((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7))`.
//!
//! [`axpy_f16`] is element-wise: `y[i] = y[i] + alpha * f32(x[i])`, a multiply then an
//! add (no FMA), so it has no order to define.

use half::f16;

use crate::arch::{self, SimdLevel};

/// Number of partial sums in [`dot_f32_f16`].
pub const LANES: usize = 32;

/// The fixed combination of the [`LANES`] partial sums (see the module docs).
#[inline]
pub fn combine_lanes(l: &[f32; LANES]) -> f32 {
    let mut v = [0.0f32; 8];
    for (k, v) in v.iter_mut().enumerate() {
        *v = (l[k] + l[k + 8]) + (l[k + 16] + l[k + 24]);
    }
    ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]))
}

/// Scalar twin of [`dot_f32_f16`]: same partial sums, same combination.
pub fn dot_f32_f16_scalar(a: &[f32], b: &[f16]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f32_f16: length mismatch");
    let mut lanes = [0.0f32; LANES];
    // Element i feeds lane i % LANES; written chunk-wise so the compiler can vectorize it
    // (lane-wise adds in the same order, so the same bits).
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for l in 0..LANES {
            lanes[l] += x[l] * y[l].to_f32();
        }
    }
    for (l, (&x, &y)) in ar.iter().zip(br).enumerate() {
        lanes[l] += x * y.to_f32();
    }
    combine_lanes(&lanes)
}

/// `sum(a[i] * b[i])` in the order described in the module docs (AVX2/F16C when
/// available; bit-identical to [`dot_f32_f16_scalar`]). Panics if the lengths differ.
#[inline]
pub fn dot_f32_f16(a: &[f32], b: &[f16]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f32_f16: length mismatch");
    match arch::active() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `active()` reports Avx2 only after AVX2, FMA and F16C were detected;
        // the lengths are equal.
        SimdLevel::Avx2 => unsafe { arch::avx2::dot_f32_f16(a, b) },
        _ => dot_f32_f16_scalar(a, b),
    }
}

/// Scalar twin of [`axpy_f16`].
pub fn axpy_f16_scalar(y: &mut [f32], alpha: f32, x: &[f16]) {
    assert_eq!(y.len(), x.len(), "axpy_f16: length mismatch");
    for (y, &x) in y.iter_mut().zip(x) {
        *y += alpha * x.to_f32();
    }
}

/// `y[i] += alpha * x[i]` (AVX2/F16C when available; bit-identical to
/// [`axpy_f16_scalar`]). Panics if the lengths differ.
#[inline]
pub fn axpy_f16(y: &mut [f32], alpha: f32, x: &[f16]) {
    assert_eq!(y.len(), x.len(), "axpy_f16: length mismatch");
    match arch::active() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `dot_f32_f16`.
        SimdLevel::Avx2 => unsafe { arch::avx2::axpy_f16(y, alpha, x) },
        _ => axpy_f16_scalar(y, alpha, x),
    }
}

/// The SIMD versions regardless of `RLLAMA_FORCE_SCALAR`, or `None` when this CPU lacks
/// AVX2/FMA/F16C. For tests and benchmarks.
pub fn avx2_dot_f32_f16(a: &[f32], b: &[f16]) -> Option<f32> {
    assert_eq!(a.len(), b.len(), "dot_f32_f16: length mismatch");
    #[cfg(target_arch = "x86_64")]
    {
        if arch::detected() == SimdLevel::Avx2 {
            // SAFETY: features detected, lengths equal.
            return Some(unsafe { arch::avx2::dot_f32_f16(a, b) });
        }
    }
    None
}

/// See [`avx2_dot_f32_f16`]; returns false (leaving `y` alone) without AVX2.
pub fn avx2_axpy_f16(y: &mut [f32], alpha: f32, x: &[f16]) -> bool {
    assert_eq!(y.len(), x.len(), "axpy_f16: length mismatch");
    #[cfg(target_arch = "x86_64")]
    {
        if arch::detected() == SimdLevel::Avx2 {
            // SAFETY: features detected, lengths equal.
            unsafe { arch::avx2::axpy_f16(y, alpha, x) };
            return true;
        }
    }
    let _ = alpha;
    false
}

/// `out[i] = Σ_s ps[s] * rows[s][i]` for the f16 rows `rows[s] = cache[slots[s] * stride +
/// offset..][..out.len()]`, accumulated for each element in slot order exactly as
/// `out.fill(0.0)` followed by [`axpy_f16`] per slot would (multiply, then add), so the
/// result is the same bits; the SIMD version keeps a block of `out` in registers across all
/// slots instead of reloading and storing the whole row for every slot.
pub fn weighted_rows_f16_scalar(
    out: &mut [f32],
    ps: &[f32],
    cache: &[f16],
    slots: &[usize],
    stride: usize,
    offset: usize,
) {
    assert_eq!(
        ps.len(),
        slots.len(),
        "weighted_rows_f16: one weight per slot"
    );
    let n = out.len();
    out.fill(0.0);
    for (&p, &slot) in ps.iter().zip(slots) {
        let row = &cache[slot * stride + offset..slot * stride + offset + n];
        for (o, &v) in out.iter_mut().zip(row) {
            *o += p * v.to_f32();
        }
    }
}

/// The checks the SIMD [`weighted_rows_f16`] relies on: one weight per slot, every row
/// read inside `cache`.
fn check_weighted_rows(
    n: usize,
    ps: &[f32],
    cache: &[f16],
    slots: &[usize],
    stride: usize,
    offset: usize,
) {
    assert_eq!(
        ps.len(),
        slots.len(),
        "weighted_rows_f16: one weight per slot"
    );
    for &s in slots {
        assert!(
            s * stride + offset + n <= cache.len(),
            "weighted_rows_f16: slot {s} out of range"
        );
    }
}

/// [`weighted_rows_f16_scalar`], with the SIMD kernel when available (same bits).
#[inline]
pub fn weighted_rows_f16(
    out: &mut [f32],
    ps: &[f32],
    cache: &[f16],
    slots: &[usize],
    stride: usize,
    offset: usize,
) {
    check_weighted_rows(out.len(), ps, cache, slots, stride, offset);
    match arch::active() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `active()` reports Avx2 only after AVX2, FMA and F16C were detected; every
        // row read was bounds-checked above.
        SimdLevel::Avx2 => unsafe {
            arch::avx2::weighted_rows_f16(out, ps, cache, slots, stride, offset)
        },
        _ => weighted_rows_f16_scalar(out, ps, cache, slots, stride, offset),
    }
}

/// The AVX2 [`weighted_rows_f16`] if this CPU has it (for tests); false without AVX2.
pub fn avx2_weighted_rows_f16(
    out: &mut [f32],
    ps: &[f32],
    cache: &[f16],
    slots: &[usize],
    stride: usize,
    offset: usize,
) -> bool {
    check_weighted_rows(out.len(), ps, cache, slots, stride, offset);
    #[cfg(target_arch = "x86_64")]
    {
        if arch::detected() == SimdLevel::Avx2 {
            // SAFETY: features detected, rows bounds-checked.
            unsafe { arch::avx2::weighted_rows_f16(out, ps, cache, slots, stride, offset) };
            return true;
        }
    }
    false
}
