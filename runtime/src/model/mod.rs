//! Decoder-only transformers, evaluated in batches: one `forward` call takes prompt chunks
//! and single decode tokens from several sequences together against the paged KV cache.
//! An architecture is a declaration (`arch.rs` builds a [`ModelSpec`] from the file); its
//! tensors are bound once by that declaration (`weights.rs`), each matrix with its
//! execution plan fixed at load (`crate::weights`); our CPU executor (`cpu.rs`, the
//! mixture of experts in `moe.rs`, attention in `attention.rs`) and the ggml graph of the
//! offloaded layers (`crate::offload`) both read the same declaration. The
//! single-sequence path is this path with one sequence.

pub mod arch;
mod attention;
mod cpu;
mod moe;
pub mod spec;
pub mod weights;

use std::path::Path;
use std::sync::Arc;

use quant::ops::act::Gelu;
use quant::ops::norm::rms_norm_rows;
use quant::GgmlType;

use crate::gguf::{GgufError, GgufFile, TensorInfo};
use crate::kv::{KvCache, KvError, KvLayout, SeqId};
use crate::matmul::{dequant_row, matmul, Numerics, UbPos};
use crate::numa::{
    page_placement, touch_pages, NumaError, PagePlacement, Topology, WeightPlacement,
};
use crate::offload::{DeviceBatch, DeviceLayers, OffloadError, OffloadSpec};
use crate::pool::ThreadPool;
use crate::weights::{Linear, Storage, WeightPlan, WeightStore};
use weights::{Binder, LayerW, Mat};

pub use arch::{Arch, Config, Pooling};
pub use spec::{Act, AttnSpec, FfnSpec, Gating, LayerSpec, ModelSpec, MoeSpec};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("unsupported model architecture {0:?} (supported: {names})", names = Arch::names())]
    UnknownArch(String),
    #[error("model metadata is missing required key {0:?}")]
    MissingKey(String),
    #[error("model is missing tensor {0:?}")]
    MissingTensor(String),
    #[error("tensor {name:?} has shape {found:?} and type {ty}, expected shape {expected:?}")]
    BadShape {
        name: String,
        found: Vec<u64>,
        expected: Vec<u64>,
        ty: GgmlType,
    },
    #[error("tensor {name:?} has type {ty}, which has no matrix kernel")]
    UnsupportedType { name: String, ty: GgmlType },
    #[error("unsupported model feature: {0}")]
    Unsupported(String),
    #[error("invalid model: {0}")]
    Invalid(String),
    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    BadToken { id: u32, n_vocab: usize },
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error(transparent)]
    Numa(#[from] NumaError),
    #[error(transparent)]
    Offload(#[from] crate::offload::OffloadError),
    #[error(
        "context full: sequence {seq} would reach {needed} positions, the context holds {n_ctx}"
    )]
    ContextFull {
        seq: SeqId,
        needed: usize,
        n_ctx: usize,
    },
}

/// A loaded model: dimensions, the declaration of its layers, small f32 tensors copied
/// out, matrices planned over the mapped file.
pub struct Model {
    pub config: Config,
    pub spec: ModelSpec,
    store: WeightStore,
    tok_embd: Linear,
    output: Linear,
    output_norm: Vec<f32>,
    layers: Vec<LayerW<Linear, Vec<f32>>>,
    gelu: Gelu,
    /// The last layers (and maybe the output layer) on a ggml device (`-ngl`).
    device: Option<DeviceLayers>,
}

/// Which logits a sequence in a batch wants back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    None,
    Last,
    All,
}

/// One sequence's share of a batch: its next tokens (a prompt chunk or one decode token).
#[derive(Clone, Debug)]
pub struct SeqBatch<'a> {
    pub seq: SeqId,
    pub tokens: &'a [u32],
    pub logits: Logits,
    /// How llama.cpp would split these tokens into micro-batches: that picks its
    /// attention and K-quant kernels and so their rounding, which ours follow to return
    /// its bits (see `quant::ops`, `quant::DotOrder`).
    pub ubatch: UBatch,
}

