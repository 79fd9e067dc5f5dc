//! IQ4_XS: IQ4_NL's table with 256-element super-blocks (4.25 bits/weight): an f16 scale
//! `d` per super-block and a 6-bit signed scale `ls - 32` per 32-element sub-block, so
//! element `j` of sub-block `b` is `d · (ls_b - 32) · KVALUES[q]`. Sub-block `b`'s 16
//! bytes of indices hold element `j` in the low nibble of byte `j` and element `j + 16`
//! in its high nibble, as IQ4_NL's block; the low four bits of `ls_b` are nibble `b % 2`
//! of `scales_l[b / 2]`, the top two bits `2b..2b+2` of `scales_h`.
//!
//! Its dot products take Q8_K activations. llama.cpp's x86 backend never repacks IQ4_XS;
//! it runs ggml's AVX2 `vec_dot` below eight tokens ([`vec_dot_q8k`],
//! [`crate::DotOrder::Single`]) and the tiled GEMM from eight up ([`vec_dot_q8k_tiled`],
//! [`crate::DotOrder::Tiled`], also the fast order: one exact integer sum per
//! super-block). [`vec_dot_q8k_ref`] is ggml's generic C dot.
//!
//! The quantizer is `quantize_iq4_xs` without an importance matrix, what `llama-quantize`
//! writes: IQ4_NL's scale search per sub-block, then the sub-block scales quantized to
//! six bits against the super-block scale and the indices found again.

use super::common::{check_dot, nearest_int, rd_arr, rd_u16, Block, QK_K};
use super::iq4_nl::{best_index, search_block, KVALUES};
use super::q8_k::BlockQ8K;
use crate::f16::{f16_to_f32, f32_to_f16};
use crate::order::hsum_lanes;
use crate::GgmlType;

/// Sub-blocks per super-block.
const SUBS: usize = QK_K / 32;

/// `block_iq4_xs`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIq4Xs {
    pub d: u16,
    pub scales_h: u16,
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockIq4Xs>() == 136);

impl BlockIq4Xs {
    /// Sub-block `b`'s scale, `ls - 32` (-32..=31).
    #[inline(always)]
    pub fn scale(&self, b: usize) -> i32 {
        let lo = (self.scales_l[b / 2] >> (4 * (b % 2))) & 0x0f;
        let hi = ((self.scales_h >> (2 * b)) & 3) as u8;
        (lo | (hi << 4)) as i32 - 32
    }

    /// Element `j` of sub-block `b`: its table value.
    #[inline(always)]
    pub fn value(&self, b: usize, j: usize) -> i32 {
        let q = self.qs[16 * b + j % 16] >> (4 * (j / 16));
        KVALUES[(q & 0x0f) as usize] as i32
    }
}

impl Block for BlockIq4Xs {
    const TYPE: GgmlType = GgmlType::IQ4_XS;
    const BLOCK_ELEMS: usize = QK_K;
    const BYTES: usize = 136;
    fn read(b: &[u8]) -> Self {
        Self {
            d: rd_u16(b, 0),
            scales_h: rd_u16(b, 2),
            scales_l: rd_arr(b, 4),
            qs: rd_arr(b, 8),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..4].copy_from_slice(&self.scales_h.to_le_bytes());
        out[4..8].copy_from_slice(&self.scales_l);
        out[8..136].copy_from_slice(&self.qs);
    }

