//! llama.cpp's order (`DotOrder::Single`) on packed rows: one group of eight rows per call
//! on AVX2 (and AVX-VNNI), sixteen on AVX-512.

use super::*;

// ---------------------------------------------------------------------------------------
// llama.cpp's own order (`DotOrder::Single`) on packed rows, AVX2: one group of eight
// rows per call, every format.
//
// ggml's x86 kernels sum a block in eight i32 lanes, lane `l` holding elements
// `4l..4l+4`, and fuse each lane into its own float accumulator: exactly register `l` of
// a packed block (`crate::formats::packed`), for eight rows at once. So per token and
// block these kernels do eight integer products (one per register), eight conversions
// and eight FMAs for eight rows, and one `dx * dy` multiply for all eight, where ggml
// unpacks the block, signs the activations and multiplies the scales for every row; the
// end is `hsum_float_8` done vertically across the eight accumulators. Each lane does the
// twin's operations for its row: the bits of `vec_dot_*`. A lane's integer sum is exact
// however it is formed (`ExactInt`): Q4_0 and Q5_0 go in as their stored unsigned quants
// (`q + offset`, at most 31) with the lane started at `-offset * Σ y`, precomputed once
// per activation block (`crate::contract::offset_sums`); Q8_0 without VNNI keeps ggml's
// sign trick, since `q + 128` would saturate `maddubs`' i16 pairs. (A first version
// measured slower than the file rows' tiles: its per-token step was a closure LLVM did
// not inline, which kept the accumulators in memory; see ARCHITECTURE.md.)

/// How the AVX2 exact packed kernels form a lane's integer sum.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ExactInt {
    /// `maddubs` on the stored unsigned quants (at most 31), plus the offset sum for
    /// Q4_0 and Q5_0.
    Maddubs,
    /// `maddubs` on `|q|` with each activation given q's sign (Q8_0 without VNNI).
    Sign,
    /// `vpdpbusd` on unsigned quants (Q8_0 flipped to `q + 128`) from the offset sum.
    Vnni,
    /// The same in the VEX encoding (AVX-VNNI).
    VnniVex,
}

/// Which `vpdpbusd` an exact packed kernel is compiled for, if any.
const NO_VNNI: u8 = 0;
const EVEX: u8 = 1;
const VEX: u8 = 2;

impl ExactInt {
    const fn of<T: Legacy>(vnni: u8) -> ExactInt {
        if vnni == EVEX {
            ExactInt::Vnni
        } else if vnni == VEX {
            ExactInt::VnniVex
        } else if T::EIGHT_BIT {
            ExactInt::Sign
        } else {
            ExactInt::Maddubs
        }
    }
}

/// Block `p` of a packed group as `int` multiplies it: the eight quant registers
/// (unsigned; `|q|` for `Sign`), the quants themselves for `Sign` (their signs, else
/// zero), the rows' scales and (unsigned formats) mins.
///
/// # Safety
/// AVX2/F16C available; `p` points to a whole block of a packed group.
#[inline(always)]
unsafe fn stage8<T: Legacy>(
    p: *const u8,
    int: ExactInt,
    prefetch: bool,
) -> ([__m256i; 8], [__m256i; 8], __m256, __m256) {
    if prefetch {
        prefetch_block(p, 8 * T::WB);
    }
    let heads = if T::SIGNED { 1 } else { 2 };
    let q = packed_regs::<T>(p.add(16 * heads));
    let (t, sgn) = match int {
        ExactInt::Sign => (q.map(|v| _mm256_sign_epi8(v, v)), q),
        ExactInt::Vnni | ExactInt::VnniVex if T::EIGHT_BIT => (
            q.map(|v| _mm256_xor_si256(v, _mm256_set1_epi8(0x80u8 as i8))),
            [_mm256_setzero_si256(); 8],
        ),
        _ => (q, [_mm256_setzero_si256(); 8]),
    };
    let dx = _mm256_cvtph_ps(ld128(p));
    let mx = if T::SIGNED {
        _mm256_setzero_ps()
    } else {
        _mm256_cvtph_ps(ld128(p.add(16)))
    };
    (t, sgn, dx, mx)
}

