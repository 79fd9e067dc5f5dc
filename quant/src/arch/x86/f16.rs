//! f32 x f16 kernels for attention over the f16 KV cache, in llama.cpp's orders (twins in
//! `crate::ops::f16`).

use core::arch::x86_64::*;

use half::f16;

use super::simd::{arr, hsum_ps};
use crate::order::{hsum, F16Order, Flavor};

/// `ops::f16::sum_rows_f16_scalar` over slots `0, step, 2 * step, ..`, vectorised: 64 output
/// elements stay in registers while every such slot's row adds into them (multiply, then
/// add, slot order), then the next 64.
///
/// # Safety
/// AVX2/FMA/F16C available; every `slots[s] * stride + offset + out.len() <= cache.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
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
    let cp = cache.as_ptr().cast::<u8>();
    let op = out.as_mut_ptr();
    let row = |s: usize| cp.add(2 * (slots[s] * stride + offset));
    let mut i = 0;
    // 64 elements (eight add chains) at a time, then 32, 8 and single ones: each element
    // is the same multiply-then-add sequence over the slots whatever block holds it.
    while i + 64 <= n {
        sum_rows_block::<8>(ps, step, &row, op, i);
        i += 64;
    }
    while i + 32 <= n {
        sum_rows_block::<4>(ps, step, &row, op, i);
        i += 32;
    }
    while i + 8 <= n {
        sum_rows_block::<1>(ps, step, &row, op, i);
        i += 8;
    }
    for j in i..n {
        let mut acc = 0.0f32;
        for s in (0..ps.len()).step_by(step) {
            acc += ps[s] * (*row(s).add(2 * j).cast::<f16>()).to_f32();
        }
        *op.add(j) = acc;
    }
}

/// Outputs `i..i + 8 * R` of [`sum_rows_f16`]: `R` registers (independent add chains)
/// stay in registers while every slot's row (`row(s)`, bytes) adds into them.
///
/// # Safety
/// As [`sum_rows_f16`], with `i + 8 * R` at most the output's length.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sum_rows_block<const R: usize>(
    ps: &[f32],
    step: usize,
    row: &impl Fn(usize) -> *const u8,
    op: *mut f32,
    i: usize,
) {
    let mut acc = [_mm256_setzero_ps(); R];
    for s in (0..ps.len()).step_by(step) {
        let p = *ps.get_unchecked(s);
        let r = row(s).add(2 * i);
        let pv = _mm256_set1_ps(p);
        for (k, acc) in acc.iter_mut().enumerate() {
            let v = _mm256_cvtph_ps(_mm_loadu_si128(r.add(16 * k).cast()));
            *acc = _mm256_add_ps(*acc, _mm256_mul_ps(pv, v));
        }
    }
    for (k, acc) in acc.iter().enumerate() {
        _mm256_storeu_ps(op.add(i + 8 * k), *acc);
    }
}

/// An operand of the f16 products, read unaligned: f32 values that are f16 values
/// (attention's query, rounded) or f16 bits (keys, f16 weights, f16 activations).
pub(crate) trait Operand: Copy {
    /// Elements `i..i + 8` as f32.
    unsafe fn ld8(self, i: usize) -> __m256;
    /// Element `i` as f32.
    unsafe fn at(self, i: usize) -> f32;
}

/// f32 values at a pointer.
#[derive(Clone, Copy)]
pub(crate) struct F32s(pub *const f32);
/// f16 bits at a (byte) pointer.
#[derive(Clone, Copy)]
pub(crate) struct F16s(pub *const u8);

impl Operand for F32s {
    #[inline(always)]
    unsafe fn ld8(self, i: usize) -> __m256 {
        _mm256_loadu_ps(self.0.add(i))
    }
    #[inline(always)]
    unsafe fn at(self, i: usize) -> f32 {
        self.0.add(i).read_unaligned()
    }
}

impl Operand for F16s {
    #[inline(always)]
    unsafe fn ld8(self, i: usize) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(self.0.add(2 * i).cast()))
    }
    #[inline(always)]
    unsafe fn at(self, i: usize) -> f32 {
        crate::f16::f16_to_f32(self.0.add(2 * i).cast::<u16>().read_unaligned())
    }
}

