//! The element-wise and attention arithmetic of ggml's x86 CPU backend, operation by
//! operation, so a forward pass built from these returns llama.cpp's bits rather than
//! merely close values: `exp` as ggml's vectorised polynomial (not libm), SwiGLU, the
//! soft-max with its per-vector partial sums, and the f16 dot products of attention in the
//! two orders llama.cpp uses (its tiled f16 GEMM when a micro-batch holds two or more
//! tokens, its `vec_dot_f16` kernel for a single token).
//!
//! Why bits matter: activations are quantised to int8 before every matrix product, so a
//! last-bit difference now and then moves a value across a rounding boundary, and those
//! flips compound over the layers into top-1 disagreements with llama.cpp on near-ties.
//!
//! ggml picks its code path at compile time; a llama.cpp built for the host uses the
//! AVX-512 path where the CPU has AVX-512 F and DQ, else the AVX2 one. The two differ
//! (vector width, so summation order; the `exp` polynomial's last steps). [`flavor`]
//! detects the same at run time (`RLLAMA_GGML_FLAVOR=avx2|avx512` overrides). Every
//! function here is exact emulation written with scalar `mul_add` and lane arrays: the
//! results do not depend on which instructions run them.

use std::cell::RefCell;
use std::sync::OnceLock;

use half::f16;

/// Which of ggml's x86 code paths to follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// `__AVX512F__ && __AVX512DQ__`: 16-float vectors.
    Avx512,
    /// `__AVX2__ && __FMA__`: 8-float vectors.
    Avx2,
}

impl Flavor {
    /// Floats per vector register.
    pub const fn lanes(self) -> usize {
        match self {
            Flavor::Avx512 => 16,
            Flavor::Avx2 => 8,
        }
    }
}

/// The flavor a host-native llama.cpp build uses on this CPU.
pub fn flavor() -> Flavor {
    static F: OnceLock<Flavor> = OnceLock::new();
    *F.get_or_init(|| {
        match std::env::var("RLLAMA_GGML_FLAVOR").as_deref() {
            Ok("avx2") => return Flavor::Avx2,
            Ok("avx512") => return Flavor::Avx512,
            _ => {}
        }
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512dq")
            {
                return Flavor::Avx512;
            }
        }
        Flavor::Avx2
    })
}

const SHIFT: f32 = 12_582_912.0; // 0x1.8p23
fn c(bits: u32) -> f32 {
    f32::from_bits(bits)
}

/// ggml's `ggml_v_expf` for one element (the vector code is element-wise).
#[inline(always)]
pub fn expf(fl: Flavor, x: f32) -> f32 {
    let z = x.mul_add(c(0x3fb8_aa3b), SHIFT);
    let n = z - SHIFT;
    let b = (-n).mul_add(c(0x35bf_be8e), (-n).mul_add(c(0x3f31_7200), x));
    let u = b * b;
    let poly = c(0x3c07_2010)
        .mul_add(b, c(0x3d2b_9f17))
        .mul_add(u, c(0x3e2a_af33).mul_add(b, c(0x3eff_fedb)));
    match fl {
        Flavor::Avx512 => {
            let j = poly.mul_add(u, c(0x3f7f_fff6).mul_add(b, 1.0));
            if n.abs() > 192.0 {
                return if n <= 0.0 { 0.0 } else { f32::INFINITY };
            }
            // vscalefps: j * 2^n rounded once. Both halves of n keep the intermediate
            // normal, so the first product is exact and only the second rounds.
            let ni = n as i32;
            let (n1, n2) = (ni >> 1, ni - (ni >> 1));
            j * pow2(n1) * pow2(n2)
        }
        Flavor::Avx2 => {
            let j = poly.mul_add(u, c(0x3f7f_fff6) * b);
            let e = z.to_bits() << 23;
            let k = f32::from_bits(e.wrapping_add(1.0f32.to_bits()));
            if n.abs() <= 126.0 {
                return j.mul_add(k, k);
            }
            let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
            let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
            let s2 = f32::from_bits(e.wrapping_sub(g));
            if n.abs() > 192.0 {
                s1 * s1
            } else {
                s2.mul_add(j, s2) * s1
            }
        }
    }
}

