//! ggml's order over the file's rows: one weight row against up to eight activation rows
//! (`DotOrder::Single`), AVX2 and AVX-512 VNNI.

use super::*;

macro_rules! legacy_many {
    ($name:ident, $feat:literal, $isum:ident, $isum_from:ident) => {
        /// # Safety
        /// The features named are available; `w` holds `R` weight rows of `nb` blocks,
        /// `wstride` bytes apart, and `a` holds `N` rows of `nb` activation blocks, `stride`
        /// bytes apart; `out` has `R * N` slots (`out[r * N + c]`). With `PRE`, `ad` holds
        /// each activation row's block scales as f32 (`nb` per row for Q8_0, `2 nb` for
        /// Q8_1's `(d, s)` pairs), rows `ad_stride` floats apart. With `SUMS` (signed
        /// formats, VNNI only), `sums` holds `-offset` times each activation block's eight
        /// lane sums, rows `nb * 8` apart, and the weights go in as unsigned quants.
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = $feat)]
        unsafe fn $name<
            T: Legacy,
            const R: usize,
            const N: usize,
            const PRE: bool,
            const SUMS: bool,
        >(
            w: *const u8,
            wstride: usize,
            a: *const u8,
            stride: usize,
            ad: *const f32,
            ad_stride: usize,
            sums: *const i32,
            nb: usize,
            out: *mut f32,
        ) {
            let mut acc = [[_mm256_setzero_ps(); N]; R];
            let mut summs = [[0.0f32; N]; R];
            // `PAIRED` only: the odd blocks' lanes, and an unpaired last block's scale
            // product and integer sum.
            let mut acc_odd = [[_mm256_setzero_ps(); N]; R];
            let mut tail = [[(0.0f32, 0i32); N]; R];
            let paired = if T::PAIRED { nb - nb % 2 } else { nb };
            let per = if T::SIGNED { 1 } else { 2 };
            for i in 0..nb {
                let mut x = [_mm256_setzero_si256(); R];
                let mut u = [_mm256_setzero_si256(); R];
                let mut dx = [_mm256_setzero_ps(); R];
                let mut mx = [0.0f32; R];
                for r in 0..R {
                    let wb = w.add(r * wstride + i * T::WB);
                    if N <= 2 {
                        // Decode streams weights from memory: ask for them well ahead.
                        _mm_prefetch::<_MM_HINT_T0>(wb.wrapping_add(PREFETCH).cast());
                    }
                    if SUMS {
                        u[r] = T::unpack_unsigned(wb);
                    } else {
                        x[r] = T::unpack(wb);
                        u[r] = if T::SIGNED {
                            _mm256_sign_epi8(x[r], x[r])
                        } else {
                            x[r]
                        };
                    }
                    if T::E8M0 {
                        dx[r] = _mm256_set1_ps(mxfp4::e8m0_to_f32_half(*wb));
                    } else {
                        let wd = _mm_cvtph_ps(_mm_cvtsi32_si128(
                            wb.cast::<u32>().read_unaligned().to_le() as i32,
                        ));
                        dx[r] = _mm256_broadcastss_ps(wd);
                        mx[r] = _mm_cvtss_f32(_mm_movehdup_ps(wd));
                    }
                }
                for c in 0..N {
                    let ab = a.add(c * stride + i * T::AB);
                    let y = ld256(ab.add(T::A_QS));
                    // dy broadcast once per activation block; `dx * dy` is then one
                    // lane-wise multiply per weight row (the same rounding as a scalar one).
                    let (dy, sy) = if PRE {
                        let q = ad.add(c * ad_stride + i * per);
                        (
                            _mm256_broadcast_ss(&*q),
                            if T::SIGNED { 0.0 } else { *q.add(1) },
                        )
                    } else {
                        let v = _mm_cvtph_ps(_mm_cvtsi32_si128(
                            ab.cast::<u32>().read_unaligned().to_le() as i32,
                        ));
                        (_mm256_broadcastss_ps(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
                    };
                    // Σ (q - off) y = Σ q y + (-off Σ y): the lane sums start the count.
                    let init = if SUMS {
                        ld256(sums.add((c * nb + i) * 8).cast())
                    } else {
                        _mm256_setzero_si256()
                    };
                    for r in 0..R {
                        let isum = if SUMS {
                            $isum_from(init, u[r], y)
                        } else {
                            let s = if T::SIGNED {
                                _mm256_sign_epi8(y, x[r])
                            } else {
                                y
                            };
                            $isum(u[r], s)
                        };
                        let d = _mm256_mul_ps(dx[r], dy);
                        if T::PAIRED && i >= paired {
                            tail[r][c] = (_mm256_cvtss_f32(d), hsum_i32(isum));
                        } else if T::PAIRED && i % 2 == 1 {
                            let p = _mm256_cvtepi32_ps(isum);
                            acc_odd[r][c] = _mm256_fmadd_ps(d, p, acc_odd[r][c]);
                        } else {
                            let p = _mm256_cvtepi32_ps(isum);
                            acc[r][c] = _mm256_fmadd_ps(d, p, acc[r][c]);
                        }
                        if !T::SIGNED {
                            summs[r][c] = mx[r].mul_add(sy, summs[r][c]);
                        }
                    }
                }
            }
            for r in 0..R {
                for c in 0..N {
                    let h = if T::PAIRED {
                        let h = hsum_ps(_mm256_add_ps(acc[r][c], acc_odd[r][c]));
                        let (d, sumi) = tail[r][c];
                        if paired < nb {
                            h + d * sumi as f32
                        } else {
                            h
                        }
                    } else {
                        hsum_ps(acc[r][c])
                    };
                    *out.add(r * N + c) = if T::SIGNED { h } else { h + summs[r][c] };
                }
            }
        }
    };
}

