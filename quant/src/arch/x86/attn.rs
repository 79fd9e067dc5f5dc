//! Prefill attention for several queries of one KV head at once (`ops::attention::
//! attend_tile`), in llama.cpp's GEMM order for the AVX-512 flavor: each (query, key)
//! score is one 16-lane FMA chain over the head dimension reduced by the halving tree,
//! and each V partial sum (`cell % 16`) one chain in cell order, exactly as the per-query
//! kernels compute them. What changes is how often the cache is read: a key row is
//! converted once for four queries and a V row once for six instead of once per query,
//! and the sixteen scores of a 4 x 4 tile are reduced together by shuffles (the same
//! additions, lane for lane) instead of one horizontal sum each.

use core::arch::x86_64::*;

use super::simd::{arr, prefetch_lines};

/// Queries (and keys) per register tile.
const QUAD: usize = 4;

/// `out[i * n + s] = (q_i · key_s) * scale` for the `m` queries `q16[i * hk..]` (already
/// rounded to f16 values) and the `n` keys `key(s)` (f16 rows of `hk` values), in the GEMM
/// order of the 16-lane flavor.
///
/// # Safety
/// AVX-512 F; `hk % 16 == 0`; `q16.len() >= m * hk`; `out.len() >= m * n`; every
/// `key(s)` for `s < n` points at `hk` readable f16 values.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn scores_tile(
    q16: &[f32],
    m: usize,
    hk: usize,
    n: usize,
    key: &impl Fn(usize) -> *const u16,
    scale: f32,
    out: &mut [f32],
) {
    debug_assert!(hk.is_multiple_of(16) && q16.len() >= m * hk && out.len() >= m * n);
    scores_tile_order::<false>(q16, m, hk, n, key, scale, out.as_mut_ptr(), n)
}

/// Decode scores of every query head of one token, `(q_h · key) * scale`, in llama.cpp's
/// VecDot order (`ggml_vec_dot_f16`, one token): four chains per score over steps of 64
/// (chain `j` takes dims `64 t + 16 j..`), added `(0 + 2) + (1 + 3)`, then the halving
/// tree. `q16` holds the `n_kv * group` queries (rounded to f16 values), group `g`'s heads
/// `g * group..`; cell `s`'s cache row holds every group's key (`row(s) + g * hk`). Each
/// row is scored against all heads before the next one's, so the cache is read as one
/// stream of whole rows (the hardware prefetchers follow it, and each group's slices of
/// the rows two quads ahead are asked for as that group is scored) instead of one strided
/// pass per group (256 of every 2048 bytes for 8 groups of 128, which took 2.5 times as
/// long); the quads of heads by keys are [`scores_tile`]'s.
/// Head `h`'s score of cell `s` goes to `out[h * stride + s]`.
///
/// # Safety
/// AVX-512 F; `hk % 64 == 0`; `q16.len() >= n_kv * group * hk`; `out` valid for `(n_kv *
/// group - 1) * stride + n` values; every `row(s)` for `s < n` points at `n_kv * hk`
/// readable f16 values.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)] // the queries, the cells, the output
pub(crate) unsafe fn scores_heads_vecdot(
    q16: &[f32],
    n_kv: usize,
    group: usize,
    hk: usize,
    n: usize,
    row: &impl Fn(usize) -> *const u16,
    scale: f32,
    out: *mut f32,
    stride: usize,
) {
    debug_assert!(hk.is_multiple_of(64) && q16.len() >= n_kv * group * hk);
    let mut s = 0;
    while s < n {
        let nk = (n - s).min(QUAD);
        for g in 0..n_kv {
            prefetch_slices(row, s, n, g * hk, hk);
            let key = |k: usize| row(s + k).add(g * hk);
            let (qg, dst) = (&q16[g * group * hk..], out.add(g * group * stride + s));
            scores_tile_order::<true>(qg, group, hk, nk, &key, scale, dst, stride);
        }
        s += QUAD;
    }
}

