//! Accumulation orders: which order of float operations a kernel follows, and the
//! horizontal sums that close them. Everything here is pure arithmetic with no
//! dependency on the rest of the crate, so the format twins, the SIMD kernels and the
//! numeric ops all import it and it imports none of them.
//!
//! Integer parts of our kernels are exact, so only their float steps have an order. Three
//! choices fix it, each following what llama.cpp's CPU backend runs on x86:
//!
//! - [`DotOrder`]: for the K-quants, which of llama.cpp's kernels (one-row, tiled GEMM,
//!   repacked 4-token GEMM) a token's dot product reproduces;
//! - [`Flavor`]: whether ggml was compiled for AVX-512 (16-float vectors) or AVX2 (8), which
//!   changes the lane count of its soft-max, attention and `exp`;
//! - [`F16Order`]: which f16 kernel multiplies attention operands (tiled GEMM or
//!   `ggml_vec_dot_f16`);
//! - [`Bf16Order`]: which of ggml's three x86 BF16 products the build has (it follows
//!   the flavor and the CPU's AVX512_BF16).

use std::sync::OnceLock;

/// Which of llama.cpp's x86 kernels a dot product reproduces. For most formats every
/// kernel llama.cpp runs sums in the same order, but for Q4_K and Q6_K it picks between
/// kernels that round differently depending on the number of tokens it multiplies at
/// once (its micro-batch) and, for Q4_K, on a token's place in it, and for MXFP4 on
/// whether the matrix is repacked (`crate::kernels::dot_order_for`). Results are exact
/// either way; following the same kernel gives llama.cpp's bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DotOrder {
    /// The one-row kernels: `ggml_vec_dot_*` (Q6_K, MXFP4 matrices that are not
    /// repacked) and the repacked `gemv_q4_K_8x8`.
    #[default]
    Single,
    /// The tiled K-quant GEMM (`ggml-cpu/tiled`), for micro-batches of 8+ tokens: one
    /// float accumulator, one FMA per super-block.
    Tiled,
    /// The repacked `gemm_q4_K_8x8` for tokens in full groups of four: scales applied per
    /// 64 elements, activations quantized with the 4x8 Q8_K rounding. For MXFP4, the
    /// repacked `gemm_mxfp4_8x8_q8_0` and `gemv_mxfp4_8x8_q8_0`, which sum alike (one
    /// exact integer sum and one FMA per block, activations rounded as by
    /// `quantize_row_q8_0`), for every token of a repacked matrix.
    Gemm4,
    /// For the 32-element formats, not llama.cpp's: one exact integer sum per 32-element
    /// block and one FMA per block (`acc = (dx * dy).mul_add(sumi, acc)`, then `m * s`
    /// for the formats with a min). Fewer float operations than ggml's eight lanes per
    /// block, so the SIMD kernels can put eight weight rows in the lanes of one register.
    /// Q4_K's is its `Single` order and Q6_K's its `Tiled` one, both of which form exact
    /// integer sums per super-block, for every token (rows in lanes as well); MXFP4's is
    /// its `Gemm4` order, which is this order already. Other formats sum like `Single`.
    /// Used by `Numerics::Fast`.
    Fast,
}

impl DotOrder {
    /// Every order, in a fixed sequence (index = [`DotOrder::index`]).
    pub const ALL: [DotOrder; 4] = [
        DotOrder::Single,
        DotOrder::Tiled,
        DotOrder::Gemm4,
        DotOrder::Fast,
    ];

    /// Position in [`DotOrder::ALL`].
    pub const fn index(self) -> usize {
        match self {
            DotOrder::Single => 0,
            DotOrder::Tiled => 1,
            DotOrder::Gemm4 => 2,
            DotOrder::Fast => 3,
        }
    }

    /// `"single"`, `"tiled"`, `"gemm4"` or `"fast"`.
    pub const fn name(self) -> &'static str {
        match self {
            DotOrder::Single => "single",
            DotOrder::Tiled => "tiled",
            DotOrder::Gemm4 => "gemm4",
            DotOrder::Fast => "fast",
        }
    }
}

