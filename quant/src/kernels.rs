//! The kernel table: the one place that maps (weight type, accumulation order, ISA) to a
//! kernel set, for matrix products.
//!
//! Rows come from the scalar twins here and from each architecture's folder under
//! `crate::arch`. A lookup at an ISA walks that ISA's fallbacks (`Isa::fallbacks`: AVX-512
//! → AVX2+VNNI (EVEX) → AVX-VNNI (VEX, where the CPU has it) → AVX2 → scalar,
//! NEON+dotprod → NEON → scalar) and takes the first row it
//! finds, so adding an ISA means adding its files and rows, never editing a picker. Every
//! row returns its scalar twin's bits (`quant/tests/simd_vs_scalar.rs` walks the whole
//! table).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use crate::contract::{
    activation_scales, fast_offset_sums, offset_sums, ActSide, DotFn, KernelRow, TileFn,
};
use crate::formats::{
    float, iq4_nl, iq4_xs, mxfp4, q2_k, q3_k, q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0, q8_k,
};
use crate::isa::{self, Isa};
use crate::order::DotOrder;
use crate::{GgmlType, QuantError};

/// The kernels for one matrix product's weight type in one accumulation order, from the
/// best ISA that has them: quantize activations with [`KernelSet::quantize_activations`],
/// prepare per-block side data with [`SideBuf`], then call [`KernelSet::tile`] (many
/// tokens) or [`KernelSet::dot`] (one row). Both return the scalar twin's bits.
#[derive(Clone, Copy)]
pub struct KernelSet {
    /// The weight type.
    pub ty: GgmlType,
    /// The order the kernels sum in (the order asked for, reduced to one `ty` has).
    pub order: DotOrder,
    /// What activations are quantized to (`vec_dot_type`).
    pub act: GgmlType,
    /// The instruction set the kernels were written for.
    pub isa: Isa,
    /// One weight row against one activation row.
    pub dot: DotFn,
    /// Up to `TILE_MAX_ROWS` weight rows against up to `TILE_MAX_TOKENS` activation rows
    /// (None: call `dot` per pair, which gives the same bits).
    pub tile: Option<TileFn>,
    /// Most weight rows one `tile` call takes (at most [`crate::TILE_MAX_ROWS`]).
    pub tile_rows: usize,
    /// Most activation rows one `tile` call takes ([`crate::TILE_MAX_TOKENS`], or
    /// [`crate::FAST_TILE_TOKENS`] for the fast order).
    pub tile_tokens: usize,
    /// `tile` writing straight into a strided output matrix (the fast order's kernels).
    pub tile_into: Option<crate::contract::TileIntoFn>,
    /// `tile_into` for weights repacked by [`crate::pack8`]: the same results from the
    /// packed bytes of the same rows, whole groups of eight rows per call.
    pub packed_into: Option<crate::contract::TileIntoFn>,
    /// Rows `packed_into` takes per call at most (whole groups of eight: 8 or 16); a call
    /// may always take one group of eight.
    pub packed_rows: usize,
    /// Rows `packed_into` takes per call at most when given one or two tokens (whole
    /// groups of eight, at least `packed_rows`): a decode task's rows in one call, its
    /// arguments checked once (the K-quants' packed kernels), else `packed_rows`.
    pub stream_rows: usize,
    /// Most activation rows one `packed_into` call takes.
    pub packed_tokens: usize,
    offset_sums: bool,
    block_sums: bool,
}

impl std::fmt::Debug for KernelSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelSet")
            .field("ty", &self.ty)
            .field("order", &self.order)
            .field("act", &self.act)
            .field("isa", &self.isa)
            .field("tile", &self.tile.is_some())
            .field("offset_sums", &self.offset_sums)
            .finish()
    }
}

