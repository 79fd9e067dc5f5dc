//! The scale searches behind ggml's K-quant reference quantizers (`make_qx_quants`,
//! `make_q3_quants`, `make_qkx2_quants`) and the 6-bit scale packing shared by Q4_K/Q5_K.
//!
//! Every float expression keeps ggml's evaluation order (C evaluates `a*b*c` as `(a*b)*c`
//! and converts `int` operands to float at the operator), because a one-ulp difference in
//! a running error sum can flip which candidate scale wins.

use super::common::{nearest_int, QK_K};
use crate::f16::{f16_to_f32, f32_to_f16};

/// Groups whose largest magnitude is below this are treated as all-zero.
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// `make_qx_quants`: symmetric quantization of `x` onto `-nmax..nmax-1` (stored offset by
/// `nmax` in `l`), refining the scale with a weighted least-squares search over 18
/// perturbed inverse scales. `rmse_type` picks the weight (1: x², 2: 1, 3: |x|,
/// otherwise √|x|) unless `qw` is given; 0 skips the search, negative returns early.
pub(crate) fn make_qx_quants(
    nmax: i32,
    x: &[f32],
    l: &mut [i8],
    rmse_type: i32,
    qw: Option<&[f32]>,
) -> f32 {
    let n = x.len();
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l[..n].fill(0);
        return 0.0;
    }
    let mut iscale = -(nmax as f32) / max;
    if rmse_type == 0 {
        for i in 0..n {
            let li = nearest_int(iscale * x[i]);
            l[i] = (nmax + li.clamp(-nmax, nmax - 1)) as i8;
        }
        return 1.0 / iscale;
    }
    let (rmse_type, return_early) = if rmse_type < 0 {
        (-rmse_type, true)
    } else {
        (rmse_type, false)
    };
    let weight = |i: usize| -> f32 {
        match qw {
            Some(w) => w[i],
            None => match rmse_type {
                1 => x[i] * x[i],
                2 => 1.0,
                3 => x[i].abs(),
                _ => x[i].abs().sqrt(),
            },
        }
    };
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let li = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l[i] = (li + nmax) as i8;
        let w = weight(i);
        let lf = li as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    if return_early {
        return if suml2 > 0.0 {
            0.5 * (scale + 1.0 / iscale)
        } else {
            1.0 / iscale
        };
    }
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1f32 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for i in 0..n {
            let li = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1) as f32;
            let w = weight(i);
            sumlx += w * x[i] * li;
            suml2 += w * li * li;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                let li = nearest_int(iscale * x[i]);
                l[i] = (nmax + li.clamp(-nmax, nmax - 1)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `make_q3_quants`: symmetric quantization onto `-nmax..nmax-1` (stored offset by `nmax`)
/// with x²-weighted coordinate-descent refinement of individual quants when `do_rmse`.
pub(crate) fn make_q3_quants(nmax: i32, x: &[f32], l: &mut [i8], do_rmse: bool) -> f32 {
    let n = x.len();
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l[..n].fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    if do_rmse {
        let mut sumlx = 0.0f32;
        let mut suml2 = 0.0f32;
        for i in 0..n {
            let li = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
            l[i] = li as i8;
            let w = x[i] * x[i];
            let lf = li as f32;
            sumlx += w * x[i] * lf;
            suml2 += w * lf * lf;
        }
        for _ in 0..5 {
            let mut n_changed = 0;
            for i in 0..n {
                let w = x[i] * x[i];
                let li = l[i] as f32;
                let mut slx = sumlx - w * x[i] * li;
                if slx > 0.0 {
                    let mut sl2 = suml2 - w * li * li;
                    let new_l = nearest_int(x[i] * sl2 / slx).clamp(-nmax, nmax - 1);
                    if new_l != l[i] as i32 {
                        let nl = new_l as f32;
                        slx += w * x[i] * nl;
                        sl2 += w * nl * nl;
                        if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                            l[i] = new_l as i8;
                            sumlx = slx;
                            suml2 = sl2;
                            n_changed += 1;
                        }
                    }
                }
            }
            if n_changed == 0 {
                break;
            }
        }
        for v in l[..n].iter_mut() {
            *v += nmax as i8;
        }
        return if suml2 > 0.0 { sumlx / suml2 } else { 0.0 };
    }
    for i in 0..n {
        let li = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l[i] = (li + nmax) as i8;
    }
    1.0 / iscale
}

