//! The numeric operations of a transformer layer, each written to return the bits of
//! ggml's x86 CPU backend (llama.cpp's default build, flash attention off) and each with
//! its scalar twin: RMS norm, RoPE, soft-max, SwiGLU and GELU, the f32 x f16 products of
//! attention, and attention over a paged f16 KV cache for one query head.
//!
//! Why bits matter: activations are quantised to int8 before every matrix product, so a
//! last-bit difference now and then moves a value across a rounding boundary, and those
//! flips compound over the layers into top-1 disagreements with llama.cpp on near-ties.
//!
//! ggml picks its code path at compile time; a llama.cpp built for the host uses the
//! AVX-512 path where the CPU has AVX-512 F and DQ, else the AVX2 one. The two differ
//! (vector width, so summation order; the `exp` polynomial's last steps): every function
//! that depends on it takes the [`Flavor`](crate::order::Flavor) to follow. The
//! element-wise functions are exact emulation written with scalar `mul_add` and lane
//! arrays, compiled a second time with FMA enabled where the CPU has it (same bits, the
//! `mul_add` becomes one instruction instead of a library call); the f16 products have
//! AVX2 kernels in `crate::arch`.

pub mod act;
pub mod attention;
pub mod f16;
pub mod norm;
pub mod rope;
pub mod softmax;

/// Defines `$name` to run `$body` (a plain function) compiled with AVX2+FMA where the
/// active ISA has them, and as portable code elsewhere. The results are the same bits:
/// `mul_add` is an exact fused multiply-add either way.
macro_rules! fma_twin {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($a:ident: $t:ty),*) $(-> $r:ty)? = $body:ident) => {
        $(#[$m])*
        $vis fn $name($($a: $t),*) $(-> $r)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn fma($($a: $t),*) $(-> $r)? {
                    $body($($a),*)
                }
                if crate::isa::avx2() {
                    // SAFETY: the active ISA includes AVX2 and FMA (detected at run time).
                    return unsafe { fma($($a),*) };
                }
            }
            $body($($a),*)
        }
    };
}
pub(crate) use fma_twin;