/// One token's products with one staged block: `t` its registers, `sgn` the quants
/// (`Sign` only, read nowhere else), `init(k)` lane k's offset sum (signed formats, `Maddubs` and
/// `Vnni`), `(dx, mx)` the rows' scales and mins, `(dy, sy)` the token's block scale and
/// sum.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn exact_block<T: Legacy>(
    int: ExactInt,
    t: &[__m256i; 8],
    sgn: *const [__m256i; 8],
    yq: *const u8,
    init: impl Fn(usize) -> __m256i,
    (dx, mx): (__m256, __m256),
    (dy, sy): (f32, f32),
    acc: &mut [__m256; 8],
    summs: &mut __m256,
) {
    let d = _mm256_mul_ps(dx, _mm256_set1_ps(dy));
    let ones = _mm256_set1_epi16(1);
    for k in 0..8 {
        let y = bcast4(yq.add(4 * k));
        let isum = match int {
            ExactInt::Vnni => fast_dpbusd_vnni(init(k), t[k], y),
            ExactInt::VnniVex => dpbusd_vex(init(k), t[k], y),
            ExactInt::Sign => _mm256_madd_epi16(
                _mm256_maddubs_epi16(t[k], _mm256_sign_epi8(y, (*sgn)[k])),
                ones,
            ),
            ExactInt::Maddubs => {
                let s = _mm256_madd_epi16(_mm256_maddubs_epi16(t[k], y), ones);
                if T::SIGNED {
                    _mm256_add_epi32(init(k), s)
                } else {
                    s
                }
            }
        };
        acc[k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), acc[k]);
    }
    if !T::SIGNED {
        *summs = _mm256_fmadd_ps(mx, _mm256_set1_ps(sy), *summs);
    }
}

/// Token c's products with block i of the call `f`, from its staged registers (`t`, `sgn`,
/// `dm` as [`exact_block`] takes them). A function, not a closure: the closure was not
/// inlined and kept the accumulators in memory.
///
/// # Safety
/// Token c < n and block i < nb of the validated call.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn exact_token<T: Legacy>(
    f: &FastCall,
    int: ExactInt,
    (c, i): (usize, usize),
    t: &[__m256i; 8],
    sgn: *const [__m256i; 8],
    dm: (__m256, __m256),
    acc: &mut [__m256; 8],
    summs: &mut __m256,
) {
    let ab = f.a.add(c * f.stride + i * T::AB);
    let yq = ab.add(T::A_QS);
    let ys = act_scales::<T>(f, c, i, ab);
    let init = |k: usize| _mm256_set1_epi32(lane_start::<T>(f, c, i, yq, k));
    exact_block::<T>(int, t, sgn, yq, init, dm, ys, acc, summs);
}

