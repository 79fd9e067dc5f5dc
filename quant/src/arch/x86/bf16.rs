//! BF16 weights against bf16 activations in llama.cpp's x86 orders (`order::Bf16Order`;
//! twins: `formats::float::vec_dot_bf16_in`): `ggml_vec_dot_bf16` for one token and
//! tinyBLAS for two or more.
//!
//! The AVX-512 rows run `vdpbf16ps` itself where the CPU has AVX512_BF16 and the order is
//! that instruction's. Everything else runs on widened f32 lanes: a bf16 element widens
//! by a 16-bit shift, and the pair in a 32-bit word splits into its even element (shifted
//! up) and its odd one (masked), which is how `vdpbf16ps`'s order is followed without it.
//! The product of two bf16 values is exact in f32, so an FMA rounds as the instruction's
//! add does.

use core::arch::x86_64::*;

use super::simd::{arr, half512, halve4, hsum_ps, ld128, ld256};
use crate::contract::ActSide;
use crate::formats::float::{bf16_vec_dot_finish, rd_bf16};
use crate::order::{bf16_order, Bf16Order};

/// The orders as const parameters.
const DP: u8 = Bf16Order::Dpbf16.id();
const W16: u8 = Bf16Order::Avx512.id();
const W8: u8 = Bf16Order::Avx2.id();

/// Elements per tinyBLAS step of order `O` (a [`Bf16Order::id`]).
const fn step_of(o: u8) -> usize {
    Bf16Order::from_id(o).gemm_step()
}

/// Whether `vdpbf16ps` may run (the AVX-512 rows only: an AVX2 cap keeps to AVX2).
fn has_dp() -> bool {
    std::is_x86_feature_detected!("avx512bf16")
}

// ----- widened lanes (AVX2) -----

/// Eight bf16 at `p`, widened.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen8(p: *const u8) -> __m256 {
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(ld128(p))))
}

/// One tinyBLAS step's operand at `p`: `DP`: the odd and even elements of 16 pairs
/// (`[odd 0..8, even 0..8, odd 8..16, even 8..16]`); `W16`: 16 elements in two registers;
/// `W8`: eight in one.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn operand<const O: u8>(p: *const u8) -> [__m256; 4] {
    let z = _mm256_setzero_ps();
    match O {
        DP => {
            let hi = _mm256_set1_epi32(0xffff_0000u32 as i32);
            let (v0, v1) = (ld256(p), ld256(p.add(32)));
            [
                _mm256_castsi256_ps(_mm256_and_si256(v0, hi)),
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v0)),
                _mm256_castsi256_ps(_mm256_and_si256(v1, hi)),
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v1)),
            ]
        }
        W16 => [widen8(p), widen8(p.add(16)), z, z],
        _ => [widen8(p), z, z, z],
    }
}

/// One step's products added into a register of the order's lanes (two ymm for 16).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn madd<const O: u8>(acc: &mut [__m256; 2], x: &[__m256; 4], y: &[__m256; 4]) {
    match O {
        DP => {
            for h in 0..2 {
                acc[h] = _mm256_fmadd_ps(x[2 * h], y[2 * h], acc[h]);
                acc[h] = _mm256_fmadd_ps(x[2 * h + 1], y[2 * h + 1], acc[h]);
            }
        }
        W16 => {
            for h in 0..2 {
                acc[h] = _mm256_fmadd_ps(x[h], y[h], acc[h]);
            }
        }
        _ => acc[0] = _mm256_fmadd_ps(x[0], y[0], acc[0]),
    }
}

/// A register's lanes halved down to one float (`_mm512_reduce_add_ps` / tinyBLAS's
/// `hsum`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn halve<const O: u8>(acc: &[__m256; 2]) -> f32 {
    if O == W8 {
        hsum_ps(acc[0])
    } else {
        hsum_ps(_mm256_add_ps(acc[0], acc[1]))
    }
}

/// The accumulators of `T` tokens halved: four at a time where `T` is 4.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn halve_all<const O: u8, const T: usize>(acc: &[[__m256; 2]; T]) -> [f32; T] {
    if T == 4 {
        let y: [__m256; 4] = arr(|t| {
            if O == W8 {
                acc[t][0]
            } else {
                _mm256_add_ps(acc[t][0], acc[t][1])
            }
        });
        let v = halve4(y);
        arr(|t| v[t])
    } else {
        arr(|t| halve::<O>(&acc[t]))
    }
}

