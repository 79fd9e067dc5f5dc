//! Unquantized rows: F32, F16 and BF16 (block size 1).
//!
//! Dot products take f32 activations (our `vec_dot_type` for all float weights) and follow
//! ggml's scalar `ggml_vec_dot_f32/_f16/_bf16` shape: each product is formed in f32 and
//! accumulated in f64, then rounded to f32 once. (ggml itself converts activations to the
//! weight's type first for F16/BF16; keeping them f32 is strictly more accurate.)

use crate::f16::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

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

/// Dot of an f32 weight row with f32 activations (both as little-endian bytes).
pub fn vec_dot_f32(w: &[u8], a: &[u8]) -> f32 {
    assert_eq!(w.len(), a.len(), "vec_dot F32: length mismatch");
    let mut sum = 0.0f64;
    for (x, y) in w.chunks_exact(4).zip(a.chunks_exact(4)) {
        sum += (rd_f32(x) * rd_f32(y)) as f64;
    }
    sum as f32
}

/// Dot of an f16 weight row with f32 activations.
pub fn vec_dot_f16(w: &[u8], a: &[u8]) -> f32 {
    assert_eq!(w.len() * 2, a.len(), "vec_dot F16: length mismatch");
    let mut sum = 0.0f64;
    for (x, y) in w.chunks_exact(2).zip(a.chunks_exact(4)) {
        sum += (f16_to_f32(u16::from_le_bytes([x[0], x[1]])) * rd_f32(y)) as f64;
    }
    sum as f32
}

/// Dot of a bf16 weight row with f32 activations.
pub fn vec_dot_bf16(w: &[u8], a: &[u8]) -> f32 {
    assert_eq!(w.len() * 2, a.len(), "vec_dot BF16: length mismatch");
    let mut sum = 0.0f64;
    for (x, y) in w.chunks_exact(2).zip(a.chunks_exact(4)) {
        sum += (bf16_to_f32(u16::from_le_bytes([x[0], x[1]])) * rd_f32(y)) as f64;
    }
    sum as f32
}
