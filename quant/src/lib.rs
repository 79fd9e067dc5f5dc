//! ggml/GGUF block formats.
//!
//! One module per block format holds its `#[repr(C)]` layout (with a compile-time size
//! assert), the scalar reference dequantizer and, where ggml defines one, the scalar
//! reference quantizer and dot product. These scalar functions reproduce ggml's C code
//! operation for operation (bit-exact for (de)quantization) and are the ground truth every
//! SIMD kernel is tested against. Dot products follow ggml's x86 AVX2 summation order for
//! the formats our models use (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q6_K: the order llama.cpp
//! runs on these machines, and a vectorisable one); ggml's generic C order is kept beside
//! them (`*_ref`, [`ggml_generic_vec_dot_fn`]) and proven bit-exact against ggml.
//!
//! [`arch`] holds the SIMD dot-product kernels (AVX2/FMA/F16C on x86-64), picked at run
//! time and bit-identical to the scalar twins; [`attn`] the f32×f16 helpers for attention.
//! [`simd_level`] reports which one runs; `RLLAMA_FORCE_SCALAR=1` forces the scalar code.
//!
//! The checked, type-dispatched entry points are [`dequantize_row`], [`quantize_row`],
//! [`vec_dot`] and [`vec_dot_type`]; the per-format functions (`q4_k::dequantize`,
//! `q4_k::vec_dot_q8k`, ...) panic on inconsistent lengths instead of returning errors.

// Index loops deliberately mirror ggml's C so each line can be audited against it.
#![allow(clippy::needless_range_loop)]

pub mod arch;
pub mod attn;
pub mod common;
pub mod f16;
pub mod float;
pub mod ggml_math;
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
mod search;
pub mod types;

pub use arch::SimdLevel;
pub use common::{Block, QK_K};
pub use search::get_scale_min_k4;
pub use types::GgmlType;

/// Errors from the checked entry points.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// The type has no implementation of the requested operation here.
    #[error("{op} is not supported for ggml type {ty}")]
    Unsupported { ty: GgmlType, op: &'static str },
    /// The element count is not a whole number of blocks.
    #[error("{n} elements is not a multiple of the {ty} block size {block}")]
    NotBlockMultiple {
        ty: GgmlType,
        n: usize,
        block: usize,
    },
    /// A buffer has the wrong size for the element count.
    #[error("{what} for {ty}: expected {expected} bytes, got {actual}")]
    SizeMismatch {
        ty: GgmlType,
        what: &'static str,
        expected: usize,
        actual: usize,
    },
}

type DequantFn = fn(&[u8], &mut [f32]);
type QuantFn = fn(&[f32], &mut [u8]);
/// A dot-product kernel: weight row bytes, activation row bytes (in the weight type's
/// [`vec_dot_type`]) to f32. Panics when the two rows hold different element counts.
pub type DotFn = fn(&[u8], &[u8]) -> f32;

/// What this crate implements for one type.
struct Kernels {
    dequantize: DequantFn,
    quantize: QuantFn,
    /// Dot of a row of this type with a row of `vec_dot_type` (activation-only formats
    /// Q8_1/Q8_K have none).
    vec_dot: Option<DotFn>,
    vec_dot_type: GgmlType,
}

