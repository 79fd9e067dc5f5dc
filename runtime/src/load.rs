//! Opening a model by registry name or path, the one sequence every binary uses: resolve
//! (fetching a registry model that is not cached yet), map the GGUF file, build the
//! tokenizer, then the model. Errors name the file and the step that failed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::gguf::{GgufError, GgufFile};
use crate::matmul::Numerics;
use crate::model::{Model, ModelError};
use crate::numa::{self, NumaError, NumaMode, WeightPlacement};
use crate::offload::{OffloadError, OffloadSpec};
use crate::registry::{self, FetchError};
use crate::tokenizer::{Tokenizer, TokenizerError};

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
    /// The kernel orders the models built from here use (`Exact` unless set).
    pub numerics: Numerics,
    /// Layers to put on a ggml device, with the KV slots to allocate there (see
    /// [`ModelFile::with_offload`]).
    pub offload: Option<(OffloadSpec, usize)>,
}

impl ModelFile {
    /// Sets the kernel orders of the models built from here (see [`Numerics`]).
    pub fn with_numerics(mut self, numerics: Numerics) -> ModelFile {
        self.numerics = numerics;
        self
    }

    /// Offloads the models built from here as `spec` says (`-ngl`, `--device`), with a
    /// device KV cache of `n_slots` slots: the size of the `KvCache` the model will run
    /// with (`Model::kv_layout(n_ctx, block).n_blocks * block`). `-ngl 0` changes nothing.
    pub fn with_offload(mut self, spec: OffloadSpec, n_slots: usize) -> ModelFile {
        self.offload = (spec.n_gpu_layers > 0).then_some((spec, n_slots));
        self
    }

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
            numerics: Numerics::Exact,
            offload: None,
        })
    }

    /// Builds the model (weights stay in the mapped file, the packable ones packed for
    /// its numerics).
    pub fn model(&self) -> Result<Model, LoadError> {
        let mut m = self.unpacked()?;
        m.set_numerics(self.numerics);
        Ok(m)
    }

    /// The model over the mapped file, nothing packed yet.
    fn unpacked(&self) -> Result<Model, LoadError> {
        Model::from_gguf(self.file.clone()).map_err(|source| LoadError::Model {
            path: self.path.clone(),
            source,
        })
    }

    /// Builds the model with its weights placed as `weights` says, for `threads` compute
    /// threads under `mode` (see [`numa::weight_nodes`]).
    pub fn model_placed(
        &self,
        weights: WeightPlacement,
        mode: Option<NumaMode>,
        threads: usize,
    ) -> Result<Model, LoadError> {
        let mut model = self.model()?;
        if weights != WeightPlacement::FirstTouch {
            let err = |source| LoadError::Numa {
                path: self.path.clone(),
                source,
            };
            let topo = numa::Topology::read().map_err(err)?;
            let nodes = numa::weight_nodes(&topo, weights, mode, threads).map_err(err)?;
            model
                .place_weights(weights, &nodes, Some(&topo))
                .map_err(err)?;
            if let Some(n) = model.weight_placement_note() {
                eprintln!("{}: {n}", self.path.display());
            }
        }
        if let Some((spec, n_slots)) = &self.offload {
            let n = spec.n_gpu_layers.min(model.config.n_layer);
            eprintln!(
                "offload: uploading {n} of {} layers{} to {} ...",
                model.config.n_layer,
                if spec.n_gpu_layers > model.config.n_layer {
                    " and the output layer"
                } else {
                    ""
                },
                spec.device.as_deref().unwrap_or("the first GPU")
            );
            let mut last = 0;
            model
                .offload(spec, *n_slots, threads, &mut |done, total| {
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

    /// Builds the model and keeps everything together.
    pub fn load(self) -> Result<Loaded, LoadError> {
        self.load_placed(WeightPlacement::FirstTouch, None, 1)
    }

    /// As [`ModelFile::load`], with the weights placed (see [`ModelFile::model_placed`]).
    pub fn load_placed(
        self,
        weights: WeightPlacement,
        mode: Option<NumaMode>,
        threads: usize,
    ) -> Result<Loaded, LoadError> {
        let model = Arc::new(self.model_placed(weights, mode, threads)?);
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
