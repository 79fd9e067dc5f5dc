//! Decoder-only transformer for the llama, qwen2 and gemma3 architectures, evaluated in
//! batches: one `forward` call takes prompt chunks and single decode tokens from several
//! sequences together against the paged KV cache. The single-sequence path is this path
//! with one sequence.

mod attention;
pub mod config;

use std::path::Path;
use std::sync::Arc;

use quant::ops::act::{swiglu, Gelu};
use quant::ops::norm::{rms_norm, rms_norm_rows};
use quant::ops::rope::Rope;
use quant::order::flavor;
use quant::GgmlType;

use crate::gguf::{GgufError, GgufFile, TensorInfo};
use crate::kv::{KvCache, KvError, KvLayout, SeqId};
use crate::matmul::{dequant_row, matmul, matmul_many, MatRef, Numerics, UbPos};
use crate::numa::{
    page_placement, touch_pages, NumaError, PagePlacement, Topology, WeightCopies, WeightPlacement,
};
use crate::offload::{DeviceBatch, DeviceLayers, OffloadError, OffloadSpec};
use crate::packed::{PackSource, PackedWeights};
use crate::pool::{SharedMut, ThreadPool};
use attention::{attention, AttnShape, AttnTokens};

pub use config::{Arch, Config};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("unknown model architecture {0:?} (supported: llama, qwen2, gemma3)")]
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

/// A matrix in the mapped file, by location.
#[derive(Clone, Copy, Debug)]
struct Mat {
    ty: GgmlType,
    n_in: usize,
    n_out: usize,
    start: usize,
    len: usize,
}

struct Layer {
    attn_norm: Vec<f32>,
    wq: Mat,
    wk: Mat,
    wv: Mat,
    wo: Mat,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    post_attn_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    gate: Mat,
    up: Mat,
    down: Mat,
    post_ffn_norm: Option<Vec<f32>>,
    rope: Rope,
}

/// A loaded model: hyperparameters, small f32 tensors copied out, matrices borrowed from
/// the mapped file.
pub struct Model {
    pub config: Config,
    file: Arc<GgufFile>,
    tok_embd: Mat,
    output: Mat,
    output_norm: Vec<f32>,
    layers: Vec<Layer>,
    gelu: Gelu,
    /// Weights copied into node memory (`--numa-weights interleave|replicate`); `None`
    /// reads them from the mapped file.
    copies: Option<WeightCopies>,
    placement: WeightPlacement,
    numerics: Numerics,
    /// The fast order's matrices repacked into interleaved row groups (`crate::packed`),
    /// made when the fast order is chosen and the weights stay in the mapped file.
    packed: Option<PackedWeights>,
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
}