/// The dispatch table: the one place mapping a `GgmlType` to its kernels.
#[rustfmt::skip]
fn kernels(ty: GgmlType) -> Option<Kernels> {
    use GgmlType as T;
    let k = |dequantize, quantize, vec_dot, vec_dot_type| Kernels { dequantize, quantize, vec_dot, vec_dot_type };
    Some(match ty {
        T::F32  => k(float::dequantize_f32,  float::quantize_f32,  Some(float::vec_dot_f32 as DotFn),  T::F32),
        T::F16  => k(float::dequantize_f16,  float::quantize_f16,  Some(float::vec_dot_f16 as DotFn),  T::F32),
        T::BF16 => k(float::dequantize_bf16, float::quantize_bf16, Some(float::vec_dot_bf16 as DotFn), T::F32),
        T::Q4_0 => k(q4_0::dequantize, q4_0::quantize, Some(q4_0::vec_dot_q8_0 as DotFn), T::Q8_0),
        T::Q4_1 => k(q4_1::dequantize, q4_1::quantize, Some(q4_1::vec_dot_q8_1 as DotFn), T::Q8_1),
        T::Q5_0 => k(q5_0::dequantize, q5_0::quantize, Some(q5_0::vec_dot_q8_0 as DotFn), T::Q8_0),
        T::Q5_1 => k(q5_1::dequantize, q5_1::quantize, Some(q5_1::vec_dot_q8_1 as DotFn), T::Q8_1),
        T::Q8_0 => k(q8_0::dequantize, q8_0::quantize, Some(q8_0::vec_dot_q8_0 as DotFn), T::Q8_0),
        T::Q8_1 => k(q8_1::dequantize, q8_1::quantize, None,                              T::Q8_1),
        T::Q2_K => k(q2_k::dequantize, q2_k::quantize, Some(q2_k::vec_dot_q8k as DotFn),  T::Q8_K),
        T::Q3_K => k(q3_k::dequantize, q3_k::quantize, Some(q3_k::vec_dot_q8k as DotFn),  T::Q8_K),
        T::Q4_K => k(q4_k::dequantize, q4_k::quantize, Some(q4_k::vec_dot_q8k as DotFn),  T::Q8_K),
        T::Q5_K => k(q5_k::dequantize, q5_k::quantize, Some(q5_k::vec_dot_q8k as DotFn),  T::Q8_K),
        T::Q6_K => k(q6_k::dequantize, q6_k::quantize, Some(q6_k::vec_dot_q8k as DotFn),  T::Q8_K),
        T::Q8_K => k(q8_k::dequantize, q8_k::quantize, None,                              T::Q8_K),
        _ => return None,
    })
}

/// True when [`dequantize_row`] and [`quantize_row`] accept `ty`.
pub fn is_supported(ty: GgmlType) -> bool {
    kernels(ty).is_some()
}

/// True when [`vec_dot`] accepts `ty` as the weight type.
pub fn has_vec_dot(ty: GgmlType) -> bool {
    kernels(ty).is_some_and(|k| k.vec_dot.is_some())
}

fn blocks_of(ty: GgmlType, n: usize) -> Result<usize, QuantError> {
    let block = ty.block_size();
    if !n.is_multiple_of(block) {
        return Err(QuantError::NotBlockMultiple { ty, n, block });
    }
    Ok(n / block * ty.type_size())
}

fn expect_len(
    ty: GgmlType,
    what: &'static str,
    expected: usize,
    actual: usize,
) -> Result<(), QuantError> {
    if expected != actual {
        return Err(QuantError::SizeMismatch {
            ty,
            what,
            expected,
            actual,
        });
    }
    Ok(())
}

/// `dst` must hold exactly `src` quantized to `ty`.
fn expect_quantized_len(ty: GgmlType, src: &[f32], dst: &[u8]) -> Result<(), QuantError> {
    expect_len(
        ty,
        "quantized destination",
        blocks_of(ty, src.len())?,
        dst.len(),
    )
}

/// Dequantizes `dst.len()` elements of type `ty` from `src`, which must be exactly
/// `ty.row_bytes(dst.len())` bytes.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let k = kernels(ty).ok_or(QuantError::Unsupported {
        ty,
        op: "dequantize",
    })?;
    expect_len(ty, "quantized source", blocks_of(ty, dst.len())?, src.len())?;
    (k.dequantize)(src, dst);
    Ok(())
}

/// Quantizes `src` into `dst` (exactly `ty.row_bytes(src.len())` bytes) with ggml's
/// reference algorithm for `ty` (no importance matrix).
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let k = kernels(ty).ok_or(QuantError::Unsupported { ty, op: "quantize" })?;
    expect_quantized_len(ty, src, dst)?;
    (k.quantize)(src, dst);
    Ok(())
}

/// Quantizes activations for [`vec_dot`] the way llama.cpp's x86 CPU backend does: Q8_0
/// and Q8_1 with its SIMD rounding (`127/amax`, ties to even), everything else with the
/// reference quantizer. Weights should use [`quantize_row`].
pub fn quantize_activations(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    match ty {
        GgmlType::Q8_0 | GgmlType::Q8_1 => {
            expect_quantized_len(ty, src, dst)?;
            if ty == GgmlType::Q8_0 {
                q8_0::quantize_activations(src, dst);
            } else {
                q8_1::quantize_activations(src, dst);
            }
            Ok(())
        }
        _ => quantize_row(ty, src, dst),
    }
}

