//! The CPU executor: one layer of a batch, as its [`LayerSpec`] declares it, on our
//! kernels. Every step reads the declaration (a feature is a field there), never the
//! architecture, so a new architecture that combines known features runs here unchanged.

use quant::ops::act::swiglu;
use quant::ops::norm::{rms_norm, rms_norm_rows};
use quant::order::flavor;

use super::attention::{attention, AttnShape, AttnTokens};
use super::spec::{Act, FfnSpec, LayerSpec};
use super::weights::{FfnKind, FfnW, GateUp, LayerW, Qkv};
use super::{moe, trace, Model, Workspace};
use crate::kv::KvCache;
use crate::matmul::{matmul, matmul_many, UbPos};
use crate::pool::{SharedMut, ThreadPool};
use crate::weights::{Linear, WeightStore};

thread_local! {
    /// One token's RoPE angles (cos/sin), per thread: the RoPE step runs on the pool.
    static ROPE_CACHE: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Rows per pool task, at least, for the row-wise steps of a forward pass.
const ROWS_PER_TASK: usize = 4;

/// `f(r, row)` for each `width`-element row `r` of `data`, the rows split over the pool
/// (each row's result is its own, whichever task runs it).
pub(super) fn rows_par(
    pool: &ThreadPool,
    data: &mut [f32],
    width: usize,
    f: &(dyn Fn(usize, &mut [f32]) + Sync),
) {
    debug_assert_eq!(data.len() % width, 0);
    let n = data.len() / width;
    let rows = SharedMut::new(data);
    pool.run_rows(n, ROWS_PER_TASK, &|r0, r1| {
        // SAFETY: the row ranges of the tasks are disjoint.
        let chunk = unsafe { rows.slice(r0 * width, (r1 - r0) * width) };
        for (r, row) in (r0..).zip(chunk.chunks_exact_mut(width)) {
            f(r, row);
        }
    });
}

/// [`rms_norm_rows`] with the rows split over the pool.
fn rms_norm_rows_par(pool: &ThreadPool, dst: &mut [f32], src: &[f32], w: &[f32], eps: f32) {
    let d = w.len();
    rows_par(pool, dst, d, &|r, row| {
        rms_norm_rows(row, &src[r * d..(r + 1) * d], w, eps)
    });
}

/// Adds `b` to every row of `x`.
pub(super) fn add_bias(x: &mut [f32], b: Option<&[f32]>) {
    if let Some(b) = b {
        for row in x.chunks_exact_mut(b.len()) {
            row.iter_mut().zip(b).for_each(|(v, bb)| *v += bb);
        }
    }
}

/// Copies the columns `[c0, c0 + w)` of the `n`-row matrix `src` (rows of `width`) into
/// `dst` (`n x w`): the parts of a fused product.
fn split_cols(src: &[f32], width: usize, c0: usize, w: usize, dst: &mut Vec<f32>) {
    let n = src.len() / width;
    dst.resize(n * w, 0.0);
    for (d, s) in dst.chunks_exact_mut(w).zip(src.chunks_exact(width)) {
        d.copy_from_slice(&s[c0..c0 + w]);
    }
}

/// The gated activation in place: `gate = act(gate, up)` row by row (rows of `nf`).
pub(super) fn activate(
    model: &Model,
    pool: &ThreadPool,
    act: Act,
    gate: &mut [f32],
    up: &[f32],
    nf: usize,
) {
    match act {
        Act::Silu => {
            let fl = flavor();
            rows_par(pool, gate, nf, &|t, g| {
                swiglu(fl, g, &up[t * nf..(t + 1) * nf])
            })
        }
        Act::Gelu => {
            let gelu = &model.gelu;
            rows_par(pool, gate, nf, &|t, g| {
                gelu.geglu(g, &up[t * nf..(t + 1) * nf])
            })
        }
        Act::SwigluOai { alpha, limit } => rows_par(pool, gate, nf, &|t, g| {
            swiglu_oai(g, &up[t * nf..(t + 1) * nf], alpha, limit)
        }),
    }
}

/// gpt-oss's clamped SwiGLU as ggml computes it (`ggml_swiglu_oai`): the gate clamped
/// above at `limit`, the linear part to `[-limit, limit]`, `g / (1 + exp(-alpha g)) * (u + 1)`
/// with libm's `expf`.
pub(super) fn swiglu_oai(g: &mut [f32], u: &[f32], alpha: f32, limit: f32) {
    for (x, &y) in g.iter_mut().zip(u) {
        let xg = x.min(limit);
        let yl = y.clamp(-limit, limit);
        let glu = xg / (1.0 + (alpha * -xg).exp());
        *x = glu * (yl + 1.0);
    }
}

/// The products of a dense feed-forward block (`w`, from `xn` to `out`, rows `ub`): gate
/// and up (two matrices sharing their input, or one fused), biases, the activation,
/// down. `act_name` and the traces follow llama.cpp's graph names.
#[allow(clippy::too_many_arguments)]
pub(super) fn dense_ffn(
    model: &Model,
    store: &WeightStore,
    w: &FfnW<Linear, Vec<f32>>,
    act: Act,
    n_ff: usize,
    ub: &[UbPos],
    ws: &mut Workspace,
    pool: &ThreadPool,
    il: usize,
    n_tok: usize,
) {
    let d = model.config.n_embd;
    ws.gate.resize(n_tok * n_ff, 0.0);
    ws.up.resize(n_tok * n_ff, 0.0);
    match &w.gate_up {
        GateUp::Split { gate, up } => matmul_many(
            pool,
            &[store.mat(gate, 0), store.mat(up, 0)],
            &ws.xn[..n_tok * d],
            ub,
            &mut ws.xq,
            &mut [&mut ws.gate, &mut ws.up],
        ),
        GateUp::Fused(m) => {
            ws.fused.resize(n_tok * 2 * n_ff, 0.0);
            matmul(
                pool,
                &store.mat(m, 0),
                &ws.xn[..n_tok * d],
                ub,
                &mut ws.xq,
                &mut ws.fused,
            );
            split_cols(&ws.fused, 2 * n_ff, 0, n_ff, &mut ws.gate);
            split_cols(&ws.fused, 2 * n_ff, n_ff, n_ff, &mut ws.up);
        }
    }
    add_bias(&mut ws.gate, w.b_gate.as_deref());
    add_bias(&mut ws.up, w.b_up.as_deref());
    trace!(ws, "ffn_gate", il, gate);
    trace!(ws, "ffn_up", il, up);
    activate(model, pool, act, &mut ws.gate, &ws.up, n_ff);
    trace!(ws, "ffn_act", il, gate);
    ws.proj.resize(n_tok * d, 0.0);
    matmul(
        pool,
        &store.mat(&w.down, 0),
        &ws.gate,
        ub,
        &mut ws.xq,
        &mut ws.proj,
    );
    add_bias(&mut ws.proj, w.b_down.as_deref());
}

/// Keeps the rows whose logits were asked for (`ws.out_rows`) of the hidden state, in
/// order: where llama.cpp's graph selects its output rows (`inp_out_ids`).
pub(super) fn keep_out_rows(ws: &mut Workspace, d: usize) {
    for (i, &r) in ws.out_rows.iter().enumerate() {
        ws.x.copy_within(r * d..(r + 1) * d, i * d);
    }
    ws.x.truncate(ws.out_rows.len() * d);
}

/// Layer `il` for the `n_tok` tokens of the batch in `ws.x`.
pub(super) fn layer_forward(
    model: &Model,
    il: usize,
    n_tok: usize,
    kv: &mut KvCache,
    ws: &mut Workspace,
    pool: &ThreadPool,
) {
    let c = &model.config;
    let spec: &LayerSpec = &model.spec.layers[il];
    let l: &LayerW<Linear, Vec<f32>> = &model.layers[il];
    let store = &model.store;
    let a = &spec.attn;
    let d = c.n_embd;
    let (hk, hv) = (c.head_dim_k, c.head_dim_v);
    let q_dim = c.n_head * hk;
    let k_dim = c.n_head_kv * hk;
    let v_dim = c.n_head_kv * hv;

    ws.xn.resize(n_tok * d, 0.0);
    rms_norm_rows_par(pool, &mut ws.xn, &ws.x, &l.attn_norm, c.rms_eps);
    trace!(ws, "attn_norm", il, xn);
    ws.q.resize(n_tok * q_dim, 0.0);
    ws.k.resize(n_tok * k_dim, 0.0);
    ws.v.resize(n_tok * v_dim, 0.0);
    match &l.qkv {
        // Q, K and V share their input: one quantization per kernel choice, one dispatch.
        Qkv::Split { q, k, v } => matmul_many(
            pool,
            &[store.mat(q, 0), store.mat(k, 0), store.mat(v, 0)],
            &ws.xn,
            &ws.tok_ub,
            &mut ws.xq,
            &mut [&mut ws.q, &mut ws.k, &mut ws.v],
        ),
        Qkv::Fused(m) => {
            let w = q_dim + k_dim + v_dim;
            ws.fused.resize(n_tok * w, 0.0);
            matmul(
                pool,
                &store.mat(m, 0),
                &ws.xn,
                &ws.tok_ub,
                &mut ws.xq,
                &mut ws.fused,
            );
            split_cols(&ws.fused, w, 0, q_dim, &mut ws.q);
            split_cols(&ws.fused, w, q_dim, k_dim, &mut ws.k);
            split_cols(&ws.fused, w, q_dim + k_dim, v_dim, &mut ws.v);
        }
    }
    add_bias(&mut ws.q, l.b_qkv[0].as_deref());
    add_bias(&mut ws.k, l.b_qkv[1].as_deref());
    add_bias(&mut ws.v, l.b_qkv[2].as_deref());
    trace!(ws, "Qcur", il, q);
    trace!(ws, "Kcur", il, k);
    trace!(ws, "Vcur", il, v);

    // Per token: the Q/K norms, RoPE and the query scale (tokens split over the pool),
    // then its K and V into the cache.
    let (qs, ks) = (SharedMut::new(&mut ws.q), SharedMut::new(&mut ws.k));
    let tok_pos = &ws.tok_pos;
    pool.run_rows(n_tok, ROWS_PER_TASK, &|t0, t1| {
        ROPE_CACHE.with(|rc| {
            let mut rope_cache = rc.borrow_mut();
            rope_cache.resize(c.n_rot.max(2), 0.0);
            // SAFETY: the row ranges of the tasks are disjoint.
            let (q, k) = unsafe {
                (
                    qs.slice(t0 * q_dim, (t1 - t0) * q_dim),
                    ks.slice(t0 * k_dim, (t1 - t0) * k_dim),
                )
            };
            for (t, (q, k)) in
                (t0..t1).zip(q.chunks_exact_mut(q_dim).zip(k.chunks_exact_mut(k_dim)))
            {
                if let Some(r) = &a.rope {
                    r.cache(tok_pos[t], &mut rope_cache);
                }
                for qh in q.chunks_exact_mut(hk) {
                    if let Some(w) = &l.q_norm {
                        rms_norm(qh, w, c.rms_eps);
                    }
                    if let Some(r) = &a.rope {
                        r.apply(qh, &rope_cache);
                    }
                    if let Some(s) = a.q_scale {
                        qh.iter_mut().for_each(|v| *v *= s);
                    }
                }
                for kh in k.chunks_exact_mut(hk) {
                    if let Some(w) = &l.k_norm {
                        rms_norm(kh, w, c.rms_eps);
                    }
                    if let Some(r) = &a.rope {
                        r.apply(kh, &rope_cache);
                    }
                }
            }
        });
    });
    for t in 0..n_tok {
        let pos = ws.tok_pos[t];
        let slot = ws.seq_slots[ws.tok_seq[t]][pos];
        kv.write(
            il,
            slot,
            &ws.k[t * k_dim..(t + 1) * k_dim],
            &ws.v[t * v_dim..(t + 1) * v_dim],
        );
    }

    trace!(ws, "Qrope", il, q);
    trace!(ws, "Krope", il, k);
    let shape = AttnShape {
        n_head: c.n_head,
        n_head_kv: c.n_head_kv,
        head_dim_k: hk,
        head_dim_v: hv,
        window: a.window,
        kq_scale: a.kq_scale,
        softcap: a.softcap,
        sinks: l.sinks.as_deref(),
    };
    let (kc, vc) = kv.layer(il);
    ws.attn.resize(n_tok * c.n_head * hv, 0.0);
    let tokens = AttnTokens {
        q: &ws.q,
        pos: &ws.tok_pos,
        seq: &ws.tok_seq,
        ub: &ws.tok_ub,
        seq_slots: &ws.seq_slots,
    };
    attention(pool, &shape, &tokens, kc, vc, &mut ws.attn);

    ws.proj.resize(n_tok * d, 0.0);
    trace!(ws, "kqv_out", il, attn);
    matmul(
        pool,
        &store.mat(&l.wo, 0),
        &ws.attn,
        &ws.tok_ub,
        &mut ws.xq,
        &mut ws.proj,
    );
    add_bias(&mut ws.proj, l.b_o.as_deref());
    trace!(ws, "wo_out", il, proj);
    // Like llama.cpp (its `inp_out_ids`), the last layer goes on with the rows whose
    // logits were asked for only, which also sets its kernels' micro-batch; unless the
    // architecture's graph keeps every row to the end (then `forward` selects them).
    let last = il + 1 == model.layers.len() && model.spec.out_rows_after_last_attn;
    let n_tok = if last {
        for (i, &r) in ws.out_rows.iter().enumerate() {
            ws.x.copy_within(r * d..(r + 1) * d, i * d);
            ws.proj.copy_within(r * d..(r + 1) * d, i * d);
        }
        let n_out = ws.out_rows.len();
        ws.x.truncate(n_out * d);
        ws.proj.truncate(n_out * d);
        ws.xn.truncate(n_out * d);
        n_out
    } else {
        n_tok
    };
    // The rows' places: the tokens', or those of the output rows alone.
    let ffn_ub = std::mem::take(if last { &mut ws.out_ub } else { &mut ws.tok_ub });
    if let Some(w) = &l.post_attn_norm {
        rows_par(pool, &mut ws.proj[..n_tok * d], d, &|_, r| {
            rms_norm(r, w, c.rms_eps)
        });
        trace!(ws, "attn_post_norm", il, proj);
    }
    ws.x.iter_mut().zip(&ws.proj).for_each(|(x, p)| *x += p);
    trace!(ws, "ffn_inp", il, x);

    // Feed-forward.
    rms_norm_rows_par(pool, &mut ws.xn[..n_tok * d], &ws.x, &l.ffn_norm, c.rms_eps);
    trace!(ws, "ffn_norm", il, xn);
    match (&l.ffn, &spec.ffn) {
        (FfnKind::Dense(w), FfnSpec::Dense { n_ff, act }) => {
            dense_ffn(model, store, w, *act, *n_ff, &ffn_ub, ws, pool, il, n_tok)
        }
        (
            FfnKind::Moe {
                router,
                router_b,
                experts,
            },
            FfnSpec::Moe(m),
        ) => moe::moe_ffn(
            model,
            &moe::MoeLayer {
                router,
                router_b: router_b.as_deref(),
                experts,
                spec: m,
            },
            &ffn_ub,
            ws,
            pool,
            il,
            n_tok,
        ),
        _ => unreachable!("bound from the same declaration"),
    }
    if last {
        ws.out_ub = ffn_ub;
    } else {
        ws.tok_ub = ffn_ub;
    }
    trace!(ws, "ffn_out", il, proj);
    if let Some(w) = &l.post_ffn_norm {
        rows_par(pool, &mut ws.proj[..n_tok * d], d, &|_, r| {
            rms_norm(r, w, c.rms_eps)
        });
        trace!(ws, "ffn_post_norm", il, proj);
    }
    ws.x.iter_mut().zip(&ws.proj).for_each(|(x, p)| *x += p);
    trace!(ws, "l_out", il, x);
}
