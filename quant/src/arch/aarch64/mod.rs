//! aarch64 kernels. None yet: every format runs its scalar twin through the table's
//! fallback (`Isa::Neon` falls back to `Isa::Scalar`). NEON kernels add their files here
//! and their rows to [`ROWS`], tested against the twins like the x86 ones
//! (`quant/tests/simd_vs_scalar.rs` walks every row of the table).

use crate::contract::KernelRow;

/// The aarch64 rows of the kernel table.
pub(crate) const ROWS: &[KernelRow] = &[];
