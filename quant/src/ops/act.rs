//! Activations as ggml computes them: its vectorised `exp` polynomial (not libm), SwiGLU
//! (`silu(g) * u`) and the tanh-approximated GELU through ggml's f16 lookup table.

use half::f16;

use super::fma_twin;
use crate::order::Flavor;

const SHIFT: f32 = 12_582_912.0; // 0x1.8p23
fn c(bits: u32) -> f32 {
    f32::from_bits(bits)
}

/// ggml's `ggml_v_expf` for one element (the vector code is element-wise). Written
/// without branches (every case computed, then selected) so that loops over it
/// vectorize.
#[inline(always)]
pub fn expf(fl: Flavor, x: f32) -> f32 {
    let Reduced { z, n, b, u, poly } = reduce(x);
    match fl {
        Flavor::Avx512 => {
            let j = poly.mul_add(u, c(0x3f7f_fff6).mul_add(b, 1.0));
            // vscalefps: j * 2^n rounded once. Both halves of n keep the intermediate
            // normal, so the first product is exact and only the second rounds.
            // n from z's bits (z = 1.5·2^23 + n exactly while |n| < 2^22, and beyond 192
            // the edge value is selected): `n as i32` saturates, which the compiler does
            // one lane at a time.
            let ni = (z.to_bits() as i32).wrapping_sub(SHIFT.to_bits() as i32);
            let (n1, n2) = (ni >> 1, ni.wrapping_sub(ni >> 1));
            let scaled = j * pow2(n1) * pow2(n2);
            let edge = if n <= 0.0 { 0.0 } else { f32::INFINITY };
            if n.abs() > 192.0 {
                edge
            } else {
                scaled
            }
        }
        Flavor::Avx2 => {
            let j = poly.mul_add(u, c(0x3f7f_fff6) * b);
            let e = z.to_bits() << 23;
            let k = f32::from_bits(e.wrapping_add(1.0f32.to_bits()));
            let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
            let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
            let s2 = f32::from_bits(e.wrapping_sub(g));
            let (inside, huge, between) = (j.mul_add(k, k), s1 * s1, s2.mul_add(j, s2) * s1);
            if n.abs() <= 126.0 {
                inside
            } else if n.abs() > 192.0 {
                huge
            } else {
                between
            }
        }
    }
}

/// `x[i] = expf(fl, x[i] - sub)` for a whole row, eight lanes at a time with AVX2: the
/// same operations as [`expf`], but only its common case (every lane's `|n|` within 126
/// for the 8-lane flavor, 192 for the 16-lane one); a vector with a lane outside it (or a
/// NaN) takes [`expf`] lane by lane. The branch-free twin computes all three cases for
/// every lane, which made it most of the soft-max.
///
/// # Safety
/// AVX2 and FMA must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn expf_row_avx2(fl: Flavor, x: &mut [f32], sub: f32) {
    use core::arch::x86_64::*;
    let k = |b: u32| _mm256_set1_ps(c(b));
    let shift = _mm256_set1_ps(SHIFT);
    let (m, sign) = (_mm256_set1_ps(sub), _mm256_set1_ps(-0.0));
    let limit = _mm256_set1_ps(match fl {
        Flavor::Avx2 => 126.0,
        Flavor::Avx512 => 192.0,
    });
    let mut chunks = x.chunks_exact_mut(8);
    for ch in &mut chunks {
        let p = ch.as_mut_ptr();
        let v = _mm256_sub_ps(_mm256_loadu_ps(p), m);
        let z = _mm256_fmadd_ps(v, k(0x3fb8_aa3b), shift);
        let n = _mm256_sub_ps(z, shift);
        let outside = _mm256_cmp_ps::<_CMP_NLE_UQ>(_mm256_andnot_ps(sign, n), limit);
        if _mm256_movemask_ps(outside) != 0 {
            for y in ch.iter_mut() {
                *y = expf(fl, *y - sub);
            }
            continue;
        }
        let nn = _mm256_xor_ps(n, sign);
        let b = _mm256_fmadd_ps(nn, k(0x35bf_be8e), _mm256_fmadd_ps(nn, k(0x3f31_7200), v));
        let u = _mm256_mul_ps(b, b);
        let poly = _mm256_fmadd_ps(
            _mm256_fmadd_ps(k(0x3c07_2010), b, k(0x3d2b_9f17)),
            u,
            _mm256_fmadd_ps(k(0x3e2a_af33), b, k(0x3eff_fedb)),
        );
        let r = match fl {
            Flavor::Avx2 => {
                let j = _mm256_fmadd_ps(poly, u, _mm256_mul_ps(k(0x3f7f_fff6), b));
                let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
                let s = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_set1_epi32(0x3f80_0000)));
                _mm256_fmadd_ps(j, s, s)
            }
            Flavor::Avx512 => {
                let one = _mm256_set1_ps(1.0);
                let j = _mm256_fmadd_ps(poly, u, _mm256_fmadd_ps(k(0x3f7f_fff6), b, one));
                let bias = _mm256_set1_epi32(SHIFT.to_bits() as i32);
                let ni = _mm256_sub_epi32(_mm256_castps_si256(z), bias);
                let n1 = _mm256_srai_epi32::<1>(ni);
                let n2 = _mm256_sub_epi32(ni, n1);
                let pow = |k: __m256i| {
                    let e = _mm256_add_epi32(k, _mm256_set1_epi32(127));
                    _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e))
                };
                _mm256_mul_ps(_mm256_mul_ps(j, pow(n1)), pow(n2))
            }
        };
        _mm256_storeu_ps(p, r);
    }
    for y in chunks.into_remainder() {
        *y = expf(fl, *y - sub);
    }
}

