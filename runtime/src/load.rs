//! Opening a model by registry name or path, the one sequence every binary uses: resolve
//! (fetching a registry model that is not cached yet), map the GGUF file, build the
//! tokenizer, then the model. Errors name the file and the step that failed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::gguf::{GgufError, GgufFile};
use crate::model::{Model, ModelError};
use crate::numa::{self, NumaError, WeightPlacement};
use crate::offload::OffloadError;
use crate::options::RunOptions;
use crate::registry::{self, FetchError};
use crate::tokenizer::{Tokenizer, TokenizerError};
use crate::weights::WeightPlan;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error("cannot open {}: {source}", path.display())]
    Open { path: PathBuf, source: GgufError },
    #[error("{}: cannot load the tokenizer: {source}", path.display())]
    Tokenizer {
        path: PathBuf,
        source: TokenizerError,
    },
    #[error("{}: cannot load the model: {source}", path.display())]
    Model { path: PathBuf, source: ModelError },
    #[error("{}: cannot place the weights: {source}", path.display())]
    Numa { path: PathBuf, source: NumaError },
    #[error("{}: cannot offload: {source}", path.display())]
    Offload { path: PathBuf, source: OffloadError },
}

/// A model file opened with its tokenizer, before (or without) building the model.
pub struct ModelFile {
    /// The resolved path.
    pub path: PathBuf,
    pub file: Arc<GgufFile>,
    pub tokenizer: Arc<Tokenizer>,
}

/// How big a model's contexts are where building it depends on that: the context it runs
/// with (Phi-3 picks its RoPE factors by it, as llama.cpp by its `n_ctx`) and the KV
/// slots of its cache (what an offloaded model's device cache holds:
/// `Model::kv_layout(n_ctx, block).n_blocks * block`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContextSize {
    pub n_ctx: Option<usize>,
    pub kv_slots: usize,
}

impl ContextSize {
    /// One sequence of `n_ctx` positions in blocks of 16.
    pub fn single(n_ctx: usize) -> ContextSize {
        ContextSize {
            n_ctx: Some(n_ctx),
            kv_slots: n_ctx.div_ceil(16) * 16,
        }
    }
}

impl ModelFile {
    /// Resolves `name_or_path` (a registry name or a path; see [`registry::resolve`]) and
    /// opens it.
    pub fn open(name_or_path: &str) -> Result<ModelFile, LoadError> {
        ModelFile::open_path(&registry::resolve(name_or_path)?)
    }

    /// Opens the GGUF file at `path` and builds its tokenizer.
    pub fn open_path(path: &Path) -> Result<ModelFile, LoadError> {
        let file = GgufFile::open(path).map_err(|source| LoadError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        let tokenizer = Tokenizer::from_gguf(&file).map_err(|source| LoadError::Tokenizer {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(ModelFile {
            path: path.to_path_buf(),
            file: Arc::new(file),
            tokenizer: Arc::new(tokenizer),
        })
    }

    /// Builds the model with the default options (exact numerics, packed, first-touch,
    /// nothing offloaded).
    pub fn model(&self) -> Result<Model, LoadError> {
        self.model_with(&RunOptions::default(), ContextSize::default())
    }

    /// Builds the model as `opts` say: its numerics and packing, its weights placed for
    /// `opts.threads` threads under `opts.numa` (see [`numa::weight_nodes`]), and the
    /// layers `opts.offload` asks for on a device, with a device KV cache of
    /// `ctx.kv_slots` slots. The one place a model's run options become its plan.
    pub fn model_with(&self, opts: &RunOptions, ctx: ContextSize) -> Result<Model, LoadError> {
        let numa_err = |source| LoadError::Numa {
            path: self.path.clone(),
            source,
        };
        let weights = opts.weights;
        let (nodes, topo) = if weights != WeightPlacement::FirstTouch {
            let topo = numa::Topology::read().map_err(numa_err)?;
            let nodes =
                numa::weight_nodes(&topo, weights, opts.numa, opts.threads).map_err(numa_err)?;
            (nodes, Some(topo))
        } else {
            (Vec::new(), None)
        };
        let plan = WeightPlan {
            numerics: opts.numerics,
            pack: opts.pack,
            placement: weights,
            nodes,
        };
        let mut model =
            Model::build(self.file.clone(), plan, topo.as_ref(), ctx.n_ctx).map_err(|source| {
                match source {
                    ModelError::Numa(source) => numa_err(source),
                    source => LoadError::Model {
                        path: self.path.clone(),
                        source,
                    },
                }
            })?;
        if let Some(n) = model.weight_placement_note() {
            eprintln!("{}: {n}", self.path.display());
        }
        let spec = &opts.offload;
        if spec.n_gpu_layers > 0 {
            let n = spec.n_gpu_layers.min(model.config.n_layer);
            eprintln!(
                "offload: uploading {n} of {} layers{} to {} ...",
                model.config.n_layer,
                if spec.n_gpu_layers > model.config.n_layer {
                    " and the output layer"
                } else {
                    ""
                },
                spec.devices_named()
            );
            let mut last = 0;
            model
                .offload(spec, ctx.kv_slots, opts.threads, &mut |done, total| {
                    let pct = done * 100 / total.max(1);
                    if pct >= last + 25 {
                        last = pct;
                        eprintln!("offload: {pct}% of {total} tensors");
                    }
                })
                .map_err(|source| LoadError::Offload {
                    path: self.path.clone(),
                    source,
                })?;
            if let Some(d) = model.device_layers() {
                eprintln!("offload: {}", d.summary());
            }
        }
        Ok(model)
    }

    /// Builds the model with the default options and keeps everything together.
    pub fn load(self) -> Result<Loaded, LoadError> {
        self.load_with(&RunOptions::default(), ContextSize::default())
    }

    /// As [`ModelFile::model_with`], keeping file, tokenizer and model together.
    pub fn load_with(self, opts: &RunOptions, ctx: ContextSize) -> Result<Loaded, LoadError> {
        let model = Arc::new(self.model_with(opts, ctx)?);
        Ok(Loaded {
            path: self.path,
            file: self.file,
            tokenizer: self.tokenizer,
            model,
        })
    }
}

/// A model ready to run: file, tokenizer and model.
pub struct Loaded {
    pub path: PathBuf,
    pub file: Arc<GgufFile>,
    pub tokenizer: Arc<Tokenizer>,
    pub model: Arc<Model>,
}

/// Resolves, opens and builds `name_or_path` (see [`ModelFile::open`]).
pub fn load(name_or_path: &str) -> Result<Loaded, LoadError> {
    ModelFile::open(name_or_path)?.load()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_file_and_the_step() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("empty.gguf");
        std::fs::write(&p, b"").unwrap();
        let e = ModelFile::open(p.to_str().unwrap()).err().unwrap();
        assert!(matches!(e, LoadError::Open { .. }), "{e}");
        assert!(e.to_string().contains("empty.gguf"), "{e}");
        let e = load("no-such-model-name").err().unwrap();
        assert!(matches!(e, LoadError::Fetch(_)), "{e}");
    }
}
