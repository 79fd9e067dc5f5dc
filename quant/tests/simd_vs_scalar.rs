//! Every SIMD kernel against its scalar twin, bit for bit (`to_bits()` equality).
//!
//! Weights come both from the reference quantizer (realistic blocks) and from raw random
//! bytes with sane f16 scales (every bit pattern of the quants, including -128 in the
//! Q8 formats); activations from `quantize_activations` and from raw bytes. Row lengths
//! cover one block, odd block counts and the kernels' grouping boundaries (legacy
//! kernels reduce eight blocks at a time).
//!
//! The kernels are taken from the table (`quant::kernels`), every ISA this CPU has, not
//! only the active one: on an AVX-512 VNNI machine the AVX2 and AVX2+VNNI rows are both
//! checked, on an aarch64 CPU with `sdot` the plain NEON and the dotprod rows.
//! `table_rows_are_exercised` fails when a row is added that no test walks. On a CPU
//! without SIMD rows only the scalar code and the dispatcher are checked.
//!
//! `QUANT_EXPECT_ISA=<level>` makes the run fail unless that is the level detected here,
//! so a run meant to test a fallback (e.g. under `qemu-aarch64 -cpu cortex-a57`, which has
//! no `sdot`) cannot silently test another path (`tools/neon_test.sh` sets it).

use half::f16;
use quant::ops::f16::{sum_rows_f16, sum_rows_f16_scalar};
use quant::{contract, isa, kernels};
use quant::{
    quantize_activations, quantize_row, vec_dot, vec_dot_type, ActSide, DotOrder, GgmlType, Isa,
    KernelSet, SideBuf, TILE_MAX_TOKENS,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TYPES: [GgmlType; 13] = [
    GgmlType::MXFP4,
    GgmlType::IQ4_NL,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::Q4_0,
    GgmlType::Q5_1,
    GgmlType::Q5_K,
    GgmlType::Q3_K,
    GgmlType::Q2_K,
    GgmlType::IQ4_XS,
];

/// The orders besides the one-row order: the K-quants' llama.cpp orders (Q5_K's tiled
/// one among them), the table
/// formats' repacked order and the fast order of the 32-element formats, the table formats
/// and the K-quants (`tests/fast_order.rs` walks their eight-row and packed tiles,
/// `tests/mxfp4.rs` MXFP4's on every exponent).
const ORDERED: [(GgmlType, DotOrder); 21] = [
    (GgmlType::Q4_0, DotOrder::Gemm4),
    (GgmlType::Q5_K, DotOrder::Tiled),
    (GgmlType::Q3_K, DotOrder::Tiled),
    (GgmlType::Q3_K, DotOrder::Fast),
    (GgmlType::IQ4_XS, DotOrder::Tiled),
    (GgmlType::IQ4_XS, DotOrder::Fast),
    (GgmlType::Q5_K, DotOrder::Fast),
    (GgmlType::MXFP4, DotOrder::Gemm4),
    (GgmlType::IQ4_NL, DotOrder::Gemm4),
    (GgmlType::MXFP4, DotOrder::Fast),
    (GgmlType::IQ4_NL, DotOrder::Fast),
    (GgmlType::Q6_K, DotOrder::Tiled),
    (GgmlType::Q4_K, DotOrder::Tiled),
    (GgmlType::Q4_K, DotOrder::Gemm4),
    (GgmlType::Q4_0, DotOrder::Fast),
    (GgmlType::Q4_1, DotOrder::Fast),
    (GgmlType::Q5_0, DotOrder::Fast),
    (GgmlType::Q5_1, DotOrder::Fast),
    (GgmlType::Q8_0, DotOrder::Fast),
    (GgmlType::Q4_K, DotOrder::Fast),
    (GgmlType::Q6_K, DotOrder::Fast),
];

/// Byte offsets of the f16 scale fields inside one block, per format.
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType as T;
    match ty {
        T::Q4_0 | T::Q5_0 | T::Q8_0 | T::IQ4_NL | T::IQ4_XS => &[0],
        T::Q4_1 | T::Q5_1 | T::Q8_1 => &[0, 2],
        T::Q4_K | T::Q5_K => &[0, 2],
        T::Q2_K => &[80, 82],
        T::Q3_K => &[108],
        T::Q6_K => &[208],
        T::Q8_K | T::MXFP4 => &[],
        other => panic!("no layout for {other}"),
    }
}

/// Block counts to test: one block, odd counts, and around multiples of eight.
fn block_counts(ty: GgmlType) -> &'static [usize] {
    if ty.block_size() == 32 {
        &[1, 2, 3, 7, 8, 9, 13, 16, 17, 31, 128]
    } else {
        &[1, 2, 3, 5, 8, 16]
    }
}

