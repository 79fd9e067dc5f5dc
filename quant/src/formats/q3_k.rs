//! Q3_K: 256 values in 16 sub-blocks of 16, each `d*(sc-32)*q` with signed 3-bit `q`
//! (2 low bits in `qs`, Q2_K's layout, plus an inverted high bit in `hmask`) and 6-bit
//! scales packed into 12 bytes (3.4375 bits/weight).
//!
//! `hmask[l]` bit `k` belongs to element `32k + l`; a *clear* bit subtracts 4.

use super::common::{check_dot, nearest_int, rd_arr, rd_u16, Block, QK_K};
use super::q2_k::pack_2bit;
use super::q8_k::BlockQ8K;
use super::search::make_q3_quants;
use crate::f16::{f16_to_f32, f32_to_f16};
use crate::order::hsum_lanes;
use crate::GgmlType;

/// `block_q3_K`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: u16,
}
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110);

impl Block for BlockQ3K {
    const TYPE: GgmlType = GgmlType::Q3_K;
    const BLOCK_ELEMS: usize = QK_K;
    const BYTES: usize = 110;
    fn read(b: &[u8]) -> Self {
        Self {
            hmask: rd_arr(b, 0),
            qs: rd_arr(b, 32),
            scales: rd_arr(b, 96),
            d: rd_u16(b, 108),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[..32].copy_from_slice(&self.hmask);
        out[32..96].copy_from_slice(&self.qs);
        out[96..108].copy_from_slice(&self.scales);
        out[108..110].copy_from_slice(&self.d.to_le_bytes());
    }

    /// `quantize_row_q3_K_ref`: `make_q3_quants` with coordinate descent per 16 values,
    /// 6-bit signed scales relative to the largest-magnitude one, then requantization.
    fn quantize(x: &[f32]) -> Self {
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; 16];
        let mut max_scale = 0.0f32;
        let mut amax = 0.0f32;
        for j in 0..16 {
            scales[j] = make_q3_quants(
                4,
                &x[16 * j..16 * j + 16],
                &mut l[16 * j..16 * j + 16],
                true,
            );
            let scale = scales[j].abs();
            if scale > amax {
                amax = scale;
                max_scale = scales[j];
            }
        }
        let mut b = BlockQ3K {
            hmask: [0; 32],
            qs: [0; 64],
            scales: [0; 12],
            d: 0,
        };
        if max_scale != 0.0 {
            let iscale = -32.0f32 / max_scale;
            for j in 0..16 {
                // `int8_t l = nearest_int(..)` narrows before the clamp, as in ggml.
                let li = (nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32;
                let li = li as u8;
                if j < 8 {
                    b.scales[j] = li & 0xf;
                } else {
                    b.scales[j - 8] |= (li & 0xf) << 4;
                }
                b.scales[j % 4 + 8] |= (li >> 4) << (2 * (j / 4));
            }
            b.d = f32_to_f16(1.0 / iscale);
        } else {
            b.d = f32_to_f16(0.0);
        }
        let sc = unpack_scales(&b.scales);
        for j in 0..16 {
            let d = f16_to_f32(b.d) * (sc[j] as i32 - 32) as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let li = nearest_int(x[16 * j + ii] / d).clamp(-4, 3);
                l[16 * j + ii] = (li + 4) as i8;
            }
        }
        let mut l2 = [0u8; QK_K];
        for (j, (&v, o)) in l.iter().zip(l2.iter_mut()).enumerate() {
            let mut v = v as u8;
            if v > 3 {
                b.hmask[j % 32] |= 1 << (j / 32);
                v -= 4;
            }
            *o = v;
        }
        pack_2bit(&l2, &mut b.qs);
        b
    }

    /// `dequantize_row_q3_K` for one block: `(d * (sc - 32)) * q`.
    fn dequantize(&self, y: &mut [f32]) {
        let d_all = f16_to_f32(self.d);
        let sc = unpack_scales(&self.scales);
        let q = self.unpack();
        for (i, (y, &q)) in y[..QK_K].iter_mut().zip(&q).enumerate() {
            let dl = d_all * (sc[i / 16] as i32 - 32) as f32;
            *y = dl * q as f32;
        }
    }
}

/// The 16 unsigned 6-bit scales: low nibbles from bytes 0..8 (j < 8 low, j >= 8 high
/// nibble of byte `j - 8`), top two bits from bytes 8..12.
#[inline]
pub fn unpack_scales(s: &[u8; 12]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let lo = if j < 8 { s[j] & 0xf } else { s[j - 8] >> 4 };
        let hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = lo | (hi << 4);
    }
    out
}

/// [`unpack_scales`] as 16 little-endian bytes (scales 0..8, 8..16), computed in u32/u64
/// words: the form the SIMD kernels load them in.
#[inline(always)]
pub(crate) fn unpack_scales_lanes(s: &[u8]) -> (u64, u64) {
    let lo = u64::from_le_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]);
    let a2 = u32::from_le_bytes([s[8], s[9], s[10], s[11]]);
    let m2 = 0x0303_0303u32;
    let m4 = 0x0f0f_0f0f_0f0f_0f0fu64;
    // Scale j: low nibble from byte j (j < 8) or the high nibble of byte j - 8, top two
    // bits from bits 2*(j/4).. of byte 8 + j%4.
    let top_a = (a2 & m2) as u64 | (((a2 >> 2) & m2) as u64) << 32;
    let top_b = ((a2 >> 4) & m2) as u64 | (((a2 >> 6) & m2) as u64) << 32;
    ((lo & m4) | top_a << 4, ((lo >> 4) & m4) | top_b << 4)
}

