//! Port of llama.cpp's `tests/test-quantize-fns.cpp`: quantize → dequantize error and
//! quantized dot-product error on the same synthetic cosine signal and budgets.

use quant::{dequantize_row, quantize_row, vec_dot, vec_dot_type, GgmlType};

const TEST_SIZE: usize = 32 * 128;

const MAX_QUANTIZATION_TOTAL_ERROR: f32 = 0.002;
const MAX_QUANTIZATION_TOTAL_ERROR_2BITS: f32 = 0.0075;
const MAX_QUANTIZATION_TOTAL_ERROR_3BITS: f32 = 0.0040;
const MAX_DOT_PRODUCT_ERROR: f32 = 0.02;
const MAX_DOT_PRODUCT_ERROR_LOWBIT: f32 = 0.04;
const MAX_QUANTIZATION_REFERENCE_ERROR: f32 = 0.0001;

/// `generate_data`: `0.1 + amplitude*cosf(i + offset)`, evaluated as the C does (float
/// cosine, double add, float store).
fn generate_data(offset: f32, n: usize, amplitude: f32) -> Vec<f32> {
    (0..n)
        .map(|i| (0.1f64 + (amplitude * (i as f32 + offset).cos()) as f64) as f32)
        .collect()
}

/// `array_rmse`: note ggml divides the root of the sum by n (not the root of the mean).
fn array_rmse(a: &[f32], b: &[f32]) -> f32 {
    let sum: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
        .sum();
    (sum.sqrt() as f32) / a.len() as f32
}

fn dot_product(a: &[f32], b: &[f32]) -> f32 {
    let mut sum = 0.0f64;
    for (&x, &y) in a.iter().zip(b) {
        sum += (x * y) as f64;
    }
    sum as f32
}

fn quantize(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; ty.row_bytes(x.len() as u64).unwrap() as usize];
    quantize_row(ty, x, &mut q).unwrap();
    q
}

fn total_quantization_error(ty: GgmlType, x: &[f32]) -> f32 {
    let q = quantize(ty, x);
    let mut out = vec![0.0f32; x.len()];
    dequantize_row(ty, &q, &mut out).unwrap();
    array_rmse(x, &out)
}

fn dot_product_error(ty: GgmlType, x: &[f32], y: &[f32]) -> f32 {
    let qx = quantize(ty, x);
    let qy = quantize(vec_dot_type(ty), y);
    let result = vec_dot(ty, x.len(), &qx, &qy).unwrap();
    (result - dot_product(x, y)).abs() / x.len() as f32
}

const WEIGHT_TYPES: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

#[test]
fn quantization_error_within_ggml_budgets() {
    let data = generate_data(0.0, TEST_SIZE, 2.0);
    let mut report = String::new();
    let mut failed = false;
    for ty in WEIGHT_TYPES
        .into_iter()
        .chain([GgmlType::Q8_1, GgmlType::Q8_K])
    {
        let err = total_quantization_error(ty, &data);
        let budget = match ty {
            GgmlType::Q2_K => MAX_QUANTIZATION_TOTAL_ERROR_2BITS,
            GgmlType::Q3_K => MAX_QUANTIZATION_TOTAL_ERROR_3BITS,
            _ => MAX_QUANTIZATION_TOTAL_ERROR,
        };
        let ok = err < budget;
        failed |= !ok;
        report += &format!(
            "{ty:>5}: quantization error {err:.6} (budget {budget}) {}\n",
            if ok { "ok" } else { "FAILED" }
        );
    }
    assert!(!failed, "{report}");
    eprintln!("{report}");
}

#[test]
fn dot_product_error_within_ggml_budgets() {
    let x = generate_data(0.0, TEST_SIZE, 2.0);
    let y = generate_data(1.0, TEST_SIZE, 2.0);
    let mut report = String::new();
    let mut failed = false;
    for ty in WEIGHT_TYPES {
        let err = dot_product_error(ty, &x, &y);
        let budget = if ty == GgmlType::Q2_K {
            MAX_DOT_PRODUCT_ERROR_LOWBIT
        } else {
            MAX_DOT_PRODUCT_ERROR
        };
        let ok = err < budget;
        failed |= !ok;
        report += &format!(
            "{ty:>5}: dot product error {err:.6} (budget {budget}) {}\n",
            if ok { "ok" } else { "FAILED" }
        );
    }
    assert!(!failed, "{report}");
    eprintln!("{report}");
}

/// `test_vec_dot_f32`: plain f32 dots of awkward lengths against a double reference.
#[test]
fn f32_vec_dot_matches_reference() {
    for n in [
        1usize, 2, 3, 5, 7, 8, 15, 16, 17, 31, 33, 63, 67, 127, 129, 193, 255, 1023,
    ] {
        let a = generate_data(0.0, n, 2.0);
        let b = generate_data(1.0, n, 2.0);
        let ab: Vec<u8> = a.iter().flat_map(|v| v.to_le_bytes()).collect();
        let bb: Vec<u8> = b.iter().flat_map(|v| v.to_le_bytes()).collect();
        let got = vec_dot(GgmlType::F32, n, &ab, &bb).unwrap();
        let err = (got - dot_product(&a, &b)).abs() / n as f32;
        assert!(err < MAX_QUANTIZATION_REFERENCE_ERROR, "n={n}: err {err}");
    }
}

/// The quantized dot must equal the f64 dot of the dequantized rows up to f32 rounding:
/// catches a dot kernel that disagrees with its own format's dequantizer. Q8_1 carries
/// the block sum `s` as f16, which Q4_1/Q5_1 use for their minimum, so those get the
/// looser tolerance that rounding implies (relative 2^-11 on the min term).
#[test]
fn quantized_dot_agrees_with_dequantized_rows() {
    let x = generate_data(0.5, TEST_SIZE, 1.7);
    let y = generate_data(2.0, TEST_SIZE, 1.3);
    for ty in WEIGHT_TYPES {
        let aty = vec_dot_type(ty);
        let (qx, qy) = (quantize(ty, &x), quantize(aty, &y));
        let (mut dx, mut dy) = (vec![0.0; TEST_SIZE], vec![0.0; TEST_SIZE]);
        dequantize_row(ty, &qx, &mut dx).unwrap();
        dequantize_row(aty, &qy, &mut dy).unwrap();
        let want: f64 = dx.iter().zip(&dy).map(|(&a, &b)| a as f64 * b as f64).sum();
        let got = vec_dot(ty, TEST_SIZE, &qx, &qy).unwrap() as f64;
        let scale: f64 = dx
            .iter()
            .zip(&dy)
            .map(|(&a, &b)| (a as f64 * b as f64).abs())
            .sum();
        let tol = if aty == GgmlType::Q8_1 { 1e-3 } else { 1e-5 };
        assert!(
            (got - want).abs() <= tol * scale,
            "{ty}: got {got}, dequantized dot {want}"
        );
    }
}
