//! Unquantized rows: F32, F16 and BF16 (block size 1).
//!
//! Dot products take f32 activations (our `vec_dot_type` for all float weights). F32
//! weights (MoE routers, which llama.cpp never quantizes) follow llama.cpp's x86 orders:
//! `ggml_vec_dot_f32` for one token ([`vec_dot_f32`]) and llamafile's tinyBLAS for two or
//! more ([`vec_dot_f32_tiled`]), in the flavor of the ggml build (`crate::order::flavor`);
//! `arch/x86/float.rs` has their AVX2 and AVX-512 kernels (same bits).
//! F16 weights take f16 activations, as llama.cpp's (its `vec_dot_type`), in its two x86
//! orders: `ggml_vec_dot_f16` for one token ([`vec_dot_f16`]) and tinyBLAS for two or more
//! ([`vec_dot_f16_tiled`]), the orders of attention's f16 products. BF16 weights take bf16
//! activations likewise, in `ggml_vec_dot_bf16`'s order ([`vec_dot_bf16`]) and tinyBLAS's
//! ([`vec_dot_bf16_tiled`]), each in the build's form ([`Bf16Order`]: `vdpbf16ps` on
//! AVX512_BF16 CPUs, widened f32 lanes on others); `arch/x86/bf16.rs` has their kernels.

use crate::f16::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::order::{hsum, reduce4, Bf16Order, F16Order, Flavor};

fn check(bytes: usize, elems: usize, width: usize, what: &str) {
    assert_eq!(
        bytes,
        elems * width,
        "{what}: {elems} elements do not match {bytes} bytes"
    );
}

#[inline(always)]
fn rd_f32(c: &[u8]) -> f32 {
    f32::from_le_bytes([c[0], c[1], c[2], c[3]])
}

/// Copies little-endian f32 bytes into `dst`.
pub fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    check(src.len(), dst.len(), 4, "F32");
    for (c, y) in src.chunks_exact(4).zip(dst.iter_mut()) {
        *y = rd_f32(c);
    }
}

/// Widens f16 bits to f32 (exact).
pub fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    check(src.len(), dst.len(), 2, "F16");
    for (c, y) in src.chunks_exact(2).zip(dst.iter_mut()) {
        *y = f16_to_f32(u16::from_le_bytes([c[0], c[1]]));
    }
}

/// Widens bf16 bits to f32 (exact).
pub fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    check(src.len(), dst.len(), 2, "BF16");
    for (c, y) in src.chunks_exact(2).zip(dst.iter_mut()) {
        *y = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
    }
}

/// Writes f32 values as little-endian bytes.
pub fn quantize_f32(src: &[f32], dst: &mut [u8]) {
    check(dst.len(), src.len(), 4, "F32");
    for (x, c) in src.iter().zip(dst.chunks_exact_mut(4)) {
        c.copy_from_slice(&x.to_le_bytes());
    }
}

/// Narrows to f16 with round-to-nearest-even.
pub fn quantize_f16(src: &[f32], dst: &mut [u8]) {
    check(dst.len(), src.len(), 2, "F16");
    for (x, c) in src.iter().zip(dst.chunks_exact_mut(2)) {
        c.copy_from_slice(&f32_to_f16(*x).to_le_bytes());
    }
}

/// Narrows to bf16 with round-to-nearest-even (ggml's `GGML_FP32_TO_BF16`).
pub fn quantize_bf16(src: &[f32], dst: &mut [u8]) {
    check(dst.len(), src.len(), 2, "BF16");
    for (x, c) in src.iter().zip(dst.chunks_exact_mut(2)) {
        c.copy_from_slice(&f32_to_bf16(*x).to_le_bytes());
    }
}

/// Dot of an f32 weight row with f32 activations (both as little-endian bytes) in
/// `ggml_vec_dot_f32`'s order: four accumulator registers of the flavor's lanes, each
/// element's product fused into its lane, steps of four registers; the registers folded
/// and reduced as `GGML_F32_VEC_REDUCE`; the elements past the last whole step added to
/// that float one at a time, as the compiled tail loop does.
pub fn vec_dot_f32(w: &[u8], a: &[u8]) -> f32 {
    vec_dot_f32_in(crate::order::flavor(), w, a)
}

