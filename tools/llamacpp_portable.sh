#!/usr/bin/env bash
# Builds llama.cpp's own `llama-bench` and `llama-server` for a portable x86-64-v3 CPU
# (AVX2, FMA, F16C, no AVX-512: what the lab guest emulates), from the llama.cpp vendored
# in the llama-cpp-python 0.3.36 source package (fetched once into the cache), Release,
# GGML_NATIVE=OFF. Prints the directory holding the two binaries.
#
#   bin=$(tools/llamacpp_portable.sh)          # ~/.cache/rllama/tools/llamacpp-x86-64-v3/bin
#   rbench sched --engine "rllama,llamacpp,$bin/llama-bench" --spawn rserve \
#       --spawn "llama-server=$bin/llama-server -m MODEL -t 1 -np 2 -c 4096" ...
#
# LLAMA_CPP_SRC=DIR builds from that checkout instead. The build runs at low priority;
# JOBS sets its parallelism (default: the CPU count).
set -euo pipefail
version=0.3.36
cache="${XDG_CACHE_HOME:-$HOME/.cache}/rllama"
out="$cache/tools/llamacpp-x86-64-v3"
if [ -x "$out/bin/llama-bench" ] && [ -x "$out/bin/llama-server" ] && [ -f "$out/.complete" ]; then
    echo "$out/bin"
    exit 0
fi
src="${LLAMA_CPP_SRC:-}"
if [ -z "$src" ]; then
    pkg="$cache/llama-cpp-python-$version"
    src="$pkg/src/llama_cpp_python-$version/vendor/llama.cpp"
    if [ ! -f "$src/CMakeLists.txt" ]; then
        mkdir -p "$pkg"
        sdist="$pkg/llama_cpp_python-$version.tar.gz"
        if [ ! -f "$sdist" ]; then
            tmp=$(mktemp -d "$pkg/tmp.XXXXXX")
            python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
                "llama-cpp-python==$version" -d "$tmp" >&2
            mv "$tmp/llama_cpp_python-$version.tar.gz" "$sdist"
            rm -rf "$tmp"
        fi
        rm -rf "$pkg/src"
        mkdir -p "$pkg/src"
        tar -xzf "$sdist" -C "$pkg/src" "llama_cpp_python-$version/vendor/llama.cpp"
    fi
fi
[ -d "$src/tools/server" ] || { echo "$src: no llama.cpp with tools/server there" >&2; exit 1; }
command -v cmake >/dev/null || { echo "cmake is needed (apt-get install cmake)" >&2; exit 1; }
build="$out/build"
mkdir -p "$build"
echo "building llama-bench and llama-server (x86-64-v3, Release) from $src into $out" >&2
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
    -DCMAKE_C_FLAGS="-march=x86-64-v3" -DCMAKE_CXX_FLAGS="-march=x86-64-v3" \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON >"$out/cmake.log" 2>&1 ||
    { tail -20 "$out/cmake.log" >&2; exit 1; }
nice -n 10 cmake --build "$build" --target llama-bench llama-server -j "${JOBS:-$(nproc)}" \
    >>"$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log" >&2; exit 1; }
mkdir -p "$out/bin"
cp "$build/bin/llama-bench" "$build/bin/llama-server" "$out/bin/"
touch "$out/.complete"
echo "$out/bin"
