//! Every kernel of the table per format over one 4096-element row, scalar twin included
//! (plus the attention products).
//!
//! `cargo bench -p quant --bench dot` (add `-- Q4_K` etc. to filter).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use half::f16;
use quant::{kernels, quantize_activations, quantize_row, vec_dot_type, DotOrder, GgmlType};

const N: usize = 4096;

/// Deterministic pseudo-random floats in [-1, 1).
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

fn row(ty: GgmlType, x: &[f32], activations: bool) -> Vec<u8> {
    let mut out = vec![0u8; ty.row_bytes(x.len() as u64).unwrap() as usize];
    if activations {
        quantize_activations(ty, x, &mut out).unwrap();
    } else {
        quantize_row(ty, x, &mut out).unwrap();
    }
    out
}

fn dots(c: &mut Criterion) {
    use GgmlType as T;
    for ty in [
        T::Q4_K,
        T::Q6_K,
        T::Q4_1,
        T::Q5_0,
        T::Q8_0,
        T::Q4_0,
        T::Q5_1,
        T::Q5_K,
        T::Q3_K,
        T::Q2_K,
        T::MXFP4,
    ] {
        let w = row(ty, &floats(1, N), false);
        let a = row(vec_dot_type(ty), &floats(2, N), true);
        let mut g = c.benchmark_group(format!("{ty}x{}_{N}", vec_dot_type(ty)));
        // Every kernel set of the table this CPU runs, scalar twin first; MXFP4's
        // repacked order (what llama.cpp runs for most MXFP4 matrices) beside its
        // `vec_dot` one.
        for k in kernels::available().into_iter().filter(|k| {
            k.ty == ty
                && (k.order == DotOrder::Single || (ty == T::MXFP4 && k.order == DotOrder::Gemm4))
        }) {
            let dot = k.dot;
            let name = match k.order {
                DotOrder::Single => k.isa.name().to_string(),
                o => format!("{}_{}", o.name(), k.isa.name()),
            };
            g.bench_function(name, |b| b.iter(|| dot(black_box(&w), black_box(&a))));
        }
        g.finish();
    }
}

fn attention(c: &mut Criterion) {
    for n in [128usize, 4096] {
        let a = floats(3, n);
        let b: Vec<f16> = floats(4, n).into_iter().map(f16::from_f32).collect();
        use quant::ops::f16::{dot_f16, dot_f16_scalar, sum_rows_f16, sum_rows_f16_scalar};
        use quant::{F16Order, Flavor};
        let (fl, ord) = (Flavor::Avx512, F16Order::Gemm);
        let mut g = c.benchmark_group(format!("ggml_dot_f16_{n}"));
        g.bench_function("scalar", |bn| {
            bn.iter(|| dot_f16_scalar(fl, ord, black_box(&a), black_box(&b)))
        });
        g.bench_function("dispatched", |bn| {
            bn.iter(|| dot_f16(fl, ord, black_box(&a), black_box(&b)))
        });
        g.finish();
        // The V-row sum of attention: 64 slots of n values.
        let slots: Vec<usize> = (0..64).collect();
        let ps = floats(5, 64);
        let cache: Vec<f16> = floats(6, 64 * n).into_iter().map(f16::from_f32).collect();
        let mut out = vec![0.0f32; n];
        let mut g = c.benchmark_group(format!("sum_rows_f16_64x{n}"));
        g.bench_function("scalar", |bn| {
            bn.iter(|| sum_rows_f16_scalar(black_box(&mut out), &ps, &cache, &slots, n, 0))
        });
        g.bench_function("dispatched", |bn| {
            bn.iter(|| sum_rows_f16(black_box(&mut out), &ps, &cache, &slots, n, 0))
        });
        g.finish();
    }
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1000))
        .sample_size(20)
}

criterion_group! {
    name = benches;
    config = config();
    targets = dots, attention
}
criterion_main!(benches);