/// [`vec_dot_f32`] in the given flavor (the scalar twin).
pub fn vec_dot_f32_in(fl: Flavor, w: &[u8], a: &[u8]) -> f32 {
    assert_eq!(w.len(), a.len(), "vec_dot F32: length mismatch");
    let n = w.len() / 4;
    let lanes = fl.lanes();
    let step = 4 * lanes;
    let np = n - n % step;
    let mut acc = [[0f32; 16]; 4];
    for i in (0..np).step_by(step) {
        for (j, acc) in acc.iter_mut().enumerate() {
            for (l, v) in acc.iter_mut().enumerate().take(lanes) {
                let e = i + j * lanes + l;
                *v = rd_f32(&w[4 * e..]).mul_add(rd_f32(&a[4 * e..]), *v);
            }
        }
    }
    vec_dot_f32_finish(fl, &mut acc, w, a)
}

/// The end of [`vec_dot_f32_in`] after its whole steps (shared with the SIMD kernels,
/// which fill `acc` alike): the registers reduced as `GGML_F32_VEC_REDUCE`, then the
/// elements past the last whole step.
pub(crate) fn vec_dot_f32_finish(fl: Flavor, acc: &mut [[f32; 16]; 4], w: &[u8], a: &[u8]) -> f32 {
    let n = w.len() / 4;
    let np = n - n % (4 * fl.lanes());
    let (wf, af) = (
        |i: usize| rd_f32(&w[4 * i..]),
        |i: usize| rd_f32(&a[4 * i..]),
    );
    let mut sum = reduce4(fl, acc);
    // The tail loop `sumf += x[i]*y[i]` as GCC 12 vectorises it in ggml's build: the
    // products of whole groups of eight, then (AVX2 build) of four, rounded and added in
    // order; the rest fused (read from the object code of the linked llama.cpp for AVX2;
    // for AVX-512, where the tail is up to 63 long and has no group of four, probed
    // against the linked ggml for every tail length).
    let tail = n - np;
    let unfused = match fl {
        Flavor::Avx512 => tail / 8 * 8,
        _ => tail / 8 * 8 + if tail % 8 >= 4 { 4 } else { 0 },
    };
    for i in np..np + unfused {
        sum += wf(i) * af(i);
    }
    for i in np + unfused..n {
        sum = wf(i).mul_add(af(i), sum);
    }
    sum
}

/// Dot of an f32 weight row with f32 activations in tinyBLAS's order (llamafile's GEMM,
/// which llama.cpp runs for a micro-batch of two or more tokens): one register of the
/// flavor's lanes, each element's product fused into its lane, then the register halved
/// down to one float. tinyBLAS takes only rows of whole registers; llama.cpp multiplies
/// other widths with `ggml_vec_dot_f32`, so does this.
pub fn vec_dot_f32_tiled(w: &[u8], a: &[u8]) -> f32 {
    vec_dot_f32_tiled_in(crate::order::flavor(), w, a)
}

/// [`vec_dot_f32_tiled`] in the given flavor (the scalar twin).
pub fn vec_dot_f32_tiled_in(fl: Flavor, w: &[u8], a: &[u8]) -> f32 {
    assert_eq!(w.len(), a.len(), "vec_dot F32: length mismatch");
    let n = w.len() / 4;
    let lanes = fl.lanes();
    if !n.is_multiple_of(lanes) {
        return vec_dot_f32_in(fl, w, a);
    }
    let mut acc = [0f32; 16];
    for i in (0..n).step_by(lanes) {
        for (l, v) in acc.iter_mut().enumerate().take(lanes) {
            let e = i + l;
            *v = rd_f32(&w[4 * e..]).mul_add(rd_f32(&a[4 * e..]), *v);
        }
    }
    hsum(fl, &mut acc)
}

/// The SIMD kernels of [`vec_dot_f32_in`] (`tiled`: of [`vec_dot_f32_tiled_in`]) in
/// flavor `fl`, bit-identical to them; `None` where this CPU has no vectors of the
/// flavor's width. (For tests: the kernel table's F32 rows run them in the build's flavor.)
pub fn vec_dot_f32_simd(fl: Flavor, tiled: bool, w: &[u8], a: &[u8]) -> Option<f32> {
    #[cfg(target_arch = "x86_64")]
    {
        crate::arch::x86_float_dot(fl, tiled, crate::isa::Isa::Avx512.available(), w, a)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (fl, tiled, w, a);
        None
    }
}

