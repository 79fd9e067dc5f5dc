//! MXFP4 kernels, ours against llama.cpp's own, one thread, at gpt-oss-20b's expert
//! shape (2880 x 2880: 90 blocks per row).
//!
//! ```sh
//! cargo bench -p llamacpp-ref --bench mxfp4            # every group
//! cargo bench -p llamacpp-ref --bench mxfp4 -- stream  # filter
//! ```
//!
//! Groups, each with an `rllama` and a `ggml` row:
//! - `mxfp4_dot_{K}`: one row, llama.cpp's `vec_dot` order (matrices it does not repack):
//!   our `DotOrder::Single` kernel against ggml's `ggml_vec_dot_mxfp4_q8_0`.
//! - `mxfp4_prefill_{rows}x{K}_n{T}`: the matrix against T tokens, the repacked order:
//!   our packed tile (`KernelSet::packed_into` of `DotOrder::Gemm4`, as the runtime calls
//!   it for a prompt) against ggml's `ggml_gemm_mxfp4_8x8_q8_0` on its repacked rows.
//!   Compute-bound (the matrix stays in cache).
//! - `mxfp4_decode_{rows}x{K}`: one token, from cache: our packed tile against
//!   `ggml_gemv_mxfp4_8x8_q8_0`.
//! - `mxfp4_decode_stream_{M}x{rows}x{K}`: one token against M such matrices in turn
//!   (more than the last-level cache holds, as a decode step's experts are): the rate at
//!   which the weights stream from memory, in bytes.
//!
//! Activations are quantized beforehand on both sides (the same bytes; ggml's gemm takes
//! them interleaved by four). Before timing, the results of both are checked to be the
//! same bits (`tests/mxfp4_vs_ggml.rs` proves it more widely).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use llamacpp_ref::{mxfp4 as gm, GgmlKernel};
use quant::{kernels, quantize_activations, quantize_row, DotOrder, GgmlType, KernelSet, SideBuf};

const MX: GgmlType = GgmlType::MXFP4;
const ROWS: usize = 2880;
const K: usize = 2880;
const TOKENS: usize = 64;
/// Matrices of the streaming group: 24 x 4.4 MB, several times a 32 MiB L3.
const STREAM_MATS: usize = 24;

/// Deterministic pseudo-random floats in [-1, 1) (xorshift64).
fn floats(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn weights(seed: u64, rows: usize, k: usize) -> Vec<u8> {
    let x = floats(seed, rows * k);
    let rb = k / 32 * 17;
    let mut w = vec![0u8; rows * rb];
    for (src, dst) in x.chunks_exact(k).zip(w.chunks_exact_mut(rb)) {
        quantize_row(MX, src, dst).unwrap();
    }
    w
}

fn acts(seed: u64, tokens: usize, k: usize) -> (Vec<f32>, Vec<u8>) {
    let x = floats(seed, tokens * k);
    let rb = k / 32 * 34;
    let mut a = vec![0u8; tokens * rb];
    for (src, dst) in x.chunks_exact(k).zip(a.chunks_exact_mut(rb)) {
        quantize_activations(GgmlType::Q8_0, src, dst).unwrap();
    }
    (x, a)
}

/// Our side of one product: the packed tile over every row of `packed`, `tokens`
/// activation rows of `a`, as the runtime calls it (its per-call row count for decode or
/// for a prompt), results token-major in `out`.
fn ours(set: &KernelSet, side: &SideBuf, packed: &[u8], a: &[u8], tokens: usize, out: &mut [f32]) {
    let into = set.packed_into.expect("a packed kernel");
    let (rb, ab) = (K / 32 * 17, K / 32 * 34);
    let rows = packed.len() / rb;
    let per = if tokens <= 2 {
        set.stream_rows
    } else {
        set.packed_rows
    };
    let mut c0 = 0;
    while c0 < tokens {
        let c1 = (c0 + set.packed_tokens).min(tokens);
        let mut r0 = 0;
        while r0 < rows {
            let take = per.min(rows - r0);
            // SAFETY: slots c * rows + r0 + r (r < take, c < tokens) are in `out`.
            unsafe {
                into(
                    &packed[r0 * rb..(r0 + take) * rb],
                    take,
                    &a[c0 * ab..],
                    ab,
                    side.rows(set, c0, c1),
                    c1 - c0,
                    out.as_mut_ptr().add(c0 * rows + r0),
                    rows,
                )
            };
            r0 += take;
        }
        c0 = c1;
    }
}

fn check_same(what: &str, ours: &[f32], ggml: &[f32]) {
    for (i, (a, b)) in ours.iter().zip(ggml).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "{what}[{i}]: rllama {a} ggml {b}");
    }
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20)
}

