//! Synthetic models at real sizes: a real family's shape (layers, widths, heads, GQA,
//! biases, RoPE and norm settings) filled with random but valid quantized blocks, plus a
//! real small model's tokenizer, written as a GGUF file that our engine and llama.cpp both
//! load. The text such a model produces is meaningless; the time it takes is what the real
//! model of that shape costs, because kernels do the same work whatever the bits are.
//!
//! - Shapes ([`Shape::named`]): `llama3-8b` and `qwen2.5-7b` as published in the models'
//!   `config.json`; [`Shape::with_layers`] and [`Shape::scaled_down`] shrink them for tests.
//! - Quantization ([`SynthQuant`]): `q4_k_m` follows llama.cpp's `llama_tensor_get_type`
//!   for `LLAMA_FTYPE_MOSTLY_Q4_K_M` on these dense architectures (see [`tensor_type`]);
//!   `q4_0` and `q8_0` are the plain llama.cpp mixes of those file types.
//! - Values: every block's scales are f16-finite and chosen so dequantized weights have a
//!   standard deviation of about 0.02 with mean about 0 (an initialisation-like spread);
//!   norm weights are 1 ± 0.05, biases about ±0.035. The forward pass stays finite.
//! - Vocabulary: all `tokenizer.*` keys of a source GGUF are copied, so `token_embd` and
//!   `output` have the source's vocabulary size (smaller than the real 128k/152k ones),
//!   unless [`SynthSpec::pad_vocab`] pads it with unused tokens to the real size.
//! - Labelling: `general.name` says "synthetic ... (random weights)" and
//!   `rllama.synthetic = true`, with the shape, seed and tokenizer source beside it.
//! - Output: [`synthesize`] streams the file (header first, then each tensor generated in
//!   chunks on a second thread while the first writes) into a temporary name and renames
//!   it, so memory stays small and an interrupted run leaves no valid-looking file.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use quant::f16::f32_to_f16;
use quant::GgmlType;

use crate::gguf::writer::{StreamWriter, TensorSpec};
use crate::gguf::{GgufFile, Value};

/// The metadata key that marks a synthetic file.
pub const SYNTHETIC_KEY: &str = "rllama.synthetic";

/// Target standard deviation of the dequantized weights.
pub const WEIGHT_STD: f32 = 0.02;

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("unknown shape {0:?} (known: {known})", known = SHAPE_NAMES.join(", "))]
    UnknownShape(String),
    #[error(
        "unknown quantization {0:?} (known: q3_k_m, q4_k_m, q5_k_m, q4_0, q8_0, mxfp4_moe, iq4_nl, iq4_xs, f16)"
    )]
    UnknownQuant(String),
    #[error("invalid shape: {0}")]
    InvalidShape(String),
    #[error("tokenizer source {path}: {reason}")]
    Tokenizer { path: PathBuf, reason: String },
    #[error("writing {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The names [`Shape::named`] knows.
pub const SHAPE_NAMES: [&str; 9] = [
    "llama3-8b",
    "qwen2.5-7b",
    "qwen3-0.6b",
    "qwen3-4b",
    "qwen3-30b-a3b",
    "gpt-oss-20b",
    "phi4-mini",
    "gemma2-2b",
    "smollm3-3b",
];

/// A mixture of experts in every layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeShape {
    pub n_expert: usize,
    pub n_used: usize,
    /// Hidden width of one expert.
    pub n_ff: usize,
    /// Router and expert biases (gpt-oss).
    pub biases: bool,
}

/// How the RoPE of a shape is scaled beyond its original context.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// YaRN by `factor` over the original context (gpt-oss).
    Yarn {
        factor: f32,
        orig_ctx: usize,
    },
    /// LongRoPE: per-pair factors for long and short contexts (Phi-3/4), written as
    /// `rope_factors_long` / `rope_factors_short`, with its attention factor.
    LongRope {
        orig_ctx: usize,
        attn_factor: f32,
    },
}

/// The features of a family beyond llama's layer, as its GGUF files carry them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Features {
    /// Per-head RMS norms of Q and K (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// No `output.weight`: the logits reuse `token_embd` (and llama.cpp's quantizer gives
    /// it the output's type).
    pub tied_output: bool,
    pub moe: Option<MoeShape>,
    /// Sliding-window size and its layer period (every layer but the period's last
    /// slides): 0 for none.
    pub sliding_window: usize,
    pub swa_period: usize,
    /// Attention sinks per head (gpt-oss).
    pub sinks: bool,
    /// Gemma's norms after attention and after the feed-forward.
    pub post_norms: bool,
    /// Gemma 2's soft-capping of the attention scores and of the logits.
    pub attn_softcap: Option<f32>,
    pub final_softcap: Option<f32>,
    /// Rotated dimensions per head when not all (Phi-4-mini: 96 of 128).
    pub n_rot: Option<usize>,
    /// One `attn_qkv` and one double-width `ffn_up` (Phi-3/4).
    pub fused: bool,
    /// A bias on the attention output (gpt-oss).
    pub attn_out_bias: bool,
    pub rope_scaling: RopeScaling,
    /// RoPE base of the sliding-window layers, when it differs.
    pub rope_theta_swa: Option<f32>,
}

impl Features {
    /// Llama's layer: nothing extra.
    pub const LLAMA: Features = Features {
        qk_norm: false,
        tied_output: false,
        moe: None,
        sliding_window: 0,
        swa_period: 0,
        sinks: false,
        post_norms: false,
        attn_softcap: None,
        final_softcap: None,
        n_rot: None,
        fused: false,
        attn_out_bias: false,
        rope_scaling: RopeScaling::None,
        rope_theta_swa: None,
    };
}

/// A model family at one size: what the architecture's GGUF keys and tensor shapes need.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    /// The shape's name (`llama3-8b`).
    pub name: &'static str,
    /// `general.architecture`.
    pub arch: &'static str,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Per-head width (not always `n_embd / n_head`: Qwen3, Gemma 2, gpt-oss).
    pub head_dim: usize,
    /// Dense feed-forward width (for a mixture, `feed_forward_length` as the file has it).
    pub n_ff: usize,
    pub n_ctx: usize,
    pub rope_theta: f32,
    pub rms_eps: f32,
    /// Q, K and V projections carry biases (Qwen2, gpt-oss).
    pub qkv_bias: bool,
    /// The real model's vocabulary size (ours comes from the tokenizer source).
    pub real_vocab: usize,
    /// Registry model whose tokenizer is used by default (same tokenizer kind as the
    /// family's where one is available).
    pub tokenizer_from: &'static str,
    /// Layers of the full model (equal to `n_layer` unless [`Shape::with_layers`] cut it).
    pub full_layers: usize,
    /// Width divisor from [`Shape::scaled_down`] (1 = real widths).
    pub scale: usize,
    pub feat: Features,
}

impl Shape {
    /// Meta-Llama-3-8B: hidden 4096, 32 layers, 32 heads / 8 KV heads (head dim 128),
    /// intermediate 14336, rope_theta 500000, rms_norm_eps 1e-5, 8192 positions, vocab
    /// 128256, untied output.
    pub fn llama3_8b() -> Shape {
        Shape {
            name: "llama3-8b",
            arch: "llama",
            n_embd: 4096,
            n_layer: 32,
            n_head: 32,
            n_head_kv: 8,
            head_dim: 128,
            n_ff: 14336,
            n_ctx: 8192,
            rope_theta: 500_000.0,
            rms_eps: 1e-5,
            qkv_bias: false,
            real_vocab: 128_256,
            tokenizer_from: "smollm2-135m",
            full_layers: 32,
            scale: 1,
            feat: Features::LLAMA,
        }
    }

