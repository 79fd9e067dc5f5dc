//! x86-64 kernels: AVX2 (+FMA, F16C) and its AVX-512 VNNI variant, each bit-exact with its
//! scalar twin in `crate::formats`, and their rows of the kernel table.
//!
//! How exactness is kept:
//!
//! * Integer parts are exact. `_mm256_maddubs_epi16` multiplies an *unsigned* byte by a
//!   signed one and adds adjacent pairs into a saturating i16; every call here stays below
//!   the saturation bound (weights' unsigned operand at most 128 with activations in
//!   -127..=127 for the 32-element formats, at most 63 against any byte for the K-quants).
//!   `vpdpbusd` (VNNI) forms the same i32 lanes without the i16 step.
//! * Float parts follow the twin operation for operation. Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 and
//!   the K-quants use ggml's x86 orders (AVX2: eight i32 lanes per block, converted and
//!   fused-multiply-added into eight float lanes, `hsum_float_8` at the end; the tiled
//!   GEMM and the repacked kernels: one integer sum per super-block or chunk), which the
//!   twins spell out with `f32::mul_add`. Q2_K keeps ggml's generic order.
//! * The tile kernels (`TileFn`) unpack a weight block once and run the one-row
//!   operation sequence for each activation row, so a row's result never depends on how
//!   many rows were computed with it; the one-row entry points are their N = 1 instances.
//!
//! Files: `simd` (shared helpers), `legacy/` (32-element formats, one file per kernel
//! family), `kquants` (K-quants), `kpacked` (K-quants on rows repacked by `crate::pack8`),
//! `f16` (attention's f32 x f16 products and F16 weights), `bf16` (BF16 weights), `attn`
//! (attention tiles: several queries per key and V row), `q8` (the Q8_0/Q8_1 activation
//! quantizers).

use crate::contract::{DotFn, KernelRow, TileFn, TileIntoFn};
use crate::isa::Isa;
use crate::order::DotOrder;
use crate::GgmlType;

/// Single-row entry points: the one-row instantiation of the tile kernels (so a row
/// alone and a row in a batch give the same bits by construction).
macro_rules! single_from_many {
    ($name:ident, $w:ty, $a:ty, $many:ident) => {
        pub(in crate::arch::x86) fn $name(w: &[u8], a: &[u8]) -> f32 {
            check_dot::<$w, $a>(w, a);
            let mut out = [0.0f32];
            $many(w, 1, a, a.len(), ActSide::default(), &mut out);
            out[0]
        }
    };
}

pub(crate) mod attn;
pub(crate) mod bf16;
pub(crate) mod f16;
pub(crate) mod float;
mod kpacked;
mod kquants;
mod legacy;
pub(crate) mod q8;
mod simd;

