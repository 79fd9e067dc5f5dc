//! Tokenizers built from GGUF metadata, matching llama.cpp's tokenization exactly.
//!
//! Two model families are supported:
//! - **SentencePiece** (`tokenizer.ggml.model = "llama"`, e.g. Gemma, Llama 2): score-based
//!   bigram merges over characters, spaces escaped as `▁`, byte fallback (`<0xNN>`).
//! - **Byte-level BPE** (`tokenizer.ggml.model = "gpt2"`, e.g. Qwen2, SmolLM, Llama 3):
//!   a pre-tokenizer chosen by `tokenizer.ggml.pre` splits the text into words, then ranked
//!   merges run on the GPT-2 byte alphabet of each word.
//!
//! Special tokens (control, user-defined, unknown) written in the text are recognised as
//! in llama.cpp's `tokenizer_st_partition`, BOS/EOS are added per the model's
//! `add_bos_token`/`add_eos_token`, and end-of-generation tokens are collected the way
//! llama.cpp does (metadata ids plus well-known token texts).
//!
//! Anything llama.cpp would tokenize with a model or pre-tokenizer we do not implement is
//! refused with [`TokenizerError::Unsupported`] rather than tokenized differently.

mod bpe;
mod pretokenize;
mod special;
mod spm;
mod unicode;
mod unicode_data;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};

use crate::gguf::{Array, GgufError, GgufFile};

use bpe::{BpeModel, BpeSession};
use pretokenize::PreConfig;
use special::{Fragment, SpecialMatcher, SpecialToken};
use spm::{SpmSession, SpmVocab};

/// The Unicode version of the character classes the pre-tokenizers use (llama.cpp's).
pub use unicode_data::UNICODE_VERSION;

/// Errors from building a tokenizer out of GGUF metadata.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A required metadata key is absent.
    #[error("tokenizer: required metadata key `{0}` is missing")]
    Missing(String),
    /// The tokenizer model or pre-tokenizer is not implemented.
    #[error("tokenizer: unsupported {0}")]
    Unsupported(String),
    /// Metadata is present but malformed.
    #[error("tokenizer: invalid metadata: {0}")]
    Invalid(String),
}

impl From<GgufError> for TokenizerError {
    fn from(e: GgufError) -> Self {
        TokenizerError::Invalid(e.to_string())
    }
}

// Token attributes, as llama.cpp's `llama_token_attr` bits.
const ATTR_UNKNOWN: u16 = 1 << 0;
const ATTR_UNUSED: u16 = 1 << 1;
const ATTR_NORMAL: u16 = 1 << 2;
const ATTR_CONTROL: u16 = 1 << 3;
const ATTR_USER_DEFINED: u16 = 1 << 4;
const ATTR_BYTE: u16 = 1 << 5;
const ATTR_LSTRIP: u16 = 1 << 7;
const ATTR_RSTRIP: u16 = 1 << 8;

/// Attribute of a `tokenizer.ggml.token_type` value.
fn attr_of_type(t: i64) -> u16 {
    match t {
        1 => ATTR_NORMAL,
        2 => ATTR_UNKNOWN,
        3 => ATTR_CONTROL,
        4 => ATTR_USER_DEFINED,
        5 => ATTR_UNUSED,
        6 => ATTR_BYTE,
        _ => 0, // undefined
    }
}

/// Texts that llama.cpp treats as end-of-generation tokens wherever they appear.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Spm,
    Bpe,
}

/// Special token ids (`None` = the model has none).
#[derive(Clone, Copy, Debug, Default)]
struct SpecialIds {
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    unk: Option<u32>,
    sep: Option<u32>,
    pad: Option<u32>,
    mask: Option<u32>,
    fim_pre: Option<u32>,
    fim_suf: Option<u32>,
    fim_mid: Option<u32>,
    fim_pad: Option<u32>,
    fim_rep: Option<u32>,
    fim_sep: Option<u32>,
}

