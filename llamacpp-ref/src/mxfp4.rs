//! ggml's MXFP4 functions beyond its type traits, for proving `quant`'s MXFP4 twins bit
//! for bit and timing its kernels against ggml's: the reference quantizer and
//! dequantizer (ggml-base), the generic C `vec_dot`, the 4x8 activation quantizer and the
//! repacked `mxfp4_8x8_q8_0` gemv and gemm that llama.cpp's x86 CPU backend runs for MXFP4
//! matrices (ggml-cpu's `repack.cpp`; exported C symbols of the static libraries, declared
//! here since the bindings do not cover them).
//!
//! Every function checks its slice sizes first, so C never reads or writes past them, and
//! [`crate::cpu_mismatch`] before entering ggml.

use std::ffi::{c_int, c_void};

use llama_cpp_sys_2 as sys;

use crate::RefError;

/// Elements per MXFP4 (and Q8_0) block.
const QK: usize = 32;
/// Bytes of a `block_mxfp4`, a `block_q8_0`, a `block_q8_0x4` (four rows interleaved).
const MXFP4_BYTES: usize = 17;
const Q8_0_BYTES: usize = 34;
const Q8_0X4_BYTES: usize = 4 * Q8_0_BYTES;

extern "C" {
    fn quantize_row_mxfp4_ref(x: *const f32, y: *mut c_void, k: i64);
    fn dequantize_row_mxfp4(x: *const c_void, y: *mut f32, k: i64);
    fn ggml_vec_dot_mxfp4_q8_0_generic(
        n: c_int,
        s: *mut f32,
        bs: usize,
        vx: *const c_void,
        bx: usize,
        vy: *const c_void,
        by: usize,
        nrc: c_int,
    );
    fn ggml_quantize_mat_q8_0_4x8(x: *const f32, vy: *mut c_void, k: i64);
    fn ggml_gemv_mxfp4_8x8_q8_0(
        n: c_int,
        s: *mut f32,
        bs: usize,
        vx: *const c_void,
        vy: *const c_void,
        nr: c_int,
        nc: c_int,
    );
    fn ggml_gemm_mxfp4_8x8_q8_0(
        n: c_int,
        s: *mut f32,
        bs: usize,
        vx: *const c_void,
        vy: *const c_void,
        nr: c_int,
        nc: c_int,
    );
}

fn bad(what: String) -> RefError {
    RefError::InvalidArgument(format!("ggml (MXFP4, IQ4_NL): {what}"))
}

/// Blocks in `n` elements: whole blocks, and `n` fits a C `int`.
pub(crate) fn blocks(n: usize) -> Result<usize, RefError> {
    if n == 0 || !n.is_multiple_of(QK) || n > c_int::MAX as usize {
        return Err(bad(format!("{n} elements is not a whole number of blocks")));
    }
    Ok(n / QK)
}

pub(crate) fn expect(what: &str, want: usize, got: usize) -> Result<(), RefError> {
    if want != got {
        return Err(bad(format!(
            "{what}: {got} bytes or values, {want} expected"
        )));
    }
    Ok(())
}

/// Checks the CPU and sets up ggml-cpu's tables (the E8M0 scales come from one on x86).
pub(crate) fn enter() -> Result<(), RefError> {
    crate::check_cpu()?;
    // SAFETY: idempotent and thread-safe initialisation of ggml-cpu's lookup tables.
    unsafe { sys::ggml_cpu_init() };
    Ok(())
}

/// ggml's C entry points of one 32-element table format (MXFP4 here, IQ4_NL in
/// [`crate::iq4_nl`]), which the checked wrappers below serve alike.
pub(crate) struct Fmt {
    /// Bytes per block.
    pub bytes: usize,
    pub quantize_ref: unsafe extern "C" fn(*const f32, *mut c_void, i64),
    pub dequantize: unsafe extern "C" fn(*const c_void, *mut f32, i64),
    pub vec_dot_generic: unsafe extern "C" fn(
        c_int,
        *mut f32,
        usize,
        *const c_void,
        usize,
        *const c_void,
        usize,
        c_int,
    ),
    pub gemv: GemFn,
    pub gemm: GemFn,
}

/// ggml's repacked `gemv`/`gemm` signature.
pub(crate) type GemFn =
    unsafe extern "C" fn(c_int, *mut f32, usize, *const c_void, *const c_void, c_int, c_int);

const MXFP4: Fmt = Fmt {
    bytes: MXFP4_BYTES,
    quantize_ref: quantize_row_mxfp4_ref,
    dequantize: dequantize_row_mxfp4,
    vec_dot_generic: ggml_vec_dot_mxfp4_q8_0_generic,
    gemv: ggml_gemv_mxfp4_8x8_q8_0,
    gemm: ggml_gemm_mxfp4_8x8_q8_0,
};

/// `quantize_row_mxfp4_ref`: `x` into `out` (`x.len() / 32 * 17` bytes).
pub fn quantize_row_ref(x: &[f32], out: &mut [u8]) -> Result<(), RefError> {
    quantize_row_ref_of(&MXFP4, x, out)
}

