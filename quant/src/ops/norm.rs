//! RMS norm with ggml's accumulation: the sum of squares in f64, the scale in f32.

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

/// [`rms_norm`] of each `w.len()`-long row of `src` into the same row of `dst`.
pub fn rms_norm_rows(dst: &mut [f32], src: &[f32], w: &[f32], eps: f32) {
    assert_eq!(dst.len(), src.len(), "rms_norm_rows: length mismatch");
    for (d, s) in dst.chunks_exact_mut(w.len()).zip(src.chunks_exact(w.len())) {
        d.copy_from_slice(s);
        rms_norm(d, w, eps);
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
        let mut rows = vec![0.0; 4];
        rms_norm_rows(&mut rows, &[3.0, 4.0, 3.0, 4.0], &[1.0, 1.0], 0.0);
        assert_eq!(&rows[..2], &x[..]);
        assert_eq!(&rows[2..], &x[..]);
    }
}