impl UBatch {
    /// The place of token `j` (at position `pos`) of a call of `n` tokens.
    fn place(self, n: usize, j: usize, pos: usize) -> UbPos {
        let (n, i) = match self {
            UBatch::Call => (n, j),
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
    xq: Vec<u8>,
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
    /// Debugging hook: called with (name, layer, values) for the intermediate tensors of
    /// each forward pass (names follow llama.cpp's graph: `attn_norm`, `Qcur`, `kqv_out`,
    /// `ffn_out`, `l_out`, ...; layer is `usize::MAX` outside the layers).
    pub trace: Option<TraceFn>,
}

macro_rules! trace {
    ($ws:ident, $name:expr, $il:expr, $field:ident) => {
        if let Some(f) = $ws.trace.as_mut() {
            f($name, $il, &$ws.$field);
        }
    };
}

fn f32_vec(f: &GgufFile, t: &TensorInfo) -> Result<Vec<f32>, ModelError> {
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
        let mut m = Model::from_gguf(Arc::new(GgufFile::open(path)?))?;
        m.set_numerics(Numerics::Exact);
        Ok(m)
    }

    /// Builds the model over the mapped file, exact numerics, nothing packed yet: the
    /// caller packs once its numerics and weight placement are final
    /// ([`Model::set_numerics`]), so no packing is done twice.
    pub fn from_gguf(file: Arc<GgufFile>) -> Result<Model, ModelError> {
        let config = Config::from_gguf(&file)?;
        let c = &config;
        let tensor = |name: &str| {
            file.tensor(name)
                .ok_or_else(|| ModelError::MissingTensor(name.to_string()))
        };
        let mat = |name: &str, n_in: usize, n_out: usize| -> Result<Mat, ModelError> {
            let t = tensor(name)?;
            if t.shape != [n_in as u64, n_out as u64] {
                return Err(ModelError::BadShape {
                    name: name.into(),
                    found: t.shape.clone(),
                    expected: vec![n_in as u64, n_out as u64],
                    ty: t.ty,
                });
            }
            if !quant::has_vec_dot(t.ty) {
                return Err(ModelError::UnsupportedType {
                    name: name.into(),
                    ty: t.ty,
                });
            }
            Ok(Mat {
                ty: t.ty,
                n_in,
                n_out,
                start: (file.data_offset + t.offset) as usize,
                len: t.size as usize,
            })
        };
        let vec = |name: &str, n: usize| -> Result<Vec<f32>, ModelError> {
            let t = tensor(name)?;
            if t.n_elements() != n as u64 {
                return Err(ModelError::BadShape {
                    name: name.into(),
                    found: t.shape.clone(),
                    expected: vec![n as u64],
                    ty: t.ty,
                });
            }
            f32_vec(&file, t)
        };
        let opt_vec = |name: &str, n: usize| -> Result<Option<Vec<f32>>, ModelError> {
            if file.tensor(name).is_some() {
                vec(name, n).map(Some)
            } else {
                Ok(None)
            }
        };

        let tok_embd = mat("token_embd.weight", c.n_embd, c.n_vocab)?;
        let output = if file.tensor("output.weight").is_some() {
            mat("output.weight", c.n_embd, c.n_vocab)?
        } else {
            tok_embd
        };
        let output_norm = vec("output_norm.weight", c.n_embd)?;
        let freq_factors = opt_vec("rope_freqs.weight", c.n_rot / 2)?;
        let gemma = c.arch == Arch::Gemma3;
        let q_dim = c.n_head * c.head_dim_k;
        let k_dim = c.n_head_kv * c.head_dim_k;
        let v_dim = c.n_head_kv * c.head_dim_v;
        let mut layers = Vec::with_capacity(c.n_layer);
        for il in 0..c.n_layer {
            let n = |s: &str| format!("blk.{il}.{s}");
            let swa = c.swa_layers[il];
            layers.push(Layer {
                attn_norm: vec(&n("attn_norm.weight"), c.n_embd)?,
                wq: mat(&n("attn_q.weight"), c.n_embd, q_dim)?,
                wk: mat(&n("attn_k.weight"), c.n_embd, k_dim)?,
                wv: mat(&n("attn_v.weight"), c.n_embd, v_dim)?,
                wo: mat(&n("attn_output.weight"), c.n_head * c.head_dim_v, c.n_embd)?,
                bq: opt_vec(&n("attn_q.bias"), q_dim)?,
                bk: opt_vec(&n("attn_k.bias"), k_dim)?,
                bv: opt_vec(&n("attn_v.bias"), v_dim)?,
                q_norm: if gemma {
                    Some(vec(&n("attn_q_norm.weight"), c.head_dim_k)?)
                } else {
                    None
                },
                k_norm: if gemma {
                    Some(vec(&n("attn_k_norm.weight"), c.head_dim_k)?)
                } else {
                    None
                },
                post_attn_norm: if gemma {
                    Some(vec(&n("post_attention_norm.weight"), c.n_embd)?)
                } else {
                    None
                },
                ffn_norm: vec(&n("ffn_norm.weight"), c.n_embd)?,
                gate: mat(&n("ffn_gate.weight"), c.n_embd, c.n_ff)?,
                up: mat(&n("ffn_up.weight"), c.n_embd, c.n_ff)?,
                down: mat(&n("ffn_down.weight"), c.n_ff, c.n_embd)?,
                post_ffn_norm: if gemma {
                    Some(vec(&n("post_ffw_norm.weight"), c.n_embd)?)
                } else {
                    None
                },
                rope: Rope {
                    style: c.arch.rope_style(),
                    n_dims: c.n_rot,
                    freq_base: if swa {
                        c.rope_freq_base_swa
                    } else {
                        c.rope_freq_base
                    },
                    freq_scale: c.rope_freq_scale,
                    freq_factors: freq_factors.clone(),
                },
            });
        }
        Ok(Model {
            config,
            file,
            tok_embd,
            output,
            output_norm,
            layers,
            gelu: Gelu::new(),
            copies: None,
            placement: WeightPlacement::FirstTouch,
            numerics: Numerics::Exact,
            packed: None,
            device: None,
        })
    }

    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    fn m(&self, m: &Mat) -> MatRef<'_> {
        let (data, copies) = match &self.copies {
            Some(c) => (c.slice(0, m.start, m.len), Some((c, m.start))),
            None => (&self.file.bytes()[m.start..m.start + m.len], None),
        };
        MatRef {
            ty: m.ty,
            n_in: m.n_in,
            n_out: m.n_out,
            data,
            copies,
            numerics: self.numerics,
            packed: match (&self.packed, &self.copies) {
                (Some(p), None) if p.numerics() == self.numerics => p.get(m.start),
                _ => None,
            },
        }
    }