/// The kernel over one packed group (eight rows), `f` validated for it (eight offset sums
/// per activation block when `use_sums`).
#[inline(always)]
unsafe fn exact_packed_body<T: Legacy, const VNNI: u8>(f: FastCall) {
    let int = ExactInt::of::<T>(VNNI);
    let FastCall {
        w,
        n,
        nb,
        out,
        out_col,
        ..
    } = f;
    let block = |i: usize| {
        // SAFETY (this closure): block i < nb of the group is inside `w`.
        stage8::<T>(w.add(i * 8 * T::WB), int, n <= 2)
    };
    let mut acc_m =
        core::mem::MaybeUninit::<[[__m256; 8]; crate::contract::FAST_TILE_TOKENS]>::uninit();
    let mut summs_m =
        core::mem::MaybeUninit::<[__m256; crate::contract::FAST_TILE_TOKENS]>::uninit();
    let acc = init_prefix(&mut acc_m, n, [_mm256_setzero_ps(); 8]);
    let summs = init_prefix(&mut summs_m, n, _mm256_setzero_ps());
    if n <= 2 {
        // Decode: the group streams, nothing to stage.
        for i in 0..nb {
            let (t, sgn, dx, mx) = block(i);
            for c in 0..n {
                exact_token::<T>(
                    &f,
                    int,
                    (c, i),
                    &t,
                    &sgn,
                    (dx, mx),
                    &mut acc[c],
                    &mut summs[c],
                );
            }
        }
    } else {
        // Staged registers, scales and mins (and for `Sign` the quants' signs) of one
        // chunk of blocks. Uninitialized: entries 0..nc are written before any is read.
        type Staged = ([__m256i; 8], __m256, __m256);
        let mut tq_m = core::mem::MaybeUninit::<[Staged; FAST_CHUNK]>::uninit();
        let mut sq_m = core::mem::MaybeUninit::<[[__m256i; 8]; FAST_CHUNK]>::uninit();
        let tq = tq_m.as_mut_ptr().cast::<Staged>();
        let sq = sq_m.as_mut_ptr().cast::<[__m256i; 8]>();
        let mut i0 = 0;
        while i0 < nb {
            let nc = (nb - i0).min(FAST_CHUNK);
            for j in 0..nc {
                let (t, sgn, dx, mx) = block(i0 + j);
                tq.add(j).write((t, dx, mx));
                if int == ExactInt::Sign {
                    sq.add(j).write(sgn);
                }
            }
            for c in 0..n {
                let mut a8 = acc[c];
                let mut sm = summs[c];
                for j in 0..nc {
                    // SAFETY: entry j < nc was written above (its signs too for `Sign`,
                    // the only kernel that reads them).
                    let (t, dx, mx) = &*tq.add(j);
                    exact_token::<T>(
                        &f,
                        int,
                        (c, i0 + j),
                        t,
                        sq.add(j),
                        (*dx, *mx),
                        &mut a8,
                        &mut sm,
                    );
                }
                acc[c] = a8;
                summs[c] = sm;
            }
            i0 += nc;
        }
    }
    for c in 0..n {
        // `hsum_float_8`, lane by lane: v_i = x_{i+4} + x_i, then (v0 + v2) + (v1 + v3),
        // then the unsigned formats' mins.
        let x = &acc[c];
        let v: [__m256; 4] = arr(|i| _mm256_add_ps(x[i + 4], x[i]));
        let mut r = _mm256_add_ps(_mm256_add_ps(v[0], v[2]), _mm256_add_ps(v[1], v[3]));
        if !T::SIGNED {
            r = _mm256_add_ps(r, summs[c]);
        }
        _mm256_storeu_ps(out.add(c * out_col), r);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn exact_packed_avx2<T: Legacy>(f: FastCall) {
    exact_packed_body::<T, NO_VNNI>(f)
}

#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn exact_packed_vnni<T: Legacy>(f: FastCall) {
    exact_packed_body::<T, EVEX>(f)
}

/// The AVX-VNNI level's kernel (16 ymm registers). Only the 4- and 5-bit formats have a
/// row there: on a Zen 5 (`packed_gemm`, single thread, 64 tokens) it ran Q4_1 and Q5_1
/// 17-18% faster than the AVX2 kernel and Q4_0, Q5_0 3-4%, but Q8_0 5% slower (its
/// weights need the sign flip `maddubs`' sign trick avoids).
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn exact_packed_vex<T: Legacy>(f: FastCall) {
    exact_packed_body::<T, VEX>(f)
}

macro_rules! exact_packed_entry {
    ($name:ident, $ty:ident, $w:ty, $a:ty, $imp:ident, $max_rows:expr) => {
        /// llama.cpp's order on one packed group of eight rows (or `$max_rows` rows).
        ///
        /// # Safety
        /// See [`crate::contract::TileIntoFn`]; the kernel's features available.
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
            assert!(
                rows == 8 || rows == $max_rows,
                "packed tile: {rows} rows, not one group of eight or {} rows",
                $max_rows
            );
            // Eight offset sums per block where the side has them: one per lane.
            fast_call_rows::<$w, $a>(
                $max_rows,
                (w, rows, a, stride),
                side,
                n,
                (out, 1, out_stride),
                8,
                $imp::<$ty>,
                None,
            )
        }
    };
}

