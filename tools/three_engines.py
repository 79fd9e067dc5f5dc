#!/usr/bin/env python3
"""Ours, native mainline llama.cpp and native ik_llama.cpp in one run.

Per model and round it runs our engine (`rbench --engine rllama`, each numerics asked
for), every configuration of mainline's llama-bench (`-fa 0` and `-fa 1`) and every
configuration of ik_llama.cpp (`-fa 0/1` x `-rtr 0/1`), reversing the order of all of them
every other round, logs every run (stderr, and one JSON line per run with --log), and
prints medians with our ratio to each reference's best configuration of the cell.

  tools/three_engines.py --rbench target/release/rbench \\
      --mainline LLAMA/build/bin/llama-bench \\
      --ik IK/build/bin/llama-bench --ik-sweep IK/build/bin/llama-sweep-bench \\
      -m smollm2-135m -m gemma3-270m -p 512 -n 128 -t 2 --rounds 3 [-d 4096]
  ... --simd avx2        # our AVX2 path (RLLAMA_SIMD=avx2); pair it with AVX2-only builds
  ... --label avx512     # a tag for the log and the table heading

Depth: mainline's llama-bench and rbench take `-d`. ik's llama-bench has no depth for a
prompt test, so at `-d D` ik runs llama-sweep-bench (`-c D+P -ub P -b P -n N`), whose last
row is a P-token batch and an N-token generation with D tokens in the cache; earlier rows
are its sweep and are not used.

Native builds: cmake -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON on each source tree
(mainline from the llama-cpp-python source package, ik from ik-llama-cpp-python's), their
defaults otherwise; for the AVX2 comparison, -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON
-DGGML_F16C=ON -DGGML_AVX512=OFF (ik: the same options).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from native_vs_intool import model_path  # the same lookup: a path, else the rllama cache


def exe(p):
    """A program path that still works from another directory (a bare name is looked up
    on PATH as before)."""
    return os.path.abspath(p) if os.sep in p else p


def run(cmd, env=None):
    # In a scratch directory: llama-sweep-bench writes a llama.log where it runs.
    with tempfile.TemporaryDirectory(prefix="three-engines-") as scratch:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=scratch)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-3000:]}")
    return p


def bench_rows(p, depth):
    """llama-bench / rbench JSON -> {test: t/s}."""
    out = {}
    for r in json.loads(p.stdout):
        test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
        out[test + (f"@d{depth}" if depth else "")] = r["avg_ts"]
    return out


def sweep_rows(p, pp, tg, depth):
    """llama-sweep-bench jsonl -> the row at n_kv == depth."""
    for line in (p.stdout + p.stderr).splitlines():
        line = line.strip()
        if line.startswith("{") and '"n_kv"' in line:
            r = json.loads(line)
            if r["n_kv"] == depth:
                if r["pp"] != pp or r["tg"] != tg:
                    sys.exit(f"sweep-bench ran pp{r['pp']}/tg{r['tg']}, asked pp{pp}/tg{tg}")
                return {f"pp{pp}@d{depth}": r["speed_pp"], f"tg{tg}@d{depth}": r["speed_tg"]}
    sys.exit(f"sweep-bench printed no row at n_kv={depth}:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rbench", required=True)
    ap.add_argument("--mainline", required=True, help="mainline llama-bench")
    ap.add_argument("--ik", required=True, help="ik_llama.cpp llama-bench")
    ap.add_argument("--ik-sweep", help="ik_llama.cpp llama-sweep-bench (needed with -d)")
    ap.add_argument("-m", action="append", required=True)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-d", type=int, default=0)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--numerics", default="exact", help="ours: exact, fast, or exact,fast")
    ap.add_argument("--simd", help="ours: RLLAMA_SIMD (e.g. avx2)")
    ap.add_argument("--label", default="", help="a tag for the log and the heading")
    ap.add_argument("--log", help="append one JSON line per run here")
    a = ap.parse_args()
    if a.d and not a.ik_sweep:
        sys.exit("-d needs --ik-sweep (ik's llama-bench has no depth for a prompt test)")
    if a.d and a.p <= 0:
        sys.exit("-d needs -p > 0 (the sweep's rows are prompt batches)")

    ours_env = dict(os.environ)
    if a.simd:
        ours_env["RLLAMA_SIMD"] = a.simd
    common = ["-p", str(a.p), "-n", str(a.n), "-t", str(a.t), "-r", "1", "-o", "json"]
    if a.d:
        common += ["-d", str(a.d)]
    log = open(a.log, "a") if a.log else None
    samples = {}  # (model, contestant, test) -> [t/s]

    for rnd in range(a.rounds):
        for m in a.m:
            path = os.path.abspath(model_path(m))
            if not os.path.isfile(path):
                sys.exit(f"no model file {path}")
            jobs = []
            for num in a.numerics.split(","):
                jobs.append((f"ours {num}", "bench", ours_env,
                             [exe(a.rbench), "--engine", "rllama", "--numerics", num, "-m", path] + common))
            for fa in (0, 1):
                jobs.append((f"mainline fa{fa}", "bench", None,
                             [exe(a.mainline), "-m", path, "-fa", str(fa)] + common))
            for fa in (0, 1):
                for rtr in (0, 1):
                    who = f"ik fa{fa} rtr{rtr}"
                    if a.d:
                        cmd = [exe(a.ik_sweep), "-m", path, "-c", str(a.d + a.p), "-ub", str(a.p),
                               "-b", str(a.p), "-n", str(a.n), "-t", str(a.t), "-fa", str(fa),
                               "--output-format", "jsonl"] + (["-rtr"] if rtr else [])
                        jobs.append((who, "sweep", None, cmd))
                    else:
                        cmd = [exe(a.ik), "-m", path, "-fa", str(fa), "-rtr", str(rtr)] + common
                        jobs.append((who, "bench", None, cmd))
            if rnd % 2:
                jobs.reverse()
            for who, kind, env, cmd in jobs:
                t0 = time.time()
                p = run(cmd, env)
                rows = bench_rows(p, a.d) if kind == "bench" else sweep_rows(p, a.p, a.n, a.d)
                for test, ts in rows.items():
                    samples.setdefault((m, who, test), []).append(ts)
                got = ", ".join(f"{t} {v:.2f}" for t, v in rows.items())
                print(f"round {rnd + 1} {m} {who}: {got} t/s", file=sys.stderr)
                if log:
                    log.write(json.dumps({"label": a.label, "round": rnd + 1, "model": m,
                                          "who": who, "cmd": cmd, "simd": a.simd if who.startswith("ours") else None,
                                          "t_s": rows, "wall_s": round(time.time() - t0, 2)}) + "\n")
                    log.flush()

    tests = sorted({k[2] for k in samples}, key=lambda t: (t[:2] != "pp", t))
    whos = sorted({k[1] for k in samples}, key=lambda w: (not w.startswith("ours"), w))
    head = f"median t/s over {a.rounds} rounds (order reversed every other round), -t {a.t}"
    if a.d:
        head += f", depth {a.d}"
    if a.label:
        head += f", {a.label}"
    if a.simd:
        head += f", ours with RLLAMA_SIMD={a.simd}"
    print(f"\n{head}\n")
    print("| model | test | ours | best mainline | best ik | ours / mainline | ours / ik |")
    print("|---|---|---:|---|---|---:|---:|")
    for m in a.m:
        for t in tests:
            med = {w: statistics.median(samples[(m, w, t)]) for w in whos if (m, w, t) in samples}
            for num in a.numerics.split(","):
                ours = med[f"ours {num}"]
                ml = max((v, w) for w, v in med.items() if w.startswith("mainline"))
                ik = max((v, w) for w, v in med.items() if w.startswith("ik"))
                print(f"| {m} | {t} | {ours:.1f} ({num}) | {ml[0]:.1f} ({ml[1][9:]}) "
                      f"| {ik[0]:.1f} ({ik[1][3:]}) | {ours / ml[0]:.2f}x | {ours / ik[0]:.2f}x |")
    print("\nevery configuration, median t/s (min-max)\n")
    print("| model | test | " + " | ".join(whos) + " |")
    print("|---|---|" + "---:|" * len(whos))
    for m in a.m:
        for t in tests:
            cells = []
            for w in whos:
                s = samples.get((m, w, t))
                cells.append(f"{statistics.median(s):.1f} ({min(s):.1f}-{max(s):.1f})" if s else "")
            print(f"| {m} | {t} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