impl KernelSet {
    fn from_row(r: &KernelRow) -> KernelSet {
        KernelSet {
            ty: r.ty,
            order: r.order,
            act: crate::vec_dot_type(r.ty),
            isa: r.isa,
            dot: r.dot,
            tile: r.tile,
            tile_rows: r.tile_rows,
            tile_tokens: r.tile_tokens,
            tile_into: r.tile_into,
            packed_into: r.packed_into,
            packed_rows: r.packed_rows,
            stream_rows: r.stream_rows,
            packed_tokens: r.packed_tokens,
            offset_sums: r.offset_sums,
            block_sums: r.block_sums,
        }
    }

    /// Quantizes one activation row for these kernels, as llama.cpp's kernel of the same
    /// order does: [`DotOrder::Gemm4`] rows get the repacked GEMM's Q8_K rounding
    /// ([`q8_k::quantize_4x8`]), every other row [`crate::quantize_activations`].
    pub fn quantize_activations(&self, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
        if self.act == GgmlType::Q8_K && self.order == DotOrder::Gemm4 {
            crate::expect_quantized_len(self.act, src, dst)?;
            q8_k::quantize_4x8(src, dst);
            return Ok(());
        }
        crate::quantize_activations(self.act, src, dst)
    }

    /// Whether the tile kernel wants [`ActSide::sums`] (VNNI kernels of signed formats).
    pub fn uses_offset_sums(&self) -> bool {
        self.offset_sums
    }
}

/// Per-block activation data for the tile kernels of one matrix product, computed once
/// for all its token rows instead of once per weight row: block scales widened to f32,
/// and for the kernels that want them the offset lane sums.
#[derive(Default)]
pub struct SideBuf {
    scales: Vec<f32>,
    sums: Vec<i32>,
    /// Where each row's sums start in `sums` (one more entry than rows).
    sums_at: Vec<usize>,
    rows: usize,
}

impl SideBuf {
    /// Forgets all rows (keeps the memory).
    pub fn clear(&mut self) {
        self.scales.clear();
        self.sums.clear();
        self.sums_at.clear();
        self.sums_at.push(0);
        self.rows = 0;
    }

    /// Appends the side data of activation row `a`, quantized for `set`.
    pub fn push(&mut self, set: &KernelSet, a: &[u8]) {
        if self.sums_at.is_empty() {
            self.sums_at.push(0);
        }
        activation_scales(set.act, a, &mut self.scales);
        if set.offset_sums {
            if set.block_sums {
                fast_offset_sums(set.ty, a, &mut self.sums);
            } else {
                offset_sums(set.ty, a, &mut self.sums);
            }
        }
        self.sums_at.push(self.sums.len());
        self.rows += 1;
    }

    /// The side data of rows `r0..r1` (all pushed for `set`) as `set`'s tile takes it.
    pub fn rows(&self, set: &KernelSet, r0: usize, r1: usize) -> ActSide<'_> {
        assert!(
            r0 <= r1 && r1 <= self.rows,
            "side rows {r0}..{r1} of {}",
            self.rows
        );
        let per_row = self.scales.len().checked_div(self.rows).unwrap_or(0);
        ActSide {
            scales: &self.scales[r0 * per_row..r1 * per_row],
            sums: if set.offset_sums {
                &self.sums[self.sums_at[r0]..self.sums_at[r1]]
            } else {
                &[]
            },
        }
    }
}

