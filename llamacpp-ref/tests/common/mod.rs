//! What the ggml comparison tests of the formats share.

use rand::rngs::StdRng;
use rand::Rng;

/// Whether the linked llama.cpp can run on this CPU (else a note, and the test skips).
pub fn runs_here() -> bool {
    if let Some(why) = llamacpp_ref::cpu_mismatch() {
        eprintln!("skipped: {why}");
        return false;
    }
    true
}

/// Floats of one of several shapes and magnitudes; `wide` adds tiny ones (subnormal and
/// wrapping exponents) and huge ones (the top of the range), which only the quantizer
/// tests take (products of such blocks overflow).
pub fn floats_of(rng: &mut StdRng, n: usize, wide: bool) -> Vec<f32> {
    let scale = match rng.gen_range(0..8) {
        0 if wide => 2f32.powi(rng.gen_range(-149..-120)),
        1 if wide => 2f32.powi(rng.gen_range(100..=121)),
        _ => 10f32.powi(rng.gen_range(-5..4)),
    };
    let spiky = rng.gen_bool(0.3);
    (0..n)
        .map(|i| {
            let x: f32 = rng.gen_range(-1.0..1.0);
            if i % 13 == 5 && rng.gen_bool(0.2) {
                0.0
            } else if spiky && rng.gen_bool(0.03) {
                x * 40.0 * scale
            } else {
                x * scale
            }
        })
        .collect()
}

/// The checks every 256-element type with Q8_K activations gets against ggml, on random
/// rows (a third of the weights from the activations' own floats: large sums): our
/// `DotOrder::Single` twin and every kernel of that order equal ggml's `vec_dot` (its AVX2
/// kernel on x86, what llama.cpp runs below eight tokens) bit for bit; every kernel of
/// the tiled order equals its twin; both twins are the dot product to float rounding
/// (ggml's tiled GEMM has no single-row entry point: `arch_vs_llamacpp.rs` reaches it);
/// and ggml's generic C order differs from the AVX2 one somewhere, so the test can tell
/// them apart. `also` sees each (n, weights, activations) for a type's own checks.
#[allow(dead_code)]
pub fn k_orders_match_ggml(
    ty: quant::GgmlType,
    seed: u64,
    trials: usize,
    also: impl Fn(usize, &[u8], &[u8]),
) {
    use quant::{kernels, DotOrder, GgmlType};
    use rand::SeedableRng;
    if !runs_here() {
        return;
    }
    let g = llamacpp_ref::GgmlKernel::new(ty).unwrap();
    assert_eq!(g.vec_dot_type(), GgmlType::Q8_K);
    let row = |t: GgmlType, x: &[f32], act: bool| {
        let mut out = vec![0u8; t.row_bytes(x.len() as u64).unwrap() as usize];
        if act {
            quant::quantize_activations(t, x, &mut out).unwrap();
        } else {
            quant::quantize_row(t, x, &mut out).unwrap();
        }
        out
    };
    let twin = |o: DotOrder| kernels::scalar(ty, o).unwrap().dot;
    let generic = kernels::ggml_generic_dot(ty).unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut differ_generic = 0;
    for trial in 0..trials {
        let nb = [1, 2, 3, 4, 7, 16, 23][trial % 7];
        let n = nb * 256;
        let wide = trial % 5 == 0;
        let y = floats_of(&mut rng, n, wide);
        let mut wide_w = false;
        let w = if trial % 3 == 0 {
            row(ty, &y, false)
        } else {
            wide_w = rng.gen_bool(0.3);
            row(ty, &floats_of(&mut rng, n, wide_w), false)
        };
        let a = row(GgmlType::Q8_K, &y, true);
        let single = twin(DotOrder::Single)(&w, &a);
        let theirs = g.vec_dot(n, &w, &a).unwrap();
        assert_eq!(
            single.to_bits(),
            theirs.to_bits(),
            "{ty} vec_dot nb={nb}: ours {single:e} ggml {theirs:e}"
        );
        differ_generic += usize::from(generic(&w, &a).to_bits() != single.to_bits());
        let tiled = twin(DotOrder::Tiled)(&w, &a);
        for (order, want) in [(DotOrder::Single, single), (DotOrder::Tiled, tiled)] {
            for set in kernels::available()
                .into_iter()
                .filter(|k| k.ty == ty && k.order == order)
            {
                assert_eq!(
                    (set.dot)(&w, &a).to_bits(),
                    want.to_bits(),
                    "{ty} {order:?} on {} nb={nb}",
                    set.isa
                );
            }
        }
        also(n, &w, &a);
        // Both orders are the dot product, to float rounding (away from the edges of the
        // float range, where the twins' intermediate products may round to zero).
        if wide || wide_w {
            continue;
        }
        let mut xw = vec![0.0f32; n];
        let mut ya = vec![0.0f32; n];
        quant::dequantize_row(ty, &w, &mut xw).unwrap();
        quant::dequantize_row(GgmlType::Q8_K, &a, &mut ya).unwrap();
        let e: f64 = xw.iter().zip(&ya).map(|(&p, &q)| p as f64 * q as f64).sum();
        let mag: f64 = xw
            .iter()
            .zip(&ya)
            .map(|(&p, &q)| (p as f64 * q as f64).abs())
            .sum();
        if !e.is_finite() {
            continue;
        }
        for (name, v) in [("single", single), ("tiled", tiled)] {
            assert!(
                (v as f64 - e).abs() <= mag * 1e-5 + 1e-6,
                "{ty} {name} nb={nb}: {v:e} vs exact {e:e}"
            );
        }
    }
    assert!(
        differ_generic > 0,
        "{ty}: the AVX2 and generic orders never differed"
    );
}
