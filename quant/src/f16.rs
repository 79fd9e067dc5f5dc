//! Scalar f16 / bf16 conversions with ggml's exact rounding.
//!
//! Widening is exact. Narrowing rounds to nearest-even; NaNs follow ggml's portable C
//! helpers (`ggml_compute_fp32_to_fp16` / `_bf16`) so that quantizers writing NaN scales
//! produce the same bits as ggml-base.

use half::f16;

/// f16 bits to f32 (exact).
#[inline(always)]
pub fn f16_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// f32 to f16 bits, round-to-nearest-even; NaN becomes the canonical quiet NaN `0x7e00`
/// with the input's sign, as ggml does.
#[inline(always)]
pub fn f32_to_f16(x: f32) -> u16 {
    if x.is_nan() {
        ((x.to_bits() >> 16) as u16 & 0x8000) | 0x7e00
    } else {
        f16::from_f32(x).to_bits()
    }
}

/// bf16 bits to f32 (exact: bf16 is the top half of an f32).
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// f32 to bf16 bits, round-to-nearest-even; NaN keeps its top bits and is forced quiet.
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    // Cannot overflow: the largest non-NaN pattern (-inf, 0xff80_0000) plus 0x8000 fits.
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trips_every_non_nan_value() {
        for bits in 0..=u16::MAX {
            let x = f16_to_f32(bits);
            if x.is_nan() {
                assert_eq!(f32_to_f16(x) & 0x7fff, 0x7e00);
            } else {
                assert_eq!(f32_to_f16(x), bits, "bits {bits:#06x}");
            }
        }
    }

    #[test]
    fn f16_rounds_half_to_even() {
        // 1 + 2^-11 lies exactly between 1.0 and the next f16; ties go to the even mantissa.
        assert_eq!(f32_to_f16(1.0 + f32::powi(2.0, -11)), 0x3c00);
        assert_eq!(f32_to_f16(1.0 + 3.0 * f32::powi(2.0, -11)), 0x3c02);
        assert_eq!(f32_to_f16(65520.0), 0x7c00); // rounds up to +inf
        assert_eq!(f32_to_f16(-0.0), 0x8000);
    }

    #[test]
    fn bf16_matches_ggml_rounding() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80); // tie, even stays
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82); // tie, odd rounds up
        assert_eq!(f32_to_bf16(f32::from_bits(0x7f80_0001)), 0x7fc0); // signalling NaN -> quiet
        assert_eq!(f32_to_bf16(f32::NEG_INFINITY), 0xff80);
        for bits in 0..=u16::MAX {
            let x = bf16_to_f32(bits);
            if !x.is_nan() {
                assert_eq!(f32_to_bf16(x), bits);
            }
        }
    }
}