/// tinyBLAS's order for `R` weight rows and `T` tokens, `k` a multiple of the step: per
/// output one register's chain, then its halving.
///
/// # Safety
/// AVX2/FMA/F16C; every pointer holds `k` bf16 values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemm_emu<const O: u8, const R: usize, const T: usize>(
    k: usize,
    w: [*const u8; R],
    a: [*const u8; T],
) -> [[f32; T]; R] {
    let mut acc = [[[_mm256_setzero_ps(); 2]; T]; R];
    let mut i = 0;
    while i < k {
        let wv: [[__m256; 4]; R] = arr(|r| operand::<O>(w[r].add(2 * i)));
        for t in 0..T {
            let av = operand::<O>(a[t].add(2 * i));
            for r in 0..R {
                madd::<O>(&mut acc[r][t], &wv[r], &av);
            }
        }
        i += step_of(O);
    }
    arr(|r| halve_all::<O, T>(&acc[r]))
}

/// `ggml_vec_dot_bf16`'s vector loop into `acc` (as the twin's registers); returns the
/// elements covered.
///
/// # Safety
/// AVX2/FMA/F16C; both pointers hold `n` bf16 values.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_emu<const O: u8>(
    w: *const u8,
    a: *const u8,
    n: usize,
    acc: &mut [[f32; 16]; 4],
) -> usize {
    // Registers of the order's lanes and the elements each covers per step.
    let (regs, width) = if O == W8 { (4, 8) } else { (2, step_of(O)) };
    let np = n - n % (regs * width);
    let mut c = [[_mm256_setzero_ps(); 2]; 4];
    let mut i = 0;
    while i < np {
        for (r, c) in c.iter_mut().enumerate().take(regs) {
            let off = 2 * (i + r * width);
            madd::<O>(c, &operand::<O>(w.add(off)), &operand::<O>(a.add(off)));
        }
        i += regs * width;
    }
    for (r, c) in c.iter().enumerate().take(regs) {
        _mm256_storeu_ps(acc[r].as_mut_ptr(), c[0]);
        _mm256_storeu_ps(acc[r].as_mut_ptr().add(8), c[1]);
    }
    np
}

// ----- vdpbf16ps (AVX-512 BF16) -----

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bf16")]
unsafe fn ld_bh(p: *const u8) -> __m512bh {
    // SAFETY (of the transmute): both are 512 bits of plain data.
    core::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(p.cast()))
}

/// [`gemm_emu`]'s `DP` order with the instruction itself.
///
/// # Safety
/// AVX-512 F and BF16; every pointer holds `k` bf16 values, `k` a multiple of 32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bf16")]
unsafe fn gemm_dp<const R: usize, const T: usize>(
    k: usize,
    w: [*const u8; R],
    a: [*const u8; T],
) -> [[f32; T]; R] {
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    let mut i = 0;
    while i < k {
        let wv: [__m512bh; R] = arr(|r| ld_bh(w[r].add(2 * i)));
        for t in 0..T {
            let av = ld_bh(a[t].add(2 * i));
            for r in 0..R {
                acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv[r], av);
            }
        }
        i += 32;
    }
    if T == 4 {
        arr(|r| {
            let y: [__m256; 4] = arr(|t| half512(acc[r][t]));
            let v = halve4(y);
            arr(|t| v[t])
        })
    } else {
        arr(|r| arr(|t| hsum_ps(half512(acc[r][t]))))
    }
}

/// [`vec_dot_emu`]'s `DP` order with the instruction itself.
///
/// # Safety
/// AVX-512 F and BF16; both pointers hold `n` bf16 values.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bf16")]
unsafe fn vec_dot_dp(w: *const u8, a: *const u8, n: usize, acc: &mut [[f32; 16]; 4]) -> usize {
    let np = n - n % 64;
    let (mut c1, mut c2) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut i = 0;
    while i < np {
        c1 = _mm512_dpbf16_ps(c1, ld_bh(w.add(2 * i)), ld_bh(a.add(2 * i)));
        c2 = _mm512_dpbf16_ps(c2, ld_bh(w.add(2 * i + 64)), ld_bh(a.add(2 * i + 64)));
        i += 64;
    }
    _mm512_storeu_ps(acc[0].as_mut_ptr(), c1);
    _mm512_storeu_ps(acc[1].as_mut_ptr(), c2);
    np
}