/// `make_qkx2_quants`: asymmetric quantization `x ≈ scale*l - the_min` onto `0..=nmax`,
/// searching `nstep + 1` inverse scales around `nmax / (max - min)` and keeping the
/// weighted least-squares fit with the smallest weighted error (|err| when `use_mad`).
/// Returns `(scale, the_min)`; `the_min` is stored as a positive offset.
#[allow(clippy::too_many_arguments)]
pub(crate) fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let mut laux = [0u8; 32];
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l[..n].fill(0);
        return (0.0, -min);
    }
    let nmaxf = nmax as f32;
    let mut iscale = nmaxf / (max - min);
    let mut scale = 1.0 / iscale;
    let err = |diff: f32| if use_mad { diff.abs() } else { diff * diff };
    let mut best_error = 0.0f32;
    for i in 0..n {
        let li = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = li as u8;
        let diff = scale * li as f32 + min - x[i];
        best_error += weights[i] * err(diff);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmaxf) / (max - min);
        let mut sum_l = 0.0f32;
        let mut sum_l2 = 0.0f32;
        let mut sum_xl = 0.0f32;
        for i in 0..n {
            let li = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = li as u8;
            let w = weights[i];
            let lf = li as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                l[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8) from the 12-byte
/// Q4_K/Q5_K layout (low 6 bits of bytes 0..8 for j < 4, nibbles plus top bits otherwise).
#[inline(always)]
pub fn get_scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Inverse of [`get_scale_min_k4`] for 8 pairs of 6-bit values.
pub(crate) fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            s[j] = ls[j];
            s[j + 4] = lm[j];
        } else {
            s[j + 4] = (ls[j] & 0x0f) | ((lm[j] & 0x0f) << 4);
            s[j - 4] |= (ls[j] >> 4) << 6;
            s[j] |= (lm[j] >> 4) << 6;
        }
    }
    s
}

/// A Q4_K/Q5_K super-block fitted by [`fit_scales_mins`]: f16 bits of `d` and `dmin`, the
/// packed 6-bit scales and mins, and the quants (`0..=nmax`) against the rounded scales.
pub(crate) struct ScalesMins {
    pub d: u16,
    pub dmin: u16,
    pub scales: [u8; 12],
    pub quants: [u8; QK_K],
}

/// What `quantize_row_q4_K_ref` and `quantize_row_q5_K_ref` share (they differ in `nmax`
/// and the search, `rmin` and `nstep`): per 32-element sub-block a `make_qkx2_quants` fit
/// weighted by `rms + |x|`, the scales and mins quantized to 6 bits against their maxima,
/// then every sub-block requantized against its rounded scale and min.
pub(crate) fn fit_scales_mins(x: &[f32], nmax: i32, rmin: f32, nstep: i32) -> ScalesMins {
    let mut l = [0u8; QK_K];
    let mut mins = [0.0f32; 8];
    let mut scales = [0.0f32; 8];
    let mut weights = [0.0f32; 32];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (s, m) = make_qkx2_quants(
            nmax,
            xs,
            &weights,
            &mut l[32 * j..32 * j + 32],
            rmin,
            0.1,
            nstep,
            false,
        );
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for j in 0..8 {
        // `uint8_t ls = nearest_int(..)` wraps before the clamp, as in ggml.
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    let d = f32_to_f16(max_scale / 63.0);
    let dmin = f32_to_f16(max_min / 63.0);
    let packed = pack_scale_min_k4(&ls, &lm);
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, &packed);
        let dj = f16_to_f32(d) * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = f16_to_f32(dmin) * m as f32;
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / dj).clamp(0, nmax) as u8;
        }
    }
    ScalesMins {
        d,
        dmin,
        scales: packed,
        quants: l,
    }
}
