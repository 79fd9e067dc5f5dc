//! What the 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1) share once a block can
//! say what its 32 integer quants are ([`Quants32`]): dequantization and the dot products
//! with Q8_0 / Q8_1 activations, in ggml's x86 lane order (what the kernels compute) and in
//! its generic C order (`*_ref`, proven against ggml's own outputs). Each format's module
//! keeps its layout, quantizer and the one accessor that differs.

use super::common::{c_max, check_dot, Block};
use super::q8_0::BlockQ8_0;
use super::q8_1::BlockQ8_1;
use crate::f16::f16_to_f32;
use crate::order::{hsum_lanes, lanes_add_block};

/// Elements per block.
pub(crate) const QK: usize = 32;

/// A 32-element block as integers and scales: element `j` is `q(j) * d (+ m)`.
pub(crate) trait Quants32: Block {
    /// Element `j`'s integer quant, with a signed format's offset already subtracted.
    fn q(&self, j: usize) -> i32;
    /// f16 bits of the scale.
    fn d_bits(&self) -> u16;
    /// f16 bits of the min of the unsigned formats (Q4_1, Q5_1).
    fn m_bits(&self) -> Option<u16> {
        None
    }
    /// ggml's generic dot rounds `sumi * dx * dy` left to right (Q4_0) rather than
    /// `sumi * (dx * dy)` (the others).
    const REF_SCALES_LEFT_TO_RIGHT: bool = false;
}

/// The low nibble of byte `j` for the first half of a block, the high nibble of byte
/// `j - 16` for the second (the Q4/Q5 packing).
#[inline(always)]
pub(crate) fn nibble(qs: &[u8; QK / 2], j: usize) -> u8 {
    if j < QK / 2 {
        qs[j] & 0x0f
    } else {
        qs[j - QK / 2] >> 4
    }
}

/// `dequantize_row_q*` for one block: `q * d`, plus `m` for the unsigned formats.
pub(crate) fn dequantize_block<B: Quants32>(b: &B, y: &mut [f32]) {
    let d = f16_to_f32(b.d_bits());
    match b.m_bits().map(f16_to_f32) {
        Some(m) => (0..QK).for_each(|j| y[j] = b.q(j) as f32 * d + m),
        None => (0..QK).for_each(|j| y[j] = b.q(j) as f32 * d),
    }
}

/// Dot with a Q8_0 activation row in ggml's x86 SIMD order (eight exact lanes per block,
/// fused into float lanes, [`hsum_lanes`] at the end; see [`lanes_add_block`]).
pub(crate) fn dot_q8_0<W: Quants32>(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<W, BlockQ8_0>(w, a);
    let mut acc = [0.0f32; 8];
    for i in 0..nb {
        let x = W::read(&w[i * W::BYTES..]);
        let y = BlockQ8_0::read(&a[i * BlockQ8_0::BYTES..]);
        let d = f16_to_f32(x.d_bits()) * f16_to_f32(y.d);
        lanes_add_block(&mut acc, d, |j| x.q(j) * y.qs[j] as i32);
    }
    hsum_lanes(&acc)
}

/// Dot with a Q8_1 activation row in ggml's x86 SIMD order: the lanes as [`dot_q8_0`], the
/// `m * s` terms in a separate running sum (one FMA per block) added at the end.
pub(crate) fn dot_q8_1<W: Quants32>(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<W, BlockQ8_1>(w, a);
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for i in 0..nb {
        let x = W::read(&w[i * W::BYTES..]);
        let y = BlockQ8_1::read(&a[i * BlockQ8_1::BYTES..]);
        let m = f16_to_f32(x.m_bits().unwrap_or(0));
        summs = m.mul_add(f16_to_f32(y.s), summs);
        let d = f16_to_f32(x.d_bits()) * f16_to_f32(y.d);
        lanes_add_block(&mut acc, d, |j| x.q(j) * y.qs[j] as i32);
    }
    hsum_lanes(&acc) + summs
}

/// Dot with a Q8_0 activation row in the fast order ([`crate::DotOrder::Fast`]): one exact
/// integer sum per block, `acc = (dx * dy).mul_add(sumi, acc)`.
pub(crate) fn dot_q8_0_fast<W: Quants32>(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<W, BlockQ8_0>(w, a);
    let mut acc = 0.0f32;
    for i in 0..nb {
        let x = W::read(&w[i * W::BYTES..]);
        let y = BlockQ8_0::read(&a[i * BlockQ8_0::BYTES..]);
        let sumi: i32 = (0..QK).map(|j| x.q(j) * y.qs[j] as i32).sum();
        let d = f16_to_f32(x.d_bits()) * f16_to_f32(y.d);
        acc = d.mul_add(sumi as f32, acc);
    }
    acc
}