/// The format activations must be quantized to before [`vec_dot`] with weights of `ty`:
/// Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for K-quants, F32 for float types.
/// For types without kernels here this is ggml's CPU mapping (informational only).
pub fn vec_dot_type(ty: GgmlType) -> GgmlType {
    use GgmlType as T;
    match kernels(ty) {
        Some(k) => k.vec_dot_type,
        None => match ty {
            T::IQ4_NL | T::MXFP4 => T::Q8_0,
            T::IQ2_XXS
            | T::IQ2_XS
            | T::IQ3_XXS
            | T::IQ1_S
            | T::IQ3_S
            | T::IQ2_S
            | T::IQ4_XS
            | T::IQ1_M
            | T::TQ1_0
            | T::TQ2_0 => T::Q8_K,
            other => other,
        },
    }
}

/// Dot product of one weight row `w` (`n` elements of type `ty`) with activations `a`
/// (`n` elements already quantized to [`vec_dot_type`]`(ty)`; little-endian f32 bytes for
/// float weights), computed like ggml's generic `ggml_vec_dot_*` kernels. Uses the SIMD
/// kernel for `ty` when the CPU has one (see [`simd_level`]); the result is the same bits.
pub fn vec_dot(ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
    let k = kernels(ty).ok_or(QuantError::Unsupported { ty, op: "vec_dot" })?;
    let dot = k
        .vec_dot
        .ok_or(QuantError::Unsupported { ty, op: "vec_dot" })?;
    expect_len(ty, "weight row", blocks_of(ty, n)?, w.len())?;
    let aty = k.vec_dot_type;
    expect_len(aty, "activation row", blocks_of(aty, n)?, a.len())?;
    let dot = arch::active_vec_dot(ty).unwrap_or(dot);
    Ok(dot(w, a))
}

/// The kernel [`vec_dot`] uses for weights of type `ty` (SIMD at the [`simd_level`] when
/// there is one, else the scalar reference), for callers that hoist the dispatch out of a
/// loop. It skips `vec_dot`'s error checks: rows of different element counts panic.
pub fn vec_dot_fn(ty: GgmlType) -> Option<DotFn> {
    let scalar = kernels(ty)?.vec_dot?;
    Some(arch::active_vec_dot(ty).unwrap_or(scalar))
}

/// The scalar reference kernel for weights of type `ty` (what [`vec_dot`] computes, bit
/// for bit, whatever kernel it picks).
pub fn scalar_vec_dot_fn(ty: GgmlType) -> Option<DotFn> {
    kernels(ty)?.vec_dot
}

/// ggml's *generic* C dot product for `ty`, operation for operation. For the K-quants and
/// float types this is [`scalar_vec_dot_fn`]; for the 32-element formats (Q4_0, Q4_1,
/// Q5_0, Q5_1, Q8_0), Q4_K and Q6_K [`vec_dot`] instead follows ggml's x86 SIMD summation order (eight
/// fused-multiply-add lanes), which differs from the generic C code in the last bits.
/// Kept to prove the integer parts against ggml's reference outputs.
pub fn ggml_generic_vec_dot_fn(ty: GgmlType) -> Option<DotFn> {
    use GgmlType as T;
    Some(match ty {
        T::Q4_0 => q4_0::vec_dot_q8_0_ref,
        T::Q4_1 => q4_1::vec_dot_q8_1_ref,
        T::Q5_0 => q5_0::vec_dot_q8_0_ref,
        T::Q5_1 => q5_1::vec_dot_q8_1_ref,
        T::Q8_0 => q8_0::vec_dot_q8_0_ref,
        T::Q4_K => q4_k::vec_dot_q8k_ref,
        T::Q6_K => q6_k::vec_dot_q8k_ref,
        _ => return scalar_vec_dot_fn(ty),
    })
}

/// Most activation rows one [`DotManyFn`] call takes.
pub const DOT_MANY_MAX: usize = 8;
/// Most weight rows one [`DotManyFn`] call takes.
pub const DOT_MANY_ROWS: usize = 2;

