//! The f32 x f16 products of attention over an f16 KV cache, in the two orders llama.cpp
//! uses ([`F16Order`]): score dot products ([`dot_f16`]) and the probability-weighted sum
//! of V rows ([`weighted_rows_f16`], built on the slot-order [`sum_rows_f16`]). AVX2
//! kernels in `crate::arch::x86::f16` and NEON ones in `crate::arch::aarch64::f16`,
//! bit-identical to the scalar twins here.

use std::cell::RefCell;

use half::f16;

use crate::order::{hsum, reduce4, F16Order, Flavor};

/// `Σ a[i] * b[i]` with `a` already rounded to f16 values (the products are exact in f32,
/// so FMA and multiply-add agree) in llama.cpp's order `ord`.
pub fn dot_f16(fl: Flavor, ord: F16Order, a: &[f32], b: &[f16]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f16: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if crate::isa::avx2() {
        // SAFETY: the active ISA includes AVX2, FMA and F16C; lengths are equal.
        return unsafe { crate::arch::x86::f16::dot_f16(fl, ord, a, b) };
    }
    #[cfg(target_arch = "aarch64")]
    if crate::isa::neon() {
        // SAFETY: lengths are equal (NEON is part of every aarch64 target).
        return unsafe { crate::arch::aarch64::f16::dot_f16(fl, ord, a, b) };
    }
    dot_f16_scalar(fl, ord, a, b)
}

/// Scalar twin of [`dot_f16`].
pub fn dot_f16_scalar(fl: Flavor, ord: F16Order, a: &[f32], b: &[f16]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f16: length mismatch");
    dot_f16_by(fl, ord, a.len(), |i| a[i], |i| b[i].to_f32())
}

/// [`dot_f16_scalar`] over any two operands of `n` elements whose values are f16 values
/// (as f32, exactly): their products are exact in f32. Also the twin of f16 weights
/// against f16 activations (`formats::float::vec_dot_f16`).
#[inline]
pub(crate) fn dot_f16_by(
    fl: Flavor,
    ord: F16Order,
    n: usize,
    a: impl Fn(usize) -> f32,
    b: impl Fn(usize) -> f32,
) -> f32 {
    let lanes = fl.lanes();
    match ord {
        F16Order::Gemm => {
            let mut l = [0.0f32; 16];
            for i in 0..n {
                l[i % lanes] += a(i) * b(i);
            }
            hsum(fl, &mut l)
        }
        F16Order::VecDot => {
            let step = 4 * lanes;
            let np = n - n % step;
            let mut acc = [[0.0f32; 16]; 4];
            for i in 0..np {
                let j = i % step;
                acc[j / lanes][j % lanes] += a(i) * b(i);
            }
            let mut s = reduce4(fl, &mut acc) as f64;
            for i in np..n {
                s += (a(i) * b(i)) as f64;
            }
            s as f32
        }
    }
}

/// `out[s] = dot_f16(fl, ord, a, row(s)) * scale` for each cache row `row(s) =
/// cache[slots[s] * stride + offset..][..a.len()]` (attention scores of one query; `out`
/// is cleared first). The SIMD kernels score several keys at once in llama.cpp's GEMM and
/// VecDot orders, with the bits of one [`dot_f16`] per key.
#[allow(clippy::too_many_arguments)] // the query, the rows' four, the flavor, order, scale
pub fn scores_f16(
    fl: Flavor,
    ord: F16Order,
    a: &[f32],
    cache: &[f16],
    slots: &[usize],
    stride: usize,
    offset: usize,
    scale: f32,
    out: &mut Vec<f32>,
) {
    let n = a.len();
    check_slots("scores_f16", n, cache, slots, stride, offset);
    out.clear();
    out.resize(slots.len(), 0.0);
    // Whole registers (Gemm) or whole VecDot steps (no f64 remainder).
    #[cfg(target_arch = "x86_64")]
    let whole = match ord {
        F16Order::Gemm => fl.lanes(),
        F16Order::VecDot => 4 * fl.lanes(),
    };
    #[cfg(target_arch = "x86_64")]
    if n.is_multiple_of(whole) && crate::isa::avx2() {
        // SAFETY: the active ISA includes AVX2, FMA and F16C; whole registers or steps;
        // every row read was bounds-checked above; one output per slot.
        return unsafe {
            crate::arch::x86::f16::scores_f16_keys(
                fl, ord, a, cache, slots, stride, offset, scale, out,
            )
        };
    }
    for (o, &s) in out.iter_mut().zip(slots) {
        let at = s * stride + offset;
        *o = dot_f16(fl, ord, a, &cache[at..at + n]) * scale;
    }
}