/// `f`'s reference quantizer: `x` into `out` (whole blocks).
pub(crate) fn quantize_row_ref_of(f: &Fmt, x: &[f32], out: &mut [u8]) -> Result<(), RefError> {
    let nb = blocks(x.len())?;
    expect("quantized row", nb * f.bytes, out.len())?;
    enter()?;
    // SAFETY: `out` holds exactly the blocks of `x.len()` elements.
    unsafe { (f.quantize_ref)(x.as_ptr(), out.as_mut_ptr().cast(), x.len() as i64) };
    Ok(())
}

/// `dequantize_row_mxfp4`: the blocks of `q` into `out` (32 values per 17 bytes).
pub fn dequantize_row(q: &[u8], out: &mut [f32]) -> Result<(), RefError> {
    dequantize_row_of(&MXFP4, q, out)
}

/// `f`'s dequantizer: the blocks of `q` into `out`.
pub(crate) fn dequantize_row_of(f: &Fmt, q: &[u8], out: &mut [f32]) -> Result<(), RefError> {
    let nb = blocks(out.len())?;
    expect("quantized row", nb * f.bytes, q.len())?;
    enter()?;
    // SAFETY: `q` holds exactly the blocks of `out.len()` elements.
    unsafe { (f.dequantize)(q.as_ptr().cast(), out.as_mut_ptr(), out.len() as i64) };
    Ok(())
}

/// `ggml_vec_dot_mxfp4_q8_0_generic`: ggml's portable C dot of one MXFP4 row `w` and one
/// Q8_0 row `a` of `n` elements.
pub fn vec_dot_generic(n: usize, w: &[u8], a: &[u8]) -> Result<f32, RefError> {
    vec_dot_generic_of(&MXFP4, n, w, a)
}

/// `f`'s generic C dot of one row `w` and one Q8_0 row `a` of `n` elements.
pub(crate) fn vec_dot_generic_of(f: &Fmt, n: usize, w: &[u8], a: &[u8]) -> Result<f32, RefError> {
    let nb = blocks(n)?;
    expect("weight row", nb * f.bytes, w.len())?;
    expect("activation row", nb * Q8_0_BYTES, a.len())?;
    enter()?;
    let mut s = 0.0f32;
    // SAFETY: both rows hold exactly `n` elements; one row, so the strides are unused.
    unsafe {
        (f.vec_dot_generic)(
            n as c_int,
            &mut s,
            0,
            w.as_ptr().cast(),
            0,
            a.as_ptr().cast(),
            0,
            1,
        )
    };
    Ok(s)
}

/// `ggml_quantize_mat_q8_0_4x8`: four rows of `k` floats (`x`, back to back) into
/// `block_q8_0x4`s (`out`: `k / 32` of 136 bytes: the four rows' f16 scales, then 128
/// quants, row `r`'s elements `8j..8j + 8` of the block at `32 j + 8 r`), what llama.cpp's
/// repacked `gemm` takes for each group of four tokens.
pub fn quantize_mat_q8_0_4x8(x: &[f32], k: usize, out: &mut [u8]) -> Result<(), RefError> {
    let nb = blocks(k)?;
    expect("four rows", 4 * k, x.len())?;
    expect("block_q8_0x4 row", nb * Q8_0X4_BYTES, out.len())?;
    enter()?;
    // SAFETY: `x` holds four rows of `k`, `out` the `k / 32` interleaved blocks.
    unsafe { ggml_quantize_mat_q8_0_4x8(x.as_ptr(), out.as_mut_ptr().cast(), k as i64) };
    Ok(())
}

/// The rows of `block_q8_0x4`s (as [`quantize_mat_q8_0_4x8`] writes them) as four plain
/// Q8_0 rows, back to back.
pub fn q8_0x4_rows(x4: &[u8]) -> Vec<u8> {
    let nb = x4.len() / Q8_0X4_BYTES;
    let mut out = vec![0u8; 4 * nb * Q8_0_BYTES];
    for (b, blk) in x4.chunks_exact(Q8_0X4_BYTES).enumerate() {
        for r in 0..4 {
            let dst = &mut out[(r * nb + b) * Q8_0_BYTES..(r * nb + b + 1) * Q8_0_BYTES];
            dst[..2].copy_from_slice(&blk[2 * r..2 * r + 2]);
            for j in 0..4 {
                let src = 8 + 32 * j + 8 * r;
                dst[2 + 8 * j..2 + 8 * j + 8].copy_from_slice(&blk[src..src + 8]);
            }
        }
    }
    out
}

/// llama.cpp's repacking of MXFP4 rows for its x86 kernels (`block_mxfp4x8`): per group
/// of eight rows and block, the eight exponents, then the rows' 16 quant bytes in chunks
/// of eight (chunk `i` of 16 from row `i % 8`, bytes `8 (i / 8)..`). `rows` holds whole
/// groups of eight rows of `n` elements.
pub fn repack_8x8(rows: &[u8], n: usize) -> Result<Vec<u8>, RefError> {
    repack_8x8_of(rows, n, MXFP4_BYTES - 16)
}

