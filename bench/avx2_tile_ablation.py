"""Where the AVX2 quantized projection's time goes: ``engine/native/quant_linear.c`` as the engine
builds it, against a copy without its dequantization, and the tile's inner pass loop alone.

Each arm is the kernel's source copied into a scratch folder with a textual edit, compiled with
the engine's flags and ``-mno-avx512f`` (so it measures the AVX2 build on any x86 host), and run on
SmolLM2's projections (their GGUF blocks) with preallocated outputs, the arms taking turns:

- ``kernel``: unchanged;
- ``no dequantization``: the L1 buffer filled once and reused (wrong products; what the
  dequantization costs);
- ``pass loop alone`` (a separate C program): the 3-row by 4-column pass over K = 576 with the
  buffer's row stride, called in a loop, everything in L1: what the FMA loop itself reaches.

    python -m bench.avx2_tile_ablation [--rows 3,12,32,64] [--layers 4] [--threads 1]

Reports GFLOP/s and the fraction of ``bench.fma_peak`` on as many threads. Not a test: the
ablated arms compute wrong numbers on purpose.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

from engine.native.build import FLAGS, _compile, bind

_NATIVE = Path(__file__).resolve().parents[1] / "engine" / "native"
_SOURCES = ("quant_linear.c", "skinny_tile.h", "vec_math.h")

_NO_DEQUANT = (  # (file, old, new)
    ("quant_linear.c", "                        dequant_q4_1x8(src + b * GROUP_BYTES, buf + b * QK, KC);", ""),
    ("quant_linear.c", "        float buf[NB * KC] __attribute__((aligned(64)));",
     "        float buf[NB * KC] __attribute__((aligned(64)));\n"
     "        for (int i = 0; i < NB * KC; i++) buf[i] = 0.001f * (i % 97);"),
)
ARMS = {"kernel": (), "no dequantization": _NO_DEQUANT}

_PASS_LOOP = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <immintrin.h>
typedef float v8 __attribute__((vector_size(32)));
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
__attribute__((noinline)) void pass(const float *x, long xs, const float *w, long ws, int kc, v8 out[3][4]) {
    v8 a[3][4];
    for (int i = 0; i < 3; i++) for (int j = 0; j < 4; j++) a[i][j] = (v8){0};
    for (int k = 0; k < kc; k += 8) {
        v8 xv[3];
        for (int i = 0; i < 3; i++) { xv[i] = *(const v8 *)(x + i * xs + k); __asm__("" : "+x"(xv[i])); }
        for (int j = 0; j < 4; j++) {
            v8 wv = *(const v8 *)(w + j * ws + k);
            __asm__("" : "+x"(wv));
            for (int i = 0; i < 3; i++) a[i][j] = (v8)_mm256_fmadd_ps((__m256)xv[i], (__m256)wv, (__m256)a[i][j]);
        }
    }
    for (int i = 0; i < 3; i++) for (int j = 0; j < 4; j++) out[i][j] = a[i][j];
}
int main(void) {
    static float x[3 * 576] __attribute__((aligned(64))), w[4 * 768] __attribute__((aligned(64)));
    for (int i = 0; i < 3 * 576; i++) x[i] = 1e-3f * (i % 7);
    for (int i = 0; i < 4 * 768; i++) w[i] = 1e-3f * (i % 5);
    v8 out[3][4]; double best = 1e9; float sink = 0; const long reps = 300000;
    for (int r = 0; r < 7; r++) {
        double t = now();
        for (long i = 0; i < reps; i++) { pass(x, 576, w, 768, 576, out); sink += out[0][0][0]; }
        t = now() - t; if (t < best) best = t;
    }
    printf("%.3f %g\n", 2.0 * 3 * 4 * 576 * reps / best / 1e9, sink);
    return 0;
}
"""


def _build(folder: Path, name: str, edits) -> Callable:
    src = folder / name.replace(" ", "_")
    src.mkdir()
    for f in _SOURCES:
        text = (_NATIVE / f).read_text()
        for file, old, new in edits:
            if file == f:
                if old not in text:
                    raise SystemExit(f"{f} changed: the '{name}' arm's edit no longer applies")
                text = text.replace(old, new)
        (src / f).write_text(text)
    so = src / "kernel.so"
    _compile(os.environ.get("CC") or "cc", (*FLAGS, "-mno-avx512f"), src / "quant_linear.c", so)  # the engine's build step
    return bind(ctypes.CDLL(str(so)), "baton_quant_linear_f32", "plpippliiii", ctypes.c_int)  # as quant_linear.py binds it


def _pass_loop(folder: Path) -> float:
    c, exe = folder / "pass_loop.c", folder / "pass_loop"
    c.write_text(_PASS_LOOP)
    subprocess.run(["gcc", "-O3", "-march=native", "-mno-avx512f", "-fno-trapping-math", "-o", str(exe), str(c)],
                   check=True)
    return float(subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()[0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="3,12,32,64")
    ap.add_argument("--layers", type=int, default=4, help="SmolLM2 layers whose projections run (30: all)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=15)
    a = ap.parse_args(argv)
    import torch

    from bench.fma_peak import measure as fma_peak
    from engine.config import EngineConfig
    from engine.model_loader import load_model
    from engine.native.quant_linear import STORED_TYPES

    torch.set_num_threads(a.threads)
    model = load_model(EngineConfig(model="default", num_threads=a.threads)).model
    projections = [p for layer in model.layers[: a.layers] for p in layer.projections()]
    if any(p.quantized is None for p in projections):
        raise SystemExit("the default model's projections carry no GGUF blocks here (the quantized kernel did not load)")
    peak = statistics.median(fma_peak(a.threads, runs=3))
    with tempfile.TemporaryDirectory() as tmp:
        kernels = {name: _build(Path(tmp), name, edits) for name, edits in ARMS.items()}
        loop = _pass_loop(Path(tmp))
    print(f"fp32 FMA peak, {a.threads} thread(s): {peak:.1f} GFLOP/s; the pass loop alone (1 thread): "
          f"{loop:.1f} GFLOP/s ({loop / statistics.median(fma_peak(1, runs=3)):.0%} of one thread's peak)")
    for rows in (int(r) for r in a.rows.split(",")):
        xs = {k: torch.randn(rows, k) for k in {p.weight.shape[1] for p in projections}}
        outs = {id(p): torch.empty(rows, p.weight.shape[0]) for p in projections}

        def run(fn):
            for p in projections:
                x, q, o = xs[p.weight.shape[1]], p.quantized, outs[id(p)]
                n, k = q.shape
                fn(x.data_ptr(), x.stride(0), q.blocks.data_ptr(), STORED_TYPES[q.qtype][0], None, o.data_ptr(), n,
                   rows, n, k, a.threads)

        times: dict[str, list[float]] = {name: [] for name in kernels}
        for fn in kernels.values():
            run(fn)
        for _ in range(a.repeats):
            for name, fn in kernels.items():
                t = time.perf_counter()
                run(fn)
                times[name].append(time.perf_counter() - t)
        flop = sum(2 * rows * p.weight.shape[0] * p.weight.shape[1] for p in projections)
        rates = {name: flop / statistics.median(ts) / 1e9 for name, ts in times.items()}
        print(f"{rows:3d} rows: " + ", ".join(f"{name} {r:.1f} ({r / peak:.0%})" for name, r in rates.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
