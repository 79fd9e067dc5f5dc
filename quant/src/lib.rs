//! ggml/GGUF block formats and the kernels that compute with them.
//!
//! - [`formats`]: one module per block format: its `#[repr(C)]` layout, the scalar
//!   reference (de)quantizer and dot products, bit-exact with ggml's C. They are the
//!   ground truth every SIMD kernel is tested against.
//! - [`order`]: the accumulation orders a dot product or an attention product can follow
//!   (llama.cpp's kernels, ggml's AVX2 or AVX-512 build) and their horizontal sums.
//! - [`isa`]: which instruction set this CPU has and which the kernels use
//!   (`RLLAMA_SIMD` / `RLLAMA_FORCE_SCALAR` lower it).
//! - [`kernels`]: the one table from (weight type, order, ISA) to a [`KernelSet`] for
//!   matrix products, filled by the scalar twins and by `arch/<cpu>/` SIMD kernels, each
//!   bit-identical to its twin.
//! - [`ops`]: the other numerics of a layer (norms, RoPE, soft-max, activations, the f16
//!   products of attention, attention itself), each with its scalar twin.
//! - [`contract`]: the kernel signatures and the checks that make SIMD bodies safe.
//!
//! The checked, type-dispatched entry points are [`dequantize_row`], [`quantize_row`],
//! [`quantize_activations`], [`vec_dot`] and [`vec_dot_type`]; the per-format functions
//! panic on inconsistent lengths instead of returning errors.

// Index loops deliberately mirror ggml's C so each line can be audited against it.
#![allow(clippy::needless_range_loop)]

mod arch;
pub mod contract;
pub mod f16;
pub mod formats;
pub mod isa;
pub mod kernels;
pub mod ops;
pub mod order;
pub mod types;

pub use contract::{
    ActSide, DotFn, TileFn, TileIntoFn, FAST_TILE_TOKENS, TILE_MAX_ROWS, TILE_MAX_TOKENS,
};
pub use formats::common::{Block, QK_K};
pub use formats::packed::{pack8, packs, PACK_ROWS};
pub use formats::search::get_scale_min_k4;
pub use isa::Isa;
pub use kernels::{KernelSet, SideBuf};
pub use order::{Bf16Order, DotOrder, F16Order, Flavor};
pub use types::GgmlType;

use formats::{
    float, iq4_nl, iq4_xs, mxfp4, q2_k, q3_k, q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0, q8_1,
    q8_k,
};

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

/// A format's row conversions and the activation type its dot products take.
struct FormatFns {
    dequantize: DequantFn,
    quantize: QuantFn,
    vec_dot_type: GgmlType,
}

/// The formats implemented here (dot products live in [`kernels`]).
#[rustfmt::skip]
fn format_fns(ty: GgmlType) -> Option<FormatFns> {
    use GgmlType as T;
    use formats::common::{dequantize_row_of as d, quantize_row_of as q};
    let k = |dequantize, quantize, vec_dot_type| FormatFns { dequantize, quantize, vec_dot_type };
    Some(match ty {
        T::F32  => k(float::dequantize_f32,  float::quantize_f32,  T::F32),
        T::F16  => k(float::dequantize_f16,  float::quantize_f16,  T::F16),
        T::BF16 => k(float::dequantize_bf16, float::quantize_bf16, T::BF16),
        T::Q4_0 => k(d::<q4_0::BlockQ4_0>, q::<q4_0::BlockQ4_0>, T::Q8_0),
        T::Q4_1 => k(d::<q4_1::BlockQ4_1>, q::<q4_1::BlockQ4_1>, T::Q8_1),
        T::Q5_0 => k(d::<q5_0::BlockQ5_0>, q::<q5_0::BlockQ5_0>, T::Q8_0),
        T::Q5_1 => k(d::<q5_1::BlockQ5_1>, q::<q5_1::BlockQ5_1>, T::Q8_1),
        T::Q8_0 => k(d::<q8_0::BlockQ8_0>, q::<q8_0::BlockQ8_0>, T::Q8_0),
        T::Q8_1 => k(d::<q8_1::BlockQ8_1>, q::<q8_1::BlockQ8_1>, T::Q8_1),
        T::Q2_K => k(d::<q2_k::BlockQ2K>, q::<q2_k::BlockQ2K>, T::Q8_K),
        T::Q3_K => k(d::<q3_k::BlockQ3K>, q::<q3_k::BlockQ3K>, T::Q8_K),
        T::Q4_K => k(d::<q4_k::BlockQ4K>, q::<q4_k::BlockQ4K>, T::Q8_K),
        T::Q5_K => k(d::<q5_k::BlockQ5K>, q::<q5_k::BlockQ5K>, T::Q8_K),
        T::Q6_K => k(d::<q6_k::BlockQ6K>, q::<q6_k::BlockQ6K>, T::Q8_K),
        T::Q8_K => k(d::<q8_k::BlockQ8K>, q::<q8_k::BlockQ8K>, T::Q8_K),
        T::MXFP4 => k(d::<mxfp4::BlockMxfp4>, q::<mxfp4::BlockMxfp4>, T::Q8_0),
        T::IQ4_NL => k(d::<iq4_nl::BlockIq4Nl>, q::<iq4_nl::BlockIq4Nl>, T::Q8_0),
        T::IQ4_XS => k(d::<iq4_xs::BlockIq4Xs>, q::<iq4_xs::BlockIq4Xs>, T::Q8_K),
        _ => return None,
    })
}

