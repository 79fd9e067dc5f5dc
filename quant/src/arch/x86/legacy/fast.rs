//! The fast order (`DotOrder::Fast`) over the file's rows and packed ones, AVX2, VNNI and
//! AVX-VNNI; MXFP4's and IQ4_NL's repacked orders, which are its arithmetic.

use super::*;

// The fast order (`DotOrder::Fast`): eight weight rows at a time, one row per register
// lane. Each block of the eight rows is unpacked once and transposed (register `k` holds
// elements 4k..4k+4 of every row), then each token needs only eight integer products with
// its broadcast 4-byte groups, one conversion and one FMA for all eight rows. The integer
// sum of a block is exact however it is formed, so every instantiation (and the scalar
// twin `dot_q8_0_fast` / `dot_q8_1_fast`) gives the same bits.

/// How the exact integer block sums are formed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FastInt {
    /// `vpdpbusd` on unsigned weights (signed formats: `q + offset`, corrected by the
    /// offset sums).
    Vnni,
    /// `maddubs` on unsigned weights of at most 31, four products summed in i16 before
    /// widening (at most 4 * 2 * 31 * 127 = 31496, no saturation).
    Avx2Small,
    /// `maddubs` on `|q|` with the activation given q's sign (Q8_0 without VNNI).
    Avx2Sign,
}

/// Transposes eight vectors of eight dwords: lane `r` of output `k` is lane `k` of input
/// `r`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn transpose8x8(v: &[__m256i; 8]) -> [__m256i; 8] {
    let t0 = _mm256_unpacklo_epi32(v[0], v[1]);
    let t1 = _mm256_unpackhi_epi32(v[0], v[1]);
    let t2 = _mm256_unpacklo_epi32(v[2], v[3]);
    let t3 = _mm256_unpackhi_epi32(v[2], v[3]);
    let t4 = _mm256_unpacklo_epi32(v[4], v[5]);
    let t5 = _mm256_unpackhi_epi32(v[4], v[5]);
    let t6 = _mm256_unpacklo_epi32(v[6], v[7]);
    let t7 = _mm256_unpackhi_epi32(v[6], v[7]);
    let u0 = _mm256_unpacklo_epi64(t0, t2);
    let u1 = _mm256_unpackhi_epi64(t0, t2);
    let u2 = _mm256_unpacklo_epi64(t1, t3);
    let u3 = _mm256_unpackhi_epi64(t1, t3);
    let u4 = _mm256_unpacklo_epi64(t4, t6);
    let u5 = _mm256_unpackhi_epi64(t4, t6);
    let u6 = _mm256_unpacklo_epi64(t5, t7);
    let u7 = _mm256_unpackhi_epi64(t5, t7);
    [
        _mm256_permute2x128_si256::<0x20>(u0, u4),
        _mm256_permute2x128_si256::<0x20>(u1, u5),
        _mm256_permute2x128_si256::<0x20>(u2, u6),
        _mm256_permute2x128_si256::<0x20>(u3, u7),
        _mm256_permute2x128_si256::<0x31>(u0, u4),
        _mm256_permute2x128_si256::<0x31>(u1, u5),
        _mm256_permute2x128_si256::<0x31>(u2, u6),
        _mm256_permute2x128_si256::<0x31>(u3, u7),
    ]
}

/// `-offset * Σ y` of one activation block, for calls without precomputed offset sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn neg_offset_sum(yq: *const u8, off: i32) -> i32 {
    let y = ld256(yq);
    let s = _mm256_madd_epi16(
        _mm256_maddubs_epi16(_mm256_set1_epi8(1), y),
        _mm256_set1_epi16(1),
    );
    -off * hsum_i32(s)
}

/// The eight transposed quant registers of one block of a packed group
/// (`crate::formats::packed`), `q` at its quants: Q8_0's signed bytes, the other formats'
/// unsigned stored values (MXFP4's table values plus its offset).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn packed_regs<T: Legacy>(q: *const u8) -> [__m256i; 8] {
    let mut t = [_mm256_setzero_si256(); 8];
    if T::EIGHT_BIT {
        for (k, t) in t.iter_mut().enumerate() {
            *t = ld256(q.add(32 * k));
        }
        return t;
    }
    let m4 = _mm256_set1_epi8(0x0f);
    for v in 0..4 {
        let x = ld256(q.add(32 * v));
        t[2 * v] = _mm256_and_si256(x, m4);
        t[2 * v + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(x), m4);
    }
    if T::LUT {
        let table = table16(&T::UNSIGNED_TABLE);
        for t in &mut t {
            *t = _mm256_shuffle_epi8(table, *t);
        }
    }
    if T::FIFTH_BIT {
        // Bit k of each byte is register k's fifth bit.
        let h = ld256(q.add(128));
        for (k, t) in t.iter_mut().enumerate() {
            *t = _mm256_or_si256(*t, bit_to_4(h, k));
        }
    }
    t
}

