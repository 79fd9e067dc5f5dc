#!/usr/bin/env bash
# Offload on a real NVIDIA GPU, on a machine that has CUDA's compiler and cmake but no Rust
# and no network: our binaries are built elsewhere and carried over with a bundle, and
# ggml's CUDA module (with llama.cpp's llama-bench beside it) is built here from the same
# ggml source our ggml-sys builds (the llama.cpp tree of the llama-cpp-sys-2 package), so
# both engines drive the same libggml-cuda.so.
#
#   tools/cuda_check.sh bundle DIR   (on the development machine) fills DIR with what the
#       GPU machine needs: the portable binaries (x86-64-v3, stripped, xz), the offload
#       test binary, ggml's source tree with llama-bench added (the package trims its
#       tools; llama-bench.cpp comes from llama-cpp-python's vendored llama.cpp, which
#       builds against this tree), and a 2500-conversation cut of ShareGPT.
#   tools/cuda_check.sh build DIR    (on the GPU machine) builds ggml with CUDA for the
#       local GPU's architecture, plus llama-bench, into $CUDA_CHECK_WORK (/tmp/cudacheck).
#   tools/cuda_check.sh run DIR MODEL...   (on the GPU machine) prints `rllama devices`,
#       runs the offload agreement test for smollm2 on CUDA0 when smollm2-135m.gguf is
#       among the models, `rbench -ngl $NGL_SWEEP` (default 0,99; flash attention on
#       the device where it runs, and with FA_COMPARE=1 also -ngl 99 without it) beside
#       `llama-bench -ngl 99 -fa 0,1` for each model, and with SERVE_MODEL set a ShareGPT
#       sweep (chat, --ignore-eos; SERVE_POINTS "concurrency:prompts ...") of
#       `rserve -ngl 99` against `rserve -ngl 0`. Logs go to $OUT when set, else
#       $CUDA_CHECK_WORK/out. DEVICE=CPU runs the same steps on ggml's CPU backend.
set -euo pipefail
cd "$(dirname "$0")/.."
cmd=${1:?usage: tools/cuda_check.sh bundle|build|run DIR [MODEL...]}
dir=${2:?bundle directory}
shift 2
work=${CUDA_CHECK_WORK:-/tmp/cudacheck}
out=${OUT:-$work/out}

case $cmd in
bundle)
    mkdir -p "$dir"
    lab=target/lab/release
    for b in rbench rserve rllama; do
        [ -x "$lab/$b" ] || { echo "no $lab/$b: build the portable binaries first (README)"; exit 1; }
        strip -o "$dir/$b" "$lab/$b" && xz -f -T2 "$dir/$b"
    done
    test_bin=$(ls -t target/lab/release/deps/offload-* 2>/dev/null | grep -v '\.d$' | head -1)
    [ -n "$test_bin" ] || { echo "no offload test binary: RUSTFLAGS=... cargo test --release -p runtime --test offload --no-run into target/lab"; exit 1; }
    strip -o "$dir/offload-test" "$test_bin" && xz -f -T2 "$dir/offload-test"
    sys=$(ls -d ~/.cargo/registry/src/*/llama-cpp-sys-2-0.1.161/llama.cpp | head -1)
    bench_src=$(ls -d ~/.cache/rllama/tools/llama-cpp-python-src/*/vendor/llama.cpp/tools/llama-bench | head -1)
    tmp=$(mktemp -d)
    cp -r "$sys" "$tmp/llama.cpp"
    cp "$bench_src"/{CMakeLists.txt,llama-bench.cpp,main.cpp} "$tmp/llama.cpp/tools/llama-bench/"
    cp "$bench_src"/../perplexity/{CMakeLists.txt,perplexity.cpp,main.cpp} \
        "$tmp/llama.cpp/tools/perplexity/"
    printf 'find_package(Threads REQUIRED)\nllama_add_compile_flags()\nadd_subdirectory(llama-bench)\nadd_subdirectory(perplexity)\n' \
        >"$tmp/llama.cpp/tools/CMakeLists.txt"
    tar -C "$tmp" -cJf "$dir/llama.tar.xz" llama.cpp
    rm -rf "$tmp"
    # The first 2500 conversations of the ShareGPT file (whole entries; the file may be cut
    # off mid-entry, so they are decoded one at a time).
    python3 - "$dir/sharegpt.json" <<'PY'