/// True when [`dequantize_row`] and [`quantize_row`] accept `ty`.
pub fn is_supported(ty: GgmlType) -> bool {
    format_fns(ty).is_some()
}

/// True when [`vec_dot`] (and the kernel table) accept `ty` as the weight type.
pub fn has_vec_dot(ty: GgmlType) -> bool {
    kernels::scalar(ty, DotOrder::Single).is_some()
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
pub(crate) fn expect_quantized_len(
    ty: GgmlType,
    src: &[f32],
    dst: &[u8],
) -> Result<(), QuantError> {
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
    let k = format_fns(ty).ok_or(QuantError::Unsupported {
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
    let k = format_fns(ty).ok_or(QuantError::Unsupported { ty, op: "quantize" })?;
    expect_quantized_len(ty, src, dst)?;
    (k.quantize)(src, dst);
    Ok(())
}

/// Quantizes activations for [`vec_dot`] the way llama.cpp's x86 CPU backend does: Q8_0
/// and Q8_1 with its SIMD rounding (`127/amax`, ties to even), everything else with the
/// reference quantizer. Weights should use [`quantize_row`]; a [`KernelSet`] quantizes
/// for its own order ([`KernelSet::quantize_activations`]).
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
/// Q8_0 for Q4_0/Q5_0/Q8_0/MXFP4, Q8_1 for Q4_1/Q5_1, Q8_K for K-quants, F16 for F16, BF16
/// for BF16, F32 for F32.
/// For types without kernels here this is ggml's CPU mapping (informational only).
pub fn vec_dot_type(ty: GgmlType) -> GgmlType {
    use GgmlType as T;
    match format_fns(ty) {
        Some(k) => k.vec_dot_type,
        None => match ty {
            T::IQ4_NL => T::Q8_0,
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
/// float weights), in the one-row order ([`DotOrder::Single`]) with the kernel the table
/// picks at the active ISA; the result is the scalar twin's bits.
pub fn vec_dot(ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
    let k = kernels::kernels(ty, DotOrder::Single)
        .ok_or(QuantError::Unsupported { ty, op: "vec_dot" })?;
    expect_len(ty, "weight row", blocks_of(ty, n)?, w.len())?;
    expect_len(k.act, "activation row", blocks_of(k.act, n)?, a.len())?;
    Ok((k.dot)(w, a))
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
        check::<mxfp4::BlockMxfp4>();
        check::<iq4_xs::BlockIq4Xs>();
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
            (T::F16, T::F16),
            (T::BF16, T::BF16),
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
            (T::IQ4_XS, T::Q8_K),
            (T::MXFP4, T::Q8_0),
        ] {
            assert_eq!(vec_dot_type(w), a, "{w}");
        }
    }
}
