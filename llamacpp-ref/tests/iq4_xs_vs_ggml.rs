//! `quant`'s IQ4_XS against ggml itself, bit for bit, on random rows: the quantizer
//! `llama-quantize` runs (`quantize_iq4_xs`), the dequantizer, ggml's x86 `vec_dot` (its
//! AVX2 kernel, which llama.cpp runs below eight tokens: our `DotOrder::Single` twin and
//! the table's kernels of that order) and its generic C `vec_dot` (`vec_dot_q8k_ref`);
//! the tiled order (`DotOrder::Tiled`, ggml's tiled GEMM, which no single-row entry point
//! exposes; the whole-model checks in `arch_vs_llamacpp.rs` reach it) against an exact
//! dot. Skipped with a note where llama.cpp cannot run here.

use llamacpp_ref::iq4_xs as gx;
use quant::{quantize_row, GgmlType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;
use common::{floats_of, runs_here};

const XS: GgmlType = GgmlType::IQ4_XS;

fn xs_row(x: &[f32]) -> Vec<u8> {
    let mut w = vec![0u8; x.len() / 256 * 136];
    quantize_row(XS, x, &mut w).unwrap();
    w
}

#[test]
fn quantizer_and_dequantizer_match_ggml() {
    if !runs_here() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(3);
    for trial in 0..300 {
        let nb = rng.gen_range(1..6);
        let mut x = floats_of(&mut rng, nb * 256, trial % 7 == 0);
        if rng.gen_bool(0.1) {
            // A zero sub-block (its scale stays 0 and out of the maximum), or a whole
            // zero super-block.
            let len = if rng.gen_bool(0.5) { 32 } else { 256 };
            let at = 32 * rng.gen_range(0..8) % (257 - len);
            x[at..at + len].iter_mut().for_each(|v| *v = 0.0);
        }
        let ours = xs_row(&x);
        let mut theirs = vec![0u8; ours.len()];
        gx::quantize_row(&x, &mut theirs).unwrap();
        assert_eq!(ours, theirs, "quantize_iq4_xs, trial {trial}");
        let mut a = vec![0.0f32; x.len()];
        let mut b = vec![0.0f32; x.len()];
        quant::dequantize_row(XS, &ours, &mut a).unwrap();
        gx::dequantize_row(&theirs, &mut b).unwrap();
        for (i, (p, q)) in a.iter().zip(&b).enumerate() {
            assert_eq!(
                p.to_bits(),
                q.to_bits(),
                "dequantized element {i}, trial {trial}"
            );
        }
    }
    // Every scale bit and nibble under a spread of super-block scales.
    let q: Vec<u8> = (0..64 * 136)
        .map(|i| match i % 136 {
            0 => (i / 136 * 7) as u8,
            1 => [0x2c, 0xb1, 0x00, 0x3c][i / 136 % 4],
            _ => (i * 29 % 256) as u8,
        })
        .collect();
    let mut ours = vec![0.0f32; 64 * 256];
    let mut theirs = vec![0.0f32; 64 * 256];
    quant::dequantize_row(XS, &q, &mut ours).unwrap();
    gx::dequantize_row(&q, &mut theirs).unwrap();
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "dequantized element {i}");
    }
}

#[test]
fn vec_dot_matches_ggml() {
    // Our generic twin is ggml's generic C dot too (ggml exports it for IQ4_XS).
    common::k_orders_match_ggml(XS, 7, 1200, |n, w, a| {
        let ours = quant::formats::iq4_xs::vec_dot_q8k_ref(w, a);
        let theirs = gx::vec_dot_generic(n, w, a).unwrap();
        assert_eq!(ours.to_bits(), theirs.to_bits(), "generic vec_dot n={n}");
    });
}