    /// Which kernel orders the matrix products use (`Exact` unless set).
    pub fn numerics(&self) -> Numerics {
        self.numerics
    }

    /// Chooses llama.cpp's bit-exact kernel orders or the faster ones (see [`Numerics`]).
    ///
    /// The matrices with packed kernels for these numerics are repacked here, once per
    /// change of numerics (eight rows interleaved block by block, `crate::packed`: Q4_1,
    /// Q5_1, Q4_K and Q6_K in both modes, Q4_0, Q5_0 and Q8_0 in the fast one), unless
    /// `RLLAMA_NO_PACK` is set or the weights were placed in node memory: the same bits,
    /// read as one stream. Packing is only a speed-up: where its memory cannot be had the
    /// model says so and multiplies the file's rows.
    pub fn set_numerics(&mut self, numerics: Numerics) {
        self.numerics = numerics;
        if self.copies.is_some()
            || std::env::var_os("RLLAMA_NO_PACK").is_some_and(|v| !v.is_empty() && v != "0")
        {
            self.packed = None;
            return;
        }
        if self
            .packed
            .as_ref()
            .is_some_and(|p| p.numerics() == numerics)
        {
            return;
        }
        self.packed = None;
        let mats: Vec<PackSource> = self
            .matrices()
            .map(|m| PackSource {
                ty: m.ty,
                n_in: m.n_in,
                n_out: m.n_out,
                start: m.start,
                len: m.len,
            })
            .collect();
        // The packed rows are what the products read from now on: each matrix's pages in
        // the file need not stay resident beside them once it is packed.
        let file = self.file.clone();
        match PackedWeights::new(self.file.bytes(), &mats, numerics, &|start, len| {
            file.release_range(start, len)
        }) {
            Ok(p) => self.packed = p,
            Err(e) => eprintln!(
                "warning: the weights were not repacked ({e}); \
                 multiplying the file's rows (same results, slower)"
            ),
        }
    }

    /// Drops the repacked rows (the fast order then multiplies the file's rows, with the
    /// same results), or packs them again: to compare the two layouts side by side.
    pub fn set_packing(&mut self, pack: bool) {
        if pack {
            self.set_numerics(self.numerics);
        } else {
            self.packed = None;
        }
    }