/// Blocks of eight rows unpacked and transposed at a time into the kernel's stack scratch
/// (8 KiB of quants): every token of the call then reads them from L1.
pub(super) const FAST_CHUNK: usize = 32;

/// Four activation bytes broadcast to every dword lane, as one load (the compiler would
/// otherwise merge neighbouring loads into one vector load and shuffle it apart).
/// Compiled with AVX2 even in a baseline build (the fuzz targets' own RUSTFLAGS), where a
/// `ymm` register would otherwise be refused.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::arch::x86) unsafe fn bcast4(p: *const u8) -> __m256i {
    let v: __m256i;
    core::arch::asm!(
        "vpbroadcastd {v}, dword ptr [{p}]",
        p = in(reg) p,
        v = out(ymm_reg) v,
        options(pure, readonly, nostack, preserves_flags)
    );
    v
}

/// One fast-order tile call, validated by `check_tile_rows`: `rows` (1..=8) weight rows
/// of `nb` blocks `wstride` bytes apart at `w`; `n` activation rows `stride` bytes apart at
/// `a`; activation block scales as f32 at `ad` when `ad_stride > 0`; one offset sum per
/// activation block at `sums` (rows `nb` apart) when `use_sums`; `rows * n` results at
/// `out` (`out[r * n + c]`).
#[derive(Clone, Copy)]
pub(super) struct FastCall {
    pub(super) w: *const u8,
    pub(super) wstride: usize,
    pub(super) rows: usize,
    pub(super) a: *const u8,
    pub(super) stride: usize,
    pub(super) n: usize,
    pub(super) ad: *const f32,
    pub(super) ad_stride: usize,
    pub(super) sums: *const i32,
    pub(super) use_sums: bool,
    pub(super) nb: usize,
    pub(super) out: *mut f32,
    /// Result (r, c) goes to `out[r * out_row + c * out_col]`.
    pub(super) out_row: usize,
    pub(super) out_col: usize,
}

/// Token `c`'s block `i` scale and (Q8_1) sum, as f32: from the side scales where the
/// call has them, else from the activation block at `ab` (its first two f16 fields; the
/// sum is 0 for the signed formats, whose activations have none).
///
/// # Safety
/// Token `c` and block `i` of a validated call; `ab` that block; F16C available.
#[inline(always)]
pub(super) unsafe fn act_scales<T: Legacy>(
    f: &FastCall,
    c: usize,
    i: usize,
    ab: *const u8,
) -> (f32, f32) {
    if f.ad_stride > 0 {
        let q =
            f.ad.add(c * f.ad_stride + i * if T::SIGNED { 1 } else { 2 });
        (*q, if T::SIGNED { 0.0 } else { *q.add(1) })
    } else {
        let v = _mm_cvtph_ps(_mm_cvtsi32_si128(
            ab.cast::<u32>().read_unaligned().to_le() as i32
        ));
        let sy = if T::SIGNED {
            0.0
        } else {
            _mm_cvtss_f32(_mm_movehdup_ps(v))
        };
        (_mm_cvtss_f32(v), sy)
    }
}

/// Weight rows the decode kernels read together.
const DECODE_ROWS: usize = 2;

