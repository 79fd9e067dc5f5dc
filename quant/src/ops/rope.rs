//! Rotary position embedding with ggml's rounding: the theta recurrence in f32 and the
//! rotation as GCC compiles ggml's C with FMA contraction.

use super::fma_twin;

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
    /// Per-pair divisors (llama 3 `rope_freqs`, Phi-3's LongRoPE factors), if the model
    /// has them.
    pub freq_factors: Option<Vec<f32>>,
    /// YaRN's share of extrapolation (0: plain interpolation by `freq_scale`).
    pub ext_factor: f32,
    /// Multiplies cos and sin (llama.cpp's `attn_factor`; 1 for most models).
    pub attn_factor: f32,
    /// YaRN's correction range in dimension pairs (ggml's `corr_dims`), used when
    /// `ext_factor` is not 0.
    pub corr_dims: [f32; 2],
}

/// ggml's `ggml_rope_yarn_corr_dim`: the dimension whose wavelength fits `n_rot` turns in
/// the original context.
fn yarn_corr_dim(n_dims: usize, n_ctx_orig: usize, n_rot: f32, base: f32) -> f32 {
    n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
        / (2.0 * base.ln())
}

impl Rope {
    /// Plain rotary embedding (no YaRN, no attention factor).
    pub fn new(style: RopeStyle, n_dims: usize, freq_base: f32, freq_scale: f32) -> Rope {
        Rope {
            style,
            n_dims,
            freq_base,
            freq_scale,
            freq_factors: None,
            ext_factor: 0.0,
            attn_factor: 1.0,
            corr_dims: [0.0, 0.0],
        }
    }

    /// ggml's `ggml_rope_yarn_corr_dims` for this rope's dimensions and base.
    pub fn yarn_corr_dims(&self, n_ctx_orig: usize, beta_fast: f32, beta_slow: f32) -> [f32; 2] {
        let start = yarn_corr_dim(self.n_dims, n_ctx_orig, beta_fast, self.freq_base).floor();
        let end = yarn_corr_dim(self.n_dims, n_ctx_orig, beta_slow, self.freq_base).ceil();
        [start.max(0.0), end.min(self.n_dims as f32 - 1.0)]
    }

    /// Fills `cache` (length n_dims) with interleaved cos/sin for position `pos`, with the
    /// same f32 recurrence for theta as ggml (theta *= theta_scale per pair) and its YaRN
    /// mix (`rope_yarn`): interpolated and extrapolated angles ramped over `corr_dims`,
    /// cos and sin scaled by `attn_factor` (times YaRN's magnitude correction).
    pub fn cache(&self, pos: usize, cache: &mut [f32]) {
        let theta_scale = self.freq_base.powf(-2.0 / self.n_dims as f32);
        let mut theta = pos as f32;
        // As GCC compiles ggml's C with FMA contraction: `1 + 0.1 * log(..)` and the ramp
        // mix below are fused multiply-adds (the first product of `a*b + c*d` fused, the
        // second rounded).
        let mut mscale = self.attn_factor;
        if self.ext_factor != 0.0 {
            mscale *= 0.1f32.mul_add((1.0 / self.freq_scale).ln(), 1.0);
        }
        for i in (0..self.n_dims).step_by(2) {
            let ff = self.freq_factors.as_ref().map_or(1.0, |f| f[i / 2]);
            let extrap = theta / ff;
            let interp = self.freq_scale * extrap;
            let t = if self.ext_factor != 0.0 {
                let [low, high] = self.corr_dims;
                let y = ((i / 2) as f32 - low) / (high - low).max(0.001);
                let ramp = (1.0 - y.clamp(0.0, 1.0)) * self.ext_factor;
                interp.mul_add(1.0 - ramp, extrap * ramp)
            } else {
                interp
            };
            cache[i] = t.cos() * mscale;
            cache[i + 1] = t.sin() * mscale;
            theta *= theta_scale;
        }
    }

    /// Rotates one head vector `x` in place using a cache from [`Rope::cache`].
    pub fn apply(&self, x: &mut [f32], cache: &[f32]) {
        rope_rotate(x, cache, self.n_dims, self.style == RopeStyle::Neox);
    }
}

fma_twin! {
    /// Rotates one head vector by RoPE with the cos/sin `cache` (interleaved, `n_dims`
    /// long): pairs `(x[i], x[i+1])` (`neox = false`) or `(x[i], x[i + n_dims/2])`,
    /// computed as GCC compiles ggml's `x0*cos - x1*sin` / `x0*sin + x1*cos` with FMA
    /// contraction (the first product fused, the second rounded).
    pub fn rope_rotate(x: &mut [f32], cache: &[f32], n_dims: usize, neox: bool) = rope_rotate_scalar
}

/// Scalar twin of [`rope_rotate`].
#[inline(always)]
pub fn rope_rotate_scalar(x: &mut [f32], cache: &[f32], n_dims: usize, neox: bool) {
    let (stride, off) = if neox { (1, n_dims / 2) } else { (2, 1) };
    for p in 0..n_dims / 2 {
        let (cos, sin) = (cache[2 * p], cache[2 * p + 1]);
        let i = p * stride;
        let (x0, x1) = (x[i], x[i + off]);
        x[i] = x0.mul_add(cos, -(x1 * sin));
        x[i + off] = x0.mul_add(sin, x1 * cos);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_rotates_and_preserves_norm() {
        for style in [RopeStyle::Normal, RopeStyle::Neox] {
            let r = Rope::new(style, 8, 10000.0, 1.0);
            let mut cache = vec![0.0; 8];
            r.cache(0, &mut cache);
            let orig: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
            let mut x = orig.clone();
            r.apply(&mut x, &cache);
            assert_eq!(x, orig, "position 0 is the identity");
            r.cache(17, &mut cache);
            r.apply(&mut x, &cache);
            let mut y = orig.clone();
            rope_rotate_scalar(&mut y, &cache, 8, style == RopeStyle::Neox);
            let n0: f32 = orig.iter().map(|v| v * v).sum();
            let n1: f32 = x.iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-3);
            assert_ne!(x, orig);
            let mut z = orig.clone();
            r.apply(&mut z, &cache);
            assert!(z.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }
}
