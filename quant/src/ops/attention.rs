//! Attention of one query head over a paged f16 KV cache, as llama.cpp's CPU backend
//! computes it with its default f16 cache and flash attention off: the query and the
//! probabilities rounded to f16 before their products with the cache, scores by
//! [`dot_f16`], ggml's [`softmax`], and the V rows summed by [`weighted_rows_f16`], all in
//! the [`F16Order`] of the kernel llama.cpp picks for the token's micro-batch.

use std::cell::RefCell;

use half::f16;

#[cfg(target_arch = "x86_64")]
use super::f16::{check_slots, reduce_partials};
use super::f16::{round_to_f16, scores_f16, weighted_rows_f16};
use super::softmax::softmax_with_sink;
use crate::order::{F16Order, Flavor};

/// How to compute: ggml's flavor, llama.cpp's f16 kernel order, the score scale and what
/// else shapes the scores.
#[derive(Clone, Copy, Debug)]
pub struct AttnParams {
    pub flavor: Flavor,
    pub order: F16Order,
    /// Multiplies each `q · k` before the soft-max.
    pub kq_scale: f32,
    /// Soft-capping of the raw scores, `cap * tanh(s * (1 / cap))`, before the scale
    /// (Gemma 2), as llama.cpp's graph does without flash attention.
    pub softcap: Option<f32>,
    /// The head's attention sink: a logit that joins the soft-max's maximum and sum
    /// without a value (gpt-oss), as ggml's `soft_max` with sinks.
    pub sink: Option<f32>,
}

impl AttnParams {
    /// Plain attention: no soft-capping, no sink.
    pub fn new(flavor: Flavor, order: F16Order, kq_scale: f32) -> AttnParams {
        AttnParams {
            flavor,
            order,
            kq_scale,
            softcap: None,
            sink: None,
        }
    }

    /// The scale the score kernels multiply by: 1 where soft-capping comes first (the
    /// scale is then applied after it, in [`finish_scores`]).
    fn score_scale(&self) -> f32 {
        if self.softcap.is_some() {
            1.0
        } else {
            self.kq_scale
        }
    }

    /// These parameters with head `h`'s sink from `sinks`.
    pub fn with_sink(&self, sinks: Option<&[f32]>, h: usize) -> AttnParams {
        AttnParams {
            sink: sinks.map(|s| s[h]),
            ..*self
        }
    }
}

/// From a row of scores (computed with [`AttnParams::score_scale`]) to the f16-rounded
/// probabilities: soft-capping then the scale where asked, ggml's soft-max (with the
/// head's sink), the rounding to f16 of llama.cpp's f16 products.
fn finish_scores(p: &AttnParams, row: &mut [f32], first_cell: usize) {
    if let Some(cap) = p.softcap {
        let inv = 1.0 / cap;
        for v in row.iter_mut() {
            *v = (*v * inv).tanh() * cap * p.kq_scale;
        }
    }
    softmax_with_sink(p.flavor, row, first_cell, p.sink);
    round_to_f16(row);
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
            p.score_scale(),
            scores,
        );
        finish_scores(p, scores, first_cell);
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

/// One layer's f16 KV cache: K of KV head `g` at slot `s` is `k[s * n_head_kv * hk + g *
/// hk..][..hk]`, V likewise with `hv`.
#[derive(Clone, Copy, Debug)]
pub struct KvLayer<'a> {
    pub k: &'a [f16],
    pub v: &'a [f16],
    pub n_head_kv: usize,
    pub hk: usize,
    pub hv: usize,
}

impl<'a> KvLayer<'a> {
    /// KV head `g`'s rows.
    pub fn head(&self, g: usize) -> KvHead<'a> {
        KvHead {
            k: self.k,
            v: self.v,
            k_stride: self.n_head_kv * self.hk,
            v_stride: self.n_head_kv * self.hv,
            k_off: g * self.hk,
            v_off: g * self.hv,
        }
    }
}

/// Runs tasks `0..n` (on a thread pool), returning when all are done.
pub type ParallelFor<'a> = &'a dyn Fn(usize, &(dyn Fn(usize) + Sync));

