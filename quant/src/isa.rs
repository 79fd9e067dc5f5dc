//! Instruction sets: what this CPU can run, and which level the kernels use.
//!
//! Kernels are compiled with `#[target_feature]` and only handed out for an ISA that was
//! detected at run time, so a binary built for a baseline CPU stays correct (it falls back
//! to the scalar code) and one built with `target-cpu=native` still never runs an
//! instruction the CPU lacks. Every kernel returns its scalar twin's bits, so the level is
//! purely a speed choice; [`configure`] can lower it for testing and comparison (the
//! runtime's run options pass the environment's requests, `runtime::options`):
//!
//! - `RLLAMA_SIMD=scalar|avx2|avx-vnni|avx2-vnni|avx512|neon|neon-dotprod`: the highest
//!   level to use (a level the CPU lacks is refused with a message, and the detected one
//!   is kept);
//! - `RLLAMA_FORCE_SCALAR=1`: the scalar code only (same as `RLLAMA_SIMD=scalar`);
//! - `RLLAMA_NO_VNNI=1`: nothing above plain AVX2.
//!
//! The level is fixed the first time a kernel is picked.

use std::sync::OnceLock;

/// An instruction-set level kernels are written for. Each architecture's levels are
/// ordered (x86-64: `Avx2 < AvxVnni < Avx2Vnni < Avx512`; aarch64: `Neon < NeonDotprod`)
/// and sit above `Scalar`: a CPU at one level runs the kernels of every lower level of its
/// own architecture that it has and the scalar code. Only `AvxVnni` can be missing below a
/// CPU's level (AVX-512 VNNI without the VEX form: Ice Lake, Zen 4); the fallback walk
/// ([`Isa::fallbacks`]) skips it there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// The portable scalar reference code (every kernel's twin).
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// AVX2 kernels that form their integer lanes with the VEX `vpdpbusd` (AVX-VNNI):
    /// Alder Lake to Arrow Lake laptops and desktops, which lack AVX-512. Some of
    /// `Avx2Vnni`'s kernels (those that beat AVX2 in 16 registers), encoded without EVEX.
    AvxVnni,
    /// AVX2 kernels that form their integer lanes with `vpdpbusd` on 256-bit registers
    /// (AVX-512 VNNI + VL).
    Avx2Vnni,
    /// AVX-512 F, BW, DQ and VL on 512-bit registers, with VNNI (so above `Avx2Vnni`:
    /// Ice Lake, Sapphire Rapids, Zen 4 and later; a Skylake-X without VNNI runs `Avx2`).
    Avx512,
    /// aarch64 Advanced SIMD (every aarch64 CPU has it).
    Neon,
    /// NEON plus the `sdot` 8-bit dot product (FEAT_DotProd, optional from Armv8.2-A).
    NeonDotprod,
}

impl Isa {
    /// Every level, lowest first.
    pub const ALL: [Isa; 7] = [
        Isa::Scalar,
        Isa::Avx2,
        Isa::AvxVnni,
        Isa::Avx2Vnni,
        Isa::Avx512,
        Isa::Neon,
        Isa::NeonDotprod,
    ];

