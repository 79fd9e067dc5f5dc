//! `quant`'s Q3_K dot products against ggml itself, bit for bit, on random rows: ggml's
//! `vec_dot` (its AVX2 kernel on x86, which llama.cpp runs below eight tokens: our
//! `DotOrder::Single` twin and the table's kernels of that order), the generic C order
//! (`vec_dot_q8k_ref`, through ggml's own reference outputs elsewhere), and the tiled
//! order (`DotOrder::Tiled`, ggml's tiled GEMM, which no single-row entry point exposes;
//! the whole-model checks in `arch_vs_llamacpp.rs` reach it) against an exact dot.
//! Skipped with a note where llama.cpp cannot run here.

use llamacpp_ref::GgmlKernel;
use quant::formats::q3_k::{vec_dot_q8k, vec_dot_q8k_ref, vec_dot_q8k_tiled};
use quant::{kernels, quantize_activations, quantize_row, DotOrder, GgmlType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;
use common::{floats_of, runs_here};

const Q3K: GgmlType = GgmlType::Q3_K;

fn row_of(ty: GgmlType, x: &[f32], activations: bool) -> Vec<u8> {
    let mut out = vec![0u8; ty.row_bytes(x.len() as u64).unwrap() as usize];
    if activations {
        quantize_activations(ty, x, &mut out).unwrap();
    } else {
        quantize_row(ty, x, &mut out).unwrap();
    }
    out
}

#[test]
fn vec_dot_matches_ggml() {
    if !runs_here() {
        return;
    }
    let g = GgmlKernel::new(Q3K).unwrap();
    assert_eq!(g.vec_dot_type(), GgmlType::Q8_K);
    let mut rng = StdRng::seed_from_u64(33);
    let mut differ_generic = 0;
    for trial in 0..1200 {
        let nb = [1, 2, 3, 4, 7, 16, 23][trial % 7];
        let n = nb * 256;
        let wide = trial % 5 == 0;
        let y = floats_of(&mut rng, n, wide);
        let w = if trial % 3 == 0 {
            row_of(Q3K, &y, false)
        } else {
            let wide_w = rng.gen_bool(0.3);
            row_of(Q3K, &floats_of(&mut rng, n, wide_w), false)
        };
        let a = row_of(GgmlType::Q8_K, &y, true);
        let single = vec_dot_q8k(&w, &a);
        let theirs = g.vec_dot(n, &w, &a).unwrap();
        assert_eq!(
            single.to_bits(),
            theirs.to_bits(),
            "vec_dot nb={nb}: ours {single:e} ggml {theirs:e}"
        );
        differ_generic += usize::from(vec_dot_q8k_ref(&w, &a).to_bits() != single.to_bits());
        let tiled = vec_dot_q8k_tiled(&w, &a);
        for (order, want) in [(DotOrder::Single, single), (DotOrder::Tiled, tiled)] {
            for set in kernels::available()
                .into_iter()
                .filter(|k| k.ty == Q3K && k.order == order)
            {
                assert_eq!(
                    (set.dot)(&w, &a).to_bits(),
                    want.to_bits(),
                    "{order:?} on {} nb={nb}",
                    set.isa
                );
            }
        }
        if wide {
            continue;
        }
        let mut xw = vec![0.0f32; n];
        let mut ya = vec![0.0f32; n];
        quant::dequantize_row(Q3K, &w, &mut xw).unwrap();
        quant::dequantize_row(GgmlType::Q8_K, &a, &mut ya).unwrap();
        let e: f64 = xw.iter().zip(&ya).map(|(&p, &q)| p as f64 * q as f64).sum();
        let mag: f64 = xw
            .iter()
            .zip(&ya)
            .map(|(&p, &q)| (p as f64 * q as f64).abs())
            .sum();
        if e.is_finite() {
            assert!(
                (tiled as f64 - e).abs() <= mag * 1e-5 + 1e-6,
                "tiled nb={nb}: {tiled:e} vs exact {e:e}"
            );
        }
    }
    assert!(
        differ_generic > 0,
        "the AVX2 and generic orders never differed"
    );
}
