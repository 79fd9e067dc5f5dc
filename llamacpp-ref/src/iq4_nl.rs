//! ggml's IQ4_NL functions beyond its type traits, for proving `quant`'s IQ4_NL twins bit
//! for bit: the quantizer `llama-quantize` runs (`quantize_iq4_nl`) and the reference one,
//! the dequantizer, the generic C `vec_dot`, and the repacked `iq4_nl_8x8_q8_0` gemv and
//! gemm llama.cpp's x86 CPU backend runs for IQ4_NL matrices (exported C symbols of the
//! static libraries, declared here since the bindings do not cover them). The checks,
//! the repacking and the 4x8 activation quantizer are MXFP4's ([`crate::mxfp4`]): the two
//! formats share ggml's code, only the table and the scale differing.

use std::ffi::{c_int, c_void};

use crate::mxfp4::{
    blocks, dequantize_row_of, enter, expect, gemm_of, gemv_of, quantize_row_ref_of, repack_8x8_of,
    vec_dot_generic_of, Fmt,
};
use crate::RefError;

/// Bytes of a `block_iq4_nl`: the f16 scale and 16 bytes of indices.
const IQ4_NL_BYTES: usize = 18;

extern "C" {
    fn quantize_row_iq4_nl_ref(x: *const f32, y: *mut c_void, k: i64);
    fn quantize_iq4_nl(
        src: *const f32,
        dst: *mut c_void,
        nrow: i64,
        n_per_row: i64,
        imatrix: *const f32,
    ) -> usize;
    fn dequantize_row_iq4_nl(x: *const c_void, y: *mut f32, k: i64);
    fn ggml_vec_dot_iq4_nl_q8_0_generic(
        n: c_int,
        s: *mut f32,
        bs: usize,
        vx: *const c_void,
        bx: usize,
        vy: *const c_void,
        by: usize,
        nrc: c_int,
    );
    fn ggml_gemv_iq4_nl_8x8_q8_0(
        n: c_int,
        s: *mut f32,
        bs: usize,
        vx: *const c_void,
        vy: *const c_void,
        nr: c_int,
        nc: c_int,
    );
    fn ggml_gemm_iq4_nl_8x8_q8_0(
        n: c_int,
        s: *mut f32,
        bs: usize,
        vx: *const c_void,
        vy: *const c_void,
        nr: c_int,
        nc: c_int,
    );
}

const IQ4_NL: Fmt = Fmt {
    bytes: IQ4_NL_BYTES,
    quantize_ref: quantize_row_iq4_nl_ref,
    dequantize: dequantize_row_iq4_nl,
    vec_dot_generic: ggml_vec_dot_iq4_nl_q8_0_generic,
    gemv: ggml_gemv_iq4_nl_8x8_q8_0,
    gemm: ggml_gemm_iq4_nl_8x8_q8_0,
};

/// `quantize_row_iq4_nl_ref`: `x` into `out` (`x.len() / 32 * 18` bytes).
pub fn quantize_row_ref(x: &[f32], out: &mut [u8]) -> Result<(), RefError> {
    quantize_row_ref_of(&IQ4_NL, x, out)
}

/// `quantize_iq4_nl` of one row without an importance matrix, what `llama-quantize`
/// writes.
pub fn quantize_row(x: &[f32], out: &mut [u8]) -> Result<(), RefError> {
    let nb = blocks(x.len())?;
    expect("quantized row", nb * IQ4_NL_BYTES, out.len())?;
    enter()?;
    // SAFETY: one row of `x.len()` elements into exactly its blocks; no importance matrix.
    let n = unsafe {
        quantize_iq4_nl(
            x.as_ptr(),
            out.as_mut_ptr().cast(),
            1,
            x.len() as i64,
            std::ptr::null(),
        )
    };
    expect("bytes written", out.len(), n)
}

/// `dequantize_row_iq4_nl`: the blocks of `q` into `out` (32 values per 18 bytes).
pub fn dequantize_row(q: &[u8], out: &mut [f32]) -> Result<(), RefError> {
    dequantize_row_of(&IQ4_NL, q, out)
}

/// `ggml_vec_dot_iq4_nl_q8_0_generic`: ggml's portable C dot of one IQ4_NL row `w` and
/// one Q8_0 row `a` of `n` elements.
pub fn vec_dot_generic(n: usize, w: &[u8], a: &[u8]) -> Result<f32, RefError> {
    vec_dot_generic_of(&IQ4_NL, n, w, a)
}

/// llama.cpp's repacking of IQ4_NL rows for its x86 kernels (`block_iq4_nlx8`: per group
/// of eight rows and block, the eight f16 scales, then the quants in chunks of eight).
pub fn repack_8x8(rows: &[u8], n: usize) -> Result<Vec<u8>, RefError> {
    repack_8x8_of(rows, n, 2)
}

/// `ggml_gemv_iq4_nl_8x8_q8_0`: the `nc` rows of a matrix repacked by [`repack_8x8`]
/// against one Q8_0 activation row `a`, into `out[..nc]`.
pub fn gemv(n: usize, packed: &[u8], nc: usize, a: &[u8], out: &mut [f32]) -> Result<(), RefError> {
    gemv_of(&IQ4_NL, n, packed, nc, a, out)
}

/// `ggml_gemm_iq4_nl_8x8_q8_0`: as [`crate::mxfp4::gemm`], for IQ4_NL rows repacked by
/// [`repack_8x8`] and activations from [`crate::mxfp4::quantize_mat_q8_0_4x8`].
pub fn gemm(
    n: usize,
    packed: &[u8],
    nc: usize,
    a4: &[u8],
    nr: usize,
    out: &mut [f32],
) -> Result<(), RefError> {
    gemm_of(&IQ4_NL, (n, packed, nc), a4, nr, out)
}
