//! A layer's tensors, bound once from the file by what its [`LayerSpec`] declares, in one
//! shape for both executors: [`LayerW<M, V>`] is generic over the handle of a matrix `M`
//! and of a vector `V`, so the CPU layers hold [`Linear`](crate::weights::Linear)s and
//! `Vec<f32>`s and the device layers ggml tensors of the same structure
//! ([`LayerW::map`]). Which tensors exist besides the declared ones (biases, a fused QKV or
//! gate/up matrix) is read from the file, as llama.cpp's loader does.

use quant::GgmlType;

use super::arch::Config;
use super::spec::{FfnSpec, LayerSpec};
use super::{f32_vec, ModelError};
use crate::gguf::GgufFile;

/// A weight matrix (or a stack of `n_expert` of them, one per expert) in the mapped file:
/// `n_out` rows of `n_in` elements each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mat {
    pub ty: GgmlType,
    pub n_in: usize,
    pub n_out: usize,
    /// 1 for a plain matrix.
    pub n_expert: usize,
    /// Byte range in the file image.
    pub start: usize,
    pub len: usize,
}

impl Mat {
    /// Expert `e` of a stack (the matrix itself when it is not one).
    pub fn expert(&self, e: usize) -> Mat {
        let len = self.len / self.n_expert;
        Mat {
            n_expert: 1,
            start: self.start + e * len,
            len,
            ..*self
        }
    }

    /// Each matrix of the stack (the matrix itself for a plain one).
    pub fn experts(&self) -> impl Iterator<Item = Mat> + '_ {
        (0..self.n_expert).map(|e| self.expert(e))
    }
}

/// Q, K and V projections: three matrices or one (`attn_qkv`, rows Q then K then V).
#[derive(Clone, Debug)]
pub enum Qkv<M> {
    Split { q: M, k: M, v: M },
    Fused(M),
}

/// Gate and up projections: two matrices or one (`ffn_up` of twice the width, gate
/// rows first).
#[derive(Clone, Debug)]
pub enum GateUp<M> {
    Split { gate: M, up: M },
    Fused(M),
}

/// A dense feed-forward block (or the experts' stacks of one).
#[derive(Clone, Debug)]
pub struct FfnW<M, V> {
    pub gate_up: GateUp<M>,
    pub down: M,
    /// Biases of gate, up and down (per expert for a stack: `n_expert` rows).
    pub b_gate: Option<V>,
    pub b_up: Option<V>,
    pub b_down: Option<V>,
}

/// The feed-forward weights of a layer.
#[derive(Clone, Debug)]
pub enum FfnKind<M, V> {
    Dense(FfnW<M, V>),
    /// A router (`ffn_gate_inp`, with its bias) over stacks of experts.
    Moe {
        router: M,
        router_b: Option<V>,
        experts: FfnW<M, V>,
    },
}

/// One layer's tensors.
#[derive(Clone, Debug)]
pub struct LayerW<M, V> {
    pub attn_norm: V,
    pub qkv: Qkv<M>,
    /// Biases of Q, K and V (a fused bias is split at load).
    pub b_qkv: [Option<V>; 3],
    pub q_norm: Option<V>,
    pub k_norm: Option<V>,
    pub wo: M,
    pub b_o: Option<V>,
    pub sinks: Option<V>,
    pub post_attn_norm: Option<V>,
    pub ffn_norm: V,
    pub ffn: FfnKind<M, V>,
    pub post_ffn_norm: Option<V>,
}

