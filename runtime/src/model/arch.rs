//! The architectures we run, each declared once: its GGUF keys with llama.cpp's defaults
//! become the dimensions ([`Config`]) and a [`ModelSpec`] that both executors read. An
//! architecture is a function of a dozen lines here; what it computes lives in `spec.rs`
//! features, not in per-architecture branches of the forward pass.

use quant::ops::rope::{Rope, RopeStyle};

use super::spec::{Act, AttnSpec, FfnSpec, Gating, LayerSpec, ModelSpec, MoeSpec};
use super::ModelError;
use crate::gguf::{Array, GgufFile};

/// An architecture, by its `general.architecture` name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Qwen3Moe,
    Gemma2,
    Gemma3,
    Phi3,
    Smollm3,
    GptOss,
}

impl Arch {
    pub const ALL: [Arch; 9] = [
        Arch::Llama,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Qwen3Moe,
        Arch::Gemma2,
        Arch::Gemma3,
        Arch::Phi3,
        Arch::Smollm3,
        Arch::GptOss,
    ];

    pub fn parse(name: &str) -> Result<Arch, ModelError> {
        Arch::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| ModelError::UnknownArch(name.to_string()))
    }

    /// The `general.architecture` string.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Gemma2 => "gemma2",
            Arch::Gemma3 => "gemma3",
            Arch::Phi3 => "phi3",
            Arch::Smollm3 => "smollm3",
            Arch::GptOss => "gpt-oss",
        }
    }

    /// The supported names, for error messages.
    pub fn names() -> String {
        Arch::ALL.map(Arch::name).join(", ")
    }

    /// How the architecture pairs rotary dimensions (llama.cpp's `llama_model_rope_type`).
    pub fn rope_style(self) -> RopeStyle {
        match self {
            Arch::Llama | Arch::Smollm3 => RopeStyle::Normal,
            _ => RopeStyle::Neox,
        }
    }
}

/// Dimensions and numbers every layer shares.
#[derive(Clone, Debug)]
pub struct Config {
    pub arch: Arch,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    /// Rotated dimensions per head (partial rotary when below `head_dim_k`).
    pub n_rot: usize,
    pub n_ctx_train: usize,
    /// The context RoPE was trained for before scaling (YaRN's `n_ctx_orig`).
    pub n_ctx_orig: usize,
    /// YaRN's `beta_fast`, `beta_slow` (what ggml's rope derives the correction dims from).
    pub yarn_beta: [f32; 2],
    pub rms_eps: f32,
    /// How an embedding of a whole input is made from its tokens' hidden states
    /// (`{arch}.pooling_type`; `None` where the file names none).
    pub pooling: Pooling,
}

/// How the hidden states (after the final norm) of an input's tokens become one
/// embedding, as llama.cpp's `pooling_type` numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// No pooling: the file is not an embedding model.
    None,
    /// The mean over every token.
    Mean,
    /// The first token's (CLS).
    Cls,
    /// The last token's (Qwen3-Embedding and other decoder embedders).
    Last,
}

impl Pooling {
    /// llama.cpp's number for it (`LLAMA_POOLING_TYPE_*`).
    pub fn llama_id(self) -> i32 {
        match self {
            Pooling::None => 0,
            Pooling::Mean => 1,
            Pooling::Cls => 2,
            Pooling::Last => 3,
        }
    }

    /// From llama.cpp's number (rank pooling, 4, scores rerankers and is not an
    /// embedding).
    pub fn from_llama_id(id: usize) -> Option<Pooling> {
        match id {
            0 => Some(Pooling::None),
            1 => Some(Pooling::Mean),
            2 => Some(Pooling::Cls),
            3 => Some(Pooling::Last),
            _ => None,
        }
    }