/// Rounds every value to f16 and back (round to nearest even), in place: what ggml does
/// to the query and the probabilities before their f16 products.
pub fn round_to_f16(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::isa::avx2() {
        // SAFETY: the active ISA includes AVX2 and F16C.
        return unsafe { crate::arch::x86::f16::round_to_f16(x) };
    }
    round_to_f16_scalar(x)
}

/// Scalar twin of [`round_to_f16`].
pub fn round_to_f16_scalar(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = f16::from_f32(*v).to_f32());
}

/// Panics unless there is one weight per slot and every row read lies inside `cache`
/// (what the SIMD [`sum_rows_f16`] relies on).
fn check_rows(n: usize, ps: &[f32], cache: &[f16], slots: &[usize], stride: usize, offset: usize) {
    assert_eq!(ps.len(), slots.len(), "sum_rows_f16: one weight per slot");
    check_slots("sum_rows_f16", n, cache, slots, stride, offset);
}

/// Panics (naming `who`) unless every row `cache[slots[s] * stride + offset..][..n]` lies
/// inside `cache`, what the SIMD kernels over cache rows rely on.
pub(crate) fn check_slots(
    who: &str,
    n: usize,
    cache: &[f16],
    slots: &[usize],
    stride: usize,
    offset: usize,
) {
    for &s in slots {
        assert!(
            s * stride + offset + n <= cache.len(),
            "{who}: slot {s} out of range"
        );
    }
}

/// `out[i] = Σ_s ps[s] * rows[s][i]` for the f16 rows `rows[s] = cache[slots[s] * stride +
/// offset..][..out.len()]`, accumulated for each element in slot order (multiply, then
/// add, starting from zero). The SIMD kernel keeps a block of `out` in registers across
/// all slots instead of reloading and storing the whole row for every slot.
#[inline]
pub fn sum_rows_f16(
    out: &mut [f32],
    ps: &[f32],
    cache: &[f16],
    slots: &[usize],
    stride: usize,
    offset: usize,
) {
    check_rows(out.len(), ps, cache, slots, stride, offset);
    // SAFETY: checked above.
    unsafe { sum_rows_f16_every(out, ps, cache, slots, stride, offset, 1) }
}

/// [`sum_rows_f16`] over slots `0, step, 2 * step, ..` only (one partial sum of
/// [`weighted_rows_f16`], read in place instead of gathered).
///
/// # Safety
/// As checked by `check_rows` for all of `slots`.
#[inline]
unsafe fn sum_rows_f16_every(
    out: &mut [f32],
    ps: &[f32],
    cache: &[f16],
    slots: &[usize],
    stride: usize,
    offset: usize,
    step: usize,
) {
    debug_assert!(step > 0 && ps.len() == slots.len());
    #[cfg(target_arch = "x86_64")]
    if crate::isa::avx2() {
        // SAFETY: the active ISA includes AVX2, FMA and F16C; every row read was
        // bounds-checked by the caller.
        return crate::arch::x86::f16::sum_rows_f16(out, ps, cache, slots, stride, offset, step);
    }
    #[cfg(target_arch = "aarch64")]
    if crate::isa::neon() {
        // SAFETY: every row read was bounds-checked by the caller, one weight per slot.
        return crate::arch::aarch64::f16::sum_rows_f16(
            out, ps, cache, slots, stride, offset, step,
        );
    }
    sum_rows_every_scalar(out, ps, cache, slots, stride, offset, step)
}

/// Scalar twin of [`sum_rows_f16`].
pub fn sum_rows_f16_scalar(
    out: &mut [f32],
    ps: &[f32],
    cache: &[f16],
    slots: &[usize],
    stride: usize,
    offset: usize,
) {
    assert_eq!(ps.len(), slots.len(), "sum_rows_f16: one weight per slot");
    sum_rows_every_scalar(out, ps, cache, slots, stride, offset, 1)
}

/// [`sum_rows_f16_scalar`] over slots `0, step, 2 * step, ..`.
fn sum_rows_every_scalar(
    out: &mut [f32],
    ps: &[f32],
    cache: &[f16],
    slots: &[usize],
    stride: usize,
    offset: usize,
    step: usize,
) {
    let n = out.len();
    out.fill(0.0);
    for s in (0..ps.len()).step_by(step) {
        let row = &cache[slots[s] * stride + offset..slots[s] * stride + offset + n];
        for (o, &v) in out.iter_mut().zip(row) {
            *o += ps[s] * v.to_f32();
        }
    }
}