/// [`scores_heads_vecdot`] for the 8-lane flavor on AVX2 (`ggml_vec_dot_f16` of an AVX2
/// build): four keys at a time for each head of a group, by the per-head kernel of that
/// order. (Tiles of four heads by one key, converting each key once for the four, ran
/// slower on Zen 5: 0.53 vs 0.45 ms a layer for the 8B shape's scores in cache, one
/// thread, and 1.0 vs 0.75 from memory, where one key at a time left fewer loads in
/// flight.)
///
/// # Safety
/// AVX2, FMA and F16C; `hk % 32 == 0`; otherwise as [`scores_heads_vecdot`].
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)] // as scores_heads_vecdot
pub(crate) unsafe fn scores_heads_vecdot_avx2(
    q16: &[f32],
    n_kv: usize,
    group: usize,
    hk: usize,
    n: usize,
    row: &impl Fn(usize) -> *const u16,
    scale: f32,
    out: *mut f32,
    stride: usize,
) {
    debug_assert!(hk.is_multiple_of(32) && q16.len() >= n_kv * group * hk);
    let mut s = 0;
    while s < n {
        let nk = (n - s).min(QUAD);
        for g in 0..n_kv {
            prefetch_slices(row, s, n, g * hk, hk);
            // A short last quad repeats its last key; those scores are never stored.
            let rows: [*const u16; QUAD] = arr(|k| row(s + k.min(nk - 1)).add(g * hk));
            for i in 0..group {
                let h = g * group + i;
                let d = super::f16::vecdot_dots::<1, QUAD>(&q16[h * hk..(h + 1) * hk], rows);
                for (k, &x) in d.iter().enumerate().take(nk) {
                    *out.add(h * stride + s + k) = x * scale;
                }
            }
        }
        s += QUAD;
    }
}

/// Asks for the slices `off..off + len` (f16 values) of the rows of the quad of cells
/// `ROWS_AHEAD` quads after the one at `s`, if it lies before `n`: the scores ask for one
/// KV group's slices before scoring that group, a share of the quad's rows at a time. All
/// of a quad's rows at once (128 lines for llama-3-8B) waited on the loads instead:
/// `attn_decode 32 8 128 4096`, scores alone, one thread, from memory, 0.75 -> 0.50 ms
/// a layer on AVX2, 0.46 -> 0.42 on AVX-512 (a distance of one, two or four quads within
/// noise either way).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn prefetch_slices(
    row: &impl Fn(usize) -> *const u16,
    s: usize,
    n: usize,
    off: usize,
    len: usize,
) {
    let ahead = s + ROWS_AHEAD * QUAD;
    if ahead + QUAD <= n {
        for k in 0..QUAD {
            prefetch_lines(row(ahead + k).add(off).cast(), 2 * len);
        }
    }
}

/// Quads of cells [`scores_heads_vecdot`] asks for ahead of the one it scores.
const ROWS_AHEAD: usize = 2;

/// The two orders' tile loop (`VECDOT`: four chains per score, else one).
#[inline]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn scores_tile_order<const VECDOT: bool>(
    q16: &[f32],
    m: usize,
    hk: usize,
    n: usize,
    key: &impl Fn(usize) -> *const u16,
    scale: f32,
    op: *mut f32,
    stride: usize,
) {
    let sc = _mm512_set1_ps(scale);
    let qp = q16.as_ptr();
    let mut s = 0;
    while s < n {
        let nk = (n - s).min(QUAD);
        // A short last quad repeats its last key; those lanes are never stored.
        let rows: [*const u16; QUAD] = arr(|k| key(s + k.min(nk - 1)));
        let mut i = 0;
        while i < m {
            let nq = (m - i).min(QUAD);
            let qs: [*const f32; QUAD] = arr(|k| qp.add((i + k.min(nq - 1)) * hk));
            // acc[4 * key + query]: after the transposed reduction, lane 4 * query + key.
            // One chain over all dims (GEMM), or chain j over dims 16 j mod 64 (VecDot).
            let chain = |first: usize, step: usize| {
                let mut acc = [_mm512_setzero_ps(); 16];
                let mut d = first;
                while d < hk {
                    let kv: [__m512; QUAD] =
                        arr(|k| _mm512_cvtph_ps(_mm256_loadu_si256(rows[k].add(d).cast())));
                    for (qi, &q) in qs.iter().enumerate() {
                        let qv = _mm512_loadu_ps(q.add(d));
                        for (ki, &k) in kv.iter().enumerate() {
                            acc[4 * ki + qi] = _mm512_fmadd_ps(qv, k, acc[4 * ki + qi]);
                        }
                    }
                    d += step;
                }
                acc
            };
            let acc = if VECDOT {
                let (c0, c2) = (chain(0, 64), chain(32, 64));
                let a02: [__m512; 16] = arr(|j| _mm512_add_ps(c0[j], c2[j]));
                let (c1, c3) = (chain(16, 64), chain(48, 64));
                arr(|j| _mm512_add_ps(a02[j], _mm512_add_ps(c1[j], c3[j])))
            } else {
                chain(0, 16)
            };
            let f = _mm512_mul_ps(reduce16(&acc), sc);
            if nk == QUAD {
                // A quarter per query (a short last quad of queries stores fewer).
                let quarters = [
                    _mm512_castps512_ps128(f),
                    _mm512_extractf32x4_ps::<1>(f),
                    _mm512_extractf32x4_ps::<2>(f),
                    _mm512_extractf32x4_ps::<3>(f),
                ];
                for (qi, &x) in quarters.iter().enumerate().take(nq) {
                    _mm_storeu_ps(op.add((i + qi) * stride + s), x);
                }
            } else {
                let mut lanes = [0.0f32; 16];
                _mm512_storeu_ps(lanes.as_mut_ptr(), f);
                for qi in 0..nq {
                    let dst = op.add((i + qi) * stride + s);
                    for k in 0..nk {
                        *dst.add(k) = lanes[4 * qi + k];
                    }
                }
            }
            i += QUAD;
        }
        s += QUAD;
    }
}