/// `w_rows` (1..=[`DOT_MANY_ROWS`]) consecutive weight rows (`w` holds them back to back)
/// against `n` (1..=[`DOT_MANY_MAX`]) activation rows that start `a_stride` bytes apart in
/// `a`: `out[r * n + c] = dot(w row r, a[c * a_stride..])`, `out.len() = w_rows * n`. Each
/// weight block is unpacked once and reused for every activation row, each activation
/// block loaded once for both weight rows (the prompt-processing tile), and each output is
/// bit-identical to [`vec_dot`] on that pair alone, so results never depend on how rows
/// were batched. Activation bytes must come from [`quantize_activations`] (quants in
/// `-127..=127`). Panics on inconsistent lengths.
///
/// `side` optionally carries per-block data precomputed once per activation row (see
/// [`ActSide`]); the results are the same bits with or without it.
pub type DotManyFn =
    fn(w: &[u8], w_rows: usize, a: &[u8], a_stride: usize, side: ActSide<'_>, out: &mut [f32]);

/// Per-block data of the activation rows of a [`DotManyFn`] call, computed once per
/// matrix product instead of once per weight row. Each field is either empty or covers
/// every row of the call, rows back to back.
#[derive(Clone, Copy, Debug, Default)]
pub struct ActSide<'a> {
    /// Q8_0/Q8_1 block scales widened to f32 ([`activation_scales`]).
    pub scales: &'a [f32],
    /// For Q4_0/Q5_0/Q8_0 weights: `-offset` times each block's eight lane sums
    /// ([`activation_offset_sums`]), which lets the VNNI kernels use unsigned weights.
    pub sums: &'a [i32],
}

/// The weight quant offset of the signed 32-element formats (Q4_0: 8, Q5_0: 16, Q8_0
/// as unsigned bytes: 128), 0 for other types.
pub(crate) fn signed_offset(wty: GgmlType) -> i32 {
    match wty {
        GgmlType::Q4_0 => 8,
        GgmlType::Q5_0 => 16,
        GgmlType::Q8_0 => 128,
        _ => 0,
    }
}

/// Whether the active tile kernel for `wty` uses [`ActSide::sums`] (so a caller computes
/// them only when they help).
pub fn tile_uses_offset_sums(wty: GgmlType) -> bool {
    signed_offset(wty) != 0 && arch::active() == SimdLevel::Avx2 && arch::vnni()
}

/// Appends, for each Q8_0 block of the activation row `a`, `-offset(wty) * Σ y[4l..4l+4]`
/// for its eight lanes `l` (see [`ActSide::sums`]); nothing for other weight types.
pub fn activation_offset_sums(wty: GgmlType, a: &[u8], out: &mut Vec<i32>) {
    let off = signed_offset(wty);
    if off == 0 {
        return;
    }
    for b in a.chunks_exact(GgmlType::Q8_0.type_size()) {
        for l in 0..8 {
            let s: i32 = b[2 + 4 * l..6 + 4 * l]
                .iter()
                .map(|&q| q as i8 as i32)
                .sum();
            out.push(-off * s);
        }
    }
}

/// Which of llama.cpp's x86 kernels a dot product reproduces. For most formats every
/// kernel llama.cpp runs sums in the same order, but for Q4_K and Q6_K it picks between
/// kernels that round differently depending on the number of tokens it multiplies at
/// once (its micro-batch) and, for Q4_K, on a token's place in it ([`dot_order_for`]).
/// Results are exact either way; following the same kernel gives llama.cpp's bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DotOrder {
    /// The one-row kernels: `ggml_vec_dot_*` (Q6_K) and the repacked `gemv_q4_K_8x8`.
    #[default]
    Single,
    /// The tiled K-quant GEMM (`ggml-cpu/tiled`), for micro-batches of 8+ tokens: one
    /// float accumulator, one FMA per super-block ([`q6_k::vec_dot_q8k_tiled`],
    /// [`q4_k::vec_dot_q8k_tiled`]).
    Tiled,
    /// The repacked `gemm_q4_K_8x8` for tokens in full groups of four: scales applied per
    /// 64 elements ([`q4_k::vec_dot_q8k_gemm4`]), activations quantized with
    /// [`q8_k::quantize_4x8`].
    Gemm4,
}

impl DotOrder {
    /// The order actually distinct for weights of `ty` (orders without a kernel of
    /// their own for `ty` sum like [`DotOrder::Single`]).
    pub fn effective(self, ty: GgmlType) -> DotOrder {
        match (ty, self) {
            (GgmlType::Q4_K, o) => o,
            (GgmlType::Q6_K, DotOrder::Tiled) => DotOrder::Tiled,
            _ => DotOrder::Single,
        }
    }
}