macro_rules! legacy_fast {
    ($name:ident, $dec:ident, $feat:literal, $int:expr) => {
        /// # Safety
        /// The features named are available; `w` holds `rows` (1..=8) weight rows of `nb`
        /// blocks, `wstride` bytes apart; `a` holds `n` activation rows of `nb` blocks,
        /// `stride` bytes apart; `out` has `rows * n` slots. `ad` (when `ad_stride > 0`)
        /// holds the activation block scales as f32, `sums` (when `use_sums`) one offset
        /// sum per activation block (`fast_offset_sums`), rows `nb` apart.
        #[target_feature(enable = $feat)]
        unsafe fn $name<T: Legacy, const PACKED: bool>(f: FastCall) {
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
            const INT: FastInt = $int;
            let sign_trick = INT == FastInt::Avx2Sign;
            let mut acc_m =
                core::mem::MaybeUninit::<[__m256; crate::contract::FAST_TILE_TOKENS]>::uninit();
            let acc = init_prefix(&mut acc_m, n, _mm256_setzero_ps());
            // One block of the eight rows, as the products want it: the transposed quants
            // (|q| with the sign trick), their signs, the rows' scales and mins.
            let block = |i: usize| -> ([__m256i; 8], [__m256i; 8], __m256, __m256) {
                let (t, dh, mh) = if PACKED {
                    // SAFETY (this closure): block i of the group is inside `w`.
                    let p = w.add(i * 8 * T::WB);
                    if n <= 2 {
                        prefetch_packed::<T>(p);
                    }
                    let mut t = packed_regs::<T>(p.add(packed_head::<T>()));
                    if T::EIGHT_BIT != sign_trick {
                        // Stored signed (Q8_0) but wanted unsigned, or the reverse.
                        for x in &mut t {
                            *x = if T::EIGHT_BIT {
                                _mm256_xor_si256(*x, _mm256_set1_epi8(0x80u8 as i8))
                            } else {
                                _mm256_sub_epi8(*x, _mm256_set1_epi8(T::OFFSET as i8))
                            };
                        }
                    }
                    (
                        t,
                        packed_scales::<T>(p),
                        if T::SIGNED {
                            _mm_setzero_si128()
                        } else {
                            ld128(p.add(16))
                        },
                    )
                } else {
                    let mut v = [_mm256_setzero_si256(); 8];
                    let mut dh = [0u16; 8];
                    let mut mh = [0u16; 8];
                    for (r, v) in v.iter_mut().enumerate() {
                        // Missing rows repeat row 0; their lanes are never stored.
                        let rr = if r < rows { r } else { 0 };
                        let wb = w.add(rr * wstride + i * T::WB);
                        if n <= 2 {
                            _mm_prefetch::<_MM_HINT_T0>(wb.wrapping_add(PREFETCH).cast());
                        }
                        *v = if sign_trick {
                            T::unpack(wb)
                        } else {
                            T::unpack_unsigned(wb)
                        };
                        dh[r] = scale_field::<T>(wb);
                        if !T::SIGNED {
                            mh[r] = wb.add(2).cast::<u16>().read_unaligned().to_le();
                        }
                    }
                    (
                        transpose8x8(&v),
                        _mm_loadu_si128(dh.as_ptr().cast()),
                        _mm_loadu_si128(mh.as_ptr().cast()),
                    )
                };
                let dx = widen8::<T>(dh);
                let mx = if T::SIGNED {
                    _mm256_setzero_ps()
                } else {
                    _mm256_cvtph_ps(mh)
                };
                if sign_trick {
                    (t.map(|x| _mm256_sign_epi8(x, x)), t, dx, mx)
                } else {
                    (t, t, dx, mx)
                }
            };
            // Token c's product with block i of the eight rows, added into `acc_c`.
            // Where token c's block i starts, and the integer sum's starting value there
            // (minus the offset times the activation sum where the signed formats' quants
            // enter unsigned without the sign trick).
            let act = |c: usize, i: usize| -> (*const u8, i32) {
                // SAFETY (this closure): token c < n, block i < nb of the checked call.
                let ab = a.add(c * stride + i * T::AB);
                let init = if !T::SIGNED || sign_trick {
                    0
                } else if use_sums {
                    *sums.add(c * nb + i)
                } else {
                    neg_offset_sum(ab.add(T::A_QS), T::OFFSET)
                };
                (ab, init)
            };
            // Token c's block i folded into `acc_c`: its exact integer sum `isum` times
            // the scales, plus the mins term for the unsigned formats.
            let fold = |c: usize, i: usize, ab: *const u8, isum: __m256i, dx, mx, acc_c| {
                // SAFETY (this closure): as `act`.
                let (dy, sy) = act_scales::<T>(&f, c, i, ab);
                let d = _mm256_mul_ps(dx, _mm256_set1_ps(dy));
                let mut acc_c = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), acc_c);
                if !T::SIGNED {
                    acc_c = _mm256_fmadd_ps(mx, _mm256_set1_ps(sy), acc_c);
                }
                acc_c
            };
            // Token c's product with block i of the eight rows, added into `acc_c`.
            let product = |c: usize,
                           i: usize,
                           t: &[__m256i; 8],
                           ts: &[__m256i; 8],
                           dx: __m256,
                           mx: __m256,
                           acc_c: __m256|
             -> __m256 {
                let (ab, init) = act(c, i);
                let yq = ab.add(T::A_QS);
                let isum = match INT {
                    FastInt::Vnni => {
                        let mut s0 = _mm256_set1_epi32(init);
                        let mut s1 = _mm256_setzero_si256();
                        for k in (0..8).step_by(2) {
                            s0 = fast_dpbusd_vnni(s0, t[k], bcast4(yq.add(4 * k)));
                            s1 = fast_dpbusd_vnni(s1, t[k + 1], bcast4(yq.add(4 * k + 4)));
                        }
                        _mm256_add_epi32(s0, s1)
                    }
                    FastInt::Avx2Small => {
                        let ones = _mm256_set1_epi16(1);
                        let mut s = _mm256_set1_epi32(init);
                        for g in 0..2 {
                            let k = 4 * g;
                            let m = |k: usize| _mm256_maddubs_epi16(t[k], bcast4(yq.add(4 * k)));
                            let p = _mm256_add_epi16(
                                _mm256_add_epi16(m(k), m(k + 1)),
                                _mm256_add_epi16(m(k + 2), m(k + 3)),
                            );
                            s = _mm256_add_epi32(s, _mm256_madd_epi16(p, ones));
                        }
                        s
                    }
                    FastInt::Avx2Sign => {
                        let ones = _mm256_set1_epi16(1);
                        let mut s = _mm256_setzero_si256();
                        for k in 0..8 {
                            let y = _mm256_sign_epi8(bcast4(yq.add(4 * k)), ts[k]);
                            s = _mm256_add_epi32(
                                s,
                                _mm256_madd_epi16(_mm256_maddubs_epi16(t[k], y), ones),
                            );
                        }
                        s
                    }
                };
                fold(c, i, ab, isum, dx, mx, acc_c)
            };
            if PACKED && n <= 2 {
                // Decode from packed rows: one stream, nothing to stage.
                for i in 0..nb {
                    let (t, ts, dx, mx) = block(i);
                    for (c, acc) in acc.iter_mut().enumerate().take(n) {
                        *acc = product(c, i, &t, &ts, dx, mx, *acc);
                    }
                }
            } else {
                // Transposed quants (|q| with the sign trick), their signs, scales and mins
                // of one chunk of blocks. Uninitialized: zeroing 16 KiB per call would cost
                // more than a few tokens' products. Entries 0..nc are written (through raw
                // pointers) before any is read.
                let mut tq_m = core::mem::MaybeUninit::<[[__m256i; 8]; FAST_CHUNK]>::uninit();
                let mut ts_m = core::mem::MaybeUninit::<[[__m256i; 8]; FAST_CHUNK]>::uninit();
                let mut dxs_m = core::mem::MaybeUninit::<[__m256; FAST_CHUNK]>::uninit();
                let mut ms_m = core::mem::MaybeUninit::<[__m256; FAST_CHUNK]>::uninit();
                let tq = tq_m.as_mut_ptr().cast::<[__m256i; 8]>();
                let ts = ts_m.as_mut_ptr().cast::<[__m256i; 8]>();
                let dxs = dxs_m.as_mut_ptr().cast::<__m256>();
                let ms = ms_m.as_mut_ptr().cast::<__m256>();
                let mut i0 = 0;
                while i0 < nb {
                    let nc = (nb - i0).min(FAST_CHUNK);
                    for j in 0..nc {
                        let (t, s, dx, mx) = block(i0 + j);
                        tq.add(j).write(t);
                        if sign_trick {
                            ts.add(j).write(s);
                        }
                        dxs.add(j).write(dx);
                        ms.add(j).write(mx);
                    }
                    // With VNNI, four tokens per pass over the chunk: each staged weight
                    // register is loaded once for four `vpdpbusd` instead of one (the
                    // pass was bound by loads). Every token's integer sums are exact and
                    // its float operations are the one-token sequence: the same bits.
                    let mut c0 = 0;
                    if INT == FastInt::Vnni {
                        while c0 + 4 <= n {
                            let mut acc4: [__m256; 4] = arr(|q| acc[c0 + q]);
                            for j in 0..nc {
                                let i = i0 + j;
                                // SAFETY: entry j < nc was written above.
                                let t = &*tq.add(j);
                                let ai: [(*const u8, i32); 4] = arr(|q| act(c0 + q, i));
                                let mut s0 = ai.map(|(_, init)| _mm256_set1_epi32(init));
                                let mut s1 = [_mm256_setzero_si256(); 4];
                                for k in (0..8).step_by(2) {
                                    for q in 0..4 {
                                        let yq = ai[q].0.add(T::A_QS);
                                        s0[q] =
                                            fast_dpbusd_vnni(s0[q], t[k], bcast4(yq.add(4 * k)));
                                        s1[q] = fast_dpbusd_vnni(
                                            s1[q],
                                            t[k + 1],
                                            bcast4(yq.add(4 * k + 4)),
                                        );
                                    }
                                }
                                for q in 0..4 {
                                    let isum = _mm256_add_epi32(s0[q], s1[q]);
                                    acc4[q] = fold(
                                        c0 + q,
                                        i,
                                        ai[q].0,
                                        isum,
                                        *dxs.add(j),
                                        *ms.add(j),
                                        acc4[q],
                                    );
                                }
                            }
                            acc[c0..c0 + 4].copy_from_slice(&acc4);
                            c0 += 4;
                        }
                    }
                    for (c, acc) in acc.iter_mut().enumerate().take(n).skip(c0) {
                        let mut acc_c = *acc;
                        for j in 0..nc {
                            // SAFETY: entry j < nc was written above (`ts` only read with
                            // the sign trick, which wrote it).
                            let t = &*tq.add(j);
                            let s = if sign_trick { &*ts.add(j) } else { t };
                            acc_c = product(c, i0 + j, t, s, *dxs.add(j), *ms.add(j), acc_c);
                        }
                        *acc = acc_c;
                    }
                    i0 += nc;
                }
            }
            for (c, acc) in acc.iter().enumerate().take(n) {
                if rows == 8 && out_row == 1 {
                    _mm256_storeu_ps(out.add(c * out_col), *acc);
                    continue;
                }
                let mut l = [0.0f32; 8];
                _mm256_storeu_ps(l.as_mut_ptr(), *acc);
                for (r, &v) in l.iter().enumerate().take(rows) {
                    *out.add(r * out_row + c * out_col) = v;
                }
            }
        }

        /// The same products for one or two tokens (decode), four weight rows at a time
        /// so that only four rows stream from memory together: each row's block is
        /// multiplied whole and the four lane vectors are folded into one (exact
        /// integers, so the same bits as the transposed kernel).
        ///
        /// # Safety
        /// As the transposed kernel, with `n` at most 2.
        #[target_feature(enable = $feat)]
        unsafe fn $dec<T: Legacy>(f: FastCall) {
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
            const INT: FastInt = $int;
            let ones = _mm256_set1_epi16(1);
            let mut r0 = 0;
            while r0 < rows {
                let nr = (rows - r0).min(DECODE_ROWS);
                let mut acc = [_mm_setzero_ps(); 2];
                for i in 0..nb {
                    let mut u = [_mm256_setzero_si256(); 4];
                    let mut dh = [0u16; 4];
                    let mut mh = [0u16; 4];
                    for (q, u) in u.iter_mut().enumerate().take(DECODE_ROWS) {
                        let rr = r0 + if q < nr { q } else { 0 };
                        let wb = w.add(rr * wstride + i * T::WB);
                        _mm_prefetch::<_MM_HINT_T0>(wb.wrapping_add(PREFETCH).cast());
                        *u = if INT == FastInt::Avx2Sign {
                            T::unpack(wb)
                        } else {
                            T::unpack_unsigned(wb)
                        };
                        dh[q] = scale_field::<T>(wb);
                        if !T::SIGNED {
                            mh[q] = wb.add(2).cast::<u16>().read_unaligned().to_le();
                        }
                    }
                    let dx = widen4::<T>(_mm_loadl_epi64(dh.as_ptr().cast()));
                    let mx = _mm_cvtph_ps(_mm_loadl_epi64(mh.as_ptr().cast()));
                    for (c, acc) in acc.iter_mut().enumerate().take(n) {
                        let ab = a.add(c * stride + i * T::AB);
                        let yq = ab.add(T::A_QS);
                        let y = ld256(yq);
                        let mut p = [_mm256_setzero_si256(); 4];
                        for (q, p) in p.iter_mut().enumerate().take(DECODE_ROWS) {
                            *p = match INT {
                                FastInt::Vnni => fast_dpbusd_vnni(_mm256_setzero_si256(), u[q], y),
                                FastInt::Avx2Small => {
                                    _mm256_madd_epi16(_mm256_maddubs_epi16(u[q], y), ones)
                                }
                                FastInt::Avx2Sign => _mm256_madd_epi16(
                                    _mm256_maddubs_epi16(
                                        _mm256_sign_epi8(u[q], u[q]),
                                        _mm256_sign_epi8(y, u[q]),
                                    ),
                                    ones,
                                ),
                            };
                        }
                        // Fold: lane q of the result is the sum of p[q]'s eight lanes.
                        let h = _mm256_hadd_epi32(
                            _mm256_hadd_epi32(p[0], p[1]),
                            _mm256_hadd_epi32(p[2], p[3]),
                        );
                        let mut s4 = _mm_add_epi32(
                            _mm256_castsi256_si128(h),
                            _mm256_extracti128_si256::<1>(h),
                        );
                        if T::SIGNED && INT != FastInt::Avx2Sign {
                            let init = if use_sums {
                                *sums.add(c * nb + i)
                            } else {
                                neg_offset_sum(yq, T::OFFSET)
                            };
                            s4 = _mm_add_epi32(s4, _mm_set1_epi32(init));
                        }
                        let (dy, sy) = act_scales::<T>(&f, c, i, ab);
                        let d = _mm_mul_ps(dx, _mm_set1_ps(dy));
                        *acc = _mm_fmadd_ps(d, _mm_cvtepi32_ps(s4), *acc);
                        if !T::SIGNED {
                            *acc = _mm_fmadd_ps(mx, _mm_set1_ps(sy), *acc);
                        }
                    }
                }
                for (c, acc) in acc.iter().enumerate().take(n) {
                    let mut l = [0.0f32; 4];
                    _mm_storeu_ps(l.as_mut_ptr(), *acc);
                    for (q, &v) in l.iter().enumerate().take(nr) {
                        *out.add((r0 + q) * out_row + c * out_col) = v;
                    }
                }
                r0 += nr;
            }
        }
    };
}

