//! Speculative decoding: a cheap proposer guesses the next few tokens, the model checks
//! them all in one forward pass, and every guess the model would have produced anyway is
//! a token gained for the price of one batched step.
//!
//! Two proposers:
//! - **prompt lookup** (n-grams, no second model): the last `n` tokens of the text so far
//!   (prompt and output) are looked up earlier in it, and the tokens that followed that
//!   occurrence are the draft. Code editing, summaries that quote, and structured output
//!   repeat long runs of their input, which this finds for free.
//! - **a draft model** sharing the tokenizer, decoding greedily ahead of the target.
//!
//! The verification decides, the drafts never do. The draft tokens are fed after the last
//! accepted token in one call whose tokens are each placed as a micro-batch of one
//! ([`UBatch::Alone`]), so every row of logits is, bit for bit, what plain decoding would
//! have computed at that position. The sampler then draws from row 0, then row 1 while
//! the drawn token equals the draft, and so on; the first token that differs from the
//! draft (or follows the last draft token) is kept and the cache is cut after it. Each
//! emitted token is drawn once, from the same logits and the same sampler state as plain
//! decoding would use, so the output (greedy, and seeded sampling too) is plain
//! decoding's, only sooner.

use std::collections::HashMap;
use std::sync::Arc;

use crate::kv::{KvCache, SeqId};
use crate::model::{Logits, Model, ModelError, SeqBatch, UBatch, Workspace};
use crate::pool::ThreadPool;
use crate::tokenizer::Tokenizer;

/// How many tokens to draft and when (llama.cpp's `--draft-max`, `--draft-min`,
/// `--draft-p-min`; vLLM's `prompt_lookup_min/max`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpecParams {
    /// The most draft tokens checked per step.
    pub n_max: usize,
    /// Drafts shorter than this are not checked (a plain step is cheaper).
    pub n_min: usize,
    /// The draft model stops drafting where its own top probability falls below this.
    pub p_min: f32,
    /// Prompt lookup tries n-grams from `ngram_max` tokens down to `ngram_min`.
    pub ngram_min: usize,
    pub ngram_max: usize,
}

impl Default for SpecParams {
    fn default() -> Self {
        SpecParams {
            n_max: 16,
            n_min: 1,
            p_min: 0.5,
            ngram_min: 2,
            ngram_max: 4,
        }
    }
}

impl SpecParams {
    /// Checks ranges; returns a message naming the bad field.
    pub fn validate(&self) -> Result<(), String> {
        if self.n_max == 0 || self.n_max > 64 {
            return Err(format!("draft-max must be 1..=64, got {}", self.n_max));
        }
        if self.n_min > self.n_max {
            return Err(format!(
                "draft-min ({}) exceeds draft-max ({})",
                self.n_min, self.n_max
            ));
        }
        if !(0.0..=1.0).contains(&self.p_min) {
            return Err(format!("draft-p-min must be in [0, 1], got {}", self.p_min));
        }
        if self.ngram_min == 0 || self.ngram_min > self.ngram_max || self.ngram_max > 16 {
            return Err(format!(
                "lookup n-grams must satisfy 1 <= min <= max <= 16, got {}..={}",
                self.ngram_min, self.ngram_max
            ));
        }
        Ok(())
    }
}

/// Counts over a generation (or a server's lifetime).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Draft tokens sent to verification.
    pub drafted: u64,
    /// Draft tokens the model agreed with.
    pub accepted: u64,
    /// Verification steps (forward calls that carried a draft).
    pub steps: u64,
}

impl SpecStats {
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }

    pub fn add(&mut self, o: SpecStats) {
        self.drafted += o.drafted;
        self.accepted += o.accepted;
        self.steps += o.steps;
    }
}

/// Prompt lookup: the tokens that followed the most recent earlier occurrence of the
/// longest suffix of `history` (from `max_n` down to `min_n` tokens) that occurred
/// before, at most `k` of them, into `out` (cleared). Empty when nothing matches.
pub fn lookup_draft(history: &[u32], min_n: usize, max_n: usize, k: usize, out: &mut Vec<u32>) {
    out.clear();
    let len = history.len();
    if k == 0 || min_n == 0 {
        return;
    }
    for n in (min_n..=max_n).rev() {
        if len <= n {
            continue;
        }
        let key = &history[len - n..];
        // Occurrences ending before the suffix itself, most recent first.
        for j in (0..len - n).rev() {
            if history[j] == key[0] && history[j..j + n] == *key {
                let from = j + n;
                let to = (from + k).min(len);
                out.extend_from_slice(&history[from..to]);
                return;
            }
        }
    }
}

