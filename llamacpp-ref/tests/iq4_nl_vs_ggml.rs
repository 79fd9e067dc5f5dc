//! `quant`'s IQ4_NL against ggml itself, bit for bit, on random rows: both quantizers
//! (`quantize_iq4_nl`, what `llama-quantize` writes, and the reference), the dequantizer,
//! ggml's x86 `vec_dot` (our `DotOrder::Single` twin and the SIMD kernels of that order),
//! its generic C `vec_dot` (`vec_dot_q8_0_ref`), and the repacked `gemv` and `gemm`
//! llama.cpp runs for IQ4_NL matrices of a multiple of eight rows (our `DotOrder::Gemm4`
//! twin and its SIMD kernels). Skipped with a note where llama.cpp cannot run here.

use llamacpp_ref::{iq4_nl as gi, mxfp4 as gm, GgmlKernel};
use quant::formats::iq4_nl::{vec_dot_q8_0, vec_dot_q8_0_ref, vec_dot_q8_0_repacked};
use quant::{kernels, quantize_activations, quantize_row, DotOrder, GgmlType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;
use common::{floats_of, runs_here};

const NL: GgmlType = GgmlType::IQ4_NL;

fn floats(rng: &mut StdRng, n: usize) -> Vec<f32> {
    floats_of(rng, n, false)
}

fn iq4_row(x: &[f32]) -> Vec<u8> {
    let mut w = vec![0u8; x.len() / 32 * 18];
    quantize_row(NL, x, &mut w).unwrap();
    w
}

fn q8_0_row(x: &[f32]) -> Vec<u8> {
    let mut a = vec![0u8; x.len() / 32 * 34];
    quantize_activations(GgmlType::Q8_0, x, &mut a).unwrap();
    a
}

#[test]
fn quantizers_and_dequantizer_match_ggml() {
    if !runs_here() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(1);
    for _ in 0..400 {
        let nb = rng.gen_range(1..12);
        let mut x = floats(&mut rng, nb * 32);
        if rng.gen_bool(0.05) {
            // An all-zero block: the searching quantizer's output is defined (ggml's
            // reference leaves its indices to a stale buffer, so only its scale is).
            x[..32].iter_mut().for_each(|v| *v = 0.0);
        }
        let ours = iq4_row(&x);
        let mut theirs = vec![0u8; ours.len()];
        gi::quantize_row(&x, &mut theirs).unwrap();
        assert_eq!(ours, theirs, "quantize_iq4_nl on {x:?}");
        if x.chunks_exact(32).all(|b| b.iter().any(|&v| v != 0.0)) {
            let ours: Vec<u8> = x
                .chunks_exact(32)
                .flat_map(|b| {
                    let blk = quant::formats::iq4_nl::quantize_ref(b);
                    let mut out = [0u8; 18];
                    quant::Block::write(&blk, &mut out);
                    out
                })
                .collect();
            gi::quantize_row_ref(&x, &mut theirs).unwrap();
            assert_eq!(ours, theirs, "quantize_row_iq4_nl_ref on {x:?}");
        }
    }
    // Every nibble under a spread of scales.
    let q: Vec<u8> = (0..256 * 18)
        .map(|i| match i % 18 {
            0 => (i / 18 * 7) as u8,
            1 => [0x2c, 0xb1, 0x00, 0x3c][i / 18 % 4],
            _ => (i * 29 % 256) as u8,
        })
        .collect();
    let mut ours = vec![0.0f32; 256 * 32];
    let mut theirs = vec![0.0f32; 256 * 32];
    quant::dequantize_row(NL, &q, &mut ours).unwrap();
    gi::dequantize_row(&q, &mut theirs).unwrap();
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "dequantized element {i}");
    }
}

