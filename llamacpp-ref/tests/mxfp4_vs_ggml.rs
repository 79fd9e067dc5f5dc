//! `quant`'s MXFP4 against ggml itself, bit for bit, on random rows: the reference
//! quantizer and the dequantizer, the activation quantizers (`quantize_row_q8_0` and the
//! repacked gemm's `ggml_quantize_mat_q8_0_4x8`), ggml's x86 `vec_dot` (our
//! `DotOrder::Single` twin), its generic C `vec_dot` (`vec_dot_q8_0_ref`) and the
//! repacked `gemv` and `gemm` that llama.cpp runs for MXFP4 matrices (our
//! `DotOrder::Gemm4` twin, and the SIMD kernels of that order on packed rows, which
//! return the twin's bits).
//!
//! The linked llama.cpp is built for this machine (GGML_NATIVE): on an AVX2 machine these
//! are its AVX2 kernels, on an AVX-512 one its AVX-512 gemm. Every test skips with a note
//! when llama.cpp cannot run on this CPU.

use llamacpp_ref::{mxfp4 as gm, GgmlKernel};
use quant::formats::mxfp4::{
    e8m0_to_f32_half, vec_dot_q8_0, vec_dot_q8_0_ref, vec_dot_q8_0_repacked, BlockMxfp4,
};
use quant::Block;
use quant::{kernels, quantize_activations, quantize_row, DotOrder, GgmlType, SideBuf};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;
use common::{floats_of, runs_here};

const MX: GgmlType = GgmlType::MXFP4;

fn floats(rng: &mut StdRng, n: usize) -> Vec<f32> {
    floats_of(rng, n, false)
}

fn mxfp4_row(x: &[f32]) -> Vec<u8> {
    let mut w = vec![0u8; x.len() / 32 * 17];
    quantize_row(MX, x, &mut w).unwrap();
    w
}

/// Raw blocks: every nibble, exponents in a range whose products stay finite.
fn raw_row(rng: &mut StdRng, nb: usize) -> Vec<u8> {
    let mut w: Vec<u8> = (0..nb * 17).map(|_| rng.gen()).collect();
    for b in w.chunks_exact_mut(17) {
        b[0] = rng.gen_range(90..=150);
    }
    w
}

fn q8_0_row(x: &[f32]) -> Vec<u8> {
    let mut a = vec![0u8; x.len() / 32 * 34];
    quantize_activations(GgmlType::Q8_0, x, &mut a).unwrap();
    a
}

#[test]
fn quantizer_and_dequantizer_match_ggml() {
    if !runs_here() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(1);
    let mut blocks = 0;
    for _ in 0..400 {
        let nb = rng.gen_range(1..12);
        let mut x = floats_of(&mut rng, nb * 32, true);
        if rng.gen_bool(0.05) {
            x.iter_mut().for_each(|v| *v = 0.0);
        }
        let ours = mxfp4_row(&x);
        let mut theirs = vec![0u8; ours.len()];
        gm::quantize_row_ref(&x, &mut theirs).unwrap();
        assert_eq!(ours, theirs, "quantize_row_mxfp4_ref on {x:?}");
        blocks += nb;
    }
    // Dequantization of every exponent and nibble.
    let q: Vec<u8> = (0..256 * 17)
        .map(|i| {
            if i % 17 == 0 {
                (i / 17) as u8
            } else {
                (i * 29 % 256) as u8
            }
        })
        .collect();
    let mut ours = vec![0.0f32; 256 * 32];
    let mut theirs = vec![0.0f32; 256 * 32];
    quant::dequantize_row(MX, &q, &mut ours).unwrap();
    gm::dequantize_row(&q, &mut theirs).unwrap();
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "dequantized element {i}");
    }
    assert!(blocks > 1000);
}

/// ggml's activation quantizers and ours give the same bytes: `quantize_row_q8_0` (the
/// traits' `from_float`, what `vec_dot` and `gemv` take) and the 4x8 quantizer of the
/// repacked `gemm`, whose rounding on x86 is the same.
#[test]
fn activation_quantizers_match_ggml() {
    if !runs_here() {
        return;
    }
    let g = GgmlKernel::new(MX).unwrap();
    assert_eq!(g.vec_dot_type(), GgmlType::Q8_0);
    let mut rng = StdRng::seed_from_u64(2);
    for _ in 0..200 {
        let k = 32 * rng.gen_range(1..20);
        let x: Vec<f32> = (0..4 * k)
            .map(|_| rng.gen_range(-1.0f32..1.0) * 10f32.powi(rng.gen_range(-3..3)))
            .collect();
        let ours: Vec<u8> = x.chunks_exact(k).flat_map(q8_0_row).collect();
        let mut row = vec![0u8; k / 32 * 34];
        for (t, xt) in x.chunks_exact(k).enumerate() {
            g.quantize_activations(xt, &mut row).unwrap();
            assert_eq!(
                row[..],
                ours[t * row.len()..(t + 1) * row.len()],
                "quantize_row_q8_0"
            );
        }
        let mut x4 = vec![0u8; k / 32 * 136];
        gm::quantize_mat_q8_0_4x8(&x, k, &mut x4).unwrap();
        assert_eq!(gm::q8_0x4_rows(&x4), ours, "ggml_quantize_mat_q8_0_4x8");
    }
}

