//! The attention step of one layer for a whole batch: one pool task per (token, query
//! head), each attending over its own sequence's KV slots with
//! [`quant::ops::attention::attend_head`]. A token reads only its sequence's slots, so
//! its result never depends on the other sequences of the batch.

use half::f16;
use quant::ops::attention::{attend_head, AttnParams, KvHead};
use quant::order::flavor;

use crate::matmul::UbPos;
use crate::pool::{SharedMut, ThreadPool};

/// The head geometry and scoring of one layer.
#[derive(Clone, Copy, Debug)]
pub(super) struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    /// Sliding window in positions (0 = none): a token at `pos` sees `pos + 1 - window..`.
    pub window: usize,
    pub kq_scale: f32,
}

/// Where each token of the batch stands.
pub(super) struct AttnTokens<'a> {
    /// Queries after RoPE, `n_tok x (n_head * head_dim_k)`.
    pub q: &'a [f32],
    pub pos: &'a [usize],
    /// Index into `seq_slots` per token.
    pub seq: &'a [usize],
    /// Each token's place in llama.cpp's micro-batch (picks the f16 product order).
    pub ub: &'a [UbPos],
    /// Each sequence's KV slot per position.
    pub seq_slots: &'a [Vec<usize>],
}

/// `out[t][h] = attention of token t's query head h` (`n_tok x (n_head * head_dim_v)`)
/// over the layer's f16 caches `k_cache` / `v_cache` (one row of all KV heads per slot).
pub(super) fn attention(
    pool: &ThreadPool,
    s: &AttnShape,
    tok: &AttnTokens<'_>,
    k_cache: &[f16],
    v_cache: &[f16],
    out: &mut [f32],
) {
    let (hk, hv) = (s.head_dim_k, s.head_dim_v);
    let q_dim = s.n_head * hk;
    let (k_dim, v_dim) = (s.n_head_kv * hk, s.n_head_kv * hv);
    let group = s.n_head / s.n_head_kv;
    let n_tok = tok.pos.len();
    debug_assert_eq!(out.len(), n_tok * s.n_head * hv);
    let fl = flavor();
    let out = SharedMut::new(out);
    pool.run(n_tok * s.n_head, &|task| {
        let (t, h) = (task / s.n_head, task % s.n_head);
        let g = h / group;
        let pos = tok.pos[t];
        let first = if s.window > 0 {
            (pos + 1).saturating_sub(s.window)
        } else {
            0
        };
        let slots = &tok.seq_slots[tok.seq[t]][first..=pos];
        let qh = &tok.q[t * q_dim + h * hk..t * q_dim + (h + 1) * hk];
        // SAFETY: each task writes its own (token, head) output row.
        let o = unsafe { out.slice((t * s.n_head + h) * hv, hv) };
        let p = AttnParams {
            flavor: fl,
            // llama.cpp multiplies f16 operands with its tiled GEMM when the micro-batch
            // has several tokens and with vec_dot_f16 for one: the same order per token.
            order: AttnParams::order_for(tok.ub[t].n as usize),
            kq_scale: s.kq_scale,
        };
        let kv = KvHead {
            k: k_cache,
            v: v_cache,
            k_stride: k_dim,
            v_stride: v_dim,
            k_off: g * hk,
            v_off: g * hv,
        };
        attend_head(&p, qh, &kv, slots, first, o);
    });
}