/// llama.cpp's micro-batches (its `n_ubatch` split) for the tokens of a [`SeqBatch`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UBatch {
    /// The tokens of this call form one micro-batch (what llama.cpp does for the same
    /// call when it is at most `n_ubatch` long; a generated token is one on its own).
    #[default]
    Call,
    /// Prompt tokens of a `len`-token prompt that llama.cpp evaluates from position 0 in
    /// micro-batches of `size` (its `n_ubatch`): the token at position `p` is token
    /// `p % size` of micro-batch `p / size`. A server that splits or partly caches a
    /// prompt passes this, so a sequence's results never depend on how it was scheduled.
    Prompt { len: usize, size: usize },
    /// Every token as if it were decoded alone (a micro-batch of one), however many the
    /// call holds: speculative verification, whose logits must be plain decoding's bit
    /// for bit while its products still read each weight once for all the tokens.
    Alone,
}

impl UBatch {
    /// The place of token `j` (at position `pos`) of a call of `n` tokens.
    fn place(self, n: usize, j: usize, pos: usize) -> UbPos {
        let (n, i) = match self {
            UBatch::Call => (n, j),
            UBatch::Alone => (1, 0),
            UBatch::Prompt { len, size } if pos < len && size > 0 => {
                let start = pos / size * size;
                (size.min(len - start), pos - start)
            }
            // A prompt description that does not cover this token: on its own.
            UBatch::Prompt { .. } => (1, 0),
        };
        UbPos {
            n: n as u32,
            i: i as u32,
        }
    }
}

/// The `Workspace::trace` hook: (tensor name, layer, values).
pub type TraceFn = Box<dyn FnMut(&str, usize, &[f32]) + Send>;

/// Reusable buffers for `forward`, grown on demand and never shrunk, so steady-state
/// decoding allocates nothing per token.
#[derive(Default)]
pub struct Workspace {
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    /// A fused product's output before it is split (QKV, gate/up).
    fused: Vec<f32>,
    xq: Vec<u8>,
    /// The mixture-of-experts step's scratch.
    moe: moe::MoeScratch,
    tok_pos: Vec<usize>,
    tok_seq: Vec<usize>,
    seq_slots: Vec<Vec<usize>>,
    out_rows: Vec<usize>,
    /// Each token's place in llama.cpp's micro-batch (`SeqBatch::ubatch`).
    tok_ub: Vec<UbPos>,
    /// The same for the rows with logits, in the last layer's feed-forward and the output
    /// projection, which llama.cpp runs on those rows only.
    out_ub: Vec<UbPos>,
    /// Logits of the rows asked for, `n_out x n_vocab`, in batch order.
    pub logits: Vec<f32>,
    /// How many rows of `xn` hold the last forward's final-norm hidden states (the rows
    /// with logits; 0 where a device computed the output).
    n_hidden: usize,
    /// Debugging hook: called with (name, layer, values) for the intermediate tensors of
    /// each forward pass (names follow llama.cpp's graph: `attn_norm`, `Qcur`, `kqv_out`,
    /// `ffn_out`, `l_out`, ...; layer is `usize::MAX` outside the layers).
    pub trace: Option<TraceFn>,
}

impl Workspace {
    /// The hidden state after the final norm of output row `r` of the last forward (the
    /// rows with logits, in batch order): what an embedding is pooled from. None where a
    /// device computed the output layer.
    pub fn hidden(&self, r: usize) -> Option<&[f32]> {
        if r >= self.n_hidden {
            return None;
        }
        let d = self.xn.len() / self.n_hidden;
        Some(&self.xn[r * d..(r + 1) * d])
    }
}

macro_rules! trace {
    ($ws:ident, $name:expr, $il:expr, $field:ident) => {
        if let Some(f) = $ws.trace.as_mut() {
            f($name, $il, &$ws.$field);
        }
    };
}
pub(crate) use trace;

