//! Run-time selection of SIMD kernels.
//!
//! Every SIMD kernel here has a scalar twin elsewhere in the crate and returns exactly the
//! same bits: integer sums are computed exactly (their order does not matter), and all
//! float arithmetic is done in the twin's order with the twin's operations (an FMA exactly
//! where the twin uses `mul_add`, never where it multiplies then adds). A model's output therefore does not depend on which
//! kernel ran, and `RLLAMA_FORCE_SCALAR=1` is purely a speed switch.
//!
//! The kernels are compiled with `#[target_feature]` and only handed out after
//! `is_x86_feature_detected!` succeeded, so a binary built for a baseline CPU stays
//! correct (it falls back to the scalar code) and one built with `target-cpu=native`
//! still runs on a CPU without AVX2.

use std::sync::OnceLock;

use crate::{DotFn, DotManyFn, DotOrder, GgmlType};

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;

/// The instruction-set level the kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimdLevel {
    /// The portable scalar reference code.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C kernels.
    Avx2,
}

impl SimdLevel {
    /// `"scalar"` or `"avx2"`.
    pub const fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
        }
    }
}

/// The best level this CPU supports, ignoring `RLLAMA_FORCE_SCALAR` (cached).
pub fn detected() -> SimdLevel {
    static DETECTED: OnceLock<SimdLevel> = OnceLock::new();
    *DETECTED.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c")
            {
                return SimdLevel::Avx2;
            }
        }
        SimdLevel::Scalar
    })
}

/// True when the environment variable asks for the scalar kernels (`1`, `true`, `yes`).
fn force_scalar_from_env() -> bool {
    std::env::var("RLLAMA_FORCE_SCALAR").is_ok_and(|v| {
        let v = v.trim();
        v == "1" || v.eq_ignore_ascii_case("true") || v.eq_ignore_ascii_case("yes")
    })
}

/// The level [`crate::vec_dot`] and [`crate::attn`] use: [`detected`] unless
/// `RLLAMA_FORCE_SCALAR=1` was set when this was first called (read once, then cached).
#[inline]
pub fn active() -> SimdLevel {
    static ACTIVE: OnceLock<SimdLevel> = OnceLock::new();
    *ACTIVE.get_or_init(|| {
        if force_scalar_from_env() {
            SimdLevel::Scalar
        } else {
            detected()
        }
    })
}

/// True when this CPU has AVX-512 VNNI with 256-bit forms (`vpdpbusd` on ymm), which the
/// 32-element-format kernels use to form their exact integer lanes in one instruction.
/// Results are the same bits either way. `RLLAMA_NO_VNNI=1` turns it off (read once).
pub fn vnni() -> bool {
    static VNNI: OnceLock<bool> = OnceLock::new();
    *VNNI.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let off = std::env::var("RLLAMA_NO_VNNI").is_ok_and(|v| v.trim() == "1");
            if !off
                && detected() == SimdLevel::Avx2
                && std::is_x86_feature_detected!("avx512vnni")
                && std::is_x86_feature_detected!("avx512vl")
            {
                return true;
            }
        }
        false
    })
}

/// The AVX2 dot-product kernel for weights of type `ty`, if there is one and this CPU can
/// run it (regardless of `RLLAMA_FORCE_SCALAR`). Same contract as the scalar kernel
/// (weight bytes, activation bytes in `vec_dot_type(ty)`; panics on inconsistent lengths)
/// and bit-identical results. `vnni` asks for the AVX-512 VNNI variant where one exists
/// (None when the CPU lacks it). Meant for tests and benchmarks; use [`crate::vec_dot`].
pub fn avx2_vec_dot(ty: GgmlType, vnni: bool) -> Option<DotFn> {
    avx2_vec_dot_ordered(ty, vnni, DotOrder::Single)
}

/// [`avx2_vec_dot`] for the kernel order `order` (twin: `crate::scalar_vec_dot_ordered_fn`).
pub fn avx2_vec_dot_ordered(ty: GgmlType, vnni: bool, order: DotOrder) -> Option<DotFn> {
    #[cfg(target_arch = "x86_64")]
    {
        if detected() == SimdLevel::Avx2 && (!vnni || self::vnni()) {
            return avx2::vec_dot_kernel(ty, vnni, order);
        }
    }
    let _ = (ty, vnni, order);
    None
}

/// The multi-row AVX2 kernel for weights of type `ty` (see [`crate::DotManyFn`]), as
/// [`avx2_vec_dot`].
pub fn avx2_vec_dot_many(ty: GgmlType, vnni: bool) -> Option<DotManyFn> {
    avx2_vec_dot_many_ordered(ty, vnni, DotOrder::Single)
}

/// [`avx2_vec_dot_many`] for the kernel order `order`.
pub fn avx2_vec_dot_many_ordered(ty: GgmlType, vnni: bool, order: DotOrder) -> Option<DotManyFn> {
    #[cfg(target_arch = "x86_64")]
    {
        if detected() == SimdLevel::Avx2 && (!vnni || self::vnni()) {
            return avx2::vec_dot_many_kernel(ty, vnni, order);
        }
    }
    let _ = (ty, vnni, order);
    None
}

/// The SIMD kernel [`crate::vec_dot`] should use for `ty` at the [`active`] level.
#[inline]
pub(crate) fn active_vec_dot(ty: GgmlType) -> Option<DotFn> {
    active_vec_dot_ordered(ty, DotOrder::Single)
}

/// [`active_vec_dot`] in `order`.
#[inline]
pub(crate) fn active_vec_dot_ordered(ty: GgmlType, order: DotOrder) -> Option<DotFn> {
    match active() {
        SimdLevel::Scalar => None,
        SimdLevel::Avx2 => avx2_vec_dot_ordered(ty, vnni(), order),
    }
}

/// The multi-row kernel for `ty` at the [`active`] level.
#[inline]
pub(crate) fn active_vec_dot_many(ty: GgmlType) -> Option<DotManyFn> {
    active_vec_dot_many_ordered(ty, DotOrder::Single)
}

/// [`active_vec_dot_many`] in `order`.
#[inline]
pub(crate) fn active_vec_dot_many_ordered(ty: GgmlType, order: DotOrder) -> Option<DotManyFn> {
    match active() {
        SimdLevel::Scalar => None,
        SimdLevel::Avx2 => avx2_vec_dot_many_ordered(ty, vnni(), order),
    }
}
