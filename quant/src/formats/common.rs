//! Helpers shared by the block formats: byte parsing, the `Block` trait and ggml's
//! rounding primitive.
//!
//! Blocks come straight from an mmap, so nothing here assumes alignment: every multi-byte
//! field is assembled with `from_le_bytes` (GGUF is little-endian by definition).

use crate::GgmlType;

/// Elements per K-quant super-block (`QK_K` in ggml).
pub const QK_K: usize = 256;

/// A fixed-size ggml block: `BLOCK_ELEMS` values stored in `BYTES` bytes.
///
/// `read`/`write` convert between the on-disk little-endian bytes and the `#[repr(C)]`
/// struct, so the struct's own alignment never matters for the mmap.
pub trait Block: Sized + Copy {
    /// The ggml type this block encodes.
    const TYPE: GgmlType;
    /// Values per block.
    const BLOCK_ELEMS: usize;
    /// Serialized size in bytes (equals `size_of::<Self>()`, asserted per format).
    const BYTES: usize;
    /// Parses one block from the first `BYTES` bytes of `b` (panics if `b` is shorter).
    fn read(b: &[u8]) -> Self;
    /// Serializes into the first `BYTES` bytes of `out` (panics if `out` is shorter).
    fn write(&self, out: &mut [u8]);
    /// ggml's reference quantizer for one block (`quantize_row_*_ref`, no importance
    /// matrix) of the first `BLOCK_ELEMS` values of `x`.
    fn quantize(x: &[f32]) -> Self;
    /// ggml's dequantizer for one block (`dequantize_row_*`) into `y[..BLOCK_ELEMS]`.
    fn dequantize(&self, y: &mut [f32]);
}

#[inline(always)]
pub(crate) fn rd_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

#[inline(always)]
pub(crate) fn rd_arr<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[off..off + N]);
    a
}

#[inline(always)]
pub(crate) fn rd_i8_arr<const N: usize>(b: &[u8], off: usize) -> [i8; N] {
    let mut a = [0i8; N];
    for (d, s) in a.iter_mut().zip(&b[off..off + N]) {
        *d = *s as i8;
    }
    a
}

#[inline(always)]
pub(crate) fn wr_i8_arr(out: &mut [u8], off: usize, a: &[i8]) {
    for (d, s) in out[off..off + a.len()].iter_mut().zip(a) {
        *d = *s as u8;
    }
}

/// Number of blocks in a row of quantized bytes and its dequantized length; panics with a
/// clear message when the two slices disagree (the checked entry points live in `lib.rs`).
#[inline]
pub(crate) fn check_row<B: Block>(bytes: usize, elems: usize) -> usize {
    assert!(
        elems.is_multiple_of(B::BLOCK_ELEMS) && bytes == elems / B::BLOCK_ELEMS * B::BYTES,
        "{}: {} elements do not match {} bytes",
        B::TYPE,
        elems,
        bytes
    );
    elems / B::BLOCK_ELEMS
}

/// Dequantizes a whole row block by block with `f`.
#[inline]
pub(crate) fn dequantize_with<B: Block>(src: &[u8], dst: &mut [f32], f: impl Fn(&B, &mut [f32])) {
    check_row::<B>(src.len(), dst.len());
    for (b, y) in src
        .chunks_exact(B::BYTES)
        .zip(dst.chunks_exact_mut(B::BLOCK_ELEMS))
    {
        f(&B::read(b), y);
    }
}

/// Dequantizes a whole row of `B` blocks (`src.len() == dst.len() / B::BLOCK_ELEMS *
/// B::BYTES`).
pub fn dequantize_row_of<B: Block>(src: &[u8], dst: &mut [f32]) {
    dequantize_with::<B>(src, dst, |b, y| b.dequantize(y));
}

/// Quantizes a whole row into `B` blocks with ggml's reference algorithm.
pub fn quantize_row_of<B: Block>(src: &[f32], dst: &mut [u8]) {
    quantize_with::<B>(src, dst, B::quantize);
}

/// Quantizes a whole row block by block with `f`.
#[inline]
pub(crate) fn quantize_with<B: Block>(src: &[f32], dst: &mut [u8], f: impl Fn(&[f32]) -> B) {
    check_row::<B>(dst.len(), src.len());
    for (x, b) in src
        .chunks_exact(B::BLOCK_ELEMS)
        .zip(dst.chunks_exact_mut(B::BYTES))
    {
        f(x).write(b);
    }
}

/// Checks that a weight row and an activation row hold the same number of elements and
/// returns the number of blocks (weight and activation blocks have equal size in ggml).
#[inline]
pub(crate) fn check_dot<W: Block, A: Block>(w: &[u8], a: &[u8]) -> usize {
    assert_eq!(W::BLOCK_ELEMS, A::BLOCK_ELEMS);
    assert!(
        w.len().is_multiple_of(W::BYTES)
            && a.len().is_multiple_of(A::BYTES)
            && w.len() / W::BYTES == a.len() / A::BYTES,
        "vec_dot {}x{}: {} and {} bytes hold different element counts",
        W::TYPE,
        A::TYPE,
        w.len(),
        a.len()
    );
    w.len() / W::BYTES
}

/// ggml's `nearest_int`: round-half-to-even via the 1.5·2^23 magic constant.
///
/// Kept bit-for-bit (including its behaviour outside ±2^22, where ggml only asserts in
/// debug builds) because every K-quant search depends on this exact rounding.
#[inline(always)]
pub fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12_582_912.0f32;
    (val.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// C's `MAX(a, b)` macro (`a > b ? a : b`), which treats NaN differently from `f32::max`.
#[inline(always)]
pub(crate) fn c_max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}
