//! The ggml block formats, one module per format: its `#[repr(C)]` layout (with a
//! compile-time size assert), the scalar reference dequantizer and, where ggml defines
//! one, the scalar reference quantizer and dot products.
//!
//! These scalar functions reproduce ggml's C code operation for operation (bit-exact for
//! (de)quantization) and are the ground truth every SIMD kernel under `crate::arch` is
//! tested against. Dot products come in the orders of `crate::order`: ggml's x86 AVX2
//! order for the formats our models use (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q6_K/MXFP4),
//! llama.cpp's batched and repacked orders beside them (`*_tiled`, `*_gemm4`,
//! `mxfp4::vec_dot_q8_0_repacked`), and ggml's generic C order (`*_ref`), proven
//! bit-exact against ggml on fixtures.
//!
//! The per-format functions panic on inconsistent lengths; the checked, type-dispatched
//! entry points are in the crate root.

pub mod common;
pub mod float;
pub mod iq4_nl;
pub mod iq4_xs;
pub(crate) mod legacy;
pub mod lut;
pub mod mxfp4;
pub mod packed;
pub mod q2_k;
pub mod q3_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;
pub mod q8_1;
pub mod q8_k;
pub(crate) mod search;
