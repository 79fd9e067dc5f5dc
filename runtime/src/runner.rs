//! A single-sequence driver over the batched forward pass: prompt processing in chunks,
//! generation with a sampler, teacher-forced logits and llama-perplexity-style scoring.

use std::sync::Arc;

use crate::kv::{KvCache, SeqId};
use crate::model::{Logits, Model, ModelError, SeqBatch, UBatch, Workspace};
use crate::pool::ThreadPool;
use crate::sampling::Sampler;
use crate::speculative::{SpecStats, Speculator};

const SEQ: SeqId = 0;

pub struct Runner {
    pub model: Arc<Model>,
    pub pool: ThreadPool,
    pub kv: KvCache,
    pub ws: Workspace,
    pub n_ctx: usize,
    /// Tokens per forward call when processing a prompt (llama.cpp's n_batch).
    pub n_batch: usize,
}

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token was sampled (not included in the output).
    Stop,
    /// The requested number of tokens was produced.
    Length,
    /// The context is full.
    Context,
}

impl Runner {
    /// A runner with its own pool of `n_threads` (pinned by default, see `pool`).
    pub fn new(model: Arc<Model>, n_threads: usize, n_ctx: usize) -> Runner {
        Runner::with_pool(model, ThreadPool::new(n_threads), n_ctx)
    }

    /// A runner on a pool the caller built (e.g. without pinning).
    pub fn with_pool(model: Arc<Model>, pool: ThreadPool, n_ctx: usize) -> Runner {
        let kv = KvCache::new(model.kv_layout(n_ctx, 16));
        Runner {
            model,
            pool,
            kv,
            ws: Workspace::default(),
            n_ctx,
            n_batch: 512,
        }
    }

    pub fn clear(&mut self) {
        self.kv.clear();
    }

    pub fn pos(&self) -> usize {
        self.kv.seq_len(SEQ)
    }

    /// Feeds `tokens` at the current position. Returns the logits of the last token
    /// (`want_all` = every token's, row-major) — borrowed from the workspace.
    pub fn feed(&mut self, tokens: &[u32], want_all: bool) -> Result<&[f32], ModelError> {
        let nv = self.model.config.n_vocab;
        let mut all = Vec::new();
        let chunks: Vec<&[u32]> = tokens.chunks(self.n_batch.max(1)).collect();
        let n_chunks = chunks.len();
        for (i, chunk) in chunks.into_iter().enumerate() {
            let last = i + 1 == n_chunks;
            let logits = if want_all {
                Logits::All
            } else if last {
                Logits::Last
            } else {
                Logits::None
            };
            let sb = [SeqBatch {
                seq: SEQ,
                tokens: chunk,
                logits,
                // llama.cpp's micro-batch is the same chunk (n_batch = n_ubatch = 512).
                ubatch: UBatch::Call,
            }];
            let n = self
                .model
                .forward(&sb, &mut self.kv, &mut self.ws, &self.pool, self.n_ctx)?;
            if want_all && n_chunks > 1 {
                all.extend_from_slice(&self.ws.logits[..n * nv]);
            }
        }
        if want_all && n_chunks > 1 {
            self.ws.logits = all;
        }
        Ok(&self.ws.logits)
    }