    /// Bytes of anonymous memory the repacked weights take (0 when none were packed).
    pub fn packed_bytes(&self) -> usize {
        self.packed.as_ref().map_or(0, PackedWeights::bytes)
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
            use crate::offload::{LayerWeights, Weight};
            let _ = crate::offload::cuda_graphs_policy(true);
            let c = &self.config;
            let n = spec.n_gpu_layers.min(c.n_layer);
            let first = c.n_layer - n;
            let bytes = self.file.bytes();
            let mat = |m: &Mat| Weight::Mat {
                ty: m.ty,
                n_in: m.n_in,
                n_out: m.n_out,
                bytes: &bytes[m.start..m.start + m.len],
            };
            let layers: Vec<LayerWeights<'_>> = self.layers[first..]
                .iter()
                .enumerate()
                .map(|(j, l)| LayerWeights {
                    attn_norm: &l.attn_norm,
                    wq: mat(&l.wq),
                    wk: mat(&l.wk),
                    wv: mat(&l.wv),
                    wo: mat(&l.wo),
                    bq: l.bq.as_deref(),
                    bk: l.bk.as_deref(),
                    bv: l.bv.as_deref(),
                    q_norm: l.q_norm.as_deref(),
                    k_norm: l.k_norm.as_deref(),
                    post_attn_norm: l.post_attn_norm.as_deref(),
                    ffn_norm: &l.ffn_norm,
                    gate: mat(&l.gate),
                    up: mat(&l.up),
                    down: mat(&l.down),
                    post_ffn_norm: l.post_ffn_norm.as_deref(),
                    freq_base: l.rope.freq_base,
                    swa: c.swa_layers[first + j],
                })
                .collect();
            let output = (spec.n_gpu_layers > c.n_layer)
                .then(|| (self.output_norm.as_slice(), mat(&self.output)));
            let ff = self
                .layers
                .first()
                .and_then(|l| l.rope.freq_factors.as_deref());
            let dev = DeviceLayers::new(
                c,
                first,
                &layers,
                output,
                ff,
                n_slots,
                spec.device.as_deref(),
                threads,
                progress,
            )?;
            self.device = Some(dev);
            Ok(())
        }
    }

    /// The device layers, when offloaded.
    pub fn device_layers(&self) -> Option<&DeviceLayers> {
        self.device.as_ref()
    }

    /// Moves the weights where `placement` says (before the model is shared): an
    /// interleaved copy over `nodes`, or one copy per node of `nodes`. First-touch keeps
    /// (or goes back to) the mapped file.
    pub fn place_weights(
        &mut self,
        placement: WeightPlacement,
        nodes: &[usize],
        topo: Option<&Topology>,
    ) -> Result<(), NumaError> {
        let base = self.file.data_offset as usize;
        let src = &self.file.bytes()[base..];
        self.copies = WeightCopies::new(src, base, placement, nodes, topo)?;
        self.placement = placement;
        // Placed copies are read as placed: the packed rows (one copy, wherever the
        // packing threads touched it) would bypass them.
        if self.copies.is_some() {
            self.packed = None;
        } else if self.packed.is_none() {
            self.set_numerics(self.numerics);
        }
        Ok(())
    }

    pub fn weight_placement_mode(&self) -> WeightPlacement {
        self.placement
    }

    /// A line saying what the weight placement costs in memory, for the binaries to print
    /// up front (`None` for first-touch, which copies nothing).
    pub fn weight_placement_note(&self) -> Option<String> {
        let c = self.copies.as_ref()?;
        let nodes: Vec<String> = c
            .placement()
            .iter()
            .map(|(n, _)| n.map_or("interleaved".to_string(), |n| format!("node {n}")))
            .collect();
        Some(format!(
            "--numa-weights {}: {} cop{} of {} MiB ({}) = {} MiB of anonymous memory",
            self.placement,
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
        match &self.copies {
            Some(c) => c.placement(),
            None => {
                let base = self.file.data_offset as usize;
                let b = &self.file.bytes()[base..];
                vec![(None, page_placement(b.as_ptr(), b.len()))]
            }
        }
    }

    /// Reads every page of the weights once (each copy), so they are resident.
    pub fn touch_weights(&self) -> u64 {
        match &self.copies {
            Some(c) => (0..c.len())
                .map(|i| {
                    let base = c.base;
                    let len = self.file.bytes().len() - base;
                    touch_pages(c.slice(i, base, len))
                })
                .fold(0, u64::wrapping_add),
            None => touch_pages(&self.file.bytes()[self.file.data_offset as usize..]),
        }
    }

    /// The distinct types of the model's matrices with the instruction set and order of the
    /// kernels that multiply them: the one-row order's set (the other llama.cpp orders of a
    /// type come from the same table at the same level), or the fast set where the model
    /// runs `Numerics::Fast` and the type has one; sorted by type id.
    pub fn kernel_isas(&self) -> Vec<(GgmlType, quant::Isa, quant::DotOrder)> {
        let mut tys: Vec<GgmlType> = self.matrices().map(|m| m.ty).collect();
        tys.sort_by_key(|&t| t as u32);
        tys.dedup();
        tys.into_iter()
            .filter_map(|t| {
                let order = match self.numerics {
                    Numerics::Exact => quant::DotOrder::Single,
                    Numerics::Fast => quant::DotOrder::Fast,
                };
                quant::kernels::kernels(t, order).map(|k| (t, k.isa, k.order))
            })
            .collect()
    }

    /// Whether the products of `ty` read repacked rows (`crate::packed`): at least one
    /// matrix of that type packed for the model's numerics.
    pub fn packed_type(&self, ty: GgmlType) -> bool {
        let Some(p) = self
            .packed
            .as_ref()
            .filter(|p| p.numerics() == self.numerics && self.copies.is_none())
        else {
            return false;
        };
        self.matrices()
            .any(|m| m.ty == ty && p.get(m.start).is_some())
    }

    /// The matrices the forward pass multiplies by: every layer's, then the output's.
    fn matrices(&self) -> impl Iterator<Item = Mat> + '_ {
        self.layers
            .iter()
            .flat_map(|l| [l.wq, l.wk, l.wv, l.wo, l.gate, l.up, l.down])
            .chain([self.output])
    }

    /// Bytes of all weight tensors (what a forward pass streams).
    pub fn weight_bytes(&self) -> u64 {
        self.file.tensor_bytes()
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
            dequant_row(&self.m(&self.tok_embd), tok as usize, xr);
            if c.embd_scale != 1.0 {
                xr.iter_mut().for_each(|v| *v *= c.embd_scale);
            }
        }

        let n_cpu = self.layers.len() - self.device.as_ref().map_or(0, |dv| dv.n_layers());
        for (il, layer) in self.layers.iter().enumerate().take(n_cpu) {
            self.layer_forward(il, layer, n_tok, kv, ws, pool);
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
                softcap(&mut ws.logits, c.final_logit_softcap);
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
        trace!(ws, "result_norm", usize::MAX, xn);
        ws.logits.resize(n_out * c.n_vocab, 0.0);
        matmul(
            pool,
            &self.m(&self.output),
            &ws.xn,
            &ws.out_ub,
            &mut ws.xq,
            &mut ws.logits,
        );
        softcap(&mut ws.logits, c.final_logit_softcap);
        trace!(ws, "result_output", usize::MAX, logits);
        Ok(n_out)
    }

    fn layer_forward(
        &self,
        il: usize,
        l: &Layer,
        n_tok: usize,
        kv: &mut KvCache,
        ws: &mut Workspace,
        pool: &ThreadPool,
    ) {
        let c = &self.config;
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
        // Q, K and V share their input: one quantization per kernel choice, one dispatch.
        matmul_many(
            pool,
            &[self.m(&l.wq), self.m(&l.wk), self.m(&l.wv)],
            &ws.xn,
            &ws.tok_ub,
            &mut ws.xq,
            &mut [&mut ws.q, &mut ws.k, &mut ws.v],
        );
        add_bias(&mut ws.q, l.bq.as_deref());
        add_bias(&mut ws.k, l.bk.as_deref());
        add_bias(&mut ws.v, l.bv.as_deref());
        trace!(ws, "Qcur", il, q);
        trace!(ws, "Kcur", il, k);
        trace!(ws, "Vcur", il, v);

        // Per token: the Q/K norms and RoPE (tokens split over the pool), then its K and V
        // into the cache.
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
                    l.rope.cache(tok_pos[t], &mut rope_cache);
                    for qh in q.chunks_exact_mut(hk) {
                        if let Some(w) = &l.q_norm {
                            rms_norm(qh, w, c.rms_eps);
                        }
                        l.rope.apply(qh, &rope_cache);
                        if c.arch == Arch::Gemma3 {
                            qh.iter_mut().for_each(|v| *v *= c.attn_scale);
                        }
                    }
                    for kh in k.chunks_exact_mut(hk) {
                        if let Some(w) = &l.k_norm {
                            rms_norm(kh, w, c.rms_eps);
                        }
                        l.rope.apply(kh, &rope_cache);
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
            window: if c.swa_layers[il] { c.n_swa } else { 0 },
            // gemma3 scales the query before the cache (above), the others the scores.
            kq_scale: if c.arch == Arch::Gemma3 {
                1.0
            } else {
                c.attn_scale
            },
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
            &self.m(&l.wo),
            &ws.attn,
            &ws.tok_ub,
            &mut ws.xq,
            &mut ws.proj,
        );
        trace!(ws, "wo_out", il, proj);
        // Like llama.cpp (its `inp_out_ids`), the last layer goes on with the rows whose
        // logits were asked for only, which also sets its kernels' micro-batch.
        let last = il + 1 == self.layers.len();
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
        let ffn_ub = if last { &ws.out_ub } else { &ws.tok_ub };
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
        ws.gate.resize(n_tok * c.n_ff, 0.0);
        ws.up.resize(n_tok * c.n_ff, 0.0);
        matmul_many(
            pool,
            &[self.m(&l.gate), self.m(&l.up)],
            &ws.xn[..n_tok * d],
            ffn_ub,
            &mut ws.xq,
            &mut [&mut ws.gate, &mut ws.up],
        );
        trace!(ws, "ffn_gate", il, gate);
        trace!(ws, "ffn_up", il, up);
        let (up, nf) = (&ws.up, c.n_ff);
        if c.arch == Arch::Gemma3 {
            let gelu = &self.gelu;
            rows_par(pool, &mut ws.gate, nf, &|t, g| {
                gelu.geglu(g, &up[t * nf..(t + 1) * nf])
            });
        } else {
            let fl = flavor();
            rows_par(pool, &mut ws.gate, nf, &|t, g| {
                swiglu(fl, g, &up[t * nf..(t + 1) * nf])
            });
        }
        trace!(ws, "ffn_act", il, gate);
        matmul(
            pool,
            &self.m(&l.down),
            &ws.gate,
            ffn_ub,
            &mut ws.xq,
            &mut ws.proj,
        );
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
}

thread_local! {
    /// One token's RoPE angles (cos/sin), per thread: the RoPE step runs on the pool.
    static ROPE_CACHE: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Rows per pool task, at least, for the row-wise steps of a forward pass.
const ROWS_PER_TASK: usize = 4;

/// `f(r, row)` for each `width`-element row `r` of `data`, the rows split over the pool
/// (each row's result is its own, whichever task runs it).
fn rows_par(
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

/// gemma3's final logit soft-capping, `tanh(v / cap) * cap`.
fn softcap(logits: &mut [f32], cap: Option<f32>) {
    if let Some(cap) = cap {
        logits.iter_mut().for_each(|v| *v = (*v / cap).tanh() * cap);
    }
}

fn add_bias(x: &mut [f32], b: Option<&[f32]>) {
    if let Some(b) = b {
        for row in x.chunks_exact_mut(b.len()) {
            row.iter_mut().zip(b).for_each(|(v, bb)| *v += bb);
        }
    }
}
