//! F32 weight rows against f32 activations in llama.cpp's two x86 orders (twins in
//! `crate::formats::float`): `ggml_vec_dot_f32` (four registers per step) and tinyBLAS
//! (one register). Each lane's fused multiply-add chain is the twin's, the reductions are
//! the twin's own code, so the results are its bits.

use core::arch::x86_64::*;

use crate::formats::float::{vec_dot_f32_finish, vec_dot_f32_in, vec_dot_f32_tiled_in};
use crate::order::{hsum, Flavor};

/// The dot in flavor `fl` (`tiled`: tinyBLAS's order) with this CPU's vectors: AVX2 for
/// the 8-lane flavor, AVX-512 for the 16-lane one where `avx512` allows it; `None`
/// otherwise.
pub(crate) fn dot(fl: Flavor, tiled: bool, avx512: bool, w: &[u8], a: &[u8]) -> Option<f32> {
    assert_eq!(w.len(), a.len(), "vec_dot F32: length mismatch");
    let n = w.len() / 4;
    match fl {
        Flavor::Avx2 if crate::isa::Isa::Avx2.available() => {
            // SAFETY: AVX2 and FMA checked; both rows hold `n` floats.
            Some(unsafe {
                match tiled {
                    true if n.is_multiple_of(8) => tiled8(w, a, n),
                    _ => single8(w, a, n),
                }
            })
        }
        Flavor::Avx512 if avx512 => {
            // SAFETY: AVX-512 F checked by the caller; both rows hold `n` floats.
            Some(unsafe {
                match tiled {
                    true if n.is_multiple_of(16) => tiled16(w, a, n),
                    _ => single16(w, a, n),
                }
            })
        }
        _ => None,
    }
}

/// Table rows: the build's flavor, the twin where this ISA has no vectors of its width.
pub(super) fn single_avx2(w: &[u8], a: &[u8]) -> f32 {
    let fl = crate::order::flavor();
    dot(fl, false, false, w, a).unwrap_or_else(|| vec_dot_f32_in(fl, w, a))
}

pub(super) fn tiled_avx2(w: &[u8], a: &[u8]) -> f32 {
    let fl = crate::order::flavor();
    dot(fl, true, false, w, a).unwrap_or_else(|| vec_dot_f32_tiled_in(fl, w, a))
}

pub(super) fn single_avx512(w: &[u8], a: &[u8]) -> f32 {
    let fl = crate::order::flavor();
    dot(fl, false, true, w, a).unwrap_or_else(|| vec_dot_f32_in(fl, w, a))
}

pub(super) fn tiled_avx512(w: &[u8], a: &[u8]) -> f32 {
    let fl = crate::order::flavor();
    dot(fl, true, true, w, a).unwrap_or_else(|| vec_dot_f32_tiled_in(fl, w, a))
}

/// # Safety
/// AVX2/FMA; `w` and `a` hold `n` floats, `n % 8 == 0`.
#[target_feature(enable = "avx2,fma")]
unsafe fn tiled8(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (wp, ap) = (w.as_ptr().cast::<f32>(), a.as_ptr().cast::<f32>());
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i < n {
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(wp.add(i)), _mm256_loadu_ps(ap.add(i)), acc);
        i += 8;
    }
    let mut l = [0f32; 16];
    _mm256_storeu_ps(l.as_mut_ptr(), acc);
    hsum(Flavor::Avx2, &mut l)
}

/// # Safety
/// AVX2/FMA; `w` and `a` hold `n` floats.
#[target_feature(enable = "avx2,fma")]
unsafe fn single8(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (wp, ap) = (w.as_ptr().cast::<f32>(), a.as_ptr().cast::<f32>());
    let mut r = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (j, r) in r.iter_mut().enumerate() {
            let e = i + 8 * j;
            *r = _mm256_fmadd_ps(_mm256_loadu_ps(wp.add(e)), _mm256_loadu_ps(ap.add(e)), *r);
        }
        i += 32;
    }
    let mut acc = [[0f32; 16]; 4];
    for (j, r) in r.iter().enumerate() {
        _mm256_storeu_ps(acc[j].as_mut_ptr(), *r);
    }
    vec_dot_f32_finish(Flavor::Avx2, &mut acc, w, a)
}

/// # Safety
/// AVX-512 F; `w` and `a` hold `n` floats, `n % 16 == 0`.
#[target_feature(enable = "avx512f")]
unsafe fn tiled16(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (wp, ap) = (w.as_ptr().cast::<f32>(), a.as_ptr().cast::<f32>());
    let mut acc = _mm512_setzero_ps();
    let mut i = 0;
    while i < n {
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(wp.add(i)), _mm512_loadu_ps(ap.add(i)), acc);
        i += 16;
    }
    let mut l = [0f32; 16];
    _mm512_storeu_ps(l.as_mut_ptr(), acc);
    hsum(Flavor::Avx512, &mut l)
}

/// # Safety
/// AVX-512 F; `w` and `a` hold `n` floats.
#[target_feature(enable = "avx512f")]
unsafe fn single16(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (wp, ap) = (w.as_ptr().cast::<f32>(), a.as_ptr().cast::<f32>());
    let mut r = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    while i + 64 <= n {
        for (j, r) in r.iter_mut().enumerate() {
            let e = i + 16 * j;
            *r = _mm512_fmadd_ps(_mm512_loadu_ps(wp.add(e)), _mm512_loadu_ps(ap.add(e)), *r);
        }
        i += 64;
    }
    let mut acc = [[0f32; 16]; 4];
    for (j, r) in r.iter().enumerate() {
        _mm512_storeu_ps(acc[j].as_mut_ptr(), *r);
    }
    vec_dot_f32_finish(Flavor::Avx512, &mut acc, w, a)
}