    /// Qwen2.5-7B(-Instruct): hidden 3584, 28 layers, 28 heads / 4 KV heads (head dim 128),
    /// intermediate 18944, QKV biases, rope_theta 1e6, rms_norm_eps 1e-6, 32768 positions,
    /// vocab 152064, untied output.
    pub fn qwen25_7b() -> Shape {
        Shape {
            name: "qwen2.5-7b",
            arch: "qwen2",
            n_embd: 3584,
            n_layer: 28,
            n_head: 28,
            n_head_kv: 4,
            head_dim: 128,
            n_ff: 18944,
            n_ctx: 32768,
            rope_theta: 1_000_000.0,
            rms_eps: 1e-6,
            qkv_bias: true,
            real_vocab: 152_064,
            tokenizer_from: "qwen2.5-coder-0.5b",
            full_layers: 28,
            scale: 1,
            feat: Features::LLAMA,
        }
    }

    /// A Qwen3 dense model: QK-norm, no biases, rope_theta 1e6, rms_norm_eps 1e-6, 40960
    /// positions, vocab 151936, tied embeddings; head dim 128 whatever the width.
    fn qwen3(
        name: &'static str,
        n_embd: usize,
        n_layer: usize,
        n_head: usize,
        n_ff: usize,
    ) -> Shape {
        Shape {
            name,
            arch: "qwen3",
            n_embd,
            n_layer,
            n_head,
            n_head_kv: 8,
            head_dim: 128,
            n_ff,
            n_ctx: 40960,
            rope_theta: 1_000_000.0,
            rms_eps: 1e-6,
            qkv_bias: false,
            real_vocab: 151_936,
            tokenizer_from: "qwen2.5-coder-0.5b",
            full_layers: n_layer,
            scale: 1,
            feat: Features {
                qk_norm: true,
                tied_output: true,
                ..Features::LLAMA
            },
        }
    }

    /// Qwen3-0.6B: hidden 1024, 28 layers, 16 heads / 8 KV heads, intermediate 3072.
    pub fn qwen3_06b() -> Shape {
        Shape::qwen3("qwen3-0.6b", 1024, 28, 16, 3072)
    }

    /// Qwen3-4B: hidden 2560, 36 layers, 32 heads / 8 KV heads, intermediate 9728.
    pub fn qwen3_4b() -> Shape {
        Shape::qwen3("qwen3-4b", 2560, 36, 32, 9728)
    }

    /// Qwen3-30B-A3B: hidden 2048, 48 layers, 32 heads / 4 KV heads (head dim 128), 128
    /// experts of width 768 with 8 per token (normalised weights), feed_forward_length
    /// 6144, untied output, vocab 151936.
    pub fn qwen3_30b_a3b() -> Shape {
        Shape {
            name: "qwen3-30b-a3b",
            arch: "qwen3moe",
            n_head_kv: 4,
            n_ff: 6144,
            feat: Features {
                qk_norm: true,
                moe: Some(MoeShape {
                    n_expert: 128,
                    n_used: 8,
                    n_ff: 768,
                    biases: false,
                }),
                ..Features::LLAMA
            },
            ..Shape::qwen3("qwen3-30b-a3b", 2048, 48, 32, 6144)
        }
    }

    /// gpt-oss-20b: hidden 2880, 24 layers, 64 heads / 8 KV heads of 64, QKV and output
    /// biases, attention sinks, sliding window 128 on every other layer (the first
    /// slides), 32 experts of width 2880 with 4 per token (router and expert biases),
    /// rope_theta 150000 with YaRN x32 over 4096 positions (131072), rms_norm_eps 1e-5,
    /// vocab 201088, untied output.
    pub fn gpt_oss_20b() -> Shape {
        Shape {
            name: "gpt-oss-20b",
            arch: "gpt-oss",
            n_embd: 2880,
            n_layer: 24,
            n_head: 64,
            n_head_kv: 8,
            head_dim: 64,
            n_ff: 2880,
            n_ctx: 131_072,
            rope_theta: 150_000.0,
            rms_eps: 1e-5,
            qkv_bias: true,
            real_vocab: 201_088,
            tokenizer_from: "qwen2.5-coder-0.5b",
            full_layers: 24,
            scale: 1,
            feat: Features {
                moe: Some(MoeShape {
                    n_expert: 32,
                    n_used: 4,
                    n_ff: 2880,
                    biases: true,
                }),
                sliding_window: 128,
                swa_period: 2,
                sinks: true,
                attn_out_bias: true,
                rope_scaling: RopeScaling::Yarn {
                    factor: 32.0,
                    orig_ctx: 4096,
                },
                ..Features::LLAMA
            },
        }
    }

    /// Phi-4-mini-instruct: hidden 3072, 32 layers, 24 heads / 8 KV heads of 128, fused
    /// QKV and gate/up, partial rotary 0.75 (96 dims), LongRoPE over 4096 positions
    /// (131072), rope_theta 10000, rms_norm_eps 1e-5, vocab 200064, tied embeddings.
    pub fn phi4_mini() -> Shape {
        Shape {
            name: "phi4-mini",
            arch: "phi3",
            n_embd: 3072,
            n_layer: 32,
            n_head: 24,
            n_head_kv: 8,
            head_dim: 128,
            n_ff: 8192,
            n_ctx: 131_072,
            rope_theta: 10_000.0,
            rms_eps: 1e-5,
            qkv_bias: false,
            real_vocab: 200_064,
            tokenizer_from: "qwen2.5-coder-0.5b",
            full_layers: 32,
            scale: 1,
            feat: Features {
                tied_output: true,
                n_rot: Some(96),
                fused: true,
                rope_scaling: RopeScaling::LongRope {
                    orig_ctx: 4096,
                    // sqrt(1 + ln(131072 / 4096) / ln(4096)), as the converter writes it.
                    attn_factor: 1.190_239,
                },
                ..Features::LLAMA
            },
        }
    }

    /// Gemma-2-2B: hidden 2304, 26 layers, 8 heads / 4 KV heads of 256, intermediate
    /// 9216, sliding window 4096 on every other layer, attention soft-cap 50 and final
    /// soft-cap 30, post norms, rope_theta 10000, rms_norm_eps 1e-6, 8192 positions,
    /// vocab 256000, tied embeddings.
    pub fn gemma2_2b() -> Shape {
        Shape {
            name: "gemma2-2b",
            arch: "gemma2",
            n_embd: 2304,
            n_layer: 26,
            n_head: 8,
            n_head_kv: 4,
            head_dim: 256,
            n_ff: 9216,
            n_ctx: 8192,
            rope_theta: 10_000.0,
            rms_eps: 1e-6,
            qkv_bias: false,
            real_vocab: 256_000,
            tokenizer_from: "gemma3-270m",
            full_layers: 26,
            scale: 1,
            feat: Features {
                tied_output: true,
                sliding_window: 4096,
                swa_period: 2,
                post_norms: true,
                attn_softcap: Some(50.0),
                final_softcap: Some(30.0),
                ..Features::LLAMA
            },
        }
    }

    /// SmolLM3-3B: hidden 2048, 36 layers, 16 heads / 4 KV heads of 128, intermediate
    /// 11008, no RoPE in every fourth layer, rope_theta 5e6, rms_norm_eps 1e-6, 65536
    /// positions, vocab 128256, tied embeddings.
    pub fn smollm3_3b() -> Shape {
        Shape {
            name: "smollm3-3b",
            arch: "smollm3",
            n_embd: 2048,
            n_layer: 36,
            n_head: 16,
            n_head_kv: 4,
            head_dim: 128,
            n_ff: 11008,
            n_ctx: 65_536,
            rope_theta: 5_000_000.0,
            rms_eps: 1e-6,
            qkv_bias: false,
            real_vocab: 128_256,
            tokenizer_from: "smollm2-135m",
            full_layers: 36,
            scale: 1,
            feat: Features {
                tied_output: true,
                ..Features::LLAMA
            },
        }
    }