/// ggml's `vec_dot` for IQ4_NL (its x86 kernel: MXFP4's paired lanes) is our `Single`
/// twin, its generic C `vec_dot` our `vec_dot_q8_0_ref`, and the table's kernels return
/// the twins' bits; the repacked order differs from both on this data.
#[test]
fn vec_dots_match_ggml() {
    if !runs_here() {
        return;
    }
    let g = GgmlKernel::new(NL).unwrap();
    assert_eq!(g.vec_dot_type(), GgmlType::Q8_0);
    let mut rng = StdRng::seed_from_u64(3);
    let mut differ = 0;
    let trials = 3000;
    for trial in 0..trials {
        let nb = if trial % 2 == 0 {
            [1, 2, 3, 4, 5, 8, 9, 31, 90][trial % 9]
        } else {
            2 * rng.gen_range(1..50) + 1
        };
        let n = nb * 32;
        let y: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        // A third of the weights from the activations' own floats: large block sums.
        let w = if trial % 3 == 0 {
            iq4_row(&y)
        } else {
            iq4_row(&floats(&mut rng, n))
        };
        let a = q8_0_row(&y);
        let single = vec_dot_q8_0(&w, &a);
        let theirs = g.vec_dot(n, &w, &a).unwrap();
        assert_eq!(
            single.to_bits(),
            theirs.to_bits(),
            "vec_dot nb={nb}: ours {single:e} ggml {theirs:e}"
        );
        let generic = gi::vec_dot_generic(n, &w, &a).unwrap();
        assert_eq!(vec_dot_q8_0_ref(&w, &a).to_bits(), generic.to_bits());
        assert_eq!(
            quant::vec_dot(NL, n, &w, &a).unwrap().to_bits(),
            single.to_bits()
        );
        let repacked = vec_dot_q8_0_repacked(&w, &a);
        for order in [DotOrder::Single, DotOrder::Gemm4] {
            let set = kernels::kernels(NL, order).unwrap();
            let want = if order == DotOrder::Single {
                single
            } else {
                repacked
            };
            assert_eq!(
                (set.dot)(&w, &a).to_bits(),
                want.to_bits(),
                "{order:?} on {}",
                set.isa
            );
        }
        differ += usize::from(single.to_bits() != repacked.to_bits());
    }
    assert!(
        differ > trials / 4,
        "only {differ} of {trials} dots differ between the orders"
    );
}

/// `gemv` and `gemm` of llama.cpp's repacked IQ4_NL kernels against our repacked-order
/// twin and the `Gemm4` SIMD tile, bit for bit.
#[test]
fn repacked_gemv_and_gemm_match_ggml() {
    if !runs_here() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(4);
    for &(rows, nb, tokens) in &[(8, 1, 4), (16, 3, 8), (24, 9, 4), (64, 31, 12), (8, 90, 16)] {
        let n = nb * 32;
        let x: Vec<f32> = (0..tokens * n)
            .map(|_| rng.gen_range(-1.0f32..1.0))
            .collect();
        let w: Vec<u8> = (0..rows)
            .flat_map(|r| {
                if r % 3 == 0 {
                    let t = r / 3 % tokens;
                    iq4_row(&x[t * n..(t + 1) * n])
                } else {
                    iq4_row(&floats(&mut rng, n))
                }
            })
            .collect();
        let packed = gi::repack_8x8(&w, n).unwrap();
        let rb = nb * 18;
        let set = kernels::kernels(NL, DotOrder::Gemm4).unwrap();
        for t in 0..tokens {
            let a = q8_0_row(&x[t * n..(t + 1) * n]);
            let mut theirs = vec![0.0f32; rows];
            gi::gemv(n, &packed, rows, &a, &mut theirs).unwrap();
            for (r, th) in theirs.iter().enumerate() {
                let ours = vec_dot_q8_0_repacked(&w[r * rb..(r + 1) * rb], &a);
                assert_eq!(ours.to_bits(), th.to_bits(), "gemv row {r} token {t}");
                let simd = (set.dot)(&w[r * rb..(r + 1) * rb], &a);
                assert_eq!(simd.to_bits(), th.to_bits(), "{} row {r}", set.isa);
            }
        }
        let mut a4 = vec![0u8; tokens / 4 * nb * 136];
        for (g4, chunk) in a4.chunks_exact_mut(nb * 136).enumerate() {
            gm::quantize_mat_q8_0_4x8(&x[g4 * 4 * n..(g4 + 1) * 4 * n], n, chunk).unwrap();
        }
        let mut theirs = vec![0.0f32; tokens * rows];
        gi::gemm(n, &packed, rows, &a4, tokens, &mut theirs).unwrap();
        for t in 0..tokens {
            let a = q8_0_row(&x[t * n..(t + 1) * n]);
            for r in 0..rows {
                let ours = vec_dot_q8_0_repacked(&w[r * rb..(r + 1) * rb], &a);
                assert_eq!(
                    ours.to_bits(),
                    theirs[t * rows + r].to_bits(),
                    "gemm row {r} token {t} (rows {rows}, {nb} blocks)"
                );
            }
        }
    }
}
