//! Quantized matrix multiplication: `y[t][o] = dot(W[o], x[t])` with W kept in its GGUF
//! block format and the activations quantized once per row into W's `vec_dot_type`
//! (Q8_0, Q8_1 or Q8_K), exactly the scheme llama.cpp's CPU backend uses.

use quant::kernels::{dot_order_for, effective_order, kernels};
use quant::{ActSide, DotOrder, GgmlType, KernelSet, SideBuf, FAST_TILE_TOKENS, TILE_MAX_ROWS};

use crate::numa::WeightCopies;
use crate::pool::{SharedMut, ThreadPool};

/// How a model's matrix products sum their float parts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Numerics {
    /// llama.cpp's own kernel orders: every output bit-identical to the llama.cpp build
    /// we link (`--exact`).
    #[default]
    Exact,
    /// Faster orders where a format has one ([`DotOrder::Fast`]: the 32-element formats
    /// sum each block once, eight or sixteen weight rows per register; Q4_K and Q6_K keep
    /// one of llama.cpp's orders, the same for every token, on rows packed the same way);
    /// the others keep llama.cpp's. Results differ from llama.cpp's in the last bits; its
    /// fidelity is measured, not assumed. Still batch-invariant: every output is computed
    /// in the same order whatever its batch.
    Fast,
}

impl Numerics {
    pub fn name(self) -> &'static str {
        match self {
            Numerics::Exact => "exact",
            Numerics::Fast => "fast",
        }
    }
}

impl std::str::FromStr for Numerics {
    type Err = String;

    fn from_str(s: &str) -> Result<Numerics, String> {
        match s {
            "exact" => Ok(Numerics::Exact),
            "fast" => Ok(Numerics::Fast),
            other => Err(format!("unknown numerics {other:?} (exact or fast)")),
        }
    }
}

impl std::fmt::Display for Numerics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A 2-D weight matrix borrowed from the model file: `n_out` rows of `n_in` elements.
#[derive(Clone, Copy)]
pub struct MatRef<'a> {
    pub ty: GgmlType,
    pub n_in: usize,
    pub n_out: usize,
    pub data: &'a [u8],
    /// Per-node copies of the weights (`--numa-weights replicate`) and this matrix's
    /// offset in them: each task reads the copy of its thread's node.
    pub copies: Option<(&'a WeightCopies, usize)>,
    /// Which kernel orders the product may use.
    pub numerics: Numerics,
    /// The rows repacked for the fast order's kernels (`crate::packed`), where they were.
    pub packed: Option<&'a [u8]>,
}

impl std::fmt::Debug for MatRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MatRef")
            .field("ty", &self.ty)
            .field("n_in", &self.n_in)
            .field("n_out", &self.n_out)
            .field("copies", &self.copies.map(|(c, _)| c.len()))
            .finish()
    }
}

impl<'a> MatRef<'a> {
    /// The bytes the calling thread should read: its node's copy when there are several.
    #[inline]
    pub fn local(&self) -> &'a [u8] {
        match self.copies {
            Some((c, off)) if c.len() > 1 => c.local(off, self.data.len()),
            _ => self.data,
        }
    }

    pub fn row_bytes(&self) -> usize {
        self.ty
            .row_bytes(self.n_in as u64)
            .expect("validated at load") as usize
    }

    pub fn row(&self, o: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.data[o * rb..(o + 1) * rb]
    }
}

/// A token's place in llama.cpp's micro-batch (its `n_ubatch` split): `i` of `n` tokens.
/// It picks which kernel llama.cpp runs for K-quant weights, and so their rounding
/// ([`quant::kernels::dot_order_for`]); ours follow it to return llama.cpp's bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UbPos {
    pub n: u32,
    pub i: u32,
}

impl UbPos {
    /// The places of `n` tokens that form one micro-batch.
    pub fn batch(n: usize) -> impl Iterator<Item = UbPos> {
        (0..n as u32).map(move |i| UbPos { n: n as u32, i })
    }
}