impl BlockQ3K {
    /// The 256 signed quants (`-4..=3`) in element order.
    #[inline]
    pub(crate) fn unpack(&self) -> [i8; QK_K] {
        let mut a = [0i8; QK_K];
        for (j, a) in a.iter_mut().enumerate() {
            let (h, r) = (j / 128, j % 128);
            let (shift, l) = (2 * (r / 32), r % 32);
            let low = ((self.qs[32 * h + l] >> shift) & 3) as i8;
            let high_clear = self.hmask[l] & (1 << (j / 32)) == 0;
            *a = low - if high_clear { 4 } else { 0 };
        }
        a
    }
}

/// The exact integer lanes of a super-block in ggml's AVX2 layout: lane `l` of eight sums
/// `(sc_s - 32) · Σ q·y` over elements `32c + 4l..32c + 4l + 4` of every 32-element chunk
/// `c`, `s` the 16-element sub-block they lie in (`2c + l / 4`).
#[inline]
fn lane_sums(x: &BlockQ3K, y: &BlockQ8K) -> [i32; 8] {
    let q = x.unpack();
    let sc = unpack_scales(&x.scales);
    let mut lanes = [0i32; 8];
    for c in 0..8 {
        for (l, lane) in lanes.iter_mut().enumerate() {
            let e = 32 * c + 4 * l;
            let p: i32 = (e..e + 4).map(|e| q[e] as i32 * y.qs[e] as i32).sum();
            *lane += (sc[e / 16] as i32 - 32) * p;
        }
    }
    lanes
}

/// Dot with a Q8_K activation row in the order of ggml's AVX2 `ggml_vec_dot_q3_K_q8_K`,
/// what llama.cpp's x86 builds (AVX-512 ones too) run below eight tokens
/// ([`crate::DotOrder::Single`]): per super-block the eight integer lanes of [`lane_sums`]
/// fused into eight float lanes, `acc_l = fma(y.d · x.d, f32(s_l), acc_l)`, then
/// `hsum_float_8`.
pub fn vec_dot_q8k(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ3K, BlockQ8K>(w, a);
    let mut acc = [0.0f32; 8];
    for i in 0..nb {
        let x = BlockQ3K::read(&w[i * BlockQ3K::BYTES..]);
        let y = BlockQ8K::read(&a[i * BlockQ8K::BYTES..]);
        let d = y.d * f16_to_f32(x.d);
        for (acc, s) in acc.iter_mut().zip(lane_sums(&x, &y)) {
            *acc = d.mul_add(s as f32, *acc);
        }
    }
    hsum_lanes(&acc)
}

/// Dot with a Q8_K activation row in the order of ggml's tiled GEMM for Q3_K, which
/// llama.cpp runs from eight tokens up ([`crate::DotOrder::Tiled`]; also the fast order):
/// per super-block one exact integer sum `s = Σ_s (sc_s - 32) · Σ q·y`, then
/// `acc = fma(f32(s) · x.d, y.d, acc)`.
pub fn vec_dot_q8k_tiled(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ3K, BlockQ8K>(w, a);
    let mut acc = 0.0f32;
    for i in 0..nb {
        let x = BlockQ3K::read(&w[i * BlockQ3K::BYTES..]);
        let y = BlockQ8K::read(&a[i * BlockQ8K::BYTES..]);
        let s: i32 = lane_sums(&x, &y).iter().sum();
        acc = (s as f32 * f16_to_f32(x.d)).mul_add(y.d, acc);
    }
    acc
}

/// `ggml_vec_dot_q3_K_q8_K_generic`: same lane structure as Q6_K with `sc - 32` scales.
pub fn vec_dot_q8k_ref(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ3K, BlockQ8K>(w, a);
    let mut sums = [0.0f32; 8];
    for i in 0..nb {
        let x = BlockQ3K::read(&w[i * BlockQ3K::BYTES..]);
        let y = BlockQ8K::read(&a[i * BlockQ8K::BYTES..]);
        let aux8 = x.unpack();
        let sc = unpack_scales(&x.scales);
        let mut aux32 = [0i32; 8];
        for j in 0..QK_K / 16 {
            let scale = sc[j] as i32 - 32;
            for g in 0..2 {
                let base = 16 * j + 8 * g;
                for l in 0..8 {
                    aux32[l] += scale * (y.qs[base + l] as i32 * aux8[base + l] as i32);
                }
            }
        }
        let d = f16_to_f32(x.d) * y.d;
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
    }
    let mut sumf = 0.0f32;
    for s in sums {
        sumf += s;
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_lanes_match_unpack_scales() {
        let mut x = 0x2545_f491u32;
        for _ in 0..1000 {
            let packed: [u8; 12] = std::array::from_fn(|_| {
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (x >> 24) as u8
            });
            let (a, b) = unpack_scales_lanes(&packed);
            let lanes: Vec<u8> = a.to_le_bytes().into_iter().chain(b.to_le_bytes()).collect();
            assert_eq!(lanes, unpack_scales(&packed), "{packed:?}");
        }
    }
}