#[inline(always)]
fn pow2(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

/// `g[i] = silu(g[i]) * u[i]` as ggml's `swiglu` op computes one row: whole vectors with
/// [`expf`] and a true division, the tail with libm's `expf`.
pub fn swiglu(fl: Flavor, g: &mut [f32], u: &[f32]) {
    assert_eq!(g.len(), u.len(), "swiglu: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: `simd()`: AVX2 and FMA were detected.
        return unsafe { swiglu_fma(fl, g, u) };
    }
    swiglu_body(fl, g, u)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn swiglu_fma(fl: Flavor, g: &mut [f32], u: &[f32]) {
    swiglu_body(fl, g, u)
}

#[inline(always)]
fn swiglu_body(fl: Flavor, g: &mut [f32], u: &[f32]) {
    let nv = g.len() - g.len() % fl.lanes();
    let (gv, gt) = g.split_at_mut(nv);
    let (uv, ut) = u.split_at(nv);
    for (x, &y) in gv.iter_mut().zip(uv) {
        *x = *x / (1.0 + expf(fl, 0.0 - *x)) * y;
    }
    for (x, &y) in gt.iter_mut().zip(ut) {
        *x = *x / (1.0 + (-*x).exp()) * y;
    }
}

/// Whether the `target_feature` copies may run: the crate's one SIMD switch (AVX2, FMA
/// and F16C detected, `RLLAMA_FORCE_SCALAR` unset). Results are the same bits either way
/// (`mul_add` is an exact FMA in both); only the speed differs.
#[cfg(target_arch = "x86_64")]
fn simd() -> bool {
    crate::arch::active() == crate::arch::SimdLevel::Avx2
}

/// Sum of one vector register's lanes as ggml reduces it at the end of a soft-max chunk
/// or a tiled GEMM (`_mm512_reduce_add_ps` / the movehl-movehdup `hsum`): halving, lane
/// `i` plus lane `i + w`. Consumes `l[..fl.lanes()]`.
#[inline(always)]
pub(crate) fn hsum(fl: Flavor, l: &mut [f32; 16]) -> f32 {
    let mut w = fl.lanes() / 2;
    while w > 0 {
        for i in 0..w {
            l[i] += l[i + w];
        }
        w /= 2;
    }
    l[0]
}

/// The last step of `ggml_vec_dot_f16`: four accumulator registers folded (0+2, 1+3,
/// 0+1), then reduced, AVX-512 by halving, AVX2 by `(l0+l4)+(l1+l5)` pairs through two
/// `hadd`s.
#[inline(always)]
pub(crate) fn reduce4(fl: Flavor, acc: &mut [[f32; 16]; 4]) -> f32 {
    let n = fl.lanes();
    for i in 0..n {
        acc[0][i] += acc[2][i];
        acc[1][i] += acc[3][i];
        acc[0][i] += acc[1][i];
    }
    match fl {
        Flavor::Avx512 => hsum(fl, &mut acc[0]),
        Flavor::Avx2 => {
            let t: [f32; 4] = std::array::from_fn(|i| acc[0][i] + acc[0][i + 4]);
            (t[0] + t[1]) + (t[2] + t[3])
        }
    }
}

/// Soft-max of one attention row in place, as ggml's `soft_max` op with the row starting
/// at KV cell `first_cell` (cells before it are masked, so zero): `exp(x - max)` by
/// [`expf`], summed per vector of cells aligned at cell 0 into an f64, then scaled by
/// `(f32)(1 / sum)`.
pub fn softmax(fl: Flavor, x: &mut [f32], first_cell: usize) {
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: `simd()`: AVX2 and FMA were detected.
        return unsafe { softmax_fma(fl, x, first_cell) };
    }
    softmax_body(fl, x, first_cell)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_fma(fl: Flavor, x: &mut [f32], first_cell: usize) {
    softmax_body(fl, x, first_cell)
}

#[inline(always)]
fn softmax_body(fl: Flavor, x: &mut [f32], first_cell: usize) {
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

/// How llama.cpp's CPU backend multiplies f16 attention operands: which kernel, hence
/// which summation order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum F16Order {
    /// The tiled GEMM (llamafile's tinyBLAS) used when the micro-batch has two or more
    /// tokens: one accumulator register over the whole length, then [`hsum`].
    Gemm,
    /// `ggml_vec_dot_f16`, used for a single token: four accumulator registers over
    /// chunks of four vectors, the remainder added in f64.
    VecDot,
}

/// `Σ a[i] * b[i]` with `a` already rounded to f16 values (the products are exact in f32,
/// so FMA and multiply-add agree) in llama.cpp's order `ord`.
pub fn dot_f16(fl: Flavor, ord: F16Order, a: &[f32], b: &[f16]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f16: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: AVX2, FMA and F16C were detected; lengths are equal.
        return unsafe { crate::arch::avx2::dot_f16_ggml(fl, ord, a, b) };
    }
    dot_f16_scalar(fl, ord, a, b)
}

/// Scalar twin of [`dot_f16`].
pub fn dot_f16_scalar(fl: Flavor, ord: F16Order, a: &[f32], b: &[f16]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f16: length mismatch");
    let n = fl.lanes();
    match ord {
        F16Order::Gemm => {
            let mut l = [0.0f32; 16];
            for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
                l[i % n] += x * y.to_f32();
            }
            hsum(fl, &mut l)
        }
        F16Order::VecDot => {
            let step = 4 * n;
            let np = a.len() - a.len() % step;
            let mut acc = [[0.0f32; 16]; 4];
            for i in 0..np {
                let j = i % step;
                acc[j / n][j % n] += a[i] * b[i].to_f32();
            }
            let mut s = reduce4(fl, &mut acc) as f64;
            for i in np..a.len() {
                s += (a[i] * b[i].to_f32()) as f64;
            }
            s as f32
        }
    }
}

