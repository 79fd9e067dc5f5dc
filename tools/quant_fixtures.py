#!/usr/bin/env python3
"""Generate the bit-exactness fixtures in testdata/quant/ for the `quant` crate.

Two independent references are used:

* gguf-py (`pip install gguf`): `GGUFReader` for real tensor rows of the three test
  models, `gguf.quants.dequantize` for their float output, and `gguf.quants.quantize`
  where gguf-py implements it (F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0).
* ggml itself ("oracle"): a tiny C harness compiled against the ggml sources vendored in
  the `llama-cpp-sys-2` crate (the version this workspace pins, found in the cargo
  registry, or pass --ggml-src). It links ggml's own `quantize_row_*_ref`,
  `dequantize_row_*` and generic `ggml_vec_dot_*_generic` functions, so it covers what
  gguf-py lacks: K-quant/Q8_1/Q8_K quantizers and the dot products. Compiled for
  baseline x86-64 with -ffp-contract=off, i.e. plain IEEE float ops in source order.
  When the sources or a C compiler are missing this part is skipped (and its fixture
  file left untouched).

The models are needed only to regenerate; tests read the committed fixtures. Output
format: see testdata/quant/README.md. Usage:

    python3 tools/quant_fixtures.py [--models DIR] [--out testdata/quant] [--ggml-src DIR]
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

KIND_DEQUANT = 0  # blobs: [raw blocks, expected f32 values]
KIND_QUANT = 1  # blobs: [input f32 values, expected raw blocks]
KIND_DOT = 2  # blobs: [weight raw, activation raw (vec_dot_type), expected f32 result]

MODELS = {
    "smollm2": "smollm2-135m.gguf",
    "gemma3": "gemma3-270m.gguf",
    "qwen25": "qwen2.5-coder-0.5b.gguf",
}

# Weight type -> activation type for the dot products (must match quant::vec_dot_type).
VEC_DOT_TYPE = {
    T.Q4_0: T.Q8_0,
    T.Q5_0: T.Q8_0,
    T.Q8_0: T.Q8_0,
    T.Q4_1: T.Q8_1,
    T.Q5_1: T.Q8_1,
    T.Q2_K: T.Q8_K,
    T.Q3_K: T.Q8_K,
    T.Q4_K: T.Q8_K,
    T.Q5_K: T.Q8_K,
    T.Q6_K: T.Q8_K,
}

GGUF_PY_QUANTIZE = [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
GGUF_PY_DEQUANT = [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
ORACLE_QUANTIZE = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q8_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_K]


class Writer:
    """Accumulates fixture records and writes one container file."""

    def __init__(self) -> None:
        self.records: list[bytes] = []

    def add(self, name: str, kind: int, qtype: T, n: int, blobs: list[bytes]) -> None:
        nb = name.encode()
        rec = struct.pack("<H", len(nb)) + nb + struct.pack("<IIII", kind, int(qtype), n, len(blobs))
        for b in blobs:
            rec += struct.pack("<I", len(b)) + b
        self.records.append(rec)

    def save(self, path: str) -> None:
        with open(path, "wb") as f:
            f.write(b"QFX1" + struct.pack("<I", len(self.records)))
            for r in self.records:
                f.write(r)
        print(f"wrote {path}: {len(self.records)} records, {os.path.getsize(path)} bytes")


def f32_bytes(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype="<f4").tobytes()


def quant_size(qtype: T) -> tuple[int, int]:
    # gguf-py still lists Q8_1 with two f32 scales (40 bytes); ggml's block_q8_1 has had
    # two f16s (36 bytes) for a long time.
    return (32, 36) if qtype == T.Q8_1 else GGML_QUANT_SIZES[qtype]


def row_bytes(qtype: T, n: int) -> int:
    bs, ts = quant_size(qtype)
    assert n % bs == 0
    return n // bs * ts


def gguf_dequant(qtype: T, raw: bytes, n: int) -> np.ndarray:
    arr = np.frombuffer(raw, dtype=np.uint8).copy()
    with np.errstate(all="ignore"):
        if qtype == T.F32:
            out = arr.view(np.float32)
        else:
            out = gguf.quants.dequantize(arr, qtype)
    out = np.asarray(out, dtype=np.float32).reshape(-1)
    assert out.size == n, (qtype, out.size, n)
    return out


def gguf_quant(qtype: T, x: np.ndarray) -> bytes:
    with np.errstate(all="ignore"):
        q = gguf.quants.quantize(np.asarray(x, dtype=np.float32).reshape(1, -1), qtype)
    return np.ascontiguousarray(q).view(np.uint8).tobytes()


# ---------------------------------------------------------------------------------------
# Synthetic inputs


def cos_signal(n: int, offset: float, amplitude: float = 2.0) -> np.ndarray:
    """llama.cpp test-quantize-fns' `0.1 + amplitude*cosf(i + offset)`."""
    i = np.arange(n, dtype=np.float32)
    c = np.cos((i + np.float32(offset)).astype(np.float32)).astype(np.float32)
    return (0.1 + (np.float32(amplitude) * c).astype(np.float64)).astype(np.float32)


