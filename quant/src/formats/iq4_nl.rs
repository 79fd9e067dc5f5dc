//! IQ4_NL: 32 values as `KVALUES[q] * d` with 4-bit indices `q` into a fixed non-linear
//! table of signed bytes and one f16 scale per block (4.5 bits/weight). Element `j` sits
//! in the low nibble of byte `j`, element `j + 16` in its high nibble, as in Q4_0.
//!
//! Its dot products with Q8_0 activations are MXFP4's, with this table and an f16 scale
//! ([`super::lut`]): ggml's AVX2 `vec_dot` ([`vec_dot_q8_0`], [`crate::DotOrder::Single`]),
//! the repacked `iq4_nl_8x8_q8_0` gemv and gemm llama.cpp runs for matrices whose row
//! count is a multiple of eight ([`vec_dot_q8_0_repacked`], [`crate::DotOrder::Gemm4`]),
//! and the generic C dot ([`vec_dot_q8_0_ref`]).
//!
//! The quantizer is `quantize_iq4_nl` without an importance matrix, what
//! `llama-quantize` writes (a search over 15 scales per block); [`quantize_ref`] is
//! ggml's `quantize_row_iq4_nl_ref` (the first scale only).

use super::common::{rd_arr, rd_u16, Block};
use super::legacy::{nibble, QK};
use super::lut::{self, Lut32};
use crate::f16::{f16_to_f32, f32_to_f16};
use crate::GgmlType;

/// ggml's `kvalues_iq4nl`.
pub const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// What the VNNI kernels add to a value to make it an unsigned byte (`1..=241`).
pub const OFFSET: i32 = 128;

/// ggml's `GROUP_MAX_EPS`: a block whose largest magnitude is below it has scale 0.
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// `block_iq4_nl`: the f16 scale, then 16 bytes of 4-bit indices.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIq4Nl {
    pub d: u16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockIq4Nl>() == 18);