/// The sixteen halving-tree sums of `acc` (each: lane `l` plus lane `l + 8`, then `+ 4`,
/// `+ 2`, `+ 1`, the order of `_mm512_reduce_add_ps` and of the 16-lane `order::hsum`),
/// with the sum of `acc[j]` in lane `4 * (j % 4) + j / 4`. Every lane sees exactly the
/// additions the one-register reduction does; the shuffles only move operands.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn reduce16(acc: &[__m512; 16]) -> __m512 {
    // y: quarters [a: l0..4 + l8..12, a: l4..8 + l12..16, b: .., b: ..] per pair (a, b).
    let y: [__m512; 8] = arr(|p| {
        let (a, b) = (acc[2 * p], acc[2 * p + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x44>(a, b),
            _mm512_shuffle_f32x4::<0xEE>(a, b),
        )
    });
    // r: quarter j holds acc[4p + j]'s four sums of y_i + y_{i+4}.
    let r: [__m512; 4] = arr(|p| {
        let (a, b) = (y[2 * p], y[2 * p + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x88>(a, b),
            _mm512_shuffle_f32x4::<0xDD>(a, b),
        )
    });
    // Within each quarter: r_i + r_{i+2}, for two registers side by side.
    let s01 = _mm512_add_ps(
        _mm512_shuffle_ps::<0x44>(r[0], r[1]),
        _mm512_shuffle_ps::<0xEE>(r[0], r[1]),
    );
    let s23 = _mm512_add_ps(
        _mm512_shuffle_ps::<0x44>(r[2], r[3]),
        _mm512_shuffle_ps::<0xEE>(r[2], r[3]),
    );
    // s_0 + s_1: quarter j, element e is acc[4e + j]'s sum.
    _mm512_add_ps(
        _mm512_shuffle_ps::<0x88>(s01, s23),
        _mm512_shuffle_ps::<0xDD>(s01, s23),
    )
}

/// Queries one [`vsum_tile`] pass holds, `R` registers of each plus one row's `R` and a
/// probability: with sixteen ymm (`R` = 2) twelve independent chains where four queries
/// gave eight, two FMA latencies' worth (AVX2 attention 5-12% faster); with zmm (`R` = 4)
/// 24 of the 32 registers (2-3%).
pub(crate) const VSUM_QUERIES: usize = 6;

/// One V partial sum for up to six queries over the cells `cells` (a class: every
/// 16th cell): `parts[i][d] += p_i(cell) * v(cell)[d]` in cell order, multiply then add
/// (the products of two f16 values are exact in f32, so the FMA is the same operation),
/// with `parts[i]` held in registers 64 elements at a time.
///
/// `prob(i, cell)` is query `i`'s probability, `v(cell)` the cell's V row (`hv` f16
/// values), `parts[i]` its `hv` partial sums.
///
/// # Safety
/// AVX-512 F; `hv % 16 == 0`; every pointer valid for `hv` elements.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn vsum_tile(
    parts: &[*mut f32],
    hv: usize,
    cells: impl Iterator<Item = usize> + Clone,
    prob: &impl Fn(usize, usize) -> *const f32,
    v: &impl Fn(usize) -> *const u16,
) {
    vsum_tile_in::<__m512, 4>(parts, hv, cells, prob, v)
}

/// [`vsum_tile`] on registers `V`, `R` of them per query for a block of each row (then
/// one at a time for the rest), inlined into a function with their features.
#[inline(always)]
unsafe fn vsum_tile_in<V: VReg, const R: usize>(
    parts: &[*mut f32],
    hv: usize,
    cells: impl Iterator<Item = usize> + Clone,
    prob: &impl Fn(usize, usize) -> *const f32,
    v: &impl Fn(usize) -> *const u16,
) {
    debug_assert!(hv.is_multiple_of(V::N) && parts.len() <= VSUM_QUERIES);
    match parts.len() {
        6 => vsum_queries::<V, 6, R>(parts, hv, cells, prob, v),
        5 => vsum_queries::<V, 5, R>(parts, hv, cells, prob, v),
        4 => vsum_queries::<V, 4, R>(parts, hv, cells, prob, v),
        3 => vsum_queries::<V, 3, R>(parts, hv, cells, prob, v),
        2 => vsum_queries::<V, 2, R>(parts, hv, cells, prob, v),
        1 => vsum_queries::<V, 1, R>(parts, hv, cells, prob, v),
        _ => {}
    }
}

