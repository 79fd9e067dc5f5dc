//! Summary statistics as llama-bench and vLLM's serving benchmark define them.

/// Arithmetic mean; 0 for an empty sample.
pub fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

/// Sample standard deviation (n - 1 denominator), as llama-bench reports; 0 below two samples.
pub fn stddev(xs: &[f64]) -> f64 {
    if xs.len() < 2 {
        return 0.0;
    }
    let m = mean(xs);
    (xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (xs.len() - 1) as f64).sqrt()
}

/// Percentile with linear interpolation between closest ranks (numpy's default, which
/// vLLM's benchmark uses); `p` in 0..=100.
pub fn percentile(xs: &[f64], p: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = (p / 100.0).clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    v[lo] + (v[hi] - v[lo]) * (rank - lo as f64)
}

/// Least-squares line through `(x, y)` points: `(slope, intercept)`; `None` below two
/// points or when every x is the same.
pub fn linear_fit(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    if points.len() < 2 {
        return None;
    }
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let slope = sxy / sxx;
    Some((slope, my - slope * mx))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_hand_computed_values() {
        let xs = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0];
        assert_eq!(mean(&xs), 5.0);
        assert!((stddev(&xs) - 2.138_089_935_299_395).abs() < 1e-12);
        assert_eq!(percentile(&xs, 50.0), 4.5);
        assert_eq!(percentile(&xs, 100.0), 9.0);
        assert!((percentile(&[1.0, 2.0, 3.0, 4.0], 99.0) - 3.97).abs() < 1e-12);
        assert_eq!(stddev(&[1.0]), 0.0);
    }

    #[test]
    fn linear_fit_recovers_a_line() {
        let pts: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 3.0 - 0.5 * i as f64)).collect();
        let (m, b) = linear_fit(&pts).unwrap();
        assert!(
            (m + 0.5).abs() < 1e-12 && (b - 3.0).abs() < 1e-12,
            "{m} {b}"
        );
        // Noise around a flat line: slope near 0, least squares by hand.
        let (m, b) = linear_fit(&[(0.0, 1.0), (1.0, 3.0), (2.0, 2.0)]).unwrap();
        assert!(
            (m - 0.5).abs() < 1e-12 && (b - 1.5).abs() < 1e-12,
            "{m} {b}"
        );
        assert_eq!(linear_fit(&[(1.0, 1.0)]), None);
        assert_eq!(linear_fit(&[(1.0, 1.0), (1.0, 2.0)]), None);
    }
}
