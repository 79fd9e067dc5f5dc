//! What a kernel takes and promises: the dot-product and tile signatures, the per-block
//! activation data a tile may be given, and the checks that make the `unsafe` SIMD
//! bodies safe to call (every byte they read is validated here first).

use crate::formats::common::Block;
use crate::GgmlType;

/// A dot-product kernel: weight row bytes, activation row bytes (in the weight type's
/// `vec_dot_type`) to f32. Panics when the two rows hold different element counts.
pub type DotFn = fn(&[u8], &[u8]) -> f32;

/// Most activation rows (tokens) one [`TileFn`] call of llama.cpp's orders takes.
pub const TILE_MAX_TOKENS: usize = 8;
/// Most activation rows one tile call of the fast order takes: its kernels transpose a
/// block of eight weight rows once per call, so long calls amortise that.
pub const FAST_TILE_TOKENS: usize = 64;
/// Most weight rows one [`TileFn`] call takes (each kernel set says how many its tile
/// takes: two for llama.cpp's orders, eight for [`crate::DotOrder::Fast`], whose kernels
/// put eight rows in the lanes of one register).
pub const TILE_MAX_ROWS: usize = 8;
/// Weight rows the tiles of llama.cpp's orders take.
pub(crate) const EXACT_TILE_ROWS: usize = 2;

/// `w_rows` (1..=[`TILE_MAX_ROWS`]) consecutive weight rows (`w` holds them back to back)
/// against `n` (1..=[`TILE_MAX_TOKENS`]) activation rows that start `a_stride` bytes apart
/// in `a`: `out[r * n + c] = dot(w row r, a[c * a_stride..])`, `out.len() = w_rows * n`.
/// Each weight block is unpacked once and reused for every activation row, each
/// activation block loaded once for both weight rows (the prompt-processing tile), and
/// each output is bit-identical to the one-row [`DotFn`] of the same kernel set on that
/// pair alone, so results never depend on how rows were batched. Activation bytes must
/// come from `quantize_activations` (quants in `-127..=127`). Panics on inconsistent
/// lengths.
///
/// `side` optionally carries per-block data precomputed once per activation row (see
/// [`ActSide`]); the results are the same bits with or without it.
pub type TileFn =
    fn(w: &[u8], w_rows: usize, a: &[u8], a_stride: usize, side: ActSide<'_>, out: &mut [f32]);

/// A [`TileFn`] that writes its results into a caller's matrix instead of a packed
/// slice: result (row `r`, token `c`) goes to `out[c * out_stride + r]` (tokens as rows,
/// as a model's activations are laid out), `n` tokens. The fast order's kernels have
/// one: eight rows of a token are then one vector store.
///
/// # Safety
/// `out[c * out_stride + r]` for every `r < w_rows`, `c < n` must be valid for writes
/// and written by nobody else during the call; the other arguments are checked as for
/// [`TileFn`] (`n` is the token count the activations and `side` are checked against).
pub type TileIntoFn = unsafe fn(
    w: &[u8],
    w_rows: usize,
    a: &[u8],
    a_stride: usize,
    side: ActSide<'_>,
    n: usize,
    out: *mut f32,
    out_stride: usize,
);

/// Per-block data of the activation rows of a [`TileFn`] call, computed once per matrix
/// product instead of once per weight row. Each field is either empty or covers every row
/// of the call, rows back to back.
#[derive(Clone, Copy, Debug, Default)]
pub struct ActSide<'a> {
    /// Q8_0/Q8_1 block scales widened to f32 ([`scales_per_block`] per block).
    pub scales: &'a [f32],
    /// For Q4_0/Q5_0/Q8_0/MXFP4 weights: `-offset` times each block's eight lane sums,
    /// which lets the VNNI kernels use unsigned weights ([`offset_sums`]); for the kernels
    /// that form one integer sum per block (the fast order's, MXFP4's repacked order's)
    /// one sum per block, `-offset` times the block's sum ([`fast_offset_sums`]).
    pub sums: &'a [i32],
}

/// f32 scales per block that [`activation_scales`] writes for activation type `act`:
/// 1 for Q8_0 (`d`), 2 for Q8_1 (`d`, `s`), 0 otherwise.
pub fn scales_per_block(act: GgmlType) -> usize {
    match act {
        GgmlType::Q8_0 => 1,
        GgmlType::Q8_1 => 2,
        _ => 0,
    }
}

/// Appends the f16 block scales of one quantized activation row `a` (type `act`) widened
/// to f32 (exact) to `out`, in the layout a [`TileFn`] takes.
pub fn activation_scales(act: GgmlType, a: &[u8], out: &mut Vec<f32>) {
    let per = scales_per_block(act);
    if per == 0 {
        return;
    }
    for b in a.chunks_exact(act.type_size()) {
        for k in 0..per {
            out.push(crate::f16::f16_to_f32(u16::from_le_bytes([
                b[2 * k],
                b[2 * k + 1],
            ])));
        }
    }
}

/// The weight quant offset of the signed 32-element formats (Q4_0: 8, Q5_0: 16, Q8_0
/// as unsigned bytes: 128, MXFP4's table values: 12), 0 for other types.
pub fn signed_offset(wty: GgmlType) -> i32 {
    match wty {
        GgmlType::Q4_0 => 8,
        GgmlType::Q5_0 => 16,
        GgmlType::Q8_0 => 128,
        GgmlType::MXFP4 => crate::formats::mxfp4::OFFSET,
        GgmlType::IQ4_NL => crate::formats::iq4_nl::OFFSET,
        _ => 0,
    }
}

