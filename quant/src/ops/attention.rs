//! Attention of one query head over a paged f16 KV cache, as llama.cpp's CPU backend
//! computes it with its default f16 cache and flash attention off: the query and the
//! probabilities rounded to f16 before their products with the cache, scores by
//! [`dot_f16`], ggml's [`softmax`], and the V rows summed by [`weighted_rows_f16`], all in
//! the [`F16Order`] of the kernel llama.cpp picks for the token's micro-batch.

use std::cell::RefCell;

use half::f16;

use super::f16::{check_slots, round_to_f16, scores_f16, weighted_rows_f16};
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

/// Which x86 kernels a tile runs on.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug)]
enum TileKernel {
    /// AVX-512, the 16-lane flavor.
    Zmm,
    /// AVX2 registers, the 8-lane flavor.
    Ymm8,
    /// AVX2 registers, the 16-lane flavor (each chain in two halves).
    Ymm16,
}

#[cfg(target_arch = "x86_64")]
impl TileKernel {
    /// Whether these kernels compute GEMM-order tiles of `p`'s flavor with these head
    /// sizes, and the ISA level `isa` runs them.
    fn fits(self, p: &AttnParams, hk: usize, hv: usize, isa: crate::isa::Isa) -> bool {
        use crate::isa::Isa;
        let (flavor, level, hv_step) = match self {
            TileKernel::Zmm => (Flavor::Avx512, Isa::Avx512, 16),
            TileKernel::Ymm8 => (Flavor::Avx2, Isa::Avx2, 8),
            TileKernel::Ymm16 => (Flavor::Avx512, Isa::Avx2, 8),
        };
        p.order == F16Order::Gemm
            && p.flavor == flavor
            && isa.includes(level)
            && hk.is_multiple_of(flavor.lanes())
            && hv.is_multiple_of(hv_step)
    }

    /// The fastest kernels that fit on the active ISA level, if any.
    fn pick(p: &AttnParams, hk: usize, hv: usize) -> Option<TileKernel> {
        [TileKernel::Zmm, TileKernel::Ymm16, TileKernel::Ymm8]
            .into_iter()
            .find(|k| k.fits(p, hk, hv, crate::isa::active()))
    }
}

