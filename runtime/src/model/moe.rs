//! The mixture-of-experts feed-forward block on the CPU: the router picks each token's
//! experts and their weights, then every expert multiplies the tokens routed to it, one
//! product per expert over its tokens, all experts' gate and up products in one pool
//! dispatch and all their down products in a second. A decoded token reads only its
//! chosen experts' rows, and the pool's threads share every expert's rows, so decode and
//! prefill both use every core.
//!
//! Numerics follow llama.cpp's CPU graph (`build_moe_ffn`): the router product, ggml's
//! soft-max, a descending sort for the top `n_used`, the weights normalised by their sum
//! (clamped at 2^-14) in f64 where ggml sums in f64; each expert's products run per token
//! in the one-row kernel order (ggml's `mul_mat_id` multiplies row by row, with `gemv`
//! for repacked weights), then each expert's output is scaled by its weight and the
//! outputs are added in the order the experts were chosen.

use quant::ops::softmax::softmax_row;
use quant::order::flavor;

use super::cpu::{activate, add_bias};
use super::spec::{Gating, MoeSpec};
use super::weights::{FfnW, GateUp};
use super::{trace, Model, Workspace};
use crate::matmul::{matmul, matmul_jobs, Job, UbPos};
use crate::pool::ThreadPool;
use crate::weights::Linear;

/// One layer's mixture: router, experts, declaration.
pub(super) struct MoeLayer<'a> {
    pub router: &'a Linear,
    pub router_b: Option<&'a [f32]>,
    pub experts: &'a FfnW<Linear, Vec<f32>>,
    pub spec: &'a MoeSpec,
}

/// Buffers of the step, kept between calls.
#[derive(Default)]
pub struct MoeScratch {
    /// Router logits (then probabilities), `n_tok x n_expert`.
    logits: Vec<f32>,
    /// Each token's chosen experts and weights, `n_tok x n_used`, in choice order.
    chosen: Vec<(u32, f32)>,
    /// The (token, choice) pairs grouped by expert: indices into `chosen`.
    rows: Vec<u32>,
    /// Where each expert's rows start in `rows` (`n_expert + 1`).
    starts: Vec<usize>,
    /// The input rows in `rows` order, where an expert takes several.
    xg: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
    /// One-row places for every product row.
    ub: Vec<UbPos>,
    /// Scratch of a choice's experts and weights.
    idx: Vec<u32>,
    w: Vec<f32>,
    /// Each expert's next free row while grouping; each (token, choice)'s row.
    next: Vec<usize>,
    at: Vec<usize>,
}

/// Traces `rows` (one `width`-row per (token, choice), grouped by expert; `at` maps each
/// (token, choice) to its row) in llama.cpp's layout, token by token and choice by choice.
fn trace_choices(
    trace: &mut Option<super::TraceFn>,
    at: &[usize],
    name: &str,
    il: usize,
    rows: &[f32],
    width: usize,
) {
    if let Some(f) = trace.as_mut() {
        let v: Vec<f32> = at
            .iter()
            .flat_map(|&r| rows[r * width..(r + 1) * width].iter().copied())
            .collect();
        f(name, il, &v);
    }
}

/// The top `k` indices of `v` by value, largest first (ties: the lower index first).
fn top_k(v: &[f32], k: usize, out: &mut Vec<u32>) {
    out.clear();
    out.extend(0..v.len() as u32);
    let cmp = |a: &u32, b: &u32| {
        v[*b as usize]
            .partial_cmp(&v[*a as usize])
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(b))
    };
    if k < out.len() {
        out.select_nth_unstable_by(k, cmp);
        out.truncate(k);
    }
    out.sort_by(cmp);
}

