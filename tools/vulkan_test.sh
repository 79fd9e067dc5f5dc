#!/usr/bin/env bash
# Offload on a real non-CPU ggml backend without a GPU: ggml's Vulkan backend on Mesa's
# software Vulkan driver (lavapipe). Installs Debian's Vulkan packages, builds ggml-sys with
# RLLAMA_GGML_BACKENDS=vulkan in its own target dir, checks `rllama devices` finds a Vulkan
# device, and runs runtime/tests/offload.rs with RLLAMA_OFFLOAD_TEST_DEVICE=Vulkan0 (graph
# reuse, out-of-memory; the agreement tests on request, see below) and an rbench -ngl 0,99
# table.
#
# Skipped with the reason, and exit 0, only where it cannot run here: the packages cannot
# be installed, or no Vulkan headers with VK_EXT_layer_settings (which ggml 0.26's Vulkan
# backend uses) can be had: Debian 12's 1.3.239 predate it, so newer ones are fetched.
#
# `--prepare` stops after building ggml's Vulkan module: .ci/run starts that at low priority
# beside the tests (the lab guest leaves a core idle for minutes), and the full run after
# them finds it built.
#
# lavapipe decodes about 150x slower than our CPU path: the agreement tests, when asked for
# (RLLAMA_VULKAN_TEST_MODELS="smollm2 gemma3 qwen2"), run in their quick form
# (RLLAMA_OFFLOAD_TEST_QUICK=1: 4 prompts x 32 tokens, one perplexity chunk, -ngl all).
set -euo pipefail
cd "$(dirname "$0")/.."
prepare=0
[ "${1:-}" = --prepare ] && prepare=1

skip() { echo "SKIPPED: Vulkan offload test: $*"; exit 0; }
# VK_HEADER_VERSION of a vulkan_core.h.
header_version() { sed -n 's/^#define VK_HEADER_VERSION \([0-9]*\).*/\1/p' "$1"; }

pkgs=(mesa-vulkan-drivers libvulkan-dev glslc spirv-headers)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    lock=(-o DPkg::Lock::Timeout=900)
    { apt-get "${lock[@]}" update -q && apt-get "${lock[@]}" install -y -q "${missing[@]}"; } >/tmp/vulkan_test_apt.log 2>&1 \
        || skip "cannot install ${missing[*]} (see /tmp/vulkan_test_apt.log)"
fi
hdr=/usr/include/vulkan/vulkan_core.h
[ -f "$hdr" ] || skip "no $hdr after installing libvulkan-dev"
defines=""
if ! grep -q VK_EXT_layer_settings "$hdr"; then
    # Debian 12's headers (1.3.239) predate VK_EXT_layer_settings. The headers alone come
    # from the next Debian release's libvulkan-dev, unpacked into target/ (the system's
    # loader, libvulkan1, stays: the extension is only asked for where a layer offers it).
    have=$(header_version "$hdr")
    headers="$PWD/target/vulkan-headers"
    if ! grep -qs VK_EXT_layer_settings "$headers/usr/include/vulkan/vulkan_core.h"; then
        apt_dir=$(mktemp -d)
        mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
        # The mirror this machine already uses for Debian 12, with the next release's suite.
        mirror=$(apt-cache policy | awk '$3 ~ /^bookworm\/main$/ {print $2; exit}')
        [ -n "$mirror" ] || skip "the Vulkan headers here (1.3.$have) lack VK_EXT_layer_settings \
and no Debian 12 mirror is configured to fetch newer ones from"
        echo "deb $mirror trixie main" >"$apt_dir/sources.list"
        apt_opts=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o Dir::Etc::sourceparts=-
                  -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache")
        { apt-get "${apt_opts[@]}" update -q &&
          (cd "$apt_dir" && apt-get "${apt_opts[@]}" download libvulkan-dev) &&
          rm -rf "$headers" && mkdir -p "$headers" &&
          dpkg -x "$apt_dir"/libvulkan-dev_*.deb "$headers"; } >/tmp/vulkan_test_headers.log 2>&1 \
            || skip "the Vulkan headers here (1.3.$have) lack VK_EXT_layer_settings, which \
ggml-vulkan of this ggml needs, and newer ones could not be fetched (see /tmp/vulkan_test_headers.log)"
        rm -rf "$apt_dir"
    fi
    grep -qs VK_EXT_layer_settings "$headers/usr/include/vulkan/vulkan_core.h" \
        || skip "the fetched Vulkan headers lack VK_EXT_layer_settings too"
    echo "Vulkan headers: $(header_version "$headers/usr/include/vulkan/vulkan_core.h") from \
$headers (system: 1.3.$have)"
    defines="Vulkan_INCLUDE_DIR=$headers/usr/include"
