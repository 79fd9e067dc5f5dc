//! Row-interleaved repacking of the 32-element formats for the fast order's kernels.
//!
//! The fast order multiplies eight weight rows at a time with each row in one lane of a
//! register: its kernels unpack a block of each of the eight rows and transpose them, so
//! that register `k` holds elements `4k..4k+4` of every row (row `r` in bytes
//! `4r..4r+4`). [`pack8`] does that rearrangement once, at load: a group of eight rows is
//! stored block after block, each block of the group holding, in this order,
//!
//! * the eight rows' scales `d` (f16), then their mins `m` (f16) for Q4_1 / Q5_1; for
//!   MXFP4 the eight rows' exponent bytes `e`;
//! * the quants, already in the kernel's transposed order: for Q8_0 the eight 32-byte
//!   registers as stored (signed bytes); for the 4-bit formats four 32-byte vectors, vector
//!   `v` holding register `2v` in its low nibbles and register `2v + 1` in its high ones
//!   (unsigned stored values, `q + offset` for Q4_0 / Q5_0, MXFP4's and IQ4_NL's table
//!   indices);
//! * for Q5_0 / Q5_1, 32 bytes of fifth bits: bit `k` of byte `b` is the fifth bit of
//!   byte `b` of register `k`.
//!
//! The K-quants Q4_K, Q5_K and Q6_K are packed the same way per 256-element super-block,
//! with their sub-block scales unpacked and transposed too ([`pack8`] documents the
//! layouts).
//!
//! A block of a group is exactly eight blocks' bytes, so a group occupies the bytes of its
//! eight rows and row offsets keep their meaning (an MXFP4 block of a group: 8 + 128 =
//! 136 bytes, eight 17-byte blocks). The values are the same, only their places move: a
//! packed kernel returns the bits of the unpacked kernel of its order.

use crate::{GgmlType, QuantError};

/// Rows per packed group.
pub const PACK_ROWS: usize = 8;

/// Whether [`pack8`] takes weights of `ty`.
pub fn packs(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::MXFP4
            | GgmlType::IQ4_NL
            | GgmlType::IQ4_XS
            | GgmlType::Q3_K
    )
}

/// Per-format layout facts: block bytes, header bytes (scales and mins) before the quants,
/// offset of the quants and of the fifth bits in a source block.
struct Layout {
    wb: usize,
    /// Scale fields per row at the start of a block (1: d, 2: d and m).
    heads: usize,
    /// Bytes per scale field (2: f16, 1: MXFP4's exponent).
    head_bytes: usize,
    qs: usize,
    qh: Option<usize>,
    eight_bit: bool,
}

fn layout(ty: GgmlType) -> Option<Layout> {
    let (wb, heads, qs, qh, eight_bit) = match ty {
        GgmlType::Q4_0 => (18, 1, 2, None, false),
        GgmlType::Q4_1 => (20, 2, 4, None, false),
        GgmlType::Q5_0 => (22, 1, 6, Some(2), false),
        GgmlType::Q5_1 => (24, 2, 8, Some(4), false),
        GgmlType::Q8_0 => (34, 1, 2, None, true),
        GgmlType::MXFP4 => (17, 1, 1, None, false),
        GgmlType::IQ4_NL => (18, 1, 2, None, false),
        _ => return None,
    };
    Some(Layout {
        wb,
        heads,
        head_bytes: if ty == GgmlType::MXFP4 { 1 } else { 2 },
        qs,
        qh,
        eight_bit,
    })
}

/// The 32 stored values of a source block: the signed bytes for Q8_0, the unsigned 4- or
/// 5-bit values for the others.
#[inline]
fn elements(l: &Layout, b: &[u8]) -> [u8; 32] {
    let mut v = [0u8; 32];
    if l.eight_bit {
        v.copy_from_slice(&b[l.qs..l.qs + 32]);
        return v;
    }
    let qs = &b[l.qs..l.qs + 16];
    for (j, &q) in qs.iter().enumerate() {
        v[j] = q & 0x0f;
        v[j + 16] = q >> 4;
    }
    if let Some(h) = l.qh {
        let qh = u32::from_le_bytes([b[h], b[h + 1], b[h + 2], b[h + 3]]);
        for (j, v) in v.iter_mut().enumerate() {
            *v |= (((qh >> j) & 1) as u8) << 4;
        }
    }
    v
}

