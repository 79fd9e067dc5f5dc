//! Times the exact (llama.cpp-order) packed matrix kernel of one weight type on one
//! thread, as a prompt's batch calls it: `packed_gemm TYPE ROWS N_IN [TOKENS]`, e.g.
//! `q5_0 2048 640 64` for gemma3-270m's gate rows. Each pass takes every group of eight
//! rows against every token; a small matrix stays in cache between passes, so this
//! times the kernel's arithmetic, not memory. Prints the time per token and the
//! multiply-adds per second; the ISA follows `RLLAMA_SIMD`; best of `REPS` (default 5)
//! passes. `ORDER=fast` times the fast order's packed kernel instead (`single`, the
//! default, llama.cpp's; `gemm4` llama.cpp's repacked order of Q4_K and MXFP4).

mod common;

use quant::kernels::{kernels, SideBuf};
use quant::{DotOrder, GgmlType};
use std::time::Instant;

const USAGE: &str = "usage: packed_gemm TYPE ROWS N_IN [TOKENS]";

fn main() {
    let name = std::env::args().nth(1).unwrap_or_default();
    let ty = GgmlType::ALL
        .into_iter()
        .find(|t| t.to_string().eq_ignore_ascii_case(&name))
        .expect(USAGE);
    let a: Vec<usize> = std::env::args()
        .skip(2)
        .map(|s| s.parse().expect(USAGE))
        .collect();
    assert!(a.len() >= 2, "{USAGE}");
    let (rows, n_in) = (a[0], a[1]);
    let tokens = a.get(2).copied().unwrap_or(64);
    assert!(rows.is_multiple_of(8), "rows: whole groups of eight");
    let order = match std::env::var("ORDER").as_deref() {
        Ok("fast") => DotOrder::Fast,
        Ok("gemm4") => DotOrder::Gemm4,
        Ok("single") | Err(_) => DotOrder::Single,
        Ok(other) => panic!("ORDER={other}: single, gemm4 or fast"),
    };
    let set = kernels(ty, order).expect("no kernels for this type");
    let into = set.packed_into.expect("no packed kernel for this type");
    let mut rnd = common::uniform();
    let x: Vec<f32> = (0..rows * n_in).map(|_| rnd()).collect();
    let rb = ty.row_bytes(n_in as u64).unwrap() as usize;
    let mut w = vec![0u8; rows * rb];
    for (r, dst) in w.chunks_exact_mut(rb).enumerate() {
        quant::quantize_row(ty, &x[r * n_in..(r + 1) * n_in], dst).unwrap();
    }
    let mut packed = vec![0u8; w.len()];
    quant::pack8(ty, &w, n_in, &mut packed).unwrap();
    let ab = set.act.row_bytes(n_in as u64).unwrap() as usize;
    let mut acts = vec![0u8; tokens * ab];
    for dst in acts.chunks_exact_mut(ab) {
        let row: Vec<f32> = (0..n_in).map(|_| rnd()).collect();
        set.quantize_activations(&row, dst).unwrap();
    }
    let mut side = SideBuf::default();
    for r in acts.chunks_exact(ab) {
        side.push(&set, r);
    }
    let mut out = vec![0.0f32; tokens * rows];
    let per = set.packed_tokens.min(tokens);
    let mut pass = || {
        for g in 0..rows / 8 {
            let wg = &packed[g * 8 * rb..(g + 1) * 8 * rb];
            let mut c0 = 0;
            while c0 < tokens {
                let c1 = (c0 + per).min(tokens);
                // SAFETY: slots c * rows + 8g + r (r < 8, c < tokens) are in `out`.
                unsafe {
                    into(
                        wg,
                        8,
                        &acts[c0 * ab..],
                        ab,
                        side.rows(&set, c0, c1),
                        c1 - c0,
                        out.as_mut_ptr().add(c0 * rows + 8 * g),
                        rows,
                    )
                };
                c0 = c1;
            }
        }
    };
    pass();
    let reps = std::env::var("REPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let mut best = f64::MAX;
    for _ in 0..reps {
        let t = Instant::now();
        pass();
        best = best.min(t.elapsed().as_secs_f64());
    }
    let macs = (rows * n_in * tokens) as f64;
    println!(
        "{ty} {} {rows}x{n_in}, {tokens} tokens: {:.3} ms per token, {:.1} G multiply-adds/s (checksum {:.3})",
        set.isa.name(),
        best * 1e3 / tokens as f64,
        macs / best / 1e9,
        out.iter().map(|&v| v as f64).sum::<f64>()
    );
}