legacy_many!(legacy_avx2, "avx2,fma,f16c", isum_maddubs, isum_from_never);
legacy_many!(
    legacy_vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    isum_vnni,
    isum_from_vnni
);

/// Dispatches a call to the `R x N` instantiation. Without VNNI (16 vector registers) two
/// weight rows take at most four activation rows at a time.
macro_rules! many_entry {
    ($name:ident, $ty:ident, $w:ty, $a:ty, $imp:ident, $wide:literal) => {
        pub(in crate::arch::x86) fn $name(
            w: &[u8],
            rows: usize,
            a: &[u8],
            stride: usize,
            side: ActSide<'_>,
            out: &mut [f32],
        ) {
            let k = check_tile::<$w, $a>(w, rows, a, stride, side, out.len());
            let (wp, dp, op) = (w.as_ptr(), side.scales.as_ptr(), out.as_mut_ptr());
            let mut c0 = 0;
            while c0 < k.cols {
                let n = if k.rows == 2 && !$wide {
                    (k.cols - c0).min(4)
                } else {
                    k.cols - c0
                };
                let ap = a.as_ptr().wrapping_add(c0 * stride);
                let dp = dp.wrapping_add(c0 * k.ad_stride);
                let mut tmp = [0.0f32; 2 * TILE_MAX_TOKENS];
                let tp = tmp.as_mut_ptr();
                let sp = k.sums.wrapping_add(c0 * k.nb * 8);
                // `ad_stride` is 0 when no scales were passed, so every instantiation
                // takes the same arguments.
                macro_rules! go {
                    ($r:literal, $n:literal) => {{
                        macro_rules! call {
                            ($pre:literal, $sums:literal) => {
                                $imp::<$ty, $r, $n, $pre, $sums>(
                                    wp,
                                    k.wstride,
                                    ap,
                                    stride,
                                    dp,
                                    k.ad_stride,
                                    sp,
                                    k.nb,
                                    tp,
                                )
                            };
                        }
                        match (k.ad_stride != 0, k.use_sums && $wide) {
                            (true, true) => call!(true, true),
                            (true, false) => call!(true, false),
                            (false, true) => call!(false, true),
                            (false, false) => call!(false, false),
                        }
                    }};
                }
                // SAFETY: handed out by `the kernel table` only after the features were
                // detected; `check_many` validated every byte the kernel reads, and `tmp`
                // holds R * N results.
                unsafe {
                    match (k.rows, n) {
                        (1, 1) => go!(1, 1),
                        (1, 2) => go!(1, 2),
                        (1, 3) => go!(1, 3),
                        (1, 4) => go!(1, 4),
                        (1, 5) => go!(1, 5),
                        (1, 6) => go!(1, 6),
                        (1, 7) => go!(1, 7),
                        (1, _) => go!(1, 8),
                        (_, 1) => go!(2, 1),
                        (_, 2) => go!(2, 2),
                        (_, 3) => go!(2, 3),
                        (_, 4) => go!(2, 4),
                        (_, 5) => go!(2, 5),
                        (_, 6) => go!(2, 6),
                        (_, 7) => go!(2, 7),
                        (_, _) => go!(2, 8),
                    }
                }
                for r in 0..k.rows {
                    for c in 0..n {
                        // SAFETY: r * cols + c0 + c < rows * cols = out.len().
                        unsafe { *op.add(r * k.cols + c0 + c) = tmp[r * n + c] };
                    }
                }
                c0 += n;
            }
        }
    };
}