/// [`expf_row_avx2`] for the 16-lane flavor on sixteen lanes with AVX-512, scaling by
/// `vscalefps` as ggml's AVX-512 `ggml_v_expf` does (one rounding, which [`expf`]'s two
/// products reproduce); vectors with a lane whose `|n|` exceeds 192 (or a NaN) take
/// [`expf`] lane by lane, as does the tail.
///
/// # Safety
/// AVX-512 F must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn expf_row_avx512(x: &mut [f32], sub: f32) {
    use core::arch::x86_64::*;
    let k = |b: u32| _mm512_set1_ps(c(b));
    let shift = _mm512_set1_ps(SHIFT);
    let m = _mm512_set1_ps(sub);
    let limit = _mm512_set1_ps(192.0);
    let one = _mm512_set1_ps(1.0);
    let mut chunks = x.chunks_exact_mut(16);
    for ch in &mut chunks {
        let p = ch.as_mut_ptr();
        let v = _mm512_sub_ps(_mm512_loadu_ps(p), m);
        let z = _mm512_fmadd_ps(v, k(0x3fb8_aa3b), shift);
        let n = _mm512_sub_ps(z, shift);
        if _mm512_cmp_ps_mask::<_CMP_NLE_UQ>(_mm512_abs_ps(n), limit) != 0 {
            for y in ch.iter_mut() {
                *y = expf(Flavor::Avx512, *y - sub);
            }
            continue;
        }
        let b = _mm512_fnmadd_ps(n, k(0x35bf_be8e), _mm512_fnmadd_ps(n, k(0x3f31_7200), v));
        let u = _mm512_mul_ps(b, b);
        let poly = _mm512_fmadd_ps(
            _mm512_fmadd_ps(k(0x3c07_2010), b, k(0x3d2b_9f17)),
            u,
            _mm512_fmadd_ps(k(0x3e2a_af33), b, k(0x3eff_fedb)),
        );
        let j = _mm512_fmadd_ps(poly, u, _mm512_fmadd_ps(k(0x3f7f_fff6), b, one));
        _mm512_storeu_ps(p, _mm512_scalef_ps(j, n));
    }
    for y in chunks.into_remainder() {
        *y = expf(Flavor::Avx512, *y - sub);
    }
}