    pub fn named(name: &str) -> Result<Shape, SynthError> {
        match name {
            "llama3-8b" => Ok(Shape::llama3_8b()),
            "qwen2.5-7b" => Ok(Shape::qwen25_7b()),
            "qwen3-0.6b" => Ok(Shape::qwen3_06b()),
            "qwen3-4b" => Ok(Shape::qwen3_4b()),
            "qwen3-30b-a3b" => Ok(Shape::qwen3_30b_a3b()),
            "gpt-oss-20b" => Ok(Shape::gpt_oss_20b()),
            "phi4-mini" => Ok(Shape::phi4_mini()),
            "gemma2-2b" => Ok(Shape::gemma2_2b()),
            "smollm3-3b" => Ok(Shape::smollm3_3b()),
            other => Err(SynthError::UnknownShape(other.to_string())),
        }
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Rotated dimensions per head.
    pub fn n_rot(&self) -> usize {
        self.feat.n_rot.unwrap_or(self.head_dim)
    }

    /// The first `n` layers only (same widths): the per-layer cost is real, the depth not.
    pub fn with_layers(mut self, n: usize) -> Shape {
        self.n_layer = n;
        self
    }

    /// Widths divided by `div` (hidden, feed-forward and expert widths rounded to
    /// multiples of 256 so every row stays whole K-quant blocks), head dim kept, heads and
    /// KV heads cut to keep the grouping where possible: a cheap stand-in for tests, not a
    /// real size.
    pub fn scaled_down(mut self, div: usize) -> Shape {
        if div <= 1 {
            return self;
        }
        let round = |x: usize| ((x as f64 / div as f64 / 256.0).round() as usize).max(1) * 256;
        let gqa = self.n_head / self.n_head_kv;
        let square = self.n_head * self.head_dim == self.n_embd;
        self.n_embd = round(self.n_embd);
        self.n_ff = round(self.n_ff);
        if let Some(m) = &mut self.feat.moe {
            m.n_ff = round(m.n_ff);
        }
        // Heads that span the width keep doing so; the others are cut like the width.
        self.n_head = if square {
            self.n_embd / self.head_dim
        } else {
            (self.n_head / div).max(1)
        };
        self.n_head_kv = (self.n_head / gqa).max(1);
        if !self.n_head.is_multiple_of(self.n_head_kv) {
            self.n_head_kv = 1;
        }
        self.scale *= div;
        self
    }

    /// The block size every row's width must be a multiple of under `quant`.
    fn row_block(&self, quant: SynthQuant) -> usize {
        match quant {
            SynthQuant::Q3KM | SynthQuant::Q4KM | SynthQuant::Q5KM => quant::QK_K,
            _ => 32,
        }
    }

    /// Checks what the writers and loaders rely on.
    pub fn validate(&self, quant: SynthQuant) -> Result<(), SynthError> {
        let bad = |m: String| Err(SynthError::InvalidShape(m));
        if self.n_layer == 0 || self.n_layer > self.full_layers {
            return bad(format!(
                "{} layers requested, the shape has 1 to {}",
                self.n_layer, self.full_layers
            ));
        }
        if self.n_head == 0 || self.n_head_kv == 0 || !self.n_head.is_multiple_of(self.n_head_kv) {
            return bad(format!(
                "{} heads / {} KV heads",
                self.n_head, self.n_head_kv
            ));
        }
        if !self.head_dim.is_multiple_of(2)
            || self.n_rot() > self.head_dim
            || !self.n_rot().is_multiple_of(2)
        {
            return bad(format!(
                "head dim {} with {} rotated dims",
                self.head_dim,
                self.n_rot()
            ));
        }
        let block = self.row_block(quant);
        let mut widths = vec![
            ("n_embd", self.n_embd),
            ("n_head * head_dim", self.n_head * self.head_dim),
        ];
        match &self.feat.moe {
            Some(m) => widths.push(("expert n_ff", m.n_ff)),
            None => widths.push(("n_ff", self.n_ff)),
        }
        for (what, n) in widths {
            if n == 0 || !n.is_multiple_of(block) {
                return bad(format!(
                    "{what} = {n} is not a multiple of {block} ({} rows)",
                    quant.name()
                ));
            }
        }
        Ok(())
    }

    /// `general.name`: says it is synthetic, and how it was cut when it was.
    pub fn display_name(&self) -> String {
        let mut cut = Vec::new();
        if self.n_layer != self.full_layers {
            cut.push(format!("{} of {} layers", self.n_layer, self.full_layers));
        }
        if self.scale > 1 {
            cut.push(format!("widths / {}", self.scale));
        }
        if cut.is_empty() {
            format!("synthetic {} (random weights)", self.name)
        } else {
            format!(
                "synthetic {} ({}, random weights)",
                self.name,
                cut.join(", ")
            )
        }
    }

    /// The quantization the family is published in that this writer makes by default
    /// (gpt-oss: its MXFP4 experts; the others: Q4_K_M).
    pub fn default_quant(&self) -> SynthQuant {
        if self.arch == "gpt-oss" {
            SynthQuant::Mxfp4Moe
        } else {
            SynthQuant::Q4KM
        }
    }
}

/// The quantization of a synthetic file, named as `llama-quantize` names the file types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynthQuant {
    /// llama.cpp's Q4_K_M mix: Q4_K, with Q6_K for the output, and for attn_v and
    /// ffn_down in the layers `use_more_bits` picks; Q5_K for a fused QKV.
    Q4KM,
    /// llama.cpp's Q3_K_M mix: Q3_K, with Q6_K for the output, Q4_K for attn_output, a
    /// fused QKV and ffn_down (Q5_K in the first sixteenth of the layers), attn_v Q5_K in
    /// the first two layers and Q4_K after.
    Q3KM,
    /// llama.cpp's Q5_K_M mix: Q5_K, with Q6_K for the output, a fused QKV, and attn_v
    /// and ffn_down in the layers `use_more_bits` picks.
    Q5KM,
    /// Q4_0 everywhere, Q6_K output (llama.cpp's MOSTLY_Q4_0).
    Q4_0,
    /// Q8_0 everywhere (llama.cpp's MOSTLY_Q8_0).
    Q8_0,
    /// llama.cpp's MXFP4_MOE: the experts MXFP4, every other matrix Q8_0 (gpt-oss).
    Mxfp4Moe,
    /// llama.cpp's IQ4_NL without an importance matrix: IQ4_NL, with Q6_K for the output,
    /// Q5_K for attn_v where four or more query heads share a KV head and for ffn_down
    /// in the first eighth of the layers.
    Iq4Nl,
    /// llama.cpp's IQ4_XS without an importance matrix: IQ4_NL's mix with IQ4_XS as the
    /// default type (IQ4_NL for rows that are no whole number of 256-element blocks).
    Iq4Xs,
    /// llama.cpp's MOSTLY_F16: every matrix F16.
    F16,
    /// llama.cpp's MOSTLY_BF16: every matrix BF16.
    Bf16,
}

impl SynthQuant {
    pub fn parse(s: &str) -> Result<SynthQuant, SynthError> {
        match s.to_ascii_lowercase().as_str() {
            "q4_k_m" => Ok(SynthQuant::Q4KM),
            "q3_k_m" => Ok(SynthQuant::Q3KM),
            "q5_k_m" => Ok(SynthQuant::Q5KM),
            "q4_0" => Ok(SynthQuant::Q4_0),
            "q8_0" => Ok(SynthQuant::Q8_0),
            "mxfp4_moe" | "mxfp4" => Ok(SynthQuant::Mxfp4Moe),
            "iq4_nl" => Ok(SynthQuant::Iq4Nl),
            "iq4_xs" => Ok(SynthQuant::Iq4Xs),
            "f16" => Ok(SynthQuant::F16),
            "bf16" => Ok(SynthQuant::Bf16),
            _ => Err(SynthError::UnknownQuant(s.to_string())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SynthQuant::Q4KM => "q4_k_m",
            SynthQuant::Q3KM => "q3_k_m",
            SynthQuant::Q5KM => "q5_k_m",
            SynthQuant::Q4_0 => "q4_0",
            SynthQuant::Q8_0 => "q8_0",
            SynthQuant::Mxfp4Moe => "mxfp4_moe",
            SynthQuant::Iq4Nl => "iq4_nl",
            SynthQuant::Iq4Xs => "iq4_xs",
            SynthQuant::F16 => "f16",
            SynthQuant::Bf16 => "bf16",
        }
    }

    /// `general.file_type` (llama.cpp's `llama_ftype`).
    pub fn ftype(self) -> u32 {
        match self {
            SynthQuant::Q4KM => 15,
            SynthQuant::Q3KM => 12,
            SynthQuant::Q5KM => 17,
            SynthQuant::Q4_0 => 2,
            SynthQuant::Q8_0 => 7,
            SynthQuant::Mxfp4Moe => 38,
            SynthQuant::Iq4Nl => 25,
            SynthQuant::Iq4Xs => 30,
            SynthQuant::F16 => 1,
            SynthQuant::Bf16 => 32,
        }
    }
}

/// What a tensor is, for the type rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    TokenEmbd,
    Output,
    AttnQ,
    AttnK,
    AttnV,
    /// A fused Q, K and V projection.
    AttnQkv,
    AttnOutput,
    FfnGate,
    FfnUp,
    FfnDown,
    /// Stacks of experts (3-D).
    ExpGate,
    ExpUp,
    ExpDown,
    /// The router (`ffn_gate_inp`), which llama.cpp never quantizes.
    Router,
    /// RMS norm weights (F32, not quantized: llama.cpp quantizes only 2-D weights).
    Norm,
    /// Biases, sinks and RoPE factors (F32).
    Bias,
}