thread_local! {
    /// A tile's rounded queries, its score rows and its V partial sums.
    static TILE: RefCell<(Vec<f32>, Vec<f32>, Vec<f32>)> =
        const { RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// [`attend_head`] for several query heads that read the same KV head, each with its own
/// cells `ranges[i] = (first, last)` of one sequence whose cell `c` is held by
/// `slots[c]`: `out[i * hv..][..hv]` is query `qs[i * hk..][..hk]`'s attention, the same
/// bits as `attend_head(p, q_i, kv, &slots[first..=last], first, out_i)`.
///
/// Prefill gives each token's heads of a KV group, and the next few tokens, nearly the
/// same cells: with llama.cpp's GEMM order (`p.order`) on AVX2 or AVX-512 the tile reads
/// each key and V row once for two to four queries, the cost that bounds attention at
/// depth. The VecDot order, head sizes that are not whole registers and other ISAs take
/// one [`attend_head`] per query.
pub fn attend_tile(
    p: &AttnParams,
    qs: &[f32],
    ranges: &[(usize, usize)],
    kv: &KvHead<'_>,
    slots: &[usize],
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    let kernel = {
        let m = ranges.len().max(1);
        TileKernel::pick(p, qs.len() / m, out.len() / m)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let kernel = None;
    attend_tile_on(kernel, p, qs, ranges, kv, slots, out)
}

/// The kernels a tile runs on (`None`: one [`attend_head`] per query).
#[cfg(target_arch = "x86_64")]
type Kernel = Option<TileKernel>;
#[cfg(not(target_arch = "x86_64"))]
type Kernel = Option<std::convert::Infallible>;

/// [`attend_tile`] on the given kernels.
fn attend_tile_on(
    kernel: Kernel,
    p: &AttnParams,
    qs: &[f32],
    ranges: &[(usize, usize)],
    kv: &KvHead<'_>,
    slots: &[usize],
    out: &mut [f32],
) {
    let m = ranges.len();
    if m == 0 {
        return;
    }
    assert!(
        qs.len().is_multiple_of(m) && out.len().is_multiple_of(m),
        "attend_tile: one query and one output row per range"
    );
    let (hk, hv) = (qs.len() / m, out.len() / m);
    let lo = ranges.iter().map(|r| r.0).min().unwrap_or(0);
    let hi = ranges.iter().map(|r| r.1).max().unwrap_or(0);
    let (j0, j1) = (
        ranges.iter().map(|r| r.0).max().unwrap_or(0),
        ranges.iter().map(|r| r.1).min().unwrap_or(0),
    );
    assert!(
        ranges.iter().all(|&(f, l)| f <= l) && hi < slots.len(),
        "attend_tile: a range is empty or outside the sequence's cells"
    );
    #[cfg(target_arch = "x86_64")]
    if let Some(kernel) = kernel.filter(|_| j0 <= j1) {
        let cells = &slots[lo..=hi];
        check_slots("attend_tile", hk, kv.k, cells, kv.k_stride, kv.k_off);
        check_slots("attend_tile", hv, kv.v, cells, kv.v_stride, kv.v_off);
        TILE.with(|t| {
            let mut t = t.borrow_mut();
            let (q16, sc, parts) = &mut *t;
            q16.clear();
            q16.extend_from_slice(qs);
            round_to_f16(q16);
            let n = hi + 1 - lo;
            sc.clear();
            sc.resize(m * n, 0.0);
            let kp = kv.k.as_ptr().cast::<u16>();
            let vp = kv.v.as_ptr().cast::<u16>();
            // SAFETY: AVX-512 F is active; head sizes are whole registers; every row
            // read was bounds-checked above; `sc` holds m x n scores.
            unsafe {
                let key = |s: usize| kp.add(cells[s] * kv.k_stride + kv.k_off);
                use crate::arch::x86::attn::{scores_tile, scores_tile_avx2};
                match kernel {
                    TileKernel::Zmm => scores_tile(q16, m, hk, n, &key, p.kq_scale, sc),
                    TileKernel::Ymm8 => {
                        scores_tile_avx2::<1>(q16, m, hk, n, &key, p.kq_scale, sc)
                    }
                    TileKernel::Ymm16 => {
                        scores_tile_avx2::<2>(q16, m, hk, n, &key, p.kq_scale, sc)
                    }
                }
            }
            for (i, &(f, l)) in ranges.iter().enumerate() {
                let row = &mut sc[i * n + f - lo..=i * n + l - lo];
                softmax(p.flavor, row, f);
                round_to_f16(row);
            }
            // Partial sum `c` of query i (cells ≡ c mod P) at parts[(i * P + c) * hv..].
            let pl = p.flavor.lanes();
            parts.clear();
            parts.resize(m * pl * hv, 0.0);
            let v_row = |c: usize| &kv.v[slots[c] * kv.v_stride + kv.v_off..][..hv];
            // Each partial sum runs in cell order: the cells only some queries see
            // (before j0 and after j1) one query at a time, those all see four at a time.
            let alone = |parts: &mut [f32], i: usize, cells: std::ops::Range<usize>| {
                for c in cells {
                    let pr = sc[i * n + c - lo];
                    let dst = &mut parts[(i * pl + c % pl) * hv..][..hv];
                    for (o, x) in dst.iter_mut().zip(v_row(c)) {
                        *o += pr * x.to_f32();
                    }
                }
            };
            for (i, &(f, _)) in ranges.iter().enumerate() {
                alone(parts, i, f..j0);
            }
            let pp = parts.as_mut_ptr();
            let sp = sc.as_ptr();
            for i0 in (0..m).step_by(4) {
                let nq = (m - i0).min(4);
                for c in 0..pl {
                    let start = j0 + (c + pl - j0 % pl) % pl;
                    if start > j1 {
                        continue;
                    }
                    let dst: [*mut f32; 4] =
                        // SAFETY: in parts (i < m, c < pl).
                        std::array::from_fn(|k| unsafe { pp.add(((i0 + k.min(nq - 1)) * pl + c) * hv) });
                    // SAFETY: AVX-512 F; hv is whole registers; the V rows of cells
                    // j0..=j1 were checked; probabilities inside sc.
                    unsafe {
                        let cells = (start..=j1).step_by(pl);
                        let prob = |k: usize, cell: usize| sp.add((i0 + k) * n + cell - lo);
                        let v = |cell: usize| vp.add(slots[cell] * kv.v_stride + kv.v_off);
                        use crate::arch::x86::attn::{vsum_tile, vsum_tile_avx2};
                        match kernel {
                            TileKernel::Zmm => vsum_tile(&dst[..nq], hv, cells, &prob, &v),
                            _ => vsum_tile_avx2(&dst[..nq], hv, cells, &prob, &v),
                        }
                    };
                }
            }
            for (i, &(_, l)) in ranges.iter().enumerate() {
                alone(parts, i, j1 + 1..l + 1);
            }
            // The partials' halving tree, element by element as `order::hsum` does it.
            for (i, o) in out.chunks_exact_mut(hv).enumerate() {
                let q = &mut parts[i * pl * hv..(i + 1) * pl * hv];
                let mut w = pl / 2;
                while w > 0 {
                    let (a, b) = q.split_at_mut(w * hv);
                    for (x, &y) in a.iter_mut().zip(&b[..w * hv]) {
                        *x += y;
                    }
                    w /= 2;
                }
                o.copy_from_slice(&q[..hv]);
            }
        });
        return;
    }
    let _ = (lo, j0, j1, kernel);
    for ((i, &(f, l)), o) in ranges.iter().enumerate().zip(out.chunks_exact_mut(hv)) {
        attend_head(p, &qs[i * hk..(i + 1) * hk], kv, &slots[f..=l], f, o);
    }
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
    /// A tile gives each query the bits of its own `attend_head`: query counts that are
    /// not whole quads, key counts that are not whole quads, sliding windows (ranges that
    /// start apart), scattered slots, both flavors and orders.
    #[test]
    fn tiles_attend_like_one_head_at_a_time() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        for &(hk, hv, n_cells, m, spread, window) in &[
            (64, 64, 70, 12, 3, 0),
            (64, 64, 301, 14, 1, 0),
            (256, 256, 45, 16, 3, 0),
            (64, 32, 130, 5, 4, 40),
            (32, 48, 19, 3, 2, 0),
            (64, 64, 200, 7, 3, 17),
            (24, 40, 33, 6, 2, 0),
        ] {
            let n_kv = 2;
            let n_slots = n_cells + 9;
            let k: Vec<f16> = (0..n_slots * n_kv * hk)
                .map(|_| f16::from_f32(rnd() * 2.0))
                .collect();
            let v: Vec<f16> = (0..n_slots * n_kv * hv)
                .map(|_| f16::from_f32(rnd()))
                .collect();
            // Cell c lives in a scattered slot.
            let slots: Vec<usize> = (0..n_cells).map(|c| (c * 7 + 3) % n_slots).collect();
            let kv = KvHead {
                k: &k,
                v: &v,
                k_stride: n_kv * hk,
                v_stride: n_kv * hv,
                k_off: hk,
                v_off: hv,
            };
            let qs: Vec<f32> = (0..m * hk).map(|_| rnd() * 3.0).collect();
            // Queries in groups of 3 per token, tokens `spread` apart at the end.
            let ranges: Vec<(usize, usize)> = (0..m)
                .map(|i| {
                    let last = n_cells - 1 - (i / 3) % spread;
                    let first = if window > 0 {
                        (last + 1).saturating_sub(window)
                    } else {
                        0
                    };
                    (first, last)
                })
                .collect();
            for fl in [Flavor::Avx2, Flavor::Avx512] {
                for order in [F16Order::Gemm, F16Order::VecDot] {
                    let p = AttnParams {
                        flavor: fl,
                        order,
                        kq_scale: 0.125,
                    };
                    // Every kernel this CPU can run, forced, and the automatic pick.
                    let mut kernels: Vec<Option<Kernel>> = vec![None];
                    #[cfg(target_arch = "x86_64")]
                    for k in [TileKernel::Zmm, TileKernel::Ymm16, TileKernel::Ymm8] {
                        if k.fits(&p, hk, hv, crate::isa::detected()) {
                            kernels.push(Some(Some(k)));
                        }
                    }
                    for kernel in kernels {
                        let mut got = vec![0.0; m * hv];
                        match kernel {
                            None => attend_tile(&p, &qs, &ranges, &kv, &slots, &mut got),
                            Some(k) => attend_tile_on(k, &p, &qs, &ranges, &kv, &slots, &mut got),
                        }
                        for (i, &(f, l)) in ranges.iter().enumerate() {
                            let mut want = vec![0.0; hv];
                            attend_head(
                                &p,
                                &qs[i * hk..(i + 1) * hk],
                                &kv,
                                &slots[f..=l],
                                f,
                                &mut want,
                            );
                            let g = &got[i * hv..(i + 1) * hv];
                            assert_eq!(
                            g.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                            want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                            "hk {hk} hv {hv} cells {n_cells} m {m} window {window} {fl:?} {order:?} {kernel:?} query {i}"
                        );
                        }
                    }
                }
            }
        }
    }
}