import json, os, sys
src = os.path.expanduser("~/.cache/rllama/datasets/ShareGPT_V3_unfiltered_cleaned_split.json")
text = open(src, encoding="utf-8").read()
dec, i, out = json.JSONDecoder(), text.index("[") + 1, []
while len(out) < 2500:
    while text[i] in " \n\r\t,":
        i += 1
    entry, i = dec.raw_decode(text, i)
    out.append(entry)
json.dump(out, open(sys.argv[1], "w"))
PY
    xz -f -T2 "$dir/sharegpt.json"
    ls -la "$dir"
    ;;
build)
    mkdir -p "$work"
    rm -rf "$work/llama.cpp"
    tar -C "$work" -xJf "$dir/llama.tar.xz"
    export PATH=/usr/local/cuda/bin:$PATH
    command -v nvcc >/dev/null || { echo "no nvcc (CUDA's compiler) on PATH or in /usr/local/cuda/bin"; exit 1; }
    gen=()
    command -v ninja >/dev/null && gen=(-G Ninja)
    arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.')
    t0=$(date +%s)
    cmake -S "$work/llama.cpp" -B "$work/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -DGGML_CPU=ON -DGGML_NATIVE=OFF \
        -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${arch}-real" -DGGML_CUDA_NCCL=OFF \
        -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_APP=OFF -DGGML_CCACHE=OFF -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON \
        >"$work/cmake.log" 2>&1 || { tail -30 "$work/cmake.log"; exit 1; }
    cmake --build "$work/build" -j"$(nproc)" --target llama-bench llama-perplexity ggml-cpu ggml-cuda \
        >"$work/build.log" 2>&1 || { grep -m20 -B2 -A8 -i 'error' "$work/build.log"; exit 1; }
    grep -E 'CUDA Toolkit|CUDA compiler|Using CUDA architectures' "$work/cmake.log" || true
    echo "built ggml-cuda (sm_${arch}), llama-bench and llama-perplexity in $(($(date +%s) - t0)) s"
    ls "$work/build/bin"
    ;;
