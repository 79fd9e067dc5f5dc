//! What the kernel timers (`attn_decode`, `attn_prefill`, `packed_gemm`) share; each
//! uses part of it.
#![allow(dead_code)]

use quant::{Flavor, Isa};

/// The numeric command-line arguments, at least `required` of them (`usage` names them).
pub fn args(required: usize, usage: &str) -> Vec<usize> {
    let a: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| s.parse().unwrap_or_else(|_| panic!("usage: {usage}")))
        .collect();
    assert!(a.len() >= required, "usage: {usage}");
    a
}

/// The 16-lane flavor where AVX-512 is active (`RLLAMA_SIMD` lowers it), else the 8-lane one.
pub fn flavor() -> Flavor {
    if quant::isa::active().includes(Isa::Avx512) {
        Flavor::Avx512
    } else {
        Flavor::Avx2
    }
}

/// Values in [-1, 1) from a fixed xorshift sequence.
pub fn uniform() -> impl FnMut() -> f32 {
    let mut x = 12345u64;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % 2000) as f32 / 1000.0 - 1.0
    }
}