def edge_rows(rng: np.random.Generator, n: int = 256) -> dict[str, np.ndarray]:
    """Inputs that stress the quantizers' corner cases (n must be a multiple of 256)."""
    rows = {}
    rows["zeros"] = np.zeros(n, np.float32)
    rows["constant"] = np.full(n, 0.37, np.float32)
    rows["negconstant"] = np.full(n, -1.25, np.float32)
    x = rng.normal(0, 0.02, n).astype(np.float32)
    x[::37] *= 40  # sparse outliers
    rows["outliers"] = x
    rows["positive"] = np.abs(rng.normal(0.5, 0.3, n)).astype(np.float32)
    rows["negative"] = -np.abs(rng.normal(0.5, 0.3, n)).astype(np.float32)
    rows["tiny"] = (rng.normal(0, 1, n) * 1e-6).astype(np.float32)
    rows["huge"] = (rng.normal(0, 1, n) * 3e4).astype(np.float32)
    x = rng.normal(0, 1, n).astype(np.float32)
    x[:64] = 0  # all-zero sub-blocks inside an otherwise normal row
    x[128:144] = 0
    rows["zero_subblocks"] = x
    rows["uniform"] = rng.uniform(-1, 1, n).astype(np.float32)
    rows["ties"] = (np.round(rng.normal(0, 4, n)) / 8).astype(np.float32)  # many exact halves
    return rows


def random_blocks(rng: np.random.Generator, qtype: T, nblocks: int, wild: bool) -> bytes:
    """Random block bytes. Unless `wild`, every f16 scale field is a finite, moderate
    value so the expected output is plain numbers; `wild` leaves them random (NaN/inf/
    subnormal scales included)."""
    bs, ts = quant_size(qtype)
    raw = rng.integers(0, 256, size=(nblocks, ts), dtype=np.uint8)
    if not wild:
        offsets = {
            T.Q4_0: [0], T.Q5_0: [0], T.Q8_0: [0],
            T.Q4_1: [0, 2], T.Q5_1: [0, 2],
            T.Q4_K: [0, 2], T.Q5_K: [0, 2],
            T.Q2_K: [80, 82], T.Q3_K: [108], T.Q6_K: [208],
        }.get(qtype, [])
        for off in offsets:
            d = (rng.uniform(-1, 1, nblocks) * np.exp2(rng.integers(-14, 2, nblocks))).astype(np.float16)
            raw[:, off:off + 2] = d.view(np.uint8).reshape(nblocks, 2)
        if qtype in (T.F16, T.BF16):
            # scalar types: the whole row is values; keep them finite
            v = rng.normal(0, 3, nblocks).astype(np.float32)
            raw = (v.astype(np.float16).view(np.uint8) if qtype == T.F16
                   else (v.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)).reshape(nblocks, 2)
    return raw.tobytes()


