//! The activation quantizers of the 32-element formats (Q8_0, Q8_1) with AVX2, one block
//! per four registers as ggml's x86 `quantize_row_q8_0` / `quantize_row_q8_1` do: the
//! largest magnitude, `id = 127 / amax`, round half to even, and for Q8_1 the block's
//! integer sum. Bit-identical to the scalar twins (`BlockQ8_0::quantize_simd_rounding`,
//! `BlockQ8_1::quantize_simd_rounding`) for every finite input: a maximum of finite values
//! is the same in any order, and the products and roundings are the twin's. (A NaN
//! activation gives a meaningless block either way.)

use core::arch::x86_64::*;

use crate::f16::f32_to_f16;

const QK: usize = 32;

/// Quantizes `src` (whole 32-element blocks) into Q8_0 blocks (`with_sum` false, 34 bytes
/// each) or Q8_1 blocks (`with_sum` true, 36 bytes each) in `dst`.
///
/// # Safety
/// AVX2 must be available.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn quantize_q8(src: &[f32], dst: &mut [u8], with_sum: bool) {
    let bytes = if with_sum { 36 } else { 34 };
    let nb = src.len() / QK;
    assert!(
        src.len().is_multiple_of(QK) && dst.len() == nb * bytes,
        "quantize_q8: sizes"
    );
    let sign = _mm256_set1_ps(-0.0);
    // packs_epi32 then packs_epi16 leave the eight 4-byte groups in the order 0 4 1 5 2 6 3 7.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (x, out) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(bytes)) {
        let p = x.as_ptr();
        let v = [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ];
        let m = _mm256_max_ps(
            _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
            _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])),
        );
        let m4 = _mm_max_ps(_mm256_extractf128_ps::<1>(m), _mm256_castps256_ps128(m));
        let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        let q = v.map(|v| {
            _mm256_cvtps_epi32(_mm256_round_ps::<
                { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
            >(_mm256_mul_ps(v, id)))
        });
        let lo = _mm256_packs_epi32(q[0], q[1]);
        let hi = _mm256_packs_epi32(q[2], q[3]);
        let bytes8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(lo, hi), order);
        out[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        let at = if with_sum {
            let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            let s4 = _mm_add_epi32(_mm256_extracti128_si256::<1>(s), _mm256_castsi256_si128(s));
            let s4 = _mm_add_epi32(s4, _mm_shuffle_epi32::<0b01_00_11_10>(s4));
            let s4 = _mm_add_epi32(s4, _mm_shuffle_epi32::<0b10_11_00_01>(s4));
            let sum = _mm_cvtsi128_si32(s4);
            out[2..4].copy_from_slice(&f32_to_f16(sum as f32 * d).to_le_bytes());
            4
        } else {
            2
        };
        _mm256_storeu_si256(out[at..].as_mut_ptr().cast(), bytes8);
    }
}
