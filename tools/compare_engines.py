#!/usr/bin/env python3
"""Our engine (exact and fast numerics) against the in-tool llama.cpp, side by side.

Per model and round it runs `rbench --engine rllama,llamacpp --numerics fast` and
`rbench --engine rllama --numerics exact`, alternating which goes first every round,
then prints medians (tokens/s) and the ratios ours/llama.cpp, with the ISA each engine
reported. At a depth (-d) both engines run pp and tg after the depth tokens.

  tools/compare_engines.py -m smollm2-135m -m gemma3-270m -p 512 -n 128 -t 2 --rounds 3
  RLLAMA_SIMD=avx2 tools/compare_engines.py ...     # our kernels forced to AVX2
  tools/compare_engines.py -m qwen2.5-coder-0.5b -d 4096 -p 512 -n 128 --rounds 2

Only same-run ratios mean anything on a shared machine; the medians are printed for
context.
"""
import argparse
import os
import statistics
import sys

from native_vs_intool import model_path, run_json


def test_name(o):
    name = f"pp{o['n_prompt']}" if o["n_prompt"] else f"tg{o['n_gen']}"
    return name + (f" @ d{o['n_depth']}" if o["n_depth"] else "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rbench", default="target/release/rbench")
    ap.add_argument("-m", "--model", action="append", required=True)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-d", type=int, default=0)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    # (model, engine label, test) -> [t/s]; (model, engine label) -> isa
    res, isa = {}, {}

    def add(m, label, objs):
        for o in objs:
            lab = label if o["engine"] == "rllama" else "llama.cpp"
            res.setdefault((m, lab, test_name(o)), []).append(o["avg_ts"])
            isa[(m, lab)] = o.get("isa") or ""

    for r in range(args.rounds):
        for m in args.model:
            base = [args.rbench, "-m", model_path(m), "-t", str(args.t), "-r", "1",
                    "-o", "json", "--no-progress"]
            depth = ["-d", str(args.d)] if args.d else []
            fast_lc = base + depth + ["--engine", "rllama,llamacpp", "--numerics", "fast",
                                      "-p", str(args.p), "-n", str(args.n)]
            runs = [("fast", fast_lc),
                    ("exact", base + depth + ["--engine", "rllama", "--numerics", "exact",
                                              "-p", str(args.p), "-n", str(args.n)])]
            if r % 2:
                runs.reverse()
            for label, cmd in runs:
                print(f"round {r + 1}: {m} {label}", file=sys.stderr)
                add(m, label, run_json(cmd))

    med = {k: statistics.median(v) for k, v in res.items()}
    tests = sorted({k[2] for k in res}, key=lambda t: (t.startswith("tg"), t))
    print(f"\nmedians of {args.rounds} rounds, t={args.t}; "
          f"RLLAMA_SIMD={os.environ.get('RLLAMA_SIMD', '(native)')}\n")
    print("| model | test | llama.cpp t/s | exact t/s | fast t/s | exact/lc | fast/lc |")
    print("|---|---|---|---|---|---|---|")
    for m in args.model:
        for t in tests:
            lc = med.get((m, "llama.cpp", t))
            ex = med.get((m, "exact", t))
            fa = med.get((m, "fast", t))
            if ex is None and fa is None:
                continue
            cell = lambda v: f"{v:.2f}" if v is not None else "-"
            ratio = lambda v: f"{v / lc:.2f}" if v is not None and lc else "-"
            print(f"| {m} | {t} | {cell(lc)} | {cell(ex)} | {cell(fa)} | {ratio(ex)} | {ratio(fa)} |")
    print()
    for (m, lab), i in sorted(isa.items()):
        print(f"isa {m} {lab}: {i}")


if __name__ == "__main__":
    main()