/// Dot of an f16 weight row with f16 activations (both little-endian f16 bytes; ggml's
/// `vec_dot_type` for F16 is F16: llama.cpp rounds the activations to f16 first) in
/// `ggml_vec_dot_f16`'s order, which llama.cpp runs for one token: four accumulator
/// registers of the flavor's lanes over steps of four registers, folded and reduced as
/// `GGML_F16_VEC_REDUCE`, the elements past the last whole step added in f64. The products
/// of two f16 values are exact in f32. (The order of attention's f16 products,
/// `ops::f16`, with both operands stored as f16.)
pub fn vec_dot_f16(w: &[u8], a: &[u8]) -> f32 {
    vec_dot_f16_in(crate::order::flavor(), F16Order::VecDot, w, a)
}

/// Dot of an f16 weight row with f16 activations in tinyBLAS's order (llama.cpp converts
/// the activations of a micro-batch of two or more tokens to f16 and multiplies them
/// with llamafile's GEMM): one register of the flavor's lanes, each product added into
/// its lane, halved down to one float. tinyBLAS takes only rows of whole registers;
/// llama.cpp multiplies other widths with `ggml_vec_dot_f16`, so does this.
pub fn vec_dot_f16_tiled(w: &[u8], a: &[u8]) -> f32 {
    let fl = crate::order::flavor();
    let ord = if (w.len() / 2).is_multiple_of(fl.lanes()) {
        F16Order::Gemm
    } else {
        F16Order::VecDot
    };
    vec_dot_f16_in(fl, ord, w, a)
}

/// [`vec_dot_f16`] / [`vec_dot_f16_tiled`] in a given flavor and order (the scalar twin).
pub fn vec_dot_f16_in(fl: Flavor, ord: F16Order, w: &[u8], a: &[u8]) -> f32 {
    assert_eq!(w.len(), a.len(), "vec_dot F16: length mismatch");
    let h = |b: &[u8], i: usize| f16_to_f32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]));
    crate::ops::f16::dot_f16_by(fl, ord, w.len() / 2, |i| h(w, i), |i| h(a, i))
}

/// Dot of a bf16 weight row with bf16 activations (both little-endian bf16 bytes: ggml's
/// `vec_dot_type` for BF16 is BF16, llama.cpp rounds the activations to bf16 first) in
/// `ggml_vec_dot_bf16`'s order for the build ([`crate::order::bf16_order`]), which
/// llama.cpp runs for one token.
pub fn vec_dot_bf16(w: &[u8], a: &[u8]) -> f32 {
    vec_dot_bf16_in(crate::order::bf16_order(), false, w, a)
}

/// Dot of a bf16 weight row with bf16 activations in tinyBLAS's order (llama.cpp's GEMM
/// for a micro-batch of two or more tokens): one register over the whole row, then
/// halved down to one float. tinyBLAS takes rows of whole steps only
/// ([`Bf16Order::gemm_step`]); others take `vec_dot`'s order, as in llama.cpp. (Also the
/// fast order: one order for every token, and the fastest to run.)
pub fn vec_dot_bf16_tiled(w: &[u8], a: &[u8]) -> f32 {
    vec_dot_bf16_in(crate::order::bf16_order(), true, w, a)
}

/// Element `i` of little-endian bf16 bytes, widened (exact).
#[inline(always)]
pub(crate) fn rd_bf16(b: &[u8], i: usize) -> f32 {
    bf16_to_f32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]))
}

/// [`vec_dot_bf16`] (`tiled`: [`vec_dot_bf16_tiled`]) in a given order (the scalar twin).
/// The product of two bf16 values is exact in f32, so a fused and an unfused
/// multiply-add round alike; what the three orders differ in is which products share a
/// lane and in what sequence they are added. (`vdpbf16ps` also treats subnormal bf16
/// inputs and results as zero; this twin keeps them. No trained weight is that small.)
pub fn vec_dot_bf16_in(o: Bf16Order, tiled: bool, w: &[u8], a: &[u8]) -> f32 {
    assert_eq!(w.len(), a.len(), "vec_dot BF16: length mismatch");
    let n = w.len() / 2;
    let p = |i: usize| rd_bf16(w, i) * rd_bf16(a, i);
    let mut acc = [[0f32; 16]; 4];
    if tiled && n.is_multiple_of(o.gemm_step()) {
        bf16_steps(o, &mut acc[0], 0, n, p);
        return hsum(o.flavor(), &mut acc[0]);
    }
    let done = bf16_vec_dot_steps(o, &mut acc, n, p);
    bf16_vec_dot_finish(o, &mut acc, done, n, p)
}