#[inline(always)]
unsafe fn vsum_queries<V: VReg, const Q: usize, const R: usize>(
    parts: &[*mut f32],
    hv: usize,
    cells: impl Iterator<Item = usize> + Clone,
    prob: &impl Fn(usize, usize) -> *const f32,
    v: &impl Fn(usize) -> *const u16,
) {
    let mut d = 0;
    while d + R * V::N <= hv {
        vsum_block::<V, Q, R>(parts, d, cells.clone(), prob, v);
        d += R * V::N;
    }
    while d < hv {
        vsum_block::<V, Q, 1>(parts, d, cells.clone(), prob, v);
        d += V::N;
    }
}

#[inline(always)]
unsafe fn vsum_block<V: VReg, const Q: usize, const R: usize>(
    parts: &[*mut f32],
    d: usize,
    cells: impl Iterator<Item = usize>,
    prob: &impl Fn(usize, usize) -> *const f32,
    v: &impl Fn(usize) -> *const u16,
) {
    let mut acc: [[V; R]; Q] = arr(|i| arr(|j| V::load(parts[i].add(d + V::N * j))));
    for cell in cells {
        let r = v(cell).add(d);
        let vv: [V; R] = arr(|j| V::half(r.add(V::N * j)));
        for (i, acc) in acc.iter_mut().enumerate() {
            let p = *prob(i, cell);
            for (a, &x) in acc.iter_mut().zip(&vv) {
                *a = V::madd(p, x, *a);
            }
        }
    }
    for (i, acc) in acc.iter().enumerate() {
        for (j, a) in acc.iter().enumerate() {
            a.store(parts[i].add(d + V::N * j));
        }
    }
}

/// The f32 registers [`vsum_tile`] and [`vsum_cells`] add V rows with: a zmm (16 lanes)
/// or a ymm (8).
trait VReg: Copy {
    /// Floats per register.
    const N: usize;
    /// Queries one pass of [`vsum_cells`] holds (four partials of each, plus four rows, in
    /// registers).
    const Q: usize;
    /// Whether [`vsum_cells`] reads the rows in place (else from a per-chunk copy).
    const IN_PLACE: bool;
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn store(self, p: *mut f32);
    /// `N` f16 values, converted.
    unsafe fn half(p: *const u16) -> Self;
    /// `acc + p * x`.
    unsafe fn madd(p: f32, x: Self, acc: Self) -> Self;
}

impl VReg for __m512 {
    const N: usize = 16;
    const Q: usize = 4;
    const IN_PLACE: bool = true;
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        _mm512_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        _mm512_storeu_ps(p, self)
    }
    #[inline(always)]
    unsafe fn half(p: *const u16) -> Self {
        _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
    }
    #[inline(always)]
    unsafe fn madd(p: f32, x: Self, acc: Self) -> Self {
        _mm512_fmadd_ps(_mm512_set1_ps(p), x, acc)
    }
}

impl VReg for __m256 {
    const N: usize = 8;
    const Q: usize = 2;
    const IN_PLACE: bool = false;
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        _mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        _mm256_storeu_ps(p, self)
    }
    #[inline(always)]
    unsafe fn half(p: *const u16) -> Self {
        _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
    }
    #[inline(always)]
    unsafe fn madd(p: f32, x: Self, acc: Self) -> Self {
        _mm256_fmadd_ps(_mm256_set1_ps(p), x, acc)
    }
}