/// Dot with a Q8_1 activation row in the fast order: per block
/// `acc = (dx * dy).mul_add(sumi, acc)` then `acc = m.mul_add(s, acc)`.
pub(crate) fn dot_q8_1_fast<W: Quants32>(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<W, BlockQ8_1>(w, a);
    let mut acc = 0.0f32;
    for i in 0..nb {
        let x = W::read(&w[i * W::BYTES..]);
        let y = BlockQ8_1::read(&a[i * BlockQ8_1::BYTES..]);
        let sumi: i32 = (0..QK).map(|j| x.q(j) * y.qs[j] as i32).sum();
        let d = f16_to_f32(x.d_bits()) * f16_to_f32(y.d);
        acc = d.mul_add(sumi as f32, acc);
        let m = f16_to_f32(x.m_bits().unwrap_or(0));
        acc = m.mul_add(f16_to_f32(y.s), acc);
    }
    acc
}

/// ggml's generic (reference) `ggml_vec_dot_q*_q8_0`: one exact integer sum per block,
/// scaled and added in C's order.
pub(crate) fn dot_q8_0_ref<W: Quants32>(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<W, BlockQ8_0>(w, a);
    let mut sumf = 0.0f32;
    for i in 0..nb {
        let x = W::read(&w[i * W::BYTES..]);
        let y = BlockQ8_0::read(&a[i * BlockQ8_0::BYTES..]);
        let sumi: i32 = (0..QK).map(|j| x.q(j) * y.qs[j] as i32).sum();
        let (dx, dy) = (f16_to_f32(x.d_bits()), f16_to_f32(y.d));
        sumf += if W::REF_SCALES_LEFT_TO_RIGHT {
            sumi as f32 * dx * dy
        } else {
            sumi as f32 * (dx * dy)
        };
    }
    sumf
}

/// ggml's generic (reference) `ggml_vec_dot_q*_1_q8_1`: `(dx * dy) * sumi + m * s` per
/// block.
pub(crate) fn dot_q8_1_ref<W: Quants32>(w: &[u8], a: &[u8]) -> f32 {
    let nb = check_dot::<W, BlockQ8_1>(w, a);
    let mut sumf = 0.0f32;
    for i in 0..nb {
        let x = W::read(&w[i * W::BYTES..]);
        let y = BlockQ8_1::read(&a[i * BlockQ8_1::BYTES..]);
        let sumi: i32 = (0..QK).map(|j| x.q(j) * y.qs[j] as i32).sum();
        let m = f16_to_f32(x.m_bits().unwrap_or(0));
        sumf += (f16_to_f32(x.d_bits()) * f16_to_f32(y.d)) * sumi as f32 + m * f16_to_f32(y.s);
    }
    sumf
}

/// The 8-bit quants of one block (Q8_0, Q8_1) and their scale `d = amax / 127`: ggml's
/// reference rounding (`id = 1/d`, half away from zero) or, with `simd`, the rounding of
/// its x86 activation quantizer (`id = 127/amax`, half to even). The two differ in rare
/// last units; activations use the SIMD one so our dot products see llama.cpp's inputs.
pub(crate) fn quants_q8(x: &[f32], simd: bool) -> (f32, [i8; QK]) {
    let mut amax = 0.0f32;
    for &v in &x[..QK] {
        amax = c_max(amax, v.abs());
    }
    let d = amax / 127.0;
    let mut qs = [0i8; QK];
    if simd {
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = (v * id).round_ties_even() as i8;
        }
    } else {
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = (v * id).round() as i8;
        }
    }
    (d, qs)
}

/// The value of largest magnitude in a block (the first one on ties), which the signed
/// 4/5-bit formats map to their most negative quant.
pub(crate) fn signed_extreme(x: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in &x[..QK] {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// The block's minimum and maximum with C's comparisons (NaNs never win).
pub(crate) fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in &x[..QK] {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// 4-bit quants `q(j)` packed as Q4_0/Q4_1 store them: byte `j` holds element `j` in its
/// low nibble and element `j + 16` in its high one (C's `xi0 | (xi1 << 4)` on bytes).
pub(crate) fn pack_q4(q: impl Fn(usize) -> u8) -> [u8; QK / 2] {
    std::array::from_fn(|j| q(j) | (q(QK / 2 + j) << 4))
}

/// 5-bit quants `q(j)` packed as Q5_0/Q5_1 store them: the low nibbles as [`pack_q4`],
/// bit 4 of element `j` in bit `j` of `qh`.
pub(crate) fn pack_q5(q: impl Fn(usize) -> u8) -> ([u8; QK / 2], [u8; 4]) {
    let mut qs = [0u8; QK / 2];
    let mut qh = 0u32;
    for j in 0..QK / 2 {
        let (xi0, xi1) = (q(j), q(QK / 2 + j));
        qs[j] = (xi0 & 0x0f) | ((xi1 & 0x0f) << 4);
        qh |= ((xi0 as u32 & 0x10) >> 4) << j;
        qh |= ((xi1 as u32 & 0x10) >> 4) << (j + QK / 2);
    }
    (qs, qh.to_le_bytes())
}