/// Why a draft model cannot serve a target: the vocabularies differ.
pub fn check_draft_vocab(target: &Tokenizer, draft: &Tokenizer) -> Result<(), String> {
    if target.kind() != draft.kind() {
        return Err(format!(
            "the draft model's tokenizer is {} and the target's {}: they must share one",
            draft.kind(),
            target.kind()
        ));
    }
    let (nt, nd) = (target.n_vocab(), draft.n_vocab());
    if nt.abs_diff(nd) > 128 {
        return Err(format!(
            "the draft model's vocabulary has {nd} tokens and the target's {nt}: they must share one"
        ));
    }
    if let Some(id) = (0..nt.min(nd) as u32).find(|&i| target.token_text(i) != draft.token_text(i))
    {
        return Err(format!(
            "token {id} is {:?} in the draft model and {:?} in the target: they must share a vocabulary",
            draft.token_text(id),
            target.token_text(id)
        ));
    }
    Ok(())
}

/// A small model that decodes greedily ahead of the target. It keeps its own cache of
/// each sequence's text so far and re-feeds only what changed since its last draft.
pub struct DraftModel {
    model: Arc<Model>,
    kv: KvCache,
    ws: Workspace,
    n_ctx: usize,
    /// Per sequence, the tokens whose keys and values the cache holds, in order.
    cached: HashMap<SeqId, Vec<u32>>,
    /// The target's vocabulary size: larger ids are never drafted.
    target_vocab: usize,
}

impl DraftModel {
    /// A draft model for a target of `target_vocab` tokens and texts of up to `n_ctx`
    /// tokens, with a cache of `kv_tokens` positions shared by the sequences it drafts
    /// for (at least `n_ctx`). It runs on the target's pool (the two never run at once).
    pub fn new(
        model: Arc<Model>,
        target_vocab: usize,
        n_ctx: usize,
        kv_tokens: usize,
    ) -> DraftModel {
        let kv = KvCache::new(model.kv_layout(kv_tokens.max(n_ctx), 16));
        DraftModel {
            model,
            kv,
            ws: Workspace::default(),
            n_ctx,
            cached: HashMap::new(),
            target_vocab,
        }
    }

    /// The draft model's layer count (for logs).
    pub fn n_layer(&self) -> usize {
        self.model.config.n_layer
    }

    /// Frees what the draft cache holds for `seq`.
    pub fn forget(&mut self, seq: SeqId) {
        self.kv.remove_seq(seq);
        self.cached.remove(&seq);
    }

    /// Up to `k` greedy tokens after `history` (sequence `seq`'s text) into `out`,
    /// stopping early where the draft model's top probability drops below `p_min` or at
    /// a token id the target does not have. A draft cache too full for the
    /// text gives no draft, not an error: other sequences' entries are dropped for the
    /// next call.
    pub fn draft(
        &mut self,
        pool: &ThreadPool,
        seq: SeqId,
        history: &[u32],
        k: usize,
        p_min: f32,
        out: &mut Vec<u32>,
    ) -> Result<(), ModelError> {
        match self.draft_inner(pool, seq, history, k, p_min, out) {
            Err(ModelError::Kv(_)) => {
                out.clear();
                let others: Vec<SeqId> =
                    self.cached.keys().copied().filter(|&s| s != seq).collect();
                for s in others {
                    self.forget(s);
                }
                self.forget(seq);
                Ok(())
            }
            r => r,
        }
    }

    fn draft_inner(
        &mut self,
        pool: &ThreadPool,
        seq: SeqId,
        history: &[u32],
        k: usize,
        p_min: f32,
        out: &mut Vec<u32>,
    ) -> Result<(), ModelError> {
        out.clear();
        if k == 0 || history.is_empty() {
            return Ok(());
        }
        let room = self.n_ctx.saturating_sub(history.len());
        let k = k.min(room);
        if k == 0 {
            return Ok(());
        }
        // Keep the cache's common prefix with the text, but always re-feed at least the
        // last token (its logits are needed).
        let cached = self.cached.entry(seq).or_default();
        let common = cached
            .iter()
            .zip(history)
            .take_while(|(a, b)| a == b)
            .count()
            .min(history.len() - 1);
        cached.truncate(common);
        if self.kv.has_seq(seq) {
            self.kv
                .truncate(seq, common)
                .map_err(|e| ModelError::Invalid(format!("draft cache: {e}")))?;
        }
        // Chunks of 512, as a prompt; only the last one's logits are wanted.
        let rest = &history[common..];
        let n_chunks = rest.len().div_ceil(512);
        for (i, chunk) in rest.chunks(512).enumerate() {
            let logits = match i + 1 == n_chunks {
                true => Logits::Last,
                false => Logits::None,
            };
            self.feed(pool, seq, chunk, logits)?;
        }
        while let Some(t) = self.pick(p_min) {
            out.push(t);
            if out.len() == k {
                break;
            }
            self.feed(pool, seq, std::slice::from_ref(&t), Logits::Last)?;
        }
        Ok(())
    }