/// Random floats of one of several shapes (centred, shifted, spiky, tiny, constant).
fn random_f32s(rng: &mut StdRng, n: usize) -> Vec<f32> {
    match rng.gen_range(0..6) {
        0 => (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect(),
        1 => (0..n).map(|_| rng.gen_range(-0.5f32..2.0)).collect(),
        2 => (0..n)
            .map(|_| {
                let x: f32 = rng.gen_range(-1.0..1.0);
                if rng.gen_bool(0.02) {
                    x * 50.0
                } else {
                    x
                }
            })
            .collect(),
        3 => (0..n).map(|_| rng.gen_range(-1e-3f32..1e-3)).collect(),
        4 => {
            // Sum of uniforms, roughly Gaussian.
            (0..n)
                .map(|_| (0..4).map(|_| rng.gen_range(-1.0f32..1.0)).sum())
                .collect()
        }
        _ => {
            let c = rng.gen_range(-3.0f32..3.0);
            (0..n).map(|i| if i % 97 == 5 { -c } else { c }).collect()
        }
    }
}

/// A sane f16 scale: finite, moderate magnitude, either sign, occasionally zero.
fn sane_f16(rng: &mut StdRng) -> [u8; 2] {
    let v = if rng.gen_bool(0.05) {
        0.0
    } else {
        rng.gen_range(-2.0f32..2.0) * 10f32.powi(rng.gen_range(-4..1))
    };
    f16::from_f32(v).to_bits().to_le_bytes()
}

/// Raw random blocks of `ty` with every f16 scale field replaced by a sane value.
fn raw_blocks(rng: &mut StdRng, ty: GgmlType, blocks: usize) -> Vec<u8> {
    let bs = ty.type_size();
    let mut raw: Vec<u8> = (0..blocks * bs).map(|_| rng.gen()).collect();
    for b in raw.chunks_exact_mut(bs) {
        for &off in f16_fields(ty) {
            b[off..off + 2].copy_from_slice(&sane_f16(rng));
        }
        if ty == GgmlType::Q8_K {
            let d = rng.gen_range(-0.1f32..0.1);
            b[..4].copy_from_slice(&d.to_le_bytes());
        }
        if ty == GgmlType::MXFP4 {
            // A sane exponent (scales 2^-18..2^7); `tests/mxfp4.rs` walks all 256.
            b[0] = rng.gen_range(110..=135);
        }
    }
    raw
}

fn quantized(ty: GgmlType, x: &[f32], activations: bool) -> Vec<u8> {
    let mut out = vec![0u8; ty.row_bytes(x.len() as u64).unwrap() as usize];
    if activations {
        quantize_activations(ty, x, &mut out).unwrap();
    } else {
        quantize_row(ty, x, &mut out).unwrap();
    }
    out
}

/// The 32-element activation formats' quants are in -127..=127 by contract (what
/// `quantize_activations` produces; the SIMD kernels negate activations): raw bytes of
/// -128 become -127.
fn legal_activations(ty: GgmlType, a: &[u8]) -> Vec<u8> {
    let mut a = a.to_vec();
    let (bs, qs) = match vec_dot_type(ty) {
        GgmlType::Q8_0 => (34, 2),
        GgmlType::Q8_1 => (36, 4),
        _ => return a,
    };
    for b in a.chunks_exact_mut(bs) {
        for q in &mut b[qs..] {
            if *q == 0x80 {
                *q = 0x81;
            }
        }
    }
    a
}

/// Every kernel set the table has for (`ty`, `order`) that this CPU runs, whatever the
/// active ISA: all of them must return the scalar twin's bits.
fn sets(ty: GgmlType, order: DotOrder) -> Vec<KernelSet> {
    let order = kernels::effective_order(ty, order);
    kernels::available()
        .into_iter()
        .filter(|k| k.ty == ty && k.order == order)
        .collect()
}

fn twin(ty: GgmlType, order: DotOrder) -> quant::DotFn {
    kernels::scalar(ty, order).unwrap().dot
}

/// Checks every kernel of the table for `ty` in `order` (one-row and tile, every ISA this
/// CPU has), the active set and, for the one-row order, `vec_dot` against the scalar twin
/// on one pair.
fn check_pair(ty: GgmlType, order: DotOrder, n: usize, w: &[u8], a: &[u8], what: &str) -> f32 {
    let a = &legal_activations(ty, a)[..];
    let scalar = twin(ty, order)(w, a);
    let mut all = sets(ty, order);
    // The active set, unless the lookup fell back to another order (the fast order where
    // this CPU has no SIMD kernel for it).
    let active = kernels::kernels(ty, order).unwrap();
    if active.order == kernels::effective_order(ty, order) {
        all.push(active);
    }
    for k in all {
        let isa = k.isa;
        let got = (k.dot)(w, a);
        assert_eq!(
            got.to_bits(),
            scalar.to_bits(),
            "{ty} {order:?} {what} n={n}: {isa} {got:e} vs scalar {scalar:e}"
        );
        if let Some(tile) = k.tile {
            // The same row in every slot, with a stride larger than the row.
            let stride = a.len() + 7;
            let mut buf = vec![0u8; TILE_MAX_TOKENS * stride];
            for c in 0..TILE_MAX_TOKENS {
                buf[c * stride..c * stride + a.len()].copy_from_slice(a);
            }
            for rows in 1..=TILE_MAX_TOKENS {
                let mut out = vec![f32::NAN; rows];
                tile(w, 1, &buf, stride, ActSide::default(), &mut out);
                for (c, got) in out.iter().enumerate() {
                    assert_eq!(
                        got.to_bits(),
                        scalar.to_bits(),
                        "{ty} {order:?} {what} n={n}: {isa} tile rows={rows} slot {c}"
                    );
                }
            }
        }
    }
    if order == DotOrder::Single {
        let dispatched = vec_dot(ty, n, w, a).unwrap();
        assert_eq!(
            dispatched.to_bits(),
            scalar.to_bits(),
            "{ty} {what} n={n}: vec_dot"
        );
    }
    scalar
}

/// The tile kernels on distinct activation rows: each output equals the scalar twin on
/// its own row, for every row count, one and two weight rows, with and without each kind
/// of precomputed side data, on every ISA this CPU has.
#[test]
fn tiles_match_single_rows() {
    let mut rng = StdRng::seed_from_u64(11);
    for ty in TYPES {
        let aty = vec_dot_type(ty);
        for blocks in [1usize, 3, 28, 152] {
            let n = blocks * ty.block_size();
            let w = quantized(ty, &random_f32s(&mut rng, n), false);
            let rows: Vec<Vec<u8>> = (0..TILE_MAX_TOKENS)
                .map(|_| quantized(aty, &random_f32s(&mut rng, n), true))
                .collect();
            let buf: Vec<u8> = rows.concat();
            let stride = rows[0].len();
            let want: Vec<f32> = rows
                .iter()
                .map(|a| twin(ty, DotOrder::Single)(&w, a))
                .collect();
            let w1 = quantized(ty, &random_f32s(&mut rng, n), false);
            let w2 = [w.clone(), w1.clone()].concat();
            let want1: Vec<f32> = rows
                .iter()
                .map(|a| twin(ty, DotOrder::Single)(&w1, a))
                .collect();
            for k in sets(ty, DotOrder::Single) {
                let Some(tile) = k.tile else {
                    continue;
                };
                let isa = k.isa;
                for c_n in 1..=TILE_MAX_TOKENS {
                    let mut scales = Vec::new();
                    let mut sums = Vec::new();
                    let mut side = SideBuf::default();
                    for r in &rows[..c_n] {
                        contract::activation_scales(aty, r, &mut scales);
                        contract::offset_sums(ty, r, &mut sums);
                        side.push(&k, r);
                    }
                    let sides = [
                        ActSide::default(),
                        ActSide {
                            scales: &scales,
                            sums: &[],
                        },
                        ActSide {
                            scales: &[],
                            sums: &sums,
                        },
                        ActSide {
                            scales: &scales,
                            sums: &sums,
                        },
                        side.rows(&k, 0, c_n),
                    ];
                    for ad in sides {
                        let mut out = vec![0.0f32; c_n];
                        tile(&w, 1, &buf, stride, ad, &mut out);
                        for c in 0..c_n {
                            assert_eq!(
                                out[c].to_bits(),
                                want[c].to_bits(),
                                "{ty} {isa} n={n} k={c_n} c={c} side {ad:?}",
                            );
                        }
                        // Two weight rows: the second row's results match too.
                        let mut out = vec![0.0f32; 2 * c_n];
                        tile(&w2, 2, &buf, stride, ad, &mut out);
                        for c in 0..c_n {
                            assert_eq!(
                                out[c].to_bits(),
                                want[c].to_bits(),
                                "{ty} {isa} 2 rows r0 c={c}"
                            );
                            assert_eq!(
                                out[c_n + c].to_bits(),
                                want1[c].to_bits(),
                                "{ty} {isa} n={n} 2 rows k={c_n} r1 c={c}"
                            );
                        }
                    }
                }
            }
        }
    }
}

fn check_type(ty: GgmlType, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let aty = vec_dot_type(ty);
    let mut nonzero = 0;
    let mut total = 0;
    for &blocks in block_counts(ty) {
        let n = blocks * ty.block_size();
        let trials = if blocks > 32 { 3 } else { 12 };
        for trial in 0..trials {
            let wx = random_f32s(&mut rng, n);
            let ax = random_f32s(&mut rng, n);
            let (w, a, what) = match trial % 4 {
                0 | 1 => (
                    quantized(ty, &wx, false),
                    quantized(aty, &ax, true),
                    "quantized",
                ),
                2 => (
                    raw_blocks(&mut rng, ty, blocks),
                    quantized(aty, &ax, true),
                    "raw weights",
                ),
                _ => (
                    raw_blocks(&mut rng, ty, blocks),
                    raw_blocks(&mut rng, aty, blocks),
                    "raw weights+activations",
                ),
            };
            let r = check_pair(ty, DotOrder::Single, n, &w, &a, what);
            total += 1;
            if r != 0.0 && r.is_finite() {
                nonzero += 1;
            }
        }
    }
    // The data must actually exercise the kernels.
    assert!(
        nonzero * 10 >= total * 8,
        "{ty}: only {nonzero}/{total} nontrivial dots"
    );
}

#[test]
fn iq4_nl_matches_scalar() {
    check_type(GgmlType::IQ4_NL, 47);
}

#[test]
fn q4_1_matches_scalar() {
    check_type(GgmlType::Q4_1, 41);
}

#[test]
fn q5_0_matches_scalar() {
    check_type(GgmlType::Q5_0, 50);
}

#[test]
fn q8_0_matches_scalar() {
    check_type(GgmlType::Q8_0, 80);
}

#[test]
fn q4_k_matches_scalar() {
    check_type(GgmlType::Q4_K, 4);
}

#[test]
fn q6_k_matches_scalar() {
    check_type(GgmlType::Q6_K, 6);
}

#[test]
fn q4_0_matches_scalar() {
    check_type(GgmlType::Q4_0, 40);
}

#[test]
fn q5_1_matches_scalar() {
    check_type(GgmlType::Q5_1, 51);
}

#[test]
fn q5_k_matches_scalar() {
    check_type(GgmlType::Q5_K, 5);
}

#[test]
fn iq4_xs_matches_scalar() {
    check_type(GgmlType::IQ4_XS, 47);
}

#[test]
fn q3_k_matches_scalar() {
    check_type(GgmlType::Q3_K, 3);
}

#[test]
fn q2_k_matches_scalar() {
    check_type(GgmlType::Q2_K, 2);
}

/// Extreme but legal inputs: all quant bits set or clear, activations of -128 / 127,
/// maximal scales and mins.
#[test]
fn extreme_bytes_match_scalar() {
    for ty in TYPES {
        let aty = vec_dot_type(ty);
        for blocks in [1usize, 3, 9] {
            let n = blocks * ty.block_size();
            for (wb, ab) in [
                (0xffu8, 0x80u8),
                (0xff, 0x7f),
                (0x00, 0x80),
                (0xaa, 0x81),
                (0x55, 0x80),
            ] {
                let mut w = vec![wb; ty.row_bytes(n as u64).unwrap() as usize];
                let mut a = vec![ab; aty.row_bytes(n as u64).unwrap() as usize];
                for b in w.chunks_exact_mut(ty.type_size()) {
                    for &off in f16_fields(ty) {
                        b[off..off + 2]
                            .copy_from_slice(&f16::from_f32(0.01).to_bits().to_le_bytes());
                    }
                }
                for b in a.chunks_exact_mut(aty.type_size()) {
                    for &off in f16_fields(aty) {
                        b[off..off + 2]
                            .copy_from_slice(&f16::from_f32(0.5).to_bits().to_le_bytes());
                    }
                    if aty == GgmlType::Q8_K {
                        b[..4].copy_from_slice(&0.25f32.to_le_bytes());
                    }
                }
                for order in DotOrder::ALL {
                    check_pair(ty, order, n, &w, &a, &format!("extreme {wb:#x}/{ab:#x}"));
                }
            }
        }
    }
}

/// The random data is sensitive to the in-block element order: swapping the two nibble
/// planes of Q4 weights changes the scalar result, so a kernel that paired nibbles with
/// the wrong activations could not pass the tests above.
#[test]
fn data_detects_wrong_nibble_order() {
    let mut rng = StdRng::seed_from_u64(7);
    for (ty, qs) in [(GgmlType::Q4_1, 4..20usize), (GgmlType::Q4_0, 2..18)] {
        let aty = vec_dot_type(ty);
        let n = 4 * 32;
        let mut differ = 0;
        for _ in 0..20 {
            let w = quantized(ty, &random_f32s(&mut rng, n), false);
            let a = quantized(aty, &random_f32s(&mut rng, n), true);
            let mut swapped = w.clone();
            for b in swapped.chunks_exact_mut(ty.type_size()) {
                for q in &mut b[qs.clone()] {
                    *q = q.rotate_left(4);
                }
            }
            let f = twin(ty, DotOrder::Single);
            if f(&w, &a).to_bits() != f(&swapped, &a).to_bits() {
                differ += 1;
            }
        }
        assert!(
            differ >= 15,
            "{ty}: nibble swap changed only {differ}/20 results"
        );
    }
}

/// The K-quant twins accumulate in eight float lanes; a kernel that summed all integer
/// products first would round differently. Show that the data sees that difference.
#[test]
fn data_detects_wrong_lane_accumulation() {
    let mut rng = StdRng::seed_from_u64(8);
    let ty = GgmlType::Q6_K;
    let n = 16 * 256;
    let mut differ = 0;
    for _ in 0..10 {
        let w = quantized(ty, &random_f32s(&mut rng, n), false);
        let a = quantized(GgmlType::Q8_K, &random_f32s(&mut rng, n), true);
        let lanes = quant::formats::q6_k::vec_dot_q8k(&w, &a);
        // Same integers, one accumulator per block instead of eight lanes.
        let mut single = 0.0f32;
        for (wb, ab) in w.chunks_exact(210).zip(a.chunks_exact(292)) {
            single += quant::formats::q6_k::vec_dot_q8k(wb, ab);
        }
        if lanes.to_bits() != single.to_bits() {
            differ += 1;
        }
    }
    assert!(differ >= 5, "lane order changed only {differ}/10 results");
}

/// The table covers every format our tests walk with a kernel for the best x86 level
/// below VNNI, and every row a CPU can run is one the tests above exercise.
#[test]
fn table_rows_are_exercised() {
    let active = isa::active();
    assert!(active.available(), "{active}");
    if Isa::Avx2.available() {
        for ty in TYPES {
            assert!(
                kernels::kernels_at(ty, DotOrder::Single, Isa::Avx2).is_some(),
                "{ty} has no AVX2 kernel"
            );
        }
    } else if cfg!(target_arch = "x86_64") {
        eprintln!("note: no AVX2/FMA/F16C on this CPU; x86 SIMD kernels untested here");
    }
    if cfg!(target_arch = "aarch64") {
        // Every format has a plain NEON kernel (with its tile where x86 has one); the
        // formats `sdot` speeds up have a dotprod kernel too, run where the CPU has it.
        let dotprod = [
            GgmlType::MXFP4,
            GgmlType::IQ4_NL,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::Q2_K,
        ];
        for ty in TYPES {
            let tiled = ty.block_size() == 32 || ty == GgmlType::Q4_K || ty == GgmlType::Q6_K;
            for isa in [Isa::Neon, Isa::NeonDotprod] {
                if isa == Isa::NeonDotprod && !dotprod.contains(&ty) {
                    continue;
                }
                let listed = kernels::listing()
                    .into_iter()
                    .find(|&(t, o, i, _)| t == ty && o == DotOrder::Single && i == isa);
                assert!(
                    listed.is_some_and(|(.., tile)| tile == tiled),
                    "{ty} on {isa}: {listed:?}"
                );
                assert_eq!(
                    kernels::kernels_at(ty, DotOrder::Single, isa).is_some(),
                    isa.available(),
                    "{ty} {isa}"
                );
            }
        }
        assert!(
            Isa::Neon.available(),
            "NEON is part of every aarch64 target"
        );
    }
    if let Ok(want) = std::env::var("QUANT_EXPECT_ISA") {
        assert_eq!(
            isa::detected().name(),
            want.trim(),
            "QUANT_EXPECT_ISA: the run was meant for another CPU level"
        );
    }
    // The AVX-VNNI (VEX) level has a subset of the AVX-512 VNNI ymm level's rows: the same
    // kernels in the other encoding, where they beat AVX2 in 16 registers.
    let listing = kernels::listing();
    let at = |want: Isa| -> Vec<_> {
        listing
            .iter()
            .filter(|r| r.2 == want)
            .map(|&(t, o, _, _)| (t, o))
            .collect()
    };
    let (vex, evex) = (at(Isa::AvxVnni), at(Isa::Avx2Vnni));
    assert!(vex.iter().all(|r| evex.contains(r)), "{vex:?}");
    assert_eq!(vex.is_empty(), cfg!(not(target_arch = "x86_64")));
    if Isa::AvxVnni.available() {
        assert_eq!(
            kernels::kernels_at(GgmlType::Q4_1, DotOrder::Single, Isa::AvxVnni).map(|k| k.isa),
            Some(Isa::AvxVnni)
        );
    }
    let float = [GgmlType::F32, GgmlType::F16, GgmlType::BF16];
    for &(ty, order, isa, _) in &listing {
        let walked =
            TYPES.contains(&ty) && (order == DotOrder::Single || ORDERED.contains(&(ty, order)));
        // F32's and F16's rows: `f32_kernels_match_scalar`, `f16_kernels_match_scalar`;
        // BF16's: `bf16_kernels_match_scalar`.
        let walked = walked || ty == GgmlType::F32 || ty == GgmlType::F16 || ty == GgmlType::BF16;
        assert!(
            walked || (float.contains(&ty) && isa == Isa::Scalar),
            "{ty} {order:?} on {isa} is in the table but no test walks it"
        );
    }
}

/// The F16 weight kernels (f16 activations; `ggml_vec_dot_f16`'s order and tinyBLAS's)
/// against their scalar twins, every ISA this CPU has, on lengths around every step
/// boundary of both flavors (the twins in the build's flavor, which the rows follow); and
/// the twins in both flavors against an exact f64 dot.
#[test]
fn f16_kernels_match_scalar() {
    use quant::formats::float::vec_dot_f16_in;
    use quant::{F16Order, Flavor};
    let mut rng = StdRng::seed_from_u64(16);
    let f16s = |rng: &mut StdRng, n: usize| -> Vec<u8> {
        random_f32s(rng, n)
            .iter()
            .flat_map(|&x| f16::from_f32(x).to_bits().to_le_bytes())
            .collect()
    };
    let mut lens: Vec<usize> = (0..=200).collect();
    lens.extend([255, 256, 257, 576, 1000, 2048, 2880, 4099]);
    let mut simd_ran = 0;
    for n in lens {
        let w = f16s(&mut rng, n);
        let a = f16s(&mut rng, n);
        for order in [DotOrder::Single, DotOrder::Tiled, DotOrder::Fast] {
            let want = twin(GgmlType::F16, order)(&w, &a);
            for k in sets(GgmlType::F16, order) {
                assert_eq!(
                    (k.dot)(&w, &a).to_bits(),
                    want.to_bits(),
                    "F16 {order:?} n={n} on {}",
                    k.isa
                );
                simd_ran += usize::from(k.isa != Isa::Scalar);
                let Some(tile) = k.tile else { continue };
                if n == 0 {
                    continue;
                }
                // Up to the tile's weight rows against up to eight tokens (a stride past
                // the row): every output the one-row kernel's bits.
                let w2: Vec<u8> = w.iter().chain(&f16s(&mut rng, 4 * n)).copied().collect();
                let stride = 2 * n + 6;
                for (tokens, rows) in [1, 3, 4, 5, 8]
                    .into_iter()
                    .flat_map(|t| (1..=k.tile_rows).map(move |r| (t, r)))
                {
                    let acts: Vec<u8> = (0..tokens)
                        .flat_map(|_| {
                            let mut r = f16s(&mut rng, n);
                            r.extend([0u8; 6]);
                            r
                        })
                        .collect();
                    let mut out = vec![0.0f32; rows * tokens];
                    tile(
                        &w2[..rows * 2 * n],
                        rows,
                        &acts,
                        stride,
                        Default::default(),
                        &mut out,
                    );
                    for r in 0..rows {
                        for c in 0..tokens {
                            let one = (k.dot)(
                                &w2[r * 2 * n..(r + 1) * 2 * n],
                                &acts[c * stride..c * stride + 2 * n],
                            );
                            assert_eq!(
                                out[r * tokens + c].to_bits(),
                                one.to_bits(),
                                "F16 {order:?} tile n={n} row {r} token {c} of {tokens}"
                            );
                        }
                    }
                }
            }
        }
        let h = |b: &[u8], i: usize| f16::from_bits(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]));
        let exact: f64 = (0..n).map(|i| h(&w, i).to_f64() * h(&a, i).to_f64()).sum();
        let mag: f64 = (0..n)
            .map(|i| (h(&w, i).to_f64() * h(&a, i).to_f64()).abs())
            .sum();
        for fl in [Flavor::Avx2, Flavor::Avx512] {
            for ord in [F16Order::VecDot, F16Order::Gemm] {
                let v = vec_dot_f16_in(fl, ord, &w, &a) as f64;
                assert!(
                    (v - exact).abs() <= mag * 1e-6 + 1e-30,
                    "{fl:?} {ord:?} n={n}"
                );
            }
        }
    }
    if Isa::Avx2.available() {
        assert!(simd_ran > 0, "no F16 SIMD row ran");
    }
}