fn benches(c: &mut Criterion) {
    if let Some(why) = llamacpp_ref::cpu_mismatch() {
        eprintln!("mxfp4 bench skipped: {why}");
        return;
    }
    let set = kernels::kernels(MX, DotOrder::Gemm4).unwrap();
    eprintln!("mxfp4: our kernels for {:?} at {}", set.order, set.isa);
    let rb = K / 32 * 17;

    // One row in llama.cpp's `vec_dot` order.
    let dk = 4096;
    let w1 = weights(1, 1, dk);
    let (_, a1) = acts(2, 1, dk);
    let single = kernels::kernels(MX, DotOrder::Single).unwrap().dot;
    let g = GgmlKernel::new(MX).unwrap();
    assert_eq!(
        single(&w1, &a1).to_bits(),
        g.vec_dot(dk, &w1, &a1).unwrap().to_bits()
    );
    let mut group = c.benchmark_group(format!("mxfp4_dot_{dk}"));
    group.throughput(Throughput::Elements(dk as u64));
    group.bench_function("rllama", |b| {
        b.iter(|| single(black_box(&w1), black_box(&a1)))
    });
    group.bench_function("ggml", |b| {
        b.iter(|| g.vec_dot(dk, black_box(&w1), black_box(&a1)).unwrap())
    });
    group.finish();

    let w = weights(3, ROWS, K);
    let mut packed = vec![0u8; w.len()];
    quant::pack8(MX, &w, K, &mut packed).unwrap();
    let repacked = gm::repack_8x8(&w, K).unwrap();
    let (x, a) = acts(4, TOKENS, K);
    let mut side = SideBuf::default();
    for r in a.chunks_exact(K / 32 * 34) {
        side.push(&set, r);
    }
    let mut a4 = vec![0u8; TOKENS / 4 * (K / 32) * 136];
    for (xg, dst) in x
        .chunks_exact(4 * K)
        .zip(a4.chunks_exact_mut((K / 32) * 136))
    {
        gm::quantize_mat_q8_0_4x8(xg, K, dst).unwrap();
    }
    let mut y = vec![0f32; TOKENS * ROWS];
    let mut gy = vec![0f32; TOKENS * ROWS];

    // Prefill: every token, compute-bound.
    ours(&set, &side, &packed, &a, TOKENS, &mut y);
    gm::gemm(K, &repacked, ROWS, &a4, TOKENS, &mut gy).unwrap();
    check_same("prefill", &y, &gy);
    let mut group = c.benchmark_group(format!("mxfp4_prefill_{ROWS}x{K}_n{TOKENS}"));
    group.sample_size(10);
    group.throughput(Throughput::Elements((ROWS * K * TOKENS) as u64));
    group.bench_function("rllama", |b| {
        b.iter(|| ours(&set, &side, black_box(&packed), &a, TOKENS, &mut y))
    });
    group.bench_function("ggml", |b| {
        b.iter(|| gm::gemm(K, black_box(&repacked), ROWS, &a4, TOKENS, &mut gy).unwrap())
    });
    group.finish();

    // Decode, one token, the matrix in cache.
    let a0 = &a[..K / 32 * 34];
    ours(&set, &side, &packed, a0, 1, &mut y[..ROWS]);
    gm::gemv(K, &repacked, ROWS, a0, &mut gy[..ROWS]).unwrap();
    check_same("decode", &y[..ROWS], &gy[..ROWS]);
    let mut group = c.benchmark_group(format!("mxfp4_decode_{ROWS}x{K}"));
    group.throughput(Throughput::Elements((ROWS * K) as u64));
    group.bench_function("rllama", |b| {
        b.iter(|| ours(&set, &side, black_box(&packed), a0, 1, &mut y[..ROWS]))
    });
    group.bench_function("ggml", |b| {
        b.iter(|| gm::gemv(K, black_box(&repacked), ROWS, a0, &mut gy[..ROWS]).unwrap())
    });
    group.finish();

    // Decode from memory: many matrices in turn (the same bytes repeated would stay in
    // cache, so each is its own copy).
    let mats: Vec<(Vec<u8>, Vec<u8>)> = (0..STREAM_MATS)
        .map(|m| {
            let mut p = packed.clone();
            let mut r = repacked.clone();
            // Distinct bytes per matrix (one quant byte after the first block's eight
            // exponents, in both layouts), the same work.
            p[8 + m] ^= 1;
            r[8 + m] ^= 1;
            (p, r)
        })
        .collect();
    let mut group = c.benchmark_group(format!("mxfp4_decode_stream_{STREAM_MATS}x{ROWS}x{K}"));
    group.sample_size(10);
    group.throughput(Throughput::Bytes((STREAM_MATS * ROWS * rb) as u64));
    group.bench_function("rllama", |b| {
        b.iter(|| {
            for (p, _) in &mats {
                ours(&set, &side, black_box(p), a0, 1, &mut y[..ROWS]);
            }
        })
    });
    group.bench_function("ggml", |b| {
        b.iter(|| {
            for (_, r) in &mats {
                gm::gemv(K, black_box(r), ROWS, a0, &mut gy[..ROWS]).unwrap();
            }
        })
    });
    group.finish();
}

criterion_group! {
    name = mxfp4;
    config = config();
    targets = benches
}
criterion_main!(mxfp4);