    /// Teacher forcing from an empty cache: logits for every position.
    pub fn logits_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        self.clear();
        Ok(self.feed(tokens, true)?.to_vec())
    }

    /// Processes `prompt` from an empty cache, then samples up to `n` tokens, calling
    /// `on_token` for each (return false to stop). End-of-generation tokens stop and are
    /// not returned.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        n: usize,
        sampler: &mut Sampler,
        is_eog: &dyn Fn(u32) -> bool,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<(Vec<u32>, FinishReason), ModelError> {
        let (out, finish, _) = self.generate_with(prompt, n, sampler, is_eog, on_token, None)?;
        Ok((out, finish))
    }

    /// [`Runner::generate`], with speculative decoding where `spec` is given: the same
    /// tokens (see [`crate::speculative`]), fewer forward calls when drafts are right.
    pub fn generate_with(
        &mut self,
        prompt: &[u32],
        n: usize,
        sampler: &mut Sampler,
        is_eog: &dyn Fn(u32) -> bool,
        on_token: &mut dyn FnMut(u32) -> bool,
        mut spec: Option<&mut Speculator>,
    ) -> Result<(Vec<u32>, FinishReason, SpecStats), ModelError> {
        self.clear();
        if let Some(s) = spec.as_deref_mut() {
            s.forget(SEQ);
        }
        let mut stats = SpecStats::default();
        if prompt.is_empty() {
            return Err(ModelError::Invalid("empty prompt".into()));
        }
        for &t in prompt {
            sampler.accept(t);
        }
        let nv = self.model.config.n_vocab;
        let mut logits = self.feed(prompt, false)?.to_vec();
        let mut out = Vec::with_capacity(n);
        // The text so far (prompt and output): what prompt lookup searches.
        let mut history = prompt.to_vec();
        let mut draft = Vec::new();
        // The pending token and its draft: one call's tokens (reused every step).
        let mut tokens = Vec::new();
        let mut row = vec![0f32; nv];
        loop {
            // `logits` holds rows for the pending token and each draft token after it.
            let rows = logits.len() / nv;
            let mut kept = 0;
            for r in 0..rows {
                row.copy_from_slice(&logits[r * nv..(r + 1) * nv]);
                let tok = sampler.sample(&mut row);
                if r > 0 {
                    // Reaching row r means draft token r - 1 was the model's own.
                    stats.accepted += 1;
                }
                kept = r + 1;
                if is_eog(tok) {
                    return Ok((out, FinishReason::Stop, stats));
                }
                sampler.accept(tok);
                out.push(tok);
                history.push(tok);
                if !on_token(tok) || out.len() == n {
                    return Ok((out, FinishReason::Length, stats));
                }
                if r + 1 == rows || draft[r] != tok {
                    break;
                }
            }
            if rows > 1 {
                // Drop the rejected draft tokens' keys and values: keep the accepted
                // ones (`kept - 1` of them) after the position before the step.
                let keep = self.pos() - (rows - kept);
                self.kv
                    .truncate(SEQ, keep)
                    .map_err(|e| ModelError::Invalid(format!("cache: {e}")))?;
            }
            if self.pos() >= self.n_ctx {
                return Ok((out, FinishReason::Context, stats));
            }
            // The last emitted token is fed next, with a draft after it where one fits.
            let pending = *out.last().expect("emitted");
            draft.clear();
            if let Some(s) = spec.as_deref_mut() {
                let room = (n - out.len() - 1).min(self.n_ctx - self.pos() - 1);
                if room > 0 {
                    s.propose(&self.pool, SEQ, &history, room, &mut draft)?;
                }
            }
            tokens.clear();
            tokens.push(pending);
            tokens.extend_from_slice(&draft);
            let sb = [SeqBatch {
                seq: SEQ,
                tokens: &tokens,
                logits: if draft.is_empty() {
                    Logits::Last
                } else {
                    Logits::All
                },
                ubatch: UBatch::Alone,
            }];
            let got =
                self.model
                    .forward(&sb, &mut self.kv, &mut self.ws, &self.pool, self.n_ctx)?;
            if !draft.is_empty() {
                stats.drafted += draft.len() as u64;
                stats.steps += 1;
            }
            logits.clear();
            logits.extend_from_slice(&self.ws.logits[..got * nv]);
        }
    }

    /// Perplexity as llama-perplexity computes it: non-overlapping chunks of `n_ctx`
    /// tokens, the first token of each replaced by BOS when the model adds one, scoring
    /// only the second half of each chunk. Returns (ppl, per-chunk running ppl).
    pub fn perplexity(
        &mut self,
        tokens: &[u32],
        n_ctx: usize,
        bos: Option<u32>,
    ) -> Result<(f64, Vec<f64>), ModelError> {
        let n_chunk = tokens.len() / n_ctx;
        if n_chunk == 0 {
            return Err(ModelError::Invalid(format!(
                "need at least {} tokens for context {n_ctx}, have {}",
                2 * n_ctx,
                tokens.len()
            )));
        }
        let nv = self.model.config.n_vocab;
        let first = n_ctx / 2;
        let (mut nll, mut count) = (0.0f64, 0usize);
        let mut running = Vec::with_capacity(n_chunk);
        for i in 0..n_chunk {
            let mut chunk = tokens[i * n_ctx..(i + 1) * n_ctx].to_vec();
            if let Some(b) = bos {
                chunk[0] = b;
            }
            let logits = self.logits_all(&chunk)?;
            for j in first..n_ctx - 1 {
                let row = &logits[j * nv..(j + 1) * nv];
                let target = tokens[i * n_ctx + j + 1] as usize;
                nll -= log_softmax_at(row, target);
                count += 1;
            }
            running.push((nll / count as f64).exp());
        }
        Ok(((nll / count as f64).exp(), running))
    }
}

/// log(softmax(row)[i]) in f64.
pub fn log_softmax_at(row: &[f32], i: usize) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
    row[i] as f64 - max - sum.ln()
}