/// Routes every token: `s.chosen[t * n_used + j]` = (expert, weight) of its `j`-th choice.
fn route(
    spec: &MoeSpec,
    logits: &mut [f32],
    chosen: &mut Vec<(u32, f32)>,
    idx: &mut Vec<u32>,
    w: &mut Vec<f32>,
) {
    let (ne, nu) = (spec.n_expert, spec.n_used);
    let fl = flavor();
    chosen.clear();
    for row in logits.chunks_exact_mut(ne) {
        match spec.gating {
            Gating::Softmax => {
                softmax_row(fl, row);
                top_k(row, nu, idx);
                w.clear();
                w.extend(idx.iter().map(|&e| row[e as usize]));
            }
            Gating::SoftmaxOfTopK => {
                top_k(row, nu, idx);
                w.clear();
                w.extend(idx.iter().map(|&e| row[e as usize]));
                softmax_row(fl, w);
            }
        }
        if spec.norm_weights {
            let sum = w.iter().map(|&v| v as f64).sum::<f64>() as f32;
            let sum = sum.max(6.103_515_6e-5);
            w.iter_mut().for_each(|v| *v /= sum);
        }
        if spec.weight_scale != 0.0 && spec.weight_scale != 1.0 {
            w.iter_mut().for_each(|v| *v *= spec.weight_scale);
        }
        chosen.extend(idx.iter().zip(w.iter()).map(|(&e, &v)| (e, v)));
    }
}