/// `ops::f16::dot_f16_scalar` with ymm registers: same partial sums (the products of
/// f16 values are exact in f32, so FMA adds them exactly like the scalar multiply-add),
/// same reductions.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `a` and `b` must have equal lengths.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_f16(fl: Flavor, ord: F16Order, a: &[f32], b: &[f16]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    dot_f16_of(fl, ord, a.len(), F32s(a.as_ptr()), F16s(b.as_ptr().cast()))
}

/// [`dot_f16`] over any two operands of `n` elements.
///
/// # Safety
/// AVX2, FMA and F16C must be available; both operands hold `n` elements.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_f16_of<A: Operand, B: Operand>(
    fl: Flavor,
    ord: F16Order,
    n: usize,
    a: A,
    b: B,
) -> f32 {
    let lanes = fl.lanes();
    let regs = lanes / 8;
    // SAFETY (all loads): every index read is below n.
    let ld = |i: usize| unsafe { (a.ld8(i), b.ld8(i)) };
    match ord {
        F16Order::Gemm => {
            let mut acc = [_mm256_setzero_ps(); 2];
            let mut i = 0;
            while i + lanes <= n {
                for (h, acc) in acc.iter_mut().enumerate().take(regs) {
                    let (x, y) = ld(i + 8 * h);
                    *acc = _mm256_fmadd_ps(x, y, *acc);
                }
                i += lanes;
            }
            if i == n {
                // The halving tree: (l, l+8) for 16 lanes, then hsum_float_8's order.
                return hsum_ps(if regs == 2 {
                    _mm256_add_ps(acc[0], acc[1])
                } else {
                    acc[0]
                });
            }
            let mut l = [0.0f32; 16];
            _mm256_storeu_ps(l.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(l.as_mut_ptr().add(8), acc[1]);
            for k in i..n {
                l[k - i] += a.at(k) * b.at(k);
            }
            hsum(fl, &mut l)
        }
        F16Order::VecDot => {
            let step = 4 * lanes;
            let np = n - n % step;
            let mut acc = [[_mm256_setzero_ps(); 2]; 4];
            let mut i = 0;
            while i < np {
                for (j, acc) in acc.iter_mut().enumerate() {
                    for (h, acc) in acc.iter_mut().enumerate().take(regs) {
                        let (x, y) = ld(i + j * lanes + 8 * h);
                        *acc = _mm256_fmadd_ps(x, y, *acc);
                    }
                }
                i += step;
            }
            let r = if regs == 2 {
                vecdot_reduce::<2>(&acc)
            } else {
                vecdot_reduce::<1>(&acc)
            };
            let mut s = r as f64;
            for k in np..n {
                s += (a.at(k) * b.at(k)) as f64;
            }
            s as f32
        }
    }
}

/// F16 weight rows against f16 activations (`formats::float::vec_dot_f16{,_tiled}`, the
/// table's rows): [`dot_f16_of`] on both rows' bits, in the build's flavor.
pub(super) fn weights_single(w: &[u8], a: &[u8]) -> f32 {
    weights(F16Order::VecDot, w, a)
}

pub(super) fn weights_tiled(w: &[u8], a: &[u8]) -> f32 {
    let fl = crate::order::flavor();
    let whole = (w.len() / 2).is_multiple_of(fl.lanes());
    weights(
        if whole {
            F16Order::Gemm
        } else {
            F16Order::VecDot
        },
        w,
        a,
    )
}

/// Checks a `TileFn` call of F16 or BF16 rows (up to `max_rows` weight rows, up to eight
/// tokens) and returns (tokens, bytes per row): every row read is then inside the slices.
pub(super) fn tile_shape(
    w: &[u8],
    (rows, max_rows): (usize, usize),
    a: &[u8],
    stride: usize,
    outs: usize,
) -> (usize, usize) {
    assert!(
        (1..=max_rows).contains(&rows) && outs.is_multiple_of(rows),
        "float tile: {rows} weight rows, {outs} outputs"
    );
    let n_tok = outs / rows;
    let row = w.len() / rows;
    assert!(
        (1..=crate::contract::TILE_MAX_TOKENS).contains(&n_tok)
            && w.len().is_multiple_of(rows)
            && row.is_multiple_of(2)
            && (n_tok == 1 || stride >= row)
            && a.len() >= (n_tok - 1) * stride + row,
        "float tile: {} weight bytes in {rows} rows, {} activation bytes, stride {stride}, \
         {n_tok} tokens",
        w.len(),
        a.len()
    );
    (n_tok, row)
}

/// The tile of F16 weights in `ggml_vec_dot_f16`'s order: the one-row kernel per pair
/// (its four accumulator chains per token leave no registers to share a weight load).
pub(super) fn weights_single_many(
    w: &[u8],
    rows: usize,
    a: &[u8],
    stride: usize,
    _side: crate::contract::ActSide<'_>,
    out: &mut [f32],
) {
    let (n_tok, row) = tile_shape(
        w,
        (rows, crate::contract::EXACT_TILE_ROWS),
        a,
        stride,
        out.len(),
    );
    for r in 0..rows {
        for c in 0..n_tok {
            let (wr, ar) = (&w[r * row..(r + 1) * row], &a[c * stride..c * stride + row]);
            out[r * n_tok + c] = weights(F16Order::VecDot, wr, ar);
        }
    }
}

/// The tile of F16 weights in tinyBLAS's order (`TileFn`: up to two weight rows against
/// up to eight tokens): two rows by four tokens per pass (`bf16::drive`, [`gemm256`]),
/// whose accumulators see exactly [`dot_f16_of`]'s FMAs and reduction, so every output
/// has the one-row kernel's bits. Rows of no whole registers take the one-row `vec_dot`
/// order.
pub(super) fn weights_tiled_many(
    w: &[u8],
    rows: usize,
    a: &[u8],
    stride: usize,
    _side: crate::contract::ActSide<'_>,
    out: &mut [f32],
) {
    let (n_tok, row) = tile_shape(
        w,
        (rows, crate::contract::EXACT_TILE_ROWS),
        a,
        stride,
        out.len(),
    );
    debug_assert!(crate::isa::Isa::Avx2.available());
    let fl = crate::order::flavor();
    let n = row / 2;
    if !n.is_multiple_of(fl.lanes()) {
        for r in 0..rows {
            let wr = &w[r * row..(r + 1) * row];
            for c in 0..n_tok {
                let ar = &a[c * stride..c * stride + row];
                out[r * n_tok + c] = weights(F16Order::VecDot, wr, ar);
            }
        }
        return;
    }
    // SAFETY: AVX2/FMA/F16C (this row's ISA); shapes checked by tile_shape; n whole
    // registers of the flavor.
    unsafe { gemm256_tile(fl, n, (w, rows, row), (a, n_tok, stride), out) }
}

/// [`weights_tiled_many`]'s passes in flavor `fl`'s lanes (`bf16::drive` over
/// [`F16Gemm256`]).
///
/// # Safety
/// AVX2/FMA/F16C; shapes as `bf16::drive` requires; `n` whole registers of `fl`.
unsafe fn gemm256_tile(
    fl: Flavor,
    n: usize,
    w: (&[u8], usize, usize),
    a: (&[u8], usize, usize),
    out: &mut [f32],
) {
    match fl {
        Flavor::Avx512 => super::bf16::drive(&F16Gemm256::<2>, n, w, a, out),
        Flavor::Avx2 => super::bf16::drive(&F16Gemm256::<1>, n, w, a, out),
    }
}

/// F16's tinyBLAS kernel on 256-bit registers, in the flavor's lanes (`REGS` ymm per
/// register: 2 for the 16-lane flavor, whose lanes l and l + 8 are added before the
/// halving, as [`dot_f16_of`]'s `Gemm` branch): up to two weight rows against four tokens
/// per pass, each f16 row converted once for all of them.
struct F16Gemm256<const REGS: usize>;

impl<const REGS: usize> super::bf16::Gemm for F16Gemm256<REGS> {
    fn most_rows(&self) -> usize {
        2
    }
    unsafe fn run<const R: usize, const T: usize>(
        &self,
        k: usize,
        w: [*const u8; R],
        a: [*const u8; T],
    ) -> [[f32; T]; R] {
        gemm256::<REGS, R, T>(k, w, a)
    }
}

/// # Safety
/// AVX2/FMA/F16C; every pointer holds `k` f16 values, `k` a multiple of `8 * REGS`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemm256<const REGS: usize, const R: usize, const T: usize>(
    k: usize,
    w: [*const u8; R],
    a: [*const u8; T],
) -> [[f32; T]; R] {
    let ld = |p: *const u8| _mm256_cvtph_ps(_mm_loadu_si128(p.cast()));
    let mut acc = [[[_mm256_setzero_ps(); REGS]; T]; R];
    let mut i = 0;
    while i < k {
        for h in 0..REGS {
            let wv: [__m256; R] = arr(|r| ld(w[r].add(2 * (i + 8 * h))));
            for t in 0..T {
                let av = ld(a[t].add(2 * (i + 8 * h)));
                for r in 0..R {
                    acc[r][t][h] = _mm256_fmadd_ps(wv[r], av, acc[r][t][h]);
                }
            }
        }
        i += 8 * REGS;
    }
    arr(|r| {
        let y: [__m256; T] = arr(|t| {
            if REGS == 2 {
                _mm256_add_ps(acc[r][t][0], acc[r][t][REGS - 1])
            } else {
                acc[r][t][0]
            }
        });
        if T == 4 {
            let v = super::simd::halve4(arr(|t| y[t]));
            arr(|t| v[t])
        } else {
            arr(|t| hsum_ps(y[t]))
        }
    })
}

