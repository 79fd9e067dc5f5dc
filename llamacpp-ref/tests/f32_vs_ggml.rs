//! F32 weights (the routers of mixture-of-experts models, which llama.cpp never quantizes)
//! against ggml itself, bit for bit: our one-token order (`DotOrder::Single`) is ggml's
//! x86 `ggml_vec_dot_f32`, over lengths with and without a tail past the last whole step.
//! (The order of two or more tokens is llamafile's tinyBLAS, which ggml does not export;
//! the MoE model comparisons in `arch_vs_llamacpp` check it through whole models.)

use llamacpp_ref::GgmlKernel;
use quant::{kernels, DotOrder, GgmlType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[test]
fn f32_vec_dot_is_ggmls() {
    if let Some(why) = llamacpp_ref::cpu_mismatch() {
        eprintln!("skipped: {why}");
        return;
    }
    let g = GgmlKernel::new(GgmlType::F32).expect("ggml has an F32 vec_dot");
    let ours = kernels::kernels(GgmlType::F32, DotOrder::Single).expect("an F32 row");
    let mut rng = StdRng::seed_from_u64(0xf32);
    let mut checked = 0;
    for &n in &[
        1usize, 7, 8, 31, 32, 33, 64, 100, 128, 2048, 2880, 2881, 4099,
    ] {
        for _ in 0..20 {
            let scale = 10f32.powi(rng.gen_range(-3..3));
            let w: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0) * scale).collect();
            let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let wb: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
            let mut xb = vec![0u8; 4 * n];
            g.quantize_activations(&x, &mut xb).unwrap();
            let theirs = g.vec_dot(n, &wb, &xb).unwrap();
            let mine = (ours.dot)(&wb, &xb);
            assert_eq!(
                mine.to_bits(),
                theirs.to_bits(),
                "n {n}: ours {mine:e}, ggml {theirs:e}"
            );
            checked += 1;
        }
    }
    eprintln!("{checked} F32 dot products equal to ggml's");
}
