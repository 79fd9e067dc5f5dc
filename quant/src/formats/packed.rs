//! Row-interleaved repacking of the 32-element formats for the fast order's kernels.
//!
//! The fast order multiplies eight weight rows at a time with each row in one lane of a
//! register: its kernels unpack a block of each of the eight rows and transpose them, so
//! that register `k` holds elements `4k..4k+4` of every row (row `r` in bytes
//! `4r..4r+4`). [`pack8`] does that rearrangement once, at load: a group of eight rows is
//! stored block after block, each block of the group holding, in this order,
//!
//! * the eight rows' scales `d` (f16), then their mins `m` (f16) for Q4_1 / Q5_1;
//! * the quants, already in the kernel's transposed order: for Q8_0 the eight 32-byte
//!   registers as stored (signed bytes); for the 4-bit formats four 32-byte vectors, vector
//!   `v` holding register `2v` in its low nibbles and register `2v + 1` in its high ones
//!   (unsigned stored values, `q + offset` for Q4_0 / Q5_0);
//! * for Q5_0 / Q5_1, 32 bytes of fifth bits: bit `k` of byte `b` is the fifth bit of
//!   byte `b` of register `k`.
//!
//! A block of a group is exactly eight blocks' bytes, so a group occupies the bytes of its
//! eight rows and row offsets keep their meaning. The values are the same, only their
//! places move: a packed kernel returns the bits of the unpacked fast-order kernel.

use crate::{GgmlType, QuantError};

/// Rows per packed group.
pub const PACK_ROWS: usize = 8;

/// Whether [`pack8`] takes weights of `ty`.
pub fn packs(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0
    )
}

/// Per-format layout facts: block bytes, header bytes (scales and mins) before the quants,
/// offset of the quants and of the fifth bits in a source block.
struct Layout {
    wb: usize,
    /// f16 fields per row at the start of a block (1: d, 2: d and m).
    heads: usize,
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
        _ => return None,
    };
    Some(Layout {
        wb,
        heads,
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
pub fn pack8(ty: GgmlType, src: &[u8], n_in: usize, dst: &mut [u8]) -> Result<(), QuantError> {
    let l = layout(ty).ok_or(QuantError::Unsupported { ty, op: "pack8" })?;
    if n_in == 0 || !n_in.is_multiple_of(32) {
        return Err(QuantError::NotBlockMultiple {
            ty,
            n: n_in,
            block: 32,
        });
    }
    let rb = n_in / 32 * l.wb;
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
        for i in 0..nb {
            let out = &mut gd[i * PACK_ROWS * l.wb..(i + 1) * PACK_ROWS * l.wb];
            out.fill(0);
            let block = |r: usize| &gs[r * rb + i * l.wb..r * rb + (i + 1) * l.wb];
            for r in 0..PACK_ROWS {
                for h in 0..l.heads {
                    out[2 * (h * PACK_ROWS + r)..2 * (h * PACK_ROWS + r) + 2]
                        .copy_from_slice(&block(r)[2 * h..2 * h + 2]);
                }
            }
            let q0 = 2 * l.heads * PACK_ROWS;
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