const fn scalar_row(ty: GgmlType, order: DotOrder, dot: DotFn) -> KernelRow {
    KernelRow {
        ty,
        order,
        isa: Isa::Scalar,
        dot,
        tile: None,
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

/// The scalar twins: every dot product a matrix may use, in every order it has.
#[rustfmt::skip]
const SCALAR_ROWS: &[KernelRow] = {
    use DotOrder::{Fast, Gemm4, Single, Tiled};
    use GgmlType as T;
    &[
        scalar_row(T::F32, Single, float::vec_dot_f32),
        scalar_row(T::F32, Tiled, float::vec_dot_f32_tiled),
        scalar_row(T::F16, Single, float::vec_dot_f16),
        scalar_row(T::F16, Tiled, float::vec_dot_f16_tiled),
        scalar_row(T::BF16, Single, float::vec_dot_bf16),
        scalar_row(T::BF16, Tiled, float::vec_dot_bf16_tiled),
        scalar_row(T::Q4_0, Single, q4_0::vec_dot_q8_0),
        scalar_row(T::Q4_0, Gemm4, q4_0::vec_dot_q8_0_fast),
        scalar_row(T::Q4_1, Single, q4_1::vec_dot_q8_1),
        scalar_row(T::Q5_0, Single, q5_0::vec_dot_q8_0),
        scalar_row(T::Q5_1, Single, q5_1::vec_dot_q8_1),
        scalar_row(T::Q8_0, Single, q8_0::vec_dot_q8_0),
        scalar_row(T::Q2_K, Single, q2_k::vec_dot_q8k),
        scalar_row(T::Q3_K, Single, q3_k::vec_dot_q8k),
        scalar_row(T::Q3_K, Tiled, q3_k::vec_dot_q8k_tiled),
        scalar_row(T::Q4_K, Single, q4_k::vec_dot_q8k),
        scalar_row(T::Q4_K, Tiled, q4_k::vec_dot_q8k_tiled),
        scalar_row(T::Q4_K, Gemm4, q4_k::vec_dot_q8k_gemm4),
        scalar_row(T::Q5_K, Single, q5_k::vec_dot_q8k),
        scalar_row(T::Q5_K, Tiled, q5_k::vec_dot_q8k_tiled),
        scalar_row(T::Q6_K, Single, q6_k::vec_dot_q8k),
        scalar_row(T::Q6_K, Tiled, q6_k::vec_dot_q8k_tiled),
        // MXFP4: ggml's `vec_dot` (matrices not repacked) and the repacked gemv/gemm.
        scalar_row(T::MXFP4, Single, mxfp4::vec_dot_q8_0),
        scalar_row(T::MXFP4, Gemm4, mxfp4::vec_dot_q8_0_repacked),
        // IQ4_NL: MXFP4's two orders with its own table and an f16 scale.
        scalar_row(T::IQ4_NL, Single, iq4_nl::vec_dot_q8_0),
        scalar_row(T::IQ4_NL, Gemm4, iq4_nl::vec_dot_q8_0_repacked),
        // IQ4_XS: ggml's AVX2 `vec_dot` and the tiled GEMM (never repacked on x86).
        scalar_row(T::IQ4_XS, Single, iq4_xs::vec_dot_q8k),
        scalar_row(T::IQ4_XS, Tiled, iq4_xs::vec_dot_q8k_tiled),
        scalar_row(T::Q4_0, Fast, q4_0::vec_dot_q8_0_fast),
        scalar_row(T::Q4_1, Fast, q4_1::vec_dot_q8_1_fast),
        scalar_row(T::Q5_0, Fast, q5_0::vec_dot_q8_0_fast),
        scalar_row(T::Q5_1, Fast, q5_1::vec_dot_q8_1_fast),
        scalar_row(T::Q8_0, Fast, q8_0::vec_dot_q8_0_fast),
        // The K-quants' fast orders are orders llama.cpp has: the one whose integer sums
        // per super-block let rows sit in register lanes.
        scalar_row(T::Q4_K, Fast, q4_k::vec_dot_q8k),
        scalar_row(T::Q5_K, Fast, q5_k::vec_dot_q8k_tiled),
        scalar_row(T::Q6_K, Fast, q6_k::vec_dot_q8k_tiled),
        scalar_row(T::IQ4_XS, Fast, iq4_xs::vec_dot_q8k_tiled),
        scalar_row(T::Q3_K, Fast, q3_k::vec_dot_q8k_tiled),
        // MXFP4's and IQ4_NL's repacked order already forms one integer sum per block.
        scalar_row(T::MXFP4, Fast, mxfp4::vec_dot_q8_0_repacked),
        scalar_row(T::IQ4_NL, Fast, iq4_nl::vec_dot_q8_0_repacked),
        // F16's and BF16's tinyBLAS orders are the fastest to run, for any number of tokens.
        scalar_row(T::F16, Fast, float::vec_dot_f16_tiled),
        scalar_row(T::BF16, Fast, float::vec_dot_bf16_tiled),
    ]
};

fn all_rows() -> impl Iterator<Item = &'static KernelRow> {
    SCALAR_ROWS.iter().chain(crate::arch::rows())
}

/// The order actually distinct for weights of `ty`: orders without a kernel of their own
/// for `ty` sum like [`DotOrder::Single`].
pub fn effective_order(ty: GgmlType, order: DotOrder) -> DotOrder {
    if order == DotOrder::Single || SCALAR_ROWS.iter().any(|r| r.ty == ty && r.order == order) {
        order
    } else {
        DotOrder::Single
    }
}

/// The kernel llama.cpp's x86 CPU backend (default build, AVX2 or AVX-512) runs for a
/// token `i` of a micro-batch of `n` tokens multiplied by an `n_out`-row matrix of `ty`:
/// Q4_K matrices with `n_out % 8 == 0` are repacked and go through `gemm` for the tokens
/// `0..n - n % 4` and `gemv` for the rest; other Q4_K matrices, and Q5_K and Q6_K ones
/// (never repacked on x86), go through the tiled GEMM from 8 tokens up
/// (`GGML_CPU_TILED_MM`, on by default), and below that through ggml's AVX2 `vec_dot`
/// (Q5_K) or its gemv order (Q6_K). (Un-repacked Q4_K
/// below 8 tokens runs ggml's AVX2 `vec_dot`, not emulated: it gets the `gemv` order.)
/// F32 matrices (MoE routers), F16 and BF16 ones go through tinyBLAS from two tokens up
/// where it takes them (`n_out % 4 == 0`; its row-length condition is the kernels'). MXFP4 matrices
/// with `n_out % 8 == 0` are repacked (`mxfp4_8x8_q8_0`), and their `gemm`
/// and `gemv` sum alike (`DotOrder::Gemm4` for every token, whatever the micro-batch; the
/// MoE product `mul_mat_id` runs `gemv` per token, the same order); other MXFP4 matrices
/// run `vec_dot` (`DotOrder::Single`). IQ4_NL and Q4_0 matrices go the same two ways
/// (`iq4_nl_8x8_q8_0`, `q4_0_8x8_q8_0`: the same gemv and gemm templates, a table of
/// signed nibbles for Q4_0). IQ4_XS matrices are never
/// repacked, and neither are Q3_K ones: ggml's AVX2 `vec_dot` below 8 tokens, the tiled GEMM
/// from 8 up.
pub fn dot_order_for(ty: GgmlType, n_out: usize, n: usize, i: usize) -> DotOrder {
    match ty {
        // F32, F16 and BF16 weights: llamafile's tinyBLAS from two tokens on where it takes
        // the matrix (a multiple of four rows), `vec_dot_f32` / `_f16` / `_bf16` otherwise.
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 if n >= 2 && n_out.is_multiple_of(4) => {
            DotOrder::Tiled
        }
        GgmlType::MXFP4 | GgmlType::IQ4_NL | GgmlType::Q4_0 if n_out.is_multiple_of(8) => {
            DotOrder::Gemm4
        }
        GgmlType::Q4_K if n_out.is_multiple_of(8) => {
            if i < n - n % 4 {
                DotOrder::Gemm4
            } else {
                DotOrder::Single
            }
        }
        GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::IQ4_XS
            if n >= 8 =>
        {
            DotOrder::Tiled
        }
        _ => DotOrder::Single,
    }
}

/// The row for exactly (`ty`, effective `order`, `isa`), if the table has one.
fn find(ty: GgmlType, order: DotOrder, isa: Isa) -> Option<&'static KernelRow> {
    let order = effective_order(ty, order);
    all_rows().find(|r| r.ty == ty && r.order == order && r.isa == isa)
}