/// ggml's `vec_dot` for MXFP4 (the traits' x86 kernel) is our `Single` twin, and its
/// generic C `vec_dot` our `vec_dot_q8_0_ref`, bit for bit.
///
/// Both end a block with `sumf += d * sumi`, which this build of ggml leaves unfused,
/// where the repacked kernels fuse. A block's scale product (an f16 times a power of two:
/// 11 significant bits) times its integer sum is exact below 2^13, which most blocks of
/// unrelated weights and activations stay under; so a third of the rows are weights
/// quantized from the activations' own floats (every product positive, sums up to 2^15),
/// on which fused and unfused differ. The test counts that they do.
#[test]
fn vec_dots_match_ggml() {
    if !runs_here() {
        return;
    }
    let g = GgmlKernel::new(MX).unwrap();
    let mut rng = StdRng::seed_from_u64(3);
    let (mut differ, mut tail_fused, mut chain_fused) = (0, 0, 0);
    let trials = 6000;
    for trial in 0..trials {
        // The second half: odd lengths (an unpaired last block), weights quantized from
        // uniform activation floats.
        let nb = if trial < trials / 2 {
            [1, 2, 3, 4, 5, 8, 9, 31, 90][trial % 9]
        } else {
            2 * rng.gen_range(1..50) + 1
        };
        let n = nb * 32;
        let y = if trial < trials / 2 {
            floats(&mut rng, n)
        } else {
            (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
        };
        let w = match trial % 3 {
            _ if trial >= trials / 2 => mxfp4_row(&y),
            0 => mxfp4_row(&floats(&mut rng, n)),
            1 => raw_row(&mut rng, nb),
            _ => mxfp4_row(&y),
        };
        let a = q8_0_row(&y);
        let (single, repacked) = (vec_dot_q8_0(&w, &a), vec_dot_q8_0_repacked(&w, &a));
        let theirs = g.vec_dot(n, &w, &a).unwrap();
        assert_eq!(
            single.to_bits(),
            theirs.to_bits(),
            "vec_dot nb={nb}: ours {single:e} ggml {theirs:e}"
        );
        let generic = gm::vec_dot_generic(n, &w, &a).unwrap();
        let reference = vec_dot_q8_0_ref(&w, &a);
        assert_eq!(
            reference.to_bits(),
            generic.to_bits(),
            "generic vec_dot nb={nb}: ours {reference:e} ggml {generic:e}"
        );
        // The table's kernels (every ISA here) agree with the twins they serve.
        assert_eq!(
            quant::vec_dot(MX, n, &w, &a).unwrap().to_bits(),
            single.to_bits()
        );
        differ += usize::from(single.to_bits() != repacked.to_bits());
        // What a fused `sumf += d * sumi` would have given: the unpaired last block as
        // one FMA after the fold; the generic loop as the repacked order's FMA chain.
        if nb % 2 == 1 && nb > 1 {
            let head = vec_dot_q8_0(&w[..(nb - 1) * 17], &a[..(nb - 1) * 34]);
            let (x, q) = (
                BlockMxfp4::read(&w[(nb - 1) * 17..]),
                quant::formats::q8_0::BlockQ8_0::read(&a[(nb - 1) * 34..]),
            );
            let d = half::f16::from_bits(q.d).to_f32() * e8m0_to_f32_half(x.e);
            let sumi: i32 = (0..32).map(|j| x.value(j) * q.qs[j] as i32).sum();
            let fused = d.mul_add(sumi as f32, head);
            tail_fused += usize::from(fused.to_bits() != single.to_bits());
        }
        chain_fused += usize::from(reference.to_bits() != repacked.to_bits());
    }
    // The data tells the two orders apart, and fused from unfused block sums.
    assert!(
        differ > trials / 4,
        "only {differ} of {trials} dots differ between the orders"
    );
    assert!(
        tail_fused >= 20,
        "a fused last block differed in only {tail_fused} dots"
    );
    assert!(
        chain_fused >= 50,
        "a fused generic loop differed in only {chain_fused} dots"
    );
}

/// A matrix of `rows` MXFP4 rows of `n` elements: quantized floats, raw blocks, and
/// every third row quantized from one of the activation rows `x` (large block sums, on
/// which a fused and an unfused scale step differ).
fn matrix(rng: &mut StdRng, rows: usize, n: usize, x: &[f32]) -> Vec<u8> {
    let tokens = x.len() / n;
    (0..rows)
        .flat_map(|r| match r % 3 {
            0 => {
                let t = r / 3 % tokens;
                mxfp4_row(&x[t * n..(t + 1) * n])
            }
            1 if r % 5 == 4 => raw_row(rng, n / 32),
            _ => mxfp4_row(&floats(rng, n)),
        })
        .collect()
}

/// `gemv` (one token at a time) and `gemm` (groups of four tokens) of llama.cpp's repacked
/// MXFP4 kernels against our repacked-order twin and our packed SIMD kernels of that
/// order, bit for bit, over shapes that take every path of ggml's gemm (16-token and
/// 16-column blocks on AVX-512, their remainders).
#[test]
fn repacked_gemv_and_gemm_match_ggml() {
    if !runs_here() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(4);
    let set = kernels::kernels(MX, DotOrder::Gemm4).unwrap();
    let (mut checked, mut fused_shows) = (0, 0);
    for &(nb, nc, nr) in &[
        (1usize, 8usize, 4usize),
        (2, 16, 8),
        (3, 24, 20),
        (9, 40, 16),
        (90, 32, 36),
        (31, 8, 4),
    ] {
        let n = nb * 32;
        let rb = nb * 17;
        let x: Vec<f32> = (0..nr * n).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let w = matrix(&mut rng, nc, n, &x);
        let repacked = gm::repack_8x8(&w, n).unwrap();
        let acts: Vec<Vec<u8>> = x.chunks_exact(n).map(q8_0_row).collect();
        let want: Vec<Vec<f32>> = acts
            .iter()
            .map(|a| {
                (0..nc)
                    .map(|o| {
                        let wo = &w[o * rb..(o + 1) * rb];
                        let v = vec_dot_q8_0_repacked(wo, a);
                        fused_shows +=
                            usize::from(v.to_bits() != vec_dot_q8_0_ref(wo, a).to_bits());
                        v
                    })
                    .collect()
            })
            .collect();
        // gemv, token by token.
        for (t, a) in acts.iter().enumerate() {
            let mut s = vec![f32::NAN; nc];
            gm::gemv(n, &repacked, nc, a, &mut s).unwrap();
            for o in 0..nc {
                assert_eq!(
                    s[o].to_bits(),
                    want[t][o].to_bits(),
                    "gemv nb={nb} token {t} row {o}: ggml {:e} ours {:e}",
                    s[o],
                    want[t][o]
                );
            }
            checked += nc;
        }
        // gemm, all tokens in groups of four.
        let mut a4 = vec![0u8; nr / 4 * nb * 136];
        for (g, xg) in x.chunks_exact(4 * n).enumerate() {
            gm::quantize_mat_q8_0_4x8(xg, n, &mut a4[g * nb * 136..(g + 1) * nb * 136]).unwrap();
        }
        let mut s = vec![f32::NAN; nr * nc];
        gm::gemm(n, &repacked, nc, &a4, nr, &mut s).unwrap();
        for t in 0..nr {
            for o in 0..nc {
                assert_eq!(
                    s[t * nc + o].to_bits(),
                    want[t][o].to_bits(),
                    "gemm nb={nb} nr={nr} nc={nc} token {t} row {o}: ggml {:e} ours {:e}",
                    s[t * nc + o],
                    want[t][o]
                );
            }
        }
        checked += nr * nc;
        // Our packed kernels of the same order, on rows repacked our way.
        if let Some(into) = set.packed_into {
            let mut packed = vec![0u8; w.len()];
            quant::pack8(MX, &w, n, &mut packed).unwrap();
            let abuf = acts.concat();
            let stride = acts[0].len();
            let mut side = SideBuf::default();
            for a in &acts {
                side.push(&set, a);
            }
            for cols in [1, 2, nr] {
                let mut m = vec![f32::NAN; cols * nc];
                for g in 0..nc / 8 {
                    // SAFETY: slots c * nc + 8g + r (r < 8, c < cols) are in `m`.
                    unsafe {
                        into(
                            &packed[g * 8 * rb..(g + 1) * 8 * rb],
                            8,
                            &abuf,
                            stride,
                            side.rows(&set, 0, cols),
                            cols,
                            m.as_mut_ptr().add(8 * g),
                            nc,
                        )
                    };
                }
                for t in 0..cols {
                    for o in 0..nc {
                        assert_eq!(m[t * nc + o].to_bits(), want[t][o].to_bits(), "{}", set.isa);
                    }
                }
            }
        }
    }
    assert!(checked > 0);
    // The data tells ggml's FMA per block from a separately rounded scale step.
    assert!(
        fused_shows >= 10,
        "fused and unfused differed in only {fused_shows} dots"
    );
}
