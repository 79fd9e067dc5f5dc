//! Kernel micro-benchmarks: our quantized dot products and matrix kernel against ggml's own
//! CPU kernels, one thread.
//!
//! ```sh
//! cargo bench -p llamacpp-ref --bench kernels                  # rllama + ggml rows
//! cargo bench -p llamacpp-ref --bench kernels -- 'matmul_Q4_K' # filter
//! ```
//!
//! Groups, each with a `rllama` row and a `ggml` row:
//! - `dot_{type}_{K}`: one weight row of K elements against one activation row. Both rows
//!   get the same weight bytes and the same activation bytes (already in the type's
//!   `vec_dot_type`); ours is the active kernel set's `dot` (`quant::kernels`), ggml's is the `vec_dot` pointer from
//!   `ggml_get_type_traits_cpu`.
//! - `matmul_{type}_{rows}x{K}_n{cols}`: W (rows x K) times `cols` activation columns,
//!   activation quantization included. Ours is `runtime::matmul::matmul` on a 1-thread
//!   pool; ggml's quantizes each column once with its `from_float` and then loops its
//!   `vec_dot` over the same 16-row tiles. That is ggml's kernel, not ggml's whole
//!   `mul_mat`, which would also use llamafile's sgemm or repacked weights when it can.
//!
//! Throughput is in elements = multiply-adds (rows * cols * K), so `Gelem/s` reads as
//! GMAC/s. Before timing, each type checks once that ggml's results and ours agree to a
//! relative 1e-3 (they sum floats in different orders, so they are not bit-exact).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use llamacpp_ref::GgmlKernel;
use quant::{quantize_activations, quantize_row, vec_dot_type, GgmlType};
use runtime::matmul::{matmul, MatRef, UbPos};
use runtime::pool::ThreadPool;

/// The weight types of our three models: K-quants first, then the 32-element blocks.
const TYPES: [GgmlType; 5] = [
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_1,
];

/// Dot lengths: a 7B-class hidden size and Qwen2.5-0.5B's (not a K-quant multiple).
const DOT_K: [usize; 2] = [4096, 896];

const MAT_ROWS: usize = 1024;
const MAT_K: usize = 4096;
const MAT_COLS: [usize; 3] = [1, 8, 64];

/// Rows per tile in the ggml loop, the same as `runtime::matmul`'s task size.
const TILE_ROWS: usize = 16;

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

fn row_bytes(ty: GgmlType, k: usize) -> usize {
    ty.row_bytes(k as u64).expect("whole blocks") as usize
}

/// `x` (rows of `k`) quantized row by row as weights of type `ty`.
fn weights(ty: GgmlType, x: &[f32], k: usize) -> Vec<u8> {
    let rb = row_bytes(ty, k);
    let mut out = vec![0u8; x.len() / k * rb];
    for (src, dst) in x.chunks_exact(k).zip(out.chunks_exact_mut(rb)) {
        quantize_row(ty, src, dst).expect("sizes match");
    }
    out
}

/// ggml's kernel for `ty`.
fn ggml_kernel(ty: GgmlType) -> Option<GgmlKernel> {
    let k = GgmlKernel::new(ty).unwrap_or_else(|e| panic!("{ty}: {e}"));
    assert_eq!(k.vec_dot_type(), vec_dot_type(ty), "{ty}: vec_dot_type");
    Some(k)
}

/// Panics unless `ours` and `ggml` agree to a relative 1e-3 of the larger of the two and
/// `floor` (a typical magnitude, so values that cancel to near zero are not judged alone).
fn assert_close(what: &str, ours: f32, ggml: f32, floor: f32) {
    let scale = ours.abs().max(ggml.abs()).max(floor);
    let rel = (ours - ggml).abs() / scale;
    assert!(
        rel <= 1e-3,
        "{what}: rllama {ours} vs ggml {ggml} (relative {rel:.2e})"
    );
}