/// The 8x8 repacking of rows of 32-element blocks of `scale` scale bytes and 16 quant
/// bytes (MXFP4: 1, IQ4_NL: 2): per group of eight rows and block, the eight scales, then
/// the quants in chunks of eight bytes, chunk `i` of 16 from row `i % 8`.
pub(crate) fn repack_8x8_of(rows: &[u8], n: usize, scale: usize) -> Result<Vec<u8>, RefError> {
    let nb = blocks(n)?;
    let bytes = scale + 16;
    let rb = nb * bytes;
    if rows.is_empty() || !rows.len().is_multiple_of(8 * rb) {
        return Err(bad(format!(
            "{} bytes are not groups of eight rows",
            rows.len()
        )));
    }
    let mut out = vec![0u8; rows.len()];
    for (src, dst) in rows.chunks_exact(8 * rb).zip(out.chunks_exact_mut(8 * rb)) {
        for b in 0..nb {
            let blk = &mut dst[b * 8 * bytes..(b + 1) * 8 * bytes];
            let at = |r: usize| r * rb + b * bytes;
            for r in 0..8 {
                blk[r * scale..(r + 1) * scale].copy_from_slice(&src[at(r)..at(r) + scale]);
            }
            let qs = 8 * scale;
            for i in 0..16 {
                let (r, off) = (i % 8, scale + 8 * (i / 8));
                blk[qs + 8 * i..qs + 8 * i + 8].copy_from_slice(&src[at(r) + off..at(r) + off + 8]);
            }
        }
    }
    Ok(out)
}

/// Checks a repacked matrix of `nc` rows of `n` elements in blocks of `bytes`; returns
/// `n`'s block count.
fn check_packed_of(n: usize, packed: &[u8], nc: usize, bytes: usize) -> Result<usize, RefError> {
    let nb = blocks(n)?;
    if nc == 0 || !nc.is_multiple_of(8) || nc > c_int::MAX as usize {
        return Err(bad(format!("{nc} rows are not groups of eight")));
    }
    expect("repacked matrix", nc * nb * bytes, packed.len())?;
    Ok(nb)
}

/// `ggml_gemv_mxfp4_8x8_q8_0`: the `nc` rows of a matrix repacked by [`repack_8x8`]
/// against one Q8_0 activation row `a`, into `out[..nc]`.
pub fn gemv(n: usize, packed: &[u8], nc: usize, a: &[u8], out: &mut [f32]) -> Result<(), RefError> {
    gemv_of(&MXFP4, n, packed, nc, a, out)
}

/// `f`'s repacked gemv (see [`gemv`]).
pub(crate) fn gemv_of(
    f: &Fmt,
    n: usize,
    packed: &[u8],
    nc: usize,
    a: &[u8],
    out: &mut [f32],
) -> Result<(), RefError> {
    let nb = check_packed_of(n, packed, nc, f.bytes)?;
    expect("activation row", nb * Q8_0_BYTES, a.len())?;
    expect("outputs", nc, out.len())?;
    enter()?;
    // SAFETY: sizes checked above: `packed` holds nc / 8 groups of nb blocks, `a` one row
    // of nb blocks, `out` nc floats (gemv writes s[x * 8..x * 8 + 8] per group).
    unsafe {
        (f.gemv)(
            n as c_int,
            out.as_mut_ptr(),
            nc,
            packed.as_ptr().cast(),
            a.as_ptr().cast(),
            1,
            nc as c_int,
        )
    };
    Ok(())
}

/// `ggml_gemm_mxfp4_8x8_q8_0`: the `nc` rows of a matrix repacked by [`repack_8x8`]
/// against `nr` tokens (a multiple of four) whose activations `a4` are groups of four
/// quantized by [`quantize_mat_q8_0_4x8`], back to back; token `t`'s results into
/// `out[t * nc..(t + 1) * nc]`.
pub fn gemm(
    n: usize,
    packed: &[u8],
    nc: usize,
    a4: &[u8],
    nr: usize,
    out: &mut [f32],
) -> Result<(), RefError> {
    gemm_of(&MXFP4, (n, packed, nc), a4, nr, out)
}

/// `f`'s repacked gemm (see [`gemm`]): `(n, packed, nc)` as there.
pub(crate) fn gemm_of(
    f: &Fmt,
    (n, packed, nc): (usize, &[u8], usize),
    a4: &[u8],
    nr: usize,
    out: &mut [f32],
) -> Result<(), RefError> {
    let nb = check_packed_of(n, packed, nc, f.bytes)?;
    if nr == 0 || !nr.is_multiple_of(4) || nr > c_int::MAX as usize {
        return Err(bad(format!("{nr} tokens are not groups of four")));
    }
    expect("activations", nr / 4 * nb * Q8_0X4_BYTES, a4.len())?;
    expect("outputs", nr * nc, out.len())?;
    enter()?;
    // SAFETY: sizes checked above; gemm writes s[t * bs + col] for t < nr, col < nc.
    unsafe {
        (f.gemm)(
            n as c_int,
            out.as_mut_ptr(),
            nc,
            packed.as_ptr().cast(),
            a4.as_ptr().cast(),
            nr as c_int,
            nc as c_int,
        )
    };
    Ok(())
}
