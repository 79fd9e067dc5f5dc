#!/usr/bin/env python3
"""Is rbench's in-tool llama.cpp as fast as a native llama-bench? Runs, per model and
round, a native llama-bench (flash attention 0 and 1) and one or more rbench builds
(`--engine llamacpp`, and our engine for context), alternating their order every round,
then prints medians (tokens/s) and ratios to the best native configuration.

  tools/native_vs_intool.py --llama-bench BUILD/bin/llama-bench \\
      --rbench after=target/release/rbench --rbench before=/tmp/rbench-old \\
      -m smollm2-135m -m gemma3-270m -p 512 -n 128 -t 2 --rounds 3
  ... --ours --numerics exact,fast     # our engine too, in both numerics
  ... --membw                          # memory bandwidth before every run, paired ratios

On a host whose memory bandwidth drifts, `--membw` runs `rbench membw` before every engine
run and prints, besides the medians, the median of the per-round ratios (each contestant
against the best native configuration of the same round), the same ratio per GB/s of the
bandwidth read just before each run, and the bandwidth each contestant's runs started in,
so a tg ratio can be checked for a shared memory state.

A native llama-bench: cmake -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON on a llama.cpp
checkout (llama.cpp's own defaults otherwise: OpenMP, repacking, llamafile sgemm).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def run_json(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    return json.loads(p.stdout)


def model_path(m):
    if os.path.isfile(m):
        return m
    base = os.environ.get("RLLAMA_MODELS") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rllama", "models")
    return os.path.join(base, m + ".gguf")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--rbench", action="append", required=True, help="LABEL=PATH")
    ap.add_argument("-m", action="append", required=True)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-d", type=int, default=0)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ours", action="store_true", help="also run our engine (with every rbench build)")
    ap.add_argument("--numerics", default="exact",
                    help="our engine's numerics with --ours: exact, fast, or exact,fast (both)")
    ap.add_argument("--no-intool", action="store_true",
                    help="skip rbench's llama.cpp")
    ap.add_argument("--membw", action="store_true",
                    help="measure memory bandwidth (rbench membw) before every run")
    a = ap.parse_args()
    rbenches = [r.split("=", 1) for r in a.rbench]
    common = ["-p", str(a.p), "-n", str(a.n), "-t", str(a.t), "-r", "1", "-o", "json"]
    if a.d:
        common += ["-d", str(a.d)]
    samples = {}  # (model, contestant, test) -> [t/s], one per round
    bandwidth = {}  # (model, contestant) -> [GB/s before each run]

    def add(model, who, rows):
        for r in rows:
            test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
            samples.setdefault((model, who, test), []).append(r["avg_ts"])

    def membw():
        # The highest row's median: the plain read or, where rbench has it, the read that
        # prefetches as the decode kernels do.
        p = subprocess.run([rbenches[0][1], "membw", "-t", str(a.t)], capture_output=True, text=True)
        rows = []
        for line in p.stdout.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 6 and cells[0] == str(a.t):
                rows.append(float(cells[5]))
        if not rows:
            sys.exit(f"rbench membw printed no row for -t {a.t}:\n{p.stdout}{p.stderr[-2000:]}")
        return max(rows)

    for rnd in range(a.rounds):
        for m in a.m:
            path = model_path(m)
            jobs = [("native fa0", [a.llama_bench, "-m", path, "-fa", "0"] + common),
                    ("native fa1", [a.llama_bench, "-m", path, "-fa", "1"] + common)]
            for label, exe in ([] if a.no_intool else rbenches):
                jobs.append((f"in-tool {label}", [exe, "--engine", "llamacpp", "-m", path] + common))
            if a.ours:
                for label, exe in rbenches:
                    for num in a.numerics.split(","):
                        jobs.append((f"ours {label} {num}", [exe, "--engine", "rllama", "--numerics",
                                                              num, "-m", path] + common))
            if rnd % 2:
                jobs.reverse()
            for who, cmd in jobs:
                state = ""
                if a.membw:
                    bandwidth.setdefault((m, who), []).append(membw())
                    state = f" (membw just before: {bandwidth[(m, who)][-1]:.1f} GB/s)"
                rows = run_json(cmd)
                add(m, who, rows)
                got = ", ".join(f"{r['avg_ts']:.2f}" for r in rows)
                print(f"round {rnd + 1} {m} {who}: {got} t/s{state}", file=sys.stderr)

    tests = sorted({k[2] for k in samples}, key=lambda t: (t[:2] != "pp", t))
    whos = sorted({k[1] for k in samples}, key=lambda w: (not w.startswith("native"), w))
    print(f"\nmedian t/s over {a.rounds} rounds (engines alternated), -t {a.t}"
          + (f", depth {a.d}" if a.d else "") + "; ratio = / best native\n")
    print("| model | test | " + " | ".join(whos) + " |")
    print("|---|---|" + "---:|" * len(whos))
    for m in a.m:
        for t in tests:
            med = {w: statistics.median(samples[(m, w, t)]) for w in whos if (m, w, t) in samples}
            best = max(v for w, v in med.items() if w.startswith("native"))
            cells = []
            for w in whos:
                v = med.get(w)
                if v is None:
                    cells.append("")
                elif w.startswith("native"):
                    cells.append(f"{v:.1f}")
                else:
                    cells.append(f"{v:.1f} ({v / best:.2f}x)")
            print(f"| {m} | {t} | " + " | ".join(cells) + " |")

    if not a.membw:
        return
    print(f"\nmedian of per-round ratios (each round's run / that round's best native), the same"
          f" with each run's t/s divided by the `rbench membw -t {a.t}` GB/s read just before it"
          f" (a memory-bound tg's ratio in one memory state), and that bandwidth's median"
          f" (min-max) per contestant\n")
    print("| model | test | " + " | ".join(whos) + " |")
    print("|---|---|" + "---:|" * len(whos))
    for m in a.m:
        for t in tests:
            natives = [w for w in whos if w.startswith("native") and (m, w, t) in samples]
            # Per round: the best native's t/s and the bandwidth its run started in.
            best = [max((samples[(m, w, t)][i], bandwidth[(m, w)][i]) for w in natives)
                    for i in range(a.rounds)]
            cells = []
            for w in whos:
                bw = bandwidth.get((m, w), [])
                state = f"{statistics.median(bw):.0f} ({min(bw):.0f}-{max(bw):.0f}) GB/s" if bw else ""
                if w.startswith("native") or (m, w, t) not in samples:
                    cells.append(state)
                else:
                    runs = list(zip(samples[(m, w, t)], bw, best))
                    r = statistics.median(v / nv for v, _, (nv, _) in runs)
                    per_gbs = statistics.median((v / b) / (nv / nb) for v, b, (nv, nb) in runs)
                    cells.append(f"{r:.2f}x; per GB/s {per_gbs:.2f}x; {state}")
            print(f"| {m} | {t} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
