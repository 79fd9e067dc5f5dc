//! ggml's soft-max of one attention row.

use super::act::expf;
use crate::order::{hsum, Flavor};

/// Soft-max of one attention row in place, as ggml's `soft_max` op with the row starting
/// at KV cell `first_cell` (cells before it are masked, so zero): `exp(x - max)` by
/// [`expf`], summed per vector of cells aligned at cell 0 into an f64, then scaled by
/// `(f32)(1 / sum)`.
pub fn softmax(fl: Flavor, x: &mut [f32], first_cell: usize) {
    softmax_with_sink(fl, x, first_cell, None)
}

/// ggml's `soft_max` of a row without mask (a router's probabilities): the whole vectors
/// of the flavor's lanes from the row's start by ggml's vectorised `exp`, each reduced by
/// [`hsum`] into an f64 sum, the elements past the last whole vector by libm's `expf`,
/// added one at a time, then everything scaled by `(f32)(1 / sum)`
/// (`ggml_vec_soft_max_f32`).
pub fn softmax_row(fl: Flavor, x: &mut [f32]) {
    let lanes = fl.lanes();
    let body = x.len() - x.len() % lanes;
    let max = row_max(x);
    let mut sum = 0.0f64;
    for c in x[..body].chunks_exact_mut(lanes) {
        let mut l = [0.0f32; 16];
        for (v, l) in c.iter_mut().zip(l.iter_mut()) {
            *v = expf(fl, *v - max);
            *l = *v;
        }
        sum += hsum(fl, &mut l) as f64;
    }
    for v in &mut x[body..] {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// [`softmax`] with an attention sink: a logit that joins the maximum and, as
/// `expf(sink - max)` (libm's, in f64), the sum, as ggml's `soft_max` with sinks.
pub fn softmax_with_sink(fl: Flavor, x: &mut [f32], first_cell: usize, sink: Option<f32>) {
    #[cfg(target_arch = "x86_64")]
    if crate::isa::avx2() {
        // SAFETY: the active ISA includes AVX2, FMA and F16C (detected at run time).
        return unsafe { softmax_avx2(fl, x, first_cell, sink) };
    }
    softmax_in(fl, x, first_cell, sink, false)
}

/// [`softmax`] compiled for AVX2 and FMA, the vectors' sums eight at a time by shuffles.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn softmax_avx2(fl: Flavor, x: &mut [f32], first_cell: usize, sink: Option<f32>) {
    softmax_in(fl, x, first_cell, sink, true)
}

/// Scalar twin of [`softmax`].
pub fn softmax_scalar(fl: Flavor, x: &mut [f32], first_cell: usize) {
    softmax_in(fl, x, first_cell, None, false)
}

/// Scalar twin of [`softmax_with_sink`].
pub fn softmax_with_sink_scalar(fl: Flavor, x: &mut [f32], first_cell: usize, sink: Option<f32>) {
    softmax_in(fl, x, first_cell, sink, false)
}

/// [`softmax`]'s body; `simd`: the vectors' sums by `arch::x86` (only where AVX2 is on).
#[inline(always)]
fn softmax_in(fl: Flavor, x: &mut [f32], first_cell: usize, sink: Option<f32>, simd: bool) {
    let mut max = row_max(x);
    if let Some(s) = sink {
        max = max.max(s);
    }
    #[cfg(target_arch = "x86_64")]
    if simd {
        if fl == Flavor::Avx512 && crate::isa::active().includes(crate::Isa::Avx512) {
            // SAFETY: the active ISA includes AVX-512 F.
            unsafe { super::act::expf_row_avx512(x, max) };
        } else {
            // SAFETY: `simd` only where AVX2 and FMA are active.
            unsafe { super::act::expf_row_avx2(fl, x, max) };
        }
    }
    if !cfg!(target_arch = "x86_64") || !simd {
        for v in x.iter_mut() {
            *v = expf(fl, *v - max);
        }
    }
    let mut sum = match fl.lanes() {
        16 => cell_vector_sum::<16>(fl, x, first_cell, simd),
        _ => cell_vector_sum::<8>(fl, x, first_cell, simd),
    };
    if let Some(s) = sink {
        sum += (s - max).exp() as f64;
    }
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// The row's maximum, NaNs ignored, as a left fold of `f32::max` gives it, but with
/// sixteen independent lanes (a maximum does not depend on the order it is taken in; a
/// fold is one dependent chain of 4-cycle steps, which was most of a 4096-cell row's
/// soft-max).
#[inline(always)]
fn row_max(x: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for (m, &v) in m.iter_mut().zip(c) {
            *m = m.max(v);
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    m.iter().copied().fold(tail, f32::max)
}

/// ggml's sum of the soft-max numerators: the cells in vectors of `N` lanes aligned at
/// cell 0 (`x[0]` is cell `first_cell`; lanes outside the row are zero), each vector
/// reduced by [`hsum`] and added to an f64 in cell order.
#[inline(always)]
fn cell_vector_sum<const N: usize>(fl: Flavor, x: &[f32], first_cell: usize, simd: bool) -> f64 {
    debug_assert_eq!(fl.lanes(), N);
    let vector = |cells: &[f32], lane: usize| {
        let mut l = [0.0f32; 16];
        l[lane..lane + cells.len()].copy_from_slice(cells);
        hsum(fl, &mut l) as f64
    };
    let mut sum = 0.0f64;
    let lane = first_cell % N;
    let head = if lane == 0 {
        0
    } else {
        (N - lane).min(x.len())
    };
    if head > 0 {
        sum += vector(&x[..head], lane);
    }
    let body = &x[head..];
    #[cfg(target_arch = "x86_64")]
    let body = if simd {
        // Eight vectors' sums at once (the same additions), added in cell order.
        let mut rest = body;
        while rest.len() >= 8 * N {
            // SAFETY: `simd` only where AVX2 is active; 8 * N values read.
            let s = unsafe { crate::arch::x86::attn::vector_sums(rest.as_ptr(), N) };
            for v in s {
                sum += v as f64;
            }
            rest = &rest[8 * N..];
        }
        rest
    } else {
        body
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = simd;
    let mut chunks = body.chunks_exact(N);
    for c in &mut chunks {
        sum += vector(c, 0);
    }
    if !chunks.remainder().is_empty() {
        sum += vector(chunks.remainder(), 0);
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The soft-max as first written, one cell at a time (a fold for the maximum, lanes
    /// filled one by one): the reference for the vectorised maximum and sums.
    fn softmax_cell_by_cell(fl: Flavor, x: &mut [f32], first_cell: usize) {
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for v in x.iter_mut() {
            *v = expf(fl, *v - max);
        }
        let n = fl.lanes();
        let mut sum = 0.0f64;
        let mut lanes = [0.0f32; 16];
        let mut lane = first_cell % n;
        for &v in x.iter() {
            lanes[lane] = v;
            lane += 1;
            if lane == n {
                sum += hsum(fl, &mut lanes) as f64;
                lanes = [0.0; 16];
                lane = 0;
            }
        }
        if lane != 0 {
            sum += hsum(fl, &mut lanes) as f64;
        }
        let inv = (1.0 / sum) as f32;
        x.iter_mut().for_each(|v| *v *= inv);
    }

    #[test]
    fn softmax_gives_the_cell_by_cell_bits() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for len in [0usize, 1, 5, 15, 16, 17, 31, 33, 100, 257, 4096] {
            for first in [0usize, 1, 7, 8, 15, 16, 23, 4000] {
                for fl in [Flavor::Avx2, Flavor::Avx512] {
                    let x0: Vec<f32> = (0..len)
                        .map(|i| match rnd() % 97 {
                            0 => f32::NEG_INFINITY,
                            1 => -0.0,
                            2 => 0.0,
                            _ => ((rnd() % 20001) as f32 - 10000.0) * 1e-3 * (1 + i % 3) as f32,
                        })
                        .collect();
                    let (mut a, mut b) = (x0.clone(), x0);
                    softmax(fl, &mut a, first);
                    softmax_cell_by_cell(fl, &mut b, first);
                    for (i, (a, b)) in a.iter().zip(&b).enumerate() {
                        assert_eq!(
                            a.to_bits(),
                            b.to_bits(),
                            "{fl:?} len {len} first {first} cell {i}"
                        );
                    }
                }
            }
        }
    }

    /// The SIMD sums of eight vectors are each vector's [`hsum`], in order.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_sums_are_each_vectors_hsum() {
        if !crate::isa::avx2() {
            return;
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for fl in [Flavor::Avx2, Flavor::Avx512] {
            let n = fl.lanes();
            for _ in 0..50 {
                let x: Vec<f32> = (0..8 * n)
                    .map(|_| {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        (seed % 20001) as f32 * 1e-4 * 10f32.powi((seed % 9) as i32 - 4)
                    })
                    .collect();
                // SAFETY: AVX2 is active; 8 * n values.
                let got = unsafe { crate::arch::x86::attn::vector_sums(x.as_ptr(), n) };
                for (j, g) in got.iter().enumerate() {
                    let mut l = [0.0f32; 16];
                    l[..n].copy_from_slice(&x[j * n..(j + 1) * n]);
                    assert_eq!(g.to_bits(), hsum(fl, &mut l).to_bits(), "{fl:?} vector {j}");
                }
            }
        }
    }

    #[test]
    fn softmax_sums_to_one_and_matches_its_twin() {
        for fl in [Flavor::Avx2, Flavor::Avx512] {
            for first in [0, 5, 17] {
                let x0: Vec<f32> = (0..37).map(|i| ((i * 7919) % 13) as f32 * 0.3).collect();
                let (mut a, mut b) = (x0.clone(), x0);
                softmax(fl, &mut a, first);
                softmax_scalar(fl, &mut b, first);
                let s: f32 = a.iter().sum();
                assert!((s - 1.0).abs() < 1e-5);
                assert!(a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()));
            }
        }
    }

    /// A router's soft-max: over whole vectors it is the attention soft-max of a row
    /// starting at cell 0; the elements past them take libm's `exp` (so a row of four, as
    /// gpt-oss's chosen experts, differs from the vectorised polynomial's bits) and the
    /// row still sums to one.
    #[test]
    fn router_softmax_whole_vectors_and_tail() {
        for fl in [Flavor::Avx2, Flavor::Avx512] {
            for n in [4, 8, 13, 16, 32, 128, 129] {
                let x0: Vec<f32> = (0..n)
                    .map(|i| ((i * 7919) % 23) as f32 * 0.17 - 1.5)
                    .collect();
                let mut a = x0.clone();
                softmax_row(fl, &mut a);
                let s: f64 = a.iter().map(|&v| v as f64).sum();
                assert!((s - 1.0).abs() < 1e-5, "{fl:?} {n}: sum {s}");
                let body = n - n % fl.lanes();
                if body == n {
                    let mut b = x0.clone();
                    softmax(fl, &mut b, 0);
                    assert!(a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()));
                }
                // The tail is libm's exp of (x - max), scaled.
                let max = x0.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let ratio = a[n - 1] / (x0[n - 1] - max).exp();
                let ratio0 = a[body.min(n - 1)] / (x0[body.min(n - 1)] - max).exp();
                assert!((ratio - ratio0).abs() <= f32::EPSILON * ratio.abs() * 4.0);
            }
        }
    }
}