/// The steps of `ggml_v_expf` that both flavors share: `z` (x·log2 e plus the rounding
/// shift), `n` (x·log2 e rounded), the reduced argument `b`, `u = b²` and the polynomial's
/// shared part.
struct Reduced {
    z: f32,
    n: f32,
    b: f32,
    u: f32,
    poly: f32,
}

#[inline(always)]
fn reduce(x: f32) -> Reduced {
    let z = x.mul_add(c(0x3fb8_aa3b), SHIFT);
    let n = z - SHIFT;
    let b = (-n).mul_add(c(0x35bf_be8e), (-n).mul_add(c(0x3f31_7200), x));
    let u = b * b;
    let poly = c(0x3c07_2010)
        .mul_add(b, c(0x3d2b_9f17))
        .mul_add(u, c(0x3e2a_af33).mul_add(b, c(0x3eff_fedb)));
    Reduced { z, n, b, u, poly }
}

#[inline(always)]
fn pow2(k: i32) -> f32 {
    f32::from_bits((k.wrapping_add(127) as u32) << 23)
}

fma_twin! {
    /// `g[i] = silu(g[i]) * u[i]` as ggml's `swiglu` op computes one row: whole vectors
    /// with [`expf`] and a true division, the tail with libm's `expf`.
    pub fn swiglu(fl: Flavor, g: &mut [f32], u: &[f32]) = swiglu_scalar
}

/// Scalar twin of [`swiglu`].
#[inline(always)]
pub fn swiglu_scalar(fl: Flavor, g: &mut [f32], u: &[f32]) {
    assert_eq!(g.len(), u.len(), "swiglu: length mismatch");
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

const GELU_COEF_A: f32 = 0.044715;
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// ggml's `ggml_gelu_f32` as GCC compiles it (FMA contraction fuses the one
/// multiply-add, `1 + (a·x)·x`).
fn gelu_exact_tanh(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (GELU_COEF_A * x).mul_add(x, 1.0)).tanh())
}

/// Tanh-approximated GELU as ggml's CPU backend computes it: through an f16 lookup table
/// (input rounded to f16, output stored as f16), identity/zero outside ±10.
pub struct Gelu {
    table: Vec<f16>,
}

impl Default for Gelu {
    fn default() -> Self {
        Self::new()
    }
}

impl Gelu {
    pub fn new() -> Gelu {
        let table = (0..=u16::MAX)
            .map(|bits| f16::from_f32(gelu_exact_tanh(f16::from_bits(bits).to_f32())))
            .collect();
        Gelu { table }
    }