/// The kernel llama.cpp's x86 CPU backend (default build, AVX2 or AVX-512) runs for a
/// token `i` of a micro-batch of `n` tokens multiplied by an `n_out`-row matrix of `ty`:
/// Q4_K matrices with `n_out % 8 == 0` are repacked and go through `gemm` for the tokens
/// `0..n - n % 4` and `gemv` for the rest; other Q4_K and Q6_K matrices go through the
/// tiled GEMM from 8 tokens up (`GGML_CPU_TILED_MM`, on by default). (Un-repacked Q4_K
/// below 8 tokens runs ggml's AVX2 `vec_dot`, not emulated: it gets the `gemv` order.)
pub fn dot_order_for(ty: GgmlType, n_out: usize, n: usize, i: usize) -> DotOrder {
    match ty {
        GgmlType::Q4_K if n_out.is_multiple_of(8) => {
            if i < n - n % 4 {
                DotOrder::Gemm4
            } else {
                DotOrder::Single
            }
        }
        GgmlType::Q4_K | GgmlType::Q6_K if n >= 8 => DotOrder::Tiled,
        _ => DotOrder::Single,
    }
}

/// [`quantize_activations`] for a row that will be dotted in `order` with weights whose
/// activation type is `ty`: [`DotOrder::Gemm4`] rows get the repacked GEMM's Q8_K
/// rounding ([`q8_k::quantize_4x8`]).
pub fn quantize_activations_ordered(
    ty: GgmlType,
    order: DotOrder,
    src: &[f32],
    dst: &mut [u8],
) -> Result<(), QuantError> {
    if ty == GgmlType::Q8_K && order == DotOrder::Gemm4 {
        expect_quantized_len(ty, src, dst)?;
        q8_k::quantize_4x8(src, dst);
        return Ok(());
    }
    quantize_activations(ty, src, dst)
}

/// The scalar kernel for weights of `ty` in `order` (see [`DotOrder`]).
pub fn scalar_vec_dot_ordered_fn(ty: GgmlType, order: DotOrder) -> Option<DotFn> {
    use GgmlType as T;
    Some(match (ty, order.effective(ty)) {
        (T::Q4_K, DotOrder::Gemm4) => q4_k::vec_dot_q8k_gemm4,
        (T::Q4_K, DotOrder::Tiled) => q4_k::vec_dot_q8k_tiled,
        (T::Q6_K, DotOrder::Tiled) => q6_k::vec_dot_q8k_tiled,
        _ => return scalar_vec_dot_fn(ty),
    })
}

/// [`vec_dot_fn`] in `order`: the SIMD kernel at the [`simd_level`] when there is one,
/// else [`scalar_vec_dot_ordered_fn`] (same bits).
pub fn vec_dot_ordered_fn(ty: GgmlType, order: DotOrder) -> Option<DotFn> {
    let scalar = scalar_vec_dot_ordered_fn(ty, order)?;
    Some(arch::active_vec_dot_ordered(ty, order).unwrap_or(scalar))
}

/// [`vec_dot_many_fn`] in `order`.
pub fn vec_dot_many_ordered_fn(ty: GgmlType, order: DotOrder) -> Option<DotManyFn> {
    arch::active_vec_dot_many_ordered(ty, order)
}

/// f32 scales per block that [`activation_scales`] writes for activation type `ty`:
/// 1 for Q8_0 (`d`), 2 for Q8_1 (`d`, `s`), 0 otherwise.
pub fn activation_scales_per_block(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q8_0 => 1,
        GgmlType::Q8_1 => 2,
        _ => 0,
    }
}

/// Appends the f16 block scales of one quantized activation row `a` (type `ty`) widened
/// to f32 (exact) to `out`, in the layout [`DotManyFn`] takes.
pub fn activation_scales(ty: GgmlType, a: &[u8], out: &mut Vec<f32>) {
    let per = activation_scales_per_block(ty);
    if per == 0 {
        return;
    }
    for b in a.chunks_exact(ty.type_size()) {
        for k in 0..per {
            out.push(f16::f16_to_f32(u16::from_le_bytes([
                b[2 * k],
                b[2 * k + 1],
            ])));
        }
    }
}