// ----- entry points -----

/// tinyBLAS's order for `R` rows and `T` tokens in order `o`, with the instruction where
/// `dp` (and the order is its).
///
/// # Safety
/// AVX2/FMA/F16C (and AVX-512 BF16 where `dp`); every pointer holds `k` bf16 values, `k`
/// a multiple of `o.gemm_step()`.
unsafe fn gemm<const R: usize, const T: usize>(
    o: Bf16Order,
    dp: bool,
    k: usize,
    w: [*const u8; R],
    a: [*const u8; T],
) -> [[f32; T]; R] {
    match o.id() {
        DP if dp => gemm_dp::<R, T>(k, w, a),
        DP => gemm_emu::<DP, R, T>(k, w, a),
        W16 => gemm_emu::<W16, R, T>(k, w, a),
        _ => gemm_emu::<W8, R, T>(k, w, a),
    }
}

/// One row's dot in order `o` (`tiled`: tinyBLAS's where the row is whole steps), with
/// the instruction where `dp`: the twin's bits.
pub(crate) fn dot(o: Bf16Order, tiled: bool, dp: bool, w: &[u8], a: &[u8]) -> f32 {
    assert_eq!(w.len(), a.len(), "vec_dot BF16: length mismatch");
    assert!(crate::isa::Isa::Avx2.available() && (!dp || has_dp()));
    let n = w.len() / 2;
    if tiled && n.is_multiple_of(o.gemm_step()) {
        // SAFETY: features checked above; both rows hold n values, n whole steps.
        return unsafe { gemm::<1, 1>(o, dp, n, [w.as_ptr()], [a.as_ptr()]) }[0][0];
    }
    let mut acc = [[0f32; 16]; 4];
    // SAFETY: as above.
    let done = unsafe {
        match o.id() {
            DP if dp => vec_dot_dp(w.as_ptr(), a.as_ptr(), n, &mut acc),
            DP => vec_dot_emu::<DP>(w.as_ptr(), a.as_ptr(), n, &mut acc),
            W16 => vec_dot_emu::<W16>(w.as_ptr(), a.as_ptr(), n, &mut acc),
            _ => vec_dot_emu::<W8>(w.as_ptr(), a.as_ptr(), n, &mut acc),
        }
    };
    bf16_vec_dot_finish(o, &mut acc, done, n, |i| rd_bf16(w, i) * rd_bf16(a, i))
}

/// Most weight rows a BF16 or F16 tile takes: four with 512-bit registers (16
/// accumulators of 32 registers for four tokens), two on 256-bit ones (16 registers).
pub(super) const TILE_ROWS: usize = 4;

/// A tinyBLAS-order kernel for `R` weight rows and `T` tokens: per output one register's
/// chain over `k` elements (a multiple of the kernel's step), then its halving.
pub(super) trait Gemm {
    /// Most rows per call (4 or 2; see [`TILE_ROWS`]).
    fn most_rows(&self) -> usize;
    /// # Safety
    /// The kernel's features are available; every pointer holds `k` values.
    unsafe fn run<const R: usize, const T: usize>(
        &self,
        k: usize,
        w: [*const u8; R],
        a: [*const u8; T],
    ) -> [[f32; T]; R];
}

