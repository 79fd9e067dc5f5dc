//! `quant`'s Q3_K dot products against ggml itself, bit for bit, on random rows: ggml's
//! `vec_dot` (its AVX2 kernel on x86, which llama.cpp runs below eight tokens: our
//! `DotOrder::Single` twin and the table's kernels of that order), the generic C order
//! (`vec_dot_q8k_ref`, through ggml's own reference outputs elsewhere), and the tiled
//! order (`DotOrder::Tiled`, ggml's tiled GEMM, which no single-row entry point exposes;
//! the whole-model checks in `arch_vs_llamacpp.rs` reach it) against an exact dot.
//! Skipped with a note where llama.cpp cannot run here.

mod common;

#[test]
fn vec_dot_matches_ggml() {
    common::k_orders_match_ggml(quant::GgmlType::Q3_K, 33, 1200, |_, _, _| {});
}