/// ggml's `best_index_int8`: the table entry nearest to `x` by bisection (ties to the
/// upper entry, as its last comparison is strict).
#[inline]
pub(crate) fn best_index(x: f32) -> u8 {
    let v = |i: usize| KVALUES[i] as f32;
    if x <= v(0) {
        return 0;
    }
    if x >= v(15) {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < v(mav) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - v(mu - 1) < v(mu) - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// The per-block part of `quantize_row_iq4_nl_impl` without an importance matrix
/// (weights `x^2`), shared with IQ4_XS's 32-element sub-blocks: the best scale of the
/// block and the indices found along the way, or None for a block below
/// [`GROUP_MAX_EPS`]. `ntry` 7 is `quantize_iq4_nl`'s (and `quantize_iq4_xs`'s) search,
/// -1 the reference's single scale.
pub(crate) fn search_block(x: &[f32], ntry: i32) -> Option<(f32, [u8; QK])> {
    let x = &x[..QK];
    let weight: [f32; QK] = std::array::from_fn(|j| x[j] * x[j]);
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        return None;
    }
    let v0 = KVALUES[0] as f32;
    let mut l = [0u8; QK];
    let mut d = if ntry > 0 { -max / v0 } else { max / v0 };
    let id = 1.0 / d;
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for j in 0..QK {
        let li = best_index(id * x[j]);
        l[j] = li;
        let q = KVALUES[li as usize] as f32;
        let w = weight[j];
        sumqx += w * q * x[j];
        sumq2 += w * q * q;
    }
    d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -ntry..=ntry {
        let id = (itry + KVALUES[0] as i32) as f32 / max;
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for j in 0..QK {
            let q = KVALUES[best_index(id * x[j]) as usize] as f32;
            let w = weight[j];
            sumqx += w * q * x[j];
            sumq2 += w * q * q;
        }
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    Some((d, l))
}

/// `quantize_row_iq4_nl_impl` for one 32-element block without an importance matrix
/// ([`search_block`]). The indices of a block below [`GROUP_MAX_EPS`] are ggml's for
/// `ntry > 0`; the reference leaves them to whatever its buffer held, so they are zero
/// here (its scale is 0 either way).
fn quantize_impl(x: &[f32], ntry: i32) -> BlockIq4Nl {
    let (scale, mut l) = search_block(x, ntry).unwrap_or((0.0, [0; QK]));
    if ntry > 0 {
        let id = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        for j in 0..QK {
            l[j] = best_index(id * x[j]);
        }
    }
    BlockIq4Nl {
        d: f32_to_f16(scale),
        qs: std::array::from_fn(|j| l[j] | (l[QK / 2 + j] << 4)),
    }
}

/// ggml's `quantize_row_iq4_nl_ref` for one block (see [`quantize_impl`]).
pub fn quantize_ref(x: &[f32]) -> BlockIq4Nl {
    quantize_impl(x, -1)
}

impl Lut32 for BlockIq4Nl {
    #[inline(always)]
    fn value(&self, j: usize) -> i32 {
        KVALUES[nibble(&self.qs, j) as usize] as i32
    }
    #[inline(always)]
    fn scale(&self) -> f32 {
        f16_to_f32(self.d)
    }
}

impl Block for BlockIq4Nl {
    const TYPE: GgmlType = GgmlType::IQ4_NL;
    const BLOCK_ELEMS: usize = QK;
    const BYTES: usize = 18;
    fn read(b: &[u8]) -> Self {
        Self {
            d: rd_u16(b, 0),
            qs: rd_arr(b, 2),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..18].copy_from_slice(&self.qs);
    }

    /// `quantize_iq4_nl` (what `llama-quantize` writes without an importance matrix).
    fn quantize(x: &[f32]) -> Self {
        quantize_impl(x, 7)
    }

    /// `dequantize_row_iq4_nl` for one block: `d * KVALUES[q]`.
    fn dequantize(&self, y: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (j, y) in y[..QK].iter_mut().enumerate() {
            *y = d * self.value(j) as f32;
        }
    }
}

/// Dot with a Q8_0 activation row in the order of `ggml_vec_dot_iq4_nl_q8_0` on AVX2
/// ([`crate::DotOrder::Single`]; what [`crate::vec_dot`] computes).
pub fn vec_dot_q8_0(w: &[u8], a: &[u8]) -> f32 {
    lut::vec_dot_paired::<BlockIq4Nl>(w, a)
}

/// Dot with a Q8_0 activation row in the order of llama.cpp's repacked IQ4_NL kernels
/// (`gemv`/`gemm_iq4_nl_8x8_q8_0`; [`crate::DotOrder::Gemm4`]).
pub fn vec_dot_q8_0_repacked(w: &[u8], a: &[u8]) -> f32 {
    lut::vec_dot_repacked::<BlockIq4Nl>(w, a)
}

/// ggml's generic C `ggml_vec_dot_iq4_nl_q8_0_generic`.
pub fn vec_dot_q8_0_ref(w: &[u8], a: &[u8]) -> f32 {
    lut::vec_dot_generic::<BlockIq4Nl>(w, a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_index_bisects_to_the_nearest_entry() {
        assert_eq!(best_index(-200.0), 0);
        assert_eq!(best_index(200.0), 15);
        assert_eq!(best_index(0.0), 8); // 1 is nearer than -10
        assert_eq!(best_index(-4.5), 8); // halfway between -10 and 1: a tie goes up
        assert_eq!(best_index(-4.6), 7);
        for (i, &v) in KVALUES.iter().enumerate() {
            assert_eq!(best_index(v as f32) as usize, i);
        }
    }

    #[test]
    fn quantizer_round_trips_table_multiples() {
        // Values on the table at scale 0.5: the search finds that scale, every index exact.
        let x: [f32; 32] = std::array::from_fn(|j| KVALUES[j % 16] as f32 * 0.5);
        for b in [BlockIq4Nl::quantize(&x), quantize_ref(&x)] {
            let mut y = [0.0f32; 32];
            b.dequantize(&mut y);
            assert_eq!(y, x);
        }
        let z = BlockIq4Nl::quantize(&[0.0; 32]);
        assert_eq!((z.d, z.qs), (0, [0x88; 16]));
    }

    #[test]
    fn orders_agree_on_exact_inputs() {
        let mut w = vec![0u8; 3 * 18];
        let mut a = vec![0u8; 3 * 34];
        for i in 0..3 {
            w[i * 18..i * 18 + 2].copy_from_slice(&f32_to_f16(1.0).to_le_bytes());
            for j in 0..16 {
                w[i * 18 + 2 + j] = j as u8 * 7 + i as u8;
            }
            a[i * 34..i * 34 + 2].copy_from_slice(&f32_to_f16(1.0).to_le_bytes());
            for j in 0..32 {
                a[i * 34 + 2 + j] = (j as i8 - 16) as u8;
            }
        }
        let exact: f32 = (0..3)
            .map(|i| {
                let x = BlockIq4Nl::read(&w[i * 18..]);
                let y = crate::formats::q8_0::BlockQ8_0::read(&a[i * 34..]);
                lut::block_sum(&x, &y) as f32
            })
            .sum();
        assert_eq!(vec_dot_q8_0(&w, &a), exact);
        assert_eq!(vec_dot_q8_0_repacked(&w, &a), exact);
        assert_eq!(vec_dot_q8_0_ref(&w, &a), exact);
    }
}
