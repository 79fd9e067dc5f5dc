//! Q2_K: 256 values in 16 sub-blocks of 16, each `d*sc*q - dmin*m` with 2-bit `q` and
//! 4-bit `sc`/`m` sharing one byte (2.625 bits/weight).
//!
//! Per 128-value half, `qs[32h + l]` holds elements `l`, `l+32`, `l+64`, `l+96` of that
//! half in bit pairs 0-1, 2-3, 4-5, 6-7.

use super::common::{check_dot, nearest_int, rd_arr, rd_u16, Block, QK_K};
use super::q8_k::BlockQ8K;
use super::search::make_qkx2_quants;
use crate::f16::{f16_to_f32, f32_to_f16};
use crate::GgmlType;

/// `block_q2_K`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ2K {
    /// Low nibble: scale, high nibble: min, per 16 values.
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: u16,
    pub dmin: u16,
}
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);

impl Block for BlockQ2K {
    const TYPE: GgmlType = GgmlType::Q2_K;
    const BLOCK_ELEMS: usize = QK_K;
    const BYTES: usize = 84;
    fn read(b: &[u8]) -> Self {
        Self {
            scales: rd_arr(b, 0),
            qs: rd_arr(b, 16),
            d: rd_u16(b, 80),
            dmin: rd_u16(b, 82),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[..16].copy_from_slice(&self.scales);
        out[16..80].copy_from_slice(&self.qs);
        out[80..82].copy_from_slice(&self.d.to_le_bytes());
        out[82..84].copy_from_slice(&self.dmin.to_le_bytes());
    }

    /// `quantize_row_q2_K_ref`: |x|-weighted `make_qkx2_quants` (mean absolute error) per
    /// 16 values, 4-bit scales and mins, then requantization.
    fn quantize(x: &[f32]) -> Self {
        const Q4SCALE: f32 = 15.0;
        let mut l = [0u8; QK_K];
        let mut weights = [0.0f32; 16];
        let mut mins = [0.0f32; 16];
        let mut scales = [0.0f32; 16];
        let mut max_scale = 0.0f32;
        let mut max_min = 0.0f32;
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            for (w, &v) in weights.iter_mut().zip(xs) {
                *w = v.abs();
            }
            let (s, m) = make_qkx2_quants(
                3,
                xs,
                &weights,
                &mut l[16 * j..16 * j + 16],
                -0.5,
                0.1,
                15,
                true,
            );
            scales[j] = s;
            mins[j] = m;
            if s > max_scale {
                max_scale = s;
            }
            if m > max_min {
                max_min = m;
            }
        }
        let mut b = BlockQ2K {
            scales: [0; 16],
            qs: [0; QK_K / 4],
            d: 0,
            dmin: 0,
        };
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for j in 0..16 {
                b.scales[j] = nearest_int(iscale * scales[j]) as u8;
            }
            b.d = f32_to_f16(max_scale / Q4SCALE);
        } else {
            b.d = f32_to_f16(0.0);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for j in 0..16 {
                let li = nearest_int(iscale * mins[j]);
                b.scales[j] = (b.scales[j] as i32 | (li << 4)) as u8;
            }
            b.dmin = f32_to_f16(max_min / Q4SCALE);
        } else {
            b.dmin = f32_to_f16(0.0);
        }
        for j in 0..16 {
            let d = f16_to_f32(b.d) * (b.scales[j] & 0xf) as f32;
            if d == 0.0 {
                continue;
            }
            let dm = f16_to_f32(b.dmin) * (b.scales[j] >> 4) as f32;
            for ii in 0..16 {
                l[16 * j + ii] = nearest_int((x[16 * j + ii] + dm) / d).clamp(0, 3) as u8;
            }
        }
        pack_2bit(&l, &mut b.qs);
        b
    }

    /// `dequantize_row_q2_K` for one block.
    fn dequantize(&self, y: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let min = f16_to_f32(self.dmin);
        let mut is = 0;
        for h in 0..2 {
            let q = &self.qs[32 * h..32 * h + 32];
            for (j, shift) in [0u32, 2, 4, 6].into_iter().enumerate() {
                let y = &mut y[128 * h + 32 * j..128 * h + 32 * j + 32];
                for half in 0..2 {
                    let sc = self.scales[is];
                    is += 1;
                    let (dl, ml) = (d * (sc & 0xf) as f32, min * (sc >> 4) as f32);
                    for l in 0..16 {
                        let v = (q[16 * half + l] >> shift) & 3;
                        y[16 * half + l] = dl * v as f32 - ml;
                    }
                }
            }
        }
    }
}

/// Packs 2-bit values (element order) into the Q2_K/Q3_K `qs` layout.
pub(crate) fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8; QK_K / 4]) {
    for h in 0..2 {
        for i in 0..32 {
            let j = 128 * h + i;
            qs[32 * h + i] = l[j] | (l[j + 32] << 2) | (l[j + 64] << 4) | (l[j + 96] << 6);
        }
    }
}

/// `ggml_vec_dot_q2_K_q8_K_generic`: mins through `bsums`, scales per 16 in integers.
pub fn vec_dot_q8k(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ2K, BlockQ8K>(w, a);
    let mut sumf = 0.0f32;
    for i in 0..nb {
        let x = BlockQ2K::read(&w[i * BlockQ2K::BYTES..]);
        let y = BlockQ8K::read(&a[i * BlockQ8K::BYTES..]);
        let mut summs = 0i32;
        for j in 0..16 {
            summs += y.bsums[j] as i32 * (x.scales[j] >> 4) as i32;
        }
        let dall = y.d * f16_to_f32(x.d);
        let dmin = y.d * f16_to_f32(x.dmin);
        let mut isum = 0i32;
        let mut is = 0;
        for h in 0..2 {
            let q2 = &x.qs[32 * h..32 * h + 32];
            for (j, shift) in [0u32, 2, 4, 6].into_iter().enumerate() {
                let q8 = &y.qs[128 * h + 32 * j..128 * h + 32 * j + 32];
                for half in 0..2 {
                    let d = (x.scales[is] & 0xf) as i32;
                    is += 1;
                    let mut isuml = 0i32;
                    for l in 16 * half..16 * half + 16 {
                        isuml += q8[l] as i32 * ((q2[l] >> shift) & 3) as i32;
                    }
                    isum += d * isuml;
                }
            }
        }
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}