fn dots(c: &mut Criterion) {
    for ty in TYPES {
        for k in DOT_K {
            if !k.is_multiple_of(ty.block_size()) {
                continue;
            }
            let at = vec_dot_type(ty);
            let w = weights(ty, &floats(1, k), k);
            let mut a = vec![0u8; row_bytes(at, k)];
            quantize_activations(at, &floats(2, k), &mut a).expect("sizes match");
            let ours = quant::kernels::kernels(ty, quant::DotOrder::Single)
                .expect("weight type has a dot kernel")
                .dot;
            let ggml = ggml_kernel(ty);
            if let Some(g) = &ggml {
                let want = ours(&w, &a);
                let got = g.vec_dot(k, &w, &a).expect("sizes match");
                assert_close(&format!("dot {ty} K={k}"), want, got, f32::MIN_POSITIVE);
            }

            let mut group = c.benchmark_group(format!("dot_{ty}_{k}"));
            group.throughput(Throughput::Elements(k as u64));
            group.bench_function("rllama", |b| b.iter(|| ours(black_box(&w), black_box(&a))));
            if let Some(g) = ggml {
                group.bench_function("ggml", |b| {
                    b.iter(|| g.vec_dot(k, black_box(&w), black_box(&a)).unwrap())
                });
            }
            group.finish();
        }
    }
}

/// `y[t][o] = dot(W[o], x[t])` with ggml's kernels: each activation row quantized once by
/// ggml's `from_float`, then `vec_dot` over 16-row tiles of W, every column per tile.
fn ggml_matmul(g: &GgmlKernel, w: &MatRef<'_>, x: &[f32], xq: &mut [u8], y: &mut [f32]) {
    let k = w.n_in;
    let xrb = xq.len() / (x.len() / k);
    for (src, dst) in x.chunks_exact(k).zip(xq.chunks_exact_mut(xrb)) {
        g.quantize_activations(src, dst).expect("sizes match");
    }
    let wrb = w.row_bytes();
    let n_tok = x.len() / k;
    for o0 in (0..w.n_out).step_by(TILE_ROWS) {
        let o1 = (o0 + TILE_ROWS).min(w.n_out);
        for t in 0..n_tok {
            let a = &xq[t * xrb..(t + 1) * xrb];
            for o in o0..o1 {
                y[t * w.n_out + o] = g
                    .vec_dot(k, &w.data[o * wrb..(o + 1) * wrb], a)
                    .expect("sizes match");
            }
        }
    }
}

fn matmuls(c: &mut Criterion) {
    let pool = ThreadPool::new(1);
    let wf = floats(3, MAT_ROWS * MAT_K);
    for ty in TYPES {
        let wq = weights(ty, &wf, MAT_K);
        let w = MatRef {
            ty,
            n_in: MAT_K,
            n_out: MAT_ROWS,
            data: &wq,
            copies: None,
            numerics: Default::default(),
            packed: None,
        };
        let ggml = ggml_kernel(ty);
        let xrb = row_bytes(vec_dot_type(ty), MAT_K);
        let mut group = c.benchmark_group(format!("matmul_{ty}_{MAT_ROWS}x{MAT_K}"));
        // One 64-column call is ~0.3 G multiply-adds: keep the sample count low.
        group.sample_size(10);
        for n in MAT_COLS {
            let x = floats(4 + n as u64, n * MAT_K);
            let mut xq = Vec::new();
            let mut y = vec![0f32; n * MAT_ROWS];
            let mut gxq = vec![0u8; n * xrb];
            let mut gy = vec![0f32; n * MAT_ROWS];
            let ub: Vec<UbPos> = UbPos::batch(n).collect();
            if let Some(g) = &ggml {
                matmul(&pool, &w, &x, &ub, &mut xq, &mut y);
                ggml_matmul(g, &w, &x, &mut gxq, &mut gy);
                let rms = (y.iter().map(|v| v * v).sum::<f32>() / y.len() as f32).sqrt();
                for (i, (&ours, &theirs)) in y.iter().zip(&gy).enumerate() {
                    assert_close(&format!("matmul {ty} n={n} y[{i}]"), ours, theirs, rms);
                }
                if xq != gxq {
                    eprintln!(
                        "kernels: {ty} n={n}: ggml's from_float and ours quantize differently"
                    );
                }
            }

            group.throughput(Throughput::Elements((MAT_ROWS * n * MAT_K) as u64));
            group.bench_function(BenchmarkId::new("rllama", format!("n{n}")), |b| {
                b.iter(|| matmul(&pool, &w, black_box(&x), &ub, &mut xq, &mut y))
            });
            if let Some(g) = &ggml {
                group.bench_function(BenchmarkId::new("ggml", format!("n{n}")), |b| {
                    b.iter(|| ggml_matmul(g, &w, black_box(&x), &mut gxq, &mut gy))
                });
            }
        }
        group.finish();
    }
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = config();
    targets = dots, matmuls
}
criterion_main!(benches);