/// The BF16 weight kernels (bf16 activations; `ggml_vec_dot_bf16`'s order and
/// tinyBLAS's, in each of the three x86 forms) against their scalar twins: on widened
/// lanes, with `vdpbf16ps` itself where this CPU has it (which checks the twin's reading of
/// the instruction: per lane, the odd product added first), and the table's rows, every
/// ISA this CPU has, one-row and tile, against the twin in the build's order. The twins
/// against an exact f64 dot; and the data tells the three orders apart.
#[test]
fn bf16_kernels_match_scalar() {
    use quant::formats::float::{vec_dot_bf16_in, vec_dot_bf16_simd};
    use quant::Bf16Order;
    let mut rng = StdRng::seed_from_u64(30);
    let bf16s = |rng: &mut StdRng, n: usize| -> Vec<u8> {
        random_f32s(rng, n)
            .iter()
            .flat_map(|&x| quant::f16::f32_to_bf16(x).to_le_bytes())
            .collect()
    };
    let orders = [Bf16Order::Dpbf16, Bf16Order::Avx512, Bf16Order::Avx2];
    let mut lens: Vec<usize> = (0..=200).collect();
    lens.extend([255, 256, 257, 576, 896, 1000, 2048, 2880, 4099, 4864]);
    let (mut simd_ran, mut dp_ran, mut orders_differ) = (0, 0, 0);
    for n in lens {
        let w = bf16s(&mut rng, n);
        let a = bf16s(&mut rng, n);
        for tiled in [false, true] {
            let twins = orders.map(|o| vec_dot_bf16_in(o, tiled, &w, &a));
            orders_differ += usize::from(twins[0] != twins[1] || twins[1] != twins[2]);
            for (o, want) in orders.iter().zip(twins) {
                for dp in [false, true] {
                    if let Some(got) = vec_dot_bf16_simd(*o, tiled, dp, &w, &a) {
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{o:?} tiled={tiled} dp={dp} n={n}: {got:e} vs {want:e}"
                        );
                        simd_ran += 1;
                        dp_ran += usize::from(dp);
                    }
                }
            }
        }
        for order in [DotOrder::Single, DotOrder::Tiled, DotOrder::Fast] {
            let want = twin(GgmlType::BF16, order)(&w, &a);
            for k in sets(GgmlType::BF16, order) {
                assert_eq!(
                    (k.dot)(&w, &a).to_bits(),
                    want.to_bits(),
                    "BF16 {order:?} n={n} on {}",
                    k.isa
                );
                let Some(tile) = k.tile else { continue };
                if n == 0 {
                    continue;
                }
                // Up to the tile's weight rows against up to eight tokens (a stride past
                // the row).
                let w2: Vec<u8> = w.iter().chain(&bf16s(&mut rng, 4 * n)).copied().collect();
                let stride = 2 * n + 6;
                for tokens in [1, 3, 4, 5, 8] {
                    let acts: Vec<u8> = (0..tokens)
                        .flat_map(|_| {
                            let mut r = bf16s(&mut rng, n);
                            r.extend([0u8; 6]);
                            r
                        })
                        .collect();
                    for rows in 1..=k.tile_rows {
                        let mut out = vec![0.0f32; rows * tokens];
                        tile(
                            &w2[..rows * 2 * n],
                            rows,
                            &acts,
                            stride,
                            Default::default(),
                            &mut out,
                        );
                        for r in 0..rows {
                            for c in 0..tokens {
                                let one = (k.dot)(
                                    &w2[r * 2 * n..(r + 1) * 2 * n],
                                    &acts[c * stride..c * stride + 2 * n],
                                );
                                assert_eq!(
                                    out[r * tokens + c].to_bits(),
                                    one.to_bits(),
                                    "BF16 {order:?} {} tile n={n} rows={rows} row {r} token {c} of {tokens}",
                                    k.isa
                                );
                            }
                        }
                    }
                }
            }
        }
        let h = |b: &[u8], i: usize| {
            f32::from_bits((u16::from_le_bytes([b[2 * i], b[2 * i + 1]]) as u32) << 16) as f64
        };
        let exact: f64 = (0..n).map(|i| h(&w, i) * h(&a, i)).sum();
        let mag: f64 = (0..n).map(|i| (h(&w, i) * h(&a, i)).abs()).sum();
        for o in orders {
            for tiled in [false, true] {
                let v = vec_dot_bf16_in(o, tiled, &w, &a) as f64;
                assert!(
                    (v - exact).abs() <= mag * 1e-6 + 1e-30,
                    "{o:?} tiled={tiled} n={n}"
                );
            }
        }
    }
    assert!(
        orders_differ > 100,
        "the data hardly tells the orders apart"
    );
    if Isa::Avx2.available() {
        assert!(simd_ran > 0, "no BF16 SIMD kernel ran");
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512bf16") {
        assert!(dp_ran > 0, "vdpbf16ps never ran on a CPU that has it");
    }
    let _ = dp_ran;
}