/// Which of ggml's x86 code paths to follow for element-wise and attention arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// `__AVX512F__ && __AVX512DQ__`: 16-float vectors.
    Avx512,
    /// `__AVX2__ && __FMA__`: 8-float vectors.
    Avx2,
}

impl Flavor {
    /// Floats per vector register.
    pub const fn lanes(self) -> usize {
        match self {
            Flavor::Avx512 => 16,
            Flavor::Avx2 => 8,
        }
    }
}

static FLAVOR: OnceLock<Flavor> = OnceLock::new();

/// Follows the given llama.cpp build's float order instead of this CPU's (the runtime
/// passes `RLLAMA_GGML_FLAVOR`): before the first use of [`flavor`], which fixes it.
/// Returns whether it took effect.
pub fn configure_flavor(f: Flavor) -> bool {
    FLAVOR.set(f).is_ok() || FLAVOR.get() == Some(&f)
}

/// The flavor a host-native llama.cpp build uses on this CPU: AVX-512 where the CPU has
/// AVX-512 F and DQ, else AVX2; or what [`configure_flavor`] set first.
pub fn flavor() -> Flavor {
    *FLAVOR.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512dq")
            {
                return Flavor::Avx512;
            }
        }
        Flavor::Avx2
    })
}

/// Which of ggml's BF16 products a llama.cpp build runs for BF16 weights (their
/// activations rounded to bf16 first): `ggml_vec_dot_bf16` for one token, llamafile's
/// tinyBLAS for two or more. Each exists in three x86 forms, picked at compile time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Order {
    /// `__AVX512BF16__` (a native build on a CPU with AVX512_BF16): `vdpbf16ps`, which per
    /// f32 lane adds the product of the odd element of a pair, rounds, then adds the even
    /// one's and rounds (both products exact); 32 elements per register.
    Dpbf16,
    /// `__AVX512F__` without BF16: elements widened to f32, 16 lanes, one rounding per
    /// product added.
    Avx512,
    /// `__AVX2__`: as `Avx512` with 8 lanes.
    Avx2,
}

impl Bf16Order {
    /// Elements per tinyBLAS step (its `KN`): rows of other lengths take `vec_dot`'s order.
    pub const fn gemm_step(self) -> usize {
        match self {
            Bf16Order::Dpbf16 => 32,
            Bf16Order::Avx512 => 16,
            Bf16Order::Avx2 => 8,
        }
    }

    /// The order as a number, for kernels that take it as a const parameter (0, 1, 2 in
    /// declaration order; [`Bf16Order::from_id`] inverts it).
    pub const fn id(self) -> u8 {
        match self {
            Bf16Order::Dpbf16 => 0,
            Bf16Order::Avx512 => 1,
            Bf16Order::Avx2 => 2,
        }
    }

    /// The order of [`Bf16Order::id`] `id` (`Avx2` for any id past 1).
    pub const fn from_id(id: u8) -> Bf16Order {
        match id {
            0 => Bf16Order::Dpbf16,
            1 => Bf16Order::Avx512,
            _ => Bf16Order::Avx2,
        }
    }

    /// The flavor whose horizontal sums close the order's registers.
    pub const fn flavor(self) -> Flavor {
        match self {
            Bf16Order::Dpbf16 | Bf16Order::Avx512 => Flavor::Avx512,
            Bf16Order::Avx2 => Flavor::Avx2,
        }
    }
}

/// The BF16 order of the build [`flavor`] follows: its AVX-512 flavor on a CPU with
/// AVX512_BF16 is a native build that has it (`GGML_NATIVE` compiles for every feature
/// of the machine), so `vdpbf16ps`.
pub fn bf16_order() -> Bf16Order {
    static ORDER: OnceLock<Bf16Order> = OnceLock::new();
    *ORDER.get_or_init(|| match flavor() {
        Flavor::Avx2 => Bf16Order::Avx2,
        Flavor::Avx512 => {
            #[cfg(target_arch = "x86_64")]
            {
                if std::is_x86_feature_detected!("avx512bf16") {
                    return Bf16Order::Dpbf16;
                }
            }
            Bf16Order::Avx512
        }
    })
}