pub(crate) fn f32_vec(f: &GgufFile, t: &TensorInfo) -> Result<Vec<f32>, ModelError> {
    let mut out = vec![0f32; t.n_elements() as usize];
    quant::dequantize_row(t.ty, f.tensor_data(t), &mut out).map_err(|_| {
        ModelError::UnsupportedType {
            name: t.name.clone(),
            ty: t.ty,
        }
    })?;
    Ok(out)
}

impl Model {
    /// Opens and builds the model in the exact numerics, its packable matrices packed.
    pub fn load(path: impl AsRef<Path>) -> Result<Model, ModelError> {
        Model::build(
            Arc::new(GgufFile::open(path)?),
            WeightPlan::default(),
            None,
            None,
        )
    }

    /// Builds the model over the mapped file, exact numerics, nothing packed.
    pub fn from_gguf(file: Arc<GgufFile>) -> Result<Model, ModelError> {
        let plan = WeightPlan {
            pack: false,
            ..WeightPlan::default()
        };
        Model::build(file, plan, None, None)
    }

    /// Declares the file's architecture, binds its tensors and lays the weights out as
    /// `plan` says (`topo` checks node memory for replication). `n_ctx` is the context
    /// the model will run with, where the architecture depends on it (Phi-3's LongRoPE).
    pub fn build(
        file: Arc<GgufFile>,
        plan: WeightPlan,
        topo: Option<&Topology>,
        n_ctx: Option<usize>,
    ) -> Result<Model, ModelError> {
        let (config, spec) = arch::declare(&file, n_ctx)?;
        let c = &config;
        let b = Binder { file: &file };
        let tok_embd = b.mat("token_embd.weight", c.n_embd, c.n_vocab)?;
        let output = if b.has("output.weight") {
            b.mat("output.weight", c.n_embd, c.n_vocab)?
        } else {
            tok_embd
        };
        let output_norm = b.vec("output_norm.weight", c.n_embd)?;
        let layers: Vec<LayerW<Mat, Vec<f32>>> = spec
            .layers
            .iter()
            .enumerate()
            .map(|(il, ls)| b.layer(c, il, ls))
            .collect::<Result<_, _>>()?;
        let mats = Self::planned_mats(&layers, output);
        let store = WeightStore::new(file.clone(), &mats, plan, topo)?;
        let layers = layers
            .iter()
            .map(|l| {
                l.map::<_, _, std::convert::Infallible>(&mut |m| Ok(store.linear(*m)), &mut |v| {
                    Ok(v.clone())
                })
                .unwrap_or_else(|e| match e {})
            })
            .collect();
        Ok(Model {
            tok_embd: store.linear(tok_embd),
            output: store.linear(output),
            output_norm,
            layers,
            store,
            config,
            spec,
            gelu: Gelu::new(),
            device: None,
        })
    }

    /// The matrices the forward pass multiplies by: every layer's, then the output's.
    fn planned_mats(layers: &[LayerW<Mat, Vec<f32>>], output: Mat) -> Vec<Mat> {
        layers
            .iter()
            .flat_map(|l| l.matrices().into_iter().copied())
            .chain([output])
            .collect()
    }

