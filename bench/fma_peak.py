"""This CPU's fp32 multiply-add peak, measured: independent chains of 16-lane FMAs (AVX-512; 8-lane
on AVX2 + FMA builds), one per thread, with nothing else in the loop. It is the ceiling any fp32 GEMM here can reach, so a
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
#if defined(__AVX512F__)
#define LANES 16
typedef __m512 vec;
#define SET1 _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define ADD _mm512_add_ps
#elif defined(__AVX2__) && defined(__FMA__)
#define LANES 8
typedef __m256 vec;
#define SET1 _mm256_set1_ps
#define FMA _mm256_fmadd_ps
#define ADD _mm256_add_ps
#else
#error "neither AVX-512 nor AVX2 with FMA"
#endif
int main(int argc, char **argv) {
    const long iters = atol(argv[1]);
    const int threads = atoi(argv[2]);
    float sink = 0;
    double t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
        vec a[12];
        for (int j = 0; j < 12; j++) a[j] = SET1(1.0f + 0.1f * j);
        const vec b = SET1(0.99999f), c = SET1(0.00001f);
        for (long i = 0; i < iters; i++) {
#pragma GCC unroll 12
            for (int j = 0; j < 12; j++) a[j] = FMA(a[j], b, c);
        }
        vec s = a[0];
        for (int j = 1; j < 12; j++) s = ADD(s, a[j]);
        float lanes[LANES];
        __builtin_memcpy(lanes, &s, sizeof(lanes));
        for (int i = 0; i < LANES; i++) sink += lanes[i];
    }
    double t = omp_get_wtime() - t0;
    printf("%.6f %f %d\n", (double)threads * iters * 12 * LANES * 2 / t / 1e9, sink, LANES);
    return 0;
}
"""


def measure(threads: int = 2, runs: int = 5, iters: int = 100_000_000) -> list[float]:
    """GFLOP/s of each run; raises RuntimeError where there is no compiler, or neither AVX-512 nor AVX2 with FMA."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc or $CC)")
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "fma_peak.c", Path(tmp) / "fma_peak"
        src.write_text(_SOURCE)
        done = subprocess.run([cc, "-O2", "-march=native", "-fopenmp", str(src), "-o", str(exe)],
                              capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"the FMA loop did not compile here (AVX-512, or AVX2 with FMA, needed): {done.stderr.strip()[:300]}")
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