/// `vpdpbusd` where the kernel has VNNI; never reached from the AVX2 instantiations.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
pub(super) unsafe fn fast_dpbusd_vnni(s: __m256i, u: __m256i, y: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(s, u, y)
}

/// The same instruction in AVX-VNNI's VEX encoding (CPUs without AVX-512).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(super) unsafe fn dpbusd_vex(s: __m256i, u: __m256i, y: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(s, u, y)
}

legacy_fast!(
    fast_avx2_small,
    fast_avx2_small_decode,
    "avx2,fma,f16c",
    FastInt::Avx2Small
);
legacy_fast!(
    fast_avx2_sign,
    fast_avx2_sign_decode,
    "avx2,fma,f16c",
    FastInt::Avx2Sign
);
legacy_fast!(
    fast_vnni,
    fast_vnni_decode,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    FastInt::Vnni
);

/// Dispatches a fast-order tile call to the instantiation for its token count.
/// Validates a fast-order tile call and runs the kernel for its token count, results
/// to `out[r * out_row + c * out_col]`.
///
/// # Safety
/// The kernels' features are available; every result slot is valid for writes and
/// written by nobody else during the call.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn fast_call<W: Block, A: Block>(
    wa: (&[u8], usize, &[u8], usize),
    side: ActSide<'_>,
    n: usize,
    out: (*mut f32, usize, usize),
    sums: bool,
    imp: unsafe fn(FastCall),
    dec: Option<unsafe fn(FastCall)>,
) {
    fast_call_rows::<W, A>(8, wa, side, n, out, usize::from(sums), imp, dec)
}

