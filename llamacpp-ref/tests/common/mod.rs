//! What the ggml comparison tests of the table formats (MXFP4, IQ4_NL) share.

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
