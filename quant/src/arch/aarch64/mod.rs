//! aarch64 kernels: NEON, and NEON with FEAT_DotProd's `sdot`, each bit-exact with its
//! scalar twin in `crate::formats`, and their rows of the kernel table.
//!
//! How exactness is kept (the same rules as `arch/x86`, other instructions):
//!
//! * Integer parts are exact. A kernel is generic over a [`simd::Level`] that forms four
//!   i32 lanes of 4-byte dot products: one `sdot` where the CPU has it, else widening
//!   multiplies (exact in i16) and widening pairwise adds. Both multiply signed bytes by
//!   signed bytes, so unlike x86's `maddubs` nothing needs the weights unsigned or the
//!   activations above -128.
//! * Float parts follow the twin operation for operation. The twins' eight float lanes
//!   are two 4-lane registers; `vfmaq_f32` stands exactly where a twin calls `mul_add`,
//!   `vmulq` then `vaddq` where it multiplies then adds, and the horizontal sums are the
//!   twin's (`hsum_lanes`'s `(v0 + v2) + (v1 + v3)` after `x[i + 4] + x[i]`).
//!   Conversions (i32 to f32, f16 to f32) round the same way as the scalar `as f32` and
//!   `f16_to_f32`.
//! * The tile kernels (`TileFn`) unpack a weight block once and run the one-row operation
//!   sequence for each activation row; the one-row entry points are their one-row
//!   instances.
//!
//! Detection: `sdot` exists only from Armv8.2-A on (optional there), so the `sdot` rows
//! sit at `Isa::NeonDotprod`, handed out only where `is_aarch64_feature_detected!
//! ("dotprod")` said yes; plain NEON rows (`Isa::Neon`) run everywhere else. Q3_K,
//! Q5_K and IQ4_XS have plain rows only (their lanes of four consecutive bytes come from
//! widening multiplies and pairwise adds; IQ4_XS's products follow x86's sign trick), so
//! a dotprod CPU falls back to them.
//!
//! Files: `simd` (shared helpers and the two levels), `legacy` (32-element formats),
//! `kquants` (K-quants), `f16` (attention's f32 x f16 products), `bf16` (BF16 weights).

use crate::contract::{DotFn, KernelRow, TileFn};
use crate::isa::Isa;
use crate::order::DotOrder;
use crate::GgmlType;

pub(crate) mod bf16;
pub(crate) mod f16;
mod kquants;
mod legacy;
mod simd;

const fn row(
    ty: GgmlType,
    order: DotOrder,
    isa: Isa,
    dot: DotFn,
    tile: Option<TileFn>,
) -> KernelRow {
    KernelRow {
        ty,
        order,
        isa,
        dot,
        tile,
        offset_sums: false,
        block_sums: false,
        tile_rows: crate::contract::EXACT_TILE_ROWS,
        tile_tokens: crate::contract::TILE_MAX_TOKENS,
        tile_into: None,
        packed_into: None,
        packed_rows: crate::PACK_ROWS,
        stream_rows: crate::PACK_ROWS,
        packed_tokens: crate::contract::TILE_MAX_TOKENS,
    }
}

/// A row of the repacked order of MXFP4, IQ4_NL or Q4_0 (`DotOrder::Gemm4`): its tile takes
/// eight weight rows (four per register) and eight activation rows.
const fn rep_row(ty: GgmlType, isa: Isa, dot: DotFn, tile: TileFn) -> KernelRow {
    KernelRow {
        tile_rows: crate::contract::TILE_MAX_ROWS,
        ..row(ty, DotOrder::Gemm4, isa, dot, Some(tile))
    }
}

