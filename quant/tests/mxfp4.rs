//! MXFP4: the quantizer (ggml's `quantize_row_mxfp4_ref`) against its definition and on
//! round trips, and every MXFP4 kernel of the table (each order, every ISA this CPU has:
//! one-row, tiles of every row and token count, in-place and packed tiles) against its
//! scalar twin on every exponent byte 0..=255 and every nibble, including the exponents
//! whose scales are subnormal or overflow.
//!
//! Bit-exactness against ggml itself is in `llamacpp-ref/tests/mxfp4_vs_ggml.rs`.

use quant::formats::mxfp4::{e8m0_to_f32_half, BlockMxfp4, KVALUES};
use quant::{
    dequantize_row, kernels, quantize_activations, quantize_row, ActSide, Block, DotOrder,
    GgmlType, KernelSet, SideBuf, PACK_ROWS,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const MX: GgmlType = GgmlType::MXFP4;
const ORDERS: [DotOrder; 3] = [DotOrder::Single, DotOrder::Gemm4, DotOrder::Fast];

fn floats(rng: &mut StdRng, n: usize) -> Vec<f32> {
    let scale = 10f32.powi(rng.gen_range(-6..4));
    (0..n)
        .map(|_| {
            let x: f32 = rng.gen_range(-1.0..1.0);
            if rng.gen_bool(0.03) {
                x * 30.0 * scale
            } else {
                x * scale
            }
        })
        .collect()
}

/// The element of `KVALUES` times `d` nearest to `x` (the first on ties), by brute force.
fn nearest(x: f32, d: f32) -> f32 {
    let mut best = KVALUES[0] as f32 * d;
    for &k in &KVALUES[1..] {
        let v = k as f32 * d;
        if (v - x).abs() < (best - x).abs() {
            best = v;
        }
    }
    best
}

#[test]
fn quantizer_follows_its_definition() {
    let mut rng = StdRng::seed_from_u64(1);
    for _ in 0..2000 {
        let x = floats(&mut rng, 32);
        let b = BlockMxfp4::quantize(&x);
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        // The exponent: floor(log2(amax)) - 2, so amax / scale is in [8, 16).
        let d = e8m0_to_f32_half(b.e);
        assert!(
            (7.9999..16.0).contains(&(amax / d)),
            "amax {amax} e {}",
            b.e
        );
        let mut y = [0.0f32; 32];
        b.dequantize(&mut y);
        for (&xv, &yv) in x.iter().zip(&y) {
            assert_eq!(yv, nearest(xv, d), "x {xv} scale {d}");
            // Within half the largest gap of the table (4 units), or clipped at 12.
            let bound = if xv.abs() <= 12.0 * d {
                2.0 * d
            } else {
                4.0 * d
            };
            assert!((xv - yv).abs() <= bound, "x {xv} -> {yv}, scale {d}");
        }
    }
}

#[test]
fn quantizer_round_trips() {
    let mut rng = StdRng::seed_from_u64(2);
    for _ in 0..500 {
        // Values on the grid of a block whose largest magnitude is 8 or 12 units: they
        // come back exactly, and so do the bytes (zero is always index 0).
        let k = rng.gen_range(-120..120);
        let d = 2f32.powi(k);
        let mut x: Vec<f32> = (0..32)
            .map(|_| KVALUES[rng.gen_range(0..16)] as f32 * d)
            .collect();
        x[rng.gen_range(0..32)] = if rng.gen_bool(0.5) { 12.0 } else { -8.0 } * d;
        let mut q = vec![0u8; 17];
        quantize_row(MX, &x, &mut q).unwrap();
        assert_eq!(q[0] as i32, k + 128);
        let mut y = vec![0.0f32; 32];
        dequantize_row(MX, &q, &mut y).unwrap();
        assert_eq!(x, y);
        let mut q2 = vec![0u8; 17];
        quantize_row(MX, &y, &mut q2).unwrap();
        assert_eq!(q, q2);
    }
    // Any block requantizes to itself after one round (the values are on its grid and
    // its largest magnitude keeps the exponent), for every exponent with finite values.
    for e in 3..=252u8 {
        let mut b = vec![e; 17];
        for (j, q) in b[1..].iter_mut().enumerate() {
            *q = (j as u8).wrapping_mul(37).wrapping_add(e) | 0x07;
        }
        let mut y = vec![0.0f32; 32];
        dequantize_row(MX, &b, &mut y).unwrap();
        let mut q = vec![0u8; 17];
        quantize_row(MX, &y, &mut q).unwrap();
        let mut y2 = vec![0.0f32; 32];
        dequantize_row(MX, &q, &mut y2).unwrap();
        assert_eq!(y, y2, "e {e}");
    }
}

/// Bits, or both NaN (overflowing scales give infinities of either sign; where they meet,
/// NaN payloads are not part of the contract).
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Every MXFP4 kernel set of `order` this CPU runs, scalar twin included.
fn sets(order: DotOrder) -> Vec<KernelSet> {
    kernels::available()
        .into_iter()
        .filter(|k| k.ty == MX && k.order == order)
        .collect()
}

/// Every kernel of every MXFP4 order on `rows` weight rows (a multiple of eight, packed
/// too) against `acts` activation rows: each result against the order's twin.
fn check_all(rows: &[Vec<u8>], acts: &[Vec<u8>], what: &str) -> usize {
    let n_rows = rows.len();
    let rb = rows[0].len();
    let wbuf = rows.concat();
    let stride = acts[0].len();
    let abuf = acts.concat();
    let n = rb / 17 * 32;
    let mut packed = vec![0u8; wbuf.len()];
    quant::pack8(MX, &wbuf, n, &mut packed).unwrap();
    let mut checked = 0;
    for order in ORDERS {
        let twin = kernels::scalar(MX, order).unwrap().dot;
        let want: Vec<Vec<f32>> = rows
            .iter()
            .map(|w| acts.iter().map(|a| twin(w, a)).collect())
            .collect();
        let all = sets(order);
        // x86 has SIMD rows for every order; aarch64 for llama.cpp's two (its fast order
        // falls back to the exact one, as the other formats' do).
        let neon = cfg!(target_arch = "aarch64") && order != DotOrder::Fast;
        if quant::Isa::Avx2.available() || neon {
            assert!(
                all.iter().any(|k| k.isa != quant::Isa::Scalar),
                "{order:?}: no SIMD kernel"
            );
        }
        for k in all {
            let isa = k.isa;
            for (r, w) in rows.iter().enumerate() {
                for (c, a) in acts.iter().enumerate() {
                    let got = (k.dot)(w, a);
                    assert!(
                        same(got, want[r][c]),
                        "{what} {order:?} {isa} dot ({r},{c}): {got:e} vs {:e}",
                        want[r][c]
                    );
                }
            }
            let mut side = SideBuf::default();
            for a in acts {
                side.push(&k, a);
            }
            for cols in [1, 2, 3, acts.len()] {
                let cols = cols.min(acts.len()).min(k.tile_tokens);
                let sides = [ActSide::default(), side.rows(&k, 0, cols)];
                if let Some(tile) = k.tile {
                    for nr in 1..=k.tile_rows.min(n_rows) {
                        for sd in sides {
                            let mut out = vec![f32::NAN; nr * cols];
                            tile(&wbuf[..nr * rb], nr, &abuf, stride, sd, &mut out);
                            for r in 0..nr {
                                for c in 0..cols {
                                    let got = out[r * cols + c];
                                    assert!(
                                        same(got, want[r][c]),
                                        "{what} {order:?} {isa} tile {nr}x{cols} ({r},{c}): {got:e} vs {:e}",
                                        want[r][c]
                                    );
                                }
                            }
                            checked += 1;
                        }
                    }
                }
                if let Some(into) = k.tile_into {
                    let nr = k.tile_rows.min(n_rows);
                    for sd in sides {
                        let mut m = vec![f32::NAN; cols * n_rows];
                        // SAFETY: slots c * n_rows + r (r < nr, c < cols) are in `m`.
                        unsafe {
                            into(
                                &wbuf[..nr * rb],
                                nr,
                                &abuf,
                                stride,
                                sd,
                                cols,
                                m.as_mut_ptr(),
                                n_rows,
                            )
                        };
                        for r in 0..nr {
                            for c in 0..cols {
                                assert!(
                                    same(m[c * n_rows + r], want[r][c]),
                                    "{what} {order:?} {isa} into ({r},{c})"
                                );
                            }
                        }
                        checked += 1;
                    }
                }
                if let Some(into) = k.packed_into {
                    let per = if cols <= 2 {
                        k.stream_rows
                    } else {
                        k.packed_rows
                    };
                    for per in [PACK_ROWS, per] {
                        for sd in sides {
                            let mut m = vec![f32::NAN; cols * n_rows];
                            let mut r0 = 0;
                            while r0 < n_rows {
                                let take = per.min(n_rows - r0);
                                // SAFETY: slots c * n_rows + r0 + r (r < take, c < cols)
                                // are in `m`.
                                unsafe {
                                    into(
                                        &packed[r0 * rb..(r0 + take) * rb],
                                        take,
                                        &abuf,
                                        stride,
                                        sd,
                                        cols,
                                        m.as_mut_ptr().add(r0),
                                        n_rows,
                                    )
                                };
                                r0 += take;
                            }
                            for r in 0..n_rows {
                                for c in 0..cols {
                                    assert!(
                                        same(m[c * n_rows + r], want[r][c]),
                                        "{what} {order:?} {isa} packed {per} rows ({r},{c}): {:e} vs {:e}",
                                        m[c * n_rows + r],
                                        want[r][c]
                                    );
                                }
                            }
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    checked
}

/// Activation rows of `nb` blocks: random quants in -127..=127 (or all 127), each block's
/// scale the f16 `dy`.
fn acts(rng: &mut StdRng, nb: usize, count: usize, dy: u16) -> Vec<Vec<u8>> {
    (0..count)
        .map(|t| {
            let mut a = vec![0u8; nb * 34];
            for b in a.chunks_exact_mut(34) {
                b[..2].copy_from_slice(&dy.to_le_bytes());
                for q in &mut b[2..] {
                    *q = if t == 0 {
                        127
                    } else {
                        rng.gen_range(-127i8..=127) as u8
                    };
                }
            }
            a
        })
        .collect()
}

/// Every exponent byte (scales 2^-128 to 2^127: subnormal, normal, and overflowing the
/// products) and every nibble, against every MXFP4 kernel this CPU has.
#[test]
fn every_exponent_and_nibble_matches_the_twins() {
    let mut rng = StdRng::seed_from_u64(3);
    let mut checked = 0;
    // f16 activation scales: 1, 2^-14 (smallest normal), 2^-24 (smallest subnormal).
    let dys = [0x3c00u16, 0x0400, 0x0001];
    for e in 0..=255u8 {
        let nb = [1, 2, 3, 5][e as usize % 4];
        let dy = dys[e as usize % 3];
        let rows: Vec<Vec<u8>> = (0..2 * PACK_ROWS)
            .map(|r| {
                let mut w = vec![0u8; nb * 17];
                for (i, b) in w.chunks_exact_mut(17).enumerate() {
                    // Rows 0..8: this exponent in every block; rows 8..16: mixed with
                    // others (every byte, by row and block).
                    b[0] = if r < PACK_ROWS {
                        e
                    } else {
                        e.wrapping_add((r * 31 + i * 97) as u8)
                    };
                    for (j, q) in b[1..].iter_mut().enumerate() {
                        *q = match r % 4 {
                            0 => 0x77, // 12, 12
                            1 => 0xff, // -12, -12
                            // Every byte value over the rows and blocks.
                            _ => (r * 16 + j + i * 7 + e as usize) as u8,
                        };
                    }
                }
                w
            })
            .collect();
        checked += check_all(&rows, &acts(&mut rng, nb, 9, dy), &format!("e={e}"));
    }
    assert!(checked > 0);
}

/// Realistic rows: quantized floats, several block counts (odd ones exercise the unpaired
/// last block of the one-row order), up to 64 tokens. Half the weight rows are quantized
/// from a token's own floats: their block sums are large enough that a scale product
/// times them is inexact, so fusing a step the twin rounds separately (or the reverse)
/// would change results; the test counts that the data shows it.
#[test]
fn quantized_rows_match_the_twins() {
    let mut rng = StdRng::seed_from_u64(4);
    let mut fused_shows = 0;
    for nb in [1usize, 2, 3, 7, 8, 9, 31, 90] {
        let n = nb * 32;
        let tokens = if nb > 10 { 9 } else { 64 };
        let xs: Vec<Vec<f32>> = (0..tokens)
            .map(|t| {
                if t % 2 == 0 {
                    (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
                } else {
                    floats(&mut rng, n)
                }
            })
            .collect();
        let rows: Vec<Vec<u8>> = (0..2 * PACK_ROWS)
            .map(|r| {
                let mut w = vec![0u8; nb * 17];
                let x = if r % 2 == 0 {
                    xs[r % tokens].clone()
                } else {
                    floats(&mut rng, n)
                };
                quantize_row(MX, &x, &mut w).unwrap();
                w
            })
            .collect();
        let acts: Vec<Vec<u8>> = xs
            .iter()
            .map(|x| {
                let mut a = vec![0u8; nb * 34];
                quantize_activations(GgmlType::Q8_0, x, &mut a).unwrap();
                a
            })
            .collect();
        for (w, a) in rows.iter().zip(&acts) {
            // The one-row order with its last block fused, and the repacked order with
            // every block unfused (`vec_dot_q8_0_ref`).
            let single = kernels::scalar(MX, DotOrder::Single).unwrap().dot;
            if nb % 2 == 1 && nb > 1 {
                let head = single(&w[..(nb - 1) * 17], &a[..(nb - 1) * 34]);
                let (d, sumi) = block_terms(&w[(nb - 1) * 17..], &a[(nb - 1) * 34..]);
                fused_shows += usize::from(d.mul_add(sumi, head) != single(w, a));
            }
            let repacked = kernels::scalar(MX, DotOrder::Gemm4).unwrap().dot;
            fused_shows += usize::from(
                quant::formats::mxfp4::vec_dot_q8_0_ref(w, a).to_bits() != repacked(w, a).to_bits(),
            );
        }
        check_all(&rows, &acts, &format!("nb={nb}"));
    }
    assert!(
        fused_shows >= 3,
        "fused and unfused steps differed in {fused_shows} dots"
    );
}

/// One block's scale product `d_y * e_half` and exact integer sum, as f32.
fn block_terms(w: &[u8], a: &[u8]) -> (f32, f32) {
    let x = BlockMxfp4::read(w);
    let y = quant::formats::q8_0::BlockQ8_0::read(a);
    let d = half::f16::from_bits(y.d).to_f32() * e8m0_to_f32_half(x.e);
    let sumi: i32 = (0..32).map(|j| x.value(j) * y.qs[j] as i32).sum();
    (d, sumi as f32)
}

/// The two orders round differently (so a kernel of one order could not pass for the
/// other), and both are dot products of the dequantized values.
#[test]
fn orders_differ_and_are_dot_products() {
    let mut rng = StdRng::seed_from_u64(5);
    let single = kernels::scalar(MX, DotOrder::Single).unwrap().dot;
    let repacked = kernels::scalar(MX, DotOrder::Gemm4).unwrap().dot;
    let fast = kernels::scalar(MX, DotOrder::Fast).unwrap().dot;
    let mut differ = 0;
    for _ in 0..200 {
        let nb = rng.gen_range(2..40);
        let n = nb * 32;
        let mut w = vec![0u8; nb * 17];
        quantize_row(MX, &floats(&mut rng, n), &mut w).unwrap();
        let mut a = vec![0u8; nb * 34];
        quantize_activations(GgmlType::Q8_0, &floats(&mut rng, n), &mut a).unwrap();
        let (s, r) = (single(&w, &a), repacked(&w, &a));
        assert_eq!(r.to_bits(), fast(&w, &a).to_bits());
        differ += usize::from(s.to_bits() != r.to_bits());
        let mut wf = vec![0.0f32; n];
        let mut af = vec![0.0f32; n];
        dequantize_row(MX, &w, &mut wf).unwrap();
        dequantize_row(GgmlType::Q8_0, &a, &mut af).unwrap();
        let exact: f64 = wf.iter().zip(&af).map(|(&x, &y)| x as f64 * y as f64).sum();
        let mag: f64 = wf
            .iter()
            .zip(&af)
            .map(|(&x, &y)| (x as f64 * y as f64).abs())
            .sum();
        for v in [s, r] {
            assert!(
                (v as f64 - exact).abs() <= 1e-5 * mag + 1e-30,
                "{v} vs {exact}"
            );
        }
    }
    assert!(differ >= 50, "only {differ}/200 differ");
}

/// `dot_order_for` and the table agree: MXFP4 matrices llama.cpp repacks get the
/// repacked order, with a packed kernel on x86 (what the runtime packs for).
#[test]
fn table_serves_the_orders_llama_cpp_picks() {
    let k = kernels::kernels(MX, kernels::dot_order_for(MX, 2880, 5, 4)).unwrap();
    assert_eq!(k.order, DotOrder::Gemm4);
    assert_eq!(k.act, GgmlType::Q8_0);
    assert!(quant::packs(MX));
    // (At the active level: `RLLAMA_SIMD=scalar` leaves only the twins.)
    if quant::isa::active().includes(quant::Isa::Avx2) {
        assert!(k.packed_into.is_some());
        assert_ne!(k.isa, quant::Isa::Scalar);
    }
    let k = kernels::kernels(MX, kernels::dot_order_for(MX, 2884, 5, 4)).unwrap();
    assert_eq!(k.order, DotOrder::Single);
    assert!(quant::has_vec_dot(MX) && quant::is_supported(MX));
    assert_eq!(
        kernels::effective_order(MX, DotOrder::Tiled),
        DotOrder::Single
    );
}
