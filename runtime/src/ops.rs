//! Element-wise and row operations of the forward pass, written to follow ggml's CPU
//! numerics (accumulation types, operation order) so our logits track llama.cpp's closely.

use half::f16;

/// RMS norm of `x` in place, times `w`: the sum of squares is accumulated in f64 as
/// ggml does, then the scale is applied in f32.
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for (v, &g) in x.iter_mut().zip(w) {
        *v = (*v * scale) * g;
    }
}

/// `out = rms_norm(x) * w` without touching `x`.
pub fn rms_norm_into(out: &mut [f32], x: &[f32], w: &[f32], eps: f32) {
    out.copy_from_slice(x);
    rms_norm(out, w, eps);
}

const GELU_COEF_A: f32 = 0.044715;
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// ggml's `ggml_gelu_f32` as GCC compiles it (FMA contraction fuses the one
/// multiply-add, `1 + (a·x)·x`).
fn gelu_exact_tanh(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (GELU_COEF_A * x).mul_add(x, 1.0)).tanh())
}

/// Tanh-approximated GELU as ggml's CPU backend computes it: through an f16 lookup table
/// (input rounded to f16, output stored as f16), identity/zero outside ±10.
pub struct Gelu {
    table: Vec<f16>,
}

impl Default for Gelu {
    fn default() -> Self {
        Self::new()
    }
}

impl Gelu {
    pub fn new() -> Gelu {
        let table = (0..=u16::MAX)
            .map(|bits| f16::from_f32(gelu_exact_tanh(f16::from_bits(bits).to_f32())))
            .collect();
        Gelu { table }
    }

    #[inline]
    pub fn apply(&self, x: f32) -> f32 {
        if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x
        } else {
            self.table[f16::from_f32(x).to_bits() as usize].to_f32()
        }
    }
}

/// How rotary embedding pairs dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (x[2i], x[2i+1]) — llama.
    Normal,
    /// Halves (x[i], x[i + n/2]) — GPT-NeoX, qwen2, gemma.
    Neox,
}

/// Rotary embedding parameters of one layer.
#[derive(Clone, Debug)]
pub struct Rope {
    pub style: RopeStyle,
    /// Number of rotated dimensions (the rest pass through).
    pub n_dims: usize,
    pub freq_base: f32,
    pub freq_scale: f32,
    /// Per-pair divisors (llama 3 `rope_freqs`), if the model has them.
    pub freq_factors: Option<Vec<f32>>,
}

impl Rope {
    /// Fills `cache` (length n_dims) with interleaved cos/sin for position `pos`, with the
    /// same f32 recurrence for theta as ggml (theta *= theta_scale per pair).
    pub fn cache(&self, pos: usize, cache: &mut [f32]) {
        let theta_scale = self.freq_base.powf(-2.0 / self.n_dims as f32);
        let mut theta = pos as f32;
        for i in (0..self.n_dims).step_by(2) {
            let ff = self.freq_factors.as_ref().map_or(1.0, |f| f[i / 2]);
            let t = self.freq_scale * (theta / ff);
            cache[i] = t.cos();
            cache[i + 1] = t.sin();
            theta *= theta_scale;
        }
    }

    /// Rotates one head vector `x` in place using a cache from [`Rope::cache`], with
    /// ggml's rounding (see [`quant::ggml_math::rope_rotate`]).
    pub fn apply(&self, x: &mut [f32], cache: &[f32]) {
        quant::ggml_math::rope_rotate(x, cache, self.n_dims, self.style == RopeStyle::Neox);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_rms() {
        let mut x = vec![3.0, 4.0];
        rms_norm(&mut x, &[1.0, 1.0], 0.0);
        let rms = ((x[0] * x[0] + x[1] * x[1]) / 2.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-6);
    }

    #[test]
    fn rope_rotates_and_preserves_norm() {
        for style in [RopeStyle::Normal, RopeStyle::Neox] {
            let r = Rope {
                style,
                n_dims: 8,
                freq_base: 10000.0,
                freq_scale: 1.0,
                freq_factors: None,
            };
            let mut cache = vec![0.0; 8];
            r.cache(0, &mut cache);
            let orig: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
            let mut x = orig.clone();
            r.apply(&mut x, &cache);
            assert_eq!(x, orig, "position 0 is the identity");
            r.cache(17, &mut cache);
            r.apply(&mut x, &cache);
            let n0: f32 = orig.iter().map(|v| v * v).sum();
            let n1: f32 = x.iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-3);
            assert_ne!(x, orig);
        }
    }

    #[test]
    fn gelu_table_tracks_formula() {
        let g = Gelu::new();
        for i in -200..200 {
            let x = i as f32 * 0.07;
            assert!((g.apply(x) - gelu_exact_tanh(x)).abs() < 1e-2 * (1.0 + x.abs()));
        }
        assert_eq!(g.apply(-20.0), 0.0);
        assert_eq!(g.apply(20.0), 20.0);
    }
}
