//! Q5_K: Q4_K's layout plus a 32-byte high-bit plane (`qh`), so each of the 8 sub-blocks
//! is `d*sc*q - dmin*m` with 5-bit `q` (5.5 bits/weight). Bit `2k` of `qh[l]` is the high
//! bit of element `l` of sub-block `2k`, bit `2k+1` that of sub-block `2k+1`.

use super::common::{check_dot, rd_arr, rd_u16, Block, QK_K};
use super::q4_k::{generic_scales_mins_dot, tiled_mins, tiled_step};
use super::q8_k::BlockQ8K;
use super::search::{fit_scales_mins, get_scale_min_k4};
use crate::f16::f16_to_f32;
use crate::order::hsum_lanes;
use crate::GgmlType;

/// `block_q5_K`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5K {
    pub d: u16,
    pub dmin: u16,
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);

impl Block for BlockQ5K {
    const TYPE: GgmlType = GgmlType::Q5_K;
    const BLOCK_ELEMS: usize = QK_K;
    const BYTES: usize = 176;
    fn read(b: &[u8]) -> Self {
        Self {
            d: rd_u16(b, 0),
            dmin: rd_u16(b, 2),
            scales: rd_arr(b, 4),
            qh: rd_arr(b, 16),
            qs: rd_arr(b, 48),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..4].copy_from_slice(&self.dmin.to_le_bytes());
        out[4..16].copy_from_slice(&self.scales);
        out[16..48].copy_from_slice(&self.qh);
        out[48..176].copy_from_slice(&self.qs);
    }

    /// `quantize_row_q5_K_ref` (same scheme as Q4_K with `nmax = 31` and a narrower search).
    fn quantize(x: &[f32]) -> Self {
        let f = fit_scales_mins(x, 31, -0.5, 15);
        let mut b = BlockQ5K {
            d: f.d,
            dmin: f.dmin,
            scales: f.scales,
            qh: [0; QK_K / 8],
            qs: [0; QK_K / 2],
        };
        let l = f.quants;
        let (mut m1, mut m2) = (1u8, 2u8);
        for k in 0..4 {
            for j in 0..32 {
                let mut l1 = l[64 * k + j];
                if l1 > 15 {
                    l1 -= 16;
                    b.qh[j] |= m1;
                }
                let mut l2 = l[64 * k + 32 + j];
                if l2 > 15 {
                    l2 -= 16;
                    b.qh[j] |= m2;
                }
                b.qs[32 * k + j] = l1 | (l2 << 4);
            }
            m1 <<= 2;
            m2 <<= 2;
        }
        b
    }