/// The F32 kernels (`ggml_vec_dot_f32`'s order and tinyBLAS's) against their scalar
/// twins in both flavors, on lengths around every step boundary (the 8-lane flavor steps
/// 32 floats, the 16-lane one 64; tinyBLAS takes whole registers only), and the table's
/// F32 rows, every ISA this CPU has, against the twin in the build's flavor.
#[test]
fn f32_kernels_match_scalar() {
    use quant::formats::float::{vec_dot_f32_in, vec_dot_f32_simd, vec_dot_f32_tiled_in};
    use quant::Flavor;
    let mut rng = StdRng::seed_from_u64(32);
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let mut lens: Vec<usize> = (0..=200).collect();
    lens.extend([255, 256, 257, 576, 1000, 2048, 2880, 4099]);
    let mut simd_ran = 0;
    for n in lens {
        let w = bytes(&random_f32s(&mut rng, n));
        let a = bytes(&random_f32s(&mut rng, n));
        for fl in [Flavor::Avx2, Flavor::Avx512] {
            for tiled in [false, true] {
                let twin = match tiled {
                    false => vec_dot_f32_in(fl, &w, &a),
                    true => vec_dot_f32_tiled_in(fl, &w, &a),
                };
                if let Some(got) = vec_dot_f32_simd(fl, tiled, &w, &a) {
                    simd_ran += 1;
                    assert_eq!(
                        got.to_bits(),
                        twin.to_bits(),
                        "n={n} {fl:?} tiled={tiled}: {got:e} vs {twin:e}"
                    );
                }
            }
        }
        for order in [DotOrder::Single, DotOrder::Tiled] {
            let scalar = twin(GgmlType::F32, order)(&w, &a);
            for k in sets(GgmlType::F32, order) {
                let got = (k.dot)(&w, &a);
                assert_eq!(got.to_bits(), scalar.to_bits(), "n={n} {order:?} {}", k.isa);
            }
        }
    }
    // An x86-64 CPU with AVX2 must have run the 8-lane kernels.
    assert!(simd_ran > 0 || !cfg!(target_arch = "x86_64") || !Isa::Avx2.available());
}

