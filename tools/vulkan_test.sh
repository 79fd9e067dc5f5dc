#!/usr/bin/env bash
# Offload on a real non-CPU ggml backend without a GPU: ggml's Vulkan backend on Mesa's
# software Vulkan driver (lavapipe). Installs Debian's Vulkan packages, builds ggml-sys with
# RLLAMA_GGML_BACKENDS=vulkan in its own target dir, checks `rllama devices` finds a Vulkan
# device, and runs runtime/tests/offload.rs with RLLAMA_OFFLOAD_TEST_DEVICE=Vulkan0 (three
# models, -ngl half and all: top-1 agreement with the CPU path and perplexity).
#
# Skipped with the reason, and exit 0, only where it cannot run here: the packages cannot
# be installed, or their Vulkan headers lack what ggml-vulkan needs (Debian 12's 1.3.239
# predates VK_EXT_layer_settings, which ggml 0.26's Vulkan backend uses).
set -euo pipefail
cd "$(dirname "$0")/.."

skip() { echo "SKIPPED: Vulkan offload test: $*"; exit 0; }

pkgs=(mesa-vulkan-drivers libvulkan-dev glslc spirv-headers)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -q && apt-get install -y -q "${missing[@]}"; } >/tmp/vulkan_test_apt.log 2>&1 \
        || skip "cannot install ${missing[*]} (see /tmp/vulkan_test_apt.log)"
fi
hdr=/usr/include/vulkan/vulkan_core.h
[ -f "$hdr" ] || skip "no $hdr after installing libvulkan-dev"
have=$(sed -n 's/^#define VK_HEADER_VERSION \([0-9]*\).*/\1/p' "$hdr")
if ! grep -q VK_EXT_layer_settings "$hdr"; then
    skip "the Vulkan headers installed here (1.3.$have) lack VK_EXT_layer_settings, which \
ggml-vulkan of this ggml needs (headers 1.3.261 or newer)"
fi

export RLLAMA_GGML_BACKENDS=vulkan GGML_SYS_REQUIRED=1
export CARGO_TARGET_DIR="$PWD/target/vulkan"
cargo build --release -p rllama
devices=$("$CARGO_TARGET_DIR/release/rllama" devices)
echo "$devices"
echo "$devices" | grep -q '^Vulkan ' || { echo "FAILED: rllama devices lists no Vulkan device"; exit 1; }
RLLAMA_OFFLOAD_TEST_DEVICE=Vulkan0 cargo test --release -p runtime --test offload -- --nocapture
