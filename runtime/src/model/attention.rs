//! The attention step of one layer for a whole batch: in decode all heads of the token
//! together ([`quant::ops::attention::attend_heads`], pool tasks per KV group and block
//! of cells), in prefill one per KV head and tile of
//! a few consecutive tokens ([`quant::ops::attention::attend_tile`]), each attending over
//! its own sequence's KV slots. A token reads only its sequence's slots, so
//! its result never depends on the other sequences of the batch.

use half::f16;
use std::cell::RefCell;

use quant::ops::attention::{attend_heads, attend_tile, AttnParams, KvLayer};
use quant::order::flavor;

use crate::matmul::UbPos;
use crate::pool::{SharedMut, ThreadPool};

/// The head geometry and scoring of one layer.
#[derive(Clone, Copy, Debug)]
pub(super) struct AttnShape<'a> {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    /// Sliding window in positions (0 = none): a token at `pos` sees `pos + 1 - window..`.
    pub window: usize,
    pub kq_scale: f32,
    /// Soft-capping of the scores (Gemma 2).
    pub softcap: Option<f32>,
    /// One sink logit per query head (gpt-oss).
    pub sinks: Option<&'a [f32]>,
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
    s: &AttnShape<'_>,
    tok: &AttnTokens<'_>,
    k_cache: &[f16],
    v_cache: &[f16],
    out: &mut [f32],
) {
    let (hk, hv) = (s.head_dim_k, s.head_dim_v);
    let q_dim = s.n_head * hk;
    let group = s.n_head / s.n_head_kv;
    let n_tok = tok.pos.len();
    debug_assert_eq!(out.len(), n_tok * s.n_head * hv);
    let fl = flavor();
    let params = |t: usize| AttnParams {
        flavor: fl,
        // llama.cpp multiplies f16 operands with its tiled GEMM when the micro-batch has
        // several tokens and with vec_dot_f16 for one: the same order per token.
        order: AttnParams::order_for(tok.ub[t].n as usize),
        kq_scale: s.kq_scale,
        softcap: s.softcap,
        sink: None,
    };
    let kv = KvLayer {
        k: k_cache,
        v: v_cache,
        n_head_kv: s.n_head_kv,
        hk,
        hv,
    };
    let first = |t: usize| {
        let pos = tok.pos[t];
        if s.window > 0 {
            (pos + 1).saturating_sub(s.window)
        } else {
            0
        }
    };
    let out = SharedMut::new(out);
    if n_tok == 1 {
        // Decode: all heads of the token together (`attend_heads` splits them over the
        // pool by KV group and block of cells).
        let slots = &tok.seq_slots[tok.seq[0]][first(0)..=tok.pos[0]];
        // SAFETY: the only writer of `out` during this call.
        let o = unsafe { out.slice(0, s.n_head * hv) };
        let run = |n: usize, f: &(dyn Fn(usize) + Sync)| pool.run(n, f);
        attend_heads(
            &params(0),
            &run,
            &tok.q[..q_dim],
            s.n_head,
            &kv,
            slots,
            first(0),
            s.sinks,
            o,
        );
        return;
    }
    // Prefill: one task per KV head and tile of consecutive tokens of one sequence (and
    // one f16 order), all of the group's query heads together, so the tile reads each
    // cache row once for up to TILE_QUERIES queries (`attend_tile`).
    let per_tile = (TILE_QUERIES / group).max(1);
    let mut tiles: Vec<(usize, usize)> = Vec::with_capacity(n_tok.div_ceil(per_tile));
    let mut t0 = 0;
    for t in 1..=n_tok {
        if t == n_tok
            || t - t0 == per_tile
            || tok.seq[t] != tok.seq[t0]
            || params(t).order != params(t0).order
        {
            tiles.push((t0, t));
            t0 = t;
        }
    }
    pool.run(tiles.len() * s.n_head_kv, &|task| {
        let ((t0, t1), g) = (tiles[task / s.n_head_kv], task % s.n_head_kv);
        let m = (t1 - t0) * group;
        TILE_IO.with(|io| {
            let mut io = io.borrow_mut();
            let (qs, ranges, o, sinks) = &mut *io;
            qs.clear();
            ranges.clear();
            sinks.clear();
            for t in t0..t1 {
                let q = &tok.q[t * q_dim + g * group * hk..t * q_dim + (g + 1) * group * hk];
                qs.extend_from_slice(q);
                ranges.extend(std::iter::repeat_n((first(t), tok.pos[t]), group));
                if let Some(sk) = s.sinks {
                    sinks.extend_from_slice(&sk[g * group..(g + 1) * group]);
                }
            }
            o.clear();
            o.resize(m * hv, 0.0);
            attend_tile(
                &params(t0),
                qs,
                ranges,
                &kv.head(g),
                &tok.seq_slots[tok.seq[t0]],
                s.sinks.map(|_| &sinks[..]),
                o,
            );
            for (j, t) in (t0..t1).enumerate() {
                // SAFETY: the task writes the rows of its tokens' heads of KV head g only.
                let dst = unsafe { out.slice((t * s.n_head + g * group) * hv, group * hv) };
                dst.copy_from_slice(&o[j * group * hv..(j + 1) * group * hv]);
            }
        });
    });
}

/// Query heads a prefill task attends together (a KV group times a few tokens). Each tile
/// reads its cells' K and V rows once, so more queries per tile read the cache less often:
/// 32 against 16 took 7-10% off qwen2.5's attention at depth 4096 (`attn_prefill`, AVX2 and
/// AVX-512), and a 512-token prompt still makes 128 tiles per KV head.
const TILE_QUERIES: usize = 32;

/// A tile's gathered queries, their cell ranges, their outputs and their sinks.
type TileIo = (Vec<f32>, Vec<(usize, usize)>, Vec<f32>, Vec<f32>);

thread_local! {
    static TILE_IO: RefCell<TileIo> =
        const { RefCell::new((Vec::new(), Vec::new(), Vec::new(), Vec::new())) };
}
