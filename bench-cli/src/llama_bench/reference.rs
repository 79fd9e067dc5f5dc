//! llama.cpp as the second contestant of a test (feature `llamacpp`): a fresh context
//! per test, as llama-bench makes one, with llama.cpp's own defaults.

use std::path::Path;

use anyhow::{Context, Result};
use llamacpp_ref::{RefModel, RefOptions};

use super::cli::TestSpec;
use super::run::{LoadedModel, ModelDesc, RepTokens};

/// llama.cpp set up for one test (a fresh context per test, as llama-bench does).
pub(super) struct RefInstance {
    pub(super) m: RefModel,
}

impl RefInstance {
    pub(super) fn new(path: &Path, spec: &TestSpec) -> Result<RefInstance> {
        let opts = RefOptions {
            n_ctx: u32::try_from(spec.n_ctx()).context("context too large")?,
            n_batch: spec.n_batch as u32,
            n_ubatch: spec.n_ubatch as u32,
            n_threads: spec.threads as i32,
            n_threads_batch: spec.threads as i32,
            // llama.cpp's default (auto, on for CPU), which is what llama-bench runs.
            flash_attn: None,
            ..Default::default()
        };
        Ok(RefInstance {
            m: RefModel::load(path, &opts)?,
        })
    }

    pub(super) fn warmup(&mut self, t: &RepTokens) -> Result<()> {
        self.m.clear_kv();
        if !t.prompt.is_empty() {
            self.m.time_prompt(&t.prompt)?;
        }
        if let Some(&first) = t.gen.first() {
            self.m.time_generate(first, 1)?;
        }
        self.m.clear_kv();
        Ok(())
    }

    pub(super) fn rep(&mut self, t: &RepTokens) -> Result<u64> {
        self.fill_depth(t)?;
        let mut ns = 0;
        if !t.prompt.is_empty() {
            // After the depth tokens, where there are some.
            ns += self.m.time_prompt_after(&t.prompt)?;
        }
        if let Some(&first) = t.gen.first() {
            ns += self.m.time_generate(first, t.gen.len())?;
        }
        Ok(ns)
    }

    /// Clears the cache and fills it with the depth tokens (not timed): the start of a
    /// repetition, whole or generated in turns ([`RefInstance::gen_tokens`]).
    pub(super) fn fill_depth(&mut self, t: &RepTokens) -> Result<()> {
        if t.depth.is_empty() {
            self.m.clear_kv();
        } else {
            // Clears the cache, then fills it with the depth tokens.
            self.m.time_prompt(&t.depth)?;
        }
        Ok(())
    }

    /// Decodes `toks` one at a time, continuing at the current position; nanoseconds of
    /// decoding.
    pub(super) fn gen_tokens(&mut self, toks: &[u32]) -> Result<u64> {
        let mut ns = 0;
        for &tok in toks {
            ns += self.m.time_generate(tok, 1)?;
        }
        Ok(ns)
    }

    /// What its result row says: the model as llama.cpp describes it, and the KV cache
    /// (bytes when our model is loaded to size it, tokens).
    pub(super) fn describe(&self, model: &LoadedModel) -> (ModelDesc, Option<u64>, u64) {
        let n_ctx = self.m.n_ctx() as u64;
        let info = ModelDesc {
            filename: model.info.filename.clone(),
            model_type: super::run::mark_synthetic(self.m.desc(), model.synthetic),
            size: self.m.model_size(),
            n_params: self.m.n_params(),
        };
        // llama.cpp's default cache is f16 K and V for every position, the same per-token
        // size as ours (models with sliding-window layers allocate less).
        let kv_bytes = model
            .ours
            .as_ref()
            .map(|m| m.kv_layout(1, 1).bytes_per_token() as u64 * n_ctx);
        (info, kv_bytes, n_ctx)
    }
}