/// A tile of `rows` weight rows (`row` bytes each, `n` elements) against `n_tok` tokens
/// (`stride` bytes apart) through `g`: rows in fours or twos against tokens in fours, each
/// output `g`'s one-row bits. Fewer than four tokens: one row after the other, which is
/// one sequential stream for the prefetchers (four rows at once, four short ones,
/// decoded BF16 smollm2 at 51 t/s instead of 88).
///
/// # Safety
/// `g`'s features are available; the slices hold what `rows`, `row`, `n_tok` and
/// `stride` say (`f16::tile_shape`), `n` a multiple of `g`'s step.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn drive<G: Gemm>(
    g: &G,
    n: usize,
    (w, rows, row): (&[u8], usize, usize),
    (a, n_tok, stride): (&[u8], usize, usize),
    out: &mut [f32],
) {
    let most = if n_tok < 4 { 1 } else { g.most_rows() };
    let wr = |r: usize| w[r * row..(r + 1) * row].as_ptr();
    let mut r = 0;
    while r < rows {
        let take = match rows - r {
            k if k >= 4 && most == 4 => 4,
            k if k >= 2 && most >= 2 => 2,
            _ => 1,
        };
        let mut c = 0;
        while c < n_tok {
            let four = c + 4 <= n_tok;
            let ap: [*const u8; 4] = arr(|t| a[(c + if four { t } else { 0 }) * stride..].as_ptr());
            let mut put =
                |q: usize, v: &[f32]| out[(r + q) * n_tok + c..][..v.len()].copy_from_slice(v);
            match (take, four) {
                (4, true) => g
                    .run::<4, 4>(n, arr(|q| wr(r + q)), ap)
                    .iter()
                    .enumerate()
                    .for_each(|(q, v)| put(q, v)),
                (4, false) => g
                    .run::<4, 1>(n, arr(|q| wr(r + q)), [ap[0]])
                    .iter()
                    .enumerate()
                    .for_each(|(q, v)| put(q, v)),
                (2, true) => g
                    .run::<2, 4>(n, arr(|q| wr(r + q)), ap)
                    .iter()
                    .enumerate()
                    .for_each(|(q, v)| put(q, v)),
                (2, false) => g
                    .run::<2, 1>(n, arr(|q| wr(r + q)), [ap[0]])
                    .iter()
                    .enumerate()
                    .for_each(|(q, v)| put(q, v)),
                (_, true) => put(0, &g.run::<1, 4>(n, [wr(r)], ap)[0]),
                (_, false) => put(0, &g.run::<1, 1>(n, [wr(r)], [ap[0]])[0]),
            }
            c += if four { 4 } else { 1 };
        }
        r += take;
    }
}

/// BF16's tinyBLAS kernels: in order `o`, with `vdpbf16ps` where `dp`.
struct Bf16Gemm {
    o: Bf16Order,
    dp: bool,
}

impl Gemm for Bf16Gemm {
    fn most_rows(&self) -> usize {
        if self.dp && self.o == Bf16Order::Dpbf16 {
            4
        } else {
            2
        }
    }
    unsafe fn run<const R: usize, const T: usize>(
        &self,
        k: usize,
        w: [*const u8; R],
        a: [*const u8; T],
    ) -> [[f32; T]; R] {
        gemm::<R, T>(self.o, self.dp, k, w, a)
    }
}

/// The tile of `tiled` order ([`drive`]); rows of no whole steps take `vec_dot`'s order
/// per pair. (Four rows per call with `vdpbf16ps`, two on widened lanes: the emulation
/// caps `R` itself.)
fn tile(tiled: bool, dp: bool, w: &[u8], rows: usize, a: &[u8], stride: usize, out: &mut [f32]) {
    let (n_tok, row) = super::f16::tile_shape(w, (rows, TILE_ROWS), a, stride, out.len());
    let o = bf16_order();
    let n = row / 2;
    if !tiled || !n.is_multiple_of(o.gemm_step()) {
        for r in 0..rows {
            for c in 0..n_tok {
                let a = &a[c * stride..c * stride + row];
                out[r * n_tok + c] = dot(o, tiled, dp, &w[r * row..(r + 1) * row], a);
            }
        }
        return;
    }
    assert!(crate::isa::Isa::Avx2.available() && (!dp || has_dp()));
    // SAFETY: features checked above; shapes checked by tile_shape; n whole steps.
    unsafe {
        drive(
            &Bf16Gemm { o, dp },
            n,
            (w, rows, row),
            (a, n_tok, stride),
            out,
        )
    }
}

// The table's rows: AVX2 on widened lanes; AVX-512 with `vdpbf16ps` where it has it.

/// One row in the build's order (`TILED`: tinyBLAS's), with `vdpbf16ps` on the AVX-512
/// rows (`AVX512`) where the CPU has it.
pub(super) fn single<const TILED: bool, const AVX512: bool>(w: &[u8], a: &[u8]) -> f32 {
    dot(bf16_order(), TILED, AVX512 && has_dp(), w, a)
}

/// The tile of [`single`]'s order.
pub(super) fn many<const TILED: bool, const AVX512: bool>(
    w: &[u8],
    rows: usize,
    a: &[u8],
    stride: usize,
    _side: ActSide<'_>,
    out: &mut [f32],
) {
    tile(TILED, AVX512 && has_dp(), w, rows, a, stride, out)
}
