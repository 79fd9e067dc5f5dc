//! Attention of one query head over a paged f16 KV cache, as llama.cpp's CPU backend
//! computes it with its default f16 cache and flash attention off: the query and the
//! probabilities rounded to f16 before their products with the cache, scores by
//! [`dot_f16`], ggml's [`softmax`], and the V rows summed by [`weighted_rows_f16`], all in
//! the [`F16Order`] of the kernel llama.cpp picks for the token's micro-batch.

use std::cell::RefCell;

use half::f16;

use super::f16::{round_to_f16, scores_f16, weighted_rows_f16};
use super::softmax::softmax;
use crate::order::{F16Order, Flavor};

/// How to compute: ggml's flavor, llama.cpp's f16 kernel order, and the score scale.
#[derive(Clone, Copy, Debug)]
pub struct AttnParams {
    pub flavor: Flavor,
    pub order: F16Order,
    /// Multiplies each `q · k` before the soft-max.
    pub kq_scale: f32,
}

impl AttnParams {
    /// The order llama.cpp uses for a token of a micro-batch of `ubatch_len` tokens: its
    /// tiled GEMM for two or more, `ggml_vec_dot_f16` for one.
    pub fn order_for(ubatch_len: usize) -> F16Order {
        if ubatch_len == 1 {
            F16Order::VecDot
        } else {
            F16Order::Gemm
        }
    }
}

/// One KV head's rows in a layer's f16 cache: K of slot `s` is
/// `k[s * k_stride + k_off..][..q.len()]`, V is `v[s * v_stride + v_off..][..out.len()]`.
#[derive(Clone, Copy, Debug)]
pub struct KvHead<'a> {
    pub k: &'a [f16],
    pub v: &'a [f16],
    pub k_stride: usize,
    pub v_stride: usize,
    pub k_off: usize,
    pub v_off: usize,
}

thread_local! {
    static SCRATCH: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// `out = softmax(q · K[slots] * kq_scale) · V[slots]` for one query head, where slot
/// `slots[i]` holds KV cell `first_cell + i` (the cells before `first_cell` are masked,
/// e.g. by a sliding window). Allocates nothing after the first call on a thread.
pub fn attend_head(
    p: &AttnParams,
    q: &[f32],
    kv: &KvHead<'_>,
    slots: &[usize],
    first_cell: usize,
    out: &mut [f32],
) {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        let (scores, q16) = &mut *s;
        q16.clear();
        q16.extend_from_slice(q);
        round_to_f16(q16);
        scores_f16(
            p.flavor,
            p.order,
            q16,
            kv.k,
            slots,
            kv.k_stride,
            kv.k_off,
            p.kq_scale,
            scores,
        );
        softmax(p.flavor, scores, first_cell);
        round_to_f16(scores);
        weighted_rows_f16(
            p.flavor,
            p.order,
            out,
            scores,
            kv.v,
            slots,
            kv.v_stride,
            kv.v_off,
            first_cell,
        );
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a plain f64 computation of the same rounded operands.
    #[test]
    fn attends_like_the_formula() {
        let (hk, hv, n_slots) = (16, 8, 21);
        let k: Vec<f16> = (0..n_slots * hk * 2)
            .map(|i| f16::from_f32(((i * 13) % 7) as f32 * 0.25 - 0.7))
            .collect();
        let v: Vec<f16> = (0..n_slots * hv * 2)
            .map(|i| f16::from_f32(((i * 5) % 11) as f32 * 0.1 - 0.5))
            .collect();
        let q: Vec<f32> = (0..hk).map(|i| (i as f32 * 0.3).sin()).collect();
        let kv = KvHead {
            k: &k,
            v: &v,
            k_stride: 2 * hk,
            v_stride: 2 * hv,
            k_off: hk,
            v_off: hv,
        };
        let slots: Vec<usize> = (0..n_slots).rev().collect();
        for order in [F16Order::Gemm, F16Order::VecDot] {
            let p = AttnParams {
                flavor: Flavor::Avx2,
                order,
                kq_scale: 0.25,
            };
            let mut out = vec![0.0; hv];
            attend_head(&p, &q, &kv, &slots, 3, &mut out);
            let sc: Vec<f64> = slots
                .iter()
                .map(|&s| {
                    (0..hk)
                        .map(|d| f16::from_f32(q[d]).to_f64() * k[s * 2 * hk + hk + d].to_f64())
                        .sum::<f64>()
                        * 0.25
                })
                .collect();
            let m = sc.iter().cloned().fold(f64::MIN, f64::max);
            let z: f64 = sc.iter().map(|x| (x - m).exp()).sum();
            for (d, &o) in out.iter().enumerate() {
                let want: f64 = slots
                    .iter()
                    .zip(&sc)
                    .map(|(&s, x)| (x - m).exp() / z * v[s * 2 * hv + hv + d].to_f64())
                    .sum();
                assert!(
                    (o as f64 - want).abs() < 2e-3,
                    "{order:?} {d}: {o} vs {want}"
                );
            }
        }
    }
}
