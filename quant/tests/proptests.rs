//! Robustness of the checked entry points: arbitrary bytes (the mmap is untrusted) must
//! dequantize and dot without panicking, arbitrary floats (NaN/inf included) must
//! quantize without panicking, and wrong lengths must be errors rather than panics.

use proptest::prelude::*;
use quant::{dequantize_row, quantize_row, vec_dot, vec_dot_type, GgmlType, QuantError};

const TYPES: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
];

fn any_type() -> impl Strategy<Value = GgmlType> {
    proptest::sample::select(TYPES.to_vec())
}

/// A type and raw bytes for 1..=3 blocks of it (at least 32 elements for float types).
fn raw_row() -> impl Strategy<Value = (GgmlType, usize, Vec<u8>)> {
    (any_type(), 1usize..=3).prop_flat_map(|(ty, blocks)| {
        let n = blocks * ty.block_size().max(32);
        let bytes = ty.row_bytes(n as u64).unwrap() as usize;
        (
            Just(ty),
            Just(n),
            proptest::collection::vec(any::<u8>(), bytes),
        )
    })
}

fn any_f32() -> impl Strategy<Value = f32> {
    prop_oneof![
        4 => -10.0f32..10.0,
        1 => any::<f32>(),
        1 => proptest::sample::select(vec![0.0f32, -0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MIN_POSITIVE, 1e-40, 65504.0, 1e30]),
    ]
}

proptest! {
    #[test]
    fn dequantize_accepts_any_bytes((ty, n, raw) in raw_row()) {
        let mut out = vec![0.0f32; n];
        prop_assert!(dequantize_row(ty, &raw, &mut out).is_ok());
    }

    #[test]
    fn dequantize_rejects_wrong_lengths((ty, n, raw) in raw_row(), cut in 1usize..40, extra in 0usize..2) {
        let mut out = vec![0.0f32; n];
        let short = &raw[..raw.len().saturating_sub(cut)];
        let is_size_error = matches!(dequantize_row(ty, short, &mut out), Err(QuantError::SizeMismatch { .. }));
        prop_assert!(is_size_error);
        let mut longer = raw.clone();
        longer.extend(std::iter::repeat_n(0u8, cut));
        let is_size_error = matches!(dequantize_row(ty, &longer, &mut out), Err(QuantError::SizeMismatch { .. }));
        prop_assert!(is_size_error);
        if ty.block_size() > 1 {
            let mut odd = vec![0.0f32; n - 1 - extra];
            let is_block_error = matches!(dequantize_row(ty, &raw, &mut odd), Err(QuantError::NotBlockMultiple { .. }));
            prop_assert!(is_block_error);
        }
    }

    #[test]
    fn quantize_accepts_any_floats(ty in any_type(), xs in proptest::collection::vec(any_f32(), 256)) {
        let mut q = vec![0u8; ty.row_bytes(256).unwrap() as usize];
        prop_assert!(quantize_row(ty, &xs, &mut q).is_ok());
        let mut back = vec![0.0f32; 256];
        prop_assert!(dequantize_row(ty, &q, &mut back).is_ok());
        let is_size_error = matches!(quantize_row(ty, &xs, &mut q[1..]), Err(QuantError::SizeMismatch { .. }));
        prop_assert!(is_size_error);
    }

    #[test]
    fn vec_dot_accepts_any_bytes((ty, n, w) in raw_row(), seed in any::<u64>()) {
        prop_assume!(quant::has_vec_dot(ty));
        let aty = vec_dot_type(ty);
        let len = aty.row_bytes(n as u64).unwrap() as usize;
        let a: Vec<u8> = (0..len).map(|i| (seed.rotate_left(i as u32 % 64) ^ i as u64) as u8).collect();
        prop_assert!(vec_dot(ty, n, &w, &a).is_ok());
        let is_size_error = matches!(vec_dot(ty, n, &w, &a[1..]), Err(QuantError::SizeMismatch { .. }));
        prop_assert!(is_size_error);
    }

    /// For well-behaved input the symmetric round-to-nearest formats are within half a
    /// step (`d/2`) of the input, whatever the data.
    #[test]
    fn q8_round_trip_error_is_half_a_step(xs in proptest::collection::vec(-100.0f32..100.0, 256)) {
        for ty in [GgmlType::Q8_0, GgmlType::Q8_K] {
            let mut q = vec![0u8; ty.row_bytes(256).unwrap() as usize];
            quantize_row(ty, &xs, &mut q).unwrap();
            let mut back = vec![0.0f32; 256];
            dequantize_row(ty, &q, &mut back).unwrap();
            for (blk, (x, y)) in xs.chunks(ty.block_size()).zip(back.chunks(ty.block_size())).enumerate() {
                let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                // f16 scale rounding (Q8_0) adds up to 2^-11 relative on top of half a step.
                let tol = amax / 127.0 * (0.5 + 127.0 / 2048.0) + 1e-6;
                for (a, b) in x.iter().zip(y) {
                    prop_assert!((a - b).abs() <= tol, "{ty} block {blk}: {a} -> {b} (tol {tol})");
                }
            }
        }
    }
}
