//! `force_scalar` (what `RLLAMA_FORCE_SCALAR=1` asks the runtime for) switches every
//! dispatcher to the scalar code. The level is fixed at first use, so this binary holds a
//! single test that configures it first.

use half::f16;
use quant::{kernels, quantize_activations, quantize_row, vec_dot, vec_dot_type};
use quant::{DotOrder, GgmlType, Isa};

#[test]
fn force_scalar_selects_scalar_kernels() {
    let warning = quant::isa::configure(quant::isa::Overrides {
        force_scalar: true,
        ..Default::default()
    });
    assert_eq!(warning, None);
    assert_eq!(quant::isa::active(), Isa::Scalar);
    let n = 512;
    let x: Vec<f32> = (0..n)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
        .collect();
    let y: Vec<f32> = (0..n)
        .map(|i| ((i * 53 % 89) as f32 - 44.0) / 13.0)
        .collect();
    for ty in [
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        let mut w = vec![0u8; ty.row_bytes(n as u64).unwrap() as usize];
        quantize_row(ty, &x, &mut w).unwrap();
        let aty = vec_dot_type(ty);
        let mut a = vec![0u8; aty.row_bytes(n as u64).unwrap() as usize];
        quantize_activations(aty, &y, &mut a).unwrap();
        let scalar = kernels::scalar(ty, DotOrder::Single).unwrap();
        assert_eq!(
            vec_dot(ty, n, &w, &a).unwrap().to_bits(),
            (scalar.dot)(&w, &a).to_bits(),
            "{ty}"
        );
        for order in DotOrder::ALL {
            // The active set is the scalar one, in every order.
            let k = kernels::kernels(ty, order).unwrap();
            assert_eq!(k.isa, Isa::Scalar, "{ty} {order:?}");
            assert!(k.tile.is_none(), "{ty} {order:?}");
        }
        for isa in Isa::ALL {
            if let Some(simd) = kernels::kernels_at(ty, DotOrder::Single, isa) {
                // Still reachable explicitly, and still the same bits.
                assert_eq!(
                    (simd.dot)(&w, &a).to_bits(),
                    (scalar.dot)(&w, &a).to_bits(),
                    "{ty} {isa}"
                );
            }
        }
    }
    let b: Vec<f16> = y.iter().map(|&v| f16::from_f32(v)).collect();
    let x16: Vec<f32> = x.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
    use quant::ops::f16::{dot_f16, dot_f16_scalar};
    use quant::{F16Order, Flavor};
    let d = dot_f16(Flavor::Avx512, F16Order::Gemm, &x16, &b);
    assert_eq!(
        d.to_bits(),
        dot_f16_scalar(Flavor::Avx512, F16Order::Gemm, &x16, &b).to_bits()
    );
}
