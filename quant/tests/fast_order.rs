//! The fast order (`DotOrder::Fast`): every SIMD kernel of the table against the scalar
//! twin, bit for bit, for one to eight weight rows and one to eight tokens, with and
//! without precomputed side data; and the twin against an exact f64 dot product, so the
//! order is a correct dot product and not merely a consistent one.

use half::f16;
use quant::{
    isa, kernels, quantize_activations, quantize_row, vec_dot_type, ActSide, DotOrder, GgmlType,
    Isa, SideBuf, FAST_TILE_TOKENS, TILE_MAX_ROWS,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const FAST_TYPES: [GgmlType; 7] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::MXFP4,
    GgmlType::IQ4_NL,
];

/// The table formats, whose repacked order (llama.cpp's `DotOrder::Gemm4` for them) is
/// their fast order's arithmetic; their `vec_dot` order has no packed kernel.
const LUT_TYPES: [GgmlType; 2] = [GgmlType::MXFP4, GgmlType::IQ4_NL];

/// The formats whose repacked order is their fast order's arithmetic: the table formats
/// and Q4_0 (`q4_0_8x8_q8_0` runs IQ4_NL's templates).
const REPACKED_AS_FAST: [GgmlType; 3] = [GgmlType::MXFP4, GgmlType::IQ4_NL, GgmlType::Q4_0];

/// The sets whose tiles run the fast order's kernels: every fast order, and the table
/// formats' repacked order.
fn fast_like() -> impl Iterator<Item = (GgmlType, DotOrder)> {
    FAST_TYPES
        .into_iter()
        .map(|ty| (ty, DotOrder::Fast))
        .chain(REPACKED_AS_FAST.map(|ty| (ty, DotOrder::Gemm4)))
}

/// The K-quants with a fast order (one of llama.cpp's orders) on packed rows.
const K_TYPES: [GgmlType; 5] = [
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_XS,
];

fn floats(rng: &mut StdRng, n: usize) -> Vec<f32> {
    let spike = rng.gen_bool(0.3);
    (0..n)
        .map(|_| {
            let x: f32 = rng.gen_range(-1.0..1.0);
            if spike && rng.gen_bool(0.02) {
                x * 40.0
            } else {
                x
            }
        })
        .collect()
}

