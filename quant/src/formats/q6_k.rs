//! Q6_K: 256 values in 16 sub-blocks of 16, each `d*sc*(q - 32)` with 6-bit `q` split into
//! a 4-bit plane (`ql`) and a 2-bit plane (`qh`), signed 8-bit `sc` (6.5625 bits/weight).
//!
//! Per 128-value half: `ql[l]` holds elements `l` (low nibble) and `l+64` (high),
//! `ql[l+32]` elements `l+32` and `l+96`; `qh[l]` holds the top 2 bits of all four.

use super::common::{check_dot, nearest_int, rd_arr, rd_i8_arr, rd_u16, wr_i8_arr, Block, QK_K};
use super::q8_k::BlockQ8K;
use super::search::{make_qx_quants, GROUP_MAX_EPS};
use crate::f16::{f16_to_f32, f32_to_f16};
use crate::order::hsum_lanes;
use crate::GgmlType;

/// `block_q6_K`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: u16,
}
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

impl Block for BlockQ6K {
    const TYPE: GgmlType = GgmlType::Q6_K;
    const BLOCK_ELEMS: usize = QK_K;
    const BYTES: usize = 210;
    fn read(b: &[u8]) -> Self {
        Self {
            ql: rd_arr(b, 0),
            qh: rd_arr(b, 128),
            scales: rd_i8_arr(b, 192),
            d: rd_u16(b, 208),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[..128].copy_from_slice(&self.ql);
        out[128..192].copy_from_slice(&self.qh);
        wr_i8_arr(out, 192, &self.scales);
        out[208..210].copy_from_slice(&self.d.to_le_bytes());
    }

    /// `quantize_row_q6_K_ref`: x²-weighted `make_qx_quants` per 16 values, signed 8-bit
    /// sub-block scales relative to the largest-magnitude one, then requantization.
    fn quantize(x: &[f32]) -> Self {
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; QK_K / 16];
        let mut max_scale = 0.0f32;
        let mut max_abs_scale = 0.0f32;
        for ib in 0..QK_K / 16 {
            let scale = make_qx_quants(
                32,
                &x[16 * ib..16 * ib + 16],
                &mut l[16 * ib..16 * ib + 16],
                1,
                None,
            );
            scales[ib] = scale;
            let abs_scale = scale.abs();
            if abs_scale > max_abs_scale {
                max_abs_scale = abs_scale;
                max_scale = scale;
            }
        }
        let mut b = BlockQ6K {
            ql: [0; QK_K / 2],
            qh: [0; QK_K / 4],
            scales: [0; QK_K / 16],
            d: 0,
        };
        if max_abs_scale < GROUP_MAX_EPS {
            return b;
        }
        let iscale = -128.0f32 / max_scale;
        b.d = f32_to_f16(1.0 / iscale);
        for ib in 0..QK_K / 16 {
            b.scales[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
        }
        for j in 0..QK_K / 16 {
            let d = f16_to_f32(b.d) * b.scales[j] as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let li = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
                l[16 * j + ii] = (li + 32) as i8;
            }
        }
        let l: [u8; QK_K] = l.map(|v| v as u8);
        for h in 0..2 {
            let (ql, qh, l) = (
                &mut b.ql[64 * h..64 * h + 64],
                &mut b.qh[32 * h..32 * h + 32],
                &l[128 * h..128 * h + 128],
            );
            for i in 0..32 {
                let (q1, q2, q3, q4) = (
                    l[i] & 0xf,
                    l[i + 32] & 0xf,
                    l[i + 64] & 0xf,
                    l[i + 96] & 0xf,
                );
                ql[i] = q1 | (q3 << 4);
                ql[i + 32] = q2 | (q4 << 4);
                qh[i] = (l[i] >> 4)
                    | ((l[i + 32] >> 4) << 2)
                    | ((l[i + 64] >> 4) << 4)
                    | ((l[i + 96] >> 4) << 6);
            }
        }
        b
    }

    /// `dequantize_row_q6_K` for one block: `(d * sc) * q`.
    fn dequantize(&self, y: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let q = self.unpack();
        for (i, (y, &q)) in y[..QK_K].iter_mut().zip(&q).enumerate() {
            *y = d * self.scales[i / 16] as f32 * q as f32;
        }
    }
}