    /// `"scalar"`, `"avx2"`, `"avx-vnni"`, `"avx2-vnni"`, `"avx512"`, `"neon"` or
    /// `"neon-dotprod"`.
    pub const fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avx-vnni",
            Isa::Avx2Vnni => "avx2-vnni",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
            Isa::NeonDotprod => "neon-dotprod",
        }
    }

    /// Which architecture the level belongs to (0: none, the scalar code).
    const fn arch(self) -> u8 {
        match self {
            Isa::Scalar => 0,
            Isa::Avx2 | Isa::AvxVnni | Isa::Avx2Vnni | Isa::Avx512 => 1,
            Isa::Neon | Isa::NeonDotprod => 2,
        }
    }

    /// The level named `s` (as [`Isa::name`] spells it; `avxvnni`, `avx2vnni` and `vnni`,
    /// `dotprod` also work).
    pub fn parse(s: &str) -> Option<Isa> {
        Some(match s.trim().to_ascii_lowercase().as_str() {
            "scalar" => Isa::Scalar,
            "avx2" => Isa::Avx2,
            "avx-vnni" | "avxvnni" => Isa::AvxVnni,
            "avx2-vnni" | "avx2vnni" | "vnni" => Isa::Avx2Vnni,
            "avx512" | "avx-512" => Isa::Avx512,
            "neon" => Isa::Neon,
            "neon-dotprod" | "neondotprod" | "dotprod" => Isa::NeonDotprod,
            _ => return None,
        })
    }

    /// Whether this CPU can run kernels written for `self` (cached detection).
    pub fn available(self) -> bool {
        features().has(self)
    }

    /// Whether a CPU at level `self` runs kernels written for `other`: scalar, and the
    /// levels of its own architecture up to itself.
    pub fn includes(self, other: Isa) -> bool {
        other == Isa::Scalar || (self.arch() == other.arch() && other <= self)
    }

    /// The levels whose kernels a CPU at `self` may use, best first, each available here:
    /// where a kernel table has no entry for one level the next is tried.
    pub fn fallbacks(self) -> impl Iterator<Item = Isa> {
        Isa::ALL
            .into_iter()
            .rev()
            .filter(move |&o| self.includes(o) && o.available())
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What the CPU reports, read once.
#[derive(Clone, Copy, Debug, Default)]
struct Features {
    avx2: bool,
    /// AVX-VNNI (the VEX `vpdpbusd`).
    avx_vnni: bool,
    /// AVX-512 VNNI with VL (`vpdpbusd` on ymm, EVEX).
    vnni: bool,
    avx512: bool,
    neon: bool,
    dotprod: bool,
}

impl Features {
    fn has(self, isa: Isa) -> bool {
        match isa {
            Isa::Scalar => true,
            Isa::Avx2 => self.avx2,
            Isa::AvxVnni => self.avx2 && self.avx_vnni,
            Isa::Avx2Vnni => self.avx2 && self.vnni,
            Isa::Avx512 => self.avx2 && self.vnni && self.avx512,
            Isa::Neon => self.neon,
            Isa::NeonDotprod => self.neon && self.dotprod,
        }
    }
}

fn features() -> Features {
    static F: OnceLock<Features> = OnceLock::new();
    *F.get_or_init(|| {
        #[allow(unused_mut)]
        let mut f = Features::default();
        #[cfg(target_arch = "x86_64")]
        {
            use std::is_x86_feature_detected as has;
            f.avx2 = has!("avx2") && has!("fma") && has!("f16c");
            f.avx_vnni = has!("avxvnni");
            f.vnni = has!("avx512vnni") && has!("avx512vl");
            f.avx512 = has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl");
        }
        #[cfg(target_arch = "aarch64")]
        {
            use std::arch::is_aarch64_feature_detected as has;
            f.neon = has!("neon");
            // Linux reports it through HWCAP_ASIMDDP: a CPU (or emulator) without it never
            // gets a kernel that executes `sdot`.
            f.dotprod = has!("dotprod");
        }
        f
    })
}

/// The best level this CPU supports, ignoring the environment.
pub fn detected() -> Isa {
    Isa::ALL
        .into_iter()
        .rev()
        .find(|i| i.available())
        .unwrap_or(Isa::Scalar)
}

/// The level to use given the detected one, which levels this CPU has, and the
/// environment's requests (pure, for tests): the message is for a request this CPU cannot
/// honour.
fn choose(
    detected: Isa,
    has: impl Fn(Isa) -> bool,
    simd: Option<&str>,
    force_scalar: bool,
    no_vnni: bool,
) -> (Isa, Option<String>) {
    if force_scalar {
        return (Isa::Scalar, None);
    }
    let mut level = detected;
    let mut warning = None;
    if let Some(s) = simd.filter(|s| !s.trim().is_empty()) {
        match Isa::parse(s) {
            Some(want) if detected.includes(want) && has(want) => level = want,
            Some(want) => {
                warning = Some(format!(
                    "RLLAMA_SIMD={s}: this CPU cannot run {want} kernels (it has {detected}); \
                     using {detected}"
                ))
            }
            None => {
                warning = Some(format!(
                    "RLLAMA_SIMD={s}: unknown level (scalar, avx2, avx-vnni, avx2-vnni, \
                     avx512, neon, neon-dotprod); using {detected}"
                ))
            }
        }
    }
    if no_vnni && level.arch() == Isa::Avx2.arch() && level > Isa::Avx2 {
        level = Isa::Avx2;
    }
    (level, warning)
}

/// Requests that lower the kernels' level below the detected one (the runtime's run
/// options pass them from `RLLAMA_SIMD`, `RLLAMA_FORCE_SCALAR`, `RLLAMA_NO_VNNI`; this
/// crate reads no environment).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    /// A level by name (`scalar`, `avx2`, ...): used when this CPU has it.
    pub simd: Option<String>,
    pub force_scalar: bool,
    /// Stay on plain AVX2 where the level would add VNNI.
    pub no_vnni: bool,
}

static ACTIVE: OnceLock<Isa> = OnceLock::new();

/// Sets the level from `o` before the kernels first run; returns a warning for a request
/// this CPU cannot honour. After the first use of [`active`] the level is fixed: a later
/// call changes nothing and says so.
pub fn configure(o: Overrides) -> Option<String> {
    let (isa, warning) = choose(
        detected(),
        Isa::available,
        o.simd.as_deref(),
        o.force_scalar,
        o.no_vnni,
    );
    match ACTIVE.set(isa) {
        Ok(()) => warning,
        Err(_) if *ACTIVE.get().expect("set") == isa => warning,
        Err(_) => Some(format!(
            "kernel level {isa} asked for after the kernels chose {}; keeping {}",
            active(),
            active()
        )),
    }
}

