"""The AMX projection kernel (engine/native/amx_linear.c) against MKL's fp32 ``F.linear`` on the same
inputs, same run, arms alternating: SmolLM2's prefill shapes by default. Also reports oneDNN's plain
bf16 product (one piece each, bf16 output: not usable for fp32 results, shown as AMX's practical rate)
and each kernel's error against float64.

    python -m bench.amx_linear [--rows 2048,512] [--shapes 576x1536,1536x576,576x960] [--threads 2] [--repeats 7]
"""

from __future__ import annotations

import argparse
import time


def main(argv: list[str] | None = None) -> int:
    import torch
    import torch.nn.functional as F

    from engine.native.amx_linear import NativeAmxLinear

    p = argparse.ArgumentParser(prog="python -m bench.amx_linear", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="2048,512")
    p.add_argument("--shapes", default="576x1536,1536x576,576x960", help="KxN,... (in x out features)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    amx = NativeAmxLinear.load()
    if amx is None:
        raise SystemExit("AMX projections are not available here (Intel AMX-BF16, Linux's tile permission, BATON_AMX, CC)")

    def timed(fn) -> float:
        fn()
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    print(f"{args.threads} thread(s), best of {args.repeats} alternating rounds; GFLOP/s as 2*M*K*N / time")
    print("| M x K x N | MKL fp32 | AMX (6 bf16 products) | AMX / MKL | oneDNN bf16 (1 product) | rel. error MKL | rel. error AMX |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    g = torch.Generator().manual_seed(0)
    for m in (int(r) for r in args.rows.split(",")):
        for shape in args.shapes.split(","):
            k, n = (int(v) for v in shape.split("x"))
            x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) * 0.05
            pieces = amx.pack(w)
            xb, wb = x.bfloat16(), w.bfloat16()
            arms = {"mkl": lambda: F.linear(x, w), "amx": lambda: amx(x, pieces, None), "bf16": lambda: F.linear(xb, wb)}
            times: dict[str, list[float]] = {a: [] for a in arms}
            for _ in range(args.repeats):
                for a, fn in arms.items():
                    times[a].append(timed(fn))
            best = {a: min(t) for a, t in times.items()}
            flop = 2 * m * k * n
            want = x.double() @ w.double().T
            scale = x.double().abs() @ w.double().abs().T
            err = {a: ((arms[a]().double() - want).abs() / scale).max().item() for a in ("mkl", "amx")}
            print(f"| {m} x {k} x {n} | {flop / best['mkl'] / 1e9:.0f} | {flop / best['amx'] / 1e9:.0f} | "
                  f"{best['mkl'] / best['amx']:.2f}x | {flop / best['bf16'] / 1e9:.0f} | {err['mkl']:.1e} | {err['amx']:.1e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