fn random_f16s(rng: &mut StdRng, n: usize) -> Vec<f16> {
    (0..n)
        .map(|_| f16::from_f32(rng.gen_range(-4.0f32..4.0)))
        .collect()
}

const ATTN_LENS: [usize; 17] = [
    0, 1, 3, 7, 8, 9, 15, 16, 24, 31, 32, 33, 64, 100, 128, 129, 1000,
];

#[test]
fn ggml_dot_f16_matches_scalar() {
    use quant::ops::f16::{dot_f16, dot_f16_scalar};
    use quant::{F16Order, Flavor};
    let mut rng = StdRng::seed_from_u64(11);
    for n in ATTN_LENS {
        for _ in 0..8 {
            // The query side is f16-rounded, as attention feeds it (products are exact).
            let a: Vec<f32> = (0..n)
                .map(|_| f16::from_f32(rng.gen_range(-3.0f32..3.0)).to_f32())
                .collect();
            let b = random_f16s(&mut rng, n);
            for fl in [Flavor::Avx2, Flavor::Avx512] {
                for ord in [F16Order::Gemm, F16Order::VecDot] {
                    let scalar = dot_f16_scalar(fl, ord, &a, &b);
                    let got = dot_f16(fl, ord, &a, &b);
                    assert_eq!(
                        got.to_bits(),
                        scalar.to_bits(),
                        "n={n} {fl:?} {ord:?}: {got} vs {scalar}"
                    );
                    // And both are a correct dot product.
                    let exact: f64 = a.iter().zip(&b).map(|(&x, y)| x as f64 * y.to_f64()).sum();
                    let scale: f64 = a
                        .iter()
                        .zip(&b)
                        .map(|(&x, y)| (x as f64 * y.to_f64()).abs())
                        .sum();
                    assert!(
                        (scalar as f64 - exact).abs() <= 1e-5 * scale + 1e-30,
                        "n={n} {fl:?} {ord:?}: {scalar} vs {exact}"
                    );
                }
            }
        }
    }
}