/// A tokenizer built from a GGUF file's `tokenizer.*` metadata.
pub struct Tokenizer {
    kind: Kind,
    model_name: String,
    pre_name: Option<String>,
    texts: Vec<String>,
    scores: Vec<f32>,
    attrs: Vec<u16>,
    /// Token text -> id (the last id wins for duplicate texts, as in llama.cpp).
    ids: HashMap<Box<str>, u32>,
    special: SpecialMatcher,
    special_ids: SpecialIds,
    eog: HashSet<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
    /// SPM byte fallback: `<0xNN>`, else the one-character token, else unknown.
    byte_tokens: Vec<Option<u32>>,
    /// BPE only.
    pre: Option<PreConfig>,
    bpe: Option<BpeModel>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("model", &self.model_name)
            .field("pre", &self.pre_name)
            .field("n_vocab", &self.texts.len())
            .field("bos", &self.special_ids.bos)
            .field("eos", &self.special_ids.eos)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .finish_non_exhaustive()
    }
}

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_TYPES: &str = "tokenizer.ggml.token_type";
const KEY_MERGES: &str = "tokenizer.ggml.merges";

fn invalid(key: &str, what: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Invalid(format!("metadata key `{key}`: {what}"))
}

/// Reads a special token id; `None` if absent or out of range (llama.cpp keeps the
/// default then).
fn read_id(f: &GgufFile, key: &str, n_vocab: usize) -> Result<Option<u32>, TokenizerError> {
    Ok(f.get_i64(key)?
        .and_then(|v| u32::try_from(v).ok())
        .filter(|&v| (v as usize) < n_vocab))
}