/// Repacks `src`, whole rows of `n_in` elements of `ty` whose count is a multiple of
/// [`PACK_ROWS`], into `dst` (the same length) in the layout above.
///
/// The K-quants, per super-block of a group (the bytes of eight source blocks), rows
/// `r < 8`, register `k` holding elements `4k..4k+4` of every row as above:
///
/// * Q4_K (8 x 144 bytes): the rows' `d` (f16 x 8), their `dmin` (f16 x 8); 64 bytes, byte
///   `8b + r` = sub-block `b`'s 6-bit scale plus bits 4..6 of its min in bits 6..8; 32
///   bytes of the mins' low nibbles (entry `i = 8b + r` in byte `i % 32`, high nibble for
///   `i >= 32`); then per sub-block `b` (32 elements, registers 0..8 of it) 128 bytes of
///   quants, four vectors as for Q4_0.
/// * Q5_K (8 x 176 bytes): Q4_K's head (128 bytes), then per sub-block `b` 160 bytes: its
///   128 bytes of nibbles as Q4_K's, then 32 bytes of fifth bits, bit `k` of byte
///   `4r + e` the fifth bit of register `k`'s element `e` of row `r`.
/// * Q6_K (8 x 210 bytes): the rows' `d` (f16 x 8); 128 bytes of signed scales, byte
///   `8s + r` for 16-element sub-block `s`; then eight units of 192 bytes, unit `j` holding
///   registers `8j..8j+8` of the unsigned 6-bit quants (`q + 32`): four vectors of low
///   nibbles (vector `v`: register `8j + 2v` in its low nibbles, `8j + 2v + 1` in its high
///   ones), then two vectors of top bit pairs (vector `h`: register `8j + 4h + i`'s pair
///   in bits `2i..2i+2`). Every kernel reads a super-block front to back: the hardware
///   prefetchers see one ascending stream (two interleaved ones halved decode's
///   bandwidth).
/// * IQ4_XS (8 x 136 bytes): the rows' `d` (f16 x 8); 32 bytes of the low nibbles of the
///   six-bit sub-block scales (sub-block `b`'s in byte `16 + 8·(b % 4) + r`, nibble
///   `b / 4`); 16 bytes of their top bit pairs (byte `48 + 8·(b % 2) + r`, bits
///   `2·(b / 2)..`); then per sub-block `b` 128 bytes of table indices, four vectors as
///   for Q4_0.
/// * Q3_K (8 x 110 bytes): the rows' `d` (f16 x 8); 64 bytes of the low nibbles of the
///   16 six-bit scales (sub-block `s`'s in byte `16 + 8·(s % 8) + r`, nibble `s / 8`); 32
///   bytes of their top bit pairs (byte `80 + 8·(s % 4) + r`, bits `2·(s / 4)..`); then per
///   32-element chunk `j` 96 bytes of `q + 4` (0..=7): two vectors of low bit pairs
///   (vector `h`: register `4h + i`'s in bits `2i..2i+2`), then one vector of high bits
///   (bit `k`: register `k`'s).
pub fn pack8(ty: GgmlType, src: &[u8], n_in: usize, dst: &mut [u8]) -> Result<(), QuantError> {
    let k_quant = matches!(
        ty,
        GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::IQ4_XS
    );
    let l = match layout(ty) {
        Some(l) => l,
        None if k_quant => Layout {
            wb: ty.type_size(),
            heads: 0,
            head_bytes: 2,
            qs: 0,
            qh: None,
            eight_bit: false,
        },
        None => return Err(QuantError::Unsupported { ty, op: "pack8" }),
    };
    let be = ty.block_size();
    if n_in == 0 || !n_in.is_multiple_of(be) {
        return Err(QuantError::NotBlockMultiple {
            ty,
            n: n_in,
            block: be,
        });
    }
    let rb = n_in / be * l.wb;
    let groups = src.len() / (rb * PACK_ROWS);
    if src.len() != dst.len() || src.len() != groups * rb * PACK_ROWS {
        return Err(QuantError::SizeMismatch {
            ty,
            what: "pack8 rows (whole groups of eight, source and destination alike)",
            expected: groups.max(1) * rb * PACK_ROWS,
            actual: src.len().max(dst.len()),
        });
    }
    let nb = rb / l.wb;
    for (gs, gd) in src
        .chunks_exact(rb * PACK_ROWS)
        .zip(dst.chunks_exact_mut(rb * PACK_ROWS))
    {
        if k_quant {
            for i in 0..nb {
                let out = &mut gd[i * PACK_ROWS * l.wb..(i + 1) * PACK_ROWS * l.wb];
                out.fill(0);
                let block = |r: usize| &gs[r * rb + i * l.wb..r * rb + (i + 1) * l.wb];
                match ty {
                    GgmlType::Q4_K => pack_q45_k(block, out, false),
                    GgmlType::Q5_K => pack_q45_k(block, out, true),
                    GgmlType::IQ4_XS => pack_iq4_xs(block, out),
                    GgmlType::Q3_K => pack_q3_k(block, out),
                    _ => pack_q6_k(block, out),
                }
            }
            continue;
        }
        for i in 0..nb {
            let out = &mut gd[i * PACK_ROWS * l.wb..(i + 1) * PACK_ROWS * l.wb];
            out.fill(0);
            let block = |r: usize| &gs[r * rb + i * l.wb..r * rb + (i + 1) * l.wb];
            let hb = l.head_bytes;
            for r in 0..PACK_ROWS {
                for h in 0..l.heads {
                    out[hb * (h * PACK_ROWS + r)..hb * (h * PACK_ROWS + r + 1)]
                        .copy_from_slice(&block(r)[hb * h..hb * (h + 1)]);
                }
            }
            let q0 = hb * l.heads * PACK_ROWS;
            let (quants, fifth) = out[q0..].split_at_mut(if l.eight_bit { 256 } else { 128 });
            for r in 0..PACK_ROWS {
                let v = elements(&l, block(r));
                // Element j goes to register k = j / 4, byte 4r + j % 4.
                for k in 0..8 {
                    let src = &v[4 * k..4 * k + 4];
                    if l.eight_bit {
                        quants[32 * k + 4 * r..32 * k + 4 * r + 4].copy_from_slice(src);
                        continue;
                    }
                    let dst = &mut quants[32 * (k / 2) + 4 * r..32 * (k / 2) + 4 * r + 4];
                    for (d, &e) in dst.iter_mut().zip(src) {
                        *d |= (e & 0x0f) << (4 * (k % 2));
                    }
                    if l.qh.is_some() {
                        for (d, &e) in fifth[4 * r..4 * r + 4].iter_mut().zip(src) {
                            *d |= ((e >> 4) & 1) << k;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// `out[at..at + 4] |= v` (little-endian).
#[inline]
fn or_u32(out: &mut [u8], at: usize, v: u32) {
    let o: &mut [u8; 4] = (&mut out[at..at + 4]).try_into().expect("four bytes");
    *o = (u32::from_le_bytes(*o) | v).to_le_bytes();
}

/// One super-block of a Q4_K group (`block(r)`: row `r`'s source block) into `out`; with
/// `five`, of a Q5_K group: the same head, and each sub-block's 128 bytes of nibbles
/// followed by its 32 bytes of fifth bits (bit `k` of byte `4r + e` is register `k`'s
/// element `e` of row `r`), a sub-block every 160 bytes instead of 128.
fn pack_q45_k<'a>(block: impl Fn(usize) -> &'a [u8], out: &mut [u8], five: bool) {
    use super::search::get_scale_min_k4;
    let unit = if five { 160 } else { 128 };
    for r in 0..PACK_ROWS {
        let src = block(r);
        // Both blocks start d, dmin, scales[12]; Q5_K's qh (32 bytes) comes before its qs.
        let scales: [u8; 12] = src[4..16].try_into().expect("12 scale bytes");
        let qs = &src[if five { 48 } else { 16 }..];
        out[2 * r..2 * r + 2].copy_from_slice(&src[0..2]);
        out[16 + 2 * r..18 + 2 * r].copy_from_slice(&src[2..4]);
        for s in 0..8 {
            let (sc, mn) = get_scale_min_k4(s, &scales);
            let i = 8 * s + r;
            out[32 + i] = sc | ((mn >> 4) << 6);
            out[96 + i % 32] |= (mn & 0x0f) << (4 * (i / 32));
            // Sub-block s: low nibbles of qs[32(s/2)..] for even s, high ones for odd; four
            // elements (one register's bytes of this row) at a time.
            let q = &qs[32 * (s / 2)..32 * (s / 2) + 32];
            let base = 128 + unit * s;
            for k in 0..8 {
                let w = u32::from_le_bytes([q[4 * k], q[4 * k + 1], q[4 * k + 2], q[4 * k + 3]]);
                let v = (w >> (4 * (s % 2))) & 0x0f0f_0f0f;
                or_u32(out, base + 32 * (k / 2) + 4 * r, v << (4 * (k % 2)));
                if five {
                    // Bit s of qh[4k + e] is the fifth bit of element 4k + e of sub-block s.
                    let qh = &src[16 + 4 * k..16 + 4 * k + 4];
                    let f = u32::from_le_bytes(std::array::from_fn(|e| (qh[e] >> s) & 1));
                    or_u32(out, base + 128 + 4 * r, f << k);
                }
            }
        }
    }
}

/// One super-block of an IQ4_XS group into `out`.
fn pack_iq4_xs<'a>(block: impl Fn(usize) -> &'a [u8], out: &mut [u8]) {
    use super::common::Block;
    use super::iq4_xs::BlockIq4Xs;
    for r in 0..PACK_ROWS {
        let b = BlockIq4Xs::read(block(r));
        out[2 * r..2 * r + 2].copy_from_slice(&b.d.to_le_bytes());
        for s in 0..8 {
            let ls = (b.scale(s) + 32) as u8;
            out[16 + 8 * (s % 4) + r] |= (ls & 0x0f) << (4 * (s / 4));
            out[48 + 8 * (s % 2) + r] |= (ls >> 4) << (2 * (s / 2));
            // Element j of sub-block s: nibble j / 16 of qs[16s + j % 16].
            let q = |j: usize| (b.qs[16 * s + j % 16] >> (4 * (j / 16))) & 0x0f;
            for k in 0..8 {
                let v = u32::from_le_bytes(std::array::from_fn(|e| q(4 * k + e)));
                or_u32(out, 64 + 128 * s + 32 * (k / 2) + 4 * r, v << (4 * (k % 2)));
            }
        }
    }
}

/// One super-block of a Q3_K group into `out`.
fn pack_q3_k<'a>(block: impl Fn(usize) -> &'a [u8], out: &mut [u8]) {
    use super::common::Block;
    use super::q3_k::{unpack_scales, BlockQ3K};
    for r in 0..PACK_ROWS {
        let b = BlockQ3K::read(block(r));
        out[2 * r..2 * r + 2].copy_from_slice(&b.d.to_le_bytes());
        for (s, &ls) in unpack_scales(&b.scales).iter().enumerate() {
            out[16 + 8 * (s % 8) + r] |= (ls & 0x0f) << (4 * (s / 8));
            out[80 + 8 * (s % 4) + r] |= (ls >> 4) << (2 * (s / 4));
        }
        let q = b.unpack();
        for k in 0..64 {
            // Register k's four values of this row, offset to 0..=7; chunk j = k / 8.
            let u = u32::from_le_bytes(std::array::from_fn(|e| (q[4 * k + e] + 4) as u8));
            let (unit, k8) = (112 + 96 * (k / 8), k % 8);
            or_u32(
                out,
                unit + 32 * (k8 / 4) + 4 * r,
                (u & 0x0303_0303) << (2 * (k8 % 4)),
            );
            or_u32(out, unit + 64 + 4 * r, ((u >> 2) & 0x0101_0101) << k8);
        }
    }
}

/// One super-block of a Q6_K group into `out`.
fn pack_q6_k<'a>(block: impl Fn(usize) -> &'a [u8], out: &mut [u8]) {
    use super::common::Block;
    use super::q6_k::BlockQ6K;
    for r in 0..PACK_ROWS {
        let b = BlockQ6K::read(block(r));
        out[2 * r..2 * r + 2].copy_from_slice(&b.d.to_le_bytes());
        for (s, &sc) in b.scales.iter().enumerate() {
            out[16 + 8 * s + r] = sc as u8;
        }
        let q = b.unpack();
        for k in 0..64 {
            // Register k's four unsigned values of this row.
            let u = u32::from_le_bytes(std::array::from_fn(|e| (q[4 * k + e] + 32) as u8));
            // Unit j = k / 8 (registers 8j..8j+8) at 144 + 192j: its four nibble vectors,
            // then its two bit-pair vectors.
            let unit = 144 + 192 * (k / 8);
            let k8 = k % 8;
            or_u32(
                out,
                unit + 32 * (k8 / 2) + 4 * r,
                (u & 0x0f0f_0f0f) << (4 * (k8 % 2)),
            );
            let pairs = (u >> 4) & 0x0303_0303;
            or_u32(
                out,
                unit + 128 + 32 * (k8 / 4) + 4 * r,
                pairs << (2 * (k8 % 4)),
            );
        }
    }
}