/// llama.cpp's `use_more_bits(i_layer, n_layers)`: the first and last eighth of the layers
/// and every third layer in between.
pub fn use_more_bits(i_layer: usize, n_layers: usize) -> bool {
    let (i, n) = (i_layer as i64, n_layers as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The type llama.cpp's `llama_tensor_get_type` gives a tensor (no imatrix, no
/// overrides) whose rows are whole blocks of it. For Q4_K_M: output (and a tied
/// token_embd) Q6_K; attn_v and ffn_down (the experts' too) Q6_K where
/// [`use_more_bits`] (counted over the layers, as llama.cpp's `i_attention_wv` /
/// `i_ffn_down` counters do); a fused attn_qkv Q5_K; every other weight the default Q4_K.
/// Q5_K_M: the same with Q5_K as the default and a fused attn_qkv Q6_K.
/// Q4_0 and Q8_0: the default type, except that a Q4_0 file's output is Q6_K.
/// MXFP4_MOE: the experts MXFP4, every other weight Q8_0. IQ4_NL: see
/// [`SynthQuant::Iq4Nl`] (`gqa`: query heads per KV head). Norms, biases and the router
/// stay F32.
pub fn tensor_type(
    quant: SynthQuant,
    role: Role,
    (layer, n_layer): (usize, usize),
    gqa: usize,
    tied: bool,
) -> GgmlType {
    use GgmlType as T;
    if matches!(role, Role::Norm | Role::Bias | Role::Router) {
        return T::F32;
    }
    let output = role == Role::Output || (tied && role == Role::TokenEmbd);
    match quant {
        SynthQuant::Q4KM => match role {
            _ if output => T::Q6_K,
            Role::AttnV | Role::FfnDown | Role::ExpDown if use_more_bits(layer, n_layer) => T::Q6_K,
            Role::AttnQkv => T::Q5_K,
            _ => T::Q4_K,
        },
        SynthQuant::Q3KM => match role {
            _ if output => T::Q6_K,
            Role::AttnV if layer < 2 => T::Q5_K,
            Role::FfnDown | Role::ExpDown if layer < n_layer / 16 => T::Q5_K,
            Role::AttnV | Role::AttnOutput | Role::AttnQkv | Role::FfnDown | Role::ExpDown => {
                T::Q4_K
            }
            _ => T::Q3_K,
        },
        SynthQuant::Q5KM => match role {
            _ if output => T::Q6_K,
            Role::AttnV | Role::FfnDown | Role::ExpDown if use_more_bits(layer, n_layer) => T::Q6_K,
            Role::AttnQkv => T::Q6_K,
            _ => T::Q5_K,
        },
        SynthQuant::Q4_0 => match role {
            _ if output => T::Q6_K,
            _ => T::Q4_0,
        },
        SynthQuant::Q8_0 => T::Q8_0,
        SynthQuant::F16 => T::F16,
        SynthQuant::Bf16 => T::BF16,
        SynthQuant::Mxfp4Moe => match role {
            Role::ExpGate | Role::ExpUp | Role::ExpDown => T::MXFP4,
            _ => T::Q8_0,
        },
        SynthQuant::Iq4Nl | SynthQuant::Iq4Xs => match role {
            _ if output => T::Q6_K,
            Role::AttnV if gqa >= 4 => T::Q5_K,
            Role::FfnDown | Role::ExpDown if layer < n_layer / 8 => T::Q5_K,
            _ if quant == SynthQuant::Iq4Xs => T::IQ4_XS,
            _ => T::IQ4_NL,
        },
    }
}

/// The type llama.cpp's quantizer falls back to when rows of `ncols` elements are no whole
/// number of `ty`'s blocks (its table in `llama_tensor_get_type`): a 32-element type of
/// about the same size.
pub fn whole_blocks(ty: GgmlType, ncols: u64) -> GgmlType {
    use GgmlType as T;
    if ncols.is_multiple_of(ty.block_size() as u64) {
        return ty;
    }
    match ty {
        T::IQ4_XS => T::IQ4_NL,
        T::Q2_K | T::Q3_K => T::Q4_0,
        T::Q4_K => T::Q5_0,
        T::Q5_K => T::Q5_1,
        T::Q6_K => T::Q8_0,
        other => other,
    }
}

/// One tensor of the plan: its table entry and what it holds.
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    pub spec: TensorSpec,
    pub role: Role,
}

/// Every tensor of the file in order: `token_embd`, the layers (norms, projections with
/// their biases, feed-forward or router and experts), `output_norm`, `output` (unless
/// tied), the RoPE factor tables of LongRoPE.
pub fn plan(shape: &Shape, quant: SynthQuant, n_vocab: usize) -> Vec<Planned> {
    let f = &shape.feat;
    let (d, hd) = (shape.n_embd as u64, shape.head_dim as u64);
    let q_dim = shape.n_head as u64 * hd;
    let kv_dim = shape.n_head_kv as u64 * hd;
    let ff = shape.n_ff as u64;
    let n_layer = shape.n_layer;
    let mut out = Vec::new();
    let mut push = |name: String, dims: Vec<u64>, role: Role, layer: usize| {
        out.push(Planned {
            spec: TensorSpec {
                name,
                ty: whole_blocks(
                    tensor_type(
                        quant,
                        role,
                        (layer, n_layer),
                        shape.n_head / shape.n_head_kv,
                        f.tied_output,
                    ),
                    dims[0],
                ),
                shape: dims,
            },
            role,
        })
    };
    push(
        "token_embd.weight".into(),
        vec![d, n_vocab as u64],
        Role::TokenEmbd,
        0,
    );
    for il in 0..n_layer {
        let n = |s: &str| format!("blk.{il}.{s}");
        push(n("attn_norm.weight"), vec![d], Role::Norm, il);
        if f.fused {
            push(
                n("attn_qkv.weight"),
                vec![d, q_dim + 2 * kv_dim],
                Role::AttnQkv,
                il,
            );
        } else {
            for (t, dim, role) in [
                ("attn_q", q_dim, Role::AttnQ),
                ("attn_k", kv_dim, Role::AttnK),
                ("attn_v", kv_dim, Role::AttnV),
            ] {
                push(n(&format!("{t}.weight")), vec![d, dim], role, il);
                if shape.qkv_bias {
                    push(n(&format!("{t}.bias")), vec![dim], Role::Bias, il);
                }
            }
        }
        if f.qk_norm {
            push(n("attn_q_norm.weight"), vec![hd], Role::Norm, il);
            push(n("attn_k_norm.weight"), vec![hd], Role::Norm, il);
        }
        push(
            n("attn_output.weight"),
            vec![q_dim, d],
            Role::AttnOutput,
            il,
        );
        if f.attn_out_bias {
            push(n("attn_output.bias"), vec![d], Role::Bias, il);
        }
        if f.sinks {
            push(
                n("attn_sinks.weight"),
                vec![shape.n_head as u64],
                Role::Bias,
                il,
            );
        }
        if f.post_norms {
            push(n("post_attention_norm.weight"), vec![d], Role::Norm, il);
        }
        match &f.moe {
            Some(m) => {
                let (ne, ef) = (m.n_expert as u64, m.n_ff as u64);
                // gpt-oss names its feed-forward norm `post_attention_norm`.
                let norm = if shape.arch == "gpt-oss" {
                    "post_attention_norm.weight"
                } else {
                    "ffn_norm.weight"
                };
                push(n(norm), vec![d], Role::Norm, il);
                push(n("ffn_gate_inp.weight"), vec![d, ne], Role::Router, il);
                if m.biases {
                    push(n("ffn_gate_inp.bias"), vec![ne], Role::Bias, il);
                }
                for (t, dims, role) in [
                    ("ffn_gate_exps", vec![d, ef, ne], Role::ExpGate),
                    ("ffn_up_exps", vec![d, ef, ne], Role::ExpUp),
                    ("ffn_down_exps", vec![ef, d, ne], Role::ExpDown),
                ] {
                    let bias = vec![dims[1], ne];
                    push(n(&format!("{t}.weight")), dims, role, il);
                    if m.biases {
                        push(n(&format!("{t}.bias")), bias, Role::Bias, il);
                    }
                }
            }
            None => {
                push(n("ffn_norm.weight"), vec![d], Role::Norm, il);
                if f.fused {
                    push(n("ffn_up.weight"), vec![d, 2 * ff], Role::FfnUp, il);
                } else {
                    push(n("ffn_gate.weight"), vec![d, ff], Role::FfnGate, il);
                    push(n("ffn_up.weight"), vec![d, ff], Role::FfnUp, il);
                }
                push(n("ffn_down.weight"), vec![ff, d], Role::FfnDown, il);
            }
        }
        if f.post_norms {
            push(n("post_ffw_norm.weight"), vec![d], Role::Norm, il);
        }
    }
    push("output_norm.weight".into(), vec![d], Role::Norm, 0);
    if !f.tied_output {
        push(
            "output.weight".into(),
            vec![d, n_vocab as u64],
            Role::Output,
            0,
        );
    }
    if let RopeScaling::LongRope { .. } = f.rope_scaling {
        let half = shape.n_rot() as u64 / 2;
        push("rope_factors_long.weight".into(), vec![half], Role::Bias, 0);
        push(
            "rope_factors_short.weight".into(),
            vec![half],
            Role::Bias,
            0,
        );
    }
    out
}

/// What to synthesize.
pub struct SynthSpec<'a> {
    pub shape: Shape,
    pub quant: SynthQuant,
    pub seed: u64,
    /// The GGUF whose `tokenizer.*` metadata is copied.
    pub tokenizer: &'a GgufFile,
    /// How the tokenizer source is named in the metadata (registry name or file name).
    pub tokenizer_name: String,
    /// Pad the vocabulary with unused `[PAD<i>]` tokens up to the shape's real size
    /// ([`Shape::real_vocab`]), as Qwen's own GGUF files pad theirs: `token_embd` and
    /// `output` then have the real model's size (file size, output-layer cost, and the
    /// size label llama.cpp derives from the vocabulary).
    pub pad_vocab: bool,
}