impl BlockQ6K {
    /// The 256 signed quants (`-32..=31`) in element order.
    #[inline]
    pub(crate) fn unpack(&self) -> [i8; QK_K] {
        let mut q = [0i8; QK_K];
        for h in 0..2 {
            let (ql, qh) = (&self.ql[64 * h..64 * h + 64], &self.qh[32 * h..32 * h + 32]);
            let q = &mut q[128 * h..128 * h + 128];
            for l in 0..32 {
                q[l] = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i8 - 32;
                q[l + 32] = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                q[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                q[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            }
        }
        q
    }
}

/// Dot with a Q8_K activation row in ggml's x86 AVX2 order; what [`crate::vec_dot`]
/// computes. Per super-block: eight exact i32 lanes, lane `l` summing over the eight
/// 32-element chunks `c` the unsigned 6-bit quants times activations of elements
/// `32c + 4l..+4`, each times its 16-element scale, minus `32 * (bsums[2l] * sc[2l] +
/// bsums[2l+1] * sc[2l+1])` (the -32 offset); then `acc[l] = fma(y.d * d, lane, acc[l])`
/// and `hsum_lanes` at the end.
pub fn vec_dot_q8k(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ6K, BlockQ8K>(w, a);
    let mut acc = [0.0f32; 8];
    for i in 0..nb {
        let x = BlockQ6K::read(&w[i * BlockQ6K::BYTES..]);
        let y = BlockQ8K::read(&a[i * BlockQ8K::BYTES..]);
        let q = x.unpack();
        let d = y.d * f16_to_f32(x.d);
        for (l, acc) in acc.iter_mut().enumerate() {
            let mut sumi = 0i32;
            for c in 0..8 {
                let e0 = 32 * c + 4 * l;
                let s: i32 = (e0..e0 + 4)
                    .map(|e| (q[e] as i32 + 32) * y.qs[e] as i32)
                    .sum();
                sumi += x.scales[e0 / 16] as i32 * s;
            }
            let sub = y.bsums[2 * l] as i32 * x.scales[2 * l] as i32
                + y.bsums[2 * l + 1] as i32 * x.scales[2 * l + 1] as i32;
            *acc = d.mul_add(sumi.wrapping_sub(sub << 5) as f32, *acc);
        }
    }
    hsum_lanes(&acc)
}

/// Dot with a Q8_K activation row in the order of ggml's tiled GEMM (`ggml-cpu/tiled`),
/// which llama.cpp's x86 backend runs for Q6_K weights on micro-batches of 8 or more
/// tokens ([`crate::DotOrder::Tiled`]): per super-block the exact integer
/// `s1 = Σ_s sc[s] · (Σ_{e∈s} q[e] · y[e] - 32 · bsums[s])` (unsigned 6-bit `q`; the
/// bsums stand for `Σ y`, as in ggml), then `acc = fma(f32(s1) · d, y.d, acc)` into
/// one float (the AVX-512-VNNI and the AVX2 builds agree: GCC contracts the VNNI
/// epilogue's multiply-add too).
pub fn vec_dot_q8k_tiled(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ6K, BlockQ8K>(w, a);
    let mut acc = 0.0f32;
    for i in 0..nb {
        let x = BlockQ6K::read(&w[i * BlockQ6K::BYTES..]);
        let y = BlockQ8K::read(&a[i * BlockQ8K::BYTES..]);
        let q = x.unpack();
        let mut s1 = 0i32;
        for (s, &sc) in x.scales.iter().enumerate() {
            let p: i32 = (16 * s..16 * s + 16)
                .map(|e| (q[e] as i32 + 32) * y.qs[e] as i32)
                .sum();
            s1 = s1.wrapping_add(sc as i32 * (p - 32 * y.bsums[s] as i32));
        }
        acc = (s1 as f32 * f16_to_f32(x.d)).mul_add(y.d, acc);
    }
    acc
}

/// `ggml_vec_dot_q6_K_q8_K_generic`: per-16 signed scales, 8 integer lanes per block,
/// 8 float lanes across blocks.
pub fn vec_dot_q8k_ref(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<BlockQ6K, BlockQ8K>(w, a);
    let mut sums = [0.0f32; 8];
    for i in 0..nb {
        let x = BlockQ6K::read(&w[i * BlockQ6K::BYTES..]);
        let y = BlockQ8K::read(&a[i * BlockQ8K::BYTES..]);
        let aux8 = x.unpack();
        let mut aux32 = [0i32; 8];
        for j in 0..QK_K / 16 {
            let scale = x.scales[j] as i32;
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
