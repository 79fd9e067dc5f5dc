//! Q4_K: 256 values in 8 sub-blocks of 32, each `d*sc*q - dmin*m` with 4-bit `q` and
//! 6-bit `sc`/`m` packed into 12 bytes (4.5 bits/weight).
//!
//! Quants of sub-blocks `2k` and `2k+1` share the 32 bytes `qs[32k..32k+32]`: low nibbles
//! hold the first sub-block, high nibbles the second.

use super::common::{check_dot, rd_arr, rd_u16, Block, QK_K};
use super::q8_k::BlockQ8K;
use super::search::{fit_scales_mins, get_scale_min_k4};
use crate::f16::f16_to_f32;
use crate::GgmlType;

/// `block_q4_K`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4K {
    /// f16 bits of the super-block scale for the 6-bit sub-block scales.
    pub d: u16,
    /// f16 bits of the super-block scale for the 6-bit sub-block mins.
    pub dmin: u16,
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

impl Block for BlockQ4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
    const BLOCK_ELEMS: usize = QK_K;
    const BYTES: usize = 144;
    fn read(b: &[u8]) -> Self {
        Self {
            d: rd_u16(b, 0),
            dmin: rd_u16(b, 2),
            scales: rd_arr(b, 4),
            qs: rd_arr(b, 16),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..4].copy_from_slice(&self.dmin.to_le_bytes());
        out[4..16].copy_from_slice(&self.scales);
        out[16..144].copy_from_slice(&self.qs);
    }

    /// `quantize_row_q4_K_ref`: per-sub-block `make_qkx2_quants` fit, 6-bit quantization
    /// of the scales and mins, then requantization of `x` against the rounded scales.
    fn quantize(x: &[f32]) -> Self {
        let f = fit_scales_mins(x, 15, -1.0, 20);
        let mut b = BlockQ4K {
            d: f.d,
            dmin: f.dmin,
            scales: f.scales,
            qs: [0; QK_K / 2],
        };
        let l = f.quants;
        for (k, q) in b.qs.chunks_exact_mut(32).enumerate() {
            for (i, q) in q.iter_mut().enumerate() {
                *q = l[64 * k + i] | (l[64 * k + 32 + i] << 4);
            }
        }
        b
    }

    /// `dequantize_row_q4_K` for one block.
    fn dequantize(&self, y: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let min = f16_to_f32(self.dmin);
        for k in 0..4 {
            let (sc1, m1) = get_scale_min_k4(2 * k, &self.scales);
            let (sc2, m2) = get_scale_min_k4(2 * k + 1, &self.scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            let q = &self.qs[32 * k..32 * k + 32];
            let y = &mut y[64 * k..64 * k + 64];
            for l in 0..32 {
                y[l] = d1 * (q[l] & 0x0f) as f32 - m1;
                y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

/// Dot with a Q8_K activation row in the order of ggml's x86 kernels for Q4_K, which on
/// AVX2 machines run on weights repacked eight rows at a time (`gemv`/`gemm_q4_K_8x8`,
/// one order for any number of tokens); what [`crate::vec_dot`] computes. Per
/// super-block: the exact integer sums `s1 = Σ_b scale[b] · Σ q·a` and
/// `s2 = Σ_j min[j] · (bsums[2j] + bsums[2j+1])`, then `acc = fma(f32(s1), d·y.d, acc)` and
/// `acc_m = fma(f32(s2), dmin·y.d, acc_m)`; the result is `acc - acc_m`.
pub fn vec_dot_q8k(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ4K, BlockQ8K>(w, a);
    let (mut acc, mut acc_m) = (0.0f32, 0.0f32);
    for i in 0..nb {
        let x = BlockQ4K::read(&w[i * BlockQ4K::BYTES..]);
        let y = BlockQ8K::read(&a[i * BlockQ8K::BYTES..]);
        let (mut s1, mut s2) = (0i32, 0i32);
        for (c1, c2) in chunk_sums(&x, &y) {
            s1 += c1;
            s2 += c2;
        }
        acc = (s1 as f32).mul_add(f16_to_f32(x.d) * y.d, acc);
        acc_m = (s2 as f32).mul_add(f16_to_f32(x.dmin) * y.d, acc_m);
    }
    acc - acc_m
}

/// The exact integer parts of a Q4_K x Q8_K block per 64-element chunk `k` (sub-blocks
/// `2k`, `2k+1`): `(Σ_{b∈{2k,2k+1}} scale[b] · Σ q·y, Σ_{b∈{2k,2k+1}} min[b] · bsum32[b])`,
/// the 32-element bsums formed as ggml does, with an i16 pair sum.
fn chunk_sums(x: &BlockQ4K, y: &BlockQ8K) -> [(i32, i32); 4] {
    let mut out = [(0i32, 0i32); 4];
    for (k, o) in out.iter_mut().enumerate() {
        for b in [2 * k, 2 * k + 1] {
            let (sc, m) = get_scale_min_k4(b, &x.scales);
            let s: i32 = (0..32)
                .map(|l| {
                    let byte = x.qs[32 * k + l];
                    let q = if b % 2 == 0 { byte & 0x0f } else { byte >> 4 };
                    q as i32 * y.qs[32 * b + l] as i32
                })
                .sum();
            o.0 += sc as i32 * s;
            // The pair sum wraps in i16 (`hadd_epi16`; only reachable with forged bsums).
            o.1 += m as i32 * y.bsums[2 * b].wrapping_add(y.bsums[2 * b + 1]) as i32;
        }
    }
    out
}

/// Dot with a Q8_K activation row in the order of ggml's repacked `gemm_q4_K_8x8`, which
/// llama.cpp's x86 backend runs for the tokens of a micro-batch that fill groups of four
/// ([`crate::DotOrder::Gemm4`]): the scales and mins are applied per 64 elements,
/// `acc = fma(f32(s1_k), d·y.d, acc)` and `acc_m = fma(f32(s2_k), dmin·y.d, acc_m)` for
/// each chunk `k` of each super-block; the result is `acc - acc_m`. (Those tokens'
/// activations are quantized with [`super::q8_k::BlockQ8K::quantize_4x8`].)
pub fn vec_dot_q8k_gemm4(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ4K, BlockQ8K>(w, a);
    let (mut acc, mut acc_m) = (0.0f32, 0.0f32);
    for i in 0..nb {
        let x = BlockQ4K::read(&w[i * BlockQ4K::BYTES..]);
        let y = BlockQ8K::read(&a[i * BlockQ8K::BYTES..]);
        let (d, dmin) = (f16_to_f32(x.d) * y.d, f16_to_f32(x.dmin) * y.d);
        for (s1, s2) in chunk_sums(&x, &y) {
            acc = (s1 as f32).mul_add(d, acc);
            acc_m = (s2 as f32).mul_add(dmin, acc_m);
        }
    }
    acc - acc_m
}

/// Dot with a Q8_K activation row in the order of ggml's tiled GEMM, which llama.cpp runs
/// for Q4_K weights it did not repack (row counts not a multiple of 8) on micro-batches of
/// 8 or more tokens ([`crate::DotOrder::Tiled`]): per super-block
/// `r = fma(-dmin, f32(s2), f32(s1) · d)`, then `acc = fma(r, y.d, acc)`.
pub fn vec_dot_q8k_tiled(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ4K, BlockQ8K>(w, a);
    let mut acc = 0.0f32;
    for i in 0..nb {
        let x = BlockQ4K::read(&w[i * BlockQ4K::BYTES..]);
        let y = BlockQ8K::read(&a[i * BlockQ8K::BYTES..]);
        let s1: i32 = chunk_sums(&x, &y).iter().map(|c| c.0).sum();
        let s2 = tiled_mins(&x.scales, &y.bsums);
        acc = tiled_step(s1, s2, f16_to_f32(x.d), f16_to_f32(x.dmin), y.d, acc);
    }
    acc
}

/// The mins term of a Q4_K/Q5_K super-block in ggml's tiled GEMM: `Σ_b min[b] ·
/// (bsums[2b] + bsums[2b+1])`, the bsums widened to i32 before they are paired.
pub(crate) fn tiled_mins(scales: &[u8; 12], bsums: &[i16; QK_K / 16]) -> i32 {
    (0..8)
        .map(|b| {
            let m = get_scale_min_k4(b, scales).1 as i32;
            m * (bsums[2 * b] as i32 + bsums[2 * b + 1] as i32)
        })
        .sum()
}

/// The float step of a Q4_K/Q5_K super-block in ggml's tiled GEMM (the twins and every
/// kernel of that order): from the scaled quant sum `s1` and the mins term `s2`,
/// `r = fma(-dmin, f32(s2), f32(s1) · d)`, then `fma(r, y.d, acc)`.
#[inline(always)]
pub(crate) fn tiled_step(s1: i32, s2: i32, d: f32, dmin: f32, yd: f32, acc: f32) -> f32 {
    let r = (-dmin).mul_add(s2 as f32, s1 as f32 * d);
    r.mul_add(yd, acc)
}

/// `ggml_vec_dot_q4_K_q8_K_generic`: integer products accumulated in 8 lanes per block,
/// scaled into 8 float lanes across blocks, mins subtracted through Q8_K's `bsums`.
pub fn vec_dot_q8k_ref(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ4K, BlockQ8K>(w, a);
    let mut sums = [0.0f32; 8];
    let mut sumf = 0.0f32;
    for i in 0..nb {
        let x = BlockQ4K::read(&w[i * BlockQ4K::BYTES..]);
        let y = BlockQ8K::read(&a[i * BlockQ8K::BYTES..]);
        let mut aux8 = [0i8; QK_K];
        for k in 0..4 {
            for l in 0..32 {
                aux8[64 * k + l] = (x.qs[32 * k + l] & 0x0f) as i8;
                aux8[64 * k + 32 + l] = (x.qs[32 * k + l] >> 4) as i8;
            }
        }
        generic_scales_mins_dot(&aux8, &x.scales, x.d, x.dmin, &y, &mut sums, &mut sumf);
    }
    for s in sums {
        sumf += s;
    }
    sumf
}

/// ggml's generic dot of one Q4_K/Q5_K super-block with a Q8_K block, once its quants are
/// unpacked into `aux8` (Q5_K adds its high bit first): eight integer lanes per
/// sub-block scale added into `sums` (multiply, then add), the mins against the block
/// sums subtracted from `sumf`.
#[allow(clippy::too_many_arguments)] // the block's parts and the two running sums
pub(crate) fn generic_scales_mins_dot(
    aux8: &[i8; QK_K],
    packed: &[u8; 12],
    d: u16,
    dmin: u16,
    y: &BlockQ8K,
    sums: &mut [f32; 8],
    sumf: &mut f32,
) {
    let mut scales = [0u8; 8];
    let mut mins = [0u8; 8];
    for j in 0..8 {
        (scales[j], mins[j]) = get_scale_min_k4(j, packed);
    }
    let mut sumi = 0i32;
    for j in 0..QK_K / 16 {
        sumi += y.bsums[j] as i32 * mins[j / 2] as i32;
    }
    let mut aux32 = [0i32; 8];
    for (j, &scale) in scales.iter().enumerate() {
        let scale = scale as i32;
        for g in 0..4 {
            let base = 32 * j + 8 * g;
            for l in 0..8 {
                // ggml stages the product in an int16; |q8 * q5| <= 3968 always fits.
                aux32[l] += scale * (y.qs[base + l] as i32 * aux8[base + l] as i32);
            }
        }
    }
    let dd = f16_to_f32(d) * y.d;
    for l in 0..8 {
        sums[l] += dd * aux32[l] as f32;
    }
    let dm = f16_to_f32(dmin) * y.d;
    *sumf -= dm * sumi as f32;
}

/// The eight 6-bit scales and mins of a Q4_K/Q5_K block from its 12 packed bytes
/// (`s[..12]`) as little-endian byte lanes, byte `j` = [`get_scale_min_k4`]`(j)`, four at a
/// time in u32 words: the form the SIMD kernels load them in.
#[inline(always)]
pub(crate) fn scales_mins_lanes(s: &[u8]) -> (u64, u64) {
    let a0 = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    let a1 = u32::from_le_bytes([s[4], s[5], s[6], s[7]]);
    let a2 = u32::from_le_bytes([s[8], s[9], s[10], s[11]]);
    // Sub-blocks 0..4 keep six bits in bytes 0..4 (scales) and 4..8 (mins); sub-blocks
    // 4..8 take a nibble of bytes 8..12 plus the top bit pairs of bytes 0..8.
    let sc_lo = a0 & 0x3f3f_3f3f;
    let mn_lo = a1 & 0x3f3f_3f3f;
    let sc_hi = (a2 & 0x0f0f_0f0f) | ((a0 >> 2) & 0x3030_3030);
    let mn_hi = ((a2 >> 4) & 0x0f0f_0f0f) | ((a1 >> 2) & 0x3030_3030);
    (
        sc_lo as u64 | (sc_hi as u64) << 32,
        mn_lo as u64 | (mn_hi as u64) << 32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_lanes_match_get_scale_min_k4() {
        let mut x = 0x9e37_79b9u32;
        for _ in 0..1000 {
            let packed: [u8; 12] = std::array::from_fn(|_| {
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (x >> 24) as u8
            });
            let (sc, mn) = scales_mins_lanes(&packed);
            for j in 0..8 {
                let (s, m) = get_scale_min_k4(j, &packed);
                assert_eq!(
                    (sc.to_le_bytes()[j], mn.to_le_bytes()[j]),
                    (s, m),
                    "{packed:?} {j}"
                );
            }
        }
    }
}