# ---------------------------------------------------------------------------------------
# gguf-py fixtures


def model_fixtures(models_dir: str, w: Writer, dot_inputs: list) -> None:
    for short, fname in MODELS.items():
        path = os.path.join(models_dir, fname)
        if not os.path.exists(path):
            sys.exit(f"missing model {path}")
        reader = gguf.GGUFReader(path)
        by_type: dict[T, list] = {}
        for t in reader.tensors:
            by_type.setdefault(t.tensor_type, []).append(t)
        for qtype, tensors in sorted(by_type.items(), key=lambda kv: int(kv[0])):
            picks = []
            if qtype == T.F32:
                # 1-D norms/biases: whole vectors of the first two tensors
                for t in tensors[:2]:
                    picks.append((t, None))
            else:
                first, last = tensors[0], tensors[-1]
                nrows = first.data.shape[0]
                for r in sorted({0, 1, nrows // 2}):
                    picks.append((first, r))
                if last is not first:
                    picks.append((last, last.data.shape[0] - 1))
            for t, r in picks:
                data = np.asarray(t.data)
                if qtype == T.F32:
                    raw = np.ascontiguousarray(data.reshape(-1)).view(np.uint8).tobytes()
                    name = f"{short}/{t.name}"
                else:
                    raw = np.ascontiguousarray(data[r]).view(np.uint8).tobytes()
                    name = f"{short}/{t.name}/row{r}"
                n = int(t.shape[0])
                assert len(raw) == row_bytes(qtype, n), (name, len(raw))
                y = gguf_dequant(qtype, raw, n)
                w.add(name, KIND_DEQUANT, qtype, n, [raw, f32_bytes(y)])
                if qtype in VEC_DOT_TYPE:
                    dot_inputs.append((name, qtype, n, raw, y))
        print(f"{short}: types {[k.name for k in by_type]}")


def gguf_synthetic_fixtures(w: Writer, rng: np.random.Generator) -> None:
    inputs = {
        "cos": cos_signal(1024, 0.0),
        "normal": rng.normal(0, 1, 512).astype(np.float32),
        **edge_rows(rng),
    }
    for qtype in GGUF_PY_QUANTIZE:
        for name, x in inputs.items():
            raw = gguf_quant(qtype, x)
            assert len(raw) == row_bytes(qtype, x.size), (qtype, name)
            w.add(f"gguf-py/quantize/{qtype.name}/{name}", KIND_QUANT, qtype, x.size, [f32_bytes(x), raw])
    for qtype in GGUF_PY_DEQUANT:
        bs, _ = quant_size(qtype)
        nblocks = max(1, 1024 // bs) if bs > 1 else 512
        for wild in (False, True):
            raw = random_blocks(rng, qtype, nblocks, wild)
            n = nblocks * bs
            tag = "wild" if wild else "random"
            w.add(f"gguf-py/{tag}-blocks/{qtype.name}", KIND_DEQUANT, qtype, n,
                  [raw, f32_bytes(gguf_dequant(qtype, raw, n))])


# ---------------------------------------------------------------------------------------
# ggml C oracle

ORACLE_C = r"""
// Thin CLI over ggml's own scalar reference functions (written for quant_fixtures.py).
//   oracle quant   TYPE N   : stdin N f32          -> stdout raw row
//   oracle dequant TYPE N   : stdin raw row        -> stdout N f32
//   oracle dot     WTYPE N  : stdin raw w, raw a   -> stdout 1 f32
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>
#include "ggml.h"
#include "ggml-common.h"
#include "ggml-quants.h"

float ggml_table_f32_f16[1 << 16];

void ggml_abort(const char * file, int line, const char * fmt, ...) {
    fprintf(stderr, "ggml_abort %s:%d\n", file, line); abort();
}
const char * ggml_type_name(enum ggml_type t) { (void) t; return "?"; }
size_t ggml_type_size(enum ggml_type t) { (void) t; abort(); }
size_t ggml_row_size(enum ggml_type t, int64_t n) { (void) t; (void) n; abort(); }

typedef void (*qfn)(const float *, void *, int64_t);
typedef void (*dqfn)(const void *, float *, int64_t);
typedef void (*dotfn)(int, float *, size_t, const void *, size_t, const void *, size_t, int);

#define DOT(w, a) void ggml_vec_dot_##w##_##a##_generic(int, float *, size_t, const void *, size_t, const void *, size_t, int);
DOT(q4_0, q8_0) DOT(q4_1, q8_1) DOT(q5_0, q8_0) DOT(q5_1, q8_1) DOT(q8_0, q8_0)
DOT(q2_K, q8_K) DOT(q3_K, q8_K) DOT(q4_K, q8_K) DOT(q5_K, q8_K) DOT(q6_K, q8_K)

static const struct { int id, bs, ts, vdt; qfn q; dqfn dq; dotfn dot; } T[] = {
    {2, 32, 18, 8, (qfn) quantize_row_q4_0_ref, (dqfn) dequantize_row_q4_0, ggml_vec_dot_q4_0_q8_0_generic},
    {3, 32, 20, 9, (qfn) quantize_row_q4_1_ref, (dqfn) dequantize_row_q4_1, ggml_vec_dot_q4_1_q8_1_generic},
    {6, 32, 22, 8, (qfn) quantize_row_q5_0_ref, (dqfn) dequantize_row_q5_0, ggml_vec_dot_q5_0_q8_0_generic},
    {7, 32, 24, 9, (qfn) quantize_row_q5_1_ref, (dqfn) dequantize_row_q5_1, ggml_vec_dot_q5_1_q8_1_generic},
    {8, 32, 34, 8, (qfn) quantize_row_q8_0_ref, (dqfn) dequantize_row_q8_0, ggml_vec_dot_q8_0_q8_0_generic},
    {9, 32, 36, -1, (qfn) quantize_row_q8_1_ref, NULL, NULL},
    {10, 256, 84, 15, (qfn) quantize_row_q2_K_ref, (dqfn) dequantize_row_q2_K, ggml_vec_dot_q2_K_q8_K_generic},
    {11, 256, 110, 15, (qfn) quantize_row_q3_K_ref, (dqfn) dequantize_row_q3_K, ggml_vec_dot_q3_K_q8_K_generic},
    {12, 256, 144, 15, (qfn) quantize_row_q4_K_ref, (dqfn) dequantize_row_q4_K, ggml_vec_dot_q4_K_q8_K_generic},
    {13, 256, 176, 15, (qfn) quantize_row_q5_K_ref, (dqfn) dequantize_row_q5_K, ggml_vec_dot_q5_K_q8_K_generic},
    {14, 256, 210, 15, (qfn) quantize_row_q6_K_ref, (dqfn) dequantize_row_q6_K, ggml_vec_dot_q6_K_q8_K_generic},
    {15, 256, 292, -1, (qfn) quantize_row_q8_K_ref, (dqfn) dequantize_row_q8_K, NULL},
};

static int find(int id) {
    for (size_t i = 0; i < sizeof(T) / sizeof(T[0]); i++) if (T[i].id == id) return (int) i;
    fprintf(stderr, "unknown type %d\n", id); exit(2);
}

static void read_all(void * p, size_t n) { if (fread(p, 1, n, stdin) != n) { fprintf(stderr, "short read\n"); exit(3); } }

static float h2f(uint16_t h) {  // exact f16 -> f32 for the CPU backend's lookup table
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0x1f) u = s | 0x7f800000 | (m << 13);
    else if (e) u = s | ((e + 112) << 23) | (m << 13);
    else if (!m) u = s;
    else { e = 113; while (!(m & 0x400)) { m <<= 1; e--; } u = s | (e << 23) | ((m & 0x3ff) << 13); }
    float f; memcpy(&f, &u, 4); return f;
}

int main(int argc, char ** argv) {
    if (argc != 4) return 1;
    for (int i = 0; i < (1 << 16); i++) ggml_table_f32_f16[i] = h2f((uint16_t) i);
    int t = find(atoi(argv[2]));
    long n = atol(argv[3]);
    size_t rb = (size_t) (n / T[t].bs) * T[t].ts;
    if (!strcmp(argv[1], "quant")) {
        float * x = malloc(n * 4); void * y = calloc(1, rb);
        read_all(x, n * 4); T[t].q(x, y, n); fwrite(y, 1, rb, stdout);
    } else if (!strcmp(argv[1], "dequant")) {
        void * x = malloc(rb); float * y = malloc(n * 4);
        read_all(x, rb); T[t].dq(x, y, n); fwrite(y, 4, n, stdout);
    } else if (!strcmp(argv[1], "dot")) {
        int a = find(T[t].vdt);
        size_t ab = (size_t) (n / T[a].bs) * T[a].ts;
        void * w = malloc(rb); void * y = malloc(ab); float s = 0;
        read_all(w, rb); read_all(y, ab);
        T[t].dot((int) n, &s, 0, w, 0, y, 0, 1); fwrite(&s, 4, 1, stdout);
    } else return 1;
    return 0;
}
"""


def find_ggml_src(explicit: str | None) -> str | None:
    if explicit:
        return explicit
    home = os.path.expanduser("~/.cargo/registry/src")
    hits = sorted(glob.glob(os.path.join(home, "*", "llama-cpp-sys-2-*", "llama.cpp", "ggml")))
    return hits[-1] if hits else None


class Oracle:
    def __init__(self, ggml: str, workdir: str) -> None:
        cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if not cc:
            raise RuntimeError("no C compiler")
        src = os.path.join(workdir, "oracle.c")
        with open(src, "w") as f:
            f.write(ORACLE_C)
        self.exe = os.path.join(workdir, "oracle")
        inc = [f"-I{ggml}/include", f"-I{ggml}/src", f"-I{ggml}/src/ggml-cpu"]
        flags = ["-O2", "-std=gnu11", "-ffp-contract=off", "-march=x86-64", "-w"]
        cmd = [cc, *flags, *inc, src, f"{ggml}/src/ggml-quants.c", f"{ggml}/src/ggml-cpu/quants.c",
               "-o", self.exe, "-lm"]
        print("building oracle:", " ".join(cmd))
        subprocess.run(cmd, check=True)

    def _run(self, op: str, qtype: T, n: int, data: bytes) -> bytes:
        return subprocess.run([self.exe, op, str(int(qtype)), str(n)], input=data, capture_output=True,
                              check=True).stdout

    def quant(self, qtype: T, x: np.ndarray) -> bytes:
        out = self._run("quant", qtype, x.size, f32_bytes(x))
        assert len(out) == row_bytes(qtype, x.size)
        return out

    def dequant(self, qtype: T, raw: bytes, n: int) -> np.ndarray:
        return np.frombuffer(self._run("dequant", qtype, n, raw), dtype="<f4")

    def dot(self, qtype: T, n: int, w: bytes, a: bytes) -> bytes:
        return self._run("dot", qtype, n, w + a)


def oracle_fixtures(oracle: Oracle, w: Writer, rng: np.random.Generator, dot_inputs: list) -> None:
    inputs = {
        "cos": cos_signal(1024, 0.0),
        "normal": rng.normal(0, 1, 512).astype(np.float32),
        "laplace": rng.laplace(0, 0.05, 512).astype(np.float32),
        **edge_rows(rng),
    }
    # real weights: the first 512 values of a few dequantized model rows
    for name, qtype, n, raw, y in dot_inputs[::16]:
        if n >= 512:
            inputs["model:" + name] = y[:512].copy()

    # quantizers (plus ggml's dequantization of the cos case as a cross-check)
    for qtype in ORACLE_QUANTIZE:
        for name, x in inputs.items():
            raw = oracle.quant(qtype, x)
            w.add(f"ggml/quantize/{qtype.name}/{name}", KIND_QUANT, qtype, x.size, [f32_bytes(x), raw])
            if name == "cos" and qtype != T.Q8_1:
                y = oracle.dequant(qtype, raw, x.size)
                w.add(f"ggml/dequant-of-quantized/{qtype.name}/{name}", KIND_DEQUANT, qtype, x.size,
                      [raw, f32_bytes(y)])

    # dot products: synthetic weights quantized by ggml, and real model rows
    acts = {"cos1": lambda n: cos_signal(n, 1.0), "normal": lambda n: rng.normal(0, 1, n).astype(np.float32)}
    for qtype, atype in VEC_DOT_TYPE.items():
        for xname in ("cos", "normal", "outliers", "zero_subblocks"):
            x = inputs[xname]
            wraw = oracle.quant(qtype, x)
            for aname, gen in acts.items():
                araw = oracle.quant(atype, gen(x.size))
                res = oracle.dot(qtype, x.size, wraw, araw)
                w.add(f"ggml/dot/{qtype.name}/{xname}x{aname}", KIND_DOT, qtype, x.size, [wraw, araw, res])
        # random weight and activation bytes (finite scales), exercising every quant pattern
        n = 2048
        wraw = random_blocks(rng, qtype, n // quant_size(qtype)[0], wild=False)
        araw = oracle.quant(atype, rng.normal(0, 1, n).astype(np.float32))
        w.add(f"ggml/dot/{qtype.name}/random-blocks", KIND_DOT, qtype, n, [wraw, araw, oracle.dot(qtype, n, wraw, araw)])
    for name, qtype, n, raw, _ in dot_inputs:
        if not name.endswith("/row0"):
            continue
        atype = VEC_DOT_TYPE[qtype]
        araw = oracle.quant(atype, cos_signal(n, 2.0, 0.7))
        w.add(f"ggml/dot/{name}", KIND_DOT, qtype, n, [raw, araw, oracle.dot(qtype, n, raw, araw)])

    # Q8_K dequantization of random-but-valid blocks (not covered by gguf-py)
    q8k = rng.integers(0, 256, size=(4, 292), dtype=np.uint8)
    q8k[:, 0:4] = np.array(rng.normal(0, 0.01, 4), dtype="<f4").view(np.uint8).reshape(4, 4)
    raw = q8k.tobytes()
    w.add("ggml/random-blocks/Q8_K", KIND_DEQUANT, T.Q8_K, 1024, [raw, f32_bytes(oracle.dequant(T.Q8_K, raw, 1024))])


def main() -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=os.path.expanduser("~/.cache/rllama/models"))
    ap.add_argument("--out", default=os.path.join(root, "testdata", "quant"))
    ap.add_argument("--ggml-src", default=None, help="ggml source dir (default: llama-cpp-sys-2 in the cargo registry)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    rng = np.random.default_rng(20240611)
    dot_inputs: list = []

    w = Writer()
    model_fixtures(args.models, w, dot_inputs)
    w.save(os.path.join(args.out, "gguf_models.qfx"))

    w = Writer()
    gguf_synthetic_fixtures(w, rng)
    w.save(os.path.join(args.out, "gguf_synthetic.qfx"))

    ggml = find_ggml_src(args.ggml_src)
    if not ggml or not os.path.exists(os.path.join(ggml, "src", "ggml-quants.c")):
        print("ggml sources not found: skipping ggml oracle fixtures (ggml_oracle.qfx unchanged)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        try:
            oracle = Oracle(ggml, tmp)
        except (RuntimeError, subprocess.CalledProcessError) as e:
            print(f"cannot build the ggml oracle ({e}): skipping ggml_oracle.qfx")
            return
        w = Writer()
        oracle_fixtures(oracle, w, np.random.default_rng(7), dot_inputs)
        w.save(os.path.join(args.out, "ggml_oracle.qfx"))


if __name__ == "__main__":
    main()