/// How llama.cpp's CPU backend multiplies f16 attention operands: which kernel, hence
/// which summation order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum F16Order {
    /// The tiled GEMM (llamafile's tinyBLAS) used when the micro-batch has two or more
    /// tokens: one accumulator register over the whole length, then [`hsum`].
    Gemm,
    /// `ggml_vec_dot_f16`, used for a single token: four accumulator registers over
    /// chunks of four vectors, the remainder added in f64.
    VecDot,
}

/// Sum of one vector register's lanes as ggml reduces it at the end of a soft-max chunk
/// or a tiled GEMM (`_mm512_reduce_add_ps` / the movehl-movehdup `hsum`): halving, lane
/// `i` plus lane `i + w`. Consumes `l[..fl.lanes()]`.
#[inline(always)]
pub fn hsum(fl: Flavor, l: &mut [f32; 16]) -> f32 {
    let mut w = fl.lanes() / 2;
    while w > 0 {
        for i in 0..w {
            l[i] += l[i + w];
        }
        w /= 2;
    }
    l[0]
}

/// The last step of `ggml_vec_dot_f16`: four accumulator registers folded (0+2, 1+3,
/// 0+1), then reduced, AVX-512 by halving, AVX2 by `(l0+l4)+(l1+l5)` pairs through two
/// `hadd`s.
#[inline(always)]
pub fn reduce4(fl: Flavor, acc: &mut [[f32; 16]; 4]) -> f32 {
    let n = fl.lanes();
    for i in 0..n {
        acc[0][i] += acc[2][i];
        acc[1][i] += acc[3][i];
        acc[0][i] += acc[1][i];
    }
    match fl {
        Flavor::Avx512 => hsum(fl, &mut acc[0]),
        Flavor::Avx2 => {
            let t: [f32; 4] = std::array::from_fn(|i| acc[0][i] + acc[0][i + 4]);
            (t[0] + t[1]) + (t[2] + t[3])
        }
    }
}

/// Eight float accumulators in ggml's x86 order for 32-element blocks.
///
/// ggml's AVX2 kernels for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 form, per block, eight i32 lanes
/// (lane `l` = the exact sum of the products of elements `4l..4l+4`), convert them to f32
/// and fuse-multiply-add them with the block's combined scale into eight float lanes;
/// [`hsum_lanes`] folds the lanes at the end. The scalar twins follow this order so that
/// the SIMD kernels can be bit-exact with them *and* fast (no serial scalar chain).
#[inline(always)]
pub fn lanes_add_block(acc: &mut [f32; 8], d: f32, prod: impl Fn(usize) -> i32) {
    for (l, acc) in acc.iter_mut().enumerate() {
        let s = prod(4 * l) + prod(4 * l + 1) + prod(4 * l + 2) + prod(4 * l + 3);
        *acc = d.mul_add(s as f32, *acc);
    }
}

/// ggml's `hsum_float_8`: `v[i] = x[i] + x[i + 4]`, then `(v0 + v2) + (v1 + v3)`.
#[inline(always)]
pub fn hsum_lanes(x: &[f32; 8]) -> f32 {
    let v: [f32; 4] = core::array::from_fn(|i| x[i + 4] + x[i]);
    (v[0] + v[2]) + (v[1] + v[3])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_index_themselves() {
        for (i, o) in DotOrder::ALL.iter().enumerate() {
            assert_eq!(o.index(), i);
        }
    }

    #[test]
    fn horizontal_sums_add_every_lane() {
        for fl in [Flavor::Avx2, Flavor::Avx512] {
            let mut l = [0.0f32; 16];
            for (i, v) in l.iter_mut().enumerate().take(fl.lanes()) {
                *v = (i + 1) as f32;
            }
            let n = fl.lanes() as f32;
            assert_eq!(hsum(fl, &mut l), n * (n + 1.0) / 2.0);
            let mut acc = [[1.0f32; 16]; 4];
            assert_eq!(reduce4(fl, &mut acc), 4.0 * n);
        }
        assert_eq!(hsum_lanes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]), 36.0);
    }
}