run)
    mkdir -p "$work/bin" "$out"
    for b in rbench rserve rllama offload-test; do
        [ -x "$work/bin/$b" ] || xz -dc "$dir/$b.xz" >"$work/bin/$b"
        chmod +x "$work/bin/$b"
    done
    export RLLAMA_GGML_DIR="$work/build/bin"
    # cuBLAS and the CUDA runtime, for libggml-cuda.so, where ld.so is not told of them.
    export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    B=$work/bin
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    "$B/rllama" devices 2>&1 | tee "$out/devices.txt"
    models=("$@")
    for m in "${models[@]}"; do
        if [ "$(basename "$m")" = smollm2-135m.gguf ]; then
            # The offload agreement test reads testdata from the path it was built at.
            mkdir -p /work && [ -e /work/main ] || ln -s "$PWD" /work/main
            mkdir -p "$work/models" && ln -sf "$(realpath "$m")" "$work/models/smollm2-135m.gguf"
            echo "== offload agreement test, smollm2, ${DEVICE:-CUDA0}"
            RLLAMA_MODELS=$work/models RLLAMA_OFFLOAD_TEST_DEVICE=${DEVICE:-CUDA0} timeout 300 \
                "$B/offload-test" --test-threads 1 --nocapture smollm2_offload_agrees \
                decode_reuses_its_graph 2>&1 | grep -v '^$' | tee "$out/offload_test.txt" || true
        fi
    done
    t=$(nproc)
    if [ -z "${NO_PPL:-}" ]; then
        # Perplexity, ours and llama.cpp's on the same libggml-cuda.so, testdata's text in
        # 4 chunks of 256 (as the agreement test), each with flash attention on (ours by
        # default where the device runs it) and off: a gap between ours and llama.cpp's in
        # the same mode is ours; the same value on both is the device's arithmetic. (On
        # ggml's CPU backend, smollm2 -ngl 99: 18.3870 with it, 18.4739 without, for both.
        # On an H200 without it: ours 18.2489, llama.cpp 18.2488.)
        for m in "${models[@]}"; do
            for n in 0 99; do
                ours=""
                for fa in auto 0; do
                    v=$(RLLAMA_OFFLOAD_FA=$fa "$B/rllama" perplexity -m "$m" -f testdata/apache-2.0.txt \
                        -c 256 --chunks 4 -ngl "$n" --device "${DEVICE:-CUDA0}" 2>&1 \
                        | grep -o 'PPL = [0-9.]*' | tail -1)
                    ours="$ours RLLAMA_OFFLOAD_FA=$fa ${v:-?};"
                done
                theirs=""
                for fa in off on; do
                    v=$("$work/build/bin/llama-perplexity" -m "$m" -f testdata/apache-2.0.txt -c 256 \
                        --chunks 4 -b 256 -ngl "$n" -fa $fa 2>&1 | grep -o 'PPL = [0-9.]*' | tail -1)
                    theirs="$theirs fa $fa ${v:-?};"
                done
                echo "perplexity $(basename "$m") -ngl $n: ours$ours llama.cpp$theirs" \
                    | tee -a "$out/perplexity.txt"
            done
        done
    fi
    for m in "${models[@]}"; do
        name=$(basename "$m" .gguf)
        echo "== $name: rbench -ngl 0,half,99 (t=$t) and llama-bench -ngl 99 -fa 0,1"
        timeout 400 "$B/rbench" -m "$m" -ngl "${NGL_SWEEP:-0,99}" --device "${DEVICE:-CUDA0}" -p 512 -n 128 -r 3 -t "$t" \
            2>&1 | tee "$out/rbench_$name.txt" | grep -E '^\||isa|kernels' || true
        if [ -n "${FA_COMPARE:-}" ]; then
            echo "== $name: rbench -ngl 99 with the two-product attention (RLLAMA_OFFLOAD_FA=off)"
            RLLAMA_OFFLOAD_FA=off timeout 400 "$B/rbench" -m "$m" -ngl 99 --device "${DEVICE:-CUDA0}" \
                -p 512 -n 128 -r 3 -t "$t" 2>&1 | tee "$out/rbench_fa_off_$name.txt" | grep -E '^\|' || true
        fi
        timeout 300 "$work/build/bin/llama-bench" -m "$m" -ngl 99 -fa 0,1 -p 512 -n 128 -r 3 \
            -t "$t" 2>&1 | tee "$out/llamabench_$name.txt" | grep -E '^\|' || true
    done
    if [ -n "${SERVE_MODEL:-}" ]; then
        [ -s "$work/sharegpt.json" ] || xz -dc "$dir/sharegpt.json.xz" >"$work/sharegpt.json"
        echo "== ShareGPT sweep: rserve -ngl 99 vs rserve -ngl 0, $SERVE_MODEL"
        for c in ${SERVE_POINTS:-1:16 16:64 64:128}; do
            timeout "${SERVE_TIMEOUT:-120}" "$B/rbench" serve \
                --spawn "gpu=$B/rserve -m $SERVE_MODEL -ngl 99 --device ${DEVICE:-CUDA0} -np 64 -c 2048 --port {port}" \
                --spawn "cpu=$B/rserve -m $SERVE_MODEL -ngl 0 -np 64 -c 2048 --port {port}" \
                --tokenizer-model "$SERVE_MODEL" --dataset "$work/sharegpt.json" --endpoint chat --ignore-eos --num-prompts "${c#*:}" --concurrency "${c%%:*}" \
                --result-file "$out/serve.jsonl" 2>&1 | tee -a "$out/serve.txt" \
                | grep -E '^\[|^Successful|^Failed|duration|^Output token|^Median (TTFT|TPOT)' || true
        done
    fi
    ;;
*)
    echo "unknown command $cmd"
    exit 1
    ;;
esac