fi

# Only ggml is built again, with its Vulkan module, in a target dir of its own; the binaries
# and tests of the main build (already built by the README's test command in CI) load it
# from there through RLLAMA_GGML_DIR, as a user points them at another ggml directory.
RLLAMA_GGML_BACKENDS=vulkan GGML_SYS_REQUIRED=1 GGML_SYS_CMAKE_DEFINES="$defines" \
    CARGO_TARGET_DIR="$PWD/target/vulkan" cargo build --release -p ggml-sys
export RLLAMA_GGML_DIR="$PWD/target/vulkan/release/ggml"
[ -f "$RLLAMA_GGML_DIR/libggml-vulkan.so" ] || { echo "FAILED: no libggml-vulkan.so in $RLLAMA_GGML_DIR"; exit 1; }
[ "$prepare" = 1 ] && { echo "prepared: $RLLAMA_GGML_DIR/libggml-vulkan.so"; exit 0; }
# ggml-vulkan passes over CPU-type devices unless they are named: lavapipe is device 0.
export GGML_VK_VISIBLE_DEVICES=0
# `cargo test --no-run` builds the binaries as the README's test command does (a `cargo
# build` would compile runtime, server and bench-cli again: the tests' dev-dependencies
# change their features), so after that command it compiles nothing.
cargo test --release --workspace --all-features --no-run
devices=$(target/release/rllama devices)
echo "$devices"
echo "$devices" | grep -Eq '^Vulkan +Vulkan0 ' \
    || { echo "FAILED: rllama devices lists no Vulkan device"; exit 1; }
# Our offload graph on the Vulkan device (runtime/tests/offload.rs): prefill and decode
# with graph reuse, the out-of-memory message, and the agreement bars (top-1 >= 95% on the
# CPU path's greedy tokens; perplexity within 0.5% of the CPU path or, for a device that
# multiplies in floating point, of the same weights evaluated in f32) in their quick form.
# smollm2 by default (about 4 minutes on lavapipe); RLLAMA_VULKAN_TEST_MODELS="smollm2
# gemma3 qwen2" runs all three (over 10 minutes each), RLLAMA_VULKAN_TEST_MODELS="" none.
filters=(decode_reuses_its_graph out_of_device_memory)
# Set but empty: none (CI's short form: lavapipe's agreement run takes minutes).
for m in ${RLLAMA_VULKAN_TEST_MODELS-smollm2}; do filters+=("${m}_offload_agrees"); done
RLLAMA_OFFLOAD_TEST_DEVICE=Vulkan0 RLLAMA_OFFLOAD_TEST_QUICK=${RLLAMA_OFFLOAD_TEST_QUICK:-1} \
    cargo test --release --workspace --all-features --test offload -- \
    --nocapture --test-threads 1 "${filters[@]}"
# The table: ours on the CPU beside ours with every layer on lavapipe (speed there is not
# the point: lavapipe is a CPU rasterizer behind a GPU API).
target/release/rbench -m smollm2-135m -ngl 0,99 -dev Vulkan0 -p 16 -n 4 \
    -r "${RLLAMA_VULKAN_BENCH_REPS:-2}" -t "$(nproc)"
