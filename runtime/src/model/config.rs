//! Hyperparameters read from GGUF metadata (`{arch}.*` keys), with llama.cpp's defaults.

use crate::gguf::GgufFile;
use quant::ops::rope::RopeStyle;

use super::ModelError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Gemma3,
}

impl Arch {
    pub fn parse(name: &str) -> Result<Arch, ModelError> {
        match name {
            "llama" => Ok(Arch::Llama),
            "qwen2" => Ok(Arch::Qwen2),
            "gemma3" => Ok(Arch::Gemma3),
            other => Err(ModelError::UnknownArch(other.to_string())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Gemma3 => "gemma3",
        }
    }

    /// How each architecture pairs rotary dimensions (llama.cpp's rope type per arch).
    pub fn rope_style(self) -> RopeStyle {
        match self {
            Arch::Llama => RopeStyle::Normal,
            Arch::Qwen2 | Arch::Gemma3 => RopeStyle::Neox,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    pub arch: Arch,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    pub n_rot: usize,
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    pub rope_freq_base: f32,
    pub rope_freq_scale: f32,
    /// Sliding-window size for SWA layers (0 = none).
    pub n_swa: usize,
    pub rope_freq_base_swa: f32,
    /// Per layer: true when the layer uses sliding-window attention.
    pub swa_layers: Vec<bool>,
    /// Multiplier applied to Q before attention (kq scale is then 1).
    pub attn_scale: f32,
    /// Embeddings are multiplied by this after lookup (gemma: sqrt(n_embd)).
    pub embd_scale: f32,
    pub final_logit_softcap: Option<f32>,
}

impl Config {
    pub fn from_gguf(f: &GgufFile) -> Result<Config, ModelError> {
        let arch = Arch::parse(f.architecture()?)?;
        let a = arch.name();
        let key = |k: &str| format!("{a}.{k}");
        let req = |k: &str| -> Result<usize, ModelError> {
            f.get_usize(&key(k))?
                .ok_or_else(|| ModelError::MissingKey(key(k)))
        };
        let n_embd = req("embedding_length")?;
        let n_layer = req("block_count")?;
        let n_ff = req("feed_forward_length")?;
        let n_head = req("attention.head_count")?;
        let n_head_kv = f
            .get_usize(&key("attention.head_count_kv"))?
            .unwrap_or(n_head);
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 || n_layer == 0 || n_embd == 0 {
            return Err(ModelError::Invalid(format!(
                "head_count {n_head} / head_count_kv {n_head_kv} / block_count {n_layer} / embedding_length {n_embd} are inconsistent"
            )));
        }
        let head_dim_k = f
            .get_usize(&key("attention.key_length"))?
            .unwrap_or(n_embd / n_head);
        let head_dim_v = f
            .get_usize(&key("attention.value_length"))?
            .unwrap_or(n_embd / n_head);
        let n_rot = f
            .get_usize(&key("rope.dimension_count"))?
            .unwrap_or(head_dim_k);
        if n_rot > head_dim_k || n_rot % 2 != 0 {
            return Err(ModelError::Invalid(format!(
                "rope.dimension_count {n_rot} vs head dim {head_dim_k}"
            )));
        }
        let n_vocab = match f.get_usize(&key("vocab_size"))? {
            Some(v) => v,
            None => f
                .get_array("tokenizer.ggml.tokens")?
                .map(|a| a.len())
                .ok_or_else(|| ModelError::MissingKey("tokenizer.ggml.tokens".into()))?,
        };
        let rms_eps = f
            .get_f64(&key("attention.layer_norm_rms_epsilon"))?
            .unwrap_or(1e-5) as f32;
        let rope_freq_base = f.get_f64(&key("rope.freq_base"))?.unwrap_or(10000.0) as f32;
        let rope_freq_scale = match f.get_str(&key("rope.scaling.type"))? {
            None | Some("none") => 1.0,
            Some("linear") => {
                let factor = f.get_f64(&key("rope.scaling.factor"))?.unwrap_or(1.0) as f32;
                if factor > 0.0 {
                    1.0 / factor
                } else {
                    1.0
                }
            }
            Some(other) => {
                // YaRN and friends change the rotation itself; refuse rather than be wrong.
                if f.get_f64(&key("rope.scaling.factor"))?.unwrap_or(1.0) != 1.0 {
                    return Err(ModelError::Unsupported(format!(
                        "rope scaling type {other:?}"
                    )));
                }
                1.0
            }
        };
        let n_ctx_train = f.get_usize(&key("context_length"))?.unwrap_or(2048);
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
        ] {
            if v > cap {
                return Err(ModelError::Invalid(format!(
                    "{a}.{name} is {v}, above the limit of {cap}"
                )));
            }
        }

        let mut n_swa = 0;
        let mut swa_layers = vec![false; n_layer];
        let mut rope_freq_base_swa = rope_freq_base;
        let mut attn_scale = 1.0 / (head_dim_k as f32).sqrt();
        let mut embd_scale = 1.0;
        let mut final_logit_softcap = None;
        if arch == Arch::Gemma3 {
            n_swa = f.get_usize(&key("attention.sliding_window"))?.unwrap_or(0);
            if n_swa > 0 {
                let pattern = f
                    .get_usize(&key("attention.sliding_window_pattern"))?
                    .unwrap_or(6);
                for (il, s) in swa_layers.iter_mut().enumerate() {
                    *s = pattern == 0 || il % pattern < pattern - 1;
                }
                rope_freq_base_swa =
                    f.get_f64(&key("rope.freq_base_swa"))?.unwrap_or(10000.0) as f32;
            }
            // Gemma 3 27B scales by n_embd / n_head; every other size by the head dim.
            attn_scale = if n_layer == 62 {
                1.0 / ((n_embd / n_head) as f32).sqrt()
            } else {
                1.0 / (head_dim_k as f32).sqrt()
            };
            embd_scale = (n_embd as f32).sqrt();
            final_logit_softcap = f
                .get_f64(&key("final_logit_softcapping"))?
                .map(|v| v as f32)
                .filter(|&v| v != 0.0);
        }
        Ok(Config {
            arch,
            n_vocab,
            n_embd,
            n_layer,
            n_ff,
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
            n_rot,
            n_ctx_train,
            rms_eps,
            rope_freq_base,
            rope_freq_scale,
            n_swa,
            rope_freq_base_swa,
            swa_layers,
            attn_scale,
            embd_scale,
            final_logit_softcap,
        })
    }
}