impl<M, V> LayerW<M, V> {
    /// The same layer with every handle converted (`fm` for matrices, `fv` for vectors),
    /// in a fixed order: how the device layers upload what the CPU layers bound.
    pub fn map<'s, M2, V2, E>(
        &'s self,
        fm: &mut impl FnMut(&'s M) -> Result<M2, E>,
        fv: &mut impl FnMut(&'s V) -> Result<V2, E>,
    ) -> Result<LayerW<M2, V2>, E> {
        let mut ov = |v: &'s Option<V>| v.as_ref().map(&mut *fv).transpose();
        let ffn_w = |w: &'s FfnW<M, V>,
                     fm: &mut dyn FnMut(&'s M) -> Result<M2, E>,
                     fv: &mut dyn FnMut(&'s V) -> Result<V2, E>|
         -> Result<FfnW<M2, V2>, E> {
            Ok(FfnW {
                gate_up: match &w.gate_up {
                    GateUp::Split { gate, up } => GateUp::Split {
                        gate: fm(gate)?,
                        up: fm(up)?,
                    },
                    GateUp::Fused(m) => GateUp::Fused(fm(m)?),
                },
                down: fm(&w.down)?,
                b_gate: w.b_gate.as_ref().map(&mut *fv).transpose()?,
                b_up: w.b_up.as_ref().map(&mut *fv).transpose()?,
                b_down: w.b_down.as_ref().map(&mut *fv).transpose()?,
            })
        };
        let b_qkv = [
            ov(&self.b_qkv[0])?,
            ov(&self.b_qkv[1])?,
            ov(&self.b_qkv[2])?,
        ];
        let q_norm = ov(&self.q_norm)?;
        let k_norm = ov(&self.k_norm)?;
        let b_o = ov(&self.b_o)?;
        let sinks = ov(&self.sinks)?;
        let post_attn_norm = ov(&self.post_attn_norm)?;
        let post_ffn_norm = ov(&self.post_ffn_norm)?;
        Ok(LayerW {
            attn_norm: fv(&self.attn_norm)?,
            qkv: match &self.qkv {
                Qkv::Split { q, k, v } => Qkv::Split {
                    q: fm(q)?,
                    k: fm(k)?,
                    v: fm(v)?,
                },
                Qkv::Fused(m) => Qkv::Fused(fm(m)?),
            },
            b_qkv,
            q_norm,
            k_norm,
            wo: fm(&self.wo)?,
            b_o,
            sinks,
            post_attn_norm,
            ffn_norm: fv(&self.ffn_norm)?,
            ffn: match &self.ffn {
                FfnKind::Dense(w) => FfnKind::Dense(ffn_w(w, fm, fv)?),
                FfnKind::Moe {
                    router,
                    router_b,
                    experts,
                } => FfnKind::Moe {
                    router: fm(router)?,
                    router_b: router_b.as_ref().map(&mut *fv).transpose()?,
                    experts: ffn_w(experts, fm, fv)?,
                },
            },
            post_ffn_norm,
        })
    }

    /// Every matrix of the layer, in [`LayerW::map`]'s order.
    pub fn matrices(&self) -> Vec<&M> {
        let mut out = Vec::with_capacity(8);
        match &self.qkv {
            Qkv::Split { q, k, v } => out.extend([q, k, v]),
            Qkv::Fused(m) => out.push(m),
        }
        out.push(&self.wo);
        let ffn = match &self.ffn {
            FfnKind::Dense(w) => w,
            FfnKind::Moe {
                router, experts, ..
            } => {
                out.push(router);
                experts
            }
        };
        match &ffn.gate_up {
            GateUp::Split { gate, up } => out.extend([gate, up]),
            GateUp::Fused(m) => out.push(m),
        }
        out.push(&ffn.down);
        out
    }
}

/// Binds tensors by name, checking shapes and types.
pub(super) struct Binder<'a> {
    pub file: &'a GgufFile,
}

impl Binder<'_> {
    fn tensor(&self, name: &str) -> Result<&crate::gguf::TensorInfo, ModelError> {
        self.file
            .tensor(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }

    /// A matrix of `n_out` rows of `n_in` (a stack of `n_expert` with `n_expert` > 1).
    pub fn mat_n(
        &self,
        name: &str,
        n_in: usize,
        n_out: usize,
        n_expert: usize,
    ) -> Result<Mat, ModelError> {
        let t = self.tensor(name)?;
        let expected: Vec<u64> = if n_expert > 1 {
            vec![n_in as u64, n_out as u64, n_expert as u64]
        } else {
            vec![n_in as u64, n_out as u64]
        };
        if t.shape != expected {
            return Err(ModelError::BadShape {
                name: name.into(),
                found: t.shape.clone(),
                expected,
                ty: t.ty,
            });
        }
        if !quant::has_vec_dot(t.ty) {
            return Err(ModelError::UnsupportedType {
                name: name.into(),
                ty: t.ty,
            });
        }
        Ok(Mat {
            ty: t.ty,
            n_in,
            n_out,
            n_expert,
            start: (self.file.data_offset + t.offset) as usize,
            len: t.size as usize,
        })
    }

    pub fn mat(&self, name: &str, n_in: usize, n_out: usize) -> Result<Mat, ModelError> {
        self.mat_n(name, n_in, n_out, 1)
    }

    pub fn has(&self, name: &str) -> bool {
        self.file.tensor(name).is_some()
    }

    /// An F32-convertible vector of `n` elements (norms, biases, sinks).
    pub fn vec(&self, name: &str, n: usize) -> Result<Vec<f32>, ModelError> {
        let t = self.tensor(name)?;
        if t.n_elements() != n as u64 {
            return Err(ModelError::BadShape {
                name: name.into(),
                found: t.shape.clone(),
                expected: vec![n as u64],
                ty: t.ty,
            });
        }
        f32_vec(self.file, t)
    }

    pub fn opt_vec(&self, name: &str, n: usize) -> Result<Option<Vec<f32>>, ModelError> {
        if self.has(name) {
            self.vec(name, n).map(Some)
        } else {
            Ok(None)
        }
    }

    /// A required vector when `want`, none otherwise.
    fn want_vec(&self, want: bool, name: &str, n: usize) -> Result<Option<Vec<f32>>, ModelError> {
        if want {
            self.vec(name, n).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Layer `il`'s tensors as `spec` declares them.
    pub fn layer(
        &self,
        c: &Config,
        il: usize,
        spec: &LayerSpec,
    ) -> Result<LayerW<Mat, Vec<f32>>, ModelError> {
        let n = |s: &str| format!("blk.{il}.{s}");
        let d = c.n_embd;
        let q_dim = c.n_head * c.head_dim_k;
        let k_dim = c.n_head_kv * c.head_dim_k;
        let v_dim = c.n_head_kv * c.head_dim_v;
        let (qkv, b_qkv) = if self.has(&n("attn_qkv.weight")) {
            let m = self.mat(&n("attn_qkv.weight"), d, q_dim + k_dim + v_dim)?;
            let b = match self.opt_vec(&n("attn_qkv.bias"), q_dim + k_dim + v_dim)? {
                Some(b) => [
                    Some(b[..q_dim].to_vec()),
                    Some(b[q_dim..q_dim + k_dim].to_vec()),
                    Some(b[q_dim + k_dim..].to_vec()),
                ],
                None => [None, None, None],
            };
            (Qkv::Fused(m), b)
        } else {
            (
                Qkv::Split {
                    q: self.mat(&n("attn_q.weight"), d, q_dim)?,
                    k: self.mat(&n("attn_k.weight"), d, k_dim)?,
                    v: self.mat(&n("attn_v.weight"), d, v_dim)?,
                },
                [None, None, None],
            )
        };
        let b_qkv = if b_qkv.iter().any(Option::is_some) {
            b_qkv
        } else {
            [
                self.opt_vec(&n("attn_q.bias"), q_dim)?,
                self.opt_vec(&n("attn_k.bias"), k_dim)?,
                self.opt_vec(&n("attn_v.bias"), v_dim)?,
            ]
        };
        let a = &spec.attn;
        let ffn = match &spec.ffn {
            FfnSpec::Dense { n_ff, .. } => {
                let ff = *n_ff;
                let gate_up = if self.has(&n("ffn_gate.weight")) {
                    GateUp::Split {
                        gate: self.mat(&n("ffn_gate.weight"), d, ff)?,
                        up: self.mat(&n("ffn_up.weight"), d, ff)?,
                    }
                } else {
                    GateUp::Fused(self.mat(&n("ffn_up.weight"), d, 2 * ff)?)
                };
                FfnKind::Dense(FfnW {
                    gate_up,
                    down: self.mat(&n("ffn_down.weight"), ff, d)?,
                    b_gate: self.opt_vec(&n("ffn_gate.bias"), ff)?,
                    b_up: self.opt_vec(&n("ffn_up.bias"), ff)?,
                    b_down: self.opt_vec(&n("ffn_down.bias"), d)?,
                })
            }
            FfnSpec::Moe(m) => {
                let (ne, ff) = (m.n_expert, m.n_ff);
                if ff == 0 {
                    return Err(ModelError::MissingKey(format!(
                        "{}.expert_feed_forward_length",
                        c.arch.name()
                    )));
                }
                FfnKind::Moe {
                    router: self.mat(&n("ffn_gate_inp.weight"), d, ne)?,
                    router_b: self.opt_vec(&n("ffn_gate_inp.bias"), ne)?,
                    experts: FfnW {
                        gate_up: GateUp::Split {
                            gate: self.mat_n(&n("ffn_gate_exps.weight"), d, ff, ne)?,
                            up: self.mat_n(&n("ffn_up_exps.weight"), d, ff, ne)?,
                        },
                        down: self.mat_n(&n("ffn_down_exps.weight"), ff, d, ne)?,
                        b_gate: self.opt_vec(&n("ffn_gate_exps.bias"), ff * ne)?,
                        b_up: self.opt_vec(&n("ffn_up_exps.bias"), ff * ne)?,
                        b_down: self.opt_vec(&n("ffn_down_exps.bias"), d * ne)?,
                    },
                }
            }
        };
        Ok(LayerW {
            attn_norm: self.vec(&n("attn_norm.weight"), d)?,
            qkv,
            b_qkv,
            q_norm: self.want_vec(a.qk_norm, &n("attn_q_norm.weight"), c.head_dim_k)?,
            k_norm: self.want_vec(a.qk_norm, &n("attn_k_norm.weight"), c.head_dim_k)?,
            wo: self.mat(&n("attn_output.weight"), c.n_head * c.head_dim_v, d)?,
            b_o: self.opt_vec(&n("attn_output.bias"), d)?,
            sinks: self.want_vec(a.sinks, &n("attn_sinks.weight"), c.n_head)?,
            post_attn_norm: self.want_vec(
                spec.post_attn_norm,
                &n("post_attention_norm.weight"),
                d,
            )?,
            ffn_norm: self.vec(&n(&format!("{}.weight", spec.ffn_norm)), d)?,
            ffn,
            post_ffn_norm: self.want_vec(spec.post_ffn_norm, &n("post_ffw_norm.weight"), d)?,
        })
    }
}