    /// `quantize_iq4_xs` without an importance matrix (`quantize_row_iq4_nl_impl` with
    /// 256-element super-blocks, 32-element blocks, `ntry` 7).
    fn quantize(x: &[f32]) -> Self {
        let x = &x[..QK_K];
        let mut scales = [0.0f32; SUBS];
        let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
        for (b, s) in scales.iter_mut().enumerate() {
            // A sub-block below ggml's threshold keeps scale 0 and no say in the maximum.
            if let Some((d, _)) = search_block(&x[32 * b..32 * b + 32], 7) {
                *s = d;
                if d.abs() > amax_scale {
                    amax_scale = d.abs();
                    max_scale = d;
                }
            }
        }
        let d = -max_scale / 32.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut out = BlockIq4Xs {
            d: f32_to_f16(d),
            scales_h: 0,
            scales_l: [0; QK_K / 64],
            qs: [0; QK_K / 2],
        };
        for (b, &s) in scales.iter().enumerate() {
            let l = nearest_int(id * s).clamp(-32, 31);
            let dl = d * l as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            let xb = &x[32 * b..32 * b + 32];
            let q: [u8; 32] = std::array::from_fn(|j| best_index(idl * xb[j]));
            for j in 0..16 {
                out.qs[16 * b + j] = q[j] | (q[j + 16] << 4);
            }
            let l = (l + 32) as u8;
            out.scales_l[b / 2] |= (l & 0x0f) << (4 * (b % 2));
            out.scales_h |= ((l >> 4) as u16) << (2 * b);
        }
        out
    }

    /// `dequantize_row_iq4_xs` for one super-block.
    fn dequantize(&self, y: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for b in 0..SUBS {
            let dl = d * self.scale(b) as f32;
            for j in 0..32 {
                y[32 * b + j] = dl * self.value(b, j) as f32;
            }
        }
    }
}

/// ggml's AVX2 `mul_add_epi8` product of a weight byte `x` and an activation byte `y`:
/// `|x| · sign(y, x)`, which is `x · y` for every activation Q8_K's quantizer writes
/// (`-127..=127`); a forged -128 against a negative weight keeps its sign.
#[inline(always)]
fn sign_product(x: i32, y: i8) -> i32 {
    if x < 0 {
        x.abs() * y.wrapping_neg() as i32
    } else {
        x * y as i32
    }
}

/// The exact integer lanes of a super-block: lane `l` of eight holds
/// `Σ_b ls_b · Σ q·y` over elements `4l..4l+4` of every sub-block `b`.
#[inline]
fn lane_sums(x: &BlockIq4Xs, y: &BlockQ8K) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for b in 0..SUBS {
        let ls = x.scale(b);
        for (l, lane) in lanes.iter_mut().enumerate() {
            let s: i32 = (4 * l..4 * l + 4)
                .map(|j| sign_product(x.value(b, j), y.qs[32 * b + j]))
                .sum();
            *lane += ls * s;
        }
    }
    lanes
}

/// Dot with a Q8_K activation row in the order of ggml's AVX2 `ggml_vec_dot_iq4_xs_q8_K`,
/// what llama.cpp's x86 builds (AVX-512 ones too) run for micro-batches under eight
/// tokens ([`crate::DotOrder::Single`]): per super-block the eight integer lanes of
/// [`lane_sums`] fused into eight float lanes, `acc_l = fma(x.d · y.d, f32(s_l), acc_l)`,
/// then `hsum_float_8`.
pub fn vec_dot_q8k(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockIq4Xs, BlockQ8K>(w, a);
    let mut acc = [0.0f32; 8];
    for i in 0..nb {
        let x = BlockIq4Xs::read(&w[i * BlockIq4Xs::BYTES..]);
        let y = BlockQ8K::read(&a[i * BlockQ8K::BYTES..]);
        let d = f16_to_f32(x.d) * y.d;
        for (acc, s) in acc.iter_mut().zip(lane_sums(&x, &y)) {
            *acc = d.mul_add(s as f32, *acc);
        }
    }
    hsum_lanes(&acc)
}