thread_local! {
    static PARTS: RefCell<(Vec<f32>, Vec<f32>, Vec<usize>)> =
        const { RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// `out[d] = Σ_s ps[s] * rows[s][d]` over the f16 rows `cache[slots[s] * stride +
/// offset..]`, where slot `s` is KV cell `first_cell + s`, in llama.cpp's order `ord` for
/// the product of the transposed V cache with the (f16-rounded) probabilities: cell `c`
/// feeds partial sum `c % P` (`P` = one register for [`F16Order::Gemm`], four for
/// [`F16Order::VecDot`]), each partial in cell order, then the partials are reduced as the
/// kernel reduces its registers. Assumes the cache length llama.cpp sees is a multiple of
/// `4 * lanes` (it pads to 256 cells), so there is no f64 remainder.
#[allow(clippy::too_many_arguments)] // attn::weighted_rows_f16's six, plus the order
pub fn weighted_rows_f16(
    fl: Flavor,
    ord: F16Order,
    out: &mut [f32],
    ps: &[f32],
    cache: &[f16],
    slots: &[usize],
    stride: usize,
    offset: usize,
    first_cell: usize,
) {
    assert_eq!(
        ps.len(),
        slots.len(),
        "weighted_rows_f16: one weight per slot"
    );
    let n = fl.lanes();
    let np = match ord {
        F16Order::Gemm => n,
        F16Order::VecDot => 4 * n,
    };
    let hv = out.len();
    PARTS.with(|p| {
        let mut p = p.borrow_mut();
        let (parts, sub_ps, sub_slots) = &mut *p;
        parts.clear();
        parts.resize(np * hv, 0.0);
        for k in 0..np {
            sub_ps.clear();
            sub_slots.clear();
            // The first slot whose cell is ≡ k (mod np).
            let start = (k + np - first_cell % np) % np;
            let mut s = start;
            while s < slots.len() {
                sub_ps.push(ps[s]);
                sub_slots.push(slots[s]);
                s += np;
            }
            if !sub_slots.is_empty() {
                crate::attn::weighted_rows_f16(
                    &mut parts[k * hv..(k + 1) * hv],
                    sub_ps,
                    cache,
                    sub_slots,
                    stride,
                    offset,
                );
            }
        }
        for (d, o) in out.iter_mut().enumerate() {
            *o = match ord {
                F16Order::Gemm => {
                    let mut l = [0.0f32; 16];
                    for (k, l) in l.iter_mut().enumerate().take(n) {
                        *l = parts[k * hv + d];
                    }
                    hsum(fl, &mut l)
                }
                F16Order::VecDot => {
                    let mut acc = [[0.0f32; 16]; 4];
                    for (j, a) in acc.iter_mut().enumerate() {
                        for (l, a) in a.iter_mut().enumerate().take(n) {
                            *a = parts[(j * n + l) * hv + d];
                        }
                    }
                    reduce4(fl, &mut acc)
                }
            };
        }
    });
}

/// Rotates one head vector by RoPE with the cos/sin `cache` (interleaved, `n_dims`
/// long): pairs `(x[i], x[i+1])` (`neox = false`) or `(x[i], x[i + n_dims/2])`, computed
/// as GCC compiles ggml's `x0*cos - x1*sin` / `x0*sin + x1*cos` with FMA contraction (the
/// first product fused, the second rounded).
pub fn rope_rotate(x: &mut [f32], cache: &[f32], n_dims: usize, neox: bool) {
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: `simd()`: AVX2 and FMA were detected.
        return unsafe { rope_fma(x, cache, n_dims, neox) };
    }
    rope_body(x, cache, n_dims, neox)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rope_fma(x: &mut [f32], cache: &[f32], n_dims: usize, neox: bool) {
    rope_body(x, cache, n_dims, neox)
}

#[inline(always)]
fn rope_body(x: &mut [f32], cache: &[f32], n_dims: usize, neox: bool) {
    let (stride, off) = if neox { (1, n_dims / 2) } else { (2, 1) };
    for p in 0..n_dims / 2 {
        let (cos, sin) = (cache[2 * p], cache[2 * p + 1]);
        let i = p * stride;
        let (x0, x1) = (x[i], x[i + off]);
        x[i] = x0.mul_add(cos, -(x1 * sin));
        x[i + off] = x0.mul_add(sin, x1 * cos);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expf_is_close_to_libm() {
        for fl in [Flavor::Avx2, Flavor::Avx512] {
            for i in -2000..2000 {
                let x = i as f32 * 0.05;
                let (a, b) = (expf(fl, x), x.exp());
                if b.is_infinite() {
                    assert_eq!(a, b);
                    continue;
                }
                assert!(
                    (a - b).abs() <= 4.0 * f32::EPSILON * b.max(f32::MIN_POSITIVE),
                    "{fl:?} exp({x}) = {a}, libm {b}"
                );
            }
            assert_eq!(expf(fl, -200.0), 0.0);
            assert_eq!(expf(fl, 200.0), f32::INFINITY);
            assert_eq!(expf(fl, 0.0), 1.0);
            // Subnormal results (the scaled path).
            let (a, b) = (expf(fl, -100.0), (-100.0f32).exp());
            assert!((a - b).abs() <= b * 1e-3, "{fl:?} {a} {b}");
        }
    }

    #[test]
    fn softmax_sums_to_one_and_orders_agree() {
        for fl in [Flavor::Avx2, Flavor::Avx512] {
            let mut x: Vec<f32> = (0..37).map(|i| ((i * 7919) % 13) as f32 * 0.3).collect();
            softmax(fl, &mut x, 5);
            let s: f32 = x.iter().sum();
            assert!((s - 1.0).abs() < 1e-5);
        }
    }

    #[test]
    fn f16_orders_are_dot_products() {
        let a: Vec<f32> = (0..200)
            .map(|i| f16::from_f32((i as f32 * 0.37).sin()).to_f32())
            .collect();
        let b: Vec<f16> = (0..200)
            .map(|i| f16::from_f32((i as f32 * 0.11).cos()))
            .collect();
        let exact: f64 = a.iter().zip(&b).map(|(&x, y)| x as f64 * y.to_f64()).sum();
        for fl in [Flavor::Avx2, Flavor::Avx512] {
            for ord in [F16Order::Gemm, F16Order::VecDot] {
                for n in [0, 1, 15, 16, 64, 100, 200] {
                    let e: f64 = a[..n]
                        .iter()
                        .zip(&b[..n])
                        .map(|(&x, y)| x as f64 * y.to_f64())
                        .sum();
                    let s = dot_f16_scalar(fl, ord, &a[..n], &b[..n]);
                    assert!((s as f64 - e).abs() < 1e-4, "{fl:?} {ord:?} {n}");
                    assert_eq!(
                        s.to_bits(),
                        dot_f16(fl, ord, &a[..n], &b[..n]).to_bits(),
                        "{fl:?} {ord:?} {n}: SIMD and scalar differ"
                    );
                }
            }
        }
        let _ = exact;
    }

    #[test]
    fn weighted_rows_match_their_definition() {
        let hv = 24;
        let n_cells = 150;
        let cache: Vec<f16> = (0..n_cells * hv)
            .map(|i| f16::from_f32(((i * 31) % 17) as f32 * 0.125 - 1.0))
            .collect();
        for fl in [Flavor::Avx2, Flavor::Avx512] {
            for ord in [F16Order::Gemm, F16Order::VecDot] {
                for first in [0usize, 3, 17] {
                    let slots: Vec<usize> = (first..n_cells).collect();
                    let ps: Vec<f32> = slots
                        .iter()
                        .map(|&s| f16::from_f32(1.0 / (1.0 + s as f32)).to_f32())
                        .collect();
                    let mut out = vec![0.0; hv];
                    weighted_rows_f16(fl, ord, &mut out, &ps, &cache, &slots, hv, 0, first);
                    for (d, &o) in out.iter().enumerate() {
                        // The definition: a dot product over all cells from 0 (masked
                        // cells weigh zero) in the same order.
                        let mut pa = vec![0.0f32; n_cells];
                        let mut col = vec![f16::ZERO; n_cells];
                        for (i, &s) in slots.iter().enumerate() {
                            pa[s] = ps[i];
                        }
                        for (cell, c) in col.iter_mut().enumerate() {
                            *c = cache[cell * hv + d];
                        }
                        let padded = n_cells.next_multiple_of(64);
                        pa.resize(padded, 0.0);
                        col.resize(padded, f16::ZERO);
                        let want = dot_f16_scalar(fl, ord, &pa, &col);
                        assert_eq!(o.to_bits(), want.to_bits(), "{fl:?} {ord:?} {first} {d}");
                    }
                }
            }
        }
    }
}