    /// From a name (`mean`, `cls`, `last`, `none`), as `--pooling` takes it.
    pub fn parse(s: &str) -> Option<Pooling> {
        match s {
            "none" => Some(Pooling::None),
            "mean" => Some(Pooling::Mean),
            "cls" => Some(Pooling::Cls),
            "last" => Some(Pooling::Last),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pooling::None => "none",
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }
}

/// Reads `{arch}.*` keys.
struct Keys<'a> {
    f: &'a GgufFile,
    a: &'static str,
}

impl Keys<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.a)
    }
    fn usize(&self, k: &str) -> Result<Option<usize>, ModelError> {
        Ok(self.f.get_usize(&self.key(k))?)
    }
    fn req(&self, k: &str) -> Result<usize, ModelError> {
        self.usize(k)?
            .ok_or_else(|| ModelError::MissingKey(self.key(k)))
    }
    fn f32(&self, k: &str) -> Result<Option<f32>, ModelError> {
        Ok(self.f.get_f64(&self.key(k))?.map(|v| v as f32))
    }
    fn str(&self, k: &str) -> Result<Option<&str>, ModelError> {
        Ok(self.f.get_str(&self.key(k))?)
    }
    /// Per-layer flags from `attention.sliding_window_pattern`: an array of booleans, or
    /// a period `n` (every layer but each n-th slides; 0: all slide), `default` if absent
    /// (llama.cpp's `set_swa_pattern`, dense layers last in each period).
    fn swa_pattern(&self, n_layer: usize, default: usize) -> Result<Vec<bool>, ModelError> {
        let k = self.key("attention.sliding_window_pattern");
        if let Some(Array::Bool(v)) = self.f.get_array(&k).ok().flatten() {
            if v.len() < n_layer {
                return Err(ModelError::Invalid(format!(
                    "{k} has {} entries for {n_layer} layers",
                    v.len()
                )));
            }
            return Ok(v[..n_layer].to_vec());
        }
        let p = self
            .usize("attention.sliding_window_pattern")?
            .unwrap_or(default);
        Ok((0..n_layer).map(|il| p == 0 || il % p < p - 1).collect())
    }
}

/// The RoPE settings shared by a model's layers, from its `rope.*` keys.
struct RopeKeys {
    freq_base: f32,
    freq_scale: f32,
    /// YaRN (ext 1) or none; attention factor as llama.cpp's context computes it.
    ext_factor: f32,
    attn_factor: f32,
    beta: [f32; 2],
}

