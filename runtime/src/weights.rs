//! Weight matrices with their execution plan fixed at load. A [`Linear`] is a matrix of
//! the model (or a stack of experts) plus where its products read it from: the mapped
//! file, its rows repacked for the packed kernels (`crate::packed`), or per-node copies
//! (`--numa-weights`). The [`WeightStore`] owns those places; [`WeightStore::mat`] turns
//! a `Linear` into the [`MatRef`] that `matmul` multiplies by. The choice is made once,
//! in [`WeightStore::new`], from the [`WeightPlan`]: forward code never asks how a weight
//! is stored, which kernels exist or which numerics were chosen.

use std::sync::Arc;

use crate::gguf::GgufFile;
use crate::matmul::{MatRef, Numerics};
use crate::model::weights::Mat;
use crate::numa::{NumaError, Topology, WeightCopies, WeightPlacement};
use crate::packed::{PackSource, PackedWeights};

/// How a model's weights are laid out and multiplied, decided before load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightPlan {
    pub numerics: Numerics,
    /// Repack the matrices that have packed kernels (default on unless `RLLAMA_NO_PACK`).
    pub pack: bool,
    pub placement: WeightPlacement,
    /// The nodes of the placement (`numa::weight_nodes`): interleaved over, or one copy
    /// each; empty for first-touch.
    pub nodes: Vec<usize>,
}

impl Default for WeightPlan {
    fn default() -> WeightPlan {
        WeightPlan {
            numerics: Numerics::Exact,
            pack: !crate::options::Env::get().no_pack,
            placement: WeightPlacement::FirstTouch,
            nodes: Vec::new(),
        }
    }
}

/// Where a matrix's products read it from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    /// The mapped file's rows.
    File,
    /// Rows repacked into eight-row groups (`crate::packed`).
    Packed,
    /// The node copies of the file's bytes (`--numa-weights interleave|replicate`).
    Copies,
}

/// A matrix (or a stack of experts) and the place its products read.
#[derive(Clone, Copy, Debug)]
pub struct Linear {
    pub mat: Mat,
    pub storage: Storage,
}

/// The memory the weights live in, and the plan they were laid out by.
pub struct WeightStore {
    file: Arc<GgufFile>,
    copies: Option<WeightCopies>,
    packed: Option<PackedWeights>,
    plan: WeightPlan,
}

impl WeightStore {
    /// Lays out `mats` (every matrix the forward pass multiplies by) as `plan` says:
    /// copies into node memory for interleave/replicate (read as placed, so nothing is
    /// packed), else the packable ones repacked (their file pages released once packed).
    /// Packing is only a speed-up: where its memory cannot be had the store says so on
    /// stderr and the products read the file's rows.
    pub fn new(
        file: Arc<GgufFile>,
        mats: &[Mat],
        plan: WeightPlan,
        topo: Option<&Topology>,
    ) -> Result<WeightStore, NumaError> {
        let base = file.data_offset as usize;
        let copies = WeightCopies::new(
            &file.bytes()[base..],
            base,
            plan.placement,
            &plan.nodes,
            topo,
        )?;
        let packed = if copies.is_none() && plan.pack {
            // A stack of experts packs as one matrix: its groups of eight rows never
            // cross experts when each expert's rows come in whole groups.
            let srcs: Vec<PackSource> = mats
                .iter()
                .filter(|m| m.n_expert == 1 || m.n_out.is_multiple_of(quant::PACK_ROWS))
                .map(|m| PackSource {
                    ty: m.ty,
                    n_in: m.n_in,
                    n_out: m.n_out * m.n_expert,
                    start: m.start,
                    len: m.len,
                })
                .collect();
            let f = file.clone();
            match PackedWeights::new(file.bytes(), &srcs, plan.numerics, &|start, len| {
                f.release_range(start, len)
            }) {
                Ok(p) => p,
                Err(e) => {
                    eprintln!(
                        "warning: the weights were not repacked ({e}); \
                         multiplying the file's rows (same results, slower)"
                    );
                    None
                }
            }
        } else {
            None
        };
        Ok(WeightStore {
            file,
            copies,
            packed,
            plan,
        })
    }

    /// The plan `m`'s products follow in this store.
    pub fn linear(&self, m: Mat) -> Linear {
        let storage = if self.copies.is_some() {
            Storage::Copies
        } else if self
            .packed
            .as_ref()
            .is_some_and(|p| p.get(m.start).is_some())
        {
            Storage::Packed
        } else {
            Storage::File
        };
        Linear { mat: m, storage }
    }

    /// What the products of `l` (of its expert `e` for a stack) multiply by.
    pub fn mat(&self, l: &Linear, e: usize) -> MatRef<'_> {
        let m = if l.mat.n_expert > 1 {
            l.mat.expert(e)
        } else {
            l.mat
        };
        let (data, copies, packed) = match l.storage {
            Storage::File => (&self.file.bytes()[m.start..m.start + m.len], None, None),
            Storage::Copies => {
                let c = self.copies.as_ref().expect("planned with copies");
                (c.slice(0, m.start, m.len), Some((c, m.start)), None)
            }
            Storage::Packed => {
                let p = self
                    .packed
                    .as_ref()
                    .and_then(|p| p.get(l.mat.start))
                    .expect("planned as packed");
                let off = m.start - l.mat.start;
                (
                    &self.file.bytes()[m.start..m.start + m.len],
                    None,
                    Some(&p[off..off + m.len]),
                )
            }
        };
        MatRef {
            ty: m.ty,
            n_in: m.n_in,
            n_out: m.n_out,
            data,
            copies,
            numerics: self.plan.numerics,
            packed,
        }
    }

    pub fn plan(&self) -> &WeightPlan {
        &self.plan
    }

    pub fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }

    pub fn copies(&self) -> Option<&WeightCopies> {
        self.copies.as_ref()
    }

    /// Bytes of anonymous memory the repacked weights take (0 when none were packed).
    pub fn packed_bytes(&self) -> usize {
        self.packed.as_ref().map_or(0, PackedWeights::bytes)
    }
}