/// The aarch64 rows of the kernel table: every format at `Isa::Neon`, the ones `sdot`
/// speeds up again at `Isa::NeonDotprod`. (Fast-order rows for BF16 only: the fast order
/// falls back to the exact one for the others here; MXFP4's repacked order, which is also
/// its fast order, has rows as `Gemm4`.)
#[rustfmt::skip]
pub(crate) const ROWS: &[KernelRow] = {
    use DotOrder::{Fast, Gemm4, Single, Tiled};
    use GgmlType as T;
    use Isa::{Neon, NeonDotprod};
    use kquants::{self as k, ORD_GEMM4, ORD_SINGLE, ORD_TILED};
    use legacy::{self as l, Iq4Nl, Mxfp4, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
    use simd::{Dotprod, Plain};
    &[
        // BF16: widened f32 lanes; the fast order is tinyBLAS's (every token alike).
        row(T::BF16, Single, Neon, bf16::single, Some(bf16::single_many)),
        row(T::BF16, Tiled, Neon, bf16::tiled, Some(bf16::tiled_many)),
        row(T::BF16, Fast, Neon, bf16::tiled, Some(bf16::tiled_many)),
        row(T::Q4_0, Single, Neon, l::dot::<Q4_0, Plain>, Some(l::tile::<Q4_0, Plain>)),
        rep_row(T::Q4_0, Neon, l::rep_dot::<Q4_0, Plain>, l::rep_tile::<Q4_0, Plain>),
        row(T::Q4_1, Single, Neon, l::dot::<Q4_1, Plain>, Some(l::tile::<Q4_1, Plain>)),
        row(T::Q5_0, Single, Neon, l::dot::<Q5_0, Plain>, Some(l::tile::<Q5_0, Plain>)),
        row(T::Q5_1, Single, Neon, l::dot::<Q5_1, Plain>, Some(l::tile::<Q5_1, Plain>)),
        row(T::Q8_0, Single, Neon, l::dot::<Q8_0, Plain>, Some(l::tile::<Q8_0, Plain>)),
        row(T::MXFP4, Single, Neon, l::dot::<Mxfp4, Plain>, Some(l::tile::<Mxfp4, Plain>)),
        rep_row(T::MXFP4, Neon, l::rep_dot::<Mxfp4, Plain>, l::rep_tile::<Mxfp4, Plain>),
        row(T::IQ4_NL, Single, Neon, l::dot::<Iq4Nl, Plain>, Some(l::tile::<Iq4Nl, Plain>)),
        rep_row(T::IQ4_NL, Neon, l::rep_dot::<Iq4Nl, Plain>, l::rep_tile::<Iq4Nl, Plain>),
        row(T::Q4_K, Single, Neon, k::q4_k_dot::<Plain, ORD_SINGLE>, Some(k::q4_k_tile::<Plain, ORD_SINGLE>)),
        row(T::Q4_K, Tiled, Neon, k::q4_k_dot::<Plain, ORD_TILED>, Some(k::q4_k_tile::<Plain, ORD_TILED>)),
        row(T::Q4_K, Gemm4, Neon, k::q4_k_dot::<Plain, ORD_GEMM4>, Some(k::q4_k_tile::<Plain, ORD_GEMM4>)),
        row(T::Q6_K, Single, Neon, k::q6_k_dot::<Plain, ORD_SINGLE>, Some(k::q6_k_tile::<Plain, ORD_SINGLE>)),
        row(T::Q6_K, Tiled, Neon, k::q6_k_dot::<Plain, ORD_TILED>, Some(k::q6_k_tile::<Plain, ORD_TILED>)),
        row(T::Q2_K, Single, Neon, k::q2_k_dot::<Plain>, None),
        row(T::Q3_K, Single, Neon, k::q3_k_dot::<false>, None),
        row(T::Q3_K, Tiled, Neon, k::q3_k_dot::<true>, None),
        row(T::Q5_K, Single, Neon, k::q5_k_dot::<false>, None),
        row(T::Q5_K, Tiled, Neon, k::q5_k_dot::<true>, None),
        row(T::IQ4_XS, Single, Neon, k::iq4_xs_dot::<false>, None),
        row(T::IQ4_XS, Tiled, Neon, k::iq4_xs_dot::<true>, None),
        row(T::Q4_0, Single, NeonDotprod, l::dot::<Q4_0, Dotprod>, Some(l::tile::<Q4_0, Dotprod>)),
        rep_row(T::Q4_0, NeonDotprod, l::rep_dot::<Q4_0, Dotprod>, l::rep_tile::<Q4_0, Dotprod>),
        row(T::Q4_1, Single, NeonDotprod, l::dot::<Q4_1, Dotprod>, Some(l::tile::<Q4_1, Dotprod>)),
        row(T::Q5_0, Single, NeonDotprod, l::dot::<Q5_0, Dotprod>, Some(l::tile::<Q5_0, Dotprod>)),
        row(T::Q5_1, Single, NeonDotprod, l::dot::<Q5_1, Dotprod>, Some(l::tile::<Q5_1, Dotprod>)),
        row(T::Q8_0, Single, NeonDotprod, l::dot::<Q8_0, Dotprod>, Some(l::tile::<Q8_0, Dotprod>)),
        row(T::MXFP4, Single, NeonDotprod, l::dot::<Mxfp4, Dotprod>, Some(l::tile::<Mxfp4, Dotprod>)),
        rep_row(T::MXFP4, NeonDotprod, l::rep_dot::<Mxfp4, Dotprod>, l::rep_tile::<Mxfp4, Dotprod>),
        row(T::IQ4_NL, Single, NeonDotprod, l::dot::<Iq4Nl, Dotprod>, Some(l::tile::<Iq4Nl, Dotprod>)),
        rep_row(T::IQ4_NL, NeonDotprod, l::rep_dot::<Iq4Nl, Dotprod>, l::rep_tile::<Iq4Nl, Dotprod>),
        row(T::Q4_K, Single, NeonDotprod, k::q4_k_dot::<Dotprod, ORD_SINGLE>, Some(k::q4_k_tile::<Dotprod, ORD_SINGLE>)),
        row(T::Q4_K, Tiled, NeonDotprod, k::q4_k_dot::<Dotprod, ORD_TILED>, Some(k::q4_k_tile::<Dotprod, ORD_TILED>)),
        row(T::Q4_K, Gemm4, NeonDotprod, k::q4_k_dot::<Dotprod, ORD_GEMM4>, Some(k::q4_k_tile::<Dotprod, ORD_GEMM4>)),
        row(T::Q6_K, Single, NeonDotprod, k::q6_k_dot::<Dotprod, ORD_SINGLE>, Some(k::q6_k_tile::<Dotprod, ORD_SINGLE>)),
        row(T::Q6_K, Tiled, NeonDotprod, k::q6_k_dot::<Dotprod, ORD_TILED>, Some(k::q6_k_tile::<Dotprod, ORD_TILED>)),
        row(T::Q2_K, Single, NeonDotprod, k::q2_k_dot::<Dotprod>, None),
    ]
};