/// Weights: quantized floats, or raw random bytes with sane f16 scales (every quant bit
/// pattern, -128 in Q8_0 included).
fn weight_row(rng: &mut StdRng, ty: GgmlType, n: usize, raw: bool) -> Vec<u8> {
    let mut out = vec![0u8; ty.row_bytes(n as u64).unwrap() as usize];
    if !raw {
        quantize_row(ty, &floats(rng, n), &mut out).unwrap();
        return out;
    }
    rng.fill(&mut out[..]);
    let fields: &[usize] = match ty {
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::Q3_K => &[108],
        GgmlType::MXFP4 => &[],
        _ => &[0],
    };
    for b in out.chunks_exact_mut(ty.type_size()) {
        if ty == GgmlType::MXFP4 {
            // A sane exponent: scales 2^-18..2^7.
            b[0] = rng.gen_range(110..=135);
        }
        for &off in fields {
            let v = rng.gen_range(-2.0f32..2.0) * 10f32.powi(rng.gen_range(-4..1));
            b[off..off + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
        }
    }
    out
}

fn act_row(rng: &mut StdRng, ty: GgmlType, n: usize) -> Vec<u8> {
    let aty = vec_dot_type(ty);
    let mut out = vec![0u8; aty.row_bytes(n as u64).unwrap() as usize];
    quantize_activations(aty, &floats(rng, n), &mut out).unwrap();
    out
}

#[test]
fn fast_kernels_match_the_twin_for_every_tile_shape() {
    let mut rng = StdRng::seed_from_u64(0xfa57);
    let mut checked = 0;
    for (ty, order) in fast_like() {
        let twin = kernels::scalar(ty, order).expect("every fast type has a twin");
        assert_eq!(twin.order, order);
        let sets: Vec<_> = kernels::available()
            .into_iter()
            .filter(|k| k.ty == ty && k.order == order && k.isa != Isa::Scalar)
            .collect();
        for blocks in [1usize, 2, 7, 28, 77] {
            let n = blocks * 32;
            for raw in [false, true] {
                let w: Vec<Vec<u8>> = (0..TILE_MAX_ROWS)
                    .map(|_| weight_row(&mut rng, ty, n, raw))
                    .collect();
                let a: Vec<Vec<u8>> = (0..FAST_TILE_TOKENS)
                    .map(|_| act_row(&mut rng, ty, n))
                    .collect();
                let stride = a[0].len() + 3;
                let mut abuf = vec![0u8; FAST_TILE_TOKENS * stride];
                for (c, r) in a.iter().enumerate() {
                    abuf[c * stride..c * stride + r.len()].copy_from_slice(r);
                }
                let want: Vec<Vec<f32>> = w
                    .iter()
                    .map(|wr| a.iter().map(|ar| (twin.dot)(wr, ar)).collect())
                    .collect();
                for k in &sets {
                    assert_eq!(k.tile_rows, 8, "{ty} {}", k.isa);
                    if order == DotOrder::Fast {
                        assert_eq!(k.tile_tokens, FAST_TILE_TOKENS, "{ty} {}", k.isa);
                    }
                    let tile = k.tile.expect("fast sets have tiles");
                    for (r, wr) in w.iter().enumerate() {
                        for (c, ar) in a.iter().enumerate() {
                            let got = (k.dot)(wr, ar);
                            assert_eq!(got.to_bits(), want[r][c].to_bits(), "{ty} {} dot", k.isa);
                        }
                    }
                    for rows in 1..=k.tile_rows {
                        let wbuf: Vec<u8> = w[..rows].concat();
                        let long = [9, 23, FAST_TILE_TOKENS];
                        for cols in (1..=8).chain(long).filter(|&c| c <= k.tile_tokens) {
                            let mut side = SideBuf::default();
                            for ar in &a[..cols] {
                                side.push(k, ar);
                            }
                            for sd in [ActSide::default(), side.rows(k, 0, cols)] {
                                let mut out = vec![f32::NAN; rows * cols];
                                tile(&wbuf, rows, &abuf, stride, sd, &mut out);
                                for r in 0..rows {
                                    for c in 0..cols {
                                        assert_eq!(
                                            out[r * cols + c].to_bits(),
                                            want[r][c].to_bits(),
                                            "{ty} {} n={n} raw={raw} tile {rows}x{cols} ({r},{c})",
                                            k.isa
                                        );
                                    }
                                }
                                checked += 1;
                                // The same results written into a strided matrix (token
                                // c's row r at c * ld + r); the gaps stay untouched.
                                // (MXFP4's repacked order on NEON has no such kernel.)
                                let Some(into) = k.tile_into else {
                                    assert_ne!(order, DotOrder::Fast, "{ty} {}", k.isa);
                                    continue;
                                };
                                let ld = rows + 5;
                                let mut m = vec![f32::NAN; cols * ld];
                                // SAFETY: every slot c * ld + r is inside `m`.
                                unsafe {
                                    into(&wbuf, rows, &abuf, stride, sd, cols, m.as_mut_ptr(), ld)
                                };
                                for c in 0..cols {
                                    for r in 0..ld {
                                        let got = m[c * ld + r];
                                        if r < rows {
                                            assert_eq!(
                                                got.to_bits(),
                                                want[r][c].to_bits(),
                                                "{ty} {} into ({r},{c})",
                                                k.isa
                                            );
                                        } else {
                                            assert!(
                                                got.is_nan(),
                                                "{ty} {} wrote past its rows",
                                                k.isa
                                            );
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    if Isa::Avx2.available() {
        assert!(checked > 0, "no fast SIMD kernel was checked");
    } else {
        eprintln!(
            "note: no SIMD fast kernels on this CPU ({}); twins only",
            isa::active()
        );
    }
}

/// Rows repacked by `pack8` give, through each fast set's `packed_into`, the twin's bits:
/// several groups of eight rows, one to 64 tokens, with and without side data; the
/// 32-element formats and the K-quants.
#[test]
fn packed_kernels_match_the_twin() {
    let mut rng = StdRng::seed_from_u64(0x9ac8);
    let mut checked = 0;
    let mut wide_calls = 0;
    let mut stream_calls = 0;
    // Every fast order, and the llama.cpp orders the exact mode reads packed rows in
    // (the 32-element formats', the table formats' repacked one and the K-quants'). The
    // table formats' `vec_dot` order serves only matrices llama.cpp does not repack: no
    // packed kernel.
    let cases = FAST_TYPES
        .into_iter()
        .chain(K_TYPES)
        .map(|ty| (ty, DotOrder::Fast))
        .chain(
            FAST_TYPES
                .into_iter()
                .filter(|ty| !LUT_TYPES.contains(ty))
                .map(|ty| (ty, DotOrder::Single)),
        )
        .chain(REPACKED_AS_FAST.map(|ty| (ty, DotOrder::Gemm4)))
        .chain([
            (GgmlType::Q4_K, DotOrder::Single),
            (GgmlType::Q4_K, DotOrder::Gemm4),
            (GgmlType::Q5_K, DotOrder::Single),
            (GgmlType::Q5_K, DotOrder::Tiled),
            (GgmlType::Q6_K, DotOrder::Single),
            (GgmlType::Q6_K, DotOrder::Tiled),
            (GgmlType::IQ4_XS, DotOrder::Single),
            (GgmlType::IQ4_XS, DotOrder::Tiled),
            (GgmlType::Q3_K, DotOrder::Single),
            (GgmlType::Q3_K, DotOrder::Tiled),
        ]);
    for (ty, order) in cases {
        assert!(quant::packs(ty));
        let twin = kernels::scalar(ty, order).expect("every order has a twin");
        let sets: Vec<_> = kernels::available()
            .into_iter()
            .filter(|k| k.ty == ty && k.order == order && k.packed_into.is_some())
            .collect();
        if Isa::Avx2.available() {
            assert!(!sets.is_empty(), "{ty} {order:?}: no packed kernel");
        }
        let shapes: &[(usize, usize)] = if K_TYPES.contains(&ty) {
            &[(1, 1), (3, 2), (14, 3), (5, 4)]
        } else {
            &[(1, 1), (3, 2), (28, 3), (77, 1)]
        };
        for &(blocks, groups) in shapes {
            let n = blocks * ty.block_size();
            let rows = groups * quant::PACK_ROWS;
            let raw = rng.gen_bool(0.5);
            let w: Vec<Vec<u8>> = (0..rows)
                .map(|_| weight_row(&mut rng, ty, n, raw))
                .collect();
            let wbuf = w.concat();
            let mut packed = vec![0u8; wbuf.len()];
            quant::pack8(ty, &wbuf, n, &mut packed).unwrap();
            assert!(quant::pack8(ty, &wbuf[..wbuf.len() - 1], n, &mut packed[1..]).is_err());
            let a: Vec<Vec<u8>> = (0..FAST_TILE_TOKENS)
                .map(|_| act_row(&mut rng, ty, n))
                .collect();
            let stride = a[0].len();
            let abuf = a.concat();
            let want: Vec<Vec<f32>> = w
                .iter()
                .map(|wr| a.iter().map(|ar| (twin.dot)(wr, ar)).collect())
                .collect();
            let rb = wbuf.len() / rows;
            for k in &sets {
                let into = k.packed_into.unwrap();
                for cols in [1usize, 2, 3, 9, FAST_TILE_TOKENS] {
                    let mut side = SideBuf::default();
                    for ar in &a[..cols] {
                        side.push(k, ar);
                    }
                    for (sd, per) in [
                        (ActSide::default(), 1),
                        (side.rows(k, 0, cols), 1),
                        (side.rows(k, 0, cols), k.packed_rows / 8),
                        (ActSide::default(), k.stream_rows / 8),
                        (side.rows(k, 0, cols), k.stream_rows / 8),
                    ] {
                        // Calls of `per` groups where that many are left, else of one
                        // group: one, `packed_rows` rows (two groups on AVX-512), and for
                        // one or two tokens `stream_rows` (a decode task's rows at once).
                        if per > k.packed_rows / 8 && cols > 2 {
                            continue;
                        }
                        let mut m = vec![f32::NAN; cols * rows];
                        let mut g = 0;
                        while g < groups {
                            let take = if g + per <= groups {
                                per
                            } else if per > k.packed_rows / 8 {
                                groups - g
                            } else {
                                1
                            };
                            let wg = &packed[g * 8 * rb..(g + take) * 8 * rb];
                            // SAFETY: slots c * rows + 8g + r (r < 8 take, c < cols) are in
                            // `m`.
                            unsafe {
                                into(
                                    wg,
                                    8 * take,
                                    &abuf,
                                    stride,
                                    sd,
                                    cols,
                                    m.as_mut_ptr().add(8 * g),
                                    rows,
                                )
                            };
                            wide_calls += usize::from(take == 2);
                            stream_calls += usize::from(take > 2);
                            g += take;
                        }
                        for c in 0..cols {
                            for r in 0..rows {
                                assert_eq!(
                                    m[c * rows + r].to_bits(),
                                    want[r][c].to_bits(),
                                    "{ty} {order:?} {} packed n={n} ({r},{c}) of {rows}x{cols}",
                                    k.isa
                                );
                            }
                        }
                        checked += 1;
                    }
                }
            }
        }
    }
    if Isa::Avx2.available() {
        assert!(checked > 0, "no packed kernel was checked");
    }
    if Isa::Avx512.available() {
        assert!(wide_calls > 0, "no sixteen-row packed call was checked");
    }
    if Isa::Avx2.available() {
        assert!(
            stream_calls > 0,
            "no call of more than two groups was checked"
        );
    }
}

/// The fast twin is a dot product of the dequantized weights and activations: within a
/// few float roundings per block of the exact f64 value, like llama.cpp's own order.
#[test]
fn fast_twin_is_an_accurate_dot_product() {
    let mut rng = StdRng::seed_from_u64(7);
    for ty in FAST_TYPES {
        let aty = vec_dot_type(ty);
        let fast = kernels::scalar(ty, DotOrder::Fast).unwrap().dot;
        let exact_order = kernels::scalar(ty, DotOrder::Single).unwrap().dot;
        for blocks in [1usize, 4, 28, 152] {
            let n = blocks * 32;
            let w = weight_row(&mut rng, ty, n, false);
            let a = act_row(&mut rng, ty, n);
            let mut wf = vec![0.0f32; n];
            let mut af = vec![0.0f32; n];
            quant::dequantize_row(ty, &w, &mut wf).unwrap();
            quant::dequantize_row(aty, &a, &mut af).unwrap();
            let exact: f64 = wf.iter().zip(&af).map(|(&x, &y)| x as f64 * y as f64).sum();
            let mag: f64 = wf
                .iter()
                .zip(&af)
                .map(|(&x, &y)| (x as f64 * y as f64).abs())
                .sum();
            let got = fast(&w, &a) as f64;
            let llama = exact_order(&w, &a) as f64;
            // Q4_1/Q5_1: the activation block sum s is stored as f16, in both orders.
            let tol = mag * if aty == GgmlType::Q8_1 { 2e-3 } else { 1e-5 } + 1e-6;
            assert!(
                (got - exact).abs() <= tol,
                "{ty} n={n}: fast {got} exact {exact}"
            );
            assert!(
                (got - llama).abs() <= tol,
                "{ty} n={n}: fast {got} llama.cpp order {llama}"
            );
        }
    }
}

/// Where a SIMD kernel exists for the exact order, the fast order never falls back to its
/// scalar twin: `kernels` gives a SIMD fast set, or the exact set when there is none.
#[test]
fn fast_lookups_stay_on_simd() {
    for ty in FAST_TYPES {
        let k = kernels::kernels(ty, DotOrder::Fast).unwrap();
        if isa::active() != Isa::Scalar {
            assert_ne!(k.isa, Isa::Scalar, "{ty}: fast order resolved to scalar");
        }
        if k.order == DotOrder::Fast && k.isa != Isa::Scalar {
            assert_eq!(k.tile_rows, 8);
        }
    }
    // The K-quants' and the table formats' fast orders sum like one of llama.cpp's (Q4_K:
    // gemv, Q6_K: tiled, MXFP4 and IQ4_NL: their repacked gemv/gemm), with a packed tile
    // on every x86 level.
    for (ty, like) in [
        (GgmlType::Q4_K, DotOrder::Single),
        (GgmlType::Q5_K, DotOrder::Tiled),
        (GgmlType::Q6_K, DotOrder::Tiled),
        (GgmlType::IQ4_XS, DotOrder::Tiled),
        (GgmlType::Q3_K, DotOrder::Tiled),
        (GgmlType::MXFP4, DotOrder::Gemm4),
        (GgmlType::IQ4_NL, DotOrder::Gemm4),
        (GgmlType::Q4_0, DotOrder::Gemm4),
    ] {
        let twin = kernels::scalar(ty, DotOrder::Fast).unwrap().dot;
        assert_eq!(
            twin as usize,
            kernels::scalar(ty, like).unwrap().dot as usize
        );
        let k = kernels::kernels(ty, DotOrder::Fast).unwrap();
        // At the active level (`RLLAMA_SIMD=scalar` leaves the twins, without packed tiles).
        if isa::active().includes(Isa::Avx2) {
            assert_eq!(k.order, DotOrder::Fast, "{ty}");
            assert!(k.packed_into.is_some(), "{ty}");
        }
    }
}
