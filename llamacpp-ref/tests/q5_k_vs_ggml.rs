//! `quant`'s Q5_K dot products against ggml itself, bit for bit, on random rows: ggml's
//! `vec_dot` (its AVX2 kernel on x86, which llama.cpp runs for one token: our
//! `DotOrder::Single` twin and the table's kernels of that order), and the twin against
//! an exact f64 dot, so the tiled order (`DotOrder::Tiled`, ggml's tiled GEMM, which no
//! single-row entry point exposes; the whole-model checks in `arch_vs_llamacpp.rs` reach
//! it) is a correct dot product too. Skipped with a note where llama.cpp cannot run here.

mod common;

#[test]
fn vec_dot_matches_ggml() {
    common::k_orders_match_ggml(quant::GgmlType::Q5_K, 5, 1500, |_, _, _| {});
}