impl SynthSpec<'_> {
    /// The source's vocabulary size: the length of its `tokenizer.ggml.tokens`.
    pub fn source_vocab(&self) -> Result<usize, SynthError> {
        let err = |reason: String| SynthError::Tokenizer {
            path: self.tokenizer.path().to_path_buf(),
            reason,
        };
        match self.tokenizer.get_array("tokenizer.ggml.tokens") {
            Ok(Some(a)) if !a.is_empty() => Ok(a.len()),
            Ok(_) => Err(err("has no tokenizer.ggml.tokens".into())),
            Err(e) => Err(err(e.to_string())),
        }
    }

    /// The file's vocabulary size: the source's, or the real model's with `pad_vocab`
    /// (never fewer than the source's).
    pub fn n_vocab(&self) -> Result<usize, SynthError> {
        let n = self.source_vocab()?;
        Ok(if self.pad_vocab {
            n.max(self.shape.real_vocab)
        } else {
            n
        })
    }

    /// A copied `tokenizer.*` entry, with the per-token arrays extended to `n_vocab` by
    /// `[PAD<i>]` tokens of type 5 (unused) and score 0.
    fn padded(&self, key: &str, v: &Value, n_vocab: usize) -> Value {
        use crate::gguf::Array;
        let Value::Array(a) = v else {
            return v.clone();
        };
        let from = a.len();
        if from >= n_vocab {
            return v.clone();
        }
        let mut a = a.clone();
        match (key, &mut a) {
            ("tokenizer.ggml.tokens", Array::String(t)) => {
                t.extend((from..n_vocab).map(|i| format!("[PAD{i}]")))
            }
            ("tokenizer.ggml.token_type", Array::I32(t)) => t.resize(n_vocab, 5),
            ("tokenizer.ggml.token_type", Array::U32(t)) => t.resize(n_vocab, 5),
            ("tokenizer.ggml.scores", Array::F32(t)) => t.resize(n_vocab, 0.0),
            _ => {}
        }
        Value::Array(a)
    }

    /// The file's metadata: general, synthetic labels, the architecture's
    /// hyperparameters (with the integer and float widths llama.cpp requires), then the
    /// source's `tokenizer.*` keys in their order.
    pub fn metadata(&self) -> Result<Vec<(String, Value)>, SynthError> {
        let s = &self.shape;
        let n_vocab = self.n_vocab()?;
        let a = s.arch;
        let u32v = |x: usize| Value::U32(x as u32);
        let mut m: Vec<(String, Value)> = vec![
            ("general.architecture".into(), Value::String(a.into())),
            ("general.name".into(), Value::String(s.display_name())),
            ("general.file_type".into(), Value::U32(self.quant.ftype())),
            ("general.quantization_version".into(), Value::U32(2)),
            (SYNTHETIC_KEY.into(), Value::Bool(true)),
            (
                "rllama.synthetic.shape".into(),
                Value::String(s.name.into()),
            ),
            ("rllama.synthetic.seed".into(), Value::U64(self.seed)),
            (
                "rllama.synthetic.tokenizer_from".into(),
                Value::String(self.tokenizer_name.clone()),
            ),
            (format!("{a}.context_length"), u32v(s.n_ctx)),
            (format!("{a}.embedding_length"), u32v(s.n_embd)),
            (format!("{a}.block_count"), u32v(s.n_layer)),
            (format!("{a}.feed_forward_length"), u32v(s.n_ff)),
            (format!("{a}.attention.head_count"), u32v(s.n_head)),
            (format!("{a}.attention.head_count_kv"), u32v(s.n_head_kv)),
            (format!("{a}.rope.freq_base"), Value::F32(s.rope_theta)),
            (
                format!("{a}.attention.layer_norm_rms_epsilon"),
                Value::F32(s.rms_eps),
            ),
            (format!("{a}.rope.dimension_count"), u32v(s.n_rot())),
            (format!("{a}.vocab_size"), u32v(n_vocab)),
        ];
        let f = &s.feat;
        if s.head_dim * s.n_head != s.n_embd {
            m.push((format!("{a}.attention.key_length"), u32v(s.head_dim)));
            m.push((format!("{a}.attention.value_length"), u32v(s.head_dim)));
        }
        if let Some(e) = &f.moe {
            m.push((format!("{a}.expert_count"), u32v(e.n_expert)));
            m.push((format!("{a}.expert_used_count"), u32v(e.n_used)));
            m.push((format!("{a}.expert_feed_forward_length"), u32v(e.n_ff)));
        }
        if f.sliding_window > 0 {
            m.push((
                format!("{a}.attention.sliding_window"),
                u32v(f.sliding_window),
            ));
            // Gemma 2's period is llama.cpp's default for it; gpt-oss's file says it.
            if s.arch == "gpt-oss" || f.swa_period != 2 {
                m.push((
                    format!("{a}.attention.sliding_window_pattern"),
                    u32v(f.swa_period),
                ));
            }
        }
        if let Some(b) = f.rope_theta_swa {
            m.push((format!("{a}.rope.freq_base_swa"), Value::F32(b)));
        }
        if let Some(c) = f.attn_softcap {
            m.push((format!("{a}.attn_logit_softcapping"), Value::F32(c)));
        }
        if let Some(c) = f.final_softcap {
            m.push((format!("{a}.final_logit_softcapping"), Value::F32(c)));
        }
        match f.rope_scaling {
            RopeScaling::None => {}
            RopeScaling::Yarn { factor, orig_ctx } => {
                m.push((
                    format!("{a}.rope.scaling.type"),
                    Value::String("yarn".into()),
                ));
                m.push((format!("{a}.rope.scaling.factor"), Value::F32(factor)));
                m.push((
                    format!("{a}.rope.scaling.original_context_length"),
                    u32v(orig_ctx),
                ));
            }
            RopeScaling::LongRope {
                orig_ctx,
                attn_factor,
            } => {
                m.push((
                    format!("{a}.rope.scaling.attn_factor"),
                    Value::F32(attn_factor),
                ));
                m.push((
                    format!("{a}.rope.scaling.original_context_length"),
                    u32v(orig_ctx),
                ));
            }
        }
        let source_vocab = self.source_vocab()?;
        if n_vocab > source_vocab {
            m.push((
                "rllama.synthetic.vocab_padded_from".into(),
                u32v(source_vocab),
            ));
        }
        m.extend(
            self.tokenizer
                .metadata
                .iter()
                .filter(|(k, _)| k.starts_with("tokenizer."))
                .map(|(k, v)| (k.clone(), self.padded(k, v, n_vocab))),
        );
        Ok(m)
    }
}