/// The most cells one score task of [`attend_heads`] covers (for every KV head, so it
/// reads whole cache rows in order); fewer, down to a quarter, when that makes 16 tasks.
#[cfg(target_arch = "x86_64")]
const SCORE_CELLS: usize = 256;

/// Partial sums one V task of [`attend_heads`] covers (of the order's `4 * lanes`).
#[cfg(target_arch = "x86_64")]
const CLASS_BLOCK: usize = 16;

/// A pointer tasks write through, each to its own part.
#[derive(Clone, Copy)]
struct Shared(*mut f32);
// SAFETY: the tasks that share it write disjoint elements, and the caller waits for them.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

impl Shared {
    /// The pointer (a method, so closures capture the `Sync` wrapper, not its field).
    fn at(&self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

thread_local! {
    /// [`attend_heads`]' rounded queries, score rows and V partial sums.
    static HEADS: RefCell<(Vec<f32>, Vec<f32>, Vec<f32>)> =
        const { RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// Every query head of one token (`q`: `n_head x hk`) attending over the cells
/// `first_cell..first_cell + slots.len()` (cell `first_cell + i` in slot `slots[i]`),
/// `out[h * hv..][..hv]` for head h: the bits of one [`attend_head`] per head.
///
/// Decode at depth reads the whole cache per token. One task per head read each K and V
/// row once per query head, and the V partial sums of the VecDot order (every 64th row
/// per partial with 16 lanes, every 32nd with 8) in an order the prefetchers do not
/// follow. With the VecDot order on AVX-512 or AVX2 (the flavor's own kernels), from 512
/// cells on, this runs three steps on `run` instead: scores of every head for a chunk of
/// cells (each cache row read once, whole, the rows in order), the soft-max per head,
/// then the V partial sums for a block of partials of a set of KV groups' heads (each V
/// row read once, in runs of sixteen whole rows where the set is every group).
/// Otherwise, one [`attend_head`] per head on `run`.
#[allow(clippy::too_many_arguments)] // the query, the cache, the cells, where to run
pub fn attend_heads(
    p: &AttnParams,
    run: ParallelFor<'_>,
    q: &[f32],
    n_head: usize,
    kv: &KvLayer<'_>,
    slots: &[usize],
    first_cell: usize,
    sinks: Option<&[f32]>,
    out: &mut [f32],
) {
    attend_heads_from(
        SPLIT_CELLS,
        p,
        run,
        q,
        n_head,
        kv,
        slots,
        first_cell,
        sinks,
        out,
    )
}

/// The fewest cells [`attend_heads`] splits into its three steps: below, the two extra
/// pool dispatches per layer cost more than the cache reads they save. Re-measured on Zen
/// 5: from 128 cells the split is faster on one thread (8B shape at 256 cells: 0.13 ms a
/// layer split, 0.19 per head), but 128 here cost qwen2.5 tg128 @ d256 about 8% (80-84
/// vs 89-91 t/s, three alternated rounds, t=2) and left the 8B within noise.
const SPLIT_CELLS: usize = 512;

/// [`attend_heads`], split into its three steps from `min_cells` cells on.
// Without x86 the fallback is the whole body, so its early return is the last statement.
#[allow(clippy::too_many_arguments)]
#[cfg_attr(not(target_arch = "x86_64"), allow(clippy::needless_return))]
fn attend_heads_from(
    min_cells: usize,
    p: &AttnParams,
    run: ParallelFor<'_>,
    q: &[f32],
    n_head: usize,
    kv: &KvLayer<'_>,
    slots: &[usize],
    first_cell: usize,
    sinks: Option<&[f32]>,
    out: &mut [f32],
) {
    let (hk, hv, n_kv) = (kv.hk, kv.hv, kv.n_head_kv);
    assert!(
        n_kv > 0
            && n_head.is_multiple_of(n_kv)
            && q.len() == n_head * hk
            && out.len() == n_head * hv,
        "attend_heads: shapes do not match"
    );
    let group = n_head / n_kv;
    #[cfg(target_arch = "x86_64")]
    let fits = p.order == F16Order::VecDot
        && match p.flavor {
            Flavor::Avx512 => crate::isa::active().includes(crate::isa::Isa::Avx512),
            Flavor::Avx2 => crate::isa::active().includes(crate::isa::Isa::Avx2),
        }
        && hk.is_multiple_of(4 * p.flavor.lanes())
        && hv.is_multiple_of(16)
        && group <= 16
        && !slots.is_empty()
        && slots.len() >= min_cells
        && sinks.is_none_or(|s| s.len() >= n_head);
    #[cfg(not(target_arch = "x86_64"))]
    let fits = {
        let _ = min_cells;
        false
    };
    if !fits {
        let o = Shared(out.as_mut_ptr());
        run(n_head, &|h| {
            // SAFETY: each task writes its own head's row of `out`.
            let o = unsafe { std::slice::from_raw_parts_mut(o.at(h * hv), hv) };
            attend_head(
                &p.with_sink(sinks, h),
                &q[h * hk..(h + 1) * hk],
                &kv.head(h / group),
                slots,
                first_cell,
                o,
            );
        });
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        use crate::arch::x86::attn as x86;
        let n = slots.len();
        check_slots("attend_heads", hk, kv.k, slots, n_kv * hk, (n_kv - 1) * hk);
        check_slots("attend_heads", hv, kv.v, slots, n_kv * hv, (n_kv - 1) * hv);
        let np = 4 * p.flavor.lanes();
        HEADS.with(|t| {
            let mut t = t.borrow_mut();
            let (q16, sc, parts) = &mut *t;
            q16.clear();
            q16.extend_from_slice(q);
            round_to_f16(q16);
            sc.clear();
            sc.resize(n_head * n, 0.0);
            parts.clear();
            // Each head's partials one cache line further than a whole multiple of 4 KiB:
            // a head's load must not wait for the previous head's store to the same page
            // offset (4K aliasing), which made the pass twice as slow.
            let hs = np * hv + 16;
            parts.resize(n_head * hs, 0.0);
            let (scp, pp) = (Shared(sc.as_mut_ptr()), Shared(parts.as_mut_ptr()));
            let cells = n
                .div_ceil(16)
                .next_multiple_of(4)
                .clamp(SCORE_CELLS / 4, SCORE_CELLS);
            let chunks = n.div_ceil(cells);
            let q16 = &q16[..];
            run(chunks, &|c| {
                let (s0, s1) = (c * cells, ((c + 1) * cells).min(n));
                let kp = kv.k.as_ptr().cast::<u16>();
                let own = &slots[s0..s1];
                // SAFETY: the flavor's ISA is active (`fits`), hk whole steps; every key
                // row read was checked above; the task writes columns s0..s1 of every
                // head's row.
                unsafe {
                    let row = move |s: usize| kp.add(*own.get_unchecked(s) * n_kv * hk);
                    let (scale, m, dst) = (p.score_scale(), s1 - s0, scp.at(s0));
                    match p.flavor {
                        Flavor::Avx512 => {
                            x86::scores_heads_vecdot(q16, n_kv, group, hk, m, &row, scale, dst, n)
                        }
                        Flavor::Avx2 => x86::scores_heads_vecdot_avx2(
                            q16, n_kv, group, hk, m, &row, scale, dst, n,
                        ),
                    }
                }
            });
            run(n_head, &|h| {
                // SAFETY: each task owns its head's row.
                let row = unsafe { std::slice::from_raw_parts_mut(scp.at(h * n), n) };
                finish_scores(&p.with_sink(sinks, h), row, first_cell);
            });
            // Tasks: a block of partials for a set of KV groups each, so that a task reads
            // long contiguous pieces of the cache's rows.
            let blocks = np / CLASS_BLOCK;
            let splits = vsum_splits(n_kv, group, blocks);
            let per = n_kv / splits;
            run(blocks * splits, &|task| {
                let (b, g0) = (task % blocks, task / blocks * per);
                let vp = kv.v.as_ptr().cast::<u16>();
                let stride = n_kv * hv;
                let heads: [*mut f32; VSUM_HEADS] =
                    // SAFETY: in `parts` (h < n_head).
                    std::array::from_fn(|i| pp.at((g0 * group + i.min(per * group - 1)) * hs));
                let cls = b * CLASS_BLOCK..(b + 1) * CLASS_BLOCK;
                let prob = |i: usize| scp.at((g0 * group + i) * n).cast_const();
                // SAFETY: as the scores; V rows checked above; the task writes the
                // partials of its block for its groups' heads only; probabilities inside
                // `sc`.
                unsafe {
                    let v = move |c: usize| vp.add(*slots.get_unchecked(c) * stride + g0 * hv);
                    let hs = &heads[..per * group];
                    match p.flavor {
                        Flavor::Avx512 => {
                            x86::vsum_cells(hs, per, hv, np, cls, first_cell, n, &prob, &v)
                        }
                        Flavor::Avx2 => {
                            x86::vsum_cells_avx2(hs, per, hv, np, cls, first_cell, n, &prob, &v)
                        }
                    }
                }
            });
            for (h, o) in out.chunks_exact_mut(hv).enumerate() {
                let part = &mut parts[h * hs..h * hs + np * hv];
                reduce_partials(p.flavor, p.order, part, hv);
                o.copy_from_slice(&part[..hv]);
            }
        });
    }
}

/// Into how many sets of KV groups [`attend_heads`] splits its V sums, each task one
/// block of partials for one set: the fewest (the longest contiguous reads) that makes
/// [`VSUM_TASKS`] tasks (else one group per set), with at most [`VSUM_HEADS`] heads per
/// task.
#[cfg(target_arch = "x86_64")]
fn vsum_splits(n_kv: usize, group: usize, blocks: usize) -> usize {
    // One group per set (group <= 16) always fits, and makes the most tasks.
    (1..=n_kv)
        .filter(|s| n_kv.is_multiple_of(*s) && n_kv / s * group <= VSUM_HEADS)
        .find(|s| blocks * s >= VSUM_TASKS)
        .unwrap_or(n_kv)
}

/// The fewest V-sum tasks [`attend_heads`] aims for.
#[cfg(target_arch = "x86_64")]
const VSUM_TASKS: usize = 4;

/// The most heads one V-sum task of [`attend_heads`] takes.
#[cfg(target_arch = "x86_64")]
const VSUM_HEADS: usize = 64;

/// V elements per row a tile copies and sums at a time: a slice of every row of a 4096-cell
/// tile (512 KiB) stays in L2 while the passes read it.
#[cfg(target_arch = "x86_64")]
const VSLICE: usize = 64;

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

/// A tile's rounded queries, score rows and V partial sums (f32), and its V row copy.
#[cfg(target_arch = "x86_64")]
type TileScratch = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<u16>);

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// A tile's rounded queries, its score rows, its V partial sums and its copy of a
    /// slice of the V rows.
    static TILE: RefCell<TileScratch> =
        const { RefCell::new((Vec::new(), Vec::new(), Vec::new(), Vec::new())) };
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
    sinks: Option<&[f32]>,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    let kernel = {
        let m = ranges.len().max(1);
        TileKernel::pick(p, qs.len() / m, out.len() / m)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let kernel = None;
    attend_tile_on(kernel, p, qs, ranges, kv, slots, sinks, out)
}

/// The kernels a tile runs on (`None`: one [`attend_head`] per query).
#[cfg(target_arch = "x86_64")]
type Kernel = Option<TileKernel>;
#[cfg(not(target_arch = "x86_64"))]
type Kernel = Option<std::convert::Infallible>;

/// [`attend_tile`] on the given kernels.
#[allow(clippy::too_many_arguments)]
fn attend_tile_on(
    kernel: Kernel,
    p: &AttnParams,
    qs: &[f32],
    ranges: &[(usize, usize)],
    kv: &KvHead<'_>,
    slots: &[usize],
    sinks: Option<&[f32]>,
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
    assert!(
        sinks.is_none_or(|s| s.len() == m),
        "attend_tile: one sink per query"
    );
    #[cfg(target_arch = "x86_64")]
    if let Some(kernel) = kernel.filter(|_| j0 <= j1) {
        let cells = &slots[lo..=hi];
        check_slots("attend_tile", hk, kv.k, cells, kv.k_stride, kv.k_off);
        check_slots("attend_tile", hv, kv.v, cells, kv.v_stride, kv.v_off);
        TILE.with(|t| {
            let mut t = t.borrow_mut();
            let (q16, sc, parts, vbuf) = &mut *t;
            q16.clear();
            q16.extend_from_slice(qs);
            round_to_f16(q16);
            let n = hi + 1 - lo;
            sc.clear();
            sc.resize(m * n, 0.0);
            let kp = kv.k.as_ptr().cast::<u16>();
            // SAFETY: AVX-512 F is active; head sizes are whole registers; every row
            // read was bounds-checked above; `sc` holds m x n scores.
            unsafe {
                let key = |s: usize| kp.add(cells[s] * kv.k_stride + kv.k_off);
                use crate::arch::x86::attn::{scores_tile, scores_tile_avx2};
                match kernel {
                    TileKernel::Zmm => scores_tile(q16, m, hk, n, &key, p.score_scale(), sc),
                    TileKernel::Ymm8 => {
                        scores_tile_avx2::<1>(q16, m, hk, n, &key, p.score_scale(), sc)
                    }
                    TileKernel::Ymm16 => {
                        scores_tile_avx2::<2>(q16, m, hk, n, &key, p.score_scale(), sc)
                    }
                }
            }
            for (i, &(f, l)) in ranges.iter().enumerate() {
                let row = &mut sc[i * n + f - lo..=i * n + l - lo];
                finish_scores(&p.with_sink(sinks, i), row, f);
            }
            // Partial sum `c` of query i (cells ≡ c mod P) at parts[(i * P + c) * hv..].
            let pl = p.flavor.lanes();
            parts.clear();
            parts.resize(m * pl * hv, 0.0);
            let v_row = |c: usize| &kv.v[slots[c] * kv.v_stride + kv.v_off..][..hv];
            // Each partial sum runs in cell order: the cells only some queries see
            // (before j0 and after j1) one query at a time, those all see six at a
            // time.
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
            // Partial c adds the rows of cells c, c + pl, .. in order, rows every pl cells
            // apart in the cache: read in place at that stride (a power of two times the
            // row stride for most models) the rows fall into a few cache sets and every
            // pass over them came from L3. So a slice of VS elements of every row is
            // first copied partial by partial (class c's rows in order from class_at[c]),
            // and the passes read the copy in order.
            let class_start = |c: usize| j0 + (c + pl - j0 % pl) % pl;
            let class_len = |c: usize| {
                let st = class_start(c);
                if st > j1 {
                    0
                } else {
                    (j1 - st) / pl + 1
                }
            };
            let mut class_at = [0usize; 17];
            for c in 0..pl {
                class_at[c + 1] = class_at[c] + class_len(c);
            }
            let vs = hv.min(VSLICE);
            if vbuf.len() < class_at[pl] * vs {
                vbuf.resize(class_at[pl] * vs, 0);
            }
            let bp = vbuf.as_mut_ptr();
            let mut d0 = 0;
            while d0 < hv {
                let w = vs.min(hv - d0);
                let mut next = class_at;
                let mut c = j0 % pl;
                for cell in j0..=j1 {
                    let src = &kv.v[slots[cell] * kv.v_stride + kv.v_off + d0..][..w];
                    // SAFETY: `next[c] < class_at[c + 1]`, w <= vs values, a multiple of 8.
                    unsafe {
                        let dst = bp.add(next[c] * vs).cast::<[u16; 8]>();
                        let src = src.as_ptr().cast::<[u16; 8]>();
                        for e in 0..w / 8 {
                            dst.add(e).write_unaligned(src.add(e).read_unaligned());
                        }
                    };
                    next[c] += 1;
                    c = if c + 1 == pl { 0 } else { c + 1 };
                }
                use crate::arch::x86::attn::VSUM_QUERIES;
                for i0 in (0..m).step_by(VSUM_QUERIES) {
                    let nq = (m - i0).min(VSUM_QUERIES);
                    for c in 0..pl {
                        let start = class_start(c);
                        if start > j1 {
                            continue;
                        }
                        let dst: [*mut f32; VSUM_QUERIES] =
                            // SAFETY: in parts (i < m, c < pl, d0 < hv).
                            std::array::from_fn(|k| unsafe { pp.add(((i0 + k.min(nq - 1)) * pl + c) * hv + d0) });
                        // SAFETY: the tile's ISA; w is whole registers; the copy holds
                        // class c's rows; probabilities inside sc.
                        unsafe {
                            let idx = 0..class_len(c);
                            let prob = |k: usize, j: usize| sp.add((i0 + k) * n + start + j * pl - lo);
                            let base = bp.add(class_at[c] * vs).cast_const();
                            let v = |j: usize| base.add(j * vs);
                            use crate::arch::x86::attn::{vsum_tile, vsum_tile_avx2};
                            match kernel {
                                TileKernel::Zmm => vsum_tile(&dst[..nq], w, idx, &prob, &v),
                                _ => vsum_tile_avx2(&dst[..nq], w, idx, &prob, &v),
                            }
                        };
                    }
                }
                d0 += w;
            }
            for (i, &(_, l)) in ranges.iter().enumerate() {
                alone(parts, i, j1 + 1..l + 1);
            }
            for (i, o) in out.chunks_exact_mut(hv).enumerate() {
                let q = &mut parts[i * pl * hv..(i + 1) * pl * hv];
                reduce_partials(p.flavor, p.order, q, hv);
                o.copy_from_slice(&q[..hv]);
            }
        });
        return;
    }
    let _ = (lo, j0, j1, kernel);
    for ((i, &(f, l)), o) in ranges.iter().enumerate().zip(out.chunks_exact_mut(hv)) {
        attend_head(
            &p.with_sink(sinks, i),
            &qs[i * hk..(i + 1) * hk],
            kv,
            &slots[f..=l],
            f,
            o,
        );
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
            let p = AttnParams::new(Flavor::Avx2, order, 0.25);
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
    /// Values uniform in [-1, 1) from a xorshift generator seeded with `seed`.
    fn uniform(mut seed: u64) -> impl FnMut() -> f32 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        }
    }

    /// A tile gives each query the bits of its own `attend_head`: query counts that are
    /// not whole quads, key counts that are not whole quads, sliding windows (ranges that
    /// start apart), scattered slots, both flavors and orders.
    #[test]
    fn tiles_attend_like_one_head_at_a_time() {
        let mut rnd = uniform(0x2545_f491_4f6c_dd1du64);
        for &(hk, hv, n_cells, m, spread, window) in &[
            (64, 64, 70, 12, 3, 0),
            (64, 64, 301, 14, 1, 0),
            (256, 256, 45, 16, 3, 0),
            (64, 32, 130, 5, 4, 40),
            (32, 48, 19, 3, 2, 0),
            (64, 64, 200, 7, 3, 17),
            (24, 40, 33, 6, 2, 0),
            (64, 80, 150, 9, 2, 5),
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
            // Gemma 2's soft-capping and gpt-oss's sinks (one per query) as well.
            let sinks: Vec<f32> = (0..m).map(|i| i as f32 * 0.7 - 1.0).collect();
            for (fl, order, softcap, sinks) in [Flavor::Avx2, Flavor::Avx512]
                .into_iter()
                .flat_map(|fl| [F16Order::Gemm, F16Order::VecDot].map(|o| (fl, o)))
                .flat_map(|(fl, o)| {
                    [(None, None), (Some(2.5), None), (None, Some(&sinks[..]))]
                        .map(|(c, s)| (fl, o, c, s))
                })
            {
                {
                    let p = AttnParams {
                        softcap,
                        ..AttnParams::new(fl, order, 0.125)
                    };
                    // Every kernel this CPU can run, forced, and the automatic pick.
                    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
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
                            None => attend_tile(&p, &qs, &ranges, &kv, &slots, sinks, &mut got),
                            Some(k) => {
                                attend_tile_on(k, &p, &qs, &ranges, &kv, &slots, sinks, &mut got)
                            }
                        }
                        for (i, &(f, l)) in ranges.iter().enumerate() {
                            let mut want = vec![0.0; hv];
                            attend_head(
                                &p.with_sink(sinks, i),
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
                            "hk {hk} hv {hv} cells {n_cells} m {m} window {window} {fl:?} {order:?} {kernel:?} softcap {softcap:?} sinks {} query {i}", sinks.is_some()
                        );
                        }
                    }
                }
            }
        }
    }