/// The tile of F16 weights in tinyBLAS's order at AVX-512 (the table's AVX-512 rows): in
/// the AVX-512 flavor, over rows of whole 16-element steps, up to four weight rows against
/// four tokens per pass in zmm registers (`bf16::drive`, as BF16's tile), each output the
/// one-row kernel's bits; otherwise [`weights_tiled_many`].
pub(super) fn weights_tiled_many_avx512(
    w: &[u8],
    rows: usize,
    a: &[u8],
    stride: usize,
    side: crate::contract::ActSide<'_>,
    out: &mut [f32],
) {
    let (n_tok, row) = tile_shape(w, (rows, super::bf16::TILE_ROWS), a, stride, out.len());
    let n = row / 2;
    if crate::order::flavor() != Flavor::Avx512
        || !n.is_multiple_of(16)
        || !crate::isa::Isa::Avx512.available()
    {
        for r in (0..rows).step_by(2) {
            let take = (rows - r).min(2);
            let o = &mut out[r * n_tok..(r + take) * n_tok];
            weights_tiled_many(&w[r * row..(r + take) * row], take, a, stride, side, o);
        }
        return;
    }
    // SAFETY: AVX-512 checked above; shapes checked by tile_shape; n whole steps.
    unsafe { super::bf16::drive(&F16Gemm512, n, (w, rows, row), (a, n_tok, stride), out) }
}