/// Scores of one query against many cache rows (several keys per pass in the GEMM
/// order) carry the bits of one scalar dot per key, times the scale.
#[test]
fn scores_match_one_dot_per_key() {
    use quant::ops::f16::{dot_f16_scalar, scores_f16};
    use quant::{F16Order, Flavor};
    let mut rng = StdRng::seed_from_u64(17);
    for n in [8usize, 16, 24, 64, 100, 128, 256] {
        let stride = 2 * n + 3;
        let n_rows = 23;
        let cache = random_f16s(&mut rng, stride * n_rows);
        let a: Vec<f32> = (0..n)
            .map(|_| f16::from_f32(rng.gen_range(-3.0f32..3.0)).to_f32())
            .collect();
        for n_slots in [0usize, 1, 3, 4, 5, 9, 23] {
            let slots: Vec<usize> = (0..n_slots).map(|_| rng.gen_range(0..n_rows)).collect();
            for fl in [Flavor::Avx2, Flavor::Avx512] {
                for ord in [F16Order::Gemm, F16Order::VecDot] {
                    let mut got = vec![f32::NAN; 2];
                    scores_f16(fl, ord, &a, &cache, &slots, stride, n + 1, 0.125, &mut got);
                    assert_eq!(got.len(), n_slots);
                    for (k, &s) in slots.iter().enumerate() {
                        let at = s * stride + n + 1;
                        let want = dot_f16_scalar(fl, ord, &a, &cache[at..at + n]) * 0.125;
                        assert_eq!(
                            got[k].to_bits(),
                            want.to_bits(),
                            "n={n} slots={n_slots} key {k} {fl:?} {ord:?} ({})",
                            isa::active()
                        );
                    }
                }
            }
        }
    }
}