/// The multi-row kernel for weights of type `ty` at the [`simd_level`], if there is one
/// (None: call [`vec_dot_fn`]'s kernel per row, which gives the same bits).
pub fn vec_dot_many_fn(ty: GgmlType) -> Option<DotManyFn> {
    arch::active_vec_dot_many(ty)
}

/// The instruction set [`vec_dot`] and [`attn`] use: `"avx2"` or `"scalar"` (forced by
/// `RLLAMA_FORCE_SCALAR=1`, read once).
pub fn simd_level() -> &'static str {
    arch::active().name()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_match_type_table() {
        fn check<B: Block>() {
            assert_eq!(B::BLOCK_ELEMS, B::TYPE.block_size(), "{}", B::TYPE);
            assert_eq!(B::BYTES, B::TYPE.type_size(), "{}", B::TYPE);
            assert_eq!(B::BYTES, std::mem::size_of::<B>(), "{}", B::TYPE);
        }
        check::<q4_0::BlockQ4_0>();
        check::<q4_1::BlockQ4_1>();
        check::<q5_0::BlockQ5_0>();
        check::<q5_1::BlockQ5_1>();
        check::<q8_0::BlockQ8_0>();
        check::<q8_1::BlockQ8_1>();
        check::<q2_k::BlockQ2K>();
        check::<q3_k::BlockQ3K>();
        check::<q4_k::BlockQ4K>();
        check::<q5_k::BlockQ5K>();
        check::<q6_k::BlockQ6K>();
        check::<q8_k::BlockQ8K>();
    }

    #[test]
    fn dispatch_reports_errors() {
        let mut out = [0.0f32; 32];
        assert_eq!(
            dequantize_row(GgmlType::IQ2_XS, &[0; 74], &mut [0.0; 256]),
            Err(QuantError::Unsupported {
                ty: GgmlType::IQ2_XS,
                op: "dequantize"
            })
        );
        assert_eq!(
            dequantize_row(GgmlType::Q4_0, &[0; 18], &mut out[..31]),
            Err(QuantError::NotBlockMultiple {
                ty: GgmlType::Q4_0,
                n: 31,
                block: 32
            })
        );
        assert_eq!(
            dequantize_row(GgmlType::Q4_0, &[0; 17], &mut out),
            Err(QuantError::SizeMismatch {
                ty: GgmlType::Q4_0,
                what: "quantized source",
                expected: 18,
                actual: 17
            })
        );
        assert!(dequantize_row(GgmlType::Q4_0, &[0; 18], &mut out).is_ok());
        assert!(matches!(
            quantize_row(GgmlType::Q8_0, &out, &mut [0; 35]),
            Err(QuantError::SizeMismatch { .. })
        ));
        assert!(matches!(
            vec_dot(GgmlType::Q8_1, 32, &[0; 36], &[0; 36]),
            Err(QuantError::Unsupported { .. })
        ));
        assert!(matches!(
            vec_dot(GgmlType::Q4_K, 256, &[0; 144], &[0; 291]),
            Err(QuantError::SizeMismatch { .. })
        ));
        assert_eq!(vec_dot(GgmlType::Q4_K, 256, &[0; 144], &[0; 292]), Ok(0.0));
        let msg = QuantError::Unsupported {
            ty: GgmlType::IQ1_M,
            op: "vec_dot",
        }
        .to_string();
        assert!(msg.contains("IQ1_M"), "{msg}");
    }

    #[test]
    fn vec_dot_types_follow_ggml() {
        use GgmlType as T;
        for (w, a) in [
            (T::F32, T::F32),
            (T::F16, T::F32),
            (T::BF16, T::F32),
            (T::Q4_0, T::Q8_0),
            (T::Q5_0, T::Q8_0),
            (T::Q8_0, T::Q8_0),
            (T::Q4_1, T::Q8_1),
            (T::Q5_1, T::Q8_1),
            (T::Q2_K, T::Q8_K),
            (T::Q3_K, T::Q8_K),
            (T::Q4_K, T::Q8_K),
            (T::Q5_K, T::Q8_K),
            (T::Q6_K, T::Q8_K),
            (T::IQ4_NL, T::Q8_0),
        ] {
            assert_eq!(vec_dot_type(w), a, "{w}");
        }
    }
}
