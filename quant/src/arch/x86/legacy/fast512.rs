//! The fast order on packed rows with AVX-512: sixteen rows in the lanes of a register.

use super::*;

// ---------------------------------------------------------------------------------------
// AVX-512 (F, BW, VNNI): two packed groups, sixteen rows, in the lanes of one register.
//
// The same products as `fast_vnni` on packed rows, lane r of a 512-bit register holding
// row r of the sixteen: each broadcast activation group and each float step then serves
// sixteen rows instead of eight, and a staged weight register is one load for four tokens'
// `vpdpbusd`. Every lane does exactly the ymm kernel's operations for its row (exact
// integer sums, then the same multiply and FMAs), so the bits are the same.

/// Rows of one AVX-512 packed call: two groups.
pub(in crate::arch::x86) const PACKED512_ROWS: usize = 16;

/// Block `pa` of one packed group and block `pb` of another (`pa` again for a call of one
/// group): the sixteen rows' quants as unsigned bytes (register k = elements 4k..4k+4 of
/// every row; Q8_0's signed bytes flipped to `q + 128`), their scales and (unsigned
/// formats) mins.
///
/// # Safety
/// AVX-512 F/BW available; `pa` and `pb` point to whole blocks of packed groups.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn stage512<T: Legacy>(
    pa: *const u8,
    pb: *const u8,
    prefetch: bool,
) -> ([__m512i; 8], __m512, __m512) {
    if prefetch {
        prefetch_packed::<T>(pa);
        if pb != pa {
            prefetch_packed::<T>(pb);
        }
    }
    let ta = packed_regs::<T>(pa.add(packed_head::<T>()));
    let tb = packed_regs::<T>(pb.add(packed_head::<T>()));
    let flip = _mm512_set1_epi8(0x80u8 as i8);
    let t: [__m512i; 8] = arr(|k| {
        let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(ta[k]), tb[k]);
        // Q8_0 is stored signed; VNNI wants the weights unsigned (`q + 128`).
        if T::EIGHT_BIT {
            _mm512_xor_si512(v, flip)
        } else {
            v
        }
    });
    let h16 = |off: usize| {
        _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(ld128(pa.add(off))),
            ld128(pb.add(off)),
        ))
    };
    let dx = if T::E8M0 {
        // The ymm conversion for each group, joined.
        let (lo, hi) = (
            widen8::<T>(packed_scales::<T>(pa)),
            widen8::<T>(packed_scales::<T>(pb)),
        );
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(
            _mm512_castps_pd(_mm512_castps256_ps512(lo)),
            _mm256_castps_pd(hi),
        ))
    } else {
        h16(0)
    };
    let mx = if T::SIGNED {
        _mm512_setzero_ps()
    } else {
        h16(16)
    };
    (t, dx, mx)
}