/// The kernel set for weights of `ty` in `order` at `level`: the first row along
/// `level`'s fallbacks (only levels this CPU has). The fast order is only worth its
/// name with SIMD: where only its scalar twin would run but the exact order has a SIMD
/// kernel, the exact set is returned (its `order` says so).
fn resolve(ty: GgmlType, order: DotOrder, level: Isa) -> Option<KernelSet> {
    let found = level
        .fallbacks()
        .find_map(|isa| find(ty, order, isa))
        .map(KernelSet::from_row);
    match found {
        Some(k) if k.order == DotOrder::Fast && k.isa == Isa::Scalar && level != Isa::Scalar => {
            resolve(ty, DotOrder::Single, level)
        }
        other => other,
    }
}

/// The kernels for weights of `ty` in `order` at the active ISA ([`isa::active`]);
/// None when `ty` has no dot product here. Resolved once per (type, order), then cached.
pub fn kernels(ty: GgmlType, order: DotOrder) -> Option<KernelSet> {
    static CACHE: OnceLock<Vec<Option<KernelSet>>> = OnceLock::new();
    let n_orders = DotOrder::ALL.len();
    let cache = CACHE.get_or_init(|| {
        let max_id = GgmlType::ALL.iter().map(|&t| t as usize).max().unwrap_or(0);
        let mut v = vec![None; (max_id + 1) * n_orders];
        for &t in &GgmlType::ALL {
            for o in DotOrder::ALL {
                v[t as usize * n_orders + o.index()] = resolve(t, o, isa::active());
            }
        }
        v
    });
    cache
        .get(ty as usize * n_orders + order.index())
        .copied()
        .flatten()
}

