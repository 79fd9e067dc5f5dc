#!/usr/bin/env bash
# Prints a directory holding the chat templates llama.cpp's source package ships
# (`vendor/llama.cpp/models/templates` of llama-cpp-python 0.3.36: the templates of the
# models' own files), extracting them once from the source package into the cache. The
# chat-template comparison with llama.cpp reads them through RLLAMA_CHAT_TEMPLATES:
#
#   RLLAMA_CHAT_TEMPLATES=$(tools/llamacpp_templates.sh) \
#       cargo test --release -p llamacpp-ref --test chat_templates_vs_llamacpp
set -euo pipefail
version=0.3.36
cache="${XDG_CACHE_HOME:-$HOME/.cache}/rllama/llama-cpp-python-$version"
out="$cache/templates"
if [ -f "$out/.complete" ]; then
    echo "$out"
    exit 0
fi
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
sdist=$(ls "$cache"/llama_cpp_python-"$version".tar.gz 2>/dev/null || true)
if [ -z "$sdist" ]; then
    python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
        "llama-cpp-python==$version" -d "$tmp/dl" >&2
    mv "$tmp"/dl/llama_cpp_python-"$version".tar.gz "$cache/"
    sdist="$cache/llama_cpp_python-$version.tar.gz"
fi
tar -xzf "$sdist" -C "$tmp" --wildcards "llama_cpp_python-$version/vendor/llama.cpp/models/templates/*"
rm -rf "$out"
mv "$tmp/llama_cpp_python-$version/vendor/llama.cpp/models/templates" "$out"
touch "$out/.complete"
echo "$out"