/// The register-blocked sum over cache rows equals the plain definition (zero, then
/// `out += p * row` per slot in slot order), bit for bit, SIMD and scalar alike.
#[test]
fn sum_rows_match_their_definition() {
    let mut rng = StdRng::seed_from_u64(13);
    for n in [1usize, 7, 8, 31, 32, 64, 72, 96, 136, 256] {
        let stride = n + 5;
        let n_rows = 40;
        let cache = random_f16s(&mut rng, stride * n_rows);
        for n_slots in [0usize, 1, 3, 17, 40] {
            let slots: Vec<usize> = (0..n_slots).map(|_| rng.gen_range(0..n_rows)).collect();
            let ps: Vec<f32> = (0..n_slots).map(|_| rng.gen_range(0.0f32..1.0)).collect();
            let offset = 3;
            let mut want = vec![0.0f32; n];
            for (&p, &s) in ps.iter().zip(&slots) {
                for (i, w) in want.iter_mut().enumerate() {
                    *w += p * cache[s * stride + offset + i].to_f32();
                }
            }
            let mut got = vec![f32::NAN; n];
            sum_rows_f16_scalar(&mut got, &ps, &cache, &slots, stride, offset);
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "scalar n={n}"
            );
            let mut disp = vec![f32::NAN; n];
            sum_rows_f16(&mut disp, &ps, &cache, &slots, stride, offset);
            assert!(
                disp.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "dispatched ({}) n={n} slots={n_slots}",
                isa::active()
            );
        }
    }
}

/// The K-quant kernels in llama.cpp's other orders (tiled GEMM, repacked Q4_K GEMM):
/// SIMD single- and multi-row kernels against their scalar twins, bit for bit, on
/// quantized and raw inputs; and the orders really round differently from each other
/// (so a kernel that ignored its order could not pass).
#[test]
fn ordered_kernels_match_scalar() {
    let mut rng = StdRng::seed_from_u64(12);
    for (ty, order) in ORDERED {
        let aty = vec_dot_type(ty);
        let twin_o = twin(ty, order);
        let single = twin(ty, DotOrder::Single);
        let quantizer = kernels::scalar(ty, order).unwrap();
        let mut differ = 0;
        let mut total = 0;
        for blocks in [1usize, 2, 3, 5, 8, 19] {
            let n = blocks * ty.block_size();
            for trial in 0..6 {
                let w = if trial % 3 == 2 {
                    raw_blocks(&mut rng, ty, blocks)
                } else {
                    quantized(ty, &random_f32s(&mut rng, n), false)
                };
                let rows: Vec<Vec<u8>> = (0..TILE_MAX_TOKENS)
                    .map(|_| {
                        if trial % 3 == 1 {
                            // Raw bytes, within the kernels' contract (no -128 quants).
                            legal_activations(ty, &raw_blocks(&mut rng, aty, blocks))
                        } else {
                            let mut out = vec![0u8; aty.row_bytes(n as u64).unwrap() as usize];
                            let x = random_f32s(&mut rng, n);
                            quantizer.quantize_activations(&x, &mut out).unwrap();
                            out
                        }
                    })
                    .collect();
                let want: Vec<f32> = rows.iter().map(|a| twin_o(&w, a)).collect();
                for (a, &wv) in rows.iter().zip(&want) {
                    total += 1;
                    if single(&w, a).to_bits() != wv.to_bits() {
                        differ += 1;
                    }
                    check_pair(ty, order, n, &w, a, "ordered");
                }
                let buf = rows.concat();
                let stride = rows[0].len();
                // A second weight row (the first reversed block-wise) for two-row tiles.
                let w1: Vec<u8> = w
                    .chunks_exact(ty.type_size())
                    .rev()
                    .flatten()
                    .copied()
                    .collect();
                let want1: Vec<f32> = rows.iter().map(|a| twin_o(&w1, a)).collect();
                let w2 = [w.clone(), w1].concat();
                for k in sets(ty, order) {
                    let Some(tile) = k.tile else {
                        continue;
                    };
                    for c_n in 1..=TILE_MAX_TOKENS {
                        let mut out = vec![f32::NAN; c_n];
                        tile(&w, 1, &buf, stride, ActSide::default(), &mut out);
                        for c in 0..c_n {
                            assert_eq!(
                                out[c].to_bits(),
                                want[c].to_bits(),
                                "{ty} {order:?} {} n={n} k={c_n} c={c}",
                                k.isa
                            );
                        }
                        let mut out = vec![f32::NAN; 2 * c_n];
                        tile(&w2, 2, &buf, stride, ActSide::default(), &mut out);
                        for c in 0..c_n {
                            assert_eq!(
                                (out[c].to_bits(), out[c_n + c].to_bits()),
                                (want[c].to_bits(), want1[c].to_bits()),
                                "{ty} {order:?} {} n={n} 2 rows k={c_n} c={c}",
                                k.isa
                            );
                        }
                    }
                }
            }
        }
        // Q4_K's fast order is its single-row order (llama.cpp's gemv), on packed rows.
        if (ty, order) == (GgmlType::Q4_K, DotOrder::Fast) {
            assert_eq!(
                differ, 0,
                "{ty} {order:?} differs from the single-row order"
            );
        } else {
            assert!(
                differ * 10 >= total,
                "{ty} {order:?}: only {differ}/{total} dots differ from the single-row order"
            );
        }
    }
}

