#!/usr/bin/env bash
# Tests the quant crate's aarch64 (NEON) kernels on an x86-64 Debian bookworm machine:
# Debian's aarch64 Rust std and cross linker build the tests, QEMU user mode runs them.
# The suite runs twice, on two emulated CPUs, so that both kernel levels are proven
# against the scalar twins:
#   -cpu max         every extension (sdot, i8mm): the plain NEON and the dotprod rows;
#   -cpu cortex-a57  Armv8.0 without sdot: only the plain NEON rows may run (executing an
#                    `sdot` there is SIGILL, so wrong detection fails loudly).
#
# Usage: tools/neon_test.sh [--clippy | --prepare]   (--clippy also lints quant for
# aarch64; --prepare installs and builds only: .ci/run starts it at low priority beside the
# tests, and the full run after them finds the tests built)
# Installs the packages it needs when they are missing (root, or sudo). The build goes
# to target/aarch64 so the host's target/ is not invalidated.
set -euo pipefail
cd "$(dirname "$0")/.."

clippy=0
prepare=0
for arg in "$@"; do
    case "$arg" in
        --clippy) clippy=1 ;;
        --prepare) prepare=1 ;;
        *)
            echo "usage: $0 [--clippy | --prepare]" >&2
            exit 2
            ;;
    esac
done

# rustc-web is Debian's Rust 1.96 with a matching aarch64 std (rustup's toolchain has no
# aarch64 std here); its libc6:arm64 dependency gives QEMU the dynamic loader, so no -L.
pkgs=(rustc-web libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)
[ "$clippy" = 1 ] && pkgs+=(rust-web-clippy)
missing=()
for p in "${pkgs[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    echo "neon_test: installing ${missing[*]}" >&2
    if ! dpkg --print-foreign-architectures | grep -qx arm64; then
        "${sudo[@]}" dpkg --add-architecture arm64
    fi
    apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=900)
    "${apt[@]}" update
    "${apt[@]}" install -y --no-install-recommends "${missing[@]}"
fi

export RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
# A baseline Armv8 build (the repository's rustflags are for x86-64 only), whose kernels
# pick their level at run time.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-cpu=generic"
export CARGO_TARGET_DIR="$PWD/target/aarch64"
target=aarch64-unknown-linux-gnu

if [ "$clippy" = 1 ]; then
    # Debian's cargo-clippy drives its clippy-driver with the rustc above.
    /usr/bin/cargo-clippy clippy --locked -p quant --target "$target" --all-targets -- -D warnings
fi

cargo test --locked -p quant --target "$target" --no-run
[ "$prepare" = 1 ] && { echo "neon_test: prepared (tests built in $CARGO_TARGET_DIR)"; exit 0; }

log=$(mktemp)
trap 'rm -f "$log"' EXIT
summary=()
# QUANT_EXPECT_ISA makes the suite fail if the emulated CPU is not the level meant.
for run in "max neon-dotprod" "cortex-a57 neon"; do
    read -r cpu isa <<<"$run"
    echo "neon_test: qemu-aarch64 -cpu $cpu (expects $isa)" >&2
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -cpu $cpu" \
        QUANT_EXPECT_ISA="$isa" \
        cargo test --locked -p quant --target "$target" 2>&1 | tee "$log"
    passed=$(awk '/^test result:/ { n += $4 } END { print n + 0 }' "$log")
    summary+=("-cpu $cpu ($isa): $passed tests passed")
done
printf 'neon_test: %s\n' "${summary[@]}"