/// The kernels written for exactly `isa` (no fallback), if the table has them and this
/// CPU can run them: for tests and benchmarks that compare ISAs on one machine.
pub fn kernels_at(ty: GgmlType, order: DotOrder, isa: Isa) -> Option<KernelSet> {
    if !isa.available() {
        return None;
    }
    find(ty, order, isa).map(KernelSet::from_row)
}

/// The scalar twins for weights of `ty` in `order` (what every other set returns, bit
/// for bit).
pub fn scalar(ty: GgmlType, order: DotOrder) -> Option<KernelSet> {
    kernels_at(ty, order, Isa::Scalar)
}

/// Every kernel set in the table that this CPU can run, scalar twins included.
pub fn available() -> Vec<KernelSet> {
    all_rows()
        .filter(|r| r.isa.available())
        .map(KernelSet::from_row)
        .collect()
}

/// What the table holds, available here or not: (weight type, order, ISA, has a tile).
pub fn listing() -> Vec<(GgmlType, DotOrder, Isa, bool)> {
    all_rows()
        .map(|r| (r.ty, r.order, r.isa, r.tile.is_some()))
        .collect()
}

/// How far ahead (bytes) the one- and two-token packed K-quant kernels (Q4_K, Q6_K) ask
/// for the weight stream: one software prefetch per cache line of each super-block, this
/// many bytes further on. Which distance streams fastest depended on the memory's state,
/// not only on the CPU (measured in ARCHITECTURE.md, "K-quants on packed rows", and
/// `runtime::tune`), so the runtime tunes it while decoding; only the speed depends on
/// it, never a result bit.
static DECODE_PREFETCH: AtomicUsize = AtomicUsize::new(DECODE_PREFETCH_DEFAULT);

/// The decode prefetch distance before anything sets it.
pub const DECODE_PREFETCH_DEFAULT: usize = 8 * 1024;

/// Sets the distance [`decode_prefetch`] returns (at most 1 MiB).
pub fn set_decode_prefetch(bytes: usize) {
    DECODE_PREFETCH.store(bytes.min(1 << 20), Ordering::Relaxed);
}

