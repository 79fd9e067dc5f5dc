//! SIMD kernels, one folder per architecture (`x86/`, `aarch64/`), each contributing rows
//! to the kernel table (`crate::kernels`). Every kernel has a scalar twin in
//! `crate::formats` or `crate::ops` and returns exactly its bits: integer sums are exact
//! (their order does not matter), and all float arithmetic is done in the twin's order
//! with the twin's operations (an FMA exactly where the twin uses `mul_add`, never where
//! it multiplies then adds). A model's output therefore does not depend on which kernel
//! ran, and the ISA (`crate::isa`) is purely a speed choice.

use crate::contract::KernelRow;

#[cfg(target_arch = "aarch64")]
pub(crate) mod aarch64;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

/// The x86 F32 dot kernels (`formats::float::vec_dot_f32_simd`).
#[cfg(target_arch = "x86_64")]
pub(crate) fn x86_float_dot(
    fl: crate::order::Flavor,
    tiled: bool,
    avx512: bool,
    w: &[u8],
    a: &[u8],
) -> Option<f32> {
    x86::float::dot(fl, tiled, avx512, w, a)
}

/// The x86 BF16 dot kernels (`formats::float::vec_dot_bf16_simd`).
#[cfg(target_arch = "x86_64")]
pub(crate) fn x86_bf16_dot(
    o: crate::order::Bf16Order,
    tiled: bool,
    dp: bool,
    w: &[u8],
    a: &[u8],
) -> f32 {
    x86::bf16::dot(o, tiled, dp, w, a)
}

/// This architecture's rows of the kernel table.
pub(crate) fn rows() -> &'static [KernelRow] {
    #[cfg(target_arch = "x86_64")]
    return x86::ROWS;
    #[cfg(target_arch = "aarch64")]
    return aarch64::ROWS;
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    return &[];
}