impl Tokenizer {
    /// Builds the tokenizer described by `f`'s `tokenizer.*` metadata.
    pub fn from_gguf(f: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        let model_name = f
            .get_str(KEY_MODEL)?
            .ok_or_else(|| TokenizerError::Missing(KEY_MODEL.into()))?
            .to_owned();
        let kind = match model_name.as_str() {
            "llama" => Kind::Spm,
            "gpt2" => Kind::Bpe,
            other => {
                return Err(TokenizerError::Unsupported(format!(
                    "tokenizer model `{other}` (metadata key `{KEY_MODEL}`; supported: llama, gpt2)"
                )))
            }
        };
        let pre_name = f.get_str(KEY_PRE)?.map(str::to_owned);
        let pre = match kind {
            Kind::Bpe => Some(PreConfig::from_name(pre_name.as_deref()).ok_or_else(|| {
                TokenizerError::Unsupported(format!(
                    "pre-tokenizer `{}` (metadata key `{KEY_PRE}`)",
                    pre_name.as_deref().unwrap_or("")
                ))
            })?),
            Kind::Spm => None,
        };

        // Vocabulary.
        let texts: Vec<String> = match f.get_array(KEY_TOKENS)? {
            None => return Err(TokenizerError::Missing(KEY_TOKENS.into())),
            Some(Array::String(v)) => v
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    if s.is_empty() {
                        format!("[EMPTY_{i}]")
                    } else {
                        s.clone()
                    }
                })
                .collect(),
            Some(a) => {
                return Err(invalid(
                    KEY_TOKENS,
                    format!(
                        "expected an array of strings, found {}",
                        a.elem_type().name()
                    ),
                ))
            }
        };
        let n = texts.len();
        if n == 0 {
            return Err(invalid(KEY_TOKENS, "the vocabulary is empty"));
        }
        if n > i32::MAX as usize {
            return Err(invalid(KEY_TOKENS, format!("{n} tokens is too many")));
        }
        let scores = match f.get_array(KEY_SCORES)? {
            None => vec![0.0; n],
            Some(a @ (Array::F32(_) | Array::I32(_))) => {
                let mut v = a.to_f32_vec().unwrap_or_default();
                if v.len() < n {
                    return Err(invalid(
                        KEY_SCORES,
                        format!("{} scores for {n} tokens", v.len()),
                    ));
                }
                v.truncate(n);
                v
            }
            Some(a) => {
                return Err(invalid(
                    KEY_SCORES,
                    format!(
                        "expected f32 or i32 elements, found {}",
                        a.elem_type().name()
                    ),
                ))
            }
        };
        let mut attrs = match f.get_array(KEY_TYPES)? {
            None => vec![ATTR_NORMAL; n],
            Some(Array::I32(v)) => {
                if v.len() < n {
                    return Err(invalid(
                        KEY_TYPES,
                        format!("{} token types for {n} tokens", v.len()),
                    ));
                }
                v[..n].iter().map(|&t| attr_of_type(t.into())).collect()
            }
            Some(a) => {
                return Err(invalid(
                    KEY_TYPES,
                    format!("expected i32 elements, found {}", a.elem_type().name()),
                ))
            }
        };
        let mut ids: HashMap<Box<str>, u32> = HashMap::with_capacity(n);
        for (i, t) in texts.iter().enumerate() {
            ids.insert(t.as_str().into(), i as u32);
        }
        // Ids that own their text (for duplicate texts only the last one does).
        let mut is_canonical = vec![false; n];
        for &id in ids.values() {
            is_canonical[id as usize] = true;
        }
        let canonical = |i: usize| is_canonical[i];

        // Defaults by model family, then metadata overrides.
        let in_range = |id: u32| ((id as usize) < n).then_some(id);
        let mut sp = SpecialIds::default();
        let (mut add_bos, mut add_space_prefix, clean_spaces);
        match kind {
            Kind::Spm => {
                sp.bos = in_range(1);
                sp.eos = in_range(2);
                sp.unk = in_range(0);
                add_bos = true;
                add_space_prefix = true;
                clean_spaces = false;
            }
            Kind::Bpe => {
                let pre = pre.as_ref().expect("BPE has a pre-tokenizer config");
                sp.bos = if pre.no_bos { None } else { in_range(11) };
                sp.eos = in_range(11);
                add_bos = pre.add_bos;
                add_space_prefix = false;
                clean_spaces = pre.clean_spaces;
            }
        }
        let mut add_eos = false;
        if let Some(v) = f.get_bool("tokenizer.ggml.add_space_prefix")? {
            add_space_prefix = v;
        }
        {
            let slots: [(&str, &mut Option<u32>); 14] = [
                ("tokenizer.ggml.bos_token_id", &mut sp.bos),
                ("tokenizer.ggml.eos_token_id", &mut sp.eos),
                ("tokenizer.ggml.eot_token_id", &mut sp.eot),
                ("tokenizer.ggml.eom_token_id", &mut sp.eom),
                ("tokenizer.ggml.unknown_token_id", &mut sp.unk),
                ("tokenizer.ggml.seperator_token_id", &mut sp.sep),
                ("tokenizer.ggml.padding_token_id", &mut sp.pad),
                ("tokenizer.ggml.mask_token_id", &mut sp.mask),
                ("tokenizer.ggml.fim_pre_token_id", &mut sp.fim_pre),
                ("tokenizer.ggml.fim_suf_token_id", &mut sp.fim_suf),
                ("tokenizer.ggml.fim_mid_token_id", &mut sp.fim_mid),
                ("tokenizer.ggml.fim_pad_token_id", &mut sp.fim_pad),
                ("tokenizer.ggml.fim_rep_token_id", &mut sp.fim_rep),
                ("tokenizer.ggml.fim_sep_token_id", &mut sp.fim_sep),
            ];
            for (key, slot) in slots {
                if let Some(id) = read_id(f, key, n)? {
                    *slot = Some(id);
                }
            }
            // Deprecated spellings, read after the others as llama.cpp does.
            let slots: [(&str, &mut Option<u32>); 3] = [
                ("tokenizer.ggml.prefix_token_id", &mut sp.fim_pre),
                ("tokenizer.ggml.suffix_token_id", &mut sp.fim_suf),
                ("tokenizer.ggml.middle_token_id", &mut sp.fim_mid),
            ];
            for (key, slot) in slots {
                if let Some(id) = read_id(f, key, n)? {
                    *slot = Some(id);
                }
            }
        }
        if let Some(v) = f.get_bool("tokenizer.ggml.add_bos_token")? {
            add_bos = v;
        }
        if let Some(v) = f.get_bool("tokenizer.ggml.add_eos_token")? {
            add_eos = v;
        }

        // Find special tokens by their text where the metadata does not name them; such
        // tokens are made control tokens.
        {
            let slots: [(&mut Option<u32>, &[&str]); 8] = [
                (&mut sp.eot, EOT_TEXTS),
                (&mut sp.eom, EOM_TEXTS),
                (&mut sp.fim_pre, FIM_PRE_TEXTS),
                (&mut sp.fim_suf, FIM_SUF_TEXTS),
                (&mut sp.fim_mid, FIM_MID_TEXTS),
                (&mut sp.fim_pad, FIM_PAD_TEXTS),
                (&mut sp.fim_rep, FIM_REP_TEXTS),
                (&mut sp.fim_sep, FIM_SEP_TEXTS),
            ];
            for (slot, names) in slots {
                if slot.is_some() {
                    continue;
                }
                if let Some(i) =
                    (0..n).find(|&i| names.contains(&texts[i].as_str()) && canonical(i))
                {
                    *slot = Some(i as u32);
                    attrs[i] |= ATTR_CONTROL;
                }
            }
        }
        // Control tokens named "unused" are unused.
        for i in 0..n {
            if canonical(i) && attrs[i] & ATTR_CONTROL != 0 && texts[i].contains("unused") {
                attrs[i] |= ATTR_UNUSED;
            }
        }
        // End-of-generation tokens.
        let mut eog: HashSet<u32> = [sp.fim_pad, sp.fim_rep, sp.fim_sep]
            .into_iter()
            .flatten()
            .collect();
        for i in 0..n {
            if canonical(i) && EOG_TEXTS.contains(&texts[i].as_str()) {
                eog.insert(i as u32);
                attrs[i] |= ATTR_CONTROL;
            }
        }
        // gpt-oss: these are always rendered.
        for i in 0..n {
            if canonical(i)
                && matches!(
                    texts[i].as_str(),
                    "<|channel|>" | "<|message|>" | "<|start|>" | "<|constrain|>"
                )
            {
                attrs[i] = ATTR_USER_DEFINED;
            }
        }
        eog.extend([sp.eos, sp.eot, sp.eom].into_iter().flatten());
        {
            let find = |t: &str| eog.iter().copied().find(|&id| texts[id as usize] == t);
            let has = |t: &str| find(t).is_some();
            // o200k_harmony / solar-open: "<|end|>" does not end generation there.
            let drop_end = (has("<|return|>") && has("<|call|>"))
                || ((has("<|call|>") || has("<|calls|>")) && has("<|flush|>"));
            let end = find("<|end|>").filter(|_| drop_end);
            // gemma4 / plamo: "</s>" is a normal token there.
            let drop_s = has("<|tool_response>") || has("<|plamo:eos|>");
            let s = find("</s>").filter(|_| drop_s);
            if let Some(end) = end {
                eog.remove(&end);
                attrs[end as usize] = ATTR_USER_DEFINED;
            }
            if let Some(s) = s {
                eog.remove(&s);
                attrs[s as usize] = ATTR_NORMAL;
            }
        }

        // Per-model token attributes that the GGUF does not carry.
        {
            let general_name = f
                .get_str("general.name")
                .ok()
                .flatten()
                .unwrap_or("")
                .to_lowercase();
            let arch = f
                .get_str("general.architecture")
                .ok()
                .flatten()
                .unwrap_or("");
            let pre_raw = pre_name.as_deref().unwrap_or("");
            let contains_any = |s: &str, subs: &[&str]| subs.iter().any(|x| s.contains(x));
            let set = |attrs: &mut [u16], text: &str, attr: u16, on: bool| {
                if let Some(&id) = ids.get(text) {
                    let a = &mut attrs[id as usize];
                    *a = if on { *a | attr } else { *a & !attr };
                }
            };
            if contains_any(
                pre_raw,
                &["jina-v2-de", "jina-v2-es", "jina-v2-code", "mmbert"],
            ) || contains_any(arch, &["nomic-bert-moe", "jina-bert-v3"])
            {
                set(&mut attrs, "<mask>", ATTR_LSTRIP, true);
            } else if contains_any(&general_name, &["phi-3", "phi3"]) {
                for a in attrs.iter_mut() {
                    if *a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN) != 0 {
                        *a |= ATTR_RSTRIP;
                    }
                }
                set(&mut attrs, "</s>", ATTR_RSTRIP, true);
                for t in ["<unk>", "<s>", "<|endoftext|>"] {
                    set(&mut attrs, t, ATTR_RSTRIP, false);
                }
            } else if contains_any(&general_name, &["modern-bert"]) {
                set(&mut attrs, "[MASK]", ATTR_LSTRIP, true);
            }
        }

        // Tokens matched in the text before tokenization.
        let special = SpecialMatcher::new(
            (0..n)
                .filter(|&i| attrs[i] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN) != 0)
                .map(|i| {
                    let a = attrs[i];
                    (
                        texts[i].as_str(),
                        SpecialToken {
                            id: i as u32,
                            parse_only: a & (ATTR_CONTROL | ATTR_UNKNOWN) != 0,
                            lstrip: a & ATTR_LSTRIP != 0,
                            rstrip: a & ATTR_RSTRIP != 0,
                        },
                    )
                })
                .collect(),
        );

        let bpe = match kind {
            Kind::Spm => None,
            Kind::Bpe => {
                let merges = match f.get_array(KEY_MERGES)? {
                    None => return Err(TokenizerError::Missing(KEY_MERGES.into())),
                    Some(Array::String(v)) => v,
                    Some(a) => {
                        return Err(invalid(
                            KEY_MERGES,
                            format!(
                                "expected an array of strings, found {}",
                                a.elem_type().name()
                            ),
                        ))
                    }
                };
                let ignore = pre.as_ref().is_some_and(|p| p.ignore_merges);
                Some(BpeModel::new(
                    merges,
                    n as u32,
                    |s| ids.get(s).copied(),
                    ignore,
                ))
            }
        };

        let byte_tokens = (0..=255u8)
            .map(|b| {
                let hex = format!("<0x{b:02X}>");
                ids.get(hex.as_str())
                    .or_else(|| {
                        let mut buf = [0u8; 4];
                        b.is_ascii()
                            .then(|| ids.get(&*(b as char).encode_utf8(&mut buf)))
                            .flatten()
                    })
                    .copied()
                    .or(sp.unk)
            })
            .collect();

        Ok(Tokenizer {
            kind,
            byte_tokens,
            model_name,
            pre_name,
            texts,
            scores,
            attrs,
            ids,
            special,
            special_ids: sp,
            eog,
            add_bos,
            add_eos,
            add_space_prefix,
            clean_spaces,
            pre,
            bpe,
        })
    }

    /// Tokenizes `text` like `llama_tokenize(text, add_special, parse_special)`:
    /// `add_special` adds BOS/EOS as the model asks (`add_bos_token`/`add_eos_token`);
    /// `parse_special` turns the text of control tokens (e.g. `"<|im_start|>"`) into those
    /// tokens. User-defined tokens are always recognised.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        let fragments = self.special.partition(text, parse_special);
        if add_special && self.add_bos {
            out.extend(self.special_ids.bos);
        }
        match self.kind {
            Kind::Spm => {
                let mut session = SpmSession::default();
                let mut buf = String::new();
                // A space is prefixed to the text at the start and after special tokens.
                let mut prev_special = true;
                for frag in fragments {
                    match frag {
                        Fragment::Text(r) => {
                            buf.clear();
                            if self.add_space_prefix && prev_special {
                                buf.push('▁');
                            }
                            for c in text[r].chars() {
                                buf.push(if c == ' ' { '▁' } else { c });
                            }
                            session.encode(self, &buf, &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            Kind::Bpe => {
                let (Some(pre), Some(model)) = (&self.pre, &self.bpe) else {
                    unreachable!("BPE tokenizer without its model")
                };
                let mut session = BpeSession::default();
                let mut chars = Vec::new();
                let mut words = Vec::new();
                let lookup = |s: &str| self.ids.get(s).copied();
                for frag in fragments {
                    match frag {
                        Fragment::Text(r) => {
                            let t = &text[r];
                            pretokenize::split_words(t, pre.splits, &mut chars, &mut words);
                            for w in &words {
                                session.encode_word(
                                    model,
                                    t[w.clone()].as_bytes(),
                                    lookup,
                                    &mut out,
                                );
                            }
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.special_ids.eos);
        }
        out
    }

    /// The bytes of one token, like `llama_token_to_piece(id, lstrip = 0, special)`:
    /// byte tokens give their byte, SentencePiece's `▁` becomes a space, byte-level BPE
    /// text is mapped back to bytes. Control and unknown tokens are empty unless `special`.
    /// Out-of-range ids are empty.
    pub fn token_to_piece(&self, id: u32, special: bool) -> Vec<u8> {
        let mut out = Vec::new();
        self.append_piece(id, special, false, &mut out);
        out
    }

    fn append_piece(&self, id: u32, special: bool, lstrip: bool, out: &mut Vec<u8>) {
        let Some(&attr) = self.attrs.get(id as usize) else {
            return;
        };
        if !special && attr & (ATTR_UNKNOWN | ATTR_CONTROL) != 0 {
            return;
        }
        let text = &self.texts[id as usize];
        let start = out.len();
        if attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED) != 0 {
            out.extend_from_slice(text.as_bytes());
        } else if attr & ATTR_NORMAL != 0 {
            match self.kind {
                Kind::Spm => {
                    let mut buf = [0u8; 4];
                    for c in text.chars() {
                        let c = if c == '▁' { ' ' } else { c };
                        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    }
                }
                Kind::Bpe => {
                    for c in text.chars() {
                        match unicode::char_to_byte(c) {
                            Some(b) => out.push(b),
                            None => {
                                // llama.cpp's marker for a character outside the alphabet.
                                out.extend_from_slice(b"[UNK_BYTE_0x");
                                let mut buf = [0u8; 4];
                                for b in c.encode_utf8(&mut buf).bytes() {
                                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                                }
                                out.extend_from_slice(text.as_bytes());
                                out.push(b']');
                            }
                        }
                    }
                }
            }
        } else if attr & ATTR_BYTE != 0 {
            out.push(byte_of_token(text));
        }
        if lstrip && out.get(start) == Some(&b' ') {
            out.remove(start);
        }
    }

    /// Detokenizes like `llama_detokenize(ids, remove_special, unparse_special)`, giving
    /// the exact bytes: `remove_special` drops a leading BOS / trailing EOS that the model
    /// adds; `unparse_special` renders control tokens as their text. The leading space of
    /// the first piece is removed when the model prefixes one (`add_space_prefix`) and the
    /// sequence does not start with BOS. Out-of-range ids are skipped.
    pub fn detokenize(&self, ids: &[u32], remove_special: bool, unparse_special: bool) -> Vec<u8> {
        let mut ids = ids;
        let mut remove_space = self.add_space_prefix;
        if remove_special && self.add_bos && ids.first().copied() == self.special_ids.bos {
            if let Some(rest) = ids.get(1..) {
                remove_space = false;
                ids = rest;
            }
        }
        if remove_special && self.add_eos && ids.last().copied() == self.special_ids.eos {
            ids = &ids[..ids.len().saturating_sub(1)];
        }
        let mut out = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            self.append_piece(id, unparse_special, remove_space, &mut out);
            remove_space = false;
        }
        if self.clean_spaces {
            clean_up_spaces(&mut out);
        }
        out
    }

    /// Text of `ids` (invalid UTF-8 replaced by U+FFFD): `detokenize(ids, skip_special,
    /// !skip_special)`, i.e. `skip_special` drops the BOS/EOS the model adds and renders
    /// control tokens as nothing; otherwise they are rendered as their text.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        let bytes = self.detokenize(ids, skip_special, !skip_special);
        match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.texts.len()
    }

    /// Beginning-of-sequence token.
    pub fn bos(&self) -> Option<u32> {
        self.special_ids.bos
    }

    /// End-of-sequence token.
    pub fn eos(&self) -> Option<u32> {
        self.special_ids.eos
    }

    /// End-of-turn token (from metadata, or found by its text).
    pub fn eot(&self) -> Option<u32> {
        self.special_ids.eot
    }

    /// Unknown token.
    pub fn unk(&self) -> Option<u32> {
        self.special_ids.unk
    }

    /// Padding token.
    pub fn pad(&self) -> Option<u32> {
        self.special_ids.pad
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos && self.special_ids.bos.is_some()
    }

    /// Whether `encode(.., add_special = true, ..)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos && self.special_ids.eos.is_some()
    }

    /// Whether generation should stop at `id`: EOS, EOT, EOM, FIM pad/repo/file-separator
    /// tokens and tokens with well-known end texts (`<|im_end|>`, `<end_of_turn>`,
    /// `<|endoftext|>`, ...), as llama.cpp decides.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// The end-of-generation tokens, sorted.
    pub fn eog_ids(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.eog.iter().copied().collect();
        v.sort_unstable();
        v
    }

    /// Whether `id` is a control token (rendered only when asked for special tokens).
    pub fn is_control(&self, id: u32) -> bool {
        self.attrs
            .get(id as usize)
            .is_some_and(|a| a & ATTR_CONTROL != 0)
    }

    /// The token's text as stored in the vocabulary (`""` for out-of-range ids).
    pub fn token_text(&self, id: u32) -> &str {
        self.texts.get(id as usize).map_or("", String::as_str)
    }

    /// The token whose text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// Whether every character of `text` has a token (a piece, or byte tokens for each of
    /// its bytes), so that `detokenize(encode(text, false, false))` gives `text` back.
    /// Vocabularies without some byte tokens drop those bytes, as llama.cpp does (e.g.
    /// smollm2 has no token for the byte 0x13), and SentencePiece vocabularies give a
    /// literal `▁` back as a space (it is their space marker): those are the only places
    /// the round trip breaks.
    pub fn encodes_losslessly(&self, text: &str) -> bool {
        match self.kind {
            Kind::Bpe => text.bytes().all(|b| {
                self.ids
                    .contains_key(unicode::BYTE_TO_CHAR[b as usize].to_string().as_str())
            }),
            Kind::Spm => {
                let mut buf = [0u8; 4];
                text.chars().all(|c| {
                    if c == '▁' {
                        return false;
                    }
                    let c = if c == ' ' { '▁' } else { c };
                    let s = c.encode_utf8(&mut buf);
                    self.ids.contains_key(&*s)
                        || s.bytes()
                            .all(|b| self.ids.contains_key(format!("<0x{b:02X}>").as_str()))
                })
            }
        }
    }

    /// The token's score (SentencePiece merge priority; 0 when the model has none).
    pub fn token_score(&self, id: u32) -> f32 {
        self.scores.get(id as usize).copied().unwrap_or(0.0)
    }

    /// `"spm"` or `"bpe"`.
    pub fn kind(&self) -> &str {
        match self.kind {
            Kind::Spm => "spm",
            Kind::Bpe => "bpe",
        }
    }

    /// The `tokenizer.ggml.pre` value, if any.
    pub fn pre(&self) -> Option<&str> {
        self.pre_name.as_deref()
    }

    /// Number of BPE merges (0 for SentencePiece).
    pub fn n_merges(&self) -> usize {
        self.bpe.as_ref().map_or(0, BpeModel::n_merges)
    }
}

impl SpmVocab for Tokenizer {
    fn token_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }
    fn score(&self, id: u32) -> f32 {
        self.scores[id as usize]
    }
    fn byte_token(&self, b: u8) -> Option<u32> {
        self.byte_tokens[b as usize]
    }
}

/// The byte of a `<0xNN>` token (llama.cpp reads two hex digits at offset 3).
fn byte_of_token(text: &str) -> u8 {
    let digits = text.as_bytes().get(3..5).unwrap_or(&[]);
    let mut v = 0u8;
    for &d in digits {
        match (d as char).to_digit(16) {
            Some(x) => v = v.wrapping_mul(16).wrapping_add(x as u8),
            None => break,
        }
    }
    v
}

/// llama.cpp's detokenizer clean-up (`clean_spaces`): drops the space in " ?", " !",
/// " .", " ,", the spaces around a lone "'", and the space before "'s", "'m", "'re", "'ve".
fn clean_up_spaces(text: &mut Vec<u8>) {
    // Pass 1: space before ?!.,
    let src = std::mem::take(text);
    let mut out: Vec<u8> = Vec::with_capacity(src.len());
    for (i, &x) in src.iter().enumerate() {
        if i > 0 && src[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            out.pop();
        }
        out.push(x);
    }
    // Pass 2: " ' " -> "'".
    let mut src = out;
    let mut out: Vec<u8> = Vec::with_capacity(src.len());
    let mut i = 0;
    while i < src.len() {
        let x = src[i];
        if i > 0 && x == b'\'' && i + 1 < src.len() && src[i - 1] == b' ' && src[i + 1] == b' ' {
            out.pop();
            // The space after is dropped, and may not start another match.
            src[i + 1] = 0;
            out.push(x);
            i += 2;
            continue;
        }
        out.push(x);
        i += 1;
    }
    // Pass 3: contractions.
    let src = out;
    let mut out: Vec<u8> = Vec::with_capacity(src.len());
    for (i, &x) in src.iter().enumerate() {
        if i > 0 && src[i - 1] == b' ' && x == b'\'' && i + 1 < src.len() {
            let x1 = src[i + 1];
            let drop = match x1 {
                b's' | b'm' => true,
                b't' | b'd' => false,
                _ => i + 2 < src.len() && matches!((x1, src[i + 2]), (b'r', b'e') | (b'v', b'e')),
            };
            if drop {
                out.pop();
            }
        }
        out.push(x);
    }
    *text = out;
}

/// Incremental detokenizer for streaming: feed token ids one at a time and get the text
/// that is complete so far. UTF-8 sequences split across tokens are held back until they
/// are whole, so the concatenation of everything returned (including [`finish`]) equals
/// [`Tokenizer::decode`] of all the ids.
///
/// [`finish`]: StreamDecoder::finish
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    skip_special: bool,
    started: bool,
    /// Strip the leading space of the next piece.
    lstrip: bool,
    /// Pending bytes: with space clean-up, everything since the last safe cut point;
    /// otherwise only what has not been returned yet.
    raw: Vec<u8>,
    /// Bytes of the cleaned `raw` already returned (clean-up only).
    emitted: usize,
}