/// The decode kernels' prefetch distance in bytes (see [`set_decode_prefetch`]).
#[inline]
pub fn decode_prefetch() -> usize {
    DECODE_PREFETCH.load(Ordering::Relaxed)
}

/// ggml's *generic* C dot product for `ty`, operation for operation. For the 32-element
/// formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), Q4_K and Q6_K the table's kernels instead
/// follow ggml's x86 SIMD summation order, which differs from the generic C code in the
/// last bits; for the others it is the table's scalar kernel. Kept to prove the integer
/// parts against ggml's reference outputs (MXFP4's too: its table orders are proven
/// against ggml's x86 kernels themselves, `llamacpp-ref/tests/mxfp4_vs_ggml.rs`).
pub fn ggml_generic_dot(ty: GgmlType) -> Option<DotFn> {
    use GgmlType as T;
    Some(match ty {
        T::Q4_0 => q4_0::vec_dot_q8_0_ref,
        T::Q4_1 => q4_1::vec_dot_q8_1_ref,
        T::Q5_0 => q5_0::vec_dot_q8_0_ref,
        T::Q5_1 => q5_1::vec_dot_q8_1_ref,
        T::Q8_0 => q8_0::vec_dot_q8_0_ref,
        T::Q4_K => q4_k::vec_dot_q8k_ref,
        T::Q5_K => q5_k::vec_dot_q8k_ref,
        T::Q6_K => q6_k::vec_dot_q8k_ref,
        T::MXFP4 => mxfp4::vec_dot_q8_0_ref,
        T::IQ4_XS => iq4_xs::vec_dot_q8k_ref,
        T::Q3_K => q3_k::vec_dot_q8k_ref,
        _ => return scalar(ty, DotOrder::Single).map(|k| k.dot),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_has_a_scalar_twin_and_one_entry() {
        let rows = listing();
        for &(ty, order, isa, _) in &rows {
            assert!(
                SCALAR_ROWS.iter().any(|r| r.ty == ty && r.order == order),
                "{ty} {order:?} on {isa} has no scalar twin"
            );
            assert_eq!(
                rows.iter()
                    .filter(|r| (r.0, r.1, r.2) == (ty, order, isa))
                    .count(),
                1,
                "{ty} {order:?} {isa} listed twice"
            );
        }
    }

    #[test]
    fn lookups_follow_fallbacks() {
        use GgmlType as T;
        // Orders a type has no kernel for sum like Single.
        assert_eq!(effective_order(T::Q8_0, DotOrder::Tiled), DotOrder::Single);
        assert_eq!(effective_order(T::Q6_K, DotOrder::Gemm4), DotOrder::Single);
        assert_eq!(effective_order(T::Q4_K, DotOrder::Gemm4), DotOrder::Gemm4);
        assert_eq!(effective_order(T::MXFP4, DotOrder::Gemm4), DotOrder::Gemm4);
        assert_eq!(effective_order(T::MXFP4, DotOrder::Tiled), DotOrder::Single);
        let k = kernels(T::Q6_K, DotOrder::Gemm4).unwrap();
        assert_eq!(k.order, DotOrder::Single);
        assert_eq!(k.act, T::Q8_K);
        // The active set is the best available along the fallbacks.
        for ty in [T::Q4_0, T::Q4_1, T::Q4_K, T::Q6_K, T::MXFP4, T::F16] {
            let k = kernels(ty, DotOrder::Single).unwrap();
            assert!(isa::active().includes(k.isa), "{ty}: {:?}", k.isa);
            let best = isa::active()
                .fallbacks()
                .find(|&i| kernels_at(ty, DotOrder::Single, i).is_some())
                .unwrap();
            assert_eq!(k.isa, best, "{ty}");
        }
        assert!(kernels(T::Q8_K, DotOrder::Single).is_none());
        assert!(kernels(T::IQ2_XS, DotOrder::Single).is_none());
        assert!(scalar(T::Q4_K, DotOrder::Tiled).is_some());
    }
}