    /// `dequantize_row_q5_K` for one block.
    fn dequantize(&self, y: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let min = f16_to_f32(self.dmin);
        let (mut u1, mut u2) = (1u8, 2u8);
        for k in 0..4 {
            let (sc1, m1) = get_scale_min_k4(2 * k, &self.scales);
            let (sc2, m2) = get_scale_min_k4(2 * k + 1, &self.scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            let ql = &self.qs[32 * k..32 * k + 32];
            let y = &mut y[64 * k..64 * k + 64];
            for l in 0..32 {
                let h1 = if self.qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if self.qh[l] & u2 != 0 { 16 } else { 0 };
                y[l] = d1 * ((ql[l] & 0x0f) + h1) as f32 - m1;
                y[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
            }
            u1 <<= 2;
            u2 <<= 2;
        }
    }
}

/// The 5-bit quants of a block, element `e` in `q[e]` (0..=31).
fn quants(x: &BlockQ5K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    let mut m = 1u8;
    for k in 0..4 {
        for l in 0..32 {
            let h = if x.qh[l] & m != 0 { 16 } else { 0 };
            q[64 * k + l] = (x.qs[32 * k + l] & 0x0f) + h;
        }
        m <<= 1;
        for l in 0..32 {
            let h = if x.qh[l] & m != 0 { 16 } else { 0 };
            q[64 * k + 32 + l] = (x.qs[32 * k + l] >> 4) + h;
        }
        m <<= 1;
    }
    q
}

/// The exact integer parts of a block: per lane `l` of eight, `Σ_b scale[b] · Σ q·y` over
/// elements `4l..4l+4` of every 32-element sub-block `b`; and `Σ_b min[b] · bsum32[b]`,
/// the 32-element sums formed as an i16 pair sum (`hadd_epi16`, wrapping; only forged
/// bsums reach it).
fn lane_sums(x: &BlockQ5K, y: &BlockQ8K) -> ([i32; 8], i32) {
    let q = quants(x);
    let mut lanes = [0i32; 8];
    let mut mins = 0i32;
    for b in 0..8 {
        let (sc, m) = get_scale_min_k4(b, &x.scales);
        for (l, lane) in lanes.iter_mut().enumerate() {
            let e = 32 * b + 4 * l;
            let s: i32 = (e..e + 4).map(|e| q[e] as i32 * y.qs[e] as i32).sum();
            *lane += sc as i32 * s;
        }
        mins += m as i32 * y.bsums[2 * b].wrapping_add(y.bsums[2 * b + 1]) as i32;
    }
    (lanes, mins)
}

/// Dot with a Q8_K activation row in the order of ggml's AVX2 `ggml_vec_dot_q5_K_q8_K`,
/// what llama.cpp's x86 builds (AVX-512 ones too) run for one token
/// ([`crate::DotOrder::Single`]; x86 never repacks Q5_K): per super-block the eight
/// integer lanes of [`lane_sums`] fused into eight float lanes, `acc_l = fma(d, f32(s_l),
/// acc_l)` with `d = y.d · x.d`, and the mins into one float, `summs = fma(dmin, f32(m),
/// summs)` with `dmin = -y.d · x.dmin` (GCC contracts ggml's `summs += dmin * m`); the
/// result is the eight lanes summed as `hsum_float_8`, plus `summs`.
pub fn vec_dot_q8k(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ5K, BlockQ8K>(w, a);
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for i in 0..nb {
        let x = BlockQ5K::read(&w[i * BlockQ5K::BYTES..]);
        let y = BlockQ8K::read(&a[i * BlockQ8K::BYTES..]);
        let (lanes, mins) = lane_sums(&x, &y);
        let d = y.d * f16_to_f32(x.d);
        let dmin = -y.d * f16_to_f32(x.dmin);
        summs = dmin.mul_add(mins as f32, summs);
        for (acc, s) in acc.iter_mut().zip(lanes) {
            *acc = d.mul_add(s as f32, *acc);
        }
    }
    hsum_lanes(&acc) + summs
}

/// Dot with a Q8_K activation row in the order of ggml's tiled GEMM (Q4_K's template,
/// `q4_k::vec_dot_q8k_tiled`), which llama.cpp runs for Q5_K on micro-batches of 8 or
/// more tokens ([`crate::DotOrder::Tiled`]): per super-block
/// `r = fma(-dmin, f32(m), f32(s) · d)`, then `acc = fma(r, y.d, acc)`, with `s` the
/// scaled quant sum and `m` the mins against the bsums (widened to i32 before pairing).
pub fn vec_dot_q8k_tiled(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ5K, BlockQ8K>(w, a);
    let mut acc = 0.0f32;
    for i in 0..nb {
        let x = BlockQ5K::read(&w[i * BlockQ5K::BYTES..]);
        let y = BlockQ8K::read(&a[i * BlockQ8K::BYTES..]);
        let (lanes, _) = lane_sums(&x, &y);
        let s: i32 = lanes.iter().sum();
        let m = tiled_mins(&x.scales, &y.bsums);
        acc = tiled_step(s, m, f16_to_f32(x.d), f16_to_f32(x.dmin), y.d, acc);
    }
    acc
}

/// `ggml_vec_dot_q5_K_q8_K_generic` (same accumulation shape as Q4_K's).
pub fn vec_dot_q8k_ref(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ5K, BlockQ8K>(w, a);
    let mut sums = [0.0f32; 8];
    let mut sumf = 0.0f32;
    for i in 0..nb {
        let x = BlockQ5K::read(&w[i * BlockQ5K::BYTES..]);
        let y = BlockQ8K::read(&a[i * BlockQ8K::BYTES..]);
        let aux8 = quants(&x).map(|q| q as i8);
        generic_scales_mins_dot(&aux8, &x.scales, x.d, x.dmin, &y, &mut sums, &mut sumf);
    }
    for s in sums {
        sumf += s;
    }
    sumf
}