/// # Safety
/// AVX-512 F/BW/VL/VNNI available; `f` was validated by `fast_call_rows` with `rows` 16 of
/// rows packed by `crate::pack8` (two consecutive groups) and `out_row` 1.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn fast_vnni512_packed<T: Legacy>(f: FastCall) {
    let FastCall {
        w,
        wstride,
        rows,
        a,
        stride,
        n,
        sums,
        use_sums,
        nb,
        out,
        out_row,
        out_col,
        ..
    } = f;
    debug_assert!(rows == PACKED512_ROWS && out_row == 1);
    let group = 8 * wstride;
    // Block i of both groups: the sixteen rows' quants as unsigned bytes (register k =
    // elements 4k..4k+4 of every row), their scales and mins.
    let block = |i: usize| -> ([__m512i; 8], __m512, __m512) {
        // SAFETY (this closure): block i < nb of both groups is inside `w`.
        let pa = w.add(i * 8 * T::WB);
        stage512::<T>(pa, pa.add(group), n <= 2)
    };
    // Where token c's block i starts, and its integer sum's starting value.
    let act = |c: usize, i: usize| -> (*const u8, i32) {
        // SAFETY (this closure): token c < n, block i < nb of the checked call.
        let ab = a.add(c * stride + i * T::AB);
        let init = if !T::SIGNED {
            0
        } else if use_sums {
            *sums.add(c * nb + i)
        } else {
            neg_offset_sum(ab.add(T::A_QS), T::OFFSET)
        };
        (ab, init)
    };
    let bcast = |p: *const u8| _mm512_set1_epi32(p.cast::<i32>().read_unaligned());
    let fold = |c: usize, i: usize, ab: *const u8, isum: __m512i, dx, mx, acc: __m512| {
        // SAFETY (this closure): as `act`.
        let (dy, sy) = act_scales::<T>(&f, c, i, ab);
        let d = _mm512_mul_ps(dx, _mm512_set1_ps(dy));
        let mut acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(isum), acc);
        if !T::SIGNED {
            acc = _mm512_fmadd_ps(mx, _mm512_set1_ps(sy), acc);
        }
        acc
    };
    // Token c's product with one block, into `acc`.
    let product = |c: usize, i: usize, t: &[__m512i; 8], dx, mx, acc| {
        let (ab, init) = act(c, i);
        let yq = ab.add(T::A_QS);
        let mut s0 = _mm512_set1_epi32(init);
        let mut s1 = _mm512_setzero_si512();
        for k in (0..8).step_by(2) {
            s0 = _mm512_dpbusd_epi32(s0, t[k], bcast(yq.add(4 * k)));
            s1 = _mm512_dpbusd_epi32(s1, t[k + 1], bcast(yq.add(4 * k + 4)));
        }
        fold(c, i, ab, _mm512_add_epi32(s0, s1), dx, mx, acc)
    };
    let mut acc_m = core::mem::MaybeUninit::<[__m512; crate::contract::FAST_TILE_TOKENS]>::uninit();
    let acc = init_prefix(&mut acc_m, n, _mm512_setzero_ps());
    if n <= 2 {
        // Decode: the two groups stream, nothing to stage.
        for i in 0..nb {
            let (t, dx, mx) = block(i);
            for (c, acc) in acc.iter_mut().enumerate().take(n) {
                *acc = product(c, i, &t, dx, mx, *acc);
            }
        }
    } else {
        // Staged quants, scales and mins of one chunk of blocks. Uninitialized: entries
        // 0..nc are written (through raw pointers) before any is read.
        let mut tq_m = core::mem::MaybeUninit::<[[__m512i; 8]; FAST_CHUNK]>::uninit();
        let mut dxs_m = core::mem::MaybeUninit::<[__m512; FAST_CHUNK]>::uninit();
        let mut ms_m = core::mem::MaybeUninit::<[__m512; FAST_CHUNK]>::uninit();
        let tq = tq_m.as_mut_ptr().cast::<[__m512i; 8]>();
        let dxs = dxs_m.as_mut_ptr().cast::<__m512>();
        let ms = ms_m.as_mut_ptr().cast::<__m512>();
        let mut i0 = 0;
        while i0 < nb {
            let nc = (nb - i0).min(FAST_CHUNK);
            for j in 0..nc {
                let (t, dx, mx) = block(i0 + j);
                tq.add(j).write(t);
                dxs.add(j).write(dx);
                ms.add(j).write(mx);
            }
            // Four tokens per pass: each staged register is loaded once for four.
            let mut c0 = 0;
            while c0 + 4 <= n {
                let mut acc4: [__m512; 4] = arr(|q| acc[c0 + q]);
                for j in 0..nc {
                    let i = i0 + j;
                    // SAFETY: entry j < nc was written above.
                    let t = &*tq.add(j);
                    let ai: [(*const u8, i32); 4] = arr(|q| act(c0 + q, i));
                    let mut s0 = ai.map(|(_, init)| _mm512_set1_epi32(init));
                    let mut s1 = [_mm512_setzero_si512(); 4];
                    for k in (0..8).step_by(2) {
                        for q in 0..4 {
                            let yq = ai[q].0.add(T::A_QS);
                            s0[q] = _mm512_dpbusd_epi32(s0[q], t[k], bcast(yq.add(4 * k)));
                            s1[q] = _mm512_dpbusd_epi32(s1[q], t[k + 1], bcast(yq.add(4 * k + 4)));
                        }
                    }
                    for q in 0..4 {
                        let isum = _mm512_add_epi32(s0[q], s1[q]);
                        acc4[q] = fold(c0 + q, i, ai[q].0, isum, *dxs.add(j), *ms.add(j), acc4[q]);
                    }
                }
                acc[c0..c0 + 4].copy_from_slice(&acc4);
                c0 += 4;
            }
            for (c, acc) in acc.iter_mut().enumerate().take(n).skip(c0) {
                let mut acc_c = *acc;
                for j in 0..nc {
                    // SAFETY: entry j < nc was written above.
                    acc_c = product(c, i0 + j, &*tq.add(j), *dxs.add(j), *ms.add(j), acc_c);
                }
                *acc = acc_c;
            }
            i0 += nc;
        }
    }
    for (c, acc) in acc.iter().enumerate().take(n) {
        _mm512_storeu_ps(out.add(c * out_col), *acc);
    }
}