/// Quantizes the rows of `x` (each `n_in` long) into activation blocks in `out` (exactly
/// their size), row `r` for the kernels `sets[orders[r]]` (empty `orders`: all
/// [`DotOrder::Single`]).
fn quantize_rows(
    pool: &ThreadPool,
    sets: &[KernelSet; 4],
    x: &[f32],
    n_in: usize,
    orders: &[DotOrder],
    out: &mut [u8],
) {
    let act = sets[0].act;
    let n_rows = x.len() / n_in;
    let rb = act.row_bytes(n_in as u64).expect("whole blocks") as usize;
    debug_assert_eq!(out.len(), n_rows * rb);
    if act == GgmlType::F32 {
        for (d, s) in out.chunks_exact_mut(4).zip(x) {
            d.copy_from_slice(&s.to_le_bytes());
        }
        return;
    }
    let dst = SharedMut::new(out);
    pool.run(n_rows, &|r| {
        // SAFETY: each task writes only its own row.
        let d = unsafe { dst.slice(r * rb, rb) };
        let ord = orders.get(r).copied().unwrap_or_default();
        sets[ord.index()]
            .quantize_activations(&x[r * n_in..(r + 1) * n_in], d)
            .expect("sizes match");
    });
}

/// Rows of W handled by one task: big enough to amortise dispatch, small enough to balance.
const ROWS_PER_TASK: usize = 16;

/// One product of a [`matmul_jobs`] call: `y = x · wᵀ` for the activation rows of `x`, one
/// per token, token `t` at place `ub[t]` of llama.cpp's micro-batch.
pub struct Job<'w, 'b> {
    pub w: MatRef<'w>,
    pub x: &'b [f32],
    pub ub: &'b [UbPos],
    pub y: &'b mut [f32],
}

/// One product of a [`matmul_jobs`] call, prepared: its kernels, each token's order, where
/// its quantized activations lie in the shared buffer, and its share of the tasks.
#[derive(Default)]
struct Prep {
    sets: Option<[KernelSet; 4]>,
    fast: bool,
    n_tok: usize,
    orders: Vec<DotOrder>,
    /// Byte range of its quantized activations in the call's buffer.
    xq: (usize, usize),
    xrb: usize,
    has_tile: bool,
    with_side: bool,
    side: SideBuf,
    rows_per_task: usize,
    n_tasks: usize,
}

impl Prep {
    fn set_of(&self, t: usize) -> &KernelSet {
        let sets = self.sets.as_ref().expect("prepared");
        &sets[self.orders.get(t).copied().unwrap_or_default().index()]
    }
}

/// `y = x · Wᵀ` for the activation rows of `x`, one per token, token `t` at place `ub[t]`
/// of llama.cpp's micro-batch (which picks the K-quant kernel order, see [`UbPos`]).
/// `xq` is scratch for the quantized activations.
pub fn matmul(
    pool: &ThreadPool,
    w: &MatRef<'_>,
    x: &[f32],
    ub: &[UbPos],
    xq: &mut Vec<u8>,
    y: &mut [f32],
) {
    matmul_jobs(pool, &mut [Job { w: *w, x, ub, y }], xq);
}