/// What [`synthesize`] wrote.
#[derive(Clone, Debug)]
pub struct SynthReport {
    pub path: PathBuf,
    pub file_bytes: u64,
    pub n_tensors: usize,
    pub n_params: u64,
    pub n_vocab: usize,
    /// Tensors per type, most frequent first.
    pub type_counts: Vec<(GgmlType, usize)>,
    pub elapsed: Duration,
}

/// wyrand: one multiply per 64 random bits, plenty for filling weights.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, stream: &str) -> Rng {
        // FNV-1a of the tensor name mixed into the seed: each tensor its own stream, so
        // the bytes depend only on (seed, name), not on chunking or order.
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for b in stream.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        let mut r = Rng(seed ^ h);
        r.next();
        r
    }

    #[inline]
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = (self.0 as u128).wrapping_mul((self.0 ^ 0xe703_7ed1_a0b4_28db) as u128);
        (t >> 64) as u64 ^ t as u64
    }

    /// Uniform in [0, 1).
    #[inline]
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }

    fn fill(&mut self, out: &mut [u8]) {
        let mut chunks = out.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let last = self.next().to_le_bytes();
            let n = rest.len();
            rest.copy_from_slice(&last[..n]);
        }
    }
}

/// Standard deviation of a uniform integer on `0..n`: sqrt((n^2 - 1) / 12).
fn uniform_std(n: u32) -> f32 {
    (((n * n) as f32 - 1.0) / 12.0).sqrt()
}

/// A per-block scale: `base` times a factor in [0.8, 1.2), as f16 bits.
#[inline]
fn jitter(rng: &mut Rng, base: f32) -> u16 {
    f32_to_f16(base * (0.8 + 0.4 * rng.unit()))
}

/// [`jitter`] with a random sign: blocks whose quants are offset (`q - 8` on 0..16 has
/// mean -1/2) then average to zero, as real blocks do (ggml's `d = max / -8` takes the
/// sign of the largest-magnitude value).
#[inline]
fn signed_jitter(rng: &mut Rng, base: f32) -> u16 {
    let d = jitter(rng, base);
    if rng.next() & 1 == 1 {
        d | 0x8000
    } else {
        d
    }
}