    /// Runs `tokens` of `seq` through the draft model and records them as cached.
    fn feed(
        &mut self,
        pool: &ThreadPool,
        seq: SeqId,
        tokens: &[u32],
        logits: Logits,
    ) -> Result<(), ModelError> {
        self.model.forward(
            &[SeqBatch {
                seq,
                tokens,
                logits,
                ubatch: UBatch::Call,
            }],
            &mut self.kv,
            &mut self.ws,
            pool,
            self.n_ctx,
        )?;
        self.cached
            .entry(seq)
            .or_default()
            .extend_from_slice(tokens);
        Ok(())
    }

    /// The greedy token of the last logits, if confident enough and in the target's
    /// vocabulary.
    fn pick(&self, p_min: f32) -> Option<u32> {
        let nv = self.model.config.n_vocab;
        let row = &self.ws.logits[..nv];
        let t = crate::sampling::argmax(row);
        if t as usize >= self.target_vocab {
            return None;
        }
        if p_min > 0.0 {
            let max = row[t as usize];
            let sum: f32 = row.iter().map(|&v| (v - max).exp()).sum();
            if 1.0 / sum < p_min {
                return None;
            }
        }
        Some(t)
    }
}

/// Loads `name` as a draft model for a target with `target`'s tokenizer and
/// `target_vocab` tokens, on the CPU with `opts`' numerics and packing, its cache
/// holding `kv_tokens` positions (see [`DraftModel::new`]). Refused with a message when
/// the vocabularies differ.
pub fn load_draft_model(
    name: &str,
    target: &Tokenizer,
    target_vocab: usize,
    opts: &crate::options::RunOptions,
    n_ctx: usize,
    kv_tokens: usize,
) -> Result<DraftModel, String> {
    let opts = crate::options::RunOptions {
        offload: crate::offload::OffloadSpec::new(0, None),
        ..opts.clone()
    };
    let d = crate::load::ModelFile::open(name)
        .and_then(|f| f.load_with(&opts, crate::load::ContextSize::single(n_ctx)))
        .map_err(|e| format!("draft model {name}: {e}"))?;
    check_draft_vocab(target, &d.tokenizer)?;
    Ok(DraftModel::new(d.model, target_vocab, n_ctx, kv_tokens))
}

/// Where drafts come from.
pub enum Proposer {
    Lookup,
    Model(Box<DraftModel>),
}

/// A proposer with its settings: what a runner or a server sequence drafts with.
pub struct Speculator {
    pub params: SpecParams,
    pub proposer: Proposer,
}

impl Speculator {
    pub fn lookup(params: SpecParams) -> Speculator {
        Speculator {
            params,
            proposer: Proposer::Lookup,
        }
    }

    /// Frees what the proposer keeps for `seq` (a draft model's cache).
    pub fn forget(&mut self, seq: SeqId) {
        if let Proposer::Model(m) = &mut self.proposer {
            m.forget(seq);
        }
    }

    /// At most `k` draft tokens to follow `history` into `out` (cleared), or none when
    /// fewer than `n_min` would be proposed.
    pub fn propose(
        &mut self,
        pool: &ThreadPool,
        seq: SeqId,
        history: &[u32],
        k: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), ModelError> {
        let p = self.params;
        let k = k.min(p.n_max);
        match &mut self.proposer {
            Proposer::Lookup => lookup_draft(history, p.ngram_min, p.ngram_max, k, out),
            Proposer::Model(m) => m.draft(pool, seq, history, k, p.p_min, out)?,
        }
        if out.len() < p.n_min.max(1) {
            out.clear();
        }
        Ok(())
    }
}

/// Which proposer, if any (`--spec`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecMode {
    Off,
    /// Prompt lookup (n-grams of the prompt and the output so far).
    Lookup,
    /// A draft model (`--model-draft`).
    Draft,
}

impl std::str::FromStr for SpecMode {
    type Err = String;

    fn from_str(s: &str) -> Result<SpecMode, String> {
        match s {
            "off" | "none" => Ok(SpecMode::Off),
            "lookup" | "ngram" => Ok(SpecMode::Lookup),
            "draft" => Ok(SpecMode::Draft),
            other => Err(format!(
                "unknown speculative mode {other:?} (off, lookup or draft)"
            )),
        }
    }
}

impl SpecMode {
    pub fn name(self) -> &'static str {
        match self {
            SpecMode::Off => "off",
            SpecMode::Lookup => "lookup",
            SpecMode::Draft => "draft",
        }
    }
}