/// `ys[i] = x · ws[i]ᵀ` for matrices that share their input (Q, K and V; gate and up):
/// [`matmul_jobs`] with one input.
pub fn matmul_many(
    pool: &ThreadPool,
    ws: &[MatRef<'_>],
    x: &[f32],
    ub: &[UbPos],
    xq: &mut Vec<u8>,
    ys: &mut [&mut [f32]],
) {
    assert_eq!(ws.len(), ys.len(), "matmul_many: {} matrices", ws.len());
    let mut job = ws
        .iter()
        .zip(ys.iter_mut())
        .map(|(w, y)| Job { w: *w, x, ub, y });
    let mut next = || job.next().expect("counted");
    // No allocation for the usual two or three products.
    match ws.len() {
        2 => matmul_jobs(pool, &mut [next(), next()], xq),
        3 => matmul_jobs(pool, &mut [next(), next(), next()], xq),
        _ => matmul_jobs(pool, &mut job.collect::<Vec<_>>(), xq),
    }
}

/// Several products in one dispatch of the pool (every row of every matrix a task's
/// share): the products of a layer that share their input (Q, K and V; gate and up;
/// their activations are quantized once per distinct kernel choice), or the experts of
/// a mixture each over its own tokens. Every output is the one [`matmul`] gives alone
/// (same kernels, same orders, same activation bits).
pub fn matmul_jobs(pool: &ThreadPool, jobs: &mut [Job<'_, '_>], xq: &mut Vec<u8>) {
    let jobs_n = jobs.len();
    if jobs_n == 0 {
        return;
    }
    let mut preps = PREPS.with(|s| std::mem::take(&mut *s.borrow_mut()));
    preps.resize_with(jobs_n, Prep::default);
    let mut xq_len = 0;
    // Each product looks back at the earlier ones (shared activations): by index.
    #[allow(clippy::needless_range_loop)]
    for i in 0..jobs_n {
        let (before, rest) = preps.split_at_mut(i);
        let p = &mut rest[0];
        let (w, x, ub) = (&jobs[i].w, jobs[i].x, jobs[i].ub);
        let n_tok = ub.len();
        p.n_tok = n_tok;
        debug_assert_eq!(x.len(), n_tok * w.n_in);
        debug_assert_eq!(jobs[i].y.len(), n_tok * w.n_out);
        // The fast order, where asked for and the format has a SIMD kernel for it, serves
        // every token (one order for all, so a token's result never depends on its batch).
        let fast = (w.numerics == Numerics::Fast)
            .then(|| kernels(w.ty, DotOrder::Fast))
            .flatten()
            .filter(|k| k.order == DotOrder::Fast);
        let sets = match fast {
            Some(k) => [k; 4],
            None => DotOrder::ALL.map(|o| kernels(w.ty, o).expect("checked at load")),
        };
        p.sets = Some(sets);
        p.fast = fast.is_some();
        p.orders.clear();
        if fast.is_none() {
            p.orders.extend(ub.iter().map(|u| {
                effective_order(
                    w.ty,
                    dot_order_for(w.ty, w.n_out, u.n as usize, u.i as usize),
                )
            }));
        }
        if p.orders.iter().all(|&o| o == DotOrder::Single) {
            p.orders.clear();
        }
        p.xrb = sets[0].act.row_bytes(w.n_in as u64).expect("whole blocks") as usize;
        // The same input, weight type and token orders quantize the activations
        // identically: share an earlier product's rows.
        let same = before.iter().zip(jobs.iter()).find(|(q, qj)| {
            qj.w.ty == w.ty && std::ptr::eq(qj.x, x) && q.fast == p.fast && q.orders == p.orders
        });
        p.xq = match same {
            Some((q, _)) => q.xq,
            None => {
                let r = (xq_len, xq_len + n_tok * p.xrb);
                xq_len = r.1;
                r
            }
        };
    }
    xq.resize(xq_len, 0);
    for (i, job) in jobs.iter().enumerate() {
        let (before, rest) = preps.split_at_mut(i);
        let p = &mut rest[0];
        let (w, x) = (&job.w, job.x);
        let n_tok = p.n_tok;
        let sets = p.sets.expect("prepared");
        if !before.iter().any(|q| q.xq == p.xq) {
            quantize_rows(pool, &sets, x, w.n_in, &p.orders, &mut xq[p.xq.0..p.xq.1]);
        }
        let n_out = w.n_out;
        // Few tokens: the weights stream from memory, and longer contiguous runs per task
        // keep the hardware prefetchers on one stream (as long as every thread still gets
        // several tasks to balance): 256 rows, where 64 gave qwen2.5 tg128 54 vs 64 t/s and
        // gemma3 84 vs 93 (three alternated rounds, Zen 4, t=2). Many tokens: small tasks,
        // the tile is compute-bound.
        let mut rows_per_task = if n_tok <= 2 {
            16 * ROWS_PER_TASK
        } else {
            ROWS_PER_TASK
        };
        while rows_per_task > ROWS_PER_TASK && n_out < 4 * pool.n_threads() * rows_per_task {
            rows_per_task /= 2;
        }
        p.rows_per_task = rows_per_task;
        p.n_tasks = if n_tok == 0 {
            0
        } else {
            n_out.div_ceil(rows_per_task)
        };
        p.has_tile = sets.iter().all(|k| k.tile.is_some());
        // For token tiles, the per-block activation data (scales widened to f32, offset
        // sums) is computed once here instead of in every weight row's kernel call (same
        // bits); for one token too where the kernels want offset sums (each call of 8-16
        // rows would otherwise sum the token's lanes again).
        p.side.clear();
        p.with_side =
            p.has_tile && (n_tok > 1 || p.fast || sets.iter().any(|k| k.uses_offset_sums()));
        if p.with_side {
            let a = &xq[p.xq.0..p.xq.1];
            for t in 0..n_tok {
                let set = &sets[p.orders.get(t).copied().unwrap_or_default().index()];
                p.side.push(set, &a[t * p.xrb..(t + 1) * p.xrb]);
            }
        }
    }
    let xq: &[u8] = xq;
    let mut outs = OUTS.with(|s| std::mem::take(&mut *s.borrow_mut()));
    outs.clear();
    outs.extend(jobs.iter_mut().map(|j| SharedMut::new(&mut *j.y)));
    // From here the outputs are written through `outs` only.
    let jobs: &[Job<'_, '_>] = jobs;
    let n_tasks: usize = preps.iter().map(|p| p.n_tasks).sum();
    let (preps_ref, outs_ref): (&[Prep], &[SharedMut<f32>]) = (&preps, &outs);
    let dispatch = || {
        pool.run(n_tasks, &|task| {
            let (mut k, mut task) = (0, task);
            while task >= preps_ref[k].n_tasks {
                task -= preps_ref[k].n_tasks;
                k += 1;
            }
            let p = &preps_ref[k];
            product_task(
                p,
                &jobs[k].w,
                &xq[p.xq.0..p.xq.1],
                p.n_tok,
                outs_ref[k],
                task,
            );
        })
    };
    // One or two tokens over packed K-quant rows: the weights stream, at the prefetch
    // distance the tuner picks (`crate::tune`; x86 kernels only read it).
    let streamed = cfg!(target_arch = "x86_64")
        && preps.iter().all(|p| p.n_tok <= 2)
        && jobs.iter().all(|j| {
            matches!(j.w.ty, GgmlType::Q4_K | GgmlType::Q6_K | GgmlType::MXFP4)
                && j.w.packed.is_some()
        });
    if streamed {
        let bytes = jobs.iter().map(|j| j.w.data.len() as u64).sum();
        crate::tune::decode_dispatch(bytes, dispatch);
    } else {
        dispatch();
    }
    PREPS.with(|s| *s.borrow_mut() = preps);
    OUTS.with(|s| *s.borrow_mut() = outs);
}

/// Task `task` of one prepared product: its rows `[o0, o1)` for every token.
fn product_task(
    p: &Prep,
    w: &MatRef<'_>,
    xq: &[u8],
    n_tok: usize,
    out: SharedMut<f32>,
    task: usize,
) {
    let n_out = w.n_out;
    let xrb = p.xrb;
    let wdata = w.local();
    let wrb = w.row_bytes();
    let o0 = task * p.rows_per_task;
    let o1 = (o0 + p.rows_per_task).min(n_out);
    // The packed rows serve the sets with packed kernels, where the weights are read from
    // one place.
    let packed = w
        .packed
        .filter(|_| w.copies.is_none_or(|(c, _)| c.len() <= 1));
    if !p.has_tile {
        for t in 0..n_tok {
            let dot = p.set_of(t).dot;
            let a = &xq[t * xrb..(t + 1) * xrb];
            // SAFETY: tasks own disjoint column ranges [o0, o1) of every row.
            let yrow = unsafe { out.slice(t * n_out + o0, o1 - o0) };
            for (o, yv) in (o0..o1).zip(yrow.iter_mut()) {
                *yv = dot(&wdata[o * wrb..(o + 1) * wrb], a);
            }
        }
        return;
    }
    // Tiles of up to `tile_tokens` token rows in one kernel order: each weight row is
    // unpacked once per tile instead of once per token. Each result is bit-identical to
    // the one-row dot in its order.
    let mut t = 0;
    while t < n_tok {
        let set = p.set_of(t);
        // Packed tiles take more tokens per call than the file rows' tiles of some sets.
        let max_k = match (set.packed_into, packed) {
            (Some(_), Some(_)) => set.packed_tokens,
            _ => set.tile_tokens,
        };
        let mut k = 1;
        while k < max_k && t + k < n_tok && p.set_of(t + k).order == set.order {
            k += 1;
        }
        let a = &xq[t * xrb..(t + k) * xrb];
        let side = if p.with_side {
            p.side.rows(set, t, t + k)
        } else {
            ActSide::default()
        };
        // Kernels that write straight into y (eight rows of a token are one store): over
        // the rows repacked at load where there are some (one sequential stream per group
        // of eight, already in the kernel's order; `o0`, `o1` are multiples of eight, so
        // a call takes one or two whole groups), else over the file's rows.
        // One or two tokens: as many rows per call as the kernel streams (a K-quant
        // decode task is one call, its arguments checked once).
        let into = match (set.packed_into, packed) {
            (Some(into), Some(packed)) if k <= 2 => Some((into, packed, set.stream_rows)),
            (Some(into), Some(packed)) => Some((into, packed, set.packed_rows)),
            _ => set.tile_into.map(|into| (into, wdata, set.tile_rows)),
        };
        if let Some((into, rows_of, max_rows)) = into {
            let mut o = o0;
            while o < o1 {
                let rows = (o1 - o).min(max_rows);
                let wr = &rows_of[o * wrb..(o + rows) * wrb];
                // SAFETY: the slots (t + c) * n_out + o + r (c < k, r < rows) are in y
                // and in this task's columns [o0, o1), which no other task writes.
                unsafe { into(wr, rows, a, xrb, side, k, out.0.add(t * n_out + o), n_out) };
                o += rows;
            }
            t += k;
            continue;
        }
        let tile = set.tile.expect("every order has a tile kernel");
        let mut ys: [&mut [f32]; FAST_TILE_TOKENS] = std::array::from_fn(|_| Default::default());
        for (c, ys) in ys.iter_mut().enumerate().take(k) {
            // SAFETY: tasks own disjoint column ranges [o0, o1) of every row.
            *ys = unsafe { out.slice((t + c) * n_out + o0, o1 - o0) };
        }
        let mut r = [0.0f32; TILE_MAX_ROWS * FAST_TILE_TOKENS];
        let mut o = o0;
        while o < o1 {
            let rows = (o1 - o).min(set.tile_rows);
            let wr = &wdata[o * wrb..(o + rows) * wrb];
            tile(wr, rows, a, xrb, side, &mut r[..rows * k]);
            for q in 0..rows {
                for c in 0..k {
                    ys[c][o + q - o0] = r[q * k + c];
                }
            }
            o += rows;
        }
        t += k;
    }
}

thread_local! {
    /// The products' preparations (their side data and token orders keep their memory
    /// between calls on this thread).
    static PREPS: std::cell::RefCell<Vec<Prep>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Each product's output, as the tasks write it.
    static OUTS: std::cell::RefCell<Vec<SharedMut<f32>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Dequantizes row `r` of `w` into `out` (embedding lookup).
pub fn dequant_row(w: &MatRef<'_>, r: usize, out: &mut [f32]) {
    quant::dequantize_row(w.ty, w.row(r), out).expect("sizes match");
}