/// F16's tinyBLAS kernel in the AVX-512 flavor: 16 lanes, one FMA per product of f16
/// values widened by `vcvtph2ps` (exact), then the halving.
struct F16Gemm512;

impl super::bf16::Gemm for F16Gemm512 {
    fn most_rows(&self) -> usize {
        4
    }
    unsafe fn run<const R: usize, const T: usize>(
        &self,
        k: usize,
        w: [*const u8; R],
        a: [*const u8; T],
    ) -> [[f32; T]; R] {
        gemm512::<R, T>(k, w, a)
    }
}

/// # Safety
/// AVX-512 F; every pointer holds `k` f16 values, `k` a multiple of 16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
unsafe fn gemm512<const R: usize, const T: usize>(
    k: usize,
    w: [*const u8; R],
    a: [*const u8; T],
) -> [[f32; T]; R] {
    let ld = |p: *const u8| _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()));
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    let mut i = 0;
    while i < k {
        let wv: [__m512; R] = arr(|r| ld(w[r].add(2 * i)));
        for t in 0..T {
            let av = ld(a[t].add(2 * i));
            for r in 0..R {
                acc[r][t] = _mm512_fmadd_ps(wv[r], av, acc[r][t]);
            }
        }
        i += 16;
    }
    if T == 4 {
        arr(|r| {
            let v = super::simd::halve4(arr(|t| super::simd::half512(acc[r][t])));
            arr(|t| v[t])
        })
    } else {
        arr(|r| arr(|t| hsum_ps(super::simd::half512(acc[r][t]))))
    }
}

fn weights(ord: F16Order, w: &[u8], a: &[u8]) -> f32 {
    assert_eq!(w.len(), a.len(), "vec_dot F16: length mismatch");
    debug_assert!(crate::isa::Isa::Avx2.available());
    // SAFETY: the table hands these rows out only where AVX2, FMA and F16C were detected;
    // both rows hold `w.len() / 2` f16 values (checked).
    unsafe {
        dot_f16_of(
            crate::order::flavor(),
            ord,
            w.len() / 2,
            F16s(w.as_ptr()),
            F16s(a.as_ptr()),
        )
    }
}