    /// All heads of a token at once give each head the bits of its own `attend_head`,
    /// whatever the order, flavor, group size, cell count or first cell, with the steps
    /// run in order or on threads.
    #[test]
    fn heads_attend_like_one_head_at_a_time() {
        let mut rnd = uniform(0x9e37_79b9_7f4a_7c15u64);
        let serial = |n: usize, f: &(dyn Fn(usize) + Sync)| (0..n).for_each(f);
        let threads = |n: usize, f: &(dyn Fn(usize) + Sync)| {
            let next = std::sync::atomic::AtomicUsize::new(0);
            std::thread::scope(|sc| {
                for _ in 0..3 {
                    sc.spawn(|| loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= n {
                            break;
                        }
                        f(i)
                    });
                }
            })
        };
        for &(n_head, n_kv, hk, hv, n_cells, first) in &[
            (9, 3, 64, 64, 700, 0),
            (4, 1, 256, 256, 300, 17),
            (14, 2, 64, 64, 65, 3),
            (8, 8, 128, 128, 1, 0),
            (6, 2, 64, 48, 259, 100),
            (4, 2, 40, 32, 33, 0),
            (40, 5, 128, 128, 1100, 40),
        ] {
            let n_slots = n_cells + first + 5;
            let k: Vec<f16> = (0..n_slots * n_kv * hk)
                .map(|_| f16::from_f32(rnd() * 2.0))
                .collect();
            let v: Vec<f16> = (0..n_slots * n_kv * hv)
                .map(|_| f16::from_f32(rnd()))
                .collect();
            let slots: Vec<usize> = (0..n_cells).map(|c| (c * 5 + 2) % n_slots).collect();
            let q: Vec<f32> = (0..n_head * hk).map(|_| rnd() * 3.0).collect();
            let kv = KvLayer {
                k: &k,
                v: &v,
                n_head_kv: n_kv,
                hk,
                hv,
            };
            let sinks: Vec<f32> = (0..n_head).map(|h| 1.5 - h as f32 * 0.3).collect();
            for (fl, order, softcap, sinks) in [Flavor::Avx2, Flavor::Avx512]
                .into_iter()
                .flat_map(|fl| [F16Order::Gemm, F16Order::VecDot].map(|o| (fl, o)))
                .flat_map(|(fl, o)| {
                    [(None, None), (Some(2.5), None), (None, Some(&sinks[..]))]
                        .map(|(c, s)| (fl, o, c, s))
                })
            {
                {
                    let p = AttnParams {
                        softcap,
                        ..AttnParams::new(fl, order, 0.125)
                    };
                    let mut want = vec![0.0; n_head * hv];
                    for (h, o) in want.chunks_exact_mut(hv).enumerate() {
                        let qh = &q[h * hk..(h + 1) * hk];
                        let ph = p.with_sink(sinks, h);
                        attend_head(&ph, qh, &kv.head(h / (n_head / n_kv)), &slots, first, o);
                    }
                    for (run, min_cells) in [
                        (&serial as ParallelFor<'_>, 0),
                        (&threads, 0),
                        (&threads, SPLIT_CELLS),
                    ] {
                        let mut got = vec![0.0; n_head * hv];
                        let (nh, sl) = (n_head, &slots);
                        attend_heads_from(
                            min_cells, &p, run, &q, nh, &kv, sl, first, sinks, &mut got,
                        );
                        assert_eq!(
                            got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                            want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                            "{n_head}/{n_kv} hk {hk} hv {hv} cells {n_cells} first {first} {fl:?} {order:?} softcap {softcap:?} sinks {}", sinks.is_some()
                        );
                    }
                }
            }
        }
    }
}