/// [`fast_call`] for kernels of up to `max_rows` weight rows that read `sums` offset sums
/// per activation block (0: none; 1: the fast order's per-block sum; 8: llama.cpp's
/// order's per-lane sums).
///
/// # Safety
/// As [`fast_call`].
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn fast_call_rows<W: Block, A: Block>(
    max_rows: usize,
    (w, rows, a, stride): (&[u8], usize, &[u8], usize),
    side: ActSide<'_>,
    n: usize,
    (out, out_row, out_col): (*mut f32, usize, usize),
    sums: usize,
    imp: unsafe fn(FastCall),
    dec: Option<unsafe fn(FastCall)>,
) {
    let k = crate::contract::check_tile_rows::<W, A>(
        w,
        rows,
        a,
        stride,
        side,
        rows * n,
        (max_rows, crate::contract::FAST_TILE_TOKENS),
        sums.max(1),
    );
    let call = FastCall {
        w: w.as_ptr(),
        wstride: k.wstride,
        rows: k.rows,
        a: a.as_ptr(),
        stride,
        n: k.cols,
        ad: side.scales.as_ptr(),
        ad_stride: k.ad_stride,
        sums: k.sums,
        use_sums: sums > 0 && k.use_sums,
        nb: k.nb,
        out,
        out_row,
        out_col,
    };
    match dec {
        Some(dec) if k.cols <= 2 => dec(call),
        _ => imp(call),
    }
}