/// Sixteen V partial sums (`block`, of `np`) of every query head of `groups` KV groups
/// (`group` heads each, `parts.len() == groups * group`): the cell at index `i` (cell
/// `first_cell + i`, `n` of them) whose partial `(first_cell + i) % np` lies in `block`
/// adds group `g`'s slice of its row (`v(i) + g * hv`) into that partial of each of the
/// group's heads (`parts[g * group + q].add(partial * hv)`), multiply then add, in cell
/// order. The block's cells come in runs of sixteen consecutive rows, one per partial.
///
/// Decode at depth is bound by how this reads the cache. It works a chunk of runs at a
/// time (about [`VSUM_CHUNK`] bytes of rows, whole for all the task's groups, so the
/// cache is read in pieces of sixteen contiguous rows). Each pass holds four partials of
/// up to four heads (two with ymm) in registers for one register's elements, loads them
/// before and stores them after the chunk, and adds the chunk's runs in order, every
/// row's elements converted once for all those heads (not once per head). With zmm the
/// passes read the rows in place, from L2, while the next chunk's lines are asked for a
/// share before each pass, so the memory streams while the passes compute (the chunk's
/// runs, 32 KiB apiece at a 128 KiB stride for llama-3-8B, sit in half of L2's sets and
/// fit there). With ymm (twice the passes, each reading half as much per row) the rows are
/// first copied into a per-thread buffer laid out by group, element block, run and row
/// (planes 96 bytes apart: unpadded, the copies' stores aliased each other's 4 KiB
/// offsets), each pass reads a contiguous slice of it (reading in place measured 10-20%
/// slower there), and the next chunk's lines are asked for a share before each pass as
/// with zmm, so the copy reads from L2 (asking for rows two runs ahead of the copy
/// instead left the copy waiting on memory: the whole attention of a layer 2.15 -> 1.88
/// ms with this alone, and 1.67 with the scores' change as well; gemma3's shape 0.40 ->
/// 0.34 ms; qwen2.5's and smollm2's, within noise). Tried before: one group per task
/// (256 of every 2048 bytes of each row, which the prefetchers do not follow), and one
/// copy of the whole layer's runs made while scoring (8 MiB at 4096 cells for 8 KV
/// heads: written back to memory and read for ownership again every layer, as much
/// traffic as it saved). `attn_decode`, one thread, llama-3-8B shape, 4096 cells from
/// memory, the whole attention of a layer: 2.1-2.4 ms (scores and V one group per task),
/// 1.6 (rows in order, copies), 1.3-1.4 (V in place).
///
/// `prob(q)` is head `q`'s probabilities by cell index, `v(i)` cell index `i`'s row from
/// the first group's slice on.
///
/// # Safety
/// AVX-512 F; `hv % 16 == 0`; `block.len() == 16` inside `0..np`, `np % 16 == 0`;
/// `groups > 0` dividing `parts.len()`; every pointer valid for what it indexes
/// (`prob(q)` for `n` values, `v(i)` for `groups * hv`).
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)] // the partials, the cells, the accessors
pub(crate) unsafe fn vsum_cells(
    parts: &[*mut f32],
    groups: usize,
    hv: usize,
    np: usize,
    block: core::ops::Range<usize>,
    first_cell: usize,
    n: usize,
    prob: &impl Fn(usize) -> *const f32,
    v: &impl Fn(usize) -> *const u16,
) {
    vsum_cells_in::<__m512>(parts, groups, hv, np, block, first_cell, n, prob, v)
}

/// [`vsum_cells`] on AVX2 registers, for the 8-lane flavor (`np = 32`): four partials of
/// up to two heads per pass, 8 elements at a time.
///
/// # Safety
/// AVX2, FMA and F16C; otherwise as [`vsum_cells`].
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)] // as vsum_cells
pub(crate) unsafe fn vsum_cells_avx2(
    parts: &[*mut f32],
    groups: usize,
    hv: usize,
    np: usize,
    block: core::ops::Range<usize>,
    first_cell: usize,
    n: usize,
    prob: &impl Fn(usize) -> *const f32,
    v: &impl Fn(usize) -> *const u16,
) {
    vsum_cells_in::<__m256>(parts, groups, hv, np, block, first_cell, n, prob, v)
}

/// About how many bytes of rows [`vsum_cells`] takes per chunk: the chunk (and its copy)
/// stays in L2.
const VSUM_CHUNK: usize = 256 << 10;

std::thread_local! {
    /// [`vsum_cells`]' copy of a chunk's rows.
    static VSUM_ROWS: core::cell::RefCell<Vec<u16>> = const { core::cell::RefCell::new(Vec::new()) };
}

