//! f32 × f16 helpers for attention over an f16 KV cache: `out += p · v` ([`axpy_f16`]) and
//! its many-slot form ([`weighted_rows_f16`]). The score dot products live in
//! [`crate::ggml_math::dot_f16`], in llama.cpp's own orders.
//!
//! [`axpy_f16`] is element-wise: `y[i] = y[i] + alpha * f32(x[i])`, a multiply then an
//! add (no FMA), so it has no order to define.

use half::f16;

use crate::arch::{self, SimdLevel};

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
        // SAFETY: `active()` reports Avx2 only after AVX2, FMA and F16C were detected;
        // the lengths are equal.
        SimdLevel::Avx2 => unsafe { arch::avx2::axpy_f16(y, alpha, x) },
        _ => axpy_f16_scalar(y, alpha, x),
    }
}

/// The SIMD version regardless of `RLLAMA_FORCE_SCALAR` (for tests and benchmarks);
/// returns false (leaving `y` alone) when this CPU lacks AVX2/FMA/F16C.
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