macro_rules! fast_entry {
    ($name:ident, $into:ident, $packed:ident, $ty:ident, $w:ty, $a:ty, $imp:ident, $dec:ident, $sums:literal) => {
        pub(in crate::arch::x86) fn $name(
            w: &[u8],
            rows: usize,
            a: &[u8],
            stride: usize,
            side: ActSide<'_>,
            out: &mut [f32],
        ) {
            assert!(
                rows >= 1 && out.len().is_multiple_of(rows),
                "tile: {rows} weight rows, {} outputs",
                out.len()
            );
            let n = out.len() / rows;
            // SAFETY: handed out by the kernel table only after the features were
            // detected; the slots r * n + c (r < rows, c < n) are exactly `out`.
            unsafe {
                fast_call::<$w, $a>(
                    (w, rows, a, stride),
                    side,
                    n,
                    (out.as_mut_ptr(), n, 1),
                    $sums,
                    $imp::<$ty, false>,
                    Some($dec::<$ty>),
                )
            }
        }

        /// # Safety
        /// See [`crate::contract::TileIntoFn`].
        #[allow(clippy::too_many_arguments)]
        pub(in crate::arch::x86) unsafe fn $into(
            w: &[u8],
            rows: usize,
            a: &[u8],
            stride: usize,
            side: ActSide<'_>,
            n: usize,
            out: *mut f32,
            out_stride: usize,
        ) {
            fast_call::<$w, $a>(
                (w, rows, a, stride),
                side,
                n,
                (out, 1, out_stride),
                $sums,
                $imp::<$ty, false>,
                Some($dec::<$ty>),
            )
        }

        /// `$into` for rows repacked by `crate::pack8`: one whole group of eight rows.
        ///
        /// # Safety
        /// See [`crate::contract::TileIntoFn`].
        #[allow(clippy::too_many_arguments)]
        pub(in crate::arch::x86) unsafe fn $packed(
            w: &[u8],
            rows: usize,
            a: &[u8],
            stride: usize,
            side: ActSide<'_>,
            n: usize,
            out: *mut f32,
            out_stride: usize,
        ) {
            assert_eq!(rows, 8, "packed tile: {rows} rows, not one group of eight");
            fast_call::<$w, $a>(
                (w, rows, a, stride),
                side,
                n,
                (out, 1, out_stride),
                $sums,
                $imp::<$ty, true>,
                None,
            )
        }
    };
}