/// [`vsum_cells`] on registers `R` (inlined into a function with their features).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn vsum_cells_in<R: VReg>(
    parts: &[*mut f32],
    groups: usize,
    hv: usize,
    np: usize,
    block: core::ops::Range<usize>,
    first_cell: usize,
    n: usize,
    prob: &impl Fn(usize) -> *const f32,
    v: &impl Fn(usize) -> *const u16,
) {
    debug_assert!(hv.is_multiple_of(16) && block.len() == 16 && block.end <= np);
    debug_assert!(groups > 0 && parts.len().is_multiple_of(groups));
    let group = parts.len() / groups;
    let b0 = block.start;
    let c0 = first_cell % np;
    // Cells 0..head (partials c0.. of the block) if the first cell falls inside it.
    let head = if c0 > b0 && c0 < b0 + 16 {
        (b0 + 16 - c0).min(n)
    } else {
        0
    };
    // The first cell of partial b0; whole runs start every np cells from there.
    let start = (b0 + np - c0) % np;
    let runs = if start + 16 <= n {
        (n - start - 16) / np + 1
    } else {
        0
    };
    let tail = start + runs * np;
    let row_len = groups * hv;
    let chunk = (VSUM_CHUNK / (32 * row_len)).clamp(1, runs.max(1));
    // Each partial's cells in cell order: the head's cells come before every run's, the
    // tail's after. A macro, not a closure: a closure called from two places was left out
    // of line in the portable build, where it lacks the AVX-512 features of `R`'s
    // intrinsics and called each of them.
    macro_rules! one {
        ($k:expr, $i:expr) => {{
            let (k, i): (usize, usize) = ($k, $i);
            for (q, &dst) in parts.iter().enumerate() {
                let p = *prob(q).add(i);
                let src = v(i).add(q / group * hv);
                let mut d = 0;
                while d < hv {
                    let at = dst.add(k * hv + d);
                    R::madd(p, R::half(src.add(d)), R::load(at)).store(at);
                    d += R::N;
                }
            }
        }};
    }
    for i in 0..head {
        one!(c0 + i, i);
    }
    // The chunk starting at run `r0` (`rc` runs) has `rc * 16` rows of `row_bytes` each.
    let row_bytes = 2 * row_len;
    let chunk_row = |r0: usize, rk: usize| v(start + (r0 + rk / 16) * np + rk % 16).cast::<u8>();
    let passes = groups * (hv / R::N) * 4 * group.div_ceil(R::Q);
    if runs > 0 {
        for rk in 0..chunk.min(runs) * 16 {
            prefetch_lines(chunk_row(0, rk), row_bytes);
        }
    }
    // The lines of the chunk after the one at run `r0` (`rc` runs), a share before each
    // of the chunk's passes, so the memory streams while they compute. The share walks
    // the rows' lines with a cursor (a division per line cost more than the pass's
    // arithmetic).
    let ahead = |r0: usize, rc: usize| {
        let next = r0 + rc;
        let rows = if next < runs {
            chunk.min(runs - next) * 16
        } else {
            0
        };
        let per_pass = (rows * row_bytes.div_ceil(64)).div_ceil(passes.max(1));
        let (mut rk, mut off, mut p) = (0, 0, core::ptr::null());
        move || {
            let mut left = per_pass;
            while left > 0 && rk < rows {
                if off == 0 {
                    p = chunk_row(next, rk);
                }
                prefetch_lines(p.add(off), 64);
                left -= 1;
                off += 64;
                if off >= row_bytes {
                    (off, rk) = (0, rk + 1);
                }
            }
        }
    };
    if R::IN_PLACE {
        let mut r0 = 0;
        while r0 < runs {
            let rc = chunk.min(runs - r0);
            let first = start + r0 * np;
            let row = |g: usize, d: usize, j: usize, r: usize, k: usize| {
                v(first + r * np + j + k).add(g * hv + d)
            };
            let before = ahead(r0, rc);
            chunk_passes::<R>(parts, prob, group, hv, np, b0, first, rc, &row, before);
            r0 += rc;
        }
    } else {
        VSUM_ROWS.with(|buf| {
            let mut buf = buf.borrow_mut();
            let plane = chunk * 256 + 48;
            let len = row_len / 16 * plane;
            if buf.len() < len {
                buf.resize(len, 0);
            }
            // rows[(g * hv + d) / 16 * plane + r * 256 + 16 * k..][..16]: elements d.. of group
            // g's slice of row k of run r of the chunk.
            let rows = buf.as_mut_ptr();
            let mut r0 = 0;
            while r0 < runs {
                let rc = chunk.min(runs - r0);
                for r in 0..rc {
                    let i = start + (r0 + r) * np;
                    for k in 0..16 {
                        let src = v(i + k);
                        let mut e = 0;
                        while e < row_len {
                            let x = _mm256_loadu_si256(src.add(e).cast());
                            let dst = rows.add(e / 16 * plane + r * 256 + 16 * k);
                            _mm256_storeu_si256(dst.cast(), x);
                            e += 16;
                        }
                    }
                }
                let row = |g: usize, d: usize, j: usize, r: usize, k: usize| {
                    let slice = rows.add((g * hv + d) / 16 * plane + d % 16).cast_const();
                    slice.add(r * 256 + 16 * (j + k))
                };
                let (first, before) = (start + r0 * np, ahead(r0, rc));
                chunk_passes::<R>(parts, prob, group, hv, np, b0, first, rc, &row, before);
                r0 += rc;
            }
        });
    }
    for i in tail..n {
        one!((c0 + i) % np, i);
    }
}

