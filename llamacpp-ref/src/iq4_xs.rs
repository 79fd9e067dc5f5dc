//! ggml's IQ4_XS functions beyond its type traits, for proving `quant`'s IQ4_XS twins bit
//! for bit: the quantizer `llama-quantize` runs (`quantize_iq4_xs`), the dequantizer and
//! the generic C `vec_dot` (exported C symbols of the static libraries, declared here
//! since the bindings do not cover them). ggml's x86 `vec_dot` is reached through
//! [`crate::GgmlKernel`].

use std::ffi::{c_int, c_void};

use crate::mxfp4::{enter, expect};
use crate::RefError;

/// Elements and bytes of a `block_iq4_xs`.
const QK_K: usize = 256;
const IQ4_XS_BYTES: usize = 136;
/// Bytes of a `block_q8_K`.
const Q8_K_BYTES: usize = 292;

extern "C" {
    fn quantize_iq4_xs(
        src: *const f32,
        dst: *mut c_void,
        nrow: i64,
        n_per_row: i64,
        imatrix: *const f32,
    ) -> usize;
    fn dequantize_row_iq4_xs(x: *const c_void, y: *mut f32, k: i64);
    fn ggml_vec_dot_iq4_xs_q8_K_generic(
        n: c_int,
        s: *mut f32,
        bs: usize,
        vx: *const c_void,
        bx: usize,
        vy: *const c_void,
        by: usize,
        nrc: c_int,
    );
}

fn super_blocks(n: usize) -> Result<usize, RefError> {
    if n == 0 || !n.is_multiple_of(QK_K) || n > c_int::MAX as usize {
        return Err(RefError::InvalidArgument(format!(
            "{n} elements is not a whole number of IQ4_XS super-blocks"
        )));
    }
    Ok(n / QK_K)
}

/// `quantize_iq4_xs` of one row without an importance matrix, what `llama-quantize`
/// writes (`x.len() / 256 * 136` bytes).
pub fn quantize_row(x: &[f32], out: &mut [u8]) -> Result<(), RefError> {
    let nb = super_blocks(x.len())?;
    expect("quantized row", nb * IQ4_XS_BYTES, out.len())?;
    enter()?;
    // SAFETY: one row of `x.len()` elements into exactly its blocks; no importance matrix.
    let n = unsafe {
        quantize_iq4_xs(
            x.as_ptr(),
            out.as_mut_ptr().cast(),
            1,
            x.len() as i64,
            std::ptr::null(),
        )
    };
    expect("bytes written", out.len(), n)
}

/// `dequantize_row_iq4_xs`: the super-blocks of `q` into `out`.
pub fn dequantize_row(q: &[u8], out: &mut [f32]) -> Result<(), RefError> {
    let nb = super_blocks(out.len())?;
    expect("quantized row", nb * IQ4_XS_BYTES, q.len())?;
    enter()?;
    // SAFETY: `q` holds exactly the blocks of `out.len()` elements.
    unsafe { dequantize_row_iq4_xs(q.as_ptr().cast(), out.as_mut_ptr(), out.len() as i64) };
    Ok(())
}

/// `ggml_vec_dot_iq4_xs_q8_K_generic`: ggml's portable C dot of one IQ4_XS row `w` and
/// one Q8_K row `a` of `n` elements.
pub fn vec_dot_generic(n: usize, w: &[u8], a: &[u8]) -> Result<f32, RefError> {
    let nb = super_blocks(n)?;
    expect("weight row", nb * IQ4_XS_BYTES, w.len())?;
    expect("activation row", nb * Q8_K_BYTES, a.len())?;
    enter()?;
    let mut s = 0.0f32;
    // SAFETY: both rows hold exactly `nb` blocks (checked); one result.
    unsafe {
        ggml_vec_dot_iq4_xs_q8_K_generic(
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