fast_entry!(
    q4_0_fast_many,
    q4_0_fast_many_into,
    q4_0_fast_packed_into,
    Q4_0,
    BlockQ4_0,
    BlockQ8_0,
    fast_avx2_small,
    fast_avx2_small_decode,
    true
);
fast_entry!(
    q4_1_fast_many,
    q4_1_fast_many_into,
    q4_1_fast_packed_into,
    Q4_1,
    BlockQ4_1,
    BlockQ8_1,
    fast_avx2_small,
    fast_avx2_small_decode,
    false
);
fast_entry!(
    q5_0_fast_many,
    q5_0_fast_many_into,
    q5_0_fast_packed_into,
    Q5_0,
    BlockQ5_0,
    BlockQ8_0,
    fast_avx2_small,
    fast_avx2_small_decode,
    true
);
fast_entry!(
    q5_1_fast_many,
    q5_1_fast_many_into,
    q5_1_fast_packed_into,
    Q5_1,
    BlockQ5_1,
    BlockQ8_1,
    fast_avx2_small,
    fast_avx2_small_decode,
    false
);
fast_entry!(
    q8_0_fast_many,
    q8_0_fast_many_into,
    q8_0_fast_packed_into,
    Q8_0,
    BlockQ8_0,
    BlockQ8_0,
    fast_avx2_sign,
    fast_avx2_sign_decode,
    false
);
fast_entry!(
    q4_0_fast_many_vnni,
    q4_0_fast_many_vnni_into,
    q4_0_fast_packed_vnni_into,
    Q4_0,
    BlockQ4_0,
    BlockQ8_0,
    fast_vnni,
    fast_vnni_decode,
    true
);
fast_entry!(
    q4_1_fast_many_vnni,
    q4_1_fast_many_vnni_into,
    q4_1_fast_packed_vnni_into,
    Q4_1,
    BlockQ4_1,
    BlockQ8_1,
    fast_vnni,
    fast_vnni_decode,
    false
);
fast_entry!(
    q5_0_fast_many_vnni,
    q5_0_fast_many_vnni_into,
    q5_0_fast_packed_vnni_into,
    Q5_0,
    BlockQ5_0,
    BlockQ8_0,
    fast_vnni,
    fast_vnni_decode,
    true
);
fast_entry!(
    q5_1_fast_many_vnni,
    q5_1_fast_many_vnni_into,
    q5_1_fast_packed_vnni_into,
    Q5_1,
    BlockQ5_1,
    BlockQ8_1,
    fast_vnni,
    fast_vnni_decode,
    false
);
fast_entry!(
    q8_0_fast_many_vnni,
    q8_0_fast_many_vnni_into,
    q8_0_fast_packed_vnni_into,
    Q8_0,
    BlockQ8_0,
    BlockQ8_0,
    fast_vnni,
    fast_vnni_decode,
    true
);