/// Dot with a Q8_K activation row in the order of ggml's tiled GEMM for IQ4_XS (no mins),
/// which llama.cpp runs from eight tokens up ([`crate::DotOrder::Tiled`]; also the fast
/// order): per super-block one exact integer sum `s = Σ_b ls_b · Σ q·y` (the lanes of
/// [`lane_sums`] added: its products, the sign trick of ggml's AVX2 kernels, are
/// `q · y` for every activation the quantizer writes), then
/// `acc = fma(f32(s) · x.d, y.d, acc)`.
pub fn vec_dot_q8k_tiled(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockIq4Xs, BlockQ8K>(w, a);
    let mut acc = 0.0f32;
    for i in 0..nb {
        let x = BlockIq4Xs::read(&w[i * BlockIq4Xs::BYTES..]);
        let y = BlockQ8K::read(&a[i * BlockQ8K::BYTES..]);
        let s: i32 = lane_sums(&x, &y).iter().sum();
        acc = (s as f32 * f16_to_f32(x.d)).mul_add(y.d, acc);
    }
    acc
}

/// `ggml_vec_dot_iq4_xs_q8_K_generic`: per sub-block `sumf += (d·y.d·ls) · sumi`, unfused.
pub fn vec_dot_q8k_ref(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockIq4Xs, BlockQ8K>(w, a);
    let mut sumf = 0.0f32;
    for i in 0..nb {
        let x = BlockIq4Xs::read(&w[i * BlockIq4Xs::BYTES..]);
        let y = BlockQ8K::read(&a[i * BlockQ8K::BYTES..]);
        let d4d8 = f16_to_f32(x.d) * y.d;
        for b in 0..SUBS {
            let d = d4d8 * x.scale(b) as f32;
            let s: i32 = (0..32)
                .map(|j| x.value(b, j) * y.qs[32 * b + j] as i32)
                .sum();
            sumf += d * s as f32;
        }
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_round_trip_and_values_follow_the_table() {
        let x: [f32; QK_K] = std::array::from_fn(|j| {
            let b = j / 32;
            KVALUES[j % 16] as f32 * (b as f32 + 1.0) * 0.25
        });
        let q = BlockIq4Xs::quantize(&x);
        let mut y = [0.0f32; QK_K];
        q.dequantize(&mut y);
        // Sub-block scales of 1..8 quarters: the largest is -32 steps of d = -1/16, the
        // others whole multiples of it, so every value comes back exactly.
        assert_eq!(
            (0..SUBS).map(|b| q.scale(b)).collect::<Vec<_>>(),
            [-4, -8, -12, -16, -20, -24, -28, -32]
        );
        assert_eq!(y, x);
        let z = BlockIq4Xs::quantize(&[0.0; QK_K]);
        assert_eq!(f16_to_f32(z.d), 0.0);
        assert_eq!((z.scales_h, z.scales_l, z.qs[0]), (0xaaaa, [0; 4], 0x88));
    }

    #[test]
    fn orders_agree_on_exact_inputs() {
        let mut x = BlockIq4Xs {
            d: f32_to_f16(1.0),
            scales_h: 0x5555,
            scales_l: [0x21, 0x43, 0x65, 0x87],
            qs: std::array::from_fn(|j| (j * 37 % 256) as u8),
        };
        x.scales_h ^= 0x0300;
        let mut w = [0u8; 136];
        x.write(&mut w);
        let mut y = BlockQ8K {
            d: 1.0,
            qs: std::array::from_fn(|j| (j as i32 % 23 - 11) as i8),
            bsums: [0; 16],
        };
        for (g, s) in y.bsums.iter_mut().enumerate() {
            *s = y.qs[16 * g..16 * g + 16].iter().map(|&q| q as i16).sum();
        }
        let mut a = [0u8; 292];
        y.write(&mut a);
        let exact: i32 = (0..SUBS)
            .map(|b| {
                x.scale(b)
                    * (0..32)
                        .map(|j| x.value(b, j) * y.qs[32 * b + j] as i32)
                        .sum::<i32>()
            })
            .sum();
        assert_eq!(vec_dot_q8k(&w, &a), exact as f32);
        assert_eq!(vec_dot_q8k_tiled(&w, &a), exact as f32);
        assert_eq!(vec_dot_q8k_ref(&w, &a), exact as f32);
    }
}