impl<'a> StreamDecoder<'a> {
    /// `skip_special` as in [`Tokenizer::decode`].
    pub fn new(tok: &'a Tokenizer, skip_special: bool) -> StreamDecoder<'a> {
        StreamDecoder {
            tok,
            skip_special,
            started: false,
            lstrip: tok.add_space_prefix,
            raw: Vec::new(),
            emitted: 0,
        }
    }

    /// Adds one token; returns the newly completed text (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        let tok = self.tok;
        if !self.started {
            self.started = true;
            if self.skip_special && tok.add_bos && Some(id) == tok.special_ids.bos {
                // decode() drops this BOS, and then keeps the next piece's space.
                self.lstrip = false;
                return String::new();
            }
        }
        tok.append_piece(id, !self.skip_special, self.lstrip, &mut self.raw);
        self.lstrip = false;
        self.drain(false)
    }

    /// Returns whatever is still held back (an incomplete UTF-8 sequence becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let s = self.drain(true);
        self.raw.clear();
        self.emitted = 0;
        s
    }

    fn drain(&mut self, last: bool) -> String {
        if !self.tok.clean_spaces {
            let (s, used) = take_utf8(&self.raw, last);
            self.raw.drain(..used);
            return s;
        }
        let mut cleaned = self.raw.clone();
        clean_up_spaces(&mut cleaned);
        // The clean-up of the last three bytes may still change with more text.
        let stable = if last {
            cleaned.len()
        } else {
            cleaned.len().saturating_sub(3)
        };
        let (s, used) = take_utf8(&cleaned[self.emitted.min(stable)..stable], last);
        self.emitted += used;
        if !last && self.raw.len() > 256 {
            self.cut();
        }
        s
    }

    /// Forgets a prefix of `raw` whose clean-up is independent of what follows and that
    /// has been returned entirely. Cutting before byte `p` is safe when `raw[p]` can be
    /// neither removed nor the end of a clean-up pattern (not a space, `'`, `?`, `!`, `.`
    /// or `,`; not inside a character) and no `'` is close before it, so no pattern spans
    /// the cut.
    fn cut(&mut self) {
        let r = &self.raw;
        let p = (8..r.len().saturating_sub(8)).rev().find(|&p| {
            !matches!(r[p], b' ' | b'\'' | b'?' | b'!' | b'.' | b',')
                && (r[p] & 0xC0) != 0x80
                && !r[p - 8..p].contains(&b'\'')
        });
        if let Some(p) = p {
            let mut left = r[..p].to_vec();
            clean_up_spaces(&mut left);
            if left.len() <= self.emitted {
                self.raw.drain(..p);
                self.emitted -= left.len();
            }
        }
    }
}

/// Splits off the longest prefix of `bytes` that decodes to whole characters (invalid
/// sequences become U+FFFD as in `String::from_utf8_lossy`); an incomplete sequence at
/// the end is kept unless `last`. Returns the text and the bytes consumed.
fn take_utf8(bytes: &[u8], last: bool) -> (String, usize) {
    let mut s = String::new();
    let mut pos = 0;
    while pos < bytes.len() {
        match std::str::from_utf8(&bytes[pos..]) {
            Ok(v) => {
                s.push_str(v);
                pos = bytes.len();
            }
            Err(e) => {
                let valid = e.valid_up_to();
                // SAFETY-free: the prefix was just validated.
                s.push_str(std::str::from_utf8(&bytes[pos..pos + valid]).unwrap_or_default());
                pos += valid;
                match e.error_len() {
                    Some(n) => {
                        s.push('\u{FFFD}');
                        pos += n;
                    }
                    None => {
                        if last {
                            s.push('\u{FFFD}');
                            pos = bytes.len();
                        }
                        break;
                    }
                }
            }
        }
    }
    (s, pos)
}