macro_rules! fast_packed512 {
    ($name:ident, $ty:ident, $w:ty, $a:ty, $ymm:ident, $sums:literal) => {
        /// The packed tile for AVX-512: sixteen rows (two groups) per call, or one group
        /// through the VNNI ymm kernel (same bits).
        ///
        /// # Safety
        /// See [`crate::contract::TileIntoFn`].
        #[allow(clippy::too_many_arguments)]
        pub(in crate::arch::x86) unsafe fn $name(
            w: &[u8],
            rows: usize,
            a: &[u8],
            stride: usize,
            side: ActSide<'_>,
            n: usize,
            out: *mut f32,
            out_stride: usize,
        ) {
            // Decode (one or two tokens) streams the groups one at a time through the
            // ymm kernel: measured faster than the sixteen-row pass (smollm2 tg128 on a
            // Zen 4: 218 vs 175 t/s), which only pays off once a staged register serves
            // several tokens.
            if rows == 8 || (n <= 2 && rows == PACKED512_ROWS) {
                let half = w.len() / rows * 8;
                for g in 0..rows / 8 {
                    $ymm(
                        &w[g * half..(g + 1) * half],
                        8,
                        a,
                        stride,
                        side,
                        n,
                        out.add(8 * g),
                        out_stride,
                    );
                }
                return;
            }
            assert_eq!(
                rows, PACKED512_ROWS,
                "packed tile: {rows} rows, not two groups of eight"
            );
            fast_call_rows::<$w, $a>(
                PACKED512_ROWS,
                (w, rows, a, stride),
                side,
                n,
                (out, 1, out_stride),
                usize::from($sums),
                fast_vnni512_packed::<$ty>,
                None,
            )
        }
    };
}

fast_packed512!(
    q4_0_fast_packed512_into,
    Q4_0,
    BlockQ4_0,
    BlockQ8_0,
    q4_0_fast_packed_vnni_into,
    true
);
fast_packed512!(
    q4_1_fast_packed512_into,
    Q4_1,
    BlockQ4_1,
    BlockQ8_1,
    q4_1_fast_packed_vnni_into,
    false
);
fast_packed512!(
    q5_0_fast_packed512_into,
    Q5_0,
    BlockQ5_0,
    BlockQ8_0,
    q5_0_fast_packed_vnni_into,
    true
);
fast_packed512!(
    q5_1_fast_packed512_into,
    Q5_1,
    BlockQ5_1,
    BlockQ8_1,
    q5_1_fast_packed_vnni_into,
    false
);
fast_packed512!(
    mxfp4_rep_packed512_into,
    Mxfp4,
    BlockMxfp4,
    BlockQ8_0,
    mxfp4_rep_packed_vnni_into,
    true
);
fast_packed512!(
    iq4_nl_rep_packed512_into,
    Iq4NlRep,
    BlockIq4Nl,
    BlockQ8_0,
    iq4_nl_rep_packed_vnni_into,
    true
);
fast_packed512!(
    q8_0_fast_packed512_into,
    Q8_0,
    BlockQ8_0,
    BlockQ8_0,
    q8_0_fast_packed_vnni_into,
    true
);