exact_packed_entry!(
    q4_0_packed_avx2,
    Q4_0,
    BlockQ4_0,
    BlockQ8_0,
    exact_packed_avx2,
    8
);
exact_packed_entry!(
    q4_1_packed_avx2,
    Q4_1,
    BlockQ4_1,
    BlockQ8_1,
    exact_packed_avx2,
    8
);
exact_packed_entry!(
    q5_0_packed_avx2,
    Q5_0,
    BlockQ5_0,
    BlockQ8_0,
    exact_packed_avx2,
    8
);
exact_packed_entry!(
    q5_1_packed_avx2,
    Q5_1,
    BlockQ5_1,
    BlockQ8_1,
    exact_packed_avx2,
    8
);
exact_packed_entry!(
    q8_0_packed_avx2,
    Q8_0,
    BlockQ8_0,
    BlockQ8_0,
    exact_packed_avx2,
    8
);
exact_packed_entry!(
    q4_0_packed_vnni,
    Q4_0,
    BlockQ4_0,
    BlockQ8_0,
    exact_packed_vnni,
    8
);
exact_packed_entry!(
    q4_1_packed_vnni,
    Q4_1,
    BlockQ4_1,
    BlockQ8_1,
    exact_packed_vnni,
    8
);
exact_packed_entry!(
    q5_0_packed_vnni,
    Q5_0,
    BlockQ5_0,
    BlockQ8_0,
    exact_packed_vnni,
    8
);
exact_packed_entry!(
    q5_1_packed_vnni,
    Q5_1,
    BlockQ5_1,
    BlockQ8_1,
    exact_packed_vnni,
    8
);
exact_packed_entry!(
    q8_0_packed_vnni,
    Q8_0,
    BlockQ8_0,
    BlockQ8_0,
    exact_packed_vnni,
    8
);

exact_packed_entry!(
    q4_0_packed_vex,
    Q4_0,
    BlockQ4_0,
    BlockQ8_0,
    exact_packed_vex,
    8
);
exact_packed_entry!(
    q4_1_packed_vex,
    Q4_1,
    BlockQ4_1,
    BlockQ8_1,
    exact_packed_vex,
    8
);
exact_packed_entry!(
    q5_0_packed_vex,
    Q5_0,
    BlockQ5_0,
    BlockQ8_0,
    exact_packed_vex,
    8
);
exact_packed_entry!(
    q5_1_packed_vex,
    Q5_1,
    BlockQ5_1,
    BlockQ8_1,
    exact_packed_vex,
    8
);

// ---------------------------------------------------------------------------------------
// llama.cpp's order on packed rows with AVX-512: sixteen rows (two groups) in the lanes of
// a 512-bit register, every format.
//
// The same lane sums as `exact_packed_body`: register `k` of a block holds elements
// `4k..4k+4` of each row, so one `vpdpbusd` forms ggml's i32 lane `k` for sixteen rows
// and each lane keeps its own float accumulator (`acc[k]`), folded by `hsum_float_8`'s
// additions at the end. The signed formats take their weights unsigned (`q + offset`,
// Q8_0's sign bit flipped) and start each lane's integer sum at `-offset * Σ y` of the
// lane's four activations (`crate::contract::offset_sums`), so the lane holds exactly
// `Σ q·y`: no per-row sign work at all, where ggml signs the activations for every row.

/// One token's products with one staged block of sixteen rows, into `acc` (and the
/// unsigned formats' min term into `summs`).
#[inline(always)]
unsafe fn exact512_block<T: Legacy>(
    t: &[__m512i; 8],
    (dx, mx): (__m512, __m512),
    yq: *const u8,
    init: impl Fn(usize) -> __m512i,
    (dy, sy): (f32, f32),
    acc: &mut [__m512; 8],
    summs: &mut __m512,
) {
    let d = _mm512_mul_ps(dx, _mm512_set1_ps(dy));
    for k in 0..8 {
        let y = _mm512_set1_epi32(yq.add(4 * k).cast::<i32>().read_unaligned());
        let isum = _mm512_dpbusd_epi32(init(k), t[k], y);
        acc[k] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(isum), acc[k]);
    }
    if !T::SIGNED {
        *summs = _mm512_fmadd_ps(mx, _mm512_set1_ps(sy), *summs);
    }
}