/// The SIMD kernels of [`vec_dot_bf16_in`] in order `o`, bit-identical to it: on widened
/// f32 lanes (x86 AVX2, NEON), or (`dp`) with `vdpbf16ps` itself (x86, `Bf16Order::Dpbf16`
/// only). `None` where this CPU lacks what they need. (For tests: the kernel table's BF16 rows run them in
/// the build's order.)
pub fn vec_dot_bf16_simd(o: Bf16Order, tiled: bool, dp: bool, w: &[u8], a: &[u8]) -> Option<f32> {
    #[cfg(target_arch = "x86_64")]
    {
        let dp_ok = !dp || (o == Bf16Order::Dpbf16 && std::is_x86_feature_detected!("avx512bf16"));
        (crate::isa::Isa::Avx2.available() && dp_ok)
            .then(|| crate::arch::x86_bf16_dot(o, tiled, dp, w, a))
    }
    #[cfg(target_arch = "aarch64")]
    {
        (!dp).then(|| crate::arch::aarch64::bf16::dot(o, tiled, w, a))
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = (o, tiled, dp, w, a);
        None
    }
}

/// tinyBLAS's steps over elements `i0..i1` (whole steps) into one register of the
/// order's lanes.
#[inline(always)]
fn bf16_steps(o: Bf16Order, acc: &mut [f32; 16], i0: usize, i1: usize, p: impl Fn(usize) -> f32) {
    let step = o.gemm_step();
    for i in (i0..i1).step_by(step) {
        match o {
            // Lane j holds the pair (2j, 2j + 1): the odd product first.
            Bf16Order::Dpbf16 => {
                for (j, v) in acc.iter_mut().enumerate() {
                    *v = (*v + p(i + 2 * j + 1)) + p(i + 2 * j);
                }
            }
            Bf16Order::Avx512 | Bf16Order::Avx2 => {
                for (j, v) in acc.iter_mut().enumerate().take(step) {
                    *v += p(i + j);
                }
            }
        }
    }
}

/// `ggml_vec_dot_bf16`'s vector loop: two registers of 32 pairs (`Dpbf16`, 64 elements a
/// step), two of 16 lanes (`Avx512`) or four of 8 (`Avx2`, 32 elements a step). Returns
/// how many elements it covered.
#[inline(always)]
fn bf16_vec_dot_steps(
    o: Bf16Order,
    acc: &mut [[f32; 16]; 4],
    n: usize,
    p: impl Fn(usize) -> f32 + Copy,
) -> usize {
    let (regs, width) = match o {
        Bf16Order::Dpbf16 => (2, 32),
        Bf16Order::Avx512 => (2, 16),
        Bf16Order::Avx2 => (4, 8),
    };
    let step = regs * width;
    let np = n - n % step;
    for i in (0..np).step_by(step) {
        for (r, acc) in acc.iter_mut().enumerate().take(regs) {
            bf16_steps(o, acc, i + r * width, i + (r + 1) * width, p);
        }
    }
    np
}

/// The end of `ggml_vec_dot_bf16` after its vector loop (shared with the SIMD kernels,
/// which fill `acc` alike): the registers reduced into an f64 sum (AVX-512: each by
/// `_mm512_reduce_add_ps`; AVX2: folded (0+2)+(1+3), then `hsum_float_8`'s order), the
/// products of elements `done..n` added to it, rounded to f32 once.
pub(crate) fn bf16_vec_dot_finish(
    o: Bf16Order,
    acc: &mut [[f32; 16]; 4],
    done: usize,
    n: usize,
    p: impl Fn(usize) -> f32,
) -> f32 {
    let mut sum = 0f64;
    match o {
        Bf16Order::Dpbf16 | Bf16Order::Avx512 => {
            let [c1, c2, ..] = acc;
            sum += hsum(Flavor::Avx512, c1) as f64;
            sum += hsum(Flavor::Avx512, c2) as f64;
        }
        Bf16Order::Avx2 => {
            let c: [f32; 8] =
                std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
            sum += crate::order::hsum_lanes(&c) as f64;
        }
    }
    for i in done..n {
        sum += p(i) as f64;
    }
    sum as f32
}
