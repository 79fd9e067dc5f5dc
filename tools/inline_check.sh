#!/usr/bin/env bash
# Fails when a binary holds x86 SIMD intrinsics, or closures of our kernels, compiled out
# of line. Code outside a `#[target_feature]` function cannot inline an intrinsic of a
# feature the build's baseline lacks; in the portable build (`x86-64-v3`) that happened
# to AVX-512 and VNNI intrinsics inside closures that `core::array::from_fn` (or a
# closure called twice) kept out of line: each intrinsic became a call with its vectors
# passed through memory (ARCHITECTURE.md, "Intrinsics in the portable build"). The
# native build hides such a slip (its baseline has every feature), so
# `.ci/run` checks the portable one.
#
#   tools/inline_check.sh target/lab/release/rbench
set -euo pipefail
bin=${1:?usage: tools/inline_check.sh BINARY}
[ -f "$bin" ] || { echo "inline check: no such binary: $bin" >&2; exit 2; }
syms=$(nm -C "$bin") || { echo "inline check: nm failed on $bin" >&2; exit 2; }
bad=$(awk '$2 ~ /^[tT]$/ { $1 = ""; $2 = ""; print substr($0, 3) }' <<<"$syms" |
    grep -E '^core::core_arch::x86::|^quant::arch::.*\{\{closure\}\}' |
    grep -vE '^core::core_arch::x86::(xsave::_xgetbv|cpuid::)' | sort -u || true)
if [ -n "$bad" ]; then
    echo "inline check FAILED: $bin calls these out of line (each a call per use in a kernel):" >&2
    echo "$bad" | sed 's/^/  /' >&2
    echo "Build arrays with quant's arch::x86::simd::arr (not core::array::from_fn) and keep" >&2
    echo "AVX-512/VNNI intrinsics out of closures that are called from more than one place." >&2
    exit 1
fi
echo "inline check: no out-of-line intrinsics or kernel closures in $bin"