/// Appends, for each Q8_0 block of the activation row `a`, `-offset(wty) * Σ y[4l..4l+4]`
/// for its eight lanes `l` (see [`ActSide::sums`]); nothing for other weight types.
pub fn offset_sums(wty: GgmlType, a: &[u8], out: &mut Vec<i32>) {
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

/// Appends, for each Q8_0 block of the activation row `a`, `-offset(wty) * Σ y` over the
/// whole block (the fast order's [`ActSide::sums`]); nothing for other weight types.
pub fn fast_offset_sums(wty: GgmlType, a: &[u8], out: &mut Vec<i32>) {
    let off = signed_offset(wty);
    if off == 0 {
        return;
    }
    for b in a.chunks_exact(GgmlType::Q8_0.type_size()) {
        let s: i32 = b[2..].iter().map(|&q| q as i8 as i32).sum();
        out.push(-off * s);
    }
}

/// A validated [`TileFn`] call: block count, weight row stride in bytes, rows, columns,
/// scale row stride in floats (0 when no scales were passed), and the offset sums.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) struct TileCall {
    pub nb: usize,
    pub wstride: usize,
    pub rows: usize,
    pub cols: usize,
    pub ad_stride: usize,
    // The offset sums are for the VNNI kernels; other architectures never read them.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub use_sums: bool,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub sums: *const i32,
}

/// Validates a [`TileFn`] call for weight blocks `W` and activation blocks `A`: after
/// this, every byte, scale and sum the kernel reads is inside the slices it was given.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) fn check_tile<W: Block, A: Block>(
    w: &[u8],
    rows: usize,
    a: &[u8],
    stride: usize,
    side: ActSide<'_>,
    out_len: usize,
) -> TileCall {
    check_tile_rows::<W, A>(
        w,
        rows,
        a,
        stride,
        side,
        out_len,
        (EXACT_TILE_ROWS, TILE_MAX_TOKENS),
        8,
    )
}

/// [`check_tile`] for tiles of up to `max.0` weight rows and `max.1` activation rows whose
/// offset sums (when given) are `sums_per_block` per activation block.
#[allow(clippy::too_many_arguments)]
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) fn check_tile_rows<W: Block, A: Block>(
    w: &[u8],
    rows: usize,
    a: &[u8],
    stride: usize,
    side: ActSide<'_>,
    out_len: usize,
    max: (usize, usize),
    sums_per_block: usize,
) -> TileCall {
    let (max_rows, max_tokens) = max;
    assert!(
        (1..=max_rows).contains(&rows) && out_len.is_multiple_of(rows),
        "tile: {rows} weight rows ({max_rows} at most), {out_len} outputs"
    );
    let n = out_len / rows;
    assert!(
        (1..=max_tokens).contains(&n),
        "tile: {n} activation rows (1..={max_tokens} allowed)"
    );
    assert!(
        w.len().is_multiple_of(rows) && (w.len() / rows).is_multiple_of(W::BYTES),
        "tile {}: {} weight bytes are not {rows} rows of whole blocks",
        W::TYPE,
        w.len()
    );
    let wstride = w.len() / rows;
    let nb = wstride / W::BYTES;
    let row = nb * A::BYTES;
    assert!(
        (n == 1 || stride >= row) && a.len() >= (n - 1) * stride + row,
        "tile {}x{}: {} activation bytes, stride {stride}, cannot hold {n} rows of {row}",
        W::TYPE,
        A::TYPE,
        a.len()
    );
    let per = scales_per_block(A::TYPE);
    let ad_stride = if side.scales.is_empty() || per == 0 {
        0
    } else {
        assert!(
            side.scales.len() == n * nb * per,
            "tile {}: {} activation scales for {n} rows of {nb} blocks",
            W::TYPE,
            side.scales.len()
        );
        nb * per
    };
    let use_sums = !side.sums.is_empty() && signed_offset(W::TYPE) != 0;
    if use_sums {
        assert!(
            side.sums.len() == n * nb * sums_per_block,
            "tile {}: {} offset sums for {n} rows of {nb} blocks",
            W::TYPE,
            side.sums.len()
        );
    }
    TileCall {
        nb,
        wstride,
        rows,
        cols: n,
        ad_stride,
        use_sums,
        sums: side.sums.as_ptr(),
    }
}

/// One entry of the kernel table (`crate::kernels`): the dot kernel and, where there is
/// one, the tile kernel for weights of `ty` summed in `order` on `isa`. The functions of a
/// SIMD entry assume their ISA: the table hands them out only where it was detected.
#[derive(Clone, Copy)]
pub(crate) struct KernelRow {
    pub ty: GgmlType,
    pub order: crate::order::DotOrder,
    pub isa: crate::isa::Isa,
    pub dot: DotFn,
    pub tile: Option<TileFn>,
    /// The tile kernel wants [`ActSide::sums`].
    pub offset_sums: bool,
    /// ... one per activation block ([`fast_offset_sums`]: the kernels that form one
    /// integer sum per block), else eight ([`offset_sums`]).
    pub block_sums: bool,
    /// Most weight rows the tile takes.
    pub tile_rows: usize,
    /// Most activation rows the tile takes.
    pub tile_tokens: usize,
    /// The tile writing into a strided matrix, where the row has one.
    pub tile_into: Option<TileIntoFn>,
    /// `tile_into` for weights repacked by [`crate::pack8`] (`packed_rows` rows per call,
    /// or one group of eight).
    pub packed_into: Option<TileIntoFn>,
    /// Rows `packed_into` takes per call at most: 8 (one group) or 16 (two).
    pub packed_rows: usize,
    /// Rows `packed_into` takes per call at most when given one or two tokens (whole
    /// groups of eight, at least `packed_rows`): the decode stream.
    pub stream_rows: usize,
    /// Most activation rows one `packed_into` call takes.
    pub packed_tokens: usize,
}