/// The speculative-decoding flags of `rllama run`, `rserve` and `rbench`
/// (`#[command(flatten)]`), in llama.cpp's spelling where it has one.
#[cfg(feature = "cli")]
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct SpecArgs {
    /// Speculative decoding: off, lookup (drafts copied from earlier in the prompt and
    /// output: no second model) or draft (a draft model, --model-draft). The output is
    /// the same as without it.
    #[arg(long = "spec", default_value = "off")]
    pub spec: SpecMode,
    /// The draft model (`-md`, llama.cpp's flag): a registry name or GGUF path sharing
    /// the model's tokenizer. Implies --spec draft.
    #[arg(long = "model-draft")]
    pub model_draft: Option<String>,
    /// The most draft tokens checked per step.
    #[arg(long = "draft-max", default_value_t = 16)]
    pub draft_max: usize,
    /// Shorter drafts are not checked.
    #[arg(long = "draft-min", default_value_t = 1)]
    pub draft_min: usize,
    /// The draft model stops where its top probability falls below this.
    #[arg(long = "draft-p-min", default_value_t = 0.5)]
    pub draft_p_min: f32,
    /// Prompt lookup's shortest n-gram.
    #[arg(long = "lookup-ngram-min", default_value_t = 2)]
    pub ngram_min: usize,
    /// Prompt lookup's longest n-gram.
    #[arg(long = "lookup-ngram-max", default_value_t = 4)]
    pub ngram_max: usize,
}

#[cfg(feature = "cli")]
impl SpecArgs {
    /// The mode and settings the flags ask for, checked.
    pub fn resolve(&self) -> Result<(SpecMode, SpecParams), String> {
        let mode = match (self.spec, &self.model_draft) {
            (SpecMode::Off, Some(_)) => SpecMode::Draft,
            (SpecMode::Draft, None) => {
                return Err("--spec draft needs a draft model (--model-draft / -md)".into())
            }
            (SpecMode::Lookup, Some(_)) => {
                return Err("--model-draft goes with --spec draft, not lookup".into())
            }
            (m, _) => m,
        };
        let params = SpecParams {
            n_max: self.draft_max,
            n_min: self.draft_min,
            p_min: self.draft_p_min,
            ngram_min: self.ngram_min,
            ngram_max: self.ngram_max,
        };
        params.validate()?;
        Ok((mode, params))
    }

    /// The speculator the flags ask for, for `target` (its tokenizer checks the draft
    /// model's), on a context of `n_ctx` tokens; `None` when off. The draft model runs
    /// on the CPU with `opts`' numerics and packing.
    pub fn speculator(
        &self,
        target: &crate::load::Loaded,
        opts: &crate::options::RunOptions,
        n_ctx: usize,
    ) -> Result<Option<Speculator>, String> {
        let (mode, params) = self.resolve()?;
        let proposer = match mode {
            SpecMode::Off => return Ok(None),
            SpecMode::Lookup => Proposer::Lookup,
            SpecMode::Draft => Proposer::Model(Box::new(load_draft_model(
                self.model_draft.as_deref().expect("resolved"),
                &target.tokenizer,
                target.model.config.n_vocab,
                opts,
                n_ctx,
                n_ctx,
            )?)),
        };
        Ok(Some(Speculator { params, proposer }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_finds_the_longest_most_recent_match() {
        let mut out = Vec::new();
        // "1 2 3 4 5 ... 1 2 3" -> "4 5"
        let h = [1, 2, 3, 4, 5, 9, 1, 2, 3];
        lookup_draft(&h, 2, 3, 4, &mut out);
        assert_eq!(out, [4, 5, 9, 1]);
        lookup_draft(&h, 2, 3, 2, &mut out);
        assert_eq!(out, [4, 5]);
        // The more recent occurrence wins for the same n.
        let h = [7, 8, 1, 7, 8, 2, 7, 8];
        lookup_draft(&h, 2, 2, 3, &mut out);
        assert_eq!(out, [2, 7, 8]);
        // A longer n-gram beats a more recent shorter one.
        let h = [5, 7, 8, 1, 7, 8, 2, 5, 7, 8];
        lookup_draft(&h, 2, 3, 1, &mut out);
        assert_eq!(out, [1]);
        // Nothing repeats: no draft; too short a history: no draft.
        lookup_draft(&[1, 2, 3, 4], 1, 3, 4, &mut out);
        assert!(out.is_empty());
        lookup_draft(&[1], 1, 3, 4, &mut out);
        assert!(out.is_empty());
        lookup_draft(&[1, 1], 1, 3, 4, &mut out);
        assert_eq!(out, [1]);
    }

    #[test]
    fn params_are_checked() {
        assert!(SpecParams::default().validate().is_ok());
        for bad in [
            SpecParams {
                n_max: 0,
                ..Default::default()
            },
            SpecParams {
                n_max: 8,
                n_min: 9,
                ..Default::default()
            },
            SpecParams {
                p_min: 1.5,
                ..Default::default()
            },
            SpecParams {
                ngram_min: 3,
                ngram_max: 2,
                ..Default::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