    #[inline]
    pub fn apply(&self, x: f32) -> f32 {
        if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x
        } else {
            self.table[f16::from_f32(x).to_bits() as usize].to_f32()
        }
    }

    /// `g[i] = gelu(g[i]) * u[i]` (GeGLU, as gemma3's feed-forward).
    pub fn geglu(&self, g: &mut [f32], u: &[f32]) {
        assert_eq!(g.len(), u.len(), "geglu: length mismatch");
        g.iter_mut()
            .zip(u)
            .for_each(|(g, u)| *g = self.apply(*g) * u);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ggml_v_expf` case by case, with branches (the form `expf` had before it was made
    /// branch-free).
    fn expf_branchy(fl: Flavor, x: f32) -> f32 {
        let Reduced { z, n, b, u, poly } = reduce(x);
        match fl {
            Flavor::Avx512 => {
                let j = poly.mul_add(u, c(0x3f7f_fff6).mul_add(b, 1.0));
                if n.abs() > 192.0 {
                    return if n <= 0.0 { 0.0 } else { f32::INFINITY };
                }
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

    #[test]
    fn branch_free_expf_gives_the_case_by_case_bits() {
        let mut xs: Vec<f32> = (-40_000..=40_000).map(|i| i as f32 * 0.0075).collect();
        xs.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN,
            1e-30,
            -88.7,
            88.7,
            -103.9,
            -132.0,
            133.0,
        ]);
        for fl in [Flavor::Avx2, Flavor::Avx512] {
            for &x in &xs {
                assert_eq!(
                    expf(fl, x).to_bits(),
                    expf_branchy(fl, x).to_bits(),
                    "{fl:?} exp({x})"
                );
            }
        }
    }

    /// Inputs for the row kernels: a dense sweep, the range where the 8-lane flavor leaves
    /// its common case, the range around the 16-lane flavor's edge (|n| near 192), and
    /// the special values scattered so that vectors mix the cases.
    #[cfg(target_arch = "x86_64")]
    fn row_cases() -> Vec<f32> {
        let mut xs: Vec<f32> = (-40_000..=40_000).map(|i| i as f32 * 0.0075).collect();
        xs.extend((0..4000).map(|i| -80.0 - i as f32 * 0.03));
        xs.extend((0..4000).map(|i| -130.0 + i as f32 * 0.07));
        for (i, x) in [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN,
            -0.0,
            -88.7,
            -103.9,
            -132.0,
            133.0,
        ]
        .into_iter()
        .enumerate()
        {
            xs.insert(i * 997, x);
        }
        xs
    }

    /// `row(x, sub)` gives `expf(fl, x[i] - sub)`'s bits for every case, with ragged tails
    /// (the row cut `cut` short of the cases).
    #[cfg(target_arch = "x86_64")]
    fn assert_row_is_expf(fl: Flavor, cut: usize, row: impl Fn(&mut [f32], f32)) {
        let xs = row_cases();
        for sub in [0.0f32, 1.5, -2.25] {
            let mut got = xs[..xs.len() - cut].to_vec();
            row(&mut got, sub);
            for (x, g) in xs.iter().zip(&got) {
                let want = expf(fl, *x - sub);
                assert!(
                    g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                    "{fl:?} exp({x} - {sub}): {g} vs {want}"
                );
            }
        }
    }

    /// The AVX2 row (fast vectors, lane-by-lane fallback) gives [`expf`]'s bits for every
    /// case, with rows that mix the cases within one vector and ragged tails.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn expf_row_gives_the_twins_bits() {
        if !crate::isa::avx2() {
            return;
        }
        for fl in [Flavor::Avx2, Flavor::Avx512] {
            // SAFETY: AVX2 and FMA are active.
            assert_row_is_expf(fl, 3, |x, sub| unsafe { expf_row_avx2(fl, x, sub) });
        }
    }

    /// The AVX-512 row (`vscalefps`) gives [`expf`]'s 16-lane-flavor bits for every case.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn expf_row_avx512_gives_the_twins_bits() {
        if !crate::isa::active().includes(crate::Isa::Avx512) {
            return;
        }
        // SAFETY: AVX-512 F is active.
        assert_row_is_expf(Flavor::Avx512, 5, |x, sub| unsafe {
            expf_row_avx512(x, sub)
        });
    }

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
    fn swiglu_matches_its_twin_and_formula() {
        for fl in [Flavor::Avx2, Flavor::Avx512] {
            for n in [0, 1, 7, 8, 16, 37] {
                let g0: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 4.0).collect();
                let u: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
                let (mut a, mut b) = (g0.clone(), g0.clone());
                swiglu(fl, &mut a, &u);
                swiglu_scalar(fl, &mut b, &u);
                for i in 0..n {
                    assert_eq!(a[i].to_bits(), b[i].to_bits(), "{fl:?} {n} {i}");
                    let want = g0[i] / (1.0 + (-g0[i]).exp()) * u[i];
                    assert!((a[i] - want).abs() <= 1e-5 * (1.0 + want.abs()));
                }
            }
        }
    }

    #[test]
    fn gelu_table_tracks_formula() {
        let g = Gelu::new();
        for i in -200..200 {
            let x = i as f32 * 0.07;
            assert!((g.apply(x) - gelu_exact_tanh(x)).abs() < 1e-2 * (1.0 + x.abs()));
        }
        assert_eq!(g.apply(-20.0), 0.0);
        assert_eq!(g.apply(20.0), 20.0);
        let mut x = vec![1.0, -20.0, 20.0];
        g.geglu(&mut x, &[2.0, 1.0, 0.5]);
        assert_eq!(x, vec![2.0 * g.apply(1.0), 0.0, 10.0]);
    }
}
