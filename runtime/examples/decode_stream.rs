//! How close one-token products get to the memory's read speed: `decode_stream [LAYERS]
//! [THREADS] [PASSES]` builds LAYERS layers of llama-3-8B-shaped weights (Q4_K_M's types:
//! Q4_K, with V and down Q6_K where llama.cpp gives them more bits; a synthetic model's
//! random valid blocks, `runtime::synth::random_blocks`), packed as the model loads them,
//! and alternates two kinds of pass over all of them with the same thread pool: the
//! decode products of one token (QKV, O, gate/up, down per layer, as the forward pass
//! calls them) and a plain read of the same packed bytes (the roofline of this run).
//! Prints the median GB/s of each and their ratio. Defaults: 8 layers (about 1.06 GB,
//! well past the caches), 2 threads, 7 passes each. `DECODE_STREAM_TYPE=q4_k|q6_k|q8_0|mxfp4`
//! makes every matrix that type, to see each kernel's share of the gap.

use quant::GgmlType;
use rand::{Rng, SeedableRng};
use runtime::matmul::{matmul_many, MatRef, Numerics, UbPos};
use runtime::packed::{PackSource, PackedWeights};
use runtime::pool::ThreadPool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

const D: usize = 4096;
const KV: usize = 1024;
const FF: usize = 14336;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let a: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| {
            s.parse()
                .expect("decode_stream [LAYERS] [THREADS] [PASSES]")
        })
        .collect();
    let layers = a.first().copied().unwrap_or(8);
    let threads = a.get(1).copied().unwrap_or(2);
    let passes = a.get(2).copied().unwrap_or(7);
    // `DECODE_STREAM_TYPE=q4_k|q6_k|q8_0|mxfp4` makes every matrix that type (each kernel
    // alone).
    let only = std::env::var("DECODE_STREAM_TYPE")
        .ok()
        .map(|t| match t.as_str() {
            "q4_k" => GgmlType::Q4_K,
            "q6_k" => GgmlType::Q6_K,
            "q8_0" => GgmlType::Q8_0,
            "mxfp4" => GgmlType::MXFP4,
            _ => panic!("DECODE_STREAM_TYPE: q4_k, q6_k, q8_0 or mxfp4"),
        });
    let more = |l: usize| runtime::synth::use_more_bits(l, 32);
    // (type, n_out, n_in) of each matrix, in the file's order per layer: q, k, v, o, gate,
    // up, down (layers 0..LAYERS of a 32-layer model's types).
    let mut shapes = Vec::new();
    for l in 0..layers {
        let v = if more(l) {
            GgmlType::Q6_K
        } else {
            GgmlType::Q4_K
        };
        shapes.extend([
            (GgmlType::Q4_K, D, D),
            (GgmlType::Q4_K, KV, D),
            (v, KV, D),
            (GgmlType::Q4_K, D, D),
            (GgmlType::Q4_K, FF, D),
            (GgmlType::Q4_K, FF, D),
            (v, D, FF),
        ]);
        if let Some(t) = only {
            let n = shapes.len();
            shapes[n - 7..].iter_mut().for_each(|s| s.0 = t);
        }
    }
    let mut mats = Vec::new();
    let mut total = 0;
    for &(ty, n_out, n_in) in &shapes {
        let len = n_out * ty.row_bytes(n_in as u64).unwrap() as usize;
        mats.push(PackSource {
            ty,
            n_in,
            n_out,
            start: total,
            len,
        });
        total += len;
    }
    let mut image = vec![0u8; total];
    for (i, m) in mats.iter().enumerate() {
        let dst = &mut image[m.start..m.start + m.len];
        runtime::synth::random_blocks(m.ty, 7, &i.to_string(), dst);
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let packed = PackedWeights::new(&image, &mats, Numerics::Exact, &|_, _| {})
        .expect("pack")
        .expect("these types pack at this ISA");
    let refs: Vec<MatRef> = mats
        .iter()
        .map(|m| MatRef {
            ty: m.ty,
            n_in: m.n_in,
            n_out: m.n_out,
            data: &image[m.start..m.start + m.len],
            copies: None,
            numerics: Numerics::Exact,
            packed: packed.get(m.start),
        })
        .collect();
    let pool = ThreadPool::new(threads);
    let x: Vec<f32> = (0..FF).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let ub: Vec<UbPos> = UbPos::batch(1).collect();
    let mut xq = Vec::new();
    let mut ys: Vec<Vec<f32>> = mats.iter().map(|m| vec![0.0; m.n_out]).collect();
    let mut products = || {
        for l in 0..layers {
            let r = &refs[7 * l..7 * l + 7];
            let [q, k, v, o, g, u, dn] = &mut ys[7 * l..7 * l + 7] else {
                unreachable!()
            };
            matmul_many(&pool, &r[0..3], &x[..D], &ub, &mut xq, &mut [q, k, v]);
            matmul_many(&pool, &r[3..4], &x[..D], &ub, &mut xq, &mut [o]);
            matmul_many(&pool, &r[4..6], &x[..D], &ub, &mut xq, &mut [g, u]);
            matmul_many(&pool, &r[6..7], &x[..FF], &ub, &mut xq, &mut [dn]);
        }
    };
    // The roofline: the same packed bytes summed by the same pool, in 256 KiB tasks.
    let bufs: Vec<&[u8]> = refs.iter().map(|r| r.packed.unwrap()).collect();
    let sum_all = || {
        let acc = AtomicU64::new(0);
        for b in &bufs {
            let words = b.len() / 8;
            let chunk = 32 * 1024;
            pool.run(words.div_ceil(chunk), &|t| {
                let s = &b[t * chunk * 8..((t + 1) * chunk * 8).min(words * 8)];
                // SAFETY: any bytes are valid u64s; the unaligned ends are skipped (the
                // matrices start on cache lines, so there are none).
                let (_, words, _) = unsafe { s.align_to::<u64>() };
                let v = words.iter().fold(0u64, |a, &w| a.wrapping_add(w));
                acc.fetch_add(v, Ordering::Relaxed);
            });
        }
        acc.into_inner()
    };
    let bytes: usize = bufs.iter().map(|b| b.len()).sum();
    products();
    let check = sum_all();
    let (mut mm, mut rd) = (Vec::new(), Vec::new());
    for _ in 0..passes {
        let t0 = Instant::now();
        products();
        mm.push(bytes as f64 / t0.elapsed().as_secs_f64() / 1e9);
        let t0 = Instant::now();
        assert_eq!(sum_all(), check);
        rd.push(bytes as f64 / t0.elapsed().as_secs_f64() / 1e9);
    }
    let (m, r) = (median(&mut mm), median(&mut rd));
    let (ahead, switches) = runtime::tune::decode_prefetch_state();
    println!(
        "{layers} layers, {:.2} GB packed, {threads} threads: products {m:.1} GB/s, plain read {r:.1} GB/s, ratio {:.3} (isa {}; prefetch {} KiB ahead, {switches} switches)",
        bytes as f64 / 1e9,
        m / r,
        quant::isa::active(),
        ahead >> 10
    );
}