/// The VecDot order's final reduction of its four accumulators (`REGS` registers each):
/// 0+2, 1+3, then 0+1, reduced as ggml does for the flavor (`order::reduce4`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vecdot_reduce<const REGS: usize>(acc: &[[__m256; 2]; 4]) -> f32 {
    let mut f = [_mm256_setzero_ps(); 2];
    for (h, f) in f.iter_mut().enumerate().take(REGS) {
        let a02 = _mm256_add_ps(acc[0][h], acc[2][h]);
        let a13 = _mm256_add_ps(acc[1][h], acc[3][h]);
        *f = _mm256_add_ps(a02, a13);
    }
    if REGS == 2 {
        hsum_ps(_mm256_add_ps(f[0], f[1]))
    } else {
        let t0 = _mm_add_ps(
            _mm256_castps256_ps128(f[0]),
            _mm256_extractf128_ps::<1>(f[0]),
        );
        let t1 = _mm_hadd_ps(t0, t0);
        _mm_cvtss_f32(_mm_hadd_ps(t1, t1))
    }
}

/// `dot_f16(fl, F16Order::VecDot, a, row)` for `KEYS` rows at once (`REGS` = the
/// flavor's lanes / 8; `a.len()` a multiple of `4 * 8 * REGS`, so no f64 remainder):
/// each key's four accumulators see exactly the one-key kernel's FMAs in its order and
/// the same reduction, so every score has its bits; the keys' chains run side by side.
///
/// # Safety
/// AVX2/FMA/F16C; every row holds `a.len()` values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn vecdot_dots<const REGS: usize, const KEYS: usize>(
    a: &[f32],
    rows: [*const u16; KEYS],
) -> [f32; KEYS] {
    let n = a.len();
    let lanes = 8 * REGS;
    let pa = a.as_ptr();
    let mut acc = [[[_mm256_setzero_ps(); 2]; 4]; KEYS];
    let mut i = 0;
    while i < n {
        for j in 0..4 {
            for h in 0..REGS {
                let at = i + j * lanes + 8 * h;
                let x = _mm256_loadu_ps(pa.add(at));
                for (k, acc) in acc.iter_mut().enumerate() {
                    let y = _mm256_cvtph_ps(_mm_loadu_si128(rows[k].add(at).cast()));
                    acc[j][h] = _mm256_fmadd_ps(x, y, acc[j][h]);
                }
            }
        }
        i += 4 * lanes;
    }
    arr(|k| vecdot_reduce::<REGS>(&acc[k]))
}

/// Keys scored together by [`scores_f16_keys`]: four independent FMA chains instead of
/// one latency-bound chain per key (two in the VecDot order with 16 lanes, which keeps
/// four accumulators per key).
const SCORE_KEYS: usize = 4;

/// `dot_f16(fl, F16Order::Gemm, a, row)` for `SCORE_KEYS` rows at once (`REGS` = the
/// flavor's lanes / 8): each key's accumulators see exactly the FMAs of the one-key
/// kernel, in the same order, and the same final reduction, so every score has its bits.
///
/// # Safety
/// AVX2/FMA/F16C; `a.len()` is a multiple of `8 * REGS` and every row holds `a.len()`
/// values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemm_dots<const REGS: usize>(
    a: &[f32],
    rows: [*const u16; SCORE_KEYS],
) -> [f32; SCORE_KEYS] {
    let n = a.len();
    let pa = a.as_ptr();
    let mut acc = [[_mm256_setzero_ps(); REGS]; SCORE_KEYS];
    let mut i = 0;
    while i < n {
        for h in 0..REGS {
            let x = _mm256_loadu_ps(pa.add(i + 8 * h));
            for (k, acc) in acc.iter_mut().enumerate() {
                let y = _mm256_cvtph_ps(_mm_loadu_si128(rows[k].add(i + 8 * h).cast()));
                acc[h] = _mm256_fmadd_ps(x, y, acc[h]);
            }
        }
        i += 8 * REGS;
    }
    arr(|k| {
        hsum_ps(if REGS == 2 {
            _mm256_add_ps(acc[k][0], acc[k][REGS - 1])
        } else {
            acc[k][0]
        })
    })
}