/// Packs 6-bit sub-block scales and mins the way `get_scale_min_k4` unpacks them.
pub(crate) fn pack_scale_min_k4(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..4 {
        q[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        q[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6);
        q[j + 8] = (sc[j + 4] & 0xf) | ((m[j + 4] & 0xf) << 4);
    }
    q
}

/// Fills `out` (whole blocks of a quantized `ty` the synthesizer writes: Q4_K, Q6_K, Q4_0,
/// Q8_0) with the random valid blocks a synthetic model gets, from `seed` and `stream`
/// (the same bytes for the same pair). For tools that need weights of a real layout
/// without writing a file (`decode_stream`).
pub fn random_blocks(ty: GgmlType, seed: u64, stream: &str, out: &mut [u8]) {
    fill_blocks(ty, &mut Rng::new(seed, stream), out);
}

/// Fills `out` (whole blocks of `ty`) with random valid blocks whose dequantized values
/// have mean ~0 and standard deviation ~[`WEIGHT_STD`].
fn fill_blocks(ty: GgmlType, rng: &mut Rng, out: &mut [u8]) {
    let bs = ty.type_size();
    debug_assert_eq!(out.len() % bs, 0);
    match ty {
        GgmlType::F16 | GgmlType::BF16 => {
            // Uniform with std ~WEIGHT_STD, rounded to f16 / bf16.
            for v in out.chunks_exact_mut(bs) {
                let x = WEIGHT_STD * 12f32.sqrt() * (rng.unit() - 0.5);
                let bits = match ty {
                    GgmlType::F16 => f32_to_f16(x),
                    _ => quant::f16::f32_to_bf16(x),
                };
                v.copy_from_slice(&bits.to_le_bytes());
            }
        }
        GgmlType::Q4_K => {
            // x = d*sc*q - dmin*m with q uniform on 0..16: sc uniform on 32..64 (rms
            // ~48.4), dmin = 8d and m = round(sc*15/16) centre each sub-block.
            let sc_rms = (47.5f32 * 47.5 + (32.0 * 32.0 - 1.0) / 12.0).sqrt();
            let base = WEIGHT_STD / (uniform_std(16) * sc_rms);
            for b in out.chunks_exact_mut(bs) {
                let d = jitter(rng, base);
                let dmin = f32_to_f16(quant::f16::f16_to_f32(d) * 8.0);
                let r = rng.next().to_le_bytes();
                let mut sc = [0u8; 8];
                let mut m = [0u8; 8];
                for j in 0..8 {
                    sc[j] = 32 + (r[j] & 31);
                    m[j] = ((sc[j] as u32 * 15 + 8) / 16) as u8;
                }
                b[0..2].copy_from_slice(&d.to_le_bytes());
                b[2..4].copy_from_slice(&dmin.to_le_bytes());
                b[4..16].copy_from_slice(&pack_scale_min_k4(&sc, &m));
                rng.fill(&mut b[16..144]);
            }
        }
        GgmlType::Q6_K => {
            // x = d*sc*(q - 32) with q uniform on 0..64, |sc| uniform on 16..32 with a
            // random sign (rms ~23.9).
            let sc_rms = (23.5f32 * 23.5 + (16.0 * 16.0 - 1.0) / 12.0).sqrt();
            let base = WEIGHT_STD / (uniform_std(64) * sc_rms);
            for b in out.chunks_exact_mut(bs) {
                rng.fill(&mut b[0..192]);
                let r = [rng.next().to_le_bytes(), rng.next().to_le_bytes()];
                for (j, s) in b[192..208].iter_mut().enumerate() {
                    let v = r[j / 8][j % 8];
                    let mag = 16 + (v & 15) as i8;
                    *s = (if v & 0x80 != 0 { -mag } else { mag }) as u8;
                }
                b[208..210].copy_from_slice(&jitter(rng, base).to_le_bytes());
            }
        }
        GgmlType::Q4_0 => {
            // x = d*(q - 8) with q uniform on 0..16, d of either sign.
            let base = WEIGHT_STD / uniform_std(16);
            for b in out.chunks_exact_mut(bs) {
                b[0..2].copy_from_slice(&signed_jitter(rng, base).to_le_bytes());
                rng.fill(&mut b[2..18]);
            }
        }
        GgmlType::Q8_0 => {
            // x = d*q with q uniform on -128..128, d of either sign.
            let base = WEIGHT_STD / uniform_std(256);
            for b in out.chunks_exact_mut(bs) {
                b[0..2].copy_from_slice(&signed_jitter(rng, base).to_le_bytes());
                rng.fill(&mut b[2..34]);
            }
        }
        GgmlType::Q5_K => {
            // x = d*sc*q - dmin*m with q uniform on 0..32 (4 low bits + 1 high bit), the
            // Q4_K layout of scales with a centring min.
            let sc_rms = (47.5f32 * 47.5 + (32.0 * 32.0 - 1.0) / 12.0).sqrt();
            let base = WEIGHT_STD / (uniform_std(32) * sc_rms);
            for b in out.chunks_exact_mut(bs) {
                let d = jitter(rng, base);
                let dmin = f32_to_f16(quant::f16::f16_to_f32(d) * 16.0);
                let r = rng.next().to_le_bytes();
                let mut sc = [0u8; 8];
                let mut m = [0u8; 8];
                for j in 0..8 {
                    sc[j] = 32 + (r[j] & 31);
                    m[j] = ((sc[j] as u32 * 31 + 16) / 32) as u8;
                }
                b[0..2].copy_from_slice(&d.to_le_bytes());
                b[2..4].copy_from_slice(&dmin.to_le_bytes());
                b[4..16].copy_from_slice(&pack_scale_min_k4(&sc, &m));
                rng.fill(&mut b[16..176]);
            }
        }
        GgmlType::IQ4_NL => {
            // x = d * v with v uniform over ggml's 16 table values (rms ~67.4), d of
            // either sign.
            let base = WEIGHT_STD / 67.4;
            for b in out.chunks_exact_mut(bs) {
                b[0..2].copy_from_slice(&signed_jitter(rng, base).to_le_bytes());
                rng.fill(&mut b[2..18]);
            }
        }
        GgmlType::Q3_K => {
            // x = d * (sc - 32) * q with q uniform on -4..4 (rms ~2.35) and the 6-bit
            // scales uniform (sc - 32 on -32..32, rms ~18.5); d (at 108) of either sign.
            let base = WEIGHT_STD / (2.35 * 18.5);
            for b in out.chunks_exact_mut(bs) {
                rng.fill(&mut b[0..108]);
                b[108..110].copy_from_slice(&signed_jitter(rng, base).to_le_bytes());
            }
        }
        GgmlType::IQ4_XS => {
            // x = d * (ls - 32) * v with v uniform over the 16 table values (rms ~67.4)
            // and the 6-bit sub-block scales uniform (ls - 32 on -32..32, rms ~18.5).
            let base = WEIGHT_STD / (67.4 * 18.5);
            for b in out.chunks_exact_mut(bs) {
                b[0..2].copy_from_slice(&signed_jitter(rng, base).to_le_bytes());
                rng.fill(&mut b[2..136]);
            }
        }
        GgmlType::MXFP4 => {
            // x = 2^(e - 128) * v with v uniform over ggml's doubled FP4 values (std ~5.85):
            // e from 119 to 121 puts the spread near 0.02.
            for b in out.chunks_exact_mut(bs) {
                b[0] = 119 + (rng.next() % 3) as u8;
                rng.fill(&mut b[1..17]);
            }
        }
        other => unreachable!("synthetic weights of type {other}"),
    }
}

/// Fills an F32 tensor: norms 1 ± 0.05, RoPE factors 1 to 4 (divisors of the angles),
/// biases, sinks and the router uniform with std ~0.02.
fn fill_f32(role: Role, name: &str, rng: &mut Rng, out: &mut [u8]) {
    let rope_factors = name.starts_with("rope_factors");
    for v in out.chunks_exact_mut(4) {
        let u = rng.unit() - 0.5;
        let x = match role {
            Role::Norm => 1.0 + 0.1 * u,
            _ if rope_factors => 2.5 + 3.0 * u,
            _ => WEIGHT_STD * 12f32.sqrt() * u,
        };
        v.copy_from_slice(&x.to_le_bytes());
    }
}

/// Bytes generated per piece handed to the writer.
const CHUNK_BYTES: usize = 8 << 20;

/// Generates every tensor of `plan` in order, in pieces of about [`CHUNK_BYTES`], and
/// hands each piece to `sink` (in order, on the calling thread); generation runs on a
/// second thread so it overlaps the writes.
fn generate(
    plan: &[Planned],
    seed: u64,
    mut sink: impl FnMut(&[u8]) -> io::Result<()>,
) -> io::Result<()> {
    let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(2);
    let (back_tx, back_rx) = mpsc::channel::<Vec<u8>>();
    std::thread::scope(|s| {
        s.spawn(move || {
            for p in plan {
                let mut rng = Rng::new(seed, &p.spec.name);
                let ty = p.spec.ty;
                let total = p.spec.data_bytes() as usize;
                let unit = ty.type_size();
                let step = (CHUNK_BYTES / unit).max(1) * unit;
                let mut done = 0;
                while done < total {
                    let n = step.min(total - done);
                    let mut buf = back_rx.try_recv().unwrap_or_default();
                    buf.resize(n, 0);
                    if ty == GgmlType::F32 {
                        fill_f32(p.role, &p.spec.name, &mut rng, &mut buf);
                    } else {
                        fill_blocks(ty, &mut rng, &mut buf);
                    }
                    if tx.send(buf).is_err() {
                        return; // the writer failed and hung up
                    }
                    done += n;
                }
            }
        });
        for buf in rx {
            sink(&buf)?;
            back_tx.send(buf).ok();
        }
        Ok(())
    })
}

/// Streams the whole file for `spec` into `w`; `progress(done, total)` is called after
/// each piece with data bytes. Returns the sink and the bytes written.
pub fn write_to<W: Write>(
    spec: &SynthSpec<'_>,
    w: W,
    mut progress: impl FnMut(u64, u64),
) -> Result<(W, u64), io::Error> {
    let inv = |e: SynthError| io::Error::new(io::ErrorKind::InvalidInput, e.to_string());
    spec.shape.validate(spec.quant).map_err(inv)?;
    let n_vocab = spec.n_vocab().map_err(inv)?;
    let metadata = spec.metadata().map_err(inv)?;
    let plan = plan(&spec.shape, spec.quant, n_vocab);
    let specs: Vec<TensorSpec> = plan.iter().map(|p| p.spec.clone()).collect();
    let total: u64 = specs.iter().map(TensorSpec::data_bytes).sum();
    let mut sw = StreamWriter::new(w, &metadata, &specs)?;
    let mut done = 0u64;
    generate(&plan, spec.seed, |piece| {
        sw.write_data(piece)?;
        done += piece.len() as u64;
        progress(done, total);
        Ok(())
    })?;
    let bytes = sw.bytes_written();
    Ok((sw.finish()?, bytes))
}

/// Writes the synthetic model to `path` (through `path` + `.part`, renamed at the end).
pub fn synthesize(
    spec: &SynthSpec<'_>,
    path: &Path,
    progress: impl FnMut(u64, u64),
) -> Result<SynthReport, SynthError> {
    let t0 = Instant::now();
    spec.shape.validate(spec.quant)?;
    let n_vocab = spec.n_vocab()?;
    let io_err = |source| SynthError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".part");
    let tmp = PathBuf::from(tmp);
    let file = File::create(&tmp).map_err(io_err)?;
    let result = write_to(spec, file, progress).and_then(|(f, bytes)| {
        f.sync_all()?;
        Ok(bytes)
    });
    let file_bytes = match result {
        Ok(b) => b,
        Err(e) => {
            std::fs::remove_file(&tmp).ok();
            return Err(io_err(e));
        }
    };
    std::fs::rename(&tmp, path).map_err(io_err)?;
    let plan = plan(&spec.shape, spec.quant, n_vocab);
    let mut type_counts: Vec<(GgmlType, usize)> = Vec::new();
    for p in &plan {
        match type_counts.iter_mut().find(|(t, _)| *t == p.spec.ty) {
            Some((_, c)) => *c += 1,
            None => type_counts.push((p.spec.ty, 1)),
        }
    }
    type_counts.sort_by_key(|c| std::cmp::Reverse(c.1));
    Ok(SynthReport {
        path: path.to_path_buf(),
        file_bytes,
        n_tensors: plan.len(),
        n_params: plan.iter().map(|p| p.spec.n_elements()).sum(),
        n_vocab,
        type_counts,
        elapsed: t0.elapsed(),
    })
}