const fn row(
    ty: GgmlType,
    order: DotOrder,
    isa: Isa,
    dot: DotFn,
    tile: Option<TileFn>,
    offset_sums: bool,
) -> KernelRow {
    KernelRow {
        ty,
        order,
        isa,
        dot,
        tile,
        offset_sums,
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

/// A fast-order row ([`DotOrder::Fast`]): its tile takes eight weight rows.
const fn fast_row(
    ty: GgmlType,
    isa: Isa,
    dot: DotFn,
    (tile, into, packed): (TileFn, TileIntoFn, TileIntoFn),
    offset_sums: bool,
) -> KernelRow {
    KernelRow {
        ty,
        order: DotOrder::Fast,
        isa,
        dot,
        tile: Some(tile),
        offset_sums,
        block_sums: true,
        tile_rows: 8,
        tile_tokens: crate::contract::FAST_TILE_TOKENS,
        tile_into: Some(into),
        packed_into: Some(packed),
        packed_rows: crate::PACK_ROWS,
        stream_rows: crate::PACK_ROWS,
        packed_tokens: crate::contract::FAST_TILE_TOKENS,
    }
}

/// An AVX-512 fast-order row: the AVX2+VNNI kernels, with a packed tile of sixteen rows
/// (two groups in the lanes of one 512-bit register).
const fn fast_row512(
    ty: GgmlType,
    dot: DotFn,
    (tile, into, packed): (TileFn, TileIntoFn, TileIntoFn),
    offset_sums: bool,
) -> KernelRow {
    KernelRow {
        packed_rows: legacy::PACKED512_ROWS,
        stream_rows: legacy::PACKED512_ROWS,
        ..fast_row(ty, Isa::Avx512, dot, (tile, into, packed), offset_sums)
    }
}

/// A BF16 row (or F16's AVX-512 ones): its tile takes up to [`bf16::TILE_ROWS`] weight
/// rows.
const fn bf16_row(r: KernelRow) -> KernelRow {
    KernelRow {
        tile_rows: bf16::TILE_ROWS,
        ..r
    }
}

/// `r` filed under `order`: MXFP4's, IQ4_NL's and Q4_0's repacked order (llama.cpp's
/// `DotOrder::Gemm4` for them) is the fast order's arithmetic, so the fast kernels serve it.
const fn in_order(r: KernelRow, order: DotOrder) -> KernelRow {
    KernelRow { order, ..r }
}

/// `r` with a packed tile of one group of eight rows (llama.cpp's order on packed rows).
const fn exact_packed(r: KernelRow, packed: TileIntoFn) -> KernelRow {
    KernelRow {
        packed_into: Some(packed),
        packed_tokens: crate::contract::FAST_TILE_TOKENS,
        ..r
    }
}

/// `r` at AVX-512 with a packed tile of up to sixteen rows (two groups in the lanes of one
/// 512-bit register, llama.cpp's order).
const fn exact_packed512(r: KernelRow, packed: TileIntoFn) -> KernelRow {
    KernelRow {
        isa: Isa::Avx512,
        packed_rows: legacy::PACKED512_ROWS,
        stream_rows: legacy::PACKED512_ROWS,
        ..exact_packed(r, packed)
    }
}

/// A K-quant row with a packed tile (`tiles` at `isa`): the one-row and tile kernels over
/// the file's rows are the AVX2 ones of the same order at every level. Q4_K's and Q6_K's
/// llama.cpp orders have one, and their fast orders, which sum like one of llama.cpp's
/// (`DotOrder::Fast`).
const fn packed_row_k(
    (ty, order, isa): (GgmlType, DotOrder, Isa),
    (dot, tile): (DotFn, TileFn),
    tiles: &kpacked::Tiles,
) -> KernelRow {
    let (packed, packed_rows) = tiles.at(isa);
    KernelRow {
        packed_into: Some(packed),
        packed_rows,
        stream_rows: kpacked::STREAM_ROWS,
        packed_tokens: crate::contract::FAST_TILE_TOKENS,
        ..row(ty, order, isa, dot, Some(tile), false)
    }
}

/// The x86 rows of the kernel table. Formats missing at a level fall back to the level
/// below (`Isa::fallbacks`): Q2_K and Q3_K have AVX2 rows only, which every level
/// above runs, and the AVX-VNNI level has rows for four formats' exact packed kernels.
#[rustfmt::skip]
pub(crate) const ROWS: &[KernelRow] = {
    use DotOrder::{Fast, Gemm4, Single, Tiled};
    use GgmlType as T;
    use Isa::{Avx2, Avx2Vnni, Avx512, AvxVnni};
    use kpacked as p;
    use kquants as k;
    const Q4K_SINGLE: (DotFn, TileFn) = (k::q4_k_q8_k, k::q4_k_many_entry);
    const Q4K_GEMM4: (DotFn, TileFn) = (k::q4_k_q8_k_gemm4, k::q4_k_gemm4_many_entry);
    const Q6K_TILED: (DotFn, TileFn) = (k::q6_k_q8_k_tiled, k::q6_k_tiled_many_entry);
    const Q6K_SINGLE: (DotFn, TileFn) = (k::q6_k_q8_k, k::q6_k_many_entry);
    const Q5K_SINGLE: (DotFn, TileFn) = (k::q5_k_q8_k, k::q5_k_many_entry);
    const Q5K_TILED: (DotFn, TileFn) = (k::q5_k_q8_k_tiled, k::q5_k_tiled_many_entry);
    const Q3K_SINGLE: (DotFn, TileFn) = (k::q3_k_q8_k, k::q3_k_many_entry);
    const Q3K_TILED: (DotFn, TileFn) = (k::q3_k_q8_k_tiled, k::q3_k_tiled_many_entry);
    const IQ4XS_SINGLE: (DotFn, TileFn) = (k::iq4_xs_q8_k, k::iq4_xs_many_entry);
    const IQ4XS_TILED: (DotFn, TileFn) = (k::iq4_xs_q8_k_tiled, k::iq4_xs_tiled_many_entry);
    use legacy as l;
    type Fast3 = (TileFn, TileIntoFn, TileIntoFn);
    const MXFP4_AVX2: Fast3 = (l::mxfp4_rep_many, l::mxfp4_rep_many_into, l::mxfp4_rep_packed_into);
    const MXFP4_VNNI: Fast3 =
        (l::mxfp4_rep_many_vnni, l::mxfp4_rep_many_vnni_into, l::mxfp4_rep_packed_vnni_into);
    const MXFP4_512: Fast3 =
        (l::mxfp4_rep_many_vnni, l::mxfp4_rep_many_vnni_into, l::mxfp4_rep_packed512_into);
    const IQ4NL_AVX2: Fast3 =
        (l::iq4_nl_rep_many, l::iq4_nl_rep_many_into, l::iq4_nl_rep_packed_into);
    const IQ4NL_VNNI: Fast3 =
        (l::iq4_nl_rep_many_vnni, l::iq4_nl_rep_many_vnni_into, l::iq4_nl_rep_packed_vnni_into);
    const IQ4NL_512: Fast3 =
        (l::iq4_nl_rep_many_vnni, l::iq4_nl_rep_many_vnni_into, l::iq4_nl_rep_packed512_into);
    &[
        // F32 weights (MoE routers; whole f32 files): one row at a time, no tile.
        row(T::F32, Single, Avx2, float::single_avx2, None, false),
        row(T::F32, Tiled, Avx2, float::tiled_avx2, None, false),
        row(T::F32, Single, Avx512, float::single_avx512, None, false),
        row(T::F32, Tiled, Avx512, float::tiled_avx512, None, false),
        // F16 weights against f16 activations: attention's f16 kernels, ymm for both
        // flavors (the flavor fixes the lanes of the order, not the register width).
        row(T::F16, Single, Avx2, f16::weights_single, Some(f16::weights_single_many), false),
        row(T::F16, Tiled, Avx2, f16::weights_tiled, Some(f16::weights_tiled_many), false),
        row(T::F16, Fast, Avx2, f16::weights_tiled, Some(f16::weights_tiled_many), false),
        // AVX-512: tinyBLAS's order four rows at a time in zmm registers.
        bf16_row(row(T::F16, Tiled, Avx512, f16::weights_tiled, Some(f16::weights_tiled_many_avx512), false)),
        bf16_row(row(T::F16, Fast, Avx512, f16::weights_tiled, Some(f16::weights_tiled_many_avx512), false)),
        // BF16 weights against bf16 activations: widened f32 lanes on AVX2, `vdpbf16ps` on
        // AVX-512 CPUs that have it; the fast order is tinyBLAS's (every token alike).
        bf16_row(row(T::BF16, Single, Avx2, bf16::single::<false, false>, Some(bf16::many::<false, false>), false)),
        bf16_row(row(T::BF16, Tiled, Avx2, bf16::single::<true, false>, Some(bf16::many::<true, false>), false)),
        bf16_row(row(T::BF16, Fast, Avx2, bf16::single::<true, false>, Some(bf16::many::<true, false>), false)),
        bf16_row(row(T::BF16, Single, Avx512, bf16::single::<false, true>, Some(bf16::many::<false, true>), false)),
        bf16_row(row(T::BF16, Tiled, Avx512, bf16::single::<true, true>, Some(bf16::many::<true, true>), false)),
        bf16_row(row(T::BF16, Fast, Avx512, bf16::single::<true, true>, Some(bf16::many::<true, true>), false)),
        // Q4_0 and Q5_0 take their packed weights unsigned, with offset sums (the file
        // rows' tiles ignore them without VNNI); Q8_0 keeps the sign trick.
        exact_packed(row(T::Q4_0, Single, Avx2, l::q4_0_q8_0, Some(l::q4_0_many), true), l::q4_0_packed_avx2),
        exact_packed(row(T::Q4_1, Single, Avx2, l::q4_1_q8_1, Some(l::q4_1_many), false), l::q4_1_packed_avx2),
        exact_packed(row(T::Q5_0, Single, Avx2, l::q5_0_q8_0, Some(l::q5_0_many), true), l::q5_0_packed_avx2),
        exact_packed(row(T::Q5_1, Single, Avx2, l::q5_1_q8_1, Some(l::q5_1_many), false), l::q5_1_packed_avx2),
        exact_packed(row(T::Q8_0, Single, Avx2, l::q8_0_q8_0, Some(l::q8_0_many), false), l::q8_0_packed_avx2),
        // Signed formats take unsigned weights plus precomputed offset sums under VNNI.
        exact_packed(row(T::Q4_0, Single, Avx2Vnni, l::q4_0_q8_0_vnni, Some(l::q4_0_many_vnni), true), l::q4_0_packed_vnni),
        exact_packed(row(T::Q4_1, Single, Avx2Vnni, l::q4_1_q8_1_vnni, Some(l::q4_1_many_vnni), false), l::q4_1_packed_vnni),
        exact_packed(row(T::Q5_0, Single, Avx2Vnni, l::q5_0_q8_0_vnni, Some(l::q5_0_many_vnni), true), l::q5_0_packed_vnni),
        exact_packed(row(T::Q5_1, Single, Avx2Vnni, l::q5_1_q8_1_vnni, Some(l::q5_1_many_vnni), false), l::q5_1_packed_vnni),
        exact_packed(row(T::Q8_0, Single, Avx2Vnni, l::q8_0_q8_0_vnni, Some(l::q8_0_many_vnni), true), l::q8_0_packed_vnni),
        // AVX-VNNI (VEX, no AVX-512): the packed exact kernels of the 4- and 5-bit formats
        // (the file rows' tiles are AVX2's; Q8_0, the K-quants and the fast order measured
        // slower with `vpdpbusd` in 16 registers than on AVX2, and fall back to it).
        exact_packed(row(T::Q4_0, Single, AvxVnni, l::q4_0_q8_0, Some(l::q4_0_many), true), l::q4_0_packed_vex),
        exact_packed(row(T::Q4_1, Single, AvxVnni, l::q4_1_q8_1, Some(l::q4_1_many), false), l::q4_1_packed_vex),
        exact_packed(row(T::Q5_0, Single, AvxVnni, l::q5_0_q8_0, Some(l::q5_0_many), true), l::q5_0_packed_vex),
        exact_packed(row(T::Q5_1, Single, AvxVnni, l::q5_1_q8_1, Some(l::q5_1_many), false), l::q5_1_packed_vex),
        // AVX-512: the VNNI kernels over the file's rows, sixteen packed rows per register.
        exact_packed512(row(T::Q4_0, Single, Avx2Vnni, l::q4_0_q8_0_vnni, Some(l::q4_0_many_vnni), true), l::q4_0_packed512),
        exact_packed512(row(T::Q4_1, Single, Avx2Vnni, l::q4_1_q8_1_vnni, Some(l::q4_1_many_vnni), false), l::q4_1_packed512),
        exact_packed512(row(T::Q5_0, Single, Avx2Vnni, l::q5_0_q8_0_vnni, Some(l::q5_0_many_vnni), true), l::q5_0_packed512),
        exact_packed512(row(T::Q5_1, Single, Avx2Vnni, l::q5_1_q8_1_vnni, Some(l::q5_1_many_vnni), false), l::q5_1_packed512),
        exact_packed512(row(T::Q8_0, Single, Avx2Vnni, l::q8_0_q8_0_vnni, Some(l::q8_0_many_vnni), true), l::q8_0_packed512),
        packed_row_k((T::Q4_K, Single, Avx2), Q4K_SINGLE, &p::Q4_K_SINGLE),
        packed_row_k((T::Q4_K, Single, Avx2Vnni), Q4K_SINGLE, &p::Q4_K_SINGLE),
        packed_row_k((T::Q4_K, Single, Avx512), Q4K_SINGLE, &p::Q4_K_SINGLE),
        row(T::Q4_K, Tiled, Avx2, k::q4_k_q8_k_tiled, Some(k::q4_k_tiled_many_entry), false),
        packed_row_k((T::Q4_K, Gemm4, Avx2), Q4K_GEMM4, &p::Q4_K_GEMM4),
        packed_row_k((T::Q4_K, Gemm4, Avx2Vnni), Q4K_GEMM4, &p::Q4_K_GEMM4),
        packed_row_k((T::Q4_K, Gemm4, Avx512), Q4K_GEMM4, &p::Q4_K_GEMM4),
        packed_row_k((T::Q6_K, Single, Avx2), Q6K_SINGLE, &p::Q6_K_SINGLE),
        packed_row_k((T::Q6_K, Single, Avx2Vnni), Q6K_SINGLE, &p::Q6_K_SINGLE),
        packed_row_k((T::Q6_K, Single, Avx512), Q6K_SINGLE, &p::Q6_K_SINGLE),
        packed_row_k((T::Q6_K, Tiled, Avx2), Q6K_TILED, &p::Q6_K_TILED),
        packed_row_k((T::Q6_K, Tiled, Avx2Vnni), Q6K_TILED, &p::Q6_K_TILED),
        packed_row_k((T::Q6_K, Tiled, Avx512), Q6K_TILED, &p::Q6_K_TILED),
        row(T::Q2_K, Single, Avx2, k::q2_k_q8_k, None, false),
        // Q3_K: ggml's AVX2 `vec_dot` and the tiled GEMM's order (also its fast order).
        packed_row_k((T::Q3_K, Single, Avx2), Q3K_SINGLE, &p::Q3_K_SINGLE),
        packed_row_k((T::Q3_K, Single, Avx2Vnni), Q3K_SINGLE, &p::Q3_K_SINGLE),
        packed_row_k((T::Q3_K, Single, Avx512), Q3K_SINGLE, &p::Q3_K_SINGLE),
        packed_row_k((T::Q3_K, Tiled, Avx2), Q3K_TILED, &p::Q3_K_TILED),
        packed_row_k((T::Q3_K, Tiled, Avx2Vnni), Q3K_TILED, &p::Q3_K_TILED),
        packed_row_k((T::Q3_K, Tiled, Avx512), Q3K_TILED, &p::Q3_K_TILED),
        packed_row_k((T::Q3_K, Fast, Avx2), Q3K_TILED, &p::Q3_K_TILED),
        packed_row_k((T::Q3_K, Fast, Avx2Vnni), Q3K_TILED, &p::Q3_K_TILED),
        packed_row_k((T::Q3_K, Fast, Avx512), Q3K_TILED, &p::Q3_K_TILED),
        packed_row_k((T::Q5_K, Single, Avx2), Q5K_SINGLE, &p::Q5_K_SINGLE),
        packed_row_k((T::Q5_K, Single, Avx2Vnni), Q5K_SINGLE, &p::Q5_K_SINGLE),
        packed_row_k((T::Q5_K, Single, Avx512), Q5K_SINGLE, &p::Q5_K_SINGLE),
        packed_row_k((T::Q5_K, Tiled, Avx2), Q5K_TILED, &p::Q5_K_TILED),
        packed_row_k((T::Q5_K, Tiled, Avx2Vnni), Q5K_TILED, &p::Q5_K_TILED),
        packed_row_k((T::Q5_K, Tiled, Avx512), Q5K_TILED, &p::Q5_K_TILED),
        // IQ4_XS: ggml's AVX2 `vec_dot` and the tiled GEMM's order (also its fast order).
        packed_row_k((T::IQ4_XS, Single, Avx2), IQ4XS_SINGLE, &p::IQ4_XS_SINGLE),
        packed_row_k((T::IQ4_XS, Single, Avx2Vnni), IQ4XS_SINGLE, &p::IQ4_XS_SINGLE),
        packed_row_k((T::IQ4_XS, Single, Avx512), IQ4XS_SINGLE, &p::IQ4_XS_SINGLE),
        packed_row_k((T::IQ4_XS, Tiled, Avx2), IQ4XS_TILED, &p::IQ4_XS_TILED),
        packed_row_k((T::IQ4_XS, Tiled, Avx2Vnni), IQ4XS_TILED, &p::IQ4_XS_TILED),
        packed_row_k((T::IQ4_XS, Tiled, Avx512), IQ4XS_TILED, &p::IQ4_XS_TILED),
        packed_row_k((T::IQ4_XS, Fast, Avx2), IQ4XS_TILED, &p::IQ4_XS_TILED),
        packed_row_k((T::IQ4_XS, Fast, Avx2Vnni), IQ4XS_TILED, &p::IQ4_XS_TILED),
        packed_row_k((T::IQ4_XS, Fast, Avx512), IQ4XS_TILED, &p::IQ4_XS_TILED),
        // The fast order: eight weight rows in the lanes of a register.
        fast_row(T::Q4_0, Avx2, l::q4_0_fast, (l::q4_0_fast_many, l::q4_0_fast_many_into, l::q4_0_fast_packed_into), true),
        fast_row(T::Q4_1, Avx2, l::q4_1_fast, (l::q4_1_fast_many, l::q4_1_fast_many_into, l::q4_1_fast_packed_into), false),
        fast_row(T::Q5_0, Avx2, l::q5_0_fast, (l::q5_0_fast_many, l::q5_0_fast_many_into, l::q5_0_fast_packed_into), true),
        fast_row(T::Q5_1, Avx2, l::q5_1_fast, (l::q5_1_fast_many, l::q5_1_fast_many_into, l::q5_1_fast_packed_into), false),
        fast_row(T::Q8_0, Avx2, l::q8_0_fast, (l::q8_0_fast_many, l::q8_0_fast_many_into, l::q8_0_fast_packed_into), false),
        fast_row(T::Q4_0, Avx2Vnni, l::q4_0_fast_vnni, (l::q4_0_fast_many_vnni, l::q4_0_fast_many_vnni_into, l::q4_0_fast_packed_vnni_into), true),
        fast_row(T::Q4_1, Avx2Vnni, l::q4_1_fast_vnni, (l::q4_1_fast_many_vnni, l::q4_1_fast_many_vnni_into, l::q4_1_fast_packed_vnni_into), false),
        fast_row(T::Q5_0, Avx2Vnni, l::q5_0_fast_vnni, (l::q5_0_fast_many_vnni, l::q5_0_fast_many_vnni_into, l::q5_0_fast_packed_vnni_into), true),
        fast_row(T::Q5_1, Avx2Vnni, l::q5_1_fast_vnni, (l::q5_1_fast_many_vnni, l::q5_1_fast_many_vnni_into, l::q5_1_fast_packed_vnni_into), false),
        fast_row(T::Q8_0, Avx2Vnni, l::q8_0_fast_vnni, (l::q8_0_fast_many_vnni, l::q8_0_fast_many_vnni_into, l::q8_0_fast_packed_vnni_into), true),
        // AVX-512: the VNNI kernels, and sixteen packed rows per register.
        fast_row512(T::Q4_0, l::q4_0_fast_vnni, (l::q4_0_fast_many_vnni, l::q4_0_fast_many_vnni_into, l::q4_0_fast_packed512_into), true),
        // Q4_0's repacked order (`q4_0_8x8_q8_0`, IQ4_NL's templates) is its fast order's
        // arithmetic, so the fast kernels serve it.
        in_order(fast_row(T::Q4_0, Avx2, l::q4_0_fast, (l::q4_0_fast_many, l::q4_0_fast_many_into, l::q4_0_fast_packed_into), true), Gemm4),
        in_order(fast_row(T::Q4_0, Avx2Vnni, l::q4_0_fast_vnni, (l::q4_0_fast_many_vnni, l::q4_0_fast_many_vnni_into, l::q4_0_fast_packed_vnni_into), true), Gemm4),
        in_order(fast_row512(T::Q4_0, l::q4_0_fast_vnni, (l::q4_0_fast_many_vnni, l::q4_0_fast_many_vnni_into, l::q4_0_fast_packed512_into), true), Gemm4),
        fast_row512(T::Q4_1, l::q4_1_fast_vnni, (l::q4_1_fast_many_vnni, l::q4_1_fast_many_vnni_into, l::q4_1_fast_packed512_into), false),
        fast_row512(T::Q5_0, l::q5_0_fast_vnni, (l::q5_0_fast_many_vnni, l::q5_0_fast_many_vnni_into, l::q5_0_fast_packed512_into), true),
        fast_row512(T::Q5_1, l::q5_1_fast_vnni, (l::q5_1_fast_many_vnni, l::q5_1_fast_many_vnni_into, l::q5_1_fast_packed512_into), false),
        fast_row512(T::Q8_0, l::q8_0_fast_vnni, (l::q8_0_fast_many_vnni, l::q8_0_fast_many_vnni_into, l::q8_0_fast_packed512_into), true),
        // The K-quants' fast orders (Q4_K: `Single`, Q5_K and Q6_K: `Tiled`) on packed rows.
        packed_row_k((T::Q4_K, Fast, Avx2), Q4K_SINGLE, &p::Q4_K_SINGLE),
        packed_row_k((T::Q4_K, Fast, Avx2Vnni), Q4K_SINGLE, &p::Q4_K_SINGLE),
        packed_row_k((T::Q4_K, Fast, Avx512), Q4K_SINGLE, &p::Q4_K_SINGLE),
        packed_row_k((T::Q5_K, Fast, Avx2), Q5K_TILED, &p::Q5_K_TILED),
        packed_row_k((T::Q5_K, Fast, Avx2Vnni), Q5K_TILED, &p::Q5_K_TILED),
        packed_row_k((T::Q5_K, Fast, Avx512), Q5K_TILED, &p::Q5_K_TILED),
        packed_row_k((T::Q6_K, Fast, Avx2), Q6K_TILED, &p::Q6_K_TILED),
        packed_row_k((T::Q6_K, Fast, Avx2Vnni), Q6K_TILED, &p::Q6_K_TILED),
        packed_row_k((T::Q6_K, Fast, Avx512), Q6K_TILED, &p::Q6_K_TILED),
        // MXFP4: ggml's `vec_dot` on the file's rows (matrices llama.cpp does not repack);
        // its repacked order, which is also its fast order, on the fast order's kernels.
        row(T::MXFP4, Single, Avx2, l::mxfp4_q8_0, Some(l::mxfp4_many), false),
        // IQ4_NL: ggml's `vec_dot` and the repacked gemv/gemm order, over the file's rows.
        row(T::IQ4_NL, Single, Avx2, l::iq4_nl_q8_0, Some(l::iq4_nl_many), false),
        row(T::IQ4_NL, Single, Avx2Vnni, l::iq4_nl_q8_0_vnni, Some(l::iq4_nl_many_vnni), true),
        // Its repacked order, which is also its fast order, on the fast order's kernels.
        in_order(fast_row(T::IQ4_NL, Avx2, l::iq4_nl_rep, IQ4NL_AVX2, false), Gemm4),
        in_order(fast_row(T::IQ4_NL, Avx2Vnni, l::iq4_nl_rep_vnni, IQ4NL_VNNI, true), Gemm4),
        in_order(fast_row512(T::IQ4_NL, l::iq4_nl_rep_vnni, IQ4NL_512, true), Gemm4),
        fast_row(T::IQ4_NL, Avx2, l::iq4_nl_rep, IQ4NL_AVX2, false),
        fast_row(T::IQ4_NL, Avx2Vnni, l::iq4_nl_rep_vnni, IQ4NL_VNNI, true),
        fast_row512(T::IQ4_NL, l::iq4_nl_rep_vnni, IQ4NL_512, true),
        row(T::MXFP4, Single, Avx2Vnni, l::mxfp4_q8_0_vnni, Some(l::mxfp4_many_vnni), true),
        in_order(fast_row(T::MXFP4, Avx2, l::mxfp4_rep, MXFP4_AVX2, true), Gemm4),
        in_order(fast_row(T::MXFP4, Avx2Vnni, l::mxfp4_rep_vnni, MXFP4_VNNI, true), Gemm4),
        in_order(fast_row512(T::MXFP4, l::mxfp4_rep_vnni, MXFP4_512, true), Gemm4),
        fast_row(T::MXFP4, Avx2, l::mxfp4_rep, MXFP4_AVX2, true),
        fast_row(T::MXFP4, Avx2Vnni, l::mxfp4_rep_vnni, MXFP4_VNNI, true),
        fast_row512(T::MXFP4, l::mxfp4_rep_vnni, MXFP4_512, true),
    ]
};