// MXFP4's repacked order (llama.cpp's `gemv`/`gemm_mxfp4_8x8_q8_0`) is the fast order's
// arithmetic: its table values plus 12 (at most 24) go in unsigned, the activations'
// block sums times -12 start the integer sums.
fast_entry!(
    mxfp4_rep_many,
    mxfp4_rep_many_into,
    mxfp4_rep_packed_into,
    Mxfp4,
    BlockMxfp4,
    BlockQ8_0,
    fast_avx2_small,
    fast_avx2_small_decode,
    true
);
fast_entry!(
    mxfp4_rep_many_vnni,
    mxfp4_rep_many_vnni_into,
    mxfp4_rep_packed_vnni_into,
    Mxfp4,
    BlockMxfp4,
    BlockQ8_0,
    fast_vnni,
    fast_vnni_decode,
    true
);

// IQ4_NL's repacked order (`gemv`/`gemm_iq4_nl_8x8_q8_0`) is MXFP4's with its own table
// and an f16 scale: one exact integer sum per block, one FMA with the scale product. Its
// table values plus 128 reach 241, too large for `maddubs` pairs: AVX2 takes the sign
// trick (|x| <= 127), VNNI the unsigned values with offset sums.
fast_entry!(
    iq4_nl_rep_many,
    iq4_nl_rep_many_into,
    iq4_nl_rep_packed_into,
    Iq4NlRep,
    BlockIq4Nl,
    BlockQ8_0,
    fast_avx2_sign,
    fast_avx2_sign_decode,
    false
);
fast_entry!(
    iq4_nl_rep_many_vnni,
    iq4_nl_rep_many_vnni_into,
    iq4_nl_rep_packed_vnni_into,
    Iq4NlRep,
    BlockIq4Nl,
    BlockQ8_0,
    fast_vnni,
    fast_vnni_decode,
    true
);

single_from_many!(q4_0_fast, BlockQ4_0, BlockQ8_0, q4_0_fast_many);
single_from_many!(mxfp4_rep, BlockMxfp4, BlockQ8_0, mxfp4_rep_many);
single_from_many!(mxfp4_rep_vnni, BlockMxfp4, BlockQ8_0, mxfp4_rep_many_vnni);
single_from_many!(q4_1_fast, BlockQ4_1, BlockQ8_1, q4_1_fast_many);
single_from_many!(q5_0_fast, BlockQ5_0, BlockQ8_0, q5_0_fast_many);
single_from_many!(q5_1_fast, BlockQ5_1, BlockQ8_1, q5_1_fast_many);
single_from_many!(q8_0_fast, BlockQ8_0, BlockQ8_0, q8_0_fast_many);
single_from_many!(q4_0_fast_vnni, BlockQ4_0, BlockQ8_0, q4_0_fast_many_vnni);
single_from_many!(q4_1_fast_vnni, BlockQ4_1, BlockQ8_1, q4_1_fast_many_vnni);
single_from_many!(q5_0_fast_vnni, BlockQ5_0, BlockQ8_0, q5_0_fast_many_vnni);
single_from_many!(q5_1_fast_vnni, BlockQ5_1, BlockQ8_1, q5_1_fast_many_vnni);
single_from_many!(q8_0_fast_vnni, BlockQ8_0, BlockQ8_0, q8_0_fast_many_vnni);
