"""This CPU's fp32 multiply-add peak, measured: independent chains of 16-lane FMAs (AVX-512), one
per thread, with nothing else in the loop. It is the ceiling any fp32 GEMM here can reach, so a
kernel's rate reads as a fraction of it (docs/BENCHMARKS.md: the prefill's projections).

    python -m bench.fma_peak [--threads 2] [--runs 5] [--json]

Compiled on the spot with the system C compiler (``cc`` or ``$CC``, ``-O2 -march=native -fopenmp``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

# Twelve chains with different starting values (equal ones would be merged into one by the compiler)
# cover the FMA latency on two pipes; a chain's value stays finite (x * 0.99999 + 1e-5).
_SOURCE = r"""
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    const long iters = atol(argv[1]);
    const int threads = atoi(argv[2]);
    float sink = 0;
    double t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
        __m512 a[12];
        for (int j = 0; j < 12; j++) a[j] = _mm512_set1_ps(1.0f + 0.1f * j);
        const __m512 b = _mm512_set1_ps(0.99999f), c = _mm512_set1_ps(0.00001f);
        for (long i = 0; i < iters; i++) {
#pragma GCC unroll 12
            for (int j = 0; j < 12; j++) a[j] = _mm512_fmadd_ps(a[j], b, c);
        }
        __m512 s = a[0];
        for (int j = 1; j < 12; j++) s = _mm512_add_ps(s, a[j]);
        sink += _mm512_reduce_add_ps(s);
    }
    double t = omp_get_wtime() - t0;
    printf("%.6f %f\n", (double)threads * iters * 12 * 16 * 2 / t / 1e9, sink);
    return 0;
}
"""


def measure(threads: int = 2, runs: int = 5, iters: int = 100_000_000) -> list[float]:
    """GFLOP/s of each run; raises RuntimeError where there is no compiler or no AVX-512."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc or $CC)")
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "fma_peak.c", Path(tmp) / "fma_peak"
        src.write_text(_SOURCE)
        done = subprocess.run([cc, "-O2", "-march=native", "-fopenmp", str(src), "-o", str(exe)],
                              capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"the FMA loop did not compile here (AVX-512 needed): {done.stderr.strip()[:300]}")
        return [float(subprocess.run([str(exe), str(iters), str(threads)], capture_output=True, text=True,
                                     check=True).stdout.split()[0]) for _ in range(runs)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fma_peak", description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--iters", type=int, default=100_000_000, help="loop trips per thread (12 FMAs each)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    rates = measure(a.threads, a.runs, a.iters)
    r = {"threads": a.threads, "gflop_s_runs": rates, "gflop_s_best": max(rates), "gflop_s_median": statistics.median(rates)}
    print(json.dumps(r, indent=2) if a.json else
          f"fp32 FMA peak, {a.threads} thread(s): best {r['gflop_s_best']:.1f}, median {r['gflop_s_median']:.1f} GFLOP/s "
          f"(runs: {', '.join(f'{x:.1f}' for x in rates)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