/// The level the kernels use: [`detected`], unless [`configure`] lowered it before the
/// first use (then fixed).
#[inline]
pub fn active() -> Isa {
    *ACTIVE.get_or_init(detected)
}

/// Whether the f32/f16 helpers may use AVX2, FMA and F16C (the active level includes
/// AVX2). Their results are the same bits either way.
#[inline]
pub fn avx2() -> bool {
    active().includes(Isa::Avx2)
}

/// Whether the f32/f16 helpers may use NEON (the active level includes it). Their results
/// are the same bits either way.
#[inline]
pub fn neon() -> bool {
    active().includes(Isa::Neon)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_include_lower_ones() {
        assert!(Isa::Avx512.includes(Isa::Avx2Vnni));
        assert!(Isa::Avx2Vnni.includes(Isa::Avx2));
        assert!(Isa::Avx2Vnni.includes(Isa::AvxVnni));
        assert!(Isa::AvxVnni.includes(Isa::Avx2));
        assert!(!Isa::AvxVnni.includes(Isa::Avx2Vnni));
        assert!(!Isa::NeonDotprod.includes(Isa::AvxVnni));
        assert!(Isa::Avx2.includes(Isa::Scalar));
        assert!(!Isa::Avx2.includes(Isa::Avx2Vnni));
        assert!(Isa::Neon.includes(Isa::Scalar));
        assert!(!Isa::Neon.includes(Isa::Avx2));
        assert!(!Isa::Avx512.includes(Isa::Neon));
        assert!(Isa::NeonDotprod.includes(Isa::Neon));
        assert!(Isa::NeonDotprod.includes(Isa::Scalar));
        assert!(!Isa::Neon.includes(Isa::NeonDotprod));
        assert!(!Isa::NeonDotprod.includes(Isa::Avx512));
        assert!(!Isa::Avx512.includes(Isa::NeonDotprod));
        assert_eq!(Isa::parse("dotprod"), Some(Isa::NeonDotprod));
        for i in Isa::ALL {
            assert_eq!(Isa::parse(i.name()), Some(i));
        }
    }

    #[test]
    fn fallbacks_end_in_scalar_and_are_available() {
        for i in Isa::ALL {
            let chain: Vec<Isa> = i.fallbacks().collect();
            assert_eq!(chain.last(), Some(&Isa::Scalar), "{i}");
            assert!(chain.iter().all(|c| c.available() && i.includes(*c)));
            assert!(chain.windows(2).all(|w| w[0] != w[1]));
        }
        assert!(detected().available());
    }

    #[test]
    fn environment_requests() {
        use Isa::*;
        let all = |_: Isa| true;
        assert_eq!(choose(Avx512, all, None, false, false), (Avx512, None));
        assert_eq!(
            choose(Avx512, all, Some("avx2"), false, false),
            (Avx2, None)
        );
        assert_eq!(
            choose(Avx512, all, Some("AVX2-VNNI"), false, false),
            (Avx2Vnni, None)
        );
        assert_eq!(choose(Avx512, all, None, true, false), (Scalar, None));
        assert_eq!(choose(Avx512, all, None, false, true), (Avx2, None));
        assert_eq!(choose(Neon, all, None, false, true), (Neon, None));
        assert_eq!(
            choose(NeonDotprod, all, None, false, true),
            (NeonDotprod, None)
        );
        assert_eq!(
            choose(NeonDotprod, all, Some("neon"), false, false),
            (Neon, None)
        );
        assert_eq!(
            choose(NeonDotprod, all, Some("scalar"), false, false),
            (Scalar, None)
        );
        let (l, w) = choose(Neon, all, Some("neon-dotprod"), false, false);
        assert_eq!(l, Neon);
        assert!(w.unwrap().contains("cannot run neon-dotprod"));
        let (l, w) = choose(Avx2, all, Some("avx512"), false, false);
        assert_eq!(l, Avx2);
        assert!(w.unwrap().contains("cannot run avx512"));
        // A Zen 4 (AVX-512 VNNI, no AVX-VNNI) refuses the VEX level and keeps its own.
        let zen4 = |i: Isa| i != AvxVnni;
        let (l, w) = choose(Avx512, zen4, Some("avx-vnni"), false, false);
        assert_eq!(l, Avx512);
        assert!(w.unwrap().contains("cannot run avx-vnni"));
        assert_eq!(
            choose(Avx512, all, Some("avxvnni"), false, false),
            (AvxVnni, None)
        );
        assert_eq!(choose(AvxVnni, all, None, false, true), (Avx2, None));
        let (l, w) = choose(AvxVnni, all, Some("avx2-vnni"), false, false);
        assert_eq!(l, AvxVnni);
        assert!(w.unwrap().contains("cannot run avx2-vnni"));
        let (l, w) = choose(Avx2, all, Some("sse9"), false, false);
        assert_eq!(l, Avx2);
        assert!(w.unwrap().contains("unknown level"));
    }
}