/// Token pairs (`M` = 2) or one token (`M` = 1) at `c0` against the `nc` staged blocks
/// starting at block `i0`: from zero at block 0, else continuing the accumulators in
/// `acc` / `summs` (entries `c0..c0 + M`, written here either way).
///
/// # Safety
/// As the kernel's; entries `c0..c0 + M` of `acc` and `summs` are valid for writes, and
/// for reads when `i0 > 0`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn exact512_tokens<T: Legacy, const M: usize>(
    f: &FastCall,
    c0: usize,
    i0: usize,
    staged: impl Fn(usize) -> ([__m512i; 8], __m512, __m512),
    nc: usize,
    acc: *mut [__m512; 8],
    summs: *mut __m512,
) {
    let (mut a, mut s): ([[__m512; 8]; M], [__m512; M]) = if i0 == 0 {
        ([[_mm512_setzero_ps(); 8]; M], [_mm512_setzero_ps(); M])
    } else {
        (
            arr(|q| acc.add(c0 + q).read()),
            arr(|q| summs.add(c0 + q).read()),
        )
    };
    for j in 0..nc {
        let i = i0 + j;
        let (t, dx, mx) = staged(j);
        for q in 0..M {
            let c = c0 + q;
            // SAFETY: token c < n and block i < nb of the validated call.
            let ab = f.a.add(c * f.stride + i * T::AB);
            let yq = ab.add(T::A_QS);
            let ys = act_scales::<T>(f, c, i, ab);
            let init = |k: usize| _mm512_set1_epi32(lane_start::<T>(f, c, i, yq, k));
            exact512_block::<T>(&t, (dx, mx), yq, init, ys, &mut a[q], &mut s[q]);
        }
    }
    for q in 0..M {
        acc.add(c0 + q).write(a[q]);
        summs.add(c0 + q).write(s[q]);
    }
}

/// The sum of the four signed activation bytes at `p` (a lane's sum, for calls without
/// precomputed offset sums).
#[inline(always)]
unsafe fn lane_sum(p: *const u8) -> i32 {
    (0..4).map(|e| *p.add(e) as i8 as i32).sum()
}

/// Where lane `k` of token `c`'s products with block `i` starts in llama.cpp's order on
/// packed rows (ymm and zmm alike): `-offset * Σ y` of its four activations for a signed
/// format (precomputed where the call has offset sums, else summed from `yq`, the
/// block's quants), 0 for an unsigned one.
///
/// # Safety
/// Token c < n and block i < nb of the validated call `f`, `yq` their activation quants.
#[inline(always)]
unsafe fn lane_start<T: Legacy>(f: &FastCall, c: usize, i: usize, yq: *const u8, k: usize) -> i32 {
    if !T::SIGNED {
        0
    } else if f.use_sums {
        *f.sums.add((c * f.nb + i) * 8 + k)
    } else {
        -T::OFFSET * lane_sum(yq.add(4 * k))
    }
}