/// True when a GGUF file says it was made by [`synthesize`].
pub fn is_synthetic(f: &GgufFile) -> bool {
    matches!(f.get_bool(SYNTHETIC_KEY), Ok(Some(true)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_match_the_published_configs() {
        let l = Shape::llama3_8b();
        assert_eq!(
            (l.n_embd, l.n_layer, l.n_head, l.n_head_kv, l.n_ff, l.n_ctx),
            (4096, 32, 32, 8, 14336, 8192)
        );
        assert_eq!(
            (l.rope_theta, l.rms_eps, l.qkv_bias),
            (500000.0, 1e-5, false)
        );
        let q = Shape::qwen25_7b();
        assert_eq!(
            (q.n_embd, q.n_layer, q.n_head, q.n_head_kv, q.n_ff, q.n_ctx),
            (3584, 28, 28, 4, 18944, 32768)
        );
        assert_eq!((q.rope_theta, q.rms_eps, q.qkv_bias), (1e6, 1e-6, true));
        for s in [l, q] {
            assert_eq!(s.head_dim(), 128);
            s.validate(SynthQuant::Q4KM).unwrap();
            assert_eq!(Shape::named(s.name).unwrap(), s);
        }
        assert!(Shape::named("llama3-70b").is_err());
    }

    #[test]
    fn scaled_shapes_stay_valid() {
        let l = Shape::llama3_8b().scaled_down(8).with_layers(2);
        assert_eq!((l.n_embd, l.n_head, l.n_head_kv, l.n_ff), (512, 4, 1, 1792));
        l.validate(SynthQuant::Q4KM).unwrap();
        let q = Shape::qwen25_7b().scaled_down(8).with_layers(2);
        assert_eq!((q.n_embd, q.n_head, q.n_head_kv, q.n_ff), (512, 4, 1, 2304));
        q.validate(SynthQuant::Q4KM).unwrap();
        assert_eq!(
            q.display_name(),
            "synthetic qwen2.5-7b (2 of 28 layers, widths / 8, random weights)"
        );
        assert!(Shape::llama3_8b()
            .with_layers(33)
            .validate(SynthQuant::Q4KM)
            .is_err());
        assert!(Shape::llama3_8b()
            .with_layers(0)
            .validate(SynthQuant::Q4KM)
            .is_err());
    }

    /// llama.cpp's Q4_K_M on a 32-layer model: attn_v and ffn_down are Q6_K in layers
    /// 0-3, 28-31 and 6, 9, ..., 27 (16 each).
    #[test]
    fn q4_k_m_mix_follows_llama_cpp() {
        let more: Vec<usize> = (0..32).filter(|&i| use_more_bits(i, 32)).collect();
        assert_eq!(
            more,
            [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
        );
        let p = plan(&Shape::llama3_8b(), SynthQuant::Q4KM, 49152);
        assert_eq!(p.len(), 2 + 9 * 32 + 1);
        let ty = |n: &str| p.iter().find(|t| t.spec.name == n).unwrap().spec.ty;
        assert_eq!(ty("token_embd.weight"), GgmlType::Q4_K);
        assert_eq!(ty("output.weight"), GgmlType::Q6_K);
        assert_eq!(ty("output_norm.weight"), GgmlType::F32);
        assert_eq!(ty("blk.6.attn_v.weight"), GgmlType::Q6_K);
        assert_eq!(ty("blk.7.attn_v.weight"), GgmlType::Q4_K);
        assert_eq!(ty("blk.7.ffn_down.weight"), GgmlType::Q4_K);
        assert_eq!(ty("blk.27.ffn_down.weight"), GgmlType::Q6_K);
        assert_eq!(ty("blk.27.attn_q.weight"), GgmlType::Q4_K);
        let count = |t: GgmlType| p.iter().filter(|x| x.spec.ty == t).count();
        assert_eq!(count(GgmlType::Q6_K), 16 + 16 + 1);
        assert_eq!(count(GgmlType::F32), 2 * 32 + 1);
        assert_eq!(count(GgmlType::Q4_K), 1 + 32 * 5 + 16 + 16);

        // Qwen2.5-7B: 28 layers (0-2, 24-27 and 5, 8, ..., 23), three F32 biases a layer.
        let p = plan(&Shape::qwen25_7b(), SynthQuant::Q4KM, 151936);
        let count = |t: GgmlType| p.iter().filter(|x| x.spec.ty == t).count();
        let more = (0..28).filter(|&i| use_more_bits(i, 28)).count();
        assert_eq!(more, 14);
        assert_eq!(count(GgmlType::Q6_K), 2 * more + 1);
        assert_eq!(count(GgmlType::F32), 5 * 28 + 1);
    }

    /// Tensor bytes of the full-size files: llama3-8b with its real 128k vocabulary comes
    /// to the size of the published Q4_K_M files (4.92 GB incl. metadata); ours differs
    /// by the vocabulary rows of token_embd and output only.
    #[test]
    fn full_size_tensor_bytes() {
        let bytes = |s: &Shape, v: usize| -> u64 {
            plan(s, SynthQuant::Q4KM, v)
                .iter()
                .map(|p| p.spec.data_bytes())
                .sum()
        };
        let l = Shape::llama3_8b();
        let real = bytes(&l, l.real_vocab);
        assert!((4.90e9..4.93e9).contains(&(real as f64)), "{real}");
        let ours = bytes(&l, 49152);
        let per_row = 4096 / 256 * (144 + 210) as u64;
        assert_eq!(real - ours, (128256 - 49152) * per_row);
    }

    #[test]
    fn scale_min_packing_round_trips() {
        let mut rng = Rng::new(1, "pack");
        for _ in 0..100 {
            let r = rng.next().to_le_bytes();
            let s = rng.next().to_le_bytes();
            let sc: [u8; 8] = std::array::from_fn(|i| r[i] & 63);
            let m: [u8; 8] = std::array::from_fn(|i| s[i] & 63);
            let q = pack_scale_min_k4(&sc, &m);
            for j in 0..8 {
                assert_eq!(quant::get_scale_min_k4(j, &q), (sc[j], m[j]));
            }
        }
    }

    /// The dequantized values of every weight type have mean ~0, std ~0.02, and every
    /// scale is finite.
    #[test]
    fn blocks_have_a_realistic_spread() {
        for ty in [
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::Q4_0,
            GgmlType::Q8_0,
            GgmlType::Q3_K,
            GgmlType::Q5_K,
            GgmlType::IQ4_NL,
            GgmlType::IQ4_XS,
            GgmlType::F16,
            GgmlType::BF16,
        ] {
            let n = 256 * 512;
            let mut buf = vec![0u8; n / ty.block_size() * ty.type_size()];
            fill_blocks(ty, &mut Rng::new(7, ty.name()), &mut buf);
            let mut x = vec![0f32; n];
            quant::dequantize_row(ty, &buf, &mut x).unwrap();
            assert!(x.iter().all(|v| v.is_finite()), "{ty}");
            let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
            let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
            let std = var.sqrt();
            assert!(mean.abs() < 0.002, "{ty}: mean {mean}");
            assert!((0.017..0.023).contains(&std), "{ty}: std {std}");
        }
    }

    #[test]
    fn same_seed_same_bytes_any_chunking() {
        let mut a = vec![0u8; 144 * 10];
        fill_blocks(GgmlType::Q4_K, &mut Rng::new(3, "t"), &mut a);
        let mut b = vec![0u8; 144 * 10];
        let mut rng = Rng::new(3, "t");
        fill_blocks(GgmlType::Q4_K, &mut rng, &mut b[..144 * 4]);
        fill_blocks(GgmlType::Q4_K, &mut rng, &mut b[144 * 4..]);
        assert_eq!(a, b);
        let mut c = vec![0u8; 144 * 10];
        fill_blocks(GgmlType::Q4_K, &mut Rng::new(4, "t"), &mut c);
        assert_ne!(a, c);
    }
}
