//! Times decode attention (`attend_heads`, one token over a full cache) at a model's
//! shape on one thread: `attn_decode N_HEAD N_KV HEAD_DIM CELLS [REPS]`, e.g. `32 8 128
//! 4096` for llama-3-8B. Prints the time per layer and the cache read rate, for all heads
//! at once and for one `attend_head` per head (`ONLY=heads` or `ONLY=per-head` runs one),
//! over `LAYERS` (default 8) layers' caches cycled. The flavor follows `RLLAMA_SIMD`
//! (AVX-512 unless lowered).

mod common;

use half::f16;
use quant::ops::attention::{attend_head, attend_heads, AttnParams, KvLayer};
use quant::F16Order;
use std::time::Instant;

fn main() {
    let a = common::args(4, "attn_decode N_HEAD N_KV HEAD_DIM CELLS [REPS]");
    let (n_head, n_kv, hd, n) = (a[0], a[1], a[2], a[3]);
    let reps = a.get(4).copied().unwrap_or(50);
    let flavor = common::flavor();
    let mut rnd = common::uniform();
    // Several layers' caches, cycled, so the reads come from memory as in a model.
    let n_layers: usize = std::env::var("LAYERS").map_or(8, |s| s.parse().unwrap());
    let k: Vec<Vec<f16>> = (0..n_layers)
        .map(|_| (0..n * n_kv * hd).map(|_| f16::from_f32(rnd())).collect())
        .collect();
    let v: Vec<Vec<f16>> = (0..n_layers)
        .map(|_| (0..n * n_kv * hd).map(|_| f16::from_f32(rnd())).collect())
        .collect();
    let q: Vec<f32> = (0..n_head * hd).map(|_| rnd()).collect();
    let slots: Vec<usize> = (0..n).collect();
    let layer = |l: usize| KvLayer {
        k: &k[l % n_layers],
        v: &v[l % n_layers],
        n_head_kv: n_kv,
        hk: hd,
        hv: hd,
    };
    let kv = layer(0);
    let p = AttnParams::new(flavor, F16Order::VecDot, 1.0 / (hd as f32).sqrt());
    let serial = |m: usize, f: &(dyn Fn(usize) + Sync)| (0..m).for_each(f);
    let per_head = |kv: &KvLayer<'_>, out: &mut [f32]| {
        for h in 0..n_head {
            let (qh, oh) = (&q[h * hd..][..hd], &mut out[h * hd..][..hd]);
            attend_head(&p, qh, &kv.head(h / (n_head / n_kv)), &slots, 0, oh);
        }
    };
    let mut out = vec![0.0f32; n_head * hd];
    let mut check = vec![0.0f32; n_head * hd];
    per_head(&kv, &mut check);
    attend_heads(&p, &serial, &q, n_head, &kv, &slots, 0, None, &mut out);
    assert!(
        out.iter()
            .zip(&check)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "heads differ from per-head"
    );
    let bytes = 2.0 * (n * n_kv * hd * 2) as f64;
    let only = std::env::var("ONLY").ok();
    for name in ["heads", "per-head"] {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t = Instant::now();
            for r in 0..reps {
                let kv = layer(r);
                if name == "heads" {
                    attend_heads(&p, &serial, &q, n_head, &kv, &slots, 0, None, &mut out);
                } else {
                    per_head(&kv, &mut out);
                }
            }
            best = best.min(t.elapsed().as_secs_f64() / reps as f64);
        }
        println!(
            "{name:9} {flavor:?}: {:.3} ms per layer, cache {:.1} GB/s",
            best * 1e3,
            bytes / best / 1e9
        );
    }
}
