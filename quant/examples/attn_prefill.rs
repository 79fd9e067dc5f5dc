//! Times prefill attention at depth (`attend_tile`, as the runtime calls it: a KV group's
//! heads times a few consecutive tokens per tile) on one thread: `attn_prefill N_HEAD
//! N_KV HEAD_DIM DEPTH TOKENS [TILE_QUERIES]`, e.g. `14 2 64 4096 64` for qwen2.5-0.5B.
//! Prints the time per token and layer and the multiply-adds per second. The flavor
//! follows `RLLAMA_SIMD` (AVX-512 unless lowered); the GEMM order, as a batch uses.

mod common;

use half::f16;
use quant::ops::attention::{attend_tile, AttnParams, KvLayer};
use quant::F16Order;
use std::time::Instant;

fn main() {
    let a = common::args(
        5,
        "attn_prefill N_HEAD N_KV HEAD_DIM DEPTH TOKENS [TILE_QUERIES]",
    );
    let (n_head, n_kv, hd, depth, tokens) = (a[0], a[1], a[2], a[3], a[4]);
    let tile_queries = a.get(5).copied().unwrap_or(32);
    let flavor = common::flavor();
    let mut rnd = common::uniform();
    let n = depth + tokens;
    let k: Vec<f16> = (0..n * n_kv * hd).map(|_| f16::from_f32(rnd())).collect();
    let v: Vec<f16> = (0..n * n_kv * hd).map(|_| f16::from_f32(rnd())).collect();
    let q: Vec<f32> = (0..tokens * n_head * hd).map(|_| rnd()).collect();
    let slots: Vec<usize> = (0..n).collect();
    let kv = KvLayer {
        k: &k,
        v: &v,
        n_head_kv: n_kv,
        hk: hd,
        hv: hd,
    };
    let p = AttnParams::new(flavor, F16Order::Gemm, 1.0 / (hd as f32).sqrt());
    let group = n_head / n_kv;
    let per_tile = (tile_queries / group).max(1);
    let mut out = vec![0.0f32; tokens * n_head * hd];
    let (mut qs, mut ranges, mut o) = (Vec::new(), Vec::new(), Vec::new());
    let mut pass = || {
        for g in 0..n_kv {
            for t0 in (0..tokens).step_by(per_tile) {
                let t1 = (t0 + per_tile).min(tokens);
                qs.clear();
                ranges.clear();
                for t in t0..t1 {
                    qs.extend_from_slice(&q[(t * n_head + g * group) * hd..][..group * hd]);
                    ranges.extend(std::iter::repeat_n((0, depth + t), group));
                }
                o.resize(qs.len(), 0.0);
                attend_tile(&p, &qs, &ranges, &kv.head(g), &slots, None, &mut o);
                for (i, t) in (t0..t1).enumerate() {
                    out[(t * n_head + g * group) * hd..][..group * hd]
                        .copy_from_slice(&o[i * group * hd..][..group * hd]);
                }
            }
        }
    };
    pass();
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        pass();
        best = best.min(t.elapsed().as_secs_f64());
    }
    let macs = (0..tokens)
        .map(|t| (depth + t + 1) * n_head * 2 * hd)
        .sum::<usize>() as f64;
    println!(
        "{flavor:?} tiles of {per_tile} tokens: {:.3} ms per token and layer, {:.1} G multiply-adds/s",
        best * 1e3 / tokens as f64,
        macs / best / 1e9
    );
}
