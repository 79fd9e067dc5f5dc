#!/usr/bin/env bash
# `rbench sched` with llama.cpp beside ours: the evidence runs.
#
#   tools/sched_llamacpp_evidence.sh lab    # in the sched_ext guest: eevdf, scx_simple,
#                                           # scx_bpfland, scx_rusty x {rllama, llama.cpp}
#                                           # x pp64/tg16 on the lab model, and a serve
#                                           # sweep with rserve and llama-server on real
#                                           # ShareGPT prompts; REPS (3) interleaved reps
#   tools/sched_llamacpp_evidence.sh host   # on this machine: policies and numactl for
#                                           # rllama, the linked llama.cpp and a
#                                           # llama-bench binary, on smollm2-135m
#
# Results, the markdown report and an HTML report go to target/sched-llamacpp-<where>/.
# The lab run uses the portable binaries (target/lab, built here when missing) and
# llama.cpp's llama-server built for x86-64-v3 (tools/llamacpp_portable.sh); the guest
# is emulated (~90x slower), hence the two-layer lab model and short prompts.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
where=${1:-lab}
reps=${REPS:-3}
out="$PWD/target/sched-llamacpp-$where"
mkdir -p "$out"
llama_bin=$(tools/llamacpp_portable.sh)
# Real ShareGPT conversations, the first 64 with two turns (the full file is 600+ MB,
# which an emulated guest would parse for minutes in every serving window).
subset="$out/sharegpt-64.json"
if [ ! -s "$subset" ]; then
    python3 - "$subset" <<'EOF'
import json, os, sys
src = os.path.expanduser("~/.cache/rllama/datasets/ShareGPT_V3_unfiltered_cleaned_split.json")
dec = json.JSONDecoder()
text = open(src, encoding="utf-8").read()
i = text.index("[") + 1
keep = []
while len(keep) < 64:
    while text[i] in " \n\r\t,":
        i += 1
    obj, i = dec.raw_decode(text, i)
    conv = obj.get("conversations", [])
    if len(conv) >= 2 and conv[0].get("from") == "human" and len(conv[0]["value"]) < 1200:
        keep.append(obj)
json.dump(keep, open(sys.argv[1], "w"))
EOF
fi
case "$where" in
lab)
    if [ ! -x target/lab/release/rbench ] || [ ! -x target/lab/release/rserve ]; then
        RUSTFLAGS="-C target-cpu=x86-64-v3" CARGO_TARGET_DIR="$PWD/target/lab" \
            cargo build --release -p bench-cli -p server -p rllama --bins --features bench-cli/llamacpp
    fi
    model="$PWD/target/lab-models/llama3-lab-2l-w256.gguf"
    [ -f "$model" ] || { echo "no lab model: run cargo test --release -p bench-cli --test sched_lab once" >&2; exit 1; }
    cat >"$out/lab.sh" <<EOF
set -u
cp $model /dev/shm/model.gguf
export LLAMA_SERVER=$llama_bin/llama-server
$PWD/target/lab/release/rbench sched -m /dev/shm/model.gguf -t 1 --cooldown 1 \
  --variants eevdf,scx:scx_simple,scx:scx_bpfland,scx:scx_rusty --engine rllama,llamacpp \
  --spawn rserve --spawn llama-server --workloads pp64,tg16,serve:c=2:n=6:len=16 \
  --dataset $subset --serve-ctx 1024 -r $reps --result-file sched.jsonl > sched.md 2> sched.err
echo "sched-exit=\$?"
echo "state=\$(cat /sys/kernel/sched_ext/state)"
EOF
    (cd "$out" && "$repo/../shared/lab/run" --cpus 1 --mem 3G -- bash lab.sh)
    ;;
host)
    cd "$out"
    "$repo/target/release/rbench" sched -m smollm2-135m -t 2 --cooldown 2 \
        --variants 'eevdf,policy:batch,numactl:--physcpubind=0 --membind=0,affinity:1' \
        --engine "rllama,llamacpp,$llama_bin/llama-bench" \
        --workloads "pp64,tg16,cmd:llama-bench=\"$llama_bin/llama-bench -m $HOME/.cache/rllama/models/smollm2-135m.gguf -p 64 -n 0 -t 2 -r 1 -o json\"" \
        -r "$reps" --result-file sched.jsonl >sched.md 2>sched.err || echo "sched-exit=$?"
    ;;
*)
    echo "usage: $0 lab|host" >&2
    exit 2
    ;;
esac
cd "$out"
"$repo/target/release/rbench" report sched.jsonl --html sched.html >/dev/null
cat sched.md