/// Every pass of [`vsum_cells`] over one chunk of `rc` runs (the first at cell index
/// `first`): for each group, element block and quad of partials, the group's heads
/// `R::Q` at a time. `row(g, d, j, r, k)` is where the pass reads elements `d..` of group
/// `g`'s slice of row `j + k` of run `r`; `before` runs before each pass.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn chunk_passes<R: VReg>(
    parts: &[*mut f32],
    prob: &impl Fn(usize) -> *const f32,
    group: usize,
    hv: usize,
    np: usize,
    b0: usize,
    first: usize,
    rc: usize,
    row: &impl Fn(usize, usize, usize, usize, usize) -> *const u16,
    mut before: impl FnMut(),
) {
    for g in 0..parts.len() / group {
        let mut d = 0;
        while d < hv {
            for j in (0..16).step_by(4) {
                let mut q = g * group;
                while q < (g + 1) * group {
                    before();
                    let qe = (q + R::Q).min((g + 1) * group);
                    let run = VsumRuns {
                        runs: rc,
                        start: first,
                        np,
                        b0,
                        j,
                        d,
                        hv,
                        q,
                    };
                    let row = |r: usize, k: usize| row(g, d, j, r, k);
                    let qs = &parts[q..qe];
                    match qs.len() {
                        4 => run.add::<R, 4>(qs, prob, &row),
                        3 => run.add::<R, 3>(qs, prob, &row),
                        2 => run.add::<R, 2>(qs, prob, &row),
                        _ => run.add::<R, 1>(qs, prob, &row),
                    }
                    q = qe;
                }
            }
            d += R::N;
        }
    }
}

/// One pass of [`vsum_cells`] over a chunk of its runs: four partials (`b0 + j..`) of up to
/// four queries (`q..`) for the elements `d..` (one register's worth), each row's
/// elements converted once for all the queries.
struct VsumRuns {
    runs: usize,
    start: usize,
    np: usize,
    b0: usize,
    j: usize,
    d: usize,
    hv: usize,
    q: usize,
}

impl VsumRuns {
    /// `row(r, k)`: the pass's `R::N` elements of row `j + k` of run `r`.
    #[inline(always)]
    unsafe fn add<R: VReg, const Q: usize>(
        &self,
        parts: &[*mut f32],
        prob: &impl Fn(usize) -> *const f32,
        row: &impl Fn(usize, usize) -> *const u16,
    ) {
        let at = |q: usize, k: usize| parts[q].add((self.b0 + self.j + k) * self.hv + self.d);
        let pr: [*const f32; Q] = arr(|q| prob(self.q + q));
        let mut acc: [[R; 4]; Q] = arr(|q| arr(|k| R::load(at(q, k))));
        for r in 0..self.runs {
            let i = self.start + r * self.np + self.j;
            let x: [R; 4] = arr(|k| R::half(row(r, k)));
            for (a, p) in acc.iter_mut().zip(pr) {
                for k in 0..4 {
                    a[k] = R::madd(*p.add(i + k), x[k], a[k]);
                }
            }
        }
        for (q, a) in acc.iter().enumerate() {
            for (k, x) in a.iter().enumerate() {
                x.store(at(q, k));
            }
        }
    }
}