thread_local! {
    static PARTS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `out[d] = Σ_s ps[s] * rows[s][d]` over the f16 rows `cache[slots[s] * stride +
/// offset..]`, where slot `s` is KV cell `first_cell + s`, in llama.cpp's order `ord` for
/// the product of the transposed V cache with the (f16-rounded) probabilities: cell `c`
/// feeds partial sum `c % P` (`P` = one register for [`F16Order::Gemm`], four for
/// [`F16Order::VecDot`]), each partial in cell order ([`sum_rows_f16`]), then the
/// partials are reduced as the kernel reduces its registers. Assumes the cache length
/// llama.cpp sees is a multiple of `4 * lanes` (it pads to 256 cells), so there is no
/// f64 remainder.
#[allow(clippy::too_many_arguments)] // sum_rows_f16's six, plus the flavor, order and cell
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
        let mut parts = p.borrow_mut();
        let parts = &mut *parts;
        parts.clear();
        parts.resize(np * hv, 0.0);
        check_rows(hv, ps, cache, slots, stride, offset);
        for k in 0..np {
            // The first slot whose cell is ≡ k (mod np); its class is every np-th slot
            // from there, summed in place (gathering each class's weights and slots
            // first was a tenth of a decode step at depth 4096).
            let start = (k + np - first_cell % np) % np;
            if start < slots.len() {
                // SAFETY: every slot was checked above.
                unsafe {
                    sum_rows_f16_every(
                        &mut parts[k * hv..(k + 1) * hv],
                        &ps[start..],
                        cache,
                        &slots[start..],
                        stride,
                        offset,
                        np,
                    )
                };
            }
        }
        reduce_partials(fl, ord, parts, hv);
        out.copy_from_slice(&parts[..hv]);
    });
}

/// The reduction of `weighted_rows_f16`'s partial sums (`parts[k * hv..][..hv]` for
/// partial `k`, as many as the order has lanes) into `parts[..hv]`, done on whole rows:
/// element d of each row operation is exactly the scalar operation of `hsum` /
/// `reduce4` on element d's partials.
pub(crate) fn reduce_partials(fl: Flavor, ord: F16Order, parts: &mut [f32], hv: usize) {
    let n = fl.lanes();
    let add = |parts: &mut [f32], dst: usize, src: usize| {
        let (lo, hi) = parts.split_at_mut(src * hv);
        for (a, &b) in lo[dst * hv..(dst + 1) * hv].iter_mut().zip(&hi[..hv]) {
            *a += b;
        }
    };
    let halve = |parts: &mut [f32], base: usize| {
        // `hsum` over rows base..base + n.
        let mut w = n / 2;
        while w > 0 {
            for i in 0..w {
                add(parts, base + i, base + i + w);
            }
            w /= 2;
        }
    };
    match ord {
        F16Order::Gemm => halve(parts, 0),
        F16Order::VecDot => {
            // reduce4: registers 0+2, 1+3, 0+1 lane by lane, then register 0 reduced.
            for l in 0..n {
                add(parts, l, 2 * n + l);
                add(parts, n + l, 3 * n + l);
                add(parts, l, n + l);
            }
            match fl {
                Flavor::Avx512 => halve(parts, 0),
                Flavor::Avx2 => {
                    // t_i = l_i + l_{i+4}; (t0 + t1) + (t2 + t3).
                    for i in 0..4 {
                        add(parts, i, i + 4);
                    }
                    add(parts, 0, 1);
                    add(parts, 2, 3);
                    add(parts, 0, 2);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_to_f16_matches_its_twin() {
        let mut x: Vec<f32> = (0..1000)
            .map(|i| ((i as f32) * 0.7311).sin() * 10f32.powi(i % 13 - 6))
            .collect();
        x.extend([
            0.0,
            -0.0,
            65504.0,
            65520.0,
            1e9,
            -1e9,
            6e-8,
            3e-8,
            f32::INFINITY,
        ]);
        for n in [0, 1, 7, 8, 9, 31, x.len()] {
            let (mut a, mut b) = (x[..n].to_vec(), x[..n].to_vec());
            round_to_f16(&mut a);
            round_to_f16_scalar(&mut b);
            assert_eq!(
                a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
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
    }

    #[test]
    fn weighted_rows_match_their_definition() {
        // Head sizes that take every block of the SIMD kernels (64, 32, 8, single).
        for hv in [24, 107] {
            weighted_rows_match_their_definition_at(hv);
        }
    }

    fn weighted_rows_match_their_definition_at(hv: usize) {
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