/// llama.cpp's order over one or two packed groups (8 or 16 rows) with AVX-512.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI available; `f` validated for 8 or 16 packed rows with `out_row`
/// 1 and, when `use_sums`, eight offset sums per block (`offset_sums`).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn exact_vnni512_packed<T: Legacy>(f: FastCall) {
    let FastCall {
        w,
        wstride,
        rows,
        n,
        nb,
        out,
        out_col,
        ..
    } = f;
    debug_assert!((rows == 8 || rows == PACKED512_ROWS) && f.out_row == 1);
    if n <= 2 {
        // Decode: one group at a time in ymm registers (the same operations lane for
        // lane), which streams faster than two groups in the halves of zmm registers.
        for g in 0..rows / 8 {
            exact_packed_body::<T, EVEX>(FastCall {
                w: w.add(g * 8 * wstride),
                rows: 8,
                out: out.add(8 * g),
                ..f
            });
        }
        return;
    }
    // A call of one group runs it in both halves and stores one.
    let group = if rows == PACKED512_ROWS {
        8 * wstride
    } else {
        0
    };
    let block = |i: usize| {
        // SAFETY (this closure): block i < nb of the groups is inside `w`.
        let pa = w.add(i * 8 * T::WB);
        stage512::<T>(pa, pa.add(group), n <= 2)
    };
    // Accumulators, uninitialized: the first chunk of blocks writes entries 0..n (from
    // zero), nothing reads others. (Zeroing all 64 tokens' 36 KiB cost a decode call more
    // than its products, and even a memset of one token's was 10% of gemma3's tg.)
    let mut acc_m =
        core::mem::MaybeUninit::<[[__m512; 8]; crate::contract::FAST_TILE_TOKENS]>::uninit();
    let mut summs_m =
        core::mem::MaybeUninit::<[__m512; crate::contract::FAST_TILE_TOKENS]>::uninit();
    debug_assert!(n <= crate::contract::FAST_TILE_TOKENS);
    let acc = acc_m.as_mut_ptr().cast::<[__m512; 8]>();
    let summs = summs_m.as_mut_ptr().cast::<__m512>();
    if n <= 2 {
        // Decode: the groups stream, nothing to stage.
        let staged = |j: usize| block(j);
        if n == 2 {
            exact512_tokens::<T, 2>(&f, 0, 0, staged, nb, acc, summs);
        } else {
            exact512_tokens::<T, 1>(&f, 0, 0, staged, nb, acc, summs);
        }
    } else {
        // Staged quants, scales and mins of one chunk of blocks. Uninitialized: entries
        // 0..nc are written (through raw pointers) before any is read.
        type Staged = ([__m512i; 8], __m512, __m512);
        let mut tq_m = core::mem::MaybeUninit::<[Staged; FAST_CHUNK]>::uninit();
        let tq = tq_m.as_mut_ptr().cast::<Staged>();
        let mut i0 = 0;
        while i0 < nb {
            let nc = (nb - i0).min(FAST_CHUNK);
            for j in 0..nc {
                tq.add(j).write(block(i0 + j));
            }
            // SAFETY: entry j < nc was written above.
            let staged = |j: usize| *tq.add(j);
            let mut c0 = 0;
            while c0 + 2 <= n {
                exact512_tokens::<T, 2>(&f, c0, i0, staged, nc, acc, summs);
                c0 += 2;
            }
            if c0 < n {
                exact512_tokens::<T, 1>(&f, c0, i0, staged, nc, acc, summs);
            }
            i0 += nc;
        }
    }
    let mask: __mmask16 = if rows == PACKED512_ROWS {
        0xffff
    } else {
        0x00ff
    };
    for c in 0..n {
        // `hsum_float_8`, lane by lane: v_i = x_{i+4} + x_i, then (v0 + v2) + (v1 + v3);
        // then the mins' sum for the unsigned formats.
        // SAFETY: entries 0..n were written by the first chunk.
        let x = &*acc.add(c);
        let v: [__m512; 4] = arr(|i| _mm512_add_ps(x[i + 4], x[i]));
        let mut r = _mm512_add_ps(_mm512_add_ps(v[0], v[2]), _mm512_add_ps(v[1], v[3]));
        if !T::SIGNED {
            r = _mm512_add_ps(r, *summs.add(c));
        }
        _mm512_mask_storeu_ps(out.add(c * out_col), mask, r);
    }
}

exact_packed_entry!(
    q4_0_packed512,
    Q4_0,
    BlockQ4_0,
    BlockQ8_0,
    exact_vnni512_packed,
    PACKED512_ROWS
);
exact_packed_entry!(
    q4_1_packed512,
    Q4_1,
    BlockQ4_1,
    BlockQ8_1,
    exact_vnni512_packed,
    PACKED512_ROWS
);
exact_packed_entry!(
    q5_0_packed512,
    Q5_0,
    BlockQ5_0,
    BlockQ8_0,
    exact_vnni512_packed,
    PACKED512_ROWS
);
exact_packed_entry!(
    q5_1_packed512,
    Q5_1,
    BlockQ5_1,
    BlockQ8_1,
    exact_vnni512_packed,
    PACKED512_ROWS
);
exact_packed_entry!(
    q8_0_packed512,
    Q8_0,
    BlockQ8_0,
    BlockQ8_0,
    exact_vnni512_packed,
    PACKED512_ROWS
);
