//! What a model computes, layer by layer: the declaration every architecture produces
//! once at load (`arch.rs`) and both executors read, our CPU kernels (`cpu.rs`) and the
//! ggml graph of offloaded layers (`offload/graph.rs`). Nothing here names an
//! architecture: a feature (QK-norm, a sliding window, attention sinks, soft-capping, NoPE
//! layers, partial rotary, a mixture of experts) is a field, so an architecture that
//! combines known features is a declaration, not a new code path.

use quant::ops::rope::Rope;

/// The gated activation between the up and down projections.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Act {
    /// `silu(gate) * up` (SwiGLU).
    Silu,
    /// `gelu_tanh(gate) * up` (GeGLU, ggml's f16-table GELU).
    Gelu,
    /// gpt-oss's clamped SwiGLU: `g = min(gate, limit)`, `u = clamp(up, -limit, limit)`,
    /// `g * sigmoid(alpha * g) * (u + 1)`.
    SwigluOai { alpha: f32, limit: f32 },
}

/// How a token's router logits become its experts and their weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    /// Soft-max over all experts, then the `n_used` largest probabilities (Qwen3-MoE).
    Softmax,
    /// The `n_used` largest logits, then a soft-max over those (gpt-oss).
    SoftmaxOfTopK,
}

/// A mixture-of-experts feed-forward block.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeSpec {
    pub n_expert: usize,
    /// Experts per token.
    pub n_used: usize,
    /// Hidden width of one expert.
    pub n_ff: usize,
    pub gating: Gating,
    /// Divide the chosen weights by their sum (clamped below at 2^-14, as llama.cpp).
    pub norm_weights: bool,
    /// Multiply the chosen weights by this (1: not at all).
    pub weight_scale: f32,
    pub act: Act,
}

/// The feed-forward block of a layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FfnSpec {
    /// `down(act(gate x, up x))`, with `gate` and `up` as two matrices or one fused
    /// (`ffn_up` of twice the width, gate first), whichever the file has.
    Dense {
        n_ff: usize,
        act: Act,
    },
    Moe(MoeSpec),
}

impl FfnSpec {
    /// The activation of the block (of each expert).
    pub fn act(&self) -> Act {
        match self {
            FfnSpec::Dense { act, .. } => *act,
            FfnSpec::Moe(m) => m.act,
        }
    }
}

/// The attention block of a layer. Q, K and V come from three matrices or one fused
/// (`attn_qkv`), each with an optional bias, whichever the file has.
#[derive(Clone, Debug)]
pub struct AttnSpec {
    /// Rotary embedding of Q and K; `None` for a NoPE layer (SmolLM3's every fourth).
    pub rope: Option<Rope>,
    /// Per-head RMS norms of Q and K before RoPE (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: bool,
    /// Sliding window in positions (0: the whole context).
    pub window: usize,
    /// Q is multiplied by this after RoPE, before the products with the cache (Gemma,
    /// Phi-3); the scores are then scaled by `kq_scale` as well.
    pub q_scale: Option<f32>,
    /// Multiplies each `q . k` inside the soft-max (ggml's `soft_max_ext` scale).
    pub kq_scale: f32,
    /// Scores become `cap * tanh(score / cap)` before the soft-max (Gemma 2).
    pub softcap: Option<f32>,
    /// A learned logit per head that joins every soft-max without a value (gpt-oss's
    /// `attn_sinks`).
    pub sinks: bool,
}

/// One transformer layer: `x += post_attn_norm?(attn(attn_norm(x)))`, then
/// `x += post_ffn_norm?(ffn(ffn_norm(x)))`.
#[derive(Clone, Debug)]
pub struct LayerSpec {
    pub attn: AttnSpec,
    /// RMS norm of the attention output before the residual (Gemma's
    /// `post_attention_norm`).
    pub post_attn_norm: bool,
    /// The tensor (`blk.N.<name>.weight`) that normalizes the feed-forward input:
    /// `ffn_norm`, or gpt-oss's `post_attention_norm`.
    pub ffn_norm: &'static str,
    pub ffn: FfnSpec,
    /// RMS norm of the feed-forward output before the residual (Gemma's `post_ffw_norm`).
    pub post_ffn_norm: bool,
}

/// The whole model as the executors see it, besides the dimensions in `Config`.
#[derive(Clone, Debug)]
pub struct ModelSpec {
    pub layers: Vec<LayerSpec>,
    /// The embedding rows are multiplied by this (Gemma: sqrt(n_embd)); 1: not at all.
    pub embd_scale: f32,
    /// Logits become `cap * tanh(logit / cap)` (Gemma 2 and 3).
    pub final_softcap: Option<f32>,
    /// Where llama.cpp drops the rows whose logits nobody asked for (its `inp_out_ids`):
    /// after the last layer's attention (true, most architectures), or after the last
    /// layer (gpt-oss). It sets the micro-batch of the last feed-forward's products and
    /// so their kernel order.
    pub out_rows_after_last_attn: bool,
}