    fn matrices(&self) -> impl Iterator<Item = &Linear> + '_ {
        self.layers
            .iter()
            .flat_map(|l| l.matrices())
            .chain([&self.output])
    }

    /// Lays the weights out again for `plan` (same placement): how a model switches
    /// numerics or packing to compare them side by side. The decision stays in
    /// [`WeightStore::new`].
    fn replan(&mut self, plan: WeightPlan) {
        let mats: Vec<Mat> = self.matrices().map(|l| l.mat).collect();
        let file = self.store.file().clone();
        // Free the old packed rows before packing new ones.
        let old = std::mem::replace(
            &mut self.store,
            WeightStore::new(
                file.clone(),
                &[],
                WeightPlan {
                    pack: false,
                    placement: WeightPlacement::FirstTouch,
                    nodes: Vec::new(),
                    ..plan.clone()
                },
                None,
            )
            .expect("first-touch needs no memory"),
        );
        let placed = old.plan().placement != WeightPlacement::FirstTouch;
        drop(old);
        let plan = if placed {
            // Node copies are read as placed; re-copying is a new load's job.
            WeightPlan {
                placement: WeightPlacement::FirstTouch,
                nodes: Vec::new(),
                ..plan
            }
        } else {
            plan
        };
        self.store = WeightStore::new(file, &mats, plan, None).expect("first-touch");
        let store = &self.store;
        for l in &mut self.layers {
            *l = l
                .map::<_, _, std::convert::Infallible>(&mut |m| Ok(store.linear(m.mat)), &mut |v| {
                    Ok(v.clone())
                })
                .unwrap_or_else(|e| match e {});
        }
        self.tok_embd = store.linear(self.tok_embd.mat);
        self.output = store.linear(self.output.mat);
    }

    pub fn file(&self) -> &GgufFile {
        self.store.file()
    }

    /// Which kernel orders the matrix products use (`Exact` unless set).
    pub fn numerics(&self) -> Numerics {
        self.store.plan().numerics
    }

    /// Chooses llama.cpp's bit-exact kernel orders or the faster ones (see [`Numerics`]):
    /// the weights are laid out again for them (repacked where the numerics have packed
    /// kernels). A model is normally built with its numerics ([`Model::build`]); this is
    /// for comparing both on one model.
    pub fn set_numerics(&mut self, numerics: Numerics) {
        let plan = WeightPlan {
            numerics,
            ..self.store.plan().clone()
        };
        if plan != *self.store.plan() {
            self.replan(plan);
        }
    }

    /// Drops the repacked rows (the products then multiply the file's rows, with the
    /// same results), or packs them again: to compare the two layouts side by side.
    pub fn set_packing(&mut self, pack: bool) {
        let plan = WeightPlan {
            pack,
            ..self.store.plan().clone()
        };
        if plan != *self.store.plan() {
            self.replan(plan);
        }
    }

    /// Bytes of anonymous memory the repacked weights take (0 when none were packed).
    pub fn packed_bytes(&self) -> usize {
        self.store.packed_bytes()
    }

    /// Moves the last `spec.n_gpu_layers` layers (all of them and the output layer when it
    /// exceeds the layer count) to a ggml device: their weights are uploaded now, their
    /// KV cache (`n_slots` slots, the size of the `KvCache` this model will run with) is
    /// allocated there. `progress(done, total)` follows the upload. `-ngl 0` removes any
    /// offload and changes nothing else.
    pub fn offload(
        &mut self,
        spec: &OffloadSpec,
        n_slots: usize,
        threads: usize,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<(), OffloadError> {
        self.device = None;
        if spec.n_gpu_layers == 0 {
            return Ok(());
        }
        #[cfg(not(ggml))]
        {
            let _ = (n_slots, threads, progress);
            Err(OffloadError::NoGgml(
                ggml_sys::Ggml::global()
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default(),
            ))
        }
        #[cfg(ggml)]
        {
            use crate::offload::Weight;
            let _ = crate::offload::cuda_graphs_policy(true);
            let c = &self.config;
            let n = spec.n_gpu_layers.min(c.n_layer);
            let first = c.n_layer - n;
            let bytes = self.file().bytes();
            let weight = |m: &Mat| Weight::Mat {
                ty: m.ty,
                n_in: m.n_in,
                n_out: m.n_out,
                n_expert: m.n_expert,
                bytes: &bytes[m.start..m.start + m.len],
            };
            let layers: Vec<LayerW<Weight<'_>, &[f32]>> = self.layers[first..]
                .iter()
                .map(|l| {
                    l.map::<_, _, std::convert::Infallible>(&mut |m| Ok(weight(&m.mat)), &mut |v| {
                        Ok(v.as_slice())
                    })
                    .unwrap_or_else(|e| match e {})
                })
                .collect();
            let output = (spec.n_gpu_layers > c.n_layer)
                .then(|| (self.output_norm.as_slice(), weight(&self.output.mat)));
            let dev = DeviceLayers::new(
                c, &self.spec, first, &layers, output, n_slots, spec, threads, progress,
            )?;
            self.device = Some(dev);
            Ok(())
        }
    }

    /// The device layers, when offloaded.
    pub fn device_layers(&self) -> Option<&DeviceLayers> {
        self.device.as_ref()
    }

    pub fn weight_placement_mode(&self) -> WeightPlacement {
        self.store.plan().placement
    }

    /// A line saying what the weight placement costs in memory, for the binaries to print
    /// up front (`None` for first-touch, which copies nothing).
    pub fn weight_placement_note(&self) -> Option<String> {
        let c = self.store.copies()?;
        let nodes: Vec<String> = c
            .placement()
            .iter()
            .map(|(n, _)| n.map_or("interleaved".to_string(), |n| format!("node {n}")))
            .collect();
        Some(format!(
            "--numa-weights {}: {} cop{} of {} MiB ({}) = {} MiB of anonymous memory",
            self.store.plan().placement,
            c.len(),
            if c.len() == 1 { "y" } else { "ies" },
            (c.bytes() / c.len().max(1)) >> 20,
            nodes.join(", "),
            c.bytes() >> 20
        ))
    }

    /// Where the weight pages are now, per copy: `(None, pages)` for the mapped file or
    /// an interleaved copy, `(Some(node), pages)` per replica. Pages of the file that
    /// were never read count as absent.
    pub fn weight_pages(&self) -> Vec<(Option<usize>, PagePlacement)> {
        match self.store.copies() {
            Some(c) => c.placement(),
            None => {
                let f = self.file();
                let base = f.data_offset as usize;
                let b = &f.bytes()[base..];
                vec![(None, page_placement(b.as_ptr(), b.len()))]
            }
        }
    }

    /// Reads every page of the weights once (each copy), so they are resident.
    pub fn touch_weights(&self) -> u64 {
        let f = self.file();
        match self.store.copies() {
            Some(c) => (0..c.len())
                .map(|i| {
                    let base = c.base;
                    let len = f.bytes().len() - base;
                    touch_pages(c.slice(i, base, len))
                })
                .fold(0, u64::wrapping_add),
            None => touch_pages(&f.bytes()[f.data_offset as usize..]),
        }
    }

    /// The distinct types of the model's matrices with the instruction set and order of the
    /// kernels that multiply them: the set of the order llama.cpp gives a decode token's
    /// product with the type's largest matrix (the repacked order of MXFP4 and IQ4_NL
    /// matrices, whose kernels may be at another level than their one-row order's), or the
    /// fast set where the model runs `Numerics::Fast` and the type has one; sorted by type
    /// id.
    pub fn kernel_isas(&self) -> Vec<(GgmlType, quant::Isa, quant::DotOrder)> {
        let mut tys: Vec<(GgmlType, usize)> =
            self.matrices().map(|m| (m.mat.ty, m.mat.n_out)).collect();
        tys.sort_by_key(|&(t, n_out)| (t as u32, std::cmp::Reverse(n_out)));
        tys.dedup_by_key(|&mut (t, _)| t);
        tys.into_iter()
            .filter_map(|(t, n_out)| {
                let order = match self.numerics() {
                    Numerics::Exact => quant::kernels::dot_order_for(t, n_out, 1, 0),
                    Numerics::Fast => quant::DotOrder::Fast,
                };
                quant::kernels::kernels(t, order).map(|k| (t, k.isa, k.order))
            })
            .collect()
    }

    /// Whether the products of `ty` read repacked rows (`crate::packed`): at least one
    /// matrix of that type packed for the model's numerics.
    pub fn packed_type(&self, ty: GgmlType) -> bool {
        self.matrices()
            .any(|m| m.mat.ty == ty && m.storage == Storage::Packed)
    }

    /// Bytes of all weight tensors (what a forward pass streams).
    pub fn weight_bytes(&self) -> u64 {
        self.file().tensor_bytes()
    }

    /// Whether any layer routes its tokens to experts.
    pub fn is_moe(&self) -> bool {
        self.spec
            .layers
            .iter()
            .any(|l| matches!(l.ffn, FfnSpec::Moe(_)))
    }

    /// Bytes of weights one decoded token reads: every matrix, but only `n_used` of each
    /// layer's experts (the rest of the file is read by other tokens).
    pub fn active_weight_bytes(&self) -> u64 {
        let mut total: u64 = 0;
        for (l, s) in self.layers.iter().zip(&self.spec.layers) {
            let used = match &s.ffn {
                FfnSpec::Moe(m) => m.n_used,
                FfnSpec::Dense { .. } => 1,
            };
            for m in l.matrices() {
                let per = m.mat.len as u64 / m.mat.n_expert as u64;
                total += per * used.min(m.mat.n_expert) as u64;
            }
        }
        total + self.output.mat.len as u64
    }

    /// A KV cache layout for `n_ctx_tokens` positions in blocks of `block_size`.
    pub fn kv_layout(&self, n_ctx_tokens: usize, block_size: usize) -> KvLayout {
        let c = &self.config;
        KvLayout {
            n_layers: c.n_layer,
            n_kv_heads: c.n_head_kv,
            head_dim_k: c.head_dim_k,
            head_dim_v: c.head_dim_v,
            block_size,
            n_blocks: n_ctx_tokens.div_ceil(block_size),
        }
    }

    /// Evaluates one batch. Positions continue each sequence's current length in `kv`
    /// (sequences are created on first use). Returns the logits rows asked for, in batch
    /// order, in `ws.logits`. On error nothing is left reserved in the cache.
    pub fn forward(
        &self,
        batch: &[SeqBatch<'_>],
        kv: &mut KvCache,
        ws: &mut Workspace,
        pool: &ThreadPool,
        n_ctx: usize,
    ) -> Result<usize, ModelError> {
        let c = &self.config;
        for sb in batch {
            if let Some(&id) = sb.tokens.iter().find(|&&t| t as usize >= c.n_vocab) {
                return Err(ModelError::BadToken {
                    id,
                    n_vocab: c.n_vocab,
                });
            }
            let needed = kv.seq_len(sb.seq) + sb.tokens.len();
            if needed > n_ctx {
                return Err(ModelError::ContextFull {
                    seq: sb.seq,
                    needed,
                    n_ctx,
                });
            }
        }
        // Reserve positions for every sequence, all or nothing.
        let mut starts = Vec::with_capacity(batch.len());
        for sb in batch {
            let existed = kv.has_seq(sb.seq);
            let before = kv.seq_len(sb.seq);
            match kv.reserve(sb.seq, sb.tokens.len()) {
                Ok(s) => starts.push((s, before, existed)),
                Err(e) => {
                    undo_reservations(kv, batch, &starts)?;
                    return Err(e.into());
                }
            }
        }

        let n_tok: usize = batch.iter().map(|s| s.tokens.len()).sum();
        ws.n_hidden = 0;
        ws.tok_pos.clear();
        ws.tok_seq.clear();
        ws.out_rows.clear();
        ws.seq_slots.resize_with(batch.len(), Vec::new);
        ws.tok_ub.clear();
        ws.out_ub.clear();
        let mut row = 0;
        for (i, (sb, &(start, _, _))) in batch.iter().zip(&starts).enumerate() {
            let n = sb.tokens.len();
            for j in 0..n {
                ws.tok_pos.push(start + j);
                ws.tok_seq.push(i);
                let place = sb.ubatch.place(n, j, start + j);
                ws.tok_ub.push(place);
                match sb.logits {
                    Logits::None => {}
                    Logits::Last if j + 1 < n => {}
                    // llama.cpp's only output row of its micro-batch.
                    Logits::Last => {
                        ws.out_rows.push(row);
                        ws.out_ub.push(UbPos { n: 1, i: 0 });
                    }
                    Logits::All => {
                        ws.out_rows.push(row);
                        ws.out_ub.push(place);
                    }
                }
                row += 1;
            }
            kv.slots(sb.seq, start + sb.tokens.len(), &mut ws.seq_slots[i])?;
        }

        let d = c.n_embd;
        // Embeddings.
        ws.x.resize(n_tok * d, 0.0);
        for (t, &tok) in batch.iter().flat_map(|s| s.tokens.iter()).enumerate() {
            let xr = &mut ws.x[t * d..(t + 1) * d];
            dequant_row(&self.store.mat(&self.tok_embd, 0), tok as usize, xr);
            if self.spec.embd_scale != 1.0 {
                xr.iter_mut().for_each(|v| *v *= self.spec.embd_scale);
            }
        }

        let n_cpu = self.layers.len() - self.device.as_ref().map_or(0, |dv| dv.n_layers());
        for il in 0..n_cpu {
            cpu::layer_forward(self, il, n_tok, kv, ws, pool);
        }
        if n_cpu == self.layers.len() && !self.spec.out_rows_after_last_attn {
            // llama.cpp keeps every row through the last layer here (gpt-oss).
            cpu::keep_out_rows(ws, d);
        }
        if let Some(dev) = &self.device {
            let n_out = ws.out_rows.len();
            let db = DeviceBatch {
                x: &ws.x[..n_tok * d],
                pos: &ws.tok_pos,
                seq: &ws.tok_seq,
                seq_slots: &ws.seq_slots[..batch.len()],
                out_rows: &ws.out_rows,
            };
            let res = if kv.layout().n_blocks * kv.layout().block_size > dev.n_slots() {
                Err(OffloadError::Backend(format!(
                    "the KV cache has {} slots, the device cache {}",
                    kv.layout().n_blocks * kv.layout().block_size,
                    dev.n_slots()
                )))
            } else if dev.has_output() {
                dev.forward(&db, &mut ws.logits)
            } else {
                dev.forward(&db, &mut ws.proj)
            };
            if let Err(e) = res {
                // Leave the cache as it was: the step did not happen.
                undo_reservations(kv, batch, &starts)?;
                return Err(e.into());
            }
            if dev.has_output() {
                softcap(&mut ws.logits, self.spec.final_softcap);
                trace!(ws, "result_output", usize::MAX, logits);
                return Ok(n_out);
            }
            ws.x.clear();
            ws.x.extend_from_slice(&ws.proj[..n_out * d]);
        }

        // Final norm and logits; the last layer kept the rows with logits only.
        let n_out = ws.out_rows.len();
        ws.xn.resize(n_out * d, 0.0);
        rms_norm_rows(&mut ws.xn, &ws.x[..n_out * d], &self.output_norm, c.rms_eps);
        ws.n_hidden = n_out;
        trace!(ws, "result_norm", usize::MAX, xn);
        ws.logits.resize(n_out * c.n_vocab, 0.0);
        matmul(
            pool,
            &self.store.mat(&self.output, 0),
            &ws.xn,
            &ws.out_ub,
            &mut ws.xq,
            &mut ws.logits,
        );
        softcap(&mut ws.logits, self.spec.final_softcap);
        trace!(ws, "result_output", usize::MAX, logits);
        Ok(n_out)
    }
}

/// Undoes `forward`'s reservations (`starts`: each sequence's new start, its length
/// before, whether it existed) for the sequences reserved so far.
fn undo_reservations(
    kv: &mut KvCache,
    batch: &[SeqBatch<'_>],
    starts: &[(usize, usize, bool)],
) -> Result<(), KvError> {
    for (sb, &(_, before, existed)) in batch.iter().zip(starts) {
        if existed {
            kv.truncate(sb.seq, before)?;
        } else {
            kv.remove_seq(sb.seq);
        }
    }
    Ok(())
}

/// Logit soft-capping, `cap * tanh(v * (1 / cap))`, as ggml's scale, tanh, scale.
pub(crate) fn softcap(logits: &mut [f32], cap: Option<f32>) {
    if let Some(cap) = cap {
        let inv = 1.0 / cap;
        logits.iter_mut().for_each(|v| *v = (*v * inv).tanh() * cap);
    }
}