many_entry!(q4_0_many, Q4_0, BlockQ4_0, BlockQ8_0, legacy_avx2, false);
many_entry!(q4_1_many, Q4_1, BlockQ4_1, BlockQ8_1, legacy_avx2, false);
many_entry!(q5_0_many, Q5_0, BlockQ5_0, BlockQ8_0, legacy_avx2, false);
many_entry!(q5_1_many, Q5_1, BlockQ5_1, BlockQ8_1, legacy_avx2, false);
many_entry!(q8_0_many, Q8_0, BlockQ8_0, BlockQ8_0, legacy_avx2, false);
many_entry!(
    q4_0_many_vnni,
    Q4_0,
    BlockQ4_0,
    BlockQ8_0,
    legacy_vnni,
    true
);
many_entry!(
    q4_1_many_vnni,
    Q4_1,
    BlockQ4_1,
    BlockQ8_1,
    legacy_vnni,
    true
);
many_entry!(
    q5_0_many_vnni,
    Q5_0,
    BlockQ5_0,
    BlockQ8_0,
    legacy_vnni,
    true
);
many_entry!(
    q5_1_many_vnni,
    Q5_1,
    BlockQ5_1,
    BlockQ8_1,
    legacy_vnni,
    true
);
many_entry!(
    q8_0_many_vnni,
    Q8_0,
    BlockQ8_0,
    BlockQ8_0,
    legacy_vnni,
    true
);

many_entry!(mxfp4_many, Mxfp4, BlockMxfp4, BlockQ8_0, legacy_avx2, false);
many_entry!(
    mxfp4_many_vnni,
    Mxfp4,
    BlockMxfp4,
    BlockQ8_0,
    legacy_vnni,
    true
);

many_entry!(
    iq4_nl_many,
    Iq4Nl,
    BlockIq4Nl,
    BlockQ8_0,
    legacy_avx2,
    false
);
many_entry!(
    iq4_nl_many_vnni,
    Iq4Nl,
    BlockIq4Nl,
    BlockQ8_0,
    legacy_vnni,
    true
);

single_from_many!(q4_0_q8_0, BlockQ4_0, BlockQ8_0, q4_0_many);
single_from_many!(iq4_nl_q8_0, BlockIq4Nl, BlockQ8_0, iq4_nl_many);
single_from_many!(iq4_nl_q8_0_vnni, BlockIq4Nl, BlockQ8_0, iq4_nl_many_vnni);
single_from_many!(iq4_nl_rep, BlockIq4Nl, BlockQ8_0, iq4_nl_rep_many);
single_from_many!(iq4_nl_rep_vnni, BlockIq4Nl, BlockQ8_0, iq4_nl_rep_many_vnni);
single_from_many!(mxfp4_q8_0, BlockMxfp4, BlockQ8_0, mxfp4_many);
single_from_many!(mxfp4_q8_0_vnni, BlockMxfp4, BlockQ8_0, mxfp4_many_vnni);
single_from_many!(q4_1_q8_1, BlockQ4_1, BlockQ8_1, q4_1_many);
single_from_many!(q5_0_q8_0, BlockQ5_0, BlockQ8_0, q5_0_many);
single_from_many!(q5_1_q8_1, BlockQ5_1, BlockQ8_1, q5_1_many);
single_from_many!(q8_0_q8_0, BlockQ8_0, BlockQ8_0, q8_0_many);
single_from_many!(q4_0_q8_0_vnni, BlockQ4_0, BlockQ8_0, q4_0_many_vnni);
single_from_many!(q4_1_q8_1_vnni, BlockQ4_1, BlockQ8_1, q4_1_many_vnni);
single_from_many!(q5_0_q8_0_vnni, BlockQ5_0, BlockQ8_0, q5_0_many_vnni);
single_from_many!(q5_1_q8_1_vnni, BlockQ5_1, BlockQ8_1, q5_1_many_vnni);
single_from_many!(q8_0_q8_0_vnni, BlockQ8_0, BlockQ8_0, q8_0_many_vnni);