fn rope_keys(k: &Keys<'_>) -> Result<RopeKeys, ModelError> {
    let freq_base = k.f32("rope.freq_base")?.unwrap_or(10000.0);
    let factor = k
        .f32("rope.scaling.factor")?
        .filter(|&f| f > 0.0)
        .unwrap_or(1.0);
    let kind = k.str("rope.scaling.type")?.unwrap_or("linear");
    let mut attn_factor = k.f32("rope.scaling.attn_factor")?.unwrap_or(1.0);
    let (freq_scale, ext_factor) = match kind {
        "none" => (1.0, 0.0),
        "linear" | "longrope" => (1.0 / factor, 0.0),
        "yarn" => {
            let fs = 1.0 / factor;
            // llama.cpp (`llama_context`): mscale from the factor (or its log multiplier),
            // then divided by the magnitude ggml's rope applies itself for YaRN.
            let get_mscale = |s: f32, m: f32| {
                if s <= 1.0 {
                    1.0
                } else {
                    0.1 * m * s.ln() + 1.0
                }
            };
            let log_mul = k.f32("rope.scaling.yarn_log_multiplier")?.unwrap_or(0.0);
            let mut af = if log_mul != 0.0 {
                get_mscale(factor, 1.0) / get_mscale(factor, log_mul)
            } else {
                get_mscale(factor, 1.0)
            };
            af *= 1.0 / (1.0 + 0.1 * factor.ln());
            attn_factor *= af;
            (fs, 1.0)
        }
        other => {
            return Err(ModelError::Unsupported(format!(
                "rope scaling type {other:?}"
            )))
        }
    };
    let beta = [
        k.f32("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
        k.f32("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
    ];
    Ok(RopeKeys {
        freq_base,
        freq_scale,
        ext_factor,
        attn_factor,
        beta,
    })
}

/// Reads the file's dimensions and declares its layers. `n_ctx` is the context the model
/// will run with (Phi-3 picks its LongRoPE factors by it, as llama.cpp does); `None`
/// uses the training context.
pub fn declare(f: &GgufFile, n_ctx: Option<usize>) -> Result<(Config, ModelSpec), ModelError> {
    let arch = Arch::parse(f.architecture()?)?;
    let k = Keys { f, a: arch.name() };
    let n_embd = k.req("embedding_length")?;
    let n_layer = k.req("block_count")?;
    let n_head = k.req("attention.head_count")?;
    let n_head_kv = k.usize("attention.head_count_kv")?.unwrap_or(n_head);
    if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 || n_layer == 0 || n_embd == 0 {
        return Err(ModelError::Invalid(format!(
            "head_count {n_head} / head_count_kv {n_head_kv} / block_count {n_layer} / embedding_length {n_embd} are inconsistent"
        )));
    }
    let head_dim_k = k.usize("attention.key_length")?.unwrap_or(n_embd / n_head);
    let head_dim_v = k
        .usize("attention.value_length")?
        .unwrap_or(n_embd / n_head);
    let n_rot = k.usize("rope.dimension_count")?.unwrap_or(head_dim_k);
    if n_rot > head_dim_k || n_rot % 2 != 0 {
        return Err(ModelError::Invalid(format!(
            "rope.dimension_count {n_rot} vs head dim {head_dim_k}"
        )));
    }
    let n_vocab = match k.usize("vocab_size")? {
        Some(v) => v,
        None => f
            .get_array("tokenizer.ggml.tokens")?
            .map(|a| a.len())
            .ok_or_else(|| ModelError::MissingKey("tokenizer.ggml.tokens".into()))?,
    };
    let n_ctx_train = k.usize("context_length")?.unwrap_or(2048);
    let n_ctx_orig = k
        .usize("rope.scaling.original_context_length")?
        .unwrap_or(n_ctx_train);
    let n_ff = k.usize("feed_forward_length")?.unwrap_or(0);
    let n_expert = k.usize("expert_count")?.unwrap_or(0);
    let n_used = k.usize("expert_used_count")?.unwrap_or(0);
    let n_ff_exp = k.usize("expert_feed_forward_length")?;
    // Far above any real model, low enough that products of them cannot overflow and
    // nothing is allocated from a count the tensors do not back.
    for (name, v, cap) in [
        ("block_count", n_layer, 1 << 12),
        ("embedding_length", n_embd, 1 << 20),
        ("feed_forward_length", n_ff, 1 << 22),
        ("attention.head_count", n_head, 1 << 12),
        ("attention.key_length", head_dim_k, 1 << 16),
        ("attention.value_length", head_dim_v, 1 << 16),
        ("vocab_size", n_vocab, 1 << 24),
        ("expert_count", n_expert, 1 << 12),
        ("expert_feed_forward_length", n_ff_exp.unwrap_or(0), 1 << 22),
    ] {
        if v > cap {
            return Err(ModelError::Invalid(format!(
                "{}.{name} is {v}, above the limit of {cap}",
                arch.name()
            )));
        }
    }
    if n_expert > 0 && (n_used == 0 || n_used > n_expert) {
        return Err(ModelError::Invalid(format!(
            "expert_used_count {n_used} with expert_count {n_expert}"
        )));
    }
    let rms_eps = k.f32("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5);
    let pooling = match k.usize("pooling_type")? {
        None => Pooling::None,
        Some(id) => Pooling::from_llama_id(id).ok_or_else(|| {
            ModelError::Invalid(format!(
                "{}.pooling_type {id} is not an embedding pooling (rank pooling scores \
                 rerankers, which are not supported)",
                arch.name()
            ))
        })?,
    };
    let rk = rope_keys(&k)?;
    let cfg = Config {
        arch,
        n_vocab,
        n_embd,
        n_layer,
        n_head,
        n_head_kv,
        head_dim_k,
        head_dim_v,
        n_rot,
        n_ctx_train,
        n_ctx_orig,
        yarn_beta: rk.beta,
        rms_eps,
        pooling,
    };

    // The defaults every architecture starts from: llama's layer.
    let rope = |freq_base: f32| {
        let mut r = Rope::new(arch.rope_style(), n_rot, freq_base, rk.freq_scale);
        r.ext_factor = rk.ext_factor;
        r.attn_factor = rk.attn_factor;
        r.corr_dims = r.yarn_corr_dims(n_ctx_orig, rk.beta[0], rk.beta[1]);
        r
    };
    let kq_scale = 1.0 / (head_dim_k as f32).sqrt();
    let dense = |act| {
        if n_ff == 0 {
            Err(ModelError::MissingKey(k.key("feed_forward_length")))
        } else {
            Ok(FfnSpec::Dense { n_ff, act })
        }
    };
    let moe = |gating, norm_weights, act| -> Result<FfnSpec, ModelError> {
        if n_expert == 0 {
            return Err(ModelError::MissingKey(k.key("expert_count")));
        }
        Ok(FfnSpec::Moe(MoeSpec {
            n_expert,
            n_used,
            n_ff: n_ff_exp.unwrap_or(n_ff.checked_div(n_used).unwrap_or(0)),
            gating,
            norm_weights,
            weight_scale: k.f32("expert_weights_scale")?.unwrap_or(1.0),
            act,
        }))
    };
    let layer = |attn: AttnSpec, ffn: FfnSpec| LayerSpec {
        attn,
        post_attn_norm: false,
        ffn_norm: "ffn_norm",
        ffn,
        post_ffn_norm: false,
    };
    let attn = |rope: Option<Rope>| AttnSpec {
        rope,
        qk_norm: false,
        window: 0,
        q_scale: None,
        kq_scale,
        softcap: None,
        sinks: false,
    };
    let freq_factors = |name: &str| -> Result<Option<Vec<f32>>, ModelError> {
        match f.tensor(name) {
            None => Ok(None),
            Some(t) if t.n_elements() == (n_rot / 2) as u64 => super::f32_vec(f, t).map(Some),
            Some(t) => Err(ModelError::BadShape {
                name: name.into(),
                found: t.shape.clone(),
                expected: vec![(n_rot / 2) as u64],
                ty: t.ty,
            }),
        }
    };
    let all = |l: LayerSpec| vec![l; n_layer];
    let mut embd_scale = 1.0;
    let mut final_softcap = None;
    let mut out_rows_after_last_attn = true;

    let layers = match arch {
        Arch::Llama => {
            // Llama 3's `rope_freqs`; Mixtral is a llama with experts.
            let mut r = rope(rk.freq_base);
            r.freq_factors = freq_factors("rope_freqs.weight")?;
            let ffn = if n_expert > 0 {
                moe(Gating::Softmax, true, Act::Silu)?
            } else {
                dense(Act::Silu)?
            };
            all(layer(attn(Some(r)), ffn))
        }
        Arch::Qwen2 => all(layer(attn(Some(rope(rk.freq_base))), dense(Act::Silu)?)),
        Arch::Qwen3 | Arch::Qwen3Moe => {
            let a = AttnSpec {
                qk_norm: true,
                ..attn(Some(rope(rk.freq_base)))
            };
            let ffn = if arch == Arch::Qwen3Moe {
                moe(Gating::Softmax, true, Act::Silu)?
            } else {
                dense(Act::Silu)?
            };
            all(layer(a, ffn))
        }
        Arch::Smollm3 => {
            // Every fourth layer has no positional encoding (NoPE).
            let scale = k.f32("attention.scale")?.unwrap_or(kq_scale);
            (0..n_layer)
                .map(|il| {
                    let r = ((il + 1) % 4 != 0).then(|| rope(rk.freq_base));
                    Ok(layer(
                        AttnSpec {
                            kq_scale: scale,
                            ..attn(r)
                        },
                        dense(Act::Silu)?,
                    ))
                })
                .collect::<Result<_, ModelError>>()?
        }
        Arch::Phi3 => {
            // LongRoPE: the long factors when the context exceeds the original one.
            let ctx = n_ctx.unwrap_or(n_ctx_train);
            let mut r = rope(rk.freq_base);
            r.freq_factors = if ctx > n_ctx_orig {
                freq_factors("rope_factors_long.weight")?
            } else {
                freq_factors("rope_factors_short.weight")?
            };
            // llama.cpp turns Phi-3's sliding window off (a converter issue).
            let a = AttnSpec {
                q_scale: Some(kq_scale),
                kq_scale: 1.0,
                ..attn(Some(r))
            };
            all(layer(a, dense(Act::Silu)?))
        }
        Arch::Gemma2 | Arch::Gemma3 => {
            let (default_window, pattern) = match arch {
                Arch::Gemma2 => (4096, 2),
                _ => (0, 6),
            };
            let window = k
                .usize("attention.sliding_window")?
                .unwrap_or(default_window);
            let swa = if window > 0 {
                k.swa_pattern(n_layer, pattern)?
            } else {
                vec![false; n_layer]
            };
            let base_swa = match arch {
                Arch::Gemma2 => k.f32("rope.freq_base_swa")?.unwrap_or(rk.freq_base),
                _ => k.f32("rope.freq_base_swa")?.unwrap_or(10000.0),
            };
            // Gemma 2 27B and Gemma 3 27B scale by n_embd / n_head, every other size by
            // the head dimension.
            let big = match arch {
                Arch::Gemma2 => n_layer == 46,
                _ => n_layer == 62,
            };
            let q_scale = if big {
                1.0 / ((n_embd / n_head) as f32).sqrt()
            } else {
                kq_scale
            };
            let softcap = match arch {
                Arch::Gemma2 => k.f32("attn_logit_softcapping")?.filter(|&v| v != 0.0),
                _ => None,
            };
            embd_scale = (n_embd as f32).sqrt();
            final_softcap = k.f32("final_logit_softcapping")?.filter(|&v| v != 0.0);
            swa.iter()
                .map(|&s| {
                    Ok(LayerSpec {
                        post_attn_norm: true,
                        post_ffn_norm: true,
                        ..layer(
                            AttnSpec {
                                qk_norm: arch == Arch::Gemma3,
                                window: if s { window } else { 0 },
                                q_scale: Some(q_scale),
                                kq_scale: 1.0,
                                softcap,
                                ..attn(Some(rope(if s { base_swa } else { rk.freq_base })))
                            },
                            dense(Act::Gelu)?,
                        )
                    })
                })
                .collect::<Result<_, ModelError>>()?
        }
        Arch::GptOss => {
            let window = k.usize("attention.sliding_window")?.unwrap_or(0);
            let swa = k.swa_pattern(n_layer, 2)?;
            let base_swa = k.f32("rope.freq_base_swa")?.unwrap_or(rk.freq_base);
            let ffn = moe(
                Gating::SoftmaxOfTopK,
                false,
                Act::SwigluOai {
                    alpha: 1.702,
                    limit: 7.0,
                },
            )?;
            out_rows_after_last_attn = false;
            swa.iter()
                .map(|&s| LayerSpec {
                    ffn_norm: "post_attention_norm",
                    ..layer(
                        AttnSpec {
                            window: if s { window } else { 0 },
                            sinks: true,
                            ..attn(Some(rope(if s { base_swa } else { rk.freq_base })))
                        },
                        ffn,
                    )
                })
                .collect()
        }
    };
    let spec = ModelSpec {
        layers,
        embd_scale,
        final_softcap,
        out_rows_after_last_attn,
    };
    Ok((cfg, spec))
}