/// [`scores_tile`] on 256-bit registers for either flavor (`REGS` = the flavor's lanes /
/// 8): tiles of two queries by four keys; with 16 lanes the chains' low and high halves
/// (dims `l` and `l + 8` mod 16) are run one after the other and added before the
/// reduction, as the one-key kernel adds its two registers.
///
/// # Safety
/// AVX2, FMA and F16C; `hk % (8 * REGS) == 0`; otherwise as [`scores_tile`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn scores_tile_avx2<const REGS: usize>(
    q16: &[f32],
    m: usize,
    hk: usize,
    n: usize,
    key: &impl Fn(usize) -> *const u16,
    scale: f32,
    out: &mut [f32],
) {
    debug_assert!(hk.is_multiple_of(8 * REGS) && q16.len() >= m * hk && out.len() >= m * n);
    let sc = _mm256_set1_ps(scale);
    let qp = q16.as_ptr();
    let op = out.as_mut_ptr();
    let mut s = 0;
    while s < n {
        let nk = (n - s).min(QUAD);
        let rows: [*const u16; QUAD] = arr(|k| key(s + k.min(nk - 1)));
        let mut i = 0;
        while i < m {
            let nq = (m - i).min(2);
            let qs: [*const f32; 2] = arr(|k| qp.add((i + k.min(nq - 1)) * hk));
            // acc[2 * key + query]: after the reduction, lane 4 * query + key.
            let mut sum = [_mm256_setzero_ps(); 8];
            for h in 0..REGS {
                let mut acc = [_mm256_setzero_ps(); 8];
                let mut d = 8 * h;
                while d < hk {
                    let kv: [__m256; QUAD] =
                        arr(|k| _mm256_cvtph_ps(_mm_loadu_si128(rows[k].add(d).cast())));
                    for (qi, &q) in qs.iter().enumerate() {
                        let qv = _mm256_loadu_ps(q.add(d));
                        for (ki, &k) in kv.iter().enumerate() {
                            acc[2 * ki + qi] = _mm256_fmadd_ps(qv, k, acc[2 * ki + qi]);
                        }
                    }
                    d += 8 * REGS;
                }
                for (s, a) in sum.iter_mut().zip(acc) {
                    *s = if h == 0 { a } else { _mm256_add_ps(*s, a) };
                }
            }
            let f = _mm256_mul_ps(reduce8(&sum), sc);
            if nk == QUAD {
                _mm_storeu_ps(op.add(i * n + s), _mm256_castps256_ps128(f));
                if nq == 2 {
                    _mm_storeu_ps(op.add((i + 1) * n + s), _mm256_extractf128_ps::<1>(f));
                }
            } else {
                let mut lanes = [0.0f32; 8];
                _mm256_storeu_ps(lanes.as_mut_ptr(), f);
                for qi in 0..nq {
                    let dst = op.add((i + qi) * n + s);
                    for k in 0..nk {
                        *dst.add(k) = lanes[4 * qi + k];
                    }
                }
            }
            i += 2;
        }
        s += QUAD;
    }
}

/// The eight `hsum_float_8` sums of `acc` (high half plus low half, then `+ 2`, then
/// `+ 1`), the sum of `acc[j]` in lane `j / 2 + 4 * (j % 2)`: the same additions lane for
/// lane, the shuffles only move operands.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn reduce8(acc: &[__m256; 8]) -> __m256 {
    // y: [a: l0..4 + l4..8 | b: the same] per pair (a, b).
    let y: [__m256; 4] = arr(|p| {
        let (a, b) = (acc[2 * p], acc[2 * p + 1]);
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(a, b),
            _mm256_permute2f128_ps::<0x31>(a, b),
        )
    });
    // r_i + r_{i+2}: [a s0, a s1, c s0, c s1 | b s0, b s1, d s0, d s1].
    let s01 = _mm256_add_ps(
        _mm256_shuffle_ps::<0x44>(y[0], y[1]),
        _mm256_shuffle_ps::<0xEE>(y[0], y[1]),
    );
    let s23 = _mm256_add_ps(
        _mm256_shuffle_ps::<0x44>(y[2], y[3]),
        _mm256_shuffle_ps::<0xEE>(y[2], y[3]),
    );
    // s0 + s1: [acc0, acc2, acc4, acc6 | acc1, acc3, acc5, acc7].
    _mm256_add_ps(
        _mm256_shuffle_ps::<0x88>(s01, s23),
        _mm256_shuffle_ps::<0xDD>(s01, s23),
    )
}

/// The [`hsum`](crate::order::hsum) of each of the eight vectors of `lanes` (8 or 16)
/// values from `x` on, in order: with 16 lanes each vector's halves are added first (the
/// halving tree's first step), then [`reduce8`] does the rest for all eight at once.
///
/// # Safety
/// AVX2, FMA and F16C; `x` valid for `8 * lanes` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn vector_sums(x: *const f32, lanes: usize) -> [f32; 8] {
    debug_assert!(lanes == 8 || lanes == 16);
    let v: [__m256; 8] = arr(|j| {
        let p = x.add(j * lanes);
        if lanes == 16 {
            _mm256_add_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
        } else {
            _mm256_loadu_ps(p)
        }
    });
    let mut l = [0.0f32; 8];
    _mm256_storeu_ps(l.as_mut_ptr(), reduce8(&v));
    arr(|j| l[j / 2 + 4 * (j % 2)])
}

/// [`vsum_tile`] on 256-bit registers: 16 elements at a time.
///
/// # Safety
/// AVX2, FMA and F16C; `hv % 8 == 0`; every pointer valid for `hv` elements.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn vsum_tile_avx2(
    parts: &[*mut f32],
    hv: usize,
    cells: impl Iterator<Item = usize> + Clone,
    prob: &impl Fn(usize, usize) -> *const f32,
    v: &impl Fn(usize) -> *const u16,
) {
    vsum_tile_in::<__m256, 2>(parts, hv, cells, prob, v)
}
