//! `quant`'s Q5_K dot products against ggml itself, bit for bit, on random rows: ggml's
//! `vec_dot` (its AVX2 kernel on x86, which llama.cpp runs for one token: our
//! `DotOrder::Single` twin and the table's kernels of that order), and the twin against
//! an exact f64 dot, so the tiled order (`DotOrder::Tiled`, ggml's tiled GEMM, which no
//! single-row entry point exposes; the whole-model checks in `arch_vs_llamacpp.rs` reach
//! it) is a correct dot product too. Skipped with a note where llama.cpp cannot run here.

use llamacpp_ref::GgmlKernel;
use quant::formats::q5_k::{vec_dot_q8k, vec_dot_q8k_ref, vec_dot_q8k_tiled};
use quant::{kernels, quantize_activations, quantize_row, DotOrder, GgmlType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;
use common::{floats_of, runs_here};

const Q5K: GgmlType = GgmlType::Q5_K;

fn q5_k_row(x: &[f32]) -> Vec<u8> {
    let mut w = vec![0u8; x.len() / 256 * 176];
    quantize_row(Q5K, x, &mut w).unwrap();
    w
}

fn q8_k_row(x: &[f32]) -> Vec<u8> {
    let mut a = vec![0u8; x.len() / 256 * 292];
    quantize_activations(GgmlType::Q8_K, x, &mut a).unwrap();
    a
}

/// The exact dot of the dequantized weights with the dequantized activations.
fn exact(w: &[u8], a: &[u8], n: usize) -> f64 {
    let mut x = vec![0.0f32; n];
    let mut y = vec![0.0f32; n];
    quant::dequantize_row(Q5K, w, &mut x).unwrap();
    quant::dequantize_row(GgmlType::Q8_K, a, &mut y).unwrap();
    x.iter().zip(&y).map(|(&p, &q)| p as f64 * q as f64).sum()
}

#[test]
fn vec_dot_matches_ggml() {
    if !runs_here() {
        return;
    }
    let g = GgmlKernel::new(Q5K).unwrap();
    assert_eq!(g.vec_dot_type(), GgmlType::Q8_K);
    let mut rng = StdRng::seed_from_u64(5);
    let mut differ_generic = 0;
    let trials = 1500;
    for trial in 0..trials {
        let nb = [1, 2, 3, 4, 7, 16, 23][trial % 7];
        let n = nb * 256;
        let wide = trial % 5 == 0;
        let y = floats_of(&mut rng, n, wide);
        // A third of the weights from the activations' own floats: large sums.
        let mut wide_w = false;
        let w = if trial % 3 == 0 {
            q5_k_row(&y)
        } else {
            wide_w = rng.gen_bool(0.3);
            q5_k_row(&floats_of(&mut rng, n, wide_w))
        };
        let a = q8_k_row(&y);
        let single = vec_dot_q8k(&w, &a);
        let theirs = g.vec_dot(n, &w, &a).unwrap();
        assert_eq!(
            single.to_bits(),
            theirs.to_bits(),
            "vec_dot nb={nb}: ours {single:e} ggml {theirs:e}"
        );
        differ_generic += usize::from(vec_dot_q8k_ref(&w, &a).to_bits() != single.to_bits());
        for order in [DotOrder::Single, DotOrder::Tiled] {
            let want = if order == DotOrder::Single {
                single
            } else {
                vec_dot_q8k_tiled(&w, &a)
            };
            for set in kernels::available()
                .into_iter()
                .filter(|k| k.ty == Q5K && k.order == order)
            {
                assert_eq!(
                    (set.dot)(&w, &a).to_bits(),
                    want.to_bits(),
                    "{order:?} on {} nb={nb}",
                    set.isa
                );
            }
        }
        // Both orders are the dot product, to float rounding (away from the edges of
        // the float range, where the twins' intermediate products may round to zero).
        let e = exact(&w, &a, n);
        if wide || wide_w || !e.is_finite() {
            continue;
        }
        let mag: f64 = {
            let mut x = vec![0.0f32; n];
            let mut yy = vec![0.0f32; n];
            quant::dequantize_row(Q5K, &w, &mut x).unwrap();
            quant::dequantize_row(GgmlType::Q8_K, &a, &mut yy).unwrap();
            x.iter()
                .zip(&yy)
                .map(|(&p, &q)| (p as f64 * q as f64).abs())
                .sum()
        };
        for (name, v) in [("single", single), ("tiled", vec_dot_q8k_tiled(&w, &a))] {
            assert!(
                (v as f64 - e).abs() <= mag * 1e-5 + 1e-6,
                "{name} nb={nb}: {v:e} vs exact {e:e}"
            );
        }
    }
    // The generic order is another order: it must differ somewhere, or this test could
    // not tell the two apart.
    assert!(
        differ_generic > 0,
        "the AVX2 and generic orders never differed"
    );
}