/// The block for the `n_tok` rows of `ws.xn` (their places `ub`), into `ws.proj`.
pub(super) fn moe_ffn(
    model: &Model,
    m: &MoeLayer<'_>,
    ub: &[UbPos],
    ws: &mut Workspace,
    pool: &ThreadPool,
    il: usize,
    n_tok: usize,
) {
    let store = &model.store;
    let d = model.config.n_embd;
    let (ne, nu, nf) = (m.spec.n_expert, m.spec.n_used, m.spec.n_ff);
    let s = &mut ws.moe;

    // Router.
    s.logits.resize(n_tok * ne, 0.0);
    matmul(
        pool,
        &store.mat(m.router, 0),
        &ws.xn[..n_tok * d],
        ub,
        &mut ws.xq,
        &mut s.logits,
    );
    add_bias(&mut s.logits, m.router_b);
    if let Some(f) = ws.trace.as_mut() {
        let name = match m.router_b {
            Some(_) => "ffn_moe_logits_biased",
            None => "ffn_moe_logits",
        };
        f(name, il, &ws.moe.logits);
    }
    let s = &mut ws.moe;
    route(m.spec, &mut s.logits, &mut s.chosen, &mut s.idx, &mut s.w);
    if let Some(f) = ws.trace.as_mut() {
        let w: Vec<f32> = ws.moe.chosen.iter().map(|c| c.1).collect();
        f("ffn_moe_weights", il, &w);
    }
    let s = &mut ws.moe;

    // Group the (token, choice) pairs by expert, in token order within each.
    s.starts.clear();
    s.starts.resize(ne + 1, 0);
    for &(e, _) in &s.chosen {
        s.starts[e as usize + 1] += 1;
    }
    for e in 0..ne {
        s.starts[e + 1] += s.starts[e];
    }
    s.rows.clear();
    s.rows.resize(s.chosen.len(), 0);
    s.next.clear();
    s.next.extend_from_slice(&s.starts);
    for (i, &(e, _)) in s.chosen.iter().enumerate() {
        s.rows[s.next[e as usize]] = i as u32;
        s.next[e as usize] += 1;
    }
    let n_rows = s.rows.len();
    s.at.clear();
    s.at.resize(s.chosen.len(), 0);
    for (r, &i) in s.rows.iter().enumerate() {
        s.at[i as usize] = r;
    }
    // An expert with one token reads that token's row in place (so all the experts of a
    // decoded token share its quantized activations); several are gathered.
    s.xg.resize(n_rows * d, 0.0);
    for (r, &i) in s.rows.iter().enumerate() {
        let t = i as usize / nu;
        s.xg[r * d..(r + 1) * d].copy_from_slice(&ws.xn[t * d..(t + 1) * d]);
    }
    s.ub.clear();
    s.ub.resize(n_rows, UbPos { n: 1, i: 0 });
    s.gate.resize(n_rows * nf, 0.0);
    s.up.resize(n_rows * nf, 0.0);
    s.down.resize(n_rows * d, 0.0);

    let GateUp::Split { gate, up } = &m.experts.gate_up else {
        unreachable!("experts are bound as separate gate and up stacks")
    };
    {
        let (xg, xn) = (&s.xg, &ws.xn);
        let mut jobs: Vec<Job<'_, '_>> = Vec::with_capacity(2 * ne.min(n_rows));
        let mut gs: &mut [f32] = &mut s.gate;
        let mut us: &mut [f32] = &mut s.up;
        for e in 0..ne {
            let (r0, r1) = (s.starts[e], s.starts[e + 1]);
            if r0 == r1 {
                continue;
            }
            let x = if r1 - r0 == 1 {
                let t = s.rows[r0] as usize / nu;
                &xn[t * d..(t + 1) * d]
            } else {
                &xg[r0 * d..r1 * d]
            };
            let (g, rest) = std::mem::take(&mut gs).split_at_mut((r1 - r0) * nf);
            gs = rest;
            let (u, rest) = std::mem::take(&mut us).split_at_mut((r1 - r0) * nf);
            us = rest;
            let ub = &s.ub[r0..r1];
            jobs.push(Job {
                w: store.mat(gate, e),
                x,
                ub,
                y: g,
            });
            jobs.push(Job {
                w: store.mat(up, e),
                x,
                ub,
                y: u,
            });
        }
        matmul_jobs(pool, &mut jobs, &mut ws.xq);
    }
    // Per-expert biases, then the activation over every row.
    let (bg, bu) = (m.experts.b_gate.as_deref(), m.experts.b_up.as_deref());
    if bg.is_some() || bu.is_some() {
        for (r, &i) in s.rows.iter().enumerate() {
            let e = s.chosen[i as usize].0 as usize;
            if let Some(b) = bg {
                add_bias(
                    &mut s.gate[r * nf..(r + 1) * nf],
                    Some(&b[e * nf..(e + 1) * nf]),
                );
            }
            if let Some(b) = bu {
                add_bias(
                    &mut s.up[r * nf..(r + 1) * nf],
                    Some(&b[e * nf..(e + 1) * nf]),
                );
            }
        }
    }
    trace_choices(&mut ws.trace, &s.at, "ffn_moe_gate_biased", il, &s.gate, nf);
    trace_choices(&mut ws.trace, &s.at, "ffn_moe_up_biased", il, &s.up, nf);
    activate(model, pool, m.spec.act, &mut s.gate, &s.up, nf);
    trace_choices(&mut ws.trace, &s.at, "ffn_moe_swiglu_oai", il, &s.gate, nf);
    {
        let mut jobs: Vec<Job<'_, '_>> = Vec::with_capacity(ne.min(n_rows));
        let mut ds: &mut [f32] = &mut s.down;
        for e in 0..ne {
            let (r0, r1) = (s.starts[e], s.starts[e + 1]);
            if r0 == r1 {
                continue;
            }
            let (o, rest) = std::mem::take(&mut ds).split_at_mut((r1 - r0) * d);
            ds = rest;
            jobs.push(Job {
                w: store.mat(&m.experts.down, e),
                x: &s.gate[r0 * nf..r1 * nf],
                ub: &s.ub[r0..r1],
                y: o,
            });
        }
        matmul_jobs(pool, &mut jobs, &mut ws.xq);
    }
    // Each output row scaled by its weight (after its bias), then added per token in
    // choice order.
    if let Some(b) = m.experts.b_down.as_deref() {
        for (r, &i) in s.rows.iter().enumerate() {
            let e = s.chosen[i as usize].0 as usize;
            add_bias(
                &mut s.down[r * d..(r + 1) * d],
                Some(&b[e * d..(e + 1) * d]),
            );
        }
    }
    trace_choices(&mut ws.trace, &s.at, "ffn_moe_down_biased", il, &s.down, d);
    for (r, &i) in s.rows.iter().enumerate() {
        let w = s.chosen[i as usize].1;
        s.down[r * d..(r + 1) * d].iter_mut().for_each(|v| *v *= w);
    }
    trace_choices(&mut ws.trace, &s.at, "ffn_moe_weighted", il, &s.down, d);
    ws.proj.resize(n_tok * d, 0.0);
    for t in 0..n_tok {
        let out = &mut ws.proj[t * d..(t + 1) * d];
        let first = s.at[t * nu];
        out.copy_from_slice(&s.down[first * d..(first + 1) * d]);
        for j in 1..nu {
            let r = s.at[t * nu + j];
            out.iter_mut()
                .zip(&s.down[r * d..(r + 1) * d])
                .for_each(|(o, v)| *o += v);
        }
    }
    trace!(ws, "ffn_moe_out", il, proj);
}
