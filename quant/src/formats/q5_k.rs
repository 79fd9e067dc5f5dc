//! Q5_K: Q4_K's layout plus a 32-byte high-bit plane (`qh`), so each of the 8 sub-blocks
//! is `d*sc*q - dmin*m` with 5-bit `q` (5.5 bits/weight). Bit `2k` of `qh[l]` is the high
//! bit of element `l` of sub-block `2k`, bit `2k+1` that of sub-block `2k+1`.

use super::common::{check_dot, rd_arr, rd_u16, Block, QK_K};
use super::q4_k::generic_scales_mins_dot;
use super::q8_k::BlockQ8K;
use super::search::{fit_scales_mins, get_scale_min_k4};
use crate::f16::f16_to_f32;
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

/// `ggml_vec_dot_q5_K_q8_K_generic` (same accumulation shape as Q4_K).
pub fn vec_dot_q8k(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ5K, BlockQ8K>(w, a);
    let mut sums = [0.0f32; 8];
    let mut sumf = 0.0f32;
    for i in 0..nb {
        let x = BlockQ5K::read(&w[i * BlockQ5K::BYTES..]);
        let y = BlockQ8K::read(&a[i * BlockQ8K::BYTES..]);
        let mut aux8 = [0i8; QK_K];
        let mut m = 1u8;
        for k in 0..4 {
            for l in 0..32 {
                let h = if x.qh[l] & m != 0 { 16 } else { 0 };
                aux8[64 * k + l] = (x.qs[32 * k + l] & 0x0f) as i8 + h;
            }
            m <<= 1;
            for l in 0..32 {
                let h = if x.qh[l] & m != 0 { 16 } else { 0 };
                aux8[64 * k + 32 + l] = (x.qs[32 * k + l] >> 4) as i8 + h;
            }
            m <<= 1;
        }
        generic_scales_mins_dot(&aux8, &x.scales, x.d, x.dmin, &y, &mut sums, &mut sumf);
    }
    for s in sums {
        sumf += s;
    }
    sumf
}