/// `out[s] = dot_f16(fl, ord, a, row(s)) * scale` for the rows `cache[slots[s] * stride +
/// offset..][..a.len()]`, several rows at a time (`gemm_dots`, `vecdot_dots`); the same
/// bits as one call per row.
///
/// # Safety
/// AVX2/FMA/F16C; `a.len()` is a multiple of `fl.lanes()` (Gemm) or of `4 * fl.lanes()`
/// (VecDot: no f64 remainder); every row read lies in `cache`; `out.len() ==
/// slots.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)] // as `ops::f16::scores_f16`
pub(crate) unsafe fn scores_f16_keys(
    fl: Flavor,
    ord: F16Order,
    a: &[f32],
    cache: &[f16],
    slots: &[usize],
    stride: usize,
    offset: usize,
    scale: f32,
    out: &mut [f32],
) {
    let n = a.len();
    let cp = cache.as_ptr().cast::<u16>();
    let row = |s: usize| cp.add(slots[s] * stride + offset);
    let wide = fl.lanes() == 16;
    let keys = if ord == F16Order::VecDot && wide {
        2
    } else {
        SCORE_KEYS
    };
    let full = slots.len() - slots.len() % keys;
    let mut d = [0.0f32; SCORE_KEYS];
    let mut s = 0;
    while s < full {
        let rows = || arr(|k| row(s + k));
        match (ord, wide) {
            (F16Order::Gemm, true) => d = gemm_dots::<2>(a, rows()),
            (F16Order::Gemm, false) => d = gemm_dots::<1>(a, rows()),
            (F16Order::VecDot, true) => {
                d[..2].copy_from_slice(&vecdot_dots::<2, 2>(a, [row(s), row(s + 1)]))
            }
            (F16Order::VecDot, false) => d = vecdot_dots::<1, 4>(a, rows()),
        }
        for k in 0..keys {
            out[s + k] = d[k] * scale;
        }
        s += keys;
    }
    for s in full..slots.len() {
        let r = std::slice::from_raw_parts(row(s).cast::<f16>(), n);
        out[s] = dot_f16(fl, ord, a, r) * scale;
    }
}

/// [`crate::ops::f16::round_to_f16`], eight values per conversion.
///
/// # Safety
/// AVX2 and F16C must be available.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn round_to_f16(x: &mut [f32]) {
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        let v = _mm256_loadu_ps(c.as_ptr());
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
        _mm256_storeu_ps(c.as_mut_ptr(), _mm256_cvtph_ps(h));
    }
    crate::ops::f16::round_to_f16_scalar(chunks.into_remainder());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 256-bit tinyBLAS tile in both flavors' lanes (whichever flavor this build
    /// follows) against the scalar twin of that flavor, for every row/token shape of a
    /// call: two rows by five tokens covers the pass of four and the one after it.
    #[test]
    fn gemm256_matches_both_flavors_twins() {
        if !crate::isa::Isa::Avx2.available() {
            return;
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut f16s = |n: usize| -> Vec<u8> {
            (0..n)
                .flat_map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let x = (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                    f16::from_f32(x).to_bits().to_le_bytes()
                })
                .collect()
        };
        for n in [16, 32, 48, 576, 1008, 2048] {
            let row = 2 * n;
            let (w, a) = (f16s(2 * n), f16s(5 * n));
            for fl in [Flavor::Avx2, Flavor::Avx512] {
                for rows in [1, 2] {
                    let mut out = vec![0f32; rows * 5];
                    // SAFETY: AVX2 checked; shapes as drive requires; n whole registers.
                    unsafe {
                        gemm256_tile(fl, n, (&w[..rows * row], rows, row), (&a, 5, row), &mut out)
                    };
                    for r in 0..rows {
                        for c in 0..5 {
                            let twin = crate::formats::float::vec_dot_f16_in(
                                fl,
                                F16Order::Gemm,
                                &w[r * row..(r + 1) * row],
                                &a[c * row..(c + 1) * row],
                            );
                            let got = out[r * 5 + c];
                            assert_eq!(
                                got.to_bits(),
                                twin.to_bits(),
                                "{fl:?} n={n} rows={rows} r={r} c={c}"
                            );
                        }
                    }
                }
            }
        }
    }
}