/// The repacked GEMM's Q8_K rounding equals the reference except for the scale's sign
/// when the extreme value occurs with both signs and the negative one comes first.
#[test]
fn q8_k_4x8_quantization() {
    use quant::formats::q8_k::BlockQ8K;
    use quant::Block;
    let mut rng = StdRng::seed_from_u64(13);
    for _ in 0..200 {
        let x = random_f32s(&mut rng, 256);
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let m = BlockQ8K::quantize_4x8(&x);
        if x.contains(&amax) && x.contains(&-amax) && amax > 0.0 {
            assert!(m.d < 0.0);
        } else {
            assert_eq!(m, BlockQ8K::quantize(&x));
        }
    }
    let mut x: Vec<f32> = (0..256).map(|i| (i as f32 * 0.37).sin()).collect();
    x[3] = -2.0;
    x[100] = 2.0;
    let (r, m) = (BlockQ8K::quantize(&x), BlockQ8K::quantize_4x8(&x));
    assert!(r.d > 0.0 && m.d < 0.0, "ref d {} mat d {}", r.d, m.d);
    assert_eq!((r.qs[3], r.qs[100]), (-127, 127));
    assert_eq!((m.qs[3], m.qs[100]), (127, -127));
}

/// llama.cpp's kernel choice for K-quant weights by micro-batch size and token index.
#[test]
fn dot_order_follows_llama_cpp_kernel_choice() {
    use quant::kernels::dot_order_for;
    let (q4, q6, q8) = (GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0);
    assert_eq!(dot_order_for(q4, 640, 1, 0), DotOrder::Single);
    assert_eq!(dot_order_for(q4, 640, 4, 3), DotOrder::Gemm4);
    assert_eq!(dot_order_for(q4, 640, 7, 3), DotOrder::Gemm4);
    assert_eq!(dot_order_for(q4, 640, 7, 4), DotOrder::Single);
    assert_eq!(dot_order_for(q4, 644, 7, 3), DotOrder::Single);
    assert_eq!(dot_order_for(q4, 644, 8, 3), DotOrder::Tiled);
    assert_eq!(dot_order_for(q6, 640, 7, 0), DotOrder::Single);
    assert_eq!(dot_order_for(q6, 640, 8, 7), DotOrder::Tiled);
    assert_eq!(dot_order_for(q8, 640, 64, 0), DotOrder::Single);
    // MXFP4: repacked (gemm and gemv sum alike) wherever the row count allows it.
    let mx = GgmlType::MXFP4;
    for (n, i) in [(1, 0), (2, 1), (4, 3), (7, 6), (64, 5)] {
        assert_eq!(dot_order_for(mx, 2880, n, i), DotOrder::Gemm4);
        assert_eq!(dot_order_for(mx, 2884, n, i), DotOrder::Single);
        // IQ4_NL: the same gemv/gemm templates, the same choice.
        assert_eq!(dot_order_for(GgmlType::IQ4_NL, 2880, n, i), DotOrder::Gemm4);
        assert_eq!(
            dot_order_for(GgmlType::IQ4_NL, 2884, n, i),
            DotOrder::Single
        );
        // Q4_0: repacked (`q4_0_8x8_q8_0`, the same templates) wherever the row count allows.
        assert_eq!(dot_order_for(GgmlType::Q4_0, 576, n, i), DotOrder::Gemm4);
        assert_eq!(dot_order_for(GgmlType::Q4_0, 580, n, i), DotOrder::Single);
    }
}

/// The Q8_0 and Q8_1 activation quantizers (AVX2 where this CPU has it) against their
/// scalar twins, byte for byte: random rows of several scales, an all-zero block, and
/// blocks whose products land exactly on halves (round half to even decides them).
#[test]
fn q8_activation_quantizers_match_scalar() {
    use quant::formats::{q8_0, q8_1};
    let mut rng = StdRng::seed_from_u64(21);
    let mut rows: Vec<Vec<f32>> = (0..300)
        .map(|i| {
            let n = 32 * (1 + i % 9);
            let scale = [1e-3f32, 1.0, 37.0, 1e4][i % 4];
            random_f32s(&mut rng, n).iter().map(|v| v * scale).collect()
        })
        .collect();
    let mut special = vec![0.0f32; 32];
    special.extend((0..32).map(|j| {
        if j == 7 {
            127.0
        } else {
            (j as f32 - 16.0) + 0.5
        }
    }));
    special.extend((0..32).map(|j| if j == 0 { -127.0 } else { 2.5 - j as f32 }));
    rows.push(special);
    let mut ties = 0;
    for x in &rows {
        let nb = x.len() / 32;
        let (mut a, mut b) = (vec![0u8; nb * 34], vec![0u8; nb * 34]);
        q8_0::quantize_activations(x, &mut a);
        q8_0::quantize_activations_scalar(x, &mut b);
        assert_eq!(a, b, "Q8_0 activations, {} values", x.len());
        let (mut a, mut b) = (vec![0u8; nb * 36], vec![0u8; nb * 36]);
        q8_1::quantize_activations(x, &mut a);
        q8_1::quantize_activations_scalar(x, &mut b);
        assert_eq!(a, b, "Q8_1 activations, {} values", x.len());
        ties += x.iter().filter(|v| v.fract().abs() == 0.5).count();
    }
    assert!(ties > 30, "the rows hold products on exact halves");
}
